//! Incremental-checkpoint benchmark (driven by `bench/epochs.sh`): runs the epoch loop of
//! [`tardi_checkpointer::epoch`] (userfaultfd write-protect, async, + PAGEMAP_SCAN) on a
//! memory-dirtying service (`tests/programs/dirtier.c`) or on Redis under `redis-benchmark`, and
//! reports what it costs the service and what each epoch costs and produces.
//!
//! Subcommands (each prints markdown table rows on stdout and appends one JSON object per case,
//! and with `--raw-epochs` one per epoch, to the file given by `--raw`):
//!
//! - `slowdown`: the dirtier at several rates, untracked (`none`) and under the epoch loop
//!   (`uffd` = default config, whose cap is 4,000 pages since 2026-11-26 and was 1,000 before;
//!   `uffd-nocap` = cap off). Measures
//!   the dirtier's CPU time (clock_getcpuclockid, and utime/stime ticks from /proc/PID/stat),
//!   its minor faults, the pages it actually dirtied (its `pong` counter) and the round-trip
//!   time of UDP pings sent by a client thread during the run.
//! - `pause`: the dirtier at rate/interval pairs that give a chosen number of dirty pages per
//!   epoch, cap off; distribution of pause_us and its parts.
//! - `bytes`: page-granular bytes (dirty × 4 KiB) against encoded bytes per codec, on the dirtier
//!   and on Redis under load.
//! - `hot`: hot pages on (hot_epochs 3) against off (0), on Redis under load and on the dirtier;
//!   write faults per epoch counted as the target's minor-fault delta.
//!
//! Common options: `--raw FILE` (JSON lines appended), `--wait-quiet N` (before each case, wait
//! up to N s for the CPUs to be ≤ 20% busy; the busy % of the 1 s before each case is reported
//! either way), `--dirtier PATH`, `--port N`, `--mb M` (dirtier region, default 100).
//! Redis: `--redis-port N` (default 16390), `--bench-log FILE` (redis-benchmark's output).
//! Run as root (ptrace). Reports figures only; asserts nothing about them.
//!
//! Over a thousand lines: a benchmark driver with four parts that share the service setup and
//! the report's tables; it is not part of the product and each part reads top to bottom.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tardi_checkpointer::delta::Codec;
use tardi_checkpointer::epoch::{EpochConfig, EpochStats, Epochs};
use tardi_checkpointer::image::Checkpoint;
// Nearest rank, of values in any order.
use tardi_testkit::stats::{mean, percentile_of as pct};

const PAGE: f64 = 4096.0;

static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

// ---------------------------------------------------------------------------------------------
// Arguments

struct Args {
    cmd: String,
    opts: HashMap<String, String>,
}

impl Args {
    fn parse() -> Args {
        let mut it = std::env::args().skip(1);
        let cmd = it.next().unwrap_or_else(|| usage());
        let mut opts = HashMap::new();
        while let Some(k) = it.next() {
            let Some(k) = k.strip_prefix("--") else {
                usage()
            };
            let v = it.next().unwrap_or_else(|| usage());
            opts.insert(k.to_string(), v);
        }
        Args { cmd, opts }
    }
    fn get<T: FromStr>(&self, k: &str, default: T) -> T {
        match self.opts.get(k) {
            None => default,
            Some(v) => v.parse().unwrap_or_else(|_| {
                eprintln!("bad value for --{k}: {v}");
                std::process::exit(2)
            }),
        }
    }
    fn str(&self, k: &str, default: &str) -> String {
        self.opts
            .get(k)
            .cloned()
            .unwrap_or_else(|| default.to_string())
    }
    fn list(&self, k: &str, default: &str) -> Vec<String> {
        self.str(k, default)
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: epoch_bench slowdown|pause|bytes|hot --dirtier PATH [--raw FILE] [options] \
         (see the header of checkpointer/examples/epoch_bench.rs)"
    );
    std::process::exit(2)
}

// ---------------------------------------------------------------------------------------------
// Measurements of processes and of the machine

/// Fields of /proc/PID/stat: minor faults and CPU ticks (USER_HZ) of the whole process.
#[derive(Clone, Copy, Default, Debug)]
struct PStat {
    minflt: u64,
    utime: u64,
    stime: u64,
}

fn pstat(pid: i32) -> PStat {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(i) = s.rfind(')') else {
        return PStat::default();
    };
    // After ")": field 3 (state) is index 0, so field N is index N - 3.
    let f: Vec<&str> = s[i + 1..].split_whitespace().collect();
    let n = |field: usize| f.get(field - 3).and_then(|v| v.parse().ok()).unwrap_or(0);
    PStat {
        minflt: n(10),
        utime: n(14),
        stime: n(15),
    }
}

/// CPU time (ns) of every thread of another process, from its CPU-time clock.
fn cpu_ns(pid: i32) -> u64 {
    let mut clk: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid writes one clockid_t to the pointer we pass.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clk) } != 0 {
        return 0;
    }
    clock_ns(clk)
}

