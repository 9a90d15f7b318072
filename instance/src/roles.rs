//! The roles this machine plays, by service, and their transitions: reconciling the
//! orchestrators' assignments, reporting in heartbeats, fencing a cut-off primary.

#[allow(unused_imports)]
use super::*;

/// A role this machine plays for one service.
pub(crate) enum Role {
    Primary(Primary),
    /// With the output gate a takeover will use, made in advance (`None` if that failed: the
    /// takeover makes it then).
    Backup(Arc<Backup>, Option<Arc<tardi_netfilter::Gate>>),
    /// Assigned primary but could not start, or its service ended: the reason, reported (as
    /// `failed: WHY`) until the view changes. Nothing of it runs (sandbox, gate and address are
    /// gone). A takeover that failed keeps the image it restored from (a restore only reads
    /// it): its run, and the image. A later view that makes this machine primary again
    /// restores from it; one that makes it a backup keeps it as the backup's image; a machine
    /// left out of the view drops it.
    Failed {
        view: u64,
        why: String,
        image: Option<Box<(u64, tardi_checkpointer::store::Image)>>,
    },
}

/// The roles of this machine, by service.
pub(crate) struct Roles {
    pub(crate) ctx: Arc<Ctx>,
    pub(crate) roles: Mutex<HashMap<String, Role>>,
    /// Services whose role `reconcile` has taken out of `roles` to change it (a takeover, a
    /// start, a stop can take seconds): still reported, with this report, until the new role
    /// is in (or, for a stop, until it has stopped). Without them a heartbeat in that window
    /// would tell the orchestrator the machine holds nothing of the service.
    pub(crate) changing: Mutex<HashMap<String, pb::ServiceReport>>,
    /// The orchestrators' lease: when the last renewal came and how long it lasts (`None`
    /// before the first: an orchestrator that gives none never has a primary fenced).
    pub(crate) lease: Mutex<Option<(Instant, Duration)>>,
}

