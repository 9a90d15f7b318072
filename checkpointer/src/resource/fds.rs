//! File descriptors: what each one is at capture, and how to make it again at restore.
//!
//! Capture reads `/proc/PID/fd` and `fdinfo`, and duplicates sockets into the supervisor with
//! `pidfd_getfd` to ask them about themselves. Restore runs in the sandbox's restore child
//! (inside the sandbox's namespaces, before the restorer is exec'd) and recreates every
//! descriptor at its old number. Anything not understood is refused by name.

use crate::image::*;
use crate::os::error::CaptureError;
use crate::procfs::{self, Proc};
use crate::sys::{self, Pid, cvt_i as check};
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

type Result<T> = std::result::Result<T, CaptureError>;

fn unsupported(fd: i32, what: impl std::fmt::Display) -> CaptureError {
    CaptureError::Unsupported(format!("file descriptor {fd}: {what}"))
}

fn perr(pid: Pid, what: String) -> impl FnOnce(io::Error) -> CaptureError {
    move |source| CaptureError::Proc { pid, what, source }
}

/// Sockets already described, by their `/proc/PID/fd` link (`socket:[inode]`). Only sockets
/// whose image changes through counted calls alone are kept ([`changes_only_by_calls`]:
/// listening, connected TCP, connected or bound UDP), and they are taken from here while the
/// process made no counted call; a connected TCP socket even after one, since it never leaves
/// that state. Inspecting a socket costs a `pidfd_getfd` and about twenty `getsockopt`s, which
/// adds up inside the pause of a busy server's every epoch. A connected TCP socket's entry also
/// keeps its descriptor flags (it is restored as a reset connection, where they hardly matter),
/// so its `fdinfo` is not read again either.
pub type SocketCache = HashMap<String, (SocketImage, bool, i32)>;

/// What one capture learnt that the next can reuse (see [`capture`]).
#[derive(Debug, Default)]
pub struct FdCache {
    pub sockets: SocketCache,
    /// The descriptor numbers and their links, as last read.
    links: Option<Vec<(i32, String)>>,
    /// Descriptors that change only through system calls of the process that a
    /// [`crate::syscount::SyscallCounter`] over [`crate::syscount::DESCRIPTOR_CALLS`] counts
    /// (epoll instances: `epoll_ctl`; signal descriptors: `signalfd`), by descriptor number:
    /// their links do not tell them apart (every epoll instance is `anon_inode:[eventpoll]`),
    /// and a number names the same open file for as long as no counted call was made.
    stable: HashMap<i32, FdImage>,
    /// Paths found for inodes inotify watches (see [`crate::inotify`]).
    inotify: crate::inotify::PathCache,
    /// Pipe ends by descriptor number, without their contents: while no counted call is made,
    /// only the contents can change (with `read` and `write`), so only they are read again.
    pipes: HashMap<i32, FdImage>,
    /// Our own pipe that pipe contents are `tee`d into, kept between captures.
    tee: Option<(OwnedFd, OwnedFd)>,
}

impl FdCache {
    /// Forgets everything (the next capture reads it all).
    pub fn clear(&mut self) {
        *self = FdCache::default();
    }
}

