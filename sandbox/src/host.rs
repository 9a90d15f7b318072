//! The host side: [`Sandbox::start`], the running sandbox's handle, and its teardown.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Result, SandboxError};
use crate::net::{self, Link};
use crate::proto::{self, InitSpec, Next, Report, StatusReader};
use crate::sys::{self, ChildStatus};
use crate::{ExitInfo, INIT_SUBCOMMAND, SandboxConfig, Start};

/// How long the init may take to read its spec.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the init may take to build the root and start the service once the network is up.
const START_TIMEOUT: Duration = Duration::from_secs(30);

const PID_FILE: &str = "init.pid";
const LOCK_FILE: &str = "lock";
const ROOT_DIR: &str = "root";
const LOG_FILE: &str = "service.log";

/// The sandbox's init as seen from the host.
#[derive(Debug)]
struct InitProc {
    pid: i32,
    pidfd: OwnedFd,
    /// Set once reaped.
    status: Option<ChildStatus>,
}

/// A running sandbox (or one whose service has exited but which is not torn down yet).
///
/// Dropping it tears it down best-effort (errors are logged); call [`Sandbox::teardown`] to see
/// them.
#[derive(Debug)]
pub struct Sandbox {
    name: String,
    run_dir: PathBuf,
    log_path: PathBuf,
    root_dir: PathBuf,
    pid_file: PathBuf,
    lock_path: PathBuf,
    /// Held (`flock`) for the handle's lifetime; the init inherits it, so it stays held as long as
    /// either lives.
    lock: Option<File>,
    created_run_dir: bool,
    created_root: bool,
    init_exe: PathBuf,
    init: Option<InitProc>,
    link: Option<Link>,
    status: Option<StatusReader>,
    service_pid: Option<i32>,
    service_ns_pid: i32,
    exit: Option<ExitInfo>,
    started: bool,
    cleaned: bool,
}

impl Sandbox {
    /// Creates the sandbox described by `config` and starts its service as `start` says; returns
    /// once the service's main process exists (for [`Start::Exec`]: once its `execve` succeeded).
    ///
    /// On error, everything created so far (init, namespaces, veth pair, pid and lock files, root
    /// directory, an empty log) is removed again.
    ///
    /// The calling process must not die of `SIGPIPE` (Rust programs ignore it by default).
    pub fn start(config: &SandboxConfig, start: Start) -> Result<Sandbox> {
        Self::start_gated(config, start, |_| true)
    }

    /// Like [`Sandbox::start`], but `before_go` runs once the sandbox is set up (namespaces,
    /// mounts, network configured, its init waiting) and just before its first process
    /// starts, so that work the process needs (e.g. a restore's page data, written into a
    /// descriptor given in `start`) can go on meanwhile on another thread. It is given the
    /// sandbox's address, routed on this machine by then. `before_go` returning `false`
    /// aborts: everything created is removed and [`SandboxError::Aborted`] returned.
    pub fn start_gated(
        config: &SandboxConfig,
        start: Start,
        before_go: impl FnOnce(Ipv4Addr) -> bool,
    ) -> Result<Sandbox> {
        config.validate()?;
        check_start(&start)?;
        let init_exe = match &config.init_exe {
            Some(p) => p.clone(),
            None => fs::read_link("/proc/self/exe").map_err(|e| {
                SandboxError::io("resolving the current executable", "/proc/self/exe", e)
            })?,
        };

        let run_dir = config.run_dir.clone();
        let created_run_dir = !run_dir.exists();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&run_dir)
            .map_err(|e| SandboxError::io("creating the run directory", &run_dir, e))?;
        let lock_path = run_dir.join(LOCK_FILE);
        let pid_file = run_dir.join(PID_FILE);
        let lock = acquire_lock(&lock_path, &config.name, &pid_file)?;

