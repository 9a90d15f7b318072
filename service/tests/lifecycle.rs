//! A service's lifecycle without checkpoints: start from a manifest, what a `Service` reports,
//! the end of the service seen by `try_wait`, waiting for a forking service's tree to settle,
//! the sandbox-wide process check refusing a
//! snapshot before pausing anything, a refused restore leaving nothing behind, teardown.
//!
//! Needs root (namespaces, veth). This binary is also the sandboxes' init, hence its own `main`
//! (`harness = false`). The restores themselves are covered by the CLI's tests
//! (`tests/checkpoint_restore.rs`, `tests/bad_inputs.rs`, `tests/incremental.rs`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tardi_service::{Error, ExitInfo, Service};

fn main() {
    tardi_service::run_sandbox_init_if_asked();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("lifecycle: skipped (needs root)");
        return;
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let tests: [(&str, fn()); 5] = [
        ("start_report_and_teardown", start_report_and_teardown),
        (
            "wait_settled_waits_for_the_tree_to_stop_changing",
            wait_settled_waits_for_the_tree_to_stop_changing,
        ),
        (
            "try_wait_sees_the_service_exit",
            try_wait_sees_the_service_exit,
        ),
        (
            "snapshot_refuses_other_processes_before_pausing",
            snapshot_refuses_other_processes_before_pausing,
        ),
        (
            "restore_of_a_missing_file_starts_nothing",
            restore_of_a_missing_file_starts_nothing,
        ),
    ];
    for (name, test) in tests {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        println!("test {name} ...");
        test();
        println!("test {name} ... ok");
    }
}

/// A scratch directory (removed when dropped) and a unique sandbox name.
struct Scratch {
    dir: PathBuf,
    name: String,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let name = format!("svc-{tag}-{}", std::process::id() % 100000);
        let dir = std::env::temp_dir().join(format!("tardi-service-test-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir, name }
    }

    /// A manifest running `/bin/sh -c script`; its config with this test binary as init.
    fn service(&self, script: &str) -> (tardi_service::Manifest, tardi_service::SandboxConfig) {
        let path = self.dir.join("svc.manifest");
        std::fs::write(
            &path,
            format!(
                "libos.entrypoint = \"/bin/sh\"\nloader.argv = [\"sh\", \"-c\", {script:?}]\n\n[tardi]\nname = {:?}\n",
                self.name
            ),
        )
        .unwrap();
        let (m, warnings) = tardi_service::load_manifest(&path).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let mut config = tardi_service::config_for(&m);
        config.init_exe = Some(std::env::current_exe().unwrap());
        (m, config)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(Path::new(tardi_sandbox::RUN_ROOT).join(&self.name));
    }
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn start_report_and_teardown() {
    let s = Scratch::new("start");
    let (m, config) = s.service("exec sleep 60");
    let mut svc = Service::start(&m, &config).expect("start");
    assert_eq!(svc.name(), s.name);
    assert!(alive(svc.pid()));
    assert!(!svc.address().is_unspecified() && !svc.host_address().is_unspecified());
    let host_if = svc.host_if();
    assert_eq!(host_if, format!("td{}h", svc.link_index()), "{host_if}");
    assert!(Path::new("/sys/class/net").join(&host_if).exists());
    assert_eq!(svc.config().link_index, Some(svc.link_index()));
    assert_eq!(svc.handle().pid(), svc.pid());
    assert!(svc.log_path().exists());
    assert!(
        svc.other_processes().is_empty(),
        "{:?}",
        svc.other_processes()
    );
    // No writable mount of its own: only the sandbox's /dev/shm, which every service has.
    assert_eq!(svc.private_dirs(), vec!["/dev/shm".to_string()]);
    assert!(svc.try_wait().unwrap().is_none());
    let (pid, init) = (svc.pid(), svc.init_pid());
    svc.teardown().expect("teardown");
    assert!(!alive(pid) && !alive(init));
    assert!(!Path::new("/sys/class/net").join(&host_if).exists());
}

/// A service that forks two children, 200 ms apart, after it started: `wait_settled` returns
/// the tree with both, not before the second appeared plus the quiet time (the instance
/// starts tracking a fresh service from there: nginx forks its workers as it starts).
fn wait_settled_waits_for_the_tree_to_stop_changing() {
    let s = Scratch::new("settle");
    let (m, config) = s.service("sleep 0.2; sleep 60 & sleep 0.2; sleep 60 & wait");
    let svc = Service::start(&m, &config).expect("start");
    let t0 = Instant::now();
    let tree = svc.wait_settled(Duration::from_millis(300), Duration::from_secs(10));
    let took = t0.elapsed();
    assert_eq!(tree.len(), 3, "the shell and its two children: {tree:?}");
    assert_eq!(tree, svc.handle().tree_pids());
    assert!(
        took >= Duration::from_millis(600),
        "returned after {took:?}, before the second child and the quiet time"
    );
    svc.teardown().expect("teardown");
}

fn try_wait_sees_the_service_exit() {
    let s = Scratch::new("exit");
    let (m, config) = s.service("sleep 0.3; exit 3");
    let mut svc = Service::start(&m, &config).expect("start");
    let t0 = Instant::now();
    let exit = loop {
        if let Some(e) = svc.try_wait().unwrap() {
            break e;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no exit seen");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit, ExitInfo::Exited { code: 3 });
    // Ended is ended.
    assert_eq!(svc.try_wait().unwrap(), Some(exit));
    svc.teardown().expect("teardown of an ended service");
}

fn snapshot_refuses_other_processes_before_pausing() {
    let s = Scratch::new("others");
    // The subshell's `sleep` is orphaned at once: reparented to the sandbox's init.
    let (m, config) = s.service("(sleep 60 &); exec sleep 60");
    let svc = Service::start(&m, &config).expect("start");
    let t0 = Instant::now();
    let others = loop {
        let o = svc.other_processes();
        if !o.is_empty() || t0.elapsed() > Duration::from_secs(5) {
            break o;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(others.len(), 1, "{others:?}");
    assert!(!others.contains(&svc.pid()));
    let file = s.dir.join("never.tardi");
    let e = tardi_service::snapshot_to_file(svc.handle(), &file).unwrap_err();
    assert!(matches!(e, Error::OtherProcesses { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "checkpointing sandbox {:?}: cannot checkpoint: the sandbox runs other processes besides the service (host PIDs {})",
            s.name, others[0]
        )),
        "{msg}"
    );
    assert!(!file.exists());
    let missing = Path::new("/nonexistent-tardi-service-test/x.tardi");
    let e = tardi_service::snapshot_to_file(svc.handle(), missing).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot write /nonexistent-tardi-service-test/x.tardi: directory /nonexistent-tardi-service-test does not exist"
    );
    svc.teardown().expect("teardown");
    assert!(!alive(others[0]), "teardown left the orphan running");
}

fn restore_of_a_missing_file_starts_nothing() {
    let s = Scratch::new("missing");
    let file = s.dir.join("no-such.tardi");
    let Err(e) = Service::restore_file(&file, None) else {
        panic!("restored a missing file");
    };
    assert!(matches!(e, Error::Open { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with(&format!(
            "{} cannot be restored: reading the checkpoint:",
            file.display()
        )),
        "{e}"
    );
}
