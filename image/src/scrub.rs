//! The divergence check ("scrub"): digests of what the primary's process *is* at a pause, which
//! a backup compares with its image once it applied that pause's checkpoint.
//!
//! A backup's image is built by applying checkpoints one on top of the other: pages decoded
//! against twins, metadata carried over from the base ([`crate::image::Carried`]), pages of
//! private file mappings kept or dropped by the `cow` list. A bug anywhere on that path, or a
//! flipped bit in the backup's memory, leaves an image that restores a different process than
//! the one whose output clients saw, and nothing else would notice until a takeover. So every
//! so often the primary reads, inside the pause, a slice of its process's private memory
//! straight from the process (not from anything it sent) and digests it with the parts of the
//! metadata a checkpoint may carry over; the digests travel in that checkpoint
//! ([`crate::ProcessImage::scrub`]) and the backup checks its image against them after applying
//! it ([`check`]).
//!
//! What a page's digest says is what a restore of the image would show at that address: the
//! image's page if it holds one, else zeros for anonymous memory; for a private file mapping a
//! page without its own (copied-on-write) contents shows the file, which is not replicated
//! state, so the digest says only that: [`PageDigest::content`] is `None` there, and the image
//! must hold no page for it. The slices walk the private mappings in address order from where
//! the last one ended (`Cursor`), so every page is covered once per sweep, at
//! [`Scrub::pages`]' size per check.
//!
//! Not covered (yet): the pages of shared memory objects, the other processes of a process
//! tree (their metadata and pages), private files, and the rest of the metadata (sent whole
//! in every checkpoint, never carried over).

use crate::image::{Backing, ProcessImage, Vma};
use crate::store::Image;
use serde::{Deserialize, Serialize};

use crate::delta::PAGE;
/// Most pages one check may list (a checkpoint listing more is refused as corrupt).
pub const MAX_PAGES: usize = 1 << 16;

/// A digest: the first 16 bytes of BLAKE3.
pub type Digest = [u8; 16];

/// The digest of `bytes`.
pub fn digest(bytes: &[u8]) -> Digest {
    let h = blake3::hash(bytes);
    let mut d = [0u8; 16];
    d.copy_from_slice(&h.as_bytes()[..16]);
    d
}

/// What the primary saw at one pause (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scrub {
    /// The parts of the metadata an incremental checkpoint may carry over from its base.
    pub layout: Digest,
    pub fds: Digest,
    pub sigactions: Digest,
    pub threads: Digest,
    /// Pages, in increasing address order.
    pub pages: Vec<PageDigest>,
}

/// One page as a restore would show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageDigest {
    pub addr: u64,
    /// The page's contents; `None`: a page of a private file mapping that shows the file (it
    /// has no copy of its own, so the image holds none).
    pub content: Option<Digest>,
}

fn digest_of<T: Serialize>(v: &T) -> Digest {
    // Serialising plain data into a Vec cannot fail.
    digest(&postcard::to_allocvec(v).unwrap_or_default())
}

impl Scrub {
    /// The digests of `meta` (a process's complete metadata: nothing left out) with `pages`.
    pub fn new(meta: &ProcessImage, pages: Vec<PageDigest>) -> Scrub {
        Scrub {
            layout: digest_of(&(&meta.vmas, &meta.files)),
            fds: digest_of(&meta.fds),
            sigactions: digest_of(&meta.sigactions),
            threads: digest_of(&meta.threads),
            pages,
        }
    }

    /// Bounds and order (see [`ProcessImage::validate`]).
    pub fn validate(&self) -> Result<(), String> {
        if self.pages.len() > MAX_PAGES {
            return Err(format!(
                "a divergence check lists {} pages, over the limit of {MAX_PAGES}",
                self.pages.len()
            ));
        }
        let mut last = None;
        for p in &self.pages {
            if p.addr % PAGE != 0 || last.is_some_and(|l| p.addr <= l) {
                return Err(format!(
                    "divergence check page {:#x} is unaligned or out of order",
                    p.addr
                ));
            }
            last = Some(p.addr);
        }
        Ok(())
    }
}

