//! After the resume: the epoch's pages encoded against their twins (on the encode workers,
//! yielding to the service on its budget), the checkpoint's metadata completed.

#[allow(unused_imports)]
use super::*;

impl EpochLoop {
    /// The rest of `finish` for one process (nothing fails): encode its pages against the
    /// twins, build its checkpoint `epoch` (and the full one of the same state, if taken).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn encode(
        &mut self,
        c: Captured,
        te: Instant,
        epoch: u64,
        interval: Duration,
        quiesce: Duration,
        pause: Duration,
        ended_by: EndedBy,
    ) -> EpochOutput {
        let Captured {
            mut meta,
            shm,
            full,
            write_faults,
            pre,
            precopy_rewritten,
            cow,
            runs,
            data,
            fresh,
            dirty,
            fresh_pages,
            hot,
            scan,
            copy,
            parts: pp,
            tcp_reset,
            tcp_read,
            ..
        } = c;
        // Nothing fails from here on.

        // The full checkpoint: this pause's metadata with all its memory and the whole tree.
        let full_took = full.as_ref().map(|f| f.took);
        let full = full.map(|f| {
            let mut image = meta.clone();
            image.runs = f.runs;
            image.private_files = f.tree;
            image.shm = f.shm;
            let mut data = f.data;
            capture::drop_zero_pages(&mut image, &mut data);
            Checkpoint::full(epoch, image, data)
        });
        // The pre-copied pages are encoded from the pre-copy's buffer where they are (moving
        // them next to the pause's pages cost a pass over memory as long as the encoding).
        let precopy_ran = pre.is_some();
        let (mut precopy_pages, mut precopy_time) = (0, Duration::ZERO);
        let (mut pre_list, mut pre_data) = (Vec::new(), Vec::new());
        if let Some((pages, pre)) = pre {
            precopy_pages = pre.pages.iter().filter(|p| p.1.is_some()).count() as u64;
            precopy_time = pre.took;
            (pre_list, pre_data) = (pages, pre.data);
        }
        // Twins of memory that is gone or replaced are void on the receiver too.
        for &(s, e) in &fresh {
            self.twins.remove_range(s, e);
        }
        // The receiver drops pages of private file mappings outside the copied-on-write list:
        // drop their twins too, or a later delta would be against contents it no longer has.
        // Nor do such pages get a twin below when sent (one zapped after the pre-copy, or
        // carried, reads as the file): a full checkpoint does not hold them.
        let mut no_twin: Vec<(u64, u64)> = Vec::new();
        for v in meta
            .vmas
            .iter()
            .filter(|v| matches!(v.backing, Backing::File { .. }) && !v.shared)
        {
            no_twin.extend(subtract_any(&[(v.start, v.end)], &cow));
        }
        no_twin.sort_unstable();
        let twin_kept = |a: u64| {
            let i = no_twin.partition_point(|r| r.1 <= a);
            no_twin.get(i).is_none_or(|r| a < r.0)
        };
        // The same for memory unmapped since. Only what became void since the last checkpoint
        // is cleared: void memory gets no twin, so what was void then holds none now (clearing
        // it all every epoch cost a walk over every twin per gap between mappings).
        let mut live: Vec<(u64, u64)> = meta.vmas.iter().map(|v| (v.start, v.end)).collect();
        live.sort_unstable();
        let mut void = gaps(&live);
        void.extend_from_slice(&no_twin);
        let void = merge(void);
        for (s, e) in subtract_any(&void, &self.void) {
            self.twins.remove_range(s, e);
        }
        self.void = void;
        let mut st = EpochStats {
            epoch,
            ..Default::default()
        };
        // Encode against the twins (read-only meanwhile), on `encode_workers` threads, each with
        // its own codec contexts; then stitch the parts and update the twins in order.
        let (d, pd) = (&data, &pre_data);
        let list: Vec<(u64, &[u8])> = runs
            .iter()
            .flat_map(|r| {
                (0..r.len / PAGE).map(move |p| {
                    let o = (r.data_off + p * PAGE) as usize;
                    (r.addr + p * PAGE, &d[o..o + PAGE as usize])
                })
            })
            .chain(
                pre_list
                    .iter()
                    .map(|&(a, o)| (a, &pd[o..o + PAGE as usize])),
            )
            .collect();
        // (The codecs for every worker were made above.)
        let workers = self.cfg.encode_workers.clamp(1, list.len().max(1));
        let kind = self.cfg.codec;
        let chunk = list.len().div_ceil(workers).max(1);
        let watch = Watch::current();
        let parts: Vec<Encoded> = if workers == 1 {
            // One encoder: a page that had a twin gets its new one right after its encoding,
            // while both are still in cache (a separate pass afterwards read them from memory
            // again: `checkpointer/examples/encode_twins.rs`).
            let twins = TwinUse::Update {
                twins: &mut self.twins,
                epoch,
                keep: &twin_kept,
            };
            vec![encode_part(&mut self.codecs[0], kind, twins, &list, watch)]
        } else {
            let twins = &self.twins;
            std::thread::scope(|sc| {
                let handles: Vec<_> = self
                    .codecs
                    .iter_mut()
                    .zip(list.chunks(chunk))
                    .map(|(codec, part)| {
                        sc.spawn(move || {
                            encode_part(codec, kind, TwinUse::Read(twins), part, watch)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("encoder thread panicked"))
                    .collect()
            })
        };
        let mut out = Vec::with_capacity(parts.iter().map(|p| p.0.len()).sum());
        let mut pages = Vec::with_capacity(list.len());
        let mut next = list.iter();
        for (bytes, encs) in parts {
            let base = out.len() as u64;
            out.extend_from_slice(&bytes);
            for (addr, enc, off, updated) in encs {
                let &(_, page) = next.next().expect("one encoding per page");
                match enc {
                    PageEncoding::Zero => st.zero_pages += 1,
                    PageEncoding::Same => {
                        st.same_pages += 1;
                        if self.hot.binary_search(&addr).is_ok() {
                            self.cool.insert(addr);
                        }
                    }
                    PageEncoding::Raw => st.raw_pages += 1,
                    PageEncoding::Delta { .. } => st.delta_pages += 1,
                    PageEncoding::Compressed { .. } => st.compressed_pages += 1,
                }
                if !updated && enc != PageEncoding::Same && twin_kept(addr) {
                    self.twins.put(addr, epoch, page);
                }
                pages.push(EncodedPage {
                    addr,
                    enc,
                    data_off: base + off,
                });
            }
        }
        drop(list);
        self.buf = data;
        self.prebuf = pre_data;
        let base = self.base;
        self.base = epoch;
        meta.base_epoch = Some(base);
        meta.reset = fresh;
        meta.cow = cow;
        meta.pages = pages;
        st.interval_us = interval.as_micros() as u64;
        st.resumed_at = Some(self.last_resume);
        st.pause_us = pause.as_micros() as u64;
        st.quiesce_us = quiesce.as_micros() as u64;
        st.scan_us = scan.as_micros() as u64;
        st.copy_us = copy.as_micros() as u64;
        let us = |d: Duration| d.as_micros() as u64;
        st.layout_us = us(pp.layout);
        st.meta_checks_us = us(pp.meta.checks);
        st.meta_threads_us = us(pp.meta.threads);
        st.meta_process_us = us(pp.meta.process);
        st.meta_fds_us = us(pp.meta.fds);
        st.fds_reused = pp.meta.fds_reused;
        st.meta_pending_us = us(pp.meta.pending);
        st.walk_us = us(pp.walk);
        st.resume_us = us(pp.resume);
        st.take_us = us(pp.take);
        st.precheck_us = us(pp.precheck);
        st.hot_us = us(pp.hot);
        st.cow_us = us(pp.cow);
        st.exe_us = us(pp.exe);
        st.commit_us = us(pp.commit);
        st.hook_us = us(pp.hook);
        st.tcp_us = us(pp.tcp);
        st.tcp_conns = meta.tcp.len() as u64;
        st.tcp_reset = tcp_reset;
        st.tcp_read = tcp_read;
        st.scrub_us = us(pp.scrub);
        st.layout_carried = pp.layout_carried;
        st.layout_missed = self.layout_missed;
        st.dirty_pages = dirty;
        st.fresh_pages = fresh_pages;
        st.hot_pages = hot;
        st.raw_bytes = (dirty + fresh_pages) * PAGE;
        st.encoded_bytes = out.len() as u64;
        st.twin_bytes = self.twins.bytes() as u64;
        st.capped = ended_by == EndedBy::Cap;
        st.ended_by = ended_by;
        if let (Some(took), Some(f)) = (full_took, &full) {
            st.full_copy_us = took.as_micros() as u64;
            st.full_bytes = f.data.len() as u64;
        }
        st.precopy_pages = precopy_pages;
        st.write_faults = write_faults;
        st.precopy_us = precopy_time.as_micros() as u64;
        st.precopy_ran = precopy_ran;
        st.precopy_rewritten = precopy_rewritten;
        st.processes = 1;
        // The shared memory objects' pages, raw, after the encoded ones.
        let (mut objects, shm_data) = shm;
        for r in objects.iter_mut().flat_map(|o| o.runs.iter_mut()) {
            r.data_off += out.len() as u64;
        }
        out.extend_from_slice(&shm_data);
        st.raw_bytes += shm_data.len() as u64;
        st.encoded_bytes += shm_data.len() as u64;
        meta.shm = objects;
        // The divergence check's digests, of the complete metadata (before anything is left
        // out) and the pages read in the pause.
        let scrub = self
            .scrub_pages
            .take()
            .map(|pages| tardi_image::scrub::Scrub::new(&meta, pages));
        st.scrub_pages = scrub.as_ref().map_or(0, |s| s.pages.len() as u64);
        // Last: nothing fails from here on, so this checkpoint is produced and the next one
        // applies on top of it.
        self.meta_carry.leave_out(&mut meta);
        meta.scrub = scrub;
        st.encode_us = te.elapsed().as_micros() as u64;
        let ck = Checkpoint {
            epoch,
            kind: Kind::Incremental { base },
            image: meta,
            data: out,
        };
        EpochOutput {
            incremental: ck,
            full,
            stats: st,
        }
    }

    /// The output of a process captured whole in this pause (a fresh member): its image whole
    /// in the incremental checkpoint (no base epoch: `store::Image::apply` takes it as it is)
    /// and in the full one, if one is taken. The next checkpoint applies on top of it.
    pub(super) fn fresh_output(&mut self, f: FreshImage, epoch: u64, full: bool) -> EpochOutput {
        let FreshImage {
            mut image, data, ..
        } = f;
        image.base_epoch = None;
        self.meta_carry = tardi_image::store::MetaCarry::after(&image);
        self.base = epoch;
        let bytes = data.len() as u64;
        let stats = EpochStats {
            epoch,
            processes: 1,
            whole_processes: 1,
            raw_bytes: bytes,
            encoded_bytes: bytes,
            fresh_pages: bytes / PAGE,
            ..Default::default()
        };
        let ck = Checkpoint::full(epoch, image, data);
        EpochOutput {
            full: full.then(|| ck.clone()),
            incremental: ck,
            stats,
        }
    }
}

/// One worker's output: its bytes, and per page its address, encoding, offset in those bytes
/// and whether its twin was already updated.
pub(super) type Encoded = (Vec<u8>, Vec<(u64, PageEncoding, u64, bool)>);

/// How [`encode_part`] uses the twins.
pub(super) enum TwinUse<'a> {
    /// Reads them only (one of several encoders; the updates are applied afterwards, in
    /// order).
    Read(&'a TwinStore),
    /// Also updates them, the one encoder: a page encoded against a twin, not `Same` and kept
    /// (`keep`), replaces its twin at once, in place, while both are still in cache (a pass
    /// afterwards read them from memory again). A page without a twin gets one later, in list
    /// order, as with several encoders: inserting one may evict another that a later page of
    /// the list is encoded against. The addresses of the list must be distinct (a twin updated
    /// early would otherwise be the base of a later page).
    Update {
        twins: &'a mut TwinStore,
        epoch: u64,
        keep: &'a dyn Fn(u64) -> bool,
    },
}

/// Encodes the pages `part` ((address, contents)) against their twins; `watch` raises the
/// thread once its budget is spent (see `crate::budget`). Per page: its address, encoding,
/// offset in the bytes and whether its twin was updated (only with [`TwinUse::Update`]).
pub(super) fn encode_part(
    codec: &mut PageCodec,
    kind: Codec,
    mut twins: TwinUse,
    part: &[(u64, &[u8])],
    mut watch: Watch,
) -> Encoded {
    debug_assert!(
        matches!(twins, TwinUse::Read(_)) || {
            let mut a: Vec<u64> = part.iter().map(|p| p.0).collect();
            a.sort_unstable();
            a.windows(2).all(|w| w[0] != w[1])
        },
        "a page listed twice in one checkpoint"
    );
    let mut out = Vec::with_capacity(part.len() * 64);
    let mut encs = Vec::with_capacity(part.len());
    for (i, &(addr, page)) in part.iter().enumerate() {
        if i % 64 == 0 {
            watch.check();
        }
        let at = out.len() as u64;
        let store: &TwinStore = match &twins {
            TwinUse::Read(t) => t,
            TwinUse::Update { twins, .. } => twins,
        };
        let twin = store.get(addr);
        let had = twin.is_some();
        let enc = codec.encode_page(kind, twin, page, &mut out);
        let updated = match &mut twins {
            TwinUse::Update { twins, epoch, keep }
                if had && enc != PageEncoding::Same && keep(addr) =>
            {
                twins.put(addr, *epoch, page);
                true
            }
            _ => false,
        };
        encs.push((addr, enc, at, updated));
    }
    (out, encs)
}
