//! The checkpoint-stream server on `--listen`: each connection handed to the backup of its
//! service.

#[allow(unused_imports)]
use super::*;

/// Serves the checkpoint stream: one thread per connection, one checkpoint at a time, each
/// answered by its acknowledgement once the backup queued it (or refused it: the connection
/// then closes). A connection that does not open with the stream's hello (a port probe, a
/// stray client) is closed.
pub(crate) fn serve_streams(
    listener: std::net::TcpListener,
    roles: Arc<Roles>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a checkpoint stream failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let (roles, tls) = (roles.clone(), tls.clone());
        let spawned = std::thread::Builder::new()
            .name("stream-in".into())
            .spawn(move || {
                let peer = conn.peer_addr().ok();
                match stream::Accepted::accept(conn, tls, Duration::from_secs(2)) {
                    // Closed before a byte: a port probe (the lab's readiness check).
                    Err(stream::StreamError::Handshake(e) | stream::StreamError::Io(e))
                        if e.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        tracing::debug!(?peer, error = %e, "checkpoint stream closed at once");
                    }
                    Err(e) => {
                        tracing::warn!(?peer, error = %e, "checkpoint stream refused");
                    }
                    Ok(io) => {
                        if let Err(e) = serve_stream(io, &roles) {
                            tracing::debug!(?peer, error = %e, "checkpoint stream ended");
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread for a checkpoint stream");
        }
    }
}

fn serve_stream(conn: stream::Accepted, roles: &Roles) -> Result<(), stream::StreamError> {
    let mut input = std::io::BufReader::with_capacity(256 << 10, conn);
    while let Some(m) = stream::read_checkpoint(&mut input)? {
        tracing::trace!(epoch = m.epoch, bytes = m.data.len(), "checkpoint received");
        let (service, view, epoch) = (m.service.clone(), m.view, m.epoch);
        let result = match roles.backup(&m.service) {
            None => Err(backup::Refusal::NotBackup(m.service.clone())),
            Some(b) => b.receive(m.view, m.run, m.epoch, Vec::from(m.data)),
        };
        let refused = result.is_err();
        // Refused for a newer view: the sender is deposed and should stop retrying.
        let newer_view = match &result {
            Err(backup::Refusal::OldView { have, .. }) => *have,
            Err(backup::Refusal::NotBackup(_)) => {
                roles.view_of(&service).filter(|&v| v > view).unwrap_or(0)
            }
            _ => 0,
        };
        let ack = pb::Ack {
            service,
            view,
            epoch,
            error: result.err().map(|e| e.to_string()).unwrap_or_default(),
            newer_view,
        };
        if refused {
            tracing::warn!(service = %ack.service, view, epoch, error = %ack.error, "checkpoint refused");
        }
        stream::write_ack(input.get_mut(), &ack)?;
        if refused {
            break;
        }
    }
    Ok(())
}
