//! Connected TCP sockets, kept through a checkpoint: the kernel's TCP repair mode reads a live
//! connection's state (sequence numbers, both queues' bytes, window, negotiated options) and
//! makes a fresh socket carry on the same connection without a handshake, so neither end sees
//! a reset.
//!
//! Where it runs: the epoch loop reads every process's connections ([`Connections`], one per
//! process of a tree) inside every pause *after* the output gate's epoch boundary
//! (`EpochHooks::on_pause`), so that every acknowledgement released with this epoch
//! acknowledges bytes the checkpoint holds (in memory, or in a receive queue read after it). A
//! one-shot checkpoint (`tardi snapshot`) carries none: without a gate, the process goes on
//! after it and its clients see what it sends and closes, which a restore of that moment would
//! contradict (a restored socket whose peer already took its FIN waits forever). One that ends
//! the service (`tardi snapshot --stop`, `capture::checkpoint_and_end`) carries them: the
//! packets to the sandbox are held from before the read, and the sockets are silenced
//! ([`silence`]) before the processes are killed. The restore child recreates each connection
//! with [`restore`] (`fds::recreate`).
//!
//! Status: **unfinished** (issue 28). Carried: established connections of every process of the
//! service (an nginx worker's, a PostgreSQL backend's), IPv4 and IPv6, and half-closed ones
//! (`FIN_WAIT1`, `FIN_WAIT2`, `CLOSE_WAIT`, `LAST_ACK`, `CLOSING`: [`fin`]), IPv4. Restored as
//! reset by the peer, as before, and counted: a half-closed IPv6 connection, a socket two
//! processes share (a connection between a PostgreSQL postmaster's `accept` and its child's taking it:
//! [`keep_carried`]), and any connection whose state could not be read or recreated. Not yet:
//! connections still in a listener's queue, and a cheap read of a busy connection: one that did
//! not move since the last pause costs two calls ([`reader`]), one that moved about fifteen, one
//! by one (batching them, e.g. through io_uring's socket commands, is not done).
//!
//! Kernel rules this relies on (Linux `net/ipv4/tcp.c`, `TCP_REPAIR` and friends):
//! - Repair mode needs `CAP_NET_ADMIN` over the socket's network namespace. While it is on,
//!   the socket sends nothing (data written is queued as if sent), and a `close` is silent.
//! - `TCP_QUEUE_SEQ` reads `rcv_nxt` (receive queue selected) or `write_seq` (send queue);
//!   on a fresh socket it sets where that queue starts. `SIOCINQ`/`SIOCOUTQ`/`SIOCOUTQNSD`
//!   give the unread, unacknowledged and unsent byte counts; `recv(MSG_PEEK)` with a queue
//!   selected reads that queue's bytes without consuming them.
//! - With a queue selected, `TCP_MAXSEG` reads the clamp the peer's MSS option set.
//! - `connect` in repair mode makes the socket established at once (no SYN). The negotiated
//!   options (`TCP_REPAIR_OPTIONS`) need the established state; `TCP_REPAIR_WINDOW` checks its
//!   values against `rcv_nxt`, so it comes after the receive queue is refilled.
//! - Writing with the receive queue selected appends to it (advancing `rcv_nxt`); writing with
//!   the send queue selected queues bytes as sent-but-unacknowledged, retransmitted later.
//! - Leaving repair mode with `TCP_REPAIR_OFF` sends a window probe (the peer answers with an
//!   acknowledgement, which restarts the flow at once); `TCP_REPAIR_OFF_NO_WP` sends nothing,
//!   which is what a capture of a live socket wants.
//! - `TCP_TIMESTAMP` reads our timestamp clock; setting it offsets the new socket's clock to
//!   continue from that value (the peer drops segments whose timestamp went back: PAWS).

use crate::image::{FdImage, FdKind, SocketImage, SocketState, TcpConn};
use crate::sys::{self, Pid, cvt_i as check};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

