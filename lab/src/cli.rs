//! `tardi lab …`: the command-line face of the lab. The CLI parses [`LabCommand`] and calls
//! [`run`], which does the work and the printing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::daemon::{DAEMON_CMD_ENV, Daemons};
use crate::lab::{Lab, LabOptions, Summary};
use crate::layout::{self, MAX_MACHINES, MAX_ORCHESTRATORS, SERVICE_PREFIX, SERVICE_SUBNET};

/// How long a `tardi lab` command waits for another user of the lab (a test, another command).
const CLI_LOCK_WAIT: Duration = Duration::from_secs(10);

/// Short help for `tardi lab`, for the CLI's subcommand (`#[command(about = ABOUT)]`).
pub const ABOUT: &str =
    "Run several machines on this host, made of network namespaces (demos and tests)";

/// Long help for `tardi lab`, for the CLI's subcommand (`#[command(long_about = LONG_ABOUT)]`).
pub const LONG_ABOUT: &str = "\
Run several \"machines\" on this host, made of network namespaces, to try Tardi or to test it.

`tardi lab up` creates one network namespace per node, all on one bridge (in namespace tlab-sw), \
on the lab subnet 10.77.0.0/24, and starts the daemons:
  o1, o2, ...   orchestrator nodes (10.77.0.11, .12, ...; port 7700)
  m1, m2, ...   machines, each running a Tardi instance (10.77.0.21, .22, ...; port 7701)
  client        where you run clients (10.77.0.100)
Services run in sandboxes inside the machines, with addresses from 10.213.0.0/16; the machine \
running a service's primary answers for its address on the bridge, so the client reaches it \
directly and follows it at failover.

The lab only uses addresses inside its own namespaces; the host's network is left alone. \
Processes of a node run in the cgroup tardi-lab/<node>, so `kill` stops all of them at once. \
State, logs and run directories are in /run/tardi-lab, the machines' state in \
/var/lib/tardi-lab. One lab per host; needs root and iproute2.";

/// Arguments of `tardi lab` (if the CLI prefers a struct to an enum).
#[derive(Debug, Args)]
pub struct LabArgs {
    #[command(subcommand)]
    pub command: LabCommand,
}

/// The `tardi lab` subcommands.
#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Create the lab: nodes, bridge and links, then start an orchestrator per `o` node and an
    /// instance per machine.
    ///
    /// Waits until every daemon accepts connections, then prints the nodes and their
    /// addresses. Fails if a lab is already up (`tardi lab down` removes it). Daemon logs go to
    /// /run/tardi-lab/logs/<node>.log.
    ///
    /// Environment: TARDI_LAB_DAEMON_CMD replaces the daemons by a stand-in command (words, no
    /// shell) in which {node}, {role}, {addr}, {port}, {listen}, {orchestrator}, {state_dir}
    /// and {run_dir} are replaced, e.g. `python3 -m http.server --bind {addr} {port}`.
    Up(UpArgs),

    /// Remove the lab: kill every process of every node, delete the namespaces, cgroups, state
    /// and logs.
    ///
    /// Works from whatever is left, also after a crash or without a state file.
    Down,

    /// Show the nodes, their addresses and whether they run.
    Status(StatusArgs),

    /// Run a command inside a node, e.g. `tardi lab exec client -- redis-cli -h 10.213.0.6`.
    ///
    /// The command runs in the node's network namespace (and cgroup: `kill` stops it too),
    /// with TARDI_ORCHESTRATOR set to the orchestrators' URLs and TARDI_TLS_DIR to the node's
    /// TLS identity (so `tardi status` works unchanged); stdin, stdout and stderr are yours,
    /// and `tardi lab exec` exits with the command's status.
    Exec(ExecArgs),

    /// Power cut: SIGKILL every process of a node at once (its sandboxes too), delete the links
    /// they made (the sandboxes' veth pairs, as a reboot would) and take its link down, so it
    /// answers nothing, not even ARP.
    ///
    /// `tardi lab start NODE` brings it back.
    Kill(NodeArg),

    /// Power a killed node back on: link up, daemon restarted (waited for).
    Start(NodeArg),

    /// Cut every link of a node (its port on the switch goes down); its processes keep running.
    ///
    /// `tardi lab heal NODE` restores the links.
    Partition(NodeArg),

    /// Restore the links `tardi lab partition` cut.
    Heal(NodeArg),

    /// Print the log (stdout and stderr) of a node's daemon.
    Logs(LogsArgs),
}

