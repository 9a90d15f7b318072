//! End-to-end tests of the lab with real namespaces, cgroups and processes. They need root,
//! iproute2, `python3` (the stand-in daemons) and `unshare`. There is one lab per host, so the
//! tests run one at a time (the lab's lock, plus [`serial`] here because some tests release the
//! lock on purpose); every test leaves nothing behind, also when it fails (dropping a `Lab`
//! removes it).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tardi_lab::{Daemons, Lab, LabError, LabOptions, Owner, layout};

/// Serialises the tests of this binary.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A stand-in daemon: a TCP listener on the node's daemon address.
fn listeners() -> Daemons {
    Daemons::template("python3 -m http.server --bind {addr} {port}")
}

fn opts(machines: usize, daemons: Daemons) -> LabOptions {
    let mut o = LabOptions::new(machines).daemons(daemons);
    o.lock_wait = Duration::from_secs(120);
    o
}

/// Whether a TCP connection from node `from` to `to` succeeds within a second.
fn connects(lab: &Lab, from: &str, to: SocketAddrV4) -> bool {
    lab.in_node(from, || {
        TcpStream::connect_timeout(&SocketAddr::V4(to), Duration::from_secs(1)).is_ok()
    })
    .unwrap()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out)
}

/// Nothing of a lab is left: no namespace, no cgroup, no state.
fn assert_clean() {
    let ns = tardi_lab::lab_namespaces().unwrap();
    assert!(ns.is_empty(), "namespaces left: {ns:?}");
    if let Some(cg) = tardi_lab::lab_cgroup() {
        assert!(!cg.exists(), "cgroup left: {}", cg.display());
    }
    assert!(!layout::state_path().exists(), "state file left");
    assert!(!Path::new(layout::RUN_DIR).exists(), "run directory left");
    assert!(
        !Path::new(layout::STATE_DIR).exists(),
        "state directory left"
    );
}

