//! [`Gate`]: one sandbox's output gate. See the crate documentation for the model.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cmd::Netns;
use crate::error::{NetfilterError, Result};
use crate::nfq::{self, Event, NF_ACCEPT, NF_DROP, QueueSocket, RecvBufs};
use crate::rules::{self, Backend, Rules};

/// What a gate does with the sandbox's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Output is queued and released per epoch, once decided (the primary).
    Hold,
    /// All output is dropped (a machine that is not the primary: only the primary sends).
    Drop,
    /// Nothing is held (tests, unreplicated services).
    Pass,
}

/// How to build a [`Gate`].
#[derive(Clone, Debug)]
pub struct GateConfig {
    /// The host side of the sandbox's veth pair, in the namespace where the gate is created.
    pub host_if: String,
    /// NFQUEUE number for the sandbox's output. Queue numbers are per network namespace: every
    /// gate of a namespace needs its own two.
    pub queue_num: u16,
    /// NFQUEUE number for packets to the sandbox while input is held ([`Gate::hold_input`]).
    pub input_queue_num: u16,
    /// The mode the gate starts in.
    pub mode: Mode,
    /// Packets the kernel holds per queue before it drops (never accepts) new ones.
    pub queue_maxlen: u32,
    /// Receive buffer of the queue socket, bytes (~1 KiB per packet message in flight).
    pub rcvbuf: usize,
}

impl GateConfig {
    /// Hold mode, input queue `queue_num + 1`, 65,536 packets per queue, 16 MiB receive buffer.
    pub fn new(host_if: impl Into<String>, queue_num: u16) -> GateConfig {
        GateConfig {
            host_if: host_if.into(),
            queue_num,
            input_queue_num: queue_num.wrapping_add(1),
            mode: Mode::Hold,
            queue_maxlen: 65536,
            rcvbuf: 16 << 20,
        }
    }
}

/// A snapshot of a gate's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateStats {
    pub mode: Mode,
    pub backend: Backend,
    /// Output packets held now (read from the queue, not yet released).
    pub held_packets: u64,
    pub held_bytes: u64,
    /// How long the oldest held output packet has been held.
    pub oldest_held_age: Option<Duration>,
    /// Packets to the sandbox held now ([`Gate::hold_input`]).
    pub input_held_packets: u64,
    /// Output released so far (by [`Gate::release`], and by switching to Pass).
    pub released_packets: u64,
    pub released_bytes: u64,
    /// Packets to the sandbox released so far.
    pub input_released_packets: u64,
    /// Held output dropped by switching to Drop mode.
    pub discarded_packets: u64,
    /// Packets the kernel dropped because a queue was full or the socket's receive buffer was
    /// (both queues; `queue_dropped + queue_user_dropped` of
    /// `/proc/net/netfilter/nfnetlink_queue`).
    pub kernel_dropped: u64,
    /// Output packets the kernel holds in the queue now (read by us or not). Below
    /// `held_packets` when the kernel dropped held packets itself (an interface went away, or
    /// someone deleted a base chain in the namespace: see the crate documentation).
    pub kernel_queued: u64,
    /// Times the socket reported an overflow (`ENOBUFS`).
    pub socket_overflows: u64,
    /// Verdicts the kernel refused (see the log).
    pub verdict_errors: u64,
    /// `discarded_packets + kernel_dropped`. Packets dropped by the Drop-mode rule itself are
    /// in [`Gate::dropped_by_rules`] (it asks `nft`, so it is not part of this cheap snapshot).
    pub dropped_total: u64,
    pub last_marked: u64,
    pub last_released: u64,
}

/// One sandbox's output gate, on the host side of its veth. Created by the instance in the
/// network namespace where the sandbox's host-side interface lives. Drop removes every rule and
/// table it created and nothing else; output still held is dropped, never sent. (After that,
/// the sandbox's traffic is not filtered any more: drop the gate once the sandbox is stopped.)
pub struct Gate {
    shared: Arc<Shared>,
    control: Mutex<Control>,
    reader: Option<JoinHandle<()>>,
}

