//! The lab a campaign runs on: machines m1-m3, orchestrators o1-o3 (raft, mutual TLS) and the
//! client node, with the service deployed; its status as the orchestrators report it.

use crate::client::Kind;
use crate::{ORCHESTRATORS, Opts};
use anyhow::{Context, Result, bail};
use common::{root, sh};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tardi_lab::{Daemons, Lab, LabError, LabOptions};
use tracing::{info, warn};

use crate::common;

pub struct Cluster {
    pub lab: Lab,
    tardi: PathBuf,
    /// The service protected, and how many backups it has.
    pub kind: Kind,
    pub backups: usize,
    pub machines: usize,
}

impl Cluster {
    /// A lab, the service deployed with its backups, ready.
    pub fn up(o: &Opts) -> Result<Cluster> {
        let daemons = Daemons::TardiWith {
            exe: o.tardi.clone(),
            orchestrator: vec![],
            instance: vec![],
        };
        let t0 = Instant::now();
        let lab = loop {
            let mut opts = LabOptions::new(o.machines())
                .orchestrators(ORCHESTRATORS)
                .daemons(daemons.clone());
            opts.lock_wait = o
                .lock_wait
                .saturating_sub(t0.elapsed())
                .max(Duration::from_secs(1));
            match Lab::up(opts) {
                Ok(l) => break l,
                Err(LabError::AlreadyUp) if t0.elapsed() < o.lock_wait => {
                    info!("another lab is up; waiting for it to go");
                    std::thread::sleep(Duration::from_secs(5));
                }
                Err(e) => return Err(e).context("lab up"),
            }
        };
        let c = Cluster {
            lab,
            tardi: o.tardi.clone(),
            kind: o.kind,
            backups: o.backups,
            machines: o.machines(),
        };
        let manifest = root().join(format!("gramine-manifests/{}.manifest", o.kind.name()));
        let out = c.tardi(&[
            "deploy",
            &manifest.display().to_string(),
            "--backups",
            &o.backups.to_string(),
            "--json",
        ])?;
        if !out.status.success() {
            bail!(
                "deploy failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        c.wait("the steady state", Duration::from_secs(60), |s| c.steady(s))?;
        info!(
            "lab up, {} deployed in {:.1} s",
            o.kind.name(),
            t0.elapsed().as_secs_f64()
        );
        Ok(c)
    }

    pub fn tardi(&self, args: &[&str]) -> Result<std::process::Output> {
        let mut argv = vec![self.tardi.display().to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        self.lab
            .exec("client", &argv)
            .context("running tardi in the client node")
    }

    /// `tardi status --json` (Null when it failed: e.g. no leader for a moment).
    pub fn status(&self) -> Value {
        self.tardi(&["status", "--json"])
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or(Value::Null)
    }

    pub fn wait(
        &self,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let t0 = Instant::now();
        loop {
            let s = self.status();
            if ok(&s) {
                return Ok(s);
            }
            if t0.elapsed() > timeout {
                bail!("timed out after {timeout:?} waiting for {what}; last status: {s}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Copies the daemons' logs to `dir`.
    pub fn save_logs(&self, dir: &Path) {
        if let Err(e) = self.lab.copy_logs(dir) {
            warn!("copying the daemons' logs to {}: {e}", dir.display());
            return;
        }
        // What the nodes hold: links, and the processes of each node's cgroup.
        let mut nodes = String::new();
        for n in self.lab.layout().nodes() {
            let ns = n.namespace();
            nodes.push_str(&format!(
                "== {} ({ns})\n{}\n",
                n.name,
                sh(&format!("ip -n {ns} -br link; ip -n {ns} -br addr"))
            ));
            for p in self.lab.cgroup_pids(&n.name).unwrap_or_default() {
                let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                let net = std::fs::read_link(format!("/proc/{p}/ns/net"))
                    .map(|l| l.display().to_string())
                    .unwrap_or_default();
                nodes.push_str(&format!("  pid {p} {} {net}\n", comm.trim()));
            }
        }
        let _ = std::fs::write(dir.join("nodes.txt"), nodes);
        info!("logs kept in {}", dir.display());
    }

    /// The service's processes on node `m` (its sandboxes).
    pub fn service_pids(&self, m: &str) -> Vec<u32> {
        let comm = match self.kind {
            Kind::Redis => "redis-server",
            Kind::Memcached => "memcached",
        };
        self.lab
            .cgroup_pids(m)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
            })
            .collect()
    }

    /// The service's entry in a status.
    pub fn service<'a>(&self, s: &'a Value) -> &'a Value {
        s["services"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == self.kind.name()))
            .unwrap_or(&Value::Null)
    }

    /// The service whole (active view, every backup, primary running), every machine alive, a
    /// leader that reaches every orchestrator.
    pub fn steady(&self, s: &Value) -> bool {
        let svc = self.service(s);
        self.whole(svc, 0)
            && s["machines"]
                .as_array()
                .is_some_and(|m| m.len() == self.machines && m.iter().all(|m| m["alive"] == true))
            && s["cluster"]["from_leader"] == true
            && s["cluster"]["unreachable"]
                .as_array()
                .is_some_and(|u| u.is_empty())
            && s["cluster"]["members"]
                .as_object()
                .is_some_and(|m| m.len() == ORCHESTRATORS)
    }

    /// The service's entry shows it whole with `lost` machines down: an active view with as
    /// many backups as the machines left allow (all it wants while a spare is left), its primary
    /// running.
    pub fn whole(&self, svc: &Value, lost: usize) -> bool {
        let can = self.backups.min(self.machines - lost - 1);
        svc["active"] == true
            && svc["backups"].as_array().is_some_and(|b| b.len() == can)
            && svc["primary_report"]["state"] == "running"
    }
}
