//! The checkpoint format.
//!
//! On the wire a checkpoint is
//! ```text
//! magic "TARDICKP" | version u32 | flags u32 | epoch u64 | meta_len u64 | data_len u64 |
//! meta (postcard-encoded `ProcessImage`) | data (raw page contents) | crc32 u32 (of all above)
//! ```
//! A reader checks magic, version, lengths and checksum before it looks at anything else, so a
//! truncated or corrupted file is refused before any process is started.

use crate::delta::PageEncoding;
use serde::{Deserialize, Serialize};
use std::io::{self, Write};

pub const MAGIC: &[u8; 8] = b"TARDICKP";

/// The socket types the format names (Linux's values; this crate does not link libc).
mod libc_types {
    pub const SOCK_STREAM: i32 = 1;
    pub const SOCK_DGRAM: i32 = 2;
    pub const SOCK_SEQPACKET: i32 = 5;
}
/// Version of the encoding; bumped on every incompatible change (3: POSIX timers and interval
/// timers, the service's own seccomp filters, inotify descriptors; incremental checkpoints leave
/// out the metadata that equals their base's, `Carried`; 4: shared memory objects, `shm`, and
/// mappings of them, `Backing::Shm`; 5: process trees, `tree`, and each process's group and
/// session, `pgid` and `sid`; 6: open file descriptions held by several processes of a tree,
/// `shared_files`, named by `FdKind::Shared`; 7: a tree's shared memory objects listed once, by
/// the main process, and named by every process's mappings of them; 8: children that exited
/// and were not reaped, `zombies`; 9: signals queued and not yet delivered, `pending`).
pub const FORMAT_VERSION: u32 = 10;
const HEADER_LEN: usize = 8 + 4 + 4 + 8 + 8 + 8;
/// Largest XSAVE area a thread may carry (the restorer's `abi::XSTATE_MAX`, which the
/// checkpointer checks equals this).
pub const XSTATE_MAX: usize = 4096;

/// Errors reading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("the file is empty (not a Tardi checkpoint)")]
    Empty,
    #[error("reading the checkpoint: {0}")]
    Io(String),
    #[error("not a Tardi checkpoint (bad magic bytes)")]
    BadMagic,
    #[error(
        "checkpoint format version {found} is not supported (this build reads version {FORMAT_VERSION})"
    )]
    Version { found: u32 },
    #[error("checkpoint is truncated: expected {expected} bytes, found {found}")]
    Truncated { expected: u64, found: u64 },
    #[error(
        "checkpoint is corrupted: checksum mismatch (stored {stored:08x}, computed {computed:08x})"
    )]
    Checksum { stored: u32, computed: u32 },
    #[error("checkpoint metadata is malformed: {0}")]
    Meta(String),
}

/// A full checkpoint stands alone; an incremental one turns the state at epoch `base` into the
/// state at its own epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Full,
    Incremental { base: u64 },
}

impl Kind {
    fn code(self) -> u32 {
        match self {
            Kind::Full => 0,
            Kind::Incremental { .. } => 1,
        }
    }
}

/// One checkpoint: an epoch number, the process's state and its page contents.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub epoch: u64,
    pub kind: Kind,
    pub image: ProcessImage,
    /// Contents of the saved pages; `PageRun::data_off` indexes into it.
    pub data: Vec<u8>,
}

/// Everything about a process except its page contents.
///
/// In a full checkpoint memory is `runs` (raw contents in the data). In an incremental one it is
/// `reset` (ranges whose previous contents are void: mappings created or replaced during the
/// epoch) and `pages` (pages written during the epoch, each encoded against the contents the
/// receiver already has for that page); mappings absent from `vmas` are dropped. An incremental
/// checkpoint may also leave out parts of the metadata that equal its base's ([`Carried`]):
/// [`crate::store::Image::apply`] takes them from the image it applies to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessImage {
    /// PID inside the sandbox's PID namespace.
    pub pid: i32,
    pub comm: String,
    pub exe: FileRef,
    pub cwd: String,
    pub umask: u32,
    pub rlimits: Vec<(u32, u64, u64)>,
    pub mm: MmInfo,
    pub auxv: Vec<u64>,
    pub vmas: Vec<Vma>,
    pub runs: Vec<PageRun>,
    pub files: Vec<FileRef>,
    pub threads: Vec<ThreadImage>,
    pub sigactions: Vec<SigAction>,
    pub fds: Vec<FdImage>,
    /// Highest TID seen, to advance the namespace's PID cursor past it.
    pub max_tid: i32,
    /// Opaque to the checkpointer: the caller's description of the sandbox (the CLI keeps the
    /// manifest here so `tardi restore FILE` needs nothing else).
    #[serde(with = "crate::bytes")]
    pub sandbox: Vec<u8>,
    /// Incremental only: the epoch this checkpoint applies to.
    pub base_epoch: Option<u64>,
    /// Incremental only: ranges whose contents at the base epoch are void.
    pub reset: Vec<(u64, u64)>,
    /// Incremental only: pages written during the epoch.
    pub pages: Vec<EncodedPage>,
    /// Incremental only: the pages of private file mappings that hold their own
    /// (copied-on-write) contents. Any other page of such a mapping shows the file, whatever
    /// the receiver held for it (a page written then `MADV_DONTNEED`ed reverts to the file
    /// without the tracker seeing it).
    pub cow: Vec<(u64, u64)>,
    /// The private directories (see [`crate::files`]): a full checkpoint carries their whole
    /// tree, an incremental one what changed during the epoch. Empty when the caller declared
    /// none.
    pub private_files: crate::files::FileChanges,
    /// The process's credentials (every thread has the same ones: capture refuses otherwise).
    pub creds: Credentials,
    /// Incremental only: the parts of this metadata left out because they equal the base's.
    pub carried: Carried,
    /// POSIX timers (`timer_create`) and interval timers (`setitimer`).
    pub timers: Timers,
    /// The seccomp filters the service installed itself.
    pub seccomp: Seccomp,
    /// Shared memory objects (shared anonymous memory, System V segments), each once with its
    /// contents, whether mapped or not; mappings name them (`Backing::Shm`). Always listed in
    /// full, incremental checkpoints included (their pages there are those that changed). In a
    /// process tree the main process lists the objects of the whole tree (their contents in
    /// its page data) and a member lists none: its mappings name the main process's objects.
    pub shm: Vec<ShmObject>,
    /// The process group and session, in the sandbox's PID namespace (0: not recorded; the
    /// restored process then keeps what its creator gave it).
    pub pgid: i32,
    pub sid: i32,
    /// A process tree's main image only: the other processes, parents before their children
    /// (see `docs/PROCESS-TREES.md`), each of the checkpoint's kind (in an incremental
    /// checkpoint, each incremental on the same base). A member's own image holds no tree
    /// (refused while decoding, so nesting cannot recurse).
    #[serde(deserialize_with = "de_tree")]
    pub tree: Vec<Member>,
    /// A process tree's main image only: the open file descriptions that tie processes of
    /// the tree together, each once (see [`SharedFile`]); listed whole in every checkpoint,
    /// incremental ones included.
    /// A process's descriptor that is one of them is [`FdKind::Shared`] with its index here.
    pub shared_files: Vec<SharedFile>,
    /// Full checkpoints only, in the main process's image: the children of processes of the
    /// tree that exited and were not reaped yet, to be recreated as such (see [`Zombie`]).
    pub zombies: Vec<Zombie>,
    /// Signals queued to the process as a whole (`kill`, `sigqueue`, a process-directed timer)
    /// and not yet delivered, oldest first: every thread blocks them. Listed whole in every
    /// checkpoint. (A thread's own are in [`ThreadImage::pending`].)
    pub pending: Vec<PendingSignal>,
    /// An incremental checkpoint's main image, now and then: digests of the process as it was
    /// at this pause, which the receiver compares with its image once this checkpoint is
    /// applied (see [`crate::scrub`]). Not kept in an image.
    pub scrub: Option<crate::scrub::Scrub>,
}

/// A child that exited and that its parent (a process of the tree) has not reaped yet: it
/// holds nothing but its PID, its group and session and its exit status, which the parent
/// learns when it reaps it. The restore recreates it by forking a child with its PID that
/// exits with that status (`docs/PROCESS-TREES.md`, phase 3).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Zombie {
    /// Its PID and its parent's (the main process's or a member's), in the sandbox.
    pub pid: i32,
    pub ppid: i32,
    /// Its process group and session in the sandbox (as [`ProcessImage::pgid`]).
    pub pgid: i32,
    pub sid: i32,
    /// Its real user id (what `waitid` reports as `si_uid`).
    pub uid: u32,
    /// Its wait status, as `waitpid` reports it: an exit code (`code << 8`) or the signal
    /// that terminated it (with no core dump: [`Zombie::status_valid`]).
    pub status: i32,
}

impl Zombie {
    /// Whether `status` is one a restore can recreate: an exit code, or a signal whose default
    /// action terminates the process, without the core-dump flag (a restore does not dump
    /// core).
    pub fn status_valid(status: i32) -> bool {
        let sig = status & 0x7f;
        if sig == 0 {
            return status & !0xff00 == 0;
        }
        // Signals whose default action is to ignore, stop or continue cannot have ended it.
        const NOT_FATAL: [i32; 8] = [17, 18, 19, 20, 21, 22, 23, 28];
        status & !0x7f == 0 && (1..=64).contains(&sig) && !NOT_FATAL.contains(&sig)
    }
}

/// An open file description of a process tree that must come back as one: held by several
/// processes (a listening socket inherited by workers, a log file whose offset they all move),
/// or one of the objects that hold state between processes (every end of a pipe whose ends
/// are in different processes, every socket of a group of connected unix sockets that spans
/// processes), which are recreated together.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SharedFile {
    /// The description (its `fd` is the first holder's number; `cloexec` is per descriptor
    /// and kept by each holder's own entry). Never itself [`FdKind::Shared`].
    pub file: FdImage,
    /// Who holds it: (PID in the sandbox, descriptor number), each naming a descriptor
    /// [`FdKind::Shared`] with this entry's index in that process's `fds`.
    pub holders: Vec<(i32, i32)>,
}

/// A process of a tree other than the main one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Member {
    /// Its parent's PID (the main process's or an earlier member's).
    pub ppid: i32,
    /// Its slice of the checkpoint's page data: its runs' `data_off` are relative to it.
    pub data_off: u64,
    pub data_len: u64,
    pub image: ProcessImage,
}

/// Decodes [`ProcessImage::tree`]: a list of members at the top level, an empty list inside a
/// member's image (anything else is an error before any member is decoded, so a crafted image
/// cannot nest trees deep enough to exhaust the stack).
fn de_tree<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Member>, D::Error> {
    use std::cell::Cell;
    thread_local!(static IN_MEMBER: Cell<bool> = const { Cell::new(false) });
    /// Puts the flag back however decoding ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_MEMBER.with(|f| f.set(self.0));
        }
    }
    /// What a member's tree may not hold.
    struct Nested;
    impl<'de> Deserialize<'de> for Nested {
        fn deserialize<D2: serde::Deserializer<'de>>(_: D2) -> Result<Self, D2::Error> {
            Err(serde::de::Error::custom(
                "a member process holds processes of its own",
            ))
        }
    }
    let _restore = Restore(IN_MEMBER.with(|f| f.replace(true)));
    if _restore.0 {
        Vec::<Nested>::deserialize(d).map(|_| Vec::new())
    } else {
        Vec::<Member>::deserialize(d)
    }
}

/// The identity of a shared memory object within a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ShmId {
    /// Shared anonymous memory (`MAP_SHARED | MAP_ANONYMOUS`, a shmem file the kernel shows as
    /// `/dev/zero (deleted)`), by the inode number it had at capture.
    Anon(u64),
    /// A System V segment, by its `shmid` (kept at restore).
    Sysv(i32),
    /// A file that was unlinked while mapped shared (a POSIX semaphore or shared memory object
    /// after `sem_unlink` or `shm_unlink`, a temporary file), by the device and inode it had at
    /// capture. Nothing can open it by name any more, so it comes back as shared anonymous
    /// memory holding its contents.
    Unlinked { dev: u64, ino: u64 },
}

impl ShmId {
    /// An object that comes back as shared anonymous memory (everything but a System V
    /// segment).
    pub fn is_anonymous(self) -> bool {
        matches!(self, ShmId::Anon(_) | ShmId::Unlinked { .. })
    }
}

/// A shared memory object and its contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmObject {
    pub id: ShmId,
    /// Size in bytes (a System V segment's may be no multiple of the page size).
    pub size: u64,
    /// System V segments only.
    pub sysv: Option<SysvShm>,
    /// Contents: runs of pages, `addr` being the offset in the object. A full checkpoint lists
    /// every page that is not all zeros; an incremental one the pages that changed since its
    /// base (a page that became all zeros is sent as zeros), on top of the base's contents of
    /// the same object, or of zeros when `fresh`.
    pub runs: Vec<PageRun>,
    /// Incremental only: the object is new since the base (or replaced: another object with
    /// the same id), its contents start from zeros.
    pub fresh: bool,
}

