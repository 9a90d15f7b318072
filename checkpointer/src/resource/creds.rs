//! The process's credentials: user and group IDs, supplementary groups, capability sets,
//! securebits, `no_new_privs` and the dumpable flag. Read from `/proc/PID/status`, plus two
//! injected `prctl`s (securebits and dumpable have no other outside interface), re-read only
//! when the status lines change or on a refresh. Restored by the restorer, in each thread, as
//! its last step before the threads resume (see `restorer/main.rs`, `drop_creds`).

use crate::image::Credentials;
use crate::os::error::{CaptureError, proc_err};
use crate::procfs::{self, MapEntry, Proc};
use crate::ptrace::Stopped;
use crate::sys::Pid;
use std::io;

type Result<T> = std::result::Result<T, CaptureError>;

const KEYS: [&str; 9] = [
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
];

/// The credential lines of a `status` text, as one string (the cache key).
fn key(status: &str) -> String {
    KEYS.iter()
        .map(|k| procfs::status_value(status, k).unwrap_or("").trim())
        .collect::<Vec<_>>()
        .join("|")
}

/// The process's credentials. `cache` holds the last answer with its key; `refresh` re-reads
/// everything and checks that every thread has the leader's credentials.
pub fn capture(
    proc: &Proc,
    st: &mut Stopped,
    maps: &[MapEntry],
    status: &str,
    cache: &mut Option<(String, Credentials)>,
    refresh: bool,
) -> Result<Credentials> {
    let pid = proc.pid;
    let k = key(status);
    if !refresh
        && let Some((ck, c)) = cache.as_ref()
        && *ck == k
    {
        return Ok(c.clone());
    }
    if refresh {
        for &t in st.tids.iter().skip(1) {
            let ts = proc
                .read_string(&format!("task/{t}/status"))
                .map_err(proc_err(pid, "thread status"))?;
            if key(&ts) != k {
                return Err(CaptureError::Unsupported(format!(
                    "thread {t} has credentials different from its process's (a thread changed \
                     its own with a raw system call); per-thread credentials are not supported"
                )));
            }
        }
    }
    let field = |name: &str| {
        procfs::status_value(status, name).ok_or_else(|| {
            proc_err(pid, "status")(io::Error::other(format!("status: no field {name}")))
        })
    };
    let ids = |name: &str| -> Result<[u32; 4]> {
        let v: Vec<u32> = field(name)?
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        v.try_into().map_err(|_| {
            proc_err(pid, "status")(io::Error::other(format!("status: malformed {name}")))
        })
    };
    let cap = |name: &str| -> Result<u64> {
        u64::from_str_radix(field(name)?.trim(), 16).map_err(|_| {
            proc_err(pid, "status")(io::Error::other(format!("status: malformed {name}")))
        })
    };
    let leader: Pid = st.tids[0];
    let prctl = |st: &mut Stopped, op: u64| -> Result<u32> {
        let (r, _, _) = st.inject(maps, leader, libc::SYS_prctl, [op, 0, 0, 0, 0, 0], 0)?;
        if r < 0 {
            return Err(proc_err(pid, "prctl")(io::Error::from_raw_os_error(
                -r as i32,
            )));
        }
        Ok(r as u32)
    };
    let c = Credentials {
        uid: ids("Uid")?,
        gid: ids("Gid")?,
        groups: field("Groups")?
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect(),
        cap_inheritable: cap("CapInh")?,
        cap_permitted: cap("CapPrm")?,
        cap_effective: cap("CapEff")?,
        cap_bounding: cap("CapBnd")?,
        cap_ambient: cap("CapAmb")?,
        securebits: prctl(st, libc::PR_GET_SECUREBITS as u64)?,
        // Set by the mprotect tracker's agent for its filter: the app's own state instead
        // (`agent::Agent::prepare_no_new_privs`; in the epoch loop the tracker also patches
        // every image, since the app's changes do not show in `status`).
        no_new_privs: field("NoNewPrivs")?.trim() == "1"
            && crate::agent::app_no_new_privs(pid, maps).unwrap_or(true),
        dumpable: prctl(st, libc::PR_GET_DUMPABLE as u64)?,
    };
    *cache = Some((k, c.clone()));
    Ok(c)
}
