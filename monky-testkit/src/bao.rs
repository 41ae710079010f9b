//! A loopback fake OpenBao for tests and the demo: the `jwt-tenancy`/`see-env` login, token
//! upkeep, KV v2 with versions, OpenBao's response and error shapes, a settable clock, a request
//! log and injectable faults.
//!
//! The fake binds `127.0.0.1:0` only, optionally serves TLS with a given certificate and key,
//! and stops when dropped. Logins fetch the JWKS from the configured URL (cached, refetched on
//! an unknown `kid`) and really verify the ES256 signature; then, like the role of the
//! deployment, they check `aud`, `exp` (60 s leeway against the fake's clock), the bound claim
//! `kind = deploy-grant` and the user claim `env_id`, and map `env_id` and `jti` into the token's
//! metadata (`grant_jti`). There is no jti replay state, as in OpenBao.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rand::Rng;
use rand::distr::Alphanumeric;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value, json};
use url::Url;

mod tls_front;
use tls_front::TlsFront;

/// The leeway on `exp` and `nbf`, as configured on the deployment's role.
const CLOCK_LEEWAY_SECS: i64 = 60;

mod real;

pub use real::{CallError, RealBao, RealBaoBuilder, real_skipped, see_env_policy, see_env_role};

/// What a test or the demo needs from an OpenBao peer, real ([`RealBao`]) or fake
/// ([`FakeBao`]): its address and root token, KV writes, seal, and an operator's revocation.
/// Suites written against it run unchanged against both.
pub trait BaoPeer {
    /// `"fake"` or `"real"`, for messages.
    fn kind(&self) -> &'static str;
    /// The base URL.
    fn url(&self) -> Url;
    /// The listening address.
    fn addr(&self) -> SocketAddr;
    /// The root token: may read every path and look up other tokens.
    fn root_token(&self) -> SecretString;
    /// Stores a new version of `monky/data/<env>/see/<name>` holding `{"value": value}`;
    /// returns the version number.
    fn put_secret(&self, env_id: &str, name: &str, value: &str) -> u64;
    /// Stores a new version holding an arbitrary document; returns the version number.
    fn put_document(&self, env_id: &str, name: &str, document: Value) -> u64;
    /// Soft-deletes a version; returns whether the server took the request.
    fn delete_version(&self, env_id: &str, name: &str, version: u64) -> bool;
    /// Destroys a version for good; returns whether the server took the request.
    fn destroy_version(&self, env_id: &str, name: &str, version: u64) -> bool;
    /// Seals the server: every call answers 503 until [`BaoPeer::unseal`].
    fn seal(&self);
    /// Unseals the server.
    fn unseal(&self);
    /// Revokes every token minted for `env_id`, as an operator would; returns how many.
    fn revoke_tokens_for_env(&self, env_id: &str) -> usize;
    /// How many live tokens exist for `env_id`.
    fn live_tokens_for_env(&self, env_id: &str) -> usize;
    /// Sets the role's `token_ttl` for logins and renewals from now on.
    fn set_token_ttl(&self, ttl: Duration);
}

/// A boxed peer is a peer, so one suite can hold either server behind the trait.
impl<P: BaoPeer + ?Sized> BaoPeer for Box<P> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn url(&self) -> Url {
        (**self).url()
    }
    fn addr(&self) -> SocketAddr {
        (**self).addr()
    }
    fn root_token(&self) -> SecretString {
        (**self).root_token()
    }
    fn put_secret(&self, env_id: &str, name: &str, value: &str) -> u64 {
        (**self).put_secret(env_id, name, value)
    }
    fn put_document(&self, env_id: &str, name: &str, document: Value) -> u64 {
        (**self).put_document(env_id, name, document)
    }
    fn delete_version(&self, env_id: &str, name: &str, version: u64) -> bool {
        (**self).delete_version(env_id, name, version)
    }
    fn destroy_version(&self, env_id: &str, name: &str, version: u64) -> bool {
        (**self).destroy_version(env_id, name, version)
    }
    fn seal(&self) {
        (**self).seal();
    }
    fn unseal(&self) {
        (**self).unseal();
    }
    fn revoke_tokens_for_env(&self, env_id: &str) -> usize {
        (**self).revoke_tokens_for_env(env_id)
    }
    fn live_tokens_for_env(&self, env_id: &str) -> usize {
        (**self).live_tokens_for_env(env_id)
    }
    fn set_token_ttl(&self, ttl: Duration) {
        (**self).set_token_ttl(ttl);
    }
}

/// The largest request body the fake reads.
const MAX_BODY: u64 = 1024 * 1024;

/// OpenBao's answer for a token it does not know (expired, revoked, never issued).
const DENIED: &str = "permission denied";

/// OpenBao's answer when a valid token's policy does not cover the path.
const ACL_DENIED: &str = "1 error occurred:\n\t* permission denied\n\n";

/// A fault injected for every request whose path starts with a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this status and body (sent as `application/json`, whatever it holds).
    Status {
        /// The HTTP status.
        status: u16,
        /// The body, verbatim.
        body: String,
    },
    /// Answer 503 `{"errors":["Vault is sealed"]}`.
    Sealed,
    /// Wait this long, then answer normally.
    Delay(Duration),
}

