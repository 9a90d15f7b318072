//! Incremental checkpoints: a chain of one full and 200+ incremental checkpoints of a running
//! program, each serialized and parsed back, applied to an image; at intervals (and at the end)
//! the process is held stopped and the image is compared with its memory byte for byte. Then
//! the final image is restored with `tardi restore` and must carry on correctly.

mod common;

use common::programs::{self, Report};
use common::tardi::{Running, Scratch, manifest_for};
use std::net::SocketAddr;
use std::time::Duration;
use tardi_checkpointer::epoch::{EpochConfig, Epochs};
use tardi_checkpointer::image::Checkpoint;
use tardi_checkpointer::store::Image;
use tardi_checkpointer::verify::compare_live;

fn roundtrip(ck: &Checkpoint) -> Checkpoint {
    Checkpoint::from_bytes(ck.to_bytes()).expect("a checkpoint parses back")
}

/// Runs `epochs` incremental epochs on `pid`, verifying every `check_every` epochs and at the
/// end. Returns the final image.
fn chain(pid: i32, cfg: EpochConfig, epochs: u64, check_every: u64) -> Image {
    let (mut ep, full, _) = Epochs::start(pid, cfg).expect("start epochs");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    let mut total_dirty = 0;
    for i in 1..=epochs {
        let held = i % check_every == 0 || i == epochs;
        let (ck, st) = if held { ep.next_held() } else { ep.next() }
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        total_dirty += st.dirty_pages + st.fresh_pages;
        assert_eq!(ck.epoch, i);
        image
            .apply(&roundtrip(&ck))
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        if held {
            let diffs = compare_live(pid, &image, 20).unwrap();
            assert!(
                diffs.is_empty(),
                "epoch {i}: the image differs from the live process:\n{}",
                diffs.join("\n")
            );
            ep.release();
        }
    }
    assert!(
        total_dirty > epochs,
        "the program wrote almost nothing: the test proves little"
    );
    ep.stop();
    image
}

