//! Compares the page delta codecs of [`tardi_checkpointer::delta`] on real pages of a running
//! process.
//!
//! Snapshots every present page of the process's private writable mappings twice (or more),
//! `INTERVAL_MS` apart (`/proc/PID/maps` + `/proc/PID/pagemap` + `process_vm_readv`), and for
//! every page whose contents changed encodes the new contents against the old ones (its twin)
//! with each codec, decodes them back and checks the result. Prints per codec: pages, raw
//! bytes, encoded bytes (payload + postcard tag), ratio, mean encode and decode µs per page (best
//! of three passes), and what the pages became.
//!
//! Usage: `codec_compare PID [INTERVAL_MS] [ROUNDS] [--freeze] [--levels L,L,...]`
//! (defaults: 10 ms, 1 round, levels 1,-1,-5). With `ROUNDS` > 1 each snapshot is the twin of
//! the next. `--freeze` stops the process (SIGSTOP) while each snapshot is taken, as a
//! checkpoint would, so that the snapshot is consistent and the interval is running time only;
//! it also keeps the process stopped after the last snapshot while the codecs are timed, so
//! that it does not compete with them for the CPU.
//! Needs the rights to ptrace PID (root).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};
use tardi_checkpointer::delta::{Codec, PAGE_SIZE, PageCodec, PageEncoding};

/// Contents of the present pages of the process at one moment.
struct Snapshot {
    /// Page address → index of the page in `data`.
    index: HashMap<u64, usize>,
    data: Vec<u8>,
}

impl Snapshot {
    fn page(&self, addr: u64) -> Option<&[u8]> {
        self.index
            .get(&addr)
            .map(|&i| &self.data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])
    }
}

/// Private writable mappings of `pid` (anonymous memory, heap, stack, and the copy-on-write
/// data of files), as (start, end).
fn writable_private_mappings(pid: i32) -> std::io::Result<Vec<(u64, u64)>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut v = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let path = f.nth(3).unwrap_or("");
        let perms = perms.as_bytes();
        if perms.len() < 4 || perms[1] != b'w' || perms[3] != b'p' {
            continue;
        }
        if matches!(path, "[vvar]" | "[vdso]" | "[vsyscall]" | "[vvar_vclock]") {
            continue;
        }
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        v.push((s, e));
    }
    Ok(v)
}

/// Reads `len` bytes at `addr` of `pid` into `buf`; how many it could read.
fn read_remote(pid: i32, addr: u64, buf: &mut [u8]) -> usize {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, which is valid for writes of its length for the whole
    // call; `remote` is only an address in the other process, which the kernel checks.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    n.max(0) as usize
}

fn snapshot(pid: i32) -> std::io::Result<Snapshot> {
    let pagemap = File::open(format!("/proc/{pid}/pagemap"))?;
    let mut snap = Snapshot {
        index: HashMap::new(),
        data: Vec::new(),
    };
    let mut entries = Vec::new();
    for (start, end) in writable_private_mappings(pid)? {
        let pages = ((end - start) / PAGE_SIZE as u64) as usize;
        entries.resize(pages * 8, 0u8);
        let first = start / PAGE_SIZE as u64 * 8;
        if pagemap.read_exact_at(&mut entries, first).is_err() {
            continue;
        }
        let present = |i: usize| {
            let e = u64::from_ne_bytes(entries[i * 8..i * 8 + 8].try_into().unwrap());
            e >> 63 == 1
        };
        let mut i = 0;
        while i < pages {
            if !present(i) {
                i += 1;
                continue;
            }
            let run_start = i;
            while i < pages && present(i) {
                i += 1;
            }
            let addr = start + (run_start * PAGE_SIZE) as u64;
            let off = snap.data.len();
            snap.data.resize(off + (i - run_start) * PAGE_SIZE, 0);
            let got = read_remote(pid, addr, &mut snap.data[off..]) / PAGE_SIZE;
            snap.data.truncate(off + got * PAGE_SIZE);
            for p in 0..got {
                snap.index
                    .insert(addr + (p * PAGE_SIZE) as u64, off / PAGE_SIZE + p);
            }
        }
    }
    Ok(snap)
}

/// Stops every thread of `pid` with SIGSTOP until dropped.
struct Frozen(i32);

