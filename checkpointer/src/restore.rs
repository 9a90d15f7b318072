//! Restore: from a checkpoint to a running process with the same PIDs, TIDs, mappings and
//! descriptors.
//!
//! Three steps, in three processes:
//! 1. [`prepare`] (supervisor, nothing started yet): checks the checkpoint against this machine
//!    (mapped files by content hash), writes the page data, the restore plan and the restorer
//!    binary into memfds, and encodes the [`ChildPlan`] for step 2.
//! 2. [`child_main`] (the sandbox's first process, created by the sandbox init with the
//!    target's PID): moves the inherited memfds to known numbers, opens the mapped files,
//!    recreates every descriptor at its old number, sets cwd, rlimits and the PID cursor, and
//!    execs the restorer (`restorer/main.rs`), which turns the process into the target.
//! 3. [`finish`] (supervisor): waits for the restorer's report, then removes the restorer's blob
//!    from the restored process once no thread executes in it.

use crate::abi::{
    self, CredsDesc, ItimerDesc, MmMap, PLAN_MAGIC, PLAN_VERSION, PendingDesc, PlanHeader, Regs,
    SeccompDesc, SigactionDesc, ThreadDesc, TimerDesc, VMA_ANON, VMA_SHARED, VMA_SYSV, VmaDesc,
    XSTATE_MAX,
};
use crate::capture::regs_from_slice;
use crate::fds;
use crate::image::*;
use crate::ptrace::Stopped;
use crate::sys::{self, Pid, as_bytes};
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The restorer binary, built by `build.rs`.
static RESTORER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tardi-restorer"));

/// Why a restore failed. Errors from [`prepare`] mean nothing was started.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("mapped file {path} cannot be used: {reason}")]
    File { path: String, reason: String },
    #[error("checkpoint cannot be restored here: {0}")]
    Invalid(String),
    #[error("preparing the restore: {0}")]
    Io(#[from] io::Error),
    #[error("the restored process failed while {0}")]
    Child(String),
    #[error("the restorer failed at step {step} ({what}): errno {errno}")]
    Restorer {
        step: u64,
        what: &'static str,
        errno: i64,
    },
    #[error("the restorer exited before reporting (see the sandbox log)")]
    Died,
    #[error("timed out waiting for the restorer")]
    Timeout,
    #[error("removing the restorer from the restored process: {0}")]
    Finish(String),
    #[error(
        "the restored service exited as soon as it resumed (see the sandbox log; the state it \
         found, e.g. its files, may disagree with its memory)"
    )]
    ExitedAtOnce,
}

type Result<T> = std::result::Result<T, RestoreError>;

/// What the restore child needs, passed through the sandbox as opaque bytes. A transient
/// hand-off between two processes of the same build, not a stored format.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChildPlan {
    /// The process's PID in the sandbox and its parent's (0 for the main process).
    pub pid: i32,
    pub ppid: i32,
    /// Lead a new session (`setsid`), or else a new process group (`setpgid(0, 0)`), before
    /// creating any child; otherwise keep the creator's.
    pub setsid: bool,
    pub setpgid: bool,
    /// The main process's plan only: the other processes of the tree, parents before their
    /// children. Each process creates its own children (`clone3` with `set_tid`) before it
    /// sets itself up.
    pub members: Vec<ChildPlan>,
    /// Inherited descriptors in the order [plan, pages, notify, restorer binary].
    pub inherited: Vec<RawFd>,
    /// First number of the block the child moves its own descriptors to.
    pub base: RawFd,
    pub files: Vec<String>,
    /// Per file: mapped shared somewhere (opened read-write when it can be, so that the
    /// mapping may be writable, now or after an `mprotect`).
    pub shared: Vec<bool>,
    pub exe: String,
    pub fds: Vec<FdImage>,
    pub cwd: String,
    pub rlimits: Vec<(u32, u64, u64)>,
    pub max_tid: i32,
    /// The private directories' tree, written before anything is opened.
    pub private_files: crate::files::FileChanges,
    /// A single process's shared memory objects, made (and filled) before the files are
    /// opened (anonymous ones at their [`ShmPlan::fd`]).
    pub shm: Vec<ShmPlan>,
    /// How many descriptors of anonymous shared memory objects follow the executable's (the
    /// restorer maps them shared).
    pub anon_fds: u32,
    /// A tree's shared memory objects this process makes before it creates its children
    /// (`docs/PROCESS-TREES.md`): the main process every System V segment, the lowest common
    /// ancestor of the processes that map an anonymous object that object, at its
    /// [`ShmPlan::fd`] in the shared block, inherited by every process forked afterwards.
    pub make_shm: Vec<ShmPlan>,
    /// In a tree: where this process finds each anonymous object it maps, in the shared
    /// block, in the order its descriptors follow the executable's.
    pub shm_slots: Vec<RawFd>,
    /// The open file descriptions the tree shares (the main image's `shared_files`): entry
    /// `i` is descriptor `shared_base + i` of whichever process made it and of every process
    /// forked after that, until each process has put the ones it holds at their numbers
    /// ([`FdKind::Shared`]) and closed the block. `shared_base` lies above every number any
    /// process of the tree uses before that.
    pub shared_base: RawFd,
    pub shared_count: u32,
    /// The shared descriptions this process makes before it creates its children (those
    /// whose holders all descend from it, and from none of its children alone), at their
    /// numbers in the block.
    pub make_shared: Vec<FdImage>,
    /// The main process's plan only: the tree's zombies; each process recreates its own after
    /// its children ([`make_zombies`]).
    pub zombies: Vec<Zombie>,
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
    fn of(o: &ShmObject, pages_offset: u64, fd: RawFd) -> ShmPlan {
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

/// The anonymous shared memory objects of `objects` that `img` maps, in that order: the order
/// their descriptors follow the executable's.
fn anon_mapped(img: &ProcessImage, objects: &[ShmObject]) -> Vec<ShmId> {
    objects
        .iter()
        .map(|o| o.id)
        .filter(|&id| id.is_anonymous() && maps_object(img, id))
        .collect()
}

/// The System V segments of `objects` marked for removal.
fn removed(objects: &[ShmObject]) -> impl Iterator<Item = i32> + '_ {
    objects.iter().filter_map(|o| match (o.id, &o.sysv) {
        (ShmId::Sysv(id), Some(sv)) if sv.removed => Some(id),
        _ => None,
    })
}

/// The System V segments of `objects` marked for removal that `img` maps (its restorer marks
/// them again once it has attached them).
fn removed_mapped(img: &ProcessImage, objects: &[ShmObject]) -> Vec<i32> {
    removed(objects)
        .filter(|&id| maps_object(img, ShmId::Sysv(id)))
        .collect()
}

/// Everything [`prepare`] made; keep it alive until [`finish`].
pub struct Prepared {
    pub pid: i32,
    /// Opaque payload for the sandbox's restore start.
    pub payload: Vec<u8>,
    /// Descriptors the sandbox must pass into the restore child, at these numbers.
    pub inherit: Vec<RawFd>,
    notify_r: OwnedFd,
    _keep: Vec<OwnedFd>,
    /// The other processes of a tree (their payload is in the main process's): PID in the
    /// sandbox and what [`finish`] needs of each.
    members: Vec<Prepared>,
}

const INHERITED: usize = 4;

/// Checks `ckpt` and lays out everything the restore needs. `host_path` maps a path inside the
/// sandbox to the host path the sandbox will show there (its mount table).
pub fn prepare(ckpt: &Checkpoint, host_path: &dyn Fn(&str) -> Option<PathBuf>) -> Result<Prepared> {
    prepare_with(ckpt, host_path, false)
}

/// [`prepare`]; with `hold`, the restored process stops itself (SIGSTOP) right after the
/// restorer's report, before any of its threads runs: [`finish_held`] then returns with every
/// page in place, for a comparison with the source. It resumes on SIGCONT.
pub fn prepare_with(
    ckpt: &Checkpoint,
    host_path: &dyn Fn(&str) -> Option<PathBuf>,
    hold: bool,
) -> Result<Prepared> {
    // A checkpoint built in memory has not been through `from_bytes`: check it the same way.
    ckpt.validate()
        .map_err(|e| RestoreError::Invalid(e.to_string()))?;
    let pages = sys::memfd("tardi-pages")?;
    std::fs::File::from(pages.try_clone()?).write_all(&ckpt.data)?;
    prepare_tree(&ckpt.image, pages, 0, host_path, hold)
}

/// The memfd the restorer will read an image's pages from, still empty: fill it with
/// [`crate::store::Image::write_pages`] before the restorer starts (before the sandbox lets
/// its first process go). Until then the restorer would read zeros.
pub struct PagesToWrite(OwnedFd);

impl PagesToWrite {
    pub fn into_file(self) -> std::fs::File {
        std::fs::File::from(self.0)
    }
}

