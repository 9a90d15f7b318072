//! inotify descriptors: their watches, found again at restore with the same watch descriptors.
//!
//! Capture: `fdinfo` lists each watch as `inotify wd:W ino:I sdev:D mask:M ignored_mask:0
//! fhandle-bytes:N fhandle-type:T f_handle:H` (all hexadecimal; `sdev` is the kernel's
//! encoding of the device, major << 20 | minor). A watch pins an inode, not a path: the path
//! is found by opening the file handle (`open_by_handle_at`, through a mount of that file
//! system in the sandbox, from its `mountinfo`) and reading the link of the descriptor got,
//! then checked with `stat` (device and inode must match). A path found once is kept while
//! `stat` still agrees (a watched file renamed is found again). The event queue must be
//! empty (`FIONREAD` on a duplicate of the descriptor): queued events cannot be put back, so a
//! capture that finds some fails with [`CaptureError::QueuedEvents`], which checkpoints retry
//! after letting the service run (it reads them); refused if they stay.
//!
//! Refused by name: a watch whose file is deleted (unlinked but still open somewhere: the
//! watch lives on, the path does not) or that no mount in the sandbox reaches.
//!
//! Restore: a new instance with the same flags; each watch, in increasing `wd`, is added on
//! its path with `INOTIFY_IOC_SETNEXTWD` set to its `wd` first (the kernel allocates watch
//! descriptors cyclically from there; the ioctl needs `CONFIG_CHECKPOINT_RESTORE`) and
//! `IN_DONT_FOLLOW` (the path names the watched inode itself). A watched path missing at
//! restore fails the restore, naming it. Not kept: where the kernel's cursor was after the
//! highest live watch (a new watch after the restore gets the next number after the highest
//! live one, possibly lower than it would have been).

use crate::image::{FdKind, InotifyWatch};
use crate::os::error::CaptureError;
use crate::procfs::Proc;
use crate::sys::{self, cvt_i as check};
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

type Result<T> = std::result::Result<T, CaptureError>;

/// Paths found for watched inodes, by (device as `stat` gives it, inode).
pub type PathCache = HashMap<(u64, u64), String>;

fn unsupported(fd: i32, what: impl std::fmt::Display) -> CaptureError {
    CaptureError::Unsupported(format!("file descriptor {fd} (inotify): {what}"))
}

/// One `inotify` line of `fdinfo`.
#[derive(Debug, PartialEq, Eq)]
struct Mark {
    wd: i32,
    ino: u64,
    /// `st_dev` encoding of the device.
    dev: u64,
    mask: u32,
    handle_type: i32,
    handle: Vec<u8>,
}

