//! Address ranges and their set operations, with the page constants: the one home of the
//! arithmetic the tracker, the epoch loop and the capture do on spans of a process's memory.
//!
//! A [`Range`] is half-open, `(start, end)` with `start <= end`; a *set* is a `Vec<Range>`
//! that [`merge`] has made sorted and disjoint (overlapping and touching ranges joined, empty
//! ones dropped). Every operation is linear in its inputs once they are sets: these run
//! inside a pause, over every mapping of the process (a quadratic version cost ~0.5 ms on
//! Redis's ~120 mappings).

/// The page size this checkpointer supports (x86-64's base page): the image crate's.
pub use crate::delta::PAGE;

/// The end of the user part of an x86-64 address space with 4-level page tables (the highest
/// address a mapping may end at, less the guard page).
pub const USER_END: u64 = 0x7fff_ffff_f000;

/// A half-open span of addresses, `(start, end)`.
pub type Range = (u64, u64);

/// `v` as a set: sorted, overlapping and touching ranges joined, empty ones dropped.
pub fn merge(mut v: Vec<Range>) -> Vec<Range> {
    v.retain(|r| r.0 < r.1);
    v.sort_unstable();
    let mut out: Vec<Range> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(l) if s <= l.1 => l.1 = l.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Each range of `a` minus the set `b` (sorted and disjoint, as [`merge`] returns), in the
/// order of `a`. For holes in any order, [`subtract_any`].
pub fn subtract(a: &[Range], b: &[Range]) -> Vec<Range> {
    debug_assert!(is_set(b), "subtract: the holes are not a set");
    let mut out = Vec::new();
    for &(s, e) in a {
        let mut at = s;
        let mut i = b.partition_point(|h| h.1 <= s);
        while at < e {
            match b.get(i) {
                Some(&(hs, he)) if hs < e => {
                    if hs > at {
                        out.push((at, hs));
                    }
                    at = at.max(he);
                    i += 1;
                }
                _ => {
                    out.push((at, e));
                    break;
                }
            }
        }
    }
    out
}

/// `a` minus the union of `holes`, which may be in any order and overlap.
pub fn subtract_any(a: &[Range], holes: &[Range]) -> Vec<Range> {
    subtract(a, &merge(holes.to_vec()))
}

/// Each range of `a` intersected with the set `b` (sorted and disjoint), in the order of `a`.
pub fn intersect(a: &[Range], b: &[Range]) -> Vec<Range> {
    debug_assert!(is_set(b), "intersect: the second operand is not a set");
    let mut out = Vec::new();
    for &(s, e) in a {
        let mut i = b.partition_point(|h| h.1 <= s);
        while let Some(&(bs, be)) = b.get(i).filter(|h| h.0 < e) {
            let (x, y) = (s.max(bs), e.min(be));
            if x < y {
                out.push((x, y));
            }
            i += 1;
        }
    }
    out
}

/// Sorted page addresses → the ranges of consecutive pages.
pub fn coalesce(pages: &[u64]) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::new();
    for &a in pages {
        match out.last_mut() {
            Some(r) if r.1 == a => r.1 += PAGE,
            _ => out.push((a, a + PAGE)),
        }
    }
    out
}

/// The gaps between sorted ranges, over the whole user address space (up to [`USER_END`]).
pub fn gaps(sorted: &[Range]) -> Vec<Range> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for &(s, e) in sorted {
        if s > at {
            out.push((at, s));
        }
        at = at.max(e);
    }
    if at < USER_END {
        out.push((at, USER_END));
    }
    out
}

/// Whether `v` is a set: sorted, disjoint and not touching, no empty range.
pub fn is_set(v: &[Range]) -> bool {
    v.iter().all(|r| r.0 < r.1) && v.windows(2).all(|w| w[0].1 < w[1].0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_sorts_joins_and_drops_empty_ranges() {
        assert_eq!(
            merge(vec![(5, 9), (1, 3), (2, 4), (9, 10), (7, 7)]),
            vec![(1, 4), (5, 10)]
        );
        assert_eq!(
            merge(vec![(20, 30), (0, 10), (10, 15), (25, 40), (50, 60)]),
            vec![(0, 15), (20, 40), (50, 60)]
        );
        assert!(merge(vec![]).is_empty());
    }

    #[test]
    fn subtract_keeps_the_order_of_its_first_operand() {
        assert_eq!(
            subtract(&[(0, 100)], &[(10, 20), (50, 60)]),
            vec![(0, 10), (20, 50), (60, 100)]
        );
        assert_eq!(subtract(&[(0, 100)], &[(0, 100)]), vec![]);
        assert_eq!(subtract(&[(10, 20)], &[(0, 5)]), vec![(10, 20)]);
        assert_eq!(
            subtract(&[(0, 10)], &[(2, 3), (5, 12)]),
            vec![(0, 2), (3, 5)]
        );
        // Ranges out of order, holes in any order: each minus the holes, in the given order.
        assert_eq!(
            subtract_any(&[(40, 50), (0, 10), (20, 30)], &[(45, 60), (5, 25)]),
            vec![(40, 45), (0, 5), (25, 30)]
        );
    }

    #[test]
    fn intersect_is_linear_and_exact() {
        assert_eq!(
            intersect(&[(0, 10)], &[(2, 3), (5, 12)]),
            vec![(2, 3), (5, 10)]
        );
        assert_eq!(intersect(&[(3, 5)], &[(0, 3), (5, 9)]), vec![]);
        assert_eq!(
            intersect(&[(8, 20), (0, 4)], &[(2, 3), (5, 12)]),
            vec![(8, 12), (2, 3)]
        );
    }

    /// The set operations against a page-by-page model on random inputs.
    #[test]
    fn operations_agree_with_a_page_model() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(27);
        let mut random = |n: usize| -> Vec<Range> {
            (0..n)
                .map(|_| {
                    let s = rng.random_range(0..64u64);
                    (s, s + rng.random_range(0..8u64))
                })
                .collect()
        };
        let model = |v: &[Range]| -> std::collections::BTreeSet<u64> {
            v.iter().flat_map(|&(s, e)| s..e).collect()
        };
        for _ in 0..500 {
            let (a, b) = (random(6), random(6));
            let bset = merge(b.clone());
            assert!(is_set(&bset));
            assert_eq!(model(&bset), model(&b));
            let diff = model(&subtract_any(&a, &b));
            let want: std::collections::BTreeSet<u64> =
                model(&a).difference(&model(&b)).copied().collect();
            assert_eq!(diff, want, "{a:?} - {b:?}");
            let inter = model(&intersect(&a, &bset));
            let want: std::collections::BTreeSet<u64> =
                model(&a).intersection(&model(&b)).copied().collect();
            assert_eq!(inter, want, "{a:?} & {b:?}");
        }
    }

    #[test]
    fn pages_and_gaps() {
        assert_eq!(
            coalesce(&[0, 4096, 8192, 16384]),
            vec![(0, 12288), (16384, 20480)]
        );
        assert_eq!(gaps(&[(4096, 8192)]), vec![(0, 4096), (8192, USER_END)]);
    }
}
