//! The restorer: a freestanding static-pie program (no libc, no allocation, no relocations)
//! that turns itself into the checkpointed process.
//!
//! It is exec'd by the sandbox's restore child, which has already recreated the file descriptors
//! and holds the target's PID. It then:
//! 1. reads the plan header, picks a place for itself inside the hole the plan names (avoiding
//!    its own current mappings), copies its image, the plan and its stacks there and jumps there;
//! 2. unmaps everything else (its old image, stack, vDSO), maps the vDSO at the target's address,
//!    recreates every mapping at its old address and fills the saved pages;
//! 3. restores the process-wide state (mm layout, signal actions, umask, close-on-exec flags);
//! 4. recreates the threads with their old TIDs (clone3 `set_tid`), sets each one's FS/GS base,
//!    robust list, clear_child_tid, rseq and name, waits until all are ready, tells the supervisor
//!    (which later unmaps this blob) and resumes every thread with `rt_sigreturn` on a frame
//!    holding its saved registers, signal mask, alternate stack and XSAVE state. POSIX timers
//!    are created (with their ids) once the threads exist and armed, with interval timers,
//!    just before the threads resume; the service's seccomp filters are installed last (see
//!    `install_filters`).
//!
//! Invariants: the code must be position independent and self-contained — no statics holding
//! pointers, no formatting, no panics that read their location (the panic handler only exits).
//! It is built by `checkpointer/build.rs` with plain `rustc`, and the build fails if the linked
//! binary has any relocation.

#![no_std]
#![no_main]
#![allow(clippy::missing_safety_doc)]

mod abi;
#[path = "../freestanding/syscall.rs"]
mod syscall;
use syscall::{sc, sc6};

use abi::*;
use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU32, Ordering};

const PAGE: u64 = 4096;
/// End of the user address space with 4-level paging.
const TASK_END: u64 = 0x7fff_ffff_f000;

// Failure codes: the restorer's exit status and the `step` of the failure record it writes to
// the notify descriptor. `checkpointer::restore` maps them to messages.
const E_ARGS: u64 = 1;
const E_PLAN: u64 = 2;
const E_HOLE: u64 = 3;
const E_UNMAP: u64 = 4;
const E_VDSO: u64 = 5;
const E_MMAP: u64 = 6;
const E_PREAD: u64 = 7;
const E_MPROTECT: u64 = 8;
const E_MM: u64 = 9;
const E_SIGACTION: u64 = 10;
const E_CLONE: u64 = 11;
const E_THREAD: u64 = 12;
const E_RSEQ: u64 = 13;
const E_CREDS: u64 = 14;
const E_TIMER: u64 = 15;
const E_SECCOMP: u64 = 16;
const E_SHMAT: u64 = 17;
const E_RMID: u64 = 18;
const E_PENDING: u64 = 19;

mod nr {
    pub const WRITE: u64 = 1;
    pub const GETPID: u64 = 39;
    pub const RT_SIGQUEUEINFO: u64 = 129;
    pub const RT_TGSIGQUEUEINFO: u64 = 297;
    pub const CLOSE: u64 = 3;
    pub const MMAP: u64 = 9;
    pub const MPROTECT: u64 = 10;
    pub const MUNMAP: u64 = 11;
    pub const RT_SIGACTION: u64 = 13;
    pub const RT_SIGPROCMASK: u64 = 14;
    pub const PREAD64: u64 = 17;
    pub const MADVISE: u64 = 28;
    pub const FCNTL: u64 = 72;
    pub const UMASK: u64 = 95;
    pub const PRCTL: u64 = 157;
    pub const ARCH_PRCTL: u64 = 158;
    pub const FUTEX: u64 = 202;
    pub const SET_TID_ADDRESS: u64 = 218;
    pub const EXIT_GROUP: u64 = 231;
    pub const SET_ROBUST_LIST: u64 = 273;
    pub const RSEQ: u64 = 334;
    pub const CLONE3: u64 = 435;
    pub const SETGROUPS: u64 = 116;
    pub const SETRESUID: u64 = 117;
    pub const SETRESGID: u64 = 119;
    pub const SETFSUID: u64 = 122;
    pub const SETFSGID: u64 = 123;
    pub const CAPGET: u64 = 125;
    pub const CAPSET: u64 = 126;
    pub const SETITIMER: u64 = 38;
    pub const TIMER_CREATE: u64 = 222;
    pub const TIMER_SETTIME: u64 = 223;
    pub const TIMER_DELETE: u64 = 226;
    pub const SECCOMP: u64 = 317;
    pub const SHMAT: u64 = 30;
    pub const SHMCTL: u64 = 31;
}


/// Reports a failure to the supervisor (a 24-byte record: u64::MAX, step, -errno) and exits.
fn fail(notify_fd: i32, step: u64, err: i64) -> ! {
    let rec = [u64::MAX, step, err as u64];
    // SAFETY: writes from a valid local buffer, then exits the whole process.
    unsafe {
        if notify_fd >= 0 {
            sc(nr::WRITE, notify_fd as u64, rec.as_ptr() as u64, 24);
        }
        sc(nr::EXIT_GROUP, 100 + step, 0, 0);
    }
    loop {}
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: exit_group never returns.
    unsafe { sc(nr::EXIT_GROUP, 199, 0, 0) };
    loop {}
}