/// [`prepare_with`] for an image a backup kept current ([`crate::store::Image`]), without
/// building a full checkpoint: the restore is laid out from the image's metadata (plan,
/// restorer, mapped files checked; the image was checked as each checkpoint was applied), and
/// the pages' memfd is returned to be filled with [`crate::store::Image::write_pages`] while
/// the sandbox is being set up.
pub fn prepare_image_layout(
    img: &crate::store::Image,
    host_path: &dyn Fn(&str) -> Option<PathBuf>,
    hold: bool,
) -> Result<(Prepared, PagesToWrite)> {
    let pages = sys::memfd("tardi-pages")?;
    let ck = img.full_meta();
    let prep = prepare_tree(&ck.image, pages.try_clone()?, 0, host_path, hold)?;
    Ok((prep, PagesToWrite(pages)))
}

/// [`prepare`] for a checkpoint file opened with [`crate::image::CheckpointFile::open`]: the
/// restorer reads the pages straight from the file, with no copy in between.
pub fn prepare_file(
    ck: crate::image::CheckpointFile,
    host_path: &dyn Fn(&str) -> Option<PathBuf>,
) -> Result<Prepared> {
    let offset = ck.data_offset;
    prepare_tree(&ck.image, OwnedFd::from(ck.file), offset, host_path, false)
}

/// What a process's restore takes from elsewhere than its own image.
enum Scope<'a> {
    /// A single process: nothing (its shared memory objects are its own, made by its restore
    /// child).
    Single,
    /// A process of the tree whose main image is `root`: the tree's shared memory objects and
    /// files of the private directories (the main process lists and carries them), the
    /// objects made before the tree's processes are ([`plan_shared`]); `rmid` are the System V
    /// segments this process marks for removal again.
    Tree {
        root: &'a ProcessImage,
        rmid: Vec<i32>,
    },
}

