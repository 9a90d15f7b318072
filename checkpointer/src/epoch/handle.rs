//! [`Epochs`], the caller's handle: it starts the loop's thread and talks to it over channels
//! (the hand-offs stay outside the pause).

#[allow(unused_imports)]
use super::*;

pub(super) enum Cmd {
    Next { hold: bool, full: bool },
    Release,
    Fail(FailPoint),
    Stop,
}

pub(super) type Reply = Result<EpochOutput>;

/// A running epoch loop on one process (host PID) and its descendants, if it has any (a
/// process tree: see `docs/PROCESS-TREES.md`). Drop or [`Epochs::stop`] ends it and removes
/// write tracking from every process.
pub struct Epochs {
    tx: mpsc::Sender<Cmd>,
    rx: mpsc::Receiver<Reply>,
    thread: Option<std::thread::JoinHandle<()>>,
    held: bool,
    trigger: Trigger,
    full_requested: bool,
    /// The service's pidfd: tells a loop that died with its service from one that broke.
    pidfd: Option<OwnedFd>,
}

impl Epochs {
    /// Arms tracking and takes the full checkpoint (epoch 0) in one pause.
    pub fn start(pid: Pid, cfg: EpochConfig) -> Result<(Epochs, Checkpoint, EpochStats)> {
        Self::start_with(pid, cfg, EpochHooks::default())
    }

    /// [`Epochs::start`] with hooks (see [`EpochHooks`]); `on_pause` is called with 0 inside
    /// this first pause already.
    pub fn start_with(
        pid: Pid,
        cfg: EpochConfig,
        hooks: EpochHooks,
    ) -> Result<(Epochs, Checkpoint, EpochStats)> {
        let (ep, first) = Self::launch(pid, cfg, hooks, true)?;
        Ok((ep, first.incremental, first.stats))
    }

    /// Like [`Epochs::start_with`], but the first pause only arms tracking: no memory is copied
    /// and no checkpoint 0 exists. Epoch 1's incremental checkpoint then continues a state no
    /// one holds; a backup can follow this loop only from a full checkpoint taken later
    /// ([`Epochs::request_full`]). For a service that has no backup yet (a primary that just
    /// took over alone), this keeps a copy of all memory out of the first pause.
    pub fn start_tracking(
        pid: Pid,
        cfg: EpochConfig,
        hooks: EpochHooks,
    ) -> Result<(Epochs, EpochStats)> {
        let (ep, first) = Self::launch(pid, cfg, hooks, false)?;
        Ok((ep, first.stats))
    }

    fn launch(
        pid: Pid,
        cfg: EpochConfig,
        hooks: EpochHooks,
        copy: bool,
    ) -> Result<(Epochs, EpochOutput)> {
        let pidfd = match crate::sys::pidfd_open(pid) {
            Ok(fd) => Some(fd),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return Err(EpochError::ServiceGone(format!("process {pid}: {e}")));
            }
            Err(_) => None,
        };
        let trigger = Trigger::default();
        let loop_trigger = trigger.clone();
        let (tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (reply_tx, rx) = mpsc::channel::<Reply>();
        let thread = std::thread::Builder::new()
            .name("tardi-epochs".into())
            .spawn(move || {
                // The epoch's end is timed in tens of microseconds (the minimum interval after
                // output): without this, each sleep of this thread may last 50 µs longer (the
                // default timer slack of a thread).
                // SAFETY: PR_SET_TIMERSLACK takes a plain integer and touches no memory.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64, 0u64, 0u64, 0u64) };
                let err_tx = reply_tx.clone();
                let r = in_view(pid, move |proc| {
                    let (mut lp, first) =
                        match EpochLoop::start(proc, cfg, hooks, loop_trigger, copy) {
                            Ok(v) => v,
                            Err(e) => {
                                let _ = reply_tx.send(Err(e));
                                return;
                            }
                        };
                    let _ = reply_tx.send(Ok(first));
                    while let Ok(cmd) = cmd_rx.recv() {
                        match cmd {
                            Cmd::Next { hold, full } => {
                                let r = lp.next(hold, full, &reply_tx, &cmd_rx);
                                if let Some(r) = r {
                                    let _ = reply_tx.send(r);
                                }
                            }
                            Cmd::Fail(at) => lp.fail = Some(at),
                            Cmd::Release => {}
                            Cmd::Stop => break,
                        }
                    }
                    lp.disarm();
                });
                if let Err(e) = r {
                    let _ = err_tx.send(Err(EpochError::Gone(e.to_string())));
                }
            })
            .map_err(|e| EpochError::Gone(e.to_string()))?;
        let mut ep = Epochs {
            tx,
            rx,
            thread: Some(thread),
            held: false,
            trigger,
            full_requested: false,
            pidfd,
        };
        let first = ep.recv()?;
        Ok((ep, first))
    }

