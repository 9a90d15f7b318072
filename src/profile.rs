//! `tardi profile MANIFEST`: runs a service in a sandbox and takes an incremental checkpoint
//! every epoch without replicating it, optionally under load, then reports what replication would
//! cost (sizes, pauses, rates, a verdict) and can draw plots and verify the checkpoints.

use crate::cli::ProfileArgs;
use crate::signals::{block_signals, term_signals, wait_signal};
use anyhow::{Context, anyhow, bail};
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tardi_checkpointer::delta::Codec;
use tardi_checkpointer::epoch::{EpochConfig, EpochStats, Epochs};
use tardi_checkpointer::store::Image;
use tardi_manifest::{Manifest, Proto};
use tardi_service::{SandboxConfig, Service};

/// Above this share of the link, a service is a poor candidate (Tardigrade §6.1).
const LINK_SHARE: f64 = 0.4;
/// Added latency ≈ this many mean epochs (output is held until its epoch is replicated).
const LATENCY_EPOCHS: f64 = 1.5;
/// How long a TCP port may take to accept after the sandbox starts.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Differences listed by `--verify`.
const DIFF_LIMIT: usize = 20;

// ------------------------------------------------------------------------------------------------
// Argument parsers (used by clap in `cli.rs`; an error there exits with status 2)
// ------------------------------------------------------------------------------------------------

/// `500ms`, `10s`, `1.5s`, `2m`, `1h`, `1m30s`, `250us`; a plain number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (examples: 500ms, 10s, 2m, 1m30s)");
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(secs) = t.parse::<f64>() {
        return positive_secs(secs).ok_or_else(bad);
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_end == 0 {
            return Err(bad());
        }
        let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = rest[num_end..].trim_start();
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.' || c == ' ')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" | "hr" | "hours" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = rest[unit_end..].trim_start();
    }
    positive_secs(total).ok_or_else(bad)
}

fn positive_secs(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs > 0.0 && secs < 1e9).then(|| Duration::from_secs_f64(secs))
}

/// `1Gbit/s`, `100Mbit/s`, `10Gbit/s`, `500kbit/s`, `1Gbps`, or plain bits/s (`1000000`).
/// Prefixes are decimal (k = 1000).
pub fn parse_bandwidth(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a bandwidth (examples: 1Gbit/s, 100Mbit/s, 2500000)");
    let t = s.trim();
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let n: f64 = t[..num_end].parse().map_err(|_| bad())?;
    let unit = t[num_end..].trim();
    let (scale, rest) = match unit.chars().next() {
        Some('k' | 'K') => (1e3, &unit[1..]),
        Some('M') => (1e6, &unit[1..]),
        Some('G') => (1e9, &unit[1..]),
        Some('T') => (1e12, &unit[1..]),
        _ => (1.0, unit),
    };
    if !matches!(rest, "" | "bit/s" | "bps" | "b/s" | "bit") {
        return Err(bad());
    }
    let bps = n * scale;
    if !(1.0..1e18).contains(&bps) {
        return Err(bad());
    }
    Ok(bps.round() as u64)
}

/// A page codec by name.
pub fn parse_codec(s: &str) -> Result<Codec, String> {
    s.parse().map_err(|_| {
        let names: Vec<&str> = Codec::ALL.iter().map(|c| c.name()).collect();
        format!("unknown codec {s:?} (one of: {})", names.join(", "))
    })
}

/// A positive number of milliseconds.
pub fn parse_ms(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of milliseconds")),
    }
}

// ------------------------------------------------------------------------------------------------
// Reports
// ------------------------------------------------------------------------------------------------

/// One incremental epoch as printed with `--json` and written to `epochs.json`.
#[derive(Serialize)]
struct EpochLine<'a> {
    #[serde(flatten)]
    st: &'a EpochStats,
    /// When the epoch's checkpoint was ready, since the full checkpoint.
    time_us: u64,
}

struct Rec {
    st: EpochStats,
    time_us: u64,
}

impl Rec {
    fn line(&self) -> EpochLine<'_> {
        EpochLine {
            st: &self.st,
            time_us: self.time_us,
        }
    }
}

/// Applies an epoch's checkpoint to the verification image (if any), prints its JSON line (with
/// `--json`) and keeps its record.
fn record(
    image: &mut Option<Image>,
    recs: &mut Vec<Rec>,
    ck: tardi_checkpointer::Checkpoint,
    st: EpochStats,
    t0: Instant,
    json: bool,
) -> anyhow::Result<()> {
    if let Some(img) = image {
        img.apply(&ck).context("applying the checkpoint")?;
    }
    let rec = Rec {
        time_us: t0.elapsed().as_micros() as u64,
        st,
    };
    if json {
        println!("{}", serde_json::to_string(&rec.line())?);
    }
    recs.push(rec);
    Ok(())
}

#[derive(Serialize, Clone, Copy, Default, Debug)]
struct Pct {
    p50: u64,
    p90: u64,
    p99: u64,
    max: u64,
}

impl Pct {
    fn of(mut v: Vec<u64>) -> Pct {
        if v.is_empty() {
            return Pct::default();
        }
        v.sort_unstable();
        Pct {
            p50: nearest_rank(&v, 0.5),
            p90: nearest_rank(&v, 0.9),
            p99: nearest_rank(&v, 0.99),
            max: *v.last().unwrap(),
        }
    }
}