        // From here on, dropping `sb` undoes whatever has been done.
        let mut sb = Sandbox {
            name: config.name.clone(),
            log_path: run_dir.join(LOG_FILE),
            root_dir: run_dir.join(ROOT_DIR),
            pid_file,
            lock_path,
            lock: Some(lock),
            created_run_dir,
            created_root: false,
            init_exe,
            init: None,
            link: None,
            status: None,
            service_pid: None,
            service_ns_pid: 0,
            exit: None,
            started: false,
            cleaned: false,
            run_dir,
        };
        match fs::remove_file(&sb.pid_file) {
            Ok(()) => tracing::warn!(name = %sb.name, "removed a stale pid file"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(SandboxError::io(
                    "removing the stale pid file",
                    &sb.pid_file,
                    e,
                ));
            }
        }
        match fs::create_dir(&sb.root_dir) {
            Ok(()) => {}
            // Left over by a crashed host process; it was never a mount point on the host.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && sb.root_dir.is_dir() => {}
            Err(e) => {
                return Err(SandboxError::io(
                    "creating the root directory",
                    &sb.root_dir,
                    e,
                ));
            }
        }
        sb.created_root = true;

        let link = net::create_link_for(config.subnet, config.link_index, &config.run_dir)?;
        let (address, gateway) = (link.sandbox_addr, link.host_addr);
        sb.link = Some(link);

        let (spec_r, spec_w) = sys::pipe_cloexec().map_err(|e| SandboxError::sys("pipe2", e))?;
        let (status_r, status_w) =
            sys::pipe_cloexec().map_err(|e| SandboxError::sys("pipe2", e))?;
        let lock_fd = sb
            .lock
            .as_ref()
            .map(AsRawFd::as_raw_fd)
            .expect("lock is held");
        let mut keep = vec![spec_r.as_raw_fd(), status_w.as_raw_fd(), lock_fd];
        let (start, payload) = match start {
            Start::Restore { pid, payload, fds } => {
                keep.extend_from_slice(&fds);
                (
                    Start::Restore {
                        pid,
                        payload: Vec::new(),
                        fds,
                    },
                    payload,
                )
            }
            exec @ Start::Exec { .. } => (exec, Vec::new()),
        };
        let child =
            InitExec::prepare(&sb.init_exe, spec_r.as_raw_fd(), status_w.as_raw_fd(), keep)?;
        let (pid, pidfd) = child.spawn().map_err(|e| {
            SandboxError::sys("clone3 (new PID, mount, net, UTS and IPC namespaces)", e)
        })?;
        sb.init = Some(InitProc {
            pid,
            pidfd,
            status: None,
        });
        drop((spec_r, status_w));
        sb.status = Some(StatusReader::new(status_r));
        tracing::debug!(name = %sb.name, init_pid = pid, "sandbox init cloned");
        fs::write(&sb.pid_file, format!("{pid}\n"))
            .map_err(|e| SandboxError::io("writing the pid file", &sb.pid_file, e))?;

