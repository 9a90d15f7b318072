//! Property tests of everything a receiver decodes. Real-shaped checkpoint chains (see
//! `common/chain.rs`) are applied and checked against a model, then mutated — on the wire,
//! behind a correct checksum, and as decoded structures — and fed to
//! [`Checkpoint::from_bytes`], [`Image::apply`] and [`Image::to_full`]; page encodings of every
//! codec are mutated and fed to [`PageCodec::decode_page`]. The property: no panic, no hang, no
//! huge allocation; an error, with nothing applied, or an image that still turns into a valid
//! full checkpoint.
//!
//! The randomised tests run for `TARDI_FUZZ_SECS` seconds each (default 20; the two run in
//! parallel). A run prints its seed; a failure names the round's seed and saves the input under
//! the target's tmp dir. Longer runs and reproduction:
//! ```text
//! TARDI_FUZZ_SECS=3600 cargo test --release -p tardi-image --test mutate -- --nocapture
//! TARDI_FUZZ_SEED=<seed> cargo test -p tardi-image --test mutate
//! ```
//! (A release build runs many more cases but does not check arithmetic overflow; the default
//! debug build does.)

mod common;

use common::chain;
use common::mutate;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeSet;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tardi_image::delta::{Codec, DeltaError, PAGE_SIZE, PageCodec, PageEncoding};
use tardi_image::image::*;
use tardi_image::store::{ApplyError, Image};

// ---- allocation accounting ------------------------------------------------------------------