/// Captures every descriptor of the (stopped) process. Run inside [`crate::procfs::in_view`] so
/// that paths read as the process sees them. `cache`, when given, is consulted and updated.
///
/// With `unchanged` (the caller knows that the process made none of the calls in
/// [`crate::syscount::DESCRIPTOR_CALLS`] since the capture that last filled `cache`), the
/// table is not read again (no `readlink` per descriptor), and the descriptors that change only
/// through those calls (sockets that are listening or connected over TCP, epoll instances,
/// signal descriptors, character devices) are taken from the cache, flags included; of a pipe
/// only the contents are read again (one `tee` into a pipe of ours). The others (files: their
/// offset; eventfds and timers: their values; unix sockets: their queues; inotify instances:
/// their watches and queue) are read as always.
pub fn capture(proc: &Proc, cache: Option<&mut FdCache>, unchanged: bool) -> Result<Vec<FdImage>> {
    let pid = proc.pid;
    let mut no_paths = crate::inotify::PathCache::new();
    let mut no_tee = None;
    let (mut sockets, mut kept, mut stable, watched, mut pipe_ends, tee) = match cache {
        Some(c) => (
            Some(&mut c.sockets),
            Some(&mut c.links),
            Some(&mut c.stable),
            &mut c.inotify,
            Some(&mut c.pipes),
            &mut c.tee,
        ),
        None => (None, None, None, &mut no_paths, None, &mut no_tee),
    };
    // The kept links are taken out (not copied) and put back once the capture succeeded; a
    // failed capture leaves none, and the next one reads the table.
    let links = match kept
        .as_deref_mut()
        .filter(|_| unchanged)
        .and_then(Option::take)
    {
        Some(l) => l,
        None => read_links(proc)?,
    };
    // A full read refills it: what a number was before means nothing now.
    if !unchanged && let Some(c) = stable.as_deref_mut() {
        c.clear();
    }
    if !unchanged && let Some(c) = pipe_ends.as_deref_mut() {
        c.clear();
    }
    let pidfd = sys::pidfd_open(pid).map_err(perr(pid, "pidfd".into()))?;
    let mut pipes = HashSet::new();
    let mut diags = None;
    let mut out = Vec::with_capacity(links.len());
    for (fd, link) in &links {
        let (fd, link) = (*fd, link.as_str());
        if unchanged && let Some(img) = stable.as_deref().and_then(|c| c.get(&fd)) {
            out.push(FdImage { fd, ..img.clone() });
            continue;
        }
        if unchanged && let Some(img) = pipe_ends.as_deref().and_then(|c| c.get(&fd)) {
            let mut img = img.clone();
            if let FdKind::Pipe {
                id,
                write_end,
                buffered,
                ..
            } = &mut img.kind
                && pipes.insert(*id)
            {
                *buffered = peek_pipe(proc, &pidfd, fd, *write_end, tee)?;
            }
            out.push(img);
            continue;
        }
        let cached = match sockets.as_deref().and_then(|c| c.get(link)).cloned() {
            // Flags included: they change only through counted calls (a connected TCP socket
            // is restored as reset, where they hardly matter).
            Some((s, cloexec, flags)) if unchanged || s.state == SocketState::ConnectedTcp => {
                out.push(FdImage {
                    fd,
                    cloexec,
                    flags,
                    kind: FdKind::Socket(s),
                });
                continue;
            }
            // After a counted call only a socket in a state it never leaves is taken as it
            // was (its flags read again); a UDP socket may have been connected since.
            other => other
                .map(|e| e.0)
                .filter(|s| matches!(s.state, SocketState::Listening { .. })),
        };
        let mut char_device = false;
        let (info, raw) = proc.fdinfo(fd).map_err(perr(pid, format!("fdinfo {fd}")))?;
        let flags_octal = procfs::get(&info, "flags").unwrap_or("0");
        let all_flags = i32::from_str_radix(flags_octal, 8).unwrap_or(0);
        let cloexec = all_flags & libc::O_CLOEXEC != 0;
        let flags = all_flags & !libc::O_CLOEXEC;
        let kind = match cached {
            Some(s) => FdKind::Socket(s),
            // Read every pause: a watch goes away by itself when its file is deleted, and the
            // event queue must be empty.
            None if link == "anon_inode:inotify" => {
                crate::inotify::capture(proc, &pidfd, fd, &raw, watched)?
            }
            None => classify(
                proc,
                &pidfd,
                fd,
                link,
                &info,
                &raw,
                flags,
                &mut pipes,
                &mut diags,
                tee,
                &mut char_device,
            )?,
        };
        if let (Some(cache), FdKind::Socket(s)) = (sockets.as_deref_mut(), &kind)
            && changes_only_by_calls(s)
        {
            cache.insert(link.to_string(), (s.clone(), cloexec, flags));
        }
        let img = FdImage {
            fd,
            cloexec,
            flags,
            kind,
        };
        // A character device's offset means nothing (`/dev/null`, a terminal): like epoll
        // instances and signal descriptors, it changes only through counted calls.
        if let Some(c) = stable.as_deref_mut()
            && (char_device || matches!(img.kind, FdKind::Epoll { .. } | FdKind::SignalFd { .. }))
        {
            c.insert(fd, img.clone());
        }
        if let (Some(c), FdKind::Pipe { .. }) = (pipe_ends.as_deref_mut(), &img.kind) {
            let mut end = img.clone();
            if let FdKind::Pipe { buffered, .. } = &mut end.kind {
                buffered.clear();
            }
            c.insert(fd, end);
        }
        out.push(img);
    }
    if !unchanged {
        let live: HashSet<&str> = links.iter().map(|(_, l)| l.as_str()).collect();
        if let Some(cache) = sockets {
            cache.retain(|l, _| live.contains(l.as_str()));
        }
    }
    if let Some(d) = &diags {
        crate::unix::check_image(&out, d)?;
    }
    if let Some(k) = kept {
        *k = Some(links);
    }
    Ok(out)
}

/// Whether all a socket's image holds changes only through calls the descriptor count counts
/// (`bind`, `connect`, `listen`, `setsockopt`, `shutdown`, ...), so that it can be taken from
/// the cache while none was made: a listening or connected TCP socket, a connected UDP socket,
/// and a bound unconnected one (a UDP socket's image has no queue). Not an unbound UDP
/// socket: its first `sendto` (not counted) binds it to a port of the kernel's choosing.
fn changes_only_by_calls(s: &SocketImage) -> bool {
    match s.state {
        SocketState::Listening { .. } | SocketState::ConnectedTcp | SocketState::ConnectedUdp => {
            true
        }
        SocketState::Unconnected => s.ty == libc::SOCK_DGRAM && bound_port(&s.local) != 0,
    }
}

