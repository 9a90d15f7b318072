//! The epoch loop: a full checkpoint, then one incremental checkpoint per epoch.
//!
//! Each epoch: wait → stop every thread → read the layout and thread/handle state → take the
//! pages written since the last epoch from the tracker (protecting them again in the same scan;
//! with userfaultfd one scan over all armed ranges, plus a check of the mappings alone for
//! armed memory that was replaced) and capture mappings that are new or replaced whole → copy
//! the pages → call the pause hook → resume. Encoding against the twins happens after the
//! resume, while the service runs.
//!
//! **Hot pages** (written in [`EpochConfig::hot_epochs`] epochs in a row) are told apart only
//! for the mprotect tracker, which leaves them writable (its write faults are signals).
//! Userfaultfd keeps them protected, because there a fault is cheaper than the TLB flush of an
//! unprotect (see [`Tracker::hot_pages_writable`]), and pre-copies them like any other page:
//! one written again before the pause is copied there, the others need no copy in it.
//!
//! [`EpochStats`] splits the pause into its parts (`take_us`, `layout_us`, `meta_*_us`, ...):
//! `bench/pause_parts.py` prints them from `bench/epochs.sh` or `tardi profile --out` output.
//!
//! **When an epoch ends** (see [`EpochStats::ended_by`]): at [`EpochConfig::interval`] after the
//! previous resume; earlier, once [`EpochConfig::min_interval`] has passed, when output is
//! waiting ([`Trigger::set`], [`EndedBy::Output`]) or the dirty pages reach the cap
//! ([`EndedBy::Cap`], polled a few times per epoch). Ending on output follows the
//! adaptive-checkpoint-scheduling idea: Tardigrade ran epochs back to back, so a reply waited
//! ~1.5 epochs for its checkpoint; here a reply's epoch ends as soon as it is queued.
//!
//! The minimum interval batches replies: with many clients, the replies one release sends are
//! answered over a few hundred microseconds, and an epoch that ended at the first answer would
//! split them over two epochs (each a pause and a round trip). With
//! [`EpochConfig::follow_releases`] the loop is told of releases ([`Trigger::released`], with
//! the packets sent) and counts output packets ([`Trigger::output`]): once the epoch has queued
//! as many packets as the last release sent, the clients it answered have answered again and
//! the epoch ends at [`EpochConfig::follow_min`] instead. A lone client (a ping, one request at
//! a time) no longer waits for the minimum interval; fifty clients still end up in one epoch.
//!
//! **Output commit** ([`EpochHooks::on_pause`]): inside every pause that produces a checkpoint,
//! with all threads stopped, after the capture succeeded and before the resume, the hook gets
//! the number N of the checkpoint this pause produces. Whatever the service sent before this
//! pause belongs to an epoch ≤ N, and is safe to release once checkpoint N (or a later one) is
//! replicated; what it sends after belongs to an epoch > N.
//!
//! **Full checkpoint in the middle of a stream** ([`Epochs::request_full`], for a backup that
//! joins): the next pause produces both the incremental checkpoint N and a full checkpoint of
//! the same state N (see `full_twin_consistency` below for why the incrementals after N apply
//! to either).
//!
//! **Failures** ([`EpochError::chain`]): a capture that fails keeps everything the tracker had
//! already handed over (written pages, ranges it armed or could not scan, the private
//! directories' last walk) and the next checkpoint carries it, so the chain stays intact. A
//! failure after the hook ran (resuming, or hashing a newly mapped file after the resume) also
//! gives up the number N: it is never produced, and the next checkpoint is N+1 on base N−1.
//! The process exiting or being killed is reported as [`ChainState::ServiceGone`].
//!
//! The loop runs on its own thread, chroot'ed into the process's root (see
//! [`crate::procfs::in_view`]); [`Epochs`] talks to it over channels, so the hand-offs are
//! outside the pause.

use crate::budget::{Budget, Rule, Watch};
use crate::capture::{
    self, CaptureError, MetaCache, copy_ranges, describe_vmas, proc_err, trackable,
};
use crate::delta::{Codec, PageCodec, PageEncoding, TwinStore};
use crate::files::{DirTracker, FileChanges};
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
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

mod config;
mod cycle;
mod encode;
mod first;
mod handle;
mod members;
mod pause;
mod precopy;
mod trigger;

pub use config::*;
use first::*;
pub use handle::Epochs;
use handle::*;
use pause::*;
pub use trigger::*;

use crate::os::ranges::{PAGE, coalesce, gaps, merge, subtract_any};

/// What one epoch produced ([`Epochs::next_output`]).
#[derive(Debug)]
pub struct EpochOutput {
    /// Checkpoint N, incremental on the previous one (`Kind::Incremental { base }`).
    pub incremental: Checkpoint,
    /// A full checkpoint of the same state N, when one was requested ([`Epochs::request_full`]).
    pub full: Option<Checkpoint>,
    pub stats: EpochStats,
}

