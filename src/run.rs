//! `tardi run MANIFEST`.

use crate::cli::RunArgs;
use crate::supervise::{Supervised, block_signals, supervise};
use anyhow::Context;
use tardi_sandbox::{Sandbox, SandboxConfig, Start};

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let signals = block_signals();
    let (m, warnings) = tardi_manifest::load_with_warnings(&a.manifest)?;
    for w in warnings {
        eprintln!("tardi: warning: {w}");
    }
    let config = SandboxConfig::from_manifest(&m);
    let start = Start::Exec {
        path: m.entrypoint.clone(),
        argv: m.argv.clone(),
        env: m.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    };
    let sandbox = Sandbox::start(&config, start)
        .with_context(|| format!("starting sandbox {:?}", m.tardi.name))?;
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
