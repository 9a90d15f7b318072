//! The foreground supervisor shared by `tardi run` and `tardi restore`: owns the service, serves
//! its control socket, prints events, and tears everything down on Ctrl-C / SIGTERM or when the
//! service ends.

use crate::control::{self, StatusReply};
use crate::signals::wait_signal;
use anyhow::Context;
use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::Duration;
use tardi_service::{RestoreTimings, Service};

pub struct Supervised {
    pub service: Service,
    pub restored_from: Option<PathBuf>,
    pub json: bool,
    pub restore: Option<RestoreTimings>,
}

/// Serves the sandbox until the service ends or a signal arrives; then tears it down.
pub fn supervise(s: Supervised, signals: libc::sigset_t) -> anyhow::Result<()> {
    let Supervised {
        mut service,
        restored_from,
        json,
        restore,
    } = s;
    let status = StatusReply {
        name: service.name().to_string(),
        address: service.address().to_string(),
        pid: service.pid(),
        log: service.log_path().to_path_buf(),
        restored_from,
    };
    let sock_path = service.run_dir().join(control::SOCKET);
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path)
        .with_context(|| format!("creating the control socket {}", sock_path.display()))?;
    let ended = control::spawn_server(listener, status.clone(), service.handle().clone());
    if json {
        let mut v = serde_json::to_value(&status)?;
        v["event"] = "started".into();
        v["control"] = sock_path.display().to_string().into();
        v["host_address"] = service.host_address().to_string().into();
        v["host_if"] = service.host_if().into();
        if let Some(t) = &restore {
            v["restore"] = serde_json::to_value(t)?;
        }
        println!("{v}");
    } else {
        if let Some(t) = &restore {
            println!(
                "restored in {:.1} ms (read+verify {:.1}, prepare {:.1}, sandbox {:.1}, restorer {:.1}, cleanup {:.1})",
                t.total_us as f64 / 1e3,
                t.read_verify_us as f64 / 1e3,
                t.prepare_us as f64 / 1e3,
                t.sandbox_us as f64 / 1e3,
                t.restorer_us as f64 / 1e3,
                t.cleanup_us as f64 / 1e3
            );
        }
        println!(
            "sandbox {:?} running: address {}, pid {}, log {}\n  snapshot: tardi snapshot {} -o FILE    stop: Ctrl-C",
            status.name,
            status.address,
            status.pid,
            status.log.display(),
            status.name
        );
    }
    let _ = std::io::stdout().flush();

    let outcome = loop {
        if let Some(sig) = wait_signal(&signals, Duration::from_millis(100)) {
            break format!("stopped by signal {sig}");
        }
        match service.try_wait() {
            Ok(Some(exit)) => match ended.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                Some(e) => {
                    break format!(
                        "ended by tardi snapshot --stop; its connections wait in {} (tardi restore {0})",
                        e.path.display()
                    );
                }
                None => break exit.to_string(),
            },
            Ok(None) => {}
            Err(e) => break format!("lost the sandbox: {e}"),
        }
    };
    let _ = std::fs::remove_file(&sock_path);
    let torn = service.teardown();
    // The packets held for an ended service's connections are dropped only now that its
    // sandbox (and every socket its kernel could answer with a reset) is gone.
    drop(ended.lock().unwrap_or_else(|e| e.into_inner()).take());
    if json {
        println!(
            "{}",
            serde_json::json!({"event": "stopped", "name": status.name, "reason": outcome})
        );
    } else {
        println!("sandbox {:?} stopped: {outcome}", status.name);
    }
    torn.context("tearing the sandbox down")?;
    Ok(())
}
