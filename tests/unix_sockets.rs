//! Unix-domain sockets of every kind and the sandbox's /tmp (`tests/programs/unixsock.c`):
//! snapshot → kill → restore, then the same state byte for byte (names, types, bytes queued,
//! /tmp's files, the counter in a MAP_SHARED mapping of a /tmp file), the queued bytes
//! delivered in order and every pair still connected.

mod common;

use common::programs;
use common::tardi::{Running, Scratch};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const PORT: u16 = 7000;

fn addr(r: &Running) -> SocketAddr {
    SocketAddr::new(r.address.into(), PORT)
}

fn ask(r: &Running, cmd: &str) -> String {
    programs::request(addr(r), cmd, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{cmd} to {}: {e}", r.name))
}

/// A manifest with the host's root read-only and a tmpfs at /tmp.
fn manifest(dir: &Path, name: &str, bin: &Path, user: Option<&str>) -> PathBuf {
    let user = user.map(|u| format!("user = {u:?}\n")).unwrap_or_default();
    let text = format!(
        "libos.entrypoint = {:?}\nloader.argv = [\"unixsock\"]\n\
         fs.mounts = [\n  {{ path = \"/\", uri = \"file:/\" }},\n  {{ type = \"tmpfs\", path = \"/tmp\" }},\n]\n\n\
         [tardi]\nname = {name:?}\n{user}",
        bin.to_str().unwrap()
    );
    let p = dir.join(format!("{name}.manifest"));
    std::fs::write(&p, text).unwrap();
    p
}

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
    let bin = programs::build("unixsock");
    let scratch = Scratch::new("unix");
    let name = format!("ux-{}", std::process::id() % 10000);
    let m = manifest(&scratch.0, &name, &bin, None);
    let cur = Running::run(&m).expect("tardi run");
    programs::wait_ready(addr(&cur), Duration::from_secs(10)).expect("ready");
    ask(&cur, "tick");
    let before = ask(&cur, "state");
    assert!(before.contains("sockfile=sock"), "{before}");
    assert!(before.contains("counter=2"), "{before}");
    let file = scratch.0.join("u.tardi");
    cur.snapshot(&file).expect("snapshot");
    let log = cur.log.clone();
    cur.stop();
    let cur = Running::restore(&file).unwrap_or_else(|e| {
        panic!(
            "restore: {e}\n--- log ---\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let after = ask(&cur, "state");
    assert_eq!(after, before, "state after restore");
    assert_eq!(
        ask(&cur, "tick"),
        "ticked 3",
        "the shared mapping still maps the file"
    );
    let drained = ask(&cur, "drain");
    let want: Vec<&str> = DRAINED.split_whitespace().collect();
    assert_eq!(drained, want.join(" "));
    cur.stop();
}
