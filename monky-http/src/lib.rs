//! The hardened blocking HTTP client that tenancy's client (monky-agent-proto's `client`
//! feature) and the OpenBao client (monky-bao-client) are both built on, written once.
//!
//! - [`check_base`] refuses a peer's base URL that is not `http(s)` with a host, or that
//!   carries credentials, a query or a fragment.
//! - [`build_client`] makes a [`Client`] from [`Settings`]: no proxy from the environment,
//!   no redirect followed, a total timeout, an optional private CA as the only trust root (no
//!   trust roots at all for plain `http`), an address [`Mapping`] and a [`ConnectionCheck`].
//! - [`Mapping`] sends connections to another address while the URL's host name stays for TLS
//!   SNI, the certificate check and `Host`.
//! - [`read_capped`] reads a body under a size limit and a deadline, so neither the memory nor
//!   the time a peer can take is unbounded.
//! - [`certificate`] reads why rustls refused a server's certificate by its type, and
//!   [`connect`] runs the connection check as a connector layer.
//!
//! Each client keeps its own error type and classification: this crate returns its own small
//! errors ([`BuildError`], [`ReadError`]) or plain values, which each client maps.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use monky_http::{Mapping, ReadError, read_capped};
//!
//! let base: url::Url = "https://bao.example.test:8200/".parse()?;
//! let mapping = Mapping::new(&base, "127.0.0.1:18200".parse()?).expect("a host");
//! assert_eq!(mapping.wire_url(&base).as_str(), "https://bao.example.test:18200/");
//! assert_eq!(mapping.host_header(), "bao.example.test:8200");
//!
//! let deadline = Instant::now() + Duration::from_secs(5);
//! assert_eq!(read_capped(&b"four"[..], None, 4, deadline)?, Some(b"four".to_vec()));
//! assert_eq!(read_capped(&b"five!"[..], None, 4, deadline)?, None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod blocking;
pub mod certificate;
mod client;
pub mod connect;
mod read;

pub use blocking::{Client, Response};
pub use certificate::{CertificateRefusal, CertificateTime};
pub use client::{
    BaseRefusal, BuildError, Mapping, Settings, build_client, check_base, without_credentials,
};
pub use connect::{CheckError, CheckHook, ConnectionCheck};
pub use read::{ReadError, read_capped};
