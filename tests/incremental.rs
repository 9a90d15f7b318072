//! Incremental checkpoints: a chain of one full and 200+ incremental checkpoints of a running
//! program, each serialized and parsed back, applied to an image; at intervals (and at the end)
//! the process is held stopped and the image is compared with its memory byte for byte. Then
//! the final image is restored with `tardi restore` and must carry on correctly.
//!
//! Over a thousand lines: one binary (built and linked once) whose tests share the churn
//! program's driver and the image comparison; each test is one scenario of the same chain.

mod common;

use common::driven::Driven;
use common::programs::{self, Report};
use common::tardi::{Running, Scratch, manifest_for, write_chain};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;
use tardi_checkpointer::epoch::{ChainState, EpochConfig, Epochs, FailPoint};
use tardi_checkpointer::image::{Backing, Checkpoint, Kind, ProcessImage};
use tardi_checkpointer::store::Image;
use tardi_checkpointer::verify::compare_live;

fn roundtrip(ck: &Checkpoint) -> Checkpoint {
    Checkpoint::from_bytes(ck.to_bytes()).expect("a checkpoint parses back")
}

/// What a chain does besides following the process.
#[derive(Default)]
struct Extra {
    /// Ask for a full checkpoint at these calls: each gets its own image, which every later
    /// incremental is applied to as well, and which is checked like the chain's own and
    /// against it.
    fulls_at: Vec<u64>,
    /// Make these calls fail at a point: the failure must leave the chain intact.
    fail_at: Vec<(u64, FailPoint)>,
}

/// Runs `epochs` incremental epochs on `pid`, verifying every `check_every` epochs and at the
/// end. Returns the final image.
fn chain(pid: i32, cfg: EpochConfig, epochs: u64, check_every: u64) -> Image {
    chain_with(pid, cfg, epochs, check_every, &Extra::default())
}

fn chain_with(pid: i32, cfg: EpochConfig, epochs: u64, check_every: u64, extra: &Extra) -> Image {
    let (mut ep, full, _) = Epochs::start(pid, cfg).expect("start epochs");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    // Images built from full checkpoints taken in the middle of the stream: (epoch, image).
    let mut others: Vec<(u64, Image)> = Vec::new();
    let mut total_dirty = 0;
    let mut last = 0;
    // The next checkpoint skips a number (a failure after the hook gave one out).
    let mut skip = false;
    let mut fails = 0;
    // The last checkpoints' metadata (no page data), to explain a page that differs.
    let mut history: std::collections::VecDeque<(u64, bool, u64, ProcessImage)> =
        Default::default();
    for i in 1..=epochs {
        if let Some(&(_, at)) = extra.fail_at.iter().find(|f| f.0 == i) {
            ep.fail_next(at);
            let e = ep.next().expect_err("an injected failure");
            assert_eq!(e.chain(), ChainState::Intact, "call {i}: {e}");
            skip |= at == FailPoint::AfterResume;
            fails += 1;
            continue;
        }
        let held = i % check_every == 0
            || i == epochs
            || extra.fulls_at.contains(&i)
            || extra.fulls_at.contains(&(i - 1))
            || extra.fail_at.iter().any(|f| f.0 + 1 == i);
        if extra.fulls_at.contains(&i) {
            ep.request_full();
        }
        let out = ep
            .next_output(held)
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
        let (ck, st) = (out.incremental, out.stats);
        total_dirty += st.dirty_pages + st.fresh_pages;
        let want = last + if skip { 2 } else { 1 };
        assert_eq!(ck.epoch, want, "call {i}: checkpoint numbers");
        assert_eq!(ck.kind, Kind::Incremental { base: last }, "call {i}");
        (last, skip) = (ck.epoch, false);
        let ck = roundtrip(&ck);
        if history.len() == 12 {
            history.pop_front();
        }
        history.push_back((i, st.layout_carried, ck.epoch, ck.image.clone()));
        image
            .apply(&ck)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        for (at, other) in &mut others {
            other
                .apply(&ck)
                .unwrap_or_else(|e| panic!("epoch {i}, on the full of {at}: {e}"));
        }
        match out.full {
            Some(full) => {
                assert!(
                    extra.fulls_at.contains(&i),
                    "call {i}: a full nobody asked for"
                );
                assert_eq!((full.epoch, full.kind), (ck.epoch, Kind::Full));
                assert!(st.full_bytes > 0);
                others.push((
                    ck.epoch,
                    Image::from_full(&roundtrip(&full)).expect("the full makes an image"),
                ));
            }
            None => assert!(!extra.fulls_at.contains(&i), "call {i}: no full"),
        }
        if held {
            let diffs = compare_live(pid, &image, 20).unwrap();
            assert!(
                diffs.is_empty(),
                "epoch {i}: the image differs from the live process:\n{}\n{}",
                diffs.join("\n"),
                explain(pid, &diffs, &history)
            );
            for (at, other) in &others {
                let mut diffs = compare_live(pid, other, 20).unwrap();
                diffs.extend(same_images(&image, other));
                assert!(
                    diffs.is_empty(),
                    "epoch {i}: the image from the full of {at} differs:\n{}",
                    diffs.join("\n")
                );
            }
            ep.release();
        }
    }
    assert_eq!(fails, extra.fail_at.len());
    assert_eq!(
        others.len(),
        extra.fulls_at.len(),
        "every full was produced"
    );
    assert!(
        total_dirty > epochs,
        "the program wrote almost nothing: the test proves little"
    );
    ep.stop();
    image
}

/// What the last checkpoints said of each page named in `diffs`, and what the kernel says of
/// it now: for a failure that shows once in many runs, the story of the page it names.
fn explain(
    pid: i32,
    diffs: &[String],
    history: &std::collections::VecDeque<(u64, bool, u64, ProcessImage)>,
) -> String {
    use std::os::unix::fs::FileExt;
    let within = |rs: &[(u64, u64)], a: u64| rs.iter().any(|r| r.0 <= a && a < r.1);
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok();
    let mut out = String::new();
    for d in diffs.iter().take(3) {
        let Some(a) = d
            .strip_prefix("page 0x")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            continue;
        };
        let mut e = [0u8; 8];
        let entry = pagemap
            .as_ref()
            .and_then(|f| f.read_exact_at(&mut e, a / 4096 * 8).ok())
            .map(|_| u64::from_le_bytes(e));
        out.push_str(&format!(
            "page {a:#x}: pagemap now {:?} (63 present, 62 swapped, 61 file/shared, 57 uffd-wp)\n",
            entry.map(|e| format!("{:#018x}", e & !((1 << 55) - 1)))
        ));
        for (i, carried, epoch, m) in history {
            let vma = m.vmas.iter().find(|v| v.start <= a && a < v.end);
            out.push_str(&format!(
                "  call {i} (epoch {epoch}): layout carried {carried}, in cow {}, in reset {}, page {:?}, vma {:?}\n",
                within(&m.cow, a),
                within(&m.reset, a),
                m.pages.iter().find(|p| p.addr == a).map(|p| p.enc),
                vma.map(|v| (v.start, v.end, &v.backing, v.prot)),
            ));
        }
    }
    out
}

