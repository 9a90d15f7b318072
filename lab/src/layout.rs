//! The lab's names and addresses: which nodes exist, what they are called and where they live.
//!
//! # Address plan
//! All nodes sit on one bridge in the lab subnet [`SUBNET`] (`10.77.0.0/24`), which exists only
//! inside the lab's namespaces:
//!
//! | node            | address                  | daemon port |
//! |-----------------|--------------------------|-------------|
//! | `o1` … `o9`     | `10.77.0.11` … `.19`     | [`ORCHESTRATOR_PORT`] |
//! | `m1` … `m79`    | `10.77.0.21` … `.99`     | [`INSTANCE_PORT`] |
//! | `client`        | `10.77.0.100`            | — |
//!
//! Services run in sandboxes behind routed veth links inside a machine's namespace, with
//! addresses from [`SERVICE_SUBNET`] (`10.213.0.0/16`); the machine running the primary answers
//! ARP for the service address on the bridge (proxy ARP), so the client and the orchestrators
//! have an on-link route for the whole service subnet.
//!
//! Pure data: nothing here touches the system.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{LabError, Result};

/// The lab's own subnet (on the bridge in the switch namespace), `10.77.0.0/24`.
pub const SUBNET: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 0);
/// Prefix length of [`SUBNET`].
pub const SUBNET_PREFIX: u8 = 24;
/// The service subnet used by sandboxes inside the machines, `10.213.0.0/16`.
pub const SERVICE_SUBNET: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 0);
/// Prefix length of [`SERVICE_SUBNET`].
pub const SERVICE_PREFIX: u8 = 16;
/// Where an orchestrator listens.
pub const ORCHESTRATOR_PORT: u16 = 7700;
/// Where an instance (the per-machine daemon) listens.
pub const INSTANCE_PORT: u16 = 7701;
/// Prefix of every namespace the lab creates (`tlab-m1`, `tlab-sw`, …); `down` removes every
/// namespace with this prefix.
pub const NS_PREFIX: &str = "tlab-";
/// The switch namespace, holding the bridge [`BRIDGE`] and one port per node.
pub const SWITCH_NS: &str = "tlab-sw";
/// The bridge in [`SWITCH_NS`].
pub const BRIDGE: &str = "br0";
/// The node-side interface of every node.
pub const NODE_IF: &str = "eth0";
/// Where the lab keeps its state file, logs and the daemons' run directories.
pub const RUN_DIR: &str = "/run/tardi-lab";
/// Where the machines' daemons keep their persistent state (`<STATE_DIR>/m1`).
pub const STATE_DIR: &str = "/var/lib/tardi-lab";
/// The lock serialising every user of the lab (outside [`RUN_DIR`], which `down` removes).
pub const LOCK_FILE: &str = "/run/tardi-lab.lock";
/// Name of the lab's cgroup under the cgroup2 mount (one child per node).
pub const CGROUP_NAME: &str = "tardi-lab";

/// Most orchestrator nodes (their addresses `.11`…`.19`).
pub const MAX_ORCHESTRATORS: usize = 9;
/// Most machine nodes (their addresses `.21`…`.99`).
pub const MAX_MACHINES: usize = 79;

const ORCHESTRATOR_BASE: u8 = 11;
const MACHINE_BASE: u8 = 21;
const CLIENT_HOST: u8 = 100;

/// What a node is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs an orchestrator (`o1`, `o2`, …).
    Orchestrator,
    /// Runs an instance, which runs sandboxes (`m1`, `m2`, …).
    Machine,
    /// Runs nothing by itself; where users and tests run their clients.
    Client,
}

impl Role {
    /// The port its daemon listens on, if it runs one.
    pub fn port(self) -> Option<u16> {
        match self {
            Role::Orchestrator => Some(ORCHESTRATOR_PORT),
            Role::Machine => Some(INSTANCE_PORT),
            Role::Client => None,
        }
    }

    /// `"orchestrator"`, `"machine"` or `"client"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Orchestrator => "orchestrator",
            Role::Machine => "machine",
            Role::Client => "client",
        }
    }
}

/// One node of the lab: a network namespace with one link to the switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// `o1`, `m3`, `client`.
    pub name: String,
    pub role: Role,
    /// Its address on the lab subnet (on its `eth0`).
    pub address: Ipv4Addr,
}

impl Node {
    /// Its network namespace, `tlab-<name>`.
    pub fn namespace(&self) -> String {
        format!("{NS_PREFIX}{}", self.name)
    }

    /// Its port on the switch (in [`SWITCH_NS`]), `v-<name>`.
    pub fn switch_port(&self) -> String {
        format!("v-{}", self.name)
    }

    /// Where its daemon listens, if it runs one.
    pub fn api(&self) -> Option<SocketAddrV4> {
        self.role.port().map(|p| SocketAddrV4::new(self.address, p))
    }

    /// The persistent state directory of a machine's daemon.
    pub fn state_dir(&self) -> PathBuf {
        PathBuf::from(STATE_DIR).join(&self.name)
    }

    /// The run directory of a machine's daemon.
    pub fn run_dir(&self) -> PathBuf {
        PathBuf::from(RUN_DIR).join(&self.name).join("run")
    }

    /// Its TLS identity (`ca.pem`, `node.pem`, `node.key`): the daemon's `--tls-dir`, and
    /// `TARDI_TLS_DIR` of the commands run in it.
    pub fn tls_dir(&self) -> PathBuf {
        tls_dir().join(&self.name)
    }

