//! The blocking OpenBao client: JWT login, token upkeep and KV v2 reads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use reqwest::RequestBuilder;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use url::Url;

use crate::error::{Absence, Error, Result, describe_json_error};
use crate::token::Token;
use monky_http::certificate::Refused;
use monky_http::connect::refusal_in;
use monky_http::{
    BaseRefusal, BuildError, CheckHook, Client, ConnectionCheck, Mapping, ReadError, Response,
    Settings, without_credentials,
};
use monky_vocab::KvPath;
use monky_vocab::kvpath::check_segment;

/// Default total timeout of one request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Default timeout of establishing a connection (TCP and TLS).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest TTL taken from OpenBao's answers: one year. A longer one (a `lease_duration` of
/// `u64::MAX`) is clamped to it, so an expiry computed from it cannot overflow.
pub const MAX_TTL: Duration = Duration::from_secs(366 * 24 * 3600);

/// A TTL from an answer, in seconds, clamped to [`MAX_TTL`].
fn ttl(secs: u64) -> Duration {
    Duration::from_secs(secs).min(MAX_TTL)
}

/// The header OpenBao reads the client token from.
const TOKEN_HEADER: &str = "X-Vault-Token";

/// Builds a [`BaoClient`]; start with [`BaoClient::builder`].
#[derive(Debug)]
#[must_use]
pub struct BaoClientBuilder {
    addr: Url,
    ca_bundle_pem: Option<Vec<u8>>,
    connect_to: Option<SocketAddr>,
    timeout: Duration,
    connect_timeout: Duration,
    user_agent: String,
    connection_check: Option<CheckHook>,
}

impl BaoClientBuilder {
    /// Run `check` on every new connection, after connecting and the TLS handshake and before
    /// the first byte of a request (and so the token) is written; its refusal drops the
    /// connection and the call fails with [`Error::ConnectionCheck`], which carries the check's
    /// own error ([`Error::check_refusal`]).
    pub fn connection_check(mut self, check: ConnectionCheck) -> Self {
        self.connection_check = Some(CheckHook(check));
        self
    }

    /// Trust exactly the certificates of this PEM bundle, and nothing else (not the system's
    /// roots).
    pub fn ca_bundle_pem(mut self, pem: Vec<u8>) -> Self {
        self.ca_bundle_pem = Some(pem);
        self
    }

    /// Send every connection to `addr` instead of resolving the address's host. TLS SNI and the
    /// certificate's host-name check keep the configured host name, the `Host` header the
    /// configured host name and port.
    pub fn connect_to(mut self, addr: SocketAddr) -> Self {
        self.connect_to = Some(addr);
        self
    }

    /// Total deadline of one call, from connecting until the last byte of the answer is read
    /// (default [`DEFAULT_TIMEOUT`]): a body trickled a byte at a time is cut at it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Timeout of establishing a connection (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The `User-Agent` header (default `monky-bao-client/<version>`).
    pub fn user_agent(mut self, user_agent: String) -> Self {
        self.user_agent = user_agent;
        self
    }

    /// Builds the client. Fails on an address that is not `http(s)://host[:port][/path]` and on
    /// a CA bundle without any certificate.
    pub fn build(self) -> Result<BaoClient> {
        let addr = self.addr;
        let invalid = |reason: &str| Error::InvalidAddress {
            addr: without_credentials(&addr),
            reason: reason.to_owned(),
        };
        if let Err(refusal) = monky_http::check_base(&addr) {
            return Err(invalid(match refusal {
                BaseRefusal::Scheme => "scheme must be http or https",
                BaseRefusal::NoHost => "no host",
                BaseRefusal::Credentials => "credentials in the address are not supported",
                BaseRefusal::QueryOrFragment => "query or fragment in the address",
            }));
        }

        // With `connect_to`, reqwest's `resolve` only replaces the address of the host name and
        // ignores the mapped port when the URL names a port, so requests go to the mapping's
        // URL (the mapped port, and the mapped address for an IP literal); the host name stays
        // for SNI, the certificate check and `Host`, which is set per request to the configured
        // authority, as the tenancy client does.
        let mapping = match self.connect_to {
            Some(target) => Some(Mapping::new(&addr, target).ok_or_else(|| invalid("no host"))?),
            None => None,
        };
        let request_base = mapping
            .as_ref()
            .map_or_else(|| addr.clone(), |m| m.wire_url(&addr));
        let host_header = mapping.as_ref().map(|m| m.host_header().to_owned());
        let settings = Settings {
            timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            user_agent: self.user_agent,
            ca_bundle_pem: self.ca_bundle_pem,
            mapping,
            connection_check: self.connection_check.map(|CheckHook(check)| check),
        };
        let http = monky_http::build_client(&addr, settings).map_err(|e| match e {
            BuildError::CaBundle { reason } => Error::CaBundle { reason },
            e @ (BuildError::Build(_) | BuildError::Runtime(_)) => Error::Build {
                source: Box::new(e),
            },
        })?;
        Ok(BaoClient {
            http,
            timeout: self.timeout,
            addr,
            request_base,
            host_header,
            last_date: Arc::default(),
        })
    }
}

