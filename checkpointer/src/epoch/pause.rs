//! One process's pause: its layout, metadata and handles, the pages the tracker took and the
//! mappings that are new or replaced, copied; then, after the resume, what the pause left to do
//! (`finish`, `identify`).

#[allow(unused_imports)]
use super::*;

impl EpochLoop {
    /// The part inside the pause. Whatever it takes from the tracker goes into `j` first (see
    /// [`Carry`]); `fullbuf` is the copy buffer of a full checkpoint, if one is wanted.
    /// The last pause's layout (taken from `prev_maps`), with every mapping that grows down
    /// (`gd`: the main thread's stack, extended by the kernel on a fault below it, with no
    /// system call) as the kernel has it now. `None`, `prev_maps` left as it was, when that
    /// cannot be asked or such a mapping is not where it was.
    pub(super) fn grown_stacks(&mut self) -> Option<Vec<MapEntry>> {
        let file = self.maps_file.as_ref()?;
        let mut maps = std::mem::take(&mut self.prev_maps);
        for m in maps.iter_mut().filter(|m| m.has_flag("gd")) {
            match Proc::mapping_at(file, m.end - PAGE) {
                Ok(Some((start, end))) if end == m.end && start <= m.start => {
                    if m.kernel.0 == m.start {
                        m.kernel.0 = start;
                    }
                    m.start = start;
                }
                _ => {
                    self.prev_maps = maps;
                    return None;
                }
            }
        }
        Some(maps)
    }

    /// The layout read from `/proc`: `maps`, and `smaps` for the flags only when the layout
    /// is not the last pause's. With `expect_same` (no layout call was counted since the last
    /// pause: a periodic full read that checks the carrying), a difference is a change the
    /// count missed: logged and counted (`EpochStats::layout_missed`).
    pub(super) fn read_layout(&mut self, expect_same: bool) -> Result<Vec<MapEntry>> {
        let pid = self.proc.pid;
        if expect_same && let Some(m) = self.grown_stacks() {
            self.prev_maps = m;
        }
        let maps = self
            .tracker
            .layout(self.proc.maps().map_err(proc_err(pid, "maps"))?);
        let same = same_layout(&maps, &self.prev_maps);
        if expect_same && !same {
            self.layout_missed += 1;
            tracing::warn!(
                pid,
                "the layout changed with no layout call counted: caught by the periodic full read"
            );
        }
        // VmFlags come from smaps, which is costly: only when the layout changed.
        Ok(if same {
            // The flags are the previous pause's; the rest (the kernel mappings behind each
            // entry, which a tracker's protection may have split differently) is this one's.
            let mut maps = maps;
            for (m, p) in maps.iter_mut().zip(std::mem::take(&mut self.prev_maps)) {
                m.vmflags = p.vmflags;
            }
            maps
        } else {
            self.tracker
                .layout(self.proc.smaps().map_err(proc_err(pid, "smaps"))?)
        })
    }

