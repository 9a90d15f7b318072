//! The view manager: deployed services and their views, as a deterministic state machine.
//!
//! Every change goes through [`Views::apply`] with a [`Command`], so that the orchestrator
//! cluster issue can replicate exactly these commands through a consensus log; nothing here
//! reads a clock or the network. What machines are alive is not part of the state: the failure
//! detector supplies it to [`Views::plan`], which only *proposes* commands. Safety never depends
//! on the detector: a proposed view becomes active only when its primary asks for it
//! ([`Command::Activate`]), and an instance refuses checkpoints of a view older than its own.
//!
//! Views follow Tardigrade §3.2 (Vertical Paxos): the primary of a new view is the old primary
//! if it is alive, otherwise a backup of the last *active* view (which holds every decided
//! checkpoint). Re-protection is a separate, later view: first the survivor serves with the
//! backups that already hold its state, then spares join with a full checkpoint.
//!
//! A primary that *reports* it failed (its takeover's restore failed, or its service ended) is
//! handled like a dead machine for that service alone: the failure is recorded
//! ([`Command::Failed`]), then [`Views::plan`] replaces that primary the same way it replaces a
//! silent one, not choosing the failed machine again while another holder of the state is
//! left. Failures are bounded per service (`[tardi.failover]`, [`FailurePolicy`]): at the limit,
//! or once no machine that holds the state can run it, the service is given up
//! ([`Service::failed`]) and nothing more is proposed for it.

use std::collections::{BTreeMap, BTreeSet};

/// One view of one service.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct View {
    pub number: u64,
    pub primary: String,
    pub backups: Vec<String>,
    pub active: bool,
    /// The primary starts the service fresh (no view of it was ever active).
    pub fresh: bool,
}

impl View {
    pub fn members(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.primary).chain(self.backups.iter())
    }
}

/// A view that was proposed, and whether and when it was activated (milliseconds since the
/// Unix epoch, taken by whoever issued the command).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ViewChange {
    pub view: View,
    pub reason: String,
    pub proposed_ms: u64,
    pub activated_ms: u64,
}

/// A primary that reported it failed (not one that stopped answering).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failure {
    /// The view it was the primary of.
    pub view: u64,
    pub machine: String,
    /// Its own words (the instance's error).
    pub why: String,
    /// When the failure was recorded (milliseconds since the Unix epoch, the leader's clock).
    pub at_ms: u64,
}

/// How many reported failures a service is moved on from before it is given up: the
/// manifest's `[tardi.failover]`, fixed at deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailurePolicy {
    /// Give up at this many failures within `window_ms`.
    pub max_failures: u32,
    pub window_ms: u64,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        let f = tardi_manifest::Failover::default();
        FailurePolicy {
            max_failures: f.max_failures,
            window_ms: f.window_s * 1000,
        }
    }
}

impl From<tardi_manifest::Failover> for FailurePolicy {
    fn from(f: tardi_manifest::Failover) -> Self {
        FailurePolicy {
            max_failures: f.max_failures.max(1),
            window_ms: f.window_s.saturating_mul(1000),
        }
    }
}

/// A machine whose primary failed for a service is chosen as its primary again only when no
/// other machine holds the state, and not before this long after its failure (it may have
/// kept its image: a transient cause, e.g. a leftover being removed, may be gone by then).
pub const RETRY_DELAY_MS: u64 = 1000;

/// What the leader last heard from a machine about one service: with the live set, the
/// failure detector's input to [`Views::plan`] (not replicated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The view the machine follows.
    pub view: u64,
    /// The primary run whose checkpoints its image holds (0: it holds no image).
    pub image_view: u64,
    /// The last epoch its image holds (a backup: the last it queued).
    pub epoch: u64,
    /// It is the primary of `view` and failed: why.
    pub failed: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Service {
    pub name: String,
    pub manifest: String,
    pub manifest_path: String,
    pub link_index: u32,
    pub backups_wanted: u32,
    /// The last activated view.
    pub active: Option<View>,
    /// A newer view, proposed and not yet activated.
    pub proposed: Option<View>,
    pub history: Vec<ViewChange>,
    pub policy: FailurePolicy,
    /// Reported failures of its primaries within the policy's window, oldest first.
    pub failures: Vec<Failure>,
    /// Given up, and why: nothing more is proposed for it (`tardi undeploy` forgets it).
    pub failed: Option<String>,
}

