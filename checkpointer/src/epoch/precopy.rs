//! Dirty-page pre-copy: before a pause, the pages written so far are taken (protected again) and
//! copied while the service runs, so the pause copies only those written again since.

#[allow(unused_imports)]
use super::*;

impl EpochLoop {
    /// Dirty-page pre-copy (see [`EpochConfig::precopy`]): takes the written pages of every
    /// armed range, which protects them again, and copies them while the service runs. A page
    /// written after that is reported again by the pause's scan and copied there; the others
    /// still hold what was copied here. Nothing taken here may be lost: pages it could not copy
    /// are kept for the pause to copy, and a capture that fails keeps them for the next one.
    /// Every page taken is copied, hot or not: hot pages are told apart only by a tracker that
    /// leaves them writable ([`Tracker::hot_pages_writable`]), and such a tracker (mprotect)
    /// does not pre-copy, while under userfaultfd a hot page written again before the pause is
    /// reported by its scan and copied there, the others need no copy in it (on Redis that
    /// took the pause's median from 1.03–1.16 to 0.86–0.95 ms: docs/BENCHMARKS.md, "Dirty-page
    /// pre-copy").
    pub(super) fn precopy(&mut self) {
        let t = Instant::now();
        let mut written = Vec::new();
        // Replaced memory is not registered: the scan skips it, and the pause (process
        // stopped) finds it and captures it whole. A failure (the process is dying) leaves the
        // ranges from the failed one on to the pause, captured whole.
        let stale = match self.tracker.take_all(&self.armed, None, &mut written) {
            Ok(stale) => stale,
            Err((_, i)) => self.armed[i..].to_vec(),
        };
        debug_assert!(
            self.hot.is_empty(),
            "a pre-copying tracker tells no hot pages apart"
        );
        let mut pages: Vec<u64> = written
            .iter()
            .flat_map(|&(s, e, _)| (s..e).step_by(PAGE as usize))
            .collect();
        pages.sort_unstable();
        pages.dedup();
        let readable = |a: u64| mapping_at(&self.prev_maps, a).is_some_and(|m| m.read);
        let want: Vec<(u64, u64, bool)> = coalesce(&pages)
            .into_iter()
            .map(|(s, e)| (s, e - s, readable(s)))
            .collect();
        let stall = self.cfg.precopy_stall / 2;
        if !stall.is_zero() {
            std::thread::sleep(stall);
        }
        let buf = std::mem::take(&mut self.prebuf);
        let mut fresh = Precopy::default();
        match copy_ranges(&self.proc, &want, buf) {
            Ok((runs, data)) => {
                for r in &runs {
                    for p in 0..r.len / PAGE {
                        fresh
                            .pages
                            .push((r.addr + p * PAGE, Some((r.data_off + p * PAGE) as usize)));
                    }
                }
                fresh.data = data;
            }
            Err(_) => fresh.pages = pages.iter().map(|&a| (a, None)).collect(),
        }
        fresh.pages.sort_unstable_by_key(|p| p.0);
        if !stall.is_zero() {
            std::thread::sleep(stall);
        }
        fresh.took = t.elapsed();
        fresh.stale = stale;
        // Pages left from a capture that failed: the newer copy wins.
        if let Some(old) = self.pre.take() {
            fresh.stale.extend(old.stale);
            let newer: HashSet<u64> = fresh.pages.iter().map(|p| p.0).collect();
            let base = fresh.data.len();
            fresh.data.extend_from_slice(&old.data);
            for (a, o) in old.pages {
                if !newer.contains(&a) {
                    fresh.pages.push((a, o.map(|o| o + base)));
                }
            }
            fresh.pages.sort_unstable_by_key(|p| p.0);
        }
        self.pre = Some(fresh);
    }

    /// Pre-copies (see [`EpochLoop::precopy`]) when it pays and can be trusted.
    pub(super) fn maybe_precopy(&mut self) {
        // With swap active, "present" cannot tell a zapped page from a swapped one (see
        // `crate::track::has_contents`), which the pre-copy relies on: no pre-copy then.
        if self.cfg.precopy
            && self.last_dirty >= self.cfg.precopy_min_pages
            && self.tracker.precopy_capable()
            && self.contents == PAGE_IS_PRESENT
        {
            self.precopy();
        }
    }
}
