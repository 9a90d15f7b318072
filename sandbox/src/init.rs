//! The sandbox's init: PID 1 of the sandbox's PID namespace, run as
//! `<exe> __sandbox-init <spec-fd>` by [`crate::Sandbox::start`]. It is an ordinary
//! single-threaded process (fresh from `execve`), so it may allocate freely.

use std::convert::Infallible;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use tardi_manifest::MountKind;

use crate::error::{Result, SandboxError};
use crate::proto::{self, InitSpec, Report};
use crate::sys::{self, ChildStatus};
use crate::{ExitInfo, SandboxConfig, Start};

/// The hook that turns the service's first process into the checkpointed one (see
/// [`Start::Restore`]). It runs in a raw `clone3` child of the init that already has the requested
/// PID, default signal dispositions, an empty signal mask and the sandbox's rlimits; the init's own
/// fds are close-on-exec. It must not return.
///
/// Because the child comes from a raw `clone3`, glibc's cached thread id in it is the init's:
/// the hook should not use `raise`/`abort`/`pthread_*` (use raw system calls) before it execs.
pub type RestoreHook = fn(pid: i32, payload: &[u8], fds: &[RawFd]) -> !;

/// Where the service log appears inside the sandbox.
pub const SANDBOX_LOG: &str = "/dev/tardi.log";

/// Signals the init forwards to the service's main process.
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Exit codes of the init when it cannot even report an error.
const EXIT_NO_SPEC: i32 = 126;
const EXIT_SETUP_FAILED: i32 = 125;

/// The body of the hidden `__sandbox-init <spec-fd>` subcommand: becomes the sandbox's init.
///
/// Reads the spec from `spec_fd`, waits for the host's go-ahead (the network is configured by
/// then), sets the hostname, builds the new root (the configured mounts, a fresh `/proc`, a minimal
/// `/dev` and `/dev/shm`), `pivot_root`s into it, changes to the start directory and starts the
/// service: `execve` with stdin from `/dev/null` and stdout/stderr appended to the service log for
/// [`Start::Exec`]; `restore_hook` in a child with the requested PID for [`Start::Restore`]. Then
/// it reaps every process of the sandbox, forwards `SIGTERM`, `SIGINT`, `SIGHUP`, `SIGQUIT`,
/// `SIGUSR1` and `SIGUSR2` to the service, and exits with [`ExitInfo::code`] when the service's
/// main process ends. The init's own stdout and stderr also go to the service log.
pub fn init_main(spec_fd: RawFd, restore_hook: RestoreHook) -> ! {
    let _ = sys::sigmask(libc::SIG_SETMASK, &[]);
    // SAFETY: the host passed this fd (the spec pipe's read end) on our command line; nothing
    // else in this process owns it.
    let mut spec_file = unsafe { File::from_raw_fd(spec_fd) };
    let _ = sys::set_cloexec(spec_fd, true);
    let (spec, payload) = match proto::read_spec(&mut spec_file) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tardi sandbox init: cannot read the spec from fd {spec_fd}: {e}");
            std::process::exit(EXIT_NO_SPEC);
        }
    };
    if !sys::fd_is_open(spec.status_fd) {
        eprintln!(
            "tardi sandbox init: status fd {} is not open",
            spec.status_fd
        );
        std::process::exit(EXIT_NO_SPEC);
    }
    // SAFETY: the status pipe's write end, inherited from the host at this number, is owned by
    // nothing else here.
    let mut status = unsafe { File::from_raw_fd(spec.status_fd) };
    let _ = sys::set_cloexec(spec.status_fd, true);
    let _ = sys::set_cloexec(spec.lock_fd, true);
    if proto::send_report(&mut status, &Report::Ready).is_err() {
        std::process::exit(EXIT_NO_SPEC);
    }
    let mut go = [0u8; 1];
    match spec_file.read(&mut go) {
        Ok(1) if go[0] == proto::GO => {}
        // The host gave up (its start failed): nothing to clean up on this side.
        _ => std::process::exit(0),
    }
    drop(spec_file);

    let Err(err) = run(&spec, &payload, &mut status, restore_hook);
    tracing::error!(error = %err, "sandbox init failed");
    let report = match err {
        SandboxError::ServiceExec { path, source } => Report::ServiceExecFailed {
            path,
            errno: source.raw_os_error().unwrap_or(0),
        },
        other => Report::Failed {
            message: other.to_string(),
        },
    };
    let _ = proto::send_report(&mut status, &report);
    std::process::exit(EXIT_SETUP_FAILED)
}