impl Service {
    /// Whether its primary starts it from its manifest: its latest view is fresh and no view
    /// of it was ever active. Once one was, the service has state (it served), and a primary
    /// that holds none (a machine that came back from a power cut with the whole cluster)
    /// must say so rather than serve an empty service under the old view.
    pub fn starts_fresh(&self) -> bool {
        self.active.is_none() && self.latest().is_some_and(|v| v.fresh)
    }

    /// The view instances act on: the proposed one if any, else the active one.
    pub fn latest(&self) -> Option<&View> {
        self.proposed.as_ref().or(self.active.as_ref())
    }

    /// A command about view `view` of this service (named `name`) is stale unless that is its
    /// latest view.
    fn check_latest(&self, name: &str, view: u64) -> Result<(), ViewError> {
        let latest = self.latest().map_or(0, |v| v.number);
        if view != latest {
            return Err(ViewError::Stale {
                service: name.to_string(),
                view,
                latest,
            });
        }
        Ok(())
    }

    fn next_number(&self) -> u64 {
        self.latest().map_or(1, |v| v.number + 1)
    }

    /// Whether `machine` reported a failure as the primary of view `view`.
    pub fn failed_in(&self, machine: &str, view: u64) -> bool {
        self.failures
            .iter()
            .any(|f| f.view == view && f.machine == machine)
    }

    /// The newest failure of `machine` within the policy's window at `now_ms`, if any (an
    /// older one no longer counts against it).
    fn recent_failure(&self, machine: &str, now_ms: u64) -> Option<&Failure> {
        self.failures
            .iter()
            .rev()
            .filter(|f| now_ms.saturating_sub(f.at_ms) < self.policy.window_ms)
            .find(|f| f.machine == machine)
    }
}

/// How protected a service is (derived from the state and the live set, never stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Its active view's primary and every backup are alive.
    Protected,
    /// It runs without a live backup (none wanted, or one is being replaced).
    Unprotected,
    /// Its first view is not active yet.
    Starting,
    /// A newer view is proposed (a failover or a spare joining).
    Changing,
    /// Its primary is suspected failed and a backup holds its state.
    FailingOver,
    /// Its primary is suspected failed and no live machine holds its state: it comes back only
    /// if a member of its active view does.
    Unavailable,
    /// Given up after its primaries failed ([`Service::failed`] says why).
    Failed,
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Health::Protected => "protected",
            Health::Unprotected => "unprotected (no live backup)",
            Health::Starting => "starting",
            Health::Changing => "changing views",
            Health::FailingOver => "failing over",
            Health::Unavailable => "unavailable: no live machine holds its state",
            Health::Failed => "failed",
        })
    }
}

/// A change to the state. Each is validated by [`Views::apply`]; an invalid one changes nothing.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Command {
    /// A machine announced itself (its Replica address may change when it restarts).
    Register { machine: String, api: String },
    Deploy {
        name: String,
        manifest: String,
        manifest_path: String,
        backups: u32,
        /// The first view's members, chosen by [`Views::placement`].
        primary: String,
        backup_machines: Vec<String>,
        /// The manifest's `[tardi.failover]`.
        policy: FailurePolicy,
        now_ms: u64,
    },
    Propose {
        service: String,
        view: View,
        reason: String,
        now_ms: u64,
    },
    Activate {
        service: String,
        view: u64,
        primary: String,
        now_ms: u64,
    },
    /// Forget a service: no machine has a role for it any more.
    Undeploy { service: String },
    /// The primary of the service's latest view reported that it failed (the instance's
    /// report, seen by the leader). Recorded once; at the policy's limit the service is given
    /// up. [`Views::plan`] then replaces that primary.
    Failed {
        service: String,
        view: u64,
        machine: String,
        why: String,
        now_ms: u64,
    },
    /// Give the service up (its latest view is `view`): no machine that holds its state can
    /// run it.
    GiveUp {
        service: String,
        view: u64,
        reason: String,
    },
    /// Bring back a service that was given up (`tardi restart`): it is no longer failed, and
    /// the failures recorded so far stop counting (against the policy's limit and against the
    /// machines that had them): [`Views::plan`] then treats its latest primary's failure as
    /// at a failover, moving it to the live machine that holds its freshest image.
    Restart { service: String, now_ms: u64 },
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ViewError {
    #[error("service {0:?} is already deployed")]
    Exists(String),
    #[error("no service named {0:?}")]
    NoService(String),
    #[error("view {view} of {service:?} is not the proposed view (proposed: {proposed:?})")]
    NotProposed {
        service: String,
        view: u64,
        proposed: Option<u64>,
    },
    #[error("{machine:?} is not the primary of view {view} of {service:?}")]
    NotPrimary {
        service: String,
        view: u64,
        machine: String,
    },
    #[error("view {view} of {service:?} is not newer than view {latest}")]
    Stale {
        service: String,
        view: u64,
        latest: u64,
    },
    #[error("a view's primary and backups must be distinct machines: {0:?}")]
    SharedMachine(Vec<String>),
    #[error("unknown machine {0:?}")]
    UnknownMachine(String),
    #[error("service {service:?} was given up: {reason}")]
    GivenUp { service: String, reason: String },
    #[error("service {0:?} was not given up: there is nothing to restart")]
    NotGivenUp(String),
}

