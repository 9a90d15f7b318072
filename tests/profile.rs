//! `tardi profile`: the checkpoint-size profiler, driven as a user would, on the dirtier test
//! program (`tests/programs/dirtier.c`, which writes one byte per page at a fixed rate).
//! Timing on a 2-core machine is noisy: the checks compare ratios with loose bounds, never
//! absolute times.

mod common;

use common::programs;
use common::tardi::{Scratch, tardi};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A manifest running dirtier (16 MiB, `rate` MB/s) with its UDP port declared.
fn dirtier_manifest(dir: &Path, tag: &str, rate: &str) -> (PathBuf, String) {
    let bin = programs::build("dirtier");
    let name = format!("prof-{tag}-{}", std::process::id() % 10000);
    let text = format!(
        "libos.entrypoint = {bin:?}\n\
         loader.argv = [\"dirtier\", \"--port\", \"7100\", \"--mb\", \"16\", \"--rate-mbps\", \"{rate}\"]\n\n\
         [tardi]\nname = \"{name}\"\nports = [\"udp:7100\"]\n"
    );
    let p = dir.join(format!("{name}.manifest"));
    std::fs::write(&p, text).unwrap();
    (p, name)
}

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `tardi ARGS` to completion (killed after `timeout`), output through files.
fn run(dir: &Path, args: &[&str], timeout: Duration) -> Outcome {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (out, err) = (dir.join(format!("out{n}")), dir.join(format!("err{n}")));
    let mut child = Command::new(tardi())
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            // SAFETY: SIGTERM to our own child; tardi tears its sandbox down on it.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let o = Outcome {
        code: status.and_then(|s| s.code()),
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
    };
    assert!(
        status.is_some(),
        "tardi {args:?} still ran after {timeout:?}\nstdout:\n{}\nstderr:\n{}",
        o.stdout,
        o.stderr
    );
    o
}

/// `tardi profile MANIFEST ARGS --json` that must succeed: (per-epoch objects, summary).
fn profile_json(dir: &Path, manifest: &Path, args: &[&str]) -> (Vec<Value>, Value) {
    let mut all = vec!["profile", manifest.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let o = run(dir, &all, Duration::from_secs(60));
    assert_eq!(
        o.code,
        Some(0),
        "tardi {all:?} failed\nstdout:\n{}\nstderr:\n{}",
        o.stdout,
        o.stderr
    );
    let values: Vec<Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l:?}")))
        .collect();
    let (summary, epochs) = values.split_last().expect("no output");
    assert_eq!(summary["summary"], true, "last line is not the summary");
    assert!(epochs.iter().all(|e| e.get("summary").is_none()));
    (epochs.to_vec(), summary.clone())
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing or not an integer in {v}"))
}

/// A profile with `--verify` under a load: verified, and the load wrote (else it proves little).
fn assert_verified_under_load(epochs: &[Value], s: &Value) {
    assert_eq!(s["verified"], true, "verification failed: {s}");
    let dirty: u64 = epochs.iter().map(|e| u(e, "dirty_pages")).sum();
    assert!(dirty > 1000, "the load wrote only {dirty} pages: {s}");
}