/// The port of a `sockaddr_in` / `sockaddr_in6` (bytes 2 and 3, network order); 0 when none.
fn bound_port(addr: &[u8]) -> u16 {
    addr.get(2..4)
        .map_or(0, |p| u16::from_be_bytes([p[0], p[1]]))
}

/// The descriptor numbers of the process, in order, with their `/proc/PID/fd` links.
fn read_links(proc: &Proc) -> Result<Vec<(i32, String)>> {
    let pid = proc.pid;
    let mut numbers: Vec<i32> = proc
        .list("fd")
        .map_err(perr(pid, "fd table".into()))?
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    numbers.sort_unstable();
    let mut links = Vec::with_capacity(numbers.len());
    for fd in numbers {
        match proc.read_link(&format!("fd/{fd}")) {
            Ok(l) => links.push((fd, l)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {} // closed meanwhile
            Err(e) => return Err(perr(pid, format!("fd {fd}"))(e)),
        }
    }
    Ok(links)
}

#[allow(clippy::too_many_arguments)]
fn classify(
    proc: &Proc,
    pidfd: &OwnedFd,
    fd: i32,
    link: &str,
    info: &[(String, String)],
    raw: &str,
    flags: i32,
    pipes: &mut HashSet<u64>,
    diags: &mut Option<HashMap<u64, crate::unix::Diag>>,
    tee: &mut Option<(OwnedFd, OwnedFd)>,
    char_device: &mut bool,
) -> Result<FdKind> {
    if let Some(path) = link.strip_prefix('/').map(|_| link) {
        if path.starts_with("/memfd:") {
            return Err(unsupported(
                fd,
                format!("memfd {path} is not supported yet"),
            ));
        }
        if path.ends_with(" (deleted)") {
            return Err(unsupported(
                fd,
                format!("{path}: open deleted files are not supported yet"),
            ));
        }
        let st = proc
            .stat(&format!("fd/{fd}"))
            .map_err(perr(proc.pid, format!("fd {fd}")))?;
        let fmt = st.st_mode & libc::S_IFMT;
        if fmt == libc::S_IFIFO || fmt == libc::S_IFSOCK {
            return Err(unsupported(
                fd,
                format!("{path}: named FIFOs/sockets are not supported yet"),
            ));
        }
        *char_device = fmt == libc::S_IFCHR;
        let pos = procfs::get(info, "pos")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        return Ok(FdKind::Path {
            path: path.to_string(),
            pos,
            is_dir: fmt == libc::S_IFDIR,
        });
    }
    if let Some(ino) = link
        .strip_prefix("pipe:[")
        .and_then(|s| s.strip_suffix(']'))
    {
        let id: u64 = ino.parse().unwrap_or(0);
        let write_end = flags & libc::O_ACCMODE == libc::O_WRONLY;
        let capacity = pipe_capacity(proc, fd)?;
        // The buffered bytes go with the first end seen.
        let buffered = if pipes.insert(id) {
            peek_pipe(proc, pidfd, fd, write_end, tee)?
        } else {
            Vec::new()
        };
        return Ok(FdKind::Pipe {
            id,
            write_end,
            buffered,
            capacity,
        });
    }
    if link.starts_with("socket:[") {
        let dup = sys::pidfd_getfd(pidfd, fd).map_err(perr(proc.pid, format!("socket fd {fd}")))?;
        if sys::getsockopt_int(dup.as_raw_fd(), libc::SOL_SOCKET, libc::SO_DOMAIN)
            .is_ok_and(|d| d == libc::AF_UNIX)
        {
            let ino = link
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if diags.is_none() {
                *diags = Some(
                    crate::unix::diag(proc)
                        .map_err(perr(proc.pid, "unix socket diagnostics".into()))?,
                );
            }
            let d = diags.as_ref().expect("just set");
            return crate::unix::capture(fd, dup.as_raw_fd(), ino, d, proc).map(FdKind::Unix);
        }
        return capture_socket(fd, dup.as_raw_fd()).map(FdKind::Socket);
    }
    match link {
        "anon_inode:[eventpoll]" => {
            let mut interests = Vec::new();
            for line in raw.lines().filter(|l| l.starts_with("tfd:")) {
                let w: Vec<&str> = line.split_whitespace().collect();
                let field = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1));
                let tfd = field("tfd:").and_then(|v| v.parse().ok());
                let ev = field("events:").and_then(|v| u32::from_str_radix(v, 16).ok());
                let data = field("data:").and_then(|v| u64::from_str_radix(v, 16).ok());
                match (tfd, ev, data) {
                    (Some(fd), Some(events), Some(data)) => {
                        interests.push(EpollInterest { fd, events, data })
                    }
                    _ => return Err(unsupported(fd, format!("unparsable epoll entry {line:?}"))),
                }
            }
            Ok(FdKind::Epoll { interests })
        }
        "anon_inode:[eventfd]" => {
            let count = procfs::get(info, "eventfd-count")
                .and_then(|v| u64::from_str_radix(v, 16).ok())
                .ok_or_else(|| unsupported(fd, "eventfd without a count"))?;
            let semaphore = procfs::get(info, "eventfd-semaphore") == Some("1");
            Ok(FdKind::EventFd { count, semaphore })
        }
        "anon_inode:[timerfd]" => {
            let num = |k: &str| procfs::get(info, k).and_then(|v| v.parse::<u64>().ok());
            let ts = |k: &str| procfs::get(info, k).and_then(procfs::parse_timespec);
            match (
                num("clockid"),
                num("ticks"),
                ts("it_value"),
                ts("it_interval"),
            ) {
                (Some(c), Some(ticks), Some(value_ns), Some(interval_ns)) => Ok(FdKind::TimerFd {
                    clockid: c as i32,
                    ticks,
                    value_ns,
                    interval_ns,
                }),
                _ => Err(unsupported(fd, "unparsable timerfd state")),
            }
        }
        "anon_inode:[signalfd]" => {
            let mask = procfs::get(info, "sigmask")
                .and_then(|v| u64::from_str_radix(v, 16).ok())
                .ok_or_else(|| unsupported(fd, "signalfd without a mask"))?;
            Ok(FdKind::SignalFd { mask })
        }
        other => Err(unsupported(fd, format!("{other} is not supported yet"))),
    }
}

