//! One tick: lock, token, checkin, then heartbeat, retire or apply, report, upkeep, save.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use monky_agent_proto as proto;
use monky_bao_client as bao;
use monky_bundle as bundle;
use monky_compose as compose;
use proto::{Action, ReportResult};
use secrecy::{ExposeSecret, SecretString};
use tracing::{info, warn};

use crate::code::Code;
use crate::config::{Config, VolumesOnAbsent};
use crate::exit::{Exit, Failure};
use crate::state::{self, SeenContainer, State, TokenSource, TokenState};
use crate::{checks, failpoint, fsx, host, logging, metrics, peers, redact, release};

/// Re-lease when the token is older than its max TTL (30 d) less two days.
const RELEASE_AFTER: Duration = Duration::from_secs(28 * 24 * 3600);

const TOKEN_FILE: &str = "bao.token";
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// The largest bootstrap grant read (a deploy grant JWT is well under 4 KiB).
pub const MAX_GRANT_BYTES: u64 = 16 * 1024;

/// How a tick was asked to run.
#[derive(Debug, Clone, Copy, Default)]
pub struct TickOptions {
    /// Drop old releases and prune images after a successful apply.
    pub prune: bool,
    /// Apply now even if the desired sha is waiting out a failure backoff.
    pub force: bool,
}

/// What a tick ended with, for the loop's pacing.
#[derive(Debug)]
pub struct TickOutcome {
    /// The process status this tick maps to.
    pub exit: Exit,
    /// Tenancy's checkin interval, when it said one.
    pub interval: Option<Duration>,
    /// Retry-After from a 429.
    pub retry_after: Option<Duration>,
}

/// Runs one tick and maps its result to an exit status; errors are logged, redacted, here.
pub fn run_once(cfg: &Config, opts: TickOptions) -> TickOutcome {
    let started = std::time::Instant::now();
    let outcome = run_tick(cfg, opts);
    if let Some(path) = &cfg.metrics_textfile {
        let st: State = fsx::read_bounded(&state::path(&cfg.state_dir), fsx::MAX_STATE_FILE_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let facts = metrics::TickFacts {
            exit: outcome.exit,
            duration: started.elapsed(),
            ended_at: state::now(),
        };
        if let Err(e) = metrics::write(path, &metrics::render(&cfg.env_id, &st, facts)) {
            warn!("cannot write the metrics file {}: {e:#}", path.display());
        }
    }
    outcome
}

fn run_tick(cfg: &Config, opts: TickOptions) -> TickOutcome {
    logging::start_capture();
    let mut retry_after = None;
    let mut interval = None;
    let exit = match tick(cfg, opts, &mut interval) {
        Ok(exit) => exit,
        Err(e) => {
            // The tenancy error itself was turned into a Failure on the way up; it kept the
            // wait tenancy asked for.
            retry_after = Failure::retry_after_of(&e).or_else(|| {
                e.chain()
                    .find_map(|c| c.downcast_ref::<proto::Error>())
                    .and_then(proto::Error::retry_after)
            });
            let exit = Exit::of(&e);
            if exit == Exit::Temporary && cfg.laptop_mode {
                info!("offline (laptop mode): {}", redact::redact(&first_line(&e)));
                Exit::Ok
            } else {
                tracing::error!("{}", redact::redact(&format!("{e:#}")));
                exit
            }
        }
    };
    TickOutcome {
        exit,
        interval,
        retry_after,
    }
}

fn first_line(e: &anyhow::Error) -> String {
    e.chain()
        .last()
        .map(ToString::to_string)
        .unwrap_or_default()
}

fn tick(cfg: &Config, opts: TickOptions, interval: &mut Option<Duration>) -> anyhow::Result<Exit> {
    let Some(_lock) = lock(&cfg.state_dir)? else {
        info!("another tick holds the lock; nothing to do");
        return Ok(Exit::Ok);
    };
    // Declared after the lock, so dropped before it: the deadline stops, then the lock goes.
    let _deadline = crate::watchdog::arm(cfg);
    let (state, note) = State::load(&cfg.state_dir, &cfg.env_id)?;
    if let Some(note) = note {
        warn!("{note}");
    }
    let mut agent = Agent::new(cfg, state, opts)?;
    let result = agent.converge();
    // Clamped again: a state.json written before the bounds existed may hold any number.
    *interval = agent
        .state
        .checkin_interval_s
        .map(|s| proto::CheckinInterval::from_secs(s).get());
    let saved = agent.finish(&result);
    match (result, saved) {
        // Converged, but the next tick would not know it: as much a failure as any other.
        (Ok(_), Err(e)) => Err(e),
        (result, Err(e)) => {
            tracing::error!("{e:#}");
            result
        }
        (result, Ok(())) => result,
    }
}

/// Checks the state dir (owner and mode, as sshd's StrictModes) and takes its lock; `None`
/// when another tick holds it.
fn lock(state_dir: &Path) -> anyhow::Result<Option<File>> {
    let root = fsx::Dir::state_root(state_dir)?;
    let p = root.join("lock");
    let f = root.open_plain("lock", 0o600)?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", p.display()))
        }
    }
}

/// The agent during one tick.
pub(crate) struct Agent<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) state: State,
    opts: TickOptions,
    tenancy: proto::Client,
    /// Built on first use: a heartbeat never speaks to OpenBao, and building the client costs
    /// a runtime thread and the CA bundle's parsing (or the system's roots without one).
    bao: std::cell::OnceCell<bao::BaoClient>,
    docker: compose::Docker,
    token: Option<bao::Token>,
    /// Why the last look at the containers failed; a heartbeat must not call that "not running".
    docker_error: Option<String>,
}

