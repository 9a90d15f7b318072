//! The orchestrator's gRPC service: instance sessions (heartbeats in, assignments out), the
//! failure detector, activation, deploy and status.
//!
//! One node today (the cluster of one that the orchestrator-cluster issue replaces by openraft):
//! every state change is a [`Command`] applied to [`Views`]; the detector and RPCs only issue
//! commands.

use crate::views::{Command, View, Views};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tardi_proto as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// How an orchestrator node runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub listen: SocketAddr,
    pub name: String,
    /// An instance silent this long is suspected failed (Tardigrade used 100 ms).
    pub failure_timeout: Duration,
}

struct Inner {
    views: Views,
    /// Last heartbeat per machine (not replicated state: each node measures its own).
    seen: HashMap<String, Instant>,
    reports: HashMap<(String, String), pb::ServiceReport>,
    started: Instant,
}

struct Orch {
    inner: Mutex<Inner>,
    /// Bumped after every state change; sessions push new assignments on change.
    version: watch::Sender<u64>,
    opts: Options,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Orch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves `Views` consistent (commands validate first,
        // then mutate): keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    fn alive(&self, inner: &Inner) -> BTreeSet<String> {
        inner
            .seen
            .iter()
            .filter(|(_, t)| t.elapsed() < self.opts.failure_timeout)
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// One detector round: propose what the live set calls for.
    fn detect(&self) {
        let mut inner = self.lock();
        // A node that just started has not heard from anyone yet: wait one timeout before
        // suspecting (no false failovers after an orchestrator restart).
        if inner.started.elapsed() < self.opts.failure_timeout * 2 {
            return;
        }
        let alive = self.alive(&inner);
        let epochs: BTreeMap<(String, String), (u64, u64)> = inner
            .reports
            .iter()
            .filter(|(_, r)| r.role == pb::Role::Backup as i32)
            .map(|(k, r)| (k.clone(), (r.image_view, r.epoch)))
            .collect();
        let cmds = inner.views.plan(&alive, &epochs, now_ms());
        let mut changed = false;
        for c in cmds {
            match inner.views.apply(&c) {
                Ok(()) => {
                    tracing::warn!(?c, "view change");
                    changed = true;
                }
                Err(e) => tracing::error!(%e, ?c, "planned command refused"),
            }
        }
        drop(inner);
        if changed {
            self.bump();
        }
    }

    fn assignments(&self, machine: &str) -> pb::Assignments {
        let inner = self.lock();
        let services = inner
            .views
            .services
            .values()
            .filter_map(|s| {
                let v = s.latest()?;
                v.members().any(|m| m == machine).then(|| pb::Assignment {
                    service: s.name.clone(),
                    manifest: s.manifest.clone(),
                    manifest_path: s.manifest_path.clone(),
                    link_index: s.link_index,
                    view: Some(to_pb(v)),
                    fresh: v.fresh,
                    backups_wanted: s.backups_wanted,
                })
            })
            .collect();
        pb::Assignments {
            services,
            machines: inner
                .views
                .machines
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }
}

fn to_pb(v: &View) -> pb::View {
    pb::View {
        number: v.number,
        primary: v.primary.clone(),
        backups: v.backups.clone(),
        active: v.active,
    }
}

#[derive(Clone)]
struct Svc(Arc<Orch>);

type SessionStream = Pin<Box<dyn Stream<Item = Result<pb::Assignments, Status>> + Send>>;

#[tonic::async_trait]
impl pb::orchestrator_server::Orchestrator for Svc {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        req: Request<Streaming<pb::Heartbeat>>,
    ) -> Result<Response<SessionStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let orch = self.0.clone();
        tokio::spawn(async move {
            let mut version = orch.version.subscribe();
            let mut machine: Option<String> = None;
            loop {
                tokio::select! {
                    hb = inbound.message() => {
                        let hb = match hb {
                            Ok(Some(hb)) => hb,
                            _ => break,
                        };
                        if hb.machine.is_empty() || hb.machine.len() > 64 {
                            let _ = tx.send(Err(Status::invalid_argument("a heartbeat must name its machine (1-64 bytes)"))).await;
                            break;
                        }
                        let first = machine.is_none();
                        let changed = {
                            let mut inner = orch.lock();
                            inner.seen.insert(hb.machine.clone(), Instant::now());
                            for r in hb.services {
                                inner.reports.insert((hb.machine.clone(), r.service.clone()), r);
                            }
                            if inner.views.machines.get(&hb.machine) != Some(&hb.api) {
                                let _ = inner.views.apply(&Command::Register { machine: hb.machine.clone(), api: hb.api.clone() });
                                true
                            } else {
                                false
                            }
                        };
                        if changed {
                            orch.bump();
                        }
                        if first {
                            tracing::info!(machine = %hb.machine, api = %hb.api, "instance connected");
                            machine = Some(hb.machine.clone());
                            if tx.send(Ok(orch.assignments(&hb.machine))).await.is_err() {
                                break;
                            }
                        }
                    }
                    r = version.changed() => {
                        if r.is_err() { break; }
                        if let Some(m) = &machine
                            && tx.send(Ok(orch.assignments(m))).await.is_err()
                        {
                            break;
                        }
                    }
                }
            }
            if let Some(m) = machine {
                tracing::info!(machine = %m, "instance session ended");
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn activate(
        &self,
        req: Request<pb::ActivateRequest>,
    ) -> Result<Response<pb::ActivateReply>, Status> {
        let r = req.into_inner();
        let res = self.0.lock().views.apply(&Command::Activate {
            service: r.service.clone(),
            view: r.view,
            primary: r.primary.clone(),
            now_ms: now_ms(),
        });
        Ok(Response::new(match res {
            Ok(()) => {
                tracing::warn!(service = %r.service, view = r.view, primary = %r.primary, "view activated");
                self.0.bump();
                pb::ActivateReply {
                    activated: true,
                    error: String::new(),
                }
            }
            Err(e) => pb::ActivateReply {
                activated: false,
                error: e.to_string(),
            },
        }))
    }

    async fn deploy(
        &self,
        req: Request<pb::DeployRequest>,
    ) -> Result<Response<pb::DeployReply>, Status> {
        let r = req.into_inner();
        let fail = |error: String| {
            Ok(Response::new(pb::DeployReply {
                error,
                ..Default::default()
            }))
        };
        if r.backups > 16 {
            return fail(format!("{} backups asked for; at most 16", r.backups));
        }
        let path = std::path::Path::new(&r.manifest_path);
        let m = match tardi_manifest::parse(&r.manifest, path) {
            Ok(m) => m,
            Err(e) => return fail(format!("the manifest is not valid: {e}")),
        };
        let name = m.tardi.name.clone();
        let mut inner = self.0.lock();
        let alive = self.0.alive(&inner);
        let Some((primary, backup_machines)) = inner.views.placement(&alive, r.backups) else {
            return fail(format!(
                "cannot deploy {name:?} with {} backup(s): it needs {} live machines and {} are live ({}); nothing was deployed",
                r.backups,
                r.backups + 1,
                alive.len(),
                alive.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        };
        if let Err(e) = inner.views.apply(&Command::Deploy {
            name: name.clone(),
            manifest: r.manifest,
            manifest_path: r.manifest_path,
            backups: r.backups,
            primary,
            backup_machines,
            now_ms: now_ms(),
        }) {
            return fail(format!("{e}; nothing was deployed"));
        }
        let view = inner.views.services[&name].latest().map(to_pb);
        drop(inner);
        self.0.bump();
        Ok(Response::new(pb::DeployReply {
            service: name,
            view,
            error: String::new(),
        }))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let inner = self.0.lock();
        let alive = self.0.alive(&inner);
        let machines = inner
            .views
            .machines
            .iter()
            .map(|(name, api)| pb::MachineStatus {
                name: name.clone(),
                api: api.clone(),
                alive: alive.contains(name),
                last_seen_ms: inner
                    .seen
                    .get(name)
                    .map_or(u64::MAX, |t| t.elapsed().as_millis() as u64),
            })
            .collect();
        let services = inner
            .views
            .services
            .values()
            .map(|s| {
                let v = s.latest().cloned();
                let report = |m: &str| inner.reports.get(&(m.to_string(), s.name.clone())).cloned();
                let primary = v.as_ref().and_then(|v| report(&v.primary));
                pb::ServiceStatus {
                    name: s.name.clone(),
                    address: primary
                        .as_ref()
                        .map(|p| p.address.clone())
                        .unwrap_or_default(),
                    view: v.as_ref().map(to_pb),
                    spares: inner.views.spares(s, &alive),
                    health: inner.views.health(s, &alive).to_string(),
                    backups_wanted: s.backups_wanted,
                    primary,
                    backup_reports: v
                        .as_ref()
                        .map(|v| v.backups.iter().filter_map(|b| report(b)).collect())
                        .unwrap_or_default(),
                    history: s
                        .history
                        .iter()
                        .map(|h| pb::ViewChange {
                            view: h.view.number,
                            primary: h.view.primary.clone(),
                            backups: h.view.backups.clone(),
                            reason: h.reason.clone(),
                            proposed_ms: h.proposed_ms,
                            activated_ms: h.activated_ms,
                        })
                        .collect(),
                }
            })
            .collect();
        Ok(Response::new(pb::ClusterStatus {
            machines,
            services,
            orchestrator: self.0.opts.name.clone(),
        }))
    }
}

/// Runs an orchestrator node until the process is told to stop (SIGINT/SIGTERM).
pub async fn serve(opts: Options) -> anyhow::Result<()> {
    let (version, _) = watch::channel(0u64);
    let orch = Arc::new(Orch {
        inner: Mutex::new(Inner {
            views: Views::default(),
            seen: HashMap::new(),
            reports: HashMap::new(),
            started: Instant::now(),
        }),
        version,
        opts: opts.clone(),
    });
    {
        let orch = orch.clone();
        tokio::spawn(async move {
            // A tenth of the timeout: detection within 1.1 timeouts of the last heartbeat.
            let mut tick = tokio::time::interval(
                (orch.opts.failure_timeout / 10).max(Duration::from_millis(2)),
            );
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                orch.detect();
            }
        });
    }
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", opts.listen))?;
    tracing::info!(listen = %opts.listen, name = %opts.name, "orchestrator serving");
    println!(
        "orchestrator {} listening on {} (failure timeout {} ms)",
        opts.name,
        opts.listen,
        opts.failure_timeout.as_millis()
    );
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(pb::orchestrator_server::OrchestratorServer::new(Svc(orch)))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            crate::shutdown_signal(),
        )
        .await?;
    Ok(())
}
