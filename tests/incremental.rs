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
    if std::env::var_os("TARDI_TEST_DEBUG").is_some() {
        let bytes: u64 = full.image.runs.iter().map(|r| r.len).sum();
        eprintln!(
            "full: {} runs, {bytes} bytes in runs, {} data, image pages {}",
            full.image.runs.len(),
            full.data.len(),
            image.pages()
        );
    }
    let mut total_dirty = 0;
    for i in 1..=epochs {
        let held = i % check_every == 0 || i == epochs;
        let (ck, st) = if held { ep.next_held() } else { ep.next() }
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        total_dirty += st.dirty_pages + st.fresh_pages;
        if std::env::var_os("TARDI_TEST_DEBUG").is_some() && i <= 3 {
            eprintln!(
                "epoch {i}: {st:?} reset={:x?} pages={}",
                ck.image.reset,
                ck.image.pages.len()
            );
        }
        assert_eq!(ck.epoch, i);
        let rt = roundtrip(&ck);
        if std::env::var_os("TARDI_TEST_DEBUG").is_some() && i <= 2 {
            eprintln!(
                "epoch {i}: orig vmas {} reset {:x?} | rt vmas {} reset {:x?} base {:?} kind {:?}",
                ck.image.vmas.len(),
                ck.image.reset,
                rt.image.vmas.len(),
                rt.image.reset,
                rt.image.base_epoch,
                rt.kind
            );
            let v: Vec<_> = rt
                .image
                .vmas
                .iter()
                .take(3)
                .map(|v| (v.start, v.end, v.backing))
                .collect();
            eprintln!("  first vmas {v:x?}");
        }
        image
            .apply(&rt)
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        if std::env::var_os("TARDI_TEST_DEBUG").is_some() && i <= 2 {
            eprintln!(
                "after epoch {i}: image pages {}, vmas {}",
                image.pages(),
                image.meta.vmas.len()
            );
        }
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
fn statemachine_chain_uffd_hot_pages() {
    statemachine_chain(
        "hot",
        EpochConfig {
            interval: Duration::from_millis(5),
            ..Default::default()
        },
    );
}

#[test]
fn statemachine_chain_uffd_no_hot_pages_no_twins() {
    statemachine_chain(
        "cold",
        EpochConfig {
            interval: Duration::from_millis(5),
            hot_epochs: 0,
            twin_budget: 0,
            ..Default::default()
        },
    );
}
