//! The epoch thread: the service under the epoch loop, each checkpoint published to the senders,
//! the fence's freeze carried out between epochs.

#[allow(unused_imports)]
use super::*;

/// Runs the epoch loop until the service ends or the primary is stopped.
pub(super) fn epoch_thread(
    sh: &Arc<Shared>,
    mut svc: Service,
    cfg: EpochConfig,
) -> anyhow::Result<()> {
    // The pause hook marks the epoch boundary in the gate (one atomic store). Alone (no backup
    // in the view), the epoch is decided as soon as it is captured: released right there.
    let hooks = {
        let (gate, alone) = (sh.gate.clone(), sh.alone.clone());
        EpochHooks::on_pause(move |e| {
            gate.mark(e);
            if alone.load(Ordering::SeqCst)
                && let Err(err) = gate.release(e)
            {
                tracing::error!(error = %err, "releasing output failed");
            }
        })
    };
    // Alone (a takeover with no survivor to wait for, or no backup wanted yet), nobody needs a
    // checkpoint 0: the first pause only arms tracking, and a backup that joins later gets a
    // full checkpoint taken mid-stream. This keeps a copy of all memory (and its serialising)
    // off the path from a takeover to the first released reply.
    let first = if sh.alone.load(Ordering::SeqCst) {
        let (epochs, stats) = Epochs::start_tracking(svc.pid(), cfg, hooks)?;
        (epochs, None, stats)
    } else {
        let (epochs, first, stats) = Epochs::start_with(svc.pid(), cfg, hooks)?;
        (epochs, Some(first), stats)
    };
    let (mut epochs, first, stats) = first;
    tracing::info!(
        service = %sh.name,
        pause_us = stats.pause_us,
        quiesce_us = stats.quiesce_us,
        full = first.is_some(),
        "epoch loop started"
    );
    // Adaptive epochs: the gate's reader ends the epoch (after its minimum length) as soon as
    // output is queued, without waking another thread first; the releases tell the loop how many
    // packets answer a release (`EpochConfig::follow_releases`).
    let trigger = epochs.trigger();
    let each = sh.gate.on_each_output(Box::new(move |n| trigger.output(n)));
    let trigger = epochs.trigger();
    let released = sh
        .gate
        .on_release(Box::new(move |e, n| trigger.released(e, n)));
    if !(each && released) {
        tracing::warn!(service = %sh.name, "the gate already has output callbacks; epochs are not adaptive");
    }
    if let Some(first) = first {
        publish(
            sh,
            first.epoch,
            first.to_bytes().into(),
            true,
            stats.pause_us,
        );
    }
    sh.lock().phase = "running".into();
    let mut log = sh
        .ctx
        .opts
        .epoch_log
        .as_deref()
        .map(|p| crate::epoch_log::EpochLog::open(p, &sh.name, &sh.machine, sh.run));
    let result = loop {
        if sh.stop.load(Ordering::SeqCst) {
            break Ok(());
        }
        let frozen = {
            let mut st = sh.lock();
            if std::mem::take(&mut st.full_wanted) {
                epochs.request_full();
            }
            st.fenced.is_some()
        };
        // Frozen (see `Primary::fence_if_cut_off`): this epoch's checkpoint is taken with the
        // process kept stopped in its state; the loop then waits, the process stopped, until
        // it is thawed (the next epoch resumes it) or stopped.
        let out = epochs.next_output(frozen);
        if frozen && out.is_ok() {
            let mut st = sh.lock();
            st.phase = "frozen: cut off from the orchestrators and its backups".into();
            while st.fenced.is_some() && !sh.stop.load(Ordering::SeqCst) {
                st = sh
                    .new_data
                    .wait_timeout(st, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            st.phase = "running".into();
        }
        match out {
            Ok(out) => {
                let pause = out.stats.pause_us;
                let inc = out.incremental;
                if let Some(full) = out.full {
                    sh.lock().fulls += 1;
                    // Serialising a large full checkpoint takes long: on its own thread, so the
                    // epochs (and the decisions of the other backups) go on meanwhile.
                    sh.lock().pin = Some(inc.epoch + 1);
                    let sh2 = sh.clone();
                    std::thread::spawn(move || {
                        publish(&sh2, full.epoch, full.to_bytes().into(), true, pause);
                    });
                }
                // Timed for the epoch log only: nothing else reads it.
                if log.is_some()
                    && let Some(resumed) = out.stats.resumed_at
                {
                    let mut st = sh.lock();
                    st.in_flight.push_back((inc.epoch, resumed, Instant::now()));
                    if st.in_flight.len() > 1000 {
                        st.in_flight.pop_front();
                    }
                }
                publish(sh, inc.epoch, inc.to_bytes().into(), false, pause);
                // After the publish: off the path from the pause to the send.
                if let Some(log) = log.as_mut() {
                    let decided = sh.lock().last_decided.take();
                    log.record(&out.stats, decided);
                }
            }
            Err(e) => match e.chain() {
                ChainState::Intact => {
                    tracing::warn!(service = %sh.name, %e, "epoch failed; the next one carries its pages")
                }
                ChainState::ServiceGone => {
                    let why = svc
                        .try_wait()
                        .ok()
                        .flatten()
                        .map_or_else(|| e.to_string(), |x| x.to_string());
                    break Err(anyhow::anyhow!("the service ended: {why}"));
                }
                // Not handled yet: a new loop (and a full checkpoint to every backup) would be
                // needed. The primary reports itself failed.
                ChainState::Broken => {
                    break Err(anyhow::anyhow!("the checkpoint chain broke: {e}"));
                }
            },
        }
    };
    sh.stop.store(true, Ordering::SeqCst);
    epochs.stop();
    let _ = svc.teardown();
    result
}

/// The (service side, client side) addresses of the connected TCP sockets a restore of the
/// image resets: of every process of its tree, those whose connection it does not carry.
pub(super) fn tcp_connections(
    img: &tardi_checkpointer::image::ProcessImage,
) -> Vec<(std::net::SocketAddr, std::net::SocketAddr)> {
    use tardi_checkpointer::image::{FdKind, SocketState};
    img.processes()
        .flat_map(|p| {
            p.fds
                .iter()
                // A connection the checkpoint carries is restored, not reset (see
                // `tardi_checkpointer::tcp`).
                .filter(|f| !p.tcp.iter().any(|c| c.fd == f.fd))
                .filter_map(|f| match &f.kind {
                    FdKind::Socket(s) if s.state == SocketState::ConnectedTcp => {
                        Some((sockaddr(&s.local)?, sockaddr(&s.peer)?))
                    }
                    _ => None,
                })
        })
        .collect()
}

/// A raw `sockaddr_in` / `sockaddr_in6` as the kernel wrote it (family in host order, port and
/// address in network order).
pub(super) fn sockaddr(b: &[u8]) -> Option<std::net::SocketAddr> {
    let family = i32::from(u16::from_ne_bytes(b.get(0..2)?.try_into().ok()?));
    let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
    match family {
        libc::AF_INET => {
            let a: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            Some((std::net::Ipv4Addr::from(a), port).into())
        }
        libc::AF_INET6 => {
            let a: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            Some((std::net::Ipv6Addr::from(a), port).into())
        }
        _ => None,
    }
}
