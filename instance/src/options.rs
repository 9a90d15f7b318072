//! The `tardi instance` flags, as the daemon takes them.

#[allow(unused_imports)]
use super::*;

/// How an instance runs (the `tardi instance` flags).
#[derive(Debug, Clone)]
pub struct Options {
    /// This machine's name in the cluster.
    pub machine: String,
    /// Where the checkpoint stream listens (primaries on other machines connect here; the
    /// address is registered with the orchestrator).
    pub listen: SocketAddr,
    /// The orchestrators (comma-separated `host:port` or URLs): the session and activation
    /// follow the cluster's leader among them.
    pub orchestrator: String,
    /// The interface clients reach services through: the service address is claimed there.
    pub service_if: String,
    /// Where services' private directories live on this machine (`<state_dir>/<service>/...`).
    pub state_dir: PathBuf,
    /// Run directories of this machine's sandboxes (`<run_dir>/<service>`).
    pub run_dir: PathBuf,
    /// Checkpoints a backup queues before it stops acknowledging (Tardigrade's knob).
    pub queue_len: usize,
    /// Bits per second for the checkpoint stream (all backups together); `None`: unlimited.
    pub link_bandwidth: Option<u64>,
    pub heartbeat: Duration,
    /// Append one JSON line per epoch of every primary here ([`epoch_log`]); `None`: no log.
    pub epoch_log: Option<PathBuf>,
    /// Serve Prometheus metrics on `http://ADDR/metrics` ([`metrics`]).
    pub metrics: Option<SocketAddr>,
    /// Mutual TLS (the orchestrator session and the checkpoint streams both ways) or
    /// plaintext.
    pub security: tardi_tls::Security,
    /// Testing only (`--fault-restore FILE`): a takeover's restore fails on purpose, once the
    /// sandbox is set up and before the restored process runs, if this instance removes FILE
    /// (instances given the same file share one fault). `None` in any real deployment.
    pub fault_restore: Option<PathBuf>,
    /// Testing only (`--fault-corrupt-image FILE`): a backup here corrupts its image once, after
    /// applying a checkpoint, if it removes FILE ([`Backup::corrupt_when_removed`]). `None` in
    /// any real deployment.
    pub fault_corrupt_image: Option<PathBuf>,
    /// Testing only (`--fault-drop-tcp`): a takeover here restores as if its checkpoint carried
    /// no TCP connection (they are reset, said, counted, and their clients probed). `false` in
    /// any real deployment.
    pub fault_drop_tcp: bool,
}
