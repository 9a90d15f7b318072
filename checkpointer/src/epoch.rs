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

const PAGE: u64 = 4096;

/// [`EpochConfig::encode_budget`]'s default.
pub const DEFAULT_ENCODE_BUDGET: u32 = 0;

/// How epochs are scheduled and encoded.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EpochConfig {
    /// Target length of an epoch, from one resume to the next stop.
    pub interval: Duration,
    /// No epoch ends earlier than this, even when capped.
    pub min_interval: Duration,
    /// End the epoch early once this many pages are dirty (0: never).
    pub cap_pages: u64,
    /// A page written in this many consecutive epochs becomes hot (0: no hot pages): left
    /// writable by a tracker for which that pays (the mprotect tracker; see the module doc).
    /// No effect under userfaultfd.
    pub hot_epochs: u32,
    /// A hot page turns cold with probability 1/`cold_one_in` each epoch (Tardigrade: 16).
    pub cold_one_in: u32,
    pub codec: Codec,
    /// Memory for twins (last sent contents of recently written pages), bytes.
    pub twin_budget: usize,
    /// Re-read every value cached between epochs (the layout, signal actions, sigaltstacks,
    /// descriptors, ...) every this many epochs (0: only at the start): a check that catches a
    /// change no counted call announced. The values are read in ten groups at offsets spread
    /// over the period ([`capture::Refresh::staggered`]), one group per pause, so the check adds
    /// to ten pauses a little each rather than to one pause a lot (1.9 ms against 0.5 ms at
    /// 1,000 dirty pages when all were read in the same pause).
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
    /// Pre-copy only when the previous epoch wrote at least this many pages (0: always). A
    /// pre-copy runs after the epoch's end is decided, so it delays the pause, and the replies
    /// waiting for it, by its scan and copy (~2.7 µs a page on Redis, ~200 µs at 70 pages,
    /// against ~0.3 µs a page copied inside the pause): it pays only when the pause would copy
    /// many pages. See docs/BENCHMARKS.md ("Checkpoint path").
    pub precopy_min_pages: u64,
    /// End on output sooner when the clients of the last release have answered: once the
    /// output of the epochs before the open one is released ([`Trigger::released`]) and this
    /// epoch has queued at least as many output packets as that release sent
    /// ([`Trigger::output`]), the epoch ends at [`EpochConfig::follow_min`] after the resume
    /// instead of [`EpochConfig::min_interval`]. See the module doc.
    pub follow_releases: bool,
    /// See [`EpochConfig::follow_releases`].
    pub follow_min: Duration,
    /// With [`EpochConfig::follow_releases`], while the clients of the last release have not
    /// all answered: waiting output ends the epoch no sooner than this long after that release,
    /// when it came during the epoch (besides [`EpochConfig::min_interval`] after the resume).
    /// The answers to a release only start with it, and it comes later on a slower machine: a
    /// minimum counted from the resume alone then ends epochs before the clients answered,
    /// and the latecomers wait a whole cycle more. Zero (the default): off.
    pub after_release: Duration,
    /// The encoding after each resume yields to the service (the thread at nice
    /// [`crate::budget::BACKGROUND_NICE`]) for up to this many intervals after the resume, then
    /// finishes at normal priority; 0 (the default): it runs at normal priority throughout. Either way the next epoch does not end before the encoding
    /// has finished: a slow encoding lengthens it (backpressure,
    /// [`EpochStats::encode_late_us`]) rather than queueing. The pause keeps its priority. See
    /// [`crate::budget`] and docs/BENCHMARKS.md ("Checkpoint path").
    pub encode_budget: u32,
    /// Test support: the pre-copy waits this long, half between taking the written pages
    /// (which protects them again) and copying them, half after the copy, so that the service
    /// writes pages the pre-copy has taken and not yet copied, and pages it has copied, before
    /// the pause. Zero (the default) outside tests.
    #[doc(hidden)]
    pub precopy_stall: Duration,
    /// The divergence check (see [`crate::scrub`]): now and then a pause digests a slice of
    /// the process's memory and its carried metadata into its checkpoint. `None`: never.
    pub scrub: Option<crate::scrub::ScrubConfig>,
}

impl EpochConfig {
    /// The configuration of a tree's other processes: no private directories (the main
    /// process's loop walks them for the whole tree).
    fn for_member(&self) -> EpochConfig {
        EpochConfig {
            private_dirs: Vec::new(),
            // (Not covered yet: see `tardi_image::scrub`.)
            scrub: None,
            ..self.clone()
        }
    }
}

impl Default for EpochConfig {
    fn default() -> Self {
        EpochConfig {
            interval: Duration::from_millis(10),
            min_interval: Duration::from_millis(1),
            cap_pages: 4000,
            hot_epochs: 3,
            cold_one_in: 16,
            codec: Codec::XorRuns,
            twin_budget: 64 << 20,
            refresh_every: 100,
            encode_workers: 1,
            private_dirs: Vec::new(),
            tracker: TrackerKind::Uffd,
            precopy: true,
            precopy_min_pages: 256,
            follow_releases: false,
            follow_min: Duration::from_micros(100),
            after_release: Duration::ZERO,
            encode_budget: DEFAULT_ENCODE_BUDGET,
            precopy_stall: Duration::ZERO,
            scrub: None,
        }
    }
}

/// Why an epoch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum EndedBy {
    /// [`EpochConfig::interval`] passed (also epoch 0, which does not wait).
    #[default]
    Interval,
    /// The dirty pages reached [`EpochConfig::cap_pages`].
    Cap,
    /// Output was waiting ([`Trigger::set`]).
    Output,
}

/// What one epoch cost and produced.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EpochStats {
    pub epoch: u64,
    /// Processes the checkpoint lists (1 for a single process), and how many of them it holds
    /// whole because they appeared or ran `execve` since the last one (a tree's step 2).
    pub processes: u64,
    pub whole_processes: u64,
    /// When the service was resumed after this epoch's pause (for timing what follows: the
    /// checkpoint's way to the backups and back).
    #[serde(skip)]
    pub resumed_at: Option<Instant>,
    /// From the previous resume to this stop.
    pub interval_us: u64,
    /// From the stop request to the release of the last thread (the clock read right before
    /// the call that detaches it: the service runs from then, even if that call returns later;
    /// see `Stopped::resume_at`).
    pub pause_us: u64,
    /// CPU time the epoch thread used from the stop request to the return of the resume:
    /// against `pause_us`, how much of the pause was the loop working and how much it waited
    /// for a CPU (on a CPU shared with the service, its threads not stopped yet, or already
    /// released, run meanwhile).
    pub pause_cpu_us: u64,
    pub quiesce_us: u64,
    /// Tracker scans and capture of new mappings' page lists (inside the pause).
    pub scan_us: u64,
    /// Copying pages (inside the pause).
    pub copy_us: u64,
    /// Parts of the rest of the pause (pause − quiesce − scan − copy): reading the layout;
    /// the state besides memory (checks and pending signals, threads, process-wide values,
    /// descriptors, the final pending-signal check); the private directories' walk; the
    /// resume.
    pub layout_us: u64,
    pub meta_checks_us: u64,
    pub meta_threads_us: u64,
    pub meta_process_us: u64,
    pub meta_fds_us: u64,
    pub meta_pending_us: u64,
    pub walk_us: u64,
    /// The detaches, until the last one returns: with the time a released thread ran before
    /// the loop got its CPU back, which [`EpochStats::pause_us`] leaves out.
    pub resume_us: u64,
    /// The descriptors were not read again: the process made no descriptor call since the
    /// last pause (counted by eBPF: see [`crate::syscount`]).
    pub fds_reused: bool,
    /// The layout (and the copied-on-write list) was carried from the last pause: the process
    /// made no layout call since (counted by eBPF: [`crate::syscount::LAYOUT_CALLS`]).
    pub layout_carried: bool,
    /// Periodic full reads so far that found a layout change no call was counted for (a
    /// missed change notification; expected 0).
    pub layout_missed: u64,
    /// Parts of `scan_us`: taking the written pages of the armed ranges; checking that the
    /// pre-copied pages are still there; hot-page bookkeeping (unprotecting them); the
    /// copied-on-write list of private file mappings.
    pub take_us: u64,
    pub precheck_us: u64,
    pub hot_us: u64,
    pub cow_us: u64,
    /// Opening the executable (while stopped); describing the mappings, opening their files
    /// and the tracker's commit (protections for the next epoch); the pause hook
    /// ([`EpochHooks::on_pause`]: the output gate's epoch boundary).
    pub exe_us: u64,
    pub commit_us: u64,
    pub hook_us: u64,
    /// The divergence check's pages read and digested in this pause (0: no check), and how
    /// long that took (part of the pause).
    pub scrub_pages: u64,
    pub scrub_us: u64,
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
    /// The epoch ended early at the dirty-page cap (`ended_by == EndedBy::Cap`).
    pub capped: bool,
    /// Why the epoch ended.
    pub ended_by: EndedBy,
    /// Pages copied by the pre-copy before the pause (counted in `dirty_pages` unless written
    /// again before the pause), and how long that took (not part of the pause).
    pub precopy_pages: u64,
    pub precopy_us: u64,
    /// A pre-copy ran before this pause (see [`EpochConfig::precopy_min_pages`]).
    pub precopy_ran: bool,
    /// Pages the pre-copy copied that were written again before the pause (or taken by a
    /// failed pause before it): the pause copied them again, and its copy is the checkpoint's.
    pub precopy_rewritten: u64,
    /// How long after the interval (from the resume) had passed this epoch's encoding ended,
    /// µs: the next epoch ends that much later than its interval (backpressure, see
    /// [`EpochConfig::encode_budget`]). 0: done in time.
    pub encode_late_us: u64,
    /// This epoch's encoding outlasted its budget and finished at normal priority.
    pub encode_overran: bool,
    /// Write faults the tracker counted itself this epoch: for the mprotect tracker, the pages
    /// its agent made writable (system-call buffers included). `None` for userfaultfd, whose
    /// faults the kernel resolves alone (they show in the process's minor-fault count).
    pub write_faults: Option<u64>,
    /// With a full checkpoint ([`Epochs::request_full`]): copying all memory and reading the
    /// private directories' whole tree for it (inside the pause, part of `pause_us`), and the
    /// full checkpoint's page bytes.
    pub full_copy_us: u64,
    pub full_bytes: u64,
    /// With [`EpochConfig::follow_releases`]: the answers this epoch waited for.
    pub answers: Option<Answers>,
}

