//! `FakeTenancy`: a loopback fake of tenancy's agent entrypoint for tests and the demo.
//!
//! It listens on `127.0.0.1:0` (plain HTTP, like the entrypoint behind the mesh) and keeps
//! tenancy's rules: bearer tokens are looked up on OpenBao with the root token
//! (`POST /v1/auth/token/lookup`), the request's env_id is pinned to the token's `meta.env_id`
//! (403 `AGENT_ENV_MISMATCH`), the token's `meta.grant_jti` must be a current grant of that env
//! (401 `AGENT_UNAUTHENTICATED` once superseded), and each env has its own rate buckets, measured
//! on the fake's settable clock. It signs real ES256 deploy grants and serves their JWK Set at
//! `GET /.well-known/agent-jwks.json`, so a fake OpenBao can verify them.
//!
//! Tests that do not need OpenBao can use [`FakeTenancy::issue_token`], a bearer the fake knows
//! by itself. Faults can be injected per endpoint; every request is recorded.
//!
//! The fake and an OpenBao each need the other's address; start the tenancy first, then the
//! OpenBao with [`FakeTenancy::jwks_url`], then call [`FakeTenancy::set_bao`].
//! The `peers` module's `Peers` does exactly that with the fake or the real OpenBao (named, not
//! linked: `peers` builds on this module, not the other way round).
//!
//! [`checkin_request`] and its siblings build sample wire requests for tests.

use std::collections::HashMap;
use std::io::{Cursor, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use monky_agent_proto::grant::{GrantClaims, GrantSigner};
use rand::Rng;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use url::Url;

use monky_agent_proto::wire::{
    ActionKind, CheckinAnswer, CheckinRequest, LeaseRequest, LeaseResponse, ReportRequest,
    VaultInfo,
};

mod fixtures;

pub use fixtures::{call, checkin_request, container, host_facts, lease_request, report_request};

/// Audience of deploy grants (the OpenBao role's `bound_audiences`).
pub use monky_agent_proto::grant::AUDIENCE as GRANT_AUDIENCE;
/// The `kind` claim of deploy grants (the OpenBao role's `bound_claims`).
pub use monky_agent_proto::grant::KIND as GRANT_KIND;
/// Lifetime of a deploy grant.
pub use monky_agent_proto::grant::TTL as GRANT_TTL;
/// OpenBao JWT auth mount named in leases and checkin's vault block.
pub const AUTH_MOUNT: &str = "jwt-tenancy";
/// OpenBao JWT auth role named in leases and checkin's vault block.
pub const AUTH_ROLE: &str = "see-env";
/// OpenBao address announced when no OpenBao is configured.
pub const DEFAULT_BAO_ADDR: &str = "https://bao.cbs.tikali.net:8200";

const MAX_REQUEST_BYTES: u64 = 1024 * 1024;

/// The fake's endpoints, for faults, limits and the request log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/agent/checkin`
    Checkin,
    /// `GET /v1/agent/bundle/{env}/{sha}`
    Bundle,
    /// `POST /v1/agent/lease`
    Lease,
    /// `POST /v1/agent/report`
    Report,
    /// `GET /.well-known/agent-jwks.json`
    Jwks,
}

/// A failure to inject at an endpoint, before tenancy's own checks run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status and body (sent as JSON when it parses as JSON).
    Status {
        /// HTTP status.
        status: u16,
        /// Response body.
        body: String,
    },
    /// Wait this long, then handle the request normally.
    Delay(Duration),
    /// Abandon the exchange: the client gets bytes that are not an HTTP response, never a
    /// status, the way a connection cut by the mesh looks to it.
    DropConnection,
    /// Answer 200 with an HTML page, as a captive proxy would.
    Garbage,
    /// Answer 429 with `Retry-After` (seconds) and the endpoint's rate-limit code.
    RetryAfter(u64),
    /// Answer a lease in the retired AppRole shape (`wrapping_token`, `role_id`).
    AppRoleLease,
    /// Answer as usual, but send only the first `keep` bytes of the body (after a head that
    /// announces all of it), then close the connection: a body cut short.
    Truncate {
        /// Body bytes delivered before the close.
        keep: usize,
    },
    /// As [`Fault::Truncate`], but end with a TCP reset instead of a close, the way a
    /// connection torn down mid-download looks to the client.
    Reset {
        /// Body bytes delivered before the reset.
        keep: usize,
    },
    /// Answer 200 with `len` bytes of filler, produced while sending and never held in memory.
    /// `chunked` leaves out the `Content-Length`, so only reading tells the client the size.
    LargeBody {
        /// Body length in bytes.
        len: u64,
        /// Send the body chunked, without a `Content-Length`.
        chunked: bool,
    },
}

/// One bucket: `count` requests per `per`, refilled continuously.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Burst size and requests per period.
    pub count: u32,
    /// The period.
    pub per: Duration,
}

impl Rate {
    /// `count` requests per minute.
    #[must_use]
    pub const fn per_minute(count: u32) -> Self {
        Rate {
            count,
            per: Duration::from_secs(60),
        }
    }

    /// `count` requests per hour.
    #[must_use]
    pub const fn per_hour(count: u32) -> Self {
        Rate {
            count,
            per: Duration::from_secs(3600),
        }
    }
}

/// Per-env rate buckets.
///
/// `Default` is tenancy's: checkin 6/min, bundle 10/min, report 30/min, lease 5/h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits {
    /// `POST /v1/agent/checkin`
    pub checkin: Rate,
    /// `GET /v1/agent/bundle/...`
    pub bundle: Rate,
    /// `POST /v1/agent/report`
    pub report: Rate,
    /// `POST /v1/agent/lease` (429 `LEASE_RATE_LIMITED`)
    pub lease: Rate,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            checkin: Rate::per_minute(6),
            bundle: Rate::per_minute(10),
            report: Rate::per_minute(30),
            lease: Rate::per_hour(5),
        }
    }
}

