//! The per-machine daemon (`tardi instance`): for each service the orchestrator assigns to this
//! machine it is the primary ([`primary`]: runs the sandbox, checkpoints every epoch, streams
//! checkpoints, releases output once decided) or a backup ([`backup`]: checks, queues,
//! acknowledges and applies checkpoints to an in-memory image, and takes over when a view makes
//! it primary). Machines it has no role on for a service are that service's spares.
//!
//! Owns: the roles and their transitions, the checkpoint stream between machines ([`stream`]:
//! a dedicated TCP connection served on `--listen`), the session with the orchestrator (gRPC,
//! heartbeats in one direction, assignments in the other), the link throttle ([`throttle`]),
//! and the rendering of this machine's Prometheus metrics (`--metrics`, served by
//! `tardi-metrics`).
//! Must not touch: how a checkpoint is captured or restored (`tardi-checkpointer`,
//! `tardi-service`), how output is held (`tardi-netfilter`), or which machine plays which role
//! (the orchestrator decides; an instance only follows views, and refuses checkpoints of views
//! it has left).

pub mod backup;
pub mod epoch_log;
pub mod primary;
pub mod stream;
pub mod throttle;

use anyhow::Context;
use backup::Backup;
use primary::Primary;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tardi_orchestrator_client::Orchestrators;
use tardi_proto as pb;
use tardi_sandbox::SandboxConfig;

/// How an instance runs (the `tardi instance` flags).
#[derive(Debug, Clone)]
pub struct Options {
    /// This machine's name in the cluster.
    pub machine: String,
    /// Where the checkpoint stream listens (primaries on other machines connect here; the
    /// address is registered with the orchestrator).
    pub listen: SocketAddr,
    /// The orchestrators (comma-separated `host:port` or URLs): the session and activation
    /// follow the cluster's leader among them.
    pub orchestrator: String,
    /// The interface clients reach services through: the service address is claimed there.
    pub service_if: String,
    /// Where services' private directories live on this machine (`<state_dir>/<service>/...`).
    pub state_dir: PathBuf,
    /// Run directories of this machine's sandboxes (`<run_dir>/<service>`).
    pub run_dir: PathBuf,
    /// Checkpoints a backup queues before it stops acknowledging (Tardigrade's knob).
    pub queue_len: usize,
    /// Bits per second for the checkpoint stream (all backups together); `None`: unlimited.
    pub link_bandwidth: Option<u64>,
    pub heartbeat: Duration,
    /// Append one JSON line per epoch of every primary here ([`epoch_log`]); `None`: no log.
    pub epoch_log: Option<PathBuf>,
    /// Serve Prometheus metrics on `http://ADDR/metrics` ([`metrics`]).
    pub metrics: Option<SocketAddr>,
    /// Mutual TLS (the orchestrator session and the checkpoint streams both ways) or
    /// plaintext.
    pub security: tardi_tls::Security,
    /// Testing only (`--fault-restore FILE`): a takeover's restore fails on purpose, once the
    /// sandbox is set up and before the restored process runs, if this instance removes FILE
    /// (instances given the same file share one fault). `None` in any real deployment.
    pub fault_restore: Option<PathBuf>,
    /// Testing only (`--fault-corrupt-image FILE`): a backup here corrupts its image once, after
    /// applying a checkpoint, if it removes FILE ([`Backup::corrupt_when_removed`]). `None` in
    /// any real deployment.
    pub fault_corrupt_image: Option<PathBuf>,
}

/// One service as assigned to this machine.
pub struct Target {
    pub name: String,
    pub manifest: tardi_manifest::Manifest,
    pub link_index: u32,
    pub view: pb::View,
    pub fresh: bool,
}

/// What every part of the daemon shares.
pub struct Ctx {
    pub opts: Options,
    pub rt: tokio::runtime::Handle,
    machines: Mutex<HashMap<String, String>>,
    pub throttle: Option<Arc<throttle::Throttle>>,
    /// The orchestrator cluster (remembers its leader).
    orchestrators: Orchestrators,
    /// The reconcile thread's inbox.
    events: std::sync::mpsc::Sender<Event>,
}

/// What the reconcile thread acts on.
enum Event {
    /// New assignments from the orchestrator.
    Assign(pb::Assignments),
    /// A role changed by itself (a primary failed): reconcile again with the last assignments.
    Wake,
}