/// Lays out a restore whose page data is at `pages_offset` in `pages`.
fn prepare_pages(
    img: &ProcessImage,
    scope: Scope,
    pages: OwnedFd,
    pages_offset: u64,
    host_path: &dyn Fn(&str) -> Option<PathBuf>,
    hold: bool,
) -> Result<Prepared> {
    let own = matches!(scope, Scope::Single);
    let (objects, rmid, carried) = match scope {
        Scope::Single => (
            img.shm.as_slice(),
            removed(&img.shm).collect(),
            &img.private_files,
        ),
        Scope::Tree { root, rmid } => (root.shm.as_slice(), rmid, &root.private_files),
    };
    verify_files(img, carried, host_path)?;
    let anon = anon_mapped(img, objects);

    let max_fd = img.fds.iter().map(|f| f.fd).max().unwrap_or(2);
    let plan_fd = sys::memfd("tardi-plan")?;
    let restorer = sys::memfd("tardi-restorer")?;
    let (notify_r, notify_w) = sys::pipe(libc::O_CLOEXEC)?;
    let inherit = vec![
        plan_fd.as_raw_fd(),
        pages.as_raw_fd(),
        notify_w.as_raw_fd(),
        restorer.as_raw_fd(),
    ];
    let base = inherit
        .iter()
        .fold(max_fd, |m, &fd| m.max(fd))
        .checked_add(1)
        // The block after it: the inherited descriptors, the mapped files, the executable, the
        // anonymous shared memory objects.
        .filter(|b| {
            RawFd::try_from(img.files.len() + INHERITED + 1 + anon.len())
                .is_ok_and(|n| b.checked_add(n).is_some())
        })
        .ok_or_else(|| RestoreError::Invalid(format!("descriptor {max_fd} is out of range")))?;

    std::fs::File::from(restorer.try_clone()?).write_all(RESTORER)?;
    let plan = build_plan(img, objects, &rmid, base, hold, pages_offset)?;
    let exe_fd = base + INHERITED as RawFd + img.files.len() as RawFd;
    std::fs::File::from(plan_fd.try_clone()?).write_all(&plan)?;

    let child = ChildPlan {
        pid: img.pid,
        ppid: 0,
        setsid: img.sid == img.pid,
        setpgid: img.pgid == img.pid && img.sid != img.pid,
        members: Vec::new(),
        inherited: inherit.clone(),
        base,
        files: img.files.iter().map(|f| f.path.clone()).collect(),
        shared: (0..img.files.len() as u32)
            .map(|i| {
                img.vmas.iter().any(|v| {
                    v.shared && matches!(v.backing, Backing::File { index, .. } if index == i)
                })
            })
            .collect(),
        exe: img.exe.path.clone(),
        fds: img.fds.clone(),
        cwd: img.cwd.clone(),
        rlimits: img.rlimits.clone(),
        max_tid: img.max_tid,
        private_files: img.private_files.clone(),
        // A single process's objects: the segments, and the anonymous objects it maps after
        // its executable's descriptor. (A tree's are made before its processes are.)
        shm: match own {
            false => Vec::new(),
            true => objects
                .iter()
                .filter_map(|o| match o.id {
                    ShmId::Sysv(_) => Some(ShmPlan::of(o, pages_offset, -1)),
                    ShmId::Anon(_) | ShmId::Unlinked { .. } => anon
                        .iter()
                        .position(|&a| a == o.id)
                        .map(|k| ShmPlan::of(o, pages_offset, exe_fd + 1 + k as RawFd)),
                })
                .collect(),
        },
        anon_fds: anon.len() as u32,
        make_shm: Vec::new(),
        shm_slots: Vec::new(),
        shared_base: 0,
        shared_count: 0,
        make_shared: Vec::new(),
        zombies: Vec::new(),
    };
    let payload = postcard::to_stdvec(&child).map_err(io::Error::other)?;
    // The pipe's write end must survive into the sandbox: clear close-on-exec on every
    // inherited descriptor (the sandbox keeps them across its init's exec).
    for &fd in &inherit {
        // SAFETY: F_SETFD on descriptors we own.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    }
    Ok(Prepared {
        pid: img.pid,
        payload,
        inherit,
        notify_r,
        _keep: vec![pages, plan_fd, restorer, notify_w],
        members: Vec::new(),
    })
}

/// Lays out the restore of a tree (`docs/PROCESS-TREES.md`): each member like a single process,
/// reading its pages at its slice of the data, its plan carried in the main process's payload
/// and its descriptors passed through the sandbox with the main process's.
fn prepare_tree(
    img: &ProcessImage,
    pages: OwnedFd,
    pages_offset: u64,
    host_path: &dyn Fn(&str) -> Option<PathBuf>,
    hold: bool,
) -> Result<Prepared> {
    if img.tree.is_empty() && img.zombies.is_empty() {
        return prepare_pages(img, Scope::Single, pages, pages_offset, host_path, hold);
    }
    let decode = |p: &Prepared| -> Result<ChildPlan> {
        postcard::from_bytes(&p.payload).map_err(|e| io::Error::other(e).into())
    };
    // The PID cursor goes past the highest TID of the whole tree, whoever sets it last.
    let max_tid = img
        .tree
        .iter()
        .map(|m| m.image.max_tid)
        .chain(img.zombies.iter().map(|z| z.pid))
        .fold(img.max_tid, i32::max);
    let mut ids = vec![(img.pid, img.pgid, img.sid)];
    let mut members = Vec::with_capacity(img.tree.len());
    let mut plans = Vec::with_capacity(img.tree.len());
    for m in &img.tree {
        let me = &m.image;
        recreatable_under(&ids, (me.pid, me.pgid, me.sid), m.ppid)?;
        ids.push((me.pid, me.pgid, me.sid));
        let off = pages_offset.checked_add(m.data_off).ok_or_else(|| {
            RestoreError::Invalid(format!("process {}: page data out of range", me.pid))
        })?;
        let scope = Scope::Tree {
            root: img,
            rmid: removed_mapped(me, &img.shm),
        };
        let prep = prepare_pages(me, scope, pages.try_clone()?, off, host_path, hold)?;
        let mut plan = decode(&prep)?;
        plan.ppid = m.ppid;
        plan.max_tid = max_tid;
        plans.push(plan);
        members.push(prep);
    }
    // The shared memory objects: who maps each. The main process marks for removal the
    // segments it maps and those no process maps (as a single process's restore does).
    let procs = || std::iter::once(img).chain(img.tree.iter().map(|m| &m.image));
    let objects: Vec<(ShmPlan, Vec<i32>)> = img
        .shm
        .iter()
        .map(|o| {
            let mappers = procs().filter(|p| maps_object(p, o.id)).map(|p| p.pid);
            (ShmPlan::of(o, pages_offset, -1), mappers.collect())
        })
        .collect();
    let mut rmid = removed_mapped(img, &img.shm);
    rmid.extend(removed(&img.shm).filter(|&id| {
        objects
            .iter()
            .any(|(o, m)| o.id == ShmId::Sysv(id) && m.is_empty())
    }));
    let scope = Scope::Tree { root: img, rmid };
    let mut root = prepare_pages(img, scope, pages, pages_offset, host_path, hold)?;
    let mut plan = decode(&root)?;
    plan.max_tid = max_tid;
    for m in &members {
        root.inherit.extend_from_slice(&m.inherit);
    }
    if !img.shared_files.is_empty() || !objects.is_empty() {
        let parents: Vec<(i32, i32)> = img.tree.iter().map(|m| (m.image.pid, m.ppid)).collect();
        plan_shared(
            &img.shared_files,
            objects,
            &parents,
            &mut plan,
            &mut plans,
            &root.inherit,
        )?;
    }
    for z in &img.zombies {
        recreatable_under(&ids, (z.pid, z.pgid, z.sid), z.ppid)?;
    }
    plan.zombies = img.zombies.clone();
    plan.members = plans;
    root.payload = postcard::to_stdvec(&plan).map_err(io::Error::other)?;
    root.members = members;
    Ok(root)
}

/// Refuses a process (PID, group, session) that cannot be recreated under its parent `ppid`,
/// one of `ids` (PID, group, session): one leads its session (and then its group) or shares
/// its parent's, and leads its group or shares its parent's.
fn recreatable_under(
    ids: &[(i32, i32, i32)],
    (pid, pgid, sid): (i32, i32, i32),
    ppid: i32,
) -> Result<()> {
    let &(_, ppgid, psid) = ids
        .iter()
        .find(|(p, _, _)| *p == ppid)
        .ok_or_else(|| RestoreError::Invalid(format!("process {pid} has no parent {ppid}")))?;
    let leads = sid == pid;
    if (leads && pgid != pid) || (!leads && sid != psid) || (pgid != pid && pgid != ppgid) {
        return Err(RestoreError::Invalid(format!(
            "process {pid} (group {pgid}, session {sid}) cannot be recreated under its parent \
             (group {ppgid}, session {psid})"
        )));
    }
    Ok(())
}

/// Whether a mapping of `img` names shared memory object `id`.
fn maps_object(img: &ProcessImage, id: ShmId) -> bool {
    img.vmas
        .iter()
        .any(|v| matches!(v.backing, Backing::Shm { id: i, .. } if i == id))
}

/// Decides who makes each shared description and shared memory object of a tree
/// (`docs/PROCESS-TREES.md`, "Phase 2, shared descriptors" and "shared memory") and where it
/// waits until the processes that need it take it: the descriptions that make one object (the
/// ends of a pipe; unix sockets connected to one another, or a listener and the clients it has
/// not accepted) are made together, by the lowest common ancestor of all their holders, which
/// has them before it forks its children: every holder then inherits them, through every
/// process in between. Each entry `i` waits at `shared_base + i`, above every number a process
/// of the tree uses before it places its own descriptors (its inherited descriptors, where it
/// moves them, its mapped files and shared memory objects). The anonymous shared memory
/// objects (`shm`, each with the PIDs of the processes that map it) follow the descriptions in
/// the block, each made by the lowest common ancestor of the processes that map it (one
/// mapped by none is not made); every System V segment is made by the main process, before
/// any other process exists (its restorer and theirs attach it by id). `parents` are the
/// members' (PID, parent's PID), parents first.
fn plan_shared(
    shared: &[SharedFile],
    shm: Vec<(ShmPlan, Vec<i32>)>,
    parents: &[(i32, i32)],
    root: &mut ChildPlan,
    members: &mut [ChildPlan],
    inherited: &[RawFd],
) -> Result<()> {
    let invalid = |m: String| RestoreError::Invalid(m);
    let root_pid = root.pid;
    let top = std::iter::once(&*root)
        .chain(members.iter())
        .map(|p| {
            let used = INHERITED + p.files.len() + 1 + p.anon_fds as usize;
            RawFd::try_from(used)
                .ok()
                .and_then(|n| p.base.checked_add(n))
        })
        .chain(inherited.iter().map(|&fd| fd.checked_add(1)))
        .try_fold(0, |m: RawFd, x| x.map(|x| m.max(x)));
    let slots = shared.len()
        + shm
            .iter()
            .filter(|(o, m)| o.sysv.is_none() && !m.is_empty())
            .count();
    let base = top
        .filter(|b| RawFd::try_from(slots).is_ok_and(|n| b.checked_add(n).is_some()))
        .ok_or_else(|| invalid("too many descriptors to restore".into()))?;
    // Objects: entries made together (union-find over the entries).
    let n = shared.len();
    let mut up: Vec<usize> = (0..n).collect();
    fn find(up: &mut [usize], mut x: usize) -> usize {
        while up[x] != x {
            up[x] = up[up[x]];
            x = up[x];
        }
        x
    }
    // Whether listener `u` has a connection from client `c` it has not accepted yet.
    fn pending(u: &UnixSocketImage, c: u64) -> bool {
        match &u.state {
            UnixState::Listening { pending, .. } => pending.contains(&c),
            _ => false,
        }
    }
    let linked = |a: &FdKind, b: &FdKind| match (a, b) {
        (FdKind::Pipe { id: x, .. }, FdKind::Pipe { id: y, .. }) => x == y,
        (FdKind::Unix(x), FdKind::Unix(y)) => {
            x.peer_ino == y.ino || y.peer_ino == x.ino || pending(x, y.ino) || pending(y, x.ino)
        }
        _ => false,
    };
    for i in 0..n {
        for j in i + 1..n {
            if linked(&shared[i].file.kind, &shared[j].file.kind) {
                let (a, b) = (find(&mut up, i), find(&mut up, j));
                up[a] = b;
            }
        }
    }
    // Each process's parent (validated: parents come before their children).
    let parent = |pid: i32| -> Option<i32> { parents.iter().find(|m| m.0 == pid).map(|m| m.1) };
    let ancestors = |pid: i32| -> Vec<i32> {
        let mut chain = vec![pid];
        while let Some(p) = parent(*chain.last().unwrap_or(&pid)) {
            if chain.len() > parents.len() {
                break;
            }
            chain.push(p);
        }
        chain
    };
    // The lowest common ancestor of processes `pids` (none for no process).
    let lca = |pids: &mut dyn Iterator<Item = i32>| -> Result<Option<i32>> {
        let mut common: Vec<i32> = Vec::new();
        for pid in pids {
            let chain = ancestors(pid);
            if common.is_empty() {
                common = chain;
            } else {
                let at = common
                    .iter()
                    .position(|a| chain.contains(a))
                    .ok_or_else(|| {
                        invalid(format!(
                            "process {pid} is not in the tree of process {root_pid}"
                        ))
                    })?;
                common.drain(..at);
            }
        }
        Ok(common.first().copied())
    };
    let mut creator: Vec<Option<i32>> = vec![None; n];
    for i in 0..n {
        let obj = find(&mut up, i);
        if creator[obj].is_some() {
            continue;
        }
        let in_obj: Vec<usize> = (0..n).filter(|&j| find(&mut up, j) == obj).collect();
        creator[obj] = lca(&mut in_obj
            .iter()
            .flat_map(|&j| shared[j].holders.iter().map(|h| h.0)))?;
    }
    fn plan_of<'a>(
        pid: i32,
        root: &'a mut ChildPlan,
        members: &'a mut [ChildPlan],
    ) -> Result<&'a mut ChildPlan> {
        if pid == root.pid {
            Ok(root)
        } else {
            members
                .iter_mut()
                .find(|m| m.pid == pid)
                .ok_or_else(|| RestoreError::Invalid(format!("process {pid} is not in the tree")))
        }
    }
    for (i, s) in shared.iter().enumerate() {
        let Some(pid) = creator[find(&mut up, i)] else {
            return Err(invalid(format!("shared description #{i} has no holder")));
        };
        let fd = base + i as RawFd;
        plan_of(pid, root, members)?.make_shared.push(FdImage {
            fd,
            cloexec: false,
            ..s.file.clone()
        });
    }
    // Shared memory: the segments by the main process; each anonymous object mapped by some
    // process in the next slot, by the lowest common ancestor of those that map it, and
    // named by each of them in the order of the objects (the order of its own descriptors).
    let mut next = base + n as RawFd;
    for (mut o, mappers) in shm {
        if o.sysv.is_some() {
            root.make_shm.push(o);
            continue;
        }
        let Some(pid) = lca(&mut mappers.iter().copied())? else {
            continue;
        };
        o.fd = next;
        for &m in &mappers {
            plan_of(m, root, members)?.shm_slots.push(next);
        }
        plan_of(pid, root, members)?.make_shm.push(o);
        next += 1;
    }
    let count = (next - base) as u32;
    for p in std::iter::once(root).chain(members.iter_mut()) {
        p.shared_base = base;
        p.shared_count = count;
    }
    Ok(())
}

