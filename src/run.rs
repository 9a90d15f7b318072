//! `tardi run MANIFEST`.

use crate::cli::RunArgs;
use crate::signals::block_signals;
use crate::supervise::{Supervised, supervise};
use tardi_service::Service;

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let signals = block_signals();
    let m = crate::output::load_manifest(&a.manifest)?;
    let service = Service::start(&m, &tardi_service::config_for(&m))?;
    supervise(
        Supervised {
            service,
            restored_from: None,
            json: a.json,
            restore: None,
        },
        signals,
    )
}
