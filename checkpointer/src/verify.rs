//! Byte-for-byte comparison of a process image with the live process it was taken from. The
//! process must be stopped in exactly the state the image describes (see
//! [`crate::epoch::Epochs::next_held`]).
//!
//! What is compared: the layout (every mapping's range, protection, sharing, name; neighbours
//! that agree in everything merged, as the process cannot tell them apart), then the
//! contents of every private mapping page by page: the image's page if it has one, else what a
//! restore would show there (zeros for anonymous memory, the file's bytes for a file mapping),
//! and every mapping of a shared memory object against the object's pages, which the main
//! process's image holds for a whole tree ([`compare_live_shm`]).

use crate::image::Backing;
use crate::procfs::Proc;
use crate::store::Image;
use crate::sys::Pid;
use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::FileExt;

const PAGE: usize = crate::os::ranges::PAGE as usize;

/// Differences found (empty: identical). At most `limit` are listed.
pub fn compare_live(pid: Pid, image: &Image, limit: usize) -> io::Result<Vec<String>> {
    let proc = Proc::open(pid)?;
    // With the mprotect tracker's agent, armed pages read as read-only: compare what the app
    // asked for.
    // Neighbours that agree in everything are one range as far as the process can tell, and
    // where the kernel (or a tracker's bookkeeping) splits them varies: compare merged layouts.
    let maps = merge_live(crate::agent::app_layout(pid, proc.maps()?));
    let vmas = merge_vmas(&image.meta.vmas);
    let mem = proc.open_file("mem", libc::O_RDONLY)?;
    let mut diffs = Vec::new();

    // Range, protection, sharing, and for file mappings the offset.
    let live: Vec<_> = maps
        .iter()
        .filter(|m| m.name != "[vsyscall]")
        .map(|m| {
            (
                m.start,
                m.end,
                m.prot(),
                m.shared,
                // (A System V segment's inode is its id, which may be 0.)
                (m.inode != 0 && m.name.starts_with('/') || crate::shm::object_of(m).is_some())
                    .then_some(m.offset),
            )
        })
        .collect();
    let img: Vec<_> = vmas
        .iter()
        .map(|v| {
            // (`maps` shows a shared memory object's mappings with their offset in it too.)
            let off = match v.backing {
                Backing::File { offset, .. } | Backing::Shm { offset, .. } => Some(offset),
                _ => None,
            };
            (v.start, v.end, v.prot, v.shared, off)
        })
        .collect();
    if let Some(d) = layout_difference(&live, &img, "in the image") {
        diffs.push(d);
        return Ok(diffs);
    }

    let mut live_buf = vec![0u8; 1 << 20];
    let mut file_page = vec![0u8; PAGE];
    for (m, v) in maps.iter().filter(|m| m.name != "[vsyscall]").zip(&vmas) {
        if v.backing == Backing::Vdso || m.shared {
            continue;
        }
        // map_files names the kernel's mapping, which the agent's protection may have split.
        let file = match v.backing {
            Backing::File { .. } => Some(proc.open_file(
                &format!("map_files/{:x}-{:x}", m.kernel.0, m.kernel.1),
                libc::O_RDONLY,
            )?),
            _ => None,
        };
        let mut at = m.start;
        while at < m.end {
            let len = ((m.end - at) as usize).min(live_buf.len());
            let chunk = &mut live_buf[..len];
            let readable = mem.read_exact_at(chunk, at).is_ok();
            for p in 0..len / PAGE {
                let addr = at + (p * PAGE) as u64;
                let live_page = &chunk[p * PAGE..(p + 1) * PAGE];
                let expected: &[u8] = match image.page(addr) {
                    Some(pg) => &pg[..],
                    None => match &file {
                        Some(f) => {
                            file_page.fill(0);
                            let off = m.offset + (addr - m.start);
                            let _ = f.read_at(&mut file_page, off);
                            &file_page
                        }
                        None => &[0u8; PAGE][..],
                    },
                };
                if !readable {
                    // A page the kernel cannot read (past the end of a mapped file): compare
                    // page by page to find out.
                    let mut one = [0u8; PAGE];
                    if mem.read_exact_at(&mut one, addr).is_err() {
                        if image.page(addr).is_some() {
                            diffs.push(format!(
                                "page {addr:#x} ({}) is unreadable live but saved in the image",
                                m.name
                            ));
                        }
                        continue;
                    }
                    if one[..] != *expected {
                        push_diff(&mut diffs, addr, &m.name, &one, expected);
                    }
                } else if live_page != expected {
                    let mut source = if image.page(addr).is_some() {
                        "image page"
                    } else {
                        "file or zero"
                    }
                    .to_string();
                    if let Some(f) = &file {
                        let mut fp = vec![0u8; PAGE];
                        let _ = f.read_at(&mut fp, m.offset + (addr - m.start));
                        source.push_str(if fp[..] == *live_page {
                            ", live == file"
                        } else {
                            ", live != file"
                        });
                    }
                    push_diff(
                        &mut diffs,
                        addr,
                        &format!(
                            "{} {:#x}-{:#x} [{source}, off {:#x}]",
                            m.name,
                            m.start,
                            m.end,
                            m.offset + (addr - m.start)
                        ),
                        live_page,
                        expected,
                    );
                }
                if diffs.len() >= limit {
                    return Ok(diffs);
                }
            }
            at += len as u64;
        }
    }
    Ok(diffs)
}

