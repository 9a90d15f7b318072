//! Service address takeover at failover: only the primary answers ARP for the service address.
//!
//! [`ServiceAddress::claim`] adds a proxy ARP entry (`ip neigh replace proxy ADDR dev IFACE`)
//! and announces the address with gratuitous ARP from a raw `AF_PACKET` socket. Kernel rules
//! this relies on (`net/ipv4/arp.c`, `arp_process`):
//! - The kernel answers a request for a proxy entry's address only if forwarding is on for the
//!   interface and the address routes (unicast) through *another* interface, e.g. the
//!   sandbox's veth; see [`enable_forwarding`].
//! - Replies to broadcast requests for proxy entries wait a random time up to
//!   `neigh/IFACE/proxy_delay` (default 80 = 0.8 s); `claim` sets it to 0 and restores it on
//!   release.
//! - A neighbour that already has an entry for the address updates it on a gratuitous ARP
//!   (sender = target address) whatever its lock time; a neighbour without one creates none
//!   unless it sets `arp_accept`: it asks when it next needs the address, and the proxy entry
//!   answers.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cmd::Netns;
use crate::error::{NetfilterError, Result};
use crate::rules::check_ifname;

/// When announcements go out, after the claim (the first at once, inside `claim`).
const REPEATS: [Duration; 2] = [Duration::from_millis(200), Duration::from_secs(1)];

/// Turns IPv4 forwarding on in the calling thread's network namespace
/// (`/proc/sys/net/ipv4/ip_forward`, which also sets every interface's `forwarding`). The
/// FORWARD-hook gate and proxy ARP both need it.
pub fn enable_forwarding() -> Result<()> {
    write_proc("/proc/sys/net/ipv4/ip_forward", "1\n")
}

fn write_proc(path: &str, value: &str) -> Result<()> {
    std::fs::write(path, value).map_err(|source| NetfilterError::Proc {
        action: "writing",
        path: path.into(),
        source,
    })
}

fn read_proc(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| NetfilterError::Proc {
        action: "reading",
        path: path.into(),
        source,
    })
}

/// This machine answering ARP for a service address on its LAN interface. Undone by
/// [`release`](ServiceAddress::release) or drop.
pub struct ServiceAddress {
    addr: Ipv4Addr,
    iface: String,
    ns: Netns,
    /// `neigh/IFACE/proxy_delay`, opened in the right namespace, and its value before.
    proxy_delay: Option<(File, String)>,
    repeater: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    claimed: bool,
}

impl ServiceAddress {
    /// Makes this machine answer ARP for `addr` on `iface` (its LAN interface), and announces it
    /// with gratuitous ARP: a request and a reply with sender = target = `addr`, broadcast, now
    /// and twice more within a second. Call it on a thread in the namespace of `iface`, with
    /// forwarding on there and `addr` routed to the sandbox.
    pub fn claim(addr: Ipv4Addr, iface: &str) -> Result<ServiceAddress> {
        check_ifname(iface)?;
        let forwarding = read_proc(&format!("/proc/sys/net/ipv4/conf/{iface}/forwarding"))?;
        if forwarding.trim() != "1" {
            return Err(NetfilterError::ForwardingOff {
                iface: iface.into(),
            });
        }
        let announcer = Announcer::open(iface, addr)?;
        let mut this = ServiceAddress {
            addr,
            iface: iface.into(),
            ns: Netns::current()?,
            proxy_delay: None,
            repeater: None,
            claimed: false,
        };
        // From here on, `Drop` undoes whatever got done.
        let path = format!("/proc/sys/net/ipv4/neigh/{iface}/proxy_delay");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| NetfilterError::Proc {
                action: "opening",
                path: path.clone(),
                source,
            })?;
        let mut old = String::new();
        file.read_to_string(&mut old)
            .map_err(|source| NetfilterError::Proc {
                action: "reading",
                path: path.clone(),
                source,
            })?;
        file.write_at(b"0\n", 0)
            .map_err(|source| NetfilterError::Proc {
                action: "writing",
                path: path.clone(),
                source,
            })?;
        this.proxy_delay = Some((file, old));
        let a = addr.to_string();
        this.ns
            .run("ip", &["neigh", "replace", "proxy", &a, "dev", iface], "")?;
        this.claimed = true;
        announcer.announce()?;
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name(format!("garp-{iface}"))
            .spawn(move || {
                for wait in REPEATS {
                    if stopped.recv_timeout(wait) != Err(mpsc::RecvTimeoutError::Timeout) {
                        return;
                    }
                    if let Err(e) = announcer.announce() {
                        tracing::warn!(error = %e, "gratuitous ARP");
                    }
                }
            })
            .map_err(|source| NetfilterError::Syscall {
                call: "spawning the ARP announcer thread",
                source,
            })?;
        this.repeater = Some((stop, handle));
        tracing::info!(%addr, iface, "claimed the service address");
        Ok(this)
    }

    /// The address claimed.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// Stops answering ARP for the address (removes the proxy entry, restores `proxy_delay`).
    pub fn release(mut self) {
        self.undo();
    }

    fn undo(&mut self) {
        if let Some((stop, handle)) = self.repeater.take() {
            drop(stop);
            let _ = handle.join();
        }
        if std::mem::take(&mut self.claimed) {
            let a = self.addr.to_string();
            if let Err(e) =
                self.ns
                    .run("ip", &["neigh", "del", "proxy", &a, "dev", &self.iface], "")
            {
                tracing::error!(error = %e, "removing the proxy ARP entry");
            }
        }
        if let Some((file, old)) = self.proxy_delay.take()
            && let Err(e) = file.write_at(old.as_bytes(), 0)
        {
            tracing::error!(error = %e, iface = %self.iface, "restoring proxy_delay");
        }
        tracing::info!(addr = %self.addr, iface = %self.iface, "released the service address");
    }
}

