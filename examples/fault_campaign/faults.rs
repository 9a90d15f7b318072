//! The faults a trial injects, how each is lifted, and what recovery from it means.
//!
//! Until the service has recovered (a *lasting* fault), or for a few seconds (a *transient*
//! one, lifted before recovery is judged):
//!
//! - `primary`     power cut of the primary's machine (`Lab::kill`: every process SIGKILLed,
//!   link down); brought back once recovered;
//! - `backup`      power cut of a backup's machine;
//! - `leader`      power cut of the leader orchestrator;
//! - `partition`   the primary's machine cut off (alive, no links), healed once recovered; the
//!   old primary must then be deposed (its sandbox gone);
//! - `daemon`      the primary's `tardi instance` killed alone (`Lab::crash_daemon`), its
//!   sandbox left running; restarted once recovered, when the old sandbox must go;
//! - `minority`    one orchestrator that is not the leader partitioned for 2 s (no view change
//!   is expected: `view_changed` says whether one happened);
//! - `slow-backup` a backup's machine held to 2% of a CPU for 3 s (its processes moved to a
//!   cgroup-v1 `cpu` group with a CFS quota: the lab's own cgroups are v2 without the `cpu`
//!   controller on this kernel's hybrid mount);
//! - `lossy`       30% of the packets from the primary to a backup's checkpoint-stream port
//!   dropped for 3 s (iptables `statistic`, in the backup's node);
//! - `asym`        an asymmetric partition for 3 s: everything the backup's machine sends to
//!   the primary's is dropped (its acknowledgements, and TCP's own), what the primary sends
//!   arrives;
//! - `second`      a second fault during the view change: the primary's machine loses power,
//!   and as soon as a view that moves the service is proposed, so does its new primary's. With
//!   one backup no machine holds the service's state any more: it cannot recover (the
//!   documented outcome: unavailable, nothing released that a client could lose); with two, the
//!   remaining backup takes over;
//! - `slow-link`   the primary's machine sends at most 10 Mbit/s for 3 s (a `tbf` token bucket
//!   on its link): its checkpoints, and its replies, back up.
//!
//! Not here: a whole-cluster power cut (a lab test, `tests/cluster_power_cut.rs`: its outcome,
//! the service given up, is not one a client's history can pass), and a delay on the link
//! (`netem` is not in this kernel).

use crate::lab::Cluster;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::time::Duration;

pub const FAULTS: [&str; 11] = [
    "primary",
    "backup",
    "leader",
    "partition",
    "daemon",
    "minority",
    "slow-backup",
    "lossy",
    "asym",
    "second",
    "slow-link",
];

/// Who held which role when the fault was injected.
#[derive(Debug, Clone)]
pub struct Roles {
    pub view: u64,
    pub primary: String,
    pub backups: Vec<String>,
    pub leader: String,
    pub orchestrators: Vec<String>,
}