/// Copies `n` bytes (the regions must not overlap).
#[inline(always)]
unsafe fn copy(d: *mut u8, s: *const u8, n: usize) {
    // SAFETY: the caller guarantees `n` bytes are valid at both addresses and do not overlap.
    unsafe {
        asm!("rep movsb", inout("rdi") d => _, inout("rsi") s => _, inout("rcx") n => _,
             options(nostack, preserves_flags));
    }
}

/// Fills `n` bytes with zero.
#[inline(always)]
unsafe fn zero(d: *mut u8, n: usize) {
    // SAFETY: the caller guarantees `n` bytes at `d` are writable.
    unsafe {
        asm!("rep stosb", inout("rdi") d => _, inout("rcx") n => _, in("al") 0u8,
             options(nostack, preserves_flags));
    }
}

// The compiler may emit calls to these; there is no libc to provide them. Our own code calls
// `copy`/`zero` directly (a call to an exported symbol would go through the GOT).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(d: *mut u8, s: *const u8, n: usize) -> *mut u8 {
    // SAFETY: forwarded to the caller.
    unsafe { copy(d, s, n) };
    d
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(d: *mut u8, c: i32, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: the caller guarantees `n` bytes at `d` are writable.
        unsafe { core::ptr::write_volatile(d.add(i), c as u8) };
    }
    d
}

/// Start and end of our own loaded image, found RIP-relative (no GOT, no relocation).
fn image_bounds() -> (u64, u64) {
    let (s, e): (u64, u64);
    // SAFETY: `lea` only computes addresses of linker-defined symbols.
    unsafe {
        asm!("lea {s}, [rip + __ehdr_start]", "lea {e}, [rip + _end]", s = out(reg) s,
             e = out(reg) e, options(nostack, nomem, preserves_flags));
    }
    (s, e)
}

global_asm!(
    ".globl _start",
    "_start:",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {entry}",
    "ud2",
    entry = sym stage0,
);

fn round_up(x: u64, a: u64) -> u64 {
    (x + a - 1) & !(a - 1)
}

fn overlaps(a: u64, b: u64, c: u64, d: u64) -> bool {
    a < d && c < b
}

/// Stage 0: runs where the kernel loaded us. Finds a home in the hole and jumps there.
unsafe extern "C" fn stage0(sp: *const u64) -> ! {
    // SAFETY: `sp` is the initial stack the kernel built: argc, argv[], NULL, envp[], NULL, auxv.
    unsafe {
        // Block every signal: nothing may interrupt the restore. Each thread gets its own mask
        // back from its sigreturn frame. (The kernel refuses a `sigsetsize` other than 8 with
        // `EINVAL`, leaving the mask as it was: the one the restore child had. A child of a
        // held tree stopping itself then ran the app's SIGCHLD handler in its parent, still in
        // here, before the parent held itself: nginx's master under `tardi profile --verify`.)
        let all: u64 = !0;
        sc6(nr::RT_SIGPROCMASK, 2 /* SIG_SETMASK */, &all as *const u64 as u64, 0, 8, 0, 0);
        let argc = *sp;
        if argc < 2 {
            fail(-1, E_ARGS, 0);
        }
        let arg1 = *sp.add(2) as *const u8;
        let mut plan_fd: u64 = 0;
        let mut i = 0;
        loop {
            let c = *arg1.add(i);
            if c == 0 {
                break;
            }
            if !c.is_ascii_digit() {
                fail(-1, E_ARGS, 0);
            }
            plan_fd = plan_fd * 10 + (c - b'0') as u64;
            i += 1;
        }
        // Find AT_SYSINFO_EHDR (the current vDSO) past argv and envp.
        let mut p = sp.add(1 + argc as usize + 1);
        while *p != 0 {
            p = p.add(1);
        }
        p = p.add(1);
        let mut vdso_now = 0u64;
        while *p != 0 {
            if *p == 33 {
                vdso_now = *p.add(1);
            }
            p = p.add(2);
        }

        // Not zeroed first: a memset of the header would be a call through the GOT (a
        // relocation). Used only once pread filled every byte.
        let mut raw = core::mem::MaybeUninit::<PlanHeader>::uninit();
        let sz = core::mem::size_of::<PlanHeader>() as u64;
        if sc6(nr::PREAD64, plan_fd, raw.as_mut_ptr() as u64, sz, 0, 0, 0) != sz as i64 {
            fail(-1, E_PLAN, 0);
        }
        let hdr = raw.assume_init();
        if hdr.magic != PLAN_MAGIC
            || hdr.version != PLAN_VERSION
        {
            fail(-1, E_PLAN, 0);
        }
        let nfd = hdr.notify_fd;

        let (img_start, img_raw_end) = image_bounds();
        let img_end = round_up(img_raw_end, PAGE);
        let img_len = img_end - img_start;
        let plan_off = img_len;
        let stacks_off = round_up(plan_off + hdr.size as u64, PAGE);
        let total = stacks_off + RESTORER_STACK * (hdr.nr_threads as u64 + 1);

        // Our own mappings that the new home must not overlap (stack: generous margin).
        let sp_now = sp as u64;
        let mine = [
            (img_start, img_end),
            (sp_now.saturating_sub(1 << 24), sp_now + (1 << 24)),
            (vdso_now.saturating_sub(1 << 20), vdso_now + (1 << 20)),
        ];
        let (lo, hi) = (hdr.hole_start, hdr.hole_end);
        if hi < lo + total + 2 * PAGE {
            fail(nfd, E_HOLE, 0);
        }
        let span = hi - lo - total;
        let mut base = 0u64;
        for k in [4u64, 2, 6, 1, 7, 3, 5, 0] {
            let cand = (lo + span / 8 * k) & !(PAGE - 1);
            if cand < lo || cand + total > hi {
                continue;
            }
            if mine.iter().any(|&(a, b)| overlaps(cand, cand + total, a, b)) {
                continue;
            }
            let r = sc6(nr::MMAP, cand, total, 7 /* RWX */, 0x22 | 0x100000 /* NOREPLACE */,
                        u64::MAX, 0);
            if r as u64 == cand {
                base = cand;
                break;
            }
        }
        if base == 0 {
            fail(nfd, E_HOLE, 0);
        }
        copy(base as *mut u8, img_start as *const u8, (img_raw_end - img_start) as usize);
        let plan = base + plan_off;
        if sc6(nr::PREAD64, plan_fd, plan, hdr.size as u64, 0, 0, 0) != hdr.size as i64 {
            fail(nfd, E_PLAN, 0);
        }
        sc(nr::CLOSE, plan_fd, 0, 0);
        let target = base + (stage1 as *const () as usize as u64 - img_start);
        let stack_top = base + total;
        asm!("mov rsp, {st}", "xor ebp, ebp", "call {t}", st = in(reg) stack_top,
             t = in(reg) target, in("rdi") plan, in("rsi") base, in("rdx") total,
             options(noreturn));
    }
}