/// A blocking OpenBao client. Never follows redirects and ignores proxy settings.
#[derive(Debug, Clone)]
pub struct BaoClient {
    http: Client,
    /// The total deadline of one call, from connecting until the body is read.
    timeout: Duration,
    /// The address as configured; used in error messages.
    addr: Url,
    /// The address requests go to (differs from `addr` with `connect_to`).
    request_base: Url,
    /// `Host` with `connect_to`: the configured host name and port.
    host_header: Option<String>,
    /// The `Date` of the last answer (any status), shared by clones.
    last_date: Arc<Mutex<Option<ServerDate>>>,
}

/// OpenBao's clock as one answer showed it: its `Date` header (whole seconds, as HTTP sends
/// it; Go's net/http, which OpenBao serves with, sets it on every answer) and this machine's
/// clock around the call, so the caller can tell how far the two clocks are apart and how
/// exactly it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerDate {
    /// The answer's `Date`.
    pub date: SystemTime,
    /// This machine's clock when the request was sent.
    pub sent: SystemTime,
    /// This machine's clock when the answer's head arrived.
    pub received: SystemTime,
}

/// The result of a JWT login.
#[derive(Debug, Clone)]
pub struct Login {
    /// The new client token.
    pub token: Token,
    /// The token's accessor.
    pub accessor: String,
    /// The token's TTL (`auth.lease_duration`).
    pub ttl: Duration,
    /// Whether the token can be renewed.
    pub renewable: bool,
    /// The token metadata (`env_id`, `grant_jti`, `role` for `see-env`).
    pub metadata: BTreeMap<String, String>,
    /// The token's policies.
    pub policies: Vec<String>,
    /// The identity entity the login mapped to.
    pub entity_id: String,
    /// `service` or `batch`.
    pub token_type: String,
    /// OpenBao's warnings, if any.
    pub warnings: Vec<String>,
}

/// What `lookup-self` (or `lookup`) tells about a token; never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    /// The token's remaining TTL.
    pub ttl: Duration,
    /// The TTL the token was created with.
    pub creation_ttl: Duration,
    /// Creation time, Unix seconds.
    pub creation_time: u64,
    /// Expiry time, RFC 3339; `None` for a token that does not expire.
    pub expire_time: Option<String>,
    /// Explicit max TTL, zero when none was set.
    pub explicit_max_ttl: Duration,
    /// The token metadata.
    pub meta: BTreeMap<String, String>,
    /// Whether the token can be renewed.
    pub renewable: bool,
    /// The token's accessor.
    pub accessor: String,
    /// The token's policies.
    pub policies: Vec<String>,
    /// The identity entity, empty for none.
    pub entity_id: String,
    /// Issue time, RFC 3339.
    pub issue_time: Option<String>,
    /// `service` or `batch`.
    pub token_type: String,
}

/// The result of `renew-self`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The TTL granted, which OpenBao caps at the token's max TTL.
    pub ttl: Duration,
    /// OpenBao's warnings, e.g. that the TTL was capped.
    pub warnings: Vec<String>,
    /// Whether the token can be renewed again.
    pub renewable: bool,
}

/// What the failing call was, to classify OpenBao's answer.
enum Call<'a> {
    Login {
        mount: &'a str,
        role: &'a str,
    },
    Token,
    Kv {
        path: &'a KvPath,
        version: Option<u64>,
    },
}

