//! [`ManifestError`]: what a user sees when a manifest is wrong.

use std::fmt;
use std::path::PathBuf;

/// Where in a manifest file something is: `path[:line]`, lines 1-based.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The manifest file, as the caller named it.
    pub path: PathBuf,
    /// 1-based line, when the problem has one (a missing key may not).
    pub line: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        Ok(())
    }
}

/// Why a manifest could not be loaded. The `Display` text is the user-facing message: it starts
/// with `file:line:` and names the full dotted key (`fs.mounts[1].uri`, `tardi.epoch.min_ms`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The file could not be read.
    #[error("{}: cannot read manifest", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML. `column` is 1-based, in characters.
    #[error("{loc}{}: TOML syntax error: {message}", column.map(|c| format!(":{c}")).unwrap_or_default())]
    Syntax {
        loc: Location,
        column: Option<usize>,
        message: String,
    },
    /// A key neither Tardi nor Gramine knows.
    #[error("{loc}: unknown key '{key}'{}", did_you_mean(.suggestion))]
    UnknownKey {
        loc: Location,
        key: String,
        suggestion: Option<String>,
    },
    /// A key whose value has the wrong TOML type.
    #[error("{loc}: '{key}' must be {expected}, not {found}")]
    WrongType {
        loc: Location,
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    /// A key whose value has the right type but is not acceptable.
    #[error("{loc}: invalid value for '{key}': {reason}")]
    InvalidValue {
        loc: Location,
        key: String,
        reason: String,
    },
    /// A required key is absent. `loc.line` is the enclosing table's line when there is one.
    #[error("{loc}: missing required key '{key}'{hint}")]
    MissingKey {
        loc: Location,
        key: String,
        hint: &'static str,
    },
    /// `libos.entrypoint` does not name an existing executable regular file.
    #[error("{loc}: '{key}': {reason}")]
    MissingBinary {
        loc: Location,
        key: String,
        binary: PathBuf,
        reason: String,
    },
    /// A value still contains Jinja template syntax (`{{ ... }}` or `{% ... %}`).
    #[error(
        "{loc}: '{key}' contains an unrendered Jinja template ('{{{{' or '{{%'): \
         this manifest must be rendered first (gramine-manifest -Dkey=value in.manifest.template \
         out.manifest); Tardi takes rendered manifests"
    )]
    Template { loc: Location, key: String },
}

fn did_you_mean(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!(" (did you mean '{s}'?)"),
        None => String::new(),
    }
}

impl ManifestError {
    /// The manifest position the error refers to, if any (not for [`ManifestError::Io`]).
    pub fn location(&self) -> Option<&Location> {
        match self {
            ManifestError::Io { .. } => None,
            ManifestError::Syntax { loc, .. }
            | ManifestError::UnknownKey { loc, .. }
            | ManifestError::WrongType { loc, .. }
            | ManifestError::InvalidValue { loc, .. }
            | ManifestError::MissingKey { loc, .. }
            | ManifestError::MissingBinary { loc, .. }
            | ManifestError::Template { loc, .. } => Some(loc),
        }
    }

    /// 1-based line of the offending key or value, if known.
    pub fn line(&self) -> Option<usize> {
        self.location().and_then(|l| l.line)
    }

    /// Full dotted key the error is about (`tardi.ports`, `fs.mounts[0].path`), if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            ManifestError::Io { .. } | ManifestError::Syntax { .. } => None,
            ManifestError::UnknownKey { key, .. }
            | ManifestError::WrongType { key, .. }
            | ManifestError::InvalidValue { key, .. }
            | ManifestError::MissingKey { key, .. }
            | ManifestError::MissingBinary { key, .. }
            | ManifestError::Template { key, .. } => Some(key),
        }
    }
}
