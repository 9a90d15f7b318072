//! Gramine-format manifests (TOML) plus Tardi's `[tardi]` table.
//!
//! Owns: parsing and validating a manifest file into [`Manifest`], with errors that name the
//! offending key and its line. Must not touch: processes, namespaces, the network — a manifest is
//! pure data; `tardi-sandbox` turns it into a running sandbox. The only host access is checking
//! that `libos.entrypoint` is an executable file (and reading `loader.env.X = { passthrough = true }`
//! from Tardi's own environment, as Gramine does).
//!
//! Input is a *rendered* Gramine manifest: a value still containing Jinja (`{{ ... }}`) is an
//! error that says to run `gramine-manifest` first. Keys Tardi honours:
//!
//! - `libos.entrypoint` — absolute host path, optionally `file:`-prefixed. **Tardi extension:** a
//!   path starting with `./` or `../` is resolved against the manifest file's directory.
//! - `loader.argv` (default `[entrypoint]`), `loader.env.NAME = "v"` / `{ value = "v" }` /
//!   `{ passthrough = true }`.
//! - `fs.mounts` (`type = "chroot"` with `uri = "file:/host/path"`, or `type = "tmpfs"`),
//!   `fs.start_dir`.
//! - `sys.stack.size`, `sys.brk.max_size` (Gramine sizes: bytes or `"8M"`, suffix K/M/G),
//!   `sys.enable_sigterm_injection`.
//! - `[tardi]`: `name`, `ports`, `private_dirs`, `[tardi.epoch]`, `[tardi.network]`.
//!
//! Gramine keys without meaning here (`sgx.*`, `loader.entrypoint`, `loader.log_level`,
//! `loader.uid`/`gid`, `*.insecure__*`, `*.experimental__*`, `fs.root`, ...) are accepted and
//! reported as warnings ([`load_with_warnings`]); any other key is an error.

mod error;
mod parse;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

pub use error::{Location, ManifestError};

/// Read and validate the manifest at `path`. Warnings about ignored Gramine keys are logged
/// (`tracing::warn!`); use [`load_with_warnings`] to get them instead.
pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
    let (manifest, warnings) = load_with_warnings(path)?;
    log_warnings(&warnings);
    Ok(manifest)
}

/// Like [`load`], but returns the warnings (each a full `file:line: ...` message) unlogged.
pub fn load_with_warnings(path: &Path) -> Result<(Manifest, Vec<String>), ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_with_warnings(&text, path)
}

/// Validate manifest `text` as if read from `source` (used in messages, for
/// [`Manifest::source`] and to resolve `./`-relative entrypoints). Does everything [`load`] does
/// except reading the file, including the entrypoint check. Warnings are logged.
pub fn parse(text: &str, source: &Path) -> Result<Manifest, ManifestError> {
    let (manifest, warnings) = parse_with_warnings(text, source)?;
    log_warnings(&warnings);
    Ok(manifest)
}

/// Like [`parse`], but returns the warnings (each a full `file:line: ...` message) unlogged.
pub fn parse_with_warnings(
    text: &str,
    source: &Path,
) -> Result<(Manifest, Vec<String>), ManifestError> {
    parse::parse_manifest(text, source)
}

fn log_warnings(warnings: &[String]) {
    for w in warnings {
        tracing::warn!("{w}");
    }
}

impl Manifest {
    /// The mounts to set up: [`Manifest::mounts`], or when that is empty, the host's `/`
    /// read-only at `/` plus a writable bind of each private dir from the same host path.
    pub fn mounts_or_default(&self) -> Vec<Mount> {
        if !self.mounts.is_empty() {
            return self.mounts.clone();
        }
        let root = Mount {
            path: PathBuf::from("/"),
            kind: MountKind::Bind {
                host_path: PathBuf::from("/"),
                writable: false,
            },
        };
        let private = self.tardi.private_dirs.iter().map(|d| Mount {
            path: d.clone(),
            kind: MountKind::Bind {
                host_path: d.clone(),
                writable: true,
            },
        });
        std::iter::once(root).chain(private).collect()
    }
}

fn default_after_release_ms() -> f64 {
    1.3
}

impl Default for Epoch {
    fn default() -> Self {
        Epoch {
            interval_ms: 10.0,
            min_ms: 1.75,
            follow_releases: true,
            follow_min_ms: 0.1,
            after_release_ms: default_after_release_ms(),
            cap_pages: 4000,
            hot_epochs: 3,
            tracker: "uffd".to_string(),
            precopy_min_pages: 256,
            encode_budget: 0,
        }
    }
}

