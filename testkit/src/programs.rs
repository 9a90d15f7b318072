//! Helpers for the C test programs in `tests/programs/` (std only).
//!
//! * [`build`] compiles `tests/programs/<name>.c` into
//!   `<workspace>/target/tardi-test-programs/<name>` (cached by mtime, the
//!   headers in `tests/programs/` counting as part of every source; builds
//!   are serialised, so a binary a test runs is never replaced).
//! * [`query`] asks a running `statemachine` for its `digest` report over
//!   UDP; [`expected_digest`] recomputes, from the step counts alone, the
//!   digest that the program must report (the same pure functions as the C
//!   code — see the header comment of `tests/programs/statemachine.c`).
//! * [`Report::check`] bundles the consistency checks a test should make
//!   after a restore.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// gcc flags used for every test program.
pub const CFLAGS: &[&str] = &["-O2", "-g", "-pthread", "-Wall", "-Wextra"];

/// Workspace root (the root package holds the integration tests and `tests/programs/`).
pub use crate::root as workspace_root;

/// Directory the compiled test programs go to.
pub fn programs_out_dir() -> PathBuf {
    workspace_root().join("target").join("tardi-test-programs")
}

/// Compile `tests/programs/<name>.c` (gcc `-O2 -g -pthread`) into
/// `<workspace>/target/tardi-test-programs/<name>` unless that binary exists
/// and is not older than the source and the headers next to it (`reply.h`).
/// Panics with gcc's stderr on failure.
pub fn build(name: &str) -> PathBuf {
    build_variant(name, "", &[])
}

