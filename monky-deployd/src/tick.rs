//! One tick: lock, token, checkin, then heartbeat, retire or apply, report, upkeep, save.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use monky_agent_proto as proto;
use monky_bao_client as bao;
use monky_compose as compose;
use proto::Action;
use tracing::{info, warn};

use crate::code::{Code, CodePolicy as _};
use crate::config::{Config, VolumesOnAbsent};
use crate::exit::{Exit, Failure};
use crate::state::{self, SeenContainer, State};
use crate::{fsx, host, logging, metrics, peers, redact, release};

mod apply;
mod backoff;
mod heal;
mod outcome;
mod token;

use outcome::Outcome;

pub use backoff::failure_backoff;
pub use token::{MAX_GRANT_BYTES, bootstrap_command};

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
    let st = State::peek(&cfg.state_dir);
    // Offline on a laptop is one quiet line, already written.
    let offline = cfg.laptop_mode
        && outcome.exit == Exit::Ok
        && st.last_error.is_some()
        && st.last_code.is_some_and(|c| c.exit() == Exit::Temporary);
    if !offline {
        summary(&st, outcome.exit, started.elapsed());
    }
    if let Some(path) = &cfg.metrics_textfile {
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

/// The tick's one summary line, what `journalctl -u monky-deployd` shows for each run as
/// systemd shows one line per unit start: action, sha, outcome, code, duration, exit.
fn summary(st: &State, exit: Exit, took: Duration) {
    let line = summary_line(st, exit, took);
    match exit {
        Exit::Ok => info!("{line}"),
        Exit::Temporary => warn!("{line}"),
        Exit::Fail | Exit::Config => tracing::error!("{line}"),
    }
}

/// See [`summary`].
pub(crate) fn summary_line(st: &State, exit: Exit, took: Duration) -> String {
    let code = st.last_code.filter(|_| st.last_error.is_some());
    let outcome = match (exit, st.last_result.as_deref()) {
        (Exit::Temporary, _) => "temporary",
        (Exit::Config, _) => "config",
        (_, Some(r)) if code.is_none() || r == "failed" => r,
        (Exit::Ok, _) => "ok",
        _ => "failed",
    };
    let sha = match st.last_action.as_deref() {
        Some("apply") => st.desired_sha.as_deref().or(st.applied_sha.as_deref()),
        _ => st.applied_sha.as_deref(),
    };
    let mut line = format!(
        "tick: action={} sha={} outcome={outcome} code={} duration={:.1}s exit={}",
        st.last_action.as_deref().unwrap_or("-"),
        short(sha),
        code.map_or("-", Code::as_str),
        took.as_secs_f64(),
        exit.code()
    );
    if let Some(code) = code {
        line.push_str(&format!(" owner=\"{}\"", code.owner()));
        if st.repeats > 0 {
            line.push_str(&format!(
                " (same {code} as the last {} tick{})",
                st.repeats,
                if st.repeats == 1 { "" } else { "s" }
            ));
        }
    }
    line
}

/// An error for the journal: `CODE: message` on one line of at most [`ERROR_LINE_MAX`]
/// characters; the whole chain follows on a second, info line when it says more.
fn log_error(e: &anyhow::Error, repeated: bool) {
    let full = redact::redact(&format!("{e:#}"));
    let (code, detail) = Failure::detail_of(e);
    let detail = redact::redact(&detail);
    if repeated {
        // The summary line counts the repeats; the chain was logged in full the first time.
        tracing::error!("{}", one_line(&detail, ERROR_LINE_MAX));
        return;
    }
    let head = one_line(&detail, ERROR_LINE_MAX);
    tracing::error!("{head}");
    if full != detail || head.len() < detail.len() {
        info!(
            "  detail{}: {}",
            code.map_or(String::new(), |c| format!(" of {c}")),
            full
        );
    }
}

/// The most characters of an error's first line in the journal.
const ERROR_LINE_MAX: usize = 240;

/// `text` on one line, cut to `max` characters with an ellipsis.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    match flat.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &flat[..at]),
        None => flat,
    }
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
                info!(
                    "offline (laptop mode): {}",
                    redact::redact(&e.root_cause().to_string())
                );
                Exit::Ok
            } else {
                log_error(&e, State::peek(&cfg.state_dir).repeats > 0);
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

fn tick(cfg: &Config, opts: TickOptions, interval: &mut Option<Duration>) -> anyhow::Result<Exit> {
    let Some(_lock) = lock(&cfg.state_dir)? else {
        info!("another tick holds the lock; nothing to do");
        return Ok(Exit::Ok);
    };
    // Declared after the lock, so dropped before it: the deadline stops, then the lock goes.
    let _deadline = crate::watchdog::arm(cfg);
    let (mut state, note) = State::load(&cfg.state_dir, &cfg.env_id)?;
    if let Some(note) = note {
        warn!("{note}");
    }
    // This tick's action, once tenancy answers; none if it never does.
    state.last_action = None;
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
    /// The project's containers as last listed, with what drift detection compares.
    facts: Vec<compose::ContainerFacts>,
    /// The operator's hold, when one is in force.
    hold: Option<crate::hold::Hold>,
    /// The apply marker is dealt with (an apply of this tick concluded, or an interrupted one
    /// was recovered or given up): `finish` removes it once the state is saved.
    marker_settled: bool,
    /// The last tick's code and error, to count a failure that repeats.
    previous: (Option<Code>, Option<String>),
}

impl<'a> Agent<'a> {
    pub(crate) fn new(cfg: &'a Config, state: State, opts: TickOptions) -> anyhow::Result<Self> {
        let mut builder =
            compose::Docker::builder(cfg.docker_bin.clone()).docker_config(cfg.docker_config_dir());
        if let Some(hint) = state.compose.clone() {
            builder = builder.compose_hint(hint);
        }
        let docker = builder.build().context("docker")?;
        let hold = crate::hold::load(&cfg.state_dir)?;
        let mut state = state;
        state.hold.clone_from(&hold);
        Ok(Self {
            previous: (state.last_code, state.last_error.clone()),
            tenancy: peers::tenancy(cfg)?,
            bao: std::cell::OnceCell::new(),
            docker,
            cfg,
            state,
            opts,
            token: None,
            docker_error: None,
            facts: Vec::new(),
            hold,
            marker_settled: false,
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
    // ---- checkin ----------------------------------------------------------------------------

    /// Looks at the project's containers again: state keeps what was seen, and why the look
    /// failed is kept for the heartbeat (a failed look is no "nothing running").
    fn refresh_containers(&mut self) {
        let listed = self.docker.container_facts(&self.cfg.compose_project);
        self.docker_error = listed.as_ref().err().map(ToString::to_string);
        self.facts = listed.unwrap_or_else(|e| {
            warn!("cannot list containers: {e}");
            Vec::new()
        });
        self.state.containers = self
            .facts
            .iter()
            .map(|f| SeenContainer {
                name: f.container.name.clone(),
                state: f.container.state.clone(),
                health: f.container.health.clone(),
            })
            .collect();
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

    /// Looks at the box (the containers, the docker facts, the compose found) and says it to
    /// tenancy as a checkin.
    fn checkin_request(&mut self) -> proto::CheckinRequest {
        self.refresh_containers();
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
            hold: self.hold.as_ref().map(crate::hold::Hold::wire),
        }
    }

    /// Checks in. Tenancy's 401 alone destroys nothing: a fresh grant on disk (staged by the
    /// box's admin) replaces the token, and otherwise OpenBao says whether the token is dead.
    fn checkin(&mut self) -> anyhow::Result<proto::CheckinResponse> {
        let req = self.checkin_request();
        let refused = match self.tenancy.checkin(&self.bearer()?, &req) {
            Ok(r) => return Ok(r),
            Err(e) if e.kind() == proto::ErrorKind::Unauthenticated => e,
            Err(e) => return Err(peers::tenancy_failure("checkin", e)),
        };
        warn!("tenancy refused the token ({refused})");
        if !self.cfg.bootstrap_file.exists() {
            return Err(self.token_refused_by_tenancy(&refused));
        }
        // The new login's token replaces (and revokes) the old one only once it exists.
        self.bootstrap()?;
        self.tenancy
            .checkin(&self.bearer()?, &req)
            .map_err(|e| peers::tenancy_failure("checkin after re-bootstrap", e))
    }

    /// The whole tick after the lock: token, checkin, action.
    fn converge(&mut self) -> anyhow::Result<Exit> {
        self.ensure_token()?;
        let resp = self.checkin()?;
        self.learn_token_facts();
        self.state.last_action = Some(resp.action.to_string());
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
        if let Some(hold) = self.hold.clone() {
            return self.held(&hold, &resp);
        }
        if let Some(exit) = self.recover_interrupted(&resp)? {
            return Ok(exit);
        }
        match resp.action {
            Action::None => self.heartbeat(),
            Action::Down => {
                let sha = self.state.applied_sha.clone();
                self.retire(resp.purge_volumes)
                    .inspect_err(|e| self.conclude_error(sha.as_deref(), e))
            }
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
                // With a desired sha there is always a URL: tenancy's, or the protocol's default.
                let url = resp
                    .bundle_url_or_default(&self.cfg.env_id)
                    .unwrap_or_default();
                if self.state.failed_sha.as_deref() != Some(sha.as_str()) {
                    // Tenancy wants something else now: the old failure no longer counts.
                    self.state.clear_failed();
                }
                if let Some(deadline) = self.backoff_deadline(&sha) {
                    return self.report_waiting(&sha, deadline);
                }
                self.apply(&sha, &url)
                    .inspect_err(|e| self.conclude_error(Some(&sha), e))
            }
        }
    }

    // ---- none / down ------------------------------------------------------------------------

    fn heartbeat(&mut self) -> anyhow::Result<Exit> {
        if let (None, Some(sha)) = (&self.docker_error, self.state.applied_sha.clone()) {
            let drift = crate::drift::detect(&sha, self.state.converged.as_ref(), &self.facts);
            if !drift.is_empty() {
                return self.on_drift(&sha, &drift);
            }
            self.adopt_converged(&sha);
        }
        self.health_report(None)
    }

    /// The heartbeat's report of the containers' health; `note` (a hold) goes beside an
    /// `applied` result and after a failure's detail.
    fn health_report(&mut self, note: Option<(Code, String)>) -> anyhow::Result<Exit> {
        let bad = not_ready(&self.state.containers);
        let missing = self.state.containers.is_empty() && self.state.applied_sha.is_some();
        let sha = self.state.applied_sha.clone();
        let unknown = self.docker_error.clone();
        if unknown.is_none() && bad.is_empty() && !missing {
            info!(
                "heartbeat: {} container(s) healthy",
                self.state.containers.len()
            );
            return self.conclude(match note {
                Some((code, detail)) => Outcome::noted(sha.as_deref(), code, detail),
                None => Outcome::applied(sha.as_deref()),
            });
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
        let mut detail = format!("{code}: {why}");
        if let Some((_, note)) = note {
            detail = format!("{detail}; {note}");
        }
        warn!("heartbeat: {}", redact::redact(&detail));
        self.conclude(Outcome::failed(sha.as_deref(), code, detail))
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
        self.refresh_containers();
        self.conclude(Outcome::down(sha.as_deref()))
    }

    // ---- apply ------------------------------------------------------------------------------

    fn kv_mount(&self) -> String {
        self.state
            .kv_mount
            .clone()
            .unwrap_or_else(|| self.cfg.bao.kv_mount.clone())
    }
}

/// The containers that are not running-and-healthy, as `name (state or health)`.
fn not_ready(containers: &[SeenContainer]) -> Vec<String> {
    containers
        .iter()
        .filter(|c| !monky_compose::Container::ready(&c.state, c.health.as_deref()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_summary_line_per_tick_says_action_sha_outcome_code_duration_exit() {
        let sha = "ab".repeat(32);
        let st = State {
            last_action: Some("apply".into()),
            desired_sha: Some(sha.clone()),
            last_result: Some("failed".into()),
            last_error: Some("UNHEALTHY: web-1 (unhealthy)".into()),
            last_code: Some(Code::Unhealthy),
            repeats: 14,
            ..State::default()
        };
        assert_eq!(
            summary_line(&st, Exit::Fail, Duration::from_millis(14_200)),
            "tick: action=apply sha=abababababab outcome=failed code=UNHEALTHY duration=14.2s \
             exit=1 owner=\"bundle author\" (same UNHEALTHY as the last 14 ticks)"
        );
        let fine = State {
            last_action: Some("none".into()),
            applied_sha: Some(sha),
            last_result: Some("applied".into()),
            ..State::default()
        };
        assert_eq!(
            summary_line(&fine, Exit::Ok, Duration::from_millis(80)),
            "tick: action=none sha=abababababab outcome=applied code=- duration=0.1s exit=0"
        );
        let down = State {
            last_error: Some("TENANCY_UNAVAILABLE: refused".into()),
            last_code: Some(Code::TenancyUnavailable),
            ..State::default()
        };
        assert_eq!(
            summary_line(&down, Exit::Temporary, Duration::from_secs(2)),
            "tick: action=- sha=- outcome=temporary code=TENANCY_UNAVAILABLE duration=2.0s \
             exit=75 owner=\"no one (retries on its own)\""
        );
    }

    #[test]
    fn an_error_line_is_one_short_line() {
        assert_eq!(one_line("a\n\n b \n", 100), "a | b");
        let long = "x".repeat(500);
        assert_eq!(one_line(&long, 240).chars().count(), 243);
        assert_eq!(one_line("é".repeat(3).as_str(), 2), "éé...");
    }

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
}
