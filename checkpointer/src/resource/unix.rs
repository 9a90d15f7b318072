//! Unix-domain sockets: capture (what each socket is, who its peer is, what waits in it) and
//! restore (the same sockets, connected the same way, with the same bytes queued).
//!
//! Capture duplicates each socket into the supervisor (`pidfd_getfd`) and asks it: type,
//! addresses, options, and the bytes waiting to be received, read with `MSG_PEEK` at a moving
//! peek offset (`SO_PEEK_OFF`, put back afterwards), so nothing is consumed. Who is connected to
//! whom comes from the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`, `UNIX_DIAG_*`), asked
//! from a netlink socket made inside the sandbox's network namespace (unix sockets are listed
//! per namespace): each socket's peer inode, a listener's pending connections, the shutdown
//! state, the bound file's inode.
//!
//! Restore (in the restore child, inside the sandbox, before anything else is opened by
//! descriptor number):
//! - listeners are bound again at their path (the path's old socket file is replaced) or
//!   abstract name, with their backlog;
//! - a pair whose both ends are in the image is connected again: through its listener
//!   (connect, then accept, so both ends keep their addresses) when one end was accepted from
//!   a listener of the image, else as a `socketpair` (then bound to their names, if any);
//! - a connection a listener had not accepted yet, whose client is in the image, is connected
//!   again and left in the listener's queue;
//! - a stream or seqpacket socket connected to something outside the sandbox comes back as a
//!   connection reset by its peer (reads give `ECONNRESET` after the queued bytes, then end of
//!   file; writes `EPIPE`), as TCP connections do; a datagram socket connected outside is
//!   connected to the same address again if it exists, else to a peer that is gone (sends give
//!   `ECONNREFUSED`);
//! - the queued bytes are sent again from the peer (or, for an unconnected bound datagram
//!   socket, from an unnamed socket of ours), in order, before the service runs.
//!
//! Refused, by name: descriptors or credentials in flight (`SCM_RIGHTS`, `SCM_CREDENTIALS`
//! messages queued), bytes queued in a connection not accepted yet, datagrams queued in an
//! unnamed unconnected socket. Known losses: the sender address of a queued datagram not sent
//! by the socket's peer (it reads as unnamed); the names of a pair restored as a `socketpair`
//! when the listener it was accepted from is gone.

use crate::image::{FdImage, FdKind, UnixAddr, UnixSocketImage, UnixState};
use crate::os::error::CaptureError;
use crate::procfs::Proc;
use crate::sys::{self, cvt_i as check};
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

type Result<T> = std::result::Result<T, CaptureError>;

fn unsupported(fd: i32, what: impl std::fmt::Display) -> CaptureError {
    CaptureError::Unsupported(format!("file descriptor {fd}: {what}"))
}

/// What the kernel's socket diagnostics say about one unix socket.
#[derive(Debug, Clone, Default)]
pub struct Diag {
    pub peer: u64,
    pub pending: Vec<u64>,
    /// Bytes (or, for a listener, connections) waiting to be received.
    pub rqueue: u32,
    /// For a listener: its backlog.
    pub wqueue: u32,
    pub shutdown: u8,
    /// Inode of the bound path's file (0: not bound to a path).
    pub vfs_ino: u64,
}

/// Every unix socket of the network namespace of `proc`, by inode.
pub fn diag(proc: &Proc) -> io::Result<HashMap<u64, Diag>> {
    let ns = proc.open_file("ns/net", libc::O_RDONLY | libc::O_CLOEXEC)?;
    // A netlink socket lists the sockets of its own namespace: make it in the sandbox's, on a
    // short-lived thread (setns changes only the calling thread's namespace).
    let nl = std::thread::scope(|s| {
        s.spawn(|| -> io::Result<OwnedFd> {
            // SAFETY: setns on this thread only, with a namespace descriptor we hold.
            check(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) })?;
            // SAFETY: plain socket creation.
            let fd = check(unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_SOCK_DIAG,
                )
            })?;
            // SAFETY: a fresh descriptor we own.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("netns thread panicked")))
    })?;
    dump(nl.as_raw_fd())
}

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const UDIAG_SHOW: u32 = 0x1 | 0x2 | 0x4 | 0x8 | 0x10; // NAME VFS PEER ICONS RQLEN