/// The replicated state: machines (name → Replica address) and services.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Views {
    pub machines: BTreeMap<String, String>,
    pub services: BTreeMap<String, Service>,
}

impl Views {
    pub fn apply(&mut self, cmd: &Command) -> Result<(), ViewError> {
        match cmd {
            Command::Register { machine, api } => {
                self.machines.insert(machine.clone(), api.clone());
            }
            Command::Undeploy { service } => {
                if self.services.remove(service).is_none() {
                    return Err(ViewError::NoService(service.clone()));
                }
            }
            Command::Deploy {
                name,
                manifest,
                manifest_path,
                backups,
                primary,
                backup_machines,
                policy,
                now_ms,
            } => {
                if self.services.contains_key(name) {
                    return Err(ViewError::Exists(name.clone()));
                }
                let view = View {
                    number: 1,
                    primary: primary.clone(),
                    backups: backup_machines.clone(),
                    active: false,
                    fresh: true,
                };
                self.check_members(&view)?;
                // Link indices are not reused among deployed services (an undeployed service's
                // index may be given again, once it is the highest).
                let link_index = 1 + self
                    .services
                    .values()
                    .map(|s| s.link_index)
                    .max()
                    .unwrap_or(0);
                self.services.insert(
                    name.clone(),
                    Service {
                        name: name.clone(),
                        manifest: manifest.clone(),
                        manifest_path: manifest_path.clone(),
                        link_index,
                        backups_wanted: *backups,
                        active: None,
                        proposed: Some(view.clone()),
                        history: vec![ViewChange {
                            view,
                            reason: "deployed".into(),
                            proposed_ms: *now_ms,
                            activated_ms: 0,
                        }],
                        policy: *policy,
                        failures: Vec::new(),
                        failed: None,
                    },
                );
            }
            Command::Propose {
                service,
                view,
                reason,
                now_ms,
            } => {
                self.check_members(view)?;
                let s = self.service_mut(service)?;
                if let Some(reason) = &s.failed {
                    return Err(ViewError::GivenUp {
                        service: service.clone(),
                        reason: reason.clone(),
                    });
                }
                let latest = s.latest().map_or(0, |v| v.number);
                if view.number <= latest {
                    return Err(ViewError::Stale {
                        service: service.clone(),
                        view: view.number,
                        latest,
                    });
                }
                let view = View {
                    active: false,
                    ..view.clone()
                };
                s.proposed = Some(view.clone());
                s.history.push(ViewChange {
                    view,
                    reason: reason.clone(),
                    proposed_ms: *now_ms,
                    activated_ms: 0,
                });
            }
            Command::Activate {
                service,
                view,
                primary,
                now_ms,
            } => {
                let s = self.service_mut(service)?;
                // Asked again for the view already active (the reply to the first request was
                // lost, e.g. with the leader that committed it): done, nothing changes.
                if s.proposed.is_none()
                    && s.active
                        .as_ref()
                        .is_some_and(|a| a.number == *view && a.primary == *primary)
                {
                    return Ok(());
                }
                let Some(p) = s.proposed.clone().filter(|p| p.number == *view) else {
                    return Err(ViewError::NotProposed {
                        service: service.clone(),
                        view: *view,
                        proposed: s.proposed.as_ref().map(|p| p.number),
                    });
                };
                if p.primary != *primary {
                    return Err(ViewError::NotPrimary {
                        service: service.clone(),
                        view: *view,
                        machine: primary.clone(),
                    });
                }
                let p = View { active: true, ..p };
                s.active = Some(p.clone());
                s.proposed = None;
                if let Some(h) = s.history.iter_mut().rev().find(|h| h.view.number == *view) {
                    h.view.active = true;
                    h.activated_ms = *now_ms;
                }
            }
            Command::Failed {
                service,
                view,
                machine,
                why,
                now_ms,
            } => {
                let s = self.service_mut(service)?;
                s.check_latest(service, *view)?;
                if s.latest().is_none_or(|v| v.primary != *machine) {
                    return Err(ViewError::NotPrimary {
                        service: service.clone(),
                        view: *view,
                        machine: machine.clone(),
                    });
                }
                // Asked again (a reply lost with a leader): recorded already.
                if s.failed_in(machine, *view) {
                    return Ok(());
                }
                let window = s.policy.window_ms;
                s.failures
                    .retain(|f| now_ms.saturating_sub(f.at_ms) < window);
                s.failures.push(Failure {
                    view: *view,
                    machine: machine.clone(),
                    why: why.clone(),
                    at_ms: *now_ms,
                });
                let n = s.failures.len();
                if s.failed.is_none() && n >= s.policy.max_failures as usize {
                    s.failed = Some(format!(
                        "{n} failure(s) of its primary within {} s (limit {}, [tardi.failover]); the last: {machine} in view {view}: {why}",
                        window / 1000,
                        s.policy.max_failures
                    ));
                }
            }
            Command::GiveUp {
                service,
                view,
                reason,
            } => {
                let s = self.service_mut(service)?;
                s.check_latest(service, *view)?;
                if s.failed.is_none() {
                    s.failed = Some(reason.clone());
                }
            }
            Command::Restart { service, now_ms } => {
                let s = self.service_mut(service)?;
                if s.failed.take().is_none() {
                    return Err(ViewError::NotGivenUp(service.clone()));
                }
                // Kept (the latest primary's failure is what makes `plan` move the service),
                // but out of the window: they count no more.
                let before = now_ms.saturating_sub(s.policy.window_ms);
                for f in &mut s.failures {
                    f.at_ms = f.at_ms.min(before);
                }
            }
        }
        Ok(())
    }