/// What a System V segment is besides its contents (`/proc/sysvipc/shm`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysvShm {
    /// Its key (0: `IPC_PRIVATE`, also what a segment marked for removal shows).
    pub key: i32,
    /// Permission bits (`0o777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Creator's user and group.
    pub cuid: u32,
    pub cgid: u32,
    /// Marked for removal (`IPC_RMID`) while still attached: removed again at restore once
    /// the mappings are back.
    pub removed: bool,
    /// Locked in memory (`SHM_LOCK`).
    pub locked: bool,
}

/// Largest shared memory object a checkpoint may describe (1 TiB).
pub const SHM_MAX_SIZE: u64 = 1 << 40;

/// What an incremental checkpoint's metadata leaves out because it is the same as in the
/// checkpoint it applies to (most epochs of a service change no mapping, no descriptor and
/// only the threads that ran: on Redis, 27 KiB of metadata per epoch became ~5 KiB, less to
/// serialise, send, check and parse on the way of every reply). A full checkpoint carries
/// nothing over.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    /// `vmas` and `files` are the base's (both lists are empty here).
    pub layout: bool,
    /// `fds` are the base's (empty here).
    pub fds: bool,
    /// `sigactions` are the base's (empty here).
    pub sigactions: bool,
    /// Threads (by TID) whose whole [`ThreadImage`] is the base's: their entry in `threads`
    /// keeps its place and TID, with no registers, XSAVE area or name.
    pub threads: Vec<i32>,
}

impl Carried {
    /// Nothing is left out.
    pub fn is_empty(&self) -> bool {
        !self.layout && !self.fds && !self.sigactions && self.threads.is_empty()
    }
}

/// The process's timers, with the time left as it was at the capture (a restore arms them
/// with that much left, relative to its own resumption).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timers {
    /// POSIX timers, by id.
    pub posix: Vec<PosixTimer>,
    /// Armed interval timers only.
    pub itimers: Vec<ITimer>,
}

/// `SIGEV_*` values of `sigev_notify` (Linux's; this crate does not link libc).
pub mod sigev {
    pub const SIGNAL: i32 = 0;
    pub const NONE: i32 = 1;
    pub const THREAD: i32 = 2;
    pub const THREAD_ID: i32 = 4;
}

/// One POSIX timer, as `timer_create` made it and `timer_gettime` read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixTimer {
    /// The timer's id (`timer_t`), kept at restore.
    pub id: i32,
    /// The clock (`CLOCK_*`, or a CPU-time clock id that names a thread or process).
    pub clock: i32,
    /// `sigev_signo`.
    pub signo: i32,
    /// `sigev_notify`: one of [`sigev`] (`THREAD_ID` means `SIGNAL | THREAD_ID`).
    pub notify: i32,
    /// The thread signalled (sandbox TID) when `notify` is [`sigev::THREAD_ID`], else 0.
    pub tid: i32,
    /// `sigev_value`, delivered in the signal's `si_value`.
    pub sigval: u64,
    /// Time left until it fires, 0 if disarmed.
    pub value_ns: u64,
    /// Its period, 0 for a one-shot timer.
    pub interval_ns: u64,
}

/// An armed interval timer (`setitimer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ITimer {
    /// `ITIMER_REAL` (0), `ITIMER_VIRTUAL` (1) or `ITIMER_PROF` (2).
    pub which: u32,
    pub value_ns: u64,
    pub interval_ns: u64,
}

/// The seccomp filters of the service's threads. A thread's filters are a chain, installed
/// oldest first; chains are mostly shared (a filter installed before a thread was created, or
/// with `SECCOMP_FILTER_FLAG_TSYNC`), so the programs are kept once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seccomp {
    pub filters: Vec<SeccompFilter>,
    /// Threads that have filters.
    pub chains: Vec<SeccompChain>,
}

/// One classic BPF program, as `PTRACE_SECCOMP_GET_FILTER` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SeccompFilter {
    /// `SECCOMP_FILTER_FLAG_LOG` (2) if it was installed with it; no other flag is kept.
    pub flags: u32,
    /// `struct sock_filter`s, one per word: code (u16), jt (u8), jf (u8), k (u32), little-endian.
    pub insns: Vec<u64>,
}

/// The filters of one thread: indices into [`Seccomp::filters`], oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompChain {
    /// TID inside the sandbox.
    pub tid: i32,
    pub filters: Vec<u32>,
}

/// The kernel's limits on a filter program (`BPF_MAXINSNS`) and on a thread's whole chain
/// (`MAX_INSNS_PER_PATH`, where each filter counts 4 more).
pub const SECCOMP_MAX_INSNS: usize = 4096;
pub const SECCOMP_MAX_PATH: usize = 32768;

/// One inotify watch: re-added at restore, in `wd` order, with the same watch descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InotifyWatch {
    pub wd: i32,
    /// The watch's mask as the kernel keeps it (events, `IN_ONESHOT`, `IN_EXCL_UNLINK`).
    pub mask: u32,
    /// A path (inside the sandbox) of the watched file or directory at the capture.
    pub path: String,
}

/// Who the process is: user and group IDs, capability sets and the flags that go with them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// Real, effective, saved and file-system user ID.
    pub uid: [u32; 4],
    /// Real, effective, saved and file-system group ID.
    pub gid: [u32; 4],
    /// Supplementary groups.
    pub groups: Vec<u32>,
    pub cap_inheritable: u64,
    pub cap_permitted: u64,
    pub cap_effective: u64,
    pub cap_bounding: u64,
    pub cap_ambient: u64,
    /// `prctl(PR_GET_SECUREBITS)`.
    pub securebits: u32,
    pub no_new_privs: bool,
    /// `prctl(PR_GET_DUMPABLE)` (a process that changed its credentials is not dumpable).
    pub dumpable: u32,
}

impl Default for Credentials {
    /// Root with every capability: what a service started by the sandbox as root has.
    fn default() -> Credentials {
        Credentials {
            uid: [0; 4],
            gid: [0; 4],
            groups: Vec::new(),
            cap_inheritable: 0,
            cap_permitted: u64::MAX,
            cap_effective: u64::MAX,
            cap_bounding: u64::MAX,
            cap_ambient: 0,
            securebits: 0,
            no_new_privs: false,
            dumpable: 1,
        }
    }
}

/// One page of an incremental checkpoint: `enc` tells how its `enc.encoded_len()` bytes at
/// `data_off` turn into the page, given the page's previous contents (its twin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodedPage {
    pub addr: u64,
    pub enc: PageEncoding,
    pub data_off: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MmInfo {
    pub start_code: u64,
    pub end_code: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub start_brk: u64,
    pub brk: u64,
    pub start_stack: u64,
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
}

/// A file the process maps or runs, identified by path (inside the sandbox) and content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    pub path: String,
    pub size: u64,
    /// BLAKE3 of the contents; checked before restore.
    pub hash: [u8; 32],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backing {
    Anon,
    /// `files[index]` at byte offset `offset`.
    File {
        index: u32,
        offset: u64,
    },
    /// The vDSO set (`[vvar]`, `[vvar_vclock]`, `[vdso]`): recreated by the kernel, not saved.
    Vdso,
    /// Shared memory object `id` (one of [`ProcessImage::shm`]) at byte offset `offset`: the
    /// mapping is shared again at restore, its contents are the object's.
    Shm {
        id: ShmId,
        offset: u64,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// PROT_* bits.
    pub prot: u32,
    pub shared: bool,
    /// `restorer/abi.rs` VMA_* advice bits (growsdown, dontfork, ...).
    pub flags: u32,
    pub backing: Backing,
    /// Name as in /proc/PID/maps (`[heap]`, `[stack]`, a path, or empty).
    pub name: String,
}

/// `len` bytes of memory at `addr`, saved at `data_off` in [`Checkpoint::data`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageRun {
    pub addr: u64,
    pub len: u64,
    pub data_off: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThreadImage {
    /// TID inside the sandbox's PID namespace.
    pub tid: i32,
    pub comm: String,
    /// `struct user_regs_struct` as 27 words, as captured (no restart fix applied).
    pub regs: Vec<u64>,
    #[serde(with = "crate::bytes")]
    pub xstate: Vec<u8>,
    pub sigmask: u64,
    pub robust_list: u64,
    pub robust_len: u64,
    pub clear_child_tid: u64,
    pub rseq: Option<Rseq>,
    pub altstack: AltStack,
    /// Signals queued to this thread alone (`tgkill`, a fault's signal, a thread-directed
    /// timer) and not yet delivered, oldest first: blocked by [`ThreadImage::sigmask`]. (One it
    /// does not block is delivered before the capture, not recorded.)
    pub pending: Vec<PendingSignal>,
}

/// Size of the kernel's `siginfo_t`.
pub const SIGINFO_SIZE: usize = 128;

/// Most pending signals one queue (a thread's, or the process's) may list.
pub const PENDING_MAX: usize = 4096;

/// A signal queued and not yet delivered, with the details its sender gave (`siginfo_t`,
/// as `PTRACE_PEEKSIGINFO` reads it): a restore queues it again, with the same details,
/// before any thread runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PendingSignal {
    pub signo: u32,
    /// The `siginfo_t`, [`SIGINFO_SIZE`] bytes; its first field is `signo`.
    #[serde(with = "crate::bytes")]
    pub info: Vec<u8>,
}

impl PendingSignal {
    /// The signal number a `siginfo_t` names (its first field, `si_signo`).
    pub fn signo_of(info: &[u8; SIGINFO_SIZE]) -> u32 {
        u32::from_ne_bytes([info[0], info[1], info[2], info[3]])
    }

