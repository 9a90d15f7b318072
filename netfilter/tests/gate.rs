//! The output gate against the real kernel, in namespaces of its own (see `common`). Needs
//! root, `nft`, `iptables-nft` and `ip`.

mod common;

use std::time::Duration;

use common::*;
use tardi_netfilter::{Gate, GateConfig, Mode};

const QUIET: Duration = Duration::from_millis(200);
const SETTLE: Duration = Duration::from_secs(3);

fn gate(t: &Topo, mode: Mode) -> Gate {
    let mut cfg = GateConfig::new(HOST_IF, 10);
    cfg.mode = mode;
    t.machine.run(|| Gate::new(cfg).expect("Gate::new"))
}

fn wait_held(g: &Gate, n: u64) {
    assert!(
        wait_until(SETTLE, || g.stats().held_packets >= n),
        "expected {n} held packets, stats: {:?}",
        g.stats()
    );
}

#[test]
fn hold_until_released_then_all_in_order() {
    let t = Topo::new("hold");
    let g = gate(&t, Mode::Hold);
    let (tx, rx) = (t.sandbox_udp(), t.client_udp(9000));
    send_seq(&tx, (CLIENT_ADDR, 9000), 0..300);
    wait_held(&g, 300);
    assert_eq!(g.stats().kernel_queued, 300);
    assert!(g.output_waiting());
    assert_eq!(recv_seq(&rx, QUIET), Vec::<u32>::new(), "output leaked");
    // Not released without a mark: epoch 1 is still in progress.
    g.release(1).unwrap();
    assert_eq!(
        recv_seq(&rx, QUIET),
        Vec::<u32>::new(),
        "released before the mark"
    );
    g.mark(1);
    assert!(!g.output_waiting());
    g.release(1).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (0..300).collect::<Vec<_>>());
    let s = g.stats();
    assert_eq!((s.held_packets, s.released_packets), (0, 300));
    assert_eq!((s.last_marked, s.last_released), (1, 1));
    assert_eq!(s.dropped_total, 0);
    assert!(s.released_bytes >= 300 * 32, "{s:?}");
    // Idempotent, and a lower number is a no-op.
    g.release(1).unwrap();
    g.release(0).unwrap();
    assert_eq!(g.stats().verdict_errors, 0);
}

#[test]
fn packets_after_a_mark_wait_for_the_next_epoch() {
    let t = Topo::new("epoch");
    let g = gate(&t, Mode::Hold);
    let (tx, rx) = (t.sandbox_udp(), t.client_udp(9000));
    send_seq(&tx, (CLIENT_ADDR, 9000), 0..50);
    wait_held(&g, 50);
    g.mark(1);
    send_seq(&tx, (CLIENT_ADDR, 9000), 50..120);
    wait_held(&g, 120);
    assert!(g.output_waiting());
    g.release(1).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (0..50).collect::<Vec<_>>());
    assert_eq!(g.stats().held_packets, 70);
    // Releasing "2" before the mark of 2 releases nothing more.
    g.release(2).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), Vec::<u32>::new());
    g.mark(2);
    g.release(2).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (50..120).collect::<Vec<_>>());
    assert_eq!(g.stats().held_packets, 0);
}

#[test]
fn wait_output_wakes_on_the_first_packet_of_an_epoch() {
    let t = Topo::new("wait");
    let g = gate(&t, Mode::Hold);
    let tx = t.sandbox_udp();
    let _rx = t.client_udp(9000);
    assert!(!g.wait_output(Duration::from_millis(50)));
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            send_seq(&tx, (CLIENT_ADDR, 9000), 0..1);
        });
        let t0 = std::time::Instant::now();
        assert!(g.wait_output(Duration::from_secs(5)));
        assert!(t0.elapsed() < Duration::from_secs(2));
        sender.join().unwrap();
    });
    g.mark(1);
    assert!(!g.output_waiting());
    assert!(!g.wait_output(Duration::from_millis(50)));
}

