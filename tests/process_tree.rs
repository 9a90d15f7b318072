//! Process trees, phase 1 (`docs/PROCESS-TREES.md`, `tests/programs/forktree.c`): a service
//! whose main process forked three children (one leading its own process group, one its own
//! session, one in its parent's group, with a second thread and a grandchild that leads its
//! own group).
//! `tardi snapshot`, kill, `tardi restore`: every process comes back with its PID, parent,
//! group and session, and memory that is byte for byte what it held (the same digest, every
//! byte checked against its generation) and threads with their TIDs, and goes on (a later
//! generation gives the same digest as in the original tree; a child forked and reaped after
//! the restore gets a PID no process or thread of the tree had, and its exit status).
//!
//! Phase 2a (`tests/programs/sharedfds.c`): a parent and two children sharing a listening TCP
//! socket, a pipe with bytes in it, a file, a unix socket pair with bytes queued and a unix
//! listener, and the two children the two ends of a second pipe. After the restore each is
//! one open file description again (`kcmp`), the listener is served by both children, the
//! pipe's and the pair's bytes are read once in all, a write by one process moves the file
//! offset the others see, and the second pipe still joins the children.
//!
//! Shared memory (`tests/programs/treeshm.c`): a parent and two children sharing an anonymous
//! shared region, two System V segments (one attached and marked for removal before the fork,
//! one attached by each child) and a `/dev/shm` object, each child also mapping a region of its own. After the
//! restore every object holds what it held, byte for byte, and is one object again: what one
//! process writes into it the others read.
//!
//! Phase 3 (`tests/programs/zombies.c`): children that exited and were not reaped come back as
//! zombies with their PIDs, groups, sessions, users and statuses, to be reaped.

mod common;

use common::programs;
use common::tardi::{Running, Scratch};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use tardi_checkpointer::sys::same_description;

const PORT: u16 = 7300;
const ROLES: u16 = 5;

fn ask(r: &Running, role: u16, cmd: &str) -> String {
    r.ask_udp(PORT + role, cmd)
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
    let image = cur.snapshot_image(&file, "snapshot of a process tree");
    assert_eq!(image.tree.len(), 4, "four processes besides the main one");

    // What the original tree holds one generation later: the restored one must match it.
    set_generation(&cur, 8);
    let later = states(&cur);
    let log = cur.log.clone();
    cur.stop();

    let restored = Running::restore_or_log(&file, &log);
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

// ---------------------------------------------------------------------------------------------
// Phase 2a: descriptors shared between processes (`tests/programs/sharedfds.c`).

const SHARED_PORT: u16 = 7400;
/// What sharedfds.c leaves in its pipe.
const PIPE_DATA: &str = "0123456789abcdefghij";

/// A command to role `role` of sharedfds.
fn ctl(r: &Running, role: u16, cmd: &str) -> String {
    r.ask_udp(SHARED_PORT + 1 + role, cmd)
}

/// The host PID of every role (0, 1, 2), found among the main process's descendants by the
/// PID each reports (the last `NSpid`).
fn host_pids(r: &Running) -> Vec<i32> {
    let mut by_ns = BTreeMap::new();
    let mut todo = vec![r.pid];
    while let Some(p) = todo.pop() {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        let ns = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_whitespace().last())
            .unwrap_or("0")
            .to_string();
        by_ns.insert(ns, p);
        let kids =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        todo.extend(
            kids.split_whitespace()
                .filter_map(|k| k.parse::<i32>().ok()),
        );
    }
    (0..3)
        .map(|role| {
            let f = fields(&ctl(r, role, "fds"));
            *by_ns
                .get(&f["pid"])
                .unwrap_or_else(|| panic!("role {role} ({f:?}) among {by_ns:?}"))
        })
        .collect()
}

