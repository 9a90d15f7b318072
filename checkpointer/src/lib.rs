//! The checkpointer: captures the complete state of a running, unmodified Linux process into
//! bytes, and turns those bytes back into the same running process in a fresh sandbox.
//!
//! Owns: quiescence (ptrace), reading memory, threads and descriptors from outside, the
//! checkpoint format ([`image`]), the restore plan and the freestanding restorer
//! (`restorer/`), write tracking ([`track`]: userfaultfd, or mprotect through the freestanding
//! agent `agent/` that [`agent`] loads into the process) and the epoch loop ([`epoch`]).
//! Must not touch: namespaces, mounts, networking, manifests (that is `tardi-sandbox`), or
//! anything about replication: a checkpoint is bytes with an epoch number, and restore takes
//! bytes.
//!
//! Entry points: [`capture::checkpoint`] and [`restore::prepare`] / [`restore::child_main`] /
//! [`restore::finish`].

#[path = "../restorer/abi.rs"]
pub mod abi;
pub mod agent;
pub mod capture;
pub mod delta;
pub mod epoch;
pub mod fds;
pub mod files;
pub mod image;
pub mod procfs;
pub mod ptrace;
pub mod restore;
pub mod store;
pub mod sys;
pub mod track;
pub mod verify;

pub use capture::{CaptureError, CaptureStats, checkpoint};
pub use image::{Checkpoint, FormatError};
