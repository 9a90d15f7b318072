//! The supervisor's side of the write-tracking agent (`agent/main.rs`): loading it into a
//! stopped process, the seccomp filter it installs, running its operations, reading its
//! control block, and turning the layout the kernel shows (armed pages read-only) back into
//! the layout the app asked for.
//!
//! Why an agent: on kernels without userfaultfd write-protection, the only way to learn which
//! pages a process writes is to write-protect them with `mprotect` and catch the faults
//! (Tardigrade, §3.3). The fault must be handled in the process, and the process's own
//! `sigaction(SIGSEGV)` and `mprotect` calls must not undo ours, so a small blob is loaded next
//! to the app and a seccomp filter sends those calls to it. See [`crate::track::mprotect`] for
//! the tracker built on it.
//!
//! The agent never decides what was written: that is read from `/proc/PID/maps` (a written
//! page is a writable page inside an armed range), so a handler interrupted by a pause loses
//! nothing. The agent's log only names ranges whose layout the app changed, to be captured
//! whole.

#[path = "../agent/abi.rs"]
pub mod abi;

mod layout {
    include!(concat!(env!("OUT_DIR"), "/agent_layout.rs"));
}

use crate::procfs::MapEntry;
use crate::ptrace::{PtraceError, Stopped};
use crate::sys::{self, Pid};
use abi::*;
use std::io;
use std::mem::{offset_of, size_of};

/// The agent's loadable bytes (file-backed part of its segments, at their offsets).
static IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tardi-agent.bin"));