/// What a failure means for the chain of checkpoints ([`EpochError::chain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainState {
    /// Nothing was lost: the next [`Epochs::next`] continues the chain (what this epoch took is
    /// carried into the next checkpoint). The cause may persist (an unsupported resource, say),
    /// in which case the next call fails the same way.
    Intact,
    /// This loop cannot continue the chain: its thread is gone (or `start` failed), so there is
    /// no loop left to carry anything or to take a full checkpoint with [`Epochs::request_full`];
    /// or the service's process tree is no longer the one the chain began with (a process
    /// appeared or exited: [`CaptureError::TreeChanged`], every later epoch fails the same
    /// way). A new loop ([`Epochs::start`], with its own full checkpoint) is needed before any
    /// backup can continue. Otherwise the running loop never breaks the chain (see the module
    /// doc).
    Broken,
    /// The service exited or was killed (its process is gone, or only a zombie is left).
    ServiceGone,
}

/// Why the loop failed. [`EpochError::chain`] says what it means for the chain.
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
    /// The service's process exited or was killed; the message is what failed because of it.
    #[error("the service is gone (exited or killed): {0}")]
    ServiceGone(String),
}

impl EpochError {
    /// Whether the chain survives this failure (for errors of `next`, `next_held` and
    /// `next_output`; an error of `start` means there is no loop).
    pub fn chain(&self) -> ChainState {
        match self {
            EpochError::ServiceGone(_) => ChainState::ServiceGone,
            EpochError::Gone(_) | EpochError::Capture(CaptureError::TreeChanged(_)) => {
                ChainState::Broken
            }
            _ => ChainState::Intact,
        }
    }
}

type Result<T> = std::result::Result<T, EpochError>;

/// Code the loop runs at fixed points of each epoch ([`Epochs::start_with`]).
#[derive(Default)]
pub struct EpochHooks {
    /// Called with N inside every pause that produces checkpoint N (epoch 0's full checkpoint
    /// included): all threads stopped, the capture done, before the resume. Called exactly once
    /// per number, in increasing order, never for a pause whose capture failed (a retried
    /// pause included). A packet the service sent before this call belongs to an epoch ≤ N.
    ///
    /// It lengthens the pause: keep it to something like an atomic store (the network gate's
    /// `mark(N)`). It runs on the epoch thread, whose root directory is the service's (paths
    /// resolve as the service sees them), and must not block on the caller of [`Epochs`].
    /// Rarely a number is given to the hook and then never produced (a failure after the
    /// hook: see the module doc); the next checkpoint then has a higher number.
    pub on_pause: Option<Box<dyn FnMut(u64) + Send>>,
}

impl EpochHooks {
    /// Hooks with just [`EpochHooks::on_pause`].
    pub fn on_pause(f: impl FnMut(u64) + Send + 'static) -> EpochHooks {
        EpochHooks {
            on_pause: Some(Box::new(f)),
        }
    }
}

impl std::fmt::Debug for EpochHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochHooks")
            .field("on_pause", &self.on_pause.is_some())
            .finish()
    }
}

/// Test support: make the next epoch fail at a point (hidden; see [`Epochs::fail_next`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPoint {
    /// Inside the pause, right after the tracker handed over the written pages.
    AfterScan,
    /// Inside the pause, after the copy and the private directories' walk (before the hook).
    AfterCopy,
    /// After the hook and the resume, before the encoding (as a failure to hash a file would).
    AfterResume,
}

/// Whether the process behind `pidfd` has exited: its every thread is gone (a zombie leader
/// with live threads is still running). Precise, and immune to PID reuse.
fn exited(pidfd: &OwnedFd) -> bool {
    exited_within(pidfd, Duration::ZERO)
}

/// [`exited`], or does so within `timeout`.
fn exited_within(pidfd: &OwnedFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd; the kernel writes only `revents`.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    r > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0
}

