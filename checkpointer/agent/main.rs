//! The write-tracking agent: a freestanding blob (no libc, no allocation, no relocations) that
//! the supervisor loads into a tracked process for the mprotect + SIGSEGV tracker (kernels
//! without userfaultfd write-protection). See `src/agent.rs` for the supervisor's side and the
//! design; the shared layout is `abi.rs`.
//!
//! What runs in the process:
//! - **SIGSEGV handler**: a write to a page the supervisor write-protected ("armed") makes the
//!   page writable again with the app's own protection and returns; the write then happens.
//!   Nothing is logged: the supervisor reads which pages are writable from `/proc/PID/maps` in
//!   the next pause, so a fault handled halfway when the process is stopped is never lost. Any
//!   other SIGSEGV goes to the app's own disposition, as the kernel would have delivered it.
//! - **SIGSYS handler**, for the system calls our seccomp filter traps (those not made from
//!   this agent's text):
//!   - `rt_sigaction` of SIGSEGV/SIGSYS is answered from and stored into `app_segv`/`app_sys`
//!     (the kernel keeps ours); every signal mask the app installs has SIGSEGV, SIGSYS and the
//!     other synchronous fault signals removed (a blocked fault signal kills the process);
//!   - memory-layout calls (`mmap`, `munmap`, `mremap`, `mprotect`, `madvise`, `brk`) are
//!     logged for the supervisor (the range is captured whole in the next pause) and armed
//!     ranges they overlap are disarmed first, all under `Control::lock`;
//!   - calls into which the kernel writes user memory (`read`, `recvmsg`, `epoll_wait`,
//!     `fstat`, ...) first make armed pages of their output buffers writable: a kernel write
//!     to a write-protected page fails with `EFAULT` instead of faulting to us;
//!   - `execve` fails with `EPERM` (the new program would inherit the filter without us);
//!   - `prctl(PR_GET_NO_NEW_PRIVS)` is answered from `app_nnp` when the supervisor set
//!     `no_new_privs` for the filter (`nnp_forced`), and the app's `PR_SET_NO_NEW_PRIVS`
//!     recorded there.
//! - **Operations** the supervisor runs in a stopped thread (`_start`): `OP_INIT` (install the
//!   handlers and the filter), `OP_REARM` (write-protect the `runs` list), `OP_DISARM_ALL`.
//!
//! Invariants: position independent, self-contained, no statics holding pointers; built by
//! `checkpointer/build.rs`, which refuses a binary with relocations. Every handler path is
//! async-signal-safe: no locks except `Control::lock`, taken only with signals blocked.
//!
//! One file over a thousand lines on purpose: the agent is a freestanding blob built as one
//! translation unit with no relocations (`build.rs` checks), so it has no module tree to split
//! into.

#![no_std]
#![no_main]
#![allow(clippy::missing_safety_doc)]
#![allow(static_mut_refs)]

mod abi;
#[path = "../freestanding/syscall.rs"]
mod syscall;
use syscall::{sc, sc6};

use abi::*;
use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const PAGE: u64 = 4096;
const PROT_WRITE: u64 = 2;

const SIGILL: u64 = 4;
const SIGTRAP: u64 = 5;
const SIGBUS: u64 = 7;
const SIGFPE: u64 = 8;
const SIGSEGV: u64 = 11;
const SIGSYS: u64 = 31;
/// Signals that must never be blocked: a synchronous fault with its signal blocked kills.
const FAULT_SIGS: u64 = bit(SIGILL) | bit(SIGTRAP) | bit(SIGBUS) | bit(SIGFPE) | bit(SIGSEGV)
    | bit(SIGSYS);

const SA_SIGINFO: u64 = 4;
const SA_ONSTACK: u64 = 0x0800_0000;
const SA_RESTART: u64 = 0x1000_0000;
const SA_NODEFER: u64 = 0x4000_0000;
const SA_RESETHAND: u64 = 0x8000_0000;
const SA_RESTORER: u64 = 0x0400_0000;

const PR_SET_NO_NEW_PRIVS: u64 = 38;
const PR_GET_NO_NEW_PRIVS: u64 = 39;

const SEGV_ACCERR: i32 = 2;
const SYS_SECCOMP: i32 = 1;

const EPERM: i64 = 1;
const ENOMEM: i64 = 12;
const EFAULT: i64 = 14;

const MAP_FIXED: u64 = 0x10;
const MAP_STACK: u64 = 0x20000;
const MAP_FIXED_NOREPLACE: u64 = 0x100000;
const MREMAP_FIXED: u64 = 2;

// Offsets in the kernel's ucontext (x86-64): uc_mcontext.gregs starts at 40.
const GREGS: usize = 40;
const REG_R8: usize = 0;
const REG_R9: usize = 1;
const REG_R10: usize = 2;
const REG_RDI: usize = 8;
const REG_RSI: usize = 9;
const REG_RDX: usize = 12;
const REG_RAX: usize = 13;
const REG_ERR: usize = 19;
const UC_SIGMASK: usize = 296;

const fn bit(sig: u64) -> u64 {
    1 << (sig - 1)
}

