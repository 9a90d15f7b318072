//! A service that was given up is brought back from its freshest image (issue 26, item 6), on
//! the lab: redis with one backup and `[tardi.failover] max_failures = 1`; its primary's
//! machine loses power and the backup's takeover fails on purpose (`tardi instance
//! --fault-restore FILE`), so the orchestrator gives the service up. `tardi restart redis`
//! then moves it, as at a failover, to the machine that kept the image (the restore failed
//! before the process ran), which serves every acknowledged write.

mod common;

use common::cluster::{Cluster, redis_manifest_with};
use common::resp::write_through_failovers;
use std::path::PathBuf;
use std::time::Duration;

#[test]
fn a_given_up_service_is_restarted_from_its_image_with_every_write() {
    let token = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fault-restore-restart-{}", std::process::id()));
    let _ = std::fs::remove_file(&token);
    let token_arg = token.display().to_string();
    let manifest = redis_manifest_with(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "redis-once.manifest",
        "[tardi.failover]\nmax_failures = 1\n",
    );
    let mut c = Cluster::up_args(3, 1, &[], &["--fault-restore", &token_arg]);
    let (primary, backup, to) = c.deploy_active(&manifest, 1, "redis", 6379);
    let acked = c
        .lab
        .in_node("client", || write_through_failovers(to, 0, 300))
        .unwrap();
    assert_eq!(acked.len(), 300);

    std::fs::write(&token, b"the next takeover fails\n").unwrap();
    c.lab.kill(&primary).unwrap();
    let st = c.wait("redis to be given up", Duration::from_secs(60), |st| {
        st["services"][0]["failed"].is_string()
    });
    assert!(!token.exists(), "no takeover took the injected fault");
    let why = st["services"][0]["failed"].as_str().unwrap().to_string();
    let out = c.tardi(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("tardi restart redis"), "{text}");

    // Refused for a service that does not exist, with nothing changed.
    let out = c.tardi(&["restart", "nosuch"]);
    assert!(!out.status.success(), "restart of an unknown service");

    let out = c.tardi(&["restart", "redis"]);
    assert!(
        out.status.success(),
        "tardi restart: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        c.logs()
    );
    let svc = c.service("redis");
    assert!(svc["failed"].is_null(), "{svc}");
    assert_eq!(
        svc["primary"],
        backup.as_str(),
        "the machine that kept the image serves: {svc}"
    );
    c.assert_no_write_lost(
        to,
        &acked,
        &format!(" across the restart (given up: {why})"),
    );
    let more = c
        .lab
        .in_node("client", || write_through_failovers(to, 300, 100))
        .unwrap();
    assert_eq!(more.len(), 100, "the restarted service takes writes");
    // A second restart is refused: it is not given up.
    let out = c.tardi(&["restart", "redis"]);
    assert!(!out.status.success(), "restart of a running service");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("was not given up"),
        "{out:?}"
    );
}
