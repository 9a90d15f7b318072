//! A replicated cluster on the lab (network namespaces, real `tardi orchestrator` and
//! `tardi instance` daemons) for tests. One lab exists at a time: [`Cluster::up`] queues for it,
//! and dropping the cluster removes it (also when a test fails).

#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};
use tardi_lab::{Daemons, Lab, LabOptions};

pub fn tardi_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tardi"))
}

pub struct Cluster {
    pub lab: Lab,
}

/// A failing test keeps the daemons' logs (the lab removes them with itself): copied to
/// `CARGO_TARGET_TMPDIR/lab-logs/<test>/`, and the place printed.
impl Drop for Cluster {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let test = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .replace("::", "-");
        let to = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("lab-logs")
            .join(test);
        match self.lab.copy_logs(&to) {
            Ok(n) => eprintln!("the lab's {n} daemon logs are kept in {}", to.display()),
            Err(e) => eprintln!("keeping the lab's logs in {} failed: {e}", to.display()),
        }
    }
}

/// `gramine-manifests/redis.manifest` with `extra` appended (say a `[tardi.failover]` table),
/// written to `dir/name`.
pub fn redis_manifest_with(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let redis = crate::common::programs::workspace_root().join("gramine-manifests/redis.manifest");
    let text = std::fs::read_to_string(&redis).unwrap();
    let out = dir.join(name);
    std::fs::write(&out, format!("{text}\n{extra}")).unwrap();
    out
}

impl Cluster {
    /// `machines` machines and one orchestrator; `orchestrator_args` are added to
    /// `tardi orchestrator` (e.g. a longer failure timeout).
    pub fn up(machines: usize, orchestrator_args: &[&str]) -> Cluster {
        Cluster::up_with(machines, 1, orchestrator_args)
    }

    /// `machines` machines and an orchestrator cluster of `orchestrators` nodes.
    pub fn up_with(machines: usize, orchestrators: usize, orchestrator_args: &[&str]) -> Cluster {
        Cluster::up_args(machines, orchestrators, orchestrator_args, &[])
    }

    /// The same, with `instance_args` added to every `tardi instance`.
    pub fn up_args(
        machines: usize,
        orchestrators: usize,
        orchestrator_args: &[&str],
        instance_args: &[&str],
    ) -> Cluster {
        let daemons = Daemons::TardiWith {
            exe: tardi_exe(),
            orchestrator: orchestrator_args.iter().map(|s| s.to_string()).collect(),
            instance: instance_args.iter().map(|s| s.to_string()).collect(),
        };
        let lab = Lab::up(
            LabOptions::new(machines)
                .orchestrators(orchestrators)
                .daemons(daemons),
        )
        .expect("lab up");
        let c = Cluster { lab };
        c.wait("every machine to register", Duration::from_secs(20), |s| {
            s["machines"]
                .as_array()
                .is_some_and(|m| m.len() == machines && m.iter().all(|m| m["alive"] == true))
        });
        c
    }

    /// Runs `tardi ARGS` in the client node.
    pub fn tardi(&self, args: &[&str]) -> Output {
        let mut argv = vec![tardi_exe().display().to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        self.lab
            .exec("client", &argv)
            .expect("running tardi in the client node")
    }

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
                crate::common::resp::missing_writes(to, acked.iter().copied())
            })
            .unwrap();
        assert_eq!(lost, 0, "acknowledged writes lost{what}");
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
        let svc = self.wait_active(service, Duration::from_secs(30), |_| true);
        let to = format!("{}:{port}", svc["address"].as_str().unwrap())
            .parse()
            .unwrap();
        (
            svc["primary"].as_str().unwrap().to_string(),
            svc["backups"][0].as_str().unwrap().to_string(),
            to,
        )
    }

    pub fn deploy(&self, manifest: &Path, backups: u32) -> Value {
        let out = self.tardi(&[
            "deploy",
            &manifest.display().to_string(),
            "--backups",
            &backups.to_string(),
            "--json",
        ]);
        assert!(
            out.status.success(),
            "deploy failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        serde_json::from_slice(&out.stdout).expect("deploy --json")
    }

    pub fn status(&self) -> Value {
        self.try_status(&[])
            .unwrap_or_else(|e| panic!("status failed: {e}"))
    }

    /// `tardi status --json` with `args`, or why it failed.
    pub fn try_status(&self, args: &[&str]) -> Result<Value, String> {
        let mut argv = vec!["status", "--json"];
        argv.extend(args);
        let out = self.tardi(&argv);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("status --json: {e}"))
    }

    pub fn service(&self, name: &str) -> Value {
        let s = self.status();
        s["services"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == name).cloned())
            .unwrap_or(Value::Null)
    }

    /// Polls `tardi status --json` until `ok` holds; panics with the last status and the
    /// daemons' logs after `timeout`.
    pub fn wait(&self, what: &str, timeout: Duration, ok: impl Fn(&Value) -> bool) -> Value {
        let t0 = Instant::now();
        loop {
            // A failed status (e.g. every orchestrator briefly out of reach) is waited out too.
            let s = self.try_status(&[]).unwrap_or_else(Value::String);
            if ok(&s) {
                return s;
            }
            if t0.elapsed() > timeout {
                panic!(
                    "timed out after {timeout:?} waiting for {what}; last status:\n{}\n{}",
                    serde_json::to_string_pretty(&s).unwrap_or_default(),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `service` has an active view whose primary and backups match `f`.
    pub fn wait_active(
        &self,
        service: &str,
        timeout: Duration,
        f: impl Fn(&Value) -> bool,
    ) -> Value {
        let s = self.wait(&format!("{service} to be active"), timeout, |st| {
            st["services"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|x| x["name"] == service && x["active"] == true && f(x))
            })
        });
        s["services"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == service).cloned())
            .unwrap()
    }

    /// The whole log of node `n`'s daemon (empty if there is none).
    pub fn log(&self, n: &str) -> String {
        std::fs::read_to_string(format!("/run/tardi-lab/logs/{n}.log")).unwrap_or_default()
    }

    /// The tail of every daemon's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for n in ["o1", "o2", "o3", "m1", "m2", "m3"] {
            let p = format!("/run/tardi-lab/logs/{n}.log");
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

    /// The host PIDs of the `tardi instance` process of machine `m`.
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
}
