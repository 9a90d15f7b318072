use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn rng() -> StdRng {
    StdRng::seed_from_u64(0x7a2d1)
}

fn random_page(rng: &mut StdRng) -> Vec<u8> {
    let mut p = vec![0u8; PAGE_SIZE];
    rng.fill(&mut p[..]);
    p
}

/// A compressible page that looks like heap data: small integers, pointers, text.
fn heapish_page(rng: &mut StdRng) -> Vec<u8> {
    let mut p = Vec::with_capacity(PAGE_SIZE);
    while p.len() < PAGE_SIZE {
        match rng.random_range(0..3) {
            0 => p.extend_from_slice(&rng.random_range(0u64..1000).to_le_bytes()),
            1 => p.extend_from_slice(
                &(0x5555_5555_0000u64 + rng.random_range(0u64..4096) * 16).to_le_bytes(),
            ),
            _ => p.extend_from_slice(b"key:0000"),
        }
    }
    p.truncate(PAGE_SIZE);
    p
}

/// Encodes (appending after junk), checks the tag survives postcard, decodes, compares.
fn roundtrip(pc: &mut PageCodec, codec: Codec, twin: Option<&[u8]>, page: &[u8]) -> PageEncoding {
    let mut out = vec![0xAB; 7];
    let enc = pc.encode_page(codec, twin, page, &mut out);
    assert_eq!(&out[..7], &[0xAB; 7], "encode must append");
    assert_eq!(out.len() - 7, enc.encoded_len(), "{codec} {enc:?}");
    let wire = postcard::to_allocvec(&enc).unwrap();
    assert!(wire.len() <= 4, "{enc:?} takes {} bytes", wire.len());
    let enc2: PageEncoding = postcard::from_bytes(&wire).unwrap();
    assert_eq!(enc, enc2);
    let mut back = [0x55u8; PAGE_SIZE];
    pc.decode_page(enc2, twin, &out[7..], &mut back).unwrap();
    assert!(back[..] == *page, "{codec} {enc:?} did not round-trip");
    enc
}

#[test]
fn codec_names() {
    for c in Codec::ALL {
        assert_eq!(c.to_string().parse::<Codec>().unwrap(), c);
    }
    assert_eq!("xor-zstd".parse::<Codec>().unwrap(), Codec::XorZstd);
    assert!(matches!(
        "lz4".parse::<Codec>(),
        Err(DeltaError::UnknownCodec(_))
    ));
}

#[test]
fn random_pages_fall_back_to_raw() {
    let mut rng = rng();
    let mut pc = PageCodec::new().unwrap();
    for _ in 0..20 {
        let twin = random_page(&mut rng);
        let page = random_page(&mut rng);
        for c in Codec::ALL {
            assert_eq!(
                roundtrip(&mut pc, c, Some(&twin), &page),
                PageEncoding::Raw,
                "{c}"
            );
            assert_eq!(roundtrip(&mut pc, c, None, &page), PageEncoding::Raw, "{c}");
        }
    }
}

#[test]
fn compressible_pages_without_twin() {
    let mut rng = rng();
    let mut pc = PageCodec::new().unwrap();
    for _ in 0..20 {
        let page = heapish_page(&mut rng);
        for c in [Codec::Zstd, Codec::XorZstd, Codec::Xdelta3] {
            let enc = roundtrip(&mut pc, c, None, &page);
            assert!(
                matches!(enc, PageEncoding::Compressed { len } if (len as usize) < PAGE_SIZE / 2),
                "{c}: {enc:?}"
            );
        }
        assert_eq!(
            roundtrip(&mut pc, Codec::Raw, None, &page),
            PageEncoding::Raw
        );
    }
}

