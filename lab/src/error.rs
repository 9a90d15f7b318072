//! The library's error type.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Result with a [`LabError`].
pub type Result<T, E = LabError> = std::result::Result<T, E>;

/// What can go wrong while building, driving or removing the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A lab (or what is left of one) exists already.
    #[error("a lab is already up (tardi lab down removes it)")]
    AlreadyUp,

    /// There is no lab to act on.
    #[error("no lab is up (tardi lab up creates one)")]
    NoLab,

    /// Another process holds the lab's lock for longer than we were willing to wait.
    #[error(
        "the lab is busy: another `tardi lab` command or a test holds {} (waited {:.0?})",
        path.display(),
        waited
    )]
    Busy { path: PathBuf, waited: Duration },

    /// The lab's certificates could not be made.
    #[error("making the lab's TLS certificates in {}: {reason}", dir.display())]
    Certs { dir: PathBuf, reason: String },

    /// A node name that is not in the lab.
    #[error("no node named {name:?} in the lab (nodes: {})", known.join(", "))]
    UnknownNode { name: String, known: Vec<String> },

    /// The requested shape of the lab is not possible.
    #[error("invalid lab layout: {0}")]
    Layout(String),

    /// An operation that does not apply to this node in its current state.
    #[error("node {node}: {reason}")]
    NodeState { node: String, reason: String },

    /// A command (usually `ip`) ran but failed.
    #[error("`{command}` failed ({status}){}", stderr_suffix(stderr))]
    Command {
        command: String,
        status: String,
        stderr: String,
    },

    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },

    /// The state file exists but cannot be read as a lab.
    #[error("cannot read the lab state {}: {source} (tardi lab down removes it)", path.display())]
    State {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// `down` could not remove everything (it removed what it could).
    #[error("the lab could not be removed completely: {}", .0.join("; "))]
    Teardown(Vec<String>),

    /// A daemon exited while the lab waited for it to accept connections.
    #[error(
        "node {node}: the daemon exited ({status}) before accepting connections on {addr}; {}",
        log_hint(log, log_tail)
    )]
    DaemonExited {
        node: String,
        addr: String,
        status: String,
        log: PathBuf,
        log_tail: String,
    },

    /// A daemon did not accept connections in time.
    #[error(
        "node {node}: the daemon did not accept connections on {addr} within {timeout:?}; {}",
        log_hint(log, log_tail)
    )]
    NotReady {
        node: String,
        addr: String,
        timeout: Duration,
        log: PathBuf,
        log_tail: String,
    },
}

impl LabError {
    /// An [`LabError::Io`] saying what was being done.
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> LabError {
        LabError::Io {
            what: what.into(),
            source,
        }
    }
}

fn stderr_suffix(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!(": {s}")
    }
}

fn log_hint(log: &std::path::Path, tail: &str) -> String {
    if tail.trim().is_empty() {
        format!("its log {} is empty", log.display())
    } else {
        format!("last lines of {}:\n{}", log.display(), tail.trim_end())
    }
}

/// Extension to attach "what was being done" to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| LabError::io(what(), e))
    }
}
