//! End-to-end tests of the sandbox. They need root (namespaces, veth pairs, mounts), `ip`,
//! `nsenter`, `/bin/sh` and `python3`; each test uses its own sandbox name so they can run in
//! parallel.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tardi_sandbox::{ExitInfo, Sandbox, SandboxConfig, SandboxError, Start};

/// A config named `<tag>-<pid>` that runs the test init binary.
fn config(tag: &str) -> SandboxConfig {
    let mut c = SandboxConfig::new(format!("sbxt-{tag}-{}", std::process::id()));
    c.init_exe = Some(PathBuf::from(env!("CARGO_BIN_EXE_sandbox-init-test")));
    c
}

fn sh(script: &str) -> Start {
    Start::Exec {
        path: "/bin/sh".into(),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
    }
}

/// Polls `path` until its content satisfies `pred` (at most 10 s); returns the content.
fn wait_for_file(path: &Path, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = std::fs::read_to_string(path).unwrap_or_default();
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {}; it holds:\n{s}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Tears the sandbox down and removes its run directory (the service log stays after a
/// teardown; the tests do not need it).
fn finish(sb: Sandbox) {
    let run_dir = sb.run_dir().to_path_buf();
    sb.teardown().unwrap();
    assert!(run_dir.join("service.log").exists());
    std::fs::remove_dir_all(run_dir).unwrap();
}

fn link_exists(ifname: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", ifname])
        .output()
        .unwrap()
        .status
        .success()
}

/// The NSpid numbers of a `/proc/<pid>/status` text.
fn nspids(status: &str) -> Vec<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| l.split_whitespace().map(|p| p.parse().unwrap()).collect())
        .unwrap_or_default()
}

#[test]
fn runs_a_shell_with_its_own_hostname_and_pid_namespace() {
    let cfg = config("hello");
    let sb = Sandbox::start(
        &cfg,
        sh("echo hello; hostname; echo pid=$$; grep NSpid /proc/self/status; echo done; sleep 100"),
    )
    .unwrap();
    let log = wait_for_file(sb.log_path(), |s| s.contains("done"));
    assert!(log.contains("hello\n"), "{log}");
    assert!(
        log.lines().any(|l| l == cfg.name),
        "hostname {} not in log:\n{log}",
        cfg.name
    );
    // The shell is the service's main process: PID 2 (the init is 1).
    assert!(log.contains("pid=2\n"), "{log}");
    // `grep` is the shell's child; the sandbox's own /proc shows only its sandbox PID.
    let grep_ns = nspids(&log);
    assert_eq!(grep_ns.len(), 1, "{log}");
    assert!(grep_ns[0] > 2 && grep_ns[0] < 100, "{log}");

    // Seen from the host, the service has two PIDs: the host's and the sandbox's.
    assert_eq!(sb.service_ns_pid(), 2);
    let service = sb.service_pid().expect("service pid");
    let status = std::fs::read_to_string(format!("/proc/{service}/status")).unwrap();
    assert_eq!(nspids(&status), vec![service, 2]);
    assert!(sb.pid_file().exists());
    assert_eq!(
        std::fs::read_to_string(sb.pid_file()).unwrap().trim(),
        sb.init_pid().to_string()
    );

    let host_if = sb.host_interface().to_string();
    let pid_file = sb.pid_file().to_path_buf();
    let root = sb.run_dir().join("root");
    assert!(link_exists(&host_if));
    finish(sb);
    assert!(!link_exists(&host_if), "{host_if} survived the teardown");
    assert!(!pid_file.exists());
    assert!(!root.exists());
    assert!(!Path::new(&format!("/proc/{service}")).exists());
}

