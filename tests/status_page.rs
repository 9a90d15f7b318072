//! The orchestrator's status page (`http://NODE:9100/`) on the lab, loaded in headless
//! Chromium (Debian's `chromium`, which `scripts/setup.sh` installs) from the client node after
//! a primary's power cut: the page shows the new primary, the failed machine in the view
//! history, and plots with data, on the leader and on a follower.
//!
//! The screenshot is written to the test's temporary directory; with `TARDI_KEEP_SCREENSHOT=1`
//! (the client then writes for half a minute on each side of the failure, so the plots show a
//! load; the test takes about 90 s instead of 15) it also replaces `docs/img/status-page.png`:
//!
//! ```sh
//! TARDI_KEEP_SCREENSHOT=1 cargo test --test status_page
//! ```

mod common;

use common::cluster::Cluster;
use common::programs;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Chromium's binary, or a failure that says how to get it (the test must not pass without it).
fn chromium() -> PathBuf {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "headless Chromium is needed to check the status page and was not found \
                 (/usr/bin/chromium): `apt-get install chromium`, or run scripts/setup.sh"
            )
        })
}

/// Loads `url` in headless Chromium in the lab's client node, gives the page's script
/// `budget` of virtual time (its fetches and redraws), and returns the DOM; with `screenshot`,
/// saves a PNG there instead of dumping.
fn load(c: &Cluster, url: &str, budget: Duration, screenshot: Option<&Path>) -> String {
    let profile = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chromium-profile");
    // At the lowest priority: Chromium starting takes both cores for a moment, which can delay
    // an instance's heartbeats past the 100 ms failure timeout (a false failover).
    let mut argv = vec![
        "nice".into(),
        "-n19".into(),
        chromium().display().to_string(),
        "--headless".into(),
        // Root in a network namespace: Chromium's own sandbox cannot start there.
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--hide-scrollbars".into(),
        format!("--user-data-dir={}", profile.display()),
        format!("--virtual-time-budget={}", budget.as_millis()),
    ];
    match screenshot {
        Some(p) => {
            argv.push("--window-size=1280,1080".into());
            argv.push(format!("--screenshot={}", p.display()));
        }
        None => argv.push("--dump-dom".into()),
    }
    argv.push(url.into());
    let out = c.lab.exec("client", &argv).expect("running chromium");
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The opening tag that contains `needle` (e.g. `data-plot="pause"`).
fn tag_with<'a>(dom: &'a str, needle: &str) -> Option<&'a str> {
    let at = dom.find(needle)?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    Some(&dom[start..=end])
}

/// The value of attribute `name` in an opening tag.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let from = tag.find(&key)? + key.len();
    Some(&tag[from..from + tag[from..].find('"')?])
}

/// The text of the element whose opening tag contains `needle`, up to its first child tag.
fn text_of<'a>(dom: &'a str, needle: &str) -> Option<&'a str> {
    let at = dom.find(needle)?;
    let from = at + dom[at..].find('>')? + 1;
    Some(&dom[from..from + dom[from..].find('<')?])
}

/// Where node `node` serves its metrics and status page.
fn page_of(c: &Cluster, node: &str) -> SocketAddr {
    SocketAddr::from((c.lab.address(node).unwrap(), tardi_lab::METRICS_PORT))
}

fn status_json(c: &Cluster, at: SocketAddr) -> Value {
    c.lab
        .in_node("client", || {
            tardi_metrics::get(at, "/status.json", Duration::from_secs(5))
        })
        .unwrap()
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_str(&b).map_err(|e| e.to_string()))
        .unwrap_or_else(Value::String)
}

/// The number of pause samples the page's series holds for `service` at or after `since_ms`.
fn pause_samples_since(page: &Value, service: &str, since_ms: u64) -> usize {
    let Some(s) = page["services"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == service))
    else {
        return 0;
    };
    let t = s["series"]["t_ms"].as_array().cloned().unwrap_or_default();
    let p = s["series"]["pause_p50_us"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    t.iter()
        .zip(&p)
        .filter(|(t, p)| t.as_u64().is_some_and(|t| t >= since_ms) && p.is_number())
        .count()
}

/// SETs keys from `from` on through the service, 300 at a time (each acknowledged, through a
/// failover if one happens), for at least `d`: the next key.
fn write_for(c: &Cluster, to: SocketAddr, from: u64, d: Duration) -> u64 {
    let t0 = Instant::now();
    let mut next = from;
    loop {
        let acked = c
            .lab
            .in_node("client", || {
                common::resp::write_through_failovers(to, next, 300)
            })
            .unwrap();
        assert_eq!(acked.len(), 300, "writes from {next} not acknowledged");
        next += 300;
        if t0.elapsed() >= d {
            return next;
        }
    }
}

