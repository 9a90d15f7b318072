//! Prometheus metrics of Tardi's daemons (`--metrics ADDR` on `tardi orchestrator` and `tardi
//! instance`): a builder for the text exposition format (version 0.0.4) and the HTTP endpoint
//! that serves it on `GET /metrics`.
//!
//! Owns: the format (families grouped, `HELP`/`TYPE` once per family, label values escaped) and
//! the endpoint. Must not touch: what is measured; each daemon renders its own figures from the
//! state it already keeps, at scrape time, so nothing here runs between scrapes.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

/// The kind of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

struct Family {
    name: String,
    help: String,
    kind: Kind,
    samples: Vec<(String, f64)>,
}

/// One scrape's worth of metrics. Samples of a family may be added in any order; they are
/// written grouped under one `HELP` and `TYPE`, families in the order first seen.
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// A gauge sample: `name{labels} value`.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.add(name, help, Kind::Gauge, labels, value);
    }

    /// A counter sample (`name` should end in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.add(name, help, Kind::Counter, labels, value);
    }

    fn add(&mut self, name: &str, help: &str, kind: Kind, labels: &[(&str, &str)], value: f64) {
        debug_assert!(valid_name(name), "metric name {name:?}");
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    help: help.to_string(),
                    kind,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        let mut l = String::new();
        for (k, v) in labels {
            debug_assert!(valid_name(k), "label name {k:?}");
            if !l.is_empty() {
                l.push(',');
            }
            let _ = write!(l, "{k}=\"{}\"", escape(v));
        }
        self.families[i].samples.push((l, value));
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let kind = match f.kind {
                Kind::Gauge => "gauge",
                Kind::Counter => "counter",
            };
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(&f.help));
            let _ = writeln!(out, "# TYPE {} {kind}", f.name);
            for (labels, v) in &f.samples {
                let v = number(*v);
                if labels.is_empty() {
                    let _ = writeln!(out, "{} {v}", f.name);
                } else {
                    let _ = writeln!(out, "{}{{{labels}}} {v}", f.name);
                }
            }
        }
        out
    }
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Renders the metrics at each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The router serving `GET /metrics` (a daemon may add its own routes to it).
pub fn router(render: Render) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    render(),
                )
            }
        }),
    )
}

/// Binds `addr` (an error names it) and serves `router` on the current tokio runtime until the
/// task is dropped or aborted.
pub async fn serve(
    addr: SocketAddr,
    router: axum::Router,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on {addr} for metrics: {e}"),
        )
    })?;
    tracing::info!(%addr, "serving metrics on /metrics");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    }))
}

/// `GET /metrics` from `addr` (plain HTTP/1.1, blocking): the body of a 200 answer. For tests
/// and tools that read a daemon's metrics.
pub fn scrape(addr: SocketAddr, timeout: std::time::Duration) -> std::io::Result<String> {
    get(addr, "/metrics", timeout)
}

/// `GET path` from `addr` (plain HTTP/1.1, blocking): the body of a 200 answer (a daemon's
/// metrics, or the orchestrator's status page and its `/status.json`).
pub fn get(addr: SocketAddr, path: &str, timeout: std::time::Duration) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: tardi\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut r = String::new();
    s.read_to_string(&mut r)?;
    if !r.starts_with("HTTP/1.1 200") {
        let status = r.lines().next().unwrap_or_default().to_string();
        return Err(std::io::Error::other(format!(
            "{addr}{path} answered {status:?}"
        )));
    }
    Ok(r.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

/// The value of the sample whose name and labels, as written, are `line_start` (e.g.
/// `tardi_instance_role{machine="m1",service="redis",role="primary"}`).
pub fn sample(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_grouped_and_labels_escaped() {
        let mut e = Exposition::new();
        e.gauge("tardi_epoch", "Last epoch.", &[("service", "redis")], 7.0);
        e.counter("tardi_failovers_total", "Failovers.", &[], 2.0);
        e.gauge(
            "tardi_epoch",
            "Last epoch.",
            &[("service", "a\"b\\c\nd")],
            1.5,
        );
        let text = e.render();
        assert_eq!(
            text,
            "# HELP tardi_epoch Last epoch.\n# TYPE tardi_epoch gauge\n\
             tardi_epoch{service=\"redis\"} 7\n\
             tardi_epoch{service=\"a\\\"b\\\\c\\nd\"} 1.5\n\
             # HELP tardi_failovers_total Failovers.\n# TYPE tardi_failovers_total counter\n\
             tardi_failovers_total 2\n"
        );
    }

    #[test]
    fn numbers_are_prometheus_numbers() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(-1e20), "-100000000000000000000");
        assert!(valid_name("tardi_x:y_1") && !valid_name("1x") && !valid_name("a-b"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_endpoint_serves_the_rendering_of_each_scrape() {
        let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let n2 = n.clone();
        let render: Render = Arc::new(move || {
            let mut e = Exposition::new();
            let v = n2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            e.counter("scrapes_total", "Scrapes.", &[], v as f64);
            e.render()
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let task = serve(addr, router(render)).await.unwrap();
        let got = tokio::task::spawn_blocking(move || {
            let t = std::time::Duration::from_secs(5);
            let first = scrape(addr, t).unwrap();
            let second = scrape(addr, t).unwrap();
            let raw = |path: &str| {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                s.write_all(req.as_bytes()).unwrap();
                let mut r = String::new();
                s.read_to_string(&mut r).unwrap();
                r
            };
            // The Prometheus text format's content type; a path that is not /metrics: 404.
            (first, second, raw("/nope"), raw("/metrics"))
        })
        .await
        .unwrap();
        assert!(got.3.contains("text/plain; version=0.0.4"), "{}", got.3);
        assert_eq!(sample(&got.0, "scrapes_total"), Some(0.0), "{}", got.0);
        assert_eq!(sample(&got.1, "scrapes_total"), Some(1.0), "{}", got.1);
        assert!(got.2.starts_with("HTTP/1.1 404"), "{}", got.2);
        task.abort();
    }
}