/// Every kind of small change, on random and on compressible twins.
fn small_changes(rng: &mut StdRng, twin: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut v = Vec::new();
    let mut p = twin.to_vec();
    p[rng.random_range(0..PAGE_SIZE)] ^= 1;
    v.push(("one byte", p));
    let mut p = twin.to_vec();
    for _ in 0..4 {
        p[rng.random_range(0..PAGE_SIZE)] = rng.random();
    }
    v.push(("a few bytes", p));
    let mut p = twin.to_vec();
    for _ in 0..8 {
        let i = rng.random_range(0..PAGE_SIZE / 8) * 8;
        p[i..i + 8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
    }
    v.push(("scattered u64s", p));
    let mut p = twin.to_vec();
    p.copy_within(1000..2000, 1016);
    v.push(("shifted block", p));
    let mut p = twin.to_vec();
    p[0..64].fill(0);
    v.push(("zeroed line", p));
    let mut p = twin.to_vec();
    p[PAGE_SIZE - 1] = p[PAGE_SIZE - 1].wrapping_add(1);
    v.push(("last byte", p));
    v
}

#[test]
fn small_changes_round_trip_and_shrink() {
    let mut rng = rng();
    let mut pc = PageCodec::new().unwrap();
    for round in 0..10 {
        let twin = if round % 2 == 0 {
            random_page(&mut rng)
        } else {
            heapish_page(&mut rng)
        };
        for (what, page) in small_changes(&mut rng, &twin) {
            for c in Codec::ALL {
                let enc = roundtrip(&mut pc, c, Some(&twin), &page);
                match c {
                    Codec::XorRuns => {
                        // Dense changes may fall back to xor-zstd, or raw.
                        let limit = if what == "shifted block" {
                            PAGE_SIZE
                        } else {
                            200
                        };
                        assert!(
                            matches!(enc, PageEncoding::Delta { codec: Codec::XorRuns | Codec::XorZstd, len } if (len as usize) < limit)
                                || (limit == PAGE_SIZE && enc == PageEncoding::Raw),
                            "{c} on {what}: {enc:?}"
                        );
                    }
                    Codec::XorZstd | Codec::Xdelta3 => {
                        let limit = if what == "shifted block" && c == Codec::XorZstd {
                            // XOR cannot see a shift: the moved bytes differ, 1 KiB of
                            // random data.
                            PAGE_SIZE
                        } else {
                            200
                        };
                        assert!(
                            matches!(enc, PageEncoding::Delta { codec, len } if codec == c && (len as usize) < limit)
                                || (limit == PAGE_SIZE && enc == PageEncoding::Raw),
                            "{c} on {what}: {enc:?}"
                        );
                    }
                    Codec::Raw => assert_eq!(enc, PageEncoding::Raw),
                    Codec::Zstd => assert!(
                        matches!(enc, PageEncoding::Raw | PageEncoding::Compressed { .. }),
                        "{c} on {what}: {enc:?}"
                    ),
                }
            }
        }
    }
}

/// xor-runs: exact sizes for known changes, runs across block and page edges, and the
/// fall-back to zstd for a dense change.
#[test]
fn xor_runs_sizes_and_edges() {
    let mut rng = rng();
    let mut pc = PageCodec::new().unwrap();
    let twin = heapish_page(&mut rng);
    let runs = |pc: &mut PageCodec, page: &[u8]| roundtrip(pc, Codec::XorRuns, Some(&twin), page);
    // One byte in the middle: skip (2 bytes), length (1), the byte.
    let mut p = twin.clone();
    p[1000] ^= 0x40;
    assert_eq!(
        runs(&mut pc, &p),
        PageEncoding::Delta {
            codec: Codec::XorRuns,
            len: 4
        }
    );
    // First and last bytes of the page: two runs, skips 0 and 4094.
    let mut p = twin.clone();
    p[0] ^= 1;
    p[PAGE_SIZE - 1] ^= 1;
    assert_eq!(
        runs(&mut pc, &p),
        PageEncoding::Delta {
            codec: Codec::XorRuns,
            len: 7
        }
    );
    // A run across a 64-byte block edge and word edges, with zero bytes inside it.
    let mut p = twin.clone();
    for i in [60, 61, 70, 79] {
        p[i] ^= 0xff;
    }
    assert_eq!(
        runs(&mut pc, &p),
        PageEncoding::Delta {
            codec: Codec::XorRuns,
            len: 2 + 20
        }
    );
    // Every other word changed: many runs, more than RUNS_DENSE bytes; zstd is not
    // smaller on random bytes, so the runs stay.
    let mut p = twin.clone();
    for w in (0..PAGE_SIZE / 8).step_by(2) {
        p[w * 8..w * 8 + 8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
    }
    let enc = runs(&mut pc, &p);
    assert!(
        matches!(enc, PageEncoding::Delta { len, .. } if len as usize > RUNS_DENSE),
        "{enc:?}"
    );
    // A dense change with a pattern: zstd of the XOR wins.
    let mut p = twin.clone();
    for (i, b) in p.iter_mut().enumerate() {
        *b ^= (i % 3 + 1) as u8;
    }
    let enc = runs(&mut pc, &p);
    assert!(
        matches!(enc, PageEncoding::Delta { codec: Codec::XorZstd, len } if len < 200),
        "{enc:?}"
    );
}

/// xor-runs round-trips pages changed at random places, a few bytes to most of the page
/// (runs that start, end and cross 64-byte blocks anywhere).
#[test]
fn xor_runs_round_trips_random_changes() {
    let mut rng = rng();
    let mut pc = PageCodec::new().unwrap();
    for round in 0..3000 {
        let twin = heapish_page(&mut rng);
        let mut page = twin.clone();
        let n = [1, 3, 20, 200, 3000][round % 5];
        for _ in 0..n {
            let at = rng.random_range(0..PAGE_SIZE);
            let len = rng.random_range(1..=24).min(PAGE_SIZE - at);
            for b in &mut page[at..at + len] {
                *b = rng.random();
            }
        }
        roundtrip(&mut pc, Codec::XorRuns, Some(&twin), &page);
    }
}

/// The runs decoder rejects what the encoder never makes, without panicking.
#[test]
fn xor_runs_rejects_malformed_runs() {
    let mut pc = PageCodec::new().unwrap();
    let twin = vec![7u8; PAGE_SIZE];
    let mut out = [0u8; PAGE_SIZE];
    for (what, bytes) in [
        ("empty run", vec![0u8, 0]),
        ("truncated header", vec![0x80]),
        ("three-byte header", vec![0x80, 0x80, 0x01, 1, 9]),
        ("past the page end", vec![0xff, 0x1f, 2, 1, 1]),
        ("run longer than the bytes", vec![0, 5, 1, 2]),
        ("length only", vec![3]),
    ] {
        let enc = PageEncoding::Delta {
            codec: Codec::XorRuns,
            len: bytes.len() as u32,
        };
        let r = pc.decode_page(enc, Some(&twin), &bytes, &mut out);
        assert!(
            matches!(r, Err(DeltaError::Corrupt { .. })),
            "{what}: {r:?}"
        );
    }
    // The largest skip that still fits: the last byte of the page.
    let bytes = vec![0xff, 0x1f, 1, 1];
    let enc = PageEncoding::Delta {
        codec: Codec::XorRuns,
        len: 4,
    };
    pc.decode_page(enc, Some(&twin), &bytes, &mut out).unwrap();
    assert_eq!(out[PAGE_SIZE - 1], 6);
    assert!(out[..PAGE_SIZE - 1].iter().all(|&b| b == 7));
}

#[test]
fn shifted_block_xdelta3_finds_the_copy() {
    let mut rng = rng();
    let mut pc = PageCodec::new().unwrap();
    let twin = random_page(&mut rng);
    let mut page = twin.clone();
    page.copy_within(1000..2000, 1016);
    let enc = roundtrip(&mut pc, Codec::Xdelta3, Some(&twin), &page);
    assert!(
        matches!(enc, PageEncoding::Delta { len, .. } if len < 100),
        "{enc:?}"
    );
}

#[test]
fn zero_and_identical_pages() {
    let mut rng = rng();
    let mut pc = PageCodec::new().unwrap();
    let zero = vec![0u8; PAGE_SIZE];
    let page = random_page(&mut rng);
    for c in Codec::ALL {
        assert_eq!(roundtrip(&mut pc, c, None, &zero), PageEncoding::Zero);
        assert_eq!(
            roundtrip(&mut pc, c, Some(&page), &zero),
            PageEncoding::Zero
        );
        assert_eq!(
            roundtrip(&mut pc, c, Some(&zero), &zero),
            PageEncoding::Zero
        );
        assert_eq!(
            roundtrip(&mut pc, c, Some(&page), &page),
            PageEncoding::Same
        );
    }
    // A page written over a zero twin, and a nearly zero page.
    let mut sparse = zero.clone();
    sparse[4095] = 1;
    for c in [Codec::XorZstd, Codec::XorRuns, Codec::Xdelta3] {
        let enc = roundtrip(&mut pc, c, Some(&zero), &page);
        assert_eq!(enc, PageEncoding::Raw, "{c}");
        let enc = roundtrip(&mut pc, c, Some(&zero), &sparse);
        assert!(
            matches!(enc, PageEncoding::Delta { len, .. } if len < 64),
            "{c} {enc:?}"
        );
    }
    assert!(matches!(
        roundtrip(&mut pc, Codec::Zstd, None, &sparse),
        PageEncoding::Compressed { len } if len < 64
    ));
}

#[test]
fn missing_or_bad_twin_is_an_error() {
    let mut rng = rng();
    let mut pc = PageCodec::new().unwrap();
    let twin = heapish_page(&mut rng);
    let mut page = twin.clone();
    page[100] ^= 0xff;
    let mut back = [0u8; PAGE_SIZE];
    for c in [Codec::XorZstd, Codec::Xdelta3] {
        let mut out = Vec::new();
        let enc = pc.encode_page(c, Some(&twin), &page, &mut out);
        assert!(matches!(enc, PageEncoding::Delta { .. }));
        assert!(matches!(
            pc.decode_page(enc, None, &out, &mut back),
            Err(DeltaError::MissingTwin(_))
        ));
        assert!(matches!(
            pc.decode_page(enc, Some(&twin[..100]), &out, &mut back),
            Err(DeltaError::TwinLength(100))
        ));
    }
    assert!(matches!(
        pc.decode_page(PageEncoding::Same, None, &[], &mut back),
        Err(DeltaError::MissingTwin(PageEncoding::Same))
    ));
    // Not needing a twin, none is fine.
    pc.decode_page(PageEncoding::Zero, None, &[], &mut back)
        .unwrap();
    assert_eq!(back, [0; PAGE_SIZE]);
}

#[test]
fn malformed_input_is_an_error() {
    let mut rng = rng();
    let mut pc = PageCodec::new().unwrap();
    let twin = heapish_page(&mut rng);
    let mut page = twin.clone();
    for i in (0..PAGE_SIZE).step_by(97) {
        page[i] = page[i].wrapping_add(3);
    }
    let mut back = [0u8; PAGE_SIZE];
    let encoded: Vec<(PageEncoding, Vec<u8>)> = [
        (Codec::XorZstd, Some(&twin[..])),
        (Codec::Xdelta3, Some(&twin[..])),
        (Codec::Zstd, None),
    ]
    .into_iter()
    .map(|(c, t)| {
        let mut out = Vec::new();
        let enc = pc.encode_page(c, t, &page, &mut out);
        assert_ne!(enc, PageEncoding::Raw, "{c}");
        (enc, out)
    })
    .collect();
    for (enc, bytes) in &encoded {
        // Wrong length for the tag.
        assert!(matches!(
            pc.decode_page(*enc, Some(&twin), &bytes[1..], &mut back),
            Err(DeltaError::Length { .. })
        ));
        // Every truncation, with a tag that agrees with it.
        for n in 0..bytes.len() {
            let short = with_len(*enc, n);
            assert!(
                pc.decode_page(short, Some(&twin), &bytes[..n], &mut back)
                    .is_err(),
                "{enc:?} truncated to {n} decoded"
            );
        }
        // Garbage of the same length.
        for _ in 0..200 {
            let mut junk = bytes.clone();
            rng.fill(&mut junk[..]);
            if let Ok(()) = pc.decode_page(*enc, Some(&twin), &junk, &mut back) {
                panic!("{enc:?}: random bytes decoded");
            }
        }
        // Single bit flips: may decode (to a wrong page) but must never panic.
        for i in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[i / 8] ^= 1 << (i % 8);
            let _ = pc.decode_page(*enc, Some(&twin), &flipped, &mut back);
        }
        // The codec still works afterwards.
        pc.decode_page(*enc, Some(&twin), bytes, &mut back).unwrap();
        assert!(back[..] == page[..]);
    }
    // A header flip in the zstd frame is caught (frame header descriptor reserved bit).
    let (enc, bytes) = &encoded[0];
    let mut bad = bytes.clone();
    bad[0] ^= 0x08;
    assert!(pc.decode_page(*enc, Some(&twin), &bad, &mut back).is_err());
    // Codecs that are not deltas.
    for c in [Codec::Zstd, Codec::Raw] {
        assert!(matches!(
            pc.decode_page(
                PageEncoding::Delta { codec: c, len: 3 },
                Some(&twin),
                &[1, 2, 3],
                &mut back
            ),
            Err(DeltaError::NotADeltaCodec(_))
        ));
    }
    // Raw and Zero need exactly their lengths.
    assert!(
        pc.decode_page(PageEncoding::Raw, None, &page[1..], &mut back)
            .is_err()
    );
    assert!(
        pc.decode_page(PageEncoding::Zero, None, &[0], &mut back)
            .is_err()
    );
}

fn with_len(enc: PageEncoding, n: usize) -> PageEncoding {
    match enc {
        PageEncoding::Delta { codec, .. } => PageEncoding::Delta {
            codec,
            len: n as u32,
        },
        PageEncoding::Compressed { .. } => PageEncoding::Compressed { len: n as u32 },
        e => e,
    }
}

#[test]
fn levels_all_decode_with_any_codec() {
    let mut rng = rng();
    let twin = heapish_page(&mut rng);
    let mut page = twin.clone();
    page[10..30].fill(7);
    let mut dec = PageCodec::with_level(19).unwrap();
    for level in [-7, -1, 1, 3, 19] {
        let mut pc = PageCodec::with_level(level).unwrap();
        assert_eq!(pc.level(), level);
        let mut out = Vec::new();
        let enc = pc.encode_page(Codec::XorZstd, Some(&twin), &page, &mut out);
        let mut back = [0u8; PAGE_SIZE];
        dec.decode_page(enc, Some(&twin), &out, &mut back).unwrap();
        assert!(back[..] == page[..]);
    }
}

fn page_of(n: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE_SIZE];
    p[..8].copy_from_slice(&n.to_le_bytes());
    p
}

