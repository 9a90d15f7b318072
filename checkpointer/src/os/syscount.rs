//! Counts one process's calls of chosen groups of system calls, without stopping it or slowing
//! its calls down: an eBPF program on the raw `sys_enter` tracepoint adds one to a counter in a
//! memory-mapped BPF array for each listed call made by a thread of the process (matched by
//! thread-group id, as the initial PID namespace sees it). Reading a count is a few loads from
//! our own memory: no system call.
//!
//! The epoch loop uses it as a change notification, with four groups ([`CHANGE_GROUPS`]): when
//! no call that can change the descriptor table (or what a descriptor is) was made since the
//! last pause, the descriptors need not be read again (see [`crate::fds::capture`]); when no
//! call that can change the memory layout was made, the layout and the list of copied-on-write
//! file pages are carried from the last pause (see `crate::epoch`); when no timer call was
//! made, the timers are carried and their time left computed (see `crate::timers`); when no
//! seccomp call was made and no thread appeared, the seccomp filters are carried (see
//! `crate::seccomp`).
//!
//! A call may belong to several groups. The array has one element per distinct set of groups
//! a call belongs to, and a group's count is the sum of the elements whose set holds it: one
//! increment per call, whatever the number of groups.
//!
//! Kernel rules this relies on:
//! - `sys_enter` fires for every system call entry, including a call the kernel restarts after
//!   a stop (`-ERESTART*`: the thread re-executes the `syscall` instruction). A pause stops
//!   every thread, so a call in progress at one pause is entered again after it: no effect of
//!   a listed call becomes visible after a pause without a count after that pause's reading.
//! - `bpf_get_current_pid_tgid` reports ids of the initial PID namespace, which is what the
//!   checkpointer knows the process by.
//! - Closing the link descriptor detaches the program (also when our process dies); closing
//!   the map and program descriptors frees them once nothing references them.
//!
//! Needs `CAP_BPF` + `CAP_PERFMON` (root). [`SyscallCounter::new`] fails cleanly where BPF is
//! not available; callers then read everything every pause.

use crate::sys::Pid;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

// bpf(2) commands and constants (include/uapi/linux/bpf.h).
const BPF_MAP_CREATE: i64 = 0;
const BPF_PROG_LOAD: i64 = 5;
const BPF_RAW_TRACEPOINT_OPEN: i64 = 17;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_F_MMAPABLE: u32 = 1 << 10;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

// Instruction encoding.
const BPF_LD: u8 = 0x00;
const BPF_LDX: u8 = 0x01;
const BPF_ST: u8 = 0x02;
const BPF_STX: u8 = 0x03;
const BPF_JMP: u8 = 0x05;
const BPF_ALU64: u8 = 0x07;
const BPF_W: u8 = 0x00;
const BPF_DW: u8 = 0x18;
const BPF_IMM: u8 = 0x00;
const BPF_MEM: u8 = 0x60;
const BPF_ATOMIC: u8 = 0xc0;
const BPF_K: u8 = 0x00;
const BPF_X: u8 = 0x08;
const BPF_ADD: u8 = 0x00;
const BPF_RSH: u8 = 0x70;
const BPF_MOV: u8 = 0xb0;
const BPF_JA: u8 = 0x00;
const BPF_JEQ: u8 = 0x10;
const BPF_JNE: u8 = 0x50;
const BPF_CALL: u8 = 0x80;
const BPF_EXIT: u8 = 0x90;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
const HELPER_GET_CURRENT_PID_TGID: i32 = 14;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Insn {
    code: u8,
    regs: u8, // dst in the low nibble, src in the high one
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0xf),
        off,
        imm,
    }
}

