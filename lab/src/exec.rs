//! Commands that run inside a node: `ip netns exec tlab-<node> PROGRAM ARGS...`, joined to the
//! node's cgroup before the first exec.
//!
//! `ip netns exec` (rather than a bare `setns`) also gives the program a `/sys` of the node's
//! namespace (so `/sys/class/net` lists the node's interfaces, which the sandbox code reads) and
//! the node's `/etc/netns/<ns>` files if any; it execs the program, so the pid is the program's.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::cgroup;
use crate::cmd::ip_exe;
use crate::error::Result;

/// The environment variable naming the orchestrators (comma-separated URLs) in every command the
/// lab runs in a node.
pub const ORCHESTRATOR_ENV: &str = "TARDI_ORCHESTRATOR";

/// How a command is attached to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Session {
    /// Stays in the caller's session (an interactive command keeps its terminal).
    Same,
    /// A new session (`setsid`): a daemon that survives its starter and its terminal.
    New,
}

/// Where the node's TLS identity is, in every command the lab runs in a node (when the lab uses
/// TLS).
pub const TLS_DIR_ENV: &str = "TARDI_TLS_DIR";

/// Set to `1` in every command the lab runs in a node when the lab runs without TLS.
pub const PLAINTEXT_ENV: &str = "TARDI_INSECURE_PLAINTEXT";

/// `ip netns exec <ns> <program> <args>` with `env` (`TARDI_ORCHESTRATOR`, TLS), joining
/// `cgroup` (if given and present) before the first exec, so that everything the program starts
/// is in it too. Stdio is left to the caller.
pub(crate) fn node_command<S: AsRef<OsStr>>(
    ns: &str,
    cgroup: Option<&Path>,
    env: &[(&str, String)],
    program: impl AsRef<OsStr>,
    args: &[S],
    session: Session,
) -> Result<Command> {
    let mut cmd = Command::new(ip_exe());
    cmd.args(["netns", "exec", ns]).arg(program).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let procs = match cgroup {
        Some(cg) => cgroup::open_procs(cg)?,
        None => None,
    };
    if procs.is_none() && session == Session::Same {
        return Ok(cmd);
    }
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe system calls (setsid, write); it allocates nothing. The cgroup file it
    // owns is close-on-exec, so the program does not inherit it.
    unsafe {
        cmd.pre_exec(move || {
            if session == Session::New && libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(f) = &procs {
                cgroup::join_fd(f.as_raw_fd())?;
            }
            Ok(())
        });
    }
    Ok(cmd)
}
