//! System calls made by a stopped thread on the checkpointer's behalf: [`Stopped::call`] runs
//! one at the thread's current instruction, [`Stopped::inject`] one at a `syscall` instruction
//! of the process's own text, with a scratch buffer, restoring the thread's registers after.

use super::*;

impl Stopped {
    /// Runs a function of code we placed in the process (the write-tracking agent) on stopped
    /// thread `tid`: `entry(args[0], args[1])` must end in `int3`. It runs on the thread's own
    /// stack, below the red zone, with `stack_bytes` of room; the stack bytes, the registers and
    /// the XSAVE state (the code may use vector registers) are all put back afterwards. Signals
    /// that arrive meanwhile are held back and raised again, as for [`Stopped::inject`].
    ///
    /// `orig_rax` is set to -1 while the code runs, so a system call the thread was stopped in
    /// is not restarted into our code; the saved registers bring the restart back afterwards.
    pub fn call(
        &mut self,
        tid: Pid,
        entry: u64,
        args: [u64; 2],
        stack_bytes: usize,
    ) -> Result<i64> {
        let held = self.hold_signals(tid)?;
        let r = self.call_once(tid, entry, args, stack_bytes);
        self.unhold_signals(tid, held, r)
    }

    /// With [`Stopped::calls_hold_signals`]: blocks every signal in `tid`; the mask it had.
    fn hold_signals(&self, tid: Pid) -> Result<Option<u64>> {
        if !self.calls_hold_signals {
            return Ok(None);
        }
        let mask = self.sigmask(tid)?;
        self.set_sigmask(tid, !0)?; // the kernel leaves SIGKILL and SIGSTOP out
        Ok(Some(mask))
    }

    /// Puts back the mask [`Stopped::hold_signals`] saved (not after the process died).
    fn unhold_signals<T>(&self, tid: Pid, held: Option<u64>, r: Result<T>) -> Result<T> {
        match (held, &r) {
            (_, Err(PtraceError::ProcessDied { .. })) | (None, _) => r,
            (Some(mask), _) => {
                let put = self.set_sigmask(tid, mask);
                let v = r?;
                put.map(|_| v)
            }
        }
    }

    fn call_once(
        &mut self,
        tid: Pid,
        entry: u64,
        args: [u64; 2],
        stack_bytes: usize,
    ) -> Result<i64> {
        for _ in 0..16 {
            let saved = self.regs(tid)?;
            let xs = self.xstate(tid)?;
            // The code's frames grow down from `top` (below the red zone) into the
            // `stack_bytes` saved here and written back after, so the call leaves no trace in
            // the thread's memory: a write below the room would be dead stack to the thread but
            // a change a capture that already read (or did not list) that page would miss.
            let top = saved.rsp - 128;
            let sp = (top - stack_bytes as u64) & !15;
            let mut orig = vec![0u8; (top - sp) as usize];
            crate::sys::read_remote(self.pid, sp, &mut orig).map_err(op("read stack", tid))?;
            let mut r = saved;
            r.rip = entry;
            // 16-byte aligned, as the entry (`call`) expects.
            r.rsp = top & !15;
            r.rdi = args[0];
            r.rsi = args[1];
            r.rax = 0;
            r.orig_rax = u64::MAX;
            self.set_regs(tid, &r)?;
            let mut deferred = Vec::new();
            let ran = self.run_call(tid, entry, &mut deferred);
            if matches!(ran, Err(PtraceError::ProcessDied { .. })) {
                return ran.map(|_| 0);
            }
            crate::sys::write_remote(self.pid, sp, &orig).map_err(op("restore stack", tid))?;
            if let Ok(Ran::Pending(sig)) = ran {
                self.deliver_pending(tid, sig, &saved, Some(&xs))?;
                continue;
            }
            self.set_regs(tid, &saved)?;
            self.set_xstate(tid, &xs)?;
            for sig in deferred {
                self.reraise(tid, sig);
            }
            return match ran? {
                Ran::Done(r, _) => Ok(r),
                Ran::Pending(_) => unreachable!("handled above"),
            };
        }
        Err(PtraceError::UnexpectedStop {
            tid,
            status: 0,
            during: "an agent operation (signals kept arriving)",
        })
    }

    /// Queues `sig` again for thread `tid` (the kernel took it while a call ran) and notes it
    /// in [`Stopped::reraised`].
    fn reraise(&mut self, tid: Pid, sig: i32) {
        self.reraised |= 1u64 << ((sig - 1) & 63);
        // SAFETY: tgkill on a thread of the process we trace.
        unsafe { libc::syscall(libc::SYS_tgkill, self.pid, tid, sig) };
    }

