//! A process tree's other processes: noticing that the tree changed, looking at it again
//! (`retree`: members that appeared are captured whole, those that exited dropped), stopping
//! them, and capturing every process in one pause (`capture_tree`).

#[allow(unused_imports)]
use super::*;

impl EpochLoop {
    /// Whether the process tree may differ from the loop's list of processes, so that the
    /// pause must look at it again ([`EpochLoop::retree`]): a member exited, a process ran
    /// `execve`, a member's whole capture went into no checkpoint, or there are zombies (one
    /// reaped changes no call count). A process that appeared is found by the capture's child
    /// check (`CaptureError::TreeChanged`), which the caller answers with `retree` too.
    /// (A member that exited is reported by `stop_members`, which the caller ran first.)
    pub(super) fn tree_suspect(&self) -> bool {
        self.relook
            || !self.zombies.is_empty()
            || self.replaced()
            || self
                .members
                .iter()
                .any(|m| m.fresh.is_some() || m.lp.replaced())
    }

    /// Whether the process ran `execve` since this loop's first pause
    /// ([`crate::track::mm_gone`]). Asked of the kernel only when a layout call (`execve` is
    /// one) was counted since the last capture, or calls are not counted.
    pub(super) fn replaced(&self) -> bool {
        let calls = self
            .cache
            .calls
            .as_ref()
            .map(|c| c.count(crate::syscount::LAYOUT));
        if calls.is_some() && calls == self.layout_seen {
            return false;
        }
        self.mm_probe.as_ref().is_some_and(crate::track::mm_gone)
    }

