//! Blocking HTTP client for tenancy's four agent calls.
//!
//! The client adds the bearer, enforces a per-call deadline and the bundle size limit, never
//! follows redirects, ignores proxy environment variables and classifies every failure (see
//! [`ErrorKind`](crate::ErrorKind)). It holds no agent policy: no retries, no config, no exits.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use reqwest::RequestBuilder;
use reqwest::header::{self, HeaderMap, HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use serde::de::DeserializeOwned;
use url::Url;

use monky_http::connect::refusal_in;
use monky_http::{
    BaseRefusal, BuildError, CheckHook, ConnectionCheck, Mapping, ReadError, Response, Settings,
    without_credentials,
};

use crate::error::{Call, Error, Result};
use crate::wire::{
    BundleDownload, CheckinRequest, CheckinResponse, LeaseRequest, LeaseResponse, ReportRequest,
    is_retired_lease_shape,
};

/// Default per-call timeout: 30 seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default bundle size limit: 4 MiB, the same as the bundle parser's.
pub const DEFAULT_MAX_BUNDLE_BYTES: u64 = 4 * 1024 * 1024;
/// JSON answers larger than this are refused rather than buffered.
const MAX_JSON_BYTES: u64 = 1024 * 1024;
/// The longest `Retry-After` honoured: one hour. A longer wait (or a date further out) is
/// clamped to it, so a peer cannot park the agent for ages.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Builder for [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: Url,
    timeout: Duration,
    connect_to: Option<SocketAddr>,
    max_bundle_bytes: u64,
    user_agent: String,
    ca_bundle_pem: Option<Vec<u8>>,
    connection_check: Option<CheckHook>,
}

impl ClientBuilder {
    /// Deadline for each call, from connecting until the body is read (default 30 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Send every connection to `addr` while the URL, the `Host` header and TLS SNI keep the
    /// base URL's host name and port.
    #[must_use]
    pub fn connect_to(mut self, addr: SocketAddr) -> Self {
        self.connect_to = Some(addr);
        self
    }

    /// Largest bundle body accepted (default 4 MiB); enforced while reading.
    #[must_use]
    pub fn max_bundle_bytes(mut self, limit: u64) -> Self {
        self.max_bundle_bytes = limit;
        self
    }

    /// The `User-Agent` header (default `monky-agent-proto/<version>`).
    #[must_use]
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// Trust only the certificates of this PEM bundle for an `https` base URL (not the
    /// system's roots); a bundle without any certificate is refused by [`build`](Self::build).
    #[must_use]
    pub fn ca_bundle_pem(mut self, pem: Vec<u8>) -> Self {
        self.ca_bundle_pem = Some(pem);
        self
    }

    /// Run `check` on every new connection, after connecting (and the TLS handshake for
    /// `https`) and before the first byte of a request is written; its refusal drops the
    /// connection and the call fails with [`Error::ConnectionCheck`], which carries the check's
    /// own error ([`Error::check_refusal`]).
    #[must_use]
    pub fn connection_check(mut self, check: ConnectionCheck) -> Self {
        self.connection_check = Some(CheckHook(check));
        self
    }