/// Differences between two images of the same state (empty: none): metadata (the
/// copied-on-write list aside: a full carries none), the private directories' tree, and every
/// page (one that only one image holds must be zeros in an anonymous mapping; in a file mapping
/// it reads as the file, which `compare_live` checks).
fn same_images(a: &Image, b: &Image) -> Vec<String> {
    let mut diffs = Vec::new();
    if a.epoch != b.epoch {
        diffs.push(format!("epochs {} and {}", a.epoch, b.epoch));
    }
    let meta = |i: &Image| {
        let mut m = i.meta.clone();
        m.cow.clear();
        serde_json::to_string(&m).unwrap()
    };
    if meta(a) != meta(b) {
        diffs.push("the metadata differs".into());
    }
    if a.tree() != b.tree() {
        diffs.push("the private directories' trees differ".into());
    }
    let pages = |i: &Image| {
        let ck = i.to_full();
        let mut m = BTreeMap::new();
        for r in &ck.image.runs {
            for p in 0..r.len / 4096 {
                let o = (r.data_off + p * 4096) as usize;
                m.insert(r.addr + p * 4096, ck.data[o..o + 4096].to_vec());
            }
        }
        m
    };
    let (pa, pb) = (pages(a), pages(b));
    let anon = |addr: u64| {
        a.meta
            .vmas
            .iter()
            .find(|v| v.start <= addr && addr < v.end)
            .is_some_and(|v| v.backing == Backing::Anon)
    };
    let zero = vec![0u8; 4096];
    let addrs: BTreeSet<u64> = pa.keys().chain(pb.keys()).copied().collect();
    for addr in addrs {
        let ok = match (pa.get(&addr), pb.get(&addr)) {
            (Some(x), Some(y)) => x == y,
            (Some(x), None) | (None, Some(x)) => !anon(addr) || *x == zero,
            (None, None) => true,
        };
        if !ok && diffs.len() < 20 {
            diffs.push(format!("page {addr:#x} differs"));
        }
    }
    diffs
}

/// The state machine (4 threads) running in a sandbox, ready.
fn statemachine_run(tag: &str) -> (Scratch, Running, SocketAddr) {
    let bin = programs::build("statemachine");
    let scratch = Scratch::new(tag);
    let name = format!("inc-{tag}-{}", std::process::id() % 10000);
    let manifest = manifest_for(&scratch.0, &name, &bin, &["--threads", "4"]);
    let run = Running::run(&manifest).expect("tardi run");
    let addr = SocketAddr::new(run.address.into(), 7000);
    programs::wait_ready(addr, Duration::from_secs(10)).unwrap();
    (scratch, run, addr)
}

