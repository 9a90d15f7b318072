//! Process trees in the epoch loop (`docs/PROCESS-TREES.md`, "Phase 2, the epoch loop";
//! `tests/programs/forktree.c`: a main process, three children and a grandchild, one with a
//! second thread, in groups and sessions of their own). A chain of a full checkpoint of the
//! whole tree and incremental ones, with each tracker, while the processes write memory
//! between epochs (a new generation, in turn): every checkpoint parsed back and applied to a
//! backup's image (`store::Image`); at intervals, with the tree held stopped, each process's
//! image is compared with its live memory byte for byte, and so is the image built from a full
//! checkpoint taken in the middle of the chain. Then the final image is restored in place of
//! the original tree: every process comes back with its PID, parent, group, session and
//! memory. A tree that changes between epochs (processes that appear, exit or run execve) is
//! followed: `processes_that_appear_exit_and_exec_between_epochs_are_carried`; so is one that
//! changes under the first pause itself: `the_first_pause_of_a_tree_that_keeps_changing_*`.

mod common;

use common::programs;
use common::tardi::{Running, Scratch, manifest_for, manifest_with_tmp, write_chain};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tardi_checkpointer::epoch::{EpochConfig, Epochs};
use tardi_checkpointer::image::{Checkpoint, FdKind, Kind};
use tardi_checkpointer::store::Image;
use tardi_checkpointer::track::TrackerKind;
use tardi_checkpointer::verify::{compare_live_tree, compare_processes_tree};

const PORT: u16 = 7300;
const ROLES: u16 = 5;

fn roundtrip(ck: &Checkpoint) -> Checkpoint {
    Checkpoint::from_bytes(ck.to_bytes()).expect("a checkpoint parses back")
}

fn ask(r: &Running, role: u16, cmd: &str) -> String {
    r.ask_udp(PORT + role, cmd)
}

/// Every process's state line (PID, parent, group, session, generation, digest, TIDs).
fn states(r: &Running) -> Vec<String> {
    (0..ROLES).map(|role| ask(r, role, "state")).collect()
}

/// Restores `image` held into a second sandbox (the description `sandbox`, renamed), checks
/// that its `processes` processes came back, and that each equals its live process under
/// `live` (stopped), byte for byte.
fn held_restore(image: &Image, sandbox: &[u8], name: &str, live: i32, processes: usize) {
    let mut config: tardi_sandbox::SandboxConfig = serde_json::from_slice(sandbox).unwrap();
    config.name = format!("{name}-v");
    config.hostname = config.name.clone();
    config.run_dir = std::path::Path::new(tardi_sandbox::RUN_ROOT).join(&config.name);
    config.link_index = None;
    config.init_exe = Some(common::tardi::tardi().into());
    let (sb, held) = tardi_service::Service::restore_held_tree(&image.to_full(), config.clone())
        .expect("held restore of the tree");
    assert_eq!(held.len(), processes, "every process restored held");
    // Each held inside its restorer with every signal blocked (but SIGKILL and SIGSTOP, which
    // cannot be): a signal that comes meanwhile (a child holding itself sends its parent a
    // SIGCHLD) waits for the restored mask instead of running the app's handler mid-restore.
    for h in &held {
        let status = std::fs::read_to_string(format!("/proc/{}/status", h.host)).unwrap();
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap());
        assert_eq!(
            blocked,
            Some(!(1u64 << (libc::SIGKILL - 1) | 1 << (libc::SIGSTOP - 1))),
            "process {} held with its signals not blocked",
            h.pid
        );
    }
    let diffs = compare_processes_tree(live, &held, image, 20).unwrap();
    let _ = sb.teardown();
    let _ = std::fs::remove_dir_all(&config.run_dir);
    assert!(
        diffs.is_empty(),
        "the restored tree differs from the live one:\n{}",
        diffs.join("\n")
    );
}

/// The processes (roles) that write a new generation in epoch `i`: one each epoch, in turn;
/// every fourth epoch, all `roles` of them.
fn writers(i: u64, roles: u16) -> Vec<u16> {
    if i.is_multiple_of(4) {
        (0..roles).collect()
    } else {
        vec![(i % roles as u64) as u16]
    }
}

/// Applies epoch `i`'s checkpoint to the receiver's image and to the one built from the
/// mid-chain full checkpoint, once there is one.
fn apply_epoch(image: &mut Image, mid: Option<&mut Image>, ck: &Checkpoint, i: u64) {
    image.apply(ck).unwrap_or_else(|e| panic!("epoch {i}: {e}"));
    if let Some(m) = mid {
        m.apply(ck)
            .unwrap_or_else(|e| panic!("epoch {i}, on the full: {e}"));
    }
}

