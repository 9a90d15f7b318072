//! Driving the real `tardi` binary from integration tests: a running sandbox as a value that
//! stops its `tardi run`/`tardi restore` process when dropped.

use super::programs;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub fn tardi() -> &'static str {
    env!("CARGO_BIN_EXE_tardi")
}

/// A foreground `tardi run` or `tardi restore` and what its first JSON line said.
pub struct Running {
    pub child: Child,
    pub name: String,
    pub address: std::net::Ipv4Addr,
    pub pid: i32,
    pub log: PathBuf,
    pub started: serde_json::Value,
    stdout: Option<BufReader<std::process::ChildStdout>>,
}

impl Running {
    /// `cmd` as one UDP datagram to the service's `port`, and its reply (within 20 s); panics
    /// with the service's log when none comes.
    pub fn ask_udp(&self, port: u16, cmd: &str) -> String {
        programs::request(
            SocketAddr::new(self.address.into(), port),
            cmd,
            Duration::from_secs(20),
        )
        .unwrap_or_else(|e| {
            panic!(
                "{cmd} to port {port} of {}: {e}\n--- log ---\n{}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        })
    }

    fn spawn(args: &[&str]) -> Result<Running, String> {
        let mut child = Command::new(tardi())
            .args(args)
            .arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.is_empty() {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            let _ = child.wait();
            return Err(err);
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
        Ok(Running {
            name: v["name"].as_str().unwrap().to_string(),
            address: v["address"].as_str().unwrap().parse().unwrap(),
            pid: v["pid"].as_i64().unwrap() as i32,
            log: v["log"].as_str().unwrap().into(),
            started: v,
            child,
            stdout: Some(out),
        })
    }

    pub fn run(manifest: &Path) -> Result<Running, String> {
        Running::spawn(&["run", manifest.to_str().unwrap()])
    }

    pub fn restore(file: &Path) -> Result<Running, String> {
        Running::spawn(&["restore", file.to_str().unwrap()])
    }

    /// `tardi snapshot NAME -o FILE --json`.
    pub fn snapshot(&self, file: &Path) -> Result<serde_json::Value, String> {
        self.snapshot_with(file, &[])
    }

    /// [`Running::snapshot`] with more arguments (`--stop`).
    pub fn snapshot_with(&self, file: &Path, extra: &[&str]) -> Result<serde_json::Value, String> {
        let out = Command::new(tardi())
            .args([
                "snapshot",
                &self.name,
                "-o",
                file.to_str().unwrap(),
                "--json",
            ])
            .args(extra)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    /// Snapshots the service into `file` ([`Running::snapshot`], which must succeed) and returns
    /// the sandbox description the snapshot carries: what a chain of epochs taken outside
    /// `tardi` needs to be restored into a sandbox.
    pub fn snapshot_sandbox(&self, file: &Path) -> Vec<u8> {
        self.snapshot_image(file, "snapshot").sandbox
    }

    /// [`Running::snapshot`] into `file` (panics naming `what` if it fails), and the image of
    /// the checkpoint it wrote.
    pub fn snapshot_image(
        &self,
        file: &Path,
        what: &str,
    ) -> tardi_checkpointer::image::ProcessImage {
        self.snapshot(file)
            .unwrap_or_else(|e| panic!("{what} of {}: {e}", self.name));
        tardi_checkpointer::image::Checkpoint::from_bytes(std::fs::read(file).unwrap())
            .unwrap()
            .image
    }

    /// `tardi restore FILE`; panics with the error and the service log `log` (the log of the
    /// sandbox the snapshot came from) if it fails.
    pub fn restore_or_log(file: &Path, log: &Path) -> Running {
        Running::restore(file).unwrap_or_else(|e| {
            panic!(
                "restore: {e}\n--- log ---\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })
    }

    /// Stops the service (its sandbox torn down) and restores `file` in its place; panics
    /// with the error and this service's log if the restore fails.
    pub fn restore_in_place(self, file: &Path) -> Running {
        let log = self.log.clone();
        self.stop();
        Running::restore_or_log(file, &log)
    }

    /// The service's address at `port`.
    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.address.into(), port)
    }

    /// A test program's answer to `cmd` on UDP `port` ([`programs::request`], 10 s at most);
    /// panics naming the sandbox if there is none.
    pub fn ask(&self, port: u16, cmd: &str) -> String {
        programs::request(self.addr(port), cmd, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{cmd} to {}: {e}", self.name))
    }

    /// Waits for the foreground tardi to end by itself (the service exited); returns the rest of
    /// its output. Stops it if it is still running after `timeout`.
    pub fn wait_exit(mut self, timeout: Duration) -> String {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let mut rest = String::new();
                if let Some(mut out) = self.stdout.take() {
                    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
                }
                return rest;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        format!("(still running after {timeout:?}) {}", self.stop_inner())
    }

    /// SIGTERM to the foreground tardi, then wait for it (it tears the sandbox down).
    pub fn stop(mut self) -> String {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> String {
        // SAFETY: plain kill of our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let mut rest = String::new();
        if let Some(mut out) = self.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut out, &mut rest);
        }
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return rest;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        rest
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop_inner();
        }
    }
}

/// Writes a manifest for a test program with a unique sandbox name.
pub fn manifest_for(dir: &Path, name: &str, binary: &Path, args: &[&str]) -> PathBuf {
    let mut argv = vec![format!(
        "{:?}",
        binary.file_name().unwrap().to_str().unwrap()
    )];
    argv.extend(args.iter().map(|a| format!("{a:?}")));
    let text = format!(
        "libos.entrypoint = {:?}\nloader.argv = [{}]\n\n[tardi]\nname = {:?}\n",
        binary.to_str().unwrap(),
        argv.join(", "),
        name
    );
    let p = dir.join(format!("{name}.manifest"));
    std::fs::write(&p, text).unwrap();
    p
}

/// Writes the image of a chain of epochs as a snapshot file `file` (a full checkpoint) that
/// `tardi restore` takes, with the sandbox description `sandbox` (from
/// [`Running::snapshot_sandbox`]).
pub fn write_chain(image: &tardi_checkpointer::store::Image, sandbox: Vec<u8>, file: &Path) {
    let mut full = image.to_full();
    full.image.sandbox = sandbox;
    std::fs::write(file, full.to_bytes()).unwrap();
}

/// Writes a manifest for a test program (its argv: the binary's file name) with the host's
/// root read-only and a tmpfs at /tmp, under sandbox name `name`.
pub fn manifest_with_tmp(dir: &Path, name: &str, binary: &Path) -> PathBuf {
    let text = format!(
        "libos.entrypoint = {:?}\nloader.argv = [{:?}]\n\
         fs.mounts = [\n  {{ path = \"/\", uri = \"file:/\" }},\n  {{ type = \"tmpfs\", path = \"/tmp\" }},\n]\n\n\
         [tardi]\nname = {name:?}\n",
        binary.to_str().unwrap(),
        binary.file_name().unwrap().to_str().unwrap()
    );
    let p = dir.join(format!("{name}.manifest"));
    std::fs::write(&p, text).unwrap();
    p
}

/// Test program `program` (built) running in a sandbox with a tmpfs /tmp
/// ([`manifest_with_tmp`]) named `PREFIX-TAG-<pid>`, its manifest in a fresh scratch directory
/// tagged `tag`; returned once it answers `ping` on UDP `port`.
pub fn run_with_tmp(program: &str, prefix: &str, tag: &str, port: u16) -> (Scratch, Running) {
    let bin = programs::build(program);
    let scratch = Scratch::new(tag);
    let name = format!("{prefix}-{tag}-{}", std::process::id() % 10000);
    let m = manifest_with_tmp(&scratch.0, &name, &bin);
    let run = Running::run(&m).expect("tardi run");
    programs::wait_ready(run.addr(port), Duration::from_secs(10)).expect("ready");
    (scratch, run)
}

/// A scratch directory under the target dir, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/tardi-test-scratch")
            .join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `gramine-manifests/python-kv.manifest` with the script's mount pointing at this checkout's
/// `tests/programs` and a unique `tardi.name`, written into `dir`.
pub fn kv_manifest(dir: &Path, name: &str) -> PathBuf {
    python_manifest(dir, "python-kv", "/srv/kv", name)
}

/// `gramine-manifests/SHIPPED.manifest` (a Python service whose script is mounted from
/// `mount` and whose `tardi.name` is SHIPPED) with that mount pointing at this checkout's
/// `tests/programs` and the name `name`, written into `dir`.
pub fn python_manifest(dir: &Path, shipped: &str, mount: &str, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join(format!("gramine-manifests/{shipped}.manifest"));
    let text = std::fs::read_to_string(&file).unwrap();
    let programs = root.join("tests/programs");
    let uri = format!("uri = \"file:{mount}\"");
    let name_line = format!("name = {shipped:?}");
    assert!(
        text.contains(&uri) && text.contains(&name_line),
        "{} changed: update this test",
        file.display()
    );
    let text = text
        .replace(
            &uri,
            &format!("uri = {:?}", format!("file:{}", programs.display())),
        )
        .replace(&name_line, &format!("name = {name:?}"));
    let p = dir.join(format!("{name}.manifest"));
    std::fs::write(&p, text).unwrap();
    p
}

/// `tardi profile MANIFEST --json --duration SECSs --verify --load LOAD`, its output kept in
/// `dir` (at most 90 s, then killed and failed): asserts it succeeded and verified, and returns
/// its JSON lines (one per epoch, then the summary).
pub fn profile_verified(
    manifest: &Path,
    load: &str,
    secs: u32,
    dir: &Path,
) -> Vec<serde_json::Value> {
    profile_verified_with(manifest, load, secs, dir, &[])
}

/// [`profile_verified`] with more arguments for `tardi profile` (`--tracker mprotect`).
pub fn profile_verified_with(
    manifest: &Path,
    load: &str,
    secs: u32,
    dir: &Path,
    extra: &[&str],
) -> Vec<serde_json::Value> {
    let (out, err) = (dir.join("profile.stdout"), dir.join("profile.stderr"));
    let mut child = Command::new(tardi())
        .args([
            "profile",
            manifest.to_str().unwrap(),
            "--json",
            "--duration",
            &format!("{secs}s"),
            "--verify",
            "--load",
            load,
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: SIGTERM to our own child; tardi tears its sandbox down on it.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            panic!(
                "tardi profile of {} still ran after 90 s",
                manifest.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (
        std::fs::read_to_string(&out).unwrap_or_default(),
        std::fs::read_to_string(&err).unwrap_or_default(),
    );
    assert!(
        status.success(),
        "tardi profile failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l:?}")))
        .collect();
    let summary = lines.last().expect("no output");
    assert_eq!(summary["summary"], true, "{stdout}");
    assert_eq!(
        summary["verified"], true,
        "verification failed: {summary}\nstderr:\n{stderr}"
    );
    lines
}

/// The listening TCP socket a tree's snapshot lists among its shared descriptions (panics if
/// there is none).
pub fn shared_listener(
    image: &tardi_checkpointer::image::ProcessImage,
) -> &tardi_checkpointer::image::SharedFile {
    use tardi_checkpointer::image::{FdKind, SocketState};
    image
        .shared_files
        .iter()
        .find(|s| {
            matches!(&s.file.kind, FdKind::Socket(x) if matches!(x.state, SocketState::Listening { .. }))
        })
        .expect("the listening socket is shared")
}

/// The churn program (`tests/programs/churn.c`: three threads changing their layout all
/// along) running in a sandbox, its private directory on `/mnt` (`env`: extra manifest lines);
/// the sandbox's name.
pub fn churn_run(tag: &str, env: &str) -> (Scratch, Running, String) {
    let bin = programs::build("churn");
    let scratch = Scratch::new(tag);
    let name = format!("churn-{tag}-{}", std::process::id() % 10000);
    let data = scratch.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let manifest = scratch.0.join("churn.manifest");
    std::fs::write(
        &manifest,
        format!(
            "libos.entrypoint = {bin:?}\nloader.argv = [\"churn\", \"--threads\", \"3\", \"--rate\", \"20\", \"--file\", \"/mnt/churn.dat\"]\n\
             fs.mounts = [{{ path = \"/\", uri = \"file:/\" }}, {{ path = \"/mnt\", uri = \"file:{}\" }}, {{ type = \"tmpfs\", path = \"/tmp\" }}]\n\
             {env}\n[tardi]\nname = \"{name}\"\nprivate_dirs = [\"/mnt\"]\n",
            data.display()
        ),
    )
    .unwrap();
    let run = Running::run(&manifest).expect("tardi run churn");
    std::thread::sleep(Duration::from_millis(300));
    (scratch, run, name)
}
