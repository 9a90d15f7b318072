#![allow(dead_code)] // each test binary uses part of it

pub mod chain;
pub mod mutate;
