//! The peers as the agent sees them: clients built for the configured transport, and their errors
//! turned into exit statuses.
//!
//! Transports: `system` dials the configured hosts; `proxy` sends tenancy's and OpenBao's TCP
//! connections to the loopback ports of `ziti tunnel proxy` while the URLs (and so the Host header,
//! TLS SNI and certificate checks) keep the real names. Environment proxies never apply.

use std::time::Duration;

use anyhow::Context;
use monky_agent_proto as proto;
use monky_bao_client as bao;

use crate::config::Config;
use crate::exit::{Exit, Failure};

/// Builds the tenancy client for the configured transport.
pub fn tenancy(cfg: &Config) -> anyhow::Result<proto::Client> {
    let mut b = proto::Client::builder(cfg.tenancy_url()?)
        .timeout(Duration::from_secs(cfg.tenancy.timeout_s))
        .user_agent(format!("monky-deployd/{}", crate::VERSION));
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
    let mut b =
        bao::BaoClient::builder(cfg.bao_url()?).timeout(Duration::from_secs(cfg.bao.timeout_s));
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
        Failure::wrap(
            Exit::Config,
            anyhow::Error::new(e).context("openbao client"),
        )
    })
}

/// Turns a tenancy error into a failure with the right exit status and tenancy's code.
pub fn tenancy_failure(what: &str, e: proto::Error) -> anyhow::Error {
    let exit = match e.kind() {
        proto::ErrorKind::Temporary => Exit::Temporary,
        proto::ErrorKind::EnvMismatch => Exit::Config,
        _ => Exit::Fail,
    };
    let code = e.code().map(|c| c.to_string());
    let mut msg = format!("{what}: {e}");
    if exit == Exit::Config {
        msg.push_str(
            "; the token is pinned to another env than config.yaml's env_id: \
             fix env_id or re-run the install kit for this env",
        );
    }
    Failure::new(exit, code, msg).into()
}

/// Turns an OpenBao error into a failure: unreachable or sealed is temporary, the rest fails.
pub fn bao_failure(what: &str, e: bao::Error) -> anyhow::Error {
    let exit = match e.kind() {
        bao::ErrorKind::Temporary => Exit::Temporary,
        _ => Exit::Fail,
    };
    let code = match e.kind() {
        bao::ErrorKind::Temporary => "BAO_UNAVAILABLE",
        bao::ErrorKind::PermissionDenied => "BAO_PERMISSION_DENIED",
        bao::ErrorKind::NotFound => "SECRET_NOT_FOUND",
        bao::ErrorKind::LoginRejected => "BAO_LOGIN_REJECTED",
        _ => "BAO_REFUSED",
    };
    Failure::new(exit, Some(code.to_string()), format!("{what}: {e}")).into()
}
