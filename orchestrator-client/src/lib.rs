//! Reaching the orchestrator cluster: the CLI's calls (`tardi deploy`, `tardi status`,
//! `tardi orchestrator join|leave`) and [`Orchestrators`], which instances use too.
//!
//! Owns: the client side of the orchestrators' gRPC API. Must not touch: views, consensus,
//! storage (the crate `tardi-orchestrator`, which re-exports this one as its `client`); an
//! instance links this crate alone, not openraft, redb or the status page.
//!
//! Clients know the orchestrators as a comma-separated list of URLs. Writes go to the leader: a
//! follower refuses them with `UNAVAILABLE` and the leader's URL in the [`LEADER_KEY`] metadata
//! key; [`Orchestrators::call`] follows that hint, or tries the next node when one is down or
//! knows no leader, until its deadline.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tardi_proto as pb;
use tardi_proto::orchestrator_client::OrchestratorClient;
use tardi_tls::Security;
use tonic::transport::Channel;

/// Where the CLI finds the orchestrators when `--orchestrator` is not given.
pub const ENV: &str = "TARDI_ORCHESTRATOR";

/// The response metadata key naming the leader's URL in a follower's refusal.
pub const LEADER_KEY: &str = "tardi-leader";

/// `host:port` or a URL → a URL tonic can dial.
pub fn endpoint(addr: &str) -> String {
    let addr = addr.trim();
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

/// The URLs of a comma-separated list of orchestrators.
pub fn urls(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(endpoint)
        .collect()
}

/// The leader's URL in a follower's refusal.
pub fn leader_hint(s: &tonic::Status) -> Option<String> {
    s.metadata()
        .get(LEADER_KEY)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach the orchestrator at {addr}: {} (is `tardi orchestrator` running there, with the same --tls-dir CA or --insecure-plaintext? set --orchestrator or {ENV})",
        causes(.source)
    )]
    Connect {
        addr: String,
        source: tonic::transport::Error,
    },
    #[error("the orchestrator at {addr} failed the request: {status}")]
    Rpc { addr: String, status: tonic::Status },
    #[error("no orchestrator named in {0:?} (set --orchestrator or {ENV})")]
    NoAddress(String),
    #[error("{0}")]
    Refused(String),
    #[error("timed out after {secs} s waiting for {what}")]
    Timeout { secs: u64, what: String },
}

/// An error and its causes on one line (tonic's transport error alone says only "transport
/// error"; the TLS or connection failure is in its sources).
pub fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let c_s = c.to_string();
        if !s.contains(&c_s) {
            s.push_str(": ");
            s.push_str(&c_s);
        }
        cur = c.source();
    }
    s
}

/// Connects to one orchestrator (with mutual TLS unless `security` is plaintext). HTTP/2
/// keepalive pings (every 100 ms, 200 ms to answer) notice a dead node fast: an instance's
/// session moves to the new leader within a few hundred ms.
pub async fn connect(
    url: &str,
    security: &Security,
) -> Result<OrchestratorClient<Channel>, ClientError> {
    let err = |source| ClientError::Connect {
        addr: url.to_string(),
        source,
    };
    let ch = security
        .endpoint(url)
        .map_err(err)?
        .connect_timeout(Duration::from_millis(300))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_millis(100))
        .keep_alive_timeout(Duration::from_millis(200))
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(err)?;
    Ok(OrchestratorClient::new(ch)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20))
}

/// The orchestrator cluster as a client sees it: its URLs and the one that last answered.
pub struct Orchestrators {
    urls: Vec<String>,
    list: String,
    /// The node to try first (the last that served a call, or the last leader hint).
    preferred: Mutex<Option<String>>,
    security: Security,
}

impl Orchestrators {
    pub fn new(list: &str, security: Security) -> Orchestrators {
        Orchestrators {
            urls: urls(list),
            list: list.to_string(),
            preferred: Mutex::new(None),
            security,
        }
    }

    pub fn security(&self) -> &Security {
        &self.security
    }

    pub fn list(&self) -> &str {
        &self.list
    }

