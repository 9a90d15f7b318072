//! Mutators of checkpoints: of the bytes as they travel (bit flips, truncation, splices, header
//! fields), of the metadata and page data under a correct frame (so the mutation gets past the
//! checksum into postcard and the consistency checks), and of the decoded structure (lengths,
//! offsets and addresses set huge, unaligned or overlapping, indices out of range, vectors
//! reordered or duplicated, encodings swapped), plus the receiver-side check every mutated
//! checkpoint must pass.

use rand::rngs::StdRng;
use rand::{Rng, RngCore};
use tardi_image::delta::{Codec, PAGE_SIZE, PageEncoding};
use tardi_image::files::Entry;
use tardi_image::image::*;
use tardi_image::store::Image;

const HEADER_LEN: usize = 40;

/// A checkpoint's bytes with a correct header and checksum around `meta` and `data`.
pub fn frame(kind: u32, epoch: u64, meta: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + meta.len() + data.len() + 4);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(&epoch.to_le_bytes());
    v.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    v.extend_from_slice(&(data.len() as u64).to_le_bytes());
    v.extend_from_slice(meta);
    v.extend_from_slice(data);
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

/// The kind code, epoch, metadata and data of a checkpoint's bytes (as written by `to_bytes`).
pub fn split(bytes: &[u8]) -> (u32, u64, Vec<u8>, Vec<u8>) {
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let kind = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
    let meta_len = u64_at(24) as usize;
    let meta = bytes[HEADER_LEN..HEADER_LEN + meta_len].to_vec();
    let data = bytes[HEADER_LEN + meta_len..bytes.len() - 4].to_vec();
    (kind, u64_at(16), meta, data)
}

/// A value worth trying where a length, offset, count or address goes.
pub fn nasty(rng: &mut StdRng) -> u64 {
    const V: [u64; 20] = [
        0,
        1,
        4095,
        4096,
        4097,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        0x1_0000_0000,
        0x7fff_ffff_f000,
        0x8000_0000_0000,
        i64::MAX as u64,
        1 << 63,
        u64::MAX - 4095,
        u64::MAX - 4096,
        u64::MAX - 8191,
        u64::MAX - (1 << 20) + 1,
        u64::MAX - 1,
        u64::MAX,
        u64::MAX / 4096,
    ];
    match rng.random_range(0..4) {
        0 | 1 => V[rng.random_range(0..V.len())],
        2 => rng.random::<u64>() & !0xfff,
        _ => rng.random(),
    }
}