impl Ctx {
    /// This machine's sandbox configuration for a service: the manifest's, with this machine's
    /// run directory, the cluster-wide link index (so the same address everywhere), and the
    /// private directories' host paths under this machine's state directory.
    pub fn sandbox_config(&self, t: &Target) -> anyhow::Result<SandboxConfig> {
        let mut c = SandboxConfig::from_manifest(&t.manifest);
        c.run_dir = self.opts.run_dir.join(&t.name);
        c.link_index = Some(t.link_index);
        for m in &mut c.mounts {
            if let tardi_manifest::MountKind::Bind {
                host_path,
                writable: true,
            } = &mut m.kind
            {
                let rel = host_path.strip_prefix("/").unwrap_or(host_path);
                *host_path = self.opts.state_dir.join(&t.name).join(rel);
                std::fs::create_dir_all(&*host_path)
                    .with_context(|| format!("creating {}", host_path.display()))?;
            }
        }
        Ok(c)
    }

    /// A service started afresh (not restored) starts from its manifest's private directories:
    /// each writable directory this machine keeps for it (see [`Ctx::sandbox_config`]) is
    /// emptied and filled with a copy of the manifest's host directory (`cp -a`: owners, modes
    /// and times kept; the directory's own owner and mode too, which a service such as
    /// PostgreSQL checks), or left empty when this machine has no such directory. What an
    /// earlier run of the service left there is not its state any more: a fresh start means
    /// the manifest's state, and a restore brings the checkpoint's.
    /// `here` is this machine's configuration of the service ([`Ctx::sandbox_config`]).
    pub fn seed_private_dirs(&self, t: &Target, here: &SandboxConfig) -> anyhow::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let manifest = SandboxConfig::from_manifest(&t.manifest);
        for (m, h) in manifest.mounts.iter().zip(&here.mounts) {
            let (
                tardi_manifest::MountKind::Bind {
                    host_path: from,
                    writable: true,
                },
                tardi_manifest::MountKind::Bind { host_path: to, .. },
            ) = (&m.kind, &h.kind)
            else {
                continue;
            };
            if from == to {
                continue;
            }
            std::fs::remove_dir_all(to).with_context(|| format!("emptying {}", to.display()))?;
            std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
            let Ok(meta) = std::fs::metadata(from) else {
                tracing::info!(service = %t.name, dir = %from.display(), "no such directory here: the service starts with an empty one");
                continue;
            };
            if !meta.is_dir() {
                anyhow::bail!(
                    "{} (a writable mount of the manifest) is not a directory",
                    from.display()
                );
            }
            let out = std::process::Command::new("cp")
                .arg("-a")
                .arg(from.join("."))
                .arg(to)
                .output()
                .context("running cp")?;
            if !out.status.success() {
                anyhow::bail!(
                    "copying {} to {}: {}",
                    from.display(),
                    to.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            std::os::unix::fs::chown(to, Some(meta.uid()), Some(meta.gid()))
                .with_context(|| format!("giving {} its owner", to.display()))?;
            std::fs::set_permissions(to, meta.permissions())
                .with_context(|| format!("giving {} its mode", to.display()))?;
            tracing::info!(service = %t.name, from = %from.display(), to = %to.display(), "private directory seeded from the manifest's");
        }
        Ok(())
    }

    /// Tells the reconcile thread that a role changed by itself (a primary failed).
    pub fn wake(&self) {
        let _ = self.events.send(Event::Wake);
    }

    pub fn machine_api(&self, m: &str) -> Option<String> {
        self.machines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(m)
            .cloned()
    }

    /// Asks the orchestrators' leader to activate `view` (following the leader for up to a
    /// second: a primary asks again after a refusal).
    pub async fn activate(&self, service: &str, view: u64) -> anyhow::Result<()> {
        let req = pb::ActivateRequest {
            service: service.to_string(),
            view,
            primary: self.opts.machine.clone(),
        };
        let r = self
            .orchestrators
            .call(Duration::from_secs(1), |mut c, _| {
                let req = req.clone();
                async move { c.activate(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        if r.activated {
            Ok(())
        } else {
            anyhow::bail!("{}", r.error)
        }
    }
}

/// A role this machine plays for one service.
enum Role {
    Primary(Primary),
    /// With the output gate a takeover will use, made in advance (`None` if that failed: the
    /// takeover makes it then).
    Backup(Arc<Backup>, Option<Arc<tardi_netfilter::Gate>>),
    /// Assigned primary but could not start, or its service ended: the reason, reported (as
    /// `failed: WHY`) until the view changes. Nothing of it runs (sandbox, gate and address are
    /// gone). A takeover that failed keeps the image it restored from (a restore only reads
    /// it): its run, and the image. A later view that makes this machine primary again
    /// restores from it; one that makes it a backup keeps it as the backup's image; a machine
    /// left out of the view drops it.
    Failed {
        view: u64,
        why: String,
        image: Option<Box<(u64, tardi_checkpointer::store::Image)>>,
    },
}

/// The roles of this machine, by service.
struct Roles {
    ctx: Arc<Ctx>,
    roles: Mutex<HashMap<String, Role>>,
    /// Services whose role `reconcile` has taken out of `roles` to change it (a takeover, a
    /// start, a stop can take seconds): still reported, with this report, until the new role
    /// is in (or, for a stop, until it has stopped). Without them a heartbeat in that window
    /// would tell the orchestrator the machine holds nothing of the service.
    changing: Mutex<HashMap<String, pb::ServiceReport>>,
    /// The orchestrators' lease: when the last renewal came and how long it lasts (`None`
    /// before the first: an orchestrator that gives none never has a primary fenced).
    lease: Mutex<Option<(Instant, Duration)>>,
}

impl Roles {
    /// A renewal of the orchestrators' lease arrived.
    fn renewed(&self, lease: Duration) {
        *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), lease));
    }

    /// Once the lease ran out, fences (freezes) every primary of this machine whose backups
    /// kept it waiting as long ([`Primary::fence_if_cut_off`]); while the lease is current,
    /// thaws the frozen ones (a newer view that does not make this machine primary stops them
    /// instead, through `reconcile`). Run every few milliseconds by the `fence` thread.
    fn fence_cut_off(&self) {
        let Some((at, lease)) = *self.lease.lock().unwrap_or_else(|e| e.into_inner()) else {
            return;
        };
        let silent = at.elapsed();
        let cut_off = silent > lease * crate::primary::FENCE_AFTER_LEASES;
        for r in self.lock().values() {
            if let Role::Primary(p) = r {
                if cut_off {
                    p.fence_if_cut_off(lease, silent);
                } else if silent <= lease && p.frozen() {
                    p.thaw();
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Role>> {
        self.roles.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changing(&self) -> std::sync::MutexGuard<'_, HashMap<String, pb::ServiceReport>> {
        self.changing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `name`'s role out to change it; it stays reported as `state` meanwhile (see
    /// [`Roles::changing`]), until [`Roles::changed`].
    fn take_for_change(&self, name: &str, view: u64, primary: bool, state: &str) -> Option<Role> {
        // The report first, then the removal: a heartbeat always sees one of them.
        self.changing().insert(
            name.to_string(),
            pb::ServiceReport {
                service: name.to_string(),
                view,
                role: if primary {
                    pb::Role::Primary
                } else {
                    pb::Role::Backup
                } as i32,
                state: state.to_string(),
                ..Default::default()
            },
        );
        self.lock().remove(name)
    }

    fn changed(&self, name: &str) {
        self.changing().remove(name);
    }

    fn backup(&self, service: &str) -> Option<Arc<Backup>> {
        match self.lock().get(service) {
            Some(Role::Backup(b, _)) => Some(b.clone()),
            _ => None,
        }
    }

    /// The view this machine holds `service` in (as its primary, a backup of it, a primary
    /// that failed to start, or one whose role is changing), if it holds it.
    fn view_of(&self, service: &str) -> Option<u64> {
        if let Some(r) = self.changing().get(service) {
            return Some(r.view);
        }
        match self.lock().get(service)? {
            Role::Primary(p) => Some(p.view()),
            Role::Backup(b, _) => Some(b.report().view),
            Role::Failed { view, .. } => Some(*view),
        }
    }

    fn reports(&self) -> Vec<pb::ServiceReport> {
        // Changing ones first (and kept when both are seen: the new role is in by then).
        let changing = self.changing().clone();
        let roles = self.lock();
        let mut out: Vec<pb::ServiceReport> = changing
            .into_values()
            .filter(|r| !roles.contains_key(&r.service))
            .collect();
        out.extend(roles.iter().map(|(name, r)| match r {
            Role::Primary(p) => p.report(),
            Role::Backup(b, _) => {
                let r = b.report();
                pb::ServiceReport {
                    service: name.clone(),
                    view: r.view,
                    role: pb::Role::Backup as i32,
                    state: match &r.broken {
                        Some(e) => format!("backup, chain broken: {e}"),
                        None if r.has_image => "backup".into(),
                        None => "backup, waiting for a full checkpoint".into(),
                    },
                    epoch: r.queued_epoch,
                    decided: r.applied_epoch,
                    epochs_per_sec: r.epochs_per_sec,
                    checkpoint_bytes: r.mean_bytes,
                    backup_lag: r.lag,
                    image_view: r.image_view,
                    scrub_checks: r.scrub_checks,
                    scrub_mismatches: r.scrub_mismatches,
                    scrub_last_mismatch: r.last_mismatch.unwrap_or_default(),
                    ..Default::default()
                }
            }
            Role::Failed { view, why, image } => pb::ServiceReport {
                service: name.clone(),
                view: *view,
                role: pb::Role::Primary as i32,
                state: format!("failed: {why}"),
                // The image it kept, if any: the orchestrator may choose it again.
                image_view: image.as_ref().map_or(0, |i| i.0),
                epoch: image.as_ref().map_or(0, |i| i.1.epoch),
                ..Default::default()
            },
        }));
        out
    }

    /// Brings this machine's roles in line with the orchestrator's assignments. Runs on its
    /// own thread: starting or restoring a service blocks.
    fn reconcile(&self, a: &pb::Assignments) {
        *self.ctx.machines.lock().unwrap_or_else(|e| e.into_inner()) =
            a.machines.clone().into_iter().collect();
        let me = &self.ctx.opts.machine;
        let assigned: BTreeSet<&String> = a.services.iter().map(|s| &s.service).collect();
        // Services no longer assigned here: a spare keeps nothing.
        let gone: Vec<String> = self
            .lock()
            .keys()
            .filter(|k| !assigned.contains(k))
            .cloned()
            .collect();
        for name in gone {
            let view = self.lock().get(&name).map_or(0, role_view);
            if let Some(r) = self.take_for_change(&name, view, false, "stopping") {
                tracing::warn!(service = %name, "no longer assigned here; stopping");
                stop(r);
            }
            self.changed(&name);
        }
        for s in &a.services {
            let Some(view) = s.view.clone() else { continue };
            let target =
                match tardi_manifest::parse(&s.manifest, std::path::Path::new(&s.manifest_path)) {
                    Ok(m) => Target {
                        name: s.service.clone(),
                        manifest: m,
                        link_index: s.link_index,
                        view: view.clone(),
                        fresh: s.fresh,
                    },
                    Err(e) => {
                        let old = self.lock().insert(
                            s.service.clone(),
                            Role::Failed {
                                view: view.number,
                                why: format!("the manifest is not valid here: {e}"),
                                image: None,
                            },
                        );
                        if let Some(r) = old {
                            stop(r);
                        }
                        continue;
                    }
                };
            let primary_here = view.primary == *me;
            let current =
                self.take_for_change(&s.service, view.number, primary_here, "changing role");
            let next = match (current, primary_here) {
                (Some(Role::Primary(p)), true) if !p.failed() => {
                    p.set_view(&view);
                    Role::Primary(p)
                }
                // Its service ended (or its chain broke): stop what is left of it (the sandbox
                // is gone already; the gate and the address go with it) and report why, for
                // the orchestrator to move the service elsewhere.
                (Some(Role::Primary(p)), true) if p.view() == view.number || !target.fresh => {
                    let why = p.failure().unwrap_or_default();
                    tracing::warn!(service = %s.service, view = view.number, %why, "primary failed; reporting it");
                    p.stop();
                    Role::Failed {
                        view: view.number,
                        why,
                        image: None,
                    }
                }
                (
                    Some(Role::Failed {
                        view: v,
                        why,
                        image,
                    }),
                    true,
                ) if v == view.number => Role::Failed {
                    view: v,
                    why,
                    image,
                },
                // A new view makes this machine primary again after its takeover failed: the
                // image it kept is still the state it had (a restore only reads it).
                (
                    Some(Role::Failed {
                        image: Some(kept), ..
                    }),
                    true,
                ) => {
                    let (run, image) = *kept;
                    tracing::warn!(service = %s.service, view = view.number, from_run = run, epoch = image.epoch, "taking over again from the image a failed takeover kept");
                    let survivors = view.backups.iter().cloned().collect();
                    self.start_primary(&target, Some((run, image)), survivors, None)
                }
                (Some(Role::Backup(b, gate)), true) => self.take_over(&target, &b, gate),
                (other, true) => {
                    if let Some(r) = other {
                        stop(r);
                    }
                    if target.fresh {
                        self.start_primary(&target, None, BTreeSet::new(), None)
                    } else {
                        Role::Failed {
                            view: view.number,
                            why: "assigned primary of a running service, but this machine holds no image of it".into(),
                            image: None,
                        }
                    }
                }
                (Some(Role::Backup(b, gate)), false) => {
                    b.enter_view(view.number);
                    Role::Backup(b, gate)
                }
                // Its takeover failed but it kept the image: a backup again, holding it (the
                // orchestrator keeps it in the next view as one that holds the state).
                (
                    Some(Role::Failed {
                        image: Some(kept), ..
                    }),
                    false,
                ) => {
                    let (run, image) = *kept;
                    tracing::warn!(service = %s.service, view = view.number, from_run = run, epoch = image.epoch, "backup again, with the image a failed takeover kept");
                    let gate = primary::open_gate(s.link_index)
                        .inspect_err(|e| tracing::warn!(service = %s.service, error = %e, "cannot prepare the output gate; a takeover will"))
                        .ok();
                    Role::Backup(
                        Backup::with_image(
                            &s.service,
                            view.number,
                            self.ctx.opts.queue_len,
                            run,
                            image,
                        ),
                        gate,
                    )
                }
                (other, false) => {
                    if let Some(r) = other {
                        stop(r);
                    }
                    let gate = primary::open_gate(s.link_index)
                        .inspect_err(|e| tracing::warn!(service = %s.service, error = %e, "cannot prepare the output gate; a takeover will"))
                        .ok();
                    let b = Backup::new(&s.service, view.number, self.ctx.opts.queue_len);
                    if let Some(f) = &self.ctx.opts.fault_corrupt_image {
                        b.corrupt_when_removed(f.clone());
                    }
                    Role::Backup(b, gate)
                }
            };
            self.lock().insert(s.service.clone(), next);
            self.changed(&s.service);
        }
    }

    /// A backup becomes primary: finish applying what it acknowledged, restore from the image.
    fn take_over(
        &self,
        t: &Target,
        b: &Arc<Backup>,
        gate: Option<Arc<tardi_netfilter::Gate>>,
    ) -> Role {
        let t0 = std::time::Instant::now();
        let (run, image) = match b.finish(t.view.number) {
            Ok(x) => x,
            Err(why) => {
                return Role::Failed {
                    view: t.view.number,
                    why,
                    image: None,
                };
            }
        };
        tracing::warn!(service = %t.name, view = t.view.number, from_run = run, epoch = image.epoch, drained_ms = t0.elapsed().as_millis() as u64, "taking over");
        // The view's backups are the survivors of the last active view: they hold every
        // decided checkpoint, so decisions wait for them from the start.
        let survivors = t.view.backups.iter().cloned().collect();
        self.start_primary(t, Some((run, image)), survivors, gate)
    }

    /// Starts the primary (fresh, or restored from `from`: a primary run's image); if that
    /// fails, a failed role that keeps the image.
    fn start_primary(
        &self,
        t: &Target,
        from: Option<(u64, tardi_checkpointer::store::Image)>,
        required: BTreeSet<String>,
        gate: Option<Arc<tardi_netfilter::Gate>>,
    ) -> Role {
        let (run, image) = match from {
            Some((r, i)) => (r, Some(i)),
            None => (0, None),
        };
        match Primary::start(self.ctx.clone(), t, image, required, gate) {
            Ok(p) => Role::Primary(p),
            Err(f) => {
                let why = error_text(&f.error);
                tracing::error!(service = %t.name, %why, kept_image = f.image.is_some(), "cannot start the primary");
                Role::Failed {
                    view: t.view.number,
                    why,
                    image: f.image.map(|i| Box::new((run, *i))),
                }
            }
        }
    }
}

/// An error with its causes, each once: the libraries' messages already quote their source
/// (`tardi-service`'s do), which `{:#}` would print again.
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if out.contains(&c) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&c);
    }
    out
}

fn stop(r: Role) {
    match r {
        Role::Primary(p) => p.stop(),
        Role::Backup(b, _) => b.stop(),
        Role::Failed { .. } => {}
    }
}

/// The Prometheus exposition of this machine: per service, its role and what its report says
/// (the same figures the heartbeats carry to the orchestrator).
fn metrics(machine: &str, reports: &[pb::ServiceReport]) -> String {
    let mut e = tardi_metrics::Exposition::new();
    e.gauge(
        "tardi_instance_services",
        "Services this machine is primary or backup of.",
        &[("machine", machine)],
        reports.len() as f64,
    );
    e.counter(
        "tardi_instance_tcp_reset_at_restore_total",
        "TCP connections a takeover's restore on this machine reset instead of carrying them on (their state could not be read or recreated; each is also logged).",
        &[("machine", machine)],
        tardi_checkpointer::tcp::reset_at_restore() as f64,
    );
    for r in reports {
        let role = match pb::Role::try_from(r.role) {
            Ok(pb::Role::Primary) if r.state.starts_with("failed") => "failed",
            Ok(pb::Role::Primary) => "primary",
            Ok(pb::Role::Backup) => "backup",
            _ => "other",
        };
        let l = [("machine", machine), ("service", r.service.as_str())];
        e.gauge(
            "tardi_instance_role",
            "1 for the role this machine plays for the service.",
            &[
                ("machine", machine),
                ("service", r.service.as_str()),
                ("role", role),
            ],
            1.0,
        );
        e.gauge(
            "tardi_instance_view",
            "The view this machine follows for the service.",
            &l,
            r.view as f64,
        );
        e.gauge(
            "tardi_instance_epoch",
            "Primary: last epoch produced. Backup: last epoch acknowledged (queued).",
            &l,
            r.epoch as f64,
        );
        e.gauge("tardi_instance_decided_epoch", "Primary: last epoch decided (output released). Backup: last epoch applied to the image.", &l, r.decided as f64);
        e.gauge(
            "tardi_instance_epochs_per_second",
            "Recent epoch (primary) or apply (backup) rate.",
            &l,
            r.epochs_per_sec,
        );
        e.gauge(
            "tardi_instance_checkpoint_bytes",
            "Mean encoded size of recent checkpoints.",
            &l,
            r.checkpoint_bytes as f64,
        );
        if r.role == pb::Role::Primary as i32 {
            e.counter(
                "tardi_instance_full_checkpoints_total",
                "Primary: full checkpoints taken since it started (a backup joining, or a backup's chain restarting).",
                &l,
                r.full_checkpoints as f64,
            );
        }
        if r.role == pb::Role::Backup as i32 {
            e.counter(
                "tardi_instance_scrub_checks_total",
                "Backup: divergence checks of its image against the primary's digests.",
                &l,
                r.scrub_checks as f64,
            );
            e.counter(
                "tardi_instance_scrub_mismatches_total",
                "Backup: divergence checks that found its image differed from the primary's process (the image was dropped and re-seeded by a full checkpoint).",
                &l,
                r.scrub_mismatches as f64,
            );
        }
        e.gauge(
            "tardi_instance_lag",
            "Primary: epochs produced, not decided. Backup: checkpoints queued, not applied.",
            &l,
            r.backup_lag as f64,
        );
        if role == "primary" {
            e.gauge(
                "tardi_instance_held_packets",
                "Output packets held until their epoch is decided.",
                &l,
                r.held_packets as f64,
            );
            e.gauge(
                "tardi_instance_held_bytes",
                "Bytes of held output.",
                &l,
                r.held_bytes as f64,
            );
            e.gauge(
                "tardi_instance_pause_p50_seconds",
                "Median of recent checkpoint pauses.",
                &l,
                r.pause_p50_us as f64 / 1e6,
            );
            e.gauge(
                "tardi_instance_pause_p99_seconds",
                "99th percentile of recent checkpoint pauses.",
                &l,
                r.pause_p99_us as f64 / 1e6,
            );
            if r.takeover_us > 0 {
                e.gauge(
                    "tardi_instance_takeover_seconds",
                    "How long this primary's takeover took (restore to serving).",
                    &l,
                    r.takeover_us as f64 / 1e6,
                );
            }
        }
    }
    e.render()
}

/// Serves the checkpoint stream: one thread per connection, one checkpoint at a time, each
/// answered by its acknowledgement once the backup queued it (or refused it: the connection
/// then closes). A connection that does not open with the stream's hello (a port probe, a
/// stray client) is closed.
fn serve_streams(
    listener: std::net::TcpListener,
    roles: Arc<Roles>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a checkpoint stream failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let (roles, tls) = (roles.clone(), tls.clone());
        let spawned = std::thread::Builder::new()
            .name("stream-in".into())
            .spawn(move || {
                let peer = conn.peer_addr().ok();
                match stream::Accepted::accept(conn, tls, Duration::from_secs(2)) {
                    // Closed before a byte: a port probe (the lab's readiness check).
                    Err(stream::StreamError::Handshake(e) | stream::StreamError::Io(e))
                        if e.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        tracing::debug!(?peer, error = %e, "checkpoint stream closed at once");
                    }
                    Err(e) => {
                        tracing::warn!(?peer, error = %e, "checkpoint stream refused");
                    }
                    Ok(io) => {
                        if let Err(e) = serve_stream(io, &roles) {
                            tracing::debug!(?peer, error = %e, "checkpoint stream ended");
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread for a checkpoint stream");
        }
    }
}

fn serve_stream(conn: stream::Accepted, roles: &Roles) -> Result<(), stream::StreamError> {
    let mut input = std::io::BufReader::with_capacity(256 << 10, conn);
    while let Some(m) = stream::read_checkpoint(&mut input)? {
        tracing::trace!(epoch = m.epoch, bytes = m.data.len(), "checkpoint received");
        let (service, view, epoch) = (m.service.clone(), m.view, m.epoch);
        let result = match roles.backup(&m.service) {
            None => Err(backup::Refusal::NotBackup(m.service.clone())),
            Some(b) => b.receive(m.view, m.run, m.epoch, Vec::from(m.data)),
        };
        let refused = result.is_err();
        // Refused for a newer view: the sender is deposed and should stop retrying.
        let newer_view = match &result {
            Err(backup::Refusal::OldView { have, .. }) => *have,
            Err(backup::Refusal::NotBackup(_)) => {
                roles.view_of(&service).filter(|&v| v > view).unwrap_or(0)
            }
            _ => 0,
        };
        let ack = pb::Ack {
            service,
            view,
            epoch,
            error: result.err().map(|e| e.to_string()).unwrap_or_default(),
            newer_view,
        };
        if refused {
            tracing::warn!(service = %ack.service, view, epoch, error = %ack.error, "checkpoint refused");
        }
        stream::write_ack(input.get_mut(), &ack)?;
        if refused {
            break;
        }
    }
    Ok(())
}

/// Removes the sandboxes a previous run of this daemon left behind (killed with SIGKILL: its
/// sandboxes outlive it, holding their names and addresses, and a takeover or start of the
/// same service here would fail). The run directory is this daemon's own: nothing else runs
/// there. Found by the fault campaign (docs/RELIABILITY.md).
fn reap_leftovers(run_dir: &std::path::Path) {
    let Ok(dirs) = std::fs::read_dir(run_dir) else {
        return;
    };
    for d in dirs.flatten().filter(|d| d.path().is_dir()) {
        let name = d.file_name().to_string_lossy().into_owned();
        match tardi_sandbox::Sandbox::reap_leftover(&d.path()) {
            Ok(Some(pid)) => tracing::warn!(
                service = %name,
                init = pid,
                "killed a sandbox left running by a previous run of this daemon"
            ),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(service = %name, error = %e, "removing what a previous run left failed")
            }
        }
    }
}

/// Runs the daemon until SIGINT/SIGTERM.
pub fn run(opts: Options) -> anyhow::Result<()> {
    reap_leftovers(&opts.run_dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Assignments (and wake-ups: a primary failed) are applied on their own thread, newest
    // first (a burst collapses to one).
    let (events, events_rx) = std::sync::mpsc::channel::<Event>();
    let ctx = Arc::new(Ctx {
        throttle: opts
            .link_bandwidth
            .map(|b| Arc::new(throttle::Throttle::new(b))),
        opts: opts.clone(),
        rt: rt.handle().clone(),
        machines: Mutex::new(HashMap::new()),
        orchestrators: Orchestrators::new(&opts.orchestrator, opts.security.clone()),
        events: events.clone(),
    });
    let roles = Arc::new(Roles {
        ctx: ctx.clone(),
        roles: Mutex::new(HashMap::new()),
        changing: Mutex::new(HashMap::new()),
        lease: Mutex::new(None),
    });
    {
        let (roles, every) = (
            roles.clone(),
            (opts.heartbeat / 2).max(Duration::from_millis(2)),
        );
        std::thread::Builder::new()
            .name("fence".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    roles.fence_cut_off();
                }
            })?;
    }
    {
        let roles = roles.clone();
        std::thread::Builder::new()
            .name("reconcile".into())
            .spawn(move || {
                let mut last: Option<pb::Assignments> = None;
                while let Ok(first) = events_rx.recv() {
                    for e in std::iter::once(first).chain(events_rx.try_iter()) {
                        if let Event::Assign(a) = e {
                            last = Some(a);
                        }
                    }
                    if let Some(a) = &last {
                        roles.reconcile(a);
                    }
                }
            })?;
    }
    let listener = std::net::TcpListener::bind(opts.listen)
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    {
        let (roles, tls) = (roles.clone(), opts.security.stream_server());
        std::thread::Builder::new()
            .name("stream-accept".into())
            .spawn(move || serve_streams(listener, roles, tls))?;
    }
    let result = rt.block_on(async {
        let _metrics = match opts.metrics {
            Some(addr) => {
                let (roles, machine) = (roles.clone(), opts.machine.clone());
                let render: tardi_metrics::Render =
                    Arc::new(move || metrics(&machine, &roles.reports()));
                Some(tardi_metrics::serve(addr, tardi_metrics::router(render)).await?)
            }
            None => None,
        };
        println!(
            "instance {} listening on {}, orchestrator {}",
            opts.machine, opts.listen, opts.orchestrator
        );
        let session = tokio::spawn(session(roles.clone(), events));
        tardi_orchestrator_client::shutdown_signal().await;
        session.abort();
        anyhow::Ok(())
    });
    // Stop every role: primaries tear their sandboxes down.
    let all: Vec<Role> = roles.lock().drain().map(|(_, r)| r).collect();
    for r in all {
        stop(r);
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The view a role was last given.
fn role_view(r: &Role) -> u64 {
    match r {
        Role::Primary(p) => p.report().view,
        Role::Backup(b, _) => b.report().view,
        Role::Failed { view, .. } => *view,
    }
}

/// The session with the orchestrators' leader: heartbeats out, assignments in; reconnects
/// forever, following the leader (a follower refuses the session and names the leader; a dead
/// node is noticed by HTTP/2 keepalive within a few hundred ms).
async fn session(roles: Arc<Roles>, assign: std::sync::mpsc::Sender<Event>) {
    let opts = roles.ctx.opts.clone();
    let orchestrators = &roles.ctx.orchestrators;
    loop {
        let r: anyhow::Result<()> = async {
            let (tx, mut incoming, leader) = orchestrators
                .call(Duration::from_secs(2), |mut c, url| async move {
                    let (tx, rx) = tokio::sync::mpsc::channel::<pb::Heartbeat>(4);
                    let incoming = c
                        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
                        .await?
                        .into_inner();
                    Ok((tx, incoming, url))
                })
                .await?;
            tracing::info!(%leader, "session with the orchestrators' leader");
            let hb_roles = roles.clone();
            let hb_opts = opts.clone();
            let beat = tokio::spawn(async move {
                let mut tick = tokio::time::interval(hb_opts.heartbeat);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tick.tick().await;
                    let hb = pb::Heartbeat {
                        machine: hb_opts.machine.clone(),
                        api: hb_opts.listen.to_string(),
                        services: hb_roles.reports(),
                    };
                    if tx.send(hb).await.is_err() {
                        break;
                    }
                }
            });
            let r = async {
                while let Some(a) = incoming.message().await? {
                    if a.renewal {
                        roles.renewed(Duration::from_millis(a.lease_ms));
                        continue;
                    }
                    if assign.send(Event::Assign(a)).is_err() {
                        break;
                    }
                }
                anyhow::Ok(())
            }
            .await;
            beat.abort();
            // A session that ends sends us elsewhere: the node may be dead or a follower now.
            orchestrators.forget(&leader);
            r
        }
        .await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "orchestrator session lost; reconnecting");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[test]
    fn error_text_names_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("restore failed: {0}")]
        struct Quoting(#[source] std::io::Error);
        let quoted = anyhow::Error::new(Quoting(std::io::Error::other("it exited")));
        assert_eq!(error_text(&quoted), "restore failed: it exited");
        let layered = anyhow::Error::new(std::io::Error::other("denied")).context("creating /x");
        assert_eq!(error_text(&layered), "creating /x: denied");
    }
}
