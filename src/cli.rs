//! Command-line definitions. Help texts are the user's manual: keep them accurate.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Tardi turns an unmodified Linux binary into a fault-tolerant service: it runs the binary in a
/// sandbox (its own PID, mount, network, UTS and IPC namespaces), checkpoints the running process
/// and restores it elsewhere with the same PIDs, memory, threads and file descriptors.
///
/// Replicated (fault-tolerant) on a local lab of network-namespace machines:
///   tardi lab up                                     # 3 machines, an orchestrator, a client
///   tardi lab exec client -- tardi deploy gramine-manifests/redis.manifest --backups 1
///   tardi lab exec client -- tardi status
///   tardi lab kill m1                                # power cut: the backup takes over
///   tardi lab down
///
/// On real machines: `tardi orchestrator` on one, `tardi instance` on each, then `tardi deploy`.
///
/// One machine, no replication:
///   tardi run gramine-manifests/redis.manifest      # run a service in a sandbox
///   tardi snapshot redis -o /tmp/redis.tardi         # full checkpoint; the service keeps running
///   tardi restore /tmp/redis.tardi                   # start a sandbox from a checkpoint
///
/// Tardi must run as root. Set TARDI_LOG=debug for detailed logs.
#[derive(Parser, Debug)]
#[command(name = "tardi", version, verbatim_doc_comment)]
pub struct Cli {
    /// Log debug information to stderr.
    #[arg(short, long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    Run(RunArgs),
    Snapshot(SnapshotArgs),
    Restore(RestoreArgs),
    Status(StatusArgs),
    Deploy(DeployArgs),
    Undeploy(UndeployArgs),
    Restart(RestartArgs),
    Orchestrator(OrchestratorArgs),
    Instance(InstanceArgs),
    #[command(about = tardi_lab::ABOUT, long_about = tardi_lab::LONG_ABOUT)]
    Lab(tardi_lab::LabArgs),
    Profile(ProfileArgs),
    Certs(CertsArgs),
}

/// How this program authenticates to the other nodes of the cluster.
#[derive(Args, Debug, Clone)]
pub struct TlsArgs {
    /// This node's TLS directory (ca.pem, node.pem, node.key), made by `tardi certs`: every
    /// connection to or from another node (orchestrators, instances, this CLI) is mutual TLS,
    /// both ends presenting a certificate from the cluster's CA. Required unless
    /// --insecure-plaintext is given.
    #[arg(long, env = "TARDI_TLS_DIR", value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Talk to the other nodes in plaintext: nothing is encrypted or authenticated, anyone who
    /// reaches a port can deploy, read the cluster's state or send checkpoints. For tests on
    /// a closed network only.
    #[arg(long, env = "TARDI_INSECURE_PLAINTEXT", conflicts_with = "tls_dir")]
    pub insecure_plaintext: bool,
}