    /// Build the client.
    ///
    /// # Errors
    /// [`Error::BaseUrl`] for a URL that is not `http`/`https` with a host,
    /// [`Error::CaBundle`] for a CA bundle that does not parse or holds no certificate,
    /// [`Error::Build`] otherwise.
    pub fn build(self) -> Result<Client> {
        let mut base = self.base_url;
        let bad = |reason| Error::BaseUrl {
            url: without_credentials(&base),
            reason,
        };
        if let Err(refusal) = monky_http::check_base(&base) {
            return Err(bad(match refusal {
                BaseRefusal::Scheme => "the scheme must be http or https",
                BaseRefusal::NoHost => "the url has no host",
                BaseRefusal::Credentials => "credentials do not belong in the url",
                BaseRefusal::QueryOrFragment => "the url must not carry a query or fragment",
            }));
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }

        // Tenancy inside the mesh is plain HTTP and a bundle URL must keep its origin, so such a
        // client loads no trust roots; the port of a mapping is rewritten per request (see
        // `Client::wire_url`).
        let mapping = self.connect_to.and_then(|addr| Mapping::new(&base, addr));
        let settings = Settings {
            timeout: self.timeout,
            connect_timeout: self.timeout,
            user_agent: self.user_agent,
            ca_bundle_pem: self.ca_bundle_pem,
            mapping: mapping.clone(),
            connection_check: self.connection_check.map(|CheckHook(check)| check),
        };
        let http = monky_http::build_client(&base, settings).map_err(|e| match e {
            BuildError::CaBundle { reason } => Error::CaBundle { reason },
            e @ (BuildError::Build(_) | BuildError::Runtime(_)) => Error::Build {
                source: Box::new(e),
            },
        })?;
        Ok(Client {
            http,
            base,
            mapping,
            timeout: self.timeout,
            max_bundle_bytes: self.max_bundle_bytes,
        })
    }
}

/// Blocking client for tenancy's agent entrypoint.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use monky_agent_proto::{Client, LeaseRequest};
/// use secrecy::SecretString;
///
/// let client = Client::builder("http://monky.tenancy.deploy:443".parse()?)
///     .connect_to("127.0.0.1:18443".parse()?)
///     .build()?;
/// let bearer = SecretString::from("s.token".to_owned());
/// let lease = client.lease(&bearer, &LeaseRequest { env_id: "env-qa-02".into(), reason: "apply".into() })?;
/// println!("grant for {}", lease.env_id);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    http: monky_http::Client,
    base: Url,
    mapping: Option<Mapping>,
    timeout: Duration,
    max_bundle_bytes: u64,
}

impl Client {
    /// Start building a client for tenancy at `base_url`.
    #[must_use]
    pub fn builder(base_url: Url) -> ClientBuilder {
        ClientBuilder {
            base_url,
            timeout: DEFAULT_TIMEOUT,
            connect_to: None,
            max_bundle_bytes: DEFAULT_MAX_BUNDLE_BYTES,
            user_agent: concat!("monky-agent-proto/", env!("CARGO_PKG_VERSION")).to_owned(),
            ca_bundle_pem: None,
            connection_check: None,
        }
    }

    /// The base URL every call is resolved against.
    #[must_use]
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// `POST /v1/agent/checkin`.
    ///
    /// # Errors
    /// Any [`Error`]; branch on [`Error::kind`].
    pub fn checkin(&self, bearer: &SecretString, req: &CheckinRequest) -> Result<CheckinResponse> {
        let url = self.endpoint("v1/agent/checkin");
        let resp = self.post(&url, bearer, req)?;
        let (status, value) = self.json_body(&url, resp)?;
        let answer: CheckinResponse = typed(&url, status, Call::Checkin, value)?;
        same_env(&url, status, Call::Checkin, &req.env_id, &answer.env_id)?;
        Ok(answer)
    }

