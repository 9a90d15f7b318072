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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paces() {
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
