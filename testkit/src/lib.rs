//! Tardi's test and benchmark helpers, in one place (dev-only: no production crate depends on
//! this one, and it depends on no crate of the service's own code path — not
//! `tardi-checkpointer`, not `tardi-instance` — so their examples can use it without a cycle).
//!
//! What it owns:
//! * [`cluster`]: the one driver of a replicated cluster on the lab (`tardi-lab`), for the
//!   integration tests, the fault campaign and the replication benchmark;
//! * [`programs`]: the builder of the C test programs in `tests/programs/` and their protocol
//!   helpers (the `statemachine` digest, UDP requests);
//! * [`driven`]: a process (a test program, a few lines of Python) driven one command a line;
//! * [`resp`] and [`memcache`]: small Redis and memcached clients (with the failover writers
//!   and checkers the tests share);
//! * [`stats`]: the percentiles (two definitions, named apart) and the mean;
//! * [`root`] and [`sh`]: the repository's root and a shell helper for the machine's facts
//!   that benchmarks record.
//!
//! What it must not hold: anything the `tardi` binary or a library crate needs (that belongs
//! in the crate that needs it), and anything that needs `CARGO_BIN_EXE_tardi` (only the
//! integration tests have it: they pass the binary's path in, see [`cluster::Cluster::builder`]).

pub mod cluster;
pub mod driven;
pub mod memcache;
pub mod programs;
pub mod resp;
pub mod stats;

use std::path::PathBuf;

/// The repository's root (the workspace's, where the root package and `tests/` are): the
/// parent of this crate's directory.
pub fn root() -> PathBuf {
    let kit = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    kit.parent().unwrap_or(kit).to_path_buf()
}

/// `sh -c CMD`'s trimmed standard output; empty if it could not run.
pub fn sh(cmd: &str) -> String {
    std::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_is_the_workspace() {
        let r = super::root();
        assert!(r.join("tests/programs").is_dir(), "{}", r.display());
        assert!(r.join("testkit/Cargo.toml").is_file(), "{}", r.display());
    }

    #[test]
    fn sh_trims_and_survives() {
        assert_eq!(super::sh("echo ' hi '"), "hi");
        assert_eq!(super::sh("exit 3"), "");
    }
}