impl<'a> Agent<'a> {
    pub(crate) fn new(cfg: &'a Config, state: State, opts: TickOptions) -> anyhow::Result<Self> {
        let mut builder =
            compose::Docker::builder(cfg.docker_bin.clone()).docker_config(cfg.docker_config_dir());
        if let Some(hint) = state.compose.clone() {
            builder = builder.compose_hint(hint);
        }
        let docker = builder.build().context("docker")?;
        Ok(Self {
            tenancy: peers::tenancy(cfg)?,
            bao: std::cell::OnceCell::new(),
            docker,
            cfg,
            state,
            opts,
            token: None,
            docker_error: None,
        })
    }

    /// The OpenBao client, built the first time a tick needs it.
    fn bao(&self) -> anyhow::Result<&bao::BaoClient> {
        if let Some(client) = self.bao.get() {
            return Ok(client);
        }
        let client = peers::openbao(self.cfg)?;
        Ok(self.bao.get_or_init(|| client))
    }

    fn token_path(&self) -> PathBuf {
        self.cfg.state_dir.join(TOKEN_FILE)
    }

    /// The stored token's text, read without following a link and bounded.
    fn read_token(&self) -> anyhow::Result<Option<zeroize::Zeroizing<String>>> {
        let root = fsx::Dir::state_root(&self.cfg.state_dir)?;
        Ok(root
            .read_file(TOKEN_FILE, MAX_TOKEN_BYTES)?
            .map(|b| zeroize::Zeroizing::new(String::from_utf8_lossy(&b).into_owned())))
    }

    // ---- token ------------------------------------------------------------------------------

    /// Loads the stored token, or bootstraps one from the kit's grant.
    pub(crate) fn ensure_token(&mut self) -> anyhow::Result<()> {
        if self.token.is_some() {
            return Ok(());
        }
        if let Some(text) = self.read_token()?
            && !text.trim().is_empty()
        {
            redact::register(text.trim());
            self.token = Some(bao::Token::new(text.trim().to_string()));
            return Ok(());
        }
        self.bootstrap()
    }

    /// Logs in with the bootstrap grant, stores the token and deletes the grant.
    pub(crate) fn bootstrap(&mut self) -> anyhow::Result<()> {
        let grant_path = &self.cfg.bootstrap_file;
        let grant = match fsx::read_private(grant_path, MAX_GRANT_BYTES) {
            Ok(g) if !String::from_utf8_lossy(&g).trim().is_empty() => {
                let g = zeroize::Zeroizing::new(g);
                SecretString::from(String::from_utf8_lossy(&g).trim().to_string())
            }
            Err(
                p @ (fsx::ReadProblem::NotRegular(_)
                | fsx::ReadProblem::Readable(_)
                | fsx::ReadProblem::Owner(_)
                | fsx::ReadProblem::TooLarge(_)),
            ) => {
                return Err(Failure::coded(
                    Code::GrantUnsafe,
                    format!(
                        "bootstrap grant {} refused: {p}; stage it again as a regular file, mode \
                         0600, owned by the agent's user (the install kit does this)",
                        grant_path.display()
                    ),
                )
                .into());
            }
            _ => {
                return Err(Failure::coded(
                    Code::NoCredentials,
                    format!(
                        "no OpenBao token and no bootstrap grant at {}: re-run the install kit",
                        grant_path.display()
                    ),
                )
                .into());
            }
        };
        redact::register(grant.expose_secret());
        info!("bootstrapping: logging in to OpenBao with the kit's grant");
        let login = self
            .bao()?
            .login_jwt(&self.cfg.bao.auth_mount, &self.cfg.bao.role, &grant)
            .map_err(|e| {
                let temporary = e.kind() == bao::ErrorKind::Temporary;
                let f = peers::bao_failure("bootstrap login", e);
                if temporary {
                    f
                } else {
                    f.context("the bootstrap grant was refused: re-run the install kit")
                }
            })?;
        self.install_token(login.token, TokenSource::Bootstrap, login.ttl)?;
        match std::fs::remove_file(grant_path) {
            Ok(()) => info!("bootstrap grant consumed and deleted"),
            Err(e) => warn!("cannot delete {}: {e}", grant_path.display()),
        }
        Ok(())
    }

    /// Stores a new token (0600, atomically) and its facts; revokes the one it replaces.
    fn install_token(
        &mut self,
        token: bao::Token,
        source: TokenSource,
        ttl: Duration,
    ) -> anyhow::Result<()> {
        redact::register(token.expose_secret());
        fsx::Dir::state_root(&self.cfg.state_dir)?.write_atomic(
            TOKEN_FILE,
            token.expose_secret().as_bytes(),
            0o600,
        )?;
        let now = state::now();
        self.state.token = Some(TokenState {
            source,
            obtained_at: now,
            expires_at: now.saturating_add(ttl.as_secs()),
        });
        if let Some(old) = self.token.replace(token)
            && old.expose_secret() != self.token.as_ref().map_or("", |t| t.expose_secret())
            && let Err(e) = self
                .bao()
                .and_then(|b| b.revoke_self(&old).map_err(anyhow::Error::new))
        {
            // The policy may not grant revoke-self; the old token then simply expires.
            warn!("could not revoke the previous token: {e}");
        }
        Ok(())
    }

    fn bearer(&self) -> anyhow::Result<SecretString> {
        self.token
            .as_ref()
            .map(|t| SecretString::from(t.expose_secret().to_string()))
            .context("no token")
    }

