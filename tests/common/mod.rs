//! Shared helpers for integration tests (`mod common;`).
pub mod programs;
