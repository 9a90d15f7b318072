//! The primary role: run the service, take a checkpoint every epoch, stream checkpoints to the
//! backups, decide epochs and release their output.
//!
//! Threads and tasks:
//! - the *epoch thread* owns the service and its epoch loop. The loop's pause hook marks the
//!   epoch boundary in the output gate; each checkpoint is then serialised once and appended to
//!   the shared log. The gate's reader thread ends an epoch early when output is waiting
//!   (adaptive epochs), by setting the loop's trigger;
//! - one *sender* thread per backup streams the log to it over the checkpoint stream
//!   ([`crate::stream`]; after a full checkpoint, which a backup needs whenever it joins this
//!   primary's run), and one thread per stream reads its acknowledgements;
//! - acknowledgements update the decision ([`Decision`]); a newly decided epoch is released in
//!   the gate at once, from the thread that read the ack.
//!
//! Which backups an epoch waits for (`required`): those that already hold decided state when
//! this primary starts (the survivors of the last active view, at a takeover), and every backup
//! that has joined this run (acknowledged its full checkpoint; decisions then wait for it, so
//! it catches up with the decided epoch). A backup still receiving its full checkpoint is not
//! waited for: until it has joined and caught up, the view that adds it is not active, so it
//! could never be chosen to take over. The view is activated once every backup in it is
//! required and holds every decided epoch. A backup a new view leaves out stays required until
//! that view is active (a failover before then may still pick it), and a fresh deploy that
//! wants backups releases nothing before the first one joined (see [`Decision`]).
//!
//! A primary that hears neither the orchestrators' lease nor any backup for the failure
//! timeout fences itself ([`Primary::fence_if_cut_off`]).

use crate::throttle::Throttle;
use crate::{Ctx, Target};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tardi_checkpointer::epoch::{ChainState, EpochConfig, EpochHooks, Epochs};
use tardi_netfilter::{Gate, GateConfig, announce::ServiceAddress};
use tardi_proto as pb;
use tardi_service::Service;

mod decision;
mod epochs;
mod send;

pub(crate) use decision::Decision;
use epochs::*;
use send::*;

/// A checkpoint ready to send, in the checkpoint format; shared by every backup's stream.
type Bytes = tardi_proto::Bytes;

impl State {
    /// Nothing to wait for: the view has no backup, and none that a view left out is still
    /// required (until the view without it is active, see [`Decision::view_changed`]).
    fn alone(&self) -> bool {
        self.view.backups.is_empty() && self.decision.required.is_empty()
    }
}

struct State {
    view: pb::View,
    /// Incremental checkpoints not yet sent to every connected backup, in epoch order.
    log: VecDeque<(u64, Bytes)>,
    /// The newest full checkpoint and its epoch.
    full: Option<(u64, Bytes)>,
    /// A sender needs a full checkpoint the log can continue: take one at the next pause.
    full_wanted: bool,
    /// Full checkpoints taken since this primary started.
    fulls: u64,
    /// A full checkpoint of epoch `pin - 1` is being serialised: keep the log from `pin` on, so
    /// that it continues that checkpoint once it is published.
    pin: Option<u64>,
    decision: Decision,
    /// Where each connected sender is in the log (next epoch to send).
    cursors: BTreeMap<String, u64>,
    activation_asked: u64,
    phase: String,
    recent: VecDeque<(Instant, u64, u64)>, // (when, encoded bytes, pause µs)
    takeover_us: u64,
    /// Epochs published and not yet decided: (epoch, resumed, published), for [`Decided`].
    in_flight: VecDeque<(u64, Instant, Instant)>,
    /// The timing of the newest decided epoch that was in `in_flight`.
    last_decided: Option<crate::epoch_log::Decided>,
    /// Since when epochs have been waiting for the backups with no decision in between (`None`:
    /// every produced epoch is decided).
    waiting_since: Option<Instant>,
    /// Why this primary fenced itself ([`Primary::fence_if_cut_off`]): the epoch thread stops
    /// the service and fails with it.
    fenced: Option<String>,
}