/// One request the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaoRequest {
    /// The HTTP method.
    pub method: String,
    /// The URL path, e.g. `/v1/auth/token/lookup-self`.
    pub path: String,
    /// The query string, if any (`version=2`).
    pub query: Option<String>,
    /// Whether the request carried the fake's root token.
    pub by_root: bool,
}

/// Configures a [`FakeBao`]; start with [`FakeBao::builder`].
#[derive(Debug)]
#[must_use]
pub struct FakeBaoBuilder {
    jwks_url: Option<Url>,
    tls: Option<(Vec<u8>, Vec<u8>)>,
    kv_mount: String,
    auth_mount: String,
    role: String,
    audience: String,
    policy: String,
    token_ttl: Duration,
    token_max_ttl: Duration,
    revoke_self_allowed: bool,
}

impl FakeBaoBuilder {
    /// Where logins fetch the grant issuer's JWKS (tenancy's `/.well-known/agent-jwks.json`).
    /// Without it every login fails with `could not load configuration`.
    pub fn jwks_url(mut self, url: Url) -> Self {
        self.jwks_url = Some(url);
        self
    }

    /// Serve HTTPS with this certificate chain and PKCS#8 key (PEM).
    pub fn tls(mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Self {
        self.tls = Some((cert_pem, key_pem));
        self
    }

    /// The KV v2 mount (default `monky`).
    pub fn kv_mount(mut self, mount: &str) -> Self {
        mount.clone_into(&mut self.kv_mount);
        self
    }

    /// The JWT auth mount (default `jwt-tenancy`).
    pub fn auth_mount(mut self, mount: &str) -> Self {
        mount.clone_into(&mut self.auth_mount);
        self
    }

    /// The JWT role (default `see-env`).
    pub fn role(mut self, role: &str) -> Self {
        role.clone_into(&mut self.role);
        self
    }

    /// The role's token TTL (default 24 h).
    pub fn token_ttl(mut self, ttl: Duration) -> Self {
        self.token_ttl = ttl;
        self
    }

    /// The role's token max TTL (default 30 days).
    pub fn token_max_ttl(mut self, ttl: Duration) -> Self {
        self.token_max_ttl = ttl;
        self
    }

    /// Whether the agent's policy allows `auth/token/revoke-self` (default `false`, as the
    /// deployment's `see-env` policy: it names only `lookup-self` and `renew-self`, and the
    /// role sets `token_no_default_policy`, so OpenBao denies it with the ACL form).
    pub fn revoke_self_allowed(mut self, allowed: bool) -> Self {
        self.revoke_self_allowed = allowed;
        self
    }

    /// Binds `127.0.0.1:0` and starts serving on a thread.
    ///
    /// # Panics
    ///
    /// If the port cannot be bound or the TLS material is unusable: this is test support.
    pub fn start(self) -> FakeBao {
        let server = tiny_http::Server::http("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("fake openbao: cannot bind: {e}"));
        let plain = server
            .server_addr()
            .to_ip()
            .expect("fake openbao listens on an ip address");
        let tls = self.tls.as_ref().map(|(cert, key)| {
            TlsFront::start(cert, key, plain)
                .unwrap_or_else(|e| panic!("fake openbao: cannot serve https: {e}"))
        });
        let (addr, scheme) = match &tls {
            Some(front) => (front.addr(), "https"),
            None => (plain, "http"),
        };
        let url = Url::parse(&format!("{scheme}://{addr}/")).expect("loopback url");
        let jwks_http = reqwest::blocking::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .expect("jwks http client");
        let root_token = service_token();
        let shared = Arc::new(Shared {
            config: Config {
                jwks_url: self.jwks_url,
                kv_mount: self.kv_mount,
                auth_mount: self.auth_mount,
                role: self.role,
                audience: self.audience,
                policy: self.policy,
                token_ttl: AtomicU64::new(self.token_ttl.as_secs()),
                token_max_ttl: self.token_max_ttl.as_secs(),
                revoke_self_allowed: self.revoke_self_allowed,
                root_token: root_token.clone(),
            },
            state: Mutex::new(State::new(&root_token)),
            jwks: Mutex::new(None),
            jwks_fetches: AtomicUsize::new(0),
            jwks_http,
        });
        let server = Arc::new(server);
        let accept = {
            let server = Arc::clone(&server);
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("fake-openbao".into())
                .spawn(move || {
                    for request in server.incoming_requests() {
                        let shared = Arc::clone(&shared);
                        // One thread per request, so a delayed answer does not hold up others.
                        std::thread::spawn(move || handle(&shared, request));
                    }
                })
                .expect("spawn fake openbao thread")
        };
        FakeBao {
            shared,
            server,
            tls,
            accept: Some(accept),
            url,
            addr,
        }
    }
}

/// A running fake OpenBao; dropping it stops the server.
pub struct FakeBao {
    shared: Arc<Shared>,
    server: Arc<tiny_http::Server>,
    /// The TLS listener in front of `server`, when the fake serves https.
    tls: Option<TlsFront>,
    accept: Option<JoinHandle<()>>,
    url: Url,
    addr: SocketAddr,
}

impl std::fmt::Debug for FakeBao {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBao")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Drop for FakeBao {
    fn drop(&mut self) {
        drop(self.tls.take());
        self.server.unblock();
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

impl FakeBao {
    /// A builder with the deployment's settings: KV mount `monky`, auth mount `jwt-tenancy`,
    /// role `see-env` (audience `openbao-see-env`, policy `see-env`), token TTL 24 h, max 30 d.
    pub fn builder() -> FakeBaoBuilder {
        FakeBaoBuilder {
            jwks_url: None,
            tls: None,
            kv_mount: "monky".into(),
            auth_mount: "jwt-tenancy".into(),
            role: "see-env".into(),
            audience: "openbao-see-env".into(),
            policy: "see-env".into(),
            token_ttl: Duration::from_secs(24 * 3600),
            token_max_ttl: Duration::from_secs(30 * 24 * 3600),
            revoke_self_allowed: false,
        }
    }

    /// The base URL, `http(s)://127.0.0.1:<port>/`.
    pub fn url(&self) -> Url {
        self.url.clone()
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The root token: may read every path and look up other tokens.
    pub fn root_token(&self) -> SecretString {
        SecretString::from(self.shared.config.root_token.clone())
    }

    /// Stores a new version of `<kv>/data/<env>/see/<name>` holding `{"value": value}`; returns
    /// the version number.
    pub fn put_secret(&self, env_id: &str, name: &str, value: &str) -> u64 {
        self.put_document(env_id, name, json!({ "value": value }))
    }

    /// Stores a new version holding an arbitrary document; returns the version number.
    pub fn put_document(&self, env_id: &str, name: &str, document: Value) -> u64 {
        let mut state = self.shared.lock();
        let created = state.now();
        let versions = state.kv.entry(kv_key(env_id, name)).or_default();
        versions.push(KvVersion {
            document,
            created,
            deleted: None,
            destroyed: false,
        });
        versions.len() as u64
    }

    /// Soft-deletes a version (readable again after an undelete in OpenBao; here, never).
    /// Returns whether the version existed.
    pub fn delete_version(&self, env_id: &str, name: &str, version: u64) -> bool {
        let mut state = self.shared.lock();
        let now = state.now();
        match state.version_mut(env_id, name, version) {
            Some(v) => {
                v.deleted.get_or_insert(now);
                true
            }
            None => false,
        }
    }

    /// Destroys a version for good. Returns whether the version existed.
    pub fn destroy_version(&self, env_id: &str, name: &str, version: u64) -> bool {
        let mut state = self.shared.lock();
        match state.version_mut(env_id, name, version) {
            Some(v) => {
                v.destroyed = true;
                v.document = Value::Null;
                true
            }
            None => false,
        }
    }

    /// Moves the fake's clock forward (token expiry, grant `exp`, timestamps).
    pub fn advance_clock(&self, by: Duration) {
        self.shared.lock().clock_offset += by;
    }

    /// The fake's current time.
    pub fn now(&self) -> SystemTime {
        self.shared.lock().now()
    }

    /// Revokes every token minted for `env_id`; returns how many there were.
    pub fn revoke_tokens_for_env(&self, env_id: &str) -> usize {
        let mut state = self.shared.lock();
        let before = state.tokens.len();
        state
            .tokens
            .retain(|_, t| t.env_id.as_deref() != Some(env_id));
        before - state.tokens.len()
    }

    /// How many unexpired tokens exist for `env_id`.
    pub fn live_tokens_for_env(&self, env_id: &str) -> usize {
        let state = self.shared.lock();
        let now = state.now();
        state
            .tokens
            .values()
            .filter(|t| t.env_id.as_deref() == Some(env_id) && t.is_live(now))
            .count()
    }

    /// Adds a token as if `env_id` had logged in with a grant whose `jti` was `grant_jti`; for
    /// tests of other token shapes (`hvs.…`).
    pub fn insert_token(&self, token: &SecretString, env_id: &str, grant_jti: &str) {
        let mut state = self.shared.lock();
        let entry = state.new_agent_token(&self.shared.config, env_id, Some(grant_jti));
        state.tokens.insert(token.expose_secret().to_owned(), entry);
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<BaoRequest> {
        self.shared.lock().requests.clone()
    }

    /// The requests not made with the root token (the agent's, and tenancy's logins if any).
    pub fn agent_requests(&self) -> Vec<BaoRequest> {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| !r.by_root)
            .cloned()
            .collect()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// Injects `fault` for every request whose path (below `/v1/`, with or without that
    /// prefix) starts with `path_prefix`. The first matching fault wins; faults stay until
    /// [`FakeBao::clear_faults`].
    pub fn set_fault(&self, path_prefix: &str, fault: Fault) {
        let prefix = relative(path_prefix).to_owned();
        self.shared.lock().faults.push((prefix, fault));
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    /// Seals the fake: every call outside `sys/` answers 503 until [`FakeBao::unseal`]. Tokens
    /// and secrets survive, as on a real server.
    pub fn seal(&self) {
        self.shared.lock().sealed = true;
    }

    /// Unseals the fake.
    pub fn unseal(&self) {
        self.shared.lock().sealed = false;
    }

    /// Sets the role's token TTL for logins and renewals from now on.
    pub fn set_token_ttl(&self, ttl: Duration) {
        self.shared
            .config
            .token_ttl
            .store(ttl.as_secs(), Ordering::SeqCst);
    }

    /// How many times the JWKS was fetched (once, then on each unknown `kid`).
    pub fn jwks_fetches(&self) -> usize {
        self.shared.jwks_fetches.load(Ordering::SeqCst)
    }
}

impl BaoPeer for FakeBao {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn url(&self) -> Url {
        FakeBao::url(self)
    }

    fn addr(&self) -> SocketAddr {
        FakeBao::addr(self)
    }

    fn root_token(&self) -> SecretString {
        FakeBao::root_token(self)
    }

    fn put_secret(&self, env_id: &str, name: &str, value: &str) -> u64 {
        FakeBao::put_secret(self, env_id, name, value)
    }

    fn put_document(&self, env_id: &str, name: &str, document: Value) -> u64 {
        FakeBao::put_document(self, env_id, name, document)
    }

    fn delete_version(&self, env_id: &str, name: &str, version: u64) -> bool {
        FakeBao::delete_version(self, env_id, name, version)
    }

    fn destroy_version(&self, env_id: &str, name: &str, version: u64) -> bool {
        FakeBao::destroy_version(self, env_id, name, version)
    }

    fn seal(&self) {
        FakeBao::seal(self);
    }

    fn unseal(&self) {
        FakeBao::unseal(self);
    }

    fn revoke_tokens_for_env(&self, env_id: &str) -> usize {
        FakeBao::revoke_tokens_for_env(self, env_id)
    }

    fn live_tokens_for_env(&self, env_id: &str) -> usize {
        FakeBao::live_tokens_for_env(self, env_id)
    }

    fn set_token_ttl(&self, ttl: Duration) {
        FakeBao::set_token_ttl(self, ttl);
    }
}

struct Config {
    jwks_url: Option<Url>,
    kv_mount: String,
    auth_mount: String,
    role: String,
    audience: String,
    policy: String,
    /// Settable while running, as a role rewrite is on a real server.
    token_ttl: AtomicU64,
    token_max_ttl: u64,
    revoke_self_allowed: bool,
    root_token: String,
}

impl Config {
    fn token_ttl(&self) -> u64 {
        self.token_ttl.load(Ordering::SeqCst)
    }
}

struct Shared {
    config: Config,
    state: Mutex<State>,
    jwks: Mutex<Option<JwkSet>>,
    jwks_fetches: AtomicUsize,
    jwks_http: reqwest::blocking::Client,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not take every later request down with it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct State {
    clock_offset: Duration,
    tokens: HashMap<String, TokenEntry>,
    kv: BTreeMap<String, Vec<KvVersion>>,
    faults: Vec<(String, Fault)>,
    requests: Vec<BaoRequest>,
    entities: HashMap<String, String>,
    sealed: bool,
}

struct TokenEntry {
    accessor: String,
    policies: Vec<String>,
    meta: Option<BTreeMap<String, String>>,
    display_name: String,
    entity_id: String,
    env_id: Option<String>,
    path: String,
    creation: SystemTime,
    creation_ttl: u64,
    /// `None` for the root token, which does not expire.
    expire: Option<SystemTime>,
    max_expire: Option<SystemTime>,
    last_renewal: Option<SystemTime>,
    renewable: bool,
    root: bool,
}

impl TokenEntry {
    fn is_live(&self, now: SystemTime) -> bool {
        self.expire.is_none_or(|e| e > now)
    }

    fn ttl(&self, now: SystemTime) -> u64 {
        self.expire
            .map_or(0, |e| e.duration_since(now).map_or(0, |d| d.as_secs()))
    }
}

struct KvVersion {
    document: Value,
    created: SystemTime,
    deleted: Option<SystemTime>,
    destroyed: bool,
}

impl State {
    fn new(root_token: &str) -> Self {
        let now = SystemTime::now();
        let root = TokenEntry {
            accessor: random_alnum(24),
            policies: vec!["root".into()],
            meta: None,
            display_name: "root".into(),
            entity_id: String::new(),
            env_id: None,
            path: "auth/token/root".into(),
            creation: now,
            creation_ttl: 0,
            expire: None,
            max_expire: None,
            last_renewal: None,
            renewable: false,
            root: true,
        };
        State {
            clock_offset: Duration::ZERO,
            tokens: HashMap::from([(root_token.to_owned(), root)]),
            kv: BTreeMap::new(),
            faults: Vec::new(),
            requests: Vec::new(),
            entities: HashMap::new(),
            sealed: false,
        }
    }

    fn now(&self) -> SystemTime {
        SystemTime::now() + self.clock_offset
    }

    fn version_mut(&mut self, env_id: &str, name: &str, version: u64) -> Option<&mut KvVersion> {
        let index = usize::try_from(version.checked_sub(1)?).ok()?;
        self.kv.get_mut(&kv_key(env_id, name))?.get_mut(index)
    }

    fn new_agent_token(
        &mut self,
        config: &Config,
        env_id: &str,
        grant_jti: Option<&str>,
    ) -> TokenEntry {
        let now = self.now();
        let entity_id = self
            .entities
            .entry(env_id.to_owned())
            .or_insert_with(uuid)
            .clone();
        let mut meta = BTreeMap::from([
            ("role".to_owned(), config.role.clone()),
            ("env_id".to_owned(), env_id.to_owned()),
        ]);
        if let Some(jti) = grant_jti {
            meta.insert("grant_jti".to_owned(), jti.to_owned());
        }
        TokenEntry {
            accessor: random_alnum(24),
            policies: vec![config.policy.clone()],
            meta: Some(meta),
            display_name: format!("{}-{env_id}", config.auth_mount.replace('/', "-")),
            entity_id,
            env_id: Some(env_id.to_owned()),
            path: format!("auth/{}/login", config.auth_mount),
            creation: now,
            creation_ttl: config.token_ttl(),
            expire: Some(now + Duration::from_secs(config.token_ttl())),
            max_expire: Some(now + Duration::from_secs(config.token_max_ttl)),
            last_renewal: None,
            renewable: true,
            root: false,
        }
    }
}

fn kv_key(env_id: &str, name: &str) -> String {
    format!("{env_id}/see/{name}")
}

/// A path below `/v1/`, without leading slashes.
fn relative(path: &str) -> &str {
    let path = path.trim_start_matches('/');
    path.strip_prefix("v1/").unwrap_or(path)
}

/// An answer: status and body (`None` for 204).
struct Answer {
    status: u16,
    body: Option<String>,
}

impl Answer {
    fn json(status: u16, value: &Value) -> Self {
        Answer {
            status,
            body: Some(value.to_string()),
        }
    }

    fn errors(status: u16, errors: &[&str]) -> Self {
        Answer::json(status, &json!({ "errors": errors }))
    }

    fn ok(data: Value, auth: Value, warnings: Value) -> Self {
        Answer::json(200, &envelope(data, auth, warnings))
    }

    fn no_content() -> Self {
        Answer {
            status: 204,
            body: None,
        }
    }
}

/// OpenBao's response envelope.
fn envelope(data: Value, auth: Value, warnings: Value) -> Value {
    json!({
        "request_id": uuid(),
        "lease_id": "",
        "renewable": false,
        "lease_duration": 0,
        "data": data,
        "wrap_info": null,
        "warnings": warnings,
        "auth": auth,
    })
}

/// What the fake needs from one HTTP request.
struct Incoming {
    method: String,
    rel: String,
    query: Option<String>,
    token: Option<String>,
    body: Vec<u8>,
}

fn handle(shared: &Shared, mut request: tiny_http::Request) {
    let method = request.method().as_str().to_ascii_uppercase();
    let (path, query) = match request.url().split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (request.url().to_owned(), None),
    };
    let token = request.headers().iter().find_map(|h| {
        if h.field.equiv("X-Vault-Token") {
            Some(h.value.as_str().to_owned())
        } else if h.field.equiv("Authorization") {
            h.value.as_str().strip_prefix("Bearer ").map(str::to_owned)
        } else {
            None
        }
    });
    let mut body = Vec::new();
    let read = request.as_reader().take(MAX_BODY).read_to_end(&mut body);
    let incoming = Incoming {
        method,
        rel: relative(&path).to_owned(),
        query,
        token,
        body,
    };

    let fault = {
        let mut state = shared.lock();
        state.requests.push(BaoRequest {
            method: incoming.method.clone(),
            path,
            query: incoming.query.clone(),
            by_root: incoming.token.as_deref() == Some(shared.config.root_token.as_str()),
        });
        // A sealed server answers every call but `sys/` with 503, before any auth check.
        if state.sealed && !incoming.rel.starts_with("sys/") {
            Some(Fault::Sealed)
        } else {
            state
                .faults
                .iter()
                .find(|(prefix, _)| incoming.rel.starts_with(prefix.as_str()))
                .map(|(_, f)| f.clone())
        }
    };
    let answer = match (read, fault) {
        (Err(_), _) => Answer::errors(400, &["failed to read request body"]),
        (Ok(_), Some(Fault::Status { status, body })) => Answer {
            status,
            body: Some(body),
        },
        (Ok(_), Some(Fault::Sealed)) => Answer::errors(503, &["Vault is sealed"]),
        (Ok(_), Some(Fault::Delay(delay))) => {
            std::thread::sleep(delay);
            route(shared, &incoming)
        }
        (Ok(_), None) => route(shared, &incoming),
    };
    let response = match answer.body {
        Some(body) => tiny_http::Response::from_string(body)
            .with_status_code(answer.status)
            .with_header(
                tiny_http::Header::from_bytes("Content-Type", "application/json")
                    .expect("static header"),
            )
            .boxed(),
        None => tiny_http::Response::empty(answer.status).boxed(),
    };
    let response = response.with_header(date_header(shared.lock().now()));
    // The client may have gone (a timeout test); nothing to do about it.
    let _ = request.respond(response);
}

/// The `Date` header every answer carries, as OpenBao's (Go's net/http) does, by the fake's
/// settable clock: tiny_http would otherwise stamp the machine's own.
fn date_header(now: SystemTime) -> tiny_http::Header {
    tiny_http::Header::from_bytes("Date", httpdate::fmt_http_date(now)).expect("an http date")
}

fn route(shared: &Shared, incoming: &Incoming) -> Answer {
    let config = &shared.config;
    let rel = incoming.rel.as_str();
    let write = matches!(incoming.method.as_str(), "POST" | "PUT");
    if rel == format!("auth/{}/login", config.auth_mount) {
        if !write {
            return unsupported_operation();
        }
        return login(shared, &incoming.body);
    }

    let mut state = shared.lock();
    let now = state.now();
    let Some(token) = incoming.token.as_deref() else {
        return Answer::errors(403, &[DENIED]);
    };
    let Some((root, env_id)) = state
        .tokens
        .get(token)
        .filter(|t| t.is_live(now))
        .map(|t| (t.root, t.env_id.clone()))
    else {
        return Answer::errors(403, &[DENIED]);
    };
    let kv_prefix = format!("{}/data/", config.kv_mount);
    match rel {
        "auth/token/lookup-self" => match state.tokens.get(token) {
            Some(entry) => lookup_data(entry, token, now),
            None => Answer::errors(403, &[DENIED]),
        },
        "auth/token/renew-self" if write => renew(config, &mut state, token, &incoming.body),
        "auth/token/revoke-self" if write => {
            if !root && !config.revoke_self_allowed {
                return Answer::errors(403, &[ACL_DENIED]);
            }
            state.tokens.remove(token);
            Answer::no_content()
        }
        "auth/token/renew-self" | "auth/token/revoke-self" => unsupported_operation(),
        "auth/token/lookup" if root && write => lookup_other(&state, &incoming.body, now),
        _ if rel.starts_with(&kv_prefix) => {
            let key = &rel[kv_prefix.len()..];
            let allowed = root
                || env_id.as_deref().is_some_and(|env| {
                    key.strip_prefix(env)
                        .and_then(|r| r.strip_prefix("/see/"))
                        .is_some()
                });
            if !allowed {
                return Answer::errors(403, &[ACL_DENIED]);
            }
            if incoming.method != "GET" {
                return unsupported_operation();
            }
            read_kv(&state, key, incoming.query.as_deref())
        }
        _ if root => Answer::errors(404, &["1 error occurred:\n\t* unsupported path\n\n"]),
        _ => Answer::errors(403, &[ACL_DENIED]),
    }
}

fn unsupported_operation() -> Answer {
    Answer::errors(405, &["1 error occurred:\n\t* unsupported operation\n\n"])
}

/// The `data` of `lookup-self`/`lookup`, including `id` as OpenBao does.
fn token_data(entry: &TokenEntry, token: &str, now: SystemTime) -> Value {
    let mut data = json!({
        "accessor": entry.accessor,
        "creation_time": unix(entry.creation),
        "creation_ttl": entry.creation_ttl,
        "display_name": entry.display_name,
        "entity_id": entry.entity_id,
        "expire_time": entry.expire.map(rfc3339),
        "explicit_max_ttl": 0,
        "id": token,
        "issue_time": rfc3339(entry.creation),
        "meta": entry.meta,
        "num_uses": 0,
        "orphan": true,
        "path": entry.path,
        "policies": entry.policies,
        "renewable": entry.renewable,
        "ttl": entry.ttl(now),
        "type": "service",
    });
    if let (Some(renewed), Some(map)) = (entry.last_renewal, data.as_object_mut()) {
        map.insert("last_renewal".into(), json!(rfc3339(renewed)));
        map.insert("last_renewal_time".into(), json!(unix(renewed)));
    }
    data
}

fn lookup_data(entry: &TokenEntry, token: &str, now: SystemTime) -> Answer {
    Answer::ok(token_data(entry, token, now), Value::Null, Value::Null)
}

/// `auth/token/lookup {"token"}` with the root token.
fn lookup_other(state: &State, body: &[u8], now: SystemTime) -> Answer {
    let Some(token) = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("token").and_then(Value::as_str).map(str::to_owned))
    else {
        return Answer::errors(400, &["missing token to lookup"]);
    };
    match state.tokens.get(&token).filter(|t| t.is_live(now)) {
        Some(entry) => lookup_data(entry, &token, now),
        None => Answer::errors(403, &["bad token"]),
    }
}

fn auth_block(entry: &TokenEntry, token: &str, lease: u64) -> Value {
    json!({
        "client_token": token,
        "accessor": entry.accessor,
        "policies": entry.policies,
        "token_policies": entry.policies,
        "identity_policies": null,
        "metadata": entry.meta,
        "lease_duration": lease,
        "renewable": entry.renewable,
        "entity_id": entry.entity_id,
        "token_type": "service",
        "orphan": true,
        "mfa_requirement": null,
        "num_uses": 0,
    })
}

fn renew(config: &Config, state: &mut State, token: &str, body: &[u8]) -> Answer {
    let now = state.now();
    let increment = match parse_increment(body) {
        Ok(inc) => inc,
        Err(message) => return Answer::errors(400, &[&message]),
    };
    let Some(entry) = state.tokens.get_mut(token) else {
        return Answer::errors(403, &[DENIED]);
    };
    if !entry.renewable {
        return Answer::errors(400, &["lease is not renewable"]);
    }
    let Some(max_expire) = entry.max_expire else {
        return Answer::errors(400, &["lease is not renewable"]);
    };
    // As OpenBao: the increment, or the role's TTL, capped so the token never outlives its
    // max TTL counted from creation, with a warning saying so.
    let mut ttl = increment.filter(|&i| i > 0).unwrap_or(config.token_ttl());
    let remaining = max_expire.duration_since(now).map_or(0, |d| d.as_secs());
    if remaining == 0 {
        return Answer::errors(400, &["past the max TTL, cannot renew"]);
    }
    let mut warnings = Value::Null;
    if ttl > remaining {
        warnings = json!([format!(
            "TTL of \"{}\" exceeded the effective max_ttl of \"{}\"; TTL value is capped accordingly",
            go_duration(ttl),
            go_duration(remaining)
        )]);
        ttl = remaining;
    }
    entry.expire = Some(now + Duration::from_secs(ttl));
    entry.last_renewal = Some(now);
    Answer::ok(Value::Null, auth_block(entry, token, ttl), warnings)
}

/// `{"increment": 3600}` or `{"increment": "1h"}`; absent or empty means the role's TTL.
fn parse_increment(body: &[u8]) -> Result<Option<u64>, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value = serde_json::from_slice(body).map_err(|_| "failed to parse JSON input")?;
    match value.get("increment") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| "invalid increment".to_owned()),
        Some(Value::String(s)) => parse_go_duration(s).map(Some),
        Some(_) => Err("invalid increment".to_owned()),
    }
}

/// Seconds from `"3600"`, `"3600s"`, `"90m"`, `"1h30m"`, `"2d"`.
fn parse_go_duration(s: &str) -> Result<u64, String> {
    let bad = || format!("error converting input {s} for field \"increment\": invalid duration");
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(secs);
    }
    let mut total = 0u64;
    let mut digits = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        digits.clear();
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return Err(bad()),
        };
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
    }
    if !digits.is_empty() {
        return Err(bad());
    }
    Ok(total)
}