impl RateLimits {
    fn for_endpoint(&self, endpoint: Endpoint) -> Option<Rate> {
        match endpoint {
            Endpoint::Checkin => Some(self.checkin),
            Endpoint::Bundle => Some(self.bundle),
            Endpoint::Report => Some(self.report),
            Endpoint::Lease => Some(self.lease),
            Endpoint::Jwks => None,
        }
    }
}

/// What tenancy wants for an env; checkin answers from it.
///
/// With `action: None` tenancy decides: `apply` when `sha` differs from the agent's
/// `applied_sha`, `none` otherwise. `Some(action)` forces the action (`Down` retires).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// The desired bundle sha, sent as it is (a test may play a tenancy that sends a bad one).
    pub sha: Option<String>,
    /// A forced action, or `None` to let the fake decide.
    pub action: Option<ActionKind>,
    /// Sent as `purge_volumes`.
    pub purge_volumes: bool,
    /// Sent as `checkin_interval_s` (default 60), unclamped.
    pub checkin_interval_s: Option<u64>,
    /// Sent as `vault` (default: the configured OpenBao, mount `monky`, prefix `<env>/see`).
    pub vault: Option<VaultInfo>,
}

impl Desired {
    /// Desire `sha`; the action follows the agent's `applied_sha`.
    #[must_use]
    pub fn sha(sha: impl Into<String>) -> Self {
        Desired {
            sha: Some(sha.into()),
            ..Desired::default()
        }
    }

    /// Retire the env (`action: down`).
    #[must_use]
    pub fn down(purge_volumes: bool) -> Self {
        Desired {
            action: Some(ActionKind::Down),
            purge_volumes,
            ..Desired::default()
        }
    }
}

/// One request as the fake saw and answered it. Bearer values are never recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path and query as sent.
    pub path: String,
    /// The endpoint, when the path is one.
    pub endpoint: Option<Endpoint>,
    /// The env_id of the body or path, when there was one.
    pub env_id: Option<String>,
    /// Whether an `Authorization: Bearer` header was present.
    pub had_bearer: bool,
    /// The `Host` header.
    pub host: Option<String>,
    /// The status answered; `None` when the connection was dropped.
    pub status: Option<u16>,
    /// The JSON body, when the request had one.
    pub body: Option<Value>,
    /// When the request arrived (before any injected delay), for tests that measure pacing.
    pub at: Instant,
}

/// Builder for [`FakeTenancy`].
#[derive(Debug, Default)]
#[must_use]
pub struct FakeTenancyBuilder {
    bao: Option<BaoConfig>,
    limits: RateLimits,
}

impl FakeTenancyBuilder {
    /// Check bearers against this OpenBao (`ca_pem` = its CA when it speaks TLS).
    pub fn bao(mut self, url: Url, ca_pem: Option<Vec<u8>>, root_token: SecretString) -> Self {
        self.bao = Some(BaoConfig {
            url,
            ca_pem,
            root_token,
        });
        self
    }

    /// Start with these rate buckets instead of tenancy's defaults.
    pub fn limits(mut self, limits: RateLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Bind `127.0.0.1:0` and serve on a background thread until the handle is dropped.
    ///
    /// # Panics
    /// When the socket cannot be bound, the key cannot be generated or the OpenBao CA is invalid.
    #[must_use]
    pub fn start(self) -> FakeTenancy {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let inner = server.server_addr().to_ip().expect("an ip listener");
        let front = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = front.local_addr().expect("the front listener's address");
        let url = Url::parse(&format!("http://{addr}/")).expect("loopback url");
        let bao = self.bao.map(BaoLookup::new);
        let shared = Arc::new(Shared {
            signer: Signer::generate(url.as_str().trim_end_matches('/')),
            url,
            stop: AtomicBool::new(false),
            state: Mutex::new(State {
                bao,
                limits: self.limits,
                started: Some(Instant::now()),
                ..State::default()
            }),
        });
        let server = Arc::new(server);
        let thread = {
            let server = Arc::clone(&server);
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("fake-tenancy".into())
                .spawn(move || accept_loop(&server, &shared))
                .expect("spawn the fake tenancy thread")
        };
        let front_thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("fake-tenancy-front".into())
                .spawn(move || front_loop(&front, inner, &shared))
                .expect("spawn the fake tenancy front thread")
        };
        FakeTenancy {
            shared,
            server,
            thread: Some(thread),
            front: Some(front_thread),
        }
    }
}

/// A running fake tenancy; dropping it stops the server.
pub struct FakeTenancy {
    shared: Arc<Shared>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    front: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FakeTenancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeTenancy")
            .field("url", &self.shared.url.as_str())
            .finish()
    }
}

impl Drop for FakeTenancy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(front) = self.front.take() {
            // The front blocks in accept; one connection wakes it to see the stop flag.
            let _ = TcpStream::connect(self.addr());
            let _ = front.join();
        }
    }
}

impl FakeTenancy {
    /// Start configuring a fake tenancy.
    pub fn builder() -> FakeTenancyBuilder {
        FakeTenancyBuilder::default()
    }

    /// A client of this fake, with a five-second deadline per call.
    ///
    /// # Panics
    /// Never: the fake's URL is a valid base URL.
    #[must_use]
    pub fn client(&self) -> monky_agent_proto::Client {
        monky_agent_proto::Client::builder(self.url())
            .timeout(Duration::from_secs(5))
            .build()
            .expect("a client of the fake")
    }

