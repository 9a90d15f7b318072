//! Shared memory objects: shared anonymous memory (`MAP_SHARED | MAP_ANONYMOUS`) and System V
//! segments (`shmget`), captured once each with their contents, whatever maps them (the image's
//! mappings name them: `Backing::Shm`). POSIX shared memory and shared mappings of files are
//! files in the sandbox's tmpfs mounts (`/dev/shm` among them): [`crate::files`] carries them.
//! A file unlinked while mapped shared (a POSIX semaphore after `sem_unlink`, as Python's
//! `multiprocessing` locks are) has no name left: it is an object of its own
//! (`ShmId::Unlinked`, by device and inode), captured like shared anonymous memory and
//! restored as such (its mappings then show `/dev/zero (deleted)`).
//!
//! Identity: an anonymous object by the inode of its shmem file (the inode number `maps`
//! shows; the object cannot be freed, nor its number reused, while we hold a descriptor of it),
//! a System V segment by its `shmid` (kept at restore) and the inode of its shmem file (a
//! segment removed and created again with the same id is another object).
//!
//! Contents are read from the object's shmem file, not from the process's mappings: a
//! descriptor opened through `/proc/PID/map_files/` of one mapping (for a System V mapping
//! that is the segment's shmem file too, readable with `pread`), or, for a segment no mapping
//! names, through an attachment of our own (`shmat(SHM_RDONLY)` in the capture thread, which
//! is in the sandbox's IPC namespace: see [`crate::procfs::in_view`]; detached at once, inside
//! the pause, so the service never sees the attachment count moved, only `shm_atime`,
//! `shm_dtime` and `shm_lpid`). `SEEK_DATA`/`SEEK_HOLE` skip holes; a hole reads as zeros
//! without allocating anything.
//!
//! Write tracking: neither tracker tracks shared memory (the userfaultfd tracker registers
//! private memory only, the mprotect tracker protects private memory only). Every pause reads
//! the objects' pages that hold data and compares each with a hash of what the last delivered
//! checkpoint held: the cost is proportional to the objects' resident size, and is paid only by
//! a process that has shared memory. Pages that changed (or became holes: sent as zeros) go
//! into the checkpoint, raw.
//!
//! In a process tree (a full checkpoint, `crate::tree`, and every pause of the epoch loop, by
//! the main process's tracker) the objects of every process are captured together, each once
//! ([`ShmTracker::capture_of`]): an anonymous object is the same
//! shmem file (the same inode) in every process that inherited its mapping, a System V segment
//! is the IPC namespace's whoever attached it.
//!
//! System V segments are listed from `/proc/sysvipc/shm` when the layout was read again (a
//! System V call — `shmget`, `shmctl`, `shmat`, `shmdt` — is a layout call for
//! `crate::syscount`); otherwise the last list is kept, with its descriptors.

use crate::image::{PageRun, ShmId, ShmObject, SysvShm};
use crate::os::error::CaptureError;
use crate::procfs::{MapEntry, Proc};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, MetadataExt};

use crate::os::ranges::PAGE;
type Result<T> = std::result::Result<T, CaptureError>;

/// `SHM_DEST` and `SHM_LOCKED` in the mode `/proc/sysvipc/shm` prints.
const SHM_DEST: u32 = 0o1000;
const SHM_LOCKED: u32 = 0o2000;

/// Is this mapping of a shared memory object (not of a file a path names)?
pub fn object_of(m: &MapEntry) -> Option<ShmId> {
    if !m.shared {
        return None;
    }
    if m.name == "/dev/zero (deleted)" {
        return Some(ShmId::Anon(m.inode));
    }
    // "/SYSV%08x (deleted)", the inode being the shmid.
    if m.name.starts_with("/SYSV") && m.name.ends_with(" (deleted)") {
        return i32::try_from(m.inode).ok().map(ShmId::Sysv);
    }
    // A file unlinked while mapped shared: "/dev/shm/sem.XXXXXX (deleted)" (a POSIX semaphore
    // after `sem_unlink`, as Python's multiprocessing locks are), a temporary file.
    if m.name.starts_with('/') && m.name.ends_with(" (deleted)") && m.inode != 0 {
        return Some(ShmId::Unlinked {
            dev: m.dev,
            ino: m.inode,
        });
    }
    None
}