fn statemachine_chain(tag: &str, cfg: EpochConfig) {
    let (scratch, run, addr) = statemachine_run(tag);
    // The sandbox description comes from an ordinary snapshot.
    let sandbox = run.snapshot_sandbox(&scratch.0.join("first.tardi"));

    let every: u64 = std::env::var("TARDI_CHECK_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    let image = chain(run.pid, cfg, 200, every);
    let before: Report = programs::query(addr, Duration::from_secs(5)).unwrap();
    before.check().unwrap();

    // Restore the chain's final image in place of the original.
    let file = scratch.0.join("chain.tardi");
    write_chain(&image, sandbox, &file);
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
            precopy_min_pages: 0, // pre-copy every epoch, however few pages
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
    let (scratch, run, name) = common::tardi::churn_run(tag, env);
    let mut config: SandboxConfig =
        serde_json::from_slice(&run.snapshot_sandbox(&scratch.0.join("first.tardi"))).unwrap();

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
            precopy_min_pages: 0, // pre-copy every epoch, however few pages
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
            precopy_min_pages: 0, // pre-copy every epoch, however few pages
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

/// A full checkpoint in the middle of a stream (for a backup that joins), twice: each must
/// describe exactly the state of the incremental taken in the same pause — its image is
/// compared with the chain's and with the live process — and every later incremental must
/// apply to it as to the chain (the same twins serve both).
#[test]
fn full_checkpoint_mid_stream_statemachine_uffd() {
    let (_scratch, run, addr) = statemachine_run("fullmid");
    let cfg = EpochConfig {
        precopy_min_pages: 0, // pre-copy every epoch, however few pages
        interval: Duration::from_millis(5),
        ..Default::default()
    };
    let extra = Extra {
        fulls_at: vec![15, 60],
        ..Default::default()
    };
    chain_with(run.pid, cfg, 100, 20, &extra);
    programs::query(addr, Duration::from_secs(5))
        .unwrap()
        .check()
        .unwrap();
    run.stop();
}

/// The same with the mprotect tracker, whose commit writes the agent's pages inside the pause
/// (after the scan): the full copies them as the incremental does.
#[test]
fn full_checkpoint_mid_stream_statemachine_mprotect() {
    let (_scratch, run, _addr) = statemachine_run("fullmp");
    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        tracker: tardi_checkpointer::track::TrackerKind::Mprotect,
        ..Default::default()
    };
    let extra = Extra {
        fulls_at: vec![10, 40],
        ..Default::default()
    };
    chain_with(run.pid, cfg, 70, 20, &extra);
    run.stop();
}

/// The churn program (mappings created, replaced, moved, zapped, copied-on-write file pages,
/// a private directory) with fulls in the middle of the stream and failures at every point
/// the loop can fail after the scan: the chain, and the images from the fulls, stay equal to
/// the live process.
#[test]
fn full_checkpoint_mid_stream_and_failures_churn_uffd() {
    churn_fulls_and_failures("fullchurn", "", 1, 20);
}

/// A stress variant of the test above, for a failure seen once in ~230 runs of it: a page of a
/// private file mapping whose image copy was stale. Most of churn's new and replacing mappings
/// are private file mappings here (`CHURN_FILE_BIAS`), the image is checked every 5 epochs, and
/// the schedule is stretched twice; a failure prints what the last checkpoints said of the page
/// (`explain`). It failed once in 70 runs before the fix (a copy zapped and faulted in again
/// between two pauses without a write reported: see the copied-on-write list in
/// `EpochLoop::capture`). Not in the default suite (~1 minute, and rare): `cargo test --test
/// incremental -- --ignored file_mapping_churn_stress`, in a loop.
#[test]
#[ignore = "stress campaign for a rare failure; run with --ignored, in a loop"]
fn file_mapping_churn_stress() {
    churn_fulls_and_failures("filechurn", "loader.env.CHURN_FILE_BIAS = \"1\"", 2, 5);
}

/// The churn chain with full checkpoints and failures, on a schedule stretched `scale` times
/// (160 epochs at 1; a failure right before a full at each scale), checked every `check_every`
/// epochs; `env`: more manifest lines (churn's settings).
fn churn_fulls_and_failures(tag: &str, env: &str, scale: u64, check_every: u64) {
    let (_scratch, run, _name) =
        common::tardi::churn_run(tag, &format!("loader.env.CHURN_MREMAP_SKIP = \"2\"\n{env}"));
    let cfg = EpochConfig {
        precopy_min_pages: 0, // pre-copy every epoch, however few pages
        interval: Duration::from_millis(5),
        private_dirs: vec!["/mnt".into()],
        ..Default::default()
    };
    let s = scale;
    let extra = Extra {
        fulls_at: vec![20 * s, 75 * s, 130 * s],
        fail_at: vec![
            (30 * s, FailPoint::AfterScan),
            (50 * s, FailPoint::AfterCopy),
            (70 * s, FailPoint::AfterResume),
            (75 * s - 1, FailPoint::AfterScan),
            (100 * s, FailPoint::AfterResume),
            (100 * s + 1, FailPoint::AfterCopy),
        ],
    };
    chain_with(run.pid, cfg, 160 * s, check_every, &extra);
    run.stop();
}

/// A page written every epoch must not lose a write when the page before it is replaced.
/// `hotpair` writes its pages A (anonymous) and B (a private file mapping, copied on write),
/// side by side, every epoch; then A is replaced and B written once more, and the pause right
/// after must hold B's write. (Written for hot pages left writable under userfaultfd, when
/// unprotecting a run of them stopped at the first mapping that was not registered and a
/// write the pre-copy's scan took from the page after it was lost. Userfaultfd now keeps
/// every page protected and tells no hot pages apart; the pre-copy takes B every epoch and the
/// pause's scan must still report B's last write.)
#[test]
fn hot_page_after_a_replaced_one_keeps_its_write() {
    let (_scratch, mut prog, a) = hotpair("hotpair");
    let pid = prog.pid();
    let mut step = |c: u8| prog.step(c);
    let cfg = EpochConfig {
        precopy_min_pages: 0, // pre-copy every epoch, however few pages
        interval: Duration::from_millis(1),
        hot_epochs: 3,
        // Hot pages stay hot (no random cooling) for the whole test.
        cold_one_in: u32::MAX,
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(pid, cfg).expect("start epochs");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    let mut hot = 0;
    for i in 0..5 {
        step(b'w');
        let (ck, st) = ep.next().unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        image.apply(&roundtrip(&ck)).unwrap();
        hot += st.hot_pages;
    }
    assert_eq!(hot, 0, "userfaultfd tells no hot pages apart");
    step(b'r');
    step(b'b');
    let diffs = last_held(ep, &mut image, pid, "the epoch after the replacement");
    assert!(
        diffs.is_empty(),
        "the image differs from the live process (A at {a:#x}, B at {:#x}):\n{}",
        a + 4096,
        diffs.join("\n")
    );
}

/// 1 ms epochs of `pid` under the default tracker, started: the loop and the image of its full
/// checkpoint.
fn millisecond_epochs(pid: i32) -> (Epochs, Image) {
    let cfg = EpochConfig {
        interval: Duration::from_millis(1),
        ..Default::default()
    };
    let (ep, full, _) = Epochs::start(pid, cfg).expect("start epochs");
    (ep, Image::from_full(&roundtrip(&full)).unwrap())
}

/// The next checkpoint of `ep`, applied to `image` (`what`: for the message); its stats.
fn next(ep: &mut Epochs, image: &mut Image, what: &str) -> tardi_checkpointer::epoch::EpochStats {
    let (ck, st) = ep.next().unwrap_or_else(|e| panic!("{what}: {e}"));
    image.apply(&roundtrip(&ck)).unwrap();
    st
}

/// A page of a private file mapping that was copied on write, zapped (it shows the file
/// again) and then read, with the file written afterwards: the image must show the file. A
/// pause that carries the layout adds this epoch's written pages in file mappings to the
/// copied-on-write list ("a written page is never the file's own"); that holds only because
/// the kernel leaves a write-protect marker where it zapped a page of a registered file
/// mapping, so the read maps the file's page protected and the tracker reports no write (had
/// it reported one, the receiver would keep the file's bytes of that moment as B's own copy,
/// stale after the file's write). `hotpair`'s page B: written, zapped, read in the next epoch
/// (no layout call: the layout is carried), then the file is written.
#[test]
fn a_zapped_file_page_read_again_shows_the_file() {
    let (_scratch, mut prog, a) = hotpair("zapread");
    let (pid, b) = (prog.pid(), a + 4096);
    let mut step = |c: u8| prog.step(c);
    let (mut ep, mut image) = millisecond_epochs(pid);
    step(b'b');
    next(&mut ep, &mut image, "after B's write");
    step(b'z');
    next(&mut ep, &mut image, "after B's zap");
    step(b'l');
    let st = next(&mut ep, &mut image, "after B's read");
    step(b'f');
    let diffs = last_held(ep, &mut image, pid, "the epoch after the file's write");
    assert!(
        st.layout_carried,
        "the pause after the read carried the layout"
    );
    assert!(
        diffs.is_empty(),
        "the image differs from the live process (B at {b:#x}):\n{}",
        diffs.join("\n")
    );
}

/// The same page B, written and zapped in one epoch whose checkpoint then fails after the
/// resume (`FailPoint::AfterResume`): its scan reported B written, so B is carried to the next
/// pause, though it is the file's own page by then. That pause must not list a carried page as
/// a copy of its own (issue 26, item 3): the loop forgets the failed capture's layout and
/// copied-on-write list and reads them again. Before, the pause after the failure carried the
/// layout, listed B, and the image kept the file's bytes of that moment as B's copy: stale
/// once the file was written.
#[test]
fn a_carried_page_zapped_before_a_failed_pause_shows_the_file() {
    let (_scratch, mut prog, a) = hotpair("zapfail");
    let (pid, b) = (prog.pid(), a + 4096);
    let mut step = |c: u8| prog.step(c);
    let (mut ep, mut image) = millisecond_epochs(pid);
    step(b'b');
    next(&mut ep, &mut image, "after B's write");
    step(b'b');
    step(b'z');
    ep.fail_next(FailPoint::AfterResume);
    assert!(ep.next().is_err(), "the injected failure");
    next(&mut ep, &mut image, "after the failure");
    step(b'f');
    let diffs = last_held(ep, &mut image, pid, "the epoch after the file's write");
    assert!(
        diffs.is_empty(),
        "the image differs from the live process (B at {b:#x}):\n{}",
        diffs.join("\n")
    );
}

/// One last epoch, held while `image` (with it applied) is compared with the live process `pid`;
/// the loop is stopped after. The differences.
fn last_held(mut ep: Epochs, image: &mut Image, pid: i32, what: &str) -> Vec<String> {
    let (ck, _) = ep.next_held().unwrap_or_else(|e| panic!("{what}: {e}"));
    image.apply(&roundtrip(&ck)).unwrap();
    let diffs = compare_live(pid, image, 20).unwrap();
    ep.release();
    ep.stop();
    diffs
}

/// `hotpair` started on a file of a new scratch directory `name`, with its page A's address.
fn hotpair(name: &str) -> (Scratch, Commanded, u64) {
    use std::io::BufRead;
    let scratch = Scratch::new(name);
    let mut prog = Commanded::spawn("hotpair", &[scratch.0.join("pair.dat")]);
    let mut line = String::new();
    prog.output.read_line(&mut line).unwrap();
    let a = u64::from_str_radix(line.trim(), 16).expect("hotpair prints its address");
    (scratch, prog, a)
}

/// A test program driven by one-byte commands on stdin, each answered with `k` on stdout once
/// done (`hotpair`, `stackgrow`); killed when dropped.
struct Commanded {
    name: &'static str,
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::BufReader<std::process::ChildStdout>,
}

impl Commanded {
    fn spawn(name: &'static str, args: &[impl AsRef<std::ffi::OsStr>]) -> Commanded {
        let mut child = std::process::Command::new(programs::build(name))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let input = child.stdin.take().unwrap();
        let output = std::io::BufReader::new(child.stdout.take().unwrap());
        Commanded {
            name,
            child,
            input,
            output,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends command `c` and waits for its answer.
    fn step(&mut self, c: u8) {
        use std::io::{Read, Write};
        self.input.write_all(&[c]).unwrap();
        let mut k = [0u8];
        self.output.read_exact(&mut k).unwrap();
        assert_eq!(&k, b"k", "{}'s answer to {:?}", self.name, c as char);
    }
}

impl Drop for Commanded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Failures after the tracker handed the written pages over (inside the pause, after the copy,
/// after the resume), again and again: each says the chain is intact, and it is — the next
/// checkpoint carries what the failed one took (the image is compared with the live process
/// right after each), with a number after any the hook may have seen.
#[test]
fn failures_after_the_scan_keep_the_chain_intact() {
    let (_scratch, run, addr) = statemachine_run("carry");
    let cfg = EpochConfig {
        precopy_min_pages: 0, // pre-copy every epoch, however few pages
        interval: Duration::from_millis(5),
        ..Default::default()
    };
    let points = [
        FailPoint::AfterScan,
        FailPoint::AfterCopy,
        FailPoint::AfterResume,
    ];
    let extra = Extra {
        fail_at: (0..24)
            .map(|k| (5 + 5 * k, points[k as usize % 3]))
            .collect(),
        ..Default::default()
    };
    chain_with(run.pid, cfg, 130, 1000, &extra);
    programs::query(addr, Duration::from_secs(5))
        .unwrap()
        .check()
        .unwrap();
    run.stop();
}

/// (stack pointer, instruction pointer) of every thread of `pid` from `/proc/PID/task/*/syscall`,
/// `None` for a thread that is running (the kernel reads them only off a stopped thread).
fn threads_sp_pc(pid: i32) -> Vec<Option<(u64, u64)>> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let tid = e.unwrap().file_name().into_string().unwrap();
        let text =
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).unwrap_or_default();
        // "NR ARGS... SP PC", "-1 SP PC", or "running".
        let f: Vec<&str> = text.split_whitespace().collect();
        out.push(match f.len() {
            n if n >= 3 => hex(f[n - 2]).zip(hex(f[n - 1])),
            _ => None,
        });
    }
    out
}

/// The pause hook: called once per checkpoint, with its number, in order, inside the pause
/// that produced it — every thread's stack and instruction pointer, read from `/proc` while the
/// hook runs, are those of the checkpoint's threads (a hook called after the resume would see
/// running threads, or threads that re-issued their interrupted system calls; one called at the
/// next pause, another state). A pause that fails before the hook does not call it and its
/// number is used by the next checkpoint; one that fails after it gives up its number.
#[test]
fn pause_hook_runs_inside_the_pause_with_the_checkpoint_number() {
    use std::sync::{Arc, Mutex, mpsc};
    use tardi_checkpointer::epoch::EpochHooks;
    let (_scratch, run, _addr) = statemachine_run("hook");
    let pid = run.pid;
    // The hook runs on the epoch thread, inside the sandbox's root: a thread with the host's
    // view reads `/proc` for it, while it waits.
    let (ask, asked) = mpsc::channel::<u64>();
    let (answer, answered) = mpsc::channel::<()>();
    // Per hook call: the epoch, and each thread's (state, stop count) as `/proc` showed it.
    type Seen = Vec<(u64, Vec<Option<(u64, u64)>>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let log = seen.clone();
    let reader = std::thread::spawn(move || {
        while let Ok(n) = asked.recv() {
            log.lock().unwrap().push((n, threads_sp_pc(pid)));
            if answer.send(()).is_err() {
                break;
            }
        }
    });
    let hooks = EpochHooks::on_pause(move |n| {
        let _ = ask.send(n);
        let _ = answered.recv_timeout(Duration::from_secs(10));
    });
    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start_with(pid, cfg, hooks).expect("start epochs");
    // The threads as each checkpoint describes them, once applied (a thread that did not run
    // since the last checkpoint is carried over from it, without registers of its own).
    let mut image = Image::from_full(&full).expect("the full checkpoint applies");
    let regs = |img: &tardi_checkpointer::image::ProcessImage| {
        let mut v: Vec<Option<(u64, u64)>> = img
            .threads
            .iter()
            .map(|t| Some((t.regs[19], t.regs[16]))) // rsp, rip
            .collect();
        v.sort();
        v
    };
    let check = |ck: &Checkpoint, image: &Image, numbers: &[u64]| {
        let seen = seen.lock().unwrap();
        let got: Vec<u64> = seen.iter().map(|s| s.0).collect();
        assert_eq!(got, numbers, "hook calls after checkpoint {}", ck.epoch);
        let mut at_hook = seen.last().unwrap().1.clone();
        at_hook.sort();
        assert_eq!(
            at_hook,
            regs(&image.meta),
            "checkpoint {}: the threads as the hook saw them",
            ck.epoch
        );
    };
    let mut numbers = vec![0];
    check(&full, &image, &numbers);
    for i in 1..=60u64 {
        match i {
            20 => ep.fail_next(FailPoint::AfterScan),
            30 => ep.fail_next(FailPoint::AfterCopy),
            40 => ep.fail_next(FailPoint::AfterResume),
            _ => {}
        }
        match ep.next() {
            Ok((ck, _)) => {
                numbers.push(ck.epoch);
                image
                    .apply(&ck)
                    .expect("each checkpoint applies to the last");
                check(&ck, &image, &numbers);
            }
            Err(e) => {
                assert!(matches!(i, 20 | 30 | 40), "call {i}: {e}");
                assert_eq!(e.chain(), ChainState::Intact);
                if i == 40 {
                    // The hook saw the pause, the checkpoint was not produced.
                    numbers.push(numbers.last().unwrap() + 1);
                }
                assert_eq!(
                    seen.lock().unwrap().iter().map(|s| s.0).collect::<Vec<_>>(),
                    numbers,
                    "call {i}: hook calls after a failure"
                );
            }
        }
    }
    // 57 checkpoints after the first, and the number given up: no gaps, no repeats.
    assert_eq!(numbers, (0..=58).collect::<Vec<u64>>());
    ep.stop();
    reader.join().unwrap();
    run.stop();
}

/// Output ends epochs early: an epoch ends once the trigger is set (not before the minimum
/// interval), whether it was set before the epoch or during it; without it, epochs run their
/// whole interval; the trigger is cleared inside the pause before the hook, so a packet
/// queued right after the hook's mark (here: the hook sets it) ends the next epoch early.
#[test]
fn output_ends_the_epoch_early() {
    use std::sync::{Arc, OnceLock};
    use tardi_checkpointer::epoch::{EndedBy, EpochHooks, Trigger};
    let (_scratch, run, _addr) = statemachine_run("trigger");
    let min = Duration::from_millis(3);
    let cfg = EpochConfig {
        interval: Duration::from_millis(400),
        min_interval: min,
        cap_pages: 0,
        ..Default::default()
    };
    // Epoch numbers whose pause marks output queued right after it.
    let mark_after: Arc<OnceLock<(Trigger, Vec<u64>)>> = Arc::default();
    let m = mark_after.clone();
    let hooks = EpochHooks::on_pause(move |n| {
        if let Some((t, at)) = m.get()
            && at.contains(&n)
        {
            t.set();
        }
    });
    let (mut ep, _, _) = Epochs::start_with(run.pid, cfg, hooks).expect("start epochs");
    let trigger = ep.trigger();
    let ended = |ep: &mut Epochs| {
        let (ck, st) = ep.next().unwrap();
        (ck.epoch, st.ended_by, st.interval_us)
    };
    // Set before the epoch: it ends at the minimum interval.
    for _ in 0..10 {
        trigger.set();
        let (n, by, us) = ended(&mut ep);
        assert_eq!(by, EndedBy::Output, "epoch {n}");
        assert!(
            us >= min.as_micros() as u64,
            "epoch {n} ended after {us} µs"
        );
    }
    // Set during the epoch, from another thread.
    for _ in 0..3 {
        let t = trigger.clone();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            t.set();
        });
        let (n, by, _) = ended(&mut ep);
        assert_eq!(by, EndedBy::Output, "epoch {n}");
        setter.join().unwrap();
    }
    // Not set: the whole interval (the pause cleared the last one).
    for _ in 0..2 {
        let (n, by, _) = ended(&mut ep);
        assert_eq!(by, EndedBy::Interval, "epoch {n}");
    }
    // Set by the hook of the next pause, just after its mark: the epoch after it ends early.
    let (n, _, _) = ended(&mut ep);
    let _ = mark_after.set((trigger.clone(), vec![n + 1, n + 3]));
    let by: Vec<EndedBy> = (0..4).map(|_| ended(&mut ep).1).collect();
    assert_eq!(
        by,
        [
            EndedBy::Interval,
            EndedBy::Output,
            EndedBy::Interval,
            EndedBy::Output
        ],
        "epochs {}..={}",
        n + 1,
        n + 4
    );
    ep.stop();
    run.stop();
}

/// `follow_releases`: once the output before the open epoch is released and the epoch has
/// queued as many packets as that release sent, waiting output ends it at `follow_min`, not at
/// the (here very long) minimum interval; fewer packets, a release of an older epoch, or the
/// rule turned off keep the minimum; a release that arrives while the loop waits wakes it.
#[test]
fn answered_output_ends_the_epoch_at_the_follow_minimum() {
    use tardi_checkpointer::epoch::{EndedBy, EpochHooks};
    let (_scratch, run, _addr) = statemachine_run("follow");
    let min = Duration::from_millis(1500);
    let cfg = |follow| EpochConfig {
        interval: Duration::from_secs(4),
        min_interval: min,
        follow_releases: follow,
        follow_min: Duration::ZERO,
        cap_pages: 0,
        ..Default::default()
    };
    let (mut ep, first, _) =
        Epochs::start_with(run.pid, cfg(true), EpochHooks::default()).expect("start epochs");
    assert_eq!(first.epoch, 0);
    let trigger = ep.trigger();
    // Each epoch's stats also say what the loop saw of its answers (`EpochStats::answers`).
    let ended = |ep: &mut Epochs| {
        let (ck, st) = ep.next().unwrap();
        assert_eq!(st.ended_by, EndedBy::Output, "epoch {}", ck.epoch);
        let a = st
            .answers
            .clone()
            .expect("answers recorded under follow_releases");
        let (first, last) = (a.first_output_us.unwrap(), a.last_output_us.unwrap());
        assert!(
            first <= last && last <= st.interval_us,
            "epoch {}: {a:?}",
            ck.epoch
        );
        if let Some(r) = a.release_us {
            assert!(r <= st.interval_us, "epoch {}: {a:?}", ck.epoch);
        }
        (ck.epoch, Duration::from_micros(st.interval_us), a)
    };
    // Released up to the base (0) with 2 packets; 1 answered: the minimum.
    trigger.released(0, 2);
    trigger.output(1);
    let (n, d, a) = ended(&mut ep);
    assert!(
        d >= min,
        "epoch {n}: one answer of two ended it after {d:?}"
    );
    assert!(a.release_us.is_some(), "epoch {n}: {a:?}");
    assert_eq!((a.packets, a.release_packets), (1, 2), "epoch {n}");
    // Base 1 released with 2 packets, 2 answered: at once.
    trigger.released(1, 2);
    trigger.output(2);
    let (n, d, a) = ended(&mut ep);
    assert!(d < min, "epoch {n}: all answered, still {d:?}");
    assert_eq!((a.packets, a.release_packets), (2, 2), "epoch {n}");
    // The base (2) is not released yet, only 1: the minimum.
    trigger.output(5);
    let (n, d, a) = ended(&mut ep);
    assert!(d >= min, "epoch {n}: base not released, ended after {d:?}");
    assert_eq!(a.release_us, None, "epoch {n}: no release of its base");
    assert_eq!((a.packets, a.release_packets), (5, 0), "epoch {n}");
    // The release comes while the loop waits, output already counted: it wakes the loop.
    trigger.output(3);
    let t = trigger.clone();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        t.released(3, 3);
    });
    let (n, d, a) = ended(&mut ep);
    releaser.join().unwrap();
    assert!(d < min, "epoch {n}: released while waiting, still {d:?}");
    let r = a.release_us.expect("released during the epoch");
    assert!(r >= 100_000, "epoch {n}: released {r} µs after the resume");
    assert!(
        a.first_output_us.unwrap() < r,
        "epoch {n}: output before the release: {a:?}"
    );
    ep.stop();
    // The rule off: answered or not, the minimum.
    let (mut ep, first, _) =
        Epochs::start_with(run.pid, cfg(false), EpochHooks::default()).expect("start epochs");
    let trigger = ep.trigger();
    trigger.released(first.epoch, 0);
    trigger.output(1);
    let (ck, st) = ep.next().unwrap();
    let d = Duration::from_micros(st.interval_us);
    assert!(
        d >= min,
        "epoch {}: the rule is off, ended after {d:?}",
        ck.epoch
    );
    assert_eq!(st.answers, None, "no answers recorded with the rule off");
    ep.stop();
    run.stop();
}

