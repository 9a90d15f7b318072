//! The mprotect + SIGSEGV tracker (Tardigrade §3.3), for kernels without userfaultfd
//! write-protection: written pages are write-protected at each pause and the agent in the
//! process ([`crate::agent`]) makes a page writable again on its first write.
//!
//! What was written is read from the kernel, never from the agent: at a pause, a writable page
//! inside an armed range was written (or made writable for a system call to write into) since
//! the last pause. Ranges whose layout the app changed during the epoch (`mmap`, `munmap`,
//! `mremap`, `mprotect`, `madvise`, `brk`) come from the agent's log and are captured whole.
//! A pause that finds a thread inside the agent's layout critical section is retried
//! ([`TrackError::Busy`]), so the log, the armed table and the layout always agree when read.
//!
//! Never write-protected (their present pages are read every pause): stacks (the mapping that
//! holds a thread's stack pointer at some pause, `[stack]`, `MAP_STACK` mappings and what looks
//! like a thread stack — writable anonymous memory flagged `nh` or with a guard page below —,
//! signal stacks, rseq areas: the kernel writes there itself, and a fault while it pushes a
//! signal frame would kill the thread) and the agent's own memory.
//!
//! Contents queries ([`Tracker::scan`]) use `/proc/PID/pagemap`, not `PAGEMAP_SCAN`, so the
//! tracker needs nothing newer than seccomp filters.
//!
//! Known limits: system calls outside the agent's list that write into armed memory fail with
//! `EFAULT`; writes that bypass page protection (`/proc/self/mem`, io_uring fixed buffers) are
//! not seen; `execve` fails with `EPERM` (the filter survives `execve`, the agent and its
//! SIGSYS handler do not); a bad pointer passed to an emulated call faults in the agent instead
//! of returning `EFAULT`; the app cannot keep fault signals blocked; system calls in flight when
//! the agent arrives restart through the filter, except those restarting via
//! `restart_syscall` (`poll` and the like with a timeout), which end with `EINTR`.
//!
//! A process with neither `no_new_privs` nor `CAP_SYS_ADMIN` (an ordinary user's), where the
//! kernel refuses the agent's filter, gets `no_new_privs` set for good; images keep the app's
//! own flag ([`Agent::prepare_no_new_privs`], [`Tracker::patch_image`]).

use super::{
    PAGE_IS_FILE, PAGE_IS_PRESENT, PAGE_IS_SWAPPED, PAGE_IS_WRITTEN, Query, TrackError, Tracker,
};
use crate::agent::abi::Header;
use crate::agent::abi::{AGENT_MAGIC, AGENT_VERSION, LOG_CHANGED, LOG_STACK, Range};
use crate::agent::{Agent, normalize};
use crate::image::{ProcessImage, SigAction, ThreadImage};
use crate::procfs::{MapEntry, Proc};
use crate::ptrace::Stopped;
use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::os::ranges::{PAGE, intersect, merge, subtract};
const RSP: usize = 19; // index of rsp in user_regs_struct
const SS_DISABLE: u32 = 2;
/// SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV, SIGSYS: a synchronous fault with its signal
/// blocked kills the process, so these are never blocked while the agent is in charge.
const FAULT_SIGS: u64 = 1 << 3 | 1 << 4 | 1 << 6 | 1 << 7 | 1 << 10 | 1 << 30;

/// A thread stopped inside a system call it made before the agent was there (or before a
/// restore) would finish it without the agent having opened its output buffers, which we are
/// about to protect: a `poll` with a timeout would then fail with `EFAULT`. Calls that restart
/// by re-executing their `syscall` instruction are trapped by the filter on the way and served
/// properly; those that restart through `restart_syscall` (`poll`, `nanosleep` & co. with a
/// timeout: `-ERESTART_RESTARTBLOCK`) are ended with `EINTR` instead, as a signal would, and the
/// app calls again (through the agent).
fn interrupt_unserved_calls(st: &mut Stopped, agent: &Agent) -> Result<(), TrackError> {
    const ERESTART_RESTARTBLOCK: i64 = -516;
    const EINTR: i64 = -4;
    let (ts, te) = agent.text();
    for &tid in &st.tids.clone() {
        let mut r = st.regs(tid).map_err(crate::agent::AgentError::from)?;
        let in_agent = (ts..te).contains(&r.rip.wrapping_sub(2));
        if r.rax as i64 == ERESTART_RESTARTBLOCK && (r.orig_rax as i64) >= 0 && !in_agent {
            r.rax = EINTR as u64;
            r.orig_rax = u64::MAX;
            st.set_regs(tid, &r)
                .map_err(crate::agent::AgentError::from)?;
        }
    }
    Ok(())
}