/// Everything after the go-ahead; returns only on failure (before the service started).
fn run(
    spec: &InitSpec,
    payload: &[u8],
    status: &mut File,
    hook: RestoreHook,
) -> Result<Infallible> {
    let cfg = &spec.config;
    let restore_fds: &[RawFd] = match &spec.start {
        Start::Restore { fds, .. } => fds,
        Start::Exec { .. } => &[],
    };
    let log = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(&spec.log_path)
        .map_err(|e| SandboxError::io("opening the service log", &spec.log_path, e))?;
    let devnull = open_devnull()?;
    for (target, src) in [(0, &devnull), (1, &log), (2, &log)] {
        if !restore_fds.contains(&target) {
            sys::dup2(src.as_raw_fd(), target).map_err(|e| SandboxError::sys("dup2", e))?;
        }
    }

    // SAFETY: the pointer/length pair describes the hostname's bytes.
    if unsafe { libc::sethostname(cfg.hostname.as_ptr().cast(), cfg.hostname.len()) } < 0 {
        return Err(SandboxError::last_os(format!(
            "sethostname({:?})",
            cfg.hostname
        )));
    }
    build_root(cfg, &spec.root_dir, &spec.log_path)?;
    enter_root(&spec.root_dir)?;
    // The service's stdio is opened again inside the new root, so that the paths its descriptors
    // show (and that a checkpoint records) are valid in any sandbox of the same manifest: the
    // log is bind-mounted at `/dev/tardi.log`.
    let log = OpenOptions::new()
        .append(true)
        .open(SANDBOX_LOG)
        .map_err(|e| SandboxError::io("opening the service log", Path::new(SANDBOX_LOG), e))?;
    let devnull = open_devnull()?;
    std::env::set_current_dir(&cfg.start_dir).map_err(|e| {
        SandboxError::io(
            "changing to the start directory (inside the sandbox)",
            &cfg.start_dir,
            e,
        )
    })?;

    let sigfd = setup_signals()?;
    let limits = Limits {
        stack: cfg.stack_size,
        data: cfg.data_limit,
    };
    let main = match &spec.start {
        Start::Exec { path, argv, env } => {
            let user = match &cfg.user {
                Some(u) => Some(resolve_user(u)?),
                None => None,
            };
            spawn_exec(
                path,
                argv,
                env,
                devnull.as_raw_fd(),
                log.as_raw_fd(),
                limits,
                user.as_ref(),
            )?
        }
        Start::Restore { pid, fds, .. } => {
            let close = [status.as_raw_fd(), sigfd.as_raw_fd(), spec.lock_fd];
            spawn_restore(*pid, payload, fds, hook, &close, limits)?
        }
    };
    drop((devnull, log));
    tracing::info!(name = %cfg.name, pid = main, "service started");
    if let Err(e) = proto::send_report(status, &Report::Started { ns_pid: main }) {
        tracing::warn!(error = %e, "cannot report the start to the host; carrying on");
    }
    reap_loop(main, sigfd, status)
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        SandboxError::InvalidConfig(format!("path {} contains a NUL byte", p.display()))
    })
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
    what: impl FnOnce() -> String,
) -> Result<()> {
    let source = source.map(cpath).transpose()?;
    let target_c = cpath(target)?;
    let fstype = fstype.map(|s| CString::new(s).expect("no NUL in fs type"));
    let data = data.map(|s| CString::new(s).expect("no NUL in mount data"));
    sys::mount(
        source.as_deref(),
        &target_c,
        fstype.as_deref(),
        flags,
        data.as_deref(),
    )
    .map_err(|e| SandboxError::sys(what(), e))
}

/// A tmpfs at `target`, with mount options `data` (`mode=...`).
fn mount_tmpfs(
    target: &Path,
    flags: libc::c_ulong,
    data: &str,
    what: impl FnOnce() -> String,
) -> Result<()> {
    mount(
        Some(Path::new("tmpfs")),
        target,
        Some("tmpfs"),
        flags,
        Some(data),
        what,
    )
}

/// `/dev/null`, for reading and writing.
fn open_devnull() -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| SandboxError::io("opening", "/dev/null", e))
}

/// `root` + a sandbox path.
fn under(root: &Path, sandbox_path: &Path) -> PathBuf {
    root.join(sandbox_path.strip_prefix("/").unwrap_or(sandbox_path))
}

