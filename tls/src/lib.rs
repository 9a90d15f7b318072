//! Mutual TLS between Tardi's nodes.
//!
//! Every connection between nodes (orchestrator ↔ orchestrator, instance → orchestrator, CLI →
//! orchestrator, primary → backup on the checkpoint stream) is TLS 1.3 in which *both* ends
//! present a certificate signed by the cluster's CA ([`certs`] makes them) and check the
//! other's. A node knows its [`Security`]: a TLS identity loaded from a directory
//! (`--tls-dir`), or plaintext, which only an explicit `--insecure-plaintext` selects.
//!
//! Crypto is rustls with the *ring* provider, for the gRPC connections (tonic) and the
//! checkpoint stream (rustls directly: [`Identity::stream_client`], [`Identity::stream_server`]).
//!
//! Owns: loading identities, building TLS configurations, the URL scheme. Must not know: any
//! protocol carried inside.
//!
//! Trust model. `tardi certs` (or `tardi lab up`) makes one CA per cluster; its key (`ca.key`)
//! stays where the certificates were made and never goes to a node. Each node holds its own key
//! and certificate and the CA's certificate (`--tls-dir`): every orchestrator and instance (a
//! certificate usable as TLS server and client, naming the node and its addresses) and each
//! operator's CLI (a client identity, `TARDI_TLS_DIR`). Every connection between nodes is TLS
//! in which both ends present a certificate the CA signed and check the other's: orchestrator
//! ↔ orchestrator (raft), instance → orchestrator (session, activation), CLI → orchestrator,
//! and primary → backup on the checkpoint stream (which carries the service's whole memory). A
//! dialler also checks that the server's certificate names the address it dialled. A peer
//! without such a certificate fails the handshake and reaches no handler. Not distinguished:
//! any holder of a certificate from the cluster's CA is trusted for every call (roles, `OU`,
//! are recorded but not enforced per RPC); there is no revocation list (re-issue the CA to
//! remove a node). The Prometheus endpoints (`--metrics`) stay plain HTTP and read-only.
//! Malformed input from an authenticated peer is refused without stopping the node (tonic
//! refuses undecodable protobuf, handlers check ranges: `orchestrator/tests/tls.rs`; the
//! checkpoint stream checks limits before allocating and the backup checks every checkpoint).

pub mod certs;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where the CLI and the daemons find their TLS directory when `--tls-dir` is not given.
pub const ENV_DIR: &str = "TARDI_TLS_DIR";

/// How long a peer has to complete a TLS handshake with a server.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "no TLS identity for {who}: pass --tls-dir DIR (or set {ENV_DIR}) naming this node's directory made by `tardi certs` (e.g. `tardi certs /etc/tardi/pki --orchestrator o1=10.0.0.11 --instance m1=10.0.0.21 --client admin`, then DIR is /etc/tardi/pki/NODE), or pass --insecure-plaintext to run without encryption or authentication"
    )]
    NoIdentity { who: String },
    #[error("--tls-dir and --insecure-plaintext exclude each other")]
    Both,
    #[error("reading {}: {source} (make it with `tardi certs`)", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {what} (make it with `tardi certs`)", .path.display())]
    Pem { path: PathBuf, what: String },
    #[error("building the TLS configuration from {}: {source}", .dir.display())]
    Config { dir: PathBuf, source: rustls::Error },
    #[error("building the TLS client verifier from {}: {source}", .dir.display())]
    Verifier {
        dir: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
}

/// A node's TLS identity: the cluster CA it trusts, its certificate and key.
pub struct Identity {
    dir: PathBuf,
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
    stream_client: Arc<rustls::ClientConfig>,
    stream_server: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("dir", &self.dir).finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's rustls provider (tonic's server builds its configuration with the
/// process default). Harmless when already done.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn pem_certs(path: &Path, text: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            what: "no certificate in it".into(),
        });
    }
    Ok(certs)
}