        let spec = InitSpec {
            config: config.clone(),
            start,
            log_path: sb.log_path.clone(),
            root_dir: sb.root_dir.clone(),
            status_fd: child.status_fd,
            lock_fd,
            address,
            gateway,
        };
        let mut spec_w = File::from(spec_w);
        if let Err(e) = proto::write_spec(&mut spec_w, &spec, &payload) {
            return Err(sb.explain(e, "sending the spec to the sandbox init"));
        }
        match sb.await_report(READY_TIMEOUT, "reading its spec")? {
            Report::Ready => {}
            other => return Err(unexpected(other, "Ready")),
        }
        net::configure(sb.link.as_ref().expect("link exists"), pid)?;
        if !before_go(address) {
            return Err(SandboxError::Aborted);
        }
        if let Err(e) = spec_w.write_all(&[proto::GO]) {
            return Err(sb.explain(e, "telling the sandbox init to go on"));
        }
        drop(spec_w);
        let ns_pid = match sb.await_report(START_TIMEOUT, "starting the service")? {
            Report::Started { ns_pid } => ns_pid,
            other => return Err(unexpected(other, "Started")),
        };
        sb.service_ns_pid = ns_pid;
        sb.service_pid = find_service_pid(pid, ns_pid);
        sb.started = true;
        tracing::info!(
            name = %sb.name, init_pid = pid, service_pid = ?sb.service_pid, %address,
            "sandbox started"
        );
        Ok(sb)
    }

    /// The sandbox's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sandbox side's address (`eth0` inside the sandbox).
    pub fn address(&self) -> Ipv4Addr {
        self.link
            .as_ref()
            .map_or(Ipv4Addr::UNSPECIFIED, |l| l.sandbox_addr)
    }

    /// The host side's address (the sandbox's default gateway).
    pub fn host_address(&self) -> Ipv4Addr {
        self.link
            .as_ref()
            .map_or(Ipv4Addr::UNSPECIFIED, |l| l.host_addr)
    }

    /// The link index (see [`crate::net`]); pass it as [`SandboxConfig::link_index`] to get the
    /// same addresses again.
    pub fn link_index(&self) -> Option<u32> {
        self.link.as_ref().map(|l| l.index)
    }

    /// The host side's interface name, `td<i>h`.
    pub fn host_interface(&self) -> &str {
        self.link.as_ref().map_or("", |l| &l.host_if)
    }

    /// The init's PID in the host's PID namespace.
    pub fn init_pid(&self) -> i32 {
        self.init.as_ref().map_or(0, |i| i.pid)
    }

    /// The service's main process's PID in the host's PID namespace; `None` if it had already
    /// exited when the sandbox finished starting.
    pub fn service_pid(&self) -> Option<i32> {
        self.service_pid
    }

    /// The service's main process's PID inside the sandbox (usually 2; the requested PID for
    /// [`Start::Restore`]).
    pub fn service_ns_pid(&self) -> i32 {
        self.service_ns_pid
    }

    /// The service log (`<run_dir>/service.log`): the service's stdout and stderr, appended.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Removes a sandbox that a previous process left in `run_dir`: its owner died without
    /// tearing it down (a daemon killed with SIGKILL), so its init still runs (holding the
    /// lock) and its link still exists, and no new sandbox of that name could start (`the
    /// sandbox is already running`, or `the address is in use`). Kills the init, and with it
    /// every process of its PID namespace, waits for the lock to be free, and deletes the link.
    /// Returns the init's PID if one was running. For a daemon starting on run directories that
    /// are its own only: whatever runs there is a leftover of its previous run.
    pub fn reap_leftover(run_dir: &Path) -> Result<Option<i32>> {
        let lock_path = run_dir.join(LOCK_FILE);
        let mut killed = None;
        if lock_path.exists() {
            let f = File::open(&lock_path)
                .map_err(|e| SandboxError::io("opening the lock file", &lock_path, e))?;
            if let Err(TryLockError::WouldBlock) = f.try_lock() {
                // Held: the init runs, and it wrote its PID before anything else.
                let pid_file = run_dir.join(PID_FILE);
                let pid: i32 = fs::read_to_string(&pid_file)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .ok_or_else(|| {
                        SandboxError::io(
                            "reading the leftover sandbox's init PID",
                            &pid_file,
                            io::Error::other("missing or malformed while the lock is held"),
                        )
                    })?;
                match sys::pidfd_open(pid) {
                    Ok(fd) => match sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL) {
                        Ok(()) => {}
                        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                        Err(e) => {
                            return Err(SandboxError::sys(
                                format!("killing the leftover sandbox init {pid}"),
                                e,
                            ));
                        }
                    },
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => {
                        return Err(SandboxError::sys(format!("pidfd_open({pid})"), e));
                    }
                }
                // The lock goes with the last process holding its file: the namespace's.
                let t0 = std::time::Instant::now();
                loop {
                    match f.try_lock() {
                        Ok(()) => break,
                        Err(TryLockError::WouldBlock) if t0.elapsed() < Duration::from_secs(5) => {
                            std::thread::sleep(Duration::from_millis(10))
                        }
                        Err(TryLockError::WouldBlock) => {
                            return Err(SandboxError::io(
                                "waiting for the leftover sandbox to die",
                                &lock_path,
                                io::Error::other(format!(
                                    "init {pid} killed, lock still held after 5 s"
                                )),
                            ));
                        }
                        Err(TryLockError::Error(e)) => {
                            return Err(SandboxError::io("locking", &lock_path, e));
                        }
                    }
                }
                killed = Some(pid);
                let _ = fs::remove_file(&pid_file);
            }
        }
        // The link can outlive the processes (orphaned TCP sockets keep the network namespace,
        // and with it the pair, alive): deleted whether or not an init ran.
        if let Some(index) = net::recorded_index(run_dir) {
            net::delete_link(&net::host_if(index))?;
        }
        Ok(killed)
    }

    /// This sandbox's run directory.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The file holding the init's PID (`<run_dir>/init.pid`), present while the sandbox exists.
    pub fn pid_file(&self) -> &Path {
        &self.pid_file
    }

    /// Blocks until the init exits (which it does when the service's main process exits, or when
    /// killed) and reports how the service ended.
    pub fn wait_exit(&mut self) -> Result<ExitInfo> {
        self.wait(false)
            .map(|o| o.expect("blocking wait returns a status"))
    }

    /// Like [`Sandbox::wait_exit`] but returns `None` at once if the sandbox still runs.
    pub fn try_wait(&mut self) -> Result<Option<ExitInfo>> {
        self.wait(true)
    }

    /// Kills the init with `SIGKILL`; the kernel then kills every process in the sandbox's PID
    /// namespace. Does not wait (see [`Sandbox::wait_exit`]).
    pub fn kill(&mut self) -> Result<()> {
        let Some(init) = &self.init else {
            return Ok(());
        };
        if init.status.is_some() {
            return Ok(());
        }
        match sys::pidfd_send_signal(init.pidfd.as_fd(), libc::SIGKILL) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            Err(e) => Err(SandboxError::sys(
                format!("pidfd_send_signal(SIGKILL) to init {}", init.pid),
                e,
            )),
        }
    }

    /// Kills the sandbox if it still runs, reaps the init, deletes the veth pair and removes the
    /// pid file, lock and root directory. The service log stays.
    pub fn teardown(mut self) -> Result<()> {
        self.cleanup()
    }

    fn wait(&mut self, nohang: bool) -> Result<Option<ExitInfo>> {
        if let Some(info) = self.exit {
            return Ok(Some(info));
        }
        let Some(init) = &mut self.init else {
            return Err(SandboxError::InvalidConfig(
                "the sandbox has no init".into(),
            ));
        };
        let status = match init.status {
            Some(s) => s,
            None => match sys::waitid_pidfd(init.pidfd.as_fd(), nohang)
                .map_err(|e| SandboxError::sys(format!("waitid on sandbox init {}", init.pid), e))?
            {
                Some(s) => {
                    init.status = Some(s);
                    s
                }
                None => return Ok(None),
            },
        };
        // The init's last words, if it got to say them.
        let mut reported = None;
        if let Some(reader) = &mut self.status {
            while let Ok(Next::Report(r)) = reader.next(Duration::from_secs(1)) {
                if let Report::Exited(info) = r {
                    reported = Some(info);
                }
            }
        }
        self.status = None;
        let info = reported.unwrap_or(match status {
            ChildStatus::Signaled { signal, .. } => ExitInfo::InitKilled { signal },
            ChildStatus::Exited(code) => ExitInfo::from_init_code(code),
        });
        tracing::info!(name = %self.name, %info, "sandbox exited");
        self.exit = Some(info);
        Ok(Some(info))
    }

    /// Waits for the init's next report; failures and silence become errors.
    fn await_report(&mut self, timeout: Duration, waiting_for: &str) -> Result<Report> {
        let reader = self
            .status
            .as_mut()
            .expect("status pipe is open while starting");
        let next = reader
            .next(timeout)
            .map_err(|e| SandboxError::Protocol(e.to_string()))?;
        match next {
            Next::Report(Report::Failed { message }) => Err(SandboxError::Init {
                name: self.name.clone(),
                message,
            }),
            Next::Report(Report::ServiceExecFailed { path, errno }) => {
                Err(SandboxError::ServiceExec {
                    path,
                    source: io::Error::from_raw_os_error(errno),
                })
            }
            Next::Report(Report::InitExecFailed(errno)) => Err(SandboxError::InitExec {
                exe: self.init_exe.clone(),
                source: io::Error::from_raw_os_error(errno),
            }),
            Next::Report(r) => Ok(r),
            Next::Eof => {
                let how = self.reap_briefly();
                Err(SandboxError::InitDied {
                    name: self.name.clone(),
                    what: format!("{how} before {waiting_for}"),
                    log: self.log_path.clone(),
                })
            }
            Next::TimedOut => Err(SandboxError::InitDied {
                name: self.name.clone(),
                what: format!(
                    "did not finish {waiting_for} within {} s",
                    timeout.as_secs()
                ),
                log: self.log_path.clone(),
            }),
        }
    }

    /// After writing to the init failed: the init's own report says more, if there is one.
    fn explain(&mut self, err: io::Error, doing: &str) -> SandboxError {
        match self.await_report(Duration::from_secs(2), doing) {
            Err(e) => e,
            Ok(_) => SandboxError::sys(doing, err),
        }
    }

    /// Reaps the init if it exits within a second; describes how it ended.
    fn reap_briefly(&mut self) -> String {
        let Some(init) = &mut self.init else {
            return "is gone".into();
        };
        for _ in 0..100 {
            if let Ok(Some(s)) = sys::waitid_pidfd(init.pidfd.as_fd(), true) {
                init.status = Some(s);
                return match s {
                    ChildStatus::Exited(c) => format!("exited with code {c}"),
                    ChildStatus::Signaled { signal, .. } => {
                        format!("was killed by signal {signal}")
                    }
                };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        "closed its status pipe".into()
    }

    /// Undoes everything, in an order that never leaves a half-alive sandbox: the link first (so
    /// its index is free at once and nothing can reach a dying service), then the init and with
    /// it the namespaces, then the files. Keeps going after errors; returns the first.
    fn cleanup(&mut self) -> Result<()> {
        if self.cleaned {
            return Ok(());
        }
        self.cleaned = true;
        let mut first: Option<SandboxError> = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                tracing::warn!(error = %e, "sandbox teardown");
                first.get_or_insert(e);
            }
        };
        if let Some(link) = self.link.take() {
            note(net::delete_link(&link.host_if));
        }
        if self.init.as_ref().is_some_and(|i| i.status.is_none()) {
            note(self.kill());
            if let Some(init) = &mut self.init {
                match sys::waitid_pidfd(init.pidfd.as_fd(), false) {
                    Ok(s) => init.status = s,
                    Err(e) => note(Err(SandboxError::sys(
                        format!("waitid on sandbox init {}", init.pid),
                        e,
                    ))),
                }
            }
        }
        self.status = None;
        note(remove_file(&self.pid_file, "removing the pid file"));
        if self.created_root {
            match fs::remove_dir(&self.root_dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => note(Err(SandboxError::io(
                    "removing the root directory",
                    &self.root_dir,
                    e,
                ))),
                _ => {}
            }
        }
        if !self.started && fs::metadata(&self.log_path).is_ok_and(|m| m.len() == 0) {
            note(remove_file(&self.log_path, "removing the empty log"));
        }
        note(remove_file(&self.lock_path, "removing the lock file"));
        self.lock = None;
        if self.created_run_dir && !self.started {
            // A sandbox that never started does not keep a link index for its name.
            let _ = fs::remove_file(self.run_dir.join(net::INDEX_FILE));
            // Only succeeds if empty, which is what we want.
            let _ = fs::remove_dir(&self.run_dir);
        }
        tracing::debug!(name = %self.name, "sandbox torn down");
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            tracing::warn!(name = %self.name, error = %e, "tearing down the sandbox failed");
        }
    }
}