/// Go's `time.Duration` text for whole seconds: `24h0m0s`, `1m30s`, `45s`.
fn go_duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

fn read_kv(state: &State, key: &str, query: Option<&str>) -> Answer {
    let requested = query
        .into_iter()
        .flat_map(|q| url::form_urlencoded::parse(q.as_bytes()))
        .find(|(k, _)| k == "version")
        .map(|(_, v)| v.into_owned());
    let requested = match requested.as_deref().map(str::parse::<u64>) {
        None => 0,
        Some(Ok(v)) => v,
        Some(Err(_)) => {
            return Answer::errors(
                400,
                &[
                    "1 error occurred:\n\t* error converting input for field \"version\": invalid syntax\n\n",
                ],
            );
        }
    };
    let Some(versions) = state.kv.get(key) else {
        return Answer::errors(404, &[]);
    };
    let number = if requested == 0 {
        versions.len() as u64
    } else {
        requested
    };
    let Some(version) = usize::try_from(number)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| versions.get(i))
    else {
        return Answer::errors(404, &[]);
    };
    let metadata = json!({
        "created_time": rfc3339(version.created),
        "custom_metadata": null,
        "deletion_time": version.deleted.map(rfc3339).unwrap_or_default(),
        "destroyed": version.destroyed,
        "version": number,
    });
    if version.destroyed || version.deleted.is_some() {
        // OpenBao answers 404 with the whole envelope and a null document.
        let body = envelope(
            json!({ "data": null, "metadata": metadata }),
            Value::Null,
            Value::Null,
        );
        return Answer::json(404, &body);
    }
    Answer::ok(
        json!({ "data": version.document, "metadata": metadata }),
        Value::Null,
        Value::Null,
    )
}

