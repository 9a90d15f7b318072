//! The restore plan: the binary contract between the supervisor, which writes it into a memfd,
//! and the freestanding restorer, which reads it. Plain `repr(C)` data, no pointers into the
//! supervisor: offsets are relative to the start of the plan, addresses are target addresses.
//!
//! This file is compiled twice: into the checkpointer crate and into the `no_std` restorer.
//! Bump [`PLAN_VERSION`] on any change.

#![allow(dead_code)]

pub const PLAN_MAGIC: u64 = 0x4e41_4c50_4944_5254; // "TRDIPLAN"
pub const PLAN_VERSION: u32 = 6;

/// Size of each restorer thread's private stack inside the hole.
pub const RESTORER_STACK: u64 = 64 * 1024;

/// `VmaDesc::flags` bits.
pub const VMA_SHARED: u32 = 1;
pub const VMA_ANON: u32 = 2;
pub const VMA_GROWSDOWN: u32 = 4;
pub const VMA_DONTFORK: u32 = 8;
pub const VMA_WIPEONFORK: u32 = 16;
pub const VMA_DONTDUMP: u32 = 32;
pub const VMA_HUGEPAGE: u32 = 64;
pub const VMA_NOHUGEPAGE: u32 = 128;
/// A System V segment attached read-only (`SHM_RDONLY`).
pub const VMA_SHM_RDONLY: u32 = 256;
/// A System V attachment: `fd` is the `shmid`, `file_off` the offset in the segment. The piece
/// at offset 0 (the attachment's start) is attached with `shmat` for `attach_len` bytes, then
/// what the attachment's other pieces do not cover is unmapped; the other pieces are there
/// from then on and only get their protection.
pub const VMA_SYSV: u32 = 512;

/// `struct clone_args` of `clone3(2)`, version 2 (with `set_tid` and `cgroup`): the restorer is
/// freestanding and cannot use the `libc` crate's, so it has its own copy; a test in the
/// checkpointer crate holds it to libc's layout.
#[repr(C)]
pub struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct PlanHeader {
    pub magic: u64,
    pub version: u32,
    /// Total plan size in bytes (header included).
    pub size: u32,
    pub nr_vmas: u32,
    pub nr_runs: u32,
    pub nr_threads: u32,
    pub nr_sigactions: u32,
    pub nr_cloexec: u32,
    pub nr_close: u32,
    pub vmas_off: u32,
    pub runs_off: u32,
    pub threads_off: u32,
    pub sigactions_off: u32,
    pub cloexec_off: u32,
    pub close_off: u32,
    pub auxv_off: u32,
    pub auxv_len: u32,
    /// Target address of the vDSO set (`[vvar]` start), 0 if the target had none.
    pub vdso_base: u64,
    /// Where the restorer may place itself: a gap no target mapping touches.
    pub hole_start: u64,
    pub hole_end: u64,
    /// Descriptor of the page data (pread source).
    pub pages_fd: i32,
    /// Descriptor the restorer writes one byte to when every thread is ready to resume.
    pub notify_fd: i32,
    /// Descriptor of the target's executable, for `PR_SET_MM_EXE_FILE` (-1: leave).
    pub exe_fd: i32,
    pub umask: u32,
    /// Non-zero: after reporting, stop the whole process (SIGSTOP) before any thread resumes, so
    /// the supervisor can compare the restored memory with its source.
    pub hold: u32,
    pub _pad: u32,
    pub mm: MmMap,
    pub creds: CredsDesc,
    /// POSIX timers: `nr_timers` [`TimerDesc`]s at `timers_off`, created with their ids once
    /// the threads exist, armed just before they resume.
    pub nr_timers: u32,
    pub timers_off: u32,
    /// `ITIMER_REAL`, `ITIMER_VIRTUAL`, `ITIMER_PROF` (time left 0: not armed).
    pub itimers: [ItimerDesc; 3],
    /// Seccomp filters: [`SeccompDesc`]s at `seccomp_off`. The first `seccomp_shared` are every
    /// thread's, installed by the main thread with `SECCOMP_FILTER_FLAG_TSYNC`; each thread's
    /// own follow (`ThreadDesc::seccomp_first`, `seccomp_count`).
    pub nr_seccomp: u32,
    pub seccomp_off: u32,
    pub seccomp_shared: u32,
    /// Non-zero: each thread installs its whole chain itself before it takes the target's
    /// credentials, not after (the target has neither `no_new_privs` nor `CAP_SYS_ADMIN`,
    /// without which the kernel refuses a filter).
    pub seccomp_early: u32,
    /// System V segments to mark for removal (`IPC_RMID`) once every mapping is back:
    /// `nr_rmid` i32 shmids at `rmid_off`.
    pub nr_rmid: u32,
    pub rmid_off: u32,
    /// Signals to queue again, pending (every thread blocks every signal until its
    /// sigreturn): `nr_pending` [`PendingDesc`]s at `pending_off`, oldest first.
    pub nr_pending: u32,
    pub pending_off: u32,
}