/// The system calls (x86-64 numbers) after which the descriptor table, or what one of its
/// descriptors is, may have changed: creating, closing and duplicating descriptors, changing
/// their flags (`fcntl`, `ioctl` `FIONBIO`), binding, connecting or configuring sockets,
/// receiving descriptors (`recvmsg` with `SCM_RIGHTS`), epoll registrations, timers and
/// signal descriptors, and new processes or programs; and the working directory's changes
/// (`chdir`, `fchdir`, `chroot`: the capture keeps the directory with the descriptors).
pub const DESCRIPTOR_CALLS: &[i64] = &[
    libc::SYS_chdir,
    libc::SYS_fchdir,
    libc::SYS_chroot,
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_creat,
    libc::SYS_open_by_handle_at,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_ioctl,
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_bind,
    libc::SYS_connect,
    libc::SYS_listen,
    libc::SYS_shutdown,
    libc::SYS_setsockopt,
    libc::SYS_recvmsg,
    libc::SYS_recvmmsg,
    libc::SYS_pipe,
    libc::SYS_pipe2,
    libc::SYS_eventfd,
    libc::SYS_eventfd2,
    libc::SYS_epoll_create,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_signalfd,
    libc::SYS_signalfd4,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_memfd_create,
    libc::SYS_memfd_secret,
    libc::SYS_inotify_init,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_rm_watch,
    libc::SYS_fanotify_init,
    libc::SYS_userfaultfd,
    libc::SYS_perf_event_open,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_getfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_bpf,
    libc::SYS_seccomp,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_unshare,
    libc::SYS_setns,
];

/// `map_shadow_stack` (x86-64 453), which the libc crate does not name.
const SYS_MAP_SHADOW_STACK: i64 = 453;

/// The system calls (x86-64 numbers) after which the memory layout may have changed, or pages
/// of it may have been dropped (zapped) without a write: mapping, unmapping, moving and
/// protecting memory, the heap's end, advice (`MADV_DONTNEED`, `MADV_FREE`, ...), locking
/// (it splits mappings), memory policies, System V segments (created, changed, removed,
/// attached, detached: `crate::shm` lists them again after one), names of mappings (`prctl`),
/// truncating files (it zaps copied-on-write pages of private mappings beyond the new end),
/// io_uring (it can give advice), a userfaultfd of the service's own, and new processes or
/// programs. Not counted, and so caught only by the periodic full read: a file mapped by the
/// service and truncated through another path (`open` with `O_TRUNC`) or by another process;
/// the stack growing down, which the epoch loop checks by itself.
pub const LAYOUT_CALLS: &[i64] = &[
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_pkey_mprotect,
    libc::SYS_brk,
    libc::SYS_madvise,
    libc::SYS_process_madvise,
    libc::SYS_remap_file_pages,
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_munlock,
    libc::SYS_mlockall,
    libc::SYS_munlockall,
    libc::SYS_mbind,
    libc::SYS_set_mempolicy_home_node,
    libc::SYS_shmat,
    libc::SYS_shmdt,
    libc::SYS_shmget,
    libc::SYS_shmctl,
    libc::SYS_prctl,
    SYS_MAP_SHADOW_STACK,
    libc::SYS_mseal,
    libc::SYS_truncate,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_io_uring_enter,
    libc::SYS_userfaultfd,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_execve,
    libc::SYS_execveat,
];

/// The system calls (x86-64 numbers) after which the process's POSIX timers (which exist,
/// their clocks, notifications and periods) or its interval timers may have changed, other than
/// by running down: creating, setting and deleting timers, `setitimer` and `alarm`, and new
/// programs (`execve` deletes POSIX timers). The time left on an armed timer changes without
/// a call: see `crate::timers`.
pub const TIMER_CALLS: &[i64] = &[
    libc::SYS_timer_create,
    libc::SYS_timer_settime,
    libc::SYS_timer_delete,
    libc::SYS_setitimer,
    libc::SYS_alarm,
    libc::SYS_execve,
    libc::SYS_execveat,
];

