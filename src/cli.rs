//! Command-line definitions. Help texts are the user's manual: keep them accurate.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Tardi turns an unmodified Linux binary into a fault-tolerant service: it runs the binary in a
/// sandbox (its own PID, mount, network, UTS and IPC namespaces), checkpoints the running process
/// and restores it elsewhere with the same PIDs, memory, threads and file descriptors.
///
/// Start here:
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
    Orchestrator(LaterArgs),
    Instance(LaterArgs),
    Profile(ProfileArgs),
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
    /// {"event":"started","name":..,"address":..,"pid":..,"log":..,"control":..}.
    #[arg(long)]
    pub json: bool,
}

/// Write a full checkpoint of a running sandbox to a file; the service keeps running.
///
/// The service is paused only while its state is captured (the pause is printed). The file is
/// versioned and checksummed; it is written atomically (no partial file on failure).
///
/// Example: tardi snapshot redis -o /tmp/redis.tardi
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct SnapshotArgs {
    /// Name of the running sandbox (`tardi.name` of its manifest).
    pub name: String,
    /// Where to write the checkpoint.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Start a sandbox from a checkpoint file, in the foreground.
///
/// The process comes back with the same PID and TIDs, memory, registers, signal handlers and file
/// descriptors, in a fresh sandbox of the same name (which must not be running). Connected TCP
/// sockets come back as connections reset by the peer; calls like epoll_wait may return EINTR once.
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

/// List the sandboxes running on this machine.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// One JSON object per sandbox.
    #[arg(long)]
    pub json: bool,
}

/// Deploy a replicated service (primary + backups). NOT IMPLEMENTED YET: arrives with replication.
#[derive(Args, Debug)]
pub struct DeployArgs {
    pub manifest: Option<PathBuf>,
}

/// Profile a service's checkpoint sizes. NOT IMPLEMENTED YET: arrives with incremental checkpoints.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    pub manifest: Option<PathBuf>,
}

/// NOT IMPLEMENTED YET: arrives with replication and the orchestrator cluster.
#[derive(Args, Debug)]
pub struct LaterArgs {}