/// Arguments of `tardi lab up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Machines m1..mN, each running an instance.
    #[arg(long, short = 'm', default_value_t = 3, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=MAX_MACHINES as i64))]
    pub machines: u16,

    /// Orchestrator nodes o1..oN.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=MAX_ORCHESTRATORS as i64))]
    pub orchestrators: u16,

    /// Print the nodes as JSON on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,

    /// Build the network only; start no daemons.
    #[arg(long)]
    pub no_daemons: bool,

    /// Seconds each daemon may take to accept connections.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub timeout: u64,

    /// Run without TLS: the daemons and `tardi lab exec` get --insecure-plaintext. By default
    /// the lab makes a CA and an identity per node (/var/lib/tardi-lab/tls/NODE) and every
    /// connection between nodes is mutual TLS.
    #[arg(long)]
    pub insecure_plaintext: bool,
}

/// Arguments of `tardi lab status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the nodes as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `tardi lab exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The node: o1.., m1.., or client.
    #[arg(value_name = "NODE")]
    pub node: String,

    /// The command and its arguments (after `--`).
    #[arg(
        value_name = "CMD",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<String>,
}

/// A node argument.
#[derive(Debug, Args)]
pub struct NodeArg {
    /// The node: o1.., m1.., or client.
    #[arg(value_name = "NODE")]
    pub node: String,
}

/// Arguments of `tardi lab logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The node: o1.. or m1...
    #[arg(value_name = "NODE")]
    pub node: String,

    /// Only the last N lines.
    #[arg(long, short = 'n', value_name = "N")]
    pub lines: Option<usize>,
}

/// Runs a `tardi lab` command, printing its results. `tardi_exe` is the `tardi` binary the
/// daemons are started from. `exec` ends the process with the command's exit status when it is
/// not 0.
pub fn run(cmd: LabCommand, tardi_exe: &Path) -> anyhow::Result<()> {
    match cmd {
        LabCommand::Up(a) => up(a, tardi_exe),
        LabCommand::Down => down(),
        LabCommand::Status(a) => status(a),
        LabCommand::Exec(a) => exec(a),
        LabCommand::Kill(a) => {
            let mut lab = open_locked()?;
            lab.kill(&a.node)?;
            println!(
                "{}: killed (power cut); `tardi lab start {}` brings it back",
                a.node, a.node
            );
            Ok(())
        }
        LabCommand::Start(a) => {
            let mut lab = open_locked()?;
            lab.set_progress(true);
            lab.start(&a.node)?;
            println!("{}: running", a.node);
            Ok(())
        }
        LabCommand::Partition(a) => {
            let mut lab = open_locked()?;
            lab.partition(&a.node)?;
            println!(
                "{}: partitioned (no links); `tardi lab heal {}` restores them",
                a.node, a.node
            );
            Ok(())
        }
        LabCommand::Heal(a) => {
            let mut lab = open_locked()?;
            lab.heal(&a.node)?;
            println!("{}: links restored", a.node);
            Ok(())
        }
        LabCommand::Logs(a) => logs(a),
    }
}

fn open_locked() -> anyhow::Result<Lab> {
    Ok(Lab::open(Some(CLI_LOCK_WAIT))?)
}

fn up(a: UpArgs, tardi_exe: &Path) -> anyhow::Result<()> {
    let daemons = if a.no_daemons {
        Daemons::None
    } else {
        match std::env::var(DAEMON_CMD_ENV) {
            Ok(t) if !t.trim().is_empty() => Daemons::template(&t),
            _ => Daemons::Tardi(tardi_exe.to_path_buf()),
        }
    };
    let mut opts = LabOptions::new(usize::from(a.machines))
        .orchestrators(usize::from(a.orchestrators))
        .daemons(daemons);
    opts.ready_timeout = Duration::from_secs(a.timeout);
    opts.tls = !a.insecure_plaintext;
    opts.lock_wait = CLI_LOCK_WAIT;
    opts.progress = true;
    let lab = Lab::up(opts).context("tardi lab up")?;
    let summary = lab.summary();
    lab.detach()?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", describe_up(&summary));
    }
    Ok(())
}

