//! [`Lab`]: creating, driving and removing the lab.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::daemon::{self, Daemons};
use crate::error::{IoContext, LabError, Result};
use crate::exec::{ORCHESTRATOR_ENV, PLAINTEXT_ENV, Session, TLS_DIR_ENV, node_command};
use crate::layout::{self, Layout, Node, Role, SERVICE_PREFIX, SERVICE_SUBNET, SUBNET_PREFIX};
use crate::lock::LabLock;
use crate::state::{LabState, NodeState, Owner};
use crate::{cgroup, netns, network, procs};

/// How long a cgroup kill may take before we stop waiting for the processes to be gone.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What [`Lab::up`] builds.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Machine nodes `m1`…`mN` (each runs an instance).
    pub machines: usize,
    /// Orchestrator nodes `o1`…`oK`.
    pub orchestrators: usize,
    /// Which daemons to start.
    pub daemons: Daemons,
    /// How long each daemon may take to accept connections.
    pub ready_timeout: Duration,
    /// How long to wait for another user of the lab (a test, a `tardi lab` command) to finish.
    pub lock_wait: Duration,
    /// Print a line per step on stderr (they also go to `tracing` at info level).
    pub progress: bool,
    /// Put each node's processes in a cgroup (if cgroup2 is there). Without, a kill walks
    /// `/proc` for the node's processes and their descendants; tests of that path turn it off.
    pub cgroups: bool,
    /// Make a CA and an identity per node and run everything with mutual TLS (the default);
    /// without, daemons and commands run with `--insecure-plaintext`.
    pub tls: bool,
}

impl LabOptions {
    /// `machines` machines, one orchestrator node, no daemons, quiet; waits up to 10 s for each
    /// daemon and up to 30 min for the lock (tests queue for the lab).
    pub fn new(machines: usize) -> LabOptions {
        LabOptions {
            machines,
            orchestrators: 1,
            daemons: Daemons::None,
            ready_timeout: Duration::from_secs(10),
            lock_wait: Duration::from_secs(30 * 60),
            progress: false,
            cgroups: true,
            tls: true,
        }
    }

    /// With these daemons.
    pub fn daemons(mut self, daemons: Daemons) -> LabOptions {
        self.daemons = daemons;
        self
    }

    /// With `n` orchestrator nodes.
    pub fn orchestrators(mut self, n: usize) -> LabOptions {
        self.orchestrators = n;
        self
    }
}

/// The lab as `up --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub nodes: Vec<NodeSummary>,
    /// The value of `TARDI_ORCHESTRATOR` in the nodes: the orchestrators' URLs, comma-separated.
    pub orchestrator: String,
    /// Each orchestrator's URL.
    pub orchestrators: Vec<String>,
    /// The lab subnet, `10.77.0.0/24`.
    pub subnet: String,
    /// The sandboxes' service subnet, `10.213.0.0/16`.
    pub service_subnet: String,
}

/// One node in a [`Summary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSummary {
    pub name: String,
    pub role: Role,
    pub namespace: String,
    pub address: Ipv4Addr,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
}

/// What [`Lab::down`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DownReport {
    /// Namespaces deleted.
    pub namespaces: Vec<String>,
    /// Processes killed by walking `/proc` (those killed through `cgroup.kill` are not counted).
    pub killed: usize,
    /// The lab's cgroup, if it was removed.
    pub cgroup: Option<PathBuf>,
    /// Directories removed (state, logs, daemons' directories).
    pub dirs: Vec<PathBuf>,
}

impl DownReport {
    /// Whether there was nothing to remove.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty() && self.cgroup.is_none() && self.dirs.is_empty()
    }
}

/// The lab: several "machines" made of network namespaces on one bridge.
///
/// A value made by [`Lab::up`] owns the lab: it holds the lab's lock for its whole life (so the
/// tests using it run one at a time, across processes too) and removes the lab when dropped,
/// also when a test panics. [`Lab::detach`] keeps the lab instead (that is `tardi lab up`);
/// [`Lab::open`] acts on a lab that exists already.
#[derive(Debug)]
pub struct Lab {
    state: LabState,
    layout: Layout,
    /// Held for the value's life (when given).
    _lock: Option<LabLock>,
    /// Daemons this process started and has not reaped, by node.
    children: HashMap<String, Child>,
    /// Whether dropping this value removes the lab.
    owned: bool,
    progress: bool,
    ready_timeout: Duration,
    /// Whether `up` may create cgroups.
    cgroups: bool,
}

