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
//! - [`Codec`]: the difference algorithms: XOR with the twin kept as its nonzero runs
//!   ([`Codec::XorRuns`], zstd for a page that changed densely), XOR then zstd ([`Codec::XorZstd`]),
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

use crate::arena::PageArena;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Size of a page, the unit of encoding.
pub const PAGE_SIZE: usize = 4096;
/// [`PAGE_SIZE`] as an address increment: the one page constant of the crate (and, through
/// `tardi_checkpointer::ranges`, of the checkpointer).
pub const PAGE: u64 = PAGE_SIZE as u64;

/// Default zstd level of [`PageCodec::new`] (see `examples/codec_compare.rs` for measurements).
pub const DEFAULT_LEVEL: i32 = 1;

/// How a page is encoded against its twin.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// VCDIFF (xdelta3) of the page against its twin.
    Xdelta3,
    /// XOR of the page with its twin, then zstd: the unchanged bytes become runs of zeros.
    XorZstd,
    /// XOR of the page with its twin, kept as its nonzero runs (offset and length of each, and
    /// its bytes: see [`PageCodec::encode_page`]). One pass over the page and no entropy coder:
    /// for a page with a few changed words (most written pages of a server) it is several
    /// times cheaper than zstd and about as small. A page changed densely falls back to
    /// [`Codec::XorZstd`].
    XorRuns,
    /// zstd of the page alone; the twin is not used.
    Zstd,
    /// The page as it is.
    Raw,
}

impl Codec {
    /// Every codec, in the order of [`Codec`]'s declaration.
    pub const ALL: [Codec; 5] = [
        Codec::Xdelta3,
        Codec::XorZstd,
        Codec::XorRuns,
        Codec::Zstd,
        Codec::Raw,
    ];

    /// The name accepted by [`FromStr`] and printed by [`Display`](fmt::Display).
    pub fn name(self) -> &'static str {
        match self {
            Codec::Xdelta3 => "xdelta3",
            Codec::XorZstd => "xor-zstd",
            Codec::XorRuns => "xor-runs",
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
    /// A difference against the twin made by `codec` ([`Codec::Xdelta3`], [`Codec::XorZstd`]
    /// or [`Codec::XorRuns`]): `len` bytes.
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
    #[error("page encoded as {0:?} is not shorter than a raw page")]
    TooLong(PageEncoding),
    #[error("{0} is not a delta codec")]
    NotADeltaCodec(Codec),
    #[error("corrupt {codec} data: {detail}")]
    Corrupt { codec: Codec, detail: String },
    #[error("creating a zstd context: {0}")]
    Context(std::io::Error),
    #[error("unknown codec {0:?} (expected xdelta3, xor-zstd, xor-runs, zstd or raw)")]
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
    /// - with a twin, [`Codec::Xdelta3`], [`Codec::XorZstd`] and [`Codec::XorRuns`] give a
    ///   [`PageEncoding::Delta`] (for `XorRuns`, one of `XorZstd` when the XOR has more than
    ///   [`RUNS_DENSE`] bytes of runs and zstd makes it smaller); without one, and for
    ///   [`Codec::Zstd`], the page is [`PageEncoding::Compressed`];
    ///
    /// The runs of [`Codec::XorRuns`]: for each maximal run of 8-byte words of the XOR that are
    /// not zero, trimmed to its first and last nonzero byte, the number of bytes since the end
    /// of the previous run (or the page start), its length (both LEB128, two bytes at most),
    /// then its bytes.
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
        if let (Codec::XorRuns, Some(twin)) = (codec, twin) {
            // One pass: the XOR tells "same" too.
            let blocks = xor_blocks(&mut self.xor, page, twin);
            let runs = xor_runs(&self.xor, blocks, &mut self.scratch[..]);
            if runs == Some(0) {
                return PageEncoding::Same;
            }
            let mut enc = runs.map(|len| PageEncoding::Delta {
                codec,
                len: len as u32,
            });
            if runs.is_none_or(|n| n > RUNS_DENSE) {
                let mut z = [0u8; PAGE_SIZE - 1];
                if let Some(len) = compress(&mut self.cctx, &self.xor[..], &mut z)
                    && runs.is_none_or(|n| (len as usize) < n)
                {
                    self.scratch[..len as usize].copy_from_slice(&z[..len as usize]);
                    enc = Some(PageEncoding::Delta {
                        codec: Codec::XorZstd,
                        len,
                    });
                }
            }
            return self.emit(enc, page, out);
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
            (Codec::Zstd | Codec::XorZstd | Codec::XorRuns | Codec::Xdelta3, _) => {
                compress(&mut self.cctx, page, &mut self.scratch[..])
                    .map(|len| PageEncoding::Compressed { len })
            }
        };
        self.emit(encoded, page, out)
    }

