//! A client built the hardened way, as both peers' clients are: a request for
//! `http://tenancy.example.test:443/` whose connection goes to a loopback server instead (the
//! mesh's proxy, in production) while `Host` keeps the configured name, and a body read under a
//! cap and a deadline. Exits non-zero if any step does not do what it shows.
//!
//! `cargo run -p monky-http --example mapped_get`

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use monky_http::{Mapping, Settings, build_client, read_capped};

/// Serves one request: answers 200 with a body that says which `Host` it was sent.
fn serve_one(listener: TcpListener) -> std::io::Result<()> {
    let (stream, _) = listener.accept()?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut host = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("host:") {
            host = value.trim().to_owned();
        }
    }
    let body = format!("host {host}");
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn run() -> Result<(), String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = std::thread::spawn(move || serve_one(listener));

    let base: url::Url = "http://tenancy.example.test:443/"
        .parse()
        .map_err(|e| format!("{e}"))?;
    let mapping = Mapping::new(&base, addr).ok_or("the base url has no host")?;
    let settings = Settings {
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        user_agent: "mapped-get-example".into(),
        ca_bundle_pem: None,
        mapping: Some(mapping.clone()),
        connection_check: None,
    };
    let client = build_client(&base, settings).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let request = client
        .get(mapping.wire_url(&base))
        .header(reqwest::header::HOST, mapping.host_header());
    let response = client.send(request).map_err(|e| format!("get: {e}"))?;
    let length = response.content_length();
    let body = read_capped(response, length, 1024, deadline)
        .map_err(|e| format!("read: {e}"))?
        .ok_or("the body is over its cap")?;
    let body = String::from_utf8_lossy(&body);
    println!("{addr} answered: {body}");
    if body != "host tenancy.example.test:443" {
        return Err(format!("the server saw {body:?}"));
    }
    server
        .join()
        .map_err(|_| "the server panicked")?
        .map_err(|e| format!("server: {e}"))
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mapped_get: {e}");
            ExitCode::FAILURE
        }
    }
}
