//! An in-memory process image that a chain of checkpoints is applied to: a full checkpoint,
//! then incremental ones in epoch order. A backup keeps one of these current; a restore turns it
//! back into a full checkpoint with [`Image::to_full`].
//!
//! Checkpoints come from a peer and are untrusted: [`Image::apply`] checks everything before it
//! changes anything, so a refused checkpoint leaves the image exactly as it was.

use crate::delta::{DeltaError, PAGE_SIZE, PageCodec, PageEncoding};
use crate::files::Tree;
use crate::image::*;
use std::collections::BTreeMap;

const PAGE: u64 = PAGE_SIZE as u64;

/// Why a checkpoint cannot be applied. The image is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("checkpoint {epoch} applies to epoch {base}, but the image is at epoch {have}")]
    OutOfOrder { epoch: u64, base: u64, have: u64 },
    #[error("a chain must start with a full checkpoint (got an incremental one for epoch {0})")]
    NotFull(u64),
    #[error("checkpoint {epoch} is inconsistent: {source}")]
    Invalid { epoch: u64, source: FormatError },
    #[error("page {addr:#x} of checkpoint {epoch} cannot be decoded: {source}")]
    Decode {
        epoch: u64,
        addr: u64,
        source: DeltaError,
    },
    #[error("creating the page decoder: {0}")]
    Codec(DeltaError),
}

/// A process image at one epoch: metadata plus the contents of every saved page.
pub struct Image {
    pub epoch: u64,
    /// The latest checkpoint's metadata, without its memory (`runs`, `pages`, `reset`, `cow`)
    /// or private files (see [`Image::tree`]). `sandbox` is the latest one a checkpoint
    /// carried: the full checkpoint's unless an incremental one brought another.
    pub meta: ProcessImage,
    pages: BTreeMap<u64, Box<[u8; PAGE_SIZE]>>,
    codec: PageCodec,
    /// The private directories' tree at this epoch (`meta.private_files` stays empty).
    tree: Tree,
    /// The shared memory objects' pages by object and offset (all-zero pages absent;
    /// `meta.shm` lists the objects, without runs).
    shm: BTreeMap<ShmId, BTreeMap<u64, Box<[u8; PAGE_SIZE]>>>,
    /// The other processes of a process tree, parents before their children: each its
    /// parent's PID and its own image (with no members and an empty private tree). The main
    /// process's `meta` keeps the tree's shared descriptions (`shared_files`); its `tree`
    /// stays empty.
    members: Vec<(i32, Image)>,
}

/// What an incremental checkpoint does to one process's image, decoded and checked, not yet
/// applied ([`Image::stage`], [`Image::commit`]).
struct Staged<'a> {
    img: &'a ProcessImage,
    /// The process's page data (a member's slice of the checkpoint's data).
    data: &'a [u8],
    /// The complete metadata after this checkpoint.
    meta: ProcessImage,
    /// The new layout, sorted: (start, end, anonymous).
    layout: Vec<(u64, u64, bool)>,
    shm_maps: Ranges,
    reset: Ranges,
    cow: Ranges,
    file_private: Ranges,
    /// The decoded pages (`None`: dropped).
    pages: BTreeMap<u64, Option<Box<[u8; PAGE_SIZE]>>>,
}

impl Staged<'_> {
    fn mapping(&self, addr: u64) -> Option<(u64, u64, bool)> {
        let i = self.layout.partition_point(|v| v.0 <= addr);
        i.checked_sub(1)
            .map(|i| self.layout[i])
            .filter(|v| addr < v.1)
    }

    /// Whether a page the image holds survives the new layout.
    fn keep(&self, a: u64) -> bool {
        self.mapping(a).is_some()
            && !self.reset.contains(a)
            && !self.shm_maps.contains(a)
            // A page of a private file mapping without its own copy shows the file.
            && (!self.file_private.contains(a) || self.cow.contains(a))
    }
}

/// The pages of each object of `objects` after `runs` of `data` are laid over `base`'s (an
/// object not in `base`, or `fresh`, starts from zeros; objects not listed are dropped).
/// All-zero pages are dropped. (Runs lie inside the data: `ProcessImage::validate` checked
/// it; one that did not would be skipped.)
fn shm_pages(
    objects: &[ShmObject],
    data: &[u8],
    mut base: BTreeMap<ShmId, BTreeMap<u64, Box<[u8; PAGE_SIZE]>>>,
) -> BTreeMap<ShmId, BTreeMap<u64, Box<[u8; PAGE_SIZE]>>> {
    let mut out = BTreeMap::new();
    for o in objects {
        let mut pages = match base.remove(&o.id) {
            Some(p) if !o.fresh => p,
            _ => BTreeMap::new(),
        };
        // An object that shrank (a POSIX object truncated, an object replaced by a smaller
        // one under the same id) keeps no page past its end: a restore could not lay it out.
        let end = o.size.div_ceil(PAGE) * PAGE;
        pages.retain(|&off, _| off < end);
        for r in &o.runs {
            for p in 0..r.len / PAGE {
                let Some(page) = usize::try_from(r.data_off + p * PAGE)
                    .ok()
                    .and_then(|off| data.get(off..)?.first_chunk::<PAGE_SIZE>())
                else {
                    continue;
                };
                if page.iter().all(|&b| b == 0) {
                    pages.remove(&(r.addr + p * PAGE));
                } else {
                    pages.insert(r.addr + p * PAGE, Box::new(*page));
                }
            }
        }
        out.insert(o.id, pages);
    }
    out
}

impl Image {
    /// The image of a full checkpoint (checked as [`Checkpoint::validate`] does, whatever its
    /// origin).
    pub fn from_full(ck: &Checkpoint) -> Result<Image, ApplyError> {
        if ck.kind != Kind::Full {
            return Err(ApplyError::NotFull(ck.epoch));
        }
        let invalid = |source| ApplyError::Invalid {
            epoch: ck.epoch,
            source,
        };
        ck.validate().map_err(invalid)?;
        // A full checkpoint names its private directories if it has entries in them.
        ck.image
            .private_files
            .validate(Some(&[]))
            .map_err(|m| invalid(FormatError::Meta(m)))?;
        let mut image = Image::of_process(ck.epoch, &ck.image, &ck.data)?;
        for m in &ck.image.tree {
            // In range: validate checked each member's slice.
            let data = member_data(&ck.data, m).map_err(invalid)?;
            let member = Image::of_process(ck.epoch, &m.image, data)?;
            image.members.push((m.ppid, member));
        }
        Ok(image)
    }

