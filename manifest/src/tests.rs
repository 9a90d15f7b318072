use std::path::{Path, PathBuf};

use super::*;

const SRC: &str = "test.manifest";

fn ok(text: &str) -> (Manifest, Vec<String>) {
    match parse_with_warnings(text, Path::new(SRC)) {
        Ok(r) => r,
        Err(e) => panic!("expected success, got: {e}"),
    }
}

fn err(text: &str) -> ManifestError {
    match parse_with_warnings(text, Path::new(SRC)) {
        Ok((m, _)) => panic!("expected an error, got {m:#?}"),
        Err(e) => e,
    }
}

/// The error names `key` at `line`, and its message says so with `file:line:` and `'key'`.
#[track_caller]
fn assert_key_err(e: &ManifestError, key: &str, line: usize) {
    let msg = e.to_string();
    assert_eq!(e.key(), Some(key), "wrong key in: {msg}");
    assert_eq!(e.line(), Some(line), "wrong line in: {msg}");
    assert!(msg.starts_with(&format!("{SRC}:{line}: ")), "{msg}");
    assert!(msg.contains(&format!("'{key}'")), "{msg}");
}

const HEAD: &str = "libos.entrypoint = \"/bin/sh\"\ntardi.name = \"svc\"\n";

fn with_head(rest: &str) -> String {
    format!("{HEAD}{rest}")
}

// ---- successes ---------------------------------------------------------------------------

#[test]
fn defaults() {
    let (m, w) = ok(HEAD);
    assert!(w.is_empty());
    assert_eq!(m.entrypoint, PathBuf::from("/bin/sh"));
    assert_eq!(m.argv, vec!["/bin/sh".to_string()]);
    assert!(m.env.is_empty());
    assert_eq!(m.start_dir, PathBuf::from("/"));
    assert!(m.mounts.is_empty());
    assert_eq!(m.sys, Sys::default());
    assert_eq!(m.tardi.name, "svc");
    assert!(m.tardi.ports.is_empty());
    assert!(m.tardi.private_dirs.is_empty());
    assert_eq!(m.tardi.epoch.interval_ms, 10.0);
    assert_eq!(m.tardi.epoch.min_ms, 1.75);
    assert!(m.tardi.epoch.follow_releases);
    assert_eq!(m.tardi.epoch.follow_min_ms, 0.1);
    assert_eq!(m.tardi.epoch.after_release_ms, 1.3);
    assert_eq!(m.tardi.epoch.cap_pages, 4000);
    assert_eq!(m.tardi.epoch.hot_epochs, 3);
    assert_eq!(m.tardi.epoch.precopy_min_pages, 256);
    assert_eq!(m.tardi.epoch.encode_budget, 0);
    assert_eq!(m.tardi.network.subnet, Ipv4Addr::new(10, 213, 0, 0));
    assert_eq!(m.tardi.failover, Failover::default());
    assert_eq!(
        (m.tardi.scrub.interval_ms, m.tardi.scrub.pages),
        (1000, 256)
    );
    assert_eq!(
        (m.tardi.failover.max_failures, m.tardi.failover.window_s),
        (3, 600)
    );
    assert!(m.source.is_absolute());
    assert!(m.source.ends_with(SRC));
}

