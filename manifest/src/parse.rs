//! The parser proper: TOML with spans ([`toml::de::DeTable`]) → validated [`Manifest`].
//!
//! Every table is walked key by key (in file order) so that each error can name the full dotted
//! key and the line it is on; nothing goes through serde, whose errors cannot do that.
//!
//! Over a thousand lines because it is one table-driven walk: splitting the tables from the
//! walk that gives their errors a line and a dotted key would put each key's rules in two
//! places.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::error::{Location, ManifestError};
use crate::{Epoch, Failover, Manifest, Mount, MountKind, Network, Port, Proto, Scrub, Sys, Tardi};

type Val<'i> = Spanned<DeValue<'i>>;
type R<T> = Result<T, ManifestError>;

/// Every key Tardi gives a meaning to, plus the Gramine keys it knowingly ignores; used for
/// "did you mean" suggestions (mount entries and env tables add their own).
const KNOWN_KEYS: &[&str] = &[
    "libos",
    "libos.entrypoint",
    "libos.check_invalid_pointers",
    "loader",
    "loader.argv",
    "loader.env",
    "loader.entrypoint",
    "loader.entrypoint.uri",
    "loader.log_level",
    "loader.log_file",
    "loader.uid",
    "loader.gid",
    "loader.pal_internal_mem_size",
    "loader.argv_src_file",
    "loader.env_src_file",
    "fs",
    "fs.mounts",
    "fs.start_dir",
    "fs.root",
    "sys",
    "sys.stack",
    "sys.stack.size",
    "sys.brk",
    "sys.brk.max_size",
    "sys.enable_sigterm_injection",
    "sys.disallow_subprocesses",
    "sys.enable_extra_runtime_domain_names_conf",
    "sys.allowed_ioctls",
    "sys.ioctl_structs",
    "sgx",
    "tardi",
    "tardi.name",
    "tardi.ports",
    "tardi.private_dirs",
    "tardi.user",
    "tardi.epoch",
    "tardi.epoch.interval_ms",
    "tardi.epoch.min_ms",
    "tardi.epoch.follow_releases",
    "tardi.epoch.follow_min_ms",
    "tardi.epoch.after_release_ms",
    "tardi.epoch.cap_pages",
    "tardi.epoch.hot_epochs",
    "tardi.epoch.tracker",
    "tardi.epoch.precopy_min_pages",
    "tardi.epoch.encode_budget",
    "tardi.network",
    "tardi.network.subnet",
    "tardi.failover",
    "tardi.failover.max_failures",
    "tardi.failover.window_s",
    "tardi.failover.max_backup_lag_ms",
    "tardi.scrub",
    "tardi.scrub.interval_ms",
    "tardi.scrub.pages",
];

/// Gramine keys that are valid but mean nothing under Tardi: accepted with a warning. Matches the
/// key itself (its whole subtree is skipped).
fn ignored_reason(key: &str) -> Option<&'static str> {
    let reason = match key {
        "sgx" => "SGX enclave settings; Tardi does not use SGX",
        "loader.entrypoint" => "Gramine's LibOS; Tardi runs libos.entrypoint natively",
        "loader.log_level" | "loader.log_file" => "Gramine's own logging",
        "loader.uid" | "loader.gid" => {
            "Gramine's in-enclave IDs; use tardi.user = \"NAME\" to run the service as a user"
        }
        "loader.pal_internal_mem_size" => "Gramine-internal memory",
        "loader.argv_src_file" | "loader.env_src_file" => {
            "not supported; use loader.argv and loader.env"
        }
        "libos.check_invalid_pointers" => "Gramine-internal check",
        "fs.root" => "Tardi builds the sandbox's root from fs.mounts",
        "sys.disallow_subprocesses" => "not enforced by Tardi",
        "sys.enable_extra_runtime_domain_names_conf" => "/etc comes from fs.mounts",
        "sys.allowed_ioctls" | "sys.ioctl_structs" => "ioctls go straight to the host kernel",
        _ => {
            let mut parts = key.split('.');
            let (Some(top), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
                return None;
            };
            let gramine_table = matches!(top, "loader" | "libos" | "fs" | "sys");
            if gramine_table
                && (name.starts_with("insecure__") || name.starts_with("experimental__"))
            {
                "Gramine-specific setting"
            } else {
                return None;
            }
        }
    };
    Some(reason)
}

/// One key (or array element) with its full dotted name and byte offset in the file.
struct Item<'a, 'i> {
    /// Full dotted key: `tardi.epoch.min_ms`, `fs.mounts[2]`, `loader.argv[0]`.
    key: String,
    /// Last segment (the key as written in its table); empty for array elements.
    name: &'a str,
    /// Byte offset the line number is taken from.
    at: usize,
    val: &'a Val<'i>,
}