    /// Base URL, `http://127.0.0.1:<port>/`.
    #[must_use]
    pub fn url(&self) -> Url {
        self.shared.url.clone()
    }

    /// The `ip:port` the fake listens on.
    ///
    /// # Panics
    /// Never for a started fake (its URL always has an IP and a port).
    #[must_use]
    pub fn addr(&self) -> std::net::SocketAddr {
        let url = &self.shared.url;
        let ip = url
            .host_str()
            .and_then(|h| h.parse().ok())
            .expect("loopback ip");
        std::net::SocketAddr::new(ip, url.port().expect("explicit port"))
    }

    /// `GET /.well-known/agent-jwks.json` on this fake.
    #[must_use]
    pub fn jwks_url(&self) -> Url {
        self.shared
            .url
            .join(".well-known/agent-jwks.json")
            .expect("jwks url")
    }

    /// The `iss` of the grants this fake signs (its base URL without the trailing slash).
    #[must_use]
    pub fn issuer(&self) -> &str {
        &self.shared.signer.issuer
    }

    /// The key id of the signing key (the JWK thumbprint).
    #[must_use]
    pub fn kid(&self) -> &str {
        self.shared.signer.key.kid()
    }

    /// Check bearers against this OpenBao from now on (for when it started after the fake).
    ///
    /// # Panics
    /// When `ca_pem` is not a valid PEM bundle.
    pub fn set_bao(&self, url: Url, ca_pem: Option<Vec<u8>>, root_token: SecretString) {
        let lookup = BaoLookup::new(BaoConfig {
            url,
            ca_pem,
            root_token,
        });
        self.state().bao = Some(lookup);
    }

    /// Sign a deploy grant for `env_id` (as kit reveal does) and record its jti as current.
    #[must_use]
    pub fn mint_grant(&self, env_id: &str) -> SecretString {
        mint(&self.shared, &mut self.state(), env_id).0
    }

    /// Sign arbitrary claims with the fake's key (kid set), e.g. a grant with a wrong `aud`.
    /// Nothing is recorded.
    ///
    /// # Panics
    /// When the claims cannot be signed.
    #[must_use]
    pub fn sign_claims(&self, claims: &Value) -> SecretString {
        self.shared.signer.sign(claims)
    }

    /// A bearer the fake accepts without OpenBao, bound to `env_id` and a freshly minted grant,
    /// as if the agent had logged in with it.
    #[must_use]
    pub fn issue_token(&self, env_id: &str) -> SecretString {
        let mut state = self.state();
        let (_, jti) = mint(&self.shared, &mut state, env_id);
        let token = format!("s.{}", random_base62(24));
        state.local_tokens.insert(
            token.clone(),
            TokenMeta {
                env_id: Some(env_id.to_owned()),
                grant_jti: Some(jti),
            },
        );
        SecretString::from(token)
    }

    /// Supersede every grant of `env_id` (kit re-reveal or retire): tokens minted from them get
    /// 401 `AGENT_UNAUTHENTICATED` from now on.
    pub fn supersede(&self, env_id: &str) {
        for grant in self.state().grants.values_mut() {
            if grant.env_id == env_id {
                grant.superseded = true;
            }
        }
    }

    /// The jtis of `env_id`'s grants that are still current.
    #[must_use]
    pub fn current_grants(&self, env_id: &str) -> Vec<String> {
        let state = self.state();
        let mut jtis: Vec<String> = state
            .grants
            .iter()
            .filter(|(_, g)| g.env_id == env_id && !g.superseded)
            .map(|(jti, _)| jti.clone())
            .collect();
        jtis.sort();
        jtis
    }

    /// Set what checkin answers for `env_id`.
    pub fn set_desired(&self, env_id: &str, desired: Desired) {
        self.state().desired.insert(env_id.to_owned(), desired);
    }

    /// Publish a bundle body under `env_id`/`sha` (served as is; the sha is not recomputed).
    pub fn publish_bundle(&self, env_id: &str, sha: &str, bytes: Vec<u8>) {
        self.state()
            .bundles
            .insert((env_id.to_owned(), sha.to_owned()), bytes);
    }

    /// Inject `fault` at `endpoint` on every request until cleared.
    pub fn set_fault(&self, endpoint: Endpoint, fault: Fault) {
        self.set_fault_times(endpoint, fault, None);
    }

    /// Inject `fault` at `endpoint` for the next `times` requests (`None` = until cleared).
    pub fn set_fault_times(&self, endpoint: Endpoint, fault: Fault, times: Option<u32>) {
        self.state().faults.insert(endpoint, (fault, times));
    }

    /// Remove every injected fault.
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    /// Every request so far, in arrival order of their answers.
    #[must_use]
    pub fn requests(&self) -> Vec<Recorded> {
        self.state().requests.clone()
    }

    /// The reports `env_id` delivered successfully, oldest first.
    #[must_use]
    pub fn reports(&self, env_id: &str) -> Vec<ReportRequest> {
        self.state()
            .reports
            .iter()
            .filter(|r| r.env_id == env_id)
            .cloned()
            .collect()
    }

    /// How many leases `env_id` was granted.
    #[must_use]
    pub fn lease_count(&self, env_id: &str) -> usize {
        self.state().leases.get(env_id).copied().unwrap_or(0)
    }

    /// Replace the rate buckets; all buckets start full again.
    pub fn set_limits(&self, limits: RateLimits) {
        let mut state = self.state();
        state.limits = limits;
        state.buckets.clear();
    }

    /// Move the fake's clock forward (it drives the rate buckets; grants use the wall clock so
    /// that an OpenBao fake with its own clock accepts them).
    pub fn advance_clock(&self, by: Duration) {
        self.state().clock_offset += by;
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }
}

