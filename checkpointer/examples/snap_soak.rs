//! Soak tool: full checkpoints of PID in a loop for SECONDS (stop, inject, copy, resume;
//! no write tracking), to see whether the target survives.
use std::time::{Duration, Instant};
fn main() {
    let mut a = std::env::args().skip(1);
    let pid: i32 = a.next().unwrap().parse().unwrap();
    let secs: u64 = a.next().unwrap_or("10".into()).parse().unwrap();
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < Duration::from_secs(secs) {
        if let Err(e) = tardi_checkpointer::checkpoint(pid, n, &[]) {
            println!("checkpoint {n}: {e}");
            return;
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("{n} checkpoints ok");
}
