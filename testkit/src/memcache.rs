//! A minimal memcached (text protocol) client for tests: `set` and `get`, and the writer and
//! checker of the failover tests, as `resp.rs` has them for Redis.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Conn {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    /// Connects, retrying until `timeout` (the service may still be starting).
    pub fn connect_retry(addr: SocketAddr, timeout: Duration) -> Conn {
        let t = Instant::now();
        loop {
            match Conn::connect(addr, Duration::from_millis(500)) {
                Ok(c) => return c,
                Err(e) if t.elapsed() > timeout => panic!("connecting to {addr}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(l)
    }

    /// `set KEY 0 0 LEN` with `value`: whether memcached answered STORED.
    pub fn set(&mut self, key: &str, value: &[u8]) -> std::io::Result<bool> {
        let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.w.write_all(&req)?;
        Ok(self.line()? == "STORED\r\n")
    }

    /// `get KEY`: the value, or `None` when memcached has none.
    pub fn get(&mut self, key: &str) -> std::io::Result<Option<Vec<u8>>> {
        write!(self.w, "get {key}\r\n")?;
        let l = self.line()?;
        if l == "END\r\n" {
            return Ok(None);
        }
        // VALUE <key> <flags> <bytes>
        let len: usize = l
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("unexpected reply {l:?}")))?;
        let mut v = vec![0u8; len + 2];
        self.r.read_exact(&mut v)?;
        v.truncate(len);
        let end = self.line()?;
        if end != "END\r\n" {
            return Err(std::io::Error::other(format!("unexpected end {end:?}")));
        }
        Ok(Some(v))
    }
}

/// Sets `key:i = value-i` for i in `from..from + n`, one at a time, reconnecting whenever the
/// connection breaks (a failover resets it) and writing the unacknowledged one again. Returns
/// the indices memcached acknowledged (STORED), within 30 s.
pub fn write_through_failovers(to: SocketAddr, from: u64, n: u64) -> Vec<u64> {
    let mut acked = Vec::new();
    let mut conn: Option<Conn> = None;
    let mut i = from;
    let deadline = Instant::now() + Duration::from_secs(30);
    while i < from + n && Instant::now() < deadline {
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
        match cn.set(&format!("key:{i}"), format!("value-{i}").as_bytes()) {
            Ok(true) => {
                acked.push(i);
                i += 1;
            }
            _ => conn = None,
        }
    }
    acked
}

/// How many of the indices `acked` no longer read back as `key:i = value-i`.
pub fn missing_writes(to: SocketAddr, acked: impl IntoIterator<Item = u64>) -> usize {
    let mut cn = Conn::connect_retry(to, Duration::from_secs(10));
    acked
        .into_iter()
        .filter(|i| {
            cn.get(&format!("key:{i}")).ok().flatten() != Some(format!("value-{i}").into_bytes())
        })
        .count()
}