impl Roles {
    /// A renewal of the orchestrators' lease arrived.
    pub(crate) fn renewed(&self, lease: Duration) {
        *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), lease));
    }

    /// Once the lease ran out, fences (freezes) every primary of this machine whose backups
    /// kept it waiting as long ([`Primary::fence_if_cut_off`]); while the lease is current,
    /// thaws the frozen ones (a newer view that does not make this machine primary stops them
    /// instead, through `reconcile`). Run every few milliseconds by the `fence` thread.
    pub(crate) fn fence_cut_off(&self) {
        let Some((at, lease)) = *self.lease.lock().unwrap_or_else(|e| e.into_inner()) else {
            return;
        };
        let silent = at.elapsed();
        let cut_off = silent > lease * crate::primary::FENCE_AFTER_LEASES;
        for r in self.lock().values() {
            if let Role::Primary(p) = r {
                if cut_off {
                    p.fence_if_cut_off(lease, silent);
                } else if silent <= lease && p.frozen() {
                    p.thaw();
                }
            }
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Role>> {
        self.roles.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn changing(&self) -> std::sync::MutexGuard<'_, HashMap<String, pb::ServiceReport>> {
        self.changing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `name`'s role out to change it; it stays reported as `state` meanwhile (see
    /// [`Roles::changing`]), until [`Roles::changed`].
    pub(crate) fn take_for_change(
        &self,
        name: &str,
        view: u64,
        primary: bool,
        state: &str,
    ) -> Option<Role> {
        // The report first, then the removal: a heartbeat always sees one of them.
        self.changing().insert(
            name.to_string(),
            pb::ServiceReport {
                service: name.to_string(),
                view,
                role: if primary {
                    pb::Role::Primary
                } else {
                    pb::Role::Backup
                } as i32,
                state: state.to_string(),
                ..Default::default()
            },
        );
        self.lock().remove(name)
    }

    pub(crate) fn changed(&self, name: &str) {
        self.changing().remove(name);
    }

    pub(crate) fn backup(&self, service: &str) -> Option<Arc<Backup>> {
        match self.lock().get(service) {
            Some(Role::Backup(b, _)) => Some(b.clone()),
            _ => None,
        }
    }

    /// The view this machine holds `service` in (as its primary, a backup of it, a primary
    /// that failed to start, or one whose role is changing), if it holds it.
    pub(crate) fn view_of(&self, service: &str) -> Option<u64> {
        if let Some(r) = self.changing().get(service) {
            return Some(r.view);
        }
        match self.lock().get(service)? {
            Role::Primary(p) => Some(p.view()),
            Role::Backup(b, _) => Some(b.report().view),
            Role::Failed { view, .. } => Some(*view),
        }
    }

    pub(crate) fn reports(&self) -> Vec<pb::ServiceReport> {
        // Changing ones first (and kept when both are seen: the new role is in by then).
        let changing = self.changing().clone();
        let roles = self.lock();
        let mut out: Vec<pb::ServiceReport> = changing
            .into_values()
            .filter(|r| !roles.contains_key(&r.service))
            .collect();
        out.extend(roles.iter().map(|(name, r)| match r {
            Role::Primary(p) => p.report(),
            Role::Backup(b, _) => {
                let r = b.report();
                pb::ServiceReport {
                    service: name.clone(),
                    view: r.view,
                    role: pb::Role::Backup as i32,
                    state: match &r.broken {
                        Some(e) => format!("backup, chain broken: {e}"),
                        None if r.has_image => "backup".into(),
                        None => "backup, waiting for a full checkpoint".into(),
                    },
                    epoch: r.queued_epoch,
                    decided: r.applied_epoch,
                    epochs_per_sec: r.epochs_per_sec,
                    checkpoint_bytes: r.mean_bytes,
                    backup_lag: r.lag,
                    image_view: r.image_view,
                    scrub_checks: r.scrub_checks,
                    scrub_mismatches: r.scrub_mismatches,
                    scrub_last_mismatch: r.last_mismatch.unwrap_or_default(),
                    ..Default::default()
                }
            }
            Role::Failed { view, why, image } => pb::ServiceReport {
                service: name.clone(),
                view: *view,
                role: pb::Role::Primary as i32,
                state: format!("failed: {why}"),
                // The image it kept, if any: the orchestrator may choose it again.
                image_view: image.as_ref().map_or(0, |i| i.0),
                epoch: image.as_ref().map_or(0, |i| i.1.epoch),
                ..Default::default()
            },
        }));
        out
    }

    /// Brings this machine's roles in line with the orchestrator's assignments. Runs on its
    /// own thread: starting or restoring a service blocks.
    pub(crate) fn reconcile(&self, a: &pb::Assignments) {
        *self.ctx.machines.lock().unwrap_or_else(|e| e.into_inner()) =
            a.machines.clone().into_iter().collect();
        let me = &self.ctx.opts.machine;
        let assigned: BTreeSet<&String> = a.services.iter().map(|s| &s.service).collect();
        // Services no longer assigned here: a spare keeps nothing.
        let gone: Vec<String> = self
            .lock()
            .keys()
            .filter(|k| !assigned.contains(k))
            .cloned()
            .collect();
        for name in gone {
            let view = self.lock().get(&name).map_or(0, role_view);
            if let Some(r) = self.take_for_change(&name, view, false, "stopping") {
                tracing::warn!(service = %name, "no longer assigned here; stopping");
                stop(r);
            }
            self.changed(&name);
        }
        for s in &a.services {
            let Some(view) = s.view.clone() else { continue };
            let target =
                match tardi_manifest::parse(&s.manifest, std::path::Path::new(&s.manifest_path)) {
                    Ok(m) => Target {
                        name: s.service.clone(),
                        manifest: m,
                        link_index: s.link_index,
                        view: view.clone(),
                        fresh: s.fresh,
                    },
                    Err(e) => {
                        let old = self.lock().insert(
                            s.service.clone(),
                            Role::Failed {
                                view: view.number,
                                why: format!("the manifest is not valid here: {e}"),
                                image: None,
                            },
                        );
                        if let Some(r) = old {
                            stop(r);
                        }
                        continue;
                    }
                };
            let primary_here = view.primary == *me;
            let current =
                self.take_for_change(&s.service, view.number, primary_here, "changing role");
            let next = match (current, primary_here) {
                (Some(Role::Primary(p)), true) if !p.failed() => {
                    p.set_view(&view);
                    Role::Primary(p)
                }
                // Its service ended (or its chain broke): stop what is left of it (the sandbox
                // is gone already; the gate and the address go with it) and report why, for
                // the orchestrator to move the service elsewhere.
                (Some(Role::Primary(p)), true) if p.view() == view.number || !target.fresh => {
                    let why = p.failure().unwrap_or_default();
                    tracing::warn!(service = %s.service, view = view.number, %why, "primary failed; reporting it");
                    p.stop();
                    Role::Failed {
                        view: view.number,
                        why,
                        image: None,
                    }
                }
                (
                    Some(Role::Failed {
                        view: v,
                        why,
                        image,
                    }),
                    true,
                ) if v == view.number => Role::Failed {
                    view: v,
                    why,
                    image,
                },
                // A new view makes this machine primary again after its takeover failed: the
                // image it kept is still the state it had (a restore only reads it).
                (
                    Some(Role::Failed {
                        image: Some(kept), ..
                    }),
                    true,
                ) => {
                    let (run, image) = *kept;
                    tracing::warn!(service = %s.service, view = view.number, from_run = run, epoch = image.epoch, "taking over again from the image a failed takeover kept");
                    let survivors = view.backups.iter().cloned().collect();
                    self.start_primary(&target, Some((run, image)), survivors, None)
                }
                (Some(Role::Backup(b, gate)), true) => self.take_over(&target, &b, gate),
                (other, true) => {
                    if let Some(r) = other {
                        stop(r);
                    }
                    if target.fresh {
                        self.start_primary(&target, None, BTreeSet::new(), None)
                    } else {
                        Role::Failed {
                            view: view.number,
                            why: "assigned primary of a running service, but this machine holds no image of it".into(),
                            image: None,
                        }
                    }
                }
                (Some(Role::Backup(b, gate)), false) => {
                    b.enter_view(view.number);
                    Role::Backup(b, gate)
                }
                // Its takeover failed but it kept the image: a backup again, holding it (the
                // orchestrator keeps it in the next view as one that holds the state).
                (
                    Some(Role::Failed {
                        image: Some(kept), ..
                    }),
                    false,
                ) => {
                    let (run, image) = *kept;
                    tracing::warn!(service = %s.service, view = view.number, from_run = run, epoch = image.epoch, "backup again, with the image a failed takeover kept");
                    let gate = primary::open_gate(s.link_index)
                        .inspect_err(|e| tracing::warn!(service = %s.service, error = %e, "cannot prepare the output gate; a takeover will"))
                        .ok();
                    Role::Backup(
                        Backup::with_image(
                            &s.service,
                            view.number,
                            self.ctx.opts.queue_len,
                            run,
                            image,
                        ),
                        gate,
                    )
                }
                (other, false) => {
                    if let Some(r) = other {
                        stop(r);
                    }
                    let gate = primary::open_gate(s.link_index)
                        .inspect_err(|e| tracing::warn!(service = %s.service, error = %e, "cannot prepare the output gate; a takeover will"))
                        .ok();
                    let b = Backup::new(&s.service, view.number, self.ctx.opts.queue_len);
                    if let Some(f) = &self.ctx.opts.fault_corrupt_image {
                        b.corrupt_when_removed(f.clone());
                    }
                    Role::Backup(b, gate)
                }
            };
            self.lock().insert(s.service.clone(), next);
            self.changed(&s.service);
        }
    }

    /// A backup becomes primary: finish applying what it acknowledged, restore from the image.
    pub(crate) fn take_over(
        &self,
        t: &Target,
        b: &Arc<Backup>,
        gate: Option<Arc<tardi_netfilter::Gate>>,
    ) -> Role {
        let t0 = std::time::Instant::now();
        let (run, image) = match b.finish(t.view.number) {
            Ok(x) => x,
            Err(why) => {
                return Role::Failed {
                    view: t.view.number,
                    why,
                    image: None,
                };
            }
        };
        tracing::warn!(service = %t.name, view = t.view.number, from_run = run, epoch = image.epoch, drained_ms = t0.elapsed().as_millis() as u64, "taking over");
        // The view's backups are the survivors of the last active view: they hold every
        // decided checkpoint, so decisions wait for them from the start.
        let survivors = t.view.backups.iter().cloned().collect();
        self.start_primary(t, Some((run, image)), survivors, gate)
    }

    /// Starts the primary (fresh, or restored from `from`: a primary run's image); if that
    /// fails, a failed role that keeps the image.
    pub(crate) fn start_primary(
        &self,
        t: &Target,
        from: Option<(u64, tardi_checkpointer::store::Image)>,
        required: BTreeSet<String>,
        gate: Option<Arc<tardi_netfilter::Gate>>,
    ) -> Role {
        let (run, image) = match from {
            Some((r, i)) => (r, Some(i)),
            None => (0, None),
        };
        match Primary::start(self.ctx.clone(), t, image, required, gate) {
            Ok(p) => Role::Primary(p),
            Err(f) => {
                let why = error_text(&f.error);
                tracing::error!(service = %t.name, %why, kept_image = f.image.is_some(), "cannot start the primary");
                Role::Failed {
                    view: t.view.number,
                    why,
                    image: f.image.map(|i| Box::new((run, *i))),
                }
            }
        }
    }
}

/// An error with its causes, each once: the libraries' messages already quote their source
/// (`tardi-service`'s do), which `{:#}` would print again.
pub(crate) fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if out.contains(&c) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&c);
    }
    out
}

pub(crate) fn stop(r: Role) {
    match r {
        Role::Primary(p) => p.stop(),
        Role::Backup(b, _) => b.stop(),
        Role::Failed { .. } => {}
    }
}

/// The view a role was last given.
pub(crate) fn role_view(r: &Role) -> u64 {
    match r {
        Role::Primary(p) => p.report().view,
        Role::Backup(b, _) => b.report().view,
        Role::Failed { view, .. } => *view,
    }
}