/// What has been collected so far, with offsets for errors that are found only at the end.
struct State {
    libos_at: Option<usize>,
    entrypoint: Option<(PathBuf, usize, Option<String>)>,
    argv: Option<Vec<String>>,
    env: BTreeMap<String, String>,
    start_dir: Option<PathBuf>,
    /// (mount, full key of the entry, offset).
    mounts: Vec<(Mount, String, usize)>,
    sys: Sys,
    tardi_at: Option<usize>,
    name: Option<String>,
    ports: Vec<Port>,
    /// (dir, full key of the element, offset).
    private_dirs: Vec<(PathBuf, String, usize)>,
    user: Option<String>,
    epoch: Epoch,
    interval_at: Option<usize>,
    min_at: Option<usize>,
    follow_at: Option<usize>,
    network: Network,
    failover: Failover,
    scrub: Scrub,
}

pub(crate) struct Ctx<'t> {
    path: &'t Path,
    /// Directory of the manifest (absolute), for `./`-relative entrypoints.
    dir: PathBuf,
    abs_source: PathBuf,
    line_starts: Vec<usize>,
    text: &'t str,
    /// (offset, message), sorted into file order at the end.
    warnings: Vec<(usize, String)>,
}

/// Parse `text` (read from `source`) into a manifest plus warnings about ignored Gramine keys.
pub(crate) fn parse_manifest(text: &str, source: &Path) -> R<(Manifest, Vec<String>)> {
    let mut cx = Ctx::new(text, source);
    let doc = DeTable::parse(text).map_err(|e| cx.syntax(&e))?;
    let root = doc.get_ref();
    cx.check_templates(root, "")?;
    let mut st = State {
        libos_at: None,
        entrypoint: None,
        argv: None,
        env: BTreeMap::new(),
        start_dir: None,
        mounts: Vec::new(),
        sys: Sys::default(),
        tardi_at: None,
        name: None,
        ports: Vec::new(),
        private_dirs: Vec::new(),
        user: None,
        epoch: Epoch::default(),
        interval_at: None,
        min_at: None,
        follow_at: None,
        network: Network::default(),
        failover: Failover::default(),
        scrub: Scrub::default(),
    };
    for it in entries("", root) {
        match it.name {
            "libos" => cx.libos(&it, &mut st)?,
            "loader" => cx.loader(&it, &mut st)?,
            "fs" => cx.fs(&it, &mut st)?,
            "sys" => cx.sys(&it, &mut st)?,
            "tardi" => cx.tardi(&it, &mut st)?,
            _ => cx.other(&it)?,
        }
    }
    let manifest = cx.finish(st)?;
    cx.warnings.sort_by_key(|(at, _)| *at);
    Ok((manifest, cx.warnings.into_iter().map(|(_, w)| w).collect()))
}

/// A table's entries in file order.
fn entries<'a, 'i>(prefix: &str, t: &'a DeTable<'i>) -> Vec<Item<'a, 'i>> {
    let mut v: Vec<Item<'a, 'i>> = t
        .iter()
        .map(|(k, val)| Item {
            key: join(prefix, k.get_ref()),
            name: k.get_ref().as_ref(),
            at: k.span().start,
            val,
        })
        .collect();
    v.sort_by_key(|it| it.at);
    v
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}

fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

fn has_template(s: &str) -> bool {
    s.contains("{{") || s.contains("{%")
}

impl<'t> Ctx<'t> {
    fn new(text: &'t str, source: &'t Path) -> Self {
        // The directory is canonicalized when it exists, so `../` in a relative entrypoint
        // means what the kernel would make of it; otherwise it is normalized lexically.
        let abs = std::path::absolute(source).unwrap_or_else(|_| source.to_path_buf());
        let parent = abs.parent().unwrap_or(Path::new("/"));
        let dir = std::fs::canonicalize(parent).unwrap_or_else(|_| normalize(parent));
        let abs_source = match abs.file_name() {
            Some(name) => dir.join(name),
            None => abs.clone(),
        };
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Ctx {
            path: source,
            dir,
            abs_source,
            line_starts,
            text,
            warnings: Vec::new(),
        }
    }

    fn line(&self, at: usize) -> usize {
        self.line_starts.partition_point(|&s| s <= at)
    }

    fn loc(&self, at: usize) -> Location {
        Location {
            path: self.path.to_path_buf(),
            line: Some(self.line(at)),
        }
    }

    fn loc_opt(&self, at: Option<usize>) -> Location {
        Location {
            path: self.path.to_path_buf(),
            line: at.map(|a| self.line(a)),
        }
    }