fn pipe_capacity(proc: &Proc, fd: i32) -> Result<u32> {
    let f = open_proc_fd(proc, fd)?;
    // SAFETY: F_GETPIPE_SZ takes no pointer.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETPIPE_SZ) };
    Ok(if r > 0 { r as u32 } else { 65536 })
}

fn open_proc_fd(proc: &Proc, fd: i32) -> Result<OwnedFd> {
    // Reopening a pipe through /proc gives a new file on the same pipe.
    proc.open_file(&format!("fd/{fd}"), libc::O_RDONLY | libc::O_NONBLOCK)
        .map(OwnedFd::from)
        .map_err(perr(proc.pid, format!("reopening fd {fd}")))
}

/// Copies the bytes buffered in a pipe without consuming them: `tee` into `tee`, a pipe of ours
/// kept between captures (made here the first time). The source must be readable: a read end
/// is duplicated (`pidfd_getfd`, the same open file); a write end is reopened through
/// `/proc/PID/fd` for reading, which adds a reader to the pipe only until it is closed here,
/// while the process is stopped.
fn peek_pipe(
    proc: &Proc,
    pidfd: &OwnedFd,
    fd: i32,
    write_end: bool,
    tee: &mut Option<(OwnedFd, OwnedFd)>,
) -> Result<Vec<u8>> {
    const MAX: usize = 1 << 20;
    let pid = proc.pid;
    let src = if write_end {
        open_proc_fd(proc, fd)?
    } else {
        sys::pidfd_getfd(pidfd, fd).map_err(perr(pid, format!("pipe fd {fd}")))?
    };
    if tee.is_none() {
        let (r, w) =
            sys::pipe(libc::O_CLOEXEC | libc::O_NONBLOCK).map_err(perr(pid, "pipe".into()))?;
        // SAFETY: F_SETPIPE_SZ takes an int; 1 MiB is within the default pipe-max-size.
        unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, MAX as libc::c_int) };
        *tee = Some((r, w));
    }
    let Some((r, w)) = tee.as_ref() else {
        unreachable!("made just above")
    };
    // SAFETY: tee between two pipe descriptors we hold. SPLICE_F_NONBLOCK: an empty source
    // gives EAGAIN instead of waiting (the source itself may be a blocking descriptor).
    let n = unsafe { libc::tee(src.as_raw_fd(), w.as_raw_fd(), MAX, libc::SPLICE_F_NONBLOCK) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EAGAIN) {
            return Ok(Vec::new()); // empty pipe
        }
        return Err(perr(pid, format!("peeking pipe fd {fd}"))(e));
    }
    let mut buf = vec![0u8; n as usize];
    let mut got = 0;
    // Our pipe is drained whole, so that the next capture's `tee` starts from empty.
    while got < buf.len() {
        // SAFETY: `buf[got..]` has room for the bytes read.
        let k = unsafe {
            libc::read(
                r.as_raw_fd(),
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
            )
        };
        if k <= 0 {
            // Our own pipe holds what tee put there: a failure leaves it in an unknown state.
            *tee = None;
            return Err(perr(pid, format!("reading the copy of pipe fd {fd}"))(
                io::Error::last_os_error(),
            ));
        }
        got += k as usize;
    }
    Ok(buf)
}

