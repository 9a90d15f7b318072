//! One-shot full checkpoints of a running service (what `tardi snapshot` writes).

use crate::{Error, Result, ServiceHandle};
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use tardi_checkpointer::{CaptureStats, Checkpoint};

/// A one-shot full checkpoint (epoch 0) of a running service, with its sandbox description
/// attached (`image.sandbox`: its configuration as JSON, `link_index` pinned, so that a restore
/// gets the same name and addresses). The service is paused only while its state is captured.
/// Refused, before pausing, if the sandbox runs other processes besides the service
/// ([`ServiceHandle::other_processes`]). Takes a [`ServiceHandle`] so that another thread can
/// checkpoint while the owner watches the [`crate::Service`]; one checkpoint of a process at a
/// time (a process has one tracer): callers serialize.
pub fn snapshot(svc: &ServiceHandle) -> Result<(Checkpoint, CaptureStats)> {
    alone(svc)?;
    let (mut ck, stats) =
        tardi_checkpointer::checkpoint(svc.pid(), 0, &svc.private_dirs()).map_err(capture(svc))?;
    ck.image.sandbox = serde_json::to_vec(svc.config()).map_err(Error::Describe)?;
    Ok((ck, stats))
}

/// [`snapshot`] written atomically to `path` (a temporary file next to it, synced, renamed: no
/// partial file on failure). The directory is checked before the service is paused. Returns
/// the file's size and the capture's statistics.
pub fn snapshot_to_file(svc: &ServiceHandle, path: &Path) -> Result<(u64, CaptureStats)> {
    let partial = Partial::create(path)?;
    let (ck, stats) = snapshot(svc)?;
    let bytes = partial.commit(&ck)?;
    Ok((bytes, stats))
}

/// [`snapshot_to_file`] that carries the service's TCP connections and ends the service
/// (`tardi snapshot --stop`): the file is written while the service is stopped; once it is
/// safely on disk, the connections are silenced and the service's processes killed, so that
/// `tardi restore` of the file carries the connections on and their clients see a pause. If
/// the file cannot be written, the service goes on untouched. The caller holds the packets to
/// the sandbox meanwhile (see [`tardi_checkpointer::checkpoint_and_end`]) and tears the sandbox
/// down after.
pub fn snapshot_to_file_and_end(svc: &ServiceHandle, path: &Path) -> Result<(u64, CaptureStats)> {
    alone(svc)?;
    let sandbox = serde_json::to_vec(svc.config()).map_err(Error::Describe)?;
    // Opened here: the handover runs in the sandbox's view of the file system, where only
    // descriptors reach this one.
    let mut partial = Some(Partial::create(path)?);
    let mut bytes = 0;
    let mut handover = |ck: &mut Checkpoint| {
        ck.image.sandbox = sandbox.clone();
        let p = partial
            .take()
            .ok_or("the checkpoint was handed over twice")?;
        p.commit(ck).map(|n| bytes = n).map_err(|e| e.to_string())
    };
    let (_, stats) =
        tardi_checkpointer::checkpoint_and_end(svc.pid(), &svc.private_dirs(), &mut handover)
            .map_err(capture(svc))?;
    Ok((bytes, stats))
}

/// Refuses, before anything is paused, a sandbox that runs other processes besides the service.
fn alone(svc: &ServiceHandle) -> Result<()> {
    let others = svc.other_processes();
    if others.is_empty() {
        return Ok(());
    }
    Err(Error::OtherProcesses {
        name: svc.name().to_string(),
        pids: others,
    })
}

/// The error of a capture of `svc`.
fn capture(svc: &ServiceHandle) -> impl FnOnce(tardi_checkpointer::CaptureError) -> Error {
    let name = svc.name().to_string();
    move |source| Error::Capture { name, source }
}

/// A checkpoint file being written: a temporary file next to its final name, made through
/// descriptors of the directory and the file so that it can be finished from a thread that
/// sees another file system (the sandbox's). Dropped unfinished, the temporary file goes.
struct Partial {
    path: PathBuf,
    dir: std::fs::File,
    tmp: CString,
    name: CString,
    file: Option<std::fs::File>,
}

impl Partial {
    /// Checks the directory and creates the temporary file (before anything is paused).
    fn create(path: &Path) -> Result<Partial> {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let no_dir = || Error::NoDirectory {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        };
        if !dir.is_dir() {
            return Err(no_dir());
        }
        let name = path.file_name().ok_or_else(no_dir)?;
        let tmp = format!(".{}.partial", name.to_str().unwrap_or("tardi"));
        let cstr = |s: &[u8]| {
            CString::new(s).map_err(|e| Error::Create {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            })
        };
        let file = std::fs::File::create(dir.join(&tmp)).map_err(|source| Error::Create {
            path: dir.join(&tmp),
            source,
        })?;
        Ok(Partial {
            path: path.to_path_buf(),
            dir: std::fs::File::open(dir).map_err(|source| Error::Create {
                path: dir.to_path_buf(),
                source,
            })?,
            tmp: cstr(tmp.as_bytes())?,
            name: cstr(name.as_bytes())?,
            file: Some(file),
        })
    }

    /// Writes `ck`, syncs it and renames it into place; returns its size.
    fn commit(mut self, ck: &Checkpoint) -> Result<u64> {
        let f = self.file.take().expect("committed once");
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let n = ck.write_to(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        let d = self.dir.as_raw_fd();
        // SAFETY: both names are NUL-terminated C strings alive for the call; `d` is our
        // open directory.
        if unsafe { libc::renameat(d, self.tmp.as_ptr(), d, self.name.as_ptr()) } != 0 {
            return Err(Error::Rename {
                path: self.path.clone(),
                source: std::io::Error::last_os_error(),
            });
        }
        // The rename is done: nothing for `drop` to remove.
        self.tmp = CString::default();
        Ok(n)
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.tmp.is_empty() {
            // SAFETY: a NUL-terminated name in our open directory.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.tmp.as_ptr(), 0) };
        }
    }
}
