//! Paths as the sandboxed process sees them.
//!
//! The kernel prints paths (`/proc/PID/maps`, `/proc/PID/fd/N` links, `exe`, `cwd`) relative to
//! the *reader's* root. Read from the host, a process in another mount namespace shows paths that
//! are meaningless or wrong (a bind-mounted `/dev/null` reads as `/null`). So these reads happen
//! in a short-lived thread that unshares its filesystem attributes and chroots into the target's
//! root (`/proc/PID/root`), reaching the host's `/proc/PID` through a descriptor opened before.

use crate::sys::Pid;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// What the process's own view gives: smaps text, descriptor links, exe and cwd.
#[derive(Debug, Default)]
pub struct View {
    pub smaps: String,
    pub fd_links: Vec<(i32, String)>,
    pub exe: String,
    pub cwd: String,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn readlinkat(dir: RawFd, name: &str) -> io::Result<String> {
    let c = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is writable for its length; `c` is a valid C string.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn openat(dir: RawFd, name: &str, flags: i32) -> io::Result<OwnedFd> {
    let c = CString::new(name).unwrap();
    // SAFETY: valid C string; on success the descriptor is ours.
    let fd = cvt(unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads the view of process `pid` (host PID).
pub fn read(pid: Pid) -> io::Result<View> {
    let dir = openat(
        libc::AT_FDCWD,
        &format!("/proc/{pid}"),
        libc::O_PATH | libc::O_DIRECTORY,
    )?;
    let root = format!("/proc/{pid}/root");
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<View> {
            // SAFETY: unshare(CLONE_FS) affects only this thread's fs attributes (root, cwd),
            // which no other thread shares afterwards; chroot needs CAP_SYS_CHROOT (we are root).
            unsafe {
                cvt(libc::unshare(libc::CLONE_FS))?;
                let r = CString::new(root.as_str()).unwrap();
                cvt(libc::chroot(r.as_ptr()))?;
                cvt(libc::chdir(c"/".as_ptr()))?;
            }
            let d = dir.as_raw_fd();
            let mut view = View::default();
            let smaps = openat(d, "smaps", libc::O_RDONLY)?;
            io::Read::read_to_string(&mut std::fs::File::from(smaps), &mut view.smaps)?;
            view.exe = readlinkat(d, "exe")?;
            view.cwd = readlinkat(d, "cwd")?;
            let fddir = openat(d, "fd", libc::O_RDONLY | libc::O_DIRECTORY)?;
            for fd in list_dir_fd(&fddir)? {
                if let Ok(l) = readlinkat(fddir.as_raw_fd(), &fd.to_string()) {
                    view.fd_links.push((fd, l));
                }
            }
            view.fd_links.sort_unstable_by_key(|x| x.0);
            Ok(view)
        })
        .join()
        .map_err(|_| io::Error::other("view thread panicked"))?
    })
}

/// Lists a directory given as a descriptor (getdents64): inside the chroot no host path works.
fn list_dir_fd(dir: &OwnedFd) -> io::Result<Vec<i32>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(out);
        }
        let mut off = 0usize;
        while off < n as usize {
            let reclen = u16::from_le_bytes([buf[off + 16], buf[off + 17]]) as usize;
            let name = &buf[off + 19..off + reclen];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Ok(fd) = std::str::from_utf8(name).unwrap_or("").parse() {
                out.push(fd);
            }
            off += reclen;
        }
    }
}
