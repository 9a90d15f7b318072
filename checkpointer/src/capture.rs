//! Full checkpoint of a running process: stop every thread, read what changes while it runs
//! (memory, registers, handles), resume, then finish the work that does not need it stopped.
//!
//! The pause covers: stopping threads, per-thread registers, the injected system calls, the
//! memory copy and the descriptor table. Hashing mapped files and dropping zero pages happen
//! after the process runs again.

use crate::abi::{self, Regs};
use crate::fds;
use crate::image::*;
use crate::procfs::{self, MapEntry, Proc};
use crate::ptrace::{PtraceError, SCRATCH, Stopped};
use crate::sys::{self, Pid};
use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;

/// Why a checkpoint could not be taken. Every unsupported resource is named.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Ptrace(#[from] PtraceError),
    #[error("reading {what} of process {pid}: {source}")]
    Proc {
        pid: Pid,
        what: String,
        source: io::Error,
    },
    #[error("cannot checkpoint: {0}")]
    Unsupported(String),
    #[error("injected {call} in thread {tid} failed with errno {errno}")]
    Injected {
        call: &'static str,
        tid: Pid,
        errno: i64,
    },
    #[error(
        "cannot checkpoint: signals {} kept arriving while the process was read, or are pending without the details a restore needs to queue them again",
        .0.join(", ")
    )]
    PendingSignals(Vec<String>),
    #[error(
        "cannot checkpoint: {0}, and they stayed queued; queued inotify events cannot be carried into a checkpoint"
    )]
    QueuedEvents(String),
    /// The epoch loop's process tree changed in a way its chain cannot carry (see
    /// `docs/PROCESS-TREES.md`: the main process ran `execve`, a process left the tree alive,
    /// a process appeared under the mprotect tracker).
    #[error("{0}; the chain must restart with a full checkpoint")]
    TreeChanged(String),
    /// The epoch loop: a process's children are not the ones the loop knows (a process
    /// appeared or exited since the last pause). The loop looks at the tree again
    /// (`EpochLoop::retree`) and captures the new processes whole.
    #[error("{0}")]
    ChildrenChanged(String),
    /// The epoch loop: a process of the tree was exiting while the tree was stopped (neither
    /// running nor a zombie yet): the pause is tried again.
    #[error("process {0} (host PID) was exiting while the tree was stopped")]
    Exiting(Pid),
}

type Result<T> = std::result::Result<T, CaptureError>;

pub(crate) fn proc_err(
    pid: Pid,
    what: impl Into<String>,
) -> impl FnOnce(io::Error) -> CaptureError {
    let what = what.into();
    move |source| CaptureError::Proc { pid, what, source }
}

/// Timings of one capture, for benchmarks and `--json` output.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CaptureStats {
    /// Stopping every thread.
    pub quiesce: Duration,
    /// From the first stop request to the last thread resumed.
    pub pause: Duration,
    /// Copying memory (inside the pause).
    pub memory_copy: Duration,
    pub threads: usize,
    pub saved_bytes: u64,
}

/// Takes a full checkpoint of process `pid` (a host PID), with the whole tree of its private
/// directories (sandbox paths; see [`crate::files`]). The process keeps running.
///
/// A signal can be queued at the very moment the threads stop; it would be lost, so such an
/// attempt is abandoned and retried a few times before giving up.
pub fn checkpoint(
    pid: Pid,
    epoch: u64,
    private_dirs: &[String],
) -> Result<(Checkpoint, CaptureStats)> {
    procfs::in_view(pid, |proc| checkpoint_in_view(proc, epoch, private_dirs))
        .map_err(proc_err(pid, "the sandbox's view"))?
}

/// [`checkpoint`] for a caller already inside [`procfs::in_view`].
pub fn checkpoint_in_view(
    proc: &Proc,
    epoch: u64,
    private_dirs: &[String],
) -> Result<(Checkpoint, CaptureStats)> {
    let mut attempt = 0;
    loop {
        // A service without children takes the single-process path; one that forks between
        // this look and the stop is refused there by name and tried again as a tree.
        let forked = !children_of(proc, &proc.tids().unwrap_or_default()).is_empty();
        let r = if forked {
            crate::tree::checkpoint_tree(proc, epoch, private_dirs)
        } else {
            checkpoint_once(proc, epoch, private_dirs)
        };
        match r {
            Err(CaptureError::PendingSignals(_) | CaptureError::QueuedEvents(_))
                if attempt < 20 =>
            {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(attempt));
            }
            Err(CaptureError::Unsupported(m))
                if !forked && attempt < 20 && m.contains(CHILDREN_REFUSED) =>
            {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(attempt));
            }
            r => return r,
        }
    }
}

fn checkpoint_once(
    proc: &Proc,
    epoch: u64,
    private_dirs: &[String],
) -> Result<(Checkpoint, CaptureStats)> {
    let mut stats = CaptureStats::default();
    // The copy destination is faulted in before the pause: a fresh 100 MB buffer would otherwise
    // cost ~25,000 page faults inside it.
    let buf = prefaulted_buffer(estimate_private_bytes(proc));
    let t0 = Instant::now();
    let mut st = Stopped::stop(proc)?;
    stats.quiesce = t0.elapsed();
    stats.threads = st.tids.len();
    let captured = capture_stopped(proc, &mut st, &mut stats, buf, false).and_then(|(mut c, _)| {
        // Inside the pause: the files consistent with the memory.
        c.0.private_files = private_tree(proc, private_dirs)?;
        Ok(c)
    });
    let resumed = st.resume();
    stats.pause = t0.elapsed();
    let (mut image, mut data, file_ids) = captured?;
    resumed?;
    finish_full(proc, &mut image, &mut data, file_ids)?;
    stats.saved_bytes = data.len() as u64;
    Ok((Checkpoint::full(epoch, image, data), stats))
}

/// The whole tree of the private directories `dirs` (sandbox paths) as a full checkpoint holds
/// it; walked inside the pause, so that the files are consistent with the memory.
pub(crate) fn private_tree(proc: &Proc, dirs: &[String]) -> Result<crate::files::FileChanges> {
    crate::files::DirTracker::new(dirs.to_vec())
        .changes()
        .map_err(proc_err(proc.pid, "the private directories"))
}

/// The work of a full checkpoint that does not need the process stopped: identify mapped files
/// and the executable, drop all-zero anonymous pages.
pub(crate) fn finish_full(
    proc: &Proc,
    image: &mut ProcessImage,
    data: &mut Vec<u8>,
    files: Vec<PendingFile>,
) -> Result<()> {
    image.files = files
        .into_iter()
        .map(|f| f.identify(proc))
        .collect::<Result<_>>()?;
    image.exe = identify_exe(proc, &image.exe.path)?;
    drop_zero_pages(image, data);
    Ok(())
}

pub(crate) fn identify_exe(proc: &Proc, path: &str) -> Result<FileRef> {
    identify_path(proc, "exe", path)
}

/// A full checkpoint's image and page data, and the mapped files still to identify.
pub(crate) type FullMemory = ((ProcessImage, Vec<u8>), Vec<PendingFile>);

/// Memory of a full checkpoint for a stopped process whose metadata is `meta`, with its
/// shared memory objects captured by `shm` (`None`: a process of a tree other than the main
/// one, whose objects the main process's tracker captures for the whole tree).
pub(crate) fn full_memory(
    proc: &Proc,
    maps: &[MapEntry],
    mut meta: ProcessImage,
    buf: Vec<u8>,
    shm: Option<&mut crate::shm::ShmTracker>,
) -> Result<FullMemory> {
    let (vmas, runs, mut data, files) = capture_memory(proc, maps, buf)?;
    if let Some(shm) = shm {
        meta.shm = shm.capture(proc, maps, true, true, &mut data)?;
    }
    meta.vmas = vmas;
    meta.runs = runs;
    Ok(((meta, data), files))
}

/// A mapped file found during the pause, hashed after it.
pub(crate) struct PendingFile {
    pub(crate) path: String,
    /// `map_files/START-END` (under `/proc/PID`) of one mapping of it.
    map_file: String,
    /// The inode the mapping shows (with the path, a cache key for the epoch loop).
    pub(crate) inode: u64,
    /// The file, opened during the pause: after it the mapping may be gone.
    opened: Option<std::fs::File>,
}

impl PendingFile {
    /// The process's executable (`/proc/PID/exe`, shown as `path`), to open during the pause
    /// and identify after it, as a mapped file.
    pub(crate) fn exe(path: &str) -> PendingFile {
        PendingFile {
            path: path.to_string(),
            map_file: "exe".into(),
            inode: 0,
            opened: None,
        }
    }

