//! A closed-loop memcached load (text protocol), memtier-style: `--conns` connections, each on
//! its own thread, each sending one request and waiting for its answer, for `--seconds`. Keys
//! are drawn uniformly from `--keys`, values are `--size` bytes. Prints one JSON line:
//! `{"test","conns","seconds","requests","rps","p50_ms","p99_ms","errors"}`.
//!
//! Used by `bench/throughput.sh` (memcached tracked and replicated against untracked); Debian
//! has no memtier_benchmark, and memcslap reports no latency.
//!
//! Usage: `kv_load --addr IP:PORT [--test set|get] [--conns 50] [--seconds 5] [--keys 100000]
//! [--size 64]`. A `get` run first stores every key it asks for (untimed); every run sends for
//! one second untimed before the measured seconds.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tardi_testkit::stats::floor_rank;

struct Opts {
    addr: SocketAddr,
    test: String,
    conns: usize,
    seconds: f64,
    keys: u64,
    size: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: kv_load --addr IP:PORT [--test set|get] [--conns 50] [--seconds 5] [--keys 100000] [--size 64]"
    );
    std::process::exit(2)
}

fn opts() -> Opts {
    let mut o = Opts {
        addr: "127.0.0.1:11211".parse().expect("an address"),
        test: "set".into(),
        conns: 50,
        seconds: 5.0,
        keys: 100_000,
        size: 64,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--addr" => o.addr = v.parse().unwrap_or_else(|_| usage()),
            "--test" if v == "set" || v == "get" => o.test = v,
            "--conns" => o.conns = v.parse().unwrap_or_else(|_| usage()),
            "--seconds" => o.seconds = v.parse().unwrap_or_else(|_| usage()),
            "--keys" => o.keys = v.parse().unwrap_or_else(|_| usage()),
            "--size" => o.size = v.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    if o.conns == 0 || o.keys == 0 || o.seconds <= 0.0 {
        usage()
    }
    o
}

/// One connection: requests until `until`, latencies (µs) of those sent from `from` on (the
/// time before warms the service and the connections up), and the error count.
fn client(o: &Opts, seed: u64, from: Instant, until: Instant) -> std::io::Result<(Vec<u32>, u64)> {
    let s = TcpStream::connect_timeout(&o.addr, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let value = vec![b'x'; o.size];
    let mut rng = seed | 1;
    let mut lat = Vec::new();
    let mut errors = 0;
    let mut line = String::new();
    let mut req = Vec::with_capacity(o.size + 64);
    while Instant::now() < until {
        // xorshift64
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let key = rng % o.keys;
        req.clear();
        let get = o.test == "get";
        if get {
            write!(req, "get key:{key}\r\n")?;
        } else {
            write!(req, "set key:{key} 0 0 {}\r\n", o.size)?;
            req.extend_from_slice(&value);
            req.extend_from_slice(b"\r\n");
        }
        let t = Instant::now();
        w.write_all(&req)?;
        // A get answers VALUE + data + END (or END alone); a set STORED.
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if line.starts_with("VALUE") {
                let mut data = vec![0u8; o.size + 2];
                std::io::Read::read_exact(&mut r, &mut data)?;
                continue;
            }
            if !(line == "END\r\n" || line == "STORED\r\n") {
                errors += 1;
            }
            break;
        }
        if t >= from {
            lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        }
    }
    Ok((lat, errors))
}

fn main() {
    let o = opts();
    if o.test == "get" {
        // Store the keys first (untimed), so that gets find them.
        let per = o.keys.div_ceil(o.conns as u64);
        std::thread::scope(|sc| {
            for c in 0..o.conns as u64 {
                let o = &o;
                sc.spawn(move || {
                    let s = TcpStream::connect(o.addr).expect("connect");
                    s.set_nodelay(true).expect("nodelay");
                    let mut w = s.try_clone().expect("clone");
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    for k in c * per..((c + 1) * per).min(o.keys) {
                        write!(
                            w,
                            "set key:{k} 0 0 {}\r\n{}\r\n",
                            o.size,
                            "x".repeat(o.size)
                        )
                        .expect("write");
                        line.clear();
                        r.read_line(&mut line).expect("read");
                    }
                });
            }
        });
    }
    // One second of warm-up, then the measured `--seconds`.
    let start = Instant::now() + Duration::from_secs(1);
    let until = start + Duration::from_secs_f64(o.seconds);
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..o.conns as u64)
            .map(|c| {
                let o = &o;
                sc.spawn(move || client(o, 0x9E37_79B9_7F4A_7C15 ^ ((c + 1) * 7919), start, until))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    let took = until.duration_since(start).as_secs_f64();
    let mut lat = Vec::new();
    let mut errors = 0;
    for r in results {
        match r {
            Ok((l, e)) => {
                lat.extend(l);
                errors += e;
            }
            Err(e) => {
                eprintln!("kv_load: a connection failed: {e}");
                errors += 1;
            }
        }
    }
    lat.sort_unstable();
    let pct = |p: f64| floor_rank(&lat, p).map_or(0.0, |v| v as f64 / 1000.0);
    println!(
        "{{\"test\":\"{}\",\"conns\":{},\"seconds\":{:.3},\"requests\":{},\"rps\":{:.0},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"errors\":{}}}",
        o.test,
        o.conns,
        took,
        lat.len(),
        lat.len() as f64 / took,
        pct(0.5),
        pct(0.99),
        errors
    );
}