/// The first checkpoint is epoch 0: output sent before its pause is released once epoch 0 is
/// decided, not an epoch later (a new primary's first replies wait for nothing more).
#[test]
fn epoch_zero_releases_what_came_before_the_first_mark() {
    let t = Topo::new("zero");
    let g = gate(&t, Mode::Hold);
    let (tx, rx) = (t.sandbox_udp(), t.client_udp(9000));
    send_seq(&tx, (CLIENT_ADDR, 9000), 0..10);
    wait_held(&g, 10);
    g.release(0).unwrap();
    assert_eq!(
        recv_seq(&rx, QUIET),
        Vec::<u32>::new(),
        "released before any mark"
    );
    g.mark(0);
    send_seq(&tx, (CLIENT_ADDR, 9000), 10..20);
    wait_held(&g, 20);
    g.release(0).unwrap();
    assert_eq!(
        recv_seq(&rx, QUIET),
        (0..10).collect::<Vec<_>>(),
        "epoch 0 only"
    );
    g.mark(1);
    g.release(1).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (10..20).collect::<Vec<_>>());
}

#[test]
fn on_output_is_called_once_per_epoch_with_output() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    let t = Topo::new("onout");
    let g = gate(&t, Mode::Hold);
    let (tx, _rx) = (t.sandbox_udp(), t.client_udp(9000));
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    assert!(g.on_output(Box::new(move || {
        c.fetch_add(1, Ordering::SeqCst);
    })));
    assert!(
        !g.on_output(Box::new(|| {})),
        "a second callback is refused"
    );
    send_seq(&tx, (CLIENT_ADDR, 9000), 0..5);
    wait_held(&g, 5);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "once for the epoch's first packet"
    );
    g.mark(1);
    send_seq(&tx, (CLIENT_ADDR, 9000), 5..8);
    wait_held(&g, 8);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "once more in the next epoch"
    );
}

/// `on_each_output` counts every queued output packet (the epoch loop compares that count with
/// what the last release sent); `on_release` gets the epoch released and its packets, also when
/// it sent none.
#[test]
fn output_and_release_callbacks_count_packets() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    let t = Topo::new("counts");
    let g = gate(&t, Mode::Hold);
    let (tx, rx) = (t.sandbox_udp(), t.client_udp(9000));
    let queued = Arc::new(AtomicU64::new(0));
    let releases = Arc::new(Mutex::new(Vec::new()));
    let q = queued.clone();
    assert!(g.on_each_output(Box::new(move |n| {
        q.fetch_add(n, Ordering::SeqCst);
    })));
    let r = releases.clone();
    assert!(g.on_release(Box::new(move |e, n| r.lock().unwrap().push((e, n)))));
    assert!(
        !g.on_each_output(Box::new(|_| {})),
        "a second callback is refused"
    );
    assert!(
        !g.on_release(Box::new(|_, _| {})),
        "a second callback is refused"
    );
    send_seq(&tx, (CLIENT_ADDR, 9000), 0..7);
    wait_held(&g, 7);
    assert_eq!(queued.load(Ordering::SeqCst), 7);
    g.mark(0);
    send_seq(&tx, (CLIENT_ADDR, 9000), 7..10);
    wait_held(&g, 10);
    assert_eq!(queued.load(Ordering::SeqCst), 10);
    g.release(0).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (0..7).collect::<Vec<_>>());
    g.mark(1);
    g.release(1).unwrap();
    g.mark(2);
    g.release(2).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (7..10).collect::<Vec<_>>());
    assert_eq!(*releases.lock().unwrap(), [(0, 7), (1, 3), (2, 0)]);
}

#[test]
fn drop_mode_drops_and_pass_mode_passes() {
    let t = Topo::new("modes");
    let g = gate(&t, Mode::Drop);
    let (tx, rx) = (t.sandbox_udp(), t.client_udp(9000));
    send_seq(&tx, (CLIENT_ADDR, 9000), 0..100);
    assert_eq!(recv_seq(&rx, QUIET), Vec::<u32>::new(), "Drop mode leaked");
    assert_eq!(g.stats().held_packets, 0);
    assert_eq!(g.dropped_by_rules().unwrap(), 100);

    g.set_mode(Mode::Pass).unwrap();
    send_seq(&tx, (CLIENT_ADDR, 9000), 100..200);
    assert_eq!(recv_seq(&rx, QUIET), (100..200).collect::<Vec<_>>());

    // Held output is discarded when the machine stops being the primary.
    g.set_mode(Mode::Hold).unwrap();
    send_seq(&tx, (CLIENT_ADDR, 9000), 200..300);
    wait_held(&g, 100);
    g.set_mode(Mode::Drop).unwrap();
    g.mark(1);
    g.release(1).unwrap();
    assert_eq!(
        recv_seq(&rx, QUIET),
        Vec::<u32>::new(),
        "held output leaked"
    );
    let s = g.stats();
    assert_eq!((s.held_packets, s.discarded_packets), (0, 100), "{s:?}");

    // Switching to Pass releases what is held.
    g.set_mode(Mode::Hold).unwrap();
    send_seq(&tx, (CLIENT_ADDR, 9000), 300..350);
    wait_held(&g, 50);
    g.set_mode(Mode::Pass).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (300..350).collect::<Vec<_>>());
    assert_eq!(g.stats().verdict_errors, 0);
}

