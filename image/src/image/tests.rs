//! Unit tests of the format and of its validation: one file, over a thousand lines, because
//! every test builds on the same few builders at its top (`meta`, `thread`, `sample`), which other
//! modules of the crate use too.

use super::*;

/// A process image with one thread (TID 1) and `vmas`, nothing else (for tests of this
/// crate).
pub(crate) fn meta(vmas: Vec<Vma>) -> ProcessImage {
    ProcessImage {
        pid: 1,
        comm: String::new(),
        exe: FileRef {
            path: String::new(),
            size: 0,
            hash: [0; 32],
        },
        cwd: "/".into(),
        umask: 0,
        rlimits: vec![],
        mm: MmInfo::default(),
        auxv: vec![],
        vmas,
        runs: vec![],
        files: vec![],
        threads: vec![ThreadImage {
            comm: String::new(),
            xstate: vec![],
            ..thread(1, 0)
        }],
        sigactions: vec![],
        fds: vec![],
        max_tid: 1,
        sandbox: vec![],
        base_epoch: None,
        reset: vec![],
        pages: vec![],
        cow: vec![],
        private_files: Default::default(),
        creds: Default::default(),
        carried: Default::default(),
        timers: Default::default(),
        seccomp: Default::default(),
        shm: Vec::new(),
        pgid: 0,
        sid: 0,
        tree: Vec::new(),
        shared_files: Vec::new(),
        zombies: Vec::new(),
        pending: Vec::new(),
        scrub: None,
        tcp: Vec::new(),
    }
}

/// Thread `tid` at instruction pointer `rip` (for tests of this crate).
pub(crate) fn thread(tid: i32, rip: u64) -> ThreadImage {
    let mut regs = vec![0; 27];
    regs[16] = rip;
    ThreadImage {
        tid,
        comm: format!("t{tid}"),
        regs,
        xstate: vec![tid as u8; 64],
        sigmask: 0,
        robust_list: 0,
        robust_len: 0,
        clear_child_tid: 0,
        rseq: None,
        altstack: AltStack::default(),
        pending: Vec::new(),
    }
}

pub(crate) fn sample(kind: Kind) -> Checkpoint {
    let image = ProcessImage {
        pid: 2,
        comm: "x".into(),
        exe: FileRef {
            path: "/bin/x".into(),
            size: 1,
            hash: [1; 32],
        },
        umask: 0o22,
        vmas: vec![Vma {
            start: 0x1000,
            end: 0x3000,
            prot: 3,
            shared: false,
            flags: 0,
            backing: Backing::Anon,
            name: String::new(),
        }],
        runs: vec![PageRun {
            addr: 0x1000,
            len: 4096,
            data_off: 0,
        }],
        threads: vec![ThreadImage {
            comm: "x".into(),
            xstate: vec![0; 832],
            ..thread(2, 0)
        }],
        max_tid: 2,
        base_epoch: match kind {
            Kind::Full => None,
            Kind::Incremental { base } => Some(base),
        },
        ..meta(vec![])
    };
    Checkpoint {
        epoch: 7,
        kind,
        image,
        data: vec![5; 4096],
    }
}

/// Inotify descriptor 4 with one watch, `wd` on `path`.
fn inotify_fd(wd: i32, path: &str) -> FdImage {
    FdImage {
        fd: 4,
        cloexec: false,
        flags: 0,
        kind: FdKind::Inotify {
            watches: vec![InotifyWatch {
                wd,
                mask: 2,
                path: path.into(),
            }],
        },
    }
}

fn timer(id: i32) -> PosixTimer {
    PosixTimer {
        id,
        clock: 1,
        signo: 10,
        notify: sigev::SIGNAL,
        tid: 0,
        sigval: 0,
        value_ns: 1,
        interval_ns: 0,
    }
}

#[test]
fn roundtrips_full_and_incremental() {
    for kind in [Kind::Full, Kind::Incremental { base: 6 }] {
        let ck = sample(kind);
        let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
        assert_eq!((back.epoch, back.kind), (7, kind));
        assert_eq!(back.data, ck.data);
        assert_eq!(back.image.runs, ck.image.runs);
    }
}

