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

/// A service whose first view was active has state: its primary no longer starts it from its
/// manifest, even in that same view (a whole-cluster power cut brought its primary back with
/// nothing, and it served an empty redis under view 1 before: `tests/cluster_power_cut.rs`).
#[test]
fn a_service_that_was_active_never_starts_fresh_again() {
    let (mut v, alive) = cluster(3);
    deploy(&mut v, &alive, 1);
    assert!(v.services["redis"].starts_fresh(), "deployed, never active");
    activate_latest(&mut v);
    let s = &v.services["redis"];
    assert!(
        latest(&v).fresh && latest(&v).active,
        "the view itself stays as proposed"
    );
    assert!(!s.starts_fresh(), "active once: it has state");
}