const PROT_WRITE: u64 = 2;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("loading the write-tracking agent: {what} failed (errno {errno})")]
    Load { what: &'static str, errno: i64 },
    #[error("the write-tracking agent's {op} failed: {detail}")]
    Op { op: &'static str, detail: String },
    #[error(transparent)]
    Ptrace(#[from] PtraceError),
    #[error("reading or writing the agent's control block: {0}")]
    Io(#[from] io::Error),
}

type Result<T> = std::result::Result<T, AgentError>;

/// What [`Agent::release_orphans`] freed: the lock (held by that TID), and in-flight slots.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Orphans {
    pub lock: Option<u32>,
    pub slots: usize,
}

/// An agent loaded at `base` in process `pid`.
#[derive(Debug, Clone, Copy)]
pub struct Agent {
    pub pid: Pid,
    pub base: u64,
}

impl Agent {
    /// The whole reserved range.
    pub fn range(&self) -> (u64, u64) {
        (self.base, self.base + layout::SPAN)
    }

    /// Where the agent's code is: system calls made from here pass the filter.
    pub fn text(&self) -> (u64, u64) {
        let (s, e) = layout::SEGMENTS
            .iter()
            .filter(|seg| seg.2 & 4 != 0)
            .fold((u64::MAX, 0), |(s, e), seg| (s.min(seg.0), e.max(seg.1)));
        (self.base + s, self.base + e)
    }

    /// The agent's `syscall` instruction (see [`Stopped::set_syscall_insn`]).
    pub fn syscall_insn(&self) -> u64 {
        self.base + layout::SYSCALL
    }

    /// The control block's address (in the agent's data, a private writable mapping).
    pub fn control(&self) -> u64 {
        self.base + layout::CONTROL
    }

    /// Finds an agent already loaded in the process (by a previous epoch loop, or carried over
    /// by a restore): its text is an anonymous executable mapping, and the agent's first bytes
    /// sit where the text says the image starts. (Its read-only first page is no landmark: the
    /// kernel merges it with a neighbour that our protection made read-only too.)
    pub fn find(pid: Pid, maps: &[MapEntry]) -> Option<Agent> {
        let head = &IMAGE[..64];
        let (text_off, text_end) = layout::SEGMENTS
            .iter()
            .find(|seg| seg.2 & 4 != 0)
            .map(|seg| (seg.0, seg.1))?;
        let mut buf = [0u8; 64];
        maps.iter()
            .filter(|m| m.inode == 0 && !m.shared && m.exec && m.name.is_empty())
            .flat_map(|m| {
                // The text may have merged with a neighbour on either side.
                [m.start, m.end.wrapping_sub(text_end - text_off)]
            })
            .filter_map(|t| t.checked_sub(text_off))
            .find(|&base| sys::read_remote(pid, base, &mut buf).is_ok() && buf == head)
            .map(|base| Agent { pid, base })
    }

    /// Maps the agent into the stopped process (wherever the kernel puts it) and protects its
    /// segments. Nothing runs yet: see [`Agent::init`].
    pub fn load(st: &mut Stopped, maps: &[MapEntry]) -> Result<Agent> {
        let tid = st.tids[0];
        let prot_rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let (base, _, _) = st.inject(
            maps,
            tid,
            libc::SYS_mmap,
            [0, layout::SPAN, prot_rw, flags, u64::MAX, 0],
            0,
        )?;
        if base < 0 {
            return Err(AgentError::Load {
                what: "mmap",
                errno: -base,
            });
        }
        let agent = Agent {
            pid: st.pid,
            base: base as u64,
        };
        let (ts, te) = agent.text();
        if ts >> 32 != (te - 1) >> 32 {
            // The filter compares the instruction pointer's halves; keep it simple.
            let _ = st.inject(
                maps,
                tid,
                libc::SYS_munmap,
                [agent.base, layout::SPAN, 0, 0, 0, 0],
                0,
            );
            return Err(AgentError::Load {
                what: "placement (text crosses a 4 GiB boundary)",
                errno: 0,
            });
        }
        sys::write_remote(st.pid, agent.base, IMAGE)?;
        for &(s, e, prot) in layout::SEGMENTS {
            if prot == 3 {
                continue; // already read-write
            }
            let (r, _, _) = st.inject(
                maps,
                tid,
                libc::SYS_mprotect,
                [agent.base + s, e - s, prot as u64, 0, 0, 0],
                0,
            )?;
            if r < 0 {
                return Err(AgentError::Load {
                    what: "mprotect",
                    errno: -r,
                });
            }
        }
        Ok(agent)
    }

    /// Makes sure the filter can be installed (`install_filter`) and records the app's own
    /// `no_new_privs` in the control block, for the agent (`PR_GET_NO_NEW_PRIVS`) and the
    /// checkpoints ([`Header::app_nnp`]). `status` is the process's `status` text, read while
    /// it is stopped.
    ///
    /// The kernel installs a seccomp filter only for a thread that has `no_new_privs` or
    /// `CAP_SYS_ADMIN` in its user namespace (`seccomp(2)`, `EACCES`): a service's process
    /// running as an ordinary user (nginx's workers as `www-data`, PostgreSQL) has neither.
    /// Such a process gets `no_new_privs` set here, with an injected
    /// `prctl(PR_SET_NO_NEW_PRIVS, 1)` on the thread that then runs `OP_INIT` (the flag is per
    /// thread; the filter's `SECCOMP_FILTER_FLAG_TSYNC` sets it on every other thread, as the
    /// kernel does for a caller that has it). Why this and not another way:
    /// - the flag cannot be cleared again (nor can the filter be removed): the live process
    ///   keeps both for its life, and passes them to the children it forks. What the flag
    ///   decides is mostly what an `execve` may gain (set-user-ID, file capabilities,
    ///   security-module transitions), and the agent's filter already refuses `execve`;
    ///   besides, it restricts security-module transitions asked for without `execve`
    ///   (AppArmor's `change_profile`, SELinux's `setcon`) and lets the process install
    ///   seccomp filters and Landlock rules it otherwise could not. The app still reads its
    ///   own state through `prctl` (the agent answers it); `/proc/PID/status` shows 1.
    /// - What a checkpoint records, hence what a restore gives back, is the app's own state:
    ///   [`Header::app_nnp`], kept in the agent's control block, which lives as long as the
    ///   process (a later loop finds it) and goes into the image with the agent (a restored
    ///   process gets the app's state from the restorer, so its kernel flag and the record
    ///   agree again until a loop sets it once more).
    /// - Other ways measured or weighed: a process cannot be given `CAP_SYS_ADMIN` from
    ///   outside, and raising it needs it in its permitted set; a user namespace of its own
    ///   (`unshare(CLONE_NEWUSER)`) would change its IDs, its view of capabilities and of
    ///   every file's owner; Syscall User Dispatch needs no privilege but cannot select calls
    ///   by number: every call the app makes would trap (≈3.5 µs each, KERNEL-FACTS.md).
    ///
    /// A process that already had the flag (its own, or ours from an earlier loop: the control
    /// block says so), or that has `CAP_SYS_ADMIN` (nginx's master, running as root), is left
    /// as it is.
    ///
    /// Not kept: the flag per thread. An app that sets it in one thread of several while we
    /// hold it set in all is recorded as having set it in all (a capture without the agent
    /// refuses per-thread credentials, on a refresh).
    pub fn prepare_no_new_privs(
        &self,
        st: &mut Stopped,
        maps: &[MapEntry],
        status: &str,
        install_filter: bool,
    ) -> Result<()> {
        const CAP_SYS_ADMIN: u64 = 1 << 21;
        let before = self.header()?;
        let kernel =
            crate::procfs::status_value(status, "NoNewPrivs").is_some_and(|v| v.trim() == "1");
        let admin = crate::procfs::status_value(status, "CapEff")
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|c| c & CAP_SYS_ADMIN != 0);
        // (forced by us, the app's own)
        let (mut forced, mut app) = if !kernel {
            (false, false) // whatever an old control block says (a restored process: the app's)
        } else if before.magic == AGENT_MAGIC && before.nnp_forced != 0 {
            (true, before.app_nnp != 0) // ours, from an earlier loop on this process
        } else {
            (false, true) // the app's own
        };
        if install_filter && !kernel && !admin {
            let (r, _, _) = st.inject(
                maps,
                st.tids[0],
                libc::SYS_prctl,
                [libc::PR_SET_NO_NEW_PRIVS as u64, 1, 0, 0, 0, 0],
                0,
            )?;
            if r != 0 {
                return Err(AgentError::Op {
                    op: "prctl(PR_SET_NO_NEW_PRIVS) for the filter",
                    detail: format!("errno {}", -r),
                });
            }
            (forced, app) = (true, false);
        }
        let mut fields = (forced as u32).to_ne_bytes().to_vec();
        fields.extend_from_slice(&(app as u32).to_ne_bytes());
        sys::write_remote(
            self.pid,
            self.control() + offset_of!(Control, h.nnp_forced) as u64,
            &fields,
        )?;
        Ok(())
    }

    /// Runs `OP_INIT`: the agent takes over SIGSEGV and SIGSYS and, with `install_filter`,
    /// installs the seccomp filter on every thread (see [`Agent::prepare_no_new_privs`]).
    pub fn init(&self, st: &mut Stopped, install_filter: bool) -> Result<()> {
        let prog = filter(self.text());
        let mut fields = Vec::new();
        fields.extend_from_slice(&(prog.len() as u64).to_ne_bytes());
        sys::write_remote(
            self.pid,
            self.control() + offset_of!(Control, h.filter_len) as u64,
            &fields,
        )?;
        let bytes: Vec<u8> = prog.iter().flat_map(|i| i.to_ne_bytes()).collect();
        sys::write_remote(
            self.pid,
            self.control() + offset_of!(Control, filter) as u64,
            &bytes,
        )?;
        let (ts, te) = self.text();
        let mut text = ts.to_ne_bytes().to_vec();
        text.extend_from_slice(&te.to_ne_bytes());
        sys::write_remote(
            self.pid,
            self.control() + offset_of!(Control, h.text_start) as u64,
            &text,
        )?;
        let r = self.op(st, OP_INIT, install_filter as u64)?;
        if r != self.control() as i64 {
            let detail = match r {
                -13 => "seccomp refused the filter (EACCES: the process lacks CAP_SYS_ADMIN and no_new_privs)".to_string(),
                r if r <= -1000 => format!("seccomp could not synchronise thread {}", -1000 - r),
                r => format!("returned {r}"),
            };
            return Err(AgentError::Op { op: "init", detail });
        }
        Ok(())
    }

    /// Runs an operation on the leader thread.
    fn op(&self, st: &mut Stopped, op: u64, arg: u64) -> Result<i64> {
        let tid = st.tids[0];
        Ok(st.call(tid, self.base + layout::ENTRY, [op, arg], 4096)?)
    }

    /// The control block's fixed part, in one read.
    pub fn header(&self) -> io::Result<Header> {
        let mut buf = [0u8; size_of::<Header>()];
        sys::read_remote(
            self.pid,
            self.control() + offset_of!(Control, h) as u64,
            &mut buf,
        )?;
        // SAFETY: `Header` is plain `repr(C)` integers; any bytes are a valid value.
        Ok(unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<Header>()) })
    }

    /// The control block's in-flight slots, as bytes ([`Inflight`] each).
    fn read_inflight(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; INFLIGHT_CAP * size_of::<Inflight>()];
        sys::read_remote(
            self.pid,
            self.control() + offset_of!(Control, inflight) as u64,
            &mut buf,
        )?;
        Ok(buf)
    }

    /// The owners of the in-flight slots that are taken (TIDs in the process's PID namespace;
    /// see [`Inflight::owner`]).
    pub fn inflight_owners(&self) -> io::Result<Vec<u32>> {
        let buf = self.read_inflight()?;
        Ok(buf
            .chunks_exact(size_of::<Inflight>())
            .map(|s| u64::from_ne_bytes(s[..8].try_into().unwrap()) as u32)
            .filter(|&o| o != 0)
            .collect())
    }

    /// Frees what threads that are not in the process hold in its control block: a child
    /// forked by a process that carries the agent gets a copy of the parent's control block,
    /// with the lock and the in-flight slots its other threads held at that instant (`fork`
    /// copies the calling thread only), which nobody in the child would ever release: a lock
    /// held so would make every pause `Busy` and every layout call of the child spin (the
    /// agent's threads take such a lock over too), a slot would keep its buffers unprotected
    /// for good (or, naming more than a slot holds, all of the process). `tids`: the process's
    /// threads as `gettid` gives them (in its PID namespace). The retry slots (one write fault
    /// let run again per thread) are emptied whoever owns them: at worst, one of the process's
    /// own unexplained faults is let run once more. Every thread must be stopped.
    pub fn release_orphans(&self, tids: &[u32]) -> io::Result<Orphans> {
        let h = self.header()?;
        let mut out = Orphans::default();
        if h.lock != 0 && !tids.contains(&h.lock) {
            sys::write_remote(
                self.pid,
                self.control() + offset_of!(Control, h.lock) as u64,
                &0u32.to_ne_bytes(),
            )?;
            out.lock = Some(h.lock);
        }
        let buf = self.read_inflight()?;
        let slots = self.control() + offset_of!(Control, inflight) as u64;
        for (i, s) in buf.chunks_exact(size_of::<Inflight>()).enumerate() {
            let owner = u64::from_ne_bytes(s[..8].try_into().unwrap());
            if owner != 0 && !tids.contains(&(owner as u32)) {
                // `owner` and `n` (a free slot's `n` is reset when it is claimed).
                sys::write_remote(
                    self.pid,
                    slots + (i * size_of::<Inflight>()) as u64,
                    &[0u8; 16],
                )?;
                out.slots += 1;
            }
        }
        sys::write_remote(
            self.pid,
            self.control() + offset_of!(Control, retry) as u64,
            &[0u8; RETRY_SLOTS * 16],
        )?;
        Ok(out)
    }

    /// Pages made writable since the last rearm, by faults and for system calls (read while
    /// the process runs: two words).
    pub fn faults(&self) -> io::Result<u64> {
        let mut b = [0u8; 16];
        sys::read_remote(
            self.pid,
            self.control() + offset_of!(Control, h.faults) as u64,
            &mut b,
        )?;
        let w = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().unwrap());
        Ok(w(0) + w(8))
    }

    fn read_ranges(&self, off: usize, n: usize) -> io::Result<Vec<Range>> {
        let mut buf = vec![0u8; n * size_of::<Range>()];
        sys::read_remote(self.pid, self.control() + off as u64, &mut buf)?;
        Ok(buf
            .chunks_exact(24)
            .map(|c| Range {
                start: u64::from_ne_bytes(c[0..8].try_into().unwrap()),
                end: u64::from_ne_bytes(c[8..16].try_into().unwrap()),
                prot: u64::from_ne_bytes(c[16..24].try_into().unwrap()),
            })
            .collect())
    }

    /// The armed entries (table and extra), without the disarmed ones, sorted.
    pub fn entries(&self, h: &Header) -> io::Result<Vec<Range>> {
        let mut v = self.read_ranges(
            offset_of!(Control, table),
            (h.n_table as usize).min(TABLE_CAP),
        )?;
        v.extend(self.read_ranges(
            offset_of!(Control, extra),
            (h.n_extra as usize).min(EXTRA_CAP),
        )?);
        v.retain(|r| r.prot != DISARMED && r.start < r.end);
        v.sort_by_key(|r| r.start);
        Ok(v)
    }

    /// Output buffers of system calls in flight (see [`Inflight`]): not to be protected again
    /// in this pause. `Ok(None)`: some call names more than a slot holds — protect nothing.
    pub fn inflight(&self) -> io::Result<Option<Vec<(u64, u64)>>> {
        let buf = self.read_inflight()?;
        let w = |o: usize| u64::from_ne_bytes(buf[o..o + 8].try_into().unwrap());
        let mut out = Vec::new();
        for i in 0..INFLIGHT_CAP {
            let o = i * size_of::<Inflight>();
            if w(o) == 0 {
                continue;
            }
            let n = w(o + 8) as usize;
            if n > INFLIGHT_RANGES {
                return Ok(None);
            }
            for k in 0..n {
                let r = o + 16 + k * 16;
                out.push((w(r), w(r + 8)));
            }
        }
        Ok(Some(out))
    }

    /// Log entries `[cursor, head)` (only meaningful while the lock is free). `None`: more
    /// were written than the log holds (see `log_overflow`).
    pub fn log(&self, h: &Header) -> io::Result<Vec<LogEntry>> {
        let n = (h.log_head - h.log_cursor).min(LOG_CAP as u64);
        let mut buf = vec![0u8; LOG_CAP * size_of::<LogEntry>()];
        if n > 0 {
            sys::read_remote(
                self.pid,
                self.control() + offset_of!(Control, log) as u64,
                &mut buf,
            )?;
        }
        Ok((h.log_cursor..h.log_cursor + n)
            .map(|i| {
                let o = (i % LOG_CAP as u64) as usize * 24;
                let w = |k: usize| u64::from_ne_bytes(buf[o + k..o + k + 8].try_into().unwrap());
                LogEntry {
                    start: w(0),
                    end: w(8),
                    kind: w(16),
                }
            })
            .filter(|e| e.start < e.end)
            .collect())
    }

    /// The pages of the control block that [`Agent::rearm`] with `table` entries and `runs`
    /// ranges writes (it, or the agent during the operation).
    pub fn rearm_pages(&self, table: usize, runs: usize) -> Vec<u64> {
        let c = self.control();
        let span = |off: usize, len: usize| {
            let (s, e) = (c + off as u64, c + (off + len) as u64);
            (s & !4095..e.div_ceil(4096) * 4096).step_by(4096)
        };
        let mut v: Vec<u64> = span(0, size_of::<Header>()).collect();
        v.extend(span(
            offset_of!(Control, table),
            table.min(TABLE_CAP) * size_of::<Range>(),
        ));
        v.extend(span(
            offset_of!(Control, runs),
            runs.min(RUNS_CAP) * size_of::<Range>(),
        ));
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Writes the new armed table and the ranges to protect, consumes the log up to `head`,
    /// and runs `OP_REARM`. The caller has checked, in this same pause, that no thread holds
    /// the lock (the header it read); `Ok(false)`: the agent found it held all the same.
    pub fn rearm(
        &self,
        st: &mut Stopped,
        table: &[Range],
        runs: &[Range],
        head: u64,
    ) -> Result<bool> {
        let ranges = |rs: &[Range]| -> Vec<u8> {
            rs.iter()
                .flat_map(|r| [r.start, r.end, r.prot])
                .flat_map(u64::to_ne_bytes)
                .collect()
        };
        let base = self.control();
        let table = &table[..table.len().min(TABLE_CAP)];
        // Counters first, in one write: n_table, n_extra, log_head (unchanged), log_cursor.
        let mut counters = Vec::new();
        for v in [table.len() as u64, 0, head, head] {
            counters.extend_from_slice(&v.to_ne_bytes());
        }
        sys::write_remote(
            self.pid,
            base + offset_of!(Control, h.n_table) as u64,
            &counters,
        )?;
        sys::write_remote(
            self.pid,
            base + offset_of!(Control, h.log_overflow) as u64,
            &0u32.to_ne_bytes(),
        )?;
        sys::write_remote(
            self.pid,
            base + offset_of!(Control, table) as u64,
            &ranges(table),
        )?;
        let mut chunks = runs.chunks(RUNS_CAP).peekable();
        if chunks.peek().is_none() {
            // Nothing to protect; still reset the fault counter and mark tracking active.
            sys::write_remote(
                self.pid,
                base + offset_of!(Control, h.n_runs) as u64,
                &0u64.to_ne_bytes(),
            )?;
            return self.run_rearm(st);
        }
        for chunk in chunks {
            sys::write_remote(
                self.pid,
                base + offset_of!(Control, runs) as u64,
                &ranges(chunk),
            )?;
            sys::write_remote(
                self.pid,
                base + offset_of!(Control, h.n_runs) as u64,
                &(chunk.len() as u64).to_ne_bytes(),
            )?;
            if !self.run_rearm(st)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn run_rearm(&self, st: &mut Stopped) -> Result<bool> {
        match self.op(st, OP_REARM, 0)? {
            0 => Ok(true),
            RET_BUSY => Ok(false),
            r => Err(AgentError::Op {
                op: "rearm",
                detail: format!("mprotect failed with errno {}", -r),
            }),
        }
    }

    /// Gives every armed page its protection back and empties the table. The handlers and the
    /// filter stay (a filter cannot be removed); with nothing armed they only pass calls on.
    pub fn disarm_all(&self, st: &mut Stopped) -> Result<()> {
        match self.op(st, OP_DISARM_ALL, 0)? {
            0 => Ok(()),
            r => Err(AgentError::Op {
                op: "disarm",
                detail: format!("mprotect failed with errno {}", -r),
            }),
        }
    }
}

/// The seccomp filter (classic BPF, one `u64` per `struct sock_filter`): calls from the
/// agent's text pass; the calls in [`abi::TRAPPED`] raise SIGSYS (`SECCOMP_RET_TRAP`, tagged
/// with [`abi::TRAP_TAG`]); everything else passes. Calls of another ABI (i386 `int 0x80`,
/// x32) fail with `ENOSYS`: the agent could not interpret them.
pub fn filter(text: (u64, u64)) -> Vec<u64> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    const ALLOW: u32 = 0x7fff_0000;
    const TRAP: u32 = 0x0003_0000;
    const ERRNO: u32 = 0x0005_0000;
    const ENOSYS: u32 = 38;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let ins = |code: u16, jt: u8, jf: u8, k: u32| -> u64 {
        code as u64 | (jt as u64) << 16 | (jf as u64) << 24 | (k as u64) << 32
    };
    let (ts, te) = text;
    let n = TRAPPED.len();
    assert!(n < 250, "jump offsets are 8-bit");
    let mut p = vec![
        ins(LD_W_ABS, 0, 0, 4),              // 0: arch
        ins(JEQ_K, 1, 0, AUDIT_ARCH_X86_64), // 1
        ins(RET_K, 0, 0, ERRNO | ENOSYS),    // 2
        ins(LD_W_ABS, 0, 0, 0),              // 3: nr
        ins(JGE_K, 0, 1, 0x4000_0000),       // 4: x32 ABI?
        ins(RET_K, 0, 0, ERRNO | ENOSYS),    // 5
        ins(LD_W_ABS, 0, 0, 12),             // 6: ip, high half
        ins(JEQ_K, 0, 4, (ts >> 32) as u32), // 7: -> 12 when outside
        ins(LD_W_ABS, 0, 0, 8),              // 8: ip, low half
        ins(JGE_K, 0, 2, ts as u32),         // 9: -> 12 when below
        ins(JGE_K, 1, 0, te as u32),         // 10: -> 12 when at/above the end
        ins(RET_K, 0, 0, ALLOW),             // 11: the agent's own call
        ins(LD_W_ABS, 0, 0, 0),              // 12: nr
    ];
    for (i, &nr) in TRAPPED.iter().enumerate() {
        // Jump to the TRAP return after the list's ALLOW.
        let to_trap = (n - i) as u8; // skip the rest of the list and the ALLOW
        p.push(ins(JEQ_K, to_trap, 0, nr as u32));
    }
    p.push(ins(RET_K, 0, 0, ALLOW));
    p.push(ins(RET_K, 0, 0, TRAP | TRAP_TAG));
    assert!(p.len() <= FILTER_CAP);
    p
}

/// The layout the app asked for, from the layout the kernel shows: a piece of a mapping inside
/// an armed entry, read-only because we made it so (or writable again since), gets the
/// entry's protection. Pieces are merged back when they are parts of one armed entry (or
/// untouched parts of one kernel mapping) and agree in everything, so the result does not
/// depend on which pages happen to be protected: the same process gives the same layout at
/// every pause.
pub fn normalize(raw: &[MapEntry], entries: &[Range]) -> Vec<MapEntry> {
    // (piece, index of its kernel mapping, armed entry it was normalized by)
    let mut out: Vec<(MapEntry, usize, Option<usize>)> = Vec::with_capacity(raw.len());
    let mut k = 0; // first entry that may overlap the current mapping (both are sorted)
    for (ri, m) in raw.iter().enumerate() {
        while k < entries.len() && entries[k].end <= m.start {
            k += 1;
        }
        let mut at = m.start;
        let mut j = k;
        while at < m.end {
            while j < entries.len() && entries[j].end <= at {
                j += 1;
            }
            let (piece_end, entry) = match entries.get(j) {
                Some(e) if e.start <= at => (e.end.min(m.end), Some(j)),
                Some(e) => (e.start.min(m.end), None),
                None => (m.end, None),
            };
            let mut p = m.clone();
            if m.inode != 0 {
                p.offset = m.offset + (at - m.start);
            }
            p.start = at;
            p.end = piece_end;
            let mut owner = None;
            if let Some(j) = entry {
                let want = entries[j].prot;
                let have = p.prot() as u64;
                if !p.shared && (have == want || have == want & !PROT_WRITE) {
                    p.read = want & 1 != 0;
                    p.write = want & 2 != 0;
                    p.exec = want & 4 != 0;
                    if p.write && !p.has_flag("wr") && !p.vmflags.is_empty() {
                        p.vmflags.push("wr".into());
                    }
                    owner = Some(j);
                }
            }
            match out.last_mut() {
                // Parts of one armed entry, or untouched parts of one kernel mapping — never
                // across an entry boundary: where the kernel merges mappings depends on which
                // pages are protected, entry boundaries do not.
                Some((last, lri, lo))
                    if (if owner.is_some() {
                        *lo == owner
                    } else {
                        lo.is_none() && *lri == ri
                    }) && same_kind(last, &p) =>
                {
                    last.end = p.end;
                    *lri = ri;
                }
                _ => out.push((p, ri, owner)),
            }
            at = piece_end;
        }
    }
    out.into_iter().map(|(m, _, _)| m).collect()
}

/// Adjacent, with the same protection, sharing, backing (contiguous offsets), name and flags.
fn same_kind(a: &MapEntry, b: &MapEntry) -> bool {
    // "wr" follows the protection; "ac" (accounted) is dropped by the kernel when an
    // untouched anonymous piece is made read-only: neither tells the app anything.
    fn flags(m: &MapEntry) -> Vec<&str> {
        let mut f: Vec<&str> = m
            .vmflags
            .iter()
            .map(String::as_str)
            .filter(|f| !matches!(*f, "wr" | "ac"))
            .collect();
        f.sort_unstable();
        f
    }
    a.end == b.start
        && a.prot() == b.prot()
        && a.shared == b.shared
        && a.inode == b.inode
        && a.name == b.name
        // /proc shows offset 0 for anonymous memory.
        && (a.inode == 0 || a.offset + (a.end - a.start) == b.offset)
        && flags(a) == flags(b)
}

/// The app's own `no_new_privs` in a process where the kernel shows it set, when our agent set
/// it there (see [`Agent::prepare_no_new_privs`]); `None`: no agent, or not set by us.
pub fn app_no_new_privs(pid: Pid, maps: &[MapEntry]) -> Option<bool> {
    let h = Agent::find(pid, maps)?.header().ok()?;
    (h.magic == AGENT_MAGIC && h.nnp_forced != 0).then_some(h.app_nnp != 0)
}

/// For a process that may carry an agent (verification of a held process): the layout the app
/// asked for. Without an agent, the layout as is.
pub fn app_layout(pid: Pid, raw: Vec<MapEntry>) -> Vec<MapEntry> {
    let Some(agent) = Agent::find(pid, &raw) else {
        return raw;
    };
    match agent.header().and_then(|h| agent.entries(&h)) {
        Ok(entries) => normalize(&raw, &entries),
        Err(_) => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, end: u64, prot: u32) -> MapEntry {
        MapEntry {
            start,
            end,
            read: prot & 1 != 0,
            write: prot & 2 != 0,
            exec: prot & 4 != 0,
            shared: false,
            offset: 0,
            dev: 0,
            inode: 0,
            name: String::new(),
            vmflags: Vec::new(),
            kernel: (start, end),
        }
    }

    #[test]
    fn normalize_restores_intended_protection_and_merges() {
        let k = 0x1000;
        // One armed entry [1,5) (rw) split by faults into r--, rw-, r--; then an app read-only
        // mapping [5,6) that the kernel merged with the last read-only piece.
        let raw = vec![m(k, 2 * k, 1), m(2 * k, 3 * k, 3), m(3 * k, 6 * k, 1)];
        let entries = vec![Range {
            start: k,
            end: 5 * k,
            prot: 3,
        }];
        let n = normalize(&raw, &entries);
        let shape: Vec<_> = n
            .iter()
            .map(|e| (e.start / k, e.end / k, e.prot()))
            .collect();
        assert_eq!(shape, vec![(1, 5, 3), (5, 6, 1)]);
        // An app mprotect to PROT_NONE inside an armed entry is not ours: left as is.
        let raw = vec![m(k, 2 * k, 0), m(2 * k, 3 * k, 1)];
        let entries = vec![Range {
            start: k,
            end: 3 * k,
            prot: 3,
        }];
        let shape: Vec<_> = normalize(&raw, &entries)
            .iter()
            .map(|e| (e.start / k, e.end / k, e.prot()))
            .collect();
        assert_eq!(shape, vec![(1, 2, 0), (2, 3, 3)]);
    }

    #[test]
    fn normalize_keeps_a_file_piece_the_kernel_merged_apart() {
        let k = 0x1000;
        let mut f = m(5 * k, 7 * k, 1);
        (f.inode, f.offset, f.name) = (9, 5 * k, "/bin/x".into());
        let raw = vec![m(2 * k, 5 * k, 5), f, m(7 * k, 17 * k, 1)];
        let entries = vec![
            Range {
                start: 6 * k,
                end: 7 * k,
                prot: 3,
            },
            Range {
                start: 7 * k,
                end: 17 * k,
                prot: 3,
            },
        ];
        let shape: Vec<_> = normalize(&raw, &entries)
            .iter()
            .map(|e| (e.start / k, e.end / k, e.prot(), e.offset / k))
            .collect();
        assert_eq!(
            shape,
            vec![(2, 5, 5, 0), (5, 6, 1, 5), (6, 7, 3, 6), (7, 17, 3, 0)]
        );
    }

    /// The filter's list: sorted, no duplicates, and it holds every call the agent must see
    /// for tracking to stay sound (dispositions, masks, layout) and `execve`.
    #[test]
    fn trapped_list_holds_the_calls_tracking_depends_on() {
        assert!(
            TRAPPED.windows(2).all(|w| w[0] < w[1]),
            "unsorted or duplicated"
        );
        for nr in [
            libc::SYS_rt_sigaction,
            libc::SYS_rt_sigprocmask,
            libc::SYS_rt_sigsuspend,
            libc::SYS_mmap,
            libc::SYS_munmap,
            libc::SYS_mremap,
            libc::SYS_mprotect,
            libc::SYS_pkey_mprotect,
            libc::SYS_madvise,
            libc::SYS_brk,
            libc::SYS_sigaltstack,
            libc::SYS_rseq,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_read,
            libc::SYS_recvmsg,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
        ] {
            assert!(
                TRAPPED.contains(&(nr as u16)),
                "system call {nr} is not trapped"
            );
        }
    }

    #[test]
    fn filter_jumps_land_on_the_trap() {
        let p = filter((0x7f00_0000_1000, 0x7f00_0000_5000));
        let trap = p.len() - 1;
        for (i, &ins) in p.iter().enumerate().skip(13).take(TRAPPED.len()) {
            let jt = ((ins >> 16) & 0xff) as usize;
            assert_eq!(i + 1 + jt, trap, "instruction {i}");
        }
        assert_eq!(p[trap] >> 32, 0x0003_0000 | TRAP_TAG as u64);
    }
}
