//! The checkpointer's layers, checked: no module imports one of a higher layer, and no two
//! top-level modules import each other (directly or round a circle). Runs with the other
//! tests, so CI fails on a violation.
//!
//! The layers, bottom to top (a module may use its own layer's and any lower one's):
//! 0. `os`: system calls, ptrace, `/proc`, the eBPF counter, the error, ranges and pages (and
//!    the restorer's `abi`, and the image crate's `image`/`delta`/`store`, below everything);
//! 1. `agent`: the in-process agent the mprotect tracker and some resources call through;
//! 2. `resource`: one module per kind of resource, capture and restore side by side;
//! 3. `capture`, `restore`, `track`: a whole process read, rebuilt, or its writes tracked;
//! 4. `budget`, `scrub`: what a pause adds on top of a capture;
//! 5. `epoch`, `verify`: the epoch loop and the restore-and-compare check.
//!
//! A module is known by its top-level name or by the re-exported name the crate root gives
//! it (`crate::procfs` is `os::procfs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layer of a module named in a `crate::NAME` path, or of the file's own top-level module.
fn layer(name: &str) -> Option<u8> {
    Some(match name {
        "image" | "delta" | "store" | "abi" => 0,
        "os" | "error" | "filehash" | "procfs" | "ptrace" | "ranges" | "sys" | "syscount" => 0,
        "agent" => 1,
        "resource" | "creds" | "fds" | "files" | "inotify" | "seccomp" | "shm" | "tcp"
        | "timers" | "unix" => 2,
        "capture" | "restore" | "track" | "tree" => 3,
        "budget" | "scrub" => 4,
        "epoch" | "verify" => 5,
        // Items the crate root re-exports (`crate::CaptureError`): the root is not a layer.
        "CaptureError" | "CaptureStats" | "checkpoint" | "Checkpoint" | "FormatError" => 0,
        _ => return None,
    })
}

/// The module a file under `src/` belongs to, for the layer and circle checks: the top-level
/// module, except in `os/` and `resource/`, whose members are modules of their own.
fn module_of(rel: &Path) -> String {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    match parts.as_slice() {
        [dir, file, ..] if dir == "os" || dir == "resource" => {
            if file == "mod" {
                dir.clone()
            } else {
                file.clone()
            }
        }
        [first, ..] => first.clone(),
        [] => String::new(),
    }
}

/// `src` without comments (line, doc and block) and string literals: only code names modules.
fn code_of(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' && (i == 0 || b[i - 1] != b'\'') {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The module names a piece of code reaches through `crate::`, including each name of a
/// grouped `use crate::{a, b::c}`.
fn crate_names(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = code[at + 7..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: split at commas outside nested braces.
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.insert(ident(group[start..j].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(ident(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names.remove("");
    names.remove("self");
    names
}

/// Every layer violation and unknown name in the sources under `src` (relative path, code).
fn violations(files: &[(PathBuf, String)]) -> (Vec<String>, BTreeMap<String, BTreeSet<String>>) {
    let mut bad = Vec::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, src) in files {
        let module = module_of(rel);
        if module == "lib" {
            continue;
        }
        let Some(own) = layer(&module) else {
            bad.push(format!(
                "{}: module `{module}` has no layer: add it to tests/layers.rs",
                rel.display()
            ));
            continue;
        };
        for name in crate_names(&code_of(src)) {
            match layer(&name) {
                None => bad.push(format!(
                    "{}: `crate::{name}` names no known module: add it to tests/layers.rs",
                    rel.display()
                )),
                Some(l) if l > own => bad.push(format!(
                    "{}: `{module}` (layer {own}) imports `{name}` (layer {l})",
                    rel.display()
                )),
                Some(_) => {
                    if name != module {
                        graph.entry(module.clone()).or_default().insert(name);
                    }
                }
            }
        }
    }
    (bad, graph)
}

/// A circle of imports among the top-level modules, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) {
    for e in std::fs::read_dir(dir).expect("reading src") {
        let p = e.expect("reading src").path();
        if p.is_dir() {
            sources(&p, root, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let src = std::fs::read_to_string(&p).expect("reading a source file");
            out.push((p.strip_prefix(root).unwrap().to_path_buf(), src));
        }
    }
}

#[test]
fn no_module_imports_a_higher_layer_and_none_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(files.len() > 30, "found only {} source files", files.len());
    let (bad, graph) = violations(&files);
    assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
    assert!(
        graph.contains_key("epoch") && graph["epoch"].contains("capture"),
        "the import graph misses the epoch loop's use of the capture: {graph:?}"
    );
    if let Some(c) = circle(&graph) {
        panic!("import circle: {}", c.join(" → "));
    }
}

/// The checker itself: it catches an upward import, a grouped one, and a circle, and ignores
/// names in comments and strings.
#[test]
fn the_check_catches_what_it_must() {
    let f = |path: &str, src: &str| (PathBuf::from(path), src.to_string());
    let (bad, _) = violations(&[f(
        "os/procfs.rs",
        "use crate::sys;\nuse crate::{ptrace, epoch::EpochLoop};\n",
    )]);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains("imports `epoch`"), "{bad:?}");
    let (bad, _) = violations(&[f(
        "resource/fds.rs",
        "// see crate::capture\nconst S: &str = \"crate::epoch\";\n/* crate::restore */ use crate::unix;",
    )]);
    assert!(bad.is_empty(), "{bad:?}");
    let (bad, _) = violations(&[f("capture/mod.rs", "crate::restore::finish(x)")]);
    assert!(bad.is_empty());
    let (_, graph) = violations(&[
        f("capture/mod.rs", "use crate::restore::x;"),
        f("restore/plan.rs", "use crate::track::y;"),
        f("track.rs", "use crate::capture::z;"),
    ]);
    let c = circle(&graph).expect("a circle");
    assert_eq!(c.first(), c.last(), "{c:?}");
    assert_eq!(c.len(), 4, "{c:?}");
    let (bad, _) = violations(&[f("newthing.rs", "")]);
    assert!(bad[0].contains("has no layer"), "{bad:?}");
}
