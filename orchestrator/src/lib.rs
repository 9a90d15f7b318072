//! The orchestrator: decides which machine is primary, backup or spare for each service
//! (views), detects failed instances, and activates views.
//!
//! Owns: the view manager ([`views`], a deterministic state machine over [`views::Command`]s),
//! its replication across orchestrator nodes with openraft ([`consensus`]: types and timing;
//! [`store`]: the log and state machine in redb; [`network`]: raft over tonic), the failure
//! detector and the gRPC control plane ([`server`]), reaching the cluster's leader from
//! instances and the CLI ([`client`]), the status as JSON ([`status`]) and the status page
//! served beside the metrics ([`page`], with its time series in [`series`]). One node is a
//! cluster of one: the same code path.
//!
//! Must not touch: a service's memory or checkpoints. It decides roles and views only; safety
//! never depends on its failure detector (a view is activated only when its primary asks, and
//! instances refuse checkpoints of views they have left).

/// Reaching the cluster's leader: the crate `tardi-orchestrator-client`, which instances link
/// instead of this one.
pub use tardi_orchestrator_client as client;
pub mod consensus;
pub mod network;
pub mod page;
pub mod series;
pub mod server;
pub mod status;
pub mod store;
pub mod views;

pub use tardi_orchestrator_client::shutdown_signal;
