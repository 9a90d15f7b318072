//! tardi-service: one service's lifecycle on this machine: start it fresh from a manifest, or
//! restore it from a checkpoint (a file, or an in-memory image), supervise it, know when it died.
//!
//! Used by the `tardi` CLI (`run`, `restore`, `profile`) and by the per-machine replication
//! daemon (`tardi instance`). The pieces:
//!
//! - [`load_manifest`] and [`config_for`]: from a manifest file to the [`SandboxConfig`] a
//!   service runs in (callers may adjust it before starting: run directory, link index, host
//!   paths of private directories).
//! - [`Service`]: a running service in its sandbox, made by [`Service::start`] (fresh),
//!   [`Service::restore_file`] (a `tardi snapshot` file), [`Service::restore_image`] (a
//!   backup's in-memory image) or [`Service::restore_held`] (held stopped, for verification).
//!   [`Service::try_wait`] says whether it ended; [`Service::teardown`] ends it.
//! - [`ServiceHandle`]: what another thread needs to checkpoint or inspect the service while the
//!   owner watches it; [`snapshot`], [`snapshot_to_file`] and [`snapshot_to_file_and_end`] take one.
//! - [`Error`]: every failure, with the message a user reads.
//!
//! Binaries that start services must call [`run_sandbox_init_if_asked`] first thing in `main`:
//! the sandbox's init (and a restore's first process) is that same binary re-executed. They run
//! as root and must not die of `SIGPIPE` (Rust programs ignore it by default).
//!
//! **Must not touch:** replication, the network protocol between machines, output buffering.
//! This crate knows one machine and one service at a time.

mod epochs;
mod error;
mod restore;
mod service;
mod snapshot;

pub use epochs::epoch_config;
pub use error::{Error, Result};
pub use restore::RestoreTimings;
pub use service::{Service, ServiceHandle, private_dirs};
pub use snapshot::{snapshot, snapshot_to_file, snapshot_to_file_and_end};

pub use tardi_checkpointer::{CaptureStats, Checkpoint};
pub use tardi_manifest::Manifest;
pub use tardi_sandbox::{ExitInfo, SandboxConfig};

use std::path::Path;

/// A warning about a manifest (a Gramine key without meaning here, ...): printable text.
pub type Warning = String;

/// Loads a manifest, returning its warnings (the caller shows them).
pub fn load_manifest(path: &Path) -> Result<(Manifest, Vec<Warning>)> {
    Ok(tardi_manifest::load_with_warnings(path)?)
}

/// The sandbox configuration a manifest describes ([`SandboxConfig::from_manifest`]): its
/// mounts, start directory, subnet and rlimits, named after `tardi.name`. Callers may adjust it
/// (`run_dir`, `link_index`, host paths of private directories) before starting.
pub fn config_for(m: &Manifest) -> SandboxConfig {
    SandboxConfig::from_manifest(m)
}

/// If this process was started as a sandbox's init (`<exe> __sandbox-init FD`), becomes it and
/// never returns; otherwise returns at once. Call it first thing in `main` of every binary that
/// starts services with this crate, before parsing arguments or setting up logging: each
/// sandbox's init is the current executable re-executed (unless [`SandboxConfig::init_exe`]
/// names another one), and a restored service's first process starts there.
pub fn run_sandbox_init_if_asked() {
    let mut args = std::env::args();
    if args.nth(1).as_deref() == Some(tardi_sandbox::INIT_SUBCOMMAND) {
        let fd = args.next().and_then(|s| s.parse().ok()).unwrap_or(-1);
        tardi_sandbox::init_main(fd, restore_hook);
    }
}

/// Runs in the restore child inside a new sandbox: becomes the checkpointed process.
fn restore_hook(_pid: i32, payload: &[u8], _fds: &[std::os::fd::RawFd]) -> ! {
    tardi_checkpointer::restore::child_main(payload)
}
