//! The checkpoint stream with mutual TLS, on loopback, served as the instance serves it
//! ([`stream::Accepted::accept`]): a primary with a certificate from the cluster's CA gets its
//! checkpoint acknowledged; one without a certificate, with a certificate from another CA, or
//! in plaintext never gets past the handshake (the backup reads no checkpoint from it); and a
//! primary refuses a backup whose certificate another CA signed.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tardi_instance::stream;
use tardi_proto as pb;
use tardi_tls::Identity;
use tardi_tls::certs::{self, NodeSpec, Role};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(dir: &Path) -> Arc<rustls::RootCertStore> {
    let mut r = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        r.add(c.unwrap()).unwrap();
    }
    Arc::new(r)
}

/// A client trusting the CA of `trust`, presenting `identity`'s certificate (or none).
fn client(trust: &Path, identity: Option<&Path>) -> Arc<rustls::ClientConfig> {
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots(trust));
    Arc::new(match identity {
        None => b.with_no_client_auth(),
        Some(d) => b
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(d.join("node.pem"))
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_file(d.join("node.key")).unwrap(),
            )
            .unwrap(),
    })
}

fn header(epoch: u64) -> pb::CheckpointMsg {
    pb::CheckpointMsg {
        service: "svc".into(),
        view: 1,
        primary: "m1".into(),
        epoch,
        run: 1,
        data: Default::default(),
    }
}

/// A backup serving one connection with `tls`: `Ok(epochs received)` or the refusal.
fn backup(
    tls: Arc<rustls::ServerConfig>,
) -> (
    String,
    std::thread::JoinHandle<Result<Vec<u64>, stream::StreamError>>,
) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let io = stream::Accepted::accept(s, Some(tls), Duration::from_secs(2))?;
        let mut input = std::io::BufReader::new(io);
        let mut got = Vec::new();
        while let Some(m) = stream::read_checkpoint(&mut input)? {
            got.push(m.epoch);
            let ack = pb::Ack {
                service: m.service,
                view: m.view,
                epoch: m.epoch,
                error: String::new(),
                newer_view: 0,
            };
            stream::write_ack(input.get_mut(), &ack)?;
        }
        Ok(got)
    });
    (addr, t)
}

#[test]
fn only_primaries_with_the_clusters_certificates_reach_a_backup() {
    let dir = std::env::temp_dir().join(format!("tardi-stream-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _cleanup = TempDir(dir.clone());
    let (ours, theirs) = (dir.join("ours"), dir.join("theirs"));
    let nodes = [
        NodeSpec::parse(Role::Instance, "m1=127.0.0.1").unwrap(),
        NodeSpec::parse(Role::Instance, "m2=127.0.0.1").unwrap(),
    ];
    certs::make(&ours, &nodes, 1, false).unwrap();
    certs::make(&theirs, &nodes, 1, false).unwrap();
    let m1 = Identity::load(&ours.join("m1")).unwrap();
    let m2 = Identity::load(&ours.join("m2")).unwrap();
    let rogue_m2 = Identity::load(&theirs.join("m2")).unwrap();

    // The cluster's primary: its checkpoints (a large one too) are acknowledged in order.
    let (addr, t) = backup(m2.stream_server());
    let mut c =
        stream::Connection::connect(&addr, Duration::from_secs(2), Some(m1.stream_client()))
            .expect("a primary of the cluster connects");
    let mut acks = c.try_clone().unwrap();
    let big = vec![0xa5u8; 3 << 20];
    for (e, data) in [(1u64, &b"abc"[..]), (2, &big[..]), (3, &[][..])] {
        c.send(&header(e), data).unwrap();
        assert_eq!(acks.recv_ack().unwrap().unwrap().epoch, e);
    }
    c.shutdown();
    assert_eq!(t.join().unwrap().unwrap(), vec![1, 2, 3]);

    // Primaries the backup must refuse.
    let cases: [(&str, Option<Arc<rustls::ClientConfig>>); 3] = [
        (
            "no client certificate",
            Some(client(&ours.join("m1"), None)),
        ),
        (
            "a certificate from another CA",
            Some(client(&ours.join("m1"), Some(&theirs.join("m1")))),
        ),
        ("plaintext", None),
    ];
    for (who, cfg) in cases {
        let (addr, t) = backup(m2.stream_server());
        let r =
            stream::Connection::connect(&addr, Duration::from_secs(2), cfg).and_then(|mut c| {
                // Should it have got this far, a checkpoint must still not be taken.
                c.send(&header(7), b"state")?;
                c.recv_ack()
            });
        let served = t.join().unwrap();
        eprintln!("{who}: primary {r:?}; backup {served:?}");
        assert!(
            !matches!(r, Ok(Some(_))),
            "{who}: the checkpoint was acknowledged"
        );
        let e = served.expect_err(&format!("{who}: the backup accepted the stream"));
        assert!(
            matches!(e, stream::StreamError::Handshake(_)),
            "{who}: refused for another reason: {e}"
        );
    }

    // A backup with a certificate from another CA: the cluster's primary refuses it.
    let (addr, t) = backup(rogue_m2.stream_server());
    let r = stream::Connection::connect(&addr, Duration::from_secs(2), Some(m1.stream_client()));
    assert!(
        matches!(r, Err(stream::StreamError::Handshake(_))),
        "a rogue backup was accepted"
    );
    assert!(t.join().unwrap().is_err());
}
