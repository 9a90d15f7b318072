//! The state file `/run/tardi-lab/lab.json`: what the lab is made of, so that commands run later
//! (`kill`, `exec`, `down`, …) know it. `down` does not need it: it works from what it finds.

use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{IoContext, LabError, Result};
use crate::layout::{self, Layout, Node, Role};

/// Who created the lab, which decides whether a later `up` may clear it away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Owner {
    /// A [`crate::Lab`] value that removes it when dropped; it holds the lab's lock for its whole
    /// life, so whoever gets the lock and finds such a lab knows its owner is gone (a crashed
    /// test) and may remove it.
    Held,
    /// Kept after its creator returned (`tardi lab up`): only `down` removes it.
    Detached,
}

/// One node as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub role: Role,
    pub namespace: String,
    pub address: Ipv4Addr,
    /// `address:port` of its daemon, if it runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    /// Pid of its daemon (last started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// False after `kill` (power cut), until `start`.
    pub alive: bool,
    /// True after `partition`, until `heal`.
    #[serde(default)]
    pub partitioned: bool,
}

/// The whole lab as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    pub owner: Owner,
    /// Pid of the process that created it.
    pub creator_pid: u32,
    pub machines: usize,
    pub orchestrators: usize,
    /// The lab's cgroup, if it has one (else kills walk `/proc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    /// Which daemons the nodes run (to start one again after a kill).
    pub daemons: crate::daemon::Daemons,
    /// Whether the nodes use mutual TLS (identities under `layout::tls_dir()`).
    #[serde(default)]
    pub tls: bool,
    pub nodes: Vec<NodeState>,
}

impl LabState {
    /// The initial state of `layout`: nothing started yet.
    pub fn new(layout: &Layout, owner: Owner, daemons: crate::daemon::Daemons) -> LabState {
        LabState {
            owner,
            creator_pid: std::process::id(),
            machines: layout.machine_count(),
            orchestrators: layout.orchestrator_count(),
            cgroup: None,
            daemons,
            tls: false,
            nodes: layout
                .nodes()
                .iter()
                .map(|n| NodeState {
                    name: n.name.clone(),
                    role: n.role,
                    namespace: n.namespace(),
                    address: n.address,
                    api: n.api().map(|a| a.to_string()),
                    pid: None,
                    alive: true,
                    partitioned: false,
                })
                .collect(),
        }
    }

    /// The layout it was made from.
    pub fn layout(&self) -> Result<Layout> {
        Layout::new(self.machines, self.orchestrators)
    }

    /// The recorded node `name`.
    pub fn node_mut(&mut self, name: &str) -> Result<&mut NodeState> {
        let known: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .ok_or_else(|| LabError::UnknownNode {
                name: name.to_string(),
                known,
            })
    }

    /// The cgroup of `node`, if the lab has cgroups.
    pub fn cgroup_of(&self, node: &Node) -> Option<PathBuf> {
        self.cgroup.as_ref().map(|c| c.join(&node.name))
    }

    /// Reads the state file; `Ok(None)` when there is none.
    pub fn load() -> Result<Option<LabState>> {
        load_from(&layout::state_path())
    }

    /// Writes the state file atomically (temporary file, then rename).
    pub fn save(&self) -> Result<()> {
        save_to(self, &layout::state_path())
    }
}

fn load_from(path: &Path) -> Result<Option<LabState>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LabError::io(format!("reading {}", path.display()), e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| LabError::State {
            path: path.to_path_buf(),
            source,
        })
}

fn save_to(state: &LabState, path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(state).map_err(|e| {
        LabError::io(
            "serialising the lab state",
            io::Error::new(io::ErrorKind::InvalidData, e),
        )
    })?;
    std::fs::write(&tmp, text + "\n").ctx(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).ctx(|| format!("renaming {} into place", tmp.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::Daemons;

    #[test]
    fn round_trip_and_errors() {
        let dir = std::env::temp_dir().join(format!("tardi-lab-state-{}", std::process::id()));
        let path = dir.join("lab.json");
        assert!(load_from(&path).unwrap().is_none());
        let layout = Layout::new(2, 1).unwrap();
        let mut s = LabState::new(
            &layout,
            Owner::Held,
            Daemons::Template(vec!["sleep".into(), "9".into()]),
        );
        s.node_mut("m2").unwrap().pid = Some(42);
        s.cgroup = Some("/sys/fs/cgroup/tardi-lab".into());
        save_to(&s, &path).unwrap();
        let back = load_from(&path).unwrap().unwrap();
        assert_eq!(back, s);
        assert_eq!(back.layout().unwrap(), layout);
        assert!(matches!(
            s.node_mut("m3"),
            Err(LabError::UnknownNode { .. })
        ));
        std::fs::write(&path, "{not json").unwrap();
        let e = load_from(&path).unwrap_err();
        assert!(matches!(e, LabError::State { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
