//! Realistic checkpoint chains built through the crate's own types, with a model of what the
//! receiver must end up holding: a process with code, data, heap, mmap'ed and stack mappings,
//! several threads, every kind of descriptor and a private directory, then epochs that write
//! pages (every codec), map, unmap and replace ranges, copy file pages on write, change threads
//! and private files, and once bring a new sandbox description.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use tardi_image::delta::{Codec, PAGE_SIZE, PageCodec, PageEncoding};
use tardi_image::files::{Entry, FileChanges, Tree};
use tardi_image::image::*;
use tardi_image::store::MetaCarry;

pub const PAGE: u64 = PAGE_SIZE as u64;
pub type Page = Box<[u8; PAGE_SIZE]>;

/// A chain and what applying each prefix of it must give.
pub struct Chain {
    pub cks: Vec<Checkpoint>,
    /// After `cks[..=i]`: the pages the image holds (zero anonymous pages absent).
    pub pages: Vec<BTreeMap<u64, Page>>,
    pub trees: Vec<Tree>,
    pub sandboxes: Vec<Vec<u8>>,
    /// After `cks[..=i]`: each shared memory object's pages that are not all zeros.
    pub shm: Vec<BTreeMap<ShmId, BTreeMap<u64, Page>>>,
}

const SHM_MAP: u64 = 0x7e00_0000_0000;

/// A System V segment's description.
fn sysv(key: i32, removed: bool) -> Option<SysvShm> {
    Some(SysvShm {
        key,
        mode: 0o640,
        uid: 100,
        gid: 101,
        cuid: 0,
        cgid: 0,
        removed,
        locked: false,
    })
}

/// A shared memory object's pages as runs of `data` (contiguous offsets coalesced).
fn shm_runs(pages: &BTreeMap<u64, Page>, data: &mut Vec<u8>) -> Vec<PageRun> {
    let mut runs: Vec<PageRun> = Vec::new();
    for (&off, page) in pages {
        match runs.last_mut() {
            Some(r) if r.addr + r.len == off => r.len += PAGE,
            _ => runs.push(PageRun {
                addr: off,
                len: PAGE,
                data_off: data.len() as u64,
            }),
        }
        data.extend_from_slice(&page[..]);
    }
    runs
}

fn nonzero(pages: &BTreeMap<u64, Page>) -> BTreeMap<u64, Page> {
    pages
        .iter()
        .filter(|(_, p)| !is_zero(&p[..]))
        .map(|(a, p)| (*a, p.clone()))
        .collect()
}

const HEAP: u64 = 0x60_0000;
const MMAP: u64 = 0x7f00_0000_0000;
const STACK: u64 = 0x7ffc_0000_0000;
const DATA: u64 = 0x40_2000;

fn vma(start: u64, end: u64, prot: u32, backing: Backing, name: &str) -> Vma {
    Vma {
        start,
        end,
        prot,
        shared: false,
        flags: 0,
        backing,
        name: name.into(),
    }
}

fn file(path: &str, n: u8) -> FileRef {
    FileRef {
        path: path.into(),
        size: 1 << 20,
        hash: [n; 32],
    }
}

fn thread(rng: &mut StdRng, tid: i32) -> ThreadImage {
    ThreadImage {
        tid,
        comm: format!("worker-{tid}"),
        regs: (0..27).map(|_| rng.random()).collect(),
        xstate: (0..832).map(|_| rng.random()).collect(),
        sigmask: rng.random(),
        robust_list: STACK + 0x100,
        robust_len: 24,
        clear_child_tid: STACK + 0x200,
        rseq: Some(Rseq {
            addr: STACK + 0x300,
            len: 32,
            sig: 0x5305_3053,
        }),
        altstack: AltStack {
            sp: MMAP,
            size: 8192,
            flags: 0,
        },
        // A blocked SIGUSR1 waiting in every other thread.
        pending: if tid % 2 == 0 {
            let mut info = vec![0u8; SIGINFO_SIZE];
            info[0] = 10;
            vec![PendingSignal { signo: 10, info }]
        } else {
            Vec::new()
        },
    }
}