/// `POST auth/<mount>/login {"role", "jwt"}` with the `see-env` role's checks.
fn login(shared: &Shared, body: &[u8]) -> Answer {
    let config = &shared.config;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
        return Answer::errors(400, &["failed to parse JSON input"]);
    };
    let role = body.get("role").and_then(Value::as_str).unwrap_or_default();
    if role.is_empty() {
        return Answer::errors(400, &["missing role"]);
    }
    if role != config.role {
        return Answer::errors(400, &[&format!("role {role:?} could not be found")]);
    }
    let jwt = body.get("jwt").and_then(Value::as_str).unwrap_or_default();
    if jwt.is_empty() {
        return Answer::errors(400, &["missing token"]);
    }
    let now = unix(shared.lock().now());
    let claims = match verify_grant(shared, jwt, now) {
        Ok(claims) => claims,
        Err(message) => return Answer::errors(400, &[&message]),
    };
    let Some(env_id) = claims.get("env_id").and_then(Value::as_str) else {
        return Answer::errors(400, &["claim \"env_id\" not found in token"]);
    };
    let jti = claims.get("jti").and_then(Value::as_str);
    let mut state = shared.lock();
    let token = service_token();
    let entry = state.new_agent_token(config, env_id, jti);
    let auth = auth_block(&entry, &token, config.token_ttl());
    state.tokens.insert(token, entry);
    Answer::ok(Value::Null, auth, Value::Null)
}

