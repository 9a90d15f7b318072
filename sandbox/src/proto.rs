//! The private protocol between [`crate::Sandbox::start`] (the host side) and
//! [`crate::init_main`] (the sandbox's init, a freshly exec'd copy of the binary).
//!
//! Two pipes, created by the host before the `clone3`:
//!
//! * **spec pipe** (host → init; its read end's number is the init's third argv word):
//!   `u64 LE length` + JSON [`InitSpec`], `u64 LE length` + the raw restore payload (kept out of
//!   the JSON so a large checkpoint payload is not inflated), then — once the host has set up the
//!   network — the single byte [`GO`]. End of file instead of [`GO`] means "abort": the init
//!   exits quietly.
//! * **status pipe** (init → host): newline-terminated JSON [`Report`]s: `Ready` once the spec
//!   is read, then `Started` or `Failed`, and finally `Exited` when the service's main process
//!   ends. Before the exec, the host's clone child may write [`EXEC_FAILED`] followed by the
//!   4-byte native-endian errno of the failed `execve` of the init.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::{ExitInfo, SandboxConfig, Start};

/// The byte that tells the init the network is configured and it may go on.
pub(crate) const GO: u8 = b'G';
/// First byte written on the status pipe by the host's clone child when `execve` of the init
/// fails (followed by the errno).
pub(crate) const EXEC_FAILED: u8 = b'X';
/// Upper bound on the spec's JSON part, to reject garbage early.
const MAX_SPEC_JSON: u64 = 16 << 20;
/// Upper bound on the restore payload.
const MAX_PAYLOAD: u64 = 1 << 36;

/// What the init needs to know (the restore payload travels separately, see the module doc).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct InitSpec {
    pub config: SandboxConfig,
    /// With `Start::Restore`, `payload` is empty here.
    pub start: Start,
    /// The service log, a host path (opened before `pivot_root`).
    pub log_path: PathBuf,
    /// Empty host directory the new root is built on.
    pub root_dir: PathBuf,
    /// Write end of the status pipe.
    pub status_fd: RawFd,
    /// The lock file's fd (inherited so the lock lives as long as the init does).
    pub lock_fd: RawFd,
    /// The sandbox side's address (informational: the host configures the network).
    pub address: Ipv4Addr,
    /// The host side's address, the sandbox's default gateway (informational).
    pub gateway: Ipv4Addr,
}

/// A message from the init to the host.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Report {
    /// The spec was read; the init waits for [`GO`].
    Ready,
    /// The service's main process exists, with this PID inside the sandbox.
    Started { ns_pid: i32 },
    /// Setting up the sandbox or starting the service failed.
    Failed { message: String },
    /// A `Failed` whose cause is the service's `execve`.
    ServiceExecFailed { path: PathBuf, errno: i32 },
    /// The service's main process ended; the init exits right after.
    Exited(ExitInfo),
    /// Not sent by the init: the host's clone child could not exec the init (errno).
    #[serde(skip)]
    InitExecFailed(i32),
}

pub(crate) fn write_spec(w: &mut impl Write, spec: &InitSpec, payload: &[u8]) -> io::Result<()> {
    let json = serde_json::to_vec(spec).map_err(io::Error::other)?;
    w.write_all(&(json.len() as u64).to_le_bytes())?;
    w.write_all(&json)?;
    w.write_all(&(payload.len() as u64).to_le_bytes())?;
    w.write_all(payload)?;
    w.flush()
}

pub(crate) fn read_spec(r: &mut impl Read) -> io::Result<(InitSpec, Vec<u8>)> {
    let json = read_chunk(r, MAX_SPEC_JSON)?;
    let spec = serde_json::from_slice(&json)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad spec: {e}")))?;
    let payload = read_chunk(r, MAX_PAYLOAD)?;
    Ok((spec, payload))
}

fn read_chunk(r: &mut impl Read, max: u64) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("chunk of {len} bytes exceeds {max}"),
        ));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// Writes one report (a JSON line) to the status pipe.
pub(crate) fn send_report(w: &mut impl Write, report: &Report) -> io::Result<()> {
    let mut line = serde_json::to_vec(report).map_err(io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// The host's end of the status pipe, with a read buffer and timeouts.
#[derive(Debug)]
pub(crate) struct StatusReader {
    fd: File,
    buf: Vec<u8>,
    eof: bool,
}

/// What [`StatusReader::next`] found.
#[derive(Debug)]
pub(crate) enum Next {
    Report(Report),
    /// Every write end is closed: the init (and anything that inherited the pipe) is gone.
    Eof,
    TimedOut,
}

impl StatusReader {
    pub(crate) fn new(fd: OwnedFd) -> Self {
        StatusReader {
            fd: File::from(fd),
            buf: Vec::new(),
            eof: false,
        }
    }

    /// The next report, waiting at most `timeout`.
    pub(crate) fn next(&mut self, timeout: Duration) -> io::Result<Next> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.parse_buffered()? {
                return Ok(Next::Report(r));
            }
            if self.eof {
                return Ok(Next::Eof);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
            // SAFETY: `pfd` is one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if n == 0 {
                return Ok(Next::TimedOut);
            }
            let mut chunk = [0u8; 4096];
            match self.fd.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn parse_buffered(&mut self) -> io::Result<Option<Report>> {
        if self.buf.first() == Some(&EXEC_FAILED) {
            if self.buf.len() < 5 {
                return Ok(None);
            }
            let errno = i32::from_ne_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
            self.buf.drain(..5);
            return Ok(Some(Report::InitExecFailed(errno)));
        }
        let Some(nl) = self.buf.iter().position(|&b| b == b'\n') else {
            if self.eof && !self.buf.is_empty() {
                let junk = String::from_utf8_lossy(&self.buf).into_owned();
                self.buf.clear();
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("truncated status message {junk:?}"),
                ));
            }
            return Ok(None);
        };
        let line: Vec<u8> = self.buf.drain(..=nl).collect();
        serde_json::from_slice(&line[..nl]).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "bad status message {:?}: {e}",
                    String::from_utf8_lossy(&line)
                ),
            )
        })
    }
}
