//! One epoch's cycle on the loop's thread: waiting for its end (interval, output, cap), the
//! pause (`next`: stop, capture, hook, resume, encode, retried when a signal or the tracker is
//! busy), and what a failed pause keeps for the next one.

#[allow(unused_imports)]
use super::*;

impl EpochLoop {
    pub(super) fn random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The encoding's budget (see [`EpochConfig::encode_budget`]).
    pub(super) fn budget_rule(&self) -> Rule {
        Rule {
            interval: self.cfg.interval,
            budget: self.cfg.encode_budget,
        }
    }

    /// Waits until the epoch should end (see the module doc), and says why it ended.
    pub(super) fn wait(&mut self) -> EndedBy {
        let cap = self.cfg.cap_pages;
        let min = self.cfg.min_interval;
        loop {
            let now = Instant::now();
            let elapsed = now.duration_since(self.last_resume);
            if elapsed >= self.cfg.interval {
                return EndedBy::Interval;
            }
            let left = self.cfg.interval - elapsed;
            let output = self.trigger.is_set();
            let end = output.then(|| self.output_deadline());
            if end.is_some_and(|end| now >= end) {
                return EndedBy::Output;
            }
            if exited(&self.pidfd) {
                return EndedBy::Interval; // the stop reports it
            }
            if cap > 0 && elapsed >= min && self.count_written(cap) >= cap {
                return EndedBy::Cap;
            }
            if let Some(end) = end {
                let step = end.duration_since(now).min(left);
                if self.cfg.follow_releases {
                    // A release or more output can move the end earlier: wake up for them.
                    self.trigger.wait_news(step);
                } else {
                    std::thread::sleep(step);
                }
                continue;
            }
            // Each cap check scans every armed range: poll a few times per epoch, not more
            // (every 0.5 ms cost more than half of a busy service's system calls per epoch).
            let poll = (self.cfg.interval / 5).max(Duration::from_millis(1));
            let step = if cap > 0 {
                left.min(poll).max(min.saturating_sub(elapsed))
            } else {
                left
            };
            self.trigger.wait(step.min(left));
        }
    }

    /// Pages written since the last pause (by every process of a tree), counted up to `cap`.
    pub(super) fn count_written(&mut self, cap: u64) -> u64 {
        let mut n = self.tracker.count_written(&self.armed, cap);
        for m in &mut self.members {
            if n >= cap {
                break;
            }
            n += m.lp.tracker.count_written(&m.lp.armed, cap - n);
        }
        n
    }

    /// When waiting output ends the open epoch: [`EpochConfig::min_interval`] after the resume
    /// (and, with [`EpochConfig::after_release`], no sooner than that after a release during
    /// the epoch), or [`EpochConfig::follow_min`] once the clients of the last release have
    /// answered ([`EpochConfig::follow_releases`]).
    pub(super) fn output_deadline(&self) -> Instant {
        if !self.cfg.follow_releases {
            return self.last_resume + self.cfg.min_interval;
        }
        if self.trigger.answered(self.epoch) {
            return self.last_resume + self.cfg.follow_min.min(self.cfg.min_interval);
        }
        let by_resume = self.last_resume + self.cfg.min_interval;
        match self.trigger.released_at(self.epoch) {
            Some(t) if t > self.last_resume && !self.cfg.after_release.is_zero() => {
                by_resume.max(t + self.cfg.after_release)
            }
            _ => by_resume,
        }
    }

    /// Ends the chain: this epoch and every later one fail with `why`
    /// ([`CaptureError::TreeChanged`], [`ChainState::Broken`]).
    pub(super) fn break_chain(&mut self, why: String) -> EpochError {
        self.broken = Some(why.clone());
        CaptureError::TreeChanged(why).into()
    }

