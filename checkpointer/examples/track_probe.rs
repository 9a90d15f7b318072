//! Development probe: runs a few epochs on PID and prints which pages each reports.
use std::time::Duration;
use tardi_checkpointer::epoch::{EpochConfig, Epochs};
fn main() {
    let pid: i32 = std::env::args().nth(1).unwrap().parse().unwrap();
    let cfg = EpochConfig {
        interval: Duration::from_millis(20),
        hot_epochs: 0,
        ..Default::default()
    };
    let (mut ep, full, st) = Epochs::start(pid, cfg).unwrap();
    println!(
        "full: {} runs, {} bytes, {:?}",
        full.image.runs.len(),
        full.data.len(),
        st.pause_us
    );
    for _ in 0..4 {
        let (ck, st) = ep.next().unwrap();
        let addrs: Vec<String> = ck
            .image
            .pages
            .iter()
            .map(|p| format!("{:x}", p.addr))
            .collect();
        println!(
            "epoch {}: dirty {} fresh {} reset {:x?} pages {:?}",
            ck.epoch, st.dirty_pages, st.fresh_pages, ck.image.reset, addrs
        );
    }
}
