//! Twin-diff delta encoding of 4 KiB pages (Tardigrade §4.1, NiLiCon §V).
//!
//! Each epoch the checkpointer has the new contents of every page written during the epoch.
//! For recently written pages it also keeps the contents it sent last time, the page's *twin*,
//! and sends only the difference between the two.
//!
//! Owns:
//! - [`PageCodec`]: encodes one page, against its twin when there is one, into bytes plus a
//!   small self-describing [`PageEncoding`] tag, and decodes them back. It owns the reusable
//!   zstd contexts and scratch buffers, so one `PageCodec` per thread.
//! - [`Codec`]: the difference algorithms: XOR with the twin then zstd ([`Codec::XorZstd`]),
//!   VCDIFF against the twin ([`Codec::Xdelta3`]), zstd of the page alone ([`Codec::Zstd`]),
//!   or nothing ([`Codec::Raw`]).
//! - [`TwinStore`]: the twins themselves, keyed by page address, within a memory budget,
//!   evicting the least recently written pages first.
//!
//! This module is pure computation on byte slices: no syscalls, no I/O, no knowledge of the
//! checkpoint format. Integrity of the encoded bytes is the container's job (the image format
//! checksums its sections); decoding still rejects any input it can tell is malformed with a
//! [`DeltaError`], never a panic, but a bit flip inside zstd literals may decode to a wrong
//! page (zstd frame checksums are off: 4 bytes per page is a lot next to a 20-byte delta).
//!
//! Wire form of one page: the [`PageEncoding`] (serialise it with the container's serde
//! format; postcard takes 1–4 bytes) followed by [`PageEncoding::encoded_len`] bytes.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Size of a page, the unit of encoding.
pub const PAGE_SIZE: usize = 4096;

/// Default zstd level of [`PageCodec::new`] (see `examples/codec_compare.rs` for measurements).
pub const DEFAULT_LEVEL: i32 = 1;

/// How a page is encoded against its twin.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// VCDIFF (xdelta3) of the page against its twin.
    Xdelta3,
    /// XOR of the page with its twin, then zstd: the unchanged bytes become runs of zeros.
    XorZstd,
    /// zstd of the page alone; the twin is not used.
    Zstd,
    /// The page as it is.
    Raw,
}

impl Codec {
    /// Every codec, in the order of [`Codec`]'s declaration.
    pub const ALL: [Codec; 4] = [Codec::Xdelta3, Codec::XorZstd, Codec::Zstd, Codec::Raw];

    /// The name accepted by [`FromStr`] and printed by [`Display`](fmt::Display).
    pub fn name(self) -> &'static str {
        match self {
            Codec::Xdelta3 => "xdelta3",
            Codec::XorZstd => "xor-zstd",
            Codec::Zstd => "zstd",
            Codec::Raw => "raw",
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Codec {
    type Err = DeltaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Codec::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| DeltaError::UnknownCodec(s.to_owned()))
    }
}

/// What the encoded bytes of one page are; with the bytes, all a decoder needs (plus the twin
/// when [`PageEncoding::needs_twin`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageEncoding {
    /// The page is all zeros; no bytes.
    Zero,
    /// The page is identical to its twin; no bytes.
    Same,
    /// The page itself: [`PAGE_SIZE`] bytes.
    Raw,
    /// A difference against the twin made by `codec` ([`Codec::Xdelta3`] or
    /// [`Codec::XorZstd`]): `len` bytes.
    Delta { codec: Codec, len: u32 },
    /// zstd of the page alone (no twin): `len` bytes.
    Compressed { len: u32 },
}

impl PageEncoding {
    /// How many bytes follow this tag.
    pub fn encoded_len(self) -> usize {
        match self {
            PageEncoding::Zero | PageEncoding::Same => 0,
            PageEncoding::Raw => PAGE_SIZE,
            PageEncoding::Delta { len, .. } | PageEncoding::Compressed { len } => len as usize,
        }
    }