#[test]
fn profile_json_totals_rates_and_verify() {
    let scratch = Scratch::new("profile-json");
    let (manifest, _) = dirtier_manifest(&scratch.0, "json", "10");
    let (epochs, s) = profile_json(
        &scratch.0,
        &manifest,
        &["--duration", "2s", "--interval", "20ms", "--verify"],
    );
    assert!(
        epochs.len() >= 20,
        "only {} epochs in 2 s at 20 ms",
        epochs.len()
    );
    assert_eq!(u(&s, "epochs"), epochs.len() as u64);
    for (i, e) in epochs.iter().enumerate() {
        assert_eq!(u(e, "epoch"), i as u64 + 1, "epochs out of order");
        for key in [
            "interval_us",
            "pause_us",
            "encoded_bytes",
            "time_us",
            "hot_pages",
            "zero_pages",
            "twin_bytes",
        ] {
            u(e, key);
        }
        assert_eq!(
            u(e, "raw_bytes"),
            (u(e, "dirty_pages") + u(e, "fresh_pages")) * 4096,
            "raw_bytes of {e}"
        );
    }
    let total = |key: &str| epochs.iter().map(|e| u(e, key)).sum::<u64>();
    for key in ["raw_bytes", "encoded_bytes", "dirty_pages", "fresh_pages"] {
        assert_eq!(u(&s, key), total(key), "summary {key} is not the sum");
    }
    let span = total("interval_us") + total("pause_us");
    assert_eq!(u(&s, "span_us"), span);
    assert!(u(&s, "encoded_bytes") <= u(&s, "raw_bytes"));
    assert!(u(&s, "full_bytes") >= 16 << 20, "full checkpoint: {s}");

    // Dirty pages match the program's rate (10 MB/s) over the time the epochs cover.
    let expected_pages = 10e6 * (span as f64 / 1e6) / 4096.0;
    let ratio = total("dirty_pages") as f64 / expected_pages;
    assert!(
        (1.0 / 3.0..3.0).contains(&ratio),
        "{} dirty pages in {span} µs, expected about {expected_pages:.0} (ratio {ratio:.2})",
        total("dirty_pages")
    );
    let rate = s["dirty_rate_bytes_per_s"].as_f64().unwrap();
    let want = total("raw_bytes") as f64 / (span as f64 / 1e6);
    assert!((rate - want).abs() <= want * 1e-6 + 1.0, "{rate} vs {want}");

    for key in ["interval_us", "pause_us", "dirty_pages", "encoded_bytes"] {
        let p = &s["percentiles"][key];
        let (a, b, c, d) = (u(p, "p50"), u(p, "p90"), u(p, "p99"), u(p, "max"));
        assert!(a <= b && b <= c && c <= d, "{key} percentiles: {p}");
        assert_eq!(d, epochs.iter().map(|e| u(e, key)).max().unwrap());
    }
    assert_eq!(u(&s, "link_bandwidth_bps"), 1_000_000_000);
    assert_eq!(s["good"], true, "{s}");
    assert!(
        s["verdict"].as_str().unwrap().starts_with("good candidate"),
        "{s}"
    );
    assert_eq!(s["verified"], true, "verification failed: {s}");
}