/// Make the certificates for a cluster's mutual TLS: a CA and a certificate + key per node.
///
/// Writes into DIR (created):
///   DIR/ca.pem, DIR/ca.key        the cluster's CA (keep ca.key on this machine: it signs)
///   DIR/NAME/ca.pem, node.pem, node.key   one directory per node: copy it to the node and
///                                          pass it as --tls-dir (or TARDI_TLS_DIR)
///
/// Orchestrators and instances are named with the addresses their peers dial (IP addresses or
/// DNS names): a node's certificate carries its name and these as subject alternative names,
/// and a peer checks the address it dialled against them. A client identity (--client) is for
/// the CLI: `tardi deploy`, `status`, `undeploy`, `orchestrator join|leave`.
///
/// If DIR already has a CA (ca.pem + ca.key) it signs the new certificates: run this again to
/// add a node. Existing node files are never replaced unless --force is given. Keys are ECDSA
/// P-256, written with mode 0600. `tardi lab up` does all this by itself.
///
/// Example:
///   tardi certs /etc/tardi/pki --orchestrator o1=10.0.0.11 --orchestrator o2=10.0.0.12 \
///       --orchestrator o3=10.0.0.13 --instance m1=10.0.0.21 --instance m2=10.0.0.22 \
///       --client admin
///   scp -r /etc/tardi/pki/m1 m1:/etc/tardi/tls       # then on m1: tardi instance --tls-dir /etc/tardi/tls ...
///   TARDI_TLS_DIR=/etc/tardi/pki/admin tardi status --orchestrator 10.0.0.11:7700
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CertsArgs {
    /// The directory to write into (created if missing).
    pub dir: PathBuf,
    /// An orchestrator node: NAME=ADDR[,ADDR...] (repeat the flag for each node).
    #[arg(long = "orchestrator", value_name = "NAME=ADDR[,ADDR...]")]
    pub orchestrators: Vec<String>,
    /// An instance (machine): NAME=ADDR[,ADDR...], the address its checkpoint stream is dialled
    /// at (repeat the flag for each machine).
    #[arg(long = "instance", value_name = "NAME=ADDR[,ADDR...]")]
    pub instances: Vec<String>,
    /// A client identity for the CLI: NAME (repeat for more).
    #[arg(long = "client", value_name = "NAME")]
    pub clients: Vec<String>,
    /// How long the node certificates are valid, in days (the CA: ten years longer).
    #[arg(long, default_value_t = 825)]
    pub days: u32,
    /// Replace the files of nodes that already have some (the CA is kept).
    #[arg(long)]
    pub force: bool,
}

/// Run a service from a Gramine-format manifest in a sandbox, in the foreground.
///
/// The binary named by `libos.entrypoint` runs unmodified in its own namespaces. It is reachable
/// from this machine at the address printed on start (a veth link carved from
/// `tardi.network.subnet`). Its stdout and stderr go to /run/tardi/NAME/service.log.
///
/// While it runs, `tardi snapshot NAME -o FILE` takes checkpoints of it. Ctrl-C or SIGTERM stops
/// the service and removes everything the sandbox created (namespaces, links, files except the
/// log).
///
/// Example: tardi run gramine-manifests/redis.manifest --json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// The manifest (Gramine TOML plus a [tardi] table).
    pub manifest: PathBuf,
    /// Print events as JSON objects, one per line. The first is
    /// {"event":"started","name":..,"address":..,"pid":..,"log":..,"control":..,
    /// "host_address":..,"host_if":..} (pid: the main process's host PID; host_if: the
    /// host side of the sandbox's link, where an output gate would sit).
    #[arg(long)]
    pub json: bool,
}

/// Write a full checkpoint of a running sandbox to a file; the service keeps running (or, with
/// --stop, ends with it, its TCP connections kept for `tardi restore`).
///
/// The service is paused only while its state is captured (the pause is printed). The file is
/// versioned and checksummed; it is written atomically (no partial file on failure).
///
/// Examples: tardi snapshot redis -o /tmp/redis.tardi
///           tardi snapshot redis -o /tmp/redis.tardi --stop && tardi restore /tmp/redis.tardi
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct SnapshotArgs {
    /// Name of the running sandbox (`tardi.name` of its manifest).
    pub name: String,
    /// Where to write the checkpoint.
    #[arg(short, long)]
    pub output: PathBuf,
    /// End the service with this checkpoint, keeping its TCP connections: they are carried in
    /// the file and closed without a word to their clients, so that `tardi restore FILE` (on
    /// this machine) carries them on and a client sees a pause, not a reset. The service is
    /// ended only once the file is safely written; if it cannot be, the service goes on.
    /// Without --stop the service runs on and its connections are not carried (a restore
    /// resets them).
    #[arg(long)]
    pub stop: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Start a sandbox from a checkpoint file, in the foreground.
///
/// The process comes back with the same PID and TIDs, memory, registers, signal handlers and file
/// descriptors, in a fresh sandbox of the same name (which must not be running). Connected TCP
/// sockets come back carrying on their connections if the file was written by `tardi snapshot
/// --stop`, and as connections reset by the peer otherwise; calls like epoll_wait may return
/// EINTR once.
/// The file is verified (magic, version, length, checksum, mapped files' content hashes) before
/// anything starts: a corrupted or truncated file is refused and nothing is started.
///
/// Example: tardi restore /tmp/redis.tardi --json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RestoreArgs {
    /// A checkpoint written by `tardi snapshot`.
    pub file: PathBuf,
    /// Print events as JSON objects, one per line (as `tardi run --json`).
    #[arg(long)]
    pub json: bool,
}

