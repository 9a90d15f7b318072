//! The termination signals the CLI takes synchronously (SIGINT, SIGTERM, SIGHUP): blocked first
//! thing, then polled by the foreground loops of `run`, `restore` and `profile`.

use std::time::Duration;

/// The termination signals tardi takes synchronously: SIGINT, SIGTERM and SIGHUP.
pub fn term_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks [`term_signals`] in this thread (and the threads it starts later), so that
/// [`wait_signal`] can take them synchronously. Call first thing.
pub fn block_signals() -> libc::sigset_t {
    let set = term_signals();
    // SAFETY: pthread_sigmask on the calling thread with a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    set
}

/// A blocked termination signal, if one is pending, waiting at most `timeout` (zero: a poll).
pub fn wait_signal(set: &libc::sigset_t, timeout: Duration) -> Option<i32> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as i64,
    };
    // SAFETY: `set` and `ts` are valid; no siginfo requested.
    let r = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (r > 0).then_some(r)
}