    /// Its `si_code` (the third field of `siginfo_t`): how it was sent.
    pub fn code(&self) -> i32 {
        self.info
            .get(8..12)
            .map_or(i32::MIN, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Sent by a process with `kill`, `sigqueue` or `tgkill`/`tkill` (`SI_USER`, `SI_QUEUE`,
    /// `SI_TKILL`), not raised by the kernel for an event of its own (a timer, a child, I/O, a
    /// fault): its arrival changes nothing in the receiving process but its queue.
    pub fn sent_by_a_process(&self) -> bool {
        const SI_USER: i32 = 0;
        const SI_QUEUE: i32 = -1;
        const SI_TKILL: i32 = -6;
        matches!(self.code(), SI_USER | SI_QUEUE | SI_TKILL)
    }

    /// SIGKILL and SIGSTOP: they cannot be blocked, so one queued is taken as soon as the
    /// process runs, and no image may hold one.
    pub fn unblockable(signo: u32) -> bool {
        signo == 9 || signo == 19
    }

    /// Checks one queue (`who`: whose, for the message).
    fn validate_queue(queue: &[PendingSignal], who: &str) -> Result<(), FormatError> {
        if queue.len() > PENDING_MAX {
            return Err(FormatError::Meta(format!(
                "{who} has {} pending signals (at most {PENDING_MAX})",
                queue.len()
            )));
        }
        for p in queue {
            if !(1..=64).contains(&p.signo) || Self::unblockable(p.signo) {
                return Err(FormatError::Meta(format!(
                    "{who} has signal {} pending, which cannot be",
                    p.signo
                )));
            }
            if p.info.len() != SIGINFO_SIZE {
                return Err(FormatError::Meta(format!(
                    "{who}'s pending signal {} has {} bytes of details, not {SIGINFO_SIZE}",
                    p.signo,
                    p.info.len()
                )));
            }
            // (Its length is checked above.)
            let named =
                <&[u8; SIGINFO_SIZE]>::try_from(p.info.as_slice()).map_or(0, Self::signo_of);
            if named != p.signo {
                return Err(FormatError::Meta(format!(
                    "{who}'s pending signal {}: its details name signal {named}",
                    p.signo
                )));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Rseq {
    pub addr: u64,
    pub len: u32,
    pub sig: u32,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct AltStack {
    pub sp: u64,
    pub size: u64,
    pub flags: u32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct SigAction {
    pub signo: u32,
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

/// One file descriptor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FdImage {
    pub fd: i32,
    pub cloexec: bool,
    /// File status flags (O_NONBLOCK, O_APPEND, access mode...).
    pub flags: i32,
    pub kind: FdKind,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum FdKind {
    /// A regular file, directory or device, reopened by path.
    Path {
        path: String,
        pos: u64,
        is_dir: bool,
    },
    /// One end of a pipe. `id` pairs the ends; `buffered` is what sat in it (kept on the record
    /// of the first end captured); `capacity` is F_GETPIPE_SZ.
    Pipe {
        id: u64,
        write_end: bool,
        #[serde(with = "crate::bytes")]
        buffered: Vec<u8>,
        capacity: u32,
    },
    Socket(SocketImage),
    EventFd {
        count: u64,
        semaphore: bool,
    },
    TimerFd {
        clockid: i32,
        ticks: u64,
        value_ns: u64,
        interval_ns: u64,
    },
    SignalFd {
        mask: u64,
    },
    Epoll {
        interests: Vec<EpollInterest>,
    },
    /// A unix-domain socket of any type.
    Unix(UnixSocketImage),
    /// An inotify instance and its watches (its event queue was empty: capture refuses
    /// otherwise).
    Inotify {
        watches: Vec<InotifyWatch>,
    },
    /// One of the open file descriptions the tree's processes share: the index of its entry in
    /// the main process's [`ProcessImage::shared_files`]. The descriptor's `flags` are the
    /// description's, its `cloexec` its own.
    Shared(u32),
}

/// A unix-domain socket. Sockets are told apart by `ino` (descriptors of one socket share it);
/// a connected socket names its peer by `peer_ino`, which is another socket of the image (a
/// pair restored connected), a connection a listener of the image has not accepted yet
/// (restored pending in its queue), or something outside the sandbox (restored as a
/// connection reset by its peer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixSocketImage {
    /// Inode number of the socket at capture (identity within this image only).
    pub ino: u64,
    /// SOCK_STREAM, SOCK_DGRAM or SOCK_SEQPACKET.
    pub ty: i32,
    pub local: UnixAddr,
    /// For a socket bound to a path: owner, group and mode of the socket file there; `None`
    /// when the file was unlinked (the socket keeps its name, nothing can reach it by path).
    pub path_file: Option<(u32, u32, u32)>,
    pub state: UnixState,
    /// Inode of the connected peer, 0 if none.
    pub peer_ino: u64,
    /// The peer's address as `getpeername` gave it.
    pub peer: UnixAddr,
    /// What waits to be received, in order: one entry per message (datagram, seqpacket) or
    /// the whole byte stream in one entry (stream).
    pub queue: Vec<Vec<u8>>,
    /// `shutdown(2)` bits of this end (1: no more receiving, 2: no more sending).
    pub shutdown: u8,
    /// (level, name, value) of the socket options kept.
    pub options: Vec<(i32, i32, i32)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnixAddr {
    Unnamed,
    /// A file-system path as bound (relative to the working directory if not absolute).
    Path(String),
    /// An abstract name, without its leading NUL byte.
    Abstract(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnixState {
    /// Not connected (possibly bound).
    Unconnected,
    /// Listening; `pending` are the inodes of the clients of connections not accepted yet,
    /// oldest first.
    Listening { backlog: i32, pending: Vec<u64> },
    /// Connected to `peer_ino` (or, for a datagram socket, to `peer`).
    Connected,
}

impl UnixAddr {
    /// The `sockaddr_un` bytes (family + name), or `None` for an unnamed address.
    pub fn to_sockaddr(&self) -> Option<Vec<u8>> {
        let mut v = (1u16).to_ne_bytes().to_vec(); // AF_UNIX
        match self {
            UnixAddr::Unnamed => return None,
            UnixAddr::Path(p) => {
                v.extend_from_slice(p.as_bytes());
                v.push(0);
            }
            UnixAddr::Abstract(n) => {
                v.push(0);
                v.extend_from_slice(n);
            }
        }
        Some(v)
    }

    /// Parses `getsockname`/`getpeername` bytes.
    pub fn from_sockaddr(sa: &[u8]) -> UnixAddr {
        let name = sa.get(2..).unwrap_or_default();
        match name.first() {
            None => UnixAddr::Unnamed,
            Some(0) => UnixAddr::Abstract(name[1..].to_vec()),
            Some(_) => {
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                UnixAddr::Path(String::from_utf8_lossy(&name[..end]).into_owned())
            }
        }
    }

    /// Whether it fits a `sockaddr_un` (108 bytes of name, a path NUL-terminated and without
    /// NUL bytes).
    pub fn check(&self) -> Result<(), String> {
        match self {
            UnixAddr::Unnamed => Ok(()),
            UnixAddr::Path(p) if p.is_empty() || p.len() > 107 || p.contains('\0') => Err(format!(
                "unix socket path {p:?} is not a valid socket address"
            )),
            UnixAddr::Abstract(n) if n.len() > 107 => {
                Err(format!("abstract unix socket name of {} bytes", n.len()))
            }
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EpollInterest {
    pub fd: i32,
    pub events: u32,
    pub data: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SocketImage {
    /// AF_INET or AF_INET6.
    pub family: i32,
    /// SOCK_STREAM or SOCK_DGRAM.
    pub ty: i32,
    pub protocol: i32,
    pub state: SocketState,
    /// Local address as raw `sockaddr` bytes (empty if unbound).
    pub local: Vec<u8>,
    /// Peer address (empty if none).
    pub peer: Vec<u8>,
    /// (level, name, value) of the integer options that were set.
    pub options: Vec<(i32, i32, i32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SocketState {
    /// Created, possibly bound, not listening or connected.
    Unconnected,
    Listening {
        backlog: i32,
    },
    /// A connected TCP socket: restored as a connection reset by its peer.
    ConnectedTcp,
    /// A UDP socket with a default peer.
    ConnectedUdp,
}

/// A checkpoint file opened for restore: header and metadata parsed, the whole file's length
/// and checksum verified by streaming it, the page data left where it is (a restore reads it
/// from the file directly).
pub struct CheckpointFile {
    pub epoch: u64,
    pub kind: Kind,
    pub image: ProcessImage,
    pub file: std::fs::File,
    /// Where the page data starts in the file; `PageRun::data_off` is relative to it.
    pub data_offset: u64,
}

impl CheckpointFile {
    pub fn open(path: &std::path::Path) -> Result<CheckpointFile, FormatError> {
        use std::io::Read;
        use std::os::unix::fs::FileExt;
        let io_err = |e: io::Error| FormatError::Io(e.to_string());
        let mut file = std::fs::File::open(path).map_err(io_err)?;
        let found = file.metadata().map_err(io_err)?.len();
        let mut head = vec![0u8; HEADER_LEN.min(found as usize)];
        file.read_exact_at(&mut head, 0).map_err(io_err)?;
        let h = Header::parse(&head, found)?;
        // Stream the file once for the checksum, keeping only the metadata.
        let (body, meta_start, meta_end) =
            (found - 4, HEADER_LEN as u64, HEADER_LEN as u64 + h.meta_len);
        let mut crc = crc32fast::Hasher::new();
        // The header's length matched the file's, but a sparse file can claim anything: let
        // the buffer grow with what is actually read.
        let mut meta = Vec::with_capacity(h.meta_len.min(1 << 26) as usize);
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < body {
            let want = ((body - at) as usize).min(buf.len());
            file.read_exact(&mut buf[..want]).map_err(io_err)?;
            crc.update(&buf[..want]);
            let (cs, ce) = (at.max(meta_start), (at + want as u64).min(meta_end));
            if cs < ce {
                meta.extend_from_slice(&buf[(cs - at) as usize..(ce - at) as usize]);
            }
            at += want as u64;
        }
        let mut trailer = [0u8; 4];
        file.read_exact(&mut trailer).map_err(io_err)?;
        check_crc(u32::from_le_bytes(trailer), crc.finalize())?;
        let (kind, image) = h.decode(&meta)?;
        Ok(CheckpointFile {
            epoch: h.epoch,
            kind,
            image,
            file,
            data_offset: meta_end,
        })
    }
}

/// The fixed-size header, checked against the total length.
struct Header {
    kind: u32,
    epoch: u64,
    meta_len: u64,
    data_len: u64,
}

impl Header {
    /// Parses the header from the first bytes (up to [`HEADER_LEN`]) of a checkpoint of `found`
    /// bytes in all.
    fn parse(head: &[u8], found: u64) -> Result<Header, FormatError> {
        if found == 0 {
            return Err(FormatError::Empty);
        }
        if head.len() < 8 || &head[..8] != MAGIC {
            return Err(FormatError::BadMagic);
        }
        if head.len() < HEADER_LEN || found < HEADER_LEN as u64 + 4 {
            return Err(FormatError::Truncated {
                expected: HEADER_LEN as u64 + 4,
                found,
            });
        }
        let field = |o: usize, n: usize| -> [u8; 8] {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&head[o..o + n]);
            b
        };
        let u32_at = |o: usize| u64::from_le_bytes(field(o, 4)) as u32;
        let u64_at = |o: usize| u64::from_le_bytes(field(o, 8));
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(FormatError::Version { found: version });
        }
        let h = Header {
            kind: u32_at(12),
            epoch: u64_at(16),
            meta_len: u64_at(24),
            data_len: u64_at(32),
        };
        let expected = (HEADER_LEN as u64)
            .checked_add(h.meta_len)
            .and_then(|x| x.checked_add(h.data_len))
            .and_then(|x| x.checked_add(4))
            .ok_or(FormatError::Truncated {
                expected: u64::MAX,
                found,
            })?;
        if found != expected {
            return Err(FormatError::Truncated { expected, found });
        }
        Ok(h)
    }

    /// Decodes and checks the metadata once the checksum matched.
    fn decode(&self, meta: &[u8]) -> Result<(Kind, ProcessImage), FormatError> {
        if self.kind > 1 {
            return Err(FormatError::Meta(format!(
                "unknown checkpoint kind {}",
                self.kind
            )));
        }
        // postcard bounds every length by the bytes left (a vector's preallocation is capped
        // by serde), so an absurd length prefix is an error, not an allocation.
        let (image, rest): (ProcessImage, _) =
            postcard::take_from_bytes(meta).map_err(|e| FormatError::Meta(e.to_string()))?;
        if !rest.is_empty() {
            return Err(FormatError::Meta(format!(
                "{} bytes after the encoded metadata",
                rest.len()
            )));
        }
        image.validate(self.data_len)?;
        let kind = match (self.kind, image.base_epoch) {
            (0, None) => Kind::Full,
            (0, Some(base)) => {
                return Err(FormatError::Meta(format!(
                    "full checkpoint with a base epoch ({base})"
                )));
            }
            (_, Some(base)) => Kind::Incremental { base },
            (_, None) => {
                return Err(FormatError::Meta(
                    "incremental checkpoint without a base epoch".into(),
                ));
            }
        };
        Ok((kind, image))
    }
}

fn check_crc(stored: u32, computed: u32) -> Result<(), FormatError> {
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    Ok(())
}

impl Checkpoint {
    /// A full checkpoint of state `epoch`: `image` with its pages' contents in `data`.
    pub fn full(epoch: u64, image: ProcessImage, data: Vec<u8>) -> Checkpoint {
        Checkpoint {
            epoch,
            kind: Kind::Full,
            image,
            data,
        }
    }

    /// Serializes the checkpoint into `w`.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<u64> {
        let meta = postcard::to_stdvec(&self.image).map_err(io::Error::other)?;
        let mut h = crc32fast::Hasher::new();
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        header.extend_from_slice(&self.kind.code().to_le_bytes());
        header.extend_from_slice(&self.epoch.to_le_bytes());
        header.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.data.len() as u64).to_le_bytes());
        for part in [&header[..], &meta[..], &self.data[..]] {
            h.update(part);
            w.write_all(part)?;
        }
        w.write_all(&h.finalize().to_le_bytes())?;
        Ok((header.len() + meta.len() + self.data.len() + 4) as u64)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.data.len() + 4096);
        self.write_to(&mut v).expect("writing to a Vec cannot fail");
        v
    }

    /// Parses and verifies a checkpoint: magic, version, lengths, checksum, then everything
    /// [`Checkpoint::validate`] checks. Takes ownership so the page data is not copied. Any
    /// bytes are safe to pass: whatever does not hold is an error, never a panic, and nothing
    /// is allocated beyond what `bytes` itself holds.
    pub fn from_bytes(mut bytes: Vec<u8>) -> Result<Checkpoint, FormatError> {
        let h = Header::parse(&bytes[..HEADER_LEN.min(bytes.len())], bytes.len() as u64)?;
        // `parse` checked: HEADER_LEN + meta_len + data_len + 4 == bytes.len().
        let body = bytes.len() - 4;
        let mut stored = [0u8; 4];
        stored.copy_from_slice(&bytes[body..]);
        check_crc(u32::from_le_bytes(stored), crc32fast::hash(&bytes[..body]))?;
        let meta_end = HEADER_LEN + h.meta_len as usize;
        let (kind, image) = h.decode(&bytes[HEADER_LEN..meta_end])?;
        // Move the page data to the front of the buffer instead of copying it into a new one
        // (no fresh allocation to fault in).
        bytes.truncate(body);
        bytes.copy_within(meta_end.., 0);
        bytes.truncate(body - meta_end);
        Ok(Checkpoint {
            epoch: h.epoch,
            kind,
            image,
            data: bytes,
        })
    }

    /// Internal consistency, as [`Checkpoint::from_bytes`] checks it after decoding: the kind
    /// agrees with the base epoch, and [`ProcessImage::validate`] against [`Checkpoint::data`].
    /// For a checkpoint built in memory rather than read.
    pub fn validate(&self) -> Result<(), FormatError> {
        match (self.kind, self.image.base_epoch) {
            (Kind::Full, None) => {}
            (Kind::Incremental { base }, Some(b)) if b == base => {}
            (kind, base) => {
                return Err(FormatError::Meta(format!(
                    "a checkpoint of kind {kind:?} has base epoch {base:?}"
                )));
            }
        }
        self.image.validate(self.data.len() as u64)
    }
}

impl ProcessImage {
    /// Internal consistency, checked before anything looks at the image: every index, length,
    /// offset and address range lies inside what it refers to, with no overflow on the way.
    /// - threads: at least one, positive distinct TIDs, 27 registers, an XSAVE area of at most
    ///   [`XSTATE_MAX`] bytes;
    /// - mappings: page-aligned, non-empty, not overlapping, file indices inside `files`;
    /// - runs: page-aligned, each inside `data_len` and inside one mapping, no two overlapping
    ///   in memory or in the data (so a run's pages cost their own bytes of data);
    /// - encoded pages: page-aligned, inside the data, no delta or compressed form as long as a
    ///   raw page (pages outside the layout are dropped by the receiver, not refused);
    /// - `reset` and `cow` ranges ordered, signal numbers 1–64, descriptors non-negative and
    ///   distinct, no NUL byte in a path, and the private directories' paths as
    ///   [`FileChanges::validate`](crate::files::FileChanges::validate) wants them (whether an
    ///   incremental checkpoint's entries lie in the receiver's directories is for
    ///   [`crate::store::Image::apply`] to check);
    /// - a tree's members and its shared descriptors as `validate_tree` and `validate_shared`
    ///   say.
    pub fn validate(&self, data_len: u64) -> Result<(), FormatError> {
        self.validate_one(data_len, None)?;
        self.validate_tree(data_len)?;
        self.validate_shared()?;
        self.validate_zombies()
    }

    /// The zombies (the main image's; an incremental checkpoint lists every zombie of the
    /// tree at its epoch, as a full one does): each with a positive PID that no
    /// process, thread or other zombie of the tree has, a parent that is the main process or
    /// a member, a group and session not negative, and a status a restore can recreate.
    fn validate_zombies(&self) -> Result<(), FormatError> {
        fn bad<T>(m: String) -> Result<T, FormatError> {
            Err(FormatError::Meta(m))
        }
        if self.zombies.is_empty() {
            return Ok(());
        }
        let procs: Vec<&ProcessImage> = std::iter::once(self)
            .chain(self.tree.iter().map(|m| &m.image))
            .collect();
        let mut ids: Vec<i32> = procs
            .iter()
            .flat_map(|p| std::iter::once(p.pid).chain(p.threads.iter().map(|t| t.tid)))
            .collect();
        for z in &self.zombies {
            if z.pid <= 0 || ids.contains(&z.pid) {
                return bad(format!(
                    "zombie {} has a PID that is not positive or not its own",
                    z.pid
                ));
            }
            ids.push(z.pid);
            if !procs.iter().any(|p| p.pid == z.ppid) {
                return bad(format!(
                    "zombie {} names parent {}, which is not a process of the tree",
                    z.pid, z.ppid
                ));
            }
            if z.pgid < 0 || z.sid < 0 {
                return bad(format!(
                    "zombie {} has group {} and session {}",
                    z.pid, z.pgid, z.sid
                ));
            }
            if !Zombie::status_valid(z.status) {
                return bad(format!(
                    "zombie {} has wait status {:#x}, which a restore cannot recreate",
                    z.pid, z.status
                ));
            }
        }
        Ok(())
    }

    /// [`ProcessImage::validate`] of one process, without what belongs to the tree (a
    /// member's descriptors may name shared descriptions, which only the main process lists).
    /// A member's mappings of shared memory name `tree_shm`, the main process's objects.
    pub(crate) fn validate_one(
        &self,
        data_len: u64,
        tree_shm: Option<&[ShmObject]>,
    ) -> Result<(), FormatError> {
        fn bad<T>(m: String) -> Result<T, FormatError> {
            Err(FormatError::Meta(m))
        }
        const PAGE: u64 = crate::delta::PAGE_SIZE as u64;
        let aligned = |x: u64| x.is_multiple_of(PAGE);
        if self.pid <= 0 {
            return bad(format!("process id {} is not positive", self.pid));
        }
        if let Some(s) = &self.scrub {
            s.validate().map_err(FormatError::Meta)?;
        }
        if self.threads.is_empty() {
            return bad("no threads".into());
        }
        let c = &self.carried;
        if self.base_epoch.is_none() && !c.is_empty() {
            return bad("a full checkpoint leaves out part of its metadata".into());
        }
        let empty = [
            (
                c.layout,
                "mappings",
                self.vmas.is_empty() && self.files.is_empty(),
            ),
            (c.fds, "descriptors", self.fds.is_empty()),
            (c.sigactions, "signal actions", self.sigactions.is_empty()),
        ];
        if let Some((_, what, _)) = empty.iter().find(|(carried, _, empty)| *carried && !empty) {
            return bad(format!("{what} are both carried over and listed"));
        }
        let mut carried_tids = c.threads.clone();
        carried_tids.sort_unstable();
        if let Some(w) = carried_tids.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("thread {} is carried over twice", w[0]));
        }
        let mut tids: Vec<i32> = Vec::with_capacity(self.threads.len());
        for t in &self.threads {
            if t.tid <= 0 {
                return bad(format!("thread id {} is not positive", t.tid));
            }
            if carried_tids.binary_search(&t.tid).is_ok() {
                if !t.regs.is_empty() || !t.xstate.is_empty() || !t.pending.is_empty() {
                    return bad(format!(
                        "thread {} is carried over and has registers of its own",
                        t.tid
                    ));
                }
                tids.push(t.tid);
                continue;
            }
            if t.regs.len() != 27 {
                return bad(format!(
                    "thread {} has {} registers, not 27",
                    t.tid,
                    t.regs.len()
                ));
            }
            if t.xstate.len() > XSTATE_MAX {
                return bad(format!(
                    "thread {} has an XSAVE area of {} bytes (at most {XSTATE_MAX})",
                    t.tid,
                    t.xstate.len()
                ));
            }
            PendingSignal::validate_queue(&t.pending, &format!("thread {}", t.tid))?;
            tids.push(t.tid);
        }
        PendingSignal::validate_queue(&self.pending, &format!("process {}", self.pid))?;
        tids.sort_unstable();
        if let Some(w) = tids.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("thread {} appears twice", w[0]));
        }
        if let Some(t) = carried_tids.iter().find(|t| tids.binary_search(t).is_err()) {
            return bad(format!(
                "carried-over thread {t} is not a thread of the process"
            ));
        }

        let mut spans: Vec<(u64, u64)> = Vec::with_capacity(self.vmas.len());
        for v in &self.vmas {
            if v.start >= v.end || !aligned(v.start) || !aligned(v.end) {
                return bad(format!(
                    "mapping {:#x}-{:#x} is empty or not page-aligned",
                    v.start, v.end
                ));
            }
            if let Backing::File { index, .. } = v.backing
                && index as usize >= self.files.len()
            {
                return bad(format!(
                    "mapping at {:#x} names file #{index} of {}",
                    v.start,
                    self.files.len()
                ));
            }
            spans.push((v.start, v.end));
        }
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return bad(format!(
                "mappings {:#x}-{:#x} and {:#x}-{:#x} overlap",
                w[0].0, w[0].1, w[1].0, w[1].1
            ));
        }
        // The mapping holding `addr`, if any (spans are sorted and disjoint).
        let holder = |addr: u64| {
            let i = spans.partition_point(|s| s.0 <= addr);
            i.checked_sub(1).map(|i| spans[i]).filter(|s| addr < s.1)
        };

        for r in &self.runs {
            if !aligned(r.addr) || !aligned(r.len) {
                return bad(format!(
                    "page run at {:#x} ({} bytes) is not page-aligned",
                    r.addr, r.len
                ));
            }
            if r.data_off.checked_add(r.len).is_none_or(|e| e > data_len) {
                return bad(format!(
                    "page run at {:#x} lies outside the page data",
                    r.addr
                ));
            }
            let end = r.addr.checked_add(r.len);
            let inside = holder(r.addr).zip(end).is_some_and(|(s, e)| e <= s.1);
            if r.len > 0 && !inside {
                return bad(format!(
                    "page run at {:#x} ({} bytes) lies outside every mapping",
                    r.addr, r.len
                ));
            }
        }
        // A shared mapping's contents are its object's, never page runs of their own.
        let shm_spans: Vec<(u64, u64)> = self
            .vmas
            .iter()
            .filter(|v| matches!(v.backing, Backing::Shm { .. }))
            .map(|v| (v.start, v.end))
            .collect();
        if let Some(r) = self
            .runs
            .iter()
            .find(|r| r.len > 0 && shm_spans.iter().any(|s| s.0 <= r.addr && r.addr < s.1))
        {
            return bad(format!(
                "page run at {:#x} lies in a mapping of shared memory",
                r.addr
            ));
        }
        let mut by_addr: Vec<(u64, u64)> = self.runs.iter().map(|r| (r.addr, r.len)).collect();
        let mut by_data: Vec<(u64, u64)> = self.runs.iter().map(|r| (r.data_off, r.len)).collect();
        for (what, set) in [("memory", &mut by_addr), ("the page data", &mut by_data)] {
            set.retain(|r| r.1 > 0);
            set.sort_unstable();
            // Each run's end is known not to overflow (checked above).
            if let Some(w) = set.windows(2).find(|w| w[1].0 < w[0].0 + w[0].1) {
                return bad(format!(
                    "page runs overlap in {what} (at {:#x} and {:#x})",
                    w[0].0, w[1].0
                ));
            }
        }

        for p in &self.pages {
            if !aligned(p.addr) {
                return bad(format!("page at {:#x} is not page-aligned", p.addr));
            }
            let len = p.enc.encoded_len() as u64;
            if matches!(
                p.enc,
                PageEncoding::Delta { .. } | PageEncoding::Compressed { .. }
            ) && len >= PAGE
            {
                return bad(format!(
                    "page at {:#x} is encoded as {:?}: not shorter than a raw page",
                    p.addr, p.enc
                ));
            }
            if p.data_off.checked_add(len).is_none_or(|e| e > data_len) {
                return bad(format!("page at {:#x} lies outside the page data", p.addr));
            }
        }
        for (what, set) in [("reset", &self.reset), ("copied-on-write", &self.cow)] {
            if let Some(&(s, e)) = set.iter().find(|(s, e)| s > e) {
                return bad(format!("{what} range {s:#x}-{e:#x} ends before it starts"));
            }
        }

        if let Some(s) = self
            .sigactions
            .iter()
            .find(|s| !(1..=64).contains(&s.signo))
        {
            return bad(format!("signal action for signal {}", s.signo));
        }
        let mut fds: Vec<i32> = self.fds.iter().map(|f| f.fd).collect();
        fds.sort_unstable();
        if let Some(&fd) = fds.first().filter(|&&fd| fd < 0) {
            return bad(format!("descriptor {fd} is negative"));
        }
        if let Some(w) = fds.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("descriptor {} appears twice", w[0]));
        }

        // Paths become C strings on restore.
        let paths = [
            ("executable", &self.exe.path),
            ("working directory", &self.cwd),
        ]
        .into_iter()
        .chain(self.files.iter().map(|f| ("mapped file", &f.path)));
        for (what, p) in paths {
            if p.contains('\0') {
                return bad(format!("{what} {p:?} contains a NUL byte"));
            }
        }
        for f in &self.fds {
            validate_fd(f)?;
        }
        self.validate_timers(&tids)?;
        self.validate_seccomp(&tids)?;
        self.validate_shm(data_len, tree_shm)?;
        self.creds
            .groups
            .len()
            .le(&65536)
            .then_some(())
            .ok_or_else(|| FormatError::Meta("more than 65,536 supplementary groups".into()))?;
        if self.pgid < 0 || self.sid < 0 {
            return bad(format!(
                "process {} has group {} and session {}",
                self.pid, self.pgid, self.sid
            ));
        }
        self.private_files.validate(None).map_err(FormatError::Meta)
    }

    /// The members of a tree (none inside a member): each one's data slice after the main
    /// process's data and the previous member's, inside the data; its image valid against its
    /// slice, of the same kind as the main process's (full, or incremental on the same base);
    /// every PID and TID of the tree distinct; each parent the main process or an earlier
    /// member; groups and sessions not negative.
    fn validate_tree(&self, data_len: u64) -> Result<(), FormatError> {
        fn bad<T>(m: String) -> Result<T, FormatError> {
            Err(FormatError::Meta(m))
        }
        if self.tree.is_empty() {
            return Ok(());
        }
        // Where the main process's data ends (runs, encoded pages and shared memory runs lie
        // inside the data: checked above).
        let mut end = self
            .runs
            .iter()
            .chain(self.shm.iter().flat_map(|o| &o.runs))
            .map(|r| r.data_off.saturating_add(r.len))
            .chain(
                self.pages
                    .iter()
                    .map(|p| p.data_off.saturating_add(p.enc.encoded_len() as u64)),
            )
            .max()
            .unwrap_or(0);
        let mut ids: Vec<i32> = std::iter::once(self.pid)
            .chain(self.threads.iter().map(|t| t.tid))
            .collect();
        let mut pids = vec![self.pid];
        for m in &self.tree {
            let img = &m.image;
            if !img.tree.is_empty() {
                return bad(format!("process {} holds processes of its own", img.pid));
            }
            match (self.base_epoch, img.base_epoch) {
                (None, Some(_)) => {
                    return bad(format!(
                        "process {} is incremental in a full checkpoint",
                        img.pid
                    ));
                }
                // A process that appeared (or ran `execve`) since the base: whole, a "fresh"
                // member (see `store::Image::apply`).
                (Some(_), None) => {}
                (Some(a), Some(b)) if a != b => {
                    return bad(format!(
                        "process {} applies to epoch {b}, the main process to epoch {a}",
                        img.pid
                    ));
                }
                _ => {}
            }
            let f = &img.private_files;
            if !f.dirs.is_empty()
                || !f.upsert.is_empty()
                || !f.remove.is_empty()
                || !f.owners.is_empty()
            {
                return bad(format!(
                    "process {} carries private files (the main process carries them)",
                    img.pid
                ));
            }
            let m_end = m.data_off.checked_add(m.data_len);
            if m.data_off < end || m_end.is_none_or(|e| e > data_len) {
                return bad(format!(
                    "the page data of process {} overlaps another's or lies outside the data",
                    img.pid
                ));
            }
            if !img.shared_files.is_empty() {
                return bad(format!(
                    "process {} lists shared descriptors (the main process lists them)",
                    img.pid
                ));
            }
            if !img.zombies.is_empty() {
                return bad(format!(
                    "process {} lists zombies (the main process lists them)",
                    img.pid
                ));
            }
            img.validate_one(m.data_len, Some(&self.shm))
                .map_err(|e| match e {
                    FormatError::Meta(m) => FormatError::Meta(format!("process {}: {m}", img.pid)),
                    e => e,
                })?;
            if !pids.contains(&m.ppid) {
                return bad(format!(
                    "process {} names parent {}, which is not listed before it",
                    img.pid, m.ppid
                ));
            }
            let tids = img.threads.iter().map(|t| t.tid).filter(|&t| t != img.pid);
            for id in std::iter::once(img.pid).chain(tids) {
                if ids.contains(&id) {
                    return bad(format!("process or thread {id} appears twice in the tree"));
                }
                ids.push(id);
            }
            pids.push(img.pid);
            end = m_end.unwrap_or(data_len);
        }
        Ok(())
    }
}

impl ProcessImage {
    /// The shared descriptions (a tree's main process only): each one a
    /// valid descriptor that is neither itself a reference to a shared one nor an epoll
    /// instance (whose interest list names descriptor numbers of one process), held at least
    /// once; each holder a process of the tree and a descriptor of it that names this entry;
    /// every descriptor that names an entry listed among its holders (so no descriptor is
    /// both private and shared, and none names an entry out of range). In an incremental
    /// checkpoint, a process whose descriptors are carried over from the base is checked by
    /// the receiver, on the resolved descriptors.
    fn validate_shared(&self) -> Result<(), FormatError> {
        fn bad<T>(m: String) -> Result<T, FormatError> {
            Err(FormatError::Meta(m))
        }
        // Every descriptor of the tree that names a shared entry: (pid, fd, index).
        let procs = std::iter::once(self).chain(self.tree.iter().map(|m| &m.image));
        let mut named: Vec<(i32, i32, u32)> = Vec::new();
        for p in procs.clone() {
            for f in &p.fds {
                if let FdKind::Shared(i) = f.kind {
                    if i as usize >= self.shared_files.len() {
                        return bad(format!(
                            "descriptor {} of process {} names shared description #{i} of {}",
                            f.fd,
                            p.pid,
                            self.shared_files.len()
                        ));
                    }
                    named.push((p.pid, f.fd, i));
                }
            }
        }
        if self.shared_files.is_empty() {
            return Ok(());
        }
        if self.tree.is_empty() {
            return bad("a single process lists shared descriptors".into());
        }
        let mut held: Vec<(i32, i32, u32)> = Vec::with_capacity(named.len());
        for (i, s) in self.shared_files.iter().enumerate() {
            match s.file.kind {
                FdKind::Shared(_) => {
                    return bad(format!(
                        "shared description #{i} names another shared description"
                    ));
                }
                FdKind::Epoll { .. } => {
                    return bad(format!("shared description #{i} is an epoll instance"));
                }
                _ => {}
            }
            validate_fd(&s.file).map_err(|e| match e {
                FormatError::Meta(m) => FormatError::Meta(format!("shared description #{i}: {m}")),
                e => e,
            })?;
            if s.holders.is_empty() {
                return bad(format!("shared description #{i} has no holder"));
            }
            for &(pid, fd) in &s.holders {
                let Some(p) = procs.clone().find(|p| p.pid == pid) else {
                    return bad(format!(
                        "shared description #{i} is held by process {pid}, which is not in the tree"
                    ));
                };
                // An incremental checkpoint may carry a process's descriptors over from its
                // base: the receiver checks them once resolved (`store::Image::apply`).
                let listed = !p.carried.fds;
                match p.fds.iter().find(|f| f.fd == fd).map(|f| &f.kind) {
                    _ if !listed => {}
                    Some(FdKind::Shared(j)) if *j as usize == i => {}
                    Some(FdKind::Shared(j)) => {
                        return bad(format!(
                            "shared description #{i} is held as descriptor {fd} of process {pid}, \
                             which names shared description #{j}"
                        ));
                    }
                    Some(_) => {
                        return bad(format!(
                            "descriptor {fd} of process {pid} is both private and shared \
                             description #{i}"
                        ));
                    }
                    None => {
                        return bad(format!(
                            "shared description #{i} is held as descriptor {fd} of process {pid}, \
                             which has no such descriptor"
                        ));
                    }
                }
                held.push((pid, fd, i as u32));
            }
        }
        held.sort_unstable();
        if let Some(w) = held.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!(
                "shared description #{} lists holder ({}, {}) twice",
                w[0].2, w[0].0, w[0].1
            ));
        }
        // The objects the restore makes whole from shared entries (a pipe, connected unix
        // sockets) have no part left private: it would be made a second time, apart.
        let mut pipes: Vec<u64> = Vec::new();
        let mut sockets: Vec<u64> = Vec::new();
        for s in &self.shared_files {
            match &s.file.kind {
                FdKind::Pipe { id, .. } => pipes.push(*id),
                FdKind::Unix(u) => sockets.push(u.ino),
                _ => {}
            }
        }
        pipes.sort_unstable();
        sockets.sort_unstable();
        for p in procs {
            for f in &p.fds {
                let apart = match &f.kind {
                    FdKind::Pipe { id, .. } => pipes.binary_search(id).is_ok(),
                    FdKind::Unix(u) => {
                        sockets.binary_search(&u.ino).is_ok()
                            || sockets.binary_search(&u.peer_ino).is_ok()
                    }
                    _ => false,
                };
                if apart {
                    return bad(format!(
                        "descriptor {} of process {} is private but belongs with a shared \
                         pipe or unix socket",
                        f.fd, p.pid
                    ));
                }
            }
        }
        named.sort_unstable();
        // Every holder names its entry (checked above) and none is listed twice: the lists
        // agree when they have the same length; otherwise a descriptor names an entry that
        // does not list it.
        if let Some(&(pid, fd, i)) = named.iter().find(|n| held.binary_search(n).is_err()) {
            return bad(format!(
                "descriptor {fd} of process {pid} names shared description #{i}, which does not \
                 list it as a holder"
            ));
        }
        Ok(())
    }
}

/// What one descriptor must satisfy wherever it is listed: paths without NUL bytes (they
/// become C strings on restore), unix socket addresses and types Linux has, inotify watches
/// with positive, distinct numbers and paths.
fn validate_fd(f: &FdImage) -> Result<(), FormatError> {
    fn bad<T>(m: String) -> Result<T, FormatError> {
        Err(FormatError::Meta(m))
    }
    match &f.kind {
        FdKind::Path { path, .. } if path.contains('\0') => {
            bad(format!("descriptor path {path:?} contains a NUL byte"))
        }
        FdKind::Unix(u) => {
            u.local.check().or_else(bad)?;
            u.peer.check().or_else(bad)?;
            if ![
                libc_types::SOCK_STREAM,
                libc_types::SOCK_DGRAM,
                libc_types::SOCK_SEQPACKET,
            ]
            .contains(&u.ty)
            {
                return bad(format!(
                    "unix socket of descriptor {} has type {}",
                    f.fd, u.ty
                ));
            }
            Ok(())
        }
        FdKind::Inotify { watches } => {
            let mut wds: Vec<i32> = watches.iter().map(|w| w.wd).collect();
            wds.sort_unstable();
            if let Some(&wd) = wds.first().filter(|&&wd| wd <= 0) {
                return bad(format!("inotify descriptor {} has watch {wd}", f.fd));
            }
            if let Some(w) = wds.windows(2).find(|w| w[0] == w[1]) {
                return bad(format!(
                    "inotify descriptor {} has watch {} twice",
                    f.fd, w[0]
                ));
            }
            if let Some(w) = watches
                .iter()
                .find(|w| w.path.is_empty() || w.path.contains('\0'))
            {
                return bad(format!(
                    "inotify watch {} of descriptor {} has path {:?}",
                    w.wd, f.fd, w.path
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

impl ProcessImage {
    /// Timer ids non-negative and distinct, notification kinds Linux knows, a thread-directed
    /// timer naming a thread of the image, signals 1–64 (0 allowed for `SIGEV_NONE`), times
    /// that fit a `timespec`, interval timers 0–2 and each at most once.
    fn validate_timers(&self, tids: &[i32]) -> Result<(), FormatError> {
        let bad = |m: String| Err(FormatError::Meta(m));
        // Seconds must fit an i64 timespec: any u64 of nanoseconds does.
        let mut ids: Vec<i32> = Vec::with_capacity(self.timers.posix.len());
        for t in &self.timers.posix {
            if t.id < 0 {
                return bad(format!("POSIX timer id {} is negative", t.id));
            }
            ids.push(t.id);
            match t.notify {
                sigev::SIGNAL | sigev::THREAD | sigev::THREAD_ID => {
                    if !(1..=64).contains(&t.signo) {
                        return bad(format!("POSIX timer {} signals {}", t.id, t.signo));
                    }
                }
                sigev::NONE if (0..=64).contains(&t.signo) => {}
                _ => {
                    return bad(format!(
                        "POSIX timer {} has notification {} (signal {})",
                        t.id, t.notify, t.signo
                    ));
                }
            }
            if t.notify == sigev::THREAD_ID && tids.binary_search(&t.tid).is_err() {
                return bad(format!(
                    "POSIX timer {} signals thread {}, which is not in the image",
                    t.id, t.tid
                ));
            }
        }
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("POSIX timer {} appears twice", w[0]));
        }
        let mut which: Vec<u32> = self.timers.itimers.iter().map(|t| t.which).collect();
        which.sort_unstable();
        if let Some(&w) = which.iter().find(|&&w| w > 2) {
            return bad(format!("interval timer {w}"));
        }
        if let Some(w) = which.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("interval timer {} appears twice", w[0]));
        }
        Ok(())
    }

    /// Shared memory objects: distinct ids (System V ones non-negative, with their
    /// description, anonymous ones without), sizes of 1 byte to [`SHM_MAX_SIZE`], runs
    /// page-aligned, inside the object (rounded up to pages) and inside the data, not
    /// overlapping one another in the object; `fresh` only in an incremental checkpoint; and
    /// every mapping of one naming an object of the image, inside it. A member of a tree
    /// (`tree_shm`: the main process's objects, already checked) lists none of its own, and
    /// its mappings name the main process's.
    fn validate_shm(
        &self,
        data_len: u64,
        tree_shm: Option<&[ShmObject]>,
    ) -> Result<(), FormatError> {
        let bad = |m: String| Err(FormatError::Meta(m));
        const PAGE: u64 = crate::delta::PAGE_SIZE as u64;
        if tree_shm.is_some() && !self.shm.is_empty() {
            return bad(format!(
                "process {} lists shared memory objects (the main process lists a tree's)",
                self.pid
            ));
        }
        let mut ids: Vec<(ShmId, u64)> = Vec::with_capacity(self.shm.len());
        for o in tree_shm.unwrap_or_default() {
            ids.push((o.id, o.size.div_ceil(PAGE).saturating_mul(PAGE)));
        }
        for o in &self.shm {
            if o.size == 0 || o.size > SHM_MAX_SIZE {
                return bad(format!("shared memory {:?} has size {}", o.id, o.size));
            }
            match (o.id, &o.sysv) {
                (ShmId::Sysv(id), Some(_)) if id >= 0 => {}
                (id, None) if id.is_anonymous() => {}
                _ => return bad(format!("shared memory {:?} is described wrongly", o.id)),
            }
            if o.fresh && self.base_epoch.is_none() {
                return bad(format!(
                    "shared memory {:?} is fresh in a full checkpoint",
                    o.id
                ));
            }
            let size = o.size.div_ceil(PAGE) * PAGE;
            let mut spans: Vec<(u64, u64)> = Vec::with_capacity(o.runs.len());
            for r in &o.runs {
                let end = r.addr.checked_add(r.len);
                if !r.addr.is_multiple_of(PAGE)
                    || !r.len.is_multiple_of(PAGE)
                    || end.is_none_or(|e| e > size)
                    || r.data_off.checked_add(r.len).is_none_or(|e| e > data_len)
                {
                    return bad(format!(
                        "a page run of shared memory {:?} ({} bytes at {:#x}) lies outside it \
                         or the page data",
                        o.id, r.len, r.addr
                    ));
                }
                if r.len > 0 {
                    spans.push((r.addr, r.len));
                }
            }
            spans.sort_unstable();
            if spans.windows(2).any(|w| w[1].0 < w[0].0 + w[0].1) {
                return bad(format!("page runs of shared memory {:?} overlap", o.id));
            }
            ids.push((o.id, size));
        }
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0].0 == w[1].0) {
            return bad(format!("shared memory {:?} appears twice", w[0].0));
        }
        for v in &self.vmas {
            if let Backing::Shm { id, offset } = v.backing {
                let Ok(i) = ids.binary_search_by_key(&id, |x| x.0) else {
                    return bad(format!(
                        "mapping at {:#x} names shared memory {id:?}, which is not in the image",
                        v.start
                    ));
                };
                if !offset.is_multiple_of(PAGE)
                    || offset
                        .checked_add(v.end - v.start)
                        .is_none_or(|e| e > ids[i].1)
                {
                    return bad(format!(
                        "mapping at {:#x} lies outside shared memory {id:?}",
                        v.start
                    ));
                }
            }
        }
        Ok(())
    }

    /// Filters of 1 to [`SECCOMP_MAX_INSNS`] instructions with no flag but `LOG`; chains of
    /// threads of the image, each thread once, indices inside the filters, at most
    /// [`SECCOMP_MAX_PATH`] instructions per chain as the kernel counts them.
    fn validate_seccomp(&self, tids: &[i32]) -> Result<(), FormatError> {
        let bad = |m: String| Err(FormatError::Meta(m));
        for (i, f) in self.seccomp.filters.iter().enumerate() {
            if f.insns.is_empty() || f.insns.len() > SECCOMP_MAX_INSNS {
                return bad(format!(
                    "seccomp filter #{i} has {} instructions",
                    f.insns.len()
                ));
            }
            if f.flags & !2 != 0 {
                return bad(format!("seccomp filter #{i} has flags {:#x}", f.flags));
            }
        }
        let mut seen: Vec<i32> = Vec::with_capacity(self.seccomp.chains.len());
        for c in &self.seccomp.chains {
            if tids.binary_search(&c.tid).is_err() {
                return bad(format!(
                    "seccomp filters of thread {}, which is not in the image",
                    c.tid
                ));
            }
            seen.push(c.tid);
            let mut total = 0usize;
            for &i in &c.filters {
                let Some(f) = self.seccomp.filters.get(i as usize) else {
                    return bad(format!(
                        "thread {} names seccomp filter #{i} of {}",
                        c.tid,
                        self.seccomp.filters.len()
                    ));
                };
                total += f.insns.len() + 4;
            }
            if c.filters.is_empty() || total > SECCOMP_MAX_PATH {
                return bad(format!(
                    "thread {} has a chain of {} seccomp filters ({total} instructions)",
                    c.tid,
                    c.filters.len()
                ));
            }
        }
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("seccomp filters of thread {} appear twice", w[0]));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A process image with one thread (TID 1) and `vmas`, nothing else (for tests of this
    /// crate).
    pub(crate) fn meta(vmas: Vec<Vma>) -> ProcessImage {
        ProcessImage {
            pid: 1,
            comm: String::new(),
            exe: FileRef {
                path: String::new(),
                size: 0,
                hash: [0; 32],
            },
            cwd: "/".into(),
            umask: 0,
            rlimits: vec![],
            mm: MmInfo::default(),
            auxv: vec![],
            vmas,
            runs: vec![],
            files: vec![],
            threads: vec![ThreadImage {
                comm: String::new(),
                xstate: vec![],
                ..thread(1, 0)
            }],
            sigactions: vec![],
            fds: vec![],
            max_tid: 1,
            sandbox: vec![],
            base_epoch: None,
            reset: vec![],
            pages: vec![],
            cow: vec![],
            private_files: Default::default(),
            creds: Default::default(),
            carried: Default::default(),
            timers: Default::default(),
            seccomp: Default::default(),
            shm: Vec::new(),
            pgid: 0,
            sid: 0,
            tree: Vec::new(),
            shared_files: Vec::new(),
            zombies: Vec::new(),
            pending: Vec::new(),
            scrub: None,
        }
    }

    /// Thread `tid` at instruction pointer `rip` (for tests of this crate).
    pub(crate) fn thread(tid: i32, rip: u64) -> ThreadImage {
        let mut regs = vec![0; 27];
        regs[16] = rip;
        ThreadImage {
            tid,
            comm: format!("t{tid}"),
            regs,
            xstate: vec![tid as u8; 64],
            sigmask: 0,
            robust_list: 0,
            robust_len: 0,
            clear_child_tid: 0,
            rseq: None,
            altstack: AltStack::default(),
            pending: Vec::new(),
        }
    }

    fn sample(kind: Kind) -> Checkpoint {
        let image = ProcessImage {
            pid: 2,
            comm: "x".into(),
            exe: FileRef {
                path: "/bin/x".into(),
                size: 1,
                hash: [1; 32],
            },
            umask: 0o22,
            vmas: vec![Vma {
                start: 0x1000,
                end: 0x3000,
                prot: 3,
                shared: false,
                flags: 0,
                backing: Backing::Anon,
                name: String::new(),
            }],
            runs: vec![PageRun {
                addr: 0x1000,
                len: 4096,
                data_off: 0,
            }],
            threads: vec![ThreadImage {
                comm: "x".into(),
                xstate: vec![0; 832],
                ..thread(2, 0)
            }],
            max_tid: 2,
            base_epoch: match kind {
                Kind::Full => None,
                Kind::Incremental { base } => Some(base),
            },
            ..meta(vec![])
        };
        Checkpoint {
            epoch: 7,
            kind,
            image,
            data: vec![5; 4096],
        }
    }

    /// Inotify descriptor 4 with one watch, `wd` on `path`.
    fn inotify_fd(wd: i32, path: &str) -> FdImage {
        FdImage {
            fd: 4,
            cloexec: false,
            flags: 0,
            kind: FdKind::Inotify {
                watches: vec![InotifyWatch {
                    wd,
                    mask: 2,
                    path: path.into(),
                }],
            },
        }
    }

    fn timer(id: i32) -> PosixTimer {
        PosixTimer {
            id,
            clock: 1,
            signo: 10,
            notify: sigev::SIGNAL,
            tid: 0,
            sigval: 0,
            value_ns: 1,
            interval_ns: 0,
        }
    }

    #[test]
    fn roundtrips_full_and_incremental() {
        for kind in [Kind::Full, Kind::Incremental { base: 6 }] {
            let ck = sample(kind);
            let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
            assert_eq!((back.epoch, back.kind), (7, kind));
            assert_eq!(back.data, ck.data);
            assert_eq!(back.image.runs, ck.image.runs);
        }
    }

    #[test]
    fn opens_files_and_refuses_bad_ones() {
        let dir = std::env::temp_dir().join(format!("tardi-image-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ck = sample(Kind::Full);
        let bytes = ck.to_bytes();
        let good = dir.join("good");
        std::fs::write(&good, &bytes).unwrap();
        let f = CheckpointFile::open(&good).unwrap();
        assert_eq!(
            (f.epoch, f.kind, f.image.runs.clone()),
            (7, Kind::Full, ck.image.runs.clone())
        );
        let mut page = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&f.file, &mut page, f.data_offset).unwrap();
        assert_eq!(page, ck.data);
        let bad = dir.join("bad");
        let mut flipped = bytes.clone();
        let n = flipped.len();
        flipped[n - 100] ^= 4;
        std::fs::write(&bad, &flipped).unwrap();
        assert!(matches!(
            CheckpointFile::open(&bad),
            Err(FormatError::Checksum { .. })
        ));
        std::fs::write(&bad, &bytes[..n - 1]).unwrap();
        assert!(matches!(
            CheckpointFile::open(&bad),
            Err(FormatError::Truncated { .. })
        ));
        std::fs::write(&bad, b"").unwrap();
        assert!(matches!(
            CheckpointFile::open(&bad),
            Err(FormatError::Empty)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_truncated_corrupted_and_foreign_bytes() {
        let bytes = sample(Kind::Full).to_bytes();
        for cut in [0, 7, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                Checkpoint::from_bytes(bytes[..cut].to_vec()).is_err(),
                "cut at {cut}"
            );
        }
        let mut flipped = bytes.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 1;
        assert!(matches!(
            Checkpoint::from_bytes(flipped),
            Err(FormatError::Checksum { .. })
        ));
        assert!(matches!(
            Checkpoint::from_bytes(b"not a checkpoint at all".to_vec()),
            Err(FormatError::BadMagic)
        ));
    }

    /// Every consistency rule refuses what breaks it, with a message naming it, through
    /// `from_bytes` as through `validate`.
    #[test]
    fn refuses_inconsistent_metadata() {
        use crate::delta::Codec;
        use crate::files::Entry;
        type Break = fn(&mut Checkpoint);
        let cases: Vec<(&str, Break)> = vec![
            ("no threads", |c| c.image.threads.clear()),
            ("process id", |c| c.image.pid = 0),
            ("not positive", |c| c.image.threads[0].tid = -1),
            ("26 registers", |c| {
                c.image.threads[0].regs.pop();
            }),
            ("XSAVE area of 4097", |c| {
                c.image.threads[0].xstate = vec![0; 4097]
            }),
            ("appears twice", |c| {
                let t = c.image.threads[0].clone();
                c.image.threads.push(t);
            }),
            ("empty or not page-aligned", |c| {
                c.image.vmas[0].end = 0x1000
            }),
            ("empty or not page-aligned", |c| {
                c.image.vmas[0].start = 0x1001
            }),
            ("names file #0 of 0", |c| {
                c.image.vmas[0].backing = Backing::File {
                    index: 0,
                    offset: 0,
                }
            }),
            ("overlap", |c| {
                let mut v = c.image.vmas[0].clone();
                v.start = 0x2000;
                v.end = 0x4000;
                c.image.vmas.push(v);
            }),
            ("not page-aligned", |c| c.image.runs[0].len = 100),
            ("outside the page data", |c| c.image.runs[0].data_off = 1),
            ("outside the page data", |c| c.image.runs[0].len = !0xfff),
            ("outside every mapping", |c| c.image.runs[0].addr = 0x5000),
            ("outside every mapping", |c| {
                c.image.runs[0].addr = 0x2000;
                c.image.runs[0].len = 0x2000;
                c.data = vec![0; 0x2000];
            }),
            ("outside every mapping", |c| {
                // addr + len overflows.
                c.image.vmas[0].start = u64::MAX - 0xfff - 0x1000;
                c.image.vmas[0].end = u64::MAX - 0xfff;
                c.image.runs[0].addr = u64::MAX - 0xfff - 0x1000;
                c.image.runs[0].len = 0x2000;
                c.data = vec![0; 0x2000];
            }),
            ("overlap in memory", |c| {
                c.data = vec![0; 0x2000];
                c.image.runs.push(PageRun {
                    addr: 0x1000,
                    len: 0x1000,
                    data_off: 0x1000,
                });
            }),
            ("overlap in the page data", |c| {
                c.image.runs.push(PageRun {
                    addr: 0x2000,
                    len: 0x1000,
                    data_off: 0,
                });
            }),
            ("not page-aligned", |c| {
                c.image.pages.push(EncodedPage {
                    addr: 0x1008,
                    enc: PageEncoding::Zero,
                    data_off: 0,
                })
            }),
            ("outside the page data", |c| {
                c.image.pages.push(EncodedPage {
                    addr: 0x1000,
                    enc: PageEncoding::Raw,
                    data_off: u64::MAX,
                })
            }),
            ("not shorter than a raw page", |c| {
                c.data = vec![0; 5000];
                c.image.pages.push(EncodedPage {
                    addr: 0x1000,
                    enc: PageEncoding::Delta {
                        codec: Codec::XorZstd,
                        len: 4096,
                    },
                    data_off: 0,
                })
            }),
            ("ends before it starts", |c| c.image.reset.push((2, 1))),
            ("ends before it starts", |c| {
                c.image.cow.push((0x3000, 0x2000))
            }),
            ("signal 65", |c| {
                c.image.sigactions.push(SigAction {
                    signo: 65,
                    handler: 0,
                    flags: 0,
                    restorer: 0,
                    mask: 0,
                })
            }),
            ("descriptor -1", |c| {
                c.image.fds.push(FdImage {
                    fd: -1,
                    cloexec: false,
                    flags: 0,
                    kind: FdKind::EventFd {
                        count: 0,
                        semaphore: false,
                    },
                })
            }),
            ("descriptor 3 appears twice", |c| {
                let fd = FdImage {
                    fd: 3,
                    cloexec: false,
                    flags: 0,
                    kind: FdKind::SignalFd { mask: 0 },
                };
                c.image.fds.push(fd.clone());
                c.image.fds.push(fd);
            }),
            ("working directory \"/a\\0b\" contains a NUL", |c| {
                c.image.cwd = "/a\0b".into()
            }),
            ("executable", |c| c.image.exe.path.push('\0')),
            ("mapped file", |c| {
                c.image.files.push(FileRef {
                    path: "/lib\0".into(),
                    size: 0,
                    hash: [0; 32],
                })
            }),
            ("descriptor path", |c| {
                c.image.fds.push(FdImage {
                    fd: 0,
                    cloexec: false,
                    flags: 0,
                    kind: FdKind::Path {
                        path: "/dev/\0".into(),
                        pos: 0,
                        is_dir: false,
                    },
                })
            }),
            ("not inside a private directory", |c| {
                c.image.private_files.dirs = vec!["/data".into()];
                c.image.private_files.remove = vec!["/etc/passwd".into()];
            }),
            ("not canonical", |c| {
                c.image.private_files.dirs = vec!["/data".into()];
                c.image.private_files.upsert =
                    vec![("/data/../etc".into(), Entry::Dir { mode: 0o755 })];
            }),
            ("base epoch", |c| c.image.base_epoch = Some(3)),
            ("POSIX timer id -1", |c| {
                c.image.timers.posix.push(timer(-1))
            }),
            ("POSIX timer 4 appears twice", |c| {
                c.image.timers.posix.push(timer(4));
                c.image.timers.posix.push(timer(4));
            }),
            ("signals 0", |c| {
                let mut t = timer(1);
                t.signo = 0;
                c.image.timers.posix.push(t);
            }),
            ("notification 3", |c| {
                let mut t = timer(1);
                t.notify = 3;
                c.image.timers.posix.push(t);
            }),
            ("signals thread 9, which is not in the image", |c| {
                let mut t = timer(1);
                t.notify = sigev::THREAD_ID;
                t.tid = 9;
                c.image.timers.posix.push(t);
            }),
            ("interval timer 3", |c| {
                c.image.timers.itimers.push(ITimer {
                    which: 3,
                    value_ns: 1,
                    interval_ns: 0,
                })
            }),
            ("seccomp filter #0 has 0 instructions", |c| {
                c.image.seccomp.filters.push(SeccompFilter {
                    flags: 0,
                    insns: vec![],
                })
            }),
            ("seccomp filter #0 has flags 0x1", |c| {
                c.image.seccomp.filters.push(SeccompFilter {
                    flags: 1,
                    insns: vec![6],
                })
            }),
            ("names seccomp filter #0 of 0", |c| {
                c.image.seccomp.chains.push(SeccompChain {
                    tid: 2,
                    filters: vec![0],
                })
            }),
            ("seccomp filters of thread 3, which is not", |c| {
                c.image.seccomp.chains.push(SeccompChain {
                    tid: 3,
                    filters: vec![],
                })
            }),
            ("instructions)", |c| {
                c.image.seccomp.filters.push(SeccompFilter {
                    flags: 0,
                    insns: vec![6; SECCOMP_MAX_INSNS],
                });
                c.image.seccomp.chains.push(SeccompChain {
                    tid: 2,
                    filters: vec![0; 8],
                })
            }),
            ("inotify descriptor 4 has watch 0", |c| {
                c.image.fds.push(inotify_fd(0, "/x"))
            }),
            ("has path \"\"", |c| c.image.fds.push(inotify_fd(1, ""))),
        ];
        let good = sample(Kind::Full);
        good.validate().unwrap();
        for (want, break_it) in cases {
            let mut ck = good.clone();
            break_it(&mut ck);
            let err = ck.validate().expect_err(want).to_string();
            assert!(err.contains(want), "expected {want:?}, got {err:?}");
            // The same through the wire (the header's kind comes from `kind`).
            let err = Checkpoint::from_bytes(ck.to_bytes())
                .expect_err(want)
                .to_string();
            assert!(
                err.contains(want) || want == "base epoch" && err.contains("full checkpoint"),
                "from_bytes: expected {want:?}, got {err:?}"
            );
        }
    }

    /// `c` is refused, with a message containing `want`, by `validate` and by `from_bytes` of
    /// its encoding.
    fn assert_refused(c: &Checkpoint, want: &str) {
        let err = c.validate().expect_err(want).to_string();
        assert!(
            err.contains(want),
            "validate: expected {want:?}, got {err:?}"
        );
        let err = Checkpoint::from_bytes(c.to_bytes())
            .expect_err(want)
            .to_string();
        assert!(
            err.contains(want),
            "from_bytes: expected {want:?}, got {err:?}"
        );
    }

    /// A full checkpoint of `sample` with one member, pid 5, whose data follows the root's.
    fn with_member() -> Checkpoint {
        let mut ck = sample(Kind::Full);
        let mut m = ck.image.clone();
        m.pid = 5;
        m.threads.truncate(1);
        m.threads[0].tid = 5;
        m.max_tid = 5;
        m.sandbox.clear();
        m.private_files = Default::default();
        let end = ck
            .image
            .runs
            .iter()
            .map(|r| r.data_off + r.len)
            .max()
            .unwrap_or(0);
        let len = m.runs.iter().map(|r| r.data_off + r.len).max().unwrap_or(0);
        let off = ck.data.len() as u64;
        ck.data.extend(std::iter::repeat_n(7u8, len as usize));
        assert!(off >= end);
        ck.image.tree.push(Member {
            ppid: ck.image.pid,
            data_off: off,
            data_len: len,
            image: m,
        });
        ck
    }

    #[test]
    fn trees_roundtrip_and_inconsistent_ones_are_refused() {
        let ck = with_member();
        ck.validate().unwrap();
        let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
        assert_eq!(back.image.tree.len(), 1);
        assert_eq!(back.image.tree[0].image.pid, 5);

        type Break = fn(&mut Checkpoint);
        let cases: Vec<(&str, Break)> = vec![
            ("not listed before it", |c| c.image.tree[0].ppid = 9),
            ("overlaps another's", |c| c.image.tree[0].data_off = 0),
            ("overlaps another's", |c| c.image.tree[0].data_len += 1),
            ("appears twice in the tree", |c| {
                c.image.tree[0].image.pid = c.image.pid;
                c.image.tree[0].image.threads[0].tid = c.image.pid;
            }),
            ("group", |c| c.image.tree[0].image.sid = -1),
            ("carries private files", |c| {
                c.image.tree[0].image.private_files.dirs = vec!["/data".into()]
            }),
            ("process 5: no threads", |c| {
                c.image.tree[0].image.threads.clear()
            }),
            ("process 5 is incremental in a full checkpoint", |c| {
                c.image.tree[0].image.base_epoch = Some(6);
            }),
            ("holds processes of its own", |c| {
                let m = c.image.tree[0].clone();
                c.image.tree[0].image.tree.push(Member { data_len: 0, ..m });
            }),
        ];
        for (want, brk) in cases {
            let mut c = with_member();
            brk(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(
                err.contains(want),
                "validate: expected {want:?}, got {err:?}"
            );
        }

        // A nested tree is refused while decoding, before its members are decoded (so no
        // depth of nesting can recurse further).
        let mut c = with_member();
        let m = c.image.tree[0].clone();
        c.image.tree[0].image.tree.push(m);
        // (postcard keeps no custom message: the error is a malformed-metadata one.)
        let err = Checkpoint::from_bytes(c.to_bytes()).unwrap_err();
        assert!(matches!(err, FormatError::Meta(_)), "{err}");
    }

    /// [`with_member`] with two zombies: one of the main process (exited 7), one of the
    /// member (killed by SIGKILL).
    fn with_zombies() -> Checkpoint {
        let mut ck = with_member();
        let z = |pid, ppid, status| Zombie {
            pid,
            ppid,
            pgid: 0,
            sid: 0,
            uid: 0,
            status,
        };
        ck.image.zombies = vec![z(8, ck.image.pid, 7 << 8), z(9, 5, 9)];
        ck
    }

    #[test]
    fn zombies_roundtrip_and_inconsistent_ones_are_refused() {
        let ck = with_zombies();
        ck.validate().unwrap();
        let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
        assert_eq!(back.image.zombies, ck.image.zombies);
        // A single process may have zombie children too.
        let mut single = sample(Kind::Full);
        single.image.zombies = vec![ck.image.zombies[0]];
        single.validate().unwrap();
        // An incremental checkpoint lists the zombies of its epoch too (the epoch loop).
        let mut inc = incremental_tree();
        inc.image.zombies = vec![Zombie {
            pid: 8,
            ppid: 5,
            pgid: 2,
            sid: 2,
            uid: 0,
            status: 3 << 8,
        }];
        inc.validate().unwrap();

        type Break = fn(&mut Checkpoint);
        let cases: Vec<(&str, Break)> = vec![
            ("not positive or not its own", |c| {
                c.image.zombies[0].pid = 0
            }),
            ("not positive or not its own", |c| {
                c.image.zombies[0].pid = 5
            }),
            ("not positive or not its own", |c| {
                c.image.zombies[0].pid = c.image.pid
            }),
            ("not positive or not its own", |c| {
                c.image.zombies[1].pid = 8
            }),
            ("not a process of the tree", |c| c.image.zombies[1].ppid = 8),
            ("has group -1", |c| c.image.zombies[0].pgid = -1),
            ("wait status 0x86", |c| c.image.zombies[0].status = 0x86),
            ("wait status 0x11", |c| c.image.zombies[0].status = 17),
            ("wait status 0x47f", |c| c.image.zombies[0].status = 0x47f),
            ("wait status 0x10700", |c| {
                c.image.zombies[0].status = 0x10700
            }),
            ("lists zombies (the main process lists them)", |c| {
                c.image.tree[0].image.zombies = vec![c.image.zombies[1]];
                c.image.zombies.pop();
            }),
        ];
        for (want, brk) in cases {
            let mut c = with_zombies();
            brk(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(
                err.contains(want),
                "validate: expected {want:?}, got {err:?}"
            );
            assert!(Checkpoint::from_bytes(c.to_bytes()).is_err(), "{want}");
        }
        for ok in [0, 1 << 8, 255 << 8, 1, 6, 9, 15, 31, 32, 64] {
            assert!(Zombie::status_valid(ok), "{ok:#x}");
        }
        for bad in [0x86, 17, 19, 28, 65, 0x7f, 0x17f, 1 << 16, -1] {
            assert!(!Zombie::status_valid(bad), "{bad:#x}");
        }
    }

    /// [`with_member`] where the main process lists an anonymous shared memory object (two
    /// pages, its first page's contents in the main process's data, before the member's) that
    /// only the member maps, at 0x10000.
    fn with_member_shm() -> Checkpoint {
        let mut ck = with_member();
        let at = ck.image.tree[0].data_off as usize;
        ck.data.splice(at..at, std::iter::repeat_n(9u8, 4096));
        ck.image.tree[0].data_off += 4096;
        ck.image.shm.push(ShmObject {
            id: ShmId::Anon(9),
            size: 8192,
            sysv: None,
            runs: vec![PageRun {
                addr: 0,
                len: 4096,
                data_off: at as u64,
            }],
            fresh: false,
        });
        ck.image.tree[0].image.vmas.push(Vma {
            start: 0x10000,
            end: 0x12000,
            prot: 3,
            shared: true,
            flags: 0,
            backing: Backing::Shm {
                id: ShmId::Anon(9),
                offset: 0,
            },
            name: String::new(),
        });
        ck
    }

    /// An unlinked file's object (`ShmId::Unlinked`) is anonymous memory to the format: valid
    /// without System V details, refused with them, and kept apart from an anonymous object
    /// with the same inode number.
    #[test]
    fn unlinked_objects_are_anonymous_and_distinct() {
        let mut ck = with_member_shm();
        let unlinked = ShmId::Unlinked { dev: 27, ino: 9 };
        assert!(unlinked.is_anonymous() && ShmId::Anon(9).is_anonymous());
        assert!(!ShmId::Sysv(9).is_anonymous());
        assert_ne!(unlinked, ShmId::Anon(9));
        ck.image.shm[0].id = unlinked;
        ck.image.tree[0].image.vmas[1].backing = Backing::Shm {
            id: unlinked,
            offset: 0,
        };
        ck.validate().unwrap();
        let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
        assert_eq!(back.image.shm, ck.image.shm);
        let mut c = ck.clone();
        c.image.tree[0].image.vmas[1].backing = Backing::Shm {
            id: ShmId::Anon(9),
            offset: 0,
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("which is not in the image"), "{err}");
        ck.image.shm[0].sysv = Some(SysvShm {
            key: 0,
            mode: 0o600,
            uid: 0,
            gid: 0,
            cuid: 0,
            cgid: 0,
            removed: false,
            locked: false,
        });
        let err = ck.validate().unwrap_err().to_string();
        assert!(err.contains("is described wrongly"), "{err}");
    }

    #[test]
    fn a_tree_lists_its_shared_memory_once_in_the_main_process() {
        let ck = with_member_shm();
        ck.validate().unwrap();
        let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
        assert_eq!(back.image.shm, ck.image.shm);
        assert_eq!(back.image.tree[0].image.vmas, ck.image.tree[0].image.vmas);

        type Break = fn(&mut Checkpoint);
        let cases: Vec<(&str, Break)> = vec![
            ("process 5 lists shared memory objects", |c| {
                let o = c.image.shm[0].clone();
                c.image.tree[0]
                    .image
                    .shm
                    .push(ShmObject { runs: vec![], ..o })
            }),
            (
                "names shared memory Anon(10), which is not in the image",
                |c| {
                    c.image.tree[0].image.vmas[1].backing = Backing::Shm {
                        id: ShmId::Anon(10),
                        offset: 0,
                    }
                },
            ),
            ("lies outside shared memory Anon(9)", |c| {
                c.image.tree[0].image.vmas[1].backing = Backing::Shm {
                    id: ShmId::Anon(9),
                    offset: 4096,
                }
            }),
            // The objects' contents are the main process's data: no member's slice over them.
            ("overlaps another's", |c| c.image.tree[0].data_off -= 4096),
        ];
        for (want, brk) in cases {
            let mut c = with_member_shm();
            brk(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(
                err.contains(want),
                "validate: expected {want:?}, got {err:?}"
            );
        }
    }

    /// [`with_member`] where the main process (pid 2) and the member (pid 5) share one
    /// listening socket at descriptor 3 and a pipe whose read end is the main process's
    /// descriptor 4 and whose write end is the member's descriptor 4.
    fn with_shared() -> Checkpoint {
        let mut ck = with_member();
        let shared = |fd: i32, i: u32| FdImage {
            fd,
            cloexec: fd == 4,
            flags: 2,
            kind: FdKind::Shared(i),
        };
        let pipe = |write_end: bool| FdImage {
            fd: 4,
            cloexec: false,
            flags: if write_end { 1 } else { 0 },
            kind: FdKind::Pipe {
                id: 77,
                write_end,
                buffered: if write_end {
                    vec![]
                } else {
                    b"queued".to_vec()
                },
                capacity: 65536,
            },
        };
        ck.image.shared_files = vec![
            SharedFile {
                file: FdImage {
                    fd: 3,
                    cloexec: false,
                    flags: 2,
                    kind: FdKind::Socket(SocketImage {
                        family: 2,
                        ty: 1,
                        protocol: 6,
                        state: SocketState::Listening { backlog: 16 },
                        local: vec![2, 0, 0x1f, 0x90, 0, 0, 0, 0],
                        peer: vec![],
                        options: vec![],
                    }),
                },
                holders: vec![(2, 3), (5, 3)],
            },
            SharedFile {
                file: pipe(false),
                holders: vec![(2, 4)],
            },
            SharedFile {
                file: pipe(true),
                holders: vec![(5, 4)],
            },
        ];
        ck.image.fds = vec![shared(3, 0), shared(4, 1)];
        ck.image.tree[0].image.fds = vec![shared(3, 0), shared(4, 2)];
        ck
    }

    /// Shared descriptions round-trip, and every rule about them refuses what breaks it: a
    /// crafted image cannot make a restore index out of range, hand a description to a
    /// process outside the tree or both reopen and inherit one descriptor.
    #[test]
    fn shared_descriptions_roundtrip_and_inconsistent_ones_are_refused() {
        let ck = with_shared();
        ck.validate().unwrap();
        let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
        assert_eq!(back.image.shared_files, ck.image.shared_files);
        assert_eq!(back.image.tree[0].image.fds, ck.image.tree[0].image.fds);

        type Break = fn(&mut Checkpoint);
        let cases: Vec<(&str, Break)> = vec![
            ("names shared description #3 of 3", |c| {
                c.image.fds[0].kind = FdKind::Shared(3)
            }),
            ("names shared description #9 of 3", |c| {
                c.image.tree[0].image.fds[1].kind = FdKind::Shared(9)
            }),
            ("held by process 9, which is not in the tree", |c| {
                c.image.shared_files[0].holders.push((9, 3))
            }),
            ("both private and shared", |c| {
                c.image.fds[1].kind = FdKind::EventFd {
                    count: 0,
                    semaphore: false,
                }
            }),
            ("which has no such descriptor", |c| {
                c.image.shared_files[0].holders.push((5, 8))
            }),
            ("which names shared description #2", |c| {
                c.image.shared_files[0].holders.push((5, 4))
            }),
            ("lists holder (2, 3) twice", |c| {
                c.image.shared_files[0].holders.push((2, 3))
            }),
            ("does not list it as a holder", |c| {
                c.image.shared_files[0].holders.retain(|h| h.0 != 5)
            }),
            ("has no holder", |c| {
                c.image.shared_files.push(SharedFile {
                    file: c.image.shared_files[0].file.clone(),
                    holders: vec![],
                })
            }),
            ("names another shared description", |c| {
                c.image.shared_files[1].file.kind = FdKind::Shared(0)
            }),
            ("is an epoll instance", |c| {
                c.image.shared_files[1].file.kind = FdKind::Epoll { interests: vec![] }
            }),
            ("shared description #1: descriptor path", |c| {
                c.image.shared_files[1].file.kind = FdKind::Path {
                    path: "/log\0".into(),
                    pos: 0,
                    is_dir: false,
                }
            }),
            (
                "shared description #0: unix socket of descriptor 3 has type 9",
                |c| {
                    c.image.shared_files[0].file.kind = FdKind::Unix(UnixSocketImage {
                        ino: 1,
                        ty: 9,
                        local: UnixAddr::Unnamed,
                        path_file: None,
                        state: UnixState::Unconnected,
                        peer_ino: 0,
                        peer: UnixAddr::Unnamed,
                        queue: vec![],
                        shutdown: 0,
                        options: vec![],
                    })
                },
            ),
            ("process 5 lists shared descriptors", |c| {
                let s = c.image.shared_files[0].clone();
                c.image.tree[0].image.shared_files.push(s);
            }),
            ("a single process lists shared descriptors", |c| {
                c.image.tree.clear();
                c.image.shared_files.truncate(2);
                c.image.shared_files[0].holders.truncate(1);
            }),
            ("names shared description #0 of 0", |c| {
                c.image.shared_files.clear();
            }),
            ("is private but belongs with a shared pipe", |c| {
                // The member's write end of the shared pipe, as a private descriptor.
                let mut end = c.image.shared_files[2].file.clone();
                end.fd = 6;
                c.image.tree[0].image.fds.push(end);
            }),
            (
                "is private but belongs with a shared pipe or unix socket",
                |c| {
                    let sock = |ino: u64, peer_ino: u64| UnixSocketImage {
                        ino,
                        ty: 1,
                        local: UnixAddr::Unnamed,
                        path_file: None,
                        state: UnixState::Connected,
                        peer_ino,
                        peer: UnixAddr::Unnamed,
                        queue: vec![],
                        shutdown: 0,
                        options: vec![],
                    };
                    c.image.shared_files[0].file.kind = FdKind::Unix(sock(10, 11));
                    c.image.fds.push(FdImage {
                        fd: 7,
                        cloexec: false,
                        flags: 2,
                        kind: FdKind::Unix(sock(11, 10)),
                    });
                },
            ),
        ];
        for (want, brk) in cases {
            let mut c = with_shared();
            brk(&mut c);
            assert_refused(&c, want);
        }
        // An incremental checkpoint of a single process cannot list them.
        let mut c = sample(Kind::Incremental { base: 6 });
        c.image.runs.clear();
        c.image.shared_files = with_shared().image.shared_files;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("a single process lists shared"), "{err}");
    }

    /// [`with_shared`] as an incremental checkpoint on epoch 6: one page written in each
    /// process (the main process's in the data first, the member's in its slice after it),
    /// the member's descriptors carried over from the base.
    fn incremental_tree() -> Checkpoint {
        let mut ck = with_shared();
        ck.kind = Kind::Incremental { base: 6 };
        let page = |data_off| EncodedPage {
            addr: 0x1000,
            enc: PageEncoding::Raw,
            data_off,
        };
        ck.image.base_epoch = Some(6);
        ck.image.runs.clear();
        ck.image.pages = vec![page(0)];
        let mut m = ck.image.tree[0].clone();
        m.data_off = 4096;
        m.data_len = 4096;
        m.image.base_epoch = Some(6);
        m.image.runs.clear();
        m.image.pages = vec![page(0)];
        m.image.fds.clear();
        m.image.carried.fds = true;
        ck.image.tree[0] = m;
        ck.data = vec![9; 8192];
        ck
    }

    /// An incremental checkpoint of a tree: each member incremental on the same base, its
    /// pages in its own slice after the main process's; descriptors carried over are left to
    /// the receiver; everything else about the tree and its shared descriptions is checked as
    /// in a full one.
    #[test]
    fn incremental_trees_roundtrip_and_inconsistent_ones_are_refused() {
        let ck = incremental_tree();
        ck.validate().unwrap();
        let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
        assert_eq!(back.image.tree[0].image.pages, ck.image.tree[0].image.pages);
        assert_eq!(back.image.shared_files, ck.image.shared_files);
        // A holder whose descriptors are carried over is the receiver's to check.
        let mut c = incremental_tree();
        c.image.shared_files[0].holders.push((5, 8));
        c.validate().unwrap();
        // A process that appeared since the base comes whole (a fresh member).
        let mut c = incremental_tree();
        let m = &mut c.image.tree[0].image;
        (m.base_epoch, m.carried) = (None, Default::default());
        m.fds = with_shared().image.tree[0].image.fds.clone();
        m.pages.clear();
        m.runs = vec![PageRun {
            addr: 0x1000,
            len: 4096,
            data_off: 0,
        }];
        c.validate().unwrap();

        type Break = fn(&mut Checkpoint);
        let cases: Vec<(&str, Break)> = vec![
            // A fresh member (whole: it appeared since the base) carries nothing over.
            (
                "process 5: a full checkpoint leaves out part of its metadata",
                |c| {
                    c.image.tree[0].image.base_epoch = None;
                },
            ),
            (
                "process 5 applies to epoch 5, the main process to epoch 6",
                |c| c.image.tree[0].image.base_epoch = Some(5),
            ),
            ("overlaps another's", |c| c.image.tree[0].data_off = 0),
            ("overlaps another's", |c| c.image.tree[0].data_len = 4097),
            (
                "process 5: page at 0x1000 lies outside the page data",
                |c| c.image.tree[0].image.pages[0].data_off = 1,
            ),
            ("names shared description #3 of 3", |c| {
                c.image.fds[0].kind = FdKind::Shared(3)
            }),
            ("lists holder (2, 3) twice", |c| {
                c.image.shared_files[0].holders.push((2, 3))
            }),
            ("held by process 9, which is not in the tree", |c| {
                c.image.shared_files[0].holders.push((9, 3))
            }),
            ("both private and shared", |c| {
                c.image.fds[1].kind = FdKind::EventFd {
                    count: 0,
                    semaphore: false,
                }
            }),
        ];
        for (want, brk) in cases {
            let mut c = incremental_tree();
            brk(&mut c);
            assert_refused(&c, want);
        }
    }

    #[test]
    fn refuses_trailing_metadata_and_mismatched_kinds() {
        let ck = sample(Kind::Incremental { base: 6 });
        let mut bytes = ck.to_bytes();
        // Header says full, metadata has a base epoch.
        bytes[12] = 0;
        let n = bytes.len() - 4;
        let crc = crc32fast::hash(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
        let err = Checkpoint::from_bytes(bytes).unwrap_err().to_string();
        assert!(err.contains("full checkpoint with a base epoch"), "{err}");
        // One byte of junk after the metadata, lengths and checksum fixed up.
        let meta = postcard::to_stdvec(&ck.image).unwrap();
        let mut v = Vec::new();
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&7u64.to_le_bytes());
        v.extend_from_slice(&(meta.len() as u64 + 1).to_le_bytes());
        v.extend_from_slice(&(ck.data.len() as u64).to_le_bytes());
        v.extend_from_slice(&meta);
        v.push(0);
        v.extend_from_slice(&ck.data);
        let crc = crc32fast::hash(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        let err = Checkpoint::from_bytes(v).unwrap_err().to_string();
        assert!(err.contains("1 bytes after the encoded metadata"), "{err}");
    }
}
