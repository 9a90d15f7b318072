//! `tardi`: the command-line entry point. Parses arguments and dispatches; the work lives in the
//! library crates (`tardi-service` for a service's lifecycle, `tardi-checkpointer`,
//! `tardi-sandbox`, `tardi-manifest`).

mod cli;
mod cluster;
mod control;
mod output;
mod parse;
mod plot_font;
mod profile;
mod restore_cmd;
mod run;
mod signals;
mod snapshot;
mod status;
mod supervise;

use clap::Parser;

fn main() {
    // The sandbox's init re-executes this binary; it must not go through clap or tracing.
    tardi_service::run_sandbox_init_if_asked();
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
        cli::Command::Deploy(a) => cluster::deploy(a),
        cli::Command::Undeploy(a) => cluster::undeploy(a),
        cli::Command::Restart(a) => cluster::restart(a),
        cli::Command::Orchestrator(a) => cluster::orchestrator(a),
        cli::Command::Instance(a) => cluster::instance(a),
        cli::Command::Lab(a) => std::env::current_exe()
            .map_err(anyhow::Error::from)
            .and_then(|exe| tardi_lab::run(a.command, &exe)),
        cli::Command::Profile(a) => profile::profile(a),
        cli::Command::Certs(a) => cluster::certs(a),
    };
    if let Err(e) = result {
        eprintln!("tardi: error: {}", output::describe(&e));
        std::process::exit(1);
    }
}
