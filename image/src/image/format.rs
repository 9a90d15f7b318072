//! Reading and writing the wire layout: header, metadata, page data, CRC32 trailer
//! ([`Checkpoint::to_bytes`], [`Checkpoint::from_bytes`], [`CheckpointFile`] for a file read in
//! place).

#[allow(unused_imports)]
use super::*;
use std::io::{self, Write};

/// A checkpoint file opened for restore: header and metadata parsed, the whole file's length
/// and checksum verified by streaming it, the page data left where it is (a restore reads it
/// from the file directly).
pub struct CheckpointFile {
    pub epoch: u64,
    pub kind: Kind,
    pub image: ProcessImage,
    pub file: std::fs::File,
    /// Where the page data starts in the file; `PageRun::data_off` is relative to it.
    pub data_offset: u64,
}

impl CheckpointFile {
    pub fn open(path: &std::path::Path) -> Result<CheckpointFile, FormatError> {
        use std::io::Read;
        use std::os::unix::fs::FileExt;
        let io_err = |e: io::Error| FormatError::Io(e.to_string());
        let mut file = std::fs::File::open(path).map_err(io_err)?;
        let found = file.metadata().map_err(io_err)?.len();
        let mut head = vec![0u8; HEADER_LEN.min(found as usize)];
        file.read_exact_at(&mut head, 0).map_err(io_err)?;
        let h = Header::parse(&head, found)?;
        // Stream the file once for the checksum, keeping only the metadata.
        let (body, meta_start, meta_end) =
            (found - 4, HEADER_LEN as u64, HEADER_LEN as u64 + h.meta_len);
        let mut crc = crc32fast::Hasher::new();
        // The header's length matched the file's, but a sparse file can claim anything: let
        // the buffer grow with what is actually read.
        let mut meta = Vec::with_capacity(h.meta_len.min(1 << 26) as usize);
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < body {
            let want = ((body - at) as usize).min(buf.len());
            file.read_exact(&mut buf[..want]).map_err(io_err)?;
            crc.update(&buf[..want]);
            let (cs, ce) = (at.max(meta_start), (at + want as u64).min(meta_end));
            if cs < ce {
                meta.extend_from_slice(&buf[(cs - at) as usize..(ce - at) as usize]);
            }
            at += want as u64;
        }
        let mut trailer = [0u8; 4];
        file.read_exact(&mut trailer).map_err(io_err)?;
        check_crc(u32::from_le_bytes(trailer), crc.finalize())?;
        let (kind, image) = h.decode(&meta)?;
        Ok(CheckpointFile {
            epoch: h.epoch,
            kind,
            image,
            file,
            data_offset: meta_end,
        })
    }
}

/// The fixed-size header, checked against the total length.
struct Header {
    kind: u32,
    epoch: u64,
    meta_len: u64,
    data_len: u64,
}

impl Header {
    /// Parses the header from the first bytes (up to [`HEADER_LEN`]) of a checkpoint of `found`
    /// bytes in all.
    fn parse(head: &[u8], found: u64) -> Result<Header, FormatError> {
        if found == 0 {
            return Err(FormatError::Empty);
        }
        if head.len() < 8 || &head[..8] != MAGIC {
            return Err(FormatError::BadMagic);
        }
        if head.len() < HEADER_LEN || found < HEADER_LEN as u64 + 4 {
            return Err(FormatError::Truncated {
                expected: HEADER_LEN as u64 + 4,
                found,
            });
        }
        let field = |o: usize, n: usize| -> [u8; 8] {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&head[o..o + n]);
            b
        };
        let u32_at = |o: usize| u64::from_le_bytes(field(o, 4)) as u32;
        let u64_at = |o: usize| u64::from_le_bytes(field(o, 8));
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(FormatError::Version { found: version });
        }
        let h = Header {
            kind: u32_at(12),
            epoch: u64_at(16),
            meta_len: u64_at(24),
            data_len: u64_at(32),
        };
        let expected = (HEADER_LEN as u64)
            .checked_add(h.meta_len)
            .and_then(|x| x.checked_add(h.data_len))
            .and_then(|x| x.checked_add(4))
            .ok_or(FormatError::Truncated {
                expected: u64::MAX,
                found,
            })?;
        if found != expected {
            return Err(FormatError::Truncated { expected, found });
        }
        Ok(h)
    }

    /// Decodes and checks the metadata once the checksum matched.
    fn decode(&self, meta: &[u8]) -> Result<(Kind, ProcessImage), FormatError> {
        if self.kind > 1 {
            return Err(FormatError::Meta(format!(
                "unknown checkpoint kind {}",
                self.kind
            )));
        }
        // postcard bounds every length by the bytes left (a vector's preallocation is capped
        // by serde), so an absurd length prefix is an error, not an allocation.
        let (image, rest): (ProcessImage, _) =
            postcard::take_from_bytes(meta).map_err(|e| FormatError::Meta(e.to_string()))?;
        if !rest.is_empty() {
            return Err(FormatError::Meta(format!(
                "{} bytes after the encoded metadata",
                rest.len()
            )));
        }
        image.validate(self.data_len)?;
        let kind = match (self.kind, image.base_epoch) {
            (0, None) => Kind::Full,
            (0, Some(base)) => {
                return Err(FormatError::Meta(format!(
                    "full checkpoint with a base epoch ({base})"
                )));
            }
            (_, Some(base)) => Kind::Incremental { base },
            (_, None) => {
                return Err(FormatError::Meta(
                    "incremental checkpoint without a base epoch".into(),
                ));
            }
        };
        Ok((kind, image))
    }
}

