//! The lab's cgroups: `<cgroup2 mount>/tardi-lab/<node>`, one per node. A process started in a
//! node joins its cgroup before it execs, so every descendant (the sandboxes an instance creates
//! too) is in it, and `cgroup.kill` stops them all at once, as a power cut would.
//!
//! The cgroup2 mount is found in `/proc/mounts` (`/sys/fs/cgroup` on a unified host,
//! `/sys/fs/cgroup/unified` on a hybrid one). Without cgroup2, or on a kernel without
//! `cgroup.kill` (before 5.14), callers fall back to [`crate::procs::kill_tree`].

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{IoContext, LabError, Result};
use crate::layout::CGROUP_NAME;

/// The first cgroup2 mount point listed in `/proc/mounts`.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    parse_cgroup2_mount(&mounts)
}

fn parse_cgroup2_mount(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(unescape_mount_path(dir)))
    })
}

/// `/proc/mounts` writes space, tab, newline and backslash in paths as `\ooo` octal escapes.
fn unescape_mount_path(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = (b[i] == b'\\' && i + 3 < b.len())
            .then(|| &b[i + 1..i + 4])
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                u8::try_from(v).ok()
            });
        if let Some(v) = octal {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The lab's cgroup directory (`<mount>/tardi-lab`), whether or not it exists.
pub fn lab_cgroup() -> Option<PathBuf> {
    cgroup2_mount().map(|m| m.join(CGROUP_NAME))
}

/// Creates the lab's cgroup and one child per node; returns the lab's cgroup, or `None` (with a
/// warning) when there is no usable cgroup2, in which case the lab kills by walking `/proc`.
pub(crate) fn create(nodes: &[&str]) -> Result<Option<PathBuf>> {
    let Some(root) = lab_cgroup() else {
        tracing::warn!("no cgroup2 mount: killing a node will walk /proc instead");
        return Ok(None);
    };
    if let Err(e) = std::fs::create_dir(&root)
        && e.kind() != io::ErrorKind::AlreadyExists
    {
        tracing::warn!(
            "cannot create {}: {e}; killing a node will walk /proc instead",
            root.display()
        );
        return Ok(None);
    }
    for n in nodes {
        let dir = root.join(n);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(LabError::io(format!("creating {}", dir.display()), e)),
        }
    }
    Ok(Some(root))
}

/// Opens `<cgroup>/cgroup.procs` for a child to join with [`join_fd`] in `pre_exec`, where
/// opening a file is not allowed. `None` when the cgroup does not exist.
pub(crate) fn open_procs(cgroup: &Path) -> Result<Option<File>> {
    let p = cgroup.join("cgroup.procs");
    match OpenOptions::new().write(true).open(&p) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LabError::io(format!("opening {}", p.display()), e)),
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is open as `fd` (writes "0",
/// meaning "the writer"). Async-signal-safe: meant for `pre_exec`.
pub(crate) fn join_fd(fd: i32) -> io::Result<()> {
    // SAFETY: write(2) from a valid two-byte buffer to a descriptor the caller keeps open.
    let n = unsafe { libc::write(fd, b"0\n".as_ptr().cast(), 2) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether the kernel offers `cgroup.kill` in `cgroup`.
pub(crate) fn can_kill(cgroup: &Path) -> bool {
    cgroup.join("cgroup.kill").exists()
}

/// Whether `cgroup` or a descendant still holds a process (`populated` in `cgroup.events`).
pub(crate) fn populated(cgroup: &Path) -> bool {
    std::fs::read_to_string(cgroup.join("cgroup.events"))
        .map(|s| s.lines().any(|l| l.trim() == "populated 1"))
        .unwrap_or(false)
}

/// SIGKILLs every process in `cgroup` and its descendants (`cgroup.kill`) and waits up to
/// `timeout` for them to be gone. Returns `false` when the kernel has no `cgroup.kill` (the
/// caller must then walk `/proc`). A cgroup that does not exist is empty: `true`.
pub(crate) fn kill(cgroup: &Path, timeout: Duration) -> Result<bool> {
    if !cgroup.exists() {
        return Ok(true);
    }
    if !can_kill(cgroup) {
        return Ok(false);
    }
    let p = cgroup.join("cgroup.kill");
    OpenOptions::new()
        .write(true)
        .open(&p)
        .and_then(|mut f| f.write_all(b"1"))
        .ctx(|| format!("writing 1 to {}", p.display()))?;
    let deadline = Instant::now() + timeout;
    while populated(cgroup) {
        if Instant::now() >= deadline {
            tracing::warn!("{} still populated after {timeout:?}", cgroup.display());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(true)
}

/// The pids in `cgroup` itself (not its descendants).
pub fn pids(cgroup: &Path) -> Vec<u32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Removes `cgroup` and its descendants, deepest first; one that is gone already is fine.
pub(crate) fn remove(cgroup: &Path) -> Result<()> {
    let rd = match std::fs::read_dir(cgroup) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LabError::io(format!("listing {}", cgroup.display()), e)),
    };
    for entry in rd.filter_map(|e| e.ok()) {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove(&entry.path())?;
        }
    }
    match std::fs::remove_dir(cgroup) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LabError::io(
            format!("removing cgroup {}", cgroup.display()),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount() {
        let hybrid = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
                      cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        assert_eq!(
            parse_cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        assert_eq!(
            parse_cgroup2_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(parse_cgroup2_mount("cgroup /x cgroup rw 0 0\n"), None);
        assert_eq!(parse_cgroup2_mount(""), None);
        assert_eq!(
            parse_cgroup2_mount("none /my\\040cg cgroup2 rw 0 0"),
            Some(PathBuf::from("/my cg"))
        );
    }

    #[test]
    fn unescape_leaves_bad_escapes_alone() {
        assert_eq!(unescape_mount_path("a\\04"), "a\\04");
        assert_eq!(unescape_mount_path("a\\134b"), "a\\b");
        assert_eq!(unescape_mount_path("\\"), "\\");
        assert_eq!(unescape_mount_path("\\777x"), "\\777x");
    }
}