/// Every process holds the listening socket, both pipe ends, the file, both ends of the unix
/// socket pair and the unix listener, and each is one open file description in all three
/// (`kcmp`), not copies; roles 1 and 2 hold the two ends of one second pipe.
fn check_one_description(r: &Running, when: &str) {
    let pids = host_pids(r);
    let f: Vec<BTreeMap<String, String>> =
        (0..3).map(|role| fields(&ctl(r, role, "fds"))).collect();
    let fd = |role: usize, key: &str, k: usize| -> i32 {
        f[role][key].split(',').nth(k).unwrap().parse().unwrap()
    };
    let shared = [
        ("listen", 0),
        ("pipe", 0),
        ("pipe", 1),
        ("file", 0),
        ("pair", 0),
        ("pair", 1),
        ("ulisten", 0),
    ];
    for (key, k) in shared {
        for role in 1..3 {
            assert!(
                same_description(pids[0], fd(0, key, k), pids[role], fd(role, key, k)),
                "{when}: {key}[{k}] of role 0 (host PID {}) and of role {role} (host PID {}) \
                 are different open file descriptions",
                pids[0],
                pids[role]
            );
        }
    }
    // The check tells descriptions apart: the pipe's two ends are two.
    assert!(!same_description(
        pids[0],
        fd(0, "pipe", 0),
        pids[1],
        fd(1, "pipe", 1)
    ));
    // The second pipe: role 1 its read end only, role 2 its write end only, the parent none;
    // one pipe (one inode).
    assert_eq!(
        (fd(0, "q", 0), fd(0, "q", 1)),
        (-1, -1),
        "{when}: {:?}",
        f[0]
    );
    assert_eq!(fd(1, "q", 1), -1, "{when}: {:?}", f[1]);
    assert_eq!(fd(2, "q", 0), -1, "{when}: {:?}", f[2]);
    use std::os::unix::fs::MetadataExt;
    let ino = |role: usize, k: usize| {
        std::fs::metadata(format!("/proc/{}/fd/{}", pids[role], fd(role, "q", k)))
            .unwrap()
            .ino()
    };
    assert_eq!(
        ino(1, 0),
        ino(2, 1),
        "{when}: the second pipe's ends are one pipe"
    );
}

/// Connects to the shared listening socket until both children have served (at most 40
/// times): the roles that answered, each with its PID.
fn served(r: &Running) -> BTreeMap<String, String> {
    use std::io::Read;
    let mut seen = BTreeMap::new();
    for i in 0..40 {
        let mut c = std::net::TcpStream::connect_timeout(
            &SocketAddr::new(r.address.into(), SHARED_PORT),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("connect {i} to {}: {e}", r.name));
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut line = String::new();
        c.read_to_string(&mut line)
            .unwrap_or_else(|e| panic!("reading connection {i}: {e}"));
        let f = fields(&line);
        seen.insert(f["role"].clone(), f["pid"].clone());
        if seen.len() == 2 && i >= 5 {
            break;
        }
    }
    seen
}