/// A running primary.
pub struct Primary {
    pub service: String,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    name: String,
    machine: String,
    /// The view this primary run started in: names the run's checkpoint chain.
    run: u64,
    st: Mutex<State>,
    /// Signalled (with `st`) when the log, the full checkpoint or the view changed.
    new_data: Condvar,
    gate: Arc<Gate>,
    /// The view has no backup and no backup is still required ([`State::alone`]): nothing to
    /// wait for, so each epoch's output is released in its own pause (from the pause hook),
    /// not after the checkpoint is encoded and published.
    alone: Arc<AtomicBool>,
    stop: AtomicBool,
    ctx: Arc<Ctx>,
    address: Mutex<Option<String>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Releases what became decided and asks for activation when the view allows.
    fn advance(self: &Arc<Self>, st: &mut State) {
        st.decision.promote_joined();
        if let Some(d) = st.decision.decidable()
            && st.decision.decided.is_none_or(|old| d > old)
        {
            st.decision.decided = Some(d);
            st.waiting_since = (st.decision.decided < st.decision.produced).then(Instant::now);
            if let Err(e) = self.gate.release(d) {
                tracing::error!(service = %self.name, %e, "releasing output failed");
            }
            let now = Instant::now();
            while let Some(&(e, resumed, published)) = st.in_flight.front() {
                if e > d {
                    break;
                }
                st.in_flight.pop_front();
                if e == d {
                    st.last_decided = Some(crate::epoch_log::Decided {
                        epoch: e,
                        publish_us: published.duration_since(resumed).as_micros() as u64,
                        decide_us: now.duration_since(published).as_micros() as u64,
                    });
                }
            }
        }
        let everyone = st.view.backups.iter().all(|b| st.decision.holds_decided(b));
        if !st.view.active && everyone && st.activation_asked < st.view.number {
            st.activation_asked = st.view.number;
            let me = self.clone();
            let view = st.view.number;
            self.ctx.rt.spawn(async move { me.activate(view).await });
        }
    }

    async fn activate(self: Arc<Self>, view: u64) {
        match self.ctx.activate(&self.name, view).await {
            Ok(()) => {
                let mut st = self.lock();
                if st.view.number == view {
                    st.view.active = true;
                    let State { view, decision, .. } = &mut *st;
                    decision.view_changed(&view.backups, true);
                    self.alone.store(st.alone(), Ordering::SeqCst);
                    self.advance(&mut st);
                }
                tracing::info!(service = %self.name, view, "view active");
            }
            Err(e) => {
                tracing::warn!(service = %self.name, view, %e, "activation refused");
                // Ask again if the view is still this one (e.g. the orchestrator was away).
                tokio::time::sleep(Duration::from_millis(100)).await;
                let mut st = self.lock();
                if st.view.number == view && !st.view.active {
                    st.activation_asked = 0;
                    self.advance(&mut st);
                }
            }
        }
    }
}

/// A primary fences itself once both the orchestrators' lease and its backups have been silent
/// for this many leases (a lease is the failure timeout). One lease was measured to fence a
/// healthy primary on a loaded two-vCPU machine (both went quiet for ~100 ms while PostgreSQL
/// started under a debug build); the orchestrators' own detector had not suspected it.
pub(crate) const FENCE_AFTER_LEASES: u32 = 2;

/// A primary that could not start. A takeover's image is handed back: a restore only reads it,
/// so the machine can restore from it again (the orchestrator may ask it to, see
/// `Role::Failed`).
pub struct StartFailure {
    pub error: anyhow::Error,
    pub image: Option<Box<tardi_checkpointer::store::Image>>,
}

impl Primary {
    /// Starts the primary of `target`: fresh from its manifest, or restored from `image`
    /// (a backup's image, at a takeover). Survivors (`required`) are backups that already hold
    /// every decided checkpoint. On failure nothing is left running (sandbox, address, gate)
    /// and the image comes back.
    pub fn start(
        ctx: Arc<Ctx>,
        target: &Target,
        from: Option<tardi_checkpointer::store::Image>,
        required: BTreeSet<String>,
        gate: Option<Arc<Gate>>,
    ) -> Result<Primary, StartFailure> {
        let mut from = from;
        if let Some(img) = from.as_mut().filter(|_| ctx.opts.fault_drop_tcp) {
            tracing::warn!(service = %target.name, "restoring without the checkpoint's TCP connections on purpose (--fault-drop-tcp)");
            img.meta.drop_connections();
        }
        match Self::start_from(ctx, target, from.as_ref(), required, gate) {
            Ok(p) => {
                // Freeing a large image page by page takes tens of milliseconds: not on the
                // takeover's path.
                if let Some(img) = from {
                    std::thread::spawn(move || drop(img));
                }
                Ok(p)
            }
            Err(error) => Err(StartFailure {
                error,
                image: from.map(Box::new),
            }),
        }
    }