    /// Whether decoding needs the page's twin.
    pub fn needs_twin(self) -> bool {
        matches!(self, PageEncoding::Same | PageEncoding::Delta { .. })
    }
}

/// Why a page could not be decoded (or a codec name not parsed).
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    #[error("page encoded as {0:?} needs its twin, and there is none")]
    MissingTwin(PageEncoding),
    #[error("twin is {0} bytes, not {PAGE_SIZE}")]
    TwinLength(usize),
    #[error("page encoded as {enc:?} must have {expected} bytes, has {got}")]
    Length {
        enc: PageEncoding,
        expected: usize,
        got: usize,
    },
    #[error("{0} is not a delta codec")]
    NotADeltaCodec(Codec),
    #[error("corrupt {codec} data: {detail}")]
    Corrupt { codec: Codec, detail: String },
    #[error("creating a zstd context: {0}")]
    Context(std::io::Error),
    #[error("unknown codec {0:?} (expected xdelta3, xor-zstd, zstd or raw)")]
    UnknownCodec(String),
}

/// Encoder and decoder of pages, owning reusable zstd contexts and scratch buffers.
/// Not shareable between threads: make one per thread.
pub struct PageCodec {
    level: i32,
    cctx: zstd::bulk::Compressor<'static>,
    dctx: zstd::bulk::Decompressor<'static>,
    /// The XOR of page and twin.
    xor: Box<[u8; PAGE_SIZE]>,
    /// Compressed output; one byte short of a page, so anything that does not beat
    /// [`PageEncoding::Raw`] fails to fit.
    scratch: Box<[u8; PAGE_SIZE - 1]>,
}

