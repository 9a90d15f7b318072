//! Replication benchmarks on the lab (Tardigrade NSDI'15 §5.2–5.6, Figs. 3–6): each replicated
//! case against the same service unreplicated (`tardi run` in machine m1), in the same run.
//!
//! Subcommands (each writes `bench/out/replication-<what>-<stamp>.json` with every raw figure,
//! prints markdown tables, and draws `docs/img/replication-*.png` where the paper has a figure):
//!
//! - `ping`      UDP ping latency CDF (sequential pings from the client node) with the primary's
//!   epoch-interval CDF beside it (Fig. 3); the dirtier with `--rate-mbps 0`.
//! - `dirty`     ping latency p50/p99/p99.9 and checkpoint size against the dirtying rate,
//!   0–50% of a 1 Gb/s link throttled with `--link-bandwidth 1gbit` (Figs. 4–5).
//! - `backups`   ping latency with one against two backups, at 0/10/20% dirtying (Fig. 6).
//! - `failover`  the longest silence a continuously pinging client sees when the primary's (or a
//!   backup's) machine loses power (`Lab::kill`) at a random moment; with the new primary's
//!   `takeover_us` and the orchestrator's view history (§5.6).
//! - `redis`     redis-benchmark, 50 clients, SET/GET, unpipelined and `-P 16`.
//! - `floor`     the same Redis with its output held per epoch and nothing captured (the gate
//!   alone, the gate and a peer's acknowledgement, and with the service stopped at each
//!   boundary), against unreplicated and against Tardi, in one lab: see `floor.rs`.
//! - `all`       all of the above, in this order: failover, redis, ping, dirty, backups.
//!
//! Every loop is bounded by a count and a time limit. Traffic goes only to the lab's addresses
//! (10.77.0.0/24 and the services' 10.213.0.0/16 inside the lab's namespaces). The lab is held
//! only while a case measures (one lab per case, except the failover trials, which reuse one);
//! if another user's lab is up, it waits (up to `--lock-wait`, 30m). Before each case the
//! CPUs' busy share over 1 s and the load average are recorded; nothing about timings is
//! asserted.
//!
//! Run through `bench/replication.sh` (builds everything first), or:
//! `cargo run --release --example replication_bench -- SUBCOMMAND [--option value]...`
//! (`--help` lists the options).
//!
//! Over a thousand lines: the benchmark's subcommands and their report tables (the lab driving
//! is in `lab.rs` and the kit, the floor's part in `floor.rs`, the plots in `plot.rs`); it is a
//! driver, not product code.

mod floor;
mod lab;
/// The duration and bandwidth syntax of every `tardi` flag (`30m`, `1gbit`), shared with the CLI.
#[path = "../../src/parse.rs"]
#[allow(dead_code)]
mod parse;
mod plot;
#[path = "../../src/plot_font.rs"]
mod plot_font;
use lab::Cluster;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tardi_testkit::stats::{floor_rank, mean, percentile as pct, sorted};
use tardi_testkit::{root, sh};

// ---------------------------------------------------------------------------------------------
// Options and environment
// ---------------------------------------------------------------------------------------------

/// Replication benchmarks on the lab, each replicated case against the same service
/// unreplicated in the same run (see this example's module doc, or `bench/replication.sh`).
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "replication_bench", long_about = None)]
struct Opts {
    /// ping, dirty, backups, failover, redis, floor or all; or `plot RESULT.json...` to redraw
    /// the plots of earlier results.
    part: String,
    /// `plot`: the results to redraw.
    results: Vec<String>,
    /// The `tardi` binary (default: `tardi` in the directory above this example's).
    #[arg(long, default_value_os_t = default_tardi())]
    tardi: PathBuf,
    /// The dirtier binary.
    #[arg(long, default_value_os_t = root().join("target/tardi-test-programs/dirtier"))]
    dirtier: PathBuf,
    /// Raw results.
    #[arg(long, default_value_os_t = root().join("bench/out"))]
    out: PathBuf,
    /// Plots.
    #[arg(long, default_value_os_t = root().join("docs/img"))]
    img: PathBuf,
    /// `ping`: pings per case.
    #[arg(long, default_value_t = 10_000)]
    pings: usize,
    /// `dirty`, `backups`: pings per case.
    #[arg(long, default_value_t = 3_000)]
    dirty_pings: usize,
    /// `dirty`: dirtying rates, MB/s, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [0.0, 12.5, 25.0, 37.5, 50.0, 62.5])]
    rates: Vec<f64>,
    /// `backups`: dirtying rates, MB/s, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [0.0, 12.5, 25.0])]
    backup_rates: Vec<f64>,
    /// `failover`: trials per fault.
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// `failover`: the dirtier's rate, MB/s.
    #[arg(long, default_value_t = 10.0)]
    failover_rate: f64,
    /// `failover`: the dirtier's region, MiB.
    #[arg(long, default_value_t = 100)]
    failover_mb: u32,
    /// `failover`: a fresh lab per trial instead of restarting the killed machine.
    #[arg(long)]
    fresh_lab: bool,
    /// Before each case, wait up to this long for the CPUs to be at most 20% busy (default: do
    /// not wait; the busy share is recorded either way).
    #[arg(long, value_parser = parse::parse_duration)]
    wait_quiet: Option<Duration>,
    /// `redis`, `floor`: redis-benchmark's requests per test, unpipelined.
    #[arg(long, default_value_t = 100_000)]
    redis_n: u64,
    /// `redis`, `floor`: redis-benchmark's requests per test with `-P 16`.
    #[arg(long, default_value_t = 1_000_000)]
    redis_np: u64,
    /// How long to wait for another user's lab to go.
    #[arg(long, default_value = "30m", value_parser = parse::parse_duration)]
    lock_wait: Duration,
    /// `dirty`, `backups`: the instances' `--link-bandwidth` (the syntax of `tardi`'s).
    #[arg(long, default_value = "1gbit", value_parser = bandwidth)]
    link: String,
    /// `dirty`, `backups`: `bench/page_dirtier` (whole pages of random bytes) instead of the
    /// dirtier; results and plots get the suffix `-full`.
    #[arg(long)]
    full_pages: Option<PathBuf>,
    /// The dirtier's epoch interval, `[tardi.epoch] interval_ms` (default: the manifest's, 10ms).
    #[arg(long, value_parser = parse::parse_duration)]
    interval: Option<Duration>,
    /// The results' time stamp (default: now, UTC).
    #[arg(long)]
    stamp: Option<String>,
    /// The command line, for the record.
    #[arg(skip = std::env::args().collect::<Vec<_>>().join(" "))]
    command: String,
}

/// A bandwidth as `tardi` takes it, kept as written (it is passed on to `tardi instance`).
fn bandwidth(s: &str) -> Result<String, String> {
    parse::parse_bandwidth(s).map(|_| s.to_string())
}

/// `tardi` beside this example's directory (target/release/examples/replication_bench ->
/// target/release/tardi).
fn default_tardi() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join("tardi")))
        .unwrap_or_else(|| PathBuf::from("tardi"))
}

impl Opts {
    /// The link's bandwidth in MB/s.
    fn link_mb_per_s(&self) -> f64 {
        parse::parse_bandwidth(&self.link).unwrap_or(1_000_000_000) as f64 / 8e6
    }

    /// The dirtier's `[tardi.epoch] interval_ms`, if `--interval` set one.
    fn interval_ms(&self) -> Option<f64> {
        self.interval.map(|d| d.as_secs_f64() * 1e3)
    }
}

