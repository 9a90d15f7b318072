//! One-shot full checkpoints of a running service (what `tardi snapshot` writes).

use crate::{Error, Result, ServiceHandle};
use std::path::Path;
use tardi_checkpointer::{CaptureStats, Checkpoint};

/// A one-shot full checkpoint (epoch 0) of a running service, with its sandbox description
/// attached (`image.sandbox`: its configuration as JSON, `link_index` pinned, so that a restore
/// gets the same name and addresses). The service is paused only while its state is captured.
/// Refused, before pausing, if the sandbox runs other processes besides the service
/// ([`ServiceHandle::other_processes`]). Takes a [`ServiceHandle`] so that another thread can
/// checkpoint while the owner watches the [`crate::Service`]; one checkpoint of a process at a
/// time (a process has one tracer): callers serialize.
pub fn snapshot(svc: &ServiceHandle) -> Result<(Checkpoint, CaptureStats)> {
    let others = svc.other_processes();
    if !others.is_empty() {
        return Err(Error::OtherProcesses {
            name: svc.name().to_string(),
            pids: others,
        });
    }
    let (mut ck, stats) = tardi_checkpointer::checkpoint(svc.pid(), 0, &svc.private_dirs())
        .map_err(|source| Error::Capture {
            name: svc.name().to_string(),
            source,
        })?;
    ck.image.sandbox = serde_json::to_vec(svc.config()).map_err(Error::Describe)?;
    Ok((ck, stats))
}

/// [`snapshot`] written atomically to `path` (a temporary file next to it, synced, renamed: no
/// partial file on failure). The directory is checked before the service is paused. Returns
/// the file's size and the capture's statistics.
pub fn snapshot_to_file(svc: &ServiceHandle, path: &Path) -> Result<(u64, CaptureStats)> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(Error::NoDirectory {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    let (ck, stats) = snapshot(svc)?;
    let tmp = dir.join(format!(
        ".{}.partial",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("tardi")
    ));
    let write = || -> Result<u64> {
        let f = std::fs::File::create(&tmp).map_err(|source| Error::Create {
            path: tmp.clone(),
            source,
        })?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let n = ck.write_to(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path).map_err(|source| Error::Rename {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(n)
    };
    let bytes = write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok((bytes, stats))
}
