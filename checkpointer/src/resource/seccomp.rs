//! The seccomp filters the service installed itself.
//!
//! Capture: `PTRACE_SECCOMP_GET_FILTER` per stopped thread gives each filter's classic BPF
//! program, index 0 being the oldest (measured on Linux 6.18), and
//! `PTRACE_GET_SECCOMP_METADATA` whether it logs (`SECCOMP_FILTER_FLAG_LOG`). Programs are
//! kept once per image, threads name theirs in order. The sandbox installs no filter of its
//! own before it execs the service (nothing to skip); the mprotect tracker's agent does (one,
//! with `TSYNC`): that one is recognised by its program and left out (a restore runs without
//! it, and a later epoch loop loads the agent again).
//!
//! Restore: the restorer installs them as the last thing each thread does before its
//! `rt_sigreturn` (see `restorer/main.rs`, and the plan's layout in [`plan`]).
//!
//! While the checkpointer traces a thread, the thread's filters are suspended
//! (`PTRACE_O_SUSPEND_SECCOMP`, see `crate::ptrace`): the calls it injects are not subject to
//! them.
//!
//! Not kept: a thread in strict mode (`SECCOMP_MODE_STRICT`: refused by name, found through
//! the process's `Seccomp:` status line, so only when the thread-group leader is in it); which
//! filters were shared between threads beyond the chains' longest common prefix (see
//! [`plan`]); a listener of `SECCOMP_RET_USER_NOTIF` filters (a notification descriptor is
//! refused as an unknown descriptor; without a listener such calls fail with `ENOSYS`, as they
//! would have once the listener was closed).

use crate::image::{Seccomp, SeccompChain, SeccompFilter};
use crate::os::error::CaptureError;
use crate::procfs::{self, MapEntry, Proc};
use crate::ptrace::Stopped;
use crate::sys::Pid;
use std::collections::HashMap;

type Result<T> = std::result::Result<T, CaptureError>;

/// The last reading: the seccomp-call count and the threads it was made with.
#[derive(Debug)]
pub(crate) struct SeccompCache {
    calls: Option<u64>,
    tids: Vec<Pid>,
    seccomp: Seccomp,
}

/// The service's filters. Reused from `cache` when `calls` (the count of
/// [`crate::syscount::SECCOMP_CALLS`]; `None` without a counter) and the threads did not
/// change and `refresh` is off. `own_filter`: the mprotect tracker's agent is loaded and its
/// filter installed by us. `status` is the process's `status` text.
#[allow(clippy::too_many_arguments)]
pub(crate) fn capture(
    proc: &Proc,
    st: &Stopped,
    maps: &[MapEntry],
    status: &str,
    cache: &mut Option<SeccompCache>,
    calls: Option<u64>,
    refresh: bool,
    own_filter: bool,
    ns_tid: &dyn Fn(Pid) -> Option<Pid>,
) -> Result<Seccomp> {
    if !refresh
        && calls.is_some()
        && let Some(c) = cache
            .as_ref()
            .filter(|c| c.calls == calls && c.tids == st.tids)
    {
        return Ok(c.seccomp.clone());
    }
    let mode = procfs::status_value(status, "Seccomp").unwrap_or("0");
    if mode == "1" {
        return Err(CaptureError::Unsupported(
            "the service is in seccomp strict mode (SECCOMP_MODE_STRICT); only filters \
             (SECCOMP_MODE_FILTER) are restored"
                .into(),
        ));
    }
    let seccomp = read(proc, st, maps, own_filter, ns_tid)?;
    *cache = Some(SeccompCache {
        calls,
        tids: st.tids.clone(),
        seccomp: seccomp.clone(),
    });
    Ok(seccomp)
}

