//! A second real program of a different kind: Debian's CPython running `tests/programs/kvserver.py`
//! (a multi-threaded TCP key-value server with a background thread that ticks every 10 ms) from
//! `gramine-manifests/python-kv.manifest`.
//!
//! The test loads 20,000 keys over TCP, snapshots, changes things after the snapshot, stops the
//! sandbox and restores it: every key and value must be back, the post-snapshot changes gone
//! (the server's request counter says exactly how many requests it had seen), the ticker thread
//! alive, and new connections served — by several threads at once — on the same address. Then
//! the restored service is snapshotted and restored again (a second generation) and checked the
//! same way. Snapshots are taken with no connection open (see
//! `thread_exiting_while_restore_finishes`, for connections open at snapshot time).
//!
//! Every wait is bounded: a hang becomes a failure naming what it waited for.

mod common;

use common::tardi::{Running, Scratch, kv_manifest, tardi};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PORT: u16 = 8100;
/// Keys loaded before the first snapshot.
const KEYS: usize = 20_000;
/// `INCR counter` requests before the first snapshot.
const INCRS: u64 = 1_000;
/// Lines per pipelined batch.
const BATCH: usize = 2_000;
/// Bound for one request/reply or one connection attempt.
const IO_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound for `tardi run`/`restore` to print its first line, and for `tardi snapshot`.
const TARDI_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Bounded waits for the tardi helpers (which block without a timeout).

/// Runs `f` on a helper thread and waits at most `timeout` for it. On timeout, the `tardi`
/// processes this test started whose command line mentions `marker` are killed (that unblocks
/// the helper) and the test fails naming `what`.
fn bounded<T: Send + 'static>(
    what: &str,
    marker: &Path,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(timeout) {
        Ok(v) => v,
        Err(_) => {
            let killed = kill_our_tardis(marker);
            panic!("{what}: no result after {timeout:?} (killed tardi processes {killed:?})");
        }
    }
}

/// SIGKILLs the children of this process whose command line contains `marker`; returns their pids.
fn kill_our_tardis(marker: &Path) -> Vec<i32> {
    let me = std::process::id().to_string();
    let marker = marker.to_string_lossy().into_owned();
    let mut killed = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ppid ...
        let ppid = stat
            .rsplit_once(") ")
            .map(|(_, r)| r.split(' ').nth(1).unwrap_or(""));
        if ppid != Some(me.as_str()) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&marker) {
            // SAFETY: plain kill of a child process of ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed.push(pid);
        }
    }
    killed
}

fn run(manifest: &Path) -> Running {
    let m = manifest.to_path_buf();
    bounded("tardi run", manifest, TARDI_TIMEOUT, move || {
        Running::run(&m)
    })
    .unwrap_or_else(|e| panic!("tardi run {}: {e}", manifest.display()))
}