fn remove_file(path: &Path, action: &'static str) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(SandboxError::io(action, path, e)),
        _ => Ok(()),
    }
}

fn unexpected(report: Report, wanted: &str) -> SandboxError {
    SandboxError::Protocol(format!(
        "expected {wanted} from the sandbox init, got {report:?}"
    ))
}

fn check_start(start: &Start) -> Result<()> {
    match start {
        Start::Exec { path, .. } if path.as_os_str().is_empty() => Err(
            SandboxError::InvalidConfig("the service's path is empty".into()),
        ),
        Start::Restore { pid, .. } if *pid < 2 => Err(SandboxError::InvalidConfig(format!(
            "cannot restore a service as PID {pid}: PID 1 is the sandbox's init"
        ))),
        Start::Restore { fds, .. } => match fds.iter().find(|&&fd| !sys::fd_is_open(fd)) {
            Some(fd) => Err(SandboxError::InvalidConfig(format!(
                "restore fd {fd} is not open in this process"
            ))),
            None => Ok(()),
        },
        Start::Exec { .. } => Ok(()),
    }
}

/// Takes the exclusive lock on `path`, or reports the sandbox as already running.
fn acquire_lock(path: &Path, name: &str, pid_file: &Path) -> Result<File> {
    for _ in 0..10 {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map_err(|e| SandboxError::io("opening the lock file", path, e))?;
        match f.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let pid = fs::read_to_string(pid_file)
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                return Err(SandboxError::AlreadyRunning {
                    name: name.to_string(),
                    pid,
                    lock: path.to_path_buf(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(SandboxError::io("locking", path, e)),
        }
        // A teardown may have unlinked the file between our open and lock: then we locked an
        // orphan, and must retry on the new file.
        let ours = f
            .metadata()
            .map_err(|e| SandboxError::io("inspecting the lock file", path, e))?;
        if let Ok(now) = fs::metadata(path)
            && (now.dev(), now.ino()) == (ours.dev(), ours.ino())
        {
            return Ok(f);
        }
    }
    Err(SandboxError::io(
        "locking",
        path,
        io::Error::other("the lock file keeps being replaced"),
    ))
}

/// The host PID of the init's child whose PID inside the sandbox is `ns_pid`.
fn find_service_pid(init_pid: i32, ns_pid: i32) -> Option<i32> {
    let children = fs::read_to_string(format!("/proc/{init_pid}/task/{init_pid}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|c| c.parse::<i32>().ok())
        .find(|&c| {
            fs::read_to_string(format!("/proc/{c}/status"))
                .ok()
                .is_some_and(|st| {
                    st.lines()
                        .find_map(|l| l.strip_prefix("NSpid:"))
                        .and_then(|l| l.split_whitespace().last())
                        .and_then(|p| p.parse::<i32>().ok())
                        == Some(ns_pid)
                })
        })
}

/// Everything the clone child needs, allocated before the clone: the child may not allocate.
struct InitExec {
    exe: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    /// Fds whose `FD_CLOEXEC` the child clears so they survive into the init.
    keep_fds: Vec<RawFd>,
    status_fd: RawFd,
}

impl InitExec {
    fn prepare(
        exe: &Path,
        spec_fd: RawFd,
        status_fd: RawFd,
        keep_fds: Vec<RawFd>,
    ) -> Result<InitExec> {
        let cstring = |s: &[u8], what: &str| {
            CString::new(s)
                .map_err(|_| SandboxError::InvalidConfig(format!("{what} contains a NUL byte")))
        };
        let exe_c = cstring(exe.as_os_str().as_bytes(), "the init executable's path")?;
        let argv = vec![
            exe_c.clone(),
            cstring(INIT_SUBCOMMAND.as_bytes(), "argv")?,
            cstring(spec_fd.to_string().as_bytes(), "argv")?,
        ];
        let envp = std::env::vars_os()
            .filter_map(|(k, v)| {
                let mut kv = k;
                kv.push("=");
                kv.push(v);
                CString::new(kv.as_bytes()).ok()
            })
            .collect();
        Ok(InitExec {
            exe: exe_c,
            argv,
            envp,
            keep_fds,
            status_fd,
        })
    }

    /// `clone3` into new namespaces; the child execs the init. Returns the init's PID and a
    /// pidfd for it.
    fn spawn(&self) -> io::Result<(i32, OwnedFd)> {
        let (argv, envp) = (sys::ptr_array(&self.argv), sys::ptr_array(&self.envp));
        let mut pidfd: libc::c_int = -1;
        let flags = libc::CLONE_NEWPID
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWNET
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC
            | libc::CLONE_PIDFD;
        let mut args = libc::clone_args {
            flags: flags as u64,
            pidfd: &mut pidfd as *mut libc::c_int as u64,
            exit_signal: libc::SIGCHLD as u64,
            ..sys::clone_args()
        };
        // SAFETY: `args.pidfd` points to a live int. The child (below) only makes raw system
        // calls on memory prepared before the clone (`keep_fds`, `exe`, `argv`, `envp`, a stack
        // buffer) and then execs or `_exit`s: async-signal-safe, as required in a possibly
        // multi-threaded process.
        let pid = unsafe { sys::clone3(&mut args)? };
        if pid == 0 {
            for &fd in &self.keep_fds {
                let _ = sys::set_cloexec(fd, false);
            }
            // SAFETY: exe/argv/envp are NUL-terminated strings in NULL-terminated arrays, alive
            // (copy-on-write copies) in this child.
            unsafe { libc::execve(self.exe.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            let mut msg = [proto::EXEC_FAILED, 0, 0, 0, 0];
            msg[1..].copy_from_slice(&errno.to_ne_bytes());
            let _ = sys::write_all_raw(self.status_fd, &msg);
            // SAFETY: _exit is async-signal-safe and does not run this copy's destructors.
            unsafe { libc::_exit(127) };
        }
        // SAFETY: clone3 with CLONE_PIDFD succeeded, so the kernel stored a new fd we now own.
        Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }))
    }
}
