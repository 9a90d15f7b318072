//! A primary cut off but alive fences itself (issue 26, item 5): on the lab, the primary's
//! machine is partitioned (alive, every link down); it hears neither the orchestrators' lease
//! nor its backup, so it freezes its service (its processes stay stopped, its state kept: it
//! cannot tell this from its backup and the orchestrators' leader failing together, when it
//! holds the only copy) within about twice the failure timeout; the backup takes over with
//! every acknowledged write; healed, the old primary hears of the newer view and stops the
//! frozen service for good: never a second primary.

mod common;

use common::cluster::Cluster;
use common::resp::write_through_failovers;
use std::time::{Duration, Instant};

#[test]
fn a_partitioned_primary_fences_itself_and_comes_back_without_its_service() {
    let mut c = Cluster::up(3, &[]);
    let redis = common::programs::workspace_root().join("gramine-manifests/redis.manifest");
    let (primary, backup, to) = c.deploy_active(&redis, 1, "redis", 6379);
    let first = c
        .lab
        .in_node("client", || write_through_failovers(to, 0, 300))
        .unwrap();
    assert_eq!(first.len(), 300);
    assert!(
        !c.sandbox_links(&primary).is_empty(),
        "the primary runs a sandbox"
    );

    c.lab.partition(&primary).unwrap();
    let t0 = Instant::now();
    let fenced = c.wait_frozen(&primary, "redis", t0);
    c.wait_active("redis", Duration::from_secs(20), |s| {
        s["primary"] == backup.as_str()
    });
    let second = c
        .lab
        .in_node("client", || write_through_failovers(to, 300, 300))
        .unwrap();
    assert_eq!(second.len(), 300, "writes resume on the backup");

    c.lab.heal(&primary).unwrap();
    c.wait(
        "the fenced machine back, without its old role",
        Duration::from_secs(20),
        |s| {
            let back = s["machines"].as_array().is_some_and(|m| {
                m.iter()
                    .any(|m| m["name"] == primary.as_str() && m["alive"] == true)
            });
            back && s["services"][0]["primary"] == backup.as_str()
        },
    );
    // Deposed (a newer view without it), the frozen service is stopped for good: its sandbox
    // goes. Still serving from the backup, with every write.
    let t1 = std::time::Instant::now();
    while !c.sandbox_links(&primary).is_empty() {
        assert!(
            t1.elapsed() < Duration::from_secs(20),
            "the frozen service on the deposed machine was not stopped\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let acked: Vec<u64> = first.into_iter().chain(second).collect();
    c.assert_no_write_lost(to, &acked, "");
    eprintln!(
        "fenced {} ms after the partition (failure timeout 100 ms)",
        fenced.as_millis()
    );
}
