//! The per-machine daemon: runs a sandbox as primary, backup or spare, exchanges checkpoints with
//! its peers over gRPC and takes over on failover.
//!
//! **Not implemented yet.** This crate is a placeholder so that the workspace shows the
//! architecture; its work arrives with the replication issue. Nothing here pretends to work.
//!
//! Architecture invariant: `instance` (with `orchestrator`) is the only place that knows about the
//! network protocol between machines; the checkpointer hands it bytes with an epoch number.