/// What changes rules; one change at a time.
struct Control {
    rules: Rules,
    mode: Mode,
    input_held: bool,
}

/// What the reader thread and the callers share.
struct Shared {
    sock: QueueSocket,
    out_queue: u16,
    in_queue: u16,
    /// The epoch open now: a packet read while it is `n` belongs to epoch `n`. It starts at 0
    /// and `mark(e)` makes it `e + 1` (so "nothing marked yet" and "epoch 0 marked" differ).
    open: AtomicU64,
    /// The last epoch released.
    released: AtomicU64,
    /// One more than the epoch of the newest held output packet; 0: none (for
    /// `output_waiting`).
    newest_out: AtomicU64,
    held: Mutex<Held>,
    /// Serializes verdicts, so that they reach the kernel in the order the lists were cut.
    sender: Mutex<()>,
    waiters: AtomicUsize,
    /// Called by the reader on the first output packet of each epoch (see
    /// [`Gate::on_output`]).
    on_output: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Called by [`Gate::release`] with the epoch released, once its packets are sent (see
    /// [`Gate::on_release`]).
    on_release: std::sync::OnceLock<Box<dyn Fn(u64, u64) + Send + Sync>>,
    /// Called by the reader on every read that queued output (see [`Gate::on_each_output`]).
    on_each_output: std::sync::OnceLock<Box<dyn Fn(u64) + Send + Sync>>,
    wait_lock: Mutex<()>,
    wait_cv: Condvar,
    released_packets: AtomicU64,
    released_bytes: AtomicU64,
    input_released: AtomicU64,
    discarded: AtomicU64,
    overflows: AtomicU64,
    /// Input is no longer held, but the input rule may still queue packets (its removal takes
    /// tens of milliseconds): the reader accepts them as they come instead of holding them.
    input_open: AtomicBool,
    verdict_errors: AtomicU64,
    /// Why the reader stopped, if it did.
    reader_error: Mutex<Option<String>>,
    /// Wakes the reader to stop.
    stop: OwnedFd,
    /// `/proc/net/netfilter/nfnetlink_queue` of the gate's namespace.
    proc_queues: File,
}

#[derive(Default)]
struct Held {
    out: List,
    input: List,
}

/// Packets of one queue, in id order.
#[derive(Default)]
struct List {
    entries: VecDeque<Entry>,
    bytes: u64,
    /// The highest id a verdict was sent for: later messages with ids up to it are stale.
    through: Option<u32>,
}

struct Entry {
    id: u32,
    epoch: u64,
    len: u32,
    at: Instant,
}

impl List {
    fn push(&mut self, id: u32, epoch: u64, len: u32, at: Instant) -> bool {
        if self.through.is_some_and(|t| !nfq::id_after(id, t)) {
            return false;
        }
        if let Some(last) = self.entries.back()
            && !nfq::id_after(id, last.id)
        {
            tracing::warn!(id, last = last.id, "NFQUEUE id out of order; ignoring it");
            return false;
        }
        self.entries.push_back(Entry { id, epoch, len, at });
        self.bytes += u64::from(len);
        true
    }

