//! `tardi status`: the orchestrator's view of the cluster (with `--orchestrator` or
//! `TARDI_ORCHESTRATOR`), else the sandboxes running on this machine.

use crate::cli::StatusArgs;
use crate::control::{self, Reply, Request};

pub fn status(a: StatusArgs) -> anyhow::Result<()> {
    if let Some(addr) = &a.orchestrator {
        return crate::cluster::status(&a, addr);
    }
    let mut names: Vec<String> = std::fs::read_dir(tardi_sandbox::RUN_ROOT)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let mut any = false;
    for name in names {
        if !control::socket_path(&name).exists() {
            continue;
        }
        if let Ok(Reply::Status(s)) = control::call(&name, &Request::Status) {
            any = true;
            if a.json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "{:<20} {:<16} pid {:<8} log {}",
                    s.name,
                    s.address,
                    s.pid,
                    s.log.display()
                );
            }
        }
    }
    if !any && !a.json {
        println!("no sandboxes running");
    }
    Ok(())
}
