//! The epoch loop's reader of a process's connections, pause after pause: a connection that
//! did not move since the last pause is not read again.
//!
//! "Did not move" is decided from `TCP_INFO` and `SIOCINQ` (two calls instead of the fifteen of
//! a read in repair mode): the same socket (inode), state, bytes acknowledged and received,
//! segments in and out, unsent bytes, unread bytes and both windows. A connection moves only
//! through a packet in or out (counted in the segments) or through the process reading
//! (unread bytes) or writing (unsent bytes, or a segment out). Its timestamp clock moved on,
//! but nothing was sent with a newer value (no segment out), so the peer has seen none newer
//! than the one read last: restoring that one is safe.

use super::*;
use std::collections::{HashMap, HashSet};

/// What a connection looked like when it was last read whole.
#[derive(Debug)]
struct Seen {
    signature: [u64; 10],
    conn: TcpConn,
}

/// Reads a process's connections pause after pause (see the module doc); remembers which
/// descriptors it warned about, so that a connection that cannot be carried is said once in
/// the log, not every pause.
#[derive(Debug, Default)]
pub struct Connections {
    warned: HashSet<(Pid, i32)>,
    seen: HashMap<(Pid, i32), Seen>,
}

/// What [`Connections::capture`] read.
#[derive(Debug, Default)]
pub struct Captured {
    pub conns: Vec<TcpConn>,
    /// Connected sockets that a restore resets (their state could not be read, or is one not
    /// carried yet).
    pub reset: u64,
    /// Connections read whole in repair mode (the others had not moved since the last pause).
    pub read: u64,
}

/// The socket's inode and what of its state moves with traffic (see the module doc).
fn signature(s: RawFd) -> Result<(u8, [u64; 10]), TcpError> {
    let mut buf = [0u8; 240];
    let len = get_bytes(s, libc::TCP_INFO, &mut buf, "TCP_INFO")?;
    if len < 236 {
        // A kernel without tcpi_snd_wnd / tcpi_rcv_wnd (before 5.4 and 6.x): no signature,
        // every pause reads the connection whole.
        return Ok((buf[0], [u64::MAX; 10]));
    }
    let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().unwrap());
    let u32_at = |o: usize| u64::from(u32::from_le_bytes(buf[o..o + 4].try_into().unwrap()));
    // SAFETY: `st` is plain data the kernel fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one struct stat into `st`.
    check(unsafe { libc::fstat(s, &mut st) }).map_err(io_err("fstat"))?;
    let inq = ioctl_int(s, SIOCINQ, "unread bytes")? as u64;
    Ok((
        buf[0],
        [
            st.st_ino,
            u64::from(buf[0]),
            u64_at(120), // tcpi_bytes_acked
            u64_at(128), // tcpi_bytes_received
            u32_at(136), // tcpi_segs_out
            u32_at(140), // tcpi_segs_in
            u32_at(144), // tcpi_notsent_bytes
            inq,
            u32_at(228), // tcpi_snd_wnd
            u32_at(232), // tcpi_rcv_wnd
        ],
    ))
}

impl Connections {
    /// Reads the connection of every connected TCP socket among `fds`, descriptors of stopped
    /// process `pid`, whole when it moved since the last call, else as it was then. Never
    /// fails: a connection that cannot be read is left out (a restore resets it) and counted.
    pub fn capture(&mut self, pid: Pid, fds: &[FdImage]) -> Captured {
        let mut out = Captured::default();
        let connected: Vec<&FdImage> = fds
            .iter()
            .filter(
                |f| matches!(&f.kind, FdKind::Socket(s) if s.state == SocketState::ConnectedTcp),
            )
            .collect();
        self.seen
            .retain(|&(p, fd), _| p != pid || connected.iter().any(|f| f.fd == fd));
        let mut pidfd = None;
        for f in connected {
            let key = (pid, f.fd);
            let r = pidfd
                .get_or_insert_with(|| sys::pidfd_open(pid))
                .as_ref()
                .map_err(|e| TcpError::Io {
                    what: "pidfd",
                    source: io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(0)),
                })
                .and_then(|p| sys::pidfd_getfd(p, f.fd).map_err(io_err("pidfd_getfd")))
                .and_then(|dup| {
                    let (state, sig) = signature(dup.as_raw_fd())?;
                    match self.seen.get(&key) {
                        Some(s) if s.conn.state == state && s.signature == sig => {
                            Ok(s.conn.clone())
                        }
                        _ => {
                            self.seen.remove(&key);
                            let family = match &f.kind {
                                FdKind::Socket(sock) => sock.family,
                                _ => libc::AF_UNSPEC,
                            };
                            let conn = capture_as(f.fd, dup.as_raw_fd(), family)?;
                            out.read += 1;
                            // Remembered with the signature taken before the read: anything
                            // that moves during the read or after it changes the next one.
                            self.seen.insert(
                                key,
                                Seen {
                                    signature: sig,
                                    conn: conn.clone(),
                                },
                            );
                            Ok(conn)
                        }
                    }
                });
            match r {
                Ok(c) => out.conns.push(c),
                Err(e) => {
                    out.reset += 1;
                    if self.warned.insert(key) {
                        tracing::warn!(
                            pid,
                            fd = f.fd,
                            "a TCP connection will be reset by a restore: {e}"
                        );
                    }
                }
            }
        }
        out
    }
}