/// `after_release`: while the clients of the last release have not all answered, waiting
/// output ends the epoch no sooner than `after_release` after that release (here later than
/// the minimum after the resume); once they have all answered, `follow_min` still ends it at
/// once; with no release during the epoch, the minimum after the resume applies alone.
#[test]
fn unanswered_output_waits_after_the_release() {
    use tardi_checkpointer::epoch::{EndedBy, EpochHooks};
    let (_scratch, run, _addr) = statemachine_run("after-release");
    let (min, after) = (Duration::from_millis(1000), Duration::from_millis(1500));
    let cfg = EpochConfig {
        interval: Duration::from_secs(6),
        min_interval: min,
        follow_releases: true,
        follow_min: Duration::ZERO,
        after_release: after,
        cap_pages: 0,
        ..Default::default()
    };
    let (mut ep, first, _) =
        Epochs::start_with(run.pid, cfg, EpochHooks::default()).expect("start epochs");
    let trigger = ep.trigger();
    let ended = |ep: &mut Epochs| {
        let (ck, st) = ep.next().unwrap();
        assert_eq!(st.ended_by, EndedBy::Output, "epoch {}", ck.epoch);
        let a = st.answers.clone().expect("answers under follow_releases");
        (ck.epoch, Duration::from_micros(st.interval_us), a)
    };
    // One answer of two; the release comes 300 ms into the epoch: not before 300 + 1500 ms.
    trigger.output(1);
    let (t, base) = (trigger.clone(), first.epoch);
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        t.released(base, 2);
    });
    let (n, d, a) = ended(&mut ep);
    releaser.join().unwrap();
    let r = Duration::from_micros(a.release_us.expect("released during the epoch"));
    assert!(
        d >= r + after,
        "epoch {n}: released {r:?} after the resume, ended {d:?} after it"
    );
    // Released during the next epoch with 2 packets, both answered: at once.
    trigger.released(n, 2);
    trigger.output(2);
    let (m, d, a) = ended(&mut ep);
    assert_eq!((a.packets, a.release_packets), (2, 2), "epoch {m}");
    assert!(d < min, "epoch {m}: all answered, still {d:?}");
    // No release during the epoch: the minimum after the resume.
    trigger.output(1);
    let (k, d, a) = ended(&mut ep);
    assert_eq!(a.release_us, None, "epoch {k}: {a:?}");
    assert!(
        d >= min && d < min + after,
        "epoch {k}: no release, ended after {d:?}"
    );
    ep.stop();
    run.stop();
}