/// `tardi restore FILE`. The restored sandbox takes its old link (address) again; a sandbox
/// started by someone else between our stop and this restore may hold it meanwhile (every new
/// `tardi` process hands link indices out lowest-free-first): wait a bounded while for it to go
/// away rather than fail on another test's behalf.
fn restore(file: &Path) -> Running {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let f = file.to_path_buf();
        match bounded("tardi restore", file, TARDI_TIMEOUT, move || {
            Running::restore(&f)
        }) {
            Ok(r) => return r,
            Err(e) if e.contains("is in use (link") && Instant::now() < deadline => {
                eprintln!("note: the restored sandbox's address is taken, retrying: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("tardi restore {}: {e}", file.display()),
        }
    }
}

fn snapshot(r: &Running, file: &Path) -> serde_json::Value {
    let (name, f) = (r.name.clone(), file.to_path_buf());
    let out = bounded("tardi snapshot", file, TARDI_TIMEOUT, move || {
        Command::new(tardi())
            .args(["snapshot", &name, "-o", f.to_str().unwrap(), "--json"])
            .output()
            .expect("spawn tardi snapshot")
    });
    assert!(
        out.status.success(),
        "tardi snapshot {} failed: {}",
        r.name,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("snapshot --json output")
}

fn log_of(r: &Running) -> String {
    std::fs::read_to_string(&r.log)
        .unwrap_or_else(|e| format!("(cannot read {}: {e})", r.log.display()))
}

/// Waits (bounded) until the service process has exactly `n` threads (host view). Used before a
/// snapshot so that no connection-handler thread is exiting around the snapshot or the restore
/// (see `thread_exiting_while_restore_finishes`).
fn wait_threads(r: &Running, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = std::fs::read_dir(format!("/proc/{}/task", r.pid))
            .map(|d| d.count())
            .unwrap_or(0);
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: service {} has {now} threads, expected {n}",
            r.pid
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Removes what a passing test's sandbox legitimately kept: its service log and run directory.
fn forget(name: &str) {
    let dir = Path::new("/run/tardi").join(name);
    // The log, and the link index the name keeps (sandbox/src/net.rs) — our names are unique
    // per test run, so keeping it would only hold an address forever.
    for f in ["service.log", "link-index"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let _ = std::fs::remove_dir(dir);
}

/// Main thread + ticker thread: no connection open.
const IDLE_THREADS: usize = 2;

// ---------------------------------------------------------------------------------------------
// The shipped manifest, pointed at this checkout.

// ---------------------------------------------------------------------------------------------
// A line-protocol client.

struct Kv {
    r: BufReader<TcpStream>,
    w: TcpStream,
    addr: SocketAddr,
}

impl Kv {
    /// Connects, retrying while nothing listens yet (the interpreter is still starting).
    fn connect(addr: SocketAddr, timeout: Duration) -> Kv {
        let deadline = Instant::now() + timeout;
        loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                Ok(s) => {
                    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
                    s.set_nodelay(true).unwrap();
                    return Kv {
                        r: BufReader::new(s.try_clone().unwrap()),
                        w: s,
                        addr,
                    };
                }
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    panic!("connecting to the key-value server at {addr}: {e} (for {timeout:?})")
                }
            }
        }
    }

    fn read_reply(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        Ok(line.trim_end_matches('\n').to_string())
    }

    /// Sends every request without waiting (in batches), then reads the replies in order.
    fn pipeline(&mut self, reqs: &[String]) -> Vec<String> {
        let mut out = Vec::with_capacity(reqs.len());
        for chunk in reqs.chunks(BATCH) {
            let mut buf = String::new();
            for r in chunk {
                buf.push_str(r);
                buf.push('\n');
            }
            self.w.write_all(buf.as_bytes()).unwrap_or_else(|e| {
                panic!("sending {} requests to {}: {e}", chunk.len(), self.addr)
            });
            for r in chunk {
                let reply = self
                    .read_reply()
                    .unwrap_or_else(|e| panic!("reply to {r:?} from {}: {e}", self.addr));
                out.push(reply);
            }
        }
        out
    }

    fn req(&mut self, r: &str) -> String {
        self.pipeline(&[r.to_string()]).pop().unwrap()
    }

    fn stats(&mut self) -> HashMap<String, u64> {
        let line = self.req("STATS");
        line.split_whitespace()
            .filter_map(|f| f.split_once('='))
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.parse().unwrap_or_else(|_| panic!("bad STATS {line:?}")),
                )
            })
            .collect()
    }
}

fn key(i: usize) -> String {
    format!("key:{i:05}")
}

/// A value with spaces in it (the protocol takes the rest of the line).
fn value(i: usize) -> String {
    let mut x = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    format!("value {i} {:016x}", x ^ (x >> 31))
}

/// What the service must hold (besides the loaded keys) at a given point.
struct Expect {
    counter: u64,
    /// (key, Some(value) or None = absent)
    extra: Vec<(&'static str, Option<&'static str>)>,
    /// Number of keys.
    count: usize,
}