impl Lab {
    /// Builds a lab: namespaces, bridge, links, cgroups, then the daemons (orchestrators first),
    /// each waited for until it accepts connections. On error everything created is removed.
    ///
    /// A lab that exists already is an error ([`LabError::AlreadyUp`]), except the leftovers of
    /// a lab whose owning `Lab` value died without removing it (a killed test): those are
    /// removed first.
    pub fn up(opts: LabOptions) -> Result<Lab> {
        let layout = Layout::new(opts.machines, opts.orchestrators)?;
        network::check_ip()?;
        let lock = LabLock::acquire(opts.lock_wait)?;
        clear_orphan(opts.progress)?;
        let mut state = LabState::new(&layout, Owner::Held, opts.daemons.clone());
        state.tls = opts.tls;
        state.save()?;
        let mut lab = Lab {
            cgroups: opts.cgroups,
            state,
            layout,
            _lock: Some(lock),
            children: HashMap::new(),
            owned: true,
            progress: opts.progress,
            ready_timeout: opts.ready_timeout,
        };
        // On error, dropping `lab` removes what was built.
        lab.build()?;
        Ok(lab)
    }

    /// The lab that exists (from its state file), without removing it when dropped. With
    /// `lock_wait`, holds the lab's lock (needed to change the lab); without, only reads it.
    pub fn open(lock_wait: Option<Duration>) -> Result<Lab> {
        let lock = lock_wait.map(LabLock::acquire).transpose()?;
        let state = LabState::load()?.ok_or(LabError::NoLab)?;
        let layout = state.layout()?;
        Ok(Lab {
            state,
            layout,
            _lock: lock,
            children: HashMap::new(),
            owned: false,
            progress: false,
            ready_timeout: Duration::from_secs(10),
            cgroups: true,
        })
    }

    /// Removes whatever exists of a lab, from what it finds (namespaces `tlab-*`, the lab's
    /// cgroup, `/run/tardi-lab`), so it also works after a crash or without a state file.
    pub fn down_all(lock_wait: Duration, progress: bool) -> Result<DownReport> {
        let _lock = LabLock::acquire(lock_wait)?;
        teardown(progress)
    }

    /// Removes this lab now (see [`Lab::down_all`]) and reports what was removed.
    pub fn down(mut self) -> Result<DownReport> {
        self.owned = false;
        self.teardown_now()
    }

    /// Keeps the lab after this value is gone (`tardi lab up`): records it as detached and
    /// releases the lock. Only `down` removes it then.
    pub fn detach(mut self) -> Result<()> {
        self.owned = false;
        self.state.owner = Owner::Detached;
        self.state.save()
    }

    /// Print a line per step on stderr (as [`LabOptions::progress`]).
    pub fn set_progress(&mut self, on: bool) {
        self.progress = on;
    }

