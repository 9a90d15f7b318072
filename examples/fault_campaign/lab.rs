//! The lab a campaign runs on: machines m1-m3, orchestrators o1-o3 (raft, mutual TLS) and the
//! client node, with the service deployed; its status as the orchestrators report it. The lab
//! is driven by `tardi_testkit::cluster` (every `Cluster` method there is reachable here); this
//! adds what is the campaign's: the protected service, its kind and backups.

use crate::client::Kind;
use crate::{ORCHESTRATORS, Opts};
use anyhow::Result;
use serde_json::Value;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::time::{Duration, Instant};
use tardi_testkit::cluster::service_in;
use tardi_testkit::root;
use tracing::{info, warn};

pub struct Cluster {
    kit: tardi_testkit::cluster::Cluster,
    /// The service protected, and how many backups it has.
    pub kind: Kind,
    pub backups: usize,
}

impl Deref for Cluster {
    type Target = tardi_testkit::cluster::Cluster;
    fn deref(&self) -> &Self::Target {
        &self.kit
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.kit
    }
}

impl Cluster {
    /// A lab (waiting up to `--lock-wait` for another one to go), the service deployed with its
    /// backups, ready.
    pub fn up(o: &Opts) -> Result<Cluster> {
        let t0 = Instant::now();
        let kit = tardi_testkit::cluster::Cluster::builder(&o.tardi)
            .machines(o.machines())
            .orchestrators(ORCHESTRATORS)
            .queue(o.lock_wait)
            .register_wait(None)
            .try_up()?;
        let c = Cluster {
            kit,
            kind: o.kind,
            backups: o.backups,
        };
        let manifest = root().join(format!("gramine-manifests/{}.manifest", o.kind.name()));
        c.try_deploy(&manifest, o.backups)?;
        c.try_wait("the steady state", Duration::from_secs(60), |s| {
            c.is_steady(s)
        })?;
        info!(
            "lab up, {} deployed in {:.1} s",
            o.kind.name(),
            t0.elapsed().as_secs_f64()
        );
        Ok(c)
    }

    /// Copies the daemons' logs to `dir` (with `nodes.txt`, what each node holds).
    pub fn keep_logs(&self, dir: &Path) {
        match self.save_logs(dir) {
            Ok(()) => info!("logs kept in {}", dir.display()),
            Err(e) => warn!("{e:#}"),
        }
    }

    /// The service's processes on node `m` (its sandboxes).
    pub fn pids_of_service(&self, m: &str) -> Vec<u32> {
        let comm = match self.kind {
            Kind::Redis => "redis-server",
            Kind::Memcached => "memcached",
        };
        self.service_pids(m, comm)
    }

    /// The service's entry in a status.
    pub fn svc<'a>(&self, s: &'a Value) -> &'a Value {
        service_in(s, self.kind.name())
    }

    /// The service whole (active view, every backup, primary running), every machine alive, a
    /// leader that reaches every orchestrator.
    pub fn is_steady(&self, s: &Value) -> bool {
        self.steady(s, self.kind.name(), self.backups)
    }

    /// The service's entry shows it whole with `lost` machines down (see
    /// `tardi_testkit::cluster::Cluster::whole`).
    pub fn is_whole(&self, svc: &Value, lost: usize) -> bool {
        self.whole(svc, self.backups, lost)
    }
}
