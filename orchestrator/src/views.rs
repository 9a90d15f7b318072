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
mod tests {
    use super::*;

    fn cluster(n: usize) -> (Views, BTreeSet<String>) {
        let mut v = Views::default();
        let mut alive = BTreeSet::new();
        for i in 1..=n {
            let m = format!("m{i}");
            v.apply(&Command::Register {
                machine: m.clone(),
                api: format!("10.0.0.{i}:7701"),
            })
            .unwrap();
            alive.insert(m);
        }
        (v, alive)
    }

    fn deploy(v: &mut Views, alive: &BTreeSet<String>, backups: u32) {
        deploy_with(v, alive, backups, FailurePolicy::default(), 1);
    }

    fn deploy_with(
        v: &mut Views,
        alive: &BTreeSet<String>,
        backups: u32,
        policy: FailurePolicy,
        now_ms: u64,
    ) {
        let (primary, backup_machines) = v.placement(alive, backups).unwrap();
        v.apply(&Command::Deploy {
            name: "redis".into(),
            manifest: String::new(),
            manifest_path: String::new(),
            backups,
            primary,
            backup_machines,
            policy,
            now_ms,
        })
        .unwrap();
    }

    /// A proposal of a (not yet active, not fresh) view of "redis".
    fn propose(number: u64, primary: &str, backups: &[&str], now_ms: u64) -> Command {
        Command::Propose {
            service: "redis".into(),
            view: View {
                number,
                primary: primary.into(),
                backups: backups.iter().map(|b| b.to_string()).collect(),
                active: false,
                fresh: false,
            },
            reason: String::new(),
            now_ms,
        }
    }

    type Reports = BTreeMap<(String, String), Report>;

    /// A backup's report of "redis": in view `view`, holding an image of run 1 up to `epoch`.
    fn backup(m: &str, view: u64, epoch: u64) -> ((String, String), Report) {
        (
            (m.to_string(), "redis".to_string()),
            Report {
                view,
                image_view: 1,
                epoch,
                failed: None,
            },
        )
    }

    /// A primary's report of "redis" saying it failed in `view`; `image`: it kept its image.
    fn failed(m: &str, view: u64, image: bool) -> ((String, String), Report) {
        (
            (m.to_string(), "redis".to_string()),
            Report {
                view,
                image_view: u64::from(image),
                epoch: 0,
                failed: Some(format!("the service ended on {m}")),
            },
        )
    }

    /// Applies everything `plan` asks for; returns the commands.
    fn step(v: &mut Views, alive: &BTreeSet<String>, reports: &Reports, now: u64) -> Vec<Command> {
        let cmds = v.plan(alive, reports, now);
        for c in &cmds {
            v.apply(c).unwrap_or_else(|e| panic!("{c:?} refused: {e}"));
        }
        cmds
    }

    fn latest(v: &Views) -> View {
        v.services["redis"].latest().unwrap().clone()
    }

    fn activate_latest(v: &mut Views) {
        let p = v.services["redis"].proposed.clone().unwrap();
        v.apply(&Command::Activate {
            service: "redis".into(),
            view: p.number,
            primary: p.primary,
            now_ms: 2,
        })
        .unwrap();
    }

    /// Three machines, "redis" active on m1 with backups m2 and m3, then m1 lost: the cluster,
    /// the machines alive (m2, m3) and the backups' reports of view 1 (m2 at `m2_epoch`, m3 at
    /// `m3_epoch`). Nothing is planned yet.
    fn primary_lost(m2_epoch: u64, m3_epoch: u64) -> (Views, BTreeSet<String>, Reports) {
        let (mut v, mut alive) = cluster(3);
        deploy(&mut v, &alive, 2);
        activate_latest(&mut v);
        alive.remove("m1");
        let reports = Reports::from([backup("m2", 1, m2_epoch), backup("m3", 1, m3_epoch)]);
        (v, alive, reports)
    }

