//! Write tracking: the [`Tracker`] interface the epoch loop uses, and its two implementations.
//!
//! - [`UffdTracker`] (here, the default): userfaultfd write-protection in async mode plus
//!   `PAGEMAP_SCAN` (Linux ≥ 6.7): the kernel resolves the first write to a protected page by
//!   itself (~1.2 µs) and marks the page written; one `PAGEMAP_SCAN` over all armed ranges
//!   returns the written pages and protects them again, atomically, and a check that walks
//!   only the mappings (not their pages) finds armed memory that was replaced
//!   ([`UffdTracker::replaced`]).
//! - [`mprotect::MprotectTracker`]: `mprotect` + SIGSEGV through an agent loaded into the
//!   process (Tardigrade's method), for kernels without the former.
//!
//! The userfaultfd must belong to the target's mm, so it is created *inside* the target by an
//! injected `userfaultfd()` call, duplicated into the supervisor with `pidfd_getfd`, and closed
//! in the target again. Its ioctls then act on the target's memory from here.
//!
//! Kernel facts this relies on (measured on 6.18, see shared/KERNEL-FACTS.md; the first three
//! are checked by the test `one_scan_skips_unregistered_and_check_finds_replaced`):
//! - `PM_SCAN_CHECK_WPASYNC` fails with `EPERM` when the range holds memory that is not
//!   registered: that is how a mapping replaced inside one epoch (munmap + mmap at the same
//!   address) is noticed even though the layout looks unchanged.
//! - With `PM_SCAN_WP_MATCHING` alone, memory that is not registered (and unmapped gaps) is
//!   skipped silently: one scan can cover every armed range and what lies between them.
//! - A scan whose query requires `PAGE_IS_WPALLOWED` inverted skips registered mappings
//!   before walking their page tables: with `PM_SCAN_CHECK_WPASYNC` it checks registration
//!   at the cost of a walk of the mappings.
//! - A get-only scan (no `PM_SCAN_WP_MATCHING`) reports all of an unregistered range as
//!   written, unless its query requires `PAGE_IS_WPALLOWED` (a per-mapping category): the cap
//!   check ([`UffdTracker::count_written`]) is one such scan over all armed ranges.
//! - Pages zapped by `MADV_DONTNEED` are reported as written.
//! - `walk_end` is only meaningful when the output vector came back full.
//! - `UFFDIO_WRITEPROTECT` over a range stops with `ENOENT` at the first mapping in it that is
//!   not registered (one that replaced armed memory, say): the mappings after it are left as
//!   they were. An unprotect that fails leaves pages protected (checked by the test
//!   `hot_page_after_a_replaced_one_keeps_its_write` in `tests/incremental.rs`).
//!

pub mod mprotect;

