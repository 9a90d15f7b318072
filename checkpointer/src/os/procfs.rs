//! Reading `/proc/PID/*`: a [`Proc`] directory handle, the parsers, and [`in_view`], which runs
//! code with the process's own view of paths. No ptrace here.

use crate::sys::Pid;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// One line of `/proc/PID/smaps` with its `VmFlags`.
#[derive(Debug, Clone)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    pub offset: u64,
    /// The device of the mapped file (`major << 32 | minor`; 0 for anonymous memory).
    pub dev: u64,
    pub inode: u64,
    pub name: String,
    pub vmflags: Vec<String>,
    /// The kernel's mapping this entry lies in, as `map_files/` names it: the entry itself,
    /// unless a tracker rewrote the layout (see `crate::agent::normalize`).
    pub kernel: (u64, u64),
}

impl MapEntry {
    pub fn has_flag(&self, f: &str) -> bool {
        self.vmflags.iter().any(|x| x == f)
    }
    pub fn prot(&self) -> u32 {
        (self.read as u32) | (self.write as u32) << 1 | (self.exec as u32) << 2
    }
}

fn parse_map_line(line: &str) -> Option<MapEntry> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?.as_bytes();
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let (major, minor) = it.next()?.split_once(':')?;
    let dev = u64::from_str_radix(major, 16).ok()? << 32 | u64::from_str_radix(minor, 16).ok()?;
    let inode = it.next()?.parse().ok()?;
    let name = it.next().unwrap_or("").trim_start().to_string();
    let (s, e) = range.split_once('-')?;
    let (start, end) = (
        u64::from_str_radix(s, 16).ok()?,
        u64::from_str_radix(e, 16).ok()?,
    );
    Some(MapEntry {
        start,
        end,
        read: perms.first() == Some(&b'r'),
        write: perms.get(1) == Some(&b'w'),
        exec: perms.get(2) == Some(&b'x'),
        shared: perms.get(3) == Some(&b's'),
        offset,
        dev,
        inode,
        name,
        vmflags: Vec::new(),
        kernel: (start, end),
    })
}

/// `/proc/PID` of one process, held as a directory descriptor.
///
/// Every read goes through the descriptor (`openat`, `readlinkat`, ...), never through a path
/// from `/`, so a `Proc` keeps working in a thread that has chroot'ed into the process's own root
/// (see [`in_view`]) — where the kernel prints paths as the process sees them.
pub struct Proc {
    pub pid: Pid,
    dir: OwnedFd,
}

fn cstr(rel: &str) -> CString {
    CString::new(rel).expect("no NUL in /proc paths")
}

