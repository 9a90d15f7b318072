//! The fault campaign (issue 7, "How it must be shown"): trials of a fault injected at a random
//! moment into a protected redis on the lab, under concurrent clients whose histories are
//! checked for linearizability and lost acknowledged writes by Porcupine
//! (`bench/linearizability`), with the failover gap the clients saw.
//!
//! The lab: machines m1-m3, orchestrators o1-o3 (raft, mutual TLS), the client node; Debian's
//! redis deployed with one backup (the third machine is the spare that re-protects after a
//! failure). Faults, taken in turn (so a campaign cut short stays balanced):
//!
//! - `primary`   power cut of the primary's machine (`Lab::kill`: every process SIGKILLed, link
//!   down);
//! - `backup`    power cut of the backup's machine;
//! - `leader`    power cut of the leader orchestrator;
//! - `partition` the primary's machine cut off (`Lab::partition`: alive, no links), healed once
//!   the service has recovered; the old primary must then be deposed (its sandbox gone).
//!
//! A trial: wait for the steady state (service active with its backup, primary running, every
//! machine alive, a leader with every orchestrator reachable); start the clients (each a
//! connection from the client node running SET/GET on registers `TRIAL:k0..k4` and INCR/GET on
//! counters `TRIAL:n0..n1`, recording every operation's call and return times and its result, or
//! "unknown" when the connection broke before the answer); inject the fault 0.3-1.3 s in; wait
//! for recovery (the service answers again in a new active view with a backup again; for the
//! leader, a new leader and the service still whole), at most `--recovery-timeout`; bring the
//! victim back (`Lab::start`, or `Lab::heal` for the partition) and wait for the steady state
//! again; stop the clients, read every key once more (the final reads) and check the history.
//! A trial that does not recover is counted as such and the lab is rebuilt.
//!
//! Writes `bench/out/campaign-STAMP/`: `results.json` (every trial, the summary per fault),
//! `summary.md`, the histories of trials that failed a check (all of them with
//! `--keep-histories`), Porcupine's visualization of illegal ones, and the daemons' logs of any
//! trial that did not recover or failed a check.
//!
//! Run through `bench/campaign.sh` (builds tardi, this and the checker), or
//! `fault_campaign --checker PATH [--trials N] [--faults primary,backup,leader,partition]
//! [--clients N] [--recovery-timeout S] [--seed N] [--keep-histories] [--lock-wait S]
//! [--tardi PATH] [--out DIR] [--stamp STAMP]`.

mod common;
use anyhow::{Context, Result, anyhow, bail};
use common::{root, sh};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tardi_lab::{Daemons, Lab, LabError, LabOptions};
use tracing::{info, warn};

const FAULTS: [&str; 4] = ["primary", "backup", "leader", "partition"];
const MACHINES: usize = 3;
const ORCHESTRATORS: usize = 3;
const SERVICE: &str = "redis";
const PORT: u16 = 6379;
/// Register keys (SET/GET) and counter keys (INCR/GET), per trial (`primary-007:k3`).
const REGISTERS: usize = 5;
const COUNTERS: usize = 2;

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Opts {
    tardi: PathBuf,
    checker: PathBuf,
    out: PathBuf,
    trials: usize,
    faults: Vec<String>,
    clients: usize,
    recovery_timeout: Duration,
    seed: u64,
    keep_histories: bool,
    lock_wait: Duration,
    stamp: Option<String>,
    command: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: fault_campaign --checker PATH [--trials N] [--faults primary,backup,leader,partition] \
         [--clients N] [--recovery-timeout S] [--seed N] [--keep-histories] [--lock-wait S] \
         [--tardi PATH] [--out DIR] [--stamp STAMP]"
    );
    std::process::exit(2)
}

