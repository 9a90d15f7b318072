//! The part of the NFQUEUE netlink protocol (`nfnetlink_queue`) a gate needs: bind queues,
//! read packet ids and lengths, and send batch verdicts.
//!
//! Kernel rules this relies on (`net/netfilter/nfnetlink_queue.c`):
//! - A queue is owned by one netlink port id (one socket). Verdicts for it are accepted only from
//!   that socket (`-EPERM` otherwise), so the reader thread and the threads that release share one
//!   socket: the reader only receives, the others only send (both are safe concurrently).
//! - One socket may own several queues; every message names its queue in `nfgenmsg.res_id`.
//! - Packet ids are assigned per queue, in enqueue order, starting at 1 (`++id_sequence`), and
//!   messages reach the socket in that order. A batch verdict applies to every queued packet with
//!   an id up to and including the given one (wrap-aware comparison), in queue order.
//! - Without `NFQA_CFG_F_FAIL_OPEN` a packet that cannot be queued (queue full, socket receive
//!   buffer full) is dropped, never accepted; a socket closing flushes its queues with `NF_DROP`;
//!   and a queue rule without `bypass` drops packets when no socket is bound. So a crash of the
//!   process loses held output but never leaks it.
//! - With `NFQNL_COPY_META` the kernel reports no length, so the queues use `NFQNL_COPY_PACKET`
//!   with a 1-byte copy range: the length then arrives in `NFQA_CAP_LEN`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::error::{NetfilterError, Result};

/// `NF_DROP` / `NF_ACCEPT` verdicts (`include/uapi/linux/netfilter.h`).
pub(crate) const NF_DROP: u32 = 0;
pub(crate) const NF_ACCEPT: u32 = 1;

// include/uapi/linux/netfilter/nfnetlink.h, nfnetlink_queue.h
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFNETLINK_V0: u8 = 0;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CAP_LEN: u16 = 13;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
const NFQA_CFG_F_FAIL_OPEN: u32 = 0x01;
const NFQA_CFG_F_CONNTRACK: u32 = 0x02;
const NFQA_CFG_F_GSO: u32 = 0x04;
const NFQA_CFG_F_UID_GID: u32 = 0x08;
const NFQA_CFG_F_SECCTX: u32 = 0x10;
const NLA_TYPE_MASK: u16 = 0x3fff;

const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

/// Bytes of each packet copied to us. We need none, but a copy range below the packet's length
/// is what makes the kernel send the length (`NFQA_CAP_LEN`).
const COPY_RANGE: u32 = 1;

/// Datagrams read per `recvmmsg`, and the room for each. A packet message is ~100 bytes
/// (header, ids, interfaces, hardware address, timestamp, 1 payload byte, length).
const SLOTS: usize = 128;
const SLOT_SIZE: usize = 1024;

/// What the kernel told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A packet was queued on `queue` under `id`; `len` is its full length in bytes.
    Packet { queue: u16, id: u32, len: u32 },
    /// A request of ours with sequence number `seq` failed (`errno` > 0) or was acknowledged
    /// (`errno` == 0).
    Ack { seq: u32, errno: i32 },
}

/// `a` is after `b` in the kernel's wrapping packet-id order (`nfq_id_after`).
pub(crate) fn id_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// A `NETLINK_NETFILTER` socket owning one or more queues. Non-blocking.
#[derive(Debug)]
pub(crate) struct QueueSocket {
    fd: OwnedFd,
    seq: AtomicU32,
}

