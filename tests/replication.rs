//! Replication on the lab: real orchestrator and instances in network namespaces, real
//! services, real output gates. Each test builds its own lab (one at a time) and removes it,
//! also on failure.

mod common;

use common::cluster::Cluster;
use common::programs;
use common::resp::{Conn, Reply, missing_writes};
use serde_json::Value;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn manifest(name: &str) -> PathBuf {
    programs::workspace_root()
        .join("gramine-manifests")
        .join(name)
}

/// Writes `PREFIX:i = i` for i in 0..n, each acknowledged (panics otherwise).
fn set_keys(to: SocketAddr, prefix: &str, n: u64) {
    let mut cn = Conn::connect_retry(to, Duration::from_secs(10));
    for i in 0..n {
        assert_eq!(
            cn.cmd(&["SET", &format!("{prefix}:{i}"), &i.to_string()])
                .unwrap(),
            Reply::Status("OK".into())
        );
    }
}

/// How many of `PREFIX:i = i` for i in 0..n the service holds.
fn count_keys(to: SocketAddr, prefix: &str, n: u64) -> usize {
    let mut cn = Conn::connect_retry(to, Duration::from_secs(10));
    (0..n)
        .filter(|i| {
            cn.cmd(&["GET", &format!("{prefix}:{i}")]).ok()
                == Some(Reply::Bulk(Some(i.to_string().into_bytes())))
        })
        .count()
}

fn scrape(at: SocketAddr) -> String {
    tardi_metrics::scrape(at, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("metrics at {at}: {e}"))
}

use tardi_metrics::sample;

fn addr(svc: &Value, port: u16) -> SocketAddr {
    let a = svc["address"].as_str().expect("service address");
    format!("{a}:{port}").parse().expect("address")
}

