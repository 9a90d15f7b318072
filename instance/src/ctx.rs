//! What every role of this machine shares: the flags, the orchestrators, the machines'
//! addresses, the link throttle, and the reconcile thread's inbox.

#[allow(unused_imports)]
use super::*;

/// One service as assigned to this machine.
pub struct Target {
    pub name: String,
    pub manifest: tardi_manifest::Manifest,
    pub link_index: u32,
    pub view: pb::View,
    pub fresh: bool,
}

/// What every part of the daemon shares.
pub struct Ctx {
    pub opts: Options,
    pub rt: tokio::runtime::Handle,
    pub(crate) machines: Mutex<HashMap<String, String>>,
    pub throttle: Option<Arc<throttle::Throttle>>,
    /// The orchestrator cluster (remembers its leader).
    pub(crate) orchestrators: Orchestrators,
    /// The reconcile thread's inbox.
    pub(crate) events: std::sync::mpsc::Sender<Event>,
}

/// What the reconcile thread acts on.
pub(crate) enum Event {
    /// New assignments from the orchestrator.
    Assign(pb::Assignments),
    /// A role changed by itself (a primary failed): reconcile again with the last assignments.
    Wake,
}

impl Ctx {
    /// This machine's sandbox configuration for a service: the manifest's, with this machine's
    /// run directory, the cluster-wide link index (so the same address everywhere), and the
    /// private directories' host paths under this machine's state directory.
    pub fn sandbox_config(&self, t: &Target) -> anyhow::Result<SandboxConfig> {
        let mut c = SandboxConfig::from_manifest(&t.manifest);
        c.run_dir = self.opts.run_dir.join(&t.name);
        c.link_index = Some(t.link_index);
        for m in &mut c.mounts {
            if let tardi_manifest::MountKind::Bind {
                host_path,
                writable: true,
            } = &mut m.kind
            {
                let rel = host_path.strip_prefix("/").unwrap_or(host_path);
                *host_path = self.opts.state_dir.join(&t.name).join(rel);
                std::fs::create_dir_all(&*host_path)
                    .with_context(|| format!("creating {}", host_path.display()))?;
            }
        }
        Ok(c)
    }

    /// A service started afresh (not restored) starts from its manifest's private directories:
    /// each writable directory this machine keeps for it (see [`Ctx::sandbox_config`]) is
    /// emptied and filled with a copy of the manifest's host directory (`cp -a`: owners, modes
    /// and times kept; the directory's own owner and mode too, which a service such as
    /// PostgreSQL checks), or left empty when this machine has no such directory. What an
    /// earlier run of the service left there is not its state any more: a fresh start means
    /// the manifest's state, and a restore brings the checkpoint's.
    /// `here` is this machine's configuration of the service ([`Ctx::sandbox_config`]).
    pub fn seed_private_dirs(&self, t: &Target, here: &SandboxConfig) -> anyhow::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let manifest = SandboxConfig::from_manifest(&t.manifest);
        for (m, h) in manifest.mounts.iter().zip(&here.mounts) {
            let (
                tardi_manifest::MountKind::Bind {
                    host_path: from,
                    writable: true,
                },
                tardi_manifest::MountKind::Bind { host_path: to, .. },
            ) = (&m.kind, &h.kind)
            else {
                continue;
            };
            if from == to {
                continue;
            }
            std::fs::remove_dir_all(to).with_context(|| format!("emptying {}", to.display()))?;
            std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
            let Ok(meta) = std::fs::metadata(from) else {
                tracing::info!(service = %t.name, dir = %from.display(), "no such directory here: the service starts with an empty one");
                continue;
            };
            if !meta.is_dir() {
                anyhow::bail!(
                    "{} (a writable mount of the manifest) is not a directory",
                    from.display()
                );
            }
            let out = std::process::Command::new("cp")
                .arg("-a")
                .arg(from.join("."))
                .arg(to)
                .output()
                .context("running cp")?;
            if !out.status.success() {
                anyhow::bail!(
                    "copying {} to {}: {}",
                    from.display(),
                    to.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            std::os::unix::fs::chown(to, Some(meta.uid()), Some(meta.gid()))
                .with_context(|| format!("giving {} its owner", to.display()))?;
            std::fs::set_permissions(to, meta.permissions())
                .with_context(|| format!("giving {} its mode", to.display()))?;
            tracing::info!(service = %t.name, from = %from.display(), to = %to.display(), "private directory seeded from the manifest's");
        }
        Ok(())
    }

    /// Tells the reconcile thread that a role changed by itself (a primary failed).
    pub fn wake(&self) {
        let _ = self.events.send(Event::Wake);
    }

    pub fn machine_api(&self, m: &str) -> Option<String> {
        self.machines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(m)
            .cloned()
    }

    /// Asks the orchestrators' leader to activate `view` (following the leader for up to a
    /// second: a primary asks again after a refusal).
    pub async fn activate(&self, service: &str, view: u64) -> anyhow::Result<()> {
        let req = pb::ActivateRequest {
            service: service.to_string(),
            view,
            primary: self.opts.machine.clone(),
        };
        let r = self
            .orchestrators
            .call(Duration::from_secs(1), |mut c, _| {
                let req = req.clone();
                async move { c.activate(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        if r.activated {
            Ok(())
        } else {
            anyhow::bail!("{}", r.error)
        }
    }
}
