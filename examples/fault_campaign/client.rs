//! The clients of a trial: each one connection from the client node, one operation at a time,
//! every call and return recorded ([`crate::history`]). Redis (RESP: SET/GET on registers,
//! INCR/GET on counters) or memcached (text protocol: set/get on registers only — its `incr`
//! fails on a missing key, which the checker's model does not have).

use crate::history::{Op, Shared};
use anyhow::{Result, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Register keys (SET/GET) and counter keys (INCR/GET), per trial (`primary-007:k3`).
pub const REGISTERS: usize = 5;
const COUNTERS: usize = 2;

/// The protected service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Memcached,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "redis" => Some(Kind::Redis),
            "memcached" => Some(Kind::Memcached),
            _ => None,
        }
    }

    /// Its name in the manifest (`[tardi] name`), and its manifest under `gramine-manifests/`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Redis => "redis",
            Kind::Memcached => "memcached",
        }
    }

    pub fn port(self) -> u16 {
        match self {
            Kind::Redis => 6379,
            Kind::Memcached => 11211,
        }
    }

    fn counters(self) -> usize {
        match self {
            Kind::Redis => COUNTERS,
            Kind::Memcached => 0,
        }
    }

    /// Every key a trial's clients use.
    fn keys(self, prefix: &str) -> Vec<String> {
        (0..REGISTERS)
            .map(|i| format!("{prefix}k{i}"))
            .chain((0..self.counters()).map(|i| format!("{prefix}n{i}")))
            .collect()
    }
}

/// An answer, whatever the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Stored,
    Value(Option<String>),
    Int(i64),
    /// The service refused the command without executing it.
    Error(String),
}

struct Conn {
    kind: Kind,
    r: BufReader<TcpStream>,
    w: TcpStream,
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

impl Conn {
    /// Connects from the client node (`ns`, its network namespace).
    fn connect(kind: Kind, ns: &str, to: SocketAddr) -> std::io::Result<Conn> {
        let s = tardi_lab::in_namespace(ns, || {
            TcpStream::connect_timeout(&to, Duration::from_millis(300))
        })
        .map_err(std::io::Error::other)??;
        // An answer slower than this is taken as lost (the outcome is then unknown).
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            kind,
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(line.trim_end().to_string())
    }

    /// `op` ("set", "get", "incr") on `key`.
    fn op(&mut self, op: &str, key: &str, value: Option<&str>) -> std::io::Result<Reply> {
        match self.kind {
            Kind::Redis => self.redis(op, key, value),
            Kind::Memcached => self.memcached(op, key, value),
        }
    }

