//! The systemd units in `dist/systemd/`: `systemd-analyze verify` accepts them (with the real
//! binary in place of /usr/local/bin/tardi and the example environment files), the arguments
//! the example environment files give are all flags the daemons know, and they run with TLS.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn dist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/systemd")
}

/// The value of `VAR="..."` in an environment file.
fn env_value(file: &Path, var: &str) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{var}=")))
        .unwrap_or_else(|| panic!("{} sets no {var}", file.display()))
        .trim_matches('"')
        .to_string()
}

fn check(unit: &str, env: &str, var: &str, subcommand: &str) {
    let exe = common::cluster::tardi_exe();
    let text = std::fs::read_to_string(dist().join(unit)).unwrap();
    assert!(
        text.contains(&format!(
            "ExecStart=/usr/local/bin/tardi {subcommand} ${var}"
        )),
        "{unit}: ExecStart must run `tardi {subcommand} ${var}`"
    );
    assert!(text.contains(&format!("EnvironmentFile=/etc/tardi/{env}")));
    let dir = std::env::temp_dir().join(format!("tardi-units-{}-{unit}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let local = text
        .replace("/usr/local/bin/tardi", &exe.display().to_string())
        .replace(
            &format!("/etc/tardi/{env}"),
            &dist().join(env).display().to_string(),
        );
    let path = dir.join(unit);
    std::fs::write(&path, local).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian package systemd; scripts/setup.sh installs it)");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "systemd-analyze verify {unit}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every flag of the example is known, and every value parses (`--help` comes last: the
    // parser reads what comes before it first).
    let args = env_value(&dist().join(env), var);
    // Nodes talk mutual TLS: the example names the node's TLS directory, never plaintext.
    assert!(
        args.contains("--tls-dir /etc/tardi/tls") && !args.contains("--insecure-plaintext"),
        "{env}: the daemon must run with --tls-dir: {args}"
    );
    let out = Command::new(&exe)
        .arg(subcommand)
        .args(args.split_whitespace())
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`tardi {subcommand} {args}` is refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn orchestrator_unit_verifies_and_its_example_arguments_parse() {
    check(
        "tardi-orchestrator.service",
        "orchestrator.env",
        "TARDI_ORCHESTRATOR_ARGS",
        "orchestrator",
    );
}

#[test]
fn instance_unit_verifies_and_its_example_arguments_parse() {
    check(
        "tardi-instance.service",
        "instance.env",
        "TARDI_INSTANCE_ARGS",
        "instance",
    );
}

#[test]
fn a_wrong_flag_in_the_example_would_be_caught() {
    // The check above relies on the parser refusing unknown flags even before `--help`.
    let out = Command::new(common::cluster::tardi_exe())
        .args(["instance", "--no-such-flag", "x", "--help"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