    /// Brings the list of processes up to date with the tree as it is now, inside the pause
    /// (step 2 of `docs/PROCESS-TREES.md`). `st` is the main process, stopped; `msts` the
    /// other processes the loop knew and could stop (a member that exited was not); on return
    /// (also on failure), `msts` holds every stopped process other than the main one, parents
    /// first, in the order of the new [`EpochLoop::members`] on success, for the caller to
    /// capture and resume.
    ///
    /// The tree is walked from the main process, parents first (each process is stopped before
    /// its children are listed, so the list is final): a member found again keeps its loop; a
    /// process that appeared is stopped and captured whole (its first pause: trackers armed,
    /// [`TreeMember::fresh`]); so is a member that ran `execve` (its address space, and the
    /// tracking that was armed in it, are gone) or whose last whole capture went into no
    /// checkpoint (its tracking is removed first). A member not found exited (it is left out;
    /// unreaped, it is a zombie of its parent, [`EpochLoop::zombies`]). Each process's known
    /// children become the ones found (the capture's child check compares with them).
    ///
    /// With the mprotect tracker, a process that appeared inherited the agent of the process
    /// that forked it: it is taken over ([`MprotectTracker::adopt`]), not loaded again.
    ///
    /// Refused, ending the chain: the main process running `execve`; a member that left the
    /// tree alive (its parent exited: it was reparented outside the service); with the
    /// mprotect tracker, a process that ran `execve` (the agent fails `execve` with EPERM:
    /// the new program would keep the filter without the agent). A failure that may pass (a process that could not be
    /// read or stopped) leaves the members the walk kept and fails this epoch only: the next
    /// pause walks the tree again.
    pub(super) fn retree(&mut self, st: &Stopped, msts: &mut Vec<Stopped>) -> Result<()> {
        /// A process of the new list: a member the loop knew, or one to capture whole.
        enum Slot {
            Known(Box<TreeMember>),
            New(Proc),
        }
        fn slot_proc(s: &Slot) -> &Proc {
            match s {
                Slot::Known(m) => &m.lp.proc,
                Slot::New(p) => p,
            }
        }
        /// After a failure: every stop back to the caller, every member kept back in the loop.
        fn give_back(
            slots: Vec<(Slot, Stopped, usize)>,
            members: &mut Vec<TreeMember>,
            msts: &mut Vec<Stopped>,
        ) {
            for (slot, s, _) in slots {
                msts.push(s);
                if let Slot::Known(m) = slot {
                    members.push(*m);
                }
            }
        }
        if self.replaced() {
            return Err(self.break_chain(format!(
                "the main process (host PID {}) ran execve: the epoch loop follows execve in \
                 the other processes of a tree only",
                self.proc.pid
            )));
        }
        let mprotect = matches!(self.cfg.tracker, TrackerKind::Mprotect);
        let mut stopped: HashMap<Pid, Stopped> = msts.drain(..).map(|s| (s.pid, s)).collect();
        let mut old: HashMap<Pid, TreeMember> = std::mem::take(&mut self.members)
            .into_iter()
            .map(|m| (m.lp.proc.pid, m))
            .collect();
        // Parents first: (process, its stop, its parent's index: 0 the main process, i the
        // slot i - 1).
        let mut slots: Vec<(Slot, Stopped, usize)> = Vec::new();
        // Each process's children (host PIDs, sorted, zombies included), by index.
        let mut kids_of: Vec<Vec<Pid>> = Vec::new();
        let mut zombies: Vec<(Zombie, usize)> = Vec::new();
        let mut i = 0;
        let walked: std::result::Result<(), CaptureError> = loop {
            if i > slots.len() {
                break Ok(());
            }
            let kids = if i == 0 {
                capture::children_of(&self.proc, &st.tids)
            } else {
                let (slot, s, _) = &slots[i - 1];
                capture::children_of(slot_proc(slot), &s.tids)
            };
            let mut sorted = kids.clone();
            sorted.sort_unstable();
            kids_of.push(sorted);
            let step = || -> std::result::Result<(), CaptureError> {
                for c in kids {
                    if let (Some(m), Some(s)) = (old.get(&c), stopped.get(&c))
                        && !s.tids.is_empty()
                        && !exited(&m.lp.pidfd)
                    {
                        let (m, s) = (old.remove(&c), stopped.remove(&c));
                        if let (Some(m), Some(s)) = (m, s) {
                            slots.push((Slot::Known(Box::new(m)), s, i));
                        }
                        continue;
                    }
                    // A member that exited (not stopped) or a process that appeared.
                    old.remove(&c);
                    if let Some(s) = stopped.remove(&c) {
                        drop(s);
                    }
                    let Ok((proc, dead)) = crate::tree::open_child(&self.proc, c) else {
                        return Err(CaptureError::Exiting(c));
                    };
                    if dead {
                        zombies.push((crate::tree::zombie(&proc)?, i));
                        continue;
                    }
                    match Stopped::stop(&proc) {
                        Ok(s) if !s.tids.is_empty() => slots.push((Slot::New(proc), s, i)),
                        // It exited meanwhile: a zombie now (its parent is stopped), or on
                        // its way there (the pause is tried again).
                        _ => match crate::tree::open_child(&self.proc, c) {
                            Ok((p, true)) => zombies.push((crate::tree::zombie(&p)?, i)),
                            _ => return Err(CaptureError::Exiting(c)),
                        },
                    }
                }
                Ok(())
            };
            if let Err(e) = step() {
                break Err(e);
            }
            i += 1;
        };
        // After a whole walk, members not found exited (and were reaped), or live outside the
        // tree. (A walk cut short keeps those it did not reach, for the next one.)
        let ok = walked.and_then(|()| {
            let mut left = None;
            for (pid, m) in old.drain() {
                if !exited(&m.lp.pidfd) {
                    left = Some((m.pid, pid));
                }
            }
            match left {
                Some((pid, host)) => Err(CaptureError::TreeChanged(format!(
                    "process {pid} (host PID {host}) left the tree alive (its parent exited \
                     and it was reparented outside the service)"
                ))),
                None => Ok(()),
            }
        });
        if let Err(e) = ok {
            msts.extend(stopped.into_values());
            self.members.extend(old.into_values());
            give_back(slots, &mut self.members, msts);
            return Err(match e {
                CaptureError::TreeChanged(why) => self.break_chain(why),
                e => e.into(),
            });
        }
        msts.extend(stopped.into_values()); // none left: each was found or dropped
        // Members that ran `execve`, or whose whole capture is stale, are captured whole again.
        let mut failed = None;
        for (slot, _, _) in &mut slots {
            let Slot::Known(m) = slot else { continue };
            let replaced = m.lp.replaced();
            if !replaced && m.fresh.is_none() {
                continue;
            }
            if replaced && mprotect {
                // Not reached in practice: the agent's filter traps `execve` and the agent
                // fails it with EPERM. Were it let through, the new program would keep the
                // filter (it survives `execve`) without the agent or its SIGSYS handler (reset
                // to the default, which kills), and die at its first trapped call.
                let why = format!(
                    "process {} (host PID {}) ran execve: with the mprotect tracker a new \
                     program cannot be tracked (it keeps the agent's seccomp filter, which \
                     `execve` does not remove, but not the agent, so the agent fails `execve` \
                     with EPERM)",
                    m.pid, m.lp.proc.pid
                );
                failed = Some(self.break_chain(why));
                break;
            }
            if !replaced {
                // Its tracking goes (the process is stopped: the userfaultfd tracker's
                // release only unregisters its ranges) and is armed again by the new capture.
                let armed = std::mem::take(&mut m.lp.armed);
                m.lp.tracker.release(&m.lp.proc, &armed);
            }
            match m.lp.proc.try_clone() {
                Ok(proc) => *slot = Slot::New(proc),
                Err(e) => {
                    failed = Some(gone_or(m.lp.proc.pid, e));
                    break;
                }
            }
        }
        if let Some(e) = failed {
            give_back(slots, &mut self.members, msts);
            return Err(e);
        }
        // Capture every new process whole; keep the others' loops. Each stop goes to `msts`
        // in the order of the members.
        let member_cfg = self.cfg.for_member();
        let mut members: Vec<TreeMember> = Vec::with_capacity(slots.len());
        let mut ns_pids = vec![self.ns_pid];
        let mut ids: Vec<Option<(i32, i32)>> = vec![capture::group_and_session(&self.proc).ok()];
        self.root_ids = ids[0];
        let mut failed = None;
        for (k, (slot, mut s, parent)) in slots.into_iter().enumerate() {
            let ppid = ns_pids[parent];
            let kids = kids_of[k + 1].clone();
            let member = match slot {
                Slot::Known(mut m) => {
                    m.ppid = ppid;
                    m.lp.cache.children = Some(kids);
                    Ok(*m)
                }
                // After a failure, the processes still to capture are left for the next pause.
                Slot::New(_) if failed.is_some() => Err(None),
                Slot::New(proc) => self
                    .first_member(proc, &mut s, &member_cfg, kids, ppid, ids[parent])
                    .map_err(Some),
            };
            msts.push(s);
            match member {
                Ok(m) => {
                    ns_pids.push(m.pid);
                    ids.push(match &m.fresh {
                        Some(f) => Some((f.image.pgid, f.image.sid)),
                        None => capture::group_and_session(&m.lp.proc).ok(),
                    });
                    members.push(m);
                }
                Err(e) => {
                    failed = failed.or(e);
                    ns_pids.push(0);
                    ids.push(None);
                }
            }
        }
        self.cache.children = Some(kids_of[0].clone());
        self.members = members;
        self.shared_groups = None;
        if let Some(e) = failed {
            // The next pause walks the tree again (the processes not captured are new then).
            return Err(e);
        }
        let mut out = Vec::with_capacity(zombies.len());
        for (mut z, parent) in zombies {
            z.ppid = ns_pids[parent];
            crate::tree::check_ids((z.pid, z.pgid, z.sid), ids[parent])?;
            out.push(z);
        }
        self.zombies = out;
        Ok(())
    }