/// The host PID of every process of the tree under `root` (itself included), by its PID in
/// the sandbox (the last number of `NSpid`). Zombies are not listed ([`tree_zombies`]).
pub fn tree_pids(root: Pid) -> io::Result<BTreeMap<i32, Pid>> {
    Ok(walk_tree(root)?.0)
}

/// The zombies of the tree under `root` (children that exited and were not reaped), by their
/// PID in the sandbox, with their wait status (`/proc/PID/stat`'s `exit_code`).
pub fn tree_zombies(root: Pid) -> io::Result<BTreeMap<i32, i32>> {
    Ok(walk_tree(root)?.1)
}

/// [`tree_pids`] and [`tree_zombies`] in one walk.
fn walk_tree(root: Pid) -> io::Result<(BTreeMap<i32, Pid>, BTreeMap<i32, i32>)> {
    let (mut live, mut zombies) = (BTreeMap::new(), BTreeMap::new());
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        let proc = Proc::open(p)?;
        let status = proc.read_string("status")?;
        let ns = crate::procfs::status_ns_last(&status, "NSpid")
            .ok_or_else(|| io::Error::other(format!("process {p}: no NSpid")))?;
        let fields = proc.stat_fields()?;
        if fields.get(2).is_some_and(|s| s == "Z") {
            let code = fields.get(51).and_then(|f| f.parse().ok()).unwrap_or(-1);
            zombies.insert(ns, code);
            continue;
        }
        live.insert(ns, p);
        let tids = proc.tids()?;
        todo.extend(crate::capture::children_of(&proc, &tids));
    }
    Ok((live, zombies))
}

/// The images of every process of `image`'s tree (the main process first), by PID in the
/// sandbox.
fn tree_images(image: &Image) -> Vec<(i32, &Image)> {
    std::iter::once((image.meta.pid, image))
        .chain(image.members().map(|(_, m)| (m.meta.pid, m)))
        .collect()
}

