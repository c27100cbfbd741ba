//! TLS for `wss://` uplinks (issue 13: "TLS with rustls on ring, system
//! roots plus an optional CA file").
//!
//! The roots are the system's (rustls-native-certs) and, when `[uplink]
//! ca_file` names one, every certificate of that PEM file: a gateway
//! behind a private CA is trusted without touching the system's store.
//!
//! The uplink reads on one thread and writes on another ([`super::dial`]),
//! and a TLS connection is one state machine. So the two halves share it
//! behind a mutex that neither holds while it waits on the socket: the
//! reader reads ciphertext from the socket unlocked, then locks to hand it
//! to rustls and take the plaintext; the writer locks to seal and write.
//! Ciphertext is fed to rustls only once the plaintext before it was taken,
//! so rustls's own plaintext bound is never met.

use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The client configuration: ring, the system's roots and `ca_file`'s.
pub fn config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if let Some(path) = ca_file {
        let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("unable to read the CA file {}: {e}", path.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("unable to read the CA file {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "the CA file {} holds no certificate",
                path.display()
            ));
        }
        for c in certs {
            roots.add(c).map_err(|e| {
                format!(
                    "the CA file {} holds a bad certificate: {e}",
                    path.display()
                )
            })?;
        }
    } else if added == 0 {
        return Err("no system root certificates were found; set [uplink] ca_file".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("unable to set up TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The TLS connection both halves share, and the socket.
struct Shared {
    conn: Mutex<ClientConnection>,
    tcp: TcpStream,
}

/// Writes what rustls has for the socket.
fn flush_tls(conn: &mut ClientConnection, mut tcp: &TcpStream) -> io::Result<()> {
    while conn.wants_write() {
        conn.write_tls(&mut tcp)?;
    }
    tcp.flush()
}

/// Connects TLS over `tcp` to `host` and finishes the handshake (within
/// the socket's timeouts); returns the reading and the writing half.
pub fn connect(
    cfg: Arc<ClientConfig>,
    host: &str,
    mut tcp: TcpStream,
) -> Result<(TlsRead, TlsWrite), String> {
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host} is not a TLS server name: {e}"))?;
    let mut conn = ClientConnection::new(cfg, name)
        .map_err(|e| format!("unable to start TLS with {host}: {e}"))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)
            .map_err(|e| format!("the TLS handshake with {host} failed: {e}"))?;
    }
    let read_tcp = tcp
        .try_clone()
        .map_err(|e| format!("unable to share the uplink's socket: {e}"))?;
    let shared = Arc::new(Shared {
        conn: Mutex::new(conn),
        tcp,
    });
    Ok((
        TlsRead {
            tcp: read_tcp,
            shared: shared.clone(),
            pending: Vec::new(),
            at: 0,
        },
        TlsWrite(shared),
    ))
}

fn poisoned() -> io::Error {
    io::Error::other("the TLS state was poisoned")
}

/// The reading half.
pub struct TlsRead {
    tcp: TcpStream,
    shared: Arc<Shared>,
    /// Ciphertext read from the socket and not yet handed to rustls.
    pending: Vec<u8>,
    at: usize,
}

impl Read for TlsRead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut conn = self.shared.conn.lock().map_err(|_| poisoned())?;
                match conn.reader().read(out) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.at < self.pending.len() {
                    let mut rest = &self.pending[self.at..];
                    let before = rest.len();
                    conn.read_tls(&mut rest)?;
                    self.at += before - rest.len();
                    conn.process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    flush_tls(&mut conn, &self.shared.tcp)?;
                    continue;
                }
            }
            // Nothing buffered: wait for the socket, without the lock.
            self.pending.resize(16 * 1024, 0);
            self.at = 0;
            let n = self.tcp.read(&mut self.pending).inspect_err(|_| {
                self.pending.clear();
            })?;
            self.pending.truncate(n);
            if n == 0 {
                return Ok(0);
            }
        }
    }
}

/// The writing half.
pub struct TlsWrite(Arc<Shared>);

impl Write for TlsWrite {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut conn = self.0.conn.lock().map_err(|_| poisoned())?;
        let n = conn.writer().write(buf)?;
        flush_tls(&mut conn, &self.0.tcp)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut conn = self.0.conn.lock().map_err(|_| poisoned())?;
        flush_tls(&mut conn, &self.0.tcp)
    }
}
