//! Real connections over loopback: captured, the old socket closed silently, a new one
//! restored, and both ends carry on.

use super::*;
use crate::image::{FdImage, FdKind, SocketState};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A connected pair over `addr`'s loopback: (client, server's accepted end, the listener,
/// which keeps the port: a restored server end must take its address all the same).
fn pair_listening(addr: &str) -> (TcpStream, TcpStream, TcpListener) {
    let l = TcpListener::bind(addr).unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    for x in [&c, &s] {
        x.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    (c, s, l)
}

fn pair(addr: &str) -> (TcpStream, TcpStream) {
    let (c, s, _) = pair_listening(addr);
    (c, s)
}

fn image_of(s: &TcpStream) -> SocketImage {
    let fd = s.as_raw_fd();
    SocketImage {
        family: sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN).unwrap(),
        ty: libc::SOCK_STREAM,
        protocol: libc::IPPROTO_TCP,
        state: SocketState::ConnectedTcp,
        local: sys::sock_addr(fd, false).unwrap(),
        peer: sys::sock_addr(fd, true).unwrap(),
        // As an accepted socket of a server that set SO_REUSEADDR on its listener has them.
        options: vec![
            (libc::SOL_SOCKET, libc::SO_REUSEADDR, 1),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY, 1),
        ],
    }
}

/// Captures `s`, closes it silently and makes its successor.
fn move_connection(s: TcpStream, probe: bool) -> (TcpConn, TcpStream) {
    let img = image_of(&s);
    let conn = capture(3, s.as_raw_fd()).expect("capture");
    close_silently(OwnedFd::from(s)).unwrap();
    let new = TcpStream::from(restore(&img, &conn, probe).expect("restore"));
    new.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (conn, new)
}

fn read_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

fn carries_on(addr: &str) {
    let (mut c, mut s, _listener) = pair_listening(addr);
    c.write_all(b"hello").unwrap();
    s.write_all(b"world").unwrap();
    // The bytes are in the server's receive queue before the capture.
    let t0 = Instant::now();
    while ioctl_int(s.as_raw_fd(), SIOCINQ, "inq").unwrap() < 5 {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(1));
    }
    let (conn, mut s) = move_connection(s, true);
    assert_eq!(conn.recv_queue, b"hello");
    assert_eq!(conn.state, ESTABLISHED);
    assert!(
        conn.mss > 0 && conn.sack && conn.timestamp.is_some(),
        "{conn:?}"
    );
    assert_eq!(read_exact(&mut s, 5), b"hello");
    c.write_all(b"more").unwrap();
    assert_eq!(read_exact(&mut s, 4), b"more");
    s.write_all(b"back").unwrap();
    assert_eq!(read_exact(&mut c, 9), b"worldback");
    // Both ends close cleanly: the client reads the end of the stream, not a reset.
    drop(s);
    let mut rest = Vec::new();
    c.read_to_end(&mut rest)
        .expect("an orderly end, not a reset");
    assert!(rest.is_empty());
}

#[test]
fn an_established_ipv4_connection_carries_on_in_a_new_socket() {
    carries_on("127.0.0.1:0");
}

#[test]
fn an_established_ipv6_connection_carries_on_in_a_new_socket() {
    carries_on("[::1]:0");
}

/// A capture reads without consuming and leaves repair mode without a probe: the original
/// socket works on as if nothing happened.
#[test]
fn a_capture_leaves_the_connection_as_it_was() {
    let (mut c, mut s) = pair("127.0.0.1:0");
    c.write_all(b"abc").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let a = capture(3, s.as_raw_fd()).unwrap();
    let b = capture(3, s.as_raw_fd()).unwrap();
    assert_eq!(a.recv_queue, b"abc");
    assert_eq!((a.recv_seq, a.send_seq), (b.recv_seq, b.send_seq));
    assert_eq!(read_exact(&mut s, 3), b"abc");
    s.write_all(b"xyz").unwrap();
    assert_eq!(read_exact(&mut c, 3), b"xyz");
    let after = capture(3, s.as_raw_fd()).unwrap();
    assert_eq!(after.recv_seq, a.recv_seq.wrapping_add(3));
    assert_eq!(after.send_seq, a.send_seq.wrapping_add(3));
}

