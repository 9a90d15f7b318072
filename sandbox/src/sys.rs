//! Thin wrappers around the raw system calls this crate needs and `libc` does not wrap
//! (`clone3`, `pidfd_send_signal`, `mount_setattr`, `pivot_root`), plus small fd helpers.
//!
//! Everything here that may run between a `clone` and an `execve` in a multi-threaded process
//! (see [`clone3`]) is a plain system call: no allocation, no locks.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A `struct clone_args` for `clone3(2)` (libc's: version 2, with `set_tid` and `cgroup`) with
/// every field zero, the kernel's "not set": callers fill in what they use with `..clone_args()`.
pub(crate) fn clone_args() -> libc::clone_args {
    // SAFETY: the struct is plain unsigned integers, for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// A raw system call's return value: the error in `errno` if negative. Async-signal-safe.
fn cvt(ret: impl Into<i64>) -> io::Result<i64> {
    let ret = ret.into();
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Raw `clone3(2)` with no stack (`stack = 0`): fork-like, the child continues on a copy-on-write
/// copy of the caller's stack. Returns `Ok(0)` in the child and the child's PID (as seen from the
/// caller's PID namespace) in the parent.
///
/// # Safety
/// glibc's fork handlers do not run in the child. If the calling process has other threads, the
/// child must restrict itself to async-signal-safe operations (raw system calls; no allocation,
/// no locks, no `std` I/O) until it calls `execve` or `_exit`. Every pointer in `args` must be
/// valid for the kernel to read (or, for `pidfd`, write) during the call.
pub(crate) unsafe fn clone3(args: &mut libc::clone_args) -> io::Result<libc::pid_t> {
    // SAFETY: the caller guarantees the pointers in `args` are valid and that the child behaves;
    // the size passed matches the struct.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    cvt(ret).map(|pid| pid as libc::pid_t)
}

/// A pipe whose both ends are close-on-exec: `(read, write)`.
pub(crate) fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The NULL-terminated array of pointers to `strings` that `execve` takes as `argv`/`envp`.
pub(crate) fn ptr_array(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain([std::ptr::null()])
        .collect()
}

/// Sets or clears `FD_CLOEXEC` on `fd`. Async-signal-safe.
pub(crate) fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_SETFD takes an int argument and only touches the fd table.
    let ret = unsafe { libc::fcntl(fd, libc::F_SETFD, if on { libc::FD_CLOEXEC } else { 0 }) };
    cvt(ret).map(drop)
}

/// Whether `fd` is an open file descriptor of this process.
pub(crate) fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD has no argument and only reads the fd table.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// `dup2(2)`.
pub(crate) fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: dup2 only manipulates the fd table; a bad fd is reported as an error.
    cvt(unsafe { libc::dup2(from, to) }).map(drop)
}

/// `pidfd_open(2)`.
pub(crate) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) })?;
    // SAFETY: a fresh descriptor the kernel just gave us, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal(2)` (no siginfo, no flags).
pub(crate) fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: the pidfd is valid for the borrow; a NULL siginfo and zero flags are allowed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    cvt(ret).map(drop)
}

/// How a child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildStatus {
    Exited(i32),
    Signaled { signal: i32, core_dumped: bool },
}

impl ChildStatus {
    /// From a `waitpid` status word.
    pub(crate) fn from_wait_status(status: libc::c_int) -> Option<Self> {
        if libc::WIFEXITED(status) {
            Some(ChildStatus::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(ChildStatus::Signaled {
                signal: libc::WTERMSIG(status),
                core_dumped: libc::WCOREDUMP(status),
            })
        } else {
            None
        }
    }
}

const P_PIDFD: libc::idtype_t = 3;

/// `waitid(P_PIDFD, pidfd, WEXITED [| WNOHANG])`: reaps the child. `Ok(None)` when `nohang` and
/// the child is still running.
pub(crate) fn waitid_pidfd(pidfd: BorrowedFd<'_>, nohang: bool) -> io::Result<Option<ChildStatus>> {
    loop {
        // SAFETY: siginfo_t is plain data; all-zero is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | if nohang { libc::WNOHANG } else { 0 };
        // SAFETY: `info` is a valid siginfo_t for the kernel to fill; the pidfd is valid.
        let ret =
            unsafe { libc::waitid(P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, flags) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        // SAFETY: waitid succeeded, so si_pid/si_status are initialised (si_pid is 0 when
        // WNOHANG found nothing, thanks to the zeroing above).
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None);
        }
        return Ok(Some(match info.si_code {
            libc::CLD_EXITED => ChildStatus::Exited(status),
            libc::CLD_DUMPED => ChildStatus::Signaled {
                signal: status,
                core_dumped: true,
            },
            _ => ChildStatus::Signaled {
                signal: status,
                core_dumped: false,
            },
        }));
    }
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// Makes the mount at `path` and every mount below it read-only (`mount_setattr(2)` with
/// `AT_RECURSIVE`).
pub(crate) fn make_readonly_recursive(path: &CStr) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is NUL-terminated, `attr` is a valid mount_attr of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    cvt(ret).map(drop)
}

/// `pivot_root(2)`.
pub(crate) fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: both paths are NUL-terminated strings valid for the call.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) };
    cvt(ret).map(drop)
}

/// `mount(2)` with optional source, fs type and data.
pub(crate) fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let p = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is either NULL or a NUL-terminated string valid for the call.
    let ret = unsafe {
        libc::mount(
            p(source),
            target.as_ptr(),
            p(fstype),
            flags,
            p(data).cast::<libc::c_void>(),
        )
    };
    cvt(ret).map(drop)
}

/// The signal set holding exactly `signals`.
pub(crate) fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; it is initialised by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are checked by sigaddset.
    unsafe {
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

/// Blocks or unblocks (`how` = `SIG_BLOCK`/`SIG_SETMASK`/...) the given signals in this thread.
pub(crate) fn sigmask(how: libc::c_int, signals: &[libc::c_int]) -> io::Result<()> {
    let set = sigset(signals);
    // SAFETY: `set` is initialised; a NULL old set is allowed.
    let ret = unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) };
    if ret != 0 {
        Err(io::Error::from_raw_os_error(ret))
    } else {
        Ok(())
    }
}

/// Unblocks every signal and resets every catchable signal's disposition to the default:
/// what a freshly started service expects. Async-signal-safe (raw `sigprocmask`/`sigaction`).
pub(crate) fn reset_signals() {
    // SAFETY: sigset_t/sigaction are plain data; zeroed = empty set / SIG_DFL with no flags.
    // sigprocmask and sigaction are async-signal-safe; errors (for SIGKILL, SIGSTOP and the
    // NPTL-internal signals) are deliberately ignored.
    unsafe {
        let empty: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let dfl: libc::sigaction = std::mem::zeroed();
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
}

/// Writes all of `buf` to `fd` with raw `write(2)` calls, retrying on `EINTR`. Async-signal-safe.
pub(crate) fn write_all_raw(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}