/// The system calls (x86-64 numbers) after which a thread's seccomp filters may have changed:
/// `seccomp` and `prctl` (`PR_SET_SECCOMP`; a filter installed with `SECCOMP_FILTER_FLAG_TSYNC`
/// changes every thread's), and new programs. A new thread inherits its creator's filters:
/// the capture sees a new thread by itself (see `crate::seccomp`).
pub const SECCOMP_CALLS: &[i64] = &[
    libc::SYS_seccomp,
    libc::SYS_prctl,
    libc::SYS_execve,
    libc::SYS_execveat,
];

/// Index in [`CHANGE_GROUPS`] of [`DESCRIPTOR_CALLS`].
pub const DESCRIPTORS: usize = 0;
/// Index in [`CHANGE_GROUPS`] of [`LAYOUT_CALLS`].
pub const LAYOUT: usize = 1;
/// Index in [`CHANGE_GROUPS`] of [`TIMER_CALLS`].
pub const TIMERS: usize = 2;
/// Index in [`CHANGE_GROUPS`] of [`SECCOMP_CALLS`].
pub const SECCOMP: usize = 3;
/// The groups the epoch loop counts.
pub const CHANGE_GROUPS: [&[i64]; 4] = [DESCRIPTOR_CALLS, LAYOUT_CALLS, TIMER_CALLS, SECCOMP_CALLS];

/// A counter of one process's calls of groups of system calls (see the module doc).
pub struct SyscallCounter {
    /// The mapped array values (one `u64` per element), shared with the kernel.
    value: *const u64,
    map_len: usize,
    /// Per element, the groups (bit `g` for group `g`) whose calls it counts.
    elements: Vec<u32>,
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
}

// SAFETY: the pointer is to a shared mapping owned by this value and only read (volatile);
// the descriptors are plain owned descriptors.
unsafe impl Send for SyscallCounter {}

impl std::fmt::Debug for SyscallCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyscallCounter")
            .field("elements", &self.elements)
            .finish()
    }
}

/// bpf(2) with an attribute buffer of `attr.len()` bytes.
fn bpf(cmd: i64, attr: &mut [u8]) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is valid for its length, which is passed as the attribute size; the
    // kernel reads it (and, for some commands, writes within it).
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just gave us, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