/// Signature against the JWKS, then `exp`/`nbf`, `aud` and the bound claim `kind`.
fn verify_grant(shared: &Shared, jwt: &str, now: i64) -> Result<Map<String, Value>, String> {
    let config = &shared.config;
    let header = jsonwebtoken::decode_header(jwt)
        .map_err(|_| "error validating token: malformed token".to_owned())?;
    if header.alg != Algorithm::ES256 {
        return Err(format!(
            "error validating token: unsupported signing algorithm {:?}",
            header.alg
        ));
    }
    let keys = jwks_keys(shared, header.kid.as_deref())?;
    let mut validation = Validation::new(Algorithm::ES256);
    // The claims are checked below against the fake's clock, with OpenBao's messages.
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let claims = keys
        .iter()
        .filter_map(|jwk| DecodingKey::from_jwk(jwk).ok())
        .find_map(|key| jsonwebtoken::decode::<Map<String, Value>>(jwt, &key, &validation).ok())
        .ok_or_else(|| {
            "error validating token: error verifying token signature: failed to verify id token \
             signature"
                .to_owned()
        })?
        .claims;

    let number = |name: &str| claims.get(name).and_then(Value::as_f64).map(|v| v as i64);
    match number("exp") {
        None => {
            return Err(
                "error validating token: invalid expiration time (exp) claim: missing".into(),
            );
        }
        Some(exp) if exp + CLOCK_LEEWAY_SECS < now => {
            return Err(
                "error validating token: invalid expiration time (exp) claim: token is expired"
                    .into(),
            );
        }
        Some(_) => {}
    }
    if number("nbf").is_some_and(|nbf| nbf - CLOCK_LEEWAY_SECS > now) {
        return Err(
            "error validating token: invalid not before (nbf) claim: token not yet valid".into(),
        );
    }
    let audience_ok = match claims.get("aud") {
        Some(Value::String(aud)) => *aud == config.audience,
        Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(&config.audience)),
        _ => false,
    };
    if !audience_ok {
        return Err(
            "error validating token: invalid audience (aud) claim: audience claim does \
                    not match any expected audience"
                .into(),
        );
    }
    match claims.get("kind") {
        None => return Err("error validating claims: claim \"kind\" is missing".into()),
        Some(kind) if kind.as_str() != Some("deploy-grant") => {
            return Err(
                "error validating claims: claim \"kind\" does not match any associated \
                        bound claim values"
                    .into(),
            );
        }
        Some(_) => {}
    }
    Ok(claims)
}