/// Waits for `child` at most 10 s (killing it and failing after that, rather than hanging).
fn wait_briefly(child: &mut std::process::Child) -> std::process::ExitStatus {
    for _ in 0..1000 {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("process {} still running after 10 s", child.id());
}

fn pid_alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

#[test]
fn three_machines_reach_kill_partition_heal_exec_down() {
    let _g = serial();
    let mut lab = Lab::up(opts(3, listeners())).unwrap();

    // Every daemon answers from the client, over the bridge.
    for node in ["o1", "m1", "m2", "m3"] {
        let api = lab.api(node).unwrap();
        assert!(
            connects(&lab, "client", api),
            "client cannot reach {node} at {api}"
        );
    }
    assert_eq!(lab.address("m2").unwrap(), Ipv4Addr::new(10, 77, 0, 22));
    assert_eq!(
        lab.address("client").unwrap(),
        Ipv4Addr::new(10, 77, 0, 100)
    );
    assert!(matches!(
        lab.address("m4"),
        Err(LabError::UnknownNode { .. })
    ));

    // exec runs in the node, with TARDI_ORCHESTRATOR set.
    let out = lab
        .exec(
            "m2",
            &[
                "sh",
                "-c",
                "ip -4 addr show eth0; echo ORCH=$TARDI_ORCHESTRATOR",
            ],
        )
        .unwrap();
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.contains("inet 10.77.0.22/24"), "{text}");
    assert!(text.contains("ORCH=http://10.77.0.11:7700"), "{text}");
    let out = lab.exec("client", &["sh", "-c", "exit 7"]).unwrap();
    assert_eq!(out.status.code(), Some(7));

    // The machines' settings, read through `ip netns exec` (not the way they were written).
    let out = lab
        .exec(
            "m1",
            &[
                "cat",
                "/proc/sys/net/ipv4/ip_forward",
                "/proc/sys/net/ipv4/conf/eth0/proxy_arp",
                "/proc/sys/net/ipv4/neigh/eth0/proxy_delay",
                "/proc/sys/net/ipv4/conf/all/rp_filter",
            ],
        )
        .unwrap();
    assert_eq!(
        stdout(&out).split_whitespace().collect::<Vec<_>>(),
        ["1", "1", "0", "0"]
    );
    let routes = stdout(&lab.exec("client", &["ip", "route"]).unwrap());
    assert!(routes.contains("10.213.0.0/16 dev eth0"), "{routes}");

    // A "sandbox" in m1: a process in new network and PID namespaces, child of a node process.
    let mut sandbox = lab
        .spawn_in(
            "m1",
            &["unshare", "--net", "--pid", "--fork", "sleep", "1000"],
        )
        .unwrap();
    let m1_daemon = lab.daemon_pid("m1").unwrap().unwrap();
    let tail = lab.logs_tail(5);
    assert!(
        tail.contains("m1.log") && tail.contains("starting m1: python3"),
        "{tail}"
    );
    std::thread::sleep(Duration::from_millis(200));
    let m1_pids = lab.cgroup_pids("m1").unwrap();
    assert!(m1_pids.contains(&m1_daemon), "{m1_pids:?}");
    assert!(
        m1_pids.len() >= 3,
        "daemon, unshare and sleep expected: {m1_pids:?}"
    );

    // A link a process of m1 made (as a sandbox's veth pair), which a power cut must take with
    // it: a sandbox's namespace can outlive its processes (orphaned TCP sockets pin it).
    let out = lab
        .exec(
            "m1",
            &[
                "ip", "link", "add", "td9h", "type", "veth", "peer", "name", "td9s",
            ],
        )
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // Power cut on m1: all its processes are gone at once, m1 is dark, m2 still answers.
    lab.kill("m1").unwrap();
    let links = stdout(&lab.exec("m1", &["ip", "-br", "link"]).unwrap());
    assert!(
        !links.contains("td9h") && !links.contains("td9s") && links.contains("eth0"),
        "the power cut left links behind: {links}"
    );
    assert!(lab.cgroup_pids("m1").unwrap().is_empty());
    for pid in &m1_pids {
        assert!(
            !pid_alive(*pid) || *pid == sandbox.id(),
            "pid {pid} of m1 survived"
        );
    }
    let st = wait_briefly(&mut sandbox);
    assert!(
        st.code().is_none(),
        "the sandbox was killed by a signal: {st:?}"
    );
    assert!(
        !connects(&lab, "client", lab.api("m1").unwrap()),
        "m1 still answers"
    );
    assert!(connects(&lab, "client", lab.api("m2").unwrap()));
    let link = stdout(&lab.exec("m1", &["ip", "link", "show", "eth0"]).unwrap());
    assert!(link.contains("state DOWN"), "{link}");
    let m1 = lab.state().nodes.iter().find(|n| n.name == "m1").unwrap();
    assert!(!m1.alive);
    assert!(
        lab.status()
            .iter()
            .any(|s| s.node.name == "m1" && s.state == "dead")
    );

    // Partition m2: unreachable, but it keeps running; heal: reachable again.
    lab.partition("m2").unwrap();
    assert!(
        !connects(&lab, "client", lab.api("m2").unwrap()),
        "m2 answers while partitioned"
    );
    assert!(!connects(&lab, "o1", lab.api("m2").unwrap()));
    assert!(
        connects(&lab, "m2", lab.api("m2").unwrap()),
        "m2 itself should still run"
    );
    assert!(connects(&lab, "client", lab.api("m3").unwrap()));
    lab.heal("m2").unwrap();
    assert!(
        connects(&lab, "client", lab.api("m2").unwrap()),
        "m2 unreachable after heal"
    );

    // Power m1 back on.
    assert!(matches!(lab.start("m2"), Err(LabError::NodeState { .. })));
    lab.start("m1").unwrap();
    assert!(connects(&lab, "client", lab.api("m1").unwrap()));

    // Down removes everything.
    let daemon_pids: Vec<u32> = lab.state().nodes.iter().filter_map(|n| n.pid).collect();
    assert_eq!(daemon_pids.len(), 4);
    let report = lab.down().unwrap();
    assert_eq!(report.namespaces.len(), 6, "{report:?}"); // o1 m1 m2 m3 client sw
    for pid in daemon_pids {
        assert!(!pid_alive(pid), "daemon {pid} survived down");
    }
    assert_clean();
}

