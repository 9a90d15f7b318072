//! The checkpoint stream's round trip on the critical path: send one checkpoint-sized message,
//! wait for its acknowledgement, repeat; back to back, and with a 3 ms idle gap between rounds
//! (as epochs leave the stream idle between checkpoints). The instance's transport (the
//! dedicated TCP stream, `tardi_instance::stream`, as the instance serves it) against the gRPC
//! bidirectional stream (`Replica` in `proto/tardi.proto`, with 8/16 MiB HTTP/2 windows) the
//! instances used before; same payloads, same loopback, one run. The stream is measured twice:
//! plain TCP, and inside mutual TLS 1.3 (rustls with ring, node certificates from
//! `tardi_tls::certs`, as the instances run it with `--tls-dir`). The receiver only
//! acknowledges: this measures the transport, not the backup's checks.
//!
//! Run: cargo run --release -p tardi-instance --example transport_rtt [-- ROUNDS]

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tardi_instance::stream;
use tardi_proto as pb;
use tardi_testkit::stats::rounded_rank;
use tokio_stream::StreamExt;

/// The HTTP/2 windows the instances used (with the 64 KiB defaults, a 64 KiB message waited
/// for window updates).
const STREAM_WINDOW: u32 = 8 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

#[derive(Clone)]
struct AckAll;

type AckStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Ack, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl pb::replica_server::Replica for AckAll {
    type ReplicateStream = AckStream;
    async fn replicate(
        &self,
        req: tonic::Request<tonic::Streaming<pb::CheckpointMsg>>,
    ) -> Result<tonic::Response<AckStream>, tonic::Status> {
        let s = req.into_inner().map(|m| {
            m.map(|m| pb::Ack {
                service: String::new(),
                view: m.view,
                epoch: m.epoch,
                error: String::new(),
                newer_view: 0,
            })
        });
        Ok(tonic::Response::new(Box::pin(s)))
    }
}

fn percentiles(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let p = |q: f64| us(rounded_rank(&v, q).expect("round trips measured"));
    (
        p(0.5),
        p(0.99),
        v.iter().map(|d| us(*d)).sum::<f64>() / v.len() as f64,
    )
}

fn grpc(rt: &tokio::runtime::Runtime, size: usize, rounds: usize, gap: Duration) -> Vec<Duration> {
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .add_service(
                    pb::replica_server::ReplicaServer::new(AckAll)
                        .max_decoding_message_size(usize::MAX),
                )
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .tcp_nodelay(true)
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .connect()
            .await
            .unwrap();
        let mut c =
            pb::replica_client::ReplicaClient::new(ch).max_encoding_message_size(usize::MAX);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut acks = c
            .replicate(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let data = tardi_proto::Bytes::from(vec![0xa5u8; size]);
        let mut out = Vec::with_capacity(rounds);
        for i in 0..rounds + 20 {
            let t = Instant::now();
            tx.send(pb::CheckpointMsg {
                service: "bench".into(),
                view: 1,
                primary: "m1".into(),
                epoch: i as u64,
                run: 1,
                data: data.clone(),
            })
            .await
            .unwrap();
            acks.message().await.unwrap().unwrap();
            if i >= 20 {
                out.push(t.elapsed());
            }
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
        }
        out
    })
}

/// The TLS configurations of both ends, or `None` for plain TCP.
type Tls = Option<(Arc<rustls::ClientConfig>, Arc<rustls::ServerConfig>)>;

fn tcp(size: usize, rounds: usize, gap: Duration, tls: &Tls) -> Vec<Duration> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server_tls = tls.as_ref().map(|t| t.1.clone());
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        // As the instance serves it (TCP_NODELAY, handshake, hellos).
        let s = stream::Accepted::accept(s, server_tls, Duration::from_secs(2)).unwrap();
        let mut input = std::io::BufReader::with_capacity(256 << 10, s);
        while let Some(m) = stream::read_checkpoint(&mut input).unwrap() {
            let ack = pb::Ack {
                service: String::new(),
                view: m.view,
                epoch: m.epoch,
                error: String::new(),
                newer_view: 0,
            };
            stream::write_ack(input.get_mut(), &ack).unwrap();
        }
    });
    let mut c = stream::Connection::connect(
        &addr.to_string(),
        Duration::from_secs(1),
        tls.as_ref().map(|t| t.0.clone()),
    )
    .unwrap();
    let data = vec![0xa5u8; size];
    let mut out = Vec::with_capacity(rounds);
    for i in 0..rounds + 20 {
        let t = Instant::now();
        let header = pb::CheckpointMsg {
            service: "bench".into(),
            view: 1,
            primary: "m1".into(),
            epoch: i as u64,
            run: 1,
            data: Default::default(),
        };
        c.send(&header, &data).unwrap();
        c.recv_ack().unwrap().unwrap();
        if i >= 20 {
            out.push(t.elapsed());
        }
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
    }
    c.shutdown();
    server.join().unwrap();
    out
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    // Like the instance: a two-worker runtime.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // A cluster CA and two node identities for loopback, as `tardi certs` makes them.
    let dir = std::env::temp_dir().join(format!("tardi-transport-rtt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nodes = [
        tardi_tls::certs::NodeSpec::parse(tardi_tls::certs::Role::Instance, "m1=127.0.0.1")
            .unwrap(),
        tardi_tls::certs::NodeSpec::parse(tardi_tls::certs::Role::Instance, "m2=127.0.0.1")
            .unwrap(),
    ];
    tardi_tls::certs::make(&dir, &nodes, 1, false).unwrap();
    let primary = tardi_tls::Identity::load(&dir.join("m1")).unwrap();
    let backup = tardi_tls::Identity::load(&dir.join("m2")).unwrap();
    let tls: Tls = Some((primary.stream_client(), backup.stream_server()));
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "| checkpoint bytes | gap | TCP p50 µs | TCP p99 µs | TCP mean µs | TLS p50 µs | TLS p99 µs | TLS mean µs | gRPC p50 µs | gRPC p99 µs | gRPC mean µs |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for gap_ms in [0u64, 3] {
        let gap = Duration::from_millis(gap_ms);
        for size in [512usize, 4 << 10, 64 << 10, 1 << 20] {
            let mut n = if size >= 1 << 20 { rounds / 10 } else { rounds };
            if gap_ms > 0 {
                n = n.min(500);
            }
            let t = percentiles(tcp(size, n, gap, &None));
            let s = percentiles(tcp(size, n, gap, &tls));
            let g = percentiles(grpc(&rt, size, n, gap));
            println!(
                "| {size} | {gap_ms} ms | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                t.0, t.1, t.2, s.0, s.1, s.2, g.0, g.1, g.2
            );
        }
    }
}