/// Builds the sandbox's file system under `root` (an empty directory, in our private mount
/// namespace): a tmpfs, the configured mounts (parents first), `/proc`, `/dev`, `/dev/shm`.
fn build_root(cfg: &SandboxConfig, root: &Path, log: &Path) -> Result<()> {
    let nothing = None::<&Path>;
    mount(
        nothing,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
        || "making all mounts private (mount --make-rprivate /)".into(),
    )?;
    mount_tmpfs(root, libc::MS_NOSUID | libc::MS_NODEV, "mode=755", || {
        format!("mounting the root tmpfs on {}", root.display())
    })?;

    let mut mounts = cfg.mounts.clone();
    mounts.sort_by_key(|m| m.path.components().count());
    for m in &mounts {
        let target = under(root, &m.path);
        match &m.kind {
            MountKind::Bind {
                host_path,
                writable,
            } => {
                if *writable && !host_path.exists() {
                    fs::create_dir_all(host_path).map_err(|e| {
                        SandboxError::io(
                            "creating the host directory for a writable mount",
                            host_path,
                            e,
                        )
                    })?;
                }
                let meta = fs::metadata(host_path).map_err(|e| {
                    SandboxError::io("inspecting the host path to mount", host_path, e)
                })?;
                ensure_mountpoint(&target, &m.path, meta.is_dir())?;
                mount(
                    Some(host_path),
                    &target,
                    None,
                    libc::MS_BIND | libc::MS_REC,
                    None,
                    || {
                        format!(
                            "bind-mounting host {} at sandbox {}",
                            host_path.display(),
                            m.path.display()
                        )
                    },
                )?;
                if !writable {
                    make_readonly(&target, &m.path)?;
                }
            }
            MountKind::Tmpfs => {
                ensure_mountpoint(&target, &m.path, true)?;
                let mode = if m.path == Path::new("/tmp") {
                    "mode=1777"
                } else {
                    "mode=755"
                };
                mount_tmpfs(&target, libc::MS_NOSUID | libc::MS_NODEV, mode, || {
                    format!("mounting a tmpfs at sandbox {}", m.path.display())
                })?;
            }
        }
    }

    let proc_dir = root.join("proc");
    ensure_mountpoint(&proc_dir, Path::new("/proc"), true)?;
    mount(
        Some(Path::new("proc")),
        &proc_dir,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
        || "mounting /proc".into(),
    )?;
    build_dev(root, log)
}

/// A minimal `/dev`: a tmpfs with the harmless device nodes bound from the host, the usual
/// symlinks, and a `/dev/shm` tmpfs.
fn build_dev(root: &Path, log: &Path) -> Result<()> {
    let dev = root.join("dev");
    ensure_mountpoint(&dev, Path::new("/dev"), true)?;
    mount_tmpfs(&dev, libc::MS_NOSUID | libc::MS_NOEXEC, "mode=755", || {
        "mounting the /dev tmpfs".into()
    })?;
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = Path::new("/dev").join(node);
        if !host.exists() {
            continue;
        }
        let target = dev.join(node);
        File::create(&target).map_err(|e| SandboxError::io("creating", &target, e))?;
        mount(Some(&host), &target, None, libc::MS_BIND, None, || {
            format!("bind-mounting {}", host.display())
        })?;
    }
    let target = under(root, Path::new(SANDBOX_LOG));
    File::create(&target).map_err(|e| SandboxError::io("creating", &target, e))?;
    mount(Some(log), &target, None, libc::MS_BIND, None, || {
        format!("bind-mounting the service log {}", log.display())
    })?;
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let path = dev.join(link);
        std::os::unix::fs::symlink(to, &path)
            .map_err(|e| SandboxError::io("creating the symlink", &path, e))?;
    }
    let shm = dev.join("shm");
    fs::create_dir(&shm).map_err(|e| SandboxError::io("creating", &shm, e))?;
    mount_tmpfs(&shm, libc::MS_NOSUID | libc::MS_NODEV, "mode=1777", || {
        "mounting the /dev/shm tmpfs".into()
    })
}

