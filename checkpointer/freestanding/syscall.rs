//! Raw system calls for the freestanding blobs (`restorer/`, `agent/`), which have no libc.
//! Included by each with `#[path]`; both are built by `build.rs`.

use core::arch::asm;

/// A system call with six arguments; returns the kernel's result (`-errno` on failure).
#[inline(always)]
pub unsafe fn sc6(n: u64, a: u64, b: u64, c: u64, d: u64, e: u64, f: u64) -> i64 {
    let r: i64;
    // SAFETY: a raw system call; the caller guarantees the arguments are valid for `n`.
    unsafe {
        asm!("syscall", inlateout("rax") n as i64 => r, in("rdi") a, in("rsi") b, in("rdx") c,
             in("r10") d, in("r8") e, in("r9") f, lateout("rcx") _, lateout("r11") _,
             options(nostack));
    }
    r
}

/// A system call with three arguments.
#[inline(always)]
pub unsafe fn sc(n: u64, a: u64, b: u64, c: u64) -> i64 {
    // SAFETY: forwarded to the caller.
    unsafe { sc6(n, a, b, c, 0, 0, 0) }
}