/// No single allocation above this: a length field trusted somewhere would ask for more.
const MAX_ALLOC: usize = 256 << 20;
/// No case may hold more than this above what it started with.
const MAX_CASE_GROWTH: usize = 512 << 20;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes, refusing (the process then aborts with the size
/// in its message) any single request above [`MAX_ALLOC`].
struct Counting;

impl Counting {
    fn grew(&self, n: usize) {
        let now = LIVE.fetch_add(n, Ordering::Relaxed) + n;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }

    fn refuse(&self, size: usize) {
        // No allocation here: a fixed message and the size in decimal on a stack buffer.
        let mut buf = [0u8; 96];
        let msg = b"mutate: refused an allocation of ";
        buf[..msg.len()].copy_from_slice(msg);
        let mut digits = [0u8; 20];
        let (mut n, mut k) = (size, 0);
        loop {
            digits[k] = b'0' + (n % 10) as u8;
            k += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let mut at = msg.len();
        for d in digits[..k].iter().rev() {
            buf[at] = *d;
            at += 1;
        }
        buf[at..at + 7].copy_from_slice(b" bytes\n");
        let _ = std::io::stderr().write_all(&buf[..at + 7]);
    }
}

// SAFETY: forwards to `System` with the caller's layout; the counters have no effect on it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOC {
            self.refuse(layout.size());
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            self.grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOC {
            self.refuse(layout.size());
            return std::ptr::null_mut();
        }
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            self.grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > MAX_ALLOC {
            self.refuse(new_size);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `realloc` is `System.realloc`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            self.grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

// ---- harness --------------------------------------------------------------------------------

fn budget() -> Duration {
    let secs = std::env::var("TARDI_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(20.0);
    Duration::from_secs_f64(secs.max(0.0))
}

fn first_seed(salt: u64) -> u64 {
    match std::env::var("TARDI_FUZZ_SEED") {
        Ok(s) => s.parse().expect("TARDI_FUZZ_SEED must be a number"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            (t ^ salt) % 1_000_000_007
        }
    }
}

/// Aborts the process if a test makes no progress for two minutes (a hang: every case takes
/// milliseconds).
struct Watchdog {
    beat: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(what: &'static str) -> Watchdog {
        let beat = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let (b, d) = (beat.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut last, mut since) = (u64::MAX, Instant::now());
            while !d.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let now = b.load(Ordering::Relaxed);
                if now != last {
                    (last, since) = (now, Instant::now());
                } else if since.elapsed() > Duration::from_secs(120) {
                    eprintln!("{what}: no progress for 120 s at case {now}: a hang");
                    std::process::abort();
                }
            }
        });
        Watchdog { beat, done }
    }

    fn beat(&self, case: u64) {
        self.beat.store(case, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// Runs `case` for one input; on a panic, saves `input` and names the seed to reproduce it.
/// Also holds the allocation bound.
fn guarded(what: &str, seed: u64, case: u64, input: &[u8], run: impl FnOnce()) {
    let start = LIVE.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(run));
    let growth = PEAK.load(Ordering::Relaxed).saturating_sub(start);
    let failure = match outcome {
        Err(_) => Some("panicked (message above)".to_string()),
        Ok(()) if growth > MAX_CASE_GROWTH => Some(format!("allocated {growth} bytes")),
        Ok(()) => None,
    };
    if let Some(why) = failure {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let file = dir.join(format!("fuzz-{what}-{seed}-{case}.bin"));
        let _ = std::fs::write(&file, input);
        panic!(
            "{what}: round seed {seed}, case {case} {why}; input saved to {}; reproduce with \
             TARDI_FUZZ_SEED={seed}",
            file.display()
        );
    }
}

// ---- the chain itself -----------------------------------------------------------------------

/// Applies a chain through the wire format and checks every step against the model: pages,
/// private files, sandbox description, and `to_full` reading back the same.
#[test]
fn chains_apply_as_the_model_says() {
    let mut kinds = BTreeSet::new();
    for seed in 0..12 {
        let ch = chain::build(seed, 12);
        let mut img: Option<Image> = None;
        for (i, ck) in ch.cks.iter().enumerate() {
            let ck = Checkpoint::from_bytes(ck.to_bytes()).expect("a valid checkpoint");
            kinds.extend(ck.image.pages.iter().map(|p| chain::kind_of(p.enc)));
            match &mut img {
                None => img = Some(Image::from_full(&ck).unwrap()),
                Some(img) => img
                    .apply(&ck)
                    .unwrap_or_else(|e| panic!("seed {seed} epoch {i}: {e}")),
            }
            let img = img.as_ref().unwrap();
            assert_eq!(img.epoch, i as u64);
            let want = &ch.pages[i];
            assert_eq!(img.pages(), want.len(), "seed {seed} epoch {i}: page count");
            for (&a, page) in want {
                assert!(
                    img.page(a).is_some_and(|p| p[..] == page[..]),
                    "seed {seed} epoch {i}: page {a:#x} differs"
                );
            }
            assert_eq!(img.tree(), &ch.trees[i], "seed {seed} epoch {i}: tree");
            let listed: Vec<ShmId> = img.meta.shm.iter().map(|o| o.id).collect();
            assert_eq!(
                listed,
                ch.shm[i].keys().copied().collect::<Vec<_>>(),
                "seed {seed} epoch {i}: shared memory objects"
            );
            for (id, want) in &ch.shm[i] {
                let got = img.shm_pages(*id).expect("the object is held");
                assert_eq!(got.len(), want.len(), "seed {seed} epoch {i}: {id:?} pages");
                for (off, page) in want {
                    assert!(
                        got.get(off).is_some_and(|p| p[..] == page[..]),
                        "seed {seed} epoch {i}: {id:?} page {off:#x} differs"
                    );
                }
            }
            assert_eq!(img.meta.sandbox, ch.sandboxes[i], "seed {seed} epoch {i}");
            // A backup can restore from here: the full checkpoint reads back the same.
            let full = Checkpoint::from_bytes(img.to_full().to_bytes()).unwrap();
            assert_eq!(full.image.sandbox, ch.sandboxes[i]);
            let again = Image::from_full(&full).unwrap();
            assert_eq!(again.to_full().to_bytes(), img.to_full().to_bytes());
        }
    }
    for k in [
        "zero", "same", "raw", "xdelta3", "xor-zstd", "xor-runs", "zstd",
    ] {
        assert!(kinds.contains(k), "the chains never use {k} pages");
    }
}

/// The sandbox description of the full checkpoint survives incremental ones that carry none,
/// is replaced by one that carries another, and comes back in `to_full`.
#[test]
fn sandbox_description_survives_the_chain() {
    let ch = chain::build(7, 3);
    let mut cks = ch.cks.clone();
    for ck in &mut cks[1..] {
        ck.image.sandbox.clear();
    }
    let mut img = Image::from_full(&cks[0]).unwrap();
    let first = cks[0].image.sandbox.clone();
    assert!(!first.is_empty());
    img.apply(&cks[1]).unwrap();
    img.apply(&cks[2]).unwrap();
    assert_eq!(img.meta.sandbox, first);
    assert_eq!(img.to_full().image.sandbox, first);
    cks[3].image.sandbox = b"{\"name\":\"moved\"}".to_vec();
    img.apply(&cks[3]).unwrap();
    assert_eq!(img.to_full().image.sandbox, b"{\"name\":\"moved\"}");
}

/// A checkpoint refused for any reason leaves the image as it was, even when the failure is
/// found after other pages of it decoded fine.
#[test]
fn refused_checkpoints_change_nothing() {
    let ch = chain::build(3, 4);
    let mut img = Image::from_full(&ch.cks[0]).unwrap();
    img.apply(&ch.cks[1]).unwrap();
    let before = img.to_full().to_bytes();
    let unchanged = |img: &Image| img.epoch == 1 && img.to_full().to_bytes() == before;

    // The last page does not decode; the ones before it do.
    let mut bad = ch.cks[2].clone();
    assert!(bad.image.pages.len() > 1);
    let off = bad.data.len() as u64;
    bad.data.extend_from_slice(&[0xff; 40]);
    bad.image.pages.push(EncodedPage {
        addr: bad.image.pages[0].addr,
        enc: PageEncoding::Delta {
            codec: Codec::XorZstd,
            len: 40,
        },
        data_off: off,
    });
    assert!(matches!(img.apply(&bad), Err(ApplyError::Decode { .. })));
    assert!(
        unchanged(&img),
        "a page that does not decode applied the others"
    );

    // Inconsistent: a page past the data.
    let mut bad = ch.cks[2].clone();
    bad.image.pages[0].data_off = u64::MAX - 1;
    assert!(matches!(img.apply(&bad), Err(ApplyError::Invalid { .. })));
    assert!(unchanged(&img));

    // Out of the receiver's view: another base epoch, or the same checkpoint again.
    assert!(matches!(
        img.apply(&ch.cks[3]),
        Err(ApplyError::OutOfOrder { .. })
    ));
    assert!(matches!(
        img.apply(&ch.cks[1]),
        Err(ApplyError::OutOfOrder { .. })
    ));
    assert!(unchanged(&img));

    // A private file outside the private directories, or a changed set of directories.
    let mut bad = ch.cks[2].clone();
    bad.image.private_files.dirs.clear();
    bad.image.private_files.remove.push("/etc/passwd".into());
    assert!(matches!(img.apply(&bad), Err(ApplyError::Invalid { .. })));
    let mut bad = ch.cks[2].clone();
    bad.image.private_files.dirs = vec!["/elsewhere".into()];
    assert!(matches!(img.apply(&bad), Err(ApplyError::Invalid { .. })));
    assert!(unchanged(&img));

    // And the good one still applies.
    img.apply(&ch.cks[2]).unwrap();
    assert_eq!(img.epoch, 2);
}

// ---- randomised ----------------------------------------------------------------------------

/// Mutated checkpoints, on the wire, behind a correct checksum and as structures.
#[test]
fn mutated_checkpoints_never_panic() {
    let budget = budget();
    let seed0 = first_seed(1);
    eprintln!("mutated_checkpoints_never_panic: TARDI_FUZZ_SEED={seed0}, {budget:?}");
    let dog = Watchdog::start("mutated_checkpoints_never_panic");
    let t0 = Instant::now();
    let (mut cases, mut applied, mut rounds) = (0u64, 0u64, 0u64);
    while rounds == 0 || t0.elapsed() < budget {
        let seed = seed0 + rounds;
        rounds += 1;
        let rng = &mut StdRng::seed_from_u64(seed);
        let ch = chain::build(seed, rng.random_range(2..10));
        // The receiver's image before each checkpoint, as a full checkpoint and its bytes.
        let mut bases: Vec<(Checkpoint, Vec<u8>)> = Vec::new();
        let mut img = Image::from_full(&ch.cks[0]).unwrap();
        for ck in &ch.cks {
            img.apply(ck).unwrap();
            let full = img.to_full();
            let bytes = Image::from_full(&full).unwrap().to_full().to_bytes();
            bases.push((full, bytes));
        }
        let wire: Vec<Vec<u8>> = ch.cks.iter().map(|c| c.to_bytes()).collect();
        for case in 0..200u64 {
            if t0.elapsed() >= budget && case > 0 {
                break;
            }
            dog.beat(cases);
            cases += 1;
            // The full checkpoint (the only one with runs) a third of the time.
            let i = if rng.random_bool(0.3) {
                0
            } else {
                rng.random_range(0..ch.cks.len())
            };
            let (base, before) = &bases[i.saturating_sub(1)];
            let mut input = wire[i].clone();
            let what = rng.random_range(0..10);
            match what {
                0..=2 => {
                    let j = rng.random_range(0..wire.len());
                    mutate::mutate_wire(rng, &mut input, &wire[j]);
                }
                3..=5 => input = mutate::mutate_framed(rng, &input),
                _ => {
                    let mut ck = ch.cks[i].clone();
                    mutate::mutate_struct(rng, &mut ck);
                    if what == 9 {
                        // Another checkpoint of the chain, unchanged: out of view unless it
                        // happens to be the next one.
                        ck = ch.cks[rng.random_range(0..ch.cks.len())].clone();
                    }
                    // Straight to the receiver, as a caller holding a struct would.
                    guarded("struct", seed, case, &ck.to_bytes(), || {
                        applied += mutate::check_apply(base, before, &ck) as u64;
                    });
                    input = ck.to_bytes();
                }
            }
            let via_file = case % 16 == 0;
            guarded("bytes", seed, case, &input, || {
                let read = Checkpoint::from_bytes(input.clone());
                if via_file {
                    // The streaming reader of `tardi restore FILE` agrees with `from_bytes`.
                    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                        .join(format!("mutate-{}.tardi", std::process::id()));
                    std::fs::write(&path, &input).unwrap();
                    let opened = CheckpointFile::open(&path);
                    match (&read, &opened) {
                        (Ok(a), Ok(b)) => assert_eq!((a.epoch, a.kind), (b.epoch, b.kind)),
                        (Err(_), Err(_)) => {}
                        (a, b) => panic!(
                            "from_bytes and CheckpointFile::open disagree: {:?} vs {:?}",
                            a.as_ref().err(),
                            b.as_ref().err()
                        ),
                    }
                }
                if let Ok(ck) = read {
                    applied += mutate::check_apply(base, before, &ck) as u64;
                }
            });
        }
    }
    eprintln!(
        "mutated_checkpoints_never_panic: {rounds} chains, {cases} cases, {applied} applied, {:?}",
        t0.elapsed()
    );
    assert!(
        applied > 0,
        "no mutated checkpoint ever applied: the mutations are too blunt"
    );
}

/// Mutated page encodings of every codec, decoded against the right twin, another one, or
/// none.
#[test]
fn mutated_page_encodings_never_panic() {
    let budget = budget();
    let seed0 = first_seed(2);
    eprintln!("mutated_page_encodings_never_panic: TARDI_FUZZ_SEED={seed0}, {budget:?}");
    let dog = Watchdog::start("mutated_page_encodings_never_panic");
    let t0 = Instant::now();
    let mut pc = PageCodec::new().unwrap();
    let (mut cases, mut rounds, mut decoded) = (0u64, 0u64, 0u64);
    while rounds == 0 || t0.elapsed() < budget {
        let seed = seed0 + rounds;
        rounds += 1;
        let rng = &mut StdRng::seed_from_u64(seed);
        // Pages and twins from a chain: real-shaped contents and changes.
        let ch = chain::build(seed, 3);
        let pages: Vec<&[u8; PAGE_SIZE]> = ch
            .pages
            .iter()
            .flat_map(|m| m.values())
            .map(|p| &**p)
            .collect();
        for case in 0..500u64 {
            if t0.elapsed() >= budget && case > 0 {
                break;
            }
            dog.beat(cases);
            cases += 1;
            let twin = pages[rng.random_range(0..pages.len())];
            let mut page = *pages[rng.random_range(0..pages.len())];
            if rng.random_bool(0.5) {
                page = *twin;
                for _ in 0..rng.random_range(1..20) {
                    page[rng.random_range(0..PAGE_SIZE)] = rng.random();
                }
            }
            let codec = Codec::ALL[rng.random_range(0..4)];
            let with_twin = rng.random_bool(0.8);
            let mut bytes = Vec::new();
            let enc = pc.encode_page(codec, with_twin.then_some(&twin[..]), &page, &mut bytes);
            let mut out = [0u8; PAGE_SIZE];
            // Unmutated, it decodes to the page.
            pc.decode_page(enc, with_twin.then_some(&twin[..]), &bytes, &mut out)
                .unwrap();
            assert!(out == page, "{enc:?} did not round-trip");
            // Mutated bytes, tag, or both.
            let mut enc2 = enc;
            match rng.random_range(0..4) {
                0 => {
                    let n = rng.random_range(1..6);
                    mutate::scramble(rng, &mut bytes, n)
                }
                1 => {
                    let n = rng.random_range(0..=bytes.len());
                    bytes.truncate(n);
                }
                2 => {
                    bytes = vec![0u8; rng.random_range(0..PAGE_SIZE + 2)];
                    rng.fill_bytes(&mut bytes);
                }
                _ => mutate::scramble(rng, &mut bytes, 1),
            }
            if rng.random_bool(0.7) {
                // A tag that agrees with the length, as a checked container would give.
                let len = bytes.len() as u32;
                enc2 = match rng.random_range(0..4) {
                    0 => PageEncoding::Delta {
                        codec: Codec::ALL[rng.random_range(0..4)],
                        len,
                    },
                    1 => PageEncoding::Compressed { len },
                    2 if bytes.len() == PAGE_SIZE => PageEncoding::Raw,
                    _ => match enc {
                        PageEncoding::Delta { codec, .. } => PageEncoding::Delta { codec, len },
                        PageEncoding::Compressed { .. } => PageEncoding::Compressed { len },
                        e => e,
                    },
                };
            }
            let twin2: Option<Vec<u8>> = match rng.random_range(0..5) {
                0 => None,
                1 => Some(page.to_vec()),
                2 => Some(vec![0; rng.random_range(0..PAGE_SIZE + 2)]),
                _ => Some(twin.to_vec()),
            };
            let mut input = bytes.clone();
            input.extend_from_slice(format!("{enc2:?}").as_bytes());
            guarded("page", seed, case, &input, || {
                let r = pc.decode_page(enc2, twin2.as_deref(), &bytes, &mut out);
                match r {
                    Ok(()) => decoded += 1,
                    Err(e) => {
                        assert!(!e.to_string().is_empty());
                        if let DeltaError::Length { expected, got, .. } = e {
                            assert_ne!(expected, got);
                        }
                    }
                }
            });
        }
    }
    eprintln!(
        "mutated_page_encodings_never_panic: {rounds} rounds, {cases} cases, {decoded} decoded \
         despite the mutation, {:?}",
        t0.elapsed()
    );
}
