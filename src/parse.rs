//! Parsers of argument values (used by clap in `cli.rs`; an error there exits with status 2).

use std::time::Duration;
use tardi_checkpointer::delta::Codec;

/// A duration with its unit: `500ms`, `10s`, `1.5s`, `2m`, `1h`, `1m30s`, `250us`. Every
/// duration flag of `tardi` takes this one syntax; a bare number is refused (is `100` seconds
/// or milliseconds?).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (examples: 500ms, 10s, 2m, 1m30s)");
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    if t.parse::<f64>().is_ok() {
        return Err(format!(
            "{s:?} has no unit: write {t}ms or {t}s (a duration takes ns, us, ms, s, m or h)"
        ));
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

/// A rate in bits per second: `1Gbit/s`, `100mbit`, `10Gbps`, `500kbit/s`, or plain bits/s
/// (`2500000`). Prefixes (k, M, G, T, either case) are decimal: k = 1000. Every bandwidth flag
/// of `tardi` takes this one syntax.
pub fn parse_bandwidth(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a bandwidth (examples: 1Gbit/s, 100mbit, 2500000)");
    let t = s.trim();
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let n: f64 = t[..num_end].parse().map_err(|_| bad())?;
    if t[num_end..].contains('B') {
        return Err(format!(
            "{s:?}: a bandwidth is in bits (1Gbit/s), not bytes (B)"
        ));
    }
    let unit = t[num_end..].trim().to_ascii_lowercase();
    let (scale, rest) = match unit.chars().next() {
        Some('k') => (1e3, &unit[1..]),
        Some('m') => (1e6, &unit[1..]),
        Some('g') => (1e9, &unit[1..]),
        Some('t') => (1e12, &unit[1..]),
        _ => (1.0, unit.as_str()),
    };
    if !matches!(rest, "" | "bit/s" | "bps" | "b/s" | "bit" | "bits") {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_one_syntax_with_a_unit() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration("1.5s"), Ok(ms(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        for bad in ["", "100", "0s", "soon", "5 parsecs", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_duration("100").unwrap_err().contains("100ms"));
    }

    #[test]
    fn bandwidths_take_both_spellings_the_flags_had() {
        for (s, bps) in [
            ("1Gbit/s", 1_000_000_000),
            ("1gbit", 1_000_000_000),
            ("100Mbit/s", 100_000_000),
            ("100mbit", 100_000_000),
            ("10Gbps", 10_000_000_000),
            ("500kbit", 500_000),
            ("2500000", 2_500_000),
        ] {
            assert_eq!(parse_bandwidth(s), Ok(bps), "{s}");
        }
        for bad in ["fast", "-1gbit", "1GB/s", "0", "1 furlong"] {
            assert!(parse_bandwidth(bad).is_err(), "{bad:?}");
        }
    }
}