    /// The image of one process of a full checkpoint (already validated), whose runs index
    /// `data`.
    fn of_process(epoch: u64, img: &ProcessImage, data: &[u8]) -> Result<Image, ApplyError> {
        let mut pages = BTreeMap::new();
        for r in &img.runs {
            for p in 0..r.len / PAGE {
                // In range: validate checked data_off + len <= data.len().
                let page = usize::try_from(r.data_off + p * PAGE)
                    .ok()
                    .and_then(|off| data.get(off..)?.first_chunk::<PAGE_SIZE>())
                    .ok_or_else(|| ApplyError::Invalid {
                        epoch,
                        source: FormatError::Meta(format!(
                            "page run at {:#x} lies outside the page data",
                            r.addr
                        )),
                    })?;
                pages.insert(r.addr + p * PAGE, Box::new(*page));
            }
        }
        let mut tree = Tree::default();
        tree.apply(&img.private_files);
        let shm = shm_pages(&img.shm, data, BTreeMap::new());
        Ok(Image {
            tree,
            shm,
            epoch,
            meta: stored_meta(img),
            pages,
            codec: PageCodec::new().map_err(ApplyError::Codec)?,
            members: Vec::new(),
        })
    }

    /// The other processes of a process tree, parents before their children: each its
    /// parent's PID and its image (empty for a single process).
    pub fn members(&self) -> impl Iterator<Item = (i32, &Image)> {
        self.members.iter().map(|(ppid, m)| (*ppid, m))
    }

    /// Number of saved pages (of every process of a tree).
    pub fn pages(&self) -> usize {
        self.pages.len() + self.members.iter().map(|m| m.1.pages()).sum::<usize>()
    }

    /// The private directories' tree at this epoch.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The pages of shared memory object `id` that are not all zeros, by offset.
    pub fn shm_pages(&self, id: ShmId) -> Option<&BTreeMap<u64, Box<[u8; PAGE_SIZE]>>> {
        self.shm.get(&id)
    }

    pub fn page(&self, addr: u64) -> Option<&[u8; PAGE_SIZE]> {
        self.pages.get(&addr).map(|b| &**b)
    }

    /// Testing only: flips one byte of the `n`th page (in address order, modulo their number)
    /// this process image holds, as a bug or a bad memory cell would; returns that page's
    /// address (`None`: it holds no page).
    #[doc(hidden)]
    pub fn corrupt_page(&mut self, n: usize) -> Option<u64> {
        let len = self.pages.len();
        let (addr, page) = self.pages.iter_mut().nth(n.checked_rem(len)?)?;
        page[100] ^= 0x5a;
        Some(*addr)
    }

    /// Applies the next checkpoint of the chain (a full one replaces the image).
    ///
    /// All or nothing: on any error — out of order, inconsistent (anything
    /// [`Checkpoint::validate`] refuses, private files outside the image's private
    /// directories), a page that does not decode — the image is left exactly as it was: every
    /// check and every page decoding happens before the first change.
    ///
    /// Pages outside the new layout, in `reset` ranges, or of private file mappings and not in
    /// `cow` are dropped; an incremental checkpoint's pages outside the layout are ignored.
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
        let invalid = |source| ApplyError::Invalid {
            epoch: ck.epoch,
            source,
        };
        ck.validate().map_err(invalid)?;
        let img = &ck.image;
        let dirs = &img.private_files.dirs;
        if !dirs.is_empty() && !self.tree.dirs.is_empty() && *dirs != self.tree.dirs {
            return Err(invalid(FormatError::Meta(format!(
                "the private directories changed from {:?} to {dirs:?} without a full checkpoint",
                self.tree.dirs
            ))));
        }
        img.private_files
            .validate(Some(&self.tree.dirs))
            .map_err(|m| invalid(FormatError::Meta(m)))?;
        let alone = img.tree.is_empty() && self.members.is_empty();
        let root = self.stage(img, &ck.data, ck.epoch, alone, None)?;
        // A tree: each member of the checkpoint applies to the same process of the image (one
        // the checkpoint does not list is gone), or comes whole (a process that appeared, or
        // ran `execve`, since the base: "fresh"); then the resolved tree is checked whole, its
        // shared descriptions against every process's resolved descriptors.
        let mut members = Vec::with_capacity(img.tree.len());
        for m in &img.tree {
            let pid = m.image.pid;
            let data = member_data(&ck.data, m).map_err(invalid)?;
            if m.image.base_epoch.is_none() {
                // Checked by `validate` as a full process image.
                let fresh = Image::of_process(ck.epoch, &m.image, data)?;
                members.push((m.ppid, MemberChange::Fresh(Box::new(fresh))));
                continue;
            }
            let Some(i) = self.members.iter().position(|(_, b)| b.meta.pid == pid) else {
                return Err(invalid(FormatError::Meta(format!(
                    "process {pid} is not in the image: a process that appeared since the \
                     base comes whole"
                ))));
            };
            // Its mappings of shared memory name the main process's objects (listed in every
            // checkpoint of the tree).
            let staged =
                self.members[i]
                    .1
                    .stage(&m.image, data, ck.epoch, false, Some(&img.shm))?;
            members.push((m.ppid, MemberChange::Staged(i, Box::new(staged))));
        }
        if !alone {
            let mut whole = root.meta.clone();
            whole.tree = members
                .iter()
                .map(|(ppid, c)| Member {
                    ppid: *ppid,
                    data_off: 0,
                    data_len: 0,
                    image: match c {
                        MemberChange::Staged(_, st) => st.meta.clone(),
                        MemberChange::Fresh(img) => img.meta.clone(),
                    },
                })
                .collect();
            whole.validate(0).map_err(invalid)?;
        }

