//! Memory: which mappings are described and how, which pages are saved, and copying them out
//! of the stopped process.

#[allow(unused_imports)]
use super::*;

/// Walks the mappings, decides what each needs, and copies the saved pages.
pub(super) fn capture_memory(
    proc: &Proc,
    maps: &[MapEntry],
    data: Vec<u8>,
) -> Result<CapturedMemory> {
    let (vmas, mut files) = describe_vmas(maps)?;
    for f in &mut files {
        f.open(proc)?;
    }
    let (runs, data) = copy_saved(proc, maps, &vmas, data)?;
    Ok((vmas, runs, data, files))
}

/// Copies the pages a full checkpoint saves of `maps` (which [`describe_vmas`] described as
/// `vmas`) into `data`; returns their runs.
pub(crate) fn copy_saved(
    proc: &Proc,
    maps: &[MapEntry],
    vmas: &[Vma],
    data: Vec<u8>,
) -> Result<(Vec<PageRun>, Vec<u8>)> {
    let pid = proc.pid;
    // (addr, len, readable) of every range to save.
    let mut want: Vec<(u64, u64, bool)> = Vec::new();
    let pagemap = proc
        .open_file("pagemap", libc::O_RDONLY)
        .map_err(proc_err(pid, "pagemap"))?;
    let mut pm_buf: Vec<u64> = Vec::new();
    let swap = crate::track::swap_active();
    for (m, v) in maps.iter().filter(|m| m.name != "[vsyscall]").zip(vmas) {
        if v.backing == Backing::Vdso || m.shared {
            continue; // recreated by the kernel, or the file holds the data
        }
        saved_ranges(&pagemap, swap, m, &mut pm_buf, &mut want)
            .map_err(proc_err(pid, "pagemap"))?;
    }
    copy_ranges(proc, &want, data)
}

/// Is this mapping private memory that write tracking covers (not the vDSO, not shared)?
pub(crate) fn trackable(m: &MapEntry) -> bool {
    !m.shared
        && !matches!(
            m.name.as_str(),
            "[vvar]" | "[vvar_vclock]" | "[vdso]" | "[vsyscall]"
        )
}

/// The image's description of each mapping (all but `[vsyscall]`, in order), and the mapped
/// files to identify. Refuses mappings it cannot restore.
pub(crate) fn describe_vmas(maps: &[MapEntry]) -> Result<(Vec<Vma>, Vec<PendingFile>)> {
    let mut vmas = Vec::new();
    let mut files: Vec<PendingFile> = Vec::new();
    let mut file_index: HashMap<String, u32> = HashMap::new();
    for m in maps {
        let name = m.name.as_str();
        if name == "[vsyscall]" {
            continue;
        }
        let vdso = matches!(name, "[vvar]" | "[vvar_vclock]" | "[vdso]");
        for (flag, what) in [
            ("ht", "hugetlb mapping"),
            ("io", "I/O memory mapping"),
            ("pf", "PFN mapping"),
            ("ss", "shadow stack"),
            ("um", "userfaultfd-registered mapping (missing mode)"),
        ] {
            if m.has_flag(flag) && !vdso {
                return Err(CaptureError::Unsupported(format!(
                    "{what} at {:#x}-{:#x} ({name})",
                    m.start, m.end
                )));
            }
        }
        let mut flags = 0u32;
        for (f, bit) in [
            ("gd", abi::VMA_GROWSDOWN),
            ("dc", abi::VMA_DONTFORK),
            ("wf", abi::VMA_WIPEONFORK),
            ("dd", abi::VMA_DONTDUMP),
            ("hg", abi::VMA_HUGEPAGE),
            ("nh", abi::VMA_NOHUGEPAGE),
        ] {
            if m.has_flag(f) {
                flags |= bit;
            }
        }
        let file_backed = is_file_backed(m);
        // Shared anonymous memory (the kernel shows it as a deleted /dev/zero) and System V
        // segments (/SYSV...) are objects of their own (`crate::shm`), captured once each.
        let shm = crate::shm::object_of(m);
        if let Some(ShmId::Sysv(id)) = shm {
            // Restored with `shmat` at the attachment's start and cut to the pieces the
            // process kept: the attachment's first page must still be there.
            let head = m.start.checked_sub(m.offset);
            if !maps
                .iter()
                .any(|h| crate::shm::object_of(h) == shm && h.offset == 0 && Some(h.start) == head)
            {
                return Err(CaptureError::Unsupported(format!(
                    "System V segment {id} mapped at {:#x} without the start of its attachment \
                     (the start was unmapped)",
                    m.start
                )));
            }
            // Attached read-only (`SHM_RDONLY`): no write permission, ever.
            if !m.has_flag("mw") {
                flags |= abi::VMA_SHM_RDONLY;
            }
        } else if m.shared && (!file_backed || name.starts_with("/SYSV")) {
            return Err(CaptureError::Unsupported(format!(
                "shared mapping at {:#x}-{:#x} ({}) of an unknown kind",
                m.start,
                m.end,
                if name.is_empty() { "anonymous" } else { name }
            )));
        }
        if shm.is_none() && file_backed && name.ends_with(" (deleted)") {
            return Err(CaptureError::Unsupported(format!(
                "mapping at {:#x} of a deleted file {name}",
                m.start
            )));
        }
        let backing = if vdso {
            Backing::Vdso
        } else if let Some(id) = shm {
            Backing::Shm {
                id,
                offset: m.offset,
            }
        } else if file_backed {
            let next = files.len() as u32;
            let index = *file_index.entry(name.to_string()).or_insert_with(|| {
                files.push(PendingFile {
                    path: name.to_string(),
                    map_file: format!("map_files/{:x}-{:x}", m.kernel.0, m.kernel.1),
                    inode: m.inode,
                    opened: None,
                });
                next
            });
            Backing::File {
                index,
                offset: m.offset,
            }
        } else {
            Backing::Anon
        };
        vmas.push(Vma {
            start: m.start,
            end: m.end,
            prot: m.prot(),
            shared: m.shared,
            flags,
            backing,
            name: name.to_string(),
        });
    }
    Ok((vmas, files))
}

