//! The sandbox that stands in for Gramine's LibOS: a service runs, unmodified, in its own PID,
//! mount, network, UTS and IPC namespaces, sees only what its manifest mounts, and is reachable
//! from the host through a veth pair.
//!
//! Owns: creating and destroying namespaces, the sandbox's PID-1 init, mounts, the veth link and
//! its addresses, the service log. Must not touch: process state capture or restore — when a
//! sandbox is started from a checkpoint, the init hands an opaque payload to a hook supplied by
//! the binary (see [`init_main`]); this crate never looks inside it.
//!
//! # How a sandbox comes to life
//! 1. [`Sandbox::start`] (in the host process, possibly multi-threaded) takes the lock
//!    `<run_dir>/lock`, creates `<run_dir>/root`, and `clone3`s the init with new PID, mount,
//!    network, UTS and IPC namespaces. The clone child does nothing but `execve` the init
//!    executable ([`SandboxConfig::init_exe`], by default the current executable) as
//!    `<exe> __sandbox-init <spec-fd>`; that binary must call [`init_main`] for that argv
//!    (see [`INIT_SUBCOMMAND`]).
//! 2. The host sends the init its spec over a pipe, creates the veth pair `td<i>h`/`td<i>s`
//!    (addresses: see [`net`]), moves `td<i>s` into the init's network namespace and configures
//!    both ends, then tells the init to go on.
//! 3. The init ([`init_main`], PID 1 of the new PID namespace) sets the hostname, builds the new
//!    root on a tmpfs (the manifest's mounts, a fresh `/proc`, a minimal `/dev`, `/dev/shm`),
//!    `pivot_root`s into it and starts the service: `execve` for [`Start::Exec`], or a
//!    `clone3` child with the requested PID calling the restore hook for [`Start::Restore`].
//!    It reports back on a status pipe, then reaps processes and forwards `SIGTERM`, `SIGINT`,
//!    `SIGHUP`, `SIGQUIT`, `SIGUSR1` and `SIGUSR2` to the service until the service's main process
//!    exits; it then exits with [`ExitInfo::code`], which makes the kernel kill everything left in
//!    the sandbox.
//! 4. [`Sandbox::teardown`] (or dropping the [`Sandbox`]) deletes the veth pair, kills and reaps
//!    the init, and removes the pid file, lock and root directory. The service log
//!    (`<run_dir>/service.log`) is kept.
//!
//! The host must run as root (or with `CAP_SYS_ADMIN` and `CAP_NET_ADMIN`) and have `ip` and
//! `nsenter` in `PATH`.

mod error;
mod host;
mod init;
pub mod net;
mod proto;
mod sys;

use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::path::{Component, Path, PathBuf};

pub use error::{Result, SandboxError};
pub use host::Sandbox;
pub use init::{RestoreHook, SANDBOX_LOG, init_main};

/// The hidden subcommand that runs the init: the init executable is started as
/// `<exe> __sandbox-init <spec-fd>` and must then call [`init_main`]`(<spec-fd>, hook)`.
pub const INIT_SUBCOMMAND: &str = "__sandbox-init";

/// Where run directories live by default: `/run/tardi/<name>`.
pub const RUN_ROOT: &str = "/run/tardi";

/// The default /16 that links are carved from (same as the manifest's default).
pub const DEFAULT_SUBNET: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 0);

/// Everything needed to create a sandbox (derived from a manifest by [`SandboxConfig::from_manifest`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SandboxConfig {
    pub name: String,
    pub hostname: String,
    /// What the service sees, applied parents first (sorted by path depth, stable).
    pub mounts: Vec<tardi_manifest::Mount>,
    pub start_dir: PathBuf,
    /// The /16 subnet the link address is allocated from.
    pub subnet: Ipv4Addr,
    /// Directory for this sandbox's files (log, control socket): `/run/tardi/<name>` by default.
    pub run_dir: PathBuf,
    /// The executable started as the sandbox's init (`<exe> __sandbox-init <fd>`); `None` means
    /// the current executable (`/proc/self/exe`, resolved when the sandbox starts).
    #[serde(default)]
    pub init_exe: Option<PathBuf>,
    /// `RLIMIT_STACK` for the service (manifest `sys.stack.size`).
    #[serde(default)]
    pub stack_size: Option<u64>,
    /// `RLIMIT_DATA` for the service (manifest `sys.brk.max_size`).
    #[serde(default)]
    pub data_limit: Option<u64>,
    /// Use exactly this link index (and so these addresses) instead of any free one: a sandbox
    /// restored from a checkpoint keeps the address its clients know.
    #[serde(default)]
    pub link_index: Option<u32>,
    /// Run the service as this user (manifest `tardi.user`: a name or a numeric ID, looked up
    /// in the sandbox's `/etc/passwd`), with its groups; `None`: as root.
    #[serde(default)]
    pub user: Option<String>,
}

