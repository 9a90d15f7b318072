#![allow(dead_code)]
pub mod cluster;
pub mod programs;
pub mod resp;
pub mod tardi;