    fn service_mut(&mut self, name: &str) -> Result<&mut Service, ViewError> {
        self.services
            .get_mut(name)
            .ok_or_else(|| ViewError::NoService(name.to_string()))
    }

    fn check_members(&self, v: &View) -> Result<(), ViewError> {
        let all: Vec<String> = v.members().cloned().collect();
        let distinct: BTreeSet<&String> = all.iter().collect();
        if distinct.len() != all.len() {
            return Err(ViewError::SharedMachine(all));
        }
        if let Some(m) = all.iter().find(|m| !self.machines.contains_key(*m)) {
            return Err(ViewError::UnknownMachine(m.clone()));
        }
        Ok(())
    }

    /// Machines for a new service: the primary and `backups` backups, on distinct live
    /// machines, fewest services first. `None` if there are not enough.
    pub fn placement(
        &self,
        alive: &BTreeSet<String>,
        backups: u32,
    ) -> Option<(String, Vec<String>)> {
        let mut load: BTreeMap<&String, usize> = alive.iter().map(|m| (m, 0)).collect();
        for s in self.services.values() {
            if let Some(v) = s.latest() {
                for m in v.members() {
                    if let Some(n) = load.get_mut(m) {
                        *n += 1;
                    }
                }
            }
        }
        let mut order: Vec<(&String, usize)> = load.into_iter().collect();
        order.sort_by_key(|&(m, n)| (n, m.clone()));
        if order.len() < 1 + backups as usize {
            return None;
        }
        let primary = order[0].0.clone();
        let backs = order[1..=backups as usize]
            .iter()
            .map(|(m, _)| (*m).clone())
            .collect();
        Some((primary, backs))
    }

    /// How protected `s` is, given the live set.
    pub fn health(&self, s: &Service, alive: &BTreeSet<String>) -> Health {
        if s.failed.is_some() {
            return Health::Failed;
        }
        let Some(latest) = s.latest() else {
            return Health::Unavailable;
        };
        let holders = |v: &View| v.members().filter(|m| alive.contains(*m)).count();
        if !alive.contains(&latest.primary) || s.failed_in(&latest.primary, latest.number) {
            // A backup that failed the latest view is no longer one (unless it kept its image;
            // it is then tried again, `Changing`).
            match &s.active {
                Some(a)
                    if a.backups
                        .iter()
                        .any(|b| alive.contains(b) && !s.failed_in(b, latest.number)) =>
                {
                    Health::FailingOver
                }
                None if holders(latest) > 0 || !alive.is_empty() => Health::Starting,
                _ => Health::Unavailable,
            }
        } else if s.proposed.is_some() {
            if s.active.is_none() {
                Health::Starting
            } else {
                Health::Changing
            }
        } else if latest.backups.iter().all(|b| alive.contains(b)) && !latest.backups.is_empty() {
            Health::Protected
        } else {
            Health::Unprotected
        }
    }