/// Makes sure `target` exists as a directory (`dir`) or a file to mount on. It is created on the
/// root tmpfs, a tmpfs mount, or a writable bind (then on the host) — not under a read-only bind.
fn ensure_mountpoint(target: &Path, sandbox_path: &Path, dir: bool) -> Result<()> {
    let kind = |d: bool| if d { "directory" } else { "file" };
    match fs::metadata(target) {
        Ok(m) if m.is_dir() == dir => return Ok(()),
        Ok(m) => {
            return Err(SandboxError::InvalidConfig(format!(
                "cannot mount a {} on sandbox path {}: it is a {} there",
                kind(dir),
                sandbox_path.display(),
                kind(m.is_dir())
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(SandboxError::io("inspecting the mount point", target, e)),
    }
    let created = match target.parent() {
        Some(parent) => fs::create_dir_all(parent),
        None => Ok(()),
    }
    .and_then(|()| {
        if dir {
            fs::create_dir(target)
        } else {
            File::create(target).map(drop)
        }
    });
    match created {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
            Err(SandboxError::InvalidConfig(format!(
                "sandbox path {} does not exist and cannot be created: it lies on a read-only mount \
             (create it on the host, or mount a tmpfs or writable directory above it)",
                sandbox_path.display()
            )))
        }
        Err(e) => Err(SandboxError::io("creating the mount point", target, e)),
    }
}

/// Read-only, recursively (every mount below too); falls back to a plain read-only remount of
/// the top mount on kernels without `mount_setattr` (< 5.12).
fn make_readonly(target: &Path, sandbox_path: &Path) -> Result<()> {
    let c = cpath(target)?;
    match sys::make_readonly_recursive(&c) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => mount(
            None,
            target,
            None,
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
            None,
            || format!("remounting sandbox {} read-only", sandbox_path.display()),
        ),
        Err(e) => Err(SandboxError::sys(
            format!(
                "making sandbox {} read-only (mount_setattr)",
                sandbox_path.display()
            ),
            e,
        )),
    }
}

/// `pivot_root` into `root` and detach the old root (the runc way: `pivot_root(".", ".")`).
fn enter_root(root: &Path) -> Result<()> {
    let old = File::open("/").map_err(|e| SandboxError::io("opening", "/", e))?;
    let new = File::open(root).map_err(|e| SandboxError::io("opening", root, e))?;
    let fchdir = |f: &File, what: &str| {
        // SAFETY: fchdir on an open directory fd.
        if unsafe { libc::fchdir(f.as_raw_fd()) } < 0 {
            Err(SandboxError::last_os(format!("fchdir to {what}")))
        } else {
            Ok(())
        }
    };
    fchdir(&new, "the new root")?;
    let dot = c".";
    sys::pivot_root(dot, dot)
        .map_err(|e| SandboxError::sys(format!("pivot_root to {}", root.display()), e))?;
    fchdir(&old, "the old root")?;
    // SAFETY: umount2 with a NUL-terminated path.
    if unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) } < 0 {
        return Err(SandboxError::last_os("detaching the old root (umount2)"));
    }
    std::env::set_current_dir("/").map_err(|e| SandboxError::io("changing to", "/", e))
}

/// Installs (no-op) handlers for the forwarded signals and SIGCHLD — PID 1 of a namespace
/// ignores signals it has no handler for — blocks them, and returns a signalfd for them.
fn setup_signals() -> Result<OwnedFd> {
    extern "C" fn noop(_: libc::c_int) {}
    let mut all = FORWARDED.to_vec();
    all.push(libc::SIGCHLD);
    for &sig in &all {
        // SAFETY: sigaction is plain data; zeroed means no flags and an empty mask.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = noop as extern "C" fn(libc::c_int) as usize;
        // SAFETY: `sa` is a valid sigaction whose handler is a valid extern "C" fn.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } < 0 {
            return Err(SandboxError::last_os(format!("sigaction({sig})")));
        }
    }
    sys::sigmask(libc::SIG_BLOCK, &all).map_err(|e| SandboxError::sys("pthread_sigmask", e))?;
    let set = sys::sigset(&all);
    // SAFETY: -1 asks for a new signalfd; `set` is initialised.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(SandboxError::last_os("signalfd"));
    }
    // SAFETY: signalfd returned a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    stack: Option<u64>,
    data: Option<u64>,
}