/// Shared state of the threads during the final rendezvous (lives in the relocated image).
#[repr(C)]
struct Rendezvous {
    arrived: AtomicU32,
    go: AtomicU32,
}

struct Ctx {
    plan: u64,
    base: u64,
    total: u64,
    rv: *const Rendezvous,
}

unsafe fn hdr<'a>(plan: u64) -> &'a PlanHeader {
    // SAFETY: the plan was read into our hole and validated in stage 0.
    unsafe { &*(plan as *const PlanHeader) }
}

unsafe fn at<'a, T>(plan: u64, off: u32, i: u32) -> &'a T {
    // SAFETY: offsets come from the validated plan; the supervisor lays arrays out in bounds.
    unsafe { &*((plan + off as u64) as *const T).add(i as usize) }
}

/// Stage 1: runs from the hole on its own stack.
unsafe extern "C" fn stage1(plan: u64, base: u64, total: u64) -> ! {
    // SAFETY: everything below manipulates our own address space as the plan describes; the
    // hole [base, base+total) holding this code, the plan and the stacks is never touched.
    unsafe {
        let h = hdr(plan);
        let nfd = h.notify_fd;

        // 1. Clear the address space around the hole.
        let r = sc(nr::MUNMAP, 0, base, 0);
        if r != 0 {
            fail(nfd, E_UNMAP, r);
        }
        let r = sc(nr::MUNMAP, base + total, TASK_END - (base + total), 0);
        if r != 0 {
            fail(nfd, E_UNMAP, r);
        }

        // 2. The vDSO set at its old address: glibc cached pointers into it.
        if h.vdso_base != 0 {
            let r = sc(nr::ARCH_PRCTL, 0x2003 /* ARCH_MAP_VDSO_64 */, h.vdso_base, 0);
            if r < 0 {
                fail(nfd, E_VDSO, r);
            }
        }

        // 3. Every mapping, then its saved pages.
        for i in 0..h.nr_vmas {
            let v: &VmaDesc = at(plan, h.vmas_off, i);
            let len = v.end - v.start;
            if v.flags & VMA_SYSV != 0 {
                sysv_piece(plan, i, v, nfd);
                continue;
            }
            let fill = v.nr_runs > 0;
            let prot = v.prot as u64 | if fill { 2 } else { 0 };
            let mut flags: u64 = 0x10_0000; // MAP_FIXED_NOREPLACE
            flags |= if v.flags & VMA_SHARED != 0 { 0x01 } else { 0x02 };
            if v.flags & VMA_ANON != 0 {
                flags |= 0x20;
            }
            if v.flags & VMA_GROWSDOWN != 0 {
                flags |= 0x100;
            }
            let fd = if v.fd >= 0 { v.fd as u64 } else { u64::MAX };
            let r = sc6(nr::MMAP, v.start, len, prot, flags, fd, v.file_off);
            if r as u64 != v.start {
                fail(nfd, E_MMAP, r);
            }
            for j in 0..v.nr_runs {
                let run: &PageRun = at(plan, h.runs_off, v.first_run + j);
                // Fault the run's pages in one call rather than one fault per page inside the
                // copy (MADV_POPULATE_WRITE, Linux >= 5.14; an error just means the slow way).
                sc(nr::MADVISE, run.addr, run.len, 23);
                let mut done = 0u64;
                while done < run.len {
                    let r = sc6(nr::PREAD64, h.pages_fd as u64, run.addr + done,
                                run.len - done, run.data_off + done, 0, 0);
                    if r <= 0 {
                        fail(nfd, E_PREAD, r);
                    }
                    done += r as u64;
                }
            }
            if fill && v.prot & 2 == 0 {
                let r = sc(nr::MPROTECT, v.start, len, v.prot as u64);
                if r != 0 {
                    fail(nfd, E_MPROTECT, r);
                }
            }
            for (bit, advice) in [
                (VMA_DONTFORK, 10u64),
                (VMA_WIPEONFORK, 18),
                (VMA_DONTDUMP, 16),
                (VMA_HUGEPAGE, 14),
                (VMA_NOHUGEPAGE, 15),
            ] {
                if v.flags & bit != 0 {
                    sc(nr::MADVISE, v.start, len, advice);
                }
            }
        }

        // Segments that were marked for removal while attached: marked again now that their
        // attachments are back (the kernel removes them at the last detach).
        for i in 0..h.nr_rmid {
            let id: &i32 = at(plan, h.rmid_off, i);
            let r = sc(nr::SHMCTL, *id as u64, 0 /* IPC_RMID */, 0);
            if r != 0 {
                fail(nfd, E_RMID, r);
            }
        }

        // 4. Process-wide state.
        #[repr(C)]
        struct PrctlMmMap {
            mm: MmMap,
            auxv: u64,
            auxv_size: u32,
            exe_fd: u32,
        }
        let map = PrctlMmMap {
            mm: h.mm,
            auxv: plan + h.auxv_off as u64,
            auxv_size: h.auxv_len,
            exe_fd: h.exe_fd as u32,
        };
        let r = sc6(nr::PRCTL, 35 /* PR_SET_MM */, 14 /* PR_SET_MM_MAP */,
                    &map as *const PrctlMmMap as u64, core::mem::size_of::<PrctlMmMap>() as u64,
                    0, 0);
        if r != 0 {
            fail(nfd, E_MM, r);
        }
        for i in 0..h.nr_sigactions {
            let s: &SigactionDesc = at(plan, h.sigactions_off, i);
            let r = sc6(nr::RT_SIGACTION, s.signo as u64, &s.handler as *const u64 as u64, 0, 8,
                        0, 0);
            if r != 0 {
                fail(nfd, E_SIGACTION, r);
            }
        }
        sc(nr::UMASK, h.umask as u64, 0, 0);
        for i in 0..h.nr_close {
            let fd: &i32 = at(plan, h.close_off, i);
            sc(nr::CLOSE, *fd as u64, 0, 0);
        }
        for i in 0..h.nr_cloexec {
            let fd: &i32 = at(plan, h.cloexec_off, i);
            sc(nr::FCNTL, *fd as u64, 2 /* F_SETFD */, 1 /* FD_CLOEXEC */);
        }

        // 5. Threads. The rendezvous sits at the bottom of the stacks area (below every stack).
        let stacks = base + total - RESTORER_STACK * (h.nr_threads as u64 + 1);
        let rv = stacks as *const Rendezvous;
        let ctx = Ctx { plan, base, total, rv };
        for i in 1..h.nr_threads {
            let t: &ThreadDesc = at(plan, h.threads_off, i);
            let tid: i64 = t.tid as i64;
            // CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM
            let args = CloneArgs {
                flags: 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000,
                pidfd: 0,
                child_tid: 0,
                parent_tid: 0,
                exit_signal: 0,
                stack: stacks + RESTORER_STACK * i as u64,
                stack_size: RESTORER_STACK,
                tls: 0,
                set_tid: &tid as *const i64 as u64,
                set_tid_size: 1,
                cgroup: 0,
            };
            let r: i64;
            asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                // Child: on its new stack, registers otherwise as in the parent.
                "xor ebp, ebp",
                "mov rdi, r12",
                "mov rsi, r13",
                "call r14",
                "ud2",
                "2:",
                inlateout("rax") nr::CLONE3 as i64 => r,
                in("rdi") &args as *const CloneArgs as u64,
                in("rsi") core::mem::size_of::<CloneArgs>() as u64,
                in("r12") t as *const ThreadDesc as u64,
                in("r13") &ctx as *const Ctx as u64,
                in("r14") thread_main as *const () as usize as u64,
                lateout("rcx") _, lateout("r11") _,
            );
            if r < 0 {
                fail(nfd, E_CLONE, r);
            }
        }
        // 6. Pending signals, queued again with their details while every thread blocks every
        // signal (each gets its own mask back at its sigreturn): before any filter of the
        // service can refuse the calls (the main thread's own come in `prepare_thread` when
        // `seccomp_early`). Sent by the process to itself, so the kernel accepts any
        // `si_code`, a kernel's or `kill`'s included.
        let tgid = sc(nr::GETPID, 0, 0, 0) as u64;
        for i in 0..h.nr_pending {
            let p: &PendingDesc = at(plan, h.pending_off, i);
            let r = if p.tid == 0 {
                sc(nr::RT_SIGQUEUEINFO, tgid, p.signo as u64, p.info.as_ptr() as u64)
            } else {
                sc6(nr::RT_TGSIGQUEUEINFO, tgid, p.tid as u64, p.signo as u64,
                    p.info.as_ptr() as u64, 0, 0)
            };
            if r != 0 {
                fail(nfd, E_PENDING, r);
            }
        }
        // The main thread's own state; then wait for the others.
        let me: &ThreadDesc = at(plan, h.threads_off, 0);
        let frame = prepare_thread(me, &ctx, stacks + RESTORER_STACK * h.nr_threads as u64);
        let want = h.nr_threads - 1;
        loop {
            let n = (*rv).arrived.load(Ordering::Acquire);
            if n == want {
                break;
            }
            sc6(nr::FUTEX, &(*rv).arrived as *const AtomicU32 as u64, 0 /* WAIT */, n as u64,
                0, 0, 0);
        }
        // Thread-directed timers need their threads: they exist now.
        create_timers(plan, nfd);
        // Tell the supervisor where we are (so it can unmap us once every thread left).
        let rec = [base, total, 0u64];
        sc(nr::WRITE, nfd as u64, rec.as_ptr() as u64, 24);
        sc(nr::CLOSE, nfd as u64, 0, 0);
        if hdr(plan).hold != 0 {
            // kill(getpid(), SIGSTOP): SIGSTOP cannot be blocked; SIGCONT resumes us here.
            let me = sc(39 /* getpid */, 0, 0, 0);
            sc(62 /* kill */, me as u64, 19, 0);
        }
        // Changing IDs made the process non-dumpable; give it the flag it had.
        sc(nr::PRCTL, 4 /* PR_SET_DUMPABLE */, hdr(plan).creds.dumpable as u64, 0);
        arm_timers(plan);
        // The service's seccomp filters, last (see `install_filters`): the shared ones for
        // every thread at once (the others wait in the futex below, which they leave under
        // them), then the go, then this thread's own; then only rt_sigreturn.
        let h = hdr(plan);
        if h.seccomp_early == 0 {
            let r = install_filters(plan, 0, h.seccomp_shared, true);
            if r != 0 {
                fail(-1, E_SECCOMP, r);
            }
        }
        if h.nr_threads > 1 {
            (*rv).go.store(1, Ordering::Release);
            sc6(nr::FUTEX, &(*rv).go as *const AtomicU32 as u64, 1 /* WAKE */, i32::MAX as u64,
                0, 0, 0);
        }
        if h.seccomp_early == 0 {
            let r = install_filters(plan, me.seccomp_first, me.seccomp_count, false);
            if r != 0 {
                fail(-1, E_SECCOMP, r);
            }
        }
        sigreturn(frame);
    }
}

