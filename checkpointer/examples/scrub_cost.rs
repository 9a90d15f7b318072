//! What the divergence check costs a pause (`bench/scrub.sh`): Redis (`redis-server`, Debian's)
//! holding `--keys` keys (`DEBUG POPULATE`), under the epoch loop (userfaultfd, 10 ms epochs),
//! with a check of `--pages` pages at *every* pause, and without any, in alternating blocks of
//! 100 epochs (four blocks each). Prints, per setting: the pause's p50/p99, the check's own
//! p50/p99 (inside the pause) and its time per page read. With the default cadence (one check
//! of 256 pages a second) the check's share of a CPU is its time per check over a second.
//!
//! Usage: `cargo run --release -p tardi-checkpointer --example scrub_cost -- [--pages N]
//! [--keys N] [--port P]`. Run as root (ptrace). Reports figures only; asserts nothing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;
use tardi_checkpointer::epoch::{EpochConfig, Epochs};
use tardi_checkpointer::scrub::ScrubConfig;
use tardi_testkit::stats::rounded_rank;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// The value at index round(p·(n−1)) of `v` once sorted; 0 when empty.
fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    rounded_rank(v, p).unwrap_or(0)
}

fn main() {
    let (pages, keys, port) = (
        arg("--pages", 256),
        arg("--keys", 200_000),
        arg("--port", 16391),
    );
    let mut redis = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--enable-debug-command", "yes"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)");
    let mut conn = loop {
        match TcpStream::connect(("127.0.0.1", port as u16)) {
            Ok(c) => break c,
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let cmd = format!("DEBUG POPULATE {keys} key 64\r\n");
    conn.write_all(cmd.as_bytes()).unwrap();
    let mut b = [0u8; 64];
    let n = conn.read(&mut b).unwrap();
    assert!(b[..n].starts_with(b"+OK"), "{:?}", &b[..n]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", redis.id())).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or("")
        .to_string();
    println!("redis-server with {keys} keys: {rss}; a check of {pages} pages");

    let cfg = |scrub: bool| EpochConfig {
        interval: Duration::from_millis(10),
        scrub: scrub.then_some(ScrubConfig {
            every: Duration::ZERO,
            pages: pages as usize,
        }),
        ..Default::default()
    };
    let (mut with_pause, mut without_pause, mut check, mut read) = (vec![], vec![], vec![], vec![]);
    for block in 0..8 {
        let scrub = block % 2 == 0;
        let (mut ep, _, _) = Epochs::start(redis.id() as i32, cfg(scrub)).expect("epochs");
        for _ in 0..100 {
            let out = ep.next_output(false).expect("epoch");
            let s = &out.stats;
            if scrub {
                with_pause.push(s.pause_us);
                check.push(s.scrub_us);
                read.push(s.scrub_pages);
            } else {
                without_pause.push(s.pause_us);
            }
        }
        ep.stop();
    }
    let mean_pages = read.iter().sum::<u64>() as f64 / read.len().max(1) as f64;
    let (c50, c99) = (pct(&mut check, 0.5), pct(&mut check, 0.99));
    println!(
        "| setting | pause p50 µs | pause p99 µs | check p50 µs | check p99 µs | pages per check |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| no check | {} | {} | - | - | - |",
        pct(&mut without_pause, 0.5),
        pct(&mut without_pause, 0.99)
    );
    println!(
        "| a check at every pause | {} | {} | {c50} | {c99} | {mean_pages:.0} |",
        pct(&mut with_pause, 0.5),
        pct(&mut with_pause, 0.99)
    );
    println!(
        "per page checked: {:.2} µs (p50); at one check a second: {:.3}% of a CPU",
        c50 as f64 / mean_pages.max(1.0),
        c50 as f64 / 1e4
    );
    let _ = redis.kill();
    let _ = redis.wait();
}
