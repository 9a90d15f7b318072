//! Service address takeover against the real kernel: proxy ARP and gratuitous ARP between a
//! client namespace and a machine namespace that routes the address to its sandbox.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use common::*;
use tardi_netfilter::announce::ServiceAddress;

const SERVICE: &str = "10.77.1.100";
const FAKE_MAC: &str = "02:00:00:00:00:99";

fn mac_of(ns: &Ns, iface: &str) -> String {
    let out = ns.ip(&["link", "show", iface]);
    let mut words = out.split_whitespace();
    words.find(|w| *w == "link/ether").expect("link/ether");
    words.next().expect("mac").to_string()
}

fn client_neigh(t: &Topo) -> String {
    t.client.ip(&["neigh", "show", SERVICE, "dev", "eth0"])
}

/// Whether a datagram from the client to the service address reaches the sandbox.
fn reaches_sandbox(t: &Topo, rx: &UdpSocket, tx: &UdpSocket) -> bool {
    t.client
        .ip(&["neigh", "flush", "to", SERVICE, "dev", "eth0"]);
    tx.send_to(b"hi", (SERVICE, 9003)).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut buf = [0u8; 8];
    rx.recv_from(&mut buf).is_ok()
}

#[test]
fn claim_announces_and_answers_then_release_undoes() {
    let t = Topo::new("arp");
    // The service address lives in the sandbox; the machine routes it there.
    t.sandbox
        .ip(&["addr", "add", &format!("{SERVICE}/32"), "dev", "eth0"]);
    t.machine.ip(&[
        "route",
        "add",
        &format!("{SERVICE}/32"),
        "via",
        SANDBOX_ADDR,
        "dev",
        HOST_IF,
    ]);
    let rx = t.sandbox.run(|| UdpSocket::bind((SERVICE, 9003)).unwrap());
    let tx = t.client.run(|| UdpSocket::bind((CLIENT_ADDR, 0)).unwrap());
    let delay_path = "/proc/sys/net/ipv4/neigh/lan/proxy_delay";
    let delay_before = t
        .machine
        .run(|| std::fs::read_to_string(delay_path).unwrap());

    assert!(!reaches_sandbox(&t, &rx, &tx), "reachable before the claim");

    // The client has a stale entry pointing elsewhere (the old primary).
    t.client.ip(&[
        "neigh", "replace", SERVICE, "lladdr", FAKE_MAC, "dev", "eth0", "nud", "stale",
    ]);
    let machine_mac = mac_of(&t.machine, "lan");
    let addr: Ipv4Addr = SERVICE.parse().unwrap();
    let claim = t
        .machine
        .run(|| ServiceAddress::claim(addr, "lan"))
        .expect("claim");
    // The gratuitous ARP moved the client's entry to this machine.
    assert!(
        wait_until(Duration::from_secs(2), || client_neigh(&t)
            .contains(&machine_mac)),
        "client's entry not updated: {} (machine {machine_mac})",
        client_neigh(&t)
    );
    assert!(t.machine.ip(&["neigh", "show", "proxy"]).contains(SERVICE));
    assert_eq!(
        t.machine
            .run(|| std::fs::read_to_string(delay_path).unwrap())
            .trim(),
        "0"
    );
    // A fresh ARP request is answered by the proxy entry.
    assert!(reaches_sandbox(&t, &rx, &tx), "proxy ARP did not answer");

    claim.release();
    assert!(!t.machine.ip(&["neigh", "show", "proxy"]).contains(SERVICE));
    assert_eq!(
        t.machine
            .run(|| std::fs::read_to_string(delay_path).unwrap()),
        delay_before
    );
    assert!(
        !reaches_sandbox(&t, &rx, &tx),
        "still answering after release"
    );
}

#[test]
fn claim_needs_forwarding_and_an_existing_interface() {
    let m = Ns::new("arpbad");
    let addr = Ipv4Addr::new(10, 77, 9, 9);
    let err = m.run(|| ServiceAddress::claim(addr, "lo")).err().unwrap();
    assert!(err.to_string().contains("forwarding is off"), "{err}");
    m.run(|| tardi_netfilter::announce::enable_forwarding().unwrap());
    assert!(m.run(|| ServiceAddress::claim(addr, "nosuch0")).is_err());
    assert!(m.run(|| ServiceAddress::claim(addr, "bad name")).is_err());
}
