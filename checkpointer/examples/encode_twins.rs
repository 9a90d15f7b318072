//! What the encoding of an epoch's pages costs when their twins are cold, and what updating
//! each twin right after its page's encoding saves against a second pass (the epoch loop's
//! single-encoder path, `TwinUse::Update` in `src/epoch.rs`).
//!
//! A twin store of `TWINS` pages (16 MiB by default, Redis under SET load keeps ~4,000) and an
//! epoch of 1,000 of them, in two versions that differ in three bytes per page on 60% of the
//! pages (the rest are written but unchanged, as ~40% of Redis's are). Each round evicts the
//! caches (a 128 MiB walk), then encodes the epoch's pages against their twins with
//! `xor-runs` and updates the twins of the pages that changed, either in a second pass over
//! the list (`separate`, the loop before) or right after each page (`fused`). The rounds
//! alternate the two versions, so every round has the same work. Prints the median and p10
//! of 60 rounds per mode, modes alternated.
//!
//! `WARM=pages`, `WARM=twins` or `WARM=both` reads the epoch's pages, their twins or both
//! after the eviction and before the clock starts, to show which cold reads the encoding
//! waits for. The first two rounds also time one cold read of the pages (contiguous) and of
//! their twins (one slot of the twin store's huge-page arena each, in list order): `probe` lines.
//!
//! Usage: `encode_twins [ROUNDS]` (default 60). Pure computation: no process is touched.

use std::time::Instant;
use tardi_image::delta::{Codec, PAGE_SIZE, PageCodec, PageEncoding, TwinStore};
use tardi_testkit::stats::floor_rank;

const TWINS: usize = 4000;
const PAGES: usize = 1000;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(60);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let addr = |i: usize| 0x1000_0000 + i as u64 * 3 * PAGE_SIZE as u64;
    let mut twins = TwinStore::new(64 << 20);
    let mut page = vec![0u8; PAGE_SIZE];
    for i in 0..TWINS {
        page.iter_mut().for_each(|b| *b = (next() % 7) as u8);
        twins.put(addr(i), 0, &page);
    }
    let mut list: Vec<u64> = Vec::with_capacity(PAGES);
    while list.len() < PAGES {
        let a = addr(next() as usize % TWINS);
        if !list.contains(&a) {
            list.push(a);
        }
    }
    let mut versions = [vec![0u8; PAGES * PAGE_SIZE], vec![0u8; PAGES * PAGE_SIZE]];
    for (k, &a) in list.iter().enumerate() {
        let at = k * PAGE_SIZE;
        let twin = twins.get(a).expect("twin put above").to_vec();
        for v in &mut versions {
            v[at..at + PAGE_SIZE].copy_from_slice(&twin);
        }
        if k % 5 >= 2 {
            for _ in 0..3 {
                versions[1][at + next() as usize % PAGE_SIZE] ^= 0x5a;
            }
        }
    }
    let mut junk = vec![0u8; 128 << 20];
    // Evicts the caches: one write to every line of 128 MiB.
    let mut evict = move || {
        for i in (0..junk.len()).step_by(64) {
            junk[i] = junk[i].wrapping_add(1);
        }
    };
    let mut codec = PageCodec::new().expect("zstd context");
    let mut times: [Vec<u128>; 2] = [Vec::new(), Vec::new()];
    let warm = std::env::var("WARM").unwrap_or_default();
    // One read of every cache line of the pages, or of their twins; the time it took.
    let touch = |what: &str, data: &[u8], twins: &TwinStore| {
        let t = Instant::now();
        let mut x = 0u8;
        if what == "pages" {
            for i in (0..data.len()).step_by(64) {
                x ^= data[i];
            }
        } else {
            for &a in &list {
                let twin = twins.get(a).expect("twin put above");
                for i in (0..PAGE_SIZE).step_by(64) {
                    x ^= twin[i];
                }
            }
        }
        std::hint::black_box(x);
        t.elapsed().as_micros()
    };
    for round in 0..2 * rounds {
        let fused = round % 2 == 1;
        let data = &versions[(round / 2) % 2];
        evict();
        if round < 2 {
            let what = ["pages", "twins"][round];
            let us = touch(what, data, &twins);
            println!("   probe: one cold read of the {PAGES} {what}: {us} µs");
            evict();
        }
        for what in ["pages", "twins"] {
            if warm == what || warm == "both" {
                touch(what, data, &twins);
            }
        }
        let t = Instant::now();
        let mut out = Vec::with_capacity(1 << 20);
        let mut encs = Vec::with_capacity(PAGES);
        for (k, &a) in list.iter().enumerate() {
            let p = &data[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
            let enc = codec.encode_page(Codec::XorRuns, twins.get(a), p, &mut out);
            if fused && enc != PageEncoding::Same {
                twins.put(a, round as u64 + 1, p);
            }
            encs.push(enc);
        }
        if !fused {
            for (k, &a) in list.iter().enumerate() {
                if encs[k] != PageEncoding::Same {
                    twins.put(
                        a,
                        round as u64 + 1,
                        &data[k * PAGE_SIZE..(k + 1) * PAGE_SIZE],
                    );
                }
            }
        }
        times[usize::from(fused)].push(t.elapsed().as_micros());
        std::hint::black_box(&out);
    }
    for (name, mut t) in ["separate", "fused"].into_iter().zip(times) {
        t.sort_unstable();
        println!(
            "{name:>8}: {PAGES} pages, encode + twin update p50 {} µs (p10 {}) = {:.2} µs a page",
            floor_rank(&t, 0.5).unwrap_or(0),
            floor_rank(&t, 0.1).unwrap_or(0),
            floor_rank(&t, 0.5).unwrap_or(0) as f64 / PAGES as f64
        );
    }
}