    /// Runs the thread until our code's `int3`. A signal that stops the thread before our
    /// first instruction was pending before (see [`Stopped::deliver_pending`]).
    fn run_call(&mut self, tid: Pid, entry: u64, deferred: &mut Vec<i32>) -> Result<Ran> {
        for _ in 0..64 {
            self.ran += 1;
            // SAFETY: CONT takes no pointers; no signal is delivered.
            unsafe { ptrace(libc::PTRACE_CONT, tid, 0, 0) }.map_err(op("cont", tid))?;
            let Some(status) = wait_tid(self.pid, tid, &self.proc_dir).map_err(op("wait", tid))?
            else {
                return Err(PtraceError::ProcessDied { pid: self.pid });
            };
            if !libc::WIFSTOPPED(status) {
                return Err(PtraceError::ProcessDied { pid: self.pid });
            }
            let sig = libc::WSTOPSIG(status);
            if (status >> 16) != 0 {
                continue; // an event stop (interrupt): step on
            }
            let rip = self.regs(tid)?.rip;
            if sig == libc::SIGTRAP && rip != entry {
                return self.regs(tid).map(|r| Ran::Done(r.rax as i64, Vec::new()));
            }
            if rip == entry {
                return Ok(Ran::Pending(sig));
            }
            if matches!(
                sig,
                libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE
            ) {
                tracing::error!(tid, sig, rip = format!("{rip:#x}"), "fault in agent code");
                return Err(PtraceError::UnexpectedStop {
                    tid,
                    status,
                    during: "an agent operation (fault)",
                });
            }
            deferred.push(sig);
        }
        Err(PtraceError::UnexpectedStop {
            tid,
            status: 0,
            during: "an agent operation (no progress)",
        })
    }

    /// Injects system calls at `addr` (a `syscall` instruction) instead of the vDSO's: the
    /// write-tracking agent's, whose calls its seccomp filter lets through.
    pub fn set_syscall_insn(&mut self, addr: u64) {
        self.syscall_insn = Some(addr);
    }

    /// Address of a `syscall` instruction in the target's vDSO.
    fn syscall_insn(&mut self, maps: &[crate::procfs::MapEntry]) -> Result<u64> {
        if let Some(a) = self.syscall_insn {
            return Ok(a);
        }
        let vdso = maps
            .iter()
            .find(|m| m.name == "[vdso]")
            .ok_or(PtraceError::NoSyscallInsn)?;
        let mut text = vec![0u8; (vdso.end - vdso.start) as usize];
        crate::sys::read_remote(self.pid, vdso.start, &mut text)
            .map_err(op("read vdso", self.pid))?;
        let off = text
            .windows(2)
            .position(|w| w == [0x0f, 0x05])
            .ok_or(PtraceError::NoSyscallInsn)?;
        self.syscall_insn = Some(vdso.start + off as u64);
        Ok(vdso.start + off as u64)
    }

    /// Runs system call `nr` in stopped thread `tid` and returns its result (negative errno on
    /// failure). `scratch` bytes are made available below the thread's red zone and returned
    /// after the call; the original stack bytes and all registers are put back.
    pub fn inject(
        &mut self,
        maps: &[crate::procfs::MapEntry],
        tid: Pid,
        nr: i64,
        args: [u64; 6],
        scratch_len: usize,
    ) -> Result<(i64, u64, Vec<u8>)> {
        let insn = self.syscall_insn(maps)?;
        let held = self.hold_signals(tid)?;
        let r = self.inject_once(insn, tid, nr, args, scratch_len);
        self.unhold_signals(tid, held, r)
    }