/// One pending signal: queued to thread `tid` (a TID inside the sandbox), or to the process
/// when `tid` is 0, with its `siginfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PendingDesc {
    pub tid: i32,
    pub signo: i32,
    pub info: [u8; 128],
}

/// One POSIX timer (see `tardi_image::image::PosixTimer`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct TimerDesc {
    pub id: i32,
    pub clock: i32,
    pub signo: i32,
    pub notify: i32,
    /// The thread signalled, for `SIGEV_THREAD_ID`.
    pub tid: i32,
    pub _pad: u32,
    pub sigval: u64,
    pub value_ns: u64,
    pub interval_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ItimerDesc {
    pub value_ns: u64,
    pub interval_ns: u64,
}

/// One seccomp filter: `len` 8-byte `struct sock_filter`s at `insns_off` in the plan.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct SeccompDesc {
    pub insns_off: u32,
    pub len: u32,
    /// `SECCOMP_FILTER_FLAG_LOG` or 0.
    pub flags: u32,
    pub _pad: u32,
}

/// The credentials every thread takes as its last step (`restorer/main.rs`, `drop_creds`).
/// `groups_off` locates `nr_groups` u32 supplementary groups in the plan.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CredsDesc {
    /// Real, effective, saved, file-system.
    pub uid: [u32; 4],
    pub gid: [u32; 4],
    pub groups_off: u32,
    pub nr_groups: u32,
    pub cap_inheritable: u64,
    pub cap_permitted: u64,
    pub cap_effective: u64,
    pub cap_bounding: u64,
    pub cap_ambient: u64,
    pub securebits: u32,
    pub no_new_privs: u32,
    pub dumpable: u32,
    pub _pad: u32,
}

/// The kernel's `struct prctl_mm_map` (without the auxv pointer/size and exe_fd, filled in by
/// the restorer).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct MmMap {
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

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct VmaDesc {
    pub start: u64,
    pub end: u64,
    /// Page offset into the backing file, in bytes.
    pub file_off: u64,
    pub prot: u32,
    pub flags: u32,
    /// Descriptor of the backing file, -1 for anonymous memory.
    pub fd: i32,
    /// Runs of saved pages that lie in this mapping: `runs[first_run .. first_run + nr_runs]`.
    pub first_run: u32,
    pub nr_runs: u32,
    pub _pad: u32,
    /// `VMA_SYSV` at offset 0: the segment's size rounded up to pages.
    pub attach_len: u64,
}

/// A run of contiguous saved pages: `len` bytes at target address `addr`, found at `data_off` in
/// the page data.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct PageRun {
    pub addr: u64,
    pub len: u64,
    pub data_off: u64,
}

/// The general registers as `PTRACE_GETREGS` returns them (`struct user_regs_struct`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Regs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rax: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub orig_rax: u64,
    pub rip: u64,
    pub cs: u64,
    pub eflags: u64,
    pub rsp: u64,
    pub ss: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    pub ds: u64,
    pub es: u64,
    pub fs: u64,
    pub gs: u64,
}

/// Largest XSAVE area the plan carries (AVX-512 needs 2,696 bytes; AMX would need more and is
/// refused at capture).
pub const XSTATE_MAX: usize = 4096;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ThreadDesc {
    pub tid: i32,
    pub _pad: u32,
    /// Registers with system-call restart already applied.
    pub regs: Regs,
    pub sigmask: u64,
    pub robust_list: u64,
    pub robust_len: u64,
    pub clear_child_tid: u64,
    pub rseq_addr: u64,
    pub rseq_len: u32,
    pub rseq_sig: u32,
    pub altstack_sp: u64,
    pub altstack_size: u64,
    pub altstack_flags: u32,
    pub xstate_len: u32,
    /// This thread's own seccomp filters (after the shared ones), in the plan's list.
    pub seccomp_first: u32,
    pub seccomp_count: u32,
    pub comm: [u8; 16],
    /// XSAVE area as `PTRACE_GETREGSET(NT_X86_XSTATE)` returned it.
    pub xstate: [u8; XSTATE_MAX],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct SigactionDesc {
    pub signo: u32,
    pub _pad: u32,
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}