impl fmt::Debug for PageCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageCodec")
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl PageCodec {
    /// A codec compressing at [`DEFAULT_LEVEL`].
    pub fn new() -> Result<Self, DeltaError> {
        Self::with_level(DEFAULT_LEVEL)
    }

    /// A codec compressing at zstd `level` (negative levels are zstd's fast levels). The level
    /// only affects encoding; any `PageCodec` decodes any level.
    pub fn with_level(level: i32) -> Result<Self, DeltaError> {
        use zstd::zstd_safe::{CParameter, DParameter, FrameFormat};
        let mut cctx = zstd::bulk::Compressor::new(level).map_err(DeltaError::Context)?;
        // Every page is a separate frame: drop the 4-byte magic, keep the content size (a
        // cheap check on decode), no checksum or dictionary id.
        for p in [
            CParameter::Format(FrameFormat::Magicless),
            CParameter::ContentSizeFlag(true),
            CParameter::ChecksumFlag(false),
            CParameter::DictIdFlag(false),
        ] {
            cctx.set_parameter(p).map_err(DeltaError::Context)?;
        }
        let mut dctx = zstd::bulk::Decompressor::new().map_err(DeltaError::Context)?;
        dctx.set_parameter(DParameter::Format(FrameFormat::Magicless))
            .map_err(DeltaError::Context)?;
        Ok(PageCodec {
            level,
            cctx,
            dctx,
            xor: Box::new([0; PAGE_SIZE]),
            scratch: Box::new([0; PAGE_SIZE - 1]),
        })
    }

    /// The zstd level this codec compresses at.
    pub fn level(&self) -> i32 {
        self.level
    }

    /// Encodes `page` (against `twin`, its last sent contents, when there is one), appends the
    /// encoded bytes to `out` and returns what they are:
    /// - an all-zero page is [`PageEncoding::Zero`], a page equal to its twin
    ///   [`PageEncoding::Same`] (no bytes), whatever the codec;
    /// - with a twin, [`Codec::Xdelta3`] and [`Codec::XorZstd`] give a
    ///   [`PageEncoding::Delta`]; without one, and for [`Codec::Zstd`], the page is
    ///   [`PageEncoding::Compressed`];
    /// - [`PageEncoding::Raw`] for [`Codec::Raw`], and whenever the result would not be
    ///   smaller than the page.
    ///
    /// # Panics
    /// If `page` or `twin` is not [`PAGE_SIZE`] bytes (a caller bug, not a data error).
    pub fn encode_page(
        &mut self,
        codec: Codec,
        twin: Option<&[u8]>,
        page: &[u8],
        out: &mut Vec<u8>,
    ) -> PageEncoding {
        assert_eq!(page.len(), PAGE_SIZE, "encode_page: page length");
        if let Some(twin) = twin {
            assert_eq!(twin.len(), PAGE_SIZE, "encode_page: twin length");
        }
        if is_zero(page) {
            return PageEncoding::Zero;
        }
        if twin.is_some_and(|t| t == page) {
            return PageEncoding::Same;
        }
        let encoded = match (codec, twin) {
            (Codec::Raw, _) => None,
            (Codec::XorZstd, Some(twin)) => {
                xor_into(&mut self.xor[..], page, twin);
                compress(&mut self.cctx, &self.xor[..], &mut self.scratch[..])
                    .map(|len| PageEncoding::Delta { codec, len })
            }
            (Codec::Xdelta3, Some(twin)) => match xdelta3::encode(page, twin) {
                Some(d) if d.len() < PAGE_SIZE => {
                    out.extend_from_slice(&d);
                    return PageEncoding::Delta {
                        codec,
                        len: d.len() as u32,
                    };
                }
                _ => None,
            },
            (Codec::Zstd | Codec::XorZstd | Codec::Xdelta3, _) => {
                compress(&mut self.cctx, page, &mut self.scratch[..])
                    .map(|len| PageEncoding::Compressed { len })
            }
        };
        match encoded {
            Some(enc) => {
                out.extend_from_slice(&self.scratch[..enc.encoded_len()]);
                enc
            }
            None => {
                out.extend_from_slice(page);
                PageEncoding::Raw
            }
        }
    }

    /// Decodes one page encoded by [`PageCodec::encode_page`] as `enc`, from exactly
    /// `enc.encoded_len()` `bytes`, against `twin` when the encoding needs it, into `out`.
    /// On error `out` holds unspecified bytes.
    pub fn decode_page(
        &mut self,
        enc: PageEncoding,
        twin: Option<&[u8]>,
        bytes: &[u8],
        out: &mut [u8; PAGE_SIZE],
    ) -> Result<(), DeltaError> {
        if bytes.len() != enc.encoded_len() {
            return Err(DeltaError::Length {
                enc,
                expected: enc.encoded_len(),
                got: bytes.len(),
            });
        }
        let twin = match twin {
            Some(t) if t.len() != PAGE_SIZE => return Err(DeltaError::TwinLength(t.len())),
            Some(t) => Some(t),
            None if enc.needs_twin() => return Err(DeltaError::MissingTwin(enc)),
            None => None,
        };
        match enc {
            PageEncoding::Zero => out.fill(0),
            PageEncoding::Raw => out.copy_from_slice(bytes),
            PageEncoding::Same => out.copy_from_slice(twin.ok_or(DeltaError::MissingTwin(enc))?),
            PageEncoding::Compressed { .. } => self.decompress(Codec::Zstd, bytes, out)?,
            PageEncoding::Delta { codec, .. } => {
                let twin = twin.ok_or(DeltaError::MissingTwin(enc))?;
                match codec {
                    Codec::XorZstd => {
                        self.decompress(codec, bytes, out)?;
                        xor_in_place(out, twin);
                    }
                    Codec::Xdelta3 => {
                        let page = xdelta3::decode(bytes, twin).ok_or(DeltaError::Corrupt {
                            codec,
                            detail: "xdelta3 decode failed".into(),
                        })?;
                        if page.len() != PAGE_SIZE {
                            return Err(DeltaError::Corrupt {
                                codec,
                                detail: format!("decodes to {} bytes", page.len()),
                            });
                        }
                        out.copy_from_slice(&page);
                    }
                    Codec::Zstd | Codec::Raw => return Err(DeltaError::NotADeltaCodec(codec)),
                }
            }
        }
        Ok(())
    }

    /// zstd-decompresses `bytes` into `out`, which they must fill exactly.
    fn decompress(
        &mut self,
        codec: Codec,
        bytes: &[u8],
        out: &mut [u8; PAGE_SIZE],
    ) -> Result<(), DeltaError> {
        let corrupt = |detail: String| DeltaError::Corrupt { codec, detail };
        let n = self
            .dctx
            .decompress_to_buffer(bytes, &mut out[..])
            .map_err(|e| corrupt(e.to_string()))?;
        if n != PAGE_SIZE {
            return Err(corrupt(format!("decompresses to {n} bytes")));
        }
        Ok(())
    }
}