/// The chain's final `image` in place of the tree `run` (stopped first): written with the
/// sandbox of the first snapshot to `dir/chain.tardi` and restored from there.
fn restore_in_place_of(run: Running, image: &Image, sandbox: Vec<u8>, dir: &Path) -> Running {
    let file = dir.join("chain.tardi");
    write_chain(image, sandbox, &file);
    let log = run.log.clone();
    run.stop();
    Running::restore_or_log(&file, &log)
}

/// With the tree held stopped after epoch `i`: the receiver's image, and the one built from
/// the full checkpoint of epoch `full_at` (`mid`, once there is one), equal every live process
/// byte for byte.
fn assert_images_match_live(live: i32, image: &Image, mid: Option<&Image>, i: u64, full_at: u64) {
    let diffs = compare_live_tree(live, image, 20).unwrap();
    assert!(
        diffs.is_empty(),
        "epoch {i}: the image differs from the live tree:\n{}",
        diffs.join("\n")
    );
    if let Some(m) = mid {
        let diffs = compare_live_tree(live, m, 20).unwrap();
        assert!(
            diffs.is_empty(),
            "epoch {i}: the image from the full of epoch {full_at} differs:\n{}",
            diffs.join("\n")
        );
    }
}

/// `tests/programs/PROGRAM` under `tardi run`, in sandbox `ept-TAG-PID` (with a tmpfs at /tmp
/// when `tmp`), once each UDP port of `ports` answers: its scratch directory, sandbox name and
/// run.
fn run_program(
    program: &str,
    tag: &str,
    tmp: bool,
    ports: impl IntoIterator<Item = u16>,
) -> (Scratch, String, Running) {
    let bin = programs::build(program);
    let scratch = Scratch::new(&format!("tree-{tag}"));
    let name = format!("ept-{tag}-{}", std::process::id() % 10000);
    let m = if tmp {
        manifest_with_tmp(&scratch.0, &name, &bin)
    } else {
        manifest_for(&scratch.0, &name, &bin, &[])
    };
    let run = Running::run(&m).expect("tardi run");
    for port in ports {
        programs::wait_ready(
            SocketAddr::new(run.address.into(), port),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("port {port} of {name} ready: {e}"));
    }
    (scratch, name, run)
}

fn tree_chain(tag: &str, tracker: TrackerKind) {
    let (scratch, name, run) = run_program("forktree", tag, false, (0..ROLES).map(|r| PORT + r));
    // The sandbox description comes from an ordinary snapshot.
    let sandbox = run.snapshot_sandbox(&scratch.0.join("first.tardi"));

    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        tracker,
        precopy_min_pages: 0, // pre-copy every epoch (userfaultfd), however few pages
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(run.pid, cfg).expect("start epochs on a tree");
    assert_eq!(
        full.image.tree.len(),
        4,
        "four processes besides the main one"
    );
    assert!(
        !full.image.shared_files.is_empty(),
        "the tree shares its standard descriptors"
    );
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    let mut mid: Option<Image> = None;
    let (epochs, full_at) = (40u64, 12u64);
    let mut generation = 1;
    let mut dirty = 0;
    for i in 1..=epochs {
        // One process writes a new generation (272 KiB) each epoch, in turn; every fourth
        // epoch, all of them.
        generation += 1;
        let roles = writers(i, ROLES);
        for &role in &roles {
            assert_eq!(
                ask(&run, role, &format!("gen {generation}")),
                format!("gen={generation}")
            );
        }
        let held = i % 10 == 0 || i == full_at;
        if i == full_at {
            ep.request_full();
        }
        let out = ep
            .next_output(held)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        let ck = roundtrip(&out.incremental);
        assert_eq!(ck.kind, Kind::Incremental { base: i - 1 }, "epoch {i}");
        assert_eq!(ck.image.tree.len(), 4, "epoch {i}: every process listed");
        dirty += out.stats.dirty_pages;
        apply_epoch(&mut image, mid.as_mut(), &ck, i);
        if let Some(f) = out.full {
            assert_eq!(f.image.tree.len(), 4, "the full lists every process");
            mid = Some(Image::from_full(&roundtrip(&f)).expect("the full makes an image"));
        }
        if held && i == epochs {
            // The last image, restored held into a second sandbox: every process as the live
            // one, byte for byte (what `tardi profile --verify` does).
            held_restore(&image, &sandbox, &name, run.pid, 5);
        }
        if held {
            assert_images_match_live(run.pid, &image, mid.as_ref(), i, full_at);
            ep.release();
        }
    }
    assert!(
        dirty > epochs * 60,
        "the tree wrote {dirty} pages in {epochs} epochs: the test proves little"
    );
    ep.stop();
    let before = states(&run);

    // The chain's final image in place of the original tree.
    let restored = restore_in_place_of(run, &image, sandbox, &scratch.0);
    assert_eq!(
        states(&restored),
        before,
        "every process's PID, parent, group, session and memory after the restore"
    );
    restored.stop();
}

