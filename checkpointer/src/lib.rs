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
//! Must not touch: making namespaces or mounts, networking, manifests (that is
//! `tardi-sandbox`), or anything about replication: a checkpoint is bytes with an epoch
//! number, and restore takes bytes. It does *enter* the sandbox's namespaces, on a
//! short-lived thread of its own, where reading needs the sandbox's view: `/proc` and System V
//! memory ([`procfs::in_view`], the IPC namespace) and Unix socket peers ([`unix`], the
//! network namespace).
//!
//! The checkpoint format, the page codecs, the private directories' tree and the receiver's
//! image are the crate `tardi-image` (no ptrace, fuzzed on its own), re-exported here as
//! [`image`], [`delta`] and [`store`]; [`files`] adds the capture-side walk to its tree.
//!
//! The crate is layered; a module uses its own layer and the ones below, never one above
//! (`tests/layers.rs` checks it, and that no two modules import each other):
//! - [`os`] — system calls, ptrace, `/proc`, the eBPF call counter, the error, address ranges
//!   and pages;
//! - [`agent`] — the freestanding agent loaded into the process, and the calls made through it;
//! - [`resource`] — one module per kind of resource, its capture and restore halves side by
//!   side;
//! - [`capture`] (with process trees, [`tree`]), [`restore`], [`track`];
//! - [`budget`], [`scrub`] — what a pause adds to a capture;
//! - [`epoch`], [`verify`] — the epoch loop, and the restore-and-compare check.
//!
//! Entry points: [`capture::checkpoint`] and [`restore::prepare`] / [`restore::child_main`] /
//! [`restore::finish`].

#[path = "../restorer/abi.rs"]
pub mod abi;
pub mod os;

pub mod agent;

pub mod resource;

pub mod capture;
pub mod restore;
pub mod track;

pub mod budget;
pub mod epoch;
pub mod scrub;

pub mod verify;

// The modules below the top, under the names the crate has always had for them.
pub use capture::tree;
pub use os::{error, procfs, ptrace, ranges, sys, syscount};
pub use resource::{creds, fds, files, inotify, seccomp, shm, tcp, timers, unix};

pub use tardi_image::{delta, image, store};

pub use capture::{CaptureError, CaptureStats, Handover, checkpoint, checkpoint_and_end};
pub use image::{Checkpoint, FormatError};

// The image crate validates thread state against the restorer's XSAVE buffer size.
const _: () = assert!(abi::XSTATE_MAX == image::XSTATE_MAX);
