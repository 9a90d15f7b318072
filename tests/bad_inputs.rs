//! Bad inputs: every one gives a clear error (naming the offending key and line, path or
//! reason), a non-zero exit, and nothing is started or left behind — no sandbox run files
//! (`lock`, `init.pid`, `control.sock`, `root` in `/run/tardi/NAME`), no entry in
//! `tardi status`, no new `td<i>h` link, no checkpoint file. Where a snapshot is refused, the
//! service keeps running and answering.
//!
//! Links are not named after sandboxes and other tests (and other people's test runs) start
//! sandboxes concurrently, so a new `td<i>h` link only counts as left behind if it outlives a
//! grace period without belonging to a sandbox listed by `tardi status`.
//!
//! One file over a thousand lines: one binary, so the suite builds and links it once; each test
//! is a short case of the same pattern (a bad input, the error a user reads, nothing left
//! behind), and splitting by input would only add binaries.

mod common;

use common::programs;
use common::tardi::{Running, Scratch, manifest_for, tardi};
use std::collections::BTreeSet;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bound for a `tardi` command that must fail quickly.
const CMD_TIMEOUT: Duration = Duration::from_secs(30);
/// UDP port of `bad_resources` and `statemachine`.
const BAD_PORT: u16 = 7100;
const SM_PORT: u16 = 7000;

// ---------------------------------------------------------------------------------------------
// Running tardi with a bound.

#[derive(Debug)]
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `tardi ARGS` to completion, at most `CMD_TIMEOUT` (then SIGTERM, SIGKILL, and fail).
fn tardi_cmd(args: &[&str]) -> Outcome {
    let mut child = Command::new(tardi())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tardi");
    let pid = child.id() as i32;
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let errt = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CMD_TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`tardi {}` still running after {CMD_TIMEOUT:?} (it should have failed at once)",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    let stderr = errt.join().unwrap_or_default();
    Outcome {
        code: status.code(),
        stdout,
        stderr,
    }
}