fn dump(nl: RawFd) -> io::Result<HashMap<u64, Diag>> {
    // nlmsghdr (16) + unix_diag_req (24).
    let mut req = [0u8; 40];
    req[0..4].copy_from_slice(&40u32.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[16] = libc::AF_UNIX as u8;
    req[20..24].copy_from_slice(&u32::MAX.to_ne_bytes()); // every state
    req[28..32].copy_from_slice(&UDIAG_SHOW.to_ne_bytes());
    req[32..40].copy_from_slice(&[0xff; 8]); // no cookie
    // SAFETY: sends a local buffer on our netlink socket (to the kernel: no address needed).
    if unsafe { libc::send(nl, req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = HashMap::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: receives into a local buffer.
        let n = unsafe { libc::recv(nl, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut b = &buf[..n as usize];
        while b.len() >= 16 {
            let len = u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize;
            let ty = u16::from_ne_bytes(b[4..6].try_into().unwrap());
            if len < 16 || len > b.len() {
                return Err(io::Error::other("malformed sock_diag reply"));
            }
            match ty as i32 {
                libc::NLMSG_DONE => return Ok(out),
                libc::NLMSG_ERROR => {
                    let e = i32::from_ne_bytes(b[16..20].try_into().unwrap_or([0; 4]));
                    return Err(io::Error::from_raw_os_error(-e));
                }
                _ => {
                    if let Some((ino, d)) = parse_msg(&b[16..len]) {
                        out.insert(ino, d);
                    }
                }
            }
            b = &b[(len + 3) & !3..];
        }
    }
}

/// One `unix_diag_msg` (16 bytes) and its attributes.
fn parse_msg(m: &[u8]) -> Option<(u64, Diag)> {
    let ino = u32::from_ne_bytes(m.get(4..8)?.try_into().ok()?) as u64;
    let mut d = Diag::default();
    let mut a = m.get(16..)?;
    while a.len() >= 4 {
        let len = u16::from_ne_bytes(a[0..2].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes(a[2..4].try_into().ok()?);
        if len < 4 || len > a.len() {
            break;
        }
        let v = &a[4..len];
        let u32_at = |o: usize| {
            v.get(o..o + 4)
                .map(|x| u32::from_ne_bytes(x.try_into().unwrap()))
        };
        match ty {
            1 => d.vfs_ino = u32_at(0).unwrap_or(0) as u64, // UNIX_DIAG_VFS: ino, dev
            2 => d.peer = u32_at(0).unwrap_or(0) as u64,    // UNIX_DIAG_PEER
            3 => {
                d.pending = v
                    .chunks_exact(4)
                    .map(|c| u32::from_ne_bytes(c.try_into().unwrap()) as u64)
                    .collect()
            }
            4 => {
                // UNIX_DIAG_RQLEN: rqueue, wqueue
                d.rqueue = u32_at(0).unwrap_or(0);
                d.wqueue = u32_at(4).unwrap_or(0);
            }
            6 => d.shutdown = v.first().copied().unwrap_or(0), // UNIX_DIAG_SHUTDOWN
            _ => {}
        }
        a = &a[((len + 3) & !3).min(a.len())..];
    }
    Some((ino, d))
}

const KEPT_OPTS: &[(i32, i32)] = &[
    (libc::SOL_SOCKET, libc::SO_PASSCRED),
    (libc::SOL_SOCKET, libc::SO_SNDBUF),
    (libc::SOL_SOCKET, libc::SO_RCVBUF),
    (libc::SOL_SOCKET, libc::SO_PEEK_OFF),
];

/// Describes the unix socket `s` (a duplicate of the process's descriptor `fd`, inode `ino`).
/// `diags` comes from [`diag`]; `cwd` is the process's working directory (for relative paths).
pub fn capture(
    fd: i32,
    s: RawFd,
    ino: u64,
    diags: &HashMap<u64, Diag>,
    proc: &Proc,
) -> Result<UnixSocketImage> {
    let opt = |n| {
        sys::getsockopt_int(s, libc::SOL_SOCKET, n)
            .map_err(|e| unsupported(fd, format!("unix socket option: {e}")))
    };
    let ty = opt(libc::SO_TYPE)?;
    if ![libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_SEQPACKET].contains(&ty) {
        return Err(unsupported(fd, format!("unix socket of type {ty}")));
    }
    let listening = opt(libc::SO_ACCEPTCONN)? != 0;
    let local = UnixAddr::from_sockaddr(&sys::sock_addr(s, false).map_err(|e| unsupported(fd, e))?);
    let peer_sa = sys::sock_addr(s, true).map_err(|e| unsupported(fd, e))?;
    let peer = UnixAddr::from_sockaddr(&peer_sa);
    let d = diags.get(&ino).cloned().ok_or_else(|| {
        unsupported(
            fd,
            format!("unix socket {ino} is not in the sandbox's socket list"),
        )
    })?;
    let mut options = Vec::new();
    for &(l, n) in KEPT_OPTS {
        if let Ok(v) = sys::getsockopt_int(s, l, n) {
            options.push((l, n, v));
        }
    }
    let state = if listening {
        UnixState::Listening {
            backlog: d.wqueue.min(i32::MAX as u32) as i32,
            pending: d.pending.clone(),
        }
    } else if d.peer != 0 || !peer_sa.is_empty() && peer != UnixAddr::Unnamed {
        UnixState::Connected
    } else {
        UnixState::Unconnected
    };
    let queue = if listening {
        Vec::new()
    } else {
        peek_queue(fd, s, ty, d.rqueue)?
    };
    let path_file = match &local {
        UnixAddr::Path(p) => path_file(proc, p, d.vfs_ino),
        _ => None,
    };
    Ok(UnixSocketImage {
        ino,
        ty,
        local,
        path_file,
        state,
        peer_ino: d.peer,
        peer,
        queue,
        shutdown: d.shutdown,
        options,
    })
}

/// Owner, group and mode of the socket file at `path`, if it is still this socket's (inode
/// `vfs_ino`); `None` when it was unlinked or replaced.
fn path_file(proc: &Proc, path: &str, vfs_ino: u64) -> Option<(u32, u32, u32)> {
    let full = if path.starts_with('/') {
        path.to_string()
    } else {
        let cwd = proc.read_link("cwd").ok()?;
        format!("{}/{path}", cwd.trim_end_matches('/'))
    };
    let c = CString::new(full).ok()?;
    // SAFETY: plain data, zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and stat buffer (we run in the sandbox's view of the files).
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } < 0 {
        return None;
    }
    (st.st_mode & libc::S_IFMT == libc::S_IFSOCK && st.st_ino == vfs_ino)
        .then_some((st.st_uid, st.st_gid, st.st_mode))
}

/// Reads what waits in the receive queue without consuming it: `MSG_PEEK` at a moving peek
/// offset, one message at a time. Refuses control messages (descriptors or credentials in
/// flight).
fn peek_queue(fd: i32, s: RawFd, ty: i32, rqueue: u32) -> Result<Vec<Vec<u8>>> {
    if rqueue == 0 {
        return Ok(Vec::new());
    }
    let old = sys::getsockopt_int(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF).unwrap_or(-1);
    sys::setsockopt_int(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, 0)
        .map_err(|e| unsupported(fd, format!("unix socket peek offset: {e}")))?;
    let r = peek_all(fd, s, ty, rqueue);
    // Put the socket's peek offset back whatever happened (the process shares the socket).
    let _ = sys::setsockopt_int(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, old);
    r
}

fn peek_all(fd: i32, s: RawFd, ty: i32, rqueue: u32) -> Result<Vec<Vec<u8>>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut total = 0usize;
    let mut buf = vec![0u8; (rqueue as usize).max(1 << 16) + 1];
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut cmsg = [0u64; 64];
        // SAFETY: plain data, zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cmsg);
        // SAFETY: `msg` describes local buffers.
        let n = unsafe {
            libc::recvmsg(
                s,
                &mut msg,
                libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                break;
            }
            return Err(unsupported(
                fd,
                format!("peeking at a unix socket's queue: {e}"),
            ));
        }
        if msg.msg_controllen > 0 || msg.msg_flags & libc::MSG_CTRUNC != 0 {
            close_passed_fds(&msg);
            return Err(unsupported(
                fd,
                "a unix socket holds file descriptors or credentials in flight \
                 (SCM_RIGHTS/SCM_CREDENTIALS messages not received yet); they are not supported yet",
            ));
        }
        if n == 0 && ty == libc::SOCK_STREAM {
            break;
        }
        let n = n as usize;
        total += n;
        if ty == libc::SOCK_STREAM {
            match out.first_mut() {
                Some(v) => v.extend_from_slice(&buf[..n]),
                None => out.push(buf[..n].to_vec()),
            }
            if total >= rqueue as usize {
                break;
            }
        } else {
            if msg.msg_flags & libc::MSG_TRUNC != 0 {
                return Err(unsupported(fd, "a queued datagram larger than expected"));
            }
            out.push(buf[..n].to_vec());
            // RQLEN is every queued byte for seqpacket, the first datagram's size for
            // datagram sockets: those are read until the queue runs out.
            if ty == libc::SOCK_SEQPACKET && total >= rqueue as usize && n > 0 {
                break;
            }
            if out.len() > 1 << 20 {
                return Err(unsupported(fd, "too many queued datagrams"));
            }
        }
    }
    if total < rqueue as usize && ty == libc::SOCK_STREAM {
        return Err(unsupported(
            fd,
            format!("read {total} of the {rqueue} bytes queued in a unix socket"),
        ));
    }
    Ok(out)
}

/// Closes descriptors a peek installed in this process.
fn close_passed_fds(msg: &libc::msghdr) {
    // SAFETY: walks the control buffer the kernel filled, within `msg_controllen`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const i32;
                let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..n {
                    libc::close(*data.add(i));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
}

/// Checks what can only be judged with every socket of the image in view: bytes waiting in a
/// connection not accepted yet.
pub fn check_image(fds: &[FdImage], diags: &HashMap<u64, Diag>) -> Result<()> {
    let socks: Vec<(i32, &UnixSocketImage)> = unix_of(fds);
    for (fd, u) in &socks {
        if let UnixState::Listening { pending, .. } = &u.state {
            // `pending` names the clients; the connection's other end (not accepted yet) is
            // the client's peer.
            for p in pending {
                let embryo = socks
                    .iter()
                    .find(|(_, c)| c.ino == *p)
                    .map(|(_, c)| c.peer_ino);
                if let Some(d) = embryo.and_then(|e| diags.get(&e))
                    && d.rqueue > 0
                {
                    return Err(unsupported(
                        *fd,
                        format!(
                            "listening unix socket {} has a connection not accepted yet with {} bytes \
                             queued; restoring those is not supported yet",
                            show(&u.local),
                            d.rqueue
                        ),
                    ));
                }
            }
        }
        if u.state == UnixState::Unconnected
            && u.local == UnixAddr::Unnamed
            && !u.queue.is_empty()
            && u.ty != libc::SOCK_STREAM
        {
            return Err(unsupported(
                *fd,
                "datagrams queued in an unnamed, unconnected unix socket cannot be sent again",
            ));
        }
    }
    Ok(())
}

fn unix_of(fds: &[FdImage]) -> Vec<(i32, &UnixSocketImage)> {
    fds.iter()
        .filter_map(|f| match &f.kind {
            FdKind::Unix(u) => Some((f.fd, u)),
            _ => None,
        })
        .collect()
}

fn show(a: &UnixAddr) -> String {
    match a {
        UnixAddr::Unnamed => "(unnamed)".into(),
        UnixAddr::Path(p) => p.clone(),
        UnixAddr::Abstract(n) => format!("@{}", String::from_utf8_lossy(n)),
    }
}

// ---------------------------------------------------------------------------------------------
// Restore side.

/// Why a unix socket could not be recreated.
#[derive(Debug, thiserror::Error)]
#[error("recreating unix socket {what} (descriptor {fd}): {source}")]
pub struct UnixError {
    pub fd: i32,
    pub what: String,
    pub source: io::Error,
}

/// Recreates every unix socket of `fds` at its descriptor numbers (every descriptor of one
/// socket), connected and with its queue refilled. Temporary descriptors stay at or above
/// `floor`.
pub fn recreate(fds: &[FdImage], floor: RawFd) -> std::result::Result<(), UnixError> {
    let socks = unix_of(fds);
    if socks.is_empty() {
        return Ok(());
    }
    // One record per socket (descriptors of a socket share its inode), first descriptor first.
    let mut by_ino: HashMap<u64, (i32, &UnixSocketImage, i32)> = HashMap::new();
    let mut order = Vec::new();
    for f in fds {
        if let FdKind::Unix(u) = &f.kind
            && !by_ino.contains_key(&u.ino)
        {
            by_ino.insert(u.ino, (f.fd, u, f.flags));
            order.push(u.ino);
        }
    }
    let mut made: HashMap<u64, RawFd> = HashMap::new();
    let err = |fd: i32, u: &UnixSocketImage| {
        let what = format!("{} {}", type_name(u.ty), show(&u.local));
        move |source| UnixError { fd, what, source }
    };
    let listener_at = |a: &UnixAddr| {
        order.iter().find(|i| {
            let u = by_ino[i].1;
            matches!(u.state, UnixState::Listening { .. })
                && &u.local == a
                && *a != UnixAddr::Unnamed
        })
    };

    // 1. Listeners and unconnected sockets.
    for ino in &order {
        let (fd, u, _) = by_ino[ino];
        if u.state == UnixState::Connected {
            continue;
        }
        let s = new_socket(u.ty, floor).map_err(err(fd, u))?;
        bind(s, u).map_err(err(fd, u))?;
        if matches!(u.state, UnixState::Listening { .. }) {
            let backlog = match u.state {
                UnixState::Listening { backlog, .. } => backlog,
                _ => 0,
            };
            // SAFETY: plain listen on our socket.
            check(unsafe { libc::listen(s, backlog.max(1)) }).map_err(err(fd, u))?;
        }
        made.insert(*ino, s);
    }
    // 2. Pairs whose both ends are in the image; accepted ones through their listener.
    for ino in &order {
        let (fd, u, _) = by_ino[ino];
        if u.state != UnixState::Connected || made.contains_key(ino) {
            continue;
        }
        let Some(&(pfd, p, _)) = by_ino.get(&u.peer_ino) else {
            continue;
        };
        if p.peer_ino != u.ino || made.contains_key(&p.ino) {
            continue; // a datagram socket connected one way: step 3
        }
        // The accepted end has the listener's name and is not that listener's client.
        let (server, client) = if listener_at(&u.local).is_some() && u.ty != libc::SOCK_DGRAM {
            ((fd, u), (pfd, p))
        } else if listener_at(&p.local).is_some() && p.ty != libc::SOCK_DGRAM {
            ((pfd, p), (fd, u))
        } else {
            let (a, b) = socketpair(u.ty, floor).map_err(err(fd, u))?;
            for (s, x) in [(a, u), (b, p)] {
                if x.local != UnixAddr::Unnamed {
                    bind(s, x).map_err(err(fd, x))?;
                }
            }
            made.insert(u.ino, a);
            made.insert(p.ino, b);
            continue;
        };
        let l = made[listener_at(&server.1.local).unwrap()];
        let c = new_socket(client.1.ty, floor).map_err(err(client.0, client.1))?;
        if client.1.local != UnixAddr::Unnamed {
            bind(c, client.1).map_err(err(client.0, client.1))?;
        }
        connect(c, &server.1.local).map_err(err(client.0, client.1))?;
        // SAFETY: accept on our listener; the connection just made is the only one queued yet.
        let a = check(unsafe {
            libc::accept4(
                l,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        })
        .map_err(err(server.0, server.1))?;
        let a = lift(a, floor).map_err(err(server.0, server.1))?;
        made.insert(client.1.ino, c);
        made.insert(server.1.ino, a);
    }
    // Datagram sockets connected one way to a socket of the image, once that one exists.
    loop {
        let mut progress = false;
        for ino in &order {
            let (fd, u, _) = by_ino[ino];
            if made.contains_key(ino) || u.ty == libc::SOCK_STREAM {
                continue;
            }
            let Some(&(_, p, _)) = by_ino.get(&u.peer_ino) else {
                continue;
            };
            if !made.contains_key(&p.ino) || listener_at(&p.local).is_some() {
                continue;
            }
            let c = new_socket(u.ty, floor).map_err(err(fd, u))?;
            bind(c, u).map_err(err(fd, u))?;
            connect(c, &p.local).map_err(err(fd, u))?;
            made.insert(*ino, c);
            progress = true;
        }
        if !progress {
            break;
        }
    }
    // 3. Connections a listener of the image had not accepted, then peers outside the sandbox.
    for ino in &order {
        let (fd, u, _) = by_ino[ino];
        if made.contains_key(ino) {
            continue;
        }
        let listener = order.iter().find(|l| {
            matches!(&by_ino[*l].1.state, UnixState::Listening { pending, .. } if pending.contains(&u.ino))
        });
        let s = if let Some(l) = listener {
            let c = new_socket(u.ty, floor).map_err(err(fd, u))?;
            if u.local != UnixAddr::Unnamed {
                bind(c, u).map_err(err(fd, u))?;
            }
            connect(c, &by_ino[l].1.local).map_err(err(fd, u))?;
            c
        } else if u.ty == libc::SOCK_DGRAM {
            outside_dgram(u, floor).map_err(err(fd, u))?
        } else {
            reset_pair(u, floor).map_err(err(fd, u))?
        };
        made.insert(*ino, s);
    }
    // 4. Queued bytes, sent again by the peer (or an unnamed socket of ours), in order.
    for ino in &order {
        let (fd, u, _) = by_ino[ino];
        if u.queue.is_empty()
            || !by_ino.contains_key(&u.peer_ino) && u.state == UnixState::Connected
        {
            continue; // none, or already queued ahead of a reset (reset_pair, outside_dgram)
        }
        let mutual = by_ino
            .get(&u.peer_ino)
            .is_some_and(|p| p.1.peer_ino == u.ino);
        if mutual {
            let peer = made[&u.peer_ino];
            for m in &u.queue {
                send_all(peer, m, None).map_err(err(fd, u))?;
            }
            continue;
        }
        let sa = u.local.to_sockaddr().ok_or_else(|| UnixError {
            fd,
            what: "queued datagrams of an unnamed socket".into(),
            source: io::Error::from_raw_os_error(libc::EDESTADDRREQ),
        })?;
        // The queue of a bound datagram socket: sent from an unnamed socket of ours.
        let t = new_socket(u.ty, floor).map_err(err(fd, u))?;
        // SAFETY: a temporary descriptor of ours.
        let t = unsafe { OwnedFd::from_raw_fd(t) };
        for m in &u.queue {
            send_all(t.as_raw_fd(), m, Some(&sa)).map_err(err(fd, u))?;
        }
    }
    // 5. Shutdown states, options, then every descriptor number of every socket.
    for ino in &order {
        let (fd, u, _) = by_ino[ino];
        let s = made[ino];
        let how = match u.shutdown & 3 {
            1 => Some(libc::SHUT_RD),
            2 => Some(libc::SHUT_WR),
            3 => Some(libc::SHUT_RDWR),
            _ => None,
        };
        if let Some(how) = how
            && u.state == UnixState::Connected
        {
            // SAFETY: shutdown on our socket (ENOTCONN on a reset one is fine).
            unsafe { libc::shutdown(s, how) };
        }
        for &(l, n, v) in &u.options {
            let (n, v) = match n {
                libc::SO_SNDBUF => (libc::SO_SNDBUFFORCE, v / 2),
                libc::SO_RCVBUF => (libc::SO_RCVBUFFORCE, v / 2),
                _ => (n, v),
            };
            sys::setsockopt_int(s, l, n, v).map_err(err(fd, u))?;
        }
    }
    for f in fds {
        if let FdKind::Unix(u) = &f.kind {
            let s = made[&u.ino];
            // SAFETY: dup2 onto the number we are filling.
            check(unsafe { libc::dup2(s, f.fd) }).map_err(err(f.fd, u))?;
            // SAFETY: F_SETFL takes an int.
            unsafe { libc::fcntl(f.fd, libc::F_SETFL, f.flags & libc::O_NONBLOCK) };
        }
    }
    for s in made.values() {
        // SAFETY: our temporaries (every socket now has its numbers).
        unsafe { libc::close(*s) };
    }
    Ok(())
}

fn type_name(ty: i32) -> &'static str {
    match ty {
        libc::SOCK_STREAM => "stream",
        libc::SOCK_DGRAM => "datagram",
        _ => "seqpacket",
    }
}

/// Moves a descriptor to the lowest free number at or above `floor` (close-on-exec).
fn lift(fd: RawFd, floor: RawFd) -> io::Result<RawFd> {
    // SAFETY: F_DUPFD_CLOEXEC duplicates to the lowest free number >= floor.
    let n = check(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor) });
    // SAFETY: closing the original, which we own.
    unsafe { libc::close(fd) };
    n
}

fn new_socket(ty: i32, floor: RawFd) -> io::Result<RawFd> {
    // SAFETY: plain socket creation.
    let s = check(unsafe { libc::socket(libc::AF_UNIX, ty | libc::SOCK_CLOEXEC, 0) })?;
    lift(s, floor)
}

fn socketpair(ty: i32, floor: RawFd) -> io::Result<(RawFd, RawFd)> {
    let mut sv = [0i32; 2];
    // SAFETY: `sv` has room for two descriptors.
    check(unsafe { libc::socketpair(libc::AF_UNIX, ty | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr()) })?;
    Ok((lift(sv[0], floor)?, lift(sv[1], floor)?))
}

/// Binds `s` to `u`'s address: a path gets its old socket file replaced, then the owner and
/// mode it had (or is unlinked again if it had been).
fn bind(s: RawFd, u: &UnixSocketImage) -> io::Result<()> {
    let Some(sa) = u.local.to_sockaddr() else {
        return Ok(());
    };
    // SAFETY: `sa` is a sockaddr_un of its own length.
    let b = || check(unsafe { libc::bind(s, sa.as_ptr().cast(), sa.len() as u32) });
    if let UnixAddr::Path(p) = &u.local {
        let c = CString::new(p.as_str()).map_err(io::Error::other)?;
        if let Err(e) = b() {
            // A socket file left at the path (a private directory keeps its files) names no
            // live socket in this fresh sandbox: replace it.
            // SAFETY: plain data, zero is valid; valid C string.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid C string and stat buffer.
            let is_sock = unsafe { libc::lstat(c.as_ptr(), &mut st) } == 0
                && st.st_mode & libc::S_IFMT == libc::S_IFSOCK;
            if e.raw_os_error() != Some(libc::EADDRINUSE) || !is_sock {
                return Err(e);
            }
            // SAFETY: valid C string.
            check(unsafe { libc::unlink(c.as_ptr()) })?;
            b()?;
        }
        // SAFETY: valid C string for each call.
        unsafe {
            match u.path_file {
                Some((uid, gid, mode)) => {
                    check(libc::lchown(c.as_ptr(), uid, gid))?;
                    check(libc::chmod(c.as_ptr(), mode & 0o7777))?;
                }
                None => {
                    libc::unlink(c.as_ptr());
                }
            }
        }
        Ok(())
    } else {
        b().map(drop)
    }
}

fn connect(s: RawFd, to: &UnixAddr) -> io::Result<()> {
    let sa = to
        .to_sockaddr()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EDESTADDRREQ))?;
    // SAFETY: `sa` is a sockaddr_un of its own length.
    check(unsafe { libc::connect(s, sa.as_ptr().cast(), sa.len() as u32) }).map(drop)
}