/// The JWKS keys to try for `kid` (every key when the grant names none); refetches the set
/// when it was never fetched or does not know the `kid`.
fn jwks_keys(shared: &Shared, kid: Option<&str>) -> Result<Vec<Jwk>, String> {
    let select = |set: &JwkSet| -> Vec<Jwk> {
        match kid {
            Some(kid) => set.find(kid).cloned().into_iter().collect(),
            None => set.keys.clone(),
        }
    };
    let cached = shared
        .jwks
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .map(select)
        .filter(|keys| !keys.is_empty());
    if let Some(keys) = cached {
        return Ok(keys);
    }
    let Some(url) = &shared.config.jwks_url else {
        return Err("could not load configuration".into());
    };
    shared.jwks_fetches.fetch_add(1, Ordering::SeqCst);
    let set: JwkSet = shared
        .jwks_http
        .get(url.clone())
        .send()
        .and_then(reqwest::blocking::Response::error_for_status)
        .and_then(reqwest::blocking::Response::json)
        .map_err(|e| format!("error validating token: failed to fetch keys: {e}"))?;
    let keys = select(&set);
    *shared.jwks.lock().unwrap_or_else(PoisonError::into_inner) = Some(set);
    Ok(keys)
}

fn random_alnum(n: usize) -> String {
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(n)
        .map(char::from)
        .collect()
}

