//! `tardi profile MANIFEST`: runs a service in a sandbox and takes an incremental checkpoint
//! every epoch without replicating it, optionally under load, then reports what replication would
//! cost (sizes, pauses, rates, a verdict) and can draw plots and verify the checkpoints.
//!
//! This module is the command (the epoch loop, what it prints when); the jobs around it:
//! `load` (readiness and the `--load` command), `stats` (records, percentiles, summary, verdict),
//! `units` (number formatting), `report` (the summary and progress for people), `verify`
//! (`--verify`), `plot` (`--out`: data files and plots).

mod load;
mod plot;
mod report;
mod stats;
mod units;
mod verify;

use crate::cli::ProfileArgs;
use crate::signals::{block_signals, wait_signal};
use anyhow::{Context, anyhow, bail};
use load::{Load, wait_ready};
use plot::{load_font, write_outputs};
use report::{Progress, print_summary};
use stats::{Rec, record, summarize};
use std::io::Write;
use std::time::{Duration, Instant};
use tardi_checkpointer::epoch::{EpochConfig, Epochs};
use tardi_checkpointer::store::Image;
use tardi_manifest::Manifest;
use tardi_service::Service;
use units::{fmt_bytes, fmt_us};
use verify::verify;

/// How profiling ended.
enum Stop {
    Duration,
    Signal(i32),
    Exited(String),
}

impl Stop {
    fn describe(&self) -> String {
        match self {
            Stop::Duration => "duration".into(),
            Stop::Signal(s) => format!("signal {s}"),
            Stop::Exited(e) => e.clone(),
        }
    }
}

/// The manifest's epoch settings ([`tardi_service::epoch_config`]) with this command's flags on
/// top. A profile runs without backups, so nothing is released for the schedule to follow, and
/// nothing checks a divergence digest: both are off.
fn epoch_config(a: &ProfileArgs, m: &Manifest) -> EpochConfig {
    // Private directories are set from the sandbox's config once it is built.
    let base = tardi_service::epoch_config(m, Vec::new());
    let interval = match a.interval {
        Some(d) => d.max(Duration::from_micros(1)),
        None => base.interval,
    };
    EpochConfig {
        interval,
        min_interval: base.min_interval.min(interval),
        cap_pages: a.cap_pages.unwrap_or(base.cap_pages),
        hot_epochs: a.hot_epochs.unwrap_or(base.hot_epochs),
        codec: a.codec,
        twin_budget: (a.twin_budget as usize).saturating_mul(1 << 20),
        encode_workers: a.encode_workers.max(1),
        tracker: a.tracker.unwrap_or(base.tracker),
        precopy: !a.no_precopy,
        precopy_min_pages: a.precopy_min_pages.unwrap_or(base.precopy_min_pages),
        encode_budget: a.encode_budget.unwrap_or(base.encode_budget),
        follow_releases: false,
        follow_min: EpochConfig::default().follow_min,
        after_release: Duration::ZERO,
        scrub: None,
        ..base
    }
}

pub fn profile(a: ProfileArgs) -> anyhow::Result<()> {
    let signals = block_signals();
    let m = crate::output::load_manifest(&a.manifest)?;
    let mut cfg = epoch_config(&a, &m);
    // Fail on what can be checked before the service runs.
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the output directory {}", dir.display()))?;
        load_font()?;
    }
    let mut svc = Service::start(&m, &tardi_service::config_for(&m))?;
    // The same private directories a snapshot of this sandbox would walk.
    cfg.private_dirs = svc.private_dirs();
    let result = profile_in(&a, &m, &cfg, &mut svc, &signals);
    let torn = svc.teardown();
    let outcome = result?;
    torn.context("tearing the sandbox down")?;
    outcome
}