impl Drop for ServiceAddress {
    fn drop(&mut self) {
        if self.claimed || self.proxy_delay.is_some() || self.repeater.is_some() {
            self.undo();
        }
    }
}

/// A raw packet socket bound to one interface, sending gratuitous ARP for one address.
struct Announcer {
    sock: OwnedFd,
    ifindex: i32,
    request: [u8; 60],
    reply: [u8; 60],
}

const ETH_P_ARP: u16 = 0x0806;
const ARPHRD_ETHER: u16 = 1;
const BROADCAST: [u8; 6] = [0xff; 6];

impl Announcer {
    fn open(iface: &str, addr: Ipv4Addr) -> Result<Announcer> {
        // Protocol 0: this socket receives nothing, it only sends.
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(NetfilterError::last_os("socket(AF_PACKET, SOCK_RAW)"));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero ifreq is valid.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(iface.bytes()) {
            *dst = src as libc::c_char;
        }
        // SAFETY: `req` is a valid ifreq with a NUL-terminated name (checked: < IFNAMSIZ).
        if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFINDEX, &mut req) } != 0 {
            return Err(no_iface(iface));
        }
        // SAFETY: SIOCGIFINDEX filled the `ifru_ifindex` member of the union.
        let ifindex = unsafe { req.ifr_ifru.ifru_ifindex };
        // SAFETY: as above; SIOCGIFHWADDR fills `ifru_hwaddr`.
        if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } != 0 {
            return Err(NetfilterError::last_os("ioctl(SIOCGIFHWADDR)"));
        }
        // SAFETY: SIOCGIFHWADDR filled the `ifru_hwaddr` member of the union.
        let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
        if hw.sa_family != ARPHRD_ETHER {
            return Err(NetfilterError::InvalidConfig(format!(
                "interface `{iface}` is not Ethernet (hardware type {})",
                hw.sa_family
            )));
        }
        let mut mac = [0u8; 6];
        for (m, b) in mac.iter_mut().zip(hw.sa_data) {
            *m = b as u8;
        }
        Ok(Announcer {
            sock,
            ifindex,
            request: arp_frame(1, mac, addr, [0; 6]),
            reply: arp_frame(2, mac, addr, mac),
        })
    }

    fn announce(&self) -> Result<()> {
        for frame in [&self.request, &self.reply] {
            // SAFETY: an all-zero sockaddr_ll is valid; the fields used are set below.
            let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            to.sll_family = libc::AF_PACKET as u16;
            to.sll_protocol = ETH_P_ARP.to_be();
            to.sll_ifindex = self.ifindex;
            to.sll_halen = 6;
            to.sll_addr[..6].copy_from_slice(&BROADCAST);
            // SAFETY: `frame` and `to` are valid for the lengths given.
            let rc = unsafe {
                libc::sendto(
                    self.sock.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&to as *const libc::sockaddr_ll).cast(),
                    size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            if rc < 0 {
                return Err(NetfilterError::last_os("sendto(gratuitous ARP)"));
            }
        }
        Ok(())
    }
}

fn no_iface(iface: &str) -> NetfilterError {
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENODEV) {
        NetfilterError::InvalidConfig(format!("no interface `{iface}` in this network namespace"))
    } else {
        NetfilterError::Syscall {
            call: "ioctl(SIOCGIFINDEX)",
            source: e,
        }
    }
}

/// A broadcast Ethernet frame carrying an ARP `op` (1 request, 2 reply) with sender = target
/// = `addr`, padded to the Ethernet minimum of 60 bytes (without FCS).
fn arp_frame(op: u16, mac: [u8; 6], addr: Ipv4Addr, target_mac: [u8; 6]) -> [u8; 60] {
    let mut f = [0u8; 60];
    f[0..6].copy_from_slice(&BROADCAST);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
    f[14..16].copy_from_slice(&ARPHRD_ETHER.to_be_bytes()); // hardware type
    f[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // protocol type: IPv4
    f[18] = 6; // hardware address length
    f[19] = 4; // protocol address length
    f[20..22].copy_from_slice(&op.to_be_bytes());
    f[22..28].copy_from_slice(&mac); // sender hardware address
    f[28..32].copy_from_slice(&addr.octets()); // sender protocol address
    f[32..38].copy_from_slice(&target_mac); // target hardware address
    f[38..42].copy_from_slice(&addr.octets()); // target protocol address
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gratuitous_request_layout() {
        let mac = [2, 0, 0, 0, 0, 1];
        let f = arp_frame(1, mac, Ipv4Addr::new(10, 1, 2, 3), [0; 6]);
        assert_eq!(&f[..6], &[0xff; 6]);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[20..22], &[0, 1]);
        assert_eq!(&f[22..28], &mac);
        assert_eq!(&f[28..32], &[10, 1, 2, 3]);
        assert_eq!(&f[38..42], &[10, 1, 2, 3]);
        assert!(f[42..].iter().all(|&b| b == 0));
    }
}