    /// Opens the file while the process is still stopped.
    pub(crate) fn open(&mut self, proc: &Proc) -> Result<()> {
        let f = proc
            .open_file(&self.map_file, libc::O_RDONLY)
            .map_err(proc_err(proc.pid, format!("mapped file {}", self.path)))?;
        self.opened = Some(f);
        Ok(())
    }

    pub(crate) fn identify(self, proc: &Proc) -> Result<FileRef> {
        match self.opened {
            Some(f) => identify_file(proc, f, &self.path),
            None => identify_path(proc, &self.map_file, &self.path),
        }
    }
}

/// Hash cache: (dev, ino, size, mtime) → BLAKE3, so a file is hashed once per supervisor.
static HASHES: Mutex<Option<HashMap<FileKey, [u8; 32]>>> = Mutex::new(None);

/// (dev, ino, size, mtime seconds, mtime nanoseconds): a file's identity on this machine.
type FileKey = (u64, u64, u64, i64, i64);

fn identify_path(proc: &Proc, rel: &str, path: &str) -> Result<FileRef> {
    let f = proc
        .open_file(rel, libc::O_RDONLY)
        .map_err(proc_err(proc.pid, format!("mapped file {path}")))?;
    identify_file(proc, f, path)
}

fn identify_file(proc: &Proc, f: std::fs::File, path: &str) -> Result<FileRef> {
    let pid = proc.pid;
    let m = f
        .metadata()
        .map_err(proc_err(pid, format!("mapped file {path}")))?;
    let hash = cached_hash(f, &m).map_err(proc_err(pid, format!("hashing {path}")))?;
    Ok(FileRef {
        path: path.to_string(),
        size: m.size(),
        hash,
    })
}

/// The content hash of file `f` (whose metadata is `m`), hashed once per device, inode, size
/// and modification time for the life of this process (a capture hashes a service's mapped
/// files once, not every checkpoint; a tree's restore checks a library its processes all map
/// once).
pub(crate) fn cached_hash(f: std::fs::File, m: &std::fs::Metadata) -> io::Result<[u8; 32]> {
    let key = (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec());
    let lock = || HASHES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = lock().get_or_insert_default().get(&key) {
        return Ok(*h);
    }
    let hash = hash_file(f)?;
    lock().get_or_insert_default().insert(key, hash);
    Ok(hash)
}

pub(crate) fn hash_file(mut f: std::fs::File) -> io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    io::copy(&mut f, &mut h)?;
    Ok(*h.finalize().as_bytes())
}

pub(crate) type Captured = (ProcessImage, Vec<u8>, Vec<PendingFile>);

/// Anonymous (including copied-on-write) and swapped memory of `pid`, plus slack.
pub(crate) fn estimate_private_bytes(proc: &Proc) -> usize {
    let text = proc.read_string("smaps_rollup").unwrap_or_default();
    let kb = |key: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let bytes = (kb("Anonymous:") + kb("Swap:")) * 1024;
    (bytes + bytes / 16 + (1 << 20)) as usize
}

/// A zeroed buffer whose pages are already present (huge pages where the kernel gives them).
pub(crate) fn prefaulted_buffer(bytes: usize) -> Vec<u8> {
    let mut v: Vec<u8> = Vec::with_capacity(bytes);
    let start = (v.as_ptr() as usize).next_multiple_of(2 << 20);
    let end = (v.as_ptr() as usize + bytes) & !((2 << 20) - 1);
    if end > start {
        // SAFETY: advice about our own allocation's address range; no memory is accessed.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    v.resize(bytes, 0);
    v
}

/// Which cached values a capture reads again rather than trusting its cache (see
/// [`MetaCache`]): every one for a first or one-shot capture and after a failed round
/// ([`Refresh::ALL`]), none in an ordinary pause, and in the epoch loop's periodic check one
/// group at a time ([`Refresh::staggered`]), so that no single pause pays for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refresh {
    /// The memory layout, compared with the carried one (the epoch loop's part).
    pub layout: bool,
    /// Whether the process has children (the check for processes it must not have).
    pub children: bool,
    /// Each thread's name, `clear_child_tid` and sigaltstack (injected calls, ~0.3 ms a
    /// thread): which threads.
    pub threads: Threads,
    /// Signal actions (injected calls).
    pub signals: bool,
    /// `brk`, umask (injected calls), the `stat` values, cwd, exe, auxv.
    pub process: bool,
    /// The descriptor table read whole, and the resource limits.
    pub fds: bool,
    /// Credentials, checked across every thread.
    pub creds: bool,
    /// POSIX and interval timers.
    pub timers: bool,
    /// Seccomp filters.
    pub seccomp: bool,
    /// The final pending-signal check over every thread's `status`.
    pub pending: bool,
}

impl Refresh {
    /// Nothing read again: the cache is trusted where its own checks say it holds.
    pub const NONE: Refresh = Refresh {
        layout: false,
        children: false,
        threads: Threads::None,
        signals: false,
        process: false,
        fds: false,
        creds: false,
        timers: false,
        seccomp: false,
        pending: false,
    };
    /// Everything read again.
    pub const ALL: Refresh = Refresh {
        layout: true,
        children: true,
        threads: Threads::All,
        signals: true,
        process: true,
        fds: true,
        creds: true,
        timers: true,
        seccomp: true,
        pending: true,
    };
    const GROUPS: u64 = 10;

    /// The epoch loop's periodic check: each group is read again once every `every` epochs,
    /// the groups at offsets spread over the period (group `k` when `epoch + k * every / 10`
    /// is a multiple of `every`), so that a pause pays for one group, not ten. `every == 0`:
    /// never.
    pub fn staggered(epoch: u64, every: u64) -> Refresh {
        if every == 0 {
            return Refresh::NONE;
        }
        let due = |k: u64| (epoch + k * every / Self::GROUPS).is_multiple_of(every);
        // The threads' group is spread further: over the epochs of its tenth of the period,
        // one thread (or a share of them) a pause.
        let window = every / Self::GROUPS;
        let threads = if window <= 1 {
            if due(2) { Threads::All } else { Threads::None }
        } else {
            let slot = (epoch + 2 * every / Self::GROUPS) % every;
            if slot < window {
                Threads::Slot { slot, window }
            } else {
                Threads::None
            }
        };
        Refresh {
            layout: due(0),
            children: due(1),
            threads,
            signals: due(3),
            process: due(4),
            fds: due(5),
            creds: due(6),
            timers: due(7),
            seccomp: due(8),
            pending: due(9),
        }
    }
}

/// Which threads' values [`Refresh`] reads again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    None,
    All,
    /// The threads whose index (in the stop's order) is `slot` modulo `window`.
    Slot {
        slot: u64,
        window: u64,
    },
}

impl Threads {
    /// Whether the thread at `index` is read again.
    pub fn due(&self, index: usize) -> bool {
        match *self {
            Threads::None => false,
            Threads::All => true,
            Threads::Slot { slot, window } => index as u64 % window == slot,
        }
    }
}

/// Values that cost injected system calls to read, kept between checkpoints of one process.
/// A full checkpoint refreshes everything; an incremental one re-reads a value only when a
/// cheap signal says it may have changed (a new thread, other signal masks in `status`, a
/// different `[heap]` end). Known gap: a thread that changes its sigaltstack or
/// clear_child_tid, or a process that swaps one handler for another or changes its umask,
/// is seen at the next full refresh only.
#[derive(Default)]
pub struct MetaCache {
    /// `/proc` status files kept open (by path relative to the process's directory) and read
    /// again from offset 0: a `seq_file` regenerates its text on every read from the start,
    /// and the path lookups under `/proc/PID/task/TID` cost more than the read.
    status_files: HashMap<String, std::fs::File>,
    /// The layout-call count ([`crate::syscount::LAYOUT`], which counts `clone` and `fork`)
    /// when the process's children were last checked (none, or `children`).
    childless_at: Option<u64>,
    /// The epoch loop: the children (host PIDs, sorted) the process had when the chain began
    /// (none for a single process); other children refuse the capture
    /// ([`CaptureError::TreeChanged`]). Unset: any child is refused as a process tree (a
    /// single process's one-shot checkpoint, which is then retried as a tree).
    pub(crate) children: Option<Vec<Pid>>,
    /// The values read from `stat`, `cwd` and `exe`, with the (layout, descriptor) call counts
    /// when they were read: the `stat` fields kept (code, data, stack, arguments, environment)
    /// change only through `execve`, `brk` and `prctl(PR_SET_MM*)`, the executable through
    /// `execve` (layout calls), the working directory through `chdir`, `fchdir` and `chroot`
    /// (counted with the descriptor calls).
    process_vals: Option<((u64, u64), MmInfo, String, String)>,
    /// Children are captured as members of a process tree (a full checkpoint's, see
    /// [`checkpoint`]): the child check does not refuse them.
    tree: bool,
    threads: HashMap<Pid, (u64, AltStack)>,
    sig_masks: Option<(u64, u64)>,
    sigactions: Vec<SigAction>,
    umask: Option<u32>,
    heap_end: Option<u64>,
    brk: u64,
    rlimits: Option<Vec<(u32, u64, u64)>>,
    fds: fds::FdCache,
    /// Counts the process's descriptor and layout calls ([`crate::syscount::CHANGE_GROUPS`]);
    /// with the descriptor count at the last descriptor capture. Unset: every capture reads
    /// every descriptor (and the epoch loop the whole layout).
    pub(crate) calls: Option<crate::syscount::SyscallCounter>,
    fd_calls_seen: Option<u64>,
    /// Host TID → (TID in the sandbox, name).
    names: HashMap<Pid, (Pid, String)>,
    auxv: Option<Vec<u64>>,
    /// The process carries our own seccomp filter (the mprotect tracker's agent).
    pub(crate) own_filter: bool,
    /// Credentials with the `status` lines they were read from.
    creds: Option<(String, Credentials)>,
    /// The last reading of the timers ([`crate::timers`]).
    timers: Option<crate::timers::TimerCache>,
    /// The last reading of the service's seccomp filters ([`crate::seccomp`]).
    seccomp: Option<crate::seccomp::SeccompCache>,
    /// Where the last [`capture_meta`] spent its time (for the epoch statistics).
    pub(crate) times: MetaTimes,
}