/// Checks the files `img` maps and its executable against this machine's, by content, except
/// those the checkpoint carries (`carried`: the private directories of the image, or of its
/// tree's main process).
fn verify_files(
    img: &ProcessImage,
    carried: &crate::files::FileChanges,
    host_path: &dyn Fn(&str) -> Option<PathBuf>,
) -> Result<()> {
    // A file the checkpoint's tree carries (a private directory or the sandbox's tmpfs) is
    // written by the restore itself, with the contents captured in the same pause as the
    // memory; its hash (taken after the pause) may be of later contents.
    let in_tree = |p: &str| {
        carried
            .upsert
            .iter()
            .any(|(q, e)| q == p && matches!(e, crate::files::Entry::File { .. }))
    };
    for f in img
        .files
        .iter()
        .chain(std::iter::once(&img.exe))
        .filter(|f| !in_tree(&f.path))
    {
        let err = |reason: String| RestoreError::File {
            path: f.path.clone(),
            reason,
        };
        let host = host_path(&f.path).ok_or_else(|| err("not visible in the sandbox".into()))?;
        let file =
            std::fs::File::open(&host).map_err(|e| err(format!("{}: {e}", host.display())))?;
        let meta = file
            .metadata()
            .map_err(|e| err(format!("{}: {e}", host.display())))?;
        let hash = crate::capture::cached_hash(file, &meta).map_err(|e| err(e.to_string()))?;
        if hash != f.hash {
            return Err(err(format!(
                "{} differs from the checkpointed file (content hash mismatch)",
                host.display()
            )));
        }
    }
    Ok(())
}

fn cat<T: Copy>(v: &[T]) -> Vec<u8> {
    v.iter().flat_map(|x| as_bytes(x).to_vec()).collect()
}

/// Registers as the restored thread must see them: an interrupted system call is set up to be
/// issued again (as the kernel does after a signal without handler), and one that cannot be
/// restarted transparently returns EINTR.
fn apply_restart(mut r: Regs) -> Regs {
    if (r.orig_rax as i64) >= 0 {
        match r.rax as i64 {
            -514..=-512 => {
                r.rax = r.orig_rax;
                r.rip = r.rip.wrapping_sub(2);
            }
            -516 => r.rax = (-libc::EINTR) as u64,
            _ => {}
        }
    }
    r
}

/// The restorer's plan for `img`, whose mappings of shared memory name `objects` (its own, or
/// its tree's), marking the System V segments `rmid` for removal once attached.
fn build_plan(
    img: &ProcessImage,
    objects: &[ShmObject],
    rmid: &[i32],
    base: RawFd,
    hold: bool,
    pages_offset: u64,
) -> Result<Vec<u8>> {
    let file_fd = |i: u32| base + INHERITED as RawFd + i as RawFd;
    let exe_fd = base + INHERITED as RawFd + img.files.len() as RawFd;
    // Anonymous shared memory objects: their descriptors follow the executable's.
    let anon = anon_mapped(img, objects);
    let shm_fd = |id: ShmId| {
        anon.iter()
            .position(|&a| a == id)
            .map(|k| exe_fd + 1 + k as RawFd)
    };
    let shm_size = |id: ShmId| objects.iter().find(|o| o.id == id).map(|o| o.size);

    let mut runs: Vec<PageRun> = img.runs.clone();
    runs.sort_by_key(|r| r.addr);
    let mut vmas = Vec::new();
    let mut plan_runs = Vec::new();
    let mut vdso_base = 0;
    let mut ri = 0;
    for v in &img.vmas {
        if v.backing == Backing::Vdso {
            if vdso_base == 0 {
                vdso_base = v.start;
            }
            continue;
        }
        let first_run = plan_runs.len() as u32;
        while ri < runs.len() && runs[ri].addr < v.end {
            let r = runs[ri];
            if r.addr < v.start || r.addr.checked_add(r.len).is_none_or(|e| e > v.end) {
                return Err(RestoreError::Invalid(format!(
                    "page run at {:#x} straddles a mapping",
                    r.addr
                )));
            }
            plan_runs.push(abi::PageRun {
                addr: r.addr,
                len: r.len,
                data_off: pages_offset + r.data_off,
            });
            ri += 1;
        }
        let mut flags = v.flags;
        let mut attach_len = 0;
        let (fd, file_off) = match v.backing {
            Backing::File { index, offset } => (file_fd(index), offset),
            Backing::Shm { id, offset } => {
                let missing =
                    || RestoreError::Invalid(format!("shared memory {id:?} is not in the image"));
                if first_run != plan_runs.len() as u32 {
                    return Err(RestoreError::Invalid(format!(
                        "page runs in the shared mapping at {:#x}",
                        v.start
                    )));
                }
                match id {
                    ShmId::Anon(_) | ShmId::Unlinked { .. } => {
                        (shm_fd(id).ok_or_else(missing)?, offset)
                    }
                    ShmId::Sysv(shmid) => {
                        flags |= VMA_SYSV;
                        if offset == 0 {
                            attach_len = shm_size(id).ok_or_else(missing)?.div_ceil(4096) * 4096;
                        }
                        (shmid, offset)
                    }
                }
            }
            _ => (-1, 0),
        };
        if v.shared {
            flags |= VMA_SHARED;
        }
        if fd < 0 {
            flags |= VMA_ANON;
        }
        vmas.push(VmaDesc {
            start: v.start,
            end: v.end,
            file_off,
            prot: v.prot,
            flags,
            fd,
            first_run,
            nr_runs: plan_runs.len() as u32 - first_run,
            _pad: 0,
            attach_len,
        });
    }
    if ri != runs.len() {
        return Err(RestoreError::Invalid(
            "page runs outside every mapping".into(),
        ));
    }

    // The largest gap between mappings, with margins (stacks grow down into gaps).
    let mut bounds: Vec<(u64, u64)> = img.vmas.iter().map(|v| (v.start, v.end)).collect();
    bounds.sort_unstable();
    let mut hole = (0u64, 0u64);
    let mut prev_end = 1u64 << 24;
    for &(s, e) in bounds
        .iter()
        .chain(std::iter::once(&(0x7fff_ffff_f000, 0x7fff_ffff_f000)))
    {
        if s > prev_end && s - prev_end > hole.1 - hole.0 {
            hole = (prev_end, s);
        }
        prev_end = prev_end.max(e);
    }
    let margin = 64 << 20;
    if hole.1 - hole.0 < 4 * margin {
        return Err(RestoreError::Invalid(
            "no room in the address space for the restorer".into(),
        ));
    }
    let (hole_start, hole_end) = (hole.0 + margin, hole.1 - margin);

    // Seccomp: the filters every thread shares first, then each thread's own (see
    // `crate::seccomp::plan`). A target with neither `no_new_privs` nor `CAP_SYS_ADMIN` could
    // not install a filter once it has its credentials back: each thread installs its whole
    // chain before it takes them.
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    let early = !img.creds.no_new_privs && img.creds.cap_effective & CAP_SYS_ADMIN == 0;
    let tids: Vec<i32> = img.threads.iter().map(|t| t.tid).collect();
    let (shared, own) = if early {
        let (shared, mut own) = crate::seccomp::plan(&img.seccomp, &tids);
        for o in &mut own {
            o.splice(0..0, shared.iter().copied());
        }
        (Vec::new(), own)
    } else {
        crate::seccomp::plan(&img.seccomp, &tids)
    };
    let mut seccomp_list: Vec<u32> = shared.clone();
    let mut seccomp_span = Vec::new();
    for o in &own {
        seccomp_span.push((seccomp_list.len() as u32, o.len() as u32));
        seccomp_list.extend(o);
    }

    let mut threads = Vec::new();
    for (i, t) in img.threads.iter().enumerate() {
        if t.regs.len() != 27 || t.xstate.len() > XSTATE_MAX {
            return Err(RestoreError::Invalid(format!(
                "thread {} has a malformed register set",
                t.tid
            )));
        }
        let mut d = ThreadDesc {
            tid: t.tid,
            _pad: 0,
            regs: apply_restart(regs_from_slice(&t.regs)),
            sigmask: t.sigmask,
            robust_list: t.robust_list,
            robust_len: t.robust_len,
            clear_child_tid: t.clear_child_tid,
            rseq_addr: t.rseq.map_or(0, |r| r.addr),
            rseq_len: t.rseq.map_or(0, |r| r.len),
            rseq_sig: t.rseq.map_or(0, |r| r.sig),
            altstack_sp: t.altstack.sp,
            altstack_size: t.altstack.size,
            altstack_flags: t.altstack.flags,
            xstate_len: t.xstate.len() as u32,
            seccomp_first: seccomp_span[i].0,
            seccomp_count: seccomp_span[i].1,
            comm: [0; 16],
            xstate: [0; XSTATE_MAX],
        };
        let n = t.comm.len().min(15);
        d.comm[..n].copy_from_slice(&t.comm.as_bytes()[..n]);
        d.xstate[..t.xstate.len()].copy_from_slice(&t.xstate);
        threads.push(d);
    }
    if img.threads.first().is_none_or(|t| t.tid != img.pid) {
        return Err(RestoreError::Invalid(
            "the first thread is not the process leader".into(),
        ));
    }
    let sigs: Vec<SigactionDesc> = img
        .sigactions
        .iter()
        .map(|s| SigactionDesc {
            signo: s.signo,
            _pad: 0,
            handler: s.handler,
            flags: s.flags,
            restorer: s.restorer,
            mask: s.mask,
        })
        .collect();
    let cloexec: Vec<i32> = img.fds.iter().filter(|f| f.cloexec).map(|f| f.fd).collect();
    let mut close: Vec<i32> = (0..INHERITED as RawFd)
        .filter(|&i| i != 2) // notify: closed by the restorer after its report
        .map(|i| base + i)
        .collect();
    close.extend((0..img.files.len() as u32).map(file_fd));
    close.push(exe_fd);
    close.extend(anon.iter().filter_map(|&id| shm_fd(id)));

    // Lay the sections out after the header, each 64-byte aligned.
    let mut buf = vec![0u8; std::mem::size_of::<PlanHeader>()];
    let mut section = |bytes: &[u8]| -> u32 {
        while !buf.len().is_multiple_of(64) {
            buf.push(0);
        }
        let off = buf.len() as u32;
        buf.extend_from_slice(bytes);
        off
    };
    let vmas_off = section(&cat(&vmas));
    let runs_off = section(&cat(&plan_runs));
    let threads_off = section(&cat(&threads));
    let sigactions_off = section(&cat(&sigs));
    let cloexec_off = section(&cat(&cloexec));
    let close_off = section(&cat(&close));
    // Segments marked for removal: marked again once attached.
    let rmid_off = section(&cat(rmid));
    let auxv_off = section(&cat(&img.auxv));
    let groups_off = section(&cat(&img.creds.groups));
    // In increasing id order (a kernel without PR_TIMER_CREATE_RESTORE_IDS can only count up).
    let mut timers: Vec<TimerDesc> = img
        .timers
        .posix
        .iter()
        .map(|t| TimerDesc {
            id: t.id,
            clock: t.clock,
            signo: t.signo,
            notify: t.notify,
            tid: t.tid,
            _pad: 0,
            sigval: t.sigval,
            value_ns: t.value_ns,
            interval_ns: t.interval_ns,
        })
        .collect();
    timers.sort_by_key(|t| t.id);
    let timers_off = section(&cat(&timers));
    let mut itimers = [ItimerDesc::default(); 3];
    for t in &img.timers.itimers {
        if let Some(d) = itimers.get_mut(t.which as usize) {
            *d = ItimerDesc {
                value_ns: t.value_ns,
                interval_ns: t.interval_ns,
            };
        }
    }
    // Each program once, then the list naming them.
    let mut insns_off = Vec::with_capacity(img.seccomp.filters.len());
    for f in &img.seccomp.filters {
        insns_off.push(section(&cat(&f.insns)));
    }
    let seccomp: Vec<SeccompDesc> = seccomp_list
        .iter()
        .map(|&k| {
            let f = &img.seccomp.filters[k as usize];
            SeccompDesc {
                insns_off: insns_off[k as usize],
                len: f.insns.len() as u32,
                flags: f.flags,
                _pad: 0,
            }
        })
        .collect();
    let seccomp_off = section(&cat(&seccomp));
    // Pending signals: the process's queue, then each thread's, each oldest first (validated:
    // 128 bytes of details each).
    let pending: Vec<PendingDesc> = img
        .pending
        .iter()
        .map(|p| (0, p))
        .chain(
            img.threads
                .iter()
                .flat_map(|t| t.pending.iter().map(move |p| (t.tid, p))),
        )
        .map(|(tid, p)| {
            // (`PendingDesc::info` is the restorer's own `[u8; 128]`: this fails to build if
            // the two sizes part.)
            let mut info = [0u8; crate::image::SIGINFO_SIZE];
            let n = p.info.len().min(info.len());
            info[..n].copy_from_slice(&p.info[..n]);
            PendingDesc {
                tid,
                signo: p.signo as i32,
                info,
            }
        })
        .collect();
    let pending_off = section(&cat(&pending));
    let m = &img.mm;
    let hdr = PlanHeader {
        magic: PLAN_MAGIC,
        version: PLAN_VERSION,
        size: buf.len() as u32,
        nr_vmas: vmas.len() as u32,
        nr_runs: plan_runs.len() as u32,
        nr_threads: threads.len() as u32,
        nr_sigactions: sigs.len() as u32,
        nr_cloexec: cloexec.len() as u32,
        nr_close: close.len() as u32,
        vmas_off,
        runs_off,
        threads_off,
        sigactions_off,
        cloexec_off,
        close_off,
        auxv_off,
        auxv_len: (img.auxv.len() * 8) as u32,
        vdso_base,
        hole_start,
        hole_end,
        pages_fd: base + 1,
        notify_fd: base + 2,
        exe_fd,
        umask: img.umask,
        hold: hold as u32,
        _pad: 0,
        mm: MmMap {
            start_code: m.start_code,
            end_code: m.end_code,
            start_data: m.start_data,
            end_data: m.end_data,
            start_brk: m.start_brk,
            brk: m.brk,
            start_stack: m.start_stack,
            arg_start: m.arg_start,
            arg_end: m.arg_end,
            env_start: m.env_start,
            env_end: m.env_end,
        },
        creds: CredsDesc {
            uid: img.creds.uid,
            gid: img.creds.gid,
            groups_off,
            nr_groups: img.creds.groups.len() as u32,
            cap_inheritable: img.creds.cap_inheritable,
            cap_permitted: img.creds.cap_permitted,
            cap_effective: img.creds.cap_effective,
            cap_bounding: img.creds.cap_bounding,
            cap_ambient: img.creds.cap_ambient,
            securebits: img.creds.securebits,
            no_new_privs: img.creds.no_new_privs as u32,
            dumpable: img.creds.dumpable,
            _pad: 0,
        },
        nr_timers: timers.len() as u32,
        timers_off,
        itimers,
        nr_seccomp: seccomp.len() as u32,
        seccomp_off,
        seccomp_shared: shared.len() as u32,
        seccomp_early: early as u32,
        nr_rmid: rmid.len() as u32,
        rmid_off,
        nr_pending: pending.len() as u32,
        pending_off,
    };
    buf[..std::mem::size_of::<PlanHeader>()].copy_from_slice(as_bytes(&hdr));
    Ok(buf)
}