struct Shared {
    url: Url,
    signer: Signer,
    stop: AtomicBool,
    state: Mutex<State>,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Default)]
struct State {
    bao: Option<BaoLookup>,
    local_tokens: HashMap<String, TokenMeta>,
    grants: HashMap<String, Grant>,
    desired: HashMap<String, Desired>,
    bundles: HashMap<(String, String), Vec<u8>>,
    faults: HashMap<Endpoint, (Fault, Option<u32>)>,
    requests: Vec<Recorded>,
    cuts: HashMap<SocketAddr, Cut>,
    reports: Vec<ReportRequest>,
    leases: HashMap<String, usize>,
    limits: RateLimits,
    buckets: HashMap<(String, Endpoint), Bucket>,
    clock_offset: Duration,
    started: Option<Instant>,
}

impl State {
    fn now(&self) -> Duration {
        self.started.map_or(Duration::ZERO, |s| s.elapsed()) + self.clock_offset
    }

    fn take_fault(&mut self, endpoint: Endpoint) -> Option<Fault> {
        let (fault, times) = self.faults.get_mut(&endpoint)?;
        let fault = fault.clone();
        if let Some(left) = times {
            *left = left.saturating_sub(1);
            if *left == 0 {
                self.faults.remove(&endpoint);
            }
        }
        Some(fault)
    }

    /// Take one token from the env's bucket, or say how long until one is there.
    fn take_token(&mut self, env_id: &str, endpoint: Endpoint) -> Result<(), Duration> {
        let Some(rate) = self.limits.for_endpoint(endpoint) else {
            return Ok(());
        };
        let now = self.now();
        let capacity = f64::from(rate.count);
        let per_second = capacity / rate.per.as_secs_f64().max(f64::EPSILON);
        let bucket = self
            .buckets
            .entry((env_id.to_owned(), endpoint))
            .or_insert(Bucket {
                tokens: capacity,
                at: now,
            });
        let elapsed = now.saturating_sub(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        if per_second <= 0.0 {
            return Err(rate.per);
        }
        Err(Duration::from_secs_f64((1.0 - bucket.tokens) / per_second))
    }
}

struct Bucket {
    tokens: f64,
    at: Duration,
}

struct Grant {
    env_id: String,
    superseded: bool,
}

#[derive(Debug, Clone, Default)]
struct TokenMeta {
    env_id: Option<String>,
    grant_jti: Option<String>,
}

#[derive(Debug)]
struct BaoConfig {
    url: Url,
    ca_pem: Option<Vec<u8>>,
    root_token: SecretString,
}

#[derive(Clone)]
struct BaoLookup {
    http: reqwest::blocking::Client,
    url: Url,
    root_token: SecretString,
}

enum Lookup {
    Found(TokenMeta),
    Unknown,
    Unreachable(String),
}

impl BaoLookup {
    fn new(config: BaoConfig) -> Self {
        let mut http = reqwest::blocking::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            // No pooled connections: a stopped OpenBao fake must look unreachable at once
            // rather than leave a lookup waiting on a connection nobody serves any more.
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(10));
        if let Some(pem) = &config.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).expect("a PEM CA bundle");
            http = http.tls_certs_only(certs);
        }
        BaoLookup {
            http: http.build().expect("an http client for OpenBao"),
            url: config.url,
            root_token: config.root_token,
        }
    }

    fn lookup(&self, token: &str) -> Lookup {
        let Ok(url) = self.url.join("v1/auth/token/lookup") else {
            return Lookup::Unreachable("bad openbao url".into());
        };
        let resp = self
            .http
            .post(url)
            .header("X-Vault-Token", self.root_token.expose_secret())
            .json(&json!({ "token": token }))
            .send();
        let resp = match resp {
            Ok(resp) => resp,
            Err(err) => return Lookup::Unreachable(err.without_url().to_string()),
        };
        if resp.status().is_server_error() {
            return Lookup::Unreachable(format!("openbao answered {}", resp.status()));
        }
        if !resp.status().is_success() {
            return Lookup::Unknown;
        }
        let Ok(body) = resp.json::<Value>() else {
            return Lookup::Unknown;
        };
        let meta = &body["data"]["meta"];
        let field = |name: &str| meta.get(name).and_then(Value::as_str).map(str::to_owned);
        Lookup::Found(TokenMeta {
            env_id: field("env_id"),
            grant_jti: field("grant_jti"),
        })
    }
}

/// The fake's grant key and issuer: `monky-agent-proto`'s signer, as tenancy's tooling uses it.
struct Signer {
    key: GrantSigner,
    issuer: String,
}

impl Signer {
    fn generate(issuer: &str) -> Self {
        Signer {
            key: GrantSigner::generate().expect("generate a P-256 key"),
            issuer: issuer.to_owned(),
        }
    }

    fn sign(&self, claims: &Value) -> SecretString {
        self.key.sign_claims(claims).expect("sign claims")
    }
}

fn mint(shared: &Shared, state: &mut State, env_id: &str) -> (SecretString, String) {
    let claims = GrantClaims::new(&shared.signer.issuer, env_id).expect("grant claims");
    let jwt = shared
        .signer
        .key
        .sign(&claims)
        .expect("sign a deploy grant");
    state.grants.insert(
        claims.jti.clone(),
        Grant {
            env_id: env_id.to_owned(),
            superseded: false,
        },
    );
    (jwt, claims.jti)
}

fn random_base62(len: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

fn accept_loop(server: &tiny_http::Server, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match server.recv_timeout(Duration::from_millis(100)) {
            Ok(Some(request)) => {
                let shared = Arc::clone(shared);
                // One thread per request, so a delayed answer does not hold up the others and
                // an OpenBao fake can fetch the JWKS while a bearer lookup is in flight.
                let _ = std::thread::Builder::new()
                    .name("fake-tenancy-request".into())
                    .spawn(move || handle(&shared, request));
            }
            Ok(None) => {}
            Err(_) => break,
        }
    }
}

