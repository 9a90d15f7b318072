//! External commands (`nft`, `iptables-nft-restore`, `ip`) run in a fixed network namespace.
//!
//! A gate or a service address is created on a thread that is in the right network namespace,
//! but may be changed or dropped from any thread. Every command therefore enters the namespace
//! recorded at creation (`setns` in the child between `fork` and `exec`), whatever namespace the
//! calling thread is in.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::error::{NetfilterError, Result};

/// A handle on one network namespace (an open `/proc/thread-self/ns/net`).
#[derive(Debug)]
pub(crate) struct Netns(OwnedFd);

impl Netns {
    /// The network namespace of the calling thread.
    pub(crate) fn current() -> Result<Netns> {
        let path = c"/proc/thread-self/ns/net";
        // SAFETY: `path` is a NUL-terminated string; the returned descriptor is checked.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(NetfilterError::last_os("open(/proc/thread-self/ns/net)"));
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(Netns(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Identifies the namespace: device and inode of its nsfs file.
    pub(crate) fn id(&self) -> Result<(u64, u64)> {
        // SAFETY: an all-zero `stat` is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open and `st` is a valid, writable `stat`.
        if unsafe { libc::fstat(self.0.as_raw_fd(), &mut st) } != 0 {
            return Err(NetfilterError::last_os("fstat(network namespace)"));
        }
        Ok((st.st_dev, st.st_ino))
    }

    /// Runs `program args..` in this namespace, feeding it `stdin`, and returns its standard
    /// output. A non-zero exit is an error carrying its standard error.
    pub(crate) fn run(&self, program: &'static str, args: &[&str], stdin: &str) -> Result<String> {
        let command = display(program, args);
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let ns = self.0.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and only makes one system
        // call (`setns`), which is async-signal-safe; `ns` stays open while `self` lives, which
        // covers the whole `spawn`.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                NetfilterError::ToolMissing {
                    tool: program,
                    package: package_of(program),
                }
            } else {
                NetfilterError::Spawn {
                    command: command.clone(),
                    source: e,
                }
            }
        })?;
        if let Some(mut input) = child.stdin.take() {
            // A tool that exits early closes its end; its exit status tells what went wrong.
            let _ = input.write_all(stdin.as_bytes());
        }
        let out = child
            .wait_with_output()
            .map_err(|e| NetfilterError::Spawn {
                command: command.clone(),
                source: e,
            })?;
        if !out.status.success() {
            return Err(NetfilterError::Command {
                command: if stdin.is_empty() {
                    command
                } else {
                    format!("{command} <<< {:?}", stdin.trim())
                },
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        tracing::trace!(%command, "ran");
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

fn display(program: &str, args: &[&str]) -> String {
    std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The Debian package that provides `program`.
fn package_of(program: &str) -> &'static str {
    match program {
        "nft" => "nftables",
        "ip" => "iproute2",
        _ => "iptables",
    }
}
