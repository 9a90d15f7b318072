//! Process trees (`docs/PROCESS-TREES.md`): a full checkpoint of a service whose main process
//! has descendants. Every process is stopped top-down (a stopped process cannot fork, so
//! listing a process's children after stopping it gives the final list), captured as a single
//! process is, and laid out as a member of the main process's image
//! ([`crate::image::Member`]: its parent, its slice of the page data, its own image).
//!
//! Phase 2a: the open file descriptions that tie processes together (held by several of them,
//! found with `kcmp`; pipes and groups of connected unix sockets whose descriptors are in
//! several processes) are listed once, in the main image's `shared_files`, and named by each
//! holder's descriptor ([`share`]); the restore makes each once and hands it down the tree.
//!
//! Shared memory: the objects of the whole tree (shared anonymous memory, System V segments)
//! are captured once each, whichever processes map them, and listed by the main process; a
//! member's mappings name them ([`crate::shm::ShmTracker::capture_of`]). The restore makes each
//! once and hands it to every process that maps it.
//!
//! Phase 3: children that exited and were not reaped yet (zombies) are listed with their PID,
//! group, session, user and wait status (`/proc/PID/stat`'s `exit_code`), in the main image's
//! `zombies`; the restore recreates each as a child that exits with that status.
//!
//! What cannot be restored yet is refused by name: a zombie that dumped core, an epoll
//! instance held by several processes, and a group or session that is neither the process's
//! own nor its parent's.

use crate::capture::{
    self, CaptureError, CaptureStats, Captured, children_of, estimate_private_bytes, finish_full,
    prefaulted_buffer, proc_err,
};
use crate::image::{Checkpoint, FdKind, Member, ProcessImage, SharedFile, UnixState, Zombie};
use crate::procfs::{MapEntry, Proc};
use crate::ptrace::Stopped;
use crate::shm::ShmTracker;
use crate::sys::Pid;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

type Result<T> = std::result::Result<T, CaptureError>;

/// Why phase 1 refuses what it refuses (the tail of each message).
const NOT_YET: &str = "not supported in a process tree yet";