    /// [`primary_lost`] with m2 the most advanced backup; m2 is made primary (view 2), reports
    /// that it failed there (`image`: it kept its image), and m3 is made primary (view 3).
    fn takeover_by_m2_failed(image: bool) -> (Views, BTreeSet<String>, Reports) {
        let (mut v, alive, mut reports) = primary_lost(41, 40);
        step(&mut v, &alive, &reports, 10);
        reports.extend([failed("m2", 2, image)]);
        step(&mut v, &alive, &reports, 20);
        step(&mut v, &alive, &reports, 30);
        (v, alive, reports)
    }

    #[test]
    fn undeploy_forgets_the_service_and_frees_its_name() {
        let (mut v, alive) = cluster(3);
        deploy(&mut v, &alive, 1);
        activate_latest(&mut v);
        v.apply(&Command::Undeploy {
            service: "redis".into(),
        })
        .unwrap();
        assert!(v.services.is_empty());
        assert!(
            v.plan(&alive, &BTreeMap::new(), 3).is_empty(),
            "nothing to propose for a forgotten service"
        );
        assert_eq!(
            v.apply(&Command::Undeploy {
                service: "redis".into(),
            }),
            Err(ViewError::NoService("redis".into()))
        );
        deploy(&mut v, &alive, 1);
        assert_eq!(v.services["redis"].latest().unwrap().number, 1);
    }

    #[test]
    fn failover_then_reprotection() {
        let (mut v, mut alive) = cluster(3);
        deploy(&mut v, &alive, 1);
        activate_latest(&mut v);
        let act = v.services["redis"].active.clone().unwrap();
        assert_eq!(
            (act.primary.as_str(), act.backups.clone()),
            ("m1", vec!["m2".to_string()])
        );
        assert!(
            v.plan(&alive, &BTreeMap::new(), 3).is_empty(),
            "a healthy view needs nothing"
        );

        alive.remove("m1");
        let cmds = v.plan(&alive, &BTreeMap::new(), 3);
        assert_eq!(cmds.len(), 1);
        v.apply(&cmds[0]).unwrap();
        let p = v.services["redis"].proposed.clone().unwrap();
        // The surviving backup serves alone first; the spare joins in a later view.
        assert_eq!(
            (p.number, p.primary.as_str(), p.backups.len(), p.fresh),
            (2, "m2", 0, false)
        );
        assert!(
            v.plan(&alive, &BTreeMap::new(), 4).is_empty(),
            "wait for activation"
        );
        activate_latest(&mut v);
        let cmds = v.plan(&alive, &BTreeMap::new(), 5);
        v.apply(&cmds[0]).unwrap();
        let p = v.services["redis"].proposed.clone().unwrap();
        assert_eq!(
            (p.number, p.primary.as_str(), p.backups.clone()),
            (3, "m2", vec!["m3".to_string()])
        );
    }

    #[test]
    fn the_most_advanced_backup_becomes_primary() {
        let (mut v, alive, epochs) = primary_lost(40, 41);
        let cmds = v.plan(&alive, &epochs, 3);
        v.apply(&cmds[0]).unwrap();
        let p = v.services["redis"].proposed.clone().unwrap();
        assert_eq!(
            (p.primary.as_str(), p.backups.clone()),
            ("m3", vec!["m2".to_string()])
        );
    }

    #[test]
    fn backup_failure_keeps_the_primary_and_losing_everyone_changes_nothing() {
        let (mut v, mut alive) = cluster(2);
        deploy(&mut v, &alive, 1);
        activate_latest(&mut v);
        alive.remove("m2");
        let cmds = v.plan(&alive, &BTreeMap::new(), 3);
        v.apply(&cmds[0]).unwrap();
        let p = v.services["redis"].proposed.clone().unwrap();
        assert_eq!((p.primary.as_str(), p.backups.len()), ("m1", 0));
        activate_latest(&mut v);
        alive.remove("m1");
        // No survivor: nothing to propose, and the service stays assigned to its primary (the
        // suspicion may be false: under load a heartbeat can be late).
        let before = v.clone();
        assert!(v.plan(&alive, &BTreeMap::new(), 4).is_empty());
        assert_eq!(v, before);
        assert_eq!(v.health(&v.services["redis"], &alive), Health::Unavailable);
        alive.insert("m1".into());
        assert_eq!(v.health(&v.services["redis"], &alive), Health::Unprotected);
    }

