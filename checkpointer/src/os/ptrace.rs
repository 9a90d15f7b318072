//! Quiescence and thread state through ptrace.
//!
//! Kernel rules that shape this module:
//! - Every ptrace request for a tracee must come from the thread that attached it. A [`Stopped`]
//!   value is therefore `!Send`: it lives and dies on the thread that created it.
//! - `PTRACE_SEIZE` + `PTRACE_INTERRUPT` stops a thread wherever it is without a signal; the stop
//!   is reported as `PTRACE_EVENT_STOP`. A thread blocked in a restartable system call stops with
//!   `rax = -ERESTART*` and `orig_rax = nr`; `PTRACE_DETACH` wakes it with `TIF_SIGPENDING`, so
//!   the kernel's own restart logic re-issues the call on the way out (epoll_wait & co. return
//!   EINTR instead, exactly as after SIGSTOP/SIGCONT).
//! - A signal that arrives while we stop a thread shows up as a signal-delivery stop first; we
//!   let it be delivered (`PTRACE_CONT` with the signal) and keep waiting for the interrupt stop,
//!   so no signal is swallowed.
//! - Reading some state (clear_child_tid, sigaltstack, signal actions, brk) has no outside
//!   interface: we inject the system call into a stopped thread at a `syscall` instruction of its
//!   own vDSO, and put every register and scratch byte back afterwards.

use crate::abi::Regs;
use crate::image::{PendingSignal, SIGINFO_SIZE};
use crate::sys::{Pid, cvt};
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, OwnedFd};

const PTRACE_SEIZE: u32 = 0x4206;
const PTRACE_INTERRUPT: u32 = 0x4207;
const PTRACE_GETREGSET: u32 = 0x4204;
const PTRACE_SETREGSET: u32 = 0x4205;
const PTRACE_GETSIGMASK: u32 = 0x420a;
const PTRACE_SETSIGMASK: u32 = 0x420b;
const PTRACE_PEEKSIGINFO: u32 = 0x4209;
const PTRACE_GET_RSEQ_CONFIGURATION: u32 = 0x420f;
const PTRACE_EVENT_STOP: i32 = 128;
const PTRACE_O_TRACESYSGOOD: u64 = 1;
const NT_X86_XSTATE: usize = 0x202;

/// Errors while stopping or inspecting threads.
#[derive(Debug, thiserror::Error)]
pub enum PtraceError {
    #[error("ptrace {op} on thread {tid} failed: {source}")]
    Op {
        op: &'static str,
        tid: Pid,
        source: io::Error,
    },
    #[error("thread {tid} stopped unexpectedly (wait status {status:#x}) during {during}")]
    UnexpectedStop {
        tid: Pid,
        status: i32,
        during: &'static str,
    },
    #[error("thread {tid} exited while it was being stopped")]
    Exited { tid: Pid },
    #[error("process {pid} died while it was being stopped (see the sandbox log)")]
    ProcessDied { pid: Pid },
    #[error("the process has no vDSO `syscall` instruction to inject system calls at")]
    NoSyscallInsn,
}

type Result<T> = std::result::Result<T, PtraceError>;

fn op(opname: &'static str, tid: Pid) -> impl FnOnce(io::Error) -> PtraceError {
    move |source| PtraceError::Op {
        op: opname,
        tid,
        source,
    }
}

unsafe fn ptrace(req: u32, tid: Pid, addr: u64, data: u64) -> io::Result<libc::c_long> {
    // SAFETY: the caller guarantees `addr`/`data` are valid for `req`.
    cvt(unsafe { libc::ptrace(req as _, tid, addr, data) })
}

