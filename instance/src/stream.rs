//! The checkpoint stream: how a primary sends checkpoints to a backup and reads its
//! acknowledgements. A dedicated TCP connection per (primary run, backup) to the address the
//! backup's instance listens on (`tardi instance --listen`, the address it registers with the
//! orchestrator), driven by plain threads with blocking sockets.
//!
//! Why not the gRPC stream the instances first used: measured on the lab, an acknowledgement
//! sent back on the HTTP/2 response stream intermittently sat in one of the two processes until
//! the *next* checkpoint went the other way, so every reply waited one extra epoch interval
//! (UDP ping +12 ms instead of +1.5 ms), and messages of 64 KiB and more saw ~40 ms p99 stalls
//! (`docs/BENCHMARKS.md`, "Transport round trip"). The round trip of one epoch is on the
//! critical path of every reply the service sends, so it gets the simplest transport that has
//! no scheduler between the socket and the decision.
//!
//! Wire format (all integers little-endian):
//! - the primary opens with `HELLO` (8 bytes) and the version (u32); the backup answers the same;
//! - each checkpoint: header length (u32), the header (a protobuf [`pb::CheckpointMsg`] whose
//!   `data` is empty), data length (u64), the data (one checkpoint in the checkpoint format);
//! - each acknowledgement, in the order of the checkpoints: length (u32), a protobuf [`pb::Ack`]
//!   (a non-empty `error` is a refusal; the backup then closes the connection).
//!
//! With a TLS identity (`--tls-dir`) all of this runs inside TLS 1.3 (rustls, the node
//! certificates of `tardi certs`): the backup accepts only a primary whose client certificate
//! the cluster's CA signed, and the primary only a backup whose certificate names the address
//! it dialled. The stream carries the service's whole memory and the backup applies it, so an
//! unauthenticated peer must not get past the handshake. The sockets keep `TCP_NODELAY`; each
//! write of the framing becomes TLS records sent at once (`docs/BENCHMARKS.md`, "Transport
//! round trip": the cost per round trip).
//!
//! Owns: framing, the hello and the TLS session. Must not touch: what a checkpoint means (the
//! backup checks it).

use prost::Message;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tardi_proto as pb;

/// First bytes of either side's hello.
pub const HELLO: &[u8; 8] = b"TARDISTR";
/// Version of this wire format.
pub const VERSION: u32 = 1;
/// A header or an acknowledgement longer than this is refused (they hold names and numbers).
pub const MAX_HEADER: u32 = 64 * 1024;
/// A checkpoint longer than this is refused before anything is allocated for it.
pub const MAX_DATA: u64 = 1 << 38;

/// Errors of the checkpoint stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{0} is not an address with a port")]
    BadAddress(String),
    #[error("connecting to the checkpoint stream at {addr}: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("the peer does not speak the checkpoint stream (hello was {0:?})")]
    NotAStream(Vec<u8>),
    #[error("the peer speaks version {0} of the checkpoint stream, this is version {VERSION}")]
    Version(u32),
    #[error("{what} of {len} bytes is over the limit of {max}")]
    TooLong {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("undecodable {what}: {source}")]
    Decode {
        what: &'static str,
        source: prost::DecodeError,
    },
    #[error("TLS handshake of the checkpoint stream: {0}")]
    Handshake(io::Error),
    #[error("TLS session of the checkpoint stream: {0}")]
    Tls(#[from] rustls::Error),
    #[error(transparent)]
    Io(#[from] io::Error),
}

type Result<T> = std::result::Result<T, StreamError>;

/// The socket address of an instance that registered `api` (`host:port`).
pub fn stream_addr(api: &str) -> Result<SocketAddr> {
    let bad = || StreamError::BadAddress(api.to_string());
    api.to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)
}

/// Writes this side's hello.
pub fn write_hello(w: &mut impl Write) -> io::Result<()> {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(HELLO);
    b[8..].copy_from_slice(&VERSION.to_le_bytes());
    w.write_all(&b)
}

