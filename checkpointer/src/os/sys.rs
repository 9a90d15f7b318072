//! Thin, checked wrappers over the system calls the checkpointer uses that `libc` exposes only
//! raw. Each returns `io::Result`; nothing here knows about checkpoints.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub type Pid = libc::pid_t;

pub fn cvt(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub fn cvt_i(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Reads remote memory `[addr, addr+buf.len())` of `pid` with `process_vm_readv`, splitting the
/// remote side into page-sized iovecs (1,024 per call) so a partial failure is exact.
pub fn read_remote(pid: Pid, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0usize;
    while done < buf.len() {
        let left = buf.len() - done;
        let local = libc::iovec {
            iov_base: buf[done..].as_mut_ptr().cast(),
            iov_len: left,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut _,
            iov_len: left,
        };
        // SAFETY: `local` covers writable memory we own; the kernel checks the remote side.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return Err(if n == 0 {
                io::Error::from(io::ErrorKind::UnexpectedEof)
            } else {
                io::Error::last_os_error()
            });
        }
        done += n as usize;
    }
    Ok(())
}

/// Reads many remote ranges into consecutive parts of `buf` (`ranges` are (addr, len)),
/// 1,024 remote iovecs per system call.
pub fn read_remote_vectored(pid: Pid, ranges: &[(u64, u64)], buf: &mut [u8]) -> io::Result<()> {
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    assert!(total as usize <= buf.len());
    let mut off = 0usize;
    for chunk in ranges.chunks(1024) {
        let remote: Vec<libc::iovec> = chunk
            .iter()
            .map(|&(a, l)| libc::iovec {
                iov_base: a as *mut _,
                iov_len: l as usize,
            })
            .collect();
        let len: usize = chunk.iter().map(|r| r.1 as usize).sum();
        let local = libc::iovec {
            iov_base: buf[off..].as_mut_ptr().cast(),
            iov_len: len,
        };
        // SAFETY: `local` covers `len` writable bytes of `buf` (checked by the assert above).
        let n = unsafe {
            libc::process_vm_readv(pid, &local, 1, remote.as_ptr(), remote.len() as _, 0)
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != len {
            // A page became unreadable (e.g. PROT_NONE); let the caller fall back.
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        off += len;
    }
    Ok(())
}

pub fn write_remote(pid: Pid, addr: u64, buf: &[u8]) -> io::Result<()> {
    let local = libc::iovec {
        iov_base: buf.as_ptr() as *mut _,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut _,
        iov_len: buf.len(),
    };
    // SAFETY: `local` covers readable memory we own; the kernel checks the remote side.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n as usize != buf.len() {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`; zero if unreadable).
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one valid timespec the kernel writes; the clock id is a constant.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: plain system call; on success the returned descriptor is ours.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether descriptor `fa` of process `pa` and `fb` of `pb` are one open file description
/// (`kcmp(KCMP_FILE)`; needs `PTRACE_MODE_READ` on both). An error, say a descriptor closed
/// meanwhile, counts as not.
pub fn same_description(pa: Pid, fa: i32, pb: Pid, fb: i32) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    kcmp_equal(pa, pb, KCMP_FILE, fa, fb)
}

/// Whether processes `pa` and `pb` share one address space (`kcmp(KCMP_VM)`: a `vfork` child
/// before its `execve`, or a `clone(CLONE_VM)` without `CLONE_THREAD`). An error counts as not.
pub fn same_mm(pa: Pid, pb: Pid) -> bool {
    const KCMP_VM: libc::c_long = 1;
    kcmp_equal(pa, pb, KCMP_VM, 0, 0)
}

/// `kcmp(pa, pb, kind, a, b) == 0`: the two kernel objects are one.
fn kcmp_equal(pa: Pid, pb: Pid, kind: libc::c_long, a: i32, b: i32) -> bool {
    // SAFETY: kcmp only compares kernel objects; no memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pa as libc::c_long,
            pb as libc::c_long,
            kind,
            a as libc::c_long,
            b as libc::c_long,
        )
    };
    r == 0
}

/// Duplicates descriptor `fd` of the process behind `pidfd` into this process.
pub fn pidfd_getfd(pidfd: &OwnedFd, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain system call; on success the returned descriptor is ours.
    let r = cvt(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) })?;
    // SAFETY: `r` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// `pipe2(flags)`: `(read, write)`.
pub fn pipe(flags: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut p = [0; 2];
    // SAFETY: `p` has room for two descriptors.
    cvt_i(unsafe { libc::pipe2(p.as_mut_ptr(), flags) })?;
    // SAFETY: both are fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) })
}

/// The bytes of a plain-data value (a `repr(C)` plan type, a sockaddr).
pub fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: `T` is plain data; we only read its `size_of::<T>()` bytes.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

pub fn memfd(name: &str) -> io::Result<OwnedFd> {
    let name = CString::new(name).unwrap();
    // SAFETY: `name` is a valid C string; on success the descriptor is ours.
    let fd = cvt_i(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for the kernel to write an int option.
    cvt_i(unsafe { libc::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) })?;
    Ok(v)
}

pub fn setsockopt_int(fd: RawFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: passes a pointer to a live int and its size.
    cvt_i(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const v).cast(),
            std::mem::size_of::<i32>() as _,
        )
    })?;
    Ok(())
}

/// getsockname/getpeername as raw sockaddr bytes (empty when there is none).
pub fn sock_addr(fd: RawFd, peer: bool) -> io::Result<Vec<u8>> {
    // SAFETY: sockaddr_storage is plain data; zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `ss`/`len` describe a writable buffer large enough for any address.
    let r = unsafe {
        if peer {
            libc::getpeername(fd, (&raw mut ss).cast(), &mut len)
        } else {
            libc::getsockname(fd, (&raw mut ss).cast(), &mut len)
        }
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOTCONN) {
            Ok(Vec::new())
        } else {
            Err(e)
        };
    }
    // SAFETY: the kernel wrote `len` bytes into `ss`.
    let bytes = unsafe { std::slice::from_raw_parts((&raw const ss).cast::<u8>(), len as usize) };
    Ok(bytes.to_vec())
}