const TCP_REPAIR_ON: i32 = 1;
const TCP_REPAIR_OFF: i32 = 0;
const TCP_REPAIR_OFF_NO_WP: i32 = -1;
const TCP_NO_QUEUE: i32 = 0;
const TCP_RECV_QUEUE: i32 = 1;
const TCP_SEND_QUEUE: i32 = 2;
const SIOCINQ: libc::c_ulong = 0x541B;
const SIOCOUTQ: libc::c_ulong = 0x5411;
const SIOCOUTQNSD: libc::c_ulong = 0x894B;
const TCPOPT_MSS: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;
const TCPI_OPT_TIMESTAMPS: u8 = 1;
const TCPI_OPT_SACK: u8 = 2;
const TCPI_OPT_WSCALE: u8 = 4;
/// `tcpi_state` of an established connection.
pub use crate::image::TCP_ESTABLISHED as ESTABLISHED;
/// The largest queue a checkpoint carries (a socket buffer's ceiling is a few MiB).
pub use crate::image::TCP_MAX_QUEUE as MAX_QUEUE;

/// Why a connection's state could not be read or recreated.
#[derive(Debug, thiserror::Error)]
pub enum TcpError {
    /// A state this module does not carry (see [`fin::carried`]): the caller falls back to
    /// restoring the connection as reset, and says so.
    #[error("TCP state {0} cannot be carried (established and half-closed IPv4 ones are)")]
    State(u8),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> TcpError {
    move |source| TcpError::Io { what, source }
}

fn set(s: RawFd, name: i32, v: i32, what: &'static str) -> Result<(), TcpError> {
    sys::setsockopt_int(s, libc::IPPROTO_TCP, name, v).map_err(io_err(what))
}

/// Selects the queue (`TCP_RECV_QUEUE`, `TCP_SEND_QUEUE`, `TCP_NO_QUEUE`) that the next
/// repair-mode call on `s` reads or writes.
fn select(s: RawFd, queue: i32) -> Result<(), TcpError> {
    set(s, libc::TCP_REPAIR_QUEUE, queue, "selecting a repair queue")
}

fn get(s: RawFd, name: i32, what: &'static str) -> Result<i32, TcpError> {
    sys::getsockopt_int(s, libc::IPPROTO_TCP, name).map_err(io_err(what))
}

fn ioctl_int(s: RawFd, req: libc::c_ulong, what: &'static str) -> Result<usize, TcpError> {
    let mut v: libc::c_int = 0;
    // SAFETY: these ioctls write one int through the pointer, which points at `v`.
    check(unsafe { libc::ioctl(s, req, &mut v) }).map_err(io_err(what))?;
    Ok(v.max(0) as usize)
}

/// Reads `len` bytes of the selected queue without consuming them.
fn peek(s: RawFd, len: usize, what: &'static str) -> Result<Vec<u8>, TcpError> {
    if len > MAX_QUEUE {
        return Err(TcpError::Io {
            what,
            source: io::Error::other(format!("{len} bytes queued, more than a checkpoint takes")),
        });
    }
    let mut buf = vec![0u8; len];
    let mut got = 0;
    if len > 0 {
        // SAFETY: `buf` is writable for `len` bytes.
        let n = unsafe {
            libc::recv(
                s,
                buf.as_mut_ptr().cast(),
                len,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        got = sys::cvt(n as libc::c_long).map_err(io_err(what))? as usize;
    }
    if got != len {
        return Err(TcpError::Io {
            what,
            source: io::Error::other(format!("peeked {got} of {len} queued bytes")),
        });
    }
    Ok(buf)
}

/// A TCP option of `s` that is a structure, into `buf`: how many bytes the kernel wrote (it
/// writes at most `buf.len()`, fewer for a shorter structure of an older kernel).
fn get_bytes(s: RawFd, name: i32, buf: &mut [u8], what: &'static str) -> Result<usize, TcpError> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf`/`len` describe a writable buffer; the kernel truncates to it.
    check(unsafe {
        libc::getsockopt(
            s,
            libc::IPPROTO_TCP,
            name,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    })
    .map_err(io_err(what))?;
    Ok(len as usize)
}

/// `(state, options, snd_wscale, rcv_wscale)` from `TCP_INFO`.
fn info(s: RawFd) -> Result<(u8, u8, u8, u8), TcpError> {
    let mut buf = [0u8; 104];
    get_bytes(s, libc::TCP_INFO, &mut buf, "TCP_INFO")?;
    // struct tcp_info: u8 state, ca_state, retransmits, probes, backoff, options, then a byte
    // of two 4-bit fields, tcpi_snd_wscale in the low bits (little-endian bit-field order).
    Ok((buf[0], buf[5], buf[6] & 0xf, buf[6] >> 4))
}

/// Turns repair mode off when dropped (without a window probe), whatever the capture's fate.
struct Repairing(RawFd);

impl Drop for Repairing {
    fn drop(&mut self) {
        let _ = sys::setsockopt_int(self.0, libc::IPPROTO_TCP, libc::TCP_REPAIR_QUEUE, 0);
        let _ = sys::setsockopt_int(
            self.0,
            libc::IPPROTO_TCP,
            libc::TCP_REPAIR,
            TCP_REPAIR_OFF_NO_WP,
        );
    }
}

/// Reads the state of connected TCP socket `s` (a copy of the process's descriptor `fd`,
/// taken while the process is stopped). The socket is left as it was: repair mode is turned
/// off again without a probe, and nothing is consumed.
pub fn capture(fd: i32, s: RawFd) -> Result<TcpConn, TcpError> {
    let family =
        sys::getsockopt_int(s, libc::SOL_SOCKET, libc::SO_DOMAIN).map_err(io_err("SO_DOMAIN"))?;
    capture_as(fd, s, family)
}

/// [`capture`] of a socket whose address family the caller knows (one call fewer: the epoch
/// loop's reader has it from the descriptor's image).
pub(crate) fn capture_as(fd: i32, s: RawFd, family: i32) -> Result<TcpConn, TcpError> {
    let (state, options, snd_ws, rcv_ws) = info(s)?;
    if !fin::carried(state, family) {
        return Err(TcpError::State(state));
    }
    set(s, libc::TCP_REPAIR, TCP_REPAIR_ON, "TCP_REPAIR on")?;
    let _off = Repairing(s);

    select(s, TCP_RECV_QUEUE)?;
    // Past the peer's FIN, if it came (which `SIOCINQ` does not count: see `fin`).
    let rcv_nxt = get(s, libc::TCP_QUEUE_SEQ, "receive sequence")? as u32;
    let inq = ioctl_int(s, SIOCINQ, "unread bytes")?;
    let recv_queue = peek(s, inq, "reading the receive queue")?;
    let mss = get(s, libc::TCP_MAXSEG, "MSS clamp")? as u32;
    let their_fin = u32::from(fin::theirs(state));

    select(s, TCP_SEND_QUEUE)?;
    // Past our FIN, if it is queued; the counts include it while it is unacknowledged (and
    // the unsent one while it is unsent: it is the last thing queued).
    let write_seq = get(s, libc::TCP_QUEUE_SEQ, "send sequence")? as u32;
    let outq = ioctl_int(s, SIOCOUTQ, "unacknowledged bytes")?;
    let unsent = ioctl_int(s, SIOCOUTQNSD, "unsent bytes")?;
    let our_fin = usize::from(fin::ours_unacked(state));
    let send_queue = peek(s, outq.saturating_sub(our_fin), "reading the send queue")?;
    let unsent = unsent.saturating_sub(our_fin);

    // struct tcp_repair_window: five u32s.
    let mut raw = [0u8; 20];
    get_bytes(s, libc::TCP_REPAIR_WINDOW, &mut raw, "TCP_REPAIR_WINDOW")?;
    let window: [u32; 5] =
        std::array::from_fn(|i| u32::from_ne_bytes(raw[i * 4..i * 4 + 4].try_into().unwrap()));
    let timestamp = if options & TCPI_OPT_TIMESTAMPS != 0 {
        Some(get(s, libc::TCP_TIMESTAMP, "TCP_TIMESTAMP")? as u32)
    } else {
        None
    };
    Ok(TcpConn {
        fd,
        state,
        send_seq: write_seq.wrapping_sub(outq as u32),
        unsent: unsent.min(send_queue.len()) as u32,
        send_queue,
        recv_seq: rcv_nxt.wrapping_sub(inq as u32).wrapping_sub(their_fin),
        recv_queue,
        mss,
        wscale: (options & TCPI_OPT_WSCALE != 0).then_some((snd_ws, rcv_ws)),
        sack: options & TCPI_OPT_SACK != 0,
        timestamp,
        window,
    })
}

/// Writes all of `data` into the selected queue of `s` (a repair-mode write queues a chunk at
/// most as large as the socket buffer allows; the buffer was raised to hold the queue).
fn fill(s: RawFd, data: &[u8], what: &'static str) -> Result<(), TcpError> {
    let mut at = 0;
    while at < data.len() {
        let chunk = (data.len() - at).min(64 << 10);
        // SAFETY: reads `chunk` bytes of `data` from `at`, in bounds.
        let n = unsafe { libc::send(s, data[at..].as_ptr().cast(), chunk, libc::MSG_DONTWAIT) };
        at += sys::cvt(n as libc::c_long).map_err(io_err(what))? as usize;
    }
    Ok(())
}

/// Raises the socket buffer `opt` (`SO_SNDBUFFORCE` or `SO_RCVBUFFORCE`) to hold `bytes`
/// queued, if it is smaller (the kernel doubles the value given, for its bookkeeping).
fn room(s: RawFd, get_opt: i32, force_opt: i32, bytes: usize) -> Result<(), TcpError> {
    let have = sys::getsockopt_int(s, libc::SOL_SOCKET, get_opt).unwrap_or(0) as usize;
    let want = bytes.saturating_mul(2) + (64 << 10);
    if have < want {
        let v = i32::try_from(want).unwrap_or(i32::MAX);
        sys::setsockopt_int(s, libc::SOL_SOCKET, force_opt, v)
            .map_err(io_err("raising the socket buffer"))?;
    }
    Ok(())
}

/// A new socket carrying on connection `c` of socket `img` (its addresses and options), made
/// in the calling thread's network namespace, blocking, close-on-exec. The caller moves it to
/// its number and sets its status flags. The old socket must be gone (or this namespace be
/// another machine's): the new one takes over its addresses.
///
/// `probe`: leave repair mode with a window probe, so that the peer acknowledges at once and
/// both ends resume without waiting for a retransmission timeout.
pub fn restore(img: &SocketImage, c: &TcpConn, probe: bool) -> Result<OwnedFd, TcpError> {
    if !fin::carried(c.state, img.family) {
        return Err(TcpError::State(c.state));
    }
    // SAFETY: plain socket creation; the descriptor is owned at once.
    let s = unsafe {
        OwnedFd::from_raw_fd(
            check(libc::socket(
                img.family,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
            ))
            .map_err(io_err("socket"))?,
        )
    };
    let fd = s.as_raw_fd();
    // The options first: repair mode lets the socket take its address even where a listener
    // of the service holds the port (it sets `sk_reuse` to force), and `SO_REUSEADDR`, one of
    // the options, would set that back to an ordinary reuse, which a listener refuses.
    for &(l, n, v) in &img.options {
        sys::setsockopt_int(fd, l, n, v).map_err(io_err("socket option"))?;
    }
    set(fd, libc::TCP_REPAIR, TCP_REPAIR_ON, "TCP_REPAIR on")?;
    room(
        fd,
        libc::SO_SNDBUF,
        libc::SO_SNDBUFFORCE,
        c.send_queue.len(),
    )?;
    room(
        fd,
        libc::SO_RCVBUF,
        libc::SO_RCVBUFFORCE,
        c.recv_queue.len(),
    )?;
    // SAFETY: `local` and `peer` hold sockaddrs of their own length, as the kernel gave them.
    check(unsafe { libc::bind(fd, img.local.as_ptr().cast(), img.local.len() as u32) })
        .map_err(io_err("bind"))?;
    select(fd, TCP_SEND_QUEUE)?;
    // An acknowledged FIN of ours is put back as sent and then acknowledged (`fin`): the
    // queue starts at it, one before the first unacknowledged sequence number.
    let send_start = if fin::ours_acked(c.state) {
        c.send_seq.wrapping_sub(1)
    } else {
        c.send_seq
    };
    set(fd, libc::TCP_QUEUE_SEQ, send_start as i32, "send sequence")?;
    select(fd, TCP_RECV_QUEUE)?;
    set(
        fd,
        libc::TCP_QUEUE_SEQ,
        c.recv_seq as i32,
        "receive sequence",
    )?;
    select(fd, TCP_NO_QUEUE)?;
    // SAFETY: as above.
    check(unsafe { libc::connect(fd, img.peer.as_ptr().cast(), img.peer.len() as u32) })
        .map_err(io_err("connect"))?;

    let mut opts: Vec<[u32; 2]> = vec![[TCPOPT_MSS, c.mss]];
    if let Some((snd, rcv)) = c.wscale {
        opts.push([TCPOPT_WINDOW, u32::from(snd) | (u32::from(rcv) << 16)]);
    }
    if c.sack {
        opts.push([TCPOPT_SACK_PERM, 0]);
    }
    if c.timestamp.is_some() {
        opts.push([TCPOPT_TIMESTAMP, 0]);
    }
    // SAFETY: `opts` is an array of struct tcp_repair_opt {u32 opt_code; u32 opt_val}.
    check(unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_REPAIR_OPTIONS,
            opts.as_ptr().cast(),
            (opts.len() * 8) as libc::socklen_t,
        )
    })
    .map_err(io_err("TCP_REPAIR_OPTIONS"))?;
    if let Some(ts) = c.timestamp {
        set(fd, libc::TCP_TIMESTAMP, ts as i32, "TCP_TIMESTAMP")?;
    }

    select(fd, TCP_RECV_QUEUE)?;
    fill(fd, &c.recv_queue, "refilling the receive queue")?;
    let sent = c.send_queue.len() - (c.unsent as usize).min(c.send_queue.len());
    select(fd, TCP_SEND_QUEUE)?;
    fill(fd, &c.send_queue[..sent], "refilling the send queue")?;
    // The peer's FIN is not in `rcv_nxt` until it is played (`fin::put_back`): neither in the
    // window's `rcv_wup` (its right edge stays).
    let mut window = c.window;
    if fin::theirs(c.state) {
        window[4] = window[4].wrapping_sub(1);
        window[3] = window[3].wrapping_add(1);
    }
    // SAFETY: `window` is a struct tcp_repair_window (five u32s).
    check(unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_REPAIR_WINDOW,
            window.as_ptr().cast(),
            std::mem::size_of_val(&window) as libc::socklen_t,
        )
    })
    .map_err(io_err("TCP_REPAIR_WINDOW"))?;
    select(fd, TCP_NO_QUEUE)?;
    let off = if probe {
        TCP_REPAIR_OFF
    } else {
        TCP_REPAIR_OFF_NO_WP
    };
    if c.state == ESTABLISHED {
        set(fd, libc::TCP_REPAIR, off, "TCP_REPAIR off")?;
        // The bytes never sent go out as any write would.
        fill(fd, &c.send_queue[sent..], "sending the unsent bytes")?;
        return Ok(s);
    }
    // Half-closed: the bytes never sent come before our FIN, so they are queued first (out of
    // repair mode for the write, which may send them: they were never sent, so any time is
    // theirs), then the FINs are put back in repair mode.
    if sent < c.send_queue.len() {
        set(fd, libc::TCP_REPAIR, TCP_REPAIR_OFF_NO_WP, "TCP_REPAIR off")?;
        fill(fd, &c.send_queue[sent..], "sending the unsent bytes")?;
        set(fd, libc::TCP_REPAIR, TCP_REPAIR_ON, "TCP_REPAIR on")?;
    }
    fin::put_back(fd, c, &img.local, &img.peer)?;
    set(fd, libc::TCP_REPAIR, off, "TCP_REPAIR off")?;
    Ok(s)
}

