//! openraft's network over tonic: the client side ([`Network`], one [`Peer`] per target node)
//! and the server side ([`RaftSvc`], the `Raft` service of `tardi.proto`). Requests and replies
//! are openraft's own types, postcard-encoded in a `RaftMessage`; a remote raft error comes back
//! as the `Err` of the encoded `Result`.
//!
//! Both sides record when they last exchanged a message with each node ([`Reach`]): `tardi
//! status` shows which members are unreachable.

use crate::consensus::{Member, NodeId, Raft, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RaftNetwork, RaftNetworkFactory};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tardi_proto as pb;
use tardi_proto::raft_client::RaftClient;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// When this node last exchanged a raft message with each other node.
#[derive(Default)]
pub struct Reach {
    last: Mutex<HashMap<NodeId, Instant>>,
}

impl Reach {
    pub fn touch(&self, id: NodeId) {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Instant::now());
    }

    /// Heard from or reached within `within`.
    pub fn recent(&self, id: NodeId, within: Duration) -> bool {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .is_some_and(|t| t.elapsed() < within)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("encoding a raft message: {0}")]
    Encode(postcard::Error),
    #[error("decoding a raft message: {0}")]
    Decode(postcard::Error),
    #[error("raft RPC to {addr}: {status}")]
    Rpc { addr: String, status: Status },
    #[error("raft RPC to {addr} timed out after {ms} ms")]
    Timeout { addr: String, ms: u128 },
    #[error("bad address {addr:?} for a raft peer: {source}")]
    Addr {
        addr: String,
        source: tonic::transport::Error,
    },
}

/// Creates a [`Peer`] per target; openraft keeps one per replication stream.
#[derive(Clone)]
pub struct Network {
    pub reach: Arc<Reach>,
    /// Mutual TLS to the other orchestrators, or plaintext.
    pub security: tardi_tls::Security,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
            client: None,
            reach: self.reach.clone(),
            security: self.security.clone(),
        }
    }
}

pub struct Peer {
    target: NodeId,
    addr: String,
    client: Option<RaftClient<Channel>>,
    reach: Arc<Reach>,
    security: tardi_tls::Security,
}

#[derive(Clone, Copy)]
enum Call {
    Append,
    Vote,
    Snapshot,
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, Member, RaftError<NodeId, E>>>;

impl Peer {
    fn client(&mut self) -> Result<RaftClient<Channel>, WireError> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        // Lazy: connects on first use and reconnects after failures by itself.
        let ch = self
            .security
            .endpoint(&self.addr)
            .map_err(|source| WireError::Addr {
                addr: self.addr.clone(),
                source,
            })?
            .connect_timeout(Duration::from_millis(200))
            .tcp_nodelay(true)
            .connect_lazy();
        let c = RaftClient::new(ch)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        self.client = Some(c.clone());
        Ok(c)
    }

    /// Sends `req`, returns the remote raft's `Result`.
    async fn call<Req: serde::Serialize, Resp: serde::de::DeserializeOwned, E>(
        &mut self,
        call: Call,
        req: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let unreachable = |e: WireError| RPCError::Unreachable(Unreachable::new(&e));
        let data = postcard::to_allocvec(req)
            .map_err(|e| RPCError::Network(NetworkError::new(&WireError::Encode(e))))?;
        let mut c = self.client().map_err(unreachable)?;
        let msg = pb::RaftMessage { data: data.into() };
        let ttl = option.hard_ttl();
        let fut = async {
            match call {
                Call::Append => c.append_entries(msg).await,
                Call::Vote => c.vote(msg).await,
                Call::Snapshot => c.install_snapshot(msg).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, fut).await {
            Err(_) => {
                return Err(unreachable(WireError::Timeout {
                    addr: self.addr.clone(),
                    ms: ttl.as_millis(),
                }));
            }
            Ok(Err(status)) => {
                return Err(unreachable(WireError::Rpc {
                    addr: self.addr.clone(),
                    status,
                }));
            }
            Ok(Ok(r)) => r.into_inner(),
        };
        self.reach.touch(self.target);
        let r: Result<Resp, RaftError<NodeId, E>> = postcard::from_bytes(&reply.data)
            .map_err(|e| RPCError::Network(NetworkError::new(&WireError::Decode(e))))?;
        r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        self.call(Call::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(Call::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        self.call(Call::Vote, &rpc, &option).await
    }

    fn backoff(&self) -> Backoff {
        // A dead peer is retried every 100 ms: a restarted node catches up promptly.
        Backoff::new(std::iter::repeat(Duration::from_millis(100)))
    }
}

/// The `Raft` gRPC service: hands requests to this node's raft.
pub struct RaftSvc {
    pub raft: Raft,
    pub reach: Arc<Reach>,
}

fn decode<T: serde::de::DeserializeOwned>(m: &pb::RaftMessage) -> Result<T, Status> {
    postcard::from_bytes(&m.data)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))
}

fn encode<T: serde::Serialize>(v: &T) -> Result<Response<pb::RaftMessage>, Status> {
    postcard::to_allocvec(v)
        .map(|d| Response::new(pb::RaftMessage { data: d.into() }))
        .map_err(|e| Status::internal(format!("encoding a raft reply: {e}")))
}

#[tonic::async_trait]
impl pb::raft_server::Raft for RaftSvc {
    async fn append_entries(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let r: AppendEntriesRequest<TypeConfig> = decode(req.get_ref())?;
        self.reach
            .touch(r.vote.leader_id().voted_for().unwrap_or_default());
        encode(&self.raft.append_entries(r).await)
    }

    async fn vote(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let r: VoteRequest<NodeId> = decode(req.get_ref())?;
        self.reach
            .touch(r.vote.leader_id().voted_for().unwrap_or_default());
        encode(&self.raft.vote(r).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let r: InstallSnapshotRequest<TypeConfig> = decode(req.get_ref())?;
        self.reach
            .touch(r.vote.leader_id().voted_for().unwrap_or_default());
        encode(&self.raft.install_snapshot(r).await)
    }
}