/// One object as the last listing found it.
struct Known {
    obj: ShmObject,
    file: File,
    /// Inode of the shmem file (identity of a System V segment across listings).
    ino: u64,
}

/// The capture side's memory of the objects between pauses.
#[derive(Default)]
pub struct ShmTracker {
    known: BTreeMap<ShmId, Known>,
    /// Hash of each page that held data at the last capture, per object.
    hashes: HashMap<ShmId, HashMap<u64, [u8; 32]>>,
    /// `hashes` before the last capture, for [`ShmTracker::undo`].
    prev: Option<HashMap<ShmId, HashMap<u64, [u8; 32]>>>,
    /// Whether a listing ever found an object (until then a pause with its layout carried
    /// does nothing here).
    any: bool,
}

impl ShmTracker {
    /// Captures the objects of the stopped process: with `relist`, lists them again (from
    /// `maps` and the IPC namespace's segments); with `full`, every page that holds data,
    /// else the pages that changed since the last capture (all of a new object's). Contents
    /// are appended to `data`.
    pub fn capture(
        &mut self,
        proc: &Proc,
        maps: &[MapEntry],
        relist: bool,
        full: bool,
        data: &mut Vec<u8>,
    ) -> Result<Vec<ShmObject>> {
        self.capture_of(&[(proc, maps)], relist, full, data)
    }

    /// [`ShmTracker::capture`] of the objects several stopped processes map (those of a
    /// process tree, `procs` each with its `maps`, the main process first): each object once,
    /// whichever processes map it, opened through the first mapping of it found.
    pub fn capture_of(
        &mut self,
        procs: &[(&Proc, &[MapEntry])],
        relist: bool,
        full: bool,
        data: &mut Vec<u8>,
    ) -> Result<Vec<ShmObject>> {
        let Some(&(proc, _)) = procs.first() else {
            return Ok(Vec::new());
        };
        if !relist && !self.any {
            return Ok(Vec::new());
        }
        let fresh = if relist {
            self.relist(procs)?
        } else {
            Vec::new()
        };
        let mut out = Vec::with_capacity(self.known.len());
        let mut hashes = HashMap::with_capacity(self.known.len());
        let mut page = vec![0u8; PAGE as usize];
        for (id, k) in &self.known {
            let is_new = fresh.contains(id);
            let before = if full || is_new {
                None
            } else {
                self.hashes.get(id)
            };
            let mut now: HashMap<u64, [u8; 32]> = HashMap::new();
            let mut runs: Vec<PageRun> = Vec::new();
            let mut push = |off: u64, bytes: &[u8], data: &mut Vec<u8>| {
                match runs.last_mut() {
                    Some(r) if r.addr + r.len == off && r.data_off + r.len == data.len() as u64 => {
                        r.len += PAGE
                    }
                    _ => runs.push(PageRun {
                        addr: off,
                        len: PAGE,
                        data_off: data.len() as u64,
                    }),
                }
                data.extend_from_slice(bytes);
            };
            let size = k.obj.size.div_ceil(PAGE) * PAGE;
            for off in data_pages(&k.file, size).map_err(read_err(proc, *id))? {
                page.fill(0);
                read_page(&k.file, off, &mut page).map_err(read_err(proc, *id))?;
                if page.iter().all(|&b| b == 0) {
                    continue;
                }
                let h = *blake3::hash(&page).as_bytes();
                if before.is_none_or(|b| b.get(&off) != Some(&h)) {
                    push(off, &page, data);
                }
                now.insert(off, h);
            }
            // Pages that held data and hold none now (punched, or written to zeros).
            if let Some(b) = before {
                let mut gone: Vec<u64> =
                    b.keys().filter(|o| !now.contains_key(o)).copied().collect();
                gone.sort_unstable();
                let zero = [0u8; PAGE as usize];
                for off in gone.into_iter().filter(|&o| o < size) {
                    push(off, &zero, data);
                }
                runs.sort_by_key(|r| r.addr);
            }
            hashes.insert(*id, now);
            out.push(ShmObject {
                runs,
                fresh: is_new && !full,
                ..k.obj.clone()
            });
        }
        self.prev = Some(std::mem::replace(&mut self.hashes, hashes));
        Ok(out)
    }

