//! The status page's time series: per service, the primary's figures sampled from the cluster's
//! status once a [`INTERVAL`] over the last [`WINDOW`], kept in memory by the node that serves
//! the page, bounded in time and in points.
//!
//! Owns: what is sampled (epoch pause, checkpoint size, backup lag, held output, epoch rate) and
//! the bounds; and the one fact the view history cannot tell: when each failed primary was last
//! heard from, frozen per failover view (`failed_heard`), for the page's outage estimate.
//!
//! Must not touch: how the status is gathered (the page's sampler hands it in) or the network.
//! Nothing here reads a clock: the caller passes the time.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use tardi_proto as pb;

/// How far back the plots go.
pub const WINDOW: Duration = Duration::from_secs(300);

/// How often the page's sampler records the status.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// One sample of one service. A figure is `None` when nothing reported it then (no primary
/// report: failing over, or a follower that cannot reach the leader).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    /// Unix time, milliseconds.
    pub t_ms: u64,
    /// The service's latest view number then.
    pub view: u64,
    pub pause_p50_us: Option<f64>,
    pub pause_p99_us: Option<f64>,
    /// Mean encoded size of the primary's recent checkpoints.
    pub checkpoint_bytes: Option<f64>,
    /// The primary's epochs produced but not yet decided (acknowledged by every backup).
    pub backup_lag: Option<f64>,
    /// The most checkpoints any backup has queued but not applied.
    pub backup_queue: Option<f64>,
    /// Output the primary's gate holds until its epoch is decided.
    pub held_bytes: Option<f64>,
    pub held_packets: Option<f64>,
    pub epochs_per_sec: Option<f64>,
}

/// Reads one figure of a [`Sample`].
pub type Figure = fn(&Sample) -> Option<f64>;

/// The figures of a [`Sample`], by the name the page's JSON gives their column.
pub const FIGURES: [(&str, Figure); 8] = [
    ("pause_p50_us", |s| s.pause_p50_us),
    ("pause_p99_us", |s| s.pause_p99_us),
    ("checkpoint_bytes", |s| s.checkpoint_bytes),
    ("backup_lag", |s| s.backup_lag),
    ("backup_queue", |s| s.backup_queue),
    ("held_bytes", |s| s.held_bytes),
    ("held_packets", |s| s.held_packets),
    ("epochs_per_sec", |s| s.epochs_per_sec),
];

impl Sample {
    /// The sample of `s` at `t_ms`; with `reports` false (the status is not the leader's: its
    /// reports, if any, are stale) every figure is `None`.
    fn of(t_ms: u64, s: &pb::ServiceStatus, reports: bool) -> Sample {
        let view = s.view.as_ref().map_or(0, |v| v.number);
        let p = s.primary.as_ref().filter(|_| reports);
        let f = |g: fn(&pb::ServiceReport) -> f64| p.map(g);
        Sample {
            t_ms,
            view,
            pause_p50_us: f(|r| r.pause_p50_us as f64),
            pause_p99_us: f(|r| r.pause_p99_us as f64),
            checkpoint_bytes: f(|r| r.checkpoint_bytes as f64),
            backup_lag: f(|r| r.backup_lag as f64),
            held_bytes: f(|r| r.held_bytes as f64),
            held_packets: f(|r| r.held_packets as f64),
            epochs_per_sec: f(|r| r.epochs_per_sec),
            backup_queue: s
                .backup_reports
                .iter()
                .filter(|_| reports)
                .map(|b| b.backup_lag as f64)
                .reduce(f64::max),
        }
    }
}

/// The time series of every service, and the failed primaries' last heartbeats.
#[derive(Debug)]
pub struct Series {
    window_ms: u64,
    max_points: usize,
    services: BTreeMap<String, VecDeque<Sample>>,
    /// Machine → when it was last heard from (Unix ms), as last reported by a leader.
    heard: BTreeMap<String, u64>,
    /// (service, view of a failover) → when its failed primary was last heard from.
    failed_heard: BTreeMap<(String, u64), u64>,
}

impl Default for Series {
    /// [`WINDOW`], with room for one sample per [`INTERVAL`] and some slack.
    fn default() -> Series {
        let n = (WINDOW.as_millis() / INTERVAL.as_millis()) as usize;
        Series::new(WINDOW, n + n / 10)
    }
}

