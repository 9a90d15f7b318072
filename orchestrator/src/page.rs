//! The status page, served beside `GET /metrics` (`--metrics ADDR`): `GET /` (HTML), its script
//! and style sheet (`orchestrator/assets/`, compiled in), and `GET /status.json`, the data the
//! script fetches every second.
//!
//! `status.json` is [`crate::status::json`] (what `tardi status --json` prints) with a `page`
//! object (which node served it, and whose view of the cluster it is) and, per service, its
//! time series ([`Series`]) and its view history with how long each change took (`changes`).
//!
//! Any node serves the page. The leader answers from its own state. A follower shows the
//! leader's status (fetched by its sampler through `Status`, at most [`LEADER_FRESH`] old) and
//! says so; when it cannot reach the leader it shows its own applied state and says that
//! machines' liveness and figures are unknown there.
//!
//! Owns: the page's routes, its JSON, and the sampler that records the series once a
//! [`crate::series::INTERVAL`]. Must not touch: the view manager's state (read-only, through
//! the status).

use crate::client;
use crate::series::{self, Series};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tardi_proto as pb;
use tardi_proto::orchestrator_client::OrchestratorClient;
use tardi_tls::Security;
use tonic::transport::Channel;

const HTML: &str = include_str!("../assets/status.html");
const SCRIPT: &str = include_str!("../assets/status.js");
const STYLE: &str = include_str!("../assets/status.css");

/// How old the leader's status a follower shows may be.
pub const LEADER_FRESH: Duration = Duration::from_secs(3);

/// How long a follower's sampler waits for the leader's status.
const LEADER_TIMEOUT: Duration = Duration::from_secs(1);

/// This node's status, as `tardi status` would get it from this node.
pub type LocalStatus = Arc<dyn Fn() -> pb::ClusterStatus + Send + Sync>;

/// Whose view of the cluster a page shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// This node is the leader.
    Leader,
    /// This node is a follower showing the status the leader gave it.
    ViaLeader(String),
    /// This node is a follower and shows its own state: no liveness, no figures.
    Follower,
}

/// The status page of one node.
pub struct Page {
    node: String,
    local: LocalStatus,
    /// How a follower's sampler reaches the leader (the node's own TLS identity).
    security: Security,
    state: Mutex<State>,
    leader_client: tokio::sync::Mutex<Option<(String, OrchestratorClient<Channel>)>>,
}

