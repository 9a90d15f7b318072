//! An orchestrator node: a member of the orchestrator cluster (openraft over tonic), whose
//! replicated state machine is the view manager ([`Views`]), and the gRPC service instances and
//! the CLI use.
//!
//! A cluster of one (no `--peers`) runs the same code. Every state change is a [`Command`]
//! written through the raft log (`client_write`) by the leader; every node applies it to its own
//! [`Views`]. The leader alone serves instance sessions (heartbeats, assignment pushes),
//! activation, deployment and membership changes; a follower refuses them with the leader's
//! URL ([`crate::client::LEADER_KEY`]). Any node answers `Status` from its applied state.
//!
//! The failure detector runs on the leader only, from heartbeats it received itself. It only
//! proposes; safety never depends on it. After an election it waits a grace period
//! ([`grace`]) before it suspects anyone: instances need that long to find the new leader, and
//! a machine not heard from yet is not a failed one.

use crate::client::{LEADER_KEY, endpoint};
use crate::consensus::{self, Member, NodeId, Raft, Reply};
use crate::network::{Network, RaftSvc, Reach};
use crate::store::{self, Shared};
use crate::views::{Command, FailurePolicy, Report, View, Views};
use openraft::ChangeMembers;
use openraft::ServerState;
use openraft::error::{ClientWriteError, RaftError};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tardi_proto as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

mod rpc;
mod show;

use rpc::*;

/// How an orchestrator node runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub listen: SocketAddr,
    pub name: String,
    /// An instance silent this long is suspected failed (Tardigrade used 100 ms).
    pub failure_timeout: Duration,
    /// Where the raft log and the state machine live.
    pub data_dir: PathBuf,
    /// The cluster's initial members, name → URL, this node included. With an empty data
    /// directory, the first of them initializes the cluster; the others wait for it. Empty: a
    /// cluster of this node alone.
    pub peers: Vec<(String, String)>,
    /// Do not initialize anything: wait to be added (`tardi orchestrator join`).
    pub join: bool,
    /// Serve Prometheus metrics on `http://ADDR/metrics` ([`Orch::metrics`]) and the status page
    /// on `http://ADDR/` ([`crate::page`]).
    pub metrics: Option<SocketAddr>,
    /// Mutual TLS (gRPC served, raft peers dialled) or plaintext.
    pub security: tardi_tls::Security,
}

/// How long a new leader waits before it suspects anyone: twice the failure timeout, plus a
/// second for instances to notice the old leader's death (HTTP/2 keepalive, 300 ms) and find
/// the new one among the nodes (a dead node costs a connect timeout).
pub fn grace(failure_timeout: Duration) -> Duration {
    failure_timeout * 2 + Duration::from_secs(1)
}

/// How long a write waits to be committed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("starting raft: {0}")]
    Raft(String),
    #[error("--peers must name this node ({0:?})")]
    NotInPeers(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving gRPC: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error(transparent)]
    Metrics(std::io::Error),
}

/// What the leader measures itself (not replicated: each leader starts afresh).
#[derive(Default)]
struct Liveness {
    /// Last heartbeat per machine.
    seen: HashMap<String, Instant>,
    reports: HashMap<(String, String), pb::ServiceReport>,
    /// Each backup's reported epoch ((machine, service)) and since when it has been that one.
    progress: HashMap<(String, String), (u64, Instant)>,
    /// `[tardi.failover] max_backup_lag_ms` of each manifest text seen (by its hash).
    lag_bounds: HashMap<u64, Duration>,
    /// Backups replaced for falling behind ((service, machine)): when, and for how long they
    /// are no spare of that service (ten times its bound: its link may still be bad, and taken
    /// back at once it would hold the output again).
    lagged: HashMap<(String, String), (Instant, Duration)>,
}

struct Orch {
    id: NodeId,
    raft: Raft,
    shared: Arc<Shared>,
    live: Mutex<Liveness>,
    /// Since when this node is the leader (`None`: it is not).
    leader: watch::Sender<Option<Instant>>,
    reach: Arc<Reach>,
    opts: Options,
    /// When the last confirmation that a majority still follows this leader began (see
    /// [`Orch::confirm_leadership`]); `None`: not confirmed since it last became leader.
    confirmed: Mutex<Option<Instant>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Orch {
    fn live(&self) -> std::sync::MutexGuard<'_, Liveness> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_leader(&self) -> bool {
        self.leader.borrow().is_some()
    }

