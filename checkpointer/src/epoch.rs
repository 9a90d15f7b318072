//! The epoch loop: a full checkpoint, then one incremental checkpoint per epoch.
//!
//! Each epoch: wait (interval, or less once the dirty pages reach the cap) → stop every thread →
//! read the layout and thread/handle state → take the pages written since the last epoch from
//! the tracker (protecting them again in the same scan) and capture mappings that are new or
//! replaced whole → leave hot pages unprotected → copy the pages → resume. Encoding against the
//! twins happens after the resume, while the service runs.
//!
//! The loop runs on its own thread, chroot'ed into the process's root (see
//! [`crate::procfs::in_view`]); [`Epochs`] talks to it over channels, so the hand-offs are
//! outside the pause.

use crate::capture::{
    self, CaptureError, MetaCache, copy_ranges, describe_vmas, proc_err, trackable,
};
use crate::delta::{Codec, PageCodec, PageEncoding, TwinStore};
use crate::files::DirTracker;
use crate::image::*;
use crate::procfs::{MapEntry, Proc, in_view};
use crate::ptrace::Stopped;
use crate::sys::Pid;
use crate::track::mprotect::MprotectTracker;
use crate::track::{
    PAGE_IS_FILE, PAGE_IS_PFNZERO, PAGE_IS_PRESENT, Query, TrackError, Tracker, TrackerKind,
    UffdTracker,
};
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;

/// How epochs are scheduled and encoded.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EpochConfig {
    /// Target length of an epoch, from one resume to the next stop.
    pub interval: Duration,
    /// No epoch ends earlier than this, even when capped.
    pub min_interval: Duration,
    /// End the epoch early once this many pages are dirty (0: never).
    pub cap_pages: u64,
    /// A page written in this many consecutive epochs becomes hot (0: no hot pages).
    pub hot_epochs: u32,
    /// A hot page turns cold with probability 1/`cold_one_in` each epoch (Tardigrade: 16).
    pub cold_one_in: u32,
    pub codec: Codec,
    /// Memory for twins (last sent contents of recently written pages), bytes.
    pub twin_budget: usize,
    /// Re-read every value cached between epochs (signal actions, sigaltstacks, ...) every
    /// this many epochs (0: only at the start).
    pub refresh_every: u64,
    /// Threads that encode an epoch's pages (after the resume). On this project's 2-core
    /// machines one is the default: see docs/BENCHMARKS.md ("Parallel encode").
    pub encode_workers: usize,
    /// The service's private writable directories (sandbox paths), walked in every pause: see
    /// [`crate::files`].
    pub private_dirs: Vec<String>,
    /// How written pages are found (see [`crate::track`]).
    pub tracker: TrackerKind,
    /// Dirty-page pre-copy: just before each pause, take the written pages (protecting them
    /// again) and copy them while the service still runs; the pause then copies only what was
    /// written since. Needs a tracker that can scan without stopping (userfaultfd).
    pub precopy: bool,
}

impl Default for EpochConfig {
    fn default() -> Self {
        EpochConfig {
            interval: Duration::from_millis(10),
            min_interval: Duration::from_millis(1),
            cap_pages: 1000,
            hot_epochs: 3,
            cold_one_in: 16,
            codec: Codec::XorZstd,
            twin_budget: 64 << 20,
            refresh_every: 100,
            encode_workers: 1,
            private_dirs: Vec::new(),
            tracker: TrackerKind::Uffd,
            precopy: true,
        }
    }
}

/// What one epoch cost and produced.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EpochStats {
    pub epoch: u64,
    /// From the previous resume to this stop.
    pub interval_us: u64,
    /// From the stop request to the resume.
    pub pause_us: u64,
    pub quiesce_us: u64,
    /// Tracker scans and capture of new mappings' page lists (inside the pause).
    pub scan_us: u64,
    /// Copying pages (inside the pause).
    pub copy_us: u64,
    /// Twin-diff and codec (after the resume).
    pub encode_us: u64,
    /// Pages written during the epoch (hot pages included).
    pub dirty_pages: u64,
    pub hot_pages: u64,
    /// Pages of mappings created or replaced during the epoch.
    pub fresh_pages: u64,
    /// (dirty + fresh) × 4 KiB.
    pub raw_bytes: u64,
    /// Page bytes after twin-diff and codec.
    pub encoded_bytes: u64,
    pub zero_pages: u64,
    pub same_pages: u64,
    pub delta_pages: u64,
    pub compressed_pages: u64,
    pub raw_pages: u64,
    pub twin_bytes: u64,
    /// The epoch ended early at the dirty-page cap.
    pub capped: bool,
    /// Pages copied by the pre-copy before the pause (counted in `dirty_pages` unless written
    /// again before the pause), and how long that took (not part of the pause).
    pub precopy_pages: u64,
    pub precopy_us: u64,
    /// Write faults the tracker counted itself this epoch: for the mprotect tracker, the pages
    /// its agent made writable (system-call buffers included). `None` for userfaultfd, whose
    /// faults the kernel resolves alone (they show in the process's minor-fault count).
    pub write_faults: Option<u64>,
}

