#![allow(dead_code)]
pub mod cluster;
pub mod driven;
pub mod memcache;
pub mod programs;
pub mod resp;
pub mod tardi;