impl BaoClient {
    /// A builder for a client of the OpenBao at `addr` (e.g. `https://bao.example.test:8200`).
    pub fn builder(addr: Url) -> BaoClientBuilder {
        BaoClientBuilder {
            addr,
            ca_bundle_pem: None,
            connect_to: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            user_agent: concat!("monky-bao-client/", env!("CARGO_PKG_VERSION")).to_owned(),
            connection_check: None,
        }
    }

    /// The address as configured.
    pub fn addr(&self) -> &Url {
        &self.addr
    }

    /// OpenBao's `Date` from the last answer this client (or a clone) received, whatever its
    /// status; `None` before any answer, or when it carried no readable `Date`.
    pub fn server_date(&self) -> Option<ServerDate> {
        *self
            .last_date
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `POST /v1/auth/<mount>/login {"role", "jwt"}`: exchanges a JWT for a token.
    pub fn login_jwt(&self, mount: &str, role: &str, jwt: &SecretString) -> Result<Login> {
        check_name("mount", mount, true)?;
        check_name("role", role, false)?;
        let mut segments: Vec<&str> = vec!["auth"];
        segments.extend(mount.split('/'));
        segments.push("login");
        let (url, shown) = self.url(&segments, None);
        let body = serde_json::json!({"role": role, "jwt": jwt.expose_secret()});
        let request = self.http.post(url).json(&body);
        let call = Call::Login { mount, role };
        let envelope: AuthEnvelope = self.send(request, &shown, &call)?;
        let auth = envelope.auth.ok_or_else(|| no_field(&shown, "auth"))?;
        Ok(Login {
            token: Token::new(auth.client_token),
            accessor: auth.accessor,
            ttl: ttl(auth.lease_duration),
            renewable: auth.renewable,
            metadata: auth.metadata.unwrap_or_default(),
            policies: auth.policies.unwrap_or_default(),
            entity_id: auth.entity_id,
            token_type: auth.token_type,
            warnings: envelope.warnings.unwrap_or_default(),
        })
    }

    /// `GET /v1/auth/token/lookup-self`.
    pub fn lookup_self(&self, token: &Token) -> Result<TokenInfo> {
        let (url, shown) = self.url(&["auth", "token", "lookup-self"], None);
        let request = self
            .http
            .get(url)
            .header(TOKEN_HEADER, token.expose_secret());
        let envelope: DataEnvelope<LookupData> = self.send(request, &shown, &Call::Token)?;
        let data = envelope.data.ok_or_else(|| no_field(&shown, "data"))?;
        Ok(data.into_info())
    }

    /// `POST /v1/auth/token/lookup {"token"}`: looks up another token with a token allowed to
    /// (tenancy does this with its own token to verify an agent's bearer).
    pub fn lookup_token(&self, auth: &Token, token: &SecretString) -> Result<TokenInfo> {
        let (url, shown) = self.url(&["auth", "token", "lookup"], None);
        let body = serde_json::json!({"token": token.expose_secret()});
        let request = self
            .http
            .post(url)
            .header(TOKEN_HEADER, auth.expose_secret())
            .json(&body);
        let envelope: DataEnvelope<LookupData> = self.send(request, &shown, &Call::Token)?;
        let data = envelope.data.ok_or_else(|| no_field(&shown, "data"))?;
        Ok(data.into_info())
    }

    /// `POST /v1/auth/token/renew-self {"increment"}`; `None` asks for the role's default TTL.
    pub fn renew_self(&self, token: &Token, increment: Option<Duration>) -> Result<Renewal> {
        let (url, shown) = self.url(&["auth", "token", "renew-self"], None);
        let body = match increment {
            Some(inc) => serde_json::json!({"increment": format!("{}s", inc.as_secs())}),
            None => serde_json::json!({}),
        };
        let request = self
            .http
            .post(url)
            .header(TOKEN_HEADER, token.expose_secret())
            .json(&body);
        let envelope: AuthEnvelope = self.send(request, &shown, &Call::Token)?;
        let auth = envelope.auth.ok_or_else(|| no_field(&shown, "auth"))?;
        Ok(Renewal {
            ttl: ttl(auth.lease_duration),
            warnings: envelope.warnings.unwrap_or_default(),
            renewable: auth.renewable,
        })
    }

    /// `POST /v1/auth/token/revoke-self` (OpenBao answers 204).
    pub fn revoke_self(&self, token: &Token) -> Result<()> {
        let (url, shown) = self.url(&["auth", "token", "revoke-self"], None);
        let request = self
            .http
            .post(url)
            .header(TOKEN_HEADER, token.expose_secret());
        let (response, deadline) = self.execute(request, &shown)?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let body = read_body(response, &shown, deadline)?;
        Err(classify(&shown, status, &body, &Call::Token))
    }

    /// `GET /v1/<mount>/data/<env>/see/<name>[?version=N]`: the document's `value`.
    /// `version: None` reads the latest version.
    pub fn read_kv(
        &self,
        token: &Token,
        path: &KvPath,
        version: Option<u64>,
    ) -> Result<SecretString> {
        let query = version.map(|v| v.to_string());
        let (url, shown) = self.url(&path.api_segments(), query.as_deref());
        let request = self
            .http
            .get(url)
            .header(TOKEN_HEADER, token.expose_secret());
        let call = Call::Kv { path, version };
        let envelope: DataEnvelope<KvData> = self.send(request, &shown, &call)?;
        let missing = || Error::MissingValue {
            path: path.api_path(),
            version,
        };
        let mut document = envelope.data.and_then(|d| d.data).ok_or_else(missing)?;
        match document.remove("value") {
            Some(serde_json::Value::String(value)) => Ok(SecretString::from(value)),
            _ => Err(missing()),
        }
    }

    /// The request URL and the URL shown in errors (the configured address, not the mapped
    /// one). `version` becomes `?version=N`.
    fn url(&self, segments: &[&str], version: Option<&str>) -> (Url, String) {
        let build = |base: &Url| {
            let mut url = base.clone();
            if let Ok(mut path) = url.path_segments_mut() {
                path.pop_if_empty().push("v1").extend(segments);
            }
            if let Some(v) = version {
                url.query_pairs_mut().append_pair("version", v);
            }
            url
        };
        (build(&self.request_base), build(&self.addr).to_string())
    }

    /// Sends a request under the call's total deadline, which is returned for reading the body.
    ///
    /// The per-request timeout is reqwest's total one, body included; the deadline is also
    /// checked between reads, as the tenancy client does.
    fn execute(&self, request: RequestBuilder, shown: &str) -> Result<(Response, Instant)> {
        let deadline = Instant::now() + self.timeout;
        let request = match &self.host_header {
            Some(host) => request.header(reqwest::header::HOST, host),
            None => request,
        };
        let built = request
            .timeout(self.timeout)
            .build()
            .map_err(|source| network_error(shown, source))?;
        // One debug line per call (method, path, status, time): the path names mounts, envs
        // and secret names, never a value; tokens travel in headers and bodies only.
        let (method, path) = (built.method().clone(), built.url().path().to_owned());
        let started = Instant::now();
        let sent = SystemTime::now();
        let response = self.http.execute(built);
        let ms = started.elapsed().as_millis();
        if let Ok(r) = &response {
            self.note_date(r, sent);
        }
        match &response {
            Ok(r) => tracing::debug!("openbao {method} {path} {} {ms}ms", r.status().as_u16()),
            Err(_) => tracing::debug!("openbao {method} {path} failed {ms}ms"),
        }
        let response = response.map_err(|source| network_error(shown, source))?;
        Ok((response, deadline))
    }

    /// Keeps the answer's `Date` with this machine's clock around the call.
    fn note_date(&self, response: &Response, sent: SystemTime) {
        let received = SystemTime::now();
        let date = response
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok());
        if let Some(date) = date {
            *self
                .last_date
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(ServerDate {
                date,
                sent,
                received,
            });
        }
    }

