//! Tardi's wire protocol, generated from `proto/tardi.proto`: the checkpoint stream between a
//! primary and its backups (`Replica`), and the control plane between instances, the CLI and
//! the orchestrator (`Orchestrator`).
//!
//! Owns: the message types and their meaning (documented in the `.proto` file). Must not touch:
//! behaviour. Only `instance`, `orchestrator` and the CLI's client calls use it.

#![allow(clippy::all, missing_docs)] // generated code

tonic::include_proto!("tardi.v1");
pub use bytes::Bytes;