/// A full checkpoint of the tree rooted at `root` (inside [`crate::procfs::in_view`]), with
/// the private directories walked once, with the main process.
pub(crate) fn checkpoint_tree(
    root: &Proc,
    epoch: u64,
    private_dirs: &[String],
    end: Option<capture::Handover>,
) -> Result<(Checkpoint, CaptureStats)> {
    let mut stats = CaptureStats::default();
    let buf = prefaulted_buffer(estimate_private_bytes(root));
    let t0 = Instant::now();
    // Members: their /proc directory and their parent's index (0: the main process).
    let mut members: Vec<(Proc, usize)> = Vec::new();
    // Zombie children: their state (read while their parent is stopped, so nobody reaps them
    // meanwhile) and their parent's index.
    let mut zombies: Vec<(Zombie, usize, Pid)> = Vec::new();
    let mut stopped: Vec<Stopped> = Vec::new();
    let captured = stop_all(root, &mut members, &mut zombies, &mut stopped).and_then(|()| {
        stats.quiesce = t0.elapsed();
        stats.threads = stopped.iter().map(|s| s.tids.len()).sum();
        let procs: Vec<&Proc> = std::iter::once(root)
            .chain(members.iter().map(|(p, _)| p))
            .collect();
        let groups = find_shared(&procs)?;
        let mut out: Vec<Captured> = Vec::with_capacity(procs.len());
        let mut maps: Vec<Vec<MapEntry>> = Vec::with_capacity(procs.len());
        let mut buf = Some(buf);
        for (p, st) in procs.iter().zip(stopped.iter_mut()) {
            let mut s = CaptureStats::default();
            let b = buf.take().unwrap_or_default();
            let (c, m) = capture::capture_stopped(p, st, &mut s, b, true)?;
            out.push(c);
            maps.push(m);
            stats.memory_copy += s.memory_copy;
        }
        // The tree's shared memory objects, each once, whichever processes map it: listed
        // and carried by the main process (members' mappings name them).
        let tm = Instant::now();
        let each: Vec<(&Proc, &[MapEntry])> = procs
            .iter()
            .zip(&maps)
            .map(|(p, m)| (*p, m.as_slice()))
            .collect();
        out[0].0.shm = ShmTracker::default().capture_of(&each, true, true, &mut out[0].1)?;
        stats.memory_copy += tm.elapsed();
        // Inside the pause: the files consistent with the memory.
        out[0].0.private_files = capture::private_tree(root, private_dirs)?;
        // Every process's connections when the service ends here (see `checkpoint_once`).
        if end.is_some() {
            for (p, c) in procs.iter().zip(out.iter_mut()) {
                c.0.tcp = crate::tcp::Connections::default()
                    .capture(p.pid, &c.0.fds)
                    .conns;
            }
        }
        Ok((out, groups))
    });
    if let Some(handover) = end {
        // Still stopped: finish the checkpoint, hand it over, then end the service.
        let procs: Vec<&Proc> = std::iter::once(root)
            .chain(members.iter().map(|(p, _)| p))
            .collect();
        let ck = captured.and_then(|(captured, groups)| {
            assemble(root, epoch, &members, zombies, captured, groups, &mut stats)
        });
        let r = capture::end::hand_over(&procs, stopped, ck, handover);
        stats.pause = t0.elapsed();
        return r.map(|ck| (ck, stats));
    }
    // Children first, so that no parent runs while a child it might signal is still held.
    let mut resumed = Ok(());
    for st in stopped.into_iter().rev() {
        let r = st.resume();
        if resumed.is_ok() {
            resumed = r;
        }
    }
    stats.pause = t0.elapsed();
    let (captured, groups) = captured?;
    resumed?;
    let ck = assemble(root, epoch, &members, zombies, captured, groups, &mut stats)?;
    Ok((ck, stats))
}

/// The tree's checkpoint from what the pause captured of each process (`captured`, the main
/// process's first): files identified, the shared descriptions moved to the main image, each
/// member and zombie placed under its parent.
fn assemble(
    root: &Proc,
    epoch: u64,
    members: &[(Proc, usize)],
    zombies: Vec<(Zombie, usize, Pid)>,
    captured: Vec<Captured>,
    groups: Vec<FileGroup>,
    stats: &mut CaptureStats,
) -> Result<Checkpoint> {
    let mut it = captured.into_iter();
    let (mut image, mut data, files) = it.next().expect("the main process is always captured");
    finish_full(root, &mut image, &mut data, files)?;
    let mut images: Vec<(ProcessImage, Vec<u8>)> = Vec::with_capacity(members.len());
    for ((proc, _), (mut img, mut d, files)) in members.iter().zip(it) {
        finish_full(proc, &mut img, &mut d, files)?;
        images.push((img, d));
    }
    let hosts: Vec<Pid> = std::iter::once(root.pid)
        .chain(members.iter().map(|(p, _)| p.pid))
        .collect();
    let mut refs: Vec<&mut ProcessImage> = images.iter_mut().map(|(i, _)| i).collect();
    share(&mut image, &mut refs, &hosts, groups)?;
    let pids: Vec<i32> = std::iter::once(image.pid)
        .chain(images.iter().map(|(i, _)| i.pid))
        .collect();
    let ids = |img: &ProcessImage| (img.pid, img.pgid, img.sid);
    check_groups(ids(&image), None)?;
    for ((img, d), (_, parent)) in images.into_iter().zip(members) {
        let parent_img = if *parent == 0 {
            &image
        } else {
            &image.tree[*parent - 1].image
        };
        check_groups(ids(&img), Some(parent_img))?;
        let member = Member {
            ppid: pids[*parent],
            data_off: data.len() as u64,
            data_len: d.len() as u64,
            image: img,
        };
        data.extend_from_slice(&d);
        image.tree.push(member);
    }
    for (mut z, parent, _) in zombies {
        let parent_img = if parent == 0 {
            &image
        } else {
            &image.tree[parent - 1].image
        };
        z.ppid = parent_img.pid;
        check_groups((z.pid, z.pgid, z.sid), Some(parent_img))?;
        image.zombies.push(z);
    }
    stats.saved_bytes = data.len() as u64;
    Ok(Checkpoint::full(epoch, image, data))
}

