//! The private directories in checkpoints (issue 3, item 7): `filer` keeps a counter in memory
//! and the same state in its private directory, changing it every way a service does (create,
//! write through an open descriptor, rename, truncate, mkdir, delete, symlink) and checking both
//! agree before each step. A chain of incremental checkpoints is applied to an image; while the
//! process is held stopped the image's tree must equal the directory on disk exactly. Then the
//! directory is damaged, the original stopped, and the image restored: the restore must put the
//! directory back as the checkpoint saw it, and `filer` must carry on without a mismatch.

mod common;

use common::programs;
use common::tardi::{Running, Scratch, write_chain};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tardi_checkpointer::epoch::{EpochConfig, Epochs};
use tardi_checkpointer::files::{Entry, Tree};
use tardi_checkpointer::image::Checkpoint;
use tardi_checkpointer::store::Image;

/// The directory on disk, as (path relative to it, entry).
fn read_disk(root: &Path) -> BTreeMap<String, Entry> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Entry>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let mode = std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777;
            let entry = if m.file_type().is_symlink() {
                Entry::Symlink {
                    target: std::fs::read_link(&p)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                }
            } else if m.is_dir() {
                walk(root, &p, out);
                Entry::Dir { mode }
            } else {
                Entry::File {
                    mode,
                    content: std::fs::read(&p).unwrap(),
                }
            };
            out.insert(rel, entry);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The image's tree, relative to the sandbox directory `dir`.
fn read_tree(tree: &Tree, dir: &str) -> BTreeMap<String, Entry> {
    tree.entries
        .iter()
        .map(|(p, e)| {
            let rel = p.strip_prefix(&format!("{dir}/")).unwrap_or(p);
            (rel.to_string(), e.clone())
        })
        .collect()
}

fn counter(tree: &Tree) -> u64 {
    match tree.entries.get("/data/state") {
        Some(Entry::File { content, .. }) => String::from_utf8_lossy(content).parse().unwrap(),
        other => panic!("the image has no /data/state: {other:?}"),
    }
}

fn disk_counter(host: &Path) -> u64 {
    std::fs::read_to_string(host.join("state"))
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn roundtrip(ck: &Checkpoint) -> Checkpoint {
    Checkpoint::from_bytes(ck.to_bytes()).expect("a checkpoint parses back")
}

#[test]
fn private_directory_follows_memory_through_epochs_and_restore() {
    let bin = programs::build("filer");
    let scratch = Scratch::new("files");
    let host = scratch.0.join("data");
    std::fs::create_dir_all(&host).unwrap();
    let name = format!("files-{}", std::process::id() % 10000);
    let manifest = scratch.0.join("filer.manifest");
    std::fs::write(
        &manifest,
        format!(
            "libos.entrypoint = {:?}\nloader.argv = [\"filer\", \"/data\"]\n\
             fs.mounts = [\n  {{ path = \"/usr\", uri = \"file:/usr\" }},\n  \
             {{ path = \"/lib\", uri = \"file:/lib\" }},\n  \
             {{ path = \"/lib64\", uri = \"file:/lib64\" }},\n  \
             {{ path = {dir:?}, uri = \"file:{dir}\" }},\n  \
             {{ type = \"chroot\", path = \"/data\", uri = \"file:{}\" }},\n]\n\n\
             [tardi]\nname = {name:?}\nprivate_dirs = [\"/data\"]\n",
            bin.to_str().unwrap(),
            host.display(),
            dir = bin.parent().unwrap().display()
        ),
    )
    .unwrap();
    let run = Running::run(&manifest).expect("tardi run");
    let t0 = Instant::now();
    while disk_counter(&host) < 50 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "filer does not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // An ordinary snapshot carries the tree too (and the sandbox description).
    let first = scratch.0.join("first.tardi");
    run.snapshot(&first).unwrap();
    let snap = Checkpoint::from_bytes(std::fs::read(&first).unwrap()).unwrap();
    // The service's /data, and the sandbox's /dev/shm (POSIX shared memory).
    assert_eq!(
        snap.image.private_files.dirs,
        vec!["/data".to_string(), "/dev/shm".to_string()]
    );
    let mut snap_tree = Tree::default();
    snap_tree.apply(&snap.image.private_files);
    assert!(
        counter(&snap_tree) >= 50,
        "the snapshot's tree lacks the state"
    );
    let sandbox = snap.image.sandbox;

    let cfg = EpochConfig {
        interval: Duration::from_millis(5),
        private_dirs: vec!["/data".into()],
        ..Default::default()
    };
    let (mut ep, full, _) = Epochs::start(run.pid, cfg).expect("start epochs");
    let mut image = Image::from_full(&roundtrip(&full)).unwrap();
    let mut changed = 0;
    for i in 1..=120u64 {
        let held = i % 20 == 0;
        let (ck, _) = if held { ep.next_held() } else { ep.next() }
            .unwrap_or_else(|e| panic!("epoch {i}: {e}"));
        let ck = roundtrip(&ck);
        changed += ck.image.private_files.upsert.len() + ck.image.private_files.remove.len();
        image.apply(&ck).unwrap();
        if held {
            // The process is stopped in the state the image describes: the directory on disk
            // must be exactly the image's tree.
            let disk = read_disk(&host);
            let tree = read_tree(image.tree(), "/data");
            let diff: Vec<_> = disk
                .keys()
                .chain(tree.keys())
                .filter(|k| disk.get(*k) != tree.get(*k))
                .collect();
            assert!(
                diff.is_empty(),
                "epoch {i}: image and disk differ at {diff:?}"
            );
            ep.release();
        }
    }
    ep.stop();
    assert!(
        changed > 120,
        "the directory hardly changed ({changed} entries): the test proves little"
    );
    let saved = counter(image.tree());

    // Damage the directory, stop the original, restore the image.
    run.stop();
    std::fs::write(host.join("state"), "0").unwrap();
    std::fs::write(host.join("junk"), "not in the checkpoint").unwrap();
    let _ = std::fs::remove_file(host.join("latest"));
    let file = scratch.0.join("chain.tardi");
    write_chain(&image, sandbox, &file);
    let restored = Running::restore(&file).expect("restore the chain");
    let t0 = Instant::now();
    while disk_counter(&host) < saved + 50 {
        if let Ok(why) = std::fs::read_to_string(host.join("FAIL")) {
            panic!("filer after restore: {why}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "restored filer makes no progress (state {}, saved {saved})",
            disk_counter(&host)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !host.join("junk").exists(),
        "the restore left a file the checkpoint did not have"
    );
    assert!(!host.join("FAIL").exists());
    restored.stop();
}
