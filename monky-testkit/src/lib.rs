//! Test support for the workspace: faithful loopback peers of the agent, kept out of the
//! shipping crates so that their dependency graphs hold only what ships.
//!
//! - [`tenancy`]: `FakeTenancy`, a loopback tenancy that signs real ES256 deploy grants, serves
//!   their JWKS, checks bearers against an OpenBao, enforces the rate buckets and injects
//!   faults; and sample wire requests (`tenancy::checkin_request` and its siblings).
//! - [`bao`]: two OpenBao peers behind one trait, `BaoPeer`: `FakeBao`, the in-process fake
//!   with the `jwt-tenancy`/`see-env` role semantics, and `RealBao`, the official `bao` binary
//!   run as an in-memory server on 127.0.0.1 and set up as production.
//! - [`peers`]: `Peers`, the fake tenancy and an OpenBao started and wired to each other.
//! - [`pki`]: the one test PKI (a private CA and a server certificate) for every TLS test.
//! - [`raw`]: `RawPeer`, a one-connection HTTP server that says whatever a client test needs a
//!   misbehaving server to say, and what the two HTTP clients' hardening tests share.
//! - [`openbao`]: the pinned OpenBao version and its cache, which `cargo xtask setup` shares.
//!
//! Every server binds 127.0.0.1 only and stops when dropped.
//!
//! ```
//! use monky_testkit::bao::BaoPeer;
//! use monky_testkit::peers::Peers;
//! use monky_testkit::tenancy::Desired;
//!
//! let Peers { tenancy, bao } = Peers::fake();
//! bao.put_secret("env-qa-02", "pg_password", "a value");
//! tenancy.set_desired("env-qa-02", Desired::sha("7a10".repeat(16)));
//! let bearer = tenancy.issue_token("env-qa-02");
//! let answer = tenancy
//!     .client()
//!     .checkin(&bearer, &monky_testkit::tenancy::checkin_request("env-qa-02"))
//!     .unwrap();
//! assert!(matches!(
//!     answer.action,
//!     monky_agent_proto::Action::Apply { ref sha, .. } if sha.as_str() == "7a10".repeat(16)
//! ));
//! ```

#![deny(missing_docs)]

pub mod bao;
pub mod openbao;
pub mod peers;
pub mod pki;
pub mod raw;
pub mod tenancy;