/// One piece of a System V attachment (`VMA_SYSV`, `fd` = shmid, `file_off` = offset in the
/// segment). The piece at offset 0 attaches the whole segment there with `shmat` (which
/// refuses to replace a mapping: nothing is mapped there yet), then unmaps what none of the
/// attachment's pieces (the following `VMA_SYSV` descriptors of the same segment whose start
/// minus offset is this start) covers: holes the process had punched, and the tail past what
/// it kept, where other mappings may come next. Every piece then gets its protection and
/// advice (a read-only attachment, `SHM_RDONLY`, can never be made writable).
unsafe fn sysv_piece(plan: u64, i: u32, v: &VmaDesc, nfd: i32) {
    // SAFETY: the plan's descriptors are in bounds (checked by the supervisor), and the calls
    // only change the target's own mappings, inside what the plan describes.
    unsafe {
        let h = hdr(plan);
        let len = v.end - v.start;
        if v.file_off == 0 {
            let flags = if v.flags & VMA_SHM_RDONLY != 0 { 0o10000 } else { 0 };
            let r = sc(nr::SHMAT, v.fd as u64, v.start, flags);
            if r as u64 != v.start {
                fail(nfd, E_SHMAT, r);
            }
            let limit = v.start + v.attach_len;
            let mut covered = v.end;
            for j in i + 1..h.nr_vmas {
                let w: &VmaDesc = at(plan, h.vmas_off, j);
                if w.start >= limit {
                    break;
                }
                if w.flags & VMA_SYSV != 0 && w.fd == v.fd && w.start.wrapping_sub(w.file_off) == v.start {
                    if w.start > covered {
                        sc(nr::MUNMAP, covered, w.start - covered, 0);
                    }
                    covered = w.end;
                }
            }
            if covered < limit {
                sc(nr::MUNMAP, covered, limit - covered, 0);
            }
        }
        let r = sc(nr::MPROTECT, v.start, len, v.prot as u64);
        if r != 0 {
            fail(nfd, E_MPROTECT, r);
        }
        for (bit, advice) in [(VMA_DONTFORK, 10u64), (VMA_WIPEONFORK, 18), (VMA_DONTDUMP, 16)] {
            if v.flags & bit != 0 {
                sc(nr::MADVISE, v.start, len, advice);
            }
        }
    }
}

