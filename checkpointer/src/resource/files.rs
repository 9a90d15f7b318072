//! The service's private writable directories (the manifest's `tardi.private_dirs`), as part of
//! a checkpoint: a full checkpoint carries their whole tree, an incremental one what changed
//! since the previous epoch (created, written, truncated, renamed — as an upsert of the new
//! path and a removal of the old — and deleted entries).
//!
//! Changes are found by comparing an `lstat` walk with the previous one, inside the pause, so
//! the files are consistent with the memory captured at the same moment; changed files are read
//! whole. Paths are the sandbox's (the walk runs in the chroot'ed capture thread).
//!
//! A change is seen through (kind, size, mtime, ctime, inode, mode). Two writes of the same size
//! within one timestamp tick would look alike with coarse timestamps; Linux ≥ 6.13 gives a
//! fine-grained timestamp to the first change after a `stat` ("multigrain" timestamps on ext4,
//! xfs, btrfs, tmpfs), and the walk `stat`s every entry every epoch, so it does not happen on
//! those file systems. Known gaps (unfinished): writes through a shared mapping do not update
//! mtime until written back, so such a change can show up an epoch late; changed files are sent
//! whole, not delta-encoded; sockets, FIFOs and device nodes in the directory are skipped.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
pub use tardi_image::files::{Entry, FileChanges, Tree};

/// What an entry looked like at the last walk: enough to tell that it changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    kind: u32,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
}

/// The tracker's memory of the directories between epochs.
#[derive(Debug, Default)]
pub struct DirTracker {
    dirs: Vec<String>,
    seen: BTreeMap<String, Stamp>,
    /// `seen` before the last walk, for [`DirTracker::undo`].
    prev: Option<BTreeMap<String, Stamp>>,
    /// Contents hash of files mapped shared and writable, read every walk (writes through a
    /// mapping change no timestamp on tmpfs), with `hashes` before the last walk.
    hashes: BTreeMap<String, [u8; 32]>,
    prev_hashes: Option<BTreeMap<String, [u8; 32]>>,
}

fn walk(dir: &Path, out: &mut BTreeMap<String, Stamp>) -> io::Result<()> {
    let dev = match std::fs::metadata(dir) {
        Ok(m) => m.dev(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    walk_dev(dir, dev, out)
}

/// [`walk`] within the file system `dev` (another mount below the directory is not its).
fn walk_dev(dir: &Path, dev: u64, out: &mut BTreeMap<String, Stamp>) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let path = e.path();
        let m = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // gone meanwhile
            Err(e) => return Err(e),
        };
        if m.dev() != dev {
            continue; // a mount point
        }
        let stamp = Stamp {
            kind: m.mode() & libc::S_IFMT,
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
            ino: m.ino(),
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
        };
        out.insert(path.to_string_lossy().into_owned(), stamp);
        if m.is_dir() {
            walk_dev(&path, dev, out)?;
        }
    }
    Ok(())
}

fn read_entry(path: &str, s: &Stamp) -> io::Result<Option<Entry>> {
    Ok(Some(match s.kind {
        libc::S_IFDIR => Entry::Dir { mode: s.mode },
        libc::S_IFREG => Entry::File {
            mode: s.mode,
            content: std::fs::read(path)?,
        },
        libc::S_IFLNK => Entry::Symlink {
            target: std::fs::read_link(path)?.to_string_lossy().into_owned(),
        },
        _ => return Ok(None), // sockets, FIFOs, devices: not state a checkpoint can carry
    }))
}

impl DirTracker {
    pub fn new(dirs: Vec<String>) -> DirTracker {
        DirTracker {
            dirs,
            seen: BTreeMap::new(),
            prev: None,
            hashes: BTreeMap::new(),
            prev_hashes: None,
        }
    }

    /// Walks the directories and returns what changed since the last call (everything, the
    /// first time).
    pub fn changes(&mut self) -> io::Result<FileChanges> {
        self.changes_mapped(&[])
    }