fn read(
    proc: &Proc,
    st: &Stopped,
    maps: &[MapEntry],
    own_filter: bool,
    ns_tid: &dyn Fn(Pid) -> Option<Pid>,
) -> Result<Seccomp> {
    let mut raw = Vec::new();
    for &tid in &st.tids {
        let mut chain = Vec::new();
        for i in 0.. {
            match st.seccomp_filter(tid, i)? {
                Some(f) => chain.push(f),
                None => break,
            }
        }
        if !chain.is_empty() {
            raw.push((tid, chain));
        }
    }
    if raw.is_empty() {
        return Ok(Seccomp::default());
    }
    let agents_filter = match crate::agent::Agent::find(proc.pid, maps) {
        Some(a) if own_filter => Some(crate::agent::filter(a.text())),
        Some(_) => {
            return Err(CaptureError::Unsupported(
                "the service carries Tardi's write-tracking agent and its seccomp filter (an \
                 epoch loop with the mprotect tracker ran on it); checkpoint it from an epoch \
                 loop"
                    .into(),
            ));
        }
        None => None,
    };
    let mut out = Seccomp::default();
    let mut index: HashMap<SeccompFilter, u32> = HashMap::new();
    for (tid, chain) in raw {
        let mut ks = Vec::with_capacity(chain.len());
        for (flags, insns) in chain {
            if agents_filter.as_ref() == Some(&insns) {
                continue;
            }
            let f = SeccompFilter {
                flags: flags & 2, // SECCOMP_FILTER_FLAG_LOG
                insns,
            };
            let next = out.filters.len() as u32;
            ks.push(*index.entry(f.clone()).or_insert_with(|| {
                out.filters.push(f);
                next
            }));
        }
        if ks.is_empty() {
            continue;
        }
        let tid = ns_tid(tid).ok_or_else(|| {
            CaptureError::Unsupported(format!("thread {tid} has no TID in the sandbox"))
        })?;
        out.chains.push(SeccompChain { tid, filters: ks });
    }
    Ok(out)
}

/// How a restore installs `s` over threads `tids` (sandbox TIDs, the leader first): the
/// longest chain prefix every thread shares, which the leader installs for all with
/// `SECCOMP_FILTER_FLAG_TSYNC` (so the threads share those filters, as they most likely did:
/// a later `TSYNC` of the service's own then still finds every thread's filters an ancestor of
/// its own), and per thread the rest of its chain, which it installs itself. Returns
/// (prefix, per thread in `tids` order its own filters), as indices into `s.filters`.
pub fn plan(s: &Seccomp, tids: &[i32]) -> (Vec<u32>, Vec<Vec<u32>>) {
    let chain = |tid: i32| -> &[u32] {
        s.chains
            .iter()
            .find(|c| c.tid == tid)
            .map_or(&[][..], |c| &c.filters[..])
    };
    let chains: Vec<&[u32]> = tids.iter().map(|&t| chain(t)).collect();
    let mut prefix = 0;
    while let Some(&k) = chains.first().and_then(|c| c.get(prefix)) {
        if chains.iter().all(|c| c.get(prefix) == Some(&k)) {
            prefix += 1;
        } else {
            break;
        }
    }
    let shared = chains.first().map_or(Vec::new(), |c| c[..prefix].to_vec());
    let own = chains.iter().map(|c| c[prefix..].to_vec()).collect();
    (shared, own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_shares_the_common_prefix() {
        let f = |k: u64| SeccompFilter {
            flags: 0,
            insns: vec![k],
        };
        let s = Seccomp {
            filters: vec![f(1), f(2), f(3)],
            chains: vec![
                SeccompChain {
                    tid: 10,
                    filters: vec![0, 1],
                },
                SeccompChain {
                    tid: 11,
                    filters: vec![0, 1, 2],
                },
            ],
        };
        assert_eq!(plan(&s, &[10, 11]), (vec![0, 1], vec![vec![], vec![2]]));
        // A thread without filters: nothing shared.
        assert_eq!(
            plan(&s, &[10, 11, 12]),
            (vec![], vec![vec![0, 1], vec![0, 1, 2], vec![]])
        );
        assert_eq!(plan(&Seccomp::default(), &[1]), (vec![], vec![vec![]]));
    }
}