impl Opts {
    fn parse() -> Result<Opts> {
        let root = root();
        let exe = std::env::current_exe().context("current exe")?;
        // target/release/examples/fault_campaign -> target/release/tardi
        let tardi = exe
            .parent()
            .and_then(|p| p.parent())
            .map(|p| p.join("tardi"))
            .context("the target directory")?;
        let mut o = Opts {
            tardi,
            checker: PathBuf::new(),
            out: root.join("bench/out"),
            trials: 5,
            faults: FAULTS.iter().map(|s| s.to_string()).collect(),
            clients: 4,
            recovery_timeout: Duration::from_secs(20),
            seed: now_unix_us(),
            keep_histories: false,
            lock_wait: Duration::from_secs(1800),
            stamp: None,
            command: std::env::args().collect::<Vec<_>>().join(" "),
        };
        let mut args = std::env::args().skip(1);
        while let Some(k) = args.next() {
            if k == "--keep-histories" {
                o.keep_histories = true;
                continue;
            }
            let v = args.next().unwrap_or_else(|| usage());
            let num = |v: &str| v.parse::<u64>().unwrap_or_else(|_| usage());
            match k.as_str() {
                "--tardi" => o.tardi = v.into(),
                "--checker" => o.checker = v.into(),
                "--out" => o.out = v.into(),
                "--trials" => o.trials = num(&v) as usize,
                "--faults" => o.faults = v.split(',').map(str::to_string).collect(),
                "--clients" => o.clients = num(&v).max(1) as usize,
                "--recovery-timeout" => o.recovery_timeout = Duration::from_secs(num(&v)),
                "--seed" => o.seed = num(&v),
                "--lock-wait" => o.lock_wait = Duration::from_secs(num(&v)),
                "--stamp" => o.stamp = Some(v),
                _ => usage(),
            }
        }
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

fn now_unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

// ---------------------------------------------------------------------------------------------
// RESP client (what the campaign needs: commands one at a time, simple replies)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
}

struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

impl Conn {
    /// Connects from the client node (`ns`, its network namespace).
    fn connect(ns: &str, to: SocketAddr) -> std::io::Result<Conn> {
        let s = tardi_lab::in_namespace(ns, || {
            TcpStream::connect_timeout(&to, Duration::from_millis(300))
        })
        .map_err(std::io::Error::other)??;
        // An answer slower than this is taken as lost (the outcome is then unknown).
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn cmd(&mut self, args: &[&str]) -> std::io::Result<Reply> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.w.write_all(&buf)?;
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let body = line.trim_end();
        let Some(kind) = body.chars().next() else {
            return Err(bad("an empty reply line".into()));
        };
        let rest = &body[kind.len_utf8()..];
        let int = |s: &str| {
            s.parse::<i64>()
                .map_err(|e| bad(format!("reply {body:?}: {e}")))
        };
        Ok(match kind {
            '+' => Reply::Status(rest.into()),
            '-' => Reply::Error(rest.into()),
            ':' => Reply::Int(int(rest)?),
            '$' => {
                let n = int(rest)?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let n = usize::try_from(n).map_err(|e| bad(e.to_string()))?;
                    if n > 1 << 20 {
                        return Err(bad(format!("a bulk reply of {n} bytes")));
                    }
                    let mut v = vec![0u8; n + 2];
                    self.r.read_exact(&mut v)?;
                    v.truncate(n);
                    Reply::Bulk(Some(v))
                }
            }
            _ => return Err(bad(format!("unexpected reply {body:?}"))),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Histories
// ---------------------------------------------------------------------------------------------

/// One operation, as `bench/linearizability` reads it.
#[derive(Debug, Clone, Serialize)]
struct Op {
    client: usize,
    op: &'static str,
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    out: Option<String>,
    /// µs since the trial's start.
    call: i64,
    ret: i64,
    /// "ok", "unknown" (the connection broke before the answer) or "fail" (an error reply).
    status: &'static str,
    #[serde(rename = "final", skip_serializing_if = "std::ops::Not::not")]
    is_final: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// What the clients share with the trial.
struct Shared {
    base: Instant,
    stop: AtomicBool,
    /// µs since `base` of the latest successful operation.
    last_ok: AtomicU64,
    ops: Mutex<Vec<Op>>,
}

impl Shared {
    fn now(&self) -> i64 {
        self.base.elapsed().as_micros() as i64
    }
}

/// Runs one client until `stop`: one operation at a time, reconnecting when the connection
/// breaks.
fn client(id: usize, ns: String, to: SocketAddr, prefix: String, seed: u64, sh: Arc<Shared>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut conn: Option<Conn> = None;
    let mut ops = Vec::new();
    let mut seq = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::connect(&ns, to) {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        seq += 1;
        let r = rng.random_range(0..10u32);
        let (op, key, value) = match r {
            0..4 => (
                "set",
                format!("{prefix}k{}", rng.random_range(0..REGISTERS)),
                Some(format!("c{id}-{seq}")),
            ),
            4..7 => (
                "get",
                format!("{prefix}k{}", rng.random_range(0..REGISTERS)),
                None,
            ),
            7..9 => (
                "incr",
                format!("{prefix}n{}", rng.random_range(0..COUNTERS)),
                None,
            ),
            _ => (
                "get",
                format!("{prefix}n{}", rng.random_range(0..COUNTERS)),
                None,
            ),
        };
        let mut args = vec![op.to_uppercase(), key.clone()];
        args.extend(value.clone());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let call = sh.now();
        let reply = c.cmd(&refs);
        let ret = sh.now();
        let (status, out, error) = match (op, reply) {
            ("set", Ok(Reply::Status(s))) if s == "OK" => ("ok", None, None),
            ("get", Ok(Reply::Bulk(v))) => (
                "ok",
                v.map(|b| String::from_utf8_lossy(&b).into_owned()),
                None,
            ),
            ("incr", Ok(Reply::Int(n))) => ("ok", Some(n.to_string()), None),
            // Redis answers an error without executing the command.
            (_, Ok(Reply::Error(e))) => ("fail", None, Some(e)),
            (_, Ok(other)) => {
                conn = None;
                ("unknown", None, Some(format!("unexpected reply {other:?}")))
            }
            (_, Err(e)) => {
                conn = None;
                ("unknown", None, Some(e.to_string()))
            }
        };
        if status == "ok" {
            sh.last_ok.fetch_max(ret as u64, Ordering::Relaxed);
        }
        ops.push(Op {
            client: id,
            op,
            key,
            value,
            out,
            call,
            ret,
            status,
            is_final: false,
            error,
        });
    }
    sh.ops.lock().unwrap_or_else(|p| p.into_inner()).extend(ops);
}

/// The final reads: every key once, from a fresh connection (retried for up to 15 s).
fn final_reads(ns: &str, to: SocketAddr, prefix: &str, sh: &Shared, id: usize) -> Result<Vec<Op>> {
    let keys: Vec<String> = (0..REGISTERS)
        .map(|i| format!("{prefix}k{i}"))
        .chain((0..COUNTERS).map(|i| format!("{prefix}n{i}")))
        .collect();
    let t0 = Instant::now();
    let mut last_err = String::new();
    while t0.elapsed() < Duration::from_secs(15) {
        let mut conn = match Conn::connect(ns, to) {
            Ok(c) => c,
            Err(e) => {
                last_err = e.to_string();
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let mut ops = Vec::new();
        for k in &keys {
            let call = sh.now();
            match conn.cmd(&["GET", k]) {
                Ok(Reply::Bulk(v)) => ops.push(Op {
                    client: id,
                    op: "get",
                    key: k.clone(),
                    value: None,
                    out: v.map(|b| String::from_utf8_lossy(&b).into_owned()),
                    call,
                    ret: sh.now(),
                    status: "ok",
                    is_final: true,
                    error: None,
                }),
                other => {
                    last_err = format!("GET {k}: {other:?}");
                    break;
                }
            }
        }
        if ops.len() == keys.len() {
            return Ok(ops);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("the final reads failed for 15 s: {last_err}")
}

/// The longest time without a successful completion, over `[from, to]` µs; and where it
/// started (µs).
fn longest_gap(ops: &[Op], from: i64, to: i64) -> (i64, i64) {
    let mut t: Vec<i64> = ops
        .iter()
        .filter(|o| o.status == "ok" && !o.is_final && o.ret >= from && o.ret <= to)
        .map(|o| o.ret)
        .collect();
    t.sort_unstable();
    let mut best = (0, from);
    let mut prev = from;
    for &x in t.iter().chain(std::iter::once(&to)) {
        if x - prev > best.0 {
            best = (x - prev, prev);
        }
        prev = x;
    }
    best
}

// ---------------------------------------------------------------------------------------------
// The lab
// ---------------------------------------------------------------------------------------------

struct Cluster {
    lab: Lab,
    tardi: PathBuf,
}

impl Cluster {
    /// A lab, redis deployed with one backup, ready.
    fn up(o: &Opts) -> Result<Cluster> {
        let daemons = Daemons::TardiWith {
            exe: o.tardi.clone(),
            orchestrator: vec![],
            instance: vec![],
        };
        let t0 = Instant::now();
        let lab = loop {
            let mut opts = LabOptions::new(MACHINES)
                .orchestrators(ORCHESTRATORS)
                .daemons(daemons.clone());
            opts.lock_wait = o
                .lock_wait
                .saturating_sub(t0.elapsed())
                .max(Duration::from_secs(1));
            match Lab::up(opts) {
                Ok(l) => break l,
                Err(LabError::AlreadyUp) if t0.elapsed() < o.lock_wait => {
                    info!("another lab is up; waiting for it to go");
                    std::thread::sleep(Duration::from_secs(5));
                }
                Err(e) => return Err(e).context("lab up"),
            }
        };
        let c = Cluster {
            lab,
            tardi: o.tardi.clone(),
        };
        let manifest = root().join("gramine-manifests/redis.manifest");
        let out = c.tardi(&[
            "deploy",
            &manifest.display().to_string(),
            "--backups",
            "1",
            "--json",
        ])?;
        if !out.status.success() {
            bail!(
                "deploy failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        c.wait("the steady state", Duration::from_secs(60), steady)?;
        info!(
            "lab up, redis deployed in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        Ok(c)
    }

    fn tardi(&self, args: &[&str]) -> Result<std::process::Output> {
        let mut argv = vec![self.tardi.display().to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        self.lab
            .exec("client", &argv)
            .context("running tardi in the client node")
    }

    /// `tardi status --json` (Null when it failed: e.g. no leader for a moment).
    fn status(&self) -> Value {
        self.tardi(&["status", "--json"])
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or(Value::Null)
    }

    fn wait(&self, what: &str, timeout: Duration, ok: impl Fn(&Value) -> bool) -> Result<Value> {
        let t0 = Instant::now();
        loop {
            let s = self.status();
            if ok(&s) {
                return Ok(s);
            }
            if t0.elapsed() > timeout {
                bail!("timed out after {timeout:?} waiting for {what}; last status: {s}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Copies the daemons' logs to `dir`.
    fn save_logs(&self, dir: &Path) {
        if let Err(e) = self.lab.copy_logs(dir) {
            warn!("copying the daemons' logs to {}: {e}", dir.display());
            return;
        }
        // What the nodes hold: links, and the processes of each node's cgroup.
        let mut nodes = String::new();
        for n in self.lab.layout().nodes() {
            let ns = n.namespace();
            nodes.push_str(&format!(
                "== {} ({ns})\n{}\n",
                n.name,
                sh(&format!("ip -n {ns} -br link; ip -n {ns} -br addr"))
            ));
            for p in self.lab.cgroup_pids(&n.name).unwrap_or_default() {
                let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                let net = std::fs::read_link(format!("/proc/{p}/ns/net"))
                    .map(|l| l.display().to_string())
                    .unwrap_or_default();
                nodes.push_str(&format!("  pid {p} {} {net}\n", comm.trim()));
            }
        }
        let _ = std::fs::write(dir.join("nodes.txt"), nodes);
        info!("logs kept in {}", dir.display());
    }

    /// The redis-server processes of node `m` (its sandboxes).
    fn redis_pids(&self, m: &str) -> Vec<u32> {
        self.lab
            .cgroup_pids(m)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "redis-server")
            })
            .collect()
    }
}

fn service(s: &Value) -> &Value {
    s["services"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == SERVICE))
        .unwrap_or(&Value::Null)
}

/// The service whole (active view, one backup, primary running), every machine alive, a
/// leader that reaches every orchestrator.
fn steady(s: &Value) -> bool {
    let svc = service(s);
    svc["active"] == true
        && svc["backups"].as_array().is_some_and(|b| b.len() == 1)
        && svc["primary_report"]["state"] == "running"
        && s["machines"]
            .as_array()
            .is_some_and(|m| m.len() == MACHINES && m.iter().all(|m| m["alive"] == true))
        && s["cluster"]["from_leader"] == true
        && s["cluster"]["unreachable"]
            .as_array()
            .is_some_and(|u| u.is_empty())
        && s["cluster"]["members"]
            .as_object()
            .is_some_and(|m| m.len() == ORCHESTRATORS)
}

// ---------------------------------------------------------------------------------------------
// A trial
// ---------------------------------------------------------------------------------------------

/// What a trial found.
#[derive(Debug, Default)]
struct Outcome {
    rec: Value,
    /// Whether the lab can be used for the next trial.
    lab_ok: bool,
    /// Whether something is worth keeping the logs for.
    keep_logs: bool,
}

fn trial(
    c: &mut Cluster,
    o: &Opts,
    dir: &Path,
    fault: &str,
    n: usize,
    rng: &mut StdRng,
) -> Outcome {
    let tag = format!("{fault}-{n:03}");
    let st = match c.wait("the steady state", Duration::from_secs(30), steady) {
        Ok(s) => s,
        Err(e) => {
            return Outcome {
                rec: json!({"fault": fault, "trial": n, "started": false, "error": format!("{e:#}")}),
                lab_ok: false,
                keep_logs: true,
            };
        }
    };
    let svc = service(&st).clone();
    let view0 = svc["view"].as_u64().unwrap_or(0);
    let primary = svc["primary"].as_str().unwrap_or_default().to_string();
    let backup = svc["backups"][0].as_str().unwrap_or_default().to_string();
    let leader = st["cluster"]["leader"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let victim = match fault {
        "primary" | "partition" => primary.clone(),
        "backup" => backup.clone(),
        _ => leader.clone(),
    };
    let to = match svc["address"]
        .as_str()
        .and_then(|a| a.parse::<std::net::Ipv4Addr>().ok())
    {
        Some(a) => SocketAddr::from((a, PORT)),
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
    });
    let threads: Vec<_> = (0..o.clients)
        .map(|id| {
            let (ns, sh, seed, prefix) =
                (ns.clone(), sh.clone(), rng.random::<u64>(), prefix.clone());
            std::thread::spawn(move || client(id, ns, to, prefix, seed, sh))
        })
        .collect();

    // The fault, at a random moment.
    let delay_ms = rng.random_range(300..1300u64);
    std::thread::sleep(Duration::from_millis(delay_ms));
    let fault_at = sh.now();
    let fault_unix_ms = now_unix_us() / 1000;
    let injected = match fault {
        "partition" => c.lab.partition(&victim),
        _ => c.lab.kill(&victim),
    };
    let mut notes: Vec<String> = Vec::new();
    if let Err(e) = &injected {
        notes.push(format!("injecting the fault: {e}"));
    }

    // Recovery.
    let recovered_status = c.wait("recovery", o.recovery_timeout, |s| {
        let svc = service(s);
        let whole = svc["active"] == true
            && svc["primary_report"]["state"] == "running"
            && svc["backups"].as_array().is_some_and(|b| b.len() == 1);
        let moved = match fault {
            "primary" | "partition" => {
                svc["view"].as_u64().is_some_and(|v| v > view0)
                    && svc["primary"] != victim.as_str()
                    && svc["backups"][0] != victim.as_str()
            }
            "backup" => {
                svc["view"].as_u64().is_some_and(|v| v > view0)
                    && svc["backups"][0] != victim.as_str()
            }
            _ => {
                s["cluster"]["from_leader"] == true
                    && s["cluster"]["leader"].as_str().is_some_and(|l| l != victim)
            }
        };
        whole && moved
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
    let recovered = injected.is_ok() && recovered_at.is_some();
    if let Err(e) = &recovered_status {
        notes.push(format!("{e:#}"));
    } else if recovered_at.is_none() {
        notes.push("the new view is active but no client succeeded".into());
    }
    let after = recovered_status
        .as_ref()
        .map(service)
        .cloned()
        .unwrap_or_default();

    // The victim back.
    let mut lab_ok = recovered;
    let mut deposed_ok = Value::Null;
    if recovered {
        let back = match fault {
            "partition" => c.lab.heal(&victim),
            _ => c.lab.start(&victim),
        };
        if let Err(e) = back {
            notes.push(format!("bringing {victim} back: {e}"));
            lab_ok = false;
        } else if let Err(e) = c.wait("the steady state again", Duration::from_secs(30), steady) {
            notes.push(format!("{e:#}"));
            lab_ok = false;
        }
        if fault == "partition" {
            // The old primary, healed, must learn it was deposed and stop its sandbox.
            let t0 = Instant::now();
            let mut pids = c.redis_pids(&victim);
            while !pids.is_empty() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(100));
                pids = c.redis_pids(&victim);
            }
            deposed_ok = json!(pids.is_empty());
            if !pids.is_empty() {
                notes.push(format!(
                    "the healed old primary {victim} still runs redis-server {pids:?} 10 s after the heal"
                ));
                lab_ok = false;
            }
        }
    }
    let restored_at = sh.now();
    // The views since the fault, with when each was proposed and active (unix ms).
    let views: Vec<Value> = service(&c.status())["history"]
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
        final_reads(&ns, to, &prefix, &sh, o.clients)
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
        "fault": fault, "trial": n, "started": true, "victim": victim,
        "primary_before": primary, "backup_before": backup, "leader_before": leader,
        "view_before": view0, "view_after": after["view"], "primary_after": after["primary"],
        "backups_after": after["backups"],
        "fault_after_ms": delay_ms, "fault_unix_ms": fault_unix_ms,
        "recovered": recovered,
        "recovered_after_fault_ms": recovered_at.map(|t| (t - fault_at) as f64 / 1e3),
        "restored_after_fault_ms": (restored_at - fault_at) as f64 / 1e3,
        "lab_ok_after": lab_ok, "old_primary_deposed": deposed_ok,
        "gap_ms": gap as f64 / 1e3, "gap_started_after_fault_ms": (gap_from - fault_at) as f64 / 1e3,
        "ops_ok": n_ok, "ops_unknown": n_unknown, "ops_failed": n_fail,
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

/// Shows that the checker can fail, on this machine, before any trial: a history with a stale
/// read and a lost write must be reported as such.
fn self_test_checker(checker: &Path, dir: &Path) -> Result<()> {
    let op = |client, op, key: &str, value: Option<&str>, out: Option<&str>, call, ret| Op {
        client,
        op,
        key: key.into(),
        value: value.map(str::to_string),
        out: out.map(str::to_string),
        call,
        ret,
        status: "ok",
        is_final: false,
        error: None,
    };
    let mut ops = vec![
        op(0, "set", "k0", Some("a"), None, 0, 10),
        op(0, "set", "k0", Some("b"), None, 11, 20),
        op(1, "get", "k0", None, Some("a"), 21, 22),
    ];
    let mut fin = op(2, "get", "k0", None, Some("a"), 30, 31);
    fin.is_final = true;
    ops.push(fin);
    let path = dir.join("checker-self-test.json");
    std::fs::write(
        &path,
        serde_json::to_vec(&json!({"trial": "self-test", "ops": ops}))?,
    )
    .context("writing the checker's self-test")?;
    let r = run_checker(checker, &path, &dir.join("illegal"))?;
    if r["result"] != "Illegal" || r["lost_writes"] != 1 {
        bail!("the checker missed a stale read and a lost write: {r}");
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(dir.join("illegal").join("checker-self-test.html"));
    info!("checker self-test: a stale read and a lost write are detected");
    Ok(())
}

/// Runs the checker on one history; its JSON report.
fn run_checker(checker: &Path, history: &Path, illegal: &Path) -> Result<Value> {
    std::fs::create_dir_all(illegal).context("creating the visualizations' directory")?;
    let out = std::process::Command::new(checker)
        .arg("-timeout")
        .arg("120s")
        .arg("-visualize")
        .arg(illegal)
        .arg(history)
        .output()
        .with_context(|| format!("running {}", checker.display()))?;
    let line = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(line.trim()).with_context(|| {
        format!(
            "the checker's report {line:?} (stderr {})",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(e) = v["error"].as_str() {
        bail!("the checker refused the history: {e}");
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Summary
// ---------------------------------------------------------------------------------------------

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summarize(trials: &[Value], faults: &[String]) -> (Value, String) {
    let mut md = String::from(
        "| fault | trials | recovered | lost writes | linearizability violations | not checked | gap p50 ms | p90 | p99 | max |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
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
        let mut gaps: Vec<f64> = ts
            .iter()
            .filter(|t| t["recovered"] == true)
            .filter_map(|t| t["gap_ms"].as_f64())
            .collect();
        gaps.sort_by(f64::total_cmp);
        let g = |p| pct(&gaps, p);
        md.push_str(&format!(
            "| {f} | {} | {recovered} | {lost} | {violations} | {unchecked} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
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
        "campaign {stamp}: {} trials of {:?}, {} clients, seed {}, commit {commit}; results in {}",
        o.trials,
        o.faults,
        o.clients,
        o.seed,
        dir.display()
    );
    self_test_checker(&o.checker, &dir)?;
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
            "seed": o.seed, "clients": o.clients, "machines": MACHINES,
            "orchestrators": ORCHESTRATORS, "service": SERVICE, "backups": 1,
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
            let out = trial(&mut c, &o, &dir, fault, n, &mut rng);
            if out.keep_logs {
                c.save_logs(&dir.join("logs").join(format!("{fault}-{n:03}")));
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
