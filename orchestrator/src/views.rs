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
}

impl Service {
    /// The view instances act on: the proposed one if any, else the active one.
    pub fn latest(&self) -> Option<&View> {
        self.proposed.as_ref().or(self.active.as_ref())
    }

    fn next_number(&self) -> u64 {
        self.latest().map_or(1, |v| v.number + 1)
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
        let Some(latest) = s.latest() else {
            return Health::Unavailable;
        };
        let holders = |v: &View| v.members().filter(|m| alive.contains(*m)).count();
        if !alive.contains(&latest.primary) {
            match &s.active {
                Some(a) if a.backups.iter().any(|b| alive.contains(b)) => Health::FailingOver,
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
    /// service. `epochs` ranks backups by how much of the primary's stream they hold
    /// (machine, service) → (view of the image, epoch), used to pick a new primary.
    pub fn plan(
        &self,
        alive: &BTreeSet<String>,
        epochs: &BTreeMap<(String, String), (u64, u64)>,
        now_ms: u64,
    ) -> Vec<Command> {
        let mut out = Vec::new();
        for s in self.services.values() {
            let Some(latest) = s.latest() else { continue };
            let dead: Vec<&String> = latest.members().filter(|m| !alive.contains(*m)).collect();
            let number = s.next_number();
            if !alive.contains(&latest.primary) {
                match &s.active {
                    None => {
                        // Never protected: nothing to keep, start afresh elsewhere.
                        if let Some((p, b)) = self.placement(alive, s.backups_wanted) {
                            out.push(Command::Propose {
                                service: s.name.clone(),
                                view: View {
                                    number,
                                    primary: p,
                                    backups: b,
                                    active: false,
                                    fresh: true,
                                },
                                reason: format!(
                                    "primary {} failed before the service was protected",
                                    latest.primary
                                ),
                                now_ms,
                            });
                        }
                    }
                    Some(active) => {
                        // A backup of the last active view holds every decided checkpoint.
                        let mut cands: Vec<&String> = active
                            .backups
                            .iter()
                            .filter(|b| alive.contains(*b))
                            .collect();
                        if cands.is_empty() {
                            // No live machine holds its state. Nothing to propose: a suspicion
                            // may be false (a primary slow to heartbeat under load), and if it
                            // is not, only a member of the active view coming back can help.
                            // The service stays assigned; `health` reports it unavailable.
                            continue;
                        }
                        let rank = |m: &String| {
                            epochs
                                .get(&(m.clone(), s.name.clone()))
                                .copied()
                                .unwrap_or((0, 0))
                        };
                        cands.sort_by_key(|m| std::cmp::Reverse(rank(m)));
                        let primary = cands[0].clone();
                        let backups = cands[1..].iter().map(|m| (*m).clone()).collect();
                        out.push(Command::Propose {
                            service: s.name.clone(),
                            view: View {
                                number,
                                primary,
                                backups,
                                active: false,
                                fresh: false,
                            },
                            reason: format!("primary {} failed", latest.primary),
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
            // Re-protection: only from a settled (active) view.
            if s.proposed.is_none() && (latest.backups.len() as u32) < s.backups_wanted {
                let need = s.backups_wanted as usize - latest.backups.len();
                let spares = self.spares(s, alive);
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
        let (primary, backup_machines) = v.placement(alive, backups).unwrap();
        v.apply(&Command::Deploy {
            name: "redis".into(),
            manifest: String::new(),
            manifest_path: String::new(),
            backups,
            primary,
            backup_machines,
            now_ms: 1,
        })
        .unwrap();
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
        let (mut v, mut alive) = cluster(3);
        deploy(&mut v, &alive, 2);
        activate_latest(&mut v);
        alive.remove("m1");
        let epochs = BTreeMap::from([
            (("m2".to_string(), "redis".to_string()), (1, 40)),
            (("m3".to_string(), "redis".to_string()), (1, 41)),
        ]);
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
            Command::Propose {
                service: "redis".into(),
                view: View {
                    number: 1,
                    primary: "m2".into(),
                    backups: vec![],
                    active: false,
                    fresh: false,
                },
                reason: String::new(),
                now_ms: 0,
            },
            Command::Propose {
                service: "redis".into(),
                view: View {
                    number: 5,
                    primary: "m2".into(),
                    backups: vec!["m2".into()],
                    active: false,
                    fresh: false,
                },
                reason: String::new(),
                now_ms: 0,
            },
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
}