/// Bytes written but not acknowledged (the peer's window is full) are in the checkpoint and
/// reach the peer from the new socket, in order, none twice, none lost.
#[test]
fn unacknowledged_and_unsent_bytes_reach_the_peer_from_the_new_socket() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = socket2_small_rcvbuf(l.local_addr().unwrap());
    let (s, _) = l.accept().unwrap();
    let mut c = c;
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nonblocking(true).unwrap();
    let byte = |i: usize| (i * 7 % 251) as u8;
    let data: Vec<u8> = (0..4 << 20).map(byte).collect();
    let mut written = 0;
    let mut s = s;
    loop {
        match s.write(&data[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    s.set_nonblocking(false).unwrap();
    let (conn, s) = move_connection(s, true);
    assert!(!conn.send_queue.is_empty(), "nothing left unacknowledged");
    assert!(conn.unsent > 0, "nothing left unsent: {conn:?}");
    let t0 = Instant::now();
    let got = read_exact(&mut c, written);
    let first_to_last = t0.elapsed();
    assert!(
        got == data[..written],
        "the stream differs from what was written"
    );
    eprintln!(
        "{written} bytes written, {} in the checkpoint ({} unsent); all read {:?} after the restore",
        conn.send_queue.len(),
        conn.unsent,
        first_to_last
    );
    drop(s);
}

/// A client socket with a small receive buffer, so that a server's writes fill its window.
fn socket2_small_rcvbuf(to: std::net::SocketAddr) -> TcpStream {
    // SAFETY: plain socket creation, owned at once.
    let fd = unsafe {
        OwnedFd::from_raw_fd(check(libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0)).unwrap())
    };
    sys::setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4096).unwrap();
    let std::net::SocketAddr::V4(v4) = to else {
        unreachable!()
    };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(v4.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `sa` is a valid sockaddr_in of its size.
    check(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const sa).cast(),
            std::mem::size_of_val(&sa) as u32,
        )
    })
    .unwrap();
    TcpStream::from(fd)
}

/// Runs `cmd` (a shell command) in the calling thread's network namespace.
fn sh(cmd: &str) {
    let st = std::process::Command::new("sh")
        .args(["-c", cmd])
        .status()
        .unwrap();
    assert!(st.success(), "{cmd}");
}

/// Bytes sent but never acknowledged — Tardi's usual case, as the gate holds a primary's
/// packets until their checkpoint is replicated — are sent again by the new socket; the peer,
/// which may have them already, reads each byte once. The peer's acknowledgements are dropped
/// (nftables, in a network namespace of this test's own) until the restore.
#[test]
fn bytes_sent_but_unacknowledged_are_sent_again_and_read_once() {
    std::thread::spawn(|| {
        // SAFETY: unshare on this thread only (a new network namespace for it alone).
        check(unsafe { libc::unshare(libc::CLONE_NEWNET) }).unwrap();
        sh("ip link set lo up");
        let (mut c, s) = pair("127.0.0.1:0");
        let cport = c.local_addr().unwrap().port();
        sh(&format!(
            "nft add table inet tardi_t && nft add chain inet tardi_t in \
             '{{ type filter hook input priority 0; }}' && \
             nft add rule inet tardi_t in tcp sport {cport} drop"
        ));
        let mut s = s;
        // Less than the window the client opened at the handshake: its updates are dropped too.
        let data: Vec<u8> = (0..30_000).map(|i| (i % 253) as u8).collect();
        s.write_all(&data).unwrap();
        assert_eq!(read_exact(&mut c, data.len()), data);
        let (conn, mut s) = {
            let img = image_of(&s);
            let conn = capture(3, s.as_raw_fd()).expect("capture");
            sh("nft delete table inet tardi_t");
            close_silently(OwnedFd::from(s)).unwrap();
            let new = TcpStream::from(restore(&img, &conn, true).expect("restore"));
            (conn, new)
        };
        assert_eq!(conn.send_queue, data, "the unacknowledged bytes");
        assert_eq!(conn.unsent, 0);
        let t0 = Instant::now();
        s.write_all(b"tail").unwrap();
        assert_eq!(
            read_exact(&mut c, 4),
            b"tail",
            "each byte read once, in order"
        );
        eprintln!(
            "the next write arrived {:?} after the restore",
            t0.elapsed()
        );
    })
    .join()
    .unwrap();
}

/// The epoch loop's reader reads a connection whole only when it moved: not again while it
/// is idle, again once the process read from it (no packet), or the peer wrote to it.
#[test]
fn the_reader_reads_a_connection_again_only_when_it_moved() {
    let (mut c, mut s) = pair("127.0.0.1:0");
    c.write_all(b"0123456789").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let me = std::process::id() as i32;
    let fds = [FdImage {
        fd: s.as_raw_fd(),
        cloexec: true,
        flags: libc::O_RDWR,
        kind: FdKind::Socket(image_of(&s)),
    }];
    let mut r = Connections::default();
    let first = r.capture(me, &fds);
    assert_eq!((first.read, first.conns.len()), (1, 1));
    assert_eq!(first.conns[0].recv_queue, b"0123456789");
    let idle = r.capture(me, &fds);
    assert_eq!(idle.read, 0, "an idle connection was read again");
    assert_eq!(idle.conns, first.conns);
    // The process reads 4 bytes: no packet need go out, the unread bytes changed.
    assert_eq!(read_exact(&mut s, 4), b"0123");
    let after_read = r.capture(me, &fds);
    assert_eq!(after_read.read, 1);
    assert_eq!(after_read.conns[0].recv_queue, b"456789");
    // The peer writes.
    c.write_all(b"ab").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let after_write = r.capture(me, &fds);
    assert_eq!(after_write.read, 1);
    assert_eq!(after_write.conns[0].recv_queue, b"456789ab");
    // A descriptor that is gone is forgotten.
    assert!(r.capture(me, &[]).conns.is_empty());
}