    /// The first pause of a process that appeared in the tree (or must be captured whole
    /// again): arms its tracking (the mprotect tracker takes over the agent the process
    /// inherited, [`MprotectTracker::adopt`]) and captures it whole ([`first_capture`]); its
    /// group and
    /// session must be its own or its parent's (`parent_ids`, unknown: refused).
    pub(super) fn first_member(
        &self,
        proc: Proc,
        st: &mut Stopped,
        cfg: &EpochConfig,
        children: Vec<Pid>,
        ppid: i32,
        parent_ids: Option<(i32, i32)>,
    ) -> Result<TreeMember> {
        let prep = FirstPrep::new(&proc, true)?;
        let inherited = matches!(cfg.tracker, TrackerKind::Mprotect);
        let mut first = first_capture(&proc, st, cfg, prep, true, children, false, inherited)?;
        let (pgid, sid) = capture::group_and_session(&proc)?;
        let img = &mut first.img.image;
        (img.pgid, img.sid) = (pgid, sid);
        let pid = img.pid;
        let Some(parent_ids) = parent_ids else {
            return Err(CaptureError::Unsupported(format!(
                "the group and session of the parent of process {pid} cannot be read"
            ))
            .into());
        };
        crate::tree::check_ids((pid, pgid, sid), Some(parent_ids))?;
        let pidfd = crate::sys::pidfd_open(proc.pid).map_err(|e| gone_or(proc.pid, e))?;
        let lp = EpochLoop::from_first(
            proc,
            pid,
            first.lp,
            cfg.clone(),
            None,
            Trigger::default(),
            pidfd,
            self.epoch,
        )?;
        Ok(TreeMember {
            pid,
            ppid,
            lp,
            fresh: Some(first.img),
        })
    }

