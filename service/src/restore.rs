//! Restores: a checkpoint turned back into a running (or held) service in a fresh sandbox. The
//! one restore sequence: prepare (checks, starts nothing), start a sandbox whose first process
//! is the restore child, wait for the restorer, clean up or tear down.

use crate::service::start_sandbox;
use crate::{Error, Result, Service};
use std::path::Path;
use std::time::{Duration, Instant};
use tardi_checkpointer::Checkpoint;
use tardi_checkpointer::image::{CheckpointFile, Kind};
use tardi_checkpointer::restore::{self, Prepared};
use tardi_sandbox::{SandboxConfig, Start};

/// How long the restorer may take to report (a large image on a slow disk).
const RESTORE_TIMEOUT: Duration = Duration::from_secs(60);
/// The same for a held restore (verification of an in-memory image).
const HELD_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a restore's time went (`tardi restore` reports it in its `started` event).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RestoreTimings {
    /// Reading the file and checking its length and checksum (0 for an in-memory checkpoint).
    pub read_verify_us: u64,
    /// Checking mapped files' hashes, writing page data, plan and restorer to memfds.
    pub prepare_us: u64,
    /// Creating the sandbox (namespaces, veth, mounts) up to the restore child's start.
    pub sandbox_us: u64,
    /// From then until the restorer reported every thread ready (descriptors, memory, threads).
    pub restorer_us: u64,
    /// Removing the restorer's blob from the restored process.
    pub cleanup_us: u64,
    /// All of it.
    pub total_us: u64,
}

impl Service {
    /// Restores a checkpoint file written by `tardi snapshot`, into a sandbox built from the
    /// sandbox description inside the file, or from `config` if given. The file is verified
    /// (magic, version, length, checksum, mapped files' content hashes) before anything starts;
    /// the restorer reads the pages straight from the file. Nothing is left running on error.
    pub fn restore_file(
        path: &Path,
        config: Option<SandboxConfig>,
    ) -> Result<(Service, RestoreTimings)> {
        Self::restore_file_with(path, config, |_, _| Ok(()))
    }

    /// [`Service::restore_file`], calling `before` once the file is verified, with the sandbox's
    /// configuration and whether the checkpoint carries TCP connections (`tardi snapshot
    /// --stop`), before the sandbox exists: a caller holds the packets to the sandbox from
    /// then until the restore is done, so that none meets a socket not yet recreated and draws
    /// a reset. If it returns an error, nothing is started ([`Error::Aborted`]).
    pub fn restore_file_with(
        path: &Path,
        config: Option<SandboxConfig>,
        before: impl FnOnce(&SandboxConfig, bool) -> std::result::Result<(), String>,
    ) -> Result<(Service, RestoreTimings)> {
        let t0 = Instant::now();
        let ck = CheckpointFile::open(path).map_err(|source| Error::Open {
            path: path.to_path_buf(),
            source,
        })?;
        if ck.kind != Kind::Full {
            return Err(Error::IncrementalFile {
                path: path.to_path_buf(),
            });
        }
        let config = match config {
            Some(c) => c,
            None if ck.image.sandbox.is_empty() => {
                return Err(Error::NoSandboxDescription {
                    path: path.to_path_buf(),
                });
            }
            None => serde_json::from_slice(&ck.image.sandbox).map_err(Error::SandboxDescription)?,
        };
        let connections = ck.image.processes().any(|p| !p.tcp.is_empty());
        before(&config, connections).map_err(|why| Error::Aborted {
            name: config.name.clone(),
            why,
        })?;
        let read = t0.elapsed();
        let prep = restore::prepare_file(ck, &|p| config.host_path(p)).map_err(|source| {
            Error::Prepare {
                what: path.display().to_string(),
                source,
            }
        })?;
        run_restore(config, prep, t0, read)
    }