#[test]
fn serves_http_to_the_host() {
    let mut cfg = config("http");
    // `http.server` reverse-resolves its bind address before listening. The sandbox has no route
    // beyond the host, so a query to the host's name server would only time out (seconds): give
    // the sandbox a resolver on its own loopback, which fails at once. (This also exercises a
    // file bind over a read-only root.)
    let resolv = std::env::temp_dir().join(format!("sbxt-resolv-{}.conf", std::process::id()));
    std::fs::write(&resolv, "nameserver 127.0.0.1\n").unwrap();
    cfg.mounts.push(tardi_manifest::Mount {
        path: "/etc/resolv.conf".into(),
        kind: tardi_manifest::MountKind::Bind {
            host_path: resolv.clone(),
            writable: false,
        },
    });
    let sb = Sandbox::start(
        &cfg,
        Start::Exec {
            path: "/usr/bin/python3".into(),
            argv: ["python3", "-m", "http.server", "8000", "--bind", "0.0.0.0"]
                .map(String::from)
                .to_vec(),
            env: vec![],
        },
    )
    .unwrap();
    assert_ne!(sb.address(), Ipv4Addr::UNSPECIFIED);
    let addr = SocketAddr::from((sb.address(), 8000));
    let deadline = Instant::now() + Duration::from_secs(5);
    let response = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(b"GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n")
                    .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).unwrap();
                break out;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot connect to {addr}: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    finish(sb);
    std::fs::remove_file(resolv).unwrap();
}