    #[test]
    fn invalid_commands_change_nothing() {
        let (mut v, alive) = cluster(3);
        deploy(&mut v, &alive, 1);
        let before = v.clone();
        let bad = [
            Command::Activate {
                service: "redis".into(),
                view: 1,
                primary: "m3".into(),
                now_ms: 0,
            },
            Command::Activate {
                service: "redis".into(),
                view: 7,
                primary: "m1".into(),
                now_ms: 0,
            },
            propose(1, "m2", &[], 0),
            propose(5, "m2", &["m2"], 0),
        ];
        for c in &bad {
            assert!(v.apply(c).is_err(), "{c:?} must be refused");
            assert_eq!(v, before);
        }
        assert!(
            v.placement(&alive, 3).is_none(),
            "3 backups need 4 machines"
        );
    }

    #[test]
    fn activating_the_active_view_again_changes_nothing() {
        let (mut v, alive) = cluster(2);
        deploy(&mut v, &alive, 1);
        activate_latest(&mut v);
        let before = v.clone();
        let again = |primary: &str| Command::Activate {
            service: "redis".into(),
            view: 1,
            primary: primary.into(),
            now_ms: 9,
        };
        assert_eq!(v.apply(&again("m1")), Ok(()));
        assert_eq!(v, before);
        assert!(v.apply(&again("m2")).is_err(), "not its primary");
        assert_eq!(v, before);
    }

    /// The first backup's takeover fails (it reports `failed` and holds no image any more):
    /// the failure is recorded, then the second backup is made primary, and the failed machine
    /// is not part of that view. Once it dropped the failed role it is a spare, and joins as
    /// backup in a later view.
    #[test]
    fn a_failed_takeover_moves_the_service_to_the_next_backup() {
        let (mut v, alive, mut reports) = primary_lost(41, 40);
        step(&mut v, &alive, &reports, 10);
        let p = latest(&v);
        assert_eq!((p.number, p.primary.as_str()), (2, "m2"));
        assert_eq!(v.health(&v.services["redis"], &alive), Health::Changing);

        reports.extend([failed("m2", 2, false), backup("m3", 2, 40)]);
        let cmds = step(&mut v, &alive, &reports, 20);
        assert!(
            matches!(&cmds[..], [Command::Failed { view: 2, machine, .. }] if machine == "m2"),
            "the failure is recorded first: {cmds:?}"
        );
        assert_eq!(v.health(&v.services["redis"], &alive), Health::FailingOver);
        let cmds = step(&mut v, &alive, &reports, 30);
        assert_eq!(cmds.len(), 1, "{cmds:?}");
        let p = latest(&v);
        assert_eq!(
            (p.number, p.primary.as_str(), p.backups.clone(), p.fresh),
            (3, "m3", vec![], false),
            "the second backup takes over; the failed machine is in no role"
        );
        let reason = &v.services["redis"].history.last().unwrap().reason;
        assert!(
            reason.contains("m2 failed: the service ended on m2"),
            "{reason}"
        );
        assert!(
            step(&mut v, &alive, &reports, 40).is_empty(),
            "recorded once, proposed once"
        );
        activate_latest(&mut v);
        // m2 still reports its failed role: not a spare to add yet.
        assert!(step(&mut v, &alive, &reports, 50).is_empty());
        reports.remove(&("m2".to_string(), "redis".to_string()));
        step(&mut v, &alive, &reports, 60);
        let p = latest(&v);
        assert_eq!(
            (p.number, p.primary.as_str(), p.backups.clone()),
            (4, "m3", vec!["m2".to_string()]),
            "re-protection with the machine that failed, now a spare"
        );
        assert!(v.services["redis"].failed.is_none());
    }

    /// A takeover that failed before its process ran kept its image: the machine stays in the
    /// next view as a backup (it holds the state; left out, its instance would drop it), the
    /// other backup becoming primary.
    #[test]
    fn a_failed_takeover_that_kept_its_image_stays_a_backup() {
        let (v, _, _) = takeover_by_m2_failed(true);
        let p = latest(&v);
        assert_eq!(
            (p.number, p.primary.as_str(), p.backups.clone()),
            (3, "m3", vec!["m2".to_string()])
        );
    }