const INT_OPTS: &[(i32, i32)] = &[
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, libc::SO_REUSEPORT),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_BROADCAST),
    (libc::SOL_SOCKET, libc::SO_OOBINLINE),
    (libc::SOL_SOCKET, libc::SO_PRIORITY),
    (libc::SOL_SOCKET, libc::SO_MARK),
];
const TCP_OPTS: &[(i32, i32)] = &[
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
    (libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT),
];

fn capture_socket(fd: i32, s: RawFd) -> Result<SocketImage> {
    let opt = |l, n| {
        sys::getsockopt_int(s, l, n).map_err(|e| unsupported(fd, format!("socket option: {e}")))
    };
    let family = opt(libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    let ty = opt(libc::SOL_SOCKET, libc::SO_TYPE)?;
    let protocol = opt(libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
    if family != libc::AF_INET && family != libc::AF_INET6 {
        let name = match family {
            libc::AF_UNIX => "a unix-domain socket",
            libc::AF_NETLINK => "a netlink socket",
            _ => "a socket of an unsupported family",
        };
        return Err(unsupported(fd, format!("{name} is not supported yet")));
    }
    if ty != libc::SOCK_STREAM && ty != libc::SOCK_DGRAM {
        return Err(unsupported(
            fd,
            format!("socket type {ty} is not supported yet"),
        ));
    }
    let local = sys::sock_addr(s, false).map_err(|e| unsupported(fd, e))?;
    let peer = sys::sock_addr(s, true).map_err(|e| unsupported(fd, e))?;
    let mut options = Vec::new();
    let mut want: Vec<(i32, i32)> = INT_OPTS.to_vec();
    if ty == libc::SOCK_STREAM {
        want.extend_from_slice(TCP_OPTS);
    }
    if family == libc::AF_INET6 {
        want.push((libc::IPPROTO_IPV6, libc::IPV6_V6ONLY));
    }
    for (l, n) in want {
        if let Ok(v) = sys::getsockopt_int(s, l, n)
            && v != 0
        {
            options.push((l, n, v));
        }
    }
    let state = if ty == libc::SOCK_STREAM {
        let (tcp_state, backlog) = tcp_state(s).map_err(|e| unsupported(fd, e))?;
        match tcp_state {
            10 => SocketState::Listening { backlog },
            7 => SocketState::Unconnected, // TCP_CLOSE: fresh or bound
            1 | 8 => SocketState::ConnectedTcp, // ESTABLISHED, CLOSE_WAIT
            st => {
                // SYN_SENT, FIN_WAIT, ...: restored as reset too (the peer sees the reset).
                tracing::debug!(
                    fd,
                    st,
                    "TCP socket in a transitional state, restored as reset"
                );
                SocketState::ConnectedTcp
            }
        }
    } else if peer.is_empty() {
        SocketState::Unconnected
    } else {
        SocketState::ConnectedUdp
    };
    Ok(SocketImage {
        family,
        ty,
        protocol,
        state,
        local,
        peer,
        options,
    })
}

/// (tcpi_state, max backlog) from TCP_INFO; for a listener `tcpi_sacked` is the backlog.
fn tcp_state(s: RawFd) -> io::Result<(u8, i32)> {
    let mut buf = [0u8; 104];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf`/`len` describe a writable buffer; the kernel truncates to it.
    sys::cvt_i(unsafe {
        libc::getsockopt(
            s,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    })?;
    // struct tcp_info: u8 state, ...; u32 tcpi_sacked at offset 28.
    Ok((
        buf[0],
        u32::from_le_bytes(buf[28..32].try_into().unwrap()) as i32,
    ))
}

// ---------------------------------------------------------------------------------------------
// Restore side: runs in the restore child inside the sandbox.

/// Why a descriptor could not be recreated.
#[derive(Debug, thiserror::Error)]
#[error("recreating file descriptor {fd} ({what}): {source}")]
pub struct RecreateError {
    pub fd: i32,
    pub what: String,
    pub source: io::Error,
}

fn rerr(fd: i32, what: &str) -> impl FnOnce(io::Error) -> RecreateError {
    let what = what.to_string();
    move |source| RecreateError { fd, what, source }
}

/// Moves `tmp` to descriptor number `target` (without close-on-exec).
fn place(tmp: RawFd, target: RawFd) -> io::Result<()> {
    if tmp == target {
        // SAFETY: clearing FD_CLOEXEC on a descriptor we own.
        check(unsafe { libc::fcntl(tmp, libc::F_SETFD, 0) })?;
        return Ok(());
    }
    // SAFETY: dup2 onto a number we are filling; then close the temporary.
    check(unsafe { libc::dup2(tmp, target) })?;
    // SAFETY: `tmp` is a temporary descriptor we own.
    unsafe { libc::close(tmp) };
    Ok(())
}

/// Moves a fresh descriptor above every target number so it cannot be clobbered.
fn lift(fd: RawFd, floor: RawFd) -> io::Result<RawFd> {
    // SAFETY: F_DUPFD_CLOEXEC duplicates to the lowest free number >= floor.
    let n = check(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor) })?;
    // SAFETY: closing the original, which we own.
    unsafe { libc::close(fd) };
    Ok(n)
}

/// Moves a fresh descriptor above `floor` ([`lift`]), then to number `target` ([`place`]).
fn install(fd: RawFd, target: RawFd, floor: RawFd) -> io::Result<()> {
    place(lift(fd, floor)?, target)
}

/// Recreates every descriptor at its old number. `floor` is above every target number and
/// every descriptor the caller still needs. A descriptor that names a description the tree
/// shares ([`FdKind::Shared`] `i`) is a duplicate of descriptor `shared_base + i`, which the
/// caller inherited (see `restore::make_tree`).
///
/// A connected TCP socket with a connection in `tcp` carries it on ([`crate::tcp::restore`]);
/// one without, or whose connection cannot be recreated, is reset by its peer. Returns what
/// was reset instead of carried on, for the caller to report.
pub fn recreate(
    fds: &[FdImage],
    tcp: &[TcpConn],
    floor: RawFd,
    shared_base: RawFd,
) -> std::result::Result<Vec<String>, RecreateError> {
    let mut notes = Vec::new();
    let mut pipes_done = HashSet::new();
    crate::unix::recreate(fds, floor).map_err(|e| RecreateError {
        fd: e.fd,
        what: format!("unix socket {}", e.what),
        source: e.source,
    })?;
    for f in fds {
        match &f.kind {
            FdKind::Unix(_) => {}
            FdKind::Shared(i) => {
                let from = RawFd::try_from(*i)
                    .ok()
                    .and_then(|i| shared_base.checked_add(i))
                    .ok_or_else(|| {
                        rerr(f.fd, "shared description")(io::ErrorKind::InvalidInput.into())
                    })?;
                // SAFETY: dup2 of an inherited descriptor onto the number we are filling (the
                // copy shares the description: status flags and offset are the description's).
                check(unsafe { libc::dup2(from, f.fd) })
                    .map_err(rerr(f.fd, "shared description"))?;
            }
            FdKind::Path { path, pos, is_dir } => {
                let mut flags = f.flags & !(libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL);
                if *is_dir {
                    flags |= libc::O_DIRECTORY;
                }
                let c = CString::new(path.as_str()).unwrap();
                // SAFETY: valid C string; flags are the file's old status flags.
                let tmp = check(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) })
                    .map_err(rerr(f.fd, path))?;
                if *pos != 0 {
                    // SAFETY: lseek on a descriptor we own.
                    unsafe { libc::lseek(tmp, *pos as i64, libc::SEEK_SET) };
                }
                install(tmp, f.fd, floor).map_err(rerr(f.fd, path))?;
            }
            FdKind::Pipe { id, .. } => {
                if !pipes_done.insert(*id) {
                    continue;
                }
                recreate_pipe(fds, *id, floor)?;
            }
            FdKind::Socket(s) => {
                let conn = tcp.iter().find(|c| c.fd == f.fd);
                let tmp = recreate_socket(f, s, conn, floor, &mut notes)?;
                place(tmp, f.fd).map_err(rerr(f.fd, "socket"))?;
            }
            FdKind::EventFd { count, semaphore } => {
                let mut fl = libc::EFD_CLOEXEC | (f.flags & libc::O_NONBLOCK);
                if *semaphore {
                    fl |= libc::EFD_SEMAPHORE;
                }
                // SAFETY: plain eventfd creation.
                let tmp = check(unsafe { libc::eventfd(0, fl) }).map_err(rerr(f.fd, "eventfd"))?;
                if *count > 0 {
                    // SAFETY: writes 8 bytes from a live u64.
                    unsafe { libc::write(tmp, (count as *const u64).cast(), 8) };
                }
                install(tmp, f.fd, floor).map_err(rerr(f.fd, "eventfd"))?;
            }
            FdKind::TimerFd {
                clockid,
                ticks,
                value_ns,
                interval_ns,
            } => {
                let tmp = recreate_timerfd(f, *clockid, *ticks, *value_ns, *interval_ns)
                    .map_err(rerr(f.fd, "timerfd"))?;
                install(tmp, f.fd, floor).map_err(rerr(f.fd, "timerfd"))?;
            }
            FdKind::SignalFd { mask } => {
                let fl = libc::SFD_CLOEXEC | (f.flags & libc::O_NONBLOCK);
                // SAFETY: the kernel reads 8 bytes of mask (sizemask = 8).
                let tmp = check(unsafe {
                    libc::syscall(libc::SYS_signalfd4, -1, mask as *const u64, 8, fl) as i32
                })
                .map_err(rerr(f.fd, "signalfd"))?;
                install(tmp, f.fd, floor).map_err(rerr(f.fd, "signalfd"))?;
            }
            FdKind::Inotify { watches } => {
                let tmp =
                    crate::inotify::recreate(f.flags, watches).map_err(rerr(f.fd, "inotify"))?;
                install(tmp, f.fd, floor).map_err(rerr(f.fd, "inotify"))?;
            }
            FdKind::Epoll { .. } => {
                // SAFETY: plain epoll creation.
                let tmp = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })
                    .map_err(rerr(f.fd, "epoll"))?;
                install(tmp, f.fd, floor).map_err(rerr(f.fd, "epoll"))?;
            }
        }
    }
    // Interest lists once every descriptor exists.
    for f in fds {
        if let FdKind::Epoll { interests } = &f.kind {
            for i in interests {
                let mut ev = libc::epoll_event {
                    events: i.events,
                    u64: i.data,
                };
                // SAFETY: `ev` is a valid epoll_event.
                check(unsafe { libc::epoll_ctl(f.fd, libc::EPOLL_CTL_ADD, i.fd, &mut ev) })
                    .map_err(rerr(f.fd, &format!("epoll interest in fd {}", i.fd)))?;
            }
        }
    }
    Ok(notes)
}

fn recreate_pipe(fds: &[FdImage], id: u64, floor: RawFd) -> std::result::Result<(), RecreateError> {
    let ends: Vec<&FdImage> = fds
        .iter()
        .filter(|f| matches!(f.kind, FdKind::Pipe { id: i, .. } if i == id))
        .collect();
    let first = ends[0].fd;
    let (r, w) = sys::pipe(libc::O_CLOEXEC).map_err(rerr(first, "pipe"))?;
    let r = lift(r.into_raw_fd(), floor).map_err(rerr(first, "pipe"))?;
    let w = lift(w.into_raw_fd(), floor).map_err(rerr(first, "pipe"))?;
    let mut buffered: &[u8] = &[];
    for e in &ends {
        if let FdKind::Pipe {
            capacity,
            buffered: b,
            ..
        } = &e.kind
        {
            // SAFETY: F_SETPIPE_SZ takes an int.
            unsafe { libc::fcntl(w, libc::F_SETPIPE_SZ, *capacity as i32) };
            if !b.is_empty() {
                buffered = b;
            }
        }
    }
    if !buffered.is_empty() {
        // SAFETY: writes from a live slice; the pipe is as large as the original.
        let n = unsafe { libc::write(w, buffered.as_ptr().cast(), buffered.len()) };
        if n != buffered.len() as isize {
            return Err(rerr(first, "pipe contents")(io::Error::last_os_error()));
        }
    }
    for e in &ends {
        let FdKind::Pipe { write_end, .. } = e.kind else {
            unreachable!()
        };
        let src = if write_end { w } else { r };
        // SAFETY: dup2 onto the target number; status flags set per end.
        check(unsafe { libc::dup2(src, e.fd) }).map_err(rerr(e.fd, "pipe"))?;
        // SAFETY: F_SETFL takes an int.
        unsafe { libc::fcntl(e.fd, libc::F_SETFL, e.flags & libc::O_NONBLOCK) };
    }
    // SAFETY: closing our temporaries; an end absent from the image stays closed, as it was.
    unsafe {
        libc::close(r);
        libc::close(w);
    }
    Ok(())
}

fn recreate_timerfd(
    f: &FdImage,
    clockid: i32,
    ticks: u64,
    value_ns: u64,
    interval_ns: u64,
) -> io::Result<RawFd> {
    let fl = libc::TFD_CLOEXEC | (f.flags & libc::O_NONBLOCK);
    // SAFETY: plain timerfd creation.
    let fd = check(unsafe { libc::timerfd_create(clockid, fl) })?;
    let ts = |ns: u64| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as i64,
        tv_nsec: (ns % 1_000_000_000) as i64,
    };
    let spec = libc::itimerspec {
        it_interval: ts(interval_ns),
        it_value: ts(value_ns),
    };
    // SAFETY: `spec` is valid; relative time (fdinfo reports the remaining time).
    check(unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) })?;
    if ticks > 0 {
        const TFD_IOC_SET_TICKS: libc::c_ulong = 0x4008_5400;
        // SAFETY: the ioctl reads one u64 (needs CONFIG_CHECKPOINT_RESTORE, present here).
        check(unsafe { libc::ioctl(fd, TFD_IOC_SET_TICKS, &ticks as *const u64) })?;
    }
    Ok(fd)
}

fn recreate_socket(
    f: &FdImage,
    s: &SocketImage,
    conn: Option<&TcpConn>,
    floor: RawFd,
    notes: &mut Vec<String>,
) -> std::result::Result<RawFd, RecreateError> {
    let e = |what: &'static str| rerr(f.fd, what);
    let ty = s.ty
        | libc::SOCK_CLOEXEC
        | if f.flags & libc::O_NONBLOCK != 0 {
            libc::SOCK_NONBLOCK
        } else {
            0
        };
    if s.state == SocketState::ConnectedTcp {
        if let Some(c) = conn {
            match crate::tcp::restore(s, c, true) {
                Ok(sock) => {
                    let fd = lift(sock.into_raw_fd(), floor).map_err(e("socket"))?;
                    if f.flags & libc::O_NONBLOCK != 0 {
                        // SAFETY: F_SETFL on a descriptor we own.
                        check(unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) })
                            .map_err(e("socket flags"))?;
                    }
                    return Ok(fd);
                }
                Err(err) => notes.push(format!(
                    "the TCP connection of descriptor {} was reset: {err}",
                    f.fd
                )),
            }
        } else {
            notes.push(format!(
                "the TCP connection of descriptor {} was reset: the checkpoint does not carry it",
                f.fd
            ));
        }
        return reset_connection(s, ty, floor).map_err(e("reset TCP connection"));
    }
    // SAFETY: plain socket creation.
    let fd = check(unsafe { libc::socket(s.family, ty, s.protocol) }).map_err(e("socket"))?;
    let fd = lift(fd, floor).map_err(e("socket"))?;
    for &(l, n, v) in &s.options {
        sys::setsockopt_int(fd, l, n, v).map_err(e("socket option"))?;
    }
    if !s.local.is_empty() && !is_unspecified_port_zero(&s.local) {
        // SAFETY: `local` holds a sockaddr of its own length, as the kernel gave it.
        check(unsafe { libc::bind(fd, s.local.as_ptr().cast(), s.local.len() as u32) })
            .map_err(e("bind"))?;
    }
    match s.state {
        SocketState::Listening { backlog } => {
            // SAFETY: plain listen.
            check(unsafe { libc::listen(fd, backlog.max(1)) }).map_err(e("listen"))?;
        }
        SocketState::ConnectedUdp => {
            // SAFETY: `peer` holds a sockaddr of its own length.
            check(unsafe { libc::connect(fd, s.peer.as_ptr().cast(), s.peer.len() as u32) })
                .map_err(e("connect"))?;
        }
        _ => {}
    }
    Ok(fd)
}

/// The wildcard address with port 0: the socket was never bound.
fn is_unspecified_port_zero(sa: &[u8]) -> bool {
    let port_zero = sa.len() >= 4 && sa[2] == 0 && sa[3] == 0;
    let addr = if sa.len() >= 24 {
        &sa[8..24]
    } else if sa.len() >= 8 {
        &sa[4..8]
    } else {
        &[][..]
    };
    port_zero && addr.iter().all(|&b| b == 0)
}

/// A TCP socket whose connection was reset by its peer, as Tardigrade restores connections: we
/// connect it over loopback to a listener of ours and abort the accepted side (SO_LINGER 0).
fn reset_connection(s: &SocketImage, ty: i32, floor: RawFd) -> io::Result<RawFd> {
    let (fam, addr): (i32, Vec<u8>) = if s.family == libc::AF_INET6 {
        // SAFETY: plain data, all-zero is valid.
        let mut a: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        a.sin6_family = libc::AF_INET6 as u16;
        a.sin6_addr.s6_addr[15] = 1;
        (libc::AF_INET6, sys::as_bytes(&a).to_vec())
    } else {
        // SAFETY: plain data, all-zero is valid.
        let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        a.sin_family = libc::AF_INET as u16;
        a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        (libc::AF_INET, sys::as_bytes(&a).to_vec())
    };
    // SAFETY: plain socket calls on descriptors we own; addresses are valid sockaddrs.
    unsafe {
        let l = check(libc::socket(fam, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0))?;
        let l = OwnedFd::from_raw_fd(l);
        check(libc::bind(
            l.as_raw_fd(),
            addr.as_ptr().cast(),
            addr.len() as u32,
        ))?;
        check(libc::listen(l.as_raw_fd(), 1))?;
        let mut bound = vec![0u8; 128];
        let mut blen = bound.len() as u32;
        check(libc::getsockname(
            l.as_raw_fd(),
            bound.as_mut_ptr().cast(),
            &mut blen,
        ))?;
        let c = check(libc::socket(
            fam,
            (ty & !libc::SOCK_NONBLOCK) | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let c = lift(c, floor)?;
        check(libc::connect(c, bound.as_ptr().cast(), blen))?;
        let a = OwnedFd::from_raw_fd(check(libc::accept4(
            l.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        ))?);
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        );
        drop(a); // sends RST
        if ty & libc::SOCK_NONBLOCK != 0 {
            libc::fcntl(c, libc::F_SETFL, libc::O_NONBLOCK | libc::O_RDWR);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests;