/// Stops `root`, then every descendant top-down, recording each member with its parent's
/// index, and each zombie child (read, not stopped: it has nothing left to stop) with its
/// parent's index (its `ppid` is left 0 for the caller). Whatever was stopped is in `stopped`
/// (in the order of `root` then `members`), also on failure, for the caller to resume.
pub(crate) fn stop_all(
    root: &Proc,
    members: &mut Vec<(Proc, usize)>,
    zombies: &mut Vec<(Zombie, usize, Pid)>,
    stopped: &mut Vec<Stopped>,
) -> Result<()> {
    stopped.push(Stopped::stop(root)?);
    let mut i = 0;
    while i < stopped.len() {
        let kids = {
            let p = if i == 0 { root } else { &members[i - 1].0 };
            children_of(p, &stopped[i].tids)
        };
        for c in kids {
            let (proc, exited) = open_child(root, c)?;
            if exited {
                zombies.push((zombie(&proc)?, i, c));
                continue;
            }
            let st = Stopped::stop(&proc)?;
            members.push((proc, i));
            stopped.push(st);
        }
        i += 1;
    }
    Ok(())
}

/// What a zombie child leaves: its PID, group and session in the sandbox and its real user
/// (`status`), and its wait status (`stat`'s field 52, `exit_code`, in `waitpid`'s form). Its
/// parent is stopped, so nobody reaps it while it is read. Refused by name: a status a restore
/// cannot recreate (the process dumped core).
pub(crate) fn zombie(proc: &Proc) -> Result<Zombie> {
    let c = proc.pid;
    let status = proc.read_string("status").map_err(proc_err(c, "status"))?;
    let last = |key| crate::procfs::status_ns_last(&status, key).unwrap_or(0);
    let uid = crate::procfs::status_value(&status, "Uid")
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let fields = proc.stat_fields().map_err(proc_err(c, "stat"))?;
    let exit = fields
        .get(51)
        .and_then(|f| f.parse::<i32>().ok())
        .ok_or_else(|| {
            CaptureError::Unsupported(format!(
                "process {c} (host PID) is a zombie whose exit status cannot be read"
            ))
        })?;
    if !Zombie::status_valid(exit) {
        return Err(CaptureError::Unsupported(format!(
            "process {c} (host PID) exited and was not reaped yet with wait status {exit:#x} \
             (it dumped core): a restore cannot recreate that status"
        )));
    }
    Ok(Zombie {
        pid: last("NSpid"),
        ppid: 0,
        pgid: last("NSpgid"),
        sid: last("NSsid"),
        uid,
        status: exit,
    })
}

/// The descendants of `root` as they are now (not stopped: the epoch loop prepares each before
/// its first pause, which lists them again with [`stop_all`] and captures the tree as stopped),
/// in [`stop_all`]'s order, with their parent's index (0: `root`). Zombies are left out
/// (`stop_all` reads them), and so are processes that exit while they are listed (with their
/// descendants): the listing only says what to prepare before the stop.
pub(crate) fn list_members(root: &Proc) -> Result<Vec<(Proc, usize)>> {
    let mut members: Vec<(Proc, usize)> = Vec::new();
    let mut i = 0;
    loop {
        let p = if i == 0 { root } else { &members[i - 1].0 };
        let tids = match p.tids() {
            Ok(t) => t,
            Err(_) if i > 0 => Vec::new(), // it exited meanwhile
            Err(e) => return Err(proc_err(p.pid, "task")(e)),
        };
        for c in children_of(p, &tids) {
            // A zombie is read once stopped (`stop_all`), not prepared; a child that exited
            // and was reaped since it was seen is gone.
            if let Ok((proc, false)) = open_child(root, c) {
                members.push((proc, i));
            }
        }
        if i == members.len() {
            return Ok(members);
        }
        i += 1;
    }
}