    /// Forgets the last capture (its checkpoint was not delivered): the next one reports what
    /// changed since the capture before it. Objects listed since stay known; a page compared
    /// against a hash it never had is sent again, which is harmless.
    pub fn undo(&mut self) {
        if let Some(p) = self.prev.take() {
            self.hashes = p;
        }
    }

    /// Lists the objects again (those the processes' `maps` name, and every System V segment of
    /// the IPC namespace); returns the ids of those that are new (or another object under a
    /// known id).
    fn relist(&mut self, procs: &[(&Proc, &[MapEntry])]) -> Result<Vec<ShmId>> {
        let Some(&(first, _)) = procs.first() else {
            return Ok(Vec::new());
        };
        let mut found: BTreeMap<ShmId, Known> = BTreeMap::new();
        let mut fresh = Vec::new();
        // Records object `id`, new unless the last listing had the same shmem file.
        let mut keep = |id: ShmId,
                        k: Known,
                        known: &mut BTreeMap<ShmId, Known>,
                        found: &mut BTreeMap<ShmId, Known>| {
            if known.get(&id).is_none_or(|old| old.ino != k.ino) {
                fresh.push(id);
            }
            known.remove(&id);
            found.insert(id, k);
        };
        // Anonymous objects: from their mappings.
        for (proc, m) in procs
            .iter()
            .flat_map(|&(p, maps)| maps.iter().map(move |m| (p, m)))
        {
            let (id, ino) = match object_of(m) {
                Some(id @ ShmId::Anon(ino)) => (id, ino),
                Some(id @ ShmId::Unlinked { ino, .. }) => (id, ino),
                _ => continue,
            };
            if found.contains_key(&id) {
                continue;
            }
            if let Some(k) = self.known.remove(&id) {
                // Same inode number while we hold it: the same object. (Its size is fixed.)
                found.insert(id, k);
                continue;
            }
            let file = open_mapping(proc, m)?;
            let size = file.metadata().map_err(read_err(proc, id))?.size();
            let obj = ShmObject {
                id,
                size,
                sysv: None,
                runs: Vec::new(),
                fresh: false,
            };
            keep(id, Known { obj, file, ino }, &mut self.known, &mut found);
        }
        // System V segments: all of the namespace's, attached or not.
        let text = std::fs::read_to_string("/proc/sysvipc/shm")
            .map_err(crate::os::error::proc_err(first.pid, "/proc/sysvipc/shm"))?;
        for seg in parse_sysvipc(&text) {
            let id = ShmId::Sysv(seg.shmid);
            let mapping = procs.iter().find_map(|&(p, maps)| {
                maps.iter()
                    .find(|m| object_of(m) == Some(id))
                    .map(|m| (p, m))
            });
            let file = match mapping {
                Some((p, m)) => open_mapping(p, m)?,
                None => attach_and_open(first, seg.shmid)?,
            };
            let ino = file.metadata().map_err(read_err(first, id))?.ino();
            let obj = ShmObject {
                id,
                size: seg.size,
                sysv: Some(seg.info),
                runs: Vec::new(),
                fresh: false,
            };
            keep(id, Known { obj, file, ino }, &mut self.known, &mut found);
        }
        // What the maps name must exist in the namespace (the image refers to it).
        if let Some(m) = procs
            .iter()
            .flat_map(|&(_, maps)| maps)
            .find(|m| object_of(m).is_some_and(|id| !found.contains_key(&id)))
        {
            return Err(CaptureError::Unsupported(format!(
                "mapping at {:#x} of {} names a segment this IPC namespace does not list",
                m.start, m.name
            )));
        }
        self.any = !found.is_empty();
        self.known = found;
        for id in &fresh {
            self.hashes.remove(id);
        }
        self.hashes.retain(|id, _| self.known.contains_key(id));
        Ok(fresh)
    }
}

fn read_err(proc: &Proc, id: ShmId) -> impl FnOnce(io::Error) -> CaptureError {
    crate::os::error::proc_err(proc.pid, format!("shared memory {id:?}"))
}