        // Nothing can fail from here on.
        let mut old = std::mem::take(&mut self.members);
        let mut slots: Vec<Option<Image>> = old.drain(..).map(|(_, m)| Some(m)).collect();
        for (ppid, change) in members {
            match change {
                MemberChange::Staged(i, staged) => {
                    if let Some(mut m) = slots[i].take() {
                        m.commit(*staged, ck.epoch);
                        self.members.push((ppid, m));
                    }
                }
                MemberChange::Fresh(m) => self.members.push((ppid, *m)),
            }
        }
        self.tree.apply(&img.private_files);
        self.commit(root, ck.epoch);
        Ok(())
    }

    /// Checks and decodes what the incremental checkpoint of one process (`img`, its pages in
    /// `data`) does to this image, changing nothing. `alone`: a single process (its metadata
    /// is checked whole here; a tree's is checked by the caller, once resolved). `tree_shm`: a
    /// member of a tree, whose mappings of shared memory name these (the main process's).
    fn stage<'a>(
        &mut self,
        img: &'a ProcessImage,
        data: &'a [u8],
        epoch: u64,
        alone: bool,
        tree_shm: Option<&[ShmObject]>,
    ) -> Result<Staged<'a>, ApplyError> {
        let invalid = |source| ApplyError::Invalid { epoch, source };
        let meta = resolved_meta(img, &self.meta, alone, tree_shm).map_err(invalid)?;

        // The new layout (validated: sorted here, disjoint), and whether a page survives.
        let mut layout: Vec<(u64, u64, bool)> = meta
            .vmas
            .iter()
            .map(|v| (v.start, v.end, v.backing == Backing::Anon))
            .collect();
        layout.sort_unstable();
        // Shared mappings hold no pages of their own (their object's are in `shm`).
        let shm_maps = Ranges::new(
            meta.vmas
                .iter()
                .filter(|v| matches!(v.backing, Backing::Shm { .. }))
                .map(|v| (v.start, v.end)),
        );
        let file_private = Ranges::new(
            meta.vmas
                .iter()
                .filter(|v| matches!(v.backing, Backing::File { .. }) && !v.shared)
                .map(|v| (v.start, v.end)),
        );
        let mut st = Staged {
            img,
            data,
            meta,
            layout,
            shm_maps,
            reset: Ranges::new(img.reset.iter().copied()),
            cow: Ranges::new(img.cow.iter().copied()),
            file_private,
            pages: BTreeMap::new(),
        };

        // Decode every page first, against what the image will hold for it once the layout
        // changes apply (or the page decoded just before, if listed twice). `None`: dropped.
        let zero = [0u8; PAGE_SIZE];
        for p in &img.pages {
            let Some((_, _, anon)) = st.mapping(p.addr).filter(|_| !st.shm_maps.contains(p.addr))
            else {
                continue; // outside the new layout (or shared memory's): gone
            };
            let bytes = usize::try_from(p.data_off)
                .ok()
                .and_then(|off| data.get(off..)?.get(..p.enc.encoded_len()))
                .ok_or_else(|| {
                    invalid(FormatError::Meta(format!(
                        "page at {:#x} lies outside the page data",
                        p.addr
                    )))
                })?;
            if p.enc == PageEncoding::Zero && anon {
                st.pages.insert(p.addr, None); // a fresh anonymous page reads as zero
                continue;
            }
            let twin: &[u8; PAGE_SIZE] = match st.pages.get(&p.addr) {
                Some(Some(page)) => page,
                Some(None) => &zero,
                None if st.keep(p.addr) => self.pages.get(&p.addr).map_or(&zero, |b| b),
                None => &zero,
            };
            let mut out = Box::new([0u8; PAGE_SIZE]);
            self.codec
                .decode_page(p.enc, Some(twin), bytes, &mut out)
                .map_err(|source| ApplyError::Decode {
                    epoch,
                    addr: p.addr,
                    source,
                })?;
            st.pages.insert(p.addr, Some(out));
        }
        Ok(st)
    }

    /// Applies what [`Image::stage`] prepared on this image (which it was staged against).
    fn commit(&mut self, st: Staged<'_>, epoch: u64) {
        if same_layout(&self.meta.vmas, &st.meta.vmas) {
            // Every page held already passed the last commit's `keep` (or came with the full
            // checkpoint, inside its layout): with the layout unchanged, only pages in a reset
            // range or in a private file mapping (whose `cow` list changes) can fail it now.
            // Not a walk over all pages every epoch: on a backup of Redis that walk was a
            // quarter of the apply.
            let mut gone = Vec::new();
            for &(s, e) in st.reset.0.iter().chain(&st.file_private.0) {
                gone.extend(
                    self.pages
                        .range(s..e)
                        .map(|(&a, _)| a)
                        .filter(|&a| !st.keep(a)),
                );
            }
            for a in gone {
                self.pages.remove(&a);
            }
            debug_assert!(self.pages.keys().all(|&a| st.keep(a)));
        } else {
            self.pages.retain(|&a, _| st.keep(a));
        }
        let Staged {
            img,
            data,
            mut meta,
            file_private,
            cow,
            pages,
            ..
        } = st;
        for (addr, page) in pages {
            match page {
                // A page of a private file mapping with no copy of its own (not in `cow`) shows
                // the file, whatever the checkpoint carried for it: a page a failed pause took
                // as written, and zapped since, comes with the file's contents of that moment,
                // which a later write to the file would make stale.
                Some(_) if file_private.contains(addr) && !cow.contains(addr) => {
                    self.pages.remove(&addr)
                }
                Some(page) => self.pages.insert(addr, page),
                None => self.pages.remove(&addr),
            };
        }
        // The epoch loop records the group and session in full checkpoints only: keep the
        // full checkpoint's.
        if meta.pgid == 0 && meta.sid == 0 {
            (meta.pgid, meta.sid) = (self.meta.pgid, self.meta.sid);
        }
        if meta.sandbox.is_empty() {
            meta.sandbox = std::mem::take(&mut self.meta.sandbox);
        }
        self.shm = shm_pages(&img.shm, data, std::mem::take(&mut self.shm));
        self.meta = meta;
        self.epoch = epoch;
    }

    /// The image as a full checkpoint without its page data: the runs' `data_off` count in the
    /// order [`Image::write_pages`] writes the pages. A restore lays itself out from this and
    /// has the pages written straight into the restorer's memfd (for a 100 MiB service, the
    /// contiguous copy [`Image::to_full`] makes, faulting in its buffer included, was ~40 ms of
    /// every takeover).
    pub fn full_meta(&self) -> Checkpoint {
        let (mut ck, mut written) = self.process_full_meta();
        // A tree: each member's pages follow, in its own slice (as `write_pages` writes them).
        for (ppid, m) in &self.members {
            let (member, len) = m.process_full_meta();
            ck.image.tree.push(Member {
                ppid: *ppid,
                data_off: written,
                data_len: len,
                image: member.image,
            });
            written += len;
        }
        ck
    }

    /// [`Image::full_meta`] of this process alone, and the length of its page data.
    fn process_full_meta(&self) -> (Checkpoint, u64) {
        let mut runs: Vec<PageRun> = Vec::new();
        let mut starts: Vec<u64> = self.meta.vmas.iter().map(|v| v.start).collect();
        starts.sort_unstable();
        let mut written = 0u64;
        for &addr in self.pages.keys() {
            let boundary = starts.binary_search(&addr).is_ok();
            match runs.last_mut() {
                Some(r) if r.addr.checked_add(r.len) == Some(addr) && !boundary => r.len += PAGE,
                _ => runs.push(PageRun {
                    addr,
                    len: PAGE,
                    data_off: written,
                }),
            }
            written += PAGE;
        }
        let mut image = self.meta.clone();
        image.runs = runs;
        image.private_files = self.tree.to_changes();
        // The objects' pages follow the process's, object by object in id order (as
        // `write_pages` writes them).
        for o in &mut image.shm {
            o.runs.clear();
            for &off in self.shm.get(&o.id).into_iter().flat_map(|p| p.keys()) {
                match o.runs.last_mut() {
                    Some(r) if r.addr + r.len == off => r.len += PAGE,
                    _ => o.runs.push(PageRun {
                        addr: off,
                        len: PAGE,
                        data_off: written,
                    }),
                }
                written += PAGE;
            }
        }
        (Checkpoint::full(self.epoch, image, Vec::new()), written)
    }

    /// Every page, in address order, to `out` (the data of [`Image::full_meta`]'s runs).
    pub fn write_pages(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        // Pages are boxed one by one: hand them to the kernel in batches, no staging copy.
        let mut batch: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(BATCH);
        let shm = self
            .meta
            .shm
            .iter()
            .flat_map(|o| self.shm.get(&o.id).into_iter().flat_map(|p| p.values()));
        for page in self.pages.values().chain(shm) {
            batch.push(std::io::IoSlice::new(&page[..]));
            if batch.len() == BATCH {
                write_all_vectored(out, &mut batch)?;
            }
        }
        write_all_vectored(out, &mut batch)?;
        for (_, m) in &self.members {
            m.write_pages(out)?;
        }
        Ok(())
    }

    /// The image as a full checkpoint (contiguous pages of one mapping coalesced into runs),
    /// with the sandbox description the chain carried and the private directories' tree.
    pub fn to_full(&self) -> Checkpoint {
        let mut ck = self.full_meta();
        let shm: usize = self.shm.values().map(|p| p.len()).sum();
        let mut data = Vec::with_capacity((self.pages() + shm) * PAGE_SIZE);
        self.write_pages(&mut data)
            .expect("writing to a Vec cannot fail");
        ck.data = data;
        ck
    }
}