/// The mappings of shared memory objects (`Backing::Shm`) of every process of the tree under
/// `root` (stopped; a single process alone) against the objects' pages, which the main
/// process's image holds for the whole tree: byte for byte, what a restore would map there
/// (a page the image does not hold reads as zeros).
pub fn compare_live_shm(root: Pid, image: &Image, limit: usize) -> io::Result<Vec<String>> {
    let live = if image.members().next().is_none() {
        BTreeMap::from([(image.meta.pid, root)])
    } else {
        tree_pids(root)?
    };
    let zero = [0u8; PAGE];
    let mut diffs = Vec::new();
    for (pid, img) in tree_images(image) {
        let Some(&host) = live.get(&pid) else {
            diffs.push(format!("process {pid} is in the image, not live"));
            continue;
        };
        let mem = Proc::open(host)?.open_file("mem", libc::O_RDONLY)?;
        for v in &img.meta.vmas {
            let Backing::Shm { id, offset } = v.backing else {
                continue;
            };
            let Some(size) = image.meta.shm.iter().find(|o| o.id == id).map(|o| o.size) else {
                diffs.push(format!(
                    "process {pid}: mapping at {:#x} names shared memory {id:?}, not in the image",
                    v.start
                ));
                continue;
            };
            let pages = image.shm_pages(id);
            let mut at = v.start;
            while at < v.end {
                let off = offset + (at - v.start);
                // Past the object's end the mapping cannot be read (SIGBUS): nothing to compare.
                if off >= size {
                    break;
                }
                let mut live_page = [0u8; PAGE];
                if mem.read_exact_at(&mut live_page, at).is_err() {
                    // The object's last, partial page: read what can be.
                    let n = (size - off).min(PAGE as u64) as usize;
                    live_page.fill(0);
                    if mem.read_exact_at(&mut live_page[..n], at).is_err() {
                        diffs.push(format!(
                            "process {pid}: shared memory {id:?} at {at:#x} is unreadable"
                        ));
                        break;
                    }
                }
                let expected = pages.and_then(|p| p.get(&off)).map_or(&zero, |b| &**b);
                if live_page != *expected {
                    push_diff(
                        &mut diffs,
                        at,
                        &format!("process {pid}: shared memory {id:?} offset {off:#x}"),
                        &live_page,
                        expected,
                    );
                    if diffs.len() >= limit {
                        return Ok(diffs);
                    }
                }
                at += PAGE as u64;
            }
        }
    }
    Ok(diffs)
}

/// [`compare_live`] for a process tree: the live tree under `root` (stopped) must have the
/// image's processes, each with its image's memory. For a single process, [`compare_live`].
/// Then the shared memory objects every process maps ([`compare_live_shm`]).
pub fn compare_live_tree(root: Pid, image: &Image, limit: usize) -> io::Result<Vec<String>> {
    let mut diffs = compare_live_tree_private(root, image, limit)?;
    if diffs.is_empty() {
        diffs = compare_live_shm(root, image, limit)?;
    }
    Ok(diffs)
}

/// [`compare_live_tree`] without the shared memory objects.
fn compare_live_tree_private(root: Pid, image: &Image, limit: usize) -> io::Result<Vec<String>> {
    // The zombies: the same PIDs, with the same wait statuses.
    let zombies = tree_zombies(root)?;
    let listed: BTreeMap<i32, i32> = image
        .meta
        .zombies
        .iter()
        .map(|z| (z.pid, z.status))
        .collect();
    if zombies != listed {
        return Ok(vec![format!(
            "zombies (PID: wait status) {listed:?} in the image, {zombies:?} live"
        )]);
    }
    if image.members().next().is_none() {
        return compare_live(root, image, limit);
    }
    let live = tree_pids(root)?;
    let images = tree_images(image);
    let mut pids: Vec<i32> = images.iter().map(|i| i.0).collect();
    pids.sort_unstable();
    let have: Vec<i32> = live.keys().copied().collect();
    if pids != have {
        return Ok(vec![format!(
            "processes {pids:?} in the image, {have:?} live"
        )]);
    }
    let mut diffs = Vec::new();
    for (pid, img) in images {
        let left = limit.saturating_sub(diffs.len());
        for d in compare_live(live[&pid], img, left)? {
            diffs.push(format!("process {pid}: {d}"));
        }
        if diffs.len() >= limit {
            break;
        }
    }
    Ok(diffs)
}

/// [`compare_processes`] for every process of a tree: the live tree under `live_root`
/// (stopped) against the restored one held in `held` ([`crate::restore::finish_held_tree`]),
/// process by process (by PID in the sandbox), `image` giving each one's volatile bytes.
pub fn compare_processes_tree(
    live_root: Pid,
    held: &[crate::restore::HeldProcess],
    image: &Image,
    limit: usize,
) -> io::Result<Vec<String>> {
    let live = tree_pids(live_root)?;
    let images = tree_images(image);
    let mut diffs = Vec::new();
    if live.len() != held.len() {
        diffs.push(format!(
            "{} processes live, {} restored",
            live.len(),
            held.len()
        ));
        return Ok(diffs);
    }
    for h in held {
        let (Some(&host), Some((_, img))) =
            (live.get(&h.pid), images.iter().find(|i| i.0 == h.pid))
        else {
            diffs.push(format!("process {} was restored but is not live", h.pid));
            continue;
        };
        let volatile = rseq_areas(img);
        let left = limit.saturating_sub(diffs.len());
        for d in compare_processes(host, h.host, h.blob, &volatile, left)? {
            diffs.push(format!("process {}: {d}", h.pid));
        }
        if diffs.len() >= limit {
            break;
        }
    }
    Ok(diffs)
}