/// The fake's public listener. Every connection is relayed to the HTTP server behind it, so
/// that a fault can cut a response short or reset the connection part way through a body,
/// which the server library itself cannot do.
fn front_loop(front: &TcpListener, inner: SocketAddr, shared: &Arc<Shared>) {
    for client in front.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = client else { continue };
        let Ok(upstream) = TcpStream::connect(inner) else {
            continue;
        };
        // Without these, small answers wait on delayed ACKs at every hop of the relay.
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (Ok(key), Ok(client_down), Ok(upstream_down)) = (
            upstream.local_addr(),
            client.try_clone(),
            upstream.try_clone(),
        ) else {
            continue;
        };
        let _ = std::thread::Builder::new()
            .name("fake-tenancy-up".into())
            .spawn(move || relay_up(client, upstream));
        let shared = Arc::clone(shared);
        let _ = std::thread::Builder::new()
            .name("fake-tenancy-down".into())
            .spawn(move || relay_down(upstream_down, client_down, key, &shared));
    }
}

/// Client to server, until the client stops sending.
fn relay_up(mut client: TcpStream, mut upstream: TcpStream) {
    let _ = std::io::copy(&mut client, &mut upstream);
    let _ = upstream.shutdown(Shutdown::Write);
}

/// Server to client, applying a cut registered for this connection (keyed by `key`, the
/// relay's end of the inner connection).
fn relay_down(mut upstream: TcpStream, mut client: TcpStream, key: SocketAddr, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut cutting: Option<Cutting> = None;
    loop {
        let n = match upstream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cutting.is_none() {
            cutting = lock(shared).cuts.remove(&key).map(Cutting::new);
        }
        let Some(c) = cutting.as_mut() else {
            if client.write_all(&buf[..n]).is_err() {
                break;
            }
            continue;
        };
        let (forward, done) = c.feed(&buf[..n]);
        let written = client.write_all(&forward).and_then(|()| client.flush());
        if done || written.is_err() {
            if c.cut.reset {
                // Linger 0 makes the last close send RST instead of FIN; shutting down the
                // read side wakes the other relay thread so that it lets go of its handle
                // without sending anything.
                let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
                let _ = client.shutdown(Shutdown::Read);
            } else {
                let _ = client.shutdown(Shutdown::Both);
            }
            let _ = upstream.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = client.shutdown(Shutdown::Write);
}

/// Where to stop a response: after `keep` body bytes, with a close or a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cut {
    keep: usize,
    reset: bool,
}

/// A cut in progress: the response head is held back until it is complete, then the body is
/// counted down.
#[derive(Debug)]
struct Cutting {
    cut: Cut,
    head: Vec<u8>,
    body_left: Option<usize>,
}

impl Cutting {
    fn new(cut: Cut) -> Self {
        Cutting {
            cut,
            head: Vec::new(),
            body_left: None,
        }
    }

    /// Takes the next bytes from the server; returns what to pass on and whether the cut
    /// point has been reached.
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, bool) {
        if let Some(left) = self.body_left {
            let take = bytes.len().min(left);
            self.body_left = Some(left - take);
            return (bytes[..take].to_vec(), left == take);
        }
        self.head.extend_from_slice(bytes);
        let Some(end) = self.head.windows(4).position(|w| w == b"\r\n\r\n") else {
            return (Vec::new(), false);
        };
        let head_len = end + 4;
        let take = (self.head.len() - head_len).min(self.cut.keep);
        let left = self.cut.keep - take;
        self.body_left = Some(left);
        (self.head[..head_len + take].to_vec(), left == 0)
    }
}

enum Reply {
    Json {
        status: u16,
        body: Value,
        retry_after: Option<u64>,
    },
    Raw {
        status: u16,
        body: Vec<u8>,
        headers: Vec<(&'static str, String)>,
    },
    Drop,
    /// Filler of this length, generated while sending.
    Large {
        len: u64,
        chunked: bool,
    },
    /// The reply, cut short by the front relay.
    Cut {
        reply: Box<Reply>,
        cut: Cut,
    },
}

impl Reply {
    fn error(status: u16, code: &str, detail: impl Into<String>) -> Self {
        Reply::Json {
            status,
            body: json!({ "code": code, "detail": detail.into() }),
            retry_after: None,
        }
    }

    fn ok(body: Value) -> Self {
        Reply::Json {
            status: 200,
            body,
            retry_after: None,
        }
    }

    fn status(&self) -> Option<u16> {
        match self {
            Reply::Json { status, .. } | Reply::Raw { status, .. } => Some(*status),
            Reply::Large { .. } => Some(200),
            Reply::Cut { reply, .. } => reply.status(),
            Reply::Drop => None,
        }
    }
}

struct Incoming {
    method: String,
    path: String,
    endpoint: Option<Endpoint>,
    path_env: Option<(String, String)>,
    bearer: Option<String>,
    host: Option<String>,
    raw_body: Vec<u8>,
    body: Option<Value>,
}

impl Incoming {
    fn env_id(&self) -> Option<String> {
        match &self.path_env {
            Some((env, _)) => Some(env.clone()),
            None => self
                .body
                .as_ref()?
                .get("env_id")?
                .as_str()
                .map(str::to_owned),
        }
    }
}

fn handle(shared: &Arc<Shared>, mut request: tiny_http::Request) {
    let at = Instant::now();
    let header = |name: &str| {
        request
            .headers()
            .iter()
            .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str().to_owned())
    };
    let bearer = header("Authorization")
        .and_then(|v| v.strip_prefix("Bearer ").map(|t| t.trim().to_owned()))
        .filter(|t| !t.is_empty());
    let host = header("Host");
    let method = request.method().as_str().to_owned();
    let path = request.url().to_owned();
    let mut raw_body = Vec::new();
    let _ = request
        .as_reader()
        .take(MAX_REQUEST_BYTES)
        .read_to_end(&mut raw_body);
    let body = serde_json::from_slice::<Value>(&raw_body).ok();
    let (endpoint, path_env) = route(&method, &path);
    let incoming = Incoming {
        method,
        path,
        endpoint,
        path_env,
        bearer,
        host,
        raw_body,
        body,
    };

