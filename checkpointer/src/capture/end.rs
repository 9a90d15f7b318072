//! The end of a service whose last checkpoint carries its connections (`tardi snapshot
//! --stop`): the checkpoint is handed over while every process is still stopped; then each
//! carried connection's socket is put in repair mode, so that closing it says nothing to its
//! peer (no FIN, no reset: the connection lives on in the socket a restore makes), and each
//! process is killed without running again.
//!
//! Kernel rules this relies on: a SIGKILL ends a ptrace-stopped process without it running
//! (the kill is delivered at the stop); closing a TCP socket in repair mode takes it down
//! without a segment (`tcp_close` → `tcp_disconnect` with `repair` set). Repair mode belongs to
//! the socket, so setting it through a duplicate (`pidfd_getfd`) covers the process's
//! descriptor too.

use super::{CaptureError, Result};
use crate::image::Checkpoint;
use crate::procfs::Proc;
use crate::ptrace::Stopped;

/// Takes the checkpoint of a service that ends (see [`super::checkpoint_and_end`]) while it is
/// still stopped (it may add to it, e.g. the sandbox's description); an error makes the service
/// resume untouched.
pub type Handover<'a> =
    &'a mut (dyn FnMut(&mut Checkpoint) -> std::result::Result<(), String> + Send);

/// Hands `ck` (of the stopped `procs`, the main process first, `stopped` in the same order)
/// over, then ends them. If the checkpoint failed or the handover refused it, resumes them
/// (children first) and returns the error.
pub(super) fn hand_over(
    procs: &[&Proc],
    stopped: Vec<Stopped>,
    ck: Result<Checkpoint>,
    handover: Handover,
) -> Result<Checkpoint> {
    let r = ck.and_then(|mut ck| match handover(&mut ck) {
        Ok(()) => Ok(ck),
        Err(e) => Err(CaptureError::Unsupported(format!(
            "the checkpoint was not kept ({e}); the service goes on"
        ))),
    });
    let ck = match r {
        Ok(ck) => ck,
        Err(e) => {
            for st in stopped.into_iter().rev() {
                let _ = st.resume();
            }
            return Err(e);
        }
    };
    for (p, img) in procs.iter().zip(ck.image.processes()) {
        for (fd, e) in crate::tcp::silence(p.pid, &img.tcp) {
            // Its peer sees it closed as the process dies: a restore finds it reset.
            tracing::warn!(pid = p.pid, fd, "a connection could not be silenced: {e}");
        }
    }
    // Children first: a parent killed first could not be told apart from one that exited.
    for p in procs.iter().rev() {
        // SAFETY: kill(2) with a PID we trace and have not waited for (it cannot be reused).
        unsafe { libc::kill(p.pid, libc::SIGKILL) };
    }
    // Detaching from threads that are gone fails harmlessly (ESRCH).
    drop(stopped);
    Ok(ck)
}