/// Entry of a recreated thread (on its restorer stack inside the hole).
unsafe extern "C" fn thread_main(t: *const ThreadDesc, ctx: *const Ctx) -> ! {
    // SAFETY: `t` and `ctx` point into the hole / the main thread's stack frame, which outlives
    // the rendezvous (the main thread waits for every thread before leaving stage 1).
    unsafe {
        let ctx = &*ctx;
        let t = &*t;
        let h = hdr(ctx.plan);
        let idx = (t as *const ThreadDesc as u64 - (ctx.plan + h.threads_off as u64))
            / core::mem::size_of::<ThreadDesc>() as u64;
        let stacks = ctx.base + ctx.total - RESTORER_STACK * (h.nr_threads as u64 + 1);
        // The frame goes at the top of this thread's own stack area, below our current frame.
        let frame = prepare_thread(t, ctx, stacks + RESTORER_STACK * idx);
        let rv = &*ctx.rv;
        rv.arrived.fetch_add(1, Ordering::AcqRel);
        sc6(nr::FUTEX, &rv.arrived as *const AtomicU32 as u64, 1, 1, 0, 0, 0);
        while rv.go.load(Ordering::Acquire) == 0 {
            sc6(nr::FUTEX, &rv.go as *const AtomicU32 as u64, 0, 0, 0, 0, 0);
        }
        if h.seccomp_early == 0 {
            let r = install_filters(ctx.plan, t.seccomp_first, t.seccomp_count, false);
            if r != 0 {
                fail(-1, E_SECCOMP, r);
            }
        }
        sigreturn(frame);
    }
}

