//! The process as a whole: its children and group, what is refused, signal actions, limits.

#[allow(unused_imports)]
use super::*;

/// Why a process with children is refused where trees are not captured (the epoch loop).
pub(super) const CHILDREN_REFUSED: &str = "process trees (fork) are not supported yet";

/// The host PIDs of the children of `proc`'s threads `tids`, in the order the kernel lists them.
pub(crate) fn children_of(proc: &Proc, tids: &[Pid]) -> Vec<Pid> {
    let mut children = Vec::new();
    for t in tids {
        let c = proc
            .read_string(&format!("task/{t}/children"))
            .unwrap_or_default();
        children.extend(c.split_whitespace().filter_map(|p| p.parse::<Pid>().ok()));
    }
    children
}

/// The process group and session of `proc` in the sandbox's PID namespace (the last number of
/// `NSpgid` and `NSsid`; 0 when the group or session lies outside it).
pub(crate) fn group_and_session(proc: &Proc) -> Result<(i32, i32)> {
    let status = proc
        .read_string("status")
        .map_err(proc_err(proc.pid, "status"))?;
    let last = |key| procfs::status_ns_last(&status, key).unwrap_or(0);
    Ok((last("NSpgid"), last("NSsid")))
}

/// Process-level state this checkpointer cannot restore yet: refuse it by name rather than
/// produce a checkpoint that restores into something different. `known`: the children the
/// epoch loop's chain began with (see [`MetaCache::children`]).
pub(super) fn check_supported(proc: &Proc, tids: &[Pid], known: Option<&[Pid]>) -> Result<()> {
    let mut now = children_of(proc, tids);
    if let Some(known) = known {
        now.sort_unstable();
        if now != known {
            return Err(CaptureError::ChildrenChanged(format!(
                "process {} (host PID) has children {now:?}, the loop knew {known:?}",
                proc.pid
            )));
        }
        return Ok(());
    }
    let children: Vec<String> = now.iter().map(|c| c.to_string()).collect();
    if !children.is_empty() {
        return Err(CaptureError::Unsupported(format!(
            "the service has child processes (host PIDs {}); {CHILDREN_REFUSED}",
            children.join(", ")
        )));
    }
    // Seccomp filters (crate::seccomp), POSIX timers (crate::timers) and inotify
    // (crate::inotify) are captured; what of them is not is refused there, by name.
    Ok(())
}

pub(super) fn capture_sigactions(
    st: &mut Stopped,
    maps: &[MapEntry],
    tid: Pid,
    (ign, cgt): (u64, u64),
) -> Result<Vec<SigAction>> {
    let interesting = ign | cgt;
    let mut out = Vec::new();
    for signo in 1..=64u32 {
        if interesting & (1 << (signo - 1)) == 0 || signo == 9 || signo == 19 {
            continue;
        }
        let buf = inject_ok(
            st,
            maps,
            tid,
            "rt_sigaction",
            libc::SYS_rt_sigaction,
            [signo as u64, 0, SCRATCH, 8, 0, 0],
            32,
        )?;
        let w = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap());
        out.push(SigAction {
            signo,
            handler: w(0),
            flags: w(1),
            restorer: w(2),
            mask: w(3),
        });
    }
    Ok(out)
}

pub(super) fn capture_rlimits(pid: Pid) -> Vec<(u32, u64, u64)> {
    let mut v = Vec::new();
    for res in 0..16u32 {
        let mut lim = libc::rlimit64 {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: prlimit64 with a NULL new limit only writes `lim`.
        let r = unsafe { libc::prlimit64(pid, res as _, std::ptr::null(), &mut lim) };
        if r == 0 {
            v.push((res, lim.rlim_cur, lim.rlim_max));
        }
    }
    v
}

/// Mappings, saved runs, their contents, and the mapped files to identify after the pause.
pub(super) type CapturedMemory = (Vec<Vma>, Vec<PageRun>, Vec<u8>, Vec<PendingFile>);
