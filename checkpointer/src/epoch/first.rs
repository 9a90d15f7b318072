//! The first pause: the tree adopted as it is when stopped, each process prepared and captured
//! whole (the chain's full checkpoint), tracking armed.

#[allow(unused_imports)]
use super::*;

/// What the first pause needs of a process, made before it (loading the call counter takes a
/// while).
pub(super) struct FirstPrep {
    pub(super) pagemap: std::fs::File,
    /// The same file (it pins the same address space), kept by the loop for
    /// [`crate::track::mm_gone`].
    pub(super) probe: Option<std::fs::File>,
    pub(super) buf: Vec<u8>,
    pub(super) fd_calls: Option<crate::syscount::SyscallCounter>,
}

impl FirstPrep {
    pub(super) fn new(proc: &Proc, copy: bool) -> std::result::Result<FirstPrep, CaptureError> {
        let pid = proc.pid;
        let pagemap = proc
            .open_file("pagemap", libc::O_RDONLY)
            .map_err(proc_err(pid, "pagemap"))?;
        // As for a one-shot full checkpoint: fault the copy buffer in before the pause.
        let buf = if copy {
            capture::prefaulted_buffer(capture::estimate_private_bytes(proc))
        } else {
            Vec::new()
        };
        // Before the pause (loading the program takes a while): without it, every pause
        // reads every descriptor.
        let fd_calls = crate::syscount::SyscallCounter::new(pid, &crate::syscount::CHANGE_GROUPS)
            .inspect_err(|e| tracing::debug!("descriptors read every pause: {e}"))
            .ok();
        Ok(FirstPrep {
            probe: pagemap.try_clone().ok(),
            pagemap,
            buf,
            fd_calls,
        })
    }
}

/// A process listed before the first pause, with what was prepared for it then (`pidfd`: a
/// member's, `None` for the main process).
pub(super) struct Listed {
    pub(super) proc: Proc,
    pub(super) prep: FirstPrep,
    pub(super) pidfd: Option<OwnedFd>,
}

/// The processes, parents' indexes, preparations and members' pidfds of a tree as
/// [`crate::tree::stop_all`] found it: the first pause's tree.
pub(super) type Adopted = (Vec<Proc>, Vec<usize>, Vec<FirstPrep>, Vec<OwnedFd>);

/// The first pause's tree: the one `stop_all` stopped (`found`: the members, each with its
/// parent's index; the main process is `listed[0]`), which differs from the one listed before
/// the stop when a process forked or exited in between. Starting over until a listing and a
/// stop agree need not end while a service forks a process per connection (PostgreSQL under
/// short connections: a backend every few milliseconds); adopting what was stopped always does.
///
/// A listed process that is still there keeps what was prepared for it: it is the same process
/// when its pidfd (opened at the listing) has not reported an exit, since a PID is not reused
/// before its process exits. One that appeared (or whose PID now names another process) is
/// prepared now, while it is stopped, as a process that appears between two later pauses is
/// ([`EpochLoop::first_member`]). Listed processes that exited are dropped.
pub(super) fn adopt_stopped(
    listed: Vec<Listed>,
    found: Vec<(Proc, usize)>,
    copy: bool,
) -> std::result::Result<Adopted, CaptureError> {
    let mut listed = listed.into_iter();
    let root = listed.next().expect("the main process is always listed");
    let mut old: HashMap<Pid, Listed> = listed
        .filter(|l| l.pidfd.as_ref().is_some_and(|fd| !exited(fd)))
        .map(|l| (l.proc.pid, l))
        .collect();
    let n = found.len() + 1;
    let (mut procs, mut parents, mut preps, mut fds) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n - 1),
    );
    procs.push(root.proc);
    parents.push(0);
    preps.push(root.prep);
    for (p, parent) in found {
        let (prep, fd) = match old.remove(&p.pid) {
            Some(l) => (l.prep, l.pidfd.expect("a member's pidfd")),
            None => {
                let prep = FirstPrep::new(&p, copy)?;
                let fd = crate::sys::pidfd_open(p.pid).map_err(|source| CaptureError::Proc {
                    pid: p.pid,
                    what: "pidfd".into(),
                    source,
                })?;
                (prep, fd)
            }
        };
        procs.push(p);
        parents.push(parent);
        preps.push(prep);
        fds.push(fd);
    }
    Ok((procs, parents, preps, fds))
}