#[test]
fn a_tree_through_a_chain_of_epochs_uffd() {
    tree_chain("uffd", TrackerKind::Uffd);
}

#[test]
fn a_tree_through_a_chain_of_epochs_mprotect() {
    tree_chain("mprotect", TrackerKind::Mprotect);
}

// ---------------------------------------------------------------------------------------------
// Shared memory mapped by the tree's processes (`tests/programs/treeshm.c`: a parent and two
// children sharing an anonymous object, two System V segments, one attached only by the
// children, and a /dev/shm object; each child with an anonymous object of its own).

const SHM_PORT: u16 = 7500;
const SHM_ROLES: u16 = 3;

fn shm_ask(r: &Running, role: u16, cmd: &str) -> String {
    programs::request(
        SocketAddr::new(r.address.into(), SHM_PORT + role),
        cmd,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("{cmd} to role {role} of {}: {e}", r.name))
}

fn shm_states(r: &Running) -> Vec<String> {
    (0..SHM_ROLES)
        .map(|role| shm_ask(r, role, "state"))
        .collect()
}

/// A chain of epochs over a tree whose processes share memory, written by every process
/// between epochs: the objects are listed once, in the main image, in every checkpoint (the
/// members' mappings name them); the receiver's image (and one built from a full checkpoint
/// taken mid-chain) is compared with the live tree, shared memory included, with the tree held;
/// the last image is restored held next to the live tree and compared with it, then restored
/// in its place: every process sees the same objects, byte for byte.
fn tree_shm_chain(tag: &str, tracker: TrackerKind) {
    let ports = (0..SHM_ROLES).map(|r| SHM_PORT + r);
    let (scratch, name, run) = run_program("treeshm", tag, true, ports);
    let sandbox = run.snapshot_sandbox(&scratch.0.join("first.tardi"));
    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        tracker,
        private_dirs: vec!["/tmp".into(), "/dev/shm".into()],
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(run.pid, cfg).expect("start epochs on a tree");
    assert_eq!(full.image.tree.len(), 2, "two children");
    assert_eq!(
        full.image.shm.len(),
        5,
        "each object once, in the main image: two segments, the shared anonymous object and \
         each child's own: {:?}",
        full.image.shm.iter().map(|o| o.id).collect::<Vec<_>>()
    );
    assert!(full.image.tree.iter().all(|m| m.image.shm.is_empty()));
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    let mut mid: Option<Image> = None;
    let (epochs, full_at) = (24u64, 6u64);
    let mut generation = 1;
    let mut shm_pages = 0;
    for i in 1..=epochs {
        // One process writes a new generation into every object it maps each epoch, in turn;
        // every fourth epoch, all of them (and a marker through one of them).
        generation += 1;
        let roles = writers(i, SHM_ROLES);
        for &role in &roles {
            assert_eq!(
                shm_ask(&run, role, &format!("gen {generation}")),
                format!("gen={generation}")
            );
        }
        if i % 4 == 0 {
            let writer = (i / 4 % SHM_ROLES as u64) as u16;
            let obj = ["anon", "sv1", "posix"][(i / 4 % 3) as usize];
            assert_eq!(
                shm_ask(&run, writer, &format!("poke {obj} {obj}-{i}-by-{writer}")),
                "poked"
            );
        }
        let held = i % 8 == 0 || i == full_at;
        if i == full_at {
            ep.request_full();
        }
        let out = ep
            .next_output(held)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        let ck = roundtrip(&out.incremental);
        assert_eq!(ck.kind, Kind::Incremental { base: i - 1 }, "epoch {i}");
        assert_eq!(ck.image.shm.len(), 5, "epoch {i}: every object listed");
        assert!(
            ck.image.tree.iter().all(|m| m.image.shm.is_empty()),
            "epoch {i}: the members list none"
        );
        shm_pages += ck
            .image
            .shm
            .iter()
            .flat_map(|o| &o.runs)
            .map(|r| r.len / 4096)
            .sum::<u64>();
        apply_epoch(&mut image, mid.as_mut(), &ck, i);
        if let Some(f) = out.full {
            assert_eq!(f.image.shm.len(), 5, "the full lists every object");
            mid = Some(Image::from_full(&roundtrip(&f)).expect("the full makes an image"));
        }
        if held && i == epochs {
            held_restore(&image, &sandbox, &name, run.pid, 3);
        }
        if held {
            assert_images_match_live(run.pid, &image, mid.as_ref(), i, full_at);
            ep.release();
        }
    }
    assert!(
        shm_pages >= epochs * 2,
        "{shm_pages} pages of shared memory in {epochs} epochs: the test proves little"
    );
    ep.stop();
    let before = shm_states(&run);
    assert!(
        before.iter().all(|s| s.contains(" ok=1 ")),
        "every process wrote the last generation: {before:?}"
    );

    let restored = restore_in_place_of(run, &image, sandbox, &scratch.0);
    assert_eq!(
        shm_states(&restored),
        before,
        "every process's objects, byte for byte, and the segments' ids and attachments"
    );
    for (obj, roles) in [
        ("anon", [0, 1, 2]),
        ("posix", [0, 1, 2]),
        ("sv1", [0, 1, 2]),
    ] {
        let text = format!("{obj}-after");
        assert_eq!(
            shm_ask(&restored, 2, &format!("poke {obj} {text}")),
            "poked"
        );
        for role in roles {
            assert_eq!(
                shm_ask(&restored, role, &format!("peek {obj}")),
                format!("{obj}={text}"),
                "role {role} sees what role 2 wrote into {obj}: one object after the restore"
            );
        }
    }
    restored.stop();
}