/// Pages per vectored write (the kernel's IOV_MAX).
const BATCH: usize = 1024;

/// Writes every slice of `batch` whole and empties it.
fn write_all_vectored(
    out: &mut impl std::io::Write,
    batch: &mut Vec<std::io::IoSlice<'_>>,
) -> std::io::Result<()> {
    let mut slices = &mut batch[..];
    while !slices.is_empty() {
        let n = out.write_vectored(slices)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut slices, n);
    }
    batch.clear();
    Ok(())
}

/// A checkpoint's metadata as the image keeps it: without memory contents, incremental-only
/// fields or private files (copied field by field: the page lists can be long).
fn stored_meta(img: &ProcessImage) -> ProcessImage {
    ProcessImage {
        pid: img.pid,
        comm: img.comm.clone(),
        exe: img.exe.clone(),
        cwd: img.cwd.clone(),
        umask: img.umask,
        rlimits: img.rlimits.clone(),
        mm: img.mm.clone(),
        auxv: img.auxv.clone(),
        vmas: img.vmas.clone(),
        runs: Vec::new(),
        files: img.files.clone(),
        threads: img.threads.clone(),
        sigactions: img.sigactions.clone(),
        fds: img.fds.clone(),
        max_tid: img.max_tid,
        sandbox: img.sandbox.clone(),
        base_epoch: None,
        reset: Vec::new(),
        pages: Vec::new(),
        cow: Vec::new(),
        private_files: Default::default(),
        creds: img.creds.clone(),
        carried: Default::default(),
        timers: img.timers.clone(),
        seccomp: img.seccomp.clone(),
        shm: img
            .shm
            .iter()
            .map(|o| ShmObject {
                runs: Vec::new(),
                fresh: false,
                ..o.clone()
            })
            .collect(),
        pgid: img.pgid,
        sid: img.sid,
        // The members are images of their own (`Image::members`).
        tree: Vec::new(),
        shared_files: img.shared_files.clone(),
        // Every checkpoint lists the zombies of its epoch (the main image's).
        zombies: img.zombies.clone(),
        // Listed whole in every checkpoint.
        pending: img.pending.clone(),
        // What the image is checked against once, not part of it.
        scrub: None,
    }
}

/// What an incremental checkpoint does to one process of a tree's image.
enum MemberChange<'a> {
    /// Applied to the image's member `.0`.
    Staged(usize, Box<Staged<'a>>),
    /// A process the checkpoint holds whole: it replaces any image of that PID.
    Fresh(Box<Image>),
}

/// A member's slice of a checkpoint's page data.
fn member_data<'a>(data: &'a [u8], m: &Member) -> Result<&'a [u8], FormatError> {
    usize::try_from(m.data_off)
        .ok()
        .zip(usize::try_from(m.data_len).ok())
        .and_then(|(off, len)| data.get(off..)?.get(..len))
        .ok_or_else(|| {
            FormatError::Meta(format!(
                "the page data of process {} lies outside the data",
                m.image.pid
            ))
        })
}

/// The full metadata of incremental checkpoint `img` applied to an image whose metadata is
/// `base`: [`stored_meta`] with what `img` carried over ([`Carried`]) taken from `base`.
/// Checked as a full checkpoint's metadata would be: whole for a process `alone`, as one
/// process for a process of a tree (whose shared descriptions are checked with the tree; a
/// member's mappings of shared memory against `tree_shm`, the main process's objects).
fn resolved_meta(
    img: &ProcessImage,
    base: &ProcessImage,
    alone: bool,
    tree_shm: Option<&[ShmObject]>,
) -> Result<ProcessImage, FormatError> {
    let mut meta = stored_meta(img);
    let c = &img.carried;
    if c.layout {
        meta.vmas = base.vmas.clone();
        meta.files = base.files.clone();
    }
    if c.fds {
        meta.fds = base.fds.clone();
    }
    if c.sigactions {
        meta.sigactions = base.sigactions.clone();
    }
    for t in meta
        .threads
        .iter_mut()
        .filter(|t| c.threads.contains(&t.tid))
    {
        *t = base
            .threads
            .iter()
            .find(|b| b.tid == t.tid)
            .cloned()
            .ok_or_else(|| {
                FormatError::Meta(format!(
                    "thread {} is carried over from a base that has no such thread",
                    t.tid
                ))
            })?;
    }
    // What came from the base was checked when the base was applied; checked again together,
    // as a full checkpoint's metadata would be.
    if alone {
        meta.validate(0)?;
    } else {
        meta.validate_one(0, tree_shm)?;
    }
    Ok(meta)
}

/// The sender's side of [`Carried`]: remembers the metadata of the last checkpoint produced and
/// leaves out of the next incremental one what did not change since.
#[derive(Debug, Default)]
pub struct MetaCarry {
    last: Option<ProcessImage>,
}

impl MetaCarry {
    /// A carry whose last checkpoint had metadata `img` (a chain's full checkpoint).
    pub fn after(img: &ProcessImage) -> MetaCarry {
        MetaCarry {
            last: Some(stored_meta(img)),
        }
    }