    /// `GET <bundle_url>`: the bundle path from checkin, resolved against the base URL.
    ///
    /// The body is read with the size limit enforced while reading.
    ///
    /// # Errors
    /// [`Error::BundleUrl`] for a URL that leaves tenancy's origin, [`Error::BundleTooLarge`]
    /// beyond the limit, otherwise as for the other calls.
    pub fn bundle(&self, bearer: &SecretString, bundle_url: &str) -> Result<BundleDownload> {
        let url = self.bundle_url(bundle_url)?;
        let deadline = Instant::now() + self.timeout;
        let resp = self.send(&url, self.request(reqwest::Method::GET, &url, bearer))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(self.error_response(&url, resp));
        }
        let header_sha = header_text(resp.headers(), "x-bundle-sha")
            .or_else(|| header_text(resp.headers(), "x-bundle-sha256"));
        let limit = self.max_bundle_bytes;
        if resp.content_length().is_some_and(|len| len > limit) {
            return Err(Error::BundleTooLarge {
                url: Box::new(url),
                limit,
            });
        }
        let bytes =
            read_capped(&url, resp, limit, deadline)?.ok_or_else(|| Error::BundleTooLarge {
                url: Box::new(url.clone()),
                limit,
            })?;
        Ok(BundleDownload { bytes, header_sha })
    }

    /// `POST /v1/agent/lease`.
    ///
    /// # Errors
    /// [`Error::LeaseShape`] for a body in the retired AppRole shape, otherwise as for the other
    /// calls.
    pub fn lease(&self, bearer: &SecretString, req: &LeaseRequest) -> Result<LeaseResponse> {
        let url = self.endpoint("v1/agent/lease");
        let resp = self.post(&url, bearer, req)?;
        let (status, value) = self.json_body(&url, resp)?;
        if is_retired_lease_shape(&value) {
            return Err(Error::LeaseShape { url: Box::new(url) });
        }
        let answer: LeaseResponse = typed(&url, status, Call::Lease, value)?;
        same_env(&url, status, Call::Lease, &req.env_id, &answer.env_id)?;
        Ok(answer)
    }

    /// `POST /v1/agent/report`. Any JSON (or empty) 2xx answer counts as accepted.
    ///
    /// # Errors
    /// As for the other calls.
    pub fn report(&self, bearer: &SecretString, req: &ReportRequest) -> Result<()> {
        let url = self.endpoint("v1/agent/report");
        let resp = self.post(&url, bearer, req)?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(self.error_response(&url, resp));
        }
        let content_type = header_text(resp.headers(), "content-type");
        let deadline = Instant::now() + self.timeout;
        let body = read_json_capped(&url, status, resp, deadline)?;
        if body.iter().all(u8::is_ascii_whitespace)
            || serde_json::from_slice::<serde_json::Value>(&body).is_ok()
        {
            Ok(())
        } else {
            Err(Error::NotJson {
                url: Box::new(url),
                status,
                content_type,
                retry_after: None,
            })
        }
    }

    fn endpoint(&self, path: &str) -> Url {
        self.base.join(path).unwrap_or_else(|_| self.base.clone())
    }

    fn bundle_url(&self, bundle_url: &str) -> Result<Url> {
        let refuse = |reason| Error::BundleUrl {
            url: bundle_url.to_owned(),
            reason,
        };
        let url = self
            .base
            .join(bundle_url)
            .map_err(|_| refuse("not a url"))?;
        let same_origin = url.scheme() == self.base.scheme()
            && url.host_str() == self.base.host_str()
            && url.port_or_known_default() == self.base.port_or_known_default();
        if !same_origin {
            return Err(refuse("it points away from tenancy"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Error::BundleUrl {
                url: without_credentials(&url),
                reason: "it carries credentials",
            });
        }
        Ok(url)
    }

    /// The URL actually dialled: with a mapping, the mapped port (and address for an IP host).
    fn wire_url(&self, url: &Url) -> Url {
        match &self.mapping {
            Some(mapping) => mapping.wire_url(url),
            None => url.clone(),
        }
    }

    fn request(&self, method: reqwest::Method, url: &Url, bearer: &SecretString) -> RequestBuilder {
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", bearer.expose_secret()))
            .unwrap_or_else(|_| HeaderValue::from_static("Bearer"));
        auth.set_sensitive(true);
        let mut req = self
            .http
            .request(method, self.wire_url(url))
            .timeout(self.timeout)
            .header(header::AUTHORIZATION, auth)
            .header(header::ACCEPT, "application/json");
        if let Some(mapping) = &self.mapping {
            req = req.header(header::HOST, mapping.host_header());
        }
        req
    }

    fn post<T: Serialize>(&self, url: &Url, bearer: &SecretString, body: &T) -> Result<Response> {
        self.send(
            url,
            self.request(reqwest::Method::POST, url, bearer).json(body),
        )
    }

    fn send(&self, url: &Url, req: RequestBuilder) -> Result<Response> {
        let transport = |source: reqwest::Error| {
            let source = source.without_url();
            match refusal_in(&source) {
                Some(refusal) => Error::ConnectionCheck {
                    url: Box::new(url.clone()),
                    reason: refusal.to_string(),
                    source,
                },
                None => Error::Transport {
                    url: Box::new(url.clone()),
                    source,
                },
            }
        };
        let built = req.build().map_err(transport)?;
        // One debug line per call (method, path, status, time); the bearer is a header, and
        // the path holds env ids and shas only.
        let (method, path) = (built.method().clone(), url.path().to_owned());
        let started = Instant::now();
        let response = self.http.execute(built);
        let ms = started.elapsed().as_millis();
        match &response {
            Ok(r) => tracing::debug!("tenancy {method} {path} {} {ms}ms", r.status().as_u16()),
            Err(_) => tracing::debug!("tenancy {method} {path} failed {ms}ms"),
        }
        response.map_err(transport)
    }

    /// Read a JSON answer; a non-2xx status becomes the classified error.
    fn json_body(&self, url: &Url, resp: Response) -> Result<(u16, serde_json::Value)> {
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(self.error_response(url, resp));
        }
        let content_type = header_text(resp.headers(), "content-type");
        let deadline = Instant::now() + self.timeout;
        let body = read_json_capped(url, status, resp, deadline)?;
        let value = serde_json::from_slice(&body).map_err(|_| Error::NotJson {
            url: Box::new(url.clone()),
            status,
            content_type,
            retry_after: None,
        })?;
        Ok((status, value))
    }

    fn error_response(&self, url: &Url, resp: Response) -> Error {
        let status = resp.status().as_u16();
        let content_type = header_text(resp.headers(), "content-type");
        let retry_after = header_text(resp.headers(), "retry-after")
            .and_then(|v| parse_retry_after(&v, SystemTime::now()));
        let deadline = Instant::now() + self.timeout;
        let body = match read_json_capped(url, status, resp, deadline) {
            Ok(body) => body,
            Err(err) => return err,
        };
        match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(value) => {
                let code = value.get("code").and_then(|c| c.as_str()).map(Into::into);
                let detail = match value.get("detail") {
                    Some(serde_json::Value::String(text)) => text.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                Error::Status {
                    url: Box::new(url.clone()),
                    status,
                    code,
                    detail,
                    retry_after,
                }
            }
            Err(_) => Error::NotJson {
                url: Box::new(url.clone()),
                status,
                content_type,
                retry_after,
            },
        }
    }
}