impl MetaCache {
    /// Forgets what a failed capture may have read at a moment that does not last (the timers
    /// before a signal re-arms one, a thread's alternate-stack state before a handler runs on
    /// it): the next capture reads those again.
    fn forget_transient(&mut self) {
        self.timers = None;
        self.threads.clear();
    }
}

/// The parts of one [`capture_meta`] call.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct MetaTimes {
    /// `status`, the supported-state checks and delivering pending signals.
    pub checks: Duration,
    /// Registers, XSAVE, robust list, rseq, signal mask of every thread (and cached values).
    pub threads: Duration,
    /// Signal actions, brk, umask, `stat`, auxv, cwd, exe, rlimits.
    pub process: Duration,
    /// The descriptor table.
    pub fds: Duration,
    /// Credentials, timers, seccomp filters and the final pending-signal check.
    pub pending: Duration,
    /// The descriptors were taken from the last capture (no descriptor call since).
    pub fds_reused: bool,
}

/// Captures the stopped process whole. A member of a tree (`tree`) leaves its shared memory
/// objects to the caller, which captures the tree's once ([`crate::tree`]); the mappings read
/// are returned for that.
pub(crate) fn capture_stopped(
    proc: &Proc,
    st: &mut Stopped,
    stats: &mut CaptureStats,
    buf: Vec<u8>,
    tree: bool,
) -> Result<(Captured, Vec<MapEntry>)> {
    let maps = proc.smaps().map_err(proc_err(proc.pid, "smaps"))?;
    let mut cache = MetaCache {
        tree,
        ..MetaCache::default()
    };
    let mut image = capture_meta(proc, st, &maps, &mut cache, Refresh::ALL)?;
    (image.pgid, image.sid) = group_and_session(proc)?;
    let tm = Instant::now();
    let (vmas, runs, mut data, files) = capture_memory(proc, &maps, buf)?;
    if !tree {
        image.shm =
            crate::shm::ShmTracker::default().capture(proc, &maps, true, true, &mut data)?;
    }
    stats.memory_copy = tm.elapsed();
    image.vmas = vmas;
    image.runs = runs;
    Ok(((image, data, files), maps))
}

/// Everything but memory: threads, signal actions, mm layout, descriptors. `refresh` says
/// which cached values are read again (see [`Refresh`]); otherwise `cache` is used where valid.
pub(crate) fn capture_meta(
    proc: &Proc,
    st: &mut Stopped,
    maps: &[MapEntry],
    cache: &mut MetaCache,
    refresh: Refresh,
) -> Result<ProcessImage> {
    // The injected calls of a capture run with signals held (`Stopped::calls_hold_signals`):
    // one that arrives meanwhile is pending at the final check. One sent by another process
    // is taken there as sent after the checkpoint (see `final_pending_check`), so a stream of
    // them, however fast, costs no round. One the kernel raised (a timer's, a child's) is
    // delivered as the next round begins and the state read again: it costs a round, not the
    // whole pause; only after a few rounds does the caller get `PendingSignals` (it resumes
    // the process and tries again). A timer queues one signal until it is taken, so this
    // ends.
    //
    // A round after the first re-reads everything: what the failed one cached may describe the
    // moment before the signal's delivery (an interval timer that expired is re-armed only
    // when its signal is taken: read in between, it looks disarmed).
    let mut round = 0;
    loop {
        let r = if round > 0 { Refresh::ALL } else { refresh };
        match capture_meta_once(proc, st, maps, cache, r) {
            // More rounds for a full reading (a first checkpoint: long, and no caller retry
            // as cheap as a round), a few for the epoch loop's (it resumes and stops again).
            Err(CaptureError::PendingSignals(_))
                if round < if refresh == Refresh::ALL { 10 } else { 3 } =>
            {
                round += 1
            }
            Err(e) => {
                cache.forget_transient();
                return Err(e);
            }
            r => return r,
        }
    }
}