/// The object's shmem file, through the process's mapping `m` of it.
fn open_mapping(proc: &Proc, m: &MapEntry) -> Result<File> {
    proc.open_file(
        &format!("map_files/{:x}-{:x}", m.kernel.0, m.kernel.1),
        libc::O_RDONLY,
    )
    .map_err(crate::os::error::proc_err(
        proc.pid,
        format!("the shared memory mapped at {:#x}", m.start),
    ))
}

/// A segment no mapping of the process names: attached read-only by this thread (in the
/// sandbox's IPC namespace), its shmem file opened through our own mapping, detached.
fn attach_and_open(proc: &Proc, shmid: i32) -> Result<File> {
    let err = crate::os::error::proc_err(proc.pid, format!("System V segment {shmid}"));
    // SAFETY: attaches the segment read-only wherever the kernel finds room in our address
    // space; nothing of ours is replaced, and it is detached below.
    let at = unsafe { libc::shmat(shmid, std::ptr::null(), libc::SHM_RDONLY) };
    if at as isize == -1 {
        return Err(err(io::Error::last_os_error()));
    }
    let a = at as u64;
    // The attachment's extent: the mapping holding its first byte.
    let ctx = |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    let f = (|| {
        let maps = proc
            .open_host("thread-self/maps", libc::O_RDONLY)
            .map_err(ctx("our maps".into()))?;
        let (s, e) = Proc::mapping_at(&maps, a)
            .map_err(ctx("our attachment's extent".into()))?
            .ok_or_else(|| io::Error::other("our own attachment is not in our maps"))?;
        // (`map_files` is a process directory's, not a thread's.)
        let path = format!("self/map_files/{s:x}-{e:x}");
        proc.open_host(&path, libc::O_RDONLY).map_err(ctx(path))
    })();
    // SAFETY: detaches exactly the attachment made above.
    unsafe { libc::shmdt(at) };
    f.map_err(err)
}

/// Offsets of the pages below `size` that hold data (`SEEK_DATA`/`SEEK_HOLE`).
fn data_pages(f: &File, size: u64) -> io::Result<Vec<u64>> {
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut at = 0i64;
    while (at as u64) < size {
        // SAFETY: lseek on our own descriptor.
        let d = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if d < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // no data after `at`
            }
            return Err(e);
        }
        // SAFETY: as above.
        let h = unsafe { libc::lseek(fd, d, libc::SEEK_HOLE) };
        if h < 0 {
            return Err(io::Error::last_os_error());
        }
        let (s, e) = (d as u64 / PAGE * PAGE, (h as u64).div_ceil(PAGE) * PAGE);
        out.extend((s..e.min(size)).step_by(PAGE as usize));
        at = e as i64;
    }
    Ok(out)
}

