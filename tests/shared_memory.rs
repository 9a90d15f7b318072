//! Shared memory of every kind (`tests/programs/shmem.c`): shared anonymous memory mapped
//! twice, System V segments (with a key and owner, attached twice one of them read-only,
//! marked for removal while attached, not attached at all), POSIX shared memory in
//! `/dev/shm` mapped twice and a shared mapping of a `/tmp` file. Snapshot → kill → restore,
//! and an incremental chain (a new generation written to every object between epochs) with
//! each tracker, restored: every byte as it was (the program checks each against its
//! generation), the segments with their ids, keys, sizes, modes, owners and attachment
//! counts, and the sharing itself (a write through one mapping seen through the other, and
//! through a child forked after the restore).

mod common;

use common::programs;
use common::tardi::{Running, Scratch, run_with_tmp, write_chain};
use std::collections::BTreeMap;
use tardi_checkpointer::epoch::{EpochConfig, Epochs};
use tardi_checkpointer::image::{Checkpoint, ShmId};
use tardi_checkpointer::store::Image;
use tardi_checkpointer::track::TrackerKind;

const PORT: u16 = 7000;

fn start(tag: &str) -> (Scratch, Running) {
    run_with_tmp("shmem", "shm", tag, PORT)
}

/// The state line as it must be, before any restore: every byte right, the segments as made.
fn check_source(state: &str) {
    let f = programs::fields(state);
    assert_eq!(f["ok"], "1", "{state}");
    assert_eq!(f["s1_key"], "7a7d0001", "{state}");
    assert_eq!(f["s1_owner"], "1234:5678", "{state}");
    assert_eq!(f["s1_nattch"], "2", "{state}");
    assert_eq!(f["s1_ro"], "yes", "{state}");
    // Marked for removal (SHM_DEST, 01000) and still attached.
    assert_eq!(f["s2_key"], "0", "{state}");
    assert!(f["s2_mode"].starts_with('1'), "{state}");
    assert_eq!(f["s3_nattch"], "0", "{state}");
}

/// What a restored process must show: the state it had, sharing intact, and writes that go on.
fn check_restored(r: &Running, before: &str) {
    let after = r.ask(PORT, "state");
    assert_eq!(after, before, "state after restore");
    let share = programs::fields(&r.ask(PORT, "share"));
    let want: BTreeMap<String, String> = [
        ("anon_twin", "shared"),
        ("anon_fork", "shared"),
        ("s1_twin", "shared"),
        ("s2_fork", "shared"),
        ("posix_twin", "shared"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(share, want, "sharing after restore");
    let generation: u64 = programs::fields(before)["gen"].parse().unwrap();
    assert_eq!(r.ask(PORT, "tick"), format!("gen={}", generation + 1));
    let next = programs::fields(&r.ask(PORT, "state"));
    assert_eq!(
        next["ok"], "1",
        "a generation written after the restore: {next:?}"
    );
}

#[test]
fn shared_memory_survives_a_restore() {
    let (scratch, cur) = start("snap");
    cur.ask(PORT, "tick");
    let before = cur.ask(PORT, "state");
    check_source(&before);
    let file = scratch.0.join("s.tardi");
    let image = cur.snapshot_image(&file, "snapshot");
    let kinds: Vec<ShmId> = image.shm.iter().map(|o| o.id).collect();
    assert_eq!(
        kinds.iter().filter(|i| matches!(i, ShmId::Sysv(_))).count(),
        3,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|i| matches!(i, ShmId::Anon(_))).count(),
        1,
        "one anonymous object, captured once for its two mappings: {kinds:?}"
    );
    let restored = cur.restore_in_place(&file);
    check_restored(&restored, &before);
    restored.stop();
}

/// An incremental chain with a new generation written to every object between epochs,
/// applied to an image and restored.
fn chain(tracker: TrackerKind, tag: &str) {
    let (scratch, run) = start(tag);
    let sandbox = run.snapshot_sandbox(&scratch.0.join("first.tardi"));
    let cfg = EpochConfig {
        private_dirs: vec!["/tmp".into(), "/dev/shm".into()],
        tracker,
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(run.pid, cfg).expect("start epochs");
    let mut image = Image::from_full(&full).unwrap();
    let mut shm_bytes = 0;
    for round in 0..6 {
        assert_eq!(run.ask(PORT, "tick"), format!("gen={}", round + 1));
        for _ in 0..3 {
            let (ck, _) = ep.next().expect("an epoch");
            let ck = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
            shm_bytes += ck
                .image
                .shm
                .iter()
                .flat_map(|o| &o.runs)
                .map(|r| r.len)
                .sum::<u64>();
            image.apply(&ck).unwrap();
        }
    }
    assert!(shm_bytes > 0, "the chain carried the objects' changes");
    let before = run.ask(PORT, "state");
    check_source(&before);
    let (ck, _) = ep.next().expect("the last epoch");
    image
        .apply(&Checkpoint::from_bytes(ck.to_bytes()).unwrap())
        .unwrap();
    drop(ep);

    let file = scratch.0.join("chain.tardi");
    write_chain(&image, sandbox, &file);
    let restored = run.restore_in_place(&file);
    check_restored(&restored, &before);
    restored.stop();
}

#[test]
fn shared_memory_written_between_epochs_survives_a_chain_restore_uffd() {
    chain(TrackerKind::Uffd, "cu");
}

#[test]
fn shared_memory_written_between_epochs_survives_a_chain_restore_mprotect() {
    chain(TrackerKind::Mprotect, "cm");
}