/// The restore child: runs inside the sandbox with the target's PID, never returns. On failure
/// it reports the reason through the notify pipe and exits.
pub fn child_main(payload: &[u8]) -> ! {
    let plan: ChildPlan = match postcard::from_bytes(payload) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tardi restore child: bad payload: {e}");
            // SAFETY: exiting without running anything else of this forked process.
            unsafe { libc::_exit(120) }
        }
    };
    // Session, group and children first (a tree's processes are created top-down, each by
    // its parent); from here on `plan` is the plan of the process this one became.
    let (plan, failed) = make_tree(plan);
    let notify = plan.base + 2;
    let msg = failed.unwrap_or_else(|| child_setup(&plan));
    let notify_fd = if plan.inherited.len() == INHERITED {
        // Before or after the move: try the final number first.
        // SAFETY: F_GETFD only queries.
        if unsafe { libc::fcntl(notify, libc::F_GETFD) } >= 0 {
            notify
        } else {
            plan.inherited[2]
        }
    } else {
        -1
    };
    let rec = [u64::MAX, 0, msg.len() as u64];
    // SAFETY: writing local buffers to the notify pipe, then exiting.
    unsafe {
        libc::write(notify_fd, rec.as_ptr().cast(), 24);
        libc::write(notify_fd, msg.as_ptr().cast(), msg.len());
        libc::_exit(121)
    }
}

/// Gives the calling process (the main process, as the sandbox created it) its session and
/// group, then creates its children with their PIDs (`clone3` with `set_tid`), each of which
/// does the same for itself. Returns the plan of the process the caller ended up as, with the
/// reason it failed, if it did (to be reported through that process's notify pipe).
fn make_tree(mut me: ChildPlan) -> (ChildPlan, Option<String>) {
    let members = std::mem::take(&mut me.members);
    let zombies = std::mem::take(&mut me.zombies);
    // The private directories first (only the main process carries them), as the checkpoint
    // saw them: a mapped file or a descriptor of any process, shared or not, may name a file
    // in them.
    if !me.private_files.dirs.is_empty()
        && let Err(e) = crate::files::materialize(&me.private_files)
    {
        return (me, Some(format!("writing the private directories: {e}")));
    }
    'process: loop {
        // SAFETY: setsid and setpgid take no pointers.
        let r = unsafe {
            if me.setsid {
                libc::setsid()
            } else if me.setpgid {
                libc::setpgid(0, 0)
            } else {
                0
            }
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return (me, Some(format!("setting the session or group: {e}")));
        }
        // The shared descriptions this process makes, before any child is forked: the
        // children inherit them.
        if !me.make_shared.is_empty()
            && let Err(e) = make_shared(&me)
        {
            return (me, Some(e));
        }
        // And the shared memory objects it makes (the segments in the main process, before
        // any other process exists; an anonymous object in the shared block).
        if !me.make_shm.is_empty() {
            let Some(&pages) = me.inherited.get(1) else {
                return (me, Some("no page data descriptor".into()));
            };
            if let Err(e) = crate::shm::make_all(&me.make_shm, pages) {
                return (me, Some(e));
            }
        }
        for m in members
            .iter()
            .filter(|m| m.ppid == me.pid && m.pid != me.pid)
        {
            match fork_with_pid(m.pid) {
                Ok(0) => {
                    me = m.clone();
                    continue 'process;
                }
                Ok(_) => {}
                Err(e) => {
                    return (
                        me,
                        Some(format!("creating process {} with its PID: {e}", m.pid)),
                    );
                }
            }
        }
        let failed = make_zombies(&me, &zombies).err();
        return (me, failed);
    }
}