    /// Appends `enc`'s bytes (in `scratch`) to `out`, or the page itself when there is none.
    fn emit(&self, enc: Option<PageEncoding>, page: &[u8], out: &mut Vec<u8>) -> PageEncoding {
        match enc {
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
        if matches!(
            enc,
            PageEncoding::Delta { .. } | PageEncoding::Compressed { .. }
        ) && bytes.len() >= PAGE_SIZE
        {
            // Never produced (a raw page is shorter), and the decoders need not see it.
            return Err(DeltaError::TooLong(enc));
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
                    Codec::XorRuns => {
                        out.copy_from_slice(twin);
                        apply_runs(bytes, out)
                            .map_err(|detail| DeltaError::Corrupt { codec, detail })?;
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

/// Above this many bytes of runs, [`Codec::XorRuns`] tries zstd on the XOR as well and keeps the
/// smaller (a densely changed page: zstd's cost is then worth its ratio).
pub const RUNS_DENSE: usize = 512;

/// `dst = a ^ b` over a page; bit k of the result is set when 64-byte block k of `dst` is
/// not all zeros. Written on whole words so that it vectorises.
fn xor_blocks(dst: &mut [u8; PAGE_SIZE], a: &[u8], b: &[u8]) -> u64 {
    let mut nonzero = 0u64;
    for (k, ((d, x), y)) in dst
        .chunks_exact_mut(64)
        .zip(a.chunks_exact(64))
        .zip(b.chunks_exact(64))
        .enumerate()
    {
        let mut acc = 0u64;
        for ((d, x), y) in d
            .chunks_exact_mut(8)
            .zip(x.chunks_exact(8))
            .zip(y.chunks_exact(8))
        {
            let v = u64::from_ne_bytes(x.try_into().expect("8 bytes"))
                ^ u64::from_ne_bytes(y.try_into().expect("8 bytes"));
            d.copy_from_slice(&v.to_ne_bytes());
            acc |= v;
        }
        nonzero |= u64::from(acc != 0) << k;
    }
    nonzero
}

/// The runs of the XOR `x` (see [`PageCodec::encode_page`]) into `dst`; their length (0: the
/// XOR is all zeros), or `None` when they do not fit in `dst`. `blocks` is [`xor_blocks`]'s
/// map of the 64-byte blocks that are not zero: only those are looked at.
fn xor_runs(x: &[u8; PAGE_SIZE], mut blocks: u64, dst: &mut [u8]) -> Option<usize> {
    const WORDS: usize = PAGE_SIZE / 8;
    let word = |i: usize| u64::from_le_bytes(x[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let (mut o, mut prev_end, mut i) = (0usize, 0usize, 0usize);
    while blocks != 0 {
        // The first word of the next nonzero block at or after word i.
        i = i.max(blocks.trailing_zeros() as usize * 8);
        let w = word(i);
        if w == 0 {
            i += 1;
            if i.is_multiple_of(8) {
                blocks &= blocks - 1; // this block is done
            }
            continue;
        }
        let mut j = i + 1;
        while j < WORDS && word(j) != 0 {
            j += 1;
        }
        // Little-endian: the lowest-addressed byte is the least significant.
        let start = i * 8 + (w.trailing_zeros() / 8) as usize;
        let end = j * 8 - (word(j - 1).leading_zeros() / 8) as usize;
        let need = 4 + (end - start);
        if o + need > dst.len() {
            return None;
        }
        o += put_varint(&mut dst[o..], start - prev_end);
        o += put_varint(&mut dst[o..], end - start);
        dst[o..o + end - start].copy_from_slice(&x[start..end]);
        o += end - start;
        prev_end = end;
        i = j;
        // Blocks wholly before word i are done.
        let done = i / 8;
        blocks &= if done >= 64 { 0 } else { !0u64 << done };
    }
    Some(o)
}

/// LEB128 of `v` (< 2^14) into `dst`; the bytes written (1 or 2).
fn put_varint(dst: &mut [u8], v: usize) -> usize {
    debug_assert!(v < 1 << 14);
    if v < 0x80 {
        dst[0] = v as u8;
        1
    } else {
        dst[0] = (v as u8 & 0x7f) | 0x80;
        dst[1] = (v >> 7) as u8;
        2
    }
}

/// Reads a LEB128 value of at most two bytes at `bytes[*at..]`.
fn get_varint(bytes: &[u8], at: &mut usize) -> Result<usize, String> {
    let b0 = *bytes.get(*at).ok_or("truncated run header")? as usize;
    *at += 1;
    if b0 < 0x80 {
        return Ok(b0);
    }
    let b1 = *bytes.get(*at).ok_or("truncated run header")? as usize;
    *at += 1;
    if b1 >= 0x80 {
        return Err("run header longer than two bytes".into());
    }
    Ok((b0 & 0x7f) | b1 << 7)
}

/// XORs the runs `bytes` (see [`PageCodec::encode_page`]) into `out`. Rejects what the encoder
/// never makes: an empty run, or one past the page end.
fn apply_runs(bytes: &[u8], out: &mut [u8; PAGE_SIZE]) -> Result<(), String> {
    let (mut at, mut pos) = (0usize, 0usize);
    while at < bytes.len() {
        let skip = get_varint(bytes, &mut at)?;
        let len = get_varint(bytes, &mut at)?;
        if len == 0 {
            return Err(format!("empty run at byte {at}"));
        }
        pos += skip;
        if pos + len > PAGE_SIZE || at + len > bytes.len() {
            return Err(format!("run of {len} bytes at offset {pos} overflows"));
        }
        xor_in_place(&mut out[pos..pos + len], &bytes[at..at + len]);
        at += len;
        pos += len;
    }
    Ok(())
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
    /// Its slot in [`TwinStore::arena`].
    slot: u32,
}

/// The twins (last sent contents) of recently written pages, keyed by page address, holding at
/// most `budget` bytes of page contents; when full, the least recently written page (the one
/// whose last [`TwinStore::put`] is oldest) is evicted. A budget under one page disables it.
///
/// Recency is kept as a queue of (address, write sequence number) with lazy deletion: a
/// re-write pushes a new entry and leaves the old one stale; eviction pops from the front,
/// skipping stale entries; the queue is compacted when it holds more stale entries than live
/// ones. Every operation is O(1) amortised, and evicted slots are reused for new twins.
///
/// The contents live in one huge-page arena (`arena.rs`: page-aligned slots, so reading a cold
/// twin does not also miss the TLB), mapped at the first twin kept.
pub struct TwinStore {
    budget: usize,
    map: HashMap<u64, Twin, PageHash>,
    /// `None` until the first [`TwinStore::put`], or if the mapping failed (then no twin is
    /// kept: every page is encoded alone, correct but larger).
    arena: Option<PageArena>,
    /// Slots freed by [`TwinStore::remove`] and friends.
    free: Vec<u32>,
    /// Slots below this have been handed out at least once.
    fresh: u32,
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
            arena: None,
            free: Vec::new(),
            fresh: 0,
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
        (self.budget / PAGE_SIZE).min(u32::MAX as usize)
    }

    fn slot(&self, t: &Twin) -> &[u8] {
        match &self.arena {
            Some(a) => a.slot(t.slot as usize),
            None => unreachable!("a twin is kept only with an arena"),
        }
    }

    /// A slot for a new twin: a freed one, the next never used, or the least recently written
    /// twin's (evicted); `None` if no twin can be kept.
    fn take_slot(&mut self, cap: usize) -> Option<u32> {
        if self.arena.is_none() {
            self.arena = Some(PageArena::new(cap)?);
        }
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if (self.fresh as usize) < cap {
            self.fresh += 1;
            return Some(self.fresh - 1);
        }
        self.evict_oldest()
    }

    /// The twin of the page at `addr`, if kept (counted as a hit or a miss).
    pub fn get(&self, addr: u64) -> Option<&[u8]> {
        match self.map.get(&addr) {
            Some(t) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(self.slot(t))
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
        let slot = match self.map.get_mut(&addr) {
            Some(t) => {
                (t.epoch, t.seq) = (epoch, seq);
                t.slot
            }
            None => {
                let Some(slot) = self.take_slot(cap) else {
                    return;
                };
                self.map.insert(addr, Twin { epoch, seq, slot });
                slot
            }
        };
        if let Some(a) = &mut self.arena {
            a.slot_mut(slot as usize).copy_from_slice(page);
        }
        self.next_seq += 1;
        self.order.push_back((addr, seq));
        self.maybe_compact();
    }

    /// Drops the least recently written twin and returns its slot.
    fn evict_oldest(&mut self) -> Option<u32> {
        while let Some((addr, seq)) = self.order.pop_front() {
            if self.map.get(&addr).is_some_and(|t| t.seq == seq) {
                self.evictions += 1;
                return self.map.remove(&addr).map(|t| t.slot);
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
        let Some(t) = self.map.remove(&addr) else {
            return false;
        };
        self.free.push(t.slot);
        self.maybe_compact();
        true
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
                if let Some(t) = self.map.remove(&a) {
                    self.free.push(t.slot);
                }
                a += PAGE_SIZE as u64;
            }
            // Unaligned keys are not expected, but must not survive either.
            if !start.is_multiple_of(PAGE_SIZE as u64) || !end.is_multiple_of(PAGE_SIZE as u64) {
                self.retain_outside(start, end);
            }
        } else {
            self.retain_outside(start, end);
        }
        let removed = before - self.map.len();
        if removed > 0 {
            self.maybe_compact();
        }
        removed
    }

    /// Drops the twins of the addresses in `start..end` by a walk over all twins.
    fn retain_outside(&mut self, start: u64, end: u64) {
        let free = &mut self.free;
        self.map.retain(|a, t| {
            let inside = (start..end).contains(a);
            if inside {
                free.push(t.slot);
            }
            !inside
        });
    }

    /// Drops every twin (stats are kept).
    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
        self.free.clear();
        self.fresh = 0;
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

#[cfg(test)]
mod tests;
