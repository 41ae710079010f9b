//! A real OpenBao for tests and the demo: the official `bao` binary (installed by
//! `cargo xtask setup`) run as an in-memory server on 127.0.0.1, initialised with one key
//! share, unsealed and set up as the deployment's mount is.
//!
//! The setup is the production one, so the tests see OpenBao's own policy engine, claim
//! checks, error shapes, seal and revocation rather than the fake's reading of them:
//!
//! - auth mount `jwt-tenancy` (type `jwt`) whose `jwks_url` is the grant issuer's
//!   `/.well-known/agent-jwks.json`;
//! - role `see-env`: `role_type=jwt`, `user_claim=env_id`, `bound_audiences=[openbao-see-env]`,
//!   `bound_claims={kind: deploy-grant}`, `claim_mappings={env_id: env_id, jti: grant_jti}`,
//!   `token_ttl=86400`, `token_max_ttl=2592000`, `token_no_default_policy=true`,
//!   `token_policies=[see-env]`;
//! - policy `see-env`: read on `monky/data/<env>/see/*` and list on `monky/metadata/<env>/see/*`,
//!   where `<env>` is templated from the login's entity alias metadata, plus
//!   `auth/token/lookup-self` and `auth/token/renew-self` (no `revoke-self`);
//! - KV v2 at `monky/`.
//!
//! The server runs as a child process with a config file in a temporary directory; the root
//! token travels only in request headers, never in a process's arguments. Dropping the
//! [`RealBao`] kills the server.

use std::io::Read as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use reqwest::blocking::Client;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use url::Url;

use super::BaoPeer;

/// How long a starting server may take to answer `sys/health`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The role's default token TTL (24 h) and max TTL (30 d), as deployed.
const TOKEN_TTL: Duration = Duration::from_secs(86_400);
const TOKEN_MAX_TTL: Duration = Duration::from_secs(2_592_000);

/// Configures a [`RealBao`]; start with [`RealBao::builder`].
#[derive(Debug)]
#[must_use]
pub struct RealBaoBuilder {
    binary: Option<PathBuf>,
    jwks_url: Option<Url>,
    jwks_ca_pem: Option<String>,
    tls: Option<Tls>,
    token_ttl: Duration,
    token_max_ttl: Duration,
}

/// The listener's certificate chain and key, and the CA the builder's own calls trust (PEM).
#[derive(Debug, Clone)]
struct Tls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    ca_pem: Vec<u8>,
}

impl RealBaoBuilder {
    /// Serve HTTPS with this certificate chain and key, as production does; `ca_pem` signed the
    /// certificate (its names must include `127.0.0.1`, which the setup calls dial).
    pub fn tls(mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>, ca_pem: Vec<u8>) -> Self {
        self.tls = Some(Tls {
            cert_pem,
            key_pem,
            ca_pem,
        });
        self
    }

    /// The `bao` binary (default: [`crate::openbao::binary`]).
    pub fn binary(mut self, path: PathBuf) -> Self {
        self.binary = Some(path);
        self
    }

    /// Where logins fetch the grant issuer's JWKS (tenancy's `/.well-known/agent-jwks.json`).
    /// OpenBao fetches it once when the mount is configured, so the issuer must be up.
    pub fn jwks_url(mut self, url: Url) -> Self {
        self.jwks_url = Some(url);
        self
    }

    /// The CA that signed the JWKS endpoint's certificate, when it speaks TLS.
    pub fn jwks_ca_pem(mut self, pem: String) -> Self {
        self.jwks_ca_pem = Some(pem);
        self
    }

    /// The role's `token_ttl` (default 24 h).
    pub fn token_ttl(mut self, ttl: Duration) -> Self {
        self.token_ttl = ttl;
        self
    }

    /// The role's `token_max_ttl` (default 30 days).
    pub fn token_max_ttl(mut self, ttl: Duration) -> Self {
        self.token_max_ttl = ttl;
        self
    }

