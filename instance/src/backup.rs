//! The backup role: receive a primary's checkpoints, check them, queue them, acknowledge, and
//! apply them to an in-memory image in the background.
//!
//! A checkpoint is acknowledged as soon as it is *applicable* and queued (Tardigrade §3.2): its
//! bytes passed the format's checks (magic, version, length, CRC32, internal consistency) and it
//! continues the chain this backup holds (a full checkpoint always does; an incremental one must
//! be of the same primary run and have `base` = the last queued epoch).
//! The queue is bounded (`queue_len`): a full queue makes the stream wait, which holds the
//! primary's output — back-pressure instead of unbounded memory. A checkpoint of a view older
//! than the one this backup is in is refused: a deposed primary can never have an epoch decided
//! by this backup again.
//!
//! The divergence check: a checkpoint may carry the primary's digests of its process at that
//! pause (`ProcessImage::scrub`, see `tardi_image::scrub`). Once it is applied, the image is
//! compared with them; an image that differs is dropped (restoring it would restore a
//! different service than the one clients saw) and the chain marked broken, so the next
//! incremental checkpoint is refused and the primary sends a full one (its stream restarts).
//! Until that full checkpoint is applied this backup holds no image and is no candidate for a
//! takeover: with other backups the service stays protected by them, with none it is
//! unavailable rather than wrong if its primary fails in that window.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;
use tardi_checkpointer::image::{Checkpoint, Kind};
use tardi_checkpointer::store::Image;

/// Why a checkpoint was refused (sent back to the primary in the Ack).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Refusal {
    #[error("view {got} is older than this backup's view {have}: refused")]
    OldView { got: u64, have: u64 },
    #[error(
        "checkpoint {epoch} does not continue the chain (it applies to {base:?}; this backup holds epoch {have:?} of run {run:?})"
    )]
    NotApplicable {
        epoch: u64,
        base: Option<u64>,
        have: Option<u64>,
        run: Option<u64>,
    },
    #[error("corrupt checkpoint: {0}")]
    Corrupt(String),
    #[error("the image is broken ({0}); a full checkpoint is needed")]
    Broken(String),
    #[error("this machine is no longer a backup of {0:?}")]
    NotBackup(String),
    #[error("header says epoch {header}, message says {msg}")]
    EpochMismatch { header: u64, msg: u64 },
}

/// What a backup holds of one service.
pub struct Backup {
    pub service: String,
    st: Mutex<State>,
    cv: Condvar,
    queue_len: usize,
}

struct State {
    /// The newest view this machine knows of for this service (assignments or streams).
    view: u64,
    /// The last queued checkpoint: (primary run, epoch).
    queued: Option<(u64, u64)>,
    queue: VecDeque<(u64, Checkpoint)>,
    /// Applied so far: the primary run it came from, and the image.
    image: Option<(u64, Image)>,
    broken: Option<String>,
    /// Applying is under way for an item taken off the queue.
    applying: bool,
    /// ... and that item is a full checkpoint (building a whole new image takes long).
    applying_full: bool,
    stopped: bool,
    // Figures for reports.
    applied: u64,
    /// Divergence checks made, images found diverged, and the last difference found.
    scrub_checks: u64,
    scrub_mismatches: u64,
    last_mismatch: Option<String>,
    /// Testing only: corrupt the image once this file can be removed (see
    /// [`Backup::corrupt_when_removed`]).
    fault_corrupt: Option<PathBuf>,
    last_bytes: VecDeque<u64>,
    recent: VecDeque<Instant>,
}

impl Backup {
    /// A backup for `service` in `view`, with its applier thread.
    pub fn new(service: &str, view: u64, queue_len: usize) -> Arc<Backup> {
        let b = Arc::new(Backup {
            service: service.to_string(),
            st: Mutex::new(State {
                view,
                queued: None,
                queue: VecDeque::new(),
                image: None,
                broken: None,
                applying: false,
                applying_full: false,
                stopped: false,
                applied: 0,
                scrub_checks: 0,
                scrub_mismatches: 0,
                last_mismatch: None,
                fault_corrupt: None,
                last_bytes: VecDeque::new(),
                recent: VecDeque::new(),
            }),
            cv: Condvar::new(),
            queue_len: queue_len.max(1),
        });
        let me = b.clone();
        std::thread::Builder::new()
            .name(format!("apply-{service}"))
            .spawn(move || me.applier())
            .expect("spawning the applier thread");
        b
    }

    /// A backup for `service` in `view` that already holds `image`, of primary run `run`: the
    /// one a failed takeover on this machine restored from and kept (a restore only reads it).
    /// It holds every checkpoint it had acknowledged, so it may take over again; a new primary
    /// starts a new run and sends it a full checkpoint all the same.
    pub fn with_image(
        service: &str,
        view: u64,
        queue_len: usize,
        run: u64,
        image: Image,
    ) -> Arc<Backup> {
        let b = Backup::new(service, view, queue_len);
        {
            let mut st = b.lock();
            st.queued = Some((run, image.epoch));
            st.image = Some((run, image));
        }
        b
    }

