//! Full checkpoint of a running process: stop every thread, read what changes while it runs
//! (memory, registers, handles), resume, then finish the work that does not need it stopped.
//!
//! The pause covers: stopping threads, per-thread registers, the injected system calls, the
//! memory copy and the descriptor table. Hashing mapped files and dropping zero pages happen
//! after the process runs again.

use crate::abi;
use crate::fds;
use crate::image::*;
use crate::procfs::{self, MapEntry, Proc};
use crate::ptrace::{PtraceError, SCRATCH, Stopped, regs_to_vec};
use crate::sys::{self, Pid};
use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

mod end;
mod memory;
mod process;
mod signals;
mod threads;
pub mod tree;

pub(crate) use memory::*;
pub(crate) use process::*;
use signals::*;
use threads::*;

pub use crate::os::error::CaptureError;
pub(crate) use crate::os::error::proc_err;
use crate::os::filehash::cached_hash;
use crate::os::ranges::PAGE;
pub use end::Handover;

type Result<T> = std::result::Result<T, CaptureError>;

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

/// Takes a full checkpoint of process `pid` (and its tree) that carries its TCP connections,
/// and ends the service (see [`end`]): `handover` gets the checkpoint while every process is
/// still stopped; once it returns `Ok`, the connections are silenced and the processes
/// killed, so that a restore of the checkpoint carries the connections on. If it fails, the
/// service resumes untouched and the error is returned.
///
/// The caller must hold the packets *to* the service from before this call until it returns
/// (the instance's output gate does, with `Gate::hold_input`): the kernel acknowledges what
/// arrives, and an acknowledgement sent after the connections were read would be a promise
/// the checkpoint does not keep.
pub fn checkpoint_and_end(
    pid: Pid,
    private_dirs: &[String],
    handover: Handover,
) -> Result<(Checkpoint, CaptureStats)> {
    procfs::in_view(pid, |proc| attempts(proc, 0, private_dirs, Some(handover)))
        .map_err(proc_err(pid, "the sandbox's view"))?
}

/// [`checkpoint`] for a caller already inside [`procfs::in_view`].
pub fn checkpoint_in_view(
    proc: &Proc,
    epoch: u64,
    private_dirs: &[String],
) -> Result<(Checkpoint, CaptureStats)> {
    attempts(proc, epoch, private_dirs, None)
}

/// A one-shot checkpoint, tried again while a signal or an inotify event arrives at the stop
/// (or the process forks between the look and the stop); ending the service if `end` is given.
fn attempts(
    proc: &Proc,
    epoch: u64,
    private_dirs: &[String],
    mut end: Option<Handover>,
) -> Result<(Checkpoint, CaptureStats)> {
    let mut attempt = 0;
    loop {
        // A service without children takes the single-process path; one that forks between
        // this look and the stop is refused there by name and tried again as a tree.
        let forked = !children_of(proc, &proc.tids().unwrap_or_default()).is_empty();
        let once = end.as_mut().map(|h| &mut **h as Handover);
        let r = if forked {
            tree::checkpoint_tree(proc, epoch, private_dirs, once)
        } else {
            checkpoint_once(proc, epoch, private_dirs, once)
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
    end: Option<Handover>,
) -> Result<(Checkpoint, CaptureStats)> {
    let mut stats = CaptureStats::default();
    // The copy destination is faulted in before the pause: a fresh 100 MB buffer would otherwise
    // cost ~25,000 page faults inside it.
    let buf = prefaulted_buffer(estimate_private_bytes(proc));
    let t0 = Instant::now();
    let mut st = Stopped::stop(proc)?;
    stats.quiesce = t0.elapsed();
    stats.threads = st.tids.len();
    let ending = end.is_some();
    let captured = capture_stopped(proc, &mut st, &mut stats, buf, false).and_then(|(mut c, _)| {
        // Inside the pause: the files consistent with the memory.
        c.0.private_files = private_tree(proc, private_dirs)?;
        // The connections only when the service ends here (`end`). Otherwise `image.tcp`
        // stays empty (a restore resets them): the process runs on, and whatever it then
        // sends or closes its clients see, which a restore of this moment would contradict.
        // The epoch loop carries them, whose output gate holds everything sent after the
        // checkpoint (see `crate::tcp`).
        if ending {
            c.0.tcp = crate::tcp::Connections::default()
                .capture(proc.pid, &c.0.fds)
                .conns;
        }
        Ok(c)
    });
    if let Some(handover) = end {
        // Still stopped: finish the checkpoint, hand it over, then end the service.
        let ck = captured.and_then(|(mut image, mut data, file_ids)| {
            finish_full(proc, &mut image, &mut data, file_ids)?;
            stats.saved_bytes = data.len() as u64;
            Ok(Checkpoint::full(epoch, image, data))
        });
        let r = end::hand_over(&[proc], vec![st], ck, handover);
        stats.pause = t0.elapsed();
        return r.map(|ck| (ck, stats));
    }
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
        tcp: Vec::new(),
    })
}
