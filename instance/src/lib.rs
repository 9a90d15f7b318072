//! The per-machine daemon (`tardi instance`): for each service the orchestrator assigns to this
//! machine it is the primary ([`primary`]: runs the sandbox, checkpoints every epoch, streams
//! checkpoints, releases output once decided) or a backup ([`backup`]: checks, queues,
//! acknowledges and applies checkpoints to an in-memory image, and takes over when a view makes
//! it primary). Machines it has no role on for a service are that service's spares.
//!
//! Owns: the roles and their transitions, the checkpoint stream between machines ([`stream`]:
//! a dedicated TCP connection served on `--listen`), the session with the orchestrator (gRPC,
//! heartbeats in one direction, assignments in the other), the link throttle ([`throttle`]),
//! and the rendering of this machine's Prometheus metrics (`--metrics`, served by
//! `tardi-metrics`).
//!
//! By job: [`Options`] (the flags, `options.rs`), [`Ctx`] (what every role shares, `ctx.rs`), the
//! role table and its transitions (`roles.rs`), the Prometheus rendering (`metrics.rs`), the
//! checkpoint-stream server (`streams.rs`), the sandboxes a crashed run left (`leftovers.rs`),
//! and here the daemon's main loop and its session with the orchestrators (through the crate
//! `tardi-orchestrator-client`, not the orchestrator itself).
//! Must not touch: how a checkpoint is captured or restored (`tardi-checkpointer`,
//! `tardi-service`), how output is held (`tardi-netfilter`), or which machine plays which role
//! (the orchestrator decides; an instance only follows views, and refuses checkpoints of views
//! it has left).

pub mod backup;
pub mod epoch_log;
pub mod primary;
pub mod stream;
pub mod throttle;

mod ctx;
mod leftovers;
mod metrics;
mod options;
mod roles;
mod streams;

use ctx::Event;
pub use ctx::{Ctx, Target};
use leftovers::reap_leftovers;
use metrics::metrics;
pub use options::Options;
use roles::{Role, Roles, stop};
use streams::serve_streams;

use anyhow::Context;
use backup::Backup;
use primary::Primary;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tardi_orchestrator_client::Orchestrators;
use tardi_proto as pb;
use tardi_sandbox::SandboxConfig;

/// Runs the daemon until SIGINT/SIGTERM.
pub fn run(opts: Options) -> anyhow::Result<()> {
    reap_leftovers(&opts.run_dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Assignments (and wake-ups: a primary failed) are applied on their own thread, newest
    // first (a burst collapses to one).
    let (events, events_rx) = std::sync::mpsc::channel::<Event>();
    let ctx = Arc::new(Ctx {
        throttle: opts
            .link_bandwidth
            .map(|b| Arc::new(throttle::Throttle::new(b))),
        opts: opts.clone(),
        rt: rt.handle().clone(),
        machines: Mutex::new(HashMap::new()),
        orchestrators: Orchestrators::new(&opts.orchestrator, opts.security.clone()),
        events: events.clone(),
    });
    let roles = Arc::new(Roles {
        ctx: ctx.clone(),
        roles: Mutex::new(HashMap::new()),
        changing: Mutex::new(HashMap::new()),
        lease: Mutex::new(None),
    });
    {
        let (roles, every) = (
            roles.clone(),
            (opts.heartbeat / 2).max(Duration::from_millis(2)),
        );
        std::thread::Builder::new()
            .name("fence".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    roles.fence_cut_off();
                }
            })?;
    }
    {
        let roles = roles.clone();
        std::thread::Builder::new()
            .name("reconcile".into())
            .spawn(move || {
                let mut last: Option<pb::Assignments> = None;
                while let Ok(first) = events_rx.recv() {
                    for e in std::iter::once(first).chain(events_rx.try_iter()) {
                        if let Event::Assign(a) = e {
                            last = Some(a);
                        }
                    }
                    if let Some(a) = &last {
                        roles.reconcile(a);
                    }
                }
            })?;
    }
    let listener = std::net::TcpListener::bind(opts.listen)
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    {
        let (roles, tls) = (roles.clone(), opts.security.stream_server());
        std::thread::Builder::new()
            .name("stream-accept".into())
            .spawn(move || serve_streams(listener, roles, tls))?;
    }
    let result = rt.block_on(async {
        let _metrics = match opts.metrics {
            Some(addr) => {
                let (roles, machine) = (roles.clone(), opts.machine.clone());
                let render: tardi_metrics::Render =
                    Arc::new(move || metrics(&machine, &roles.reports()));
                Some(tardi_metrics::serve(addr, tardi_metrics::router(render)).await?)
            }
            None => None,
        };
        println!(
            "instance {} listening on {}, orchestrator {}",
            opts.machine, opts.listen, opts.orchestrator
        );
        let session = tokio::spawn(session(roles.clone(), events));
        tardi_orchestrator_client::shutdown_signal().await;
        session.abort();
        anyhow::Ok(())
    });
    // Stop every role: primaries tear their sandboxes down.
    let all: Vec<Role> = roles.lock().drain().map(|(_, r)| r).collect();
    for r in all {
        stop(r);
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The session with the orchestrators' leader: heartbeats out, assignments in; reconnects
/// forever, following the leader (a follower refuses the session and names the leader; a dead
/// node is noticed by HTTP/2 keepalive within a few hundred ms).
async fn session(roles: Arc<Roles>, assign: std::sync::mpsc::Sender<Event>) {
    let opts = roles.ctx.opts.clone();
    let orchestrators = &roles.ctx.orchestrators;
    loop {
        let r: anyhow::Result<()> = async {
            let (tx, mut incoming, leader) = orchestrators
                .call(Duration::from_secs(2), |mut c, url| async move {
                    let (tx, rx) = tokio::sync::mpsc::channel::<pb::Heartbeat>(4);
                    let incoming = c
                        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
                        .await?
                        .into_inner();
                    Ok((tx, incoming, url))
                })
                .await?;
            tracing::info!(%leader, "session with the orchestrators' leader");
            let hb_roles = roles.clone();
            let hb_opts = opts.clone();
            let beat = tokio::spawn(async move {
                let mut tick = tokio::time::interval(hb_opts.heartbeat);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tick.tick().await;
                    let hb = pb::Heartbeat {
                        machine: hb_opts.machine.clone(),
                        api: hb_opts.listen.to_string(),
                        services: hb_roles.reports(),
                    };
                    if tx.send(hb).await.is_err() {
                        break;
                    }
                }
            });
            let r = async {
                while let Some(a) = incoming.message().await? {
                    if a.renewal {
                        roles.renewed(Duration::from_millis(a.lease_ms));
                        continue;
                    }
                    if assign.send(Event::Assign(a)).is_err() {
                        break;
                    }
                }
                anyhow::Ok(())
            }
            .await;
            beat.abort();
            // A session that ends sends us elsewhere: the node may be dead or a follower now.
            orchestrators.forget(&leader);
            r
        }
        .await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "orchestrator session lost; reconnecting");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use crate::roles::error_text;

    #[test]
    fn error_text_names_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("restore failed: {0}")]
        struct Quoting(#[source] std::io::Error);
        let quoted = anyhow::Error::new(Quoting(std::io::Error::other("it exited")));
        assert_eq!(error_text(&quoted), "restore failed: it exited");
        let layered = anyhow::Error::new(std::io::Error::other("denied")).context("creating /x");
        assert_eq!(error_text(&layered), "creating /x: denied");
    }
}