    /// Starts the server on a free 127.0.0.1 port, initialises, unseals and sets it up.
    ///
    /// # Errors
    ///
    /// When the binary is missing or the server does not come up; the message carries the
    /// server's own log.
    pub fn try_start(self) -> Result<RealBao, String> {
        let bin = match &self.binary {
            Some(path) => path.clone(),
            None => crate::openbao::binary()?,
        };
        let version = bao_version(&bin)?;
        // A port picked by binding :0 can be taken by someone else before the server binds
        // it; a server that fails to start is retried on another port.
        let mut last = String::new();
        for _ in 0..5 {
            // A server that lost its port to another one answers with the other's voice
            // ("already initialized"): that is a failed start too, retried on a fresh port.
            let started = Server::spawn(&bin, self.tls.as_ref()).and_then(|server| {
                RealBao::from_server(server, version.clone(), self.tls.as_ref())
            });
            match started {
                Ok(mut bao) => {
                    bao.configure(&self)?;
                    return Ok(bao);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// [`RealBaoBuilder::try_start`], panicking with its message: this is test support.
    ///
    /// # Panics
    ///
    /// When the server cannot be started.
    pub fn start(self) -> RealBao {
        self.try_start()
            .unwrap_or_else(|e| panic!("real openbao: {e}"))
    }
}

/// The running child and its scratch directory.
struct Server {
    child: Child,
    dir: tempfile::TempDir,
    addr: SocketAddr,
}

impl Server {
    fn spawn(bin: &Path, tls: Option<&Tls>) -> Result<Server, String> {
        let dir = tempfile::Builder::new()
            .prefix("monky-realbao-")
            .tempdir()
            .map_err(|e| format!("cannot create a scratch directory: {e}"))?;
        let addr = free_port()?;
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes)
                .map(|()| path.display().to_string())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))
        };
        // Without TLS material the listener is plain HTTP: most tests need no TLS, which the
        // agent's transport tests cover with the certificate checks that matter.
        let (listener_tls, scheme) = match tls {
            Some(tls) => (
                format!(
                    "  tls_cert_file = \"{}\"\n  tls_key_file = \"{}\"\n",
                    write("cert.pem", &tls.cert_pem)?,
                    write("key.pem", &tls.key_pem)?
                ),
                "https",
            ),
            None => ("  tls_disable = true\n".to_owned(), "http"),
        };
        // `inmem` keeps nothing on disk.
        let config = format!(
            "storage \"inmem\" {{}}\n\
             listener \"tcp\" {{\n  address = \"{addr}\"\n{listener_tls}}}\n\
             api_addr = \"{scheme}://{addr}\"\n\
             ui = false\n\
             log_level = \"warn\"\n"
        );
        let config_path = dir.path().join("bao.hcl");
        std::fs::write(&config_path, config)
            .map_err(|e| format!("cannot write {}: {e}", config_path.display()))?;
        let log_path = dir.path().join("server.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log_err = log
            .try_clone()
            .map_err(|e| format!("cannot share {}: {e}", log_path.display()))?;
        let mut command = Command::new(bin);
        command
            .arg("server")
            .arg(format!("-config={}", config_path.display()))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        for (key, _) in std::env::vars_os() {
            // Nothing of an operator's own OpenBao settings may steer the test server.
            if key.to_string_lossy().starts_with("BAO_")
                || key.to_string_lossy().starts_with("VAULT_")
            {
                command.env_remove(key);
            }
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut server = Server { child, dir, addr };
        server.wait_listening()?;
        Ok(server)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn wait_listening(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "the OpenBao server exited ({status}) before listening on {}:\n{}",
                    self.addr,
                    self.log()
                ));
            }
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "the OpenBao server did not listen on {} within {START_TIMEOUT:?}:\n{}",
                    self.addr,
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free port never handed out before in this process: tests start servers in parallel, and
/// the kernel may give a port just released by one `bind(:0)` to the next.
fn free_port() -> Result<SocketAddr, String> {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..64 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("cannot find a free port on 127.0.0.1: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("cannot read a bound address: {e}"))?;
        if !handed_out.contains(&addr.port()) {
            handed_out.push(addr.port());
            return Ok(addr);
        }
    }
    Err("no fresh port on 127.0.0.1 after 64 tries".to_owned())
}

/// `bao version`'s number, e.g. `2.7.2`.
fn bao_version(bin: &Path) -> Result<String, String> {
    let out = Command::new(bin)
        .arg("version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {} version: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "OpenBao v2.7.2 (<sha>), committed <date>"
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('v'))
        .filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .map(str::to_owned)
        .ok_or_else(|| format!("{} version said {:?}", bin.display(), text.trim()))
}

/// A running real OpenBao set up as the deployment's; dropping it stops the server.
pub struct RealBao {
    server: Server,
    http: Client,
    url: Url,
    root_token: SecretString,
    unseal_key: SecretString,
    version: String,
    auth_accessor: String,
}

impl std::fmt::Debug for RealBao {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealBao")
            .field("url", &self.url)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// A failed call to the server: its status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// The HTTP status, 0 when no answer came.
    pub status: u16,
    /// The answer's body, or the transport error.
    pub body: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status {}: {}", self.status, self.body)
    }
}

impl RealBao {
    /// A builder with the deployment's settings (the role's TTLs 24 h and 30 d).
    pub fn builder() -> RealBaoBuilder {
        RealBaoBuilder {
            binary: None,
            jwks_url: None,
            jwks_ca_pem: None,
            tls: None,
            token_ttl: TOKEN_TTL,
            token_max_ttl: TOKEN_MAX_TTL,
        }
    }

