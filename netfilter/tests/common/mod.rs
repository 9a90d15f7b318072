//! Test scaffolding: network namespaces named `tnf-<pid>-<tag>` that are deleted on drop (also
//! when a test fails), code run inside them on a dedicated thread (`setns`), and a three-namespace
//! topology: sandbox <-veth-> machine <-veth-> client, forwarding on in the machine.
#![allow(dead_code)]

use std::fs::File;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `program args..` and returns its stdout; panics with its stderr on failure.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace of our own; deleted on drop.
pub struct Ns {
    pub name: String,
    fd: File,
}

impl Ns {
    pub fn new(tag: &str) -> Ns {
        let name = format!("tnf-{}-{tag}", std::process::id());
        // A leftover of an earlier run with the same pid would make `add` fail.
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run("ip", &["netns", "add", &name]);
        let fd = File::open(format!("/run/netns/{name}")).expect("open the namespace");
        let ns = Ns { name, fd };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// Runs `f` on a new thread that has entered this namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.fd.as_raw_fd();
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: `fd` is an open namespace file; only this thread changes namespace.
                let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .expect("thread in namespace panicked")
        })
    }

    /// `ip -n NAME args..`
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `ip netns exec NAME program args..`
    pub fn exec(&self, program: &str, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Like `exec`, but returns whether it succeeded.
    pub fn exec_ok(&self, program: &str, args: &[&str]) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// Everything netfilter holds in this namespace: nft's ruleset and iptables-nft's view,
    /// without iptables-save's timestamped comments.
    pub fn rulesets(&self) -> String {
        let nft = self.exec("nft", &["list", "ruleset"]);
        let ipt = self.exec("iptables-nft-save", &[]);
        let ipt: Vec<&str> = ipt.lines().filter(|l| !l.starts_with('#')).collect();
        format!("{nft}\n----\n{}", ipt.join("\n"))
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

pub const SANDBOX_ADDR: &str = "10.77.0.2";
pub const HOST_ADDR: &str = "10.77.0.1";
pub const MACHINE_LAN: &str = "10.77.1.1";
pub const CLIENT_ADDR: &str = "10.77.1.2";
/// The host side of the sandbox's veth, in the machine namespace.
pub const HOST_IF: &str = "tdh";

/// sandbox (eth0 10.77.0.2/30) <-> machine (tdh 10.77.0.1/30, lan 10.77.1.1/24) <-> client
/// (eth0 10.77.1.2/24). Fields drop in order, deleting the namespaces.
pub struct Topo {
    pub sandbox: Ns,
    pub machine: Ns,
    pub client: Ns,
}

impl Topo {
    pub fn new(tag: &str) -> Topo {
        let t = Topo {
            sandbox: Ns::new(&format!("{tag}-s")),
            machine: Ns::new(&format!("{tag}-m")),
            client: Ns::new(&format!("{tag}-c")),
        };
        let (s, m, c) = (&t.sandbox, &t.machine, &t.client);
        m.ip(&[
            "link", "add", HOST_IF, "type", "veth", "peer", "name", "eth0", "netns", &s.name,
        ]);
        m.ip(&[
            "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", &c.name,
        ]);
        m.ip(&["addr", "add", &format!("{HOST_ADDR}/30"), "dev", HOST_IF]);
        m.ip(&["addr", "add", &format!("{MACHINE_LAN}/24"), "dev", "lan"]);
        m.ip(&["link", "set", HOST_IF, "up"]);
        m.ip(&["link", "set", "lan", "up"]);
        s.ip(&["addr", "add", &format!("{SANDBOX_ADDR}/30"), "dev", "eth0"]);
        s.ip(&["link", "set", "eth0", "up"]);
        s.ip(&["route", "add", "default", "via", HOST_ADDR]);
        c.ip(&["addr", "add", &format!("{CLIENT_ADDR}/24"), "dev", "eth0"]);
        c.ip(&["link", "set", "eth0", "up"]);
        c.ip(&["route", "add", "default", "via", MACHINE_LAN]);
        m.run(|| tardi_netfilter::announce::enable_forwarding().expect("forwarding"));
        // Resolve neighbours now, so that the first packets of a test do not wait for ARP: a
        // datagram from the sandbox to the client (nobody listens: the machine learns both).
        let tx = t.sandbox_udp();
        let learned = wait_until(Duration::from_secs(3), || {
            send_seq(&tx, (CLIENT_ADDR, 9), [0]);
            std::thread::sleep(Duration::from_millis(5));
            [SANDBOX_ADDR, CLIENT_ADDR].iter().all(|a| {
                let n = m.ip(&["neigh", "show", a]);
                n.contains("REACHABLE") || n.contains("STALE") || n.contains("DELAY")
            })
        });
        assert!(learned, "neighbours not resolved: {}", m.ip(&["neigh"]));
        t
    }

    /// A UDP socket bound to `addr` inside the sandbox.
    pub fn sandbox_udp(&self) -> UdpSocket {
        self.sandbox
            .run(|| UdpSocket::bind((SANDBOX_ADDR, 0)).expect("bind in sandbox"))
    }

    /// A UDP socket of the client on `port`, with a short read timeout.
    pub fn client_udp(&self, port: u16) -> UdpSocket {
        let s = self
            .client
            .run(|| UdpSocket::bind((CLIENT_ADDR, port)).expect("bind in client"));
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        set_rcvbuf(&s, 8 << 20);
        s
    }
}

/// Raises a socket's receive buffer (beyond `rmem_max`: we are root), so that a released burst
/// does not overflow the receiver.
pub fn set_rcvbuf(sock: &impl AsRawFd, bytes: libc::c_int) {
    // SAFETY: `bytes` outlives the call and the length matches.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&bytes as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
}

/// Sends the sequence numbers `seqs` (one datagram each, 4 bytes big-endian) to `to`.
pub fn send_seq(sock: &UdpSocket, to: (&str, u16), seqs: impl IntoIterator<Item = u32>) {
    for i in seqs {
        sock.send_to(&i.to_be_bytes(), to).expect("send");
    }
}

/// Receives sequence numbers until nothing arrived for `quiet`.
pub fn recv_seq(sock: &UdpSocket, quiet: Duration) -> Vec<u32> {
    sock.set_read_timeout(Some(quiet)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while let Ok((n, _)) = sock.recv_from(&mut buf) {
        if n >= 4 {
            got.push(u32::from_be_bytes(buf[..4].try_into().unwrap()));
        }
    }
    got
}

/// Polls `cond` every millisecond until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