/// Every loaded key and value, the counter, the extra keys and the key count.
fn check_data(kv: &mut Kv, e: &Expect, when: &str) {
    let reqs: Vec<String> = (0..KEYS).map(|i| format!("GET {}", key(i))).collect();
    let replies = kv.pipeline(&reqs);
    let bad: Vec<String> = replies
        .iter()
        .enumerate()
        .filter(|(i, r)| **r != format!("VAL {}", value(*i)))
        .take(5)
        .map(|(i, r)| format!("{}: {r:?}", key(i)))
        .collect();
    let nbad = replies
        .iter()
        .enumerate()
        .filter(|(i, r)| **r != format!("VAL {}", value(*i)))
        .count();
    assert!(
        nbad == 0,
        "{when}: {nbad} of {KEYS} keys wrong, e.g. {bad:?}"
    );
    assert_eq!(
        kv.req("GET counter"),
        format!("VAL {}", e.counter),
        "{when}: counter"
    );
    for (k, v) in &e.extra {
        let want = v.map_or("NIL".to_string(), |v| format!("VAL {v}"));
        assert_eq!(kv.req(&format!("GET {k}")), want, "{when}: key {k}");
    }
    assert_eq!(kv.req("COUNT"), e.count.to_string(), "{when}: COUNT");
}