fn send_all(s: RawFd, m: &[u8], to: Option<&[u8]>) -> io::Result<()> {
    let (addr, alen) = match to {
        Some(a) => (a.as_ptr(), a.len() as u32),
        None => (std::ptr::null(), 0),
    };
    let mut off = 0;
    loop {
        // SAFETY: sends from a live slice; `addr` is null or a sockaddr of `alen` bytes.
        let n = unsafe {
            libc::sendto(
                s,
                m[off..].as_ptr().cast(),
                m.len() - off,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                addr.cast(),
                alen,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        off += n as usize;
        if off >= m.len() {
            return Ok(());
        }
    }
}

/// The socket `u` stood for (`a`, bound to its address) connected to a temporary socket of
/// ours (`b`) that has already sent it `u`'s queued messages.
fn queued_pair(u: &UnixSocketImage, floor: RawFd) -> io::Result<(RawFd, OwnedFd)> {
    let (a, b) = socketpair(u.ty, floor)?;
    // SAFETY: our temporary end.
    let b = unsafe { OwnedFd::from_raw_fd(b) };
    if u.local != UnixAddr::Unnamed {
        bind(a, u)?;
    }
    for m in &u.queue {
        send_all(b.as_raw_fd(), m, None)?;
    }
    Ok((a, b))
}

/// A stream or seqpacket socket whose peer was outside the sandbox: connected to a socket of
/// ours that sends it the queued bytes, then is closed with a byte unread (the kernel then
/// marks the connection reset: `ECONNRESET` once the queued bytes are read, end of file after).
fn reset_pair(u: &UnixSocketImage, floor: RawFd) -> io::Result<RawFd> {
    let (a, b) = queued_pair(u, floor)?;
    send_all(a, b"\0", None)?;
    drop(b);
    Ok(a)
}

/// A datagram socket connected to something outside the sandbox: connected to the same
/// address again if it can be, else to a socket of ours that is then closed (sends give
/// `ECONNREFUSED`, as to a peer that went away). Queued datagrams come first either way.
fn outside_dgram(u: &UnixSocketImage, floor: RawFd) -> io::Result<RawFd> {
    let (a, b) = queued_pair(u, floor)?;
    if u.peer != UnixAddr::Unnamed {
        let _ = connect(a, &u.peer); // on failure a stays connected to b, which goes away
    }
    drop(b);
    Ok(a)
}