pub(crate) fn is_file_backed(m: &MapEntry) -> bool {
    m.inode != 0 && m.name.starts_with('/')
}

/// Appends the ranges of `m` to save: pages that exist (present or swapped) and, for file
/// mappings, only those copied on write (not backed by the file's page cache).
pub(super) fn saved_ranges(
    pagemap: &std::fs::File,
    swap: bool,
    m: &MapEntry,
    pm_buf: &mut Vec<u64>,
    want: &mut Vec<(u64, u64, bool)>,
) -> io::Result<()> {
    let file_backed = is_file_backed(m);
    let n = ((m.end - m.start) / PAGE) as usize;
    pm_buf.resize(n, 0);
    read_pagemap(pagemap, m.start, pm_buf)?;
    let keep = |e: u64| {
        let present = e & (1 << 63) != 0;
        // Without swap, "swapped" is a userfaultfd marker on an empty entry (see track.rs).
        let swapped = swap && e & (1 << 62) != 0;
        let file_page = e & (1 << 61) != 0;
        swapped || (present && !(file_backed && file_page))
    };
    let mut i = 0;
    while i < n {
        if !keep(pm_buf[i]) {
            i += 1;
            continue;
        }
        let s = i;
        while i < n && keep(pm_buf[i]) {
            i += 1;
        }
        want.push((m.start + s as u64 * PAGE, (i - s) as u64 * PAGE, m.read));
    }
    Ok(())
}

