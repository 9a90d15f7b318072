//! Half-closed connections: the states in which one end or both sent their FIN while the
//! service still holds the socket (a client that shut down its writing and waits for the
//! reply, a server's lingering close, a server that shut down its writing).
//!
//! A FIN takes a sequence number but no byte of a queue, and repair mode cannot write one: a
//! restored socket is made established, with its queues, and then each FIN is put back the
//! way it came:
//! - ours (`FIN_WAIT1`, `FIN_WAIT2`, `CLOSING`, `LAST_ACK`): `shutdown(SHUT_WR)` in repair
//!   mode queues it without sending it; with the send queue selected it counts as sent, which
//!   is what an acknowledged one needs before its acknowledgement is played ([`inject`]);
//! - the peer's (`CLOSE_WAIT`, `LAST_ACK`, `CLOSING`): a segment with FIN from the peer's
//!   address is played to the socket through a raw socket ([`inject`]), as the peer sent it.
//!   It comes over loopback (the address is the sandbox's own), so neither the output gate
//!   nor the wire sees it.
//!
//! The order follows the states' history: in `CLOSING` ours went first, in `LAST_ACK` the
//! peer's. Kernel rules relied on (Linux `net/ipv4/tcp.c`, `tcp_input.c`): `SIOCINQ` does not
//! count a received FIN, `TCP_QUEUE_SEQ` of the receive queue (`rcv_nxt`) does; `SIOCOUTQ`
//! and `SIOCOUTQNSD` count an unacknowledged FIN of ours, and `TCP_QUEUE_SEQ` of the send
//! queue (`write_seq`) is past it; `TCP_REPAIR_WINDOW` refuses an `rcv_wup` past `rcv_nxt`, so
//! the peer's FIN is taken out of it until that FIN is played; a segment arriving in repair
//! mode is processed as any other (only sending is held back).
//!
//! IPv4 only: an IPv6 connection in one of these states is reset by a restore, as before.

use super::*;

pub(super) const FIN_WAIT1: u8 = 4;
pub(super) const FIN_WAIT2: u8 = 5;
pub(super) const CLOSE_WAIT: u8 = 8;
pub(super) const LAST_ACK: u8 = 9;
pub(super) const CLOSING: u8 = 11;

/// A state a checkpoint carries (`family`: the socket's address family): one of the image's
/// `TCP_CARRIED_STATES`, the half-closed ones over IPv4 only.
pub(super) fn carried(state: u8, family: i32) -> bool {
    state == ESTABLISHED
        || (family == libc::AF_INET && crate::image::TCP_CARRIED_STATES.contains(&state))
}

/// Our FIN is queued and not yet acknowledged.
pub(super) fn ours_unacked(state: u8) -> bool {
    matches!(state, FIN_WAIT1 | CLOSING | LAST_ACK)
}

/// Our FIN was acknowledged (the peer may still send).
pub(super) fn ours_acked(state: u8) -> bool {
    state == FIN_WAIT2
}

/// The peer's FIN was received.
pub(super) fn theirs(state: u8) -> bool {
    matches!(state, CLOSE_WAIT | LAST_ACK | CLOSING)
}

/// `shutdown(SHUT_WR)` of repair-mode socket `s`: our FIN queued, as sent if `acked` (its
/// acknowledgement is played next).
fn shut(s: RawFd, acked: bool) -> Result<(), TcpError> {
    if acked {
        select(s, TCP_SEND_QUEUE)?;
    }
    // SAFETY: plain shutdown of a socket we own.
    check(unsafe { libc::shutdown(s, libc::SHUT_WR) }).map_err(io_err("shutdown (our FIN)"))?;
    select(s, TCP_NO_QUEUE)
}

/// Puts back the FINs of connection `c` on the restored socket `s` (established, in repair
/// mode, queues and window set). `local`/`peer`: the socket's addresses.
pub(super) fn put_back(s: RawFd, c: &TcpConn, local: &[u8], peer: &[u8]) -> Result<(), TcpError> {
    // The next byte the peer sends, and the first byte of ours it has not acknowledged.
    let rcv_nxt = c.recv_seq.wrapping_add(c.recv_queue.len() as u32);
    let snd_una = c.send_seq;
    // Our FIN went first.
    if matches!(c.state, FIN_WAIT1 | FIN_WAIT2 | CLOSING) {
        shut(s, ours_acked(c.state))?;
    }
    if theirs(c.state) {
        // (Never with ours acknowledged: that state would be TIME_WAIT, not carried.)
        inject(local, peer, rcv_nxt, snd_una, FIN | ACK, c)?;
    }
    // Theirs went first.
    if c.state == LAST_ACK {
        shut(s, false)?;
    }
    if ours_acked(c.state) {
        // `snd_una` is past our FIN: the peer's acknowledgement of it.
        inject(local, peer, rcv_nxt, snd_una, ACK, c)?;
    }
    Ok(())
}

