//! `tardi restore FILE`.

use crate::cli::RestoreArgs;
use crate::signals::block_signals;
use crate::supervise::{Supervised, supervise};
use tardi_service::Service;

pub fn restore(a: RestoreArgs) -> anyhow::Result<()> {
    let signals = block_signals();
    // A checkpoint that carries connections (`tardi snapshot --stop`): the packets their
    // clients send wait from before the sandbox exists until every socket is back, so that
    // none meets a socket not yet recreated and draws a reset.
    let mut gate = None;
    let (service, timings) = Service::restore_file_with(&a.file, None, |config, connections| {
        if connections {
            let g = crate::control::hold_input(config.link_index.unwrap_or_default())
                .map_err(|e| format!("holding the packets to the sandbox: {e:#}"))?;
            gate = Some(g);
        }
        Ok(())
    })?;
    if let Some(g) = gate {
        g.hold_input(false)?;
    }
    supervise(
        Supervised {
            service,
            restored_from: std::path::absolute(&a.file).ok(),
            json: a.json,
            restore: Some(timings),
        },
        signals,
    )
}