/// The service killed between epochs, or inside a pause (by the hook): the loop says the
/// service is gone, promptly and again on every later call, and stops cleanly. A pause that
/// completed before the kill still delivers its checkpoint.
fn killed_service(tag: &str, in_pause: bool) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tardi_checkpointer::epoch::EpochHooks;
    let (_scratch, run, _addr) = statemachine_run(tag);
    let pid = run.pid;
    let kill_at = Arc::new(AtomicU64::new(u64::MAX));
    let k = kill_at.clone();
    let hooks = EpochHooks::on_pause(move |n| {
        if n == k.load(Ordering::Relaxed) {
            // SAFETY: a signal to the service's process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        ..Default::default()
    };
    let (mut ep, _, _) = Epochs::start_with(pid, cfg, hooks).expect("start epochs");
    for _ in 0..10 {
        ep.next().unwrap();
    }
    // The rest on a thread, so that a hang fails the test instead of blocking it.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if in_pause {
            kill_at.store(11, Ordering::Relaxed);
            let (ck, _) = ep.next().expect("the pause finished before the kill");
            assert_eq!(ck.epoch, 11);
        } else {
            // SAFETY: a signal to the service's process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for call in 0..3 {
            let e = ep.next().expect_err("the service is gone");
            assert_eq!(e.chain(), ChainState::ServiceGone, "call {call}: {e}");
        }
        ep.stop();
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the loop reports the service gone and stops (no hang, no panic)");
    let _ = run.wait_exit(Duration::from_secs(10));
}