/// A connection whose descriptor became a description the tree's processes share is not
/// carried (the PostgreSQL lab test's backup refused such checkpoints before: "descriptor 8 has
/// a TCP connection but is no connected TCP socket").
#[test]
fn a_shared_connection_is_not_carried() {
    let (_c, s) = pair("127.0.0.1:0");
    let conn = TcpConn {
        fd: 8,
        ..capture(8, s.as_raw_fd()).unwrap()
    };
    let fds = vec![
        FdImage {
            fd: 8,
            cloexec: false,
            flags: 2,
            kind: FdKind::Shared(0),
        },
        FdImage {
            fd: 9,
            cloexec: false,
            flags: 2,
            kind: FdKind::Socket(image_of(&s)),
        },
    ];
    let mut tcp = vec![conn.clone(), TcpConn { fd: 9, ..conn }];
    assert_eq!(keep_carried(&fds, &mut tcp), 1);
    assert_eq!(tcp.iter().map(|c| c.fd).collect::<Vec<_>>(), vec![9]);
}

/// `tcpi_state` of `s`.
fn state(s: &TcpStream) -> u8 {
    info(s.as_raw_fd()).unwrap().0
}

/// Waits (5 s at most) until `s` is in state `want`.
fn wait_state(s: &TcpStream, want: u8) {
    let t0 = Instant::now();
    while state(s) != want {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "state {} instead of {want}",
            state(s)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A connection whose peer shut down its writing (CLOSE_WAIT: a client that sent its request
/// and waits for the reply) carries on: the new socket holds the unread request and then the
/// end of the stream, and the reply and the server's own FIN reach the client. Restored as
/// reset before (only established connections were carried).
#[test]
fn a_connection_whose_peer_shut_down_carries_on() {
    let (mut c, s, _listener) = pair_listening("127.0.0.1:0");
    c.write_all(b"request").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    wait_state(&s, fin::CLOSE_WAIT);
    let (conn, mut s) = move_connection(s, true);
    assert_eq!(conn.state, fin::CLOSE_WAIT);
    assert_eq!(conn.recv_queue, b"request");
    assert_eq!(state(&s), fin::CLOSE_WAIT, "restored in its state");
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"request", "the request, then the end of the stream");
    s.write_all(b"reply").unwrap();
    drop(s);
    let mut back = Vec::new();
    c.read_to_end(&mut back)
        .expect("an orderly end, not a reset");
    assert_eq!(back, b"reply");
}

/// A connection that shut down its own writing, its FIN acknowledged (FIN_WAIT2: a server's
/// lingering close), carries on: the peer's later bytes and its FIN reach the new socket.
#[test]
fn a_connection_that_shut_down_its_writing_carries_on() {
    let (mut c, mut s, _listener) = pair_listening("127.0.0.1:0");
    s.write_all(b"answer").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"answer");
    wait_state(&s, fin::FIN_WAIT2);
    let (conn, mut s) = move_connection(s, true);
    assert_eq!((conn.state, conn.send_queue.len()), (fin::FIN_WAIT2, 0));
    assert_eq!(state(&s), fin::FIN_WAIT2, "restored in its state");
    c.write_all(b"more").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut more = Vec::new();
    s.read_to_end(&mut more)
        .expect("an orderly end, not a reset");
    assert_eq!(more, b"more");
}

/// Bytes and a FIN sent but not acknowledged (FIN_WAIT1; the peer's acknowledgements dropped
/// until the restore, as the gate holds a primary's packets): the new socket sends them again,
/// the peer reads each byte once, and the connection goes on half-closed.
#[test]
fn unacknowledged_bytes_and_fin_are_sent_again_and_read_once() {
    std::thread::spawn(|| {
        // SAFETY: unshare on this thread only (a new network namespace for it alone).
        check(unsafe { libc::unshare(libc::CLONE_NEWNET) }).unwrap();
        sh("ip link set lo up");
        let (mut c, mut s, _listener) = pair_listening("127.0.0.1:0");
        let cport = c.local_addr().unwrap().port();
        sh(&format!(
            "nft add table inet tardi_f && nft add chain inet tardi_f in \
             '{{ type filter hook input priority 0; }}' && \
             nft add rule inet tardi_f in tcp sport {cport} drop"
        ));
        let data: Vec<u8> = (0..10_000).map(|i| (i % 251) as u8).collect();
        s.write_all(&data).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        assert_eq!(got, data);
        wait_state(&s, fin::FIN_WAIT1);
        let img = image_of(&s);
        let conn = capture(3, s.as_raw_fd()).expect("capture");
        assert_eq!(conn.state, fin::FIN_WAIT1);
        assert_eq!(
            conn.send_queue, data,
            "the unacknowledged bytes, without the FIN"
        );
        sh("nft delete table inet tardi_f");
        close_silently(OwnedFd::from(s)).unwrap();
        let mut s = TcpStream::from(restore(&img, &conn, true).expect("restore"));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        wait_state(&s, fin::FIN_WAIT2);
        c.write_all(b"bye").unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back)
            .expect("an orderly end, not a reset");
        assert_eq!(back, b"bye");
    })
    .join()
    .unwrap();
}
