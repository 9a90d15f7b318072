//! Unix-domain sockets of every kind and the sandbox's /tmp (`tests/programs/unixsock.c`):
//! snapshot → kill → restore, then the same state byte for byte (names, types, bytes queued,
//! /tmp's files, the counter in a MAP_SHARED mapping of a /tmp file), the queued bytes
//! delivered in order and every pair still connected.

mod common;

use common::tardi::run_with_tmp;

const PORT: u16 = 7000;

/// What `drain` must read: the queues in order, then every pair talking.
const DRAINED: &str = "stream_a[S-b2a-1|] stream_b[S-a2b-1S-a2b-2S-a2b-3|] \
    dgram_a[D-b2a-1|] dgram_b[D-a2b-1|D-a2b-2|D-a2b-3|] \
    seq_a[Q-b2a-1|] seq_b[Q-a2b-1|Q-a2b-2|Q-a2b-3|] \
    client[hello-from-server+more|] accepted[hello-from-client|] pending[] \
    abstract[a1|a2-longer|] unbound[] \
    stream_a->stream_b:s1 stream_b->stream_a:s2 dgram_a->dgram_b:d1 dgram_b->dgram_a:d2 \
    seq_a->seq_b:q1 seq_b->seq_a:q2 client->accepted:c1 accepted->client:c2 \
    pending_accepted=1 pending->accepted:p1 abstract_again:a3";

#[test]
fn unix_sockets_and_tmp_survive_a_restore() {
    let (scratch, cur) = run_with_tmp("unixsock", "ux", "unix", PORT);
    cur.ask(PORT, "tick");
    let before = cur.ask(PORT, "state");
    assert!(before.contains("sockfile=sock"), "{before}");
    assert!(before.contains("counter=2"), "{before}");
    let file = scratch.0.join("u.tardi");
    cur.snapshot(&file).expect("snapshot");
    let cur = cur.restore_in_place(&file);
    let after = cur.ask(PORT, "state");
    assert_eq!(after, before, "state after restore");
    assert_eq!(
        cur.ask(PORT, "tick"),
        "ticked 3",
        "the shared mapping still maps the file"
    );
    let drained = cur.ask(PORT, "drain");
    let want: Vec<&str> = DRAINED.split_whitespace().collect();
    assert_eq!(drained, want.join(" "));
    cur.stop();
}
