//! How the CLI reports to its user, shared by the commands: errors on one line, manifest
//! warnings.

use std::path::Path;
use tardi_service::Manifest;

/// An error and its causes on one line, skipping a cause whose text the message already holds
/// (many library errors quote their source).
pub fn describe(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if !msg.contains(&c) {
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&c);
        }
    }
    msg
}

/// Loads a manifest, printing its warnings.
pub fn load_manifest(path: &Path) -> anyhow::Result<Manifest> {
    let (m, warnings) = tardi_service::load_manifest(path)?;
    for w in warnings {
        eprintln!("tardi: warning: {w}");
    }
    Ok(m)
}