impl Series {
    /// Samples no older than `window`, at most `max_points` per service.
    pub fn new(window: Duration, max_points: usize) -> Series {
        Series {
            window_ms: window.as_millis() as u64,
            max_points: max_points.max(1),
            services: BTreeMap::new(),
            heard: BTreeMap::new(),
            failed_heard: BTreeMap::new(),
        }
    }

    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// Records `st`, the cluster's status at `now_ms`: one sample per service (with figures only
    /// if the leader answered), then drops what is older than the window or beyond the bound.
    pub fn record(&mut self, now_ms: u64, st: &pb::ClusterStatus) {
        let from_leader = st.cluster.as_ref().is_some_and(|c| c.from_leader);
        if from_leader {
            for m in st.machines.iter().filter(|m| m.last_seen_ms != u64::MAX) {
                self.heard
                    .insert(m.name.clone(), now_ms.saturating_sub(m.last_seen_ms));
            }
            self.heard
                .retain(|name, _| st.machines.iter().any(|m| m.name == *name));
        }
        for s in &st.services {
            let points = self.services.entry(s.name.clone()).or_default();
            // A clock stepped back: the newer samples would be out of order.
            while points.back().is_some_and(|p| p.t_ms >= now_ms) {
                points.pop_back();
            }
            points.push_back(Sample::of(now_ms, s, from_leader));
            self.freeze_failovers(s);
        }
        self.failed_heard.retain(|(service, view), _| {
            st.services
                .iter()
                .any(|s| s.name == *service && s.history.iter().any(|h| h.view == *view))
        });
        let oldest = now_ms.saturating_sub(self.window_ms);
        for points in self.services.values_mut() {
            while points.front().is_some_and(|p| p.t_ms < oldest) {
                points.pop_front();
            }
            while points.len() > self.max_points {
                points.pop_front();
            }
        }
        // An undeployed service's series ages out with its last sample.
        self.services.retain(|_, p| !p.is_empty());
    }

    /// A view whose primary differs from the previous view's is a failover: its failed primary
    /// is the previous one. Its last heartbeat is kept the first time it is known to precede
    /// the proposal (a machine that came back since says nothing about the failure).
    fn freeze_failovers(&mut self, s: &pb::ServiceStatus) {
        for w in s.history.windows(2) {
            if w[0].primary == w[1].primary {
                continue;
            }
            let key = (s.name.clone(), w[1].view);
            if self.failed_heard.contains_key(&key) {
                continue;
            }
            if let Some(&t) = self.heard.get(&w[0].primary)
                && t <= w[1].proposed_ms
            {
                self.failed_heard.insert(key, t);
            }
        }
    }

    /// The samples of `service`, oldest first.
    pub fn points(&self, service: &str) -> impl Iterator<Item = &Sample> {
        self.services.get(service).into_iter().flatten()
    }

    /// When the primary that failed before `view` of `service` was last heard from, if known.
    pub fn failed_last_heard(&self, service: &str, view: u64) -> Option<u64> {
        self.failed_heard.get(&(service.to_string(), view)).copied()
    }

