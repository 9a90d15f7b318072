//! POSIX timers (`timer_create`) and interval timers (`setitimer`, `alarm`).
//!
//! Capture: `/proc/PID/timers` lists each POSIX timer's id, signal and `sigev_value`,
//! notification (with the thread signalled) and clock, but not its time left: that takes
//! `timer_gettime` injected into the stopped process, as does `getitimer` for the three
//! interval timers (there is no outside interface to either). Restore: the restorer creates
//! each timer again with its old id once the threads exist (a thread-directed timer needs its
//! thread), and arms it, with the time it had left, just before the threads resume (see
//! `restorer/main.rs`).
//!
//! Between pauses of the epoch loop (see [`capture`]) the list and settings change only
//! through calls the eBPF counter counts ([`crate::syscount::TIMER_CALLS`]); the time left
//! runs down without one. The list is therefore read again only after such a call (or at a
//! refresh); timers on wall clocks have their time left computed from the time passed since
//! they were read, as the kernel forwards them; timers on CPU-time clocks (and
//! `ITIMER_VIRTUAL`/`ITIMER_PROF`) have theirs read again at every pause.
//!
//! Kernel facts this relies on (Linux 6.18): ids are allocated per process from a counter that
//! only goes up (a deleted timer's id is not reused before it wraps), and
//! `prctl(PR_TIMER_CREATE_RESTORE_IDS)` (Linux ≥ 6.15) makes `timer_create` take the id the
//! caller puts in its `timer_t` (`EBUSY` if taken); `/proc/PID/timers` prints thread ids in
//! the reader's PID namespace; `timer_gettime` of an armed timer never reports 0 left (1 ns at
//! least).

use crate::image::{ITimer, PosixTimer, Timers, sigev};
use crate::os::error::{CaptureError, proc_err};
use crate::procfs::{MapEntry, Proc};
use crate::ptrace::{SCRATCH, Stopped};
use crate::sys::Pid;
use std::collections::HashMap;
use std::time::Instant;

type Result<T> = std::result::Result<T, CaptureError>;

/// What the last full reading found, and when.
#[derive(Debug)]
pub(crate) struct TimerCache {
    /// The timer-call count the reading was made at.
    calls: Option<u64>,
    at: Instant,
    timers: Timers,
    /// A timer runs on CPU time: its time left cannot be computed from outside.
    cpu: bool,
}

/// The process's timers. `cache` holds the last reading; it is used (with the time left
/// advanced) when `calls` (the count of [`crate::syscount::TIMER_CALLS`], `None` without a
/// counter) did not change since it and `refresh` is off. `ns_tid` maps host TIDs to sandbox
/// ones.
pub(crate) fn capture(
    proc: &Proc,
    st: &mut Stopped,
    maps: &[MapEntry],
    cache: &mut Option<TimerCache>,
    calls: Option<u64>,
    refresh: bool,
    ns_tid: &dyn Fn(Pid) -> Option<Pid>,
) -> Result<Timers> {
    if !refresh
        && calls.is_some()
        && let Some(c) = cache.as_ref().filter(|c| c.calls == calls)
    {
        let mut t = advanced(&c.timers, c.at.elapsed().as_nanos() as u64);
        if c.cpu {
            read_cpu_timers(st, maps, &mut t)?;
        }
        return Ok(t);
    }
    let timers = read(proc, st, maps, ns_tid)?;
    let cpu = timers.posix.iter().any(|t| cpu_clock(t.clock))
        || timers.itimers.iter().any(|t| t.which != 0);
    *cache = Some(TimerCache {
        calls,
        at: Instant::now(),
        timers: timers.clone(),
        cpu,
    });
    Ok(timers)
}

/// Reads every timer from the stopped process.
fn read(
    proc: &Proc,
    st: &mut Stopped,
    maps: &[MapEntry],
    ns_tid: &dyn Fn(Pid) -> Option<Pid>,
) -> Result<Timers> {
    let pid = proc.pid;
    let text = proc
        .read_string("timers")
        .map_err(proc_err(pid, "timers"))?;
    let mut posix = parse(&text)
        .map_err(|e| proc_err(pid, "timers")(std::io::Error::other(format!("unparsable: {e}"))))?;
    for t in &mut posix {
        if t.notify == sigev::THREAD_ID {
            t.tid = ns_tid(t.tid).ok_or_else(|| {
                CaptureError::Unsupported(format!(
                    "POSIX timer {} signals thread {} (host TID), which is not a thread of the \
                     service any more",
                    t.id, t.tid
                ))
            })?;
        } else {
            t.tid = 0;
        }
        (t.interval_ns, t.value_ns) = get(st, maps, libc::SYS_timer_gettime, t.id as u64)?;
    }
    posix.sort_by_key(|t| t.id);
    let mut itimers = Vec::new();
    for which in 0..3u32 {
        let (interval_ns, mut value_ns) = get(st, maps, libc::SYS_getitimer, which as u64)?;
        // A periodic ITIMER_REAL that expired while its SIGALRM waits to be taken reads as 0:
        // the kernel re-arms it (by its period, from then) only when the signal is dequeued,
        // and a restore cannot make a timer in that state (`setitimer` with a value of 0
        // disarms it for good). It is restored armed for one period; the pending SIGALRM is
        // restored with the other pending signals.
        if which == 0 && value_ns == 0 && interval_ns > 0 {
            value_ns = interval_ns;
        }
        if value_ns > 0 {
            itimers.push(ITimer {
                which,
                value_ns,
                interval_ns,
            });
        }
    }
    Ok(Timers { posix, itimers })
}