#[test]
fn killed_between_epochs_is_reported_gone() {
    killed_service("gone", false);
}

#[test]
fn killed_inside_a_pause_is_reported_gone() {
    killed_service("gonepause", true);
}

/// Measurement, not a check (ignored; timings are never asserted): how long a pause that also
/// takes a full checkpoint is, next to ordinary ones, for the state machine and for
/// `redis-server` holding 100,000 keys. Run with
/// `cargo test --release --test incremental -- --ignored --nocapture full_pause_length`.
#[test]
#[ignore = "measurement: prints pause lengths"]
fn full_pause_length() {
    let report = |what: &str, pid: i32| {
        let cfg = EpochConfig {
            interval: Duration::from_millis(10),
            ..Default::default()
        };
        let (mut ep, full0, st0) = Epochs::start(pid, cfg).expect("start epochs");
        let mut plain = Vec::new();
        let mut with_full = Vec::new();
        for i in 1..=100u64 {
            if i % 20 == 10 {
                ep.request_full();
            }
            let out = ep.next_output(false).unwrap();
            match out.full {
                Some(f) => {
                    with_full.push((out.stats.pause_us, out.stats.full_copy_us, f.data.len()))
                }
                None => plain.push(out.stats.pause_us),
            }
        }
        ep.stop();
        plain.sort_unstable();
        println!(
            "{what}: start (full) pause {} µs, {} KiB; ordinary pauses median {} µs, p90 {} µs; \
             pauses with a full (pause µs, of which full copy µs, full KiB): {:?}",
            st0.pause_us,
            full0.data.len() / 1024,
            plain[plain.len() / 2],
            plain[plain.len() * 9 / 10],
            with_full
                .iter()
                .map(|&(p, c, b)| (p, c, b / 1024))
                .collect::<Vec<_>>()
        );
    };
    let (_scratch, run, _addr) = statemachine_run("fullpause");
    report("statemachine", run.pid);
    run.stop();

    let scratch = Scratch::new("fullpause-redis");
    let name = format!("redis-fp{}", std::process::id() % 100000);
    let shipped =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gramine-manifests/redis.manifest");
    let text = std::fs::read_to_string(shipped)
        .unwrap()
        .replace("name = \"redis\"", &format!("name = \"{name}\""))
        .replace(
            "file:/var/lib/tardi/redis/data",
            &format!("file:{}", scratch.0.join("data").display()),
        );
    let manifest = scratch.0.join("redis.manifest");
    std::fs::write(&manifest, text).unwrap();
    let run = Running::run(&manifest).expect("tardi run redis");
    let addr = SocketAddr::new(run.address.into(), 6379);
    let mut input = Vec::new();
    for i in 0..100_000 {
        let (k, v) = (
            format!("key:{i}"),
            format!("value-{i}-{}", "x".repeat(i % 37)),
        );
        input.extend_from_slice(
            format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{k}\r\n${}\r\n{v}\r\n",
                k.len(),
                v.len()
            )
            .as_bytes(),
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "redis does not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut child = std::process::Command::new("redis-cli")
        .args(["-h", &addr.ip().to_string(), "-p", "6379", "--pipe"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-cli");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &input).unwrap();
    assert!(child.wait().unwrap().success());
    report("redis, 100,000 keys", run.pid);
    run.stop();
}

/// Descriptors between pauses (the eBPF count of descriptor calls, `tardi_checkpointer::syscount`):
/// a pause after which the process made no such call takes its descriptors from the last one;
/// any call (open, close, dup, a flag change, an epoll registration, a socket that starts
/// listening, a UDP socket connected) makes the next pause read them all again. A UDP socket
/// that a `sendto` bound (no counted call) is not taken from the cache while unbound. Two epoll instances with different
/// registrations (their links are the same). After every step the held epoch's
/// descriptors must equal a full read of the held process, and steps without calls must have
/// reused them (a loop that always reads, or never notices, fails here).
#[test]
fn descriptors_are_read_again_exactly_when_the_process_changed_them() {
    const SCRIPT: &str = r#"
import fcntl, os, select, socket, sys
ep = select.epoll()
ep2 = select.epoll()
fds, socks, pipes = [], [], []
path = "/tmp/tardi-fds-%d" % os.getpid()
out = sys.stdout
out.write("ready\n"); out.flush()
for line in sys.stdin:
    c = line.strip()
    if c == "open":
        fds.append(os.open("/dev/null", os.O_RDONLY))
    elif c == "close":
        os.close(fds.pop())
    elif c == "dup":
        fds.append(os.dup(fds[-1]))
    elif c == "nonblock":
        fl = fcntl.fcntl(fds[-1], fcntl.F_GETFL)
        fcntl.fcntl(fds[-1], fcntl.F_SETFL, fl ^ os.O_NONBLOCK)
    elif c == "epoll":
        r, w = os.pipe()
        fds += [r, w]
        pipes.append((r, w))
        ep.register(r, select.EPOLLIN)
        ep2.register(w, select.EPOLLOUT)
    elif c == "listen":
        s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); socks.append(s)
    elif c == "fill":
        os.write(pipes[-1][1], b"queued")
    elif c == "drain":
        os.read(pipes[-1][0], 100)
    elif c == "file":
        fds.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    elif c == "seek":
        os.lseek(fds[-1], 7, os.SEEK_SET)
    elif c == "chdir":
        os.chdir("/tmp" if os.getcwd() != "/tmp" else "/")
    elif c == "udp":
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); socks.append(u)
    elif c == "sendto":
        # Binds the socket to a port of the kernel's choosing: no counted call.
        socks[-1].sendto(b"x", ("127.0.0.1", 9))
    elif c == "udpconnect":
        socks[-1].connect(("127.0.0.1", 9))
    out.write("k\n"); out.flush()
os.unlink(path)
"#;
    let mut py = Driven::python(SCRIPT);
    let pid = py.pid();
    let mut step = |c: &str| assert_eq!(py.step(c), "k", "the script's answer to {c}");
    let cfg = EpochConfig {
        interval: Duration::from_millis(2),
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(pid, cfg).expect("start epochs");
    let mut image = Image::from_full(&full).expect("the full checkpoint applies");
    let full_read = || {
        tardi_checkpointer::procfs::in_view(pid, |p| {
            tardi_checkpointer::fds::capture(p, None, false)
        })
        .unwrap()
        .unwrap()
    };
    let (mut reused, mut read) = (0, 0);
    // `fill`, `drain` (a pipe's contents) and `seek` (a file's offset) make no counted call:
    // the descriptors are reused, and those parts must be read all the same.
    let script = [
        "nop",
        "open",
        "nop",
        "dup",
        "nop",
        "nonblock",
        "nop",
        "epoll",
        "nop",
        "fill",
        "nop",
        "drain",
        "nop",
        "listen",
        "nop",
        "file",
        "nop",
        "seek",
        "nop",
        "chdir",
        "nop",
        "close",
        "nop",
        "nonblock",
        "nop",
        "chdir",
        "nop",
        "udp",
        "nop",
        "sendto",
        "nop",
        "udpconnect",
        "nop",
    ];
    let counted = |c: &str| !matches!(c, "nop" | "fill" | "drain" | "seek" | "sendto");
    for (i, c) in script.iter().enumerate() {
        step(c);
        // Two pauses per step: the first sees the step's calls (if any), the second none.
        for k in 0..2 {
            let (ck, st) = ep
                .next_held()
                .unwrap_or_else(|e| panic!("step {i} ({c}): {e}"));
            let want = full_read();
            // Descriptors equal to the last checkpoint's are left out of this one, others sent.
            assert_eq!(
                ck.image.carried.fds,
                format!("{:?}", image.meta.fds) == format!("{want:?}"),
                "step {i} ({c}), pause {k}: descriptors carried over"
            );
            image
                .apply(&ck)
                .expect("each checkpoint applies to the last");
            // The working directory is kept with the descriptors (chdir is a counted call).
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap();
            assert_eq!(
                std::path::Path::new(&image.meta.cwd),
                cwd,
                "step {i} ({c}), pause {k}: working directory"
            );
            assert_eq!(
                format!("{:?}", image.meta.fds),
                format!("{want:?}"),
                "step {i} ({c}), pause {k}: descriptors differ from a full read (reused: {})",
                st.fds_reused
            );
            if k == 0 && counted(c) {
                assert!(!st.fds_reused, "step {i} ({c}): its calls went unnoticed");
            }
            if st.fds_reused {
                reused += 1;
            } else {
                read += 1;
            }
            ep.release();
        }
    }
    ep.stop();
    drop(py);
    assert!(
        reused >= script.len(),
        "too few pauses reused the descriptors ({reused} reused, {read} read): the count is not in effect"
    );
}

/// A service that exits while nobody has reaped it yet stays a zombie, still listed in
/// `/proc/PID/task`, refusing ptrace. The next epoch must report it gone instead of retrying the
/// zombie forever (it used to spin at 100% of a CPU until the zombie was reaped).
#[test]
fn a_zombie_service_is_reported_gone_not_retried_forever() {
    use std::io::{BufRead, Write};
    let mut child = std::process::Command::new("sh")
        .args(["-c", "echo up; read x"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sh");
    let pid = child.id() as i32;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "up\n");
    let cfg = EpochConfig {
        interval: Duration::from_millis(500),
        cap_pages: 0,
        ..Default::default()
    };
    let (mut ep, _, _) = Epochs::start(pid, cfg).expect("start epochs");
    // The epoch starts; during its wait the service exits, and we do not reap it: a zombie.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = ep.next().map(|_| ()).map_err(|e| e.chain());
        let _ = tx.send(r);
        drop(ep);
    });
    std::thread::sleep(Duration::from_millis(100));
    child.stdin.take().unwrap().write_all(b"x\n").unwrap();
    let r = rx.recv_timeout(Duration::from_secs(20));
    let _ = child.wait();
    assert_eq!(
        r.expect("the epoch after the service exited hung"),
        Err(ChainState::ServiceGone)
    );
}

/// The pre-copy runs before a pause exactly when the epoch before wrote at least
/// `precopy_min_pages` pages (the first epoch always pre-copies: nothing predicts it). A
/// dirtier writing ~20 pages per epoch, under a threshold above that and one below it.
#[test]
fn precopy_runs_only_after_an_epoch_that_wrote_enough_pages() {
    let bin = programs::build("dirtier");
    for min in [256, 8] {
        let port = (20000 + (std::process::id() % 20000) as u16 + min as u16).to_string();
        let child =
            programs::Spawned::new(&bin, &["--port", &port, "--mb", "8", "--rate-mbps", "8"]);
        std::thread::sleep(Duration::from_millis(200)); // its region touched
        let cfg = EpochConfig {
            interval: Duration::from_millis(10),
            precopy_min_pages: min,
            ..Default::default()
        };
        let (mut ep, _full, _) = Epochs::start(child.pid(), cfg).expect("start epochs");
        let mut prev: Option<u64> = None;
        let (mut ran, mut skipped) = (0, 0);
        for i in 0..40 {
            let (_, st) = ep.next().unwrap_or_else(|e| panic!("epoch {i}: {e}"));
            // The first incremental's prediction is the full checkpoint's pause: none.
            if let Some(p) = prev {
                assert_eq!(
                    st.precopy_ran,
                    p >= min,
                    "epoch {}: the epoch before wrote {p} pages, threshold {min}",
                    st.epoch
                );
                if st.precopy_ran {
                    ran += 1;
                } else {
                    skipped += 1;
                }
            }
            prev = Some(st.dirty_pages);
        }
        ep.stop();
        drop(child);
        // ~20 pages an epoch: the high threshold skips (almost) every pre-copy, the low one
        // runs (almost) every one.
        if min == 256 {
            assert!(
                skipped > 30,
                "threshold {min}: {skipped} skipped, {ran} ran"
            );
        } else {
            assert!(ran > 30, "threshold {min}: {ran} ran, {skipped} skipped");
        }
    }
}

/// Writes to pages the pre-copy has taken but not yet copied, and to pages it has copied, all
/// while the service runs before the pause (the copy taken out of the pause): the pause must
/// find each such page written again and copy it itself, or the checkpoint would hold the
/// pre-copy's bytes of a moment before the boundary. A dirtier walks a 1 MiB region (256 pages)
/// at 100 MB/s, a lap every ~10 ms, writing each page's lap number; the pre-copy stalls 3 ms
/// after taking the pages and 3 ms after copying them (~150 pages written meanwhile), and every
/// few epochs the image is compared with the stopped process byte for byte.
#[test]
fn pages_written_while_the_precopy_copies_them_reach_the_checkpoint() {
    let bin = programs::build("dirtier");
    let port = (20000 + (std::process::id() % 20000) as u16 + 311).to_string();
    let child = programs::Spawned::new(&bin, &["--port", &port, "--mb", "1", "--rate-mbps", "100"]);
    std::thread::sleep(Duration::from_millis(200)); // its region touched
    let pid = child.pid();
    let cfg = EpochConfig {
        interval: Duration::from_millis(10),
        precopy_min_pages: 0,
        precopy_stall: Duration::from_millis(6),
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(pid, cfg).expect("start epochs");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    let (mut copied, mut rewritten, mut checks) = (0, 0, 0);
    for i in 1..=30 {
        let held = i % 5 == 0;
        let out = ep
            .next_output(held)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        image.apply(&roundtrip(&out.incremental)).unwrap();
        copied += out.stats.precopy_pages;
        rewritten += out.stats.precopy_rewritten;
        if held {
            let diffs = compare_live(pid, &image, 20).unwrap();
            assert!(
                diffs.is_empty(),
                "epoch {i}: the image differs from the live process:\n{}",
                diffs.join("\n")
            );
            checks += 1;
            ep.release();
        }
    }
    ep.stop();
    drop(child);
    assert_eq!(checks, 6);
    eprintln!("{rewritten} of {copied} pre-copied pages written again before their pause");
    // The race happened: many pre-copied pages were written again before their pause, and
    // many were not (kept from the pre-copy), so both ways into the checkpoint were taken.
    assert!(
        rewritten > copied / 10 && rewritten < copied,
        "{rewritten} of {copied} pre-copied pages written again before the pause"
    );
}

/// The main thread's stack grows with no system call (the kernel extends `[stack]` on a fault
/// below it), and pages of a private file mapping are copied on write, while the loop carries
/// the layout and the copied-on-write list between pauses (no layout call was counted): the
/// grown pages, the new copies and their bytes are in the chain, and the periodic full read
/// finds nothing the count missed.
#[test]
fn a_stack_grown_without_a_call_is_captured_while_the_layout_is_carried() {
    let mut prog = Commanded::spawn("stackgrow", &[] as &[&str]);
    let pid = prog.pid();
    let mut step = |c: u8| prog.step(c);
    step(b'w'); // past start-up: its loader's calls are done
    let cfg = EpochConfig {
        interval: Duration::from_millis(2),
        // A full read (the check of the carrying) every 5 pauses.
        refresh_every: 5,
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(pid, cfg).expect("start epochs");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    let (mut carried, mut missed) = (0, 0);
    for i in 0..16 {
        step([b'g', b'f', b'w'][i % 3]);
        let (ck, st) = ep.next().unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        image.apply(&roundtrip(&ck)).unwrap();
        carried += st.layout_carried as u32;
        missed = st.layout_missed;
    }
    step(b'g');
    let (ck, st) = ep.next_held().expect("the last epoch");
    image.apply(&roundtrip(&ck)).unwrap();
    carried += st.layout_carried as u32;
    let diffs = compare_live(pid, &image, 20).unwrap();
    ep.release();
    ep.stop();
    assert!(
        diffs.is_empty(),
        "the image differs from the live process:\n{}",
        diffs.join("\n")
    );
    // Most pauses carried the layout (else this tests nothing); none missed a change.
    assert!(
        carried >= 8,
        "only {carried} of 17 pauses carried the layout"
    );
    assert_eq!(
        missed, 0,
        "full reads found layout changes no call was counted for"
    );
}
