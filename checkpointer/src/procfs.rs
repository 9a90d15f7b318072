//! Parsers for the `/proc/PID/*` files the checkpointer reads. Pure text handling on top of
//! `std::fs`; no ptrace here.

use crate::sys::Pid;
use std::io;

/// One line of `/proc/PID/smaps` with its `VmFlags`.
#[derive(Debug, Clone)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    pub offset: u64,
    pub inode: u64,
    pub name: String,
    pub vmflags: Vec<String>,
}

impl MapEntry {
    pub fn has_flag(&self, f: &str) -> bool {
        self.vmflags.iter().any(|x| x == f)
    }
    pub fn prot(&self) -> u32 {
        (self.read as u32) | (self.write as u32) << 1 | (self.exec as u32) << 2
    }
}

fn parse_map_line(line: &str) -> Option<MapEntry> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?.as_bytes();
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let inode = it.next()?.parse().ok()?;
    let name = it.next().unwrap_or("").trim_start().to_string();
    let (s, e) = range.split_once('-')?;
    Some(MapEntry {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        read: perms.first() == Some(&b'r'),
        write: perms.get(1) == Some(&b'w'),
        exec: perms.get(2) == Some(&b'x'),
        shared: perms.get(3) == Some(&b's'),
        offset,
        inode,
        name,
        vmflags: Vec::new(),
    })
}

/// Reads `/proc/PID/smaps` (for `VmFlags`).
pub fn smaps(pid: Pid) -> io::Result<Vec<MapEntry>> {
    Ok(parse_smaps(&std::fs::read_to_string(format!(
        "/proc/{pid}/smaps"
    ))?))
}

pub fn parse_smaps(text: &str) -> Vec<MapEntry> {
    let mut out: Vec<MapEntry> = Vec::new();
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(last) = out.last_mut() {
                last.vmflags = flags.split_whitespace().map(str::to_string).collect();
            }
        } else if line
            .split(' ')
            .next()
            .is_some_and(|t| t.contains('-') && !t.ends_with(':'))
            && let Some(e) = parse_map_line(line)
        {
            out.push(e);
        }
    }
    out
}

/// Fields of `/proc/PID/stat` (1-based field numbers as in proc(5)).
pub fn stat_fields(pid: Pid) -> io::Result<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // comm may contain spaces and parentheses: split after the last ')'.
    let close = text
        .rfind(')')
        .ok_or_else(|| io::Error::other("malformed stat"))?;
    let mut v = vec![
        text[..close]
            .split_once('(')
            .map(|x| x.0.trim())
            .unwrap_or("")
            .to_string(),
    ];
    v.push(text[text.find('(').unwrap() + 1..close].to_string());
    v.extend(text[close + 1..].split_whitespace().map(str::to_string));
    Ok(v)
}

/// A `Key:\tvalue` line of `/proc/PID[/task/TID]/status`.
pub fn status_field(path: &str, key: &str) -> io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| io::Error::other(format!("{path}: no field {key}")))
}

/// The innermost PID from an `NSpid:` line.
pub fn ns_pid(host_pid: Pid, tid: Pid) -> io::Result<Pid> {
    let v = status_field(&format!("/proc/{host_pid}/task/{tid}/status"), "NSpid")?;
    v.split_whitespace()
        .last()
        .and_then(|x| x.parse().ok())
        .ok_or_else(|| io::Error::other("malformed NSpid"))
}

pub fn tids(pid: Pid) -> io::Result<Vec<Pid>> {
    let mut v: Vec<Pid> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// `key:\tvalue` pairs of `/proc/PID/fdinfo/FD`, plus the raw text (for epoll's `tfd:` lines).
pub fn fdinfo(pid: Pid, fd: i32) -> io::Result<(Vec<(String, String)>, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))?;
    let kv = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok((kv, text))
}

pub fn get<'a>(kv: &'a [(String, String)], key: &str) -> Option<&'a str> {
    kv.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// `(sec, nsec)` as printed in timerfd fdinfo, to nanoseconds.
pub fn parse_timespec(v: &str) -> Option<u64> {
    let v = v.trim().trim_start_matches('(').trim_end_matches(')');
    let (s, n) = v.split_once(',')?;
    Some(s.trim().parse::<u64>().ok()? * 1_000_000_000 + n.trim().parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_map_lines() {
        let e = parse_map_line("7f00-7f10 r-xp 00001000 08:01 1234    /usr/lib/libc.so.6").unwrap();
        assert_eq!(
            (e.start, e.end, e.offset, e.inode),
            (0x7f00, 0x7f10, 0x1000, 1234)
        );
        assert!(e.read && !e.write && e.exec && !e.shared);
        assert_eq!(e.name, "/usr/lib/libc.so.6");
        let e = parse_map_line("1000-2000 rw-s 00000000 00:00 0 ").unwrap();
        assert!(e.shared && e.name.is_empty());
    }

    #[test]
    fn reads_own_smaps_with_flags() {
        let maps = smaps(std::process::id() as Pid).unwrap();
        assert!(maps.iter().any(|m| m.name == "[stack]" && m.has_flag("gd")));
        assert!(maps.iter().all(|m| !m.vmflags.is_empty()));
    }

    #[test]
    fn timespec() {
        assert_eq!(parse_timespec("(1, 500)"), Some(1_000_000_500));
    }
}
