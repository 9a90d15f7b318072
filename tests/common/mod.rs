#![allow(dead_code)]
pub mod programs;
pub mod resp;
pub mod tardi;