    /// Where the lab is.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The recorded state.
    pub fn state(&self) -> &LabState {
        &self.state
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Result<&Node> {
        self.layout.node(name)
    }

    /// The address of node `name` on the lab subnet.
    pub fn address(&self, name: &str) -> Result<Ipv4Addr> {
        Ok(self.node(name)?.address)
    }

    /// Where the daemon of node `name` listens.
    pub fn api(&self, name: &str) -> Result<SocketAddrV4> {
        let node = self.node(name)?;
        node.api().ok_or_else(|| LabError::NodeState {
            node: name.to_string(),
            reason: "runs no daemon".into(),
        })
    }

    /// The value of `TARDI_ORCHESTRATOR` in the nodes.
    pub fn orchestrator_url(&self) -> String {
        self.layout.orchestrator_url()
    }

    /// The lab as `up --json` prints it.
    pub fn summary(&self) -> Summary {
        Summary {
            nodes: self
                .layout
                .nodes()
                .iter()
                .map(|n| NodeSummary {
                    name: n.name.clone(),
                    role: n.role,
                    namespace: n.namespace(),
                    address: n.address,
                    api: n.api().map(|a| a.to_string()),
                })
                .collect(),
            orchestrator: self.layout.orchestrator_url(),
            orchestrators: self.layout.orchestrator_urls(),
            subnet: format!("{}/{SUBNET_PREFIX}", layout::SUBNET),
            service_subnet: format!("{SERVICE_SUBNET}/{SERVICE_PREFIX}"),
        }
    }

    /// The environment of every command run in `node`: `TARDI_ORCHESTRATOR`, and
    /// `TARDI_TLS_DIR` (the node's identity) or `TARDI_INSECURE_PLAINTEXT=1`, so that
    /// `tardi status` and the other commands work in a node unchanged.
    pub fn node_env(&self, node: &Node) -> Vec<(&'static str, String)> {
        let mut env = vec![(ORCHESTRATOR_ENV, self.orchestrator_url())];
        if self.state.tls {
            env.push((TLS_DIR_ENV, node.tls_dir().to_string_lossy().into_owned()));
        } else {
            env.push((PLAINTEXT_ENV, "1".into()));
        }
        env
    }

    /// A command running `program` in node `name` (its namespace and cgroup, with
    /// [`Lab::node_env`] set); add arguments and stdio as with any [`Command`].
    pub fn command(&self, name: &str, program: impl AsRef<OsStr>) -> Result<Command> {
        let node = self.node(name)?;
        let cg = self.state.cgroup_of(node);
        node_command(
            &node.namespace(),
            cg.as_deref(),
            &self.node_env(node),
            program,
            &[] as &[&str],
            Session::Same,
        )
    }

    /// Runs `argv` in node `name` to completion, capturing its output (stdin from /dev/null).
    /// A non-zero exit is not an error here: look at `status`.
    pub fn exec<S: AsRef<OsStr>>(&self, name: &str, argv: &[S]) -> Result<Output> {
        let (program, args) = split_argv(name, argv)?;
        let mut cmd = self.command(name, program)?;
        cmd.args(args).stdin(Stdio::null());
        cmd.output()
            .ctx(|| format!("node {name}: running `{}`", crate::cmd::display(&cmd)))
    }

    /// Starts `argv` in node `name` (stdin from /dev/null, stdout and stderr inherited). It is
    /// in the node's cgroup: [`Lab::kill`] and [`Lab::down`] kill it.
    pub fn spawn_in<S: AsRef<OsStr>>(&self, name: &str, argv: &[S]) -> Result<Child> {
        let (program, args) = split_argv(name, argv)?;
        let mut cmd = self.command(name, program)?;
        cmd.args(args).stdin(Stdio::null());
        cmd.spawn()
            .ctx(|| format!("node {name}: starting `{}`", crate::cmd::display(&cmd)))
    }

    /// The pid of node `name`'s daemon (last started), if it has one.
    pub fn daemon_pid(&self, name: &str) -> Result<Option<u32>> {
        self.node(name)?;
        Ok(self
            .state
            .nodes
            .iter()
            .find(|n| n.name == name)
            .and_then(|n| n.pid))
    }

    /// The log of node `name`'s daemon (stdout and stderr).
    pub fn log_path(&self, name: &str) -> Result<PathBuf> {
        Ok(self.node(name)?.log_path())
    }

    /// Copies every daemon's log into `dir` (created); how many were copied. The lab removes
    /// its logs with itself: for keeping them after a failure.
    pub fn copy_logs(&self, dir: &Path) -> std::io::Result<usize> {
        std::fs::create_dir_all(dir)?;
        let mut n = 0;
        for node in self.layout.nodes() {
            let path = node.log_path();
            if let Some(file) = path.file_name().filter(|_| path.exists()) {
                std::fs::copy(&path, dir.join(file))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// The last `lines` lines of every daemon's log, each under a header: for failure messages.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for node in self.layout.nodes() {
            let path = node.log_path();
            if path.exists() {
                out.push_str(&format!(
                    "--- {} (last {lines} lines)\n{}\n",
                    path.display(),
                    daemon::log_tail(&path, lines)
                ));
            }
        }
        out
    }

    /// The pids in node `name`'s cgroup (empty without cgroups).
    pub fn cgroup_pids(&self, name: &str) -> Result<Vec<u32>> {
        let node = self.node(name)?;
        Ok(self
            .state
            .cgroup_of(node)
            .map(|cg| cgroup::pids(&cg))
            .unwrap_or_default())
    }

    /// Runs `f` on a thread inside node `name`'s network namespace (see
    /// [`crate::in_namespace`]): sockets it opens are the node's.
    pub fn in_node<T: Send>(&self, name: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
        netns::in_namespace(&self.node(name)?.namespace(), f)
    }

    /// Power cut: SIGKILLs every process of node `name` at once (through its cgroup, sandboxes
    /// included; by walking `/proc` without cgroups) and sets its link down, so it answers
    /// nothing, not even ARP; the links its processes made (sandboxes' veth pairs) are deleted,
    /// as a reboot would lose them. [`Lab::start`] brings it back.
    pub fn kill(&mut self, name: &str) -> Result<()> {
        let node = self.node(name)?.clone();
        self.step(&format!("{name}: power cut"));
        self.kill_processes(&node)?;
        let deleted = network::clear_node_links(&node)?;
        if !deleted.is_empty() {
            tracing::debug!("{name}: links deleted with the power cut: {deleted:?}");
        }
        network::set_node_link(&node, false)?;
        let ns = self.state.node_mut(name)?;
        ns.alive = false;
        self.state.save()
    }

    /// Brings a killed node back: link up, daemon started and waited for.
    pub fn start(&mut self, name: &str) -> Result<()> {
        let node = self.node(name)?.clone();
        if self.state.node_mut(name)?.alive {
            return Err(LabError::NodeState {
                node: name.into(),
                reason: "is running (kill it first)".into(),
            });
        }
        self.step(&format!("{name}: power on"));
        network::set_node_link(&node, true)?;
        if let Err(e) = self.start_daemon(&node) {
            // Leave it dark, as it was.
            let _ = self.kill_processes(&node);
            let _ = network::set_node_link(&node, false);
            return Err(e);
        }
        self.state.node_mut(name)?.alive = true;
        self.state.save()
    }

    /// A crash of node `name`'s daemon alone: SIGKILLs the daemon, not its sandboxes, which
    /// outlive it as they would on a real machine. [`Lab::restart_daemon`] starts it again.
    pub fn crash_daemon(&mut self, name: &str) -> Result<()> {
        let node = self.node(name)?.clone();
        let ns = self.state.node_mut(name)?;
        if !ns.alive {
            return Err(LabError::NodeState {
                node: name.into(),
                reason: "is powered off".into(),
            });
        }
        let recorded = ns.pid;
        self.step(&format!("{name}: daemon crash"));
        if let Some(mut child) = self.children.remove(name) {
            let _ = child.kill();
            reap(&mut child);
        } else if let Some(pid) = recorded {
            // Started by another lab command: not our child. The recorded pid is only trusted
            // while it is a process of the node's namespace (a pid may be reused).
            let inode = netns::inode(&node.namespace());
            if inode.is_some() && procs::net_ns_of(pid as i32) == inode {
                procs::signal(pid as i32, libc::SIGKILL);
                let t0 = Instant::now();
                while procs::alive(pid) && t0.elapsed() < KILL_WAIT {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        Ok(())
    }

    /// Starts node `name`'s daemon again after [`Lab::crash_daemon`] (killing it first if it
    /// still runs), and waits for it.
    pub fn restart_daemon(&mut self, name: &str) -> Result<()> {
        self.crash_daemon(name)?;
        let node = self.node(name)?.clone();
        self.step(&format!("{name}: daemon restart"));
        self.start_daemon(&node)
    }

    /// Cuts every link of node `name` (its port on the switch goes down); it keeps running.
    pub fn partition(&mut self, name: &str) -> Result<()> {
        let node = self.node(name)?.clone();
        self.step(&format!("{name}: partitioned"));
        network::set_switch_port(&node, false)?;
        self.state.node_mut(name)?.partitioned = true;
        self.state.save()
    }

    /// Restores the links [`Lab::partition`] cut.
    pub fn heal(&mut self, name: &str) -> Result<()> {
        let node = self.node(name)?.clone();
        self.step(&format!("{name}: healed"));
        network::set_switch_port(&node, true)?;
        self.state.node_mut(name)?.partitioned = false;
        self.state.save()
    }

    /// How each node is doing now.
    pub fn status(&self) -> Vec<NodeStatus> {
        self.state
            .nodes
            .iter()
            .map(|n| {
                let state = if !n.alive {
                    "dead"
                } else if n.api.is_none() || matches!(self.state.daemons, Daemons::None) {
                    "up"
                } else {
                    match n.pid {
                        Some(pid) if procs::alive(pid) => "running",
                        Some(_) => "exited",
                        None => "not started",
                    }
                };
                NodeStatus {
                    node: n.clone(),
                    state: state.to_string(),
                }
            })
            .collect()
    }

    fn build(&mut self) -> Result<()> {
        let names: Vec<&str> = self
            .layout
            .nodes()
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        if self.cgroups {
            self.state.cgroup = cgroup::create(&names)?;
        }
        self.state.save()?;
        self.step(&format!(
            "switch {} (bridge {})",
            layout::SWITCH_NS,
            layout::BRIDGE
        ));
        network::create_switch()?;
        for node in self.layout.nodes().to_vec() {
            self.step(&format!(
                "node {} ({}, {}, {})",
                node.name,
                node.role.as_str(),
                node.namespace(),
                node.address
            ));
            network::create_node(&node)?;
        }
        if self.state.tls {
            self.make_certs()?;
        }
        // Orchestrators first: the instances talk to them when they start.
        let mut order: Vec<Node> = self.layout.orchestrators().cloned().collect();
        order.extend(
            self.layout
                .nodes()
                .iter()
                .filter(|n| n.role == Role::Machine)
                .cloned(),
        );
        for node in order {
            self.start_daemon(&node)?;
        }
        Ok(())
    }

    /// The lab's CA and one identity per node (orchestrators and machines named with their
    /// address; the client as a client), in `layout::tls_dir()`.
    fn make_certs(&self) -> Result<()> {
        use tardi_tls::certs::{NodeSpec, Role as CertRole};
        let dir = layout::tls_dir();
        self.step(&format!(
            "TLS: a CA and an identity per node in {}",
            dir.display()
        ));
        let nodes: Vec<NodeSpec> = self
            .layout
            .nodes()
            .iter()
            .map(|n| NodeSpec {
                name: n.name.clone(),
                role: match n.role {
                    Role::Orchestrator => CertRole::Orchestrator,
                    Role::Machine => CertRole::Instance,
                    Role::Client => CertRole::Client,
                },
                addrs: vec![n.address.to_string()],
            })
            .collect();
        // A year: a lab lives for minutes, but one left up must keep working.
        tardi_tls::certs::make(&dir, &nodes, 365, true).map_err(|e| LabError::Certs {
            dir: dir.clone(),
            reason: e.to_string(),
        })?;
        Ok(())
    }

    /// Starts `node`'s daemon (if it has one) and waits until it accepts connections.
    fn start_daemon(&mut self, node: &Node) -> Result<()> {
        let Some(argv) =
            daemon::daemon_command(&self.state.daemons, node, &self.layout, self.state.tls)
        else {
            return Ok(());
        };
        let Some(api) = node.api() else {
            return Ok(());
        };
        self.step(&format!("{}: starting {}", node.name, argv.join(" ")));
        let started = Instant::now();
        let cg = self.state.cgroup_of(node);
        let mut child = daemon::start(node, &argv, cg.as_deref(), &self.node_env(node))?;
        let pid = child.id();
        self.state.node_mut(&node.name)?.pid = Some(pid);
        self.state.save()?;
        let ready = daemon::wait_ready(node, &mut child, api, self.ready_timeout);
        self.children.insert(node.name.clone(), child);
        ready?;
        self.step(&format!(
            "{}: listening on {api} (pid {pid}, {:.1?})",
            node.name,
            started.elapsed()
        ));
        Ok(())
    }

    fn kill_processes(&mut self, node: &Node) -> Result<()> {
        let via_cgroup = match self.state.cgroup_of(node) {
            Some(cg) => cgroup::kill(&cg, KILL_WAIT)?,
            None => false,
        };
        // Without cgroup.kill this is the kill (every process in the node's namespace, with its
        // descendants: the daemons run there); with it, a safety net for processes someone
        // started in the namespace by hand. Recorded pids are not used: they may be reused.
        let inodes: HashSet<u64> = netns::inode(&node.namespace()).into_iter().collect();
        let killed = procs::kill_tree(&inodes);
        if !via_cgroup {
            tracing::debug!("{}: killed {killed} processes by walking /proc", node.name);
        }
        if let Some(mut child) = self.children.remove(&node.name) {
            reap(&mut child);
        }
        Ok(())
    }

    fn teardown_now(&mut self) -> Result<DownReport> {
        let report = teardown(self.progress);
        for (_, mut child) in self.children.drain() {
            reap(&mut child);
        }
        report
    }

    fn step(&self, msg: &str) {
        tracing::info!("lab: {msg}");
        if self.progress {
            eprintln!("tardi lab: {msg}");
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.owned {
            self.owned = false;
            if let Err(e) = self.teardown_now() {
                eprintln!("tardi lab: removing the lab failed: {e}");
            }
        }
    }
}

/// A node and how it is doing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeStatus {
    #[serde(flatten)]
    pub node: NodeState,
    /// `running`, `exited` (its daemon died by itself), `dead` (killed), `up` (no daemon),
    /// `not started`.
    pub state: String,
}

fn split_argv<'a, S: AsRef<OsStr>>(node: &str, argv: &'a [S]) -> Result<(&'a S, &'a [S])> {
    argv.split_first().ok_or_else(|| LabError::NodeState {
        node: node.to_string(),
        reason: "empty command".into(),
    })
}

/// Waits a little for a killed child so it does not linger as a zombie.
fn reap(child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// With the lock held: if what exists is a held lab whose owner is gone, removes it; if another
/// lab exists, [`LabError::AlreadyUp`].
fn clear_orphan(progress: bool) -> Result<()> {
    let state = LabState::load();
    let leftovers = !netns::lab_namespaces()?.is_empty()
        || cgroup::lab_cgroup().is_some_and(|c| c.exists())
        || Path::new(layout::RUN_DIR).exists();
    match state {
        Ok(Some(s)) if s.owner == Owner::Held => {
            // Its owner held the lock while alive; we hold it now, so the owner is gone.
            if progress {
                eprintln!(
                    "tardi lab: removing a lab left by process {} (it ended without removing it)",
                    s.creator_pid
                );
            }
            teardown(progress).map(drop)
        }
        Ok(None) if !leftovers => Ok(()),
        _ => Err(LabError::AlreadyUp),
    }
}

/// Removes everything of the lab that exists. Goes on after an error and reports all of them at
/// the end.
fn teardown(progress: bool) -> Result<DownReport> {
    let say = |m: &str| {
        tracing::info!("lab: {m}");
        if progress {
            eprintln!("tardi lab: {m}");
        }
    };
    let mut errors: Vec<String> = Vec::new();
    let mut report = DownReport::default();
    let lab_cg = cgroup::lab_cgroup().filter(|c| c.exists());

    // 1. Kill every process: the whole cgroup at once, then whatever is left in the namespaces.
    if let Some(cg) = &lab_cg {
        say(&format!("killing the processes in {}", cg.display()));
        if let Err(e) = cgroup::kill(cg, KILL_WAIT) {
            errors.push(e.to_string());
        }
    }
    let namespaces = match netns::lab_namespaces() {
        Ok(n) => n,
        Err(e) => {
            errors.push(e.to_string());
            Vec::new()
        }
    };
    let inodes: HashSet<u64> = namespaces.iter().filter_map(|n| netns::inode(n)).collect();
    report.killed = procs::kill_tree(&inodes);
    if report.killed > 0 {
        say(&format!("killed {} processes", report.killed));
    }

    // 2. Namespaces (their interfaces go with them).
    for ns in namespaces {
        say(&format!("deleting namespace {ns}"));
        match netns::delete(&ns) {
            Ok(()) => report.namespaces.push(ns),
            Err(e) => errors.push(e.to_string()),
        }
    }

    // 3. Cgroups, once empty.
    if let Some(cg) = lab_cg {
        let deadline = Instant::now() + KILL_WAIT;
        while cgroup::populated(&cg) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        say(&format!("removing cgroup {}", cg.display()));
        match cgroup::remove(&cg) {
            Ok(()) => report.cgroup = Some(cg),
            Err(e) => errors.push(e.to_string()),
        }
    }

    // 4. State, logs, the daemons' directories.
    for dir in [layout::RUN_DIR, layout::STATE_DIR] {
        let dir = PathBuf::from(dir);
        if !dir.exists() {
            continue;
        }
        say(&format!("removing {}", dir.display()));
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => report.dirs.push(dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("removing {}: {e}", dir.display())),
        }
    }
    if errors.is_empty() {
        Ok(report)
    } else {
        Err(LabError::Teardown(errors))
    }
}
