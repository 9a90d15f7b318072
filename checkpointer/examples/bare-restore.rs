//! Checkpoints a running process and restores it in a bare new PID namespace (no sandbox).
//! A development aid for the checkpointer alone: `bare-restore PROGRAM [ARGS...]`.

use std::time::{Duration, Instant};
use tardi_checkpointer::{checkpoint, image::Checkpoint, restore};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open("/tmp/bare-restore.log")
        .unwrap();
    let mut child = std::process::Command::new(&args[0])
        .args(&args[1..])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    std::thread::sleep(Duration::from_millis(1500));
    let (ck, stats) = checkpoint(pid, 1).expect("checkpoint");
    println!(
        "checkpoint: {stats:?}, {} vmas, {} fds",
        ck.image.vmas.len(),
        ck.image.fds.len()
    );
    let bytes = ck.to_bytes();
    child.kill().unwrap();
    child.wait().unwrap();
    let ck = Checkpoint::from_bytes(bytes).expect("decode");
    let t0 = Instant::now();
    let prep = restore::prepare(&ck, &|p| Some(p.into())).expect("prepare");
    let target = prep.pid;
    let payload = prep.payload.clone();
    // SAFETY: fork in a single-threaded example; the child only calls async-signal-safe code
    // until it execs (unshare, fork, clone3, child_main's exec).
    let outer = unsafe { libc::fork() };
    if outer == 0 {
        unsafe {
            if libc::unshare(libc::CLONE_NEWPID) != 0 {
                libc::_exit(90);
            }
            let init = libc::fork();
            if init == 0 {
                let tid: i32 = target;
                let mut args = [0u64; 11];
                args[8] = &tid as *const i32 as u64;
                args[9] = 1;
                args[4] = libc::SIGCHLD as u64;
                let r = libc::syscall(libc::SYS_clone3, args.as_ptr(), 88usize);
                if r == 0 {
                    restore::child_main(&payload);
                }
                loop {
                    let mut st = 0;
                    if libc::waitpid(-1, &mut st, 0) < 0 {
                        libc::_exit(0);
                    }
                }
            }
            let mut st = 0;
            libc::waitpid(init, &mut st, 0);
            libc::_exit(0);
        }
    }
    // Find the init (our grandchild) and its child, the restored process.
    let host_pid = loop {
        let kids = std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children"))
            .unwrap_or_default();
        if let Some(init) = kids.split_whitespace().next() {
            let k = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
                .unwrap_or_default();
            if let Some(p) = k.split_whitespace().next() {
                break p.parse::<i32>().unwrap();
            }
        }
        std::thread::sleep(Duration::from_micros(100));
    };
    let fin = restore::finish(prep, host_pid, Duration::from_secs(10));
    println!(
        "restore: {:?} total {:?} host pid {host_pid}",
        fin,
        t0.elapsed()
    );
    std::thread::sleep(Duration::from_millis(2500));
    println!(
        "maps after:\n{}",
        std::fs::read_to_string(format!("/proc/{host_pid}/maps"))
            .unwrap_or_default()
            .lines()
            .count()
    );
    unsafe { libc::kill(host_pid, libc::SIGKILL) };
}