    fn from_server(server: Server, version: String, tls: Option<&Tls>) -> Result<RealBao, String> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = Url::parse(&format!("{scheme}://{}/", server.addr))
            .map_err(|e| format!("bad server url: {e}"))?;
        let mut http = Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(30));
        if let Some(tls) = tls {
            let certs = reqwest::Certificate::from_pem_bundle(&tls.ca_pem)
                .map_err(|e| format!("the CA for the server's certificate: {e}"))?;
            http = http.tls_certs_only(certs);
        }
        let http = http
            .build()
            .map_err(|e| format!("cannot build an http client: {e}"))?;
        let mut bao = RealBao {
            server,
            http,
            url,
            root_token: SecretString::from(String::new()),
            unseal_key: SecretString::from(String::new()),
            version,
            auth_accessor: String::new(),
        };
        let init = bao
            .call_as(
                None,
                Method::PUT,
                "sys/init",
                Some(json!({"secret_shares": 1, "secret_threshold": 1})),
            )
            .map_err(|e| format!("sys/init failed: {e}\n{}", bao.server.log()))?;
        let field = |name: &str| -> Result<String, String> {
            init.pointer(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("sys/init answered without {name}"))
        };
        bao.root_token = SecretString::from(field("/root_token")?);
        bao.unseal_key = SecretString::from(field("/keys_base64/0")?);
        bao.try_unseal()
            .map_err(|e| format!("{e}\n{}", bao.server.log()))?;
        Ok(bao)
    }

    fn configure(&mut self, b: &RealBaoBuilder) -> Result<(), String> {
        let step = |what: &str, r: Result<Value, CallError>| {
            r.map(drop).map_err(|e| format!("{what}: {e}"))
        };
        step(
            "mount kv v2 at monky/",
            self.call(
                Method::POST,
                "sys/mounts/monky",
                Some(json!({"type": "kv", "options": {"version": "2"}})),
            ),
        )?;
        step(
            "enable auth jwt at jwt-tenancy/",
            self.call(
                Method::POST,
                "sys/auth/jwt-tenancy",
                Some(json!({"type": "jwt"})),
            ),
        )?;
        let auths = self
            .call(Method::GET, "sys/auth", None)
            .map_err(|e| format!("list auth mounts: {e}"))?;
        self.auth_accessor = auths
            .pointer("/data/jwt-tenancy~1/accessor")
            .or_else(|| auths.pointer("/jwt-tenancy~1/accessor"))
            .and_then(Value::as_str)
            .ok_or("sys/auth lists no accessor for jwt-tenancy/")?
            .to_owned();
        if let Some(jwks_url) = &b.jwks_url {
            let mut config = json!({"jwks_url": jwks_url.as_str()});
            if let Some(pem) = &b.jwks_ca_pem {
                config["jwks_ca_pem"] = json!(pem);
            }
            step(
                "configure jwt-tenancy",
                self.call(Method::POST, "auth/jwt-tenancy/config", Some(config)),
            )?;
        }
        step(
            "write policy see-env",
            self.call(
                Method::PUT,
                "sys/policies/acl/see-env",
                Some(json!({"policy": see_env_policy(&self.auth_accessor)})),
            ),
        )?;
        self.set_role(b.token_ttl, b.token_max_ttl)?;
        self.wait_kv_ready()
    }

    /// Writes role `see-env` with these TTLs (the rest as deployed).
    ///
    /// # Errors
    ///
    /// OpenBao's answer when it refuses the role.
    pub fn set_role(&self, token_ttl: Duration, token_max_ttl: Duration) -> Result<(), String> {
        self.call(
            Method::POST,
            "auth/jwt-tenancy/role/see-env",
            Some(see_env_role(token_ttl, token_max_ttl)),
        )
        .map(drop)
        .map_err(|e| format!("write role see-env: {e}"))
    }

    /// A new KV v2 mount upgrades its storage in the background; writes fail until it is done.
    fn wait_kv_ready(&self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            match self.call(
                Method::POST,
                "monky/data/monky-realbao-probe",
                Some(json!({"data": {}})),
            ) {
                Ok(_) => {
                    return self
                        .call(Method::DELETE, "monky/metadata/monky-realbao-probe", None)
                        .map(drop)
                        .map_err(|e| format!("remove the kv probe: {e}"));
                }
                Err(e) if started.elapsed() > START_TIMEOUT => {
                    return Err(format!("the kv mount never became writable: {e}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(25)),
            }
        }
    }

    /// The base URL, `http(s)://127.0.0.1:<port>/`.
    pub fn url(&self) -> Url {
        self.url.clone()
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// The root token from the server's initialisation.
    pub fn root_token(&self) -> SecretString {
        self.root_token.clone()
    }

    /// The server's version, as `bao version` prints it (`2.7.2`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The accessor of the `jwt-tenancy` mount (the policy's template names it).
    pub fn auth_accessor(&self) -> &str {
        &self.auth_accessor
    }

    /// One API call with the root token; the answer's JSON (`null` for 204).
    ///
    /// # Errors
    ///
    /// A non-2xx answer or no answer.
    pub fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, CallError> {
        self.call_as(Some(&self.root_token), method, path, body)
    }

    fn call_as(
        &self,
        token: Option<&SecretString>,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, CallError> {
        let url = self
            .url
            .join(&format!("v1/{}", path.trim_start_matches('/')))
            .map_err(|e| CallError {
                status: 0,
                body: e.to_string(),
            })?;
        let method = if method.as_str() == "LIST" {
            Method::from_bytes(b"LIST").unwrap_or(Method::GET)
        } else {
            method
        };
        let mut request = self.http.request(method, url);
        if let Some(token) = token {
            request = request.header("X-Vault-Token", token.expose_secret());
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let mut response = request.send().map_err(|e| CallError {
            status: 0,
            body: e.without_url().to_string(),
        })?;
        let status = response.status().as_u16();
        let mut text = String::new();
        let _ = response.read_to_string(&mut text);
        if !(200..300).contains(&status) {
            return Err(CallError { status, body: text });
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| CallError {
            status,
            body: format!("not json ({e}): {text}"),
        })
    }

    /// Seals the server: every call answers 503 until [`RealBao::try_unseal`].
    ///
    /// # Errors
    ///
    /// OpenBao's answer when it refuses.
    pub fn try_seal(&self) -> Result<(), String> {
        self.call(Method::PUT, "sys/seal", None)
            .map(drop)
            .map_err(|e| format!("sys/seal: {e}"))
    }

    /// Unseals the server with its one key share and waits until it serves again.
    ///
    /// # Errors
    ///
    /// OpenBao's answer when it refuses.
    pub fn try_unseal(&self) -> Result<(), String> {
        let answer = self
            .call_as(
                None,
                Method::PUT,
                "sys/unseal",
                Some(json!({"key": self.unseal_key.expose_secret()})),
            )
            .map_err(|e| format!("sys/unseal: {e}"))?;
        if answer["sealed"] != json!(false) {
            return Err(format!("still sealed after sys/unseal: {answer}"));
        }
        // The first requests after an unseal can race the mounts' setup; wait for a read.
        let started = Instant::now();
        while self
            .call(Method::GET, "auth/token/lookup-self", None)
            .is_err()
        {
            if started.elapsed() > START_TIMEOUT {
                return Err("unsealed, but the root token is not accepted".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        self.server.log()
    }

    fn put(&self, env_id: &str, name: &str, document: Value) -> u64 {
        let answer = self
            .call(
                Method::POST,
                &format!("monky/data/{env_id}/see/{name}"),
                Some(json!({ "data": document })),
            )
            .unwrap_or_else(|e| panic!("real openbao: write {env_id}/see/{name}: {e}"));
        answer["data"]["version"]
            .as_u64()
            .unwrap_or_else(|| panic!("real openbao: a kv write answered {answer}"))
    }

    /// Every token accessor with its lookup, root's excepted.
    fn accessors(&self) -> Vec<(String, Value)> {
        let Ok(list) = self.call(
            Method::from_bytes(b"LIST").unwrap_or(Method::GET),
            "auth/token/accessors",
            None,
        ) else {
            return Vec::new();
        };
        list["data"]["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter_map(|accessor| {
                let info = self
                    .call(
                        Method::POST,
                        "auth/token/lookup-accessor",
                        Some(json!({ "accessor": accessor })),
                    )
                    .ok()?;
                Some((accessor.to_owned(), info["data"].clone()))
            })
            .collect()
    }
}

/// The `see-env` role of the deployment with these TTLs (24 h and 30 d there).
pub fn see_env_role(token_ttl: Duration, token_max_ttl: Duration) -> Value {
    json!({
        "role_type": "jwt",
        "user_claim": "env_id",
        "bound_audiences": ["openbao-see-env"],
        "bound_claims": {"kind": "deploy-grant"},
        "claim_mappings": {"env_id": "env_id", "jti": "grant_jti"},
        "token_ttl": token_ttl.as_secs(),
        "token_max_ttl": token_max_ttl.as_secs(),
        "token_no_default_policy": true,
        "token_policies": ["see-env"],
    })
}

/// The `see-env` policy of the deployment, templated on the `jwt-tenancy` mount's accessor.
pub fn see_env_policy(accessor: &str) -> String {
    let env = format!("{{{{identity.entity.aliases.{accessor}.metadata.env_id}}}}");
    format!(
        "path \"monky/data/{env}/see/*\" {{\n  capabilities = [\"read\"]\n}}\n\
         path \"monky/metadata/{env}/see/*\" {{\n  capabilities = [\"list\"]\n}}\n\
         path \"auth/token/renew-self\" {{\n  capabilities = [\"update\"]\n}}\n\
         path \"auth/token/lookup-self\" {{\n  capabilities = [\"read\"]\n}}\n"
    )
}

impl BaoPeer for RealBao {
    fn kind(&self) -> &'static str {
        "real"
    }

    fn url(&self) -> Url {
        RealBao::url(self)
    }

    fn addr(&self) -> SocketAddr {
        RealBao::addr(self)
    }

    fn root_token(&self) -> SecretString {
        RealBao::root_token(self)
    }

    fn put_secret(&self, env_id: &str, name: &str, value: &str) -> u64 {
        self.put(env_id, name, json!({ "value": value }))
    }

    fn put_document(&self, env_id: &str, name: &str, document: Value) -> u64 {
        self.put(env_id, name, document)
    }

    fn delete_version(&self, env_id: &str, name: &str, version: u64) -> bool {
        self.call(
            Method::POST,
            &format!("monky/delete/{env_id}/see/{name}"),
            Some(json!({ "versions": [version] })),
        )
        .is_ok()
    }

    fn destroy_version(&self, env_id: &str, name: &str, version: u64) -> bool {
        self.call(
            Method::PUT,
            &format!("monky/destroy/{env_id}/see/{name}"),
            Some(json!({ "versions": [version] })),
        )
        .is_ok()
    }

    fn seal(&self) {
        RealBao::try_seal(self).unwrap_or_else(|e| panic!("real openbao: {e}"));
    }

    fn unseal(&self) {
        RealBao::try_unseal(self).unwrap_or_else(|e| panic!("real openbao: {e}"));
    }

    fn revoke_tokens_for_env(&self, env_id: &str) -> usize {
        let mut revoked = 0;
        for (accessor, info) in self.accessors() {
            if info["meta"]["env_id"].as_str() == Some(env_id)
                && self
                    .call(
                        Method::POST,
                        "auth/token/revoke-accessor",
                        Some(json!({ "accessor": accessor })),
                    )
                    .is_ok()
            {
                revoked += 1;
            }
        }
        revoked
    }

    fn live_tokens_for_env(&self, env_id: &str) -> usize {
        self.accessors()
            .iter()
            .filter(|(_, info)| info["meta"]["env_id"].as_str() == Some(env_id))
            .count()
    }

    fn set_token_ttl(&self, ttl: Duration) {
        self.set_role(ttl, TOKEN_MAX_TTL)
            .unwrap_or_else(|e| panic!("real openbao: {e}"));
    }
}

/// Whether the real-OpenBao tests are to be skipped: `MONKY_REALBAO=skip`, for a machine that
/// cannot have the binary. The one place this policy is written; every real-OpenBao test asks
/// it.
///
/// # Panics
/// When the variable is set under CI (`CI=true`): there the real OpenBao must run.
#[must_use]
pub fn real_skipped() -> bool {
    if std::env::var("MONKY_REALBAO").as_deref() != Ok("skip") {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "MONKY_REALBAO=skip is not allowed under CI: the real OpenBao tests must run"
    );
    eprintln!("real OpenBao test skipped: MONKY_REALBAO=skip");
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fenced block of `lang` that follows the first line containing `after`.
    fn block<'a>(doc: &'a str, after: &str, lang: &str) -> &'a str {
        let rest = &doc[doc.find(after).expect("the marker is in the doc")..];
        let start = rest.find(&format!("```{lang}\n")).expect("a fenced block") + lang.len() + 4;
        let len = rest[start..].find("```").expect("a closed block");
        &rest[start..start + len]
    }

    #[test]
    fn operations_md_documents_the_policy_and_role_that_are_tested() {
        let doc = include_str!("../../../docs/OPERATIONS.md");
        assert_eq!(
            block(doc, "`see-env.hcl`", "hcl"),
            see_env_policy("<accessor>"),
            "docs/OPERATIONS.md's see-env policy differs from the one RealBao sets up"
        );
        let role: Value = serde_json::from_str(block(doc, "`see-env-role.json`", "json")).unwrap();
        assert_eq!(
            role,
            see_env_role(TOKEN_TTL, TOKEN_MAX_TTL),
            "docs/OPERATIONS.md's see-env role differs from the one RealBao sets up"
        );
    }

    #[test]
    fn the_policy_is_templated_on_the_accessor_and_has_no_revoke_self() {
        let policy = see_env_policy("auth_jwt_1234");
        assert!(policy.contains(
            "monky/data/{{identity.entity.aliases.auth_jwt_1234.metadata.env_id}}/see/*"
        ));
        assert!(!policy.contains("revoke-self"));
    }
}
