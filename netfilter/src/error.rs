//! The crate's error type.

use std::io;

/// Everything that can go wrong installing, driving or removing a gate or a service address.
/// Each message says what was being done and what to check.
#[derive(Debug, thiserror::Error)]
pub enum NetfilterError {
    /// The [`crate::GateConfig`] or an argument cannot work as given.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// A tool this crate runs is not installed.
    #[error("`{tool}` not found: install the `{package}` package (scripts/setup.sh does)")]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },

    /// An external command (`nft`, `iptables-nft-restore`, `ip`) reported failure.
    #[error("command `{command}` failed ({status}){}", fmt_stderr(stderr))]
    Command {
        command: String,
        status: String,
        stderr: String,
    },

    /// An external command could not be started for another reason than being missing.
    #[error("cannot run `{command}`: {source}")]
    Spawn { command: String, source: io::Error },

    /// A system call failed.
    #[error("{call} failed: {source}")]
    Syscall {
        call: &'static str,
        source: io::Error,
    },

    /// The kernel refused a NFQUEUE configuration request.
    #[error(
        "{what} for NFQUEUE {queue} refused by the kernel: {source}{}",
        queue_hint(source)
    )]
    QueueConfig {
        what: &'static str,
        queue: u16,
        source: io::Error,
    },

    /// A file under `/proc` could not be read or written.
    #[error("{action} {path}: {source}")]
    Proc {
        action: &'static str,
        path: String,
        source: io::Error,
    },

    /// Proxy ARP cannot answer on an interface that does not forward.
    #[error(
        "IPv4 forwarding is off on `{iface}`: the kernel answers proxy ARP only for forwarded \
         addresses (call `announce::enable_forwarding()` in this namespace first)"
    )]
    ForwardingOff { iface: String },

    /// The gate's reader thread is gone (it hit an unrecoverable socket error; see the log).
    #[error("the gate's queue reader has stopped: {0}")]
    ReaderStopped(String),
}

/// Shorthand used throughout the crate.
pub type Result<T> = std::result::Result<T, NetfilterError>;

impl NetfilterError {
    /// A failed system call, with `errno` taken now.
    pub(crate) fn last_os(call: &'static str) -> NetfilterError {
        NetfilterError::Syscall {
            call,
            source: io::Error::last_os_error(),
        }
    }
}

fn fmt_stderr(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!(": {s}")
    }
}

fn queue_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) => {
            " (another socket is bound to this queue number in this network namespace: \
             another gate, or a leftover process; pick other queue numbers. Or this process \
             lacks CAP_NET_ADMIN)"
        }
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) => {
            " (is CONFIG_NETFILTER_NETLINK_QUEUE enabled in this kernel?)"
        }
        _ => "",
    }
}
