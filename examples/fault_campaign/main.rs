//! The fault campaign (issue 7, "How it must be shown"): trials of a fault injected at a random
//! moment into a protected redis on the lab, under concurrent clients whose histories are
//! checked for linearizability and lost acknowledged writes by Porcupine
//! (`bench/linearizability`), with the failover gap the clients saw.
//!
//! The lab: machines m1-m3, orchestrators o1-o3 (raft, mutual TLS), the client node; Debian's
//! redis (or memcached, `--service`) deployed with one backup (`--backups`; the lab has one
//! machine more, the spare that re-protects after a failure). Faults, taken in turn (so a campaign cut
//! short stays balanced), are listed in `faults.rs`: power cuts of the primary's machine, a
//! backup's, the leader orchestrator; partitions of the primary and of an orchestrator
//! minority; the primary's instance daemon killed alone; a backup slowed, its link lossy, or
//! cut one way.
//!
//! Modules: `client.rs` (the clients and their protocols), `history.rs` (operations, the gap,
//! the checker), `lab.rs` (the lab and the service's status), `faults.rs`, `trial.rs`.
//!
//! A trial: wait for the steady state (service active with its backups, primary running, every
//! machine alive, a leader with every orchestrator reachable); start the clients (each a
//! connection from the client node running SET/GET on registers `TRIAL:k0..k4` and INCR/GET on
//! counters `TRIAL:n0..n1`, recording every operation's call and return times and its result, or
//! "unknown" when the connection broke before the answer); inject the fault 0.3-1.3 s in; wait
//! for recovery (see `faults::recovered`: the service answers again in an active view with its
//! backups again, without the victim where it was lost; a transient fault is lifted first), at
//! most `--recovery-timeout`; bring the victim back and wait for the steady state again; stop
//! the clients, read every key once more (the final reads) and check the history.
//! A trial that does not recover is counted as such and the lab is rebuilt.
//!
//! Writes `bench/out/campaign-STAMP/`: `results.json` (every trial, the summary per fault),
//! `summary.md`, the histories of trials that failed a check (all of them with
//! `--keep-histories`), Porcupine's visualization of illegal ones, and the daemons' logs of any
//! trial that did not recover or failed a check.
//!
//! Run through `bench/campaign.sh` (builds tardi, this and the checker), or
//! `fault_campaign --checker PATH [--trials N] [--faults primary,backup,...] [--service
//! redis|memcached] [--backups N] [--clients N] [--recovery-timeout 20s] [--seed N]
//! [--keep-histories] [--lock-wait 30m] [--tardi PATH] [--out DIR] [--stamp STAMP]`.

mod client;
mod faults;
mod history;
mod lab;
mod trial;

/// The duration syntax of every `tardi` flag (`500ms`, `20s`, `30m`), shared with the CLI.
#[path = "../../src/parse.rs"]
#[allow(dead_code)]
mod parse;

use anyhow::{Context, Result, bail};
use client::Kind;
use faults::FAULTS;
use lab::Cluster;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tardi_testkit::stats::percentile_rounded as pct;
use tardi_testkit::{root, sh};
use tracing::info;

const ORCHESTRATORS: usize = 3;

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