/// A service token as OpenBao mints them by default: `s.` and 24 base62 characters.
fn service_token() -> String {
    format!("s.{}", random_alnum(24))
}

fn uuid() -> String {
    let b: [u8; 16] = rand::random();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// RFC 3339 in UTC with Go's trimmed nanoseconds (`2026-09-05T07:40:00.12Z`).
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86400, secs % 86400);
    let (y, m, day) = civil_from_days(i64::try_from(days).unwrap_or(0));
    let mut out = format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    );
    let nanos = d.subsec_nanos();
    if nanos > 0 {
        let frac = format!("{nanos:09}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let check = |secs: u64, expected: &str| assert_eq!(go_duration(secs), expected);
        check(0, "0s");
        check(45, "45s");
        check(90, "1m30s");
        check(86400, "24h0m0s");
        check(2_592_000, "720h0m0s");
    }

    #[test]
    fn increments() {
        let check = |body: &str, expected: Result<Option<u64>, ()>| {
            assert_eq!(
                parse_increment(body.as_bytes()).map_err(|_| ()),
                expected,
                "{body}"
            );
        };
        check("", Ok(None));
        check("{}", Ok(None));
        check(r#"{"increment": 3600}"#, Ok(Some(3600)));
        check(r#"{"increment": "3600"}"#, Ok(Some(3600)));
        check(r#"{"increment": "3600s"}"#, Ok(Some(3600)));
        check(r#"{"increment": "1h30m"}"#, Ok(Some(5400)));
        check(r#"{"increment": "2d"}"#, Ok(Some(172_800)));
        check(r#"{"increment": "1x"}"#, Err(()));
        check(r#"{"increment": "h"}"#, Err(()));
        check(r#"{"increment": true}"#, Err(()));
    }

    #[test]
    fn timestamps() {
        let check = |secs: u64, nanos: u32, expected: &str| {
            let t = UNIX_EPOCH + Duration::new(secs, nanos);
            assert_eq!(rfc3339(t), expected);
        };
        check(0, 0, "1970-01-01T00:00:00Z");
        check(951_782_400, 0, "2000-02-29T00:00:00Z");
        check(1_788_594_000, 120_000_000, "2026-09-05T07:40:00.12Z");
    }

    #[test]
    fn tokens_look_like_openbao_service_tokens() {
        let t = service_token();
        assert_eq!(t.len(), 26);
        assert!(t.starts_with("s."));
        assert!(t[2..].chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