#[test]
fn a_tree_sharing_memory_through_a_chain_of_epochs_uffd() {
    tree_shm_chain("shm-uffd", TrackerKind::Uffd);
}

#[test]
fn a_tree_sharing_memory_through_a_chain_of_epochs_mprotect() {
    tree_shm_chain("shm-mprotect", TrackerKind::Mprotect);
}

// ---------------------------------------------------------------------------------------------
// A tree that changes between epochs (`tests/programs/treechurn.c`: the main process forks
// workers on command; a worker exits or runs execve on command), with either tracker.

const CHURN_PORT: u16 = 7600;

/// One checkpoint of the changing tree: the processes it lists whole (fresh) and in all.
struct Seen {
    members: Vec<i32>,
    fresh: Vec<i32>,
    zombies: Vec<(i32, i32)>,
}

fn seen(ck: &Checkpoint) -> Seen {
    Seen {
        members: ck.image.tree.iter().map(|m| m.image.pid).collect(),
        fresh: ck
            .image
            .tree
            .iter()
            .filter(|m| m.image.base_epoch.is_none())
            .map(|m| m.image.pid)
            .collect(),
        zombies: ck.image.zombies.iter().map(|z| (z.pid, z.status)).collect(),
    }
}

/// The epoch loop follows a tree that changes (step 2 of `docs/PROCESS-TREES.md`), with the
/// default tracker: a service that starts as one process forks workers, which write memory,
/// exit (left as zombies, then reaped), and run execve, between epochs. Each change is carried
/// by the next checkpoint (a process that appeared or ran execve whole, one that exited no
/// longer listed, the zombies listed until reaped), applied to a backup's image; with the tree
/// held, the image equals the live tree byte for byte (zombies and their statuses too), also
/// the one built from a full checkpoint taken in the pause that captured a new worker whole.
/// The last image, with a worker that ran execve and a zombie, is restored in place of the
/// service: every process's PID, parent and memory, and the zombie reaped with its status.
#[test]
fn processes_that_appear_exit_and_exec_between_epochs_are_carried() {
    churn_chain("churn", TrackerKind::Uffd);
}

/// The same with the mprotect tracker, without the execve (the agent fails it with EPERM:
/// `execve_under_the_mprotect_tracker_fails_with_eperm_and_the_chain_goes_on`): each worker
/// forked between epochs inherits the agent of the main process, which the loop takes over
/// (`MprotectTracker::adopt`) and captures whole. The main process runs two more threads
/// while the workers are forked (`threads`): one with a `read` in flight for good, one with a
/// memory-layout call in flight most of the time, so each worker inherits the parent's
/// in-flight slots and often its lock; with the tree held, no worker's agent keeps anything a
/// thread it does not have holds (a lock held so would hang the worker's first `mmap`, and
/// its every pause would find the lock busy).
#[test]
fn processes_that_appear_and_exit_between_epochs_are_carried_mprotect() {
    churn_chain("churn-mp", TrackerKind::Mprotect);
}

/// Under the mprotect tracker, with the tree held: each worker's agent holds nothing (its
/// lock, in-flight slots) for a thread that is not one of the worker's own.
fn assert_no_orphans_in_workers(main_host: i32, i: u64) {
    use tardi_checkpointer::agent::Agent;
    use tardi_checkpointer::procfs::Proc;
    let main = Proc::open(main_host).unwrap();
    let mut kids = Vec::new();
    for t in main.tids().unwrap() {
        let text = std::fs::read_to_string(format!("/proc/{main_host}/task/{t}/children")).unwrap();
        kids.extend(text.split_whitespace().map(|c| c.parse::<i32>().unwrap()));
    }
    for k in kids {
        let p = Proc::open(k).unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{k}/stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
        {
            continue; // a zombie
        }
        let tids: Vec<u32> = p
            .tids()
            .unwrap()
            .into_iter()
            .map(|t| p.ns_pid(t).unwrap() as u32)
            .collect();
        let agent = Agent::find(k, &p.maps().unwrap())
            .unwrap_or_else(|| panic!("epoch {i}: worker {k} (host PID) carries no agent"));
        let h = agent.header().unwrap();
        assert!(
            h.lock == 0 || tids.contains(&h.lock),
            "epoch {i}: worker {k}'s agent lock is held by thread {} of another process \
             (its threads: {tids:?})",
            h.lock
        );
        let owners = agent.inflight_owners().unwrap();
        assert!(
            owners.iter().all(|o| tids.contains(o)),
            "epoch {i}: worker {k}'s agent has system calls in flight for threads not its own: \
             {owners:?} (its threads: {tids:?})"
        );
    }
}