impl Frozen {
    fn new(pid: i32) -> Frozen {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let frozen = Frozen(pid);
        let deadline = Instant::now() + Duration::from_secs(2);
        while !all_stopped(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
        frozen
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

fn all_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
            let state = s.rsplit_once(") ").map(|(_, r)| r.as_bytes()[0]);
            matches!(state, Some(b'T' | b't' | b'Z' | b'X'))
        })
    })
}

fn take(pid: i32, frozen: Option<Frozen>) -> Snapshot {
    let t = Instant::now();
    let s = snapshot(pid).unwrap_or_else(|e| {
        eprintln!("snapshot of {pid}: {e}");
        std::process::exit(1);
    });
    eprintln!(
        "snapshot: {} present pages ({} MiB) in {:.1} ms",
        s.index.len(),
        s.data.len() >> 20,
        t.elapsed().as_secs_f64() * 1e3
    );
    drop(frozen);
    s
}

/// Pages that changed between two snapshots: (old, new) contents back to back.
#[derive(Default)]
struct Changed {
    pairs: Vec<u8>,
    /// Pages present only in the newer snapshot (no twin).
    new_pages: Vec<u8>,
}

impl Changed {
    fn len(&self) -> usize {
        self.pairs.len() / (2 * PAGE_SIZE)
    }
    fn pair(&self, i: usize) -> (&[u8], &[u8]) {
        let p = &self.pairs[i * 2 * PAGE_SIZE..(i + 1) * 2 * PAGE_SIZE];
        p.split_at(PAGE_SIZE)
    }
}

fn diff(old: &Snapshot, new: &Snapshot, into: &mut Changed) {
    let mut addrs: Vec<u64> = new.index.keys().copied().collect();
    addrs.sort_unstable();
    for a in addrs {
        let page = new.page(a).unwrap();
        match old.page(a) {
            Some(twin) if twin != page => {
                into.pairs.extend_from_slice(twin);
                into.pairs.extend_from_slice(page);
            }
            Some(_) => {}
            None => into.new_pages.extend_from_slice(page),
        }
    }
}

struct Row {
    label: String,
    pages: usize,
    encoded: usize,
    enc_us: f64,
    dec_us: f64,
    kinds: [usize; 5],
}

fn kind(e: PageEncoding) -> usize {
    match e {
        PageEncoding::Zero => 0,
        PageEncoding::Same => 1,
        PageEncoding::Raw => 2,
        PageEncoding::Delta { .. } => 3,
        PageEncoding::Compressed { .. } => 4,
    }
}

/// Encodes every changed page with `codec` at `level`, against its twin when `use_twin`,
/// decodes it back and checks it. Times are the best of three passes over all pages (the
/// machine may be shared), each pass timed as a whole.
fn measure(changed: &Changed, codec: Codec, level: i32, use_twin: bool) -> Row {
    let n = changed.len();
    let mut pc = PageCodec::with_level(level).expect("zstd context");
    // Output buffer already faulted in, as the checkpointer's reused buffer would be.
    let mut out = vec![1u8; n * PAGE_SIZE];
    let mut encs = Vec::with_capacity(n);
    let mut enc_time = Duration::MAX;
    for _ in 0..3 {
        out.clear();
        encs.clear();
        let t = Instant::now();
        for i in 0..n {
            let (twin, page) = changed.pair(i);
            encs.push(pc.encode_page(codec, use_twin.then_some(twin), page, &mut out));
        }
        enc_time = enc_time.min(t.elapsed());
    }
    let mut back = [0u8; PAGE_SIZE];
    let mut dec_time = Duration::MAX;
    for pass in 0..4 {
        let t = Instant::now();
        let mut off = 0;
        for (i, &e) in encs.iter().enumerate() {
            let (twin, page) = changed.pair(i);
            let bytes = &out[off..off + e.encoded_len()];
            off += e.encoded_len();
            let r = pc.decode_page(e, use_twin.then_some(twin), bytes, &mut back);
            if pass == 0 {
                // The checking pass, not timed.
                if let Err(err) = r {
                    panic!("{codec} level {level}: page {i} ({e:?}) does not decode: {err}");
                }
                assert!(
                    back[..] == *page,
                    "{codec} level {level}: page {i} ({e:?}) decodes wrong"
                );
            }
        }
        if pass > 0 {
            dec_time = dec_time.min(t.elapsed());
        }
    }
    let mut kinds = [0; 5];
    let mut tags = 0;
    for &e in &encs {
        kinds[kind(e)] += 1;
        tags += postcard::to_allocvec(&e).unwrap().len();
    }
    let label = match codec {
        Codec::XorZstd | Codec::Zstd => format!("{codec} {level}"),
        _ => codec.to_string(),
    };
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
    Row {
        label,
        pages: n,
        encoded: out.len() + tags,
        enc_us: per(enc_time),
        dec_us: per(dec_time),
        kinds,
    }
}

