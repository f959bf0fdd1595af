//! TLS on the link between home daemons and workers (rustls, its ring provider), for
//! networks that are not trusted, and mutual TLS as an alternative to the shared secret.
//!
//! # Design
//! - A worker with `[worker] tls_cert` and `tls_key` speaks only TLS; with `tls_client_ca`
//!   too, a home daemon must present a certificate that CA signed (mutual TLS), checked by
//!   webpki before any message. A home daemon with `[remote] tls_ca` speaks TLS to every
//!   worker and checks the worker's certificate against that CA, for the name or IP
//!   address of its `workers` entry; `tls_cert` and `tls_key` are its own certificate.
//! - A peer whose certificate fails (another CA, expired, another name) is refused in the
//!   handshake, logged by both sides with rustls's reason. The shared-secret handshake runs
//!   inside the TLS session when a secret is configured, so either proof, or both, may be
//!   asked for (docs/multi-host.md says which configurations are accepted).
//! - Key files are held to the secret file's rule: mode 0600 or stricter, owned by the
//!   daemon's uid or root ([`super::auth`]). Their bytes are never logged.
//! - The handshake completes before the first message, within the connection's handshake
//!   deadline; after it, [`Link`] reads and writes through the TLS session as
//!   [`super::wire`] reads and writes a plain socket (deadlines on the socket underneath).
//!
//! # Limitations
//! - No revocation lists: rotate the CA (or the certificate's short life) to revoke.
//! - Only what the CA signed is checked, not which home daemon it is: every holder of a
//!   certificate from `tls_client_ca` may use the worker.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use rustls::{ConnectionCommon, StreamOwned};

use super::auth::read_private;
use super::wire::Transport;

/// Why a certificate, key or CA could not be used (names the file, never a key's bytes).
#[derive(Debug, thiserror::Error)]
#[error("{key} {}: {reason}", path.display())]
pub struct TlsError {
    /// The config key that named the file (`worker.tls_cert`, `remote.tls_ca`, ...).
    pub key: &'static str,
    /// The file as configured.
    pub path: PathBuf,
    /// What was wrong with it, as the PEM reader or rustls said.
    pub reason: String,
}

