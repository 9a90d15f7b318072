//! The replicated commands: `tardi orchestrator`, `tardi instance`, `tardi deploy` and
//! `tardi status` against an orchestrator. The work is in `tardi-orchestrator` and
//! `tardi-instance`; this module parses, calls and prints.

use crate::cli::{
    CertsArgs, DeployArgs, InstanceArgs, OrchestratorAction, OrchestratorArgs, RestartArgs,
    StatusArgs, TlsArgs, UndeployArgs,
};
use anyhow::Context;
use std::time::Duration;
use tardi_orchestrator::client;
use tardi_tls::Security;

/// The security the flags ask for: a TLS identity, or plaintext if explicitly asked.
fn security(t: &TlsArgs, who: &str) -> anyhow::Result<Security> {
    Ok(Security::from_flags(
        t.tls_dir.as_deref(),
        t.insecure_plaintext,
        who,
    )?)
}

/// `tardi certs`.
pub fn certs(a: CertsArgs) -> anyhow::Result<()> {
    use tardi_tls::certs::{NodeSpec, Role};
    let mut nodes = Vec::new();
    for (role, list) in [
        (Role::Orchestrator, &a.orchestrators),
        (Role::Instance, &a.instances),
        (Role::Client, &a.clients),
    ] {
        for s in list {
            nodes.push(NodeSpec::parse(role, s)?);
        }
    }
    let made = tardi_tls::certs::make(&a.dir, &nodes, a.days, a.force)?;
    if made.new_ca {
        println!(
            "made a new cluster CA: {} (its key {} signs every node: keep it here)",
            a.dir.join(tardi_tls::certs::CA_CERT).display(),
            a.dir.join(tardi_tls::certs::CA_KEY).display()
        );
    } else {
        println!(
            "signed with the CA already in {}",
            a.dir.join(tardi_tls::certs::CA_CERT).display()
        );
    }
    for (n, d) in nodes.iter().zip(&made.nodes) {
        let mut names = vec![n.name.clone()];
        names.extend(n.addrs.iter().cloned());
        println!(
            "{} ({}): {} [{}]",
            n.name,
            n.role.as_str(),
            d.display(),
            names.join(", ")
        );
    }
    println!(
        "copy each node's directory to it and pass it as --tls-dir DIR (or set TARDI_TLS_DIR)"
    );
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

pub fn orchestrator(a: OrchestratorArgs) -> anyhow::Result<()> {
    match a.action {
        Some(OrchestratorAction::Join(j)) => {
            let sec = security(&j.tls, "tardi orchestrator join")?;
            let r = runtime()?.block_on(client::join(&j.orchestrator, &sec, &j.name, &j.addr))?;
            println!(
                "{} joined the orchestrator cluster; members: {}",
                j.name,
                r.members.join(", ")
            );
            return Ok(());
        }
        Some(OrchestratorAction::Leave(l)) => {
            let sec = security(&l.tls, "tardi orchestrator leave")?;
            let r = runtime()?.block_on(client::leave(&l.orchestrator, &sec, &l.name))?;
            println!(
                "{} left the orchestrator cluster; members: {}",
                l.name,
                r.members.join(", ")
            );
            return Ok(());
        }
        None => {}
    }
    if a.failure_timeout < Duration::from_millis(1) {
        anyhow::bail!("--failure-timeout must be at least 1ms");
    }
    let sec = security(&a.tls, "tardi orchestrator")?;
    let peers = a
        .peers
        .iter()
        .map(|p| {
            p.split_once('=')
                .filter(|(n, addr)| !n.is_empty() && !addr.is_empty())
                .map(|(n, addr)| (n.to_string(), addr.to_string()))
                .with_context(|| format!("--peers: {p:?} is not NAME=ADDR"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let data_dir = a
        .data_dir
        .unwrap_or_else(|| std::path::Path::new("/var/lib/tardi/orchestrator").join(&a.name));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(tardi_orchestrator::server::serve(
        tardi_orchestrator::server::Options {
            listen: a.listen,
            name: a.name,
            failure_timeout: a.failure_timeout,
            data_dir,
            peers,
            join: a.join,
            metrics: a.metrics,
            security: sec,
        },
    ))?;
    Ok(())
}

pub fn instance(a: InstanceArgs) -> anyhow::Result<()> {
    if a.heartbeat < Duration::from_millis(1) || a.queue_len == 0 {
        anyhow::bail!("--heartbeat must be at least 1ms and --queue-len at least 1");
    }
    let sec = security(&a.tls, "tardi instance")?;
    tardi_instance::run(tardi_instance::Options {
        machine: a.machine,
        listen: a.listen,
        orchestrator: a.orchestrator,
        service_if: a.service_if,
        state_dir: a.state_dir,
        run_dir: a.run_dir,
        queue_len: a.queue_len,
        link_bandwidth: a.link_bandwidth,
        heartbeat: a.heartbeat,
        epoch_log: a.epoch_log,
        metrics: a.metrics,
        security: sec,
        fault_restore: a.fault_restore,
        fault_corrupt_image: a.fault_corrupt_image,
        fault_drop_tcp: a.fault_drop_tcp,
    })
}

pub fn undeploy(a: UndeployArgs) -> anyhow::Result<()> {
    let wait = (!a.no_wait).then_some(a.timeout);
    let sec = security(&a.tls, "tardi undeploy")?;
    runtime()?.block_on(client::undeploy(&a.orchestrator, &sec, &a.service, wait))?;
    if wait.is_some() {
        println!("{:?} is undeployed: no machine runs it any more", a.service);
    } else {
        println!(
            "{:?} is undeployed (machines drop it as their next assignment reaches them)",
            a.service
        );
    }
    Ok(())
}

pub fn restart(a: RestartArgs) -> anyhow::Result<()> {
    let wait = (!a.no_wait).then_some(a.timeout);
    let sec = security(&a.tls, "tardi restart")?;
    runtime()?.block_on(client::restart(&a.orchestrator, &sec, &a.service, wait))?;
    if wait.is_some() {
        println!("{:?} is back: a new view of it is active", a.service);
    } else {
        println!(
            "{:?} is no longer given up; the orchestrator moves it to the machine with its freshest image",
            a.service
        );
    }
    Ok(())
}

pub fn deploy(a: DeployArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.manifest)
        .with_context(|| format!("reading {}", a.manifest.display()))?;
    // Checked here too, so a bad manifest is reported with its file and line before anything
    // is sent.
    let (m, warnings) = tardi_service::load_manifest(&a.manifest)?;
    for w in warnings {
        eprintln!("tardi: warning: {w}");
    }
    let path = std::path::absolute(&a.manifest)?;
    let json = a.json;
    let wait = (!a.no_wait).then_some(a.timeout);
    if !json {
        println!(
            "deploying {:?} with {} backup(s) through {}",
            m.tardi.name, a.backups, a.orchestrator
        );
    }
    let sec = security(&a.tls, "tardi deploy")?;
    let reply = runtime()?.block_on(client::deploy(
        &a.orchestrator,
        &sec,
        text,
        path.display().to_string(),
        a.backups,
        wait,
        &mut |line| {
            if !json {
                println!("  {line}");
            }
        },
    ))?;
    let view = reply.view.unwrap_or_default();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "service": reply.service,
                "view": view.number,
                "active": view.active,
                "primary": view.primary,
                "backups": view.backups,
            })
        );
    } else if view.active {
        println!(
            "{:?} is protected: view {}, primary {}, backups {}",
            reply.service,
            view.number,
            view.primary,
            view.backups.join(", ")
        );
    } else {
        println!(
            "{:?} deployed: view {} proposed, primary {}, backups {} (see `tardi status`)",
            reply.service,
            view.number,
            view.primary,
            view.backups.join(", ")
        );
    }
    Ok(())
}