/// Reads and checks the peer's hello.
pub fn read_hello(r: &mut impl Read) -> Result<()> {
    let mut b = [0u8; 12];
    r.read_exact(&mut b)?;
    if &b[..8] != HELLO {
        return Err(StreamError::NotAStream(b[..8].to_vec()));
    }
    let v = u32::from_le_bytes(b[8..].try_into().expect("4 bytes"));
    if v != VERSION {
        return Err(StreamError::Version(v));
    }
    Ok(())
}

/// Writes one checkpoint: `header` (its `data` is not sent) and `data`.
pub fn write_checkpoint(w: &mut impl Write, header: &pb::CheckpointMsg, data: &[u8]) -> Result<()> {
    let mut h = header.clone();
    h.data = Default::default();
    let hb = h.encode_to_vec();
    let mut prefix = Vec::with_capacity(hb.len() + 12);
    prefix.extend_from_slice(&(hb.len() as u32).to_le_bytes());
    prefix.extend_from_slice(&hb);
    prefix.extend_from_slice(&(data.len() as u64).to_le_bytes());
    // Small checkpoints leave in one segment (the socket has TCP_NODELAY).
    if data.len() <= 64 * 1024 {
        prefix.extend_from_slice(data);
        w.write_all(&prefix)?;
    } else {
        w.write_all(&prefix)?;
        w.write_all(data)?;
    }
    Ok(())
}

/// Reads one checkpoint: its header with `data` filled in. `None` at a clean end of stream
/// (the peer closed between checkpoints).
pub fn read_checkpoint(r: &mut impl Read) -> Result<Option<pb::CheckpointMsg>> {
    let Some(len) = read_len_or_end(r)? else {
        return Ok(None);
    };
    let hlen = u32::from_le_bytes(len);
    if hlen > MAX_HEADER {
        return Err(StreamError::TooLong {
            what: "checkpoint header",
            len: hlen.into(),
            max: MAX_HEADER.into(),
        });
    }
    let mut hb = vec![0u8; hlen as usize];
    r.read_exact(&mut hb)?;
    let mut msg =
        pb::CheckpointMsg::decode(hb.as_slice()).map_err(|source| StreamError::Decode {
            what: "checkpoint header",
            source,
        })?;
    let mut dl = [0u8; 8];
    r.read_exact(&mut dl)?;
    let dlen = u64::from_le_bytes(dl);
    if dlen > MAX_DATA {
        return Err(StreamError::TooLong {
            what: "checkpoint",
            len: dlen,
            max: MAX_DATA,
        });
    }
    // Grown as the bytes arrive: a length alone allocates at most 64 MiB.
    let mut data = Vec::with_capacity(dlen.min(64 << 20) as usize);
    let got = r.take(dlen).read_to_end(&mut data)?;
    if got as u64 != dlen {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the stream ended {got} bytes into a checkpoint of {dlen}"),
        )
        .into());
    }
    msg.data = data.into();
    Ok(Some(msg))
}

/// A frame's 4-byte length, or `None` if the stream ended before its first byte (between
/// frames). Ending inside the length is an error.
fn read_len_or_end(r: &mut impl Read) -> io::Result<Option<[u8; 4]>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the stream ended inside a frame length",
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A TLS peer that closed the connection without `close_notify`, between frames:
            // the same end as a TCP peer's FIN there (a cut inside a frame is still an error).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && got == 0 => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(Some(len))
}

/// Writes one acknowledgement.
pub fn write_ack(w: &mut impl Write, ack: &pb::Ack) -> io::Result<()> {
    let b = ack.encode_to_vec();
    let mut out = Vec::with_capacity(b.len() + 4);
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(&b);
    w.write_all(&out)
}