/// The stopped process's threads as `gettid` gives them inside its PID namespace (the agent's
/// control block names threads so).
fn ns_tids(st: &Stopped, proc: &Proc) -> Result<Vec<u32>, TrackError> {
    st.tids
        .iter()
        .map(|&t| proc.ns_pid(t).map(|n| n as u32))
        .collect::<std::io::Result<_>>()
        .map_err(TrackError::Pagemap)
}

/// Unblocks the fault signals in every thread. The agent keeps them out of every mask the app
/// installs; this catches masks from before it was there (a thread stopped inside the app's
/// own SIGSEGV handler, whose mask blocks SIGSEGV, would die at its next write to an armed
/// page) and masks a signal frame put back.
fn unblock_faults(st: &mut Stopped) -> Result<(), TrackError> {
    for &tid in &st.tids.clone() {
        let m = st.sigmask(tid).map_err(crate::agent::AgentError::from)?;
        if m & FAULT_SIGS != 0 {
            st.set_sigmask(tid, m & !FAULT_SIGS)
                .map_err(crate::agent::AgentError::from)?;
        }
    }
    Ok(())
}

pub struct MprotectTracker {
    agent: Agent,
    pagemap: File,
    pm_buf: Vec<u8>,
    /// This pause's layout as the kernel shows it (armed pages read-only).
    raw: Vec<MapEntry>,
    hdr: Header,
    entries: Vec<Range>,
    /// Ranges the app changed the layout of since the last pause: captured whole.
    changed: Vec<(u64, u64)>,
    /// The log overflowed: every range is captured whole.
    everything: bool,
    /// Never write-protected (sorted, merged).
    stacks: Vec<(u64, u64)>,
    /// This pause: `stacks` and the agent's own memory (sorted, merged).
    excluded: Vec<(u64, u64)>,
    /// This pause: the writable parts of the layout as the kernel shows it (sorted, merged).
    writable: Vec<(u64, u64)>,
    pending_arm: Vec<(u64, u64)>,
    hot: Vec<(u64, u64)>,
    /// This pause: the pages of the threads' rseq areas, which the kernel rewrites (the CPU
    /// the thread runs on) whenever a thread returns to user mode on another CPU — during the
    /// agent's call in [`Tracker::commit`] too.
    rseq_pages: Vec<u64>,
}

impl MprotectTracker {
    /// Loads the agent into the stopped process (or takes over one already there), lets it
    /// take over SIGSEGV/SIGSYS, installs the filter if the process has none yet, and empties
    /// the armed table (left over by an earlier loop, or stale after a restore).
    pub fn new(
        st: &mut Stopped,
        proc: &Proc,
        maps: &[MapEntry],
        pagemap: File,
    ) -> Result<Self, TrackError> {
        let status = proc.read_string("status").map_err(TrackError::Pagemap)?;
        let agent = match Agent::find(st.pid, maps) {
            Some(a) => {
                // An earlier loop's, or one carried by a restore: what threads no longer
                // there held is freed (a block of another build's agent is left alone).
                if a.header().is_ok_and(|h| h.version == AGENT_VERSION) {
                    a.release_orphans(&ns_tids(st, proc)?)?;
                }
                a
            }
            None => Agent::load(st, maps)?,
        };
        Self::with_agent(st, maps, pagemap, agent, &status)
    }