/// Waits for the next state change of traced thread `tid` of the process whose `/proc/PID`
/// directory is `proc_dir`. `Ok(None)`: the whole process died.
///
/// A non-leader thread always reports its own exit, so it gets a plain blocking wait (the
/// fastest way to learn of its stop). The leader does not: when a traced process dies, the
/// kernel holds back the leader's report while other traced threads are unreaped
/// (`delay_group_leader`), so a blocking wait on it could hang for good. It is polled —
/// yielding at first (stops normally arrive within microseconds), then sleeping — and given up
/// on once the process is a zombie.
fn wait_tid(pid: Pid, tid: Pid, proc_dir: &OwnedFd) -> io::Result<Option<i32>> {
    let mut status = 0;
    if tid != pid {
        loop {
            // SAFETY: plain blocking waitpid on a thread we trace.
            let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
            if r == tid {
                return Ok(Some(status));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
    let start = std::time::Instant::now();
    let mut nap = 2u64;
    loop {
        // SAFETY: non-blocking waitpid on a thread we trace.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            return Ok(Some(status));
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // Spin with `sched_yield` only briefly, then sleep: the thread to stop may be queued on
        // this very CPU (woken by the interrupt), and a yielding spinner can keep it from
        // running for milliseconds (seen with a 2 ms spin: stops of 2.5-7 ms in ~0.1% of
        // pauses, which made a UDP ping's p99.9; most stops end within the spin).
        let waited = start.elapsed();
        if waited < std::time::Duration::from_micros(50) {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
            continue;
        }
        if waited >= std::time::Duration::from_millis(2) && process_dead(proc_dir) {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_micros(nap));
        nap = (nap * 2).min(if start.elapsed() < std::time::Duration::from_millis(2) {
            32
        } else {
            1000
        });
    }
}

/// The process is a zombie or gone (read through its `/proc/PID` descriptor: the caller may be
/// chroot'ed into the sandbox, where `/proc` is the sandbox's own).
fn process_dead(proc_dir: &OwnedFd) -> bool {
    let mut buf = [0u8; 512];
    // SAFETY: valid C string relative to our directory descriptor.
    let fd = unsafe {
        libc::openat(
            proc_dir.as_raw_fd(),
            c"stat".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return true;
    }
    // SAFETY: `buf` is writable for its length; `fd` is ours and closed right after.
    let n = unsafe {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    if n <= 0 {
        return true;
    }
    let text = String::from_utf8_lossy(&buf[..n as usize]);
    text.rsplit_once(") ")
        .is_none_or(|(_, rest)| rest.starts_with(['Z', 'X']))
}

/// Keeps the calling thread on its CPU for a short run of calls that start the stop of many
/// threads: at `SCHED_FIFO` (lowest real-time priority) until dropped, if it runs at
/// `SCHED_OTHER` now (nested windows do nothing).
///
/// Why: on a CPU shared with the service, each `PTRACE_INTERRUPT` can make a service thread
/// runnable, and a fair scheduler may run it (or another busy thread not yet interrupted)
/// before the caller's next call: a whole time slice, each time. memcached (ten threads, four
/// busy) pinned with its checkpointer to one CPU took a median 3.4–3.8 ms to stop, 0.17 ms
/// with the window. At real-time priority no fair thread runs until the window ends. The
/// window must not wait for a service thread (it could not run): the stop issues its
/// interrupts in one, then waits at normal priority. Needs `CAP_SYS_NICE` (root); without it
/// the window does nothing.
struct RtWindow(bool);

impl RtWindow {
    fn enter() -> RtWindow {
        // SAFETY: sched_getscheduler and sched_setscheduler on the calling thread (0), with a
        // valid sched_param; they change only this thread's policy.
        let entered = unsafe {
            libc::sched_getscheduler(0) == libc::SCHED_OTHER && {
                let p = libc::sched_param { sched_priority: 1 };
                libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0
            }
        };
        RtWindow(entered)
    }
}

impl Drop for RtWindow {
    fn drop(&mut self) {
        if self.0 {
            let p = libc::sched_param { sched_priority: 0 };
            // SAFETY: as in `enter`. Back to SCHED_OTHER; the nice value is kept.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &p) };
        }
    }
}

/// `PTRACE_O_SUSPEND_SECCOMP`: while it is set on a traced thread, the thread's seccomp
/// filters do not apply, so the system calls we inject (and the agent's operations) are never
/// refused, trapped or fatal because of a filter the service installed; they apply again from
/// the detach (which clears every option). It is set only once the thread is in its
/// interrupt stop: set at the seize, it would let a call the thread makes before it stops
/// pass its filters (the mprotect tracker's agent's among them). The kernel allows it to a
/// tracer with `CAP_SYS_ADMIN` that is not itself under seccomp (and with
/// `CONFIG_CHECKPOINT_RESTORE`); elsewhere threads are traced without it.
const PTRACE_O_SUSPEND_SECCOMP: u64 = 1 << 21;

/// Suspends the seccomp filters of `tid`, stopped (see [`PTRACE_O_SUSPEND_SECCOMP`]), where
/// the kernel lets us.
fn suspend_seccomp(tid: Pid) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static REFUSED: AtomicBool = AtomicBool::new(false);
    if REFUSED.load(Ordering::Relaxed) {
        return;
    }
    let opts = PTRACE_O_TRACESYSGOOD | PTRACE_O_SUSPEND_SECCOMP;
    // SAFETY: SETOPTIONS takes the options as data, no pointers.
    if let Err(e) = unsafe { ptrace(libc::PTRACE_SETOPTIONS, tid, 0, opts) }
        && matches!(e.raw_os_error(), Some(libc::EPERM | libc::EINVAL))
    {
        tracing::debug!("seccomp cannot be suspended while tracing here: {e}");
        REFUSED.store(true, Ordering::Relaxed);
    }
}

/// What `PTRACE_GET_SYSCALL_INFO` says about a syscall stop: `op` 1 = entry (`nr_or_rval` is
/// the number), 2 = exit (`nr_or_rval` is the return value); `ip` is the address after the
/// `syscall` instruction.
struct SyscallInfo {
    op: u8,
    ip: u64,
    nr_or_rval: u64,
}

fn syscall_info(tid: Pid) -> Result<SyscallInfo> {
    const PTRACE_GET_SYSCALL_INFO: u32 = 0x420e;
    // struct ptrace_syscall_info: u8 op, u8 pad[3], u32 arch, u64 ip, u64 sp, then
    // entry { u64 nr, u64 args[6] } or exit { s64 rval, u8 is_error }.
    let mut buf = [0u64; 11];
    // SAFETY: the kernel writes at most `addr` (= size of buf) bytes to `data`.
    unsafe {
        ptrace(
            PTRACE_GET_SYSCALL_INFO,
            tid,
            std::mem::size_of_val(&buf) as u64,
            buf.as_mut_ptr() as u64,
        )
    }
    .map_err(op("get_syscall_info", tid))?;
    Ok(SyscallInfo {
        op: buf[0] as u8,
        ip: buf[1],
        nr_or_rval: buf[3],
    })
}

/// A process whose every thread is in a ptrace stop. Resumes them all when dropped.
pub struct Stopped {
    pub pid: Pid,
    /// Host TIDs, in the order they were stopped (the thread-group leader first).
    pub tids: Vec<Pid>,
    syscall_insn: Option<u64>,
    /// `/proc/PID`, for liveness checks that work inside the sandbox's view.
    proc_dir: OwnedFd,
    /// How many times a thread was let run while stopped (an injected call, an agent
    /// operation, a signal delivered): a signal can arrive only then, or from outside.
    pub(crate) ran: u64,
    /// Set once the threads' state is being read (see `capture::deliver_pending_signals`): from
    /// then on an injected call ([`Stopped::inject`], [`Stopped::call`]) runs with every signal
    /// blocked in its thread. A signal delivered then would change registers, mask and stack
    /// that were already read (the image would hold a thread outside its handler with the
    /// handler's mask: the signal blocked for good); blocked, one that arrives stays pending,
    /// for the capture's final check.
    pub(crate) calls_hold_signals: bool,
    /// The signals (a mask, bit `n - 1` for signal `n`) a call let run raised again with
    /// `tgkill` after the kernel had taken them (see [`Stopped::run_injected`]): queued by us,
    /// with our `SI_TKILL` details instead of the sender's, so a capture must not take one for
    /// a signal another process sent (see `capture::final_pending_check`). Cleared by the
    /// capture as it starts a reading.
    pub(crate) reraised: u64,
    _not_send: PhantomData<*const ()>,
}

impl Stopped {
    /// Seizes and stops every thread of `pid`, rescanning `/proc/PID/task` until no new thread
    /// appears.
    pub fn stop(proc: &crate::procfs::Proc) -> Result<Stopped> {
        let pid = proc.pid;
        let mut st = Stopped {
            pid,
            tids: Vec::new(),
            syscall_insn: None,
            proc_dir: proc.dir_fd().map_err(op("dup /proc dir", pid))?,
            ran: 0,
            calls_hold_signals: false,
            reraised: 0,
            _not_send: PhantomData,
        };
        // Threads found gone (exited, or zombies: a leader that called pthread_exit stays one
        // while the other threads run): listed by `/proc/PID/task` still, never new again.
        let mut gone: Vec<Pid> = Vec::new();
        loop {
            let now = proc.tids().map_err(op("list threads", pid))?;
            let new: Vec<Pid> = now
                .iter()
                .copied()
                .filter(|t| !st.tids.contains(t) && !gone.contains(t))
                .collect();
            if new.is_empty() {
                break;
            }
            // Every new thread interrupted before any is waited for, none of them running in
            // between (`RtWindow`); they stop once they run again, after the window.
            let window = RtWindow::enter();
            for &tid in &new {
                // SAFETY: SEIZE/INTERRUPT take no pointers.
                let r = unsafe { ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACESYSGOOD) }
                    .and_then(|_| unsafe { ptrace(PTRACE_INTERRUPT, tid, 0, 0) });
                match r {
                    Ok(_) => st.tids.push(tid),
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => gone.push(tid), // exited
                    // A thread that has exited but is not reaped yet (a zombie) refuses to be
                    // traced with EPERM: it is gone as far as the process's state goes.
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) && exited(proc, tid) => {
                        gone.push(tid);
                    }
                    Err(e) => {
                        return Err(PtraceError::Op {
                            op: "seize",
                            tid,
                            source: e,
                        });
                    }
                }
            }
            drop(window);
            for &tid in &new {
                if !st.tids.contains(&tid) {
                    continue;
                }
                match st.wait_interrupt_stop(tid) {
                    Ok(()) => suspend_seccomp(tid),
                    // A thread that exits while we stop the others is simply gone; only the
                    // leader's exit ends the process.
                    Err(PtraceError::Exited { tid }) if tid != pid => {
                        st.tids.retain(|&t| t != tid);
                        gone.push(tid);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        // Every thread gone (the process exited meanwhile): nothing is stopped. Callers take
        // `tids[0]` as the leader; an empty list panicked an instance's restore of a service
        // that exits at once.
        if st.tids.is_empty() {
            return Err(st.died());
        }
        // The thread-group leader first: it becomes the restorer's own thread at restore.
        st.tids.sort_by_key(|&t| (t != pid, t));
        Ok(st)
    }

    fn wait_interrupt_stop(&mut self, tid: Pid) -> Result<()> {
        loop {
            let Some(status) = wait_tid(self.pid, tid, &self.proc_dir).map_err(op("wait", tid))?
            else {
                return Err(self.died());
            };
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return Err(PtraceError::Exited { tid });
            }
            if (status >> 16) == PTRACE_EVENT_STOP {
                return Ok(());
            }
            let sig = libc::WSTOPSIG(status);
            if matches!(
                sig,
                libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE
            ) {
                // SAFETY: siginfo_t is plain data the kernel fills.
                let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: GETSIGINFO writes one siginfo_t.
                let _ = unsafe { ptrace(libc::PTRACE_GETSIGINFO, tid, 0, (&raw mut si) as u64) };
                let rip = self.regs(tid).map(|r| r.rip).unwrap_or(0);
                // SAFETY: reading the fault address of a fault signal's siginfo.
                let addr = unsafe { si.si_addr() } as u64;
                // A write to a page the mprotect tracker protected is routine (debug level).
                if sig == libc::SIGSEGV && si.si_code == 2 {
                    tracing::debug!(
                        tid,
                        addr = format!("{addr:#x}"),
                        "write fault while stopping"
                    );
                } else {
                    tracing::warn!(
                        tid,
                        sig,
                        rip = format!("{rip:#x}"),
                        addr = format!("{addr:#x}"),
                        code = si.si_code,
                        "fault signal while stopping"
                    );
                }
            }
            // A signal-delivery stop: deliver it and keep waiting for our interrupt.
            // SAFETY: CONT takes the signal number as data, no pointers.
            unsafe { ptrace(libc::PTRACE_CONT, tid, 0, sig as u64) }.map_err(op("cont", tid))?;
        }
    }

    /// The whole process died while traced: reap the threads we trace (best effort) so no
    /// zombie is left waiting for us, and say so.
    ///
    /// This matters beyond tidiness: a killed PID namespace's init waits until every task in
    /// it is reaped, and a traced zombie is reaped only by its tracer. The leader is reported
    /// last, once every other thread is reaped.
    fn died(&mut self) -> PtraceError {
        reap(std::mem::take(&mut self.tids));
        PtraceError::ProcessDied { pid: self.pid }
    }

    pub fn regs(&self, tid: Pid) -> Result<Regs> {
        let mut r = Regs::default();
        // SAFETY: GETREGS writes a `user_regs_struct`, which `Regs` mirrors.
        unsafe { ptrace(libc::PTRACE_GETREGS, tid, 0, (&raw mut r) as u64) }
            .map_err(op("getregs", tid))?;
        Ok(r)
    }

    pub fn set_regs(&self, tid: Pid, r: &Regs) -> Result<()> {
        // SAFETY: SETREGS reads a `user_regs_struct`, which `Regs` mirrors.
        unsafe { ptrace(libc::PTRACE_SETREGS, tid, 0, r as *const Regs as u64) }
            .map_err(op("setregs", tid))?;
        Ok(())
    }

    /// The XSAVE area (`NT_X86_XSTATE`), whole: the buffer is larger than any area the plan can
    /// carry, so the caller can refuse one that does not fit instead of truncating it.
    pub fn xstate(&self, tid: Pid) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 4 * crate::abi::XSTATE_MAX];
        let (p, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is writable for `len` bytes.
        let n = unsafe { self.xstate_regset(PTRACE_GETREGSET, tid, p, len) }
            .map_err(op("getregset(xstate)", tid))?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Puts back an XSAVE area read with [`Stopped::xstate`].
    pub fn set_xstate(&self, tid: Pid, xs: &[u8]) -> Result<()> {
        // SAFETY: SETREGSET only reads the `xs.len()` bytes at `xs`.
        unsafe { self.xstate_regset(PTRACE_SETREGSET, tid, xs.as_ptr() as *mut u8, xs.len()) }
            .map_err(op("setregset(xstate)", tid))?;
        Ok(())
    }

    /// `PTRACE_GETREGSET`/`SETREGSET` of `NT_X86_XSTATE` through an iovec over `len` bytes at
    /// `p`; returns the length the kernel left in the iovec.
    ///
    /// # Safety
    /// `p` must be valid for `len` bytes (writable for `GETREGSET`).
    unsafe fn xstate_regset(
        &self,
        req: u32,
        tid: Pid,
        p: *mut u8,
        len: usize,
    ) -> io::Result<usize> {
        let mut iov = libc::iovec {
            iov_base: p.cast(),
            iov_len: len,
        };
        // SAFETY: the iovec describes memory the caller vouches for; the kernel shrinks
        // iov_len to what it wrote (GETREGSET).
        unsafe { ptrace(req, tid, NT_X86_XSTATE as u64, (&raw mut iov) as u64) }?;
        Ok(iov.iov_len)
    }

    /// Copies up to `buf.len()` signals queued for thread `tid` (`shared`: for the whole
    /// process), from the `off`-th on, into `buf` without dequeuing them; how many.
    fn peek_siginfo(
        &self,
        tid: Pid,
        shared: bool,
        off: usize,
        buf: &mut [[u8; SIGINFO_SIZE]],
    ) -> Result<usize> {
        #[repr(C)]
        struct PeekArgs {
            off: u64,
            flags: u32,
            nr: i32,
        }
        let args = PeekArgs {
            off: off as u64,
            flags: shared as u32, // PTRACE_PEEKSIGINFO_SHARED
            nr: buf.len().min(i32::MAX as usize) as i32,
        };
        // SAFETY: PEEKSIGINFO reads `args` and writes at most `nr` siginfo_t (128 bytes each)
        // to `data`, which has room for `buf.len()` of them.
        let n = unsafe {
            ptrace(
                PTRACE_PEEKSIGINFO,
                tid,
                (&raw const args) as u64,
                buf.as_mut_ptr() as u64,
            )
        }
        .map_err(op("peeksiginfo", tid))?;
        Ok((n as usize).min(buf.len()))
    }

    /// The number of the first signal queued for thread `tid` (`shared`: for the whole
    /// process), without dequeuing it. Cheaper than reading `/proc/PID/task/TID/status`.
    pub fn peek_pending(&self, tid: Pid, shared: bool) -> Result<Option<i32>> {
        let mut si = [[0u8; SIGINFO_SIZE]; 1];
        let n = self.peek_siginfo(tid, shared, 0, &mut si)?;
        Ok((n > 0).then(|| PendingSignal::signo_of(&si[0]) as i32))
    }

    /// Every signal queued to thread `tid` (`shared`: to its process) and not yet delivered,
    /// oldest first, each as its `siginfo_t` bytes (in batches). At most a little over `max`
    /// (a longer queue is an error the caller names).
    pub fn peek_all_pending(
        &self,
        tid: Pid,
        shared: bool,
        max: usize,
    ) -> Result<Vec<[u8; SIGINFO_SIZE]>> {
        const BATCH: usize = 32;
        let mut out = Vec::new();
        let mut buf = [[0u8; SIGINFO_SIZE]; BATCH];
        loop {
            let n = self.peek_siginfo(tid, shared, out.len(), &mut buf)?;
            out.extend_from_slice(&buf[..n]);
            if n < BATCH || out.len() > max {
                return Ok(out);
            }
        }
    }

    /// Sets the thread's blocked-signal mask.
    pub fn set_sigmask(&self, tid: Pid, mask: u64) -> Result<()> {
        // SAFETY: SETSIGMASK reads `addr` (= 8) bytes from `data`.
        unsafe { ptrace(PTRACE_SETSIGMASK, tid, 8, (&raw const mask) as u64) }
            .map_err(op("setsigmask", tid))?;
        Ok(())
    }

    pub fn sigmask(&self, tid: Pid) -> Result<u64> {
        let mut m: u64 = 0;
        // SAFETY: GETSIGMASK writes `addr` (= 8) bytes to `data`.
        unsafe { ptrace(PTRACE_GETSIGMASK, tid, 8, (&raw mut m) as u64) }
            .map_err(op("getsigmask", tid))?;
        Ok(m)
    }

    /// (address, length, signature) of the thread's registered rseq area, if any.
    pub fn rseq(&self, tid: Pid) -> Result<Option<(u64, u32, u32)>> {
        #[repr(C)]
        #[derive(Default)]
        struct RseqConf {
            addr: u64,
            len: u32,
            flags: u32,
            sig: u32,
            _pad: u32,
        }
        let mut c = RseqConf::default();
        // SAFETY: the kernel writes at most `addr` bytes of the configuration to `data`.
        unsafe {
            ptrace(
                PTRACE_GET_RSEQ_CONFIGURATION,
                tid,
                std::mem::size_of::<RseqConf>() as u64,
                (&raw mut c) as u64,
            )
        }
        .map_err(op("get_rseq_configuration", tid))?;
        Ok((c.addr != 0).then_some((c.addr, c.len, c.sig)))
    }

    /// Filter `index` of thread `tid`'s seccomp chain, **0 being the oldest** (measured on
    /// Linux 6.18, against what ptrace(2) says), with its flags
    /// (`PTRACE_GET_SECCOMP_METADATA`: only `SECCOMP_FILTER_FLAG_LOG` is reported). `None`
    /// past the chain's end, or when the thread is not in filter mode (`EINVAL`).
    pub fn seccomp_filter(&self, tid: Pid, index: u64) -> Result<Option<(u32, Vec<u64>)>> {
        const PTRACE_SECCOMP_GET_FILTER: u32 = 0x420c;
        const PTRACE_GET_SECCOMP_METADATA: u32 = 0x420d;
        // SAFETY: a NULL buffer asks only for the number of instructions.
        let n = match unsafe { ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, 0) } {
            Ok(n) => n as usize,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => {
                return Ok(None);
            }
            Err(e) => return Err(op("seccomp_get_filter", tid)(e)),
        };
        if n == 0 || n > crate::image::SECCOMP_MAX_INSNS {
            return Err(op("seccomp_get_filter", tid)(io::Error::other(format!(
                "filter {index} has {n} instructions"
            ))));
        }
        let mut insns = vec![0u64; n];
        // SAFETY: the kernel writes `n` 8-byte `struct sock_filter`s (the length it just
        // reported; a filter never changes once installed) into `insns`.
        let got = unsafe {
            ptrace(
                PTRACE_SECCOMP_GET_FILTER,
                tid,
                index,
                insns.as_mut_ptr() as u64,
            )
        }
        .map_err(op("seccomp_get_filter", tid))?;
        if got as usize != n {
            return Err(op("seccomp_get_filter", tid)(io::Error::other(
                "filter changed length",
            )));
        }
        // struct seccomp_metadata { u64 filter_off; u64 flags; }
        let mut md = [index, 0u64];
        // SAFETY: the kernel reads `filter_off` and writes at most `addr` (16) bytes.
        unsafe { ptrace(PTRACE_GET_SECCOMP_METADATA, tid, 16, md.as_mut_ptr() as u64) }
            .map_err(op("get_seccomp_metadata", tid))?;
        Ok(Some((md[1] as u32, insns)))
    }

    /// `get_robust_list(tid)` works from outside for a traced thread.
    pub fn robust_list(&self, tid: Pid) -> Result<(u64, u64)> {
        let (mut head, mut len): (u64, usize) = (0, 0);
        // SAFETY: the kernel writes one pointer and one size_t.
        cvt(unsafe {
            libc::syscall(
                libc::SYS_get_robust_list,
                tid,
                (&raw mut head),
                (&raw mut len),
            )
        })
        .map_err(op("get_robust_list", tid))?;
        Ok((head, len as u64))
    }

    /// Detaches every thread; the kernel restarts interrupted system calls as after a signal.
    pub fn resume(self) -> Result<()> {
        self.resume_at().map(|_| ())
    }

    /// [`Stopped::resume`], returning when the last thread was released: the clock read right
    /// before the call that detaches it. The threads go in reverse stop order, the group
    /// leader last: in most servers it runs the event loop, and a released thread that is
    /// busy may preempt the caller on its CPU before the call returns (~180 µs measured),
    /// while threads not yet detached stay stopped. With the busy one last, every thread runs
    /// by then, and the time until the call returns is not the service's pause.
    pub fn resume_at(mut self) -> Result<std::time::Instant> {
        let tids = std::mem::take(&mut self.tids);
        let (released, r) = detach_all(&tids);
        r.map(|()| released)
    }
}

/// Whether thread `tid` of `proc` has exited (zombie, dead, or gone from `/proc`).
fn exited(proc: &crate::procfs::Proc, tid: Pid) -> bool {
    match proc.read_string(&format!("task/{tid}/stat")) {
        // The state follows the parenthesised name, which may itself contain ") ".
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_none_or(|c| matches!(c, 'Z' | 'X' | 'x')),
        Err(_) => true,
    }
}

/// Detaches every thread, in reverse order (`tids[0]`, the group leader, last), and returns the
/// clock read right before the last detach with the result. A thread that died meanwhile
/// cannot be detached (`ESRCH`) and stays a zombie traced by us until we reap it — which we
/// must, or a killed sandbox init would wait for it forever — so those are reaped here.
fn detach_all(tids: &[Pid]) -> (std::time::Instant, Result<()>) {
    let mut first_err = None;
    let mut dead = Vec::new();
    let mut released = std::time::Instant::now();
    // No `RtWindow` here: with one, a released thread could not run before the last one is
    // released, which made memcached's pause ~1 ms instead of ~5 ms (its workers, released
    // first, ran meanwhile), but it also let the loop go on at once to encode, ahead of the
    // service's backlog: tracked Redis lost ~8% of SET at 10 ms epochs, memcached ~13%
    // (docs/BENCHMARKS.md).
    for (i, &tid) in tids.iter().enumerate().rev() {
        if i == 0 {
            released = std::time::Instant::now();
        }
        // SAFETY: DETACH takes no pointers.
        match unsafe { ptrace(libc::PTRACE_DETACH, tid, 0, 0) } {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => dead.push(tid),
            Err(e) => {
                first_err.get_or_insert(PtraceError::Op {
                    op: "detach",
                    tid,
                    source: e,
                });
            }
        }
    }
    reap(dead);
    (released, first_err.map_or(Ok(()), Err))
}

/// Reaps traced threads that died (bounded: 2 s). A group leader is reported only after every
/// other thread of its group is reaped.
fn reap(mut left: Vec<Pid>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !left.is_empty() && std::time::Instant::now() < deadline {
        left.retain(|&t| {
            let mut st = 0;
            // SAFETY: non-blocking waitpid on a thread we traced.
            let r = unsafe { libc::waitpid(t, &mut st, libc::__WALL | libc::WNOHANG) };
            r == 0 // not reported yet; reaped, or not ours (ECHILD): done
        });
        if !left.is_empty() {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = detach_all(&std::mem::take(&mut self.tids)).1;
    }
}

/// How a run of our code in a stopped thread ended.
enum Ran {
    /// It ran: the result (`rax`) and signals that arrived meanwhile, to raise again.
    Done(i64, Vec<i32>),
    /// A signal pending from before stopped the thread first (see
    /// [`Stopped::deliver_pending`]); nothing of ours ran.
    Pending(i32),
}

/// Placeholder argument for [`Stopped::inject`]: replaced by the scratch buffer's address.
pub const SCRATCH: u64 = u64::MAX - 0x5c;

/// Registers as the words a checkpoint stores them in.
pub(crate) fn regs_to_vec(r: &Regs) -> Vec<u64> {
    // SAFETY: `Regs` is `repr(C)` of 27 u64 fields, no padding.
    unsafe { std::slice::from_raw_parts((r as *const Regs).cast::<u64>(), 27) }.to_vec()
}

/// Registers from a checkpoint's words.
pub(crate) fn regs_from_slice(v: &[u64]) -> Regs {
    let mut r = Regs::default();
    // SAFETY: `Regs` is `repr(C)` of 27 u64 fields; `v` has 27 words (checked at decode).
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), (&raw mut r).cast::<u64>(), 27) };
    r
}

mod inject;

#[cfg(test)]
mod tests {
    use super::{RtWindow, Stopped};

    /// The window raises the calling thread to SCHED_FIFO and puts it back to SCHED_OTHER with
    /// its nice value; a window opened inside another changes nothing when it closes.
    #[test]
    fn a_real_time_window_is_entered_once_and_left_as_it_was() {
        std::thread::spawn(|| {
            // SAFETY: reads the calling thread's policy; no pointers.
            let policy = || unsafe { libc::sched_getscheduler(0) };
            // SAFETY: reads the calling thread's nice value; no pointers.
            let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            // SAFETY: as above (0: the calling thread).
            assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) }, 0);
            assert_eq!(policy(), libc::SCHED_OTHER);
            {
                let outer = RtWindow::enter();
                assert!(outer.0, "root can enter SCHED_FIFO");
                assert_eq!(policy(), libc::SCHED_FIFO);
                {
                    let inner = RtWindow::enter();
                    assert!(!inner.0, "a nested window does nothing");
                }
                assert_eq!(
                    policy(),
                    libc::SCHED_FIFO,
                    "the inner window left it as it was"
                );
            }
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert_eq!(nice(), 3, "the nice value is kept");
        })
        .join()
        .unwrap();
    }

    /// A process whose every thread is gone (a zombie: exited, not reaped) cannot be stopped:
    /// an error, not a `Stopped` with no thread (callers take the first thread as the leader).
    #[test]
    fn a_process_with_no_thread_left_is_not_stopped() {
        // SAFETY: the child only calls `_exit`, which is async-signal-safe.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        // Wait until it is a zombie (not reaped: its /proc entry stays).
        let stat = format!("/proc/{pid}/stat");
        let zombie = || {
            std::fs::read_to_string(&stat).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        };
        let t0 = std::time::Instant::now();
        while !zombie() && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(zombie(), "the child did not become a zombie");
        let proc = crate::procfs::Proc::open(pid).expect("open /proc/PID");
        let r = Stopped::stop(&proc);
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(r.is_err(), "a process without threads was 'stopped'");
    }
}