impl Limits {
    /// Applies the limits (soft = the value; hard raised to it if lower). Async-signal-safe.
    fn apply(self) -> io::Result<()> {
        for (res, value) in [
            (libc::RLIMIT_STACK, self.stack),
            (libc::RLIMIT_DATA, self.data),
        ] {
            let Some(v) = value else { continue };
            let mut cur = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `cur` is a valid rlimit for the kernel to fill.
            if unsafe { libc::getrlimit(res, &mut cur) } < 0 {
                return Err(io::Error::last_os_error());
            }
            let new = libc::rlimit {
                rlim_cur: v,
                rlim_max: cur.rlim_max.max(v),
            };
            // SAFETY: `new` is a valid rlimit.
            if unsafe { libc::setrlimit(res, &new) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The executable to run: `path` itself if it contains a `/`, else the first match in the
/// service's `PATH` (or a standard one).
fn resolve_exec(path: &Path, env: &[(String, String)]) -> PathBuf {
    if path.as_os_str().as_bytes().contains(&b'/') {
        return path.to_path_buf();
    }
    let search = env.iter().find(|(k, _)| k == "PATH").map_or(
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        |(_, v)| v.as_str(),
    );
    search
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(path))
        .find(|p| p.is_file())
        .unwrap_or_else(|| path.to_path_buf())
}

/// The user the service runs as (`SandboxConfig::user`), resolved in the sandbox's own
/// `/etc/passwd` and `/etc/group`.
struct User {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl User {
    /// Groups, then group ID, then user ID (after which none of them could be changed).
    /// Raw system calls: runs in the forked child.
    fn become_it(&self) -> io::Result<()> {
        // SAFETY: plain credential calls on this single-threaded child; `groups` is alive.
        unsafe {
            if libc::setgroups(self.groups.len(), self.groups.as_ptr()) < 0
                || libc::setresgid(self.gid, self.gid, self.gid) < 0
                || libc::setresuid(self.uid, self.uid, self.uid) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Finds `name` (a user name, or a numeric user ID) in the sandbox's `/etc/passwd`; its groups
/// are its primary group and those of `/etc/group` that list it.
fn resolve_user(name: &str) -> Result<User> {
    let bad = |why: String| SandboxError::InvalidConfig(format!("tardi.user {name:?}: {why}"));
    let passwd = fs::read_to_string("/etc/passwd")
        .map_err(|e| bad(format!("reading the sandbox's /etc/passwd: {e}")))?;
    let entry = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 4 && (f[0] == name || f[2] == name))
            .then(|| Some((f[0].to_string(), f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    });
    let (login, uid, gid) = match (entry, name.parse::<u32>()) {
        (Some(e), _) => e,
        (None, Ok(uid)) => (String::new(), uid, uid),
        (None, Err(_)) => return Err(bad("no such user in the sandbox's /etc/passwd".into())),
    };
    let mut groups = vec![gid];
    if let Ok(group) = fs::read_to_string("/etc/group") {
        for l in group.lines() {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() >= 4
                && !login.is_empty()
                && f[3].split(',').any(|m| m == login)
                && let Ok(g) = f[2].parse()
                && !groups.contains(&g)
            {
                groups.push(g);
            }
        }
    }
    Ok(User { uid, gid, groups })
}

/// Forks the service and execs it; an `execve` failure comes back through a close-on-exec pipe
/// and becomes [`SandboxError::ServiceExec`].
fn spawn_exec(
    path: &Path,
    argv: &[String],
    env: &[(String, String)],
    stdin: RawFd,
    log: RawFd,
    limits: Limits,
    user: Option<&User>,
) -> Result<i32> {
    let resolved = resolve_exec(path, env);
    let nul = |what: &str| SandboxError::InvalidConfig(format!("{what} contains a NUL byte"));
    let c_path = cpath(&resolved)?;
    let c_argv: Vec<CString> = if argv.is_empty() {
        vec![c_path.clone()]
    } else {
        argv.iter()
            .map(|a| CString::new(a.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| nul("argv"))?
    };
    let mut c_env = Vec::with_capacity(env.len());
    for (k, v) in env {
        if k.is_empty() || k.contains('=') {
            return Err(SandboxError::InvalidConfig(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        c_env.push(CString::new(format!("{k}={v}")).map_err(|_| nul("the environment"))?);
    }
    let (argv_p, env_p) = (sys::ptr_array(&c_argv), sys::ptr_array(&c_env));
    let (err_r, err_w) = sys::pipe_cloexec().map_err(|e| SandboxError::sys("pipe2", e))?;

    // SAFETY: the init is single-threaded, so the forked child is a complete copy; it still
    // sticks to raw system calls on data prepared above.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SandboxError::last_os("fork (the service)"));
    }
    if pid == 0 {
        sys::reset_signals();
        // SAFETY: setsid has no preconditions; the service gets its own session.
        unsafe { libc::setsid() };
        let ok = sys::dup2(stdin, 0)
            .and(sys::dup2(log, 1))
            .and(sys::dup2(log, 2))
            .and(limits.apply())
            .and(user.map_or(Ok(()), User::become_it));
        // Nothing of the init's reaches the service: every other descriptor closes at exec
        // (CLOSE_RANGE_CLOEXEC keeps the error pipe usable until then).
        // SAFETY: close_range only changes descriptor flags of this child.
        unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 4u32) };
        if ok.is_ok() {
            // SAFETY: NUL-terminated strings in NULL-terminated arrays, alive in this child.
            unsafe { libc::execve(c_path.as_ptr(), argv_p.as_ptr(), env_p.as_ptr()) };
        }
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let _ = sys::write_all_raw(err_w.as_raw_fd(), &errno.to_ne_bytes());
        // SAFETY: _exit is async-signal-safe and skips the copied destructors.
        unsafe { libc::_exit(127) };
    }
    drop(err_w);
    let mut buf = [0u8; 4];
    let mut got = 0;
    let mut r = File::from(err_r);
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SandboxError::sys("reading the service's exec status", e)),
        }
    }
    if got == 0 {
        return Ok(pid);
    }
    let mut st = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    Err(SandboxError::ServiceExec {
        path: resolved,
        source: io::Error::from_raw_os_error(i32::from_ne_bytes(buf)),
    })
}

/// Creates the service's first process with PID `pid` (`clone3` with `set_tid`) and calls the
/// restore hook in it.
fn spawn_restore(
    pid: i32,
    payload: &[u8],
    fds: &[RawFd],
    hook: RestoreHook,
    close: &[RawFd],
    limits: Limits,
) -> Result<i32> {
    let tid = [pid as libc::pid_t];
    let mut args = libc::clone_args {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tid.as_ptr() as u64,
        set_tid_size: 1,
        ..sys::clone_args()
    };
    // SAFETY: `set_tid` points to a live one-element array. The init is single-threaded, so the
    // child is a complete copy of it (see RestoreHook for glibc's stale thread id).
    let child = unsafe { sys::clone3(&mut args) }.map_err(|e| {
        SandboxError::sys(
            format!("clone3 with set_tid=[{pid}] (creating the service with its checkpointed PID)"),
            e,
        )
    })?;
    if child == 0 {
        sys::reset_signals();
        for &fd in close {
            // SAFETY: closing fds of the init that the service must not hold.
            unsafe { libc::close(fd) };
        }
        if let Err(e) = limits.apply() {
            eprintln!("tardi sandbox init: setrlimit for the restored service: {e}");
        }
        hook(pid, payload, fds)
    }
    if child != pid {
        tracing::warn!(
            requested = pid,
            got = child,
            "clone3 set_tid gave another PID"
        );
    }
    Ok(child)
}

/// Reaps every process of the sandbox; forwards signals to `main`; exits when `main` ends.
fn reap_loop(main: i32, sigfd: OwnedFd, status: &mut File) -> ! {
    loop {
        // SAFETY: signalfd_siginfo is plain data; zeroed is a valid value.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is valid for writes of `size` bytes.
        let n = unsafe {
            libc::read(
                sigfd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(error = %err, "reading the signalfd failed; stopping the sandbox");
            std::process::exit(EXIT_SETUP_FAILED);
        }
        let sig = info.ssi_signo as libc::c_int;
        if sig != libc::SIGCHLD {
            tracing::debug!(sig, "forwarding signal to the service");
            // SAFETY: kill with a PID of our own namespace and a valid signal number.
            unsafe { libc::kill(main, sig) };
            continue;
        }
        loop {
            let mut st = 0;
            // SAFETY: `st` is a valid int for the status.
            let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG | libc::__WALL) };
            if r <= 0 {
                break;
            }
            if r == main
                && let Some(cs) = ChildStatus::from_wait_status(st)
            {
                let info = match cs {
                    ChildStatus::Exited(code) => ExitInfo::Exited { code },
                    ChildStatus::Signaled {
                        signal,
                        core_dumped,
                    } => ExitInfo::Signaled {
                        signal,
                        core_dumped,
                    },
                };
                tracing::info!(%info, "service ended; stopping the sandbox");
                let _ = proto::send_report(status, &Report::Exited(info));
                std::process::exit(info.code());
            }
        }
    }
}
