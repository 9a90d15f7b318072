//! A cluster's certificate authority and its nodes' certificates (`tardi certs`, and the lab).
//!
//! Layout of a directory made here:
//! - `ca.pem`, `ca.key`: the cluster's CA. The key signs every node certificate and stays on the
//!   machine that made them (it is needed only to add nodes later);
//! - `NAME/ca.pem`, `NAME/node.pem`, `NAME/node.key`: one directory per node, what that node's
//!   `--tls-dir` points at (copy it to the node, e.g. `/etc/tardi/tls`).
//!
//! Keys are ECDSA P-256, written with mode 0600. A node certificate's subject is `CN=NAME,
//! OU=ROLE`; its subject alternative names are the node's name (as a DNS name) and the
//! addresses given for it, which is what a peer dialling `https://ADDR:PORT` checks. Servers
//! (orchestrators, instances: their checkpoint stream) may act as TLS servers and clients; a
//! client identity (the CLI) only as a client.
//!
//! Owns: key and certificate generation and their files. Must not know: how they are used.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// File names inside a node's directory (and the CA's, at the top).
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const NODE_CERT: &str = "node.pem";
pub const NODE_KEY: &str = "node.key";

/// The CA's subject. Fixed, so that a CA found in a directory can sign again with its key alone
/// (the issuer name in a certificate must equal the CA's subject byte for byte).
const CA_CN: &str = "Tardi cluster CA";
const ORG: &str = "Tardi";

/// What a node does, written into its certificate's subject (`OU`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Orchestrator,
    Instance,
    Client,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Orchestrator => "orchestrator",
            Role::Instance => "instance",
            Role::Client => "client",
        }
    }
}

/// One certificate to make.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub role: Role,
    /// IP addresses or DNS names peers use to reach it (subject alternative names besides the
    /// name itself).
    pub addrs: Vec<String>,
}

