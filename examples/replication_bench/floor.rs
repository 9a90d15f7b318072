//! `floor`: what holding a service's output until another machine acknowledges it costs on
//! this machine when *nothing is captured*: the bound that any checkpoint-replication design
//! meets here, Tardi's or another's.
//!
//! The same Redis (`tardi run` in m1, unreplicated) runs under `redis-benchmark -c 50`,
//! unpipelined and with `-P 16`, in these cases:
//! - *unreplicated*: nothing in its way, at the start and again at the end (the ratios are
//!   against the mean of the two);
//! - *queue alone*: its output goes through the output gate (the `tardi-netfilter` crate,
//!   NFQUEUE) and the gate's reader releases each batch it reads at once: no epochs at all;
//! - *gate*: the gate with an epoch loop that releases each epoch as soon as it is marked;
//! - *gate + ack*: each epoch's release waits until a peer in m2 has echoed the epoch's number
//!   over TCP (a round trip of the checkpoint stream carrying an empty checkpoint);
//! - *gate + stop + ack*: the same, with every epoch boundary marked while Redis is stopped
//!   (every thread seized and interrupted, then detached: the checkpointer's own
//!   `ptrace::Stopped`), as any consistent checkpoint of a running process needs;
//!
//! the two "ack" cases with epochs that end at the first waiting output (`min 0`), at the first
//! after 0.5 ms or 1 ms, and by Tardi's rule (once the clients of the last release have
//! answered, after 0.1 ms, else after 1.75 ms); then Tardi itself, deployed with one backup in
//! m2, in the same lab.
//!
//! Nothing here is a usable replication (no state reaches the peer): it measures the floor.
//! The loop is bounded by the benchmark it runs beside; traffic stays in the lab.

use super::*;
use std::collections::VecDeque;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use tardi_checkpointer::epoch::Trigger;
use tardi_checkpointer::procfs::Proc;
use tardi_checkpointer::ptrace::Stopped;
use tardi_netfilter::{Gate, GateConfig, Mode};

/// NFQUEUE numbers of the floor's gate in m1 (the instances number theirs from twice the link
/// index, far below this).
const QUEUE: u16 = 60_000;

/// How the floor's epochs go.
#[derive(Clone, Copy, Debug)]
struct Schedule {
    /// The gate's reader marks and releases each batch of packets itself as it reads them,
    /// with no other thread woken and no epochs (the other fields are then unused).
    inline: bool,
    /// Every epoch boundary is marked with the service stopped.
    stop: bool,
    /// Each release waits for the peer's echo (else: released at the mark).
    ack: bool,
    /// Waiting output ends the epoch this long after the last boundary...
    min: Duration,
    /// ... or this long once the clients of the last release have answered.
    follow: Option<Duration>,
}

impl Schedule {
    fn name(&self) -> String {
        if self.inline {
            return "queue alone (the reader releases what it reads)".into();
        }
        let what = match (self.stop, self.ack) {
            (false, false) => "gate",
            (false, true) => "gate + ack",
            (true, true) => "gate + stop + ack",
            (true, false) => "gate + stop",
        };
        match self.follow {
            Some(f) => format!(
                "{what}, Tardi's rule ({} / {} ms)",
                self.min.as_secs_f64() * 1e3,
                f.as_secs_f64() * 1e3
            ),
            None => format!("{what}, min {} ms", self.min.as_secs_f64() * 1e3),
        }
    }
}

/// What one floor run measured, µs.
#[derive(Default)]
struct LoopStats {
    epochs: u64,
    /// From the decision to end the epoch to the resume (stop, mark, detach).
    boundary_us: Vec<f64>,
    /// From sending the epoch's number to reading its echo.
    rtt_us: Vec<f64>,
    error: Option<String>,
}