    pub(super) fn capture(
        &mut self,
        st: &mut Stopped,
        fullbuf: &mut Option<Vec<u8>>,
        j: &mut Carry,
        alone: bool,
    ) -> Result<Captured> {
        let pid = self.proc.pid;
        self.tracker.begin(st)?;
        let mut parts = Parts::default();
        let tl = Instant::now();
        let epoch = self.epoch + 1;
        // The periodic check of what is carried between pauses, one group of values at a time.
        let refresh = capture::Refresh::staggered(epoch, self.cfg.refresh_every);
        // The layout is carried from the last pause when the process made no layout call
        // since (counted by eBPF while it ran; it is stopped now, so the count is final), the
        // tracker changes no mapping by itself between pauses, and this is not a refresh.
        // What moves without a call — a stack growing down — is asked of the kernel below.
        let layout_calls = self
            .cache
            .calls
            .as_ref()
            .map(|c| c.count(crate::syscount::LAYOUT));
        let unchanged = layout_calls.is_some()
            && layout_calls == self.layout_seen
            && self.tracker.layout_carried()
            && !self.prev_maps.is_empty();
        let carried = if unchanged && !refresh.layout {
            self.grown_stacks()
        } else {
            None
        };
        let layout_carried = carried.is_some();
        let maps = match carried {
            Some(maps) => maps,
            None => self.read_layout(unchanged && refresh.layout)?,
        };
        self.layout_seen = None; // set again once this capture succeeds
        parts.layout = tl.elapsed();
        parts.layout_carried = layout_carried;
        let mut meta = capture::capture_meta(&self.proc, st, &maps, &mut self.cache, refresh)?;
        parts.meta = self.cache.times;
        self.tracker.threads(&meta.threads, &maps);
        self.tracker.patch_image(&mut meta);
        // Opened now: after the resume the process may be gone.
        let tx = Instant::now();
        let mut exe = capture::PendingFile::exe(&meta.exe.path);
        exe.open(&self.proc)?;
        parts.exe = tx.elapsed();
        // Nothing above changed tracking state: a failure there can be retried as it is. From
        // here on, what the tracker hands over goes into the journal `j` first.
        let ts = Instant::now();

        // Written pages of every armed range, and the ranges holding a mapping replaced since
        // they were armed (see `UffdTracker::replaced`: one scan over all of them, a check of
        // the mappings alone for replaced ones).
        let mut written = Vec::new();
        // (A carried layout has no replaced mapping: replacing one takes a layout call.)
        let replaced_check = (!layout_carried).then_some(&maps[..]);
        let mut stale = match self
            .tracker
            .take_all(&self.armed, replaced_check, &mut written)
        {
            Ok(stale) => stale,
            Err((err, i)) => {
                // The scan may have protected pages it did not report: the ranges from the
                // failed one on are captured whole next time.
                j.ranges.extend_from_slice(&self.armed[i..]);
                j.pages.extend(written.iter().map(|r| (r.0, r.1)));
                return Err(err.into());
            }
        };
        j.pages.extend(written.iter().map(|r| (r.0, r.1)));
        parts.take = ts.elapsed();
        // A range that failed the check may have had pages before its replaced part protected
        // without being reported; should the layout change again before the next pause, its
        // next scan could pass: captured whole next time in any case.
        j.ranges.extend_from_slice(&stale);
        self.fail_at(FailPoint::AfterScan)?;
        // Ranges the pre-copy could not scan to the end: the scan may have protected pages
        // before the failing part without reporting them. Captured whole, as stale ones. So
        // are the ranges a failed pause left in an unknown state.
        if let Some(pre) = &self.pre {
            stale.extend(pre.stale.iter().copied());
        }
        stale.extend(self.carry.ranges.iter().copied());
        // Fresh: parts of trackable mappings not covered by a valid armed range.
        let valid: Vec<(u64, u64)> = subtract_any(&self.armed, &stale);
        // (One subtraction over every trackable mapping: the holes are merged once.)
        let trackable_ranges: Vec<(u64, u64)> = maps
            .iter()
            .filter(|m| trackable(m))
            .map(|m| (m.start, m.end))
            .collect();
        let fresh: Vec<(u64, u64)> = subtract_any(&trackable_ranges, &valid);
        // Armed below: a failure after that must not leave them for valid armed ranges.
        j.ranges.extend_from_slice(&fresh);
        // Pages to save in fresh ranges: those that exist (file mappings: copied-on-write).
        let mut fresh_pages: Vec<(u64, u64, u64)> = Vec::new();
        for &(s, e) in &fresh {
            let file = maps
                .iter()
                .find(|m| m.start <= s && s < m.end)
                .is_some_and(capture::is_file_backed);
            let q = Query {
                anyof: self.contents,
                mask: if file { PAGE_IS_FILE } else { 0 },
                inverted: if file { PAGE_IS_FILE } else { 0 },
                ret: PAGE_IS_PRESENT,
                ..Default::default()
            };
            self.tracker.scan(s, e, q, &mut fresh_pages)?;
        }
        // Arm what is new: register whole mappings (re-registering armed parts is harmless),
        // protect only the fresh parts.
        let mut armed_any = false;
        for m in maps.iter().filter(|m| trackable(m)) {
            if fresh.iter().any(|&(s, e)| s < m.end && m.start < e) {
                // Registering an already registered part is a no-op for the kernel.
                self.tracker.arm(m.start, m.end)?;
                armed_any = true;
            }
        }
        // Registering can merge or split mappings (their flags changed): the layout to record
        // is the one after it.
        let maps = if armed_any && self.tracker.arm_changes_layout() {
            self.tracker
                .layout(self.proc.smaps().map_err(proc_err(pid, "smaps"))?)
        } else {
            maps
        };
        self.armed = maps
            .iter()
            .filter(|m| trackable(m))
            .map(|m| (m.start, m.end))
            .collect();

        // Dirty pages (outside fresh ranges), hot-page bookkeeping.
        let in_fresh = |a: u64| fresh.iter().any(|&(s, e)| s <= a && a < e);
        let mut dirty: Vec<u64> = Vec::new();
        for &(s, e, _) in &written {
            let mut a = s;
            while a < e {
                if !in_fresh(a) {
                    dirty.push(a);
                }
                a += PAGE;
            }
        }
        // Pages a failed pause took: written since the last checkpoint, wherever they are
        // still mapped (outside fresh ranges, which are captured whole).
        {
            let armed = &self.armed;
            let mapped = |a: u64| {
                let i = armed.partition_point(|r| r.1 <= a);
                armed.get(i).is_some_and(|r| r.0 <= a)
            };
            for &(s, e) in &self.carry.pages {
                dirty.extend(
                    (s..e)
                        .step_by(PAGE as usize)
                        .filter(|&a| !in_fresh(a) && mapped(a)),
                );
            }
        }
        dirty.sort_unstable();
        dirty.dedup();
        // Pages the pre-copy took: written this epoch too. Those copied then and not written
        // since (not in `dirty`) keep that copy; those whose copy failed are copied now. Pages
        // of fresh ranges are captured with their range.
        let tp = Instant::now();
        let mut pre_copied: Vec<(u64, usize)> = Vec::new();
        let mut rewritten = 0;
        if let Some(pre) = &self.pre {
            // Still mapped: a range unmapped since the pre-copy is gone from the layout.
            let armed = &self.armed;
            let mapped = |a: u64| {
                let i = armed.partition_point(|r| r.1 <= a);
                armed.get(i).is_some_and(|r| r.0 <= a)
            };
            // (`dirty` stays sorted for the searches: the pages to copy now join it after.)
            let mut copy_now = Vec::new();
            for &(a, off) in &pre.pages {
                if in_fresh(a) || !mapped(a) {
                    continue;
                }
                if dirty.binary_search(&a).is_ok() {
                    rewritten += u64::from(off.is_some());
                    continue;
                }
                match off {
                    Some(o) => pre_copied.push((a, o)),
                    None => copy_now.push(a),
                }
            }
            dirty.extend(copy_now);
            // A pre-copied page zapped since (MADV_DONTNEED) is empty now (or the zero page, if
            // read since), yet the scan above does not report it: the zap left the
            // write-protect marker the pre-copy set. So check that each is still there; one
            // scan per armed range holding some.
            // (With the layout carried, no zap can have happened: it takes a layout call.)
            if !layout_carried {
                pre_copied.sort_unstable_by_key(|p| p.0);
                let mut present: Vec<(u64, u64, u64)> = Vec::new();
                let mut i = 0;
                while i < pre_copied.len() {
                    let a = pre_copied[i].0;
                    let r = armed[armed.partition_point(|r| r.1 <= a)];
                    let j = i + pre_copied[i..].partition_point(|p| p.0 < r.1);
                    // Present, and not the zero page (read back after the zap).
                    let q = Query {
                        anyof: PAGE_IS_PRESENT,
                        mask: PAGE_IS_PFNZERO,
                        inverted: PAGE_IS_PFNZERO,
                        ret: PAGE_IS_PRESENT,
                        ..Default::default()
                    };
                    self.tracker
                        .scan(a, pre_copied[j - 1].0 + PAGE, q, &mut present)?;
                    i = j;
                }
                let still = |a: u64| {
                    let k = present.partition_point(|r| r.1 <= a);
                    present.get(k).is_some_and(|r| r.0 <= a)
                };
                pre_copied.retain(|&(a, _)| {
                    let keep = still(a);
                    if !keep {
                        dirty.push(a); // copied now: it reads as zeros (or the file)
                    }
                    keep
                });
            }
            dirty.sort_unstable();
            dirty.dedup();
        }
        parts.precheck = tp.elapsed();
        let th = Instant::now();
        // Every page written this epoch, in address order.
        let mut written_all = dirty.clone();
        written_all.extend(pre_copied.iter().map(|p| p.0));
        written_all.sort_unstable();
        let mut hot_now = 0;
        // Hot pages matter only to a tracker that leaves them writable (see the module doc):
        // with userfaultfd they are protected and pre-copied like any other page, and telling
        // them apart would only cost the pause (~70 µs at 1,300 pages on Redis).
        if self.cfg.hot_epochs > 0 && self.tracker.hot_pages_writable() {
            // One merge of three address-ordered lists (this epoch's pages, the last streaks,
            // the last hot pages): no hashing of every written page inside the pause.
            let old_streak = std::mem::take(&mut self.streak);
            let old_hot = std::mem::take(&mut self.hot);
            let mut streak = Vec::with_capacity(written_all.len());
            let mut hot = Vec::new();
            let (mut si, mut hi) = (0, 0);
            for &a in &written_all {
                si += old_streak[si..].partition_point(|s| s.0 < a);
                let prev = old_streak.get(si).filter(|s| s.0 == a).map_or(0, |s| s.1);
                hi += old_hot[hi..].partition_point(|&h| h < a);
                let was_hot = old_hot.get(hi) == Some(&a);
                let cools = was_hot
                    && (self.cool.contains(&a)
                        || self
                            .random()
                            .is_multiple_of(self.cfg.cold_one_in.max(1) as u64));
                let n = if cools { 0 } else { prev + 1 };
                if !cools && (was_hot || n >= self.cfg.hot_epochs) {
                    hot.push(a);
                }
                streak.push((a, n));
            }
            self.streak = streak;
            self.cool.clear();
            for (s, e) in coalesce(&hot) {
                self.tracker.unprotect(s, e)?;
            }
            hot_now = hot.len() as u64;
            self.hot = hot;
        }
        // The copied-on-write pages of private file mappings, sent whole every epoch: a page
        // written and then zapped (MADV_DONTNEED) reads as the file again, yet the scan does not
        // report it (the zapped entry keeps no write-protect marker), so the receiver learns
        // which of its pages still hold their own copy from this list.
        parts.hot = th.elapsed();
        let tcow = Instant::now();
        let mut cow_list: Vec<u64> = Vec::new();
        // (Not when a range is stale: a failed scan may have taken writes it did not report.)
        let cow_carried = layout_carried && stale.is_empty();
        if cow_carried {
            // No zap, unmapping or truncation since the last pause (each takes a counted
            // call): its list still holds, and a page becomes copied-on-write only by a write,
            // which the scan reported. So: the last list, plus this epoch's written pages in
            // private file mappings (a written page is never the file's own).
            let spans = file_spans(&maps);
            let in_span = |a: u64| {
                let k = spans.partition_point(|r| r.1 <= a);
                spans.get(k).is_some_and(|r| r.0 <= a)
            };
            cow_list = std::mem::take(&mut self.prev_cow);
            cow_list.extend(written_all.iter().copied().filter(|&a| in_span(a)));
        } else {
            let mut found = Vec::new();
            for (start, end) in file_spans(&maps) {
                found.clear();
                let q = Query {
                    anyof: self.contents,
                    mask: PAGE_IS_FILE,
                    inverted: PAGE_IS_FILE,
                    ret: PAGE_IS_PRESENT,
                    ..Default::default()
                };
                self.tracker.scan(start, end, q, &mut found)?;
                for &(s, e, _) in &found {
                    cow_list.extend((s..e).step_by(PAGE as usize));
                }
            }
        }
        cow_list.sort_unstable();
        cow_list.dedup();
        // After a layout call, every copied-on-write page is copied again, written or not. The
        // kernel can give such a page new contents without a write being reported: `madvise
        // (MADV_DONTNEED)` on a protected copy leaves a write-protect marker, and the next
        // write faults in a fresh copy of the file's page, installed protected (the marker's
        // bit) before the store runs again and faults once more. A thread stopped between the
        // two faults leaves a present copy that equals the file, not reported written: the
        // receiver would keep the old copy (seen once in ~230 runs of
        // `full_checkpoint_mid_stream_and_failures_churn_uffd`, and reproduced by
        // `file_mapping_churn_stress`). Such a zap takes a layout call, so a carried list
        // needs none of this. (A page the pre-copy took is copied again too: its copy may be
        // from before the zap.)
        if !cow_carried {
            let extra: Vec<u64> = cow_list
                .iter()
                .copied()
                .filter(|&a| !in_fresh(a) && dirty.binary_search(&a).is_err())
                .collect();
            if !extra.is_empty() {
                dirty.extend_from_slice(&extra);
                dirty.sort_unstable();
                written_all.extend_from_slice(&extra);
                written_all.sort_unstable();
                written_all.dedup();
            }
        }
        let cow = coalesce(&cow_list);
        parts.cow = tcow.elapsed();
        let scan = ts.elapsed();

        let tcm = Instant::now();
        let (vmas, mut files) = describe_vmas(&maps)?;
        for f in &mut files {
            if !self.file_refs.contains_key(&(f.path.clone(), f.inode)) {
                f.open(&self.proc)?; // while stopped: after the resume the mapping may be gone
            }
        }
        // (Before the commit: it may split or merge the kernel's mappings `map_files` names.)
        // Protections for the next epoch (the mprotect tracker applies them only now, and its
        // agent's memory changes with them: before the copy, and those pages are copied too).
        let touched = self.tracker.commit(st, &self.armed, &maps)?;
        j.pages.extend(touched.iter().map(|&a| (a, a + PAGE)));
        if !touched.is_empty() {
            // A fresh range is captured as its scan (before the commit) found it: a page the
            // commit wrote there that the scan found empty is added to it. (The agent's control
            // block, merged by the kernel into a fresh anonymous range, had its table pages
            // first written by the re-arm: they were missing from the image, found by the
            // divergence check, `tests/scrub.rs`.)
            let found = |a: u64| fresh_pages.iter().any(|r| r.0 <= a && a < r.1);
            let missing: Vec<u64> = touched
                .iter()
                .copied()
                .filter(|&a| in_fresh(a) && !found(a))
                .collect();
            if !missing.is_empty() {
                fresh_pages.extend(missing.into_iter().map(|a| (a, a + PAGE, 0)));
                fresh_pages.sort_unstable_by_key(|r| r.0);
            }
            dirty.extend(touched.into_iter().filter(|&a| !in_fresh(a)));
            dirty.sort_unstable();
            dirty.dedup();
            written_all.extend_from_slice(&dirty);
            written_all.sort_unstable();
            written_all.dedup();
        }
        // A page is sent once: as copied now if it is (the pre-copy's copy is older).
        pre_copied.retain(|p| dirty.binary_search(&p.0).is_err());
        parts.commit = tcm.elapsed();

        // Copy every page to send.
        let tc = Instant::now();
        let mut want: Vec<(u64, u64, bool)> = Vec::new();
        let readable = |a: u64| mapping_at(&maps, a).is_some_and(|m| m.read);
        for (s, e) in coalesce(&dirty) {
            want.push((s, e - s, readable(s)));
        }
        let nfresh: u64 = fresh_pages.iter().map(|r| (r.1 - r.0) / PAGE).sum();
        for &(s, e, _) in &fresh_pages {
            want.push((s, e - s, readable(s)));
        }
        let buf = std::mem::take(&mut self.buf);
        let (runs, data) = copy_ranges(&self.proc, &want, buf)?;
        let copy = tc.elapsed();

        // A full checkpoint of this same state, if one is wanted: every saved page of the
        // layout just recorded, copied after the tracker's commit as the incremental's pages
        // are. (Copied inside the pause, so the pause is as long as a full checkpoint's; taking
        // it while the service runs — copy-on-write or pre-copy rounds — is not done yet.)
        let full = match fullbuf.take() {
            Some(buf) => {
                let tf = Instant::now();
                let (runs, mut data) = capture::copy_saved(&self.proc, &maps, &vmas, buf)?;
                let tree = DirTracker::new(self.cfg.private_dirs.clone())
                    .changes()
                    .map_err(EpochError::Files)?;
                let shm = if alone {
                    crate::shm::ShmTracker::default()
                        .capture(&self.proc, &maps, true, true, &mut data)?
                } else {
                    Vec::new()
                };
                Some(FullCapture {
                    runs,
                    data,
                    tree,
                    shm,
                    took: tf.elapsed(),
                })
            }
            None => None,
        };

        meta.vmas = vmas;
        // Files last, still inside the pause: consistent with the memory just copied.
        // A tree's: by the caller, once every process's layout is read (files mapped shared by
        // any of them are read by content: `capture_tree`).
        if alone {
            let tw = Instant::now();
            meta.private_files = self.dirs.changes_mapped(&maps).map_err(EpochError::Files)?;
            parts.walk = tw.elapsed();
            j.walked = true;
        }
        // Shared memory, compared by content (nothing to do for a process that has none and
        // made no layout call: see `crate::shm`). A tree's: by the caller, once for all its
        // processes (`capture_tree`).
        let mut shm_data = Vec::new();
        let shm = if alone {
            j.shm = true;
            self.shm
                .capture(&self.proc, &maps, !layout_carried, false, &mut shm_data)?
        } else {
            Vec::new()
        };
        self.fail_at(FailPoint::AfterCopy)?;
        self.prev_maps = maps;
        // The pre-copied pages join the checkpoint (their bytes are moved over after the
        // resume, in `finish`); should it not be delivered, they are carried as written pages.
        if let Some(pre) = &self.pre {
            j.pages
                .extend(pre.pages.iter().map(|&(a, _)| (a, a + PAGE)));
        }
        let pre = self.pre.take().map(|p| (pre_copied, p));
        self.last_dirty = written_all.len() as u64;
        // The count after everything this pause did to the process (injected calls included):
        // the next pause carries the layout if it has not moved by then.
        self.layout_seen = self
            .cache
            .calls
            .as_ref()
            .map(|c| c.count(crate::syscount::LAYOUT));
        self.prev_cow = cow_list;
        Ok(Captured {
            meta,
            tcp_reset: 0,
            tcp_read: 0,
            exe: Some(exe),
            shm: (shm, shm_data),
            write_faults: self.tracker.write_faults(),
            runs,
            data,
            files,
            fresh,
            cow,
            pre,
            precopy_rewritten: rewritten,
            full,
            dirty: written_all.len() as u64,
            fresh_pages: nfresh,
            hot: hot_now,
            scan,
            copy,
            parts,
        })
    }