/// Like [`build`], with extra gcc flags (e.g. `-fsanitize=address,undefined`);
/// the binary is named `<name><suffix>` so variants do not overwrite each
/// other. Use a distinct non-empty `suffix` for every distinct flag set.
pub fn build_variant(name: &str, suffix: &str, extra_flags: &[&str]) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);

    let src = workspace_root()
        .join("tests")
        .join("programs")
        .join(format!("{name}.c"));
    let out_dir = programs_out_dir();
    let out = out_dir.join(format!("{name}{suffix}"));
    let src_mtime = std::fs::metadata(&src)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("test program source {}: {e}", src.display()));
    // The headers next to the sources (`reply.h`) count as the source's: a binary older than
    // any of them is built again.
    let src_mtime = headers_mtime().map_or(src_mtime, |h| h.max(src_mtime));
    let up_to_date = || {
        std::fs::metadata(&out)
            .and_then(|m| m.modified())
            .is_ok_and(|bin_mtime| bin_mtime >= src_mtime)
    };
    if up_to_date() {
        return out;
    }
    std::fs::create_dir_all(&out_dir)
        .unwrap_or_else(|e| panic!("create {}: {e}", out_dir.display()));
    // Builds are serialised (a thread mutex for parallel tests in this
    // process, an flock for other test binaries) and the check is repeated
    // under the lock. Without that, two tests that both found the binary
    // missing each compiled it, and the second rename replaced the file a
    // service started by the first was running: its mapping then reads
    // "(deleted)" and a checkpoint is rightly refused.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = BUILD
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let lock_path = out_dir.join(".build.lock");
    let lock = std::fs::File::create(&lock_path)
        .unwrap_or_else(|e| panic!("create {}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("lock {}: {e}", lock_path.display()));
    if up_to_date() {
        return out;
    }
    // Unique temporary name per process *and* per call: parallel tests in one
    // process share a pid. rename() is atomic, so a concurrent reader sees
    // either the old or the new complete binary.
    let tmp = out_dir.join(format!(
        ".{name}{suffix}.tmp.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let output = Command::new("gcc")
        .args(CFLAGS)
        .args(extra_flags)
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
    if !output.status.success() {
        let _ = std::fs::remove_file(&tmp);
        panic!(
            "gcc failed to build {} ({}):\n{}",
            src.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::rename(&tmp, &out).unwrap_or_else(|e| {
        let _ = std::fs::remove_file(&tmp);
        panic!("rename {} -> {}: {e}", tmp.display(), out.display())
    });
    out
}

/// The latest modification time of the headers (`*.h`) in `tests/programs/`, if any.
fn headers_mtime() -> Option<std::time::SystemTime> {
    let dir = workspace_root().join("tests").join("programs");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "h"))
        .filter_map(|e| e.metadata().and_then(|m| m.modified()).ok())
        .max()
}

/// Source path of a test program (useful for error messages).
pub fn source(name: &str) -> PathBuf {
    workspace_root()
        .join("tests")
        .join("programs")
        .join(format!("{name}.c"))
}

// ---------------------------------------------------------------------------
// statemachine: the pure functions (must match statemachine.c exactly)
// ---------------------------------------------------------------------------

const TDATA_INIT: u64 = 0x7464_6174_6174_6461;
const DATA_INIT: u64 = 0x2e64_6174_612e_6461;

/// (len, period, init) of regions 0..10, in digest order:
/// stack, tls, tdata, heap-main, heap-arena, heap-big, mmap, mprotect-ro,
/// bss, data.
const REGIONS: [(u64, u64, u64); 10] = [
    (31, 1, 0),
    (29, 1, 0),
    (13, 3, TDATA_INIT),
    (61, 1, 0),
    (67, 1, 0),
    (64, 1, 0),
    (48, 1, 0),
    (32, 16, 0),
    (16, 2, 0),
    (16, 5, DATA_INIT),
];
/// Region id and length of the signal region (owned by thread 0).
const R_SIG: u64 = 10;
const L_SIG: u64 = 8;
/// Worker 0 sends itself SIGUSR1 after every `SIG_PERIOD`-th step.
pub const SIG_PERIOD: u64 = 10;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// splitmix64 finaliser.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Value written by thread `i` into region `r` at that region's update `k`.
fn val(i: u64, r: u64, k: u64) -> u64 {
    mix64(((i + 1) << 56) ^ (r << 48) ^ k)
}

/// Slot `j` of a region of length `len` after `updates` updates.
fn closed(i: u64, r: u64, len: u64, init: u64, j: u64, updates: u64) -> u64 {
    if j >= updates {
        init
    } else {
        val(i, r, j + len * ((updates - 1 - j) / len))
    }
}

fn fnv_word(mut h: u64, w: u64) -> u64 {
    for b in w.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Number of SIGUSR1 the program must have handled after these steps.
pub fn expected_sig(steps: &[u64]) -> u64 {
    steps.first().map_or(0, |s| s / SIG_PERIOD)
}

/// The digest statemachine must report for these per-thread step counts and
/// handled-signal count (normally `sig == expected_sig(steps)`).
///
/// FNV-1a 64 over the little-endian bytes of: for each thread i, for each
/// region r in order, every slot value; then the 8 signal-region slots; then
/// `sig`.
pub fn expected_digest(steps: &[u64], sig: u64) -> u64 {
    let mut h = FNV_OFFSET;
    for (i, &n) in steps.iter().enumerate() {
        for (r, &(len, period, init)) in REGIONS.iter().enumerate() {
            let updates = n / period;
            for j in 0..len {
                h = fnv_word(h, closed(i as u64, r as u64, len, init, j, updates));
            }
        }
    }
    for j in 0..L_SIG {
        h = fnv_word(h, closed(0, R_SIG, L_SIG, 0, j, sig));
    }
    fnv_word(h, sig)
}

// ---------------------------------------------------------------------------
// statemachine: UDP report
// ---------------------------------------------------------------------------

/// A parsed `digest` reply:
/// `steps=<n0>,...,<nK-1> sig=<s> digest=<hex16> expected=<hex16>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub steps: Vec<u64>,
    pub sig: u64,
    pub digest: u64,
    pub expected: u64,
}

impl Report {
    /// Parse one reply line.
    pub fn parse(line: &str) -> Option<Report> {
        let (mut steps, mut sig, mut digest, mut expected) = (None, None, None, None);
        for field in line.split_whitespace() {
            let (key, value) = field.split_once('=')?;
            match key {
                "steps" => {
                    steps = Some(
                        value
                            .split(',')
                            .map(|s| s.parse::<u64>().ok())
                            .collect::<Option<Vec<u64>>>()?,
                    )
                }
                "sig" => sig = Some(value.parse().ok()?),
                "digest" => digest = Some(u64::from_str_radix(value, 16).ok()?),
                "expected" => expected = Some(u64::from_str_radix(value, 16).ok()?),
                _ => {}
            }
        }
        Some(Report {
            steps: steps?,
            sig: sig?,
            digest: digest?,
            expected: expected?,
        })
    }

    /// Total steps over all threads.
    pub fn total_steps(&self) -> u64 {
        self.steps.iter().sum()
    }

    /// Internal consistency: memory digest == program's expected ==
    /// Rust-recomputed expected, and the signal count matches the steps.
    pub fn check(&self) -> Result<(), String> {
        let ours = expected_digest(&self.steps, self.sig);
        if self.sig != expected_sig(&self.steps) {
            return Err(format!(
                "sig={} but steps imply {}: {self:?}",
                self.sig,
                expected_sig(&self.steps)
            ));
        }
        if self.digest != self.expected || self.digest != ours {
            return Err(format!(
                "digest mismatch: memory={:016x} program-expected={:016x} rust-expected={ours:016x}: {self:?}",
                self.digest, self.expected
            ));
        }
        Ok(())
    }

    /// `self` is a later report of the same run than `earlier` (or a
    /// restored continuation of it): same thread count and no counter went
    /// backwards.
    pub fn not_before(&self, earlier: &Report) -> Result<(), String> {
        if self.steps.len() != earlier.steps.len() {
            return Err(format!("thread count changed: {earlier:?} -> {self:?}"));
        }
        if self.steps.iter().zip(&earlier.steps).any(|(a, b)| a < b) || self.sig < earlier.sig {
            return Err(format!("counters went backwards: {earlier:?} -> {self:?}"));
        }
        Ok(())
    }
}

/// Send `cmd` to `addr` over UDP and return the reply (trailing newline
/// trimmed), resending every 200 ms until `timeout` has elapsed. ICMP "port
/// unreachable" (process not up yet, or being restored) is retried too.
/// Note: a resent request may be executed twice (harmless for every
/// statemachine/dirtier command).
pub fn request(addr: SocketAddr, cmd: &str, timeout: Duration) -> io::Result<String> {
    let deadline = Instant::now() + timeout;
    let bind: SocketAddr = match addr {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(bind)?;
    // connect(): only datagrams from `addr` are received.
    sock.connect(addr)?;
    let mut buf = vec![0u8; 65536];
    let mut last_err: Option<io::Error> = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            let why = last_err
                .map(|e| e.to_string())
                .unwrap_or_else(|| "no reply".into());
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("UDP {cmd:?} to {addr}: timed out after {timeout:?} ({why})"),
            ));
        }
        let attempt = (deadline - now).min(Duration::from_millis(200));
        match sock.send(cmd.as_bytes()) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                last_err = Some(e);
                std::thread::sleep(attempt.min(Duration::from_millis(20)));
                continue;
            }
            Err(e) => return Err(e),
        }
        sock.set_read_timeout(Some(attempt.max(Duration::from_millis(1))))?;
        let until = Instant::now() + attempt;
        loop {
            match sock.recv(&mut buf) {
                Ok(n) => {
                    return Ok(String::from_utf8_lossy(&buf[..n]).trim_end().to_string());
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    last_err = Some(e);
                    let left = until.saturating_duration_since(Instant::now());
                    std::thread::sleep(left.min(Duration::from_millis(20)));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Ask a statemachine for its `digest` report (with retries, see [`request`]).
pub fn query(addr: SocketAddr, timeout: Duration) -> io::Result<Report> {
    let line = request(addr, "digest", timeout)?;
    Report::parse(&line).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad digest reply from {addr}: {line:?}"),
        )
    })
}