/// Reads again the time left of the timers in `t` that run on CPU time.
fn read_cpu_timers(st: &mut Stopped, maps: &[MapEntry], t: &mut Timers) -> Result<()> {
    for p in t.posix.iter_mut().filter(|p| cpu_clock(p.clock)) {
        (p.interval_ns, p.value_ns) = get(st, maps, libc::SYS_timer_gettime, p.id as u64)?;
    }
    for i in t.itimers.iter_mut().filter(|i| i.which != 0) {
        (i.interval_ns, i.value_ns) = get(st, maps, libc::SYS_getitimer, i.which as u64)?;
    }
    t.itimers.retain(|i| i.value_ns > 0);
    Ok(())
}

/// (period, time left) of timer `arg`, in nanoseconds: `timer_gettime` (a POSIX timer's id)
/// or `getitimer` (`ITIMER_*`), injected into the leader.
fn get(st: &mut Stopped, maps: &[MapEntry], nr: i64, arg: u64) -> Result<(u64, u64)> {
    let leader = st.tids[0];
    let (r, _, out) = st.inject(maps, leader, nr, [arg, SCRATCH, 0, 0, 0, 0], 32)?;
    if r < 0 {
        return Err(CaptureError::Injected {
            call: if nr == libc::SYS_getitimer {
                "getitimer"
            } else {
                "timer_gettime"
            },
            tid: leader,
            errno: -r,
        });
    }
    // struct itimerspec / itimerval: the interval, then the value, each (seconds, then
    // nanoseconds or microseconds).
    let unit = if nr == libc::SYS_getitimer { 1000 } else { 1 };
    let w = |i: usize| u64::from_le_bytes(out[i * 8..i * 8 + 8].try_into().unwrap());
    Ok((ns(w(0), w(1), unit), ns(w(2), w(3), unit)))
}

/// Seconds and a sub-second count of `unit` nanoseconds, to nanoseconds (saturating).
fn ns(sec: u64, sub: u64, unit: u64) -> u64 {
    sec.saturating_mul(1_000_000_000)
        .saturating_add(sub.saturating_mul(unit))
}

/// A CPU-time clock: `CLOCK_PROCESS_CPUTIME_ID`, `CLOCK_THREAD_CPUTIME_ID`, or a clock id made
/// by `clock_getcpuclockid`/`pthread_getcpuclockid` (negative).
fn cpu_clock(clock: i32) -> bool {
    clock < 0 || clock == 2 || clock == 3
}

/// `timers` as they are `elapsed` nanoseconds after they were read: what the kernel reports
/// then (an expired one-shot timer is disarmed; a periodic one is forwarded by whole periods).
/// Timers on CPU time are left as they were.
fn advanced(timers: &Timers, elapsed: u64) -> Timers {
    let left = |value: u64, interval: u64| -> u64 {
        if value == 0 || elapsed < value {
            return value.saturating_sub(elapsed);
        }
        if interval == 0 {
            return 0;
        }
        interval - (elapsed - value) % interval
    };
    let mut t = timers.clone();
    for p in t.posix.iter_mut().filter(|p| !cpu_clock(p.clock)) {
        p.value_ns = left(p.value_ns, p.interval_ns);
    }
    for i in t.itimers.iter_mut().filter(|i| i.which == 0) {
        i.value_ns = left(i.value_ns, i.interval_ns);
    }
    t.itimers.retain(|i| i.value_ns > 0);
    t
}

