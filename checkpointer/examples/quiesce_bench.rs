//! Quiescence benchmark (driven by `bench/quiesce.sh`): repeatedly stops every thread of a
//! running process with [`Stopped::stop`] (PTRACE_SEIZE + PTRACE_INTERRUPT of each thread, wait
//! for each interrupt stop) and resumes it with [`Stopped::resume`] (PTRACE_DETACH of each
//! thread), and prints the distribution of the stop time and of the whole stop + resume cycle.
//!
//! Usage: `quiesce_bench PID [ITERATIONS] [GAP_MS]` (defaults: 200 iterations, 2 ms between
//! cycles so the threads are back in their steady state before the next stop). Prints one JSON
//! object: {"pid","threads","iterations","stop_us":{min,median,p99,max},"cycle_us":{...},
//! "list_tids_us":{...}} (the last: one listing of /proc/PID/task, for the breakdown).

use std::time::{Duration, Instant};
use tardi_checkpointer::procfs::Proc;
use tardi_checkpointer::ptrace::Stopped;
use tardi_testkit::stats::rounded_rank;

fn summary(v: &mut [f64]) -> String {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| rounded_rank(v, p).expect("samples taken");
    format!(
        "{{\"min\":{:.1},\"median\":{:.1},\"p99\":{:.1},\"max\":{:.1}}}",
        v[0],
        q(0.5),
        q(0.99),
        v[v.len() - 1]
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!("usage: quiesce_bench PID [ITERATIONS] [GAP_MS]");
        std::process::exit(2);
    }
    let pid: i32 = args[0].parse().expect("PID");
    let iters: usize = args.get(1).map_or(200, |s| s.parse().expect("ITERATIONS"));
    let gap = Duration::from_millis(args.get(2).map_or(2, |s| s.parse().expect("GAP_MS")));
    let (mut stop_us, mut cycle_us) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    let mut threads = 0;
    // Opened once, as a checkpointer keeps it for the life of the service.
    let proc = Proc::open(pid).unwrap_or_else(|e| {
        eprintln!("cannot open /proc/{pid}: {e}");
        std::process::exit(1);
    });
    for i in 0..iters {
        let t0 = Instant::now();
        let st = match Stopped::stop(&proc) {
            Ok(st) => st,
            Err(e) => {
                eprintln!("iteration {i}: stop failed: {e}");
                std::process::exit(1);
            }
        };
        let t_stop = t0.elapsed();
        threads = st.tids.len();
        if let Err(e) = st.resume() {
            eprintln!("iteration {i}: resume failed: {e}");
            std::process::exit(1);
        }
        let t_cycle = t0.elapsed();
        stop_us.push(t_stop.as_secs_f64() * 1e6);
        cycle_us.push(t_cycle.as_secs_f64() * 1e6);
        std::thread::sleep(gap);
    }
    // For the breakdown: one listing of /proc/PID/task, of which every stop does at least two
    // (the threads, then a rescan that finds no new one).
    let mut list_us = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        let _ = proc.tids();
        list_us.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "{{\"pid\":{pid},\"threads\":{threads},\"iterations\":{iters},\"stop_us\":{},\"cycle_us\":{},\"list_tids_us\":{}}}",
        summary(&mut stop_us),
        summary(&mut cycle_us),
        summary(&mut list_us)
    );
}