impl Default for Network {
    fn default() -> Self {
        Network {
            subnet: Ipv4Addr::new(10, 213, 0, 0),
        }
    }
}

impl std::fmt::Display for Port {
    /// `tcp:6379`, the manifest spelling.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        write!(f, "{proto}:{}", self.port)
    }
}

/// A parsed, validated manifest.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// File the manifest was read from (absolute).
    pub source: PathBuf,
    /// `libos.entrypoint`: absolute host path of the unmodified binary (a `file:` prefix is
    /// accepted and stripped). Checked to exist and be executable at load time.
    pub entrypoint: PathBuf,
    /// `loader.argv`: the full argv, argv[0] included. Defaults to `[entrypoint]`.
    pub argv: Vec<String>,
    /// `loader.env.NAME = "value"` (or `{ value = "..." }`), in key order.
    pub env: BTreeMap<String, String>,
    /// `fs.start_dir`: working directory inside the sandbox. Defaults to `/`.
    pub start_dir: PathBuf,
    /// `fs.mounts`: what the service sees. Empty means "the host's root, read-only", see
    /// [`Manifest::mounts_or_default`].
    pub mounts: Vec<Mount>,
    /// `sys.*` keys that mean something here.
    pub sys: Sys,
    /// The `[tardi]` table.
    pub tardi: Tardi,
}

/// One `fs.mounts` entry.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Mount {
    /// Path inside the sandbox (absolute).
    pub path: PathBuf,
    /// What is mounted there.
    pub kind: MountKind,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum MountKind {
    /// Gramine `type = "chroot"` (the default) with `uri = "file:/host/path"`: a bind mount of a
    /// host file or directory. Read-only unless the path is one of `tardi.private_dirs`.
    Bind { host_path: PathBuf, writable: bool },
    /// Gramine `type = "tmpfs"`.
    Tmpfs,
}

/// `sys.*` keys that Tardi honours.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sys {
    /// `sys.stack.size` in bytes (Gramine size strings like "8M" accepted): RLIMIT_STACK.
    pub stack_size: Option<u64>,
    /// `sys.brk.max_size` in bytes: RLIMIT_DATA.
    pub brk_max_size: Option<u64>,
    /// `sys.enable_sigterm_injection`: accepted; Tardi always forwards SIGTERM.
    pub enable_sigterm_injection: bool,
}