#[test]
fn twin_store_evicts_least_recently_written() {
    let mut s = TwinStore::new(3 * PAGE_SIZE + 100);
    for a in 1..=3u64 {
        s.put(a * 4096, 1, &page_of(a));
    }
    assert_eq!((s.len(), s.bytes()), (3, 3 * PAGE_SIZE));
    // Re-writing page 1 makes page 2 the least recently written.
    s.put(4096, 2, &page_of(11));
    s.put(4 * 4096, 2, &page_of(4));
    assert_eq!(s.len(), 3);
    assert!(s.bytes() <= s.budget());
    assert!(s.get(2 * 4096).is_none());
    assert_eq!(s.get(4096).unwrap(), &page_of(11)[..]);
    assert_eq!(s.epoch(4096), Some(2));
    assert_eq!(s.get(3 * 4096).unwrap(), &page_of(3)[..]);
    s.put(5 * 4096, 3, &page_of(5));
    assert!(s.get(3 * 4096).is_none());
    assert_eq!(
        s.stats(),
        TwinStats {
            hits: 2,
            misses: 2,
            evictions: 2
        }
    );
}

#[test]
fn twin_store_matches_a_model() {
    let mut rng = rng();
    let cap = 50;
    let mut s = TwinStore::new(cap * PAGE_SIZE);
    // The model: addresses, least recently written first, with their contents.
    let mut model: Vec<(u64, u64)> = Vec::new();
    let mut evictions = 0;
    for i in 0..20_000u64 {
        let addr = rng.random_range(0..120u64) * 4096;
        match rng.random_range(0..10) {
            0 => {
                let a = rng.random_range(0..120u64) * 4096;
                let b = a + rng.random_range(0..8u64) * 4096;
                let n = s.remove_range(a, b);
                let before = model.len();
                model.retain(|(x, _)| !(a..b).contains(x));
                assert_eq!(n, before - model.len());
            }
            1..=3 => {
                let got = s
                    .get(addr)
                    .map(|p| u64::from_le_bytes(p[..8].try_into().unwrap()));
                let want = model.iter().find(|(x, _)| *x == addr).map(|(_, v)| *v);
                assert_eq!(got, want);
            }
            _ => {
                s.put(addr, i, &page_of(i));
                if let Some(pos) = model.iter().position(|(x, _)| *x == addr) {
                    model.remove(pos);
                } else if model.len() == cap {
                    model.remove(0);
                    evictions += 1;
                }
                model.push((addr, i));
            }
        }
        assert_eq!(s.len(), model.len());
        assert!(s.bytes() <= cap * PAGE_SIZE);
        assert!(s.order.len() <= 2 * s.map.len() + 65);
        // Every slot is either a live twin's (one twin each) or free, never both.
        let mut slots: Vec<u32> = s.map.values().map(|t| t.slot).collect();
        slots.extend(&s.free);
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), s.map.len() + s.free.len());
        assert!(slots.iter().all(|&x| x < s.fresh) && s.fresh as usize <= cap);
    }
    assert_eq!(s.stats().evictions, evictions);
    assert!(evictions > 1000);
}