    let reply = answer(shared, &incoming);
    let recorded = Recorded {
        method: incoming.method.clone(),
        path: incoming.path.clone(),
        endpoint: incoming.endpoint,
        env_id: incoming.env_id(),
        had_bearer: incoming.bearer.is_some(),
        host: incoming.host.clone(),
        status: reply.status(),
        body: incoming.body.clone(),
        at,
    };
    lock(shared).requests.push(recorded);
    send(shared, request, reply);
}

fn route(method: &str, path: &str) -> (Option<Endpoint>, Option<(String, String)>) {
    let path = path.split('?').next().unwrap_or_default();
    match (method, path) {
        ("POST", "/v1/agent/checkin") => (Some(Endpoint::Checkin), None),
        ("POST", "/v1/agent/lease") => (Some(Endpoint::Lease), None),
        ("POST", "/v1/agent/report") => (Some(Endpoint::Report), None),
        ("GET", "/.well-known/agent-jwks.json") => (Some(Endpoint::Jwks), None),
        ("GET", _) => {
            let rest = path.strip_prefix("/v1/agent/bundle/");
            match rest.map(|r| r.split('/').collect::<Vec<_>>()).as_deref() {
                Some([env, sha]) if !env.is_empty() && !sha.is_empty() => (
                    Some(Endpoint::Bundle),
                    Some(((*env).to_owned(), (*sha).to_owned())),
                ),
                _ => (None, None),
            }
        }
        _ => (None, None),
    }
}

fn answer(shared: &Arc<Shared>, incoming: &Incoming) -> Reply {
    let Some(endpoint) = incoming.endpoint else {
        return Reply::error(
            404,
            "NOT_FOUND",
            format!("no route {} {}", incoming.method, incoming.path),
        );
    };
    let fault = lock(shared).take_fault(endpoint);
    if let Some(fault) = fault {
        let cut = match fault {
            Fault::Truncate { keep } => Some(Cut { keep, reset: false }),
            Fault::Reset { keep } => Some(Cut { keep, reset: true }),
            _ => None,
        };
        if let Some(cut) = cut {
            return Reply::Cut {
                reply: Box::new(answer_unfaulted(shared, incoming, endpoint)),
                cut,
            };
        }
        match fault {
            Fault::Delay(delay) => sleep_unless_stopped(shared, delay),
            Fault::Status { status, body } => {
                return match serde_json::from_str::<Value>(&body) {
                    Ok(json) => Reply::Json {
                        status,
                        body: json,
                        retry_after: None,
                    },
                    Err(_) => Reply::Raw {
                        status,
                        body: body.into_bytes(),
                        headers: vec![("Content-Type", "text/plain".into())],
                    },
                };
            }
            Fault::DropConnection => return Reply::Drop,
            Fault::Garbage => {
                return Reply::Raw {
                    status: 200,
                    body: b"<html><body><h1>Welcome to the proxy</h1></body></html>".to_vec(),
                    headers: vec![("Content-Type", "text/html".into())],
                };
            }
            Fault::RetryAfter(secs) => return rate_limited(endpoint, secs),
            Fault::AppRoleLease => {
                return Reply::ok(json!({
                    "env_id": incoming.env_id(),
                    "wrapping_token": format!("s.{}", random_base62(24)),
                    "role_id": "3c6e0b8a-9c15-4b1d-8f2e-5a7d1c9e0f42",
                    "ttl_s": 60,
                }));
            }
            Fault::LargeBody { len, chunked } => return Reply::Large { len, chunked },
            Fault::Truncate { .. } | Fault::Reset { .. } => {}
        }
    }
    answer_unfaulted(shared, incoming, endpoint)
}

/// Tenancy's own handling of a request, once no fault took it over.
fn answer_unfaulted(shared: &Arc<Shared>, incoming: &Incoming, endpoint: Endpoint) -> Reply {
    if endpoint == Endpoint::Jwks {
        return Reply::ok(shared.signer.key.jwks().clone());
    }

    let Some(bearer) = incoming.bearer.as_deref() else {
        return Reply::error(401, "AGENT_UNAUTHENTICATED", "missing bearer token");
    };
    let Some(env_id) = incoming.env_id() else {
        return Reply::error(422, "REQUEST_INVALID", "env_id is required");
    };
    let meta = match verify(shared, bearer) {
        Ok(meta) => meta,
        Err(reply) => return reply,
    };
    if meta.env_id.as_deref() != Some(env_id.as_str()) {
        return Reply::error(
            403,
            "AGENT_ENV_MISMATCH",
            "the token belongs to another environment",
        );
    }
    {
        let mut state = lock(shared);
        let current = meta
            .grant_jti
            .as_deref()
            .and_then(|jti| state.grants.get(jti))
            .is_some_and(|g| g.env_id == env_id && !g.superseded);
        if !current {
            return Reply::error(
                401,
                "AGENT_UNAUTHENTICATED",
                "the token's grant was superseded or revoked",
            );
        }
        if let Err(wait) = state.take_token(&env_id, endpoint) {
            return rate_limited(endpoint, wait.as_secs_f64().ceil().max(1.0) as u64);
        }
    }
    match endpoint {
        Endpoint::Checkin => checkin(shared, incoming, &env_id),
        Endpoint::Bundle => bundle(shared, incoming),
        Endpoint::Lease => lease(shared, incoming, &env_id),
        Endpoint::Report => report(shared, incoming),
        Endpoint::Jwks => Reply::ok(shared.signer.key.jwks().clone()),
    }
}