/// `ping` a statemachine (`pong`) or dirtier (`pong <n> ...`); returns the
/// reply line.
pub fn ping(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    let line = request(addr, "ping", timeout)?;
    if line.starts_with("pong") {
        Ok(line)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad ping reply: {line:?}"),
        ))
    }
}

/// The `key=value` fields of a reply line (other words left out).
pub fn fields(line: &str) -> std::collections::BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Wait until the service at `addr` answers `ping` (e.g. after spawning it).
pub fn wait_ready(addr: SocketAddr, timeout: Duration) -> io::Result<()> {
    ping(addr, timeout).map(|_| ())
}

/// dirtier: total single-byte page writes so far (first number of `pong`).
pub fn dirtier_written(addr: SocketAddr, timeout: Duration) -> io::Result<u64> {
    let line = ping(addr, timeout)?;
    line.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad dirtier pong: {line:?}"),
            )
        })
}

/// A test program run directly (not in a sandbox), killed and reaped when dropped: a test
/// that fails leaves no process behind (nor one holding the harness's output pipe open).
pub struct Spawned(pub std::process::Child);

impl Spawned {
    pub fn new(bin: &Path, args: &[&str]) -> Spawned {
        Spawned(
            std::process::Command::new(bin)
                .args(args)
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display())),
        )
    }

    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A UDP port that was free a moment ago (racy; prefer retrying on
/// "Address already in use").
pub fn free_udp_port() -> u16 {
    UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral UDP port")
}

/// `127.0.0.1:<port>`.
pub fn local(port: u16) -> SocketAddr {
    (Ipv4Addr::LOCALHOST, port).into()
}

/// Does `path` exist and is it newer than the source of `name`? (debug aid)
pub fn is_fresh(name: &str, path: &Path) -> bool {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    matches!((m(&source(name)), m(path)), (Some(s), Some(b)) if b >= s)
}
