//! An in-memory process image that a chain of checkpoints is applied to: a full checkpoint,
//! then incremental ones in epoch order. A backup keeps one of these current; a restore turns it
//! back into a full checkpoint with [`Image::to_full`].

use crate::delta::{PageCodec, PageEncoding};
use crate::files::Tree;
use crate::image::*;
use std::collections::BTreeMap;

const PAGE: u64 = 4096;

/// Why a checkpoint cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("checkpoint {epoch} applies to epoch {base}, but the image is at epoch {have}")]
    OutOfOrder { epoch: u64, base: u64, have: u64 },
    #[error("a chain must start with a full checkpoint (got an incremental one for epoch {0})")]
    NotFull(u64),
    #[error("page {addr:#x} of checkpoint {epoch} cannot be decoded: {source}")]
    Decode {
        epoch: u64,
        addr: u64,
        source: crate::delta::DeltaError,
    },
    #[error("page data of checkpoint {0} is malformed")]
    Malformed(u64),
}

/// A process image at one epoch: metadata plus the contents of every saved page.
pub struct Image {
    pub epoch: u64,
    pub meta: ProcessImage,
    pages: BTreeMap<u64, Box<[u8; 4096]>>,
    codec: PageCodec,
    /// The private directories' tree at this epoch (`meta.private_files` stays empty).
    tree: Tree,
}

impl Image {
    pub fn from_full(ck: &Checkpoint) -> Result<Image, ApplyError> {
        if ck.kind != Kind::Full {
            return Err(ApplyError::NotFull(ck.epoch));
        }
        let mut pages = BTreeMap::new();
        for r in &ck.image.runs {
            for p in 0..r.len / PAGE {
                let off = (r.data_off + p * PAGE) as usize;
                let src = ck
                    .data
                    .get(off..off + PAGE as usize)
                    .ok_or(ApplyError::Malformed(ck.epoch))?;
                pages.insert(
                    r.addr + p * PAGE,
                    Box::new(<[u8; 4096]>::try_from(src).unwrap()),
                );
            }
        }
        let mut meta = ck.image.clone();
        meta.runs.clear();
        let mut tree = Tree::default();
        tree.apply(&std::mem::take(&mut meta.private_files));
        Ok(Image {
            tree,
            epoch: ck.epoch,
            meta,
            pages,
            codec: PageCodec::new().map_err(|e| ApplyError::Decode {
                epoch: ck.epoch,
                addr: 0,
                source: e,
            })?,
        })
    }

