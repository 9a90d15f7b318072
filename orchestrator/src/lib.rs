//! The replicated cluster service (openraft): failure detector and view manager
//! (Vertical-Paxos-style views: propose, full checkpoint to new backups, activate).
//!
//! **Not implemented yet.** Placeholder crate; its work arrives with the orchestrator issue.
//!
//! Architecture invariant: the orchestrator never touches a service's memory or checkpoints; it
//! decides roles and views only.