/// Show replicated services (with an orchestrator), or the sandboxes running on this machine.
///
/// With --orchestrator (or TARDI_ORCHESTRATOR): the orchestrator cluster (leader, term, log
/// index, each member's address, whether it is reachable and, from the leader, its log index),
/// the machines (alive or not) and, per service, its health, address, view (number, active or
/// proposed), primary, backups and spares, and what the instances report: epoch and decided
/// epoch, epochs per second, checkpoint size, pause, backup lag, output held, and the last view
/// change. A primary that failed reports why (`failed: ...`); the failures the orchestrator
/// recorded are listed, and a service it gave up after them shows `FAILED: REASON` (health
/// "failed"; `failed` and `failures` in --json). The leader's answer is preferred: it alone
/// knows which machines are alive.
///
/// Without an orchestrator: the sandboxes `tardi run` / `tardi restore` run on this machine.
///
/// Example: tardi status --orchestrator 10.0.0.1:7700 --json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct StatusArgs {
    /// Print JSON: with an orchestrator, one object
    /// {"orchestrator":..,"cluster":{"leader","members":{NAME:{"addr","voter","reachable",
    /// "log_index"}},..},"machines":[..],"services":[{"name","address","view","active",
    /// "primary","backups","spares",..}]}; without, one object per local sandbox.
    #[arg(long)]
    pub json: bool,
    /// The orchestrators to ask (comma-separated host:port or URLs; the leader's answer is
    /// preferred). Without it (and without TARDI_ORCHESTRATOR), the sandboxes running on this
    /// machine are listed instead.
    #[arg(long, env = "TARDI_ORCHESTRATOR")]
    pub orchestrator: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Take the answer of the first orchestrator that answers, even a follower's (its own
    /// replicated state, without liveness), instead of the leader's.
    #[arg(long)]
    pub any_node: bool,
}

/// Stop protecting a service and stop running it.
///
/// The orchestrator forgets the service's views; its primary's machine tears the sandbox down
/// (the service is killed; its private directories stay on disk under the instance's
/// --state-dir) and its backups drop their images. Waits until no live machine reports a role
/// for the service. Refused if no service has that name.
///
/// Example: tardi undeploy redis
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct UndeployArgs {
    /// The service's name (`tardi.name` in its manifest, as `tardi status` shows it).
    pub service: String,
    /// The orchestrators (comma-separated host:port or URLs; the leader is found among them).
    #[arg(long, env = "TARDI_ORCHESTRATOR")]
    pub orchestrator: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Return once the orchestrator forgot the service, without waiting for the machines.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting for the machines after this long.
    #[arg(long, default_value = "30s", value_parser = crate::parse::parse_duration)]
    pub timeout: std::time::Duration,
}

/// Bring back a service that was given up, from the freshest image a machine holds.
///
/// A service whose primaries failed too often ([tardi.failover] max_failures), or that no
/// machine holding its state could run, is given up: nothing more is tried for it, and its
/// backups (and a machine whose takeover failed) keep their images. Once the cause is fixed
/// (the machine, its kernel, a file the service needs), this brings it back: the failures
/// recorded so far stop counting, and the orchestrator moves the service, as at a failover, to
/// the live machine that holds its freshest image, with every acknowledged write. Waits until
/// a new view of it is active. Refused if the service was not given up; if no live machine
/// holds an image, `tardi status` shows it unavailable until one comes back.
///
/// Example: tardi restart redis
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RestartArgs {
    /// The service's name (as `tardi status` shows it).
    pub service: String,
    /// The orchestrators (comma-separated host:port or URLs; the leader is found among them).
    #[arg(long, env = "TARDI_ORCHESTRATOR")]
    pub orchestrator: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Return once the orchestrator took the request, without waiting for a new view.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting for the new view after this long.
    #[arg(long, default_value = "60s", value_parser = crate::parse::parse_duration)]
    pub timeout: std::time::Duration,
}

