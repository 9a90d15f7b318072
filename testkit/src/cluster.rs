//! A replicated cluster on the lab (network namespaces, real `tardi orchestrator` and
//! `tardi instance` daemons), for the integration tests, the fault campaign and the benchmarks.
//! One lab exists at a time: [`Builder::try_up`] queues for its lock, and dropping the cluster
//! removes it (also when a test fails; the daemons' logs can be kept, see
//! [`Builder::keep_logs_on_panic`]).
//!
//! Each action comes twice: `try_*` returns a `Result` (the campaign and the benchmarks carry on
//! after a failure), the plain form panics with the daemons' logs in the message (the tests).

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};
use tardi_lab::{Daemons, Lab, LabError, LabOptions};

/// Where the lab's daemons write their logs.
const LOG_DIR: &str = "/run/tardi-lab/logs";

/// How a [`Cluster`] is brought up: see [`Cluster::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    exe: PathBuf,
    machines: usize,
    orchestrators: usize,
    orchestrator_args: Vec<String>,
    instance_args: Vec<String>,
    queue: Option<Duration>,
    register_wait: Option<Duration>,
    keep_logs: Option<PathBuf>,
}

impl Builder {
    /// Machine nodes `m1`…`mN` (3 unless set).
    pub fn machines(mut self, n: usize) -> Builder {
        self.machines = n;
        self
    }

    /// Orchestrator nodes `o1`…`oK` (1 unless set).
    pub fn orchestrators(mut self, n: usize) -> Builder {
        self.orchestrators = n;
        self
    }

    /// Arguments added to every `tardi orchestrator` (e.g. a longer failure timeout).
    pub fn orchestrator_args<S: AsRef<str>>(mut self, args: &[S]) -> Builder {
        self.orchestrator_args = args.iter().map(|s| s.as_ref().to_string()).collect();
        self
    }

    /// Arguments added to every `tardi instance`.
    pub fn instance_args<S: AsRef<str>>(mut self, args: &[S]) -> Builder {
        self.instance_args = args.iter().map(|s| s.as_ref().to_string()).collect();
        self
    }

    /// Waits up to `limit` in all for a lab that is up already (someone else's, not holding
    /// the lock: `tardi lab up`, another campaign between its steps) to go, instead of failing
    /// at once. The lab's lock is queued for anyway (for 30 min unless this is set).
    pub fn queue(mut self, limit: Duration) -> Builder {
        self.queue = Some(limit);
        self
    }

    /// How long to wait for every machine to register (alive) once the lab is up: 20 s unless
    /// set; `None` does not wait.
    pub fn register_wait(mut self, timeout: Option<Duration>) -> Builder {
        self.register_wait = timeout;
        self
    }

    /// When the thread that owns the cluster panics (a failing test), the daemons' logs are
    /// copied to `dir/<thread name>/` when the cluster is dropped, and the place printed. Tests
    /// pass `CARGO_TARGET_TMPDIR/lab-logs`.
    pub fn keep_logs_on_panic(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.keep_logs = Some(dir.into());
        self
    }

    /// Brings the lab up with the daemons and waits for the machines to register.
    pub fn try_up(self) -> Result<Cluster> {
        let daemons = Daemons::TardiWith {
            exe: self.exe.clone(),
            orchestrator: self.orchestrator_args.clone(),
            instance: self.instance_args.clone(),
        };
        let options = || {
            LabOptions::new(self.machines)
                .orchestrators(self.orchestrators)
                .daemons(daemons.clone())
        };
        let lab = match self.queue {
            None => Lab::up(options()).context("lab up")?,
            Some(limit) => {
                let t0 = Instant::now();
                let mut said = false;
                loop {
                    let mut opts = options();
                    opts.lock_wait = limit
                        .saturating_sub(t0.elapsed())
                        .max(Duration::from_secs(1));
                    match Lab::up(opts) {
                        Ok(l) => break l,
                        Err(LabError::AlreadyUp) if t0.elapsed() < limit => {
                            if !said {
                                eprintln!(
                                    "another lab is up (someone else's); waiting up to {} s for it to go",
                                    limit.as_secs()
                                );
                                said = true;
                            }
                            std::thread::sleep(Duration::from_secs(5));
                        }
                        Err(e) => return Err(e).context("lab up"),
                    }
                }
            }
        };
        let c = Cluster {
            lab,
            exe: self.exe,
            machines: self.machines,
            orchestrators: self.orchestrators,
            keep_logs: self.keep_logs,
        };
        if let Some(timeout) = self.register_wait {
            let machines = self.machines;
            c.try_wait("every machine to register", timeout, |s| {
                s["machines"]
                    .as_array()
                    .is_some_and(|m| m.len() == machines && m.iter().all(|m| m["alive"] == true))
            })?;
        }
        Ok(c)
    }