fn churn_chain(tag: &str, tracker: TrackerKind) {
    let mprotect = matches!(tracker, TrackerKind::Mprotect);
    let (scratch, name, run) = run_program("treechurn", tag, false, [CHURN_PORT]);
    let ask = |role: u16, cmd: &str| run.ask_udp(CHURN_PORT + role, cmd);
    let ready = |role: u16| {
        programs::wait_ready(
            SocketAddr::new(run.address.into(), CHURN_PORT + role),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("worker {role} ready: {e}"))
    };
    let sandbox = run.snapshot_sandbox(&scratch.0.join("first.tardi"));
    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        precopy_min_pages: 0,
        tracker,
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(run.pid, cfg).expect("start epochs");
    assert!(full.image.tree.is_empty(), "the service starts alone");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    let mut mid: Option<Image> = None;
    let pid_of = |reply: String| -> i32 {
        reply
            .strip_prefix("forked=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("fork: {reply}"))
    };
    let (mut w1, mut w2, mut w3) = (0, 0, 0);
    let mut live: Vec<u16> = vec![0];
    let mut generation = 1;
    for i in 1..=24u64 {
        match i {
            1 if mprotect => assert_eq!(ask(0, "threads"), "threads"),
            2 => {
                w1 = pid_of(ask(0, "fork 1"));
                ready(1);
                live.push(1);
            }
            3 => {
                w2 = pid_of(ask(0, "fork 2"));
                ready(2);
                live.push(2);
            }
            6 => {
                assert_eq!(ask(1, "exit 3"), "bye");
                live.retain(|&r| r != 1);
                std::thread::sleep(Duration::from_millis(50));
            }
            9 => assert_eq!(ask(0, "reap"), format!("reaped={w1}:{}", 3 << 8)),
            11 if !mprotect => {
                assert_eq!(ask(2, "exec"), "exec");
                std::thread::sleep(Duration::from_millis(50));
                ready(2);
            }
            13 => {
                // A worker captured whole in the pause of a full checkpoint.
                w3 = pid_of(ask(0, "fork 3"));
                ready(3);
                live.push(3);
                ep.request_full();
            }
            16 => {
                // Forked, exited and reaped between two pauses: never seen.
                pid_of(ask(0, "fork 4"));
                ready(4);
                assert_eq!(ask(4, "exit 0"), "bye");
                std::thread::sleep(Duration::from_millis(50));
                assert!(ask(0, "reap").starts_with("reaped="));
            }
            17 if mprotect => assert_eq!(ask(0, "quiet"), "quiet"),
            19 => {
                assert_eq!(ask(3, "exit 5"), "bye");
                live.retain(|&r| r != 3);
                std::thread::sleep(Duration::from_millis(50));
            }
            _ => {}
        }
        generation += 1;
        for &role in &live {
            if (i + role as u64).is_multiple_of(2) {
                assert_eq!(
                    ask(role, &format!("gen {generation}")),
                    format!("gen={generation}")
                );
            }
        }
        let held = matches!(i, 3 | 6 | 11 | 13 | 20 | 24);
        let out = ep
            .next_output(held)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        let ck = roundtrip(&out.incremental);
        assert_eq!(ck.kind, Kind::Incremental { base: i - 1 }, "epoch {i}");
        let s = seen(&ck);
        match i {
            1 => assert!(s.members.is_empty(), "epoch 1"),
            2 => assert_eq!((&s.members, &s.fresh), (&vec![w1], &vec![w1]), "epoch 2"),
            3 => assert_eq!(
                (&s.members, &s.fresh),
                (&vec![w1, w2], &vec![w2]),
                "epoch 3"
            ),
            4 => assert!(s.fresh.is_empty(), "epoch 4: incremental again"),
            6..=8 => {
                assert_eq!(s.members, vec![w2], "epoch {i}: worker 1 exited");
                assert_eq!(s.zombies, vec![(w1, 3 << 8)], "epoch {i}: its zombie");
            }
            9 => assert!(s.zombies.is_empty(), "epoch 9: reaped"),
            11 if !mprotect => assert_eq!(s.fresh, vec![w2], "epoch 11: worker 2 ran execve"),
            11 | 12 => assert!(s.fresh.is_empty(), "epoch {i}"),
            13 => assert_eq!(
                (&s.members, &s.fresh),
                (&vec![w2, w3], &vec![w3]),
                "epoch 13"
            ),
            16 | 17 => assert_eq!(s.members, vec![w2, w3], "epoch {i}"),
            19 => assert_eq!(
                (&s.members, &s.zombies),
                (&vec![w2], &vec![(w3, 5 << 8)]),
                "epoch 19"
            ),
            _ => {}
        }
        apply_epoch(&mut image, mid.as_mut(), &ck, i);
        if let Some(f) = out.full {
            let f = roundtrip(&f);
            assert_eq!(
                seen(&f).members,
                vec![w2, w3],
                "the full lists the new worker"
            );
            mid = Some(Image::from_full(&f).expect("the full makes an image"));
        }
        if held && i == 24 {
            held_restore(&image, &sandbox, &name, run.pid, live.len());
        }
        if held {
            if mprotect {
                assert_no_orphans_in_workers(run.pid, i);
            }
            assert_images_match_live(run.pid, &image, mid.as_ref(), i, 13);
            ep.release();
        }
    }
    ep.stop();
    let states = |r: &Running, roles: &[u16]| -> Vec<String> {
        roles
            .iter()
            .map(|&role| r.ask_udp(CHURN_PORT + role, "state"))
            .collect()
    };
    let before = states(&run, &live);
    let execs = if mprotect { " execs=0" } else { " execs=1" };
    assert!(before[1].contains(execs), "{before:?}");

    let restored = restore_in_place_of(run, &image, sandbox, &scratch.0);
    assert_eq!(
        states(&restored, &live),
        before,
        "every process's PID, parent and memory after the restore"
    );
    assert_eq!(
        restored.ask_udp(CHURN_PORT, "reap"),
        format!("reaped={w3}:{}", 5 << 8),
        "the zombie came back with its status"
    );
    restored.stop();
}

/// With the mprotect tracker, `execve` stays refused, by the agent (its filter traps it and
/// it fails with EPERM): the filter would outlive `execve`, the agent and its SIGSYS handler
/// would not, and the new program would die at its first trapped call. A worker told to run
/// execve exits with 100 + errno (`treechurn.c`); the chain goes on and carries its zombie
/// with that status.
#[test]
fn execve_under_the_mprotect_tracker_fails_with_eperm_and_the_chain_goes_on() {
    let (_scratch, _, run) = run_program("treechurn", "exec-mp", false, [CHURN_PORT]);
    let ready = |role: u16| {
        programs::wait_ready(
            SocketAddr::new(run.address.into(), CHURN_PORT + role),
            Duration::from_secs(10),
        )
        .expect("ready")
    };
    let cfg = EpochConfig {
        tracker: TrackerKind::Mprotect,
        ..Default::default()
    };
    let (mut ep, _, _) = Epochs::start(run.pid, cfg).expect("start epochs");
    ep.next().expect("an epoch of the process alone");
    let w = run.ask_udp(CHURN_PORT, "fork 1");
    let w: i32 = w
        .strip_prefix("forked=")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("fork: {w}"));
    ready(1);
    let (ck, _) = ep.next().expect("the worker is followed");
    assert_eq!(seen(&ck).fresh, vec![w], "the new worker, whole");
    assert_eq!(run.ask_udp(CHURN_PORT + 1, "exec"), "exec");
    std::thread::sleep(Duration::from_millis(100));
    let (ck, _) = ep.next().expect("the chain goes on");
    let s = seen(&ck);
    assert!(s.members.is_empty(), "{:?}", s.members);
    assert_eq!(
        s.zombies,
        vec![(w, (100 + libc::EPERM) << 8)],
        "the worker's execve failed with EPERM"
    );
    ep.stop();
    run.stop();
}