    /// Takes over the agent a process inherited: a process that appeared in a tracked tree was
    /// forked by one that carries the agent, and `fork` gave it all of it — the agent's memory
    /// (a private copy of its text, control block and tables), its seccomp filter (inherited,
    /// and it cannot be removed), its SIGSEGV/SIGSYS handlers, `no_new_privs` and the parent's
    /// write-protection of every armed page. A second agent must not be loaded on top (two
    /// filters, two handlers for one signal): this one becomes the process's own.
    ///
    /// Checked first, refused by name ([`TrackError::Adopt`]): the process has an address
    /// space of its own (not its parent's: a `vfork` child or a `clone(CLONE_VM)` process
    /// shares the parent's control block, which this would reset under the parent), the
    /// control block is in a private mapping, and it is this build's (magic, version, and the
    /// text it records is where it is). Then reset for its new owner:
    /// - what the parent's other threads held at the fork (the lock, in-flight slots, retry
    ///   slots: [`Agent::release_orphans`]);
    /// - the dirty bookkeeping inherited from the parent (its table of armed ranges, the log
    ///   of layout changes since its last pause, the fault counters, the pages it had written
    ///   and those still protected): every armed page gets the app's protection back and the
    ///   table, log and counters are emptied, as for an agent an earlier loop left ([`new`]).
    ///   Nothing of it is needed to know what the process wrote: it is captured whole by its
    ///   first pause (`first_capture`), i.e. "everything written", and armed from there.
    ///
    /// The app's SIGSEGV/SIGSYS dispositions and its own `no_new_privs` are the parent's at
    /// the fork (the control block's copy), as the kernel would have given them.
    ///
    /// [`new`]: MprotectTracker::new
    pub fn adopt(
        st: &mut Stopped,
        proc: &Proc,
        maps: &[MapEntry],
        pagemap: File,
    ) -> Result<Self, TrackError> {
        let pid = st.pid;
        let refuse = |why: String| TrackError::Adopt { pid, why };
        let status = proc.read_string("status").map_err(TrackError::Pagemap)?;
        let Some(agent) = Agent::find(pid, maps) else {
            return Err(refuse(
                "it carries no agent (a process forked by a tracked one has its parent's)".into(),
            ));
        };
        let ppid = crate::procfs::status_value(&status, "PPid")
            .and_then(|v| v.trim().parse::<crate::sys::Pid>().ok())
            .unwrap_or(0);
        if ppid > 0 && crate::sys::same_mm(pid, ppid) {
            return Err(refuse(format!(
                "it shares the address space of its parent (host PID {ppid}: vfork before \
                 execve, or clone with CLONE_VM), and so its agent's control block"
            )));
        }
        let ctl = agent.control();
        if !maps
            .iter()
            .any(|m| m.start <= ctl && ctl < m.end && !m.shared && m.write)
        {
            return Err(refuse(format!(
                "its agent's control block ({ctl:#x}) is not in a private writable mapping"
            )));
        }
        let h = agent.header().map_err(TrackError::Pagemap)?;
        if h.magic != AGENT_MAGIC
            || h.version != AGENT_VERSION
            || (h.text_start, h.text_end) != agent.text()
        {
            return Err(refuse(format!(
                "its agent's control block is not this build's agent's (magic {:#x}, version \
                 {}, text {:#x}-{:#x})",
                h.magic, h.version, h.text_start, h.text_end
            )));
        }
        let freed = agent.release_orphans(&ns_tids(st, proc)?)?;
        if freed != Default::default() {
            tracing::debug!(
                pid,
                ?freed,
                "freed what the parent's threads held in the agent"
            );
        }
        Self::with_agent(st, maps, pagemap, agent, &status)
    }

