//! What carrying TCP connections costs the pause (issue 28): the epoch loop on a redis-server
//! (outside a sandbox, loopback) with 0, 50, 500 and 5,000 client connections, idle or busy,
//! reporting per case the pause and the part of it spent reading the connections
//! (`EpochStats::tcp_us`), median and 99th percentile, and how many connections each pause
//! carried. Busy: every connection has a PING in flight most of the time (a few client threads
//! send on each connection in turn and read the replies).
//!
//! Usage: tcp_pause [--conns 0,50,500,5000] [--epochs 300] [--port 16391]
//!                  [--redis-server PATH]
//! Run by `bench/tcp_pause.sh`. Reports figures only.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tardi_checkpointer::epoch::{EpochConfig, Epochs};
use tardi_testkit::stats::{nearest_rank, sorted};

struct Redis(std::process::Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: cannot parse {v:?}"))
        })
        .unwrap_or(default)
}

fn start_redis(bin: &str, port: u16) -> Redis {
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--maxclients", "10000"])
        .args(["--daemonize", "no", "--logfile", ""])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawning redis-server");
    let r = Redis(child);
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "redis-server does not answer on port {port}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    r
}

/// `n` connections, each answered once (so redis has accepted and registered it).
fn connect(port: u16, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.write_all(b"PING\r\n").unwrap();
            let mut b = [0u8; 7];
            s.read_exact(&mut b).unwrap();
            s
        })
        .collect()
}

/// Keeps a PING in flight on every connection until `stop`: `threads` threads, each over its
/// share of the connections, sends one on each and reads the replies.
fn busy(
    conns: Vec<TcpStream>,
    stop: Arc<AtomicBool>,
    threads: usize,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut shares: Vec<Vec<TcpStream>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, c) in conns.into_iter().enumerate() {
        shares[i % threads].push(c);
    }
    shares
        .into_iter()
        .map(|mut share| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut b = [0u8; 7];
                while !stop.load(Ordering::Relaxed) {
                    for c in &mut share {
                        if c.write_all(b"PING\r\n").is_err() {
                            return;
                        }
                    }
                    for c in &mut share {
                        if c.read_exact(&mut b).is_err() {
                            return;
                        }
                    }
                }
            })
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let counts: String = arg(&args, "--conns", "0,50,500,5000".to_string());
    let epochs: usize = arg(&args, "--epochs", 300);
    let port: u16 = arg(&args, "--port", 16391);
    let bin: String = arg(&args, "--redis-server", "redis-server".to_string());
    println!(
        "| connections | load | pauses | pause p50 (µs) | pause p99 (µs) | reading connections p50 (µs) | p99 (µs) | per connection p50 (µs) | carried | read whole per pause |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut case = 0u16;
    for n in counts
        .split(',')
        .map(|c| c.trim().parse::<usize>().expect("--conns"))
    {
        for load in ["idle", "busy"] {
            if n == 0 && load == "busy" {
                continue;
            }
            // A port of its own per case: the last case's thousands of closed connections
            // linger on theirs.
            let port = port + case;
            case += 1;
            let redis = start_redis(&bin, port);
            let conns = connect(port, n);
            let stop = Arc::new(AtomicBool::new(false));
            let (held, workers) = if load == "busy" {
                (Vec::new(), busy(conns, stop.clone(), 4))
            } else {
                (conns, Vec::new())
            };
            let pid = redis.0.id() as i32;
            let (mut ep, _full, _) = Epochs::start(pid, EpochConfig::default()).expect("start");
            for _ in 0..20 {
                ep.next().expect("warm-up epoch");
            }
            let (mut pause, mut tcp, mut carried, mut read) = (Vec::new(), Vec::new(), 0u64, 0u64);
            for _ in 0..epochs {
                let (_ck, st) = ep.next().expect("epoch");
                pause.push(st.pause_us as f64);
                tcp.push(st.tcp_us as f64);
                carried = carried.max(st.tcp_conns);
                read += st.tcp_read;
            }
            ep.stop();
            stop.store(true, Ordering::Relaxed);
            drop(held);
            drop(redis);
            for w in workers {
                let _ = w.join();
            }
            let (pause, tcp) = (sorted(pause), sorted(tcp));
            let q = |v: &[f64], p| nearest_rank(v, p).unwrap_or(f64::NAN);
            let per = if n > 0 { q(&tcp, 0.5) / n as f64 } else { 0.0 };
            let read = read as f64 / pause.len().max(1) as f64;
            println!(
                "| {n} | {load} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {per:.2} | {carried} | {read:.1} |",
                pause.len(),
                q(&pause, 0.5),
                q(&pause, 0.99),
                q(&tcp, 0.5),
                q(&tcp, 0.99),
            );
        }
    }
}