    /// `service`'s samples as columns: `t_ms`, `view`, and one array per figure of
    /// [`FIGURES`] (`null` where nothing was reported).
    pub fn json(&self, service: &str) -> serde_json::Value {
        let mut o = serde_json::Map::new();
        let col = |f: &dyn Fn(&Sample) -> serde_json::Value| {
            serde_json::Value::Array(self.points(service).map(f).collect())
        };
        o.insert("t_ms".into(), col(&|s| s.t_ms.into()));
        o.insert("view".into(), col(&|s| s.view.into()));
        for (name, get) in FIGURES {
            o.insert(name.into(), col(&|s| get(s).into()));
        }
        serde_json::Value::Object(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(pause: u64, held: u64) -> pb::ServiceReport {
        pb::ServiceReport {
            pause_p50_us: pause,
            pause_p99_us: pause * 2,
            checkpoint_bytes: 4096,
            backup_lag: 1,
            held_bytes: held,
            held_packets: held / 100,
            epochs_per_sec: 500.0,
            ..Default::default()
        }
    }

    fn change(view: u64, primary: &str, proposed_ms: u64) -> pb::ViewChange {
        pb::ViewChange {
            view,
            primary: primary.into(),
            reason: String::new(),
            proposed_ms,
            activated_ms: proposed_ms + 50,
            ..Default::default()
        }
    }

    fn status(from_leader: bool, services: &[(&str, Option<u64>)]) -> pb::ClusterStatus {
        pb::ClusterStatus {
            cluster: Some(pb::OrchestratorCluster {
                from_leader,
                ..Default::default()
            }),
            services: services
                .iter()
                .map(|(name, pause)| pb::ServiceStatus {
                    name: (*name).into(),
                    view: Some(pb::View {
                        number: 1,
                        primary: "m1".into(),
                        ..Default::default()
                    }),
                    primary: pause.map(|p| report(p, 300)),
                    backup_reports: vec![pb::ServiceReport {
                        backup_lag: 3,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn samples_older_than_the_window_are_dropped() {
        let mut s = Series::new(Duration::from_secs(10), 1000);
        for i in 0..30u64 {
            s.record(1_000_000 + i * 1000, &status(true, &[("redis", Some(i))]));
        }
        let t: Vec<u64> = s.points("redis").map(|p| p.t_ms).collect();
        // now = 1_029_000: samples from 1_019_000 on are within 10 s.
        assert_eq!(t.first(), Some(&1_019_000), "{t:?}");
        assert_eq!(t.len(), 11);
        assert_eq!(s.points("redis").last().unwrap().pause_p50_us, Some(29.0));
    }

    #[test]
    fn points_are_bounded_even_when_sampled_faster_than_planned() {
        let mut s = Series::new(Duration::from_secs(300), 50);
        for i in 0..10_000u64 {
            s.record(5_000 + i, &status(true, &[("a", Some(i)), ("b", Some(i))]));
        }
        assert_eq!(s.points("a").count(), 50);
        assert_eq!(s.points("b").count(), 50);
        assert_eq!(s.points("a").next().unwrap().t_ms, 5_000 + 9_950);
        // The default bound: five minutes at one sample a second, with slack.
        let mut d = Series::default();
        for i in 0..2_000u64 {
            d.record(i * 100, &status(true, &[("a", Some(i))]));
        }
        assert!(d.points("a").count() <= 330, "{}", d.points("a").count());
    }

    #[test]
    fn an_undeployed_service_ages_out_and_a_clock_step_back_keeps_order() {
        let mut s = Series::new(Duration::from_secs(5), 100);
        s.record(
            10_000,
            &status(true, &[("gone", Some(1)), ("kept", Some(1))]),
        );
        s.record(12_000, &status(true, &[("kept", Some(2))]));
        assert_eq!(s.points("gone").count(), 1);
        s.record(16_000, &status(true, &[("kept", Some(3))]));
        assert_eq!(s.points("gone").count(), 0);
        assert!(s.json("gone")["t_ms"].as_array().unwrap().is_empty());
        s.record(11_000, &status(true, &[("kept", Some(4))]));
        let t: Vec<u64> = s.points("kept").map(|p| p.t_ms).collect();
        assert_eq!(t, [11_000]);
    }

    #[test]
    fn a_followers_stale_reports_are_not_plotted() {
        let mut s = Series::default();
        s.record(1_000, &status(true, &[("redis", Some(700))]));
        s.record(2_000, &status(false, &[("redis", Some(900))]));
        s.record(3_000, &status(true, &[("redis", None)]));
        let j = s.json("redis");
        assert_eq!(j["t_ms"], serde_json::json!([1_000, 2_000, 3_000]));
        assert_eq!(j["pause_p50_us"], serde_json::json!([700.0, null, null]));
        assert_eq!(j["pause_p99_us"], serde_json::json!([1400.0, null, null]));
        assert_eq!(j["held_bytes"], serde_json::json!([300.0, null, null]));
        assert_eq!(j["backup_queue"], serde_json::json!([3.0, null, 3.0]));
        assert_eq!(j["view"], serde_json::json!([1, 1, 1]));
        for (name, _) in FIGURES {
            assert_eq!(j[name].as_array().map(Vec::len), Some(3), "{name}");
        }
    }

    #[test]
    fn a_failed_primarys_last_heartbeat_is_frozen_for_its_failover() {
        let mut s = Series::default();
        let mut st = status(true, &[("redis", Some(1))]);
        st.machines = vec![
            pb::MachineStatus {
                name: "m1".into(),
                last_seen_ms: 10,
                ..Default::default()
            },
            pb::MachineStatus {
                name: "m2".into(),
                last_seen_ms: 10,
                ..Default::default()
            },
        ];
        st.services[0].history = vec![change(1, "m1", 1_000)];
        s.record(50_000, &st);
        // m1 falls silent at 59_990; view 2 (primary m2) is proposed at 60_100.
        st.machines[0].last_seen_ms = 1_010;
        st.services[0].history.push(change(2, "m2", 60_100));
        st.services[0].history.push(change(3, "m2", 60_300));
        s.record(61_000, &st);
        assert_eq!(s.failed_last_heard("redis", 2), Some(59_990));
        assert_eq!(s.failed_last_heard("redis", 3), None, "no failover");
        // m1 comes back: the failover keeps what was known then.
        st.machines[0].last_seen_ms = 10;
        s.record(200_000, &st);
        assert_eq!(s.failed_last_heard("redis", 2), Some(59_990));
        // A follower's status (no liveness) changes nothing.
        let mut f = st.clone();
        f.cluster = Some(pb::OrchestratorCluster::default());
        f.machines[0].last_seen_ms = u64::MAX;
        s.record(201_000, &f);
        assert_eq!(s.failed_last_heard("redis", 2), Some(59_990));
        // A failover first seen after its failed primary came back: unknown.
        st.services[0].history.push(change(4, "m1", 150_000));
        s.record(202_000, &st);
        assert_eq!(s.failed_last_heard("redis", 4), None);
        // Undeployed: forgotten.
        st.services.clear();
        s.record(203_000, &st);
        assert_eq!(s.failed_last_heard("redis", 2), None);
    }
}