    fn preferred(&self) -> Option<String> {
        self.preferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn prefer(&self, url: &str) {
        *self.preferred.lock().unwrap_or_else(|e| e.into_inner()) = Some(url.to_string());
    }

    /// Stops preferring `url` (its session ended: it may be dead or a follower now): the next
    /// call starts with the node after it.
    pub fn forget(&self, url: &str) {
        let mut p = self.preferred.lock().unwrap_or_else(|e| e.into_inner());
        if p.as_deref() == Some(url) {
            *p = self
                .urls
                .iter()
                .position(|u| u == url)
                .map(|i| self.urls[(i + 1) % self.urls.len()].clone());
        }
    }

    /// Runs `f` against the leader (or, for reads, any node that answers): the preferred node
    /// first, then leader hints and the other nodes in turn, until `f` succeeds, fails with
    /// something else than `UNAVAILABLE`, or `within` has passed.
    pub async fn call<T, F, Fut>(&self, within: Duration, mut f: F) -> Result<T, ClientError>
    where
        F: FnMut(OrchestratorClient<Channel>, String) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        if self.urls.is_empty() {
            return Err(ClientError::NoAddress(self.list.clone()));
        }
        let deadline = Instant::now() + within;
        let start = self
            .preferred()
            .and_then(|p| self.urls.iter().position(|u| *u == p))
            .unwrap_or(0);
        let mut next = start;
        let mut target = self.preferred().unwrap_or_else(|| self.urls[0].clone());
        let mut tried_in_round = 0;
        let mut hints = 0;
        loop {
            let err = match connect(&target, &self.security).await {
                Ok(c) => match f(c, target.clone()).await {
                    Ok(v) => {
                        self.prefer(&target);
                        return Ok(v);
                    }
                    Err(status) if status.code() == tonic::Code::Unavailable => {
                        if let Some(h) = leader_hint(&status).filter(|h| *h != target)
                            && hints < 3
                        {
                            hints += 1;
                            tracing::debug!(from = %target, to = %h, "following the leader hint");
                            self.prefer(&h);
                            target = h;
                            continue;
                        }
                        ClientError::Rpc {
                            addr: target.clone(),
                            status,
                        }
                    }
                    Err(status) => {
                        return Err(ClientError::Rpc {
                            addr: target,
                            status,
                        });
                    }
                },
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(err);
            }
            tracing::debug!(error = %err, "orchestrator unavailable; trying the next");
            tried_in_round += 1;
            if tried_in_round >= self.urls.len() {
                // Every node refused or is down (an election is under way): pause briefly.
                tried_in_round = 0;
                hints = 0;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            next = (next + 1) % self.urls.len();
            target = self.urls[next].clone();
        }
    }
}

/// How long the CLI keeps trying to reach the leader (an election takes under a second).
const CLI_PATIENCE: Duration = Duration::from_secs(5);

/// The cluster's status: from the leader if it can be reached (it alone knows which machines
/// are alive and their reports), else from any node.
pub async fn status(list: &str, security: &Security) -> Result<pb::ClusterStatus, ClientError> {
    status_from(list, security, true).await
}

/// The cluster's status from the first node that answers, and with `prefer_leader` from the
/// leader if that node is a follower and the leader answers within a second.
pub async fn status_from(
    list: &str,
    security: &Security,
    prefer_leader: bool,
) -> Result<pb::ClusterStatus, ClientError> {
    let o = Orchestrators::new(list, security.clone());
    let st = o
        .call(CLI_PATIENCE, |mut c, _| async move {
            c.status(pb::StatusRequest {}).await.map(|r| r.into_inner())
        })
        .await?;
    let cl = st.cluster.clone().unwrap_or_default();
    if !prefer_leader || cl.from_leader || cl.leader.is_empty() {
        return Ok(st);
    }
    let Some(leader) = cl.members.iter().find(|m| m.name == cl.leader) else {
        return Ok(st);
    };
    let from_leader = async {
        let mut c = connect(&leader.addr, security).await.ok()?;
        c.status(pb::StatusRequest {})
            .await
            .ok()
            .map(|r| r.into_inner())
    };
    match tokio::time::timeout(Duration::from_secs(1), from_leader).await {
        Ok(Some(l)) => Ok(l),
        _ => Ok(st),
    }
}

/// Deploys a manifest; with `wait`, returns once its first view is active (the primary runs the
/// service and every backup holds its full checkpoint), calling `progress` as things happen.
/// Stops protecting `service` and waits (up to `wait`) until no machine reports a role for it,
/// i.e. its primary's sandbox is torn down and its backups dropped their images.
pub async fn undeploy(
    list: &str,
    security: &Security,
    service: &str,
    wait: Option<Duration>,
) -> Result<(), ClientError> {
    let o = Orchestrators::new(list, security.clone());
    let req = pb::UndeployRequest {
        service: service.to_string(),
    };
    let reply = o
        .call(CLI_PATIENCE, |mut c, _| {
            let req = req.clone();
            async move { c.undeploy(req).await.map(|r| r.into_inner()) }
        })
        .await?;
    refused(reply.error)?;
    let Some(limit) = wait else { return Ok(()) };
    // The service is gone from the views at once; machines drop their roles as their next
    // assignment reaches them. Reports of the service still arriving mean some still hold it.
    let late = format!("{service:?} is undeployed, but a machine still reported a role for it");
    poll_status(list, security, limit, &late, |st| {
        Ok(!st
            .machines
            .iter()
            .any(|m| m.alive && m.services.iter().any(|s| s == service)))
    })
    .await
}

/// A reply's `error` (empty on success) as a result.
fn refused(error: String) -> Result<(), ClientError> {
    if error.is_empty() {
        Ok(())
    } else {
        Err(ClientError::Refused(error))
    }
}

/// Asks for the status every 50 ms until `done` says so (or fails), for at most `limit`; past
/// it, refused with `late` and how long it waited.
async fn poll_status(
    list: &str,
    security: &Security,
    limit: Duration,
    late: &str,
    done: impl Fn(&pb::ClusterStatus) -> Result<bool, ClientError>,
) -> Result<(), ClientError> {
    let t0 = Instant::now();
    loop {
        if done(&status(list, security).await?)? {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err(ClientError::Refused(format!(
                "{late} after {} s",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Brings back a service that was given up; with `wait`, returns once a view of it is active
/// again (its new primary restored it from a machine's image and serves).
pub async fn restart(
    list: &str,
    security: &Security,
    service: &str,
    wait: Option<Duration>,
) -> Result<(), ClientError> {
    let o = Orchestrators::new(list, security.clone());
    let req = pb::RestartRequest {
        service: service.to_string(),
    };
    let before = status(list, security)
        .await?
        .services
        .iter()
        .find(|s| s.name == service)
        .and_then(|s| s.view.as_ref().map(|v| v.number))
        .unwrap_or(0);
    let reply = o
        .call(CLI_PATIENCE, |mut c, _| {
            let req = req.clone();
            async move { c.restart(req).await.map(|r| r.into_inner()) }
        })
        .await?;
    refused(reply.error)?;
    let Some(limit) = wait else { return Ok(()) };
    let late = format!(
        "{service:?} is restarting, but no new view of it was active (`tardi status` shows where it is)"
    );
    poll_status(list, security, limit, &late, |st| {
        let Some(s) = st.services.iter().find(|s| s.name == service) else {
            return Ok(false);
        };
        if !s.failed.is_empty() {
            return Err(ClientError::Refused(format!(
                "{service:?} was given up again: {}",
                s.failed
            )));
        }
        Ok(s.view
            .as_ref()
            .is_some_and(|v| v.number > before && v.active))
    })
    .await
}

pub async fn deploy(
    list: &str,
    security: &Security,
    manifest: String,
    manifest_path: String,
    backups: u32,
    wait: Option<Duration>,
    progress: &mut dyn FnMut(&str),
) -> Result<pb::DeployReply, ClientError> {
    let o = Orchestrators::new(list, security.clone());
    let req = pb::DeployRequest {
        manifest,
        manifest_path,
        backups,
    };
    let reply = o
        .call(CLI_PATIENCE, |mut c, _| {
            let req = req.clone();
            async move { c.deploy(req).await.map(|r| r.into_inner()) }
        })
        .await?;
    if !reply.error.is_empty() {
        return Err(ClientError::Refused(reply.error));
    }
    let Some(limit) = wait else { return Ok(reply) };
    let t0 = Instant::now();
    let mut last = String::new();
    loop {
        let st = status(list, security).await?;
        if let Some(s) = st.services.iter().find(|s| s.name == reply.service) {
            let state = s
                .primary
                .as_ref()
                .map_or("not reporting yet".to_string(), |p| p.state.clone());
            let active = s.view.as_ref().is_some_and(|v| v.active);
            let line = format!(
                "view {} {}: primary {}",
                s.view.as_ref().map_or(0, |v| v.number),
                if active { "active" } else { "proposed" },
                state
            );
            if line != last {
                progress(&line);
                last = line;
            }
            if active {
                return Ok(pb::DeployReply {
                    view: s.view.clone(),
                    ..reply
                });
            }
            // A primary that fails is moved elsewhere (shown as progress above); only a service
            // the orchestrator gave up is an answer.
            if !s.failed.is_empty() {
                return Err(ClientError::Refused(format!(
                    "{:?} could not be started: {}",
                    reply.service, s.failed
                )));
            }
        }
        if t0.elapsed() > limit {
            return Err(ClientError::Timeout {
                secs: limit.as_secs(),
                what: format!("{:?} to be protected", reply.service),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Adds a running node (started with `--join`) to the orchestrator cluster: it catches up as a
/// learner, then becomes a voter.
pub async fn join(
    list: &str,
    security: &Security,
    name: &str,
    addr: &str,
) -> Result<pb::MembershipReply, ClientError> {
    let req = pb::JoinRequest {
        name: name.to_string(),
        addr: endpoint(addr),
    };
    Orchestrators::new(list, security.clone())
        .call(Duration::from_secs(30), |mut c, _| {
            let req = req.clone();
            async move { c.join(req).await.map(|r| r.into_inner()) }
        })
        .await
}

/// Removes a node from the orchestrator cluster.
pub async fn leave(
    list: &str,
    security: &Security,
    name: &str,
) -> Result<pb::MembershipReply, ClientError> {
    let req = pb::LeaveRequest {
        name: name.to_string(),
    };
    Orchestrators::new(list, security.clone())
        .call(Duration::from_secs(30), |mut c, _| {
            let req = req.clone();
            async move { c.leave(req).await.map(|r| r.into_inner()) }
        })
        .await
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without signal handlers, run until killed.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_hints() {
        assert_eq!(
            urls("10.0.0.1:7700, http://10.0.0.2:7700,,"),
            vec!["http://10.0.0.1:7700", "http://10.0.0.2:7700"]
        );
        let mut s = tonic::Status::unavailable("not the leader");
        assert_eq!(leader_hint(&s), None);
        s.metadata_mut()
            .insert(LEADER_KEY, "http://10.0.0.2:7700".parse().unwrap());
        assert_eq!(leader_hint(&s).as_deref(), Some("http://10.0.0.2:7700"));
    }
}