/// Asserts a refusal: exit code 1, no `started` event, and stderr is one `tardi: error: ...`
/// message containing every one of `parts`.
fn assert_refused(out: &Outcome, parts: &[&str]) {
    assert_eq!(out.code, Some(1), "expected exit code 1: {out:?}");
    assert!(
        !out.stdout.contains("\"started\""),
        "something was started: {out:?}"
    );
    assert!(
        out.stderr.starts_with("tardi: error: "),
        "error message format: {out:?}"
    );
    for p in parts {
        assert!(
            out.stderr.contains(p),
            "the error must contain {p:?}; got:\n{}",
            out.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Nothing left behind.

/// `td<i>h` links on the host now.
fn links() -> BTreeSet<String> {
    std::fs::read_dir("/sys/class/net")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("td")
                .and_then(|r| r.strip_suffix('h'))
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
}

/// `tardi status --json`, one value per running sandbox.
fn status() -> Vec<serde_json::Value> {
    let out = tardi_cmd(&["status", "--json"]);
    assert_eq!(out.code, Some(0), "tardi status: {out:?}");
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The sandbox-side address of link `ifname` (host side + 1), if it has an address.
fn sandbox_addr_of(ifname: &str) -> Option<String> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "dev", ifname])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let inet = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?;
    let host: std::net::Ipv4Addr = inet.split('/').next()?.parse().ok()?;
    Some(std::net::Ipv4Addr::from(u32::from(host) + 1).to_string())
}

/// No link created since `before` stays around without belonging to a running sandbox.
fn assert_no_new_links(before: &BTreeSet<String>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let new: Vec<String> = links().difference(before).cloned().collect();
        if new.is_empty() {
            return;
        }
        let running: Vec<String> = status()
            .iter()
            .filter_map(|s| s["address"].as_str().map(str::to_string))
            .collect();
        let stray: Vec<&String> = new
            .iter()
            .filter(|l| sandbox_addr_of(l).is_none_or(|a| !running.contains(&a)))
            .collect();
        if stray.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "links left behind (not owned by any running sandbox): {stray:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// No run files of sandbox `name` and `tardi status` does not list it.
fn assert_not_running(name: &str) {
    let dir = Path::new("/run/tardi").join(name);
    for f in ["lock", "init.pid", "control.sock", "root"] {
        assert!(
            !dir.join(f).exists(),
            "{} was left behind",
            dir.join(f).display()
        );
    }
    let listed: Vec<_> = status().into_iter().filter(|s| s["name"] == name).collect();
    assert!(listed.is_empty(), "tardi status lists {name}: {listed:?}");
}

/// Everything [`assert_not_running`] and [`assert_no_new_links`] check.
fn assert_nothing_left(name: &str, links_before: &BTreeSet<String>) {
    assert_not_running(name);
    assert_no_new_links(links_before);
}

/// Removes what a test's own sandbox legitimately kept (its service log and run directory).
fn forget(name: &str) {
    let dir = Path::new("/run/tardi").join(name);
    // The log, and the link index the name keeps (sandbox/src/net.rs) — our names are unique
    // per test run, so keeping it would only hold an address forever.
    for f in ["service.log", "link-index"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let _ = std::fs::remove_dir(dir);
}

/// A sandbox name unique to this test process and `tag`.
fn unique(tag: &str) -> String {
    format!("bad-{tag}-{}", std::process::id())
}

// ---------------------------------------------------------------------------------------------
// Manifests.

/// Writes `text` as `<dir>/<file>` and runs `tardi run` on it; it must be refused with every one
/// of `parts` (use `{path}` for the manifest's path) and leave nothing behind.
fn run_refused(tag: &str, text: &str, parts: &[&str]) -> Outcome {
    let scratch = Scratch::new(&format!("bad-manifest-{tag}"));
    let path = scratch.0.join("service.manifest");
    std::fs::write(&path, text).unwrap();
    let links_before = links();
    let out = tardi_cmd(&["run", path.to_str().unwrap(), "--json"]);
    let p = path.display().to_string();
    let parts: Vec<String> = parts.iter().map(|s| s.replace("{path}", &p)).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    assert_refused(&out, &parts);
    let name = unique(tag);
    assert_nothing_left(&name, &links_before);
    // Never started: not even a run directory.
    let dir = Path::new("/run/tardi").join(&name);
    assert!(!dir.exists(), "{} was created", dir.display());
    out
}

#[test]
fn manifest_unknown_key_names_key_and_line() {
    let name = unique("unknown");
    let text = format!(
        "libos.entrypoint = \"/bin/true\"\n\n[tardi]\nname = \"{name}\"\nportz = [\"tcp:80\"]\n"
    );
    run_refused(
        "unknown",
        &text,
        &["{path}:5: unknown key 'tardi.portz' (did you mean 'tardi.ports'?)"],
    );
}

#[test]
fn manifest_unknown_top_level_key_names_key_and_line() {
    let name = unique("unknowntop");
    let text = format!(
        "libos.entrypoint = \"/bin/true\"\nloader.argz = [\"x\"]\n[tardi]\nname = \"{name}\"\n"
    );
    run_refused(
        "unknowntop",
        &text,
        &[
            "{path}:2: unknown key 'loader.argz'",
            "did you mean 'loader.argv'?",
        ],
    );
}

#[test]
fn manifest_toml_syntax_error_names_line() {
    let name = unique("syntax");
    let text = format!(
        "libos.entrypoint = \"/bin/true\"\n[tardi]\nname = \"{name}\"\nports = [\"tcp:80\"\n"
    );
    let out = run_refused("syntax", &text, &["{path}:4:", "TOML syntax error"]);
    assert!(
        !out.stderr.contains("Jinja"),
        "no template in this file: {}",
        out.stderr
    );
}

#[test]
fn manifest_missing_binary_names_path() {
    let name = unique("nobinary");
    let missing = format!("/nonexistent-tardi-test/{name}/server");
    let text =
        format!("# a comment\nlibos.entrypoint = \"{missing}\"\n[tardi]\nname = \"{name}\"\n");
    run_refused(
        "nobinary",
        &text,
        &[&format!(
            "{{path}}:2: 'libos.entrypoint': binary '{missing}' does not exist"
        )],
    );
}

#[test]
fn manifest_relative_missing_binary_names_resolved_path() {
    let name = unique("relbinary");
    let text = format!("libos.entrypoint = \"./no-such-server\"\n[tardi]\nname = \"{name}\"\n");
    let scratch_dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/tardi-test-scratch")
        .join(format!("bad-manifest-relbinary-{}", std::process::id()));
    let resolved = scratch_dir.join("no-such-server").display().to_string();
    run_refused(
        "relbinary",
        &text,
        &[
            &format!("binary '{resolved}' does not exist"),
            "'./no-such-server' is resolved against the manifest's directory",
        ],
    );
}

#[test]
fn manifest_non_executable_entrypoint_names_path() {
    let scratch = Scratch::new("bad-noexec-bin");
    let bin = scratch.0.join("server.sh");
    std::fs::write(&bin, "#!/bin/sh\nsleep 1000\n").unwrap();
    // 0644: readable, not executable.
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let name = unique("noexec");
    let text = format!(
        "libos.entrypoint = \"{}\"\n[tardi]\nname = \"{name}\"\n",
        bin.display()
    );
    run_refused(
        "noexec",
        &text,
        &[&format!(
            "{{path}}:1: 'libos.entrypoint': '{}' is not executable",
            bin.display()
        )],
    );
}

#[test]
fn manifest_entrypoint_directory_is_refused() {
    let name = unique("direntry");
    let text = format!("libos.entrypoint = \"/usr/bin\"\n[tardi]\nname = \"{name}\"\n");
    run_refused(
        "direntry",
        &text,
        &["{path}:1: 'libos.entrypoint': '/usr/bin' is not a regular file"],
    );
}

#[test]
fn manifest_bad_name_is_refused() {
    let scratch = Scratch::new("bad-manifest-badname");
    let path = scratch.0.join("service.manifest");
    for (i, bad) in [
        "Bad_Name",
        "-leading-dash",
        "",
        "a-name-that-is-far-too-long-for-tardi-0123456789",
    ]
    .iter()
    .enumerate()
    {
        std::fs::write(
            &path,
            format!("libos.entrypoint = \"/bin/true\"\n\n[tardi]\nname = {bad:?}\n"),
        )
        .unwrap();
        let links_before = links();
        let out = tardi_cmd(&["run", path.to_str().unwrap()]);
        assert_refused(
            &out,
            &[
                &format!("{}:4: invalid value for 'tardi.name'", path.display()),
                &format!("'{bad}' is not a valid service name"),
            ],
        );
        if !bad.is_empty() {
            assert!(
                !Path::new("/run/tardi").join(bad).exists(),
                "case {i}: a run directory was created"
            );
        }
        assert_no_new_links(&links_before);
    }
}

#[test]
fn manifest_missing_name_is_refused() {
    run_refused(
        "noname",
        "libos.entrypoint = \"/bin/true\"\n[tardi]\nports = [\"tcp:80\"]\n",
        &["{path}:2: missing required key 'tardi.name'"],
    );
}

#[test]
fn manifest_jinja_template_value_is_refused() {
    let name = unique("jinja");
    let text = format!(
        "libos.entrypoint = \"/bin/true\"\nloader.argv = [\"true\", \"{{{{ log_level }}}}\"]\n[tardi]\nname = \"{name}\"\n"
    );
    run_refused(
        "jinja",
        &text,
        &[
            "{path}:2: 'loader.argv[1]' contains an unrendered Jinja template",
            "gramine-manifest",
        ],
    );
}

#[test]
fn manifest_jinja_template_statement_is_a_syntax_error_with_a_hint() {
    let name = unique("jinjastmt");
    let text = format!(
        "{{% if debug %}}\nloader.log_level = \"debug\"\n{{% endif %}}\nlibos.entrypoint = \"/bin/true\"\n[tardi]\nname = \"{name}\"\n"
    );
    run_refused(
        "jinjastmt",
        &text,
        &[
            "{path}:1:",
            "TOML syntax error",
            "unrendered Jinja template",
        ],
    );
}

#[test]
fn manifest_that_does_not_exist_is_named() {
    let links_before = links();
    let path = format!("/nonexistent-tardi-test/{}.manifest", unique("nomanifest"));
    let out = tardi_cmd(&["run", &path]);
    assert_refused(
        &out,
        &[&format!(
            "{path}: cannot read manifest: No such file or directory"
        )],
    );
    assert_no_new_links(&links_before);
}

// ---------------------------------------------------------------------------------------------
// Snapshot.

#[test]
fn snapshot_of_a_sandbox_that_is_not_running() {
    let scratch = Scratch::new("bad-snap-none");
    let name = unique("notrunning");
    let file = scratch.0.join("x.tardi");
    let out = tardi_cmd(&["snapshot", &name, "-o", file.to_str().unwrap()]);
    assert_refused(&out, &[&format!("no running sandbox named \"{name}\"")]);
    assert!(!file.exists(), "a checkpoint file was written");
    assert_eq!(
        std::fs::read_dir(&scratch.0).unwrap().count(),
        0,
        "files were left in the output directory"
    );
    assert_not_running(&name);
}

/// A running `bad_resources MODE` (or `statemachine`) sandbox.
struct Svc {
    run: Running,
    name: String,
    scratch: Scratch,
    port: u16,
}

impl Svc {
    fn start(tag: &str, program: &str, args: &[&str], port: u16) -> Svc {
        let bin = programs::build(program);
        let scratch = Scratch::new(&format!("bad-svc-{tag}"));
        let name = unique(tag);
        let manifest = manifest_for(&scratch.0, &name, &bin, args);
        let run = Running::run(&manifest).unwrap_or_else(|e| panic!("tardi run {name}: {e}"));
        let svc = Svc {
            run,
            name,
            scratch,
            port,
        };
        programs::wait_ready(svc.addr(), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{} not ready: {e}\nlog: {}", svc.name, svc.log()));
        svc
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.run.address.into(), self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.run.log).unwrap_or_default()
    }

    fn ping(&self) -> String {
        programs::ping(self.addr(), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{} does not answer: {e}\nlog: {}", self.name, self.log()))
    }

    /// `tardi snapshot` into the scratch dir; returns the outcome and the file.
    fn snapshot(&self, file: &str) -> (Outcome, PathBuf) {
        let f = self.scratch.0.join(file);
        (
            tardi_cmd(&["snapshot", &self.name, "-o", f.to_str().unwrap(), "--json"]),
            f,
        )
    }

    fn stop(self) {
        let name = self.name.clone();
        let out = self.run.stop();
        assert!(
            out.contains("\"stopped\""),
            "{name} did not stop cleanly: {out}"
        );
        forget(&name);
    }
}

/// The service process is running normally: not stopped, not traced.
fn assert_untraced(pid: i32) {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("service {pid} gone: {e}"));
    let field = |k: &str| {
        st.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(str::trim)
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(
        field("TracerPid:"),
        "0",
        "service {pid} is still traced:\n{st}"
    );
    assert!(
        !field("State:").starts_with('t') && !field("State:").starts_with('T'),
        "service {pid} is stopped:\n{st}"
    );
}

/// Starts `bad_resources MODE`, checks that `tardi snapshot` is refused with every one of
/// `parts` (computed from the service's `pong` line), twice, and that the service keeps running
/// and answering. Returns the error message.
fn snapshot_refused(mode: &str, parts: impl Fn(&Svc, &str) -> Vec<String>) -> String {
    snapshot_refused_as(mode, mode, parts)
}

/// [`snapshot_refused`] with a sandbox name made from `tag` instead of `mode`.
fn snapshot_refused_as(tag: &str, mode: &str, parts: impl Fn(&Svc, &str) -> Vec<String>) -> String {
    let svc = Svc::start(tag, "bad_resources", &[mode], BAD_PORT);
    let pong = svc.ping();
    let n0: u64 = pong
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    let want = parts(&svc, &pong);
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    let mut message = String::new();
    for attempt in 0..2 {
        let (out, file) = svc.snapshot(&format!("{mode}-{attempt}.tardi"));
        assert_refused(&out, &want);
        assert!(
            out.stderr.contains(&format!(
                "checkpointing sandbox \"{}\": cannot checkpoint:",
                svc.name
            )),
            "the error should say which sandbox and that it cannot be checkpointed: {}",
            out.stderr
        );
        assert!(!file.exists(), "a checkpoint file was written");
        let names: Vec<_> = std::fs::read_dir(&svc.scratch.0)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| n.to_string_lossy().ends_with(".manifest")),
            "left in the output directory: {names:?}"
        );
        // Still running, untraced, answering — with its state intact.
        assert_untraced(svc.run.pid);
        let pong = svc.ping();
        let n: u64 = pong
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(n > n0, "ping counter did not advance: {pong}");
        message = out.stderr;
    }
    assert!(
        status().iter().any(|s| s["name"] == svc.name.as_str()),
        "tardi status lost {}",
        svc.name
    );
    svc.stop();
    message
}

#[test]
fn snapshot_refuses_a_descriptor_in_flight_and_the_service_keeps_running() {
    snapshot_refused("unixsock", |_, pong| {
        // pong N unixsock fds=3,4: the descriptor waits in 4's queue.
        let fd = pong
            .split("fds=")
            .nth(1)
            .and_then(|f| f.split(',').nth(1))
            .unwrap()
            .to_string();
        vec![format!(
            "file descriptor {fd}: a unix socket holds file descriptors or credentials in flight"
        )]
    });
}

/// A forked child is captured with its parent, descriptors they share included
/// (tests/process_tree.rs), but not yet an epoll instance they share: its interest list names
/// descriptor numbers of the process that added them.
#[test]
fn snapshot_refuses_an_epoll_instance_shared_with_a_child_and_the_service_keeps_running() {
    snapshot_refused("shared-epoll", |svc, pong| {
        // pong N shared-epoll child=C epoll=E
        let epoll = pong
            .split("epoll=")
            .nth(1)
            .and_then(|p| p.split_whitespace().next())
            .unwrap()
            .to_string();
        vec![format!(
            "descriptor {epoll} of process {} (host PID) is an epoll instance held by several \
             processes: shared epoll instances are not supported in a process tree yet",
            svc.run.pid
        )]
    });
}

/// A child that exited and was not reaped (a zombie) is captured with its wait status, but
/// one that dumped core is refused by name: a restore cannot recreate that status.
#[test]
fn snapshot_refuses_a_zombie_that_dumped_core_and_the_service_keeps_running() {
    snapshot_refused("zombie-core", |svc, pong| {
        assert!(
            pong.ends_with(&format!("code={}", libc::CLD_DUMPED)),
            "the child must have dumped core: {pong}"
        );
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", svc.run.pid)).unwrap();
        let child = children
            .split_whitespace()
            .next()
            .expect("the service has a zombie child")
            .to_string();
        vec![format!(
            "process {child} (host PID) exited and was not reaped yet with wait status 0x86 \
             (it dumped core): a restore cannot recreate that status"
        )]
    });
}

/// Shared memory is captured (tests/shared_memory.rs), and so is a file unlinked while mapped
/// shared (tests/multiprocessing.rs: Python's semaphores), but a private mapping of an unlinked
/// file is a deleted file's copy-on-write pages: no name to restore the file under.
#[test]
fn snapshot_refuses_a_private_mapping_of_an_unlinked_file_and_the_service_keeps_running() {
    snapshot_refused("unlinked-private", |_, pong| {
        // pong N unlinked-private shm=0x7f...
        let addr = pong.split("shm=").nth(1).unwrap().trim().to_string();
        vec![format!(
            "mapping at {addr} of a deleted file /dev/shm/bad-shm (deleted)"
        )]
    });
}

/// A process the service started but that is no longer its child (a double-forked daemon,
/// reparented to the sandbox's init) must be refused too: a restore would come back without it.
#[test]
fn snapshot_refuses_an_orphaned_grandchild() {
    snapshot_refused("orphan", |svc, _| {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", svc.run.pid)).unwrap();
        let init = stat
            .rsplit_once(") ")
            .unwrap()
            .1
            .split(' ')
            .nth(1)
            .unwrap()
            .to_string();
        let children =
            std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).unwrap();
        let me = svc.run.pid.to_string();
        let others: Vec<&str> = children.split_whitespace().filter(|p| *p != me).collect();
        assert_eq!(
            others.len(),
            1,
            "the grandchild, reparented to the sandbox init {init}: {children}"
        );
        vec![others[0].to_string()]
    });
}

/// A System V attachment is restored with `shmat` at its start: one whose first page was
/// unmapped is refused, naming the segment.
#[test]
fn snapshot_refuses_a_system_v_attachment_without_its_start() {
    snapshot_refused("sysv-tail", |_, pong| {
        // pong N sysv-tail shmid=I tail=0x7f...
        let id = pong
            .split("shmid=")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        let tail = pong.split("tail=").nth(1).unwrap().trim();
        vec![format!(
            "System V segment {id} mapped at {tail} without the start of its attachment"
        )]
    });
}

#[test]
fn snapshot_refuses_a_memfd_and_the_service_keeps_running() {
    snapshot_refused("memfd", |_, pong| {
        let fd = pong.split("memfd=").nth(1).unwrap().trim().to_string();
        vec![format!("file descriptor {fd}: memfd /memfd:bad-memfd")]
    });
}

/// Signals pending (blocked) at a snapshot go into the checkpoint with their details and are
/// queued again by the restore: a process-directed SIGUSR1, two SIGRTMIN with values (a
/// real-time signal is queued as often as it is sent, with its value), and a SIGUSR2 sent to
/// the main thread alone. The restored service takes them in the order the original would.
#[test]
fn pending_signals_survive_snapshot_and_restore() {
    let svc = Svc::start(
        "pending-signal",
        "bad_resources",
        &["pending-signal"],
        BAD_PORT,
    );
    let want = "pending=SIGUSR1,SIGUSR2,SIGRTMIN";
    let pong = svc.ping();
    assert!(pong.ends_with(want), "before the snapshot: {pong}");
    let file = svc.scratch.0.join("pending.tardi");
    svc.run
        .snapshot(&file)
        .unwrap_or_else(|e| panic!("snapshot with signals pending: {e}"));
    let ck = tardi_checkpointer::image::Checkpoint::from_bytes(std::fs::read(&file).unwrap())
        .expect("the checkpoint reads back");
    let rtmin = libc::SIGRTMIN() as u32;
    let signos = |l: &[tardi_checkpointer::image::PendingSignal]| -> Vec<u32> {
        l.iter().map(|p| p.signo).collect()
    };
    assert_eq!(
        signos(&ck.image.pending),
        [10, rtmin, rtmin],
        "the process's queue"
    );
    assert_eq!(
        signos(&ck.image.threads[0].pending),
        [12],
        "the main thread's queue"
    );
    let Svc {
        run, name, port, ..
    } = svc;
    let out = run.stop();
    assert!(out.contains("\"stopped\""), "{name} did not stop: {out}");
    let restored = Running::restore(&file).unwrap_or_else(|e| panic!("restore: {e}"));
    let addr = SocketAddr::new(restored.address.into(), port);
    let pong = programs::ping(addr, Duration::from_secs(5)).expect("the restored service answers");
    assert!(pong.ends_with(want), "after the restore: {pong}");
    let drained = programs::request(addr, "drain", Duration::from_secs(5)).unwrap();
    assert_eq!(drained, "drained SIGUSR2 SIGUSR1 SIGRTMIN:42 SIGRTMIN:43");
    let pong = programs::ping(addr, Duration::from_secs(5)).unwrap();
    assert!(pong.ends_with("pending="), "after draining: {pong}");
    let out = restored.stop();
    assert!(
        out.contains("\"stopped\""),
        "{name} (restored) did not stop: {out}"
    );
    forget(&name);
}

#[test]
fn snapshot_refuses_queued_inotify_events_and_the_service_keeps_running() {
    snapshot_refused("inotify-queued", |_, pong| {
        let fd = pong.split("inotify=").nth(1).unwrap().trim().to_string();
        vec![
            format!("inotify descriptor {fd} has "),
            "bytes of events queued, and they stayed queued".to_string(),
            "queued inotify events cannot be carried into a checkpoint".to_string(),
        ]
    });
}

#[test]
fn snapshot_to_an_unwritable_path_names_it_and_leaves_no_partial_file() {
    let svc = Svc::start("unwritable", "bad_resources", &["none"], BAD_PORT);
    let dir = format!("/nonexistent-tardi-test-{}", std::process::id());
    let file = format!("{dir}/x.tardi");
    let out = tardi_cmd(&["snapshot", &svc.name, "-o", &file]);
    assert_refused(
        &out,
        &[&format!(
            "cannot write {file}: directory {dir} does not exist"
        )],
    );
    assert_untraced(svc.run.pid);
    svc.ping();
    // And a good snapshot still works afterwards.
    let (out, f) = svc.snapshot("ok.tardi");
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(f.exists());
    svc.stop();
}

// ---------------------------------------------------------------------------------------------
// Restore.

/// `tardi restore FILE` must be refused with `parts`; nothing of sandbox `name` may exist after.
fn restore_refused(file: &Path, name: &str, parts: &[&str]) -> Outcome {
    let links_before = links();
    let out = tardi_cmd(&["restore", file.to_str().unwrap(), "--json"]);
    assert_refused(&out, parts);
    assert_nothing_left(name, &links_before);
    out
}

#[test]
fn restore_of_a_missing_file() {
    let scratch = Scratch::new("bad-restore-missing");
    let file = scratch.0.join("no-such.tardi");
    let links_before = links();
    let out = tardi_cmd(&["restore", file.to_str().unwrap()]);
    assert_refused(
        &out,
        &[&format!(
            "{} cannot be restored: reading the checkpoint: No such file or directory",
            file.display()
        )],
    );
    assert_no_new_links(&links_before);
}

#[test]
fn restore_of_an_empty_file() {
    let scratch = Scratch::new("bad-restore-empty");
    let file = scratch.0.join("empty.tardi");
    std::fs::write(&file, b"").unwrap();
    let links_before = links();
    let out = tardi_cmd(&["restore", file.to_str().unwrap()]);
    assert_refused(
        &out,
        &[
            &format!("{} cannot be restored", file.display()),
            "not a Tardi checkpoint",
        ],
    );
    assert_no_new_links(&links_before);
}

#[test]
fn restore_of_a_file_with_wrong_magic() {
    let scratch = Scratch::new("bad-restore-magic");
    let file = scratch.0.join("garbage.tardi");
    std::fs::write(
        &file,
        b"#!/bin/sh\necho this is not a checkpoint\n".repeat(100),
    )
    .unwrap();
    let links_before = links();
    let out = tardi_cmd(&["restore", file.to_str().unwrap()]);
    assert_refused(
        &out,
        &[
            &format!("{} cannot be restored", file.display()),
            "not a Tardi checkpoint (bad magic bytes)",
        ],
    );
    assert_no_new_links(&links_before);
}

/// A real checkpoint of a running statemachine; returns (bytes, sandbox name). The sandbox is
/// stopped again.
fn real_checkpoint(tag: &str) -> (Vec<u8>, String) {
    let svc = Svc::start(tag, "statemachine", &["--threads", "2"], SM_PORT);
    let (out, file) = svc.snapshot("real.tardi");
    assert_eq!(out.code, Some(0), "snapshot: {out:?}");
    let bytes = std::fs::read(&file).unwrap();
    let name = svc.name.clone();
    svc.stop();
    (bytes, name)
}

#[test]
fn restore_of_a_truncated_checkpoint() {
    let scratch = Scratch::new("bad-restore-trunc");
    let (bytes, name) = real_checkpoint("trunc");
    let total = bytes.len();
    for (i, keep) in [total - 1, total / 2, 40, 12].into_iter().enumerate() {
        let file = scratch.0.join(format!("cut{i}.tardi"));
        std::fs::write(&file, &bytes[..keep]).unwrap();
        // Header (magic, version, flags, epoch, meta_len, data_len: 40 bytes) + CRC (4): a
        // file shorter than that cannot even say how long it should be.
        let expected = if keep >= 44 { total } else { 44 };
        restore_refused(
            &file,
            &name,
            &[
                &format!("{} cannot be restored", file.display()),
                &format!("checkpoint is truncated: expected {expected} bytes, found {keep}"),
            ],
        );
    }
    forget(&name);
}

#[test]
fn restore_of_a_corrupted_checkpoint() {
    let scratch = Scratch::new("bad-restore-corrupt");
    let (mut bytes, name) = real_checkpoint("corrupt");
    let file = scratch.0.join("flipped.tardi");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    restore_refused(
        &file,
        &name,
        &[
            &format!("{} cannot be restored", file.display()),
            "checkpoint is corrupted: checksum mismatch",
        ],
    );
    // The header's version field.
    bytes[mid] ^= 0x40;
    bytes[8] = 0x7f;
    std::fs::write(&file, &bytes).unwrap();
    restore_refused(
        &file,
        &name,
        &["checkpoint format version 127 is not supported"],
    );
    forget(&name);
}

#[test]
fn restore_refuses_when_the_mapped_executable_changed() {
    let scratch = Scratch::new("bad-restore-exe");
    let src = scratch.0.join("pauser.c");
    let bin = scratch.0.join("pauser");
    std::fs::write(
        &src,
        "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n",
    )
    .unwrap();
    let gcc = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run gcc");
    assert!(
        gcc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&gcc.stderr)
    );
    let name = unique("exechanged");
    let manifest = manifest_for(&scratch.0, &name, &bin, &[]);
    let run = Running::run(&manifest).unwrap_or_else(|e| panic!("tardi run: {e}"));
    let file = scratch.0.join("pauser.tardi");
    let snap = run
        .snapshot(&file)
        .unwrap_or_else(|e| panic!("snapshot: {e}"));
    assert!(snap["bytes"].as_u64().unwrap() > 0);
    run.stop();

    // The same executable, one byte longer.
    let mut f = std::fs::OpenOptions::new().append(true).open(&bin).unwrap();
    std::io::Write::write_all(&mut f, b"\0").unwrap();
    drop(f);
    let b = bin.display();
    restore_refused(
        &file,
        &name,
        &[
            &format!(
                "{} cannot be restored here; nothing was started",
                file.display()
            ),
            &format!(
                "mapped file {b} cannot be used: {b} differs from the checkpointed file (content hash mismatch)"
            ),
        ],
    );
    // Gone altogether.
    std::fs::remove_file(&bin).unwrap();
    restore_refused(
        &file,
        &name,
        &[&format!(
            "mapped file {b} cannot be used: {b}: No such file or directory"
        )],
    );
    forget(&name);
}