/// Everything after the sandbox started. The outer `Result` is an error of the run; the inner
/// one, a failure found after the report was made (failed verification, service exit).
fn profile_in(
    a: &ProfileArgs,
    m: &Manifest,
    cfg: &EpochConfig,
    sandbox: &mut Service,
    signals: &libc::sigset_t,
) -> anyhow::Result<anyhow::Result<()>> {
    let name = m.tardi.name.clone();
    let pid = sandbox.pid();
    let address = sandbox.address();

    if let Some(stop) = wait_ready(sandbox, m, signals)? {
        bail!(
            "the service ended before profiling began: {}",
            stop.describe()
        );
    }
    let mut load = match &a.load {
        Some(cmd) => {
            let log = a.out.as_ref().map(|d| d.join("load.log"));
            Some(Load::start(cmd, address, log.as_deref())?)
        }
        None => None,
    };

    let t0 = Instant::now();
    let (mut ep, full, st0) =
        Epochs::start(pid, cfg.clone()).context("starting the epoch loop (full checkpoint)")?;
    let t0_done = Instant::now();
    let mut image = if a.verify {
        Some(Image::from_full(&full).context("building the image from the full checkpoint")?)
    } else {
        None
    };
    drop(full);

    let human = !a.json;
    if human {
        println!(
            "profiling {name:?} (address {address}, pid {pid}) for {:.1} s: epoch {} ms (min {} ms), cap {} pages, hot after {} epochs, codec {}{}",
            a.duration.as_secs_f64(),
            cfg.interval.as_secs_f64() * 1e3,
            cfg.min_interval.as_secs_f64() * 1e3,
            cfg.cap_pages,
            cfg.hot_epochs,
            cfg.codec,
            if a.load.is_some() { ", under load" } else { "" }
        );
        println!(
            "full checkpoint: {} in a {} pause (took {})",
            fmt_bytes(st0.encoded_bytes as f64),
            fmt_us(st0.pause_us as f64),
            fmt_us((t0_done - t0).as_micros() as f64)
        );
    }
    let mut progress = Progress::new(human, cfg.interval);
    let mut recs: Vec<Rec> = Vec::new();
    let mut held = false;
    let stop = loop {
        if let Some(sig) = wait_signal(signals, Duration::ZERO) {
            break Stop::Signal(sig);
        }
        if let Some(exit) = sandbox.try_wait().context("watching the sandbox")? {
            break Stop::Exited(exit.to_string());
        }
        let elapsed = t0_done.elapsed();
        if elapsed >= a.duration {
            break Stop::Duration;
        }
        let last = elapsed + cfg.interval >= a.duration;
        let hold = last && a.verify;
        let n = recs.len() + 1;
        let r = if hold { ep.next_held() } else { ep.next() };
        let (ck, st) = match r {
            Ok(v) => v,
            Err(e) => {
                // A service that just ended makes the epoch fail: report that instead.
                if let Some(exit) = exited_soon(sandbox) {
                    break Stop::Exited(exit);
                }
                return Err(anyhow::Error::new(e).context(format!("epoch {n}")));
            }
        };
        record(&mut image, &mut recs, ck, st, t0_done, a.json)
            .with_context(|| format!("epoch {n}"))?;
        progress.epoch(recs.last().expect("just recorded"), a.duration);
        if hold {
            held = true;
        }
        if last {
            break Stop::Duration;
        }
    };
    progress.finish();

    // With --verify and profiling cut short, take the held epoch now.
    let mut verify_result: Option<Result<Vec<String>, String>> = None;
    if a.verify {
        if !held && !matches!(stop, Stop::Exited(_)) {
            match ep.next_held() {
                Ok((ck, st)) => {
                    record(&mut image, &mut recs, ck, st, t0_done, a.json)
                        .context("the last (held) epoch")?;
                    held = true;
                }
                Err(e) => {
                    verify_result = Some(Err(format!(
                        "the last (held) epoch failed: {}",
                        crate::output::describe(&anyhow::Error::new(e))
                    )))
                }
            }
        }
        // The load has nothing to do with a stopped service.
        if let Some(l) = &mut load {
            l.stop();
        }
        if held {
            let img = image.as_ref().expect("kept with --verify");
            verify_result =
                Some(verify(pid, img, sandbox.config()).map_err(|e| crate::output::describe(&e)));
        } else if verify_result.is_none() {
            verify_result = Some(Err(format!(
                "the service ended before the final epoch ({})",
                stop.describe()
            )));
        }
    }
    ep.stop();
    drop(image);
    if let Some(l) = &mut load {
        l.stop();
    }

    let mut s = summarize(
        &name,
        address,
        &stop.describe(),
        cfg,
        &st0,
        &recs,
        a.link_bandwidth,
    );
    if let Some(v) = &verify_result {
        verify::outcome_into(v, &mut s);
    }
    if a.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        print_summary(&s, true);
    }
    let _ = std::io::stdout().flush();

    if let Some(dir) = &a.out {
        write_outputs(dir, &s, &recs, cfg)?;
        if human {
            println!("plots and data in {}", dir.display());
        }
    }
    if s.verified == Some(false) {
        return Ok(Err(anyhow!(
            "verification failed: {}",
            s.verify_error.as_deref().unwrap_or("differences")
        )));
    }
    if let Stop::Exited(e) = &stop {
        return Ok(Err(anyhow!("the service ended during profiling: {e}")));
    }
    Ok(Ok(()))
}

/// After a failed epoch: how the service ended, if it did within 500 ms.
fn exited_soon(sandbox: &mut Service) -> Option<String> {
    for _ in 0..25 {
        if let Ok(Some(exit)) = sandbox.try_wait() {
            return Some(exit.to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}