#[test]
fn output_to_the_machine_itself_is_held_too() {
    let t = Topo::new("local");
    let g = gate(&t, Mode::Hold);
    let tx = t.sandbox_udp();
    let rx = t
        .machine
        .run(|| std::net::UdpSocket::bind((MACHINE_LAN, 9001)).unwrap());
    set_rcvbuf(&rx, 8 << 20);
    send_seq(&tx, (MACHINE_LAN, 9001), 0..20);
    wait_held(&g, 20);
    assert_eq!(recv_seq(&rx, QUIET), Vec::<u32>::new());
    g.mark(1);
    g.release(1).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (0..20).collect::<Vec<_>>());
}

#[test]
fn input_is_held_while_restoring_then_delivered_in_order() {
    let t = Topo::new("input");
    let g = gate(&t, Mode::Pass);
    let tx = t
        .client
        .run(|| std::net::UdpSocket::bind((CLIENT_ADDR, 0)).unwrap());
    let rx = t
        .sandbox
        .run(|| std::net::UdpSocket::bind((SANDBOX_ADDR, 9002)).unwrap());
    set_rcvbuf(&rx, 8 << 20);
    g.hold_input(true).unwrap();
    send_seq(&tx, (SANDBOX_ADDR, 9002), 0..200);
    assert!(wait_until(SETTLE, || g.stats().input_held_packets >= 200));
    assert_eq!(recv_seq(&rx, QUIET), Vec::<u32>::new(), "input leaked");
    g.hold_input(false).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (0..200).collect::<Vec<_>>());
    let s = g.stats();
    assert_eq!((s.input_held_packets, s.input_released_packets), (0, 200));
    // Not held any more.
    send_seq(&tx, (SANDBOX_ADDR, 9002), 200..210);
    assert_eq!(recv_seq(&rx, QUIET), (200..210).collect::<Vec<_>>());
}

#[test]
fn drop_removes_exactly_what_the_gate_created() {
    let t = Topo::new("clean");
    let m = &t.machine;
    let before = m.rulesets();
    let g = gate(&t, Mode::Hold);
    g.hold_input(true).unwrap();
    let during = m.rulesets();
    assert!(during.contains("table inet tardi"), "{during}");
    assert!(during.contains("jump out_tdh"), "{during}");
    assert!(during.contains("TARDI-OUT-tdh"), "{during}");
    drop(g);
    assert_eq!(m.rulesets(), before);
}

#[test]
fn others_rules_survive_and_leftovers_are_replaced() {
    let t = Topo::new("others");
    let m = &t.machine;
    // Someone else's rules, in the tables the gate uses too.
    m.exec(
        "iptables-nft",
        &["-A", "FORWARD", "-i", "lan", "-j", "ACCEPT"],
    );
    m.exec(
        "iptables-nft",
        &[
            "-t", "security", "-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT",
        ],
    );
    m.exec("nft", &["add", "table", "inet", "someone_else"]);
    let before = m.rulesets();
    // Leftovers of a gate that died on the same interface (in a chain that exists anyway: an
    // empty built-in chain a leftover created cannot be told from someone else's).
    m.exec("iptables-nft", &["-t", "security", "-N", "TARDI-OUT-tdh"]);
    m.exec(
        "iptables-nft",
        &[
            "-t",
            "security",
            "-A",
            "INPUT",
            "-i",
            HOST_IF,
            "-j",
            "TARDI-OUT-tdh",
        ],
    );
    m.exec(
        "nft",
        &["add table inet tardi; add chain inet tardi out_tdh; \
             add chain inet tardi forward { type filter hook forward priority 10; }; \
             add rule inet tardi forward iifname tdh jump out_tdh"],
    );

    let g = gate(&t, Mode::Hold);
    let during = m.exec("nft", &["list", "table", "inet", "tardi"]);
    assert_eq!(during.matches("jump out_tdh").count(), 2, "{during}");
    let during = m.exec("iptables-nft-save", &["-t", "security"]);
    assert_eq!(
        during.matches("-j TARDI-OUT-tdh").count(),
        2,
        "one jump from FORWARD, one from INPUT: {during}"
    );
    // An ACCEPT in `filter` does not let the sandbox's output skip the gate.
    m.exec(
        "iptables-nft",
        &["-I", "FORWARD", "-i", HOST_IF, "-j", "ACCEPT"],
    );
    let (tx, rx) = (t.sandbox_udp(), t.client_udp(9000));
    send_seq(&tx, (CLIENT_ADDR, 9000), 0..10);
    wait_held(&g, 10);
    assert_eq!(recv_seq(&rx, QUIET), Vec::<u32>::new());
    m.exec(
        "iptables-nft",
        &["-D", "FORWARD", "-i", HOST_IF, "-j", "ACCEPT"],
    );
    g.close().unwrap();
    assert_eq!(m.rulesets(), before);
}