    fn send<T: DeserializeOwned>(
        &self,
        request: RequestBuilder,
        shown: &str,
        call: &Call<'_>,
    ) -> Result<T> {
        let (response, deadline) = self.execute(request, shown)?;
        let status = response.status().as_u16();
        let body = read_body(response, shown, deadline)?;
        if !(200..300).contains(&status) {
            return Err(classify(shown, status, &body, call));
        }
        serde_json::from_slice(&body).map_err(|e| Error::UnexpectedBody {
            url: shown.to_owned(),
            status,
            json: serde_json::from_slice::<serde_json::Value>(&body).is_ok(),
            detail: describe_json_error(&e),
        })
    }
}

/// Refuses a mount or role that would not stay within its path segment(s).
fn check_name(what: &'static str, value: &str, nested: bool) -> Result<()> {
    let invalid = |reason| Error::InvalidName {
        what,
        value: value.to_owned(),
        reason,
    };
    let mut segments = value.split('/');
    if !nested && value.contains('/') {
        return Err(invalid("must not contain `/`"));
    }
    if segments.any(|s| check_segment(s).is_err()) {
        return Err(invalid("must be plain path segments"));
    }
    Ok(())
}

/// The largest OpenBao answer read: a KV version with its metadata is a few KiB, a login a few
/// hundred bytes. A longer body is refused rather than buffered.
pub const MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;