fn capture_meta_once(
    proc: &Proc,
    st: &mut Stopped,
    maps: &[MapEntry],
    cache: &mut MetaCache,
    refresh: Refresh,
) -> Result<ProcessImage> {
    let pid = st.pid;
    if st.tids.is_empty() {
        return Err(PtraceError::ProcessDied { pid }.into());
    }
    let t0 = Instant::now();
    // Read once: nothing below changes the fields used from it (the process stays stopped, and
    // the injected calls only read).
    let status =
        read_status(proc, &mut cache.status_files, "status").map_err(proc_err(pid, "status"))?;
    cache.status_files.retain(|rel, _| {
        rel == "status"
            || rel
                .strip_prefix("task/")
                .and_then(|r| r.strip_suffix("/status"))
                .and_then(|t| t.parse::<Pid>().ok())
                .is_some_and(|t| st.tids.contains(&t))
    });
    // The calls counted since the process started ((layout, descriptors)), read once: the
    // process is stopped, so they cannot move during this capture.
    let counts = cache.calls.as_ref().map(|c| {
        (
            c.count(crate::syscount::LAYOUT),
            c.count(crate::syscount::DESCRIPTORS),
        )
    });
    // A child process appears only through a counted call (`clone`, `fork`, ...): while none
    // was made since the last check found none, there is none.
    let layout_calls = counts.map(|c| c.0);
    if !cache.tree
        && (refresh.children || layout_calls.is_none() || layout_calls != cache.childless_at)
    {
        cache.childless_at = None;
        check_supported(proc, &st.tids, cache.children.as_deref())?;
        cache.childless_at = layout_calls;
    }
    // Signals pending now (say the SIGSEGV of a write a thread just made, or the SIGSYS of a
    // trapped system call) are delivered first, so that the state captured below is the one
    // after their delivery (see `deliver_pending`).
    let ran = st.ran;
    st.reraised = 0;
    let blocked_pending = deliver_pending_signals(st, maps)?;
    // What stays pending (blocked) goes into the image with its details; a restore queues it
    // again before any thread runs.
    let pending = if blocked_pending {
        read_pending(st)?
    } else {
        Pending::default()
    };
    let t1 = Instant::now();

    let mut threads = Vec::with_capacity(st.tids.len());
    let mut max_tid = 0;
    let mut seen = HashMap::new();
    for (index, &tid) in st.tids.clone().iter().enumerate() {
        let again = refresh.threads.due(index);
        let regs = st.regs(tid)?;
        let xstate = fit_xstate(st.xstate(tid)?).map_err(|why| {
            CaptureError::Unsupported(format!("thread {tid}'s extended CPU state: {why}"))
        })?;
        let (robust_list, robust_len) = st.robust_list(tid)?;
        let rseq = st
            .rseq(tid)?
            .map(|(addr, len, sig)| Rseq { addr, len, sig });
        // A thread's TID inside the sandbox never changes; its name rarely (seen at refreshes).
        let (ns_tid, comm) = match cache.names.get(&tid) {
            Some(v) if !again => v.clone(),
            _ => {
                let ns = proc.ns_pid(tid).map_err(proc_err(pid, "NSpid"))?;
                let comm = proc
                    .read_string(&format!("task/{tid}/comm"))
                    .map_err(proc_err(pid, "comm"))?;
                cache.names.insert(tid, (ns, comm.clone()));
                (ns, comm)
            }
        };
        max_tid = max_tid.max(ns_tid);
        let (clear_child_tid, altstack) = match cache.threads.get(&tid) {
            Some(v) if !again => *v,
            _ => inject_thread_values(st, maps, tid)?,
        };
        seen.insert(tid, (clear_child_tid, altstack));
        threads.push(ThreadImage {
            tid: ns_tid,
            comm: comm.trim_end().to_string(),
            regs: regs_to_vec(&regs),
            xstate,
            sigmask: st.sigmask(tid)?,
            robust_list,
            robust_len,
            clear_child_tid,
            rseq,
            altstack,
            pending: pending.threads.get(&tid).cloned().unwrap_or_default(),
        });
    }
    cache.names.retain(|t, _| seen.contains_key(t));
    cache.threads = seen;
    let t2 = Instant::now();

    // Process-wide state.
    let leader = st.tids[0];
    let masks = signal_masks(&status);
    if refresh.signals || cache.sig_masks != Some(masks) {
        cache.sigactions = capture_sigactions(st, maps, leader, masks)?;
        cache.sig_masks = Some(masks);
    }
    let heap_end = maps.iter().find(|m| m.name == "[heap]").map(|m| m.end);
    if refresh.process || cache.heap_end != heap_end {
        cache.brk = st.inject(maps, leader, libc::SYS_brk, [0; 6], 0)?.0 as u64;
        cache.heap_end = heap_end;
    }
    let umask = match cache.umask {
        Some(u) if !refresh.process => u,
        _ => {
            let (u, _, _) = st.inject(maps, leader, libc::SYS_umask, [0o022, 0, 0, 0, 0, 0], 0)?;
            st.inject(maps, leader, libc::SYS_umask, [u as u64, 0, 0, 0, 0, 0], 0)?;
            cache.umask = Some(u as u32);
            u as u32
        }
    };
    let kept = match (&cache.process_vals, counts) {
        (Some((at, mm, cwd, exe)), Some(now)) if !refresh.process && *at == now => {
            Some((mm.clone(), cwd.clone(), exe.clone()))
        }
        _ => None,
    };
    let (mut mm, cwd, exe_path) = match kept {
        Some(v) => v,
        None => {
            let stat = proc.stat_fields().map_err(proc_err(pid, "stat"))?;
            // proc(5) numbers fields from 1.
            let f = |n: usize| {
                stat.get(n - 1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let mm = MmInfo {
                start_code: f(26),
                end_code: f(27),
                start_stack: f(28),
                start_data: f(45),
                end_data: f(46),
                start_brk: f(47),
                brk: 0,
                arg_start: f(48),
                arg_end: f(49),
                env_start: f(50),
                env_end: f(51),
            };
            let cwd = proc.read_link("cwd").map_err(proc_err(pid, "cwd"))?;
            let exe_path = proc.read_link("exe").map_err(proc_err(pid, "exe"))?;
            cache.process_vals = counts.map(|c| (c, mm.clone(), cwd.clone(), exe_path.clone()));
            (mm, cwd, exe_path)
        }
    };
    mm.brk = cache.brk;
    // The auxiliary vector is set at exec and never changes.
    let auxv = match &cache.auxv {
        Some(a) if !refresh.process => a.clone(),
        _ => {
            let raw = proc.read("auxv").map_err(proc_err(pid, "auxv"))?;
            let a: Vec<u64> = raw
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            cache.auxv = Some(a.clone());
            a
        }
    };
    if refresh.fds {
        cache.rlimits = None;
        cache.fds.clear();
    }
    let rlimits = match &cache.rlimits {
        Some(r) => r.clone(),
        None => {
            let r = capture_rlimits(pid);
            cache.rlimits = Some(r.clone());
            r
        }
    };
    let t3 = Instant::now();
    let calls = counts.map(|c| c.1);
    let unchanged = !refresh.fds && calls.is_some() && calls == cache.fd_calls_seen;
    let fds = fds::capture(proc, Some(&mut cache.fds), unchanged)?;
    cache.fd_calls_seen = calls;
    let t4 = Instant::now();
    let creds = crate::creds::capture(proc, st, maps, &status, &mut cache.creds, refresh.creds)?;
    let count = |group| cache.calls.as_ref().map(|c| c.count(group));
    let (timer_calls, seccomp_calls) = (
        count(crate::syscount::TIMERS),
        count(crate::syscount::SECCOMP),
    );
    let names = &cache.names;
    let ns_tid = |t: Pid| names.get(&t).map(|n| n.0);
    let timers = crate::timers::capture(
        proc,
        st,
        maps,
        &mut cache.timers,
        timer_calls,
        refresh.timers,
        &ns_tid,
    )?;
    let seccomp = crate::seccomp::capture(
        proc,
        st,
        maps,
        &status,
        &mut cache.seccomp,
        seccomp_calls,
        refresh.seccomp,
        cache.own_filter,
        &ns_tid,
    )?;
    // Last: a signal that arrived during an injected call was raised again and is pending now.
    // When no thread ran during this capture and none kept a signal pending (blocked) at its
    // start, only a signal from outside can have arrived since the stop: it reads as sent
    // after this checkpoint (the process has not seen it, and it sees it after the resume),
    // so the check, which reads every thread's `status`, is skipped. What that skips, besides:
    // a signal pending since before the stop that `PTRACE_PEEKSIGINFO` does not list, which
    // happens only when the kernel could not queue its details (the sender's
    // RLIMIT_SIGPENDING exhausted, or no memory); the full refreshes still check.
    if refresh.pending || blocked_pending || st.ran != ran {
        final_pending_check(proc, st, &mut cache.status_files, &pending, blocked_pending)?;
    }
    cache.times = MetaTimes {
        checks: t1 - t0,
        threads: t2 - t1,
        process: t3 - t2,
        fds: t4 - t3,
        pending: t4.elapsed(),
        fds_reused: unchanged,
    };
    Ok(ProcessImage {
        pending: pending.shared,
        pid: threads[0].tid,
        comm: threads[0].comm.clone(),
        exe: FileRef {
            path: exe_path,
            size: 0,
            hash: [0; 32],
        },
        cwd,
        umask,
        rlimits,
        mm,
        auxv,
        vmas: Vec::new(),
        runs: Vec::new(),
        files: Vec::new(),
        threads,
        sigactions: cache.sigactions.clone(),
        fds,
        max_tid,
        sandbox: Vec::new(),
        base_epoch: None,
        reset: Vec::new(),
        pages: Vec::new(),
        cow: Vec::new(),
        private_files: Default::default(),
        creds,
        carried: Default::default(),
        timers,
        seccomp,
        shm: Vec::new(),
        pgid: 0,
        sid: 0,
        tree: Vec::new(),
        shared_files: Vec::new(),
        zombies: Vec::new(),
        scrub: None,
    })
}

/// clear_child_tid and the alternate signal stack have no outside interface: ask the thread.
fn inject_thread_values(st: &mut Stopped, maps: &[MapEntry], tid: Pid) -> Result<(u64, AltStack)> {
    let out = inject_ok(
        st,
        maps,
        tid,
        "prctl(PR_GET_TID_ADDRESS)",
        libc::SYS_prctl,
        [libc::PR_GET_TID_ADDRESS as u64, SCRATCH, 0, 0, 0, 0],
        8,
    )?;
    let clear_child_tid = u64::from_le_bytes(out[..8].try_into().unwrap());
    let out = inject_ok(
        st,
        maps,
        tid,
        "sigaltstack",
        libc::SYS_sigaltstack,
        [0, SCRATCH, 0, 0, 0, 0],
        24,
    )?;
    let altstack = AltStack {
        sp: u64::from_le_bytes(out[..8].try_into().unwrap()),
        flags: u32::from_le_bytes(out[8..12].try_into().unwrap()) & !1, // not SS_ONSTACK
        size: u64::from_le_bytes(out[16..24].try_into().unwrap()),
    };
    Ok((clear_child_tid, altstack))
}

/// [`Stopped::inject`] of a call that must succeed; returns the scratch bytes after it.
fn inject_ok(
    st: &mut Stopped,
    maps: &[MapEntry],
    tid: Pid,
    call: &'static str,
    nr: i64,
    args: [u64; 6],
    scratch_len: usize,
) -> Result<Vec<u8>> {
    let (r, _, out) = st.inject(maps, tid, nr, args, scratch_len)?;
    if r < 0 {
        return Err(CaptureError::Injected {
            call,
            tid,
            errno: -r,
        });
    }
    Ok(out)
}

/// (SigIgn, SigCgt) of the process, from its `status` text.
fn signal_masks(status: &str) -> (u64, u64) {
    let field = |k: &str| {
        procfs::status_value(status, k)
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .unwrap_or(0)
    };
    (field("SigIgn"), field("SigCgt"))
}

/// Fits a thread's XSAVE area (standard format, as `PTRACE_GETREGSET(NT_X86_XSTATE)` returns
/// it) into what the restore plan carries and what `rt_sigreturn` accepts.
///
/// The kernel reports the area at the size of *every* feature it manages, AMX included (11,008
/// bytes on CPUs with AMX), but a process that never asked for AMX (`ARCH_REQ_XCOMP_PERM`) has
/// a smaller signal-frame size (2,696 bytes with AVX-512 and PKRU), and a frame whose
/// `xstate_size` exceeds it is silently restored as legacy FP/SSE only. So the area is cut at
/// the end of the last component that fits under [`abi::XSTATE_MAX`] and is not dynamic (on
/// this project's machines: 2,816 bytes, AMX's tile configuration included, as the kernel's
/// default size), provided no component beyond the cut is in use (its `XSTATE_BV` bit set);
/// the software-reserved bytes
/// (`struct _fpx_sw_bytes` at offset 464) are rewritten to describe the cut area. Component
/// offsets come from CPUID leaf 0xD, as the kernel's own.
/// The user XSAVE components this CPU supports: (number, size, offset in the standard format,
/// XFD-enabled). From CPUID leaf 0xD, read once: CPUID traps to the hypervisor in a VM (17 µs
/// per call measured on this project's Firecracker VMs, ~1 ms for the 61 sub-leaves), which
/// every pause paid per thread before.
fn xsave_components() -> &'static [(u32, usize, usize, bool)] {
    static COMPONENTS: std::sync::OnceLock<Vec<(u32, usize, usize, bool)>> =
        std::sync::OnceLock::new();
    COMPONENTS.get_or_init(|| {
        (2..63u32)
            .filter_map(|i| {
                let r = std::arch::x86_64::__cpuid_count(0xD, i);
                let (size, offset) = (r.eax as usize, r.ebx as usize);
                // Size or offset 0: not supported, or a supervisor component (not in user
                // areas). ECX bit 2: the component is XFD-enabled ("dynamic", AMX tile data):
                // it is part of a process's signal frame only once the process asked for it.
                (size != 0 && offset != 0).then_some((i, size, offset, r.ecx & 4 != 0))
            })
            .collect()
    })
}

fn fit_xstate(mut xs: Vec<u8>) -> std::result::Result<Vec<u8>, String> {
    const HEADER_END: usize = 512 + 64; // legacy area + XSAVE header
    if xs.len() <= abi::XSTATE_MAX {
        return Ok(xs);
    }
    let word = |xs: &[u8], off: usize| u64::from_le_bytes(xs[off..off + 8].try_into().unwrap());
    let in_use = word(&xs, 512); // XSTATE_BV
    let mut cut = HEADER_END;
    let mut kept: u64 = 0b11; // x87 and SSE live in the legacy area
    for &(i, size, offset, dynamic) in xsave_components() {
        let end = offset + size;
        if !dynamic && end <= abi::XSTATE_MAX && end <= xs.len() {
            cut = cut.max(end);
            kept |= 1 << i;
        } else if in_use & (1 << i) != 0 {
            return Err(format!(
                "it uses XSAVE component {i} ({size} bytes at offset {offset}; AMX tiles are \
                 components 17-18), which does not fit the {} bytes a checkpoint carries",
                abi::XSTATE_MAX
            ));
        }
    }
    xs.truncate(cut);
    // _fpx_sw_bytes: magic1 (u32), extended_size (u32), xfeatures (u64), xstate_size (u32).
    if u32::from_le_bytes(xs[464..468].try_into().unwrap()) == 0x4650_5853 {
        let features = word(&xs, 472) & kept;
        xs[468..472].copy_from_slice(&(cut as u32 + 4).to_le_bytes());
        xs[472..480].copy_from_slice(&features.to_le_bytes());
        xs[480..484].copy_from_slice(&(cut as u32).to_le_bytes());
    }
    Ok(xs)
}

fn regs_to_vec(r: &Regs) -> Vec<u64> {
    // SAFETY: `Regs` is `repr(C)` of 27 u64 fields, no padding.
    unsafe { std::slice::from_raw_parts((r as *const Regs).cast::<u64>(), 27) }.to_vec()
}

pub(crate) fn regs_from_slice(v: &[u64]) -> Regs {
    let mut r = Regs::default();
    // SAFETY: `Regs` is `repr(C)` of 27 u64 fields; `v` has 27 words (checked at decode).
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), (&raw mut r).cast::<u64>(), 27) };
    r
}