    fn start_from(
        ctx: Arc<Ctx>,
        target: &Target,
        from: Option<&tardi_checkpointer::store::Image>,
        required: BTreeSet<String>,
        gate: Option<Arc<Gate>>,
    ) -> anyhow::Result<Primary> {
        let t0 = Instant::now();
        let alone = target.view.backups.is_empty() && required.is_empty();
        let config = ctx.sandbox_config(target)?;
        // The gate exists before the sandbox: nothing the service sends can pass unheld, and
        // nothing reaches a half-restored service. A backup made it in advance.
        let gate = match gate {
            Some(g) => g,
            None => open_gate(target.link_index)?,
        };
        let shared = Arc::new(Shared {
            name: target.name.clone(),
            machine: ctx.opts.machine.clone(),
            run: target.view.number,
            st: Mutex::new(State {
                view: target.view.clone(),
                log: VecDeque::new(),
                full: None,
                full_wanted: false,
                fulls: 0,
                pin: None,
                decision: Decision {
                    unprotected: from.is_none() && !target.view.backups.is_empty(),
                    required,
                    ..Default::default()
                },
                cursors: BTreeMap::new(),
                activation_asked: 0,
                phase: if from.is_some() {
                    "restoring"
                } else {
                    "starting"
                }
                .into(),
                recent: VecDeque::new(),
                takeover_us: 0,
                in_flight: VecDeque::new(),
                last_decided: None,
                waiting_since: None,
                fenced: None,
            }),
            new_data: Condvar::new(),
            gate,
            alone: Arc::new(AtomicBool::new(alone)),
            stop: AtomicBool::new(false),
            ctx: ctx.clone(),
            address: Mutex::new(None),
        });
        // Claiming the address (proxy ARP entry, gratuitous ARP) does not need the service:
        // at a takeover it runs while the restorer fills the process, once the sandbox's
        // address is routed here (the kernel answers ARP for a proxy entry only then; claimed
        // earlier, a client's first pings were answered ~50 ms late in some trials). What the
        // client sends meanwhile is held by the gate: input is held until the restore is done.
        let mut early_claim = None;
        // The service's TCP connections that the restore resets (those the checkpoint does not
        // carry): their clients are told at once (see `tardi_netfilter::probe`) rather than
        // after their retransmission timeout.
        let conns = from
            .map(|img| tcp_connections(&img.meta))
            .unwrap_or_default();
        let svc = match from {
            None => {
                ctx.seed_private_dirs(target, &config)?;
                let svc = Service::start(&target.manifest, &config)?;
                // A service that forks its workers as it starts (nginx, PostgreSQL) is tracked
                // once its tree stops changing: the epoch loop would capture each process that
                // appears after its first pause whole, again (`docs/PROCESS-TREES.md`). Its
                // output is held until then (the gate is up; nothing is decided before the
                // first checkpoint).
                svc.wait_settled(Duration::from_millis(300), Duration::from_secs(10));
                svc
            }
            Some(img) => {
                let iface = ctx.opts.service_if.clone();
                let fault = ctx.opts.fault_restore.as_deref();
                let routed = |addr| {
                    if let Some(why) = fault.and_then(injected_fault) {
                        return Err(why);
                    }
                    early_claim = Some(std::thread::spawn(move || {
                        ServiceAddress::claim(addr, &iface)
                    }));
                    Ok(())
                };
                let (svc, t) = Service::restore_image(img, config, routed)?;
                tracing::warn!(service = %target.name, timings = ?t, "restored from the backup image");
                svc
            }
        };
        let claim = match early_claim {
            Some(h) => h
                .join()
                .map_err(|_| anyhow::anyhow!("claiming the service address panicked"))??,
            None => ServiceAddress::claim(svc.address(), &ctx.opts.service_if)?,
        };
        if !conns.is_empty() {
            let name = target.name.clone();
            std::thread::spawn(
                move || match tardi_netfilter::probe::probe_clients(&conns) {
                    Ok(n) => {
                        tracing::info!(service = %name, probed = n, "told the clients of reset connections")
                    }
                    Err(e) => {
                        tracing::warn!(service = %name, error = %e, "probing the clients of reset connections failed")
                    }
                },
            );
        }
        // Input flows as soon as `hold_input(false)` has flushed what was held; removing the
        // rule afterwards takes tens of milliseconds and need not delay the epoch loop. (A
        // client's answer to a probe that arrives before is held, then let through.)
        {
            let gate = shared.gate.clone();
            let name = target.name.clone();
            std::thread::spawn(move || {
                if let Err(e) = gate.hold_input(false) {
                    tracing::error!(service = %name, error = %e, "releasing input failed");
                }
            });
        }
        *shared.address.lock().unwrap_or_else(|e| e.into_inner()) = Some(svc.address().to_string());
        {
            let mut st = shared.lock();
            st.takeover_us = t0.elapsed().as_micros() as u64;
        }
        tracing::warn!(service = %target.name, view = target.view.number, address = %svc.address(), took_ms = t0.elapsed().as_millis() as u64, "primary serving");
        let cfg = tardi_service::epoch_config(&target.manifest, svc.private_dirs());
        let me = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("primary-{}", target.name))
            .spawn(move || {
                let r = epoch_thread(&me, svc, cfg);
                drop(claim);
                if let Err(e) = r {
                    tracing::error!(service = %me.name, error = %e, "primary failed");
                    me.lock().phase = format!("failed: {e}");
                    // The daemon turns it into a failed role (and drops the gate with it).
                    me.ctx.wake();
                }
            })?;
        let p = Primary {
            service: target.name.clone(),
            shared,
            thread: Some(thread),
        };
        p.set_view(&target.view);
        Ok(p)
    }

    /// A new view with this machine still primary: start a sender for each backup that has
    /// none (a sender ends by itself once its backup leaves the view).
    pub fn set_view(&self, view: &pb::View) {
        let sh = &self.shared;
        let mut st = sh.lock();
        if view.number < st.view.number {
            return;
        }
        st.view = view.clone();
        st.decision.view_changed(&view.backups, view.active);
        // Set before any sender asks for a full checkpoint: an epoch released alone is older
        // than any joiner's full checkpoint.
        sh.alone.store(st.alone(), Ordering::SeqCst);
        for b in &view.backups {
            if !st.cursors.contains_key(b) {
                st.cursors.insert(b.clone(), u64::MAX);
                let me = sh.clone();
                let b = b.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("send-{b}"))
                    .spawn(move || sender(me, b));
                if let Err(e) = spawned {
                    tracing::error!(service = %sh.name, error = %e, "no thread for a backup's stream");
                }
            }
        }
        sh.advance(&mut st);
        drop(st);
        sh.new_data.notify_all();
    }

    pub fn report(&self) -> pb::ServiceReport {
        let st = self.shared.lock();
        let stats = self.shared.gate.stats();
        let (rate, bytes, p50, p99) = summarize(&st.recent);
        pb::ServiceReport {
            service: self.service.clone(),
            view: st.view.number,
            role: pb::Role::Primary as i32,
            state: st.phase.clone(),
            epoch: st.decision.produced.unwrap_or(0),
            decided: st.decision.decided.unwrap_or(0),
            epochs_per_sec: rate,
            checkpoint_bytes: bytes,
            backup_lag: st.decision.produced.unwrap_or(0)
                - st.decision
                    .decided
                    .unwrap_or(0)
                    .min(st.decision.produced.unwrap_or(0)),
            held_packets: stats.held_packets,
            held_bytes: stats.held_bytes,
            // Its run; none once it failed: a primary holds no image a takeover could use (the
            // orchestrator must not count it as a holder of the state).
            image_view: if st.phase.starts_with("failed") {
                0
            } else {
                self.shared.run
            },
            address: self
                .shared
                .address
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default(),
            takeover_us: st.takeover_us,
            pause_p50_us: p50,
            pause_p99_us: p99,
            full_checkpoints: st.fulls,
            ..Default::default()
        }
    }

    /// The view this primary serves.
    pub fn view(&self) -> u64 {
        self.shared.lock().view.number
    }

    pub fn failed(&self) -> bool {
        self.shared.lock().phase.starts_with("failed")
    }

    /// Why it failed (its phase without the `failed: ` prefix), if it did.
    pub fn failure(&self) -> Option<String> {
        let st = self.shared.lock();
        st.phase
            .strip_prefix("failed")
            .map(|w| w.trim_start_matches(':').trim().to_string())
    }

    /// Fences this primary if it is cut off: the orchestrators' lease ran out (`silent`, no
    /// renewal from a leader a majority follows for [`FENCE_AFTER_LEASES`] leases, see
    /// [`crate::Roles::fence_cut_off`]) and its backups kept it waiting as long.
    ///
    /// The fence *freezes* the service: the epoch thread takes one more checkpoint and keeps
    /// the process stopped in that state, running nothing (no CPU, no effect on its files),
    /// its output held as it was. It does not kill it: from here the primary cannot tell a
    /// partition of its own machine (the orchestrators move the service to a backup) from its
    /// backups and the orchestrators' leader failing together (a backup's power cut during an
    /// election: then this process is the only copy of the state, and killing it loses
    /// acknowledged writes; the suite met exactly that). Healed, the orchestrators' word
    /// decides: a newer view without this machine stops the service for good (the daemon's
    /// reconcile), a lease renewed while it still leads thaws it ([`Primary::thaw`]).
    ///
    /// A primary no backup is required for (alone in its view, or on a fresh deploy before
    /// its first backup joined: a full checkpoint of a large service takes seconds, during
    /// which no backup acknowledges anything) is never fenced. Whether it fenced itself now.
    pub fn fence_if_cut_off(&self, lease: Duration, silent: Duration) -> bool {
        let sh = &self.shared;
        let mut st = sh.lock();
        // How long the backups have kept this primary waiting: since an epoch was published or
        // decided, while one stays undecided (a primary that produced nothing, in a long pause
        // say, waits for no one).
        let quiet = st.waiting_since.map_or(Duration::ZERO, |t| t.elapsed());
        if st.decision.required.is_empty()
            || st.fenced.is_some()
            || st.phase.starts_with("failed")
            || quiet <= lease * FENCE_AFTER_LEASES
        {
            return false;
        }
        let why = format!(
            "fenced: no word from a majority of the orchestrators for {} ms and no backup's acknowledgement for {} ms (lease {} ms)",
            silent.as_millis(),
            quiet.as_millis(),
            lease.as_millis()
        );
        tracing::warn!(service = %sh.name, view = st.view.number, %why, "primary cut off: freezing its service");
        st.fenced = Some(why);
        drop(st);
        sh.new_data.notify_all();
        true
    }

    /// Thaws a frozen primary: the orchestrators' lease is renewed and this machine is still
    /// the primary of the view it holds (a newer view would have stopped it). Whether it was
    /// frozen.
    pub fn thaw(&self) -> bool {
        let sh = &self.shared;
        let mut st = sh.lock();
        if st.fenced.take().is_none() {
            return false;
        }
        tracing::warn!(service = %sh.name, view = st.view.number, "the orchestrators' lease is back: thawing the service");
        st.waiting_since = None;
        drop(st);
        sh.new_data.notify_all();
        true
    }

    /// Whether the fence froze it.
    pub fn frozen(&self) -> bool {
        self.shared.lock().fenced.is_some()
    }

    /// Stops checkpointing and tears the service down (its output stays held: never released).
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.new_data.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.new_data.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn summarize(recent: &VecDeque<(Instant, u64, u64)>) -> (f64, u64, u64, u64) {
    if recent.len() < 2 {
        return (0.0, 0, 0, 0);
    }
    let span = recent
        .back()
        .map(|b| b.0.duration_since(recent[0].0).as_secs_f64())
        .unwrap_or(0.0);
    let rate = if span > 0.0 {
        (recent.len() - 1) as f64 / span
    } else {
        0.0
    };
    let bytes = recent.iter().map(|r| r.1).sum::<u64>() / recent.len() as u64;
    let mut pauses: Vec<u64> = recent.iter().map(|r| r.2).collect();
    pauses.sort_unstable();
    let pick = |q: f64| pauses[((pauses.len() - 1) as f64 * q).round() as usize];
    (rate, bytes, pick(0.5), pick(0.99))
}