/// Closes socket `s` without a word to its peer (no FIN, no reset): the connection lives on in
/// a socket [`restore`] makes.
pub fn close_silently(s: OwnedFd) -> io::Result<()> {
    sys::setsockopt_int(
        s.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_REPAIR,
        TCP_REPAIR_ON,
    )?;
    // SAFETY: closing a descriptor we own (taken out of the OwnedFd, so closed once).
    check(unsafe { libc::close(s.into_raw_fd()) })?;
    Ok(())
}

/// Puts the sockets of `conns` (descriptors of process `pid`, host PID) in repair mode, so that
/// their closing, when the process ends, says nothing to their peers. Returns the descriptors
/// that could not be (their peers will see them close).
pub fn silence(pid: Pid, conns: &[TcpConn]) -> Vec<(i32, TcpError)> {
    if conns.is_empty() {
        return Vec::new();
    }
    let pidfd = sys::pidfd_open(pid);
    conns
        .iter()
        .filter_map(|c| {
            let r = match &pidfd {
                Ok(p) => sys::pidfd_getfd(p, c.fd).map_err(io_err("pidfd_getfd")),
                Err(e) => Err(io_err("pidfd_open")(io::Error::new(
                    e.kind(),
                    e.to_string(),
                ))),
            };
            r.and_then(|s| {
                set(
                    s.as_raw_fd(),
                    libc::TCP_REPAIR,
                    TCP_REPAIR_ON,
                    "TCP_REPAIR on",
                )
            })
            .err()
            .map(|e| (c.fd, e))
        })
        .collect()
}