/// `tardi status` with an orchestrator: the cluster's services.
pub fn status(a: &StatusArgs, addr: &str) -> anyhow::Result<()> {
    let sec = security(&a.tls, "tardi status")?;
    let st = runtime()?.block_on(client::status_from(addr, &sec, !a.any_node))?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&tardi_orchestrator::status::json(&st))?
        );
        return Ok(());
    }
    let cl = st.cluster.clone().unwrap_or_default();
    println!(
        "orchestrator cluster: leader {}, term {}, log index {} (applied {}), answered by {}{}",
        if cl.leader.is_empty() {
            "unknown"
        } else {
            &cl.leader
        },
        cl.term,
        cl.last_log_index,
        cl.last_applied,
        st.orchestrator,
        if cl.from_leader {
            ""
        } else {
            " (a follower: machines' liveness and reports are the leader's only)"
        }
    );
    for m in &cl.members {
        println!(
            "  {:<8} {:<26} {}{}{}",
            m.name,
            m.addr,
            if m.reachable {
                "reachable"
            } else {
                "unreachable"
            },
            if m.voter { "" } else { ", learner" },
            if cl.from_leader {
                format!(", log index {}", m.matched_index)
            } else {
                String::new()
            }
        );
    }
    println!("machines:");
    for m in &st.machines {
        println!(
            "  {:<8} {:<22} {}",
            m.name,
            m.api,
            if m.alive {
                "alive".to_string()
            } else {
                format!("unreachable (last heard {} ms ago)", m.last_seen_ms)
            }
        );
    }
    if st.services.is_empty() {
        println!("no services deployed (tardi deploy MANIFEST)");
    }
    for s in &st.services {
        let v = s.view.clone().unwrap_or_default();
        println!(
            "service {:?} at {}: {}; view {} ({}), primary {}, backups [{}], spares [{}]",
            s.name,
            if s.address.is_empty() {
                "-"
            } else {
                &s.address
            },
            s.health,
            v.number,
            if v.active { "active" } else { "proposed" },
            v.primary,
            v.backups.join(", "),
            s.spares.join(", ")
        );
        if let Some(p) = &s.primary {
            println!(
                "  primary: {}; epoch {} (decided {}), {:.0} epochs/s, checkpoint {} B, pause p50 {} µs p99 {} µs, lag {} epochs, held output {} packets / {} B",
                p.state,
                p.epoch,
                p.decided,
                p.epochs_per_sec,
                p.checkpoint_bytes,
                p.pause_p50_us,
                p.pause_p99_us,
                p.backup_lag,
                p.held_packets,
                p.held_bytes
            );
        }
        for b in &s.backup_reports {
            println!(
                "  backup: {}; queued epoch {}, applied {}, queue {}; divergence checks {}, diverged {}",
                b.state, b.epoch, b.decided, b.backup_lag, b.scrub_checks, b.scrub_mismatches
            );
            if !b.scrub_last_mismatch.is_empty() {
                println!(
                    "    last divergence (the image was dropped and re-seeded): {}",
                    b.scrub_last_mismatch
                );
            }
        }
        if let Some(h) = s.history.last() {
            println!("  last view change: view {}: {}", h.view, h.reason);
        }
        if !s.failed.is_empty() {
            println!(
                "  FAILED: {} (given up; `tardi restart {}` brings it back)",
                s.failed, s.name
            );
        }
        for (i, f) in s.failures.iter().enumerate() {
            println!(
                "  failure {}/{}: {} as primary of view {}: {}",
                i + 1,
                s.max_failures,
                f.machine,
                f.view,
                f.why
            );
        }
    }
    Ok(())
}
