//! Orchestrator nodes in one process on loopback: a cluster of one that a node joins (catching
//! up from a snapshot, the log being purged by then) and leaves, and a node restarted from its
//! data directory with its state; the metrics and the status page they serve. Real gRPC, real
//! redb files.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tardi_orchestrator::client;
use tardi_orchestrator::server::{Options, serve_until};
use tardi_proto as pb;
use tardi_tls::Security;
use tokio::sync::oneshot;

struct Node {
    url: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Node {
    fn start(name: &str, addr: SocketAddr, dir: &Path, join: bool) -> Node {
        Node::start_with(name, addr, dir, join, None)
    }

    fn start_with(
        name: &str,
        addr: SocketAddr,
        dir: &Path,
        join: bool,
        metrics: Option<SocketAddr>,
    ) -> Node {
        let (tx, rx) = oneshot::channel();
        let opts = Options {
            listen: addr,
            name: name.into(),
            failure_timeout: Duration::from_millis(100),
            data_dir: dir.to_path_buf(),
            peers: vec![],
            join,
            metrics,
            security: Security::Plaintext,
        };
        let task = tokio::spawn(async move {
            serve_until(opts, async {
                let _ = rx.await;
            })
            .await
            .expect("orchestrator node");
        });
        Node {
            url: format!("http://{addr}"),
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task.await.expect("node task");
    }
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("tardi-orchestrator-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    TempDir(d)
}

/// Polls `tardi status` of `url` alone until `ok`.
async fn wait(url: &str, what: &str, ok: impl Fn(&pb::ClusterStatus) -> bool) -> pb::ClusterStatus {
    let t0 = Instant::now();
    loop {
        let st = client::status_from(url, &Security::Plaintext, false).await;
        if let Ok(st) = &st
            && ok(st)
        {
            return st.clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn api_of(st: &pb::ClusterStatus, machine: &str) -> Option<String> {
    st.machines
        .iter()
        .find(|m| m.name == machine)
        .map(|m| m.api.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_catches_up_from_a_snapshot_leave_and_restart() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("TARDI_LOG"))
        .with_test_writer()
        .try_init();
    let d1 = temp_dir("o1");
    let d2 = temp_dir("o2");
    let (a1, a2) = (free_addr(), free_addr());
    let o1 = Node::start("o1", a1, &d1.0, false);
    wait(&o1.url, "o1 to lead its cluster of one", |s| {
        s.cluster.as_ref().is_some_and(|c| c.leader == "o1")
    })
    .await;

    // 1,100 registrations of one machine (its address changes each time): more than the
    // snapshot policy's 1,000 entries, so the log's start is purged.
    let n = 1100;
    let mut c = client::connect(&o1.url, &Security::Plaintext)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(n);
    for i in 0..n {
        tx.send(pb::Heartbeat {
            machine: "m1".into(),
            api: format!("10.0.0.1:{i}"),
            services: vec![],
        })
        .await
        .unwrap();
    }
    let last_api = format!("10.0.0.1:{}", n - 1);
    let mut session = c
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let assigned = session.message().await.unwrap().unwrap();
    assert!(assigned.services.is_empty());
    wait(&o1.url, "every registration applied", |s| {
        api_of(s, "m1").as_ref() == Some(&last_api)
    })
    .await;
    drop(tx);

    // o2 joins: it waits (--join), catches up as a learner (from a snapshot: the log's start is
    // gone), becomes a voter.
    let o2 = Node::start("o2", a2, &d2.0, true);
    let r = client::join(&o1.url, &Security::Plaintext, "o2", &a2.to_string())
        .await
        .unwrap();
    let mut members = r.members.clone();
    members.sort();
    assert_eq!(members, ["o1", "o2"]);
    let st = wait(&o2.url, "o2 to hold the replicated state", |s| {
        api_of(s, "m1").as_ref() == Some(&last_api)
    })
    .await;
    let cl = st.cluster.unwrap();
    assert_eq!(cl.leader, "o1");
    assert!(!cl.from_leader);
    assert!(cl.members.iter().all(|m| m.voter), "{cl:?}");

    // A write through a follower is refused with the leader's address; the client follows it.
    let err = client::connect(&o2.url, &Security::Plaintext)
        .await
        .unwrap()
        .activate(pb::ActivateRequest {
            service: "none".into(),
            view: 1,
            primary: "m1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(client::leader_hint(&err).as_deref(), Some(o1.url.as_str()));
    let via = client::Orchestrators::new(&format!("{},{}", o2.url, o1.url), Security::Plaintext);
    let reply = via
        .call(Duration::from_secs(5), |mut c, _| async move {
            c.activate(pb::ActivateRequest {
                service: "none".into(),
                view: 1,
                primary: "m1".into(),
            })
            .await
            .map(|r| r.into_inner())
        })
        .await
        .unwrap();
    assert!(
        !reply.activated && reply.error.contains("none"),
        "{reply:?}"
    );

    // o2 leaves.
    let r = client::leave(
        &format!("{},{}", o2.url, o1.url),
        &Security::Plaintext,
        "o2",
    )
    .await
    .unwrap();
    assert_eq!(r.members, ["o1"]);
    o2.stop().await;

    // o1 restarted from its data directory: the same state, leader of its cluster of one again.
    o1.stop().await;
    // The stopped raft's tasks drop the store's last handles shortly after its shutdown (a
    // process restart has no such wait).
    let t0 = Instant::now();
    while let Err(e) = tardi_orchestrator::store::open(&d1.0) {
        assert!(t0.elapsed() < Duration::from_secs(10), "{e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let o1 = Node::start("o1", a1, &d1.0, false);
    let st = wait(&o1.url, "o1 to lead again after its restart", |s| {
        s.cluster
            .as_ref()
            .is_some_and(|c| c.leader == "o1" && c.members.len() == 1)
    })
    .await;
    assert_eq!(api_of(&st, "m1"), Some(last_api));
    o1.stop().await;
}

/// `GET /metrics`, off the runtime's workers.
async fn scrape(addr: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || tardi_metrics::scrape(addr, Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("metrics endpoint")
}

use tardi_metrics::sample;

/// A node serves Prometheus metrics: its raft state, then the machines and services it learns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_raft_state_machines_and_services() {
    let dir = temp_dir("metrics");
    let (addr, maddr) = (free_addr(), free_addr());
    let node = Node::start_with("m", addr, &dir.0, false, Some(maddr));
    wait(&node.url, "a leader", |s| {
        s.cluster.as_ref().is_some_and(|c| c.from_leader)
    })
    .await;
    let text = scrape(maddr).await;
    assert_eq!(
        sample(&text, "tardi_orchestrator_is_leader{node=\"m\"}"),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(&text, "tardi_orchestrator_term{node=\"m\"}").is_some_and(|t| t >= 1.0),
        "{text}"
    );
    assert!(
        text.contains("# TYPE tardi_orchestrator_last_applied gauge"),
        "{text}"
    );
    // A machine registers with a heartbeat: it appears, alive.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut c = pb::orchestrator_client::OrchestratorClient::connect(node.url.clone())
        .await
        .unwrap();
    let mut assignments = c
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::Heartbeat {
        machine: "m7".into(),
        api: "127.0.0.1:1".into(),
        services: vec![],
    })
    .await
    .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), assignments.message()).await;
    let t0 = Instant::now();
    loop {
        let text = scrape(maddr).await;
        if sample(&text, "tardi_machine_alive{machine=\"m7\"}") == Some(1.0) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "m7 never alive:\n{text}"
        );
        let _ = tx
            .send(pb::Heartbeat {
                machine: "m7".into(),
                api: "127.0.0.1:1".into(),
                services: vec![],
            })
            .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(tx);
    node.stop().await;
}

/// The status page beside the metrics: the leader's `/status.json` is its own status; a
/// follower's page shows the leader's status, fetched by its sampler, and once the leader is
/// gone (after [`page::LEADER_FRESH`]) its own state, saying it cannot reach the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_status_page_shows_the_leaders_view_while_it_answers() {
    use std::sync::Arc;
    use tardi_orchestrator::page;
    let dir = temp_dir("page");
    let (addr, maddr) = (free_addr(), free_addr());
    let node = Node::start_with("o1", addr, &dir.0, false, Some(maddr));
    wait(&node.url, "a leader", |s| {
        s.cluster.as_ref().is_some_and(|c| c.from_leader)
    })
    .await;
    let own = tokio::task::spawn_blocking(move || {
        tardi_metrics::get(maddr, "/status.json", Duration::from_secs(5))
    })
    .await
    .unwrap()
    .expect("status.json");
    let own: serde_json::Value = serde_json::from_str(&own).unwrap();
    assert_eq!(own["page"]["source"], "leader", "{own}");
    assert_eq!(own["page"]["node"], "o1", "{own}");
    assert_eq!(own["cluster"]["leader"], "o1", "{own}");

    // A follower "o2" whose own state names o1, at the node's address, as its leader.
    let url = node.url.clone();
    let follower = move || pb::ClusterStatus {
        orchestrator: "o2".into(),
        cluster: Some(pb::OrchestratorCluster {
            leader: "o1".into(),
            from_leader: false,
            members: vec![pb::OrchestratorMember {
                name: "o1".into(),
                addr: url.clone(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = page::Page::new("o2", Security::Plaintext, Arc::new(follower));
    let sampler = tokio::spawn(p.clone().sample());
    let until = |what: &'static str, ok: fn(&serde_json::Value) -> bool| {
        let p = p.clone();
        async move {
            let t0 = Instant::now();
            loop {
                let j = p.json();
                if ok(&j) {
                    return j;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(15),
                    "timed out waiting for {what}: {j}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let j = until("the leader's view", |j| j["page"]["source"] == "via_leader").await;
    assert_eq!(j["orchestrator"], "o1", "the leader answered: {j}");
    assert_eq!(j["cluster"]["from_leader"], true, "{j}");
    assert_eq!(j["page"]["node"], "o2", "{j}");
    node.stop().await;
    let j = until("the follower's own view", |j| {
        j["page"]["source"] == "follower"
    })
    .await;
    assert_eq!(j["orchestrator"], "o2", "{j}");
    assert!(
        j["page"]["note"]
            .as_str()
            .is_some_and(|n| n.contains("cannot reach the leader o1")),
        "{j}"
    );
    sampler.abort();
}
