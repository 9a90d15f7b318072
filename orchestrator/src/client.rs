//! Client calls the CLI makes to an orchestrator (`tardi deploy`, `tardi status`).

use std::time::{Duration, Instant};
use tardi_proto as pb;
use tardi_proto::orchestrator_client::OrchestratorClient;

/// Where the CLI finds the orchestrator when `--orchestrator` is not given.
pub const ENV: &str = "TARDI_ORCHESTRATOR";

/// `host:port` or a URL → a URL tonic can dial.
pub fn endpoint(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach the orchestrator at {addr}: {source} (is `tardi orchestrator` running there? set --orchestrator or {ENV})"
    )]
    Connect {
        addr: String,
        source: tonic::transport::Error,
    },
    #[error("the orchestrator at {addr} failed the request: {status}")]
    Rpc { addr: String, status: tonic::Status },
    #[error("{0}")]
    Refused(String),
    #[error("timed out after {secs} s waiting for {what}")]
    Timeout { secs: u64, what: String },
}

async fn connect(addr: &str) -> Result<OrchestratorClient<tonic::transport::Channel>, ClientError> {
    let url = endpoint(addr);
    let ep = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|source| ClientError::Connect {
            addr: url.clone(),
            source,
        })?
        .connect_timeout(Duration::from_secs(3));
    let ch = ep.connect().await.map_err(|source| ClientError::Connect {
        addr: url.clone(),
        source,
    })?;
    Ok(OrchestratorClient::new(ch))
}

pub async fn status(addr: &str) -> Result<pb::ClusterStatus, ClientError> {
    let mut c = connect(addr).await?;
    c.status(pb::StatusRequest {})
        .await
        .map(|r| r.into_inner())
        .map_err(|status| ClientError::Rpc {
            addr: addr.to_string(),
            status,
        })
}

/// Deploys a manifest; with `wait`, returns once its first view is active (the primary runs the
/// service and every backup holds its full checkpoint), calling `progress` as things happen.
pub async fn deploy(
    addr: &str,
    manifest: String,
    manifest_path: String,
    backups: u32,
    wait: Option<Duration>,
    progress: &mut dyn FnMut(&str),
) -> Result<pb::DeployReply, ClientError> {
    let mut c = connect(addr).await?;
    let reply = c
        .deploy(pb::DeployRequest {
            manifest,
            manifest_path,
            backups,
        })
        .await
        .map_err(|status| ClientError::Rpc {
            addr: addr.to_string(),
            status,
        })?
        .into_inner();
    if !reply.error.is_empty() {
        return Err(ClientError::Refused(reply.error));
    }
    let Some(limit) = wait else { return Ok(reply) };
    let t0 = Instant::now();
    let mut last = String::new();
    loop {
        let st = status(addr).await?;
        if let Some(s) = st.services.iter().find(|s| s.name == reply.service) {
            let state = s
                .primary
                .as_ref()
                .map_or("waiting for the primary".to_string(), |p| p.state.clone());
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
            if let Some(p) = s.primary.as_ref().filter(|p| p.state.starts_with("failed")) {
                return Err(ClientError::Refused(format!(
                    "the primary could not start {:?}: {}",
                    reply.service, p.state
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
