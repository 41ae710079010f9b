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

use crate::code::Code;
use crate::config::Config;
use crate::exit::{Exit, Failure};

/// Builds the tenancy client for the configured transport.
pub fn tenancy(cfg: &Config) -> anyhow::Result<proto::Client> {
    let mut b = proto::Client::builder(cfg.tenancy_url()?)
        .timeout(Duration::from_secs(cfg.tenancy.timeout_s))
        // The download stops where the parser would refuse: one limit, not two that can drift.
        .max_bundle_bytes(monky_bundle::Limits::default().max_bytes)
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

/// Turns a tenancy error into a failure with the right exit status and tenancy's code.
pub fn tenancy_failure(what: &str, e: proto::Error) -> anyhow::Error {
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
    if let Some(problem) = e.certificate_time() {
        // Exit 1, not 75: the next tick meets the same clock.
        return Failure::new(
            Exit::Fail,
            Code::TlsClock,
            format!(
                "{what}: tenancy's certificate is {problem} by this machine's clock: {}",
                with_causes(&e)
            ),
        )
        .into();
    }
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
    let exit = match e.kind() {
        bao::ErrorKind::Temporary => Exit::Temporary,
        _ => Exit::Fail,
    };
    let code = match e.kind() {
        bao::ErrorKind::Temporary => Code::BaoUnavailable,
        bao::ErrorKind::PermissionDenied => Code::BaoPermissionDenied,
        bao::ErrorKind::NotFound => Code::SecretNotFound,
        bao::ErrorKind::LoginRejected => Code::BaoLoginRejected,
        // Exit 1, not 75: a retry at the next tick meets the same clock, and a unit that stays
        // green would hide it.
        bao::ErrorKind::CertificateTime => Code::TlsClock,
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