    /// Removes the first `n` entries (a verdict up to the last of them was sent); returns their
    /// bytes.
    fn cut(&mut self, n: usize) -> u64 {
        let mut bytes = 0;
        for e in self.entries.drain(..n) {
            bytes += u64::from(e.len);
            self.through = Some(e.id);
        }
        self.bytes -= bytes;
        bytes
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (no multi-step updates
    // are interrupted by anything that can panic), so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gate {
    /// Installs the rules, binds the queues and starts the reader thread. Call it on a thread
    /// that is in the network namespace of `cfg.host_if`.
    pub fn new(cfg: GateConfig) -> Result<Gate> {
        rules::check_ifname(&cfg.host_if)?;
        if cfg.queue_num == cfg.input_queue_num {
            return Err(NetfilterError::InvalidConfig(format!(
                "queue_num and input_queue_num are both {}",
                cfg.queue_num
            )));
        }
        if cfg.queue_maxlen == 0 {
            return Err(NetfilterError::InvalidConfig("queue_maxlen is 0".into()));
        }
        let ns = Netns::current()?;
        let proc_path = "/proc/thread-self/net/netfilter/nfnetlink_queue";
        let proc_queues = File::open(proc_path).map_err(|source| NetfilterError::Proc {
            action: "opening (is CONFIG_NETFILTER_NETLINK_QUEUE enabled?)",
            path: proc_path.into(),
            source,
        })?;
        // The queues are bound before any rule sends packets to them.
        let sock = QueueSocket::open(cfg.rcvbuf)?;
        let mut early = Vec::new();
        sock.bind_queue(cfg.queue_num, cfg.queue_maxlen, &mut early)?;
        sock.bind_queue(cfg.input_queue_num, cfg.queue_maxlen, &mut early)?;
        // SAFETY: plain eventfd(2) call; the result is checked.
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop < 0 {
            return Err(NetfilterError::last_os("eventfd"));
        }
        // SAFETY: `stop` was just created and is owned by nobody else.
        let stop = unsafe { OwnedFd::from_raw_fd(stop) };
        let shared = Arc::new(Shared {
            sock,
            out_queue: cfg.queue_num,
            in_queue: cfg.input_queue_num,
            open: AtomicU64::new(0),
            released: AtomicU64::new(0),
            newest_out: AtomicU64::new(0),
            held: Mutex::new(Held::default()),
            sender: Mutex::new(()),
            waiters: AtomicUsize::new(0),
            on_output: std::sync::OnceLock::new(),
            on_release: std::sync::OnceLock::new(),
            on_each_output: std::sync::OnceLock::new(),
            wait_lock: Mutex::new(()),
            wait_cv: Condvar::new(),
            released_packets: AtomicU64::new(0),
            released_bytes: AtomicU64::new(0),
            input_released: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
            input_open: AtomicBool::new(false),
            verdict_errors: AtomicU64::new(0),
            reader_error: Mutex::new(None),
            stop,
            proc_queues,
        });
        shared.take(&early);
        let rules = Rules::install(
            ns,
            &cfg.host_if,
            cfg.queue_num,
            cfg.input_queue_num,
            cfg.mode,
        )?;
        let reader = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("gate-{}", cfg.host_if))
                .spawn(move || shared.read_loop())
                .map_err(|source| NetfilterError::Syscall {
                    call: "spawning the gate's reader thread",
                    source,
                })?
        };
        tracing::info!(
            host_if = %cfg.host_if, queue = cfg.queue_num, input_queue = cfg.input_queue_num,
            mode = ?cfg.mode, backend = ?rules.backend(), "gate installed"
        );
        Ok(Gate {
            shared,
            control: Mutex::new(Control {
                rules,
                mode: cfg.mode,
                input_held: false,
            }),
            reader: Some(reader),
        })
    }

    /// Switches the mode. To Drop: the drop rule goes in first, then every held packet is
    /// dropped. To Pass: every held packet is accepted (packets read later than the switch may
    /// overtake a few of them). To Hold: output is queued from now on.
    pub fn set_mode(&self, mode: Mode) -> Result<()> {
        self.shared.check_reader()?;
        let mut c = lock(&self.control);
        if c.mode == mode {
            return Ok(());
        }
        c.rules.set_mode(c.mode, mode)?;
        let old = std::mem::replace(&mut c.mode, mode);
        tracing::info!(from = ?old, to = ?mode, "gate mode");
        match mode {
            Mode::Drop => {
                let (n, _) = self.shared.flush(self.shared.out_queue, NF_DROP)?;
                self.shared.discarded.fetch_add(n, SeqCst);
            }
            Mode::Pass => {
                let (n, bytes) = self.shared.flush(self.shared.out_queue, NF_ACCEPT)?;
                self.shared.released_packets.fetch_add(n, SeqCst);
                self.shared.released_bytes.fetch_add(bytes, SeqCst);
            }
            Mode::Hold => {}
        }
        Ok(())
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        lock(&self.control).mode
    }

    /// How this kernel queues packets.
    pub fn backend(&self) -> Backend {
        lock(&self.control).rules.backend()
    }