/// `/proc` of the child `c` (a host PID) of a process of `root`'s tree, and whether it is a
/// zombie (state `Z`).
pub(crate) fn open_child(root: &Proc, c: Pid) -> Result<(Proc, bool)> {
    let proc = root
        .open_other(c)
        .map_err(proc_err(c, "its /proc directory"))?;
    let state = proc
        .stat_fields()
        .map_err(proc_err(c, "stat"))?
        .get(2)
        .cloned()
        .unwrap_or_default();
    Ok((proc, state == "Z"))
}

/// A descriptor of the tree: (index of its process in the caller's list, its number).
type Holder = (usize, i32);

/// The descriptors of one file (device and inode) that processes of the tree hold, when more
/// than one process holds it, grouped into open file descriptions: each description is its
/// holders, (index of the process in the caller's list, descriptor number).
#[derive(Clone)]
pub(crate) struct FileGroup {
    /// `st_mode` of the file (its type tells a pipe, whose descriptions are its ends).
    mode: u32,
    descriptions: Vec<Vec<Holder>>,
}

/// Finds the files (device and inode, through each descriptor's link) that descriptors of more
/// than one process of the tree refer to, and groups their descriptors into open file
/// descriptions with `kcmp(KCMP_FILE)` (only descriptors of one file are compared: one `kcmp`
/// per descriptor and description of its file). Every process must be stopped.
pub(crate) fn find_shared(procs: &[&Proc]) -> Result<Vec<FileGroup>> {
    let mut by_file: HashMap<(u64, u64), (u32, Vec<Holder>)> = HashMap::new();
    for (i, p) in procs.iter().enumerate() {
        let fds = p.list("fd").map_err(proc_err(p.pid, "fd"))?;
        for fd in fds.iter().filter_map(|f| f.parse::<i32>().ok()) {
            // A descriptor closed meanwhile cannot be: every process is stopped.
            let st = p
                .stat(&format!("fd/{fd}"))
                .map_err(proc_err(p.pid, format!("descriptor {fd}")))?;
            by_file
                .entry((st.st_dev, st.st_ino))
                .or_insert_with(|| (st.st_mode, Vec::new()))
                .1
                .push((i, fd));
        }
    }
    let mut groups = Vec::new();
    for (mode, held) in by_file.into_values() {
        if held.iter().all(|h| h.0 == held[0].0) {
            continue;
        }
        let mut descriptions: Vec<Vec<Holder>> = Vec::new();
        for (proc, fd) in held {
            let same = descriptions.iter_mut().find(|d| {
                let (p0, f0) = d[0];
                crate::sys::same_description(procs[p0].pid, f0, procs[proc].pid, fd)
            });
            match same {
                Some(d) => d.push((proc, fd)),
                None => descriptions.push(vec![(proc, fd)]),
            }
        }
        descriptions.sort_unstable();
        groups.push(FileGroup { mode, descriptions });
    }
    // In the order of their first holders: the same descriptions get the same entries from
    // one capture to the next (the epoch loop then carries the holders' descriptors over).
    groups.sort_unstable_by(|a, b| a.descriptions.cmp(&b.descriptions));
    Ok(groups)
}

