use super::*;
use crate::delta::PageEncoding;
use crate::image::tests::{meta, thread};

fn anon(start: u64, end: u64) -> Vma {
    Vma {
        start,
        end,
        prot: 3,
        shared: false,
        flags: 0,
        backing: Backing::Anon,
        name: String::new(),
    }
}

#[test]
fn a_private_file_page_without_its_own_copy_is_never_kept() {
    let file = |start, end| Vma {
        start,
        end,
        prot: 3,
        shared: false,
        flags: 0,
        backing: Backing::File {
            index: 0,
            offset: 0,
        },
        name: "/mnt/data".into(),
    };
    let with_file = |mut m: ProcessImage| {
        m.files = vec![FileRef {
            path: "/mnt/data".into(),
            size: 0x3000,
            hash: [0; 32],
        }];
        m
    };
    // Epoch 0: both pages of the file mapping have their own copy (written).
    let mut m = with_file(meta(vec![file(0x1000, 0x3000)]));
    m.runs = vec![PageRun {
        addr: 0x1000,
        len: 0x2000,
        data_off: 0,
    }];
    m.cow = vec![(0x1000, 0x3000)];
    let mut img = Image::from_full(&full(m, vec![5u8; 0x2000])).unwrap();
    assert_eq!(img.pages(), 2);
    // Epoch 1 sends both pages again (as a failed pause's carry would), but 0x2000 was
    // zapped meanwhile: it is not in `cow`, so it shows the file and is not kept.
    let mut m = with_file(meta(vec![file(0x1000, 0x3000)]));
    m.base_epoch = Some(0);
    m.cow = vec![(0x1000, 0x2000)];
    m.pages = [0x1000u64, 0x2000]
        .iter()
        .enumerate()
        .map(|(i, &addr)| EncodedPage {
            addr,
            enc: PageEncoding::Raw,
            data_off: (i * PAGE_SIZE) as u64,
        })
        .collect();
    let inc = Checkpoint {
        epoch: 1,
        kind: Kind::Incremental { base: 0 },
        image: m,
        data: vec![6u8; 2 * PAGE_SIZE],
    };
    img.apply(&inc).unwrap();
    assert_eq!(img.page(0x1000).unwrap()[0], 6);
    assert!(
        img.page(0x2000).is_none(),
        "a page that shows the file was kept"
    );
}

