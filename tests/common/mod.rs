#![allow(dead_code)]
pub mod programs;
pub mod tardi;
