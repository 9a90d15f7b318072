//! The orchestrator as a replicated cluster (openraft) on the lab: three `tardi orchestrator`
//! nodes, real instances and services. A power cut of the leader orchestrator elects a new one
//! without a false failover, and a restarted node rejoins from its data directory.

mod common;

use common::cluster::Cluster;
use common::programs;
use common::resp::missing_writes;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn manifest(name: &str) -> PathBuf {
    programs::workspace_root()
        .join("gramine-manifests")
        .join(name)
}

fn addr(svc: &Value, port: u16) -> SocketAddr {
    let a = svc["address"].as_str().expect("service address");
    format!("{a}:{port}").parse().expect("address")
}

/// The leader's answer names a leader and every member reachable.
fn settled(s: &Value, members: usize) -> bool {
    s["cluster"]["from_leader"] == true
        && s["cluster"]["leader"].is_string()
        && s["cluster"]["members"]
            .as_object()
            .is_some_and(|m| m.len() == members && m.values().all(|m| m["reachable"] == true))
}

fn all_alive(s: &Value, machines: usize) -> bool {
    s["machines"]
        .as_array()
        .is_some_and(|m| m.len() == machines && m.iter().all(|m| m["alive"] == true))
}

/// See [`common::resp::write_through_failovers`].
fn writer(to: SocketAddr, from: u64, n: u64) -> Vec<u64> {
    common::resp::write_through_failovers(to, from, n)
}

/// A power cut of the leader orchestrator in steady state: a new leader is elected, the
/// service's view does not change (no false failover), `tardi status` works against the
/// survivors, and a primary's power cut afterwards still fails over with no acknowledged write
/// lost.
/// `machines` machines and 3 orchestrators, redis deployed with one backup and protected, the
/// orchestrator cluster settled: (cluster, the service's status, the whole status).
fn protected_redis(machines: usize) -> (Cluster, Value, Value) {
    let c = Cluster::up_with(machines, 3, &[]);
    c.deploy(&manifest("redis.manifest"), 1);
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let st = c.wait(
        "a leader with every member reachable",
        Duration::from_secs(20),
        |s| settled(s, 3),
    );
    (c, svc, st)
}