    /// Leaves out of `img` (the complete metadata of the incremental checkpoint that follows
    /// the last one given here) what equals the last one's, and remembers `img`'s values.
    /// Call it only for a checkpoint that is produced: the next one is applied on top of it.
    pub fn leave_out(&mut self, img: &mut ProcessImage) {
        let Some(last) = self.last.as_mut() else {
            self.last = Some(stored_meta(img));
            return;
        };
        let mut c = Carried::default();
        if img.vmas == last.vmas && img.files == last.files {
            c.layout = true;
            img.vmas.clear();
            img.files.clear();
        } else {
            last.vmas.clone_from(&img.vmas);
            last.files.clone_from(&img.files);
        }
        if img.fds == last.fds {
            c.fds = true;
            img.fds.clear();
        } else {
            last.fds.clone_from(&img.fds);
        }
        if img.sigactions == last.sigactions {
            c.sigactions = true;
            img.sigactions.clear();
        } else {
            last.sigactions.clone_from(&img.sigactions);
        }
        let mut threads = Vec::with_capacity(img.threads.len());
        for t in &mut img.threads {
            match last.threads.iter().position(|l| l.tid == t.tid) {
                Some(i) if last.threads[i] == *t => {
                    c.threads.push(t.tid);
                    threads.push(last.threads.swap_remove(i));
                    t.regs = Vec::new();
                    t.xstate = Vec::new();
                    t.comm = String::new();
                    t.pending = Vec::new();
                }
                _ => threads.push(t.clone()),
            }
        }
        last.threads = threads;
        img.carried = c;
    }

    /// Forgets the last metadata: the next checkpoint leaves nothing out.
    pub fn reset(&mut self) {
        self.last = None;
    }
}

/// Half-open address ranges, sorted and merged, for lookups in O(log n).
struct Ranges(Vec<(u64, u64)>);

