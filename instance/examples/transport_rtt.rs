//! The checkpoint stream's round trip on the critical path: send one checkpoint-sized message,
//! wait for its acknowledgement, repeat; back to back, and with a 3 ms idle gap between rounds
//! (as epochs leave the stream idle between checkpoints). The instance's transport (the
//! dedicated TCP stream, `tardi_instance::stream`, as the instance serves it) against the gRPC
//! bidirectional stream (`Replica` in `proto/tardi.proto`, with 8/16 MiB HTTP/2 windows) the
//! instances used before; same payloads, same loopback, one run. The receiver only
//! acknowledges: this measures the transport, not the backup's checks.
//!
//! Run: cargo run --release -p tardi-instance --example transport_rtt [-- ROUNDS]

use std::net::TcpListener;
use std::time::{Duration, Instant};
use tardi_instance::stream;
use tardi_proto as pb;
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
            })
        });
        Ok(tonic::Response::new(Box::pin(s)))
    }
}

fn percentiles(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let p = |q: f64| us(v[((v.len() - 1) as f64 * q).round() as usize]);
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

fn tcp(size: usize, rounds: usize, gap: Duration) -> Vec<Duration> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        stream::read_hello(&mut s).unwrap();
        stream::write_hello(&mut s).unwrap();
        let mut input = std::io::BufReader::with_capacity(256 << 10, s.try_clone().unwrap());
        while let Some(m) = stream::read_checkpoint(&mut input).unwrap() {
            let ack = pb::Ack {
                service: String::new(),
                view: m.view,
                epoch: m.epoch,
                error: String::new(),
            };
            stream::write_ack(&mut s, &ack).unwrap();
        }
    });
    let mut c = stream::Connection::connect(&addr.to_string(), Duration::from_secs(1)).unwrap();
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
    println!(
        "| checkpoint bytes | gap | stream p50 µs | stream p99 µs | stream mean µs | gRPC p50 µs | gRPC p99 µs | gRPC mean µs |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for gap_ms in [0u64, 3] {
        let gap = Duration::from_millis(gap_ms);
        for size in [512usize, 4 << 10, 64 << 10, 1 << 20] {
            let mut n = if size >= 1 << 20 { rounds / 10 } else { rounds };
            if gap_ms > 0 {
                n = n.min(500);
            }
            let t = percentiles(tcp(size, n, gap));
            let g = percentiles(grpc(&rt, size, n, gap));
            println!(
                "| {size} | {gap_ms} ms | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                t.0, t.1, t.2, g.0, g.1, g.2
            );
        }
    }
}
