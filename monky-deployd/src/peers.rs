//! The peers as the agent sees them: clients built for the configured transport, and their errors
//! turned into exit statuses.
//!
//! Transports: `system` dials the configured hosts; `proxy` sends tenancy's and OpenBao's TCP
//! connections to the loopback ports of `ziti tunnel proxy` while the URLs (and so the Host header,
//! TLS SNI and certificate checks) keep the real names. Environment proxies never apply.
//!
//! Whatever the transport, a connection to a loopback address carries a request only when the
//! socket that answers it belongs to root, the agent's own user or the section's
//! `listener_user` (see [`listener_check`]): any local user can listen on a loopback port the
//! proxy left free, and the bearer is the box's OpenBao token.

mod owner;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use monky_agent_proto as proto;
use monky_bao_client as bao;

use crate::code::Code;
use crate::config::Config;
use crate::exit::{Exit, Failure};

/// Builds the tenancy client for the configured transport.
pub fn tenancy(cfg: &Config) -> anyhow::Result<proto::Client> {
    let mut b = proto::Client::builder(cfg.tenancy_url()?)
        .timeout(Duration::from_secs(cfg.tenancy.timeout_s))
        // The download stops where the parser would refuse: one limit, not two that can drift.
        .max_bundle_bytes(monky_bundle::Limits::default().max_bytes)
        .user_agent(format!("monky-deployd/{}", crate::VERSION))
        .connection_check(listener_check(cfg, Peer::Tenancy)?);
    if let Some(addr) = cfg.tenancy_mapping()? {
        b = b.connect_to(addr);
    }
    b.build().map_err(|e| {
        Failure::wrap(
            Exit::Config,
            anyhow::Error::new(e).context("tenancy client"),
        )
    })
}

/// Builds the OpenBao client for the configured transport and CA bundle.
pub fn openbao(cfg: &Config) -> anyhow::Result<bao::BaoClient> {
    let mut b = bao::BaoClient::builder(cfg.bao_url()?)
        .timeout(Duration::from_secs(cfg.bao.timeout_s))
        .connection_check(listener_check(cfg, Peer::Bao)?);
    if let Some(ca) = &cfg.bao.ca_bundle {
        let pem = std::fs::read(ca)
            .with_context(|| format!("bao.ca_bundle: cannot read {}", ca.display()))
            .map_err(|e| Failure::wrap(Exit::Config, e))?;
        b = b.ca_bundle_pem(pem);
    }
    if let Some(addr) = cfg.bao_mapping()? {
        b = b.connect_to(addr);
    }
    b.build().map_err(|e| {
        // The client knows the bundle's bytes only; the file to fix is the config's.
        let e = match (&e, &cfg.bao.ca_bundle) {
            (bao::Error::CaBundle { .. }, Some(ca)) => {
                anyhow::Error::new(e).context(format!("bao.ca_bundle {}", ca.display()))
            }
            _ => anyhow::Error::new(e),
        };
        Failure::wrap(Exit::Config, e.context("openbao client"))
    })
}

/// A peer the agent dials: the config section, code and wording of its listener check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// Tenancy (`tenancy.proxy_addr`, or the URL's address under `system`).
    Tenancy,
    /// OpenBao (`bao.proxy_addr`, or `bao.addr`'s address under `system`).
    Bao,
}

impl Peer {
    /// The config key that names a further user who may serve this peer's loopback address.
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            Peer::Tenancy => "tenancy.listener_user",
            Peer::Bao => "bao.listener_user",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Peer::Tenancy => "tenancy",
            Peer::Bao => "openbao",
        }
    }

    fn untrusted(self) -> Code {
        match self {
            Peer::Tenancy => Code::TenancyListenerUntrusted,
            Peer::Bao => Code::BaoListenerUntrusted,
        }
    }

    fn unavailable(self) -> Code {
        match self {
            Peer::Tenancy => Code::TenancyUnavailable,
            Peer::Bao => Code::BaoUnavailable,
        }
    }

    fn listener_user(self, cfg: &Config) -> Option<&str> {
        match self {
            Peer::Tenancy => cfg.tenancy.listener_user.as_deref(),
            Peer::Bao => cfg.bao.listener_user.as_deref(),
        }
    }
}

