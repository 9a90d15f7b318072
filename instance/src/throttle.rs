//! A token bucket on the checkpoint stream (`--link-bandwidth`), so Tardigrade's 1 Gb/s
//! experiments can be reproduced where veth links are far faster.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bits per second → a bucket that lets `rate` bytes per second through, with bursts of at
/// most `burst` bytes (one 10 ms worth, at least 64 KiB).
pub struct Throttle {
    rate: f64,
    burst: f64,
    st: Mutex<(f64, Instant)>,
}

impl Throttle {
    pub fn new(bits_per_sec: u64) -> Throttle {
        let rate = bits_per_sec as f64 / 8.0;
        let burst = (rate / 100.0).max(65536.0);
        Throttle {
            rate,
            burst,
            st: Mutex::new((burst, Instant::now())),
        }
    }

    /// How long to wait before `bytes` may go (the tokens are taken now: callers then sleep
    /// that long, so concurrent senders share the rate).
    pub fn take(&self, bytes: usize) -> Duration {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (tokens, last) = *st;
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * self.rate).min(self.burst)
            - bytes as f64;
        *st = (tokens, now);
        if tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-tokens / self.rate)
        }
    }
}

/// Parses `1gbit`, `100mbit`, `500kbit`, `2000000` (bits per second).
pub fn parse_bandwidth(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = t.strip_suffix("gbit") {
        (n, 1e9)
    } else if let Some(n) = t.strip_suffix("mbit") {
        (n, 1e6)
    } else if let Some(n) = t.strip_suffix("kbit") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("bit") {
        (n, 1.0)
    } else {
        (t.as_str(), 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a bandwidth (examples: 1gbit, 100mbit, 500kbit)"))?;
    if v.is_nan() || v <= 0.0 || !v.is_finite() {
        return Err(format!("bandwidth {s:?} must be positive"));
    }
    Ok((v * mult) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_paces() {
        assert_eq!(parse_bandwidth("1gbit"), Ok(1_000_000_000));
        assert_eq!(parse_bandwidth("100Mbit"), Ok(100_000_000));
        assert!(parse_bandwidth("fast").is_err() && parse_bandwidth("-1gbit").is_err());
        // 8 Mbit/s = 1 MB/s: after the burst, 1 MB more waits about a second.
        let t = Throttle::new(8_000_000);
        assert_eq!(t.take(65536), Duration::ZERO);
        let w = t.take(1_000_000);
        assert!(
            w > Duration::from_millis(900) && w < Duration::from_millis(1100),
            "{w:?}"
        );
    }
}