#[test]
fn bad_configuration_is_an_error() {
    let t = Topo::new("bad");
    let mut cfg = GateConfig::new("no such if", 10);
    assert!(t.machine.run(|| Gate::new(cfg.clone())).is_err());
    cfg.host_if = HOST_IF.into();
    cfg.input_queue_num = 10;
    assert!(t.machine.run(|| Gate::new(cfg.clone())).is_err());
    // The same queue numbers twice in one namespace.
    let g = gate(&t, Mode::Hold);
    let err = t
        .machine
        .run(|| Gate::new(GateConfig::new("other0", 10)))
        .err()
        .expect("second gate on queue 10");
    assert!(err.to_string().contains("another socket"), "{err}");
    drop(g);
}

#[test]
fn a_full_queue_drops_never_accepts() {
    let t = Topo::new("full");
    let mut cfg = GateConfig::new(HOST_IF, 10);
    cfg.queue_maxlen = 16;
    let g = t.machine.run(|| Gate::new(cfg).expect("Gate::new"));
    let (tx, rx) = (t.sandbox_udp(), t.client_udp(9000));
    send_seq(&tx, (CLIENT_ADDR, 9000), 0..50);
    wait_held(&g, 16);
    assert!(
        wait_until(SETTLE, || g.stats().kernel_dropped >= 34),
        "{:?}",
        g.stats()
    );
    assert_eq!(recv_seq(&rx, QUIET), Vec::<u32>::new(), "overflow leaked");
    g.mark(1);
    g.release(1).unwrap();
    assert_eq!(recv_seq(&rx, QUIET), (0..16).collect::<Vec<_>>());
    let s = g.stats();
    assert_eq!((s.kernel_dropped, s.dropped_total), (34, 34), "{s:?}");
}

#[test]
fn closing_the_gate_drops_what_is_held() {
    let t = Topo::new("close");
    let g = gate(&t, Mode::Hold);
    let (tx, rx) = (t.sandbox_udp(), t.client_udp(9000));
    send_seq(&tx, (CLIENT_ADDR, 9000), 0..20);
    wait_held(&g, 20);
    g.mark(1);
    g.close().unwrap();
    assert_eq!(
        recv_seq(&rx, QUIET),
        Vec::<u32>::new(),
        "held output leaked"
    );
    // Without the gate, output flows.
    send_seq(&tx, (CLIENT_ADDR, 9000), 20..25);
    assert_eq!(recv_seq(&rx, QUIET), (20..25).collect::<Vec<_>>());
}

#[test]
fn gates_are_shareable_between_threads() {
    fn check<T: Send + Sync>() {}
    check::<Gate>();
    check::<tardi_netfilter::announce::ServiceAddress>();
}