/// Moves the open file descriptions that tie processes of the tree together out of the
/// processes' descriptor lists into the main image's `shared_files` (see
/// [`crate::image::SharedFile`]), each holder's entry becoming [`FdKind::Shared`]. Shared are:
/// a description held by more than one process; every end of a pipe whose ends are in more
/// than one process (a pipe is made once, with both ends); every socket of a group of unix
/// sockets connected to one another (peers, a listener and the clients it has not accepted)
/// that spans processes. A pipe's buffered bytes, which each process's capture read, are kept
/// once. Refused by name: an epoll instance held by several processes (its interest list names
/// descriptors of the process that added them).
///
/// Returns how many connections it dropped: those of descriptors that became shared
/// descriptions (a restore resets them, see [`crate::tcp::keep_carried`]).
pub(crate) fn share(
    root: &mut ProcessImage,
    members: &mut [&mut ProcessImage],
    hosts: &[Pid],
    groups: Vec<FileGroup>,
) -> Result<u64> {
    let nprocs = members.len() + 1;
    // Descriptions to share, by holders; the first holder names a description.
    let mut chosen: Vec<Vec<Holder>> = Vec::new();
    let mut seen: HashSet<Holder> = HashSet::new();
    let mut choose = |d: Vec<Holder>, chosen: &mut Vec<Vec<Holder>>| {
        if seen.insert(d[0]) {
            chosen.push(d);
        }
    };
    for g in groups {
        let pipe = g.mode & libc::S_IFMT == libc::S_IFIFO;
        for d in g.descriptions {
            if pipe || d.iter().any(|h| h.0 != d[0].0) {
                choose(d, &mut chosen);
            }
        }
    }
    // Unix sockets: groups of sockets connected to one another, by inode (a socket has one
    // description, so the descriptors of one inode are its holders).
    let image_of = |i: usize| -> &ProcessImage { if i == 0 { &*root } else { &*members[i - 1] } };
    let mut sockets: HashMap<u64, Vec<Holder>> = HashMap::new();
    for i in 0..nprocs {
        for f in &image_of(i).fds {
            if let FdKind::Unix(u) = &f.kind {
                sockets.entry(u.ino).or_default().push((i, f.fd));
            }
        }
    }
    let mut parent: HashMap<u64, u64> = sockets.keys().map(|&k| (k, k)).collect();
    fn find(parent: &mut HashMap<u64, u64>, mut x: u64) -> u64 {
        while parent[&x] != x {
            let up = parent[&parent[&x]];
            parent.insert(x, up);
            x = up;
        }
        x
    }
    for i in 0..nprocs {
        for f in &image_of(i).fds {
            let FdKind::Unix(u) = &f.kind else { continue };
            let pending = match &u.state {
                UnixState::Listening { pending, .. } => pending.as_slice(),
                _ => &[],
            };
            for &other in std::iter::once(&u.peer_ino).chain(pending) {
                if parent.contains_key(&other) {
                    let (a, b) = (find(&mut parent, u.ino), find(&mut parent, other));
                    parent.insert(a, b);
                }
            }
        }
    }
    let mut components: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut inos: Vec<u64> = sockets.keys().copied().collect();
    inos.sort_unstable();
    for ino in inos {
        let c = find(&mut parent, ino);
        components.entry(c).or_default().push(ino);
    }
    let mut roots: Vec<u64> = components.keys().copied().collect();
    roots.sort_unstable();
    for c in roots {
        let members_of = &components[&c];
        let procs: HashSet<usize> = members_of
            .iter()
            .flat_map(|i| sockets[i].iter().map(|h| h.0))
            .collect();
        if procs.len() > 1 {
            for ino in members_of {
                choose(sockets[ino].clone(), &mut chosen);
            }
        }
    }
    if chosen.is_empty() {
        return Ok(0);
    }

    // The entries, then each holder's descriptor naming its entry.
    let mut shared: Vec<SharedFile> = Vec::with_capacity(chosen.len());
    let mut pipe_bytes: HashMap<u64, Vec<u8>> = HashMap::new();
    for d in &chosen {
        let (p0, f0) = d[0];
        let first = image_of(p0);
        let host = hosts.get(p0).copied().unwrap_or(0);
        let Some(file) = first.fds.iter().find(|f| f.fd == f0) else {
            return Err(CaptureError::Unsupported(format!(
                "descriptor {f0} of process {host} (host PID) was not captured"
            )));
        };
        if matches!(file.kind, FdKind::Epoll { .. }) {
            return Err(CaptureError::Unsupported(format!(
                "descriptor {f0} of process {host} (host PID) is an epoll instance held by \
                 several processes: shared epoll instances are {NOT_YET}"
            )));
        }
        let mut file = file.clone();
        if let FdKind::Pipe { id, buffered, .. } = &mut file.kind {
            // Each process's capture copied the pipe's bytes once (with the first end it
            // saw); all copies are equal (every process is stopped): keep one.
            let mut bytes = std::mem::take(buffered);
            for &(p, fd) in d {
                if let Some(FdKind::Pipe { buffered: b, .. }) =
                    image_of(p).fds.iter().find(|f| f.fd == fd).map(|f| &f.kind)
                    && bytes.is_empty()
                {
                    bytes = b.clone();
                }
            }
            let kept = pipe_bytes.entry(*id).or_default();
            if kept.is_empty() {
                *kept = bytes;
            }
        }
        let holders = d.iter().map(|&(p, fd)| (image_of(p).pid, fd)).collect();
        shared.push(SharedFile { file, holders });
    }
    // A pipe whose ends are all shared had its bytes captured by each process that holds an
    // end: they go with its first shared end, once.
    for s in &mut shared {
        if let FdKind::Pipe { id, buffered, .. } = &mut s.file.kind {
            *buffered = pipe_bytes.remove(id).unwrap_or_default();
        }
    }
    for (i, d) in chosen.iter().enumerate() {
        let flags = shared[i].file.flags;
        for &(p, fd) in d {
            let image = if p == 0 {
                &mut *root
            } else {
                &mut *members[p - 1]
            };
            if let Some(f) = image.fds.iter_mut().find(|f| f.fd == fd) {
                f.kind = FdKind::Shared(i as u32);
                f.flags = flags;
            }
        }
    }
    // A pipe end a process still holds privately would carry bytes another process's entry
    // also carries: every end of such a pipe is shared above, so none is left.
    root.shared_files = shared;
    // A connection read from a descriptor that is now a shared description is not carried
    // (a restore makes shared descriptions without their connections: reset, as before).
    let mut dropped = crate::tcp::keep_carried(&root.fds, &mut root.tcp);
    for m in members.iter_mut() {
        dropped += crate::tcp::keep_carried(&m.fds, &mut m.tcp);
    }
    Ok(dropped)
}

