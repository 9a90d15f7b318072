//! The bottom layer: the operating system as the checkpointer sees it, and the vocabulary
//! every layer above shares.
//!
//! Owns: system call wrappers ([`sys`]), ptrace ([`ptrace`]), `/proc` ([`procfs`]), the eBPF
//! call counter ([`syscount`]), the checkpointer's error ([`error`]) and address ranges with
//! the page constants ([`ranges`]).
//! Must not touch: anything above it. No module here imports a resource, the capture, the
//! restore, the trackers or the epoch loop; `checkpointer/tests/layers.rs` fails the build's
//! tests when one does (the layers are listed there).

pub mod error;
pub mod filehash;
pub mod procfs;
pub mod ptrace;
pub mod ranges;
pub mod sys;
pub mod syscount;
