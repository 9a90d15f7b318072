//! `tardi snapshot NAME -o FILE`.

use crate::cli::SnapshotArgs;
use crate::control::{self, Reply, Request};
use anyhow::bail;

pub fn snapshot(a: SnapshotArgs) -> anyhow::Result<()> {
    let path = std::path::absolute(&a.output)?;
    let stop = a.stop;
    match control::call(&a.name, &Request::Snapshot { path, stop })? {
        Reply::Snapshot(r) => {
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "checkpoint of {:?} written to {}: {:.1} MB ({:.1} MB of memory, {} threads); paused {:.2} ms (quiesce {:.3} ms, memory copy {:.2} ms)",
                    a.name,
                    r.path.display(),
                    r.bytes as f64 / 1e6,
                    r.memory_bytes as f64 / 1e6,
                    r.threads,
                    r.pause_us as f64 / 1e3,
                    r.quiesce_us as f64 / 1e3,
                    r.memory_copy_us as f64 / 1e3
                );
                if stop {
                    println!(
                        "{:?} ended with it, its connections kept: tardi restore {} carries them on",
                        a.name,
                        r.path.display()
                    );
                }
            }
            Ok(())
        }
        Reply::Error(e) => bail!("{e}"),
        other => bail!("unexpected reply {other:?}"),
    }
}