/// Why the loop failed.
#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error(transparent)]
    Track(#[from] TrackError),
    #[error("walking the private directories: {0}")]
    Files(#[source] std::io::Error),
    #[error("the epoch thread is gone: {0}")]
    Gone(String),
}

type Result<T> = std::result::Result<T, EpochError>;

enum Cmd {
    Next { hold: bool },
    Release,
    Stop,
}

type Reply = Result<(Checkpoint, EpochStats)>;

/// A running epoch loop on one process (host PID). Drop or [`Epochs::stop`] ends it and removes
/// write tracking from the process.
pub struct Epochs {
    tx: mpsc::Sender<Cmd>,
    rx: mpsc::Receiver<Reply>,
    thread: Option<std::thread::JoinHandle<()>>,
    held: bool,
}

impl Epochs {
    /// Arms tracking and takes the full checkpoint (epoch 0) in one pause.
    pub fn start(pid: Pid, cfg: EpochConfig) -> Result<(Epochs, Checkpoint, EpochStats)> {
        let (tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (reply_tx, rx) = mpsc::channel::<Reply>();
        let thread = std::thread::Builder::new()
            .name("tardi-epochs".into())
            .spawn(move || {
                let err_tx = reply_tx.clone();
                let r = in_view(pid, move |proc| {
                    let (mut lp, first) = match EpochLoop::start(proc, cfg) {
                        Ok(v) => v,
                        Err(e) => {
                            let _ = reply_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = reply_tx.send(Ok(first));
                    while let Ok(cmd) = cmd_rx.recv() {
                        match cmd {
                            Cmd::Next { hold } => {
                                let r = lp.next(hold, &reply_tx, &cmd_rx);
                                if let Some(r) = r {
                                    let _ = reply_tx.send(r);
                                }
                            }
                            Cmd::Release => {}
                            Cmd::Stop => break,
                        }
                    }
                    lp.disarm();
                });
                if let Err(e) = r {
                    let _ = err_tx.send(Err(EpochError::Gone(e.to_string())));
                }
            })
            .map_err(|e| EpochError::Gone(e.to_string()))?;
        let first = rx.recv().map_err(|e| EpochError::Gone(e.to_string()))??;
        Ok((
            Epochs {
                tx,
                rx,
                thread: Some(thread),
                held: false,
            },
            first.0,
            first.1,
        ))
    }

    /// Waits for the epoch to end and returns its incremental checkpoint.
    // Not an Iterator: each call blocks for an epoch and can fail; `next` reads best here.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<(Checkpoint, EpochStats)> {
        self.release();
        self.tx
            .send(Cmd::Next { hold: false })
            .map_err(|e| EpochError::Gone(e.to_string()))?;
        self.rx
            .recv()
            .map_err(|e| EpochError::Gone(e.to_string()))?
    }

    /// Like [`Epochs::next`], but the process stays stopped, in exactly the state the returned
    /// checkpoint describes, until [`Epochs::release`] (or the next call).
    pub fn next_held(&mut self) -> Result<(Checkpoint, EpochStats)> {
        self.release();
        self.tx
            .send(Cmd::Next { hold: true })
            .map_err(|e| EpochError::Gone(e.to_string()))?;
        let r = self
            .rx
            .recv()
            .map_err(|e| EpochError::Gone(e.to_string()))?;
        self.held = r.is_ok();
        r
    }

    /// Resumes a process held by [`Epochs::next_held`].
    pub fn release(&mut self) {
        if self.held {
            let _ = self.tx.send(Cmd::Release);
            let _ = self.rx.recv();
            self.held = false;
        }
    }

    /// Ends the loop and removes write tracking from the process.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.release();
        let _ = self.tx.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Epochs {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The loop's state, owned by the epoch thread.
struct EpochLoop<'p> {
    proc: &'p Proc,
    cfg: EpochConfig,
    tracker: Box<dyn Tracker>,
    /// Mappings armed for tracking, as (start, end).
    armed: Vec<(u64, u64)>,
    prev_maps: Vec<MapEntry>,
    cache: MetaCache,
    /// One set of codec contexts per encode worker.
    codecs: Vec<PageCodec>,
    twins: TwinStore,
    streak: HashMap<u64, u32>,
    hot: HashSet<u64>,
    /// What "has contents of its own" means here (see [`crate::track::has_contents`]).
    contents: u64,
    /// Identified mapped files by (path, inode).
    file_refs: HashMap<(String, u64), FileRef>,
    /// Hot pages found identical to their twin: cold from the next pause on.
    cool: HashSet<u64>,
    epoch: u64,
    last_resume: Instant,
    rng: u64,
    buf: Vec<u8>,
    dirs: DirTracker,
    /// Pages taken (and protected again) by the pre-copy and not yet part of a checkpoint.
    pre: Option<Precopy>,
    prebuf: Vec<u8>,
}

/// What a pre-copy took: written pages with the offset of their contents in `data` (`None`:
/// the copy failed, the pause must copy the page).
#[derive(Default)]
struct Precopy {
    pages: Vec<(u64, Option<usize>)>,
    data: Vec<u8>,
    /// Armed ranges whose scan failed part-way (see `capture`).
    stale: Vec<(u64, u64)>,
    took: Duration,
}

impl<'p> EpochLoop<'p> {
    fn start(
        proc: &'p Proc,
        cfg: EpochConfig,
    ) -> Result<(EpochLoop<'p>, (Checkpoint, EpochStats))> {
        let pid = proc.pid;
        let codec = PageCodec::new().map_err(|e| CaptureError::Unsupported(e.to_string()))?;
        let pagemap = proc
            .open_file("pagemap", libc::O_RDONLY)
            .map_err(proc_err(pid, "pagemap"))?;
        // As for a one-shot full checkpoint: fault the copy buffer in before the pause.
        let buf = capture::prefaulted_buffer(capture::estimate_private_bytes(proc));
        let t0 = Instant::now();
        let mut st = Stopped::stop(proc).map_err(CaptureError::from)?;
        let quiesce = t0.elapsed();
        let r = (|| -> Result<_> {
            let maps = proc.smaps().map_err(proc_err(pid, "smaps"))?;
            let mut cache = MetaCache::default();
            let (mut tracker, maps): (Box<dyn Tracker>, _) = match cfg.tracker {
                TrackerKind::Uffd => (Box::new(UffdTracker::new(&mut st, &maps, pagemap)?), maps),
                TrackerKind::Mprotect => {
                    let mut t = MprotectTracker::new(&mut st, proc, &maps, pagemap)?;
                    cache.own_filter = true;
                    t.begin(&mut st)?;
                    // The agent's own mappings are new.
                    let maps = t.layout(proc.smaps().map_err(proc_err(pid, "smaps"))?);
                    (Box::new(t), maps)
                }
            };
            let mut meta = capture::capture_meta(proc, &mut st, &maps, &mut cache, true)?;
            tracker.threads(&meta.threads, &maps);
            tracker.patch_image(&mut meta);
            // The memory first: arming may split the kernel's mappings the capture names files
            // by. (The agent pages the commit writes are in the first incremental checkpoint.)
            let (mut ck, files) = capture::full_memory(proc, &maps, meta, buf)?;
            let mut dirs = DirTracker::new(cfg.private_dirs.clone());
            ck.0.private_files = dirs.changes().map_err(EpochError::Files)?;
            let mut armed = Vec::new();
            for m in maps.iter().filter(|m| trackable(m)) {
                tracker.arm(m.start, m.end)?;
                armed.push((m.start, m.end));
            }
            tracker.commit(&mut st, &armed, &maps)?;
            Ok((tracker, cache, maps, armed, ck, files, dirs))
        })();
        let resumed = st.resume();
        let pause = t0.elapsed();
        let (tracker, cache, maps, armed, (mut image, data), files, dirs) = r?;
        resumed.map_err(CaptureError::from)?;
        let mut data = data;
        capture::finish_full(proc, &mut image, &mut data, files)?;

        let stats = EpochStats {
            epoch: 0,
            pause_us: pause.as_micros() as u64,
            quiesce_us: quiesce.as_micros() as u64,
            raw_bytes: data.len() as u64,
            encoded_bytes: data.len() as u64,
            ..Default::default()
        };
        let ck = Checkpoint {
            epoch: 0,
            kind: Kind::Full,
            image,
            data,
        };
        let lp = EpochLoop {
            proc,
            twins: TwinStore::new(cfg.twin_budget),
            cfg,
            tracker,
            armed,
            prev_maps: maps,
            cache,
            codecs: vec![codec],
            streak: HashMap::new(),
            hot: HashSet::new(),
            file_refs: HashMap::new(),
            contents: crate::track::has_contents(),
            cool: HashSet::new(),
            epoch: 0,
            last_resume: Instant::now(),
            rng: 0x9E37_79B9_7F4A_7C15 ^ pid as u64,
            buf: Vec::new(),
            dirs,
            pre: None,
            prebuf: Vec::new(),
        };
        Ok((lp, (ck, stats)))
    }

    fn random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Sleeps until the epoch should end. Returns whether the cap ended it.
    fn wait(&mut self) -> bool {
        let cap = self.cfg.cap_pages;
        loop {
            let elapsed = self.last_resume.elapsed();
            if elapsed >= self.cfg.interval {
                return false;
            }
            if cap > 0
                && elapsed >= self.cfg.min_interval
                && self.tracker.count_written(&self.armed, cap) >= cap
            {
                return true;
            }
            let left = self.cfg.interval - elapsed;
            // Each cap check scans every armed range: poll a few times per epoch, not more
            // (every 0.5 ms cost more than half of a busy service's system calls per epoch).
            let poll = (self.cfg.interval / 5).max(Duration::from_millis(1));
            let step = if cap > 0 {
                left.min(poll)
                    .max(self.cfg.min_interval.saturating_sub(elapsed))
            } else {
                left
            };
            std::thread::sleep(step.min(left));
        }
    }

    /// Dirty-page pre-copy (see [`EpochConfig::precopy`]): takes the written pages of every
    /// armed range, which protects them again, and copies them while the service runs. A page
    /// written after that is reported again by the pause's scan and copied there; the others
    /// still hold what was copied here. Nothing taken here may be lost: pages whose copy failed
    /// are kept for the pause to copy, and a capture that fails keeps them for the next one.
    fn precopy(&mut self) {
        let t = Instant::now();
        let mut written = Vec::new();
        let mut stale = Vec::new();
        for (i, &(s, e)) in self.armed.iter().enumerate() {
            // A range holding replaced memory fails part-way, after protecting the pages before
            // the replaced part without reporting them: the pause captures it whole. A failure
            // (the process is dying) leaves the rest to the pause, the same way.
            match self.tracker.take_written(s, e, &mut written) {
                Ok(Some(())) => {}
                Ok(None) => stale.push((s, e)),
                Err(_) => {
                    stale.extend_from_slice(&self.armed[i..]);
                    break;
                }
            }
        }
        // Hot pages stay unprotected (the scan protected them): the pause copies them.
        let mut hot: Vec<u64> = self.hot.iter().copied().collect();
        hot.sort_unstable();
        for (s, e) in coalesce(&hot) {
            let _ = self.tracker.unprotect(s, e);
        }
        let mut pages: Vec<u64> = written
            .iter()
            .flat_map(|&(s, e, _)| (s..e).step_by(PAGE as usize))
            .filter(|a| !self.hot.contains(a))
            .collect();
        pages.sort_unstable();
        pages.dedup();
        let readable = |a: u64| {
            self.prev_maps
                .iter()
                .find(|m| m.start <= a && a < m.end)
                .is_some_and(|m| m.read)
        };
        let want: Vec<(u64, u64, bool)> = coalesce(&pages)
            .into_iter()
            .map(|(s, e)| (s, e - s, readable(s)))
            .collect();
        let buf = std::mem::take(&mut self.prebuf);
        let mut fresh = Precopy::default();
        match copy_ranges(self.proc, &want, buf) {
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

    /// One epoch. With `hold`, the process stays stopped after the capture until a `Release`
    /// arrives on `cmds` (the reply is sent from here first).
    fn next(
        &mut self,
        hold: bool,
        replies: &mpsc::Sender<Reply>,
        cmds: &mpsc::Receiver<Cmd>,
    ) -> Option<Reply> {
        let capped = self.wait();
        // With swap active, "present" cannot tell a zapped page from a swapped one (see
        // `crate::track::has_contents`), which the pre-copy relies on: no pre-copy then.
        if self.cfg.precopy && self.tracker.precopy_capable() && self.contents == PAGE_IS_PRESENT {
            self.precopy();
        }
        let interval = self.last_resume.elapsed();
        let mut attempt = 0u64;
        let (st, t0, quiesce, captured) = loop {
            let t0 = Instant::now();
            let mut st = match Stopped::stop(self.proc) {
                Ok(s) => s,
                Err(e) => return Some(Err(CaptureError::from(e).into())),
            };
            let quiesce = t0.elapsed();
            match self.capture(&mut st) {
                // A signal queued just as the threads stopped would be lost: let it be
                // delivered and stop again (as a one-shot checkpoint does).
                Err(EpochError::Capture(CaptureError::PendingSignals(_)))
                | Err(EpochError::Track(TrackError::Busy))
                    if attempt < 20 =>
                {
                    attempt += 1;
                    let _ = st.resume();
                    std::thread::sleep(Duration::from_micros(200 * attempt));
                }
                r => break (st, t0, quiesce, r),
            }
        };
        if hold {
            let r = captured.and_then(|c| self.finish(c, interval, quiesce, t0.elapsed(), capped));
            let ok = r.is_ok();
            let _ = replies.send(r);
            if ok {
                while let Ok(cmd) = cmds.recv() {
                    if matches!(cmd, Cmd::Release) {
                        break;
                    }
                }
                let _ = replies.send(Err(EpochError::Gone("released".into())));
            }
            let _ = st.resume();
            self.last_resume = Instant::now();
            return None;
        }
        let resumed = st.resume();
        let pause = t0.elapsed();
        self.last_resume = Instant::now();
        if let Err(e) = resumed {
            return Some(Err(CaptureError::from(e).into()));
        }
        Some(captured.and_then(|c| self.finish(c, interval, quiesce, pause, capped)))
    }

    /// The part inside the pause.
    fn capture(&mut self, st: &mut Stopped) -> Result<Captured> {
        let pid = self.proc.pid;
        self.tracker.begin(st)?;
        let maps = self
            .tracker
            .layout(self.proc.maps().map_err(proc_err(pid, "maps"))?);
        // VmFlags come from smaps, which is costly: only when the layout changed.
        let maps = if same_layout(&maps, &self.prev_maps) {
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
        };
        let epoch = self.epoch + 1;
        let refresh = self.cfg.refresh_every > 0 && epoch.is_multiple_of(self.cfg.refresh_every);
        let mut meta = capture::capture_meta(self.proc, st, &maps, &mut self.cache, refresh)?;
        self.tracker.threads(&meta.threads, &maps);
        self.tracker.patch_image(&mut meta);
        // Nothing above changed tracking state: a failure there can be retried.
        self.epoch = epoch;
        let ts = Instant::now();

        // Written pages of every armed range; a range that fails the registration check holds
        // a mapping replaced since it was armed.
        let mut written = Vec::new();
        let mut stale = Vec::new();
        for &(s, e) in &self.armed {
            if self.tracker.take_written(s, e, &mut written)?.is_none() {
                stale.push((s, e));
            }
        }
        // Ranges the pre-copy could not scan to the end: the scan may have protected pages
        // before the failing part without reporting them. Captured whole, as stale ones.
        if let Some(pre) = &self.pre {
            stale.extend(pre.stale.iter().copied());
        }
        // Fresh: parts of trackable mappings not covered by a valid armed range.
        let valid: Vec<(u64, u64)> = subtract_all(&self.armed, &stale);
        let mut fresh: Vec<(u64, u64)> = Vec::new();
        for m in maps.iter().filter(|m| trackable(m)) {
            fresh.extend(subtract_all(&[(m.start, m.end)], &valid));
        }
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
        dirty.sort_unstable();
        dirty.dedup();
        // Pages the pre-copy took: written this epoch too. Those copied then and not written
        // since (not in `dirty`) keep that copy; those whose copy failed are copied now. Pages
        // of fresh ranges are captured with their range.
        let mut pre_copied: Vec<(u64, usize)> = Vec::new();
        if let Some(pre) = &self.pre {
            // Still mapped: a range unmapped since the pre-copy is gone from the layout.
            let armed = &self.armed;
            let mapped = |a: u64| {
                let i = armed.partition_point(|r| r.1 <= a);
                armed.get(i).is_some_and(|r| r.0 <= a)
            };
            for &(a, off) in &pre.pages {
                if in_fresh(a) || !mapped(a) || dirty.binary_search(&a).is_ok() {
                    continue;
                }
                match off {
                    Some(o) => pre_copied.push((a, o)),
                    None => dirty.push(a),
                }
            }
            // A pre-copied page zapped since (MADV_DONTNEED) is empty now (or the zero page, if
            // read since), yet the scan above does not report it: the zap left the
            // write-protect marker the pre-copy set. So check that each is still there; one
            // scan per armed range holding some.
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
            dirty.sort_unstable();
            dirty.dedup();
        }
        // Every page written this epoch, in address order.
        let mut written_all = dirty.clone();
        written_all.extend(pre_copied.iter().map(|p| p.0));
        written_all.sort_unstable();
        let mut hot_now = 0;
        if self.cfg.hot_epochs > 0 {
            let mut streak = HashMap::with_capacity(written_all.len());
            for &a in &written_all {
                streak.insert(a, self.streak.get(&a).copied().unwrap_or(0) + 1);
            }
            self.streak = streak;
            // In address order, as `written_all` is: ready to coalesce.
            let mut hot = Vec::new();
            for &a in &written_all {
                let was_hot = self.hot.contains(&a);
                let cools = was_hot
                    && (self.cool.contains(&a)
                        || self
                            .random()
                            .is_multiple_of(self.cfg.cold_one_in.max(1) as u64));
                if cools {
                    self.streak.insert(a, 0);
                } else if was_hot || self.streak[&a] >= self.cfg.hot_epochs {
                    hot.push(a);
                }
            }
            self.cool.clear();
            for (s, e) in coalesce(&hot) {
                self.tracker.unprotect(s, e)?;
            }
            hot_now = hot.len() as u64;
            self.hot = hot.into_iter().collect();
        }
        // The copied-on-write pages of private file mappings, sent whole every epoch: a page
        // written and then zapped (MADV_DONTNEED) reads as the file again, yet the scan does not
        // report it (the zapped entry keeps no write-protect marker), so the receiver learns
        // which of its pages still hold their own copy from this list.
        let mut cow_list: Vec<u64> = Vec::new();
        let mut found = Vec::new();
        for m in maps
            .iter()
            .filter(|m| trackable(m) && capture::is_file_backed(m))
        {
            found.clear();
            let q = Query {
                anyof: self.contents,
                mask: PAGE_IS_FILE,
                inverted: PAGE_IS_FILE,
                ret: PAGE_IS_PRESENT,
                ..Default::default()
            };
            self.tracker.scan(m.start, m.end, q, &mut found)?;
            for &(s, e, _) in &found {
                cow_list.extend((s..e).step_by(PAGE as usize));
            }
        }
        cow_list.sort_unstable();
        let cow = coalesce(&cow_list);
        let scan = ts.elapsed();

        let (vmas, mut files) = describe_vmas(&maps)?;
        for f in &mut files {
            if !self.file_refs.contains_key(&(f.path.clone(), f.inode)) {
                f.open(self.proc)?; // while stopped: after the resume the mapping may be gone
            }
        }
        // (Before the commit: it may split or merge the kernel's mappings `map_files` names.)
        // Protections for the next epoch (the mprotect tracker applies them only now, and its
        // agent's memory changes with them: before the copy, and those pages are copied too).
        let touched = self.tracker.commit(st, &self.armed, &maps)?;
        if !touched.is_empty() {
            dirty.extend(touched.into_iter().filter(|&a| !in_fresh(a)));
            dirty.sort_unstable();
            dirty.dedup();
            written_all.extend_from_slice(&dirty);
            written_all.sort_unstable();
            written_all.dedup();
        }

        // Copy every page to send.
        let tc = Instant::now();
        let mut want: Vec<(u64, u64, bool)> = Vec::new();
        let readable = |a: u64| {
            maps.iter()
                .find(|m| m.start <= a && a < m.end)
                .is_some_and(|m| m.read)
        };
        for (s, e) in coalesce(&dirty) {
            want.push((s, e - s, readable(s)));
        }
        let nfresh: u64 = fresh_pages.iter().map(|r| (r.1 - r.0) / PAGE).sum();
        for &(s, e, _) in &fresh_pages {
            want.push((s, e - s, readable(s)));
        }
        let buf = std::mem::take(&mut self.buf);
        let (runs, data) = copy_ranges(self.proc, &want, buf)?;
        let copy = tc.elapsed();

        meta.vmas = vmas;
        // Files last, still inside the pause: consistent with the memory just copied.
        meta.private_files = self.dirs.changes().map_err(EpochError::Files)?;
        self.prev_maps = maps;
        // Nothing can fail any more: the pre-copied pages join the checkpoint (their bytes
        // are moved over after the resume, in `finish`).
        let pre = self.pre.take().map(|p| (pre_copied, p));
        Ok(Captured {
            meta,
            write_faults: self.tracker.write_faults(),
            runs,
            data,
            files,
            fresh,
            cow,
            pre,
            dirty: written_all.len() as u64,
            fresh_pages: nfresh,
            hot: hot_now,
            scan,
            copy,
        })
    }

    /// After the pause: identify files, encode pages against twins, build the checkpoint.
    fn finish(
        &mut self,
        c: Captured,
        interval: Duration,
        quiesce: Duration,
        pause: Duration,
        capped: bool,
    ) -> Result<(Checkpoint, EpochStats)> {
        let te = Instant::now();
        let Captured {
            mut meta,
            write_faults,
            pre,
            cow,
            mut runs,
            mut data,
            files,
            fresh,
            dirty,
            fresh_pages,
            hot,
            scan,
            copy,
        } = c;
        let (mut precopy_pages, mut precopy_time) = (0, Duration::ZERO);
        if let Some((pages, pre)) = pre {
            precopy_pages = pre.pages.len() as u64;
            precopy_time = pre.took;
            data.reserve(pages.len() * PAGE as usize);
            for (a, o) in pages {
                runs.push(PageRun {
                    addr: a,
                    len: PAGE,
                    data_off: data.len() as u64,
                });
                data.extend_from_slice(&pre.data[o..o + PAGE as usize]);
            }
            self.prebuf = pre.data;
        }
        let mut refs = Vec::with_capacity(files.len());
        for f in files {
            let key = (f.path.clone(), f.inode);
            let r = match self.file_refs.get(&key) {
                Some(r) => r.clone(),
                None => {
                    let r = f.identify(self.proc)?;
                    self.file_refs.insert(key, r.clone());
                    r
                }
            };
            refs.push(r);
        }
        meta.files = refs;
        meta.exe = capture::identify_exe(self.proc, &meta.exe.path)?;
        // Twins of memory that is gone or replaced are void on the receiver too.
        for &(s, e) in &fresh {
            self.twins.remove_range(s, e);
        }
        // The receiver drops pages of private file mappings outside the copied-on-write list:
        // drop their twins too, or a later delta would be against contents it no longer has.
        for v in meta
            .vmas
            .iter()
            .filter(|v| matches!(v.backing, Backing::File { .. }) && !v.shared)
        {
            for (s, e) in subtract_all(&[(v.start, v.end)], &cow) {
                self.twins.remove_range(s, e);
            }
        }
        let mut live: Vec<(u64, u64)> = meta.vmas.iter().map(|v| (v.start, v.end)).collect();
        live.sort_unstable();
        for (s, e) in gaps(&live) {
            self.twins.remove_range(s, e);
        }
        let mut st = EpochStats {
            epoch: self.epoch,
            ..Default::default()
        };
        // Encode against the twins (read-only meanwhile), on `encode_workers` threads, each with
        // its own codec contexts; then stitch the parts and update the twins in order.
        let list: Vec<(u64, usize)> = runs
            .iter()
            .flat_map(|r| {
                (0..r.len / PAGE)
                    .map(move |p| (r.addr + p * PAGE, (r.data_off + p * PAGE) as usize))
            })
            .collect();
        let workers = self.cfg.encode_workers.clamp(1, list.len().max(1));
        while self.codecs.len() < workers {
            self.codecs
                .push(PageCodec::new().map_err(|e| CaptureError::Unsupported(e.to_string()))?);
        }
        let kind = self.cfg.codec;
        let twins = &self.twins;
        let chunk = list.len().div_ceil(workers).max(1);
        let parts: Vec<Encoded> = if workers == 1 {
            vec![encode_part(&mut self.codecs[0], kind, twins, &data, &list)]
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = self
                    .codecs
                    .iter_mut()
                    .zip(list.chunks(chunk))
                    .map(|(codec, part)| {
                        let data = &data;
                        sc.spawn(move || encode_part(codec, kind, twins, data, part))
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
            for (addr, enc, off) in encs {
                let &(_, data_off) = next.next().expect("one encoding per page");
                match enc {
                    PageEncoding::Zero => st.zero_pages += 1,
                    PageEncoding::Same => {
                        st.same_pages += 1;
                        if self.hot.contains(&addr) {
                            self.cool.insert(addr);
                        }
                    }
                    PageEncoding::Raw => st.raw_pages += 1,
                    PageEncoding::Delta { .. } => st.delta_pages += 1,
                    PageEncoding::Compressed { .. } => st.compressed_pages += 1,
                }
                if enc != PageEncoding::Same {
                    self.twins
                        .put(addr, self.epoch, &data[data_off..data_off + PAGE as usize]);
                }
                pages.push(EncodedPage {
                    addr,
                    enc,
                    data_off: base + off,
                });
            }
        }
        self.buf = data;
        meta.base_epoch = Some(self.epoch - 1);
        meta.reset = fresh;
        meta.cow = cow;
        meta.pages = pages;
        st.interval_us = interval.as_micros() as u64;
        st.pause_us = pause.as_micros() as u64;
        st.quiesce_us = quiesce.as_micros() as u64;
        st.scan_us = scan.as_micros() as u64;
        st.copy_us = copy.as_micros() as u64;
        st.dirty_pages = dirty;
        st.fresh_pages = fresh_pages;
        st.hot_pages = hot;
        st.raw_bytes = (dirty + fresh_pages) * PAGE;
        st.encoded_bytes = out.len() as u64;
        st.twin_bytes = self.twins.bytes() as u64;
        st.capped = capped;
        st.precopy_pages = precopy_pages;
        st.write_faults = write_faults;
        st.precopy_us = precopy_time.as_micros() as u64;
        st.encode_us = te.elapsed().as_micros() as u64;
        let ck = Checkpoint {
            epoch: self.epoch,
            kind: Kind::Incremental {
                base: self.epoch - 1,
            },
            image: meta,
            data: out,
        };
        Ok((ck, st))
    }

    /// Removes write tracking (the process keeps running untracked).
    fn disarm(&mut self) {
        self.tracker.release(self.proc, &self.armed);
    }
}

/// One worker's output: its bytes, and (address, encoding, offset in those bytes) per page.
type Encoded = (Vec<u8>, Vec<(u64, PageEncoding, u64)>);

/// Encodes the pages `part` ((address, offset in `data`)) against their twins.
fn encode_part(
    codec: &mut PageCodec,
    kind: Codec,
    twins: &TwinStore,
    data: &[u8],
    part: &[(u64, usize)],
) -> Encoded {
    let mut out = Vec::with_capacity(part.len() * 64);
    let mut encs = Vec::with_capacity(part.len());
    for &(addr, off) in part {
        let page = &data[off..off + PAGE as usize];
        let at = out.len() as u64;
        let enc = codec.encode_page(kind, twins.get(addr), page, &mut out);
        encs.push((addr, enc, at));
    }
    (out, encs)
}

struct Captured {
    meta: ProcessImage,
    write_faults: Option<u64>,
    /// Pre-copied pages to add (address, offset in the pre-copy's bytes), and the pre-copy.
    pre: Option<(Vec<(u64, usize)>, Precopy)>,
    cow: Vec<(u64, u64)>,
    runs: Vec<PageRun>,
    data: Vec<u8>,
    files: Vec<capture::PendingFile>,
    fresh: Vec<(u64, u64)>,
    dirty: u64,
    fresh_pages: u64,
    hot: u64,
    scan: Duration,
    copy: Duration,
}

/// Same mappings (address, size, protection, backing) in the same order.
fn same_layout(a: &[MapEntry], b: &[MapEntry]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (x.start, x.end, x.prot(), x.shared, x.offset, x.inode)
                == (y.start, y.end, y.prot(), y.shared, y.offset, y.inode)
                && x.name == y.name
        })
}

/// `ranges` minus the union of `holes` (both lists of half-open intervals).
fn subtract_all(ranges: &[(u64, u64)], holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(s, e) in ranges {
        let mut pieces = vec![(s, e)];
        for &(hs, he) in holes {
            let mut next = Vec::new();
            for (ps, pe) in pieces {
                if he <= ps || pe <= hs {
                    next.push((ps, pe));
                    continue;
                }
                if ps < hs {
                    next.push((ps, hs));
                }
                if he < pe {
                    next.push((he, pe));
                }
            }
            pieces = next;
        }
        out.extend(pieces);
    }
    out
}

/// Sorted page addresses → (start, end) ranges.
fn coalesce(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &a in pages {
        match out.last_mut() {
            Some(r) if r.1 == a => r.1 += PAGE,
            _ => out.push((a, a + PAGE)),
        }
    }
    out
}

/// The gaps between sorted ranges, over the whole user address space.
fn gaps(sorted: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for &(s, e) in sorted {
        if s > at {
            out.push((at, s));
        }
        at = at.max(e);
    }
    if at < 0x7fff_ffff_f000 {
        out.push((at, 0x7fff_ffff_f000));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_arithmetic() {
        assert_eq!(
            subtract_all(&[(0, 100)], &[(10, 20), (50, 60)]),
            vec![(0, 10), (20, 50), (60, 100)]
        );
        assert_eq!(subtract_all(&[(0, 100)], &[(0, 100)]), vec![]);
        assert_eq!(subtract_all(&[(10, 20)], &[(0, 5)]), vec![(10, 20)]);
        assert_eq!(
            coalesce(&[0, 4096, 8192, 16384]),
            vec![(0, 12288), (16384, 20480)]
        );
        assert_eq!(
            gaps(&[(4096, 8192)]),
            vec![(0, 4096), (8192, 0x7fff_ffff_f000)]
        );
    }
}
