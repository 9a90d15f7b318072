//! The daemons of the lab: one orchestrator per `o*` node, one instance per `m*` node. Their
//! command lines come from [`daemon_command`] alone; each runs detached (new session, stdin from
//! `/dev/null`, stdout and stderr to `/run/tardi-lab/logs/<node>.log`) inside its node's
//! namespace and cgroup, and counts as started once its port accepts connections.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cmd::describe_status;
use crate::error::{IoContext, LabError, Result};
use crate::exec::{Session, node_command};
use crate::layout::{self, Layout, Node, Role};
use crate::netns;

/// The environment variable that replaces the real daemons by a command template in
/// `tardi lab up` (see [`Daemons::Template`]).
pub const DAEMON_CMD_ENV: &str = "TARDI_LAB_DAEMON_CMD";

/// Where every lab daemon serves its Prometheus metrics (`http://NODE_ADDRESS:9100/metrics`).
pub const METRICS_PORT: u16 = 9100;

/// Which daemons the lab starts in its orchestrator and machine nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Daemons {
    /// The real ones: `<exe> orchestrator …` and `<exe> instance …` (see [`daemon_command`]).
    Tardi(PathBuf),
    /// The real ones with extra arguments for each (e.g. a test's longer failure timeout).
    TardiWith {
        exe: PathBuf,
        orchestrator: Vec<String>,
        instance: Vec<String>,
    },
    /// A stand-in for both roles, as words (no shell), in which `{node}`, `{role}`, `{addr}`,
    /// `{port}`, `{listen}` (`addr:port`), `{orchestrator}` (the orchestrators' URLs),
    /// `{state_dir}` and `{run_dir}` are replaced; e.g.
    /// `python3 -m http.server --bind {addr} {port}`. It must listen on `{listen}`.
    Template(Vec<String>),
    /// No daemons: the network only.
    None,
}

impl Daemons {
    /// A template from a string, split at whitespace.
    pub fn template(words: &str) -> Daemons {
        Daemons::Template(words.split_whitespace().map(String::from).collect())
    }
}

/// The command line of `node`'s daemon, or `None` when it runs none (the client, or
/// [`Daemons::None`]).
/// With `tls`, the real daemons get the node's identity (`--tls-dir`); without, they are told
/// `--insecure-plaintext`.
pub fn daemon_command(
    daemons: &Daemons,
    node: &Node,
    layout: &Layout,
    tls: bool,
) -> Option<Vec<String>> {
    let api = node.api()?;
    match daemons {
        Daemons::None => None,
        Daemons::Tardi(exe) => Some(tardi_command(exe, node, api, layout, tls)),
        Daemons::TardiWith {
            exe,
            orchestrator,
            instance,
        } => {
            let mut argv = tardi_command(exe, node, api, layout, tls);
            argv.extend(match node.role {
                Role::Orchestrator => orchestrator.iter().cloned(),
                _ => instance.iter().cloned(),
            });
            Some(argv)
        }
        Daemons::Template(words) if words.is_empty() => None,
        Daemons::Template(words) => {
            Some(words.iter().map(|w| expand(w, node, api, layout)).collect())
        }
    }
}

/// The real daemons' command lines.
fn tardi_command(
    exe: &Path,
    node: &Node,
    api: SocketAddrV4,
    layout: &Layout,
    tls: bool,
) -> Vec<String> {
    let exe = exe.to_string_lossy().into_owned();
    let security = if tls {
        vec![
            "--tls-dir".to_string(),
            node.tls_dir().to_string_lossy().into_owned(),
        ]
    } else {
        vec!["--insecure-plaintext".to_string()]
    };
    let mut argv = match node.role {
        Role::Orchestrator => vec![
            exe,
            "orchestrator".into(),
            "--listen".into(),
            api.to_string(),
            "--name".into(),
            node.name.clone(),
            // Under the lab's state directory, removed with the lab: every lab starts a new
            // orchestrator cluster, and a restarted node rejoins from its data.
            "--data-dir".into(),
            node.state_dir()
                .join("orchestrator")
                .to_string_lossy()
                .into_owned(),
            "--peers".into(),
            layout
                .orchestrators()
                .filter_map(|o| Some(format!("{}={}", o.name, o.api()?)))
                .collect::<Vec<_>>()
                .join(","),
            "--metrics".into(),
            SocketAddrV4::new(*api.ip(), METRICS_PORT).to_string(),
        ],
        Role::Machine | Role::Client => vec![
            exe,
            "instance".into(),
            "--machine".into(),
            node.name.clone(),
            "--listen".into(),
            api.to_string(),
            "--orchestrator".into(),
            layout.orchestrator_url(),
            "--service-if".into(),
            layout::NODE_IF.into(),
            "--state-dir".into(),
            node.state_dir().to_string_lossy().into_owned(),
            "--run-dir".into(),
            node.run_dir().to_string_lossy().into_owned(),
            "--metrics".into(),
            SocketAddrV4::new(*api.ip(), METRICS_PORT).to_string(),
        ],
    };
    argv.extend(security);
    argv
}

fn expand(word: &str, node: &Node, api: SocketAddrV4, layout: &Layout) -> String {
    word.replace("{node}", &node.name)
        .replace("{role}", node.role.as_str())
        .replace("{addr}", &node.address.to_string())
        .replace("{port}", &api.port().to_string())
        .replace("{listen}", &api.to_string())
        .replace("{orchestrator}", &layout.orchestrator_url())
        .replace("{state_dir}", &node.state_dir().to_string_lossy())
        .replace("{run_dir}", &node.run_dir().to_string_lossy())
}

