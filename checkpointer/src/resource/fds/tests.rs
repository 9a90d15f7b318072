//! The restore half of descriptors against real sockets.

use super::*;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// A connection the restore cannot recreate (here its address is not this machine's) is
/// reset as before, and said: `fds::recreate` returns the note the restore child passes on
/// to be logged and counted.
#[test]
fn a_connection_that_cannot_be_recreated_is_reset_and_said() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    let mut img = SocketImage {
        family: libc::AF_INET,
        ty: libc::SOCK_STREAM,
        protocol: libc::IPPROTO_TCP,
        state: SocketState::ConnectedTcp,
        local: sys::sock_addr(s.as_raw_fd(), false).unwrap(),
        peer: sys::sock_addr(s.as_raw_fd(), true).unwrap(),
        options: vec![],
    };
    let conn = TcpConn {
        fd: 900,
        ..crate::tcp::capture(900, s.as_raw_fd()).unwrap()
    };
    // 10.255.255.1: an address no interface here has.
    img.local[4..8].copy_from_slice(&[10, 255, 255, 1]);
    let fds = [FdImage {
        fd: 900,
        cloexec: true,
        flags: libc::O_RDWR,
        kind: FdKind::Socket(img),
    }];
    let notes = recreate(&fds, &[conn], 1000, -1).expect("recreate");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("descriptor 900 was reset") && notes[0].contains("bind"),
        "{notes:?}"
    );
    // Descriptor 900 is a socket whose connection was reset by its peer.
    // SAFETY: descriptor 900 was just made by `recreate` and is ours to own.
    let mut restored = TcpStream::from(unsafe { OwnedFd::from_raw_fd(900) });
    restored
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let err = restored
        .read(&mut [0u8; 8])
        .expect_err("a reset connection");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
}
