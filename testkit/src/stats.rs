//! Percentiles for the benchmarks' tables. Two definitions are in use, kept apart by name so a
//! figure keeps the meaning it was published with:
//!
//! * [`nearest_rank`]: the smallest value with at least a fraction `p` of the values at or
//!   below it (rank `ceil(p·n)`, 1-based) — the replication and epoch benchmarks;
//! * [`rounded_rank`]: the value at index `round(p·(n−1))` (0-based) — the fault campaign's
//!   gaps, the scrub cost, the quiesce, files and transport benchmarks;
//! * [`floor_rank`]: the value at index `floor(p·n)` (0-based; the upper median) — the load
//!   generator, the twin-encoding benchmark and the replication benchmark's medians.
//!
//! Neither interpolates: every percentile is one of the measured values.

/// The nearest-rank `p`-quantile (`p` in 0..=1) of `sorted` (ascending); `None` when empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// The value at index `round(p·(n−1))` of `sorted` (ascending); `None` when empty.
pub fn rounded_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[i.min(sorted.len() - 1)])
}

/// The value at index `floor(p·n)` of `sorted` (ascending; the last one for `p` = 1); `None`
/// when empty.
pub fn floor_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let i = (sorted.len() as f64 * p) as usize;
    Some(sorted[i.min(sorted.len() - 1)])
}

/// [`nearest_rank`] of values in a table: NaN when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    nearest_rank(sorted, p).unwrap_or(f64::NAN)
}

/// [`percentile`] of values in any order (a sorted copy is taken).
pub fn percentile_of(values: &[f64], p: f64) -> f64 {
    percentile(&sorted(values.to_vec()), p)
}

/// [`rounded_rank`] of values in a table: NaN when there are none.
pub fn percentile_rounded(sorted: &[f64], p: f64) -> f64 {
    rounded_rank(sorted, p).unwrap_or(f64::NAN)
}

/// `v`, sorted ascending (NaNs last).
pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The mean of `v`; NaN when empty.
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_is_the_smallest_value_covering_p() {
        let v: Vec<u32> = (1..=10).collect();
        assert_eq!(nearest_rank(&v, 0.5), Some(5));
        assert_eq!(nearest_rank(&v, 0.9), Some(9));
        assert_eq!(nearest_rank(&v, 0.91), Some(10));
        assert_eq!(nearest_rank(&v, 0.0), Some(1));
        assert_eq!(nearest_rank(&v, 1.0), Some(10));
        assert_eq!(nearest_rank::<u32>(&[], 0.5), None);
        assert_eq!(nearest_rank(&[7], 0.999), Some(7));
    }

    #[test]
    fn rounded_rank_rounds_the_index() {
        let v: Vec<u32> = (1..=10).collect();
        // index round(4.5) = 5 (round half away from zero)
        assert_eq!(rounded_rank(&v, 0.5), Some(6));
        assert_eq!(rounded_rank(&v, 0.9), Some(9));
        assert_eq!(rounded_rank(&v, 0.99), Some(10));
        assert_eq!(rounded_rank(&v, 0.0), Some(1));
        assert_eq!(rounded_rank(&v, 1.0), Some(10));
        assert_eq!(rounded_rank::<u32>(&[], 0.5), None);
    }

    #[test]
    fn floor_rank_takes_the_index_below() {
        let v: Vec<u32> = (1..=10).collect();
        assert_eq!(floor_rank(&v, 0.5), Some(6));
        assert_eq!(floor_rank(&v, 0.1), Some(2));
        assert_eq!(floor_rank(&v, 0.99), Some(10));
        assert_eq!(floor_rank(&v, 1.0), Some(10));
        assert_eq!(floor_rank(&v[..9], 0.5), Some(5));
        assert_eq!(floor_rank::<u32>(&[], 0.5), None);
    }

    #[test]
    fn the_table_forms_are_nan_when_empty() {
        assert!(percentile(&[], 0.5).is_nan());
        assert!(percentile_rounded(&[], 0.5).is_nan());
        assert!(mean(&[]).is_nan());
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(percentile_of(&[4.0, 1.0, 3.0, 2.0], 0.75), 3.0);
        assert!(percentile_of(&[], 0.5).is_nan());
        assert_eq!(percentile_rounded(&[1.0, 2.0, 3.0, 4.0], 0.5), 3.0);
        assert_eq!(mean(&[1.0, 2.0, 3.0]), 2.0);
        assert_eq!(sorted(vec![3.0, 1.0, 2.0]), vec![1.0, 2.0, 3.0]);
    }
}
