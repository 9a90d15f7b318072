//! Debian's unmodified `redis-server` under the shipped manifest: load 100,000 keys with
//! `redis-cli --pipe`, `tardi snapshot`, kill the sandbox, `tardi restore`: every key and value is
//! there, a write made after the snapshot is not, and new clients are served on the same
//! address. Then once more from the restored process (a second generation).

mod common;

use common::resp::{Conn, Reply};
use common::tardi::{Running, Scratch};
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const KEYS: usize = 100_000;

fn value(i: usize) -> String {
    format!(
        "value-{i}-{:x}-{}",
        (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        "x".repeat(i % 37)
    )
}

/// The shipped manifest with a unique name and a scratch data directory.
fn manifest(scratch: &Path, name: &str) -> std::path::PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("gramine-manifests/redis.manifest");
    let text = std::fs::read_to_string(shipped).unwrap();
    assert!(
        text.contains("name = \"redis\""),
        "shipped manifest changed shape"
    );
    let data = scratch.join("data");
    let text = text
        .replace("name = \"redis\"", &format!("name = \"{name}\""))
        .replace(
            "file:/var/lib/tardi/redis/data",
            &format!("file:{}", data.display()),
        );
    let p = scratch.join(format!("{name}.manifest"));
    std::fs::write(&p, text).unwrap();
    p
}