/// Adjacent mappings with the same protection, sharing, name and backing (contiguous file
/// offsets) as one.
fn merge_live(maps: Vec<crate::procfs::MapEntry>) -> Vec<crate::procfs::MapEntry> {
    let mut out: Vec<crate::procfs::MapEntry> = Vec::with_capacity(maps.len());
    for m in maps {
        if let Some(l) = out.last_mut()
            && l.end == m.start
            && l.prot() == m.prot()
            && l.shared == m.shared
            && l.inode == m.inode
            && l.name == m.name
            && (m.inode == 0 || l.offset + (l.end - l.start) == m.offset)
            && !matches!(m.name.as_str(), "[vvar]" | "[vvar_vclock]" | "[vdso]")
        {
            l.end = m.end;
            continue;
        }
        out.push(m);
    }
    out
}

/// [`merge_live`] for an image's mappings.
fn merge_vmas(vmas: &[crate::image::Vma]) -> Vec<crate::image::Vma> {
    let mut out: Vec<crate::image::Vma> = Vec::with_capacity(vmas.len());
    for v in vmas {
        if let Some(l) = out.last_mut()
            && l.end == v.start
            && l.prot == v.prot
            && l.shared == v.shared
            && l.name == v.name
            && match (l.backing, v.backing) {
                (Backing::Anon, Backing::Anon) => true,
                (
                    Backing::File {
                        index: a,
                        offset: o,
                    },
                    Backing::File {
                        index: b,
                        offset: p,
                    },
                ) => a == b && o + (l.end - l.start) == p,
                _ => false,
            }
        {
            l.end = v.end;
            continue;
        }
        out.push(v.clone());
    }
    out
}

/// Describes the first difference between two layouts (`other` is `what`: "restored", ...).
fn layout_difference<T: PartialEq + std::fmt::Debug>(
    live: &[T],
    other: &[T],
    what: &str,
) -> Option<String> {
    if live == other {
        return None;
    }
    let first = live
        .iter()
        .zip(other)
        .position(|(a, b)| a != b)
        .unwrap_or(live.len().min(other.len()));
    Some(format!(
        "layout differs ({} live mappings, {} {what}); first difference at #{first}: live {:x?}, {what} {:x?}",
        live.len(),
        other.len(),
        live.get(first),
        other.get(first)
    ))
}

type Shape = (u64, u64, u32, bool, String);

fn merged_layout(maps: &[crate::procfs::MapEntry]) -> Vec<Shape> {
    let mut out: Vec<(Shape, u64)> = Vec::new();
    for m in maps {
        let file = m.inode != 0 && m.name.starts_with('/');
        // A file unlinked while mapped shared comes back as shared anonymous memory, which is
        // what a restore shows for it (see `crate::shm`).
        let name = match crate::shm::object_of(m) {
            Some(crate::image::ShmId::Unlinked { .. }) => "/dev/zero (deleted)",
            _ => m.name.as_str(),
        };
        if let Some((last, off)) = out.last_mut()
            && last.1 == m.start
            && last.2 == m.prot()
            && last.3 == m.shared
            && last.4 == name
            && (!file || *off + (last.1 - last.0) == m.offset)
        {
            last.1 = m.end;
            continue;
        }
        out.push((
            (m.start, m.end, m.prot(), m.shared, name.to_string()),
            m.offset,
        ));
    }
    out.into_iter().map(|(s, _)| s).collect()
}

/// The rseq areas of an image's threads, as ranges for [`compare_processes`].
pub fn rseq_areas(image: &Image) -> Vec<(u64, u64)> {
    image
        .meta
        .threads
        .iter()
        .filter_map(|t| t.rseq.map(|r| (r.addr, r.addr + r.len as u64)))
        .collect()
}