/// Reads one acknowledgement; `None` at a clean end of stream.
pub fn read_ack(r: &mut impl Read) -> Result<Option<pb::Ack>> {
    let Some(len) = read_len_or_end(r)? else {
        return Ok(None);
    };
    let n = u32::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(StreamError::TooLong {
            what: "acknowledgement",
            len: n.into(),
            max: MAX_HEADER.into(),
        });
    }
    let mut b = vec![0u8; n as usize];
    r.read_exact(&mut b)?;
    pb::Ack::decode(b.as_slice())
        .map(Some)
        .map_err(|source| StreamError::Decode {
            what: "acknowledgement",
            source,
        })
}

/// The primary's end of a checkpoint stream (also what a test uses to play a rogue primary).
/// One handle sends (the sender thread); a [`Connection::try_clone`] reads the
/// acknowledgements on another thread. With TLS both share the session behind a mutex held
/// only to encrypt or decrypt, never across a blocking socket call, so a large checkpoint
/// being written does not hold back the acknowledgements of earlier ones.
pub struct Connection {
    sock: TcpStream,
    tls: Option<Arc<Mutex<rustls::ClientConnection>>>,
    /// Ciphertext read from the socket (TLS only).
    inbuf: Vec<u8>,
}

/// Plaintext bytes encrypted per lock of the session.
const TLS_CHUNK: usize = 256 << 10;

/// How long the primary's side of a stream waits for the backup to take its bytes or to
/// acknowledge, after the hello. Long: a backup applying the full checkpoint of a large service
/// acknowledges nothing for seconds.
pub const STALL: Duration = Duration::from_secs(60);

impl Connection {
    /// Connects to the backup whose stream listens on `api`, makes the TLS handshake (with
    /// `tls`) and exchanges hellos.
    pub fn connect(
        api: &str,
        timeout: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Connection> {
        let addr = stream_addr(api)?;
        let mut sock = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|source| StreamError::Connect { addr, source })?;
        sock.set_nodelay(true)?;
        // The handshake and hello must not hang on a peer that accepts and says nothing.
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let tls = match tls {
            None => None,
            Some(cfg) => {
                // The backup's certificate must carry the address dialled.
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                let mut c = rustls::ClientConnection::new(cfg, name)?;
                c.set_buffer_limit(None);
                while c.is_handshaking() {
                    c.complete_io(&mut sock).map_err(StreamError::Handshake)?;
                }
                Some(Arc::new(Mutex::new(c)))
            }
        };
        let mut c = Connection {
            sock,
            tls,
            inbuf: Vec::new(),
        };
        write_hello(&mut c)?;
        // With TLS 1.3 a backup that refuses our certificate says so after the client's side
        // of the handshake is done: its alert is what this read gets.
        read_hello(&mut c)?;
        // From here on a backup that takes none of our bytes, or acknowledges nothing, for
        // `STALL` is dropped (its sender detaches it): a blackholed link must not hold the
        // sender's thread, and the log it keeps for that backup, for ever. (The orchestrator
        // replaces a backup that falls behind much sooner, `[tardi.failover]
        // max_backup_lag_ms`; this only frees what the stream holds.)
        c.sock.set_read_timeout(Some(STALL))?;
        c.sock.set_write_timeout(Some(STALL))?;
        Ok(c)
    }

    /// A second handle on the stream, for reading the acknowledgements on another thread
    /// (it must not send).
    pub fn try_clone(&self) -> Result<Connection> {
        Ok(Connection {
            sock: self.sock.try_clone()?,
            tls: self.tls.clone(),
            inbuf: Vec::new(),
        })
    }

    pub fn send(&mut self, header: &pb::CheckpointMsg, data: &[u8]) -> Result<()> {
        write_checkpoint(self, header, data)
    }

    /// The next acknowledgement; `None` when the backup closed the stream.
    pub fn recv_ack(&mut self) -> Result<Option<pb::Ack>> {
        read_ack(self)
    }