    fn redis(&mut self, op: &str, key: &str, value: Option<&str>) -> std::io::Result<Reply> {
        let mut args = vec![op.to_uppercase(), key.to_string()];
        args.extend(value.map(str::to_string));
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in &args {
            buf.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.w.write_all(&buf)?;
        let body = self.line()?;
        let Some(kind) = body.chars().next() else {
            return Err(bad("an empty reply line".into()));
        };
        let rest = &body[kind.len_utf8()..];
        let int = |s: &str| {
            s.parse::<i64>()
                .map_err(|e| bad(format!("reply {body:?}: {e}")))
        };
        Ok(match kind {
            '+' if rest == "OK" => Reply::Stored,
            '-' => Reply::Error(rest.into()),
            ':' => Reply::Int(int(rest)?),
            '$' => {
                let n = int(rest)?;
                if n < 0 {
                    Reply::Value(None)
                } else {
                    let n = usize::try_from(n).map_err(|e| bad(e.to_string()))?;
                    if n > 1 << 20 {
                        return Err(bad(format!("a bulk reply of {n} bytes")));
                    }
                    let mut v = vec![0u8; n + 2];
                    self.r.read_exact(&mut v)?;
                    v.truncate(n);
                    Reply::Value(Some(String::from_utf8_lossy(&v).into_owned()))
                }
            }
            _ => return Err(bad(format!("unexpected reply {body:?}"))),
        })
    }

    fn memcached(&mut self, op: &str, key: &str, value: Option<&str>) -> std::io::Result<Reply> {
        match (op, value) {
            ("set", Some(v)) => {
                self.w
                    .write_all(format!("set {key} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes())?;
                let l = self.line()?;
                Ok(match l.as_str() {
                    "STORED" => Reply::Stored,
                    e if e.starts_with("SERVER_ERROR") || e.starts_with("CLIENT_ERROR") => {
                        Reply::Error(e.into())
                    }
                    e => return Err(bad(format!("set answered {e:?}"))),
                })
            }
            ("get", None) => {
                self.w.write_all(format!("get {key}\r\n").as_bytes())?;
                let l = self.line()?;
                if l == "END" {
                    return Ok(Reply::Value(None));
                }
                let n: usize = l
                    .strip_prefix(&format!("VALUE {key} "))
                    .and_then(|r| r.split(' ').nth(1))
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n <= 1 << 20)
                    .ok_or_else(|| bad(format!("get answered {l:?}")))?;
                let mut v = vec![0u8; n + 2];
                self.r.read_exact(&mut v)?;
                v.truncate(n);
                let end = self.line()?;
                if end != "END" {
                    return Err(bad(format!("get ended with {end:?}")));
                }
                Ok(Reply::Value(Some(String::from_utf8_lossy(&v).into_owned())))
            }
            _ => Err(bad(format!("no {op} for memcached"))),
        }
    }
}

/// Runs one client until `stop`: one operation at a time, reconnecting when the connection
/// breaks (counted in [`Shared::reconnected`], once per client).
pub fn client(
    kind: Kind,
    id: usize,
    ns: String,
    to: SocketAddr,
    prefix: String,
    seed: u64,
    sh: Arc<Shared>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut conn: Option<Conn> = None;
    let mut ops = Vec::new();
    let mut seq = 0u64;
    let counters = kind.counters();
    let mut connects = 0u32;
    while !sh.stop.load(Ordering::Relaxed) {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::connect(kind, &ns, to) {
                Ok(c) => {
                    connects += 1;
                    if connects == 2 {
                        sh.reconnected.fetch_add(1, Ordering::Relaxed);
                    }
                    conn.insert(c)
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        seq += 1;
        let r = if counters == 0 {
            rng.random_range(0..7u32)
        } else {
            rng.random_range(0..10u32)
        };
        let register = format!("{prefix}k{}", rng.random_range(0..REGISTERS));
        let counter = format!("{prefix}n{}", rng.random_range(0..counters.max(1)));
        let (op, key, value) = match r {
            0..4 => ("set", register, Some(format!("c{id}-{seq}"))),
            4..7 => ("get", register, None),
            7..9 => ("incr", counter, None),
            _ => ("get", counter, None),
        };
        let call = sh.now();
        let reply = c.op(op, &key, value.as_deref());
        let ret = sh.now();
        let (status, out, error) = match (op, reply) {
            ("set", Ok(Reply::Stored)) => ("ok", None, None),
            ("get", Ok(Reply::Value(v))) => ("ok", v, None),
            ("incr", Ok(Reply::Int(n))) => ("ok", Some(n.to_string()), None),
            // An error answer: the command was not executed.
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
pub fn final_reads(
    kind: Kind,
    ns: &str,
    to: SocketAddr,
    prefix: &str,
    sh: &Shared,
    id: usize,
) -> Result<Vec<Op>> {
    let keys = kind.keys(prefix);
    let t0 = Instant::now();
    let mut last_err = String::new();
    while t0.elapsed() < Duration::from_secs(15) {
        let mut conn = match Conn::connect(kind, ns, to) {
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
            match conn.op("get", k, None) {
                Ok(Reply::Value(v)) => ops.push(Op {
                    client: id,
                    op: "get",
                    key: k.clone(),
                    value: None,
                    out: v,
                    call,
                    ret: sh.now(),
                    status: "ok",
                    is_final: true,
                    error: None,
                }),
                other => {
                    last_err = format!("get {k}: {other:?}");
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