    /// Makes `agent` the process's tracker (see [`MprotectTracker::new`]); `status` is the
    /// process's `status` text, read while it is stopped.
    fn with_agent(
        st: &mut Stopped,
        maps: &[MapEntry],
        pagemap: File,
        agent: Agent,
        status: &str,
    ) -> Result<Self, TrackError> {
        let filtered =
            crate::procfs::status_value(status, "Seccomp").is_some_and(|v| v.trim() != "0");
        let before = agent.header().map_err(TrackError::Pagemap)?;
        agent.prepare_no_new_privs(st, maps, status, !filtered)?;
        agent.init(st, !filtered)?;
        unblock_faults(st)?;
        interrupt_unserved_calls(st, &agent)?;
        if filtered && before.active != 0 && before.magic == AGENT_MAGIC {
            // An earlier loop on this very process ended without removing its protection, or
            // the process was forked by a tracked one and has its parent's table and armed
            // pages (a restored process has no filter, and the app's protections in its
            // pages): give the app its protection back before the table is dropped.
            agent.disarm_all(st)?;
        }
        // From now on, injected calls must come from the agent's text to pass the filter.
        st.set_syscall_insn(agent.syscall_insn());
        let hdr = agent.header().map_err(TrackError::Pagemap)?;
        if hdr.lock != 0 {
            return Err(TrackError::Busy);
        }
        agent.rearm(st, &[], &[], hdr.log_head)?;
        Ok(MprotectTracker {
            agent,
            pagemap,
            pm_buf: vec![0u8; 8 * 4096],
            raw: Vec::new(),
            hdr,
            entries: Vec::new(),
            changed: Vec::new(),
            everything: false,
            stacks: Vec::new(),
            excluded: Vec::new(),
            writable: Vec::new(),
            pending_arm: Vec::new(),
            hot: Vec::new(),
            rseq_pages: Vec::new(),
        })
    }

    pub fn agent(&self) -> Agent {
        self.agent
    }

    /// Present pages of `[s, e)` (with a fault address's categories), appended to `out`.
    fn present(
        &mut self,
        s: u64,
        e: u64,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<(), TrackError> {
        let q = Query {
            anyof: super::has_contents(),
            ret: PAGE_IS_WRITTEN,
            ..Default::default()
        };
        self.scan(s, e, q, out)
    }
}

impl Tracker for MprotectTracker {
    fn begin(&mut self, st: &mut Stopped) -> Result<(), TrackError> {
        st.set_syscall_insn(self.agent.syscall_insn());
        unblock_faults(st)?;
        let hdr = self.agent.header().map_err(TrackError::Pagemap)?;
        if hdr.lock != 0 {
            return Err(TrackError::Busy);
        }
        self.changed.clear();
        self.everything = hdr.log_overflow != 0;
        for e in self.agent.log(&hdr).map_err(TrackError::Pagemap)? {
            match e.kind {
                LOG_CHANGED => self.changed.push((e.start, e.end)),
                LOG_STACK => self.stacks.push((e.start, e.end)),
                _ => {}
            }
        }
        self.stacks = merge(std::mem::take(&mut self.stacks));
        self.entries = self.agent.entries(&hdr).map_err(TrackError::Pagemap)?;
        self.hdr = hdr;
        Ok(())
    }

    fn layout(&mut self, raw: Vec<MapEntry>) -> Vec<MapEntry> {
        let n = normalize(&raw, &self.entries);
        self.writable = merge(
            raw.iter()
                .filter(|m| m.write)
                .map(|m| (m.start, m.end))
                .collect(),
        );
        self.raw = raw;
        n
    }

    fn threads(&mut self, threads: &[ThreadImage], maps: &[MapEntry]) {
        let mut add = Vec::new();
        self.rseq_pages.clear();
        for t in threads {
            if let Some(&sp) = t.regs.get(RSP)
                && let Some(m) = maps.iter().find(|m| m.start <= sp && sp < m.end)
            {
                add.push((m.start, m.end));
            }
            let a = &t.altstack;
            if a.size > 0 && a.flags & SS_DISABLE == 0 {
                add.push((a.sp & !(PAGE - 1), (a.sp + a.size).div_ceil(PAGE) * PAGE));
            }
            if let Some(r) = &t.rseq {
                let (s, e) = (
                    r.addr & !(PAGE - 1),
                    (r.addr + r.len as u64).div_ceil(PAGE) * PAGE,
                );
                add.push((s, e));
                self.rseq_pages.extend((s..e).step_by(PAGE as usize));
            }
        }
        for m in maps.iter().filter(|m| m.name == "[stack]") {
            add.push((m.start, m.end));
        }
        // Thread stacks no thread runs on right now: glibc keeps the stacks of exited threads
        // for reuse, and a new thread's first push onto a protected stack cannot even be
        // reported (the kernel cannot write the signal frame). They are anonymous writable
        // mappings made with MAP_STACK (shown as `nh` since Linux 6.7) with a guard page right
        // below.
        for (i, m) in maps.iter().enumerate() {
            let guard_below = i > 0 && {
                let g = &maps[i - 1];
                g.end == m.start && g.prot() == 0 && g.inode == 0 && !g.shared
            };
            if m.write
                && !m.shared
                && m.inode == 0
                && m.name.is_empty()
                && (m.has_flag("nh") || guard_below)
            {
                add.push((m.start, m.end));
            }
        }
        self.stacks.extend(add);
        // Forget stack ranges nothing is mapped at any more.
        let mut stacks = merge(std::mem::take(&mut self.stacks));
        stacks.retain(|&(s, e)| maps.iter().any(|m| m.start < e && s < m.end));
        self.stacks = stacks;
        let mut excluded = self.stacks.clone();
        excluded.push(self.agent.range());
        self.excluded = merge(excluded);
    }

