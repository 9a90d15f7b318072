//! After the restorer ran: its report awaited, the blob unmapped, the process resumed (or held
//! stopped, for verification).

#[allow(unused_imports)]
use super::*;

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
pub(super) fn host_pid(root: Pid, ns_pid: i32, timeout: Duration) -> Result<Pid> {
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
pub(super) fn finish_one(prep: Prepared, pid: Pid, timeout: Duration) -> Result<FinishStats> {
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
pub(super) fn proc_state(pid: Pid) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.trim_start().to_owned())
}

/// Reads the restorer's report: (blob start, blob size), or its failure.
pub(super) fn wait_report(prep: Prepared, pid: Pid, timeout: Duration) -> Result<(u64, u64)> {
    // Close our copies of the inherited descriptors so a dead restorer means EOF.
    drop(prep._keep);
    let mut r = std::fs::File::from(prep.notify_r);
    let mut rec = [0u8; 24];
    let deadline = Instant::now() + timeout;
    let mut got = 0;
    loop {
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
        if w(0) == NOTE {
            // Something the child gave up on without failing (a connection reset): logged and
            // counted here, then the next record.
            let mut msg = vec![0u8; w(2).min(4096) as usize];
            r.read_exact(&mut msg)?;
            let msg = String::from_utf8_lossy(&msg);
            tracing::warn!(pid, "restore: {msg}");
            crate::tcp::count_reset_at_restore();
            got = 0;
            continue;
        }
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
        return Ok((w(0), w(1)));
    }
}

pub(super) fn step_name(step: u64) -> &'static str {
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
pub(super) fn unmap_blob(
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