    /// Stops every other process of a tree (parents first) into `sts`; whatever was stopped
    /// is there on failure too, for the caller to resume. A member that exited (or whose
    /// threads are all gone) is not stopped: returns whether there was one (the caller then
    /// looks at the tree again, [`EpochLoop::retree`]).
    pub(super) fn stop_members(&self, sts: &mut Vec<Stopped>) -> Result<bool> {
        let mut gone = false;
        for m in &self.members {
            match Stopped::stop(&m.lp.proc) {
                Ok(st) if !st.tids.is_empty() => sts.push(st),
                Ok(_) => gone = true,
                Err(_) if exited(&m.lp.pidfd) => gone = true,
                Err(e) => return Err(CaptureError::from(e).into()),
            }
        }
        Ok(gone)
    }

    /// The part inside the pause for every process (see [`EpochLoop::capture`]), each into its
    /// own journal; for a tree, also the descriptions its processes share.
    pub(super) fn capture_tree(
        &mut self,
        st: &mut Stopped,
        msts: &mut [Stopped],
        fullbuf: &mut Option<Vec<u8>>,
        fullbufs: &mut [Option<Vec<u8>>],
        j: &mut Carry,
        js: &mut [Carry],
    ) -> Result<TreeCaptured> {
        let alone = self.members.is_empty();
        let main = self.capture(st, fullbuf, j, alone)?;
        let mut out = TreeCaptured {
            main,
            members: Vec::new(),
            groups: Vec::new(),
            ids: Vec::new(),
        };
        if alone {
            return Ok(out);
        }
        for (((m, st), buf), j) in self.members.iter_mut().zip(msts).zip(fullbufs).zip(js) {
            // A process captured whole in this pause (`retree`) has nothing more to give.
            if m.fresh.is_some() {
                out.members.push(None);
                continue;
            }
            out.members.push(Some(m.lp.capture(st, buf, j, false)?));
        }
        // The tree's shared memory objects, each once whichever processes map it, by the main
        // process's tracker over every process's layout (each capture left its own in
        // `prev_maps`); listed again when any process's layout was read again. Their pages
        // that changed go into the main process's data (members' mappings name them).
        let relist = std::iter::once(Some(&out.main))
            .chain(out.members.iter().map(Option::as_ref))
            .any(|c| c.is_none_or(|c| !c.parts.layout_carried));
        let each: Vec<(&Proc, &[MapEntry])> =
            std::iter::once((&self.proc, self.prev_maps.as_slice()))
                .chain(
                    self.members
                        .iter()
                        .map(|m| (&m.lp.proc, m.lp.prev_maps.as_slice())),
                )
                .collect();
        // The private directories, with the files any process maps shared read by content.
        let tw = Instant::now();
        let mapped: Vec<MapEntry> = each
            .iter()
            .flat_map(|(_, maps)| maps.iter())
            .filter(|m| m.shared)
            .cloned()
            .collect();
        out.main.meta.private_files = self
            .dirs
            .changes_mapped(&mapped)
            .map_err(EpochError::Files)?;
        out.main.parts.walk = tw.elapsed();
        j.walked = true;
        let mut shm_data = Vec::new();
        let objects = self.shm.capture_of(&each, relist, false, &mut shm_data)?;
        j.shm = true;
        out.main.shm = (objects, shm_data);
        // A full checkpoint of the same pause lists them whole (in the main process's data).
        if let Some(f) = &mut out.main.full {
            f.shm = crate::shm::ShmTracker::default().capture_of(&each, true, true, &mut f.data)?;
        }
        drop(each);
        let procs: Vec<&Proc> = std::iter::once(&self.proc)
            .chain(self.members.iter().map(|m| &m.lp.proc))
            .collect();
        // Which descriptions the processes share changes only with a descriptor call (open,
        // close, dup, socket calls, recvmsg, ...: `syscount::DESCRIPTORS`) or a process that
        // appears or exits (which ends the chain): while no process made one since the last
        // lookup (each reused its descriptor table), the last lookup holds. A full checkpoint
        // looks them up again.
        let unchanged = out.main.full.is_none()
            && std::iter::once(Some(&out.main))
                .chain(out.members.iter().map(Option::as_ref))
                .all(|c| c.is_some_and(|c| c.parts.meta.fds_reused));
        out.groups = match (&self.shared_groups, unchanged) {
            (Some(g), true) => g.clone(),
            _ => {
                let g = crate::tree::find_shared(&procs)?;
                self.shared_groups = Some(g.clone());
                g
            }
        };
        // A full checkpoint records every process's group and session (the restore recreates
        // them); incremental ones keep the full's.
        if out.main.full.is_some() {
            for p in procs {
                out.ids.push(capture::group_and_session(p)?);
            }
        }
        Ok(out)
    }
}