fn verify(shared: &Shared, bearer: &str) -> Result<TokenMeta, Reply> {
    let (local, bao) = {
        let state = lock(shared);
        (state.local_tokens.get(bearer).cloned(), state.bao.clone())
    };
    if let Some(meta) = local {
        return Ok(meta);
    }
    let unknown = || Reply::error(401, "AGENT_UNAUTHENTICATED", "unknown or revoked token");
    let Some(bao) = bao else {
        return Err(unknown());
    };
    match bao.lookup(bearer) {
        Lookup::Found(meta) => Ok(meta),
        Lookup::Unknown => Err(unknown()),
        Lookup::Unreachable(why) => Err(Reply::error(
            503,
            "OPENBAO_UNAVAILABLE",
            format!("token lookup failed: {why}"),
        )),
    }
}

fn rate_limited(endpoint: Endpoint, secs: u64) -> Reply {
    let code = if endpoint == Endpoint::Lease {
        "LEASE_RATE_LIMITED"
    } else {
        "RATE_LIMITED"
    };
    Reply::Json {
        status: 429,
        body: json!({ "code": code, "detail": format!("rate limit reached; retry in {secs} s") }),
        retry_after: Some(secs),
    }
}

fn parse<T: serde::de::DeserializeOwned>(incoming: &Incoming) -> Result<T, Reply> {
    serde_json::from_slice(&incoming.raw_body)
        .map_err(|err| Reply::error(422, "REQUEST_INVALID", err.to_string()))
}

fn checkin(shared: &Shared, incoming: &Incoming, env_id: &str) -> Reply {
    let req: CheckinRequest = match parse(incoming) {
        Ok(req) => req,
        Err(reply) => return reply,
    };
    let state = lock(shared);
    let desired = state.desired.get(env_id).cloned().unwrap_or_default();
    let action = desired.action.unwrap_or(match &desired.sha {
        Some(sha) if req.applied_sha.as_ref().map(|s| s.as_str()) != Some(sha.as_str()) => {
            ActionKind::Apply
        }
        _ => ActionKind::None,
    });
    let addr = state.bao.as_ref().map_or(DEFAULT_BAO_ADDR.to_owned(), |b| {
        b.url.as_str().trim_end_matches('/').to_owned()
    });
    let vault = desired.vault.unwrap_or_else(|| VaultInfo {
        addr: Some(addr),
        mount: Some("monky".into()),
        prefix: Some(format!("{env_id}/see")),
        auth_mount: Some(AUTH_MOUNT.into()),
        auth_role: Some(AUTH_ROLE.into()),
    });
    let resp = CheckinAnswer {
        env_id: env_id.to_owned(),
        bundle_url: desired
            .sha
            .as_ref()
            .map(|sha| monky_agent_proto::wire::bundle_path(env_id, sha)),
        desired_sha: None,
        action,
        purge_volumes: desired.purge_volumes,
        checkin_interval_s: None,
        vault: Some(vault),
    };
    let mut body = serde_json::to_value(resp).unwrap_or(Value::Null);
    // The sha and the interval go out as set, unchecked and unclamped, so a test can play a
    // tenancy that sends a bad one.
    body["desired_sha"] = desired.sha.map_or(Value::Null, Value::String);
    body["checkin_interval_s"] = json!(desired.checkin_interval_s.unwrap_or(60));
    Reply::ok(body)
}

fn bundle(shared: &Shared, incoming: &Incoming) -> Reply {
    let Some((env_id, sha)) = incoming.path_env.clone() else {
        return Reply::error(404, "BUNDLE_NOT_FOUND", "no such bundle");
    };
    let Some(bytes) = lock(shared)
        .bundles
        .get(&(env_id.clone(), sha.clone()))
        .cloned()
    else {
        return Reply::error(
            404,
            "BUNDLE_NOT_FOUND",
            format!("bundle {sha} is not published for {env_id}"),
        );
    };
    Reply::Raw {
        status: 200,
        body: bytes,
        headers: vec![
            ("Content-Type", "application/x-tar".into()),
            ("Cache-Control", "no-store".into()),
            ("X-Bundle-Sha", sha.clone()),
            ("X-Bundle-Sha256", sha),
        ],
    }
}

fn lease(shared: &Shared, incoming: &Incoming, env_id: &str) -> Reply {
    if let Err(reply) = parse::<LeaseRequest>(incoming) {
        return reply;
    }
    let mut state = lock(shared);
    let (login_jwt, _) = mint(shared, &mut state, env_id);
    *state.leases.entry(env_id.to_owned()).or_default() += 1;
    let addr = state
        .bao
        .as_ref()
        .map(|b| b.url.as_str().trim_end_matches('/').to_owned());
    let resp = LeaseResponse {
        env_id: env_id.to_owned(),
        login_jwt,
        ttl_s: GRANT_TTL.as_secs(),
        mount: AUTH_MOUNT.into(),
        role: AUTH_ROLE.into(),
        addr,
    };
    Reply::ok(serde_json::to_value(resp).unwrap_or(Value::Null))
}

fn report(shared: &Shared, incoming: &Incoming) -> Reply {
    let req: ReportRequest = match parse(incoming) {
        Ok(req) => req,
        Err(reply) => return reply,
    };
    lock(shared).reports.push(req);
    Reply::ok(json!({ "ok": true }))
}