/// Distribution of the number of bytes that differ between page and twin.
fn changed_bytes_histogram(changed: &Changed) -> String {
    let bounds = [1, 8, 64, 512, 2048, PAGE_SIZE];
    let mut counts = [0usize; 6];
    for i in 0..changed.len() {
        let (a, b) = changed.pair(i);
        let d = a.iter().zip(b).filter(|(x, y)| x != y).count();
        counts[bounds.iter().position(|&u| d <= u).unwrap()] += 1;
    }
    let mut s = String::new();
    let mut lo = 1;
    for (u, c) in bounds.iter().zip(counts) {
        s += &format!(" {lo}-{u}:{c}");
        lo = u + 1;
    }
    s
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let freeze = if let Some(i) = args.iter().position(|a| a == "--freeze") {
        args.remove(i);
        true
    } else {
        false
    };
    let mut levels = vec![1, -1, -5];
    if let Some(i) = args.iter().position(|a| a == "--levels") {
        args.remove(i);
        if i >= args.len() {
            eprintln!("--levels needs a comma-separated list");
            std::process::exit(2);
        }
        levels = args
            .remove(i)
            .split(',')
            .map(|l| l.trim().parse().expect("level"))
            .collect();
    }
    if args.is_empty() {
        eprintln!("usage: codec_compare PID [INTERVAL_MS] [ROUNDS] [--freeze] [--levels L,L,...]");
        std::process::exit(2);
    }
    let pid: i32 = args[0].parse().expect("PID");
    let interval =
        Duration::from_millis(args.get(1).map_or(10, |s| s.parse().expect("INTERVAL_MS")));
    let rounds: usize = args.get(2).map_or(1, |s| s.parse().expect("ROUNDS"));

    let mut changed = Changed::default();
    let freeze_now = || freeze.then(|| Frozen::new(pid));
    let mut old = take(pid, freeze_now());
    for _ in 1..rounds {
        std::thread::sleep(interval);
        let new = take(pid, freeze_now());
        diff(&old, &new, &mut changed);
        old = new;
    }
    std::thread::sleep(interval);
    // The last snapshot; with --freeze the process stays stopped until the end.
    let frozen = freeze_now();
    let new = take(pid, None);
    diff(&old, &new, &mut changed);
    drop((old, new));
    println!(
        "pid {pid}, interval {} ms, {rounds} round(s){}: {} changed pages, {} newly present pages",
        interval.as_millis(),
        if freeze {
            ", frozen while snapshotting"
        } else {
            ""
        },
        changed.len(),
        changed.new_pages.len() / PAGE_SIZE
    );
    println!(
        "bytes differing per changed page:{}",
        changed_bytes_histogram(&changed)
    );
    if changed.len() == 0 {
        return;
    }

    let mut configs = vec![(Codec::Xdelta3, 0, true), (Codec::XorRuns, 1, true)];
    configs.extend(levels.iter().map(|&l| (Codec::XorZstd, l, true)));
    configs.extend(levels.iter().map(|&l| (Codec::Zstd, l, false)));
    configs.push((Codec::Raw, 0, false));
    println!(
        "{:<12} {:>8} {:>12} {:>12} {:>7} {:>8} {:>8}   zero/same/raw/delta/compressed",
        "codec", "pages", "raw B", "encoded B", "ratio", "enc µs", "dec µs"
    );
    for (codec, level, use_twin) in configs {
        let r = measure(&changed, codec, level, use_twin);
        let raw = r.pages * PAGE_SIZE;
        println!(
            "{:<12} {:>8} {:>12} {:>12} {:>7.2} {:>8.2} {:>8.2}   {}/{}/{}/{}/{}",
            r.label,
            r.pages,
            raw,
            r.encoded,
            raw as f64 / r.encoded.max(1) as f64,
            r.enc_us,
            r.dec_us,
            r.kinds[0],
            r.kinds[1],
            r.kinds[2],
            r.kinds[3],
            r.kinds[4]
        );
    }
    drop(frozen);
}