/// The peer in m2: echoes every 8-byte epoch number on each connection until it closes.
fn start_peer(c: &Cluster) -> SocketAddr {
    let listener = c
        .lab
        .in_node("m2", || TcpListener::bind("0.0.0.0:0"))
        .expect("node m2")
        .expect("listening in m2");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { break };
            std::thread::spawn(move || {
                let _ = conn.set_nodelay(true);
                let mut b = [0u8; 8];
                while conn.read_exact(&mut b).is_ok() {
                    if conn.write_all(&b).is_err() {
                        break;
                    }
                }
            });
        }
    });
    SocketAddr::new(c.lab.address("m2").expect("m2's address").into(), port)
}

/// Runs `during` while Redis's output goes through a gate on `host_if` (in m1) with epochs as
/// `sched` says; returns its result and the loop's figures.
fn held<T>(
    c: &Cluster,
    host_if: &str,
    pid: i32,
    peer: SocketAddr,
    sched: Schedule,
    during: impl FnOnce() -> T,
) -> (T, LoopStats) {
    let gate = c
        .lab
        .in_node("m1", || Gate::new(GateConfig::new(host_if, QUEUE)))
        .expect("node m1")
        .expect("the floor's gate");
    let gate = Arc::new(gate);
    // The epoch loop's own trigger, fed by the gate as the primary feeds it.
    let trigger = Trigger::default();
    let done = Arc::new(AtomicBool::new(false));
    let inline_epochs = Arc::new(AtomicU64::new(0));
    if sched.inline {
        let (me, n) = (Arc::downgrade(&gate), inline_epochs.clone());
        gate.on_each_output(Box::new(move |_| {
            if let Some(g) = me.upgrade() {
                let e = n.fetch_add(1, Ordering::SeqCst) + 1;
                g.mark(e);
                let _ = g.release(e);
            }
        }));
    } else {
        let t = trigger.clone();
        gate.on_each_output(Box::new(move |n| t.output(n)));
        let t = trigger.clone();
        gate.on_release(Box::new(move |e, n| t.released(e, n)));
    }
    let sent: Arc<Mutex<VecDeque<(u64, Instant)>>> = Arc::default();
    let rtts: Arc<Mutex<Vec<f64>>> = Arc::default();
    let conn = sched.ack.then(|| {
        let s = c
            .lab
            .in_node("m1", || TcpStream::connect(peer))
            .expect("node m1")
            .expect("connecting to the peer in m2");
        s.set_nodelay(true).expect("nodelay");
        s
    });
    let acks = conn.as_ref().map(|s| {
        let mut r = s.try_clone().expect("clone");
        let (gate, sent, rtts) = (gate.clone(), sent.clone(), rtts.clone());
        std::thread::spawn(move || {
            let mut b = [0u8; 8];
            while r.read_exact(&mut b).is_ok() {
                let e = u64::from_le_bytes(b);
                let t = sent
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|(x, _)| *x == e)
                    .map(|(_, t)| t.elapsed());
                if let Some(t) = t {
                    rtts.lock().unwrap().push(t.as_secs_f64() * 1e6);
                }
                if gate.release(e).is_err() {
                    break;
                }
            }
        })
    });
    let epochs = (!sched.inline).then(|| {
        let (gate, trigger, done, sent) =
            (gate.clone(), trigger.clone(), done.clone(), sent.clone());
        let mut conn = conn.as_ref().map(|s| s.try_clone().expect("clone"));
        std::thread::spawn(move || {
            let mut stats = LoopStats::default();
            let (t, d) = (&trigger, &*done);
            if let Err(e) = epoch_loop(&gate, t, d, sched, pid, conn.as_mut(), &sent, &mut stats) {
                stats.error = Some(e);
            }
            stats
        })
    });
    let out = during();
    done.store(true, Ordering::SeqCst);
    let mut stats = match epochs {
        Some(t) => t.join().expect("the floor's epoch loop"),
        None => LoopStats {
            epochs: inline_epochs.load(Ordering::SeqCst),
            ..LoopStats::default()
        },
    };
    if let Some(s) = &conn {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    if let Some(a) = acks {
        let _ = a.join();
    }
    stats.rtt_us = std::mem::take(&mut *rtts.lock().unwrap());
    // Whatever is still held goes out; then the rules go.
    let _ = gate.set_mode(Mode::Pass);
    // (An inline reader may hold the gate for a moment: let it finish.)
    std::thread::sleep(Duration::from_millis(50));
    match Arc::try_unwrap(gate) {
        Ok(g) => {
            if let Err(e) = g.close() {
                eprintln!("[bench] floor: closing the gate: {e}");
            }
        }
        Err(_) => eprintln!("[bench] floor: the gate is still shared; its rules go with the lab"),
    }
    (out, stats)
}