    /// Called inside the checkpoint pause of epoch `epoch` (service stopped): every packet read
    /// so far belongs to an epoch `<= epoch`, packets read later to later epochs. One atomic
    /// operation; a number lower than the last one is ignored.
    ///
    /// Why it is safe: a packet sent before the pause but read after the mark is attributed to
    /// the next epoch and released one epoch late; a packet sent after the pause is read after
    /// the mark, so it can never be attributed to an earlier epoch.
    pub fn mark(&self, epoch: u64) {
        self.shared.open.fetch_max(epoch.saturating_add(1), SeqCst);
    }

    /// Epoch `decided` and all before it are decided: accepts every held packet of those
    /// epochs, in order, with one batch verdict (the kernel sends them on this thread: ~2 µs
    /// per packet). Idempotent; a lower number than before is a no-op. Epochs after the last
    /// [`mark`](Gate::mark) are not released: their packets belong to no checkpoint yet.
    pub fn release(&self, decided: u64) -> Result<()> {
        let s = &self.shared;
        s.check_reader()?;
        let Some(marked) = s.open.load(SeqCst).checked_sub(1) else {
            return Ok(()); // nothing marked yet: no packet belongs to a checkpoint
        };
        if decided > marked {
            tracing::debug!(
                decided,
                marked,
                "release beyond the last mark: up to the mark"
            );
        }
        let upto = decided.min(marked);
        let mut released = 0;
        let _sending = lock(&s.sender);
        // Entries only leave the list here (under `sender`), and the reader only appends, so
        // the first `n` entries stay put while the verdict is sent without the list's lock.
        let (n, last_id) = {
            let held = lock(&s.held);
            let n = held.out.entries.partition_point(|e| e.epoch <= upto);
            (n, n.checked_sub(1).map(|i| held.out.entries[i].id))
        };
        if let Some(id) = last_id {
            s.sock
                .verdict_batch(s.out_queue, NF_ACCEPT, id)
                .map_err(|source| NetfilterError::Syscall {
                    call: "sending an NFQUEUE batch verdict",
                    source,
                })?;
            let bytes = lock(&s.held).out.cut(n);
            s.released_packets.fetch_add(n as u64, SeqCst);
            released = n;
            s.released_bytes.fetch_add(bytes, SeqCst);
            tracing::trace!(upto, packets = n, bytes, "released");
        }
        s.released.fetch_max(upto, SeqCst);
        if let Some(f) = s.on_release.get() {
            f(upto, released as u64);
        }
        Ok(())
    }

    /// Some packet of the current (unmarked) epoch is held.
    pub fn output_waiting(&self) -> bool {
        self.shared.output_waiting()
    }

    /// Has the reader thread call `f` when the first output packet of an epoch is queued (the
    /// moment [`output_waiting`](Gate::output_waiting) turns true), with no hand-off to another
    /// thread: `f` must be quick and must not block (setting a flag or a condition variable).
    /// Once per gate; a second call returns `false` and changes nothing.
    pub fn on_output(&self, f: Box<dyn Fn() + Send + Sync>) -> bool {
        self.shared.on_output.set(f).is_ok()
    }

    /// Has [`release`](Gate::release) call `f` with the last epoch it released, right after the
    /// verdict that sent its packets (also when it held none). Same rules as
    /// [`on_output`](Gate::on_output): quick, non-blocking, once per gate.
    pub fn on_release(&self, f: Box<dyn Fn(u64, u64) + Send + Sync>) -> bool {
        self.shared.on_release.set(f).is_ok()
    }

    /// Has the reader thread call `f` after every read that queued output packets (before
    /// [`on_output`](Gate::on_output)'s callback when it is an epoch's first). Same rules.
    pub fn on_each_output(&self, f: Box<dyn Fn(u64) + Send + Sync>) -> bool {
        self.shared.on_each_output.set(f).is_ok()
    }

