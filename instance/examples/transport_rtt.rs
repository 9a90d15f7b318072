//! The checkpoint stream's round trip on the critical path: send one checkpoint-sized message,
//! wait for its acknowledgement, repeat. gRPC (the `Replica` bidirectional stream, as the
//! instance uses it) against a plain TCP stream (length-prefixed frames, 8-byte acks), same
//! payloads, same loopback, one run, with the instance's HTTP/2 windows. The receiver only
//! acknowledges: this measures the transport, not the backup's checks.
//!
//! Run: cargo run --release -p tardi-instance --example transport_rtt [-- ROUNDS]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use tardi_proto as pb;
use tokio_stream::StreamExt;

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

fn grpc(rt: &tokio::runtime::Runtime, size: usize, rounds: usize) -> Vec<Duration> {
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .initial_stream_window_size(tardi_instance::STREAM_WINDOW)
                .initial_connection_window_size(tardi_instance::CONNECTION_WINDOW)
                .add_service(
                    pb::replica_server::ReplicaServer::new(AckAll)
                        .max_decoding_message_size(usize::MAX),
                )
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .tcp_nodelay(true)
            .initial_stream_window_size(tardi_instance::STREAM_WINDOW)
            .initial_connection_window_size(tardi_instance::CONNECTION_WINDOW)
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
        }
        out
    })
}

fn tcp(size: usize, rounds: usize) -> Vec<Duration> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = Vec::new();
        let mut len = [0u8; 8];
        while s.read_exact(&mut len).is_ok() {
            buf.resize(u64::from_le_bytes(len) as usize, 0);
            s.read_exact(&mut buf).unwrap();
            s.write_all(&len).unwrap(); // the ack
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let data = vec![0xa5u8; size];
    let mut out = Vec::with_capacity(rounds);
    let mut ack = [0u8; 8];
    for i in 0..rounds + 20 {
        let t = Instant::now();
        s.write_all(&(size as u64).to_le_bytes()).unwrap();
        s.write_all(&data).unwrap();
        s.read_exact(&mut ack).unwrap();
        if i >= 20 {
            out.push(t.elapsed());
        }
    }
    drop(s);
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
        "| checkpoint bytes | gRPC p50 µs | gRPC p99 µs | gRPC mean µs | TCP p50 µs | TCP p99 µs | TCP mean µs |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for size in [512usize, 4 << 10, 64 << 10, 1 << 20] {
        let n = if size >= 1 << 20 { rounds / 10 } else { rounds };
        let g = percentiles(grpc(&rt, size, n));
        let t = percentiles(tcp(size, n));
        println!(
            "| {size} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            g.0, g.1, g.2, t.0, t.1, t.2
        );
    }
}
