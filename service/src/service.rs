//! [`Service`]: a running service in its sandbox; [`ServiceHandle`]: what other threads need.

use crate::{Error, Result};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};
use tardi_manifest::{Manifest, MountKind};
use tardi_sandbox::{ExitInfo, Sandbox, SandboxConfig, Start};

/// A service running in its sandbox on this machine. Made by [`Service::start`] or one of the
/// restores ([`Service::restore_file`], [`Service::restore_image`],
/// [`Service::restore_held`]). The sandbox ends with [`Service::teardown`]; dropping a `Service`
/// tears it down too (errors then only logged).
pub struct Service {
    sandbox: Sandbox,
    handle: ServiceHandle,
}

/// What a thread other than the [`Service`]'s owner needs to checkpoint or inspect the service
/// (the owner keeps the [`Service`] to watch and stop it): its name, PIDs and sandbox
/// configuration. Plain data, cheap to clone; it stays valid after the service ends (operations
/// on it then fail).
#[derive(Debug, Clone)]
pub struct ServiceHandle {
    name: String,
    pid: i32,
    init_pid: i32,
    config: SandboxConfig,
}

impl Service {
    /// Fresh start: execve the manifest's entrypoint (with its argv and environment) in a
    /// sandbox built from `config` (usually [`crate::config_for`] of `m`). Returns once the
    /// service's `execve` succeeded. Nothing is left running on error.
    pub fn start(m: &Manifest, config: &SandboxConfig) -> Result<Service> {
        let start = Start::Exec {
            path: m.entrypoint.clone(),
            argv: m.argv.clone(),
            env: m.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        let sandbox = start_sandbox(config, start)?;
        Service::new(sandbox, config.clone(), "the service has no process")
    }

    /// Wraps a started sandbox; tears it down if its service is already gone.
    pub(crate) fn new(
        mut sandbox: Sandbox,
        mut config: SandboxConfig,
        no_process: &'static str,
    ) -> Result<Service> {
        let Some(pid) = sandbox.service_pid() else {
            let _ = sandbox.kill();
            let _ = sandbox.teardown();
            return Err(Error::NoProcess(no_process));
        };
        // A restore of a checkpoint taken from here gets the same link, so the same address.
        config.link_index = sandbox.link_index();
        let handle = ServiceHandle {
            name: sandbox.name().to_string(),
            pid,
            init_pid: sandbox.init_pid(),
            config,
        };
        Ok(Service { sandbox, handle })
    }

    /// What another thread needs to checkpoint ([`crate::snapshot`]) or inspect the service.
    pub fn handle(&self) -> &ServiceHandle {
        &self.handle
    }

    /// The sandbox's name (`tardi.name`).
    pub fn name(&self) -> &str {
        &self.handle.name
    }

    /// The host PID of the service's main process.
    pub fn pid(&self) -> i32 {
        self.handle.pid
    }

    /// The host PID of the sandbox's init (PID 1 inside it).
    pub fn init_pid(&self) -> i32 {
        self.handle.init_pid
    }

    /// The sandbox side's address (`eth0` inside the sandbox): where clients reach the service.
    pub fn address(&self) -> Ipv4Addr {
        self.sandbox.address()
    }

    /// The host side's address of the sandbox's link (the sandbox's default gateway).
    pub fn host_address(&self) -> Ipv4Addr {
        self.sandbox.host_address()
    }

    /// The host side's interface name of the sandbox's veth pair (`td<i>h`): everything the
    /// service sends or receives passes there (where an output gate sits).
    pub fn host_if(&self) -> String {
        self.sandbox.host_interface().to_string()
    }

    /// The index of the sandbox's /30 link (see [`tardi_sandbox::net`]); the same index gives
    /// the same addresses.
    pub fn link_index(&self) -> u32 {
        self.handle.config.link_index.unwrap_or_default()
    }

    /// The sandbox's configuration, with `link_index` pinned to the link in use (so that a
    /// sandbox started from it, e.g. by a restore, gets the same addresses).
    pub fn config(&self) -> &SandboxConfig {
        &self.handle.config
    }

    /// The service log (`<run_dir>/service.log`): its stdout and stderr. It stays after
    /// [`Service::teardown`].
    pub fn log_path(&self) -> &Path {
        self.sandbox.log_path()
    }

    /// The sandbox's run directory (`/run/tardi/<name>` unless configured otherwise).
    pub fn run_dir(&self) -> &Path {
        self.sandbox.run_dir()
    }

    /// Non-blocking: has the service ended? The sandbox ends when the service's main process
    /// does (or when its init is killed); `Some` says how. Once ended, it keeps saying so.
    pub fn try_wait(&mut self) -> Result<Option<ExitInfo>> {
        Ok(self.sandbox.try_wait()?)
    }

    /// The sandbox-wide process check: processes in the sandbox besides the service and its
    /// descendants (host PIDs: the init's other children, e.g. orphans reparented to it). A
    /// checkpoint refuses to run while there are any (process trees are not supported yet).
    pub fn other_processes(&self) -> Vec<i32> {
        self.handle.other_processes()
    }

    /// Waits until the service's process tree (its main process and their descendants, host
    /// PIDs) has stayed the same for `quiet`, at most `limit`; returns the tree it settled on
    /// (or the last one seen). A service that forks its workers once it has started (nginx's
    /// master, PostgreSQL's postmaster) is then tracked from a tree that no longer changes: the
    /// epoch loop does not yet carry a process that appears between epochs.
    pub fn wait_settled(&self, quiet: Duration, limit: Duration) -> Vec<i32> {
        let t0 = Instant::now();
        let mut last = self.handle.tree_pids();
        let mut since = Instant::now();
        while t0.elapsed() < limit && since.elapsed() < quiet {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.handle.tree_pids();
            if now != last {
                last = now;
                since = Instant::now();
            }
        }
        last
    }

    /// The sandbox's private directories (paths inside it): what a checkpoint walks.
    pub fn private_dirs(&self) -> Vec<String> {
        self.handle.private_dirs()
    }

    /// Kills everything in the sandbox (SIGKILL to its init, which takes the whole PID
    /// namespace with it), reaps it and tears down the link, namespaces and run files (the
    /// service log stays). Fine on a service that already ended.
    pub fn teardown(mut self) -> Result<()> {
        let _ = self.sandbox.kill();
        Ok(self.sandbox.teardown()?)
    }
}

impl ServiceHandle {
    /// The sandbox's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host PID of the service's main process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The host PID of the sandbox's init.
    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// The sandbox's configuration, `link_index` pinned (see [`Service::config`]).
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// See [`Service::other_processes`].
    /// The service's main process and its descendants (host PIDs, sorted; empty while a
    /// process vanishes during the walk).
    pub fn tree_pids(&self) -> Vec<i32> {
        let mut all: Vec<i32> = tardi_checkpointer::verify::tree_pids(self.pid)
            .map(|m| m.into_values().collect())
            .unwrap_or_default();
        all.sort_unstable();
        all
    }

