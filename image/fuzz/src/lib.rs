//! What the AFL++ targets share: the test chains and the receiver-side check of
//! `tardi-image`'s own tests (`../tests/common`), and the targets' input formats.
//!
//! Inputs skip what a mutator only breaks without reaching deeper (magic, lengths, checksum):
//! - `apply`: `kind u8 | meta_len u32 LE | meta | data`, framed into a checkpoint with correct
//!   lengths and checksum, read with `Checkpoint::from_bytes` and applied to the receiver's
//!   image at the checkpoint's base epoch (or at the last epoch);
//! - `page`: `tag u8 | twin u8 | bytes`: the tag picks the encoding (with `len` = the bytes'
//!   length) and the twin byte which twin `PageCodec::decode_page` gets.

#[path = "../../tests/common/mod.rs"]
pub mod common;

use common::mutate;
use std::sync::OnceLock;
use tardi_image::delta::{Codec, PAGE_SIZE, PageEncoding};
use tardi_image::image::Checkpoint;
use tardi_image::store::Image;

/// The chain every `apply` input is checked against (and the seeds come from).
pub fn chain() -> &'static common::chain::Chain {
    static CHAIN: OnceLock<common::chain::Chain> = OnceLock::new();
    CHAIN.get_or_init(|| common::chain::build(1, 6))
}

/// The receiver's image after each checkpoint of [`chain`], as a full checkpoint and the bytes
/// of its `to_full`.
fn bases() -> &'static [(Checkpoint, Vec<u8>)] {
    static BASES: OnceLock<Vec<(Checkpoint, Vec<u8>)>> = OnceLock::new();
    BASES.get_or_init(|| {
        let ch = chain();
        let mut img = Image::from_full(&ch.cks[0]).expect("chain");
        ch.cks
            .iter()
            .map(|ck| {
                img.apply(ck).expect("chain");
                let full = img.to_full();
                let bytes = Image::from_full(&full).expect("chain").to_full().to_bytes();
                (full, bytes)
            })
            .collect()
    })
}

/// `ck` in the `apply` input format.
pub fn apply_input(ck: &Checkpoint) -> Vec<u8> {
    let bytes = ck.to_bytes();
    let (kind, _, meta, data) = mutate::split(&bytes);
    let mut v = vec![kind as u8];
    v.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    v.extend_from_slice(&meta);
    v.extend_from_slice(&data);
    v
}

pub fn run_apply(input: &[u8]) {
    let Some((&kind, rest)) = input.split_first() else {
        return;
    };
    let Some((len, rest)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let meta_len = (u32::from_le_bytes(*len) as usize).min(rest.len());
    let (meta, data) = rest.split_at(meta_len);
    let bytes = mutate::frame(u32::from(kind), 9, meta, data);
    let Ok(ck) = Checkpoint::from_bytes(bytes) else {
        return;
    };
    let bases = bases();
    let at = ck
        .image
        .base_epoch
        .map_or(bases.len() - 1, |b| (b as usize).min(bases.len() - 1));
    let (base, before) = &bases[at];
    mutate::check_apply(base, before, &ck);
}

/// The encoding a `page` input's tag byte picks, for `len` bytes.
pub fn page_encoding(tag: u8, len: usize) -> PageEncoding {
    let len = len as u32;
    match tag % (4 + Codec::ALL.len() as u8) {
        0 => PageEncoding::Zero,
        1 => PageEncoding::Same,
        2 => PageEncoding::Raw,
        3 => PageEncoding::Compressed { len },
        k => PageEncoding::Delta {
            codec: Codec::ALL[(k - 4) as usize],
            len,
        },
    }
}

/// The tag byte of `enc` (inverse of [`page_encoding`]).
pub fn page_tag(enc: PageEncoding) -> u8 {
    match enc {
        PageEncoding::Zero => 0,
        PageEncoding::Same => 1,
        PageEncoding::Raw => 2,
        PageEncoding::Compressed { .. } => 3,
        PageEncoding::Delta { codec, .. } => {
            4 + Codec::ALL.iter().position(|&c| c == codec).unwrap_or(0) as u8
        }
    }
}

/// The twins a `page` input can name: pages of the chain.
pub fn twins() -> &'static [Vec<u8>] {
    static TWINS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    TWINS.get_or_init(|| {
        chain().pages[0]
            .values()
            .take(16)
            .map(|p| p.to_vec())
            .collect()
    })
}

pub fn run_page(input: &[u8], codec: &mut tardi_image::delta::PageCodec) {
    let [tag, twin, bytes @ ..] = input else {
        return;
    };
    let twins = twins();
    let twin = match *twin as usize {
        255 => None,
        254 => Some(&input[..input.len().min(PAGE_SIZE)]), // a twin of the wrong length
        i => Some(&twins[i % twins.len()][..]),
    };
    let mut out = [0u8; PAGE_SIZE];
    let _ = codec.decode_page(page_encoding(*tag, bytes.len()), twin, bytes, &mut out);
}