#[test]
fn descriptors_shared_by_a_tree_come_back_shared() {
    let bin = programs::build("sharedfds");
    let scratch = Scratch::new("sharedfds");
    let name = format!("shfd-{}", std::process::id() % 10000);
    let m = common::tardi::manifest_with_tmp(&scratch.0, &name, &bin);
    let cur = Running::run(&m).expect("tardi run");
    for role in 0..3 {
        programs::wait_ready(
            SocketAddr::new(cur.address.into(), SHARED_PORT + 1 + role),
            Duration::from_secs(10),
        )
        .expect("ready");
    }
    check_one_description(&cur, "before the snapshot");
    let before = served(&cur);
    assert_eq!(before.len(), 2, "both children accept: {before:?}");
    assert_eq!(ctl(&cur, 1, "write 1 abc"), "off=8");
    assert_eq!(ctl(&cur, 2, "off"), "off=8");
    assert_eq!(ctl(&cur, 2, "qwrite 1 pre"), "sent=3");

    let file = scratch.0.join("shared.tardi");
    let image = cur.snapshot_image(&file, "snapshot of a tree sharing descriptors");
    use tardi_checkpointer::image::FdKind;
    let listener = common::tardi::shared_listener(&image);
    assert_eq!(listener.holders.len(), 3, "{:?}", listener.holders);
    let buffered: Vec<u8> = image
        .shared_files
        .iter()
        .filter_map(|s| match &s.file.kind {
            FdKind::Pipe { buffered, .. } => Some(buffered.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let mut buffered = String::from_utf8_lossy(&buffered).into_owned();
    // (Two pipes: the first's bytes and the second's, in either order.)
    buffered = buffered.replacen("pre", "", 1);
    assert_eq!(buffered, PIPE_DATA, "the pipes' bytes, once each");
    let log = cur.log.clone();
    cur.stop();

    let restored = Running::restore_or_log(&file, &log);
    check_one_description(&restored, "after the restore");
    // The file's offset is the description's: what one process writes moves it for all.
    assert_eq!(ctl(&restored, 0, "off"), "off=8");
    assert_eq!(ctl(&restored, 2, "write 2 xyz"), "off=11");
    assert_eq!(ctl(&restored, 1, "off"), "off=11");
    assert_eq!(ctl(&restored, 0, "off"), "off=11");
    // The pipe's bytes are read once in all, whoever reads them.
    let mut got = String::new();
    let mut empty = 0;
    for i in 0..30u16 {
        let role = i % 3;
        let r = ctl(&restored, role, &format!("readpipe {i}"));
        let bytes = r.strip_prefix("pipe=").unwrap_or_else(|| panic!("{r}"));
        if bytes.is_empty() {
            empty += 1;
            if empty == 3 {
                break;
            }
        } else {
            empty = 0;
            got.push_str(bytes);
        }
    }
    assert_eq!(
        got, PIPE_DATA,
        "the pipe's bytes, read once in all by the three processes"
    );
    // The unix pair's queued bytes, once, and then what one process sends another receives.
    assert_eq!(ctl(&restored, 2, "urecv 1"), "unix=UNIXQ");
    assert_eq!(ctl(&restored, 0, "urecv 2"), "unix=");
    assert_eq!(ctl(&restored, 1, "usend 1 hello"), "sent=5");
    assert_eq!(ctl(&restored, 0, "urecv 3"), "unix=hello");
    // The second pipe still joins role 2 (writer) to role 1 (reader), its bytes kept.
    assert_eq!(ctl(&restored, 1, "qread 1"), "q=pre");
    assert_eq!(ctl(&restored, 2, "qwrite 2 post"), "sent=4");
    assert_eq!(ctl(&restored, 1, "qread 2"), "q=post");
    // Connections are accepted by both restored children, the same processes as before.
    let after = served(&restored);
    assert_eq!(after, before, "both restored children serve connections");
    restored.stop();
}

// ---------------------------------------------------------------------------------------------
// Shared memory in a tree (`tests/programs/treeshm.c`).

const SHM_PORT: u16 = 7500;
/// The shared objects and the roles that map each.
const SHM_OBJECTS: [(&str, &[u16]); 4] = [
    ("anon", &[0, 1, 2]),
    ("sv1", &[0, 1, 2]),
    ("sv2", &[1, 2]),
    ("posix", &[0, 1, 2]),
];

fn shm_ask(r: &Running, role: u16, cmd: &str) -> String {
    r.ask_udp(SHM_PORT + role, cmd)
}

/// Every process's state line with generation `generation` written by all.
fn shm_states(r: &Running, generation: u64) -> Vec<String> {
    for role in 0..3 {
        assert_eq!(
            shm_ask(r, role, &format!("gen {generation}")),
            format!("gen={generation}")
        );
    }
    (0..3).map(|role| shm_ask(r, role, "state")).collect()
}

/// Every process sees every page every process wrote, one object each whoever maps it (the
/// same contents), the segments attached as many times as treeshm.c attached them, the first
/// still marked for removal.
fn check_shm_states(states: &[String], when: &str) {
    let f: Vec<BTreeMap<String, String>> = states.iter().map(|s| fields(s)).collect();
    for (role, s) in f.iter().enumerate() {
        assert_eq!(s["ok"], "1", "{when}: role {role}: {}", states[role]);
        assert_eq!(s["nattch1"], "3", "{when}: role {role}: {}", states[role]);
        assert_eq!(s["nattch2"], "2", "{when}: role {role}: {}", states[role]);
        assert_eq!(
            (s["dest1"].as_str(), s["dest2"].as_str()),
            ("1", "0"),
            "{when}: sv1 is marked for removal, sv2 is not: {}",
            states[role]
        );
    }
    for (obj, roles) in SHM_OBJECTS {
        let first = &f[roles[0] as usize][obj];
        for &role in roles {
            assert_eq!(
                &f[role as usize][obj], first,
                "{when}: {obj} of role {role}"
            );
        }
    }
    assert_eq!(
        f[0]["sv2"], "0000000000000000",
        "{when}: role 0 maps no sv2"
    );
}

/// A marker written through one process's mapping is read through every other's.
fn check_one_object(r: &Running) {
    for (obj, roles) in SHM_OBJECTS {
        for &writer in roles {
            let text = format!("{obj}-by-{writer}");
            assert_eq!(shm_ask(r, writer, &format!("poke {obj} {text}")), "poked");
            for &reader in roles {
                assert_eq!(
                    shm_ask(r, reader, &format!("peek {obj}")),
                    format!("{obj}={text}"),
                    "role {reader} sees what role {writer} wrote into {obj}: one object"
                );
            }
        }
    }
}

#[test]
fn shared_memory_of_a_tree_comes_back_shared() {
    let bin = programs::build("treeshm");
    let scratch = Scratch::new("treeshm");
    let name = format!("trshm-{}", std::process::id() % 10000);
    let m = common::tardi::manifest_with_tmp(&scratch.0, &name, &bin);
    let cur = Running::run(&m).expect("tardi run");
    for role in 0..3 {
        programs::wait_ready(
            SocketAddr::new(cur.address.into(), SHM_PORT + role),
            Duration::from_secs(10),
        )
        .expect("ready");
    }
    let before = shm_states(&cur, 3);
    check_shm_states(&before, "before the snapshot");

    let file = scratch.0.join("treeshm.tardi");
    let image = cur.snapshot_image(&file, "snapshot of a tree sharing memory");
    use tardi_checkpointer::image::ShmId;
    let ids: Vec<ShmId> = image.shm.iter().map(|o| o.id).collect();
    assert_eq!(
        (
            ids.iter().filter(|i| matches!(i, ShmId::Sysv(_))).count(),
            ids.iter().filter(|i| matches!(i, ShmId::Anon(_))).count()
        ),
        (2, 3),
        "each object once, in the main image: two segments, the parent's anonymous object \
         and each child's own: {ids:?}"
    );
    assert!(image.tree.iter().all(|m| m.image.shm.is_empty()));

    // What the original tree holds one generation later: the restored one must match it.
    let later = shm_states(&cur, 4);
    let log = cur.log.clone();
    cur.stop();

    let restored = Running::restore_or_log(&file, &log);
    let after: Vec<String> = (0..3)
        .map(|role| shm_ask(&restored, role, "state"))
        .collect();
    assert_eq!(
        after, before,
        "every process's objects, byte for byte, and the segments' ids and attachments"
    );
    assert_eq!(
        shm_states(&restored, 4),
        later,
        "the restored tree goes on as the original did"
    );
    check_one_object(&restored);
    restored.stop();
}

// ---------------------------------------------------------------------------------------------
// Phase 3: zombies (`tests/programs/zombies.c`).

const ZOMBIE_PORT: u16 = 7500;

/// A command to role `role` (0: the main process, 1: its live child) of zombies.c.
fn zctl(r: &Running, role: u16, cmd: &str) -> String {
    r.ask_udp(ZOMBIE_PORT + role, cmd)
}

/// Children that exited and were not reaped come back as zombies of the same parents, with
/// their PIDs, groups, sessions, users and exit statuses, and no SIGCHLD of theirs delivered
/// twice: the restored parents reap them with the statuses the originals would have got.
#[test]
fn zombies_come_back_to_be_reaped_with_their_status() {
    let bin = programs::build("zombies");
    let scratch = Scratch::new("zombies");
    let name = format!("zombies-{}", std::process::id() % 10000);
    let m = common::tardi::manifest_for(&scratch.0, &name, &bin, &[]);
    let cur = Running::run(&m).expect("tardi run");
    for role in 0..2 {
        programs::wait_ready(
            SocketAddr::new(cur.address.into(), ZOMBIE_PORT + role),
            Duration::from_secs(10),
        )
        .expect("ready");
    }
    let before: Vec<String> = (0..2).map(|r| zctl(&cur, r, "state")).collect();
    // The shape zombies.c gives them: A exited 7; B killed by SIGTERM, leading its group; C
    // exited 0, leading its session, as user 65534; D (role 1's) killed by SIGKILL.
    let zs = |line: &str| -> Vec<Vec<String>> {
        fields(line)["zombies"]
            .split(',')
            .map(|z| z.split(':').map(str::to_string).collect())
            .collect()
    };
    let (main, child) = (zs(&before[0]), zs(&before[1]));
    assert_eq!(main.len(), 3, "{before:?}");
    let exited = libc::CLD_EXITED.to_string();
    let killed = libc::CLD_KILLED.to_string();
    assert_eq!(main[0][4..], [exited.clone(), "7".into()], "A: {before:?}");
    assert_eq!(main[1][4..], [killed.clone(), "15".into()], "B: {before:?}");
    assert_eq!(main[1][1], main[1][0], "B leads its group: {before:?}");
    assert_eq!(main[2][4..], [exited, "0".into()], "C: {before:?}");
    assert_eq!(main[2][2], main[2][0], "C leads its session: {before:?}");
    assert_eq!(main[2][3], "65534", "C's user: {before:?}");
    assert_eq!(child[0][4..], [killed, "9".into()], "D: {before:?}");

    let file = scratch.0.join("zombies.tardi");
    let image = cur.snapshot_image(&file, "snapshot of a tree with zombies");
    assert_eq!(image.tree.len(), 1, "one live process besides the main one");
    assert_eq!(image.zombies.len(), 4, "{:?}", image.zombies);
    let log = cur.log.clone();
    cur.stop();

    let restored = Running::restore_or_log(&file, &log);
    let after: Vec<String> = (0..2).map(|r| zctl(&restored, r, "state")).collect();
    assert_eq!(
        after, before,
        "each zombie's PID, group, session, user and status, and each parent's SIGCHLD count"
    );
    let reaped = |line: String| -> Vec<(String, String)> {
        fields(&line)["reaped"]
            .split(',')
            .map(|z| {
                let (p, s) = z.split_once(':').unwrap();
                (p.to_string(), s.to_string())
            })
            .collect()
    };
    let pids: Vec<String> = main.iter().map(|z| z[0].clone()).collect();
    assert_eq!(
        reaped(zctl(&restored, 0, "reap")),
        vec![
            (pids[0].clone(), (7 << 8).to_string()),
            (pids[1].clone(), libc::SIGTERM.to_string()),
            (pids[2].clone(), "0".to_string()),
        ],
        "the main process reaps its zombies with their statuses"
    );
    assert_eq!(
        reaped(zctl(&restored, 1, "reap")),
        vec![(child[0][0].clone(), libc::SIGKILL.to_string())],
        "role 1 reaps its zombie"
    );
    assert!(
        zctl(&restored, 0, "state").ends_with(&format!(
            "zombies={}:-,{}:-,{}:-",
            pids[0], pids[1], pids[2]
        )),
        "nothing left to reap"
    );
    restored.stop();
}