fn clock_ns(clk: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to the pointer we pass.
    if unsafe { libc::clock_gettime(clk, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time of this process (the epoch thread, the ping client, encoding): the checkpointer.
fn self_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// (busy, total) jiffies of all CPUs, from /proc/stat (busy = not idle and not iowait).
fn sys_jiffies() -> (u64, u64) {
    let (busy, total, _) = sys_jiffies3();
    (busy, total)
}

/// (busy, total, user + nice + system) jiffies of all CPUs. The last is what processes are
/// charged with (irq, softirq and steal are not part of any process's utime/stime).
fn sys_jiffies3() -> (u64, u64, u64) {
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
        return (0, 0, 0);
    }
    let total: u64 = v.iter().sum();
    (total - v[3] - v[4], total, v[0] + v[1] + v[2])
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Percentage of all CPUs busy over the next `d`.
fn busy_pct(d: Duration) -> f64 {
    let (b0, t0) = sys_jiffies();
    std::thread::sleep(d);
    let (b1, t1) = sys_jiffies();
    if t1 <= t0 {
        return 0.0;
    }
    100.0 * (b1 - b0) as f64 / (t1 - t0) as f64
}

/// Before a case: the busy % over 1 s; with `limit` > 0, waits up to `limit` s for ≤ 20%.
fn wait_quiet(limit: u64) -> f64 {
    let start = Instant::now();
    let mut b = busy_pct(Duration::from_secs(1));
    while b > 20.0 && start.elapsed().as_secs() < limit {
        eprintln!("   machine {b:.0}% busy; waiting (--wait-quiet {limit})");
        std::thread::sleep(Duration::from_secs(2));
        b = busy_pct(Duration::from_secs(1));
    }
    b
}

/// Share of the machine (all CPUs) busy with processes other than ours during a window:
/// user + nice + system time of all CPUs minus the utime + stime of our processes.
struct LoadWindow {
    busy: u64,
    total: u64,
    ours: u64,
    pids: Vec<i32>,
}

fn our_ticks(pids: &[i32]) -> u64 {
    let me = pstat(std::process::id() as i32);
    pids.iter()
        .map(|&p| {
            let s = pstat(p);
            s.utime + s.stime
        })
        .sum::<u64>()
        + me.utime
        + me.stime
}

impl LoadWindow {
    fn start(pids: &[i32]) -> LoadWindow {
        let (_, total, busy) = sys_jiffies3();
        LoadWindow {
            busy,
            total,
            ours: our_ticks(pids),
            pids: pids.to_vec(),
        }
    }
    /// Other processes' share of all CPUs, %.
    fn other_pct(&self) -> f64 {
        let (_, t, b) = sys_jiffies3();
        let ours = our_ticks(&self.pids);
        if t <= self.total {
            return 0.0;
        }
        let other = (b - self.busy) as f64 - (ours - self.ours) as f64;
        (100.0 * other / (t - self.total) as f64).max(0.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics and output

fn med(v: &[f64]) -> f64 {
    pct(v, 0.5)
}
fn col(st: &[EpochStats], f: impl Fn(&EpochStats) -> u64) -> Vec<f64> {
    st.iter().map(|s| f(s) as f64).collect()
}
/// `x` with `digits` decimals, "–" for NaN.
fn fixed(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "–".into()
    } else {
        format!("{x:.digits$}")
    }
}
fn f0(x: f64) -> String {
    fixed(x, 0)
}
fn f1(x: f64) -> String {
    fixed(x, 1)
}
fn f2(x: f64) -> String {
    fixed(x, 2)
}
/// Thousands separators for integers in tables.
fn n0(x: f64) -> String {
    if x.is_nan() {
        return "–".into();
    }
    let s = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 { format!("-{out}") } else { out }
}

/// A JSON object built by hand (the checkpointer has no serde_json).
#[derive(Default)]
struct Json(Vec<String>);
impl Json {
    fn s(mut self, k: &str, v: &str) -> Self {
        self.0.push(format!(
            "\"{k}\":\"{}\"",
            v.replace('\\', "\\\\").replace('"', "\\\"")
        ));
        self
    }
    fn n(mut self, k: &str, v: f64) -> Self {
        let v = if v.is_finite() {
            format!("{}", (v * 1000.0).round() / 1000.0)
        } else {
            "null".into()
        };
        self.0.push(format!("\"{k}\":{v}"));
        self
    }
    fn raw(mut self, k: &str, v: String) -> Self {
        self.0.push(format!("\"{k}\":{v}"));
        self
    }
    fn done(self) -> String {
        format!("{{{}}}", self.0.join(","))
    }
}

fn stats_json(s: &EpochStats) -> String {
    macro_rules! fields {
        ($($f:ident),*) => {{
            let mut j = Json::default();
            $( j = j.n(stringify!($f), s.$f as f64); )*
            j.raw("capped", s.capped.to_string()).done()
        }};
    }
    fields!(
        epoch,
        interval_us,
        pause_us,
        quiesce_us,
        scan_us,
        copy_us,
        layout_us,
        meta_checks_us,
        meta_threads_us,
        meta_process_us,
        meta_fds_us,
        meta_pending_us,
        walk_us,
        resume_us,
        take_us,
        precheck_us,
        hot_us,
        cow_us,
        encode_us,
        dirty_pages,
        hot_pages,
        fresh_pages,
        raw_bytes,
        encoded_bytes,
        zero_pages,
        same_pages,
        delta_pages,
        compressed_pages,
        raw_pages,
        twin_bytes
    )
}

struct Raw {
    file: Option<std::fs::File>,
    epochs: bool,
}
impl Raw {
    fn open(a: &Args) -> Raw {
        let file = a.opts.get("raw").map(|p| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap_or_else(|e| panic!("opening {p}: {e}"))
        });
        Raw {
            file,
            epochs: a.get("raw-epochs", 0u32) == 1,
        }
    }
    fn line(&mut self, s: &str) {
        if let Some(f) = &mut self.file {
            let _ = writeln!(f, "{s}");
        }
    }
    /// One line per epoch of a case (with `--raw-epochs 1`).
    fn epochs(&mut self, case: &str, st: &[EpochStats], minflt: &[u64]) {
        if !self.epochs {
            return;
        }
        for (i, s) in st.iter().enumerate() {
            let mut j = format!("{{\"case\":\"{case}\",\"stats\":{}", stats_json(s));
            if let Some(m) = minflt.get(i) {
                j.push_str(&format!(",\"minflt_delta\":{m}"));
            }
            j.push('}');
            self.line(&j);
        }
    }
}

fn say(s: &str) {
    println!("{s}");
    let _ = std::io::stdout().flush();
}

// ---------------------------------------------------------------------------------------------
// Targets

/// A child process killed (SIGKILL) and reaped on drop.
struct Target {
    child: Child,
    pid: i32,
}
impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn udp_client(port: u16) -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
    s.connect(("127.0.0.1", port)).expect("udp connect");
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    s
}

/// One ping: (round trip, dirtier's page-write counter), or None when no reply came in 500 ms.
fn ping(s: &UdpSocket) -> Option<(Duration, u64)> {
    let mut buf = [0u8; 256];
    // Drop any late reply to an earlier ping first.
    s.set_nonblocking(true).ok();
    while s.recv(&mut buf).is_ok() {}
    s.set_nonblocking(false).ok();
    let t = Instant::now();
    s.send(b"ping").ok()?;
    let n = s.recv(&mut buf).ok()?;
    let rtt = t.elapsed();
    let txt = std::str::from_utf8(&buf[..n]).ok()?;
    let count = txt
        .strip_prefix("pong ")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((rtt, count))
}

fn spawn_dirtier(path: &str, port: u16, mb: u64, rate: f64) -> Target {
    let child = Command::new(path)
        .args(["--port", &port.to_string(), "--mb", &mb.to_string()])
        .args(["--rate-mbps", &format!("{rate}")])
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {path}: {e}"));
    let pid = child.id() as i32;
    let mut t = Target { child, pid };
    let s = udp_client(port);
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    for _ in 0..500 {
        if let Ok(Some(st)) = t.child.try_wait() {
            panic!("dirtier exited: {st} (port {port} in use?)");
        }
        if ping(&s).is_some() {
            return t;
        }
        // Before the dirtier binds, the send draws an ICMP "port unreachable" at once.
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("dirtier on port {port} does not answer");
}

fn redis_cmd(port: u16, cmd: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("{cmd}\r\n").as_bytes()).ok()?;
    let mut buf = vec![0u8; 65536];
    let n = s.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// redis-server (no persistence) plus redis-benchmark loading it; both killed on drop.
struct Redis {
    // Dropped in this order: the load first, then the server.
    bench: Target,
    server: Target,
    port: u16,
    log: String,
}

/// `rand`: instead of the prescribed `-t set,get,incr,lpush -d 64` (every value is the same 64
/// bytes of "x"), SETs of values made of four random numbers (`__rand_int__`).
fn start_redis(a: &Args, rand: bool) -> Redis {
    let port: u16 = a.get("redis-port", 16390);
    let server = Command::new(a.str("redis-server", "redis-server"))
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--daemonize", "no", "--logfile", ""])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawning redis-server");
    let server = Target {
        pid: server.id() as i32,
        child: server,
    };
    let mut up = false;
    for _ in 0..500 {
        if redis_cmd(port, "PING").is_some_and(|r| r.starts_with("+PONG")) {
            up = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(up, "redis-server on port {port} does not answer");
    let log = a.str("bench-log", "/dev/null");
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(&log) {
        let _ = writeln!(
            f,
            "\n== redis-benchmark, {} values, started {:?} after the epoch_bench start",
            if rand { "random" } else { "fixed" },
            START.elapsed()
        );
    }
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .expect("bench log");
    let mut cmd = Command::new(a.str("redis-benchmark", "redis-benchmark"));
    cmd.args(["-p", &port.to_string()]);
    if rand {
        cmd.args([
            "-r",
            "100000",
            "-n",
            "10000000",
            "-q",
            "SET",
            "key:__rand_int__",
        ])
        .arg("v:__rand_int__:__rand_int__:__rand_int__:__rand_int__");
    } else {
        cmd.args([
            "-t",
            "set,get,incr,lpush",
            "-r",
            "100000",
            "-d",
            "64",
            "-n",
            "10000000",
            "-q",
        ]);
    }
    let bench = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .spawn()
        .expect("spawning redis-benchmark");
    let bench = Target {
        pid: bench.id() as i32,
        child: bench,
    };
    let warm = a.get("redis-warmup-s", 3u64);
    eprintln!(
        "   redis-server pid {}, redis-benchmark pid {}; warming up {warm} s",
        server.pid, bench.pid
    );
    std::thread::sleep(Duration::from_secs(warm));
    Redis {
        server,
        bench,
        port,
        log,
    }
}

impl Redis {
    /// What redis-benchmark is doing now (the last progress line of its log).
    fn phase(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let last = s
            .split(['\r', '\n'])
            .rev()
            .find(|l| l.contains("rps=") || l.contains("requests per second"))
            .unwrap_or("")
            .trim()
            .to_string();
        last.split(" (overall").next().unwrap_or("").to_string()
    }
    /// Commands processed since the server started (INFO stats).
    fn ops(&self) -> f64 {
        redis_cmd(self.port, "INFO stats")
            .and_then(|r| {
                r.lines()
                    .find_map(|l| l.strip_prefix("total_commands_processed:"))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .unwrap_or(f64::NAN)
    }
    fn used_memory_mb(&self) -> f64 {
        redis_cmd(self.port, "INFO memory")
            .and_then(|r| {
                r.lines()
                    .find_map(|l| l.strip_prefix("used_memory:"))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .map_or(f64::NAN, |b| b / 1048576.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Epoch runs

/// Starts the loop, runs `warmup` epochs (discarded), then epochs until `n` are collected or
/// `until` passes. `each` runs after every collected epoch (checkpoint, stats).
/// A bench target running: the dirtier at `rate` MB/s, or redis under redis-benchmark.
struct Loaded {
    pid: i32,
    /// Every process of the target (for the load window).
    pids: Vec<i32>,
    _dirtier: Option<Target>,
    redis: Option<Redis>,
    label: String,
}

/// Redis operations per second since `ops0` (NaN without redis).
fn ops_rate(r: Option<&Redis>, ops0: Option<(f64, Instant)>) -> f64 {
    match (r, ops0) {
        (Some(r), Some((o, t))) => (r.ops() - o) / t.elapsed().as_secs_f64(),
        _ => f64::NAN,
    }
}

/// Share of epochs ended early by the cap, in %.
fn capped_pct(st: &[EpochStats]) -> f64 {
    100.0 * st.iter().filter(|s| s.capped).count() as f64 / st.len() as f64
}

fn start_target(a: &Args, target: &str, rate: f64) -> Loaded {
    match target {
        "dirtier" => {
            let d = spawn_dirtier(
                &a.str("dirtier", "target/bench/dirtier"),
                a.get("port", 17100),
                a.get("mb", 100),
                rate,
            );
            Loaded {
                pid: d.pid,
                pids: vec![d.pid],
                _dirtier: Some(d),
                redis: None,
                label: format!("dirtier {rate} MB/s"),
            }
        }
        "redis" | "redis-rand" => {
            let rand = target == "redis-rand";
            let r = start_redis(a, rand);
            let label = if rand {
                "redis, random values"
            } else {
                "redis + redis-benchmark"
            };
            Loaded {
                pid: r.server.pid,
                pids: vec![r.server.pid, r.bench.pid],
                _dirtier: None,
                redis: Some(r),
                label: label.to_string(),
            }
        }
        t => panic!("unknown target {t}"),
    }
}

fn run_epochs(
    pid: i32,
    cfg: EpochConfig,
    warmup: usize,
    n: usize,
    until: Option<Instant>,
    mut each: impl FnMut(&Checkpoint, &EpochStats),
) -> Result<(Vec<EpochStats>, EpochStats), String> {
    let (mut ep, _full, st0) = Epochs::start(pid, cfg).map_err(|e| format!("start: {e}"))?;
    for i in 0..warmup {
        ep.next().map_err(|e| format!("warm-up epoch {i}: {e}"))?;
    }
    let mut out = Vec::with_capacity(n);
    while out.len() < n && until.is_none_or(|u| Instant::now() < u) {
        let (ck, st) = ep.next().map_err(|e| format!("epoch {}: {e}", out.len()))?;
        each(&ck, &st);
        out.push(st);
    }
    ep.stop();
    Ok((out, st0))
}

/// The default configuration; the tracker comes from `$TRACKER` (`uffd`, the default, or
/// `mprotect`) so every part can be run under either, the encoding's budget from
/// `$ENCODE_BUDGET`.
fn cfg_base() -> EpochConfig {
    EpochConfig {
        tracker: std::env::var("TRACKER")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or_default(),
        precopy: std::env::var("PRECOPY").map_or(true, |v| v != "0"),
        encode_budget: std::env::var("ENCODE_BUDGET")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(tardi_checkpointer::epoch::DEFAULT_ENCODE_BUDGET),
        ..EpochConfig::default()
    }
}

fn cfg_desc(c: &EpochConfig) -> String {
    format!(
        "tracker {:?}, precopy {}, encode budget {}, interval {} ms, min {} ms, cap {}, hot_epochs {}, cold 1/{}, codec {}, twins {} MiB, refresh every {}",
        c.tracker,
        c.precopy,
        c.encode_budget,
        c.interval.as_millis(),
        c.min_interval.as_millis(),
        if c.cap_pages == 0 {
            "off".into()
        } else {
            c.cap_pages.to_string()
        },
        c.hot_epochs,
        c.cold_one_in,
        c.codec,
        c.twin_budget >> 20,
        c.refresh_every
    )
}

// ---------------------------------------------------------------------------------------------
// 1. Slowdown of the dirtying service

struct SlowRow {
    achieved_mbps: f64,
    cpu_ms_s: f64,
    cpu_ms_per_mb: f64,
    utime_s: f64,
    stime_s: f64,
    minflt_s: f64,
    pages_s: f64,
    rtt: Vec<f64>,
    lost: usize,
    epochs: Vec<EpochStats>,
    ckpt_cpu_ms_s: f64,
    other: f64,
    busy_before: f64,
}

fn slowdown(a: &Args, raw: &mut Raw) {
    let dirtier = a.str("dirtier", "target/bench/dirtier");
    let port: u16 = a.get("port", 17100);
    let mb: u64 = a.get("mb", 100);
    let secs: f64 = a.get("secs", 6.0);
    let npings: usize = a.get("pings", 200);
    let reps: usize = a.get("reps", 1);
    let wq: u64 = a.get("wait-quiet", 0);
    let rates: Vec<f64> = a
        .list("rates", "0,10,50,200")
        .iter()
        .map(|r| r.parse().expect("rate"))
        .collect();
    let modes = a.list("modes", "none,uffd,uffd-nocap");
    let settle = Duration::from_millis(a.get("settle-ms", 500));
    say(&format!(
        "### Slowdown of the dirtier ({mb} MiB region), {secs} s per case, {npings} pings per case\n\n\
         Load average at start: {}. `uffd`: {}. `uffd-nocap`: the same with cap off.\n",
        loadavg(),
        cfg_desc(&cfg_base())
    ));
    say(
        "| MB/s | rep | mode | achieved MB/s | dirtier CPU ms/s | × | CPU ms per MB | utime / stime ms/s | minflt/s | pages/s | ping median µs | × | ping p99 µs | × | ping max µs | lost | epochs | pause median µs | pause p99 µs | dirty pages median | checkpointer CPU ms/s | other load % | CPU busy before % |",
    );
    say(
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    );
    for &rate in &rates {
        for rep in 1..=reps {
            let mut base: Option<(f64, f64, f64)> = None;
            for mode in &modes {
                let r = slowdown_case(&dirtier, port, mb, rate, mode, secs, npings, settle, wq);
                let (cb, mb_, pb) =
                    *base.get_or_insert((r.cpu_ms_s, med(&r.rtt), pct(&r.rtt, 0.99)));
                let x = |v: f64, b: f64| {
                    if mode == "none" {
                        "1".into()
                    } else {
                        f2(v / b)
                    }
                };
                let pause = col(&r.epochs, |s| s.pause_us);
                let dirty = col(&r.epochs, |s| s.dirty_pages);
                say(&format!(
                    "| {} | {rep} | {mode} | {} ({:.0}%) | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    rate,
                    f1(r.achieved_mbps),
                    if rate > 0.0 {
                        100.0 * r.achieved_mbps / rate
                    } else {
                        100.0
                    },
                    f1(r.cpu_ms_s),
                    x(r.cpu_ms_s, cb),
                    if rate > 0.0 {
                        f2(r.cpu_ms_per_mb)
                    } else {
                        "–".into()
                    },
                    f0(r.utime_s),
                    f0(r.stime_s),
                    n0(r.minflt_s),
                    n0(r.pages_s),
                    f0(med(&r.rtt)),
                    x(med(&r.rtt), mb_),
                    f0(pct(&r.rtt, 0.99)),
                    x(pct(&r.rtt, 0.99), pb),
                    f0(pct(&r.rtt, 1.0)),
                    r.lost,
                    r.epochs.len(),
                    f0(med(&pause)),
                    f0(pct(&pause, 0.99)),
                    f0(med(&dirty)),
                    f1(r.ckpt_cpu_ms_s),
                    f0(r.other),
                    f0(r.busy_before),
                ));
                let case = format!("slowdown/{rate}/{mode}/{rep}");
                raw.epochs(&case, &r.epochs, &[]);
                raw.line(
                    &Json::default()
                        .s("bench", "slowdown")
                        .n("rate_mbps", rate)
                        .n("rep", rep as f64)
                        .s("mode", mode)
                        .n("secs", secs)
                        .n("achieved_mbps", r.achieved_mbps)
                        .n("pages_per_s", r.pages_s)
                        .n("dirtier_cpu_ms_per_s", r.cpu_ms_s)
                        .n("dirtier_cpu_ms_per_mb", r.cpu_ms_per_mb)
                        .n("utime_ms_per_s", r.utime_s)
                        .n("stime_ms_per_s", r.stime_s)
                        .n("minflt_per_s", r.minflt_s)
                        .raw(
                            "rtt_us",
                            format!(
                                "{:?}",
                                r.rtt.iter().map(|x| x.round() as u64).collect::<Vec<_>>()
                            ),
                        )
                        .n("lost", r.lost as f64)
                        .n("epochs", r.epochs.len() as f64)
                        .n("pause_us_median", med(&pause))
                        .n("pause_us_p99", pct(&pause, 0.99))
                        .n("dirty_median", med(&dirty))
                        .n("checkpointer_cpu_ms_per_s", r.ckpt_cpu_ms_s)
                        .n("other_load_pct", r.other)
                        .n("cpu_busy_before_pct", r.busy_before)
                        .s("loadavg_after", &loadavg())
                        .done(),
                );
            }
        }
    }
    say("");
}

#[allow(clippy::too_many_arguments)]
fn slowdown_case(
    path: &str,
    port: u16,
    mb: u64,
    rate: f64,
    mode: &str,
    secs: f64,
    npings: usize,
    settle: Duration,
    wq: u64,
) -> SlowRow {
    let busy_before = wait_quiet(wq);
    let t = spawn_dirtier(path, port, mb, rate);
    let pid = t.pid;
    let window = Duration::from_secs_f64(secs);
    let cfg = match mode {
        "none" => None,
        "uffd" => Some(cfg_base()),
        "uffd-nocap" => Some(EpochConfig {
            cap_pages: 0,
            ..cfg_base()
        }),
        "uffd-noprecopy" => Some(EpochConfig {
            precopy: false,
            ..cfg_base()
        }),
        "mprotect" => Some(EpochConfig {
            tracker: tardi_checkpointer::track::TrackerKind::Mprotect,
            ..cfg_base()
        }),
        m => panic!("unknown mode {m}"),
    };
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    let mut rtt = Vec::new();
    let mut lost = 0;
    let mut epochs = Vec::new();
    let mut m = None;
    std::thread::scope(|sc| {
        // The ping client: waits for the window to open, then sends `npings` pings spread over
        // it, each after a random 0.5–1.5 × spacing (no lock-step with the epochs).
        let pinger = sc.spawn(|| {
            let s = udp_client(port);
            while !started.load(Ordering::Acquire) {
                if stop.load(Ordering::Acquire) {
                    return (Vec::new(), 0);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let spacing = window.as_secs_f64() / npings as f64;
            let mut rng: u64 = 0x2545_F491_4F6C_DD1D ^ (rate as u64 + 1);
            let (mut v, mut lost) = (Vec::new(), 0);
            for _ in 0..npings {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let f = 0.5 + (rng % 1000) as f64 / 1000.0;
                std::thread::sleep(Duration::from_secs_f64(spacing * f));
                if stop.load(Ordering::Acquire) {
                    break;
                }
                match ping(&s) {
                    Some((d, _)) => v.push(d.as_secs_f64() * 1e6),
                    None => lost += 1,
                }
            }
            (v, lost)
        });
        let ctl = udp_client(port);
        let open = |ctl: &UdpSocket| {
            let c = ping(ctl).map_or(0, |p| p.1);
            (
                Instant::now(),
                c,
                pstat(pid),
                cpu_ns(pid),
                self_cpu_ns(),
                LoadWindow::start(&[pid]),
            )
        };
        let close = |ctl: &UdpSocket, o: &(Instant, u64, PStat, u64, u64, LoadWindow)| {
            let c = ping(ctl).map_or(0, |p| p.1);
            let wall = o.0.elapsed().as_secs_f64();
            let ps = pstat(pid);
            let cpu = cpu_ns(pid) - o.3;
            let me = self_cpu_ns() - o.4;
            let other = o.5.other_pct();
            (wall, c - o.1, ps, cpu, me, other)
        };
        let res = match cfg {
            None => {
                std::thread::sleep(settle);
                let o = open(&ctl);
                started.store(true, Ordering::Release);
                std::thread::sleep(window);
                let c = close(&ctl, &o);
                Some((o, c))
            }
            Some(cfg) => {
                let deadline = std::cell::Cell::new(None::<Instant>);
                let mut opened = None;
                let r = (|| -> Result<(), String> {
                    let (mut ep, _full, _st0) =
                        Epochs::start(pid, cfg).map_err(|e| format!("start: {e}"))?;
                    let t0 = Instant::now();
                    while t0.elapsed() < settle {
                        ep.next().map_err(|e| e.to_string())?;
                    }
                    opened = Some(open(&ctl));
                    started.store(true, Ordering::Release);
                    deadline.set(Some(Instant::now() + window));
                    while Instant::now() < deadline.get().unwrap() {
                        let (_ck, st) = ep.next().map_err(|e| e.to_string())?;
                        epochs.push(st);
                    }
                    Ok(())
                })();
                let out = opened.map(|o| {
                    let c = close(&ctl, &o);
                    (o, c)
                });
                if let Err(e) = r {
                    eprintln!("   {mode} at {rate} MB/s: epoch loop failed: {e}");
                }
                out
            }
        };
        stop.store(true, Ordering::Release);
        let (v, l) = pinger.join().unwrap();
        rtt = v;
        lost = l;
        m = res;
    });
    let (o, (wall, pages, ps, cpu, me, other)) = m.expect("the window never opened");
    let ps0 = o.2;
    let hz = 100.0; // USER_HZ
    let mbs = pages as f64 * PAGE / 1e6;
    SlowRow {
        achieved_mbps: mbs / wall,
        cpu_ms_s: cpu as f64 / 1e6 / wall,
        cpu_ms_per_mb: cpu as f64 / 1e6 / mbs,
        utime_s: (ps.utime - ps0.utime) as f64 / hz * 1000.0 / wall,
        stime_s: (ps.stime - ps0.stime) as f64 / hz * 1000.0 / wall,
        minflt_s: (ps.minflt - ps0.minflt) as f64 / wall,
        pages_s: pages as f64 / wall,
        rtt,
        lost,
        epochs,
        ckpt_cpu_ms_s: me as f64 / 1e6 / wall,
        other,
        busy_before,
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Pause time against dirty pages

fn pause(a: &Args, raw: &mut Raw) {
    let dirtier = a.str("dirtier", "target/bench/dirtier");
    let port: u16 = a.get("port", 17100);
    let mb: u64 = a.get("mb", 100);
    let wq: u64 = a.get("wait-quiet", 0);
    let warmup: usize = a.get("warmup", 20);
    let hot: u32 = a.get("hot-epochs", 3);
    // pages:interval_ms:epochs
    let points = a.list(
        "points",
        "10:10:500,100:10:500,700:10:500,1000:10:500,10000:100:200",
    );
    let c0 = EpochConfig {
        cap_pages: 0,
        hot_epochs: hot,
        ..cfg_base()
    };
    say(&format!(
        "### Pause per epoch against dirty pages (dirtier, {mb} MiB region)\n\n\
         Load average at start: {}. Config: {} (interval per row). Rate = pages × 4096 B / interval. \
         {warmup} warm-up epochs discarded. Times in µs: median / p90 (p99, max for the pause). \
         rest = pause − quiesce − scan − copy (layout and thread state, resume).\n",
        loadavg(),
        cfg_desc(&c0)
    ));
    say(
        "| target pages | interval ms | rate MB/s | epochs | dirty pages median (p10–p90) | hot median | pause median | pause p90 | pause p99 | pause max | quiesce | scan | copy | rest | encode (off the pause) | other load % | CPU busy before % |",
    );
    say("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in points {
        let f: Vec<f64> = p.split(':').map(|x| x.parse().expect("points")).collect();
        let (pages, ims, n) = (f[0], f[1], f[2] as usize);
        let rate = pages * PAGE / (ims * 1000.0);
        let busy = wait_quiet(wq);
        let t = spawn_dirtier(&dirtier, port, mb, rate);
        let cfg = EpochConfig {
            interval: Duration::from_secs_f64(ims / 1000.0),
            ..c0.clone()
        };
        let lw = LoadWindow::start(&[t.pid]);
        let r = run_epochs(t.pid, cfg, warmup, n, None, |_, _| {});
        let other = lw.other_pct();
        drop(t);
        let st = match r {
            Ok((st, _)) => st,
            Err(e) => {
                say(&format!("| {pages} | {ims} | {rate:.2} | FAILED: {e} |"));
                continue;
            }
        };
        let g = |f: fn(&EpochStats) -> u64| col(&st, f);
        let (pz, q, sc, cp, en, d, h) = (
            g(|s| s.pause_us),
            g(|s| s.quiesce_us),
            g(|s| s.scan_us),
            g(|s| s.copy_us),
            g(|s| s.encode_us),
            g(|s| s.dirty_pages),
            g(|s| s.hot_pages),
        );
        let rest: Vec<f64> = st
            .iter()
            .map(|s| s.pause_us as f64 - (s.quiesce_us + s.scan_us + s.copy_us) as f64)
            .collect();
        let mp = |v: &[f64]| format!("{} / {}", f0(med(v)), f0(pct(v, 0.9)));
        say(&format!(
            "| {} | {ims} | {:.2} | {} | {} ({}–{}) | {} | **{}** | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            n0(pages),
            rate,
            st.len(),
            n0(med(&d)),
            n0(pct(&d, 0.1)),
            n0(pct(&d, 0.9)),
            f0(med(&h)),
            f0(med(&pz)),
            f0(pct(&pz, 0.9)),
            f0(pct(&pz, 0.99)),
            f0(pct(&pz, 1.0)),
            mp(&q),
            mp(&sc),
            mp(&cp),
            mp(&rest),
            mp(&en),
            f0(other),
            f0(busy)
        ));
        raw.epochs(&format!("pause/{pages}/{ims}"), &st, &[]);
        raw.line(
            &Json::default()
                .s("bench", "pause")
                .n("target_pages", pages)
                .n("interval_ms", ims)
                .n("rate_mbps", rate)
                .n("epochs", st.len() as f64)
                .n("dirty_median", med(&d))
                .n("pause_median", med(&pz))
                .n("pause_p90", pct(&pz, 0.9))
                .n("pause_p99", pct(&pz, 0.99))
                .n("pause_max", pct(&pz, 1.0))
                .n("quiesce_median", med(&q))
                .n("scan_median", med(&sc))
                .n("copy_median", med(&cp))
                .n("rest_median", med(&rest))
                .n("encode_median", med(&en))
                .n("other_load_pct", other)
                .n("cpu_busy_before_pct", busy)
                .done(),
        );
    }
    say("");
}

// ---------------------------------------------------------------------------------------------
// 3. Bytes per epoch, per codec

struct Sums {
    raw: f64,
    enc: f64,
    ser: f64,
    pages: [f64; 5],
}

fn bytes(a: &Args, raw: &mut Raw) {
    let targets = a.list("targets", "dirtier,redis");
    let codecs: Vec<Codec> = a
        .list("codecs", "xor-zstd,zstd,xdelta3,raw")
        .iter()
        .map(|c| c.parse().expect("codec"))
        .collect();
    let n: usize = a.get("epochs", 300);
    let warmup: usize = a.get("warmup", 50);
    let wq: u64 = a.get("wait-quiet", 0);
    let rate: f64 = a.get("rate", 50.0);
    say(&format!(
        "### Bytes per epoch, per codec\n\nLoad average at start: {}. Config: {} (codec per row). \
         {warmup} warm-up epochs discarded (twins fill), then {n} epochs. raw = (dirty + fresh) × 4 KiB; \
         encoded = page bytes after zero/same detection, twin diff and codec; file = the whole \
         serialized incremental checkpoint (header, metadata, page table, page bytes). Ratios are \
         sums over the epochs. Page classes as % of saved pages.\n",
        loadavg(),
        cfg_desc(&cfg_base())
    ));
    say(
        "| target | codec | epochs | dirty pages median | raw KiB median | encoded KiB median | encoded / raw | file / raw | zero % | same % | delta % | compressed % | raw % | twins MiB median (max) | encode µs median | pause µs median | capped % | redis ops/s | other load % | CPU busy before % |",
    );
    say(
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    );
    for target in &targets {
        let busy = wait_quiet(wq);
        let Loaded {
            pid,
            pids,
            _dirtier,
            redis: keep_r,
            label,
        } = start_target(a, target, rate);
        for &codec in &codecs {
            let cfg = EpochConfig {
                codec,
                ..cfg_base()
            };
            let mut sums = Sums {
                raw: 0.0,
                enc: 0.0,
                ser: 0.0,
                pages: [0.0; 5],
            };
            let lw = LoadWindow::start(&pids);
            let phase0 = keep_r.as_ref().map(|r| r.phase());
            let ops0 = keep_r.as_ref().map(|r| (r.ops(), Instant::now()));
            let r = run_epochs(pid, cfg, warmup, n, None, |ck, st| {
                sums.raw += st.raw_bytes as f64;
                sums.enc += st.encoded_bytes as f64;
                sums.ser += ck.write_to(&mut std::io::sink()).unwrap_or(0) as f64;
                for (i, v) in [
                    st.zero_pages,
                    st.same_pages,
                    st.delta_pages,
                    st.compressed_pages,
                    st.raw_pages,
                ]
                .into_iter()
                .enumerate()
                {
                    sums.pages[i] += v as f64;
                }
            });
            let other = lw.other_pct();
            let ops_s = ops_rate(keep_r.as_ref(), ops0);
            let st = match r {
                Ok((st, _)) => st,
                Err(e) => {
                    say(&format!("| {label} | {codec} | FAILED: {e} |"));
                    continue;
                }
            };
            let total_pages: f64 = sums.pages.iter().sum();
            let pc = |i: usize| f1(100.0 * sums.pages[i] / total_pages);
            let tw = col(&st, |s| s.twin_bytes);
            let d = col(&st, |s| s.dirty_pages);
            let rb = col(&st, |s| s.raw_bytes);
            let eb = col(&st, |s| s.encoded_bytes);
            let extra = keep_r
                .as_ref()
                .map(|r| {
                    format!(
                        " (load: {} → {}; used_memory {:.0} MiB)",
                        phase0.clone().unwrap_or_default(),
                        r.phase(),
                        r.used_memory_mb()
                    )
                })
                .unwrap_or_default();
            let capped = capped_pct(&st);
            say(&format!(
                "| {label} | {codec} | {} | {} | {} | {} | **{:.1}%** | {:.1}% | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} |",
                st.len(),
                n0(med(&d)),
                n0(med(&rb) / 1024.0),
                f1(med(&eb) / 1024.0),
                100.0 * sums.enc / sums.raw,
                100.0 * sums.ser / sums.raw,
                pc(0),
                pc(1),
                pc(2),
                pc(3),
                pc(4),
                f1(med(&tw) / 1048576.0),
                f1(pct(&tw, 1.0) / 1048576.0),
                f0(med(&col(&st, |s| s.encode_us))),
                f0(med(&col(&st, |s| s.pause_us))),
                f0(capped),
                n0(ops_s),
                f0(other),
                f0(busy)
            ));
            if !extra.is_empty() {
                eprintln!("   {codec}{extra}");
            }
            raw.epochs(&format!("bytes/{target}/{codec}"), &st, &[]);
            raw.line(
                &Json::default()
                    .s("bench", "bytes")
                    .s("target", &label)
                    .s("codec", codec.name())
                    .n("epochs", st.len() as f64)
                    .n("raw_bytes_sum", sums.raw)
                    .n("encoded_bytes_sum", sums.enc)
                    .n("file_bytes_sum", sums.ser)
                    .n("zero", sums.pages[0])
                    .n("same", sums.pages[1])
                    .n("delta", sums.pages[2])
                    .n("compressed", sums.pages[3])
                    .n("raw", sums.pages[4])
                    .n("twin_bytes_median", med(&tw))
                    .n("twin_bytes_max", pct(&tw, 1.0))
                    .n("dirty_median", med(&d))
                    .s("redis_load", &extra)
                    .n("redis_ops_per_s", ops_s)
                    .n("capped_pct", capped)
                    .n("pause_median", med(&col(&st, |s| s.pause_us)))
                    .n("quiesce_median", med(&col(&st, |s| s.quiesce_us)))
                    .n("scan_median", med(&col(&st, |s| s.scan_us)))
                    .n("copy_median", med(&col(&st, |s| s.copy_us)))
                    .n("encode_median", med(&col(&st, |s| s.encode_us)))
                    .n("other_load_pct", other)
                    .n("cpu_busy_before_pct", busy)
                    .done(),
            );
        }
    }
    say("");
}

// ---------------------------------------------------------------------------------------------
// 4. Hot pages on / off

fn hot(a: &Args, raw: &mut Raw) {
    let targets = a.list("targets", "redis,dirtier");
    let n: usize = a.get("epochs", 300);
    let warmup: usize = a.get("warmup", 30);
    let rounds: usize = a.get("rounds", 2);
    let wq: u64 = a.get("wait-quiet", 0);
    let rate: f64 = a.get("rate", 50.0);
    let base_secs: f64 = a.get("baseline-secs", 3.0);
    say(&format!(
        "### Hot pages on (hot_epochs 3) / off (0)\n\nLoad average at start: {}. Config otherwise: {}. \
         {warmup} warm-up epochs discarded, then {n} epochs, {rounds} interleaved rounds. \
         faults = the target's minor-fault count (/proc/PID/stat field 10) read after each epoch (mprotect tracker: its agent's count of pages it made writable, system-call buffers included), \
         difference from the previous read; untracked = the same count over {base_secs} s before \
         the loop starts, scaled to one median epoch (interval + pause).\n",
        loadavg(),
        cfg_desc(&cfg_base())
    ));
    say(
        "| target | hot_epochs | round | epochs | epoch ms median | dirty pages median | hot pages median | dirty − hot median | faults / epoch median (mean) | untracked faults / epoch | pause µs median | pause p90 | quiesce µs median | scan µs median | copy µs median | encoded KiB median | capped % | redis ops/s (untracked) | other load % | CPU busy before % |",
    );
    say(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    );
    for target in &targets {
        let busy = wait_quiet(wq);
        let Loaded {
            pid,
            pids,
            _dirtier,
            redis: keep_r,
            label,
        } = start_target(a, target, rate);
        // Untracked fault rate.
        let f0_ = pstat(pid).minflt;
        let o0 = keep_r.as_ref().map_or(f64::NAN, |r| r.ops());
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(base_secs));
        let untracked_per_s = (pstat(pid).minflt - f0_) as f64 / t0.elapsed().as_secs_f64();
        let untracked_ops = keep_r.as_ref().map_or(f64::NAN, |r| r.ops()) - o0;
        let untracked_ops_s = untracked_ops / t0.elapsed().as_secs_f64();
        for round in 1..=rounds {
            for h in [3u32, 0] {
                let cfg = EpochConfig {
                    hot_epochs: h,
                    ..cfg_base()
                };
                let mut faults: Vec<u64> = Vec::new();
                let mut last = None::<u64>;
                let mut times: Vec<f64> = Vec::new();
                let mut last_t = None::<Instant>;
                let lw = LoadWindow::start(&pids);
                let ops0 = keep_r.as_ref().map(|r| (r.ops(), Instant::now()));
                let r = run_epochs(pid, cfg, warmup, n, None, |_, _| {
                    let m = pstat(pid).minflt;
                    let now = Instant::now();
                    if let (Some(l), Some(lt)) = (last, last_t) {
                        faults.push(m - l);
                        times.push(now.duration_since(lt).as_secs_f64() * 1e3);
                    }
                    last = Some(m);
                    last_t = Some(now);
                });
                let other = lw.other_pct();
                let ops_s = ops_rate(keep_r.as_ref(), ops0);
                let st = match r {
                    Ok((st, _)) => st,
                    Err(e) => {
                        say(&format!("| {label} | {h} | {round} | FAILED: {e} |"));
                        continue;
                    }
                };
                // faults[i] belongs to epoch i + 1 (the first read has no predecessor). The
                // mprotect tracker's faults are signals, not minor faults: its own count.
                let fv: Vec<f64> = if st.iter().all(|s| s.write_faults.is_some()) {
                    st.iter()
                        .map(|s| s.write_faults.unwrap_or(0) as f64)
                        .collect()
                } else {
                    faults.iter().map(|&x| x as f64).collect()
                };
                let d = col(&st, |s| s.dirty_pages);
                let hp = col(&st, |s| s.hot_pages);
                let cold: Vec<f64> = st
                    .iter()
                    .map(|s| (s.dirty_pages - s.hot_pages) as f64)
                    .collect();
                let pz = col(&st, |s| s.pause_us);
                let ep_ms = med(&times);
                let capped = capped_pct(&st);
                say(&format!(
                    "| {label} | {h} | {round} | {} | {} | {} | {} | {} | {} ({}) | {} | **{}** | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} |",
                    st.len(),
                    f1(ep_ms),
                    n0(med(&d)),
                    n0(med(&hp)),
                    n0(med(&cold)),
                    n0(med(&fv)),
                    n0(mean(&fv)),
                    f1(untracked_per_s * ep_ms / 1000.0),
                    f0(med(&pz)),
                    f0(pct(&pz, 0.9)),
                    f0(med(&col(&st, |s| s.quiesce_us))),
                    f0(med(&col(&st, |s| s.scan_us))),
                    f0(med(&col(&st, |s| s.copy_us))),
                    f1(med(&col(&st, |s| s.encoded_bytes)) / 1024.0),
                    f0(capped),
                    n0(ops_s),
                    n0(untracked_ops_s),
                    f0(other),
                    f0(busy)
                ));
                let mut fl = vec![0u64];
                fl.extend(faults.iter().copied());
                raw.epochs(&format!("hot/{target}/{h}/{round}"), &st, &fl);
                raw.line(
                    &Json::default()
                        .s("bench", "hot")
                        .s("target", &label)
                        .n("hot_epochs", h as f64)
                        .n("round", round as f64)
                        .n("epochs", st.len() as f64)
                        .n("epoch_ms_median", ep_ms)
                        .n("dirty_median", med(&d))
                        .n("hot_median", med(&hp))
                        .n("cold_median", med(&cold))
                        .n("faults_median", med(&fv))
                        .n("faults_mean", mean(&fv))
                        .n("untracked_faults_per_s", untracked_per_s)
                        .n("pause_median", med(&pz))
                        .n("pause_p90", pct(&pz, 0.9))
                        .n("encoded_median", med(&col(&st, |s| s.encoded_bytes)))
                        .n("capped_pct", capped)
                        .n("quiesce_median", med(&col(&st, |s| s.quiesce_us)))
                        .n("scan_median", med(&col(&st, |s| s.scan_us)))
                        .n("copy_median", med(&col(&st, |s| s.copy_us)))
                        .n("redis_ops_per_s", ops_s)
                        .n("redis_ops_per_s_untracked", untracked_ops_s)
                        .n("other_load_pct", other)
                        .n("cpu_busy_before_pct", busy)
                        .done(),
                );
            }
        }
    }
    say("");
}

fn main() {
    let _ = *START;
    let a = Args::parse();
    let mut raw = Raw::open(&a);
    match a.cmd.as_str() {
        "slowdown" => slowdown(&a, &mut raw),
        "pause" => pause(&a, &mut raw),
        "bytes" => bytes(&a, &mut raw),
        "hot" => hot(&a, &mut raw),
        _ => usage(),
    }
}