    fn alive(&self) -> BTreeSet<String> {
        self.live()
            .seen
            .iter()
            .filter(|(_, t)| t.elapsed() < self.opts.failure_timeout)
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// The leader as this node knows it.
    fn leader_member(&self) -> Option<Member> {
        let m = self.raft.metrics().borrow().clone();
        let id = m.current_leader?;
        m.membership_config.membership().get_node(&id).cloned()
    }

    /// A follower's refusal of a write: UNAVAILABLE, with the leader's URL if known.
    fn not_leader(&self, leader: Option<Member>) -> Status {
        match leader {
            Some(l) if l.name != self.opts.name => {
                let mut s = Status::unavailable(format!(
                    "{} is not the orchestrators' leader; the leader is {} at {}",
                    self.opts.name, l.name, l.addr
                ));
                if let Ok(v) = l.addr.parse() {
                    s.metadata_mut().insert(LEADER_KEY, v);
                }
                s
            }
            _ => Status::unavailable(format!(
                "{} is not the orchestrators' leader and knows none (an election is under way)",
                self.opts.name
            )),
        }
    }

    fn check_leader(&self) -> Result<(), Status> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(self.not_leader(self.leader_member()))
        }
    }

    /// Writes `cmd` through the raft log; returns what applying it answered. A leader cut off
    /// from the majority commits nothing: it gives up after [`WRITE_TIMEOUT`] (the change may
    /// still be committed by a later leader; every command is safe to ask for again).
    async fn write(&self, cmd: Command) -> Result<Reply, Status> {
        match tokio::time::timeout(WRITE_TIMEOUT, self.raft.client_write(cmd)).await {
            Err(_) => Err(Status::unavailable(format!(
                "{} could not commit the change within {} s (cut off from the other orchestrators?)",
                self.opts.name,
                WRITE_TIMEOUT.as_secs()
            ))),
            Ok(Ok(r)) => Ok(r.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(self.not_leader(f.leader_node))
            }
            Ok(Err(e)) => Err(Status::unavailable(format!(
                "the orchestrator cluster could not commit the change: {e}"
            ))),
        }
    }

    /// One detector round (leader only): propose what the live set calls for.
    async fn detect(&self) {
        let Some(since) = *self.leader.borrow() else {
            return;
        };
        if since.elapsed() < grace(self.opts.failure_timeout) {
            return;
        }
        let alive = self.alive();
        let reports: BTreeMap<(String, String), Report> = self
            .live()
            .reports
            .iter()
            .map(|(k, r)| (k.clone(), plan_report(r)))
            .collect();
        let stuck = self.stuck_backups();
        let cmds = self
            .shared
            .read(|a| a.views.plan_with(&alive, &reports, &stuck, now_ms()));
        for c in cmds {
            match self.write(c.clone()).await {
                Ok(Ok(())) => tracing::warn!(?c, "view change"),
                Ok(Err(e)) => tracing::error!(%e, ?c, "planned command refused"),
                Err(e) => {
                    tracing::warn!(error = %e.message(), ?c, "planned command not committed");
                    return;
                }
            }
        }
    }

    /// A CLI's change to one service, on the leader: `cmd` written through raft; the reply's
    /// `error` (empty when applied, logged as `done`; else why `Views::apply` refused it).
    async fn cli_write(&self, cmd: Command, service: &str, done: &str) -> Result<String, Status> {
        self.check_leader()?;
        Ok(match self.write(cmd).await? {
            Ok(()) => {
                tracing::warn!(%service, "{done}");
                String::new()
            }
            Err(e) => e.to_string(),
        })
    }

    fn assignments(&self, machine: &str) -> pb::Assignments {
        self.shared.read(|a| assignments(&a.views, machine))
    }

    /// A lease renewal for an instance's heartbeat, if this node may give one: it leads, and a
    /// majority of the cluster confirmed that within the failure timeout (a leader cut off from
    /// the others believes it leads until it hears of a newer term: its word alone proves
    /// nothing). The lease is the failure timeout: a primary that stops hearing this fences
    /// itself about when this cluster suspects it.
    fn renewal(&self) -> Option<pb::Assignments> {
        let lease = self.opts.failure_timeout;
        let confirmed = *self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        (self.is_leader() && confirmed?.elapsed() < lease).then(|| pb::Assignments {
            renewal: true,
            lease_ms: lease.as_millis() as u64,
            ..Default::default()
        })
    }

    /// While this node leads, confirms with a majority (a heartbeat round: openraft's
    /// `ensure_linearizable`) every quarter of the failure timeout that it still does, and
    /// records when each confirmation began: a renewal counts from then, never from its answer.
    async fn confirm_leadership(self: Arc<Self>) {
        let every = (self.opts.failure_timeout / 4).max(Duration::from_millis(5));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            if !self.is_leader() {
                *self.confirmed.lock().unwrap_or_else(|e| e.into_inner()) = None;
                continue;
            }
            let began = Instant::now();
            let asked = self.raft.ensure_linearizable();
            if let Ok(Ok(_)) = tokio::time::timeout(self.opts.failure_timeout, asked).await {
                *self.confirmed.lock().unwrap_or_else(|e| e.into_inner()) = Some(began);
            }
        }
    }

    fn heartbeat(&self, hb: &pb::Heartbeat) {
        let mut live = self.live();
        live.seen.insert(hb.machine.clone(), Instant::now());
        // A heartbeat lists every service the machine has a role for: what it no longer
        // reports (an undeployed service, a dropped backup) is forgotten.
        live.reports
            .retain(|(m, s), _| *m != hb.machine || hb.services.iter().any(|r| r.service == *s));
        let now = Instant::now();
        for r in &hb.services {
            let key = (hb.machine.clone(), r.service.clone());
            if r.role == pb::Role::Backup as i32 {
                match live.progress.get(&key) {
                    Some(&(e, _)) if e == r.epoch => {}
                    _ => {
                        live.progress.insert(key.clone(), (r.epoch, now));
                    }
                }
            } else {
                live.progress.remove(&key);
            }
            live.reports.insert(key, r.clone());
        }
        let Liveness {
            reports, progress, ..
        } = &mut *live;
        progress.retain(|k, _| reports.contains_key(k));
    }

    /// Backups that fell behind for longer than their service allows (`[tardi.failover]
    /// max_backup_lag_ms`): their reported epoch has not changed for that long while their
    /// primary's went past it (a blackholed or slow checkpoint link, a starved backup). The
    /// service's output waits for them, so [`Views::plan_with`] replaces them with a spare.
    /// Only for a settled service (no view proposed), so a backup still receiving its full
    /// checkpoint for a view being set up is not counted.
    fn stuck_backups(&self) -> BTreeSet<(String, String)> {
        let services: Vec<(String, String, Vec<String>, String)> = self.shared.read(|a| {
            a.views
                .services
                .values()
                .filter(|s| s.proposed.is_none() && s.failed.is_none())
                .filter_map(|s| {
                    let v = s.active.as_ref()?;
                    Some((
                        s.name.clone(),
                        v.primary.clone(),
                        v.backups.clone(),
                        s.manifest.clone(),
                    ))
                })
                .collect()
        });
        let mut live = self.live();
        let mut out = BTreeSet::new();
        for (name, primary, backups, manifest) in services {
            let Some(pe) = live
                .reports
                .get(&(primary.clone(), name.clone()))
                .filter(|r| r.role == pb::Role::Primary as i32)
                .map(|r| r.epoch)
            else {
                continue;
            };
            let bound = {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                manifest.hash(&mut h);
                *live.lag_bounds.entry(h.finish()).or_insert_with(|| {
                    let ms = tardi_manifest::parse(&manifest, std::path::Path::new("/"))
                        .map(|m| m.tardi.failover.max_backup_lag_ms)
                        .unwrap_or(tardi_manifest::Failover::default().max_backup_lag_ms);
                    Duration::from_millis(ms)
                })
            };
            for b in backups {
                if let Some(&(eb, since)) = live.progress.get(&(b.clone(), name.clone()))
                    && eb < pe
                    && since.elapsed() > bound
                {
                    tracing::warn!(service = %name, backup = %b, behind_ms = since.elapsed().as_millis() as u64, backup_epoch = eb, primary_epoch = pe, "backup falls behind: replacing it");
                    live.lagged
                        .insert((name.clone(), b.clone()), (Instant::now(), bound * 10));
                    out.insert((name.clone(), b));
                }
            }
        }
        live.lagged.retain(|_, (at, hold)| at.elapsed() < *hold);
        out.extend(live.lagged.keys().cloned());
        out
    }

    /// Watches raft's metrics: records leadership changes (a new leader forgets the previous
    /// one's liveness: it waits for heartbeats of its own).
    async fn follow_leadership(self: Arc<Self>) {
        let mut m = self.raft.metrics();
        loop {
            let (leader_now, term) = {
                let x = m.borrow();
                (
                    x.state == ServerState::Leader && x.current_leader == Some(self.id),
                    x.current_term,
                )
            };
            let was = self.is_leader();
            if leader_now && !was {
                *self.live() = Liveness::default();
                self.leader.send_replace(Some(Instant::now()));
                tracing::warn!(
                    term,
                    grace_ms = grace(self.opts.failure_timeout).as_millis() as u64,
                    "this node is the orchestrators' leader"
                );
            } else if !leader_now && was {
                self.leader.send_replace(None);
                tracing::warn!(term, "this node is no longer the leader");
            }
            if m.changed().await.is_err() {
                return;
            }
        }
    }

    fn cluster(&self) -> pb::OrchestratorCluster {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let from_leader = m.state == ServerState::Leader;
        let leader = m
            .current_leader
            .and_then(|id| membership.get_node(&id))
            .map(|l| l.name.clone())
            .unwrap_or_default();
        let mut members: Vec<pb::OrchestratorMember> = membership
            .nodes()
            .map(|(id, n)| pb::OrchestratorMember {
                name: n.name.clone(),
                // As it is dialled: membership keeps the address it was added with (`http://`
                // for clusters made before TLS), the scheme follows this node's security.
                addr: self.opts.security.url(&n.addr),
                voter: voters.contains(id),
                reachable: *id == self.id || self.reach.recent(*id, Duration::from_secs(1)),
                matched_index: if !from_leader {
                    0
                } else if *id == self.id {
                    m.last_log_index.unwrap_or(0)
                } else {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(id).cloned().flatten())
                        .map_or(0, |l| l.index)
                },
            })
            .collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        pb::OrchestratorCluster {
            leader,
            from_leader,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            last_applied: m.last_applied.map_or(0, |l| l.index),
            members,
        }
    }
}