#[test]
fn leader_orchestrator_power_cut_causes_no_failover() {
    let (mut c, svc, st) = protected_redis(3);
    let view = svc["view"].clone();
    let history = svc["history"].as_array().map_or(0, Vec::len);
    let leader = st["cluster"]["leader"].as_str().unwrap().to_string();
    let to = addr(&svc, 6379);
    let first = c.lab.in_node("client", || writer(to, 0, 200)).unwrap();
    assert_eq!(first.len(), 200);

    c.lab.kill(&leader).unwrap();
    let st = c.wait("a new leader", Duration::from_secs(20), |s| {
        s["cluster"]["from_leader"] == true
            && s["cluster"]["leader"].as_str().is_some_and(|l| l != leader)
    });
    let new_leader = st["cluster"]["leader"].as_str().unwrap().to_string();
    assert_eq!(
        st["cluster"]["unreachable"],
        serde_json::json!([leader]),
        "the new leader sees the old one unreachable: {st}"
    );
    c.wait(
        "every machine alive at the new leader",
        Duration::from_secs(10),
        |s| all_alive(s, 3),
    );
    // No false failover: the view stays the same, through the new leader's grace period and
    // long after (instances found it and heartbeat to it).
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let s = c.service("redis");
        assert_eq!(
            (&s["view"], s["active"].clone()),
            (&view, Value::Bool(true)),
            "the service's view changed after the orchestrator leader's death: {s}\n{}",
            c.logs()
        );
        assert_eq!(s["history"].as_array().map_or(0, Vec::len), history, "{s}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The survivors alone answer.
    let survivors: Vec<String> = st["cluster"]["members"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(n, _)| **n != leader)
        .map(|(_, m)| m["addr"].as_str().unwrap().to_string())
        .collect();
    let s = c
        .try_status(&["--orchestrator", &survivors.join(",")])
        .expect("status against the survivors");
    assert_eq!(s["cluster"]["leader"], new_leader.as_str());
    assert!(s["services"].as_array().is_some_and(|a| a.len() == 1));

    // The service is still protected: a primary power cut fails over with every acknowledged
    // write.
    let svc = c.service("redis");
    let primary = svc["primary"].as_str().unwrap().to_string();
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let second = c.lab.in_node("client", || writer(to, 200, 200)).unwrap();
    assert_eq!(second.len(), 200);
    c.lab.kill(&primary).unwrap();
    let third = c.lab.in_node("client", || writer(to, 400, 200)).unwrap();
    assert_eq!(third.len(), 200, "writes resume after the failover");
    c.wait_active("redis", Duration::from_secs(20), |s| {
        s["primary"] == backup.as_str()
    });
    let missing = c
        .lab
        .in_node("client", || {
            missing_writes(to, first.iter().chain(&second).chain(&third).copied())
        })
        .unwrap();
    assert_eq!(missing, 0, "acknowledged writes lost");
}

/// A killed orchestrator (here the leader), restarted with its data directory, rejoins and
/// catches up: its log reaches the leader's, and it holds what was decided while it was down.
#[test]
fn restarted_orchestrator_rejoins_and_catches_up() {
    let mut c = Cluster::up_with(2, 3, &[]);
    let st = c.wait(
        "a leader with every member reachable",
        Duration::from_secs(20),
        |s| settled(s, 3),
    );
    let old = st["cluster"]["leader"].as_str().unwrap().to_string();
    let old_addr = st["cluster"]["members"][&old]["addr"]
        .as_str()
        .unwrap()
        .to_string();
    c.lab.kill(&old).unwrap();
    // Written while it is down.
    c.deploy(&manifest("redis.manifest"), 1);
    c.wait_active("redis", Duration::from_secs(30), |_| true);
    c.lab.start(&old).unwrap();
    let st = c.wait(
        "the restarted node to catch up",
        Duration::from_secs(30),
        |s| {
            let cl = &s["cluster"];
            settled(s, 3)
                && cl["members"][&old]["log_index"].as_u64() == cl["last_log_index"].as_u64()
        },
    );
    assert_ne!(st["cluster"]["leader"], old.as_str());
    // It answers from its own replicated state, which has the service deployed meanwhile.
    let mine = c
        .try_status(&["--orchestrator", &old_addr, "--any-node"])
        .expect("status from the restarted node");
    assert_eq!(mine["orchestrator"], old.as_str(), "{mine}");
    assert!(
        mine["services"]
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["name"] == "redis")),
        "{mine}"
    );
}