fn typed<T: DeserializeOwned>(
    url: &Url,
    status: u16,
    call: Call,
    value: serde_json::Value,
) -> Result<T> {
    serde_json::from_value(value).map_err(|e| Error::Invalid {
        url: Box::new(url.clone()),
        status,
        call,
        detail: without_quoted_values(&e.to_string()),
    })
}

/// Refuses an answer for another env than the one asked about: acting on it would deploy (or
/// log in for) someone else's environment.
fn same_env(url: &Url, status: u16, call: Call, asked: &str, answered: &str) -> Result<()> {
    if asked == answered {
        return Ok(());
    }
    Err(Error::Invalid {
        url: Box::new(url.clone()),
        status,
        call,
        detail: format!(
            "the answer is for env_id {}, the request was for {asked}",
            printable(answered, 64)
        ),
    })
}

/// A peer's text for a message: at most `max` characters, control and other invisible
/// characters escaped, so it cannot break a log line or hide in one.
fn printable(text: &str, max: usize) -> String {
    let cut: String = text.chars().take(max).collect();
    let mut out = monky_vocab::text::escape(&cut, false).replace('"', "\\\"");
    if text.chars().nth(max).is_some() {
        out.push('…');
    }
    format!("\"{out}\"")
}

/// `Retry-After` in either of its forms (RFC 9110): delay seconds, or an HTTP date, which
/// counts from `now`. The wait is clamped to [`MAX_RETRY_AFTER`]; a date in the past is no wait.
/// Anything else is ignored.
#[must_use]
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Longer than u64 still means "a very long time", not "no header".
        Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// A decoder message with each `"..."` (a value from the body) cut to `"…"`; field names,