    fn inject_once(
        &mut self,
        insn: u64,
        tid: Pid,
        nr: i64,
        args: [u64; 6],
        scratch_len: usize,
    ) -> Result<(i64, u64, Vec<u8>)> {
        for _ in 0..16 {
            let saved = self.regs(tid)?;
            let scratch = (saved.rsp - 128 - scratch_len as u64 - 64) & !63;
            let mut orig = vec![0u8; scratch_len];
            if scratch_len > 0 {
                crate::sys::read_remote(self.pid, scratch, &mut orig)
                    .map_err(op("read stack", tid))?;
            }
            let mut r = saved;
            r.rax = nr as u64;
            r.orig_rax = u64::MAX;
            r.rip = insn;
            let a = args.map(|x| if x == SCRATCH { scratch } else { x });
            (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
            self.set_regs(tid, &r)?;
            // Whatever happens while the call runs, the thread's registers and stack bytes are
            // put back: a thread resumed with the injection's registers would crash.
            let ran = self.run_injected(tid, nr, insn);
            let mut out = vec![0u8; scratch_len];
            let mut restored = Ok(());
            if scratch_len > 0 && !matches!(ran, Err(PtraceError::ProcessDied { .. })) {
                restored = crate::sys::read_remote(self.pid, scratch, &mut out)
                    .and_then(|_| crate::sys::write_remote(self.pid, scratch, &orig))
                    .map_err(op("restore stack", tid));
            }
            let (ret, deferred) = match ran? {
                Ran::Done(ret, deferred) => (ret, deferred),
                Ran::Pending(sig) => {
                    restored?;
                    self.deliver_pending(tid, sig, &saved, None)?;
                    continue; // again, from where the delivery left the thread
                }
            };
            self.set_regs(tid, &saved)?;
            restored?;
            for sig in deferred {
                // Re-raise what arrived during the call: pending again, delivered after resume
                // (and seen by the pending-signal check of the capture).
                self.reraise(tid, sig);
            }
            return Ok((ret, scratch, out));
        }
        Err(PtraceError::UnexpectedStop {
            tid,
            status: 0,
            during: "an injected system call (signals kept arriving)",
        })
    }

    /// Steps a thread through the injected call. Which syscall stop is which is read with
    /// `PTRACE_GET_SYSCALL_INFO`, never assumed: a thread caught around a system call of its
    /// own (a thread that was just cloned, say) can report a stop for that one first, and taking
    /// it for ours would resume the thread with the injection's registers. A signal that arrives
    /// meanwhile is held back (returned, to be raised again); a stray interrupt stop is stepped
    /// over.
    fn run_injected(&mut self, tid: Pid, nr: i64, insn: u64) -> Result<Ran> {
        let mut deferred = Vec::new();
        let mut entered = false;
        for _ in 0..64 {
            self.ran += 1;
            // SAFETY: PTRACE_SYSCALL takes no pointers.
            unsafe { ptrace(libc::PTRACE_SYSCALL, tid, 0, 0) }.map_err(op("syscall", tid))?;
            let Some(status) = wait_tid(self.pid, tid, &self.proc_dir).map_err(op("wait", tid))?
            else {
                return Err(self.died());
            };
            if !libc::WIFSTOPPED(status) {
                return Err(PtraceError::UnexpectedStop {
                    tid,
                    status,
                    during: "an injected system call",
                });
            }
            let sig = libc::WSTOPSIG(status);
            if sig == (libc::SIGTRAP | 0x80) {
                let info = syscall_info(tid)?;
                match info.op {
                    // The entry of our call: our number, at our instruction.
                    1 if info.ip == insn + 2 && info.nr_or_rval == nr as u64 => entered = true,
                    2 if entered => return Ok(Ran::Done(info.nr_or_rval as i64, deferred)),
                    _ => {} // a stop of some other system call: step on
                }
            } else if (status >> 16) == 0 && sig != libc::SIGTRAP {
                if !entered && self.regs(tid)?.rip == insn {
                    // Pending before we took the thread: the kernel's to deliver.
                    return Ok(Ran::Pending(sig));
                }
                deferred.push(sig);
            }
        }
        Err(PtraceError::UnexpectedStop {
            tid,
            status: 0,
            during: "an injected system call (no progress)",
        })
    }

    /// A signal that was already pending when we took thread `tid` over (for an injected call,
    /// say the SIGSEGV of a write it had just made): the thread gets its own registers back
    /// and the kernel delivers the signal as it would have (frame, handler entry), with its
    /// full details; the thread stops again right after. Raising it again ourselves would lose
    /// those details (fault address, seccomp data).
    fn deliver_pending(
        &mut self,
        tid: Pid,
        sig: i32,
        saved: &Regs,
        xs: Option<&[u8]>,
    ) -> Result<()> {
        self.set_regs(tid, saved)?;
        if let Some(xs) = xs {
            self.set_xstate(tid, xs)?;
        }
        // SAFETY: INTERRUPT takes no pointers.
        unsafe { ptrace(PTRACE_INTERRUPT, tid, 0, 0) }.map_err(op("interrupt", tid))?;
        self.ran += 1;
        // SAFETY: CONT takes the signal to deliver as data, no pointers.
        unsafe { ptrace(libc::PTRACE_CONT, tid, 0, sig as u64) }.map_err(op("cont", tid))?;
        self.wait_interrupt_stop(tid)
    }
}
