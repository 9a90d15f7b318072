//! Named network namespaces (`ip netns`): creating, listing, deleting, and running code inside
//! one on a thread of our own.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use crate::cmd;
use crate::error::{IoContext, LabError, Result};
use crate::layout::NS_PREFIX;

/// Where `ip netns` keeps its bind-mounted namespace files.
pub const NETNS_DIR: &str = "/run/netns";

/// The file naming namespace `ns`.
pub fn path(ns: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(ns)
}

/// Whether the named namespace exists.
pub fn exists(ns: &str) -> bool {
    path(ns).exists()
}

/// Creates the named namespace (`ip netns add`).
pub(crate) fn create(ns: &str) -> Result<()> {
    cmd::ip(["netns", "add", ns]).map(drop)
}

/// Deletes the named namespace (`ip netns del`); a namespace already gone is not an error.
pub(crate) fn delete(ns: &str) -> Result<()> {
    match cmd::ip(["netns", "del", ns]) {
        Ok(_) => Ok(()),
        Err(e) if cmd::is_gone(&e) || !exists(ns) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Every namespace whose name starts with [`NS_PREFIX`], sorted.
pub fn lab_namespaces() -> Result<Vec<String>> {
    let rd = match std::fs::read_dir(NETNS_DIR) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LabError::io(format!("listing {NETNS_DIR}"), e)),
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(NS_PREFIX))
        .collect();
    names.sort();
    Ok(names)
}

/// The inode identifying the named namespace (as `/proc/<pid>/ns/net` shows it), if it exists.
pub(crate) fn inode(ns: &str) -> Option<u64> {
    std::fs::metadata(path(ns)).ok().map(|m| m.ino())
}

/// Opens the named namespace's file (close-on-exec).
pub(crate) fn open(ns: &str) -> Result<File> {
    let p = path(ns);
    File::open(&p).ctx(|| format!("opening network namespace {}", p.display()))
}

/// Runs `f` on a new thread that has entered network namespace `ns`, and returns its result.
///
/// Only that thread changes namespace, so the caller's other threads are unaffected. Sockets
/// created in `f` stay in `ns` for their whole life, whichever thread uses them later. A panic in
/// `f` is resumed on the caller's thread (so assertions in tests work as usual).
pub fn in_namespace<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    let file = open(ns)?;
    let joined = std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: setns on a valid open descriptor of a network namespace; it only changes this
            // thread's namespace (no memory is involved).
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(LabError::io(
                    format!("entering network namespace {ns}"),
                    io::Error::last_os_error(),
                ));
            }
            drop(file);
            Ok(f())
        })
        .join()
    });
    match joined {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
