//! Sandboxes a crashed run of this daemon left behind, removed at start.

#[allow(unused_imports)]
use super::*;

/// Removes the sandboxes a previous run of this daemon left behind (killed with SIGKILL: its
/// sandboxes outlive it, holding their names and addresses, and a takeover or start of the
/// same service here would fail). The run directory is this daemon's own: nothing else runs
/// there. Found by the fault campaign (docs/RELIABILITY.md).
pub(crate) fn reap_leftovers(run_dir: &std::path::Path) {
    let Ok(dirs) = std::fs::read_dir(run_dir) else {
        return;
    };
    for d in dirs.flatten().filter(|d| d.path().is_dir()) {
        let name = d.file_name().to_string_lossy().into_owned();
        match tardi_sandbox::Sandbox::reap_leftover(&d.path()) {
            Ok(Some(pid)) => tracing::warn!(
                service = %name,
                init = pid,
                "killed a sandbox left running by a previous run of this daemon"
            ),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(service = %name, error = %e, "removing what a previous run left failed")
            }
        }
    }
}
