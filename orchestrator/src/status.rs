//! The cluster's status as JSON: what `tardi status --json` prints and what the status page
//! (`crate::page`) shows. One rendering, so the two never disagree.
//!
//! Owns: the JSON shape of a [`pb::ClusterStatus`]. Must not touch: how the status is gathered
//! (the node's own state, or the leader's through `Status`).

use tardi_proto as pb;

/// One instance's report of one service.
pub fn report_json(r: &pb::ServiceReport) -> serde_json::Value {
    serde_json::json!({
        "state": r.state,
        "view": r.view,
        "epoch": r.epoch,
        "decided": r.decided,
        "epochs_per_sec": r.epochs_per_sec,
        "checkpoint_bytes": r.checkpoint_bytes,
        "backup_lag": r.backup_lag,
        "held_packets": r.held_packets,
        "held_bytes": r.held_bytes,
        "pause_p50_us": r.pause_p50_us,
        "pause_p99_us": r.pause_p99_us,
        "takeover_us": r.takeover_us,
        "full_checkpoints": r.full_checkpoints,
        "scrub_checks": r.scrub_checks,
        "scrub_mismatches": r.scrub_mismatches,
        "scrub_last_mismatch": r.scrub_last_mismatch,
    })
}

/// The whole status: `orchestrator` (the node that answered), `cluster` (leader, members by
/// name, who is unreachable), `machines` and `services` (view, primary, backups, spares, the
/// primary's and backups' reports, the view history, the primaries' reported failures and,
/// for a service given up, why).
pub fn json(st: &pb::ClusterStatus) -> serde_json::Value {
    let cl = st.cluster.clone().unwrap_or_default();
    let members: serde_json::Map<String, serde_json::Value> = cl
        .members
        .iter()
        .map(|m| {
            (
                m.name.clone(),
                serde_json::json!({
                    "addr": m.addr,
                    "voter": m.voter,
                    "reachable": m.reachable,
                    // The leader's view of the member's log (null when a follower answered).
                    "log_index": cl.from_leader.then_some(m.matched_index),
                }),
            )
        })
        .collect();
    serde_json::json!({
        "orchestrator": st.orchestrator,
        "cluster": {
            "leader": (!cl.leader.is_empty()).then_some(&cl.leader),
            "from_leader": cl.from_leader,
            "term": cl.term,
            "last_log_index": cl.last_log_index,
            "last_applied": cl.last_applied,
            "members": members,
            "unreachable": cl.members.iter().filter(|m| !m.reachable).map(|m| &m.name).collect::<Vec<_>>(),
        },
        "machines": st.machines.iter().map(|m| serde_json::json!({
            "name": m.name, "api": m.api, "alive": m.alive, "last_seen_ms": m.last_seen_ms,
            "services": m.services,
        })).collect::<Vec<_>>(),
        "services": st.services.iter().map(|s| {
            let v = s.view.clone().unwrap_or_default();
            serde_json::json!({
                "name": s.name,
                "address": s.address,
                "health": s.health,
                "view": v.number,
                "active": v.active,
                "primary": v.primary,
                "backups": v.backups,
                "spares": s.spares,
                "backups_wanted": s.backups_wanted,
                "primary_report": s.primary.as_ref().map(report_json),
                "backup_reports": s.backup_reports.iter().map(report_json).collect::<Vec<_>>(),
                "history": s.history.iter().map(|h| serde_json::json!({
                    "view": h.view, "primary": h.primary, "backups": h.backups,
                    "reason": h.reason, "proposed_ms": h.proposed_ms, "activated_ms": h.activated_ms,
                })).collect::<Vec<_>>(),
                // Why it was given up (null: it was not).
                "failed": (!s.failed.is_empty()).then_some(&s.failed),
                "failures": s.failures.iter().map(|f| serde_json::json!({
                    "view": f.view, "machine": f.machine, "why": f.why, "at_ms": f.at_ms,
                })).collect::<Vec<_>>(),
                "max_failures": s.max_failures,
            })
        }).collect::<Vec<_>>(),
    })
}