/// Reads the page at `off` (short at the end of the file: the rest stays zero).
fn read_page(f: &File, off: u64, page: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < page.len() {
        match f.read_at(&mut page[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One line of `/proc/sysvipc/shm`.
#[derive(Debug, PartialEq)]
struct Segment {
    shmid: i32,
    size: u64,
    info: SysvShm,
}

/// Parses `/proc/sysvipc/shm`: `key shmid perms size cpid lpid nattch uid gid cuid cgid atime
/// dtime ctime rss swap`, perms in octal (with `SHM_DEST` and `SHM_LOCKED`), the rest decimal.
/// (A hugetlb segment cannot be told from this; a mapping of one is refused by its `ht` flag.)
fn parse_sysvipc(text: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 11 {
            continue;
        }
        let num = |i: usize| f[i].parse::<i64>().ok();
        let (Some(key), Some(shmid), Ok(perms), Some(size)) = (
            num(0),
            num(1),
            u32::from_str_radix(f[2], 8),
            f[3].parse::<u64>().ok(),
        ) else {
            continue;
        };
        let (Some(uid), Some(gid), Some(cuid), Some(cgid)) = (num(7), num(8), num(9), num(10))
        else {
            continue;
        };
        out.push(Segment {
            shmid: shmid as i32,
            size,
            info: SysvShm {
                key: key as i32,
                mode: perms & 0o777,
                uid: uid as u32,
                gid: gid as u32,
                cuid: cuid as u32,
                cgid: cgid as u32,
                removed: perms & SHM_DEST != 0,
                locked: perms & SHM_LOCKED != 0,
            },
        });
    }
    out
}

/// Restore (the restore child, inside the new sandbox, before the restorer runs): makes every
/// object of `objects` and fills it from `pages` (the page data's descriptor). System V
/// segments get their id (`/proc/sys/kernel/shm_next_id`, which the next `shmget` of the IPC
/// namespace takes, then goes back to -1), key, size, creator (`shmget` made with the creator's
/// effective IDs), owner and mode (`IPC_SET`) and lock; the restorer attaches them, and marks
/// those that were marked for removal again. Anonymous objects become descriptors of fresh
/// shmem files (`MAP_SHARED | MAP_ANONYMOUS`, reopened through `/proc/self/map_files/`: the
/// same kind of file, shown as `/dev/zero (deleted)`) at their planned numbers, for the
/// restorer to map shared (in a process tree, every process that maps one gets it from the
/// process that made it: see `crate::restore`).
pub fn make_all(objects: &[ShmPlan], pages: i32) -> std::result::Result<(), String> {
    for o in objects {
        match (o.id, &o.sysv) {
            (ShmId::Sysv(id), Some(sv)) => make_sysv(id, o, sv, pages)?,
            (id, None) if id.is_anonymous() && o.fd >= 0 => {
                let fd = make_anon(o, pages)?;
                // SAFETY: moving our fresh descriptor to its planned number.
                let r = unsafe { libc::dup2(fd, o.fd) };
                let e = io::Error::last_os_error();
                // SAFETY: closing the descriptor made above.
                unsafe { libc::close(fd) };
                if r < 0 {
                    return Err(format!(
                        "shared memory {:?}: moving it to {}: {e}",
                        o.id, o.fd
                    ));
                }
            }
            _ => return Err(format!("shared memory {:?} is described wrongly", o.id)),
        }
    }
    Ok(())
}

/// Reads `runs` of `pages` into memory at `base` (which holds the object).
fn fill(base: u64, runs: &[(u64, u64, u64)], pages: i32) -> io::Result<()> {
    for &(off, len, data_off) in runs {
        let mut done = 0u64;
        while done < len {
            // SAFETY: the destination lies inside the caller's mapping of the object
            // (`off + len` within its size: the image was validated).
            let r = unsafe {
                libc::pread(
                    pages,
                    (base + off + done) as *mut libc::c_void,
                    (len - done) as usize,
                    (data_off + done) as i64,
                )
            };
            if r <= 0 {
                return Err(if r == 0 {
                    io::ErrorKind::UnexpectedEof.into()
                } else {
                    io::Error::last_os_error()
                });
            }
            done += r as u64;
        }
    }
    Ok(())
}

fn make_sysv(id: i32, o: &ShmPlan, sv: &SysvShm, pages: i32) -> std::result::Result<(), String> {
    let err = |what: &str| {
        format!(
            "System V segment {id}: {what}: {}",
            io::Error::last_os_error()
        )
    };
    std::fs::write("/proc/sys/kernel/shm_next_id", id.to_string())
        .map_err(|e| format!("System V segment {id}: setting shm_next_id: {e}"))?;
    let key = if sv.removed {
        libc::IPC_PRIVATE
    } else {
        sv.key
    };
    // The creator is whoever's effective IDs make it (raw calls: this process has one thread).
    // SAFETY: changing our own effective IDs and back; we keep saved ID 0, so we can return.
    let got = unsafe {
        libc::syscall(libc::SYS_setresgid, -1i64, sv.cgid as i64, -1i64);
        libc::syscall(libc::SYS_setresuid, -1i64, sv.cuid as i64, -1i64);
        let got = libc::shmget(
            key,
            o.size as usize,
            libc::IPC_CREAT | libc::IPC_EXCL | (sv.mode & 0o777) as i32,
        );
        let e = io::Error::last_os_error();
        libc::syscall(libc::SYS_setresuid, -1i64, 0i64, -1i64);
        libc::syscall(libc::SYS_setresgid, -1i64, 0i64, -1i64);
        if got < 0 {
            return Err(format!("System V segment {id}: shmget: {e}"));
        }
        got
    };
    if got != id {
        return Err(format!(
            "System V segment {id} was created as {got} (shm_next_id not honoured)"
        ));
    }
    // SAFETY: an all-zero shmid_ds is valid; IPC_STAT fills it, IPC_SET reads it.
    unsafe {
        let mut ds: libc::shmid_ds = std::mem::zeroed();
        if libc::shmctl(id, libc::IPC_STAT, &mut ds) < 0 {
            return Err(err("IPC_STAT"));
        }
        ds.shm_perm.uid = sv.uid;
        ds.shm_perm.gid = sv.gid;
        ds.shm_perm.mode = (sv.mode & 0o777) as _;
        if libc::shmctl(id, libc::IPC_SET, &mut ds) < 0 {
            return Err(err("IPC_SET"));
        }
        if sv.locked && libc::shmctl(id, libc::SHM_LOCK, std::ptr::null_mut()) < 0 {
            return Err(err("SHM_LOCK"));
        }
    }
    if o.runs.is_empty() {
        return Ok(());
    }
    // SAFETY: attaching the fresh segment wherever there is room; detached below.
    let at = unsafe { libc::shmat(id, std::ptr::null(), 0) };
    if at as isize == -1 {
        return Err(err("shmat"));
    }
    let r = fill(at as u64, &o.runs, pages);
    // SAFETY: detaching exactly what was attached above.
    unsafe { libc::shmdt(at) };
    r.map_err(|e| format!("System V segment {id}: filling: {e}"))
}

fn make_anon(o: &ShmPlan, pages: i32) -> std::result::Result<i32, String> {
    let len = o.size.div_ceil(PAGE) * PAGE;
    let err = |what: &str, e: io::Error| format!("shared memory {:?}: {what}: {e}", o.id);
    // SAFETY: a fresh shared anonymous mapping of our own, unmapped below.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(err("mmap", io::Error::last_os_error()));
    }
    let a = at as u64;
    let r = fill(a, &o.runs, pages)
        .map_err(|e| err("filling", e))
        .and_then(|()| {
            let path = format!("/proc/self/map_files/{a:x}-{:x}", a + len);
            let c = std::ffi::CString::new(path).map_err(|e| err("path", io::Error::other(e)))?;
            // SAFETY: valid C string.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(err("reopening", io::Error::last_os_error()));
            }
            Ok(fd)
        });
    // SAFETY: unmapping our own mapping made above (the descriptor keeps the object).
    unsafe { libc::munmap(at, len as usize) };
    r
}

/// A shared memory object for the restore child to make: System V segments in the sandbox's
/// IPC namespace with their id, anonymous ones as a descriptor of a fresh shmem file that the
/// restorer maps shared.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ShmPlan {
    pub id: ShmId,
    pub size: u64,
    pub sysv: Option<SysvShm>,
    /// (offset in the object, length, offset in the pages descriptor).
    pub runs: Vec<(u64, u64, u64)>,
    /// Anonymous objects: the number its descriptor is made at (after the executable's, or
    /// in a tree's shared block); -1 for a System V segment.
    pub fd: RawFd,
}

impl ShmPlan {
    /// Object `o`, its runs read at `pages_offset` in the pages descriptor, made at `fd`.
    pub(crate) fn of(o: &ShmObject, pages_offset: u64, fd: RawFd) -> ShmPlan {
        ShmPlan {
            id: o.id,
            size: o.size,
            sysv: o.sysv.clone(),
            runs: o
                .runs
                .iter()
                .map(|r| (r.addr, r.len, pages_offset + r.data_off))
                .collect(),
            fd,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sysvipc() {
        let text = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                    \x20        0          0  1600                  8192 21086 21086      1     0     0     0     0 1795636595          0 1795636595                     0                     0\n\
                    \x20     4660       4242   640                 10000 21086 21086      2  1000   100     0     0 1795636595          0 1795636595                  4096                     0\n";
        let s = parse_sysvipc(text);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].shmid, s[0].size, s[0].info.removed), (0, 8192, true));
        assert_eq!(s[0].info.mode, 0o600);
        assert_eq!(
            (s[1].shmid, s[1].info.key, s[1].info.mode),
            (4242, 4660, 0o640)
        );
        assert_eq!(
            (s[1].info.uid, s[1].info.gid, s[1].info.removed),
            (1000, 100, false)
        );
    }
}