/// Testing only (`tardi instance --fault-restore FILE`): whether this takeover's restore is to
/// fail, and the error it fails with. It fails if this instance removes `file`: instances given
/// the same file share one fault, and the first takeover among them takes it.
fn injected_fault(file: &std::path::Path) -> Option<String> {
    std::fs::remove_file(file).ok()?;
    tracing::warn!(file = %file.display(), "failing this restore on purpose (--fault-restore)");
    Some(format!(
        "fault injected for testing (--fault-restore {})",
        file.display()
    ))
}

/// The output gate of the service on link `link_index`, holding output and input: a sandbox
/// started behind it sends nothing unheld and receives nothing until [`Gate::hold_input`] is
/// lifted. Two queues per gate (output, input), numbered from the link index: unique on a
/// machine. Creating it runs `nft` and `iptables` (tens of milliseconds): backups do it in
/// advance, off the failover path.
pub fn open_gate(link_index: u32) -> anyhow::Result<Arc<Gate>> {
    open_gate_in(link_index, tardi_netfilter::Mode::Hold)
}

/// [`open_gate`] with its output in `mode` (`Pass`: only the input is held, as `tardi snapshot
/// --stop` and `tardi restore` of its file need around the sandbox's connections).
pub fn open_gate_in(link_index: u32, mode: tardi_netfilter::Mode) -> anyhow::Result<Arc<Gate>> {
    let mut cfg = GateConfig::new(
        tardi_sandbox::net::host_if(link_index),
        (2 * link_index) as u16,
    );
    cfg.mode = mode;
    let gate = Gate::new(cfg)?;
    gate.hold_input(true)?;
    Ok(Arc::new(gate))
}

