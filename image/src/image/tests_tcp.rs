//! Connections in the format: carried through encoding, carried over by an incremental
//! checkpoint when unchanged, and refused when inconsistent.

use super::tests::{assert_refused, sample};
use super::*;
use crate::store::MetaCarry;

fn connected(fd: i32) -> FdImage {
    FdImage {
        fd,
        cloexec: false,
        flags: 2,
        kind: FdKind::Socket(SocketImage {
            family: 2,
            ty: 1,
            protocol: 6,
            state: SocketState::ConnectedTcp,
            local: vec![2, 0, 0x1f, 0x90, 10, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0],
            peer: vec![2, 0, 0xc3, 0x50, 10, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0],
            options: vec![],
        }),
    }
}

fn conn(fd: i32, recv: &[u8]) -> TcpConn {
    TcpConn {
        fd,
        state: TCP_ESTABLISHED,
        send_seq: 7,
        send_queue: b"out".to_vec(),
        unsent: 1,
        recv_seq: 9,
        recv_queue: recv.to_vec(),
        mss: 1448,
        wscale: Some((7, 7)),
        sack: true,
        timestamp: Some(42),
        window: [9, 100, 100, 100, 9],
    }
}

fn with_conns() -> Checkpoint {
    let mut c = sample(Kind::Full);
    c.image.fds.extend([connected(20), connected(21)]);
    c.image.tcp = vec![conn(20, b"a"), conn(21, b"b")];
    c
}

#[test]
fn connections_roundtrip() {
    let c = with_conns();
    let back = Checkpoint::from_bytes(c.to_bytes()).unwrap();
    assert_eq!(back.image.tcp, c.image.tcp);
}

#[test]
fn inconsistent_connections_are_refused() {
    let mut c = with_conns();
    c.image.tcp.push(conn(20, b"again"));
    assert_refused(&c, "the connection of descriptor 20 is given twice");
    let mut c = with_conns();
    c.image.tcp[0].fd = 3;
    assert_refused(
        &c,
        "descriptor 3 has a TCP connection but is no connected TCP socket",
    );
    let mut c = with_conns();
    c.image.tcp[1].unsent = 4;
    assert_refused(&c, "has 4 unsent bytes of 3 queued");
    let mut c = with_conns();
    // TIME_WAIT (6): no process holds such a socket, and no restore makes one.
    c.image.tcp[1].state = 6;
    assert_refused(&c, "is in TCP state 6, which no restore carries");
    // A half-closed one (CLOSE_WAIT) is carried.
    let mut c = with_conns();
    c.image.tcp[1].state = 8;
    assert!(Checkpoint::from_bytes(c.to_bytes()).is_ok());
    let mut c = with_conns();
    c.image.tcp[0].wscale = Some((15, 0));
    assert_refused(&c, "window scale above 14");
}

/// The sender leaves out the connections that did not change; the receiver takes them from
/// its base, and the result is the sender's whole list.
#[test]
fn unchanged_connections_are_carried_over() {
    let full = with_conns();
    let mut carry = MetaCarry::after(&full.image);
    let mut next = full.image.clone();
    next.base_epoch = Some(full.epoch);
    next.tcp[1].recv_queue = b"bc".to_vec();
    let whole = next.tcp.clone();
    carry.leave_out(&mut next);
    assert_eq!(next.carried.tcp, vec![20]);
    assert_eq!(next.tcp, vec![whole[1].clone()]);
    let resolved = crate::store::resolve_for_tests(&next, &full.image).unwrap();
    assert_eq!(resolved.tcp, whole);
    // A carried connection the base does not have is refused.
    let mut orphan = next.clone();
    orphan.carried.tcp = vec![22];
    let err = crate::store::resolve_for_tests(&orphan, &full.image).unwrap_err();
    assert!(err.to_string().contains("descriptor 22"), "{err}");
}