#[test]
fn full_meta_and_write_pages_make_what_to_full_holds() {
    // Two mappings, contiguous addresses (runs must still split), distinct page contents.
    let mut m = meta(vec![anon(0x1000, 0x3000), anon(0x3000, 0x5000)]);
    m.runs = vec![
        PageRun {
            addr: 0x1000,
            len: 0x2000,
            data_off: 0,
        },
        PageRun {
            addr: 0x3000,
            len: 0x2000,
            data_off: 0x2000,
        },
    ];
    let data: Vec<u8> = (0..0x4000u32)
        .map(|i| (i / 4096 * 31 + i % 7) as u8)
        .collect();
    let img = Image::from_full(&full(m, data)).unwrap();
    let whole = img.to_full();
    // A writer that takes a few bytes at a time: partial vectored writes are resumed.
    struct Dribble(Vec<u8>);
    impl std::io::Write for Dribble {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let n = b.len().min(1000);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = Dribble(Vec::new());
    let meta = img.full_meta();
    img.write_pages(&mut out).unwrap();
    assert!(meta.data.is_empty());
    assert_eq!(out.0, whole.data);
    assert_eq!(meta.image.runs, whole.image.runs);
    assert_eq!(meta.image.runs.len(), 2);
    assert_eq!(meta.epoch, whole.epoch);
}

/// A full checkpoint at epoch 0.
fn full(image: ProcessImage, data: Vec<u8>) -> Checkpoint {
    Checkpoint::full(0, image, data)
}

#[test]
fn applies_pages_drops_unmapped_and_reset() {
    let mut m = meta(vec![anon(0x1000, 0x5000), anon(0x10000, 0x12000)]);
    m.runs = vec![
        PageRun {
            addr: 0x1000,
            len: 0x3000,
            data_off: 0,
        },
        PageRun {
            addr: 0x10000,
            len: 0x1000,
            data_off: 0x3000,
        },
    ];
    let mut img = Image::from_full(&full(m, vec![7u8; 0x4000])).unwrap();
    assert_eq!(img.pages(), 4);
    // Epoch 1: the second mapping is gone, 0x2000 is reset, 0x3000 rewritten raw.
    let mut m = meta(vec![anon(0x1000, 0x5000)]);
    m.base_epoch = Some(0);
    m.reset = vec![(0x2000, 0x3000)];
    m.pages = vec![EncodedPage {
        addr: 0x3000,
        enc: PageEncoding::Raw,
        data_off: 0,
    }];
    let inc = Checkpoint {
        epoch: 1,
        kind: Kind::Incremental { base: 0 },
        image: m,
        data: vec![9u8; 4096],
    };
    img.apply(&inc).unwrap();
    assert_eq!(img.pages(), 2, "0x1000 kept, 0x3000 rewritten");
    assert_eq!(img.page(0x1000).unwrap()[0], 7);
    assert_eq!(img.page(0x3000).unwrap()[0], 9);
    assert!(img.page(0x2000).is_none() && img.page(0x10000).is_none());
    // Out of order is refused.
    assert!(img.apply(&inc).is_err());
    // Runs never straddle mappings, even when pages are contiguous.
    let mut m = meta(vec![anon(0x1000, 0x2000), anon(0x2000, 0x3000)]);
    m.runs = vec![
        PageRun {
            addr: 0x1000,
            len: 0x1000,
            data_off: 0,
        },
        PageRun {
            addr: 0x2000,
            len: 0x1000,
            data_off: 0x1000,
        },
    ];
    let back = Image::from_full(&full(m, vec![1u8; 0x2000]))
        .unwrap()
        .to_full();
    assert_eq!(back.image.runs.len(), 2);
}

/// An incremental checkpoint of epoch `epoch` on `base` with metadata `m` and no pages.
fn incremental(mut m: ProcessImage, epoch: u64) -> Checkpoint {
    m.base_epoch = Some(epoch - 1);
    Checkpoint {
        epoch,
        kind: Kind::Incremental { base: epoch - 1 },
        image: m,
        data: vec![],
    }
}

/// What a sender leaves out, a receiver puts back: the image's metadata after each
/// checkpoint is the complete one the sender had, whichever parts changed.
#[test]
fn metadata_left_out_is_taken_from_the_base() {
    let complete = |rip2: u64, vmas: Vec<Vma>, fds: usize| {
        let mut m = meta(vmas);
        m.threads = vec![thread(1, 0x10), thread(2, rip2), thread(3, 0x30)];
        m.max_tid = 3;
        m.sigactions = vec![SigAction {
            signo: 10,
            handler: 0x1234,
            flags: 0,
            restorer: 0,
            mask: 0,
        }];
        m.fds = (0..fds as i32)
            .map(|fd| FdImage {
                fd,
                cloexec: false,
                flags: 0,
                kind: FdKind::Path {
                    path: "/dev/null".into(),
                    pos: 0,
                    is_dir: false,
                },
            })
            .collect();
        m
    };
    let first = complete(0x20, vec![anon(0x1000, 0x2000)], 2);
    let mut img = Image::from_full(&full(first.clone(), vec![])).unwrap();
    let mut carry = MetaCarry::after(&first);
    // Epoch 1: only thread 2 ran. Epoch 2: a mapping and a descriptor more, thread 2 ran
    // again. Epoch 3: thread 3 exited, nothing else changed.
    let mut third = complete(0x22, vec![anon(0x1000, 0x2000), anon(0x4000, 0x5000)], 3);
    third.threads.pop();
    let steps = [
        complete(0x21, vec![anon(0x1000, 0x2000)], 2),
        complete(0x22, vec![anon(0x1000, 0x2000), anon(0x4000, 0x5000)], 3),
        third,
    ];
    let mut sizes = Vec::new();
    for (i, want) in steps.into_iter().enumerate() {
        let epoch = i as u64 + 1;
        let mut sent = want.clone();
        carry.leave_out(&mut sent);
        sizes.push(postcard::to_stdvec(&sent).unwrap().len());
        let ck = incremental(sent, epoch);
        // As a peer would send it.
        let ck = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
        match epoch {
            1 => {
                let c = &ck.image.carried;
                assert!(c.layout && c.fds && c.sigactions, "epoch 1: {c:?}");
                assert_eq!(c.threads, vec![1, 3]);
            }
            2 => {
                let c = &ck.image.carried;
                assert!(!c.layout && !c.fds && c.sigactions, "epoch 2: {c:?}");
                assert_eq!(c.threads, vec![1, 3]);
            }
            _ => assert_eq!(ck.image.carried.threads, vec![1, 2]),
        }
        img.apply(&ck).unwrap();
        assert_eq!(
            format!("{:?}", img.meta),
            format!("{:?}", stored_meta(&want)),
            "epoch {epoch}: the image's metadata"
        );
    }
    let whole = postcard::to_stdvec(&first).unwrap().len();
    assert!(sizes[0] < whole * 2 / 3, "{sizes:?} against {whole}");
}

/// A checkpoint that carries over what its base does not have is refused and changes
/// nothing; so is one that both carries and lists a part, and a full one that carries.
#[test]
fn carried_metadata_that_does_not_hold_is_refused() {
    let mut first = meta(vec![anon(0x1000, 0x2000)]);
    first.threads = vec![thread(1, 0x10)];
    let mut img = Image::from_full(&full(first.clone(), vec![])).unwrap();
    let before = format!("{:?}", img.meta);
    // Thread 2 is carried over, but the base has no thread 2.
    let mut m = first.clone();
    m.threads.push(ThreadImage {
        regs: vec![],
        xstate: vec![],
        ..thread(2, 0)
    });
    m.max_tid = 2;
    m.carried.threads = vec![2];
    let e = img.apply(&incremental(m, 1)).unwrap_err();
    assert!(e.to_string().contains("no such thread"), "{e}");
    assert_eq!(format!("{:?}", img.meta), before);
    // Carried and listed at once.
    let mut m = first.clone();
    m.carried.layout = true;
    let e = Checkpoint::from_bytes(incremental(m, 1).to_bytes()).unwrap_err();
    assert!(
        e.to_string().contains("both carried over and listed"),
        "{e}"
    );
    // A carried-over thread with registers of its own.
    let mut m = first.clone();
    m.carried.threads = vec![1];
    let e = Checkpoint::from_bytes(incremental(m, 1).to_bytes()).unwrap_err();
    assert!(e.to_string().contains("registers of its own"), "{e}");
    // A full checkpoint carries nothing.
    let mut m = first.clone();
    m.carried.sigactions = true;
    let e = Checkpoint::from_bytes(full(m, vec![]).to_bytes()).unwrap_err();
    assert!(e.to_string().contains("full checkpoint leaves out"), "{e}");
    assert_eq!(img.epoch, 0);
}

/// Process `pid` (one thread) with one anonymous mapping at 0x1000-0x3000.
fn process(pid: i32) -> ProcessImage {
    let mut m = meta(vec![anon(0x1000, 0x3000)]);
    m.pid = pid;
    m.threads[0].tid = pid;
    m.max_tid = pid;
    m
}

/// A descriptor of the shared description #0.
fn shared_fd(fd: i32) -> FdImage {
    FdImage {
        fd,
        cloexec: false,
        flags: 2,
        kind: FdKind::Shared(0),
    }
}

/// A full checkpoint of a tree: process 1 (pages 0x1000 = 1, 0x2000 = 2), its children 2
/// and 3 (page 0x1000 = 20 + PID); all three hold one shared description at descriptor 3.
fn full_tree() -> Checkpoint {
    let mut root = process(1);
    root.runs = vec![PageRun {
        addr: 0x1000,
        len: 0x2000,
        data_off: 0,
    }];
    root.fds = vec![shared_fd(3)];
    root.pgid = 1;
    root.sid = 1;
    root.shared_files = vec![SharedFile {
        file: FdImage {
            fd: 3,
            cloexec: false,
            flags: 2,
            kind: FdKind::Path {
                path: "/log".into(),
                pos: 0,
                is_dir: false,
            },
        },
        holders: vec![(1, 3), (2, 3), (3, 3)],
    }];
    let mut data = [vec![1u8; 4096], vec![2u8; 4096]].concat();
    for pid in [2, 3] {
        let mut m = process(pid);
        m.runs = vec![PageRun {
            addr: 0x1000,
            len: 0x1000,
            data_off: 0,
        }];
        m.fds = vec![shared_fd(3)];
        (m.pgid, m.sid) = (pid, 1);
        root.tree.push(Member {
            ppid: 1,
            data_off: data.len() as u64,
            data_len: 4096,
            image: m,
        });
        data.extend(vec![20 + pid as u8; 4096]);
    }
    Checkpoint::full(0, root, data)
}

/// An incremental checkpoint of [`full_tree`]'s processes `pids` (the main one and these
/// members), each with its page 0x2000 written raw as `10 × PID` and its descriptors
/// carried over.
fn incremental_tree(epoch: u64, pids: &[i32]) -> Checkpoint {
    let page = EncodedPage {
        addr: 0x2000,
        enc: PageEncoding::Raw,
        data_off: 0,
    };
    let inc = |pid: i32| {
        let mut m = process(pid);
        m.base_epoch = Some(epoch - 1);
        m.pages = vec![page];
        m.carried.fds = true;
        m
    };
    let mut root = inc(1);
    root.shared_files = full_tree().image.shared_files;
    let mut data = vec![10u8; 4096];
    for &pid in pids {
        root.tree.push(Member {
            ppid: 1,
            data_off: data.len() as u64,
            data_len: 4096,
            image: inc(pid),
        });
        data.extend(vec![10 * pid as u8; 4096]);
    }
    Checkpoint {
        epoch,
        kind: Kind::Incremental { base: epoch - 1 },
        image: root,
        data,
    }
}

fn member(img: &Image, pid: i32) -> &Image {
    img.members()
        .find(|m| m.1.meta.pid == pid)
        .map(|m| m.1)
        .unwrap_or_else(|| panic!("no member {pid}"))
}

/// A tree's image: each process's pages from its own slice, incremental checkpoints
/// applied per process (descriptors carried over resolved from each one's base, groups
/// and sessions kept from the full), a member the checkpoint no longer lists dropped; the
/// image's full checkpoint is a valid tree with the same pages.
#[test]
fn a_tree_is_applied_process_by_process() {
    let mut img = Image::from_full(&full_tree()).unwrap();
    assert_eq!(img.pages(), 4);
    assert_eq!(member(&img, 3).page(0x1000).unwrap()[0], 23);
    img.apply(&roundtrip(incremental_tree(1, &[2, 3]))).unwrap();
    assert_eq!(img.page(0x1000).unwrap()[0], 1);
    assert_eq!(img.page(0x2000).unwrap()[0], 10);
    for pid in [2, 3] {
        let m = member(&img, pid);
        assert_eq!(m.page(0x1000).unwrap()[0], 20 + pid as u8, "process {pid}");
        assert_eq!(m.page(0x2000).unwrap()[0], 10 * pid as u8, "process {pid}");
        assert_eq!(
            m.meta.fds,
            vec![shared_fd(3)],
            "process {pid}'s descriptors"
        );
        assert_eq!((m.meta.pgid, m.meta.sid), (pid, 1));
    }
    let full = Checkpoint::from_bytes(img.to_full().to_bytes()).expect("a valid tree");
    assert_eq!(full.image.tree.len(), 2);
    assert_eq!(full.image.shared_files.len(), 1);
    let again = Image::from_full(&full).unwrap();
    assert_eq!(
        member(&again, 3).page(0x2000).unwrap()[0],
        30,
        "a member's pages in its slice"
    );
    // Process 3 is gone: the next checkpoint does not list it (nor holds its descriptor).
    let mut ck = incremental_tree(2, &[2]);
    ck.image.shared_files[0].holders.pop();
    img.apply(&roundtrip(ck)).unwrap();
    assert_eq!(img.members().count(), 1);
    assert_eq!(img.pages(), 4);
}

/// The tree changing between epochs (the epoch loop's step 2): a process that appeared
/// comes whole in an incremental checkpoint (a fresh member: base epoch none) and joins the
/// image; one that ran `execve` comes whole under its PID and replaces its image; one that
/// exited is no longer listed and is dropped, its zombie listed by the main image until it
/// is reaped. The image's full checkpoint is the tree of the last epoch.
#[test]
fn processes_that_appear_exec_and_exit_between_epochs() {
    let mut img = Image::from_full(&full_tree()).unwrap();
    // Process 4 (a child of 2) appears, whole, with its page 0x3000 = 44.
    let fresh = |pid: i32, fill: u8, ck: &mut Checkpoint| {
        let mut m = process(pid);
        m.vmas = meta(vec![anon(0x1000, 0x6000)]).vmas;
        m.runs = vec![PageRun {
            addr: 0x3000,
            len: 0x1000,
            data_off: 0,
        }];
        (m.pgid, m.sid) = (2, 1);
        ck.image.tree.push(Member {
            ppid: 2,
            data_off: ck.data.len() as u64,
            data_len: 4096,
            image: m,
        });
        ck.data.extend(vec![fill; 4096]);
    };
    let mut ck = incremental_tree(1, &[2, 3]);
    fresh(4, 44, &mut ck);
    img.apply(&roundtrip(ck)).unwrap();
    assert_eq!(img.members().count(), 3);
    assert_eq!(member(&img, 4).page(0x3000).unwrap()[0], 44);
    assert_eq!(member(&img, 4).page(0x1000), None, "only what it came with");
    // Process 4 runs `execve`: whole again, nothing of its old image kept; process 3 exits
    // and stays a zombie of process 1 (exit status 3).
    let mut ck = incremental_tree(2, &[2]);
    ck.image.shared_files[0].holders.pop();
    fresh(4, 45, &mut ck);
    ck.image.tree[1].image.runs[0].addr = 0x5000;
    ck.image.zombies = vec![Zombie {
        pid: 3,
        ppid: 1,
        pgid: 3,
        sid: 1,
        uid: 0,
        status: 3 << 8,
    }];
    img.apply(&roundtrip(ck)).unwrap();
    let pids: Vec<i32> = img.members().map(|m| m.1.meta.pid).collect();
    assert_eq!(pids, [2, 4]);
    assert_eq!(member(&img, 4).page(0x3000), None, "the old image is gone");
    assert_eq!(member(&img, 4).page(0x5000).unwrap()[0], 45);
    assert_eq!(img.meta.zombies.len(), 1);
    let full = Checkpoint::from_bytes(img.to_full().to_bytes()).expect("a valid tree");
    assert_eq!(
        full.image.zombies, img.meta.zombies,
        "the zombie is restored"
    );
    assert_eq!(full.image.tree.len(), 2);
    // Reaped: the next checkpoint lists no zombie; then the process 4 exits too.
    let mut ck = incremental_tree(3, &[2]);
    ck.image.shared_files[0].holders.pop();
    img.apply(&roundtrip(ck)).unwrap();
    assert!(img.meta.zombies.is_empty());
    let pids: Vec<i32> = img.members().map(|m| m.1.meta.pid).collect();
    assert_eq!(pids, [2]);
    // A fresh member that does not hold together is refused, the image unchanged.
    let before = img.to_full().to_bytes();
    let mut ck = incremental_tree(4, &[2]);
    ck.image.shared_files[0].holders.pop();
    fresh(6, 46, &mut ck);
    ck.image.tree[1].ppid = 9;
    assert!(img.apply(&ck).is_err(), "a parent not in the tree");
    assert_eq!(img.to_full().to_bytes(), before);
}

/// What cannot apply to a tree's image is refused, the image unchanged: a member that is
/// not in it, a shared description whose holder's descriptors (carried over) do not name
/// it, a member's page that does not decode.
#[test]
fn a_tree_checkpoint_that_does_not_apply_is_refused_whole() {
    let mut img = Image::from_full(&full_tree()).unwrap();
    let pages = |img: &Image| {
        let ck = img.to_full();
        (ck.data, format!("{:?}", ck.image))
    };
    let before = pages(&img);
    let e = img.apply(&incremental_tree(1, &[2, 3, 4])).unwrap_err();
    assert!(
        e.to_string().contains("process 4 is not in the image"),
        "{e}"
    );
    let mut ck = incremental_tree(1, &[2, 3]);
    ck.image.shared_files[0].holders.push((3, 4));
    let e = img.apply(&ck).unwrap_err();
    assert!(
        e.to_string().contains("which has no such descriptor"),
        "{e}"
    );
    let mut ck = incremental_tree(1, &[2, 3]);
    ck.image.tree[1].image.pages[0].enc = PageEncoding::Compressed { len: 100 };
    let e = img.apply(&ck).unwrap_err();
    assert!(matches!(e, ApplyError::Decode { addr: 0x2000, .. }), "{e}");
    assert_eq!(
        pages(&img),
        before,
        "a refused checkpoint changed the image"
    );
    assert_eq!(img.epoch, 0);
}

fn roundtrip(ck: Checkpoint) -> Checkpoint {
    Checkpoint::from_bytes(ck.to_bytes()).unwrap()
}

/// Process `pid` of `ck` (a [`full_tree`] or an [`incremental_tree`]) mapping anonymous
/// shared memory object 9 (one page) at 0x10000, which the main process lists with page 0
/// holding `fill` (in the main process's part of the checkpoint's data).
fn tree_shm(ck: &mut Checkpoint, pid: i32, fill: u8) {
    let member = &mut ck
        .image
        .tree
        .iter_mut()
        .find(|m| m.image.pid == pid)
        .unwrap()
        .image;
    member.vmas.push(Vma {
        start: 0x10000,
        end: 0x11000,
        prot: 3,
        shared: true,
        flags: 0,
        backing: Backing::Shm {
            id: ShmId::Anon(9),
            offset: 0,
        },
        name: "/dev/zero (deleted)".into(),
    });
    // The main process's data comes first: the page goes before the members' slices.
    let at = ck.image.tree.iter().map(|m| m.data_off).min().unwrap();
    for m in &mut ck.image.tree {
        m.data_off += 0x1000;
    }
    ck.image.shm = vec![ShmObject {
        id: ShmId::Anon(9),
        size: 0x1000,
        sysv: None,
        runs: vec![PageRun {
            addr: 0,
            len: 0x1000,
            data_off: at,
        }],
        fresh: false,
    }];
    let at = at as usize;
    ck.data.splice(at..at, vec![fill; 0x1000]);
}

/// A tree's shared memory through a chain: a member's mappings name the objects the main
/// process lists in every checkpoint (its pages in the main process's data), full or
/// incremental; the image's full checkpoint lays them out again. A member whose mapping
/// names an object the main process does not list is refused, the image unchanged.
#[test]
fn a_members_shared_memory_is_the_main_processs() {
    let mut full = full_tree();
    tree_shm(&mut full, 2, 7);
    let mut img = Image::from_full(&roundtrip(full)).unwrap();
    let page = |img: &Image| img.shm_pages(ShmId::Anon(9)).unwrap()[&0][0];
    assert_eq!(page(&img), 7);
    let mut ck = incremental_tree(1, &[2, 3]);
    tree_shm(&mut ck, 2, 8);
    img.apply(&roundtrip(ck)).unwrap();
    assert_eq!(
        page(&img),
        8,
        "the object's page, from the main process's data"
    );
    assert_eq!(member(&img, 2).page(0x2000).unwrap()[0], 20);
    let back = Checkpoint::from_bytes(img.to_full().to_bytes()).expect("a valid tree");
    assert_eq!(page(&Image::from_full(&back).unwrap()), 8);
    // The main process no longer lists it.
    let mut ck = incremental_tree(2, &[2, 3]);
    tree_shm(&mut ck, 2, 9);
    ck.image.shm.clear();
    let e = img.apply(&ck).unwrap_err();
    assert!(e.to_string().contains("which is not in the image"), "{e}");
    assert_eq!((img.epoch, page(&img)), (1, 8));
}

/// An object that shrank between two checkpoints keeps no page past its new end (found by
/// the fuzzer: the image then made a full checkpoint that did not validate).
#[test]
fn a_shared_memory_object_that_shrank_keeps_no_page_past_its_end() {
    let object = |size: u64, runs: Vec<PageRun>| ShmObject {
        id: ShmId::Anon(7),
        size,
        sysv: None,
        runs,
        fresh: false,
    };
    let mut m = meta(vec![anon(0x1000, 0x2000)]);
    m.shm = vec![object(
        0x2000,
        vec![PageRun {
            addr: 0,
            len: 0x2000,
            data_off: 0,
        }],
    )];
    let mut img = Image::from_full(&full(m, vec![5u8; 0x2000])).unwrap();
    assert_eq!(img.shm_pages(ShmId::Anon(7)).unwrap().len(), 2);
    let mut m = meta(vec![anon(0x1000, 0x2000)]);
    m.base_epoch = Some(0);
    m.shm = vec![object(0x1000, vec![])];
    img.apply(&Checkpoint {
        epoch: 1,
        kind: Kind::Incremental { base: 0 },
        image: m,
        data: vec![],
    })
    .unwrap();
    let pages = img.shm_pages(ShmId::Anon(7)).unwrap();
    assert_eq!(pages.keys().copied().collect::<Vec<_>>(), vec![0]);
    let back = img.to_full();
    Checkpoint::from_bytes(back.to_bytes()).expect("the image's full checkpoint is valid");
}