/// Starts `argv` as `node`'s daemon, detached, in its namespace and `cgroup`.
pub(crate) fn start(
    node: &Node,
    argv: &[String],
    cgroup: Option<&Path>,
    env: &[(&str, String)],
) -> Result<Child> {
    let Some((program, args)) = argv.split_first() else {
        return Err(LabError::NodeState {
            node: node.name.clone(),
            reason: "empty daemon command".into(),
        });
    };
    let log_path = node.log_path();
    let log_dir = layout::log_dir();
    std::fs::create_dir_all(&log_dir).ctx(|| format!("creating {}", log_dir.display()))?;
    if node.role == Role::Machine {
        for d in [node.state_dir(), node.run_dir()] {
            std::fs::create_dir_all(&d).ctx(|| format!("creating {}", d.display()))?;
        }
    }
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .ctx(|| format!("opening {}", log_path.display()))?;
    writeln!(
        log,
        "== tardi lab: starting {}: {}",
        node.name,
        argv.join(" ")
    )
    .ctx(|| format!("writing {}", log_path.display()))?;
    let err_log = log
        .try_clone()
        .ctx(|| format!("duplicating {}", log_path.display()))?;
    let mut cmd = node_command(&node.namespace(), cgroup, env, program, args, Session::New)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err_log));
    cmd.spawn()
        .ctx(|| format!("node {}: starting `{}`", node.name, argv.join(" ")))
}

/// Waits until `node`'s daemon accepts TCP connections on `api` (connecting from inside the
/// node's namespace), failing early if `child` exits and after `timeout` otherwise; both errors
/// carry the tail of the daemon's log.
pub(crate) fn wait_ready(
    node: &Node,
    child: &mut Child,
    api: SocketAddrV4,
    timeout: Duration,
) -> Result<()> {
    let addr = SocketAddr::V4(api);
    let deadline = Instant::now() + timeout;
    netns::in_namespace(&node.namespace(), || {
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(LabError::DaemonExited {
                    node: node.name.clone(),
                    addr: api.to_string(),
                    status: describe_status(status),
                    log: node.log_path(),
                    log_tail: log_tail(&node.log_path(), 20),
                });
            }
            if Instant::now() >= deadline {
                return Err(LabError::NotReady {
                    node: node.name.clone(),
                    addr: api.to_string(),
                    timeout,
                    log: node.log_path(),
                    log_tail: log_tail(&node.log_path(), 20),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    })?
}

/// The last `lines` lines of the file at `path` (at most its last 8 KiB); empty if unreadable.
pub fn log_tail(path: &Path, lines: usize) -> String {
    const MAX: u64 = 8192;
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if f.seek(SeekFrom::Start(len.saturating_sub(MAX))).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_daemon_command_lines() {
        let l = Layout::new(2, 2).unwrap();
        let d = Daemons::Tardi("/usr/bin/tardi".into());
        assert_eq!(
            daemon_command(&d, l.node("o2").unwrap(), &l, true)
                .unwrap()
                .join(" "),
            "/usr/bin/tardi orchestrator --listen 10.77.0.12:7700 --name o2 \
             --data-dir /var/lib/tardi-lab/o2/orchestrator \
             --peers o1=10.77.0.11:7700,o2=10.77.0.12:7700 --metrics 10.77.0.12:9100 \
             --tls-dir /var/lib/tardi-lab/tls/o2"
        );
        assert_eq!(
            daemon_command(&d, l.node("m2").unwrap(), &l, true)
                .unwrap()
                .join(" "),
            "/usr/bin/tardi instance --machine m2 --listen 10.77.0.22:7701 \
             --orchestrator http://10.77.0.11:7700,http://10.77.0.12:7700 --service-if eth0 \
             --state-dir /var/lib/tardi-lab/m2 --run-dir /run/tardi-lab/m2/run \
             --metrics 10.77.0.22:9100 --tls-dir /var/lib/tardi-lab/tls/m2"
        );
        assert!(
            daemon_command(&d, l.node("m2").unwrap(), &l, false)
                .unwrap()
                .ends_with(&["--insecure-plaintext".to_string()])
        );
        assert_eq!(
            daemon_command(&d, l.node("client").unwrap(), &l, true),
            None
        );
        assert_eq!(
            daemon_command(&Daemons::None, l.node("m1").unwrap(), &l, true),
            None
        );
    }

    #[test]
    fn templates_are_expanded_per_node() {
        let l = Layout::new(1, 2).unwrap();
        let d = Daemons::template(
            "serve --bind {addr} {port} -n {node}/{role} {listen} {orchestrator}",
        );
        assert_eq!(
            daemon_command(&d, l.node("m1").unwrap(), &l, true)
                .unwrap()
                .join(" "),
            "serve --bind 10.77.0.21 7701 -n m1/machine 10.77.0.21:7701 \
             http://10.77.0.11:7700,http://10.77.0.12:7700"
        );
        assert_eq!(
            daemon_command(&d, l.node("o2").unwrap(), &l, true).unwrap()[2..4],
            ["10.77.0.12", "7700"]
        );
        assert_eq!(
            daemon_command(&Daemons::template("  "), l.node("m1").unwrap(), &l, true),
            None
        );
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let p = std::env::temp_dir().join(format!("tardi-lab-tail-{}", std::process::id()));
        let text: String = (1..=50).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&p, text).unwrap();
        assert_eq!(log_tail(&p, 2), "line 49\nline 50");
        std::fs::remove_file(&p).unwrap();
        assert_eq!(log_tail(&p, 2), "");
    }
}
