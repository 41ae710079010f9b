//! Monky bundles: parsing, verification, the refusal checks, `.env` rendering and the
//! registry credential. No network IO, no processes, nothing written to disk.
//!
//! - [`Bundle::parse`] reads the tar (or gzip tar) tenancy serves, in memory and under
//!   [`Limits`], into members whose names are proven [`MemberName`]s, and parses
//!   `secrets.manifest.json` ([`Manifest`]) and `bundle.json` ([`BundleMeta`]).
//! - [`bundle_sha`] is the protocol's content hash, a [`Sha`] (monky-vocab's, the wire's own
//!   type); [`Bundle::check_sha`] compares it with the desired sha.
//! - The checks ([`check_env_complete`], [`check_rollback`], [`check_disk`]) and the compose
//!   policy ([`ComposePolicy`], one default-deny table in [`policy`]) return a [`Refusal`]: a
//!   [`RefusalCode`] and names, never values.
//! - [`Verdict::offline`] is every one of those checks a bundle meets before any secret is read
//!   (manifest paths, variables, the compose policy on the file, a secret on a command line),
//!   as the agent runs them at apply time and tenancy's renderer can at render time.
//! - [`render_env`] turns `.env.template` and the secrets read into the `.env` text, as a
//!   [`SecretString`](secrecy::SecretString).
//! - [`KvPath`] is a manifest path proven to name one of the env's own `see/` secrets, the only
//!   mapping from a manifest path to a KV API path; another env's path is refused
//!   ([`KvPathRefused`]) without any IO.
//! - [`RegistryAuth`] parses the `use: registry-auth` credential and renders the agent's own
//!   Docker `config.json`.
//!
//! ```
//! use std::collections::BTreeMap;
//! use monky_bundle::{Bundle, Limits, MemberName, bundle_sha, pack_tar};
//!
//! let files = BTreeMap::from([
//!     (MemberName::DOCKER_COMPOSE_YML, b"services:\n  web:\n    image: nginx\n".to_vec()),
//!     (MemberName::ENV_TEMPLATE, b"# substitutes every ${VAR}\nKEY=${KEY}\n".to_vec()),
//!     (
//!         MemberName::SECRETS_MANIFEST,
//!         br#"{"vault_mode":"openbao","entries":[{"var":"KEY","path":"monky/env-qa-02/see/key","kind":"supplied","version":1}]}"#.to_vec(),
//!     ),
//!     (MemberName::BUNDLE_JSON, br#"{"env_id":"env-qa-02","tier":"dev","renderer":"compose"}"#.to_vec()),
//! ]);
//! let tar = pack_tar(&files);
//!
//! let bundle = Bundle::parse(&tar, &Limits::default())?;
//! let expected = bundle_sha(files.iter().map(|(n, c)| (n.as_str(), c.as_slice())));
//! assert_eq!(bundle.sha(), &expected);
//! bundle.check_sha(&expected.digest())?;
//! assert_eq!(bundle.compose_file_name(), "docker-compose.yml");
//! assert_eq!(bundle.manifest().env_entries().count(), 1);
//! assert!(!bundle.meta().is_prod());
//!
//! let provided = bundle.manifest().env_entries().map(|e| e.var.clone()).collect();
//! monky_bundle::check_env_complete(bundle.env_template(), &provided)?;
//! monky_bundle::ComposePolicy::new("monky-env-qa-02").check_file(bundle.compose(), &|_| None, &Default::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod budget;
mod checks;
mod cmdline;
mod dotenv;
mod env;
mod error;
mod interp;
mod limits;
mod manifest;
mod member;
mod meta;
mod mount;
mod pack;
mod parse;
mod plain;
pub mod policy;
mod pull;
mod refusal;
mod registry;
mod runs_as;
#[cfg(feature = "testkit")]
pub mod testkit;
mod verdict;

pub use budget::Budget;
pub use checks::{
    DEFAULT_DISK_FACTOR, DEFAULT_DISK_HEADROOM, check_disk, check_env_complete, check_rollback,
};
pub use cmdline::{secrets_on_command_lines, secrets_on_command_lines_model};
pub use env::{
    MAX_ENV_VALUE_BYTES, env_spellings, read_env, referenced_vars, render_env, secret_entries,
    secret_keys, secret_values, unresolved_vars,
};
pub use error::{Error, ErrorKind, Result};
pub use limits::Limits;
pub use manifest::{Manifest, ManifestEntry, REGISTRY_AUTH_USE};
pub use member::MemberName;
pub use meta::{BundleMeta, RENDERER_COMPOSE};
pub use pack::pack_tar;
pub use parse::{Bundle, bundle_sha};
pub use plain::{PLAIN_COMPOSE_FILE, plain_compose, plain_json};
pub use policy::{AllowedBind, ComposePolicy, image_problem};
pub use pull::{PULL_OVERRIDE_FILE, pull_override};
pub use refusal::{Refusal, RefusalCode};
pub use registry::RegistryAuth;
pub use runs_as::{RunsAs, numeric_uid, runs_as};
pub use verdict::{ResolvedEntry, Verdict};

// The KV path and the sha are the shared vocabulary's (monky-vocab), re-exported at their old
// paths so a caller of this crate needs no second import.
pub use monky_vocab::kvpath;
pub use monky_vocab::{KvPath, KvPathRefused, PathRefusal, Sha};
