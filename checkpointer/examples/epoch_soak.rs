//! Soak tool: runs the epoch loop on PID for SECONDS (no checks), to see whether the
//! target survives being tracked (and, with the tracker released, afterwards).
//! Usage: epoch_soak PID [SECONDS] [HOT_EPOCHS] [CAP_PAGES]; `$TRACKER` = uffd | mprotect.
use std::time::{Duration, Instant};
use tardi_checkpointer::epoch::{EpochConfig, Epochs};
fn main() {
    let mut a = std::env::args().skip(1);
    let pid: i32 = a.next().unwrap().parse().unwrap();
    let secs: u64 = a.next().unwrap_or("10".into()).parse().unwrap();
    let hot: u32 = a.next().unwrap_or("3".into()).parse().unwrap();
    let cap: u64 = a.next().unwrap_or("1000".into()).parse().unwrap();
    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        hot_epochs: hot,
        cap_pages: cap,
        tracker: std::env::var("TRACKER")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or_default(),
        ..Default::default()
    };
    let (mut ep, _, _) = Epochs::start(pid, cfg).unwrap();
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < Duration::from_secs(secs) {
        if let Err(e) = ep.next() {
            println!("epoch {n}: {e}");
            return;
        }
        n += 1;
    }
    ep.stop();
    println!("{n} epochs ok, tracking released");
}
