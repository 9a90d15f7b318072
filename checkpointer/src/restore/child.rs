//! The restore child: recreates the process tree, zombies and shared descriptions, sets itself
//! up as the checkpointed process (credentials, namespaces view, descriptors) and hands over to
//! the restorer blob.

#[allow(unused_imports)]
use super::*;

/// The descriptor of the notify pipe: at its final number once the inherited descriptors
/// moved there, at its inherited one before; -1 when there is none.
fn notify_fd(plan: &ChildPlan) -> RawFd {
    if plan.inherited.len() != INHERITED {
        return -1;
    }
    let notify = plan.base + 2;
    // SAFETY: F_GETFD only queries.
    if unsafe { libc::fcntl(notify, libc::F_GETFD) } >= 0 {
        notify
    } else {
        plan.inherited[2]
    }
}

/// Tells the parent something that did not stop the restore ([`NOTE`] record, then the text).
fn note(plan: &ChildPlan, msg: &str) {
    let fd = notify_fd(plan);
    let rec = [NOTE, 0, msg.len() as u64];
    // SAFETY: writing local buffers to the notify pipe (a pipe write of at most PIPE_BUF
    // bytes is atomic; a longer note may interleave with nothing, as this process alone
    // writes this pipe).
    unsafe {
        libc::write(fd, rec.as_ptr().cast(), 24);
        libc::write(fd, msg.as_ptr().cast(), msg.len());
    }
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
    let msg = failed.unwrap_or_else(|| child_setup(&plan));
    let notify_fd = notify_fd(&plan);
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
pub(super) fn make_tree(mut me: ChildPlan) -> (ChildPlan, Option<String>) {
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
pub(super) fn make_zombies(me: &ChildPlan, zombies: &[Zombie]) -> std::result::Result<(), String> {
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
pub(super) fn become_zombie(z: &Zombie) -> ! {
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
pub(super) fn make_shared(p: &ChildPlan) -> std::result::Result<(), String> {
    let Ok(cwd) = CString::new(p.cwd.as_str()) else {
        return Err(format!("working directory {:?} contains a NUL byte", p.cwd));
    };
    // SAFETY: valid C string.
    if unsafe { libc::chdir(cwd.as_ptr()) } < 0 {
        let e = io::Error::last_os_error();
        return Err(format!("chdir {}: {e}", p.cwd));
    }
    let end = p.shared_base + p.shared_count as RawFd;
    // A connected TCP socket several processes share is not carried on yet: reset, and said.
    fds::recreate(&p.make_shared, &[], end, p.shared_base)
        .map(|notes| notes.iter().for_each(|n| note(p, n)))
        .map_err(|e| format!("making a shared description: {e}"))
}

/// Forks the calling (single-threaded) process into a child with PID `pid` in the sandbox's
/// PID namespace (`clone3` with `set_tid`, exit signal SIGCHLD): 0 in the child, the child's
/// PID in the parent.
pub(super) fn fork_with_pid(pid: i32) -> io::Result<libc::c_long> {
    let tid = [pid as libc::pid_t];
    // SAFETY: `clone_args` is plain unsigned integers; all zero is the kernel's "not set".
    let unset: libc::clone_args = unsafe { std::mem::zeroed() };
    let args = libc::clone_args {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tid.as_ptr() as u64,
        set_tid_size: 1,
        ..unset
    };
    // SAFETY: a fork-like clone3 (no CLONE_VM: the child has its own copy of this
    // single-threaded process and returns here with 0); `args` and the one-element `set_tid`
    // array are alive for the call.
    let child = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(child)
}

/// Sets everything up and execs the restorer; returns only on failure.
pub(super) fn child_setup(p: &ChildPlan) -> String {
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
    match fds::recreate(&p.fds, &p.tcp, floor, p.shared_base) {
        // Connections that could not be carried on were reset: said to the parent, which
        // logs and counts them (`finish::wait_report`).
        Ok(notes) => notes.iter().for_each(|n| note(p, n)),
        Err(e) => return e.to_string(),
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
