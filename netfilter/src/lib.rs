//! Output buffering: nftables rules and a userspace NFQUEUE consumer that hold the primary's
//! outgoing packets per epoch and release an epoch once its checkpoint is replicated.
//!
//! **Not implemented yet.** Placeholder crate; its work arrives with the output-commit issue.
//! The queue must sit host-side of the sandbox's veth (FORWARD path), never on the OUTPUT hook
//! inside the sandbox (see `docs/ARCHITECTURE.md`).