const FIN: u8 = 0x01;
const ACK: u8 = 0x10;

/// Plays a segment from the peer (`peer` → `local`, raw sockaddrs) with `flags`, sequence
/// `seq` and acknowledgement `ack`, no data and no options, through a raw socket.
fn inject(
    local: &[u8],
    peer: &[u8],
    seq: u32,
    ack: u32,
    flags: u8,
    c: &TcpConn,
) -> Result<(), TcpError> {
    let (Some((dst, dport)), Some((src, sport))) = (v4(local), v4(peer)) else {
        return Err(TcpError::Io {
            what: "playing the peer's FIN",
            source: io::Error::other("not an IPv4 connection"),
        });
    };
    // The window the peer advertised, in its units.
    let scale = c.wscale.map_or(0, |(snd, _)| snd);
    let window = (c.window[1] >> scale).min(0xffff) as u16;
    let packet = segment(src, dst, sport, dport, seq, ack, flags, window);
    // SAFETY: plain socket creation; the descriptor is owned at once.
    let raw = unsafe {
        OwnedFd::from_raw_fd(
            check(libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_RAW,
            ))
            .map_err(io_err("raw socket"))?,
        )
    };
    // SAFETY: sockaddr_in is plain data.
    let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    to.sin_family = libc::AF_INET as libc::sa_family_t;
    to.sin_addr.s_addr = u32::from_ne_bytes(dst);
    // SAFETY: `packet` is readable for its length; `to` is a sockaddr_in of its size.
    let n = unsafe {
        libc::sendto(
            raw.as_raw_fd(),
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (&raw const to).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    sys::cvt(n as libc::c_long).map_err(io_err("sending the peer's segment"))?;
    Ok(())
}

/// The address and port of a raw `sockaddr_in` (in network order as the kernel wrote it).
fn v4(sa: &[u8]) -> Option<([u8; 4], u16)> {
    let family = i32::from(u16::from_ne_bytes(sa.get(0..2)?.try_into().ok()?));
    (family == libc::AF_INET).then_some(())?;
    let port = u16::from_be_bytes(sa.get(2..4)?.try_into().ok()?);
    Some((sa.get(4..8)?.try_into().ok()?, port))
}

/// An IPv4 packet carrying a TCP segment without data or options, checksums filled in.
#[allow(clippy::too_many_arguments)]
pub(super) fn segment(
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
) -> [u8; 40] {
    let mut p = [0u8; 40];
    p[0] = 0x45; // version 4, header of 5 words
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64; // TTL
    p[9] = libc::IPPROTO_TCP as u8;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    let ip = checksum(&p[..20], 0);
    p[10..12].copy_from_slice(&ip.to_be_bytes());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4; // header of 5 words
    t[13] = flags;
    t[14..16].copy_from_slice(&window.to_be_bytes());
    // The pseudo-header: addresses, protocol, TCP length.
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src);
    pseudo[4..8].copy_from_slice(&dst);
    pseudo[9] = libc::IPPROTO_TCP as u8;
    pseudo[10..12].copy_from_slice(&20u16.to_be_bytes());
    let sum = checksum(&p[20..], sum_words(&pseudo));
    p[36..38].copy_from_slice(&sum.to_be_bytes());
    p
}

/// The one's-complement sum of `b`'s 16-bit words (big-endian), not folded.
fn sum_words(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|w| u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0)))
        .sum()
}

/// The Internet checksum of `b`, starting from the partial sum `init`.
fn checksum(b: &[u8], init: u32) -> u16 {
    let mut s = init + sum_words(b);
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment's checksums verify: summed with them, each header comes to 0xffff.
    #[test]
    fn a_played_segment_has_valid_checksums() {
        let p = segment([10, 0, 0, 1], [10, 0, 0, 2], 4321, 80, 7, 9, FIN | ACK, 512);
        assert_eq!(checksum(&p[..20], 0), 0, "IP header");
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&[10, 0, 0, 1]);
        pseudo[4..8].copy_from_slice(&[10, 0, 0, 2]);
        pseudo[9] = 6;
        pseudo[11] = 20;
        assert_eq!(checksum(&p[20..], sum_words(&pseudo)), 0, "TCP segment");
        assert_eq!(p[33], FIN | ACK);
    }
}