/// The leader orchestrator cut off (alive, no links): the others elect a new leader and the
/// instances move to it (HTTP/2 keepalive notices the silent node) with no view change; what
/// the cut-off node proposes meanwhile (it hears no machine, so it suspects them all) is never
/// applied; healed, it follows the new leader and holds the same views.
#[test]
fn partitioned_leader_orchestrator_changes_nothing() {
    let (mut c, svc, st) = protected_redis(2);
    let view = svc["view"].clone();
    let history = svc["history"].as_array().map_or(0, Vec::len);
    let old = st["cluster"]["leader"].as_str().unwrap().to_string();
    let old_addr = st["cluster"]["members"][&old]["addr"]
        .as_str()
        .unwrap()
        .to_string();
    let unchanged = |c: &Cluster, secs: u64| {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(secs) {
            let s = c.service("redis");
            assert_eq!(
                (&s["view"], s["active"].clone()),
                (&view, Value::Bool(true)),
                "the service's view changed: {s}\n{}",
                c.logs()
            );
            assert_eq!(s["history"].as_array().map_or(0, Vec::len), history, "{s}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    c.lab.partition(&old).unwrap();
    c.wait("a new leader", Duration::from_secs(20), |s| {
        s["cluster"]["from_leader"] == true
            && s["cluster"]["leader"].as_str().is_some_and(|l| l != old)
    });
    c.wait(
        "every machine alive at the new leader",
        Duration::from_secs(10),
        |s| all_alive(s, 2),
    );
    unchanged(&c, 3);

    c.lab.heal(&old).unwrap();
    c.wait(
        "the old leader to follow the new one",
        Duration::from_secs(20),
        |s| {
            let cl = &s["cluster"];
            settled(s, 3)
                && cl["leader"] != old.as_str()
                && cl["members"][&old]["log_index"].as_u64() == cl["last_log_index"].as_u64()
        },
    );
    unchanged(&c, 2);
    let mine = c
        .try_status(&["--orchestrator", &old_addr, "--any-node"])
        .expect("status from the old leader");
    let s = mine["services"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == "redis").cloned())
        .unwrap_or(Value::Null);
    assert_eq!(s["view"], view, "the old leader's own state: {mine}");
    assert_eq!(
        s["history"].as_array().map_or(0, Vec::len),
        history,
        "{mine}"
    );
}

/// A primary cut off from the orchestrators (its machine still reaches the other machines and
/// the clients) is deposed: the backup takes over in a new view, and the old primary, whose
/// lease ran out and whose backup stops acknowledging it once it holds the newer view, fences
/// itself: its service stays stopped (before the fence, it ran without an epoch decided and
/// kept its replies held: the new primary refuses its checkpoints). The service goes on at
/// the new primary.
#[test]
fn a_primary_cut_off_from_the_orchestrators_is_deposed_and_fences_itself() {
    programs::build("dirtier");
    let c = Cluster::up(3, &[]);
    c.deploy(&manifest("dirtier.manifest"), 1);
    let svc = c.wait_active("dirtier", Duration::from_secs(30), |_| true);
    let old = svc["primary"].as_str().unwrap().to_string();
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let view = svc["view"].as_u64().unwrap();
    let to = addr(&svc, 7100);
    let o1 = c.lab.address("o1").unwrap().to_string();
    // Only the orchestrator is unreachable from the old primary's machine.
    for (chain, dir) in [("INPUT", "-s"), ("OUTPUT", "-d")] {
        let out = c
            .lab
            .exec(&old, &["iptables", "-I", chain, dir, &o1, "-j", "DROP"])
            .unwrap();
        assert!(out.status.success(), "iptables: {out:?}");
    }
    let t0 = Instant::now();
    let s = c.wait_active("dirtier", Duration::from_secs(20), |s| {
        s["primary"] == backup.as_str() && s["view"].as_u64().is_some_and(|v| v > view)
    });
    let fenced = c.wait_frozen(&old, "dirtier", t0);
    eprintln!(
        "the deposed primary fenced itself {} ms after the cut",
        fenced.as_millis()
    );
    // Meanwhile the service goes on at the new primary.
    let back = c
        .lab
        .in_node("client", || {
            programs::wait_ready(to, Duration::from_secs(10))
        })
        .unwrap();
    assert!(
        back.is_ok(),
        "the new primary {} does not answer: {s}",
        s["primary"]
    );
}

/// One orchestrator of three down (a minority, not the leader) while the primary's machine
/// loses power: the two left still decide the failover and the re-protection, with every
/// acknowledged write.
#[test]
fn an_orchestrator_minority_down_while_the_primary_fails() {
    let (mut c, svc, st) = protected_redis(3);
    let leader = st["cluster"]["leader"].as_str().unwrap().to_string();
    let follower = st["cluster"]["members"]
        .as_object()
        .unwrap()
        .keys()
        .find(|n| **n != leader)
        .unwrap()
        .clone();
    let primary = svc["primary"].as_str().unwrap().to_string();
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let to = addr(&svc, 6379);
    let first = c.lab.in_node("client", || writer(to, 0, 200)).unwrap();
    assert_eq!(first.len(), 200);
    c.lab.kill(&follower).unwrap();
    c.lab.kill(&primary).unwrap();
    let second = c.lab.in_node("client", || writer(to, 200, 200)).unwrap();
    assert_eq!(second.len(), 200, "writes resume after the failover");
    // Failed over to the backup, and re-protected by the spare.
    reprotected_with_every_write(&c, &primary, &backup, to, &[&first, &second], 30, "");
}

/// The leader orchestrator loses power in the middle of a view change: the primary's machine
/// has just lost power and the failover's view is proposed (or, if the poll saw it active
/// already, the re-protection's is). The new leader finishes what was started or discards it
/// and proposes again: the service ends up active on the old backup, re-protected, with every
/// acknowledged write.
#[test]
fn leader_orchestrator_power_cut_in_the_middle_of_a_view_change() {
    let (mut c, svc, st) = protected_redis(3);
    let leader = st["cluster"]["leader"].as_str().unwrap().to_string();
    let primary = svc["primary"].as_str().unwrap().to_string();
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let view = svc["view"].as_u64().unwrap();
    let to = addr(&svc, 6379);
    let first = c.lab.in_node("client", || writer(to, 0, 200)).unwrap();
    assert_eq!(first.len(), 200);
    c.lab.kill(&primary).unwrap();
    // The first newer view seen, proposed or active.
    let t0 = Instant::now();
    let seen = loop {
        let s = c.service("redis");
        if s["view"].as_u64().is_some_and(|v| v > view) {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no view after the power cut: {s}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    c.lab.kill(&leader).unwrap();
    let when = format!(
        "the leader was cut when view {} was {}",
        seen["view"],
        if seen["active"] == true {
            "active"
        } else {
            "proposed"
        }
    );
    eprintln!("{when}");
    let second = c.lab.in_node("client", || writer(to, 200, 200)).unwrap();
    assert_eq!(
        second.len(),
        200,
        "writes resume after the failover ({when})"
    );
    reprotected_with_every_write(
        &c,
        &primary,
        &backup,
        to,
        &[&first, &second],
        40,
        &format!(" ({when})"),
    );
}

/// The backup's machine and the leader orchestrator lose power together: the primary hears
/// neither its backup nor the orchestrators' lease, so its fence freezes the service (it
/// cannot tell this from a partition of its own machine). Here it holds the only copy of the
/// state: once a new leader renews the lease it thaws, keeps its role (no failover), is
/// re-protected by the spare, and every acknowledged write is there. (A fence that killed the
/// service lost it all: the suite met this when a backup's loss fell into an election.)
#[test]
fn a_primary_frozen_while_its_backup_and_the_leader_fail_thaws_with_every_write() {
    let (mut c, svc, st) = protected_redis(3);
    let leader = st["cluster"]["leader"].as_str().unwrap().to_string();
    let primary = svc["primary"].as_str().unwrap().to_string();
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let to = addr(&svc, 6379);
    let first = c.lab.in_node("client", || writer(to, 0, 200)).unwrap();
    assert_eq!(first.len(), 200);
    c.lab.kill(&backup).unwrap();
    c.lab.kill(&leader).unwrap();
    let second = c.lab.in_node("client", || writer(to, 200, 200)).unwrap();
    assert_eq!(second.len(), 200, "writes resume\n{}", c.logs());
    let s = c.wait_active("redis", Duration::from_secs(40), |s| {
        s["backups"]
            .as_array()
            .is_some_and(|b| b.len() == 1 && b[0] != backup.as_str())
    });
    assert_eq!(
        s["primary"],
        primary.as_str(),
        "the primary kept its role: {s}"
    );
    // Its whole log (a loaded run once pushed both lines out of the tail `logs` shows).
    let log = c.log(&primary);
    assert!(
        log.contains("primary cut off: freezing its service")
            && log.contains("thawing the service"),
        "the primary was not frozen and thawed (the test did not test the fence):\n{}",
        c.logs()
    );
    let acked: Vec<u64> = first.into_iter().chain(second).collect();
    c.assert_no_write_lost(to, &acked, "");
}

/// Waits (up to `secs`) for redis to be active on `backup` with a new backup (not the failed
/// `primary`), then checks that every write of `acked` is there.
fn reprotected_with_every_write(
    c: &Cluster,
    primary: &str,
    backup: &str,
    to: SocketAddr,
    acked: &[&[u64]],
    secs: u64,
    when: &str,
) {
    let s = c.wait_active("redis", Duration::from_secs(secs), |s| {
        s["primary"] == backup
            && s["backups"]
                .as_array()
                .is_some_and(|b| b.len() == 1 && b[0] != primary)
    });
    let missing = c
        .lab
        .in_node("client", || {
            missing_writes(to, acked.iter().flat_map(|a| a.iter().copied()))
        })
        .unwrap();
    assert_eq!(missing, 0, "acknowledged writes lost{when}: {s}");
}