fn push_diff(diffs: &mut Vec<String>, addr: u64, name: &str, live: &[u8], image: &[u8]) {
    let i = live
        .iter()
        .zip(image)
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    diffs.push(format!(
        "page {addr:#x} ({}) differs at byte {i}: live {:02x}, image {:02x}",
        if name.is_empty() { "anonymous" } else { name },
        live[i],
        image[i]
    ));
}

/// Compares two stopped processes — a live one and one restored from its checkpoint and held
/// before running (see [`crate::restore::finish_held`]) — mapping by mapping and byte by byte.
/// Private memory and shared memory objects are compared; files mapped shared are not.
/// `skip` is the restorer's own range in the restored process. The vDSO set is skipped (the
/// kernel's, with live clock data), and so are the bytes in `volatile`: the threads' rseq areas
/// ([`rseq_areas`]), which the kernel rewrites with the CPU a thread last ran on.
pub fn compare_processes(
    live: Pid,
    restored: Pid,
    skip: (u64, u64),
    volatile: &[(u64, u64)],
    limit: usize,
) -> io::Result<Vec<String>> {
    let (a, b) = (Proc::open(live)?, Proc::open(restored)?);
    let keep = |m: &crate::procfs::MapEntry| {
        m.name != "[vsyscall]" && !(m.start >= skip.0 && m.end <= skip.1)
    };
    let am: Vec<_> = crate::agent::app_layout(live, a.maps()?)
        .into_iter()
        .filter(keep)
        .collect();
    let bm: Vec<_> = b.maps()?.into_iter().filter(keep).collect();
    // Adjacent mappings with the same attributes (and, for files, contiguous offsets) are one
    // range as far as the process can tell: the kernel merges such neighbours when a restore
    // recreates them, while the live process may keep them split (for instance by when each
    // part was registered for tracking). Compare the merged layouts.
    let (sa, sb) = (merged_layout(&am), merged_layout(&bm));
    let mut diffs = Vec::new();
    if let Some(d) = layout_difference(&sa, &sb, "restored") {
        diffs.push(d);
        return Ok(diffs);
    }
    let (amem, bmem) = (
        a.open_file("mem", libc::O_RDONLY)?,
        b.open_file("mem", libc::O_RDONLY)?,
    );
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    for m in am
        .iter()
        // Shared memory objects too (each process's view of them), not files mapped shared.
        .filter(|m| {
            (!m.shared || crate::shm::object_of(m).is_some())
                && !matches!(m.name.as_str(), "[vvar]" | "[vvar_vclock]" | "[vdso]")
        })
    {
        let mut at = m.start;
        while at < m.end {
            let len = ((m.end - at) as usize).min(x.len());
            let (ra, rb) = (
                amem.read_exact_at(&mut x[..len], at),
                bmem.read_exact_at(&mut y[..len], at),
            );
            if ra.is_err() || rb.is_err() {
                // Page by page where the kernel cannot read (past the end of a mapped file).
                for p in 0..len / PAGE {
                    let addr = at + (p * PAGE) as u64;
                    let (mut pa, mut pb) = ([0u8; PAGE], [0u8; PAGE]);
                    let (ka, kb) = (
                        amem.read_exact_at(&mut pa, addr).is_ok(),
                        bmem.read_exact_at(&mut pb, addr).is_ok(),
                    );
                    if ka != kb || pa != pb {
                        push_diff(&mut diffs, addr, &m.name, &pa, &pb);
                    }
                }
            } else if x[..len] != y[..len] {
                for p in 0..len / PAGE {
                    let r = p * PAGE..(p + 1) * PAGE;
                    let base = at + (p * PAGE) as u64;
                    let real =
                        x[r.clone()]
                            .iter()
                            .zip(&y[r.clone()])
                            .enumerate()
                            .any(|(i, (u, v))| {
                                u != v
                                    && !volatile.iter().any(|&(s, e)| {
                                        s <= base + i as u64 && base + (i as u64) < e
                                    })
                            });
                    if real {
                        push_diff(&mut diffs, base, &m.name, &x[r.clone()], &y[r]);
                        if diffs.len() >= limit {
                            return Ok(diffs);
                        }
                    }
                }
            }
            at += len as u64;
        }
    }
    Ok(diffs)
}