#[derive(Default)]
struct State {
    series: Series,
    /// The leader's status as last fetched by a follower's sampler.
    from_leader: Option<(Instant, pb::ClusterStatus)>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn is_leaders(st: &pb::ClusterStatus) -> bool {
    st.cluster.as_ref().is_some_and(|c| c.from_leader)
}

impl Page {
    pub fn new(node: &str, security: Security, local: LocalStatus) -> Arc<Page> {
        Arc::new(Page {
            node: node.to_string(),
            local,
            security,
            state: Mutex::new(State::default()),
            leader_client: tokio::sync::Mutex::new(None),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the cluster's status once a [`series::INTERVAL`], until the task is aborted.
    pub async fn sample(self: Arc<Self>) {
        let mut tick = tokio::time::interval(series::INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let local = (self.local)();
            let leaders = if is_leaders(&local) {
                None
            } else {
                self.fetch_leader(&local).await
            };
            let mut state = self.state();
            match leaders {
                Some(l) => {
                    state.series.record(now_ms(), &l);
                    state.from_leader = Some((Instant::now(), l));
                }
                None => state.series.record(now_ms(), &local),
            }
        }
    }

    /// The leader's status, asked by a follower (`None` if it knows no leader or the leader
    /// does not answer within [`LEADER_TIMEOUT`]).
    async fn fetch_leader(&self, local: &pb::ClusterStatus) -> Option<pb::ClusterStatus> {
        let cl = local.cluster.as_ref()?;
        let leader = cl
            .members
            .iter()
            .find(|m| m.name == cl.leader && m.name != self.node)?;
        let mut cached = self.leader_client.lock().await;
        let ask = async {
            let mut c = match cached.as_ref() {
                Some((addr, c)) if *addr == leader.addr => c.clone(),
                _ => {
                    let c = client::connect(&leader.addr, &self.security)
                        .await
                        .map_err(|e| e.to_string())?;
                    *cached = Some((leader.addr.clone(), c.clone()));
                    c
                }
            };
            c.status(pb::StatusRequest {})
                .await
                .map(|r| r.into_inner())
                .map_err(|e| e.to_string())
        };
        let r = match tokio::time::timeout(LEADER_TIMEOUT, ask).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {LEADER_TIMEOUT:?}")),
        };
        match r {
            Ok(st) if is_leaders(&st) => Some(st),
            Ok(_) => None,
            Err(error) => {
                tracing::debug!(leader = %leader.name, %error, "the status page cannot get the leader's status");
                *cached = None;
                None
            }
        }
    }

    /// The body of `GET /status.json`.
    pub fn json(&self) -> serde_json::Value {
        let local = (self.local)();
        let state = self.state();
        let (st, source) = if is_leaders(&local) {
            (&local, Source::Leader)
        } else {
            match &state.from_leader {
                Some((t, l)) if t.elapsed() < LEADER_FRESH => (
                    l,
                    Source::ViaLeader(l.cluster.clone().unwrap_or_default().leader),
                ),
                _ => (&local, Source::Follower),
            }
        };
        page_json(&self.node, now_ms(), st, &source, &state.series)
    }
}

/// The page's data: `st` as [`crate::status::json`] renders it, plus `page` (who served it,
/// whose view it is, a sentence saying so, the time and the plots' window) and per service
/// `series` ([`Series::json`]) and `changes` ([`changes`]).
pub fn page_json(
    node: &str,
    now_ms: u64,
    st: &pb::ClusterStatus,
    source: &Source,
    series: &Series,
) -> serde_json::Value {
    let leader = st.cluster.as_ref().map_or("", |c| c.leader.as_str());
    let (kind, note) = match source {
        Source::Leader => ("leader", format!("{node} is the orchestrators' leader")),
        Source::ViaLeader(l) => (
            "via_leader",
            format!("{node} is a follower; showing the leader {l}'s view of the cluster"),
        ),
        Source::Follower => (
            "follower",
            if leader.is_empty() {
                format!(
                    "{node} is a follower and knows no leader (an election?): showing its own state; machines' liveness and figures are the leader's only"
                )
            } else {
                format!(
                    "{node} is a follower and cannot reach the leader {leader}: showing its own state; machines' liveness and figures are the leader's only"
                )
            },
        ),
    };
    // A node that is not the leader may hold reports from when it was: stale, not shown.
    let own;
    let st = if st.cluster.as_ref().is_some_and(|c| c.from_leader) {
        st
    } else {
        let mut s = st.clone();
        for svc in &mut s.services {
            svc.primary = None;
            svc.backup_reports.clear();
        }
        own = s;
        &own
    };
    let mut v = crate::status::json(st);
    v["page"] = serde_json::json!({
        "node": node,
        "source": kind,
        "note": note,
        "now_ms": now_ms,
        "window_s": series.window().as_secs(),
        "interval_ms": series::INTERVAL.as_millis() as u64,
    });
    if let Some(services) = v["services"].as_array_mut() {
        for (j, s) in services.iter_mut().zip(&st.services) {
            j["series"] = series.json(&s.name);
            j["changes"] = serde_json::Value::Array(changes(s, series));
        }
    }
    v
}

/// `s`'s view history with what each change took: `active_after_ms` (proposal to activation);
/// for a failover (the primary changed), `failed` (the previous primary), and when its last
/// heartbeat is known, `detected_after_ms` (last heartbeat to proposal) and `outage_ms` (last
/// heartbeat to activation: about how long clients went without replies); for the takeover of
/// the current primary, `takeover_ms` (its restore, until it served), which it reports.
pub fn changes(s: &pb::ServiceStatus, series: &Series) -> Vec<serde_json::Value> {
    let current = s.view.as_ref().map(|v| v.primary.as_str());
    // The current primary's takeover: the newest failover that made it primary.
    let takeover_view = s
        .history
        .windows(2)
        .rev()
        .find(|w| w[0].primary != w[1].primary)
        .filter(|w| Some(w[1].primary.as_str()) == current)
        .map(|w| w[1].view);
    let takeover_ms = s
        .primary
        .as_ref()
        .filter(|p| p.takeover_us > 0)
        .map(|p| p.takeover_us as f64 / 1e3);
    s.history
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let activated = (h.activated_ms > 0).then_some(h.activated_ms);
            let failed = i
                .checked_sub(1)
                .map(|p| &s.history[p])
                .filter(|p| p.primary != h.primary)
                .map(|p| p.primary.clone());
            let heard = failed
                .as_ref()
                .and_then(|_| series.failed_last_heard(&s.name, h.view));
            serde_json::json!({
                "view": h.view,
                "primary": h.primary,
                "backups": h.backups,
                "reason": h.reason,
                "proposed_ms": h.proposed_ms,
                "activated_ms": activated,
                "active_after_ms": activated.map(|a| a.saturating_sub(h.proposed_ms)),
                "failed": failed,
                "failed_last_heard_ms": heard,
                "detected_after_ms": heard.map(|t| h.proposed_ms.saturating_sub(t)),
                "outage_ms": heard.zip(activated).map(|(t, a)| a.saturating_sub(t)),
                "takeover_ms": takeover_ms.filter(|_| takeover_view == Some(h.view)),
            })
        })
        .collect()
}

/// The routes of the page: `/`, `/status.js`, `/status.css`, `/status.json`.
pub fn router(page: Arc<Page>) -> axum::Router {
    use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
    use axum::routing::get;
    let asset = |body: &'static str, kind: &'static str| {
        get(move || async move { ([(CONTENT_TYPE, kind), (CACHE_CONTROL, "no-cache")], body) })
    };
    axum::Router::new()
        .route("/", asset(HTML, "text/html; charset=utf-8"))
        .route(
            "/status.js",
            asset(SCRIPT, "text/javascript; charset=utf-8"),
        )
        .route("/status.css", asset(STYLE, "text/css; charset=utf-8"))
        .route(
            "/status.json",
            get(move || {
                let page = page.clone();
                async move {
                    (
                        [
                            (CONTENT_TYPE, "application/json"),
                            (CACHE_CONTROL, "no-store"),
                        ],
                        page.json().to_string(),
                    )
                }
            }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(
        view: u64,
        primary: &str,
        backups: &[&str],
        reason: &str,
        proposed_ms: u64,
        activated_ms: u64,
    ) -> pb::ViewChange {
        pb::ViewChange {
            view,
            primary: primary.into(),
            backups: backups.iter().map(|b| b.to_string()).collect(),
            reason: reason.into(),
            proposed_ms,
            activated_ms,
        }
    }

    /// redis, primary m2 then (failover) m3, then m1 joins; m2 died at 60_000.
    fn failed_over(from_leader: bool) -> pb::ClusterStatus {
        pb::ClusterStatus {
            orchestrator: "o1".into(),
            cluster: Some(pb::OrchestratorCluster {
                leader: "o1".into(),
                from_leader,
                members: vec![pb::OrchestratorMember {
                    name: "o1".into(),
                    addr: "http://10.77.0.2:7000".into(),
                    voter: true,
                    reachable: true,
                    matched_index: 9,
                }],
                ..Default::default()
            }),
            machines: ["m1", "m2", "m3"]
                .iter()
                .map(|m| pb::MachineStatus {
                    name: (*m).into(),
                    alive: *m != "m2",
                    // At 61_000: m2 last heard at 60_000.
                    last_seen_ms: if *m == "m2" { 1_000 } else { 5 },
                    ..Default::default()
                })
                .collect(),
            services: vec![pb::ServiceStatus {
                name: "redis".into(),
                address: "10.213.0.6".into(),
                view: Some(pb::View {
                    number: 3,
                    primary: "m3".into(),
                    backups: vec!["m1".into()],
                    active: false,
                }),
                primary: Some(pb::ServiceReport {
                    takeover_us: 81_500,
                    pause_p50_us: 600,
                    ..Default::default()
                }),
                history: vec![
                    change(1, "m2", &["m3"], "deployed", 10_000, 10_101),
                    change(2, "m3", &[], "primary m2 failed", 60_110, 60_157),
                    change(
                        3,
                        "m3",
                        &["m1"],
                        "re-protection: a spare joins as backup",
                        60_300,
                        0,
                    ),
                ],
                health: "changing views".into(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn the_page_data_is_the_status_with_series_and_timed_changes() {
        let st = failed_over(true);
        let mut series = Series::default();
        series.record(61_000, &st);
        let j = page_json("o1", 61_500, &st, &Source::Leader, &series);
        assert_eq!(j["page"]["node"], "o1");
        assert_eq!(j["page"]["source"], "leader");
        assert_eq!(j["page"]["now_ms"], 61_500);
        assert_eq!(j["page"]["window_s"], 300);
        // What `tardi status --json` shows is all there.
        assert_eq!(j["cluster"]["leader"], "o1");
        assert_eq!(j["cluster"]["members"]["o1"]["reachable"], true);
        let s = &j["services"][0];
        assert_eq!(
            (s["primary"].as_str(), s["view"].as_u64()),
            (Some("m3"), Some(3))
        );
        assert_eq!(s["backups"], serde_json::json!(["m1"]));
        assert_eq!(s["series"]["pause_p50_us"], serde_json::json!([600.0]));
        let c = s["changes"].as_array().unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c[0]["failed"], serde_json::Value::Null);
        assert_eq!(c[0]["active_after_ms"], 101);
        assert_eq!(c[1]["failed"], "m2");
        assert_eq!(c[1]["reason"], "primary m2 failed");
        assert_eq!(c[1]["failed_last_heard_ms"], 60_000);
        assert_eq!(c[1]["detected_after_ms"], 110);
        assert_eq!(c[1]["active_after_ms"], 47);
        assert_eq!(c[1]["outage_ms"], 157);
        assert_eq!(c[1]["takeover_ms"], 81.5);
        // Not activated yet; not a failover.
        assert_eq!(c[2]["activated_ms"], serde_json::Value::Null);
        assert_eq!(c[2]["active_after_ms"], serde_json::Value::Null);
        assert_eq!(c[2]["failed"], serde_json::Value::Null);
        assert_eq!(c[2]["takeover_ms"], serde_json::Value::Null);
    }

    #[test]
    fn a_follower_says_whose_view_it_shows() {
        let series = Series::default();
        let st = failed_over(true);
        let j = page_json("o2", 1, &st, &Source::ViaLeader("o1".into()), &series);
        assert_eq!(j["page"]["source"], "via_leader");
        assert!(
            j["page"]["note"]
                .as_str()
                .unwrap()
                .contains("showing the leader o1's view")
        );
        let own = failed_over(false);
        let j = page_json("o2", 1, &own, &Source::Follower, &series);
        assert_eq!(j["page"]["source"], "follower");
        let note = j["page"]["note"].as_str().unwrap();
        assert!(note.contains("cannot reach the leader o1"), "{note}");
        // Without the leader's liveness no failover can be timed; its own reports (from when
        // it led, perhaps) are stale and not shown.
        let svc = &j["services"][0];
        assert_eq!(svc["changes"][1]["outage_ms"], serde_json::Value::Null);
        assert_eq!(svc["changes"][1]["failed"], "m2");
        assert_eq!(svc["changes"][1]["takeover_ms"], serde_json::Value::Null);
        assert_eq!(svc["primary_report"], serde_json::Value::Null, "{svc}");
        assert_eq!(svc["primary"], "m3", "the views are its own: {svc}");
    }

    #[test]
    fn a_takeover_time_belongs_to_the_failover_that_made_the_current_primary() {
        let mut st = failed_over(true);
        // m3 failed in turn and m1 took over: m3's report no longer applies to view 2.
        let s = &mut st.services[0];
        s.history
            .push(change(4, "m1", &[], "primary m3 failed", 70_000, 70_050));
        s.view = Some(pb::View {
            number: 4,
            primary: "m1".into(),
            backups: vec![],
            active: true,
        });
        let c = changes(s, &Series::default());
        assert_eq!(c[1]["takeover_ms"], serde_json::Value::Null);
        assert_eq!(c[3]["takeover_ms"], 81.5);
        assert_eq!(c[3]["failed"], "m3");
    }

    fn get(addr: std::net::SocketAddr, path: &str) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        r
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_page_is_served_beside_the_metrics() {
        let status: LocalStatus = Arc::new(|| failed_over(true));
        let page = Page::new("o1", Security::Plaintext, status);
        let sampler = tokio::spawn(page.clone().sample());
        let render: tardi_metrics::Render = Arc::new(|| "up 1\n".to_string());
        let router = tardi_metrics::router(render).merge(router(page));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let served = tardi_metrics::serve(addr, router).await.unwrap();
        // The sampler's first tick is immediate.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let got = tokio::task::spawn_blocking(move || {
            [
                "/",
                "/status.js",
                "/status.css",
                "/status.json",
                "/metrics",
                "/nope",
            ]
            .map(|p| get(addr, p))
        })
        .await
        .unwrap();
        let [html, js, css, json, metrics, nope] = got;
        assert!(
            html.starts_with("HTTP/1.1 200") && html.contains("text/html"),
            "{html}"
        );
        assert!(html.contains("<script src=\"status.js\">"), "{html}");
        assert!(
            js.contains("text/javascript") && js.contains("function plot("),
            "{js}"
        );
        assert!(css.contains("text/css"), "{css}");
        assert!(json.contains("application/json"), "{json}");
        let body = json.split_once("\r\n\r\n").unwrap().1;
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["services"][0]["primary"], "m3");
        assert_eq!(
            v["services"][0]["series"]["t_ms"].as_array().map(Vec::len),
            Some(1)
        );
        assert!(metrics.ends_with("up 1\n"), "{metrics}");
        assert!(nope.starts_with("HTTP/1.1 404"), "{nope}");
        served.abort();
        sampler.abort();
    }
}