/// What the first pause captured of one process: its tracking state and its image.
pub(super) struct First {
    pub(super) lp: FirstLoop,
    pub(super) img: FreshImage,
}

/// The tracking state a process's first pause leaves (see [`EpochLoop::from_first`]).
pub(super) struct FirstLoop {
    pub(super) tracker: Box<dyn Tracker>,
    pub(super) cache: MetaCache,
    pub(super) maps: Vec<MapEntry>,
    pub(super) armed: Vec<(u64, u64)>,
    pub(super) dirs: DirTracker,
    pub(super) shm: crate::shm::ShmTracker,
    pub(super) probe: Option<std::fs::File>,
}

/// The first pause's work on one stopped process: arms tracking and, with `copy`, captures its
/// memory. `children`: its children (host PIDs, sorted), which the chain begins with.
/// `own_shm`: a single process, which captures its shared memory objects itself (those of a
/// tree are captured once for all its processes, by the caller: see [`EpochLoop::start`]).
/// `inherited`: a process that appeared in the tree (or is captured whole again), which
/// carries the mprotect tracker's agent already ([`MprotectTracker::adopt`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn first_capture(
    proc: &Proc,
    st: &mut Stopped,
    cfg: &EpochConfig,
    prep: FirstPrep,
    copy: bool,
    children: Vec<Pid>,
    own_shm: bool,
    inherited: bool,
) -> Result<First> {
    let pid = proc.pid;
    let FirstPrep {
        pagemap,
        probe,
        buf,
        fd_calls,
    } = prep;
    let maps = proc.smaps().map_err(proc_err(pid, "smaps"))?;
    let mut cache = MetaCache::default();
    cache.calls = fd_calls;
    cache.children = Some(children);
    let (mut tracker, maps): (Box<dyn Tracker>, _) = match cfg.tracker {
        TrackerKind::Uffd => (Box::new(UffdTracker::new(st, &maps, pagemap)?), maps),
        TrackerKind::Mprotect => {
            let mut t = if inherited {
                MprotectTracker::adopt(st, proc, &maps, pagemap)?
            } else {
                MprotectTracker::new(st, proc, &maps, pagemap)?
            };
            cache.own_filter = true;
            t.begin(st)?;
            // The agent's own mappings are new.
            let maps = t.layout(proc.smaps().map_err(proc_err(pid, "smaps"))?);
            (Box::new(t), maps)
        }
    };
    let mut meta = capture::capture_meta(proc, st, &maps, &mut cache, capture::Refresh::ALL)?;
    tracker.threads(&meta.threads, &maps);
    tracker.patch_image(&mut meta);
    let mut exe = capture::PendingFile::exe(&meta.exe.path);
    exe.open(proc)?;
    // The memory first: arming may split the kernel's mappings the capture names files by.
    // (The agent pages the commit writes are in the first incremental checkpoint.)
    let mut dirs = DirTracker::new(cfg.private_dirs.clone());
    let mut shm = crate::shm::ShmTracker::default();
    let ((mut image, mut data), files) = if copy {
        capture::full_memory(proc, &maps, meta, buf, own_shm.then_some(&mut shm))?
    } else {
        // Nothing copied; the objects' pages are known from here on all the same.
        if own_shm {
            shm.capture(proc, &maps, true, true, &mut Vec::new())?;
        }
        ((meta, Vec::new()), Vec::new())
    };
    // Walked either way: the tracker reports changes from this state on.
    let tree = dirs.changes_mapped(&maps).map_err(EpochError::Files)?;
    if copy {
        image.private_files = tree;
    }
    let mut armed = Vec::new();
    for m in maps.iter().filter(|m| trackable(m)) {
        tracker.arm(m.start, m.end)?;
        armed.push((m.start, m.end));
    }
    let touched = tracker.commit(st, &armed, &maps)?;
    if copy {
        // The mprotect tracker's commit writes its agent's control block, after the copy above:
        // those pages are copied again, so that the image is the memory the process resumes
        // with (the next checkpoint would carry them anyway, but a fresh member's image held at
        // this very pause would differ from the live process).
        for a in touched {
            let at = match image
                .runs
                .iter()
                .find(|r| r.addr <= a && a < r.addr + r.len)
            {
                Some(r) => (r.data_off + (a - r.addr)) as usize,
                None => {
                    image.runs.push(crate::image::PageRun {
                        addr: a,
                        len: PAGE,
                        data_off: data.len() as u64,
                    });
                    data.resize(data.len() + PAGE as usize, 0);
                    data.len() - PAGE as usize
                }
            };
            crate::sys::read_remote(pid, a, &mut data[at..at + PAGE as usize])
                .map_err(|e| gone_or(pid, e))?;
        }
    }
    Ok(First {
        lp: FirstLoop {
            tracker,
            cache,
            maps,
            armed,
            dirs,
            shm,
            probe,
        },
        img: FreshImage {
            image,
            data,
            files,
            exe: Some(exe),
        },
    })
}

