//! `tardi restore FILE`.

use crate::cli::RestoreArgs;
use crate::signals::block_signals;
use crate::supervise::{Supervised, supervise};
use tardi_service::Service;

pub fn restore(a: RestoreArgs) -> anyhow::Result<()> {
    let signals = block_signals();
    let (service, timings) = Service::restore_file(&a.file, None)?;
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