/// Sets the calling thread's kernel-side state and builds its sigreturn frame in the lower part
/// of `area` (a RESTORER_STACK-sized region whose upper part is the current stack). Returns the
/// address of the `ucontext` to `rt_sigreturn` on.
unsafe fn prepare_thread(t: &ThreadDesc, ctx: &Ctx, area: u64) -> u64 {
    // SAFETY: plain system calls on our own thread; the frame lies in the hole.
    unsafe {
        let nfd = hdr(ctx.plan).notify_fd;
        let r = sc(nr::ARCH_PRCTL, 0x1002 /* ARCH_SET_FS */, t.regs.fs_base, 0);
        if r != 0 {
            fail(nfd, E_THREAD, r);
        }
        if t.regs.gs_base != 0 {
            sc(nr::ARCH_PRCTL, 0x1001 /* ARCH_SET_GS */, t.regs.gs_base, 0);
        }
        if t.robust_list != 0 {
            sc(nr::SET_ROBUST_LIST, t.robust_list, t.robust_len, 0);
        }
        sc(nr::SET_TID_ADDRESS, t.clear_child_tid, 0, 0);
        sc(nr::PRCTL, 15 /* PR_SET_NAME */, t.comm.as_ptr() as u64, 0);
        if t.rseq_addr != 0 {
            let r = sc6(nr::RSEQ, t.rseq_addr, t.rseq_len as u64, 0, t.rseq_sig as u64, 0, 0);
            if r != 0 {
                fail(nfd, E_RSEQ, r);
            }
        }

        if hdr(ctx.plan).seccomp_early != 0 {
            let r = install_filters(ctx.plan, t.seccomp_first, t.seccomp_count, false);
            if r != 0 {
                fail(nfd, E_SECCOMP, r);
            }
        }
        drop_creds(ctx.plan, nfd);

        // Layout inside `area`: [fpstate (64-aligned) | MAGIC2] ... [ucontext (16-aligned)].
        let fp = round_up(area + 64, 64);
        let xl = t.xstate_len as usize;
        copy(fp as *mut u8, t.xstate.as_ptr(), xl);
        // Software-reserved bytes of the FXSAVE area (offset 464): struct _fpx_sw_bytes.
        let sw = (fp + 464) as *mut u32;
        let xfeatures = if *sw == 0x4650_5853 {
            *((fp + 464 + 8) as *const u64)
        } else {
            *((fp + 512) as *const u64) | 3
        };
        *sw = 0x4650_5853; // FP_XSTATE_MAGIC1
        *sw.add(1) = xl as u32 + 4; // extended_size: area + MAGIC2
        *((fp + 464 + 8) as *mut u64) = xfeatures;
        *sw.add(4) = xl as u32; // xstate_size
        *((fp + xl as u64) as *mut u32) = 0x4650_5845; // FP_XSTATE_MAGIC2

        let uc = round_up(fp + xl as u64 + 4 + 64, 64);
        let q = uc as *mut u64;
        zero(q as *mut u8, 512);
        *q = 1 | 2 | 4; // UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS
        // uc_stack at +16: ss_sp, ss_flags (int), ss_size
        *q.add(2) = t.altstack_sp;
        *(q.add(3) as *mut i32) = t.altstack_flags as i32;
        *q.add(4) = t.altstack_size;
        // uc_mcontext at +40 (word 5): struct sigcontext
        let m = q.add(5);
        let g = &t.regs;
        let words = [
            g.r8, g.r9, g.r10, g.r11, g.r12, g.r13, g.r14, g.r15, g.rdi, g.rsi, g.rbp, g.rbx,
            g.rdx, g.rax, g.rcx, g.rsp, g.rip, g.eflags,
        ];
        for (k, w) in words.iter().enumerate() {
            *m.add(k) = *w;
        }
        // cs, gs, fs, ss as four u16
        let segs = m.add(18) as *mut u16;
        *segs = 0x33;
        *segs.add(1) = 0;
        *segs.add(2) = 0;
        *segs.add(3) = 0x2b;
        // err, trapno, oldmask, cr2 (words 19..22), fpstate (word 23)
        *m.add(23) = fp;
        // uc_sigmask right after the 256-byte sigcontext: word 5 + 32 = 37
        *q.add(37) = t.sigmask;
        if uc + 38 * 8 > area + RESTORER_STACK / 2 {
            fail(nfd, E_THREAD, 0);
        }
        uc
    }
}

