//! How epochs are scheduled and encoded ([`EpochConfig`]), and what each one cost and produced
//! ([`EpochStats`], [`Answers`], [`EndedBy`]).

#[allow(unused_imports)]
use super::*;

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
    /// many pages. See docs/BENCHMARKS.md ("Dirty-page pre-copy").
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
    /// [`crate::budget`] and docs/BENCHMARKS.md ("Encoding on a budget").
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
    pub(super) fn for_member(&self) -> EpochConfig {
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
    /// The TCP connections read in this pause (after the hook, part of the pause), how long
    /// that took, and the connected sockets a restore would reset instead (see `crate::tcp`).
    pub tcp_conns: u64,
    pub tcp_us: u64,
    pub tcp_reset: u64,
    /// Of `tcp_conns`, those read whole (the others had not moved since the last pause).
    pub tcp_read: u64,
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
    pub(super) fn add_member(&mut self, s: &EpochStats) {
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
        self.tcp_conns += s.tcp_conns;
        self.tcp_reset += s.tcp_reset;
        self.tcp_read += s.tcp_read;
    }
}
