//! What the orchestrator shows: the status every node answers (`tardi status`, the status
//! page) and its Prometheus metrics.

#[allow(unused_imports)]
use super::*;

impl Orch {
    /// What `tardi status` shows, as this node knows it (machines' liveness and reports are the
    /// leader's only). Also what the metrics are rendered from.
    pub(super) fn status(&self) -> pb::ClusterStatus {
        let orch = self;
        let leader = orch.is_leader();
        let alive = orch.alive();
        let live = orch.live();
        let cluster = orch.cluster();
        let now = now_ms();
        orch.shared.read(|a| {
            let views = &a.views;
            let machines = views
                .machines
                .iter()
                .map(|(name, api)| pb::MachineStatus {
                    name: name.clone(),
                    api: api.clone(),
                    alive: leader && alive.contains(name),
                    last_seen_ms: live
                        .seen
                        .get(name)
                        .map_or(u64::MAX, |t| t.elapsed().as_millis() as u64),
                    services: {
                        let mut v: Vec<String> = live
                            .reports
                            .keys()
                            .filter(|(m, _)| m == name)
                            .map(|(_, s)| s.clone())
                            .collect();
                        v.sort();
                        v
                    },
                })
                .collect();
            let services = views
                .services
                .values()
                .map(|s| {
                    let v = s.latest().cloned();
                    let report =
                        |m: &str| live.reports.get(&(m.to_string(), s.name.clone())).cloned();
                    let primary = v.as_ref().and_then(|v| report(&v.primary));
                    pb::ServiceStatus {
                        name: s.name.clone(),
                        address: primary
                            .as_ref()
                            .map(|p| p.address.clone())
                            .unwrap_or_default(),
                        view: v.as_ref().map(to_pb),
                        spares: views.spares(s, &alive),
                        health: views.health(s, &alive).to_string(),
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
                        failed: s.failed.clone().unwrap_or_default(),
                        failures: s
                            .failures
                            .iter()
                            // Those within the window (the state drops older ones only when
                            // the next failure is recorded).
                            .filter(|f| now.saturating_sub(f.at_ms) < s.policy.window_ms)
                            .map(|f| pb::Failure {
                                view: f.view,
                                machine: f.machine.clone(),
                                why: f.why.clone(),
                                at_ms: f.at_ms,
                            })
                            .collect(),
                        max_failures: s.policy.max_failures,
                    }
                })
                .collect();
            pb::ClusterStatus {
                machines,
                services,
                orchestrator: orch.opts.name.clone(),
                cluster: Some(cluster),
            }
        })
    }