    fn syntax(&self, e: &toml::de::Error) -> ManifestError {
        let mut loc = self.loc_opt(None);
        let mut column = None;
        if let Some(span) = e.span() {
            let at = span.start.min(self.text.len());
            let line = self.line(at);
            let start = self.line_starts[line - 1];
            let col = self
                .text
                .get(start..at)
                .map_or(1, |s| s.chars().count() + 1);
            loc.line = Some(line);
            column = Some(col);
        }
        let mut message = e.message().trim_end().to_owned();
        if has_template(self.text) {
            message.push_str(
                "; the file looks like an unrendered Jinja template: render it first with \
                 gramine-manifest (Tardi takes rendered manifests)",
            );
        }
        ManifestError::Syntax {
            loc,
            column,
            message,
        }
    }

    fn wrong_type(&self, it: &Item<'_, '_>, expected: &'static str) -> ManifestError {
        ManifestError::WrongType {
            loc: self.loc(it.at),
            key: it.key.clone(),
            expected,
            found: type_name(it.val.get_ref()),
        }
    }

    fn invalid(&self, it: &Item<'_, '_>, reason: impl Into<String>) -> ManifestError {
        ManifestError::InvalidValue {
            loc: self.loc(it.at),
            key: it.key.clone(),
            reason: reason.into(),
        }
    }

    fn warn(&mut self, at: usize, msg: String) {
        let w = format!("{}: {msg}", self.loc(at));
        self.warnings.push((at, w));
    }

    /// A key with no meaning in its table: an ignored Gramine key (warning) or an error.
    fn other(&mut self, it: &Item<'_, '_>) -> R<()> {
        match ignored_reason(&it.key) {
            Some(reason) => {
                self.warn(
                    it.at,
                    format!("ignoring Gramine key '{}' ({reason})", it.key),
                );
                Ok(())
            }
            None => Err(self.unknown(it, &[])),
        }
    }

    /// Unknown-key error. For a table value, a leaf below it is named if that gives a better
    /// suggestion (`tard.name` → `tardi.name`).
    fn unknown(&self, it: &Item<'_, '_>, extra: &[String]) -> ManifestError {
        let (mut key, mut at) = (it.key.clone(), it.at);
        let mut suggestion = suggest(&key, extra);
        if let DeValue::Table(t) = it.val.get_ref()
            && let Some((leaf, leaf_at)) = first_leaf(&it.key, t)
        {
            let leaf_suggestion = suggest(&leaf, extra);
            if leaf_suggestion.is_some() || suggestion.is_none() {
                (key, at, suggestion) = (leaf, leaf_at, leaf_suggestion);
            }
        }
        ManifestError::UnknownKey {
            loc: self.loc(at),
            key,
            suggestion,
        }
    }

    /// Reject `{{ ... }}` / `{% ... %}` anywhere in a string value.
    fn check_templates(&self, t: &DeTable<'_>, prefix: &str) -> R<()> {
        for it in entries(prefix, t) {
            self.check_templates_val(&it.key, it.val)?;
        }
        Ok(())
    }