#[test]
fn missing_binary_is_an_error_and_leaves_nothing_behind() {
    let mut cfg = config("missing");
    // A subnet of its own, so that "no address of it is configured" is a precise check even with
    // other tests running in parallel. No traffic is sent.
    cfg.subnet = Ipv4Addr::new(10, 214, 0, 0);
    let err = Sandbox::start(
        &cfg,
        Start::Exec {
            path: "/nonexistent/service".into(),
            argv: vec![],
            env: vec![],
        },
    )
    .unwrap_err();
    assert!(matches!(err, SandboxError::ServiceExec { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/service") && msg.contains("No such file"),
        "{msg}"
    );

    let addrs = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .unwrap();
    let addrs = String::from_utf8_lossy(&addrs.stdout);
    assert!(
        !addrs.contains("10.214."),
        "a link was left behind:\n{addrs}"
    );
    assert!(!cfg.run_dir.join("init.pid").exists());
    assert!(!cfg.run_dir.join("lock").exists());
    assert!(!cfg.run_dir.exists(), "the run dir was left behind");
}

#[test]
fn missing_init_executable_is_an_error() {
    let mut cfg = config("noinit");
    cfg.init_exe = Some("/nonexistent/init".into());
    let err = Sandbox::start(&cfg, sh("true")).unwrap_err();
    assert!(matches!(err, SandboxError::InitExec { .. }), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/init"), "{err}");
    assert!(!cfg.run_dir.exists());
}

#[test]
fn bad_mount_is_reported_by_the_init() {
    let mut cfg = config("badmount");
    cfg.mounts.push(tardi_manifest::Mount {
        path: "/no/such/dir/in/root".into(),
        kind: tardi_manifest::MountKind::Tmpfs,
    });
    let err = Sandbox::start(&cfg, sh("true")).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, SandboxError::Init { .. }), "{err:?}");
    assert!(
        msg.contains("/no/such/dir/in/root") && msg.contains("read-only"),
        "{msg}"
    );
    assert!(!cfg.run_dir.exists());
}

#[test]
fn two_sandboxes_get_different_addresses() {
    let a = Sandbox::start(&config("two-a"), sh("sleep 100")).unwrap();
    let b = Sandbox::start(&config("two-b"), sh("sleep 100")).unwrap();
    assert_ne!(a.address(), b.address());
    assert_ne!(a.host_address(), b.host_address());
    assert_ne!(a.host_interface(), b.host_interface());
    for sb in [&a, &b] {
        let [x, y, z, w] = sb.address().octets();
        assert_eq!((x, y), (10, 213));
        assert_eq!(w % 4, 2);
        assert_eq!(Ipv4Addr::new(x, y, z, w - 1), sb.host_address());
    }
    finish(a);
    finish(b);
}

#[test]
fn a_second_start_with_the_same_name_is_refused() {
    let cfg = config("dup");
    let sb = Sandbox::start(&cfg, sh("sleep 100")).unwrap();
    let err = Sandbox::start(&cfg, sh("sleep 100")).unwrap_err();
    match err {
        SandboxError::AlreadyRunning { pid, .. } => assert_eq!(pid, Some(sb.init_pid())),
        other => panic!("expected AlreadyRunning, got {other:?}"),
    }
    // The refused start must not have disturbed the running one.
    assert!(sb.pid_file().exists());
    assert!(link_exists(sb.host_interface()));
    sb.teardown().unwrap();
    // And now the name is free again.
    finish(Sandbox::start(&cfg, sh("true")).unwrap());
}

#[test]
fn reports_exit_code_signal_and_kill() {
    let mut sb = Sandbox::start(&config("exit"), sh("exit 3")).unwrap();
    assert_eq!(sb.wait_exit().unwrap(), ExitInfo::Exited { code: 3 });
    assert_eq!(sb.try_wait().unwrap(), Some(ExitInfo::Exited { code: 3 }));
    finish(sb);

    // SIGTERM to the init is forwarded to the service (`exec` so the shell is the sleep).
    let mut sb = Sandbox::start(&config("term"), sh("exec sleep 100")).unwrap();
    assert_eq!(sb.try_wait().unwrap(), None);
    // SAFETY: sending a signal to our own child.
    assert_eq!(unsafe { libc::kill(sb.init_pid(), libc::SIGTERM) }, 0);
    assert_eq!(
        sb.wait_exit().unwrap(),
        ExitInfo::Signaled {
            signal: libc::SIGTERM,
            core_dumped: false
        }
    );
    finish(sb);

    let mut sb = Sandbox::start(&config("kill"), sh("sleep 100")).unwrap();
    let service = sb.service_pid().unwrap();
    sb.kill().unwrap();
    assert_eq!(
        sb.wait_exit().unwrap(),
        ExitInfo::InitKilled {
            signal: libc::SIGKILL
        }
    );
    assert!(
        !Path::new(&format!("/proc/{service}")).exists(),
        "service survived its init"
    );
    finish(sb);
}

#[test]
fn mounts_are_read_only_and_tmpfs_is_writable() {
    let mut cfg = config("mounts");
    let host_dir = std::env::temp_dir().join(format!("sbxt-rw-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&host_dir);
    cfg.mounts = vec![
        tardi_manifest::Mount {
            path: "/".into(),
            kind: tardi_manifest::MountKind::Bind {
                host_path: "/".into(),
                writable: false,
            },
        },
        // Sorted after "/" although listed first here.
        tardi_manifest::Mount {
            path: "/tmp".into(),
            kind: tardi_manifest::MountKind::Tmpfs,
        },
        tardi_manifest::Mount {
            path: "/tmp/state".into(),
            kind: tardi_manifest::MountKind::Bind {
                host_path: host_dir.clone(),
                writable: true,
            },
        },
    ];
    cfg.mounts.swap(0, 1);
    let sb = Sandbox::start(
        &cfg,
        sh(
            "touch /etc/x 2>/dev/null && echo etc-writable; echo ok > /tmp/t && echo tmp-writable; \
            echo kept > /tmp/state/f && echo state-writable; ls /dev; echo done; sleep 100",
        ),
    )
    .unwrap();
    let log = wait_for_file(sb.log_path(), |s| s.contains("done"));
    assert!(!log.contains("etc-writable"), "{log}");
    assert!(log.contains("tmp-writable"), "{log}");
    assert!(log.contains("state-writable"), "{log}");
    for dev in ["null", "zero", "urandom", "shm", "fd", "stdout"] {
        assert!(log.lines().any(|l| l == dev), "/dev/{dev} missing:\n{log}");
    }
    finish(sb);
    assert_eq!(
        std::fs::read_to_string(host_dir.join("f")).unwrap(),
        "kept\n"
    );
    std::fs::remove_dir_all(&host_dir).unwrap();
}

#[test]
fn restore_gets_the_requested_pid_and_fds() {
    let out_path = std::env::temp_dir().join(format!("sbxt-restore-{}.out", std::process::id()));
    let out = std::fs::File::create(&out_path).unwrap();
    let payload =
        b"/bin/sh\0-c\0grep NSpid /proc/$$/status; echo restored; exec sleep 100".to_vec();
    let sb = Sandbox::start(
        &config("restore"),
        Start::Restore {
            pid: 42,
            payload,
            fds: vec![out.as_raw_fd()],
        },
    )
    .unwrap();
    drop(out);
    assert_eq!(sb.service_ns_pid(), 42);
    let text = wait_for_file(&out_path, |s| s.contains("restored"));
    // Inside, the sandbox's /proc shows the sandbox PID only.
    assert_eq!(nspids(&text), vec![42], "{text}");
    // From the host: the host PID, then 42.
    let service = sb.service_pid().expect("service pid");
    let status = std::fs::read_to_string(format!("/proc/{service}/status")).unwrap();
    assert_eq!(nspids(&status), vec![service, 42]);
    finish(sb);
    std::fs::remove_file(&out_path).unwrap();
}
