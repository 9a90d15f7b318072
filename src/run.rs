//! `tardi run MANIFEST`.

use crate::cli::RunArgs;
use crate::supervise::{Supervised, block_signals, supervise};
use anyhow::Context;
use std::path::Path;
use tardi_manifest::Manifest;
use tardi_sandbox::{Sandbox, SandboxConfig, Start};

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let signals = block_signals();
    let m = load_manifest(&a.manifest)?;
    let (config, sandbox) = start_service(&m)?;
    supervise(
        Supervised {
            sandbox,
            config,
            restored_from: None,
            json: a.json,
            restore: None,
        },
        signals,
    )
}

/// Loads a manifest, printing its warnings.
pub fn load_manifest(path: &Path) -> anyhow::Result<Manifest> {
    let (m, warnings) = tardi_manifest::load_with_warnings(path)?;
    for w in warnings {
        eprintln!("tardi: warning: {w}");
    }
    Ok(m)
}

/// Starts the manifest's service, fresh, in a sandbox configured from it.
pub fn start_service(m: &Manifest) -> anyhow::Result<(SandboxConfig, Sandbox)> {
    let config = SandboxConfig::from_manifest(m);
    let start = Start::Exec {
        path: m.entrypoint.clone(),
        argv: m.argv.clone(),
        env: m.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    };
    let sandbox = Sandbox::start(&config, start)
        .with_context(|| format!("starting sandbox {:?}", m.tardi.name))?;
    Ok((config, sandbox))
}