    fn arm(&mut self, start: u64, end: u64) -> Result<(), TrackError> {
        self.pending_arm.push((start, end));
        Ok(())
    }

    fn unprotect(&mut self, start: u64, end: u64) -> Result<(), TrackError> {
        self.hot.push((start, end));
        Ok(())
    }

    fn scan(
        &mut self,
        start: u64,
        end: u64,
        q: Query,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<(), TrackError> {
        let per = self.pm_buf.len() / 8;
        let mut left = if q.max_pages == 0 {
            u64::MAX
        } else {
            q.max_pages
        };
        let mut at = start;
        while at < end && left > 0 {
            let n = (((end - at) / PAGE) as usize).min(per);
            let buf = &mut self.pm_buf[..n * 8];
            self.pagemap
                .read_exact_at(buf, (at / PAGE) * 8)
                .map_err(TrackError::Pagemap)?;
            for (i, w) in buf.chunks_exact(8).enumerate() {
                let e = u64::from_ne_bytes(w.try_into().unwrap());
                let cats = if e >> 63 & 1 != 0 { PAGE_IS_PRESENT } else { 0 }
                    | if e >> 62 & 1 != 0 { PAGE_IS_SWAPPED } else { 0 }
                    | if e >> 61 & 1 != 0 { PAGE_IS_FILE } else { 0 };
                let c = cats ^ q.inverted;
                if c & q.mask != q.mask || (q.anyof != 0 && c & q.anyof == 0) {
                    continue;
                }
                let addr = at + i as u64 * PAGE;
                let ret = if q.ret == PAGE_IS_WRITTEN {
                    PAGE_IS_WRITTEN
                } else {
                    cats & q.ret
                };
                match out.last_mut() {
                    Some(r) if r.1 == addr && r.2 == ret => r.1 += PAGE,
                    _ => out.push((addr, addr + PAGE, ret)),
                }
                left -= 1;
                if left == 0 {
                    break;
                }
            }
            at += n as u64 * PAGE;
        }
        Ok(())
    }

    fn take_written(
        &mut self,
        start: u64,
        end: u64,
        out: &mut Vec<(u64, u64, u64)>,
    ) -> Result<Option<()>, TrackError> {
        if self.everything || self.changed.iter().any(|&(s, e)| s < end && start < e) {
            return Ok(None);
        }
        // Writable now = written since the last pause (or opened for a system call, or hot).
        let from = self.writable.partition_point(|r| r.1 <= start);
        let to = self.writable.partition_point(|r| r.0 < end);
        let writable = intersect(&[(start, end)], &self.writable[from..to]);
        for (s, e) in subtract(&writable, &self.excluded) {
            out.push((s, e, PAGE_IS_WRITTEN));
        }
        // Never protected: whatever is there.
        for (s, e) in intersect(&writable, &self.excluded) {
            self.present(s, e, out)?;
        }
        Ok(Some(()))
    }

    fn count_written(&mut self, _ranges: &[(u64, u64)], _limit: u64) -> u64 {
        self.agent.faults().unwrap_or(0)
    }

    fn commit(
        &mut self,
        st: &mut Stopped,
        armed: &[(u64, u64)],
        maps: &[MapEntry],
    ) -> Result<Vec<u64>, TrackError> {
        let mut table: Vec<Range> = Vec::new();
        for &(s, e) in armed {
            let Some(m) = maps.iter().find(|m| m.start <= s && s < m.end) else {
                continue;
            };
            let prot = m.prot() as u64;
            if prot & 2 == 0 || m.shared {
                continue;
            }
            for (ps, pe) in subtract(&[(s, e)], &self.excluded) {
                table.push(Range {
                    start: ps,
                    end: pe,
                    prot,
                });
            }
        }
        table.sort_by_key(|r| r.start);
        // What to protect: the writable pieces (written this epoch) and the newly armed ranges
        // of every entry, but not the hot pages.
        let mut open = self.writable.clone();
        open.extend(self.pending_arm.iter().copied());
        let open = merge(open);
        // Not protected again now: hot pages, and buffers a system call in flight will write.
        let mut hot = std::mem::take(&mut self.hot);
        let mut protect_nothing = false;
        match self.agent.inflight().map_err(TrackError::Pagemap)? {
            Some(v) => hot.extend(v),
            None => protect_nothing = true,
        }
        let hot = merge(hot);
        let mut runs: Vec<Range> = Vec::new();
        for r in &table {
            for (s, e) in subtract(&intersect(&[(r.start, r.end)], &open), &hot) {
                match runs.last_mut() {
                    Some(l) if l.end == s && l.prot == r.prot & !2 => l.end = e,
                    _ => runs.push(Range {
                        start: s,
                        end: e,
                        prot: r.prot & !2,
                    }),
                }
            }
        }
        self.pending_arm.clear();
        if protect_nothing {
            runs.clear(); // all stays writable: reported as written next pause
        }
        // Pages armed until now that the new table leaves out (a range found to be a stack,
        // say: the kernel merges a thread's stack with an adjacent anonymous mapping) get the
        // app's protection back; a write there would otherwise reach the app as a fault.
        let kept = merge(table.iter().map(|r| (r.start, r.end)).collect());
        for e in &self.entries {
            for (s, end) in subtract(&[(e.start, e.end)], &kept) {
                for m in self.raw.iter().filter(|m| m.start < end && s < m.end) {
                    if !m.write && m.prot() as u64 == e.prot & !2 {
                        runs.push(Range {
                            start: s.max(m.start),
                            end: end.min(m.end),
                            prot: e.prot,
                        });
                    }
                }
            }
        }
        if !self.agent.rearm(st, &table, &runs, self.hdr.log_head)? {
            return Err(TrackError::Busy);
        }
        // What the call wrote: the agent's control block, and the rseq area of the thread it
        // ran on (the kernel's CPU number, rewritten on the way back to user mode).
        let mut touched = self.agent.rearm_pages(table.len(), runs.len());
        touched.extend(self.rseq_pages.iter().copied());
        touched.sort_unstable();
        touched.dedup();
        Ok(touched)
    }

    fn arm_changes_layout(&self) -> bool {
        false
    }

    fn write_faults(&self) -> Option<u64> {
        Some(self.hdr.faults)
    }

    fn patch_image(&self, image: &mut ProcessImage) {
        // `no_new_privs` set by us for the filter: the image gets the app's own (read from the
        // control block every pause: the app may set it meanwhile, which the kernel's status
        // line, and so the credentials cache, cannot show).
        if self.hdr.nnp_forced != 0 {
            image.creds.no_new_privs = self.hdr.app_nnp != 0;
        }
        // The kernel holds the agent's handlers; the image gets the app's own.
        for (signo, a) in [(11u32, self.hdr.app_segv), (31, self.hdr.app_sys)] {
            image.sigactions.retain(|s| s.signo != signo);
            if a.handler != 0 {
                image.sigactions.push(SigAction {
                    signo,
                    handler: a.handler,
                    flags: a.flags,
                    restorer: a.restorer,
                    mask: a.mask,
                });
            }
        }
        image.sigactions.sort_by_key(|s| s.signo);
    }

    fn release(&mut self, proc: &Proc, _armed: &[(u64, u64)]) {
        match Stopped::stop(proc) {
            Ok(mut st) => {
                if let Err(e) = self.agent.disarm_all(&mut st) {
                    tracing::warn!(error = %e, "removing write protection");
                }
                let _ = st.resume();
            }
            Err(e) => tracing::debug!(error = %e, "process gone before tracking was removed"),
        }
    }

    fn name(&self) -> &'static str {
        "mprotect"
    }
}