#[test]
fn restore_while_the_same_sandbox_runs_is_refused_and_the_running_one_is_unaffected() {
    let svc = Svc::start("twice", "statemachine", &["--threads", "2"], SM_PORT);
    let (out, file) = svc.snapshot("twice.tardi");
    assert_eq!(out.code, Some(0), "snapshot: {out:?}");
    let before = programs::query(svc.addr(), Duration::from_secs(5)).unwrap();
    let links_before = links();
    let out = tardi_cmd(&["restore", file.to_str().unwrap(), "--json"]);
    assert_refused(
        &out,
        &[
            &format!("sandbox `{}` is already running", svc.name),
            "stop it first",
        ],
    );
    assert_no_new_links(&links_before);
    // The running one: same process, same address, same run files, still progressing.
    assert_untraced(svc.run.pid);
    let run_dir = Path::new("/run/tardi").join(&svc.name);
    for f in ["lock", "init.pid", "control.sock"] {
        assert!(
            run_dir.join(f).exists(),
            "{} was removed by the refused restore",
            run_dir.join(f).display()
        );
    }
    let st: Vec<_> = status()
        .into_iter()
        .filter(|s| s["name"] == svc.name.as_str())
        .collect();
    assert_eq!(st.len(), 1, "{st:?}");
    assert_eq!(st[0]["pid"].as_i64(), Some(svc.run.pid as i64));
    assert!(st[0]["restored_from"].is_null(), "{st:?}");
    std::thread::sleep(Duration::from_millis(50));
    let after = programs::query(svc.addr(), Duration::from_secs(5)).unwrap();
    after.check().unwrap();
    after.not_before(&before).unwrap();
    assert!(
        after.total_steps() > before.total_steps(),
        "the running service stopped making progress"
    );
    // And it can still be checkpointed.
    let (out, _) = svc.snapshot("again.tardi");
    assert_eq!(out.code, Some(0), "{out:?}");
    svc.stop();
}