/// Lets the kernel deliver every signal pending in a thread that does not block it: an
/// injected `getpid` in such a thread meets the signal first, and [`Stopped::inject`] has the
/// kernel deliver it (the thread stops again at its handler's entry) before running the call.
/// Cheaper than resuming the process and stopping it again, which the callers still do when a
/// signal stays pending (blocked ones, or one that arrives meanwhile: see
/// [`final_pending_check`], which also sees signals queued without details).
/// Returns whether a signal stays pending that this could not deliver (blocked, or still
/// arriving after three rounds).
///
/// The threads' state is read after this: from its end on, injected calls hold signals
/// ([`Stopped::calls_hold_signals`]) instead of letting the kernel deliver them.
fn deliver_pending_signals(st: &mut Stopped, maps: &[MapEntry]) -> Result<bool> {
    st.calls_hold_signals = false;
    let r = deliver_pending_signals_now(st, maps);
    st.calls_hold_signals = true;
    r
}

fn deliver_pending_signals_now(st: &mut Stopped, maps: &[MapEntry]) -> Result<bool> {
    for _ in 0..3 {
        let (mut any, mut blocked) = (false, false);
        let shared = match st.tids.first() {
            Some(&t) => st.peek_pending(t, true)?,
            None => None,
        };
        for &tid in &st.tids.clone() {
            let Some(sig) = st.peek_pending(tid, false)?.or(shared) else {
                continue;
            };
            if st.sigmask(tid)? & (1u64 << (sig - 1)) == 0 {
                any = true;
                st.inject(maps, tid, libc::SYS_getpid, [0; 6], 0)?;
            } else {
                blocked = true;
            }
        }
        if !any {
            return Ok(blocked);
        }
    }
    Ok(true)
}

/// The signals pending in the process (queued but not yet delivered) and recorded with their
/// details: the process's queue and each thread's, oldest first.
#[derive(Debug, Default, PartialEq)]
struct Pending {
    shared: Vec<PendingSignal>,
    /// Only threads with a signal of their own pending.
    threads: HashMap<Pid, Vec<PendingSignal>>,
}

/// The signal mask of the signals in `list`.
fn mask_of(list: &[PendingSignal]) -> u64 {
    list.iter()
        .fold(0, |m, p| m | 1u64 << (p.signo.clamp(1, 64) - 1))
}

/// Reads every pending signal's details (`PTRACE_PEEKSIGINFO`) of the process's queue and of
/// each thread's.
fn read_pending(st: &Stopped) -> Result<Pending> {
    let queue = |tid: Pid, shared: bool| -> Result<Vec<PendingSignal>> {
        let raw = st.peek_all_pending(tid, shared, PENDING_MAX)?;
        if raw.len() > PENDING_MAX {
            return Err(CaptureError::Unsupported(format!(
                "more than {PENDING_MAX} signals are pending in {}",
                if shared {
                    "the process".to_string()
                } else {
                    format!("thread {tid}")
                }
            )));
        }
        let q: Vec<PendingSignal> = raw
            .into_iter()
            .map(|info| PendingSignal {
                signo: PendingSignal::signo_of(&info),
                info: info.to_vec(),
            })
            .collect();
        // One that cannot be blocked is taken as soon as the process runs: a round later it is
        // gone.
        if let Some(p) = q.iter().find(|p| PendingSignal::unblockable(p.signo)) {
            return Err(CaptureError::PendingSignals(vec![signal_name(p.signo)]));
        }
        Ok(q)
    };
    let mut p = Pending::default();
    if let Some(&first) = st.tids.first() {
        p.shared = queue(first, true)?;
    }
    for &tid in &st.tids {
        let q = queue(tid, false)?;
        if !q.is_empty() {
            p.threads.insert(tid, q);
        }
    }
    Ok(p)
}

