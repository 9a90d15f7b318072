//! The foreground supervisor shared by `tardi run` and `tardi restore`: owns the sandbox, serves
//! its control socket, prints events, and tears everything down on Ctrl-C / SIGTERM or when the
//! service ends.

use crate::control::{self, Reply, Request, SnapshotReply, StatusReply};
use anyhow::Context;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tardi_sandbox::{Sandbox, SandboxConfig};

/// The termination signals tardi takes synchronously: SIGINT, SIGTERM and SIGHUP.
pub fn term_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks [`term_signals`] in this thread (and the threads it starts later), so that
/// [`wait_signal`] can take them synchronously. Call first thing.
pub fn block_signals() -> libc::sigset_t {
    let set = term_signals();
    // SAFETY: pthread_sigmask on the calling thread with a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    set
}

/// A blocked termination signal, if one is pending, waiting at most `timeout` (zero: a poll).
pub fn wait_signal(set: &libc::sigset_t, timeout: Duration) -> Option<i32> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as i64,
    };
    // SAFETY: `set` and `ts` are valid; no siginfo requested.
    let r = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (r > 0).then_some(r)
}

pub struct Supervised {
    pub sandbox: Sandbox,
    pub config: SandboxConfig,
    pub restored_from: Option<PathBuf>,
    pub json: bool,
    pub restore: Option<crate::restore_cmd::RestoreTimings>,
}

/// Serves the sandbox until the service ends or a signal arrives; then tears it down.
pub fn supervise(s: Supervised, signals: libc::sigset_t) -> anyhow::Result<()> {
    let Supervised {
        mut sandbox,
        mut config,
        restored_from,
        json,
        restore,
    } = s;
    // A restore of a snapshot taken from here gets the same link, so the same address.
    config.link_index = sandbox.link_index();
    let pid = sandbox
        .service_pid()
        .context("the service has no process")?;
    let status = StatusReply {
        name: sandbox.name().to_string(),
        address: sandbox.address().to_string(),
        pid,
        log: sandbox.log_path().to_path_buf(),
        restored_from,
    };
    let sock_path = sandbox.run_dir().join(control::SOCKET);
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path)
        .with_context(|| format!("creating the control socket {}", sock_path.display()))?;
    let shared = Arc::new(ServeState {
        status: status.clone(),
        init_pid: sandbox.init_pid(),
        config,
        lock: Mutex::new(()),
    });
    {
        let shared = shared.clone();
        std::thread::spawn(move || serve(listener, shared));
    }
    if json {
        let mut v = serde_json::to_value(&status)?;
        v["event"] = "started".into();
        v["control"] = sock_path.display().to_string().into();
        v["host_address"] = sandbox.host_address().to_string().into();
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
        match sandbox.try_wait() {
            Ok(Some(exit)) => break exit.to_string(),
            Ok(None) => {}
            Err(e) => break format!("lost the sandbox: {e}"),
        }
    };
    let _ = std::fs::remove_file(&sock_path);
    let torn = sandbox.teardown();
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

struct ServeState {
    status: StatusReply,
    init_pid: i32,
    config: SandboxConfig,
    /// One checkpoint at a time (a process has one tracer).
    lock: Mutex<()>,
}

fn serve(listener: UnixListener, st: Arc<ServeState>) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let st = st.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            if BufReader::new(&conn).read_line(&mut line).is_err() {
                return;
            }
            let reply = match serde_json::from_str::<Request>(&line) {
                Ok(Request::Status) => Reply::Status(st.status.clone()),
                Ok(Request::Snapshot { path }) => match snapshot_to(&st, &path) {
                    Ok(r) => Reply::Snapshot(r),
                    Err(e) => Reply::Error(crate::describe(&e)),
                },
                Err(e) => Reply::Error(format!("bad request: {e}")),
            };
            let mut out = serde_json::to_string(&reply).unwrap_or_default();
            out.push('\n');
            let _ = conn.write_all(out.as_bytes());
        });
    }
}

/// Takes a full checkpoint and writes it atomically to `path`.
fn snapshot_to(st: &ServeState, path: &Path) -> anyhow::Result<SnapshotReply> {
    // The mutex holds no data (it only makes snapshots take turns), so poisoning protects no
    // invariant: after a snapshot that panicked, the next one may go ahead.
    let _one = st.lock.lock().unwrap_or_else(|e| e.into_inner());
    // Check what can be checked before pausing the service.
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        anyhow::bail!(
            "cannot write {}: directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    let others: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", st.init_pid))
        .into_iter()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|p| *p != st.status.pid.to_string())
        .collect();
    if !others.is_empty() {
        anyhow::bail!(
            "checkpointing sandbox {:?}: cannot checkpoint: the sandbox runs other processes besides the service (host PIDs {}); process trees are not supported yet",
            st.status.name,
            others.join(", ")
        );
    }
    let (mut ck, stats) =
        tardi_checkpointer::checkpoint(st.status.pid, 0, &private_dirs(&st.config))
            .with_context(|| format!("checkpointing sandbox {:?}", st.status.name))?;
    ck.image.sandbox = serde_json::to_vec(&st.config)?;
    let tmp = dir.join(format!(
        ".{}.partial",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("tardi")
    ));
    let write = || -> anyhow::Result<u64> {
        let f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let n = ck.write_to(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
        Ok(n)
    };
    let bytes = write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(SnapshotReply {
        path: path.to_path_buf(),
        bytes,
        pause_us: stats.pause.as_micros() as u64,
        quiesce_us: stats.quiesce.as_micros() as u64,
        memory_copy_us: stats.memory_copy.as_micros() as u64,
        threads: stats.threads,
        memory_bytes: stats.saved_bytes,
    })
}

/// The sandbox's private directories: its writable binds (the manifest makes a bind writable
/// exactly when it is, or lies under, one of `tardi.private_dirs`).
pub fn private_dirs(cfg: &tardi_sandbox::SandboxConfig) -> Vec<String> {
    cfg.mounts
        .iter()
        .filter(|m| {
            matches!(
                m.kind,
                tardi_manifest::MountKind::Bind { writable: true, .. }
            )
        })
        .map(|m| m.path.to_string_lossy().into_owned())
        .collect()
}