/// Trials of faults injected into a protected service on the lab, its clients' histories
/// checked for linearizability and lost acknowledged writes.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "fault_campaign", long_about = None)]
struct Opts {
    /// The service: redis or memcached.
    #[arg(long = "service", default_value = "redis", value_parser = parse_kind)]
    kind: Kind,
    /// Backups of the service (1 to 3); the lab has one machine more, a spare.
    #[arg(long, default_value_t = 1, value_parser = count(1, 3))]
    backups: usize,
    /// The `tardi` binary (default: `tardi` in the directory above this example's).
    #[arg(long, default_value_os_t = default_tardi())]
    tardi: PathBuf,
    /// The linearizability checker (`cd bench/linearizability && go build`).
    #[arg(long)]
    checker: PathBuf,
    /// Where the campaign's directory goes.
    #[arg(long, default_value_os_t = root().join("bench/out"))]
    out: PathBuf,
    /// Trials of each fault.
    #[arg(long, default_value_t = 5)]
    trials: usize,
    /// The faults, comma-separated, taken in turn.
    #[arg(long, value_delimiter = ',', default_values_t = FAULTS.map(String::from))]
    faults: Vec<String>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4, value_parser = count(1, 1000))]
    clients: usize,
    /// How long a trial may take to recover before it counts as not recovered.
    #[arg(long, default_value = "20s", value_parser = parse::parse_duration)]
    recovery_timeout: Duration,
    /// The random seed (default: the clock).
    #[arg(long, default_value_t = now_unix_us())]
    seed: u64,
    /// Keep every trial's history, not only those that failed a check.
    #[arg(long)]
    keep_histories: bool,
    /// How long to wait for another user's lab to go.
    #[arg(long, default_value = "30m", value_parser = parse::parse_duration)]
    lock_wait: Duration,
    /// The results' time stamp (default: now, UTC).
    #[arg(long)]
    stamp: Option<String>,
    /// The command line, for the record.
    #[arg(skip = std::env::args().collect::<Vec<_>>().join(" "))]
    command: String,
}

fn parse_kind(s: &str) -> Result<Kind, String> {
    Kind::parse(s).ok_or_else(|| format!("unknown service {s:?} (redis or memcached)"))
}

/// A count from `min` to `max`.
fn count(min: usize, max: usize) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |s| match s.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a number from {min} to {max}")),
    }
}

/// `tardi` beside this example's directory (target/release/examples/fault_campaign ->
/// target/release/tardi).
fn default_tardi() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join("tardi")))
        .unwrap_or_else(|| PathBuf::from("tardi"))
}

impl Opts {
    /// The lab's machines: the primary, the backups and one spare.
    fn machines(&self) -> usize {
        self.backups + 2
    }

    /// The command line's options, checked: known faults, the binaries there.
    fn parse() -> Result<Opts> {
        let o = <Opts as clap::Parser>::parse();
        if let Some(f) = o.faults.iter().find(|f| !FAULTS.contains(&f.as_str())) {
            bail!("unknown fault {f:?} (known: {})", FAULTS.join(", "));
        }
        if !o.tardi.is_file() {
            bail!("no tardi binary at {}", o.tardi.display());
        }
        if !o.checker.is_file() {
            bail!(
                "no checker at {:?} (cd bench/linearizability && go build)",
                o.checker
            );
        }
        Ok(o)
    }
}

pub fn now_unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

// ---------------------------------------------------------------------------------------------
// Summary
// ---------------------------------------------------------------------------------------------

