//! Process trees, phase 1 (`docs/PROCESS-TREES.md`, `tests/programs/forktree.c`): a service
//! whose main process forked three children (one leading its own process group, one its own
//! session, one in its parent's group, with a second thread and a grandchild that leads its
//! own group).
//! `tardi snapshot`, kill, `tardi restore`: every process comes back with its PID, parent,
//! group and session, and memory that is byte for byte what it held (the same digest, every
//! byte checked against its generation) and threads with their TIDs, and goes on (a later
//! generation gives the same digest as in the original tree; a child forked and reaped after
//! the restore gets a PID no process or thread of the tree had, and its exit status).

mod common;

use common::programs;
use common::tardi::{Running, Scratch};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use tardi_checkpointer::image::Checkpoint;

const PORT: u16 = 7300;
const ROLES: u16 = 5;

fn ask(r: &Running, role: u16, cmd: &str) -> String {
    programs::request(
        SocketAddr::new(r.address.into(), PORT + role),
        cmd,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| {
        panic!(
            "{cmd} to role {role} of {}: {e}\n--- log ---\n{}",
            r.name,
            std::fs::read_to_string(&r.log).unwrap_or_default()
        )
    })
}

fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every process's state line, by role.
fn states(r: &Running) -> Vec<String> {
    (0..ROLES).map(|role| ask(r, role, "state")).collect()
}

fn set_generation(r: &Running, generation: u64) {
    for role in 0..ROLES {
        assert_eq!(
            ask(r, role, &format!("gen {generation}")),
            format!("gen={generation}")
        );
    }
}

/// The tree as forktree.c builds it: parents, groups and sessions relative to the PIDs.
fn check_shape(states: &[String]) {
    let f: Vec<BTreeMap<String, String>> = states.iter().map(|s| fields(s)).collect();
    let pid = |r: usize| f[r]["pid"].clone();
    for (r, s) in f.iter().enumerate() {
        assert_eq!(s["ok"], "1", "role {r}: {}", states[r]);
    }
    assert_eq!(f[0]["sid"], pid(0), "the main process leads its session");
    assert_eq!(f[0]["pgid"], pid(0));
    for (r, s) in f.iter().enumerate().take(4).skip(1) {
        assert_eq!(s["ppid"], pid(0), "role {r}'s parent");
    }
    assert_eq!(f[1]["pgid"], pid(1), "role 1 leads its group");
    assert_eq!(f[1]["sid"], pid(0));
    assert_eq!(f[2]["sid"], pid(2), "role 2 leads its session");
    assert_eq!(f[2]["pgid"], pid(2));
    assert_eq!(f[3]["pgid"], pid(0), "role 3 stays in its parent's group");
    assert_eq!(f[3]["sid"], pid(0));
    assert_eq!(f[4]["ppid"], pid(3), "role 4 is role 3's child");
    assert_eq!(f[4]["pgid"], pid(4), "role 4 leads its group");
    assert_eq!(f[4]["sid"], pid(0));
    assert_eq!(
        f[3]["tids"].split(',').count(),
        2,
        "role 3 has two threads: {}",
        states[3]
    );
}

#[test]
fn a_process_tree_survives_snapshot_and_restore() {
    let bin = programs::build("forktree");
    let scratch = Scratch::new("tree");
    let name = format!("tree-{}", std::process::id() % 10000);
    let m = common::tardi::manifest_for(&scratch.0, &name, &bin, &[]);
    let cur = Running::run(&m).expect("tardi run");
    for role in 0..ROLES {
        programs::wait_ready(
            SocketAddr::new(cur.address.into(), PORT + role),
            Duration::from_secs(10),
        )
        .expect("ready");
    }
    set_generation(&cur, 7);
    let before = states(&cur);
    check_shape(&before);

    let file = scratch.0.join("tree.tardi");
    cur.snapshot(&file).expect("snapshot of a process tree");
    let image = Checkpoint::from_bytes(std::fs::read(&file).unwrap())
        .unwrap()
        .image;
    assert_eq!(image.tree.len(), 4, "four processes besides the main one");

    // What the original tree holds one generation later: the restored one must match it.
    set_generation(&cur, 8);
    let later = states(&cur);
    let log = cur.log.clone();
    cur.stop();

    let restored = Running::restore(&file).unwrap_or_else(|e| {
        panic!(
            "restore: {e}\n--- log ---\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let after = states(&restored);
    assert_eq!(
        after, before,
        "every process's PID, parent, group, session and memory after the restore"
    );
    set_generation(&restored, 8);
    assert_eq!(
        states(&restored),
        later,
        "the restored tree goes on as the original did"
    );
    // A process forked now gets a PID none of the tree's processes and threads had and is
    // reaped by its restored parent with its status.
    let spawned = fields(&ask(&restored, 0, "spawn"));
    assert_eq!(spawned["status"], "5", "{spawned:?}");
    let used: Vec<String> = after
        .iter()
        .flat_map(|s| {
            fields(s)["tids"]
                .split(',')
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        !used.contains(&spawned["spawned"]),
        "spawned {spawned:?}, tree's ids {used:?}"
    );
    restored.stop();
}