impl Proc {
    pub fn open(pid: Pid) -> io::Result<Proc> {
        let p = cstr(&format!("/proc/{pid}"));
        // SAFETY: valid C string; on success the descriptor is ours.
        let fd = unsafe {
            libc::open(
                p.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Proc { pid, dir })
    }

    /// `/proc/PID` of another process `pid` (a host PID), through this one's `/proc`: works
    /// inside [`in_view`], where `/proc` is the sandbox's.
    pub fn open_other(&self, pid: Pid) -> io::Result<Proc> {
        let dir = self.open_file(&format!("../{pid}"), libc::O_PATH | libc::O_DIRECTORY)?;
        Ok(Proc {
            pid,
            dir: OwnedFd::from(dir),
        })
    }

    /// Another handle on the same `/proc/PID` directory.
    pub fn try_clone(&self) -> io::Result<Proc> {
        Ok(Proc {
            pid: self.pid,
            dir: self.dir.try_clone()?,
        })
    }

    /// A duplicate of the `/proc/PID` directory descriptor.
    pub fn dir_fd(&self) -> io::Result<OwnedFd> {
        self.dir.try_clone()
    }

    /// Opens `rel` (relative to `/proc/PID`; magic links like `fd/3` are followed).
    /// Opens `rel` under the host's `/proc` (the parent of this process's directory, reachable
    /// even after a chroot): e.g. `self/map_files/...` of the caller's own mappings.
    pub fn open_host(&self, rel: &str, flags: i32) -> io::Result<File> {
        self.open_file(&format!("../{rel}"), flags)
    }

    pub fn open_file(&self, rel: &str, flags: i32) -> io::Result<File> {
        let c = cstr(rel);
        // SAFETY: valid C string relative to our directory descriptor.
        let fd = unsafe { libc::openat(self.dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    pub fn read(&self, rel: &str) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        self.open_file(rel, libc::O_RDONLY)?.read_to_end(&mut v)?;
        Ok(v)
    }

    /// The whole of a (proc) file as text. Proc files report a size of 0, for which
    /// `read_to_string` starts with 32-byte reads and doubles: eleven system calls for a
    /// process's `maps`. Reading into a 16 KiB buffer takes one, plus the one that sees the
    /// end (a `seq_file` read fills the buffer with as many records as fit).
    pub fn read_string(&self, rel: &str) -> io::Result<String> {
        let mut f = self.open_file(rel, libc::O_RDONLY)?;
        let mut buf = vec![0u8; 16 << 10];
        let mut n = 0;
        loop {
            if n == buf.len() {
                buf.resize(buf.len() * 2, 0);
            }
            match f.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(n);
        String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    pub fn read_link(&self, rel: &str) -> io::Result<String> {
        let c = cstr(rel);
        let mut buf = vec![0u8; 4096];
        // SAFETY: `buf` is writable for its length; `c` is a valid C string.
        let n = unsafe {
            libc::readlinkat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// `fstatat` following links (for `fd/N`: the open file itself).
    pub fn stat(&self, rel: &str) -> io::Result<libc::stat> {
        let c = cstr(rel);
        // SAFETY: `st` is plain data the kernel fills.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid C string and out-pointer.
        if unsafe { libc::fstatat(self.dir.as_raw_fd(), c.as_ptr(), &mut st, 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }

    /// Entry names of directory `rel`.
    pub fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let d = self.open_file(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32768];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_getdents64,
                    d.as_raw_fd(),
                    buf.as_mut_ptr(),
                    buf.len(),
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Ok(out);
            }
            let mut off = 0usize;
            while off < n as usize {
                let reclen = u16::from_le_bytes([buf[off + 16], buf[off + 17]]) as usize;
                let name = &buf[off + 19..off + reclen];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                if name != b"." && name != b".." {
                    out.push(String::from_utf8_lossy(name).into_owned());
                }
                off += reclen;
            }
        }
    }

    pub fn smaps(&self) -> io::Result<Vec<MapEntry>> {
        Ok(parse_smaps(&self.read_string("smaps")?))
    }

    /// `/proc/PID/maps` (no `VmFlags`; much cheaper than smaps).
    pub fn maps(&self) -> io::Result<Vec<MapEntry>> {
        Ok(self
            .read_string("maps")?
            .lines()
            .filter_map(parse_map_line)
            .collect())
    }

    /// The mapping that holds `addr`, as `(start, end)` (`None`: no mapping holds it), asked
    /// of the kernel with the `PROCMAP_QUERY` ioctl (Linux >= 6.11) on `maps`, this process's
    /// `/proc/PID/maps` opened once: no text is produced or parsed, so this costs a few
    /// microseconds however many mappings the process has.
    pub fn mapping_at(maps: &File, addr: u64) -> io::Result<Option<(u64, u64)>> {
        // struct procmap_query (include/uapi/linux/fs.h): `size` first, then the query's
        // flags and address; the kernel fills in the rest. No name or build id is asked for
        // (their sizes stay 0, so the kernel writes nothing through the address fields).
        #[repr(C)]
        #[derive(Default)]
        struct ProcmapQuery {
            size: u64,
            query_flags: u64,
            query_addr: u64,
            vma_start: u64,
            vma_end: u64,
            vma_flags: u64,
            vma_page_size: u64,
            vma_offset: u64,
            inode: u64,
            dev_major: u32,
            dev_minor: u32,
            vma_name_size: u32,
            build_id_size: u32,
            vma_name_addr: u64,
            build_id_addr: u64,
        }
        // _IOWR('f', 17, struct procmap_query)
        const PROCMAP_QUERY: u64 =
            (3 << 30) | ((size_of::<ProcmapQuery>() as u64) << 16) | (0x66 << 8) | 17;
        let mut q = ProcmapQuery {
            size: size_of::<ProcmapQuery>() as u64,
            query_addr: addr,
            ..Default::default()
        };
        // SAFETY: `q` is a properly sized and initialised procmap_query that lives across
        // the call; the kernel reads `size` to know how much of it to use and writes only
        // within it (no name or build id buffers are given).
        let r = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // ENOENT: no mapping holds the address.
            return if e.raw_os_error() == Some(libc::ENOENT) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        Ok(Some((q.vma_start, q.vma_end)))
    }

    /// Fields of `/proc/PID/stat`; index 0 is field 1 of proc(5).
    pub fn stat_fields(&self) -> io::Result<Vec<String>> {
        let text = self.read_string("stat")?;
        // comm may contain spaces and parentheses: split after the last ')'.
        let close = text
            .rfind(')')
            .ok_or_else(|| io::Error::other("malformed stat"))?;
        let open = text
            .find('(')
            .ok_or_else(|| io::Error::other("malformed stat"))?;
        let mut v = vec![
            text[..open].trim().to_string(),
            text[open + 1..close].to_string(),
        ];
        v.extend(text[close + 1..].split_whitespace().map(str::to_string));
        Ok(v)
    }

    /// A `Key:\tvalue` line of `status` or `task/TID/status`.
    pub fn status_field(&self, rel: &str, key: &str) -> io::Result<String> {
        let text = self.read_string(rel)?;
        status_value(&text, key)
            .map(str::to_string)
            .ok_or_else(|| io::Error::other(format!("{rel}: no field {key}")))
    }

    /// The innermost PID of thread `tid` (its TID inside the sandbox).
    pub fn ns_pid(&self, tid: Pid) -> io::Result<Pid> {
        let v = self.status_field(&format!("task/{tid}/status"), "NSpid")?;
        v.split_whitespace()
            .last()
            .and_then(|x| x.parse().ok())
            .ok_or_else(|| io::Error::other("malformed NSpid"))
    }

    pub fn tids(&self) -> io::Result<Vec<Pid>> {
        let mut v: Vec<Pid> = self
            .list("task")?
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// `key:\tvalue` pairs of `fdinfo/FD`, plus the raw text (for epoll's `tfd:` lines).
    pub fn fdinfo(&self, fd: i32) -> io::Result<(Vec<(String, String)>, String)> {
        let text = self.read_string(&format!("fdinfo/{fd}"))?;
        let kv = text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Ok((kv, text))
    }
}

/// Runs `f` in a thread whose root is process `pid`'s root, with a [`Proc`] opened before the
/// chroot. The kernel prints paths (maps, fd links, exe, cwd) relative to the *reader's* root, so
/// inside `f` they read exactly as the sandboxed process sees them. The thread is also in the
/// process's IPC namespace (System V shared memory: `/proc/sysvipc/shm` lists the reader's
/// namespace's segments, `shmat` attaches by id in it; see `crate::shm`).
pub fn in_view<T: Send>(pid: Pid, f: impl FnOnce(&Proc) -> T + Send) -> io::Result<T> {
    let proc = Proc::open(pid)?;
    let ipc = proc.open_file("ns/ipc", libc::O_RDONLY)?;
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<T> {
            let root = cstr(&format!("/proc/{pid}/root"));
            // SAFETY: unshare(CLONE_FS) gives this thread its own root and cwd, shared with no
            // other thread; chroot/chdir then change only those (we are root: CAP_SYS_CHROOT).
            // An IPC namespace is per thread (no single-thread rule, unlike the user and mount
            // namespaces): setns changes this thread's only, which makes no IPC call of its own.
            unsafe {
                if libc::unshare(libc::CLONE_FS) < 0
                    || libc::setns(ipc.as_raw_fd(), libc::CLONE_NEWIPC) < 0
                    || libc::chroot(root.as_ptr()) < 0
                    || libc::chdir(c"/".as_ptr()) < 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(f(&proc))
        })
        .join()
        .map_err(|_| io::Error::other("the checkpoint thread panicked"))?
    })
}

pub fn parse_smaps(text: &str) -> Vec<MapEntry> {
    let mut out: Vec<MapEntry> = Vec::new();
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(last) = out.last_mut() {
                last.vmflags = flags.split_whitespace().map(str::to_string).collect();
            }
        } else if line
            .split(' ')
            .next()
            .is_some_and(|t| t.contains('-') && !t.ends_with(':'))
            && let Some(e) = parse_map_line(line)
        {
            out.push(e);
        }
    }
    out
}

/// The innermost PID namespace's number of a `status` line that lists one per namespace
/// level (`NSpid`, `NSpgid`, `NSsid`: the last, the sandbox's); `None` when there is none.
pub fn status_ns_last(text: &str, key: &str) -> Option<i32> {
    status_value(text, key)
        .and_then(|v| v.split_whitespace().last())
        .and_then(|n| n.parse().ok())
}

/// The value of the `Key:\tvalue` line `key` of a `status` text, trimmed.
pub fn status_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
}

pub fn get<'a>(kv: &'a [(String, String)], key: &str) -> Option<&'a str> {
    kv.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// `(sec, nsec)` as printed in timerfd fdinfo, to nanoseconds.
pub fn parse_timespec(v: &str) -> Option<u64> {
    let v = v.trim().trim_start_matches('(').trim_end_matches(')');
    let (s, n) = v.split_once(',')?;
    Some(s.trim().parse::<u64>().ok()? * 1_000_000_000 + n.trim().parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PROCMAP_QUERY names the mapping holding an address (here, one of ours split by a
    /// protection change and shortened), and none for an address no mapping holds.
    #[test]
    fn mapping_at_names_the_mapping_holding_an_address() {
        const PG: usize = 4096;
        // SAFETY: a fresh private anonymous mapping of ours, protected and unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * PG,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let b = base as u64;
        // SAFETY: the second page of our own mapping; the last one is unmapped.
        unsafe {
            assert_eq!(libc::mprotect(base.add(PG), PG, libc::PROT_READ), 0);
            assert_eq!(libc::munmap(base.add(3 * PG), PG), 0);
        }
        let maps = File::open("/proc/self/maps").unwrap();
        let pg = PG as u64;
        let got = Proc::mapping_at(&maps, b + pg + 100).unwrap();
        let first = Proc::mapping_at(&maps, b).unwrap();
        // (Below mmap_min_addr: never mapped.)
        let hole = Proc::mapping_at(&maps, 4096).unwrap();
        // SAFETY: what is left of our mapping.
        unsafe { libc::munmap(base, 3 * PG) };
        assert_eq!(got, Some((b + pg, b + 2 * pg)));
        assert_eq!(first.map(|m| m.1), Some(b + pg));
        assert_eq!(hole, None);
    }

    #[test]
    fn parses_map_lines() {
        let e = parse_map_line("7f00-7f10 r-xp 00001000 08:01 1234    /usr/lib/libc.so.6").unwrap();
        assert_eq!(
            (e.start, e.end, e.offset, e.inode),
            (0x7f00, 0x7f10, 0x1000, 1234)
        );
        assert!(e.read && !e.write && e.exec && !e.shared);
        assert_eq!(e.name, "/usr/lib/libc.so.6");
        let e = parse_map_line("1000-2000 rw-s 00000000 00:00 0 ").unwrap();
        assert!(e.shared && e.name.is_empty());
    }

    #[test]
    fn reads_own_smaps_with_flags() {
        let maps = Proc::open(std::process::id() as Pid)
            .unwrap()
            .smaps()
            .unwrap();
        assert!(maps.iter().any(|m| m.name == "[stack]" && m.has_flag("gd")));
        assert!(maps.iter().all(|m| !m.vmflags.is_empty()));
    }

    #[test]
    fn timespec() {
        assert_eq!(parse_timespec("(1, 500)"), Some(1_000_000_500));
    }
}