fn put32(a: &mut [u8], off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(a: &mut [u8], off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

/// The program: if the calling thread belongs to `tgid` and the call is in `by_element[k]`,
/// add one to element `k` of the map `map_fd`.
fn program(tgid: Pid, by_element: &[Vec<i64>], map_fd: i32) -> Vec<Insn> {
    let mut p = vec![
        insn(BPF_ALU64 | BPF_MOV | BPF_X, 6, 1, 0, 0), // r6 = ctx
        insn(BPF_JMP | BPF_CALL, 0, 0, 0, HELPER_GET_CURRENT_PID_TGID),
        insn(BPF_ALU64 | BPF_RSH | BPF_K, 0, 0, 0, 32), // r0 = tgid
    ];
    // Jumps are patched once their targets are known: (at, element) to an element's stub,
    // and the rest to `common` or `out`.
    let not_ours = p.len();
    p.push(insn(BPF_JMP | BPF_JNE | BPF_K, 0, 0, 0, tgid));
    // r1 = ctx->args[1]: the system call number (args[0] is the pt_regs pointer).
    p.push(insn(BPF_LDX | BPF_MEM | BPF_DW, 1, 6, 8, 0));
    let mut to_stub = Vec::new();
    for (k, calls) in by_element.iter().enumerate() {
        for &nr in calls {
            to_stub.push((p.len(), k));
            p.push(insn(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 0, nr as i32));
        }
    }
    let not_listed = p.len();
    p.push(insn(BPF_JMP | BPF_JA, 0, 0, 0, 0));
    // One stub per element: key = k on the stack, then the common part.
    let mut stubs = Vec::new();
    let mut to_common = Vec::new();
    for k in 0..by_element.len() {
        stubs.push(p.len());
        p.push(insn(BPF_ST | BPF_MEM | BPF_W, 10, 0, -4, k as i32));
        to_common.push(p.len());
        p.push(insn(BPF_JMP | BPF_JA, 0, 0, 0, 0));
    }
    let common = p.len();
    p.extend([
        insn(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0),
        insn(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -4), // r2 = &key
        insn(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, map_fd), // r1 = map
        insn(0, 0, 0, 0, 0),
        insn(BPF_JMP | BPF_CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM),
    ]);
    let null = p.len();
    p.push(insn(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 0, 0));
    p.extend([
        insn(BPF_ALU64 | BPF_MOV | BPF_K, 1, 0, 0, 1),
        // lock *(u64 *)(r0 + 0) += r1
        insn(BPF_STX | BPF_ATOMIC | BPF_DW, 0, 1, 0, BPF_ADD as i32),
    ]);
    let out = p.len();
    p.extend([
        insn(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0),
        insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
    ]);
    let jump = |p: &mut Vec<Insn>, at: usize, to: usize| p[at].off = (to - at - 1) as i16;
    jump(&mut p, not_ours, out);
    for (at, k) in to_stub {
        jump(&mut p, at, stubs[k]);
    }
    jump(&mut p, not_listed, out);
    for at in to_common {
        jump(&mut p, at, common);
    }
    jump(&mut p, null, out);
    p
}

/// The array's elements for `groups`: per distinct set of groups a call belongs to (bit `g`
/// for group `g`), that set and its calls.
fn elements(groups: &[&[i64]]) -> Vec<(u32, Vec<i64>)> {
    let mut sets: std::collections::BTreeMap<i64, u32> = std::collections::BTreeMap::new();
    for (g, calls) in groups.iter().enumerate() {
        for &nr in *calls {
            *sets.entry(nr).or_default() |= 1 << g;
        }
    }
    let mut out: Vec<(u32, Vec<i64>)> = Vec::new();
    for (nr, set) in sets {
        match out.iter_mut().find(|e| e.0 == set) {
            Some(e) => e.1.push(nr),
            None => out.push((set, vec![nr])),
        }
    }
    out
}

impl SyscallCounter {
    /// Starts counting the calls of each of `groups` (lists of x86-64 numbers, at most 32
    /// groups) of process `tgid`.
    pub fn new(tgid: Pid, groups: &[&[i64]]) -> io::Result<SyscallCounter> {
        assert!(groups.len() <= 32, "at most 32 groups");
        let ctx = |what: &'static str| {
            move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
        };
        let elements = elements(groups);
        // The map: one u64 per element, mappable into our memory (an array's values are laid
        // out one after the other, each rounded up to 8 bytes).
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, BPF_MAP_TYPE_ARRAY);
        put32(&mut attr, 4, 4); // key size
        put32(&mut attr, 8, 8); // value size
        put32(&mut attr, 12, elements.len().max(1) as u32); // max entries
        put32(&mut attr, 16, BPF_F_MMAPABLE);
        let map = bpf(BPF_MAP_CREATE, &mut attr).map_err(ctx("creating the BPF counter map"))?;
        let map_len = (elements.len() * 8).max(1).next_multiple_of(4096);
        // SAFETY: mapping the map's value area (one page) shared and read-only; the kernel
        // keeps it valid until it is unmapped (in Drop), whatever happens to the descriptor.
        let value = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if value == libc::MAP_FAILED {
            return Err(ctx("mapping the BPF counter")(io::Error::last_os_error()));
        }
        // From here on, `guard` unmaps on an early return.
        struct Unmap(*mut libc::c_void, usize);
        impl Drop for Unmap {
            fn drop(&mut self) {
                // SAFETY: a mapping we made above and nobody else uses.
                unsafe { libc::munmap(self.0, self.1) };
            }
        }
        let guard = Unmap(value, map_len);

        let by_element: Vec<Vec<i64>> = elements.iter().map(|e| e.1.clone()).collect();
        let insns = program(tgid, &by_element, map.as_raw_fd());
        let license = c"GPL";
        let mut log = vec![0u8; 64 << 10];
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, BPF_PROG_TYPE_RAW_TRACEPOINT);
        put32(&mut attr, 4, insns.len() as u32);
        put64(&mut attr, 8, insns.as_ptr() as u64);
        put64(&mut attr, 16, license.as_ptr() as u64);
        put32(&mut attr, 24, 1); // log level
        put32(&mut attr, 28, log.len() as u32);
        put64(&mut attr, 32, log.as_mut_ptr() as u64);
        let prog = bpf(BPF_PROG_LOAD, &mut attr).map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            io::Error::new(
                e.kind(),
                format!(
                    "loading the BPF counter program: {e}; verifier: {}",
                    text.trim()
                ),
            )
        })?;
        // `insns`, `license` and `log` were read (and written) during the call only.
        let name = c"sys_enter";
        let mut attr = [0u8; 128];
        put64(&mut attr, 0, name.as_ptr() as u64);
        put32(&mut attr, 8, prog.as_raw_fd() as u32);
        let link = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr)
            .map_err(ctx("attaching the BPF counter to sys_enter"))?;
        std::mem::forget(guard);
        Ok(SyscallCounter {
            value: value as *const u64,
            map_len,
            elements: elements.iter().map(|e| e.0).collect(),
            _link: link,
            _prog: prog,
            _map: map,
        })
    }

    /// The calls of group `group` counted so far.
    pub fn count(&self, group: usize) -> u64 {
        let mut n = 0u64;
        for (k, set) in self.elements.iter().enumerate() {
            if set & (1 << group) != 0 {
                // SAFETY: element k lies in our live shared mapping of the map's values (8
                // aligned bytes at 8 × k, within `map_len`); the kernel updates it atomically,
                // and a volatile read sees each update.
                n = n.wrapping_add(unsafe { std::ptr::read_volatile(self.value.add(k)) });
            }
        }
        n
    }
}

