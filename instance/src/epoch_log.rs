//! `--epoch-log FILE`: one JSON line per epoch of every primary on this machine, for
//! benchmarks (the epoch-interval distribution behind client latency, checkpoint sizes).
//!
//! The primary's epoch thread writes each line into a [`BufWriter`] and flushes it at most every
//! [`FLUSH_EVERY`] (and when the primary stops), so logging costs a formatted line per epoch
//! and a `write(2)` per ~100 ms, never a disk wait per epoch. The file is opened in append mode:
//! several instances (and successive primaries of a service) may share one file; each flush
//! appends whole lines. A line:
//!
//! ```json
//! {"service":"dirtier","machine":"m1","run":1,"epoch":42,"unix_us":1767000000000000,
//!  "interval_us":10012,"pause_us":180,"encoded_bytes":5120,"raw_bytes":614400,
//!  "dirty_pages":150,"ended_by":"Interval", ...}
//! ```
//!
//! (every field of [`EpochStats`], the pause's parts included), and `decided`: the newest epoch
//! released since the line before, with `publish_us` (from the resume after its pause to its
//! checkpoint handed to the senders: encoding, serialising) and `decide_us` (from there to its
//! last acknowledgement: sending, the backup's checks, the way back).
//!
//! `unix_us` is when the line was written (after the epoch's pause and encoding); `run` is the
//! view the primary started in. Epoch 0 (the full checkpoint) is not logged. A log that cannot
//! be opened or written is reported once and then ignored: the service runs on.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tardi_checkpointer::epoch::EpochStats;

/// The longest a written line waits in the buffer.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// One primary's writer.
pub struct EpochLog {
    out: Option<BufWriter<File>>,
    service: String,
    machine: String,
    run: u64,
    flushed: Instant,
}

#[derive(serde::Serialize)]
struct Line<'a> {
    service: &'a str,
    machine: &'a str,
    run: u64,
    unix_us: u64,
    /// Every figure of the epoch (interval, pause and its parts, pages, bytes, why it ended).
    #[serde(flatten)]
    stats: &'a EpochStats,
    /// The newest epoch decided since the last line, and how long it took.
    #[serde(skip_serializing_if = "Option::is_none")]
    decided: Option<Decided>,
}

/// How long an epoch took from the resume after its pause to its release: `publish_us` from
/// the resume to its checkpoint being handed to the senders (encoding and serialising),
/// `decide_us` from there to the last acknowledgement it needed.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Decided {
    pub epoch: u64,
    pub publish_us: u64,
    pub decide_us: u64,
}

impl EpochLog {
    /// Opens `path` for appending; on error, warns and returns a log that writes nothing.
    pub fn open(path: &Path, service: &str, machine: &str, run: u64) -> EpochLog {
        let out = match OpenOptions::new().create(true).append(true).open(path) {
            Ok(f) => Some(BufWriter::with_capacity(64 << 10, f)),
            Err(e) => {
                tracing::warn!(service, path = %path.display(), %e, "cannot open the epoch log; not logging epochs");
                None
            }
        };
        EpochLog {
            out,
            service: service.into(),
            machine: machine.into(),
            run,
            flushed: Instant::now(),
        }
    }

    /// Appends epoch `st`'s line; flushes if the last flush is [`FLUSH_EVERY`] old.
    pub fn record(&mut self, st: &EpochStats, decided: Option<Decided>) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let line = Line {
            service: &self.service,
            machine: &self.machine,
            run: self.run,
            unix_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            stats: st,
            decided,
        };
        let r = serde_json::to_writer(&mut *out, &line)
            .map_err(std::io::Error::other)
            .and_then(|()| out.write_all(b"\n"));
        if let Err(e) = r {
            self.fail(e);
            return;
        }
        if self.flushed.elapsed() >= FLUSH_EVERY {
            self.flush();
        }
    }

    /// Writes out what is buffered.
    pub fn flush(&mut self) {
        self.flushed = Instant::now();
        if let Some(Err(e)) = self.out.as_mut().map(|o| o.flush()) {
            self.fail(e);
        }
    }

    fn fail(&mut self, e: std::io::Error) {
        tracing::warn!(service = %self.service, %e, "writing the epoch log failed; not logging epochs any more");
        self.out = None;
    }
}

impl Drop for EpochLog {
    fn drop(&mut self) {
        self.flush();
    }
}