    fn check_templates_val(&self, key: &str, v: &Val<'_>) -> R<()> {
        match v.get_ref() {
            DeValue::String(s) if has_template(s) => Err(ManifestError::Template {
                loc: self.loc(v.span().start),
                key: key.to_owned(),
            }),
            DeValue::Table(t) => self.check_templates(t, key),
            DeValue::Array(a) => {
                for (i, el) in a.iter().enumerate() {
                    self.check_templates_val(&format!("{key}[{i}]"), el)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    // ---- typed accessors -------------------------------------------------------------------

    fn table<'a, 'i>(&self, it: &Item<'a, 'i>) -> R<&'a DeTable<'i>> {
        match it.val.get_ref() {
            DeValue::Table(t) => Ok(t),
            _ => Err(self.wrong_type(it, "a table")),
        }
    }

    fn string<'a>(&self, it: &Item<'a, '_>) -> R<&'a str> {
        match it.val.get_ref() {
            DeValue::String(s) => Ok(s.as_ref()),
            _ => Err(self.wrong_type(it, "a string")),
        }
    }

    fn boolean(&self, it: &Item<'_, '_>) -> R<bool> {
        match it.val.get_ref() {
            DeValue::Boolean(b) => Ok(*b),
            _ => Err(self.wrong_type(it, "a boolean (true or false)")),
        }
    }

    fn integer(&self, it: &Item<'_, '_>) -> R<i64> {
        match it.val.get_ref() {
            DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
                .map_err(|_| self.invalid(it, format!("integer {i} is out of range"))),
            _ => Err(self.wrong_type(it, "an integer")),
        }
    }

    fn number(&self, it: &Item<'_, '_>) -> R<f64> {
        let n = match it.val.get_ref() {
            DeValue::Integer(_) => self.integer(it)? as f64,
            DeValue::Float(f) => f.as_str().parse::<f64>().unwrap_or(f64::NAN),
            _ => return Err(self.wrong_type(it, "a number")),
        };
        if n.is_finite() {
            Ok(n)
        } else {
            Err(self.invalid(it, "must be a finite number"))
        }
    }

    fn array<'a, 'i>(&self, it: &Item<'a, 'i>, expected: &'static str) -> R<Vec<Item<'a, 'i>>> {
        match it.val.get_ref() {
            DeValue::Array(a) => Ok(a
                .iter()
                .enumerate()
                .map(|(i, val)| Item {
                    key: format!("{}[{i}]", it.key),
                    name: "",
                    at: val.span().start,
                    val,
                })
                .collect()),
            _ => Err(self.wrong_type(it, expected)),
        }
    }

    fn abs_path(&self, it: &Item<'_, '_>) -> R<PathBuf> {
        let s = self.string(it)?;
        check_abs(s).map_err(|reason| self.invalid(it, reason))
    }

    /// A Gramine size: integer bytes or a string with an optional K/M/G suffix.
    fn size(&self, it: &Item<'_, '_>) -> R<u64> {
        match it.val.get_ref() {
            DeValue::Integer(_) => match self.integer(it)? {
                n if n > 0 => Ok(n as u64),
                n => Err(self.invalid(it, format!("size must be positive, got {n}"))),
            },
            DeValue::String(s) => parse_size(s).map_err(|r| self.invalid(it, r)),
            _ => Err(self.wrong_type(it, "a size (bytes, or a string like \"8M\")")),
        }
    }

    // ---- tables -----------------------------------------------------------------------------

    fn libos(&mut self, it: &Item<'_, '_>, st: &mut State) -> R<()> {
        st.libos_at.get_or_insert(it.at);
        for e in entries(&it.key, self.table(it)?) {
            match e.name {
                "entrypoint" => st.entrypoint = Some(self.entrypoint(&e)?),
                _ => self.other(&e)?,
            }
        }
        Ok(())
    }

    /// `libos.entrypoint`: absolute (optionally `file:`), or `./`/`../` relative to the
    /// manifest's directory (a Tardi extension). Returns (path, offset, relative spelling).
    fn entrypoint(&self, it: &Item<'_, '_>) -> R<(PathBuf, usize, Option<String>)> {
        let raw = self.string(it)?;
        let s = raw.strip_prefix("file:").unwrap_or(raw);
        if s.starts_with("./") || s.starts_with("../") {
            let p = normalize(&self.dir.join(s));
            return Ok((p, it.at, Some(raw.to_owned())));
        }
        let p = check_abs(s).map_err(|r| {
            self.invalid(
                it,
                format!("{r} (or file:/abs/path, or ./path relative to the manifest's directory)"),
            )
        })?;
        Ok((p, it.at, None))
    }

    fn loader(&mut self, it: &Item<'_, '_>, st: &mut State) -> R<()> {
        for e in entries(&it.key, self.table(it)?) {
            match e.name {
                "argv" => {
                    let els = self.array(&e, "an array of strings")?;
                    if els.is_empty() {
                        return Err(self.invalid(&e, "must contain at least argv[0]"));
                    }
                    let argv = els
                        .iter()
                        .map(|el| self.string(el).map(str::to_owned))
                        .collect::<R<Vec<_>>>()?;
                    st.argv = Some(argv);
                }
                "env" => self.env(&e, st)?,
                _ => self.other(&e)?,
            }
        }
        Ok(())
    }

    fn env(&mut self, it: &Item<'_, '_>, st: &mut State) -> R<()> {
        for e in entries(&it.key, self.table(it)?) {
            let name = e.name;
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(self.invalid(&e, format!("'{name}' is not a valid variable name")));
            }
            match e.val.get_ref() {
                DeValue::String(s) => {
                    st.env.insert(name.to_owned(), s.to_string());
                }
                DeValue::Table(t) => {
                    let extra = [format!("{}.value", e.key), format!("{}.passthrough", e.key)];
                    let (mut value, mut passthrough) = (None, None);
                    for f in entries(&e.key, t) {
                        match f.name {
                            "value" => value = Some(self.string(&f)?),
                            "passthrough" => passthrough = Some(self.boolean(&f)?),
                            _ => return Err(self.unknown(&f, &extra)),
                        }
                    }
                    match (value, passthrough) {
                        (Some(v), None | Some(false)) => {
                            st.env.insert(name.to_owned(), v.to_owned());
                        }
                        (Some(_), Some(true)) => {
                            return Err(self.invalid(
                                &e,
                                "'value' and 'passthrough = true' exclude each other",
                            ));
                        }
                        // Gramine semantics: take the variable from Tardi's own environment.
                        (None, Some(true)) => {
                            if let Some(v) = std::env::var_os(name) {
                                st.env
                                    .insert(name.to_owned(), v.to_string_lossy().into_owned());
                            }
                        }
                        (None, Some(false)) => {}
                        (None, None) => {
                            return Err(self.invalid(
                                &e,
                                "expected { value = \"...\" } or { passthrough = true }",
                            ));
                        }
                    }
                }
                _ => {
                    return Err(self.wrong_type(&e, "a string or a table like { value = \"...\" }"));
                }
            }
        }
        Ok(())
    }

    fn fs(&mut self, it: &Item<'_, '_>, st: &mut State) -> R<()> {
        for e in entries(&it.key, self.table(it)?) {
            match e.name {
                "start_dir" => st.start_dir = Some(self.abs_path(&e)?),
                "mounts" => {
                    let expected =
                        "an array of tables like { path = \"/lib\", uri = \"file:/lib\" }";
                    for el in self.array(&e, expected)? {
                        self.mount(&el, st)?;
                    }
                }
                _ => self.other(&e)?,
            }
        }
        Ok(())
    }

    fn mount(&mut self, el: &Item<'_, '_>, st: &mut State) -> R<()> {
        let DeValue::Table(t) = el.val.get_ref() else {
            return Err(
                self.wrong_type(el, "a table like { path = \"/lib\", uri = \"file:/lib\" }")
            );
        };
        let extra = ["path", "uri", "type", "key_name"].map(|k| format!("{}.{k}", el.key));
        let (mut path, mut uri, mut kind) = (None, None, None);
        for e in entries(&el.key, t) {
            match e.name {
                "path" => path = Some((self.abs_path(&e)?, e)),
                "uri" => uri = Some((self.string(&e)?, e)),
                "type" => kind = Some((self.string(&e)?, e)),
                "key_name" => {
                    let msg = format!("ignoring Gramine key '{}' (no encrypted mounts)", e.key);
                    self.warn(e.at, msg);
                }
                _ => return Err(self.unknown(&e, &extra)),
            }
        }
        let Some((path, path_item)) = path else {
            return Err(ManifestError::MissingKey {
                loc: self.loc(el.at),
                key: format!("{}.path", el.key),
                hint: " (the mount point inside the sandbox)",
            });
        };
        let kind = match kind.as_ref().map(|(k, e)| (*k, e)) {
            None | Some(("chroot", _)) => {
                let Some((uri, uri_item)) = uri else {
                    return Err(ManifestError::MissingKey {
                        loc: self.loc(el.at),
                        key: format!("{}.uri", el.key),
                        hint: " (chroot mounts need uri = \"file:/host/path\")",
                    });
                };
                let host = match uri.strip_prefix("file:") {
                    Some(h) => h,
                    None if uri.starts_with("dev:") => {
                        return Err(self.invalid(&uri_item, "dev: URIs are not supported"));
                    }
                    None => {
                        return Err(self.invalid(
                            &uri_item,
                            format!("'{uri}' must look like \"file:/host/path\""),
                        ));
                    }
                };
                let host_path = check_abs(host).map_err(|r| self.invalid(&uri_item, r))?;
                MountKind::Bind {
                    host_path,
                    writable: false,
                }
            }
            Some(("tmpfs", _)) => {
                if let Some((_, uri_item)) = uri {
                    let msg = format!("ignoring '{}' (meaningless for tmpfs)", uri_item.key);
                    self.warn(uri_item.at, msg);
                }
                MountKind::Tmpfs
            }
            Some((k @ ("encrypted" | "untrusted_shm"), e)) => {
                return Err(self.invalid(
                    e,
                    format!("Gramine mount type '{k}' is not supported (use chroot or tmpfs)"),
                ));
            }
            Some((k, e)) => {
                return Err(self.invalid(
                    e,
                    format!("unknown mount type '{k}' (expected \"chroot\" or \"tmpfs\")"),
                ));
            }
        };
        if let Some((_, other, _)) = st.mounts.iter().find(|(m, _, _)| m.path == path) {
            return Err(self.invalid(
                &path_item,
                format!("'{}' is already mounted by {other}", path.display()),
            ));
        }
        st.mounts
            .push((Mount { path, kind }, el.key.clone(), el.at));
        Ok(())
    }

    fn sys(&mut self, it: &Item<'_, '_>, st: &mut State) -> R<()> {
        for e in entries(&it.key, self.table(it)?) {
            match e.name {
                "stack" => {
                    for f in entries(&e.key, self.table(&e)?) {
                        match f.name {
                            "size" => st.sys.stack_size = Some(self.size(&f)?),
                            _ => self.other(&f)?,
                        }
                    }
                }
                "brk" => {
                    for f in entries(&e.key, self.table(&e)?) {
                        match f.name {
                            "max_size" => st.sys.brk_max_size = Some(self.size(&f)?),
                            _ => self.other(&f)?,
                        }
                    }
                }
                "enable_sigterm_injection" => {
                    st.sys.enable_sigterm_injection = self.boolean(&e)?;
                }
                _ => self.other(&e)?,
            }
        }
        Ok(())
    }

    fn tardi(&mut self, it: &Item<'_, '_>, st: &mut State) -> R<()> {
        st.tardi_at.get_or_insert(it.at);
        for e in entries(&it.key, self.table(it)?) {
            match e.name {
                "name" => {
                    let name = self.string(&e)?;
                    check_name(name).map_err(|r| self.invalid(&e, r))?;
                    st.name = Some(name.to_owned());
                }
                "ports" => {
                    for el in self.array(&e, "an array of strings like [\"tcp:6379\"]")? {
                        let port =
                            parse_port(self.string(&el)?).map_err(|r| self.invalid(&el, r))?;
                        if st.ports.contains(&port) {
                            return Err(self.invalid(&el, "port listed twice"));
                        }
                        st.ports.push(port);
                    }
                }
                "private_dirs" => {
                    for el in self.array(&e, "an array of absolute paths")? {
                        let dir = self.abs_path(&el)?;
                        if dir == Path::new("/") {
                            return Err(self.invalid(&el, "'/' cannot be a private dir"));
                        }
                        if st.private_dirs.iter().any(|(d, _, _)| *d == dir) {
                            return Err(self.invalid(&el, "directory listed twice"));
                        }
                        st.private_dirs.push((dir, el.key.clone(), el.at));
                    }
                }
                "user" => {
                    let u = self.string(&e)?;
                    if u.is_empty() || u.contains([':', '\0', '\n']) {
                        return Err(self.invalid(&e, "must be a user name or a numeric user ID"));
                    }
                    st.user = Some(u.to_owned());
                }
                "epoch" => self.epoch(&e, st)?,
                "scrub" => {
                    for f in entries(&e.key, self.table(&e)?) {
                        match f.name {
                            "interval_ms" => match self.integer(&f)? {
                                n if (0..=86_400_000).contains(&n) => {
                                    st.scrub.interval_ms = n as u64
                                }
                                n => {
                                    return Err(self.invalid(
                                        &f,
                                        format!("must be in 0..=86400000 (a day; 0: off), got {n}"),
                                    ));
                                }
                            },
                            "pages" => match self.integer(&f)? {
                                n if (1..=65_536).contains(&n) => st.scrub.pages = n as u32,
                                n => {
                                    return Err(
                                        self.invalid(&f, format!("must be in 1..=65536, got {n}"))
                                    );
                                }
                            },
                            _ => return Err(self.unknown(&f, &[])),
                        }
                    }
                }
                "failover" => {
                    for f in entries(&e.key, self.table(&e)?) {
                        match f.name {
                            "max_failures" => match self.integer(&f)? {
                                n if (1..=1000).contains(&n) => st.failover.max_failures = n as u32,
                                n => {
                                    return Err(
                                        self.invalid(&f, format!("must be in 1..=1000, got {n}"))
                                    );
                                }
                            },
                            "window_s" => match self.integer(&f)? {
                                n if (1..=30 * 86_400).contains(&n) => {
                                    st.failover.window_s = n as u64
                                }
                                n => {
                                    return Err(self.invalid(
                                        &f,
                                        format!("must be in 1..=2592000 (30 days), got {n}"),
                                    ));
                                }
                            },
                            "max_backup_lag_ms" => match self.integer(&f)? {
                                n if (100..=3_600_000).contains(&n) => {
                                    st.failover.max_backup_lag_ms = n as u64
                                }
                                n => {
                                    return Err(self.invalid(
                                        &f,
                                        format!("must be in 100..=3600000 (an hour), got {n}"),
                                    ));
                                }
                            },
                            _ => return Err(self.unknown(&f, &[])),
                        }
                    }
                }
                "network" => {
                    for f in entries(&e.key, self.table(&e)?) {
                        match f.name {
                            "subnet" => {
                                st.network.subnet = parse_subnet(self.string(&f)?)
                                    .map_err(|r| self.invalid(&f, r))?;
                            }
                            _ => return Err(self.unknown(&f, &[])),
                        }
                    }
                }
                _ => return Err(self.unknown(&e, &[])),
            }
        }
        Ok(())
    }

    fn epoch(&mut self, it: &Item<'_, '_>, st: &mut State) -> R<()> {
        for e in entries(&it.key, self.table(it)?) {
            match e.name {
                "interval_ms" | "min_ms" => {
                    let v = self.number(&e)?;
                    if v <= 0.0 {
                        return Err(self.invalid(&e, format!("must be positive, got {v}")));
                    }
                    if e.name == "interval_ms" {
                        (st.epoch.interval_ms, st.interval_at) = (v, Some(e.at));
                    } else {
                        (st.epoch.min_ms, st.min_at) = (v, Some(e.at));
                    }
                }
                "follow_releases" => st.epoch.follow_releases = self.boolean(&e)?,
                "follow_min_ms" => match self.number(&e)? {
                    v if v >= 0.0 => (st.epoch.follow_min_ms, st.follow_at) = (v, Some(e.at)),
                    v => return Err(self.invalid(&e, format!("must not be negative, got {v}"))),
                },
                "after_release_ms" => match self.number(&e)? {
                    v if v >= 0.0 => st.epoch.after_release_ms = v,
                    v => return Err(self.invalid(&e, format!("must not be negative, got {v}"))),
                },
                "cap_pages" => match self.integer(&e)? {
                    n if n > 0 => st.epoch.cap_pages = n as u64,
                    n => return Err(self.invalid(&e, format!("must be positive, got {n}"))),
                },
                "hot_epochs" => match self.integer(&e)? {
                    n if n > 0 && n <= i64::from(u32::MAX) => st.epoch.hot_epochs = n as u32,
                    n => {
                        return Err(
                            self.invalid(&e, format!("must be in 1..={}, got {n}", u32::MAX))
                        );
                    }
                },
                "precopy_min_pages" => match self.integer(&e)? {
                    n if n >= 0 => st.epoch.precopy_min_pages = n as u64,
                    n => return Err(self.invalid(&e, format!("must not be negative, got {n}"))),
                },
                "encode_budget" => match self.integer(&e)? {
                    n if (0..=i64::from(u32::MAX)).contains(&n) => {
                        st.epoch.encode_budget = n as u32
                    }
                    n => {
                        return Err(
                            self.invalid(&e, format!("must be in 0..={}, got {n}", u32::MAX))
                        );
                    }
                },
                "tracker" => match self.string(&e)? {
                    t @ ("uffd" | "mprotect") => st.epoch.tracker = t.to_string(),
                    t => {
                        return Err(self
                            .invalid(&e, format!("must be \"uffd\" or \"mprotect\", got {t:?}")));
                    }
                },
                _ => return Err(self.unknown(&e, &[])),
            }
        }
        Ok(())
    }

    // ---- cross-key checks ---------------------------------------------------------------

    fn finish(&self, st: State) -> R<Manifest> {
        let Some((entrypoint, entry_at, relative)) = st.entrypoint else {
            return Err(ManifestError::MissingKey {
                loc: self.loc_opt(st.libos_at),
                key: "libos.entrypoint".into(),
                hint: " (the binary to run, e.g. libos.entrypoint = \"/usr/bin/redis-server\")",
            });
        };
        let Some(name) = st.name else {
            return Err(ManifestError::MissingKey {
                loc: self.loc_opt(st.tardi_at),
                key: "tardi.name".into(),
                hint: " (every Tardi service needs a [tardi] table with name = \"...\")",
            });
        };
        let mut epoch = st.epoch;
        if st.follow_at.is_none() {
            epoch.follow_min_ms = epoch.follow_min_ms.min(epoch.min_ms);
        }
        if epoch.min_ms > epoch.interval_ms {
            let (key, at) = if st.min_at.is_some() {
                ("min_ms", st.min_at)
            } else {
                ("interval_ms", st.interval_at)
            };
            return Err(ManifestError::InvalidValue {
                loc: self.loc_opt(at),
                key: format!("tardi.epoch.{key}"),
                reason: format!(
                    "min_ms ({}) must not exceed interval_ms ({})",
                    epoch.min_ms, epoch.interval_ms
                ),
            });
        }

        if epoch.follow_min_ms > epoch.min_ms {
            return Err(ManifestError::InvalidValue {
                loc: self.loc_opt(st.follow_at),
                key: "tardi.epoch.follow_min_ms".into(),
                reason: format!(
                    "follow_min_ms ({}) must not exceed min_ms ({})",
                    epoch.follow_min_ms, epoch.min_ms
                ),
            });
        }

        let private: Vec<PathBuf> = st.private_dirs.iter().map(|(d, _, _)| d.clone()).collect();
        if !st.mounts.is_empty() {
            for (dir, key, at) in &st.private_dirs {
                // The deepest mount containing the dir decides what backs it.
                let cover = st
                    .mounts
                    .iter()
                    .filter(|(m, _, _)| dir.starts_with(&m.path))
                    .max_by_key(|(m, _, _)| m.path.components().count());
                let reason = match cover {
                    Some((
                        Mount {
                            kind: MountKind::Bind { .. },
                            ..
                        },
                        _,
                        _,
                    )) => continue,
                    Some((m, mkey, _)) => format!(
                        "'{}' lies in the tmpfs mount {mkey} ('{}'); a private dir must be \
                         backed by a bind mount (uri = \"file:...\")",
                        dir.display(),
                        m.path.display()
                    ),
                    None => format!(
                        "'{}' is not covered by any fs.mounts entry; add one like {{ path = \"{}\", \
                         uri = \"file:/host/dir\" }}",
                        dir.display(),
                        dir.display()
                    ),
                };
                return Err(ManifestError::InvalidValue {
                    loc: self.loc(*at),
                    key: key.clone(),
                    reason,
                });
            }
        }
        let mounts = st
            .mounts
            .into_iter()
            .map(|(mut m, _, _)| {
                if let MountKind::Bind { writable, .. } = &mut m.kind {
                    *writable = private.iter().any(|d| m.path.starts_with(d));
                }
                m
            })
            .collect();

        self.check_binary(&entrypoint, entry_at, relative.as_deref())?;
        let argv = st
            .argv
            .unwrap_or_else(|| vec![entrypoint.to_string_lossy().into_owned()]);
        Ok(Manifest {
            source: self.abs_source.clone(),
            entrypoint,
            argv,
            env: st.env,
            start_dir: st.start_dir.unwrap_or_else(|| PathBuf::from("/")),
            mounts,
            sys: st.sys,
            tardi: Tardi {
                name,
                ports: st.ports,
                private_dirs: private,
                user: st.user,
                epoch,
                network: st.network,
                failover: st.failover,
                scrub: st.scrub,
            },
        })
    }

    fn check_binary(&self, p: &Path, at: usize, relative: Option<&str>) -> R<()> {
        let reason = match std::fs::metadata(p) {
            Ok(m) if !m.is_file() => format!("'{}' is not a regular file", p.display()),
            Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                format!("'{}' is not executable", p.display())
            }
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                format!("binary '{}' does not exist", p.display())
            }
            Err(e) => format!("cannot access binary '{}': {e}", p.display()),
        };
        let reason = match relative {
            Some(rel) => format!(
                "{reason} ('{rel}' is resolved against the manifest's directory {})",
                self.dir.display()
            ),
            None => reason,
        };
        Err(ManifestError::MissingBinary {
            loc: self.loc(at),
            key: "libos.entrypoint".into(),
            binary: p.to_path_buf(),
            reason,
        })
    }
}

/// First leaf (non-table value) below `t`, in file order, as (full key, offset).
fn first_leaf(prefix: &str, t: &DeTable<'_>) -> Option<(String, usize)> {
    let first = entries(prefix, t).into_iter().next()?;
    if let DeValue::Table(sub) = first.val.get_ref()
        && let Some(leaf) = first_leaf(&first.key, sub)
    {
        return Some(leaf);
    }
    Some((first.key, first.at))
}

/// Closest known key within a small edit distance of `key`'s last segment.
fn suggest(key: &str, extra: &[String]) -> Option<String> {
    let seg_len = key.rsplit('.').next().unwrap_or(key).chars().count();
    let max = match seg_len {
        0..=3 => 1,
        4..=8 => 2,
        _ => 3,
    };
    KNOWN_KEYS
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .map(|k| (edit_distance(key, k), k))
        .filter(|&(d, _)| d > 0 && d <= max && d < seg_len)
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k.to_owned())
}

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// Lexically resolve `.` and `..` (no symlinks followed).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// An absolute path without `..`, normalized (no `.`, no duplicate or trailing slashes).
fn check_abs(s: &str) -> Result<PathBuf, String> {
    if !s.starts_with('/') {
        return Err(format!("'{s}' must be an absolute path"));
    }
    if s.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    let p = Path::new(s);
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(format!("'{s}' must not contain '..'"));
    }
    Ok(p.components().collect())
}