use crate::image::ThreadImage;
use crate::procfs::MapEntry;
use crate::ptrace::Stopped;
use crate::sys;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: u64 = 0xC018_AA3F;
const UFFDIO_REGISTER: u64 = 0xC020_AA00;
const UFFDIO_UNREGISTER: u64 = 0x8010_AA01;
const UFFDIO_WRITEPROTECT: u64 = 0xC018_AA06;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 = 0xC060_6610;
pub const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
pub const PAGE_IS_WPALLOWED: u64 = 1 << 0;
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
pub const PAGE_IS_FILE: u64 = 1 << 2;
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
pub const PAGE_IS_SWAPPED: u64 = 1 << 4;
pub const PAGE_IS_PFNZERO: u64 = 1 << 5;

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// What the epoch loop needs from a write tracker. Ranges are whole mappings of the layout the
/// app asked for (see [`Tracker::layout`]); page lists are `(start, end, categories)` regions.
///
/// One pause calls, in order: `begin` (first), `layout`, `threads`, then `take_written` / `scan` /
/// `arm` / `protect` as the loop decides, then `commit` (last, still inside the pause).
pub trait Tracker {
    /// First call of a pause. May fail with [`TrackError::Busy`]: resume, and stop again.
    fn begin(&mut self, _st: &mut Stopped) -> Result<(), TrackError> {
        Ok(())
    }
    /// The raw layout read in this pause (maps or smaps); returns the layout to record. A
    /// tracker that changes protections itself gives back what the app asked for.
    fn layout(&mut self, maps: Vec<MapEntry>) -> Vec<MapEntry> {
        maps
    }
    /// The threads of this pause (their stacks may need special care).
    fn threads(&mut self, _threads: &[ThreadImage], _maps: &[MapEntry]) {}
    /// Starts tracking `[start, end)` (whole mappings), protected from now on.
    fn arm(&mut self, start: u64, end: u64) -> Result<(), TrackError>;
    /// Leaves `[start, end)` writable: reported as written by every `take_written` (hot pages).
    fn unprotect(&mut self, start: u64, end: u64) -> Result<(), TrackError>;
    /// Pages of `[start, end)` matching `q` (contents queries: present, file, swapped).
    fn scan(
        &mut self,
        start: u64,
        end: u64,
        q: Query,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<(), TrackError>;
    /// Pages of the armed range `[start, end)` written since the last pause, protected again.
    /// `Ok(None)`: the range holds memory replaced since it was armed (capture it whole).
    fn take_written(
        &mut self,
        start: u64,
        end: u64,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<Option<()>, TrackError>;
    /// [`Tracker::take_written`] of every armed range (`ranges`, sorted, disjoint), in as few
    /// scans as the tracker can; returns the ranges holding replaced memory. `layout` is the
    /// layout of this pause (the process stopped); `None` while the process runs (the
    /// pre-copy): no range is then checked for replaced memory, which the pause does.
    ///
    /// On failure, the index of the first range whose written pages may have been protected
    /// without being reported: it and the ranges after it are in an unknown state.
    fn take_all(
        &mut self,
        ranges: &[(u64, u64)],
        _layout: Option<&[MapEntry]>,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<Vec<(u64, u64)>, (TrackError, usize)> {
        let mut stale = Vec::new();
        for (i, &(s, e)) in ranges.iter().enumerate() {
            match self.take_written(s, e, out) {
                Ok(Some(())) => {}
                Ok(None) => stale.push((s, e)),
                Err(err) => return Err((err, i)),
            }
        }
        Ok(stale)
    }
    /// Written pages so far in `ranges`, stopping at `limit` (runs while the process runs).
    fn count_written(&mut self, ranges: &[(u64, u64)], limit: u64) -> u64;
    /// Last call of a pause before the copy: `armed` is the new armed set, `maps` the recorded
    /// layout. Returns the pages the tracker itself wrote in the process meanwhile (they must
    /// be copied too, and `take_written` ran before they were written).
    fn commit(
        &mut self,
        _st: &mut Stopped,
        _armed: &[(u64, u64)],
        _maps: &[MapEntry],
    ) -> Result<Vec<u64>, TrackError> {
        Ok(Vec::new())
    }
    /// Whether `take_written` works while the process runs (for the pre-copy).
    fn precopy_capable(&self) -> bool {
        false
    }
    /// Whether the layout can be carried between pauses when the process made no layout call:
    /// the tracker itself changes no mapping between pauses, and no protection of its splits
    /// or merges mappings (the mprotect tracker's agent does both).
    fn layout_carried(&self) -> bool {
        false
    }
    /// Whether the loop leaves hot pages writable (unprotects them in every pause) rather than
    /// protecting them as any other page. Worth it only when a write fault costs more than
    /// the unprotect: true for the mprotect tracker, whose fault is a signal into its agent.
    /// Not for userfaultfd in async mode: the kernel resolves a write fault on the writer's
    /// own CPU in about a microsecond, while every unprotect (`UFFDIO_WRITEPROTECT`) ends in
    /// a TLB flush with an IPI to each CPU running the process, which traps to the
    /// hypervisor in a VM (a quarter of the checkpointer's CPU time on Redis, measured). The
    /// loop then does not tell hot pages apart at all (they are pre-copied like the others).
    fn hot_pages_writable(&self) -> bool {
        true
    }
    /// Write faults since the previous pause, if the tracker counts them (read in `begin`).
    fn write_faults(&self) -> Option<u64> {
        None
    }
    /// Whether `arm` changes the layout the kernel shows (the loop then reads it again).
    fn arm_changes_layout(&self) -> bool {
        true
    }
    /// Corrects the captured process state for what the tracker itself changed in it.
    fn patch_image(&self, _image: &mut crate::image::ProcessImage) {}
    /// Stops tracking `armed` for good; the process keeps running untracked.
    fn release(&mut self, proc: &crate::procfs::Proc, armed: &[(u64, u64)]);
    /// A short name for logs and stats.
    fn name(&self) -> &'static str;
}

/// Whether the address space `pagemap` (a `/proc/PID/pagemap` opened earlier) belongs to is
/// gone while the process lives on: it ran `execve`, which gives it a new one.
///
/// Kernel rules this relies on: opening `/proc/PID/pagemap` pins the address space of that
/// moment (`proc_mem_open`: the file keeps the `mm`, not the process), and `PAGEMAP_SCAN` on it
/// fails with `ESRCH` once that address space has no users left (`mmget_not_zero`), which
/// `execve` causes (measured on 6.18: a scan that returned 0 before the exec fails with ESRCH
/// after it). The scan asked here, one page, no write-protect flag, changes nothing; on a live
/// address space it reports whatever it finds there (ignored).
pub(crate) fn mm_gone(pagemap: &File) -> bool {
    let mut region = PageRegion::default();
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        start: 0x10000,
        end: 0x11000,
        vec: &mut region as *mut PageRegion as u64,
        vec_len: 1,
        category_mask: PAGE_IS_WRITTEN,
        return_mask: PAGE_IS_WRITTEN,
        ..Default::default()
    };
    // SAFETY: `arg` is a valid pm_scan_arg whose vec points at one region on our stack; the
    // kernel writes at most vec_len (1) regions there.
    let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
    n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Which tracker an epoch loop uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrackerKind {
    /// userfaultfd write-protect (async) + PAGEMAP_SCAN (Linux >= 6.7).
    #[default]
    Uffd,
    /// mprotect + SIGSEGV through an agent in the process (any kernel with seccomp).
    Mprotect,
}

impl std::str::FromStr for TrackerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uffd" => Ok(TrackerKind::Uffd),
            "mprotect" => Ok(TrackerKind::Mprotect),
            _ => Err(format!("unknown tracker {s:?} (known: uffd, mprotect)")),
        }
    }
}

