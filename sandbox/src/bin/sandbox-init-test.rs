//! Test-only init executable: `sandbox-init-test __sandbox-init <spec-fd>` runs
//! [`tardi_sandbox::init_main`] with a restore hook that execs its payload.
//!
//! The hook's payload is a NUL-separated argv (`/bin/sleep\0100`); if the restore was given fds,
//! the first one becomes the process's stdout.

use std::ffi::CString;
use std::os::fd::RawFd;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 && args[1] == tardi_sandbox::INIT_SUBCOMMAND {
        let fd: RawFd = args[2].parse().expect("spec fd must be a number");
        tardi_sandbox::init_main(fd, exec_payload);
    }
    eprintln!(
        "usage: {} {} <spec-fd>",
        args[0],
        tardi_sandbox::INIT_SUBCOMMAND
    );
    std::process::exit(2);
}

/// The restore hook: exec the payload's argv, with `fds[0]` (if any) as stdout.
fn exec_payload(_pid: i32, payload: &[u8], fds: &[RawFd]) -> ! {
    let argv: Vec<CString> = payload
        .split(|&b| b == 0)
        .map(|a| CString::new(a).expect("split on NUL"))
        .collect();
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    if let Some(&out) = fds.first() {
        // SAFETY: dup2 on fds the init kept open for us.
        unsafe { libc::dup2(out, 1) };
    }
    // SAFETY: NUL-terminated strings in a NULL-terminated array.
    unsafe { libc::execv(ptrs[0], ptrs.as_ptr()) };
    // SAFETY: _exit is always safe to call.
    unsafe { libc::_exit(127) }
}
