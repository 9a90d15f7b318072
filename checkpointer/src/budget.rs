//! The encoding after a resume, on a budget ([`crate::epoch::EpochConfig::encode_budget`]).
//!
//! After each pause the epoch thread encodes the epoch's pages against the twins. On a machine
//! whose cores the service and its clients keep busy, that work used to compete with them at
//! the same priority. With a budget, the thread drops to nice [`BACKGROUND_NICE`] right after
//! the resume: the service runs first and the encoding gets what is left (and a small share
//! when nothing is). The pause
//! itself always runs at the thread's normal priority (the thread is back at it before the
//! next stop).
//!
//! **Backpressure.** The loop is one thread: epoch N+1 cannot end before the encoding of epoch
//! N has finished, so an encoding that finds no idle CPU lengthens the next epoch rather than
//! queueing checkpoints (the adaptive-checkpoint-scheduling rule: the next checkpoint waits
//! until the last one has been processed, the VM runs on meanwhile). [`Rule::lengthened`] says
//! by how much, for [`crate::epoch::EpochStats::encode_late_us`].
//!
//! **The budget** bounds the lengthening: the encoding yields for up to `budget` intervals
//! after the resume ([`Rule::deadline`]); past that it goes back to normal priority and
//! finishes competing as before, so a service that leaves no core idle still gets a checkpoint
//! about every `budget` intervals (plus one encoding).

use std::cell::Cell;
use std::time::{Duration, Instant};

/// How the epoch thread is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Nice 0 (`SCHED_OTHER`, as the thread started): the pause, and work past its budget.
    Normal,
    /// Nice [`BACKGROUND_NICE`]: under contention the thread gets about a tenth of what a
    /// thread at nice 0 gets, but is never starved.
    Background,
}

/// The nice value of [`Priority::Background`]: weight 110 against 1,024 at nice 0. (`SCHED_IDLE`,
/// weight 3, was measured too: on a machine shared with other work it starved the encoding
/// for tens of milliseconds; see docs/BENCHMARKS.md, "Encoding on a budget".)
pub const BACKGROUND_NICE: i32 = 10;

/// Switches the calling thread to `p`. Going back to [`Priority::Normal`] needs
/// `CAP_SYS_NICE` (or `RLIMIT_NICE`), which the checkpointer has as root.
pub fn set_priority(p: Priority) -> std::io::Result<()> {
    let nice = match p {
        Priority::Normal => 0,
        Priority::Background => BACKGROUND_NICE,
    };
    // SAFETY: gettid takes nothing; setpriority takes plain integers, and with PRIO_PROCESS and
    // a thread id changes only that thread's nice value.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The calling thread's priority, as this module sets it.
pub fn priority() -> Priority {
    // SAFETY: as in `set_priority`; getpriority reads only. (-1 is also a valid nice value,
    // which this module never sets: it reads as Normal.)
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
    if nice == BACKGROUND_NICE {
        Priority::Background
    } else {
        Priority::Normal
    }
}

/// The rule, as a pure function of time (tested without timing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The epoch's interval.
    pub interval: Duration,
    /// How many intervals after the resume the encoding yields (0: it never does).
    pub budget: u32,
}

impl Rule {
    /// When the encoding of the epoch resumed at `resumed` stops yielding.
    pub fn deadline(&self, resumed: Instant) -> Instant {
        resumed + self.interval.saturating_mul(self.budget)
    }

    /// The priority the encoding runs at, at `now`.
    pub fn priority(&self, resumed: Instant, now: Instant) -> Priority {
        if self.budget > 0 && now < self.deadline(resumed) {
            Priority::Background
        } else {
            Priority::Normal
        }
    }

    /// By how much the work after the resume at `resumed`, done at `done`, lengthened the next
    /// epoch (backpressure): the time it went past the interval, which is when that epoch
    /// would have ended at the latest. Zero if it was done in time.
    pub fn lengthened(&self, resumed: Instant, done: Instant) -> Duration {
        done.saturating_duration_since(resumed + self.interval)
    }
}

thread_local! {
    /// The deadline of the budget the calling thread is in, if any.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The thread could not return to normal priority once: it does not leave it again.
    static STUCK: Cell<bool> = const { Cell::new(false) };
}

/// The encoding of one epoch on its budget: entered on the epoch thread after the resume,
/// left before the next pause.
#[derive(Debug)]
#[must_use = "the thread stays in the background until the budget is left"]
pub struct Budget {
    deadline: Option<Instant>,
}

