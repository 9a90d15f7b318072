//! The workload side: waiting until the service accepts connections, and the `--load` command.

use super::Stop;
use crate::signals::{term_signals, wait_signal};
use anyhow::{Context, bail};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tardi_manifest::{Manifest, Proto};
use tardi_service::Service;

/// How long a TCP port may take to accept after the sandbox starts.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until the service is up: a TCP port of the manifest accepts a connection, or 300 ms
/// passed (UDP ports only, or none). Returns how it ended if it ended first, or a signal.
pub(super) fn wait_ready(
    sandbox: &mut Service,
    m: &Manifest,
    signals: &libc::sigset_t,
) -> anyhow::Result<Option<Stop>> {
    let address = sandbox.address();
    let tcp: Vec<u16> = m
        .tardi
        .ports
        .iter()
        .filter(|p| p.proto == Proto::Tcp)
        .map(|p| p.port)
        .collect();
    let t0 = Instant::now();
    loop {
        if let Some(sig) = wait_signal(signals, Duration::ZERO) {
            return Ok(Some(Stop::Signal(sig)));
        }
        if let Some(exit) = sandbox.try_wait().context("watching the sandbox")? {
            return Ok(Some(Stop::Exited(exit.to_string())));
        }
        if tcp.is_empty() {
            if t0.elapsed() >= Duration::from_millis(300) {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        for &port in &tcp {
            let addr = SocketAddr::from((address, port));
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(None);
            }
        }
        if t0.elapsed() >= READY_TIMEOUT {
            bail!(
                "the service did not accept connections on {} within {} s",
                tcp.iter()
                    .map(|p| format!("{address}:{p}"))
                    .collect::<Vec<_>>()
                    .join(" or "),
                READY_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `--load` command in its own process group; stopped (SIGTERM to the group) when dropped.
pub(super) struct Load {
    child: Option<Child>,
}

impl Load {
    pub(super) fn start(cmd: &str, address: Ipv4Addr, log: Option<&Path>) -> anyhow::Result<Load> {
        let cmd = cmd.replace("{address}", &address.to_string());
        let (out, err) = match log {
            Some(p) => {
                let f = std::fs::File::create(p)
                    .with_context(|| format!("creating the load log {}", p.display()))?;
                (Stdio::from(f.try_clone()?), Stdio::from(f))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(&cmd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // Undo `block_signals` (the mask is inherited): the load must die of SIGTERM.
        let set = term_signals();
        // SAFETY: the closure only calls sigprocmask on a set built before the fork, which is
        // async-signal-safe, as required between fork and exec.
        unsafe {
            c.pre_exec(move || {
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                Ok(())
            });
        }
        let child = c
            .spawn()
            .with_context(|| format!("starting the load command {cmd:?}"))?;
        Ok(Load { child: Some(child) })
    }

    /// SIGTERM to the whole group; SIGKILL after 3 s. Idempotent.
    pub(super) fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pgid = child.id() as i32;
        // SAFETY: signals to the process group we created (its leader is our unreaped child, so
        // the group id cannot have been reused).
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut reaped = false;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                reaped = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Members that ignored SIGTERM (the group outlives a reaped leader while it has any).
        // SAFETY: as above; right after the leader's exit the id is not reused.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        if !reaped {
            let _ = child.wait();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop();
    }
}