/// How the service process inside the sandbox comes to life.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Start {
    /// A fresh start: execve the binary with stdout/stderr appended to the service log.
    /// `path` is resolved inside the sandbox; a name without `/` is looked up in the `PATH` of
    /// `env` (or a standard `PATH`). `argv` includes argv\[0\] (`[path]` if empty); `env` is the
    /// service's whole environment.
    Exec {
        path: PathBuf,
        argv: Vec<String>,
        env: Vec<(String, String)>,
    },
    /// A start from a checkpoint: the init creates the service's first process with PID `pid`
    /// (clone3 `set_tid`) and, in that child, calls the restore hook given to [`init_main`] with
    /// `payload` and `fds` (fds are inherited from the caller of [`Sandbox::start`], kept open
    /// across the init's exec, at the same numbers).
    Restore {
        pid: i32,
        payload: Vec<u8>,
        fds: Vec<RawFd>,
    },
}

/// How a sandbox ended, as reported by [`Sandbox::wait_exit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ExitInfo {
    /// The service's main process exited with this code.
    Exited { code: i32 },
    /// The service's main process was killed by this signal.
    Signaled { signal: i32, core_dumped: bool },
    /// The init itself was killed by this signal (e.g. `SIGKILL` from [`Sandbox::kill`]) before
    /// the service ended; the kernel killed everything in the sandbox with it.
    InitKilled { signal: i32 },
}

impl ExitInfo {
    /// The exit code the init uses for this outcome: the service's code, or 128 + signal.
    pub fn code(&self) -> i32 {
        match *self {
            ExitInfo::Exited { code } => code,
            ExitInfo::Signaled { signal, .. } | ExitInfo::InitKilled { signal } => 128 + signal,
        }
    }

    /// Whether the service exited with code 0.
    pub fn success(&self) -> bool {
        matches!(self, ExitInfo::Exited { code: 0 })
    }

    /// Decodes an init exit code (when no precise report is available).
    pub(crate) fn from_init_code(code: i32) -> ExitInfo {
        if code > 128 {
            ExitInfo::Signaled {
                signal: code - 128,
                core_dumped: false,
            }
        } else {
            ExitInfo::Exited { code }
        }
    }
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ExitInfo::Exited { code } => write!(f, "service exited with code {code}"),
            ExitInfo::Signaled {
                signal,
                core_dumped,
            } => write!(
                f,
                "service killed by signal {signal}{}",
                if core_dumped { " (core dumped)" } else { "" }
            ),
            ExitInfo::InitKilled { signal } => write!(f, "sandbox init killed by signal {signal}"),
        }
    }
}

/// The mounts used when a manifest has none: the host's root, read-only.
pub fn default_mounts() -> Vec<tardi_manifest::Mount> {
    vec![tardi_manifest::Mount {
        path: PathBuf::from("/"),
        kind: tardi_manifest::MountKind::Bind {
            host_path: PathBuf::from("/"),
            writable: false,
        },
    }]
}

impl SandboxConfig {
    /// A configuration with defaults: hostname = name, the host's root read-only, start in `/`,
    /// [`DEFAULT_SUBNET`], run directory `/run/tardi/<name>`, the current executable as init.
    pub fn new(name: impl Into<String>) -> SandboxConfig {
        let name = name.into();
        SandboxConfig {
            hostname: name.clone(),
            mounts: default_mounts(),
            start_dir: PathBuf::from("/"),
            subnet: DEFAULT_SUBNET,
            run_dir: Path::new(RUN_ROOT).join(&name),
            init_exe: None,
            stack_size: None,
            data_limit: None,
            link_index: None,
            user: None,
            name,
        }
    }

    /// The configuration a manifest asks for: its mounts (see
    /// [`tardi_manifest::Manifest::mounts_or_default`]: without `fs.mounts`, the host's root
    /// read-only plus a writable bind of each private dir), start directory, subnet and rlimits; name and hostname from `tardi.name`.
    pub fn from_manifest(m: &tardi_manifest::Manifest) -> SandboxConfig {
        let mut c = SandboxConfig::new(m.tardi.name.clone());
        c.mounts = m.mounts_or_default();
        c.start_dir = m.start_dir.clone();
        c.subnet = m.tardi.network.subnet;
        c.stack_size = m.sys.stack_size;
        c.data_limit = m.sys.brk_max_size;
        c.user = m.tardi.user.clone();
        c
    }