/// Tardi's own table, for what Gramine has no key for.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tardi {
    /// `tardi.name`: service name (`[a-z0-9][a-z0-9-]{0,30}`), also the sandbox's name.
    pub name: String,
    /// `tardi.ports = ["tcp:6379", "udp:9000"]`: the service's ports.
    pub ports: Vec<Port>,
    /// `tardi.private_dirs = ["/var/lib/redis"]`: sandbox paths that are the service's private
    /// writable state (checkpointed with it). Each must also be a mount's path or lie under one.
    pub private_dirs: Vec<PathBuf>,
    /// `tardi.user = "redis"`: run the service as this user (a name in the sandbox's
    /// `/etc/passwd`, or a numeric ID) with its groups, instead of root. Checkpoints keep the
    /// service's credentials whichever way it got them (this option or dropping root itself).
    #[serde(default)]
    pub user: Option<String>,
    /// `[tardi.epoch]`.
    pub epoch: Epoch,
    /// `[tardi.network]`.
    pub network: Network,
    /// `[tardi.failover]`.
    #[serde(default)]
    pub failover: Failover,
    /// `[tardi.scrub]`.
    #[serde(default)]
    pub scrub: Scrub,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Proto {
    Tcp,
    Udp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Port {
    pub proto: Proto,
    pub port: u16,
}

/// `[tardi.epoch]`: checkpoint scheduling (used by incremental checkpoints).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Epoch {
    /// `interval_ms`, default 10.
    pub interval_ms: f64,
    /// `min_ms`: minimum epoch length, default 1.75 (but see `follow_releases`). With many
    /// clients a release answers, a longer minimum lets their next requests join the open
    /// epoch instead of missing it by a few hundred microseconds and waiting a whole cycle:
    /// replicated Redis with 50 clients at 1.5 against 1 ms, four runs alternated, median
    /// latency 1.65–1.96 against 2.26–2.48 ms, ~20% fewer epochs, throughput a little higher;
    /// at 1.75 against 1.5, four pairs, replicated SET 6% higher (median 22.75K against
    /// 21.05K/s), 12% fewer epochs (docs/BENCHMARKS.md, "When an epoch ends on output"). A
    /// lone request after a release of many packets waits the longer minimum.
    pub min_ms: f64,
    /// `follow_releases`: once the clients the last release answered have answered again (this
    /// epoch queued as many output packets as that release sent), end the epoch after
    /// `follow_min_ms` instead of `min_ms`. Default true; only a replicated primary (which
    /// holds output) knows of releases.
    pub follow_releases: bool,
    /// `follow_min_ms`: minimum epoch length under `follow_releases`, default 0.1.
    pub follow_min_ms: f64,
    /// `after_release_ms`: under `follow_releases`, while the clients the last release answered
    /// have not all answered again, waiting output ends the epoch no sooner than this long
    /// after that release (when it came during the epoch), besides `min_ms` after the resume;
    /// default 1.3, 0 turns it off. Their answers only start at the release, which comes later
    /// on a slower machine: there a minimum counted from the resume alone ended about half of
    /// replicated Redis's epochs before its 50 clients had answered (docs/BENCHMARKS.md, "When an
    /// epoch ends on output").
    #[serde(default = "default_after_release_ms")]
    pub after_release_ms: f64,
    /// `cap_pages`: end the epoch early once this many pages are dirty, default 4000 (16 MiB
    /// written: at 1000, Redis under SET load ended most 10 ms epochs early and lost 10–15% of
    /// its tracked throughput to the extra epochs; `docs/BENCHMARKS.md`, "The dirty-page cap").
    pub cap_pages: u64,
    /// `hot_epochs`: a page written in this many consecutive epochs is hot (left writable by the
    /// mprotect tracker; userfaultfd ignores it), default 3.
    pub hot_epochs: u32,
    /// `tracker`: how written pages are found, `"uffd"` (userfaultfd write-protect, Linux >=
    /// 6.7, the default) or `"mprotect"` (mprotect + SIGSEGV through an in-process agent).
    pub tracker: String,
    /// `precopy_min_pages`: pre-copy the written pages before a pause only when the epoch
    /// before wrote at least this many (0: before every pause), default 256. Under the
    /// userfaultfd tracker only.
    pub precopy_min_pages: u64,
    /// `encode_budget`: after each pause, the encoding of the epoch yields to the service
    /// (runs at nice 10) for up to this many intervals after the resume, then finishes at
    /// normal priority; the next epoch ends no earlier than the encoding (a slow one lengthens
    /// it). 0: the encoding runs at normal priority. Default 0 (see docs/BENCHMARKS.md,
    /// "Encoding on a budget").
    pub encode_budget: u32,
}

/// `[tardi.failover]`: how often the orchestrator moves the service to another machine after
/// its primary *reported* a failure (a takeover whose restore failed, a service that ended on
/// its own) before it gives up and marks the service failed. A machine that merely stops
/// answering is not counted: it is replaced as often as it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failover {
    /// `max_failures`: give up at this many reported failures within `window_s`, default 3.
    pub max_failures: u32,
    /// `window_s`: the window failures are counted in, seconds, default 600.
    pub window_s: u64,
    /// `max_backup_lag_ms`: a backup whose image has not advanced for this long while the
    /// primary's epochs went past it (a blackholed or very slow checkpoint link, a CPU-starved
    /// backup) is dropped from the view and replaced by a spare, default 5000: until then the
    /// service's output waits for it.
    pub max_backup_lag_ms: u64,
}

impl Default for Failover {
    fn default() -> Self {
        Failover {
            max_failures: 3,
            window_s: 600,
            max_backup_lag_ms: 5000,
        }
    }
}

/// `[tardi.scrub]`: the divergence check. Now and then a pause of the primary digests a slice
/// of the service's memory (read from the process itself) and the metadata a checkpoint may
/// carry over; each backup compares them with its image once it applied that checkpoint, and a
/// backup whose image differs drops it and is sent a full checkpoint (`tardi status` and the
/// metric `tardi_instance_scrub_mismatches_total` count them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scrub {
    /// `interval_ms`: at most one check per this long, default 1000; 0 turns the check off.
    pub interval_ms: u64,
    /// `pages`: pages per check, default 256 (1 MiB read and hashed inside one pause at most:
    /// only pages with contents of their own are read). The walk goes on from where the last
    /// check ended, so the whole memory is covered once every (mapped pages / `pages`) checks.
    pub pages: u32,
}

impl Default for Scrub {
    fn default() -> Self {
        Scrub {
            interval_ms: 1000,
            pages: 256,
        }
    }
}

/// `[tardi.network]`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Network {
    /// `subnet`: the /16 the sandboxes' /30 links are carved from, default 10.213.0.0.
    pub subnet: Ipv4Addr,
}
