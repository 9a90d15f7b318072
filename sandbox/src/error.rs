//! The crate's error type.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong creating, running or tearing down a sandbox. Each message says
/// what was being done, on which path or with which command, and why it failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The [`crate::SandboxConfig`] (or the [`crate::Start`]) cannot work as given.
    #[error("invalid sandbox configuration: {0}")]
    InvalidConfig(String),

    /// The caller of [`crate::Sandbox::start_gated`] called the start off.
    #[error("the sandbox's start was called off")]
    Aborted,

    /// Another sandbox with this name holds the lock in its run directory.
    #[error(
        "sandbox `{name}` is already running (init pid {}; lock {} is held); stop it first",
        pid.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
        lock.display()
    )]
    AlreadyRunning {
        name: String,
        pid: Option<i32>,
        lock: PathBuf,
    },

    /// A file-system operation on a named path failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },

    /// A system call that is not about one path failed.
    #[error("{call} failed: {source}")]
    Syscall { call: String, source: io::Error },

    /// An external command (`ip`, `nsenter`) could not be run or reported failure.
    #[error("command `{command}` failed ({status}){}", fmt_stderr(stderr))]
    Command {
        command: String,
        status: String,
        stderr: String,
    },

    /// Every /30 link index of the subnet is taken by an existing `td<i>h` interface.
    #[error(
        "no free /30 link left in {subnet}/16: all {max} `td<i>h` interfaces exist \
         (delete stale ones with `ip link del td<i>h`)"
    )]
    NoFreeLink {
        subnet: std::net::Ipv4Addr,
        max: u32,
    },

    /// The sandbox's init could not be executed (the init executable is missing or not
    /// runnable).
    #[error("cannot execute the sandbox init {}: {source}", exe.display())]
    InitExec { exe: PathBuf, source: io::Error },

    /// The init reported that it could not set the sandbox up or start the service.
    #[error("sandbox `{name}`: {message}")]
    Init { name: String, message: String },

    /// The init went away, or stopped talking, before reporting that the service started.
    #[error("sandbox `{name}`: the init {what}; its output is in {}", log.display())]
    InitDied {
        name: String,
        what: String,
        log: PathBuf,
    },

    /// The service binary could not be executed inside the sandbox (reported by the init).
    #[error("cannot execute the service {} inside the sandbox: {source}", path.display())]
    ServiceExec { path: PathBuf, source: io::Error },

    /// The init and this process disagree about the wire protocol (a version mismatch between
    /// the binary running the init and this library).
    #[error("sandbox init protocol error: {0}")]
    Protocol(String),
}

fn fmt_stderr(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!(": {s}")
    }
}

impl SandboxError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        SandboxError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn sys(call: impl Into<String>, source: io::Error) -> Self {
        SandboxError::Syscall {
            call: call.into(),
            source,
        }
    }

    /// The last OS error, attributed to `call`.
    pub(crate) fn last_os(call: impl Into<String>) -> Self {
        Self::sys(call, io::Error::last_os_error())
    }
}

/// `Result` with [`SandboxError`].
pub type Result<T, E = SandboxError> = std::result::Result<T, E>;