    /// One epoch (with `full`, a full checkpoint of the same pause too). With `hold`, the
    /// process stays stopped after the capture until a `Release` arrives on `cmds` (the reply
    /// is sent from here first).
    ///
    /// A process tree: every process is stopped (parents first), captured with its own state
    /// and resumed (children first) in one pause; the checkpoint lists the other processes as
    /// members of the main process's image, with the open file descriptions they share (see
    /// `docs/PROCESS-TREES.md`).
    pub(super) fn next(
        &mut self,
        hold: bool,
        full: bool,
        replies: &mpsc::Sender<Reply>,
        cmds: &mpsc::Receiver<Cmd>,
    ) -> Option<Reply> {
        if let Some(why) = &self.broken {
            return Some(Err(CaptureError::TreeChanged(why.clone()).into()));
        }
        // Digests of an earlier pause that produced no checkpoint describe no checkpoint.
        self.scrub_pages = None;
        if exited(&self.pidfd) {
            return Some(Err(EpochError::ServiceGone(format!(
                "process {} has exited",
                self.proc.pid
            ))));
        }
        let ended_by = self.wait();
        if self.cfg.follow_releases {
            self.answers = Some(self.trigger.answers(self.epoch, self.last_resume));
        }
        self.maybe_precopy();
        for m in &mut self.members {
            m.lp.maybe_precopy();
        }
        // The full checkpoint's copy buffers, faulted in before the pause.
        let buffer = |p: &Proc| capture::prefaulted_buffer(capture::estimate_private_bytes(p));
        let mut fullbuf = full.then(|| buffer(&self.proc));
        let mut fullbufs: Vec<Option<Vec<u8>>> = self
            .members
            .iter()
            .map(|m| full.then(|| buffer(&m.lp.proc)))
            .collect();
        let interval = self.last_resume.elapsed();
        let mut attempt = 0u64;
        // What this pause takes from the tracker, until a checkpoint holds it (one per
        // process).
        let mut journal = Carry::default();
        let mut journals: Vec<Carry> = self.members.iter().map(|_| Carry::default()).collect();
        let (st, msts, t0, cpu0, quiesce, captured) = loop {
            let (t0, cpu0) = (Instant::now(), crate::sys::thread_cpu_time());
            let mut st = match Stopped::stop(&self.proc) {
                Ok(s) => s,
                Err(e) => return Some(Err(self.classify(CaptureError::from(e).into()))),
            };
            if st.tids.is_empty() {
                drop(st);
                return Some(Err(self.classify(EpochError::ServiceGone(format!(
                    "process {} has no threads left",
                    self.proc.pid
                )))));
            }
            let mut msts = Vec::with_capacity(self.members.len());
            let mut changed = match self.stop_members(&mut msts) {
                Ok(gone) => gone,
                Err(e) => {
                    let _ = resume_all(msts);
                    drop(st);
                    self.last_resume = Instant::now();
                    return Some(Err(self.classify(e)));
                }
            };
            let quiesce = t0.elapsed();
            // The tree as it is now (step 2 of `docs/PROCESS-TREES.md`): looked at again when
            // it may have changed, or when a process's children are not the known ones.
            changed |= self.tree_suspect();
            let mut looks = 0;
            let r = loop {
                if changed {
                    looks += 1;
                    self.relook = true;
                    if let Err(e) = self.retree(&st, &mut msts) {
                        break Err(e);
                    }
                    self.relook = false;
                    journals = self.members.iter().map(|_| Carry::default()).collect();
                    fullbufs = self.members.iter().map(|_| full.then(Vec::new)).collect();
                }
                match self.capture_tree(
                    &mut st,
                    &mut msts,
                    &mut fullbuf,
                    &mut fullbufs,
                    &mut journal,
                    &mut journals,
                ) {
                    Err(EpochError::Capture(CaptureError::ChildrenChanged(_))) if looks < 3 => {
                        self.keep_all(&mut journal, &mut journals);
                        changed = true;
                    }
                    r => break r,
                }
            };
            match r {
                Ok(c) => break (st, msts, t0, cpu0, quiesce, Ok(c)),
                Err(e) => {
                    // Keep what was taken for the next attempt (or the next epoch).
                    self.keep_all(&mut journal, &mut journals);
                    match e {
                        // A signal queued just as the threads stopped would be lost: let it be
                        // delivered and stop again (as a one-shot checkpoint does).
                        EpochError::Capture(
                            CaptureError::PendingSignals(_) | CaptureError::Exiting(_),
                        )
                        | EpochError::Track(TrackError::Busy)
                            if attempt < 20 =>
                        {
                            attempt += 1;
                            let _ = resume_all(msts);
                            let _ = st.resume();
                            std::thread::sleep(Duration::from_micros(200 * attempt));
                        }
                        e => break (st, msts, t0, cpu0, quiesce, Err(e)),
                    }
                }
            }
        };
        let mut c = match captured {
            Ok(c) => c,
            Err(e) => {
                let _ = resume_all(msts);
                drop(st); // resumes
                self.last_resume = Instant::now();
                return Some(Err(self.classify(e)));
            }
        };
        // The capture succeeded: this pause produces checkpoint `epoch`.
        self.epoch += 1;
        let epoch = self.epoch;
        for m in &mut self.members {
            m.lp.epoch = epoch;
        }
        self.trigger.clear();
        // The divergence check, when due: still stopped, so the digests are of this state.
        let tsc = Instant::now();
        if let Some(s) = self.scrubber.as_mut().filter(|s| s.due()) {
            match s.take(&self.proc, &c.main.meta.vmas) {
                Ok(pages) => self.scrub_pages = Some(pages),
                Err(e) => {
                    tracing::warn!(%e, "the divergence check could not read the process; skipped")
                }
            }
        }
        c.main.parts.scrub = tsc.elapsed();
        let th = Instant::now();
        if let Some(h) = self.hook.as_mut() {
            h(epoch);
        }
        let hook = th.elapsed();
        // Every process's connections, after the gate's boundary (see `crate::tcp`): still
        // stopped. (Each process's loop remembers its own, to skip those that did not move.)
        let tt = Instant::now();
        let tcp = self.tcp.capture(self.proc.pid, &c.main.meta.fds);
        c.main.set_tcp(tcp);
        for (m, mc) in self.members.iter_mut().zip(&mut c.members) {
            match (mc, &mut m.fresh) {
                (Some(mc), _) => mc.set_tcp(m.lp.tcp.capture(m.lp.proc.pid, &mc.meta.fds)),
                (None, Some(f)) => {
                    let tcp = m.lp.tcp.capture(m.lp.proc.pid, &f.image.fds);
                    f.image.tcp = tcp.conns;
                    c.main.tcp_reset += tcp.reset;
                    c.main.tcp_read += tcp.read;
                }
                (None, None) => {}
            }
        }
        c.main.parts.tcp = tt.elapsed();
        if hold {
            let r = self.finish(c, epoch, interval, quiesce, t0.elapsed(), ended_by);
            let r = self.settle(r, journal, journals);
            let ok = r.is_ok();
            let _ = replies.send(r);
            if ok {
                while let Ok(cmd) = cmds.recv() {
                    if matches!(cmd, Cmd::Release) {
                        break;
                    }
                }
                let _ = replies.send(Err(EpochError::Gone("released".into())));
            }
            let _ = resume_all(msts);
            let _ = st.resume();
            self.last_resume = Instant::now();
            return None;
        }
        let tr = Instant::now();
        let members_resumed = resume_all(msts);
        let resumed = st.resume_at();
        let pause = pause_since(t0, &resumed);
        let pause_cpu = crate::sys::thread_cpu_time().saturating_sub(cpu0);
        let resumed = resumed.and(members_resumed);
        self.last_resume = Instant::now();
        if let Err(e) = resumed {
            // Number `epoch` is given out (the hook saw it) but not produced.
            self.keep_all(&mut journal, &mut journals);
            return Some(Err(self.classify(CaptureError::from(e).into())));
        }
        c.main.parts.resume = tr.elapsed();
        c.main.parts.hook = hook;
        // The encoding yields to the service, on its budget (see `crate::budget`).
        let budget = Budget::enter(self.budget_rule(), self.last_resume);
        let mut r = self.finish(c, epoch, interval, quiesce, pause, ended_by);
        let overran = budget.leave();
        if let Ok(o) = &mut r {
            let late = self
                .budget_rule()
                .lengthened(self.last_resume, Instant::now());
            o.stats.encode_late_us = late.as_micros() as u64;
            o.stats.encode_overran = overran;
            o.stats.pause_cpu_us = pause_cpu.as_micros() as u64;
        }
        Some(self.settle(r, journal, journals))
    }

