//! The senders: the published checkpoints kept in a log, and one thread per backup streaming
//! them and reading its acknowledgements.

#[allow(unused_imports)]
use super::*;

/// Appends a checkpoint to the log (or makes it the newest full one) and wakes the senders.
pub(super) fn publish(sh: &Arc<Shared>, epoch: u64, bytes: Bytes, full: bool, pause_us: u64) {
    tracing::trace!(epoch, full, bytes = bytes.len(), "published");
    let mut st = sh.lock();
    let len = bytes.len() as u64;
    if full {
        st.full = Some((epoch, bytes));
        st.pin = None;
        if epoch == 0 {
            st.decision.produced = Some(0);
        }
    } else {
        st.log.push_back((epoch, bytes));
        st.decision.produced = Some(epoch);
        if st.waiting_since.is_none() && st.decision.decided < st.decision.produced {
            st.waiting_since = Some(Instant::now());
        }
        // Keep only what a connected sender still has to send (and what continues a full
        // checkpoint being serialised).
        let low = st
            .cursors
            .values()
            .copied()
            .chain(st.pin)
            .min()
            .unwrap_or(u64::MAX);
        while st.log.front().is_some_and(|(e, _)| *e < low) {
            st.log.pop_front();
        }
    }
    st.recent.push_back((Instant::now(), len, pause_us));
    while st.recent.len() > 500 {
        st.recent.pop_front();
    }
    sh.advance(&mut st);
    drop(st);
    sh.new_data.notify_all();
}

/// Whether the log holds every incremental checkpoint after full checkpoint `f`.
pub(super) fn continues(st: &State, f: u64) -> bool {
    match st.decision.produced {
        Some(p) if p > f => st.log.front().is_some_and(|(e, _)| *e <= f + 1),
        _ => true,
    }
}

/// A backup refused the stream because it holds the service in a newer view than this
/// primary's (see `Ack::newer_view`).
#[derive(Debug, thiserror::Error)]
#[error("{backup} holds the service in view {view}, newer than this primary's: {why}")]
pub(super) struct Deposed {
    pub(super) backup: String,
    pub(super) view: u64,
    pub(super) why: String,
}