impl EpochLoop {
    /// The first pause: arms tracking and, with `copy`, captures the full checkpoint 0 (without,
    /// the returned checkpoint has the metadata only, no memory: see [`Epochs::start_tracking`]).
    ///
    /// A process tree (`docs/PROCESS-TREES.md`) is listed before the pause (each process is
    /// prepared as the main one is) and again once stopped, top-down; the tree stopped is the
    /// one captured, a process that appeared in between prepared while stopped
    /// ([`adopt_stopped`]). Every process is captured in this one pause;
    /// the checkpoint lists the others as members of the main process's image, with the open
    /// file descriptions they share.
    pub(super) fn start(
        root: &Proc,
        cfg: EpochConfig,
        hooks: EpochHooks,
        trigger: Trigger,
        copy: bool,
    ) -> Result<(EpochLoop, EpochOutput)> {
        let pid = root.pid;
        let pidfd = crate::sys::pidfd_open(pid).map_err(|e| gone_or(pid, e))?;
        let gone = |e: EpochError| {
            if exited(&pidfd) {
                EpochError::ServiceGone(e.to_string())
            } else {
                e
            }
        };
        let member_cfg = cfg.for_member();
        let mut hook = hooks.on_pause;
        let mut attempt = 0u32;
        let (sts, mut r, t0, quiesce, procs, parents, zombies, member_fds) = loop {
            // A process of the tree that exits while it is being stopped (a PostgreSQL backend
            // whose client left) makes its /proc unreadable: list the tree again. (The listing
            // leaves out what exits meanwhile.)
            let vanished = |e: &CaptureError| match e {
                CaptureError::Proc { pid: p, .. } => *p != pid,
                CaptureError::Ptrace(_) => !exited(&pidfd),
                _ => false,
            };
            let members_now = crate::tree::list_members(root).map_err(|e| gone(e.into()))?;
            let procs = std::iter::once(root.try_clone().map_err(|e| gone_or(pid, e))?)
                .chain(members_now.into_iter().map(|(p, _)| p));
            // What is prepared before the stop, per listed process: its preparation and (a
            // member's) pidfd. The members' pidfds are opened before the stop, while they are
            // alive: a member may exit as soon as the first pause resumes it (a PostgreSQL
            // backend whose client's query ended), and a pidfd opened after that fails with
            // ESRCH, which is not the service's death. One opened now outlives the process, and
            // the loop learns of the exit from it. A member that exits before it is prepared is
            // left out: the stop finds the tree as it is ([`adopt_stopped`]).
            let mut listed: Vec<Listed> = Vec::new();
            for p in procs {
                let is_root = p.pid == pid;
                let prep = FirstPrep::new(&p, copy).and_then(|prep| {
                    let fd = if is_root {
                        None
                    } else {
                        Some(crate::sys::pidfd_open(p.pid).map_err(|source| {
                            CaptureError::Proc {
                                pid: p.pid,
                                what: "pidfd".into(),
                                source,
                            }
                        })?)
                    };
                    Ok((prep, fd))
                });
                match prep {
                    Ok((prep, pidfd)) => listed.push(Listed {
                        proc: p,
                        prep,
                        pidfd,
                    }),
                    Err(_) if !is_root => {}
                    Err(e) => return Err(gone(e.into())),
                }
            }
            let t0 = Instant::now();
            let mut sts: Vec<Stopped> = Vec::with_capacity(listed.len());
            let mut found = Vec::new();
            // Zombies (children that exited and were not reaped) are read, not prepared: the
            // listing above skips them.
            let mut zombies = Vec::new();
            let stopped = crate::tree::stop_all(root, &mut found, &mut zombies, &mut sts);
            if let Err(e) = stopped {
                let _ = resume_all(sts);
                if vanished(&e) && attempt < 20 {
                    attempt += 1;
                    continue;
                }
                return Err(gone(e.into()));
            }
            if sts.iter().any(|s| s.tids.is_empty()) {
                let _ = resume_all(sts);
                return Err(EpochError::ServiceGone(format!(
                    "process {pid} (or one of its children) has no threads"
                )));
            }
            // The tree as stopped, each process with what was prepared for it (a process that
            // appeared since the listing is prepared now, stopped).
            let (procs, parents, preps, member_fds) = match adopt_stopped(listed, found, copy) {
                Ok(t) => t,
                Err(e) => {
                    let _ = resume_all(sts);
                    if vanished(&e) && attempt < 20 {
                        attempt += 1;
                        continue;
                    }
                    return Err(gone(e.into()));
                }
            };
            let quiesce = t0.elapsed();
            // Each process's children, zombies included (host PIDs, sorted): what the chain
            // begins with.
            let children = |i: usize| -> Vec<Pid> {
                let mut c: Vec<Pid> = (1..procs.len())
                    .filter(|&j| parents[j] == i)
                    .map(|j| procs[j].pid)
                    .chain(zombies.iter().filter(|z| z.1 == i).map(|z| z.2))
                    .collect();
                c.sort_unstable();
                c
            };
            let r = (|| -> Result<_> {
                let mut firsts = Vec::with_capacity(procs.len());
                let alone = procs.len() == 1;
                for (i, ((p, st), prep)) in procs.iter().zip(sts.iter_mut()).zip(preps).enumerate()
                {
                    let cfg = if i == 0 { &cfg } else { &member_cfg };
                    firsts.push(first_capture(
                        p,
                        st,
                        cfg,
                        prep,
                        copy,
                        children(i),
                        alone,
                        false,
                    )?);
                }
                // A tree's shared memory objects: each once, whichever processes map it, by the
                // main process's tracker, into its image and data (members' mappings name them,
                // as in a full checkpoint of a tree: `crate::tree`).
                if !alone {
                    let mut shm = std::mem::take(&mut firsts[0].lp.shm);
                    let mut data = std::mem::take(&mut firsts[0].img.data);
                    let each: Vec<(&Proc, &[MapEntry])> = procs
                        .iter()
                        .zip(&firsts)
                        .map(|(p, f)| (p, f.lp.maps.as_slice()))
                        .collect();
                    let objects = if copy {
                        shm.capture_of(&each, true, true, &mut data)?
                    } else {
                        shm.capture_of(&each, true, true, &mut Vec::new())?;
                        Vec::new()
                    };
                    drop(each);
                    let f = &mut firsts[0];
                    (f.lp.shm, f.img.data) = (shm, data);
                    f.img.image.shm = objects;
                }
                // A tree: the open file descriptions its processes share, and each process's
                // group and session (the single process keeps what its creator gave it; one
                // with a zombie child is a tree: the zombie's are checked against its own).
                let mut groups = Vec::new();
                if procs.len() > 1 {
                    let refs: Vec<&Proc> = procs.iter().collect();
                    groups = crate::tree::find_shared(&refs)?;
                }
                if procs.len() > 1 || !zombies.is_empty() {
                    for (p, f) in procs.iter().zip(firsts.iter_mut()) {
                        (f.img.image.pgid, f.img.image.sid) = capture::group_and_session(p)?;
                    }
                }
                Ok((firsts, groups))
            })();
            // A signal that kept arriving while the process was read (see
            // `capture::capture_meta`): resume, let it be delivered, and start over. Only with
            // the userfaultfd tracker, which has registered nothing by then (its descriptor is
            // ours alone, closed with it); the mprotect tracker's agent and filter are in the
            // process by then, so that start fails instead.
            if matches!(r, Err(EpochError::Capture(CaptureError::PendingSignals(_))))
                && matches!(cfg.tracker, TrackerKind::Uffd)
                && attempt < 20
            {
                attempt += 1;
                drop(r);
                let _ = resume_all(sts);
                std::thread::sleep(Duration::from_millis(u64::from(attempt)));
                continue;
            }
            break (sts, r, t0, quiesce, procs, parents, zombies, member_fds);
        };
        if let Ok((firsts, _)) = &mut r {
            trigger.clear();
            if let Some(h) = hook.as_mut() {
                h(0);
            }
            // Every process's connections, after the gate's boundary (see `crate::tcp`).
            for (proc, f) in procs.iter().zip(firsts.iter_mut()) {
                let img = &mut f.img.image;
                img.tcp = crate::tcp::Connections::default()
                    .capture(proc.pid, &img.fds)
                    .conns;
            }
        }
        let resumed = resume_all(sts);
        let pause = pause_since(t0, &resumed);
        let (firsts, groups) = r.map_err(gone)?;
        resumed
            .map_err(CaptureError::from)
            .map_err(|e| gone(e.into()))?;

        // After the pause: identify each process's files, then lay the tree out.
        let mut loops: Vec<EpochLoop> = Vec::with_capacity(procs.len());
        let mut images: Vec<(ProcessImage, Vec<u8>)> = Vec::with_capacity(procs.len());
        let mut member_fds = member_fds.into_iter();
        for (i, (proc, First { lp, mut img })) in procs.into_iter().zip(firsts).enumerate() {
            img.identify(&proc).map_err(|e| gone(e.into()))?;
            let lp_pidfd = if i == 0 {
                pidfd.try_clone().map_err(|e| gone_or(pid, e))?
            } else {
                member_fds
                    .next()
                    .expect("one pidfd per member, opened before the first stop")
            };
            let (cfg, hook, trigger) = if i == 0 {
                (cfg.clone(), hook.take(), trigger.clone())
            } else {
                (member_cfg.clone(), None, Trigger::default())
            };
            let ns_pid = img.image.pid;
            loops.push(EpochLoop::from_first(
                proc, ns_pid, lp, cfg, hook, trigger, lp_pidfd, 0,
            )?);
            images.push((img.image, img.data));
        }
        let mut it = images.into_iter();
        let (mut image, mut data) = it.next().expect("the main process is always captured");
        let mut pids = vec![image.pid];
        if it.len() > 0 {
            let mut rest: Vec<(ProcessImage, Vec<u8>)> = it.collect();
            let hosts: Vec<Pid> = loops.iter().map(|l| l.proc.pid).collect();
            let mut refs: Vec<&mut ProcessImage> = rest.iter_mut().map(|(i, _)| i).collect();
            crate::tree::share(&mut image, &mut refs, &hosts, groups)?;
            crate::tree::check_groups((image.pid, image.pgid, image.sid), None)?;
            for (k, ((img, d), parent)) in rest.into_iter().zip(&parents[1..]).enumerate() {
                let parent_img = if *parent == 0 {
                    &image
                } else {
                    &image.tree[*parent - 1].image
                };
                crate::tree::check_groups((img.pid, img.pgid, img.sid), Some(parent_img))?;
                loops[k + 1].meta_carry = tardi_image::store::MetaCarry::after(&img);
                image.tree.push(Member {
                    ppid: pids[*parent],
                    data_off: data.len() as u64,
                    data_len: d.len() as u64,
                    image: img,
                });
                pids.push(image.tree[k].image.pid);
                data.extend_from_slice(&d);
            }
        }
        for (mut z, parent, _) in zombies {
            z.ppid = pids[parent];
            let parent_img = if parent == 0 {
                &image
            } else {
                &image.tree[parent - 1].image
            };
            crate::tree::check_groups((z.pid, z.pgid, z.sid), Some(parent_img))?;
            image.zombies.push(z);
        }
        let stats = EpochStats {
            epoch: 0,
            processes: image.tree.len() as u64 + 1,
            whole_processes: image.tree.len() as u64 + 1,
            pause_us: pause.as_micros() as u64,
            quiesce_us: quiesce.as_micros() as u64,
            raw_bytes: data.len() as u64,
            encoded_bytes: data.len() as u64,
            ..Default::default()
        };
        let mut loops = loops.into_iter();
        let mut lp = loops.next().expect("the main process has a loop");
        lp.meta_carry = tardi_image::store::MetaCarry::after(&image);
        lp.zombies = image.zombies.clone();
        lp.members = loops
            .zip(image.tree.iter().map(|m| (m.image.pid, m.ppid)))
            .map(|(lp, (pid, ppid))| TreeMember {
                pid,
                ppid,
                lp,
                fresh: None,
            })
            .collect();
        let ck = Checkpoint::full(0, image, data);
        let out = EpochOutput {
            incremental: ck,
            full: None,
            stats,
        };
        Ok((lp, out))
    }

