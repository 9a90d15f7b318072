//! Figures for docs/BENCHMARKS.md (ignored by default; they print, they do not judge):
//!
//! ```text
//! cargo test --release -p tardi-netfilter --test bench -- --ignored --nocapture --test-threads=1
//! ```

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use tardi_netfilter::{Gate, GateConfig, Mode};

fn gate(t: &Topo, mode: Mode) -> Gate {
    let mut cfg = GateConfig::new(HOST_IF, 10);
    cfg.mode = mode;
    t.machine.run(|| Gate::new(cfg).expect("Gate::new"))
}

/// Counts datagrams arriving on `rx` until `stop`.
fn count_udp(rx: &UdpSocket, stop: &AtomicBool, count: &AtomicU64) {
    rx.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        if rx.recv_from(&mut buf).is_ok() {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
#[ignore]
fn release_cost_per_packet() {
    let t = Topo::new("bcost");
    let g = gate(&t, Mode::Hold);
    let tx = t.sandbox_udp();
    let rx = t.client_udp(9000);
    set_rcvbuf(&rx, 256 << 20);
    let (stop, count) = (AtomicBool::new(false), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| count_udp(&rx, &stop, &count));
        println!("batch  release_us  us/packet  delivered");
        let mut epoch = 0;
        for n in [1u32, 10, 100, 1000, 2500, 10000, 30000] {
            for _ in 0..3 {
                let before = count.load(Ordering::Relaxed);
                send_seq(&tx, (CLIENT_ADDR, 9000), 0..n);
                assert!(wait_until(Duration::from_secs(10), || g
                    .stats()
                    .held_packets
                    >= u64::from(n)));
                epoch += 1;
                g.mark(epoch);
                let t0 = Instant::now();
                g.release(epoch).unwrap();
                let dt = t0.elapsed();
                wait_until(Duration::from_secs(5), || {
                    count.load(Ordering::Relaxed) >= before + u64::from(n)
                });
                println!(
                    "{n:>6}  {:>10.1}  {:>9.3}  {}",
                    dt.as_secs_f64() * 1e6,
                    dt.as_secs_f64() * 1e6 / f64::from(n),
                    count.load(Ordering::Relaxed) - before
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    println!("stats: {:?}", g.stats());
}

/// UDP packets/s from sandbox to client for `dur`, with an epoch thread that marks and
/// releases every `epoch` (Hold) or nothing (Pass).
fn udp_rate(mode: Mode, epoch: Duration, size: usize, dur: Duration) {
    let t = Topo::new(&format!("budp{size}"));
    let g = gate(&t, mode);
    let tx = t.sandbox_udp();
    let rx = t.client_udp(9000);
    set_rcvbuf(&rx, 64 << 20);
    let (stop, count, sent) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let (releases, release_time) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| count_udp(&rx, &stop, &count));
        s.spawn(|| {
            let payload = vec![0u8; size];
            while !stop.load(Ordering::Relaxed) {
                if tx.send_to(&payload, (CLIENT_ADDR, 9000)).is_ok() {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        if mode == Mode::Hold {
            s.spawn(|| {
                let mut e = 0;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(epoch);
                    e += 1;
                    g.mark(e);
                    let t0 = Instant::now();
                    g.release(e).unwrap();
                    release_time.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    releases.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(300)); // warm up
        let (c0, s0, t0) = (
            count.load(Ordering::Relaxed),
            sent.load(Ordering::Relaxed),
            Instant::now(),
        );
        let (r0, rt0) = (
            releases.load(Ordering::Relaxed),
            release_time.load(Ordering::Relaxed),
        );
        std::thread::sleep(dur);
        let secs = t0.elapsed().as_secs_f64();
        let got = count.load(Ordering::Relaxed) - c0;
        let offered = sent.load(Ordering::Relaxed) - s0;
        let rel = releases.load(Ordering::Relaxed) - r0;
        let rel_ns = release_time.load(Ordering::Relaxed) - rt0;
        stop.store(true, Ordering::Relaxed);
        let st = g.stats();
        print!(
            "{mode:?} {size:>5} B: sent {:>7.0}/s delivered {:>7.0}/s ({:.1} MB/s)",
            offered as f64 / secs,
            got as f64 / secs,
            got as f64 * size as f64 / secs / 1e6,
        );
        if rel > 0 {
            print!(
                ", {} releases, {:.0} packets/release, {:.0} us/release, kernel drops {}",
                rel,
                st.released_packets as f64 / releases.load(Ordering::Relaxed) as f64,
                rel_ns as f64 / rel as f64 / 1e3,
                st.kernel_dropped
            );
        }
        println!();
    });
}

#[test]
#[ignore]
fn udp_throughput_held_every_10ms() {
    let dur = Duration::from_secs(3);
    for size in [64, 1400] {
        udp_rate(Mode::Pass, Duration::ZERO, size, dur);
        udp_rate(Mode::Hold, Duration::from_millis(10), size, dur);
        udp_rate(Mode::Hold, Duration::from_millis(2), size, dur);
    }
}

/// TCP MB/s from sandbox to client, epochs of `epoch` (Hold) or none (Pass).
fn tcp_rate(mode: Mode, epoch: Duration, dur: Duration) {
    let t = Topo::new("btcp");
    let g = gate(&t, mode);
    let listener = t
        .client
        .run(|| TcpListener::bind((CLIENT_ADDR, 9100)).unwrap());
    let (stop, count) = (AtomicBool::new(false), AtomicU64::new(0));
    std::thread::scope(|s| {
        // Epochs first: in Hold mode even the SYN waits for a release.
        if mode == Mode::Hold {
            s.spawn(|| {
                let mut e = 0;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(epoch);
                    e += 1;
                    g.mark(e);
                    g.release(e).unwrap();
                }
            });
        }
        let stream = t
            .sandbox
            .run(|| TcpStream::connect((CLIENT_ADDR, 9100)).unwrap());
        s.spawn(|| {
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let mut buf = vec![0u8; 1 << 16];
            while !stop.load(Ordering::Relaxed) {
                if let Ok(n) = conn.read(&mut buf) {
                    count.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        });
        let stop = &stop;
        s.spawn(move || {
            let mut stream = stream;
            stream
                .set_write_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let buf = vec![0u8; 1 << 16];
            while !stop.load(Ordering::Relaxed) {
                let _ = stream.write(&buf);
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let (c0, t0) = (count.load(Ordering::Relaxed), Instant::now());
        std::thread::sleep(dur);
        let mb = (count.load(Ordering::Relaxed) - c0) as f64 / t0.elapsed().as_secs_f64() / 1e6;
        stop.store(true, Ordering::Relaxed);
        println!("TCP {mode:?} epochs {epoch:?}: {mb:.1} MB/s");
    });
}

#[test]
#[ignore]
fn tcp_throughput_held_every_10ms() {
    let dur = Duration::from_secs(3);
    tcp_rate(Mode::Pass, Duration::ZERO, dur);
    tcp_rate(Mode::Hold, Duration::from_millis(10), dur);
    tcp_rate(Mode::Hold, Duration::from_millis(2), dur);
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[test]
#[ignore]
fn control_operations() {
    let t = Topo::new("bctl");
    for _ in 0..3 {
        let t0 = Instant::now();
        let g = gate(&t, Mode::Hold);
        let new = t0.elapsed();
        let t0 = Instant::now();
        g.set_mode(Mode::Drop).unwrap();
        let to_drop = t0.elapsed();
        let t0 = Instant::now();
        g.set_mode(Mode::Hold).unwrap();
        let to_hold = t0.elapsed();
        let t0 = Instant::now();
        g.hold_input(true).unwrap();
        let hold_in = t0.elapsed();
        let t0 = Instant::now();
        g.hold_input(false).unwrap();
        let unhold_in = t0.elapsed();
        let t0 = Instant::now();
        for e in 1..=100_000 {
            g.mark(e);
        }
        let mark = t0.elapsed() / 100_000;
        let t0 = Instant::now();
        for _ in 0..10_000 {
            g.release(100_000).unwrap();
        }
        let empty_release = t0.elapsed() / 10_000;
        let t0 = Instant::now();
        for _ in 0..10_000 {
            let _ = g.stats();
        }
        let stats = t0.elapsed() / 10_000;
        let t0 = Instant::now();
        drop(g);
        let close = t0.elapsed();
        println!(
            "new {} | set_mode Drop {} Hold {} | hold_input on {} off {} | mark {:?} | \
             release (nothing held) {:?} | stats {:?} | drop {}",
            ms(new),
            ms(to_drop),
            ms(to_hold),
            ms(hold_in),
            ms(unhold_in),
            mark,
            empty_release,
            stats,
            ms(close)
        );
    }
}

/// From a datagram's send in the sandbox to `wait_output` returning.
#[test]
#[ignore]
fn wait_output_latency() {
    let t = Topo::new("bwait");
    let g = gate(&t, Mode::Hold);
    let tx = t.sandbox_udp();
    let _rx = t.client_udp(9000);
    let mut lat = Vec::new();
    for e in 1..=200u32 {
        let sent = std::sync::Mutex::new(None);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(2));
                *sent.lock().unwrap() = Some(Instant::now());
                send_seq(&tx, (CLIENT_ADDR, 9000), [e]);
            });
            assert!(g.wait_output(Duration::from_secs(2)));
            let woke = Instant::now();
            s.spawn(|| ()).join().unwrap();
            let _ = woke;
        });
        let woke = Instant::now();
        if let Some(at) = *sent.lock().unwrap() {
            lat.push(woke.saturating_duration_since(at));
        }
        g.mark(u64::from(e));
        g.release(u64::from(e)).unwrap();
    }
    lat.sort();
    println!(
        "wait_output: send -> wake median {:?}, p90 {:?}, max {:?}",
        lat[lat.len() / 2],
        lat[lat.len() * 9 / 10],
        lat[lat.len() - 1]
    );
}
