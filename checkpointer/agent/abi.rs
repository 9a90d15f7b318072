//! The layout shared by the write-tracking agent (`agent/main.rs`, inside the tracked process)
//! and its tracer side (`src/agent.rs`, in the supervisor). Plain `#[repr(C)]` data, no
//! pointers to agent code: the supervisor reads and writes it with `process_vm_readv/writev`.
//!
//! Who writes what:
//! - the supervisor, while every thread is stopped: `table`, `runs`, `filter`, `log_cursor`,
//!   the counters it resets;
//! - the agent, at any time: `extra`, `log`, `log_head`, `faults`, `trapped`, `app_*`, `lock`;
//! - both: `nnp_forced` and `app_nnp` (the supervisor when it loads the filter, the agent when
//!   the app sets `no_new_privs` itself).

#![allow(dead_code)]

pub const AGENT_MAGIC: u64 = u64::from_le_bytes(*b"TARDIAGT");
pub const AGENT_VERSION: u32 = 3;

/// Armed ranges the supervisor writes each pause (sorted, disjoint).
pub const TABLE_CAP: usize = 4096;
/// Armed ranges the agent adds when an app call cuts an armed range in pieces.
pub const EXTRA_CAP: usize = 512;
/// Ranges changed by the app's memory-layout calls since the last pause.
pub const LOG_CAP: usize = 4096;
/// Ranges the supervisor asks the agent to write-protect (one `OP_REARM`).
pub const RUNS_CAP: usize = 16384;
/// BPF instructions of the seccomp filter.
pub const FILTER_CAP: usize = 512;
/// System calls in flight whose output buffers the agent opened (one slot each).
pub const INFLIGHT_CAP: usize = 64;
/// Threads that can each have one unexplained write fault retried at a time.
pub const RETRY_SLOTS: usize = 64;
/// Ranges one slot can name; more, and the slot says "everything" (`n` > this).
pub const INFLIGHT_RANGES: usize = 8;

/// `Range::prot` of an entry that no longer tracks anything.
pub const DISARMED: u64 = u64::MAX;

/// `LogEntry::kind`: the app changed the layout of (or zapped) the range: capture it whole.
pub const LOG_CHANGED: u64 = 1;
/// `LogEntry::kind`: the range is a stack (thread stack, signal stack, rseq area): never
/// write-protect it, read its present pages every pause.
pub const LOG_STACK: u64 = 2;

/// `si_errno` of the SIGSYS our filter raises (`SECCOMP_RET_TRAP | TRAP_TAG`).
pub const TRAP_TAG: u32 = 0x7a;

/// Operations the supervisor runs in a stopped thread (`rdi` of the entry point).
pub const OP_INIT: u64 = 1;
pub const OP_REARM: u64 = 2;
pub const OP_DISARM_ALL: u64 = 3;

/// Return values of operations (besides `0` and `-errno`).
pub const RET_BUSY: i64 = -16; // -EBUSY: a thread was stopped inside a table update

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub end: u64,
    /// The protection the app asked for (`PROT_*`), or [`DISARMED`].
    pub prot: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Written last by the agent: zero means "reserved, not yet filled".
    pub start: u64,
    pub end: u64,
    pub kind: u64,
}

/// The kernel's `struct sigaction` for `rt_sigaction` on x86-64.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct KSigaction {
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

/// The output buffers of one system call in flight: the supervisor must not write-protect
/// them again until the call is done, or the kernel's write fails with `EFAULT`. `owner` is
/// zero when the slot is free, else the TID (`gettid`, in the process's PID namespace) of the
/// thread whose call it is: a child forked while other threads had calls in flight inherits
/// their slots, which the supervisor frees when it adopts the child (no thread of it has
/// that TID).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Inflight {
    pub owner: u64,
    pub n: u64,
    pub ranges: [[u64; 2]; INFLIGHT_RANGES],
}