/// Waits (bounded) until `STATS` satisfies `ok`; returns the last stats.
fn wait_stats(
    kv: &mut Kv,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&HashMap<String, u64>) -> bool,
) -> HashMap<String, u64> {
    let deadline = Instant::now() + timeout;
    loop {
        let s = kv.stats();
        if ok(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {timeout:?}; last STATS {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `STATS` as the last request before a snapshot, on a connection that is then closed; waits
/// until its handler thread is gone. The returned `requests` counts that QUIT too.
fn stats_then_idle(r: &Running, addr: SocketAddr) -> HashMap<String, u64> {
    let mut kv = Kv::connect(addr, IO_TIMEOUT);
    let mut s = kv.stats();
    assert_eq!(kv.req("QUIT"), "BYE");
    *s.get_mut("requests").unwrap() += 1; // the QUIT
    wait_threads(r, IDLE_THREADS, "before a snapshot");
    s
}

/// The checks every restored generation must pass. `before` is the `STATS` taken right before
/// the snapshot (the last request before it).
fn check_restored(
    r: &Running,
    addr: SocketAddr,
    before: &HashMap<String, u64>,
    e: &Expect,
    when: &str,
) {
    assert_eq!(
        SocketAddr::new(r.address.into(), PORT),
        addr,
        "{when}: the address changed"
    );
    let mut kv = Kv::connect(addr, IO_TIMEOUT);
    // Exactly one request more than at the snapshot: every post-snapshot request is gone.
    let s = kv.stats();
    assert_eq!(
        s["requests"],
        before["requests"] + 1,
        "{when}: request counter: the restored process must continue from the snapshot \
         (before: {before:?}, now: {s:?})"
    );
    assert!(
        s["ticks"] >= before["ticks"],
        "{when}: ticks went back: {before:?} -> {s:?}"
    );
    assert_eq!(
        s["pid"], before["pid"],
        "{when}: the pid inside the sandbox changed"
    );
    assert_eq!(s["conns"], 1, "{when}: {s:?}");
    // The ticker thread runs: its counter grows.
    let t0 = s["ticks"];
    wait_stats(
        &mut kv,
        &format!("{when}: ticker thread advancing"),
        Duration::from_secs(5),
        |s| s["ticks"] >= t0 + 10,
    );
    check_data(&mut kv, e, when);
    // New connections, served concurrently by several handler threads.
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Kv::connect(addr, IO_TIMEOUT);
                let reqs: Vec<String> = (0..250).map(|_| "INCR parallel".to_string()).collect();
                let replies = c.pipeline(&reqs);
                assert!(
                    replies.iter().all(|r| r.parse::<u64>().is_ok()),
                    "INCR replies {replies:?}"
                );
                assert_eq!(c.req("QUIT"), "BYE");
            })
        })
        .collect();
    for h in handles {
        h.join()
            .unwrap_or_else(|_| panic!("{when}: a parallel client failed"));
    }
    assert_eq!(
        kv.req("GET parallel"),
        "VAL 1000",
        "{when}: 4 parallel clients x 250 INCR"
    );
    assert_eq!(kv.req("DEL parallel"), "1");
    assert_eq!(kv.req("QUIT"), "BYE");
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn python_kv_server_survives_two_generations_of_snapshot_and_restore() {
    let t0 = Instant::now();
    let scratch = Scratch::new("python-kv");
    let name = format!("pykv-{}", std::process::id());
    let manifest = kv_manifest(&scratch.0, &name);

    let cur = run(&manifest);
    let addr = SocketAddr::new(cur.address.into(), PORT);
    let mut kv = Kv::connect(addr, Duration::from_secs(20));
    assert_eq!(kv.req("PING"), "PONG", "log:\n{}", log_of(&cur));

    // Load: 20,000 keys and 1,000 INCRs, pipelined.
    let sets: Vec<String> = (0..KEYS)
        .map(|i| format!("SET {} {}", key(i), value(i)))
        .collect();
    let replies = kv.pipeline(&sets);
    assert!(
        replies.iter().all(|r| r == "OK"),
        "SET replies: {:?}",
        replies.iter().find(|r| *r != "OK")
    );
    let incrs: Vec<String> = (0..INCRS).map(|_| "INCR counter".to_string()).collect();
    let replies = kv.pipeline(&incrs);
    assert_eq!(replies.last().map(String::as_str), Some("1000"));
    assert_eq!(
        kv.req("SET doomed this key is deleted after the snapshot"),
        "OK"
    );
    let gen0 = Expect {
        counter: INCRS,
        extra: vec![
            ("doomed", Some("this key is deleted after the snapshot")),
            ("post1", None),
        ],
        count: KEYS + 2,
    };
    check_data(&mut kv, &gen0, "before the first snapshot");
    assert_eq!(kv.req("QUIT"), "BYE");

    // Snapshot 1. STATS is the last request before it.
    let before1 = stats_then_idle(&cur, addr);
    let file1 = scratch.0.join("gen1.tardi");
    let snap = snapshot(&cur, &file1);
    assert!(
        snap["bytes"].as_u64().unwrap() > 1_000_000,
        "suspiciously small checkpoint: {snap}"
    );
    assert_eq!(
        snap["threads"].as_u64(),
        Some(IDLE_THREADS as u64),
        "main and ticker thread: {snap}"
    );

    // Changes after the snapshot: none may survive the restore.
    let mut kv = Kv::connect(addr, IO_TIMEOUT);
    let post = strings(&[
        "SET post1 after snapshot 1",
        "SET key:00000 overwritten",
        "DEL doomed",
        "INCR counter",
    ]);
    assert_eq!(kv.pipeline(&post), ["OK", "OK", "1", "1001"]);
    drop(kv);
    let address = cur.address;
    let out = cur.stop();
    assert!(
        out.contains("\"stopped\""),
        "tardi run did not report stopping: {out}"
    );

    // Generation 1.
    let cur = restore(&file1);
    assert_eq!(cur.address, address);
    check_restored(&cur, addr, &before1, &gen0, "after restore 1");
    let status = Command::new(tardi())
        .args(["status", "--json"])
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    let ours = status
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["name"] == name.as_str())
        .unwrap_or_else(|| panic!("tardi status does not list {name}: {status}"));
    assert_eq!(
        ours["restored_from"].as_str().map(PathBuf::from),
        Some(std::path::absolute(&file1).unwrap())
    );

    // Changes that must survive generation 2, then snapshot 2 (of the restored process).
    let mut kv = Kv::connect(addr, IO_TIMEOUT);
    assert_eq!(
        kv.pipeline(&strings(&["SET gen2 kept", "INCR counter", "QUIT"])),
        ["OK", "1001", "BYE"]
    );
    let gen1 = Expect {
        counter: INCRS + 1,
        extra: vec![
            ("doomed", Some("this key is deleted after the snapshot")),
            ("gen2", Some("kept")),
            ("post2", None),
        ],
        count: KEYS + 3,
    };
    let before2 = stats_then_idle(&cur, addr);
    let file2 = scratch.0.join("gen2.tardi");
    snapshot(&cur, &file2);
    let mut kv = Kv::connect(addr, IO_TIMEOUT);
    let post = strings(&[
        "SET post2 after snapshot 2",
        "DEL gen2",
        "DEL key:19999",
        "INCR counter",
    ]);
    assert_eq!(kv.pipeline(&post), ["OK", "1", "1", "1002"]);
    drop(kv);
    cur.stop();

    // Generation 2.
    let cur = restore(&file2);
    check_restored(&cur, addr, &before2, &gen1, "after restore 2");
    let log = log_of(&cur);
    cur.stop();
    assert!(
        log.contains("kvserver: listening on port 8100"),
        "service log: {log}"
    );
    assert!(
        !log.contains("Traceback"),
        "the service logged an exception:\n{log}"
    );
    forget(&name);
    eprintln!("python_service: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Connections open at snapshot time come back reset: their handler threads see the reset and
/// exit right after the restore. `tardi restore` must not fail because a thread exits while it
/// removes its restorer from the process.
///
/// A regression test: a thread that exited between `PTRACE_SEIZE` and its interrupt stop once
/// made the whole restore fail (`Stopped::stop`, used by `restore::finish` → `unmap_blob`:
/// "removing the restorer from the restored process: thread N exited while it was being
/// stopped", and a snapshot likewise), within a few cycles. `Stopped::stop` now drops a
/// thread that exits while the others are stopped.
#[test]
fn thread_exiting_while_restore_finishes() {
    const CYCLES: usize = 15;
    const OPEN: usize = 8;
    let scratch = Scratch::new("python-kv-reset");
    let name = format!("pykvr-{}", std::process::id());
    let manifest = kv_manifest(&scratch.0, &name);
    let mut cur = run(&manifest);
    let addr = SocketAddr::new(cur.address.into(), PORT);
    let mut kv = Kv::connect(addr, Duration::from_secs(20));
    assert_eq!(kv.req("SET k 0"), "OK");
    drop(kv);
    for i in 0..CYCLES {
        // OPEN idle connections, each with a handler thread blocked in recv().
        let mut open: Vec<Kv> = (0..OPEN).map(|_| Kv::connect(addr, IO_TIMEOUT)).collect();
        for c in &mut open {
            assert!(c.req("INCR k").parse::<usize>().is_ok());
        }
        let file = scratch.0.join(format!("c{i}.tardi"));
        snapshot(&cur, &file);
        cur.stop();
        drop(open);
        cur = restore(&file);
        let mut kv = Kv::connect(addr, IO_TIMEOUT);
        assert_eq!(
            kv.req("GET k"),
            format!("VAL {}", (i + 1) * OPEN),
            "cycle {i}"
        );
        // Every reset connection's handler ends; only this one is left.
        wait_stats(
            &mut kv,
            &format!("cycle {i}: handlers of reset connections ending"),
            Duration::from_secs(5),
            |s| s["conns"] == 1,
        );
        assert_eq!(kv.req("QUIT"), "BYE");
        wait_threads(&cur, IDLE_THREADS, &format!("cycle {i}"));
        std::fs::remove_file(&file).unwrap();
    }
    cur.stop();
    forget(&name);
}