/// Why a TLS handshake failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    /// rustls would not start a session with this configuration.
    #[error("{0}")]
    Session(#[source] rustls::Error),
    /// The worker's host is neither an IP address nor a DNS name a certificate can carry.
    #[error("{host:?} is no server name: {source}")]
    ServerName {
        /// The worker's host as `[remote] workers` names it, without brackets.
        host: String,
        /// Why rustls would not take it.
        source: rustls::pki_types::InvalidDnsNameError,
    },
    /// The deadline passed before the handshake ended.
    #[error("TLS handshake: no answer in time")]
    Timeout,
    /// The socket's read timeout could not be set.
    #[error("{0}")]
    Deadline(#[source] std::io::Error),
    /// The handshake itself failed (the peer's certificate, a reset, a protocol error).
    #[error("TLS handshake: {0}")]
    Io(#[source] std::io::Error),
}

/// A connection to a peer: plain TCP, or TLS over it (as the worker or as the home).
pub(crate) enum Link {
    Plain(TcpStream),
    Server(Box<StreamOwned<ServerConnection, TcpStream>>),
    Client(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Link::Plain(s) => s.read(buf),
            Link::Server(s) => s.read(buf),
            Link::Client(s) => s.read(buf),
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Link::Plain(s) => s.write(buf),
            Link::Server(s) => s.write(buf),
            Link::Client(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Link::Plain(s) => s.flush(),
            Link::Server(s) => s.flush(),
            Link::Client(s) => s.flush(),
        }
    }
}

impl Transport for Link {
    fn tcp(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Server(s) => &s.sock,
            Link::Client(s) => &s.sock,
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let fail = |reason: String| TlsError {
        key,
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no PEM certificate in it".into()));
    }
    Ok(certs)
}

fn private_key(key: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let fail = |reason: String| TlsError {
        key,
        path: path.to_path_buf(),
        reason,
    };
    // The secret file's checks (owner, mode), with their message.
    let bytes = read_private(path).map_err(|e| fail(e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| fail("no PEM private key in it".into()))
}

fn roots(key: &'static str, path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(key, path)? {
        roots.add(cert).map_err(|e| TlsError {
            key,
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

/// A worker's TLS: its certificate, and the CA of home daemons' certificates if mutual.
pub(crate) struct WorkerTls(Arc<ServerConfig>);

impl WorkerTls {
    pub(crate) fn load(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
    ) -> Result<WorkerTls, TlsError> {
        let chain = certificates("worker.tls_cert", cert)?;
        let secret = private_key("worker.tls_key", key)?;
        let fail = |reason: String| TlsError {
            key: "worker.tls_cert",
            path: cert.to_path_buf(),
            reason,
        };
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(e.to_string()))?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    roots("worker.tls_client_ca", ca)?,
                    provider(),
                )
                .build()
                .map_err(|e| fail(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(chain, secret)
            .map_err(|e| fail(format!("with worker.tls_key: {e}")))?;
        Ok(WorkerTls(Arc::new(config)))
    }

    /// The TLS handshake on a new connection, by `deadline`; why it failed.
    pub(crate) fn accept(&self, tcp: TcpStream, deadline: Instant) -> Result<Link, HandshakeError> {
        let conn = ServerConnection::new(Arc::clone(&self.0)).map_err(HandshakeError::Session)?;
        let mut stream = StreamOwned::new(conn, tcp);
        handshake(&mut stream.conn, &mut stream.sock, deadline)?;
        Ok(Link::Server(Box::new(stream)))
    }
}

/// A home daemon's TLS: the CA of workers' certificates, and its own certificate if any.
pub(crate) struct HomeTls(Arc<ClientConfig>);

impl HomeTls {
    pub(crate) fn load(ca: &Path, cert_key: Option<(&Path, &Path)>) -> Result<HomeTls, TlsError> {
        let fail = |reason: String| TlsError {
            key: "remote.tls_ca",
            path: ca.to_path_buf(),
            reason,
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(e.to_string()))?
            .with_root_certificates(roots("remote.tls_ca", ca)?);
        let config = match cert_key {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    certificates("remote.tls_cert", cert)?,
                    private_key("remote.tls_key", key)?,
                )
                .map_err(|e| TlsError {
                    key: "remote.tls_cert",
                    path: cert.to_path_buf(),
                    reason: format!("with remote.tls_key: {e}"),
                })?,
        };
        Ok(HomeTls(Arc::new(config)))
    }

    /// The TLS handshake with the worker `host` (a DNS name or an IP address, checked
    /// against its certificate), by `deadline`; why it failed.
    pub(crate) fn connect(
        &self,
        tcp: TcpStream,
        host: &str,
        deadline: Instant,
    ) -> Result<Link, HandshakeError> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.to_owned()).map_err(|source| {
                HandshakeError::ServerName {
                    host: host.to_owned(),
                    source,
                }
            })?,
        };
        let conn =
            ClientConnection::new(Arc::clone(&self.0), name).map_err(HandshakeError::Session)?;
        let mut stream = StreamOwned::new(conn, tcp);
        handshake(&mut stream.conn, &mut stream.sock, deadline)?;
        Ok(Link::Client(Box::new(stream)))
    }
}

/// Drives a TLS handshake to its end by `deadline`.
fn handshake<D>(
    conn: &mut ConnectionCommon<D>,
    tcp: &mut TcpStream,
    deadline: Instant,
) -> Result<(), HandshakeError> {
    while conn.is_handshaking() {
        let wait = deadline
            .checked_duration_since(Instant::now())
            .filter(|w| !w.is_zero())
            .ok_or(HandshakeError::Timeout)?;
        tcp.set_read_timeout(Some(wait))
            .map_err(HandshakeError::Deadline)?;
        conn.complete_io(tcp).map_err(HandshakeError::Io)?;
    }
    Ok(())
}
