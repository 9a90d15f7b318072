//! The primary's half of the divergence check ([`tardi_image::scrub`]): every
//! [`ScrubConfig::every`], inside a pause, read the next slice of the stopped process's private
//! memory from the process itself and digest it; the epoch loop adds the metadata's digests and
//! puts the whole into that epoch's checkpoint (`ProcessImage::scrub`).
//!
//! Only pages with contents of their own are read: the page map says which (present, or
//! swapped out when a swap area is active, and in a private file mapping not the file's own
//! page). A page that is not
//! present is not touched — reading it would fault it in, and under the userfaultfd tracker a
//! page faulted in by someone else than the service must not appear — and is digested as what
//! it shows: zeros (anonymous memory) or the file (`PageDigest::content` `None`).
//!
//! Owns: the cursor and the cadence. Must not touch: the tracker's state, or anything that
//! changes the process.

use crate::procfs::Proc;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};
use tardi_image::image::Vma;
use tardi_image::scrub::{Cursor, PageDigest, digest, zero_digest};
// The receiver's half, for those who link this crate only.
pub use tardi_image::scrub::{Mismatch, Scrub, check};

use crate::os::ranges::PAGE;
/// Page map bits (`Documentation/admin-guide/mm/pagemap.rst`).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAP: u64 = 1 << 62;
const PM_FILE: u64 = 1 << 61;

/// How often, and how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ScrubConfig {
    /// At most one check per this long (the first at the first pause after it passed).
    pub every: Duration,
    /// Pages per check: 4 KiB read and digested each, inside the pause.
    pub pages: usize,
}

/// The cadence and where the walk is.
#[derive(Debug)]
pub(crate) struct Scrubber {
    cfg: ScrubConfig,
    cursor: Cursor,
    last: Instant,
    /// Whether a swap area is active ([`crate::track::swap_active`]).
    swap: bool,
}

impl Scrubber {
    pub(crate) fn new(cfg: ScrubConfig) -> Scrubber {
        Scrubber {
            cfg,
            cursor: Cursor::default(),
            last: Instant::now(),
            swap: crate::track::swap_active(),
        }
    }

    /// Whether this pause takes a check.
    pub(crate) fn due(&self) -> bool {
        self.last.elapsed() >= self.cfg.every
    }

    /// Reads and digests the next slice of `proc`'s private mappings `vmas` (its layout at this
    /// pause, as the checkpoint records it). The process must be stopped.
    pub(crate) fn take(&mut self, proc: &Proc, vmas: &[Vma]) -> io::Result<Vec<PageDigest>> {
        self.last = Instant::now();
        let runs = self.cursor.next_slice(vmas, self.cfg.pages);
        let mem = proc.open_file("mem", libc::O_RDONLY)?;
        let pagemap = proc.open_file("pagemap", libc::O_RDONLY)?;
        let mut out = Vec::with_capacity(self.cfg.pages);
        let mut entries = Vec::new();
        let mut page = [0u8; PAGE as usize];
        for (start, n, file) in runs {
            entries.clear();
            entries.resize(n as usize * 8, 0u8);
            pagemap.read_exact_at(&mut entries, start / PAGE * 8)?;
            for (i, e) in entries.chunks_exact(8).enumerate() {
                let addr = start + i as u64 * PAGE;
                let pm = u64::from_ne_bytes(e.try_into().expect("8 bytes"));
                // In a private file mapping, a present page is the file's own unless it is
                // anonymous (the copy a write made). Without a swap area, an entry the page
                // map calls swapped is a userfaultfd write-protect marker on an empty entry
                // (see `crate::track::swap_active`): no contents. (A page being migrated
                // shows so too, for an instant: a false alarm then re-seeds a good backup.)
                let own = (pm & PM_SWAP != 0 && self.swap)
                    || (pm & PM_PRESENT != 0 && (!file || pm & PM_FILE == 0));
                let content = match (own, file) {
                    (false, true) => None,
                    (false, false) => Some(zero_digest()),
                    (true, _) => {
                        mem.read_exact_at(&mut page, addr)?;
                        Some(digest(&page))
                    }
                };
                out.push(PageDigest { addr, content });
            }
        }
        Ok(out)
    }
}