/// Reads an answer up to [`MAX_BODY_BYTES`] and until `deadline`: the memory and the time a
/// peer can take are both bounded.
fn read_body(response: Response, shown: &str, deadline: Instant) -> Result<Vec<u8>> {
    let status = response.status().as_u16();
    let hint = response.content_length();
    let failed = |source| Error::BodyRead {
        url: shown.to_owned(),
        source,
    };
    match monky_http::read_capped(response, hint, MAX_BODY_BYTES, deadline) {
        Ok(Some(body)) => Ok(body),
        Ok(None) => Err(Error::UnexpectedBody {
            url: shown.to_owned(),
            status,
            json: true,
            detail: format!("body over {MAX_BODY_BYTES} bytes"),
        }),
        Err(ReadError::Deadline) => Err(failed(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the call's deadline passed while reading the answer",
        ))),
        Err(ReadError::Io(source)) => Err(failed(source)),
    }
}

fn no_field(shown: &str, field: &str) -> Error {
    Error::UnexpectedBody {
        url: shown.to_owned(),
        status: 200,
        json: true,
        detail: format!("no `{field}` in the answer"),
    }
}

/// A transport failure; a certificate the trust root rejects gets its own variant so the
/// message says so.
fn network_error(shown: &str, source: reqwest::Error) -> Error {
    if let Some(refusal) = refusal_in(&source) {
        return Error::ConnectionCheck {
            url: shown.to_owned(),
            reason: refusal.to_string(),
            source,
        };
    }
    let url = shown.to_owned();
    match monky_http::certificate::refused_in(&source).map(|(r, cause)| (r, cause.to_string())) {
        Some((Refused::Time(problem), reason)) => Error::CertificateTime {
            url,
            problem,
            reason,
            source,
        },
        Some((Refused::Refusal(refusal), reason)) => Error::Tls {
            url,
            refusal,
            reason,
            source,
        },
        None => Error::Network { url, source },
    }
}

/// The error envelope. A KV read of a deleted or destroyed version answers 404 with the full
/// data envelope instead of `errors`.
#[derive(Deserialize, Default)]
struct ErrorEnvelope {
    #[serde(default)]
    errors: Option<Vec<String>>,
    #[serde(default)]
    data: Option<ErrorData>,
}

#[derive(Deserialize, Default)]
struct ErrorData {
    #[serde(default)]
    metadata: Option<VersionMetadata>,
}

#[derive(Deserialize, Default)]
struct VersionMetadata {
    #[serde(default)]
    deletion_time: Option<String>,
    #[serde(default)]
    destroyed: bool,
    #[serde(default)]
    version: Option<u64>,
}

