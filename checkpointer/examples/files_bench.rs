//! Cost of walking a private directory inside the pause (`files::DirTracker::changes`), for a
//! tree of N files: with nothing changed, and with one file of each size rewritten.
//!
//! `cargo run --release -p tardi-checkpointer --example files_bench -- [DIR]` (default: a
//! scratch directory under /tmp). Prints a markdown table.

use std::time::Instant;
use tardi_checkpointer::files::DirTracker;
use tardi_testkit::stats::{rounded_rank, sorted};

fn main() {
    let base = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("/tmp/tardi-files-bench-{}", std::process::id()));
    println!("| files in tree | changed | walk µs median (p10–p90 of 50) |");
    println!("|---:|---|---:|");
    for &n in &[10usize, 100, 1000, 10_000] {
        let root = std::path::Path::new(&base).join(format!("n{n}"));
        let _ = std::fs::remove_dir_all(&root);
        for i in 0..n {
            let d = root.join(format!("d{}", i / 100));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(format!("f{i}")), [i as u8; 512]).unwrap();
        }
        let mut t = DirTracker::new(vec![root.to_string_lossy().into_owned()]);
        t.changes().unwrap();
        for (label, size) in [
            ("nothing", 0usize),
            ("one 4 KiB file", 4096),
            ("one 1 MiB file", 1 << 20),
        ] {
            let mut times = Vec::new();
            for k in 0..50 {
                if size > 0 {
                    std::fs::write(root.join("d0/f0"), vec![k as u8; size + k]).unwrap();
                }
                let t0 = Instant::now();
                let ch = t.changes().unwrap();
                times.push(t0.elapsed().as_secs_f64() * 1e6);
                assert_eq!(ch.upsert.is_empty(), size == 0, "{label}: {ch:?}");
            }
            let s = sorted(times);
            let q = |p: f64| rounded_rank(&s, p).expect("50 samples");
            println!(
                "| {n} | {label} | {:.0} ({:.0}–{:.0}) |",
                q(0.5),
                q(0.1),
                q(0.9)
            );
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
    let _ = std::fs::remove_dir_all(&base);
}
