#![allow(dead_code)]
//! What the integration tests share. The helpers that need nothing of a test binary live in
//! `tardi-testkit` (re-exported here under their old names); what needs `CARGO_BIN_EXE_tardi`
//! or drives only these tests stays here.
pub mod cluster;
pub mod tardi;

// Not every test binary uses it.
#[allow(unused_imports)]
pub use tardi_testkit::{driven, memcache, programs, resp};