    /// A running primary whose service ends is replaced by its backup, like a dead machine,
    /// though its instance still sends heartbeats.
    #[test]
    fn a_primary_that_reports_failed_is_replaced_while_alive() {
        let (mut v, alive) = cluster(3);
        deploy(&mut v, &alive, 1);
        activate_latest(&mut v);
        let reports = Reports::from([failed("m1", 1, false), backup("m2", 1, 7)]);
        step(&mut v, &alive, &reports, 10);
        step(&mut v, &alive, &reports, 20);
        let p = latest(&v);
        assert_eq!(
            (p.number, p.primary.as_str(), p.backups.clone()),
            (2, "m2", vec![])
        );
        // A report for an older view is not a failure of the latest one.
        let before = v.clone();
        let stale = Reports::from([failed("m2", 1, false)]);
        assert!(v.plan(&alive, &stale, 30).is_empty());
        assert_eq!(v, before);
    }

    /// A failed machine that kept its image is the only holder left: it is tried again, but
    /// not within RETRY_DELAY_MS of its failure; at the policy's limit the service is given up
    /// and nothing more is proposed.
    #[test]
    fn a_lone_holder_is_retried_after_a_delay_until_the_limit() {
        let (mut v, mut alive) = cluster(2);
        deploy(&mut v, &alive, 1);
        activate_latest(&mut v);
        alive.remove("m1");
        let mut reports = Reports::from([backup("m2", 1, 5)]);
        step(&mut v, &alive, &reports, 0);
        let mut now = 1_000;
        for attempt in 1..=3u64 {
            let view = latest(&v).number;
            assert_eq!(latest(&v).primary, "m2");
            reports.extend([failed("m2", view, true)]);
            step(&mut v, &alive, &reports, now);
            assert_eq!(v.services["redis"].failures.len() as u64, attempt);
            if attempt == 3 {
                break;
            }
            assert!(
                v.plan(&alive, &reports, now + RETRY_DELAY_MS - 1)
                    .is_empty(),
                "not at once"
            );
            now += RETRY_DELAY_MS;
            step(&mut v, &alive, &reports, now);
            assert_eq!(latest(&v).number, view + 1, "tried again");
            now += 10;
        }
        let s = &v.services["redis"];
        let why = s.failed.clone().expect("given up at the limit");
        assert!(why.contains("3 failure(s)"), "{why}");
        assert!(why.contains("the service ended on m2"), "{why}");
        assert_eq!(v.health(s, &alive), Health::Failed);
        let before = v.clone();
        assert!(
            v.plan(&alive, &reports, now + 60_000).is_empty(),
            "no flapping"
        );
        assert_eq!(v, before);
        assert!(matches!(
            v.apply(&propose(99, "m2", &[], now)),
            Err(ViewError::GivenUp { .. })
        ));
    }

    /// A service that fails on every machine it moves to, each machine joining again as a
    /// backup in between (re-protection), would go round forever: the limit stops it.
    #[test]
    fn failing_everywhere_is_bounded() {
        let (mut v, alive) = cluster(3);
        deploy(&mut v, &alive, 1);
        activate_latest(&mut v);
        let mut now = 0;
        let mut views = 1;
        while v.services["redis"].failed.is_none() {
            assert!(views < 50, "flapping: {:?}", v.services["redis"].history);
            let a = v.services["redis"].active.clone().unwrap();
            let mut reports: Reports = a.backups.iter().map(|b| backup(b, a.number, 9)).collect();
            reports.extend([failed(&a.primary, a.number, false)]);
            // (Later than the retry delay: the backup may have failed the service before.)
            now += RETRY_DELAY_MS;
            step(&mut v, &alive, &reports, now);
            now += 10;
            step(&mut v, &alive, &reports, now);
            if v.services["redis"].failed.is_some() {
                break;
            }
            assert_ne!(latest(&v).primary, a.primary);
            activate_latest(&mut v);
            // The failed machine dropped its role; a spare joins (and catches up).
            reports.remove(&(a.primary.clone(), "redis".to_string()));
            now += 10;
            step(&mut v, &alive, &reports, now);
            activate_latest(&mut v);
            views = latest(&v).number;
        }
        let s = &v.services["redis"];
        assert_eq!(s.failures.len(), 3, "{:?}", s.failures);
        assert!(v.plan(&alive, &Reports::new(), now + 1).is_empty());
    }

