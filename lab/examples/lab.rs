//! `tardi lab …` without the `tardi` binary, for trying the lab by hand:
//! `cargo run -p tardi-lab --example lab -- up --no-daemons`. The daemons are started from
//! `$TARDI_EXE` (default `tardi` on `PATH`) unless `TARDI_LAB_DAEMON_CMD` is set.

use clap::Parser;

/// The local lab.
#[derive(Debug, Parser)]
#[command(about = tardi_lab::ABOUT, long_about = tardi_lab::LONG_ABOUT)]
struct Cli {
    #[command(subcommand)]
    command: tardi_lab::LabCommand,
}

fn main() {
    let cli = Cli::parse();
    let exe = std::env::var_os("TARDI_EXE").unwrap_or_else(|| "tardi".into());
    if let Err(e) = tardi_lab::run(cli.command, std::path::Path::new(&exe)) {
        eprintln!("tardi lab: error: {e:#}");
        std::process::exit(1);
    }
}
