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
use std::ops::Bound;

/// One entry of a private directory tree, as a checkpoint carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry {
    Dir {
        mode: u32,
    },
    File {
        mode: u32,
        #[serde(with = "crate::bytes")]
        content: Vec<u8>,
    },
    Symlink {
        target: String,
    },
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
    /// Owner (uid, gid) of the upserted entries not owned by root (0, 0).
    pub owners: Vec<(String, u32, u32)>,
}

/// The private directories' tree as a receiver keeps it, changes applied in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    pub dirs: Vec<String>,
    pub entries: BTreeMap<String, Entry>,
    /// Owners of the entries not owned by root.
    pub owners: BTreeMap<String, (u32, u32)>,
}

impl Tree {
    /// Applies `ch`: upserts in order, then removals. An upsert of a non-directory drops what
    /// was below the path; a removal drops the path and everything below it. Infallible: check
    /// `ch` with [`FileChanges::validate`] first.
    pub fn apply(&mut self, ch: &FileChanges) {
        if !ch.dirs.is_empty() {
            self.dirs = ch.dirs.clone();
        }
        for (p, e) in &ch.upsert {
            if !matches!(e, Entry::Dir { .. }) {
                // A directory replaced by a file loses what was below it.
                self.remove_below(p);
            }
            self.entries.insert(p.clone(), e.clone());
            self.owners.remove(p);
        }
        for (p, uid, gid) in &ch.owners {
            self.owners.insert(p.clone(), (*uid, *gid));
        }
        for p in &ch.remove {
            self.entries.remove(p);
            self.owners.remove(p);
            self.remove_below(p);
        }
    }

    /// Removes every entry strictly below `path`: the keys that start with `path/`, which are
    /// contiguous in the map's order (so this costs what it removes, not the tree's size).
    fn remove_below(&mut self, path: &str) {
        let prefix = format!("{path}/");
        let below: Vec<String> = self
            .entries
            .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(&prefix))
            .cloned()
            .collect();
        for k in below {
            self.entries.remove(&k);
            self.owners.remove(&k);
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
            owners: self
                .owners
                .iter()
                .map(|(k, &(u, g))| (k.clone(), u, g))
                .collect(),
        }
    }
}

impl FileChanges {
    /// Whether the paths are what a walk of the private directories produces: every directory
    /// and entry path absolute and canonical (`/a/b`: no `.`, `..` or empty component, no
    /// trailing `/`, no NUL byte), every entry strictly below one of the directories, symlink
    /// targets without NUL bytes. Anything else could make a restore write outside the private
    /// directories.
    ///
    /// The directories are `self.dirs`, or when this names none (an incremental checkpoint may
    /// not) `known`: the receiver's; `None` when the caller does not know them yet, which skips
    /// the containment check.
    pub fn validate(&self, known: Option<&[String]>) -> Result<(), String> {
        let dirs = if self.dirs.is_empty() {
            known
        } else {
            Some(&self.dirs[..])
        };
        for d in dirs.unwrap_or_default() {
            canonical(d).map_err(|why| format!("private directory {d:?} {why}"))?;
        }
        // Both canonical: `p` is strictly below `d`.
        let below = |d: &str, p: &str| match p.strip_prefix(d) {
            Some(rest) if d == "/" => !rest.is_empty(),
            Some(rest) => rest.len() > 1 && rest.starts_with('/'),
            None => false,
        };
        let below_a_dir = |p: &str| dirs.is_none_or(|dirs| dirs.iter().any(|d| below(d, p)));
        let paths = self.upsert.iter().map(|(p, _)| p).chain(self.remove.iter());
        for p in paths {
            canonical(p).map_err(|why| format!("private file {p:?} {why}"))?;
            if !below_a_dir(p) {
                return Err(format!(
                    "private file {p:?} is not inside a private directory"
                ));
            }
        }
        for (p, _, _) in &self.owners {
            if !self.upsert.iter().any(|(u, _)| u == p) {
                return Err(format!(
                    "owner given for {p:?}, which the changes do not upsert"
                ));
            }
        }
        for (p, e) in &self.upsert {
            if let Entry::Symlink { target } = e
                && target.contains('\0')
            {
                return Err(format!("symlink {p:?} has a target with a NUL byte"));
            }
        }
        Ok(())
    }
}

