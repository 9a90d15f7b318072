//! `--verify`: the image built from the whole chain against the held process, and a restore of
//! it (held, in a second sandbox) against the same process.

use super::stats::Summary;
use anyhow::Context;
use std::path::Path;
use tardi_checkpointer::store::Image;
use tardi_service::{SandboxConfig, Service};

/// Differences listed by `--verify`.
const DIFF_LIMIT: usize = 20;

/// The process `pid` is held in the state `image` describes. Compares the image with it, then
/// restores the image into a second sandbox and compares the two processes. Returns the
/// differences (empty: identical).
pub(super) fn verify(
    pid: i32,
    image: &Image,
    config: &SandboxConfig,
) -> anyhow::Result<Vec<String>> {
    let diffs = tardi_checkpointer::verify::compare_live_tree(pid, image, DIFF_LIMIT)
        .context("comparing the image with the live process")?;
    if !diffs.is_empty() {
        return Ok(diffs
            .into_iter()
            .map(|d| format!("image vs live process: {d}"))
            .collect());
    }
    let mut full = image.to_full();
    // The second sandbox has an address of its own: the service's connections cannot be
    // carried there: they come back reset, as they always did there, without a warning each.
    full.image.drop_connections();
    let name = format!("{}-verify", config.name);
    let cfg2 = SandboxConfig {
        run_dir: Path::new(tardi_sandbox::RUN_ROOT).join(&name),
        name,
        link_index: None,
        ..config.clone()
    };
    let (sb2, held) = Service::restore_held_tree(&full, cfg2.clone())
        .context("restoring the image into a second sandbox")?;
    drop(full);
    let r = tardi_checkpointer::verify::compare_processes_tree(pid, &held, image, DIFF_LIMIT)
        .context("comparing the restored process with the live one");
    let torn = sb2.teardown();
    let diffs: Vec<String> = r?
        .into_iter()
        .map(|d| format!("restored vs live process: {d}"))
        .collect();
    torn.context("tearing the verification sandbox down")?;
    // Nothing to keep from this internal sandbox (its log is only useful when it failed).
    let _ = std::fs::remove_dir_all(&cfg2.run_dir);
    Ok(diffs)
}

/// Puts the outcome of [`verify`] (differences, or why it could not run) into the summary.
pub(super) fn outcome_into(v: &Result<Vec<String>, String>, s: &mut Summary) {
    match v {
        Ok(diffs) if diffs.is_empty() => s.verified = Some(true),
        Ok(diffs) => {
            s.verified = Some(false);
            s.verify_error = Some(format!(
                "{}{} difference(s); first: {}",
                diffs.len(),
                if diffs.len() >= DIFF_LIMIT {
                    " or more"
                } else {
                    ""
                },
                diffs[0]
            ));
            s.verify_differences = diffs.clone();
        }
        Err(e) => {
            s.verified = Some(false);
            s.verify_error = Some(e.clone());
        }
    }
}