fn sleep_unless_stopped(shared: &Shared, total: Duration) {
    let until = Instant::now() + total;
    while !shared.stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

fn send(shared: &Shared, request: tiny_http::Request, reply: Reply) {
    let header = |name: &str, value: &str| {
        tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("a valid header")
    };
    let result = match reply {
        Reply::Json {
            status,
            body,
            retry_after,
        } => {
            let mut response = tiny_http::Response::from_data(body.to_string().into_bytes())
                .with_status_code(status)
                .with_header(header("Content-Type", "application/json"));
            if let Some(secs) = retry_after {
                response.add_header(header("Retry-After", &secs.to_string()));
            }
            request.respond(response)
        }
        Reply::Raw {
            status,
            body,
            headers,
        } => {
            let mut response = tiny_http::Response::new(
                tiny_http::StatusCode(status),
                Vec::new(),
                Cursor::new(body.clone()),
                Some(body.len()),
                None,
            );
            for (name, value) in headers {
                response.add_header(header(name, &value));
            }
            request.respond(response)
        }
        Reply::Large { len, chunked } => {
            let length = (!chunked).then(|| usize::try_from(len).unwrap_or(usize::MAX));
            let response = tiny_http::Response::new(
                tiny_http::StatusCode(200),
                vec![header("Content-Type", "application/x-tar")],
                std::io::repeat(b'#').take(len),
                length,
                None,
            );
            request.respond(response)
        }
        Reply::Cut { reply, cut } => {
            // The relay that carries this connection finds the cut under the address the
            // server sees as the client: the relay's own end of the inner connection.
            if let Some(peer) = request.remote_addr().copied() {
                lock(shared).cuts.insert(peer, cut);
            }
            return send(shared, request, *reply);
        }
        Reply::Drop => {
            let mut writer = request.into_writer();
            writer
                .write_all(b"\x00\x00 connection reset by the mesh\r\n\r\n")
                .and_then(|()| writer.flush())
        }
    };
    let _ = result;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let check = |method: &str, path: &str, expected: Option<Endpoint>| {
            assert_eq!(route(method, path).0, expected, "{method} {path}");
        };
        check("POST", "/v1/agent/checkin", Some(Endpoint::Checkin));
        check("GET", "/v1/agent/checkin", None);
        check("POST", "/v1/agent/lease?x=1", Some(Endpoint::Lease));
        check("POST", "/v1/agent/report", Some(Endpoint::Report));
        check("GET", "/v1/agent/bundle/env-a/abc", Some(Endpoint::Bundle));
        check("GET", "/v1/agent/bundle/env-a/abc/extra", None);
        check("GET", "/v1/agent/bundle/env-a/", None);
        check("GET", "/.well-known/agent-jwks.json", Some(Endpoint::Jwks));
        assert_eq!(
            route("GET", "/v1/agent/bundle/env-a/abc").1,
            Some(("env-a".to_owned(), "abc".to_owned()))
        );
    }

    #[test]
    fn a_cut_passes_the_head_and_counts_down_the_body() {
        let check = |chunks: &[&[u8]], keep: usize, expected: &[u8], done_after: Option<usize>| {
            let mut c = Cutting::new(Cut { keep, reset: false });
            let mut out = Vec::new();
            let mut done_at = None;
            for (i, chunk) in chunks.iter().enumerate() {
                let (bytes, done) = c.feed(chunk);
                out.extend_from_slice(&bytes);
                if done {
                    done_at = Some(i);
                    break;
                }
            }
            assert_eq!(out, expected, "{chunks:?} keep {keep}");
            assert_eq!(done_at, done_after, "{chunks:?} keep {keep}");
        };
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n";
        let whole = [&head[..], b"0123456789"].concat();
        check(&[&whole], 4, &[&head[..], b"0123"].concat(), Some(0));
        // The head split across reads is held back until it is complete.
        check(
            &[
                &whole[..5],
                &whole[5..head.len() + 2],
                &whole[head.len() + 2..],
            ],
            3,
            &[&head[..], b"012"].concat(),
            Some(2),
        );
        // keep 0: only the head.
        check(&[&whole], 0, head, Some(0));
        // keep beyond the body: everything passes and the cut never fires.
        check(&[&whole], 99, &whole, None);
    }

    #[test]
    fn token_bucket_refills_on_the_fake_clock() {
        let mut state = State {
            limits: RateLimits {
                checkin: Rate::per_minute(2),
                ..RateLimits::default()
            },
            ..State::default()
        };
        assert_eq!(state.take_token("e", Endpoint::Checkin), Ok(()));
        assert_eq!(state.take_token("e", Endpoint::Checkin), Ok(()));
        let wait = state.take_token("e", Endpoint::Checkin).unwrap_err();
        assert_eq!(wait.as_secs_f64().round() as u64, 30);
        // Another env has its own bucket, another endpoint too.
        assert_eq!(state.take_token("f", Endpoint::Checkin), Ok(()));
        assert_eq!(state.take_token("e", Endpoint::Report), Ok(()));
        state.clock_offset += Duration::from_secs(30);
        assert_eq!(state.take_token("e", Endpoint::Checkin), Ok(()));
        assert!(state.take_token("e", Endpoint::Checkin).is_err());
    }

    #[test]
    fn zero_rate_always_limits() {
        let mut state = State {
            limits: RateLimits {
                lease: Rate::per_hour(0),
                ..RateLimits::default()
            },
            ..State::default()
        };
        assert_eq!(
            state.take_token("e", Endpoint::Lease),
            Err(Duration::from_secs(3600))
        );
    }
}