/// Turns a non-2xx answer into an [`Error`], keeping OpenBao's `errors[]` and status.
fn classify(shown: &str, status: u16, body: &[u8], call: &Call<'_>) -> Error {
    let parsed = serde_json::from_slice::<ErrorEnvelope>(body);
    let errors = parsed
        .as_ref()
        .ok()
        .and_then(|e| e.errors.clone())
        .unwrap_or_default();
    let url = shown.to_owned();
    if status == 503 && errors.iter().any(|e| e.contains("sealed")) {
        return Error::Sealed {
            url,
            status,
            errors,
        };
    }
    if status >= 500 || status == 429 {
        return Error::Unavailable {
            url,
            status,
            errors,
        };
    }
    if (300..400).contains(&status) {
        return Error::Rejected {
            url,
            status,
            errors: vec!["redirect not followed".to_owned()],
        };
    }
    let envelope = match parsed {
        Ok(envelope) => envelope,
        Err(e) => {
            return Error::UnexpectedBody {
                url,
                status,
                json: serde_json::from_slice::<serde_json::Value>(body).is_ok(),
                detail: describe_json_error(&e),
            };
        }
    };
    match (status, call) {
        (400, Call::Login { mount, role }) => Error::LoginRejected {
            mount: (*mount).to_owned(),
            role: (*role).to_owned(),
            status,
            errors,
        },
        (403, _) => Error::PermissionDenied {
            url,
            status,
            multi_error: errors.iter().any(|e| e.contains("error occurred")),
            errors,
        },
        (404, _) => {
            let (path, version) = match call {
                Call::Kv { path, version } => (path.api_path(), *version),
                _ => (url_path(shown), None),
            };
            let metadata = envelope.data.and_then(|d| d.metadata);
            let found_version = metadata.as_ref().and_then(|m| m.version);
            let absence = match metadata {
                Some(m) if m.destroyed => Absence::Destroyed,
                Some(VersionMetadata {
                    deletion_time: Some(t),
                    ..
                }) if !t.is_empty() => Absence::Deleted { deletion_time: t },
                _ => Absence::Missing,
            };
            Error::NotFound {
                path,
                version,
                found_version,
                absence,
                status,
                errors,
            }
        }
        _ => Error::Rejected {
            url,
            status,
            errors,
        },
    }
}

/// The path below `/v1/` of a shown URL, for a 404 outside the KV store.
fn url_path(shown: &str) -> String {
    Url::parse(shown)
        .ok()
        .and_then(|u| u.path().split_once("/v1/").map(|(_, rest)| rest.to_owned()))
        .unwrap_or_else(|| shown.to_owned())
}

#[derive(Deserialize)]
struct AuthEnvelope {
    #[serde(default)]
    auth: Option<AuthBody>,
    #[serde(default)]
    warnings: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct AuthBody {
    client_token: String,
    #[serde(default)]
    accessor: String,
    #[serde(default)]
    policies: Option<Vec<String>>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    lease_duration: u64,
    #[serde(default)]
    renewable: bool,
    #[serde(default)]
    entity_id: String,
    #[serde(default)]
    token_type: String,
}

#[derive(Deserialize)]
struct DataEnvelope<T> {
    #[serde(default = "Option::default")]
    data: Option<T>,
}

/// `lookup-self`'s `data`. `id` (the token itself) is deliberately not read.
#[derive(Deserialize)]
struct LookupData {
    #[serde(default)]
    accessor: String,
    #[serde(default)]
    creation_time: u64,
    #[serde(default)]
    creation_ttl: u64,
    #[serde(default)]
    entity_id: String,
    #[serde(default)]
    expire_time: Option<String>,
    #[serde(default)]
    explicit_max_ttl: u64,
    #[serde(default)]
    issue_time: Option<String>,
    #[serde(default)]
    meta: Option<BTreeMap<String, String>>,
    #[serde(default)]
    policies: Option<Vec<String>>,
    #[serde(default)]
    renewable: bool,
    #[serde(default)]
    ttl: u64,
    #[serde(default, rename = "type")]
    token_type: String,
}

impl LookupData {
    fn into_info(self) -> TokenInfo {
        TokenInfo {
            ttl: ttl(self.ttl),
            creation_ttl: ttl(self.creation_ttl),
            creation_time: self.creation_time,
            expire_time: self.expire_time,
            explicit_max_ttl: ttl(self.explicit_max_ttl),
            meta: self.meta.unwrap_or_default(),
            renewable: self.renewable,
            accessor: self.accessor,
            policies: self.policies.unwrap_or_default(),
            entity_id: self.entity_id,
            issue_time: self.issue_time,
            token_type: self.token_type,
        }
    }
}

/// KV v2 `data`: the document (`null` for a deleted or destroyed version) and its metadata.
#[derive(Deserialize)]
struct KvData {
    #[serde(default)]
    data: Option<serde_json::Map<String, serde_json::Value>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(addr: &str) -> BaoClient {
        BaoClient::builder(Url::parse(addr).unwrap())
            .build()
            .unwrap()
    }