#[test]
fn full_manifest_with_tables() {
    let (m, w) = ok(r#"
[libos]
entrypoint = "file:/bin/sh"

[loader]
argv = ["sh", "-c", "sleep 1"]
env.A = "1"
env.B = { value = "two" }

[fs]
start_dir = "/var/lib/svc/"

[sys]
stack.size = "8M"
brk.max_size = 4096
enable_sigterm_injection = true

[tardi]
name = "svc-1"
ports = ["tcp:6379", "udp:9000"]
private_dirs = ["/var/lib/svc"]

[tardi.epoch]
interval_ms = 20
min_ms = 0.5
follow_releases = false
follow_min_ms = 0.25
after_release_ms = 0.9
cap_pages = 64
hot_epochs = 5
tracker = "mprotect"
precopy_min_pages = 0
encode_budget = 3

[tardi.network]
subnet = "10.42.0.0"

[tardi.failover]
max_failures = 5
window_s = 60
max_backup_lag_ms = 1500

[tardi.scrub]
interval_ms = 250
pages = 4096
"#);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(m.entrypoint, PathBuf::from("/bin/sh"), "file: is stripped");
    assert_eq!(m.argv, ["sh", "-c", "sleep 1"]);
    assert_eq!(m.env.get("A").map(String::as_str), Some("1"));
    assert_eq!(m.env.get("B").map(String::as_str), Some("two"));
    assert_eq!(m.start_dir, PathBuf::from("/var/lib/svc"));
    assert_eq!(
        m.sys,
        Sys {
            stack_size: Some(8 << 20),
            brk_max_size: Some(4096),
            enable_sigterm_injection: true
        }
    );
    assert_eq!(
        m.tardi.ports,
        [
            Port {
                proto: Proto::Tcp,
                port: 6379
            },
            Port {
                proto: Proto::Udp,
                port: 9000
            }
        ]
    );
    assert_eq!(m.tardi.private_dirs, [PathBuf::from("/var/lib/svc")]);
    assert_eq!(m.tardi.epoch.interval_ms, 20.0);
    assert_eq!(m.tardi.epoch.min_ms, 0.5);
    assert!(!m.tardi.epoch.follow_releases);
    assert_eq!(m.tardi.epoch.follow_min_ms, 0.25);
    assert_eq!(m.tardi.epoch.after_release_ms, 0.9);
    assert_eq!(m.tardi.epoch.cap_pages, 64);
    assert_eq!(m.tardi.epoch.hot_epochs, 5);
    assert_eq!(m.tardi.epoch.tracker, "mprotect");
    assert_eq!(m.tardi.epoch.precopy_min_pages, 0);
    assert_eq!(m.tardi.epoch.encode_budget, 3);
    assert_eq!(m.tardi.network.subnet, Ipv4Addr::new(10, 42, 0, 0));
    assert_eq!(
        (m.tardi.failover.max_failures, m.tardi.failover.window_s),
        (5, 60)
    );
    assert_eq!(m.tardi.failover.max_backup_lag_ms, 1500);
    assert_eq!(
        (m.tardi.scrub.interval_ms, m.tardi.scrub.pages),
        (250, 4096)
    );
    assert_eq!(m.tardi.ports[0].to_string(), "tcp:6379");
}

#[test]
fn inline_table_mounts_and_file_stripping() {
    let (m, _) = ok(&with_head(
        r#"tardi.private_dirs = ["/var/lib/svc"]
fs.mounts = [
  { path = "/usr", uri = "file:/usr" },
  { type = "chroot", path = "/var/lib", uri = "file:/srv/state/" },
  { path = "/var/lib/svc/data", uri = "file:/srv/data" },
  { type = "tmpfs", path = "/tmp" },
]
"#,
    ));
    let bind = |path: &str, host: &str, writable: bool| Mount {
        path: path.into(),
        kind: MountKind::Bind {
            host_path: host.into(),
            writable,
        },
    };
    assert_eq!(
        m.mounts,
        [
            bind("/usr", "/usr", false),
            // A parent of a private dir covers it but is itself read-only.
            bind("/var/lib", "/srv/state", false),
            // Under a private dir: writable.
            bind("/var/lib/svc/data", "/srv/data", true),
            Mount {
                path: "/tmp".into(),
                kind: MountKind::Tmpfs
            },
        ]
    );
    assert_eq!(m.mounts_or_default(), m.mounts);
}

#[test]
fn array_of_tables_mounts() {
    let (m, _) = ok(&with_head(
        r#"tardi.private_dirs = ["/data"]
[[fs.mounts]]
path = "/data"
uri = "file:/host/data"

[[fs.mounts]]
type = "tmpfs"
path = "/tmp"
"#,
    ));
    assert_eq!(m.mounts.len(), 2);
    assert_eq!(
        m.mounts[0].kind,
        MountKind::Bind {
            host_path: "/host/data".into(),
            writable: true
        }
    );
}

#[test]
fn mounts_or_default_when_empty() {
    let (m, _) = ok(&with_head(
        "tardi.private_dirs = [\"/var/lib/a\", \"/b\"]\n",
    ));
    assert!(m.mounts.is_empty());
    let bind = |p: &str, writable: bool| Mount {
        path: p.into(),
        kind: MountKind::Bind {
            host_path: p.into(),
            writable,
        },
    };
    assert_eq!(
        m.mounts_or_default(),
        [bind("/", false), bind("/var/lib/a", true), bind("/b", true)]
    );
}

#[test]
fn env_forms() {
    let path = std::env::var("PATH").unwrap_or_default();
    let (m, _) = ok(&with_head(
        r#"loader.env.A = "x"
loader.env.B = { value = "y" }
loader.env.PATH = { passthrough = true }
loader.env.TARDI_SURELY_UNSET_VAR = { passthrough = true }
"#,
    ));
    assert_eq!(m.env.get("A").unwrap(), "x");
    assert_eq!(m.env.get("B").unwrap(), "y");
    if !path.is_empty() {
        assert_eq!(m.env.get("PATH").unwrap(), &path);
    }
    assert!(!m.env.contains_key("TARDI_SURELY_UNSET_VAR"));
}

#[test]
fn sizes() {
    assert_eq!(parse::parse_size("8M"), Ok(8 << 20));
    assert_eq!(parse::parse_size("2k"), Ok(2048));
    assert_eq!(parse::parse_size("1G"), Ok(1 << 30));
    assert_eq!(parse::parse_size("4096"), Ok(4096));
    for bad in ["", "M", "8MB", "-1", "1.5M", "0", "99999999999999999999G"] {
        assert!(parse::parse_size(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn ports_and_names() {
    assert!(parse::parse_port("tcp:1").is_ok());
    for bad in [
        "tcp",
        "tcp:",
        "tcp:0",
        "tcp:65536",
        "sctp:1",
        "TCP:1",
        "tcp:+1",
        "6379",
    ] {
        assert!(parse::parse_port(bad).is_err(), "{bad:?}");
    }
    for good in ["a", "0", "redis", "my-svc-2", &"a".repeat(31)] {
        assert!(parse::check_name(good).is_ok(), "{good:?}");
    }
    for bad in ["", "-a", "Redis", "a_b", "a.b", &"a".repeat(32)] {
        assert!(parse::check_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn ignored_gramine_keys_are_warnings() {
    let (_, w) = ok(&with_head(
        r#"loader.entrypoint.uri = "file:/usr/lib/x86_64-linux-gnu/gramine/libsysdb.so"
loader.log_level = "error"
loader.insecure__use_cmdline_argv = true
libos.check_invalid_pointers = false
sys.insecure__allow_eventfd = true
fs.experimental__enable_sysfs_topology = true
loader.uid = 1000

[sgx]
debug = true
enclave_size = "1G"
trusted_files = ["file:/usr/lib/"]
"#,
    ));
    assert_eq!(w.len(), 8, "{w:#?}");
    assert!(w[0].starts_with(&format!("{SRC}:3: ")), "{}", w[0]);
    assert!(w[0].contains("'loader.entrypoint'"), "{}", w[0]);
    assert!(
        w.iter()
            .any(|w| w.starts_with(&format!("{SRC}:11: ")) && w.contains("'sgx'"))
    );
}

#[test]
fn relative_entrypoint_resolved_against_manifest_dir() {
    let base = std::env::temp_dir().join(format!("tardi-manifest-test-{}", std::process::id()));
    let bin_dir = base.join("bin");
    let man_dir = base.join("manifests");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::create_dir_all(&man_dir).unwrap();
    std::fs::copy("/bin/true", bin_dir.join("prog")).unwrap();
    let text = "libos.entrypoint = \"../bin/prog\"\ntardi.name = \"t\"\n";
    let m = parse(text, &man_dir.join("x.manifest")).unwrap();
    assert_eq!(m.entrypoint, bin_dir.join("prog"));
    assert_eq!(m.argv, [bin_dir.join("prog").to_string_lossy()]);

    let e = parse(
        "libos.entrypoint = \"./nope\"\ntardi.name = \"t\"\n",
        &man_dir.join("x.manifest"),
    )
    .unwrap_err();
    assert!(matches!(e, ManifestError::MissingBinary { .. }), "{e}");
    assert!(e.to_string().contains("manifest's directory"), "{e}");
    std::fs::remove_dir_all(&base).unwrap();
}

// ---- errors --------------------------------------------------------------------------------

#[test]
fn error_syntax() {
    let e = err("libos.entrypoint = \"/bin/sh\"\ntardi.name = \"x\"\nfs.mounts = [ {path = }\n");
    assert!(matches!(e, ManifestError::Syntax { .. }), "{e}");
    assert_eq!(e.line(), Some(3));
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{SRC}:3:")), "{msg}");
    assert!(msg.contains("TOML syntax error"), "{msg}");

    let e = err("a = 1\na = 2\n");
    assert!(matches!(e, ManifestError::Syntax { .. }), "{e}");
    assert_eq!(e.line(), Some(2), "{e}");
}

#[test]
fn error_unknown_key_with_suggestion() {
    let e = err(&with_head("\n\n\n\ntardi.prots = [\"tcp:1\"]\n"));
    assert_key_err(&e, "tardi.prots", 7);
    assert!(
        e.to_string()
            .ends_with("unknown key 'tardi.prots' (did you mean 'tardi.ports'?)"),
        "{e}"
    );
}

#[test]
fn error_unknown_key_in_tables() {
    let e = err(&with_head(
        "[tardi.epoch]\ninterval_ms = 5\nintervall_ms = 4\n",
    ));
    assert_key_err(&e, "tardi.epoch.intervall_ms", 5);
    assert!(
        e.to_string()
            .contains("did you mean 'tardi.epoch.interval_ms'"),
        "{e}"
    );

    let e = err(&with_head("[tard]\nports = []\n"));
    assert_key_err(&e, "tard.ports", 4);
    assert!(e.to_string().contains("did you mean 'tardi.ports'"), "{e}");

    let e = err(&with_head("frobnicate = 1\n"));
    assert_key_err(&e, "frobnicate", 3);
    assert!(!e.to_string().contains("did you mean"), "{e}");

    let e = err(&with_head("sys.stack.sise = \"1M\"\n"));
    assert_key_err(&e, "sys.stack.sise", 3);
    assert!(
        e.to_string().contains("did you mean 'sys.stack.size'"),
        "{e}"
    );

    let e = err(&with_head("loader.env.X = { valeu = \"1\" }\n"));
    assert_key_err(&e, "loader.env.X.valeu", 3);
    assert!(
        e.to_string().contains("did you mean 'loader.env.X.value'"),
        "{e}"
    );

    // Old Gramine syntax.
    let e = err(&with_head("fs.mount.lib.path = \"/lib\"\n"));
    assert!(e.to_string().contains("did you mean 'fs.mounts'"), "{e}");
}

#[test]
fn error_scrub_out_of_range() {
    let e = err(&with_head("[tardi.scrub]\npages = 0\n"));
    assert_key_err(&e, "tardi.scrub.pages", 4);
    let e = err(&with_head("[tardi.scrub]\ninterval_ms = -1\n"));
    assert_key_err(&e, "tardi.scrub.interval_ms", 4);
    let e = err(&with_head("[tardi.scrub]\nbudget = 3\n"));
    assert_key_err(&e, "tardi.scrub.budget", 4);
}

#[test]
fn error_failover_out_of_range() {
    let e = err(&with_head("[tardi.failover]\nmax_failures = 0\n"));
    assert_key_err(&e, "tardi.failover.max_failures", 4);
    assert!(e.to_string().contains("must be in 1..=1000, got 0"), "{e}");
    let e = err(&with_head("[tardi.failover]\nwindow_s = -5\n"));
    assert_key_err(&e, "tardi.failover.window_s", 4);
    let e = err(&with_head("[tardi.failover]\nmax_backup_lag_ms = 5\n"));
    assert_key_err(&e, "tardi.failover.max_backup_lag_ms", 4);
    let e = err(&with_head("[tardi.failover]\nmax_failure = 2\n"));
    assert!(
        e.to_string()
            .contains("did you mean 'tardi.failover.max_failures'"),
        "{e}"
    );
}

#[test]
fn error_unknown_key_in_inline_mount() {
    let e = err(&with_head(
        "fs.mounts = [\n  { path = \"/usr\", uri = \"file:/usr\" },\n  { tpye = \"tmpfs\", path = \"/tmp\" },\n]\n",
    ));
    assert_key_err(&e, "fs.mounts[1].tpye", 5);
    assert!(
        e.to_string().contains("did you mean 'fs.mounts[1].type'"),
        "{e}"
    );
}

#[test]
fn error_wrong_type() {
    let e = err(&with_head("\ntardi.ports = \"tcp:1\"\n"));
    assert_key_err(&e, "tardi.ports", 4);
    assert!(
        matches!(
            e,
            ManifestError::WrongType {
                found: "a string",
                ..
            }
        ),
        "{e}"
    );

    let e = err(&with_head("loader.argv = [\n  \"x\",\n  3,\n]\n"));
    assert_key_err(&e, "loader.argv[1]", 5);
    assert!(
        e.to_string().contains("must be a string, not an integer"),
        "{e}"
    );

    let e = err(&with_head("sys.enable_sigterm_injection = \"yes\"\n"));
    assert_key_err(&e, "sys.enable_sigterm_injection", 3);

    let e = err(&with_head("fs.mounts = [\"/usr\"]\n"));
    assert_key_err(&e, "fs.mounts[0]", 3);

    let e = err(&with_head("[tardi.epoch]\ncap_pages = 1.5\n"));
    assert_key_err(&e, "tardi.epoch.cap_pages", 4);

    let e = err(&with_head("sys.stack = \"8M\"\n"));
    assert_key_err(&e, "sys.stack", 3);
}

#[test]
fn error_invalid_values() {
    let cases: &[(&str, &str, usize)] = &[
        ("tardi.ports = [\"tcp:70000\"]\n", "tardi.ports[0]", 3),
        (
            "tardi.ports = [\"tcp:1\", \"tcp:1\"]\n",
            "tardi.ports[1]",
            3,
        ),
        ("sys.stack.size = \"8MB\"\n", "sys.stack.size", 3),
        ("sys.brk.max_size = 0\n", "sys.brk.max_size", 3),
        ("fs.start_dir = \"tmp\"\n", "fs.start_dir", 3),
        (
            "tardi.private_dirs = [\"var/lib\"]\n",
            "tardi.private_dirs[0]",
            3,
        ),
        (
            "tardi.private_dirs = [\"/a/../b\"]\n",
            "tardi.private_dirs[0]",
            3,
        ),
        (
            "fs.mounts = [{ path = \"usr\", uri = \"file:/usr\" }]\n",
            "fs.mounts[0].path",
            3,
        ),
        (
            "fs.mounts = [{ path = \"/usr\", uri = \"file:usr\" }]\n",
            "fs.mounts[0].uri",
            3,
        ),
        (
            "fs.mounts = [{ path = \"/usr\", uri = \"/usr\" }]\n",
            "fs.mounts[0].uri",
            3,
        ),
        (
            "fs.mounts = [{ path = \"/d\", uri = \"dev:/d\" }]\n",
            "fs.mounts[0].uri",
            3,
        ),
        (
            "fs.mounts = [{ type = \"encrypted\", path = \"/e\", uri = \"file:/e\" }]\n",
            "fs.mounts[0].type",
            3,
        ),
        (
            "fs.mounts = [\n{ path = \"/a\", uri = \"file:/a\" },\n{ path = \"/a/\", uri = \"file:/b\" }]\n",
            "fs.mounts[1].path",
            5,
        ),
        (
            "[tardi.network]\nsubnet = \"10.213.1.0\"\n",
            "tardi.network.subnet",
            4,
        ),
        (
            "[tardi.network]\nsubnet = \"10.213.0\"\n",
            "tardi.network.subnet",
            4,
        ),
        (
            "[tardi.epoch]\ninterval_ms = 0\n",
            "tardi.epoch.interval_ms",
            4,
        ),
        (
            "[tardi.epoch]\nhot_epochs = -1\n",
            "tardi.epoch.hot_epochs",
            4,
        ),
        (
            "[tardi.epoch]\nprecopy_min_pages = -1\n",
            "tardi.epoch.precopy_min_pages",
            4,
        ),
        (
            "[tardi.epoch]\nencode_budget = -1\n",
            "tardi.epoch.encode_budget",
            4,
        ),
        (
            "[tardi.epoch]\ninterval_ms = 2\nmin_ms = 3\n",
            "tardi.epoch.min_ms",
            5,
        ),
        (
            "[tardi.epoch]\nmin_ms = 0.5\nfollow_min_ms = 0.6\n",
            "tardi.epoch.follow_min_ms",
            5,
        ),
        (
            "[tardi.epoch]\nfollow_min_ms = -1\n",
            "tardi.epoch.follow_min_ms",
            4,
        ),
        (
            "[tardi.epoch]\nafter_release_ms = -0.5\n",
            "tardi.epoch.after_release_ms",
            4,
        ),
        (
            "[tardi.epoch]\ninterval_ms = 0.5\n",
            "tardi.epoch.interval_ms",
            4,
        ),
        ("loader.argv = []\n", "loader.argv", 3),
        ("loader.env.X = {}\n", "loader.env.X", 3),
    ];
    for (rest, key, line) in cases {
        let e = err(&with_head(rest));
        assert!(
            matches!(e, ManifestError::InvalidValue { .. }),
            "{rest}: {e}"
        );
        assert_key_err(&e, key, *line);
    }
    // Bad name and relative entrypoint, at their own lines.
    let e = err("libos.entrypoint = \"/bin/sh\"\n\ntardi.name = \"Redis_1\"\n");
    assert_key_err(&e, "tardi.name", 3);
    assert!(e.to_string().contains("not a valid service name"), "{e}");
    let e = err("tardi.name = \"x\"\nlibos.entrypoint = \"bin/sh\"\n");
    assert_key_err(&e, "libos.entrypoint", 2);
    assert!(e.to_string().contains("absolute path"), "{e}");
}

#[test]
fn error_private_dir_not_covered() {
    let e = err(&with_head(
        "fs.mounts = [{ path = \"/usr\", uri = \"file:/usr\" }, { type = \"tmpfs\", path = \"/tmp\" }]\ntardi.private_dirs = [\n  \"/usr/x\",\n  \"/var/lib/x\",\n]\n",
    ));
    assert_key_err(&e, "tardi.private_dirs[1]", 6);
    assert!(e.to_string().contains("not covered"), "{e}");

    let e = err(&with_head(
        "fs.mounts = [{ type = \"tmpfs\", path = \"/tmp\" }]\ntardi.private_dirs = [\"/tmp/x\"]\n",
    ));
    assert_key_err(&e, "tardi.private_dirs[0]", 4);
    assert!(e.to_string().contains("tmpfs"), "{e}");
}

#[test]
fn error_missing_required_keys() {
    let e = err("tardi.name = \"x\"\n");
    assert!(matches!(e, ManifestError::MissingKey { .. }), "{e}");
    assert_eq!(e.key(), Some("libos.entrypoint"));
    assert_eq!(e.line(), None);
    assert!(
        e.to_string()
            .starts_with(&format!("{SRC}: missing required key 'libos.entrypoint'"))
    );

    // With a [libos] table present, the error points at it.
    let e = err("tardi.name = \"x\"\n[libos]\ncheck_invalid_pointers = false\n");
    assert_key_err(&e, "libos.entrypoint", 2);

    let e = err("libos.entrypoint = \"/bin/sh\"\n");
    assert_eq!(e.key(), Some("tardi.name"));
    assert!(
        e.to_string().contains("missing required key 'tardi.name'"),
        "{e}"
    );

    let e = err("libos.entrypoint = \"/bin/sh\"\n\n[tardi]\nports = [\"tcp:1\"]\n");
    assert_key_err(&e, "tardi.name", 3);

    let e = err(&with_head("fs.mounts = [\n{ type = \"tmpfs\" }]\n"));
    assert!(matches!(e, ManifestError::MissingKey { .. }), "{e}");
    assert_key_err(&e, "fs.mounts[0].path", 4);
    let e = err(&with_head("fs.mounts = [{ path = \"/x\" }]\n"));
    assert_key_err(&e, "fs.mounts[0].uri", 3);
}

#[test]
fn error_missing_binary() {
    for (bin, what) in [
        ("/nonexistent/tardi-binary", "does not exist"),
        ("/etc/passwd", "not executable"),
        ("/usr", "not a regular file"),
    ] {
        let e = err(&format!(
            "tardi.name = \"x\"\n\nlibos.entrypoint = \"file:{bin}\"\n"
        ));
        assert!(matches!(e, ManifestError::MissingBinary { .. }), "{e}");
        assert_key_err(&e, "libos.entrypoint", 3);
        assert!(e.to_string().contains(what), "{e}");
        assert!(e.to_string().contains(bin), "{e}");
    }
}

#[test]
fn error_template() {
    let e = err("tardi.name = \"x\"\nlibos.entrypoint = \"{{ entrypoint }}\"\n");
    assert!(matches!(e, ManifestError::Template { .. }), "{e}");
    assert_key_err(&e, "libos.entrypoint", 2);
    assert!(e.to_string().contains("must be rendered first"), "{e}");
    assert!(e.to_string().contains("gramine-manifest"), "{e}");

    let e = err(&with_head(
        "fs.mounts = [\n  { path = \"/lib\", uri = \"file:{{ gramine.runtimedir() }}\" },\n]\n",
    ));
    assert_key_err(&e, "fs.mounts[0].uri", 4);

    // Jinja outside strings is a TOML syntax error, with a hint.
    let e = err(&with_head(
        "{% if debug %}\nloader.log_level = \"debug\"\n{% endif %}\n",
    ));
    assert!(matches!(e, ManifestError::Syntax { .. }), "{e}");
    assert_eq!(e.line(), Some(3));
    assert!(e.to_string().contains("gramine-manifest"), "{e}");
}

#[test]
fn io_error_names_file() {
    let e = load(Path::new("/nonexistent/x.manifest")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/x.manifest: cannot read manifest")
    );
}

// ---- shipped manifests ---------------------------------------------------------------------

#[test]
fn shipped_gramine_manifests_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gramine-manifests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "manifest"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    let mut parsed = 0;
    for f in &files {
        match load_with_warnings(f) {
            Ok((m, warnings)) => {
                assert!(warnings.is_empty(), "{}: {warnings:?}", f.display());
                assert!(!m.tardi.ports.is_empty(), "{}", f.display());
                parsed += 1;
            }
            Err(e @ ManifestError::MissingBinary { .. }) => {
                eprintln!("SKIPPED {}: binary not installed: {e}", f.display());
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(parsed > 0, "no shipped manifest could be checked");
}

#[test]
fn shipped_redis_manifest_details() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gramine-manifests/redis.manifest");
    let m = match load(&f) {
        Ok(m) => m,
        Err(e @ ManifestError::MissingBinary { .. }) => {
            eprintln!("SKIPPED: redis-server not installed: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(m.tardi.name, "redis");
    let data = m
        .mounts
        .iter()
        .find(|mt| mt.path == Path::new("/var/lib/redis"))
        .unwrap();
    assert_eq!(
        data.kind,
        MountKind::Bind {
            host_path: "/var/lib/tardi/redis/data".into(),
            writable: true
        }
    );
    let writable = m
        .mounts
        .iter()
        .filter(|mt| matches!(mt.kind, MountKind::Bind { writable: true, .. }))
        .count();
    assert_eq!(writable, 1);
}

#[test]
fn edit_distance_suggestions() {
    assert_eq!(parse_suggest("tardi.prots"), Some("tardi.ports".into()));
    assert_eq!(
        parse_suggest("libos.entrypiont"),
        Some("libos.entrypoint".into())
    );
    assert_eq!(parse_suggest("loader.argc"), Some("loader.argv".into()));
    assert_eq!(parse_suggest("zzz"), None);
}

fn parse_suggest(key: &str) -> Option<String> {
    match err(&with_head(&format!("{key} = 1\n"))) {
        ManifestError::UnknownKey { suggestion, .. } => suggestion,
        e => panic!("{e}"),
    }
}

#[test]
fn epoch_tracker_must_be_known() {
    let e = err(&with_head("[tardi.epoch]\ntracker = \"softdirty\"\n"));
    assert_key_err(&e, "tardi.epoch.tracker", 4);
    assert!(e.to_string().contains("mprotect"), "{e}");
}
