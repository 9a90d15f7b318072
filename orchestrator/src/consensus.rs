//! The orchestrator cluster's consensus: openraft's type configuration (the log's entries are
//! [`Command`]s of the view manager, each answered by what [`crate::views::Views::apply`] said),
//! node identities and the raft timing.
//!
//! Nodes are named (`o1`, `o2`, …) by their operators; openraft wants numeric ids, so a node's
//! id is a hash of its name ([`node_id`]) and its name and address travel with it in the
//! membership ([`Member`]).

use crate::views::Command;
use std::fmt;
use std::io::Cursor;

/// What applying one entry answered: `Err` with the view manager's reason when the command was
/// refused (nothing changed).
pub type Reply = Result<(), String>;

/// An orchestrator node as the membership records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    pub name: String,
    /// Its gRPC URL (`http://host:port`): raft RPCs, instances and the CLI.
    pub addr: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.name, self.addr)
    }
}

openraft::declare_raft_types!(
    /// openraft's types for the orchestrator cluster.
    pub TypeConfig:
        D = Command,
        R = Reply,
        NodeId = u64,
        Node = Member,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type NodeId = u64;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
pub type Vote = openraft::Vote<NodeId>;

/// A node's raft id: FNV-1a of its name (stable across restarts and versions; names are what
/// operators use, ids never leave the cluster). 0 is avoided (openraft's default id).
pub fn node_id(name: &str) -> NodeId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// Raft timing: heartbeats every 50 ms, an election after 200–400 ms without one. A new leader
/// exists within about half a second of the old one's death; instances reconnect in that time
/// (the failure detector's grace period after an election covers it).
pub fn config() -> openraft::Config {
    openraft::Config {
        cluster_name: "tardi-orchestrators".into(),
        heartbeat_interval: 50,
        election_timeout_min: 200,
        election_timeout_max: 400,
        install_snapshot_timeout: 2000,
        // The log holds few, small commands: a snapshot every 1000 keeps restarts quick.
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1000),
        max_in_snapshot_log_to_keep: 500,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_stable_and_distinct() {
        assert_eq!(node_id("o1"), node_id("o1"));
        let ids: std::collections::BTreeSet<u64> =
            (1..=9).map(|i| node_id(&format!("o{i}"))).collect();
        assert_eq!(ids.len(), 9);
        assert!(config().validate().is_ok());
    }
}