/// The capture's last check of the signals pending now against `recorded`, the ones read at
/// its start (after the delivery of what could be delivered), which go into the image.
///
/// A signal that arrived since then, sent by another process (`kill`, `sigqueue`, `tgkill`),
/// is left out of the image: the process is stopped and has not seen it, so it counts as sent
/// just after the moment the checkpoint stands for; it stays queued, the process meets it after
/// the resume, and the next checkpoint records it if it is still pending. No thread of the tree
/// can have sent it (they are all stopped, and the injected calls send nothing). Taking it so,
/// instead of reading the process again, is what bounds the pause under a steady stream of
/// signals: a stream faster than one signal per round used to make every round start over
/// until the epoch failed.
///
/// Anything else refuses the capture by name (the caller reads the process again, after a
/// resume if it must): a signal the kernel raised for an event of its own (a timer's: its
/// arrival and the timer's re-arming go together, so the timer read earlier may not agree; a
/// child's; I/O), a record no longer a prefix of its queue, or a signal pending without the
/// details a restore needs to queue it again. `read_again`: a recorded queue may have grown
/// without the masks showing it (a real-time signal is queued as often as it is sent), so the
/// details are read again whatever the masks say.
fn final_pending_check(
    proc: &Proc,
    st: &Stopped,
    files: &mut HashMap<String, std::fs::File>,
    recorded: &Pending,
    read_again: bool,
) -> Result<()> {
    // The masks first, the details after: nothing leaves a queue while the process is
    // stopped, so whatever the masks show has its details in `now` (if it has any).
    let masks = pending_masks(proc, files, &st.tids)?;
    let mut missing = masks.beyond(recorded);
    if missing != 0 || read_again {
        let now = read_pending(st)?;
        if now != *recorded {
            only_late_arrivals(recorded, &now, st.reraised)?;
        }
        missing = masks.beyond(&now);
    }
    if missing != 0 {
        return Err(CaptureError::PendingSignals(
            (0..64)
                .filter(|b| missing & (1 << b) != 0)
                .map(|b| signal_name(b + 1))
                .collect(),
        ));
    }
    Ok(())
}

/// The kernel's own masks of pending signals (`status`: `ShdPnd` for the process's queue,
/// `SigPnd` for each thread's), which also show a signal queued without details
/// (`PTRACE_PEEKSIGINFO` does not list it: the sender's `RLIMIT_SIGPENDING` was exhausted).
struct PendingMasks {
    shared: u64,
    threads: Vec<(Pid, u64)>,
}

impl PendingMasks {
    /// The signals these masks show that `list` has no details of.
    fn beyond(&self, list: &Pending) -> u64 {
        let mut all = self.shared & !mask_of(&list.shared);
        for &(t, m) in &self.threads {
            all |= m & !list.threads.get(&t).map_or(0, |l| mask_of(l));
        }
        all
    }
}

fn pending_masks(
    proc: &Proc,
    files: &mut HashMap<String, std::fs::File>,
    tids: &[Pid],
) -> Result<PendingMasks> {
    let pid = proc.pid;
    let mut parse = |path: String, key: &str| -> Result<u64> {
        let text = read_status(proc, files, &path).map_err(proc_err(pid, key.to_string()))?;
        let v = crate::procfs::status_value(&text, key)
            .ok_or_else(|| CaptureError::Unsupported(format!("{path}: no field {key}")))?;
        u64::from_str_radix(v, 16).map_err(|e| CaptureError::Unsupported(format!("{key}: {e}")))
    };
    let shared = parse("status".into(), "ShdPnd")?;
    let mut threads = Vec::with_capacity(tids.len());
    for &t in tids {
        threads.push((t, parse(format!("task/{t}/status"), "SigPnd")?));
    }
    Ok(PendingMasks { shared, threads })
}

/// `now` is `recorded` with signals sent by other processes after it, each queue's record a
/// prefix of the queue; otherwise the signals that break that, by name. `reraised`: the
/// signals this capture queued again itself (their details say `SI_TKILL` from us, whatever
/// sent them: a timer's `SIGALRM`, say, whose timer was read before it was taken), never a
/// late arrival.
fn only_late_arrivals(recorded: &Pending, now: &Pending, reraised: u64) -> Result<()> {
    let mut bad: Vec<u32> = Vec::new();
    let mut queue = |was: &[PendingSignal], is: &[PendingSignal]| {
        if is.len() < was.len() || is[..was.len()] != *was {
            bad.extend(is.iter().chain(was).map(|p| p.signo));
        } else {
            bad.extend(
                is[was.len()..]
                    .iter()
                    .filter(|p| {
                        !p.sent_by_a_process()
                            || reraised & (1u64 << (p.signo.wrapping_sub(1) & 63)) != 0
                    })
                    .map(|p| p.signo),
            );
        }
    };
    queue(&recorded.shared, &now.shared);
    let tids: std::collections::BTreeSet<Pid> = recorded
        .threads
        .keys()
        .chain(now.threads.keys())
        .copied()
        .collect();
    for t in tids {
        let none = Vec::new();
        queue(
            recorded.threads.get(&t).unwrap_or(&none),
            now.threads.get(&t).unwrap_or(&none),
        );
    }
    if bad.is_empty() {
        return Ok(());
    }
    bad.sort_unstable();
    bad.dedup();
    Err(CaptureError::PendingSignals(
        bad.into_iter().map(signal_name).collect(),
    ))
}

