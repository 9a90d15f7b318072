//! Page slots for the twin store: one anonymous mapping, aligned to 2 MiB and marked for
//! transparent huge pages, cut into 4 KiB slots.
//!
//! Why not one heap box per twin: the encoding reads each written page's twin once an epoch,
//! long after its last use, so every twin read starts cold. With 4 KiB pages a twin store of
//! thousands of scattered boxes also costs a TLB miss (and a page-table walk that misses the
//! caches too) per twin, and a heap box of 4,096 bytes is not page aligned, so it spans two
//! pages. Here a twin is one aligned slot, and with huge pages one TLB entry covers 512 of them
//! (`checkpointer/examples/encode_twins.rs` measures the difference).
//!
//! The mapping is `MAP_NORESERVE` and touched only as slots are first used, so an arena costs
//! address space, not memory, until its twins exist (memory then comes in 2 MiB steps when the
//! kernel grants huge pages: `transparent_hugepage/enabled` is `madvise` or `always`).
//!
//! This is the only `unsafe` code of the crate: mapping, unmapping and slicing the region.

use crate::delta::PAGE_SIZE;
use std::ptr::NonNull;

/// Alignment and unit of the mapping: one x86-64 huge page.
const HUGE: usize = 2 << 20;

/// `slots` page-sized, page-aligned slots in one mapping.
pub(crate) struct PageArena {
    base: NonNull<u8>,
    /// Bytes mapped at `base` (a multiple of [`HUGE`]).
    len: usize,
    slots: usize,
}

// SAFETY: the arena owns its mapping exclusively (nothing else holds `base`); shared references
// only read slots ([`PageArena::slot`]), writes need `&mut self` ([`PageArena::slot_mut`]), so
// Rust's aliasing rules on the arena carry over to the memory as they would for a `Vec<u8>`.
unsafe impl Send for PageArena {}
// SAFETY: as above: `&PageArena` gives only read access to the mapping.
unsafe impl Sync for PageArena {}

impl PageArena {
    /// An arena of `slots` slots, or `None` if the mapping fails (no address space left).
    pub(crate) fn new(slots: usize) -> Option<PageArena> {
        if slots == 0 {
            return None;
        }
        let len = slots
            .checked_mul(PAGE_SIZE)?
            .checked_next_multiple_of(HUGE)?;
        let over = len.checked_add(HUGE)?;
        // SAFETY: a fresh private anonymous mapping at an address the kernel chooses: it
        // aliases nothing of ours. Arguments are plain integers.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        // Trim the mapping to a HUGE-aligned window of `len` bytes: huge pages need the
        // virtual range aligned (the kernel aligns large anonymous mappings itself since 6.7,
        // but not every kernel does, and not every length).
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE);
        let head = aligned - start;
        let tail = over - head - len;
        // SAFETY: both ranges lie inside the mapping just made and nothing refers to them;
        // unmapping a part of a mapping is allowed. A failure leaves a harmless extra mapping.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            // Advice only: without huge pages the arena still works, one TLB entry per slot.
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(PageArena {
            base: NonNull::new(aligned as *mut u8)?,
            len,
            slots,
        })
    }

    /// Slot `i`.
    ///
    /// # Panics
    /// If `i` is not below [`PageArena::slots`] (a caller bug).
    pub(crate) fn slot(&self, i: usize) -> &[u8] {
        assert!(i < self.slots, "PageArena::slot: {i} of {}", self.slots);
        // SAFETY: `i * PAGE_SIZE + PAGE_SIZE <= slots * PAGE_SIZE <= len`, inside the mapping,
        // which is readable and lives as long as `self`; `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(i * PAGE_SIZE), PAGE_SIZE) }
    }

    /// Slot `i`, writable.
    ///
    /// # Panics
    /// If `i` is not below [`PageArena::slots`] (a caller bug).
    pub(crate) fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.slots, "PageArena::slot_mut: {i} of {}", self.slots);
        // SAFETY: in bounds as in `slot`; `&mut self` makes this the only reference into the
        // mapping, and distinct slots never overlap.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(i * PAGE_SIZE), PAGE_SIZE) }
    }
}

impl Drop for PageArena {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no slice into it outlives `self`.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_distinct_and_zeroed() {
        let mut a = PageArena::new(3).expect("mapping");
        assert_eq!(a.base.as_ptr() as usize % HUGE, 0);
        for i in 0..3 {
            assert!(a.slot(i).iter().all(|&b| b == 0));
            a.slot_mut(i).fill(i as u8 + 1);
        }
        for i in 0..3 {
            assert!(a.slot(i).iter().all(|&b| b == i as u8 + 1));
        }
        assert!(PageArena::new(0).is_none());
    }

    #[test]
    #[should_panic(expected = "PageArena::slot")]
    fn a_slot_past_the_end_is_refused() {
        let a = PageArena::new(2).expect("mapping");
        let _ = a.slot(2);
    }
}
