//! Building the lab's network: the switch namespace with its bridge, and per node a namespace
//! linked to the bridge by a veth pair (`eth0` in the node, `v-<node>` on the switch).
//!
//! Everything happens inside the lab's own namespaces; the host's network namespace is never
//! changed (the veth pairs are created in the switch namespace with their peer directly in the
//! node's).

use std::io;

use crate::cmd::{ip, ip_in};
use crate::error::{LabError, Result};
use crate::layout::{
    BRIDGE, NODE_IF, Node, Role, SERVICE_PREFIX, SERVICE_SUBNET, SUBNET_PREFIX, SWITCH_NS,
};
use crate::netns;

/// Creates the switch namespace and its bridge.
pub(crate) fn create_switch() -> Result<()> {
    netns::create(SWITCH_NS)?;
    ip_in(SWITCH_NS, ["link", "set", "lo", "up"])?;
    // No STP: a port forwards as soon as it is up (and again right after a heal).
    ip_in(
        SWITCH_NS,
        [
            "link",
            "add",
            BRIDGE,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ],
    )?;
    ip_in(SWITCH_NS, ["link", "set", BRIDGE, "up"])?;
    Ok(())
}

/// Creates `node`'s namespace, links it to the switch, addresses it and applies its role's
/// settings.
pub(crate) fn create_node(node: &Node) -> Result<()> {
    let ns = node.namespace();
    let port = node.switch_port();
    netns::create(&ns)?;
    ip_in(&ns, ["link", "set", "lo", "up"])?;
    ip_in(
        SWITCH_NS,
        [
            "link", "add", &port, "type", "veth", "peer", "name", NODE_IF, "netns", &ns,
        ],
    )?;
    ip_in(SWITCH_NS, ["link", "set", &port, "master", BRIDGE])?;
    ip_in(SWITCH_NS, ["link", "set", &port, "up"])?;
    let cidr = format!("{}/{SUBNET_PREFIX}", node.address);
    ip_in(&ns, ["addr", "add", &cidr, "dev", NODE_IF])?;
    ip_in(&ns, ["link", "set", NODE_IF, "up"])?;
    let service = format!("{SERVICE_SUBNET}/{SERVICE_PREFIX}");
    match node.role {
        Role::Machine => set_sysctls(&ns, MACHINE_SYSCTLS)?,
        // On-link: they ARP for a service address directly; the primary's machine answers
        // (proxy ARP), and a gratuitous ARP from a new primary moves the address.
        Role::Client | Role::Orchestrator => {
            ip_in(&ns, ["route", "add", &service, "dev", NODE_IF])?;
        }
    }
    Ok(())
}

/// A machine routes to the sandboxes behind it (veth links from the service subnet) and answers
/// ARP on the bridge for the service addresses it routes, at once.
pub(crate) const MACHINE_SYSCTLS: &[(&str, &str)] = &[
    ("net/ipv4/ip_forward", "1"),
    ("net/ipv4/conf/all/rp_filter", "0"),
    ("net/ipv4/conf/default/rp_filter", "0"),
    ("net/ipv4/conf/eth0/rp_filter", "0"),
    ("net/ipv4/conf/eth0/proxy_arp", "1"),
    ("net/ipv4/neigh/eth0/proxy_delay", "0"),
];

/// Writes `/proc/sys/<key>` = value for each pair, from a thread inside namespace `ns` (the
/// `net` sysctls are those of the writer's namespace).
fn set_sysctls(ns: &str, pairs: &[(&str, &str)]) -> Result<()> {
    netns::in_namespace(ns, || {
        for (key, value) in pairs {
            let path = format!("/proc/sys/{key}");
            std::fs::write(&path, value).map_err(|e| {
                LabError::io(format!("namespace {ns}: setting {path} to {value}"), e)
            })?;
        }
        Ok(())
    })?
}

/// Reads `/proc/sys/<key>` inside namespace `ns`.
pub fn sysctl(ns: &str, key: &str) -> Result<String> {
    netns::in_namespace(ns, || {
        let path = format!("/proc/sys/{key}");
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|e| LabError::io(format!("namespace {ns}: reading {path}"), e))
    })?
}

/// Sets the node's own `eth0` up or down (down: the node is dark, as after a power cut; it
/// answers no ARP any more).
pub(crate) fn set_node_link(node: &Node, up: bool) -> Result<()> {
    ip_in(
        &node.namespace(),
        ["link", "set", NODE_IF, if up { "up" } else { "down" }],
    )
    .map(drop)
}

/// Deletes every link of the node except `lo` and `eth0`: the links its processes made (the
/// sandboxes' veth pairs), which a power cut takes with it. Killing a sandbox's processes is not
/// enough: its network namespace can outlive them, pinned by orphaned TCP sockets that still
/// retransmit (every client connection of a killed service), and keep its link and address in
/// the node for minutes, where a real machine, rebooted, would have none. Returns the links
/// deleted.
pub(crate) fn clear_node_links(node: &Node) -> Result<Vec<String>> {
    let ns = node.namespace();
    let out = ip_in(&ns, ["-br", "link", "show"])?;
    let mut deleted = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "td1h@if3  UP  6a:36:..." -> "td1h"
        let Some(name) = line
            .split_whitespace()
            .next()
            .and_then(|w| w.split('@').next())
        else {
            continue;
        };
        if name.is_empty() || name == "lo" || name == NODE_IF {
            continue;
        }
        match ip_in(&ns, ["link", "del", name]) {
            Ok(_) => deleted.push(name.to_string()),
            // Deleting one end of a veth pair removes the other: already gone.
            Err(e) if crate::cmd::is_gone(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// Sets the node's port on the switch up or down (down cuts every link of the node while it
/// keeps running).
pub(crate) fn set_switch_port(node: &Node, up: bool) -> Result<()> {
    ip_in(
        SWITCH_NS,
        [
            "link",
            "set",
            &node.switch_port(),
            if up { "up" } else { "down" },
        ],
    )
    .map(drop)
}

/// Whether `ip` works at all, for a clear early error.
pub(crate) fn check_ip() -> Result<()> {
    ip(["-V"]).map(drop).map_err(|e| match e {
        LabError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => LabError::io(
            "the lab needs iproute2 (`ip`), which is not installed",
            source,
        ),
        e => e,
    })
}