    /// Waits for the epoch to end and returns its incremental checkpoint. A full checkpoint
    /// requested with [`Epochs::request_full`] is not taken here (the request stays pending
    /// for [`Epochs::next_output`]).
    // Not an Iterator: each call blocks for an epoch and can fail; `next` reads best here.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<(Checkpoint, EpochStats)> {
        self.run(false, false).map(|o| (o.incremental, o.stats))
    }

    /// Like [`Epochs::next`], but the process stays stopped, in exactly the state the returned
    /// checkpoint describes, until [`Epochs::release`] (or the next call).
    pub fn next_held(&mut self) -> Result<(Checkpoint, EpochStats)> {
        self.run(true, false).map(|o| (o.incremental, o.stats))
    }

    /// One epoch, with everything it produced: the incremental checkpoint, and the full one if
    /// [`Epochs::request_full`] asked for it. With `hold`, as [`Epochs::next_held`].
    pub fn next_output(&mut self, hold: bool) -> Result<EpochOutput> {
        let full = self.full_requested;
        let out = self.run(hold, full)?;
        if out.full.is_some() {
            self.full_requested = false;
        }
        Ok(out)
    }

    /// Asks for a full checkpoint with the next [`Epochs::next_output`] (say for a backup that
    /// joins): that epoch's pause produces both the usual incremental checkpoint N, so the
    /// backups that follow the chain go on, and a full checkpoint of the same state N, to which
    /// the incrementals after N apply as well. The request stays pending until an epoch
    /// produced it (a failed epoch does not consume it).
    ///
    /// All memory is copied inside that pause, so it is as long as a full checkpoint's
    /// (`EpochStats::full_copy_us`).
    pub fn request_full(&mut self) {
        self.full_requested = true;
    }

    /// The loop's [`Trigger`]: set it when output is waiting, to end the epoch early.
    pub fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }

    /// Test support: the next epoch fails at `at` (as a real failure there would).
    #[doc(hidden)]
    pub fn fail_next(&mut self, at: FailPoint) {
        self.release();
        let _ = self.tx.send(Cmd::Fail(at));
    }

    fn run(&mut self, hold: bool, full: bool) -> Result<EpochOutput> {
        self.release();
        if self.tx.send(Cmd::Next { hold, full }).is_err() {
            return Err(self.gone("the loop has ended".into()));
        }
        let r = self.recv();
        self.held = hold && r.is_ok();
        r
    }

    fn recv(&mut self) -> Reply {
        match self.rx.recv() {
            Ok(Err(EpochError::Gone(e))) => Err(self.gone(e)),
            Ok(r) => r,
            Err(e) => Err(self.gone(e.to_string())),
        }
    }

    /// The loop's thread is gone: because the service is, or not.
    fn gone(&self, why: String) -> EpochError {
        if self.pidfd.as_ref().is_some_and(exited) {
            EpochError::ServiceGone(why)
        } else {
            EpochError::Gone(why)
        }
    }

    /// Resumes a process held by [`Epochs::next_held`].
    pub fn release(&mut self) {
        if self.held {
            let _ = self.tx.send(Cmd::Release);
            let _ = self.rx.recv();
            self.held = false;
        }
    }

    /// Ends the loop and removes write tracking from the process.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.release();
        let _ = self.tx.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Epochs {
    fn drop(&mut self) {
        self.shutdown();
    }
}