/// The readable output of `up`.
fn describe_up(s: &Summary) -> String {
    let mut rows = vec![[
        "NODE".to_string(),
        "ROLE".into(),
        "NAMESPACE".into(),
        "ADDRESS".into(),
        "API".into(),
    ]];
    for n in &s.nodes {
        rows.push([
            n.name.clone(),
            n.role.as_str().into(),
            n.namespace.clone(),
            n.address.to_string(),
            n.api.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    let machine = s
        .nodes
        .iter()
        .find(|n| n.role == layout::Role::Machine)
        .map_or("m1", |n| n.name.as_str());
    let mut out = format!(
        "The lab is up on {} (bridge {} in namespace {}).\n\n",
        s.subnet,
        layout::BRIDGE,
        layout::SWITCH_NS
    );
    out.push_str(&table(&rows));
    out.push_str(&format!(
        "\nIn every node TARDI_ORCHESTRATOR={} and TARDI_TLS_DIR (the node's identity under {}); daemon logs are in {}.\n\
         Services get addresses from {SERVICE_SUBNET}/{SERVICE_PREFIX}, reachable from the client.\n\n\
         Next steps:\n",
        s.orchestrator,
        layout::tls_dir().display(),
        layout::log_dir().display(),
    ));
    let steps = [
        (
            "tardi lab exec client -- redis-cli -h <service address>".to_string(),
            "run a client".to_string(),
        ),
        (
            format!("tardi lab exec {machine} -- ip addr"),
            "look inside a machine".into(),
        ),
        (
            format!("tardi lab kill {machine}"),
            format!("power cut (tardi lab start {machine} powers it on)"),
        ),
        (
            format!("tardi lab partition {machine}"),
            format!("cut its links (tardi lab heal {machine} restores them)"),
        ),
        ("tardi lab status".into(), "what runs".into()),
        ("tardi lab down".into(), "remove everything".into()),
    ];
    let width = steps.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    for (cmd, what) in steps {
        out.push_str(&format!("  {cmd:<width$}   {what}\n"));
    }
    out
}

/// Columns padded to their widest cell.
fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn down() -> anyhow::Result<()> {
    let report = Lab::down_all(CLI_LOCK_WAIT, true)?;
    if report.is_empty() {
        println!("No lab to remove.");
    } else {
        println!(
            "The lab is down: removed {} namespaces{}{}.",
            report.namespaces.len(),
            report
                .cgroup
                .as_ref()
                .map(|c| format!(", cgroup {}", c.display()))
                .unwrap_or_default(),
            if report.dirs.is_empty() {
                String::new()
            } else {
                format!(
                    ", {}",
                    report
                        .dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
    }
    Ok(())
}

fn status(a: StatusArgs) -> anyhow::Result<()> {
    let lab = Lab::open(None)?;
    let st = lab.status();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    let mut rows = vec![[
        "NODE".to_string(),
        "ROLE".into(),
        "ADDRESS".into(),
        "API".into(),
        "STATE".into(),
        "LINKS".into(),
        "PID".into(),
    ]];
    for s in &st {
        rows.push([
            s.node.name.clone(),
            s.node.role.as_str().into(),
            s.node.address.to_string(),
            s.node.api.clone().unwrap_or_else(|| "-".into()),
            s.state.clone(),
            if s.node.partitioned {
                "cut".into()
            } else {
                "ok".into()
            },
            s.node
                .pid
                .map_or_else(|| "-".to_string(), |p| p.to_string()),
        ]);
    }
    print!("{}", table(&rows));
    println!("TARDI_ORCHESTRATOR={}", lab.orchestrator_url());
    if lab.state().tls {
        println!(
            "TARDI_TLS_DIR={}/NODE (mutual TLS; the client's identity is {}/client)",
            crate::layout::tls_dir().display(),
            crate::layout::tls_dir().display()
        );
    } else {
        println!("TARDI_INSECURE_PLAINTEXT=1 (no TLS)");
    }
    if matches!(
        lab.state().daemons,
        Daemons::Tardi(_) | Daemons::TardiWith { .. }
    ) {
        println!(
            "Prometheus metrics: http://ADDRESS:{}/metrics on every orchestrator and machine",
            crate::daemon::METRICS_PORT
        );
    }
    Ok(())
}

fn exec(a: ExecArgs) -> anyhow::Result<()> {
    let lab = Lab::open(None)?;
    let Some((program, args)) = a.command.split_first() else {
        anyhow::bail!("no command given (tardi lab exec NODE -- CMD...)");
    };
    if lab
        .state()
        .nodes
        .iter()
        .any(|n| n.name == a.node && !n.alive)
    {
        eprintln!(
            "tardi lab: note: {} is dead (killed); its link is down",
            a.node
        );
    }
    let mut cmd = lab.command(&a.node, program)?;
    cmd.args(args);
    // The lab's lock is not held while the command runs (it may be interactive).
    drop(lab);
    let status = cmd
        .status()
        .with_context(|| format!("running `{}` in {}", a.command.join(" "), a.node))?;
    let code = {
        use std::os::unix::process::ExitStatusExt;
        status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1)
    };
    if code != 0 {
        let _ = std::io::stdout().flush();
        std::process::exit(code);
    }
    Ok(())
}

fn logs(a: LogsArgs) -> anyhow::Result<()> {
    let lab = Lab::open(None)?;
    let node = lab.node(&a.node)?;
    let path: PathBuf = node.log_path();
    let text = match a.lines {
        Some(n) => crate::daemon::log_tail(&path, n),
        None => {
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?
        }
    };
    print!("{text}");
    if !text.is_empty() && !text.ends_with('\n') {
        println!();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        lab: LabCommand,
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_the_commands() {
        let c = Cli::try_parse_from([
            "lab",
            "up",
            "--machines",
            "5",
            "--orchestrators",
            "3",
            "--json",
        ])
        .unwrap();
        let LabCommand::Up(u) = c.lab else {
            panic!("{c:?}")
        };
        assert_eq!((u.machines, u.orchestrators, u.json), (5, 3, true));
        let c = Cli::try_parse_from(["lab", "up"]).unwrap();
        let LabCommand::Up(u) = c.lab else {
            panic!("{c:?}")
        };
        assert_eq!((u.machines, u.orchestrators, u.json), (3, 1, false));
        assert!(Cli::try_parse_from(["lab", "up", "--machines", "0"]).is_err());
        assert!(Cli::try_parse_from(["lab", "up", "--machines", "80"]).is_err());
        assert!(Cli::try_parse_from(["lab", "up", "--orchestrators", "10"]).is_err());

        let c = Cli::try_parse_from(["lab", "exec", "client", "--", "ip", "-4", "addr"]).unwrap();
        let LabCommand::Exec(e) = c.lab else {
            panic!("{c:?}")
        };
        assert_eq!(e.node, "client");
        assert_eq!(e.command, ["ip", "-4", "addr"]);
        let c = Cli::try_parse_from(["lab", "exec", "m1", "sh", "-c", "echo hi"]).unwrap();
        let LabCommand::Exec(e) = c.lab else {
            panic!("{c:?}")
        };
        assert_eq!(e.command, ["sh", "-c", "echo hi"]);
        assert!(Cli::try_parse_from(["lab", "exec", "m1"]).is_err());
        assert!(Cli::try_parse_from(["lab", "kill"]).is_err());
        assert!(matches!(
            Cli::try_parse_from(["lab", "partition", "m2"]).unwrap().lab,
            LabCommand::Partition(NodeArg { node }) if node == "m2"
        ));
    }

    #[test]
    fn up_output_names_nodes_and_next_steps() {
        let lab_layout = crate::layout::Layout::new(2, 1).unwrap();
        let summary = Summary {
            nodes: lab_layout
                .nodes()
                .iter()
                .map(|n| crate::lab::NodeSummary {
                    name: n.name.clone(),
                    role: n.role,
                    namespace: n.namespace(),
                    address: n.address,
                    api: n.api().map(|a| a.to_string()),
                })
                .collect(),
            orchestrator: lab_layout.orchestrator_url(),
            orchestrators: lab_layout.orchestrator_urls(),
            subnet: "10.77.0.0/24".into(),
            service_subnet: "10.213.0.0/16".into(),
        };
        let text = describe_up(&summary);
        assert!(
            text.contains("m2      machine       tlab-m2      10.77.0.22   10.77.0.22:7701"),
            "{text}"
        );
        assert!(
            text.contains("client  client        tlab-client  10.77.0.100  -"),
            "{text}"
        );
        assert!(text.contains("tardi lab down"), "{text}");
        assert!(
            text.contains("TARDI_ORCHESTRATOR=http://10.77.0.11:7700"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["orchestrator"], "http://10.77.0.11:7700");
        assert_eq!(json["nodes"][1]["name"], "m1");
        assert_eq!(json["nodes"][1]["role"], "machine");
        assert_eq!(json["nodes"][1]["namespace"], "tlab-m1");
        assert_eq!(json["nodes"][1]["address"], "10.77.0.21");
        assert_eq!(json["nodes"][1]["api"], "10.77.0.21:7701");
        assert!(json["nodes"][3].get("api").is_none());
    }
}