/// The open file descriptions a tree shares are looked up again after any process made a
/// descriptor call (and kept while none did): `tests/programs/sharedfds.c`'s three processes
/// share a file; after one of them closes its copy between epochs, the next checkpoint lists
/// the file held by the other two only (kept from the lookup before, it would name a
/// descriptor that process no longer has), and the chain goes on.
#[test]
fn descriptions_a_tree_shares_follow_a_close_between_epochs() {
    const SHARED_PORT: u16 = 7400;
    let ports = (0..3).map(|r| SHARED_PORT + 1 + r);
    let (_scratch, _, run) = run_program("sharedfds", "fds", true, ports);
    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(run.pid, cfg).expect("start epochs on a tree");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    // The holders of the file (the description whose descriptor is a regular file).
    let file_holders = |ck: &Checkpoint| -> Vec<(i32, i32)> {
        ck.image
            .shared_files
            .iter()
            .find(|s| matches!(&s.file.kind, FdKind::Path { path, .. } if path.ends_with("sharedfds.log")))
            .map(|s| s.holders.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        file_holders(&full).len(),
        3,
        "the file is shared by all three"
    );
    for i in 1..=20u64 {
        if i == 10 {
            assert_eq!(run.ask_udp(SHARED_PORT + 1 + 2, "closefile"), "file=-1");
        }
        let out = ep
            .next_output(false)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        let ck = roundtrip(&out.incremental);
        image
            .apply(&ck)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        let holders = file_holders(&ck);
        assert_eq!(
            holders.len(),
            if i < 10 { 3 } else { 2 },
            "epoch {i}: {holders:?}"
        );
    }
    ep.stop();
    run.stop();
}

// ---------------------------------------------------------------------------------------------
// Processes running as an ordinary user (`tests/programs/unpriv.c`: a main process, root, and
// two children that drop to user 65534, one with a second thread), tracked by the mprotect
// tracker: its agent's seccomp filter needs `no_new_privs` or `CAP_SYS_ADMIN`, which such a
// process lacks (nginx's workers, as `www-data`, are the case in the field).

const NOBODY_PORT: u16 = 7700;
const NOBODY_ROLES: u16 = 3;

fn nobody_states(r: &Running) -> Vec<String> {
    (0..NOBODY_ROLES)
        .map(|role| r.ask_udp(NOBODY_PORT + role, "state"))
        .collect()
}

/// What the kernel holds as each process's `no_new_privs`, per thread ("nnp=A,B").
fn kernel_nnp(r: &Running) -> Vec<String> {
    (0..NOBODY_ROLES)
        .map(|role| r.ask_udp(NOBODY_PORT + role, "kernel"))
        .collect()
}

/// Each process's `no_new_privs` as `image` records it, by the PID a state line names.
fn recorded_nnp(image: &Image, states: &[String]) -> Vec<bool> {
    let by_pid: std::collections::HashMap<i32, &Image> = std::iter::once(image)
        .chain(image.members().map(|(_, m)| m))
        .map(|m| (m.meta.pid, m))
        .collect();
    states
        .iter()
        .map(|s| {
            let pid: i32 = s
                .split_whitespace()
                .find_map(|f| f.strip_prefix("pid="))
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no pid in {s:?}"));
            let m = by_pid
                .get(&pid)
                .unwrap_or_else(|| panic!("process {pid} is not in the image"));
            m.meta.creds.no_new_privs
        })
        .collect()
}

/// A chain of epochs with the mprotect tracker over a tree whose children run as user 65534
/// and write memory between epochs: the chain starts (the agent's filter is installed in every
/// process), the receiver's image equals the live tree with it held, and a held restore of the
/// last image equals it too. `no_new_privs`, which the tracker has to set in the children for
/// the filter, stays the app's own: the children read 0 through `prctl` while tracked, the
/// image records 0 for them, except for the child that set it itself during the chain, and
/// the restored tree has the kernel's flag as the app had it (0, 0 in both threads, 1). The
/// main process (root, with `CAP_SYS_ADMIN`) is left without it.
#[test]
fn an_ordinary_users_processes_through_a_chain_of_epochs_mprotect() {
    let ports = (0..NOBODY_ROLES).map(|r| NOBODY_PORT + r);
    let (scratch, name, run) = run_program("unpriv", "unpriv", false, ports);
    let sandbox = run.snapshot_sandbox(&scratch.0.join("first.tardi"));
    let first = nobody_states(&run);
    for s in &first[1..] {
        assert!(
            s.contains(" uid=65534,65534,65534 ") && s.contains(" nnp=0 "),
            "a child runs as 65534 without no_new_privs: {s}"
        );
    }
    assert_eq!(kernel_nnp(&run), ["nnp=0", "nnp=0,0", "nnp=0"]);

    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        tracker: TrackerKind::Mprotect,
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(run.pid, cfg)
        .expect("start epochs with the mprotect tracker on processes of an ordinary user");
    assert_eq!(full.image.tree.len(), 2, "two children");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    // The kernel holds the flag in both threads of child 1 and in child 2 (for the filter),
    // not in the main process; every process reads its own through prctl.
    assert_eq!(kernel_nnp(&run), ["nnp=0", "nnp=1,1", "nnp=1"]);
    let tracked = nobody_states(&run);
    assert!(
        tracked.iter().all(|s| s.contains(" nnp=0 ")),
        "prctl answers the app's own no_new_privs: {tracked:?}"
    );
    assert_eq!(recorded_nnp(&image, &tracked), [false, false, false]);

    let (epochs, set_at) = (24u64, 10u64);
    let mut generation = 1;
    let mut dirty = 0;
    for i in 1..=epochs {
        generation += 1;
        for role in writers(i, NOBODY_ROLES) {
            assert_eq!(
                run.ask_udp(NOBODY_PORT + role, &format!("gen {generation}")),
                format!("gen={generation}")
            );
        }
        if i == set_at {
            // Child 2 sets no_new_privs itself: from now on that is the app's own state.
            assert_eq!(run.ask_udp(NOBODY_PORT + 2, "nnp"), "nnp-set=0");
        }
        let held = i % 8 == 0;
        let out = ep
            .next_output(held)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        let ck = roundtrip(&out.incremental);
        assert_eq!(ck.kind, Kind::Incremental { base: i - 1 }, "epoch {i}");
        dirty += out.stats.dirty_pages;
        apply_epoch(&mut image, None, &ck, i);
        if held && i == epochs {
            held_restore(&image, &sandbox, &name, run.pid, 3);
        }
        if held {
            assert_images_match_live(run.pid, &image, None, i, 0);
            ep.release();
        }
    }
    assert!(
        dirty > epochs * 60,
        "the tree wrote {dirty} pages in {epochs} epochs: the test proves little"
    );
    ep.stop();
    let before = nobody_states(&run);
    assert!(
        before[2].contains(" nnp=1 ") && before[1].contains(" nnp=0 "),
        "{before:?}"
    );
    assert_eq!(
        recorded_nnp(&image, &before),
        [false, false, true],
        "the image records each process's own no_new_privs"
    );

    // The chain's final image in place of the original tree: the same processes, memory and
    // users, and no_new_privs as the app had it (not as the tracker left the kernel's).
    let restored = restore_in_place_of(run, &image, sandbox, &scratch.0);
    assert_eq!(
        nobody_states(&restored),
        before,
        "every process's PID, parent, users, memory and prctl's no_new_privs after the restore"
    );
    assert_eq!(
        kernel_nnp(&restored),
        ["nnp=0", "nnp=0,0", "nnp=1"],
        "the restored processes' no_new_privs is the app's"
    );
    restored.stop();
}

/// The first pause of a tree that changes faster than it can be listed and then stopped alike:
/// a shell with three subshells, each forking a short-lived subshell over and over (it counts
/// to 300 and exits: a child about every millisecond in each, alive most of the time; no
/// `execve`, which the mprotect tracker refuses). The start captures the tree as it stopped it, whatever was listed before
/// (`epoch::adopt_stopped`): starting over until the two agreed gave up here after its 20
/// rounds ("the process tree kept changing while it was being stopped"), as it did in
/// PostgreSQL's tests under connection churn. Then a few epochs follow the churn, and every
/// checkpoint's members descend from the shell.
fn start_under_churn(tag: &str, tracker: TrackerKind) {
    let scratch = Scratch::new(&format!("tree-{tag}"));
    let name = format!("ept-{tag}-{}", std::process::id() % 10000);
    let m = manifest_for(
        &scratch.0,
        &name,
        Path::new("/bin/sh"),
        &[
            "-c",
            "for k in 1 2 3; do (while :; do (i=0; while [ $i -lt 300 ]; do i=$((i+1)); \
             done); done) & done; wait",
        ],
    );
    let run = Running::run(&m).expect("tardi run");
    std::thread::sleep(Duration::from_millis(200));
    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        tracker,
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(run.pid, cfg).expect("the start under churn");
    let full = roundtrip(&full);
    let shell = full.image.pid;
    // Parents are listed before their children: each member's and zombie's parent is the
    // shell or a member listed before it.
    let mut pids = vec![shell];
    for m in &full.image.tree {
        assert!(
            pids.contains(&m.ppid),
            "member {} of checkpoint 0: parent {}",
            m.image.pid,
            m.ppid
        );
        pids.push(m.image.pid);
    }
    for z in &full.image.zombies {
        assert!(
            pids.contains(&z.ppid),
            "zombie {} of checkpoint 0: parent {}",
            z.pid,
            z.ppid
        );
    }
    let mut members = full.image.tree.len() + full.image.zombies.len();
    for i in 1..=20u64 {
        let out = ep
            .next_output(false)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        let ck = roundtrip(&out.incremental);
        assert_eq!(ck.kind, Kind::Incremental { base: i - 1 }, "epoch {i}");
        let s = seen(&ck);
        members += s.members.len() + s.zombies.len();
    }
    ep.stop();
    // The churn went on under the epochs (a shell stopped for good would fork nothing).
    assert!(
        members > 0,
        "no child of the shell was ever captured, alive or a zombie"
    );
    run.stop();
}

#[test]
fn the_first_pause_of_a_tree_that_keeps_changing_captures_it_uffd() {
    start_under_churn("start-churn", TrackerKind::Uffd);
}

#[test]
fn the_first_pause_of_a_tree_that_keeps_changing_captures_it_mprotect() {
    start_under_churn("start-churn-mp", TrackerKind::Mprotect);
}