impl NodeSpec {
    /// Parses `NAME=ADDR[,ADDR…]` (or `NAME` alone, for a client).
    pub fn parse(role: Role, s: &str) -> Result<NodeSpec, CertError> {
        let (name, addrs) = match s.split_once('=') {
            Some((n, a)) => (n.trim(), a),
            None => (s.trim(), ""),
        };
        let addrs: Vec<String> = addrs
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect();
        check_name(name)?;
        if role != Role::Client && addrs.is_empty() {
            return Err(CertError::NoAddress {
                node: name.to_string(),
                role: role.as_str(),
            });
        }
        for a in &addrs {
            if a.parse::<IpAddr>().is_err() && check_name(a).is_err() {
                return Err(CertError::BadAddress {
                    node: name.to_string(),
                    addr: a.clone(),
                });
            }
        }
        Ok(NodeSpec {
            name: name.to_string(),
            role,
            addrs,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error(
        "{0:?} is not a node name: use letters, digits, '-' and '.' (it becomes a DNS name in the certificate and a directory name)"
    )]
    BadName(String),
    #[error(
        "the {role} {node:?} needs its address (NAME=ADDR[,ADDR…]): peers check it when they connect"
    )]
    NoAddress { node: String, role: &'static str },
    #[error("{addr:?} (for {node:?}) is neither an IP address nor a DNS name")]
    BadAddress { node: String, addr: String },
    #[error("{0:?} is named twice")]
    Duplicate(String),
    #[error("nothing to make: name at least one --orchestrator, --instance or --client")]
    NoNodes,
    #[error("--days must be at least 1")]
    NoDays,
    #[error(
        "{} already exist(s); pass --force to replace them (the CA in the directory is kept and signs the new certificates)",
        .0.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    Exists(Vec<PathBuf>),
    #[error("{} exists without {}: restore it or remove the directory to make a new CA", .have.display(), .missing.display())]
    HalfCa { have: PathBuf, missing: PathBuf },
    #[error("reading the CA key {}: {source}", .path.display())]
    CaKey { path: PathBuf, source: rcgen::Error },
    #[error("generating a certificate for {what}: {source}")]
    Generate { what: String, source: rcgen::Error },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A name usable as a DNS name and a directory: letters, digits, '-', '.' (no empty label, no
/// leading or trailing '-').
fn check_name(name: &str) -> Result<(), CertError> {
    let bad = || CertError::BadName(name.to_string());
    if name.is_empty() || name.len() > 253 {
        return Err(bad());
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !ok {
            return Err(bad());
        }
    }
    if name == "ca" {
        return Err(bad());
    }
    Ok(())
}

/// What [`make`] did.
#[derive(Debug)]
pub struct Made {
    /// A new CA was made (else the directory's was used).
    pub new_ca: bool,
    /// Each node's directory, in the order given.
    pub nodes: Vec<PathBuf>,
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_CN);
    dn.push(DnType::OrganizationName, ORG);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p
}

fn validity(p: &mut CertificateParams, days: u32) {
    let now = OffsetDateTime::now_utc();
    // An hour back: machines whose clocks differ a little accept a certificate just made.
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(days.into());
}

/// Writes `text` to `path`, replacing it; `private` files get mode 0600.
fn write_file(path: &Path, text: &str, private: bool) -> Result<(), CertError> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    if private {
        o.mode(0o600);
    }
    let mut f = o.open(path).map_err(io_err(path))?;
    f.write_all(text.as_bytes()).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

/// Makes (or reuses, if `dir` has one) a CA in `dir` and a certificate and key per node.
/// Nothing is written if any node's files exist and `force` is false.
pub fn make(dir: &Path, nodes: &[NodeSpec], days: u32, force: bool) -> Result<Made, CertError> {
    if nodes.is_empty() {
        return Err(CertError::NoNodes);
    }
    if days == 0 {
        return Err(CertError::NoDays);
    }
    let mut seen = std::collections::HashSet::new();
    for n in nodes {
        if !seen.insert(n.name.as_str()) {
            return Err(CertError::Duplicate(n.name.clone()));
        }
    }
    let (ca_cert, ca_key) = (dir.join(CA_CERT), dir.join(CA_KEY));
    let new_ca = match (ca_cert.exists(), ca_key.exists()) {
        (true, true) => false,
        (false, false) => true,
        (true, false) => {
            return Err(CertError::HalfCa {
                have: ca_cert,
                missing: ca_key,
            });
        }
        (false, true) => {
            return Err(CertError::HalfCa {
                have: ca_key,
                missing: ca_cert,
            });
        }
    };
    if !force {
        let existing: Vec<PathBuf> = nodes
            .iter()
            .flat_map(|n| {
                let d = dir.join(&n.name);
                [d.join(CA_CERT), d.join(NODE_CERT), d.join(NODE_KEY)]
            })
            .filter(|p| p.exists())
            .collect();
        if !existing.is_empty() {
            return Err(CertError::Exists(existing));
        }
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let gen_err = |what: &str| {
        let what = what.to_string();
        move |source| CertError::Generate { what, source }
    };
    let (ca_pem, key) = if new_ca {
        let key = KeyPair::generate().map_err(gen_err("the CA"))?;
        let mut p = ca_params();
        // Ten years more than the nodes: nodes can be re-issued under the same CA.
        validity(&mut p, days.saturating_add(3650));
        let cert = p.self_signed(&key).map_err(gen_err("the CA"))?;
        write_file(&ca_key, &key.serialize_pem(), true)?;
        write_file(&ca_cert, &cert.pem(), false)?;
        tracing::info!(dir = %dir.display(), "made a new cluster CA");
        (cert.pem(), key)
    } else {
        let pem = std::fs::read_to_string(&ca_key).map_err(io_err(&ca_key))?;
        let key = KeyPair::from_pem(&pem).map_err(|source| CertError::CaKey {
            path: ca_key.clone(),
            source,
        })?;
        let cert = std::fs::read_to_string(&ca_cert).map_err(io_err(&ca_cert))?;
        (cert, key)
    };
    let issuer = Issuer::new(ca_params(), key);
    let mut made = Vec::new();
    for n in nodes {
        let key = KeyPair::generate().map_err(gen_err(&n.name))?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, n.name.as_str());
        dn.push(DnType::OrganizationalUnitName, n.role.as_str());
        dn.push(DnType::OrganizationName, ORG);
        p.distinguished_name = dn;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = match n.role {
            Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Role::Orchestrator | Role::Instance => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        let mut sans = vec![n.name.clone()];
        sans.extend(n.addrs.iter().cloned());
        sans.dedup();
        p.subject_alt_names = sans
            .iter()
            .map(|a| match a.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => a.as_str().try_into().map(SanType::DnsName),
            })
            .collect::<Result<_, _>>()
            .map_err(gen_err(&n.name))?;
        validity(&mut p, days);
        let cert = p.signed_by(&key, &issuer).map_err(gen_err(&n.name))?;
        let d = dir.join(&n.name);
        std::fs::create_dir_all(&d).map_err(io_err(&d))?;
        write_file(&d.join(CA_CERT), &ca_pem, false)?;
        write_file(&d.join(NODE_CERT), &cert.pem(), false)?;
        write_file(&d.join(NODE_KEY), &key.serialize_pem(), true)?;
        made.push(d);
    }
    Ok(Made {
        new_ca,
        nodes: made,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let n = NodeSpec::parse(Role::Orchestrator, "o1=10.0.0.11,o1.example").unwrap();
        assert_eq!(n.name, "o1");
        assert_eq!(n.addrs, ["10.0.0.11", "o1.example"]);
        assert!(
            NodeSpec::parse(Role::Client, "admin")
                .unwrap()
                .addrs
                .is_empty()
        );
        assert!(matches!(
            NodeSpec::parse(Role::Instance, "m1"),
            Err(CertError::NoAddress { .. })
        ));
        assert!(matches!(
            NodeSpec::parse(Role::Instance, "../m1=10.0.0.1"),
            Err(CertError::BadName(_))
        ));
        assert!(matches!(
            NodeSpec::parse(Role::Instance, "m1=10.0.0.1,not an addr"),
            Err(CertError::BadAddress { .. })
        ));
        assert!(matches!(
            NodeSpec::parse(Role::Client, "ca"),
            Err(CertError::BadName(_))
        ));
    }
}
