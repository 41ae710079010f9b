//! The TLS side of the fake OpenBao: rustls, on the workspace's one crypto backend (AWS-LC),
//! terminating TLS on a loopback port and relaying the plain bytes to the fake's HTTP server.
//!
//! tiny_http's own TLS support is built on an old rustls with `ring`, which would put a second
//! crypto backend into the tree for the sake of a test fake; relaying keeps the fake's HTTP
//! handling exactly as it is with or without TLS.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection};

/// A loopback TLS listener relaying every connection to `backend` in the clear.
pub(super) struct TlsFront {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl TlsFront {
    /// Binds `127.0.0.1:0` and serves the PEM certificate chain and PKCS#8 key on a thread.
    pub(super) fn start(cert_pem: &[u8], key_pem: &[u8], backend: SocketAddr) -> io::Result<Self> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{what}: {e}"))
        };
        let certs = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("certificate", &e))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| invalid("key", &e))?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("protocol versions", &e))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| invalid("certificate and key", &e))?;
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("fake-openbao-tls".into())
                .spawn(move || {
                    for client in listener.incoming() {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let Ok(client) = client else { continue };
                        let config = Arc::clone(&config);
                        // A connection's failure (a refused handshake, a peer gone) is its own.
                        std::thread::spawn(move || {
                            let _ = relay(config, client, backend);
                        });
                    }
                })?
        };
        Ok(TlsFront {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    /// Where the TLS listener is bound.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// Sends whatever TLS records the connection has queued.
fn flush(tls: &mut ServerConnection, mut client: &TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        tls.write_tls(&mut client)?;
    }
    Ok(())
}

/// Relays one client connection: client records are decrypted and written to the backend on
/// this thread, the backend's answers are encrypted back on a second one. The connection state
/// is shared under a lock that neither holds while it waits on a socket.
fn relay(config: Arc<ServerConfig>, client: TcpStream, backend: SocketAddr) -> io::Result<()> {
    let tls = Arc::new(Mutex::new(
        ServerConnection::new(config).map_err(io::Error::other)?,
    ));
    let mut upstream = TcpStream::connect(backend)?;
    let answers = {
        let tls = Arc::clone(&tls);
        let client = client.try_clone()?;
        let mut upstream = upstream.try_clone()?;
        std::thread::spawn(move || -> io::Result<()> {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = upstream.read(&mut buf).unwrap_or(0);
                let mut conn = tls.lock().unwrap_or_else(PoisonError::into_inner);
                if n == 0 {
                    conn.send_close_notify();
                    let _ = flush(&mut conn, &client);
                    let _ = client.shutdown(Shutdown::Write);
                    return Ok(());
                }
                conn.writer().write_all(&buf[..n])?;
                flush(&mut conn, &client)?;
            }
        })
    };
    let mut raw = vec![0u8; 16 * 1024];
    let mut plain = vec![0u8; 16 * 1024];
    let result = (|| -> io::Result<()> {
        loop {
            let n = (&client).read(&mut raw)?;
            if n == 0 {
                return Ok(());
            }
            let mut records = &raw[..n];
            let mut conn = tls.lock().unwrap_or_else(PoisonError::into_inner);
            while !records.is_empty() {
                conn.read_tls(&mut records)?;
                if let Err(e) = conn.process_new_packets() {
                    // The alert that says why, then the connection is over.
                    let _ = flush(&mut conn, &client);
                    return Err(io::Error::other(e));
                }
            }
            let mut pending = Vec::new();
            let mut closed = false;
            loop {
                match conn.reader().read(&mut plain) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => pending.extend_from_slice(&plain[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
            flush(&mut conn, &client)?;
            // Written without the lock: the backend may be busy sending an answer back first.
            drop(conn);
            upstream.write_all(&pending)?;
            if closed {
                return Ok(());
            }
        }
    })();
    // The backend sees the end of the requests and closes; the answer thread then ends too.
    let _ = upstream.shutdown(Shutdown::Write);
    if result.is_err() {
        let _ = upstream.shutdown(Shutdown::Both);
        let _ = client.shutdown(Shutdown::Both);
    }
    let _ = answers.join();
    result
}
