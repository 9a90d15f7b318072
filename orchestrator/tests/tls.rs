//! An orchestrator serving mutual TLS, in this process on loopback (real tonic server, real
//! certificates from `tardi_tls::certs`): peers without a client certificate, with one from
//! another CA, or in plaintext are refused and change nothing; malformed requests from an
//! authenticated peer (garbage over TLS, garbage after the HTTP/2 preface, a gRPC frame whose
//! protobuf does not decode, an out-of-range field) are refused and the node keeps serving.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tardi_orchestrator::client;
use tardi_orchestrator::server::{Options, serve_until};
use tardi_proto as pb;
use tardi_tls::Security;
use tardi_tls::certs::{self, NodeSpec, Role};
use tokio::sync::oneshot;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("tardi-orch-tls-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    TempDir(d)
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The cluster's CA with o1 and a client `admin`, and another CA with its own `admin`.
fn make_certs(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ours = dir.join("ours");
    certs::make(
        &ours,
        &[
            NodeSpec::parse(Role::Orchestrator, "o1=127.0.0.1").unwrap(),
            NodeSpec::parse(Role::Client, "admin").unwrap(),
        ],
        1,
        false,
    )
    .unwrap();
    let theirs = dir.join("theirs");
    certs::make(
        &theirs,
        &[NodeSpec::parse(Role::Orchestrator, "admin=127.0.0.1").unwrap()],
        1,
        false,
    )
    .unwrap();
    (ours.join("o1"), ours.join("admin"), theirs.join("admin"))
}

async fn status(url: &str, sec: &Security) -> Result<pb::ClusterStatus, client::ClientError> {
    client::status_from(url, sec, false).await
}

/// What must not change when a refused peer tried: the state and the raft log.
fn fingerprint(st: &pb::ClusterStatus) -> (usize, usize, u64) {
    let c = st.cluster.clone().unwrap_or_default();
    (st.machines.len(), st.services.len(), c.last_log_index)
}

const MANIFEST: &str = r#"
libos.entrypoint = "/bin/sleep"
loader.argv = ["sleep", "1000"]
[tardi]
name = "intruder"
"#;

/// A raw gRPC codec: sends the bytes it is given as the message, returns the reply's bytes.
#[derive(Clone, Copy, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(buf);
        let mut v = vec![0; n];
        bytes::Buf::copy_to_slice(buf, &mut v);
        Ok(Some(v))
    }
}

/// Sends `body` as the gRPC message of `path` over an authenticated channel.
async fn raw_call(
    url: &str,
    sec: &Security,
    path: &'static str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    let ch = sec.endpoint(url).unwrap().connect().await.unwrap();
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.unwrap();
    g.unary(
        tonic::Request::new(body),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        Raw,
    )
    .await
    .map(|r| r.into_inner())
}