fn parse(line: &str) -> Option<Mark> {
    let rest = line.strip_prefix("inotify ")?;
    let field = |k: &str| {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(k).and_then(|v| v.strip_prefix(':')))
    };
    let hex = |k: &str| field(k).and_then(|v| u64::from_str_radix(v, 16).ok());
    let sdev = hex("sdev")?;
    let handle_hex = field("f_handle")?;
    let handle = (0..handle_hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(handle_hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    if hex("fhandle-bytes")? != handle.len() as u64 {
        return None;
    }
    Some(Mark {
        wd: i32::try_from(hex("wd")?).ok()?,
        ino: hex("ino")?,
        dev: libc::makedev((sdev >> 20) as u32, (sdev & 0xf_ffff) as u32),
        mask: u32::try_from(hex("mask")?).ok()?,
        handle_type: hex("fhandle-type")? as i32,
        handle,
    })
}

/// Captures inotify descriptor `fd` of the stopped process (inside [`crate::procfs::in_view`]:
/// paths come out as the service sees them). `raw` is its `fdinfo` text.
pub fn capture(
    proc: &Proc,
    pidfd: &OwnedFd,
    fd: i32,
    raw: &str,
    paths: &mut PathCache,
) -> Result<FdKind> {
    let pid = proc.pid;
    let dup = sys::pidfd_getfd(pidfd, fd).map_err(|source| CaptureError::Proc {
        pid,
        what: format!("inotify fd {fd}"),
        source,
    })?;
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    if unsafe { libc::ioctl(dup.as_raw_fd(), libc::FIONREAD, &mut queued) } == 0 && queued > 0 {
        return Err(CaptureError::QueuedEvents(format!(
            "inotify descriptor {fd} has {queued} bytes of events queued"
        )));
    }
    let mut watches = Vec::new();
    for line in raw.lines().filter(|l| l.starts_with("inotify ")) {
        let m = parse(line).ok_or_else(|| unsupported(fd, format!("unparsable {line:?}")))?;
        let key = (m.dev, m.ino);
        let path = match paths.get(&key).filter(|p| same_inode(p, key)) {
            Some(p) => p.clone(),
            None => resolve(proc, &m)
                .map_err(|why| unsupported(fd, format!("watch {}: {why}", m.wd)))?,
        };
        paths.insert(key, path.clone());
        watches.push(InotifyWatch {
            wd: m.wd,
            mask: m.mask,
            path,
        });
    }
    watches.sort_by_key(|w| w.wd);
    Ok(FdKind::Inotify { watches })
}

/// `path` (as the service sees it) names the inode `(dev, ino)`.
fn same_inode(path: &str, (dev, ino): (u64, u64)) -> bool {
    let Ok(c) = CString::new(path) else {
        return false;
    };
    // SAFETY: `st` is plain data the kernel fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    (unsafe { libc::stat(c.as_ptr(), &mut st) }) == 0 && st.st_dev == dev && st.st_ino == ino
}

/// A path to the watched inode, from its file handle.
fn resolve(proc: &Proc, m: &Mark) -> std::result::Result<String, String> {
    let mountinfo = proc
        .read_string("mountinfo")
        .map_err(|e| format!("mountinfo: {e}"))?;
    let want = format!("{}:{}", libc::major(m.dev), libc::minor(m.dev));
    // Our own descriptors' links, through the host's /proc (the parent of the process's
    // /proc/PID): the sandbox's /proc, where we are chroot'ed, does not know us.
    let host_proc = proc
        .open_file("..", libc::O_PATH | libc::O_DIRECTORY)
        .map_err(|e| format!("/proc: {e}"))?;
    let mut tried = 0;
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNT-POINT ...
        let f: Vec<&str> = line.split(' ').collect();
        if f.get(2) != Some(&want.as_str()) {
            continue;
        }
        let Some(mount_point) = f.get(4).map(|p| unescape(p)) else {
            continue;
        };
        tried += 1;
        let Ok(c) = CString::new(mount_point) else {
            continue;
        };
        // Not O_PATH: open_by_handle_at refuses an O_PATH mount descriptor (EBADF).
        // SAFETY: valid C string; a fresh descriptor on success.
        let mfd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if mfd < 0 {
            continue;
        }
        // SAFETY: a descriptor we just opened and own.
        let mfd = unsafe { OwnedFd::from_raw_fd(mfd) };
        // Only a mount of the right file system may decode the handle (an inode number of
        // another one would name something else).
        if fstat(mfd.as_raw_fd()).is_none_or(|st| st.st_dev != m.dev) {
            continue;
        }
        let Some(file) = open_handle(mfd.as_raw_fd(), m) else {
            continue;
        };
        if fstat(file.as_raw_fd()).is_none_or(|st| st.st_dev != m.dev || st.st_ino != m.ino) {
            continue;
        }
        let link = read_link_at(
            host_proc.as_raw_fd(),
            &format!("thread-self/fd/{}", file.as_raw_fd()),
        )
        .map_err(|e| format!("reading the path of the watched inode: {e}"))?;
        if link.ends_with(" (deleted)") {
            return Err(format!(
                "the watched file {link} is deleted (still open elsewhere); a watch on a \
                 deleted file is not supported"
            ));
        }
        if same_inode(&link, (m.dev, m.ino)) {
            return Ok(link);
        }
    }
    Err(format!(
        "no path in the sandbox reaches the watched inode {} of device {want} ({tried} mounts of \
         it tried)",
        m.ino
    ))
}