    /// The host path the sandbox shows at `path` (inside it): the deepest mount containing it,
    /// if that is a bind mount (tmpfs contents exist only inside the sandbox).
    pub fn host_path(&self, path: &str) -> Option<PathBuf> {
        let p = Path::new(path);
        self.mounts
            .iter()
            .filter(|m| p.starts_with(&m.path))
            .max_by_key(|m| m.path.components().count())
            .and_then(|m| match &m.kind {
                tardi_manifest::MountKind::Bind { host_path, .. } => {
                    Some(host_path.join(p.strip_prefix(&m.path).ok()?))
                }
                tardi_manifest::MountKind::Tmpfs => None,
            })
    }

    /// Checks what [`Sandbox::start`] relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(SandboxError::InvalidConfig(msg));
        let n = &self.name;
        if n.is_empty()
            || n.len() > 63
            || n.starts_with(['.', '-'])
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return bad(format!(
                "name {n:?} must be 1-63 characters of [A-Za-z0-9._-], not starting with . or -"
            ));
        }
        if self.hostname.is_empty() || self.hostname.len() > 64 {
            return bad(format!("hostname {:?} must be 1-64 bytes", self.hostname));
        }
        if !self.run_dir.is_absolute() {
            return bad(format!(
                "run_dir {} must be absolute",
                self.run_dir.display()
            ));
        }
        if !self.start_dir.is_absolute() {
            return bad(format!(
                "start_dir {} must be absolute",
                self.start_dir.display()
            ));
        }
        for m in &self.mounts {
            if !is_clean_absolute(&m.path) {
                return bad(format!(
                    "mount path {} must be absolute, without `..` or `.`",
                    m.path.display()
                ));
            }
            if let tardi_manifest::MountKind::Bind { host_path, .. } = &m.kind
                && !host_path.is_absolute()
            {
                return bad(format!(
                    "host path {} of mount {} must be absolute",
                    host_path.display(),
                    m.path.display()
                ));
            }
        }
        Ok(())
    }
}

/// Absolute and made only of normal components (no `.`/`..`).
fn is_clean_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tardi_manifest::{Epoch, Manifest, Mount, MountKind, Network, Sys, Tardi};

    fn manifest(mounts: Vec<Mount>) -> Manifest {
        Manifest {
            source: "/etc/tardi/web.toml".into(),
            entrypoint: "/usr/bin/python3".into(),
            argv: vec!["python3".into()],
            env: BTreeMap::new(),
            start_dir: "/srv".into(),
            mounts,
            sys: Sys {
                stack_size: Some(8 << 20),
                brk_max_size: None,
                enable_sigterm_injection: true,
            },
            tardi: Tardi {
                name: "web".into(),
                ports: vec![],
                private_dirs: vec![],
                user: None,
                epoch: Epoch::default(),
                network: Network {
                    subnet: Ipv4Addr::new(10, 99, 0, 0),
                },
                failover: Default::default(),
                scrub: Default::default(),
            },
        }
    }

    #[test]
    fn from_manifest_defaults_to_readonly_root() {
        let c = SandboxConfig::from_manifest(&manifest(vec![]));
        assert_eq!(c.name, "web");
        assert_eq!(c.hostname, "web");
        assert_eq!(c.run_dir, PathBuf::from("/run/tardi/web"));
        assert_eq!(c.start_dir, PathBuf::from("/srv"));
        assert_eq!(c.subnet, Ipv4Addr::new(10, 99, 0, 0));
        assert_eq!(c.stack_size, Some(8 << 20));
        assert_eq!(c.mounts, default_mounts());
        assert!(c.init_exe.is_none());
        c.validate().unwrap();
    }

    #[test]
    fn from_manifest_keeps_mounts() {
        let mounts = vec![Mount {
            path: "/tmp".into(),
            kind: MountKind::Tmpfs,
        }];
        let c = SandboxConfig::from_manifest(&manifest(mounts.clone()));
        assert_eq!(c.mounts, mounts);
    }

    #[test]
    fn validate_rejects_bad_paths_and_names() {
        let mut c = SandboxConfig::new("ok-name");
        c.validate().unwrap();
        c.mounts.push(Mount {
            path: "/a/../b".into(),
            kind: MountKind::Tmpfs,
        });
        assert!(c.validate().is_err());
        assert!(SandboxConfig::new("a/b").validate().is_err());
        assert!(SandboxConfig::new("").validate().is_err());
    }

    #[test]
    fn exit_codes() {
        assert_eq!(ExitInfo::Exited { code: 3 }.code(), 3);
        assert_eq!(
            ExitInfo::Signaled {
                signal: 15,
                core_dumped: false
            }
            .code(),
            143
        );
        assert_eq!(
            ExitInfo::from_init_code(143),
            ExitInfo::Signaled {
                signal: 15,
                core_dumped: false
            }
        );
        assert_eq!(ExitInfo::from_init_code(0), ExitInfo::Exited { code: 0 });
    }
}