/// which serde quotes with backticks, stay.
fn without_quoted_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut inside = false;
    for c in message.chars() {
        if c == '"' {
            out.push_str(if inside { "…\"" } else { "\"" });
            inside = !inside;
        } else if !inside {
            out.push(c);
        }
    }
    out
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Read a JSON-sized body; an oversized one is a shape refusal, not something to buffer.
fn read_json_capped(url: &Url, status: u16, resp: Response, deadline: Instant) -> Result<Vec<u8>> {
    read_capped(url, resp, MAX_JSON_BYTES, deadline)?.ok_or_else(|| Error::Shape {
        url: Box::new(url.clone()),
        status,
        detail: format!("response body exceeds {MAX_JSON_BYTES} bytes"),
    })
}

/// Read at most `limit` bytes before `deadline`; `None` when the body is longer than `limit`.
fn read_capped(
    url: &Url,
    resp: Response,
    limit: u64,
    deadline: Instant,
) -> Result<Option<Vec<u8>>> {
    let hint = resp.content_length();
    monky_http::read_capped(resp, hint, limit, deadline).map_err(|e| Error::Read {
        url: Box::new(url.clone()),
        source: match e {
            ReadError::Io(source) => source,
            ReadError::Deadline => std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the call's deadline passed while reading the body",
            ),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(base: &str, connect_to: Option<&str>) -> Client {
        let mut builder = Client::builder(base.parse().unwrap());
        if let Some(addr) = connect_to {
            builder = builder.connect_to(addr.parse().unwrap());
        }
        builder.build().unwrap()
    }

    #[test]
    fn mapping_rewrites_the_port_and_keeps_the_name() {
        let c = client("http://monky.tenancy.deploy:443", Some("127.0.0.1:18443"));
        let url = c.endpoint("v1/agent/checkin");
        assert_eq!(
            url.as_str(),
            "http://monky.tenancy.deploy:443/v1/agent/checkin"
        );
        assert_eq!(
            c.wire_url(&url).as_str(),
            "http://monky.tenancy.deploy:18443/v1/agent/checkin"
        );
        assert_eq!(
            c.mapping.as_ref().unwrap().host_header(),
            "monky.tenancy.deploy:443"
        );

        let c = client("https://monky.tenancy.deploy", Some("127.0.0.1:9"));
        assert_eq!(
            c.mapping.as_ref().unwrap().host_header(),
            "monky.tenancy.deploy"
        );
        let url = c.endpoint("v1/agent/lease");
        assert_eq!(
            c.wire_url(&url).as_str(),
            "https://monky.tenancy.deploy:9/v1/agent/lease"
        );

        let c = client("http://10.1.2.3:8081/", Some("127.0.0.1:9"));
        assert_eq!(
            c.wire_url(&c.endpoint("x")).as_str(),
            "http://127.0.0.1:9/x"
        );
        assert_eq!(c.mapping.as_ref().unwrap().host_header(), "10.1.2.3:8081");
    }

    #[test]
    fn endpoints_keep_a_base_path_prefix() {
        let c = client("http://t.test:8081/tenancy", None);
        assert_eq!(
            c.endpoint("v1/agent/report").as_str(),
            "http://t.test:8081/tenancy/v1/agent/report"
        );
        assert_eq!(
            c.wire_url(&c.endpoint("v1")).as_str(),
            "http://t.test:8081/tenancy/v1"
        );
    }

    #[test]
    fn bundle_urls_stay_on_tenancy() {
        let c = client("http://t.test:8081/", None);
        let check = |input: &str, expected: Option<&str>| {
            let got = c.bundle_url(input).ok().map(|u| u.to_string());
            assert_eq!(got.as_deref(), expected, "{input}");
        };
        check(
            "/v1/agent/bundle/e/abc",
            Some("http://t.test:8081/v1/agent/bundle/e/abc"),
        );
        check(
            "http://t.test:8081/v1/agent/bundle/e/abc",
            Some("http://t.test:8081/v1/agent/bundle/e/abc"),
        );
        check("http://evil.test:8081/v1/agent/bundle/e/abc", None);
        check("//evil.test/v1/agent/bundle/e/abc", None);
        check("https://t.test:8081/v1/agent/bundle/e/abc", None);
        check("http://t.test:9/v1/agent/bundle/e/abc", None);
        check("http://user:pw@t.test:8081/x", None);
    }

    #[test]
    fn a_shape_error_quotes_no_value() {
        let url: Url = "http://t.test/v1/agent/lease".parse().unwrap();
        let body = serde_json::json!({"env_id": "e", "login_jwt": 7, "ttl_s": "eyJsecret.x.y"});
        let err = typed::<crate::LeaseResponse>(&url, 200, Call::Lease, body).unwrap_err();
        let Error::Invalid { detail, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(err.code(), Some(&crate::ErrorCode::LeaseInvalid));
        assert!(!format!("{err:?}").contains("eyJsecret"), "{err:?}");
        assert!(detail.contains("invalid type"), "{detail}");
        assert_eq!(
            without_quoted_values(r#"invalid type: string "tok", expected u64"#),
            "invalid type: string \"…\", expected u64"
        );
    }

    #[test]
    fn retry_after_takes_both_forms_and_is_clamped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let date = |offset: u64| httpdate::fmt_http_date(now + Duration::from_secs(offset));
        let check = |value: &str, expected: Option<u64>| {
            assert_eq!(
                parse_retry_after(value, now),
                expected.map(Duration::from_secs),
                "{value:?}"
            );
        };
        check("30", Some(30));
        check(" 0 ", Some(0));
        check("3600", Some(3600));
        check("1000000000000", Some(3600));
        check(&u64::MAX.to_string(), Some(3600));
        check("184467440737095516150", Some(3600));
        check(&date(90), Some(90));
        check(&date(10_000_000), Some(3600));
        check(
            &httpdate::fmt_http_date(now - Duration::from_secs(60)),
            Some(0),
        );
        check("-5", None);
        check("1.5", None);
        check("soon", None);
        check("", None);
    }

    #[test]
    fn printable_escapes_and_cuts_a_peers_text() {
        assert_eq!(printable("env-x", 64), "\"env-x\"");
        assert_eq!(printable("a\nb\u{202e}", 64), "\"a\\nb\\u{202e}\"");
        assert_eq!(printable(&"x".repeat(70), 3), "\"xxx…\"");
    }

    #[test]
    fn a_password_in_a_url_is_never_quoted() {
        let err = Client::builder("http://u:s3cret-pw@t.test/".parse().unwrap())
            .build()
            .unwrap_err();
        assert!(!format!("{err} {err:?}").contains("s3cret-pw"), "{err:?}");
        let c = client("http://t.test:8081", None);
        let err = c
            .bundle_url("http://u:s3cret-pw@t.test:8081/x")
            .unwrap_err();
        assert!(!format!("{err} {err:?}").contains("s3cret-pw"), "{err:?}");
        assert!(err.to_string().contains("credentials"), "{err}");
    }

    #[test]
    fn bad_base_urls_are_refused() {
        let check = |base: &str| {
            let err = Client::builder(base.parse().unwrap()).build().unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Refused, "{base}");
            assert!(matches!(err, Error::BaseUrl { .. }), "{base}");
        };
        check("ftp://t.test/");
        check("unix:/run/x.sock");
        check("http://u:p@t.test/");
        check("http://t.test/?q=1");
    }
}
