//! Pending signals: recorded as they were at the stop, and the final check that none arrived
//! (or only ones sent after the checkpoint) while the process was read.

#[allow(unused_imports)]
use super::*;

/// Lets the kernel deliver every signal pending in a thread that does not block it: an
/// injected `getpid` in such a thread meets the signal first, and [`Stopped::inject`] has the
/// kernel deliver it (the thread stops again at its handler's entry) before running the call.
/// Cheaper than resuming the process and stopping it again, which the callers still do when a
/// signal stays pending (blocked ones, or one that arrives meanwhile: see
/// [`final_pending_check`], which also sees signals queued without details).
/// Returns whether a signal stays pending that this could not deliver (blocked, or still
/// arriving after three rounds).
///
/// The threads' state is read after this: from its end on, injected calls hold signals
/// ([`Stopped::calls_hold_signals`]) instead of letting the kernel deliver them.
pub(super) fn deliver_pending_signals(st: &mut Stopped, maps: &[MapEntry]) -> Result<bool> {
    st.calls_hold_signals = false;
    let r = deliver_pending_signals_now(st, maps);
    st.calls_hold_signals = true;
    r
}

pub(super) fn deliver_pending_signals_now(st: &mut Stopped, maps: &[MapEntry]) -> Result<bool> {
    for _ in 0..3 {
        let (mut any, mut blocked) = (false, false);
        let shared = match st.tids.first() {
            Some(&t) => st.peek_pending(t, true)?,
            None => None,
        };
        for &tid in &st.tids.clone() {
            let Some(sig) = st.peek_pending(tid, false)?.or(shared) else {
                continue;
            };
            if st.sigmask(tid)? & (1u64 << (sig - 1)) == 0 {
                any = true;
                st.inject(maps, tid, libc::SYS_getpid, [0; 6], 0)?;
            } else {
                blocked = true;
            }
        }
        if !any {
            return Ok(blocked);
        }
    }
    Ok(true)
}

/// The signals pending in the process (queued but not yet delivered) and recorded with their
/// details: the process's queue and each thread's, oldest first.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Pending {
    pub(super) shared: Vec<PendingSignal>,
    /// Only threads with a signal of their own pending.
    pub(super) threads: HashMap<Pid, Vec<PendingSignal>>,
}

/// The signal mask of the signals in `list`.
pub(super) fn mask_of(list: &[PendingSignal]) -> u64 {
    list.iter()
        .fold(0, |m, p| m | 1u64 << (p.signo.clamp(1, 64) - 1))
}

/// Reads every pending signal's details (`PTRACE_PEEKSIGINFO`) of the process's queue and of
/// each thread's.
pub(super) fn read_pending(st: &Stopped) -> Result<Pending> {
    let queue = |tid: Pid, shared: bool| -> Result<Vec<PendingSignal>> {
        let raw = st.peek_all_pending(tid, shared, PENDING_MAX)?;
        if raw.len() > PENDING_MAX {
            return Err(CaptureError::Unsupported(format!(
                "more than {PENDING_MAX} signals are pending in {}",
                if shared {
                    "the process".to_string()
                } else {
                    format!("thread {tid}")
                }
            )));
        }
        let q: Vec<PendingSignal> = raw
            .into_iter()
            .map(|info| PendingSignal {
                signo: PendingSignal::signo_of(&info),
                info: info.to_vec(),
            })
            .collect();
        // One that cannot be blocked is taken as soon as the process runs: a round later it is
        // gone.
        if let Some(p) = q.iter().find(|p| PendingSignal::unblockable(p.signo)) {
            return Err(CaptureError::PendingSignals(vec![signal_name(p.signo)]));
        }
        Ok(q)
    };
    let mut p = Pending::default();
    if let Some(&first) = st.tids.first() {
        p.shared = queue(first, true)?;
    }
    for &tid in &st.tids {
        let q = queue(tid, false)?;
        if !q.is_empty() {
            p.threads.insert(tid, q);
        }
    }
    Ok(p)
}

/// The capture's last check of the signals pending now against `recorded`, the ones read at
/// its start (after the delivery of what could be delivered), which go into the image.
///
/// A signal that arrived since then, sent by another process (`kill`, `sigqueue`, `tgkill`),
/// is left out of the image: the process is stopped and has not seen it, so it counts as sent
/// just after the moment the checkpoint stands for; it stays queued, the process meets it after
/// the resume, and the next checkpoint records it if it is still pending. No thread of the tree
/// can have sent it (they are all stopped, and the injected calls send nothing). Taking it so,
/// instead of reading the process again, is what bounds the pause under a steady stream of
/// signals: a stream faster than one signal per round used to make every round start over
/// until the epoch failed.
///
/// Anything else refuses the capture by name (the caller reads the process again, after a
/// resume if it must): a signal the kernel raised for an event of its own (a timer's: its
/// arrival and the timer's re-arming go together, so the timer read earlier may not agree; a
/// child's; I/O), a record no longer a prefix of its queue, or a signal pending without the
/// details a restore needs to queue it again. `read_again`: a recorded queue may have grown
/// without the masks showing it (a real-time signal is queued as often as it is sent), so the
/// details are read again whatever the masks say.
pub(super) fn final_pending_check(
    proc: &Proc,
    st: &Stopped,
    files: &mut HashMap<String, std::fs::File>,
    recorded: &Pending,
    read_again: bool,
) -> Result<()> {
    // The masks first, the details after: nothing leaves a queue while the process is
    // stopped, so whatever the masks show has its details in `now` (if it has any).
    let masks = pending_masks(proc, files, &st.tids)?;
    let mut missing = masks.beyond(recorded);
    if missing != 0 || read_again {
        let now = read_pending(st)?;
        if now != *recorded {
            only_late_arrivals(recorded, &now, st.reraised)?;
        }
        missing = masks.beyond(&now);
    }
    if missing != 0 {
        return Err(CaptureError::PendingSignals(
            (0..64)
                .filter(|b| missing & (1 << b) != 0)
                .map(|b| signal_name(b + 1))
                .collect(),
        ));
    }
    Ok(())
}