    /// [`Builder::try_up`], panicking when it fails.
    pub fn up(self) -> Cluster {
        self.try_up().unwrap_or_else(|e| panic!("{e:#}"))
    }
}

/// A lab with the real daemons.
pub struct Cluster {
    pub lab: Lab,
    exe: PathBuf,
    machines: usize,
    orchestrators: usize,
    keep_logs: Option<PathBuf>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let Some(dir) = &self.keep_logs else { return };
        if !std::thread::panicking() {
            return;
        }
        let test = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .replace("::", "-");
        let to = dir.join(test);
        match self.lab.copy_logs(&to) {
            Ok(n) => eprintln!("the lab's {n} daemon logs are kept in {}", to.display()),
            Err(e) => eprintln!("keeping the lab's logs in {} failed: {e}", to.display()),
        }
    }
}

/// `gramine-manifests/redis.manifest` with `extra` appended (say a `[tardi.failover]` table),
/// written to `dir/name`.
pub fn redis_manifest_with(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let redis = crate::root().join("gramine-manifests/redis.manifest");
    let text = std::fs::read_to_string(&redis)
        .unwrap_or_else(|e| panic!("reading {}: {e}", redis.display()));
    let out = dir.join(name);
    std::fs::write(&out, format!("{text}\n{extra}"))
        .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    out
}

/// The entry of service `name` in a status (Null when it has none).
pub fn service_in<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["services"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == name))
        .unwrap_or(&Value::Null)
}

impl Cluster {
    /// A cluster run by the `tardi` binary at `exe` (a library has no `CARGO_BIN_EXE_tardi`:
    /// the tests pass theirs, the examples take a flag).
    pub fn builder(exe: impl Into<PathBuf>) -> Builder {
        Builder {
            exe: exe.into(),
            machines: 3,
            orchestrators: 1,
            orchestrator_args: vec![],
            instance_args: vec![],
            queue: None,
            register_wait: Some(Duration::from_secs(20)),
            keep_logs: None,
        }
    }

    /// The `tardi` binary the daemons run.
    pub fn exe(&self) -> &Path {
        &self.exe
    }

    /// How many machine nodes, orchestrator nodes the lab has.
    pub fn machines(&self) -> usize {
        self.machines
    }

    pub fn orchestrators(&self) -> usize {
        self.orchestrators
    }

    // -----------------------------------------------------------------------------------------
    // The CLI in the client node
    // -----------------------------------------------------------------------------------------