fn statemachine_chain(tag: &str, cfg: EpochConfig) {
    let bin = programs::build("statemachine");
    let scratch = Scratch::new(tag);
    let name = format!("inc-{tag}-{}", std::process::id() % 10000);
    let manifest = manifest_for(&scratch.0, &name, &bin, &["--threads", "4"]);
    let run = Running::run(&manifest).expect("tardi run");
    let addr = SocketAddr::new(run.address.into(), 7000);
    programs::wait_ready(addr, Duration::from_secs(10)).unwrap();
    // The sandbox description comes from an ordinary snapshot.
    let first = scratch.0.join("first.tardi");
    run.snapshot(&first).unwrap();
    let sandbox = Checkpoint::from_bytes(std::fs::read(&first).unwrap())
        .unwrap()
        .image
        .sandbox;

    let every: u64 = std::env::var("TARDI_CHECK_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    let image = chain(run.pid, cfg, 200, every);
    let before: Report = programs::query(addr, Duration::from_secs(5)).unwrap();
    before.check().unwrap();

    // Restore the chain's final image in place of the original.
    let mut full = image.to_full();
    full.image.sandbox = sandbox;
    let file = scratch.0.join("chain.tardi");
    std::fs::write(&file, full.to_bytes()).unwrap();
    run.stop();
    let restored = Running::restore(&file).expect("restore the chain");
    let after = programs::query(addr, Duration::from_secs(5)).unwrap();
    after
        .check()
        .unwrap_or_else(|e| panic!("restored from the chain: {e}"));
    std::thread::sleep(Duration::from_millis(50));
    let later = programs::query(addr, Duration::from_secs(5)).unwrap();
    later.check().unwrap();
    assert!(
        later.total_steps() > after.total_steps(),
        "restored process makes no progress"
    );
    restored.stop();
}

#[test]
fn statemachine_chain_uffd_hot_pages_two_encoders() {
    statemachine_chain(
        "hot",
        EpochConfig {
            interval: Duration::from_millis(5),
            encode_workers: 2,
            ..Default::default()
        },
    );
}

#[test]
fn statemachine_chain_uffd_no_hot_pages_no_twins_no_precopy() {
    statemachine_chain(
        "cold",
        EpochConfig {
            interval: Duration::from_millis(5),
            hot_epochs: 0,
            twin_budget: 0,
            precopy: false,
            ..Default::default()
        },
    );
}

/// The memory-layout churn program (`tests/programs/churn.c`): threads that write, mmap,
/// munmap, mremap (grow, shrink, move, DONTUNMAP), MADV_DONTNEED, mprotect (incl. PROT_NONE
/// with data inside), replace mappings at the same address, brk up and down, and write
/// copy-on-write file mappings — all inside single epochs. The chain's image must equal the live
/// memory byte for byte at every check; at the end the image is restored (held before running)
/// into a second sandbox, and the two processes are compared byte for byte.
fn churn_chain(tag: &str, cfg: EpochConfig, env: &str) {
    use tardi_sandbox::SandboxConfig;
    let bin = programs::build("churn");
    let scratch = Scratch::new(tag);
    let name = format!("churn-{tag}-{}", std::process::id() % 10000);
    let data = scratch.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let manifest = scratch.0.join("churn.manifest");
    std::fs::write(
        &manifest,
        format!(
            "libos.entrypoint = {bin:?}\nloader.argv = [\"churn\", \"--threads\", \"3\", \"--rate\", \"20\", \"--file\", \"/mnt/churn.dat\"]\n\
             fs.mounts = [{{ path = \"/\", uri = \"file:/\" }}, {{ path = \"/mnt\", uri = \"file:{}\" }}, {{ type = \"tmpfs\", path = \"/tmp\" }}]\n\
             {env}\n[tardi]\nname = \"{name}\"\nprivate_dirs = [\"/mnt\"]\n",
            data.display()
        ),
    )
    .unwrap();
    let run = Running::run(&manifest).expect("tardi run churn");
    std::thread::sleep(Duration::from_millis(300));
    let first = scratch.0.join("first.tardi");
    run.snapshot(&first).unwrap();
    let mut config: SandboxConfig = serde_json::from_slice(
        &Checkpoint::from_bytes(std::fs::read(&first).unwrap())
            .unwrap()
            .image
            .sandbox,
    )
    .unwrap();

    let pid = run.pid;
    let (mut ep, full, _) = Epochs::start(pid, cfg).expect("start epochs");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    let (mut fresh, mut resets) = (0, 0);
    for i in 1..=220u64 {
        let held = i % 20 == 0 || i == 220;
        let (ck, st) = if held { ep.next_held() } else { ep.next() }
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        fresh += st.fresh_pages;
        resets += ck.image.reset.len();
        image
            .apply(&roundtrip(&ck))
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        if held && i < 220 {
            let diffs = compare_live(pid, &image, 20).unwrap();
            assert!(
                diffs.is_empty(),
                "epoch {i}: image differs from the live process:\n{}",
                diffs.join("\n")
            );
            ep.release();
        }
    }
    assert!(
        resets > 50 && fresh > 0,
        "the churn made too few layout changes ({resets} resets): the test proves little"
    );
    // Final epoch, still held: compare, then restore the image held into a second sandbox.
    let diffs = compare_live(pid, &image, 20).unwrap();
    assert!(
        diffs.is_empty(),
        "final image differs from the live process:\n{}",
        diffs.join("\n")
    );
    config.name = format!("{name}-v");
    config.hostname = config.name.clone();
    config.run_dir = std::path::Path::new(tardi_sandbox::RUN_ROOT).join(&config.name);
    config.link_index = None;
    config.init_exe = Some(common::tardi::tardi().into());
    let ck = image.to_full();
    let (sb, skip) =
        tardi_service::Service::restore_held(&ck, config.clone()).expect("held restore");
    let restored = sb.pid();
    let volatile = tardi_checkpointer::verify::rseq_areas(&image);
    let diffs =
        tardi_checkpointer::verify::compare_processes(pid, restored, skip, &volatile, 20).unwrap();
    let _ = sb.teardown();
    ep.release();
    ep.stop();
    run.stop();
    let _ = std::fs::remove_dir_all(&config.run_dir);
    assert!(
        diffs.is_empty(),
        "restored process differs from the live one:\n{}",
        diffs.join("\n")
    );
}

/// Every kind of layout change except one `mremap` case (see the next test).
#[test]
fn churn_chain_uffd_hot_pages() {
    churn_chain(
        "churn",
        EpochConfig {
            interval: Duration::from_millis(5),
            ..Default::default()
        },
        "loader.env.CHURN_MREMAP_SKIP = \"2\"",
    );
}

/// KNOWN LIMITATION (ignored until fixed): since Linux 6.17 `mremap()` may move a range that
/// spans several mappings, but refuses it for userfaultfd-registered ones — after moving the
/// first. Under write tracking such a call fails half-done, which the service never sees
/// untracked. churn's "move onto a placeholder" does this and then corrupts its own
/// bookkeeping. The fix is to intercept mremap (seccomp user notification: unregister, let it
/// run, capture the result as fresh). Run with `cargo test --test incremental -- --ignored`.
#[test]
#[ignore = "known limitation: multi-mapping mremap under userfaultfd tracking (Linux >= 6.17)"]
fn churn_chain_uffd_with_multi_mapping_mremap() {
    churn_chain(
        "churnall",
        EpochConfig {
            interval: Duration::from_millis(5),
            ..Default::default()
        },
        "",
    );
}

/// The mprotect + SIGSEGV tracker (agent in the process) on the state machine: 4 threads
/// blocked in futex, epoll, nanosleep, pipe reads and a timerfd between bursts of writes to
/// heap, stack, TLS, mmap'd and mprotect'd memory.
#[test]
fn statemachine_chain_mprotect_hot_pages() {
    statemachine_chain(
        "mprot",
        EpochConfig {
            interval: Duration::from_millis(5),
            tracker: tardi_checkpointer::track::TrackerKind::Mprotect,
            ..Default::default()
        },
    );
}

/// The churn program under the mprotect tracker, every layout change included: the agent sees
/// each mremap (it is one of the calls it serves), so the multi-mapping move that the
/// userfaultfd tracker cannot follow works here.
#[test]
fn churn_chain_mprotect_all_layout_changes() {
    churn_chain(
        "churnmp",
        EpochConfig {
            interval: Duration::from_millis(5),
            tracker: tardi_checkpointer::track::TrackerKind::Mprotect,
            ..Default::default()
        },
        "",
    );
}

/// An app with its own SIGSEGV handler and its own `mprotect` calls (a GC-style write barrier:
/// protect a page, write, the handler opens it; its handler's mask blocks every signal) plus
/// `read()` into heap memory, under the mprotect tracker, whose agent also owns SIGSEGV and
/// serves `mprotect` and `read`. The app checks every round that its write faulted exactly once
/// and landed, and that the kernel's write into the heap arrived; any deviation ends it with
/// "FAIL". The chain is verified against the live process as for the other tests.
#[test]
fn app_segv_handler_and_mprotect_work_under_the_mprotect_tracker() {
    let bin = programs::build("segv_barrier");
    let scratch = Scratch::new("segvbar");
    let name = format!("segvbar-{}", std::process::id() % 10000);
    let manifest = manifest_for(&scratch.0, &name, &bin, &[]);
    let run = Running::run(&manifest).expect("tardi run");
    std::thread::sleep(Duration::from_millis(200));
    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        tracker: tardi_checkpointer::track::TrackerKind::Mprotect,
        ..Default::default()
    };
    let log_rounds = |log: &str| {
        log.lines()
            .filter_map(|l| l.strip_prefix("ok "))
            .filter_map(|n| n.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
    };
    let before = log_rounds(&std::fs::read_to_string(&run.log).unwrap());
    let _image = chain(run.pid, cfg, 100, 25);
    std::thread::sleep(Duration::from_millis(300));
    let log = std::fs::read_to_string(&run.log).unwrap();
    run.stop();
    assert!(!log.contains("FAIL"), "the app saw a difference:\n{log}");
    let after = log_rounds(&log);
    assert!(
        after > before + 2000,
        "the app made too little progress under tracking ({before} -> {after} rounds):\n{log}"
    );
}
