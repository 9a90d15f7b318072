//! Process trees, phase 1 (`docs/PROCESS-TREES.md`): a full checkpoint of a service whose main
//! process has descendants. Every process is stopped top-down (a stopped process cannot fork,
//! so listing a process's children after stopping it gives the final list), captured as a
//! single process is, and laid out as a member of the main process's image
//! ([`crate::image::Member`]: its parent, its slice of the page data, its own image).
//!
//! What phase 1 cannot restore is refused by name: a zombie child, a descriptor shared with
//! another process of the tree (other than a character device or a write-only `O_APPEND` file,
//! the sandbox's stdio, which each process reopens), a pipe or socket whose ends are held by
//! different processes, shared memory in a process other than the main one, and a group or
//! session that is neither the process's own nor its parent's.

use crate::capture::{
    self, CaptureError, CaptureStats, Captured, children_of, estimate_private_bytes, finish_full,
    prefaulted_buffer, proc_err,
};
use crate::image::{Checkpoint, Kind, Member, ProcessImage};
use crate::procfs::Proc;
use crate::ptrace::Stopped;
use crate::sys::Pid;
use std::collections::HashMap;
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
) -> Result<(Checkpoint, CaptureStats)> {
    let mut stats = CaptureStats::default();
    let buf = prefaulted_buffer(estimate_private_bytes(root));
    let t0 = Instant::now();
    // Members: their /proc directory and their parent's index (0: the main process).
    let mut members: Vec<(Proc, usize)> = Vec::new();
    let mut stopped: Vec<Stopped> = Vec::new();
    let captured = stop_all(root, &mut members, &mut stopped).and_then(|()| {
        stats.quiesce = t0.elapsed();
        stats.threads = stopped.iter().map(|s| s.tids.len()).sum();
        let procs: Vec<&Proc> = std::iter::once(root)
            .chain(members.iter().map(|(p, _)| p))
            .collect();
        check_shared(&procs)?;
        let mut out: Vec<Captured> = Vec::with_capacity(procs.len());
        let mut buf = Some(buf);
        for (p, st) in procs.iter().zip(stopped.iter_mut()) {
            let mut s = CaptureStats::default();
            let b = buf.take().unwrap_or_default();
            out.push(capture::capture_stopped(p, st, &mut s, b, true)?);
            stats.memory_copy += s.memory_copy;
        }
        // Inside the pause: the files consistent with the memory.
        out[0].0.private_files = crate::files::DirTracker::new(private_dirs.to_vec())
            .changes()
            .map_err(proc_err(root.pid, "the private directories"))?;
        Ok(out)
    });
    // Children first, so that no parent runs while a child it might signal is still held.
    let mut resumed = Ok(());
    for st in stopped.into_iter().rev() {
        let r = st.resume();
        if resumed.is_ok() {
            resumed = r;
        }
    }
    stats.pause = t0.elapsed();
    let captured = captured?;
    resumed?;

    let mut it = captured.into_iter();
    let (mut image, mut data, files) = it.next().expect("the main process is always captured");
    finish_full(root, &mut image, &mut data, files)?;
    let mut images: Vec<(ProcessImage, Vec<u8>)> = Vec::with_capacity(members.len());
    for ((proc, _), (mut img, mut d, files)) in members.iter().zip(it) {
        finish_full(proc, &mut img, &mut d, files)?;
        images.push((img, d));
    }
    let pids: Vec<i32> = std::iter::once(image.pid)
        .chain(images.iter().map(|(i, _)| i.pid))
        .collect();
    check_groups(&image, None)?;
    for ((img, d), (_, parent)) in images.into_iter().zip(&members) {
        let parent_img = if *parent == 0 {
            &image
        } else {
            &image.tree[*parent - 1].image
        };
        check_groups(&img, Some(parent_img))?;
        if !img.shm.is_empty() {
            return Err(CaptureError::Unsupported(format!(
                "process {} uses shared memory: shared memory outside the main process is {NOT_YET}",
                img.pid
            )));
        }
        let member = Member {
            ppid: pids[*parent],
            data_off: data.len() as u64,
            data_len: d.len() as u64,
            image: img,
        };
        data.extend_from_slice(&d);
        image.tree.push(member);
    }
    stats.saved_bytes = data.len() as u64;
    Ok((
        Checkpoint {
            epoch,
            kind: Kind::Full,
            image,
            data,
        },
        stats,
    ))
}

/// Stops `root`, then every descendant top-down, recording each member with its parent's
/// index. Whatever was stopped is in `stopped` (in the order of `root` then `members`), also
/// on failure, for the caller to resume.
fn stop_all(
    root: &Proc,
    members: &mut Vec<(Proc, usize)>,
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
            let proc = root
                .open_other(c)
                .map_err(proc_err(c, "its /proc directory"))?;
            let state = proc
                .stat_fields()
                .map_err(proc_err(c, "stat"))?
                .get(2)
                .cloned()
                .unwrap_or_default();
            if state == "Z" {
                return Err(CaptureError::Unsupported(format!(
                    "process {c} (host PID) exited and was not reaped yet: zombies are {NOT_YET}"
                )));
            }
            let st = Stopped::stop(&proc)?;
            members.push((proc, i));
            stopped.push(st);
        }
        i += 1;
    }
    Ok(())
}