    /// Ends both directions (with TLS, after a `close_notify` if the socket takes it within
    /// 100 ms): a thread blocked in [`Connection::recv_ack`] returns.
    pub fn shutdown(&self) {
        if let Some(tls) = &self.tls {
            let mut out = Vec::new();
            {
                let mut c = lock(tls);
                c.send_close_notify();
                while c.wants_write() {
                    if c.write_tls(&mut out).is_err() {
                        break;
                    }
                }
            }
            let _ = self
                .sock
                .set_write_timeout(Some(Duration::from_millis(100)));
            let _ = (&self.sock).write_all(&out);
        }
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

fn lock(
    tls: &Mutex<rustls::ClientConnection>,
) -> std::sync::MutexGuard<'_, rustls::ClientConnection> {
    tls.lock().unwrap_or_else(|e| e.into_inner())
}

impl Read for Connection {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = self.tls.clone() else {
            return self.sock.read(out);
        };
        loop {
            match lock(&tls).reader().read(out) {
                // 0: the backup closed the session cleanly.
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // Nothing decrypted is waiting: read ciphertext without holding the session.
            self.inbuf.resize(16 << 10, 0);
            let n = self.sock.read(&mut self.inbuf)?;
            let mut c = lock(&tls);
            let mut rd = &self.inbuf[..n];
            loop {
                // An empty slice tells rustls the socket ended.
                c.read_tls(&mut rd)?;
                c.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                if rd.is_empty() {
                    break;
                }
            }
        }
    }
}

impl Write for Connection {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(tls) = self.tls.clone() else {
            return self.sock.write(buf);
        };
        let mut out = Vec::new();
        for chunk in buf.chunks(TLS_CHUNK) {
            out.clear();
            {
                let mut c = lock(&tls);
                c.writer().write_all(chunk)?;
                while c.wants_write() {
                    c.write_tls(&mut out)?;
                }
            }
            self.sock.write_all(&out)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

/// A checkpoint stream as the backup's instance serves it: plain TCP or a TLS session.
pub enum Accepted {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Accepted {
    /// Takes a connection to the stream's port: the TLS handshake (with `tls`: only a client
    /// whose certificate the cluster's CA signed completes it), then the hellos. Each step has
    /// `timeout` (a port probe or a peer that says nothing is dropped).
    pub fn accept(
        mut sock: TcpStream,
        tls: Option<Arc<rustls::ServerConfig>>,
        timeout: Duration,
    ) -> Result<Accepted> {
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let mut io = match tls {
            None => Accepted::Plain(sock),
            Some(cfg) => {
                let mut c = rustls::ServerConnection::new(cfg)?;
                while c.is_handshaking() {
                    c.complete_io(&mut sock).map_err(StreamError::Handshake)?;
                }
                Accepted::Tls(Box::new(rustls::StreamOwned::new(c, sock)))
            }
        };
        read_hello(&mut io)?;
        write_hello(&mut io)?;
        io.flush()?;
        let s = io.socket();
        s.set_read_timeout(None)?;
        s.set_write_timeout(None)?;
        Ok(io)
    }

    fn socket(&self) -> &TcpStream {
        match self {
            Accepted::Plain(s) => s,
            Accepted::Tls(t) => &t.sock,
        }
    }

    /// The peer's address, for logs.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.socket().peer_addr().ok()
    }
}

impl Read for Accepted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Accepted::Plain(s) => s.read(buf),
            Accepted::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Accepted {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Accepted::Plain(s) => s.write(buf),
            Accepted::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Accepted::Plain(s) => s.flush(),
            Accepted::Tls(t) => t.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(epoch: u64, data: Vec<u8>) -> pb::CheckpointMsg {
        pb::CheckpointMsg {
            service: "redis".into(),
            view: 3,
            primary: "m1".into(),
            epoch,
            run: 2,
            data: data.into(),
        }
    }

    #[test]
    fn checkpoints_and_acks_round_trip_in_order() {
        let mut buf = Vec::new();
        write_hello(&mut buf).unwrap();
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        write_checkpoint(&mut buf, &msg(7, vec![1, 2, 3]), &[1, 2, 3]).unwrap();
        write_checkpoint(&mut buf, &msg(8, vec![]), &big).unwrap();
        write_checkpoint(&mut buf, &msg(9, vec![]), &[]).unwrap();
        let mut r = buf.as_slice();
        read_hello(&mut r).unwrap();
        let a = read_checkpoint(&mut r).unwrap().unwrap();
        assert_eq!((a.epoch, &a.data[..]), (7, &[1u8, 2, 3][..]));
        assert_eq!((a.service.as_str(), a.view, a.run), ("redis", 3, 2));
        let b = read_checkpoint(&mut r).unwrap().unwrap();
        assert_eq!((b.epoch, b.data.len()), (8, big.len()));
        assert_eq!(&b.data[..], &big[..]);
        let c = read_checkpoint(&mut r).unwrap().unwrap();
        assert!(c.epoch == 9 && c.data.is_empty());
        assert!(read_checkpoint(&mut r).unwrap().is_none(), "clean end");

        let mut buf = Vec::new();
        for e in [4, 5] {
            let ack = pb::Ack {
                service: "redis".into(),
                view: 3,
                epoch: e,
                error: if e == 5 { "no".into() } else { String::new() },
                newer_view: 0,
            };
            write_ack(&mut buf, &ack).unwrap();
        }
        let mut r = buf.as_slice();
        assert_eq!(read_ack(&mut r).unwrap().unwrap().epoch, 4);
        assert_eq!(read_ack(&mut r).unwrap().unwrap().error, "no");
        assert!(read_ack(&mut r).unwrap().is_none());
    }

    #[test]
    fn malformed_frames_are_errors_not_allocations_or_panics() {
        // Not a stream at all.
        assert!(matches!(
            read_hello(&mut &b"GET / HTTP/1.1\r\n"[..]),
            Err(StreamError::NotAStream(_))
        ));
        let mut v2 = HELLO.to_vec();
        v2.extend_from_slice(&2u32.to_le_bytes());
        assert!(matches!(
            read_hello(&mut v2.as_slice()),
            Err(StreamError::Version(2))
        ));
        // A header length over the limit.
        let huge = u32::MAX.to_le_bytes();
        assert!(matches!(
            read_checkpoint(&mut &huge[..]),
            Err(StreamError::TooLong { .. })
        ));
        // A data length over the limit: refused before any allocation.
        let mut buf = Vec::new();
        let hb = msg(1, vec![]).encode_to_vec();
        buf.extend_from_slice(&(hb.len() as u32).to_le_bytes());
        buf.extend_from_slice(&hb);
        buf.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            read_checkpoint(&mut buf.as_slice()),
            Err(StreamError::TooLong { .. })
        ));
        // Truncated data: an error, not a short checkpoint.
        let mut buf = Vec::new();
        write_checkpoint(&mut buf, &msg(1, vec![]), &[9; 100]).unwrap();
        buf.truncate(buf.len() - 10);
        assert!(read_checkpoint(&mut buf.as_slice()).is_err());
        // A header that is not protobuf.
        let mut buf = 3u32.to_le_bytes().to_vec();
        buf.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert!(matches!(
            read_checkpoint(&mut buf.as_slice()),
            Err(StreamError::Decode { .. })
        ));
        // Every prefix of a valid frame is an error or a clean end, never a panic.
        let mut buf = Vec::new();
        write_checkpoint(&mut buf, &msg(1, vec![]), &[7; 50]).unwrap();
        for n in 0..buf.len() {
            let r = read_checkpoint(&mut &buf[..n]);
            assert!(
                r.is_err() || (n == 0 && matches!(r, Ok(None))),
                "prefix {n}"
            );
        }
    }

    #[test]
    fn addresses_need_a_port() {
        assert_eq!(
            stream_addr("10.77.0.22:7701").unwrap(),
            "10.77.0.22:7701".parse().unwrap()
        );
        assert!(stream_addr("10.77.0.22").is_err());
    }
}
