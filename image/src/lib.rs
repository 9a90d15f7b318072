//! The checkpoint image: the persisted checkpoint format and everything a receiver needs to
//! check checkpoints and apply them, with nothing of capture.
//!
//! Owns:
//! - [`image`]: the wire format of one checkpoint ([`Checkpoint`], [`ProcessImage`]) and its
//!   validation on read: a checkpoint that passes [`Checkpoint::from_bytes`] is internally
//!   consistent (every offset, length and index inside what it refers to).
//! - [`delta`]: the page codecs (XOR + zstd, xdelta3, zstd, raw) and the twin store, whose
//!   pages live in a huge-page arena (`arena.rs`, the crate's only `unsafe` code).
//! - [`files`]: the private directories' tree and the changes a checkpoint carries for it.
//! - [`scrub`]: the divergence check, digests of the process a backup compares its image with.
//! - [`store`]: [`store::Image`], a process image a chain of checkpoints is applied to: what a
//!   backup keeps, and turns back into a full checkpoint to restore from.
//!
//! Must not touch: ptrace, processes, namespaces, the network, or the file system beyond
//! reading a checkpoint file it is asked to open. The checkpointer (`tardi-checkpointer`)
//! captures and restores and re-exports these modules under its own paths; a backup links
//! only this crate.
//!
//! **No panic is reachable from the bytes of a checkpoint** (from a file or from a peer): they
//! are untrusted. Decoding refuses whatever is inconsistent with an error that names it, and
//! allocations are bounded by the bytes actually received. `tests/mutate.rs` mutates
//! real-shaped checkpoint chains and page encodings to hold this, for `TARDI_FUZZ_SECS` in every
//! test run (see there for longer runs); `fuzz/` has AFL++ targets for the same
//! (`fuzz/run.sh SECONDS`).

mod arena;
mod bytes;
pub mod delta;
pub mod files;
pub mod image;
pub mod scrub;
pub mod store;

pub use image::{Checkpoint, FormatError, ProcessImage};