/// Gives the calling thread the target's credentials (credentials are per thread: every
/// thread calls this for itself). It runs as root with every capability until here. Order:
/// bounding set (needs CAP_SETPCAP), groups and group IDs (CAP_SETGID), user IDs with
/// keep-caps on (so the permitted set survives leaving root), the permitted set raised to
/// effective again for what follows, inheritable and ambient sets, securebits (CAP_SETPCAP),
/// then the target's capability sets (only ever lowering them), and `no_new_privs` last.
unsafe fn drop_creds(plan: u64, nfd: i32) {
    // SAFETY: plain system calls on this thread; the group list lies inside the plan.
    unsafe {
        let c = &hdr(plan).creds;
        let ck = |r: i64| {
            if r < 0 {
                fail(nfd, E_CREDS, r);
            }
        };
        for cap in 0..64u64 {
            if c.cap_bounding & (1 << cap) != 0 {
                continue;
            }
            let r = sc(nr::PRCTL, 23 /* PR_CAPBSET_READ */, cap, 0);
            if r < 0 {
                break; // past the kernel's last capability
            }
            if r == 1 {
                ck(sc(nr::PRCTL, 24 /* PR_CAPBSET_DROP */, cap, 0));
            }
        }
        ck(sc(nr::SETGROUPS, c.nr_groups as u64, plan + c.groups_off as u64, 0));
        ck(sc(nr::SETRESGID, c.gid[0] as u64, c.gid[1] as u64, c.gid[2] as u64));
        ck(sc(nr::PRCTL, 8 /* PR_SET_KEEPCAPS */, 1, 0));
        ck(sc(nr::SETRESUID, c.uid[0] as u64, c.uid[1] as u64, c.uid[2] as u64));
        sc(nr::SETFSGID, c.gid[3] as u64, 0, 0);
        sc(nr::SETFSUID, c.uid[3] as u64, 0, 0);
        // struct __user_cap_header_struct, version 3 (64-bit sets as two 32-bit halves).
        let head = [0x2008_0522u32, 0];
        let mut now = [0u32; 6];
        ck(sc(nr::CAPGET, head.as_ptr() as u64, now.as_mut_ptr() as u64, 0));
        let lo = |v: u64| v as u32;
        let hi = |v: u64| (v >> 32) as u32;
        // {effective, permitted, inheritable} × {low, high}
        let raised = [now[1], now[1], lo(c.cap_inheritable), now[4], now[4], hi(c.cap_inheritable)];
        ck(sc(nr::CAPSET, head.as_ptr() as u64, raised.as_ptr() as u64, 0));
        for cap in 0..64u64 {
            if c.cap_ambient & (1 << cap) != 0 {
                ck(sc6(nr::PRCTL, 47 /* PR_CAP_AMBIENT */, 2 /* RAISE */, cap, 0, 0, 0));
            }
        }
        if sc(nr::PRCTL, 27 /* PR_GET_SECUREBITS */, 0, 0) != c.securebits as i64 {
            ck(sc(nr::PRCTL, 28 /* PR_SET_SECUREBITS */, c.securebits as u64, 0));
        }
        let target = [
            lo(c.cap_effective),
            lo(c.cap_permitted),
            lo(c.cap_inheritable),
            hi(c.cap_effective),
            hi(c.cap_permitted),
            hi(c.cap_inheritable),
        ];
        ck(sc(nr::CAPSET, head.as_ptr() as u64, target.as_ptr() as u64, 0));
        if c.no_new_privs != 0 {
            ck(sc6(nr::PRCTL, 38 /* PR_SET_NO_NEW_PRIVS */, 1, 0, 0, 0, 0));
        }
    }
}

/// Creates the POSIX timers with their ids (not armed yet). With
/// `PR_TIMER_CREATE_RESTORE_IDS` (77; Linux >= 6.15) `timer_create` takes the id the caller
/// put in its `timer_t`. Without it, ids come from a per-process counter that starts at 0
/// after exec and only goes up: fillers are created and deleted until the counter reaches
/// each id (timers come in increasing id order).
unsafe fn create_timers(plan: u64, nfd: i32) {
    // SAFETY: plain system calls; the descriptors lie in the plan.
    unsafe {
        let h = hdr(plan);
        if h.nr_timers == 0 {
            return;
        }
        let exact = sc(nr::PRCTL, 77 /* PR_TIMER_CREATE_RESTORE_IDS */, 1 /* ON */, 0) == 0;
        for i in 0..h.nr_timers {
            let t: &TimerDesc = at(plan, h.timers_off, i);
            // struct sigevent (64 bytes): sigev_value, sigev_signo, sigev_notify, then the
            // union whose first int is the thread id of SIGEV_THREAD_ID.
            let mut sev = [0u64; 8];
            sev[0] = t.sigval;
            sev[1] = t.signo as u32 as u64 | (t.notify as u32 as u64) << 32;
            sev[2] = t.tid as u32 as u64;
            loop {
                let mut id: i32 = if exact { t.id } else { -1 };
                let r = sc(nr::TIMER_CREATE, t.clock as u64, sev.as_ptr() as u64,
                           core::ptr::addr_of_mut!(id) as u64);
                if r != 0 {
                    fail(nfd, E_TIMER, r);
                }
                if id == t.id {
                    break;
                }
                if exact || id > t.id {
                    fail(nfd, E_TIMER, 0);
                }
                sc(nr::TIMER_DELETE, id as u64, 0, 0);
            }
        }
        if exact {
            sc(nr::PRCTL, 77, 0 /* OFF */, 0);
        }
    }
}