/// Output is held until the epoch that produced it is decided: with the backup's instance
/// stopped (SIGSTOP: it acknowledges nothing), the client receives no reply at all; once it
/// runs again, every reply arrives, in order.
#[test]
fn output_is_held_until_the_backup_acknowledges() {
    programs::build("dirtier");
    // A failure timeout long enough that the stopped backup is not replaced meanwhile.
    let c = Cluster::up(2, &["--failure-timeout", "60s"]);
    c.deploy(&manifest("dirtier.manifest"), 1);
    let svc = c.wait_active("dirtier", Duration::from_secs(30), |_| true);
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let primary = svc["primary"].as_str().unwrap().to_string();
    let metrics_of = |node: &str| {
        std::net::SocketAddr::from((c.lab.address(node).unwrap(), tardi_lab::METRICS_PORT))
    };
    let (primary_metrics, orchestrator_metrics) = (metrics_of(&primary), metrics_of("o1"));
    let to = addr(&svc, 7100);
    c.lab
        .in_node("client", || {
            programs::wait_ready(to, Duration::from_secs(10))
        })
        .unwrap()
        .expect("the service answers");

    let pid = c.instance_pid(&backup) as i32;
    // SAFETY: kill(2) with a valid signal on a process of ours.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let got = c
        .lab
        .in_node("client", || {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            for _ in 0..20 {
                s.send_to(b"ping", to).unwrap();
            }
            // Nothing may come back while the backup acknowledges nothing.
            let mut early = 0;
            let t0 = Instant::now();
            let mut buf = [0u8; 256];
            while t0.elapsed() < Duration::from_millis(700) {
                if s.recv(&mut buf).is_ok() {
                    early += 1;
                }
            }
            // The primary's metrics show the held replies; the orchestrator's, the service.
            let held = scrape(primary_metrics);
            let orch = scrape(orchestrator_metrics);
            // SAFETY: as above.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
            let mut replies = Vec::new();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            while replies.len() < 20 {
                match s.recv(&mut buf) {
                    Ok(n) => replies.push(String::from_utf8_lossy(&buf[..n]).to_string()),
                    Err(_) => break,
                }
            }
            (early, replies, held, orch)
        })
        .unwrap();
    let (early, replies, held, orch) = got;
    let labels = format!("machine=\"{primary}\",service=\"dirtier\"");
    assert_eq!(
        sample(
            &held,
            &format!("tardi_instance_role{{{labels},role=\"primary\"}}")
        ),
        Some(1.0),
        "{held}"
    );
    assert!(
        sample(&held, &format!("tardi_instance_held_packets{{{labels}}}"))
            .is_some_and(|n| n >= 1.0),
        "the primary's metrics show no held output while the backup is stopped:\n{held}"
    );
    assert_eq!(
        sample(&orch, "tardi_service_backups{service=\"dirtier\"}"),
        Some(1.0),
        "{orch}"
    );
    assert_eq!(early, 0, "replies left before their epoch was decided");
    assert_eq!(
        replies.len(),
        20,
        "every held reply arrives once decided: {replies:?}"
    );
    // In order: the dirtier's counter never goes backwards.
    let counts: Vec<u64> = replies
        .iter()
        .map(|r| r.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
}

/// A client writing to `service` (deployed from `manifest`, on `port`) through a failover (the
/// primary's machine loses power) loses no acknowledged write: `write(to, from, n)` writes
/// through failovers and returns what was acknowledged, `missing(to, acked)` counts what no
/// longer reads back.
fn power_cut_loses_no_acknowledged_write(
    manifest_name: &str,
    service: &str,
    port: u16,
    write: fn(SocketAddr, u64, u64) -> Vec<u64>,
    missing: fn(SocketAddr, Vec<u64>) -> usize,
) {
    let mut c = Cluster::up(3, &[]);
    c.deploy(&manifest(manifest_name), 1);
    let svc = c.wait_active(service, Duration::from_secs(30), |_| true);
    let primary = svc["primary"].as_str().unwrap().to_string();
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let to = addr(&svc, port);
    let first = c.lab.in_node("client", || write(to, 0, 300)).unwrap();
    assert_eq!(first.len(), 300);
    c.lab.kill(&primary).unwrap();
    let t0 = Instant::now();
    let second = c.lab.in_node("client", || write(to, 300, 300)).unwrap();
    let gap = t0.elapsed();
    assert_eq!(second.len(), 300, "writes resume after the failover");
    let svc = c.wait_active(service, Duration::from_secs(20), |s| {
        s["primary"] == backup.as_str()
    });
    assert_ne!(svc["primary"], primary.as_str());
    let acked: Vec<u64> = first.into_iter().chain(second).collect();
    let lost = c.lab.in_node("client", || missing(to, acked)).unwrap();
    assert_eq!(lost, 0, "acknowledged writes lost (failover took {gap:?})");
}

/// Redis: a client writing through a primary power cut loses no acknowledged write.
#[test]
fn primary_power_cut_loses_no_acknowledged_write() {
    power_cut_loses_no_acknowledged_write(
        "redis.manifest",
        "redis",
        6379,
        common::resp::write_through_failovers,
        missing_writes,
    );
}

/// memcached (four worker threads, Debian's binary): the same.
#[test]
fn memcached_primary_power_cut_loses_no_acknowledged_write() {
    power_cut_loses_no_acknowledged_write(
        "memcached.manifest",
        "memcached",
        11211,
        common::memcache::write_through_failovers,
        common::memcache::missing_writes,
    );
}

/// A backup's death does not stop the service, and a spare takes its place.
#[test]
fn backup_power_cut_does_not_stop_the_service_and_a_spare_joins() {
    let mut c = Cluster::up(3, &[]);
    c.deploy(&manifest("redis.manifest"), 1);
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let primary = svc["primary"].as_str().unwrap().to_string();
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let to = addr(&svc, 6379);
    c.lab.kill(&backup).unwrap();
    let ok = c
        .lab
        .in_node("client", || {
            let mut cn = Conn::connect_retry(to, Duration::from_secs(10));
            (0..200)
                .filter(|i| {
                    cn.cmd(&["SET", &format!("b:{i}"), "x"]).ok()
                        == Some(Reply::Status("OK".into()))
                })
                .count()
        })
        .unwrap();
    assert_eq!(ok, 200, "the primary keeps serving without its backup");
    let svc = c.wait_active("redis", Duration::from_secs(20), |s| {
        s["backups"]
            .as_array()
            .is_some_and(|b| b.len() == 1 && b[0] != backup.as_str())
    });
    assert_eq!(svc["primary"], primary.as_str(), "the primary stays");
}

/// With two backups, the primary's loss leaves one protected copy: the survivor stays a backup.
#[test]
fn two_backups_survive_a_primary_power_cut() {
    let mut c = Cluster::up(3, &[]);
    c.deploy(&manifest("redis.manifest"), 2);
    let svc = c.wait_active("redis", Duration::from_secs(30), |s| {
        s["backups"].as_array().is_some_and(|b| b.len() == 2)
    });
    let primary = svc["primary"].as_str().unwrap().to_string();
    let to = addr(&svc, 6379);
    c.lab.in_node("client", || set_keys(to, "t", 100)).unwrap();
    c.lab.kill(&primary).unwrap();
    let svc = c.wait_active("redis", Duration::from_secs(20), |s| {
        s["primary"] != primary.as_str() && s["backups"].as_array().is_some_and(|b| b.len() == 1)
    });
    assert!(!svc["backups"][0].as_str().unwrap().is_empty());
    let n = c
        .lab
        .in_node("client", || count_keys(to, "t", 100))
        .unwrap();
    assert_eq!(n, 100);
}

/// A backup refuses a malformed checkpoint, one of a view it has left, and one that does not
/// continue its chain, with nothing applied: afterwards it still follows the primary, and it
/// takes over with every acknowledged write.
#[test]
fn malformed_and_out_of_view_checkpoints_are_refused_with_nothing_applied() {
    use tardi_instance::stream::Connection;
    use tardi_proto as pb;
    let msg = |primary: &str, view: u64, epoch: u64| pb::CheckpointMsg {
        service: "redis".into(),
        view,
        primary: primary.to_string(),
        epoch,
        run: view,
        data: Default::default(),
    };
    let mut c = Cluster::up(2, &[]);
    c.deploy(&manifest("redis.manifest"), 1);
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let (primary, backup) = (
        svc["primary"].as_str().unwrap().to_string(),
        svc["backups"][0].as_str().unwrap().to_string(),
    );
    let view = svc["view"].as_u64().unwrap();
    let to = addr(&svc, 6379);
    let api = c.lab.api(&backup).unwrap().to_string();
    c.lab.in_node("client", || set_keys(to, "r", 100)).unwrap();
    // Sent straight to the backup's checkpoint stream, as a rogue or deposed primary would
    // (one holding a certificate from the cluster's CA: the client's).
    let tls = tardi_tls::Security::tls(&c.lab.node("client").unwrap().tls_dir())
        .unwrap()
        .stream_client();
    let errors = c
        .lab
        .in_node("client", || {
            let mut errors = Vec::new();
            let cases: Vec<(&str, pb::CheckpointMsg, Vec<u8>)> = vec![
                ("garbage", msg(&primary, view, 1_000_000), vec![0x5a; 4096]),
                (
                    "old view",
                    msg(&primary, view - 1, 1_000_000),
                    vec![1, 2, 3],
                ),
                (
                    "truncated header",
                    msg(&primary, view, 7),
                    b"TARDICKP".to_vec(),
                ),
            ];
            for (what, m, data) in cases {
                // A refusal closes the stream: one connection per case.
                let mut conn = Connection::connect(&api, Duration::from_secs(2), tls.clone())
                    .expect("connect to the backup's checkpoint stream");
                conn.send(&m, &data).expect("send");
                let ack = conn.recv_ack().expect("an ack").expect("an ack");
                errors.push((what, ack.error));
            }
            errors
        })
        .unwrap();
    for (what, e) in &errors {
        assert!(!e.is_empty(), "{what}: accepted");
    }
    assert!(errors[1].1.contains("older"), "{errors:?}");
    // The backup still follows the primary.
    let before = c.service("redis")["backup_reports"][0]["epoch"]
        .as_u64()
        .unwrap();
    c.wait(
        "the backup to keep acknowledging",
        Duration::from_secs(10),
        |s| {
            s["services"][0]["backup_reports"][0]["epoch"]
                .as_u64()
                .is_some_and(|e| e > before + 5)
        },
    );
    c.lab.kill(&primary).unwrap();
    c.wait_active("redis", Duration::from_secs(20), |s| {
        s["primary"] == backup.as_str()
    });
    let n = c
        .lab
        .in_node("client", || count_keys(to, "r", 100))
        .unwrap();
    assert_eq!(
        n, 100,
        "the backup's image survived the refused checkpoints"
    );
}

/// `tardi undeploy`: the service is forgotten, its primary's sandbox and its backup's image are
/// dropped (no machine reports it, its address stops answering), and the same name can be
/// deployed again. Undeploying an unknown service is refused.
#[test]
fn undeploy_stops_the_service_everywhere_and_it_can_be_deployed_again() {
    let c = Cluster::up(2, &[]);
    c.deploy(&manifest("redis.manifest"), 1);
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let to = addr(&svc, 6379);
    c.lab.in_node("client", || set_keys(to, "u", 10)).unwrap();
    let out = c.tardi(&["undeploy", "redis"]);
    assert!(
        out.status.success(),
        "undeploy failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Waited for: no machine reports a role for it, and status has no such service.
    let st = c.status();
    assert!(
        st["services"].as_array().unwrap().is_empty(),
        "still listed: {st}"
    );
    for m in st["machines"].as_array().unwrap() {
        assert!(
            m["services"].as_array().unwrap().is_empty(),
            "{} still reports {}",
            m["name"],
            m["services"]
        );
    }
    // The address answers no more (the primary's sandbox is gone).
    let answered = c
        .lab
        .in_node("client", || {
            std::net::TcpStream::connect_timeout(&to, Duration::from_millis(500)).is_ok()
        })
        .unwrap();
    assert!(
        !answered,
        "the undeployed service still accepts connections"
    );
    // Unknown: refused, with the reason.
    let out = c.tardi(&["undeploy", "redis"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no service named"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The name is free again: a fresh deployment (its private directory survived on disk, so
    // the keys written before may or may not be there; only that it serves is checked).
    c.deploy(&manifest("redis.manifest"), 1);
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let to = addr(&svc, 6379);
    c.lab.in_node("client", || set_keys(to, "v", 10)).unwrap();
    assert_eq!(
        c.lab.in_node("client", || count_keys(to, "v", 10)).unwrap(),
        10
    );
}

/// A client keeps its one connection through a power cut of the primary's machine: the
/// checkpoint carries the connection (TCP repair), the backup recreates it, and the client,
/// pipelining writes the whole time, never reconnects; every write acknowledged on it is
/// read back after the takeover, on the same connection.
#[test]
fn a_client_keeps_its_connection_through_a_takeover() {
    keeps_its_connection(true);
}

/// The same through a power cut of the backup's machine: the primary goes on (its output waits
/// for the new view), and the client's connection never notices more than a pause.
#[test]
fn a_client_keeps_its_connection_through_a_backup_failure() {
    keeps_its_connection(false);
}

/// A client pipelining on one connection through a power cut of the primary's machine
/// (`primary`) or of the backup's.
fn keeps_its_connection(primary: bool) {
    use std::io::{BufRead, BufReader, Write};
    let mut c = Cluster::up(3, &[]);
    c.deploy(&manifest("redis.manifest"), 1);
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let old = svc["primary"].as_str().unwrap().to_string();
    let victim = if primary {
        old.clone()
    } else {
        svc["backups"][0].as_str().unwrap().to_string()
    };
    let to = addr(&svc, 6379);
    let stream = c
        .lab
        .in_node("client", || {
            let s = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        })
        .unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    // Pipelined batches of 10 SETs; a batch is acknowledged once its 10 replies are read.
    let send = |from: u64, w: &mut std::net::TcpStream| {
        let mut out = String::new();
        for i in from..from + 10 {
            let key = format!("k:{i}");
            out.push_str(&format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$1\r\nv\r\n",
                key.len()
            ));
        }
        w.write_all(out.as_bytes())
    };
    let replies = |r: &mut BufReader<std::net::TcpStream>| -> std::io::Result<()> {
        for _ in 0..10 {
            let mut line = String::new();
            r.read_line(&mut line)?;
            if line != "+OK\r\n" {
                return Err(std::io::Error::other(format!("reply {line:?}")));
            }
        }
        Ok(())
    };
    let mut acked = 0u64;
    for _ in 0..20 {
        send(acked, &mut w).unwrap();
        replies(&mut r).expect("a batch before the fault");
        acked += 10;
    }
    // The power cut with a batch in flight, then batches on the same connection.
    send(acked, &mut w).unwrap();
    c.lab.kill(&victim).unwrap();
    let t0 = std::time::Instant::now();
    replies(&mut r)
        .unwrap_or_else(|e| panic!("the connection broke at the takeover: {e}\n{}", c.logs()));
    let gap = t0.elapsed();
    acked += 10;
    while t0.elapsed() < Duration::from_secs(2) {
        send(acked, &mut w).unwrap();
        replies(&mut r)
            .unwrap_or_else(|e| panic!("the connection broke after {acked} writes: {e}"));
        acked += 10;
    }
    // Active again without the victim (a spare joining as the new backup takes a full
    // checkpoint first: generous on a loaded machine).
    let now = c.wait_active("redis", Duration::from_secs(60), |s| {
        s["primary"] != victim.as_str() && !s["backups"].to_string().contains(&victim)
    });
    assert_eq!(now["primary"] == old.as_str(), !primary);
    // Every acknowledged write is there, read on the same connection.
    for i in 0..acked {
        let key = format!("k:{i}");
        w.write_all(format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes())
            .unwrap();
        let mut len = String::new();
        r.read_line(&mut len).unwrap();
        assert_eq!(len, "$1\r\n", "{key} lost");
        let mut val = String::new();
        r.read_line(&mut val).unwrap();
        assert_eq!(val, "v\r\n");
    }
    eprintln!("{acked} writes on one connection; the batch in flight at the cut waited {gap:?}");
    let log = c.log(now["primary"].as_str().unwrap());
    assert!(
        !log.contains("TCP connection of descriptor"),
        "a connection was reset at the takeover:\n{log}"
    );
}

/// After a takeover, a client whose connection the restore reset (here every one, by the
/// hidden `--fault-drop-tcp`: the way of a connection that cannot be carried) learns it at
/// once, without sending anything: the new primary probes every client of a reset
/// connection, the client's answer meets no socket, and the new primary's reset ends the
/// connection. The reset is said in the log and counted in the metrics.
#[test]
fn idle_clients_of_reset_connections_learn_at_once_after_a_takeover() {
    use std::io::{Read, Write};
    let mut c = Cluster::up_args(3, 1, &[], &["--fault-drop-tcp"]);
    c.deploy(&manifest("redis.manifest"), 1);
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let old = svc["primary"].as_str().unwrap().to_string();
    let to = addr(&svc, 6379);
    let mut conn = c
        .lab
        .in_node("client", || {
            let mut s = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s.write_all(b"PING\r\n").unwrap();
            let mut buf = [0u8; 16];
            let n = s.read(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"+PONG\r\n");
            s
        })
        .unwrap();
    // Let the connection be in a checkpoint the backup holds.
    std::thread::sleep(Duration::from_millis(300));
    c.lab.kill(&old).unwrap();
    let svc = c.wait_active("redis", Duration::from_secs(20), |s| {
        s["primary"] != old.as_str()
    });
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut buf = [0u8; 16];
    match conn.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the idle connection was not ended by the new primary: {other:?}"),
    }
    let new = svc["primary"].as_str().unwrap();
    let log = c.log(new);
    assert!(
        log.contains("the TCP connection of descriptor") && log.contains("was reset"),
        "the reset is not in the new primary's log:\n{log}"
    );
    let at = std::net::SocketAddr::from((c.lab.address(new).unwrap(), tardi_lab::METRICS_PORT));
    let metrics = c
        .lab
        .in_node("client", || {
            tardi_metrics::get(at, "/metrics", Duration::from_secs(5))
        })
        .unwrap()
        .unwrap();
    let counted = metrics
        .lines()
        .find(|l| l.starts_with("tardi_instance_tcp_reset_at_restore_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        counted.is_some_and(|n| n >= 1.0),
        "not counted: {counted:?}\n{metrics}"
    );
}

/// The primary's daemon alone crashes (SIGKILL: its sandbox keeps running, holding the
/// service's name and address on that machine) and restarts. The restarted daemon removes the
/// leftover sandbox; the backup has taken over; the machine becomes its backup again and can
/// take the service over once more when the new primary's machine loses power (before the fix,
/// that takeover failed for good: "sandbox `redis` is already running"; found by the fault
/// campaign).
#[test]
fn a_restarted_instance_removes_the_sandbox_its_crashed_run_left() {
    let mut c = Cluster::up(2, &[]);
    c.deploy(&manifest("redis.manifest"), 1);
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let first = svc["primary"].as_str().unwrap().to_string();
    let second = svc["backups"][0].as_str().unwrap().to_string();
    let to = addr(&svc, 6379);
    c.lab.in_node("client", || set_keys(to, "d", 100)).unwrap();
    let node = c.lab.node(&first).unwrap().clone();
    let pid_file = node.run_dir().join("redis").join("init.pid");
    let init: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    c.lab.crash_daemon(&first).unwrap();
    // The backup takes over (the crashed daemon's heartbeats stopped).
    c.wait_active("redis", Duration::from_secs(30), |s| {
        s["primary"] == second.as_str()
    });
    c.lab.restart_daemon(&first).unwrap();
    let alive = |pid: i32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let t0 = std::time::Instant::now();
    while alive(init) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !alive(init),
        "the crashed run's sandbox (init {init}) still runs after the restart"
    );
    // The restarted machine joins as the new primary's backup.
    c.wait_active("redis", Duration::from_secs(30), |s| {
        s["primary"] == second.as_str() && s["backups"][0] == first.as_str()
    });
    c.lab.kill(&second).unwrap();
    c.wait_active("redis", Duration::from_secs(30), |s| {
        s["primary"] == first.as_str()
    });
    let n = c
        .lab
        .in_node("client", || count_keys(to, "d", 100))
        .unwrap();
    assert_eq!(n, 100, "writes lost across the two failovers");
}

/// From the client node, 300 redis writes (`key:i` for i from `from`) to `to` through
/// failovers; every one must be acknowledged (`what`: when, for the message). The indices.
fn write_300(c: &Cluster, to: SocketAddr, from: u64, what: &str) -> Vec<u64> {
    let acked = c
        .lab
        .in_node("client", || {
            common::resp::write_through_failovers(to, from, 300)
        })
        .unwrap();
    assert_eq!(acked.len(), 300, "{what}");
    acked
}

/// The end of a failover test: `old` (whose primary failed earlier) is a backup again and left
/// no sandbox link behind; when `serving`'s machine loses power, `old` takes redis over with
/// every write in `acked`.
fn old_primary_takes_over_again(
    c: &mut Cluster,
    to: SocketAddr,
    acked: &[u64],
    serving: &str,
    old: &str,
) {
    assert_eq!(
        c.sandbox_links(old),
        Vec::<String>::new(),
        "sandbox links left on {old}"
    );
    c.lab.kill(serving).unwrap();
    c.wait_active("redis", Duration::from_secs(30), |s| s["primary"] == old);
    c.assert_no_write_lost(to, acked, " at the second failover");
}

/// The first backup's takeover fails: its restore is made to fail once the sandbox is set up,
/// before the restored process runs (`tardi instance --fault-restore FILE`, given to every
/// instance: whichever backup takes over first removes the file and fails). The orchestrator
/// records the failure with the instance's error and moves the service to the second backup,
/// with every acknowledged write. The machine whose takeover failed left nothing behind (no
/// sandbox, link or gate): it joins again as a backup and, when the new primary's machine loses
/// power, takes the service over itself, still with every write.
#[test]
fn a_failed_takeover_moves_the_service_to_the_second_backup() {
    let token = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fault-restore-{}", std::process::id()));
    let _ = std::fs::remove_file(&token);
    let token_arg = token.display().to_string();
    let mut c = Cluster::up_args(3, 1, &[], &["--fault-restore", &token_arg]);
    c.deploy(&manifest("redis.manifest"), 2);
    let svc = c.wait_active("redis", Duration::from_secs(30), |s| {
        s["backups"].as_array().is_some_and(|b| b.len() == 2)
    });
    let primary = svc["primary"].as_str().unwrap().to_string();
    let to = addr(&svc, 6379);
    let first = write_300(&c, to, 0, "before the failure");
    std::fs::write(&token, b"the next takeover fails\n").unwrap();
    c.lab.kill(&primary).unwrap();
    let t0 = Instant::now();
    let second = write_300(&c, to, 300, "writes resume after the failed takeover");
    let writes = t0.elapsed();
    assert!(!token.exists(), "no takeover took the injected fault");
    // The failure is recorded with the instance's own error; the other backup serves.
    let svc = c.wait_active("redis", Duration::from_secs(30), |s| {
        s["failures"].as_array().is_some_and(|f| f.len() == 1) && s["primary"] != primary.as_str()
    });
    let failed = svc["failures"][0]["machine"].as_str().unwrap().to_string();
    let why = svc["failures"][0]["why"].as_str().unwrap().to_string();
    assert!(why.contains("fault injected"), "{why}");
    assert_ne!(failed, primary);
    let serving = svc["primary"].as_str().unwrap().to_string();
    assert_ne!(serving, failed, "the failed machine was chosen again");
    assert!(svc["failed"].is_null(), "given up: {}", svc["failed"]);
    let reasons: Vec<&str> = svc["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["reason"].as_str())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains(&format!("primary {failed} failed: "))
                && r.contains("fault injected")),
        "{reasons:?}"
    );
    // The restore failed before the process ran, and the machine kept its image: it stays in
    // the very next view, as a backup that holds the state (not only later, as a spare joins).
    let after = svc["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| {
            h["reason"]
                .as_str()
                .is_some_and(|r| r.contains(&format!("primary {failed} failed: ")))
        })
        .unwrap();
    assert_eq!(after["primary"], serving.as_str(), "{after}");
    assert_eq!(after["backups"], serde_json::json!([failed]), "{after}");
    // For the record (not asserted): when each view was proposed and activated, from the
    // failover's first proposal.
    let from = svc["history"][1]["proposed_ms"].as_i64().unwrap_or(0);
    for h in svc["history"].as_array().unwrap() {
        let activated = match h["activated_ms"].as_i64() {
            Some(t) if t > 0 => format!("{:+} ms", t - from),
            _ => "never".into(),
        };
        eprintln!(
            "view {} primary {}: proposed {:+} ms, activated {activated}: {}",
            h["view"],
            h["primary"],
            h["proposed_ms"].as_i64().unwrap_or(0) - from,
            h["reason"]
        );
    }
    eprintln!("300 writes through the failed takeover took {writes:?}");
    let acked: Vec<u64> = first.into_iter().chain(second).collect();
    c.assert_no_write_lost(to, &acked, "");
    // Re-protected by the machine whose takeover failed.
    c.wait_active("redis", Duration::from_secs(30), |s| {
        s["primary"] == serving.as_str()
            && s["backups"]
                .as_array()
                .is_some_and(|b| b.len() == 1 && b[0] == failed.as_str())
    });
    let node = c.lab.node(&failed).unwrap().clone();
    assert!(
        !node.run_dir().join("redis").join("init.pid").exists(),
        "a sandbox of the failed takeover is left on {failed}"
    );
    old_primary_takes_over_again(&mut c, to, &acked, &serving, &failed);
}

