//! A small blocking OpenBao client for the deploy agent: JWT login, token upkeep, KV v2 reads.
//!
//! - [`BaoClient`] talks to OpenBao over HTTPS with an optional private CA as the only trust
//!   root, can send its connections to a mapped address while TLS keeps the configured host
//!   name ([`BaoClientBuilder::connect_to`]), never follows redirects and ignores proxies: the
//!   hardened client of the workspace's `monky-http` crate, which tenancy's client shares.
//! - [`Token`] holds a client token and never prints it.
//! - [`KvPath`] (monky-vocab's, re-exported) is a manifest path proven to name one of the
//!   caller's own `see/` secrets; anything else is refused before a request is sent.
//! - [`Error`] keeps OpenBao's `errors[]` and status and sorts every failure into an
//!   [`ErrorKind`].
//!
//! Loopback OpenBao peers for tests (a fake, and the real binary set up as production) live in
//! the workspace's `monky-testkit` crate.
//!
//! ```
//! use monky_bao_client::{BaoClient, KvPath, PathRefusal};
//!
//! let path = KvPath::parse("monky/env-qa-02/see/pg_password", "monky", "env-qa-02")?;
//! assert_eq!(path.api_path(), "monky/data/env-qa-02/see/pg_password");
//!
//! // Another env's secret is refused locally, before any request.
//! let err = KvPath::parse("monky/env-qa-03/see/pg_password", "monky", "env-qa-02").unwrap_err();
//! assert_eq!(err.path_refusal(), PathRefusal::OtherEnv);
//!
//! let client = BaoClient::builder("https://bao.example.test:8200".parse()?)
//!     .connect_to("127.0.0.1:18200".parse()?)
//!     .build()?;
//! assert_eq!(client.addr().as_str(), "https://bao.example.test:8200/");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod client;
mod error;
mod token;

// The certificate reading and the connection check are the shared hardened-HTTP crate's,
// re-exported at their old paths (tenancy's client has the same ones).
pub use monky_http::{certificate, connect};

pub use certificate::{CertificateRefusal, CertificateTime};
pub use client::{
    BaoClient, BaoClientBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, Login, MAX_BODY_BYTES,
    MAX_TTL, Renewal, ServerDate, TokenInfo,
};
pub use connect::{CheckError, ConnectionCheck};
pub use error::{Absence, Error, ErrorKind, Result};
// The KV path is the shared vocabulary's (the manifest's only mapping to an API path);
// re-exported so a caller of `read_kv` needs no second import.
pub use monky_vocab::{KvPath, KvPathRefused, PathRefusal};
pub use token::{Token, TokenShape};