/// Recreates the zombies whose parent is the calling process (`me`, once its session and group
/// are set): each a child with its PID, its group and session, that exits with its status
/// ([`become_zombie`]). Returns once every one has exited, unreaped and with the recorded
/// status, and with no `SIGCHLD` of theirs pending: the originals' were delivered before the
/// checkpoint (a capture delivers pending signals first).
fn make_zombies(me: &ChildPlan, zombies: &[Zombie]) -> std::result::Result<(), String> {
    let mine: Vec<&Zombie> = zombies.iter().filter(|z| z.ppid == me.pid).collect();
    if mine.is_empty() {
        return Ok(());
    }
    // SIGCHLD at its default action and unblocked (whatever this process inherited): ignored,
    // a child that exits would be reaped at once instead of staying a zombie; blocked, its
    // SIGCHLD would stay pending into the restored process. Unblocked at its default (ignore)
    // action, the kernel discards it when the child exits.
    // SAFETY: signal() with a constant disposition; sigprocmask with a local set.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
    for z in &mine {
        // The child only makes system calls and exits.
        match fork_with_pid(z.pid) {
            Ok(0) => become_zombie(z),
            Ok(_) => {}
            Err(e) => return Err(format!("creating zombie {} with its PID: {e}", z.pid)),
        }
    }
    for z in &mine {
        // SAFETY: an all-zero siginfo_t is a valid value of this plain C struct.
        let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes into `si`, alive for the call. WNOWAIT leaves the child a
        // zombie.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                z.pid as libc::id_t,
                &mut si,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(format!("waiting for zombie {} to exit: {e}", z.pid));
        }
        // SAFETY: waitid filled in a SIGCHLD siginfo, whose si_status is valid.
        let st = unsafe { si.si_status() };
        let got = match si.si_code {
            libc::CLD_EXITED => (st & 0xff) << 8,
            _ => st & 0x7f,
        };
        if got != z.status {
            return Err(format!(
                "zombie {} ended with wait status {got:#x}, not {:#x}",
                z.pid, z.status
            ));
        }
    }
    Ok(())
}

/// The body of a recreated zombie (a fresh child of its parent's restore child): takes its
/// session or group if it led one (otherwise it is in its parent's, inherited), its user, and
/// exits with its status: an exit code, or its signal with the default action (not dumpable,
/// so a signal whose action dumps core does not, as the status records). Never returns; a
/// signal that does not end it exits 127, which its parent reports as a wrong status.
fn become_zombie(z: &Zombie) -> ! {
    // SAFETY: plain system calls on this process with no pointers but a local signal set;
    // nothing here returns into the restore child's code.
    unsafe {
        if z.sid == z.pid {
            libc::setsid();
        } else if z.pgid == z.pid {
            libc::setpgid(0, 0);
        }
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        if z.uid != 0 {
            libc::setresuid(z.uid, z.uid, z.uid);
        }
        let sig = z.status & 0x7f;
        if sig == 0 {
            libc::_exit((z.status >> 8) & 0xff);
        }
        // The raw call: the C library refuses signals it reserves for itself (32, 33). All
        // zero is `struct sigaction` with the default handler, no flags and an empty mask.
        let dfl = [0u64; 4];
        libc::syscall(libc::SYS_rt_sigaction, sig, dfl.as_ptr(), 0usize, 8usize);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
        libc::_exit(127)
    }
}

/// Makes the shared descriptions `p.make_shared` at their numbers in the block (see
/// [`ChildPlan::shared_base`]), in the process's working directory (a unix socket may be bound
/// to a relative path).
fn make_shared(p: &ChildPlan) -> std::result::Result<(), String> {
    let Ok(cwd) = CString::new(p.cwd.as_str()) else {
        return Err(format!("working directory {:?} contains a NUL byte", p.cwd));
    };
    // SAFETY: valid C string.
    if unsafe { libc::chdir(cwd.as_ptr()) } < 0 {
        let e = io::Error::last_os_error();
        return Err(format!("chdir {}: {e}", p.cwd));
    }
    let end = p.shared_base + p.shared_count as RawFd;
    fds::recreate(&p.make_shared, end, p.shared_base)
        .map_err(|e| format!("making a shared description: {e}"))
}

/// Forks the calling (single-threaded) process into a child with PID `pid` in the sandbox's
/// PID namespace (`clone3` with `set_tid`, exit signal SIGCHLD): 0 in the child, the child's
/// PID in the parent.
fn fork_with_pid(pid: i32) -> io::Result<libc::c_long> {
    let tid = [pid as libc::pid_t];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tid.as_ptr() as u64,
        set_tid_size: 1,
        ..CloneArgs::default()
    };
    // SAFETY: a fork-like clone3 (no CLONE_VM: the child has its own copy of this
    // single-threaded process and returns here with 0); `args` and the one-element `set_tid`
    // array are alive for the call.
    let child = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(child)
}

/// `struct clone_args` of `clone3(2)` (the fields up to `set_tid_size`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
}

/// Sets everything up and execs the restorer; returns only on failure.
fn child_setup(p: &ChildPlan) -> String {
    let step = |what: &str, e: io::Error| format!("{what}: {e}");
    // 1. Inherited descriptors to base.., everything else closed.
    for (i, &fd) in p.inherited.iter().enumerate() {
        // SAFETY: dup2 of an inherited descriptor to a number above all others.
        if unsafe { libc::dup2(fd, p.base + i as RawFd) } < 0 {
            return step("moving inherited descriptors", io::Error::last_os_error());
        }
    }
    // The tree's shared descriptions wait in their block until step 5.
    let shared_end = p.shared_base + p.shared_count as RawFd;
    let close_to = if p.shared_count > 0 {
        p.shared_base.saturating_sub(1) as u32
    } else {
        u32::MAX
    };
    // SAFETY: closes every descriptor outside our block and the shared one (whatever the
    // sandbox init left open is not the target's and must not leak into it). A range whose
    // end is below its start (no number between our block and the shared one) fails
    // harmlessly.
    unsafe {
        libc::syscall(libc::SYS_close_range, 0u32, (p.base - 1) as u32, 0u32);
        libc::syscall(
            libc::SYS_close_range,
            (p.base + INHERITED as RawFd) as u32,
            close_to,
            0u32,
        );
        if p.shared_count > 0 {
            libc::syscall(libc::SYS_close_range, shared_end as u32, u32::MAX, 0u32);
        }
    }
    // 2. (The private directories were written before the tree was made: `make_tree`.)
    // 2b. Shared memory objects (System V ones in the sandbox's IPC namespace, with their ids;
    // anonymous ones as descriptors after the executable's): a single process makes its own;
    // a process of a tree takes the anonymous ones it maps from the shared block (the tree's
    // objects were made before its processes were).
    if let Err(e) = crate::shm::make_all(&p.shm, p.base + 1) {
        return e;
    }
    let first_anon = p.base + INHERITED as RawFd + p.files.len() as RawFd + 1;
    for (k, &slot) in p.shm_slots.iter().enumerate() {
        // SAFETY: dup2 of an inherited descriptor of the shared block to its planned number,
        // in our own block (closed above, nothing of ours is there).
        if unsafe { libc::dup2(slot, first_anon + k as RawFd) } < 0 {
            return step("placing shared memory", io::Error::last_os_error());
        }
    }
    // 3. Mapped files and the executable. The executable for PR_SET_MM_EXE_FILE must be a real
    // open file: O_PATH only if it cannot be read.
    let n = p.files.len();
    for (i, path) in p.files.iter().chain(std::iter::once(&p.exe)).enumerate() {
        let target = p.base + INHERITED as RawFd + i as RawFd;
        let Ok(c) = CString::new(path.as_str()) else {
            let what = if i == n { "executable" } else { "mapped file" };
            return format!("{what} {path:?} contains a NUL byte");
        };
        // SAFETY: valid C string.
        let open = |flags| unsafe { libc::open(c.as_ptr(), flags) };
        let mut fd = if p.shared.get(i).copied().unwrap_or(false) {
            open(libc::O_RDWR)
        } else {
            -1
        };
        if fd < 0 {
            fd = open(libc::O_RDONLY);
        }
        if fd < 0 && i == n {
            fd = open(libc::O_PATH);
        }
        if fd < 0 {
            return step(
                &format!("opening mapped file {path}"),
                io::Error::last_os_error(),
            );
        }
        // SAFETY: moving our fresh descriptor to its planned number.
        unsafe {
            libc::dup2(fd, target);
            libc::close(fd);
        }
    }
    // 4. Working directory (a unix socket may be bound to a relative path).
    let Ok(cwd) = CString::new(p.cwd.as_str()) else {
        return format!("working directory {:?} contains a NUL byte", p.cwd);
    };
    // SAFETY: valid C string.
    if unsafe { libc::chdir(cwd.as_ptr()) } < 0 {
        return step(&format!("chdir {}", p.cwd), io::Error::last_os_error());
    }
    // 5. The target's descriptors at their numbers; limits, PID cursor.
    let floor = (first_anon + p.anon_fds as RawFd).max(shared_end);
    if let Err(e) = fds::recreate(&p.fds, floor, p.shared_base) {
        return e.to_string();
    }
    if p.shared_count > 0 {
        // SAFETY: the shared block: every description this process holds is at its number
        // now, and its children (forked before this step) have their own references.
        unsafe {
            libc::syscall(
                libc::SYS_close_range,
                p.shared_base as u32,
                (shared_end - 1) as u32,
                0u32,
            )
        };
    }
    for &(res, cur, max) in &p.rlimits {
        let lim = libc::rlimit64 {
            rlim_cur: cur,
            rlim_max: max,
        };
        // SAFETY: `lim` is valid; failures (e.g. raising a hard limit) are not fatal.
        unsafe { libc::prlimit64(0, res as _, &lim, std::ptr::null_mut()) };
    }
    if let Err(e) = std::fs::write("/proc/sys/kernel/ns_last_pid", p.max_tid.to_string()) {
        return step("setting ns_last_pid", e);
    }
    // 6. Become the target.
    let Ok(arg1) = CString::new(p.base.to_string()) else {
        return "descriptor base is not a number".into();
    };
    let argv = [c"tardi-restorer".as_ptr(), arg1.as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let empty = c"";
    // SAFETY: execveat on the restorer memfd with valid argv/envp arrays.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            p.base + 3,
            empty.as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    step("exec of the restorer", io::Error::last_os_error())
}

/// Timings of a restore's last phase.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FinishStats {
    /// From `finish` being called to the restorer's report.
    pub restorer: Duration,
    /// Removing the restorer blob.
    pub cleanup: Duration,
}