    /// Blocks until [`output_waiting`](Gate::output_waiting) or `timeout`; returns the former.
    pub fn wait_output(&self, timeout: Duration) -> bool {
        let s = &self.shared;
        if s.output_waiting() {
            return true;
        }
        let deadline = Instant::now() + timeout;
        // The reader stores `newest_out` and then looks at `waiters`; we count ourselves in and
        // then look at `newest_out` (all SeqCst): one of the two sees the other.
        s.waiters.fetch_add(1, SeqCst);
        let mut guard = lock(&s.wait_lock);
        let waiting = loop {
            if s.output_waiting() {
                break true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break false;
            }
            guard = s
                .wait_cv
                .wait_timeout(guard, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(guard);
        s.waiters.fetch_sub(1, SeqCst);
        waiting
    }

    /// While a sandbox is being restored, holds packets *to* it (queued in the input queue);
    /// `hold_input(false)` accepts them all, in order, and stops holding. (Packets that arrive
    /// during the switch-off itself may overtake the last few held ones.)
    pub fn hold_input(&self, hold: bool) -> Result<()> {
        self.shared.check_reader()?;
        let mut c = lock(&self.control);
        if c.input_held == hold {
            return Ok(());
        }
        let s = &self.shared;
        if hold {
            s.input_open.store(false, SeqCst);
            c.rules.set_input_hold(true)?;
        } else {
            // What is held goes first (so that new packets cannot overtake it); from then on
            // the reader accepts input as it arrives, while the rule is being removed; what it
            // had read but not yet accepted goes right after.
            let (a, _) = s.flush(s.in_queue, NF_ACCEPT)?;
            s.input_open.store(true, SeqCst);
            c.rules.set_input_hold(false)?;
            let (b, _) = s.flush(s.in_queue, NF_ACCEPT)?;
            s.input_released.fetch_add(a + b, SeqCst);
        }
        c.input_held = hold;
        tracing::debug!(hold, "input hold");
        Ok(())
    }

    /// A snapshot of the counters (no subprocess; one read of `/proc`).
    pub fn stats(&self) -> GateStats {
        let s = &self.shared;
        let (mode, backend) = {
            let c = lock(&self.control);
            (c.mode, c.rules.backend())
        };
        let (held_packets, held_bytes, oldest_held_age, input_held_packets) = {
            let h = lock(&s.held);
            (
                h.out.entries.len() as u64,
                h.out.bytes,
                h.out.entries.front().map(|e| e.at.elapsed()),
                h.input.entries.len() as u64,
            )
        };
        let (kernel_dropped, kernel_queued) = match s.proc_state() {
            Ok(qs) => (
                qs.iter()
                    .filter(|q| q.num == s.out_queue || q.num == s.in_queue)
                    .map(|q| q.dropped + q.user_dropped)
                    .sum(),
                qs.iter()
                    .find(|q| q.num == s.out_queue)
                    .map_or(0, |q| q.total),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "reading NFQUEUE statistics");
                (0, 0)
            }
        };
        let discarded = s.discarded.load(SeqCst);
        GateStats {
            mode,
            backend,
            held_packets,
            held_bytes,
            oldest_held_age,
            input_held_packets,
            released_packets: s.released_packets.load(SeqCst),
            released_bytes: s.released_bytes.load(SeqCst),
            input_released_packets: s.input_released.load(SeqCst),
            discarded_packets: discarded,
            kernel_dropped,
            kernel_queued,
            socket_overflows: s.overflows.load(SeqCst),
            verdict_errors: s.verdict_errors.load(SeqCst),
            dropped_total: discarded + kernel_dropped,
            last_marked: s.open.load(SeqCst).saturating_sub(1),
            last_released: s.released.load(SeqCst),
        }
    }

    /// Packets dropped by the gate's rules: in Drop mode everything from the sandbox, in Hold
    /// mode on the xtables backend the sandbox's IPv6. Runs `nft`.
    pub fn dropped_by_rules(&self) -> Result<u64> {
        lock(&self.control).rules.dropped_by_rules()
    }

    /// Removes the rules and closes the queues (dropping what is still held), reporting
    /// errors; dropping the gate does the same and logs them.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        // Rules first: once they are gone nothing new is queued. Closing the socket (when the
        // last `Arc` goes) makes the kernel drop whatever is still held.
        let removed = lock(&self.control).rules.remove();
        if let Some(reader) = self.reader.take() {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
            let rc = unsafe {
                libc::write(self.shared.stop.as_raw_fd(), (&one as *const u64).cast(), 8)
            };
            if rc == 8 {
                let _ = reader.join();
            } else {
                tracing::error!(error = %io::Error::last_os_error(), "waking the gate's reader to stop");
            }
        }
        removed
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "closing the gate");
        }
    }
}

