//! The lab cluster of the tests: `tardi_testkit::cluster::Cluster` run by this build's `tardi`
//! binary, keeping a failing test's daemon logs under `CARGO_TARGET_TMPDIR/lab-logs/<test>/`.

#![allow(dead_code)]

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

// Not every test binary uses it.
#[allow(unused_imports)]
pub use tardi_testkit::cluster::redis_manifest_with;

pub fn tardi_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tardi"))
}

/// A cluster on the lab (see `tardi_testkit::cluster`): every method is the kit's.
pub struct Cluster(tardi_testkit::cluster::Cluster);

impl Deref for Cluster {
    type Target = tardi_testkit::cluster::Cluster;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Cluster {
    /// `machines` machines and one orchestrator; `orchestrator_args` are added to
    /// `tardi orchestrator` (e.g. a longer failure timeout).
    pub fn up(machines: usize, orchestrator_args: &[&str]) -> Cluster {
        Cluster::up_with(machines, 1, orchestrator_args)
    }

    /// `machines` machines and an orchestrator cluster of `orchestrators` nodes.
    pub fn up_with(machines: usize, orchestrators: usize, orchestrator_args: &[&str]) -> Cluster {
        Cluster::up_args(machines, orchestrators, orchestrator_args, &[])
    }

    /// The same, with `instance_args` added to every `tardi instance`.
    pub fn up_args(
        machines: usize,
        orchestrators: usize,
        orchestrator_args: &[&str],
        instance_args: &[&str],
    ) -> Cluster {
        Cluster(
            tardi_testkit::cluster::Cluster::builder(tardi_exe())
                .machines(machines)
                .orchestrators(orchestrators)
                .orchestrator_args(orchestrator_args)
                .instance_args(instance_args)
                .keep_logs_on_panic(Path::new(env!("CARGO_TARGET_TMPDIR")).join("lab-logs"))
                .up(),
        )
    }
}
