//! The checkpointer's error: what stops a capture (and, through it, a pause of the epoch loop).
//! Every layer above this one reports through it; it imports only the OS wrappers.

use super::ptrace::PtraceError;
use super::sys::Pid;
use std::io;

/// Why a checkpoint could not be taken. Every unsupported resource is named.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Ptrace(#[from] PtraceError),
    #[error("reading {what} of process {pid}: {source}")]
    Proc {
        pid: Pid,
        what: String,
        source: io::Error,
    },
    #[error("cannot checkpoint: {0}")]
    Unsupported(String),
    #[error("injected {call} in thread {tid} failed with errno {errno}")]
    Injected {
        call: &'static str,
        tid: Pid,
        errno: i64,
    },
    #[error(
        "cannot checkpoint: signals {} kept arriving while the process was read, or are pending without the details a restore needs to queue them again",
        .0.join(", ")
    )]
    PendingSignals(Vec<String>),
    #[error(
        "cannot checkpoint: {0}, and they stayed queued; queued inotify events cannot be carried into a checkpoint"
    )]
    QueuedEvents(String),
    /// The epoch loop's process tree changed in a way its chain cannot carry (see
    /// `docs/PROCESS-TREES.md`: the main process ran `execve`, a process left the tree alive,
    /// a process appeared under the mprotect tracker).
    #[error("{0}; the chain must restart with a full checkpoint")]
    TreeChanged(String),
    /// The epoch loop: a process's children are not the ones the loop knows (a process
    /// appeared or exited since the last pause). The loop looks at the tree again
    /// (`EpochLoop::retree`) and captures the new processes whole.
    #[error("{0}")]
    ChildrenChanged(String),
    /// The epoch loop: a process of the tree was exiting while the tree was stopped (neither
    /// running nor a zombie yet): the pause is tried again.
    #[error("process {0} (host PID) was exiting while the tree was stopped")]
    Exiting(Pid),
}

/// An error reading `what` of process `pid`, for `map_err`.
pub(crate) fn proc_err(
    pid: Pid,
    what: impl Into<String>,
) -> impl FnOnce(io::Error) -> CaptureError {
    let what = what.into();
    move |source| CaptureError::Proc { pid, what, source }
}
