//! Mutual TLS on the lab, with the real daemons (`tardi lab up` makes the CA and every node's
//! identity): from the client node, peers without the cluster's certificates (one from another
//! CA, none, plaintext) are refused by the orchestrator and by a machine's checkpoint stream,
//! the CLI with a foreign identity says why, and nothing changes in the cluster.

mod common;

use common::cluster::Cluster;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use tardi_instance::stream;
use tardi_orchestrator::client;
use tardi_proto as pb;
use tardi_tls::Security;
use tardi_tls::certs::{self, NodeSpec, Role};

/// What must not change: machines (and their liveness), services, the raft log.
fn fingerprint(s: &Value) -> (Vec<(Value, Value, Value)>, String, Value) {
    (
        s["machines"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|m| (m["name"].clone(), m["api"].clone(), m["alive"].clone()))
                    .collect()
            })
            .unwrap_or_default(),
        s["services"].to_string(),
        s["cluster"]["members"]["o1"]["log_index"].clone(),
    )
}

#[test]
fn peers_without_the_clusters_certificates_are_refused_by_the_daemons() {
    let c = Cluster::up(2, &[]);
    let before = c.status();
    assert_eq!(before["services"].as_array().map(Vec::len), Some(0));

    // Another cluster's CA, with identities named like ours.
    let foreign = std::env::temp_dir().join(format!("tardi-foreign-ca-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&foreign);
    certs::make(
        &foreign,
        &[
            NodeSpec::parse(Role::Client, "client").unwrap(),
            NodeSpec::parse(Role::Instance, "m1=10.77.0.100").unwrap(),
        ],
        1,
        false,
    )
    .unwrap();

    // 1. The CLI with the foreign identity: refused, and it says so.
    let out = c
        .lab
        .command("client", common::cluster::tardi_exe())
        .unwrap()
        .args(["status"])
        .env("TARDI_TLS_DIR", foreign.join("client"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "status answered a foreign identity");
    assert!(err.contains("certificate"), "{err}");

    let orch = c.lab.orchestrator_url();
    let m1 = c.lab.api("m1").unwrap().to_string();
    let ours = c.lab.node("client").unwrap().tls_dir();
    let results: Vec<(String, String)> = c
        .lab
        .in_node("client", || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut seen = Vec::new();
            // 2. The orchestrator: a foreign certificate that trusts our CA, none, plaintext.
            let ca = std::fs::read_to_string(ours.join("ca.pem")).unwrap();
            let tls = |identity: Option<&PathBuf>| {
                let mut t = tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(&ca));
                if let Some(d) = identity {
                    t = t.identity(tonic::transport::Identity::from_pem(
                        std::fs::read(d.join("node.pem")).unwrap(),
                        std::fs::read(d.join("node.key")).unwrap(),
                    ));
                }
                tonic::transport::Endpoint::from_shared(orch.replace("http://", "https://"))
                    .unwrap()
                    .tls_config(t)
                    .unwrap()
            };
            let foreign_client = foreign.join("client");
            for (who, ep) in [
                (
                    "orchestrator, foreign certificate",
                    tls(Some(&foreign_client)),
                ),
                ("orchestrator, no certificate", tls(None)),
                (
                    "orchestrator, plaintext",
                    Security::Plaintext.endpoint(&orch).unwrap(),
                ),
            ] {
                let r = rt.block_on(async {
                    let ch = ep.connect().await.map_err(|e| client::causes(&e))?;
                    let mut o = pb::orchestrator_client::OrchestratorClient::new(ch);
                    o.deploy(pb::DeployRequest {
                        manifest: "libos.entrypoint = \"/bin/sleep\"\n[tardi]\nname = \"x\"\n"
                            .into(),
                        manifest_path: "/tmp/x.manifest".into(),
                        backups: 0,
                    })
                    .await
                    .map_err(|s| s.to_string())?;
                    o.status(pb::StatusRequest {})
                        .await
                        .map(|_| ())
                        .map_err(|s| s.to_string())
                });
                seen.push((who.to_string(), format!("{r:?}")));
            }
            // 3. m1's checkpoint stream, as a rogue primary would reach it.
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let mut roots = rustls::RootCertStore::empty();
            use rustls::pki_types::pem::PemObject;
            for cert in
                rustls::pki_types::CertificateDer::pem_file_iter(ours.join("ca.pem")).unwrap()
            {
                roots.add(cert.unwrap()).unwrap();
            }
            let builder = || {
                rustls::ClientConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .unwrap()
                    .with_root_certificates(roots.clone())
            };
            let foreign_m1 = foreign.join("m1");
            let with_foreign = builder()
                .with_client_auth_cert(
                    rustls::pki_types::CertificateDer::pem_file_iter(foreign_m1.join("node.pem"))
                        .unwrap()
                        .map(|c| c.unwrap())
                        .collect(),
                    rustls::pki_types::PrivateKeyDer::from_pem_file(foreign_m1.join("node.key"))
                        .unwrap(),
                )
                .unwrap();
            for (who, cfg) in [
                (
                    "stream, foreign certificate",
                    Some(std::sync::Arc::new(with_foreign)),
                ),
                (
                    "stream, no certificate",
                    Some(std::sync::Arc::new(builder().with_no_client_auth())),
                ),
                ("stream, plaintext", None),
            ] {
                let r = stream::Connection::connect(&m1, Duration::from_secs(2), cfg).and_then(
                    |mut conn| {
                        conn.send(
                            &pb::CheckpointMsg {
                                service: "x".into(),
                                view: 1,
                                primary: "m2".into(),
                                epoch: 1,
                                run: 1,
                                data: Default::default(),
                            },
                            b"state",
                        )?;
                        conn.recv_ack()
                    },
                );
                seen.push((who.to_string(), format!("{r:?}")));
            }
            // The positive control: the client's own identity reaches the orchestrator.
            let ok = rt.block_on(client::status_from(
                &orch,
                &Security::tls(&ours).unwrap(),
                false,
            ));
            seen.push(("control".into(), format!("{:?}", ok.map(|_| ()))));
            seen
        })
        .unwrap();
    let _ = std::fs::remove_dir_all(&foreign);
    for (who, r) in &results {
        eprintln!("{who}: {r}");
        if who == "control" {
            assert_eq!(r, "Ok(())", "the cluster's own client was refused");
        } else {
            assert!(r.starts_with("Err("), "{who} was not refused: {r}");
        }
    }

    // Nothing changed, and the daemons still serve (machines alive, same state).
    std::thread::sleep(Duration::from_millis(500));
    let after = c.status();
    assert_eq!(fingerprint(&after), fingerprint(&before));
    assert!(
        after["machines"]
            .as_array()
            .is_some_and(|m| m.len() == 2 && m.iter().all(|m| m["alive"] == true)),
        "{after}"
    );
}