fn fds() -> Vec<FdImage> {
    let fd = |fd: i32, kind: FdKind| FdImage {
        fd,
        cloexec: fd > 2,
        flags: 2,
        kind,
    };
    let path = |p: &str, pos: u64| FdKind::Path {
        path: p.into(),
        pos,
        is_dir: false,
    };
    vec![
        fd(0, path("/dev/null", 0)),
        fd(1, path("/dev/tardi.log", 0)),
        fd(2, path("/dev/tardi.log", 0)),
        fd(
            3,
            FdKind::Pipe {
                id: 1,
                write_end: false,
                buffered: b"queued".to_vec(),
                capacity: 65536,
            },
        ),
        fd(
            4,
            FdKind::Pipe {
                id: 1,
                write_end: true,
                buffered: vec![],
                capacity: 65536,
            },
        ),
        fd(
            5,
            FdKind::Socket(SocketImage {
                family: 2,
                ty: 1,
                protocol: 0,
                state: SocketState::Listening { backlog: 128 },
                local: vec![2, 0, 0x1f, 0x90, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                peer: vec![],
                options: vec![(1, 2, 1)],
            }),
        ),
        fd(
            14,
            FdKind::Socket(SocketImage {
                family: 2,
                ty: 1,
                protocol: 6,
                state: SocketState::ConnectedTcp,
                local: vec![2, 0, 0x1f, 0x90, 10, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0],
                peer: vec![2, 0, 0xc3, 0x50, 10, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0],
                options: vec![(6, 1, 1)],
            }),
        ),
        fd(
            6,
            FdKind::EventFd {
                count: 3,
                semaphore: false,
            },
        ),
        fd(
            7,
            FdKind::TimerFd {
                clockid: 1,
                ticks: 2,
                value_ns: 1_000_000,
                interval_ns: 5_000_000,
            },
        ),
        fd(8, FdKind::SignalFd { mask: 1 << 9 }),
        fd(
            12,
            FdKind::Inotify {
                watches: vec![
                    InotifyWatch {
                        wd: 2,
                        mask: 0x8000_0002,
                        path: "/data/watched".into(),
                    },
                    InotifyWatch {
                        wd: 5,
                        mask: 0x100,
                        path: "/data".into(),
                    },
                ],
            },
        ),
        fd(
            11,
            FdKind::Unix(UnixSocketImage {
                ino: 77,
                ty: 2,
                local: UnixAddr::Path("/tmp/svc.sock".into()),
                path_file: Some((100, 101, 0o140755)),
                state: UnixState::Connected,
                peer_ino: 78,
                peer: UnixAddr::Abstract(b"peer".to_vec()),
                queue: vec![b"one".to_vec(), vec![], b"three".to_vec()],
                shutdown: 2,
                options: vec![(1, 16, 1)],
            }),
        ),
        fd(
            9,
            FdKind::Epoll {
                interests: vec![
                    EpollInterest {
                        fd: 3,
                        events: 1,
                        data: 3,
                    },
                    EpollInterest {
                        fd: 5,
                        events: 1,
                        data: 5,
                    },
                ],
            },
        ),
        fd(10, path("/data/db", 100)),
    ]
}

/// A page that looks like heap data, or random bytes, or nearly zero.
fn content(rng: &mut StdRng) -> Page {
    let mut p = Box::new([0u8; PAGE_SIZE]);
    match rng.random_range(0..4) {
        0 => rng.fill(&mut p[..]),
        1 => {
            for i in 0..rng.random_range(1..8) {
                p[rng.random_range(0..PAGE_SIZE)] = i + 1;
            }
        }
        _ => {
            for w in p.chunks_exact_mut(8) {
                let v: u64 = match rng.random_range(0..3) {
                    0 => rng.random_range(0..1000),
                    1 => 0x5555_5555_0000 + rng.random_range(0..4096) * 16,
                    _ => u64::from_le_bytes(*b"key:0000"),
                };
                w.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    p
}

/// A small change, a rewrite or a zeroing of `page`.
fn write(rng: &mut StdRng, page: &mut Page) {
    match rng.random_range(0..6) {
        0 => *page = content(rng),
        1 => page.fill(0),
        2 => page.copy_within(100..1100, 120),
        _ => {
            for _ in 0..rng.random_range(1..10) {
                page[rng.random_range(0..PAGE_SIZE)] = rng.random();
            }
        }
    }
}

fn is_zero(p: &[u8]) -> bool {
    p.iter().all(|&b| b == 0)
}

/// The simulated process at one epoch.
struct Proc {
    vmas: Vec<Vma>,
    /// Pages with contents of their own: anonymous ones (zero or not) and copied-on-write
    /// pages of private file mappings.
    mem: BTreeMap<u64, Page>,
    threads: Vec<ThreadImage>,
    tree: Tree,
    /// Shared memory objects (without runs) and their pages (zero ones possibly kept).
    shm: BTreeMap<ShmId, (ShmObject, BTreeMap<u64, Page>)>,
}

impl Proc {
    fn image(&self, sandbox: Vec<u8>, base: Option<u64>) -> ProcessImage {
        ProcessImage {
            pid: self.threads[0].tid,
            comm: "svc".into(),
            exe: file("/usr/bin/svc", 1),
            cwd: "/data".into(),
            umask: 0o22,
            rlimits: vec![(7, 1024, 4096), (3, 8 << 20, u64::MAX)],
            mm: MmInfo {
                start_code: 0x40_0000,
                end_code: 0x40_2000,
                start_brk: HEAP,
                brk: HEAP + 0x4_0000,
                start_stack: STACK + 0x2_0000,
                ..MmInfo::default()
            },
            auxv: vec![6, 4096, 0, 0],
            vmas: self.vmas.clone(),
            runs: vec![],
            files: vec![file("/usr/bin/svc", 1), file("/usr/lib/libc.so.6", 2)],
            threads: self.threads.clone(),
            sigactions: vec![SigAction {
                signo: 10,
                handler: 0x40_1000,
                flags: 0x0400_0000,
                restorer: 0x40_1100,
                mask: 0,
            }],
            fds: fds(),
            max_tid: self.threads.iter().map(|t| t.tid).max().unwrap_or(1),
            sandbox,
            base_epoch: base,
            reset: vec![],
            pages: vec![],
            cow: vec![],
            private_files: FileChanges::default(),
            creds: Credentials {
                uid: [100, 100, 100, 100],
                gid: [101, 101, 101, 101],
                groups: vec![101, 4],
                cap_inheritable: 0,
                cap_permitted: 0,
                cap_effective: 0,
                cap_bounding: (1 << 41) - 1,
                cap_ambient: 0,
                securebits: 0,
                no_new_privs: true,
                dumpable: 0,
            },
            carried: Default::default(),
            timers: Timers {
                posix: vec![
                    PosixTimer {
                        id: 0,
                        clock: 1,
                        signo: 34,
                        notify: sigev::SIGNAL,
                        tid: 0,
                        sigval: 0x40_2000,
                        value_ns: 3_000_000,
                        interval_ns: 20_000_000,
                    },
                    PosixTimer {
                        id: 3,
                        clock: 0,
                        signo: 35,
                        notify: sigev::THREAD_ID,
                        tid: self.threads[0].tid,
                        sigval: 7,
                        value_ns: 0,
                        interval_ns: 0,
                    },
                ],
                itimers: vec![ITimer {
                    which: 0,
                    value_ns: 40_000_000,
                    interval_ns: 50_000_000,
                }],
            },
            seccomp: Seccomp {
                // LD nr; JEQ getppid → ERRNO; RET ALLOW; RET ERRNO|77
                filters: vec![SeccompFilter {
                    flags: 0,
                    insns: vec![
                        0x20,
                        0x0000_006e_0001_0015,
                        0x7fff_0000_0000_0006,
                        0x0005_004d_0000_0006,
                    ],
                }],
                chains: vec![SeccompChain {
                    tid: self.threads[0].tid,
                    filters: vec![0],
                }],
            },
            shm: self.shm.values().map(|(o, _)| o.clone()).collect(),
            pgid: 0,
            sid: 0,
            tree: Vec::new(),
            shared_files: Vec::new(),
            zombies: Vec::new(),
            pending: Vec::new(),
            // A connection whose queues move with the epoch: the receiver carries the
            // unchanged ones over (none here: every checkpoint lists it).
            tcp: vec![TcpConn {
                fd: 14,
                state: 1,
                send_seq: 1000 + self.threads.len() as u32,
                send_queue: b"reply".to_vec(),
                unsent: 2,
                recv_seq: 5000,
                recv_queue: b"GET".to_vec(),
                mss: 1448,
                wscale: Some((7, 7)),
                sack: true,
                timestamp: Some(123_456),
                window: [5000, 65535, 65535, 65535, 5000],
            }],
            // Incremental checkpoints carry a divergence check (its pages need not be held:
            // the decoder only checks their order and number).
            scrub: base.map(|_| tardi_image::scrub::Scrub {
                pages: [HEAP, HEAP + 0x1000]
                    .into_iter()
                    .map(|addr| tardi_image::scrub::PageDigest {
                        addr,
                        content: Some([7; 16]),
                    })
                    .collect(),
                ..Default::default()
            }),
        }
    }

    fn shm_held(&self) -> BTreeMap<ShmId, BTreeMap<u64, Page>> {
        self.shm
            .iter()
            .map(|(id, (_, p))| (*id, nonzero(p)))
            .collect()
    }

    fn anon(&self, addr: u64) -> bool {
        self.vmas
            .iter()
            .any(|v| v.start <= addr && addr < v.end && v.backing == Backing::Anon)
    }

    /// What a receiver holds: zero anonymous pages read as zero without being kept.
    fn held(&self) -> BTreeMap<u64, Page> {
        self.mem
            .iter()
            .filter(|(a, p)| !(self.anon(**a) && is_zero(&p[..])))
            .map(|(a, p)| (*a, p.clone()))
            .collect()
    }

    fn writable(&self) -> Vec<u64> {
        self.vmas
            .iter()
            .filter(|v| {
                v.prot & 2 != 0 && matches!(v.backing, Backing::Anon | Backing::File { .. })
            })
            .flat_map(|v| (v.start..v.end).step_by(PAGE_SIZE))
            .collect()
    }
}

/// Builds a chain of one full checkpoint and `epochs` incremental ones from `seed`.
pub fn build(seed: u64, epochs: usize) -> Chain {
    let rng = &mut StdRng::seed_from_u64(seed);
    let mut p = Proc {
        vmas: vec![
            vma(
                0x40_0000,
                DATA,
                5,
                Backing::File {
                    index: 0,
                    offset: 0,
                },
                "/usr/bin/svc",
            ),
            vma(
                DATA,
                DATA + 0x2000,
                3,
                Backing::File {
                    index: 0,
                    offset: 0x2000,
                },
                "/usr/bin/svc",
            ),
            vma(HEAP, HEAP + 0x4_0000, 3, Backing::Anon, "[heap]"),
            vma(MMAP, MMAP + 0x1_0000, 3, Backing::Anon, ""),
            Vma {
                shared: true,
                ..vma(
                    MMAP + 0x10_0000,
                    MMAP + 0x10_4000,
                    1,
                    Backing::File {
                        index: 1,
                        offset: 0,
                    },
                    "/usr/lib/libc.so.6",
                )
            },
            Vma {
                flags: 1,
                ..vma(STACK, STACK + 0x2_1000, 3, Backing::Anon, "[stack]")
            },
            vma(
                STACK + 0x10_0000,
                STACK + 0x10_2000,
                5,
                Backing::Vdso,
                "[vdso]",
            ),
            // One shared anonymous object mapped twice, a System V segment attached (and
            // marked for removal).
            Vma {
                shared: true,
                ..vma(
                    SHM_MAP,
                    SHM_MAP + 16 * PAGE,
                    3,
                    Backing::Shm {
                        id: ShmId::Anon(77),
                        offset: 0,
                    },
                    "/dev/zero (deleted)",
                )
            },
            Vma {
                shared: true,
                ..vma(
                    SHM_MAP + 0x10_0000,
                    SHM_MAP + 0x10_0000 + 4 * PAGE,
                    1,
                    Backing::Shm {
                        id: ShmId::Anon(77),
                        offset: 8 * PAGE,
                    },
                    "/dev/zero (deleted)",
                )
            },
            Vma {
                shared: true,
                ..vma(
                    SHM_MAP + 0x20_0000,
                    SHM_MAP + 0x20_0000 + 3 * PAGE,
                    3,
                    Backing::Shm {
                        id: ShmId::Sysv(32768),
                        offset: 0,
                    },
                    "/SYSV00000000 (deleted)",
                )
            },
        ],
        mem: BTreeMap::new(),
        threads: (0..3).map(|i| thread(rng, 100 + i)).collect(),
        tree: Tree::default(),
        shm: BTreeMap::new(),
    };
    // The objects: the anonymous one, the attached segment, and one no mapping names.
    for (id, size, sv) in [
        (ShmId::Anon(77), 16 * PAGE, None),
        (ShmId::Sysv(32768), 2 * PAGE + 100, sysv(0, true)),
        (ShmId::Sysv(5), 40 * PAGE, sysv(0x5eed, false)),
    ] {
        let mut pages = BTreeMap::new();
        for off in (0..size).step_by(PAGE_SIZE) {
            if rng.random_bool(0.5) {
                pages.insert(off, content(rng));
            }
        }
        let o = ShmObject {
            id,
            size,
            sysv: sv,
            runs: vec![],
            fresh: false,
        };
        p.shm.insert(id, (o, pages));
    }
    for a in p.writable() {
        if rng.random_bool(0.6) {
            p.mem.insert(a, content(rng));
        }
    }
    p.tree.apply(&FileChanges {
        dirs: vec!["/data".into()],
        upsert: vec![
            (
                "/data/db".into(),
                Entry::File {
                    mode: 0o644,
                    content: b"counter=0".to_vec(),
                },
            ),
            ("/data/sub".into(), Entry::Dir { mode: 0o755 }),
            (
                "/data/sub/x".into(),
                Entry::File {
                    mode: 0o600,
                    content: vec![7; 300],
                },
            ),
            (
                "/data/ln".into(),
                Entry::Symlink {
                    target: "db".into(),
                },
            ),
        ],
        remove: vec![],
        owners: vec![("/data/db".into(), 100, 101)],
    });
    let sandbox = br#"{"name":"svc","link_index":3}"#.to_vec();

    // The full checkpoint: runs of the pages held, coalesced within mappings.
    let mut image = p.image(sandbox.clone(), None);
    let mut carry = MetaCarry::after(&image);
    let mut data = Vec::new();
    let mapping = |x: u64| p.vmas.iter().position(|v| v.start <= x && x < v.end);
    for (a, page) in p.held() {
        match image.runs.last_mut() {
            Some(r) if r.addr + r.len == a && mapping(r.addr) == mapping(a) => r.len += PAGE,
            _ => image.runs.push(PageRun {
                addr: a,
                len: PAGE,
                data_off: data.len() as u64,
            }),
        }
        data.extend_from_slice(&page[..]);
    }
    image.private_files = p.tree.to_changes();
    for o in &mut image.shm {
        o.runs = shm_runs(&nonzero(&p.shm[&o.id].1), &mut data);
    }
    let mut chain = Chain {
        cks: vec![Checkpoint {
            epoch: 0,
            kind: Kind::Full,
            image,
            data,
        }],
        pages: vec![p.held()],
        trees: vec![p.tree.clone()],
        sandboxes: vec![sandbox.clone()],
        shm: vec![p.shm_held()],
    };

    let mut codec = PageCodec::new().expect("zstd context");
    let mut sandbox_now = sandbox;
    let mut next_map = MMAP + 0x20_0000;
    let mut next_tid = 200;
    let mut next_file = 0;
    for epoch in 1..=epochs as u64 {
        // What the receiver holds now: the twins of an encoder that kept them all.
        let twins = p.held();
        let mut reset = Vec::new();
        let mut written: Vec<u64> = Vec::new();
        match rng.random_range(0..6) {
            0 => {
                // A new anonymous mapping, partly written.
                let (s, e) = (next_map, next_map + 8 * PAGE);
                next_map += 0x10_0000;
                p.vmas.push(vma(s, e, 3, Backing::Anon, ""));
                reset.push((s, e));
                for a in (s..e).step_by(PAGE_SIZE) {
                    if rng.random_bool(0.5) {
                        p.mem.insert(a, content(rng));
                        written.push(a);
                    }
                }
            }
            1 => {
                // Unmap a mapping made earlier (or the first mmap region).
                if let Some(i) = p
                    .vmas
                    .iter()
                    .rposition(|v| v.start >= MMAP && v.start < STACK && v.backing == Backing::Anon)
                {
                    let v = p.vmas.remove(i);
                    p.mem.retain(|&a, _| a < v.start || a >= v.end);
                }
            }
            2 => {
                // The heap's upper half replaced (same addresses, fresh contents).
                let (s, e) = (HEAP + 0x2_0000, HEAP + 0x4_0000);
                reset.push((s, e));
                p.mem.retain(|&a, _| a < s || a >= e);
                for a in (s..s + 4 * PAGE).step_by(PAGE_SIZE) {
                    p.mem.insert(a, content(rng));
                    written.push(a);
                }
            }
            _ => {}
        }
        // Pages written during the epoch (including copies-on-write of the data mapping).
        let pool = p.writable();
        for _ in 0..rng.random_range(1..24) {
            let a = pool[rng.random_range(0..pool.len())];
            if written.contains(&a) {
                continue;
            }
            let page = p.mem.entry(a).or_insert_with(|| Box::new([0; PAGE_SIZE]));
            write(rng, page);
            written.push(a);
        }
        // A copy-on-write page of the data mapping reverting to the file (MADV_DONTNEED).
        if rng.random_bool(0.2) {
            p.mem.remove(&DATA);
            written.retain(|&a| a != DATA);
        }
        written.sort_unstable();

        // Encode every written page against the receiver's contents, with a random codec.
        let mut data = Vec::new();
        let mut pages = Vec::new();
        for &a in &written {
            let page = &p.mem[&a];
            let fresh = reset.iter().any(|&(s, e)| s <= a && a < e);
            let twin = if fresh {
                None
            } else {
                Some(twins.get(&a).map_or(&[0u8; PAGE_SIZE][..], |t| &t[..]))
            };
            let off = data.len() as u64;
            let c = Codec::ALL[rng.random_range(0..Codec::ALL.len())];
            let enc = codec.encode_page(c, twin, &page[..], &mut data);
            pages.push(EncodedPage {
                addr: a,
                enc,
                data_off: off,
            });
        }
        // Threads come and go.
        if rng.random_bool(0.2) {
            p.threads.push(thread(rng, next_tid));
            next_tid += 1;
        } else if p.threads.len() > 1 && rng.random_bool(0.2) {
            p.threads.pop();
        }
        for t in &mut p.threads {
            t.regs[16] = rng.random(); // rip
        }
        // Private files: a write, a new file, a removal, a directory replaced by a file.
        let mut ch = FileChanges {
            dirs: vec!["/data".into()],
            ..FileChanges::default()
        };
        if rng.random_bool(0.7) {
            ch.upsert.push((
                "/data/db".into(),
                Entry::File {
                    mode: 0o644,
                    content: format!("counter={epoch}").into_bytes(),
                },
            ));
        }
        if rng.random_bool(0.4) {
            next_file += 1;
            ch.upsert
                .push(("/data/sub".into(), Entry::Dir { mode: 0o755 }));
            ch.upsert.push((
                format!("/data/sub/f{next_file}"),
                Entry::File {
                    mode: 0o644,
                    content: vec![next_file as u8; rng.random_range(0..2000)],
                },
            ));
        }
        if rng.random_bool(0.2) {
            let victim = p.tree.entries.keys().nth(rng.random_range(0..4));
            if let Some(v) = victim.cloned() {
                ch.remove.push(v);
            }
        }
        if rng.random_bool(0.05) {
            ch.upsert.push((
                "/data/sub".into(),
                Entry::File {
                    mode: 0o644,
                    content: b"was a directory".to_vec(),
                },
            ));
        }
        p.tree.apply(&ch);
        // Shared memory: pages of each object written (some zeroed), a segment created, one
        // removed, one replaced by another with the same id.
        let mut shm_written: BTreeMap<ShmId, BTreeMap<u64, Page>> = BTreeMap::new();
        let mut shm_fresh = Vec::new();
        match rng.random_range(0..8) {
            0 => {
                let id = ShmId::Sysv(1000 + epoch as i32);
                let o = ShmObject {
                    id,
                    size: 5 * PAGE,
                    sysv: sysv(epoch as i32, false),
                    runs: vec![],
                    fresh: false,
                };
                p.shm.insert(id, (o, BTreeMap::new()));
                shm_fresh.push(id);
            }
            1 => {
                let victim = p
                    .shm
                    .keys()
                    .copied()
                    .find(|id| id.ne(&ShmId::Anon(77)) && id.ne(&ShmId::Sysv(32768)));
                if let Some(id) = victim {
                    p.shm.remove(&id);
                }
            }
            2 => {
                if let Some((o, pages)) = p.shm.get_mut(&ShmId::Sysv(5)) {
                    o.size = 7 * PAGE;
                    pages.clear();
                    shm_fresh.push(ShmId::Sysv(5));
                }
            }
            _ => {}
        }
        for (id, (o, pages)) in &mut p.shm {
            let n = o.size.div_ceil(PAGE);
            for _ in 0..rng.random_range(0..6) {
                let off = rng.random_range(0..n) * PAGE;
                let page = pages.entry(off).or_insert_with(|| Box::new([0; PAGE_SIZE]));
                write(rng, page);
                shm_written
                    .entry(*id)
                    .or_default()
                    .insert(off, page.clone());
            }
            if shm_fresh.contains(id) {
                shm_written.insert(*id, nonzero(pages));
            }
        }
        // Once in a while the caller attaches a new sandbox description.
        let carried = if rng.random_bool(0.15) {
            sandbox_now = format!(r#"{{"name":"svc","link_index":{epoch}}}"#).into_bytes();
            sandbox_now.clone()
        } else {
            vec![]
        };

        let mut image = p.image(carried, Some(epoch - 1));
        // Mostly, what did not change since the last checkpoint is left out of this one (the
        // epoch loop does that); sometimes everything is sent.
        if rng.random_bool(0.8) {
            carry.leave_out(&mut image);
        } else {
            carry = MetaCarry::after(&image);
        }
        image.reset = reset;
        image.pages = pages;
        image.cow = p
            .mem
            .keys()
            .filter(|&&a| (DATA..DATA + 0x2000).contains(&a))
            .map(|&a| (a, a + PAGE))
            .collect();
        image.private_files = ch;
        for o in &mut image.shm {
            o.fresh = shm_fresh.contains(&o.id);
            o.runs = shm_runs(
                shm_written.get(&o.id).unwrap_or(&BTreeMap::new()),
                &mut data,
            );
        }
        chain.cks.push(Checkpoint {
            epoch,
            kind: Kind::Incremental { base: epoch - 1 },
            image,
            data,
        });
        chain.pages.push(p.held());
        chain.trees.push(p.tree.clone());
        chain.sandboxes.push(sandbox_now.clone());
        chain.shm.push(p.shm_held());
    }
    chain
}

/// Checks that `enc` is one of the encodings the chain generator can produce (for the tests'
/// own sanity: every codec shows up).
pub fn kind_of(enc: PageEncoding) -> &'static str {
    match enc {
        PageEncoding::Zero => "zero",
        PageEncoding::Same => "same",
        PageEncoding::Raw => "raw",
        PageEncoding::Delta {
            codec: Codec::Xdelta3,
            ..
        } => "xdelta3",
        PageEncoding::Delta {
            codec: Codec::XorRuns,
            ..
        } => "xor-runs",
        PageEncoding::Delta { .. } => "xor-zstd",
        PageEncoding::Compressed { .. } => "zstd",
    }
}