    /// Restores a backup's image into a sandbox built from `config`: the caller's, not the
    /// description inside the image (a backup machine has its own run and state directories).
    /// No full checkpoint is built: the pages go from the image to the restorer's memfd
    /// directly. Mapped files are checked against what `config`'s mounts show. Nothing is left
    /// running on error.
    ///
    /// `routed` is called with the sandbox's address once it is routed on this machine, before
    /// the restorer runs: a caller can announce the address meanwhile. If it returns an error,
    /// the restore stops there ([`Error::Aborted`]): the sandbox is removed before the restored
    /// process ever runs.
    ///
    /// The image is only read: whatever happens, it can be restored again.
    pub fn restore_image(
        img: &tardi_checkpointer::store::Image,
        config: SandboxConfig,
        routed: impl FnOnce(std::net::Ipv4Addr) -> std::result::Result<(), String>,
    ) -> Result<(Service, RestoreTimings)> {
        let t0 = Instant::now();
        let what = || format!("the image of epoch {}", img.epoch);
        // Laid out from the metadata first; the pages (tens of ms for 100 MiB) are written
        // into the restorer's memfd while the sandbox is set up, and the sandbox lets the
        // restorer go only once they are all there.
        let (prep, pages) = restore::prepare_image_layout(img, &|p| config.host_path(p), false)
            .map_err(|source| Error::Prepare {
                what: what(),
                source,
            })?;
        let laid_out = t0.elapsed();
        let mut written: Option<std::io::Result<Duration>> = None;
        let mut refused: Option<String> = None;
        let sandbox = std::thread::scope(|s| {
            let writer = s.spawn(move || {
                img.write_pages(&mut pages.into_file())
                    .map(|()| t0.elapsed())
            });
            tardi_sandbox::Sandbox::start_gated(&config, restore_start(&prep), |addr| {
                if let Err(why) = routed(addr) {
                    // The writer ends with the scope; its result no longer matters.
                    refused = Some(why);
                    return false;
                }
                let r = writer
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("writing the pages panicked")));
                let ok = r.is_ok();
                written = Some(r);
                ok
            })
            // If the sandbox failed before its gate, the writer still ends with the scope.
        });
        if let Some(why) = refused {
            return Err(Error::Aborted {
                name: config.name.clone(),
                why,
            });
        }
        if let Some(Err(e)) = written {
            return Err(Error::Prepare {
                what: what(),
                source: restore::RestoreError::from(e),
            });
        }
        let sandbox = sandbox.map_err(|source| Error::Start {
            name: config.name.clone(),
            source,
        })?;
        let pages_done = written.and_then(|r| r.ok()).unwrap_or_default();
        // The preparation is the layout and the pages; the sandbox's set-up began right after
        // the layout, the pages overlapping it.
        finish_restore(
            sandbox,
            config,
            prep,
            t0,
            (Duration::ZERO, pages_done, laid_out),
        )
    }

    /// Restores an in-memory full checkpoint into a sandbox built from `config`, with the
    /// process held: it stops itself (SIGSTOP) right after the restorer's report, before any of
    /// its threads runs, so it can be compared with its source
    /// (`tardi_checkpointer::verify::compare_processes`). Returns the service and the address
    /// range `(start, end)` of the restorer's blob, the one mapping that differs from the source
    /// (it stays mapped). The process resumes on SIGCONT; usually it is just torn down. Nothing is
    /// left running on error.
    pub fn restore_held(ck: &Checkpoint, config: SandboxConfig) -> Result<(Service, (u64, u64))> {
        let (svc, held) = Service::restore_held_tree(ck, config)?;
        Ok((svc, held[0].blob))
    }

    /// [`Service::restore_held`] of a process tree (or a single process): every process is
    /// held stopped before running. Returns the service and, per process (the main one
    /// first), its PID in the sandbox, its host PID and the range of its restorer's blob.
    pub fn restore_held_tree(
        ck: &Checkpoint,
        config: SandboxConfig,
    ) -> Result<(Service, Vec<restore::HeldProcess>)> {
        let prep = prepare(ck, &config, true)?;
        let sandbox = start_sandbox(&config, restore_start(&prep))?;
        let svc = Service::new(sandbox, config, "the restored service has no process")?;
        match restore::finish_held_tree(prep, svc.pid(), HELD_TIMEOUT) {
            Ok(held) => Ok((svc, held)),
            Err(source) => Err(fail(svc, source)),
        }
    }
}

/// Checks an in-memory checkpoint and lays out its restore into `config`'s sandbox.
fn prepare(ck: &Checkpoint, config: &SandboxConfig, hold: bool) -> Result<Prepared> {
    if ck.kind != Kind::Full {
        return Err(Error::Incremental { epoch: ck.epoch });
    }
    restore::prepare_with(ck, &|p| config.host_path(p), hold).map_err(|source| Error::Prepare {
        what: format!("the checkpoint of epoch {}", ck.epoch),
        source,
    })
}

/// The rest of a restore once prepared (`t0`: when it began; `read`: reading took that long).
fn run_restore(
    config: SandboxConfig,
    prep: Prepared,
    t0: Instant,
    read: Duration,
) -> Result<(Service, RestoreTimings)> {
    let prepared = t0.elapsed();
    let sandbox = start_sandbox(&config, restore_start(&prep))?;
    finish_restore(sandbox, config, prep, t0, (read, prepared - read, prepared))
}

/// Waits for the restorer of the sandbox's process and reports the timings; `spans` are the
/// reading, the preparation and where the sandbox's set-up began, all from `t0`.
fn finish_restore(
    sandbox: tardi_sandbox::Sandbox,
    config: SandboxConfig,
    prep: Prepared,
    t0: Instant,
    (read, prepare, sandbox_from): (Duration, Duration, Duration),
) -> Result<(Service, RestoreTimings)> {
    let svc = Service::new(sandbox, config, "the restored service has no process")?;
    let started = t0.elapsed();
    let fin = match restore::finish(prep, svc.pid(), RESTORE_TIMEOUT) {
        Ok(fin) => fin,
        Err(source) => return Err(fail(svc, source)),
    };
    let timings = RestoreTimings {
        read_verify_us: read.as_micros() as u64,
        prepare_us: prepare.as_micros() as u64,
        sandbox_us: (started - sandbox_from).as_micros() as u64,
        restorer_us: fin.restorer.as_micros() as u64,
        cleanup_us: fin.cleanup.as_micros() as u64,
        total_us: t0.elapsed().as_micros() as u64,
    };
    tracing::info!(name = svc.name(), ?timings, "restored");
    Ok((svc, timings))
}

/// Tears down a sandbox whose restore failed; the error names its log (which stays).
fn fail(svc: Service, source: restore::RestoreError) -> Error {
    let log = svc.log_path().to_path_buf();
    if let Err(e) = svc.teardown() {
        tracing::warn!(error = %e, "tearing down the sandbox of a failed restore");
    }
    Error::Restore { log, source }
}

/// How a sandbox starts the process `prep` was prepared for.
fn restore_start(prep: &Prepared) -> Start {
    Start::Restore {
        pid: prep.pid,
        payload: prep.payload.clone(),
        fds: prep.inherit.clone(),
    }
}