fn load(addr: SocketAddr) {
    let mut input = Vec::with_capacity(KEYS * 80);
    for i in 0..KEYS {
        let (k, v) = (format!("key:{i}"), value(i));
        write!(
            input,
            "*3\r\n$3\r\nSET\r\n${}\r\n{k}\r\n${}\r\n{v}\r\n",
            k.len(),
            v.len()
        )
        .unwrap();
    }
    let mut child = Command::new("redis-cli")
        .args([
            "-h",
            &addr.ip().to_string(),
            "-p",
            &addr.port().to_string(),
            "--pipe",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("redis-cli (apt-get install redis-tools)");
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(&format!("replies: {KEYS}")),
        "redis-cli --pipe: {text}"
    );
}

/// Every key holds its value, and nothing else is there.
fn check_all(c: &mut Conn) {
    assert_eq!(c.cmd(&["DBSIZE"]).unwrap(), Reply::Int(KEYS as i64));
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(2000) {
        let cmds: Vec<Vec<String>> = chunk
            .iter()
            .map(|i| vec!["GET".into(), format!("key:{i}")])
            .collect();
        for (i, r) in chunk.iter().zip(c.pipeline(&cmds).unwrap()) {
            assert_eq!(r, Reply::Bulk(Some(value(*i).into_bytes())), "key:{i}");
        }
    }
}

#[test]
fn redis_100k_keys_survive_snapshot_kill_restore() {
    assert!(
        Path::new("/usr/bin/redis-server").exists(),
        "redis-server missing: apt-get install redis-server"
    );
    let scratch = Scratch::new("redis");
    let name = format!("redis-t{}", std::process::id() % 100000);
    let run = Running::run(&manifest(&scratch.0, &name)).expect("tardi run redis");
    let addr = SocketAddr::new(run.address.into(), 6379);
    let mut c = Conn::connect_retry(addr, Duration::from_secs(10));
    load(addr);
    check_all(&mut c);

    let mut cur = run;
    for generation in 1..=2 {
        let file = scratch.0.join(format!("redis-{generation}.tardi"));
        let snap = cur
            .snapshot(&file)
            .unwrap_or_else(|e| panic!("snapshot {generation}: {e}"));
        assert!(
            snap["memory_bytes"].as_u64().unwrap() > 10_000_000,
            "{snap}"
        );
        // Written after the snapshot: must not survive the restore.
        let mut c = Conn::connect(addr, Duration::from_secs(2)).unwrap();
        assert_eq!(
            c.cmd(&["SET", "after-snapshot", "1"]).unwrap(),
            Reply::Status("OK".into())
        );
        drop(c);
        cur.stop();
        cur = Running::restore(&file).unwrap_or_else(|e| panic!("restore {generation}: {e}"));
        assert_eq!(
            SocketAddr::new(cur.address.into(), 6379),
            addr,
            "same address after restore"
        );
        let mut c = Conn::connect_retry(addr, Duration::from_secs(10));
        assert_eq!(
            c.cmd(&["GET", "after-snapshot"]).unwrap(),
            Reply::Bulk(None)
        );
        check_all(&mut c);
        // Still a working server: writes and a fresh client.
        assert_eq!(
            c.cmd(&["SET", &format!("gen{generation}"), "ok"]).unwrap(),
            Reply::Status("OK".into())
        );
        assert_eq!(
            c.cmd(&["DEL", &format!("gen{generation}")]).unwrap(),
            Reply::Int(1)
        );
    }
    let out = cur.stop();
    assert!(out.contains("\"stopped\""), "{out}");
}

/// `tardi snapshot --stop` then `tardi restore`: a client pipelining on one connection keeps it
/// (issue 28). The snapshot carries the connection and ends the service without a word to the
/// client (its socket closed in repair mode, the packets to the sandbox held until it is gone);
/// the restore carries the connection on (the packets held until the socket is back): every
/// write acknowledged before the snapshot is read back on the same connection, and writes go
/// on, with no reconnect.
#[test]
fn a_client_keeps_its_connection_through_snapshot_stop_and_restore() {
    let scratch = Scratch::new("redis-keep");
    let name = format!("redis-keep-{}", std::process::id() % 100000);
    let run = Running::run(&manifest(&scratch.0, &name)).expect("tardi run redis");
    let addr = SocketAddr::new(run.address.into(), 6379);
    let mut c = Conn::connect_retry(addr, Duration::from_secs(10));
    let batch = |from: usize| -> Vec<Vec<String>> {
        (from..from + 10)
            .map(|i| vec!["SET".into(), format!("k:{i}"), value(i)])
            .collect()
    };
    for b in 0..20 {
        let replies = c
            .pipeline(&batch(b * 10))
            .expect("a batch before the snapshot");
        assert!(replies.iter().all(|r| *r == Reply::Status("OK".into())));
    }
    // Refused before anything is paused (no such directory): the service goes on, and the
    // connection with it.
    let bad = run.snapshot_with(Path::new("/no-such-dir/redis.tardi"), &["--stop"]);
    assert!(
        bad.as_ref().is_err_and(|e| e.contains("no-such-dir")),
        "{bad:?}"
    );
    assert_eq!(
        c.cmd(&["SET", "still", "here"]).unwrap(),
        Reply::Status("OK".into())
    );
    let file = scratch.0.join("redis-keep.tardi");
    let snap = run
        .snapshot_with(&file, &["--stop"])
        .unwrap_or_else(|e| panic!("snapshot --stop: {e}"));
    assert!(snap["bytes"].as_u64().unwrap() > 0, "{snap}");
    let out = run.wait_exit(Duration::from_secs(20));
    assert!(
        out.contains("tardi snapshot --stop"),
        "the service ended with the snapshot: {out}"
    );
    let image = tardi_checkpointer::image::Checkpoint::from_bytes(std::fs::read(&file).unwrap())
        .unwrap()
        .image;
    assert_eq!(
        image.tcp.len(),
        1,
        "the checkpoint carries the client's connection"
    );
    let pending = batch(200);
    let restored = Running::restore(&file).unwrap_or_else(|e| panic!("restore: {e}"));
    let replies = c
        .pipeline(&pending)
        .unwrap_or_else(|e| panic!("the connection after the restore: {e}"));
    assert!(
        replies.iter().all(|r| *r == Reply::Status("OK".into())),
        "{replies:?}"
    );
    for i in 0..210 {
        assert_eq!(
            c.cmd(&["GET", &format!("k:{i}")]).unwrap(),
            Reply::Bulk(Some(value(i).into_bytes())),
            "key {i} on the same connection"
        );
    }
    let out = restored.stop();
    assert!(out.contains("\"stopped\""), "{out}");
}
