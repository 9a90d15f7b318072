//! `tardi`: the command-line entry point. Parses arguments and dispatches; the work lives in the
//! library crates (`tardi-checkpointer`, `tardi-sandbox`, `tardi-manifest`).

mod cli;
mod control;
mod profile;
mod restore_cmd;
mod run;
mod snapshot;
mod status;
mod supervise;

use clap::Parser;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // The sandbox's init re-executes this binary; it must not go through clap or tracing.
    if args.get(1).map(String::as_str) == Some(tardi_sandbox::INIT_SUBCOMMAND) {
        let fd = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(-1);
        tardi_sandbox::init_main(fd, restore_hook);
    }
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TARDI_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(if cli.verbose { "debug" } else { "warn" })
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        cli::Command::Run(a) => run::run(a),
        cli::Command::Snapshot(a) => snapshot::snapshot(a),
        cli::Command::Restore(a) => restore_cmd::restore(a),
        cli::Command::Status(a) => status::status(a),
        cli::Command::Deploy(_) => not_yet("deploy", "replication (instance + orchestrator)"),
        cli::Command::Orchestrator(_) => not_yet("orchestrator", "the orchestrator cluster"),
        cli::Command::Instance(_) => not_yet("instance", "replication (instance)"),
        cli::Command::Profile(a) => profile::profile(a),
    };
    if let Err(e) = result {
        eprintln!("tardi: error: {}", describe(&e));
        std::process::exit(1);
    }
}

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

fn not_yet(cmd: &str, with: &str) -> anyhow::Result<()> {
    eprintln!(
        "tardi {cmd}: not implemented yet; it arrives with {with}. See `tardi {cmd} --help`."
    );
    std::process::exit(2);
}

/// Runs in the restore child inside a new sandbox: becomes the checkpointed process.
fn restore_hook(_pid: i32, payload: &[u8], _fds: &[std::os::fd::RawFd]) -> ! {
    tardi_checkpointer::restore::child_main(payload)
}