/// Waits for the restorer of the process whose host PID is `pid` to report, then unmaps its
/// blob.
pub fn finish(mut prep: Prepared, pid: Pid, timeout: Duration) -> Result<FinishStats> {
    let members = std::mem::take(&mut prep.members);
    let mut stats = finish_one(prep, pid, timeout)?;
    for m in members {
        // The member's report comes through its own pipe (a dead tree, `pid` gone, ends the
        // wait). Once it has reported, the process runs its own code, and may already have
        // exited and been reaped (a PostgreSQL backend whose client connection the restore
        // reset exits at once): one not found among the descendants did that, and its blob
        // went with it.
        let t0 = Instant::now();
        let ns = m.pid;
        let (base, total) = wait_report(m, pid, timeout)?;
        stats.restorer += t0.elapsed();
        let t1 = Instant::now();
        let host = match host_pid(pid, ns, Duration::from_millis(100)) {
            Ok(host) => host,
            Err(RestoreError::Timeout) => {
                tracing::debug!(
                    pid = ns,
                    "a restored process exited right after its restore"
                );
                continue;
            }
            Err(e) => return Err(e),
        };
        match unmap_blob(host, base, total) {
            Ok(()) => {}
            Err(_) if proc_state(host).is_none_or(|r| r.starts_with(['Z', 'X'])) => {
                tracing::debug!(
                    pid = ns,
                    "a restored process exited right after its restore"
                );
            }
            Err(e) => return Err(RestoreError::Finish(e.to_string())),
        }
        stats.cleanup += t1.elapsed();
    }
    Ok(stats)
}

/// The host PID of the process whose PID in the sandbox is `ns_pid`, among the descendants of
/// `root` (a host PID), waiting for it to exist (its parent creates it).
fn host_pid(root: Pid, ns_pid: i32, timeout: Duration) -> Result<Pid> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut todo = vec![root];
        while let Some(p) = todo.pop() {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            let ns = crate::procfs::status_ns_last(&status, "NSpid");
            if ns == Some(ns_pid) {
                return Ok(p);
            }
            for t in std::fs::read_dir(format!("/proc/{p}/task"))
                .into_iter()
                .flatten()
            {
                let Ok(t) = t else { continue };
                let c = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                todo.extend(c.split_whitespace().filter_map(|c| c.parse::<Pid>().ok()));
            }
        }
        if !std::path::Path::new(&format!("/proc/{root}")).exists() {
            return Err(RestoreError::Died);
        }
        if Instant::now() > deadline {
            return Err(RestoreError::Timeout);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// [`finish`] for one process.
fn finish_one(prep: Prepared, pid: Pid, timeout: Duration) -> Result<FinishStats> {
    let t0 = Instant::now();
    let (base, total) = wait_report(prep, pid, timeout)?;
    let stats_restorer = t0.elapsed();
    let t1 = Instant::now();
    unmap_blob(pid, base, total).map_err(|e| {
        // A zombie or a vanished process: the service ran and died before the blob went.
        let dead = proc_state(pid).is_none_or(|rest| rest.starts_with(['Z', 'X']));
        if dead {
            RestoreError::ExitedAtOnce
        } else {
            RestoreError::Finish(e.to_string())
        }
    })?;
    Ok(FinishStats {
        restorer: stats_restorer,
        cleanup: t1.elapsed(),
    })
}

/// A process of a restore held before running ([`finish_held_tree`]).
#[derive(Debug, Clone, Copy)]
pub struct HeldProcess {
    /// Its PID in the sandbox.
    pub pid: i32,
    /// Its host PID.
    pub host: Pid,
    /// The restorer's range `(start, end)` in it (see [`finish_held`]).
    pub blob: (u64, u64),
}

/// [`finish_held`] for every process of a tree (the main one first, whose host PID is `pid`;
/// the others in the checkpoint's order), each held stopped before running.
pub fn finish_held_tree(
    mut prep: Prepared,
    pid: Pid,
    timeout: Duration,
) -> Result<Vec<HeldProcess>> {
    let members = std::mem::take(&mut prep.members);
    let t0 = Instant::now();
    let mut out = vec![HeldProcess {
        pid: prep.pid,
        host: pid,
        blob: finish_held(prep, pid, timeout)?,
    }];
    for m in members {
        let left = timeout.saturating_sub(t0.elapsed());
        let host = host_pid(pid, m.pid, left)?;
        out.push(HeldProcess {
            pid: m.pid,
            host,
            blob: finish_held(m, host, timeout.saturating_sub(t0.elapsed()))?,
        });
    }
    Ok(out)
}

/// For a restore prepared with `hold`: waits for the report and for the process to stop
/// itself. Returns the restorer's range `(start, end)`, the one mapping that differs from the
/// source. Resume with SIGCONT (the restorer blob then stays mapped: for comparisons only).
/// The main process only: the other processes of a tree are [`finish_held_tree`]'s.
pub fn finish_held(prep: Prepared, pid: Pid, timeout: Duration) -> Result<(u64, u64)> {
    let (base, total) = wait_report(prep, pid, timeout)?;
    let deadline = Instant::now() + timeout;
    loop {
        if proc_state(pid).is_some_and(|r| r.starts_with('T')) {
            return Ok((base, base + total));
        }
        if Instant::now() > deadline {
            return Err(RestoreError::Timeout);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `/proc/PID/stat` from the state field on (after the command name), or `None` if the
/// process is gone.
fn proc_state(pid: Pid) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.trim_start().to_owned())
}

/// Reads the restorer's report: (blob start, blob size), or its failure.
fn wait_report(prep: Prepared, pid: Pid, timeout: Duration) -> Result<(u64, u64)> {
    // Close our copies of the inherited descriptors so a dead restorer means EOF.
    drop(prep._keep);
    let mut r = std::fs::File::from(prep.notify_r);
    let mut rec = [0u8; 24];
    let deadline = Instant::now() + timeout;
    let mut got = 0;
    while got < 24 {
        let mut pfd = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 20) };
        if n > 0 {
            match r.read(&mut rec[got..]) {
                Ok(0) => return Err(RestoreError::Died),
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        } else if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(RestoreError::Died);
        } else if Instant::now() > deadline {
            return Err(RestoreError::Timeout);
        }
    }
    let w = |i: usize| u64::from_le_bytes(rec[i * 8..i * 8 + 8].try_into().unwrap());
    if w(0) == u64::MAX {
        let (step, val) = (w(1), w(2));
        if step == 0 {
            let mut msg = vec![0u8; val.min(4096) as usize];
            let _ = r.read_exact(&mut msg);
            return Err(RestoreError::Child(
                String::from_utf8_lossy(&msg).into_owned(),
            ));
        }
        return Err(RestoreError::Restorer {
            step,
            what: step_name(step),
            errno: -(val as i64),
        });
    }
    Ok((w(0), w(1)))
}

