//! A power cut of the whole cluster (issue 26, item 8): every machine and every orchestrator
//! loses power at once, then all come back. The documented outcome (`docs/RELIABILITY.md`):
//! the orchestrators' state is on disk (Raft's log and snapshot) and survives, so the cluster
//! comes back with its members and the service with its history; the service's state does not
//! (a backup's image is in memory only, as Tardigrade's), so no machine holds an image to take
//! over from: the service is given up, said so by `tardi status` with the way out, and a new
//! deploy under the same name starts it fresh. Nothing pretends: no instance serves a stale or
//! empty state under the old view.

mod common;

use common::cluster::{Cluster, redis_manifest_with};
use common::resp::write_through_failovers;
use std::time::Duration;

#[test]
fn a_whole_cluster_power_cut_gives_the_service_up_and_keeps_the_cluster() {
    let manifest = redis_manifest_with(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "redis-cluster-cut.manifest",
        "",
    );
    let mut c = Cluster::up_with(3, 3, &[]);
    let (primary, backup, to) = c.deploy_active(&manifest, 1, "redis", 6379);
    let acked = c
        .lab
        .in_node("client", || write_through_failovers(to, 0, 100))
        .unwrap();
    assert_eq!(acked.len(), 100);
    let before = c.service("redis");
    let view = before["view"].as_u64().unwrap();

    // Every node at once, orchestrators first (so none of them sees a machine die), then back.
    let nodes: Vec<String> = (1..=3)
        .map(|i| format!("o{i}"))
        .chain((1..=3).map(|i| format!("m{i}")))
        .collect();
    for n in &nodes {
        c.lab.kill(n).unwrap();
    }
    for n in &nodes {
        c.lab.start(n).unwrap();
    }
    let st = c.wait(
        "the cluster back and the service given up",
        Duration::from_secs(90),
        |st| st["services"][0]["failed"].is_string(),
    );
    let svc = &st["services"][0];
    assert_eq!(svc["name"], "redis", "the service is still known: {st}");
    assert!(
        svc["view"].as_u64().is_some_and(|v| v >= view),
        "its views survive: {svc}"
    );
    let why = svc["failed"].as_str().unwrap();
    assert!(
        why.contains("no machine that holds its state") && why.contains("holds no image"),
        "given up for the reason it was: {why}"
    );
    // No instance runs the service.
    for m in ["m1", "m2", "m3"] {
        assert!(
            c.service_pids(m, "redis-server").is_empty(),
            "{m} runs redis after the cut (primary was {primary}, backup {backup})"
        );
    }
    // The way out: undeploy, deploy again (fresh: the acknowledged writes are gone, by design).
    let out = c.tardi(&["undeploy", "redis"]);
    assert!(
        out.status.success(),
        "undeploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, _, to) = c.deploy_active(&manifest, 1, "redis", 6379);
    let fresh = c
        .lab
        .in_node("client", || write_through_failovers(to, 1000, 10))
        .unwrap();
    assert_eq!(fresh.len(), 10, "the service deployed again serves");
}