/// Deploy a replicated service: a primary runs it, backups receive its checkpoints.
///
/// The orchestrator picks the machines (primary and backups on distinct live machines) and
/// proposes the service's first view. The primary starts the service from the manifest and
/// sends a full checkpoint to each backup, then an incremental one every epoch; the service's
/// network output is held until the backups hold the checkpoint of the epoch that produced it.
/// Once every backup holds the state, the view is activated: the service is protected.
///
/// The manifest's paths (entrypoint, mounts) must be valid on every machine. Private
/// directories (`tardi.private_dirs`) are per machine, under each instance's --state-dir.
///
/// Refused, with nothing deployed: an invalid manifest, a service of that name already
/// deployed, fewer live machines than 1 + BACKUPS.
///
/// When a primary fails (its machine stops answering, its takeover's restore fails, or its
/// service ends on its own), a backup that holds the state takes over. A service whose
/// primaries *report* failures [tardi.failover] max_failures times (default 3) within
/// window_s seconds (default 600), or that no machine holding its state can run, is given up:
/// `tardi status` shows it failed, with why; `tardi restart` brings it back from the freshest
/// image a machine holds; `tardi undeploy` forgets it.
///
/// Example: tardi deploy gramine-manifests/redis.manifest --backups 1
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct DeployArgs {
    /// The manifest (Gramine TOML plus a [tardi] table).
    pub manifest: PathBuf,
    /// How many backups (each on its own machine).
    #[arg(long, default_value_t = 1)]
    pub backups: u32,
    /// The orchestrators (comma-separated host:port or URLs; the leader is found among them).
    #[arg(long, env = "TARDI_ORCHESTRATOR")]
    pub orchestrator: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Return once the orchestrator accepted the deployment, without waiting for protection.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting for protection after this long.
    #[arg(long, default_value = "60s", value_parser = crate::parse::parse_duration)]
    pub timeout: std::time::Duration,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Run an orchestrator node: it detects failed instances and decides views.
///
/// Instances connect to it and send a heartbeat every few milliseconds; one silent for
/// --failure-timeout is suspected failed, and the orchestrator proposes a new view for each of
/// its services (a surviving backup becomes primary; later a spare becomes a backup). A view
/// becomes active only when its primary asks: the failure detector never decides safety.
///
/// Orchestrators form a cluster (Raft, 3 or 5 nodes; one node is a cluster of one) that
/// replicates the views; its log and state live in --data-dir. The leader serves instances
/// and writes; the others follow and take over if it fails. With an empty data directory the
/// node named first in --peers (or a node without --peers) initializes the cluster and the
/// others wait for it; a node restarted from its data directory rejoins (--peers is then
/// ignored). `tardi orchestrator join|leave` change the membership.
///
/// Examples:
///   tardi orchestrator --name o1 --listen 10.0.0.1:7700
///   tardi orchestrator --name o1 --listen 10.0.0.1:7700 \
///       --peers o1=10.0.0.1:7700,o2=10.0.0.2:7700,o3=10.0.0.3:7700
///   tardi orchestrator --name o4 --listen 10.0.0.4:7700 --join    # then, anywhere:
///   tardi orchestrator join --name o4 --addr 10.0.0.4:7700 --orchestrator 10.0.0.1:7700
#[derive(Args, Debug)]
#[command(verbatim_doc_comment, args_conflicts_with_subcommands = true)]
pub struct OrchestratorArgs {
    #[command(subcommand)]
    pub action: Option<OrchestratorAction>,
    /// Address for instances, the CLI and the other orchestrators.
    #[arg(long, default_value = "0.0.0.0:7700")]
    pub listen: std::net::SocketAddr,
    /// This node's name (unique in the orchestrator cluster).
    #[arg(long, default_value = "o1")]
    pub name: String,
    /// Where the raft log and the replicated state live [default: /var/lib/tardi/orchestrator/NAME].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The cluster's initial members, NAME=ADDR,... (this node included; ADDR is host:port or
    /// a URL). Used only to initialize an empty data directory.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Start with an empty data directory and wait to be added by `tardi orchestrator join`.
    #[arg(long)]
    pub join: bool,
    /// An instance silent this long is suspected failed.
    #[arg(long, default_value = "100ms", value_parser = crate::parse::parse_duration)]
    pub failure_timeout: std::time::Duration,
    /// Serve Prometheus metrics on http://ADDR/metrics: this node's raft state (leader, term,
    /// log index, members' reachability) and, from the leader, every machine, service, view
    /// and the primaries' and backups' latest reports (tardi_orchestrator_*, tardi_machine_*,
    /// tardi_service_*, tardi_primary_*, tardi_backup_*); and on http://ADDR/ a read-only
    /// status page (cluster, services, views, the last five minutes' plots, view history; its
    /// data at /status.json).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

#[derive(Subcommand, Debug)]
pub enum OrchestratorAction {
    /// Add a running orchestrator node (started with --join) to the cluster: it catches up as a
    /// learner, then becomes a voter.
    Join(JoinArgs),
    /// Remove an orchestrator node from the cluster.
    Leave(LeaveArgs),
}

#[derive(Args, Debug)]
pub struct JoinArgs {
    /// The new node's name (its --name).
    #[arg(long)]
    pub name: String,
    /// The new node's address (host:port or URL), as the other nodes reach it.
    #[arg(long)]
    pub addr: String,
    /// The cluster's orchestrators (comma-separated host:port or URLs).
    #[arg(long, env = "TARDI_ORCHESTRATOR")]
    pub orchestrator: String,
    #[command(flatten)]
    pub tls: TlsArgs,
}

#[derive(Args, Debug)]
pub struct LeaveArgs {
    /// The node to remove.
    #[arg(long)]
    pub name: String,
    /// The cluster's orchestrators (comma-separated host:port or URLs).
    #[arg(long, env = "TARDI_ORCHESTRATOR")]
    pub orchestrator: String,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// Run this machine's instance: primary, backup or spare for each deployed service.
///
/// It keeps a session with the orchestrator (heartbeats out, assignments in) and serves the
/// checkpoint stream on --listen. As primary it runs the service in a sandbox, checkpoints it
/// every epoch, streams the checkpoints to the backups and releases the service's output once
/// they hold them; it answers ARP for the service address on --service-if. As backup it checks,
/// acknowledges and applies checkpoints to an in-memory image, and takes over (restores the
/// service, claims its address) when a view makes it primary.
///
/// Example: tardi instance --machine m1 --listen 10.0.0.2:7701 --orchestrator 10.0.0.1:7700
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct InstanceArgs {
    /// This machine's name in the cluster (unique).
    #[arg(long)]
    pub machine: String,
    /// Address the checkpoint stream is served on (reachable by the other machines).
    #[arg(long)]
    pub listen: std::net::SocketAddr,
    /// The orchestrators (comma-separated host:port or URLs; the session follows the leader).
    #[arg(long, env = "TARDI_ORCHESTRATOR")]
    pub orchestrator: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The interface clients reach services through (the service address is claimed there).
    #[arg(long, default_value = "eth0")]
    pub service_if: String,
    /// Services' private directories on this machine go under DIR/<service>/.
    #[arg(long, default_value = "/var/lib/tardi/instance")]
    pub state_dir: PathBuf,
    /// Run directories of this machine's sandboxes: DIR/<service>/.
    #[arg(long, default_value = "/run/tardi/instance")]
    pub run_dir: PathBuf,
    /// Checkpoints a backup queues (acknowledged, not yet applied) before it stops
    /// acknowledging: longer queues shorten acknowledgements, shorter ones shorten takeovers.
    #[arg(long, default_value_t = 16)]
    pub queue_len: usize,
    /// Limit the checkpoint stream to this rate (e.g. 1Gbit/s, 100Mbit/s) to reproduce slower
    /// links; unlimited by default.
    #[arg(long, value_name = "RATE", value_parser = crate::parse::parse_bandwidth)]
    pub link_bandwidth: Option<u64>,
    /// Time between heartbeats to the orchestrator (keep it well under its failure timeout).
    #[arg(long, default_value = "20ms", value_parser = crate::parse::parse_duration)]
    pub heartbeat: std::time::Duration,
    /// Append one JSON line per epoch of every primary on this machine to FILE (service,
    /// machine, epoch, interval_us, pause_us, encoded_bytes, raw_bytes, dirty_pages, ended_by,
    /// unix_us): the epoch-interval distribution for benchmarks. Buffered, flushed every 100 ms.
    #[arg(long, value_name = "FILE")]
    pub epoch_log: Option<PathBuf>,
    /// Serve Prometheus metrics on http://ADDR/metrics: per service, this machine's role, view,
    /// epochs, checkpoint size, lag, held output, pauses and takeover time (tardi_instance_*).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Testing only: a takeover's restore fails on purpose (once its sandbox is set up, before
    /// the restored process runs) if this instance removes FILE; instances given the same FILE
    /// share one fault, taken by the first takeover. Used by the lab tests.
    #[arg(long, value_name = "FILE", hide = true, env = "TARDI_FAULT_RESTORE")]
    pub fault_restore: Option<PathBuf>,
    /// Testing only: a backup here corrupts its image on purpose (flips a byte of one page)
    /// once, after applying a checkpoint, if this instance removes FILE: the divergence check
    /// must catch it. Used by the lab tests.
    #[arg(
        long,
        value_name = "FILE",
        hide = true,
        env = "TARDI_FAULT_CORRUPT_IMAGE"
    )]
    pub fault_corrupt_image: Option<PathBuf>,
    /// Testing only: a takeover here restores as if its checkpoint carried no TCP connection:
    /// they are reset, said and counted, and their clients probed (the way of a connection
    /// that cannot be carried). Used by the lab tests.
    #[arg(long, hide = true, env = "TARDI_FAULT_DROP_TCP")]
    pub fault_drop_tcp: bool,
}

/// Measure how much a service would cost to replicate: run it in a sandbox and take an
/// incremental checkpoint every epoch (nothing is sent anywhere), optionally while a load runs.
///
/// What it measures, per epoch: its length and the pause of the service, the pages written
/// (dirty), the page-granular size (dirty pages x 4 KiB) and the encoded size (after twin-diff
/// and the codec) that replication would send. Epoch 0 is a full checkpoint, reported in the
/// summary. At the end: percentiles (p50/p90/p99/max) of interval, pause, dirty pages and
/// encoded bytes per epoch, the mean dirty and encoded rates, and a verdict.
///
/// Verdict (Tardigrade section 6.1): the sustained checkpoint rate (encoded bytes / time) must
/// stay within 40% of the replication link (--link-bandwidth); above that the service is a poor
/// candidate. Replication also adds about 1.5 x the mean epoch length to response latency (output
/// is held until its epoch is replicated).
///
/// The service starts first; when the manifest has a `tardi.ports` entry, profiling (and --load)
/// starts once a TCP port accepts connections (a UDP port: 300 ms after the start). The load
/// command runs on this machine with `sh -c`, in its own process group, `{address}` replaced by
/// the sandbox's IPv4 address; it gets SIGTERM at the end. Ctrl-C or SIGTERM ends profiling
/// early (with a summary).
///
/// Output: one line per epoch (a progress line when epochs are faster than 10/s) and a summary;
/// with --json, one JSON object per incremental epoch (the fields of the epoch statistics, plus
/// `time_us` since the full checkpoint) and then one object with "summary": true.
///
/// Exit status: 0 ok, 1 error or failed --verify, 2 bad arguments.
///
/// Example (Redis under redis-benchmark for 20 s, plots in /tmp/prof):
///   tardi profile gramine-manifests/redis.manifest --duration 20s --out /tmp/prof \
///     --load 'redis-benchmark -h {address} -q -n 100000 -t set,get'
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ProfileArgs {
    /// The manifest (Gramine TOML plus a [tardi] table); [tardi.epoch] gives the defaults of
    /// --interval, --cap-pages and --hot-epochs.
    pub manifest: PathBuf,
    /// How long to profile: 500ms, 10s, 2m.
    #[arg(long, default_value = "10s", value_parser = crate::parse::parse_duration)]
    pub duration: std::time::Duration,
    /// A command generating load, run with `sh -c` once the service is up; `{address}` is replaced
    /// by the sandbox's IPv4 address. Its output goes to OUT/load.log (or /dev/null).
    #[arg(long, value_name = "CMD")]
    pub load: Option<String>,
    /// The replication link the verdict assumes: 1Gbit/s, 100Mbit/s, 10Gbit/s, or bits/s.
    #[arg(long, default_value = "1Gbit/s", value_name = "RATE", value_parser = crate::parse::parse_bandwidth)]
    pub link_bandwidth: u64,
    /// Print JSON: one object per epoch, then a summary object ("summary": true).
    #[arg(long)]
    pub json: bool,
    /// Write plots (checkpoint-size, interval-cdf, pause-cdf; PNG and SVG), epochs.json and
    /// summary.json to this directory (created if needed).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Check the checkpoints: hold the service at the last epoch, compare the image built from
    /// the whole chain with its memory, and restore that image into a second sandbox and compare
    /// the two processes byte for byte. Exit status 1 if they differ.
    #[arg(long)]
    pub verify: bool,
    /// Epoch length: 20ms, 5ms [default: tardi.epoch.interval_ms].
    #[arg(long, value_parser = crate::parse::parse_duration)]
    pub interval: Option<std::time::Duration>,
    /// End an epoch early once this many pages are dirty; 0: never [default: tardi.epoch.cap_pages].
    #[arg(long, value_name = "N")]
    pub cap_pages: Option<u64>,
    /// A page written in this many consecutive epochs is hot: the mprotect tracker leaves it
    /// writable (userfaultfd keeps every page protected and ignores this); 0: no hot pages
    /// [default: tardi.epoch.hot_epochs].
    #[arg(long, value_name = "N")]
    pub hot_epochs: Option<u32>,
    /// How pages are encoded: xor-runs (the XOR with the page's last sent contents as its
    /// changed runs; zstd for densely changed pages), xor-zstd, zstd, xdelta3 or raw.
    #[arg(long, default_value = "xor-runs", value_parser = crate::parse::parse_codec)]
    pub codec: tardi_checkpointer::delta::Codec,
    /// Memory for twins (last sent copies of written pages) that deltas are taken against, MiB.
    #[arg(long, default_value_t = 64, value_name = "MB")]
    pub twin_budget: u64,
    /// Threads that encode each epoch's pages (after the service resumed). More than one only
    /// pays with spare cores: see docs/BENCHMARKS.md, "Parallel encode".
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub encode_workers: usize,
    /// How written pages are found: `uffd` (userfaultfd write-protection, Linux >= 6.7) or
    /// `mprotect` (write-protection with mprotect, faults caught by an agent loaded into the
    /// service; for older kernels, and slower). Default: the manifest's
    /// `tardi.epoch.tracker`, else `uffd`.
    #[arg(long, value_name = "KIND")]
    pub tracker: Option<tardi_checkpointer::track::TrackerKind>,
    /// Copy every page in the pause instead of pre-copying the written pages just before it
    /// (the pre-copy shortens the pause; only the userfaultfd tracker does it).
    #[arg(long)]
    pub no_precopy: bool,
    /// Pre-copy only when the epoch before wrote at least N pages (0: every epoch). Below
    /// that, copying in the pause costs less than the pre-copy delays it. Default: the
    /// manifest's `tardi.epoch.precopy_min_pages`, else 256.
    #[arg(long, value_name = "N")]
    pub precopy_min_pages: Option<u64>,
    /// After each pause the encoding yields to the service (nice 10) for up to N intervals,
    /// then finishes at normal priority; a slow encoding lengthens the next epoch (0: the
    /// encoding runs at normal priority). Default: the manifest's `tardi.epoch.encode_budget`,
    /// else 0.
    #[arg(long, value_name = "N")]
    pub encode_budget: Option<u32>,
}