    /// Runs `tardi ARGS` in the client node.
    pub fn try_tardi(&self, args: &[&str]) -> Result<Output> {
        let mut argv = vec![self.exe.display().to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        self.lab
            .exec("client", &argv)
            .context("running tardi in the client node")
    }

    /// [`Cluster::try_tardi`], panicking when it cannot run.
    pub fn tardi(&self, args: &[&str]) -> Output {
        self.try_tardi(args).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Deploys `manifest` with `backups` backups: `tardi deploy --json`'s answer.
    pub fn try_deploy(&self, manifest: &Path, backups: impl ToString) -> Result<Value> {
        let out = self.try_tardi(&[
            "deploy",
            &manifest.display().to_string(),
            "--backups",
            &backups.to_string(),
            "--json",
        ])?;
        if !out.status.success() {
            bail!(
                "deploy failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        serde_json::from_slice(&out.stdout).context("deploy --json")
    }

    /// [`Cluster::try_deploy`], panicking with the daemons' logs when it fails.
    pub fn deploy(&self, manifest: &Path, backups: u32) -> Value {
        self.try_deploy(manifest, backups)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()))
    }

    /// Deploys `manifest` with `backups` backups and waits until its first view is active:
    /// its primary, its first backup, and its address with `port`.
    pub fn deploy_active(
        &self,
        manifest: &Path,
        backups: u32,
        service: &str,
        port: u16,
    ) -> (String, String, std::net::SocketAddr) {
        self.deploy(manifest, backups);
        // Generous: a service with many files (PostgreSQL) on a loaded machine.
        let svc = self.wait_active(service, Duration::from_secs(60), |_| true);
        let to = format!("{}:{port}", svc["address"].as_str().unwrap())
            .parse()
            .unwrap();
        (
            svc["primary"].as_str().unwrap().to_string(),
            svc["backups"][0].as_str().unwrap().to_string(),
            to,
        )
    }

    /// Asserts that `service` is still in its first view with `primary`: nothing failed before
    /// a fault a test injects (a chain that broke would have moved the service).
    pub fn assert_first_view(&self, service: &str, primary: &str) {
        let svc = self.service(service);
        assert_eq!(
            (svc["view"].as_u64(), svc["primary"].as_str()),
            (Some(1), Some(primary)),
            "no failure before the fault: {svc}"
        );
    }

    // -----------------------------------------------------------------------------------------
    // Status
    // -----------------------------------------------------------------------------------------

    /// `tardi status --json` with `args`, or why it failed.
    pub fn try_status(&self, args: &[&str]) -> Result<Value> {
        let mut argv = vec!["status", "--json"];
        argv.extend(args);
        let out = self.try_tardi(&argv)?;
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr));
        }
        serde_json::from_slice(&out.stdout).context("status --json")
    }

    /// `tardi status --json`, panicking when it fails.
    pub fn status(&self) -> Value {
        self.try_status(&[])
            .unwrap_or_else(|e| panic!("status failed: {e:#}"))
    }

    /// `tardi status --json`, Null when it failed (e.g. no leader for a moment).
    pub fn status_or_null(&self) -> Value {
        self.try_status(&[]).unwrap_or(Value::Null)
    }

    /// The entry of service `name` in the status (Null when it has none); panics when the
    /// status fails.
    pub fn service(&self, name: &str) -> Value {
        service_in(&self.status(), name).clone()
    }

    /// The entry of service `name` (Null when it has none or the status failed).
    pub fn service_or_null(&self, name: &str) -> Value {
        service_in(&self.status_or_null(), name).clone()
    }

    /// Polls the status every 50 ms until `ok` holds: that status, or the last one after
    /// `timeout`. A failed status (e.g. every orchestrator briefly out of reach) is waited out
    /// too; `ok` sees it as a string.
    fn poll(&self, timeout: Duration, ok: impl Fn(&Value) -> bool) -> Result<Value, Value> {
        let t0 = Instant::now();
        loop {
            let s = self
                .try_status(&[])
                .unwrap_or_else(|e| Value::String(format!("{e:#}")));
            if ok(&s) {
                return Ok(s);
            }
            if t0.elapsed() > timeout {
                return Err(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `tardi status --json` until `ok` holds, for `timeout` at most.
    pub fn try_wait(
        &self,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        self.poll(timeout, ok)
            .or_else(|s| bail!("timed out after {timeout:?} waiting for {what}; last status: {s}"))
    }

    /// [`Cluster::try_wait`], panicking with the last status and the daemons' logs.
    pub fn wait(&self, what: &str, timeout: Duration, ok: impl Fn(&Value) -> bool) -> Value {
        self.poll(timeout, ok).unwrap_or_else(|s| {
            panic!(
                "timed out after {timeout:?} waiting for {what}; last status:\n{}\n{}",
                serde_json::to_string_pretty(&s).unwrap_or_default(),
                self.logs()
            )
        })
    }

    /// Waits until `service` has an active view whose entry matches `f`: that entry.
    pub fn try_wait_active(
        &self,
        service: &str,
        timeout: Duration,
        f: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let s = self.try_wait(&format!("{service} to be active"), timeout, |st| {
            active(st, service, &f)
        })?;
        Ok(service_in(&s, service).clone())
    }

    /// [`Cluster::try_wait_active`], panicking with the last status and the daemons' logs.
    pub fn wait_active(
        &self,
        service: &str,
        timeout: Duration,
        f: impl Fn(&Value) -> bool,
    ) -> Value {
        let s = self.wait(&format!("{service} to be active"), timeout, |st| {
            active(st, service, &f)
        });
        service_in(&s, service).clone()
    }

    /// The service's entry shows it whole with `lost` machines down: an active view with as
    /// many of its `backups` as the machines left allow (all it wants while a spare is left),
    /// its primary running.
    pub fn whole(&self, svc: &Value, backups: usize, lost: usize) -> bool {
        let can = backups.min(self.machines.saturating_sub(lost + 1));
        svc["active"] == true
            && svc["backups"].as_array().is_some_and(|b| b.len() == can)
            && svc["primary_report"]["state"] == "running"
    }

    /// `service` whole with its `backups` (see [`Cluster::whole`]), every machine alive, a
    /// leader that reaches every orchestrator.
    pub fn steady(&self, s: &Value, service: &str, backups: usize) -> bool {
        self.whole(service_in(s, service), backups, 0)
            && s["machines"]
                .as_array()
                .is_some_and(|m| m.len() == self.machines && m.iter().all(|m| m["alive"] == true))
            && s["cluster"]["from_leader"] == true
            && s["cluster"]["unreachable"]
                .as_array()
                .is_some_and(|u| u.is_empty())
            && s["cluster"]["members"]
                .as_object()
                .is_some_and(|m| m.len() == self.orchestrators)
    }

    // -----------------------------------------------------------------------------------------
    // Nodes and processes
    // -----------------------------------------------------------------------------------------

    /// The names of the sandbox links (`td<i>h`, the host side of a sandbox's veth) in node
    /// `n`: a sandbox that runs there has one.
    pub fn sandbox_links(&self, n: &str) -> Vec<String> {
        let out = self.lab.exec(n, &["ip", "-o", "link", "show"]).unwrap();
        assert!(out.status.success(), "ip link in {n}: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|name| name.trim().split('@').next().unwrap_or("").to_string())
            .filter(|name| name.starts_with("td") && name.ends_with('h'))
            .collect()
    }

    /// The host PID of the `tardi instance` process of machine `m`.
    pub fn instance_pid(&self, m: &str) -> u32 {
        let pids = self.lab.cgroup_pids(m).expect("cgroup pids");
        *pids
            .iter()
            .find(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("instance"))
            })
            .unwrap_or_else(|| panic!("no instance process in {m}"))
    }

    /// The processes of node `m` whose command name is `comm` (a service's, in its sandboxes).
    pub fn service_pids(&self, m: &str, comm: &str) -> Vec<u32> {
        self.lab
            .cgroup_pids(m)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
            })
            .collect()
    }

    /// Waits (20 s at most) until the primary of `service` on node `n` has fenced itself: its
    /// service's processes stay stopped (ten samples in a row, 20 ms apart: the epoch loop's
    /// own pauses last a millisecond) and the fence is in the logs. How long after `t0` the
    /// first of those samples was taken.
    pub fn wait_frozen(&self, n: &str, service: &str, t0: Instant) -> Duration {
        let node = self.lab.node(n).unwrap().clone();
        let pid_file = node.run_dir().join(service).join("init.pid");
        // The sandbox's init and its children (the service), each thread's state.
        let stopped = || -> Option<bool> {
            let init: u32 = std::fs::read_to_string(&pid_file)
                .ok()?
                .trim()
                .parse()
                .ok()?;
            let children =
                std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).ok()?;
            let pids: Vec<&str> = children.split_whitespace().collect();
            if pids.is_empty() {
                return None;
            }
            Some(pids.iter().all(|p| {
                std::fs::read_dir(format!("/proc/{p}/task")).is_ok_and(|tasks| {
                    tasks.flatten().all(|t| {
                        std::fs::read_to_string(t.path().join("stat"))
                            .ok()
                            .and_then(|s| {
                                s.rsplit(')')
                                    .next()
                                    .map(|r| r.trim_start().starts_with('t'))
                            })
                            .unwrap_or(false)
                    })
                })
            }))
        };
        let mut first: Option<Duration> = None;
        let mut run = 0;
        while run < 10 {
            if stopped() == Some(true) {
                first.get_or_insert(t0.elapsed());
                run += 1;
            } else {
                (first, run) = (None, 0);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the cut-off primary on {n} still runs its service after 20 s\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let logs = self.logs();
        assert!(
            logs.contains("primary cut off: freezing its service"),
            "the service on {n} stopped, but not by the fence:\n{logs}"
        );
        first.unwrap()
    }

    /// Reads back from the client node every redis write in `acked` (`key:i`) at `to`: none may
    /// be lost (`what`: when, for the message).
    pub fn assert_no_write_lost(&self, to: std::net::SocketAddr, acked: &[u64], what: &str) {
        let lost = self
            .lab
            .in_node("client", || {
                crate::resp::missing_writes(to, acked.iter().copied())
            })
            .unwrap();
        assert_eq!(lost, 0, "acknowledged writes lost{what}");
    }

    // -----------------------------------------------------------------------------------------
    // The daemons' logs
    // -----------------------------------------------------------------------------------------

    /// The whole log of node `n`'s daemon (empty if there is none).
    pub fn log(&self, n: &str) -> String {
        std::fs::read_to_string(format!("{LOG_DIR}/{n}.log")).unwrap_or_default()
    }

    /// The tail of every daemon's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for n in ["o1", "o2", "o3", "m1", "m2", "m3"] {
            let p = format!("{LOG_DIR}/{n}.log");
            if let Ok(t) = std::fs::read_to_string(&p) {
                let lines: Vec<&str> = t.lines().collect();
                let from = lines.len().saturating_sub(40);
                out.push_str(&format!(
                    "--- {p} (last 40 lines)\n{}\n",
                    lines[from..].join("\n")
                ));
            }
        }
        out
    }

    /// Copies the daemons' logs to `dir`, with `nodes.txt`: what each node holds (its links and
    /// addresses, the processes of its cgroup).
    pub fn save_logs(&self, dir: &Path) -> Result<()> {
        self.lab
            .copy_logs(dir)
            .with_context(|| format!("copying the daemons' logs to {}", dir.display()))?;
        let mut nodes = String::new();
        for n in self.lab.layout().nodes() {
            let ns = n.namespace();
            nodes.push_str(&format!(
                "== {} ({ns})\n{}\n",
                n.name,
                crate::sh(&format!("ip -n {ns} -br link; ip -n {ns} -br addr"))
            ));
            for p in self.lab.cgroup_pids(&n.name).unwrap_or_default() {
                let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                let net = std::fs::read_link(format!("/proc/{p}/ns/net"))
                    .map(|l| l.display().to_string())
                    .unwrap_or_default();
                nodes.push_str(&format!("  pid {p} {} {net}\n", comm.trim()));
            }
        }
        let to = dir.join("nodes.txt");
        std::fs::write(&to, nodes).with_context(|| format!("writing {}", to.display()))
    }

    /// Copies the daemons' logs to `dir/TAG-NODE.log` (best effort: several trials' logs side by
    /// side in one directory).
    pub fn save_logs_tagged(&self, dir: &Path, tag: &str) {
        let _ = std::fs::create_dir_all(dir);
        if let Ok(rd) = std::fs::read_dir(LOG_DIR) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let _ = std::fs::copy(e.path(), dir.join(format!("{tag}-{name}")));
            }
        }
    }
}

/// `service` has an active view in status `st` whose entry matches `f`.
fn active(st: &Value, service: &str, f: impl Fn(&Value) -> bool) -> bool {
    st["services"].as_array().is_some_and(|a| {
        a.iter()
            .any(|x| x["name"] == service && x["active"] == true && f(x))
    })
}