/// Arms the POSIX timers and the interval timers with the time they had left (relative: from
/// now). Errors are not possible for values the plan carries (checked at decode).
unsafe fn arm_timers(plan: u64) {
    const NS: u64 = 1_000_000_000;
    // SAFETY: plain system calls on local buffers; the descriptors lie in the plan.
    unsafe {
        let h = hdr(plan);
        for i in 0..h.nr_timers {
            let t: &TimerDesc = at(plan, h.timers_off, i);
            if t.value_ns == 0 {
                continue;
            }
            // struct itimerspec: it_interval, it_value, each (tv_sec, tv_nsec).
            let its = [t.interval_ns / NS, t.interval_ns % NS, t.value_ns / NS, t.value_ns % NS];
            sc6(nr::TIMER_SETTIME, t.id as u64, 0, its.as_ptr() as u64, 0, 0, 0);
        }
        for (which, t) in h.itimers.iter().enumerate() {
            if t.value_ns == 0 {
                continue;
            }
            // struct itimerval: it_interval, it_value, each (tv_sec, tv_usec); a value below
            // a microsecond must not round to 0, which would disarm it.
            let usec = |ns: u64| (ns % NS) / 1000;
            let value_us = usec(t.value_ns).max(if t.value_ns < NS { 1 } else { 0 });
            let itv = [t.interval_ns / NS, usec(t.interval_ns), t.value_ns / NS, value_us];
            sc(nr::SETITIMER, which as u64, itv.as_ptr() as u64, 0);
        }
    }
}

/// Installs filters `first..first + count` of the plan's seccomp list in the calling thread
/// (`tsync`: in every thread, `SECCOMP_FILTER_FLAG_TSYNC`). Returns 0, or what the kernel
/// refused with (a negative errno, or with `tsync` the TID of a thread it could not
/// synchronise).
///
/// When, and why then: a filter applies to every system call its thread makes after it is
/// installed, and the service's may refuse, trap or kill on anything the restorer still
/// calls. So each thread installs its filters as its very last step: after its credentials
/// (installing needs `no_new_privs` or `CAP_SYS_ADMIN`, which the target had when it installed
/// them, and the calls that change credentials are what hardening filters refuse), after the
/// report, the hold and the timers. What follows is one `rt_sigreturn` (which any filter of a
/// service that handles signals allows: it is how a handler returns); in the main thread, with
/// more than one thread, also the `futex` wake of the others, and in the others the return
/// from their `futex` wait (a threaded service's filter allows `futex`: its mutexes need it).
/// Filters every thread shares are installed once by the main thread with `TSYNC`, so the
/// threads share them as they most likely did before (a later `TSYNC` of the service needs
/// that). A target whose filters the kernel would refuse once the credentials are back
/// (`seccomp_early`: neither `no_new_privs` nor `CAP_SYS_ADMIN`) installs them before its
/// credentials instead: then the calls that restore those run under the filters too.
/// While the supervisor traces the restored process afterwards (to unmap this blob), the
/// filters are suspended (`PTRACE_O_SUSPEND_SECCOMP`).
unsafe fn install_filters(plan: u64, first: u32, count: u32, tsync: bool) -> i64 {
    // SAFETY: plain system calls; the programs lie in the plan.
    unsafe {
        let h = hdr(plan);
        for i in first..first + count {
            let d: &SeccompDesc = at(plan, h.seccomp_off, i);
            // struct sock_fprog { unsigned short len; struct sock_filter *filter; }
            let prog = [d.len as u64, plan + d.insns_off as u64];
            let flags = d.flags as u64 | tsync as u64; // SECCOMP_FILTER_FLAG_TSYNC = 1
            let r = sc(nr::SECCOMP, 1 /* SECCOMP_SET_MODE_FILTER */, flags,
                       prog.as_ptr() as u64);
            if r != 0 {
                return r;
            }
        }
        0
    }
}

/// `rt_sigreturn` with the stack pointer at the ucontext (the kernel reads the frame at sp - 8).
unsafe fn sigreturn(uc: u64) -> ! {
    // SAFETY: `uc` points at a complete frame built by `prepare_thread`.
    unsafe {
        asm!("mov rsp, {uc}", "mov eax, 15", "syscall", "ud2", uc = in(reg) uc,
             options(noreturn));
    }
}