/// What every case needs.
struct Env {
    o: Opts,
    stamp: String,
    /// Scratch: manifests, epoch logs.
    tmp: PathBuf,
    commit: String,
    /// When the run started (UTC) and the load average then.
    started: String,
    load_at_start: String,
}

impl Env {
    fn new(o: Opts) -> Env {
        assert!(
            o.tardi.is_file(),
            "no tardi binary at {}",
            o.tardi.display()
        );
        assert!(
            o.dirtier.is_file(),
            "no dirtier at {} (gcc -O2 -pthread -o {} tests/programs/dirtier.c)",
            o.dirtier.display(),
            o.dirtier.display()
        );
        std::fs::create_dir_all(&o.out).expect("creating the output directory");
        std::fs::create_dir_all(&o.img).expect("creating the image directory");
        let stamp = o
            .stamp
            .clone()
            .unwrap_or_else(|| sh("date -u +%Y%m%d-%H%M%S"));
        let tmp = std::env::temp_dir().join(format!("tardi-replbench-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).expect("creating the scratch directory");
        let commit = commit();
        Env {
            o,
            stamp,
            tmp,
            commit,
            started: sh("date -u '+%Y-%m-%d %H:%M'"),
            load_at_start: loadavg(),
        }
    }

    /// A copy of `gramine-manifests/dirtier.manifest` with an absolute entrypoint, `rate` MB/s
    /// and service name `name`.
    fn dirtier_manifest(&self, rate: f64, name: &str) -> PathBuf {
        self.dirtier_manifest_mb(rate, 100, name)
    }

    /// As [`Env::dirtier_manifest`], with a region of `mb` MiB.
    fn dirtier_manifest_mb(&self, rate: f64, mb: u32, name: &str) -> PathBuf {
        let src = root().join("gramine-manifests/dirtier.manifest");
        let text = std::fs::read_to_string(&src).expect("reading dirtier.manifest");
        let mut out = String::new();
        let (mut entry, mut argv, mut named) = (false, false, false);
        for line in text.lines() {
            if line.starts_with("libos.entrypoint") {
                out.push_str(&format!(
                    "libos.entrypoint = \"{}\"\n",
                    self.o
                        .full_pages
                        .as_ref()
                        .unwrap_or(&self.o.dirtier)
                        .display()
                ));
                entry = true;
            } else if line.starts_with("loader.argv") {
                out.push_str(&format!(
                    "loader.argv = [\"dirtier\", \"--port\", \"7100\", \"--mb\", \"{mb}\", \"--rate-mbps\", \"{rate}\"]\n"
                ));
                argv = true;
            } else if line.starts_with("interval_ms = ")
                && let Some(ms) = self.o.interval_ms()
            {
                out.push_str(&format!("interval_ms = {ms}\n"));
            } else if line.starts_with("name = ") {
                out.push_str(&format!("name = \"{name}\"\n"));
                named = true;
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
        assert!(
            entry && argv && named,
            "dirtier.manifest changed shape: update dirtier_manifest()"
        );
        let p = self.tmp.join(format!("{name}.manifest"));
        std::fs::write(&p, out).expect("writing a manifest");
        p
    }

    /// `-full` with `--full-pages`, else nothing: names of results and plots.
    fn tag(&self) -> &'static str {
        if self.o.full_pages.is_some() {
            "-full"
        } else {
            ""
        }
    }

    /// How the dirtier writes, for titles.
    fn workload(&self) -> &'static str {
        if self.o.full_pages.is_some() {
            "whole pages of random bytes"
        } else {
            "one byte per page"
        }
    }

    /// `REDIS_MANIFEST`, else the repo's.
    fn redis_manifest(&self) -> PathBuf {
        std::env::var_os("REDIS_MANIFEST")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join("gramine-manifests/redis.manifest"))
    }

    /// Writes the raw results of `what`.
    fn save(&self, what: &str, v: &Value) -> PathBuf {
        let p = self
            .o
            .out
            .join(format!("replication-{what}-{}.json", self.stamp));
        std::fs::write(&p, serde_json::to_vec_pretty(v).expect("json")).expect("writing results");
        eprintln!("[bench] wrote {}", p.display());
        p
    }

    /// The header every result file carries.
    fn header(&self, what: &str) -> Value {
        json!({
            "what": what,
            "stamp": self.stamp,
            "commit": self.commit,
            "command": self.o.command,
            "started_utc": self.started,
            "finished_utc": sh("date -u '+%Y-%m-%d %H:%M'"),
            "nproc": sh("nproc"),
            "kernel": sh("uname -r"),
            "loadavg_start": self.load_at_start,
        })
    }
}

/// The commit, plus a note when the tree has uncommitted changes outside `bench/`, `docs/` and
/// this file (read-only git queries).
fn commit() -> String {
    let r = root();
    let r = r.display();
    let head = sh(&format!("git -C {r} rev-parse --short HEAD 2>/dev/null"));
    let dirty = sh(&format!(
        "git -C {r} --no-optional-locks status --porcelain -- . ':!bench' ':!docs' ':!examples/replication_bench' 2>/dev/null | wc -l"
    ));
    if dirty != "0" && !dirty.is_empty() {
        format!("{head} + {dirty} uncommitted file(s)")
    } else {
        head
    }
}

fn now_unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// (busy, total) jiffies of all CPUs.
fn cpu_ticks() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 5 {
        return (0, 0);
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v[4];
    (total - idle, total)
}

fn busy_pct(a: (u64, u64), b: (u64, u64)) -> f64 {
    let t = b.1.saturating_sub(a.1);
    if t == 0 {
        return 0.0;
    }
    100.0 * b.0.saturating_sub(a.0) as f64 / t as f64
}

/// `--wait-quiet`, for [`conditions`].
static WAIT_QUIET_S: AtomicU64 = AtomicU64::new(0);

/// The machine before a case: CPU busy % over 1 s (nothing of the case running yet) and the
/// load average. With `--wait-quiet S`, first waits up to S s for the CPUs to be at most 20%
/// busy (and records how long it waited).
fn conditions() -> Value {
    let limit = Duration::from_secs(WAIT_QUIET_S.load(Ordering::Relaxed));
    let t0 = Instant::now();
    loop {
        let a = cpu_ticks();
        std::thread::sleep(Duration::from_secs(1));
        let b = cpu_ticks();
        let busy = busy_pct(a, b);
        if busy <= 20.0 || t0.elapsed() >= limit {
            return json!({
                "cpu_busy_before_pct": (busy * 10.0).round() / 10.0,
                "loadavg": loadavg(),
                "waited_for_quiet_s": t0.elapsed().as_secs_f64().round() - 1.0,
            });
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------

/// mean/p50/p90/p99/p99.9/max of values in ms.
fn summary_ms(ms: &[f64]) -> Value {
    let s = sorted(ms.to_vec());
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({
        "n": s.len(),
        "mean": r(mean(&s)),
        "p50": r(pct(&s, 0.5)),
        "p90": r(pct(&s, 0.9)),
        "p99": r(pct(&s, 0.99)),
        "p99_9": r(pct(&s, 0.999)),
        "max": r(s.last().copied().unwrap_or(f64::NAN)),
    })
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

// ---------------------------------------------------------------------------------------------
// UDP ping
// ---------------------------------------------------------------------------------------------

/// Sequential pings (one outstanding): round trips in ms, and how many got no reply in `timeout`.
struct Pings {
    rtt_ms: Vec<f64>,
    lost: usize,
    from_us: u64,
    to_us: u64,
    cpu_busy_pct: f64,
}

fn ping_series(sock: &UdpSocket, to: SocketAddr, n: usize, limit: Duration) -> Pings {
    let timeout = Duration::from_secs(1);
    sock.set_read_timeout(Some(timeout)).expect("timeout");
    let mut buf = [0u8; 512];
    let mut rtt_ms = Vec::with_capacity(n);
    let mut lost = 0;
    let from_us = now_unix_us();
    let c0 = cpu_ticks();
    let t0 = Instant::now();
    for _ in 0..n {
        if t0.elapsed() > limit {
            eprintln!("[bench] ping series stopped at its time limit ({limit:?})");
            break;
        }
        let s = Instant::now();
        if sock.send_to(b"ping", to).is_err() {
            lost += 1;
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match sock.recv_from(&mut buf) {
            Ok((k, _)) if buf[..k].starts_with(b"pong") => {
                rtt_ms.push(s.elapsed().as_secs_f64() * 1e3)
            }
            _ => {
                lost += 1;
                // A late reply must not pass for the next ping's.
                drain(sock);
            }
        }
    }
    let c1 = cpu_ticks();
    Pings {
        rtt_ms,
        lost,
        from_us,
        to_us: now_unix_us(),
        cpu_busy_pct: busy_pct(c0, c1),
    }
}

fn drain(sock: &UdpSocket) {
    let mut buf = [0u8; 512];
    let _ = sock.set_read_timeout(Some(Duration::from_millis(200)));
    while sock.recv_from(&mut buf).is_ok() {}
    let _ = sock.set_read_timeout(Some(Duration::from_secs(1)));
}

/// Pings until a reply comes (the service is up), up to `limit`.
fn wait_pong(sock: &UdpSocket, to: SocketAddr, limit: Duration) -> bool {
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let t0 = Instant::now();
    let mut buf = [0u8; 512];
    while t0.elapsed() < limit {
        let _ = sock.send_to(b"ping", to);
        if let Ok((k, _)) = sock.recv_from(&mut buf)
            && buf[..k].starts_with(b"pong")
        {
            drain(sock);
            return true;
        }
    }
    false
}

fn addr(a: &str, port: u16) -> SocketAddr {
    format!("{a}:{port}").parse().expect("service address")
}

/// The epoch log's figures over a window.
fn epoch_summary(lines: &[Value], window_s: f64) -> Value {
    let g = |k: &str| -> Vec<f64> { lines.iter().filter_map(|l| l[k].as_f64()).collect() };
    let interval_ms: Vec<f64> = g("interval_us").iter().map(|v| v / 1e3).collect();
    let pause_ms: Vec<f64> = g("pause_us").iter().map(|v| v / 1e3).collect();
    let enc = g("encoded_bytes");
    let raw = g("raw_bytes");
    let mut ended: BTreeMap<String, usize> = BTreeMap::new();
    for l in lines {
        *ended
            .entry(l["ended_by"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    json!({
        "epochs": lines.len(),
        "epochs_per_s": lines.len() as f64 / window_s.max(1e-9),
        "interval_ms": summary_ms(&interval_ms),
        "pause_ms": summary_ms(&pause_ms),
        "encoded_bytes_mean": mean(&enc),
        "raw_bytes_mean": mean(&raw),
        "encoded_mb_per_s": enc.iter().sum::<f64>() / 1e6 / window_s.max(1e-9),
        "raw_mb_per_s": raw.iter().sum::<f64>() / 1e6 / window_s.max(1e-9),
        "ended_by": ended,
        "cycle_us": cycle_parts(lines),
    })
}

/// The cycle a replicated reply waits, in parts (`EpochStats::answers`; medians in µs over
/// the epochs that ended on output): from the resume to the release of the epoch before,
/// from there to the first answer, from the first answer to the last, the epoch's length and
/// its pause, and the share of epochs whose answers all came in (the others ended at the
/// minimum length). Null when no epoch recorded answers (a primary alone, or the rule off).
fn cycle_parts(lines: &[Value]) -> Value {
    let out: Vec<&Value> = lines
        .iter()
        .filter(|l| l["ended_by"] == "Output" && l["answers"].is_object())
        .collect();
    if out.is_empty() {
        return Value::Null;
    }
    let a = |l: &Value, k: &str| l["answers"][k].as_f64();
    let med =
        |v: Vec<f64>| -> Value { floor_rank(&sorted(v), 0.5).map_or(Value::Null, |m| json!(m)) };
    let release: Vec<f64> = out.iter().filter_map(|l| a(l, "release_us")).collect();
    let first: Vec<f64> = out
        .iter()
        .filter_map(|l| Some(a(l, "first_output_us")? - a(l, "release_us")?))
        .filter(|d| *d >= 0.0)
        .collect();
    let spread: Vec<f64> = out
        .iter()
        .filter_map(|l| Some(a(l, "last_output_us")? - a(l, "first_output_us")?))
        .collect();
    let answered = out
        .iter()
        .filter(|l| {
            let n = a(l, "release_packets").unwrap_or(0.0);
            n > 0.0 && a(l, "packets").unwrap_or(0.0) >= n
        })
        .count();
    let g = |k: &str| -> Vec<f64> { out.iter().filter_map(|l| l[k].as_f64()).collect() };
    json!({
        "epochs": out.len(),
        "resume_to_release": med(release),
        "release_to_first_answer": med(first),
        "first_to_last_answer": med(spread),
        "epoch": med(g("interval_us")),
        "pause": med(g("pause_us")),
        "answered_share": answered as f64 / out.len() as f64,
    })
}

/// One dirtier case: unreplicated then replicated (`backups`), `pings` pings each, on a fresh
/// lab with `extra` instance flags. Returns the case's record and the raw round trips.
struct PingCase {
    record: Value,
    unrep_ms: Vec<f64>,
    rep_ms: Vec<f64>,
    interval_ms: Vec<f64>,
}

fn dirtier_case(
    env: &Env,
    case: &str,
    rate: f64,
    backups: u32,
    pings: usize,
    extra: &[&str],
    baseline: bool,
) -> PingCase {
    let machines = (backups as usize + 1).max(2);
    let before = conditions();
    eprintln!("[bench] {case}: rate {rate} MB/s, {backups} backup(s); machine before: {before}");
    let c = Cluster::up(env, machines, extra, case);
    let name = format!("dirtier{}", case.replace(['.', '_'], "-"));
    let name = name.chars().take(40).collect::<String>();
    let manifest = env.dirtier_manifest(rate, &name);
    let sock = c.client_udp();
    let limit = Duration::from_secs(60 + pings as u64 / 50);
    let mut record = json!({"case": case, "rate_mbps": rate, "backups": backups, "before": before});

    let mut unrep_ms = Vec::new();
    if baseline {
        let u = c.run_unreplicated(&manifest);
        let to = addr(&u.address, 7100);
        assert!(
            wait_pong(&sock, to, Duration::from_secs(20)),
            "the unreplicated dirtier does not answer"
        );
        // Let it settle (the initial touch of the region).
        std::thread::sleep(Duration::from_millis(500));
        let p = ping_series(&sock, to, pings, limit);
        record["unreplicated"] = json!({
            "address": u.address, "latency_ms": summary_ms(&p.rtt_ms), "lost": p.lost,
            "cpu_busy_during_pct": p.cpu_busy_pct, "loadavg_after": loadavg(),
        });
        unrep_ms = p.rtt_ms;
        drop(u);
    }

    c.deploy(&manifest, backups);
    let svc = c
        .wait_ready(&name, backups as usize, Duration::from_secs(90))
        .expect("replicated dirtier ready");
    let to = addr(svc["address"].as_str().expect("address"), 7100);
    assert!(
        wait_pong(&sock, to, Duration::from_secs(20)),
        "the replicated dirtier does not answer"
    );
    // Past the full checkpoints and the start.
    std::thread::sleep(Duration::from_secs(2));
    let p = ping_series(&sock, to, pings, limit);
    let svc = c.service_or_null(&name);
    let lines = c.epochs(&name, p.from_us, p.to_us);
    let window = (p.to_us - p.from_us) as f64 / 1e6;
    let interval_ms: Vec<f64> = lines
        .iter()
        .filter_map(|l| l["interval_us"].as_f64())
        .map(|v| v / 1e3)
        .collect();
    record["replicated"] = json!({
        "address": svc["address"], "primary": svc["primary"], "backups_list": svc["backups"],
        "latency_ms": summary_ms(&p.rtt_ms), "lost": p.lost,
        "cpu_busy_during_pct": p.cpu_busy_pct, "loadavg_after": loadavg(),
        "epochs": epoch_summary(&lines, window),
        "primary_report": svc["primary_report"],
    });
    let rep_ms = p.rtt_ms;
    drop(c);
    PingCase {
        record,
        unrep_ms,
        rep_ms,
        interval_ms,
    }
}

// ---------------------------------------------------------------------------------------------
// Subcommands
// ---------------------------------------------------------------------------------------------

fn bench_ping(env: &Env) -> Value {
    let pc = dirtier_case(env, "ping", 0.0, 1, env.o.pings, &[], true);
    let r = &pc.record;
    let (u, p) = (
        &r["unreplicated"]["latency_ms"],
        &r["replicated"]["latency_ms"],
    );
    println!(
        "\n### UDP ping latency, dirtier at 0 MB/s, one backup ({} sequential pings)\n",
        env.o.pings
    );
    println!("| | mean ms | p50 | p99 | p99.9 | max | lost |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, v, side) in [
        ("unreplicated", u, "unreplicated"),
        ("replicated", p, "replicated"),
    ] {
        println!(
            "| {label} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
            f(v, "mean"),
            f(v, "p50"),
            f(v, "p99"),
            f(v, "p99_9"),
            f(v, "max"),
            r[side]["lost"]
        );
    }
    println!(
        "| **added** | **{:+.3}** | {:+.3} | {:+.3} | **{:+.3}** | {:+.3} | |",
        f(p, "mean") - f(u, "mean"),
        f(p, "p50") - f(u, "p50"),
        f(p, "p99") - f(u, "p99"),
        f(p, "p99_9") - f(u, "p99_9"),
        f(p, "max") - f(u, "max")
    );
    let e = &r["replicated"]["epochs"];
    println!(
        "\nEpoch interval during the pings: mean {:.3} ms, p50 {:.3}, p99 {:.3}, max {:.3} ({} epochs, {:.0}/s; ended by {}); pause p50 {:.3} ms p99 {:.3} ms.",
        f(&e["interval_ms"], "mean"),
        f(&e["interval_ms"], "p50"),
        f(&e["interval_ms"], "p99"),
        f(&e["interval_ms"], "max"),
        e["epochs"],
        f(e, "epochs_per_s"),
        e["ended_by"],
        f(&e["pause_ms"], "p50"),
        f(&e["pause_ms"], "p99")
    );
    println!(
        "Machine: before {}, CPU busy during: unreplicated {:.0}%, replicated {:.0}%.",
        r["before"],
        f(&r["unreplicated"], "cpu_busy_during_pct"),
        f(&r["replicated"], "cpu_busy_during_pct")
    );
    let img = env.o.img.join(match env.o.interval_ms() {
        Some(ms) => format!("replication-ping-cdf-{ms}ms.png"),
        None => "replication-ping-cdf.png".into(),
    });
    plot::ping_cdf(&img, &pc.unrep_ms, &pc.rep_ms, &pc.interval_ms).expect("plot");
    eprintln!("[bench] drew {}", img.display());
    let mut v = env.header("ping");
    v["interval_ms"] = json!(env.o.interval_ms().unwrap_or(10.0));
    v["case"] = pc.record;
    v["raw"] = json!({"unreplicated_ms": pc.unrep_ms, "replicated_ms": pc.rep_ms, "epoch_interval_ms": pc.interval_ms});
    v
}

fn bench_dirty(env: &Env) -> Value {
    let link = format!("--link-bandwidth={}", env.o.link);
    let link_mbs = env.o.link_mb_per_s();
    let mut cases = Vec::new();
    let mut raws = Vec::new();
    for &rate in &env.o.rates {
        let pc = dirtier_case(
            env,
            &format!("dirty-{rate}"),
            rate,
            1,
            env.o.dirty_pings,
            &[&link],
            true,
        );
        raws.push(
            json!({"rate_mbps": rate, "unreplicated_ms": pc.unrep_ms, "replicated_ms": pc.rep_ms}),
        );
        cases.push(pc.record);
    }
    println!(
        "\n### Latency and checkpoint size against the dirtying rate ({}; link throttled to {}, one backup, {} pings per case)\n",
        env.workload(),
        env.o.link,
        env.o.dirty_pings
    );
    println!(
        "| dirtying MB/s | % of link | unrep p50 ms | unrep p99 | rep p50 ms | rep p99 | rep p99.9 | rep mean | epochs/s | mean ckpt KiB (raw) | mean ckpt KiB (encoded) | encoded MB/s | CPU busy before | lost |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in &cases {
        let (u, r, e) = (
            &c["unreplicated"]["latency_ms"],
            &c["replicated"]["latency_ms"],
            &c["replicated"]["epochs"],
        );
        println!(
            "| {} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {:.1} | {:.1} | {:.3} | {}% | {} |",
            c["rate_mbps"],
            100.0 * f(c, "rate_mbps") / link_mbs,
            f(u, "p50"),
            f(u, "p99"),
            f(r, "p50"),
            f(r, "p99"),
            f(r, "p99_9"),
            f(r, "mean"),
            f(e, "epochs_per_s"),
            f(e, "raw_bytes_mean") / 1024.0,
            f(e, "encoded_bytes_mean") / 1024.0,
            f(e, "encoded_mb_per_s"),
            c["before"]["cpu_busy_before_pct"],
            c["replicated"]["lost"]
        );
    }
    let img1 = env
        .o
        .img
        .join(format!("replication-dirty{}-latency.png", env.tag()));
    let img2 = env
        .o
        .img
        .join(format!("replication-dirty{}-checkpoint.png", env.tag()));
    plot::dirty(&img1, &img2, &cases, link_mbs, env.workload()).expect("plot");
    eprintln!("[bench] drew {} and {}", img1.display(), img2.display());
    let mut v = env.header("dirty");
    v["link"] = json!(env.o.link);
    v["cases"] = json!(cases);
    v["raw"] = json!(raws);
    v
}

/// A result file's dirtying workload: the suffix of its plots' names and its description.
fn workload_of(v: &Value) -> (&'static str, &'static str) {
    if v["full_pages"] == true {
        ("-full", "whole pages of random bytes")
    } else {
        ("", "one byte per page")
    }
}

fn bench_backups(env: &Env) -> Value {
    let link = format!("--link-bandwidth={}", env.o.link);
    let link_mbs = env.o.link_mb_per_s();
    let mut cases = Vec::new();
    let mut series = Vec::new();
    for &rate in &env.o.backup_rates {
        for backups in [1u32, 2] {
            let pc = dirtier_case(
                env,
                &format!("backups{backups}-{rate}"),
                rate,
                backups,
                env.o.dirty_pings,
                &[&link],
                backups == 1,
            );
            series.push((
                format!(
                    "{backups} backup{}, dirtying {:.0}%",
                    if backups > 1 { "s" } else { "" },
                    100.0 * rate / link_mbs
                ),
                pc.rep_ms.clone(),
            ));
            if backups == 1 && rate == 0.0 {
                series.push(("unreplicated, no dirtying".into(), pc.unrep_ms.clone()));
            }
            cases.push(pc.record);
        }
    }
    println!(
        "\n### One against two backups ({}; link throttled to {}, {} pings per case; machines m1..m3)\n",
        env.workload(),
        env.o.link,
        env.o.dirty_pings
    );
    println!(
        "| dirtying MB/s (% of link) | backups | p50 ms | p90 | p99 | p99.9 | mean | unrep p50 / p99 | encoded MB/s per backup | CPU busy before |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|");
    for c in &cases {
        let (r, e) = (&c["replicated"]["latency_ms"], &c["replicated"]["epochs"]);
        let u = &c["unreplicated"]["latency_ms"];
        println!(
            "| {} ({:.0}%) | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.3} | {}% |",
            c["rate_mbps"],
            100.0 * f(c, "rate_mbps") / link_mbs,
            c["backups"],
            f(r, "p50"),
            f(r, "p90"),
            f(r, "p99"),
            f(r, "p99_9"),
            f(r, "mean"),
            if u.is_null() {
                "".to_string()
            } else {
                format!("{:.3} / {:.3}", f(u, "p50"), f(u, "p99"))
            },
            f(e, "encoded_mb_per_s"),
            c["before"]["cpu_busy_before_pct"]
        );
    }
    let img = env
        .o
        .img
        .join(format!("replication-backups{}-cdf.png", env.tag()));
    plot::cdfs(
        &img,
        &format!(
            "Ping latency, one vs two backups (link {}; {})",
            env.o.link,
            env.workload()
        ),
        "latency (ms)",
        &series,
    )
    .expect("plot");
    eprintln!("[bench] drew {}", img.display());
    let mut v = env.header("backups");
    v["link"] = json!(env.o.link);
    v["cases"] = json!(cases);
    v["raw"] = json!(
        series
            .iter()
            .map(|(l, s)| json!({"label": l, "ms": s}))
            .collect::<Vec<_>>()
    );
    v
}

// --- failover ---------------------------------------------------------------------------------

/// A pinger in the client node: a ping every `every` (or at once after a reply), replies'
/// times recorded, until `stop`.
struct Pinger {
    stop: Arc<AtomicBool>,
    /// µs since `base` of the last reply.
    last: Arc<AtomicU64>,
    replies: Arc<Mutex<Vec<u64>>>,
    base: Instant,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pinger {
    fn start(sock: UdpSocket, to: SocketAddr, limit: Duration) -> Pinger {
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(AtomicU64::new(0));
        let replies = Arc::new(Mutex::new(Vec::new()));
        let base = Instant::now();
        let (s2, l2, r2) = (stop.clone(), last.clone(), replies.clone());
        let thread = std::thread::spawn(move || {
            let _ = sock.set_read_timeout(Some(Duration::from_millis(10)));
            let mut buf = [0u8; 512];
            while !s2.load(Ordering::Relaxed) && base.elapsed() < limit {
                let _ = sock.send_to(b"ping", to);
                // Read every reply that came, up to 10 ms for the first.
                while let Ok((k, _)) = sock.recv_from(&mut buf) {
                    if buf[..k].starts_with(b"pong") {
                        let t = base.elapsed().as_micros() as u64;
                        l2.store(t, Ordering::Relaxed);
                        r2.lock().unwrap_or_else(|p| p.into_inner()).push(t);
                    }
                    let _ = sock.set_read_timeout(Some(Duration::from_micros(200)));
                }
                let _ = sock.set_read_timeout(Some(Duration::from_millis(10)));
            }
        });
        Pinger {
            stop,
            last,
            replies,
            base,
            thread: Some(thread),
        }
    }

    fn since_base(&self, t: Instant) -> u64 {
        t.duration_since(self.base).as_micros() as u64
    }

    fn finish(mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.replies.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// One failover trial on a ready cluster: kill the primary's (`fault` = "primary") or a
/// backup's machine at a random moment while pinging. Returns the trial's record and the killed
/// machine.
fn failover_trial(c: &mut Cluster, name: &str, fault: &str, trial: usize) -> (Value, String) {
    let before = conditions();
    let svc = c.service_or_null(name);
    let primary = svc["primary"].as_str().unwrap_or_default().to_string();
    let backup = svc["backups"][0].as_str().unwrap_or_default().to_string();
    let victim = if fault == "primary" {
        primary.clone()
    } else {
        backup.clone()
    };
    let to = addr(svc["address"].as_str().expect("address"), 7100);
    let sock = c.client_udp();
    let pinger = Pinger::start(sock, to, Duration::from_secs(60));
    // A random moment 0.5–1.5 s in (sub-ms randomness from the clock).
    let jitter = now_unix_us() % 1000;
    std::thread::sleep(Duration::from_millis(500 + jitter));
    let kill_unix_ms = now_unix_us() / 1000;
    let t_kill = Instant::now();
    c.lab.kill(&victim).expect("lab kill");
    let kill_call_ms = t_kill.elapsed().as_secs_f64() * 1e3;
    let k = pinger.since_base(t_kill);
    // The victim is dark once `kill` returned (its processes take a few ms to die: until then
    // it still answers).
    let k_done = pinger.since_base(Instant::now());
    // Until the orchestrator moved to a new view (at most 20 s), replies resume (at most 20 s),
    // the service is whole again (a new backup joined: its full checkpoint can stall the
    // primary too; at most 30 s), then 500 ms more.
    let view_before = svc["view"].as_u64().unwrap_or(0);
    let changed = c.try_wait("a new view", Duration::from_secs(20), |s| {
        s["services"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["name"] == name && x["view"].as_u64().is_some_and(|v| v > view_before))
        })
    });
    let t_changed = pinger.since_base(Instant::now());
    let t0 = Instant::now();
    while pinger.last.load(Ordering::Relaxed) <= t_changed.max(k_done)
        && t0.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let ready = c.wait_ready(name, 1, Duration::from_secs(30));
    let whole_after_kill_ms = t_kill.elapsed().as_secs_f64() * 1e3;
    std::thread::sleep(Duration::from_millis(500));
    let replies = pinger.finish();
    let before_kill = replies.iter().rev().find(|&&t| t <= k_done).copied();
    let after_kill = replies.iter().find(|&&t| t > k_done).copied();
    // The gap: the longest silence from 1 s before the kill to the end (steady state: a few
    // ms between replies), and where it started relative to the kill.
    let mut longest = 0u64;
    let mut longest_from = 0i64;
    let mut prev: Option<u64> = None;
    for &t in replies.iter().filter(|&&t| t + 1_000_000 >= k) {
        if let Some(p) = prev
            && t - p > longest
        {
            longest = t - p;
            longest_from = p as i64 - k as i64;
        }
        prev = Some(t);
    }
    let recovered = changed.is_ok() && replies.last().is_some_and(|&t| t > t_changed.max(k_done));
    // The silence that spans the kill itself.
    let spanning_ms = match (before_kill, after_kill) {
        (Some(b), Some(a)) => (a - b) as f64 / 1e3,
        _ => f64::NAN,
    };
    let gap_ms = if recovered {
        longest as f64 / 1e3
    } else {
        f64::NAN
    };
    let svc = c.service_or_null(name);
    let history: Vec<Value> = svc["history"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter(|x| {
                    x["proposed_ms"]
                        .as_u64()
                        .is_some_and(|p| p + 50 >= kill_unix_ms)
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let first = history.first();
    let detect_ms = first
        .and_then(|h| h["proposed_ms"].as_u64())
        .map(|p| p as i64 - kill_unix_ms as i64);
    let activated_ms = first
        .and_then(|h| h["activated_ms"].as_u64())
        .filter(|a| *a > 0)
        .map(|a| a as i64 - kill_unix_ms as i64);
    // When the primary after the kill logged its first epoch (after its start and full
    // checkpoint), and that epoch's interval.
    let new_primary = svc["primary"].as_str().unwrap_or_default().to_string();
    let first_epoch = c
        .epochs(name, kill_unix_ms * 1000, now_unix_us())
        .into_iter()
        .find(|l| l["machine"] == new_primary.as_str());
    let first_epoch_ms = first_epoch
        .as_ref()
        .and_then(|l| l["unix_us"].as_u64())
        .map(|u| (u as f64 / 1e3 - kill_unix_ms as f64).round());
    let rec = json!({
        "first_epoch_after_kill_ms": first_epoch_ms,
        "first_epoch": first_epoch,
        "view_before": view_before, "view_changed": changed.is_ok(),
        "service_lost": history.iter().any(|h| h["reason"].as_str().is_some_and(|r| r.starts_with("lost"))),
        "trial": trial, "fault": fault, "killed": victim, "primary_before": primary,
        "backup_before": backup, "before": before,
        "gap_ms": gap_ms, "silence_spanning_kill_ms": spanning_ms,
        "gap_started_after_kill_ms": longest_from as f64 / 1e3, "recovered": recovered,
        "whole_again_after_kill_ms": whole_after_kill_ms,
        "kill_call_ms": kill_call_ms,
        "replies": replies.len(),
        "primary_after": svc["primary"], "backups_after": svc["backups"],
        "takeover_us": svc["primary_report"]["takeover_us"],
        "view_proposed_after_kill_ms": detect_ms,
        "view_activated_after_kill_ms": activated_ms,
        "history_since_kill": history,
        "ready_again": ready.is_ok(),
    });
    eprintln!(
        "[bench] failover {fault} #{trial}: killed {victim}, gap {gap_ms:.1} ms (starting {:.1} ms after the kill; silence spanning the kill {spanning_ms:.1} ms), new primary's first epoch {first_epoch_ms:?} ms, new view proposed {:?} ms / active {:?} ms after the kill, takeover_us {}",
        longest_from as f64 / 1e3,
        detect_ms,
        activated_ms,
        svc["primary_report"]["takeover_us"]
    );
    (rec, victim)
}

fn failover_cluster(env: &Env, manifest: &Path, name: &str, case: &str) -> Cluster {
    let c = Cluster::up(env, 3, &[], case);
    c.deploy(manifest, 1);
    c.wait_ready(name, 1, Duration::from_secs(90))
        .expect("dirtier ready for the failover trials");
    let to = addr(
        c.service_or_null(name)["address"]
            .as_str()
            .expect("address"),
        7100,
    );
    assert!(
        wait_pong(&c.client_udp(), to, Duration::from_secs(20)),
        "no pong"
    );
    c
}

fn bench_failover(env: &Env) -> Value {
    let name = "dirtier-failover";
    let manifest = env.dirtier_manifest_mb(env.o.failover_rate, env.o.failover_mb, name);
    let logs = env
        .o
        .out
        .join(format!("replication-failover-{}-logs", env.stamp));
    let mut trials = Vec::new();
    let mut reuse = Vec::new();
    for fault in ["primary", "backup"] {
        let mut cluster: Option<Cluster> = None;
        let t_fault = Instant::now();
        for trial in 0..env.o.trials {
            if t_fault.elapsed() > Duration::from_secs(40 * 60) {
                eprintln!("[bench] failover {fault}: time limit reached after {trial} trials");
                break;
            }
            let t_prep = Instant::now();
            let fresh = cluster.is_none();
            let mut c = match cluster.take() {
                Some(c) => c,
                None => failover_cluster(env, &manifest, name, &format!("failover-{fault}")),
            };
            let prep_s = t_prep.elapsed().as_secs_f64();
            let (mut rec, victim) = failover_trial(&mut c, name, fault, trial);
            rec["prep_s"] = json!(prep_s);
            rec["fresh_lab"] = json!(fresh);
            // Reuse: power the killed machine on again; it rejoins as a spare.
            let t_restart = Instant::now();
            let mut why = String::new();
            if env.o.fresh_lab {
                why = "--fresh-lab".into();
            } else if rec["ready_again"] != true {
                why = "the service was not whole again within 30 s of the kill".into();
            } else if let Err(e) = c.lab.start(&victim) {
                why = format!("lab start {victim}: {e}");
            } else if let Err(e) = c.try_wait(
                "the killed machine to rejoin",
                Duration::from_secs(30),
                |s| {
                    s["machines"]
                        .as_array()
                        .is_some_and(|m| m.iter().filter(|m| m["alive"] == true).count() == 3)
                },
            ) {
                why = format!("{e:#}");
            } else if let Err(e) = c.wait_ready(name, 1, Duration::from_secs(30)) {
                why = e;
            }
            let ok = why.is_empty();
            let restart_s = t_restart.elapsed().as_secs_f64();
            reuse.push(json!({"fault": fault, "trial": trial, "restart_ok": ok, "restart_s": restart_s, "why_not": why, "fresh_prep_s": if fresh { json!(prep_s) } else { Value::Null }}));
            rec["restart_s"] = json!(restart_s);
            rec["restart_ok"] = json!(ok);
            trials.push(rec);
            if ok {
                cluster = Some(c);
            } else {
                eprintln!("[bench] failover: rebuilding the lab for the next trial ({why})");
                c.save_logs_tagged(&logs, &format!("{fault}-upto{trial}"));
                drop(c);
            }
        }
        if let Some(c) = &cluster {
            c.save_logs_tagged(&logs, &format!("{fault}-end"));
        }
        drop(cluster);
    }
    println!(
        "\n### Failover: longest silence seen by a pinging client ({} trials per fault; dirtier at {} MB/s, one backup, 3 machines)\n",
        env.o.trials, env.o.failover_rate
    );
    println!(
        "| fault | trials (recovered; service lost) | gap median ms | p90 | max | min | new view proposed after kill, median ms | active after kill, median ms | takeover median ms (primary) | new primary's first epoch after kill, median ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut by_fault = serde_json::Map::new();
    for fault in ["primary", "backup"] {
        let ts: Vec<&Value> = trials.iter().filter(|t| t["fault"] == fault).collect();
        let gaps = sorted(
            ts.iter()
                .map(|t| f(t, "gap_ms"))
                .filter(|g| g.is_finite())
                .collect(),
        );
        let det = sorted(
            ts.iter()
                .filter_map(|t| t["view_proposed_after_kill_ms"].as_f64())
                .collect(),
        );
        let act = sorted(
            ts.iter()
                .filter_map(|t| t["view_activated_after_kill_ms"].as_f64())
                .collect(),
        );
        let tk = sorted(
            ts.iter()
                .filter_map(|t| t["takeover_us"].as_f64())
                .collect(),
        );
        let fe = sorted(
            ts.iter()
                .filter_map(|t| t["first_epoch_after_kill_ms"].as_f64())
                .collect(),
        );
        let lost = ts.iter().filter(|t| t["service_lost"] == true).count();
        let s = json!({
            "trials": ts.len(), "recovered": gaps.len(), "service_lost": lost,
            "gap_ms": summary_ms(&gaps), "view_proposed_ms": summary_ms(&det),
            "view_activated_ms": summary_ms(&act), "takeover_ms": summary_ms(&tk.iter().map(|v| v / 1e3).collect::<Vec<_>>()),
            "first_epoch_after_kill_ms": summary_ms(&fe),
        });
        println!(
            "| {fault} | {} ({}; {lost} lost) | **{:.1}** | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {} | {:.0} |",
            ts.len(),
            gaps.len(),
            pct(&gaps, 0.5),
            pct(&gaps, 0.9),
            gaps.last().copied().unwrap_or(f64::NAN),
            gaps.first().copied().unwrap_or(f64::NAN),
            pct(&det, 0.5),
            pct(&act, 0.5),
            if fault == "primary" {
                format!("{:.0}", pct(&tk, 0.5) / 1e3)
            } else {
                "-".into()
            },
            pct(&fe, 0.5)
        );
        by_fault.insert(fault.into(), s);
    }
    let restarts: Vec<f64> = reuse
        .iter()
        .filter(|r| r["restart_ok"] == true)
        .filter_map(|r| r["restart_s"].as_f64())
        .collect();
    let fresh: Vec<f64> = reuse
        .iter()
        .filter_map(|r| r["fresh_prep_s"].as_f64())
        .collect();
    println!(
        "\nReusing the lab: {} of {} restarts of the killed machine worked (median {:.1} s until the service was whole again); a fresh lab + deploy took median {:.1} s ({} times).",
        restarts.len(),
        reuse.len(),
        pct(&sorted(restarts.clone()), 0.5),
        pct(&sorted(fresh.clone()), 0.5),
        fresh.len()
    );
    let mut v = env.header("failover");
    v["service"] = json!({"dirtier_mib": env.o.failover_mb, "rate_mbps": env.o.failover_rate, "backups": 1, "machines": 3});
    v["summary"] = Value::Object(by_fault);
    v["trials"] = json!(trials);
    v["lab_reuse"] = json!(reuse);
    draw_failover(&env.o.img, &v);
    v
}

/// The failover CDF from a result file's `trials`.
fn draw_failover(img: &Path, v: &Value) {
    let mib = v["service"]["dirtier_mib"].as_u64().unwrap_or(100);
    let rate = v["service"]["rate_mbps"].as_f64().unwrap_or(10.0);
    let series: Vec<(String, Vec<f64>)> = ["primary", "backup"]
        .iter()
        .map(|fault| {
            let gaps: Vec<f64> = v["trials"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter(|t| t["fault"] == *fault)
                        .map(|t| f(t, "gap_ms"))
                        .filter(|g| g.is_finite())
                        .collect()
                })
                .unwrap_or_default();
            (format!("{fault} failure ({} trials)", gaps.len()), gaps)
        })
        .collect();
    let name = if mib == 100 {
        "replication-failover-cdf.png".to_string()
    } else {
        format!("replication-failover-{mib}mib-cdf.png")
    };
    let path = img.join(name);
    plot::cdfs(
        &path,
        &format!(
            "Failover: longest silence seen by a pinging client (dirtier, {mib} MiB, {rate} MB/s)"
        ),
        "gap (ms)",
        &series,
    )
    .expect("plot");
    eprintln!("[bench] drew {}", path.display());
}

/// `plot FILE...`: draws the plots again from result files (e.g. after a change of style).
fn replot(img: &Path, files: &[String]) {
    for file in files {
        let text = std::fs::read_to_string(file).expect("reading a result file");
        let v: Value = serde_json::from_str(&text).expect("a result file");
        match v["what"].as_str() {
            Some("failover") => draw_failover(img, &v),
            Some("ping") => {
                let g = |k: &str| -> Vec<f64> {
                    v["raw"][k]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_f64).collect())
                        .unwrap_or_default()
                };
                let path = img.join(match v["interval_ms"].as_f64() {
                    Some(ms) if ms != 10.0 => format!("replication-ping-cdf-{ms}ms.png"),
                    _ => "replication-ping-cdf.png".into(),
                });
                plot::ping_cdf(
                    &path,
                    &g("unreplicated_ms"),
                    &g("replicated_ms"),
                    &g("epoch_interval_ms"),
                )
                .expect("plot");
                eprintln!("[bench] drew {}", path.display());
            }
            Some("dirty") => {
                let (tag, workload) = workload_of(&v);
                let link = parse::parse_bandwidth(v["link"].as_str().unwrap_or("1gbit"))
                    .unwrap_or(1_000_000_000) as f64
                    / 8e6;
                let cases = v["cases"].as_array().cloned().unwrap_or_default();
                let p1 = img.join(format!("replication-dirty{tag}-latency.png"));
                let p2 = img.join(format!("replication-dirty{tag}-checkpoint.png"));
                plot::dirty(&p1, &p2, &cases, link, workload).expect("plot");
                eprintln!("[bench] drew {} and {}", p1.display(), p2.display());
            }
            Some("backups") => {
                let (tag, workload) = workload_of(&v);
                let series: Vec<(String, Vec<f64>)> = v["raw"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|x| {
                                (
                                    x["label"].as_str().unwrap_or("?").to_string(),
                                    x["ms"]
                                        .as_array()
                                        .map(|m| m.iter().filter_map(Value::as_f64).collect())
                                        .unwrap_or_default(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let path = img.join(format!("replication-backups{tag}-cdf.png"));
                plot::cdfs(
                    &path,
                    &format!(
                        "Ping latency, one vs two backups (link {}; {workload})",
                        v["link"].as_str().unwrap_or("?")
                    ),
                    "latency (ms)",
                    &series,
                )
                .expect("plot");
                eprintln!("[bench] drew {}", path.display());
            }
            other => eprintln!("[bench] {file}: no replot for {other:?}"),
        }
    }
}

// --- redis ------------------------------------------------------------------------------------

/// Runs redis-benchmark in the client node; returns test → {rps, p50, p99, ...} from `--csv`.
fn redis_benchmark(c: &Cluster, address: &str, pipeline: u32, n: u64) -> (Value, String) {
    let argv: Vec<String> = [
        "redis-benchmark",
        "-h",
        address,
        "-p",
        "6379",
        "-c",
        "50",
        "-n",
        &n.to_string(),
        "-t",
        "set,get",
        "-P",
        &pipeline.to_string(),
        "--precision",
        "3",
        "--csv",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut cmd = c.lab.command("client", &argv[0]).expect("command");
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting redis-benchmark");
    let mut out = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    let limit = Duration::from_secs(300);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            _ if t0.elapsed() > limit => {
                eprintln!("[bench] redis-benchmark ran past {limit:?}; killed");
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let text = reader.join().unwrap_or_default();
    let mut res = serde_json::Map::new();
    let mut header: Vec<String> = Vec::new();
    for line in text.lines() {
        let cells: Vec<String> = line
            .split(',')
            .map(|c| c.trim().trim_matches('"').to_string())
            .collect();
        if cells.first().is_some_and(|c| c == "test") {
            header = cells;
            continue;
        }
        if header.is_empty() || cells.len() != header.len() {
            continue;
        }
        let mut m = serde_json::Map::new();
        for (h, v) in header.iter().zip(&cells).skip(1) {
            m.insert(h.clone(), v.parse::<f64>().map_or(json!(v), |x| json!(x)));
        }
        res.insert(cells[0].clone(), Value::Object(m));
    }
    (
        Value::Object(res),
        format!("{} ({:.1} s)", argv.join(" "), t0.elapsed().as_secs_f64()),
    )
}

fn bench_redis(env: &Env) -> Value {
    let before = conditions();
    eprintln!("[bench] redis: machine before: {before}");
    let c = Cluster::up(env, 2, &[], "redis");
    let manifest = env.redis_manifest();
    let cases = [(1u32, env.o.redis_n), (16, env.o.redis_np)];
    let mut rec = json!({"before": before});
    let mut cmds = Vec::new();
    {
        let u = c.run_unreplicated(&manifest);
        wait_tcp(&c, &u.address, 6379);
        let mut m = serde_json::Map::new();
        for (p, n) in cases {
            let cb = conditions();
            let (r, cmd) = redis_benchmark(&c, &u.address, p, n);
            cmds.push(cmd);
            m.insert(format!("P{p}"), json!({"results": r, "before": cb}));
        }
        rec["unreplicated"] = Value::Object(m);
    }
    let a = deploy_redis(&c, &manifest);
    let mut m = serde_json::Map::new();
    for (p, n) in cases {
        let cb = conditions();
        let from = now_unix_us();
        let (r, cmd) = redis_benchmark(&c, &a, p, n);
        let to = now_unix_us();
        cmds.push(cmd);
        let lines = c.epochs("redis", from, to);
        let svc = c.service_or_null("redis");
        m.insert(
            format!("P{p}"),
            json!({"results": r, "before": cb, "epochs": epoch_summary(&lines, (to - from) as f64 / 1e6), "primary_report": svc["primary_report"]}),
        );
    }
    rec["replicated"] = Value::Object(m);
    drop(c);
    println!(
        "\n### redis-benchmark, 50 clients, SET/GET (one backup; `-n {}` unpipelined, `-n {}` with `-P 16`)\n",
        env.o.redis_n, env.o.redis_np
    );
    println!(
        "| test | pipeline | unreplicated req/s | replicated req/s | ratio | unrep p50 / p99 ms | rep p50 / p99 ms | rep pause p50 / p99 ms (epoch log) | rep epochs/s |"
    );
    println!("|---|---:|---:|---:|---:|---|---|---|---:|");
    for (p, _) in cases {
        for t in ["SET", "GET"] {
            let u = &rec["unreplicated"][format!("P{p}")]["results"][t];
            let r = &rec["replicated"][format!("P{p}")]["results"][t];
            let e = &rec["replicated"][format!("P{p}")]["epochs"];
            println!(
                "| {t} | {p} | {:.0} | {:.0} | **{:.1}%** | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} | {:.0} |",
                f(u, "rps"),
                f(r, "rps"),
                100.0 * f(r, "rps") / f(u, "rps"),
                f(u, "p50_latency_ms"),
                f(u, "p99_latency_ms"),
                f(r, "p50_latency_ms"),
                f(r, "p99_latency_ms"),
                f(&e["pause_ms"], "p50"),
                f(&e["pause_ms"], "p99"),
                f(e, "epochs_per_s")
            );
        }
    }
    println!(
        "\nThe replicated cycle in parts (medians in µs over the epochs that ended on output; \
         `EpochStats::answers`):\n"
    );
    println!(
        "| pipeline | resume -> release | release -> first answer | first -> last answer | epoch | pause | all answered |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (p, _) in cases {
        let c = &rec["replicated"][format!("P{p}")]["epochs"]["cycle_us"];
        if c.is_null() {
            continue;
        }
        let n = |k: &str| c[k].as_f64().map_or("-".to_string(), |v| format!("{v:.0}"));
        println!(
            "| {p} | {} | {} | {} | {} | {} | {:.0}% |",
            n("resume_to_release"),
            n("release_to_first_answer"),
            n("first_to_last_answer"),
            n("epoch"),
            n("pause"),
            100.0 * f(c, "answered_share")
        );
    }
    println!("\nCommands (in the client node): {}", cmds.join("; "));
    let mut v = env.header("redis");
    v["case"] = rec;
    v["commands"] = json!(cmds);
    v
}

/// Deploys Redis from `manifest` with one backup, waits until it serves (and a second more);
/// returns its address.
fn deploy_redis(c: &Cluster, manifest: &Path) -> String {
    c.deploy(manifest, 1);
    let svc = c
        .wait_ready("redis", 1, Duration::from_secs(90))
        .expect("replicated redis ready");
    let a = svc["address"].as_str().expect("address").to_string();
    wait_tcp(c, &a, 6379);
    std::thread::sleep(Duration::from_secs(1));
    a
}

fn wait_tcp(c: &Cluster, a: &str, port: u16) {
    let to = addr(a, port);
    let ok = c
        .lab
        .in_node("client", || {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(20) {
                if std::net::TcpStream::connect_timeout(&to, Duration::from_millis(200)).is_ok() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            false
        })
        .expect("client node");
    assert!(ok, "{to} does not accept connections");
}

fn main() {
    let o = <Opts as clap::Parser>::parse();
    if o.part == "plot" {
        replot(&root().join("docs/img"), &o.results);
        return;
    }
    let cmd = o.part.clone();
    let wait_quiet = o.wait_quiet.map_or(0, |d| d.as_secs().max(1));
    WAIT_QUIET_S.store(wait_quiet, Ordering::Relaxed);
    let env = Env::new(o);
    eprintln!(
        "[bench] commit {}, stamp {}, scratch {}",
        env.commit,
        env.stamp,
        env.tmp.display()
    );
    let parts: Vec<&str> = match cmd.as_str() {
        "all" => vec!["failover", "redis", "ping", "dirty", "backups"],
        "ping" | "dirty" | "backups" | "failover" | "redis" | "floor" => vec![cmd.as_str()],
        _ => {
            eprintln!(
                "replication_bench: unknown part {cmd:?} (ping, dirty, backups, failover, redis, floor, all or plot)"
            );
            std::process::exit(2)
        }
    };
    for part in parts {
        let mut v = match part {
            "ping" => bench_ping(&env),
            "dirty" => bench_dirty(&env),
            "backups" => bench_backups(&env),
            "failover" => bench_failover(&env),
            "floor" => floor::bench_floor(&env),
            _ => bench_redis(&env),
        };
        v["loadavg_end"] = json!(loadavg());
        v["full_pages"] = json!(env.o.full_pages.is_some());
        let name = match part {
            "dirty" | "backups" => format!("{part}{}", env.tag()),
            _ => part.to_string(),
        };
        env.save(&name, &v);
    }
    if std::env::var_os("KEEP_SCRATCH").is_some() {
        eprintln!("[bench] scratch kept (KEEP_SCRATCH): {}", env.tmp.display());
    } else {
        let _ = std::fs::remove_dir_all(&env.tmp);
    }
}
