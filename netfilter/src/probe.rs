//! Tells the clients of a taken-over service, at once, that their TCP connections are gone.
//!
//! A restore cannot keep TCP connections (the new primary's kernel has none of their state), so
//! the restored service's connected sockets are reset. Their clients do not know: each learns it
//! only when its next segment reaches the new primary and is answered with a reset, that is after
//! its retransmission timeout (at least 200 ms on Linux, doubling with each loss) if a request
//! was lost with the old primary, or whenever it next sends.
//!
//! [`probe_clients`] shortens that to a round trip. From the service's address it sends each
//! client one acknowledgement whose sequence number is outside the client's receive window. The
//! client's kernel answers an unacceptable segment with an acknowledgement of its own (RFC 793
//! §3.9; RFC 5961 §5, rate-limited per connection to one every 500 ms by Linux); that reaches
//! the new primary's sandbox, which has no socket for it and answers with a reset carrying
//! exactly the sequence number the client expects, so the client's connection fails now and it
//! reconnects. The reset is ordinary output of the sandbox: the output gate releases it with its
//! epoch, like any reply. The probe itself carries no data and changes no state anywhere.
//!
//! IPv4 only (the probe is built by hand on a raw socket); an IPv6 connection is skipped.

use crate::error::{NetfilterError, Result};
use std::net::{SocketAddr, SocketAddrV4};

/// Sends one probe per connection (`(service side, client side)`), from the calling thread's
/// network namespace (the one with the route to the clients). Returns how many were sent.
pub fn probe_clients(conns: &[(SocketAddr, SocketAddr)]) -> Result<usize> {
    let v4: Vec<(SocketAddrV4, SocketAddrV4)> = conns
        .iter()
        .filter_map(|c| match c {
            (SocketAddr::V4(l), SocketAddr::V4(p)) => Some((*l, *p)),
            _ => None,
        })
        .collect();
    if v4.is_empty() {
        return Ok(0);
    }
    // SAFETY: plain socket creation; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_RAW,
        )
    };
    if fd < 0 {
        return Err(NetfilterError::last_os(
            "socket(AF_INET, SOCK_RAW, IPPROTO_RAW)",
        ));
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut sent = 0;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x5eed, |d| d.as_nanos() as u64);
    for (i, (local, peer)) in v4.iter().enumerate() {
        // A sequence number far from anything in flight: half the sequence space away from a
        // pseudo-random point (any value outside the client's window will do).
        let x = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(i as u64);
        let seg = segment(*local, *peer, (x >> 32) as u32, x as u32);
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(*peer.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: `seg` and `to` are valid for the lengths given; `fd` is open.
        let n = unsafe {
            libc::sendto(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                seg.as_ptr().cast(),
                seg.len(),
                0,
                (&to as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            tracing::warn!(%local, %peer, error = %e, "probing a client failed");
        } else {
            sent += 1;
        }
    }
    Ok(sent)
}

/// An IPv4 packet holding a bare TCP acknowledgement from `from` to `to` (no options, no data).
/// The kernel fills in the IP checksum and identification (IP_HDRINCL); the TCP checksum is ours.
fn segment(from: SocketAddrV4, to: SocketAddrV4, seq: u32, ack: u32) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x45; // version 4, 5 words
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64; // TTL
    p[9] = libc::IPPROTO_TCP as u8;
    p[12..16].copy_from_slice(&from.ip().octets());
    p[16..20].copy_from_slice(&to.ip().octets());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&from.port().to_be_bytes());
    t[2..4].copy_from_slice(&to.port().to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4; // data offset: 5 words
    t[13] = 0x10; // ACK
    t[14..16].copy_from_slice(&1024u16.to_be_bytes()); // window
    let sum = tcp_checksum(from, to, t);
    t[16..18].copy_from_slice(&sum.to_be_bytes());
    p
}

/// The TCP checksum over the IPv4 pseudo-header and `seg` (whose checksum field is zero).
fn tcp_checksum(from: SocketAddrV4, to: SocketAddrV4, seg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_be_bytes([c[0], 0])
            };
            sum += u32::from(w);
        }
    };
    add(&from.ip().octets());
    add(&to.ip().octets());
    add(&[0, libc::IPPROTO_TCP as u8]);
    add(&(seg.len() as u16).to_be_bytes());
    add(seg);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_segment_is_a_bare_ack_with_a_valid_checksum() {
        let from: SocketAddrV4 = "10.213.0.6:6379".parse().unwrap();
        let to: SocketAddrV4 = "10.77.0.100:40000".parse().unwrap();
        let p = segment(from, to, 0x1234_5678, 0x9abc_def0);
        assert_eq!(p.len(), 40);
        assert_eq!(&p[12..16], &[10, 213, 0, 6]);
        assert_eq!(&p[16..20], &[10, 77, 0, 100]);
        let t = &p[20..];
        assert_eq!(u16::from_be_bytes([t[0], t[1]]), 6379);
        assert_eq!(u16::from_be_bytes([t[2], t[3]]), 40000);
        assert_eq!(t[13], 0x10, "ACK only");
        // A segment with its checksum in place sums to zero (ones' complement).
        let mut t2 = t.to_vec();
        let stored = u16::from_be_bytes([t2[16], t2[17]]);
        t2[16] = 0;
        t2[17] = 0;
        assert_eq!(tcp_checksum(from, to, &t2), stored);
        let mut sum: u32 = 0;
        for b in [
            &from.ip().octets()[..],
            &to.ip().octets()[..],
            &[0, 6],
            &20u16.to_be_bytes(),
            t,
        ] {
            for c in b.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
            }
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
    }

    #[test]
    fn ipv6_connections_are_skipped() {
        let l: SocketAddr = "[fd00::1]:80".parse().unwrap();
        let p: SocketAddr = "[fd00::2]:5000".parse().unwrap();
        assert_eq!(probe_clients(&[(l, p)]).unwrap(), 0);
    }
}