/// zstd of `src` into `dst`; `None` when it does not fit.
fn compress(cctx: &mut zstd::bulk::Compressor<'static>, src: &[u8], dst: &mut [u8]) -> Option<u32> {
    cctx.compress_to_buffer(src, dst).ok().map(|n| n as u32)
}

/// Whether `page` is all zeros (written so that it vectorises).
fn is_zero(page: &[u8]) -> bool {
    page.chunks_exact(64)
        .all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0)
        && page.chunks_exact(64).remainder().iter().all(|&b| b == 0)
}

fn xor_into(dst: &mut [u8], a: &[u8], b: &[u8]) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = x ^ y;
    }
}

fn xor_in_place(dst: &mut [u8], b: &[u8]) {
    for (d, y) in dst.iter_mut().zip(b) {
        *d ^= y;
    }
}

/// Hit, miss and eviction counts of a [`TwinStore`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TwinStats {
    /// [`TwinStore::get`] calls that found a twin.
    pub hits: u64,
    /// [`TwinStore::get`] calls that found none.
    pub misses: u64,
    /// Twins dropped to stay within the budget.
    pub evictions: u64,
}

struct Twin {
    epoch: u64,
    /// Position in [`TwinStore::order`] of its latest write.
    seq: u64,
    page: Box<[u8; PAGE_SIZE]>,
}

/// The twins (last sent contents) of recently written pages, keyed by page address, holding at
/// most `budget` bytes of page contents; when full, the least recently written page (the one
/// whose last [`TwinStore::put`] is oldest) is evicted. A budget under one page disables it.
///
/// Recency is kept as a queue of (address, write sequence number) with lazy deletion: a
/// re-write pushes a new entry and leaves the old one stale; eviction pops from the front,
/// skipping stale entries; the queue is compacted when it holds more stale entries than live
/// ones. Every operation is O(1) amortised, and evicted buffers are reused for new twins.
pub struct TwinStore {
    budget: usize,
    map: HashMap<u64, Twin, PageHash>,
    order: VecDeque<(u64, u64)>,
    next_seq: u64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: u64,
}

