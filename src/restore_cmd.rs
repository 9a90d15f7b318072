//! `tardi restore FILE`.

use crate::cli::RestoreArgs;
use crate::supervise::{Supervised, block_signals, supervise};
use anyhow::{Context, bail};
use std::time::{Duration, Instant};
use tardi_checkpointer::image::{CheckpointFile, Kind};
use tardi_checkpointer::restore;
use tardi_sandbox::{Sandbox, SandboxConfig, Start};

pub fn restore(a: RestoreArgs) -> anyhow::Result<()> {
    let signals = block_signals();
    let t0 = Instant::now();
    let ck = CheckpointFile::open(&a.file)
        .with_context(|| format!("{} cannot be restored", a.file.display()))?;
    if ck.kind != Kind::Full {
        bail!(
            "{} is an incremental checkpoint: restore needs a full one",
            a.file.display()
        );
    }
    if ck.image.sandbox.is_empty() {
        bail!(
            "{} has no sandbox description (not written by `tardi snapshot`)",
            a.file.display()
        );
    }
    let config: SandboxConfig = serde_json::from_slice(&ck.image.sandbox)
        .context("the checkpoint's sandbox description is malformed")?;
    let t_read = t0.elapsed();
    let prep = restore::prepare_file(ck, &|p| config.host_path(p)).with_context(|| {
        format!(
            "{} cannot be restored here; nothing was started",
            a.file.display()
        )
    })?;
    let t_prepared = t0.elapsed();
    let mut sandbox = Sandbox::start(&config, restore_start(&prep))
        .with_context(|| format!("starting sandbox {:?}", config.name))?;
    let pid = sandbox
        .service_pid()
        .context("the restored service has no process")?;
    let t_sandbox = t0.elapsed();
    let fin = match restore::finish(prep, pid, Duration::from_secs(60)) {
        Ok(fin) => fin,
        Err(e) => {
            let _ = sandbox.kill();
            let log = sandbox.log_path().to_path_buf();
            let _ = sandbox.teardown();
            return Err(anyhow::Error::new(e)
                .context(format!("restore failed (sandbox log: {})", log.display())));
        }
    };
    let timings = RestoreTimings {
        read_verify_us: t_read.as_micros() as u64,
        prepare_us: (t_prepared - t_read).as_micros() as u64,
        sandbox_us: (t_sandbox - t_prepared).as_micros() as u64,
        restorer_us: fin.restorer.as_micros() as u64,
        cleanup_us: fin.cleanup.as_micros() as u64,
        total_us: t0.elapsed().as_micros() as u64,
    };
    tracing::info!(?timings, "restored");
    let file = std::path::absolute(&a.file).ok();
    supervise(
        Supervised {
            sandbox,
            config,
            restored_from: file,
            json: a.json,
            restore: Some(timings),
        },
        signals,
    )
}

/// How a sandbox starts the process `prep` was prepared for.
pub fn restore_start(prep: &restore::Prepared) -> Start {
    Start::Restore {
        pid: prep.pid,
        payload: prep.payload.clone(),
        fds: prep.inherit.clone(),
    }
}

/// Where a restore's time went (reported in the `started` event).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RestoreTimings {
    /// Reading the file and checking its length and checksum.
    pub read_verify_us: u64,
    /// Checking mapped files' hashes, writing page data, plan and restorer to memfds.
    pub prepare_us: u64,
    /// Creating the sandbox (namespaces, veth, mounts) up to the restore child's start.
    pub sandbox_us: u64,
    /// From then until the restorer reported every thread ready (descriptors, memory, threads).
    pub restorer_us: u64,
    /// Removing the restorer's blob from the restored process.
    pub cleanup_us: u64,
    pub total_us: u64,
}
