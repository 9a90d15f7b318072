//! The control socket of a running sandbox (`/run/tardi/NAME/control.sock`): one JSON request
//! per connection, one JSON response. The client side is used by `tardi snapshot` and `tardi
//! status`; the server runs in the foreground `tardi run` / `tardi restore` ([`spawn_server`]).

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tardi_service::ServiceHandle;

pub const SOCKET: &str = "control.sock";

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Snapshot { path: PathBuf },
    Status,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotReply {
    pub path: PathBuf,
    pub bytes: u64,
    pub pause_us: u64,
    pub quiesce_us: u64,
    pub memory_copy_us: u64,
    pub threads: usize,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReply {
    pub name: String,
    pub address: String,
    pub pid: i32,
    pub log: PathBuf,
    pub restored_from: Option<PathBuf>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Snapshot(SnapshotReply),
    Status(StatusReply),
    Error(String),
}

pub fn socket_path(name: &str) -> PathBuf {
    Path::new(tardi_sandbox::RUN_ROOT).join(name).join(SOCKET)
}

/// Sends one request to sandbox `name` and waits for its reply.
pub fn call(name: &str, req: &Request) -> anyhow::Result<Reply> {
    let path = socket_path(name);
    let mut s = UnixStream::connect(&path).with_context(|| {
        format!(
            "no running sandbox named {name:?} (cannot connect to {})",
            path.display()
        )
    })?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    if reply.is_empty() {
        bail!("sandbox {name:?} closed the control connection without a reply");
    }
    Ok(serde_json::from_str(&reply)?)
}

/// Answers requests on `listener` for the service `service` from a thread of its own, one more
/// thread per connection, until the process exits.
pub fn spawn_server(listener: UnixListener, status: StatusReply, service: ServiceHandle) {
    let st = Arc::new(Server {
        status,
        service,
        lock: Mutex::new(()),
    });
    std::thread::spawn(move || serve(listener, st));
}

struct Server {
    status: StatusReply,
    service: ServiceHandle,
    /// One checkpoint at a time (a process has one tracer).
    lock: Mutex<()>,
}

fn serve(listener: UnixListener, st: Arc<Server>) {
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
                    Err(e) => Reply::Error(crate::output::describe(&e.into())),
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
fn snapshot_to(st: &Server, path: &Path) -> Result<SnapshotReply, tardi_service::Error> {
    // The lock guards no data (it only serialises checkpoints): a panic elsewhere while
    // holding it leaves nothing inconsistent, so a poisoned lock is taken as it is.
    let _one = st.lock.lock().unwrap_or_else(|e| e.into_inner());
    let (bytes, stats) = tardi_service::snapshot_to_file(&st.service, path)?;
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
