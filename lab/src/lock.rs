//! The lab's lock: an exclusive `flock` on [`LOCK_FILE`]. The lab has fixed names, so only one
//! can exist on a machine; every command and every [`crate::Lab`] value holds this lock while it
//! works on the lab. `flock` locks belong to an open file description, so two `Lab`s in one
//! process exclude each other as two processes do, and the kernel drops the lock when its holder
//! dies.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{LabError, Result};
use crate::layout::LOCK_FILE;

/// A held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct LabLock {
    _file: File,
}

impl LabLock {
    /// Takes the lock, waiting up to `wait` for its holder to let go.
    pub fn acquire(wait: Duration) -> Result<LabLock> {
        let path = PathBuf::from(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| LabError::io(format!("opening {}", path.display()), e))?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(LabLock { _file: file });
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EWOULDBLOCK) => {}
                Some(libc::EINTR) => continue,
                _ => return Err(LabError::io(format!("locking {}", path.display()), err)),
            }
            if start.elapsed() >= wait {
                return Err(LabError::Busy {
                    path,
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}