    /// [`DirTracker::changes`], where the files that `maps` (the process's mappings) maps
    /// shared and writable are read and compared by content: a write through a shared mapping
    /// of a tmpfs file changes no timestamp.
    pub fn changes_mapped(&mut self, maps: &[crate::procfs::MapEntry]) -> io::Result<FileChanges> {
        let mapped: std::collections::BTreeSet<&str> = maps
            .iter()
            .filter(|m| m.shared && m.prot() & libc::PROT_WRITE as u32 != 0)
            .map(|m| m.name.as_str())
            .collect();
        let mut hashes = BTreeMap::new();
        let ch = self.walk_changes(&mut |path, stamp| {
            if stamp.kind != libc::S_IFREG || !mapped.contains(path) {
                return Ok(None);
            }
            let content = std::fs::read(path)?;
            let h = *blake3::hash(&content).as_bytes();
            hashes.insert(path.to_string(), h);
            Ok(Some((h, content)))
        })?;
        self.prev_hashes = Some(std::mem::replace(&mut self.hashes, hashes));
        Ok(ch)
    }

    #[allow(clippy::type_complexity)]
    fn walk_changes(
        &mut self,
        read_mapped: &mut dyn FnMut(&str, &Stamp) -> io::Result<Option<([u8; 32], Vec<u8>)>>,
    ) -> io::Result<FileChanges> {
        let mut now = BTreeMap::new();
        for d in &self.dirs {
            walk(Path::new(d), &mut now)?;
        }
        let mut ch = FileChanges {
            dirs: self.dirs.clone(),
            ..FileChanges::default()
        };
        for (path, stamp) in &now {
            let entry = match read_mapped(path, stamp)? {
                Some((h, content))
                    if self.seen.get(path) != Some(stamp) || self.hashes.get(path) != Some(&h) =>
                {
                    Some(Entry::File {
                        mode: stamp.mode,
                        content,
                    })
                }
                Some(_) => None,
                None if self.seen.get(path) != Some(stamp) => read_entry(path, stamp)?,
                None => None,
            };
            if let Some(entry) = entry {
                if (stamp.uid, stamp.gid) != (0, 0) {
                    ch.owners.push((path.clone(), stamp.uid, stamp.gid));
                }
                ch.upsert.push((path.clone(), entry));
            }
        }
        for path in self.seen.keys() {
            if !now.contains_key(path) {
                ch.remove.push(path.clone());
            }
        }
        self.prev = Some(std::mem::replace(&mut self.seen, now));
        Ok(ch)
    }

    /// Forgets the last walk (its changes were not delivered): the next
    /// [`DirTracker::changes`] reports what changed since the walk before it. Once only.
    pub fn undo(&mut self) {
        if let Some(p) = self.prev.take() {
            self.seen = p;
        }
        if let Some(h) = self.prev_hashes.take() {
            self.hashes = h;
        }
    }
}