/// One line of `/proc/net/netfilter/nfnetlink_queue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcQueue {
    num: u16,
    total: u64,
    dropped: u64,
    user_dropped: u64,
    id_sequence: u32,
}

/// Parses `/proc/net/netfilter/nfnetlink_queue`: per line `queue_num peer_portid queue_total
/// copy_mode copy_range queue_dropped queue_user_dropped id_sequence 1`.
fn parse_proc_queues(text: &str) -> Vec<ProcQueue> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            Some(ProcQueue {
                num: f[0].parse().ok()?,
                total: f[2].parse().ok()?,
                dropped: f[5].parse().ok()?,
                user_dropped: f[6].parse().ok()?,
                id_sequence: f[7].parse().ok()?,
            })
        })
        .collect()
}

impl Shared {
    fn output_waiting(&self) -> bool {
        self.newest_out.load(SeqCst) > self.open.load(SeqCst)
    }

    fn check_reader(&self) -> Result<()> {
        match &*lock(&self.reader_error) {
            Some(e) => Err(NetfilterError::ReaderStopped(e.clone())),
            None => Ok(()),
        }
    }

    /// The reader thread: takes packet ids from the socket until told to stop.
    fn read_loop(&self) {
        let mut bufs = RecvBufs::new();
        let mut events = Vec::new();
        loop {
            events.clear();
            match self.sock.recv(&mut bufs, &mut |e| events.push(e)) {
                Ok(_) => self.take(&events),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match nfq::poll_in(
                        self.sock.raw_fd(),
                        Some(self.stop.as_raw_fd()),
                        Duration::from_secs(3600),
                    ) {
                        Ok(true) => return,
                        Ok(false) => {}
                        Err(e) => return self.reader_failed(e),
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // The kernel could not deliver some packet messages and dropped those
                    // packets (fail-open is off).
                    self.overflows.fetch_add(1, SeqCst);
                    tracing::warn!("NFQUEUE socket overflowed: the kernel dropped packets");
                }
                Err(e) => return self.reader_failed(e),
            }
        }
    }

    fn reader_failed(&self, e: io::Error) {
        tracing::error!(error = %e, "gate reader stopped; held packets stay held");
        *lock(&self.reader_error) = Some(e.to_string());
    }

    /// Files freshly read events: tags packets with the current epoch.
    fn take(&self, events: &[Event]) {
        // Loaded after the read: packets read before a mark may get the later epoch (released
        // late, safe), packets sent after a mark cannot get an earlier one.
        let epoch = self.open.load(SeqCst);
        let now = Instant::now();
        // Output packets this read queued.
        let mut queued = 0u64;
        let open = self.input_open.load(SeqCst);
        let mut pass_in: Option<u32> = None;
        {
            let mut held = lock(&self.held);
            for ev in events {
                match *ev {
                    Event::Packet { queue, id, len } if queue == self.out_queue => {
                        queued += u64::from(held.out.push(id, epoch, len, now));
                    }
                    Event::Packet { queue, id, .. } if queue == self.in_queue && open => {
                        pass_in = Some(id);
                    }
                    Event::Packet { queue, id, len } if queue == self.in_queue => {
                        held.input.push(id, epoch, len, now);
                    }
                    Event::Packet { queue, .. } => {
                        tracing::warn!(queue, "packet from a queue that is not ours")
                    }
                    Event::Ack { errno: 0, .. } => {}
                    Event::Ack { seq, errno } => {
                        self.verdict_errors.fetch_add(1, SeqCst);
                        tracing::warn!(
                            seq,
                            error = %io::Error::from_raw_os_error(errno),
                            "the kernel refused a verdict"
                        );
                    }
                }
            }
        }
        if let Some(id) = pass_in {
            // Input is open: everything read up to `id` on the input queue goes through (ids
            // are per queue and increasing, and nothing older is held: `hold_input(false)`
            // flushed it before opening).
            let _sending = lock(&self.sender);
            if let Err(e) = self.sock.verdict_batch(self.in_queue, NF_ACCEPT, id) {
                tracing::warn!(error = %e, "accepting input failed");
            } else {
                self.input_released.fetch_add(1, SeqCst);
            }
        }
        if queued > 0 {
            if let Some(f) = self.on_each_output.get() {
                f(queued);
            }
            let before = self.newest_out.fetch_max(epoch + 1, SeqCst);
            if before < epoch + 1
                && let Some(f) = self.on_output.get()
            {
                f();
            }
            if self.waiters.load(SeqCst) > 0 {
                let _g = lock(&self.wait_lock);
                self.wait_cv.notify_all();
            }
        }
    }