/// Where a difference was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("the {0} differ from the primary's")]
    Meta(&'static str),
    #[error("page {addr:#x} differs from the primary's ({why})")]
    Page { addr: u64, why: &'static str },
}

/// Compares `img` (after applying the checkpoint that carried `s`) with the primary's digests.
/// Returns every difference (empty: the image is what the process was).
pub fn check(img: &Image, s: &Scrub) -> Vec<Mismatch> {
    let mine = Scrub::new(&img.meta, Vec::new());
    let mut out = Vec::new();
    for (a, b, what) in [
        (mine.layout, s.layout, "mappings"),
        (mine.fds, s.fds, "descriptors"),
        (mine.sigactions, s.sigactions, "signal actions"),
        (
            mine.threads,
            s.threads,
            "threads (registers, masks, pending signals)",
        ),
    ] {
        if a != b {
            out.push(Mismatch::Meta(what));
        }
    }
    let vmas = &img.meta.vmas;
    for p in &s.pages {
        let i = vmas.partition_point(|v| v.end <= p.addr);
        let Some(v) = vmas.get(i).filter(|v| v.start <= p.addr && sampled(v)) else {
            out.push(Mismatch::Page {
                addr: p.addr,
                why: "not in a private mapping of the image",
            });
            continue;
        };
        let held = img.page(p.addr);
        let file = matches!(v.backing, Backing::File { .. });
        let why = match (p.content, held) {
            (None, None) if file => continue,
            (None, _) => "the image holds a copy where the process shows the file",
            (Some(d), Some(pg)) if digest(&pg[..]) == d => continue,
            (Some(_), Some(_)) => "contents",
            (Some(d), None) if !file && d == zero_digest() => continue,
            (Some(_), None) if file => "the image shows the file where the process has a copy",
            (Some(_), None) => "contents (the image holds no page: zeros)",
        };
        out.push(Mismatch::Page { addr: p.addr, why });
    }
    out
}

/// The digest of a page of zeros (computed once).
pub fn zero_digest() -> Digest {
    static ZERO: std::sync::OnceLock<Digest> = std::sync::OnceLock::new();
    *ZERO.get_or_init(|| digest(&[0u8; PAGE as usize]))
}

/// Whether a check looks at `v`'s pages: private mappings of anonymous memory or of a file.
pub fn sampled(v: &Vma) -> bool {
    !v.shared && matches!(v.backing, Backing::Anon | Backing::File { .. })
}

/// Where the next slice begins: the walk over the private mappings goes on from where the last
/// slice ended, in address order, and starts again from the lowest once past the highest.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cursor(u64);

impl Cursor {
    /// The next slice of at most `n` pages of `vmas` (sorted), as runs (start, pages, of a file
    /// mapping), in address order, moving the cursor past it. Fewer than `n` pages when the
    /// process has fewer.
    pub fn next_slice(&mut self, vmas: &[Vma], n: usize) -> Vec<(u64, u64, bool)> {
        let total: u64 = vmas
            .iter()
            .filter(|v| sampled(v))
            .map(|v| (v.end - v.start) / PAGE)
            .sum();
        let mut left = (n as u64).min(total);
        let mut runs: Vec<(u64, u64, bool)> = Vec::new();
        let mut at = self.0;
        while left > 0 {
            // The first sampled mapping that ends after `at`; past the last one, from the top.
            let Some(v) = vmas.iter().find(|v| sampled(v) && v.end > at) else {
                at = 0;
                continue;
            };
            let start = at.max(v.start);
            let pages = ((v.end - start) / PAGE).min(left);
            if pages == 0 {
                at = v.end;
                continue;
            }
            runs.push((start, pages, matches!(v.backing, Backing::File { .. })));
            left -= pages;
            at = start + pages * PAGE;
        }
        // A slice that wrapped may end where it began: keep the runs in address order.
        runs.sort_unstable_by_key(|r| r.0);
        self.0 = at;
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vma(start: u64, end: u64, backing: Backing, shared: bool) -> Vma {
        Vma {
            start,
            end,
            prot: 3,
            shared,
            flags: 0,
            backing,
            name: String::new(),
        }
    }

    #[test]
    fn slices_walk_every_private_page_once_per_sweep() {
        let file = Backing::File {
            index: 0,
            offset: 0,
        };
        let vmas = vec![
            vma(0x1000, 0x4000, Backing::Anon, false),
            vma(0x4000, 0x6000, Backing::Anon, true),
            vma(0x8000, 0xa000, file, false),
            vma(0xa000, 0xb000, Backing::Vdso, false),
            vma(0x10000, 0x12000, Backing::Anon, false),
        ];
        let mut c = Cursor::default();
        let mut seen = Vec::new();
        for _ in 0..3 {
            for (s, n, _) in c.next_slice(&vmas, 3) {
                seen.extend((0..n).map(|i| s + i * PAGE));
            }
        }
        seen.sort_unstable();
        // 7 private pages; 9 taken: two of them twice, none missed, none shared or vDSO.
        let want: Vec<u64> = [0x1000, 0x2000, 0x3000, 0x8000, 0x9000, 0x10000, 0x11000].into();
        let mut uniq = seen.clone();
        uniq.dedup();
        assert_eq!(uniq, want);
        assert_eq!(seen.len(), 9);
        // The file mapping's run says so.
        let mut c = Cursor(0x8000);
        assert_eq!(c.next_slice(&vmas, 2), vec![(0x8000, 2, true)]);
        // More pages asked for than exist: each once.
        let mut c = Cursor(0x9000);
        let all: u64 = c.next_slice(&vmas, 100).iter().map(|r| r.1).sum();
        assert_eq!(all, 7);
    }

    #[test]
    fn validate_bounds_and_orders_the_pages() {
        let p = |addr| PageDigest {
            addr,
            content: None,
        };
        let mut s = Scrub {
            pages: vec![p(0x1000), p(0x2000)],
            ..Default::default()
        };
        assert!(s.validate().is_ok());
        s.pages = vec![p(0x2000), p(0x1000)];
        assert!(s.validate().is_err());
        s.pages = vec![p(0x1001)];
        assert!(s.validate().is_err());
        s.pages = (0..=MAX_PAGES as u64).map(|i| p(i * PAGE)).collect();
        assert!(s.validate().is_err());
    }
}
