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
use crate::fds;
use crate::image::*;
use crate::ptrace::Stopped;
pub use crate::shm::ShmPlan;
use crate::sys::{self, Pid, as_bytes};
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod child;
mod finish;
mod plan;

pub use child::child_main;
pub use finish::*;
use plan::*;

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
    /// The connections its connected TCP sockets carry on (see [`crate::tcp`]).
    pub tcp: Vec<TcpConn>,
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
/// A notify-pipe record that says something that did not stop the restore, followed by its
/// text (a report's first word is a blob address, or `u64::MAX` for a failure).
const NOTE: u64 = u64::MAX - 1;

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
        tcp: img.tcp.clone(),
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
    let procs = || img.processes();
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
        let hash = crate::os::filehash::cached_hash(file, &meta).map_err(|e| err(e.to_string()))?;
        if hash != f.hash {
            return Err(err(format!(
                "{} differs from the checkpointed file (content hash mismatch)",
                host.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The restorer's own `clone_args` (it cannot link libc) is the kernel's, as libc has it.
    #[test]
    fn the_restorers_clone_args_are_laid_out_as_libcs() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(
            size_of::<crate::abi::CloneArgs>(),
            size_of::<libc::clone_args>()
        );
        assert!(align_of::<crate::abi::CloneArgs>() <= align_of::<libc::clone_args>());
        assert_eq!(
            offset_of!(crate::abi::CloneArgs, set_tid),
            offset_of!(libc::clone_args, set_tid)
        );
        assert_eq!(
            offset_of!(crate::abi::CloneArgs, cgroup),
            offset_of!(libc::clone_args, cgroup)
        );
    }

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
            tcp: Vec::new(),
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