    // full_twin_consistency: why the incrementals after a full checkpoint taken in the middle
    // of a stream (at N, in the same pause as incremental N) apply to it as well as to the
    // chain, with no twin of their own.
    //
    // A receiver decodes a page against what it holds for that page (zeros if nothing), and
    // the sender encodes against its twin, so what matters is: after `finish` for N, every
    // twin equals what both the chain's image at N and the full N hold for that page.
    // - A twin is the last contents sent for its page. A page written after that send was
    //   reported by a later scan and sent again (the twin updated); so for each twin, the page
    //   was not written since, and its live contents at N are the twin. This holds for pages
    //   sent this very pause (copied in it), pre-copied ones (not written between the pre-copy
    //   and the pause, or the scan would have reported them and they would be copied in it),
    //   hot pages (sent every epoch they are written; left writable, every epoch), and pages
    //   sent as `Same` (equal to their twin already).
    // - The full N copies the live contents at N, in the same pause, after the tracker's
    //   commit (as the incremental's pages): for a page with a twin, the twin. All-zero
    //   anonymous pages are left out of the full, and a receiver reads a missing page as zeros,
    //   which a zero twin matches.
    // - The chain's image at N equals the live process at N (what the incremental tests check).
    // - Twins that would not match are dropped: of memory replaced or unmapped (fresh ranges,
    //   gaps), and of private file mapping pages outside the copied-on-write list, which hold
    //   no contents of their own in the full (a receiver reads them as the file, not as what
    //   the chain may hold); such pages get no twin when sent either (`twin_kept`). An evicted
    //   twin is simply absent: the page is encoded without one (`Compressed`/`Raw`).
    // - Pages a failed pause took (the carry) are sent again, not left to a stale twin.
    // The test `full_checkpoint_mid_stream_*` checks it: both images byte-identical to each
    // other and to the live process after the later incrementals.