/// Copies `want` ranges (addr, len, readable) into `data` (grown if needed); returns their runs.
pub(crate) fn copy_ranges(
    proc: &Proc,
    want: &[(u64, u64, bool)],
    mut data: Vec<u8>,
) -> Result<(Vec<PageRun>, Vec<u8>)> {
    let pid = proc.pid;
    // Copy: readable ranges with process_vm_readv in large batches, the rest via /proc/PID/mem
    // (which ignores protections).
    tracing::debug!(runs = want.len(), "memory runs to copy");
    let total: u64 = want.iter().map(|w| w.1).sum();
    // Normally the buffer is large enough (prefaulted for a full checkpoint, reused from the
    // last epoch in the loop). If not, it is replaced, not grown by `resize`: a reallocation
    // is not advised for huge pages, and with 4 KiB pages every page copied into it costs a
    // TLB miss (~0.2 µs a page, `bench/copy_dest.c`). The headroom spares the next epochs.
    let total_bytes = total as usize;
    if data.capacity() < total_bytes {
        data = prefaulted_buffer(total_bytes + total_bytes / 2);
    }
    data.resize(total_bytes, 0);
    let mut runs = Vec::with_capacity(want.len());
    let mut off = 0u64;
    let mut batch: Vec<(u64, u64)> = Vec::new();
    let mut batch_off = 0u64;
    // `/proc/PID/mem`, opened only if needed: most copies never fall back to it, and an open
    // of a `/proc` file costs a few microseconds of the pause.
    let mem_file = std::cell::OnceCell::new();
    let mem = || -> Result<&std::fs::File> {
        if let Some(f) = mem_file.get() {
            return Ok(f);
        }
        let f = proc
            .open_file("mem", libc::O_RDONLY)
            .map_err(proc_err(pid, "mem"))?;
        Ok(mem_file.get_or_init(|| f))
    };
    let flush = |batch: &mut Vec<(u64, u64)>, at: u64, data: &mut [u8]| -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let len: u64 = batch.iter().map(|b| b.1).sum();
        let dst = &mut data[at as usize..(at + len) as usize];
        if sys::read_remote_vectored(pid, batch, dst).is_err() {
            // Some page turned unreadable: read each range through /proc/PID/mem instead.
            let mut o = 0usize;
            for &(a, l) in batch.iter() {
                read_mem(mem()?, a, &mut dst[o..o + l as usize])
                    .map_err(proc_err(pid, format!("memory at {a:#x}")))?;
                o += l as usize;
            }
        }
        batch.clear();
        Ok(())
    };
    for &(addr, len, readable) in want {
        runs.push(PageRun {
            addr,
            len,
            data_off: off,
        });
        if readable {
            if batch.is_empty() {
                batch_off = off;
            }
            batch.push((addr, len));
            if batch.len() >= 1024 {
                flush(&mut batch, batch_off, &mut data)?;
            }
        } else {
            flush(&mut batch, batch_off, &mut data)?;
            read_mem(mem()?, addr, &mut data[off as usize..(off + len) as usize])
                .map_err(proc_err(pid, format!("memory at {addr:#x}")))?;
        }
        off += len;
    }
    flush(&mut batch, batch_off, &mut data)?;
    Ok((runs, data))
}

pub(super) fn read_pagemap(f: &std::fs::File, start: u64, out: &mut [u64]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    // SAFETY: u64 has no invalid bit patterns; we view the slice as bytes to fill it.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 8) };
    f.read_exact_at(bytes, start / PAGE * 8)
}

pub(super) fn read_mem(f: &std::fs::File, addr: u64, out: &mut [u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.read_exact_at(out, addr)
}

/// Removes all-zero pages of anonymous mappings from the saved data: a fresh anonymous mapping
/// reads as zero already. (File-backed private pages keep their zeroes: the file differs.)
/// The shared memory objects' runs (which hold no zero page) move with the data.
pub(crate) fn drop_zero_pages(image: &mut ProcessImage, data: &mut Vec<u8>) {
    let anon = |addr: u64| {
        image
            .vmas
            .iter()
            .find(|v| v.start <= addr && addr < v.end)
            .is_some_and(|v| v.backing == Backing::Anon)
    };
    let mut out_runs = Vec::with_capacity(image.runs.len());
    let mut w = 0usize;
    for r in &image.runs {
        let is_anon = anon(r.addr);
        let mut cur: Option<PageRun> = None;
        for p in 0..(r.len / PAGE) {
            let src = (r.data_off + p * PAGE) as usize;
            let page = &data[src..src + PAGE as usize];
            if is_anon && page.iter().all(|&b| b == 0) {
                if let Some(c) = cur.take() {
                    out_runs.push(c);
                }
                continue;
            }
            data.copy_within(src..src + PAGE as usize, w);
            match &mut cur {
                Some(c) => c.len += PAGE,
                None => {
                    cur = Some(PageRun {
                        addr: r.addr + p * PAGE,
                        len: PAGE,
                        data_off: w as u64,
                    })
                }
            }
            w += PAGE as usize;
        }
        if let Some(c) = cur {
            out_runs.push(c);
        }
    }
    // Compacting only moves bytes towards the front: each run's bytes are still in place.
    for r in image.shm.iter_mut().flat_map(|o| o.runs.iter_mut()) {
        let (src, len) = (r.data_off as usize, r.len as usize);
        data.copy_within(src..src + len, w);
        r.data_off = w as u64;
        w += len;
    }
    data.truncate(w);
    image.runs = out_runs;
}