#[test]
fn profile_writes_plots() {
    let scratch = Scratch::new("profile-plots");
    let (manifest, _) = dirtier_manifest(&scratch.0, "plots", "10");
    let out = scratch.0.join("plots");
    let (epochs, s) = profile_json(
        &scratch.0,
        &manifest,
        &[
            "--duration",
            "1500ms",
            "--interval",
            "25ms",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(!epochs.is_empty());
    for stem in ["checkpoint-size", "interval-cdf", "pause-cdf"] {
        let png = std::fs::read(out.join(format!("{stem}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{stem}.png");
        assert!(png.len() > 1024, "{stem}.png is {} bytes", png.len());
        let svg = std::fs::read_to_string(out.join(format!("{stem}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<text"),
            "{stem}.svg"
        );
        assert!(svg.len() > 1024, "{stem}.svg is {} bytes", svg.len());
    }
    let listed: Vec<Value> =
        serde_json::from_slice(&std::fs::read(out.join("epochs.json")).unwrap()).unwrap();
    assert_eq!(listed, epochs);
    let written: Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(written, s);
}

#[test]
fn profile_verdict() {
    let scratch = Scratch::new("profile-verdict");
    // An idle service: good on the default 1 Gbit/s link.
    let (idle, _) = dirtier_manifest(&scratch.0, "idle", "0");
    let (_, s) = profile_json(&scratch.0, &idle, &["--duration", "1s"]);
    assert_eq!(s["good"], true, "{s}");
    let v = s["verdict"].as_str().unwrap();
    assert!(v.starts_with("good candidate: checkpoints need"), "{v}");
    assert!(v.contains("1 Gbit/s"), "{v}");

    // 100 MB/s of writes, every page changing each lap, on a 1 Mbit/s link: poor. The
    // verdict needs a few epochs to rate: on a loaded machine one second once held a single
    // 1.7 s epoch (its pause alone 170 ms), and under a CPU hog on each core five runs of a
    // second held two each (pauses of 235-458 ms), so a run with fewer than three is run
    // again, twice as long each time (1, 2, 4, 8, 16 s).
    let (busy, _) = dirtier_manifest(&scratch.0, "busy", "100");
    let mut runs = 0;
    let s = loop {
        let secs = format!("{}s", 1u32 << runs);
        let (_, s) = profile_json(
            &scratch.0,
            &busy,
            &[
                "--duration",
                &secs,
                "--link-bandwidth",
                "1Mbit/s",
                "--cap-pages",
                "0",
            ],
        );
        runs += 1;
        if u(&s, "epochs") >= 3 || runs == 5 {
            break s;
        }
    };
    assert!(
        u(&s, "epochs") >= 3,
        "five runs of 1 to 16 s, none with three epochs: {s}"
    );
    assert_eq!(u(&s, "link_bandwidth_bps"), 1_000_000);
    assert_eq!(s["good"], false, "{s}");
    assert!(s["link_fraction"].as_f64().unwrap() > 0.4, "{s}");
    let v = s["verdict"].as_str().unwrap();
    assert!(
        v.starts_with("poor candidate") && v.contains("1 Mbit/s") && v.contains("above 40%"),
        "{v}"
    );
}

#[test]
fn profile_load_command() {
    let scratch = Scratch::new("profile-load");
    let (manifest, _) = dirtier_manifest(&scratch.0, "load", "1");
    let addr_file = scratch.0.join("address");
    let pid_file = scratch.0.join("pid");
    // A sleep with an argument no other process has, to find leftovers.
    let marker = format!("30.{}", std::process::id());
    let load = format!(
        "sh -c \"echo {{address}} > {}; echo \\$\\$ > {}; sleep {marker}\"",
        addr_file.display(),
        pid_file.display()
    );
    let (_, s) = profile_json(
        &scratch.0,
        &manifest,
        &["--duration", "1s", "--load", &load],
    );
    let address = std::fs::read_to_string(&addr_file).expect("the load command ran");
    assert_eq!(address.trim(), s["address"].as_str().unwrap());
    assert!(address.trim().parse::<std::net::Ipv4Addr>().is_ok());
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Gone once profile has exited (the shells are reaped by init: allow a moment).
    let sleeping = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .any(|c| c.split(|&b| b == 0).any(|a| a == marker.as_bytes()))
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while (Path::new(&format!("/proc/{pid}")).exists() || sleeping()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the load's shell {pid} outlived tardi profile"
    );
    assert!(!sleeping(), "the load's sleep outlived tardi profile");
}

#[test]
fn profile_bad_arguments_exit_2() {
    let scratch = Scratch::new("profile-args");
    let m = scratch.0.join("none.manifest");
    let m = m.to_str().unwrap();
    for bad in [
        &["--duration", "soon"][..],
        &["--duration", "0s"],
        &["--link-bandwidth", "fast"],
        &["--link-bandwidth", "1GB/s"],
        &["--codec", "lz4"],
        &["--interval", "0"],
        &["--cap-pages", "-1"],
    ] {
        let mut args = vec!["profile", m];
        args.extend_from_slice(bad);
        let o = run(&scratch.0, &args, Duration::from_secs(10));
        assert_eq!(o.code, Some(2), "{bad:?}: {}", o.stderr);
        assert!(o.stderr.contains("error"), "{bad:?}: {}", o.stderr);
    }
    let help = run(&scratch.0, &["profile", "--help"], Duration::from_secs(10));
    assert_eq!(help.code, Some(0));
    for want in ["40%", "--load", "{address}", "redis-benchmark", "--verify"] {
        assert!(help.stdout.contains(want), "help lacks {want:?}");
    }
}

/// Redis from Debian, unmodified, under load, with the mprotect + SIGSEGV tracker (the agent
/// serves every read, write wait and allocation call Redis makes): `--verify` rebuilds the
/// chain's image and restores it, and both must equal the held live process byte for byte.
/// Redis must survive (a crash ends the profile with an error) and the load must have written.
#[test]
fn profile_redis_under_the_mprotect_tracker_verifies() {
    let scratch = Scratch::new("profile-redis-mp");
    let manifest = common::programs::workspace_root().join("gramine-manifests/redis.manifest");
    let out = scratch.0.join("load.out");
    // The load is stopped when the profile ends: some of its tests complete, and none may fail.
    let load = format!(
        "sh -c \"redis-benchmark -h {{address}} -t set,get,incr,lpush -r 100000 -n 20000 -q > {} 2>&1\"",
        out.display()
    );
    let (epochs, s) = profile_json(
        &scratch.0,
        &manifest,
        &[
            "--tracker",
            "mprotect",
            "--duration",
            "6s",
            "--verify",
            "--load",
            &load,
        ],
    );
    assert_verified_under_load(&epochs, &s);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let done = text.matches("requests per second").count();
    assert!(
        done >= 1 && !text.contains("Error") && !text.contains("rror:"),
        "redis-benchmark against the tracked Redis:\n{text}"
    );
}

/// Redis under load with the encoding on a budget (`--encode-budget 2`: it runs at nice 10 after
/// each resume and the next epoch waits for it): the chain still rebuilds the held live process
/// byte for byte, through `--verify`'s image and its restore, and every epoch says how its
/// encoding went.
#[test]
fn profile_redis_with_an_encode_budget_verifies() {
    let scratch = Scratch::new("profile-redis-budget");
    // Its own name and data directory: the other Redis profile may run at the same time.
    let shipped = common::programs::workspace_root().join("gramine-manifests/redis.manifest");
    let data = scratch.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let name = format!("redis-budget-{}", std::process::id());
    let text = std::fs::read_to_string(shipped).unwrap();
    assert!(
        text.contains("name = \"redis\""),
        "shipped manifest changed shape"
    );
    let text = text
        .replace("name = \"redis\"", &format!("name = \"{name}\""))
        .replace(
            "file:/var/lib/tardi/redis/data",
            &format!("file:{}", data.display()),
        );
    let manifest = scratch.0.join(format!("{name}.manifest"));
    std::fs::write(&manifest, text).unwrap();
    let out = scratch.0.join("load.out");
    let load = format!(
        "sh -c \"redis-benchmark -h {{address}} -c 50 -t set,get,incr,lpush -r 100000 -d 64 -n 100000 -q > {} 2>&1\"",
        out.display()
    );
    let (epochs, s) = profile_json(
        &scratch.0,
        &manifest,
        &[
            "--encode-budget",
            "2",
            "--interval",
            "5ms",
            "--duration",
            "6s",
            "--verify",
            "--load",
            &load,
        ],
    );
    assert_verified_under_load(&epochs, &s);
    for e in &epochs {
        u(e, "encode_late_us");
        assert!(e["encode_overran"].is_boolean(), "{e}");
    }
    // It ran against the tracked Redis without an error. (Whether it finished its requests
    // within the six seconds depends on the machine: on a loaded one it had not.)
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let served = text.contains("requests per second")
        || text.split("rps=").skip(1).any(|r| {
            r.split_whitespace()
                .next()
                .and_then(|n| n.parse::<f64>().ok())
                > Some(0.0)
        });
    assert!(
        served && !text.contains("rror"),
        "redis-benchmark against the tracked Redis:\n{text}"
    );
}

/// The shipped `gramine-manifests/dirtier.manifest` (the Tardigrade §5.1 dirtying service at
/// 10 MB/s): the profile sees about that dirty rate.
#[test]
fn shipped_dirtier_manifest_profiles_at_its_rate() {
    programs::build("dirtier");
    let scratch = Scratch::new("profile-shipped-dirtier");
    let manifest = programs::workspace_root().join("gramine-manifests/dirtier.manifest");
    let (epochs, s) = profile_json(&scratch.0, &manifest, &["--duration", "2s"]);
    // How many epochs fit in 2 s depends on the machine's load: only that there are some.
    assert!(!epochs.is_empty(), "no incremental epoch in 2 s: {s}");
    let rate = s["dirty_rate_bytes_per_s"].as_f64().unwrap();
    assert!(
        (10e6 / 3.0..30e6).contains(&rate),
        "dirty rate {rate} B/s, expected about 10 MB/s: {s}"
    );
}

/// The Python key-value service (threads per connection, `poll` with a timeout, many
/// allocations) under the mprotect tracker with a client load that checks every reply:
/// `--verify` must pass and the client must see every value it stored.
#[test]
fn profile_python_service_under_the_mprotect_tracker_verifies() {
    let scratch = Scratch::new("profile-pykv-mp");
    let name = format!("pykv-mp-{}", std::process::id() % 10000);
    let manifest = common::tardi::kv_manifest(&scratch.0, &name);
    let result = scratch.0.join("load.result");
    let client = scratch.0.join("client.py");
    std::fs::write(
        &client,
        r#"import socket, sys, time
addr, out = sys.argv[1], sys.argv[2]
def conn():
    for _ in range(100):
        try:
            return socket.create_connection((addr, 8100), timeout=5)
        except OSError:
            time.sleep(0.05)
    raise SystemExit("no server")
ok = 0
try:
    for k in range(20):
        s = conn(); f = s.makefile("rw")
        for i in range(50):
            f.write(f"SET k{k}_{i} v-{k}-{i}\n"); f.flush()
            assert f.readline().strip() == "OK"
            f.write(f"GET k{k}_{i}\n"); f.flush()
            r = f.readline().strip()
            assert r == f"VAL v-{k}-{i}", r
            ok += 1
        s.close()
    open(out, "w").write(f"ok {ok}\n")
except Exception as e:
    open(out, "w").write(f"error after {ok}: {e!r}\n")
"#,
    )
    .unwrap();
    let load = format!(
        "python3 {} {{address}} {}",
        client.display(),
        result.display()
    );
    let (_, s) = profile_json(
        &scratch.0,
        &manifest,
        &[
            "--tracker",
            "mprotect",
            "--duration",
            "8s",
            "--verify",
            "--load",
            &load,
        ],
    );
    assert_eq!(s["verified"], true, "verification failed: {s}");
    let out = std::fs::read_to_string(&result).unwrap_or_else(|_| "no result".into());
    assert_eq!(out.trim(), "ok 1000", "the client: {out}");
}

/// A process tree (`forktree.c`: a main process, three children and a grandchild, in groups
/// and sessions of their own): `--verify` compares every process of the image built from the
/// chain with its live process, then a held restore of it with the live tree, process by
/// process (`docs/PROCESS-TREES.md`, phase 2).
#[test]
fn profile_a_process_tree_verifies() {
    let scratch = Scratch::new("profile-tree");
    let bin = programs::build("forktree");
    let name = format!("prof-tree-{}", std::process::id() % 10000);
    // The grandchild's port: profiling starts once the whole tree is there.
    let text = format!(
        "libos.entrypoint = {bin:?}\nloader.argv = [\"forktree\"]\n\n\
         [tardi]\nname = \"{name}\"\nports = [\"udp:7304\"]\n"
    );
    let manifest = scratch.0.join(format!("{name}.manifest"));
    std::fs::write(&manifest, text).unwrap();
    let (epochs, s) = profile_json(&scratch.0, &manifest, &["--duration", "1s", "--verify"]);
    assert!(epochs.len() >= 10, "only {} epochs in 1 s", epochs.len());
    assert_eq!(s["verified"], true, "verification failed: {s}");
}