/// Makes the tree's directories on this machine hold exactly `tree` (a full checkpoint's
/// changes; run inside the sandbox, where the paths are the sandbox's): entries not in the tree
/// are removed, the others written.
pub fn materialize(tree: &FileChanges) -> io::Result<()> {
    let want: BTreeMap<&str, &Entry> = tree.upsert.iter().map(|(p, e)| (p.as_str(), e)).collect();
    let owners: BTreeMap<&str, (u32, u32)> = tree
        .owners
        .iter()
        .map(|(p, u, g)| (p.as_str(), (*u, *g)))
        .collect();
    let mut have = BTreeMap::new();
    for d in &tree.dirs {
        std::fs::create_dir_all(d)?;
        walk(Path::new(d), &mut have)?;
    }
    // Deepest first, so directories are empty when removed.
    for path in have.keys().rev() {
        if !want.contains_key(path.as_str()) {
            let p = Path::new(path);
            remove(p, std::fs::symlink_metadata(p)?.is_dir()).or_else(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
        }
    }
    // Shallowest first, so parents exist.
    for (path, entry) in &want {
        let p = PathBuf::from(path);
        if let Ok(m) = std::fs::symlink_metadata(&p) {
            let same_kind = matches!(
                (entry, m.is_dir(), m.file_type().is_symlink()),
                (Entry::Dir { .. }, true, _)
                    | (Entry::Symlink { .. }, _, true)
                    | (Entry::File { .. }, false, false)
            );
            if !same_kind {
                remove(&p, m.is_dir())?;
            }
        }
        match entry {
            Entry::Dir { mode } => {
                std::fs::create_dir_all(&p)?;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))?;
            }
            Entry::File { mode, content } => {
                std::fs::write(&p, content)?;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))?;
            }
            Entry::Symlink { target } => {
                let _ = std::fs::remove_file(&p);
                std::os::unix::fs::symlink(target, &p)?;
            }
        }
        let (uid, gid) = owners.get(*path).copied().unwrap_or((0, 0));
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Removes a directory with everything below it, or any other entry.
fn remove(p: &Path, is_dir: bool) -> io::Result<()> {
    if is_dir {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_creates_writes_renames_deletes_and_rebuilds_the_tree() {
        let root = std::env::temp_dir().join(format!("tardi-files-{}", std::process::id()));
        let (live, copy) = (root.join("live"), root.join("copy"));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(live.join("sub")).unwrap();
        std::fs::write(live.join("a"), b"one").unwrap();
        std::fs::write(live.join("sub/b"), b"two").unwrap();
        let dir = live.to_string_lossy().into_owned();
        let mut t = DirTracker::new(vec![dir.clone()]);
        let mut tree = Tree::default();
        tree.apply(&t.changes().unwrap());
        let none = t.changes().unwrap();
        assert!(
            none.upsert.is_empty() && none.remove.is_empty(),
            "nothing changed: {none:?}"
        );
        std::fs::write(live.join("a"), b"one, longer").unwrap();
        std::fs::rename(live.join("sub/b"), live.join("c")).unwrap();
        std::fs::create_dir(live.join("new")).unwrap();
        std::fs::write(live.join("new/d"), b"d").unwrap();
        std::os::unix::fs::symlink("a", live.join("ln")).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(live.join("c"))
            .unwrap();
        f.set_len(1).unwrap();
        tree.apply(&t.changes().unwrap());
        std::fs::remove_dir_all(live.join("sub")).unwrap();
        // A walk whose changes are lost: undone, the next walk reports them again.
        let lost = t.changes().unwrap();
        assert!(!lost.remove.is_empty(), "the removal is seen: {lost:?}");
        t.undo();
        let again = t.changes().unwrap();
        assert_eq!(again, lost, "after undo, the same changes");
        tree.apply(&again);
        // Rebuild the tree elsewhere (paths mapped) and compare both walks.
        let mapped = FileChanges {
            dirs: vec![copy.to_string_lossy().into_owned()],
            upsert: tree
                .to_changes()
                .upsert
                .into_iter()
                .map(|(p, e)| (p.replacen(&dir, copy.to_str().unwrap(), 1), e))
                .collect(),
            remove: vec![],
            owners: vec![],
        };
        std::fs::create_dir_all(copy.join("stale")).unwrap();
        materialize(&mapped).unwrap();
        let read = |d: &Path| {
            let mut m = BTreeMap::new();
            walk(d, &mut m).unwrap();
            m.keys()
                .map(|k| {
                    let rel = k.strip_prefix(d.to_str().unwrap()).unwrap().to_string();
                    let c = std::fs::symlink_metadata(k).unwrap();
                    let body = if c.is_file() {
                        std::fs::read(k).unwrap()
                    } else {
                        vec![]
                    };
                    (rel, c.is_dir(), body)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(read(&live), read(&copy));
        assert!(!copy.join("stale").exists() && !copy.join("sub").exists());
        assert_eq!(std::fs::read(copy.join("c")).unwrap(), b"t");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