/// The nearest-rank percentile `p` (a fraction) of `sorted`, which must not be empty.
fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> T {
    sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[derive(Serialize)]
struct Percentiles {
    interval_us: Pct,
    pause_us: Pct,
    dirty_pages: Pct,
    encoded_bytes: Pct,
}

#[derive(Serialize)]
struct ConfigOut {
    interval_ms: f64,
    min_interval_ms: f64,
    cap_pages: u64,
    hot_epochs: u32,
    codec: String,
    twin_budget_bytes: u64,
}

#[derive(Serialize)]
struct Summary {
    summary: bool,
    name: String,
    /// The sandbox's IPv4 address (what `{address}` in --load became).
    address: String,
    /// Why profiling ended: "duration", "signal N", or how the service ended.
    stopped: String,
    config: ConfigOut,
    /// Incremental epochs (the full checkpoint, epoch 0, is not counted).
    epochs: u64,
    /// Time the incremental epochs cover: sum of their intervals and pauses.
    span_us: u64,
    /// The full checkpoint (epoch 0): page bytes and pause.
    full_bytes: u64,
    full_pause_us: u64,
    /// Totals over the incremental epochs.
    dirty_pages: u64,
    fresh_pages: u64,
    raw_bytes: u64,
    encoded_bytes: u64,
    capped_epochs: u64,
    /// Per-epoch distributions.
    percentiles: Percentiles,
    mean_epoch_us: f64,
    /// raw_bytes / span (page-granular dirty rate), bytes/s.
    dirty_rate_bytes_per_s: f64,
    /// encoded_bytes / span: what replication would send, bytes/s.
    encoded_rate_bytes_per_s: f64,
    link_bandwidth_bps: u64,
    /// encoded rate / link bandwidth.
    link_fraction: f64,
    /// dirty (raw) rate / link bandwidth.
    raw_link_fraction: f64,
    /// ≈ 1.5 × the mean epoch length.
    expected_added_latency_us: f64,
    good: bool,
    verdict: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verify_error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    verify_differences: Vec<String>,
}

fn summarize(
    name: &str,
    address: Ipv4Addr,
    stopped: &str,
    cfg: &EpochConfig,
    full: &EpochStats,
    recs: &[Rec],
    link_bps: u64,
) -> Summary {
    let sum = |f: fn(&EpochStats) -> u64| recs.iter().map(|r| f(&r.st)).sum::<u64>();
    let col = |f: fn(&EpochStats) -> u64| recs.iter().map(|r| f(&r.st)).collect::<Vec<u64>>();
    let span_us = sum(|s| s.interval_us + s.pause_us);
    let raw_bytes = sum(|s| s.raw_bytes);
    let encoded_bytes = sum(|s| s.encoded_bytes);
    let secs = span_us as f64 / 1e6;
    let rate = |b: u64| if secs > 0.0 { b as f64 / secs } else { 0.0 };
    let (dirty_rate, encoded_rate) = (rate(raw_bytes), rate(encoded_bytes));
    let link_bytes = link_bps as f64 / 8.0;
    let link_fraction = encoded_rate / link_bytes;
    let mean_epoch_us = if recs.is_empty() {
        0.0
    } else {
        span_us as f64 / recs.len() as f64
    };
    let good = link_fraction <= LINK_SHARE;
    Summary {
        summary: true,
        name: name.to_string(),
        address: address.to_string(),
        stopped: stopped.to_string(),
        config: ConfigOut {
            interval_ms: cfg.interval.as_secs_f64() * 1e3,
            min_interval_ms: cfg.min_interval.as_secs_f64() * 1e3,
            cap_pages: cfg.cap_pages,
            hot_epochs: cfg.hot_epochs,
            codec: cfg.codec.to_string(),
            twin_budget_bytes: cfg.twin_budget as u64,
        },
        epochs: recs.len() as u64,
        span_us,
        full_bytes: full.encoded_bytes,
        full_pause_us: full.pause_us,
        dirty_pages: sum(|s| s.dirty_pages),
        fresh_pages: sum(|s| s.fresh_pages),
        raw_bytes,
        encoded_bytes,
        capped_epochs: recs.iter().filter(|r| r.st.capped).count() as u64,
        percentiles: Percentiles {
            interval_us: Pct::of(col(|s| s.interval_us)),
            pause_us: Pct::of(col(|s| s.pause_us)),
            dirty_pages: Pct::of(col(|s| s.dirty_pages)),
            encoded_bytes: Pct::of(col(|s| s.encoded_bytes)),
        },
        mean_epoch_us,
        dirty_rate_bytes_per_s: dirty_rate,
        encoded_rate_bytes_per_s: encoded_rate,
        link_bandwidth_bps: link_bps,
        link_fraction,
        raw_link_fraction: dirty_rate / link_bytes,
        expected_added_latency_us: LATENCY_EPOCHS * mean_epoch_us,
        good,
        verdict: verdict(link_fraction, link_bps),
        verified: None,
        verify_error: None,
        verify_differences: Vec::new(),
    }
}

/// "good candidate: checkpoints need 3.1% of a 1 Gbit/s link" or
/// "poor candidate: checkpoints need 62% of a 1 Gbit/s link (above 40%)".
fn verdict(fraction: f64, link_bps: u64) -> String {
    let share = percent(fraction);
    let link = fmt_link(link_bps);
    if fraction <= LINK_SHARE {
        format!("good candidate: checkpoints need {share} of a {link} link")
    } else {
        format!(
            "poor candidate: checkpoints need {share} of a {link} link (above {:.0}%)",
            LINK_SHARE * 100.0
        )
    }
}

fn percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if p == 0.0 {
        "0%".into()
    } else if p < 0.01 {
        "<0.01%".into()
    } else if p < 1.0 {
        format!("{p:.2}%")
    } else if p < 10.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// Bits/s with a decimal prefix: "1 Gbit/s", "100 Mbit/s", "2.5 Gbit/s".
fn fmt_link(bps: u64) -> String {
    let b = bps as f64;
    let (v, unit) = if b >= 1e12 {
        (b / 1e12, "Tbit/s")
    } else if b >= 1e9 {
        (b / 1e9, "Gbit/s")
    } else if b >= 1e6 {
        (b / 1e6, "Mbit/s")
    } else if b >= 1e3 {
        (b / 1e3, "kbit/s")
    } else {
        (b, "bit/s")
    };
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} {unit}")
}

