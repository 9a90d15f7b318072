//! Checkpoint/restore of the multi-threaded state machine (`tests/programs/statemachine.c`) at
//! random moments: each cycle snapshots the running sandbox, kills it, restores the file into a
//! new sandbox and checks that the process continues from where it was with a memory digest
//! exactly equal to the one its step counters predict. Cycles chain: the restored process is the
//! one checkpointed next, so restored processes are shown to checkpoint correctly too.

mod common;

use common::programs::{self, Report};
use common::tardi::{Running, Scratch, manifest_for};
use rand::Rng;
use std::net::SocketAddr;
use std::time::Duration;

const PORT: u16 = 7000;

fn addr(r: &Running) -> SocketAddr {
    SocketAddr::new(r.address.into(), PORT)
}

fn query(r: &Running) -> Report {
    let rep = programs::query(addr(r), Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("state machine in sandbox {} does not answer: {e}", r.name));
    rep.check()
        .unwrap_or_else(|e| panic!("state digest wrong in {}: {e}", r.name));
    let want = programs::expected_digest(&rep.steps, rep.sig);
    assert_eq!(
        rep.digest, want,
        "digest differs from the pure function of the step counts"
    );
    rep
}

/// Runs `cycles` snapshot → kill → restore cycles at random moments.
fn cycles(tag: &str, threads: u32, cycles: usize) {
    let bin = programs::build("statemachine");
    let scratch = Scratch::new(tag);
    let name = format!("sm-{tag}-{}", std::process::id() % 10000);
    let threads_arg = threads.to_string();
    let manifest = manifest_for(&scratch.0, &name, &bin, &["--threads", &threads_arg]);
    let mut rng = rand::rng();
    let mut cur = Running::run(&manifest).expect("tardi run");
    programs::wait_ready(addr(&cur), Duration::from_secs(10)).expect("state machine ready");
    // The started event names the host side of the sandbox's link (where an output gate sits,
    // as `bench/replication.sh floor` puts one): it exists here and carries `host_address`.
    let host_if = cur.started["host_if"]
        .as_str()
        .expect("host_if in the started event");
    let host_address = cur.started["host_address"].as_str().expect("host_address");
    let shown = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", host_if])
        .output()
        .expect("ip addr show");
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains(&format!(" {host_address}/")),
        "{host_if} does not carry {host_address}: {shown:?}"
    );
    let mut last = query(&cur);
    for i in 0..cycles {
        std::thread::sleep(Duration::from_millis(rng.random_range(5..150)));
        let before = query(&cur);
        before.not_before(&last).unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(0..40)));
        let file = scratch.0.join(format!("c{i}.tardi"));
        let snap = cur
            .snapshot(&file)
            .unwrap_or_else(|e| panic!("cycle {i}: snapshot: {e}"));
        assert!(snap["bytes"].as_u64().unwrap() > 0);
        let address = cur.address;
        let log = cur.log.clone();
        cur.stop();
        cur = Running::restore(&file).unwrap_or_else(|e| {
            panic!(
                "cycle {i}: restore: {e}\n--- log ---\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        assert_eq!(
            cur.address, address,
            "the restored sandbox must keep its address"
        );
        let after = query(&cur);
        after
            .not_before(&before)
            .unwrap_or_else(|e| panic!("cycle {i}: went back in time: {e}"));
        std::thread::sleep(Duration::from_millis(30));
        last = query(&cur);
        assert!(
            last.total_steps() > after.total_steps(),
            "cycle {i}: restored process makes no progress"
        );
        std::fs::remove_file(&file).unwrap();
    }
    // The process still exits cleanly: its main thread joins the network thread, which needs
    // the restored clear_child_tid futex wake.
    let _ = programs::request(addr(&cur), "exit", Duration::from_millis(300));
    let out = cur.wait_exit(Duration::from_secs(10));
    assert!(
        out.contains("service exited with code 0"),
        "unclean exit: {out}"
    );
}

#[test]
fn statemachine_4_threads_30_random_cycles() {
    cycles("t4", 4, 30);
}

#[test]
fn statemachine_8_threads_20_random_cycles() {
    cycles("t8", 8, 20);
}