#[test]
fn down_cleans_up_after_a_crash_without_state() {
    let _g = serial();
    let lab = Lab::up(opts(2, listeners())).unwrap();
    let pids: Vec<u32> = lab.state().nodes.iter().filter_map(|n| n.pid).collect();
    assert_eq!(pids.len(), 3);
    // As if the lab's creator had crashed and the state were lost.
    lab.detach().unwrap();
    std::fs::remove_file(layout::state_path()).unwrap();
    assert!(matches!(Lab::open(None), Err(LabError::NoLab)));
    // Leftovers without a state file are a lab in the way.
    assert!(matches!(
        Lab::up(opts(1, Daemons::None)),
        Err(LabError::AlreadyUp)
    ));

    let report = Lab::down_all(Duration::from_secs(10), false).unwrap();
    assert_eq!(report.namespaces.len(), 5, "{report:?}"); // o1 m1 m2 client sw
    for pid in pids {
        assert!(!pid_alive(pid), "daemon {pid} survived down");
    }
    assert_clean();
    // Again: nothing to do.
    assert!(
        Lab::down_all(Duration::from_secs(10), false)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_detached_lab_blocks_up_but_an_orphaned_one_is_replaced() {
    let _g = serial();
    let lab = Lab::up(opts(1, Daemons::None)).unwrap();
    lab.detach().unwrap();
    assert!(matches!(
        Lab::up(opts(1, Daemons::None)),
        Err(LabError::AlreadyUp)
    ));

    // Make it look like the lab of a test that died: held, but nobody holds the lock.
    let mut state = Lab::open(None).unwrap().state().clone();
    state.owner = Owner::Held;
    state.save().unwrap();
    let lab = Lab::up(opts(2, Daemons::None)).unwrap();
    assert_eq!(lab.layout().machine_count(), 2);
    drop(lab);
    assert_clean();
}

#[test]
fn the_lock_keeps_a_second_lab_out() {
    let _g = serial();
    let lab = Lab::up(opts(1, Daemons::None)).unwrap();
    let mut o = opts(1, Daemons::None);
    o.lock_wait = Duration::from_millis(300);
    assert!(matches!(Lab::up(o), Err(LabError::Busy { .. })));
    assert!(matches!(
        Lab::down_all(Duration::from_millis(300), false),
        Err(LabError::Busy { .. })
    ));
    drop(lab);
    assert_clean();
}

#[test]
fn failing_daemons_are_reported_with_their_log_and_cleaned_up() {
    let _g = serial();
    // Exits at once.
    let e = Lab::up(opts(1, Daemons::template("ls /nonexistent-{node}"))).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, LabError::DaemonExited { ref node, .. } if node == "o1"),
        "{msg}"
    );
    assert!(
        msg.contains("nonexistent-o1"),
        "the log tail is missing: {msg}"
    );
    assert_clean();

    // Never listens.
    let mut o = opts(1, Daemons::template("sleep 30"));
    o.ready_timeout = Duration::from_millis(500);
    let e = Lab::up(o).unwrap_err();
    assert!(
        matches!(e, LabError::NotReady { ref node, .. } if node == "o1"),
        "{e}"
    );
    assert!(e.to_string().contains("10.77.0.11:7700"), "{e}");
    assert_clean();
}

#[test]
fn several_orchestrators() {
    let _g = serial();
    let lab = Lab::up(opts(1, Daemons::None).orchestrators(3)).unwrap();
    assert_eq!(lab.address("o3").unwrap(), Ipv4Addr::new(10, 77, 0, 13));
    let urls = "http://10.77.0.11:7700,http://10.77.0.12:7700,http://10.77.0.13:7700";
    assert_eq!(lab.orchestrator_url(), urls);
    let out = lab
        .exec("m1", &["sh", "-c", "echo $TARDI_ORCHESTRATOR"])
        .unwrap();
    assert_eq!(stdout(&out).trim(), urls);
    let routes = stdout(&lab.exec("o2", &["ip", "route"]).unwrap());
    assert!(routes.contains("10.213.0.0/16 dev eth0"), "{routes}");
    // o3 reachable from the client: a listener opened in o3's namespace.
    let api = lab.api("o3").unwrap();
    let listener = lab
        .in_node("o3", || TcpListener::bind(api))
        .unwrap()
        .unwrap();
    assert!(connects(&lab, "client", api));
    drop(listener);
    drop(lab);
    assert_clean();
}

