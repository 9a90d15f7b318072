//! A Python `multiprocessing` service (issue 8): Debian's python3 running
//! `tests/programs/mpserver.py` from `gramine-manifests/python-mp.manifest`, a UDP server whose
//! work goes to a `multiprocessing.Pool` of two forked workers. The three processes share the
//! pool's pipes and its locks (POSIX semaphores: files in /dev/shm unlinked at once and mapped
//! shared by every process); the main process runs the pool's three threads; each worker
//! keeps a running total of the numbers it was given.
//!
//! Work is done, `tardi snapshot` taken, more work done (which the restore must forget), the
//! sandbox killed and `tardi restore`d: the same worker PIDs serve the next work, through the
//! same pipes and locks, and the workers' totals go on from what they held at the snapshot
//! (their sum is the sum of every number handed out before the snapshot and after the
//! restore).

mod common;

use common::programs;
use common::tardi::{Running, Scratch, python_manifest};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

const PORT: u16 = 7600;

fn ask(r: &Running, cmd: &str) -> String {
    r.ask_udp(PORT, cmd)
}

/// `work n`: (tasks served in all, each worker's total).
fn work(r: &Running, n: u64) -> (u64, BTreeMap<String, u64>) {
    let reply = ask(r, &format!("work {n}"));
    let mut served = None;
    let mut totals = BTreeMap::new();
    for f in reply.split_whitespace() {
        match f.split_once('=') {
            Some(("served", v)) => served = v.parse().ok(),
            Some(("workers", v)) => {
                for w in v.split(',') {
                    let (p, t) = w.split_once(':').expect("PID:TOTAL");
                    totals.insert(p.to_string(), t.parse().unwrap());
                }
            }
            _ => {}
        }
    }
    (served.unwrap_or_else(|| panic!("work: {reply}")), totals)
}

fn sum_to(n: u64) -> u64 {
    n * (n + 1) / 2
}

#[test]
fn a_multiprocessing_pool_survives_snapshot_and_restore() {
    let scratch = Scratch::new("mp");
    let name = format!("mp-{}", std::process::id() % 10000);
    let m = python_manifest(&scratch.0, "python-mp", "/srv/mp", &name);
    let cur = Running::run(&m).expect("tardi run");
    programs::wait_ready(
        SocketAddr::new(cur.address.into(), PORT),
        Duration::from_secs(30),
    )
    .expect("ready");
    let pids = ask(&cur, "pids");
    let (served, totals) = work(&cur, 20);
    assert_eq!(served, 20);
    assert_eq!(totals.values().sum::<u64>(), sum_to(20), "{totals:?}");

    let file = scratch.0.join("mp.tardi");
    cur.snapshot(&file)
        .expect("snapshot of a multiprocessing pool");
    // Work done after the snapshot: the restore must not have it.
    assert_eq!(work(&cur, 5).0, 25);
    let log = cur.log.clone();
    cur.stop();

    let restored = Running::restore_or_log(&file, &log);
    assert_eq!(ask(&restored, "pids"), pids, "the same workers");
    let (served, after) = work(&restored, 10);
    assert_eq!(
        served, 30,
        "20 tasks before the snapshot, 10 after the restore"
    );
    assert_eq!(
        after.values().sum::<u64>(),
        sum_to(20) + sum_to(10),
        "the workers' totals go on from the snapshot: {totals:?} then {after:?}"
    );
    assert!(
        after.keys().all(|p| pids.contains(p.as_str())),
        "results come from the pool's workers {pids}: {after:?}"
    );
    restored.stop();
}

/// `tardi profile --verify` on the pool while a client hands out work in a loop: the main
/// process and both workers are tracked by the epoch loop, the pool's locks (files in
/// /dev/shm unlinked while mapped shared by the three processes) once, in the main image; at
/// the end the image built from the chain equals the held tree, the locks included, and so does
/// a held restore of it (where each lock shows as shared anonymous memory).
#[test]
fn a_pool_profiled_under_load_verifies() {
    let scratch = Scratch::new("mp-profile");
    let name = format!("mp-prof-{}", std::process::id() % 10000);
    let m = python_manifest(&scratch.0, "python-mp", "/srv/mp", &name);
    let (client, served) = (scratch.0.join("load.py"), scratch.0.join("load.out"));
    std::fs::write(
        &client,
        format!(
            "import socket, sys, time\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.settimeout(0.5)\n\
             while True:\n\
             \x20   s.sendto(b'work 3', (sys.argv[1], {PORT}))\n\
             \x20   try:\n\
             \x20       print(s.recv(4096).decode(), flush=True)\n\
             \x20   except OSError as e:\n\
             \x20       print('error', e, flush=True)\n\
             \x20   time.sleep(0.02)\n"
        ),
    )
    .unwrap();
    let load = format!(
        "python3 {} {{address}} > {} 2>&1",
        client.display(),
        served.display()
    );
    // The load's replies are counted over up to three verified profiles (each 3 s, each
    // verified): a slow start of the pool on a loaded machine once left one run without any
    // (the client's first wait then outlasted the profile).
    let (mut ok, mut text) = (0, String::new());
    for _ in 0..3 {
        common::tardi::profile_verified(&m, &load, 3, &scratch.0);
        text = std::fs::read_to_string(&served).unwrap_or_default();
        ok += text.lines().filter(|l| l.starts_with("served=")).count();
        if ok >= 20 {
            break;
        }
    }
    assert!(
        ok >= 20,
        "the load while profiling: {ok} replies, the last run's:\n{text}"
    );
}