    /// After the pause: identify files, encode pages against twins, build checkpoint `epoch`
    /// (and the full one of the same state, if taken).
    ///
    /// Everything that can fail comes first, before any state of the loop changes: a failure
    /// leaves the twins as the receivers' images are, and the caller carries the pages.
    pub(super) fn finish(
        &mut self,
        c: TreeCaptured,
        epoch: u64,
        interval: Duration,
        quiesce: Duration,
        pause: Duration,
        ended_by: EndedBy,
    ) -> Result<EpochOutput> {
        let te = Instant::now();
        let TreeCaptured {
            mut main,
            mut members,
            groups,
            ids,
        } = c;
        self.identify(&mut main)?;
        for (m, c) in self.members.iter_mut().zip(&mut members) {
            match (c, &mut m.fresh) {
                (Some(c), _) => m.lp.identify(c)?,
                (None, Some(f)) => f.identify(&m.lp.proc)?,
                (None, None) => {}
            }
        }
        // A tree: the descriptions its processes share move into the main image (before the
        // encoding, whose carrying compares each process's descriptors with the last ones).
        if !self.members.is_empty() {
            let hosts: Vec<Pid> = std::iter::once(self.proc.pid)
                .chain(self.members.iter().map(|m| m.lp.proc.pid))
                .collect();
            let mut refs: Vec<&mut ProcessImage> = Vec::with_capacity(members.len());
            for (m, c) in self.members.iter_mut().zip(&mut members) {
                match (c, &mut m.fresh) {
                    (Some(c), _) => refs.push(&mut c.meta),
                    (None, Some(f)) => refs.push(&mut f.image),
                    (None, None) => {
                        return Err(CaptureError::Unsupported(format!(
                            "internal: process {} was neither captured nor fresh",
                            m.pid
                        ))
                        .into());
                    }
                }
            }
            // Connections of descriptors that became shared descriptions are not carried:
            // counted with the main process's as reset.
            main.tcp_reset += crate::tree::share(&mut main.meta, &mut refs, &hosts, groups)?;
        }
        // Nothing fails from here on.
        let mut out = self.encode(main, te, epoch, interval, quiesce, pause, ended_by);
        out.stats.answers = self.answers.take();
        out.incremental.image.zombies = self.zombies.clone();
        if let Some(f) = &mut out.full {
            f.image.zombies = self.zombies.clone();
        }
        if let Some((pgid, sid)) = self.root_ids.take() {
            for img in std::iter::once(&mut out.incremental.image)
                .chain(out.full.as_mut().map(|f| &mut f.image))
            {
                (img.pgid, img.sid) = (pgid, sid);
            }
        }
        if members.is_empty() {
            return Ok(out);
        }
        if let (Some(f), Some(&(pgid, sid))) = (&mut out.full, ids.first()) {
            (f.image.pgid, f.image.sid) = (pgid, sid);
        }
        for (i, (m, c)) in self.members.iter_mut().zip(members).enumerate() {
            let o = match (c, m.fresh.take()) {
                (Some(c), _) => {
                    m.lp.encode(c, te, epoch, interval, quiesce, pause, ended_by)
                }
                (None, Some(f)) => m.lp.fresh_output(f, epoch, out.full.is_some()),
                (None, None) => continue, // refused above
            };
            out.stats.add_member(&o.stats);
            let add = |ck: &mut Checkpoint, mut member: Checkpoint| {
                if let Some(&(pgid, sid)) = ids.get(i + 1) {
                    (member.image.pgid, member.image.sid) = (pgid, sid);
                }
                ck.image.tree.push(Member {
                    ppid: m.ppid,
                    data_off: ck.data.len() as u64,
                    data_len: member.data.len() as u64,
                    image: member.image,
                });
                ck.data.extend_from_slice(&member.data);
            };
            if let (Some(f), Some(mf)) = (&mut out.full, o.full) {
                add(f, mf);
            }
            add(&mut out.incremental, o.incremental);
        }
        out.stats.encode_us = te.elapsed().as_micros() as u64;
        Ok(out)
    }