/// Whether two layouts hold the same mappings as far as [`Staged::keep`] can tell them apart:
/// the same ranges, each as much shared memory's, as much a private file mapping.
fn same_layout(a: &[Vma], b: &[Vma]) -> bool {
    let key = |v: &Vma| {
        (
            v.start,
            v.end,
            matches!(v.backing, Backing::Shm { .. }),
            matches!(v.backing, Backing::File { .. }) && !v.shared,
        )
    };
    let (mut a, mut b): (Vec<_>, Vec<_>) =
        (a.iter().map(key).collect(), b.iter().map(key).collect());
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

impl Ranges {
    fn new(ranges: impl Iterator<Item = (u64, u64)>) -> Ranges {
        let mut v: Vec<(u64, u64)> = ranges.filter(|(s, e)| s < e).collect();
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        Ranges(out)
    }

    fn contains(&self, a: u64) -> bool {
        let i = self.0.partition_point(|r| r.0 <= a);
        i > 0 && a < self.0[i - 1].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::PageEncoding;
    use crate::image::tests::{meta, thread};

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

    #[test]
    fn a_private_file_page_without_its_own_copy_is_never_kept() {
        let file = |start, end| Vma {
            start,
            end,
            prot: 3,
            shared: false,
            flags: 0,
            backing: Backing::File {
                index: 0,
                offset: 0,
            },
            name: "/mnt/data".into(),
        };
        let with_file = |mut m: ProcessImage| {
            m.files = vec![FileRef {
                path: "/mnt/data".into(),
                size: 0x3000,
                hash: [0; 32],
            }];
            m
        };
        // Epoch 0: both pages of the file mapping have their own copy (written).
        let mut m = with_file(meta(vec![file(0x1000, 0x3000)]));
        m.runs = vec![PageRun {
            addr: 0x1000,
            len: 0x2000,
            data_off: 0,
        }];
        m.cow = vec![(0x1000, 0x3000)];
        let mut img = Image::from_full(&full(m, vec![5u8; 0x2000])).unwrap();
        assert_eq!(img.pages(), 2);
        // Epoch 1 sends both pages again (as a failed pause's carry would), but 0x2000 was
        // zapped meanwhile: it is not in `cow`, so it shows the file and is not kept.
        let mut m = with_file(meta(vec![file(0x1000, 0x3000)]));
        m.base_epoch = Some(0);
        m.cow = vec![(0x1000, 0x2000)];
        m.pages = [0x1000u64, 0x2000]
            .iter()
            .enumerate()
            .map(|(i, &addr)| EncodedPage {
                addr,
                enc: PageEncoding::Raw,
                data_off: (i * PAGE_SIZE) as u64,
            })
            .collect();
        let inc = Checkpoint {
            epoch: 1,
            kind: Kind::Incremental { base: 0 },
            image: m,
            data: vec![6u8; 2 * PAGE_SIZE],
        };
        img.apply(&inc).unwrap();
        assert_eq!(img.page(0x1000).unwrap()[0], 6);
        assert!(
            img.page(0x2000).is_none(),
            "a page that shows the file was kept"
        );
    }

    #[test]
    fn full_meta_and_write_pages_make_what_to_full_holds() {
        // Two mappings, contiguous addresses (runs must still split), distinct page contents.
        let mut m = meta(vec![anon(0x1000, 0x3000), anon(0x3000, 0x5000)]);
        m.runs = vec![
            PageRun {
                addr: 0x1000,
                len: 0x2000,
                data_off: 0,
            },
            PageRun {
                addr: 0x3000,
                len: 0x2000,
                data_off: 0x2000,
            },
        ];
        let data: Vec<u8> = (0..0x4000u32)
            .map(|i| (i / 4096 * 31 + i % 7) as u8)
            .collect();
        let img = Image::from_full(&full(m, data)).unwrap();
        let whole = img.to_full();
        // A writer that takes a few bytes at a time: partial vectored writes are resumed.
        struct Dribble(Vec<u8>);
        impl std::io::Write for Dribble {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let n = b.len().min(1000);
                self.0.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut out = Dribble(Vec::new());
        let meta = img.full_meta();
        img.write_pages(&mut out).unwrap();
        assert!(meta.data.is_empty());
        assert_eq!(out.0, whole.data);
        assert_eq!(meta.image.runs, whole.image.runs);
        assert_eq!(meta.image.runs.len(), 2);
        assert_eq!(meta.epoch, whole.epoch);
    }

    /// A full checkpoint at epoch 0.
    fn full(image: ProcessImage, data: Vec<u8>) -> Checkpoint {
        Checkpoint::full(0, image, data)
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

    /// An incremental checkpoint of epoch `epoch` on `base` with metadata `m` and no pages.
    fn incremental(mut m: ProcessImage, epoch: u64) -> Checkpoint {
        m.base_epoch = Some(epoch - 1);
        Checkpoint {
            epoch,
            kind: Kind::Incremental { base: epoch - 1 },
            image: m,
            data: vec![],
        }
    }

    /// What a sender leaves out, a receiver puts back: the image's metadata after each
    /// checkpoint is the complete one the sender had, whichever parts changed.
    #[test]
    fn metadata_left_out_is_taken_from_the_base() {
        let complete = |rip2: u64, vmas: Vec<Vma>, fds: usize| {
            let mut m = meta(vmas);
            m.threads = vec![thread(1, 0x10), thread(2, rip2), thread(3, 0x30)];
            m.max_tid = 3;
            m.sigactions = vec![SigAction {
                signo: 10,
                handler: 0x1234,
                flags: 0,
                restorer: 0,
                mask: 0,
            }];
            m.fds = (0..fds as i32)
                .map(|fd| FdImage {
                    fd,
                    cloexec: false,
                    flags: 0,
                    kind: FdKind::Path {
                        path: "/dev/null".into(),
                        pos: 0,
                        is_dir: false,
                    },
                })
                .collect();
            m
        };
        let first = complete(0x20, vec![anon(0x1000, 0x2000)], 2);
        let mut img = Image::from_full(&full(first.clone(), vec![])).unwrap();
        let mut carry = MetaCarry::after(&first);
        // Epoch 1: only thread 2 ran. Epoch 2: a mapping and a descriptor more, thread 2 ran
        // again. Epoch 3: thread 3 exited, nothing else changed.
        let mut third = complete(0x22, vec![anon(0x1000, 0x2000), anon(0x4000, 0x5000)], 3);
        third.threads.pop();
        let steps = [
            complete(0x21, vec![anon(0x1000, 0x2000)], 2),
            complete(0x22, vec![anon(0x1000, 0x2000), anon(0x4000, 0x5000)], 3),
            third,
        ];
        let mut sizes = Vec::new();
        for (i, want) in steps.into_iter().enumerate() {
            let epoch = i as u64 + 1;
            let mut sent = want.clone();
            carry.leave_out(&mut sent);
            sizes.push(postcard::to_stdvec(&sent).unwrap().len());
            let ck = incremental(sent, epoch);
            // As a peer would send it.
            let ck = Checkpoint::from_bytes(ck.to_bytes()).unwrap();
            match epoch {
                1 => {
                    let c = &ck.image.carried;
                    assert!(c.layout && c.fds && c.sigactions, "epoch 1: {c:?}");
                    assert_eq!(c.threads, vec![1, 3]);
                }
                2 => {
                    let c = &ck.image.carried;
                    assert!(!c.layout && !c.fds && c.sigactions, "epoch 2: {c:?}");
                    assert_eq!(c.threads, vec![1, 3]);
                }
                _ => assert_eq!(ck.image.carried.threads, vec![1, 2]),
            }
            img.apply(&ck).unwrap();
            assert_eq!(
                format!("{:?}", img.meta),
                format!("{:?}", stored_meta(&want)),
                "epoch {epoch}: the image's metadata"
            );
        }
        let whole = postcard::to_stdvec(&first).unwrap().len();
        assert!(sizes[0] < whole * 2 / 3, "{sizes:?} against {whole}");
    }

    /// A checkpoint that carries over what its base does not have is refused and changes
    /// nothing; so is one that both carries and lists a part, and a full one that carries.
    #[test]
    fn carried_metadata_that_does_not_hold_is_refused() {
        let mut first = meta(vec![anon(0x1000, 0x2000)]);
        first.threads = vec![thread(1, 0x10)];
        let mut img = Image::from_full(&full(first.clone(), vec![])).unwrap();
        let before = format!("{:?}", img.meta);
        // Thread 2 is carried over, but the base has no thread 2.
        let mut m = first.clone();
        m.threads.push(ThreadImage {
            regs: vec![],
            xstate: vec![],
            ..thread(2, 0)
        });
        m.max_tid = 2;
        m.carried.threads = vec![2];
        let e = img.apply(&incremental(m, 1)).unwrap_err();
        assert!(e.to_string().contains("no such thread"), "{e}");
        assert_eq!(format!("{:?}", img.meta), before);
        // Carried and listed at once.
        let mut m = first.clone();
        m.carried.layout = true;
        let e = Checkpoint::from_bytes(incremental(m, 1).to_bytes()).unwrap_err();
        assert!(
            e.to_string().contains("both carried over and listed"),
            "{e}"
        );
        // A carried-over thread with registers of its own.
        let mut m = first.clone();
        m.carried.threads = vec![1];
        let e = Checkpoint::from_bytes(incremental(m, 1).to_bytes()).unwrap_err();
        assert!(e.to_string().contains("registers of its own"), "{e}");
        // A full checkpoint carries nothing.
        let mut m = first.clone();
        m.carried.sigactions = true;
        let e = Checkpoint::from_bytes(full(m, vec![]).to_bytes()).unwrap_err();
        assert!(e.to_string().contains("full checkpoint leaves out"), "{e}");
        assert_eq!(img.epoch, 0);
    }

    /// Process `pid` (one thread) with one anonymous mapping at 0x1000-0x3000.
    fn process(pid: i32) -> ProcessImage {
        let mut m = meta(vec![anon(0x1000, 0x3000)]);
        m.pid = pid;
        m.threads[0].tid = pid;
        m.max_tid = pid;
        m
    }

    /// A descriptor of the shared description #0.
    fn shared_fd(fd: i32) -> FdImage {
        FdImage {
            fd,
            cloexec: false,
            flags: 2,
            kind: FdKind::Shared(0),
        }
    }

    /// A full checkpoint of a tree: process 1 (pages 0x1000 = 1, 0x2000 = 2), its children 2
    /// and 3 (page 0x1000 = 20 + PID); all three hold one shared description at descriptor 3.
    fn full_tree() -> Checkpoint {
        let mut root = process(1);
        root.runs = vec![PageRun {
            addr: 0x1000,
            len: 0x2000,
            data_off: 0,
        }];
        root.fds = vec![shared_fd(3)];
        root.pgid = 1;
        root.sid = 1;
        root.shared_files = vec![SharedFile {
            file: FdImage {
                fd: 3,
                cloexec: false,
                flags: 2,
                kind: FdKind::Path {
                    path: "/log".into(),
                    pos: 0,
                    is_dir: false,
                },
            },
            holders: vec![(1, 3), (2, 3), (3, 3)],
        }];
        let mut data = [vec![1u8; 4096], vec![2u8; 4096]].concat();
        for pid in [2, 3] {
            let mut m = process(pid);
            m.runs = vec![PageRun {
                addr: 0x1000,
                len: 0x1000,
                data_off: 0,
            }];
            m.fds = vec![shared_fd(3)];
            (m.pgid, m.sid) = (pid, 1);
            root.tree.push(Member {
                ppid: 1,
                data_off: data.len() as u64,
                data_len: 4096,
                image: m,
            });
            data.extend(vec![20 + pid as u8; 4096]);
        }
        Checkpoint::full(0, root, data)
    }

    /// An incremental checkpoint of [`full_tree`]'s processes `pids` (the main one and these
    /// members), each with its page 0x2000 written raw as `10 × PID` and its descriptors
    /// carried over.
    fn incremental_tree(epoch: u64, pids: &[i32]) -> Checkpoint {
        let page = EncodedPage {
            addr: 0x2000,
            enc: PageEncoding::Raw,
            data_off: 0,
        };
        let inc = |pid: i32| {
            let mut m = process(pid);
            m.base_epoch = Some(epoch - 1);
            m.pages = vec![page];
            m.carried.fds = true;
            m
        };
        let mut root = inc(1);
        root.shared_files = full_tree().image.shared_files;
        let mut data = vec![10u8; 4096];
        for &pid in pids {
            root.tree.push(Member {
                ppid: 1,
                data_off: data.len() as u64,
                data_len: 4096,
                image: inc(pid),
            });
            data.extend(vec![10 * pid as u8; 4096]);
        }
        Checkpoint {
            epoch,
            kind: Kind::Incremental { base: epoch - 1 },
            image: root,
            data,
        }
    }

    fn member(img: &Image, pid: i32) -> &Image {
        img.members()
            .find(|m| m.1.meta.pid == pid)
            .map(|m| m.1)
            .unwrap_or_else(|| panic!("no member {pid}"))
    }

    /// A tree's image: each process's pages from its own slice, incremental checkpoints
    /// applied per process (descriptors carried over resolved from each one's base, groups
    /// and sessions kept from the full), a member the checkpoint no longer lists dropped; the
    /// image's full checkpoint is a valid tree with the same pages.
    #[test]
    fn a_tree_is_applied_process_by_process() {
        let mut img = Image::from_full(&full_tree()).unwrap();
        assert_eq!(img.pages(), 4);
        assert_eq!(member(&img, 3).page(0x1000).unwrap()[0], 23);
        img.apply(&roundtrip(incremental_tree(1, &[2, 3]))).unwrap();
        assert_eq!(img.page(0x1000).unwrap()[0], 1);
        assert_eq!(img.page(0x2000).unwrap()[0], 10);
        for pid in [2, 3] {
            let m = member(&img, pid);
            assert_eq!(m.page(0x1000).unwrap()[0], 20 + pid as u8, "process {pid}");
            assert_eq!(m.page(0x2000).unwrap()[0], 10 * pid as u8, "process {pid}");
            assert_eq!(
                m.meta.fds,
                vec![shared_fd(3)],
                "process {pid}'s descriptors"
            );
            assert_eq!((m.meta.pgid, m.meta.sid), (pid, 1));
        }
        let full = Checkpoint::from_bytes(img.to_full().to_bytes()).expect("a valid tree");
        assert_eq!(full.image.tree.len(), 2);
        assert_eq!(full.image.shared_files.len(), 1);
        let again = Image::from_full(&full).unwrap();
        assert_eq!(
            member(&again, 3).page(0x2000).unwrap()[0],
            30,
            "a member's pages in its slice"
        );
        // Process 3 is gone: the next checkpoint does not list it (nor holds its descriptor).
        let mut ck = incremental_tree(2, &[2]);
        ck.image.shared_files[0].holders.pop();
        img.apply(&roundtrip(ck)).unwrap();
        assert_eq!(img.members().count(), 1);
        assert_eq!(img.pages(), 4);
    }

    /// The tree changing between epochs (the epoch loop's step 2): a process that appeared
    /// comes whole in an incremental checkpoint (a fresh member: base epoch none) and joins the
    /// image; one that ran `execve` comes whole under its PID and replaces its image; one that
    /// exited is no longer listed and is dropped, its zombie listed by the main image until it
    /// is reaped. The image's full checkpoint is the tree of the last epoch.
    #[test]
    fn processes_that_appear_exec_and_exit_between_epochs() {
        let mut img = Image::from_full(&full_tree()).unwrap();
        // Process 4 (a child of 2) appears, whole, with its page 0x3000 = 44.
        let fresh = |pid: i32, fill: u8, ck: &mut Checkpoint| {
            let mut m = process(pid);
            m.vmas = meta(vec![anon(0x1000, 0x6000)]).vmas;
            m.runs = vec![PageRun {
                addr: 0x3000,
                len: 0x1000,
                data_off: 0,
            }];
            (m.pgid, m.sid) = (2, 1);
            ck.image.tree.push(Member {
                ppid: 2,
                data_off: ck.data.len() as u64,
                data_len: 4096,
                image: m,
            });
            ck.data.extend(vec![fill; 4096]);
        };
        let mut ck = incremental_tree(1, &[2, 3]);
        fresh(4, 44, &mut ck);
        img.apply(&roundtrip(ck)).unwrap();
        assert_eq!(img.members().count(), 3);
        assert_eq!(member(&img, 4).page(0x3000).unwrap()[0], 44);
        assert_eq!(member(&img, 4).page(0x1000), None, "only what it came with");
        // Process 4 runs `execve`: whole again, nothing of its old image kept; process 3 exits
        // and stays a zombie of process 1 (exit status 3).
        let mut ck = incremental_tree(2, &[2]);
        ck.image.shared_files[0].holders.pop();
        fresh(4, 45, &mut ck);
        ck.image.tree[1].image.runs[0].addr = 0x5000;
        ck.image.zombies = vec![Zombie {
            pid: 3,
            ppid: 1,
            pgid: 3,
            sid: 1,
            uid: 0,
            status: 3 << 8,
        }];
        img.apply(&roundtrip(ck)).unwrap();
        let pids: Vec<i32> = img.members().map(|m| m.1.meta.pid).collect();
        assert_eq!(pids, [2, 4]);
        assert_eq!(member(&img, 4).page(0x3000), None, "the old image is gone");
        assert_eq!(member(&img, 4).page(0x5000).unwrap()[0], 45);
        assert_eq!(img.meta.zombies.len(), 1);
        let full = Checkpoint::from_bytes(img.to_full().to_bytes()).expect("a valid tree");
        assert_eq!(
            full.image.zombies, img.meta.zombies,
            "the zombie is restored"
        );
        assert_eq!(full.image.tree.len(), 2);
        // Reaped: the next checkpoint lists no zombie; then the process 4 exits too.
        let mut ck = incremental_tree(3, &[2]);
        ck.image.shared_files[0].holders.pop();
        img.apply(&roundtrip(ck)).unwrap();
        assert!(img.meta.zombies.is_empty());
        let pids: Vec<i32> = img.members().map(|m| m.1.meta.pid).collect();
        assert_eq!(pids, [2]);
        // A fresh member that does not hold together is refused, the image unchanged.
        let before = img.to_full().to_bytes();
        let mut ck = incremental_tree(4, &[2]);
        ck.image.shared_files[0].holders.pop();
        fresh(6, 46, &mut ck);
        ck.image.tree[1].ppid = 9;
        assert!(img.apply(&ck).is_err(), "a parent not in the tree");
        assert_eq!(img.to_full().to_bytes(), before);
    }

    /// What cannot apply to a tree's image is refused, the image unchanged: a member that is
    /// not in it, a shared description whose holder's descriptors (carried over) do not name
    /// it, a member's page that does not decode.
    #[test]
    fn a_tree_checkpoint_that_does_not_apply_is_refused_whole() {
        let mut img = Image::from_full(&full_tree()).unwrap();
        let pages = |img: &Image| {
            let ck = img.to_full();
            (ck.data, format!("{:?}", ck.image))
        };
        let before = pages(&img);
        let e = img.apply(&incremental_tree(1, &[2, 3, 4])).unwrap_err();
        assert!(
            e.to_string().contains("process 4 is not in the image"),
            "{e}"
        );
        let mut ck = incremental_tree(1, &[2, 3]);
        ck.image.shared_files[0].holders.push((3, 4));
        let e = img.apply(&ck).unwrap_err();
        assert!(
            e.to_string().contains("which has no such descriptor"),
            "{e}"
        );
        let mut ck = incremental_tree(1, &[2, 3]);
        ck.image.tree[1].image.pages[0].enc = PageEncoding::Compressed { len: 100 };
        let e = img.apply(&ck).unwrap_err();
        assert!(matches!(e, ApplyError::Decode { addr: 0x2000, .. }), "{e}");
        assert_eq!(
            pages(&img),
            before,
            "a refused checkpoint changed the image"
        );
        assert_eq!(img.epoch, 0);
    }

    fn roundtrip(ck: Checkpoint) -> Checkpoint {
        Checkpoint::from_bytes(ck.to_bytes()).unwrap()
    }

    /// Process `pid` of `ck` (a [`full_tree`] or an [`incremental_tree`]) mapping anonymous
    /// shared memory object 9 (one page) at 0x10000, which the main process lists with page 0
    /// holding `fill` (in the main process's part of the checkpoint's data).
    fn tree_shm(ck: &mut Checkpoint, pid: i32, fill: u8) {
        let member = &mut ck
            .image
            .tree
            .iter_mut()
            .find(|m| m.image.pid == pid)
            .unwrap()
            .image;
        member.vmas.push(Vma {
            start: 0x10000,
            end: 0x11000,
            prot: 3,
            shared: true,
            flags: 0,
            backing: Backing::Shm {
                id: ShmId::Anon(9),
                offset: 0,
            },
            name: "/dev/zero (deleted)".into(),
        });
        // The main process's data comes first: the page goes before the members' slices.
        let at = ck.image.tree.iter().map(|m| m.data_off).min().unwrap();
        for m in &mut ck.image.tree {
            m.data_off += 0x1000;
        }
        ck.image.shm = vec![ShmObject {
            id: ShmId::Anon(9),
            size: 0x1000,
            sysv: None,
            runs: vec![PageRun {
                addr: 0,
                len: 0x1000,
                data_off: at,
            }],
            fresh: false,
        }];
        let at = at as usize;
        ck.data.splice(at..at, vec![fill; 0x1000]);
    }

    /// A tree's shared memory through a chain: a member's mappings name the objects the main
    /// process lists in every checkpoint (its pages in the main process's data), full or
    /// incremental; the image's full checkpoint lays them out again. A member whose mapping
    /// names an object the main process does not list is refused, the image unchanged.
    #[test]
    fn a_members_shared_memory_is_the_main_processs() {
        let mut full = full_tree();
        tree_shm(&mut full, 2, 7);
        let mut img = Image::from_full(&roundtrip(full)).unwrap();
        let page = |img: &Image| img.shm_pages(ShmId::Anon(9)).unwrap()[&0][0];
        assert_eq!(page(&img), 7);
        let mut ck = incremental_tree(1, &[2, 3]);
        tree_shm(&mut ck, 2, 8);
        img.apply(&roundtrip(ck)).unwrap();
        assert_eq!(
            page(&img),
            8,
            "the object's page, from the main process's data"
        );
        assert_eq!(member(&img, 2).page(0x2000).unwrap()[0], 20);
        let back = Checkpoint::from_bytes(img.to_full().to_bytes()).expect("a valid tree");
        assert_eq!(page(&Image::from_full(&back).unwrap()), 8);
        // The main process no longer lists it.
        let mut ck = incremental_tree(2, &[2, 3]);
        tree_shm(&mut ck, 2, 9);
        ck.image.shm.clear();
        let e = img.apply(&ck).unwrap_err();
        assert!(e.to_string().contains("which is not in the image"), "{e}");
        assert_eq!((img.epoch, page(&img)), (1, 8));
    }

    /// An object that shrank between two checkpoints keeps no page past its new end (found by
    /// the fuzzer: the image then made a full checkpoint that did not validate).
    #[test]
    fn a_shared_memory_object_that_shrank_keeps_no_page_past_its_end() {
        let object = |size: u64, runs: Vec<PageRun>| ShmObject {
            id: ShmId::Anon(7),
            size,
            sysv: None,
            runs,
            fresh: false,
        };
        let mut m = meta(vec![anon(0x1000, 0x2000)]);
        m.shm = vec![object(
            0x2000,
            vec![PageRun {
                addr: 0,
                len: 0x2000,
                data_off: 0,
            }],
        )];
        let mut img = Image::from_full(&full(m, vec![5u8; 0x2000])).unwrap();
        assert_eq!(img.shm_pages(ShmId::Anon(7)).unwrap().len(), 2);
        let mut m = meta(vec![anon(0x1000, 0x2000)]);
        m.base_epoch = Some(0);
        m.shm = vec![object(0x1000, vec![])];
        img.apply(&Checkpoint {
            epoch: 1,
            kind: Kind::Incremental { base: 0 },
            image: m,
            data: vec![],
        })
        .unwrap();
        let pages = img.shm_pages(ShmId::Anon(7)).unwrap();
        assert_eq!(pages.keys().copied().collect::<Vec<_>>(), vec![0]);
        let back = img.to_full();
        Checkpoint::from_bytes(back.to_bytes()).expect("the image's full checkpoint is valid");
    }
}