    #[test]
    fn connect_to_rewrites_port_and_keeps_host() {
        let c = BaoClient::builder(Url::parse("https://bao.example.test:8200").unwrap())
            .connect_to("127.0.0.1:41234".parse().unwrap())
            .build()
            .unwrap();
        let (url, shown) = c.url(&["auth", "token", "lookup-self"], None);
        assert_eq!(
            url.as_str(),
            "https://bao.example.test:41234/v1/auth/token/lookup-self"
        );
        assert_eq!(
            shown,
            "https://bao.example.test:8200/v1/auth/token/lookup-self"
        );
        assert_eq!(c.host_header.as_deref(), Some("bao.example.test:8200"));
        let c = BaoClient::builder(Url::parse("https://bao.example.test").unwrap())
            .connect_to("127.0.0.1:41234".parse().unwrap())
            .build()
            .unwrap();
        assert_eq!(c.host_header.as_deref(), Some("bao.example.test"));
        assert_eq!(client("https://bao.example.test:8200").host_header, None);
    }

    #[test]
    fn connect_to_replaces_an_ip_literal() {
        let c = BaoClient::builder(Url::parse("http://10.1.2.3:8200").unwrap())
            .connect_to("127.0.0.1:41234".parse().unwrap())
            .build()
            .unwrap();
        let (url, _) = c.url(&["sys", "health"], None);
        assert_eq!(url.as_str(), "http://127.0.0.1:41234/v1/sys/health");
    }

    #[test]
    fn urls_keep_a_base_path_and_add_the_version() {
        let c = client("https://bao.example.test/prefix/");
        let path = KvPath::parse("monky/env-a/see/pg", "monky", "env-a").unwrap();
        let (url, _) = c.url(&path.api_segments(), Some("3"));
        assert_eq!(
            url.as_str(),
            "https://bao.example.test/prefix/v1/monky/data/env-a/see/pg?version=3"
        );
    }

    #[test]
    fn bad_addresses_refused() {
        let check = |addr: &str, reason: &str| {
            let err = BaoClient::builder(Url::parse(addr).unwrap())
                .build()
                .unwrap_err();
            assert!(err.to_string().contains(reason), "{addr}: {err}");
        };
        check("ftp://bao.example.test", "scheme");
        check("https://u:p@bao.example.test", "credentials");
        check("https://bao.example.test/?x=1", "query");
        check("unix:/run/bao.sock", "scheme");
    }

    #[test]
    fn a_password_in_the_address_is_never_quoted() {
        let err = BaoClient::builder(Url::parse("https://u:s3cret-pw@bao.example.test").unwrap())
            .build()
            .unwrap_err();
        assert!(!format!("{err} {err:?}").contains("s3cret-pw"), "{err:?}");
        assert!(err.to_string().contains("bao.example.test"), "{err}");
    }

