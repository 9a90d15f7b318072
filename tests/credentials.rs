//! A service run as a user (manifest `tardi.user`): Debian's memcached as `memcache`.
//! Snapshot → kill → restore; the restored process has the same user, groups, capabilities
//! and flags (`/proc/PID/status`), and still serves its data.

mod common;

use common::tardi::{Running, Scratch};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const KEYS: [&str; 9] = [
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
];

/// The credential lines of the sandbox's service process (found by its name among the
/// processes whose status says they run as `uid`).
fn creds(uid: u32) -> Vec<String> {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(s) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |k: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}:")))
                .map(|v| v.trim().to_string())
        };
        if field("Name").as_deref() == Some("memcached")
            && field("Uid").is_some_and(|u| u.split_whitespace().next() == Some(&uid.to_string()))
        {
            return KEYS
                .iter()
                .map(|k| format!("{k}: {}", field(k).unwrap()))
                .collect();
        }
    }
    panic!("no memcached running as uid {uid}");
}

/// The uid of `user` in `/etc/passwd`.
fn uid_of(user: &str) -> u32 {
    std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&user)).then(|| f[2].parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no user {user} in /etc/passwd"))
}

fn cmd(addr: SocketAddr, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(line.as_bytes()).unwrap();
                let mut r = BufReader::new(s);
                let mut out = String::new();
                r.read_line(&mut out).unwrap();
                if out.starts_with("VALUE") {
                    let mut v = String::new();
                    r.read_line(&mut v).unwrap();
                    out.push_str(&v);
                }
                return out;
            }
            Err(e) if Instant::now() > deadline => panic!("memcached at {addr}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[test]
fn memcached_as_its_user_keeps_its_credentials() {
    let scratch = Scratch::new("creds");
    let name = format!("mc-{}", std::process::id() % 10000);
    let m = scratch.0.join("mc.manifest");
    std::fs::write(
        &m,
        format!(
            "libos.entrypoint = \"/usr/bin/memcached\"\n\
             loader.argv = [\"memcached\", \"-p\", \"11211\", \"-U\", \"0\", \"-t\", \"1\"]\n\n\
             [tardi]\nname = {name:?}\nuser = \"memcache\"\n"
        ),
    )
    .unwrap();
    // memcache: created by Debian's memcached package (scripts/setup.sh installs it), with
    // whatever uid was free then.
    let uid = uid_of("memcache");
    let cur = Running::run(&m).expect("tardi run");
    let addr = SocketAddr::new(cur.address.into(), 11211);
    assert_eq!(cmd(addr, "set k 0 0 5\r\nhello\r\n"), "STORED\r\n");
    let before = creds(uid);
    assert!(
        before[0].starts_with(&format!("Uid: {uid}\t{uid}\t{uid}\t{uid}")),
        "{before:?}"
    );
    let file = scratch.0.join("mc.tardi");
    cur.snapshot(&file).expect("snapshot");
    cur.stop();
    let cur = Running::restore(&file).expect("restore");
    let addr = SocketAddr::new(cur.address.into(), 11211);
    assert_eq!(cmd(addr, "get k\r\n"), "VALUE k 0 5\r\nhello\r\n");
    assert_eq!(creds(uid), before, "credentials after restore");
    cur.stop();
}

/// A user the sandbox does not know is refused with its name and the reason, and nothing is
/// left behind: no sandbox, no run directory's lock, so the same name runs at once after.
#[test]
fn an_unknown_user_is_refused_and_nothing_is_left() {
    let scratch = Scratch::new("nouser");
    let name = format!("nu-{}", std::process::id() % 10000);
    let write = |user: &str| {
        let m = scratch.0.join(format!("{user}.manifest"));
        std::fs::write(
            &m,
            format!(
                "libos.entrypoint = \"/usr/bin/memcached\"\n\
                 loader.argv = [\"memcached\", \"-p\", \"11211\", \"-U\", \"0\", \"-t\", \"1\"]\n\n\
                 [tardi]\nname = {name:?}\nuser = {user:?}\n"
            ),
        )
        .unwrap();
        m
    };
    let err = match Running::run(&write("no-such-user-tardi")) {
        Ok(r) => {
            r.stop();
            panic!("a service was started as an unknown user");
        }
        Err(e) => e,
    };
    assert!(
        err.contains("no-such-user-tardi") && err.contains("no such user"),
        "the error should name the user and why: {err}"
    );
    // Nothing half started: the same sandbox name runs right away as a known user.
    let ok = Running::run(&write("memcache")).expect("the same name after a refusal");
    let addr = SocketAddr::new(ok.address.into(), 11211);
    assert_eq!(cmd(addr, "set k 0 0 2\r\nok\r\n"), "STORED\r\n");
    ok.stop();
}
