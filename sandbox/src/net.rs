//! The sandbox's network: one veth pair per sandbox, a /30 carved from a /16.
//!
//! # Address scheme
//! Link index `i` (1 ..= [`MAX_INDEX`]) owns the /30 starting at offset `4·i` in the /16
//! `a.b.0.0`: network `a.b.(4i / 256).(4i % 256)`, host side `+1`, sandbox side `+2`,
//! broadcast `+3`. Index 0 is never used (it would hold the /16's network address). The index
//! also names the pair: `td<i>h` stays on the host, `td<i>s` moves into the sandbox and is
//! renamed `eth0` there. An index is free when neither name exists on the host; a process hands
//! indices out round-robin (so a just-freed one is not reused at once), and two starts racing for
//! one index are resolved by `ip link add` failing with "File exists" for the loser, who tries
//! the next free index.
//!
//! The links are configured by running `ip` (and `nsenter` for the sandbox side), which keeps this
//! small and easy to debug by hand; a netlink crate (e.g. `rtnetlink`/`neli`) could replace the
//! commands without changing this module's interface.

use std::collections::HashSet;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Result, SandboxError};

/// The highest link index: `4 · 16383 + 3 = 65535`, the /16's last address.
pub const MAX_INDEX: u32 = 16383;

/// Where the next allocation starts looking (see [`create_link`]).
static NEXT_INDEX: AtomicU32 = AtomicU32::new(1);

/// How many `ip link add` collisions with concurrent starts to tolerate before giving up.
const MAX_COLLISIONS: usize = 64;

/// One sandbox's veth pair and its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    pub index: u32,
    pub host_if: String,
    pub sandbox_if: String,
    pub host_addr: Ipv4Addr,
    pub sandbox_addr: Ipv4Addr,
}

impl Link {
    /// The link with index `index` in the /16 containing `subnet`.
    pub(crate) fn new(subnet: Ipv4Addr, index: u32) -> Link {
        let (host_addr, sandbox_addr) = addresses(subnet, index);
        Link {
            index,
            host_if: host_if(index),
            sandbox_if: format!("td{index}s"),
            host_addr,
            sandbox_addr,
        }
    }
}

/// The host side's interface name of link `index`.
pub fn host_if(index: u32) -> String {
    format!("td{index}h")
}

/// `(host side, sandbox side)` addresses of link `index` in the /16 containing `subnet`.
pub fn addresses(subnet: Ipv4Addr, index: u32) -> (Ipv4Addr, Ipv4Addr) {
    assert!(
        (1..=MAX_INDEX).contains(&index),
        "link index {index} out of range"
    );
    let net = (u32::from(subnet) & 0xffff_0000) + 4 * index;
    (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2))
}

