//! Numbers as people read them: bytes, rates, durations, percentages.

pub(super) fn percent(fraction: f64) -> String {
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
pub(super) fn fmt_link(bps: u64) -> String {
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
pub(super) fn fmt_bytes(b: f64) -> String {
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
pub(super) fn fmt_rate(bytes_per_s: f64) -> String {
    format!(
        "{:.2} MB/s ({})",
        bytes_per_s / 1e6,
        fmt_link((bytes_per_s * 8.0) as u64)
    )
}

pub(super) fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}