/// Why tracking could not be set up or a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
    #[error("a thread was stopped inside the agent's memory-layout update; the pause is retried")]
    Busy,
    #[error("taking over the write-tracking agent process {pid} (host PID) inherited: {why}")]
    Adopt { pid: crate::sys::Pid, why: String },
    #[error("reading /proc/PID/pagemap: {0}")]
    Pagemap(io::Error),
    #[error(
        "creating a userfaultfd inside the process failed (errno {0}); write tracking needs Linux >= 6.7 with userfaultfd"
    )]
    Create(i64),
    #[error(
        "this kernel's userfaultfd lacks asynchronous write-protection (WP_ASYNC, Linux >= 6.7): {0}"
    )]
    NoAsync(io::Error),
    #[error("{op} of {start:#x}-{end:#x} failed: {source}")]
    Ioctl {
        op: &'static str,
        start: u64,
        end: u64,
        source: io::Error,
    },
    #[error(transparent)]
    Ptrace(#[from] crate::ptrace::PtraceError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Whether any swap area is active. Without one, a page `PAGEMAP_SCAN` (and pagemap) reports as
/// swapped is really a userfaultfd write-protect marker on an empty entry — no contents at all.
/// With swap, a marker cannot be told from a swapped-out page by category, so swapped pages are
/// then kept (saved as they read: correct, if redundant for markers).
pub fn swap_active() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1)
}