    fn forget_token(&mut self) {
        self.token = None;
        self.state.token = None;
        if let Ok(root) = fsx::Dir::state_root(&self.cfg.state_dir) {
            let _ = root.remove_file(TOKEN_FILE);
        }
    }

    /// Leases a grant, logs in with it, and makes the new token the bearer.
    fn lease_login(&mut self, reason: &str) -> anyhow::Result<()> {
        let req = proto::LeaseRequest {
            env_id: self.cfg.env_id.clone(),
            reason: reason.to_string(),
        };
        let lease = self
            .tenancy
            .lease(&self.bearer()?, &req)
            .map_err(|e| peers::tenancy_failure("lease", e))?;
        redact::register(lease.login_jwt.expose_secret());
        let login = self
            .bao()?
            .login_jwt(&lease.mount, &lease.role, &lease.login_jwt)
            .map_err(|e| peers::bao_failure("lease login", e))?;
        info!("leased a deploy grant ({reason}); new OpenBao token in place");
        self.install_token(login.token, TokenSource::Lease, login.ttl)
    }

    /// The token to read secrets with: a valid lease token is reused, a bootstrap token is
    /// swapped for a lease once, and a rate-limited lease does not stop a deploy that already
    /// holds a working token.
    fn token_for_apply(&mut self) -> anyhow::Result<()> {
        if let (
            Some(tok),
            Some(TokenState {
                source: TokenSource::Lease,
                ..
            }),
        ) = (&self.token, &self.state.token)
        {
            match self.bao()?.lookup_self(tok) {
                Ok(info) if info.ttl.as_secs() > self.cfg.bao.renew_below_s => return Ok(()),
                Ok(_) => info!("lease token is close to expiry; leasing a new one"),
                Err(e) if e.kind() == bao::ErrorKind::Temporary => {
                    return Err(peers::bao_failure("token lookup", e));
                }
                Err(e) => info!("lease token no longer valid ({e}); leasing a new one"),
            }
        }
        match self.lease_login("apply") {
            Ok(()) => Ok(()),
            Err(e)
                if Failure::code_of(&e) == Some(Code::LeaseRateLimited) && self.token.is_some() =>
            {
                warn!("lease rate-limited; applying with the current token, swap deferred");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// A token on disk without facts in the state (taken over from the original agent, whose
    /// state did not say when it expires): asks OpenBao, so upkeep renews it when due instead
    /// of letting it die at its TTL. Best effort: a failed lookup leaves the next tick to ask.
    fn learn_token_facts(&mut self) {
        let Some(tok) = &self.token else { return };
        if self.state.token.is_some() {
            return;
        }
        let looked_up = self
            .bao()
            .and_then(|b| b.lookup_self(tok).map_err(anyhow::Error::new));
        match looked_up {
            Ok(info) => {
                let now = state::now();
                // Where the token came from is not recorded; as a bootstrap token it is swapped
                // for a lease at the next apply, which is safe either way.
                self.state.token = Some(TokenState {
                    source: TokenSource::Bootstrap,
                    obtained_at: if info.creation_time > 0 {
                        info.creation_time.min(now)
                    } else {
                        now
                    },
                    expires_at: now.saturating_add(info.ttl.as_secs()),
                });
                info!(
                    "token facts learnt from OpenBao (ttl {}s)",
                    info.ttl.as_secs()
                );
            }
            Err(e) => warn!("cannot look up the stored token: {e:#}"),
        }
    }

    /// Renews or re-leases the token when due; runs at the end of every tick that has one.
    fn upkeep(&mut self) -> anyhow::Result<()> {
        let (Some(tok), Some(ts)) = (&self.token, self.state.token.clone()) else {
            return Ok(());
        };
        let now = state::now();
        if now.saturating_sub(ts.obtained_at) > RELEASE_AFTER.as_secs() {
            info!("token is close to its max TTL; re-leasing");
            return self.lease_login("renew");
        }
        if ts.expires_at.saturating_sub(now) < self.cfg.bao.renew_below_s {
            let renewal = self
                .bao()?
                .renew_self(tok, None)
                .map_err(|e| peers::bao_failure("token renew", e))?;
            for w in &renewal.warnings {
                warn!("renew: {w}");
            }
            info!("token renewed (ttl {}s)", renewal.ttl.as_secs());
            if let Some(t) = self.state.token.as_mut() {
                t.expires_at = now.saturating_add(renewal.ttl.as_secs());
            }
        }
        Ok(())
    }

    // ---- checkin ----------------------------------------------------------------------------

    fn containers(&mut self) -> Vec<SeenContainer> {
        let listed = self.docker.containers(&self.cfg.compose_project);
        self.docker_error = listed.as_ref().err().map(ToString::to_string);
        match listed {
            Ok(cs) => cs
                .into_iter()
                .map(|c| SeenContainer {
                    name: c.name,
                    state: c.state,
                    health: c.health,
                })
                .collect(),
            Err(e) => {
                warn!("cannot list containers: {e}");
                Vec::new()
            }
        }
    }

    fn wire_containers(&self) -> Vec<proto::ContainerStatus> {
        self.state
            .containers
            .iter()
            .map(|c| proto::ContainerStatus {
                name: c.name.clone(),
                state: c.state.clone(),
                health: c.health.clone(),
            })
            .collect()
    }

    fn checkin_request(&mut self) -> proto::CheckinRequest {
        self.state.containers = self.containers();
        let facts = self.docker.facts();
        self.state.compose = self.docker.known_compose();
        proto::CheckinRequest {
            env_id: self.cfg.env_id.clone(),
            agent_version: crate::VERSION.to_string(),
            applied_sha: self.state.applied_sha.clone(),
            host: proto::HostFacts {
                hostname: host::hostname(),
                os: host::os(),
                kernel: host::kernel(),
                docker: facts.docker_version,
                compose: facts.compose_version,
                free_bytes: facts.free_bytes,
                agent_version: crate::VERSION.to_string(),
                transport: self.cfg.transport.as_str().to_string(),
                site: self.cfg.site.clone(),
                laptop_mode: self.cfg.laptop_mode,
            },
            containers: self.wire_containers(),
        }
    }

    /// Checks in; a superseded token is dropped and, with a fresh grant on disk, replaced.
    fn checkin(&mut self) -> anyhow::Result<proto::CheckinResponse> {
        let req = self.checkin_request();
        match self.tenancy.checkin(&self.bearer()?, &req) {
            Ok(r) => Ok(r),
            Err(e) if e.kind() == proto::ErrorKind::Unauthenticated => {
                warn!("tenancy refused the token ({e}); deleting it");
                self.forget_token();
                if !self.cfg.bootstrap_file.exists() {
                    return Err(Failure::coded(
                        Code::AgentUnauthenticated,
                        "the token was superseded or revoked and no bootstrap grant is on disk: \
                         re-run the install kit",
                    )
                    .into());
                }
                self.bootstrap()?;
                self.tenancy
                    .checkin(&self.bearer()?, &req)
                    .map_err(|e| peers::tenancy_failure("checkin after re-bootstrap", e))
            }
            Err(e) => Err(peers::tenancy_failure("checkin", e)),
        }
    }

    /// The whole tick after the lock: token, checkin, action.
    fn converge(&mut self) -> anyhow::Result<Exit> {
        self.ensure_token()?;
        let resp = self.checkin()?;
        self.learn_token_facts();
        self.state.last_checkin = Some(state::now());
        self.state.desired_sha = resp.desired_sha.as_ref().map(|s| s.as_str().to_owned());
        self.state.checkin_interval_s = resp.checkin_interval_s.map(|i| i.as_secs());
        if let Some(mount) = resp.vault.as_ref().and_then(|v| v.mount.clone()) {
            if mount != self.cfg.bao.kv_mount && self.state.kv_mount.as_deref() != Some(&mount) {
                info!(
                    "adopting KV mount {mount:?} from tenancy (config says {:?})",
                    self.cfg.bao.kv_mount
                );
            }
            self.state.kv_mount = (mount != self.cfg.bao.kv_mount).then_some(mount);
        }
        info!(
            "checkin: action={} desired={} applied={}",
            resp.action,
            resp.desired_sha.as_ref().map_or("-", |s| s.short()),
            short(self.state.applied_sha.as_deref())
        );
        match resp.action {
            Action::None => self.heartbeat(),
            Action::Down => self.retire(resp.purge_volumes).inspect_err(|e| {
                if Failure::code_of(e) == Some(Code::ReleaseModified) {
                    let sha = self.state.applied_sha.clone();
                    self.report_failure(sha.as_deref(), e, None);
                }
            }),
            Action::Apply => {
                // A sha that is not 64 lowercase hex digits never decoded: this one is safe in a
                // path, a URL and a comparison with the release's own.
                let sha = resp
                    .desired_sha
                    .as_ref()
                    .map(|s| s.as_str().to_owned())
                    .ok_or_else(|| {
                        Failure::coded(Code::CheckinInvalid, "action apply without desired_sha")
                    })?;
                let url = resp
                    .bundle_url
                    .clone()
                    .unwrap_or_else(|| format!("/v1/agent/bundle/{}/{sha}", self.cfg.env_id));
                if let Some(deadline) = self.backoff_deadline(&sha) {
                    return self.report_waiting(&sha, deadline);
                }
                match self.apply(&sha, &url) {
                    Ok(exit) => Ok(exit),
                    Err(e) => {
                        self.report_failure(Some(&sha), &e, None);
                        Err(e)
                    }
                }
            }
        }
    }

    // ---- none / down ------------------------------------------------------------------------

    fn heartbeat(&mut self) -> anyhow::Result<Exit> {
        let bad = not_ready(&self.state.containers);
        let missing = self.state.containers.is_empty() && self.state.applied_sha.is_some();
        let sha = self.state.applied_sha.clone();
        let unknown = self.docker_error.clone();
        if unknown.is_none() && bad.is_empty() && !missing {
            info!(
                "heartbeat: {} container(s) healthy",
                self.state.containers.len()
            );
            self.report(ReportResult::Applied, sha.as_deref(), None, None)?;
            self.record("applied", None, None);
            return Ok(Exit::Ok);
        }
        let (code, why) = if let Some(e) = unknown {
            (
                Code::DockerUnavailable,
                format!("cannot list the containers: {e}"),
            )
        } else if missing {
            (
                Code::NotRunning,
                "no container of the project is running".to_string(),
            )
        } else {
            (Code::Unhealthy, bad.join(", "))
        };
        // Redacted once here: the same text goes to the report and to state.json.
        let detail = redact::redact(&format!("{code}: {why}"));
        warn!("heartbeat: {detail}");
        self.report(ReportResult::Failed, sha.as_deref(), Some(&detail), None)?;
        self.record("failed", Some(code), Some(detail));
        Ok(Exit::Fail)
    }

    fn retire(&mut self, purge_requested: bool) -> anyhow::Result<Exit> {
        let current = release::current_dir(self.cfg);
        if let Some(sha) = release::current_sha(self.cfg)?
            && current.exists()
        {
            // A release changed on disk could steer `down -v` at volumes it never owned.
            release::verify(self.cfg, &sha)?;
        }
        let rel = release::Release::open(&current);
        // The release `current` names is judged by its own (verified) tier too: a failed prod
        // release left in place (on_failure: leave) is no applied release, and still prod.
        let prod = self.cfg.is_prod(
            self.state.applied_prod.unwrap_or(false) || rel.as_ref().is_some_and(|r| r.is_prod()),
        );
        let wanted = purge_requested || self.cfg.volumes_on_absent == VolumesOnAbsent::Purge;
        let volumes = wanted && !prod;
        if wanted && prod {
            warn!("volume purge requested on a prod env: refused, volumes kept");
        }
        if let Some(rel) = rel {
            info!(
                "compose down --remove-orphans{}",
                if volumes { " -v" } else { "" }
            );
            rel.compose(&self.docker, self.cfg)
                .down(volumes)
                .map_err(|e| Failure::coded(Code::ComposeDownFailed, e.to_string()))?;
        } else {
            info!("nothing deployed; reporting down");
        }
        let sha = self.state.forget_applied();
        release::clear_current(self.cfg)?;
        self.state.containers = self.containers();
        self.report(ReportResult::Down, sha.as_deref(), None, None)?;
        self.record("down", None, None);
        Ok(Exit::Ok)
    }

    // ---- apply ------------------------------------------------------------------------------

    fn kv_mount(&self) -> String {
        self.state
            .kv_mount
            .clone()
            .unwrap_or_else(|| self.cfg.bao.kv_mount.clone())
    }

    fn apply(&mut self, sha: &str, url: &str) -> anyhow::Result<Exit> {
        let dl = self
            .tenancy
            .bundle(&self.bearer()?, url)
            .map_err(|e| peers::tenancy_failure("bundle", e))?;
        let b =
            bundle::Bundle::parse(&dl.bytes, &bundle::Limits::default()).map_err(bundle_error)?;
        b.check_sha(sha).map_err(refusal)?;
        if let Some(h) = dl.header_sha.as_deref().filter(|h| *h != b.sha()) {
            warn!(
                "bundle header sha {} disagrees with its content {}",
                short(Some(h)),
                short(Some(b.sha()))
            );
        }
        failpoint::hit("after-fetch");
        let paths = self.refusal_checks(&b, sha)?;

        // Secrets: names are logged, values never.
        let manifest = b.manifest();
        let mut values: BTreeMap<String, SecretString> = BTreeMap::new();
        if !manifest.entries.is_empty() {
            self.token_for_apply()?;
            let token = self.token.as_ref().context("no token")?;
            for (entry, path) in manifest.entries.iter().zip(&paths) {
                let v = self
                    .bao()?
                    .read_kv(token, path, entry.version)
                    .map_err(|e| peers::bao_failure(&format!("read {}", entry.var), e))?;
                redact::register(v.expose_secret());
                if entry.is_registry_auth() {
                    self.write_registry_auth(&v);
                } else {
                    values.insert(entry.var.clone(), v);
                }
            }
            info!(
                "read {} secret(s): {}",
                values.len(),
                values.keys().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        if self.state.original_release.is_some() {
            self.note_quoting_changes(&values);
        }
        // A value that cannot be written where the template puts it fails here, before staging,
        // and waits out the backoff: the pinned versions make it fail the same way next time.
        let env_text = bundle::render_env(b.env_template(), &values)
            .map_err(|r| self.failed_before_start(sha, Code::of_refusal(r.code), &r))?;
        drop(values);

        let staged = release::stage(self.cfg, &b, &env_text)?;
        failpoint::hit("after-staging");
        // compose's own model is the authority: a value from a secret is only visible there.
        self.policy_gate(&staged)?;
        // Pulled from the staging dir: a registry refusal leaves `current` naming the release
        // that is still running.
        info!("compose pull");
        self.state.last_disk_need_bytes = b.meta().disk_need_bytes;
        if let Err(e) = staged.compose(&self.docker, self.cfg).pull() {
            return Err(self.failed_before_start(sha, Code::ComposePullFailed, &e));
        }
        let prod = self.cfg.is_prod(b.meta().is_prod());
        let rel = release::promote(self.cfg, staged, sha, &|r| self.policy_gate(r))?;
        failpoint::hit("after-swap");
        release::verify(self.cfg, sha)?;
        let project = rel.compose(&self.docker, self.cfg);
        info!("compose up -d --remove-orphans");
        failpoint::hit("before-up");
        let up = project.up(Some(self.cfg.healthy_timeout));
        failpoint::hit("after-up");
        self.state.containers = self.containers();
        let bad = not_ready(&self.state.containers);
        if up.is_err() || !bad.is_empty() {
            let logs = project.logs_tail(200).unwrap_or_else(|e| {
                warn!("cannot read the compose logs: {e}");
                String::new()
            });
            let (code, why) = match (&up, bad.is_empty()) {
                (Err(e), true) => (Code::ComposeUpFailed, e.to_string()),
                _ => (Code::Unhealthy, bad.join(", ")),
            };
            let detail = format!("{code}: {why}");
            warn!("apply of {} failed: {detail}", short(Some(sha)));
            let note = self.release_failed(sha, prod, true, code, &detail);
            let e = anyhow::Error::new(Failure::coded(code, format!("{why}; {note}")));
            self.report_failure(Some(sha), &e, Some(&logs));
            return Err(e.context(ReportedMarker));
        }
        self.state.mark_applied(sha, b.meta().is_prod());
        // From now on the release is this agent's own.
        self.state.original_release = None;
        self.record("applied", None, None);
        self.state.clear_failed();
        info!(
            "applied {} ({} container(s) healthy)",
            short(Some(sha)),
            self.state.containers.len()
        );
        self.report(ReportResult::Applied, Some(sha), None, None)?;
        if self.opts.prune {
            release::prune(self.cfg, self.cfg.keep_releases);
            if let Err(e) = self.docker.image_prune() {
                warn!("image prune failed: {e}");
            }
        }
        Ok(Exit::Ok)
    }

    /// The first apply over a release the original agent wrote: names every variable whose
    /// value the app received differently through the original's `.env`, in the journal (and so
    /// the report's `log_tail`) and in state for `explain`. The apply goes on: the value now
    /// written is the secret itself.
    fn note_quoting_changes(&mut self, values: &BTreeMap<String, SecretString>) {
        let names = crate::takeover::handed_differently(values);
        if !names.is_empty() {
            warn!(
                "{}: {}: the original agent's .env handed these to the app \
                 differently ($ expansion, quotes, ' #' or blanks); they now reach it exactly, \
                 so an app initialised with the old form needs its stored value updated",
                Code::EnvQuotingChanged,
                names.join(", ")
            );
        }
        self.state.quoting_changed = names;
    }

    /// When the desired sha failed before and its backoff has not run out, the deadline.
    fn backoff_deadline(&mut self, sha: &str) -> Option<u64> {
        if self.state.failed_sha.as_deref() != Some(sha) {
            // Tenancy wants something else now: the old failure no longer counts.
            self.state.clear_failed();
            return None;
        }
        let deadline = self.state.next_attempt_at?;
        if self.opts.force {
            info!(
                "--force: trying {} again before its backoff ran out",
                short(Some(sha))
            );
            return None;
        }
        (deadline > state::now()).then_some(deadline)
    }

    /// A failed release waiting out its backoff: report, but no bundle, lease, pull or up.
    fn report_waiting(&mut self, sha: &str, deadline: u64) -> anyhow::Result<Exit> {
        // A state written before the failure's own detail was kept has only its code's name.
        let code = self.state.failed_code.unwrap_or(Code::Failed);
        let base = self
            .state
            .failed_detail
            .clone()
            .unwrap_or_else(|| format!("{code}: an earlier attempt failed"));
        let running = self.state.applied_sha.clone();
        let detail = format!(
            "{base}; next attempt {}; running {}",
            crate::status::rfc3339(deadline),
            running.as_deref().map_or("nothing", |s| short(Some(s)))
        );
        info!(
            "{} failed before; waiting until {} (`run --once --force` retries now)",
            short(Some(sha)),
            crate::status::rfc3339(deadline)
        );
        self.report(ReportResult::Failed, Some(sha), Some(&detail), None)?;
        self.record("failed", Some(code), Some(detail));
        Ok(Exit::Fail)
    }

    /// A release that failed before anything of it started (its `.env` could not be written,
    /// or its pull failed): the backoff as for any failed release, and the failure to report.
    fn failed_before_start(
        &mut self,
        sha: &str,
        code: Code,
        why: &dyn std::fmt::Display,
    ) -> anyhow::Error {
        let detail = Failure::coded(code, why.to_string()).to_string();
        // Nothing started, so nothing falls back: prod or not does not matter here.
        let note = self.release_failed(sha, false, false, code, &detail);
        Failure::coded(code, format!("{why}; {note}")).into()
    }

    /// After a release failed at pull, up or health: schedules the next attempt (1 min, 2, 4,
    /// ... up to 1 h, jittered) and falls back to the last healthy release. `detail` is the
    /// failure's `CODE: names`, repeated while the sha waits. Returns what the report says
    /// about the fallback.
    fn release_failed(
        &mut self,
        sha: &str,
        prod: bool,
        started: bool,
        code: Code,
        detail: &str,
    ) -> String {
        let attempts = if self.state.failed_sha.as_deref() == Some(sha) {
            self.state.failed_attempts + 1
        } else {
            1
        };
        let wait = failure_backoff(attempts, rand::random_range(0.0..1.0));
        let next = state::now() + wait.as_secs();
        self.state.failed_sha = Some(sha.to_string());
        self.state.failed_attempts = attempts;
        self.state.next_attempt_at = Some(next);
        self.state.failed_code = Some(code);
        self.state.failed_detail = Some(redact::redact(detail));
        let previous = self.state.applied_sha.clone().filter(|p| p != sha);
        let note = match previous {
            // The pull failed before promotion: nothing changed on the engine or on disk.
            Some(prev) if !started => format!("running {}", short(Some(&prev))),
            None if !started => "nothing running".to_string(),
            None => {
                self.state.forget_applied();
                "no earlier healthy release to fall back to".to_string()
            }
            Some(_) if self.cfg.on_failure(prod) == crate::config::OnFailure::Leave => {
                self.state.forget_applied();
                format!("left {} in place (on_failure: leave)", short(Some(sha)))
            }
            Some(prev) => self.revert_to(&prev),
        };
        format!("{note}; next attempt {}", crate::status::rfc3339(next))
    }

    /// Points `current` back at `prev` and brings it up again; volumes are not touched.
    fn revert_to(&mut self, prev: &str) -> String {
        if let Err(e) = release::verify(self.cfg, prev) {
            // Nothing is started from a release that changed on disk; what runs stays.
            self.state.forget_applied();
            warn!(
                "fallback to {} refused: {}",
                short(Some(prev)),
                redact::redact(&format!("{e:#}"))
            );
            let code = Failure::code_of(&e).unwrap_or(Code::Failed);
            return format!("fallback to {} refused ({code})", short(Some(prev)));
        }
        let result =
            release::point_current(self.cfg, prev, &|r| self.policy_gate(r)).and_then(|rel| {
                info!("falling back to {}", short(Some(prev)));
                rel.compose(&self.docker, self.cfg)
                    .up(Some(self.cfg.healthy_timeout))
                    .map_err(anyhow::Error::new)
            });
        self.state.containers = self.containers();
        match result {
            Ok(()) if not_ready(&self.state.containers).is_empty() => {
                format!("reverted to {}", short(Some(prev)))
            }
            Ok(()) => {
                self.state.forget_applied();
                format!(
                    "reverted to {}, which is not healthy either",
                    short(Some(prev))
                )
            }
            Err(e) => {
                self.state.forget_applied();
                warn!("fallback to {} failed: {e:#}", short(Some(prev)));
                match Failure::code_of(&e) {
                    Some(code) => format!("fallback to {} refused ({code})", short(Some(prev))),
                    None => format!("fallback to {} failed", short(Some(prev))),
                }
            }
        }
    }

    /// The compose policy on compose's model of `rel`, before compose pulls or starts it: the
    /// staged release, the promoted one before `current` names it, and a release fallen back
    /// to, whose files may have changed on disk since it was checked.
    fn policy_gate(&self, rel: &release::Release) -> anyhow::Result<()> {
        let policy = self.cfg.compose_policy(rel.allow_privileged());
        let raw = rel.compose_yaml()?;
        let findings = checks::model(
            &policy,
            &rel.compose(&self.docker, self.cfg),
            &raw,
            rel.dir(),
        )?;
        match findings.into_iter().next() {
            Some(f) => Err(f.into_failure()),
            None => Ok(()),
        }
    }

    /// Every refusal an apply can meet before any lease or secret read; returns the KV paths.
    fn refusal_checks(&self, b: &bundle::Bundle, sha: &str) -> anyhow::Result<Vec<bao::KvPath>> {
        let (paths, findings) = checks::offline(
            b,
            &self.cfg.env_id,
            &self.kv_mount(),
            &self.cfg.compose_policy(false),
        );
        if let Some(f) = findings.into_iter().next() {
            return Err(f.into_failure());
        }
        bundle::check_rollback(sha, &self.state.applied_history, b.meta().allow_rollback)
            .map_err(refusal)?;
        match self.docker.free_bytes() {
            Ok(free) => bundle::check_disk(
                free,
                b.meta().disk_need_bytes.unwrap_or(0),
                self.cfg.disk_factor,
                self.cfg.disk_headroom_bytes,
            )
            .map_err(refusal)?,
            Err(e) => {
                warn!("cannot read the docker data root's free space ({e}); disk check skipped")
            }
        }
        Ok(paths)
    }

    fn write_registry_auth(&self, value: &SecretString) {
        let result = bundle::RegistryAuth::parse(value, Some(&self.cfg.registry_host))
            .map_err(anyhow::Error::new)
            .and_then(|auth| {
                redact::register_basic_auth(auth.username(), auth.password().expose_secret());
                let json = auth.docker_config_json();
                redact::register(json.expose_secret());
                fsx::Dir::state_root(&self.cfg.state_dir)?
                    .ensure_sub("docker", 0o700)?
                    .write_atomic("config.json", json.expose_secret().as_bytes(), 0o600)?;
                Ok(auth.registry().to_string())
            });
        match result {
            Ok(registry) => info!("registry credential in place for {registry}"),
            Err(e) => warn!("registry credential unusable ({e:#}); private images will not pull"),
        }
    }

    // ---- report -----------------------------------------------------------------------------

    fn report(
        &mut self,
        result: ReportResult,
        sha: Option<&str>,
        detail: Option<&str>,
        extra_log: Option<&str>,
    ) -> anyhow::Result<()> {
        let mut tail = logging::tail(logging::LOG_TAIL_MAX);
        if let Some(extra) = extra_log {
            tail.push_str("--- compose logs ---\n");
            tail.push_str(&redact::redact(extra));
            tail = logging::tail_of(&tail, logging::LOG_TAIL_MAX);
        }
        let req = proto::ReportRequest {
            env_id: self.cfg.env_id.clone(),
            sha: sha.map(str::to_string),
            result,
            log_tail: tail,
            containers: self.wire_containers(),
            detail: detail.map(redact::redact),
        };
        self.tenancy
            .report(&self.bearer()?, &req)
            .map_err(|e| peers::tenancy_failure("report", e))?;
        self.state.last_report = Some(state::now());
        Ok(())
    }

    /// Records what the last report said: the one place the last result, error and code are set.
    fn record(&mut self, result: &str, code: Option<Code>, error: Option<String>) {
        self.state.last_result = Some(result.to_string());
        self.state.last_error = error;
        self.state.last_code = code;
    }

    /// Reports a failed apply (once), recording `CODE: names` as the last error.
    fn report_failure(&mut self, sha: Option<&str>, e: &anyhow::Error, logs: Option<&str>) {
        if e.downcast_ref::<ReportedMarker>().is_some() {
            return;
        }
        let (code, detail) = failure_detail(e);
        let detail = redact::redact(&detail);
        self.record("failed", code, Some(detail.clone()));
        if self.token.is_none() {
            return;
        }
        if let Err(re) = self.report(ReportResult::Failed, sha, Some(&detail), logs) {
            warn!("could not report the failure: {re:#}");
        }
    }

    /// The tick's `finally`: token upkeep, staging cleanup, state saved.
    /// Returns the state save's error.
    fn finish(&mut self, result: &anyhow::Result<Exit>) -> anyhow::Result<()> {
        let error = result.as_ref().err();
        if let Some(e) = error {
            let (code, detail) = failure_detail(e);
            self.state.last_error = Some(redact::redact(&detail));
            self.state.last_code = code;
        }
        match result {
            Ok(Exit::Ok) => self.state.last_success = Some(state::now()),
            // A tick that ends failed without an error (a heartbeat, a wait) recorded its code.
            Ok(_) | Err(_) => {
                if let Some(code) = self.state.last_code {
                    *self
                        .state
                        .refusals
                        .entry(code.as_str().to_string())
                        .or_default() += 1;
                }
            }
        }
        let reached_tenancy = error.is_none_or(|e| Exit::of(e) != Exit::Temporary);
        if reached_tenancy && let Err(e) = self.upkeep() {
            warn!("token upkeep: {}", redact::redact(&format!("{e:#}")));
        }
        release::clean_staging(self.cfg);
        failpoint::hit("before-save");
        self.state.save(&self.cfg.state_dir).with_context(|| {
            format!(
                "cannot save {}: free space in {} or the next tick repeats this one",
                state::path(&self.cfg.state_dir).display(),
                self.cfg.state_dir.display()
            )
        })
    }
}

/// Marks an error whose report was already sent.
#[derive(Debug)]
struct ReportedMarker;

impl std::error::Error for ReportedMarker {}

impl std::fmt::Display for ReportedMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("apply failed")
    }
}

/// The code and `CODE: names` of an error, for a report's detail and state's last error; an
/// error that carries no failure is `FAILED` with its innermost cause.
fn failure_detail(e: &anyhow::Error) -> (Option<Code>, String) {
    match e.chain().find_map(|c| c.downcast_ref::<Failure>()) {
        Some(f) => (f.code, f.to_string()),
        None => (
            Some(Code::Failed),
            format!(
                "{}: {}",
                Code::Failed,
                e.chain()
                    .last()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ),
        ),
    }
}

fn refusal(r: bundle::Refusal) -> anyhow::Error {
    Failure::coded(Code::of_refusal(r.code), r.to_string()).into()
}

fn bundle_error(e: bundle::Error) -> anyhow::Error {
    match e.refusal() {
        Some(r) => refusal(r.clone()),
        None => Failure::coded(Code::BundleInvalid, e.to_string()).into(),
    }
}

/// The wait after the `attempts`-th failure of the same release: 1 min doubling up to 1 h,
/// spread by up to 20% (`jitter` in 0..1) so a fleet does not retry in step.
pub fn failure_backoff(attempts: u32, jitter: f64) -> Duration {
    let base = (60u64 << attempts.saturating_sub(1).min(6)).min(3600);
    Duration::from_secs(base).mul_f64(0.9 + 0.2 * jitter.clamp(0.0, 1.0))
}

/// The containers that are not running-and-healthy, as `name (state or health)`.
fn not_ready(containers: &[SeenContainer]) -> Vec<String> {
    containers
        .iter()
        .filter(|c| {
            !(c.state == "running" && matches!(c.health.as_deref(), None | Some("healthy")))
        })
        .map(|c| format!("{} ({})", c.name, c.health.as_deref().unwrap_or(&c.state)))
        .collect()
}

/// The first 12 characters of a sha, for logs. Counted in characters, not bytes: a sha read
/// from state.json or a header is not proven to be hex.
pub fn short(sha: Option<&str>) -> &str {
    sha.map_or("-", |s| {
        s.char_indices().nth(12).map_or(s, |(at, _)| &s[..at])
    })
}

/// `monky-deployd bootstrap [--force]`: log in with the kit's grant and store the token.
pub fn bootstrap_command(cfg: &Config, force: bool) -> anyhow::Result<Exit> {
    let Some(_lock) = lock(&cfg.state_dir)? else {
        anyhow::bail!("a tick is running; try again in a minute");
    };
    let (state, _) = State::load(&cfg.state_dir, &cfg.env_id)?;
    let mut agent = Agent::new(cfg, state, TickOptions::default())?;
    if agent.token_path().exists() && !force {
        outln!("a token is already stored; use --force to replace it");
        return Ok(Exit::Ok);
    }
    if force {
        // The old token stays valid until revoked by the new login's install_token.
        if let Ok(Some(text)) = agent.read_token() {
            redact::register(text.trim());
            agent.token = Some(bao::Token::new(text.trim().to_string()));
        }
    }
    let result = agent.bootstrap();
    if let Err(e) = agent.state.save(&cfg.state_dir) {
        warn!("cannot save state: {e:#}");
    }
    result?;
    outln!("token stored in {}", agent.token_path().display());
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_never_cuts_inside_a_character() {
        let sha = "7a10".repeat(16);
        assert_eq!(short(Some(&sha)), "7a107a107a10");
        assert_eq!(short(Some("abc")), "abc");
        assert_eq!(short(None), "-");
        let multibyte = format!("{}é{}", &sha[..11], &sha[13..]);
        assert_eq!(short(Some(&multibyte)), format!("{}é", &sha[..11]));
        assert_eq!(short(Some("\u{3000}\u{3000}")), "\u{3000}\u{3000}");
    }

    #[test]
    fn failure_backoff_doubles_from_a_minute_to_an_hour_with_jitter() {
        let secs = |n, j| failure_backoff(n, j).as_secs();
        assert_eq!(
            [1, 2, 3, 4, 5, 6, 7, 20].map(|n| secs(n, 0.5)),
            [60, 120, 240, 480, 960, 1920, 3600, 3600]
        );
        assert_eq!(secs(1, 0.0), 54);
        assert_eq!(secs(1, 1.0), 66);
        assert_eq!(secs(30, 1.0), 3960);
    }
}