fn assignments(views: &Views, machine: &str) -> pb::Assignments {
    let services = views
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
                fresh: s.starts_fresh(),
                backups_wanted: s.backups_wanted,
            })
        })
        .collect();
    pb::Assignments {
        services,
        machines: views
            .machines
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

/// What the view manager needs of an instance's report: the image a backup (or a primary whose
/// takeover failed, if it kept it) holds, and whether a primary failed. A primary reports its
/// state as `failed: WHY` when its service could not start, could not be restored, or ended.
fn plan_report(r: &pb::ServiceReport) -> Report {
    let primary = r.role == pb::Role::Primary as i32;
    let failed = r
        .state
        .strip_prefix("failed")
        .filter(|_| primary)
        .map(|why| why.trim_start_matches(':').trim().to_string());
    Report {
        view: r.view,
        // A running primary's `image_view` is its run, not an image it holds for a takeover.
        image_view: if primary && failed.is_none() {
            0
        } else {
            r.image_view
        },
        epoch: r.epoch,
        failed,
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

/// Runs an orchestrator node until the process is told to stop (SIGINT/SIGTERM).
pub async fn serve(opts: Options) -> Result<(), ServeError> {
    serve_until(opts, crate::shutdown_signal()).await
}

/// Runs an orchestrator node until `stop` resolves, then shuts its raft down (its data
/// directory can then be opened again).
pub async fn serve_until(
    opts: Options,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let id = consensus::node_id(&opts.name);
    let me = opts
        .peers
        .iter()
        .find(|(n, _)| *n == opts.name)
        .map(|(_, a)| endpoint(a));
    if !opts.peers.is_empty() && me.is_none() {
        return Err(ServeError::NotInPeers(opts.name.clone()));
    }
    let my_addr = me.unwrap_or_else(|| endpoint(&opts.listen.to_string()));
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: opts.listen,
            source,
        })?;
    let (log, sm, shared) = store::open(&opts.data_dir)?;
    let reach = Arc::new(Reach::default());
    let config = consensus::config()
        .validate()
        .map_err(|e| ServeError::Raft(e.to_string()))?;
    let raft = Raft::new(
        id,
        Arc::new(config),
        Network {
            reach: reach.clone(),
            security: opts.security.clone(),
        },
        log,
        sm,
    )
    .await
    .map_err(|e| ServeError::Raft(e.to_string()))?;
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| ServeError::Raft(e.to_string()))?;
    if initialized {
        tracing::info!(data_dir = %opts.data_dir.display(), "rejoining the cluster from the data directory");
    } else if opts.join {
        tracing::info!("waiting to be added (tardi orchestrator join)");
    } else if opts.peers.first().is_none_or(|(n, _)| *n == opts.name) {
        let members: BTreeMap<NodeId, Member> = if opts.peers.is_empty() {
            BTreeMap::from([(
                id,
                Member {
                    name: opts.name.clone(),
                    addr: my_addr.clone(),
                },
            )])
        } else {
            opts.peers
                .iter()
                .map(|(n, a)| {
                    (
                        consensus::node_id(n),
                        Member {
                            name: n.clone(),
                            addr: endpoint(a),
                        },
                    )
                })
                .collect()
        };
        tracing::warn!(members = ?members.values().map(|m| m.name.as_str()).collect::<Vec<_>>(), "initializing the orchestrator cluster");
        raft.initialize(members)
            .await
            .map_err(|e| ServeError::Raft(e.to_string()))?;
    } else {
        tracing::info!(first = %opts.peers[0].0, "waiting for the first peer to initialize the cluster");
    }
    let (leader, _) = watch::channel(None);
    let orch = Arc::new(Orch {
        id,
        raft: raft.clone(),
        shared,
        live: Mutex::new(Liveness::default()),
        leader,
        reach: reach.clone(),
        opts: opts.clone(),
        confirmed: Mutex::new(None),
    });
    // The metrics and, beside them, the status page and the sampler of its plots.
    let metrics = match opts.metrics {
        Some(addr) => {
            let o = orch.clone();
            let render: tardi_metrics::Render = Arc::new(move || o.metrics());
            let o = orch.clone();
            let page = crate::page::Page::new(
                &opts.name,
                opts.security.clone(),
                Arc::new(move || o.status()),
            );
            let router = tardi_metrics::router(render).merge(crate::page::router(page.clone()));
            let served = tardi_metrics::serve(addr, router)
                .await
                .map_err(ServeError::Metrics)?;
            tracing::info!(%addr, "serving the status page on /");
            Some((served, tokio::spawn(page.sample())))
        }
        None => None,
    };
    let leadership = tokio::spawn(orch.clone().follow_leadership());
    let confirming = tokio::spawn(orch.clone().confirm_leadership());
    let detector = {
        let orch = orch.clone();
        tokio::spawn(async move {
            // A tenth of the timeout: detection within 1.1 timeouts of the last heartbeat.
            let mut tick = tokio::time::interval(
                (orch.opts.failure_timeout / 10).max(Duration::from_millis(2)),
            );
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                orch.detect().await;
            }
        })
    };
    let security = match &opts.security {
        tardi_tls::Security::Tls(id) => format!("mutual TLS from {}", id.dir().display()),
        tardi_tls::Security::Plaintext => "PLAINTEXT, unauthenticated".to_string(),
    };
    tracing::info!(listen = %opts.listen, name = %opts.name, %security, "orchestrator serving");
    println!(
        "orchestrator {} listening on {} ({security}; failure timeout {} ms, data in {})",
        opts.name,
        opts.listen,
        opts.failure_timeout.as_millis(),
        opts.data_dir.display()
    );
    let mut server = tonic::transport::Server::builder().tcp_nodelay(true);
    if let Some(tls) = opts.security.server_tls() {
        server = server.tls_config(tls)?;
    }
    let r = server
        .add_service(pb::orchestrator_server::OrchestratorServer::new(Svc(orch)))
        .add_service(
            pb::raft_server::RaftServer::new(RaftSvc {
                raft: raft.clone(),
                reach,
            })
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX),
        )
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            stop,
        )
        .await;
    detector.abort();
    leadership.abort();
    confirming.abort();
    if let Some((served, sampler)) = metrics {
        served.abort();
        sampler.abort();
    }
    let _ = raft.shutdown().await;
    r.map_err(ServeError::from)
}