    /// Number of saved pages.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// The private directories' tree at this epoch.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    pub fn page(&self, addr: u64) -> Option<&[u8; 4096]> {
        self.pages.get(&addr).map(|b| &**b)
    }

    /// Applies the next checkpoint of the chain (a full one replaces the image).
    pub fn apply(&mut self, ck: &Checkpoint) -> Result<(), ApplyError> {
        let base = match ck.kind {
            Kind::Full => {
                *self = Image::from_full(ck)?;
                return Ok(());
            }
            Kind::Incremental { base } => base,
        };
        if base != self.epoch {
            return Err(ApplyError::OutOfOrder {
                epoch: ck.epoch,
                base,
                have: self.epoch,
            });
        }
        let img = &ck.image;
        // Pages outside the new layout, or in ranges whose contents are void, are gone.
        let mut vmas: Vec<(u64, u64, bool)> = img
            .vmas
            .iter()
            .map(|v| (v.start, v.end, v.backing == Backing::Anon))
            .collect();
        let file_private: Vec<(u64, u64)> = img
            .vmas
            .iter()
            .filter(|v| matches!(v.backing, Backing::File { .. }) && !v.shared)
            .map(|v| (v.start, v.end))
            .collect();
        vmas.sort_unstable();
        let find = |addr: u64| -> Option<(u64, u64, bool)> {
            let i = vmas.partition_point(|v| v.0 <= addr);
            (i > 0 && addr < vmas[i - 1].1).then(|| vmas[i - 1])
        };
        let inside = |set: &[(u64, u64)], a: u64| set.iter().any(|&(s, e)| s <= a && a < e);
        self.pages.retain(|&a, _| {
            find(a).is_some()
                && !inside(&img.reset, a)
                // A page of a private file mapping without its own copy shows the file.
                && (!inside(&file_private, a) || inside(&img.cow, a))
        });
        let zero = [0u8; 4096];
        let mut out = [0u8; 4096];
        for p in &img.pages {
            let bytes = ck
                .data
                .get(p.data_off as usize..p.data_off as usize + p.enc.encoded_len())
                .ok_or(ApplyError::Malformed(ck.epoch))?;
            let anon = find(p.addr).is_some_and(|v| v.2);
            if p.enc == PageEncoding::Zero && anon {
                self.pages.remove(&p.addr); // a fresh anonymous page reads as zero
                continue;
            }
            let twin: &[u8] = self.pages.get(&p.addr).map_or(&zero[..], |b| &b[..]);
            self.codec
                .decode_page(p.enc, Some(twin), bytes, &mut out)
                .map_err(|source| ApplyError::Decode {
                    epoch: ck.epoch,
                    addr: p.addr,
                    source,
                })?;
            self.pages.insert(p.addr, Box::new(out));
        }
        let mut meta = img.clone();
        meta.pages.clear();
        meta.reset.clear();
        meta.runs.clear();
        meta.base_epoch = None;
        self.tree.apply(&std::mem::take(&mut meta.private_files));
        self.meta = meta;
        self.epoch = ck.epoch;
        Ok(())
    }

    /// The image as a full checkpoint (contiguous pages of one mapping coalesced into runs).
    pub fn to_full(&self) -> Checkpoint {
        let mut data = Vec::with_capacity(self.pages.len() * PAGE as usize);
        let mut runs: Vec<PageRun> = Vec::new();
        let mut starts: Vec<u64> = self.meta.vmas.iter().map(|v| v.start).collect();
        starts.sort_unstable();
        for (&addr, page) in &self.pages {
            let boundary = starts.binary_search(&addr).is_ok();
            match runs.last_mut() {
                Some(r) if r.addr + r.len == addr && !boundary => r.len += PAGE,
                _ => runs.push(PageRun {
                    addr,
                    len: PAGE,
                    data_off: data.len() as u64,
                }),
            }
            data.extend_from_slice(&page[..]);
        }
        let mut image = self.meta.clone();
        image.runs = runs;
        image.private_files = self.tree.to_changes();
        Checkpoint {
            epoch: self.epoch,
            kind: Kind::Full,
            image,
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::PageEncoding;

    fn meta(vmas: Vec<Vma>) -> ProcessImage {
        ProcessImage {
            pid: 1,
            comm: String::new(),
            exe: FileRef {
                path: String::new(),
                size: 0,
                hash: [0; 32],
            },
            cwd: "/".into(),
            umask: 0,
            rlimits: vec![],
            mm: MmInfo::default(),
            auxv: vec![],
            vmas,
            runs: vec![],
            files: vec![],
            threads: vec![],
            sigactions: vec![],
            fds: vec![],
            max_tid: 1,
            sandbox: vec![],
            base_epoch: None,
            reset: vec![],
            pages: vec![],
            cow: vec![],
            private_files: Default::default(),
        }
    }

    fn anon(start: u64, end: u64) -> Vma {
        Vma {
            start,
            end,
            prot: 3,
            shared: false,
            flags: 0,
            backing: Backing::Anon,
            name: String::new(),
        }
    }

    /// A full checkpoint at epoch 0.
    fn full(image: ProcessImage, data: Vec<u8>) -> Checkpoint {
        Checkpoint {
            epoch: 0,
            kind: Kind::Full,
            image,
            data,
        }
    }

    #[test]
    fn applies_pages_drops_unmapped_and_reset() {
        let mut m = meta(vec![anon(0x1000, 0x5000), anon(0x10000, 0x12000)]);
        m.runs = vec![
            PageRun {
                addr: 0x1000,
                len: 0x3000,
                data_off: 0,
            },
            PageRun {
                addr: 0x10000,
                len: 0x1000,
                data_off: 0x3000,
            },
        ];
        let mut img = Image::from_full(&full(m, vec![7u8; 0x4000])).unwrap();
        assert_eq!(img.pages(), 4);
        // Epoch 1: the second mapping is gone, 0x2000 is reset, 0x3000 rewritten raw.
        let mut m = meta(vec![anon(0x1000, 0x5000)]);
        m.base_epoch = Some(0);
        m.reset = vec![(0x2000, 0x3000)];
        m.pages = vec![EncodedPage {
            addr: 0x3000,
            enc: PageEncoding::Raw,
            data_off: 0,
        }];
        let inc = Checkpoint {
            epoch: 1,
            kind: Kind::Incremental { base: 0 },
            image: m,
            data: vec![9u8; 4096],
        };
        img.apply(&inc).unwrap();
        assert_eq!(img.pages(), 2, "0x1000 kept, 0x3000 rewritten");
        assert_eq!(img.page(0x1000).unwrap()[0], 7);
        assert_eq!(img.page(0x3000).unwrap()[0], 9);
        assert!(img.page(0x2000).is_none() && img.page(0x10000).is_none());
        // Out of order is refused.
        assert!(img.apply(&inc).is_err());
        // Runs never straddle mappings, even when pages are contiguous.
        let mut m = meta(vec![anon(0x1000, 0x2000), anon(0x2000, 0x3000)]);
        m.runs = vec![
            PageRun {
                addr: 0x1000,
                len: 0x1000,
                data_off: 0,
            },
            PageRun {
                addr: 0x2000,
                len: 0x1000,
                data_off: 0x1000,
            },
        ];
        let back = Image::from_full(&full(m, vec![1u8; 0x2000]))
            .unwrap()
            .to_full();
        assert_eq!(back.image.runs.len(), 2);
    }
}
