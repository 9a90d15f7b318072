//! One trial: the steady state, clients started, the fault at a random moment, recovery,
//! the victim back, the final reads, the history checked.

use crate::Opts;
use crate::client;
use crate::faults::{self, Roles};
use crate::history::{Shared, longest_gap, run_checker};
use crate::lab::Cluster;
use anyhow::{Context, anyhow};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::info;

use crate::now_unix_us;

/// What a trial found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rec: Value,
    /// Whether the lab can be used for the next trial.
    pub lab_ok: bool,
    /// Whether something is worth keeping the logs for.
    pub keep_logs: bool,
}

pub fn trial(
    c: &mut Cluster,
    o: &Opts,
    dir: &Path,
    fault: &str,
    n: usize,
    rng: &mut StdRng,
) -> Outcome {
    let tag = format!("{fault}-{n:03}");
    let st = match c.try_wait("the steady state", Duration::from_secs(30), |s| {
        c.is_steady(s)
    }) {
        Ok(s) => s,
        Err(e) => {
            return Outcome {
                rec: json!({"fault": fault, "trial": n, "started": false, "error": format!("{e:#}")}),
                lab_ok: false,
                keep_logs: true,
            };
        }
    };
    let svc = c.svc(&st).clone();
    let roles = Roles::of(c, &st);
    let view0 = roles.view;
    let (primary, leader) = (roles.primary.clone(), roles.leader.clone());
    let backup = roles.backups.first().cloned().unwrap_or_default();
    let victim = faults::victim(fault, &roles);
    let to = match svc["address"]
        .as_str()
        .and_then(|a| a.parse::<std::net::Ipv4Addr>().ok())
    {
        Some(a) => SocketAddr::from((a, c.kind.port())),
        None => {
            return Outcome {
                rec: json!({"fault": fault, "trial": n, "started": false, "error": format!("no service address in {svc}")}),
                lab_ok: false,
                keep_logs: true,
            };
        }
    };
    let ns = match c.lab.node("client") {
        Ok(node) => node.namespace(),
        Err(e) => {
            return Outcome {
                rec: json!({"fault": fault, "trial": n, "started": false, "error": e.to_string()}),
                lab_ok: false,
                keep_logs: true,
            };
        }
    };

    // Clients, on keys of their own (the model starts from empty keys).
    let prefix = format!("{tag}:");
    let sh = Arc::new(Shared {
        base: Instant::now(),
        stop: AtomicBool::new(false),
        last_ok: AtomicU64::new(0),
        ops: Mutex::new(Vec::new()),
        reconnected: AtomicU64::new(0),
    });
    let threads: Vec<_> = (0..o.clients)
        .map(|id| {
            let (ns, sh, seed, prefix) =
                (ns.clone(), sh.clone(), rng.random::<u64>(), prefix.clone());
            let kind = c.kind;
            std::thread::spawn(move || client::client(kind, id, ns, to, prefix, seed, sh))
        })
        .collect();

    // The fault, at a random moment.
    let delay_ms = rng.random_range(300..1300u64);
    std::thread::sleep(Duration::from_millis(delay_ms));
    let fault_at = sh.now();
    let fault_unix_ms = now_unix_us() / 1000;
    let injected = faults::inject(c, fault, &victim, &roles);
    let mut notes: Vec<String> = Vec::new();
    let victims = match &injected {
        Ok(v) => v.clone(),
        Err(e) => {
            notes.push(format!("injecting the fault: {e:#}"));
            vec![victim.clone()]
        }
    };
    // A transient fault is lifted before recovery is judged.
    let transient = faults::transient(fault);
    let mut lifted = None;
    if let Some(d) = transient {
        std::thread::sleep(d);
        let r = faults::lift(c, fault, &victims, &roles);
        if let Err(e) = &r {
            notes.push(format!("lifting the fault: {e:#}"));
        }
        lifted = Some(r.is_ok());
    }

    // Recovery.
    let recovered_status = c.try_wait("recovery", o.recovery_timeout, |s| {
        faults::recovered(c, fault, s, &roles, &victims)
    });
    // ... and the service answers in it.
    let mut recovered_at = None;
    if let Ok(_s) = &recovered_status {
        let seen = sh.now() as u64;
        let t0 = Instant::now();
        while t0.elapsed() < o.recovery_timeout {
            if sh.last_ok.load(Ordering::Relaxed) > seen {
                recovered_at = Some(sh.now());
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let recovered = injected.is_ok() && lifted != Some(false) && recovered_at.is_some();
    if let Err(e) = &recovered_status {
        notes.push(format!("{e:#}"));
    } else if recovered_at.is_none() {
        notes.push("the new view is active but no client succeeded".into());
    }
    let after = recovered_status
        .as_ref()
        .map(|s| c.svc(s))
        .cloned()
        .unwrap_or_default();

    // The victim back.
    let mut lab_ok = recovered;
    let mut deposed_ok = Value::Null;
    if recovered {
        let back = if transient.is_some() {
            Ok(())
        } else {
            faults::lift(c, fault, &victims, &roles)
        };
        if let Err(e) = back {
            notes.push(format!("bringing {victim} back: {e:#}"));
            lab_ok = false;
        } else if let Err(e) = c.try_wait("the steady state again", Duration::from_secs(30), |s| {
            c.is_steady(s)
        }) {
            notes.push(format!("{e:#}"));
            lab_ok = false;
        }
        if faults::deposes_the_victim(fault) {
            // The old primary, healed, must learn it was deposed and stop its sandbox.
            let t0 = Instant::now();
            let mut pids = c.pids_of_service(&victim);
            while !pids.is_empty() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(100));
                pids = c.pids_of_service(&victim);
            }
            deposed_ok = json!(pids.is_empty());
            if !pids.is_empty() {
                notes.push(format!(
                    "the old primary {victim}, back, still runs the service {pids:?} 10 s later"
                ));
                lab_ok = false;
            }
        }
    }
    let restored_at = sh.now();
    // The views since the fault, with when each was proposed and active (unix ms).
    let views: Vec<Value> = c.svc(&c.status_or_null())["history"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter(|x| {
                    x["proposed_ms"]
                        .as_u64()
                        .is_some_and(|p| p + 50 >= fault_unix_ms)
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    std::thread::sleep(Duration::from_millis(300));
    sh.stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let finals = if lab_ok || recovered {
        client::final_reads(c.kind, &ns, to, &prefix, &sh, o.clients)
    } else {
        Err(anyhow!("not recovered: no final reads"))
    };
    let end = sh.now();
    let mut ops = std::mem::take(&mut *sh.ops.lock().unwrap_or_else(|p| p.into_inner()));
    ops.sort_by_key(|o| (o.call, o.client));
    let (gap, gap_from) = longest_gap(&ops, fault_at.saturating_sub(1_000_000).max(0), restored_at);
    let count = |st: &str| ops.iter().filter(|o| o.status == st).count();
    let (n_ok, n_unknown, n_fail) = (count("ok"), count("unknown"), count("fail"));
    let final_ok = finals.is_ok();
    if let Err(e) = &finals {
        notes.push(format!("{e:#}"));
    }
    ops.extend(finals.unwrap_or_default());

    // The check.
    let hist_dir = dir.join("histories");
    let path = hist_dir.join(format!("{tag}.json"));
    let check = std::fs::create_dir_all(&hist_dir)
        .context("creating the histories' directory")
        .and_then(|_| {
            let h = json!({"trial": tag, "ops": ops});
            std::fs::write(&path, serde_json::to_vec(&h)?).context("writing the history")
        })
        .and_then(|_| run_checker(&o.checker, &path, &dir.join("illegal")));
    let (linearizable, lost, report) = match &check {
        Ok(r) => (
            r["result"] == "Ok",
            r["lost_writes"].as_u64().unwrap_or(0),
            r.clone(),
        ),
        Err(e) => {
            notes.push(format!("checker: {e:#}"));
            (false, 0, Value::Null)
        }
    };
    let checked = check.is_ok() && report["result"] != "Unknown";
    let violation = checked && (!linearizable || lost > 0);
    if !violation && checked && !o.keep_histories {
        let _ = std::fs::remove_file(&path);
    }
    let rec = json!({
        "fault": fault, "trial": n, "started": true, "victim": victim, "victims": victims,
        "primary_before": primary, "backup_before": backup, "leader_before": leader,
        "view_before": view0, "view_after": after["view"], "primary_after": after["primary"],
        "backups_after": after["backups"],
        "fault_after_ms": delay_ms, "fault_unix_ms": fault_unix_ms,
        "recovered": recovered,
        "recovered_after_fault_ms": recovered_at.map(|t| (t - fault_at) as f64 / 1e3),
        "restored_after_fault_ms": (restored_at - fault_at) as f64 / 1e3,
        "lab_ok_after": lab_ok, "old_primary_deposed": deposed_ok,
        "view_changed": after["view"].as_u64().is_some_and(|v| v > view0),
        "service": c.kind.name(), "backups": c.backups,
        "gap_ms": gap as f64 / 1e3, "gap_started_after_fault_ms": (gap_from - fault_at) as f64 / 1e3,
        "ops_ok": n_ok, "ops_unknown": n_unknown, "ops_failed": n_fail,
        "clients": o.clients, "clients_reconnected": sh.reconnected.load(Ordering::Relaxed),
        "final_reads": final_ok,
        "checked": checked, "linearizable": checked && linearizable, "lost_writes": lost,
        "check": report, "duration_s": end as f64 / 1e6, "views_since_fault": views,
        "notes": notes,
    });
    info!(
        "{tag}: victim {victim}, fault at {delay_ms} ms, recovered {recovered} ({:?} ms), gap {:.1} ms, ops {n_ok} ok / {n_unknown} unknown / {n_fail} failed, linearizable {}, lost {lost}{}",
        rec["recovered_after_fault_ms"],
        gap as f64 / 1e3,
        rec["linearizable"],
        if notes.is_empty() {
            String::new()
        } else {
            format!("; {}", notes.join("; "))
        }
    );
    Outcome {
        rec,
        lab_ok,
        keep_logs: !recovered || !lab_ok || violation || !checked,
    }
}