/// A `/proc` file of the process (`rel`: `status`, `task/TID/status`), read whole from a
/// descriptor kept in `files` (opened the first time). A kept descriptor that fails (its thread
/// exited) is dropped and the file opened again once, so that the error is the path's own.
fn read_status(
    proc: &Proc,
    files: &mut HashMap<String, std::fs::File>,
    rel: &str,
) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt;
    let read = |f: &std::fs::File| -> std::io::Result<String> {
        let mut buf = vec![0u8; 4096];
        let mut n = 0;
        loop {
            if n == buf.len() {
                buf.resize(buf.len() * 2, 0);
            }
            match f.read_at(&mut buf[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(n);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    if let Some(f) = files.get(rel) {
        match read(f) {
            Ok(text) => return Ok(text),
            Err(_) => {
                files.remove(rel);
            }
        }
    }
    let f = proc.open_file(rel, libc::O_RDONLY)?;
    let text = read(&f)?;
    files.insert(rel.to_string(), f);
    Ok(text)
}

/// `SIGUSR1` for 10, `SIGRTMIN+3` for 37.
fn signal_name(s: u32) -> String {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match s {
        1..=31 => NAMES[s as usize - 1].to_string(),
        34.. => format!("SIGRTMIN+{}", s - 34),
        _ => format!("signal {s}"),
    }
}

/// Why a process with children is refused where trees are not captured (the epoch loop).
const CHILDREN_REFUSED: &str = "process trees (fork) are not supported yet";

/// The host PIDs of the children of `proc`'s threads `tids`, in the order the kernel lists them.
pub(crate) fn children_of(proc: &Proc, tids: &[Pid]) -> Vec<Pid> {
    let mut children = Vec::new();
    for t in tids {
        let c = proc
            .read_string(&format!("task/{t}/children"))
            .unwrap_or_default();
        children.extend(c.split_whitespace().filter_map(|p| p.parse::<Pid>().ok()));
    }
    children
}

/// The process group and session of `proc` in the sandbox's PID namespace (the last number of
/// `NSpgid` and `NSsid`; 0 when the group or session lies outside it).
pub(crate) fn group_and_session(proc: &Proc) -> Result<(i32, i32)> {
    let status = proc
        .read_string("status")
        .map_err(proc_err(proc.pid, "status"))?;
    let last = |key| procfs::status_ns_last(&status, key).unwrap_or(0);
    Ok((last("NSpgid"), last("NSsid")))
}

/// Process-level state this checkpointer cannot restore yet: refuse it by name rather than
/// produce a checkpoint that restores into something different. `known`: the children the
/// epoch loop's chain began with (see [`MetaCache::children`]).
fn check_supported(proc: &Proc, tids: &[Pid], known: Option<&[Pid]>) -> Result<()> {
    let mut now = children_of(proc, tids);
    if let Some(known) = known {
        now.sort_unstable();
        if now != known {
            return Err(CaptureError::ChildrenChanged(format!(
                "process {} (host PID) has children {now:?}, the loop knew {known:?}",
                proc.pid
            )));
        }
        return Ok(());
    }
    let children: Vec<String> = now.iter().map(|c| c.to_string()).collect();
    if !children.is_empty() {
        return Err(CaptureError::Unsupported(format!(
            "the service has child processes (host PIDs {}); {CHILDREN_REFUSED}",
            children.join(", ")
        )));
    }
    // Seccomp filters (crate::seccomp), POSIX timers (crate::timers) and inotify
    // (crate::inotify) are captured; what of them is not is refused there, by name.
    Ok(())
}

fn capture_sigactions(
    st: &mut Stopped,
    maps: &[MapEntry],
    tid: Pid,
    (ign, cgt): (u64, u64),
) -> Result<Vec<SigAction>> {
    let interesting = ign | cgt;
    let mut out = Vec::new();
    for signo in 1..=64u32 {
        if interesting & (1 << (signo - 1)) == 0 || signo == 9 || signo == 19 {
            continue;
        }
        let buf = inject_ok(
            st,
            maps,
            tid,
            "rt_sigaction",
            libc::SYS_rt_sigaction,
            [signo as u64, 0, SCRATCH, 8, 0, 0],
            32,
        )?;
        let w = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap());
        out.push(SigAction {
            signo,
            handler: w(0),
            flags: w(1),
            restorer: w(2),
            mask: w(3),
        });
    }
    Ok(out)
}

fn capture_rlimits(pid: Pid) -> Vec<(u32, u64, u64)> {
    let mut v = Vec::new();
    for res in 0..16u32 {
        let mut lim = libc::rlimit64 {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: prlimit64 with a NULL new limit only writes `lim`.
        let r = unsafe { libc::prlimit64(pid, res as _, std::ptr::null(), &mut lim) };
        if r == 0 {
            v.push((res, lim.rlim_cur, lim.rlim_max));
        }
    }
    v
}

/// Mappings, saved runs, their contents, and the mapped files to identify after the pause.
type CapturedMemory = (Vec<Vma>, Vec<PageRun>, Vec<u8>, Vec<PendingFile>);

/// Walks the mappings, decides what each needs, and copies the saved pages.
fn capture_memory(proc: &Proc, maps: &[MapEntry], data: Vec<u8>) -> Result<CapturedMemory> {
    let (vmas, mut files) = describe_vmas(maps)?;
    for f in &mut files {
        f.open(proc)?;
    }
    let (runs, data) = copy_saved(proc, maps, &vmas, data)?;
    Ok((vmas, runs, data, files))
}

/// Copies the pages a full checkpoint saves of `maps` (which [`describe_vmas`] described as
/// `vmas`) into `data`; returns their runs.
pub(crate) fn copy_saved(
    proc: &Proc,
    maps: &[MapEntry],
    vmas: &[Vma],
    data: Vec<u8>,
) -> Result<(Vec<PageRun>, Vec<u8>)> {
    let pid = proc.pid;
    // (addr, len, readable) of every range to save.
    let mut want: Vec<(u64, u64, bool)> = Vec::new();
    let pagemap = proc
        .open_file("pagemap", libc::O_RDONLY)
        .map_err(proc_err(pid, "pagemap"))?;
    let mut pm_buf: Vec<u64> = Vec::new();
    let swap = crate::track::swap_active();
    for (m, v) in maps.iter().filter(|m| m.name != "[vsyscall]").zip(vmas) {
        if v.backing == Backing::Vdso || m.shared {
            continue; // recreated by the kernel, or the file holds the data
        }
        saved_ranges(&pagemap, swap, m, &mut pm_buf, &mut want)
            .map_err(proc_err(pid, "pagemap"))?;
    }
    copy_ranges(proc, &want, data)
}

/// Is this mapping private memory that write tracking covers (not the vDSO, not shared)?
pub(crate) fn trackable(m: &MapEntry) -> bool {
    !m.shared
        && !matches!(
            m.name.as_str(),
            "[vvar]" | "[vvar_vclock]" | "[vdso]" | "[vsyscall]"
        )
}

/// The image's description of each mapping (all but `[vsyscall]`, in order), and the mapped
/// files to identify. Refuses mappings it cannot restore.
pub(crate) fn describe_vmas(maps: &[MapEntry]) -> Result<(Vec<Vma>, Vec<PendingFile>)> {
    let mut vmas = Vec::new();
    let mut files: Vec<PendingFile> = Vec::new();
    let mut file_index: HashMap<String, u32> = HashMap::new();
    for m in maps {
        let name = m.name.as_str();
        if name == "[vsyscall]" {
            continue;
        }
        let vdso = matches!(name, "[vvar]" | "[vvar_vclock]" | "[vdso]");
        for (flag, what) in [
            ("ht", "hugetlb mapping"),
            ("io", "I/O memory mapping"),
            ("pf", "PFN mapping"),
            ("ss", "shadow stack"),
            ("um", "userfaultfd-registered mapping (missing mode)"),
        ] {
            if m.has_flag(flag) && !vdso {
                return Err(CaptureError::Unsupported(format!(
                    "{what} at {:#x}-{:#x} ({name})",
                    m.start, m.end
                )));
            }
        }
        let mut flags = 0u32;
        for (f, bit) in [
            ("gd", abi::VMA_GROWSDOWN),
            ("dc", abi::VMA_DONTFORK),
            ("wf", abi::VMA_WIPEONFORK),
            ("dd", abi::VMA_DONTDUMP),
            ("hg", abi::VMA_HUGEPAGE),
            ("nh", abi::VMA_NOHUGEPAGE),
        ] {
            if m.has_flag(f) {
                flags |= bit;
            }
        }
        let file_backed = is_file_backed(m);
        // Shared anonymous memory (the kernel shows it as a deleted /dev/zero) and System V
        // segments (/SYSV...) are objects of their own (`crate::shm`), captured once each.
        let shm = crate::shm::object_of(m);
        if let Some(ShmId::Sysv(id)) = shm {
            // Restored with `shmat` at the attachment's start and cut to the pieces the
            // process kept: the attachment's first page must still be there.
            let head = m.start.checked_sub(m.offset);
            if !maps
                .iter()
                .any(|h| crate::shm::object_of(h) == shm && h.offset == 0 && Some(h.start) == head)
            {
                return Err(CaptureError::Unsupported(format!(
                    "System V segment {id} mapped at {:#x} without the start of its attachment \
                     (the start was unmapped)",
                    m.start
                )));
            }
            // Attached read-only (`SHM_RDONLY`): no write permission, ever.
            if !m.has_flag("mw") {
                flags |= abi::VMA_SHM_RDONLY;
            }
        } else if m.shared && (!file_backed || name.starts_with("/SYSV")) {
            return Err(CaptureError::Unsupported(format!(
                "shared mapping at {:#x}-{:#x} ({}) of an unknown kind",
                m.start,
                m.end,
                if name.is_empty() { "anonymous" } else { name }
            )));
        }
        if shm.is_none() && file_backed && name.ends_with(" (deleted)") {
            return Err(CaptureError::Unsupported(format!(
                "mapping at {:#x} of a deleted file {name}",
                m.start
            )));
        }
        let backing = if vdso {
            Backing::Vdso
        } else if let Some(id) = shm {
            Backing::Shm {
                id,
                offset: m.offset,
            }
        } else if file_backed {
            let next = files.len() as u32;
            let index = *file_index.entry(name.to_string()).or_insert_with(|| {
                files.push(PendingFile {
                    path: name.to_string(),
                    map_file: format!("map_files/{:x}-{:x}", m.kernel.0, m.kernel.1),
                    inode: m.inode,
                    opened: None,
                });
                next
            });
            Backing::File {
                index,
                offset: m.offset,
            }
        } else {
            Backing::Anon
        };
        vmas.push(Vma {
            start: m.start,
            end: m.end,
            prot: m.prot(),
            shared: m.shared,
            flags,
            backing,
            name: name.to_string(),
        });
    }
    Ok((vmas, files))
}

pub(crate) fn is_file_backed(m: &MapEntry) -> bool {
    m.inode != 0 && m.name.starts_with('/')
}

/// Appends the ranges of `m` to save: pages that exist (present or swapped) and, for file
/// mappings, only those copied on write (not backed by the file's page cache).
fn saved_ranges(
    pagemap: &std::fs::File,
    swap: bool,
    m: &MapEntry,
    pm_buf: &mut Vec<u64>,
    want: &mut Vec<(u64, u64, bool)>,
) -> io::Result<()> {
    let file_backed = is_file_backed(m);
    let n = ((m.end - m.start) / PAGE) as usize;
    pm_buf.resize(n, 0);
    read_pagemap(pagemap, m.start, pm_buf)?;
    let keep = |e: u64| {
        let present = e & (1 << 63) != 0;
        // Without swap, "swapped" is a userfaultfd marker on an empty entry (see track.rs).
        let swapped = swap && e & (1 << 62) != 0;
        let file_page = e & (1 << 61) != 0;
        swapped || (present && !(file_backed && file_page))
    };
    let mut i = 0;
    while i < n {
        if !keep(pm_buf[i]) {
            i += 1;
            continue;
        }
        let s = i;
        while i < n && keep(pm_buf[i]) {
            i += 1;
        }
        want.push((m.start + s as u64 * PAGE, (i - s) as u64 * PAGE, m.read));
    }
    Ok(())
}

/// Copies `want` ranges (addr, len, readable) into `data` (grown if needed); returns their runs.
pub(crate) fn copy_ranges(
    proc: &Proc,
    want: &[(u64, u64, bool)],
    mut data: Vec<u8>,
) -> Result<(Vec<PageRun>, Vec<u8>)> {
    let pid = proc.pid;
    // Copy: readable ranges with process_vm_readv in large batches, the rest via /proc/PID/mem
    // (which ignores protections).
    tracing::debug!(runs = want.len(), "memory runs to copy");
    let total: u64 = want.iter().map(|w| w.1).sum();
    // Normally the buffer is large enough (prefaulted for a full checkpoint, reused from the
    // last epoch in the loop). If not, it is replaced, not grown by `resize`: a reallocation
    // is not advised for huge pages, and with 4 KiB pages every page copied into it costs a
    // TLB miss (~0.2 µs a page, `bench/copy_dest.c`). The headroom spares the next epochs.
    let total_bytes = total as usize;
    if data.capacity() < total_bytes {
        data = prefaulted_buffer(total_bytes + total_bytes / 2);
    }
    data.resize(total_bytes, 0);
    let mut runs = Vec::with_capacity(want.len());
    let mut off = 0u64;
    let mut batch: Vec<(u64, u64)> = Vec::new();
    let mut batch_off = 0u64;
    // `/proc/PID/mem`, opened only if needed: most copies never fall back to it, and an open
    // of a `/proc` file costs a few microseconds of the pause.
    let mem_file = std::cell::OnceCell::new();
    let mem = || -> Result<&std::fs::File> {
        if let Some(f) = mem_file.get() {
            return Ok(f);
        }
        let f = proc
            .open_file("mem", libc::O_RDONLY)
            .map_err(proc_err(pid, "mem"))?;
        Ok(mem_file.get_or_init(|| f))
    };
    let flush = |batch: &mut Vec<(u64, u64)>, at: u64, data: &mut [u8]| -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let len: u64 = batch.iter().map(|b| b.1).sum();
        let dst = &mut data[at as usize..(at + len) as usize];
        if sys::read_remote_vectored(pid, batch, dst).is_err() {
            // Some page turned unreadable: read each range through /proc/PID/mem instead.
            let mut o = 0usize;
            for &(a, l) in batch.iter() {
                read_mem(mem()?, a, &mut dst[o..o + l as usize])
                    .map_err(proc_err(pid, format!("memory at {a:#x}")))?;
                o += l as usize;
            }
        }
        batch.clear();
        Ok(())
    };
    for &(addr, len, readable) in want {
        runs.push(PageRun {
            addr,
            len,
            data_off: off,
        });
        if readable {
            if batch.is_empty() {
                batch_off = off;
            }
            batch.push((addr, len));
            if batch.len() >= 1024 {
                flush(&mut batch, batch_off, &mut data)?;
            }
        } else {
            flush(&mut batch, batch_off, &mut data)?;
            read_mem(mem()?, addr, &mut data[off as usize..(off + len) as usize])
                .map_err(proc_err(pid, format!("memory at {addr:#x}")))?;
        }
        off += len;
    }
    flush(&mut batch, batch_off, &mut data)?;
    Ok((runs, data))
}

fn read_pagemap(f: &std::fs::File, start: u64, out: &mut [u64]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    // SAFETY: u64 has no invalid bit patterns; we view the slice as bytes to fill it.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 8) };
    f.read_exact_at(bytes, start / PAGE * 8)
}

fn read_mem(f: &std::fs::File, addr: u64, out: &mut [u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.read_exact_at(out, addr)
}

/// Removes all-zero pages of anonymous mappings from the saved data: a fresh anonymous mapping
/// reads as zero already. (File-backed private pages keep their zeroes: the file differs.)
/// The shared memory objects' runs (which hold no zero page) move with the data.
pub(crate) fn drop_zero_pages(image: &mut ProcessImage, data: &mut Vec<u8>) {
    let anon = |addr: u64| {
        image
            .vmas
            .iter()
            .find(|v| v.start <= addr && addr < v.end)
            .is_some_and(|v| v.backing == Backing::Anon)
    };
    let mut out_runs = Vec::with_capacity(image.runs.len());
    let mut w = 0usize;
    for r in &image.runs {
        let is_anon = anon(r.addr);
        let mut cur: Option<PageRun> = None;
        for p in 0..(r.len / PAGE) {
            let src = (r.data_off + p * PAGE) as usize;
            let page = &data[src..src + PAGE as usize];
            if is_anon && page.iter().all(|&b| b == 0) {
                if let Some(c) = cur.take() {
                    out_runs.push(c);
                }
                continue;
            }
            data.copy_within(src..src + PAGE as usize, w);
            match &mut cur {
                Some(c) => c.len += PAGE,
                None => {
                    cur = Some(PageRun {
                        addr: r.addr + p * PAGE,
                        len: PAGE,
                        data_off: w as u64,
                    })
                }
            }
            w += PAGE as usize;
        }
        if let Some(c) = cur {
            out_runs.push(c);
        }
    }
    // Compacting only moves bytes towards the front: each run's bytes are still in place.
    for r in image.shm.iter_mut().flat_map(|o| o.runs.iter_mut()) {
        let (src, len) = (r.data_off as usize, r.len as usize);
        data.copy_within(src..src + len, w);
        r.data_off = w as u64;
        w += len;
    }
    data.truncate(w);
    image.runs = out_runs;
}

#[cfg(test)]
mod xstate_tests {
    use super::*;

    /// On a CPU whose XSAVE area exceeds what a checkpoint carries (AMX), an area whose AMX
    /// components are unused is cut and described as cut; one that uses them is refused.
    #[test]
    fn large_xsave_areas_are_cut_or_refused() {
        let tile = std::arch::x86_64::__cpuid_count(0xD, 18);
        let full = (tile.ebx + tile.eax) as usize;
        if tile.eax == 0 || full <= abi::XSTATE_MAX {
            eprintln!("no AMX on this CPU: nothing to cut");
            return;
        }
        let mut xs = vec![0u8; full];
        xs[464..468].copy_from_slice(&0x4650_5853u32.to_le_bytes());
        xs[472..480].copy_from_slice(&((1u64 << 19) - 1).to_le_bytes());
        xs[512..520].copy_from_slice(&0b111u64.to_le_bytes()); // x87, SSE, AVX in use
        let cut = fit_xstate(xs.clone()).expect("unused AMX state is cut");
        assert!(
            cut.len() <= abi::XSTATE_MAX && cut.len() >= 832,
            "{}",
            cut.len()
        );
        let sw = |o: usize| u32::from_le_bytes(cut[o..o + 4].try_into().unwrap());
        assert_eq!(
            sw(480) as usize,
            cut.len(),
            "xstate_size describes the cut area"
        );
        let features = u64::from_le_bytes(cut[472..480].try_into().unwrap());
        assert_eq!(
            features & (1 << 18),
            0,
            "AMX tile data dropped from xfeatures"
        );
        assert_eq!(features & 0b111, 0b111);
        xs[512..520].copy_from_slice(&(0b111u64 | 1 << 18).to_le_bytes());
        assert!(fit_xstate(xs).is_err(), "live AMX tiles are refused");
    }

    /// Each group of the periodic check is read again once per period (each thread's values
    /// too), and with a period of ten epochs or more no pause reads more than one group.
    #[test]
    fn staggered_refresh_reads_each_group_once_per_period_one_group_a_pause() {
        let groups = |r: Refresh| {
            [
                r.layout,
                r.children,
                r.threads != Threads::None,
                r.signals,
                r.process,
                r.fds,
                r.creds,
                r.timers,
                r.seccomp,
                r.pending,
            ]
        };
        for every in [1u64, 3, 5, 10, 16, 25, 100, 250] {
            let mut count = [0u32; 10];
            let mut per_thread = [0u32; 13];
            for epoch in 1..=2 * every {
                let r = Refresh::staggered(epoch, every);
                let due = groups(r);
                let n = due.iter().filter(|&&d| d).count();
                if every >= 10 {
                    assert!(
                        n <= 1,
                        "period {every}, epoch {epoch}: {n} groups in one pause"
                    );
                }
                for (c, d) in count.iter_mut().zip(due) {
                    *c += d as u32;
                }
                for (i, c) in per_thread.iter_mut().enumerate() {
                    *c += r.threads.due(i) as u32;
                }
            }
            count[2] = 2; // counted per thread below
            assert_eq!(
                count, [2; 10],
                "period {every}: each group twice in two periods"
            );
            assert_eq!(
                per_thread, [2; 13],
                "period {every}: each thread's values twice in two periods"
            );
        }
        assert!(Refresh::staggered(100, 100).layout);
        assert_eq!(Refresh::staggered(7, 0), Refresh::NONE, "0: never");
        assert!(Refresh::ALL.threads.due(12));
    }
}
