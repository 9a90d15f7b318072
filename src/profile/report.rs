//! What a person reads: the summary and the progress lines while profiling.

use super::stats::{Pct, Rec, Summary};
use super::units::{fmt_bytes, fmt_rate, fmt_us, percent};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

pub(super) fn print_summary(s: &Summary, verbose_diffs: bool) {
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

/// Human progress: a line per epoch when epochs are slow (≥ 100 ms), else a progress line at
/// most every 500 ms (rewritten in place on a terminal).
pub(super) struct Progress {
    on: bool,
    lines: bool,
    tty: bool,
    last: Instant,
    window: (u64, u64, u64, u64),
    shown: bool,
}

impl Progress {
    pub(super) fn new(human: bool, interval: Duration) -> Progress {
        Progress {
            on: human,
            lines: interval >= Duration::from_millis(100),
            tty: std::io::stderr().is_terminal(),
            last: Instant::now(),
            window: (0, 0, 0, 0),
            shown: false,
        }
    }

    pub(super) fn epoch(&mut self, r: &Rec, duration: Duration) {
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

    pub(super) fn finish(&mut self) {
        if self.on && self.tty && self.shown {
            eprint!("\r{:<100}\r", "");
        }
    }
}