#[test]
fn two_gates_in_one_namespace_are_independent() {
    let t = Topo::new("two");
    let m = &t.machine;
    let before = m.rulesets();
    // A second sandbox, on an interface whose name needs care in nft and iptables syntax.
    let s2 = Ns::new("two-s2");
    m.ip(&[
        "link", "add", "td-2.x", "type", "veth", "peer", "name", "eth0", "netns", &s2.name,
    ]);
    m.ip(&["addr", "add", "10.77.0.5/30", "dev", "td-2.x"]);
    m.ip(&["link", "set", "td-2.x", "up"]);
    s2.ip(&["addr", "add", "10.77.0.6/30", "dev", "eth0"]);
    s2.ip(&["link", "set", "eth0", "up"]);
    s2.ip(&["route", "add", "default", "via", "10.77.0.5"]);

    let (a, b) = std::thread::scope(|s| {
        // Created at the same time.
        let a = s.spawn(|| gate(&t, Mode::Hold));
        let b = s.spawn(|| m.run(|| Gate::new(GateConfig::new("td-2.x", 20)).unwrap()));
        (a.join().unwrap(), b.join().unwrap())
    });
    let tx1 = t.sandbox_udp();
    let tx2 = s2.run(|| std::net::UdpSocket::bind(("10.77.0.6", 0)).unwrap());
    let rx1 = t.client_udp(9000);
    let rx2 = t.client_udp(9001);
    send_seq(&tx1, (CLIENT_ADDR, 9000), 0..10);
    send_seq(&tx2, (CLIENT_ADDR, 9001), 100..110);
    wait_held(&a, 10);
    wait_held(&b, 10);
    a.mark(1);
    a.release(1).unwrap();
    assert_eq!(recv_seq(&rx1, QUIET), (0..10).collect::<Vec<_>>());
    assert_eq!(recv_seq(&rx2, QUIET), Vec::<u32>::new());
    drop(a);
    // B still holds, and its rules are intact.
    send_seq(&tx2, (CLIENT_ADDR, 9001), 110..115);
    wait_held(&b, 15);
    assert_eq!(recv_seq(&rx2, QUIET), Vec::<u32>::new());
    b.mark(1);
    b.release(1).unwrap();
    assert_eq!(recv_seq(&rx2, QUIET), (100..115).collect::<Vec<_>>());
    drop(b);
    assert_eq!(m.rulesets(), before);
}

#[test]
fn ipv6_output_is_never_leaked() {
    let t = Topo::new("v6");
    let (s, m, c) = (&t.sandbox, &t.machine, &t.client);
    s.ip(&["addr", "add", "fd77::2/64", "dev", "eth0", "nodad"]);
    s.ip(&["-6", "route", "add", "default", "via", "fd77::1"]);
    m.ip(&["addr", "add", "fd77::1/64", "dev", HOST_IF, "nodad"]);
    m.ip(&["addr", "add", "fd78::1/64", "dev", "lan", "nodad"]);
    c.ip(&["addr", "add", "fd78::2/64", "dev", "eth0", "nodad"]);
    c.ip(&["-6", "route", "add", "default", "via", "fd78::1"]);
    m.exec("sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"]);
    let tx = s.run(|| std::net::UdpSocket::bind("[fd77::2]:0").unwrap());
    let rx = c.run(|| std::net::UdpSocket::bind("[fd78::2]:9000").unwrap());
    let to = ("fd78::2", 9000);

    let g = gate(&t, Mode::Pass);
    // Pass: IPv6 flows (also resolves the neighbours).
    assert!(wait_until(SETTLE, || {
        send_seq(&tx, to, [0]);
        !recv_seq(&rx, Duration::from_millis(20)).is_empty()
    }));
    g.set_mode(Mode::Hold).unwrap();
    let dropped = g.dropped_by_rules().unwrap();
    send_seq(&tx, to, 1..21);
    assert_eq!(
        recv_seq(&rx, QUIET),
        Vec::<u32>::new(),
        "IPv6 leaked in Hold mode"
    );
    g.mark(1);
    g.release(1).unwrap();
    assert_eq!(
        recv_seq(&rx, QUIET),
        Vec::<u32>::new(),
        "IPv6 leaked on release"
    );
    if g.backend() == tardi_netfilter::Backend::Xtables {
        // The xtables queue takes IPv4 only; IPv6 is dropped, and counted: each of the 20, and
        // whatever other IPv6 the sandbox sent meanwhile (its neighbour discovery, a probe of
        // the loop above still crossing the machine: 21 were counted in two of four runs of
        // the suite, with or without a pause before the count).
        let n = g.dropped_by_rules().unwrap() - dropped;
        assert!((20..=24).contains(&n), "{n} IPv6 packets dropped, 20 sent");
    }
}