/// Parses `td<i>h` / `td<i>s` into `i`.
fn index_of(ifname: &str) -> Option<u32> {
    let rest = ifname.strip_prefix("td")?;
    let digits = rest.strip_suffix('h').or_else(|| rest.strip_suffix('s'))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Link indices in use by interfaces in the host's network namespace.
fn used_indices() -> Result<HashSet<u32>> {
    let dir = "/sys/class/net";
    let entries = std::fs::read_dir(dir).map_err(|e| SandboxError::io("listing", dir, e))?;
    let mut used = HashSet::new();
    for entry in entries {
        let entry = entry.map_err(|e| SandboxError::io("listing", dir, e))?;
        if let Some(i) = entry.file_name().to_str().and_then(index_of) {
            used.insert(i);
        }
    }
    Ok(used)
}

/// The file in a sandbox's run directory that records its link index. Run directories outlive
/// their sandboxes (the log stays), so a name keeps its index — and its address — on this
/// machine: a restore of a stopped sandbox finds its address free even while other sandboxes
/// come and go.
pub const INDEX_FILE: &str = "link-index";

/// Indices recorded by the run directories of other sandbox names.
fn reserved_indices(run_root: &std::path::Path, own: &std::path::Path) -> HashSet<u32> {
    let Ok(dirs) = std::fs::read_dir(run_root) else {
        return HashSet::new();
    };
    dirs.filter_map(|d| d.ok())
        .filter(|d| d.path() != own)
        .filter_map(|d| recorded_index(&d.path()))
        .collect()
}

/// The link index recorded in the run directory `run_dir`, if any.
pub(crate) fn recorded_index(run_dir: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(run_dir.join(INDEX_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The index for the sandbox whose run directory is `run_dir`: `want` if given, else the one
/// the name had before, else a fresh one no other name holds. Creates its veth pair (both ends
/// on the host, down) and records the index in the run directory.
pub(crate) fn create_link_for(
    subnet: Ipv4Addr,
    want: Option<u32>,
    run_dir: &std::path::Path,
) -> Result<Link> {
    let recorded = recorded_index(run_dir);
    let reserved = run_dir
        .parent()
        .map(|root| reserved_indices(root, run_dir))
        .unwrap_or_default();
    let link = match want {
        Some(i) => create_link(subnet, Some(i), &HashSet::new())?,
        None => match recorded {
            Some(i) if !reserved.contains(&i) => {
                match create_link(subnet, Some(i), &HashSet::new()) {
                    Ok(l) => l,
                    Err(_) => create_link(subnet, None, &reserved)?,
                }
            }
            _ => create_link(subnet, None, &reserved)?,
        },
    };
    let _ = std::fs::write(run_dir.join(INDEX_FILE), link.index.to_string());
    Ok(link)
}

/// Creates the veth pair of `link`; `Ok(false)` if its name is taken already.
fn add_veth(link: &Link) -> Result<bool> {
    let args = [
        "link",
        "add",
        &link.host_if,
        "type",
        "veth",
        "peer",
        "name",
        &link.sandbox_if,
    ];
    match run(Command::new("ip").args(args), None) {
        Ok(()) => Ok(true),
        Err(SandboxError::Command { stderr, .. }) if stderr.contains("File exists") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Allocates a free index not in `avoid` and creates its veth pair (both ends on the host,
/// down). With `want`, only that index is tried.
fn create_link(subnet: Ipv4Addr, want: Option<u32>, avoid: &HashSet<u32>) -> Result<Link> {
    let mut tried = avoid.clone();
    if let Some(index) = want {
        if !(1..=MAX_INDEX).contains(&index) {
            return Err(SandboxError::InvalidConfig(format!(
                "link index {index} out of range"
            )));
        }
        let link = Link::new(subnet, index);
        return match add_veth(&link)? {
            true => Ok(link),
            false => Err(SandboxError::InvalidConfig(format!(
                "the sandbox's address {} is in use (link {} exists): is another sandbox holding it?",
                link.sandbox_addr, link.host_if
            ))),
        };
    }
    for _ in 0..MAX_COLLISIONS {
        let used = used_indices()?;
        // Round-robin from where this process last allocated, so that a just-freed index (and
        // its addresses, still in peers' ARP caches) is not handed out again at once.
        let from = NEXT_INDEX.load(Ordering::Relaxed).clamp(1, MAX_INDEX);
        let Some(index) = (from..=MAX_INDEX)
            .chain(1..from)
            .find(|i| !used.contains(i) && !tried.contains(i))
        else {
            return Err(SandboxError::NoFreeLink {
                subnet,
                max: MAX_INDEX,
            });
        };
        tried.insert(index);
        NEXT_INDEX.store(index % MAX_INDEX + 1, Ordering::Relaxed);
        let link = Link::new(subnet, index);
        if add_veth(&link)? {
            tracing::debug!(host_if = %link.host_if, "created veth pair");
            return Ok(link);
        }
        tracing::debug!(index, "link index taken concurrently, trying another");
    }
    Err(SandboxError::NoFreeLink {
        subnet,
        max: MAX_INDEX,
    })
}

/// Gives the host side its address, moves the sandbox side into the network namespace of
/// `init_pid` and configures it there: `lo` up, renamed `eth0`, address, up, default route via
/// the host side.
pub(crate) fn configure(link: &Link, init_pid: i32) -> Result<()> {
    let host = format!(
        "addr add {}/30 dev {h}\nlink set {h} up\nlink set {s} netns {init_pid}\n",
        link.host_addr,
        h = link.host_if,
        s = link.sandbox_if
    );
    run(Command::new("ip").args(["-batch", "-"]), Some(&host))?;
    let inside = format!(
        "link set lo up\nlink set {s} name eth0\naddr add {}/30 dev eth0\nlink set eth0 up\n\
         route add default via {}\n",
        link.sandbox_addr,
        link.host_addr,
        s = link.sandbox_if
    );
    let pid = init_pid.to_string();
    run(
        Command::new("nsenter").args(["-t", &pid, "-n", "ip", "-batch", "-"]),
        Some(&inside),
    )
}

/// Deletes the pair (deleting either end removes both). A pair that is already gone (its
/// sandbox end died with the network namespace) is not an error.
pub(crate) fn delete_link(host_if: &str) -> Result<()> {
    match run(Command::new("ip").args(["link", "del", host_if]), None) {
        Err(SandboxError::Command { stderr, .. })
            if stderr.contains("Cannot find device")
                || stderr.contains("No such device")
                || stderr.contains("does not exist") =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Runs a command to completion, feeding it `stdin`; a failure carries the command line (with
/// its stdin script, if any) and stderr.
fn run(cmd: &mut Command, stdin: Option<&str>) -> Result<()> {
    let mut described = format!("{}", cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        described.push(' ');
        described.push_str(&a.to_string_lossy());
    }
    if let Some(script) = stdin {
        described.push_str(&format!(" <<< {:?}", script.trim_end()));
    }
    tracing::debug!(command = %described, "running");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let fail = |status: String, stderr: String| SandboxError::Command {
        command: described.clone(),
        status,
        stderr,
    };
    let mut child = cmd
        .spawn()
        .map_err(|e| fail(format!("could not start: {e}"), String::new()))?;
    if let Some(script) = stdin {
        let mut pipe = child.stdin.take().expect("stdin was piped");
        // A write error (EPIPE) means the command died early; its exit status says why.
        let _ = pipe.write_all(script.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| fail(format!("wait failed: {e}"), String::new()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(
            out.status.to_string(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_scheme() {
        let s = Ipv4Addr::new(10, 213, 0, 0);
        assert_eq!(
            addresses(s, 1),
            (Ipv4Addr::new(10, 213, 0, 5), Ipv4Addr::new(10, 213, 0, 6))
        );
        assert_eq!(
            addresses(s, 64),
            (Ipv4Addr::new(10, 213, 1, 1), Ipv4Addr::new(10, 213, 1, 2))
        );
        assert_eq!(
            addresses(s, MAX_INDEX),
            (
                Ipv4Addr::new(10, 213, 255, 253),
                Ipv4Addr::new(10, 213, 255, 254)
            )
        );
        // Host bits of the configured subnet are ignored.
        assert_eq!(
            addresses(Ipv4Addr::new(10, 213, 7, 9), 1).0,
            Ipv4Addr::new(10, 213, 0, 5)
        );
    }

    #[test]
    fn interface_names() {
        assert_eq!(index_of("td12h"), Some(12));
        assert_eq!(index_of("td7s"), Some(7));
        assert_eq!(index_of("tdh"), None);
        assert_eq!(index_of("td1x"), None);
        assert_eq!(index_of("eth0"), None);
        let l = Link::new(Ipv4Addr::new(10, 213, 0, 0), MAX_INDEX);
        assert!(l.host_if.len() < libc::IFNAMSIZ);
    }
}