    #[test]
    fn empty_ca_bundle_refused() {
        let err = BaoClient::builder(Url::parse("https://bao.example.test").unwrap())
            .ca_bundle_pem(b"not a certificate\n".to_vec())
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::CaBundle { .. }), "{err}");
    }

    #[test]
    fn mount_and_role_names_checked() {
        let c = client("http://127.0.0.1:9");
        let jwt = SecretString::from("x.y.z".to_owned());
        let check = |mount: &str, role: &str| {
            let err = c.login_jwt(mount, role, &jwt).unwrap_err();
            assert!(
                matches!(err, Error::InvalidName { .. }),
                "{mount} {role}: {err}"
            );
        };
        check("../sys", "see-env");
        check("jwt-tenancy", "a/b");
        check("", "see-env");
        check("jwt-tenancy", "");
        check("jwt tenancy", "see-env");
    }

    /// `classify` for a KV read of `monky/data/env-a/see/pg`.
    fn kv_error(status: u16, body: &str) -> Error {
        let path = KvPath::parse("monky/env-a/see/pg", "monky", "env-a").unwrap();
        let call = Call::Kv {
            path: &path,
            version: Some(2),
        };
        classify(
            "https://b/v1/monky/data/env-a/see/pg",
            status,
            body.as_bytes(),
            &call,
        )
    }

    #[test]
    fn classification() {
        use crate::ErrorKind::*;
        let check = |status: u16, body: &str, kind: crate::ErrorKind, errors: &[&str]| {
            let err = kv_error(status, body);
            assert_eq!(err.kind(), kind, "{status} {body}: {err}");
            assert_eq!(err.errors(), errors, "{status} {body}");
            assert_eq!(err.status(), Some(status));
        };
        check(
            403,
            r#"{"errors":["permission denied"]}"#,
            PermissionDenied,
            &["permission denied"],
        );
        check(
            403,
            r#"{"errors":["1 error occurred:\n\t* permission denied\n\n"]}"#,
            PermissionDenied,
            &["1 error occurred:\n\t* permission denied\n\n"],
        );
        check(404, r#"{"errors":[]}"#, NotFound, &[]);
        check(
            503,
            r#"{"errors":["Vault is sealed"]}"#,
            Temporary,
            &["Vault is sealed"],
        );
        check(
            500,
            r#"{"errors":["internal error"]}"#,
            Temporary,
            &["internal error"],
        );
        check(502, "<html>bad gateway</html>", Temporary, &[]);
        check(
            429,
            r#"{"errors":["request path \"x\": rate limit quota exceeded"]}"#,
            Temporary,
            &["request path \"x\": rate limit quota exceeded"],
        );
        check(
            400,
            r#"{"errors":["invalid version"]}"#,
            Refused,
            &["invalid version"],
        );
        check(
            405,
            r#"{"errors":["1 error occurred:\n\t* unsupported operation\n\n"]}"#,
            Refused,
            &["1 error occurred:\n\t* unsupported operation\n\n"],
        );
        check(301, "", Refused, &["redirect not followed"]);
        // A proxy's HTML page for a 4xx: not OpenBao speaking, so try again later.
        check(403, "<html>forbidden</html>", Temporary, &[]);
    }

    #[test]
    fn denial_forms_told_apart() {
        let plain = kv_error(403, r#"{"errors":["permission denied"]}"#);
        let multi = kv_error(
            403,
            r#"{"errors":["1 error occurred:\n\t* permission denied\n\n"]}"#,
        );
        assert!(matches!(
            plain,
            Error::PermissionDenied {
                multi_error: false,
                ..
            }
        ));
        assert!(matches!(
            multi,
            Error::PermissionDenied {
                multi_error: true,
                ..
            }
        ));
    }

    #[test]
    fn deleted_and_destroyed_versions() {
        let deleted = kv_error(
            404,
            r#"{"request_id":"r","lease_id":"","renewable":false,"lease_duration":0,
               "data":{"data":null,"metadata":{"created_time":"2026-09-05T07:40:00.1Z",
               "custom_metadata":null,"deletion_time":"2026-09-06T08:00:00.2Z",
               "destroyed":false,"version":2}},"wrap_info":null,"warnings":null,"auth":null}"#,
        );
        assert_eq!(
            deleted.absence(),
            Some(&Absence::Deleted {
                deletion_time: "2026-09-06T08:00:00.2Z".into()
            })
        );
        assert!(
            deleted.to_string().contains("version 2 was deleted at"),
            "{deleted}"
        );
        let destroyed = kv_error(
            404,
            r#"{"data":{"data":null,"metadata":{"created_time":"2026-09-05T07:40:00.1Z",
               "custom_metadata":null,"deletion_time":"","destroyed":true,"version":2}}}"#,
        );
        assert_eq!(destroyed.absence(), Some(&Absence::Destroyed));
        assert!(
            destroyed.to_string().ends_with("version 2 was destroyed"),
            "{destroyed}"
        );
        let missing = kv_error(404, r#"{"errors":[]}"#);
        assert_eq!(missing.absence(), Some(&Absence::Missing));
    }

    #[test]
    fn login_400_is_login_rejected_elsewhere_refused() {
        let body = br#"{"errors":["error validating token: invalid audience (aud) claim: audience claim does not match any expected audience"]}"#;
        let login = classify(
            "u",
            400,
            body,
            &Call::Login {
                mount: "jwt-tenancy",
                role: "see-env",
            },
        );
        assert_eq!(login.kind(), crate::ErrorKind::LoginRejected);
        assert!(
            login.to_string().contains("audience claim does not match"),
            "{login}"
        );
        let other = classify("u", 400, body, &Call::Token);
        assert_eq!(other.kind(), crate::ErrorKind::Refused);
    }
}