/// Bytes, binary units.
fn fmt_bytes(b: f64) -> String {
    if b < 1024.0 {
        format!("{b:.0} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1048576.0)
    } else {
        format!("{:.2} GiB", b / 1073741824.0)
    }
}

/// Bytes/s as MB/s and Mbit/s.
fn fmt_rate(bytes_per_s: f64) -> String {
    format!(
        "{:.2} MB/s ({})",
        bytes_per_s / 1e6,
        fmt_link((bytes_per_s * 8.0) as u64)
    )
}

fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

fn print_summary(s: &Summary, verbose_diffs: bool) {
    let p = &s.percentiles;
    println!(
        "\nprofile of {:?}: {} incremental epochs over {:.2} s, stopped by {}",
        s.name,
        s.epochs,
        s.span_us as f64 / 1e6,
        s.stopped
    );
    println!(
        "  config: interval {} ms (min {} ms), cap {} pages, hot after {} epochs, codec {}",
        s.config.interval_ms,
        s.config.min_interval_ms,
        s.config.cap_pages,
        s.config.hot_epochs,
        s.config.codec
    );
    println!(
        "  full checkpoint (epoch 0): {} in a {} pause",
        fmt_bytes(s.full_bytes as f64),
        fmt_us(s.full_pause_us as f64)
    );
    println!(
        "  {:<18}{:>12}{:>12}{:>12}{:>12}",
        "per epoch", "p50", "p90", "p99", "max"
    );
    let row = |label: &str, q: &Pct, f: &dyn Fn(u64) -> String| {
        println!(
            "  {label:<18}{:>12}{:>12}{:>12}{:>12}",
            f(q.p50),
            f(q.p90),
            f(q.p99),
            f(q.max)
        );
    };
    row("interval", &p.interval_us, &|v| fmt_us(v as f64));
    row("pause", &p.pause_us, &|v| fmt_us(v as f64));
    row("dirty pages", &p.dirty_pages, &|v| v.to_string());
    row("encoded", &p.encoded_bytes, &|v| fmt_bytes(v as f64));
    println!(
        "  total: {} dirty + {} fresh pages = {} raw, {} encoded ({}){}",
        s.dirty_pages,
        s.fresh_pages,
        fmt_bytes(s.raw_bytes as f64),
        fmt_bytes(s.encoded_bytes as f64),
        if s.raw_bytes > 0 {
            format!(
                "{:.1}% of raw",
                s.encoded_bytes as f64 * 100.0 / s.raw_bytes as f64
            )
        } else {
            "nothing dirty".into()
        },
        if s.capped_epochs > 0 {
            format!("; {} epochs ended early at the cap", s.capped_epochs)
        } else {
            String::new()
        }
    );
    println!(
        "  dirty rate (pages x 4 KiB): {} = {} of the link",
        fmt_rate(s.dirty_rate_bytes_per_s),
        percent(s.raw_link_fraction)
    );
    println!(
        "  checkpoint rate (encoded):  {} = {} of the link",
        fmt_rate(s.encoded_rate_bytes_per_s),
        percent(s.link_fraction)
    );
    println!(
        "  expected added latency: ~{} (1.5 x the mean epoch of {})",
        fmt_us(s.expected_added_latency_us),
        fmt_us(s.mean_epoch_us)
    );
    println!("verdict: {}", s.verdict);
    match (s.verified, &s.verify_error) {
        (Some(true), _) => println!(
            "verified: the image built from the whole chain matches the held process, and a restore of it matches byte for byte"
        ),
        (Some(false), e) => {
            println!(
                "verification FAILED: {}",
                e.as_deref().unwrap_or("differences")
            );
            if verbose_diffs {
                for d in &s.verify_differences {
                    println!("  {d}");
                }
            }
        }
        (None, _) => {}
    }
}

// ------------------------------------------------------------------------------------------------
// The command
// ------------------------------------------------------------------------------------------------

/// How profiling ended.
enum Stop {
    Duration,
    Signal(i32),
    Exited(String),
}

impl Stop {
    fn describe(&self) -> String {
        match self {
            Stop::Duration => "duration".into(),
            Stop::Signal(s) => format!("signal {s}"),
            Stop::Exited(e) => e.clone(),
        }
    }
}

fn epoch_config(a: &ProfileArgs, m: &Manifest) -> EpochConfig {
    let e = &m.tardi.epoch;
    let interval = Duration::from_secs_f64(a.interval.unwrap_or(e.interval_ms).max(0.001) / 1e3);
    let min_interval = Duration::from_secs_f64(e.min_ms.max(0.0) / 1e3).min(interval);
    EpochConfig {
        interval,
        min_interval,
        cap_pages: a.cap_pages.unwrap_or(e.cap_pages),
        hot_epochs: a.hot_epochs.unwrap_or(e.hot_epochs),
        cold_one_in: 16,
        codec: a.codec,
        twin_budget: (a.twin_budget as usize).saturating_mul(1 << 20),
        refresh_every: 100,
        encode_workers: a.encode_workers.max(1),
        private_dirs: Vec::new(), // set from the sandbox's config once it is built
        tracker: a
            .tracker
            .unwrap_or_else(|| e.tracker.parse().unwrap_or_default()),
        precopy: !a.no_precopy,
    }
}

pub fn profile(a: ProfileArgs) -> anyhow::Result<()> {
    let signals = block_signals();
    let m = crate::output::load_manifest(&a.manifest)?;
    let mut cfg = epoch_config(&a, &m);
    // Fail on what can be checked before the service runs.
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the output directory {}", dir.display()))?;
        load_font()?;
    }
    let mut svc = Service::start(&m, &tardi_service::config_for(&m))?;
    // The same private directories a snapshot of this sandbox would walk.
    cfg.private_dirs = svc.private_dirs();
    let result = profile_in(&a, &m, &cfg, &mut svc, &signals);
    let torn = svc.teardown();
    let outcome = result?;
    torn.context("tearing the sandbox down")?;
    outcome
}

