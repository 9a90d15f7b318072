//! The crate's error type. Each message is what a user reads: it says what was being done, to
//! which file or sandbox, and why it failed; it quotes its source, so printing the message alone
//! (without walking [`std::error::Error::source`]) loses nothing.

use std::path::PathBuf;
use tardi_checkpointer::restore::RestoreError;
use tardi_checkpointer::{CaptureError, FormatError};
use tardi_manifest::ManifestError;
use tardi_sandbox::SandboxError;

/// What can go wrong starting, restoring, checkpointing or stopping a service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The manifest cannot be loaded (its message names the file, line and key).
    #[error(transparent)]
    Manifest(#[from] ManifestError),

    /// A checkpoint file cannot be read, or is not a valid checkpoint (truncated, corrupted,
    /// another format version). Nothing was started.
    #[error("{} cannot be restored: {source}", path.display())]
    Open { path: PathBuf, source: FormatError },

    /// A checkpoint file holds an incremental checkpoint. Nothing was started.
    #[error("{} is an incremental checkpoint: restore needs a full one", path.display())]
    IncrementalFile { path: PathBuf },

    /// An in-memory checkpoint is incremental. Nothing was started.
    #[error(
        "cannot restore: the checkpoint of epoch {epoch} is incremental (restore needs a full one: \
         apply it to an image and take the image's full checkpoint); nothing was started"
    )]
    Incremental { epoch: u64 },

    /// A checkpoint file without the sandbox description `tardi snapshot` attaches, and no
    /// configuration was given. Nothing was started.
    #[error("{} has no sandbox description (not written by `tardi snapshot`)", path.display())]
    NoSandboxDescription { path: PathBuf },

    /// The sandbox description inside a checkpoint does not parse. Nothing was started.
    #[error("the checkpoint's sandbox description is malformed: {0}")]
    SandboxDescription(#[source] serde_json::Error),

    /// The sandbox description could not be encoded for a checkpoint.
    #[error("describing the sandbox for the checkpoint: {0}")]
    Describe(#[source] serde_json::Error),

    /// The checkpoint cannot be restored on this machine (a mapped file is missing or differs,
    /// ...). `what` names the checkpoint (a file's path). Nothing was started.
    #[error("{what} cannot be restored here; nothing was started: {source}")]
    Prepare { what: String, source: RestoreError },

    /// The sandbox could not be created (already running, no free link, ...). Nothing is left
    /// running.
    #[error("starting sandbox {name:?}: {source}")]
    Start { name: String, source: SandboxError },

    /// The caller stopped a restore once the sandbox was set up, before the restored process
    /// ran (see `Service::restore_image`). The sandbox was removed.
    #[error(
        "restoring sandbox {name:?} was stopped before the process ran: {why}; nothing is left running"
    )]
    Aborted { name: String, why: String },

    /// The sandbox started but its service's main process was already gone. The sandbox was
    /// torn down.
    #[error("{0}")]
    NoProcess(&'static str),

    /// The restored process failed to come back (the restorer failed, timed out, or the service
    /// died at once). The sandbox was torn down; its log (kept) may say more.
    #[error("restore failed (sandbox log: {}): {source}", log.display())]
    Restore { log: PathBuf, source: RestoreError },

    /// A checkpoint's destination directory does not exist (checked before pausing the
    /// service).
    #[error("cannot write {}: directory {} does not exist", path.display(), dir.display())]
    NoDirectory { path: PathBuf, dir: PathBuf },

    /// The sandbox runs other processes besides the service: a checkpoint would lose them
    /// (process trees are not supported yet). The service was not paused.
    #[error(
        "checkpointing sandbox {name:?}: cannot checkpoint: the sandbox runs other processes \
         besides the service (host PIDs {}); process trees are not supported yet",
        pids.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
    )]
    OtherProcesses { name: String, pids: Vec<i32> },

    /// The checkpoint failed (something in the process cannot be captured faithfully, or the
    /// process went away). The service runs on, untraced.
    #[error("checkpointing sandbox {name:?}: {source}")]
    Capture { name: String, source: CaptureError },

    /// Creating a checkpoint's temporary file failed.
    #[error("creating {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },

    /// Moving a written checkpoint into place failed.
    #[error("renaming to {}: {source}", path.display())]
    Rename {
        path: PathBuf,
        source: std::io::Error,
    },

    /// Writing or syncing a checkpoint file failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),

    /// Watching or tearing down the sandbox failed.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