/// The categories that mean "this page has contents of its own": present, or swapped out when
/// swap is active (see [`swap_active`]).
pub fn has_contents() -> u64 {
    if swap_active() {
        PAGE_IS_PRESENT | PAGE_IS_SWAPPED
    } else {
        PAGE_IS_PRESENT
    }
}

/// A scan query: which pages to report (all of `mask`, any of `anyof`, after inverting
/// `inverted`) and which categories to return for them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query {
    pub flags: u64,
    pub mask: u64,
    pub inverted: u64,
    pub anyof: u64,
    pub ret: u64,
    /// Stop after this many pages (0: no limit).
    pub max_pages: u64,
}

/// One process's tracker: its userfaultfd (as our descriptor) and `pagemap`.
pub struct UffdTracker {
    uffd: OwnedFd,
    pagemap: File,
    buf: Vec<PageRegion>,
}

/// `userfaultfd(2)`'s flag for a descriptor that handles faults from user mode only.
const UFFD_USER_MODE_ONLY: u64 = 1;

impl UffdTracker {
    /// Creates the userfaultfd inside the stopped process and enables async write-protection.
    pub fn new(
        st: &mut Stopped,
        maps: &[crate::procfs::MapEntry],
        pagemap: File,
    ) -> Result<Self, TrackError> {
        let leader = st.tids[0];
        let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
        let (mut fd, _, _) = st.inject(
            maps,
            leader,
            libc::SYS_userfaultfd,
            [flags, 0, 0, 0, 0, 0],
            0,
        )?;
        // A process without CAP_SYS_PTRACE (nginx's workers, which run as another user) gets
        // EPERM unless `vm.unprivileged_userfaultfd` is set; it may still have one that handles
        // faults from user mode only. That is enough here: with asynchronous write-protection
        // the kernel resolves every write fault itself, from user or kernel mode alike, without
        // ever asking the userfaultfd (`do_wp_page` and the PTE-marker path never call
        // `handle_userfault` for an async context), and nothing else is registered.
        if fd == -i64::from(libc::EPERM) {
            (fd, _, _) = st.inject(
                maps,
                leader,
                libc::SYS_userfaultfd,
                [flags | UFFD_USER_MODE_ONLY, 0, 0, 0, 0, 0],
                0,
            )?;
        }
        if fd < 0 {
            return Err(TrackError::Create(-fd));
        }
        let pidfd = sys::pidfd_open(st.pid)?;
        let ours = sys::pidfd_getfd(&pidfd, fd as i32);
        // Whatever happened, the descriptor must not stay in the process's table.
        st.inject(maps, leader, libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0], 0)?;
        let uffd = ours?;
        let mut api = [
            UFFD_API,
            UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED,
            0,
        ];
        // SAFETY: UFFDIO_API reads and writes a `struct uffdio_api` (three u64).
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, api.as_mut_ptr()) } < 0 {
            return Err(TrackError::NoAsync(io::Error::last_os_error()));
        }
        Ok(UffdTracker {
            uffd,
            pagemap,
            buf: vec![PageRegion::default(); 4096],
        })
    }

    fn ioctl(
        &self,
        op: &'static str,
        req: u64,
        arg: *mut u64,
        start: u64,
        end: u64,
    ) -> Result<(), TrackError> {
        // SAFETY: `arg` points at the struct `req` expects (callers build it on their stack).
        if unsafe { libc::ioctl(self.uffd.as_raw_fd(), req, arg) } < 0 {
            return Err(TrackError::Ioctl {
                op,
                start,
                end,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Registers `[start, end)` (whole mappings) for write-protection and protects it.
    pub fn arm(&self, start: u64, end: u64) -> Result<(), TrackError> {
        let mut reg = [start, end - start, UFFDIO_REGISTER_MODE_WP, 0];
        self.ioctl(
            "UFFDIO_REGISTER",
            UFFDIO_REGISTER,
            reg.as_mut_ptr(),
            start,
            end,
        )?;
        self.protect(start, end, true)
    }

    /// Unregisters `[start, end)`; memory that is no longer mapped is ignored.
    pub fn disarm(&self, start: u64, end: u64) {
        let mut r = [start, end - start];
        let _ = self.ioctl(
            "UFFDIO_UNREGISTER",
            UFFDIO_UNREGISTER,
            r.as_mut_ptr(),
            start,
            end,
        );
    }

    /// Write-protects (`wp`) or unprotects `[start, end)`. Unprotected pages are reported as
    /// written by every scan (hot pages rely on that).
    pub fn protect(&self, start: u64, end: u64, wp: bool) -> Result<(), TrackError> {
        let mut w = [
            start,
            end - start,
            if wp { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 },
        ];
        self.ioctl(
            "UFFDIO_WRITEPROTECT",
            UFFDIO_WRITEPROTECT,
            w.as_mut_ptr(),
            start,
            end,
        )
    }

    /// Runs `PAGEMAP_SCAN` over `[start, end)`, appending `(start, end, categories)` regions.
    pub fn scan(
        &mut self,
        start: u64,
        end: u64,
        q: Query,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<(), TrackError> {
        let mut at = start;
        let mut left = q.max_pages;
        while at < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags: q.flags,
                start: at,
                end,
                vec: self.buf.as_mut_ptr() as u64,
                vec_len: self.buf.len() as u64,
                max_pages: left,
                category_inverted: q.inverted,
                category_mask: q.mask,
                category_anyof_mask: q.anyof,
                return_mask: q.ret,
                ..Default::default()
            };
            // SAFETY: `arg` is a valid pm_scan_arg whose vec points at our buffer of vec_len
            // regions; the kernel writes at most that many.
            let n = unsafe { libc::ioctl(self.pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
            if n < 0 {
                return Err(TrackError::Ioctl {
                    op: "PAGEMAP_SCAN",
                    start: at,
                    end,
                    source: io::Error::last_os_error(),
                });
            }
            let n = n as usize;
            let mut pages = 0;
            for r in &self.buf[..n] {
                out.push((r.start, r.end, r.categories));
                pages += (r.end - r.start) / 4096;
            }
            if q.max_pages != 0 {
                left = left.saturating_sub(pages);
                if left == 0 {
                    break;
                }
            }
            if n < self.buf.len() || arg.walk_end >= end {
                break;
            }
            at = arg.walk_end;
        }
        Ok(())
    }

    /// Written pages of `[start, end)`, protected again by the same scan. `Ok(None)`: the range
    /// holds memory that is not registered (a mapping replaced since it was armed).
    pub fn take_written(
        &mut self,
        start: u64,
        end: u64,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<Option<()>, TrackError> {
        let q = Query {
            flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
            mask: PAGE_IS_WRITTEN,
            ret: PAGE_IS_WRITTEN,
            ..Default::default()
        };
        let before = out.len();
        match self.scan(start, end, q, out) {
            Err(TrackError::Ioctl { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {
                out.truncate(before);
                Ok(None)
            }
            Err(e) => Err(e),
            Ok(()) => Ok(Some(())),
        }
    }

    /// Written pages of every registered mapping in `[first start, last end)` of `ranges`
    /// (sorted), protected again, in one `PAGEMAP_SCAN` (several only when the output vector
    /// fills). `PM_SCAN_WP_MATCHING` without `PM_SCAN_CHECK_WPASYNC` skips memory that is not
    /// registered (the gaps between armed ranges, and mappings that replaced armed memory:
    /// see [`UffdTracker::replaced`]) instead of failing on it.
    pub fn take_written_span(
        &mut self,
        ranges: &[(u64, u64)],
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<(), TrackError> {
        let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
            return Ok(());
        };
        let q = Query {
            flags: PM_SCAN_WP_MATCHING,
            mask: PAGE_IS_WRITTEN,
            ret: PAGE_IS_WRITTEN,
            ..Default::default()
        };
        self.scan(first.0, last.1, q, out)
    }

    /// The armed `ranges` (sorted) that hold memory not registered with our userfaultfd: a
    /// mapping that replaced armed memory since it was armed (munmap + mmap, `MAP_FIXED`, or
    /// mremap onto it), even at the same address with the same layout line. `layout` is the
    /// current layout, read with the process stopped.
    ///
    /// Why registration tells: only [`UffdTracker::arm`] registers memory; a new mapping is
    /// never registered, never merges with a registered one (the kernel merges only mappings
    /// of the same userfaultfd context), and mremap moving a registered mapping drops its
    /// registration (we do not ask for `UFFD_FEATURE_EVENT_REMAP`). So a registered mapping
    /// is memory armed at that very address, possibly split or merged since. Zapping
    /// (`MADV_DONTNEED`) keeps the mapping: its pages are handled by the scans.
    ///
    /// How it is cheap: `PM_SCAN_CHECK_WPASYNC` with a query that requires `PAGE_IS_WPALLOWED`
    /// inverted fails with `EPERM` on the first mapping that is not registered, and skips every
    /// registered one before walking its page tables (the kernel tests the mapping first), so
    /// a check costs a walk of the mappings, not of their pages. Consecutive armed ranges with
    /// only unmapped gaps between them (nothing in the layout) are checked in one call; when
    /// that fails, each of its ranges alone.
    pub fn replaced(
        &mut self,
        ranges: &[(u64, u64)],
        layout: &[MapEntry],
    ) -> Result<Vec<(u64, u64)>, TrackError> {
        let mut stale = Vec::new();
        let mut i = 0;
        while i < ranges.len() {
            // The span: ranges[i..j], joined while nothing of the layout lies between two.
            let mut j = i + 1;
            while j < ranges.len() && !occupied(layout, ranges[j - 1].1, ranges[j].0) {
                j += 1;
            }
            if !self.registered(ranges[i].0, ranges[j - 1].1)? {
                for &(s, e) in &ranges[i..j] {
                    if j - i == 1 || !self.registered(s, e)? {
                        stale.push((s, e));
                    }
                }
            }
            i = j;
        }
        Ok(stale)
    }

    /// Whether every mapping in `[start, end)` is registered for async write-protection (see
    /// [`UffdTracker::replaced`]). Walks no page tables.
    fn registered(&mut self, start: u64, end: u64) -> Result<bool, TrackError> {
        let q = Query {
            flags: PM_SCAN_CHECK_WPASYNC,
            mask: PAGE_IS_WPALLOWED,
            inverted: PAGE_IS_WPALLOWED,
            ret: PAGE_IS_WPALLOWED,
            ..Default::default()
        };
        let mut none = Vec::new();
        match self.scan(start, end, q, &mut none) {
            Ok(()) => Ok(true),
            Err(TrackError::Ioctl { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Counts written pages in `ranges` without protecting them, stopping at `limit`.
    ///
    /// One scan over the span of `ranges`: requiring `PAGE_IS_WPALLOWED` makes the kernel skip
    /// every mapping not registered for async write-protection (a per-mapping category, tested
    /// before any page table is walked), whose pages would all read as written. Only our armed
    /// memory is registered, so this counts the same pages as a scan per armed range, in one
    /// system call instead of one per range (a hundred on Redis, a few times per epoch).
    pub fn count_written(&mut self, ranges: &[(u64, u64)], limit: u64) -> u64 {
        let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
            return 0;
        };
        let mut out = Vec::new();
        let q = Query {
            mask: PAGE_IS_WRITTEN | PAGE_IS_WPALLOWED,
            ret: PAGE_IS_WRITTEN,
            max_pages: limit,
            ..Default::default()
        };
        if self.scan(first.0, last.1, q, &mut out).is_err() {
            return 0;
        }
        out.iter().map(|r| (r.1 - r.0) / 4096).sum::<u64>()
    }
}

impl Tracker for UffdTracker {
    fn arm(&mut self, start: u64, end: u64) -> Result<(), TrackError> {
        UffdTracker::arm(self, start, end)
    }
    fn unprotect(&mut self, start: u64, end: u64) -> Result<(), TrackError> {
        self.protect(start, end, false)
    }
    fn scan(
        &mut self,
        start: u64,
        end: u64,
        q: Query,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<(), TrackError> {
        UffdTracker::scan(self, start, end, q, out)
    }
    fn take_written(
        &mut self,
        start: u64,
        end: u64,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<Option<()>, TrackError> {
        UffdTracker::take_written(self, start, end, out)
    }
    fn take_all(
        &mut self,
        ranges: &[(u64, u64)],
        layout: Option<&[MapEntry]>,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<Vec<(u64, u64)>, (TrackError, usize)> {
        let stale = match layout {
            Some(maps) => self.replaced(ranges, maps).map_err(|e| (e, 0))?,
            None => Vec::new(),
        };
        self.take_written_span(ranges, out).map_err(|e| (e, 0))?;
        Ok(stale)
    }
    fn count_written(&mut self, ranges: &[(u64, u64)], limit: u64) -> u64 {
        UffdTracker::count_written(self, ranges, limit)
    }
    fn release(&mut self, _proc: &crate::procfs::Proc, armed: &[(u64, u64)]) {
        for &(s, e) in armed {
            self.disarm(s, e);
        }
    }
    fn precopy_capable(&self) -> bool {
        true
    }
    fn hot_pages_writable(&self) -> bool {
        false
    }
    fn layout_carried(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "uffd"
    }
}

/// Whether any mapping of the sorted `layout` intersects `[start, end)`.
fn occupied(layout: &[MapEntry], start: u64, end: u64) -> bool {
    let i = layout.partition_point(|m| m.end <= start);
    layout.get(i).is_some_and(|m| m.start < end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel behaviour the one-scan take relies on, on this process's own memory: a
    /// `PM_SCAN_WP_MATCHING` scan across an unmapped gap and an unregistered mapping skips them
    /// (no error, their written pages not reported); the registration check finds a mapping
    /// replaced at the same address, and joins ranges separated only by unmapped gaps.
    #[test]
    fn one_scan_skips_unregistered_and_check_finds_replaced() {
        const P: u64 = 4096;
        // SAFETY: creating a userfaultfd for our own mm; no pointers.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            eprintln!("skipped: userfaultfd: {}", io::Error::last_os_error());
            return;
        }
        // SAFETY: a descriptor we just created and own.
        let uffd: OwnedFd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        let mut api = [
            UFFD_API,
            UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED,
            0,
        ];
        // SAFETY: UFFDIO_API reads and writes three u64.
        let r = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, api.as_mut_ptr()) };
        assert_eq!(r, 0);
        let mut t = UffdTracker {
            uffd,
            pagemap: std::fs::File::open("/proc/self/pagemap").unwrap(),
            buf: vec![PageRegion::default(); 16],
        };
        // A = pages 0-3 (registered), 4-5 unmapped, C = 6-9 (registered), B = 10-11 (not).
        // SAFETY: a fresh anonymous mapping of our own, unmapped at the end.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                12 * P as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let b = base as u64;
        let (a, c, bb) = (
            (b, b + 4 * P),
            (b + 6 * P, b + 10 * P),
            (b + 10 * P, b + 12 * P),
        );
        // SAFETY: unmapping part of our own mapping.
        unsafe { libc::munmap((b + 4 * P) as *mut _, 2 * P as usize) };
        t.arm(a.0, a.1).unwrap();
        t.arm(c.0, c.1).unwrap();
        let write = |addr: u64| {
            // SAFETY: inside our mapping (mapped, writable).
            unsafe { std::ptr::write_volatile(addr as *mut u8, 1) }
        };
        write(a.0);
        write(c.0 + P);
        write(bb.0);
        let layout = |_: ()| {
            crate::procfs::Proc::open(std::process::id() as _)
                .unwrap()
                .maps()
                .unwrap()
        };
        // The cap check's count over the same span, B written and not registered: A's and C's
        // pages only (without `PAGE_IS_WPALLOWED` in the query, B's would count too).
        assert_eq!(t.count_written(&[a, c, bb], 100), 2);
        assert_eq!(t.count_written(&[a, c, bb], 1), 1, "the limit");
        // One scan over A, the gap, C and B: only A's and C's written pages, no error.
        let mut out = Vec::new();
        let q = Query {
            flags: PM_SCAN_WP_MATCHING,
            mask: PAGE_IS_WRITTEN,
            ret: PAGE_IS_WRITTEN,
            ..Default::default()
        };
        t.scan(a.0, bb.1, q, &mut out).unwrap();
        let pages: Vec<u64> = out
            .iter()
            .flat_map(|r| (r.0..r.1).step_by(P as usize))
            .collect();
        assert_eq!(pages, vec![a.0, c.0 + P], "regions {out:x?}");
        // Protected again: a second scan reports nothing.
        out.clear();
        t.take_written_span(&[a, c], &mut out).unwrap();
        assert!(out.is_empty(), "regions {out:x?}");
        // Nothing replaced yet (A and C are checked in one call across the gap).
        assert_eq!(t.replaced(&[a, c], &layout(())).unwrap(), vec![]);
        // B is not registered: as an armed range it reads as replaced.
        assert_eq!(t.replaced(&[a, c, bb], &layout(())).unwrap(), vec![bb]);
        // Replace C at the same address with the same size and protection.
        // SAFETY: mapping over our own mapping.
        let r = unsafe {
            libc::mmap(
                c.0 as *mut _,
                4 * P as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(r as u64, c.0);
        write(c.0 + 2 * P);
        assert_eq!(t.replaced(&[a, c], &layout(())).unwrap(), vec![c]);
        // The one scan still runs, and skips the replaced memory.
        out.clear();
        t.take_written_span(&[a, c], &mut out).unwrap();
        assert!(out.is_empty(), "regions {out:x?}");
        t.disarm(a.0, a.1);
        // SAFETY: unmapping what we mapped.
        unsafe { libc::munmap(base, 12 * P as usize) };
    }

    /// The copied-on-write query the epoch loop uses, on a private file mapping of our own:
    /// a page only read (file page), a page written (copied on write), a page never touched.
    #[test]
    fn cow_query_finds_only_copied_pages() {
        let path = std::env::temp_dir().join(format!("tardi-cow-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 3 * 4096]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: a fresh private mapping of our own file; unmapped at the end.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        // SAFETY: within the mapping.
        unsafe {
            std::ptr::read_volatile(p);
            std::ptr::write_volatile(p.add(4096), 1);
        }
        let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        let mut t = UffdTracker {
            uffd: std::fs::File::open("/dev/null").unwrap().into(),
            pagemap,
            buf: vec![PageRegion::default(); 16],
        };
        let q = Query {
            anyof: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            mask: PAGE_IS_FILE,
            inverted: PAGE_IS_FILE,
            ret: PAGE_IS_PRESENT,
            ..Default::default()
        };
        let mut out = Vec::new();
        let base = p as u64;
        t.scan(base, base + 3 * 4096, q, &mut out).unwrap();
        // SAFETY: unmapping what we mapped.
        unsafe { libc::munmap(p.cast(), 3 * 4096) };
        std::fs::remove_file(&path).unwrap();
        let pages: Vec<u64> = out
            .iter()
            .flat_map(|r| (r.0..r.1).step_by(4096))
            .map(|a| (a - base) / 4096)
            .collect();
        assert_eq!(pages, vec![1], "regions {out:x?}");
    }
}
