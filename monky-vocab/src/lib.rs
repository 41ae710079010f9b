//! The vocabulary tenancy's tooling and every crate of the agent share: std and serde only, so
//! importing it costs no parser, no archive reader and no network stack.
//!
//! - [`Sha`]: a bundle sha, exactly 64 lowercase hex digits, as the wire carries it and as a
//!   bundle's own content hash is computed ([`Sha::from_digest`]); [`ShaError`] says why a text
//!   is not one.
//! - [`KvPath`]: a manifest path proven to name one of the env's own `see/` secrets, the only
//!   mapping from a manifest path to a KV v2 API path; anything else is a [`KvPathRefused`] with
//!   its [`PathRefusal`], without any IO.
//! - [`text::escape`]: the one escape of a peer's text for a person's eyes (controls, bidi and
//!   other invisible formatting characters).
//! - [`ReportCode`], the closed list of codes an agent reports, and [`AnyReportCode`], a received
//!   code that keeps unknown ones; [`ReportResult`], a report's outcome.
//!
//! With the `schema` feature, [`Sha`] and [`ReportResult`] describe themselves as JSON Schemas
//! (the protocol crate's committed schemas are made of them).
//!
//! ```
//! use monky_vocab::{AnyReportCode, KvPath, PathRefusal, ReportCode, Sha};
//!
//! let sha = Sha::parse(&"7a10".repeat(16))?;
//! assert_eq!(sha.short(), "7a107a107a10");
//! assert_eq!(Sha::from_digest(&sha.digest()), sha);
//! assert!(Sha::parse("7A10").is_err());
//!
//! let path = KvPath::parse("monky/env-qa-02/see/pg_password", "monky", "env-qa-02")?;
//! assert_eq!(path.api_path(), "monky/data/env-qa-02/see/pg_password");
//! let other = KvPath::parse("monky/env-qa-03/see/pg_password", "monky", "env-qa-02");
//! assert_eq!(other.unwrap_err().path_refusal(), PathRefusal::OtherEnv);
//!
//! assert_eq!(AnyReportCode::from("UNHEALTHY").known(), Some(ReportCode::Unhealthy));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub mod kvpath;
pub mod report;
pub mod sha;
pub mod text;

pub use kvpath::{KvPath, KvPathRefused, PathRefusal};
pub use report::{AnyReportCode, ReportCode, ReportResult};
pub use sha::{Sha, ShaError};