#[test]
fn twin_store_budget_zero_disables() {
    let mut s = TwinStore::new(0);
    s.put(0, 1, &page_of(1));
    assert!(s.is_empty());
    assert!(s.get(0).is_none());
    assert_eq!(s.bytes(), 0);
    let mut s = TwinStore::new(PAGE_SIZE - 1);
    s.put(0, 1, &page_of(1));
    assert!(s.is_empty());
}

#[test]
fn twin_store_remove_range() {
    let mut s = TwinStore::new(1000 * PAGE_SIZE);
    for a in 0..100u64 {
        s.put(0x10_0000 + a * 4096, 1, &page_of(a));
    }
    // Small range (per-page path), unaligned bounds: pages whose address is inside.
    assert_eq!(
        s.remove_range(0x10_0000 + 10 * 4096 - 1, 0x10_0000 + 12 * 4096 + 1),
        3
    );
    assert!(s.get(0x10_0000 + 9 * 4096).is_some());
    assert!(s.get(0x10_0000 + 10 * 4096).is_none());
    assert!(s.get(0x10_0000 + 12 * 4096).is_none());
    assert!(s.get(0x10_0000 + 13 * 4096).is_some());
    // Empty and reversed ranges.
    assert_eq!(s.remove_range(0x10_0000, 0x10_0000), 0);
    assert_eq!(s.remove_range(0x20_0000, 0x10_0000), 0);
    // Large range (scan path).
    assert_eq!(s.remove_range(0, 0x10_0000 + 50 * 4096), 47);
    assert_eq!(s.len(), 50);
    assert_eq!(s.remove_range(0, u64::MAX), 50);
    assert!(s.is_empty());
    // Evicting after removals skips the stale queue entries.
    let mut s = TwinStore::new(2 * PAGE_SIZE);
    s.put(0, 1, &page_of(0));
    s.put(4096, 1, &page_of(1));
    assert!(s.remove(0));
    s.put(8192, 2, &page_of(2));
    s.put(12288, 2, &page_of(3));
    assert_eq!(s.len(), 2);
    assert!(s.get(4096).is_none());
    assert_eq!(s.stats().evictions, 1);
}