/// Connections restores reset because they could not carry them on, since this process
/// started (the instance's `tardi_instance_tcp_reset_at_restore_total`).
static RESET_AT_RESTORE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts one connection a restore reset instead of carrying it on.
pub(crate) fn count_reset_at_restore() {
    RESET_AT_RESTORE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// How many connections restores by this process reset instead of carrying them on.
pub fn reset_at_restore() -> u64 {
    RESET_AT_RESTORE.load(std::sync::atomic::Ordering::Relaxed)
}

mod fin;
mod reader;
pub use reader::{Captured, Connections};

/// Drops from `tcp` the connections whose descriptor is no longer a connected TCP socket of
/// its own among `fds` (an image's): one a process tree's processes share (a PostgreSQL postmaster
/// between its `accept` and its child's taking the connection) became a shared description
/// after it was read (`tree::share`), which a restore does not carry on. Returns how many
/// (their sockets are reset by a restore, as before).
pub fn keep_carried(fds: &[FdImage], tcp: &mut Vec<TcpConn>) -> u64 {
    let before = tcp.len();
    tcp.retain(|c| {
        fds.iter().any(|f| {
            f.fd == c.fd
                && matches!(&f.kind, FdKind::Socket(s) if s.state == SocketState::ConnectedTcp)
        })
    });
    (before - tcp.len()) as u64
}

#[cfg(test)]
mod tests;
