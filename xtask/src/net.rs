//! Loopback networking for setup: a free port, and a tiny HTTP/1.0 GET for health probes.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result};

/// A port that was free on 127.0.0.1 a moment ago (the caller retries if it is taken meanwhile).
pub fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("cannot bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A response: status code and body (lossy UTF-8).
#[derive(Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body.
    pub body: String,
}

/// `GET path` on `addr` over plain HTTP/1.0 with `Connection: close`.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    // One write: `write!` on an unbuffered stream sends each formatted piece on its own, and a
    // server that answers after the first segment then closes on the rest (EPIPE here).
    let request = format!(
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\nUser-Agent: monky-xtask\r\n\r\n"
    );
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("cannot read the answer of {addr}{path}"))?;
    parse_response(&raw).with_context(|| format!("bad HTTP answer from {addr}{path}"))
}

fn parse_response(raw: &[u8]) -> Result<Response> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .context("no status line")?;
    Ok(Response {
        status,
        body: body.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_against_a_one_shot_loopback_server() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            // Reads up to the blank line that ends the request head, however it is segmented.
            let mut raw = Vec::new();
            let mut buf = [0u8; 1024];
            while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).unwrap();
                assert_ne!(n, 0, "the client closed before the end of its request");
                raw.extend_from_slice(&buf[..n]);
            }
            let request = String::from_utf8_lossy(&raw).into_owned();
            conn.write_all(b"HTTP/1.0 401 Unauthorized\r\nX: y\r\n\r\n{\"errors\":[]}")
                .unwrap();
            request
        });
        let response = get(addr, "/v2/", Duration::from_secs(5)).unwrap();
        assert_eq!(response.status, 401);
        assert_eq!(response.body, "{\"errors\":[]}");
        assert!(server.join().unwrap().starts_with("GET /v2/ HTTP/1.0\r\n"));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_response(b"").is_err());
        assert!(parse_response(b"HTTP/1.1 abc\r\n\r\n").is_err());
    }

    #[test]
    fn free_port_is_bindable() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
    }
}