/// The users whose sockets may answer on a loopback address for a peer.
#[derive(Debug, Clone)]
pub struct Trusted {
    peer: Peer,
    /// Root, the agent's own uid, and the uid of `listener_user` when set.
    uids: Vec<u32>,
}

impl Trusted {
    /// Root and the agent's own user always; `listener_user` too when the config names one.
    /// Root and the agent's user can read `bao.token` anyway, so trusting them costs nothing;
    /// the packaged proxy unit runs as the agent's user, so a box needs no key for it.
    ///
    /// # Errors
    /// A `listener_user` that is no user on this box (exit 78).
    pub fn of(cfg: &Config, peer: Peer) -> anyhow::Result<Self> {
        let mut uids = vec![0, rustix::process::geteuid().as_raw()];
        if let Some(name) = peer.listener_user(cfg) {
            let user = nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| {
                    Failure::new(
                        Exit::Config,
                        None,
                        format!(
                            "{}: no user {name:?} on this box: name the user the proxy runs as, \
                             or remove the key",
                            peer.key()
                        ),
                    )
                })?;
            uids.push(user.uid.as_raw());
        }
        uids.dedup();
        Ok(Self { peer, uids })
    }

    /// Judges the connection from `local` to `peer`: a loopback peer must be served by a
    /// trusted uid; any other address is the network's, whose sockets the kernel cannot name.
    ///
    /// # Errors
    /// [`Untrusted`] or [`Vanished`], boxed for the client's connection check.
    pub fn judge(&self, local: SocketAddr, peer: SocketAddr) -> Result<(), proto::CheckError> {
        if !peer.ip().to_canonical().is_loopback() {
            return Ok(());
        }
        let owner = match owner::peer_uid(local, peer) {
            Ok(Some(uid)) if self.uids.contains(&uid) => return Ok(()),
            Ok(Some(uid)) => Owner::Uid(uid),
            Ok(None) => {
                return Err(Box::new(Vanished {
                    peer: self.peer,
                    addr: peer,
                }));
            }
            Err(e) => Owner::Unreadable(e.to_string()),
        };
        Err(Box::new(Untrusted {
            peer: self.peer,
            addr: peer,
            owner,
        }))
    }
}

/// The connection check for `peer`'s client: [`Trusted::judge`] on every new connection.
///
/// # Errors
/// As [`Trusted::of`].
pub fn listener_check(cfg: &Config, peer: Peer) -> anyhow::Result<proto::ConnectionCheck> {
    let trusted = Trusted::of(cfg, peer)?;
    Ok(Arc::new(move |local, remote| trusted.judge(local, remote)))
}

/// Who answered on a loopback address, when it is no trusted user.
#[derive(Debug)]
enum Owner {
    Uid(u32),
    Unreadable(String),
}

/// A loopback listener that is not the one the box's admin set up; nothing was sent to it.
#[derive(Debug)]
pub struct Untrusted {
    peer: Peer,
    addr: SocketAddr,
    owner: Owner,
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (addr, key) = (self.addr, self.peer.key());
        match &self.owner {
            Owner::Uid(uid) => write!(
                f,
                "{addr} is served by uid {uid} ({}), which is not root, the agent's user or \
                 {key}; nothing was sent to it",
                user_name(*uid)
            ),
            Owner::Unreadable(why) => write!(
                f,
                "cannot tell who serves {addr} ({why}); nothing was sent to it"
            ),
        }
    }
}

impl std::error::Error for Untrusted {}

/// The peer's socket was gone before its owner could be read: the connection is dead anyway.
#[derive(Debug)]
pub struct Vanished {
    peer: Peer,
    addr: SocketAddr,
}

impl fmt::Display for Vanished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the connection to {} closed before its owner could be read; nothing was sent",
            self.addr
        )
    }
}

impl std::error::Error for Vanished {}

/// `nobody`, or `no such user` for a uid without a passwd entry.
fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| "no such user".to_owned(), |u| u.name)
}