    /// The part of `finish` that can fail, for one process: files identified (and the codecs
    /// made). It changes no state of the loop but caches.
    pub(super) fn identify(&mut self, c: &mut Captured) -> Result<()> {
        self.fail_at(FailPoint::AfterResume)?;
        let files = std::mem::take(&mut c.files);
        let mut refs = Vec::with_capacity(files.len());
        for f in files {
            let key = (f.path.clone(), f.inode);
            let r = match self.file_refs.get(&key) {
                Some(r) => r.clone(),
                None => {
                    let r = f.identify(&self.proc)?;
                    self.file_refs.insert(key, r.clone());
                    r
                }
            };
            refs.push(r);
        }
        c.meta.files = refs;
        if let Some(exe) = c.exe.take() {
            c.meta.exe = exe.identify(&self.proc)?;
        }
        let workers = self.cfg.encode_workers.max(1);
        while self.codecs.len() < workers {
            self.codecs
                .push(PageCodec::new().map_err(|e| CaptureError::Unsupported(e.to_string()))?);
        }
        Ok(())
    }
}

/// A full checkpoint's part of a pause: its pages and the private directories' whole tree.
pub(super) struct FullCapture {
    pub(super) runs: Vec<PageRun>,
    pub(super) data: Vec<u8>,
    pub(super) tree: FileChanges,
    pub(super) shm: Vec<ShmObject>,
    pub(super) took: Duration,
}