/// A service that crashes right after every restore (`selfconn` holds a TCP connection to
/// itself, which a restore brings back reset: it aborts) fails at each takeover. Deployed with
/// `[tardi.failover] max_failures = 2` and two backups, the orchestrator moves it once, then
/// gives it up at the second failure: `tardi status` (and `--json`) says failed, with the
/// reason and each failure's error, and no view is proposed afterwards (no flapping).
#[test]
fn a_service_that_crashes_after_every_restore_is_given_up() {
    let bin = programs::build("selfconn");
    let m = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("selfconn.manifest");
    std::fs::write(
        &m,
        format!(
            "libos.entrypoint = \"{}\"\nloader.argv = [\"selfconn\", \"--port\", \"7200\"]\n\n\
             [tardi]\nname = \"selfconn\"\nports = [\"udp:7200\"]\n\n\
             [tardi.failover]\nmax_failures = 2\nwindow_s = 600\n",
            bin.display()
        ),
    )
    .unwrap();
    let mut c = Cluster::up(3, &[]);
    c.deploy(&m, 2);
    let svc = c.wait_active("selfconn", Duration::from_secs(30), |s| {
        s["backups"].as_array().is_some_and(|b| b.len() == 2)
    });
    let primary = svc["primary"].as_str().unwrap().to_string();
    let to = addr(&svc, 7200);
    c.lab
        .in_node("client", || {
            programs::wait_ready(to, Duration::from_secs(10))
        })
        .unwrap()
        .expect("the service answers");
    // Let its connection be in a checkpoint the backups hold (it is from the start).
    c.lab.kill(&primary).unwrap();
    let st = c.wait("selfconn to be given up", Duration::from_secs(60), |st| {
        st["services"][0]["failed"].is_string()
    });
    let svc = &st["services"][0];
    assert_eq!(svc["health"], "failed", "{svc}");
    let why = svc["failed"].as_str().unwrap();
    assert!(why.contains("2 failure(s)"), "{why}");
    let failures = svc["failures"].as_array().unwrap().clone();
    assert_eq!(failures.len(), 2, "{failures:?}");
    let machines: Vec<&str> = failures
        .iter()
        .map(|f| f["machine"].as_str().unwrap())
        .collect();
    assert_ne!(
        machines[0], machines[1],
        "the same machine twice: {failures:?}"
    );
    assert!(!machines.contains(&primary.as_str()), "{failures:?}");
    for f in &failures {
        let w = f["why"].as_str().unwrap();
        assert!(
            !w.is_empty() && !w.contains("fault injected"),
            "{failures:?}"
        );
    }
    // The last failure's own words are in the reason.
    assert!(
        why.contains(failures[1]["why"].as_str().unwrap()),
        "{why} / {failures:?}"
    );
    let views = svc["history"].as_array().unwrap().len();
    let view = svc["view"].as_u64().unwrap();
    // No flapping: nothing more is proposed.
    std::thread::sleep(Duration::from_secs(3));
    let later = c.service("selfconn");
    assert_eq!(later["history"].as_array().unwrap().len(), views, "{later}");
    assert_eq!(later["view"].as_u64(), Some(view));
    assert_eq!(later["failures"].as_array().unwrap().len(), 2);
    assert_eq!(later["health"], "failed");
    let out = c.tardi(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("selfconn") && text.contains("FAILED: 2 failure(s)"),
        "{text}"
    );
    eprintln!("{text}");
}

