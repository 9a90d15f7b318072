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

mod format;
mod validate;

pub use format::CheckpointFile;

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
pub const FORMAT_VERSION: u32 = 11;
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
    /// The process's connected TCP sockets that carry on through a restore (the others are
    /// restored as reset by their peer), each by the descriptor that holds it. An incremental
    /// checkpoint lists the connections that changed since its base; the rest are carried
    /// over ([`Carried::tcp`]).
    pub tcp: Vec<TcpConn>,
}

impl ProcessImage {
    /// This process and the other processes of its tree (a member's own `tree` is empty).
    pub fn processes(&self) -> impl Iterator<Item = &ProcessImage> + Clone {
        std::iter::once(self).chain(self.tree.iter().map(|m| &m.image))
    }

    /// Drops the connections of every process of the tree: a restore resets them instead.
    pub fn drop_connections(&mut self) {
        self.tcp.clear();
        self.tree.iter_mut().for_each(|m| m.image.tcp.clear());
    }
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
    /// Descriptors whose [`TcpConn`] is the base's (they are not in `tcp`).
    pub tcp: Vec<i32>,
}

impl Carried {
    /// Nothing is left out.
    pub fn is_empty(&self) -> bool {
        !self.layout
            && !self.fds
            && !self.sigactions
            && self.threads.is_empty()
            && self.tcp.is_empty()
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

/// `tcpi_state` of an established connection.
pub const TCP_ESTABLISHED: u8 = 1;
/// The states a [`TcpConn`] carries: established, and the half-closed ones a process can hold
/// (`FIN_WAIT1`, `FIN_WAIT2`, `CLOSE_WAIT`, `LAST_ACK`, `CLOSING`).
pub const TCP_CARRIED_STATES: [u8; 6] = [TCP_ESTABLISHED, 4, 5, 8, 9, 11];
/// The most bytes a [`TcpConn`] queue may hold (a socket buffer's ceiling is a few MiB).
pub const TCP_MAX_QUEUE: usize = 64 << 20;

/// A connected TCP socket's state as the kernel's repair mode reads and writes it: enough for
/// a socket made on another machine to carry on the same connection, with neither end seeing
/// a reset. Sequence numbers are those of the first byte of each queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpConn {
    /// The descriptor that holds the socket (a [`SocketState::ConnectedTcp`] socket).
    pub fd: i32,
    /// `tcpi_state`: one of [`TCP_CARRIED_STATES`] (1 = established).
    pub state: u8,
    /// Sequence number of the first byte of `send_queue` (the oldest unacknowledged one; past
    /// our FIN once it was acknowledged).
    pub send_seq: u32,
    /// Bytes written and not yet acknowledged by the peer: sent ones first, then `unsent`
    /// bytes never sent.
    #[serde(with = "crate::bytes")]
    pub send_queue: Vec<u8>,
    /// How many bytes at the end of `send_queue` were never sent.
    pub unsent: u32,
    /// Sequence number of the first byte of `recv_queue` (the oldest unread one). The peer's
    /// FIN, in a state that received it, follows the queue's last byte.
    pub recv_seq: u32,
    /// Bytes received and acknowledged, not yet read by the process.
    #[serde(with = "crate::bytes")]
    pub recv_queue: Vec<u8>,
    /// Maximum segment size to send.
    pub mss: u32,
    /// Window scale shifts, ours for sending and the peer's (`None`: not negotiated).
    pub wscale: Option<(u8, u8)>,
    /// SACK permitted on this connection.
    pub sack: bool,
    /// TCP timestamps in use, and the value our clock showed at the capture.
    pub timestamp: Option<u32>,
    /// `TCP_REPAIR_WINDOW`: snd_wl1, snd_wnd, max_window, rcv_wnd, rcv_wup.
    pub window: [u32; 5],
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

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_tcp;
