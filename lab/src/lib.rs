//! `tardi-lab`: the local lab. Turns one host into several "machines" made of network
//! namespaces, for demos (`tardi lab …`) and for multi-machine integration tests ([`Lab`]).
//!
//! # What it owns
//! * Network namespaces named `tlab-*`: one per node (`tlab-o1`…, `tlab-m1`…, `tlab-client`)
//!   and the switch `tlab-sw` holding the bridge `br0`, with one veth pair per node (`eth0` in
//!   the node, `v-<node>` on the bridge). Addresses: see [`layout`] (lab subnet
//!   [`layout::SUBNET`] `10.77.0.0/24`, services in [`layout::SERVICE_SUBNET`]
//!   `10.213.0.0/16`).
//! * The cgroup `<cgroup2 mount>/tardi-lab/<node>` of every process started in a node, so that a
//!   power cut ([`Lab::kill`]) stops a node's processes, sandboxes included, at once.
//! * `/run/tardi-lab` (state file `lab.json`, `logs/<node>.log`, daemons' run directories),
//!   `/var/lib/tardi-lab` (machines' state directories) and the lock `/run/tardi-lab.lock`.
//!
//! # What it must not touch
//! The host's own network namespace (no interface, address, route or firewall rule is created
//! there), any namespace or cgroup not named as above, and any address outside the lab's
//! namespaces. `down` removes exactly what is listed above, from whatever it finds.
//!
//! # Using it in tests
//! ```no_run
//! use tardi_lab::{Daemons, Lab, LabOptions};
//! let mut lab = Lab::up(LabOptions::new(3).daemons(Daemons::template(
//!     "python3 -m http.server --bind {addr} {port}",
//! )))?;
//! let api = lab.api("m1")?;
//! lab.in_node("client", || std::net::TcpStream::connect(api))??;
//! lab.kill("m1")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//! One lab exists per host; a [`Lab`] holds the lab's lock for its whole life, so tests queue
//! for it (across processes too), and dropping it removes the lab.

mod cgroup;
mod cli;
mod cmd;
mod daemon;
mod error;
mod exec;
mod lab;
pub mod layout;
mod lock;
mod netns;
mod network;
mod procs;
mod state;

pub use cgroup::{cgroup2_mount, lab_cgroup};
pub use cli::{
    ABOUT, ExecArgs, LONG_ABOUT, LabArgs, LabCommand, LogsArgs, NodeArg, StatusArgs, UpArgs, run,
};
pub use daemon::{DAEMON_CMD_ENV, Daemons, METRICS_PORT, daemon_command, log_tail};
pub use error::{LabError, Result};
pub use exec::{ORCHESTRATOR_ENV, PLAINTEXT_ENV, TLS_DIR_ENV};
pub use lab::{DownReport, Lab, LabOptions, NodeStatus, NodeSummary, Summary};
pub use layout::{Layout, Node, Role};
pub use lock::LabLock;
pub use netns::{in_namespace, lab_namespaces};
pub use network::sysctl;
pub use state::{LabState, NodeState, Owner};