#[cfg(test)]
mod tests {
    use super::{Decision, sockaddr};

    /// Decides what can be decided (never going back, as `Shared::advance`).
    fn decide(d: &mut Decision) {
        if let Some(x) = d.decidable()
            && d.decided.is_none_or(|old| x > old)
        {
            d.decided = Some(x);
        }
    }

    fn acked(d: &mut Decision, b: &str, e: u64) {
        d.acked.insert(b.into(), e);
        d.promote_joined();
        decide(d);
    }

    #[test]
    fn raw_socket_addresses_parse() {
        let mut v4 = vec![0u8; 16];
        v4[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&6379u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[10, 213, 0, 6]);
        assert_eq!(sockaddr(&v4), Some("10.213.0.6:6379".parse().unwrap()));
        let mut v6 = vec![0u8; 28];
        v6[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&80u16.to_be_bytes());
        v6[8..24].copy_from_slice(&"fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        assert_eq!(sockaddr(&v6), Some("[fd00::1]:80".parse().unwrap()));
        assert_eq!(sockaddr(&[]), None);
        assert_eq!(sockaddr(&v4[..6]), None, "truncated");
        let mut unix = v4.clone();
        unix[0..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(sockaddr(&unix), None);
    }

    /// Issue 26, item 1: B2 is suspected and a view without it is proposed. Decisions keep
    /// waiting for B2 until that view is active (a failover before then can pick B2, from the
    /// last active view, and B2 must hold every released epoch); then only B1 counts. On the
    /// old rule (forget on the proposal) the primary released epoch 9 on B1 alone.
    #[test]
    fn a_backup_dropped_by_a_proposed_view_is_waited_for_until_it_is_active() {
        let (b1, b2) = ("m2".to_string(), "m3".to_string());
        let mut d = Decision::default();
        for b in [&b1, &b2] {
            d.full_at.insert(b.clone(), 0);
        }
        d.produced = Some(5);
        acked(&mut d, &b1, 5);
        acked(&mut d, &b2, 5);
        assert_eq!(d.decided, Some(5));
        // Proposed: [m2]. m3's stream stops (its sender ends); m2 goes on acknowledging.
        d.view_changed([&b1], false);
        d.detach_kept(&b2, false);
        d.produced = Some(9);
        acked(&mut d, &b1, 9);
        assert_eq!(
            d.decided,
            Some(5),
            "released on m2 alone while m3 may still take over"
        );
        assert!(d.holds_decided(&b2), "m3 holds every released epoch");
        // Active: m3 is no candidate any more.
        d.view_changed([&b1], true);
        decide(&mut d);
        assert_eq!(d.decided, Some(9));
        assert!(!d.required.contains(&b2));
    }

    #[test]
    fn decisions_wait_for_required_backups_even_when_their_streams_break() {
        let mut d = Decision {
            required: ["m2".to_string()].into(),
            produced: Some(5),
            ..Default::default()
        };
        assert_eq!(
            d.decidable(),
            None,
            "a survivor's acknowledgement is awaited"
        );
        d.full_at.insert("m2".into(), 0);
        acked(&mut d, "m2", 3);
        assert_eq!(d.decided, Some(3));
        // The stream to m2 breaks (say m2 refuses: it is in a newer view): nothing more is
        // decided until m2 rejoins or a new view drops it.
        d.detach("m2");
        d.produced = Some(9);
        assert_eq!(d.decidable(), None);
        d.forget("m2");
        assert_eq!(
            d.decidable(),
            Some(9),
            "a view without backups decides alone"
        );
    }

    #[test]
    fn a_joining_backup_is_awaited_once_it_caught_up() {
        let mut d = Decision {
            produced: Some(10),
            decided: Some(10),
            ..Default::default()
        };
        d.full_at.insert("m3".into(), 12);
        d.produced = Some(12);
        acked(&mut d, "m3", 11);
        assert!(
            d.required.is_empty(),
            "not before it acknowledged its full checkpoint"
        );
        acked(&mut d, "m3", 12);
        assert!(d.required.contains("m3"));
        d.produced = Some(14);
        assert_eq!(
            d.decidable(),
            Some(12),
            "from then on its acknowledgements count"
        );
    }

    /// Issue 26, item 2: a fresh deploy with backups releases nothing before the first backup
    /// holds the service (on the old rule, with nobody required yet, every epoch was decided
    /// at once, and a primary dying then restarted the service from nothing after its replies
    /// had left).
    #[test]
    fn a_fresh_deploy_releases_nothing_before_a_backup_joined() {
        let mut d = Decision {
            unprotected: true,
            ..Default::default()
        };
        d.full_at.insert("m2".into(), 0);
        for e in 0..=3 {
            d.produced = Some(e);
            decide(&mut d);
            assert_eq!(d.decided, None, "epoch {e} released unprotected");
        }
        acked(&mut d, "m2", 0);
        assert!(!d.unprotected && d.required.contains("m2"));
        assert_eq!(d.decided, Some(0), "what m2 holds");
        acked(&mut d, "m2", 3);
        assert_eq!(d.decided, Some(3));
    }

    /// Each epoch is produced (and, with no backup required yet, decided at once) before the
    /// joiner's acknowledgement of the previous one arrives: it joins all the same, decisions
    /// then wait for it, and it holds every decided epoch once it caught up.
    #[test]
    fn a_joining_backup_one_epoch_behind_still_joins() {
        let mut d = Decision {
            produced: Some(10),
            decided: Some(10),
            ..Default::default()
        };
        d.full_at.insert("m3".into(), 10);
        d.produced = Some(11);
        decide(&mut d);
        assert_eq!(d.decided, Some(11), "nobody required: decided at once");
        acked(&mut d, "m3", 10);
        assert!(d.required.contains("m3"), "joined: decisions wait for it");
        assert!(!d.holds_decided("m3"), "one epoch behind the decided one");
        d.produced = Some(12);
        decide(&mut d);
        assert_eq!(d.decided, Some(11), "epoch 12 waits for m3");
        acked(&mut d, "m3", 11);
        assert!(
            d.holds_decided("m3"),
            "caught up: the view may be activated"
        );
        acked(&mut d, "m3", 12);
        assert_eq!(d.decided, Some(12));
    }
}