/// Opens an authenticated TLS session (this client's certificate) to `addr`, writes `bytes`
/// and reads until the server closes: `Ok(bytes read)` if it closed within 5 s.
fn garbage_over_tls(addr: SocketAddr, client_dir: &Path, bytes: &[u8]) -> Result<usize, String> {
    let id = tardi_tls::Identity::load(client_dir).unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let conn = rustls::ClientConnection::new(id.stream_client(), name).unwrap();
    let sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut s = rustls::StreamOwned::new(conn, sock);
    s.write_all(bytes).map_err(|e| format!("write: {e}"))?;
    s.flush().map_err(|e| format!("flush: {e}"))?;
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => Ok(got.len()),
        // Closed without close_notify, or reset: closed all the same.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            Ok(got.len())
        }
        Err(e) => Err(format!("the server kept the connection open: {e}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_peers_are_refused_and_malformed_requests_do_not_stop_the_node() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("TARDI_LOG"))
        .with_test_writer()
        .try_init();
    let certs_dir = temp_dir("certs");
    let data = temp_dir("data");
    let (o1_dir, admin_dir, stranger_dir) = make_certs(&certs_dir.0);
    let addr = free_addr();
    let url = format!("http://{addr}");
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let opts = Options {
        listen: addr,
        name: "o1".into(),
        failure_timeout: Duration::from_millis(100),
        data_dir: data.0.clone(),
        peers: vec![],
        join: false,
        metrics: None,
        security: Security::tls(&o1_dir).unwrap(),
    };
    let node = tokio::spawn(async move {
        serve_until(opts, async {
            let _ = stop_rx.await;
        })
        .await
        .expect("orchestrator node");
    });
    let admin = Security::tls(&admin_dir).unwrap();
    let t0 = Instant::now();
    let before = loop {
        match status(&url, &admin).await {
            Ok(st) if st.cluster.as_ref().is_some_and(|c| c.leader == "o1") => break st,
            r => assert!(
                t0.elapsed() < Duration::from_secs(30),
                "o1 never led with TLS: {r:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Members are shown as they are dialled (the node was started with an `http://` URL).
    let members = &before.cluster.as_ref().unwrap().members;
    assert!(
        !members.is_empty() && members.iter().all(|m| m.addr.starts_with("https://")),
        "members not shown with the scheme they are dialled with: {members:?}"
    );

    // 1. Peers that do not hold a certificate of this cluster's CA: one with a certificate
    // from another CA, one with none (it trusts the cluster's CA), one in plaintext.
    let stranger = Security::tls(&stranger_dir).unwrap();
    let e = status(&url, &stranger).await.expect_err("another CA");
    eprintln!("what the CLI says with a certificate from another CA: {e}");
    let ca_pem = std::fs::read_to_string(admin_dir.join("ca.pem")).unwrap();
    let no_cert = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca_pem)),
        )
        .unwrap();
    // The stranger trusting the cluster's CA (so that its client accepts the server), and
    // presenting its own certificate: the server must refuse it.
    let stranger_trusting = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca_pem))
                .identity(tonic::transport::Identity::from_pem(
                    std::fs::read_to_string(stranger_dir.join("node.pem")).unwrap(),
                    std::fs::read_to_string(stranger_dir.join("node.key")).unwrap(),
                )),
        )
        .unwrap();
    for (who, ep) in [
        ("a certificate from another CA", stranger_trusting),
        ("no client certificate", no_cert),
        ("plaintext", Security::Plaintext.endpoint(&url).unwrap()),
    ] {
        // In TLS 1.3 the client's side of the handshake completes before the server checks
        // the client's certificate: the connection may open, the first request fails.
        let ch = match ep.connect().await {
            Err(e) => {
                eprintln!("{who}: refused at connect: {}", client::causes(&e));
                continue;
            }
            Ok(ch) => ch,
        };
        let mut c = pb::orchestrator_client::OrchestratorClient::new(ch);
        let r = c.status(pb::StatusRequest {}).await;
        assert!(r.is_err(), "{who}: status answered: {r:?}");
        eprintln!("{who}: {}", r.unwrap_err());
        let r = c
            .deploy(pb::DeployRequest {
                manifest: MANIFEST.into(),
                manifest_path: "/tmp/intruder.manifest".into(),
                backups: 0,
            })
            .await;
        assert!(r.is_err(), "{who}: deploy accepted: {r:?}");
        let r = c
            .join(pb::JoinRequest {
                name: "o9".into(),
                addr: "http://127.0.0.1:1".into(),
            })
            .await;
        assert!(r.is_err(), "{who}: join accepted: {r:?}");
    }
    let after = status(&url, &admin).await.unwrap();
    assert_eq!(
        fingerprint(&after),
        fingerprint(&before),
        "a refused peer changed the cluster"
    );

    // 2. Malformed requests from an authenticated peer.
    // Garbage instead of HTTP/2, and garbage after a valid HTTP/2 preface: the server closes
    // the connection.
    let preface_then_junk = [&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], &[0xff; 64][..]].concat();
    for (what, bytes) in [
        ("garbage", vec![0x5a; 4096]),
        ("HTTP/2 preface then garbage", preface_then_junk),
    ] {
        let admin_dir = admin_dir.clone();
        let r = tokio::task::spawn_blocking(move || garbage_over_tls(addr, &admin_dir, &bytes))
            .await
            .unwrap();
        assert!(r.is_ok(), "{what}: {r:?}");
    }
    // A valid gRPC frame whose protobuf body does not decode.
    let e = raw_call(
        &url,
        &admin,
        "/tardi.v1.Orchestrator/Deploy",
        vec![0xff, 0xff, 0xff, 0xff],
    )
    .await
    .expect_err("an undecodable DeployRequest was accepted");
    assert_eq!(e.code(), tonic::Code::Internal, "{e}");
    assert!(e.message().contains("decode"), "{e}");
    // A wire type that does not match the field (field 3, `backups`, sent as a string).
    let e = raw_call(
        &url,
        &admin,
        "/tardi.v1.Orchestrator/Deploy",
        vec![0x1a, 0x02, b'h', b'i'],
    )
    .await
    .expect_err("a DeployRequest with a mistyped field was accepted");
    assert_eq!(e.code(), tonic::Code::Internal, "{e}");
    // An out-of-range field: more backups than the orchestrator allows.
    let reply = client::deploy(
        &url,
        &admin,
        MANIFEST.into(),
        "/tmp/intruder.manifest".into(),
        1000,
        None,
        &mut |_| {},
    )
    .await;
    let err = reply.expect_err("1000 backups accepted");
    assert!(err.to_string().contains("at most 16"), "{err}");
    // An unknown method.
    let e = raw_call(&url, &admin, "/tardi.v1.Orchestrator/NoSuchCall", vec![])
        .await
        .expect_err("an unknown method answered");
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e}");

    // 3. The node still serves, and nothing changed.
    let after = status(&url, &admin).await.unwrap();
    assert_eq!(after.cluster.as_ref().unwrap().leader, "o1");
    assert_eq!(fingerprint(&after), fingerprint(&before));
    let _ = stop_tx.send(());
    node.await.unwrap();
}