mod nr {
    pub const READ: u64 = 0;
    pub const STAT: u64 = 4;
    pub const FSTAT: u64 = 5;
    pub const LSTAT: u64 = 6;
    pub const POLL: u64 = 7;
    pub const MMAP: u64 = 9;
    pub const MPROTECT: u64 = 10;
    pub const MUNMAP: u64 = 11;
    pub const BRK: u64 = 12;
    pub const RT_SIGACTION: u64 = 13;
    pub const RT_SIGPROCMASK: u64 = 14;
    pub const IOCTL: u64 = 16;
    pub const PREAD64: u64 = 17;
    pub const READV: u64 = 19;
    pub const PIPE: u64 = 22;
    pub const SELECT: u64 = 23;
    pub const MREMAP: u64 = 25;
    pub const MINCORE: u64 = 27;
    pub const MADVISE: u64 = 28;
    pub const NANOSLEEP: u64 = 35;
    pub const GETITIMER: u64 = 36;
    pub const SETITIMER: u64 = 38;
    pub const GETPID: u64 = 39;
    pub const SENDFILE: u64 = 40;
    pub const ACCEPT: u64 = 43;
    pub const RECVFROM: u64 = 45;
    pub const RECVMSG: u64 = 47;
    pub const GETSOCKNAME: u64 = 51;
    pub const GETPEERNAME: u64 = 52;
    pub const SOCKETPAIR: u64 = 53;
    pub const GETSOCKOPT: u64 = 55;
    pub const EXECVE: u64 = 59;
    pub const WAIT4: u64 = 61;
    pub const UNAME: u64 = 63;
    pub const MSGRCV: u64 = 70;
    pub const FCNTL: u64 = 72;
    pub const GETDENTS: u64 = 78;
    pub const GETCWD: u64 = 79;
    pub const READLINK: u64 = 89;
    pub const GETTIMEOFDAY: u64 = 96;
    pub const GETRLIMIT: u64 = 97;
    pub const GETRUSAGE: u64 = 98;
    pub const SYSINFO: u64 = 99;
    pub const TIMES: u64 = 100;
    pub const GETGROUPS: u64 = 115;
    pub const GETRESUID: u64 = 118;
    pub const GETRESGID: u64 = 120;
    pub const CAPGET: u64 = 125;
    pub const RT_SIGPENDING: u64 = 127;
    pub const RT_SIGTIMEDWAIT: u64 = 128;
    pub const RT_SIGSUSPEND: u64 = 130;
    pub const SIGALTSTACK: u64 = 131;
    pub const STATFS: u64 = 137;
    pub const FSTATFS: u64 = 138;
    pub const SCHED_GETPARAM: u64 = 143;
    pub const PRCTL: u64 = 157;
    pub const GETXATTR: u64 = 191;
    pub const LGETXATTR: u64 = 192;
    pub const FGETXATTR: u64 = 193;
    pub const LISTXATTR: u64 = 194;
    pub const LLISTXATTR: u64 = 195;
    pub const FLISTXATTR: u64 = 196;
    pub const TIME: u64 = 201;
    pub const FUTEX: u64 = 202;
    pub const SCHED_GETAFFINITY: u64 = 204;
    pub const IO_SETUP: u64 = 206;
    pub const IO_GETEVENTS: u64 = 208;
    pub const GETDENTS64: u64 = 217;
    pub const TIMER_CREATE: u64 = 222;
    pub const TIMER_SETTIME: u64 = 223;
    pub const TIMER_GETTIME: u64 = 224;
    pub const CLOCK_GETTIME: u64 = 228;
    pub const CLOCK_GETRES: u64 = 229;
    pub const CLOCK_NANOSLEEP: u64 = 230;
    pub const EPOLL_WAIT: u64 = 232;
    pub const GET_MEMPOLICY: u64 = 239;
    pub const MQ_TIMEDRECEIVE: u64 = 243;
    pub const WAITID: u64 = 247;
    pub const NEWFSTATAT: u64 = 262;
    pub const READLINKAT: u64 = 267;
    pub const PSELECT6: u64 = 270;
    pub const PPOLL: u64 = 271;
    pub const GET_ROBUST_LIST: u64 = 274;
    pub const SPLICE: u64 = 275;
    pub const EPOLL_PWAIT: u64 = 281;
    pub const TIMERFD_SETTIME: u64 = 286;
    pub const TIMERFD_GETTIME: u64 = 287;
    pub const ACCEPT4: u64 = 288;
    pub const PIPE2: u64 = 293;
    pub const PREADV: u64 = 295;
    pub const RECVMMSG: u64 = 299;
    pub const PRLIMIT64: u64 = 302;
    pub const SENDMMSG: u64 = 307;
    pub const GETCPU: u64 = 309;
    pub const PROCESS_VM_READV: u64 = 310;
    pub const SCHED_GETATTR: u64 = 315;
    pub const SECCOMP: u64 = 317;
    pub const GETRANDOM: u64 = 318;
    pub const EXECVEAT: u64 = 322;
    pub const COPY_FILE_RANGE: u64 = 326;
    pub const PREADV2: u64 = 327;
    pub const PKEY_MPROTECT: u64 = 329;
    pub const STATX: u64 = 332;
    pub const RSEQ: u64 = 334;
    pub const IO_URING_SETUP: u64 = 425;
    pub const EPOLL_PWAIT2: u64 = 441;
    pub const GETTID: u64 = 186;
    pub const SCHED_YIELD: u64 = 24;
    pub const TGKILL: u64 = 234;
}


#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Nothing here can panic by construction (no indexing without a bound check that the
    // compiler can see, no arithmetic overflow checks in this build); if it ever does, trap so
    // the supervisor's ptrace stop or the core dump shows where.
    // SAFETY: ud2 only raises SIGILL.
    unsafe { asm!("ud2", options(noreturn)) }
}

// Referenced by precompiled `core` objects (never called: we build with panic=abort).
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}

// The compiler may emit calls to these; there is no libc to provide them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(d: *mut u8, s: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees `n` bytes are valid at both addresses.
    unsafe {
        asm!("rep movsb", inout("rdi") d => _, inout("rsi") s => _, inout("rcx") n => _,
             options(nostack, preserves_flags));
    }
    d
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(d: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees `n` bytes at `d` are writable.
    unsafe {
        asm!("rep stosb", inout("rdi") d => _, inout("rcx") n => _, in("al") c as u8,
             options(nostack, preserves_flags));
    }
    d
}

/// The shared state. Its address is found by `build.rs` from the symbol table (the name must
/// contain `TARDI_AGENT_CONTROL`) and returned by `OP_INIT` as a check.
#[used]
static mut TARDI_AGENT_CONTROL: Control = Control {
    h: Header {
        magic: 0,
        version: 0,
        active: 0,
        lock: 0,
        log_overflow: 0,
        faults: 0,
        opened: 0,
        trapped: 0,
        app_segv: KSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 },
        app_sys: KSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 },
        text_start: 0,
        text_end: 0,
        n_table: 0,
        n_extra: 0,
        log_head: 0,
        log_cursor: 0,
        n_runs: 0,
        filter_len: 0,
        nnp_forced: 0,
        app_nnp: 0,
    },
    table: [Range { start: 0, end: 0, prot: 0 }; TABLE_CAP],
    extra: [Range { start: 0, end: 0, prot: 0 }; EXTRA_CAP],
    log: [LogEntry { start: 0, end: 0, kind: 0 }; LOG_CAP],
    runs: [Range { start: 0, end: 0, prot: 0 }; RUNS_CAP],
    filter: [0; FILTER_CAP],
    inflight: [Inflight { owner: 0, n: 0, ranges: [[0; 2]; INFLIGHT_RANGES] }; INFLIGHT_CAP],
    retry: [[0; 2]; RETRY_SLOTS],
};

#[inline(always)]
fn ctl() -> *mut Control {
    &raw mut TARDI_AGENT_CONTROL
}