fn fstat(fd: RawFd) -> Option<libc::stat> {
    // SAFETY: `st` is plain data the kernel fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out-pointer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// `open_by_handle_at(mount_fd, handle, O_PATH)` (needs `CAP_DAC_READ_SEARCH`).
fn open_handle(mount_fd: RawFd, m: &Mark) -> Option<OwnedFd> {
    // struct file_handle { u32 handle_bytes; i32 handle_type; u8 f_handle[]; }
    let mut buf = Vec::with_capacity(8 + m.handle.len());
    buf.extend_from_slice(&(m.handle.len() as u32).to_ne_bytes());
    buf.extend_from_slice(&m.handle_type.to_ne_bytes());
    buf.extend_from_slice(&m.handle);
    // The kernel reads the header as 4-byte words: keep them aligned.
    let words: Vec<u32> = buf
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_ne_bytes(w)
        })
        .collect();
    // SAFETY: `words` holds a complete struct file_handle (header + `handle_bytes` bytes),
    // which the kernel only reads.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd,
            words.as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    // SAFETY: a fresh descriptor on success.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn read_link_at(dir: RawFd, rel: &str) -> io::Result<String> {
    let c = CString::new(rel).map_err(io::Error::other)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is writable for its length; `c` is a valid C string.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// `mountinfo` escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if b[i] == b'\\'
            && let Some(d) = octal
        {
            out.push(
                d.iter()
                    .fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')),
            );
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `INOTIFY_IOC_SETNEXTWD`: `_IOW('I', 0, __s32)`.
const INOTIFY_IOC_SETNEXTWD: libc::c_ulong = 0x4004_4900;
const IN_DONT_FOLLOW: u32 = 0x0200_0000;

/// Makes an inotify instance (status flags `flags`) again, with its watches
/// at their watch descriptors. Runs in the restore child, inside the sandbox.
pub fn recreate(flags: i32, watches: &[InotifyWatch]) -> io::Result<RawFd> {
    let fl = libc::IN_CLOEXEC | (flags & libc::O_NONBLOCK);
    // SAFETY: plain inotify creation.
    let tmp = check(unsafe { libc::inotify_init1(fl) })?;
    // SAFETY: a fresh descriptor we own (closed on error).
    let owned = unsafe { OwnedFd::from_raw_fd(tmp) };
    let mut sorted: Vec<&InotifyWatch> = watches.iter().collect();
    sorted.sort_by_key(|w| w.wd);
    for w in sorted {
        let err = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("inotify watch {} on {}: {e}", w.wd, w.path),
            )
        };
        // The next descriptor the kernel allocates is this watch's.
        // SAFETY: the ioctl takes the number by value.
        check(unsafe { libc::ioctl(tmp, INOTIFY_IOC_SETNEXTWD, w.wd as libc::c_ulong) })
            .map_err(err)?;
        let c = CString::new(w.path.as_str()).map_err(|e| err(io::Error::other(e)))?;
        // SAFETY: valid C string; the mask is the watch's own (no IN_MASK_ADD/CREATE: those
        // are not kept by the kernel).
        let got =
            check(unsafe { libc::inotify_add_watch(tmp, c.as_ptr(), w.mask | IN_DONT_FOLLOW) })
                .map_err(err)?;
        if got != w.wd {
            return Err(err(io::Error::other(format!(
                "the kernel gave watch descriptor {got} (the inode is watched twice?)"
            ))));
        }
    }
    Ok(std::os::fd::IntoRawFd::into_raw_fd(owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fdinfo_marks() {
        // As Linux 6.18 prints them.
        let m = parse(
            "inotify wd:1a ino:3 sdev:1b mask:80000002 ignored_mask:0 fhandle-bytes:c \
             fhandle-type:1 f_handle:fe8e06020300000000000000",
        )
        .unwrap();
        assert_eq!(
            (m.wd, m.ino, m.mask, m.handle_type),
            (26, 3, 0x8000_0002, 1)
        );
        assert_eq!(m.dev, libc::makedev(0, 27));
        assert_eq!(m.handle.len(), 12);
        assert_eq!(m.handle[0], 0xfe);
        let disk = parse(
            "inotify wd:4 ino:263 sdev:fe00000 mask:1 ignored_mask:0 fhandle-bytes:8 \
             fhandle-type:1 f_handle:6302000000000000",
        )
        .unwrap();
        assert_eq!(disk.dev, libc::makedev(254, 0));
        // The handle's length disagrees with its bytes.
        assert!(
            parse("inotify wd:1 ino:3 sdev:1b mask:2 fhandle-bytes:4 fhandle-type:1 f_handle:00")
                .is_none()
        );
        assert_eq!(unescape("/a\\040b"), "/a b");
    }
}