/// What the loop knew of the open epoch's output when it ended it (times in µs from the
/// resume that opened it): the cycle a replicated reply waits, in parts. When the output of
/// the epochs before it was released (`None`: not during this epoch), when its first and last
/// output packet was queued (a first one before the release belongs to a client the release
/// did not answer), how many packets it queued and how many that release sent: the epoch ends
/// at [`EpochConfig::follow_min`] once `packets` reaches `release_packets`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Answers {
    pub release_us: Option<u64>,
    pub first_output_us: Option<u64>,
    pub last_output_us: Option<u64>,
    pub packets: u64,
    pub release_packets: u64,
}

impl EpochStats {
    /// Adds what another process of the tree contributed to this pause: its pages and bytes
    /// (the times are the pause's, shared); the layout and descriptors count as carried only
    /// if every process's were.
    fn add_member(&mut self, s: &EpochStats) {
        self.dirty_pages += s.dirty_pages;
        self.fresh_pages += s.fresh_pages;
        self.hot_pages += s.hot_pages;
        self.raw_bytes += s.raw_bytes;
        self.encoded_bytes += s.encoded_bytes;
        self.zero_pages += s.zero_pages;
        self.same_pages += s.same_pages;
        self.delta_pages += s.delta_pages;
        self.compressed_pages += s.compressed_pages;
        self.raw_pages += s.raw_pages;
        self.twin_bytes += s.twin_bytes;
        self.precopy_pages += s.precopy_pages;
        self.precopy_rewritten += s.precopy_rewritten;
        self.full_bytes += s.full_bytes;
        self.layout_carried &= s.layout_carried;
        self.fds_reused &= s.fds_reused;
        self.processes += s.processes;
        self.whole_processes += s.whole_processes;
    }
}

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

/// Wakes the epoch loop when output is waiting: the epoch then ends as soon as
/// [`EpochConfig::min_interval`] allows instead of at [`EpochConfig::interval`]. A clone of the
/// loop's own ([`Epochs::trigger`]); cheap to clone and to set from any thread.
///
/// The loop clears it inside the pause, just before [`EpochHooks::on_pause`] runs: a `set`
/// that follows `on_pause(N)` ends epoch N+1 early. Setting it for every packet is fine (a lock
/// and a notify); once per epoch, for the first packet queued after the mark, is enough.
#[derive(Clone, Default)]
pub struct Trigger(Arc<(Mutex<TriggerState>, Condvar)>);

#[derive(Default)]
struct TriggerState {
    /// Output is waiting since the last pause.
    output: bool,
    /// Output packets queued since the last pause ([`Trigger::output`]).
    packets: u64,
    /// The last epoch whose output was released, and how many packets that release sent
    /// ([`Trigger::released`]).
    released: Option<(u64, u64)>,
    /// When that release was reported, and when the first and the last output packet were
    /// queued since the last pause (for [`Answers`]).
    released_at: Option<Instant>,
    first_output: Option<Instant>,
    last_output: Option<Instant>,
}

impl std::fmt::Debug for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Trigger").field(&self.is_set()).finish()
    }
}

impl Trigger {
    /// Output is waiting: end the current epoch early.
    pub fn set(&self) {
        self.output(0);
    }

    /// `packets` more output packets were queued: output is waiting ([`Trigger::set`]), and
    /// they count towards [`EpochConfig::follow_releases`].
    pub fn output(&self, packets: u64) {
        let mut st = self.state();
        st.output = true;
        st.packets += packets;
        let now = Instant::now();
        st.first_output.get_or_insert(now);
        st.last_output = Some(now);
        drop(st);
        self.0.1.notify_all();
    }

    /// The output of every epoch up to `epoch` has been released, `packets` packets with this
    /// release (see [`EpochConfig::follow_releases`]). A lower number than before changes
    /// nothing.
    pub fn released(&self, epoch: u64, packets: u64) {
        let mut st = self.state();
        if st.released.is_none_or(|(e, _)| epoch > e) {
            st.released = Some((epoch, packets));
            st.released_at = Some(Instant::now());
            drop(st);
            self.0.1.notify_all();
        }
    }

    /// Whether output is waiting since the last pause.
    pub fn is_set(&self) -> bool {
        self.state().output
    }

    /// When the output up to `epoch` was released, if it was.
    fn released_at(&self, epoch: u64) -> Option<Instant> {
        let st = self.state();
        st.released.filter(|&(e, _)| e >= epoch).and(st.released_at)
    }

    /// Whether the output up to `epoch` is released and this epoch has queued at least as many
    /// packets as that release sent: the clients it answered have answered again. (Public, with
    /// [`Trigger::clear`] and [`Trigger::wait_news`], for a loop of one's own that follows the
    /// same rule: `bench/replication.sh floor`.)
    pub fn answered(&self, epoch: u64) -> bool {
        let st = self.state();
        st.output
            && st
                .released
                .is_some_and(|(e, n)| e >= epoch && st.packets >= n)
    }

    /// The open epoch's [`Answers`], which the resume at `resumed` after checkpoint `epoch`
    /// opened.
    fn answers(&self, epoch: u64, resumed: Instant) -> Answers {
        let st = self.state();
        let since = |t: Option<Instant>| {
            t.filter(|&t| t >= resumed)
                .map(|t| t.duration_since(resumed).as_micros() as u64)
        };
        let this = st.released.filter(|&(e, _)| e >= epoch);
        Answers {
            release_us: this.and(since(st.released_at)),
            first_output_us: since(st.first_output),
            last_output_us: since(st.last_output),
            packets: st.packets,
            release_packets: this.map_or(0, |(_, n)| n),
        }
    }

    /// Forgets the output since the last boundary (the loop calls it inside the pause).
    pub fn clear(&self) {
        let mut st = self.state();
        st.output = false;
        st.packets = 0;
        st.first_output = None;
        st.last_output = None;
    }

    /// Waits until set, at most `timeout`.
    fn wait(&self, timeout: Duration) {
        let g = self.state();
        // (A poisoned lock only means a setter panicked; the state is still plain data.)
        let _ = self.0.1.wait_timeout_while(g, timeout, |st| !st.output);
    }

