//! `tardi restore FILE`.

use crate::cli::RestoreArgs;
use crate::supervise::{Supervised, block_signals, supervise};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tardi_checkpointer::{Checkpoint, restore};
use tardi_manifest::MountKind;
use tardi_sandbox::{Sandbox, SandboxConfig, Start};

pub fn restore(a: RestoreArgs) -> anyhow::Result<()> {
    let signals = block_signals();
    let t0 = Instant::now();
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let ck = Checkpoint::from_bytes(bytes)
        .with_context(|| format!("{} cannot be restored", a.file.display()))?;
    if ck.image.sandbox.is_empty() {
        bail!("{} has no sandbox description (not written by `tardi snapshot`)", a.file.display());
    }
    let config: SandboxConfig = serde_json::from_slice(&ck.image.sandbox)
        .context("the checkpoint's sandbox description is malformed")?;
    let prep = restore::prepare(&ck, &|p| host_path(&config, p))
        .with_context(|| format!("{} cannot be restored here; nothing was started", a.file.display()))?;
    drop(ck);
    let start = Start::Restore { pid: prep.pid, payload: prep.payload.clone(), fds: prep.inherit.clone() };
    let mut sandbox = Sandbox::start(&config, start)
        .with_context(|| format!("starting sandbox {:?}", config.name))?;
    let pid = sandbox.service_pid().context("the restored service has no process")?;
    if let Err(e) = restore::finish(prep, pid, Duration::from_secs(60)) {
        let _ = sandbox.kill();
        let log = sandbox.log_path().to_path_buf();
        let _ = sandbox.teardown();
        return Err(anyhow::Error::new(e).context(format!("restore failed (sandbox log: {})", log.display())));
    }
    tracing::info!(elapsed = ?t0.elapsed(), "restored");
    let file = std::path::absolute(&a.file).ok();
    supervise(Supervised { sandbox, config, restored_from: file, json: a.json }, signals)
}

/// The host path the sandbox shows at `p`: the deepest mount that contains it.
pub fn host_path(config: &SandboxConfig, p: &str) -> Option<PathBuf> {
    let p = Path::new(p);
    config
        .mounts
        .iter()
        .filter(|m| p.starts_with(&m.path))
        .max_by_key(|m| m.path.components().count())
        .and_then(|m| match &m.kind {
            MountKind::Bind { host_path, .. } => Some(host_path.join(p.strip_prefix(&m.path).ok()?)),
            MountKind::Tmpfs => None,
        })
}