/// The floor's epochs: wait for output as `sched` says, mark the boundary (with the service
/// stopped if asked), send the epoch's number to the peer (or release it at once).
#[allow(clippy::too_many_arguments)]
fn epoch_loop(
    gate: &Gate,
    trigger: &Trigger,
    done: &AtomicBool,
    sched: Schedule,
    pid: i32,
    mut conn: Option<&mut TcpStream>,
    sent: &Mutex<VecDeque<(u64, Instant)>>,
    stats: &mut LoopStats,
) -> Result<(), String> {
    let proc = Proc::open(pid).map_err(|e| format!("/proc/{pid}: {e}"))?;
    let mut epoch = 0u64;
    let mut boundary = Instant::now();
    loop {
        // (Waits are bounded so that `done` is seen within 50 ms.)
        loop {
            if done.load(Ordering::SeqCst) {
                return Ok(());
            }
            let wait = if trigger.is_set() {
                let after = match sched.follow {
                    Some(f) if trigger.answered(epoch) => f.min(sched.min),
                    _ => sched.min,
                };
                let due = boundary + after;
                let now = Instant::now();
                if now >= due {
                    break;
                }
                (due - now).min(Duration::from_millis(50))
            } else {
                Duration::from_millis(50)
            };
            trigger.wait_news(wait);
        }
        epoch += 1;
        let t0 = Instant::now();
        let stopped = if sched.stop {
            Some(Stopped::stop(&proc).map_err(|e| format!("stopping redis: {e}"))?)
        } else {
            None
        };
        trigger.clear();
        gate.mark(epoch);
        if let Some(s) = stopped {
            s.resume().map_err(|e| format!("resuming redis: {e}"))?;
        }
        boundary = Instant::now();
        stats.epochs += 1;
        stats
            .boundary_us
            .push(boundary.duration_since(t0).as_secs_f64() * 1e6);
        match conn.as_mut() {
            Some(c) => {
                {
                    let mut s = sent.lock().unwrap();
                    s.push_back((epoch, Instant::now()));
                    if s.len() > 64 {
                        s.pop_front();
                    }
                }
                c.write_all(&epoch.to_le_bytes())
                    .map_err(|e| format!("sending to the peer: {e}"))?;
            }
            None => gate.release(epoch).map_err(|e| format!("releasing: {e}"))?,
        }
    }
}

fn summary_us(v: &[f64]) -> Value {
    let s = sorted(v.to_vec());
    json!({"n": s.len(), "p50": pct(&s, 0.5).round(), "p99": pct(&s, 0.99).round()})
}

