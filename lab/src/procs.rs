//! Finding and killing processes by walking `/proc`: the way to stop a node's processes when there
//! is no cgroup2 (and a safety net after a cgroup kill, for processes someone started in a node
//! namespace by hand).

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// `(pid, parent pid)` of every process.
fn processes() -> Vec<(i32, i32)> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect()
}

/// The parent pid from `/proc/<pid>/stat` (the field after the parenthesised command name, which
/// may itself contain spaces and parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_ppid(&stat)
}

fn parse_ppid(stat: &str) -> Option<i32> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// The network namespace inode of process `pid`'s main thread.
pub(crate) fn net_ns_of(pid: i32) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|m| m.ino())
}

/// Every process whose network namespace is one of `ns_inodes`, or that descends from one (a
/// sandbox in a namespace of its own, under an instance in a node). Never includes this process.
fn targets(ns_inodes: &HashSet<u64>) -> HashSet<i32> {
    if ns_inodes.is_empty() {
        return HashSet::new();
    }
    let procs = processes();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for &(pid, ppid) in &procs {
        children.entry(ppid).or_default().push(pid);
    }
    let mut stack: Vec<i32> = procs
        .iter()
        .map(|&(pid, _)| pid)
        .filter(|&pid| net_ns_of(pid).is_some_and(|i| ns_inodes.contains(&i)))
        .collect();
    let me = std::process::id() as i32;
    let mut found = HashSet::new();
    while let Some(pid) = stack.pop() {
        if pid <= 1 || pid == me || !found.insert(pid) {
            continue;
        }
        if let Some(c) = children.get(&pid) {
            stack.extend(c);
        }
    }
    found
}

/// Stops, then SIGKILLs every process in the network namespaces `ns_inodes`, with their
/// descendants; repeats the scan until nothing new turns up so that a process forking meanwhile
/// is caught. Returns how many processes were signalled.
pub(crate) fn kill_tree(ns_inodes: &HashSet<u64>) -> usize {
    // Never the host's namespace (ours or init's), whatever a namespace file turned out to be.
    let mut ns_inodes = ns_inodes.clone();
    for pid in [std::process::id() as i32, 1] {
        if let Some(i) = net_ns_of(pid) {
            ns_inodes.remove(&i);
        }
    }
    let ns_inodes = &ns_inodes;
    let mut stopped: HashSet<i32> = HashSet::new();
    for _ in 0..20 {
        let now = targets(ns_inodes);
        let new: Vec<i32> = now.difference(&stopped).copied().collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            signal(pid, libc::SIGSTOP);
            stopped.insert(pid);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for &pid in &stopped {
        signal(pid, libc::SIGKILL);
    }
    stopped.len()
}

pub(crate) fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a positive pid only sends a signal; a pid gone meanwhile gives ESRCH,
    // which is fine.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ppid_parsing_survives_odd_names() {
        assert_eq!(parse_ppid("42 (a b) c)) S 7 42 42 0"), Some(7));
        assert_eq!(parse_ppid("42 (sh) R 1 0"), Some(1));
        assert_eq!(parse_ppid("garbage"), None);
        assert_eq!(parse_ppid("1 (x)"), None);
    }

    #[test]
    fn this_process_is_alive_and_never_a_target() {
        let me = std::process::id();
        assert!(alive(me));
        assert!(!alive(u32::MAX));
        // Our own namespace holds us, but we are never a target.
        let mine = net_ns_of(me as i32).unwrap();
        let t = targets(&HashSet::from([mine]));
        assert!(!t.contains(&(me as i32)));
        assert!(targets(&HashSet::new()).is_empty());
    }
}