fn summarize(trials: &[Value], faults: &[String]) -> (Value, String) {
    let mut md = String::from(
        "| fault | trials | recovered | lost writes | linearizability violations | not checked | connections kept | gap p50 ms | p90 | p99 | max |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut by = serde_json::Map::new();
    for f in faults {
        let ts: Vec<&Value> = trials
            .iter()
            .filter(|t| t["fault"] == f.as_str() && t["started"] == true)
            .collect();
        let recovered = ts.iter().filter(|t| t["recovered"] == true).count();
        let lost: u64 = ts.iter().filter_map(|t| t["lost_writes"].as_u64()).sum();
        let checked: Vec<&&Value> = ts.iter().filter(|t| t["checked"] == true).collect();
        let violations = checked.iter().filter(|t| t["linearizable"] != true).count();
        let unchecked = ts.len() - checked.len();
        let clients: u64 = ts.iter().filter_map(|t| t["clients"].as_u64()).sum();
        let broke: u64 = ts
            .iter()
            .filter_map(|t| t["clients_reconnected"].as_u64())
            .sum();
        let kept = format!("{}/{clients}", clients - broke.min(clients));
        let mut gaps: Vec<f64> = ts
            .iter()
            .filter(|t| t["recovered"] == true)
            .filter_map(|t| t["gap_ms"].as_f64())
            .collect();
        gaps.sort_by(f64::total_cmp);
        let g = |p| pct(&gaps, p);
        md.push_str(&format!(
            "| {f} | {} | {recovered} | {lost} | {violations} | {unchecked} | {kept} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            ts.len(),
            g(0.5),
            g(0.9),
            g(0.99),
            gaps.last().copied().unwrap_or(f64::NAN)
        ));
        by.insert(
            f.clone(),
            json!({"trials": ts.len(), "recovered": recovered, "lost_writes": lost,
                   "linearizability_violations": violations, "not_checked": unchecked,
                   "clients": clients, "clients_reconnected": broke,
                   "gap_ms": {"p50": g(0.5), "p90": g(0.9), "p99": g(0.99), "max": gaps.last()}}),
        );
    }
    (Value::Object(by), md)
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run() {
        eprintln!("fault_campaign: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let o = Opts::parse()?;
    let stamp = o
        .stamp
        .clone()
        .unwrap_or_else(|| sh("date -u +%Y%m%d-%H%M%S"));
    let dir = o.out.join(format!("campaign-{stamp}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let r = root();
    let commit = sh(&format!("git -C {} rev-parse --short HEAD", r.display()));
    let started = sh("date -u '+%Y-%m-%d %H:%M'");
    info!(
        "campaign {stamp}: {} trials of {:?} on {} with {} backup(s), {} clients, seed {}, commit {commit}; results in {}",
        o.trials,
        o.faults,
        o.kind.name(),
        o.backups,
        o.clients,
        o.seed,
        dir.display()
    );
    history::self_test_checker(&o.checker, &dir)?;
    let mut rng = StdRng::seed_from_u64(o.seed);
    let mut trials: Vec<Value> = Vec::new();
    let mut rebuilds = 0usize;
    let mut cluster: Option<Cluster> = None;
    let t_start = Instant::now();
    let save = |trials: &[Value], rebuilds: usize, finished: bool| -> Result<String> {
        let (summary, md) = summarize(trials, &o.faults);
        let v = json!({
            "stamp": stamp, "commit": commit, "command": o.command, "started_utc": started,
            "finished_utc": sh("date -u '+%Y-%m-%d %H:%M'"), "finished": finished,
            "seed": o.seed, "clients": o.clients, "machines": o.machines(),
            "orchestrators": ORCHESTRATORS, "service": o.kind.name(), "backups": o.backups,
            "recovery_timeout_s": o.recovery_timeout.as_secs(),
            "elapsed_s": t_start.elapsed().as_secs_f64(), "lab_rebuilds": rebuilds,
            "nproc": sh("nproc"), "kernel": sh("uname -r"),
            "summary": summary, "trials": trials,
        });
        std::fs::write(dir.join("results.json"), serde_json::to_vec_pretty(&v)?)
            .context("writing results.json")?;
        std::fs::write(dir.join("summary.md"), &md).context("writing summary.md")?;
        Ok(md)
    };
    for n in 0..o.trials {
        for fault in &o.faults {
            let mut c = match cluster.take() {
                Some(c) => c,
                None => {
                    rebuilds += 1;
                    Cluster::up(&o)?
                }
            };
            let out = trial::trial(&mut c, &o, &dir, fault, n, &mut rng);
            if out.keep_logs {
                c.keep_logs(&dir.join("logs").join(format!("{fault}-{n:03}")));
            }
            trials.push(out.rec);
            if out.lab_ok {
                cluster = Some(c);
            } else {
                info!("rebuilding the lab");
                drop(c);
            }
        }
        save(&trials, rebuilds, false)?;
    }
    drop(cluster);
    let md = save(&trials, rebuilds, true)?;
    println!("{md}");
    info!(
        "campaign done in {:.0} s: {}",
        t_start.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(())
}