fn step_name(step: u64) -> &'static str {
    match step {
        1 => "arguments",
        2 => "reading the plan",
        3 => "finding room for itself",
        4 => "clearing the address space",
        5 => "mapping the vDSO",
        6 => "recreating a mapping",
        7 => "filling pages",
        8 => "re-protecting a mapping",
        9 => "setting the memory layout (PR_SET_MM_MAP)",
        10 => "restoring signal actions",
        11 => "creating a thread",
        12 => "setting thread state",
        13 => "registering rseq",
        14 => "restoring credentials (groups, IDs, capabilities, securebits)",
        15 => "creating a POSIX timer with its id",
        16 => "installing a seccomp filter",
        17 => "attaching a System V segment (shmat)",
        18 => "marking a System V segment for removal",
        19 => "queueing a pending signal again",
        _ => "unknown",
    }
}

/// Stops the restored process once none of its threads is inside the blob, unmaps the blob.
fn unmap_blob(
    pid: Pid,
    base: u64,
    total: u64,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let proc = crate::procfs::Proc::open(pid)?;
    for _ in 0..1000 {
        let mut st = Stopped::stop(&proc)?;
        let inside = st.tids.iter().any(|&t| {
            st.regs(t)
                .map(|r| r.rip >= base && r.rip < base + total)
                .unwrap_or(true)
        });
        if inside {
            st.resume()?;
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let maps = proc.maps()?;
        let leader = st.tids[0];
        let (r, _, _) = st.inject(
            &maps,
            leader,
            libc::SYS_munmap,
            [base, total, 0, 0, 0, 0],
            0,
        )?;
        st.resume()?;
        if r != 0 {
            return Err(format!("munmap returned {r}").into());
        }
        return Ok(());
    }
    Err("a thread stayed inside the restorer".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of process `pid` whose own descriptors start at `base`.
    fn plan(pid: i32, ppid: i32, base: RawFd) -> ChildPlan {
        ChildPlan {
            pid,
            ppid,
            setsid: false,
            setpgid: false,
            members: Vec::new(),
            inherited: Vec::new(),
            base,
            files: vec!["/lib/x.so".into()],
            shared: vec![false],
            exe: "/bin/x".into(),
            fds: Vec::new(),
            cwd: "/".into(),
            rlimits: Vec::new(),
            max_tid: 0,
            private_files: Default::default(),
            shm: Vec::new(),
            anon_fds: 0,
            make_shm: Vec::new(),
            shm_slots: Vec::new(),
            shared_base: 0,
            shared_count: 0,
            make_shared: Vec::new(),
            zombies: Vec::new(),
        }
    }

    fn entry(kind: FdKind, holders: &[(i32, i32)]) -> SharedFile {
        SharedFile {
            file: FdImage {
                fd: holders[0].1,
                cloexec: true,
                flags: 0,
                kind,
            },
            holders: holders.to_vec(),
        }
    }

    fn pipe_end(write_end: bool) -> FdKind {
        FdKind::Pipe {
            id: 9,
            write_end,
            buffered: Vec::new(),
            capacity: 65536,
        }
    }

    /// Each object is made by the lowest common ancestor of its holders (not necessarily a
    /// holder), a pipe's ends together, at numbers above everything any process uses first.
    #[test]
    fn shared_descriptions_are_made_by_the_lowest_common_ancestor() {
        // 2 -> 5 -> (7, 8); 2 -> 6.
        let parents = [(5, 2), (6, 2), (7, 5), (8, 5)];
        let mut root = plan(2, 0, 10);
        let mut members: Vec<ChildPlan> = parents
            .iter()
            .map(|&(pid, ppid)| plan(pid, ppid, if pid == 8 { 40 } else { 10 }))
            .collect();
        let path = |p: &str| FdKind::Path {
            path: p.into(),
            pos: 0,
            is_dir: false,
        };
        let shared = vec![
            // The ends of one pipe: 7 reads, 8 writes; their parent 5 makes it.
            entry(pipe_end(false), &[(7, 3)]),
            entry(pipe_end(true), &[(8, 4)]),
            // Held by 6 and 7: only the root is common.
            entry(path("/a"), &[(6, 3), (7, 5)]),
            // Held by 5 and its child 8: 5 makes it.
            entry(path("/b"), &[(5, 3), (8, 3)]),
            // One holder: it makes it itself.
            entry(path("/c"), &[(8, 6)]),
        ];
        plan_shared(
            &shared,
            Vec::new(),
            &parents,
            &mut root,
            &mut members,
            &[60, 61],
        )
        .unwrap();
        let made = |p: &ChildPlan| -> Vec<RawFd> { p.make_shared.iter().map(|f| f.fd).collect() };
        // Above the inherited descriptors (61) and every process's block (8's: 40 + 4 + 1 + 1).
        let base = 62;
        assert_eq!(made(&root), vec![base + 2]);
        let by_pid = |pid: i32| members.iter().find(|m| m.pid == pid).unwrap();
        assert_eq!(made(by_pid(5)), vec![base, base + 1, base + 3]);
        assert_eq!(made(by_pid(8)), vec![base + 4]);
        assert!(made(by_pid(6)).is_empty() && made(by_pid(7)).is_empty());
        for p in std::iter::once(&root).chain(&members) {
            assert_eq!(
                (p.shared_base, p.shared_count),
                (base, 5),
                "process {}",
                p.pid
            );
        }
        // The entries are made as they were captured, without close-on-exec (it is each
        // holder's).
        assert!(by_pid(5).make_shared.iter().all(|f| !f.cloexec));
        assert_eq!(by_pid(5).make_shared[0].kind, pipe_end(false));

        // A process 8's block reaching above the inherited descriptors moves the base.
        let mut members2 = members.clone();
        members2[3].base = 100;
        let mut root2 = plan(2, 0, 10);
        for m in &mut members2 {
            m.make_shared.clear();
        }
        plan_shared(
            &shared,
            Vec::new(),
            &parents,
            &mut root2,
            &mut members2,
            &[60, 61],
        )
        .unwrap();
        assert_eq!(root2.shared_base, 100 + INHERITED as RawFd + 2);
    }

    /// A tree's shared memory: every System V segment made by the main process; each
    /// anonymous object once, by the lowest common ancestor of the processes that map it, in
    /// the block after the descriptions, and named by each of them in the objects' order.
    #[test]
    fn shared_memory_is_made_once_by_the_lowest_common_ancestor() {
        // 2 -> 5 -> (7, 8); 2 -> 6.
        let parents = [(5, 2), (6, 2), (7, 5), (8, 5)];
        let mut root = plan(2, 0, 10);
        let mut members: Vec<ChildPlan> = parents
            .iter()
            .map(|&(pid, ppid)| plan(pid, ppid, 10))
            .collect();
        // 7 maps two anonymous objects: its own block reaches higher.
        members[2].anon_fds = 2;
        let obj = |id: ShmId, sysv: bool| ShmPlan {
            id,
            size: 4096,
            sysv: sysv.then_some(SysvShm {
                key: 0,
                mode: 0o600,
                uid: 0,
                gid: 0,
                cuid: 0,
                cgid: 0,
                removed: false,
                locked: false,
            }),
            runs: vec![(0, 4096, 8192)],
            fd: -1,
        };
        let shared = vec![entry(pipe_end(false), &[(7, 3)])];
        let shm = vec![
            (obj(ShmId::Sysv(3), true), vec![7]),
            (obj(ShmId::Anon(11), false), vec![7, 8]),
            (obj(ShmId::Anon(12), false), vec![6]),
            (obj(ShmId::Anon(13), false), vec![]),
            (obj(ShmId::Anon(14), false), vec![2, 7]),
        ];
        plan_shared(&shared, shm, &parents, &mut root, &mut members, &[15]).unwrap();
        // Above 7's own block (10 + 4 + 1 + 1 + 2), one description then three objects.
        let base = 18;
        let by_pid = |pid: i32| members.iter().find(|m| m.pid == pid).unwrap();
        let made = |p: &ChildPlan| -> Vec<(ShmId, RawFd)> {
            p.make_shm.iter().map(|o| (o.id, o.fd)).collect()
        };
        assert_eq!(
            made(&root),
            vec![(ShmId::Sysv(3), -1), (ShmId::Anon(14), base + 3)]
        );
        assert_eq!(made(by_pid(5)), vec![(ShmId::Anon(11), base + 1)]);
        assert_eq!(made(by_pid(6)), vec![(ShmId::Anon(12), base + 2)]);
        assert!(made(by_pid(7)).is_empty() && made(by_pid(8)).is_empty());
        assert_eq!(by_pid(7).shm_slots, vec![base + 1, base + 3]);
        assert_eq!(by_pid(8).shm_slots, vec![base + 1]);
        assert_eq!(by_pid(6).shm_slots, vec![base + 2]);
        assert_eq!(root.shm_slots, vec![base + 3]);
        for p in std::iter::once(&root).chain(&members) {
            assert_eq!(
                (p.shared_base, p.shared_count),
                (base, 4),
                "process {}",
                p.pid
            );
        }
        // The contents are read where the main process's data says, whoever makes them.
        assert_eq!(by_pid(5).make_shm[0].runs, vec![(0, 4096, 8192)]);
    }
}
