//! The `Orchestrator` gRPC service: instances' sessions and activations, the CLI's deploy,
//! undeploy, restart, status and membership calls, each served by the leader (writes) or any
//! node (status).

#[allow(unused_imports)]
use super::*;

#[derive(Clone)]
pub(super) struct Svc(pub(super) Arc<Orch>);

pub(super) type SessionStream = Pin<Box<dyn Stream<Item = Result<pb::Assignments, Status>> + Send>>;

#[tonic::async_trait]
impl pb::orchestrator_server::Orchestrator for Svc {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        req: Request<Streaming<pb::Heartbeat>>,
    ) -> Result<Response<SessionStream>, Status> {
        self.0.check_leader()?;
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let orch = self.0.clone();
        tokio::spawn(async move {
            let mut version = orch.shared.version.subscribe();
            let mut leader = orch.leader.subscribe();
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
                        orch.heartbeat(&hb);
                        let known = orch.shared.read(|a| a.views.machines.get(&hb.machine) == Some(&hb.api));
                        if !known {
                            match orch.write(Command::Register { machine: hb.machine.clone(), api: hb.api.clone() }).await {
                                Ok(_) => {}
                                Err(e) => {
                                    let _ = tx.send(Err(e)).await;
                                    break;
                                }
                            }
                        }
                        if machine.is_none() {
                            tracing::info!(machine = %hb.machine, api = %hb.api, "instance connected");
                            machine = Some(hb.machine.clone());
                            if tx.send(Ok(orch.assignments(&hb.machine))).await.is_err() {
                                break;
                            }
                        }
                        if let Some(renewal) = orch.renewal()
                            && tx.send(Ok(renewal)).await.is_err()
                        {
                            break;
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
                    r = leader.changed() => {
                        // Lost the leadership: send the instance to the new leader.
                        if r.is_err() || leader.borrow().is_none() {
                            let _ = tx.send(Err(orch.not_leader(orch.leader_member()))).await;
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
        self.0.check_leader()?;
        let r = req.into_inner();
        let res = self
            .0
            .write(Command::Activate {
                service: r.service.clone(),
                view: r.view,
                primary: r.primary.clone(),
                now_ms: now_ms(),
            })
            .await?;
        Ok(Response::new(match res {
            Ok(()) => {
                tracing::warn!(service = %r.service, view = r.view, primary = %r.primary, "view activated");
                pb::ActivateReply {
                    activated: true,
                    error: String::new(),
                }
            }
            Err(error) => pb::ActivateReply {
                activated: false,
                error,
            },
        }))
    }

    async fn deploy(
        &self,
        req: Request<pb::DeployRequest>,
    ) -> Result<Response<pb::DeployReply>, Status> {
        self.0.check_leader()?;
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
        // A new leader learns which machines are alive as their sessions reach it: during its
        // grace period, wait for enough of them rather than refuse.
        let (alive, placed) = loop {
            let alive = self.0.alive();
            let placed = self.0.shared.read(|a| a.views.placement(&alive, r.backups));
            let in_grace = self
                .0
                .leader
                .borrow()
                .is_some_and(|t| t.elapsed() < grace(self.0.opts.failure_timeout));
            if placed.is_some() || !in_grace {
                break (alive, placed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.0.check_leader()?;
        let Some((primary, backup_machines)) = placed else {
            return fail(format!(
                "cannot deploy {name:?} with {} backup(s): it needs {} live machines and {} are live ({}); nothing was deployed",
                r.backups,
                r.backups + 1,
                alive.len(),
                alive.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        };
        let res = self
            .0
            .write(Command::Deploy {
                name: name.clone(),
                manifest: r.manifest,
                manifest_path: r.manifest_path,
                backups: r.backups,
                primary,
                backup_machines,
                policy: FailurePolicy::from(m.tardi.failover),
                now_ms: now_ms(),
            })
            .await?;
        if let Err(e) = res {
            return fail(format!("{e}; nothing was deployed"));
        }
        let view = self.0.shared.read(|a| {
            a.views
                .services
                .get(&name)
                .and_then(|s| s.latest().map(to_pb))
        });
        Ok(Response::new(pb::DeployReply {
            service: name,
            view,
            error: String::new(),
        }))
    }

    async fn undeploy(
        &self,
        req: Request<pb::UndeployRequest>,
    ) -> Result<Response<pb::UndeployReply>, Status> {
        let service = req.into_inner().service;
        let cmd = Command::Undeploy {
            service: service.clone(),
        };
        let error = self.0.cli_write(cmd, &service, "undeployed").await?;
        Ok(Response::new(pb::UndeployReply { error }))
    }

    async fn restart(
        &self,
        req: Request<pb::RestartRequest>,
    ) -> Result<Response<pb::RestartReply>, Status> {
        let service = req.into_inner().service;
        let cmd = Command::Restart {
            service: service.clone(),
            now_ms: now_ms(),
        };
        let error = self
            .0
            .cli_write(cmd, &service, "restarted after it was given up")
            .await?;
        Ok(Response::new(pb::RestartReply { error }))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        Ok(Response::new(self.0.status()))
    }

    async fn join(
        &self,
        req: Request<pb::JoinRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        self.0.check_leader()?;
        let r = req.into_inner();
        if r.name.is_empty() || r.name.len() > 64 || r.addr.is_empty() {
            return Err(Status::invalid_argument(
                "join needs a node name (1-64 bytes) and its address",
            ));
        }
        let id = consensus::node_id(&r.name);
        let member = Member {
            name: r.name.clone(),
            addr: endpoint(&r.addr),
        };
        let clash = self.0.shared.read(|a| {
            store::members(a)
                .into_iter()
                .any(|(i, m)| i == id && m.name != r.name)
        });
        if clash {
            return Err(Status::already_exists(format!(
                "{:?} hashes to the id of another member: choose another name",
                r.name
            )));
        }
        let err = |e: RaftError<NodeId, ClientWriteError<NodeId, Member>>| match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                self.0.not_leader(f.leader_node)
            }
            e => Status::failed_precondition(format!("adding {}: {e}", r.name)),
        };
        // A learner first: it catches up without counting in quorums; then a voter.
        self.0
            .raft
            .add_learner(id, member, true)
            .await
            .map_err(err)?;
        let res = self
            .0
            .raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(err)?;
        tracing::warn!(node = %r.name, addr = %r.addr, "orchestrator joined the cluster");
        Ok(Response::new(reply_members(res.membership)))
    }

    async fn leave(
        &self,
        req: Request<pb::LeaveRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        self.0.check_leader()?;
        let r = req.into_inner();
        let id = consensus::node_id(&r.name);
        let (voter, known) = self.0.shared.read(|a| {
            let m = a.membership.membership();
            (
                m.voter_ids().any(|v| v == id),
                m.get_node(&id).is_some_and(|n| n.name == r.name),
            )
        });
        if !known {
            return Err(Status::not_found(format!(
                "{:?} is not a member of the orchestrator cluster",
                r.name
            )));
        }
        let change = if voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        let res = self
            .0
            .raft
            .change_membership(change, false)
            .await
            .map_err(|e| match e {
                RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                    self.0.not_leader(f.leader_node)
                }
                e => Status::failed_precondition(format!("removing {}: {e}", r.name)),
            })?;
        tracing::warn!(node = %r.name, "orchestrator left the cluster");
        Ok(Response::new(reply_members(res.membership)))
    }
}

pub(super) fn reply_members(
    m: Option<openraft::Membership<NodeId, Member>>,
) -> pb::MembershipReply {
    pb::MembershipReply {
        members: m
            .map(|m| m.nodes().map(|(_, n)| n.name.clone()).collect())
            .unwrap_or_default(),
    }
}
