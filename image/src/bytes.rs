//! Serde for the format's byte strings (`Vec<u8>` fields: file contents, XSAVE areas, queued
//! bytes) as one byte string rather than a sequence of `u8`s. Postcard writes both the same
//! way (the length as a varint, then the bytes), so images are unchanged; but a sequence is
//! written and read one element at a time through serde's visitor, which made a PostgreSQL
//! restore spend ~20% of its CPU on the 40 MB of its data directory, and every epoch's
//! serialising pay per byte of each running thread's 11 KB XSAVE area.
//!
//! Use as `#[serde(with = "crate::bytes")]`.

use serde::de::{SeqAccess, Visitor};
use serde::{Deserializer, Serializer};
use std::fmt;

pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(v)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    d.deserialize_byte_buf(BytesVisitor)
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    /// A format that gives bytes as a sequence (JSON's array of numbers). The capacity is not
    /// taken from the input's claim, which a crafted input could inflate.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut out = Vec::new();
        while let Some(b) = seq.next_element()? {
            out.push(b);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct AsBytes(#[serde(with = "crate::bytes")] Vec<u8>);

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct AsSeq(Vec<u8>);

    /// The same bytes on the wire as a plain `Vec<u8>` (images written before are read back
    /// unchanged), both ways, and through JSON too.
    #[test]
    fn byte_strings_encode_as_a_vec_of_u8_does() {
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let v: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let a = postcard::to_stdvec(&AsBytes(v.clone())).unwrap();
            let s = postcard::to_stdvec(&AsSeq(v.clone())).unwrap();
            assert_eq!(a, s, "len {len}");
            assert_eq!(postcard::from_bytes::<AsBytes>(&s).unwrap().0, v);
            assert_eq!(postcard::from_bytes::<AsSeq>(&a).unwrap().0, v);
            let j = serde_json::to_string(&AsBytes(v.clone())).unwrap();
            assert_eq!(serde_json::from_str::<AsBytes>(&j).unwrap().0, v);
        }
        // Truncated: an error, not a panic.
        let a = postcard::to_stdvec(&AsBytes(vec![1; 300])).unwrap();
        assert!(postcard::from_bytes::<AsBytes>(&a[..100]).is_err());
    }
}
