//! Sample wire requests, as an agent on a typical box sends them: one builder per request, so
//! tests change only the fields they are about; and [`call`], one call of each endpoint with
//! them.

use secrecy::SecretString;

use super::Endpoint;
use monky_agent_proto::wire::{
    CheckinRequest, ContainerStatus, HostFacts, LeaseRequest, ReportRequest, ReportResult,
};
use monky_agent_proto::{Client, Error};

/// A checkin of `env_id` from a box with docker, compose and one healthy container, nothing
/// applied yet (set `applied_sha` for a later tick).
#[must_use]
pub fn checkin_request(env_id: &str) -> CheckinRequest {
    CheckinRequest {
        env_id: env_id.to_owned(),
        agent_version: "0.2.0".into(),
        applied_sha: None,
        host: host_facts(),
        containers: vec![container("web")],
        hold: None,
    }
}

/// The facts of the sample box: Ubuntu, docker 28.3, compose 2.32, a GiB free, the proxy
/// transport.
#[must_use]
pub fn host_facts() -> HostFacts {
    HostFacts {
        hostname: "box-7".into(),
        os: "ubuntu-26.04".into(),
        kernel: "7.0.0-30-generic".into(),
        docker: Some("28.3.0".into()),
        compose: Some("2.32.0".into()),
        free_bytes: Some(1 << 30),
        agent_version: "0.2.0".into(),
        transport: "proxy".into(),
        site: "cbs".into(),
        laptop_mode: false,
    }
}

/// A running, healthy container called `name`.
#[must_use]
pub fn container(name: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.to_owned(),
        state: "running".into(),
        health: Some("healthy".into()),
    }
}

/// A lease request of `env_id` for an apply.
#[must_use]
pub fn lease_request(env_id: &str) -> LeaseRequest {
    LeaseRequest {
        env_id: env_id.to_owned(),
        reason: "apply".into(),
    }
}

/// A report of `env_id` with `result`, about no sha, with an empty log and no containers.
#[must_use]
pub fn report_request(env_id: &str, result: ReportResult) -> ReportRequest {
    ReportRequest {
        env_id: env_id.to_owned(),
        sha: None,
        result,
        log_tail: String::new(),
        containers: vec![],
        detail: None,
        hold: None,
    }
}

/// Calls `endpoint` for `env_id` with the sample requests (the bundle of sha `abc`), keeping
/// only success or the error.
///
/// # Errors
/// The client's error.
///
/// # Panics
/// For [`Endpoint::Jwks`], which is no call of the agent's.
pub fn call(
    client: &Client,
    bearer: &SecretString,
    endpoint: Endpoint,
    env_id: &str,
) -> Result<(), Error> {
    match endpoint {
        Endpoint::Checkin => client.checkin(bearer, &checkin_request(env_id)).map(drop),
        Endpoint::Bundle => client
            .bundle(bearer, &monky_agent_proto::wire::bundle_path(env_id, "abc"))
            .map(drop),
        Endpoint::Lease => client.lease(bearer, &lease_request(env_id)).map(drop),
        Endpoint::Report => client.report(bearer, &report_request(env_id, ReportResult::Applied)),
        Endpoint::Jwks => panic!("the agent does not fetch the jwks"),
    }
}