    /// Live machines of no view of `s`: its spares.
    pub fn spares(&self, s: &Service, alive: &BTreeSet<String>) -> Vec<String> {
        let members: BTreeSet<&String> = s
            .latest()
            .map(|v| v.members().collect())
            .unwrap_or_default();
        alive
            .iter()
            .filter(|m| !members.contains(m))
            .cloned()
            .collect()
    }

    /// What the failure detector's view of the world calls for: at most one command per
    /// service. `reports` is what each machine last said of each service ((machine, service)
    /// → [`Report`]): which backups hold the most of the primary's stream (to pick a new
    /// primary) and which primaries reported a failure.
    ///
    /// A primary that reported a failure for the latest view is first recorded
    /// ([`Command::Failed`]); once recorded it counts as dead *for that service* and is
    /// replaced exactly like a primary whose heartbeats stopped.
    pub fn plan(
        &self,
        alive: &BTreeSet<String>,
        reports: &BTreeMap<(String, String), Report>,
        now_ms: u64,
    ) -> Vec<Command> {
        self.plan_with(alive, reports, &BTreeSet::new(), now_ms)
    }

    /// [`Views::plan`], with `stuck` backups: (service, machine) pairs the leader saw fall
    /// behind for longer than the service allows (`[tardi.failover] max_backup_lag_ms`). For
    /// that service such a machine counts as dead: a view replaces it with a spare, as it
    /// would a backup whose machine stopped answering, and it is no spare of it.
    pub fn plan_with(
        &self,
        alive: &BTreeSet<String>,
        reports: &BTreeMap<(String, String), Report>,
        stuck: &BTreeSet<(String, String)>,
        now_ms: u64,
    ) -> Vec<Command> {
        let mut out = Vec::new();
        let everyone = alive;
        for s in self.services.values() {
            if s.failed.is_some() {
                continue;
            }
            let alive_here: BTreeSet<String>;
            let alive = if stuck.iter().any(|(svc, _)| *svc == s.name) {
                alive_here = everyone
                    .iter()
                    .filter(|m| !stuck.contains(&(s.name.clone(), (*m).clone())))
                    .cloned()
                    .collect();
                &alive_here
            } else {
                everyone
            };
            let Some(latest) = s.latest() else { continue };
            let report = |m: &String| reports.get(&(m.clone(), s.name.clone()));
            // The latest view's primary says it failed: record it first (once).
            if let Some(why) = report(&latest.primary)
                .filter(|r| r.view == latest.number)
                .and_then(|r| r.failed.clone())
                && !s.failed_in(&latest.primary, latest.number)
            {
                out.push(Command::Failed {
                    service: s.name.clone(),
                    view: latest.number,
                    machine: latest.primary.clone(),
                    why,
                    now_ms,
                });
                continue;
            }
            let primary_failed = s.failed_in(&latest.primary, latest.number);
            // A machine whose instance reports a failed primary of this service holds no role
            // a new view could use (it drops it once it is not assigned the service).
            let reports_failed = |m: &String| report(m).is_some_and(|r| r.failed.is_some());
            let dead: Vec<&String> = latest.members().filter(|m| !alive.contains(*m)).collect();
            let number = s.next_number();
            if primary_failed || !alive.contains(&latest.primary) {
                let what = match s.failures.last().filter(|_| primary_failed) {
                    Some(f) => format!("primary {} failed: {}", f.machine, f.why),
                    None => format!("primary {} failed", latest.primary),
                };
                match &s.active {
                    None => {
                        // Never protected: nothing to keep, start afresh elsewhere, away from
                        // the machines that failed it (if enough others are live).
                        let failed: BTreeSet<String> = alive
                            .iter()
                            .filter(|m| s.recent_failure(m, now_ms).is_some())
                            .cloned()
                            .collect();
                        let others: BTreeSet<String> = alive.difference(&failed).cloned().collect();
                        let retry = |m: &String| {
                            s.recent_failure(m, now_ms)
                                .is_none_or(|f| now_ms.saturating_sub(f.at_ms) >= RETRY_DELAY_MS)
                        };
                        let usable: BTreeSet<String> =
                            alive.iter().filter(|m| retry(m)).cloned().collect();
                        let placed = self
                            .placement(&others, s.backups_wanted)
                            .or_else(|| self.placement(&usable, s.backups_wanted));
                        if let Some((p, b)) = placed {
                            out.push(Command::Propose {
                                service: s.name.clone(),
                                view: View {
                                    number,
                                    primary: p,
                                    backups: b,
                                    active: false,
                                    fresh: true,
                                },
                                reason: format!("{what} before the service was protected"),
                                now_ms,
                            });
                        }
                    }
                    Some(active) => {
                        // A backup of the last active view holds every decided checkpoint, if
                        // it still holds an image (one whose takeover failed may not).
                        let holds = |m: &String| report(m).is_none_or(|r| r.image_view > 0);
                        let cands: Vec<&String> = active
                            .backups
                            .iter()
                            .filter(|b| alive.contains(*b) && holds(b))
                            .collect();
                        let rank =
                            |m: &String| report(m).map_or((0, 0), |r| (r.image_view, r.epoch));
                        // Machines that never failed the service first, the most advanced
                        // first; one that failed it only when no other is left, and not at once.
                        let (mut clean, mut failed): (Vec<&String>, Vec<&String>) =
                            cands.iter().partition(|m| {
                                s.recent_failure(m, now_ms).is_none() && !reports_failed(m)
                            });
                        clean.sort_by_key(|m| std::cmp::Reverse(rank(m)));
                        failed.sort_by_key(|m| {
                            (
                                s.recent_failure(m, now_ms).map_or(0, |f| f.at_ms),
                                std::cmp::Reverse(rank(m)),
                            )
                        });
                        let primary = match clean.first() {
                            Some(p) => (*p).clone(),
                            None => match failed.first() {
                                Some(p)
                                    if s.recent_failure(p, now_ms).is_none_or(|f| {
                                        now_ms.saturating_sub(f.at_ms) >= RETRY_DELAY_MS
                                    }) =>
                                {
                                    (*p).clone()
                                }
                                // It may serve again, but not at once.
                                Some(_) => continue,
                                None => {
                                    // No live machine holds its state. A silent primary may
                                    // only be late (a suspicion can be false), and a backup of
                                    // the active view that is out of reach may come back with
                                    // its image: wait. `health` reports it unavailable.
                                    let waiting = !primary_failed
                                        || active.backups.iter().any(|b| {
                                            !alive.contains(b)
                                                && s.recent_failure(b, now_ms).is_none()
                                        });
                                    if !waiting {
                                        out.push(Command::GiveUp {
                                            service: s.name.clone(),
                                            view: latest.number,
                                            reason: format!(
                                                "no machine that holds its state can run it ({what})"
                                            ),
                                        });
                                    }
                                    continue;
                                }
                            },
                        };
                        // The other holders stay backups: also one whose takeover failed but
                        // kept its image (it becomes a backup with it; left out, it would drop
                        // it).
                        let backups = cands
                            .iter()
                            .filter(|m| ***m != primary)
                            .map(|m| (*m).clone())
                            .collect();
                        out.push(Command::Propose {
                            service: s.name.clone(),
                            view: View {
                                number,
                                primary,
                                backups,
                                active: false,
                                fresh: false,
                            },
                            reason: what,
                            now_ms,
                        });
                    }
                }
                continue;
            }
            if !dead.is_empty() {
                let backups = latest
                    .backups
                    .iter()
                    .filter(|b| alive.contains(*b))
                    .cloned()
                    .collect();
                out.push(Command::Propose {
                    service: s.name.clone(),
                    view: View {
                        number,
                        primary: latest.primary.clone(),
                        backups,
                        active: false,
                        fresh: latest.fresh,
                    },
                    reason: format!(
                        "backup {} failed",
                        dead.iter()
                            .map(|m| m.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    now_ms,
                });
                continue;
            }
            // Re-protection: only from a settled (active) view, with spares that do not still
            // report a failed primary of the service.
            if s.proposed.is_none() && (latest.backups.len() as u32) < s.backups_wanted {
                let need = s.backups_wanted as usize - latest.backups.len();
                let spares: Vec<String> = self
                    .spares(s, alive)
                    .into_iter()
                    .filter(|m| !reports_failed(m))
                    .collect();
                if !spares.is_empty() {
                    let mut backups = latest.backups.clone();
                    backups.extend(spares.into_iter().take(need));
                    out.push(Command::Propose {
                        service: s.name.clone(),
                        view: View {
                            number,
                            primary: latest.primary.clone(),
                            backups,
                            active: false,
                            fresh: false,
                        },
                        reason: "re-protection: a spare joins as backup".into(),
                        now_ms,
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