/// Streams this run's checkpoints to backup `b` for as long as it is in the view.
pub(super) fn sender(sh: Arc<Shared>, b: String) {
    let mut backoff = Duration::from_millis(20);
    loop {
        if sh.stop.load(Ordering::SeqCst) || !sh.lock().view.backups.contains(&b) {
            break;
        }
        match stream_to(&sh, &b) {
            Ok(()) => break,
            Err(e) => {
                let deposed = e.downcast_ref::<Deposed>().map(|d| d.view);
                if deposed.is_none() {
                    tracing::warn!(service = %sh.name, backup = %b, %e, "checkpoint stream ended; the backup rejoins with a full checkpoint");
                }
                let mut st = sh.lock();
                st.decision.detach(&b);
                st.cursors.insert(b.clone(), u64::MAX);
                sh.advance(&mut st);
                if let Some(newer) = deposed {
                    // This primary is deposed (it has not heard of the newer view yet: cut off
                    // from the orchestrators, or late). A full checkpoint would be refused as
                    // well: none is taken, nothing is sent to `b` until this primary's view
                    // changes (or it stops, or `b` leaves its view).
                    tracing::warn!(service = %sh.name, backup = %b, %e, "deposed: nothing more is sent to this backup until this primary's view changes");
                    while !sh.stop.load(Ordering::SeqCst)
                        && st.view.number < newer
                        && st.view.backups.contains(&b)
                    {
                        st = sh
                            .new_data
                            .wait_timeout(st, Duration::from_millis(100))
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
    let mut st = sh.lock();
    st.cursors.remove(&b);
    if !st.view.backups.contains(&b) {
        // Out of the view: forgotten once that view is active (see `Decision::view_changed`;
        // until then decisions still wait for what `b` acknowledged).
        let active = st.view.active;
        st.decision.detach_kept(&b, active);
    }
    sh.advance(&mut st);
}

/// One connection to backup `b`: sends from the log until `b` leaves the view or the primary
/// stops (`Ok`), or until the stream fails or `b` refuses a checkpoint (`Err`).
pub(super) fn stream_to(sh: &Arc<Shared>, b: &str) -> anyhow::Result<()> {
    let api = sh
        .ctx
        .machine_api(b)
        .ok_or_else(|| anyhow::anyhow!("no address known for machine {b}"))?;
    let tls = sh.ctx.opts.security.stream_client();
    let mut conn = crate::stream::Connection::connect(&api, Duration::from_millis(500), tls)?;
    // Why the acknowledgements stopped, once they did (read by the sending loop).
    let ended: Arc<Mutex<Option<anyhow::Error>>> = Arc::default();
    let acks = {
        let mut conn = conn.try_clone()?;
        let (sh, b, ended) = (sh.clone(), b.to_string(), ended.clone());
        std::thread::Builder::new()
            .name(format!("acks-{b}"))
            .spawn(move || {
                let why = loop {
                    match conn.recv_ack() {
                        Ok(Some(a)) if a.newer_view > 0 => {
                            break anyhow::Error::new(Deposed {
                                backup: b.clone(),
                                view: a.newer_view,
                                why: a.error,
                            });
                        }
                        Ok(Some(a)) if !a.error.is_empty() => {
                            break anyhow::anyhow!("{b} refused epoch {}: {}", a.epoch, a.error);
                        }
                        Ok(Some(a)) => {
                            tracing::trace!(backup = %b, epoch = a.epoch, "acknowledged");
                            let mut st = sh.lock();
                            st.decision.acked.insert(b.clone(), a.epoch);
                            sh.advance(&mut st);
                        }
                        Ok(None) => break anyhow::anyhow!("{b} closed the stream"),
                        Err(e) => break anyhow::Error::from(e),
                    }
                };
                *ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                let _g = sh.lock();
                sh.new_data.notify_all();
            })?
    };
    let result = send_loop(sh, b, &mut conn, &ended);
    conn.shutdown();
    let _ = acks.join();
    let why = ended.lock().unwrap_or_else(|e| e.into_inner()).take();
    match (result, why) {
        (Err(e), _) => Err(e),
        // The acknowledgements ended first: that is why the loop stopped.
        (Ok(true), Some(why)) => Err(why),
        (Ok(_), _) => Ok(()),
    }
}

/// The sending half of [`stream_to`]. `Ok(true)`: stopped because the acknowledgements ended;
/// `Ok(false)`: `b` left the view or the primary stopped.
pub(super) fn send_loop(
    sh: &Arc<Shared>,
    b: &str,
    conn: &mut crate::stream::Connection,
    ended: &Mutex<Option<anyhow::Error>>,
) -> anyhow::Result<bool> {
    let throttle: Option<Arc<Throttle>> = sh.ctx.throttle.clone();
    let mut next: Option<u64> = None; // next incremental epoch to send
    loop {
        let (view, epoch, bytes, full) = {
            let mut st = sh.lock();
            loop {
                if ended.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                    return Ok(true);
                }
                if sh.stop.load(Ordering::SeqCst) || !st.view.backups.iter().any(|x| x == b) {
                    return Ok(false);
                }
                let view = st.view.number;
                if next.is_some() && !st.decision.full_at.contains_key(b) {
                    // The chain restarted (this backup was detached or dropped).
                    anyhow::bail!("the chain to {b} restarts with a full checkpoint");
                }
                let msg = match next {
                    // Joining: a full checkpoint the log still continues, or a new one.
                    None => match st.full.clone() {
                        Some((f, bytes)) if continues(&st, f) => {
                            next = Some(f + 1);
                            st.cursors.insert(b.to_string(), f + 1);
                            st.decision.full_at.insert(b.to_string(), f);
                            Some((view, f, bytes, true))
                        }
                        _ => {
                            st.full_wanted = true;
                            None
                        }
                    },
                    Some(n) => st
                        .log
                        .iter()
                        .find(|(e, _)| *e == n)
                        .map(|(e, bytes)| (view, *e, bytes.clone(), false)),
                };
                if let Some(m) = msg {
                    break m;
                }
                // Woken by `publish`, a view change, or the acknowledgements ending; the
                // timeout only bounds how late a missed case would be noticed.
                st = sh
                    .new_data
                    .wait_timeout(st, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        if let Some(t) = &throttle {
            let wait = t.take(bytes.len());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        let header = pb::CheckpointMsg {
            service: sh.name.clone(),
            view,
            primary: sh.machine.clone(),
            epoch,
            run: sh.run,
            data: Default::default(),
        };
        conn.send(&header, &bytes)
            .map_err(|e| anyhow::anyhow!("sending epoch {epoch} to {b}: {e}"))?;
        tracing::trace!(backup = %b, epoch, full, "sent");
        if !full {
            next = Some(epoch + 1);
            sh.lock().cursors.insert(b.to_string(), epoch + 1);
        }
    }
}