    /// Testing only (`tardi instance --fault-corrupt-image FILE`): once, after applying a
    /// checkpoint, if this backup removes `file`, flip a byte of a page of its image (the one
    /// at the lowest address it holds), as a bug in the apply path or a bad memory cell would.
    pub fn corrupt_when_removed(&self, file: PathBuf) {
        self.lock().fault_corrupt = Some(file);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is updated in single assignments after each check: a panic elsewhere while
        // holding the lock cannot leave it half-changed.
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The orchestrator says this machine is in `view` (never lowers it).
    pub fn enter_view(&self, view: u64) {
        let mut st = self.lock();
        st.view = st.view.max(view);
    }

    /// Checks one received checkpoint of primary run `run`, sent in `view`, and queues it
    /// (blocking while the queue is full). `Ok` means it may be acknowledged.
    pub fn receive(&self, view: u64, run: u64, epoch: u64, bytes: Vec<u8>) -> Result<(), Refusal> {
        {
            let st = self.lock();
            if view < st.view {
                return Err(Refusal::OldView {
                    got: view,
                    have: st.view,
                });
            }
        }
        let len = bytes.len() as u64;
        let ck = Checkpoint::from_bytes(bytes).map_err(|e| Refusal::Corrupt(e.to_string()))?;
        if ck.epoch != epoch {
            return Err(Refusal::EpochMismatch {
                header: ck.epoch,
                msg: epoch,
            });
        }
        let mut st = self.lock();
        loop {
            if st.stopped {
                return Err(Refusal::NotBackup(self.service.clone()));
            }
            // Checked again after every wait: the view may have moved on meanwhile.
            if view < st.view {
                return Err(Refusal::OldView {
                    got: view,
                    have: st.view,
                });
            }
            if let Kind::Incremental { base } = ck.kind {
                if let Some(b) = &st.broken {
                    return Err(Refusal::Broken(b.clone()));
                }
                if st.queued != Some((run, base)) {
                    return Err(Refusal::NotApplicable {
                        epoch,
                        base: Some(base),
                        have: st.queued.map(|q| q.1),
                        run: st.queued.map(|q| q.0),
                    });
                }
            }
            // While a full checkpoint is being applied (for a 100 MiB service, longer than a
            // dozen epochs), the queue's bound does not stop acknowledgements: what queues
            // behind it is applied right after it whatever the bound, and a joiner that stops
            // acknowledging holds every reply of the service (measured: 250-370 ms client
            // gaps when a spare joined). A takeover waits for the full one either way.
            if st.queue.len() < self.queue_len || st.applying_full {
                break;
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.view = view;
        st.queued = Some((run, epoch));
        if ck.kind == Kind::Full {
            // A full checkpoint starts a new chain: what is queued of the old one is moot.
            st.queue.clear();
            st.broken = None;
        }
        st.queue.push_back((run, ck));
        st.last_bytes.push_back(len);
        if st.last_bytes.len() > 64 {
            st.last_bytes.pop_front();
        }
        self.cv.notify_all();
        Ok(())
    }

    fn applier(&self) {
        loop {
            let (run, ck) = {
                let mut st = self.lock();
                loop {
                    if st.stopped {
                        return;
                    }
                    if let Some(item) = st.queue.pop_front() {
                        st.applying = true;
                        st.applying_full = item.1.kind == Kind::Full;
                        break item;
                    }
                    st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            // The image is taken out while applying (a full checkpoint builds a new one).
            let prev = self.lock().image.take();
            let result = match (ck.kind, prev) {
                (Kind::Full, _) => Image::from_full(&ck).map(|i| (run, i)),
                (Kind::Incremental { .. }, Some((r, mut img))) if r == run => {
                    img.apply(&ck).map(|()| (run, img))
                }
                (Kind::Incremental { .. }, prev) => {
                    let mut st = self.lock();
                    st.image = prev;
                    st.broken = Some(format!(
                        "incremental checkpoint {} of run {run} has no image to apply to",
                        ck.epoch
                    ));
                    st.applying = false;
                    st.applying_full = false;
                    self.cv.notify_all();
                    continue;
                }
            };
            let mut result = result;
            // Testing only (see `corrupt_when_removed`).
            let fault = self.lock().fault_corrupt.clone();
            if let (Some(f), Ok((_, img))) = (fault, result.as_mut())
                && std::fs::remove_file(&f).is_ok()
            {
                let at = img.corrupt_page(0);
                tracing::warn!(service = %self.service, epoch = ck.epoch, page = ?at, "fault injected: the image was corrupted on purpose");
                self.lock().fault_corrupt = None;
            }
            // The divergence check, outside the lock: receiving goes on meanwhile.
            let diffs = match (&result, &ck.image.scrub) {
                (Ok((_, img)), Some(s)) => Some(tardi_checkpointer::scrub::check(img, s)),
                _ => None,
            };
            let mut st = self.lock();
            // A diverged image goes the way of one that failed to apply: dropped, the chain
            // broken until a full checkpoint.
            let result = match (result, diffs) {
                (Ok(img), Some(diffs)) => {
                    st.scrub_checks += 1;
                    match diffs.first() {
                        None => Ok(img),
                        Some(first) => {
                            st.scrub_mismatches += 1;
                            let what = format!(
                                "epoch {}: {first}{}",
                                ck.epoch,
                                match diffs.len() {
                                    1 => String::new(),
                                    n => format!(" (and {} more)", n - 1),
                                }
                            );
                            tracing::error!(service = %self.service, epoch = ck.epoch, differences = diffs.len(), first = %first, "the image diverged from the primary's process: dropped; a full checkpoint is needed");
                            st.last_mismatch = Some(what.clone());
                            Err(format!("the image diverged from the primary's process at {what}"))
                        }
                    }
                }
                (result, _) => result.map_err(|e| {
                    tracing::error!(service = %self.service, epoch = ck.epoch, %e, "applying a checkpoint failed; the image needs a full checkpoint");
                    e.to_string()
                }),
            };
            match result {
                Ok(img) => {
                    st.image = Some(img);
                    st.applied += 1;
                    st.recent.push_back(Instant::now());
                    while st.recent.len() > 200 {
                        st.recent.pop_front();
                    }
                }
                Err(why) => {
                    // `apply` changes nothing when it fails, but the image was taken out: no
                    // image of this run is left to continue.
                    st.broken = Some(why);
                    // What was queued after it cannot apply either.
                    st.queue.clear();
                    st.queued = None;
                }
            }
            st.applying = false;
            st.applying_full = false;
            self.cv.notify_all();
        }
    }

    /// Stops accepting checkpoints (the machine becomes primary of `view`), waits until every
    /// acknowledged checkpoint is applied, and hands over the image: (its primary run, image).
    /// An error if this backup holds no image.
    pub fn finish(&self, view: u64) -> Result<(u64, Image), String> {
        let mut st = self.lock();
        st.view = st.view.max(view);
        while !st.queue.is_empty() || st.applying {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.stopped = true;
        self.cv.notify_all();
        if let Some(b) = &st.broken {
            // Checkpoints acknowledged after the one that failed to apply are not in the image
            // (failing to decode a checkpoint that passed every check on receipt is a bug).
            tracing::error!(service = %self.service, broken = %b, "taking over from an image whose chain broke");
        }
        st.image
            .take()
            .ok_or_else(|| "this backup holds no image of the service".to_string())
    }

    /// Stops the applier; the image is dropped.
    pub fn stop(&self) {
        let mut st = self.lock();
        st.stopped = true;
        st.queue.clear();
        self.cv.notify_all();
    }

    pub fn report(&self) -> BackupReport {
        let st = self.lock();
        let rate = match (st.recent.front(), st.recent.back()) {
            (Some(a), Some(b)) if st.recent.len() > 1 => {
                let d = b.duration_since(*a).as_secs_f64();
                if d > 0.0 {
                    (st.recent.len() - 1) as f64 / d
                } else {
                    0.0
                }
            }
            _ => 0.0,
        };
        BackupReport {
            view: st.view,
            image_view: st.image.as_ref().map_or(0, |i| i.0),
            queued_epoch: st.queued.map_or(0, |q| q.1),
            applied_epoch: st.image.as_ref().map_or(0, |i| i.1.epoch),
            lag: st.queue.len() as u64 + st.applying as u64,
            epochs_per_sec: rate,
            mean_bytes: if st.last_bytes.is_empty() {
                0
            } else {
                st.last_bytes.iter().sum::<u64>() / st.last_bytes.len() as u64
            },
            broken: st.broken.clone(),
            has_image: st.image.is_some(),
            scrub_checks: st.scrub_checks,
            scrub_mismatches: st.scrub_mismatches,
            last_mismatch: st.last_mismatch.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BackupReport {
    pub view: u64,
    pub image_view: u64,
    pub queued_epoch: u64,
    pub applied_epoch: u64,
    pub lag: u64,
    pub epochs_per_sec: f64,
    pub mean_bytes: u64,
    pub broken: Option<String>,
    pub has_image: bool,
    /// Divergence checks made, how many found the image diverged, and the last difference.
    pub scrub_checks: u64,
    pub scrub_mismatches: u64,
    pub last_mismatch: Option<String>,
}
