//! The benchmark's lab: `tardi_testkit::cluster::Cluster` (every method there is reachable
//! here), with the instances' epoch log, the client node's UDP socket and the unreplicated
//! baseline (`tardi run` in m1).

use crate::Env;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::net::UdpSocket;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tardi_testkit::cluster::service_in;

/// A lab with the real daemons, every machine registered.
pub struct Cluster {
    kit: tardi_testkit::cluster::Cluster,
    epoch_log: PathBuf,
}

impl Deref for Cluster {
    type Target = tardi_testkit::cluster::Cluster;
    fn deref(&self) -> &Self::Target {
        &self.kit
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.kit
    }
}

impl Cluster {
    /// `machines` machines, the instances with `--epoch-log` (a fresh file) and `extra`.
    pub fn up(env: &Env, machines: usize, extra: &[&str], case: &str) -> Cluster {
        let epoch_log = env.tmp.join(format!("epochs-{case}.jsonl"));
        let _ = std::fs::remove_file(&epoch_log);
        let mut instance = vec!["--epoch-log".to_string(), epoch_log.display().to_string()];
        instance.extend(extra.iter().map(|s| s.to_string()));
        let t0 = Instant::now();
        let kit = tardi_testkit::cluster::Cluster::builder(&env.o.tardi)
            .machines(machines)
            .instance_args(&instance)
            .queue(env.o.lock_wait)
            .register_wait(Some(Duration::from_secs(30)))
            .try_up()
            .unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!(
            "[bench] {case}: lab up ({machines} machines) in {:.1} s (waited for the lab included)",
            t0.elapsed().as_secs_f64()
        );
        Cluster { kit, epoch_log }
    }

    /// Waits until `name` has an active view with `backups` backups, its primary running and
    /// every backup required (decided advancing); returns the service's status.
    pub fn wait_ready(
        &self,
        name: &str,
        backups: usize,
        timeout: Duration,
    ) -> Result<Value, String> {
        let s = self
            .try_wait(
                &format!("{name} active with {backups} backup(s)"),
                timeout,
                |st| {
                    let x = service_in(st, name);
                    x["active"] == true
                        && x["backups"].as_array().is_some_and(|b| b.len() == backups)
                        && x["primary_report"]["state"] == "running"
                },
            )
            .map_err(|e| format!("{e:#}"))?;
        Ok(service_in(&s, name).clone())
    }

    /// The epoch log's lines of `service` written in [from_us, to_us] (unix µs).
    pub fn epochs(&self, service: &str, from_us: u64, to_us: u64) -> Vec<Value> {
        // The primary flushes at most every 100 ms.
        std::thread::sleep(Duration::from_millis(250));
        let text = std::fs::read_to_string(&self.epoch_log).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| {
                v["service"] == service
                    && v["unix_us"]
                        .as_u64()
                        .is_some_and(|t| t >= from_us && t <= to_us)
            })
            .collect()
    }

    /// A UDP socket of the client node.
    pub fn client_udp(&self) -> UdpSocket {
        self.lab
            .in_node("client", || UdpSocket::bind("0.0.0.0:0"))
            .expect("entering the client node")
            .expect("binding a UDP socket in the client node")
    }

    /// Starts `tardi run MANIFEST --json` in machine m1 (unreplicated baseline).
    pub fn run_unreplicated(&self, manifest: &Path) -> Unreplicated {
        let mut cmd = self.lab.command("m1", self.exe()).expect("command in m1");
        cmd.args(["run", &manifest.display().to_string(), "--json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("starting tardi run in m1");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the service never blocks on its stdout.
            let mut sink = Vec::new();
            let _ = r.read_to_end(&mut sink);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("tardi run printed nothing in 30 s");
        let v: Value = serde_json::from_str(line.trim())
            .unwrap_or_else(|e| panic!("tardi run's first line {line:?}: {e}"));
        let address = v["address"]
            .as_str()
            .expect("address in tardi run's started event")
            .to_string();
        Unreplicated {
            child,
            address,
            host_if: v["host_if"].as_str().map(str::to_string),
            pid: v["pid"].as_i64().map(|p| p as i32),
        }
    }
}

/// The unreplicated service (`tardi run` in m1); stopped with SIGTERM when dropped.
pub struct Unreplicated {
    child: Child,
    pub address: String,
    /// The host side of its link in m1, and its main process's host PID.
    pub host_if: Option<String>,
    pub pid: Option<i32>,
}

impl Drop for Unreplicated {
    fn drop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
