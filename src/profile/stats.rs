//! The numbers: per-epoch records, percentiles, the summary and its verdict.

use super::units::{fmt_link, percent};
use anyhow::Context;
use serde::Serialize;
use std::net::Ipv4Addr;
use std::time::Instant;
use tardi_checkpointer::epoch::{EpochConfig, EpochStats};
use tardi_checkpointer::store::Image;

/// Above this share of the link, a service is a poor candidate (Tardigrade §6.1).
pub(super) const LINK_SHARE: f64 = 0.4;
/// Added latency ≈ this many mean epochs (output is held until its epoch is replicated).
const LATENCY_EPOCHS: f64 = 1.5;

/// One incremental epoch as printed with `--json` and written to `epochs.json`.
#[derive(Serialize)]
pub(super) struct EpochLine<'a> {
    #[serde(flatten)]
    pub(super) st: &'a EpochStats,
    /// When the epoch's checkpoint was ready, since the full checkpoint.
    pub(super) time_us: u64,
}

pub(super) struct Rec {
    pub(super) st: EpochStats,
    pub(super) time_us: u64,
}

impl Rec {
    pub(super) fn line(&self) -> EpochLine<'_> {
        EpochLine {
            st: &self.st,
            time_us: self.time_us,
        }
    }
}

/// Applies an epoch's checkpoint to the verification image (if any), prints its JSON line (with
/// `--json`) and keeps its record.
pub(super) fn record(
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
pub(super) struct Pct {
    pub(super) p50: u64,
    pub(super) p90: u64,
    pub(super) p99: u64,
    pub(super) max: u64,
}

impl Pct {
    pub(super) fn of(mut v: Vec<u64>) -> Pct {
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
pub(super) fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> T {
    sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[derive(Serialize)]
pub(super) struct Percentiles {
    pub(super) interval_us: Pct,
    pub(super) pause_us: Pct,
    pub(super) dirty_pages: Pct,
    pub(super) encoded_bytes: Pct,
}

#[derive(Serialize)]
pub(super) struct ConfigOut {
    pub(super) interval_ms: f64,
    pub(super) min_interval_ms: f64,
    pub(super) cap_pages: u64,
    pub(super) hot_epochs: u32,
    pub(super) codec: String,
    pub(super) twin_budget_bytes: u64,
}

#[derive(Serialize)]
pub(super) struct Summary {
    pub(super) summary: bool,
    pub(super) name: String,
    /// The sandbox's IPv4 address (what `{address}` in --load became).
    pub(super) address: String,
    /// Why profiling ended: "duration", "signal N", or how the service ended.
    pub(super) stopped: String,
    pub(super) config: ConfigOut,
    /// Incremental epochs (the full checkpoint, epoch 0, is not counted).
    pub(super) epochs: u64,
    /// Time the incremental epochs cover: sum of their intervals and pauses.
    pub(super) span_us: u64,
    /// The full checkpoint (epoch 0): page bytes and pause.
    pub(super) full_bytes: u64,
    pub(super) full_pause_us: u64,
    /// Totals over the incremental epochs.
    pub(super) dirty_pages: u64,
    pub(super) fresh_pages: u64,
    pub(super) raw_bytes: u64,
    pub(super) encoded_bytes: u64,
    pub(super) capped_epochs: u64,
    /// Per-epoch distributions.
    pub(super) percentiles: Percentiles,
    pub(super) mean_epoch_us: f64,
    /// raw_bytes / span (page-granular dirty rate), bytes/s.
    pub(super) dirty_rate_bytes_per_s: f64,
    /// encoded_bytes / span: what replication would send, bytes/s.
    pub(super) encoded_rate_bytes_per_s: f64,
    pub(super) link_bandwidth_bps: u64,
    /// encoded rate / link bandwidth.
    pub(super) link_fraction: f64,
    /// dirty (raw) rate / link bandwidth.
    pub(super) raw_link_fraction: f64,
    /// ≈ 1.5 × the mean epoch length.
    pub(super) expected_added_latency_us: f64,
    pub(super) good: bool,
    pub(super) verdict: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) verified: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) verify_error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) verify_differences: Vec<String>,
}

pub(super) fn summarize(
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
pub(super) fn verdict(fraction: f64, link_bps: u64) -> String {
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