// The supervisor points a stopped thread's RIP here with `rdi` = operation, a 16-byte aligned
// `rsp`, and waits for the `int3`.
global_asm!(
    ".globl _start",
    "_start:",
    "call {op}",
    "int3",
    "ud2",
    op = sym agent_op,
);

// A `syscall` instruction the supervisor injects its own system calls at (`Stopped::inject`):
// calls from the agent's text pass the filter.
global_asm!(
    ".globl tardi_agent_syscall",
    "tardi_agent_syscall:",
    "syscall",
    "int3",
);

// Signal return trampoline for our handlers (SA_RESTORER).
global_asm!(
    ".globl tardi_agent_sigreturn",
    "tardi_agent_sigreturn:",
    "mov eax, 15",
    "syscall",
    "ud2",
);

/// Address of `tardi_agent_sigreturn`, RIP-relative (a Rust reference to an assembly symbol
/// would go through the GOT).
fn sigreturn_addr() -> u64 {
    let a: u64;
    // SAFETY: `lea` only computes an address.
    unsafe {
        asm!("lea {a}, [rip + tardi_agent_sigreturn]", a = out(reg) a,
             options(nostack, nomem, preserves_flags));
    }
    a
}

extern "C" fn agent_op(op: u64, arg: u64) -> i64 {
    // SAFETY: every thread but this one is stopped by the supervisor; the control block is ours.
    unsafe {
        let c = ctl();
        match op {
            OP_INIT => init(c, arg != 0),
            OP_REARM => {
                if AtomicU32::from_ptr(&raw mut (*c).h.lock).load(Ordering::Acquire) != 0 {
                    return RET_BUSY;
                }
                let n = ((*c).h.n_runs as usize).min(RUNS_CAP);
                for i in 0..n {
                    let r = *((&raw const (*c).runs) as *const Range).add(i);
                    let rc = sc(nr::MPROTECT, r.start, r.end - r.start, r.prot);
                    if rc < 0 {
                        (*c).h.n_runs = i as u64; // where it stopped, for the error message
                        return rc;
                    }
                }
                AtomicU64::from_ptr(&raw mut (*c).h.faults).store(0, Ordering::Relaxed);
                AtomicU64::from_ptr(&raw mut (*c).h.opened).store(0, Ordering::Relaxed);
                (*c).h.active = 1;
                0
            }
            OP_DISARM_ALL => {
                (*c).h.active = 0;
                let mut first_err = 0;
                for_each_entry(c, |e| {
                    if e.prot != DISARMED {
                        let rc = sc(nr::MPROTECT, e.start, e.end - e.start, e.prot);
                        if rc < 0 && first_err == 0 {
                            first_err = rc;
                        }
                    }
                });
                (*c).h.n_table = 0;
                (*c).h.n_extra = 0;
                first_err
            }
            _ => -22,
        }
    }
}

/// Takes over SIGSEGV and SIGSYS (remembering the app's dispositions) and, when asked,
/// installs the seccomp filter the supervisor wrote into `filter` on every thread.
unsafe fn init(c: *mut Control, install_filter: bool) -> i64 {
    // SAFETY: the caller holds the process stopped; the pointers are to our own statics/stack.
    unsafe {
        (*c).h.magic = AGENT_MAGIC;
        (*c).h.version = AGENT_VERSION;
        let segv = segv_handler as *const () as usize as u64;
        let sys = sys_handler as *const () as usize as u64;
        for (sig, mine, slot) in [
            (SIGSEGV, segv, &raw mut (*c).h.app_segv),
            (SIGSYS, sys, &raw mut (*c).h.app_sys),
        ] {
            let mut old = KSigaction::default();
            let rc = sc6(nr::RT_SIGACTION, sig, 0, &raw mut old as u64, 8, 0, 0);
            if rc < 0 {
                return rc;
            }
            if old.handler != mine {
                *slot = old;
            }
            let rc = register(sig, mine, (*slot).flags);
            if rc < 0 {
                return rc;
            }
        }
        // Handlers the app installed before us may block fault signals while they run: a
        // write to an armed page there would kill the process.
        for sig in 1..=64u64 {
            if matches!(sig, 9 | 19) || sig == SIGSEGV || sig == SIGSYS {
                continue;
            }
            let mut a = KSigaction::default();
            if sc6(nr::RT_SIGACTION, sig, 0, &raw mut a as u64, 8, 0, 0) == 0
                && a.handler > 1
                && a.mask & FAULT_SIGS != 0
            {
                a.mask &= !FAULT_SIGS;
                sc6(nr::RT_SIGACTION, sig, &raw const a as u64, 0, 8, 0, 0);
            }
        }
        if install_filter {
            #[repr(C)]
            struct Fprog {
                len: u16,
                filter: u64,
            }
            let prog = Fprog {
                len: (*c).h.filter_len as u16,
                filter: (&raw const (*c).filter) as u64,
            };
            // SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: every thread at once.
            let rc = sc(nr::SECCOMP, 1, 1, &raw const prog as u64);
            if rc != 0 {
                return if rc > 0 { -1000 - rc } else { rc };
            }
        }
        c as u64 as i64
    }
}

/// Installs our handler for `sig`, on the alternate stack if the app's own asks for it.
unsafe fn register(sig: u64, handler: u64, app_flags: u64) -> i64 {
    let mask = if sig == SIGSEGV {
        // Nothing asynchronous runs inside the fault path; the app's handler gets its own mask.
        !FAULT_SIGS
    } else {
        0
    };
    let act = KSigaction {
        handler,
        flags: SA_SIGINFO | SA_RESTORER | SA_NODEFER | SA_RESTART | (app_flags & SA_ONSTACK),
        restorer: sigreturn_addr(),
        mask,
    };
    // SAFETY: a valid sigaction on our stack.
    unsafe { sc6(nr::RT_SIGACTION, sig, &raw const act as u64, 0, 8, 0, 0) }
}

unsafe fn for_each_entry(c: *mut Control, mut f: impl FnMut(&mut Range)) {
    // SAFETY: indices bounded by the counts, clamped to the capacities.
    unsafe {
        let table = (&raw mut (*c).table) as *mut Range;
        for i in 0..((*c).h.n_table as usize).min(TABLE_CAP) {
            f(&mut *table.add(i));
        }
        let extra = (&raw mut (*c).extra) as *mut Range;
        for i in 0..((*c).h.n_extra as usize).min(EXTRA_CAP) {
            f(&mut *extra.add(i));
        }
    }
}