/// Parses `/proc/PID/timers`: per timer, `ID: n`, `signal: signo/sigval` (hex),
/// `notify: kind/pid.N` or `kind/tid.N` (kind: `signal`, `none`, `thread`) and `ClockID: n`.
/// Times are left 0; a thread-directed timer's `tid` is the host TID printed.
fn parse(text: &str) -> std::result::Result<Vec<PosixTimer>, String> {
    let mut out: Vec<PosixTimer> = Vec::new();
    let mut by_id: HashMap<i32, usize> = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (key, value) = line
            .split_once(':')
            .ok_or_else(|| format!("line {line:?}"))?;
        let value = value.trim();
        if key == "ID" {
            let id = value.parse().map_err(|_| format!("id {value:?}"))?;
            if by_id.insert(id, out.len()).is_some() {
                return Err(format!("timer {id} twice"));
            }
            out.push(PosixTimer {
                id,
                clock: 0,
                signo: 0,
                notify: sigev::SIGNAL,
                tid: 0,
                sigval: 0,
                value_ns: 0,
                interval_ns: 0,
            });
            continue;
        }
        let t = out
            .last_mut()
            .ok_or_else(|| format!("{key} before an ID"))?;
        match key {
            "signal" => {
                let (signo, val) = value
                    .split_once('/')
                    .ok_or_else(|| format!("signal {value:?}"))?;
                t.signo = signo.parse().map_err(|_| format!("signal {value:?}"))?;
                t.sigval = u64::from_str_radix(val, 16).map_err(|_| format!("sigval {value:?}"))?;
            }
            "notify" => {
                let (kind, target) = value
                    .split_once('/')
                    .ok_or_else(|| format!("notify {value:?}"))?;
                let base = match kind {
                    "signal" => sigev::SIGNAL,
                    "none" => sigev::NONE,
                    "thread" => sigev::THREAD,
                    _ => return Err(format!("notify {value:?}")),
                };
                if let Some(tid) = target.strip_prefix("tid.") {
                    if base != sigev::SIGNAL {
                        return Err(format!("notify {value:?}"));
                    }
                    t.notify = sigev::THREAD_ID;
                    t.tid = tid.parse().map_err(|_| format!("notify {value:?}"))?;
                } else {
                    t.notify = base;
                }
            }
            "ClockID" => t.clock = value.parse().map_err(|_| format!("clock {value:?}"))?,
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_timers() {
        // As Linux 6.18 prints them (in hash order).
        let text = "ID: 5\nsignal: 12/0000000000001234\nnotify: signal/tid.19921\nClockID: 1\n\
                    ID: 4\nsignal: 10/0000000000000000\nnotify: none/pid.19921\nClockID: 0\n\
                    ID: 0\nsignal: 34/00007f0012345678\nnotify: signal/pid.19921\nClockID: -6\n";
        let t = parse(text).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(
            (
                t[0].id,
                t[0].signo,
                t[0].sigval,
                t[0].notify,
                t[0].tid,
                t[0].clock
            ),
            (5, 12, 0x1234, sigev::THREAD_ID, 19921, 1)
        );
        assert_eq!((t[1].id, t[1].notify, t[1].tid), (4, sigev::NONE, 0));
        assert_eq!((t[2].sigval, t[2].clock), (0x7f00_1234_5678, -6));
        assert!(cpu_clock(t[2].clock) && !cpu_clock(t[0].clock));
        assert!(parse("signal: 1/0\n").is_err());
        assert!(parse("ID: 1\nnotify: bogus/pid.1\n").is_err());
    }

    #[test]
    fn time_left_runs_down_as_the_kernel_forwards_timers() {
        let t = |value_ns, interval_ns| Timers {
            posix: vec![PosixTimer {
                id: 0,
                clock: 1,
                signo: 10,
                notify: 0,
                tid: 0,
                sigval: 0,
                value_ns,
                interval_ns,
            }],
            itimers: vec![ITimer {
                which: 0,
                value_ns,
                interval_ns,
            }],
        };
        let left = |timers: Timers| (timers.posix[0].value_ns, timers.itimers.len());
        assert_eq!(left(advanced(&t(100, 0), 30)), (70, 1));
        // A one-shot timer that fired is disarmed (an interval timer then is no more).
        assert_eq!(left(advanced(&t(100, 0), 100)), (0, 0));
        // A periodic one: 250 after 100 left with a period of 40 is 30 into a period.
        assert_eq!(left(advanced(&t(100, 40), 250)), (10, 1));
        assert_eq!(left(advanced(&t(100, 40), 140)), (40, 1));
        // Disarmed stays disarmed.
        assert_eq!(advanced(&t(0, 40), 1000).posix[0].value_ns, 0);
        // CPU time does not pass with the wall clock: read again instead.
        let mut cpu = t(100, 0);
        cpu.posix[0].clock = 2;
        cpu.itimers[0].which = 1;
        assert_eq!(left(advanced(&cpu, 1000)), (100, 1));
    }
}