/// Everything after the sandbox started. The outer `Result` is an error of the run; the inner
/// one, a failure found after the report was made (failed verification, service exit).
fn profile_in(
    a: &ProfileArgs,
    m: &Manifest,
    cfg: &EpochConfig,
    sandbox: &mut Service,
    signals: &libc::sigset_t,
) -> anyhow::Result<anyhow::Result<()>> {
    let name = m.tardi.name.clone();
    let pid = sandbox.pid();
    let address = sandbox.address();

    if let Some(stop) = wait_ready(sandbox, m, signals)? {
        bail!(
            "the service ended before profiling began: {}",
            stop.describe()
        );
    }
    let mut load = match &a.load {
        Some(cmd) => {
            let log = a.out.as_ref().map(|d| d.join("load.log"));
            Some(Load::start(cmd, address, log.as_deref())?)
        }
        None => None,
    };

    let t0 = Instant::now();
    let (mut ep, full, st0) =
        Epochs::start(pid, cfg.clone()).context("starting the epoch loop (full checkpoint)")?;
    let t0_done = Instant::now();
    let mut image = if a.verify {
        Some(Image::from_full(&full).context("building the image from the full checkpoint")?)
    } else {
        None
    };
    drop(full);

    let human = !a.json;
    if human {
        println!(
            "profiling {name:?} (address {address}, pid {pid}) for {:.1} s: epoch {} ms (min {} ms), cap {} pages, hot after {} epochs, codec {}{}",
            a.duration.as_secs_f64(),
            cfg.interval.as_secs_f64() * 1e3,
            cfg.min_interval.as_secs_f64() * 1e3,
            cfg.cap_pages,
            cfg.hot_epochs,
            cfg.codec,
            if a.load.is_some() { ", under load" } else { "" }
        );
        println!(
            "full checkpoint: {} in a {} pause (took {})",
            fmt_bytes(st0.encoded_bytes as f64),
            fmt_us(st0.pause_us as f64),
            fmt_us((t0_done - t0).as_micros() as f64)
        );
    }
    let mut progress = Progress::new(human, cfg.interval);
    let mut recs: Vec<Rec> = Vec::new();
    let mut held = false;
    let stop = loop {
        if let Some(sig) = wait_signal(signals, Duration::ZERO) {
            break Stop::Signal(sig);
        }
        if let Some(exit) = sandbox.try_wait().context("watching the sandbox")? {
            break Stop::Exited(exit.to_string());
        }
        let elapsed = t0_done.elapsed();
        if elapsed >= a.duration {
            break Stop::Duration;
        }
        let last = elapsed + cfg.interval >= a.duration;
        let hold = last && a.verify;
        let n = recs.len() + 1;
        let r = if hold { ep.next_held() } else { ep.next() };
        let (ck, st) = match r {
            Ok(v) => v,
            Err(e) => {
                // A service that just ended makes the epoch fail: report that instead.
                if let Some(exit) = exited_soon(sandbox) {
                    break Stop::Exited(exit);
                }
                return Err(anyhow::Error::new(e).context(format!("epoch {n}")));
            }
        };
        record(&mut image, &mut recs, ck, st, t0_done, a.json)
            .with_context(|| format!("epoch {n}"))?;
        progress.epoch(recs.last().expect("just recorded"), a.duration);
        if hold {
            held = true;
        }
        if last {
            break Stop::Duration;
        }
    };
    progress.finish();

    // With --verify and profiling cut short, take the held epoch now.
    let mut verify_result: Option<Result<Vec<String>, String>> = None;
    if a.verify {
        if !held && !matches!(stop, Stop::Exited(_)) {
            match ep.next_held() {
                Ok((ck, st)) => {
                    record(&mut image, &mut recs, ck, st, t0_done, a.json)
                        .context("the last (held) epoch")?;
                    held = true;
                }
                Err(e) => {
                    verify_result = Some(Err(format!(
                        "the last (held) epoch failed: {}",
                        crate::output::describe(&anyhow::Error::new(e))
                    )))
                }
            }
        }
        // The load has nothing to do with a stopped service.
        if let Some(l) = &mut load {
            l.stop();
        }
        if held {
            let img = image.as_ref().expect("kept with --verify");
            verify_result =
                Some(verify(pid, img, sandbox.config()).map_err(|e| crate::output::describe(&e)));
        } else if verify_result.is_none() {
            verify_result = Some(Err(format!(
                "the service ended before the final epoch ({})",
                stop.describe()
            )));
        }
    }
    ep.stop();
    drop(image);
    if let Some(l) = &mut load {
        l.stop();
    }

    let mut s = summarize(
        &name,
        address,
        &stop.describe(),
        cfg,
        &st0,
        &recs,
        a.link_bandwidth,
    );
    if let Some(v) = &verify_result {
        match v {
            Ok(diffs) if diffs.is_empty() => s.verified = Some(true),
            Ok(diffs) => {
                s.verified = Some(false);
                s.verify_error = Some(format!(
                    "{}{} difference(s); first: {}",
                    diffs.len(),
                    if diffs.len() >= DIFF_LIMIT {
                        " or more"
                    } else {
                        ""
                    },
                    diffs[0]
                ));
                s.verify_differences = diffs.clone();
            }
            Err(e) => {
                s.verified = Some(false);
                s.verify_error = Some(e.clone());
            }
        }
    }
    if a.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        print_summary(&s, true);
    }
    let _ = std::io::stdout().flush();

    if let Some(dir) = &a.out {
        write_outputs(dir, &s, &recs, cfg)?;
        if human {
            println!("plots and data in {}", dir.display());
        }
    }
    if s.verified == Some(false) {
        return Ok(Err(anyhow!(
            "verification failed: {}",
            s.verify_error.as_deref().unwrap_or("differences")
        )));
    }
    if let Stop::Exited(e) = &stop {
        return Ok(Err(anyhow!("the service ended during profiling: {e}")));
    }
    Ok(Ok(()))
}