/// Whether `p` is an absolute path in canonical form: `/`, or `/` followed by non-empty
/// components other than `.` and `..`, separated by single `/`, without NUL bytes.
fn canonical(p: &str) -> Result<(), &'static str> {
    if p.contains('\0') {
        return Err("contains a NUL byte");
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err("is not absolute");
    };
    if rest.is_empty() {
        return Ok(());
    }
    if rest
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err("is not canonical (empty, '.' or '..' component)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(c: &str) -> Entry {
        Entry::File {
            mode: 0o644,
            content: c.as_bytes().to_vec(),
        }
    }

    #[test]
    fn tree_replaces_and_removes_whole_subtrees_only() {
        let mut t = Tree::default();
        t.apply(&FileChanges {
            dirs: vec!["/d".into()],
            upsert: vec![
                ("/d/a".into(), Entry::Dir { mode: 0o755 }),
                ("/d/a/x".into(), file("x")),
                ("/d/a/y".into(), Entry::Dir { mode: 0o755 }),
                ("/d/a/y/z".into(), file("z")),
                (
                    "/d/a-b".into(),
                    file("sibling, sorts between /d/a and /d/a/"),
                ),
                ("/d/ab".into(), file("sibling")),
            ],
            remove: vec![],
            owners: vec![],
        });
        // A file in place of a directory drops what was below it, not its siblings.
        t.apply(&FileChanges {
            dirs: vec![],
            upsert: vec![("/d/a".into(), file("now a file"))],
            remove: vec![],
            owners: vec![],
        });
        let keys: Vec<&str> = t.entries.keys().map(String::as_str).collect();
        assert_eq!(keys, ["/d/a", "/d/a-b", "/d/ab"]);
        assert_eq!(t.dirs, ["/d"], "no dirs in the changes: kept");
        t.apply(&FileChanges {
            dirs: vec!["/d".into()],
            upsert: vec![
                ("/d/a".into(), Entry::Dir { mode: 0o700 }),
                ("/d/a/n".into(), file("n")),
            ],
            remove: vec!["/d/a".into(), "/d/missing".into()],
            owners: vec![],
        });
        let keys: Vec<&str> = t.entries.keys().map(String::as_str).collect();
        assert_eq!(keys, ["/d/a-b", "/d/ab"], "a removal takes the subtree");
        assert_eq!(t.to_changes().upsert.len(), 2);
    }

    #[test]
    fn validate_wants_canonical_paths_inside_the_dirs() {
        let ch = |dirs: &[&str], path: &str| FileChanges {
            dirs: dirs.iter().map(|d| d.to_string()).collect(),
            upsert: vec![(path.into(), file(""))],
            remove: vec![],
            owners: vec![],
        };
        assert!(ch(&["/d"], "/d/x").validate(None).is_ok());
        assert!(ch(&["/d/e"], "/d/e/x/y").validate(Some(&[])).is_ok());
        assert!(ch(&["/"], "/x").validate(None).is_ok());
        // Without dirs of its own: the receiver's, or unchecked when unknown.
        assert!(ch(&[], "/d/x").validate(Some(&["/d".into()])).is_ok());
        assert!(ch(&[], "/x").validate(None).is_ok());
        for (dirs, path, want) in [
            (&["/d"][..], "/d", "not inside"),
            (&["/d"], "/dx/y", "not inside"),
            (&["/d"], "/e/x", "not inside"),
            (&["/d"], "/d/../e", "not canonical"),
            (&["/d"], "/d/./x", "not canonical"),
            (&["/d"], "/d//x", "not canonical"),
            (&["/d"], "/d/x/", "not canonical"),
            (&["/d"], "d/x", "not absolute"),
            (&["/d"], "/d/x\0", "NUL"),
            (&["/"], "/", "not inside"),
            (&["/d/"], "/d/x", "not canonical"),
            (&[], "/d/x", "not inside"),
        ] {
            let known: &[String] = &[];
            let err = ch(dirs, path).validate(Some(known)).unwrap_err();
            assert!(err.contains(want), "{dirs:?} {path:?}: {err}");
        }
        let mut bad = ch(&["/d"], "/d/l");
        bad.upsert[0].1 = Entry::Symlink {
            target: "a\0".into(),
        };
        assert!(bad.validate(None).unwrap_err().contains("NUL"));
        let mut bad = ch(&["/d"], "/d/x");
        bad.remove.push("/etc".into());
        assert!(bad.validate(None).unwrap_err().contains("not inside"));
    }
}