/// The failure for a connection check's refusal, when `refusal` is one.
fn listener_failure(
    what: &str,
    refusal: Option<&(dyn std::error::Error + Send + Sync + 'static)>,
) -> Option<anyhow::Error> {
    let refusal = refusal?;
    if let Some(u) = refusal.downcast_ref::<Untrusted>() {
        let name = u.peer.name();
        return Some(
            Failure::new(
                Exit::Fail,
                u.peer.untrusted(),
                format!(
                    "{what}: {name}'s address {u}: stop that process and restart \
                     monky-deployd-proxy.service, or name the proxy's user in {}",
                    u.peer.key()
                ),
            )
            .into(),
        );
    }
    let v = refusal.downcast_ref::<Vanished>()?;
    Some(
        Failure::new(
            Exit::Temporary,
            v.peer.unavailable(),
            format!("{what}: {v}"),
        )
        .into(),
    )
}

/// Turns a tenancy error into a failure with the right exit status and tenancy's code.
pub fn tenancy_failure(what: &str, e: proto::Error) -> anyhow::Error {
    if let Some(f) = listener_failure(what, e.check_refusal()) {
        return f;
    }
    let exit = match e.kind() {
        proto::ErrorKind::Temporary => Exit::Temporary,
        proto::ErrorKind::EnvMismatch => Exit::Config,
        _ => Exit::Fail,
    };
    // Tenancy's own code when the agent knows it; otherwise a code for the kind of failure, so
    // that a report's detail always starts with one. An unknown code of tenancy's stays in the
    // message, which quotes tenancy's answer.
    let code = e
        .code()
        .and_then(Code::of_tenancy)
        .unwrap_or(match e.kind() {
            proto::ErrorKind::Temporary => Code::TenancyUnavailable,
            proto::ErrorKind::Unauthenticated => Code::AgentUnauthenticated,
            proto::ErrorKind::EnvMismatch => Code::AgentEnvMismatch,
            _ => Code::TenancyRefused,
        });
    let text = failure_text(exit, &e);
    // The client's own refusals already start with their code.
    let text = text
        .strip_prefix(&format!("{code}: "))
        .map_or(text.clone(), str::to_owned);
    let mut msg = format!("{what}: {text}");
    if exit == Exit::Config {
        msg.push_str(
            "; the token is pinned to another env than config.yaml's env_id: \
             fix env_id or re-run the install kit for this env",
        );
    }
    Failure::new(exit, code, msg)
        .with_retry_after(e.retry_after())
        .into()
}

/// Turns an OpenBao error into a failure: unreachable or sealed is temporary, the rest fails.
pub fn bao_failure(what: &str, e: bao::Error) -> anyhow::Error {
    if let Some(f) = listener_failure(what, e.check_refusal()) {
        return f;
    }
    let exit = match e.kind() {
        bao::ErrorKind::Temporary => Exit::Temporary,
        _ => Exit::Fail,
    };
    let code = match e.kind() {
        bao::ErrorKind::Temporary => Code::BaoUnavailable,
        bao::ErrorKind::PermissionDenied => Code::BaoPermissionDenied,
        bao::ErrorKind::NotFound => Code::SecretNotFound,
        bao::ErrorKind::LoginRejected => Code::BaoLoginRejected,
        _ => Code::BaoRefused,
    };
    Failure::new(exit, code, format!("{what}: {}", failure_text(exit, &e))).into()
}

/// A peer error's text: with its causes for a temporary (transport) failure, alone otherwise.
fn failure_text(exit: Exit, e: &dyn std::error::Error) -> String {
    if exit == Exit::Temporary {
        with_causes(e)
    } else {
        e.to_string()
    }
}

/// An error and its causes on one line: "request to ... failed" alone does not say whether the
/// connection was refused, timed out or failed its certificate check. Only for transport
/// failures: a decoding error's cause can quote the body, and a body can hold a secret.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_kept_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = anyhow::Error::new(io).context("request to http://t.test/v1 failed");
        let e: &dyn std::error::Error = e.as_ref();
        assert_eq!(
            with_causes(e),
            "request to http://t.test/v1 failed: connection refused"
        );
        let plain = std::io::Error::other("sealed");
        assert_eq!(with_causes(&plain), "sealed");
    }
}