    /// The Prometheus exposition of this node: its raft state, and (meaningful on the leader,
    /// which alone hears heartbeats) machines, services, views and the primaries' and backups'
    /// latest reports.
    pub(super) fn metrics(&self) -> String {
        let st = self.status();
        let mut e = tardi_metrics::Exposition::new();
        let node = self.opts.name.as_str();
        let me = [("node", node)];
        let c = st.cluster.clone().unwrap_or_default();
        e.gauge(
            "tardi_orchestrator_is_leader",
            "1 if this node is the orchestrators' leader.",
            &me,
            f64::from(u8::from(c.from_leader)),
        );
        e.gauge(
            "tardi_orchestrator_term",
            "Raft term this node is in.",
            &me,
            c.term as f64,
        );
        e.gauge(
            "tardi_orchestrator_last_log_index",
            "Last raft log index this node holds.",
            &me,
            c.last_log_index as f64,
        );
        e.gauge(
            "tardi_orchestrator_last_applied",
            "Last raft log index applied to the view manager.",
            &me,
            c.last_applied as f64,
        );
        for m in &c.members {
            let l = [("node", node), ("member", m.name.as_str())];
            e.gauge(
                "tardi_orchestrator_member_reachable",
                "1 if this node heard from (or reached) the member within the last second.",
                &l,
                f64::from(u8::from(m.reachable)),
            );
            e.gauge(
                "tardi_orchestrator_member_voter",
                "1 for a voter, 0 for a learner being caught up.",
                &l,
                f64::from(u8::from(m.voter)),
            );
        }
        for m in &st.machines {
            let l = [("machine", m.name.as_str())];
            e.gauge("tardi_machine_alive", "1 if the machine's instance sent a heartbeat within the failure timeout (leader only).", &l, f64::from(u8::from(m.alive)));
            if m.last_seen_ms != u64::MAX {
                e.gauge(
                    "tardi_machine_last_seen_seconds",
                    "Seconds since the machine's last heartbeat (leader only).",
                    &l,
                    m.last_seen_ms as f64 / 1e3,
                );
            }
        }
        for s in &st.services {
            let name = s.name.as_str();
            let l = [("service", name)];
            let v = s.view.clone().unwrap_or_default();
            e.gauge(
                "tardi_service_view",
                "The service's latest view number.",
                &l,
                v.number as f64,
            );
            e.gauge(
                "tardi_service_view_active",
                "1 if the latest view is active, 0 while it is only proposed.",
                &l,
                f64::from(u8::from(v.active)),
            );
            e.gauge(
                "tardi_service_backups",
                "Backups in the latest view.",
                &l,
                v.backups.len() as f64,
            );
            e.gauge(
                "tardi_service_backups_wanted",
                "Backups the service was deployed with.",
                &l,
                f64::from(s.backups_wanted),
            );
            e.gauge(
                "tardi_service_spares",
                "Live machines with no role for the service.",
                &l,
                s.spares.len() as f64,
            );
            e.gauge("tardi_service_health", "1 for the service's current health (protected, unprotected, starting, changing views, failing over, unavailable).", &[("service", name), ("health", s.health.as_str())], 1.0);
            e.counter(
                "tardi_service_view_changes_total",
                "Views proposed for the service since it was deployed.",
                &l,
                s.history.len() as f64,
            );
            e.gauge(
                "tardi_service_failures",
                "Reported failures of the service's primaries within its [tardi.failover] window.",
                &l,
                s.failures.len() as f64,
            );
            e.gauge(
                "tardi_service_given_up",
                "1 if the orchestrator gave the service up after its primaries failed.",
                &l,
                f64::from(u8::from(!s.failed.is_empty())),
            );
            if let Some(last) = s
                .history
                .iter()
                .rev()
                .find(|h| h.activated_ms > 0 && h.view > 1)
            {
                e.gauge(
                    "tardi_service_last_view_change_seconds",
                    "From proposal to activation of the newest view after the first.",
                    &l,
                    last.activated_ms.saturating_sub(last.proposed_ms) as f64 / 1e3,
                );
            }
            if let Some(p) = &s.primary {
                let l = [("service", name), ("machine", v.primary.as_str())];
                e.gauge(
                    "tardi_primary_epoch",
                    "Last epoch the primary produced.",
                    &l,
                    p.epoch as f64,
                );
                e.gauge(
                    "tardi_primary_decided_epoch",
                    "Last epoch every required backup acknowledged (its output is released).",
                    &l,
                    p.decided as f64,
                );
                e.gauge(
                    "tardi_primary_epochs_per_second",
                    "Recent epoch rate.",
                    &l,
                    p.epochs_per_sec,
                );
                e.gauge(
                    "tardi_primary_checkpoint_bytes",
                    "Mean encoded size of recent checkpoints.",
                    &l,
                    p.checkpoint_bytes as f64,
                );
                e.gauge(
                    "tardi_primary_pause_p50_seconds",
                    "Median of recent checkpoint pauses.",
                    &l,
                    p.pause_p50_us as f64 / 1e6,
                );
                e.gauge(
                    "tardi_primary_pause_p99_seconds",
                    "99th percentile of recent checkpoint pauses.",
                    &l,
                    p.pause_p99_us as f64 / 1e6,
                );
                e.gauge(
                    "tardi_primary_undecided_epochs",
                    "Epochs produced but not yet decided.",
                    &l,
                    p.backup_lag as f64,
                );
                e.gauge(
                    "tardi_primary_held_packets",
                    "Output packets held until their epoch is decided.",
                    &l,
                    p.held_packets as f64,
                );
                e.gauge(
                    "tardi_primary_held_bytes",
                    "Bytes of held output.",
                    &l,
                    p.held_bytes as f64,
                );
            }
            for m in &v.backups {
                let Some(b) = self
                    .live()
                    .reports
                    .get(&(m.clone(), s.name.clone()))
                    .cloned()
                else {
                    continue;
                };
                let l = [("service", name), ("machine", m.as_str())];
                e.gauge(
                    "tardi_backup_queued_epoch",
                    "Last epoch the backup acknowledged (queued).",
                    &l,
                    b.epoch as f64,
                );
                e.gauge(
                    "tardi_backup_applied_epoch",
                    "Last epoch applied to the backup's image.",
                    &l,
                    b.decided as f64,
                );
                e.gauge(
                    "tardi_backup_lag",
                    "Checkpoints acknowledged but not yet applied.",
                    &l,
                    b.backup_lag as f64,
                );
            }
        }
        e.render()
    }
}