/// The control block's fixed part (the supervisor reads it whole, in one read).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Header {
    pub magic: u64,
    pub version: u32,
    /// Non-zero while tracking is on: the SIGSEGV handler resolves faults on armed ranges.
    pub active: u32,
    /// Held by a thread updating `extra`/`table` entries or the log on behalf of a
    /// memory-layout call: its TID (`gettid`, in the process's PID namespace), zero when free;
    /// a pause that finds it held leaves protections and the log alone. A lock held by a TID
    /// that is not a thread of the process was copied by `fork` from the parent: the agent's
    /// threads take it over, the supervisor frees it when it adopts the child.
    pub lock: u32,
    pub log_overflow: u32,
    /// Write faults resolved since the last `OP_REARM`.
    pub faults: u64,
    /// Pages made writable for system calls to write into since the last `OP_REARM` (with
    /// `faults`, the capping signal; a page already writable is counted too).
    pub opened: u64,
    /// System calls the SIGSYS handler served (statistics).
    pub trapped: u64,
    /// The app's own dispositions of SIGSEGV and SIGSYS (the kernel holds the agent's).
    pub app_segv: KSigaction,
    pub app_sys: KSigaction,
    /// The agent's text, for the filter's "calls from here are allowed" test.
    pub text_start: u64,
    pub text_end: u64,
    pub n_table: u64,
    pub n_extra: u64,
    /// Log entries are reserved by `log_head` (monotonic) and consumed up to `log_cursor`.
    pub log_head: u64,
    pub log_cursor: u64,
    pub n_runs: u64,
    pub filter_len: u64,
    /// Non-zero: the supervisor set `no_new_privs` in this process so that the filter could be
    /// installed (the process had neither it nor `CAP_SYS_ADMIN`). The kernel then shows 1;
    /// the app's own state is `app_nnp`, which `PR_GET_NO_NEW_PRIVS` answers and a checkpoint
    /// records (see `track::mprotect`, `MprotectTracker::new`).
    pub nnp_forced: u32,
    /// The app's own `no_new_privs` (0 or 1), meaningful with `nnp_forced`: set to 1 by the
    /// agent when the app's `PR_SET_NO_NEW_PRIVS` succeeds.
    pub app_nnp: u32,
}

#[repr(C)]
pub struct Control {
    pub h: Header,
    pub table: [Range; TABLE_CAP],
    pub extra: [Range; EXTRA_CAP],
    pub log: [LogEntry; LOG_CAP],
    pub runs: [Range; RUNS_CAP],
    pub filter: [u64; FILTER_CAP],
    pub inflight: [Inflight; INFLIGHT_CAP],
    /// (tid, address) of a write fault the agent let run again once without resolving it,
    /// per `tid % RETRY_SLOTS` (see `segv_handler`).
    pub retry: [[u64; 2]; RETRY_SLOTS],
}

/// The system calls the filter traps (unless made from the agent's own text): those the agent
/// emulates (signal dispositions and masks, memory layout, `execve`) and those into which the
/// kernel writes user memory. Keep in step with `emulate` and `buffers` in `agent/main.rs`.
pub const TRAPPED: &[u16] = &[
    0, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 16, 17, 19, 22, 23, 25, 27, 28, 35, 36, 38, 40, 43, 45,
    47, 51, 52, 53, 55, 59, 61, 63, 70, 72, 78, 79, 89, 96, 97, 98, 99, 100, 115, 118, 120, 125,
    127, 128, 130, 131, 137, 138, 143, 157, 191, 192, 193, 194, 195, 196, 201, 202, 204, 206, 208,
    217, 222, 223, 224, 228, 229, 230, 232, 239, 243, 247, 262, 267, 270, 271, 274, 275, 281, 286,
    287, 288, 293, 295, 299, 302, 307, 309, 310, 315, 318, 322, 326, 327, 329, 332, 334, 425, 441,
];