/// The loop's state, owned by the epoch thread: one process's (its tracker, caches, twins,
/// ...) and, for a process tree, one more of these per other process ([`EpochLoop::members`]).
struct EpochLoop {
    proc: Proc,
    cfg: EpochConfig,
    /// The last checkpoint's metadata: the next one leaves out what did not change.
    meta_carry: tardi_image::store::MetaCarry,
    tracker: Box<dyn Tracker>,
    /// Mappings armed for tracking, as (start, end).
    armed: Vec<(u64, u64)>,
    prev_maps: Vec<MapEntry>,
    /// The layout-call count ([`crate::syscount::LAYOUT_CALLS`]) at the end of the last
    /// capture, and the copied-on-write pages of private file mappings then (sorted): both
    /// carried to the next pause when the count has not moved (see `capture`).
    layout_seen: Option<u64>,
    prev_cow: Vec<u64>,
    /// The divergence check's cadence (the main process's loop only), and the pages this
    /// pause digested, until its checkpoint takes them.
    scrubber: Option<crate::scrub::Scrubber>,
    scrub_pages: Option<Vec<tardi_image::scrub::PageDigest>>,
    /// This process's TCP connections, read in every pause (each process of a tree by its own
    /// loop, which remembers them to skip those that did not move).
    tcp: crate::tcp::Connections,
    /// Periodic full reads that found a layout change no call was counted for.
    layout_missed: u64,
    /// `/proc/PID/maps`, open for `PROCMAP_QUERY` (stacks growing down).
    maps_file: Option<std::fs::File>,
    cache: MetaCache,
    /// One set of codec contexts per encode worker.
    codecs: Vec<PageCodec>,
    twins: TwinStore,
    /// Pages written in the last epoch with the number of epochs in a row they were, and the
    /// hot pages; both in address order.
    streak: Vec<(u64, u32)>,
    hot: Vec<u64>,
    /// What "has contents of its own" means here (see [`crate::track::has_contents`]).
    contents: u64,
    /// Identified mapped files by (path, inode).
    file_refs: HashMap<(String, u64), FileRef>,
    /// Hot pages found identical to their twin: cold from the next pause on.
    cool: HashSet<u64>,
    /// Memory that held no twin after the last checkpoint (unmapped, or private file pages
    /// not copied on write), merged and sorted.
    void: Vec<(u64, u64)>,
    /// The last number given to a pause (to the hook): the next pause gets the one after.
    epoch: u64,
    /// The last checkpoint produced: the base of the next one (below `epoch` after a failure
    /// that came after the hook).
    base: u64,
    last_resume: Instant,
    rng: u64,
    buf: Vec<u8>,
    dirs: DirTracker,
    /// Shared memory objects, compared by content every pause (see `crate::shm`).
    shm: crate::shm::ShmTracker,
    /// Pages taken (and protected again) by the pre-copy and not yet part of a checkpoint.
    pre: Option<Precopy>,
    /// Pages the last captured epoch wrote: the pre-copy's predictor.
    last_dirty: u64,
    prebuf: Vec<u8>,
    /// What failed pauses took from the tracker: the next checkpoint carries it.
    carry: Carry,
    hook: Option<Box<dyn FnMut(u64) + Send>>,
    trigger: Trigger,
    /// The answers the last wait saw ([`EpochStats::answers`]), for the next checkpoint.
    answers: Option<Answers>,
    /// The service's pidfd (see [`exited`]).
    pidfd: OwnedFd,
    /// Test support: fail the next epoch here.
    fail: Option<FailPoint>,
    /// A process tree: the other processes, parents before their children, each with its own
    /// state (whose hook, trigger and failure point are unused: the main process's loop drives
    /// every pause). Empty for a single process, which pays nothing for it.
    members: Vec<TreeMember>,
    /// A tree: the open file descriptions its processes shared at the last pause that looked
    /// them up, kept while no process made a descriptor call since (see `capture_tree`).
    shared_groups: Option<Vec<crate::tree::FileGroup>>,
    /// The process's PID in the sandbox.
    ns_pid: i32,
    /// `/proc/PID/pagemap` as opened at this loop's first pause: tells whether the process ran
    /// `execve` since ([`crate::track::mm_gone`]).
    mm_probe: Option<std::fs::File>,
    /// The main process's loop: the tree's zombies at the last pause (children that exited
    /// and were not reaped), listed by every checkpoint; while there are any, every pause looks
    /// at the tree again (a zombie reaped changes no call count).
    zombies: Vec<Zombie>,
    /// The chain cannot go on (the tree changed in a way the loop cannot follow): every later
    /// epoch fails with this ([`CaptureError::TreeChanged`]).
    broken: Option<String>,
    /// The last look at the tree failed (or was cut short): the next pause looks again.
    relook: bool,
    /// The main process's group and session as the last look at the tree read them, for the
    /// next checkpoint (a single process's checkpoints leave them out: its restore keeps what
    /// the sandbox gives it; once it has children they must be recreated).
    root_ids: Option<(i32, i32)>,
}

/// A process of a tree other than the main one, in the epoch loop.
struct TreeMember {
    /// Its PID and its parent's in the sandbox.
    pid: i32,
    ppid: i32,
    lp: EpochLoop,
    /// Captured whole in this pause (it appeared since the last one, ran `execve`, or its last
    /// whole capture went into no checkpoint): this checkpoint holds it whole, a *fresh*
    /// member. One left from a pause that produced no checkpoint is stale: the next pause
    /// captures the process whole again ([`EpochLoop::retree`]).
    fresh: Option<FreshImage>,
}