impl QueueSocket {
    /// Opens the socket with a receive buffer of `rcvbuf` bytes (`SO_RCVBUFFORCE`: beyond
    /// `rmem_max`, needs CAP_NET_ADMIN).
    pub(crate) fn open(rcvbuf: usize) -> Result<QueueSocket> {
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_NETFILTER,
            )
        };
        if fd < 0 {
            return Err(NetfilterError::last_os(
                "socket(AF_NETLINK, NETLINK_NETFILTER)",
            ));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_nl is valid; nl_pid 0 lets the kernel pick the port id.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `addr` is a valid sockaddr_nl of the length given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(NetfilterError::last_os("bind(netlink)"));
        }
        let size = libc::c_int::try_from(rcvbuf).unwrap_or(libc::c_int::MAX);
        // SAFETY: `size` is a c_int that outlives the call; the length matches.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(NetfilterError::last_os("setsockopt(SO_RCVBUFFORCE)"));
        }
        Ok(QueueSocket {
            fd,
            seq: AtomicU32::new(1),
        })
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Binds `queue` to this socket and configures it: 1-byte copies (for the length), at most
    /// `maxlen` packets held by the kernel, GSO packets unsegmented, and fail-open explicitly
    /// off. Waits for the kernel's acknowledgement. Packet messages that arrive meanwhile (from
    /// queues bound earlier) are appended to `early`.
    pub(crate) fn bind_queue(&self, queue: u16, maxlen: u32, early: &mut Vec<Event>) -> Result<()> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut m = Msg::new(
            NFQNL_MSG_CONFIG,
            (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16,
            seq,
            queue,
        );
        // struct nfqnl_msg_config_cmd { u8 command; u8 _pad; __be16 pf; } (pf unused by BIND)
        m.attr(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]);
        // struct nfqnl_msg_config_params { __be32 copy_range; u8 copy_mode; } __packed
        let mut params = COPY_RANGE.to_be_bytes().to_vec();
        params.push(NFQNL_COPY_PACKET);
        m.attr(NFQA_CFG_PARAMS, &params);
        m.attr(NFQA_CFG_QUEUE_MAXLEN, &maxlen.to_be_bytes());
        // The mask names every flag we have an opinion on: fail-open must be off (it would let
        // packets through when the queue or our socket is full), GSO on (no segmentation cost,
        // we never look at the payload), the rest off.
        let mask = NFQA_CFG_F_FAIL_OPEN
            | NFQA_CFG_F_CONNTRACK
            | NFQA_CFG_F_GSO
            | NFQA_CFG_F_UID_GID
            | NFQA_CFG_F_SECCTX;
        m.attr(NFQA_CFG_FLAGS, &NFQA_CFG_F_GSO.to_be_bytes());
        m.attr(NFQA_CFG_MASK, &mask.to_be_bytes());
        self.send(&m.finish())
            .map_err(|source| NetfilterError::QueueConfig {
                what: "binding",
                queue,
                source,
            })?;
        self.wait_ack(seq, early)
            .map_err(|source| NetfilterError::QueueConfig {
                what: "binding",
                queue,
                source,
            })
    }

    /// Waits (up to 2 s) for the acknowledgement of request `seq`.
    fn wait_ack(&self, seq: u32, early: &mut Vec<Event>) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut bufs = RecvBufs::new();
        loop {
            let mut result = None;
            let n = match self.recv(&mut bufs, &mut |ev| match ev {
                Event::Ack { seq: s, errno } if s == seq => result = Some(errno),
                Event::Packet { .. } => early.push(ev),
                Event::Ack { seq: s, errno } => {
                    tracing::warn!(seq = s, errno, "unexpected netlink acknowledgement")
                }
            }) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => return Err(e),
            };
            match result {
                Some(0) => return Ok(()),
                Some(errno) => return Err(io::Error::from_raw_os_error(errno)),
                None => {}
            }
            if n == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no acknowledgement from the kernel within 2 s",
                    ));
                }
                poll_in(self.raw_fd(), None, left)?;
            }
        }
    }

    /// Sends one batch verdict: `verdict` for every packet of `queue` with an id up to `id`.
    /// The kernel carries it out inside this call (an accepted packet continues through the
    /// stack on this thread). Errors the kernel finds come back later as an [`Event::Ack`] on
    /// the receiving side.
    pub(crate) fn verdict_batch(&self, queue: u16, verdict: u32, id: u32) -> io::Result<()> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut m = Msg::new(
            NFQNL_MSG_VERDICT_BATCH,
            libc::NLM_F_REQUEST as u16,
            seq,
            queue,
        );
        // struct nfqnl_msg_verdict_hdr { __be32 verdict; __be32 id; }
        let mut hdr = verdict.to_be_bytes().to_vec();
        hdr.extend_from_slice(&id.to_be_bytes());
        m.attr(NFQA_VERDICT_HDR, &hdr);
        self.send(&m.finish())
    }

    fn send(&self, buf: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: `buf` is valid for `buf.len()` bytes; an unconnected netlink socket sends
            // to the kernel.
            let rc = unsafe { libc::send(self.raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
            if rc >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Reads every datagram available now (up to [`SLOTS`]) with one `recvmmsg`, passing each
    /// event to `on_event`; returns the number of datagrams. `WouldBlock` when there is none.
    /// `ENOBUFS` means the receive buffer overflowed and the kernel dropped messages (and so
    /// their packets).
    pub(crate) fn recv(
        &self,
        bufs: &mut RecvBufs,
        on_event: &mut dyn FnMut(Event),
    ) -> io::Result<usize> {
        let n = bufs.recvmmsg(self.raw_fd())?;
        for i in 0..n {
            let (from, flags, data) = bufs.datagram(i);
            if from != 0 {
                // Only the kernel (port 0) speaks for the queue; ignore anything else.
                tracing::warn!(from, "ignoring a netlink message not sent by the kernel");
                continue;
            }
            if flags & libc::MSG_TRUNC != 0 {
                tracing::warn!("netlink message truncated; ignoring it");
                continue;
            }
            parse(data, on_event);
        }
        Ok(n)
    }
}

/// Waits until `fd` (or `also`, when given) is readable or `timeout` passes. Returns whether
/// `also` is readable.
pub(crate) fn poll_in(fd: RawFd, also: Option<RawFd>, timeout: Duration) -> io::Result<bool> {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: also.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `fds` is an array of two valid pollfd structs (a negative fd is ignored).
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(fds[1].revents != 0)
}

/// Receive buffers for [`QueueSocket::recv`], reused between calls.
pub(crate) struct RecvBufs {
    data: Vec<u8>,
    addrs: Vec<libc::sockaddr_nl>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs`/`hdrs` only ever point into `data`/`addrs` of the same
// value and are rebuilt before each use; nothing is shared between threads.
unsafe impl Send for RecvBufs {}

impl RecvBufs {
    pub(crate) fn new() -> RecvBufs {
        RecvBufs {
            data: vec![0; SLOTS * SLOT_SIZE],
            // SAFETY: an all-zero sockaddr_nl is a valid value.
            addrs: vec![unsafe { std::mem::zeroed() }; SLOTS],
            iovs: Vec::with_capacity(SLOTS),
            hdrs: Vec::with_capacity(SLOTS),
        }
    }

    fn recvmmsg(&mut self, fd: RawFd) -> io::Result<usize> {
        self.iovs.clear();
        self.hdrs.clear();
        for (slot, addr) in self.data.chunks_exact_mut(SLOT_SIZE).zip(&mut self.addrs) {
            self.iovs.push(libc::iovec {
                iov_base: slot.as_mut_ptr().cast(),
                iov_len: SLOT_SIZE,
            });
            // SAFETY: an all-zero msghdr is valid; the fields that matter are set below.
            let mut hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
            hdr.msg_hdr.msg_name = (addr as *mut libc::sockaddr_nl).cast();
            hdr.msg_hdr.msg_namelen = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            self.hdrs.push(hdr);
        }
        for (hdr, iov) in self.hdrs.iter_mut().zip(&mut self.iovs) {
            hdr.msg_hdr.msg_iov = iov;
            hdr.msg_hdr.msg_iovlen = 1;
        }
        loop {
            // SAFETY: every header points at its own iovec (a distinct slot of `data`) and
            // address, all alive and unmoved during the call; `SLOTS` headers exist.
            let rc = unsafe {
                libc::recvmmsg(
                    fd,
                    self.hdrs.as_mut_ptr(),
                    SLOTS as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if rc >= 0 {
                return Ok(rc as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Sender port id, flags and bytes of datagram `i` of the last `recvmmsg`.
    fn datagram(&self, i: usize) -> (u32, libc::c_int, &[u8]) {
        let hdr = &self.hdrs[i];
        let len = (hdr.msg_len as usize).min(SLOT_SIZE);
        let data = &self.data[i * SLOT_SIZE..i * SLOT_SIZE + len];
        (self.addrs[i].nl_pid, hdr.msg_hdr.msg_flags, data)
    }
}

/// A netlink request under construction: `nlmsghdr`, `nfgenmsg`, attributes.
struct Msg(Vec<u8>);

impl Msg {
    fn new(msg_type: u16, flags: u16, seq: u32, queue: u16) -> Msg {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, set by finish()
        b.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | msg_type).to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel fills in ours
        // struct nfgenmsg { u8 nfgen_family; u8 version; __be16 res_id; }
        b.extend_from_slice(&[libc::AF_UNSPEC as u8, NFNETLINK_V0]);
        b.extend_from_slice(&queue.to_be_bytes());
        Msg(b)
    }

    fn attr(&mut self, ty: u16, data: &[u8]) {
        let len = (4 + data.len()) as u16;
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.0.extend_from_slice(data);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[..4].copy_from_slice(&len.to_ne_bytes());
        self.0
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses the netlink messages of one datagram. Malformed input is skipped, never trusted.
pub(crate) fn parse(mut buf: &[u8], on_event: &mut dyn FnMut(Event)) {
    while buf.len() >= NLMSG_HDRLEN {
        let Some(len) = u32_at(buf, 0).map(|l| l as usize) else {
            return;
        };
        if len < NLMSG_HDRLEN || len > buf.len() {
            tracing::warn!(
                len,
                "malformed netlink message; ignoring the rest of the datagram"
            );
            return;
        }
        let msg = &buf[..len];
        let ty = u16_at(msg, 4).unwrap_or(0);
        if ty == libc::NLMSG_ERROR as u16 {
            // struct nlmsgerr { int error; struct nlmsghdr msg; ... }
            if let (Some(err), Some(seq)) = (u32_at(msg, NLMSG_HDRLEN), u32_at(msg, 16 + 4 + 8)) {
                on_event(Event::Ack {
                    seq,
                    errno: -(err as i32),
                });
            }
        } else if ty == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET {
            if let Some(ev) = parse_packet(msg) {
                on_event(ev);
            } else {
                tracing::warn!("NFQUEUE packet message without a packet header; ignoring it");
            }
        }
        // NLMSG_NOOP, NLMSG_DONE and anything else: nothing to do.
        let next = len.next_multiple_of(4).min(buf.len());
        buf = &buf[next..];
    }
}

fn parse_packet(msg: &[u8]) -> Option<Event> {
    let queue = u16::from_be_bytes(
        msg.get(NLMSG_HDRLEN + 2..NLMSG_HDRLEN + 4)?
            .try_into()
            .ok()?,
    );
    let mut attrs = msg.get(NLMSG_HDRLEN + NFGENMSG_LEN..)?;
    let (mut id, mut cap_len, mut payload_len) = (None, None, 0);
    while attrs.len() >= 4 {
        let alen = u16_at(attrs, 0)? as usize;
        let aty = u16_at(attrs, 2)? & NLA_TYPE_MASK;
        if alen < 4 || alen > attrs.len() {
            return None;
        }
        let data = &attrs[4..alen];
        match aty {
            // struct nfqnl_msg_packet_hdr { __be32 packet_id; __be16 hw_protocol; u8 hook; }
            NFQA_PACKET_HDR => id = be32_at(data, 0),
            NFQA_CAP_LEN => cap_len = be32_at(data, 0),
            NFQA_PAYLOAD => payload_len = data.len() as u32,
            _ => {}
        }
        attrs = &attrs[alen.next_multiple_of(4).min(attrs.len())..];
    }
    Some(Event::Packet {
        queue,
        id: id?,
        // CAP_LEN is present when the packet is longer than the copy range.
        len: cap_len.unwrap_or(payload_len),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet_msg(queue: u16, id: u32, cap_len: Option<u32>) -> Vec<u8> {
        let mut m = Msg::new(NFQNL_MSG_PACKET, 0, 0, queue);
        let mut hdr = id.to_be_bytes().to_vec();
        hdr.extend_from_slice(&[0x08, 0x00, 2]);
        m.attr(NFQA_PACKET_HDR, &hdr);
        m.attr(NFQA_PAYLOAD, &[0x45]);
        if let Some(l) = cap_len {
            m.attr(NFQA_CAP_LEN, &l.to_be_bytes());
        }
        m.finish()
    }

    fn events(buf: &[u8]) -> Vec<Event> {
        let mut v = Vec::new();
        parse(buf, &mut |e| v.push(e));
        v
    }

    #[test]
    fn parses_packets_and_errors() {
        let mut dgram = packet_msg(7, 42, Some(1500));
        dgram.extend(packet_msg(7, 43, None));
        assert_eq!(
            events(&dgram),
            vec![
                Event::Packet {
                    queue: 7,
                    id: 42,
                    len: 1500
                },
                Event::Packet {
                    queue: 7,
                    id: 43,
                    len: 1
                }
            ]
        );
        // nlmsgerr: error -EPERM, echoing a request with seq 9
        let mut err = Vec::new();
        err.extend_from_slice(&36u32.to_ne_bytes());
        err.extend_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        err.extend_from_slice(&[0; 10]);
        err.extend_from_slice(&(-libc::EPERM).to_ne_bytes());
        err.extend_from_slice(&[0; 8]);
        err.extend_from_slice(&9u32.to_ne_bytes());
        err.extend_from_slice(&[0; 4]);
        assert_eq!(
            events(&err),
            vec![Event::Ack {
                seq: 9,
                errno: libc::EPERM
            }]
        );
    }

    #[test]
    fn malformed_input_is_ignored() {
        let good = packet_msg(1, 5, None);
        for cut in 0..good.len() {
            let mut short = good[..cut].to_vec();
            if short.len() >= 4 {
                short[..4].copy_from_slice(&(cut as u32).to_ne_bytes());
            }
            // Must not panic; a cut inside the attributes yields no packet or a valid one.
            let _ = events(&short);
        }
        let mut huge = good.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(events(&huge).is_empty());
    }

    #[test]
    fn wrapping_id_order() {
        assert!(id_after(2, 1));
        assert!(!id_after(1, 1));
        assert!(id_after(3, u32::MAX));
        assert!(!id_after(u32::MAX, 3));
    }

    #[test]
    fn verdict_message_layout() {
        let mut m = Msg::new(NFQNL_MSG_VERDICT_BATCH, 1, 5, 0x0102);
        m.attr(NFQA_VERDICT_HDR, &[0, 0, 0, 1, 0, 0, 0, 9]);
        let b = m.finish();
        assert_eq!(b.len(), 16 + 4 + 12);
        assert_eq!(u32_at(&b, 0), Some(32));
        assert_eq!(u16_at(&b, 4), Some(0x0303));
        assert_eq!(&b[18..20], &[1, 2]);
    }
}
