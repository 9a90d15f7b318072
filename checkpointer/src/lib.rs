//! The checkpointer: captures the complete state of a running, unmodified Linux process into
//! bytes, and turns those bytes back into the same running process in a fresh sandbox.
//!
//! Owns: quiescence (ptrace), reading memory, threads and descriptors from outside, the
//! restore plan and the freestanding restorer (`restorer/`), write tracking ([`track`]:
//! userfaultfd, or mprotect through the freestanding agent `agent/` that [`agent`] loads into
//! the process), the epoch loop ([`epoch`]) and its eBPF count of the process's descriptor
//! calls ([`syscount`]); timers ([`timers`]), the service's seccomp filters ([`seccomp`]) and
//! inotify watches ([`inotify`]), shared memory objects ([`shm`]), process trees ([`tree`]), and
//! the primary's half of the divergence check ([`scrub`]: digests of the stopped process).
//! Must not touch: namespaces, mounts, networking, manifests (that is `tardi-sandbox`), or
//! anything about replication: a checkpoint is bytes with an epoch number, and restore takes
//! bytes.
//!
//! The checkpoint format, the page codecs, the private directories' tree and the receiver's
//! image are the crate `tardi-image` (no ptrace, fuzzed on its own), re-exported here as
//! [`image`], [`delta`] and [`store`]; [`files`] adds the capture-side walk to its tree.
//!
//! Entry points: [`capture::checkpoint`] and [`restore::prepare`] / [`restore::child_main`] /
//! [`restore::finish`].

#[path = "../restorer/abi.rs"]
pub mod abi;
pub mod agent;
pub mod budget;
pub mod capture;
pub mod creds;
pub mod epoch;
pub mod fds;
pub mod files;
pub mod inotify;
pub mod procfs;
pub mod ptrace;
pub mod restore;
pub mod scrub;
pub mod seccomp;
pub mod shm;
pub mod sys;
pub mod syscount;
pub mod timers;
pub mod track;
pub mod tree;
pub mod unix;
pub mod verify;

pub use tardi_image::{delta, image, store};

pub use capture::{CaptureError, CaptureStats, checkpoint};
pub use image::{Checkpoint, FormatError};

// The image crate validates thread state against the restorer's XSAVE buffer size.
const _: () = assert!(abi::XSTATE_MAX == image::XSTATE_MAX);