impl Roles {
    pub fn of(c: &Cluster, s: &Value) -> Roles {
        let svc = c.svc(s);
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        Roles {
            view: svc["view"].as_u64().unwrap_or(0),
            primary: svc["primary"].as_str().unwrap_or_default().to_string(),
            backups: strings(&svc["backups"]),
            leader: s["cluster"]["leader"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            orchestrators: s["cluster"]["members"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }
}

/// The machine (or orchestrator) the fault hits.
pub fn victim(fault: &str, r: &Roles) -> String {
    match fault {
        "primary" | "partition" | "daemon" | "second" | "slow-link" => r.primary.clone(),
        "leader" => r.leader.clone(),
        "minority" => r
            .orchestrators
            .iter()
            .find(|o| **o != r.leader)
            .cloned()
            .unwrap_or_default(),
        _ => r.backups.first().cloned().unwrap_or_default(),
    }
}

/// How long a transient fault lasts (lifted before recovery is judged); `None`: it lasts until
/// the service has recovered.
pub fn transient(fault: &str) -> Option<Duration> {
    match fault {
        "minority" => Some(Duration::from_secs(2)),
        "slow-backup" | "lossy" | "asym" | "slow-link" => Some(Duration::from_secs(3)),
        _ => None,
    }
}

/// The cgroup-v1 `cpu` group a slowed machine's processes go to.
const SLOW_CGROUP: &str = "/sys/fs/cgroup/cpu/tardi-campaign-slow";

/// `program ARGS` in `node`; its error output if it fails.
fn run_in(c: &Cluster, node: &str, program: &str, args: &[&str]) -> Result<()> {
    let mut argv = vec![program];
    argv.extend_from_slice(args);
    let out = c.lab.exec(node, &argv)?;
    if !out.status.success() {
        bail!(
            "{program} {args:?} in {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn iptables(c: &Cluster, node: &str, args: &[&str]) -> Result<()> {
    run_in(c, node, "iptables", args)
}

/// The iptables rule (after `-I`/`-D CHAIN`) of `lossy` and `asym`.
fn rule(c: &Cluster, fault: &str, r: &Roles) -> Result<(&'static str, Vec<String>)> {
    let primary = c.lab.address(&r.primary)?.to_string();
    Ok(match fault {
        "lossy" => (
            "INPUT",
            [
                "-s",
                &primary,
                "-p",
                "tcp",
                "--dport",
                "7701",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                "0.3",
                "-j",
                "DROP",
            ]
            .map(str::to_string)
            .to_vec(),
        ),
        _ => (
            "OUTPUT",
            ["-d", &primary, "-j", "DROP"].map(str::to_string).to_vec(),
        ),
    })
}

/// Moves every process of `node` to the slow group (`slow`) or back to the root `cpu` group.
fn slow(c: &Cluster, node: &str, slow: bool) -> Result<()> {
    let to = if slow {
        std::fs::create_dir_all(SLOW_CGROUP).context("creating the slow cpu cgroup")?;
        std::fs::write(format!("{SLOW_CGROUP}/cpu.cfs_period_us"), "100000")?;
        std::fs::write(format!("{SLOW_CGROUP}/cpu.cfs_quota_us"), "2000")?;
        format!("{SLOW_CGROUP}/cgroup.procs")
    } else {
        "/sys/fs/cgroup/cpu/cgroup.procs".to_string()
    };
    // Twice: a process forked while the first pass moved its parent is caught by the second.
    for _ in 0..2 {
        for pid in c.lab.cgroup_pids(node)? {
            // (A process that exited meanwhile cannot be moved: nothing to do.)
            let _ = std::fs::write(&to, pid.to_string());
        }
    }
    Ok(())
}

/// Injects `fault` into `victim`; returns every victim (`second` has two).
pub fn inject(c: &mut Cluster, fault: &str, victim: &str, r: &Roles) -> Result<Vec<String>> {
    if fault == "second" {
        c.lab.kill(victim)?;
        // The view change under way: a newer view proposed, with another primary.
        let t0 = std::time::Instant::now();
        let next = loop {
            let s = c.status_or_null();
            let svc = c.svc(&s);
            if svc["view"].as_u64().is_some_and(|v| v > r.view)
                && let Some(p) = svc["primary"].as_str().filter(|p| *p != victim)
            {
                break p.to_string();
            }
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("no view moving the service off {victim} was proposed within 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        c.lab.kill(&next)?;
        return Ok(vec![victim.to_string(), next]);
    }
    inject_one(c, fault, victim, r).map(|()| vec![victim.to_string()])
}

/// `tc ARGS` in `node` (the lab's link of a node is its `eth0`).
fn tc(c: &Cluster, node: &str, args: &[&str]) -> Result<()> {
    run_in(c, node, "tc", args)
}

/// `slow-link`: the primary's machine sends at most 10 Mbit/s (a token bucket on its link): its
/// checkpoint stream (and its replies) back up. (A delay, `netem`, is not in this kernel: `tc
/// qdisc add ... netem` answers "Specified qdisc kind is unknown".)
const SLOW_LINK: [&str; 12] = [
    "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "10mbit", "burst", "64kb", "latency",
    "500ms",
];

fn inject_one(c: &mut Cluster, fault: &str, victim: &str, r: &Roles) -> Result<()> {
    match fault {
        "partition" | "minority" => Ok(c.lab.partition(victim)?),
        "daemon" => Ok(c.lab.crash_daemon(victim)?),
        "slow-backup" => slow(c, victim, true),
        "slow-link" => tc(c, victim, &SLOW_LINK),
        "lossy" | "asym" => {
            let (chain, args) = rule(c, fault, r)?;
            let mut a = vec!["-I", chain];
            a.extend(args.iter().map(String::as_str));
            iptables(c, victim, &a)
        }
        _ => Ok(c.lab.kill(victim)?),
    }
}

/// Lifts `fault` (a transient one when its time is up, a lasting one once the service
/// recovered): every victim back as it was.
pub fn lift(c: &mut Cluster, fault: &str, victims: &[String], r: &Roles) -> Result<()> {
    for v in victims {
        lift_one(c, fault, v, r)?;
    }
    Ok(())
}

fn lift_one(c: &mut Cluster, fault: &str, victim: &str, r: &Roles) -> Result<()> {
    match fault {
        "partition" | "minority" => Ok(c.lab.heal(victim)?),
        "daemon" => Ok(c.lab.restart_daemon(victim)?),
        "slow-backup" => slow(c, victim, false),
        "slow-link" => tc(c, victim, &["qdisc", "del", "dev", "eth0", "root"]),
        "lossy" | "asym" => {
            let (chain, args) = rule(c, fault, r)?;
            let mut a = vec!["-D", chain];
            a.extend(args.iter().map(String::as_str));
            iptables(c, victim, &a)
        }
        _ => Ok(c.lab.start(victim)?),
    }
}

/// Whether the status `s` shows the service recovered from `fault` on `victims`.
pub fn recovered(c: &Cluster, fault: &str, s: &Value, r: &Roles, victims: &[String]) -> bool {
    let svc = c.svc(s);
    // Machines still down when recovery is judged (a lasting fault's victims, unless they are
    // orchestrators: those are not machines).
    let lost = if transient(fault).is_some() || fault == "leader" {
        0
    } else {
        victims.len()
    };
    if !c.is_whole(svc, lost) {
        return false;
    }
    let newer = svc["view"].as_u64().is_some_and(|v| v > r.view);
    let holds = |m: &str| {
        svc["primary"] == m
            || svc["backups"]
                .as_array()
                .is_some_and(|b| b.iter().any(|x| x == m))
    };
    let victim = victims.first().map_or("", String::as_str);
    match fault {
        "primary" | "partition" | "daemon" | "backup" | "second" => {
            newer && !victims.iter().any(|v| holds(v))
        }
        "leader" => {
            s["cluster"]["from_leader"] == true
                && s["cluster"]["leader"].as_str().is_some_and(|l| l != victim)
        }
        // Transient: lifted already; whole again, whichever view.
        _ => true,
    }
}

/// Whether the old primary's sandbox must be gone once the victim is back (it was deposed
/// while it could not hear of it).
pub fn deposes_the_victim(fault: &str) -> bool {
    matches!(fault, "partition" | "daemon")
}