/// `[a-z0-9][a-z0-9-]{0,30}`.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let ok_first = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let ok_rest = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok_first && ok_rest && name.len() <= 31 {
        Ok(())
    } else {
        Err(format!(
            "'{name}' is not a valid service name (1-31 characters: lowercase letters, digits \
             and '-', not starting with '-')"
        ))
    }
}

/// `tcp:6379` / `udp:9000`.
pub(crate) fn parse_port(s: &str) -> Result<Port, String> {
    let bad =
        || format!("'{s}' is not a port; expected \"tcp:PORT\" or \"udp:PORT\" with PORT 1-65535");
    let (proto, num) = s.split_once(':').ok_or_else(bad)?;
    let proto = match proto {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        _ => return Err(bad()),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match num.parse::<u16>() {
        Ok(port) if port > 0 => Ok(Port { proto, port }),
        _ => Err(bad()),
    }
}

/// Gramine size string: decimal digits with an optional K/M/G suffix (case-insensitive).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("'{s}' is not a size; expected bytes or a number with suffix K, M or G");
    let (digits, mult) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is too large"))?;
    if n == 0 {
        return Err("size must be positive".into());
    }
    Ok(n)
}

/// A /16-aligned IPv4 network address (`10.213.0.0`, optionally written `10.213.0.0/16`).
pub(crate) fn parse_subnet(s: &str) -> Result<Ipv4Addr, String> {
    let addr = s.strip_suffix("/16").unwrap_or(s);
    let ip: Ipv4Addr = addr
        .parse()
        .map_err(|_| format!("'{s}' is not an IPv4 address like \"10.213.0.0\""))?;
    let [_, _, c, d] = ip.octets();
    if c != 0 || d != 0 {
        return Err(format!(
            "'{s}' is not /16-aligned (the last two octets must be 0)"
        ));
    }
    Ok(ip)
}