    /// Its daemon's log (stdout and stderr).
    pub fn log_path(&self) -> PathBuf {
        log_dir().join(format!("{}.log", self.name))
    }
}

/// The lab's CA and every node's TLS identity (made by `Lab::up`, removed with the lab).
pub fn tls_dir() -> PathBuf {
    PathBuf::from(STATE_DIR).join("tls")
}

/// Where the daemons' logs go.
pub fn log_dir() -> PathBuf {
    PathBuf::from(RUN_DIR).join("logs")
}

/// The state file.
pub fn state_path() -> PathBuf {
    PathBuf::from(RUN_DIR).join("lab.json")
}

/// Every node of a lab, orchestrators first, then machines, then the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    nodes: Vec<Node>,
}

impl Layout {
    /// A lab of `machines` machines and `orchestrators` orchestrator nodes.
    pub fn new(machines: usize, orchestrators: usize) -> Result<Layout> {
        if !(1..=MAX_MACHINES).contains(&machines) {
            return Err(LabError::Layout(format!(
                "{machines} machines: between 1 and {MAX_MACHINES} are supported"
            )));
        }
        if !(1..=MAX_ORCHESTRATORS).contains(&orchestrators) {
            return Err(LabError::Layout(format!(
                "{orchestrators} orchestrators: between 1 and {MAX_ORCHESTRATORS} are supported"
            )));
        }
        let host = |h: u8| {
            let o = SUBNET.octets();
            Ipv4Addr::new(o[0], o[1], o[2], h)
        };
        // The bounds above keep every host number below CLIENT_HOST.
        let mut nodes = Vec::with_capacity(machines + orchestrators + 1);
        for (i, h) in (1..=orchestrators).zip(ORCHESTRATOR_BASE..) {
            nodes.push(Node {
                name: format!("o{i}"),
                role: Role::Orchestrator,
                address: host(h),
            });
        }
        for (i, h) in (1..=machines).zip(MACHINE_BASE..) {
            nodes.push(Node {
                name: format!("m{i}"),
                role: Role::Machine,
                address: host(h),
            });
        }
        nodes.push(Node {
            name: "client".into(),
            role: Role::Client,
            address: host(CLIENT_HOST),
        });
        Ok(Layout { nodes })
    }

    /// All nodes, orchestrators first, then machines, then the client.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| LabError::UnknownNode {
                name: name.to_string(),
                known: self.nodes.iter().map(|n| n.name.clone()).collect(),
            })
    }

    /// The orchestrator nodes.
    pub fn orchestrators(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.role == Role::Orchestrator)
    }

    /// How many machines.
    pub fn machine_count(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.role == Role::Machine)
            .count()
    }

    /// How many orchestrator nodes.
    pub fn orchestrator_count(&self) -> usize {
        self.orchestrators().count()
    }

    /// The orchestrators' URLs, comma-separated: the value of `TARDI_ORCHESTRATOR` in the lab
    /// (`http://10.77.0.11:7700` with one orchestrator).
    pub fn orchestrator_url(&self) -> String {
        self.orchestrator_urls().join(",")
    }

    /// Each orchestrator's URL.
    pub fn orchestrator_urls(&self) -> Vec<String> {
        self.orchestrators()
            .filter_map(Node::api)
            .map(|a| format!("http://{a}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        let l = Layout::new(3, 2).unwrap();
        let names: Vec<_> = l.nodes().iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["o1", "o2", "m1", "m2", "m3", "client"]);
        let m2 = l.node("m2").unwrap();
        assert_eq!(m2.address, Ipv4Addr::new(10, 77, 0, 22));
        assert_eq!(m2.namespace(), "tlab-m2");
        assert_eq!(m2.switch_port(), "v-m2");
        assert_eq!(m2.api().unwrap().to_string(), "10.77.0.22:7701");
        assert_eq!(
            l.node("o2").unwrap().api().unwrap().to_string(),
            "10.77.0.12:7700"
        );
        let c = l.node("client").unwrap();
        assert_eq!(c.address, Ipv4Addr::new(10, 77, 0, 100));
        assert_eq!(c.api(), None);
        assert_eq!(
            l.orchestrator_url(),
            "http://10.77.0.11:7700,http://10.77.0.12:7700"
        );
        assert_eq!(l.machine_count(), 3);
        assert_eq!(l.orchestrator_count(), 2);
    }

    #[test]
    fn largest_layout_stays_below_the_client() {
        let l = Layout::new(MAX_MACHINES, MAX_ORCHESTRATORS).unwrap();
        let last_m = l.node(&format!("m{MAX_MACHINES}")).unwrap();
        assert_eq!(last_m.address, Ipv4Addr::new(10, 77, 0, 99));
        let last_o = l.node(&format!("o{MAX_ORCHESTRATORS}")).unwrap();
        assert_eq!(last_o.address, Ipv4Addr::new(10, 77, 0, 19));
        // Interface names must fit IFNAMSIZ (15 characters).
        assert!(l.nodes().iter().all(|n| n.switch_port().len() <= 15));
    }

    #[test]
    fn bad_layouts_are_errors() {
        for (m, o) in [
            (0, 1),
            (1, 0),
            (MAX_MACHINES + 1, 1),
            (1, MAX_ORCHESTRATORS + 1),
        ] {
            assert!(matches!(Layout::new(m, o), Err(LabError::Layout(_))));
        }
        let l = Layout::new(1, 1).unwrap();
        let e = l.node("m9").unwrap_err().to_string();
        assert!(e.contains("m9") && e.contains("o1, m1, client"), "{e}");
    }
}
