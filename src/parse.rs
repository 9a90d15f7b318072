//! Parsers of argument values (used by clap in `cli.rs`; an error there exits with status 2).

use std::time::Duration;
use tardi_checkpointer::delta::Codec;

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
