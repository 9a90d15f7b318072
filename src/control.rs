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
    Snapshot {
        path: PathBuf,
        /// End the service once the checkpoint is written, carrying its connections
        /// (`tardi snapshot --stop`).
        #[serde(default)]
        stop: bool,
    },
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
/// thread per connection, until the process exits. Returns what a `tardi snapshot --stop`
/// leaves for the supervisor, which sees the service end.
pub fn spawn_server(
    listener: UnixListener,
    status: StatusReply,
    service: ServiceHandle,
) -> Arc<Mutex<Option<Ended>>> {
    let ended = Arc::new(Mutex::new(None));
    let st = Arc::new(Server {
        status,
        service,
        lock: Mutex::new(()),
        ended: ended.clone(),
    });
    std::thread::spawn(move || serve(listener, st));
    ended
}

/// A service ended by `tardi snapshot --stop`: the checkpoint it ended with, and the gate that
/// holds the packets to its sandbox until the sandbox is torn down (its connections' sockets
/// are gone: a packet reaching the sandbox before then would draw a reset from its kernel).
pub struct Ended {
    pub path: PathBuf,
    /// Never read: it holds the packets until it is dropped.
    _gate: Arc<tardi_netfilter::Gate>,
}

struct Server {
    status: StatusReply,
    service: ServiceHandle,
    /// One checkpoint at a time (a process has one tracer).
    lock: Mutex<()>,
    ended: Arc<Mutex<Option<Ended>>>,
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
                Ok(Request::Snapshot { path, stop }) => match snapshot_to(&st, &path, stop) {
                    Ok(r) => Reply::Snapshot(r),
                    Err(e) => Reply::Error(crate::output::describe(&e)),
                },
                Err(e) => Reply::Error(format!("bad request: {e}")),
            };
            let mut out = serde_json::to_string(&reply).unwrap_or_default();
            out.push('\n');
            let _ = conn.write_all(out.as_bytes());
        });
    }
}

/// Takes a full checkpoint and writes it atomically to `path`; with `stop`, one that carries
/// the connections, and the service ends (see [`tardi_service::snapshot_to_file_and_end`]).
fn snapshot_to(st: &Server, path: &Path, stop: bool) -> anyhow::Result<SnapshotReply> {
    // The lock guards no data (it only serialises checkpoints): a panic elsewhere while
    // holding it leaves nothing inconsistent, so a poisoned lock is taken as it is.
    let _one = lock(&st.lock);
    if lock(&st.ended).is_some() {
        bail!("the service has ended (tardi snapshot --stop)");
    }
    let (bytes, stats) = if stop {
        // Packets to the sandbox wait from before the connections are read until the sandbox
        // is gone; if the checkpoint is not kept, they go on to the service, in order.
        let gate = hold_input(st.service.config().link_index.unwrap_or_default())
            .context("holding the packets to the sandbox")?;
        match tardi_service::snapshot_to_file_and_end(&st.service, path) {
            Ok(r) => {
                *lock(&st.ended) = Some(Ended {
                    path: path.to_path_buf(),
                    _gate: gate,
                });
                r
            }
            Err(e) => {
                gate.hold_input(false)
                    .context("letting the packets to the sandbox through again")?;
                return Err(e.into());
            }
        }
    } else {
        tardi_service::snapshot_to_file(&st.service, path)?
    };
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

/// The lock, taken as it is if poisoned (what it guards is replaced whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A gate on the sandbox of link `link_index` that holds the packets *to* it (until
/// `hold_input(false)`, or dropped with the gate) and lets its output pass.
pub fn hold_input(link_index: u32) -> anyhow::Result<Arc<tardi_netfilter::Gate>> {
    tardi_instance::primary::open_gate_in(link_index, tardi_netfilter::Mode::Pass)
}