#[test]
fn opens_files_and_refuses_bad_ones() {
    let dir = std::env::temp_dir().join(format!("tardi-image-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ck = sample(Kind::Full);
    let bytes = ck.to_bytes();
    let good = dir.join("good");
    std::fs::write(&good, &bytes).unwrap();
    let f = CheckpointFile::open(&good).unwrap();
    assert_eq!(
        (f.epoch, f.kind, f.image.runs.clone()),
        (7, Kind::Full, ck.image.runs.clone())
    );
    let mut page = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&f.file, &mut page, f.data_offset).unwrap();
    assert_eq!(page, ck.data);
    let bad = dir.join("bad");
    let mut flipped = bytes.clone();
    let n = flipped.len();
    flipped[n - 100] ^= 4;
    std::fs::write(&bad, &flipped).unwrap();
    assert!(matches!(
        CheckpointFile::open(&bad),
        Err(FormatError::Checksum { .. })
    ));
    std::fs::write(&bad, &bytes[..n - 1]).unwrap();
    assert!(matches!(
        CheckpointFile::open(&bad),
        Err(FormatError::Truncated { .. })
    ));
    std::fs::write(&bad, b"").unwrap();
    assert!(matches!(
        CheckpointFile::open(&bad),
        Err(FormatError::Empty)
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_truncated_corrupted_and_foreign_bytes() {
    let bytes = sample(Kind::Full).to_bytes();
    for cut in [0, 7, 20, bytes.len() / 2, bytes.len() - 1] {
        assert!(
            Checkpoint::from_bytes(bytes[..cut].to_vec()).is_err(),
            "cut at {cut}"
        );
    }
    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 1;
    assert!(matches!(
        Checkpoint::from_bytes(flipped),
        Err(FormatError::Checksum { .. })
    ));
    assert!(matches!(
        Checkpoint::from_bytes(b"not a checkpoint at all".to_vec()),
        Err(FormatError::BadMagic)
    ));
}

/// Every consistency rule refuses what breaks it, with a message naming it, through
/// `from_bytes` as through `validate`.
#[test]
fn refuses_inconsistent_metadata() {
    use crate::delta::Codec;
    use crate::files::Entry;
    type Break = fn(&mut Checkpoint);
    let cases: Vec<(&str, Break)> = vec![
        ("no threads", |c| c.image.threads.clear()),
        ("process id", |c| c.image.pid = 0),
        ("not positive", |c| c.image.threads[0].tid = -1),
        ("26 registers", |c| {
            c.image.threads[0].regs.pop();
        }),
        ("XSAVE area of 4097", |c| {
            c.image.threads[0].xstate = vec![0; 4097]
        }),
        ("appears twice", |c| {
            let t = c.image.threads[0].clone();
            c.image.threads.push(t);
        }),
        ("empty or not page-aligned", |c| {
            c.image.vmas[0].end = 0x1000
        }),
        ("empty or not page-aligned", |c| {
            c.image.vmas[0].start = 0x1001
        }),
        ("names file #0 of 0", |c| {
            c.image.vmas[0].backing = Backing::File {
                index: 0,
                offset: 0,
            }
        }),
        ("overlap", |c| {
            let mut v = c.image.vmas[0].clone();
            v.start = 0x2000;
            v.end = 0x4000;
            c.image.vmas.push(v);
        }),
        ("not page-aligned", |c| c.image.runs[0].len = 100),
        ("outside the page data", |c| c.image.runs[0].data_off = 1),
        ("outside the page data", |c| c.image.runs[0].len = !0xfff),
        ("outside every mapping", |c| c.image.runs[0].addr = 0x5000),
        ("outside every mapping", |c| {
            c.image.runs[0].addr = 0x2000;
            c.image.runs[0].len = 0x2000;
            c.data = vec![0; 0x2000];
        }),
        ("outside every mapping", |c| {
            // addr + len overflows.
            c.image.vmas[0].start = u64::MAX - 0xfff - 0x1000;
            c.image.vmas[0].end = u64::MAX - 0xfff;
            c.image.runs[0].addr = u64::MAX - 0xfff - 0x1000;
            c.image.runs[0].len = 0x2000;
            c.data = vec![0; 0x2000];
        }),
        ("overlap in memory", |c| {
            c.data = vec![0; 0x2000];
            c.image.runs.push(PageRun {
                addr: 0x1000,
                len: 0x1000,
                data_off: 0x1000,
            });
        }),
        ("overlap in the page data", |c| {
            c.image.runs.push(PageRun {
                addr: 0x2000,
                len: 0x1000,
                data_off: 0,
            });
        }),
        ("not page-aligned", |c| {
            c.image.pages.push(EncodedPage {
                addr: 0x1008,
                enc: PageEncoding::Zero,
                data_off: 0,
            })
        }),
        ("outside the page data", |c| {
            c.image.pages.push(EncodedPage {
                addr: 0x1000,
                enc: PageEncoding::Raw,
                data_off: u64::MAX,
            })
        }),
        ("not shorter than a raw page", |c| {
            c.data = vec![0; 5000];
            c.image.pages.push(EncodedPage {
                addr: 0x1000,
                enc: PageEncoding::Delta {
                    codec: Codec::XorZstd,
                    len: 4096,
                },
                data_off: 0,
            })
        }),
        ("ends before it starts", |c| c.image.reset.push((2, 1))),
        ("ends before it starts", |c| {
            c.image.cow.push((0x3000, 0x2000))
        }),
        ("signal 65", |c| {
            c.image.sigactions.push(SigAction {
                signo: 65,
                handler: 0,
                flags: 0,
                restorer: 0,
                mask: 0,
            })
        }),
        ("descriptor -1", |c| {
            c.image.fds.push(FdImage {
                fd: -1,
                cloexec: false,
                flags: 0,
                kind: FdKind::EventFd {
                    count: 0,
                    semaphore: false,
                },
            })
        }),
        ("descriptor 3 appears twice", |c| {
            let fd = FdImage {
                fd: 3,
                cloexec: false,
                flags: 0,
                kind: FdKind::SignalFd { mask: 0 },
            };
            c.image.fds.push(fd.clone());
            c.image.fds.push(fd);
        }),
        ("working directory \"/a\\0b\" contains a NUL", |c| {
            c.image.cwd = "/a\0b".into()
        }),
        ("executable", |c| c.image.exe.path.push('\0')),
        ("mapped file", |c| {
            c.image.files.push(FileRef {
                path: "/lib\0".into(),
                size: 0,
                hash: [0; 32],
            })
        }),
        ("descriptor path", |c| {
            c.image.fds.push(FdImage {
                fd: 0,
                cloexec: false,
                flags: 0,
                kind: FdKind::Path {
                    path: "/dev/\0".into(),
                    pos: 0,
                    is_dir: false,
                },
            })
        }),
        ("not inside a private directory", |c| {
            c.image.private_files.dirs = vec!["/data".into()];
            c.image.private_files.remove = vec!["/etc/passwd".into()];
        }),
        ("not canonical", |c| {
            c.image.private_files.dirs = vec!["/data".into()];
            c.image.private_files.upsert =
                vec![("/data/../etc".into(), Entry::Dir { mode: 0o755 })];
        }),
        ("base epoch", |c| c.image.base_epoch = Some(3)),
        ("POSIX timer id -1", |c| {
            c.image.timers.posix.push(timer(-1))
        }),
        ("POSIX timer 4 appears twice", |c| {
            c.image.timers.posix.push(timer(4));
            c.image.timers.posix.push(timer(4));
        }),
        ("signals 0", |c| {
            let mut t = timer(1);
            t.signo = 0;
            c.image.timers.posix.push(t);
        }),
        ("notification 3", |c| {
            let mut t = timer(1);
            t.notify = 3;
            c.image.timers.posix.push(t);
        }),
        ("signals thread 9, which is not in the image", |c| {
            let mut t = timer(1);
            t.notify = sigev::THREAD_ID;
            t.tid = 9;
            c.image.timers.posix.push(t);
        }),
        ("interval timer 3", |c| {
            c.image.timers.itimers.push(ITimer {
                which: 3,
                value_ns: 1,
                interval_ns: 0,
            })
        }),
        ("seccomp filter #0 has 0 instructions", |c| {
            c.image.seccomp.filters.push(SeccompFilter {
                flags: 0,
                insns: vec![],
            })
        }),
        ("seccomp filter #0 has flags 0x1", |c| {
            c.image.seccomp.filters.push(SeccompFilter {
                flags: 1,
                insns: vec![6],
            })
        }),
        ("names seccomp filter #0 of 0", |c| {
            c.image.seccomp.chains.push(SeccompChain {
                tid: 2,
                filters: vec![0],
            })
        }),
        ("seccomp filters of thread 3, which is not", |c| {
            c.image.seccomp.chains.push(SeccompChain {
                tid: 3,
                filters: vec![],
            })
        }),
        ("instructions)", |c| {
            c.image.seccomp.filters.push(SeccompFilter {
                flags: 0,
                insns: vec![6; SECCOMP_MAX_INSNS],
            });
            c.image.seccomp.chains.push(SeccompChain {
                tid: 2,
                filters: vec![0; 8],
            })
        }),
        ("inotify descriptor 4 has watch 0", |c| {
            c.image.fds.push(inotify_fd(0, "/x"))
        }),
        ("has path \"\"", |c| c.image.fds.push(inotify_fd(1, ""))),
    ];
    let good = sample(Kind::Full);
    good.validate().unwrap();
    for (want, break_it) in cases {
        let mut ck = good.clone();
        break_it(&mut ck);
        let err = ck.validate().expect_err(want).to_string();
        assert!(err.contains(want), "expected {want:?}, got {err:?}");
        // The same through the wire (the header's kind comes from `kind`).
        let err = Checkpoint::from_bytes(ck.to_bytes())
            .expect_err(want)
            .to_string();
        assert!(
            err.contains(want) || want == "base epoch" && err.contains("full checkpoint"),
            "from_bytes: expected {want:?}, got {err:?}"
        );
    }
}

/// `c` is refused, with a message containing `want`, by `validate` and by `from_bytes` of
/// its encoding.
pub(crate) fn assert_refused(c: &Checkpoint, want: &str) {
    let err = c.validate().expect_err(want).to_string();
    assert!(
        err.contains(want),
        "validate: expected {want:?}, got {err:?}"
    );
    let err = Checkpoint::from_bytes(c.to_bytes())
        .expect_err(want)
        .to_string();
    assert!(
        err.contains(want),
        "from_bytes: expected {want:?}, got {err:?}"
    );
}

/// A full checkpoint of `sample` with one member, pid 5, whose data follows the root's.
fn with_member() -> Checkpoint {
    let mut ck = sample(Kind::Full);
    let mut m = ck.image.clone();
    m.pid = 5;
    m.threads.truncate(1);
    m.threads[0].tid = 5;
    m.max_tid = 5;
    m.sandbox.clear();
    m.private_files = Default::default();
    let end = ck
        .image
        .runs
        .iter()
        .map(|r| r.data_off + r.len)
        .max()
        .unwrap_or(0);
    let len = m.runs.iter().map(|r| r.data_off + r.len).max().unwrap_or(0);
    let off = ck.data.len() as u64;
    ck.data.extend(std::iter::repeat_n(7u8, len as usize));
    assert!(off >= end);
    ck.image.tree.push(Member {
        ppid: ck.image.pid,
        data_off: off,
        data_len: len,
        image: m,
    });
    ck
}

#[test]
fn trees_roundtrip_and_inconsistent_ones_are_refused() {
    let ck = with_member();
    ck.validate().unwrap();
    let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
    assert_eq!(back.image.tree.len(), 1);
    assert_eq!(back.image.tree[0].image.pid, 5);

    type Break = fn(&mut Checkpoint);
    let cases: Vec<(&str, Break)> = vec![
        ("not listed before it", |c| c.image.tree[0].ppid = 9),
        ("overlaps another's", |c| c.image.tree[0].data_off = 0),
        ("overlaps another's", |c| c.image.tree[0].data_len += 1),
        ("appears twice in the tree", |c| {
            c.image.tree[0].image.pid = c.image.pid;
            c.image.tree[0].image.threads[0].tid = c.image.pid;
        }),
        ("group", |c| c.image.tree[0].image.sid = -1),
        ("carries private files", |c| {
            c.image.tree[0].image.private_files.dirs = vec!["/data".into()]
        }),
        ("process 5: no threads", |c| {
            c.image.tree[0].image.threads.clear()
        }),
        ("process 5 is incremental in a full checkpoint", |c| {
            c.image.tree[0].image.base_epoch = Some(6);
        }),
        ("holds processes of its own", |c| {
            let m = c.image.tree[0].clone();
            c.image.tree[0].image.tree.push(Member { data_len: 0, ..m });
        }),
    ];
    for (want, brk) in cases {
        let mut c = with_member();
        brk(&mut c);
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains(want),
            "validate: expected {want:?}, got {err:?}"
        );
    }

    // A nested tree is refused while decoding, before its members are decoded (so no
    // depth of nesting can recurse further).
    let mut c = with_member();
    let m = c.image.tree[0].clone();
    c.image.tree[0].image.tree.push(m);
    // (postcard keeps no custom message: the error is a malformed-metadata one.)
    let err = Checkpoint::from_bytes(c.to_bytes()).unwrap_err();
    assert!(matches!(err, FormatError::Meta(_)), "{err}");
}

/// [`with_member`] with two zombies: one of the main process (exited 7), one of the
/// member (killed by SIGKILL).
fn with_zombies() -> Checkpoint {
    let mut ck = with_member();
    let z = |pid, ppid, status| Zombie {
        pid,
        ppid,
        pgid: 0,
        sid: 0,
        uid: 0,
        status,
    };
    ck.image.zombies = vec![z(8, ck.image.pid, 7 << 8), z(9, 5, 9)];
    ck
}

#[test]
fn zombies_roundtrip_and_inconsistent_ones_are_refused() {
    let ck = with_zombies();
    ck.validate().unwrap();
    let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
    assert_eq!(back.image.zombies, ck.image.zombies);
    // A single process may have zombie children too.
    let mut single = sample(Kind::Full);
    single.image.zombies = vec![ck.image.zombies[0]];
    single.validate().unwrap();
    // An incremental checkpoint lists the zombies of its epoch too (the epoch loop).
    let mut inc = incremental_tree();
    inc.image.zombies = vec![Zombie {
        pid: 8,
        ppid: 5,
        pgid: 2,
        sid: 2,
        uid: 0,
        status: 3 << 8,
    }];
    inc.validate().unwrap();

    type Break = fn(&mut Checkpoint);
    let cases: Vec<(&str, Break)> = vec![
        ("not positive or not its own", |c| {
            c.image.zombies[0].pid = 0
        }),
        ("not positive or not its own", |c| {
            c.image.zombies[0].pid = 5
        }),
        ("not positive or not its own", |c| {
            c.image.zombies[0].pid = c.image.pid
        }),
        ("not positive or not its own", |c| {
            c.image.zombies[1].pid = 8
        }),
        ("not a process of the tree", |c| c.image.zombies[1].ppid = 8),
        ("has group -1", |c| c.image.zombies[0].pgid = -1),
        ("wait status 0x86", |c| c.image.zombies[0].status = 0x86),
        ("wait status 0x11", |c| c.image.zombies[0].status = 17),
        ("wait status 0x47f", |c| c.image.zombies[0].status = 0x47f),
        ("wait status 0x10700", |c| {
            c.image.zombies[0].status = 0x10700
        }),
        ("lists zombies (the main process lists them)", |c| {
            c.image.tree[0].image.zombies = vec![c.image.zombies[1]];
            c.image.zombies.pop();
        }),
    ];
    for (want, brk) in cases {
        let mut c = with_zombies();
        brk(&mut c);
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains(want),
            "validate: expected {want:?}, got {err:?}"
        );
        assert!(Checkpoint::from_bytes(c.to_bytes()).is_err(), "{want}");
    }
    for ok in [0, 1 << 8, 255 << 8, 1, 6, 9, 15, 31, 32, 64] {
        assert!(Zombie::status_valid(ok), "{ok:#x}");
    }
    for bad in [0x86, 17, 19, 28, 65, 0x7f, 0x17f, 1 << 16, -1] {
        assert!(!Zombie::status_valid(bad), "{bad:#x}");
    }
}

/// [`with_member`] where the main process lists an anonymous shared memory object (two
/// pages, its first page's contents in the main process's data, before the member's) that
/// only the member maps, at 0x10000.
fn with_member_shm() -> Checkpoint {
    let mut ck = with_member();
    let at = ck.image.tree[0].data_off as usize;
    ck.data.splice(at..at, std::iter::repeat_n(9u8, 4096));
    ck.image.tree[0].data_off += 4096;
    ck.image.shm.push(ShmObject {
        id: ShmId::Anon(9),
        size: 8192,
        sysv: None,
        runs: vec![PageRun {
            addr: 0,
            len: 4096,
            data_off: at as u64,
        }],
        fresh: false,
    });
    ck.image.tree[0].image.vmas.push(Vma {
        start: 0x10000,
        end: 0x12000,
        prot: 3,
        shared: true,
        flags: 0,
        backing: Backing::Shm {
            id: ShmId::Anon(9),
            offset: 0,
        },
        name: String::new(),
    });
    ck
}

/// An unlinked file's object (`ShmId::Unlinked`) is anonymous memory to the format: valid
/// without System V details, refused with them, and kept apart from an anonymous object
/// with the same inode number.
#[test]
fn unlinked_objects_are_anonymous_and_distinct() {
    let mut ck = with_member_shm();
    let unlinked = ShmId::Unlinked { dev: 27, ino: 9 };
    assert!(unlinked.is_anonymous() && ShmId::Anon(9).is_anonymous());
    assert!(!ShmId::Sysv(9).is_anonymous());
    assert_ne!(unlinked, ShmId::Anon(9));
    ck.image.shm[0].id = unlinked;
    ck.image.tree[0].image.vmas[1].backing = Backing::Shm {
        id: unlinked,
        offset: 0,
    };
    ck.validate().unwrap();
    let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
    assert_eq!(back.image.shm, ck.image.shm);
    let mut c = ck.clone();
    c.image.tree[0].image.vmas[1].backing = Backing::Shm {
        id: ShmId::Anon(9),
        offset: 0,
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("which is not in the image"), "{err}");
    ck.image.shm[0].sysv = Some(SysvShm {
        key: 0,
        mode: 0o600,
        uid: 0,
        gid: 0,
        cuid: 0,
        cgid: 0,
        removed: false,
        locked: false,
    });
    let err = ck.validate().unwrap_err().to_string();
    assert!(err.contains("is described wrongly"), "{err}");
}

#[test]
fn a_tree_lists_its_shared_memory_once_in_the_main_process() {
    let ck = with_member_shm();
    ck.validate().unwrap();
    let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
    assert_eq!(back.image.shm, ck.image.shm);
    assert_eq!(back.image.tree[0].image.vmas, ck.image.tree[0].image.vmas);

    type Break = fn(&mut Checkpoint);
    let cases: Vec<(&str, Break)> = vec![
        ("process 5 lists shared memory objects", |c| {
            let o = c.image.shm[0].clone();
            c.image.tree[0]
                .image
                .shm
                .push(ShmObject { runs: vec![], ..o })
        }),
        (
            "names shared memory Anon(10), which is not in the image",
            |c| {
                c.image.tree[0].image.vmas[1].backing = Backing::Shm {
                    id: ShmId::Anon(10),
                    offset: 0,
                }
            },
        ),
        ("lies outside shared memory Anon(9)", |c| {
            c.image.tree[0].image.vmas[1].backing = Backing::Shm {
                id: ShmId::Anon(9),
                offset: 4096,
            }
        }),
        // The objects' contents are the main process's data: no member's slice over them.
        ("overlaps another's", |c| c.image.tree[0].data_off -= 4096),
    ];
    for (want, brk) in cases {
        let mut c = with_member_shm();
        brk(&mut c);
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains(want),
            "validate: expected {want:?}, got {err:?}"
        );
    }
}

/// [`with_member`] where the main process (pid 2) and the member (pid 5) share one
/// listening socket at descriptor 3 and a pipe whose read end is the main process's
/// descriptor 4 and whose write end is the member's descriptor 4.
fn with_shared() -> Checkpoint {
    let mut ck = with_member();
    let shared = |fd: i32, i: u32| FdImage {
        fd,
        cloexec: fd == 4,
        flags: 2,
        kind: FdKind::Shared(i),
    };
    let pipe = |write_end: bool| FdImage {
        fd: 4,
        cloexec: false,
        flags: if write_end { 1 } else { 0 },
        kind: FdKind::Pipe {
            id: 77,
            write_end,
            buffered: if write_end {
                vec![]
            } else {
                b"queued".to_vec()
            },
            capacity: 65536,
        },
    };
    ck.image.shared_files = vec![
        SharedFile {
            file: FdImage {
                fd: 3,
                cloexec: false,
                flags: 2,
                kind: FdKind::Socket(SocketImage {
                    family: 2,
                    ty: 1,
                    protocol: 6,
                    state: SocketState::Listening { backlog: 16 },
                    local: vec![2, 0, 0x1f, 0x90, 0, 0, 0, 0],
                    peer: vec![],
                    options: vec![],
                }),
            },
            holders: vec![(2, 3), (5, 3)],
        },
        SharedFile {
            file: pipe(false),
            holders: vec![(2, 4)],
        },
        SharedFile {
            file: pipe(true),
            holders: vec![(5, 4)],
        },
    ];
    ck.image.fds = vec![shared(3, 0), shared(4, 1)];
    ck.image.tree[0].image.fds = vec![shared(3, 0), shared(4, 2)];
    ck
}

/// Shared descriptions round-trip, and every rule about them refuses what breaks it: a
/// crafted image cannot make a restore index out of range, hand a description to a
/// process outside the tree or both reopen and inherit one descriptor.
#[test]
fn shared_descriptions_roundtrip_and_inconsistent_ones_are_refused() {
    let ck = with_shared();
    ck.validate().unwrap();
    let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
    assert_eq!(back.image.shared_files, ck.image.shared_files);
    assert_eq!(back.image.tree[0].image.fds, ck.image.tree[0].image.fds);

    type Break = fn(&mut Checkpoint);
    let cases: Vec<(&str, Break)> = vec![
        ("names shared description #3 of 3", |c| {
            c.image.fds[0].kind = FdKind::Shared(3)
        }),
        ("names shared description #9 of 3", |c| {
            c.image.tree[0].image.fds[1].kind = FdKind::Shared(9)
        }),
        ("held by process 9, which is not in the tree", |c| {
            c.image.shared_files[0].holders.push((9, 3))
        }),
        ("both private and shared", |c| {
            c.image.fds[1].kind = FdKind::EventFd {
                count: 0,
                semaphore: false,
            }
        }),
        ("which has no such descriptor", |c| {
            c.image.shared_files[0].holders.push((5, 8))
        }),
        ("which names shared description #2", |c| {
            c.image.shared_files[0].holders.push((5, 4))
        }),
        ("lists holder (2, 3) twice", |c| {
            c.image.shared_files[0].holders.push((2, 3))
        }),
        ("does not list it as a holder", |c| {
            c.image.shared_files[0].holders.retain(|h| h.0 != 5)
        }),
        ("has no holder", |c| {
            c.image.shared_files.push(SharedFile {
                file: c.image.shared_files[0].file.clone(),
                holders: vec![],
            })
        }),
        ("names another shared description", |c| {
            c.image.shared_files[1].file.kind = FdKind::Shared(0)
        }),
        ("is an epoll instance", |c| {
            c.image.shared_files[1].file.kind = FdKind::Epoll { interests: vec![] }
        }),
        ("shared description #1: descriptor path", |c| {
            c.image.shared_files[1].file.kind = FdKind::Path {
                path: "/log\0".into(),
                pos: 0,
                is_dir: false,
            }
        }),
        (
            "shared description #0: unix socket of descriptor 3 has type 9",
            |c| {
                c.image.shared_files[0].file.kind = FdKind::Unix(UnixSocketImage {
                    ino: 1,
                    ty: 9,
                    local: UnixAddr::Unnamed,
                    path_file: None,
                    state: UnixState::Unconnected,
                    peer_ino: 0,
                    peer: UnixAddr::Unnamed,
                    queue: vec![],
                    shutdown: 0,
                    options: vec![],
                })
            },
        ),
        ("process 5 lists shared descriptors", |c| {
            let s = c.image.shared_files[0].clone();
            c.image.tree[0].image.shared_files.push(s);
        }),
        ("a single process lists shared descriptors", |c| {
            c.image.tree.clear();
            c.image.shared_files.truncate(2);
            c.image.shared_files[0].holders.truncate(1);
        }),
        ("names shared description #0 of 0", |c| {
            c.image.shared_files.clear();
        }),
        ("is private but belongs with a shared pipe", |c| {
            // The member's write end of the shared pipe, as a private descriptor.
            let mut end = c.image.shared_files[2].file.clone();
            end.fd = 6;
            c.image.tree[0].image.fds.push(end);
        }),
        (
            "is private but belongs with a shared pipe or unix socket",
            |c| {
                let sock = |ino: u64, peer_ino: u64| UnixSocketImage {
                    ino,
                    ty: 1,
                    local: UnixAddr::Unnamed,
                    path_file: None,
                    state: UnixState::Connected,
                    peer_ino,
                    peer: UnixAddr::Unnamed,
                    queue: vec![],
                    shutdown: 0,
                    options: vec![],
                };
                c.image.shared_files[0].file.kind = FdKind::Unix(sock(10, 11));
                c.image.fds.push(FdImage {
                    fd: 7,
                    cloexec: false,
                    flags: 2,
                    kind: FdKind::Unix(sock(11, 10)),
                });
            },
        ),
    ];
    for (want, brk) in cases {
        let mut c = with_shared();
        brk(&mut c);
        assert_refused(&c, want);
    }
    // An incremental checkpoint of a single process cannot list them.
    let mut c = sample(Kind::Incremental { base: 6 });
    c.image.runs.clear();
    c.image.shared_files = with_shared().image.shared_files;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("a single process lists shared"), "{err}");
}