impl fmt::Debug for TwinStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TwinStore")
            .field("budget", &self.budget)
            .field("len", &self.map.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl TwinStore {
    /// An empty store holding at most `budget_bytes` of twins (rounded down to whole pages;
    /// 0 disables twins).
    pub fn new(budget_bytes: usize) -> Self {
        TwinStore {
            budget: budget_bytes,
            map: HashMap::with_hasher(PageHash),
            order: VecDeque::new(),
            next_seq: 0,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: 0,
        }
    }

    /// The budget given to [`TwinStore::new`].
    pub fn budget(&self) -> usize {
        self.budget
    }

    fn capacity_pages(&self) -> usize {
        self.budget / PAGE_SIZE
    }

    /// The twin of the page at `addr`, if kept (counted as a hit or a miss).
    pub fn get(&self, addr: u64) -> Option<&[u8]> {
        match self.map.get(&addr) {
            Some(t) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(&t.page[..])
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The epoch of the last [`TwinStore::put`] of `addr`, if kept (not counted in stats).
    pub fn epoch(&self, addr: u64) -> Option<u64> {
        self.map.get(&addr).map(|t| t.epoch)
    }

    /// Records `page` as the twin of `addr`, written in `epoch`; it becomes the most recently
    /// written page, and the least recently written ones are evicted to stay within budget.
    ///
    /// # Panics
    /// If `page` is not [`PAGE_SIZE`] bytes.
    pub fn put(&mut self, addr: u64, epoch: u64, page: &[u8]) {
        assert_eq!(page.len(), PAGE_SIZE, "TwinStore::put: page length");
        let cap = self.capacity_pages();
        if cap == 0 {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(t) = self.map.get_mut(&addr) {
            t.page.copy_from_slice(page);
            t.epoch = epoch;
            t.seq = seq;
        } else {
            let mut buf = None;
            while self.map.len() >= cap {
                buf = self.evict_oldest();
            }
            let mut buf = buf.unwrap_or_else(|| Box::new([0; PAGE_SIZE]));
            buf.copy_from_slice(page);
            self.map.insert(
                addr,
                Twin {
                    epoch,
                    seq,
                    page: buf,
                },
            );
        }
        self.order.push_back((addr, seq));
        self.maybe_compact();
    }

    /// Drops the least recently written twin and returns its buffer.
    fn evict_oldest(&mut self) -> Option<Box<[u8; PAGE_SIZE]>> {
        while let Some((addr, seq)) = self.order.pop_front() {
            if self.map.get(&addr).is_some_and(|t| t.seq == seq) {
                self.evictions += 1;
                return self.map.remove(&addr).map(|t| t.page);
            }
        }
        None
    }

    fn maybe_compact(&mut self) {
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order
                .retain(|(addr, seq)| map.get(addr).is_some_and(|t| t.seq == *seq));
        }
    }

    /// Drops the twin of `addr`, if kept; whether there was one.
    pub fn remove(&mut self, addr: u64) -> bool {
        let removed = self.map.remove(&addr).is_some();
        if removed {
            self.maybe_compact();
        }
        removed
    }

    /// Drops the twins of every page address in `start..end` (memory unmapped); how many.
    pub fn remove_range(&mut self, start: u64, end: u64) -> usize {
        if start >= end {
            return 0;
        }
        let before = self.map.len();
        let pages = (end - start) / PAGE_SIZE as u64;
        if pages < self.map.len() as u64 {
            // Fewer pages in the range than twins: look each page up.
            let mut a = start.next_multiple_of(PAGE_SIZE as u64);
            while a < end {
                self.map.remove(&a);
                a += PAGE_SIZE as u64;
            }
            // Unaligned keys are not expected, but must not survive either.
            if start % PAGE_SIZE as u64 != 0 || end % PAGE_SIZE as u64 != 0 {
                self.map.retain(|&a, _| !(start..end).contains(&a));
            }
        } else {
            self.map.retain(|&a, _| !(start..end).contains(&a));
        }
        let removed = before - self.map.len();
        if removed > 0 {
            self.maybe_compact();
        }
        removed
    }

    /// Drops every twin (stats are kept).
    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }

    /// Bytes of page contents held (twins × [`PAGE_SIZE`]; bookkeeping adds about 60 bytes a
    /// twin on top).
    pub fn bytes(&self) -> usize {
        self.map.len() * PAGE_SIZE
    }

    /// Number of twins held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no twin is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Hits, misses and evictions so far.
    pub fn stats(&self) -> TwinStats {
        TwinStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions,
        }
    }
}

/// Hash of page addresses: a multiplicative hash of the page number (SipHash is several
/// times slower and page addresses are not attacker-chosen keys).
#[derive(Clone, Copy, Default)]
struct PageHash;

impl BuildHasher for PageHash {
    type Hasher = PageHasher;
    fn build_hasher(&self) -> PageHasher {
        PageHasher(0)
    }
}

#[derive(Default)]
struct PageHasher(u64);

impl Hasher for PageHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let h = (self.0 ^ (x >> 12) ^ (x << 52)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
