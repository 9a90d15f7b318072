//! The service's private writable directories (the manifest's `tardi.private_dirs`) as a
//! checkpoint carries them: a full checkpoint their whole tree, an incremental one what changed
//! since the previous epoch (created, written, truncated, renamed — as an upsert of the new path
//! and a removal of the old — and deleted entries). [`Tree`] is the receiver's copy, changes
//! applied in order.
//!
//! Finding the changes (an `lstat` walk inside the pause) and writing a tree to disk belong to
//! the checkpointer (`tardi_checkpointer::files`); this module is data only.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One entry of a private directory tree, as a checkpoint carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry {
    Dir { mode: u32 },
    File { mode: u32, content: Vec<u8> },
    Symlink { target: String },
}

/// What a checkpoint says about the private directories: entries to create or replace, then
/// paths to remove (with everything below them). Paths are absolute, inside the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChanges {
    /// The private directories themselves (sandbox paths): a restore makes them hold exactly
    /// the tree, removing what it does not name.
    pub dirs: Vec<String>,
    pub upsert: Vec<(String, Entry)>,
    pub remove: Vec<String>,
}

/// The private directories' tree as a receiver keeps it, changes applied in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    pub dirs: Vec<String>,
    pub entries: BTreeMap<String, Entry>,
}

impl Tree {
    pub fn apply(&mut self, ch: &FileChanges) {
        if !ch.dirs.is_empty() {
            self.dirs = ch.dirs.clone();
        }
        for (p, e) in &ch.upsert {
            if !matches!(e, Entry::Dir { .. }) {
                // A directory replaced by a file loses what was below it.
                let prefix = format!("{p}/");
                self.entries.retain(|k, _| !k.starts_with(&prefix));
            }
            self.entries.insert(p.clone(), e.clone());
        }
        for p in &ch.remove {
            let prefix = format!("{p}/");
            self.entries
                .retain(|k, _| k != p && !k.starts_with(&prefix));
        }
    }

    /// As the changes of a full checkpoint.
    pub fn to_changes(&self) -> FileChanges {
        FileChanges {
            dirs: self.dirs.clone(),
            upsert: self
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            remove: vec![],
        }
    }
}