    /// The loop of one process after its first pause (`first`: the tracking state it left),
    /// whose checkpoint is `epoch`. Only the main process's loop has a hook and a trigger.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn from_first(
        proc: Proc,
        ns_pid: i32,
        first: FirstLoop,
        cfg: EpochConfig,
        hook: Option<Box<dyn FnMut(u64) + Send>>,
        trigger: Trigger,
        pidfd: OwnedFd,
        epoch: u64,
    ) -> Result<EpochLoop> {
        let FirstLoop {
            tracker,
            cache,
            maps,
            armed,
            dirs,
            shm,
            probe,
        } = first;
        let codec = PageCodec::new().map_err(|e| CaptureError::Unsupported(e.to_string()))?;
        let scrubber = cfg.scrub.map(crate::scrub::Scrubber::new);
        Ok(EpochLoop {
            twins: TwinStore::new(cfg.twin_budget),
            rng: 0x9E37_79B9_7F4A_7C15 ^ proc.pid as u64,
            maps_file: proc.open_file("maps", libc::O_RDONLY).ok(),
            proc,
            cfg,
            tracker,
            armed,
            prev_maps: maps,
            layout_seen: None,
            prev_cow: Vec::new(),
            scrubber,
            scrub_pages: None,
            tcp: crate::tcp::Connections::default(),
            layout_missed: 0,
            cache,
            codecs: vec![codec],
            streak: Vec::new(),
            hot: Vec::new(),
            file_refs: HashMap::new(),
            contents: crate::track::has_contents(),
            cool: HashSet::new(),
            void: Vec::new(),
            epoch,
            base: epoch,
            last_resume: Instant::now(),
            buf: Vec::new(),
            dirs,
            shm,
            pre: None,
            last_dirty: u64::MAX,
            prebuf: Vec::new(),
            carry: Carry::default(),
            hook,
            trigger,
            answers: None,
            pidfd,
            fail: None,
            meta_carry: Default::default(),
            members: Vec::new(),
            shared_groups: None,
            ns_pid,
            mm_probe: probe,
            zombies: Vec::new(),
            broken: None,
            relook: false,
            root_ids: None,
        })
    }
}
