//! A backup that stops taking the primary's checkpoints while its machine stays alive (issue
//! 26, item 7), on the lab: the checkpoint link from the primary to the backup is blackholed
//! (the backup's machine drops the primary's packets to its stream port; its heartbeats to the
//! orchestrator go on). The service's output waits for that backup, so until something changes
//! no client gets a reply. The orchestrator sees the backup's image stop advancing while the
//! primary's epochs go on, and after `[tardi.failover] max_backup_lag_ms` (1 s here) replaces
//! it with a spare: the writes go through again, none lost.

mod common;

use common::cluster::{Cluster, redis_manifest_with};
use common::resp::write_through_failovers;
use std::time::{Duration, Instant};

#[test]
fn a_backup_whose_link_is_blackholed_is_replaced_and_the_output_flows_again() {
    let manifest = redis_manifest_with(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "redis-lag.manifest",
        "[tardi.failover]\nmax_backup_lag_ms = 1000\n",
    );
    let c = Cluster::up(3, &[]);
    let (primary, backup, to) = c.deploy_active(&manifest, 1, "redis", 6379);
    let first = c
        .lab
        .in_node("client", || write_through_failovers(to, 0, 300))
        .unwrap();
    assert_eq!(first.len(), 300);

    let from = c.lab.address(&primary).unwrap().to_string();
    let out = c
        .lab
        .exec(
            &backup,
            &[
                "iptables", "-I", "INPUT", "-s", &from, "-p", "tcp", "--dport", "7701", "-j",
                "DROP",
            ],
        )
        .unwrap();
    assert!(out.status.success(), "iptables: {out:?}");
    let t0 = Instant::now();
    let second = c
        .lab
        .in_node("client", || write_through_failovers(to, 300, 300))
        .unwrap();
    let took = t0.elapsed();
    assert_eq!(
        second.len(),
        300,
        "the writes did not go through again after {took:?}\n{}",
        c.logs()
    );
    let svc = c.wait_active("redis", Duration::from_secs(20), |s| {
        s["backups"]
            .as_array()
            .is_some_and(|b| b.len() == 1 && b[0] != backup.as_str())
    });
    assert_eq!(svc["primary"], primary.as_str(), "the primary stays");
    let reasons: Vec<String> = svc["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["reason"].as_str().map(String::from))
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains(&format!("backup {backup}"))),
        "{reasons:?}"
    );
    assert!(
        // The leader's whole log: under load the line can fall out of the tail `logs` shows.
        c.log("o1").contains("backup falls behind: replacing it"),
        "replaced, but not for its lag"
    );
    let acked: Vec<u64> = first.into_iter().chain(second).collect();
    c.assert_no_write_lost(to, &acked, "");
    eprintln!("300 writes through a blackholed backup link took {took:?} (bound 1 s)");
}