/// The kernel's own masks of pending signals (`status`: `ShdPnd` for the process's queue,
/// `SigPnd` for each thread's), which also show a signal queued without details
/// (`PTRACE_PEEKSIGINFO` does not list it: the sender's `RLIMIT_SIGPENDING` was exhausted).
pub(super) struct PendingMasks {
    pub(super) shared: u64,
    pub(super) threads: Vec<(Pid, u64)>,
}

impl PendingMasks {
    /// The signals these masks show that `list` has no details of.
    fn beyond(&self, list: &Pending) -> u64 {
        let mut all = self.shared & !mask_of(&list.shared);
        for &(t, m) in &self.threads {
            all |= m & !list.threads.get(&t).map_or(0, |l| mask_of(l));
        }
        all
    }
}

pub(super) fn pending_masks(
    proc: &Proc,
    files: &mut HashMap<String, std::fs::File>,
    tids: &[Pid],
) -> Result<PendingMasks> {
    let pid = proc.pid;
    let mut parse = |path: String, key: &str| -> Result<u64> {
        let text = read_status(proc, files, &path).map_err(proc_err(pid, key.to_string()))?;
        let v = crate::procfs::status_value(&text, key)
            .ok_or_else(|| CaptureError::Unsupported(format!("{path}: no field {key}")))?;
        u64::from_str_radix(v, 16).map_err(|e| CaptureError::Unsupported(format!("{key}: {e}")))
    };
    let shared = parse("status".into(), "ShdPnd")?;
    let mut threads = Vec::with_capacity(tids.len());
    for &t in tids {
        threads.push((t, parse(format!("task/{t}/status"), "SigPnd")?));
    }
    Ok(PendingMasks { shared, threads })
}

/// `now` is `recorded` with signals sent by other processes after it, each queue's record a
/// prefix of the queue; otherwise the signals that break that, by name. `reraised`: the
/// signals this capture queued again itself (their details say `SI_TKILL` from us, whatever
/// sent them: a timer's `SIGALRM`, say, whose timer was read before it was taken), never a
/// late arrival.
pub(super) fn only_late_arrivals(recorded: &Pending, now: &Pending, reraised: u64) -> Result<()> {
    let mut bad: Vec<u32> = Vec::new();
    let mut queue = |was: &[PendingSignal], is: &[PendingSignal]| {
        if is.len() < was.len() || is[..was.len()] != *was {
            bad.extend(is.iter().chain(was).map(|p| p.signo));
        } else {
            bad.extend(
                is[was.len()..]
                    .iter()
                    .filter(|p| {
                        !p.sent_by_a_process()
                            || reraised & (1u64 << (p.signo.wrapping_sub(1) & 63)) != 0
                    })
                    .map(|p| p.signo),
            );
        }
    };
    queue(&recorded.shared, &now.shared);
    let tids: std::collections::BTreeSet<Pid> = recorded
        .threads
        .keys()
        .chain(now.threads.keys())
        .copied()
        .collect();
    for t in tids {
        let none = Vec::new();
        queue(
            recorded.threads.get(&t).unwrap_or(&none),
            now.threads.get(&t).unwrap_or(&none),
        );
    }
    if bad.is_empty() {
        return Ok(());
    }
    bad.sort_unstable();
    bad.dedup();
    Err(CaptureError::PendingSignals(
        bad.into_iter().map(signal_name).collect(),
    ))
}

/// A `/proc` file of the process (`rel`: `status`, `task/TID/status`), read whole from a
/// descriptor kept in `files` (opened the first time). A kept descriptor that fails (its thread
/// exited) is dropped and the file opened again once, so that the error is the path's own.
pub(super) fn read_status(
    proc: &Proc,
    files: &mut HashMap<String, std::fs::File>,
    rel: &str,
) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt;
    let read = |f: &std::fs::File| -> std::io::Result<String> {
        let mut buf = vec![0u8; 4096];
        let mut n = 0;
        loop {
            if n == buf.len() {
                buf.resize(buf.len() * 2, 0);
            }
            match f.read_at(&mut buf[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(n);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    if let Some(f) = files.get(rel) {
        match read(f) {
            Ok(text) => return Ok(text),
            Err(_) => {
                files.remove(rel);
            }
        }
    }
    let f = proc.open_file(rel, libc::O_RDONLY)?;
    let text = read(&f)?;
    files.insert(rel.to_string(), f);
    Ok(text)
}

/// `SIGUSR1` for 10, `SIGRTMIN+3` for 37.
pub(super) fn signal_name(s: u32) -> String {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match s {
        1..=31 => NAMES[s as usize - 1].to_string(),
        34.. => format!("SIGRTMIN+{}", s - 34),
        _ => format!("signal {s}"),
    }
}