/// The service address scheme: a sandbox-like namespace `tlab-x` behind a routed veth in m1 holds
/// 10.213.0.6; the client reaches it through m1, which answers ARP for it (proxy ARP).
#[test]
fn proxy_arp_routes_a_service_address_through_its_machine() {
    let _g = serial();
    let lab = Lab::up(opts(2, Daemons::None)).unwrap();
    ip(&["netns", "add", "tlab-x"]);
    ip(&[
        "-n", "tlab-m1", "link", "add", "sx0", "type", "veth", "peer", "name", "eth0", "netns",
        "tlab-x",
    ]);
    ip(&[
        "-n",
        "tlab-m1",
        "addr",
        "add",
        "10.213.0.5/30",
        "dev",
        "sx0",
    ]);
    ip(&["-n", "tlab-m1", "link", "set", "sx0", "up"]);
    ip(&["-n", "tlab-x", "link", "set", "lo", "up"]);
    ip(&[
        "-n",
        "tlab-x",
        "addr",
        "add",
        "10.213.0.6/30",
        "dev",
        "eth0",
    ]);
    ip(&["-n", "tlab-x", "link", "set", "eth0", "up"]);
    ip(&[
        "-n",
        "tlab-x",
        "route",
        "add",
        "default",
        "via",
        "10.213.0.5",
    ]);

    let service = SocketAddrV4::new(Ipv4Addr::new(10, 213, 0, 6), 7000);
    let listener = tardi_lab::in_namespace("tlab-x", || TcpListener::bind(service))
        .unwrap()
        .unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
        peer
    });
    let echoed = lab
        .in_node("client", || -> std::io::Result<[u8; 4]> {
            let mut s =
                TcpStream::connect_timeout(&SocketAddr::V4(service), Duration::from_secs(3))?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            s.write_all(b"ping")?;
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf)?;
            Ok(buf)
        })
        .unwrap()
        .expect("the client cannot reach 10.213.0.6 through m1");
    assert_eq!(&echoed, b"ping");
    // Routed, not translated: the service sees the client's own address.
    let peer = server.join().unwrap();
    assert_eq!(
        peer.ip(),
        std::net::IpAddr::V4(Ipv4Addr::new(10, 77, 0, 100))
    );

    // The client resolved the service address to m1's MAC.
    let m1_link = ip(&["-n", "tlab-m1", "-o", "link", "show", "eth0"]);
    let m1_mac = m1_link
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap()
        .to_string();
    let neigh = ip(&["-n", "tlab-client", "neigh", "show", "10.213.0.6"]);
    assert!(
        neigh.contains(&m1_mac),
        "client neighbour {neigh:?}, m1 is {m1_mac}"
    );

    // Down removes the extra namespace as well (it is named tlab-*).
    lab.down().unwrap();
    assert_clean();
}

/// Without cgroups, a kill finds the node's processes in its namespace and their descendants,
/// sandboxes (in namespaces of their own) included.
#[test]
fn kill_without_cgroups_walks_the_process_tree() {
    let _g = serial();
    let mut o = opts(2, listeners());
    o.cgroups = false;
    let mut lab = Lab::up(o).unwrap();
    assert!(lab.state().cgroup.is_none());
    if let Some(cg) = tardi_lab::lab_cgroup() {
        assert!(!cg.exists());
    }
    // A shell in m1 with a "sandbox" child in new network and PID namespaces.
    let mut shell = lab
        .spawn_in(
            "m1",
            &[
                "sh",
                "-c",
                "unshare --net --pid --fork sleep 1000 & echo $! > /run/tardi-lab/sbx; wait",
            ],
        )
        .unwrap();
    let sbx_file = Path::new(layout::RUN_DIR).join("sbx");
    let mut sbx = None;
    for _ in 0..100 {
        if let Some(pid) = std::fs::read_to_string(&sbx_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            sbx = Some(pid);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let sbx = sbx.expect("the sandbox did not start");
    assert!(pid_alive(sbx));
    let daemon = lab
        .state()
        .nodes
        .iter()
        .find(|n| n.name == "m1")
        .unwrap()
        .pid
        .unwrap();

    lab.kill("m1").unwrap();
    wait_briefly(&mut shell);
    std::thread::sleep(Duration::from_millis(100));
    assert!(!pid_alive(sbx), "the sandbox {sbx} survived the kill");
    assert!(!pid_alive(daemon), "the daemon {daemon} survived the kill");
    assert!(!connects(&lab, "client", lab.api("m1").unwrap()));
    assert!(connects(&lab, "client", lab.api("m2").unwrap()));
    let m2 = lab
        .state()
        .nodes
        .iter()
        .find(|n| n.name == "m2")
        .unwrap()
        .pid
        .unwrap();
    assert!(pid_alive(m2));
    drop(lab);
    assert!(!pid_alive(m2));
    assert_clean();
}
