//! Content hashes of the files a process maps, cached by identity: a capture hashes a service's
//! mapped files once, not at every checkpoint, and a tree's restore checks a library its
//! processes all map once.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

/// Hash cache: (dev, ino, size, mtime) → BLAKE3, so a file is hashed once per supervisor.
static HASHES: Mutex<Option<HashMap<FileKey, [u8; 32]>>> = Mutex::new(None);

/// (dev, ino, size, mtime seconds, mtime nanoseconds): a file's identity on this machine.
type FileKey = (u64, u64, u64, i64, i64);

/// The content hash of file `f` (whose metadata is `m`), hashed once per device, inode, size
/// and modification time for the life of this process (a capture hashes a service's mapped
/// files once, not every checkpoint; a tree's restore checks a library its processes all map
/// once).
pub(crate) fn cached_hash(f: std::fs::File, m: &std::fs::Metadata) -> io::Result<[u8; 32]> {
    let key = (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec());
    let lock = || HASHES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = lock().get_or_insert_default().get(&key) {
        return Ok(*h);
    }
    let hash = hash_file(f)?;
    lock().get_or_insert_default().insert(key, hash);
    Ok(hash)
}

fn hash_file(mut f: std::fs::File) -> io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    io::copy(&mut f, &mut h)?;
    Ok(*h.finalize().as_bytes())
}