/// Flips, overwrites, inserts, deletes or duplicates bytes of `v`, `n` times.
pub fn scramble(rng: &mut StdRng, v: &mut Vec<u8>, n: usize) {
    for _ in 0..n {
        let len = v.len();
        match rng.random_range(0..8) {
            0 | 1 if len > 0 => {
                let i = rng.random_range(0..len);
                v[i] ^= 1 << rng.random_range(0..8);
            }
            2 if len > 0 => {
                let i = rng.random_range(0..len);
                v[i] = [0, 0xff, 0x80, 0x7f, 1][rng.random_range(0..5)];
            }
            3 if len > 0 => {
                // A varint as large as it gets: 0xff... then a terminator.
                let i = rng.random_range(0..len);
                let k = rng.random_range(1..10).min(len - i);
                v[i..i + k].fill(0xff);
                if i + k < len {
                    v[i + k] = 0x01;
                }
            }
            4 => {
                let i = rng.random_range(0..=len);
                let junk: Vec<u8> = (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
                v.splice(i..i, junk);
            }
            5 if len > 0 => {
                let i = rng.random_range(0..len);
                let k = rng.random_range(1..=16.min(len - i));
                v.drain(i..i + k);
            }
            6 if len > 1 => {
                // Copy a chunk over another place.
                let (a, b) = (rng.random_range(0..len), rng.random_range(0..len));
                let k = rng.random_range(1..=32).min(len - a).min(len - b);
                let chunk = v[a..a + k].to_vec();
                v[b..b + k].copy_from_slice(&chunk);
            }
            _ => {
                if len > 0 {
                    let i = rng.random_range(0..len);
                    v.truncate(i);
                }
            }
        }
    }
}

/// Mutates the bytes as they travel; the checksum or the header may no longer match.
pub fn mutate_wire(rng: &mut StdRng, bytes: &mut Vec<u8>, other: &[u8]) {
    match rng.random_range(0..7) {
        0 => {
            let n = rng.random_range(1..4);
            scramble(rng, bytes, n)
        }
        1 => {
            let i = rng.random_range(0..=bytes.len());
            bytes.truncate(i);
        }
        2 => {
            // Splice: the head of one checkpoint, the tail of another.
            let i = rng.random_range(0..=bytes.len());
            let j = rng.random_range(0..=other.len());
            bytes.truncate(i);
            bytes.extend_from_slice(&other[j..]);
        }
        3 if bytes.len() >= HEADER_LEN => {
            // A header field set to something nasty.
            let o = [8, 12, 16, 24, 32][rng.random_range(0..5)];
            let w = if o < 16 { 4 } else { 8 };
            let v = nasty(rng).to_le_bytes();
            bytes[o..o + w].copy_from_slice(&v[..w]);
        }
        4 if bytes.len() >= HEADER_LEN => {
            // Lengths moved between meta and data, total kept: the checksum still matches.
            let meta = u64::from_le_bytes(bytes[24..32].try_into().unwrap());
            let data = u64::from_le_bytes(bytes[32..40].try_into().unwrap());
            let shift = rng.random_range(0..=meta.min(64));
            bytes[24..32].copy_from_slice(&(meta - shift).to_le_bytes());
            bytes[32..40].copy_from_slice(&(data + shift).to_le_bytes());
            let n = bytes.len() - 4;
            let crc = crc32fast::hash(&bytes[..n]);
            bytes[n..].copy_from_slice(&crc.to_le_bytes());
        }
        5 => bytes.extend((0..rng.random_range(1..64)).map(|_| rng.random::<u8>())),
        _ => {
            let mut junk = vec![0u8; rng.random_range(0..200)];
            rng.fill_bytes(&mut junk);
            if rng.random_bool(0.5) && junk.len() >= 8 {
                junk[..8].copy_from_slice(MAGIC);
            }
            *bytes = junk;
        }
    }
}

/// Mutates the metadata and/or the page data and frames the result correctly, so the
/// mutation reaches the decoder and the checks behind the checksum.
pub fn mutate_framed(rng: &mut StdRng, bytes: &[u8]) -> Vec<u8> {
    let (mut kind, mut epoch, mut meta, mut data) = split(bytes);
    match rng.random_range(0..6) {
        0..=2 => {
            let n = rng.random_range(1..4);
            scramble(rng, &mut meta, n)
        }
        3 => {
            let n = rng.random_range(1..4);
            scramble(rng, &mut data, n)
        }
        4 => {
            scramble(rng, &mut meta, 1);
            scramble(rng, &mut data, 1);
        }
        _ => {
            kind = rng.random_range(0..3);
            epoch = nasty(rng);
        }
    }
    frame(kind, epoch, &meta, &data)
}

/// Mutates the decoded checkpoint: one semantic change that a consistent producer never
/// makes (or, sometimes, one it could).
pub fn mutate_struct(rng: &mut StdRng, ck: &mut Checkpoint) {
    let img = &mut ck.image;
    let pick = |rng: &mut StdRng, n: usize| (n > 0).then(|| rng.random_range(0..n));
    match rng.random_range(0..32) {
        0 => {
            if let Some(i) = pick(rng, img.runs.len()) {
                img.runs[i].data_off = nasty(rng);
            }
        }
        1 => {
            if let Some(i) = pick(rng, img.runs.len()) {
                img.runs[i].len = nasty(rng);
            }
        }
        2 => {
            if let Some(i) = pick(rng, img.runs.len()) {
                img.runs[i].addr = nasty(rng);
            }
        }
        3 => {
            // The same data for two runs (amplification), or a run duplicated.
            if let Some(i) = pick(rng, img.runs.len()) {
                let mut r = img.runs[i];
                if rng.random_bool(0.5) {
                    r.addr = r.addr.wrapping_add(r.len);
                }
                img.runs.push(r);
            }
        }
        4 => {
            if let Some(i) = pick(rng, img.pages.len()) {
                img.pages[i].data_off = nasty(rng);
            }
        }
        5 => {
            if let Some(i) = pick(rng, img.pages.len()) {
                img.pages[i].addr = nasty(rng);
            }
        }
        6 => {
            // Another encoding tag for the same bytes (length kept or not).
            if let Some(i) = pick(rng, img.pages.len()) {
                let len = match rng.random_range(0..3) {
                    0 => img.pages[i].enc.encoded_len() as u32,
                    1 => nasty(rng) as u32,
                    _ => rng.random_range(0..4200),
                };
                let codec = Codec::ALL[rng.random_range(0..4)];
                img.pages[i].enc = match rng.random_range(0..5) {
                    0 => PageEncoding::Zero,
                    1 => PageEncoding::Same,
                    2 => PageEncoding::Raw,
                    3 => PageEncoding::Delta { codec, len },
                    _ => PageEncoding::Compressed { len },
                };
            }
        }
        7 => {
            // A page listed twice, or pages out of order.
            if let Some(i) = pick(rng, img.pages.len()) {
                if rng.random_bool(0.5) {
                    let p = img.pages[i];
                    img.pages.push(p);
                } else {
                    img.pages.reverse();
                }
            }
        }
        8 => {
            if let Some(i) = pick(rng, img.vmas.len()) {
                let v = &mut img.vmas[i];
                match rng.random_range(0..4) {
                    0 => std::mem::swap(&mut v.start, &mut v.end),
                    1 => v.end = nasty(rng),
                    2 => v.start = nasty(rng),
                    _ => v.start = v.start.wrapping_add(1),
                }
            }
        }
        9 => {
            // Overlapping or reordered mappings.
            if let Some(i) = pick(rng, img.vmas.len()) {
                if rng.random_bool(0.5) {
                    let mut v = img.vmas[i].clone();
                    v.start = v.start.wrapping_add(4096);
                    img.vmas.push(v);
                } else {
                    img.vmas.reverse();
                }
            }
        }
        10 => {
            if let Some(i) = pick(rng, img.vmas.len()) {
                img.vmas[i].backing = Backing::File {
                    index: nasty(rng) as u32 % (img.files.len() as u32 + 3),
                    offset: nasty(rng),
                };
            }
        }
        11 => {
            // Mappings removed (pages now outside the layout).
            if let Some(i) = pick(rng, img.vmas.len()) {
                img.vmas.remove(i);
            }
        }
        12 => {
            if let Some(i) = pick(rng, img.threads.len()) {
                let t = &mut img.threads[i];
                match rng.random_range(0..5) {
                    0 => t.regs.truncate(rng.random_range(0..27)),
                    1 => t.regs.push(0),
                    2 => t.xstate = vec![0; rng.random_range(4000..20000)],
                    3 => t.tid = nasty(rng) as i32,
                    _ => {
                        let t = t.clone();
                        img.threads.push(t);
                    }
                }
            }
        }
        13 => img.threads.clear(),
        14 => img.pid = nasty(rng) as i32,
        15 => {
            let s = if rng.random_bool(0.5) {
                &mut img.cwd
            } else {
                &mut img.exe.path
            };
            s.insert(rng.random_range(0..=s.len()), '\0');
        }
        16 => {
            for f in &mut img.fds {
                if let FdKind::Path { path, .. } = &mut f.kind {
                    path.push('\0');
                    break;
                }
            }
        }
        17 => {
            if let Some(i) = pick(rng, img.fds.len()) {
                img.fds[i].fd = [-1, i32::MAX, i32::MIN, 0, 3][rng.random_range(0..5)];
            }
        }
        18 => {
            if let Some(i) = pick(rng, img.sigactions.len()) {
                img.sigactions[i].signo = nasty(rng) as u32;
            }
        }
        19 => {
            // Ranges upside down or huge.
            let r = (nasty(rng), nasty(rng));
            if rng.random_bool(0.5) {
                img.reset.push(r);
            } else {
                img.cow.push(r);
            }
        }
        20 => {
            let pf = &mut img.private_files;
            let bad = [
                "/data/../etc/passwd",
                "/etc/passwd",
                "data/x",
                "/data//x",
                "/data/./x",
                "/data/",
                "/data",
                "/data/x\0y",
                "/dat",
                "",
            ];
            let p = bad[rng.random_range(0..bad.len())].to_string();
            if rng.random_bool(0.5) {
                pf.upsert.push((
                    p,
                    Entry::File {
                        mode: 0o644,
                        content: vec![1],
                    },
                ));
            } else {
                pf.remove.push(p);
            }
        }
        21 => {
            let pf = &mut img.private_files;
            pf.dirs = match rng.random_range(0..4) {
                0 => vec![],
                1 => vec!["/".into()],
                2 => vec!["/other".into()],
                _ => vec!["/data/".into(), "relative".into()],
            };
        }
        22 => img.private_files.upsert.push((
            "/data/ln2".into(),
            Entry::Symlink {
                target: "a\0b".into(),
            },
        )),
        23 => {
            // The kind and the base epoch disagree, or the chain is broken.
            match rng.random_range(0..3) {
                0 => ck.kind = Kind::Full,
                1 => ck.kind = Kind::Incremental { base: nasty(rng) },
                _ => img.base_epoch = Some(nasty(rng)),
            }
        }
        24 => ck.epoch = nasty(rng),
        25 => {
            let n = ck.data.len();
            ck.data.truncate(rng.random_range(0..=n));
        }
        26 => {
            if !ck.data.is_empty() {
                let n = rng.random_range(1..=16.min(ck.data.len()));
                for _ in 0..n {
                    let i = rng.random_range(0..ck.data.len());
                    ck.data[i] = rng.random();
                }
            }
        }
        27 => img.sandbox = vec![0xff; rng.random_range(0..64)],
        28 => {
            // Every page of the data as a Zero-encoded page of a file mapping (allowed:
            // receiver memory per byte received is what a page list can cost).
            if let Some(v) = img.vmas.iter().find(|v| v.backing != Backing::Anon) {
                let (s, e) = (v.start, v.end);
                let n = (e.saturating_sub(s) / PAGE_SIZE as u64).min(64);
                for k in 0..n {
                    img.pages.push(EncodedPage {
                        addr: s.wrapping_add(k * PAGE_SIZE as u64),
                        enc: PageEncoding::Zero,
                        data_off: 0,
                    });
                }
            }
        }
        29 => {
            img.rlimits
                .push((nasty(rng) as u32, nasty(rng), nasty(rng)));
            img.auxv
                .extend((0..rng.random_range(0..100)).map(|_| nasty(rng)));
        }
        30 => img.max_tid = nasty(rng) as i32,
        _ => {
            // Two mutations at once.
            mutate_struct(rng, ck);
            mutate_struct(rng, ck);
        }
    }
}

/// What a receiver must do with any candidate, valid or not: never panic; refuse with nothing
/// applied, or apply to an image that still turns into a valid full checkpoint. `base` is the
/// receiver's image as a full checkpoint, `before` its bytes. Returns whether it applied.
pub fn check_apply(base: &Checkpoint, before: &[u8], ck: &Checkpoint) -> bool {
    let mut img = Image::from_full(base).expect("the base image");
    match img.apply(ck) {
        Ok(()) => {
            let full = img.to_full();
            full.validate()
                .unwrap_or_else(|e| panic!("applied, but to_full is inconsistent: {e}"));
            let back = Checkpoint::from_bytes(full.to_bytes())
                .unwrap_or_else(|e| panic!("applied, but to_full does not read back: {e}"));
            Image::from_full(&back)
                .unwrap_or_else(|e| panic!("applied, but to_full is refused: {e}"));
            true
        }
        Err(e) => {
            // Its message must name something; the image must be untouched.
            assert!(!e.to_string().is_empty());
            let after = img.to_full().to_bytes();
            assert!(
                after == before && img.epoch == base.epoch,
                "refused ({e}) but the image changed"
            );
            false
        }
    }
}