    pub fn other_processes(&self) -> Vec<i32> {
        // The init's children other than the service: processes it started before the service,
        // and orphans reparented to it (a double-forked daemon). The service's own children are
        // the capture's: a process tree, or refused by name where trees are not supported.
        std::fs::read_dir(format!("/proc/{}/task", self.init_pid))
            .into_iter()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
            .flat_map(|c| {
                c.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                    .collect::<Vec<_>>()
            })
            .filter(|&p| p != self.pid)
            .collect()
    }

    /// See [`Service::private_dirs`].
    pub fn private_dirs(&self) -> Vec<String> {
        private_dirs(&self.config)
    }
}

/// The directories a checkpoint carries the files of: the sandbox configuration's writable
/// binds (a manifest makes a bind writable exactly when it is, or lies under, one of
/// `tardi.private_dirs`) and its tmpfs mounts (`/tmp`, ...: their contents exist only in the
/// sandbox, they are the service's state as much as its memory), and `/dev/shm`, the tmpfs the
/// sandbox's init mounts for POSIX shared memory (`shm_open`).
pub fn private_dirs(config: &SandboxConfig) -> Vec<String> {
    let mut dirs: Vec<String> = config
        .mounts
        .iter()
        .filter(|m| {
            matches!(
                m.kind,
                MountKind::Bind { writable: true, .. } | MountKind::Tmpfs
            )
        })
        .map(|m| m.path.to_string_lossy().into_owned())
        .collect();
    if !dirs.iter().any(|d| d == "/dev/shm") {
        dirs.push("/dev/shm".into());
    }
    dirs
}

/// [`Sandbox::start`] with the error users read.
pub(crate) fn start_sandbox(config: &SandboxConfig, start: Start) -> Result<Sandbox> {
    Sandbox::start(config, start).map_err(|source| Error::Start {
        name: config.name.clone(),
        source,
    })
}