/// After a failed epoch: how the service ended, if it did within 500 ms.
fn exited_soon(sandbox: &mut Service) -> Option<String> {
    for _ in 0..25 {
        if let Ok(Some(exit)) = sandbox.try_wait() {
            return Some(exit.to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Waits until the service is up: a TCP port of the manifest accepts a connection, or 300 ms
/// passed (UDP ports only, or none). Returns how it ended if it ended first, or a signal.
fn wait_ready(
    sandbox: &mut Service,
    m: &Manifest,
    signals: &libc::sigset_t,
) -> anyhow::Result<Option<Stop>> {
    let address = sandbox.address();
    let tcp: Vec<u16> = m
        .tardi
        .ports
        .iter()
        .filter(|p| p.proto == Proto::Tcp)
        .map(|p| p.port)
        .collect();
    let t0 = Instant::now();
    loop {
        if let Some(sig) = wait_signal(signals, Duration::ZERO) {
            return Ok(Some(Stop::Signal(sig)));
        }
        if let Some(exit) = sandbox.try_wait().context("watching the sandbox")? {
            return Ok(Some(Stop::Exited(exit.to_string())));
        }
        if tcp.is_empty() {
            if t0.elapsed() >= Duration::from_millis(300) {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        for &port in &tcp {
            let addr = SocketAddr::from((address, port));
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(None);
            }
        }
        if t0.elapsed() >= READY_TIMEOUT {
            bail!(
                "the service did not accept connections on {} within {} s",
                tcp.iter()
                    .map(|p| format!("{address}:{p}"))
                    .collect::<Vec<_>>()
                    .join(" or "),
                READY_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Human progress: a line per epoch when epochs are slow (≥ 100 ms), else a progress line at
/// most every 500 ms (rewritten in place on a terminal).
struct Progress {
    on: bool,
    lines: bool,
    tty: bool,
    last: Instant,
    window: (u64, u64, u64, u64),
    shown: bool,
}

impl Progress {
    fn new(human: bool, interval: Duration) -> Progress {
        Progress {
            on: human,
            lines: interval >= Duration::from_millis(100),
            tty: std::io::stderr().is_terminal(),
            last: Instant::now(),
            window: (0, 0, 0, 0),
            shown: false,
        }
    }

    fn epoch(&mut self, r: &Rec, duration: Duration) {
        if !self.on {
            return;
        }
        let s = &r.st;
        if self.lines {
            println!(
                "epoch {:>5}  interval {:>9}  pause {:>9}  dirty {:>7} pages (+{} fresh)  raw {:>10}  encoded {:>10}{}",
                s.epoch,
                fmt_us(s.interval_us as f64),
                fmt_us(s.pause_us as f64),
                s.dirty_pages,
                s.fresh_pages,
                fmt_bytes(s.raw_bytes as f64),
                fmt_bytes(s.encoded_bytes as f64),
                if s.capped { "  capped" } else { "" }
            );
            return;
        }
        let w = &mut self.window;
        w.0 += 1;
        w.1 += s.dirty_pages + s.fresh_pages;
        w.2 += s.encoded_bytes;
        w.3 = w.3.max(s.pause_us);
        let every = if self.tty {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(1)
        };
        let dt = self.last.elapsed();
        if dt < every {
            return;
        }
        let line = format!(
            "epoch {:>6}  {:>5.1}/{:.1} s  dirty {:>6} pages/epoch  encoded {:>10}/s  max pause {}",
            s.epoch,
            r.time_us as f64 / 1e6,
            duration.as_secs_f64(),
            w.1 / w.0.max(1),
            fmt_bytes(w.2 as f64 / dt.as_secs_f64()),
            fmt_us(w.3 as f64)
        );
        if self.tty {
            eprint!("\r{line:<100}");
        } else {
            eprintln!("{line}");
        }
        self.shown = true;
        self.window = (0, 0, 0, 0);
        self.last = Instant::now();
    }

    fn finish(&mut self) {
        if self.on && self.tty && self.shown {
            eprint!("\r{:<100}\r", "");
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The load command
// ------------------------------------------------------------------------------------------------

/// A `--load` command in its own process group; stopped (SIGTERM to the group) when dropped.
struct Load {
    child: Option<Child>,
}

impl Load {
    fn start(cmd: &str, address: Ipv4Addr, log: Option<&Path>) -> anyhow::Result<Load> {
        let cmd = cmd.replace("{address}", &address.to_string());
        let (out, err) = match log {
            Some(p) => {
                let f = std::fs::File::create(p)
                    .with_context(|| format!("creating the load log {}", p.display()))?;
                (Stdio::from(f.try_clone()?), Stdio::from(f))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(&cmd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // Undo `block_signals` (the mask is inherited): the load must die of SIGTERM.
        let set = term_signals();
        // SAFETY: the closure only calls sigprocmask on a set built before the fork, which is
        // async-signal-safe, as required between fork and exec.
        unsafe {
            c.pre_exec(move || {
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                Ok(())
            });
        }
        let child = c
            .spawn()
            .with_context(|| format!("starting the load command {cmd:?}"))?;
        Ok(Load { child: Some(child) })
    }

    /// SIGTERM to the whole group; SIGKILL after 3 s. Idempotent.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pgid = child.id() as i32;
        // SAFETY: signals to the process group we created (its leader is our unreaped child, so
        // the group id cannot have been reused).
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut reaped = false;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                reaped = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Members that ignored SIGTERM (the group outlives a reaped leader while it has any).
        // SAFETY: as above; right after the leader's exit the id is not reused.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        if !reaped {
            let _ = child.wait();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop();
    }
}

// ------------------------------------------------------------------------------------------------
// --verify
// ------------------------------------------------------------------------------------------------

/// The process `pid` is held in the state `image` describes. Compares the image with it, then
/// restores the image into a second sandbox and compares the two processes. Returns the
/// differences (empty: identical).
fn verify(pid: i32, image: &Image, config: &SandboxConfig) -> anyhow::Result<Vec<String>> {
    let diffs = tardi_checkpointer::verify::compare_live(pid, image, DIFF_LIMIT)
        .context("comparing the image with the live process")?;
    if !diffs.is_empty() {
        return Ok(diffs
            .into_iter()
            .map(|d| format!("image vs live process: {d}"))
            .collect());
    }
    let full = image.to_full();
    let name = format!("{}-verify", config.name);
    let cfg2 = SandboxConfig {
        run_dir: Path::new(tardi_sandbox::RUN_ROOT).join(&name),
        name,
        link_index: None,
        ..config.clone()
    };
    let (sb2, skip) = Service::restore_held(&full, cfg2.clone())
        .context("restoring the image into a second sandbox")?;
    drop(full);
    let volatile = tardi_checkpointer::verify::rseq_areas(image);
    let r =
        tardi_checkpointer::verify::compare_processes(pid, sb2.pid(), skip, &volatile, DIFF_LIMIT)
            .context("comparing the restored process with the live one");
    let torn = sb2.teardown();
    let diffs: Vec<String> = r?
        .into_iter()
        .map(|d| format!("restored vs live process: {d}"))
        .collect();
    torn.context("tearing the verification sandbox down")?;
    // Nothing to keep from this internal sandbox (its log is only useful when it failed).
    let _ = std::fs::remove_dir_all(&cfg2.run_dir);
    Ok(diffs)
}

// ------------------------------------------------------------------------------------------------
// --out: data files and plots
// ------------------------------------------------------------------------------------------------

fn write_outputs(dir: &Path, s: &Summary, recs: &[Rec], cfg: &EpochConfig) -> anyhow::Result<()> {
    let lines: Vec<EpochLine> = recs.iter().map(Rec::line).collect();
    let write = |file: &str, bytes: Vec<u8>| -> anyhow::Result<()> {
        let p = dir.join(file);
        std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))
    };
    write("epochs.json", serde_json::to_vec_pretty(&lines)?)?;
    write("summary.json", serde_json::to_vec_pretty(s)?)?;
    plots::draw_all(dir, s, recs, cfg).context("drawing the plots")
}

/// Makes a TrueType font available to the plots (their text is rendered by ab_glyph, not by the
/// system): `$TARDI_PLOT_FONT`, else DejaVu Sans or another common sans font, else whatever
/// fontconfig's `fc-match` names, else any .ttf under /usr/share/fonts.
fn load_font() -> anyhow::Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("TARDI_PLOT_FONT") {
            candidates.push(p.into());
        }
        for p in [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
            "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
            "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
        ] {
            candidates.push(p.into());
        }
        if let Ok(out) = Command::new("fc-match")
            .args(["-f", "%{file}", "sans-serif"])
            .stderr(Stdio::null())
            .output()
            && out.status.success()
        {
            candidates.push(String::from_utf8_lossy(&out.stdout).trim().into());
        }
        find_ttf(Path::new("/usr/share/fonts"), &mut candidates, 3);
        for p in candidates {
            let Ok(bytes) = std::fs::read(&p) else {
                continue;
            };
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            let ok = ["sans-serif", "serif", "monospace"].iter().all(|family| {
                plotters::style::register_font(family, plotters::style::FontStyle::Normal, bytes)
                    .is_ok()
            });
            if ok {
                tracing::debug!(font = %p.display(), "plot font");
                return Ok(());
            }
        }
        Err("no usable TrueType font for the plots' text: install one (Debian: apt-get install fonts-dejavu-core) or set TARDI_PLOT_FONT to a .ttf file".into())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

fn find_ttf(dir: &Path, out: &mut Vec<PathBuf>, depth: u32) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if depth > 0 {
                find_ttf(&p, out, depth - 1);
            }
        } else if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
            out.push(p);
        }
    }
}

mod plots {
    use super::{Rec, Summary};
    use anyhow::anyhow;
    use plotters::coord::Shift;
    use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
    use plotters::coord::types::RangedCoordf64;
    use plotters::prelude::*;
    use std::path::Path;
    use tardi_checkpointer::epoch::EpochConfig;

    const SIZE: (u32, u32) = (1100, 650);
    const ENCODED: RGBColor = RGBColor(31, 119, 180);
    const RAW: RGBColor = RGBColor(214, 39, 40);
    const GUIDE: RGBColor = RGBColor(120, 120, 120);

    fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
        anyhow!("{e}")
    }

    /// A legend's mark for a series: a short line in `color`.
    fn legend_mark(color: RGBColor, width: u32) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
        move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(width))
    }

    /// Draws the legend box of `chart`'s labelled series at `position`.
    fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
        chart: &mut ChartContext<'a, DB, CT>,
        position: SeriesLabelPosition,
    ) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        chart
            .configure_series_labels()
            .position(position)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(err)
    }

    /// An axis label without needless decimals.
    fn short(v: f64) -> String {
        let a = v.abs();
        if a == 0.0 || a >= 100.0 {
            format!("{v:.0}")
        } else if a >= 10.0 {
            format!("{v:.1}").trim_end_matches(".0").to_string()
        } else if a >= 0.1 {
            let s = format!("{v:.2}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            format!("{v:.1e}")
        }
    }

    pub fn draw_all(
        dir: &Path,
        s: &Summary,
        recs: &[Rec],
        cfg: &EpochConfig,
    ) -> anyhow::Result<()> {
        super::load_font()?;
        let size = SizeData::new(s, recs);
        let interval = CdfData::new(
            "Epoch interval",
            recs.iter().map(|r| r.st.interval_us).collect(),
            Some(cfg.interval.as_secs_f64() * 1e6),
            "configured interval",
        );
        let pause = CdfData::new(
            "Pause of the service per epoch",
            recs.iter().map(|r| r.st.pause_us).collect(),
            None,
            "",
        );
        for (stem, what) in [
            ("checkpoint-size", Chart::Size(&size)),
            ("interval-cdf", Chart::Cdf(&interval)),
            ("pause-cdf", Chart::Cdf(&pause)),
        ] {
            let png = dir.join(format!("{stem}.png"));
            let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
            what.draw(&root)
                .map_err(|e| e.context(format!("drawing {}", png.display())))?;
            root.present()
                .map_err(|e| anyhow!("writing {}: {e}", png.display()))?;
            drop(root);
            let svg = dir.join(format!("{stem}.svg"));
            let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
            what.draw(&root)
                .map_err(|e| e.context(format!("drawing {}", svg.display())))?;
            root.present()
                .map_err(|e| anyhow!("writing {}: {e}", svg.display()))?;
        }
        Ok(())
    }

    enum Chart<'a> {
        Size(&'a SizeData),
        Cdf(&'a CdfData),
    }

    impl Chart<'_> {
        fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
        where
            DB::ErrorType: 'static,
        {
            root.fill(&WHITE).map_err(err)?;
            match self {
                Chart::Size(d) => d.draw(root),
                Chart::Cdf(d) => d.draw(root),
            }
        }
    }

    /// Checkpoint size per epoch over time.
    struct SizeData {
        title: String,
        /// (time s, encoded KiB, raw KiB)
        points: Vec<(f64, f64, f64)>,
        t_max: f64,
        lo: f64,
        hi: f64,
        log: bool,
    }

    impl SizeData {
        fn new(s: &Summary, recs: &[Rec]) -> SizeData {
            let points: Vec<(f64, f64, f64)> = recs
                .iter()
                .map(|r| {
                    (
                        r.time_us as f64 / 1e6,
                        r.st.encoded_bytes as f64 / 1024.0,
                        r.st.raw_bytes as f64 / 1024.0,
                    )
                })
                .collect();
            let max = points.iter().map(|p| p.1.max(p.2)).fold(0.0, f64::max);
            let min_pos = points
                .iter()
                .flat_map(|p| [p.1, p.2])
                .filter(|v| *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            let log = min_pos.is_finite() && max / min_pos > 100.0;
            let (lo, hi) = if log {
                (min_pos / 2.0, max * 2.0)
            } else {
                (0.0, if max > 0.0 { max * 1.1 } else { 1.0 })
            };
            SizeData {
                title: format!(
                    "Checkpoint size per epoch: {} ({} epochs, codec {})",
                    s.name, s.epochs, s.config.codec
                ),
                t_max: points.last().map_or(1.0, |p| p.0).max(1e-3),
                points,
                lo,
                hi,
                log,
            }
        }

        fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
        where
            DB::ErrorType: 'static,
        {
            if self.log {
                self.draw_with(
                    root,
                    (self.lo..self.hi).log_scale(),
                    "KiB per epoch (log scale)",
                )
            } else {
                self.draw_with(root, self.lo..self.hi, "KiB per epoch")
            }
        }

        fn draw_with<DB: DrawingBackend, Y>(
            &self,
            root: &DrawingArea<DB, Shift>,
            y: Y,
            y_desc: &str,
        ) -> anyhow::Result<()>
        where
            DB::ErrorType: 'static,
            Y: AsRangedCoord<Value = f64>,
            Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
        {
            let floor = self.lo;
            let mut chart = ChartBuilder::on(root)
                .caption(&self.title, ("sans-serif", 26))
                .margin(20)
                .x_label_area_size(50)
                .y_label_area_size(80)
                .build_cartesian_2d(0.0..self.t_max * 1.02, y)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc("time since the full checkpoint (s)")
                .y_desc(y_desc)
                .y_label_formatter(&|v| short(*v))
                .axis_desc_style(("sans-serif", 20))
                .label_style(("sans-serif", 16))
                .light_line_style(RGBColor(235, 235, 235))
                .draw()
                .map_err(err)?;
            let few = self.points.len() <= 300;
            for (label, color, pick) in [
                (
                    "raw (dirty + fresh pages x 4 KiB)",
                    RAW,
                    (|p: &(f64, f64, f64)| p.2) as fn(&(f64, f64, f64)) -> f64,
                ),
                ("encoded (what replication sends)", ENCODED, |p| p.1),
            ] {
                let series: Vec<(f64, f64)> = self
                    .points
                    .iter()
                    .map(|p| (p.0, pick(p).max(floor)))
                    .collect();
                chart
                    .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))
                    .map_err(err)?
                    .label(label)
                    .legend(legend_mark(color, 3));
                if few {
                    chart
                        .draw_series(
                            series
                                .into_iter()
                                .map(|(x, y)| Circle::new((x, y), 3, color.filled())),
                        )
                        .map_err(err)?;
                }
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
        }
    }

    /// The CDF of per-epoch durations (µs), drawn in µs or ms.
    struct CdfData {
        title: String,
        /// Sorted values, in the unit of the x axis.
        values: Vec<f64>,
        unit: &'static str,
        x_min: f64,
        x_max: f64,
        guide: Option<(f64, &'static str)>,
    }

    impl CdfData {
        fn new(what: &str, us: Vec<u64>, guide_us: Option<f64>, guide: &'static str) -> CdfData {
            let mut us = us;
            us.sort_unstable();
            let max_us = us.last().copied().unwrap_or(0) as f64;
            let (unit, div) = if max_us.max(guide_us.unwrap_or(0.0)) >= 2000.0 {
                ("ms", 1e3)
            } else {
                ("µs", 1.0)
            };
            let values: Vec<f64> = us.iter().map(|&v| v as f64 / div).collect();
            let pct = |p: f64| {
                if values.is_empty() {
                    0.0
                } else {
                    super::nearest_rank(&values, p)
                }
            };
            let fmt = |v: f64| {
                if v >= 100.0 {
                    format!("{v:.0}")
                } else if v >= 10.0 {
                    format!("{v:.1}")
                } else {
                    format!("{v:.2}")
                }
            };
            let guide = guide_us.map(|g| (g / div, guide));
            let hi = values
                .last()
                .copied()
                .unwrap_or(0.0)
                .max(guide.map_or(0.0, |g| g.0));
            let lo = values
                .first()
                .copied()
                .unwrap_or(0.0)
                .min(guide.map_or(f64::INFINITY, |g| g.0));
            // Zoom in when every value sits far from zero (e.g. intervals close to the target).
            let x_min = if lo > 0.5 * hi {
                lo - (hi - lo).max(hi * 0.02) * 0.5
            } else {
                0.0
            };
            let x_max = hi + (hi - x_min).max(hi * 0.02) * 0.05;
            CdfData {
                title: format!(
                    "{what}: CDF over {} epochs (p50 {} {unit}, p99 {} {unit}, max {} {unit})",
                    values.len(),
                    fmt(pct(0.5)),
                    fmt(pct(0.99)),
                    fmt(values.last().copied().unwrap_or(0.0)),
                ),
                x_max: if x_max > x_min { x_max } else { x_min + 1.0 },
                x_min,
                values,
                unit,
                guide,
            }
        }

        fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
        where
            DB::ErrorType: 'static,
        {
            let mut chart: ChartContext<DB, Cartesian2d<RangedCoordf64, RangedCoordf64>> =
                ChartBuilder::on(root)
                    .caption(&self.title, ("sans-serif", 24))
                    .margin(20)
                    .x_label_area_size(50)
                    .y_label_area_size(80)
                    .build_cartesian_2d(self.x_min..self.x_max, 0.0..1.0)
                    .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(format!("duration ({})", self.unit))
                .x_label_formatter(&|v| short(*v))
                .y_desc("fraction of epochs <= x")
                .axis_desc_style(("sans-serif", 20))
                .label_style(("sans-serif", 16))
                .light_line_style(RGBColor(235, 235, 235))
                .draw()
                .map_err(err)?;
            // A step function: at each value the fraction rises by 1/n.
            let n = self.values.len() as f64;
            let mut steps = Vec::with_capacity(self.values.len() * 2 + 1);
            steps.push((self.x_min, 0.0));
            for (i, &v) in self.values.iter().enumerate() {
                steps.push((v, i as f64 / n));
                steps.push((v, (i + 1) as f64 / n));
            }
            chart
                .draw_series(LineSeries::new(steps, ENCODED.stroke_width(2)))
                .map_err(err)?
                .label("CDF")
                .legend(legend_mark(ENCODED, 3));
            if let Some((g, label)) = self.guide {
                chart
                    .draw_series(LineSeries::new(
                        vec![(g, 0.0), (g, 1.0)],
                        GUIDE.stroke_width(1),
                    ))
                    .map_err(err)?
                    .label(label)
                    .legend(legend_mark(GUIDE, 2));
            }
            draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
        }
    }
}