fn load_prot(r: &Range) -> u64 {
    // SAFETY: an aligned u64 inside the control block.
    unsafe { AtomicU64::from_ptr(&r.prot as *const u64 as *mut u64).load(Ordering::Acquire) }
}

/// Calls `f(entry, prot)` for every armed (not disarmed) entry overlapping `[s, e)`.
///
/// Indexing goes through raw pointers: a bounds check would pull in core's panic machinery,
/// whose location records need relocations.
unsafe fn overlapping(c: *mut Control, s: u64, e: u64, mut f: impl FnMut(&mut Range, u64)) {
    // SAFETY: indices are below `n_table`/`n_extra`, clamped to the capacities.
    unsafe {
        let table = (&raw mut (*c).table) as *mut Range;
        let nt = ((*c).h.n_table as usize).min(TABLE_CAP);
        // First entry ending after `s` (the table is sorted and disjoint).
        let (mut lo, mut hi) = (0usize, nt);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if (*table.add(mid)).end <= s {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let mut i = lo;
        while i < nt && (*table.add(i)).start < e {
            let r = &mut *table.add(i);
            let p = load_prot(r);
            if p != DISARMED {
                f(r, p);
            }
            i += 1;
        }
        let extra = (&raw mut (*c).extra) as *mut Range;
        let ne = ((*c).h.n_extra as usize).min(EXTRA_CAP);
        for i in 0..ne {
            let r = &mut *extra.add(i);
            if r.start < e && s < r.end {
                let p = load_prot(r);
                if p != DISARMED {
                    f(r, p);
                }
            }
        }
    }
}

/// Makes the armed pages of `[ptr, ptr+len)` writable (with the app's protection): the kernel
/// is about to write there. The range is recorded in `slot` first (see [`Inflight`]).
unsafe fn touch(c: *mut Control, slot: *mut Inflight, ptr: u64, len: u64) {
    // SAFETY: reads of the control block; mprotect on ranges the supervisor armed; `slot` is
    // ours (claimed) or null.
    unsafe {
        if ptr == 0 || len == 0 || (*c).h.active == 0 {
            return;
        }
        let s = ptr & !(PAGE - 1);
        let e = ptr.saturating_add(len).saturating_add(PAGE - 1) & !(PAGE - 1);
        // Named in flight before it is opened: a pause in between must not protect it again.
        if !slot.is_null() {
            let n = (*slot).n as usize;
            if n < INFLIGHT_RANGES {
                *((&raw mut (*slot).ranges) as *mut [u64; 2]).add(n) = [s, e];
            }
            AtomicU64::from_ptr(&raw mut (*slot).n).store(n as u64 + 1, Ordering::Release);
        }
        overlapping(c, s, e, |r, prot| {
            if prot & PROT_WRITE == 0 {
                return;
            }
            let (os, oe) = (s.max(r.start), e.min(r.end));
            let mut rc = sc(nr::MPROTECT, os, oe - os, prot);
            if rc == -ENOMEM {
                // Too many mappings to split one more: open the whole entry.
                rc = sc(nr::MPROTECT, r.start, r.end - r.start, prot);
            }
            let _ = rc;
            AtomicU64::from_ptr(&raw mut (*c).h.opened).fetch_add((oe - os) / PAGE, Ordering::Relaxed);
        });
    }
}

/// SIGSEGV: a write to an armed page, or the app's own fault.
unsafe extern "C" fn segv_handler(sig: i32, info: *mut u8, uc: *mut u8) {
    // SAFETY: the kernel passes a valid siginfo and ucontext.
    unsafe {
        let c = ctl();
        let code = *(info.add(8) as *const i32);
        let addr = *(info.add(16) as *const u64);
        let err = *(uc.add(GREGS + 8 * REG_ERR) as *const u64);
        if code == SEGV_ACCERR && err & 2 != 0 && (*c).h.active != 0 {
            let page = addr & !(PAGE - 1);
            let mut hit = false;
            overlapping(c, page, page + PAGE, |r, prot| {
                if hit || prot & PROT_WRITE == 0 {
                    return;
                }
                hit = true;
                let mut rc = sc(nr::MPROTECT, page, PAGE, prot);
                if rc == -ENOMEM {
                    rc = sc(nr::MPROTECT, r.start, r.end - r.start, prot);
                }
                let _ = rc;
                AtomicU64::from_ptr(&raw mut (*c).h.faults).fetch_add(1, Ordering::Relaxed);
            });
            if hit {
                return;
            }
            // Another thread may be between disarming the entry that covered this page and
            // the app's call it did that for: wait until it is done, then let the write run
            // again (it then succeeds, faults on an entry we find, or faults for the app).
            let lock = AtomicU32::from_ptr(&raw mut (*c).h.lock);
            if lock.load(Ordering::Acquire) != 0 {
                loop {
                    let owner = lock.load(Ordering::Acquire);
                    if owner == 0 || !thread_alive(owner) {
                        break; // done, or a lock copied by fork from a thread not here
                    }
                    sc(nr::SCHED_YIELD, 0, 0, 0);
                }
                return;
            }
        }
        if code == SEGV_ACCERR && err & 2 != 0 {
            // Not armed now, but the page may have been when the write faulted: the supervisor
            // can rearm or disarm between the fault and this handler (it may take the thread
            // over with the signal pending). Let the write run once more; a second fault at
            // the same address from the same thread is the app's.
            let tid = sc(nr::GETTID, 0, 0, 0) as u64;
            let slot = ((&raw mut (*c).retry) as *mut [u64; 2]).add(tid as usize % RETRY_SLOTS);
            if (*slot)[0] == tid && (*slot)[1] == addr {
                *slot = [0, 0];
            } else {
                *slot = [tid, addr];
                return;
            }
        }
        chain(sig as u64, info, uc, &raw mut (*c).h.app_segv);
    }
}

/// Delivers a signal the way the kernel would have with the app's disposition `app`.
unsafe fn chain(sig: u64, info: *mut u8, uc: *mut u8, app: *mut KSigaction) {
    // SAFETY: `info`/`uc` come from the kernel; `app` points into the control block.
    unsafe {
        let a = *app;
        let code = *(info.add(8) as *const i32);
        let sent = code <= 0; // kill/tgkill/sigqueue: not a fault of this instruction
        if a.handler == 0 || a.handler == 1 {
            if a.handler == 1 && sent {
                return; // ignored
            }
            // Default action (a fault cannot be ignored): put the default back and let it
            // happen — returning re-executes the faulting instruction; a sent signal is sent
            // again.
            let dfl = KSigaction::default();
            sc6(nr::RT_SIGACTION, sig, &raw const dfl as u64, 0, 8, 0, 0);
            if sent {
                let pid = sc(nr::GETPID, 0, 0, 0) as u64;
                let tid = sc(nr::GETTID, 0, 0, 0) as u64;
                sc(nr::TGKILL, pid, tid, sig);
            }
            return;
        }
        // The kernel blocks sa_mask (and the signal itself unless SA_NODEFER) while the
        // handler runs; fault signals stay deliverable.
        let mut mask = *(uc.add(UC_SIGMASK) as *const u64) | a.mask;
        if a.flags & SA_NODEFER == 0 {
            mask |= bit(sig);
        }
        mask &= !FAULT_SIGS;
        let mut saved = 0u64;
        sc6(nr::RT_SIGPROCMASK, 2, &raw const mask as u64, &raw mut saved as u64, 8, 0, 0);
        if a.flags & SA_RESETHAND != 0 {
            (*app).handler = 0;
        }
        if a.flags & SA_SIGINFO != 0 {
            let f: extern "C" fn(i32, *mut u8, *mut u8) = core::mem::transmute(a.handler as usize);
            f(sig as i32, info, uc);
        } else {
            let f: extern "C" fn(i32) = core::mem::transmute(a.handler as usize);
            f(sig as i32);
        }
        sc6(nr::RT_SIGPROCMASK, 2, &raw const saved as u64, 0, 8, 0, 0);
    }
}

/// SIGSYS: a system call trapped by our filter, or the app's own SIGSYS.
unsafe extern "C" fn sys_handler(sig: i32, info: *mut u8, uc: *mut u8) {
    // SAFETY: the kernel passes a valid siginfo and ucontext.
    unsafe {
        let c = ctl();
        let errno = *(info.add(4) as *const i32);
        let code = *(info.add(8) as *const i32);
        if code != SYS_SECCOMP || errno as u32 != TRAP_TAG {
            chain(sig as u64, info, uc, &raw mut (*c).h.app_sys);
            return;
        }
        let nr = *(info.add(24) as *const i32) as u64;
        let g = uc.add(GREGS) as *mut u64;
        let a = [
            *g.add(REG_RDI),
            *g.add(REG_RSI),
            *g.add(REG_RDX),
            *g.add(REG_R10),
            *g.add(REG_R8),
            *g.add(REG_R9),
        ];
        AtomicU64::from_ptr(&raw mut (*c).h.trapped).fetch_add(1, Ordering::Relaxed);
        // The slot names the calling thread (see `Inflight::owner`).
        let slot = claim(c, sc(nr::GETTID, 0, 0, 0) as u64);
        let mut r = emulate(c, slot, nr, a);
        // A pause between opening a buffer and the kernel's write into it (or while the call
        // blocked) may have protected it again if no slot was free: open it and retry.
        let mut tries = 0;
        while r == -EFAULT && tries < 3 && !is_layout(nr) {
            tries += 1;
            r = emulate(c, slot, nr, a);
        }
        if !slot.is_null() {
            AtomicU64::from_ptr(&raw mut (*slot).owner).store(0, Ordering::Release);
        }
        *g.add(REG_RAX) = r as u64;
    }
}

/// A free in-flight slot, or null when all are taken.
unsafe fn claim(c: *mut Control, token: u64) -> *mut Inflight {
    // SAFETY: indices below the capacity; the owner word is claimed atomically.
    unsafe {
        let slots = (&raw mut (*c).inflight) as *mut Inflight;
        for i in 0..INFLIGHT_CAP {
            let s = slots.add(i);
            let owner = AtomicU64::from_ptr(&raw mut (*s).owner);
            if owner.load(Ordering::Relaxed) == 0
                && owner.compare_exchange(0, token, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                AtomicU64::from_ptr(&raw mut (*s).n).store(0, Ordering::Release);
                return s;
            }
        }
        core::ptr::null_mut()
    }
}

fn is_layout(n: u64) -> bool {
    matches!(n, nr::MMAP | nr::MUNMAP | nr::MREMAP | nr::MPROTECT | nr::PKEY_MPROTECT | nr::MADVISE | nr::BRK)
}

fn rd<T: Copy>(addr: u64) -> T {
    // SAFETY: the app passed this pointer to a system call that reads it; a bad pointer faults
    // here instead of returning EFAULT (documented deviation).
    unsafe { core::ptr::read_unaligned(addr as *const T) }
}

/// Strips the signals that must stay deliverable from a mask the app installs.
fn strip(mask: u64) -> u64 {
    mask & !FAULT_SIGS
}

unsafe fn emulate(c: *mut Control, slot: *mut Inflight, n: u64, a: [u64; 6]) -> i64 {
    // SAFETY: each arm reads the app's arguments as the kernel would, then makes the call.
    unsafe {
        let call = |a: [u64; 6]| sc6(n, a[0], a[1], a[2], a[3], a[4], a[5]);
        match n {
            nr::RT_SIGACTION => {
                let sig = a[0];
                if sig == SIGSEGV || sig == SIGSYS {
                    if a[3] != 8 {
                        return -22;
                    }
                    let slot = if sig == SIGSEGV { &raw mut (*c).h.app_segv } else { &raw mut (*c).h.app_sys };
                    let old = *slot;
                    if a[1] != 0 {
                        let new: KSigaction = rd(a[1]);
                        *slot = new;
                        if (new.flags ^ old.flags) & SA_ONSTACK != 0 {
                            let mine = if sig == SIGSEGV { segv_handler as *const () as usize } else { sys_handler as *const () as usize };
                            register(sig, mine as u64, new.flags);
                        }
                    }
                    if a[2] != 0 {
                        core::ptr::write_unaligned(a[2] as *mut KSigaction, old);
                    }
                    return 0;
                }
                touch(c, slot, a[2], 32);
                if a[1] != 0 {
                    let mut act: KSigaction = rd(a[1]);
                    act.mask = strip(act.mask);
                    return sc6(n, a[0], &raw const act as u64, a[2], a[3], 0, 0);
                }
                call(a)
            }
            nr::RT_SIGPROCMASK => {
                touch(c, slot, a[2], 8);
                if a[1] != 0 && a[0] != 1 {
                    let m = strip(rd::<u64>(a[1]));
                    return sc6(n, a[0], &raw const m as u64, a[2], a[3], 0, 0);
                }
                call(a)
            }
            nr::RT_SIGSUSPEND => {
                let m = strip(rd::<u64>(a[0]));
                sc6(n, &raw const m as u64, a[1], 0, 0, 0, 0)
            }
            nr::PPOLL => {
                touch(c, slot, a[0], a[1] * 8);
                touch(c, slot, a[2], 16);
                if a[3] != 0 {
                    let m = strip(rd::<u64>(a[3]));
                    return sc6(n, a[0], a[1], a[2], &raw const m as u64, a[4], 0);
                }
                call(a)
            }
            nr::EPOLL_PWAIT | nr::EPOLL_PWAIT2 => {
                touch(c, slot, a[1], a[2] * 12);
                if a[4] != 0 {
                    let m = strip(rd::<u64>(a[4]));
                    return sc6(n, a[0], a[1], a[2], a[3], &raw const m as u64, a[5]);
                }
                call(a)
            }
            nr::PSELECT6 => {
                let set = a[0].div_ceil(64) * 8;
                touch(c, slot, a[1], set);
                touch(c, slot, a[2], set);
                touch(c, slot, a[3], set);
                touch(c, slot, a[4], 16);
                if a[5] != 0 {
                    let (p, len): (u64, u64) = (rd(a[5]), rd(a[5] + 8));
                    if p != 0 {
                        let m = strip(rd::<u64>(p));
                        let data = [&raw const m as u64, len];
                        return sc6(n, a[0], a[1], a[2], a[3], a[4], data.as_ptr() as u64);
                    }
                }
                call(a)
            }
            nr::MPROTECT | nr::PKEY_MPROTECT | nr::MUNMAP => {
                let (s, e) = (a[0], a[0].saturating_add(a[1]));
                layout(c, || {
                    disarm(c, s, e);
                    log(c, s, e, LOG_CHANGED);
                    call(a)
                })
            }
            nr::MADVISE => {
                let (s, e) = (a[0], a[0].saturating_add(a[1]));
                layout(c, || {
                    log(c, s, e, LOG_CHANGED);
                    call(a)
                })
            }
            nr::MMAP => layout(c, || {
                let fixed = a[3] & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0;
                if fixed {
                    disarm(c, a[0], a[0].saturating_add(a[1]));
                }
                let r = call(a);
                if r >= 0 {
                    let (s, e) = (r as u64, (r as u64).saturating_add(a[1]));
                    if !fixed {
                        disarm(c, s, e);
                    }
                    log(c, s, e, LOG_CHANGED);
                    if a[3] & MAP_STACK != 0 {
                        log(c, s, e, LOG_STACK);
                    }
                }
                r
            }),
            nr::MREMAP => layout(c, || {
                // Moved pages keep their protection: `disarm` gives armed ones the app's back.
                let (s, e) = (a[0], a[0].saturating_add(a[1]));
                disarm(c, s, e);
                log(c, s, e, LOG_CHANGED);
                if a[3] & MREMAP_FIXED != 0 {
                    disarm(c, a[4], a[4].saturating_add(a[2]));
                }
                let r = call(a);
                if r >= 0 {
                    let (ns, ne) = (r as u64, (r as u64).saturating_add(a[2]));
                    disarm(c, ns, ne);
                    log(c, ns, ne, LOG_CHANGED);
                }
                r
            }),
            nr::BRK => layout(c, || {
                let cur = sc(nr::BRK, 0, 0, 0) as u64;
                let r = call(a);
                let now = r as u64;
                if now != cur {
                    let s = cur.min(now) & !(PAGE - 1);
                    let e = (cur.max(now) + PAGE - 1) & !(PAGE - 1);
                    disarm(c, s, e);
                    log(c, s, e, LOG_CHANGED);
                }
                r
            }),
            nr::SIGALTSTACK => {
                touch(c, slot, a[1], 24);
                if a[0] != 0 {
                    let (sp, flags, size): (u64, i32, u64) = (rd(a[0]), rd(a[0] + 8), rd(a[0] + 16));
                    if flags & 2 == 0 && size > 0 {
                        // SS_DISABLE not set: signal frames will be written there by the kernel.
                        layout(c, || {
                            touch(c, slot, sp, size);
                            log(c, sp & !(PAGE - 1), (sp + size + PAGE - 1) & !(PAGE - 1), LOG_STACK);
                            0
                        });
                    }
                }
                call(a)
            }
            nr::RSEQ => {
                if a[0] != 0 {
                    layout(c, || {
                        touch(c, slot, a[0], a[1] as u32 as u64);
                        log(c, a[0] & !(PAGE - 1), (a[0] + a[1] as u32 as u64 + PAGE - 1) & !(PAGE - 1), LOG_STACK);
                        0
                    });
                }
                call(a)
            }
            // `no_new_privs`, when the supervisor set it for the filter (`nnp_forced`): the
            // app reads and sets its own state, `app_nnp`. The kernel checks the arguments
            // (anything but 0 after the option, or 1 then 0s to set, is `EINVAL`), so a
            // well-formed `PR_GET_NO_NEW_PRIVS` is answered here and everything else is made.
            nr::PRCTL if (*c).h.nnp_forced != 0 && (a[0] == PR_GET_NO_NEW_PRIVS
                || a[0] == PR_SET_NO_NEW_PRIVS) => {
                let app = AtomicU32::from_ptr(&raw mut (*c).h.app_nnp);
                if a[0] == PR_GET_NO_NEW_PRIVS && (a[1] | a[2] | a[3] | a[4]) == 0 {
                    return app.load(Ordering::Relaxed) as i64;
                }
                let r = call(a);
                if a[0] == PR_SET_NO_NEW_PRIVS && r == 0 {
                    // Per thread in the kernel, per process here: see
                    // `Agent::prepare_no_new_privs` (`src/agent.rs`).
                    app.store(1, Ordering::Relaxed);
                }
                r
            }
            nr::EXECVE | nr::EXECVEAT => -EPERM,
            _ => {
                buffers(c, slot, n, &a);
                call(a)
            }
        }
    }
}

/// Runs a memory-layout call with signals blocked and the lock held: the supervisor never
/// sees the log, the armed entries and the layout disagree (a pause that finds the lock held
/// leaves them for the next).
unsafe fn layout(c: *mut Control, f: impl FnOnce() -> i64) -> i64 {
    // SAFETY: masks on our stack; the lock is a u32 in the control block.
    unsafe {
        let all: u64 = !FAULT_SIGS;
        let mut saved = 0u64;
        sc6(nr::RT_SIGPROCMASK, 2, &raw const all as u64, &raw mut saved as u64, 8, 0, 0);
        let lock = AtomicU32::from_ptr(&raw mut (*c).h.lock);
        let me = sc(nr::GETTID, 0, 0, 0) as u32;
        let mut spins = 0u32;
        loop {
            match lock.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                // Held by a thread that is not in this process: `fork` copied the lock of
                // another thread of the parent, caught inside a layout call, into this child,
                // where nobody will release it. What it was updating is a consistent prefix
                // (the copy is taken under the parent's mmap lock, and every update here
                // keeps the entries covering whatever is protected); the supervisor rebuilds
                // the rest when it adopts this process. Checked now and then only: it costs
                // a system call.
                Err(owner) if owner != 0 && spins % 1024 == 1023 && !thread_alive(owner) => {
                    if lock
                        .compare_exchange(owner, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
                Err(_) => core::hint::spin_loop(),
            }
            spins = spins.wrapping_add(1);
        }
        let r = f();
        lock.store(0, Ordering::Release);
        sc6(nr::RT_SIGPROCMASK, 2, &raw const saved as u64, 0, 8, 0, 0);
        r
    }
}

/// Whether thread `tid` (a TID as `gettid` gives it) is a thread of this process:
/// `tgkill(getpid(), tid, 0)` checks without sending anything, and fails with `ESRCH` for a
/// TID that is not one of this thread group's (a thread of the parent this process was forked
/// from). (A TID reused by a new thread of this process would count as alive: the parent's
/// thread must have exited first, and the wait then lasts until that thread's own next
/// layout call.)
fn thread_alive(tid: u32) -> bool {
    const ESRCH: i64 = 3;
    // SAFETY: `getpid` and a signal-0 `tgkill` touch no memory and send nothing.
    unsafe {
        let pid = sc(nr::GETPID, 0, 0, 0) as u64;
        sc(nr::TGKILL, pid, tid as u64, 0) != -ESRCH
    }
}

/// Records a changed range for the supervisor. Caller holds the lock.
unsafe fn log(c: *mut Control, s: u64, e: u64, kind: u64) {
    // SAFETY: the lock serialises writers; the supervisor reads only while we are stopped.
    unsafe {
        if s >= e {
            return;
        }
        let h = (*c).h.log_head;
        if h - (*c).h.log_cursor >= LOG_CAP as u64 {
            (*c).h.log_overflow = 1;
            return;
        }
        let slot = &mut *((&raw mut (*c).log) as *mut LogEntry).add((h % LOG_CAP as u64) as usize);
        slot.end = e;
        slot.kind = kind;
        slot.start = s;
        (*c).h.log_head = h + 1;
    }
}

/// Stops tracking `[s, e)`: armed entries overlapping it are disarmed and the overlapped part
/// gets the app's protection back (so whatever the app's call does, or if it fails, no page
/// is left read-only without an entry), the parts outside it stay armed as new `extra`
/// entries (or, with no room, are opened and logged). Caller holds the lock.
///
/// The kept parts are added before the old entries are disarmed, so a concurrent fault always
/// finds an entry for them (a fault inside `[s, e)` meanwhile waits for the lock: see
/// `segv_handler`).
unsafe fn disarm(c: *mut Control, s: u64, e: u64) {
    // SAFETY: the lock serialises writers of the entries; readers see whole u64s.
    unsafe {
        const KEEP: usize = 64;
        // Uninitialised on purpose: zeroing would be a call to `memset` through the GOT.
        let mut keep = core::mem::MaybeUninit::<[(u64, u64, u64); KEEP]>::uninit();
        let kp = keep.as_mut_ptr() as *mut (u64, u64, u64);
        let mut nk = 0;
        overlapping(c, s, e, |r, prot| {
            for (ks, ke) in [(r.start, s.min(r.end)), (e.max(r.start), r.end)] {
                if ks >= ke {
                    continue;
                }
                let n = (*c).h.n_extra as usize;
                if n < EXTRA_CAP {
                    *((&raw mut (*c).extra) as *mut Range).add(n) = Range { start: ks, end: ke, prot };
                    AtomicU64::from_ptr(&raw mut (*c).h.n_extra).store(n as u64 + 1, Ordering::Release);
                } else if nk < KEEP {
                    *kp.add(nk) = (ks, ke, prot);
                    nk += 1;
                } else {
                    // Out of every kind of room: open it now, captured whole.
                    sc(nr::MPROTECT, ks, ke - ks, prot);
                    log(c, ks, ke, LOG_CHANGED);
                }
            }
        });
        // No room to keep these armed: give them the app's protection; captured whole.
        for k in 0..nk {
            let (ks, ke, prot) = *kp.add(k);
            sc(nr::MPROTECT, ks, ke - ks, prot);
            log(c, ks, ke, LOG_CHANGED);
        }
        // The new extra entries lie outside [s, e): this pass sees only the old ones.
        overlapping(c, s, e, |r, prot| {
            let (os, oe) = (s.max(r.start), e.min(r.end));
            sc(nr::MPROTECT, os, oe - os, prot);
            AtomicU64::from_ptr(&raw mut r.prot).store(DISARMED, Ordering::Release);
        });
    }
}

/// Output buffers of system calls the kernel writes into: opened before the call.
unsafe fn buffers(c: *mut Control, slot: *mut Inflight, n: u64, a: &[u64; 6]) {
    // SAFETY: reads of the app's argument structures, as the kernel would read them.
    unsafe {
        let t = |p: u64, len: u64| touch(c, slot, p, len);
        let iovs = |p: u64, cnt: u64| {
            for i in 0..cnt.min(1024) {
                let (base, len): (u64, u64) = (rd(p + 16 * i), rd(p + 16 * i + 8));
                t(base, len);
            }
        };
        let sockaddr = |addr: u64, lenp: u64| {
            if lenp != 0 {
                t(lenp, 4);
                if addr != 0 {
                    t(addr, rd::<u32>(lenp) as u64);
                }
            }
        };
        let msghdr = |m: u64| {
            t(m, 56);
            let (name, namelen, iov, iovlen, ctl, ctllen): (u64, u32, u64, u64, u64, u64) =
                (rd(m), rd(m + 8), rd(m + 16), rd(m + 24), rd(m + 32), rd(m + 40));
            t(name, namelen as u64);
            iovs(iov, iovlen);
            t(ctl, ctllen);
        };
        match n {
            nr::READ | nr::PREAD64 | nr::GETDENTS | nr::GETDENTS64 => t(a[1], a[2]),
            nr::READV | nr::PREADV | nr::PREADV2 => iovs(a[1], a[2]),
            nr::RECVFROM => {
                t(a[1], a[2]);
                sockaddr(a[4], a[5]);
            }
            nr::RECVMSG => msghdr(a[1]),
            nr::RECVMMSG => {
                for i in 0..a[2].min(1024) {
                    msghdr(a[1] + 64 * i);
                    t(a[1] + 64 * i + 56, 4);
                }
            }
            nr::SENDMMSG => {
                for i in 0..a[2].min(1024) {
                    t(a[1] + 64 * i + 56, 4);
                }
            }
            nr::EPOLL_WAIT => t(a[1], a[2] * 12),
            nr::POLL => t(a[0], a[1] * 8),
            nr::SELECT => {
                let set = a[0].div_ceil(64) * 8;
                t(a[1], set);
                t(a[2], set);
                t(a[3], set);
                t(a[4], 16);
            }
            nr::STAT | nr::LSTAT | nr::FSTAT => t(a[1], 144),
            nr::NEWFSTATAT => t(a[2], 144),
            nr::STATX => t(a[4], 256),
            nr::STATFS | nr::FSTATFS => t(a[1], 120),
            nr::READLINK => t(a[1], a[2]),
            nr::READLINKAT => t(a[2], a[3]),
            nr::GETCWD => t(a[0], a[1]),
            nr::UNAME => t(a[0], 390),
            nr::SYSINFO => t(a[0], 112),
            nr::TIMES => t(a[0], 32),
            nr::TIMER_GETTIME | nr::TIMERFD_GETTIME => t(a[1], 32),
            nr::GETRUSAGE => t(a[1], 144),
            nr::GETTIMEOFDAY => {
                t(a[0], 16);
                t(a[1], 8);
            }
            nr::CLOCK_GETTIME | nr::CLOCK_GETRES => t(a[1], 16),
            nr::CLOCK_NANOSLEEP => t(a[3], 16),
            nr::NANOSLEEP => t(a[1], 16),
            nr::ACCEPT | nr::ACCEPT4 | nr::GETSOCKNAME | nr::GETPEERNAME => sockaddr(a[1], a[2]),
            nr::GETSOCKOPT => {
                if a[4] != 0 {
                    t(a[4], 4);
                    t(a[3], rd::<u32>(a[4]) as u64);
                }
            }
            nr::PIPE | nr::PIPE2 => t(a[0], 8),
            nr::SOCKETPAIR => t(a[3], 8),
            nr::WAIT4 => {
                t(a[1], 4);
                t(a[3], 144);
            }
            nr::WAITID => {
                t(a[2], 128);
                t(a[4], 144);
            }
            nr::GETRANDOM => t(a[0], a[1]),
            nr::PRLIMIT64 => t(a[3], 16),
            nr::GETRLIMIT => t(a[1], 16),
            nr::SCHED_GETAFFINITY => t(a[2], a[1]),
            nr::TIMERFD_SETTIME | nr::TIMER_SETTIME => t(a[3], 32),
            nr::TIMER_CREATE => t(a[2], 4),
            nr::GETITIMER => t(a[1], 32),
            nr::SETITIMER => t(a[2], 32),
            nr::RT_SIGTIMEDWAIT => t(a[1], 128),
            nr::RT_SIGPENDING => t(a[0], 8),
            nr::FCNTL => match a[1] {
                5 | 36 => t(a[2], 32), // F_GETLK, F_OFD_GETLK
                16 => t(a[2], 8),      // F_GETOWN_EX
                _ => {}
            },
            nr::IOCTL => {
                let req = a[1] as u32;
                let dir = req >> 30;
                let size = ((req >> 16) & 0x3fff) as u64;
                if dir & 2 != 0 {
                    t(a[2], size);
                } else {
                    match req {
                        0x5401 => t(a[2], 60),                   // TCGETS
                        0x5413 => t(a[2], 8),                    // TIOCGWINSZ
                        0x540F | 0x541B | 0x5411 => t(a[2], 4), // TIOCGPGRP, FIONREAD, TIOCOUTQ
                        0x8900..=0x89ff => t(a[2], 40),          // socket ioctls: struct ifreq
                        _ => {}
                    }
                }
            }
            nr::FUTEX => match a[1] & 0x7f {
                5 => t(a[4], 4),                  // FUTEX_WAKE_OP writes uaddr2
                6 | 7 | 8 | 13 => t(a[0], 4),     // PI lock/unlock/trylock
                11 | 12 => {
                    t(a[0], 4);
                    t(a[4], 4);
                }
                _ => {}
            },
            nr::SENDFILE => t(a[2], 8),
            nr::SPLICE | nr::COPY_FILE_RANGE => {
                t(a[1], 8);
                t(a[3], 8);
            }
            nr::CAPGET => {
                t(a[0], 8);
                t(a[1], 24);
            }
            nr::GETRESUID | nr::GETRESGID => {
                t(a[0], 4);
                t(a[1], 4);
                t(a[2], 4);
            }
            nr::GETGROUPS => t(a[1], a[0] * 4),
            nr::GET_ROBUST_LIST => {
                t(a[1], 8);
                t(a[2], 8);
            }
            nr::PRCTL => match a[0] {
                16 => t(a[1], 16), // PR_GET_NAME
                2 => t(a[1], 4),   // PR_GET_PDEATHSIG
                40 => t(a[1], 8),  // PR_GET_TID_ADDRESS
                _ => {}
            },
            nr::GETXATTR | nr::LGETXATTR | nr::FGETXATTR => t(a[2], a[3]),
            nr::LISTXATTR | nr::LLISTXATTR | nr::FLISTXATTR => t(a[1], a[2]),
            nr::GETCPU => {
                t(a[0], 4);
                t(a[1], 4);
            }
            nr::SCHED_GETPARAM => t(a[1], 4),
            nr::SCHED_GETATTR => t(a[1], a[2]),
            nr::IO_SETUP => t(a[1], 8),
            nr::IO_GETEVENTS => t(a[3], a[2] * 32),
            nr::PROCESS_VM_READV => iovs(a[1], a[2]),
            nr::MQ_TIMEDRECEIVE => {
                t(a[1], a[2]);
                t(a[3], 4);
            }
            nr::MSGRCV => t(a[1], a[2] + 8),
            nr::TIME => t(a[0], 8),
            nr::MINCORE => t(a[2], a[1].div_ceil(PAGE)),
            nr::GET_MEMPOLICY => {
                t(a[0], 4);
                t(a[1], a[2].div_ceil(8));
            }
            nr::IO_URING_SETUP => t(a[1], 120),
            _ => {}
        }
    }
}
