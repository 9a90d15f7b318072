//! What the benchmark and campaign examples share: the repository's root and a shell helper for
//! the machine's facts (commit, kernel, load) they record beside their figures.

use std::path::PathBuf;

/// The repository's root (the root package's manifest directory).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `sh -c CMD`'s trimmed standard output; empty if it could not run.
pub fn sh(cmd: &str) -> String {
    std::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