    /// What a pause took, for every process, joins its carry (see [`EpochLoop::keep`]).
    pub(super) fn keep_all(&mut self, journal: &mut Carry, journals: &mut [Carry]) {
        self.keep(std::mem::take(journal));
        for (m, j) in self.members.iter_mut().zip(journals) {
            m.lp.keep(std::mem::take(j));
        }
    }

    /// What a pause took joins the carry (its attempt, or its finish, failed).
    pub(super) fn keep(&mut self, journal: Carry) {
        if journal.walked {
            self.dirs.undo();
        }
        if journal.shm {
            self.shm.undo();
        }
        // The layout count and the copied-on-write list this pause recorded describe a capture
        // no delivered checkpoint holds: carried into the next pause they would skip the copy
        // of every listed page that a layout call since the last delivered checkpoint requires
        // (a copy zapped and faulted in again holds the file's bytes without a reported write),
        // and would list carried pages as copies of their own (a page written and then zapped
        // before the failed pause is the file's own again). The next pause reads them again,
        // against the last delivered checkpoint: one pause without the carried layout per
        // failure.
        self.layout_seen = None;
        self.prev_cow.clear();
        self.carry.absorb(journal);
    }

    /// After `finish`: a delivered checkpoint holds everything carried so far; a failed one
    /// leaves it (and this pause's journals) to the next.
    pub(super) fn settle(
        &mut self,
        r: Result<EpochOutput>,
        mut journal: Carry,
        mut journals: Vec<Carry>,
    ) -> Result<EpochOutput> {
        match r {
            Ok(out) => {
                self.carry = Carry::default();
                for m in &mut self.members {
                    m.lp.carry = Carry::default();
                }
                Ok(out)
            }
            Err(e) => {
                self.keep_all(&mut journal, &mut journals);
                Err(self.classify(e))
            }
        }
    }

    /// A failure while the service is gone is reported as such. A failure that can come from
    /// a dying process (anything but a refusal) gives it a moment to finish exiting: its last
    /// threads may still be on their way out.
    pub(super) fn classify(&self, e: EpochError) -> EpochError {
        let wait = match &e {
            EpochError::ServiceGone(_) => return e,
            EpochError::Capture(CaptureError::Unsupported(_) | CaptureError::PendingSignals(_))
            | EpochError::Track(TrackError::Busy) => Duration::ZERO,
            _ => Duration::from_millis(100),
        };
        if exited_within(&self.pidfd, wait) {
            EpochError::ServiceGone(e.to_string())
        } else {
            e
        }
    }

    /// Test support: fails here if told to.
    pub(super) fn fail_at(&mut self, at: FailPoint) -> Result<()> {
        if self.fail == Some(at) {
            self.fail = None;
            return Err(CaptureError::Unsupported(format!("injected failure ({at:?})")).into());
        }
        Ok(())
    }
}