impl Captured {
    /// Takes what the pause read of the process's connections.
    pub(super) fn set_tcp(&mut self, t: crate::tcp::Captured) {
        self.meta.tcp = t.conns;
        self.tcp_reset = t.reset;
        self.tcp_read = t.read;
    }
}

/// What a pause captured of every process of a tree (of the single process: `members`,
/// `groups` and `ids` empty).
pub(super) struct TreeCaptured {
    pub(super) main: Captured,
    /// In the order of [`EpochLoop::members`]; `None` for a fresh one (its whole image is
    /// [`TreeMember::fresh`]).
    pub(super) members: Vec<Option<Captured>>,
    /// The open file descriptions several processes hold (`crate::tree::find_shared`).
    pub(super) groups: Vec<crate::tree::FileGroup>,
    /// With a full checkpoint: every process's group and session, the main one's first.
    pub(super) ids: Vec<(i32, i32)>,
}

pub(super) struct Captured {
    pub(super) meta: ProcessImage,
    /// Connected sockets a restore of this checkpoint resets (see [`crate::tcp::Captured`]).
    pub(super) tcp_reset: u64,
    /// Connections read whole (the others had not moved).
    pub(super) tcp_read: u64,
    /// Identified (and taken) by `identify`.
    pub(super) exe: Option<capture::PendingFile>,
    /// The shared memory objects with the pages that changed, and those pages' bytes.
    pub(super) shm: (Vec<ShmObject>, Vec<u8>),
    pub(super) full: Option<FullCapture>,
    pub(super) write_faults: Option<u64>,
    /// Pre-copied pages to add (address, offset in the pre-copy's bytes), and the pre-copy.
    pub(super) pre: Option<(Vec<(u64, usize)>, Precopy)>,
    /// `EpochStats::precopy_rewritten`.
    pub(super) precopy_rewritten: u64,
    pub(super) cow: Vec<(u64, u64)>,
    pub(super) runs: Vec<PageRun>,
    pub(super) data: Vec<u8>,
    pub(super) files: Vec<capture::PendingFile>,
    pub(super) fresh: Vec<(u64, u64)>,
    pub(super) dirty: u64,
    pub(super) fresh_pages: u64,
    pub(super) hot: u64,
    pub(super) scan: Duration,
    pub(super) copy: Duration,
    pub(super) parts: Parts,
}

/// Where a pause's time went besides quiesce, scan and copy (see [`EpochStats::layout_us`]).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Parts {
    pub(super) layout: Duration,
    pub(super) meta: capture::MetaTimes,
    pub(super) walk: Duration,
    pub(super) take: Duration,
    pub(super) precheck: Duration,
    pub(super) hot: Duration,
    pub(super) cow: Duration,
    pub(super) exe: Duration,
    pub(super) commit: Duration,
    pub(super) hook: Duration,
    /// Reading the connections (see [`crate::tcp`]).
    pub(super) tcp: Duration,
    /// The divergence check's reading (see [`crate::scrub`]).
    pub(super) scrub: Duration,
    pub(super) resume: Duration,
    pub(super) layout_carried: bool,
}
