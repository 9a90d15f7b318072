//! The restore plan ([`build_plan`]): from a checkpoint and its prepared pages, everything the
//! freestanding restorer does, in order, as the flat data it reads.

#[allow(unused_imports)]
use super::*;

pub(super) fn cat<T: Copy>(v: &[T]) -> Vec<u8> {
    v.iter().flat_map(|x| as_bytes(x).to_vec()).collect()
}

/// Registers as the restored thread must see them: an interrupted system call is set up to be
/// issued again (as the kernel does after a signal without handler), and one that cannot be
/// restarted transparently returns EINTR.
pub(super) fn apply_restart(mut r: Regs) -> Regs {
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
pub(super) fn build_plan(
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
            regs: apply_restart(crate::ptrace::regs_from_slice(&t.regs)),
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