    fn proc_state(&self) -> Result<Vec<ProcQueue>> {
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match self.proc_queues.read_at(&mut buf, text.len() as u64) {
                Ok(0) => break,
                Ok(n) => text.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(NetfilterError::Proc {
                        action: "reading",
                        path: "/proc/net/netfilter/nfnetlink_queue".into(),
                        source,
                    });
                }
            }
        }
        Ok(parse_proc_queues(&String::from_utf8_lossy(&text)))
    }

    /// Gives `verdict` to every packet in `queue` now, read or not (up to the kernel's last
    /// id). Returns the packets the kernel held and the bytes of those we had read.
    fn flush(&self, queue: u16, verdict: u32) -> Result<(u64, u64)> {
        let _sending = lock(&self.sender);
        let state = self.proc_state()?;
        let Some(q) = state.iter().find(|q| q.num == queue) else {
            return Err(NetfilterError::ReaderStopped(format!(
                "queue {queue} is not bound any more"
            )));
        };
        if q.total > 0 {
            self.sock
                .verdict_batch(queue, verdict, q.id_sequence)
                .map_err(|source| NetfilterError::Syscall {
                    call: "sending an NFQUEUE batch verdict",
                    source,
                })?;
        }
        let mut held = lock(&self.held);
        let list = if queue == self.out_queue {
            &mut held.out
        } else {
            &mut held.input
        };
        let n = list
            .entries
            .partition_point(|e| !nfq::id_after(e.id, q.id_sequence));
        let bytes = list.cut(n);
        list.through = Some(q.id_sequence);
        if queue == self.out_queue {
            let newest = list.entries.back().map_or(0, |e| e.epoch + 1);
            self.newest_out.store(newest, SeqCst);
        }
        Ok((q.total, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_lines() {
        let text = "    3  12345     2 2     1     0     5       10  1\n\
                    65535 1     0 2     1     7     0 4294967295  1\n\
                    garbage\n";
        assert_eq!(
            parse_proc_queues(text),
            vec![
                ProcQueue {
                    num: 3,
                    total: 2,
                    dropped: 0,
                    user_dropped: 5,
                    id_sequence: 10
                },
                ProcQueue {
                    num: 65535,
                    total: 0,
                    dropped: 7,
                    user_dropped: 0,
                    id_sequence: u32::MAX
                }
            ]
        );
    }

    #[test]
    fn list_skips_stale_and_out_of_order_ids() {
        let now = Instant::now();
        let mut l = List::default();
        assert!(l.push(5, 1, 100, now));
        assert!(!l.push(5, 1, 100, now));
        assert!(!l.push(4, 1, 100, now));
        assert!(l.push(6, 2, 50, now));
        assert_eq!(l.cut(1), 100);
        assert_eq!(l.through, Some(5));
        assert_eq!(l.bytes, 50);
        l.through = Some(10);
        assert!(!l.push(9, 2, 1, now));
        assert!(l.push(11, 2, 1, now));
    }
}