impl Budget {
    /// Enters the budget: the calling thread goes to the background if the rule says so now.
    /// `rule.budget == 0`, or a kernel that refuses, leaves it as it was.
    pub fn enter(rule: Rule, resumed: Instant) -> Budget {
        let mut deadline = None;
        if rule.priority(resumed, Instant::now()) == Priority::Background && !STUCK.with(Cell::get)
        {
            match set_priority(Priority::Background) {
                Ok(()) => deadline = Some(rule.deadline(resumed)),
                Err(e) => tracing::debug!("the encoding stays at normal priority: {e}"),
            }
        }
        DEADLINE.with(|d| d.set(deadline));
        Budget { deadline }
    }

    /// Leaves the budget: the calling thread back at normal priority. Says whether the work
    /// outlasted the budget (it finished at normal priority).
    pub fn leave(self) -> bool {
        DEADLINE.with(|d| d.set(None));
        let Some(deadline) = self.deadline else {
            return false;
        };
        if let Err(e) = set_priority(Priority::Normal) {
            tracing::warn!(
                "the epoch thread could not return to normal priority ({e}): encoding at normal \
                 priority from now on"
            );
            STUCK.with(|s| s.set(true));
        }
        Instant::now() >= deadline
    }
}

/// What an encoding worker checks every few pages: once the deadline of the budget it was
/// started in has passed, its thread returns to normal priority (a thread spawned in the
/// background is in the background too).
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    deadline: Option<Instant>,
}

impl Watch {
    /// The budget the calling thread is in (none: the watch does nothing).
    pub fn current() -> Watch {
        Watch {
            deadline: DEADLINE.with(|d| d.get()),
        }
    }

    /// Raises the calling thread once the deadline has passed (once).
    pub fn check(&mut self) {
        if let Some(d) = self.deadline
            && Instant::now() >= d
        {
            self.deadline = None;
            if let Err(e) = set_priority(Priority::Normal) {
                tracing::warn!("an encoding worker could not return to normal priority: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_encoding_yields_until_its_budget_is_spent() {
        let t = Instant::now();
        let r = Rule {
            interval: 10 * MS,
            budget: 2,
        };
        assert_eq!(r.deadline(t), t + 20 * MS);
        assert_eq!(r.priority(t, t), Priority::Background);
        assert_eq!(r.priority(t, t + 19 * MS), Priority::Background);
        assert_eq!(r.priority(t, t + 20 * MS), Priority::Normal);
        assert_eq!(r.priority(t, t + 50 * MS), Priority::Normal);
        // No budget: it never yields.
        let off = Rule { budget: 0, ..r };
        assert_eq!(off.priority(t, t), Priority::Normal);
    }

    #[test]
    fn a_slow_encoding_lengthens_the_next_epoch() {
        let t = Instant::now();
        let r = Rule {
            interval: 10 * MS,
            budget: 3,
        };
        // Done within the interval: the next epoch ends as it would have.
        assert_eq!(r.lengthened(t, t + 4 * MS), Duration::ZERO);
        assert_eq!(r.lengthened(t, t + 10 * MS), Duration::ZERO);
        // Done past it: the next epoch ends that much later than its interval.
        assert_eq!(r.lengthened(t, t + 13 * MS), 3 * MS);
        assert_eq!(r.lengthened(t, t + 35 * MS), 25 * MS);
    }

    #[test]
    fn entering_and_leaving_switches_only_the_calling_thread() {
        std::thread::spawn(|| {
            let r = Rule {
                interval: Duration::from_secs(60),
                budget: 1,
            };
            let b = Budget::enter(r, Instant::now());
            assert_eq!(priority(), Priority::Background);
            // A worker spawned now starts in the background and is raised past the deadline.
            std::thread::scope(|s| {
                s.spawn(|| {
                    assert_eq!(priority(), Priority::Background);
                    let mut w = Watch {
                        deadline: Some(Instant::now()),
                    };
                    w.check();
                    assert_eq!(priority(), Priority::Normal);
                });
            });
            assert_eq!(priority(), Priority::Background);
            assert!(!b.leave(), "left well within the budget");
            assert_eq!(priority(), Priority::Normal);
            // A budget already spent when entered does not yield at all.
            let b = Budget::enter(r, Instant::now() - Duration::from_secs(61));
            assert_eq!(priority(), Priority::Normal);
            assert!(!b.leave());
        })
        .join()
        .expect("the thread's assertions");
    }
}