impl Drop for SyscallCounter {
    fn drop(&mut self) {
        // SAFETY: our own mapping, made in `new`; nothing reads it after this.
        unsafe { libc::munmap(self.value as *mut libc::c_void, self.map_len) };
        // The descriptors close after this: the link first (field order), detaching the
        // program.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// Waits until `c` reaches at least `n` (the child runs on its own).
    fn reaches(c: &SyscallCounter, n: u64) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if c.count(0) >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// A child shell that waits on stdin between steps: only its listed calls count, and
    /// not those of any other process (this one's included).
    #[test]
    fn counts_the_listed_calls_of_one_process() {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("echo up; read a; exec 3</dev/null; read b; exec 3<&-; read c")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Past its start-up (the loader opens libraries): it prints, then blocks reading.
        let mut up = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut up,
        )
        .unwrap();
        assert_eq!(up, "up\n");
        let c = match SyscallCounter::new(child.id() as Pid, &[DESCRIPTOR_CALLS]) {
            Ok(c) => c,
            Err(e) => {
                let _ = child.kill();
                panic!("BPF unavailable here: {e}");
            }
        };
        // The shell blocks in read(0): nothing listed. We open files meanwhile.
        std::thread::sleep(Duration::from_millis(50));
        let _f = std::fs::File::open("/dev/null").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            c.count(0),
            0,
            "calls of other processes, or unlisted ones, counted"
        );
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"1\n").unwrap();
        // `exec 3</dev/null`: at least an openat (and a dup2/fcntl or two).
        assert!(reaches(&c, 1), "the open was not counted");
        std::thread::sleep(Duration::from_millis(50));
        let after_open = c.count(0);
        stdin.write_all(b"2\n").unwrap();
        assert!(reaches(&c, after_open + 1), "the close was not counted");
        stdin.write_all(b"3\n").unwrap();
        child.wait().unwrap();
        // No program left behind after the drop: a second counter starts at zero.
        drop(c);
        let again =
            SyscallCounter::new(std::process::id() as Pid, &[&[libc::SYS_getppid]]).unwrap();
        assert_eq!(again.count(0), 0);
        // SAFETY: getppid takes no arguments.
        unsafe { libc::getppid() };
        assert!(reaches(&again, 1), "our own getppid was not counted");
    }

    /// A call in several groups is one element counted in each; every listed call has its
    /// element.
    #[test]
    fn calls_in_several_groups_share_one_element() {
        let els = elements(&CHANGE_GROUPS);
        for (g, calls) in CHANGE_GROUPS.iter().enumerate() {
            for nr in *calls {
                let holding: Vec<u32> = els
                    .iter()
                    .filter(|e| e.1.contains(nr))
                    .map(|e| e.0)
                    .collect();
                assert_eq!(holding.len(), 1, "call {nr} in {holding:?}");
                assert!(
                    holding[0] & (1 << g) != 0,
                    "call {nr} not counted in group {g}"
                );
            }
        }
        let both = |nr: i64| els.iter().find(|e| e.1.contains(&nr)).map(|e| e.0);
        assert_eq!(both(libc::SYS_clone), Some(0b11));
        assert_eq!(both(libc::SYS_mmap), Some(1 << LAYOUT));
        assert_eq!(both(libc::SYS_dup), Some(1 << DESCRIPTORS));
        assert_eq!(both(libc::SYS_timer_create), Some(1 << TIMERS));
        assert_eq!(both(libc::SYS_prctl), Some(1 << LAYOUT | 1 << SECCOMP));
        assert_eq!(
            both(libc::SYS_seccomp),
            Some(1 << DESCRIPTORS | 1 << SECCOMP)
        );
        assert_eq!(both(libc::SYS_execve), Some(0b1111));
        // {descriptors}, {layout}, {both}, {timers}, {layout, seccomp},
        // {descriptors, seccomp}, {all four}.
        assert_eq!(els.len(), 7);
    }

    /// Two groups in one program: mapping memory counts as a layout call and not as a
    /// descriptor call; duplicating a descriptor the other way round.
    #[test]
    fn each_group_counts_its_own_calls() {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(
                "import mmap, os, sys\n\
                 print('up', flush=True)\n\
                 sys.stdin.readline()\n\
                 m = mmap.mmap(-1, 1 << 20)\n\
                 print('mapped', flush=True)\n\
                 sys.stdin.readline()\n\
                 os.close(os.dup(0))\n\
                 print('duped', flush=True)\n\
                 sys.stdin.readline()\n",
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut next = |out: &mut std::io::BufReader<_>| {
            line.clear();
            std::io::BufRead::read_line(out, &mut line).unwrap();
            line.trim().to_string()
        };
        assert_eq!(next(&mut out), "up");
        let c = SyscallCounter::new(child.id() as Pid, &CHANGE_GROUPS).unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let (l0, d0) = (c.count(LAYOUT), c.count(DESCRIPTORS));
        stdin.write_all(b"\n").unwrap();
        assert_eq!(next(&mut out), "mapped");
        let (l1, d1) = (c.count(LAYOUT), c.count(DESCRIPTORS));
        assert!(
            l1 > l0,
            "the mmap was not counted as a layout call ({l0} -> {l1})"
        );
        stdin.write_all(b"\n").unwrap();
        assert_eq!(next(&mut out), "duped");
        let d2 = c.count(DESCRIPTORS);
        assert!(d2 >= d1 + 2, "dup and close not counted ({d1} -> {d2})");
        assert!(d1 >= d0);
        stdin.write_all(b"\n").unwrap();
        child.wait().unwrap();
    }
}