impl Identity {
    /// Loads `DIR/ca.pem`, `DIR/node.pem` and `DIR/node.key` (a node's directory made by
    /// [`certs::make`]) and checks that they make a usable configuration.
    pub fn load(dir: &Path) -> Result<Identity, TlsError> {
        install_provider();
        let (ca_path, cert_path, key_path) = (
            dir.join(certs::CA_CERT),
            dir.join(certs::NODE_CERT),
            dir.join(certs::NODE_KEY),
        );
        let (ca_pem, cert_pem, key_pem) = (read(&ca_path)?, read(&cert_path)?, read(&key_path)?);
        let ca = pem_certs(&ca_path, &ca_pem)?;
        let chain = pem_certs(&cert_path, &cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Pem {
            path: key_path.clone(),
            what: e.to_string(),
        })?;
        let mut roots = rustls::RootCertStore::empty();
        for c in ca {
            roots.add(c).map_err(|source| TlsError::Config {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let roots = Arc::new(roots);
        let cfg_err = |source| TlsError::Config {
            dir: dir.to_path_buf(),
            source,
        };
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(cfg_err)?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(cfg_err)?;
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|source| TlsError::Verifier {
                    dir: dir.to_path_buf(),
                    source,
                })?;
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(cfg_err)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(cfg_err)?;
        Ok(Identity {
            dir: dir.to_path_buf(),
            ca_pem,
            cert_pem,
            key_pem,
            stream_client: Arc::new(client),
            stream_server: Arc::new(server),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The rustls configuration of a checkpoint stream's client (the primary): it presents this
    /// node's certificate and accepts a backup whose certificate the CA signed for the address
    /// dialled.
    pub fn stream_client(&self) -> Arc<rustls::ClientConfig> {
        self.stream_client.clone()
    }

    /// The rustls configuration of a checkpoint stream's server (a backup): only clients with a
    /// certificate from the CA complete the handshake.
    pub fn stream_server(&self) -> Arc<rustls::ServerConfig> {
        self.stream_server.clone()
    }
}

/// How a node talks to the others.
#[derive(Debug, Clone)]
pub enum Security {
    /// Mutual TLS with this identity.
    Tls(Arc<Identity>),
    /// No encryption, no authentication (`--insecure-plaintext`).
    Plaintext,
}

impl Security {
    /// From the command-line flags: a TLS directory, or the explicit plaintext flag; neither
    /// is an error that says how to make certificates. `who` names the program in it.
    pub fn from_flags(
        tls_dir: Option<&Path>,
        insecure_plaintext: bool,
        who: &str,
    ) -> Result<Security, TlsError> {
        match (tls_dir, insecure_plaintext) {
            (Some(_), true) => Err(TlsError::Both),
            (Some(d), false) => Ok(Security::Tls(Arc::new(Identity::load(d)?))),
            (None, true) => {
                tracing::warn!(
                    "--insecure-plaintext: connections between nodes are neither encrypted nor authenticated"
                );
                Ok(Security::Plaintext)
            }
            (None, false) => Err(TlsError::NoIdentity {
                who: who.to_string(),
            }),
        }
    }

    /// Loads the identity in `dir` (tests and the lab).
    pub fn tls(dir: &Path) -> Result<Security, TlsError> {
        Ok(Security::Tls(Arc::new(Identity::load(dir)?)))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Security::Tls(_))
    }

    /// `url` (`http://host:port`, `https://…` or `host:port`) with the scheme this security
    /// dials: `https` with TLS, `http` without.
    pub fn url(&self, url: &str) -> String {
        let rest = url
            .trim()
            .strip_prefix("http://")
            .or_else(|| url.trim().strip_prefix("https://"))
            .unwrap_or(url.trim());
        match self {
            Security::Tls(_) => format!("https://{rest}"),
            Security::Plaintext => format!("http://{rest}"),
        }
    }

    /// A tonic endpoint for `url` (any scheme: see [`Security::url`]), with this node's TLS
    /// identity when it has one. The server's certificate must name the host of `url`.
    pub fn endpoint(
        &self,
        url: &str,
    ) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
        let ep = tonic::transport::Endpoint::from_shared(self.url(url))?;
        match self {
            Security::Plaintext => Ok(ep),
            Security::Tls(id) => ep.tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(&id.ca_pem))
                    .identity(tonic::transport::Identity::from_pem(
                        &id.cert_pem,
                        &id.key_pem,
                    )),
            ),
        }
    }

    /// The checkpoint stream's client configuration ([`Identity::stream_client`]); `None`:
    /// plaintext.
    pub fn stream_client(&self) -> Option<Arc<rustls::ClientConfig>> {
        match self {
            Security::Tls(id) => Some(id.stream_client()),
            Security::Plaintext => None,
        }
    }

    /// The checkpoint stream's server configuration ([`Identity::stream_server`]); `None`:
    /// plaintext.
    pub fn stream_server(&self) -> Option<Arc<rustls::ServerConfig>> {
        match self {
            Security::Tls(id) => Some(id.stream_server()),
            Security::Plaintext => None,
        }
    }

    /// The gRPC server's TLS configuration: clients must present a certificate from the CA.
    pub fn server_tls(&self) -> Option<tonic::transport::ServerTlsConfig> {
        match self {
            Security::Plaintext => None,
            Security::Tls(id) => Some(
                tonic::transport::ServerTlsConfig::new()
                    .identity(tonic::transport::Identity::from_pem(
                        &id.cert_pem,
                        &id.key_pem,
                    ))
                    .client_ca_root(tonic::transport::Certificate::from_pem(&id.ca_pem))
                    .timeout(HANDSHAKE_TIMEOUT),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use certs::{NodeSpec, Role};

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tardi-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn made_identities_load_and_files_are_not_overwritten_without_force() {
        let dir = temp("make");
        let nodes = [
            NodeSpec::parse(Role::Orchestrator, "o1=127.0.0.1").unwrap(),
            NodeSpec::parse(Role::Client, "admin").unwrap(),
        ];
        let made = certs::make(&dir, &nodes, 30, false).unwrap();
        assert!(made.new_ca);
        let o1 = Identity::load(&dir.join("o1")).unwrap();
        assert_eq!(o1.dir(), dir.join("o1"));
        Identity::load(&dir.join("admin")).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.join("o1/node.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let before = std::fs::read(dir.join("o1/node.pem")).unwrap();
        assert!(matches!(
            certs::make(&dir, &nodes, 30, false),
            Err(certs::CertError::Exists(_))
        ));
        assert_eq!(std::fs::read(dir.join("o1/node.pem")).unwrap(), before);
        // --force: new node certificates, the same CA.
        let ca = std::fs::read(dir.join("ca.pem")).unwrap();
        let made = certs::make(&dir, &nodes, 30, true).unwrap();
        assert!(!made.new_ca);
        assert_ne!(std::fs::read(dir.join("o1/node.pem")).unwrap(), before);
        assert_eq!(std::fs::read(dir.join("o1/ca.pem")).unwrap(), ca);
        // A node added later under the kept CA.
        certs::make(
            &dir,
            &[NodeSpec::parse(Role::Instance, "m1=127.0.0.2").unwrap()],
            30,
            false,
        )
        .unwrap();
        Identity::load(&dir.join("m1")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_identity_says_how_to_make_one() {
        let e = Security::from_flags(None, false, "tardi orchestrator").unwrap_err();
        assert!(e.to_string().contains("tardi certs"), "{e}");
        assert!(e.to_string().contains("--insecure-plaintext"), "{e}");
        let e = Identity::load(Path::new("/nonexistent/tardi")).unwrap_err();
        assert!(e.to_string().contains("ca.pem"), "{e}");
        assert!(matches!(
            Security::from_flags(Some(Path::new("/x")), true, "x"),
            Err(TlsError::Both)
        ));
        assert!(Security::from_flags(None, true, "x").is_ok());
    }

    #[test]
    fn urls_take_the_scheme_of_the_security() {
        assert_eq!(
            Security::Plaintext.url("https://10.0.0.1:7700"),
            "http://10.0.0.1:7700"
        );
        assert_eq!(
            Security::Plaintext.url("10.0.0.1:7700"),
            "http://10.0.0.1:7700"
        );
    }
}