#[test]
fn the_status_page_shows_a_failover() {
    chromium();
    // This test is about what the page shows, not how fast a failure is detected: a failure
    // timeout of 500 ms (default 100) keeps a loaded machine (Chromium, the daemons' debug
    // builds) from suspecting a live primary.
    let mut c = Cluster::up_with(3, 3, &["--failure-timeout", "500ms"]);
    c.deploy(
        &programs::workspace_root().join("gramine-manifests/redis.manifest"),
        1,
    );
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let st = c.wait(
        "a leader with every member reachable",
        Duration::from_secs(20),
        |s| {
            s["cluster"]["from_leader"] == true
                && s["cluster"]["members"]
                    .as_object()
                    .is_some_and(|m| m.len() == 3 && m.values().all(|m| m["reachable"] == true))
        },
    );
    let leader = st["cluster"]["leader"].as_str().unwrap().to_string();
    let follower = ["o1", "o2", "o3"]
        .into_iter()
        .find(|o| *o != leader)
        .unwrap();
    let (leader_page, follower_page) = (page_of(&c, &leader), page_of(&c, follower));
    let primary = svc["primary"].as_str().unwrap().to_string();
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let to: SocketAddr = format!("{}:6379", svc["address"].as_str().unwrap())
        .parse()
        .unwrap();
    // For the kept screenshot, half a minute of writes on each side of the failure, so the
    // plots show the figures under load; for the check, a few hundred.
    let keep = std::env::var_os("TARDI_KEEP_SCREENSHOT").is_some();
    let writing = if keep {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    };
    let written = write_for(&c, to, 0, writing);

    // The primary's power cut; the backup takes over, then the spare joins.
    c.lab.kill(&primary).unwrap();
    let svc = c.wait_active("redis", Duration::from_secs(30), |s| {
        s["primary"] == backup.as_str() && s["backups"].as_array().is_some_and(|b| b.len() == 1)
    });
    write_for(&c, to, written, writing);
    // The page's sampler (once a second) holds a few samples of the new primary.
    let failover_ms = svc["history"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h["primary"] == backup.as_str()))
        .and_then(|h| h["activated_ms"].as_u64())
        .expect("the failover's view in the history");
    let t0 = Instant::now();
    loop {
        let l = status_json(&c, leader_page);
        let f = status_json(&c, follower_page);
        if pause_samples_since(&l, "redis", failover_ms) >= 3
            && pause_samples_since(&f, "redis", failover_ms) >= 3
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the status pages hold no samples of the new primary:\nleader: {l}\nfollower: {f}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let budget = Duration::from_secs(3);
    for (node, source) in [(leader.as_str(), "leader"), (follower, "via_leader")] {
        let url = format!("http://{}/", page_of(&c, node));
        // What the page shows is compared with `tardi status` before and after it loaded (a
        // false suspicion under load may change the view again: then it is loaded again).
        let mut tries = 0;
        let (dom, now) = loop {
            let before = c.service("redis");
            let dom = load(&c, &url, budget, None);
            let after = c.service("redis");
            if (&before["view"], &before["active"]) == (&after["view"], &after["active"]) {
                break (dom, after);
            }
            tries += 1;
            assert!(tries < 3, "the view keeps changing: {before}\n{after}");
        };
        let ctx = format!("the page of {node} ({url}):\n{dom}\nstatus: {now}");
        let src = tag_with(&dom, "id=\"source\"").unwrap_or_else(|| panic!("no source: {ctx}"));
        assert_eq!(attr(src, "data-source"), Some(source), "{ctx}");
        assert_eq!(
            text_of(&dom, "id=\"leader-name\""),
            Some(leader.as_str()),
            "{ctx}"
        );
        // The service's current roles (after the failover: the backup took over, a spare
        // joined; see the `wait_active` above).
        let active = if now["active"] == true {
            "active"
        } else {
            "proposed"
        };
        let view = format!("{} ({active})", now["view"]);
        assert_eq!(
            text_of(&dom, "id=\"view-redis\""),
            Some(view.as_str()),
            "{ctx}"
        );
        assert_ne!(now["primary"], primary.as_str());
        assert_eq!(
            text_of(&dom, "id=\"primary-redis\""),
            now["primary"].as_str(),
            "the new primary: {ctx}"
        );
        let backups: Vec<&str> = now["backups"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let backups = if backups.is_empty() {
            "none".to_string()
        } else {
            backups.join(", ")
        };
        assert_eq!(
            text_of(&dom, "id=\"backups-redis\""),
            Some(backups.as_str()),
            "{ctx}"
        );
        // The history names the failed machine.
        let failed = tag_with(&dom, &format!("data-failed=\"{primary}\""))
            .unwrap_or_else(|| panic!("no view change with {primary} failed: {ctx}"));
        assert!(failed.starts_with("<td"), "{failed}");
        assert!(
            dom.contains(&format!("primary {primary} failed")),
            "the failover's reason: {ctx}"
        );
        // The machine is shown unreachable.
        let m = tag_with(&dom, &format!("data-machine=\"{primary}\"")).unwrap();
        assert_eq!(attr(m, "data-alive"), Some("false"), "{ctx}");
        // Every plot drew data, and the pause plot a line.
        for plot in ["pause", "checkpoint", "lag", "held"] {
            let svg = tag_with(&dom, &format!("data-plot=\"{plot}\""))
                .unwrap_or_else(|| panic!("no {plot} plot: {ctx}"));
            let points: usize = attr(svg, "data-points")
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            assert!(points >= 3, "the {plot} plot has {points} points: {ctx}");
        }
        let path = tag_with(&dom, "data-series=\"pause_p50_us\"")
            .unwrap_or_else(|| panic!("no pause line: {ctx}"));
        assert!(
            attr(path, "d").is_some_and(|d| d.matches('L').count() >= 2),
            "{path}"
        );
    }

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    load(&c, &format!("http://{leader_page}/"), budget, Some(&shot));
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    if keep {
        let keep = programs::workspace_root().join("docs/img/status-page.png");
        std::fs::create_dir_all(keep.parent().unwrap()).unwrap();
        std::fs::write(&keep, &png).unwrap();
        eprintln!("screenshot kept in {}", keep.display());
    }
}