pub(super) fn check_crc(stored: u32, computed: u32) -> Result<(), FormatError> {
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    Ok(())
}

impl Checkpoint {
    /// A full checkpoint of state `epoch`: `image` with its pages' contents in `data`.
    pub fn full(epoch: u64, image: ProcessImage, data: Vec<u8>) -> Checkpoint {
        Checkpoint {
            epoch,
            kind: Kind::Full,
            image,
            data,
        }
    }

    /// Serializes the checkpoint into `w`.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<u64> {
        let meta = postcard::to_stdvec(&self.image).map_err(io::Error::other)?;
        let mut h = crc32fast::Hasher::new();
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        header.extend_from_slice(&self.kind.code().to_le_bytes());
        header.extend_from_slice(&self.epoch.to_le_bytes());
        header.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.data.len() as u64).to_le_bytes());
        for part in [&header[..], &meta[..], &self.data[..]] {
            h.update(part);
            w.write_all(part)?;
        }
        w.write_all(&h.finalize().to_le_bytes())?;
        Ok((header.len() + meta.len() + self.data.len() + 4) as u64)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.data.len() + 4096);
        self.write_to(&mut v).expect("writing to a Vec cannot fail");
        v
    }

    /// Parses and verifies a checkpoint: magic, version, lengths, checksum, then everything
    /// [`Checkpoint::validate`] checks. Takes ownership so the page data is not copied. Any
    /// bytes are safe to pass: whatever does not hold is an error, never a panic, and nothing
    /// is allocated beyond what `bytes` itself holds.
    pub fn from_bytes(mut bytes: Vec<u8>) -> Result<Checkpoint, FormatError> {
        let h = Header::parse(&bytes[..HEADER_LEN.min(bytes.len())], bytes.len() as u64)?;
        // `parse` checked: HEADER_LEN + meta_len + data_len + 4 == bytes.len().
        let body = bytes.len() - 4;
        let mut stored = [0u8; 4];
        stored.copy_from_slice(&bytes[body..]);
        check_crc(u32::from_le_bytes(stored), crc32fast::hash(&bytes[..body]))?;
        let meta_end = HEADER_LEN + h.meta_len as usize;
        let (kind, image) = h.decode(&bytes[HEADER_LEN..meta_end])?;
        // Move the page data to the front of the buffer instead of copying it into a new one
        // (no fresh allocation to fault in).
        bytes.truncate(body);
        bytes.copy_within(meta_end.., 0);
        bytes.truncate(body - meta_end);
        Ok(Checkpoint {
            epoch: h.epoch,
            kind,
            image,
            data: bytes,
        })
    }

    /// Internal consistency, as [`Checkpoint::from_bytes`] checks it after decoding: the kind
    /// agrees with the base epoch, and [`ProcessImage::validate`] against [`Checkpoint::data`].
    /// For a checkpoint built in memory rather than read.
    pub fn validate(&self) -> Result<(), FormatError> {
        match (self.kind, self.image.base_epoch) {
            (Kind::Full, None) => {}
            (Kind::Incremental { base }, Some(b)) if b == base => {}
            (kind, base) => {
                return Err(FormatError::Meta(format!(
                    "a checkpoint of kind {kind:?} has base epoch {base:?}"
                )));
            }
        }
        self.image.validate(self.data.len() as u64)
    }
}
