//! A trial's history: every operation with its call and return times (µs since the trial
//! began) and its outcome, as `bench/linearizability` (Porcupine) reads it; the longest gap the
//! clients saw; and running the checker (after showing, once, that it can fail).

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;
use tracing::info;

/// One operation, as `bench/linearizability` reads it.
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    pub client: usize,
    pub op: &'static str,
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub out: Option<String>,
    /// µs since the trial's start.
    pub call: i64,
    pub ret: i64,
    /// "ok", "unknown" (the connection broke before the answer) or "fail" (an error reply).
    pub status: &'static str,
    #[serde(rename = "final", skip_serializing_if = "std::ops::Not::not")]
    pub is_final: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the clients share with the trial.
pub struct Shared {
    pub base: Instant,
    pub stop: AtomicBool,
    /// µs since `base` of the latest successful operation.
    pub last_ok: AtomicU64,
    pub ops: Mutex<Vec<Op>>,
    /// Clients that had to open a second connection (theirs broke): since connections carry
    /// through a failover, a client keeps its one connection through every fault that leaves
    /// a backup.
    pub reconnected: AtomicU64,
}

impl Shared {
    pub fn now(&self) -> i64 {
        self.base.elapsed().as_micros() as i64
    }
}

/// The longest time without a successful completion, over `[from, to]` µs; and where it
/// started (µs).
pub fn longest_gap(ops: &[Op], from: i64, to: i64) -> (i64, i64) {
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

/// Shows that the checker can fail, on this machine, before any trial: a history with a stale
/// read and a lost write must be reported as such.
pub fn self_test_checker(checker: &Path, dir: &Path) -> Result<()> {
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
pub fn run_checker(checker: &Path, history: &Path, illegal: &Path) -> Result<Value> {
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
