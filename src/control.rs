//! The control socket of a running sandbox (`/run/tardi/NAME/control.sock`): one JSON request
//! per connection, one JSON response. Used by `tardi snapshot` and `tardi status`.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

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