/// [`with_shared`] as an incremental checkpoint on epoch 6: one page written in each
/// process (the main process's in the data first, the member's in its slice after it),
/// the member's descriptors carried over from the base.
fn incremental_tree() -> Checkpoint {
    let mut ck = with_shared();
    ck.kind = Kind::Incremental { base: 6 };
    let page = |data_off| EncodedPage {
        addr: 0x1000,
        enc: PageEncoding::Raw,
        data_off,
    };
    ck.image.base_epoch = Some(6);
    ck.image.runs.clear();
    ck.image.pages = vec![page(0)];
    let mut m = ck.image.tree[0].clone();
    m.data_off = 4096;
    m.data_len = 4096;
    m.image.base_epoch = Some(6);
    m.image.runs.clear();
    m.image.pages = vec![page(0)];
    m.image.fds.clear();
    m.image.carried.fds = true;
    ck.image.tree[0] = m;
    ck.data = vec![9; 8192];
    ck
}

/// An incremental checkpoint of a tree: each member incremental on the same base, its
/// pages in its own slice after the main process's; descriptors carried over are left to
/// the receiver; everything else about the tree and its shared descriptions is checked as
/// in a full one.
#[test]
fn incremental_trees_roundtrip_and_inconsistent_ones_are_refused() {
    let ck = incremental_tree();
    ck.validate().unwrap();
    let back = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
    assert_eq!(back.image.tree[0].image.pages, ck.image.tree[0].image.pages);
    assert_eq!(back.image.shared_files, ck.image.shared_files);
    // A holder whose descriptors are carried over is the receiver's to check.
    let mut c = incremental_tree();
    c.image.shared_files[0].holders.push((5, 8));
    c.validate().unwrap();
    // A process that appeared since the base comes whole (a fresh member).
    let mut c = incremental_tree();
    let m = &mut c.image.tree[0].image;
    (m.base_epoch, m.carried) = (None, Default::default());
    m.fds = with_shared().image.tree[0].image.fds.clone();
    m.pages.clear();
    m.runs = vec![PageRun {
        addr: 0x1000,
        len: 4096,
        data_off: 0,
    }];
    c.validate().unwrap();

    type Break = fn(&mut Checkpoint);
    let cases: Vec<(&str, Break)> = vec![
        // A fresh member (whole: it appeared since the base) carries nothing over.
        (
            "process 5: a full checkpoint leaves out part of its metadata",
            |c| {
                c.image.tree[0].image.base_epoch = None;
            },
        ),
        (
            "process 5 applies to epoch 5, the main process to epoch 6",
            |c| c.image.tree[0].image.base_epoch = Some(5),
        ),
        ("overlaps another's", |c| c.image.tree[0].data_off = 0),
        ("overlaps another's", |c| c.image.tree[0].data_len = 4097),
        (
            "process 5: page at 0x1000 lies outside the page data",
            |c| c.image.tree[0].image.pages[0].data_off = 1,
        ),
        ("names shared description #3 of 3", |c| {
            c.image.fds[0].kind = FdKind::Shared(3)
        }),
        ("lists holder (2, 3) twice", |c| {
            c.image.shared_files[0].holders.push((2, 3))
        }),
        ("held by process 9, which is not in the tree", |c| {
            c.image.shared_files[0].holders.push((9, 3))
        }),
        ("both private and shared", |c| {
            c.image.fds[1].kind = FdKind::EventFd {
                count: 0,
                semaphore: false,
            }
        }),
    ];
    for (want, brk) in cases {
        let mut c = incremental_tree();
        brk(&mut c);
        assert_refused(&c, want);
    }
}

#[test]
fn refuses_trailing_metadata_and_mismatched_kinds() {
    let ck = sample(Kind::Incremental { base: 6 });
    let mut bytes = ck.to_bytes();
    // Header says full, metadata has a base epoch.
    bytes[12] = 0;
    let n = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
    let err = Checkpoint::from_bytes(bytes).unwrap_err().to_string();
    assert!(err.contains("full checkpoint with a base epoch"), "{err}");
    // One byte of junk after the metadata, lengths and checksum fixed up.
    let meta = postcard::to_stdvec(&ck.image).unwrap();
    let mut v = Vec::new();
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    v.extend_from_slice(&1u32.to_le_bytes());
    v.extend_from_slice(&7u64.to_le_bytes());
    v.extend_from_slice(&(meta.len() as u64 + 1).to_le_bytes());
    v.extend_from_slice(&(ck.data.len() as u64).to_le_bytes());
    v.extend_from_slice(&meta);
    v.push(0);
    v.extend_from_slice(&ck.data);
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    let err = Checkpoint::from_bytes(v).unwrap_err().to_string();
    assert!(err.contains("1 bytes after the encoded metadata"), "{err}");
}