/// Refuses a group or session that phase 1 cannot recreate: a process leads its session (and
/// then its group), or shares its parent's session, and leads its group or shares its
/// parent's. The main process may also keep what the sandbox's init gave it.
pub(crate) fn check_groups(ids: (i32, i32, i32), parent: Option<&ProcessImage>) -> Result<()> {
    check_ids(ids, parent.map(|p| (p.pgid, p.sid)))
}

/// [`check_groups`] with the parent's group and session (`parent`: none for the main process).
pub(crate) fn check_ids(
    (pid, pgid, sid): (i32, i32, i32),
    parent: Option<(i32, i32)>,
) -> Result<()> {
    let refuse = |what: String| {
        Err(CaptureError::Unsupported(format!(
            "process {pid} {what}: {NOT_YET}"
        )))
    };
    if sid == pid && pgid != pid {
        return refuse(format!(
            "leads session {sid} but is in process group {pgid}"
        ));
    }
    let Some((parent_pgid, parent_sid)) = parent else {
        return Ok(());
    };
    if sid != pid && sid != parent_sid {
        return refuse(format!(
            "is in session {sid}, neither its own nor its parent's ({parent_sid})"
        ));
    }
    if pgid != pid && pgid != parent_pgid {
        return refuse(format!(
            "is in process group {pgid}, neither its own nor its parent's ({parent_pgid})"
        ));
    }
    Ok(())
}