/// The `floor` part.
pub(crate) fn bench_floor(env: &Env) -> Value {
    let before = conditions();
    eprintln!("[bench] floor: machine before: {before}");
    let c = Cluster::up(env, 2, &[], "floor");
    let manifest = env.redis_manifest();
    let cases = [(1u32, env.o.redis_n), (16, env.o.redis_np)];
    let tardi_rule = (
        Duration::from_micros(1750),
        Some(Duration::from_micros(100)),
    );
    let mut schedules = vec![Schedule {
        inline: true,
        stop: false,
        ack: false,
        min: Duration::ZERO,
        follow: None,
    }];
    schedules.push(Schedule {
        inline: false,
        stop: false,
        ack: false,
        min: Duration::ZERO,
        follow: None,
    });
    let ms = |m: f64| Duration::from_secs_f64(m / 1e3);
    for stop in [false, true] {
        for (min, follow) in [
            (Duration::ZERO, None),
            (ms(0.5), None),
            (ms(1.0), None),
            tardi_rule,
        ] {
            schedules.push(Schedule {
                inline: false,
                stop,
                ack: true,
                min,
                follow,
            });
        }
    }
    let peer = start_peer(&c);
    let mut rows: Vec<Value> = Vec::new();
    let mut cmds = Vec::new();
    {
        let u = c.run_unreplicated(&manifest);
        wait_tcp(&c, &u.address, 6379);
        let host_if = u
            .host_if
            .clone()
            .expect("tardi run names the host interface");
        let pid = u.pid.expect("tardi run names the service's pid");
        for (p, n) in cases {
            let (r, cmd) = redis_benchmark(&c, &u.address, p, n);
            cmds.push(cmd);
            rows.push(json!({"case": "unreplicated", "pipeline": p, "results": r}));
        }
        for s in &schedules {
            for (p, n) in cases {
                let t0 = Instant::now();
                let ((r, _), st) = held(&c, &host_if, pid, peer, *s, || {
                    redis_benchmark(&c, &u.address, p, n)
                });
                let secs = t0.elapsed().as_secs_f64();
                if let Some(e) = &st.error {
                    eprintln!("[bench] floor: {}: {e}", s.name());
                }
                rows.push(json!({
                    "case": s.name(), "pipeline": p, "results": r,
                    "epochs_per_s": (st.epochs as f64 / secs).round(),
                    "boundary_us": summary_us(&st.boundary_us),
                    "rtt_us": summary_us(&st.rtt_us),
                    "error": st.error,
                }));
            }
        }
        // Again at the end: how far the machine drifted meanwhile.
        for (p, n) in cases {
            let (r, _) = redis_benchmark(&c, &u.address, p, n);
            rows.push(json!({"case": "unreplicated, again", "pipeline": p, "results": r}));
        }
    }
    let a = deploy_redis(&c, &manifest);
    for (p, n) in cases {
        let from = now_unix_us();
        let (r, _) = redis_benchmark(&c, &a, p, n);
        let to = now_unix_us();
        let e = epoch_summary(&c.epochs("redis", from, to), (to - from) as f64 / 1e6);
        rows.push(json!({
            "case": "Tardi, one backup", "pipeline": p, "results": r,
            "epochs_per_s": e["epochs_per_s"], "pause_ms": e["pause_ms"],
        }));
    }
    drop(c);
    println!(
        "\n### The floor: Redis with its output held and nothing captured (50 clients; `-n {}` unpipelined, `-n {}` with `-P 16`)\n",
        env.o.redis_n, env.o.redis_np
    );
    println!(
        "| case | pipeline | SET/s | % of unreplicated | GET/s | % | epochs/s | boundary p50 / p99 µs | round trip p50 / p99 µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|---|");
    // The unreplicated rate: the mean of its two runs (before and after the floor's cases).
    let base = |p: u32, t: &str| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| {
                r["case"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("unreplicated"))
                    && r["pipeline"] == p
            })
            .map(|r| f(&r["results"][t], "rps"))
            .collect();
        mean(&v)
    };
    for r in &rows {
        let p = r["pipeline"].as_u64().unwrap_or(0) as u32;
        let cell = |v: &Value| {
            if v["n"].as_u64().unwrap_or(0) == 0 {
                "-".to_string()
            } else {
                format!("{} / {}", v["p50"], v["p99"])
            }
        };
        let (set, get) = (
            f(&r["results"]["SET"], "rps"),
            f(&r["results"]["GET"], "rps"),
        );
        println!(
            "| {} | {p} | {set:.0} | {:.1} | {get:.0} | {:.1} | {} | {} | {} |",
            r["case"].as_str().unwrap_or("?"),
            100.0 * set / base(p, "SET"),
            100.0 * get / base(p, "GET"),
            r["epochs_per_s"]
                .as_f64()
                .map_or("-".into(), |v| format!("{v:.0}")),
            cell(&r["boundary_us"]),
            cell(&r["rtt_us"]),
        );
    }
    println!("\nCommands (in the client node): {}", cmds.join("; "));
    let mut v = env.header("floor");
    v["before"] = before;
    v["rows"] = json!(rows);
    v["commands"] = json!(cmds);
    v
}
