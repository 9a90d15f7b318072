//! Running external commands (mostly `ip`) with their exit status checked and their stderr in the
//! error.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;

use crate::error::{LabError, Result};

/// The `ip` binary: found on `PATH`, else in the usual sbin directories (a test's `PATH` may lack
/// them).
pub(crate) fn ip_exe() -> &'static Path {
    static IP: OnceLock<PathBuf> = OnceLock::new();
    IP.get_or_init(|| find_exe("ip", &["/usr/sbin", "/sbin", "/usr/bin", "/bin"]))
}

fn find_exe(name: &str, fallbacks: &[&str]) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .iter()
        .map(PathBuf::as_path)
        .chain(fallbacks.iter().map(Path::new))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// `cmd` as a shell-like string, for messages.
pub(crate) fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// A readable exit status: `exit status 2`, `killed by signal 9`.
pub(crate) fn describe_status(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => st.to_string(),
    }
}

/// Runs `cmd` to completion (stdin from /dev/null), failing unless it exits with 0.
pub(crate) fn run_checked(mut cmd: Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::io(format!("running `{}`", display(&cmd)), e))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(LabError::Command {
            command: display(&cmd),
            status: describe_status(out.status),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// `ip ARGS...`, checked.
pub(crate) fn ip<I, S>(args: I) -> Result<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(ip_exe());
    cmd.args(args);
    run_checked(cmd)
}

/// `ip -n NS ARGS...`, checked.
pub(crate) fn ip_in<I, S>(ns: &str, args: I) -> Result<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(ip_exe());
    cmd.args(["-n", ns]).args(args);
    run_checked(cmd)
}

/// Whether an error from `ip` means "the thing is already gone".
pub(crate) fn is_gone(e: &LabError) -> bool {
    match e {
        LabError::Command { stderr, .. } => {
            let s = stderr.to_ascii_lowercase();
            s.contains("no such file")
                || s.contains("cannot find device")
                || s.contains("not found")
        }
        _ => false,
    }
}