/// A descriptor as [`check_shared`] compares it.
struct Held {
    proc: usize,
    fd: i32,
    flags: i32,
    mode: u32,
}

/// Refuses descriptors that tie two processes of the tree together (see the module comment).
/// Candidates are grouped by the file they refer to (device and inode, through the
/// descriptor's link); `kcmp(KCMP_FILE)` tells whether two of them are one open file
/// description.
fn check_shared(procs: &[&Proc]) -> Result<()> {
    let mut by_file: HashMap<(u64, u64), Vec<Held>> = HashMap::new();
    for (i, p) in procs.iter().enumerate() {
        let fds = p.list("fd").map_err(proc_err(p.pid, "fd"))?;
        for fd in fds.iter().filter_map(|f| f.parse::<i32>().ok()) {
            // A descriptor closed meanwhile cannot be: every process is stopped.
            let st = p
                .stat(&format!("fd/{fd}"))
                .map_err(proc_err(p.pid, format!("descriptor {fd}")))?;
            let info = p
                .read_string(&format!("fdinfo/{fd}"))
                .map_err(proc_err(p.pid, format!("fdinfo of descriptor {fd}")))?;
            let flags = crate::procfs::status_value(&info, "flags")
                .and_then(|f| i32::from_str_radix(f, 8).ok())
                .unwrap_or(0);
            by_file
                .entry((st.st_dev, st.st_ino))
                .or_default()
                .push(Held {
                    proc: i,
                    fd,
                    flags,
                    mode: st.st_mode,
                });
        }
    }
    let kind = |mode: u32| mode & libc::S_IFMT;
    for holders in by_file.values() {
        if holders.iter().all(|h| h.proc == holders[0].proc)
            || kind(holders[0].mode) == libc::S_IFCHR
        {
            continue;
        }
        for (k, a) in holders.iter().enumerate() {
            for b in holders[k + 1..].iter().filter(|b| b.proc != a.proc) {
                let (pa, pb) = (procs[a.proc].pid, procs[b.proc].pid);
                let same = kcmp_file(pa, pb, a.fd, b.fd);
                let what = if same {
                    let append_only = kind(a.mode) == libc::S_IFREG
                        && a.flags & libc::O_APPEND != 0
                        && a.flags & libc::O_ACCMODE == libc::O_WRONLY;
                    if append_only {
                        continue;
                    }
                    "one open file description"
                } else if matches!(kind(a.mode), libc::S_IFIFO | libc::S_IFSOCK) {
                    "one pipe or socket"
                } else {
                    // Two opens of one file (or two anonymous-inode objects): each process
                    // reopens its own.
                    continue;
                };
                return Err(CaptureError::Unsupported(format!(
                    "descriptor {} of process {pa} and descriptor {} of process {pb} (host PIDs) \
                     are {what}: descriptors shared between processes are {NOT_YET}",
                    a.fd, b.fd
                )));
            }
        }
    }
    Ok(())
}

/// Whether descriptor `fa` of `pa` and `fb` of `pb` are one open file description (an error,
/// say a descriptor closed meanwhile, counts as not).
fn kcmp_file(pa: Pid, pb: Pid, fa: i32, fb: i32) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp only compares kernel objects; no memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pa as libc::c_long,
            pb as libc::c_long,
            KCMP_FILE,
            fa as libc::c_long,
            fb as libc::c_long,
        )
    };
    r == 0
}

/// Refuses a group or session that phase 1 cannot recreate: a process leads its session (and
/// then its group), or shares its parent's session, and leads its group or shares its
/// parent's. The main process may also keep what the sandbox's init gave it.
fn check_groups(img: &ProcessImage, parent: Option<&ProcessImage>) -> Result<()> {
    let refuse = |what: String| {
        Err(CaptureError::Unsupported(format!(
            "process {} {what}: {NOT_YET}",
            img.pid
        )))
    };
    if img.sid == img.pid && img.pgid != img.pid {
        return refuse(format!(
            "leads session {} but is in process group {}",
            img.sid, img.pgid
        ));
    }
    let Some(parent) = parent else {
        return Ok(());
    };
    if img.sid != img.pid && img.sid != parent.sid {
        return refuse(format!(
            "is in session {}, neither its own nor its parent's ({})",
            img.sid, parent.sid
        ));
    }
    if img.pgid != img.pid && img.pgid != parent.pgid {
        return refuse(format!(
            "is in process group {}, neither its own nor its parent's ({})",
            img.pgid, parent.pgid
        ));
    }
    Ok(())
}
