//! The adaptive schedule's signal ([`Trigger`]): output waiting ends the open epoch early, and
//! releases tell the loop how many packets its clients were answered with.

#[allow(unused_imports)]
use super::*;

/// Wakes the epoch loop when output is waiting: the epoch then ends as soon as
/// [`EpochConfig::min_interval`] allows instead of at [`EpochConfig::interval`]. A clone of the
/// loop's own ([`Epochs::trigger`]); cheap to clone and to set from any thread.
///
/// The loop clears it inside the pause, just before [`EpochHooks::on_pause`] runs: a `set`
/// that follows `on_pause(N)` ends epoch N+1 early. Setting it for every packet is fine (a lock
/// and a notify); once per epoch, for the first packet queued after the mark, is enough.
#[derive(Clone, Default)]
pub struct Trigger(Arc<(Mutex<TriggerState>, Condvar)>);

#[derive(Default)]
struct TriggerState {
    /// Output is waiting since the last pause.
    output: bool,
    /// Output packets queued since the last pause ([`Trigger::output`]).
    packets: u64,
    /// The last epoch whose output was released, and how many packets that release sent
    /// ([`Trigger::released`]).
    released: Option<(u64, u64)>,
    /// When that release was reported, and when the first and the last output packet were
    /// queued since the last pause (for [`Answers`]).
    released_at: Option<Instant>,
    first_output: Option<Instant>,
    last_output: Option<Instant>,
}

impl std::fmt::Debug for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Trigger").field(&self.is_set()).finish()
    }
}

impl Trigger {
    /// Output is waiting: end the current epoch early.
    pub fn set(&self) {
        self.output(0);
    }

    /// `packets` more output packets were queued: output is waiting ([`Trigger::set`]), and
    /// they count towards [`EpochConfig::follow_releases`].
    pub fn output(&self, packets: u64) {
        let mut st = self.state();
        st.output = true;
        st.packets += packets;
        let now = Instant::now();
        st.first_output.get_or_insert(now);
        st.last_output = Some(now);
        drop(st);
        self.0.1.notify_all();
    }

    /// The output of every epoch up to `epoch` has been released, `packets` packets with this
    /// release (see [`EpochConfig::follow_releases`]). A lower number than before changes
    /// nothing.
    pub fn released(&self, epoch: u64, packets: u64) {
        let mut st = self.state();
        if st.released.is_none_or(|(e, _)| epoch > e) {
            st.released = Some((epoch, packets));
            st.released_at = Some(Instant::now());
            drop(st);
            self.0.1.notify_all();
        }
    }

    /// Whether output is waiting since the last pause.
    pub fn is_set(&self) -> bool {
        self.state().output
    }

    /// When the output up to `epoch` was released, if it was.
    pub(super) fn released_at(&self, epoch: u64) -> Option<Instant> {
        let st = self.state();
        st.released.filter(|&(e, _)| e >= epoch).and(st.released_at)
    }

    /// Whether the output up to `epoch` is released and this epoch has queued at least as many
    /// packets as that release sent: the clients it answered have answered again. (Public, with
    /// [`Trigger::clear`] and [`Trigger::wait_news`], for a loop of one's own that follows the
    /// same rule: `bench/replication.sh floor`.)
    pub fn answered(&self, epoch: u64) -> bool {
        let st = self.state();
        st.output
            && st
                .released
                .is_some_and(|(e, n)| e >= epoch && st.packets >= n)
    }

    /// The open epoch's [`Answers`], which the resume at `resumed` after checkpoint `epoch`
    /// opened.
    pub(super) fn answers(&self, epoch: u64, resumed: Instant) -> Answers {
        let st = self.state();
        let since = |t: Option<Instant>| {
            t.filter(|&t| t >= resumed)
                .map(|t| t.duration_since(resumed).as_micros() as u64)
        };
        let this = st.released.filter(|&(e, _)| e >= epoch);
        Answers {
            release_us: this.and(since(st.released_at)),
            first_output_us: since(st.first_output),
            last_output_us: since(st.last_output),
            packets: st.packets,
            release_packets: this.map_or(0, |(_, n)| n),
        }
    }

    /// Forgets the output since the last boundary (the loop calls it inside the pause).
    pub fn clear(&self) {
        let mut st = self.state();
        st.output = false;
        st.packets = 0;
        st.first_output = None;
        st.last_output = None;
    }

    /// Waits until set, at most `timeout`.
    pub(super) fn wait(&self, timeout: Duration) {
        let g = self.state();
        // (A poisoned lock only means a setter panicked; the state is still plain data.)
        let _ = self.0.1.wait_timeout_while(g, timeout, |st| !st.output);
    }

    /// Waits for any news (output, a release), at most `timeout`.
    pub fn wait_news(&self, timeout: Duration) {
        let g = self.state();
        let _ = self.0.1.wait_timeout(g, timeout);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TriggerState> {
        self.0.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The follow-releases rule: an epoch is "answered" once the release of an epoch at least
    /// as new as it came and it has queued as many packets as that release sent.
    #[test]
    fn an_epoch_is_answered_once_it_queued_what_the_last_release_sent() {
        let t = Trigger::default();
        assert!(!t.is_set() && !t.answered(1));
        t.output(2);
        assert!(t.is_set());
        assert!(!t.answered(1), "no release yet");
        t.released(1, 3);
        assert!(!t.answered(1), "2 of the 3 packets");
        t.output(1);
        assert!(t.answered(1));
        assert!(!t.answered(2), "the release is of an older epoch");
        // An older release changes nothing.
        t.released(0, 0);
        assert!(t.answered(1));
        // The pause forgets the output, not the release.
        t.clear();
        assert!(!t.is_set() && !t.answered(1));
        assert!(t.released_at(1).is_some() && t.released_at(2).is_none());
    }

    /// What the open epoch saw, relative to the resume that opened it.
    #[test]
    fn answers_are_timed_from_the_resume() {
        let t = Trigger::default();
        let resumed = Instant::now();
        t.released(4, 7);
        t.output(5);
        let a = t.answers(4, resumed);
        assert_eq!((a.packets, a.release_packets), (5, 7));
        assert!(a.release_us.is_some() && a.first_output_us.is_some());
        assert!(a.first_output_us <= a.last_output_us);
        // A release of an older epoch than the open one's base is not this epoch's.
        let b = t.answers(5, resumed);
        assert_eq!((b.release_us, b.release_packets), (None, 0));
    }

    /// `wait` returns at once when set, and by its timeout when not; `set` from another
    /// thread wakes it.
    #[test]
    fn a_set_wakes_the_waiting_loop() {
        let t = Trigger::default();
        let t0 = Instant::now();
        t.wait(Duration::from_millis(30));
        assert!(t0.elapsed() >= Duration::from_millis(30));
        let u = t.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            u.set();
        });
        let t1 = Instant::now();
        t.wait(Duration::from_secs(10));
        assert!(t.is_set());
        assert!(t1.elapsed() < Duration::from_secs(10));
        h.join().unwrap();
    }
}
