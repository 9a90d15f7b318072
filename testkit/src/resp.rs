//! A minimal Redis (RESP2) client for tests: pipelined commands, simple replies.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
}

pub struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Conn {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(Conn {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    /// Connects, retrying until `timeout` (the service may still be starting).
    pub fn connect_retry(addr: SocketAddr, timeout: Duration) -> Conn {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let err = match Conn::connect(addr, Duration::from_millis(500)) {
                Ok(mut c) => match c.cmd(&["PING"]) {
                    Ok(_) => return c,
                    Err(e) => e,
                },
                Err(e) => e,
            };
            if std::time::Instant::now() > deadline {
                panic!("{addr} does not answer PING: {err}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn encode(buf: &mut Vec<u8>, args: &[&str]) {
        buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            buf.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
    }

    pub fn cmd(&mut self, args: &[&str]) -> std::io::Result<Reply> {
        Ok(self
            .pipeline(&[args.iter().map(|s| s.to_string()).collect()])?
            .remove(0))
    }

    pub fn pipeline(&mut self, cmds: &[Vec<String>]) -> std::io::Result<Vec<Reply>> {
        let mut buf = Vec::new();
        for c in cmds {
            let refs: Vec<&str> = c.iter().map(String::as_str).collect();
            Conn::encode(&mut buf, &refs);
        }
        self.w.write_all(&buf)?;
        (0..cmds.len()).map(|_| self.read()).collect()
    }

    fn read(&mut self) -> std::io::Result<Reply> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let body = line.trim_end().to_string();
        let (kind, rest) = body.split_at(1);
        Ok(match kind {
            "+" => Reply::Status(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(rest.parse().unwrap()),
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut v = vec![0u8; n as usize + 2];
                    std::io::Read::read_exact(&mut self.r, &mut v)?;
                    v.truncate(n as usize);
                    Reply::Bulk(Some(v))
                }
            }
            _ => return Err(std::io::Error::other(format!("unexpected reply {body:?}"))),
        })
    }
}

/// SETs `key:i = value-i` for `i` in `from..from + n`, reconnecting (and writing the same key
/// again) when a failover resets the connection, for at most 30 s; the indices whose SET was
/// acknowledged.
pub fn write_through_failovers(to: SocketAddr, from: u64, n: u64) -> Vec<u64> {
    let mut acked = Vec::new();
    let mut conn: Option<Conn> = None;
    let mut i = from;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while i < from + n && std::time::Instant::now() < deadline {
        let cn = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::connect(to, Duration::from_millis(300)) {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            },
        };
        let (k, v) = (format!("key:{i}"), format!("value-{i}"));
        match cn.cmd(&["SET", &k, &v]) {
            Ok(Reply::Status(s)) if s == "OK" => {
                acked.push(i);
                i += 1;
            }
            _ => conn = None, // reset by the failover: reconnect, write it again
        }
    }
    acked
}

/// How many of the indices `acked` (written by [`write_through_failovers`]) no longer read back
/// as `key:i = value-i`.
pub fn missing_writes(to: SocketAddr, acked: impl IntoIterator<Item = u64>) -> usize {
    let mut cn = Conn::connect_retry(to, Duration::from_secs(10));
    acked
        .into_iter()
        .filter(|i| {
            cn.cmd(&["GET", &format!("key:{i}")]).ok()
                != Some(Reply::Bulk(Some(format!("value-{i}").into_bytes())))
        })
        .count()
}
