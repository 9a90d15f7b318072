//! A primary cut off but alive fences itself (issue 26, item 5): on the lab, the primary's
//! machine is partitioned (alive, every link down); it hears neither the orchestrators' lease
//! nor its backup, so it stops its service within about twice the failure timeout; the backup
//! takes over with every acknowledged write; healed, the old primary's machine comes back
//! holding nothing of the service but what the orchestrator gives it (a spare, or a backup of
//! the new view), never a second primary.

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
    let fenced = c.wait_fenced(&primary, t0);
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
    // Still serving from the backup, with every write, and no sandbox came back on the old
    // primary's machine unless the orchestrator made it a backup (whose sandbox exists only at
    // a takeover).
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        c.sandbox_links(&primary).is_empty(),
        "a service runs again on the fenced machine"
    );
    let acked: Vec<u64> = first.into_iter().chain(second).collect();
    c.assert_no_write_lost(to, &acked, "");
    eprintln!(
        "fenced {} ms after the partition (failure timeout 100 ms)",
        fenced.as_millis()
    );
}