    /// Waits for any news (output, a release), at most `timeout`.
    pub fn wait_news(&self, timeout: Duration) {
        let g = self.state();
        let _ = self.0.1.wait_timeout(g, timeout);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TriggerState> {
        self.0.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

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

enum Cmd {
    Next { hold: bool, full: bool },
    Release,
    Fail(FailPoint),
    Stop,
}

type Reply = Result<EpochOutput>;

/// A running epoch loop on one process (host PID) and its descendants, if it has any (a
/// process tree: see `docs/PROCESS-TREES.md`). Drop or [`Epochs::stop`] ends it and removes
/// write tracking from every process.
pub struct Epochs {
    tx: mpsc::Sender<Cmd>,
    rx: mpsc::Receiver<Reply>,
    thread: Option<std::thread::JoinHandle<()>>,
    held: bool,
    trigger: Trigger,
    full_requested: bool,
    /// The service's pidfd: tells a loop that died with its service from one that broke.
    pidfd: Option<OwnedFd>,
}

impl Epochs {
    /// Arms tracking and takes the full checkpoint (epoch 0) in one pause.
    pub fn start(pid: Pid, cfg: EpochConfig) -> Result<(Epochs, Checkpoint, EpochStats)> {
        Self::start_with(pid, cfg, EpochHooks::default())
    }

    /// [`Epochs::start`] with hooks (see [`EpochHooks`]); `on_pause` is called with 0 inside
    /// this first pause already.
    pub fn start_with(
        pid: Pid,
        cfg: EpochConfig,
        hooks: EpochHooks,
    ) -> Result<(Epochs, Checkpoint, EpochStats)> {
        let (ep, first) = Self::launch(pid, cfg, hooks, true)?;
        Ok((ep, first.incremental, first.stats))
    }

    /// Like [`Epochs::start_with`], but the first pause only arms tracking: no memory is copied
    /// and no checkpoint 0 exists. Epoch 1's incremental checkpoint then continues a state no
    /// one holds; a backup can follow this loop only from a full checkpoint taken later
    /// ([`Epochs::request_full`]). For a service that has no backup yet (a primary that just
    /// took over alone), this keeps a copy of all memory out of the first pause.
    pub fn start_tracking(
        pid: Pid,
        cfg: EpochConfig,
        hooks: EpochHooks,
    ) -> Result<(Epochs, EpochStats)> {
        let (ep, first) = Self::launch(pid, cfg, hooks, false)?;
        Ok((ep, first.stats))
    }

    fn launch(
        pid: Pid,
        cfg: EpochConfig,
        hooks: EpochHooks,
        copy: bool,
    ) -> Result<(Epochs, EpochOutput)> {
        let pidfd = match crate::sys::pidfd_open(pid) {
            Ok(fd) => Some(fd),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return Err(EpochError::ServiceGone(format!("process {pid}: {e}")));
            }
            Err(_) => None,
        };
        let trigger = Trigger::default();
        let loop_trigger = trigger.clone();
        let (tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (reply_tx, rx) = mpsc::channel::<Reply>();
        let thread = std::thread::Builder::new()
            .name("tardi-epochs".into())
            .spawn(move || {
                // The epoch's end is timed in tens of microseconds (the minimum interval after
                // output): without this, each sleep of this thread may last 50 µs longer (the
                // default timer slack of a thread).
                // SAFETY: PR_SET_TIMERSLACK takes a plain integer and touches no memory.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64, 0u64, 0u64, 0u64) };
                let err_tx = reply_tx.clone();
                let r = in_view(pid, move |proc| {
                    let (mut lp, first) =
                        match EpochLoop::start(proc, cfg, hooks, loop_trigger, copy) {
                            Ok(v) => v,
                            Err(e) => {
                                let _ = reply_tx.send(Err(e));
                                return;
                            }
                        };
                    let _ = reply_tx.send(Ok(first));
                    while let Ok(cmd) = cmd_rx.recv() {
                        match cmd {
                            Cmd::Next { hold, full } => {
                                let r = lp.next(hold, full, &reply_tx, &cmd_rx);
                                if let Some(r) = r {
                                    let _ = reply_tx.send(r);
                                }
                            }
                            Cmd::Fail(at) => lp.fail = Some(at),
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
        let mut ep = Epochs {
            tx,
            rx,
            thread: Some(thread),
            held: false,
            trigger,
            full_requested: false,
            pidfd,
        };
        let first = ep.recv()?;
        Ok((ep, first))
    }

    /// Waits for the epoch to end and returns its incremental checkpoint. A full checkpoint
    /// requested with [`Epochs::request_full`] is not taken here (the request stays pending
    /// for [`Epochs::next_output`]).
    // Not an Iterator: each call blocks for an epoch and can fail; `next` reads best here.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<(Checkpoint, EpochStats)> {
        self.run(false, false).map(|o| (o.incremental, o.stats))
    }

    /// Like [`Epochs::next`], but the process stays stopped, in exactly the state the returned
    /// checkpoint describes, until [`Epochs::release`] (or the next call).
    pub fn next_held(&mut self) -> Result<(Checkpoint, EpochStats)> {
        self.run(true, false).map(|o| (o.incremental, o.stats))
    }

    /// One epoch, with everything it produced: the incremental checkpoint, and the full one if
    /// [`Epochs::request_full`] asked for it. With `hold`, as [`Epochs::next_held`].
    pub fn next_output(&mut self, hold: bool) -> Result<EpochOutput> {
        let full = self.full_requested;
        let out = self.run(hold, full)?;
        if out.full.is_some() {
            self.full_requested = false;
        }
        Ok(out)
    }

    /// Asks for a full checkpoint with the next [`Epochs::next_output`] (say for a backup that
    /// joins): that epoch's pause produces both the usual incremental checkpoint N, so the
    /// backups that follow the chain go on, and a full checkpoint of the same state N, to which
    /// the incrementals after N apply as well. The request stays pending until an epoch
    /// produced it (a failed epoch does not consume it).
    ///
    /// All memory is copied inside that pause, so it is as long as a full checkpoint's
    /// (`EpochStats::full_copy_us`).
    pub fn request_full(&mut self) {
        self.full_requested = true;
    }

    /// The loop's [`Trigger`]: set it when output is waiting, to end the epoch early.
    pub fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }

    /// Test support: the next epoch fails at `at` (as a real failure there would).
    #[doc(hidden)]
    pub fn fail_next(&mut self, at: FailPoint) {
        self.release();
        let _ = self.tx.send(Cmd::Fail(at));
    }

    fn run(&mut self, hold: bool, full: bool) -> Result<EpochOutput> {
        self.release();
        if self.tx.send(Cmd::Next { hold, full }).is_err() {
            return Err(self.gone("the loop has ended".into()));
        }
        let r = self.recv();
        self.held = hold && r.is_ok();
        r
    }

    fn recv(&mut self) -> Reply {
        match self.rx.recv() {
            Ok(Err(EpochError::Gone(e))) => Err(self.gone(e)),
            Ok(r) => r,
            Err(e) => Err(self.gone(e.to_string())),
        }
    }

    /// The loop's thread is gone: because the service is, or not.
    fn gone(&self, why: String) -> EpochError {
        if self.pidfd.as_ref().is_some_and(exited) {
            EpochError::ServiceGone(why)
        } else {
            EpochError::Gone(why)
        }
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

/// What the first pause needs of a process, made before it (loading the call counter takes a
/// while).
struct FirstPrep {
    pagemap: std::fs::File,
    /// The same file (it pins the same address space), kept by the loop for
    /// [`crate::track::mm_gone`].
    probe: Option<std::fs::File>,
    buf: Vec<u8>,
    fd_calls: Option<crate::syscount::SyscallCounter>,
}

impl FirstPrep {
    fn new(proc: &Proc, copy: bool) -> std::result::Result<FirstPrep, CaptureError> {
        let pid = proc.pid;
        let pagemap = proc
            .open_file("pagemap", libc::O_RDONLY)
            .map_err(proc_err(pid, "pagemap"))?;
        // As for a one-shot full checkpoint: fault the copy buffer in before the pause.
        let buf = if copy {
            capture::prefaulted_buffer(capture::estimate_private_bytes(proc))
        } else {
            Vec::new()
        };
        // Before the pause (loading the program takes a while): without it, every pause
        // reads every descriptor.
        let fd_calls = crate::syscount::SyscallCounter::new(pid, &crate::syscount::CHANGE_GROUPS)
            .inspect_err(|e| tracing::debug!("descriptors read every pause: {e}"))
            .ok();
        Ok(FirstPrep {
            probe: pagemap.try_clone().ok(),
            pagemap,
            buf,
            fd_calls,
        })
    }
}

/// A process listed before the first pause, with what was prepared for it then (`pidfd`: a
/// member's, `None` for the main process).
struct Listed {
    proc: Proc,
    prep: FirstPrep,
    pidfd: Option<OwnedFd>,
}

/// The processes, parents' indexes, preparations and members' pidfds of a tree as
/// [`crate::tree::stop_all`] found it: the first pause's tree.
type Adopted = (Vec<Proc>, Vec<usize>, Vec<FirstPrep>, Vec<OwnedFd>);

/// The first pause's tree: the one `stop_all` stopped (`found`: the members, each with its
/// parent's index; the main process is `listed[0]`), which differs from the one listed before
/// the stop when a process forked or exited in between. Starting over until a listing and a
/// stop agree need not end while a service forks a process per connection (PostgreSQL under
/// short connections: a backend every few milliseconds); adopting what was stopped always does.
///
/// A listed process that is still there keeps what was prepared for it: it is the same process
/// when its pidfd (opened at the listing) has not reported an exit, since a PID is not reused
/// before its process exits. One that appeared (or whose PID now names another process) is
/// prepared now, while it is stopped, as a process that appears between two later pauses is
/// ([`EpochLoop::first_member`]). Listed processes that exited are dropped.
fn adopt_stopped(
    listed: Vec<Listed>,
    found: Vec<(Proc, usize)>,
    copy: bool,
) -> std::result::Result<Adopted, CaptureError> {
    let mut listed = listed.into_iter();
    let root = listed.next().expect("the main process is always listed");
    let mut old: HashMap<Pid, Listed> = listed
        .filter(|l| l.pidfd.as_ref().is_some_and(|fd| !exited(fd)))
        .map(|l| (l.proc.pid, l))
        .collect();
    let n = found.len() + 1;
    let (mut procs, mut parents, mut preps, mut fds) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n - 1),
    );
    procs.push(root.proc);
    parents.push(0);
    preps.push(root.prep);
    for (p, parent) in found {
        let (prep, fd) = match old.remove(&p.pid) {
            Some(l) => (l.prep, l.pidfd.expect("a member's pidfd")),
            None => {
                let prep = FirstPrep::new(&p, copy)?;
                let fd = crate::sys::pidfd_open(p.pid).map_err(|source| CaptureError::Proc {
                    pid: p.pid,
                    what: "pidfd".into(),
                    source,
                })?;
                (prep, fd)
            }
        };
        procs.push(p);
        parents.push(parent);
        preps.push(prep);
        fds.push(fd);
    }
    Ok((procs, parents, preps, fds))
}

/// What the first pause captured of one process: its tracking state and its image.
struct First {
    lp: FirstLoop,
    img: FreshImage,
}

/// The tracking state a process's first pause leaves (see [`EpochLoop::from_first`]).
struct FirstLoop {
    tracker: Box<dyn Tracker>,
    cache: MetaCache,
    maps: Vec<MapEntry>,
    armed: Vec<(u64, u64)>,
    dirs: DirTracker,
    shm: crate::shm::ShmTracker,
    probe: Option<std::fs::File>,
}

/// The first pause's work on one stopped process: arms tracking and, with `copy`, captures its
/// memory. `children`: its children (host PIDs, sorted), which the chain begins with.
/// `own_shm`: a single process, which captures its shared memory objects itself (those of a
/// tree are captured once for all its processes, by the caller: see [`EpochLoop::start`]).
/// `inherited`: a process that appeared in the tree (or is captured whole again), which
/// carries the mprotect tracker's agent already ([`MprotectTracker::adopt`]).
#[allow(clippy::too_many_arguments)]
fn first_capture(
    proc: &Proc,
    st: &mut Stopped,
    cfg: &EpochConfig,
    prep: FirstPrep,
    copy: bool,
    children: Vec<Pid>,
    own_shm: bool,
    inherited: bool,
) -> Result<First> {
    let pid = proc.pid;
    let FirstPrep {
        pagemap,
        probe,
        buf,
        fd_calls,
    } = prep;
    let maps = proc.smaps().map_err(proc_err(pid, "smaps"))?;
    let mut cache = MetaCache::default();
    cache.calls = fd_calls;
    cache.children = Some(children);
    let (mut tracker, maps): (Box<dyn Tracker>, _) = match cfg.tracker {
        TrackerKind::Uffd => (Box::new(UffdTracker::new(st, &maps, pagemap)?), maps),
        TrackerKind::Mprotect => {
            let mut t = if inherited {
                MprotectTracker::adopt(st, proc, &maps, pagemap)?
            } else {
                MprotectTracker::new(st, proc, &maps, pagemap)?
            };
            cache.own_filter = true;
            t.begin(st)?;
            // The agent's own mappings are new.
            let maps = t.layout(proc.smaps().map_err(proc_err(pid, "smaps"))?);
            (Box::new(t), maps)
        }
    };
    let mut meta = capture::capture_meta(proc, st, &maps, &mut cache, capture::Refresh::ALL)?;
    tracker.threads(&meta.threads, &maps);
    tracker.patch_image(&mut meta);
    let mut exe = capture::PendingFile::exe(&meta.exe.path);
    exe.open(proc)?;
    // The memory first: arming may split the kernel's mappings the capture names files by.
    // (The agent pages the commit writes are in the first incremental checkpoint.)
    let mut dirs = DirTracker::new(cfg.private_dirs.clone());
    let mut shm = crate::shm::ShmTracker::default();
    let ((mut image, mut data), files) = if copy {
        capture::full_memory(proc, &maps, meta, buf, own_shm.then_some(&mut shm))?
    } else {
        // Nothing copied; the objects' pages are known from here on all the same.
        if own_shm {
            shm.capture(proc, &maps, true, true, &mut Vec::new())?;
        }
        ((meta, Vec::new()), Vec::new())
    };
    // Walked either way: the tracker reports changes from this state on.
    let tree = dirs.changes_mapped(&maps).map_err(EpochError::Files)?;
    if copy {
        image.private_files = tree;
    }
    let mut armed = Vec::new();
    for m in maps.iter().filter(|m| trackable(m)) {
        tracker.arm(m.start, m.end)?;
        armed.push((m.start, m.end));
    }
    let touched = tracker.commit(st, &armed, &maps)?;
    if copy {
        // The mprotect tracker's commit writes its agent's control block, after the copy above:
        // those pages are copied again, so that the image is the memory the process resumes
        // with (the next checkpoint would carry them anyway, but a fresh member's image held at
        // this very pause would differ from the live process).
        for a in touched {
            let at = match image
                .runs
                .iter()
                .find(|r| r.addr <= a && a < r.addr + r.len)
            {
                Some(r) => (r.data_off + (a - r.addr)) as usize,
                None => {
                    image.runs.push(crate::image::PageRun {
                        addr: a,
                        len: PAGE,
                        data_off: data.len() as u64,
                    });
                    data.resize(data.len() + PAGE as usize, 0);
                    data.len() - PAGE as usize
                }
            };
            crate::sys::read_remote(pid, a, &mut data[at..at + PAGE as usize])
                .map_err(|e| gone_or(pid, e))?;
        }
    }
    Ok(First {
        lp: FirstLoop {
            tracker,
            cache,
            maps,
            armed,
            dirs,
            shm,
            probe,
        },
        img: FreshImage {
            image,
            data,
            files,
            exe: Some(exe),
        },
    })
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
    /// The first pause: arms tracking and, with `copy`, captures the full checkpoint 0 (without,
    /// the returned checkpoint has the metadata only, no memory: see [`Epochs::start_tracking`]).
    ///
    /// A process tree (`docs/PROCESS-TREES.md`) is listed before the pause (each process is
    /// prepared as the main one is) and again once stopped, top-down; the tree stopped is the
    /// one captured, a process that appeared in between prepared while stopped
    /// ([`adopt_stopped`]). Every process is captured in this one pause;
    /// the checkpoint lists the others as members of the main process's image, with the open
    /// file descriptions they share.
    fn start(
        root: &Proc,
        cfg: EpochConfig,
        hooks: EpochHooks,
        trigger: Trigger,
        copy: bool,
    ) -> Result<(EpochLoop, EpochOutput)> {
        let pid = root.pid;
        let pidfd = crate::sys::pidfd_open(pid).map_err(|e| gone_or(pid, e))?;
        let gone = |e: EpochError| {
            if exited(&pidfd) {
                EpochError::ServiceGone(e.to_string())
            } else {
                e
            }
        };
        let member_cfg = cfg.for_member();
        let mut hook = hooks.on_pause;
        let mut attempt = 0u32;
        let (sts, r, t0, quiesce, procs, parents, zombies, member_fds) = loop {
            // A process of the tree that exits while it is being stopped (a PostgreSQL backend
            // whose client left) makes its /proc unreadable: list the tree again. (The listing
            // leaves out what exits meanwhile.)
            let vanished = |e: &CaptureError| match e {
                CaptureError::Proc { pid: p, .. } => *p != pid,
                CaptureError::Ptrace(_) => !exited(&pidfd),
                _ => false,
            };
            let members_now = crate::tree::list_members(root).map_err(|e| gone(e.into()))?;
            let procs = std::iter::once(root.try_clone().map_err(|e| gone_or(pid, e))?)
                .chain(members_now.into_iter().map(|(p, _)| p));
            // What is prepared before the stop, per listed process: its preparation and (a
            // member's) pidfd. The members' pidfds are opened before the stop, while they are
            // alive: a member may exit as soon as the first pause resumes it (a PostgreSQL
            // backend whose client's query ended), and a pidfd opened after that fails with
            // ESRCH, which is not the service's death. One opened now outlives the process, and
            // the loop learns of the exit from it. A member that exits before it is prepared is
            // left out: the stop finds the tree as it is ([`adopt_stopped`]).
            let mut listed: Vec<Listed> = Vec::new();
            for p in procs {
                let is_root = p.pid == pid;
                let prep = FirstPrep::new(&p, copy).and_then(|prep| {
                    let fd = if is_root {
                        None
                    } else {
                        Some(crate::sys::pidfd_open(p.pid).map_err(|source| {
                            CaptureError::Proc {
                                pid: p.pid,
                                what: "pidfd".into(),
                                source,
                            }
                        })?)
                    };
                    Ok((prep, fd))
                });
                match prep {
                    Ok((prep, pidfd)) => listed.push(Listed {
                        proc: p,
                        prep,
                        pidfd,
                    }),
                    Err(_) if !is_root => {}
                    Err(e) => return Err(gone(e.into())),
                }
            }
            let t0 = Instant::now();
            let mut sts: Vec<Stopped> = Vec::with_capacity(listed.len());
            let mut found = Vec::new();
            // Zombies (children that exited and were not reaped) are read, not prepared: the
            // listing above skips them.
            let mut zombies = Vec::new();
            let stopped = crate::tree::stop_all(root, &mut found, &mut zombies, &mut sts);
            if let Err(e) = stopped {
                let _ = resume_all(sts);
                if vanished(&e) && attempt < 20 {
                    attempt += 1;
                    continue;
                }
                return Err(gone(e.into()));
            }
            if sts.iter().any(|s| s.tids.is_empty()) {
                let _ = resume_all(sts);
                return Err(EpochError::ServiceGone(format!(
                    "process {pid} (or one of its children) has no threads"
                )));
            }
            // The tree as stopped, each process with what was prepared for it (a process that
            // appeared since the listing is prepared now, stopped).
            let (procs, parents, preps, member_fds) = match adopt_stopped(listed, found, copy) {
                Ok(t) => t,
                Err(e) => {
                    let _ = resume_all(sts);
                    if vanished(&e) && attempt < 20 {
                        attempt += 1;
                        continue;
                    }
                    return Err(gone(e.into()));
                }
            };
            let quiesce = t0.elapsed();
            // Each process's children, zombies included (host PIDs, sorted): what the chain
            // begins with.
            let children = |i: usize| -> Vec<Pid> {
                let mut c: Vec<Pid> = (1..procs.len())
                    .filter(|&j| parents[j] == i)
                    .map(|j| procs[j].pid)
                    .chain(zombies.iter().filter(|z| z.1 == i).map(|z| z.2))
                    .collect();
                c.sort_unstable();
                c
            };
            let r = (|| -> Result<_> {
                let mut firsts = Vec::with_capacity(procs.len());
                let alone = procs.len() == 1;
                for (i, ((p, st), prep)) in procs.iter().zip(sts.iter_mut()).zip(preps).enumerate()
                {
                    let cfg = if i == 0 { &cfg } else { &member_cfg };
                    firsts.push(first_capture(
                        p,
                        st,
                        cfg,
                        prep,
                        copy,
                        children(i),
                        alone,
                        false,
                    )?);
                }
                // A tree's shared memory objects: each once, whichever processes map it, by the
                // main process's tracker, into its image and data (members' mappings name them,
                // as in a full checkpoint of a tree: `crate::tree`).
                if !alone {
                    let mut shm = std::mem::take(&mut firsts[0].lp.shm);
                    let mut data = std::mem::take(&mut firsts[0].img.data);
                    let each: Vec<(&Proc, &[MapEntry])> = procs
                        .iter()
                        .zip(&firsts)
                        .map(|(p, f)| (p, f.lp.maps.as_slice()))
                        .collect();
                    let objects = if copy {
                        shm.capture_of(&each, true, true, &mut data)?
                    } else {
                        shm.capture_of(&each, true, true, &mut Vec::new())?;
                        Vec::new()
                    };
                    drop(each);
                    let f = &mut firsts[0];
                    (f.lp.shm, f.img.data) = (shm, data);
                    f.img.image.shm = objects;
                }
                // A tree: the open file descriptions its processes share, and each process's
                // group and session (the single process keeps what its creator gave it; one
                // with a zombie child is a tree: the zombie's are checked against its own).
                let mut groups = Vec::new();
                if procs.len() > 1 {
                    let refs: Vec<&Proc> = procs.iter().collect();
                    groups = crate::tree::find_shared(&refs)?;
                }
                if procs.len() > 1 || !zombies.is_empty() {
                    for (p, f) in procs.iter().zip(firsts.iter_mut()) {
                        (f.img.image.pgid, f.img.image.sid) = capture::group_and_session(p)?;
                    }
                }
                Ok((firsts, groups))
            })();
            // A signal that kept arriving while the process was read (see
            // `capture::capture_meta`): resume, let it be delivered, and start over. Only with
            // the userfaultfd tracker, which has registered nothing by then (its descriptor is
            // ours alone, closed with it); the mprotect tracker's agent and filter are in the
            // process by then, so that start fails instead.
            if matches!(r, Err(EpochError::Capture(CaptureError::PendingSignals(_))))
                && matches!(cfg.tracker, TrackerKind::Uffd)
                && attempt < 20
            {
                attempt += 1;
                drop(r);
                let _ = resume_all(sts);
                std::thread::sleep(Duration::from_millis(u64::from(attempt)));
                continue;
            }
            break (sts, r, t0, quiesce, procs, parents, zombies, member_fds);
        };
        if r.is_ok() {
            trigger.clear();
            if let Some(h) = hook.as_mut() {
                h(0);
            }
        }
        let resumed = resume_all(sts);
        let pause = pause_since(t0, &resumed);
        let (firsts, groups) = r.map_err(gone)?;
        resumed
            .map_err(CaptureError::from)
            .map_err(|e| gone(e.into()))?;

        // After the pause: identify each process's files, then lay the tree out.
        let mut loops: Vec<EpochLoop> = Vec::with_capacity(procs.len());
        let mut images: Vec<(ProcessImage, Vec<u8>)> = Vec::with_capacity(procs.len());
        let mut member_fds = member_fds.into_iter();
        for (i, (proc, First { lp, mut img })) in procs.into_iter().zip(firsts).enumerate() {
            img.identify(&proc).map_err(|e| gone(e.into()))?;
            let lp_pidfd = if i == 0 {
                pidfd.try_clone().map_err(|e| gone_or(pid, e))?
            } else {
                member_fds
                    .next()
                    .expect("one pidfd per member, opened before the first stop")
            };
            let (cfg, hook, trigger) = if i == 0 {
                (cfg.clone(), hook.take(), trigger.clone())
            } else {
                (member_cfg.clone(), None, Trigger::default())
            };
            let ns_pid = img.image.pid;
            loops.push(EpochLoop::from_first(
                proc, ns_pid, lp, cfg, hook, trigger, lp_pidfd, 0,
            )?);
            images.push((img.image, img.data));
        }
        let mut it = images.into_iter();
        let (mut image, mut data) = it.next().expect("the main process is always captured");
        let mut pids = vec![image.pid];
        if it.len() > 0 {
            let mut rest: Vec<(ProcessImage, Vec<u8>)> = it.collect();
            let hosts: Vec<Pid> = loops.iter().map(|l| l.proc.pid).collect();
            let mut refs: Vec<&mut ProcessImage> = rest.iter_mut().map(|(i, _)| i).collect();
            crate::tree::share(&mut image, &mut refs, &hosts, groups)?;
            crate::tree::check_groups((image.pid, image.pgid, image.sid), None)?;
            for (k, ((img, d), parent)) in rest.into_iter().zip(&parents[1..]).enumerate() {
                let parent_img = if *parent == 0 {
                    &image
                } else {
                    &image.tree[*parent - 1].image
                };
                crate::tree::check_groups((img.pid, img.pgid, img.sid), Some(parent_img))?;
                loops[k + 1].meta_carry = tardi_image::store::MetaCarry::after(&img);
                image.tree.push(Member {
                    ppid: pids[*parent],
                    data_off: data.len() as u64,
                    data_len: d.len() as u64,
                    image: img,
                });
                pids.push(image.tree[k].image.pid);
                data.extend_from_slice(&d);
            }
        }
        for (mut z, parent, _) in zombies {
            z.ppid = pids[parent];
            let parent_img = if parent == 0 {
                &image
            } else {
                &image.tree[parent - 1].image
            };
            crate::tree::check_groups((z.pid, z.pgid, z.sid), Some(parent_img))?;
            image.zombies.push(z);
        }
        let stats = EpochStats {
            epoch: 0,
            processes: image.tree.len() as u64 + 1,
            whole_processes: image.tree.len() as u64 + 1,
            pause_us: pause.as_micros() as u64,
            quiesce_us: quiesce.as_micros() as u64,
            raw_bytes: data.len() as u64,
            encoded_bytes: data.len() as u64,
            ..Default::default()
        };
        let mut loops = loops.into_iter();
        let mut lp = loops.next().expect("the main process has a loop");
        lp.meta_carry = tardi_image::store::MetaCarry::after(&image);
        lp.zombies = image.zombies.clone();
        lp.members = loops
            .zip(image.tree.iter().map(|m| (m.image.pid, m.ppid)))
            .map(|(lp, (pid, ppid))| TreeMember {
                pid,
                ppid,
                lp,
                fresh: None,
            })
            .collect();
        let ck = Checkpoint::full(0, image, data);
        let out = EpochOutput {
            incremental: ck,
            full: None,
            stats,
        };
        Ok((lp, out))
    }

    /// The loop of one process after its first pause (`first`: the tracking state it left),
    /// whose checkpoint is `epoch`. Only the main process's loop has a hook and a trigger.
    #[allow(clippy::too_many_arguments)]
    fn from_first(
        proc: Proc,
        ns_pid: i32,
        first: FirstLoop,
        cfg: EpochConfig,
        hook: Option<Box<dyn FnMut(u64) + Send>>,
        trigger: Trigger,
        pidfd: OwnedFd,
        epoch: u64,
    ) -> Result<EpochLoop> {
        let FirstLoop {
            tracker,
            cache,
            maps,
            armed,
            dirs,
            shm,
            probe,
        } = first;
        let codec = PageCodec::new().map_err(|e| CaptureError::Unsupported(e.to_string()))?;
        let scrubber = cfg.scrub.map(crate::scrub::Scrubber::new);
        Ok(EpochLoop {
            twins: TwinStore::new(cfg.twin_budget),
            rng: 0x9E37_79B9_7F4A_7C15 ^ proc.pid as u64,
            maps_file: proc.open_file("maps", libc::O_RDONLY).ok(),
            proc,
            cfg,
            tracker,
            armed,
            prev_maps: maps,
            layout_seen: None,
            prev_cow: Vec::new(),
            scrubber,
            scrub_pages: None,
            layout_missed: 0,
            cache,
            codecs: vec![codec],
            streak: Vec::new(),
            hot: Vec::new(),
            file_refs: HashMap::new(),
            contents: crate::track::has_contents(),
            cool: HashSet::new(),
            void: Vec::new(),
            epoch,
            base: epoch,
            last_resume: Instant::now(),
            buf: Vec::new(),
            dirs,
            shm,
            pre: None,
            last_dirty: u64::MAX,
            prebuf: Vec::new(),
            carry: Carry::default(),
            hook,
            trigger,
            answers: None,
            pidfd,
            fail: None,
            meta_carry: Default::default(),
            members: Vec::new(),
            shared_groups: None,
            ns_pid,
            mm_probe: probe,
            zombies: Vec::new(),
            broken: None,
            relook: false,
            root_ids: None,
        })
    }

    fn random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The encoding's budget (see [`EpochConfig::encode_budget`]).
    fn budget_rule(&self) -> Rule {
        Rule {
            interval: self.cfg.interval,
            budget: self.cfg.encode_budget,
        }
    }

    /// Waits until the epoch should end (see the module doc), and says why it ended.
    fn wait(&mut self) -> EndedBy {
        let cap = self.cfg.cap_pages;
        let min = self.cfg.min_interval;
        loop {
            let now = Instant::now();
            let elapsed = now.duration_since(self.last_resume);
            if elapsed >= self.cfg.interval {
                return EndedBy::Interval;
            }
            let left = self.cfg.interval - elapsed;
            let output = self.trigger.is_set();
            let end = output.then(|| self.output_deadline());
            if end.is_some_and(|end| now >= end) {
                return EndedBy::Output;
            }
            if exited(&self.pidfd) {
                return EndedBy::Interval; // the stop reports it
            }
            if cap > 0 && elapsed >= min && self.count_written(cap) >= cap {
                return EndedBy::Cap;
            }
            if let Some(end) = end {
                let step = end.duration_since(now).min(left);
                if self.cfg.follow_releases {
                    // A release or more output can move the end earlier: wake up for them.
                    self.trigger.wait_news(step);
                } else {
                    std::thread::sleep(step);
                }
                continue;
            }
            // Each cap check scans every armed range: poll a few times per epoch, not more
            // (every 0.5 ms cost more than half of a busy service's system calls per epoch).
            let poll = (self.cfg.interval / 5).max(Duration::from_millis(1));
            let step = if cap > 0 {
                left.min(poll).max(min.saturating_sub(elapsed))
            } else {
                left
            };
            self.trigger.wait(step.min(left));
        }
    }

    /// Pages written since the last pause (by every process of a tree), counted up to `cap`.
    fn count_written(&mut self, cap: u64) -> u64 {
        let mut n = self.tracker.count_written(&self.armed, cap);
        for m in &mut self.members {
            if n >= cap {
                break;
            }
            n += m.lp.tracker.count_written(&m.lp.armed, cap - n);
        }
        n
    }

    /// When waiting output ends the open epoch: [`EpochConfig::min_interval`] after the resume
    /// (and, with [`EpochConfig::after_release`], no sooner than that after a release during
    /// the epoch), or [`EpochConfig::follow_min`] once the clients of the last release have
    /// answered ([`EpochConfig::follow_releases`]).
    fn output_deadline(&self) -> Instant {
        if !self.cfg.follow_releases {
            return self.last_resume + self.cfg.min_interval;
        }
        if self.trigger.answered(self.epoch) {
            return self.last_resume + self.cfg.follow_min.min(self.cfg.min_interval);
        }
        let by_resume = self.last_resume + self.cfg.min_interval;
        match self.trigger.released_at(self.epoch) {
            Some(t) if t > self.last_resume && !self.cfg.after_release.is_zero() => {
                by_resume.max(t + self.cfg.after_release)
            }
            _ => by_resume,
        }
    }

    /// Dirty-page pre-copy (see [`EpochConfig::precopy`]): takes the written pages of every
    /// armed range, which protects them again, and copies them while the service runs. A page
    /// written after that is reported again by the pause's scan and copied there; the others
    /// still hold what was copied here. Nothing taken here may be lost: pages it could not copy
    /// are kept for the pause to copy, and a capture that fails keeps them for the next one.
    /// Every page taken is copied, hot or not: hot pages are told apart only by a tracker that
    /// leaves them writable ([`Tracker::hot_pages_writable`]), and such a tracker (mprotect)
    /// does not pre-copy, while under userfaultfd a hot page written again before the pause is
    /// reported by its scan and copied there, the others need no copy in it (on Redis that
    /// took the pause's median from 1.03–1.16 to 0.86–0.95 ms: docs/BENCHMARKS.md).
    fn precopy(&mut self) {
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
    fn maybe_precopy(&mut self) {
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

    /// Ends the chain: this epoch and every later one fail with `why`
    /// ([`CaptureError::TreeChanged`], [`ChainState::Broken`]).
    fn break_chain(&mut self, why: String) -> EpochError {
        self.broken = Some(why.clone());
        CaptureError::TreeChanged(why).into()
    }

    /// Whether the process tree may differ from the loop's list of processes, so that the
    /// pause must look at it again ([`EpochLoop::retree`]): a member exited, a process ran
    /// `execve`, a member's whole capture went into no checkpoint, or there are zombies (one
    /// reaped changes no call count). A process that appeared is found by the capture's child
    /// check (`CaptureError::TreeChanged`), which the caller answers with `retree` too.
    /// (A member that exited is reported by `stop_members`, which the caller ran first.)
    fn tree_suspect(&self) -> bool {
        self.relook
            || !self.zombies.is_empty()
            || self.replaced()
            || self
                .members
                .iter()
                .any(|m| m.fresh.is_some() || m.lp.replaced())
    }

    /// Whether the process ran `execve` since this loop's first pause
    /// ([`crate::track::mm_gone`]). Asked of the kernel only when a layout call (`execve` is
    /// one) was counted since the last capture, or calls are not counted.
    fn replaced(&self) -> bool {
        let calls = self
            .cache
            .calls
            .as_ref()
            .map(|c| c.count(crate::syscount::LAYOUT));
        if calls.is_some() && calls == self.layout_seen {
            return false;
        }
        self.mm_probe.as_ref().is_some_and(crate::track::mm_gone)
    }

    /// Brings the list of processes up to date with the tree as it is now, inside the pause
    /// (step 2 of `docs/PROCESS-TREES.md`). `st` is the main process, stopped; `msts` the
    /// other processes the loop knew and could stop (a member that exited was not); on return
    /// (also on failure), `msts` holds every stopped process other than the main one, parents
    /// first, in the order of the new [`EpochLoop::members`] on success, for the caller to
    /// capture and resume.
    ///
    /// The tree is walked from the main process, parents first (each process is stopped before
    /// its children are listed, so the list is final): a member found again keeps its loop; a
    /// process that appeared is stopped and captured whole (its first pause: trackers armed,
    /// [`TreeMember::fresh`]); so is a member that ran `execve` (its address space, and the
    /// tracking that was armed in it, are gone) or whose last whole capture went into no
    /// checkpoint (its tracking is removed first). A member not found exited (it is left out;
    /// unreaped, it is a zombie of its parent, [`EpochLoop::zombies`]). Each process's known
    /// children become the ones found (the capture's child check compares with them).
    ///
    /// With the mprotect tracker, a process that appeared inherited the agent of the process
    /// that forked it: it is taken over ([`MprotectTracker::adopt`]), not loaded again.
    ///
    /// Refused, ending the chain: the main process running `execve`; a member that left the
    /// tree alive (its parent exited: it was reparented outside the service); with the
    /// mprotect tracker, a process that ran `execve` (the agent fails `execve` with EPERM:
    /// the new program would keep the filter without the agent). A failure that may pass (a process that could not be
    /// read or stopped) leaves the members the walk kept and fails this epoch only: the next
    /// pause walks the tree again.
    fn retree(&mut self, st: &Stopped, msts: &mut Vec<Stopped>) -> Result<()> {
        /// A process of the new list: a member the loop knew, or one to capture whole.
        enum Slot {
            Known(Box<TreeMember>),
            New(Proc),
        }
        fn slot_proc(s: &Slot) -> &Proc {
            match s {
                Slot::Known(m) => &m.lp.proc,
                Slot::New(p) => p,
            }
        }
        /// After a failure: every stop back to the caller, every member kept back in the loop.
        fn give_back(
            slots: Vec<(Slot, Stopped, usize)>,
            members: &mut Vec<TreeMember>,
            msts: &mut Vec<Stopped>,
        ) {
            for (slot, s, _) in slots {
                msts.push(s);
                if let Slot::Known(m) = slot {
                    members.push(*m);
                }
            }
        }
        if self.replaced() {
            return Err(self.break_chain(format!(
                "the main process (host PID {}) ran execve: the epoch loop follows execve in \
                 the other processes of a tree only",
                self.proc.pid
            )));
        }
        let mprotect = matches!(self.cfg.tracker, TrackerKind::Mprotect);
        let mut stopped: HashMap<Pid, Stopped> = msts.drain(..).map(|s| (s.pid, s)).collect();
        let mut old: HashMap<Pid, TreeMember> = std::mem::take(&mut self.members)
            .into_iter()
            .map(|m| (m.lp.proc.pid, m))
            .collect();
        // Parents first: (process, its stop, its parent's index: 0 the main process, i the
        // slot i - 1).
        let mut slots: Vec<(Slot, Stopped, usize)> = Vec::new();
        // Each process's children (host PIDs, sorted, zombies included), by index.
        let mut kids_of: Vec<Vec<Pid>> = Vec::new();
        let mut zombies: Vec<(Zombie, usize)> = Vec::new();
        let mut i = 0;
        let walked: std::result::Result<(), CaptureError> = loop {
            if i > slots.len() {
                break Ok(());
            }
            let kids = if i == 0 {
                capture::children_of(&self.proc, &st.tids)
            } else {
                let (slot, s, _) = &slots[i - 1];
                capture::children_of(slot_proc(slot), &s.tids)
            };
            let mut sorted = kids.clone();
            sorted.sort_unstable();
            kids_of.push(sorted);
            let step = || -> std::result::Result<(), CaptureError> {
                for c in kids {
                    if let (Some(m), Some(s)) = (old.get(&c), stopped.get(&c))
                        && !s.tids.is_empty()
                        && !exited(&m.lp.pidfd)
                    {
                        let (m, s) = (old.remove(&c), stopped.remove(&c));
                        if let (Some(m), Some(s)) = (m, s) {
                            slots.push((Slot::Known(Box::new(m)), s, i));
                        }
                        continue;
                    }
                    // A member that exited (not stopped) or a process that appeared.
                    old.remove(&c);
                    if let Some(s) = stopped.remove(&c) {
                        drop(s);
                    }
                    let Ok((proc, dead)) = crate::tree::open_child(&self.proc, c) else {
                        return Err(CaptureError::Exiting(c));
                    };
                    if dead {
                        zombies.push((crate::tree::zombie(&proc)?, i));
                        continue;
                    }
                    match Stopped::stop(&proc) {
                        Ok(s) if !s.tids.is_empty() => slots.push((Slot::New(proc), s, i)),
                        // It exited meanwhile: a zombie now (its parent is stopped), or on
                        // its way there (the pause is tried again).
                        _ => match crate::tree::open_child(&self.proc, c) {
                            Ok((p, true)) => zombies.push((crate::tree::zombie(&p)?, i)),
                            _ => return Err(CaptureError::Exiting(c)),
                        },
                    }
                }
                Ok(())
            };
            if let Err(e) = step() {
                break Err(e);
            }
            i += 1;
        };
        // After a whole walk, members not found exited (and were reaped), or live outside the
        // tree. (A walk cut short keeps those it did not reach, for the next one.)
        let ok = walked.and_then(|()| {
            let mut left = None;
            for (pid, m) in old.drain() {
                if !exited(&m.lp.pidfd) {
                    left = Some((m.pid, pid));
                }
            }
            match left {
                Some((pid, host)) => Err(CaptureError::TreeChanged(format!(
                    "process {pid} (host PID {host}) left the tree alive (its parent exited \
                     and it was reparented outside the service)"
                ))),
                None => Ok(()),
            }
        });
        if let Err(e) = ok {
            msts.extend(stopped.into_values());
            self.members.extend(old.into_values());
            give_back(slots, &mut self.members, msts);
            return Err(match e {
                CaptureError::TreeChanged(why) => self.break_chain(why),
                e => e.into(),
            });
        }
        msts.extend(stopped.into_values()); // none left: each was found or dropped
        // Members that ran `execve`, or whose whole capture is stale, are captured whole again.
        let mut failed = None;
        for (slot, _, _) in &mut slots {
            let Slot::Known(m) = slot else { continue };
            let replaced = m.lp.replaced();
            if !replaced && m.fresh.is_none() {
                continue;
            }
            if replaced && mprotect {
                // Not reached in practice: the agent's filter traps `execve` and the agent
                // fails it with EPERM. Were it let through, the new program would keep the
                // filter (it survives `execve`) without the agent or its SIGSYS handler (reset
                // to the default, which kills), and die at its first trapped call.
                let why = format!(
                    "process {} (host PID {}) ran execve: with the mprotect tracker a new \
                     program cannot be tracked (it keeps the agent's seccomp filter, which \
                     `execve` does not remove, but not the agent, so the agent fails `execve` \
                     with EPERM)",
                    m.pid, m.lp.proc.pid
                );
                failed = Some(self.break_chain(why));
                break;
            }
            if !replaced {
                // Its tracking goes (the process is stopped: the userfaultfd tracker's
                // release only unregisters its ranges) and is armed again by the new capture.
                let armed = std::mem::take(&mut m.lp.armed);
                m.lp.tracker.release(&m.lp.proc, &armed);
            }
            match m.lp.proc.try_clone() {
                Ok(proc) => *slot = Slot::New(proc),
                Err(e) => {
                    failed = Some(gone_or(m.lp.proc.pid, e));
                    break;
                }
            }
        }
        if let Some(e) = failed {
            give_back(slots, &mut self.members, msts);
            return Err(e);
        }
        // Capture every new process whole; keep the others' loops. Each stop goes to `msts`
        // in the order of the members.
        let member_cfg = self.cfg.for_member();
        let mut members: Vec<TreeMember> = Vec::with_capacity(slots.len());
        let mut ns_pids = vec![self.ns_pid];
        let mut ids: Vec<Option<(i32, i32)>> = vec![capture::group_and_session(&self.proc).ok()];
        self.root_ids = ids[0];
        let mut failed = None;
        for (k, (slot, mut s, parent)) in slots.into_iter().enumerate() {
            let ppid = ns_pids[parent];
            let kids = kids_of[k + 1].clone();
            let member = match slot {
                Slot::Known(mut m) => {
                    m.ppid = ppid;
                    m.lp.cache.children = Some(kids);
                    Ok(*m)
                }
                // After a failure, the processes still to capture are left for the next pause.
                Slot::New(_) if failed.is_some() => Err(None),
                Slot::New(proc) => self
                    .first_member(proc, &mut s, &member_cfg, kids, ppid, ids[parent])
                    .map_err(Some),
            };
            msts.push(s);
            match member {
                Ok(m) => {
                    ns_pids.push(m.pid);
                    ids.push(match &m.fresh {
                        Some(f) => Some((f.image.pgid, f.image.sid)),
                        None => capture::group_and_session(&m.lp.proc).ok(),
                    });
                    members.push(m);
                }
                Err(e) => {
                    failed = failed.or(e);
                    ns_pids.push(0);
                    ids.push(None);
                }
            }
        }
        self.cache.children = Some(kids_of[0].clone());
        self.members = members;
        self.shared_groups = None;
        if let Some(e) = failed {
            // The next pause walks the tree again (the processes not captured are new then).
            return Err(e);
        }
        let mut out = Vec::with_capacity(zombies.len());
        for (mut z, parent) in zombies {
            z.ppid = ns_pids[parent];
            crate::tree::check_ids((z.pid, z.pgid, z.sid), ids[parent])?;
            out.push(z);
        }
        self.zombies = out;
        Ok(())
    }

    /// The first pause of a process that appeared in the tree (or must be captured whole
    /// again): arms its tracking (the mprotect tracker takes over the agent the process
    /// inherited, [`MprotectTracker::adopt`]) and captures it whole ([`first_capture`]); its
    /// group and
    /// session must be its own or its parent's (`parent_ids`, unknown: refused).
    fn first_member(
        &self,
        proc: Proc,
        st: &mut Stopped,
        cfg: &EpochConfig,
        children: Vec<Pid>,
        ppid: i32,
        parent_ids: Option<(i32, i32)>,
    ) -> Result<TreeMember> {
        let prep = FirstPrep::new(&proc, true)?;
        let inherited = matches!(cfg.tracker, TrackerKind::Mprotect);
        let mut first = first_capture(&proc, st, cfg, prep, true, children, false, inherited)?;
        let (pgid, sid) = capture::group_and_session(&proc)?;
        let img = &mut first.img.image;
        (img.pgid, img.sid) = (pgid, sid);
        let pid = img.pid;
        let Some(parent_ids) = parent_ids else {
            return Err(CaptureError::Unsupported(format!(
                "the group and session of the parent of process {pid} cannot be read"
            ))
            .into());
        };
        crate::tree::check_ids((pid, pgid, sid), Some(parent_ids))?;
        let pidfd = crate::sys::pidfd_open(proc.pid).map_err(|e| gone_or(proc.pid, e))?;
        let lp = EpochLoop::from_first(
            proc,
            pid,
            first.lp,
            cfg.clone(),
            None,
            Trigger::default(),
            pidfd,
            self.epoch,
        )?;
        Ok(TreeMember {
            pid,
            ppid,
            lp,
            fresh: Some(first.img),
        })
    }

    /// Stops every other process of a tree (parents first) into `sts`; whatever was stopped
    /// is there on failure too, for the caller to resume. A member that exited (or whose
    /// threads are all gone) is not stopped: returns whether there was one (the caller then
    /// looks at the tree again, [`EpochLoop::retree`]).
    fn stop_members(&self, sts: &mut Vec<Stopped>) -> Result<bool> {
        let mut gone = false;
        for m in &self.members {
            match Stopped::stop(&m.lp.proc) {
                Ok(st) if !st.tids.is_empty() => sts.push(st),
                Ok(_) => gone = true,
                Err(_) if exited(&m.lp.pidfd) => gone = true,
                Err(e) => return Err(CaptureError::from(e).into()),
            }
        }
        Ok(gone)
    }

    /// One epoch (with `full`, a full checkpoint of the same pause too). With `hold`, the
    /// process stays stopped after the capture until a `Release` arrives on `cmds` (the reply
    /// is sent from here first).
    ///
    /// A process tree: every process is stopped (parents first), captured with its own state
    /// and resumed (children first) in one pause; the checkpoint lists the other processes as
    /// members of the main process's image, with the open file descriptions they share (see
    /// `docs/PROCESS-TREES.md`).
    fn next(
        &mut self,
        hold: bool,
        full: bool,
        replies: &mpsc::Sender<Reply>,
        cmds: &mpsc::Receiver<Cmd>,
    ) -> Option<Reply> {
        if let Some(why) = &self.broken {
            return Some(Err(CaptureError::TreeChanged(why.clone()).into()));
        }
        // Digests of an earlier pause that produced no checkpoint describe no checkpoint.
        self.scrub_pages = None;
        if exited(&self.pidfd) {
            return Some(Err(EpochError::ServiceGone(format!(
                "process {} has exited",
                self.proc.pid
            ))));
        }
        let ended_by = self.wait();
        if self.cfg.follow_releases {
            self.answers = Some(self.trigger.answers(self.epoch, self.last_resume));
        }
        self.maybe_precopy();
        for m in &mut self.members {
            m.lp.maybe_precopy();
        }
        // The full checkpoint's copy buffers, faulted in before the pause.
        let buffer = |p: &Proc| capture::prefaulted_buffer(capture::estimate_private_bytes(p));
        let mut fullbuf = full.then(|| buffer(&self.proc));
        let mut fullbufs: Vec<Option<Vec<u8>>> = self
            .members
            .iter()
            .map(|m| full.then(|| buffer(&m.lp.proc)))
            .collect();
        let interval = self.last_resume.elapsed();
        let mut attempt = 0u64;
        // What this pause takes from the tracker, until a checkpoint holds it (one per
        // process).
        let mut journal = Carry::default();
        let mut journals: Vec<Carry> = self.members.iter().map(|_| Carry::default()).collect();
        let (st, msts, t0, cpu0, quiesce, captured) = loop {
            let (t0, cpu0) = (Instant::now(), crate::sys::thread_cpu_time());
            let mut st = match Stopped::stop(&self.proc) {
                Ok(s) => s,
                Err(e) => return Some(Err(self.classify(CaptureError::from(e).into()))),
            };
            if st.tids.is_empty() {
                drop(st);
                return Some(Err(self.classify(EpochError::ServiceGone(format!(
                    "process {} has no threads left",
                    self.proc.pid
                )))));
            }
            let mut msts = Vec::with_capacity(self.members.len());
            let mut changed = match self.stop_members(&mut msts) {
                Ok(gone) => gone,
                Err(e) => {
                    let _ = resume_all(msts);
                    drop(st);
                    self.last_resume = Instant::now();
                    return Some(Err(self.classify(e)));
                }
            };
            let quiesce = t0.elapsed();
            // The tree as it is now (step 2 of `docs/PROCESS-TREES.md`): looked at again when
            // it may have changed, or when a process's children are not the known ones.
            changed |= self.tree_suspect();
            let mut looks = 0;
            let r = loop {
                if changed {
                    looks += 1;
                    self.relook = true;
                    if let Err(e) = self.retree(&st, &mut msts) {
                        break Err(e);
                    }
                    self.relook = false;
                    journals = self.members.iter().map(|_| Carry::default()).collect();
                    fullbufs = self.members.iter().map(|_| full.then(Vec::new)).collect();
                }
                match self.capture_tree(
                    &mut st,
                    &mut msts,
                    &mut fullbuf,
                    &mut fullbufs,
                    &mut journal,
                    &mut journals,
                ) {
                    Err(EpochError::Capture(CaptureError::ChildrenChanged(_))) if looks < 3 => {
                        self.keep_all(&mut journal, &mut journals);
                        changed = true;
                    }
                    r => break r,
                }
            };
            match r {
                Ok(c) => break (st, msts, t0, cpu0, quiesce, Ok(c)),
                Err(e) => {
                    // Keep what was taken for the next attempt (or the next epoch).
                    self.keep_all(&mut journal, &mut journals);
                    match e {
                        // A signal queued just as the threads stopped would be lost: let it be
                        // delivered and stop again (as a one-shot checkpoint does).
                        EpochError::Capture(
                            CaptureError::PendingSignals(_) | CaptureError::Exiting(_),
                        )
                        | EpochError::Track(TrackError::Busy)
                            if attempt < 20 =>
                        {
                            attempt += 1;
                            let _ = resume_all(msts);
                            let _ = st.resume();
                            std::thread::sleep(Duration::from_micros(200 * attempt));
                        }
                        e => break (st, msts, t0, cpu0, quiesce, Err(e)),
                    }
                }
            }
        };
        let mut c = match captured {
            Ok(c) => c,
            Err(e) => {
                let _ = resume_all(msts);
                drop(st); // resumes
                self.last_resume = Instant::now();
                return Some(Err(self.classify(e)));
            }
        };
        // The capture succeeded: this pause produces checkpoint `epoch`.
        self.epoch += 1;
        let epoch = self.epoch;
        for m in &mut self.members {
            m.lp.epoch = epoch;
        }
        self.trigger.clear();
        // The divergence check, when due: still stopped, so the digests are of this state.
        let tsc = Instant::now();
        if let Some(s) = self.scrubber.as_mut().filter(|s| s.due()) {
            match s.take(&self.proc, &c.main.meta.vmas) {
                Ok(pages) => self.scrub_pages = Some(pages),
                Err(e) => {
                    tracing::warn!(%e, "the divergence check could not read the process; skipped")
                }
            }
        }
        c.main.parts.scrub = tsc.elapsed();
        let th = Instant::now();
        if let Some(h) = self.hook.as_mut() {
            h(epoch);
        }
        let hook = th.elapsed();
        if hold {
            let r = self.finish(c, epoch, interval, quiesce, t0.elapsed(), ended_by);
            let r = self.settle(r, journal, journals);
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
            let _ = resume_all(msts);
            let _ = st.resume();
            self.last_resume = Instant::now();
            return None;
        }
        let tr = Instant::now();
        let members_resumed = resume_all(msts);
        let resumed = st.resume_at();
        let pause = pause_since(t0, &resumed);
        let pause_cpu = crate::sys::thread_cpu_time().saturating_sub(cpu0);
        let resumed = resumed.and(members_resumed);
        self.last_resume = Instant::now();
        if let Err(e) = resumed {
            // Number `epoch` is given out (the hook saw it) but not produced.
            self.keep_all(&mut journal, &mut journals);
            return Some(Err(self.classify(CaptureError::from(e).into())));
        }
        c.main.parts.resume = tr.elapsed();
        c.main.parts.hook = hook;
        // The encoding yields to the service, on its budget (see `crate::budget`).
        let budget = Budget::enter(self.budget_rule(), self.last_resume);
        let mut r = self.finish(c, epoch, interval, quiesce, pause, ended_by);
        let overran = budget.leave();
        if let Ok(o) = &mut r {
            let late = self
                .budget_rule()
                .lengthened(self.last_resume, Instant::now());
            o.stats.encode_late_us = late.as_micros() as u64;
            o.stats.encode_overran = overran;
            o.stats.pause_cpu_us = pause_cpu.as_micros() as u64;
        }
        Some(self.settle(r, journal, journals))
    }

    /// The part inside the pause for every process (see [`EpochLoop::capture`]), each into its
    /// own journal; for a tree, also the descriptions its processes share.
    fn capture_tree(
        &mut self,
        st: &mut Stopped,
        msts: &mut [Stopped],
        fullbuf: &mut Option<Vec<u8>>,
        fullbufs: &mut [Option<Vec<u8>>],
        j: &mut Carry,
        js: &mut [Carry],
    ) -> Result<TreeCaptured> {
        let alone = self.members.is_empty();
        let main = self.capture(st, fullbuf, j, alone)?;
        let mut out = TreeCaptured {
            main,
            members: Vec::new(),
            groups: Vec::new(),
            ids: Vec::new(),
        };
        if alone {
            return Ok(out);
        }
        for (((m, st), buf), j) in self.members.iter_mut().zip(msts).zip(fullbufs).zip(js) {
            // A process captured whole in this pause (`retree`) has nothing more to give.
            if m.fresh.is_some() {
                out.members.push(None);
                continue;
            }
            out.members.push(Some(m.lp.capture(st, buf, j, false)?));
        }
        // The tree's shared memory objects, each once whichever processes map it, by the main
        // process's tracker over every process's layout (each capture left its own in
        // `prev_maps`); listed again when any process's layout was read again. Their pages
        // that changed go into the main process's data (members' mappings name them).
        let relist = std::iter::once(Some(&out.main))
            .chain(out.members.iter().map(Option::as_ref))
            .any(|c| c.is_none_or(|c| !c.parts.layout_carried));
        let each: Vec<(&Proc, &[MapEntry])> =
            std::iter::once((&self.proc, self.prev_maps.as_slice()))
                .chain(
                    self.members
                        .iter()
                        .map(|m| (&m.lp.proc, m.lp.prev_maps.as_slice())),
                )
                .collect();
        // The private directories, with the files any process maps shared read by content.
        let tw = Instant::now();
        let mapped: Vec<MapEntry> = each
            .iter()
            .flat_map(|(_, maps)| maps.iter())
            .filter(|m| m.shared)
            .cloned()
            .collect();
        out.main.meta.private_files = self
            .dirs
            .changes_mapped(&mapped)
            .map_err(EpochError::Files)?;
        out.main.parts.walk = tw.elapsed();
        j.walked = true;
        let mut shm_data = Vec::new();
        let objects = self.shm.capture_of(&each, relist, false, &mut shm_data)?;
        j.shm = true;
        out.main.shm = (objects, shm_data);
        // A full checkpoint of the same pause lists them whole (in the main process's data).
        if let Some(f) = &mut out.main.full {
            f.shm = crate::shm::ShmTracker::default().capture_of(&each, true, true, &mut f.data)?;
        }
        drop(each);
        let procs: Vec<&Proc> = std::iter::once(&self.proc)
            .chain(self.members.iter().map(|m| &m.lp.proc))
            .collect();
        // Which descriptions the processes share changes only with a descriptor call (open,
        // close, dup, socket calls, recvmsg, ...: `syscount::DESCRIPTORS`) or a process that
        // appears or exits (which ends the chain): while no process made one since the last
        // lookup (each reused its descriptor table), the last lookup holds. A full checkpoint
        // looks them up again.
        let unchanged = out.main.full.is_none()
            && std::iter::once(Some(&out.main))
                .chain(out.members.iter().map(Option::as_ref))
                .all(|c| c.is_some_and(|c| c.parts.meta.fds_reused));
        out.groups = match (&self.shared_groups, unchanged) {
            (Some(g), true) => g.clone(),
            _ => {
                let g = crate::tree::find_shared(&procs)?;
                self.shared_groups = Some(g.clone());
                g
            }
        };
        // A full checkpoint records every process's group and session (the restore recreates
        // them); incremental ones keep the full's.
        if out.main.full.is_some() {
            for p in procs {
                out.ids.push(capture::group_and_session(p)?);
            }
        }
        Ok(out)
    }

    /// What a pause took, for every process, joins its carry (see [`EpochLoop::keep`]).
    fn keep_all(&mut self, journal: &mut Carry, journals: &mut [Carry]) {
        self.keep(std::mem::take(journal));
        for (m, j) in self.members.iter_mut().zip(journals) {
            m.lp.keep(std::mem::take(j));
        }
    }

    /// What a pause took joins the carry (its attempt, or its finish, failed).
    fn keep(&mut self, journal: Carry) {
        if journal.walked {
            self.dirs.undo();
        }
        if journal.shm {
            self.shm.undo();
        }
        // The layout count and the copied-on-write list this pause recorded describe a capture
        // no delivered checkpoint holds: carried into the next pause they would skip the copy
        // of every listed page that a layout call since the last delivered checkpoint requires
        // (a copy zapped and faulted in again holds the file's bytes without a reported write),
        // and would list carried pages as copies of their own (a page written and then zapped
        // before the failed pause is the file's own again). The next pause reads them again,
        // against the last delivered checkpoint: one pause without the carried layout per
        // failure.
        self.layout_seen = None;
        self.prev_cow.clear();
        self.carry.absorb(journal);
    }

    /// After `finish`: a delivered checkpoint holds everything carried so far; a failed one
    /// leaves it (and this pause's journals) to the next.
    fn settle(
        &mut self,
        r: Result<EpochOutput>,
        mut journal: Carry,
        mut journals: Vec<Carry>,
    ) -> Result<EpochOutput> {
        match r {
            Ok(out) => {
                self.carry = Carry::default();
                for m in &mut self.members {
                    m.lp.carry = Carry::default();
                }
                Ok(out)
            }
            Err(e) => {
                self.keep_all(&mut journal, &mut journals);
                Err(self.classify(e))
            }
        }
    }

    /// A failure while the service is gone is reported as such. A failure that can come from
    /// a dying process (anything but a refusal) gives it a moment to finish exiting: its last
    /// threads may still be on their way out.
    fn classify(&self, e: EpochError) -> EpochError {
        let wait = match &e {
            EpochError::ServiceGone(_) => return e,
            EpochError::Capture(CaptureError::Unsupported(_) | CaptureError::PendingSignals(_))
            | EpochError::Track(TrackError::Busy) => Duration::ZERO,
            _ => Duration::from_millis(100),
        };
        if exited_within(&self.pidfd, wait) {
            EpochError::ServiceGone(e.to_string())
        } else {
            e
        }
    }

    /// Test support: fails here if told to.
    fn fail_at(&mut self, at: FailPoint) -> Result<()> {
        if self.fail == Some(at) {
            self.fail = None;
            return Err(CaptureError::Unsupported(format!("injected failure ({at:?})")).into());
        }
        Ok(())
    }

    /// The part inside the pause. Whatever it takes from the tracker goes into `j` first (see
    /// [`Carry`]); `fullbuf` is the copy buffer of a full checkpoint, if one is wanted.
    /// The last pause's layout (taken from `prev_maps`), with every mapping that grows down
    /// (`gd`: the main thread's stack, extended by the kernel on a fault below it, with no
    /// system call) as the kernel has it now. `None`, `prev_maps` left as it was, when that
    /// cannot be asked or such a mapping is not where it was.
    fn grown_stacks(&mut self) -> Option<Vec<MapEntry>> {
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
    fn read_layout(&mut self, expect_same: bool) -> Result<Vec<MapEntry>> {
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

    fn capture(
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
        let valid: Vec<(u64, u64)> = subtract_all(&self.armed, &stale);
        // (One subtraction over every trackable mapping: the holes are merged once.)
        let trackable_ranges: Vec<(u64, u64)> = maps
            .iter()
            .filter(|m| trackable(m))
            .map(|m| (m.start, m.end))
            .collect();
        let fresh: Vec<(u64, u64)> = subtract_all(&trackable_ranges, &valid);
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
    fn finish(
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
            crate::tree::share(&mut main.meta, &mut refs, &hosts, groups)?;
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
    fn identify(&mut self, c: &mut Captured) -> Result<()> {
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

    /// The rest of `finish` for one process (nothing fails): encode its pages against the
    /// twins, build its checkpoint `epoch` (and the full one of the same state, if taken).
    #[allow(clippy::too_many_arguments)]
    fn encode(
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
            no_twin.extend(subtract_all(&[(v.start, v.end)], &cow));
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
        for (s, e) in subtract_all(&void, &self.void) {
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
    fn fresh_output(&mut self, f: FreshImage, epoch: u64, full: bool) -> EpochOutput {
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

    /// Removes write tracking (the processes keep running untracked).
    fn disarm(&mut self) {
        self.tracker.release(&self.proc, &self.armed);
        for m in &mut self.members {
            m.lp.disarm();
        }
    }
}

/// One worker's output: its bytes, and per page its address, encoding, offset in those bytes
/// and whether its twin was already updated.
type Encoded = (Vec<u8>, Vec<(u64, PageEncoding, u64, bool)>);

/// How [`encode_part`] uses the twins.
enum TwinUse<'a> {
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
fn encode_part(
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

/// A full checkpoint's part of a pause: its pages and the private directories' whole tree.
struct FullCapture {
    runs: Vec<PageRun>,
    data: Vec<u8>,
    tree: FileChanges,
    shm: Vec<ShmObject>,
    took: Duration,
}

/// What a pause captured of every process of a tree (of the single process: `members`,
/// `groups` and `ids` empty).
struct TreeCaptured {
    main: Captured,
    /// In the order of [`EpochLoop::members`]; `None` for a fresh one (its whole image is
    /// [`TreeMember::fresh`]).
    members: Vec<Option<Captured>>,
    /// The open file descriptions several processes hold (`crate::tree::find_shared`).
    groups: Vec<crate::tree::FileGroup>,
    /// With a full checkpoint: every process's group and session, the main one's first.
    ids: Vec<(i32, i32)>,
}

struct Captured {
    meta: ProcessImage,
    /// Identified (and taken) by `identify`.
    exe: Option<capture::PendingFile>,
    /// The shared memory objects with the pages that changed, and those pages' bytes.
    shm: (Vec<ShmObject>, Vec<u8>),
    full: Option<FullCapture>,
    write_faults: Option<u64>,
    /// Pre-copied pages to add (address, offset in the pre-copy's bytes), and the pre-copy.
    pre: Option<(Vec<(u64, usize)>, Precopy)>,
    /// `EpochStats::precopy_rewritten`.
    precopy_rewritten: u64,
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
    parts: Parts,
}

/// Where a pause's time went besides quiesce, scan and copy (see [`EpochStats::layout_us`]).
#[derive(Debug, Default, Clone, Copy)]
struct Parts {
    layout: Duration,
    meta: capture::MetaTimes,
    walk: Duration,
    take: Duration,
    precheck: Duration,
    hot: Duration,
    cow: Duration,
    exe: Duration,
    commit: Duration,
    hook: Duration,
    /// The divergence check's reading (see [`crate::scrub`]).
    scrub: Duration,
    resume: Duration,
    layout_carried: bool,
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

/// `ranges` minus the union of `holes` (both lists of half-open intervals; `holes` in any
/// order). Linear in the sizes after sorting the holes (this runs inside the pause, over every
/// mapping: the quadratic version cost ~0.5 ms on Redis's ~120 mappings).
fn subtract_all(ranges: &[(u64, u64)], holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let holes = merge(holes.to_vec());
    let mut out = Vec::new();
    for &(s, e) in ranges {
        let mut at = s;
        let mut i = holes.partition_point(|h| h.1 <= s);
        while at < e {
            match holes.get(i) {
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

/// Ranges sorted, overlapping and touching ones merged.
fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(l) if s <= l.1 => l.1 = l.1.max(e),
            _ => out.push((s, e)),
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
        // Several ranges at once (every trackable mapping): each minus the holes, in order.
        assert_eq!(
            subtract_all(&[(0, 10), (20, 30), (40, 50)], &[(45, 60), (5, 25)]),
            vec![(0, 5), (25, 30), (40, 45)]
        );
        assert_eq!(
            coalesce(&[0, 4096, 8192, 16384]),
            vec![(0, 12288), (16384, 20480)]
        );
        assert_eq!(
            gaps(&[(4096, 8192)]),
            vec![(0, 4096), (8192, 0x7fff_ffff_f000)]
        );
        assert_eq!(
            merge(vec![(20, 30), (0, 10), (10, 15), (25, 40), (50, 60)]),
            vec![(0, 15), (20, 40), (50, 60)]
        );
    }
}
