//! The Prometheus exposition of this machine (`--metrics`).

#[allow(unused_imports)]
use super::*;

/// The Prometheus exposition of this machine: per service, its role and what its report says
/// (the same figures the heartbeats carry to the orchestrator).
pub(crate) fn metrics(machine: &str, reports: &[pb::ServiceReport]) -> String {
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