/// The service on a running primary crashes on its own (redis-server SIGKILLed inside its
/// sandbox; the machine and its daemon live on): the instance reports the primary failed, with
/// why, and tears down what is left (sandbox, address, gate); the orchestrator moves the
/// service to the backup as if the machine had died, with every acknowledged write. The old
/// primary's machine then joins as the new backup, and takes the service over again when the
/// new primary's machine loses power.
#[test]
fn a_primary_whose_service_crashes_is_replaced_by_its_backup() {
    let mut c = Cluster::up(2, &[]);
    c.deploy(&manifest("redis.manifest"), 1);
    let svc = c.wait_active("redis", Duration::from_secs(30), |_| true);
    let primary = svc["primary"].as_str().unwrap().to_string();
    let backup = svc["backups"][0].as_str().unwrap().to_string();
    let to = addr(&svc, 6379);
    let first = write_300(&c, to, 0, "before the crash");
    let redis = c
        .lab
        .cgroup_pids(&primary)
        .unwrap()
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"redis-server"))
        })
        .expect("redis-server in the primary's node");
    // SAFETY: kill(2) of the service process the test found in the lab's node.
    assert_eq!(unsafe { libc::kill(redis as i32, libc::SIGKILL) }, 0);
    let second = write_300(&c, to, 300, "writes resume after the primary's crash");
    let svc = c.wait_active("redis", Duration::from_secs(30), |s| {
        s["primary"] == backup.as_str() && s["failures"].as_array().is_some_and(|f| f.len() == 1)
    });
    assert_eq!(svc["failures"][0]["machine"], primary.as_str());
    let why = svc["failures"][0]["why"].as_str().unwrap();
    assert!(why.contains("the service ended"), "{why}");
    let acked: Vec<u64> = first.into_iter().chain(second).collect();
    c.assert_no_write_lost(to, &acked, "");
    // The old primary, alive, is re-protection's spare: it dropped the failed sandbox.
    c.wait_active("redis", Duration::from_secs(30), |s| {
        s["primary"] == backup.as_str() && s["backups"][0] == primary.as_str()
    });
    old_primary_takes_over_again(&mut c, to, &acked, &backup, &primary);
}
