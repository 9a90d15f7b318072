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

use crate::delta::PAGE;

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
        tcp: img.tcp.clone(),
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

/// [`resolved_meta`] of a lone process, for the format's tests.
#[cfg(test)]
pub(crate) fn resolve_for_tests(
    img: &ProcessImage,
    base: &ProcessImage,
) -> Result<ProcessImage, FormatError> {
    resolved_meta(img, base, true, None)
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
    for &fd in &c.tcp {
        let conn = base.tcp.iter().find(|b| b.fd == fd).ok_or_else(|| {
            FormatError::Meta(format!(
                "the connection of descriptor {fd} is carried over from a base that has none"
            ))
        })?;
        meta.tcp.push(conn.clone());
    }
    meta.tcp.sort_by_key(|t| t.fd);
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
        // Connections: each left out when it equals the last one's of the same descriptor.
        let tcp = std::mem::take(&mut img.tcp);
        for t in &tcp {
            if last.tcp.iter().any(|l| l == t) {
                c.tcp.push(t.fd);
            } else {
                img.tcp.push(t.clone());
            }
        }
        last.tcp = tcp;
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
mod tests;