    /// A backup that failed the service recently is passed over for one that did not, even a
    /// less advanced one; once its failure is older than the window it counts as clean again.
    #[test]
    fn a_recent_failure_passes_a_backup_over_until_the_window_ends() {
        let (mut v, alive, reports) = primary_lost(41, 40);
        let s = v.services.get_mut("redis").unwrap();
        s.policy.window_ms = 60_000;
        s.failures.push(Failure {
            view: 0,
            machine: "m2".into(),
            why: "earlier".into(),
            at_ms: 1_000,
        });
        let pick = |now: u64| match &v.plan(&alive, &reports, now)[..] {
            [Command::Propose { view, .. }] => view.primary.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(pick(2_000), "m3", "m2 failed it a second ago");
        assert_eq!(pick(61_000), "m2", "the failure is out of the window");
    }

    /// Failures older than the window do not count.
    #[test]
    fn failures_outside_the_window_are_forgotten() {
        let (mut v, alive) = cluster(3);
        let policy = FailurePolicy {
            max_failures: 2,
            window_ms: 1_000,
        };
        deploy_with(&mut v, &alive, 1, policy, 0);
        activate_latest(&mut v);
        let fail = |v: &mut Views, now: u64| {
            let l = latest(v);
            v.apply(&Command::Failed {
                service: "redis".into(),
                view: l.number,
                machine: l.primary.clone(),
                why: "ended".into(),
                now_ms: now,
            })
            .unwrap();
            if v.services["redis"].failed.is_some() {
                return;
            }
            v.apply(&propose(
                l.number + 1,
                &l.backups[0],
                &[l.primary.as_str()],
                now,
            ))
            .unwrap();
        };
        fail(&mut v, 100);
        fail(&mut v, 5_000);
        assert!(v.services["redis"].failed.is_none());
        assert_eq!(v.services["redis"].failures.len(), 1);
        fail(&mut v, 5_500);
        assert!(v.services["redis"].failed.is_some());
    }

    /// When every machine that held the state failed, the service is given up at once (no
    /// limit to wait for); while a backup of the active view is only out of reach, it waits.
    #[test]
    fn no_holder_left_gives_up_unless_a_backup_may_come_back() {
        let (mut v, mut alive, mut reports) = takeover_by_m2_failed(false);
        assert_eq!(latest(&v).primary, "m3");
        let waiting = v.clone();
        reports.extend([failed("m3", 3, false)]);
        step(&mut v, &alive, &reports, 40);
        let cmds = step(&mut v, &alive, &reports, 50);
        assert!(matches!(&cmds[..], [Command::GiveUp { .. }]), "{cmds:?}");
        let why = v.services["redis"].failed.clone().unwrap();
        assert!(why.starts_with("no machine that holds its state"), "{why}");
        assert!(why.contains("m3 failed: the service ended on m3"), "{why}");
        assert_eq!(v.services["redis"].failures.len(), 2);

        // The same, but m2 (a backup of the active view) is unreachable rather than failed.
        alive.remove("m2");
        let reports = Reports::from([failed("m3", 3, false)]);
        let mut views = waiting;
        // (As if m2 had not failed: it is only out of reach.)
        views.services.get_mut("redis").unwrap().failures.clear();
        step(&mut views, &alive, &reports, 40);
        assert!(
            views.plan(&alive, &reports, 50).is_empty(),
            "m2 may come back"
        );
        assert_eq!(
            views.health(&views.services["redis"], &alive),
            Health::Unavailable
        );
    }

    /// Issue 26, item 6: a service given up after its backup's takeover failed (the backup kept
    /// its image) is brought back by `Restart`: the takeover is planned again, on that machine,
    /// from its image; the old failures no longer count against the limit. Restarting a service
    /// that was not given up is refused.
    #[test]
    fn a_restarted_service_moves_to_the_machine_with_its_image() {
        let (mut v, mut alive) = cluster(3);
        let policy = FailurePolicy {
            max_failures: 1,
            window_ms: 600_000,
        };
        // Unix times, as the leader gives them (a failure moves out of the window only once a
        // window has passed since the epoch).
        const T: u64 = 1_700_000_000_000;
        deploy_with(&mut v, &alive, 1, policy, T);
        activate_latest(&mut v);
        assert_eq!(
            v.apply(&Command::Restart {
                service: "redis".into(),
                now_ms: T + 5
            }),
            Err(ViewError::NotGivenUp("redis".into()))
        );
        alive.remove("m1");
        let mut reports = Reports::from([backup("m2", 1, 40)]);
        step(&mut v, &alive, &reports, T + 10);
        assert_eq!(latest(&v).primary, "m2");
        reports.extend([failed("m2", 2, true)]);
        step(&mut v, &alive, &reports, T + 20);
        assert!(
            v.services["redis"].failed.is_some(),
            "given up at the first failure"
        );
        assert!(v.plan(&alive, &reports, T + 30).is_empty());
        v.apply(&Command::Restart {
            service: "redis".into(),
            now_ms: T + 40,
        })
        .unwrap();
        assert!(v.services["redis"].failed.is_none());
        let cmds = step(&mut v, &alive, &reports, T + 50);
        match &cmds[..] {
            [Command::Propose { view, .. }] => {
                assert_eq!(
                    view.primary, "m2",
                    "the machine that holds the image: {cmds:?}"
                );
                assert!(!view.fresh, "from its image, not afresh");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Issue 26, item 7: a backup the leader saw fall behind (`stuck`) is replaced as a dead
    /// one would be, though its machine is alive, and is no spare of that service meanwhile.
    #[test]
    fn a_stuck_backup_is_replaced_by_a_spare() {
        let (mut v, alive) = cluster(3);
        deploy(&mut v, &alive, 1);
        activate_latest(&mut v);
        assert_eq!(latest(&v).backups, ["m2"]);
        let stuck = BTreeSet::from([("redis".to_string(), "m2".to_string())]);
        let reports = Reports::new();
        let cmds = v.plan_with(&alive, &reports, &stuck, 10);
        match &cmds[..] {
            [Command::Propose { view, reason, .. }] => {
                assert_eq!((view.primary.as_str(), view.backups.len()), ("m1", 0));
                assert!(reason.contains("backup m2"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        for c in &cmds {
            v.apply(c).unwrap();
        }
        activate_latest(&mut v);
        let cmds = v.plan_with(&alive, &reports, &stuck, 20);
        match &cmds[..] {
            [Command::Propose { view, .. }] => assert_eq!(view.backups, ["m3"], "not m2"),
            other => panic!("{other:?}"),
        }
        // Not stuck, m2 would have been the spare chosen.
        match &v.plan(&alive, &reports, 30)[..] {
            [Command::Propose { view, .. }] => assert_eq!(view.backups, ["m2"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failure_reports_are_checked() {
        let (mut v, alive) = cluster(3);
        deploy(&mut v, &alive, 1);
        activate_latest(&mut v);
        let f = |view: u64, machine: &str| Command::Failed {
            service: "redis".into(),
            view,
            machine: machine.into(),
            why: "x".into(),
            now_ms: 5,
        };
        let before = v.clone();
        assert!(matches!(v.apply(&f(7, "m1")), Err(ViewError::Stale { .. })));
        assert!(matches!(
            v.apply(&f(1, "m2")),
            Err(ViewError::NotPrimary { .. })
        ));
        assert_eq!(v, before);
        v.apply(&f(1, "m1")).unwrap();
        let once = v.clone();
        v.apply(&f(1, "m1")).unwrap();
        assert_eq!(v, once, "asked again: recorded once");
        assert!(matches!(
            v.apply(&Command::GiveUp {
                service: "redis".into(),
                view: 3,
                reason: "r".into()
            }),
            Err(ViewError::Stale { .. })
        ));
    }
}