/// A process captured whole by its first pause (see [`first_capture`]), until a checkpoint
/// holds it.
struct FreshImage {
    image: ProcessImage,
    data: Vec<u8>,
    files: Vec<capture::PendingFile>,
    exe: Option<capture::PendingFile>,
}

impl FreshImage {
    /// After the pause: names the mapped files and the executable (it fails if one cannot be
    /// read) and drops the all-zero pages. Once only: later calls change nothing.
    fn identify(&mut self, proc: &Proc) -> std::result::Result<(), CaptureError> {
        let Some(exe) = self.exe.take() else {
            return Ok(());
        };
        self.image.files = std::mem::take(&mut self.files)
            .into_iter()
            .map(|f| f.identify(proc))
            .collect::<std::result::Result<_, _>>()?;
        self.image.exe = exe.identify(proc)?;
        capture::drop_zero_pages(&mut self.image, &mut self.data);
        Ok(())
    }
}

/// What a pause took from the tracker (the tracker will not report it again) and no delivered
/// checkpoint holds yet. Built up during a pause (its journal); if the pause or its finish
/// fails, it joins [`EpochLoop::carry`], which the next pause takes as input: its pages are
/// copied as written pages, its ranges captured whole (as fresh ones).
#[derive(Debug, Default)]
struct Carry {
    /// Page regions (start, end) written since the last delivered checkpoint.
    pages: Vec<(u64, u64)>,
    /// Ranges whose tracking state is unknown or new (freshly armed, or scanned part-way).
    ranges: Vec<(u64, u64)>,
    /// The private directories were walked: their tracker must forget that walk.
    walked: bool,
    /// The shared memory objects were compared: their tracker must forget that capture.
    shm: bool,
}

impl Carry {
    fn absorb(&mut self, j: Carry) {
        self.pages.extend(j.pages);
        self.ranges.extend(j.ranges);
        self.pages = merge(std::mem::take(&mut self.pages));
        self.ranges = merge(std::mem::take(&mut self.ranges));
    }
}

/// What a pre-copy took: written pages with the offset of their contents in `data` (`None`:
/// its copy failed: the pause must copy the page).
#[derive(Default)]
struct Precopy {
    pages: Vec<(u64, Option<usize>)>,
    data: Vec<u8>,
    /// Armed ranges whose scan failed part-way (see `capture`).
    stale: Vec<(u64, u64)>,
    took: Duration,
}

/// Resumes the processes of a tree stopped in `sts` (parents first): children first, so that no
/// parent runs while a child it might signal is still held. Returns when the last thread was
/// released (`Stopped::resume_at`: the first process's leader), or the first error.
fn resume_all(sts: Vec<Stopped>) -> std::result::Result<Instant, crate::ptrace::PtraceError> {
    let mut resumed = Ok(Instant::now());
    for st in sts.into_iter().rev() {
        let r = st.resume_at();
        if resumed.is_ok() {
            resumed = r;
        }
    }
    resumed
}

/// A pause's length: from `t0` to the release of its last thread, or to now if the resume
/// failed. The service runs from that release even if the call that made it returns later.
fn pause_since(
    t0: Instant,
    resumed: &std::result::Result<Instant, crate::ptrace::PtraceError>,
) -> Duration {
    match resumed {
        Ok(released) => released.duration_since(t0),
        Err(_) => t0.elapsed(),
    }
}

impl EpochLoop {
    /// Removes write tracking (the processes keep running untracked).
    fn disarm(&mut self) {
        self.tracker.release(&self.proc, &self.armed);
        for m in &mut self.members {
            m.lp.disarm();
        }
    }
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

/// The mapping of `maps` (sorted, disjoint: a layout) holding `a`.
fn mapping_at(maps: &[MapEntry], a: u64) -> Option<&MapEntry> {
    let i = maps.partition_point(|m| m.end <= a);
    maps.get(i).filter(|m| m.start <= a)
}

/// Spans of consecutive private file mappings of `maps` (sorted; unmapped gaps between them
/// are joined, any other mapping ends a span): one copied-on-write scan per span instead of
/// one per mapping. Exact, as a span holds no memory but those mappings' pages.
fn file_spans(maps: &[MapEntry]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut open = false;
    for m in maps {
        if trackable(m) && capture::is_file_backed(m) {
            match out.last_mut() {
                Some(l) if open => l.1 = m.end,
                _ => out.push((m.start, m.end)),
            }
            open = true;
        } else {
            open = false;
        }
    }
    out
}

/// `ESRCH` from a call on the service means it is gone.
fn gone_or(pid: Pid, e: std::io::Error) -> EpochError {
    if e.raw_os_error() == Some(libc::ESRCH) {
        EpochError::ServiceGone(format!("process {pid}: {e}"))
    } else {
        CaptureError::Proc {
            pid,
            what: "pidfd".into(),
            source: e,
        }
        .into()
    }
}
