//! One tick: lock, token, checkin, then heartbeat, retire or apply, report, upkeep, save.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use monky_agent_proto as proto;
use monky_bao_client as bao;
use monky_compose as compose;
use proto::{Action, Sha};
use tracing::{info, warn};

use crate::code::Code;
use crate::config::Config;
use crate::exit::{Exit, Failure};
use crate::state::{self, SeenContainer, State};
use crate::{fsx, logging, metrics, peers, redact};

mod apply;
mod backoff;
mod bootstrap;
mod checkin;
mod fallback;
mod heal;
mod heartbeat;
mod journal;
mod outcome;
mod stages;
mod token;

use journal::{log_error, summary};
use outcome::Outcome;

pub use backoff::failure_backoff;
pub use bootstrap::bootstrap_command;
pub use token::MAX_GRANT_BYTES;

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
    /// The whole tick after the lock: token, checkin, action.
    fn converge(&mut self) -> anyhow::Result<Exit> {
        self.ensure_token()?;
        let resp = self.checkin()?;
        self.learn_token_facts();
        self.state.last_action = Some(resp.action.as_str().to_owned());
        self.state.last_checkin = Some(state::now());
        // State keeps the sha's text until it holds the type.
        self.state.desired_sha = resp.desired_sha().map(ToString::to_string);
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
            resp.desired_sha().map_or("-", Sha::short),
            self.applied_sha().as_ref().map_or("-", Sha::short)
        );
        if let Some(hold) = self.hold.clone() {
            return self.held(&hold, &resp.action);
        }
        if let Some(exit) = self.recover_interrupted(&resp.action)? {
            return Ok(exit);
        }
        match &resp.action {
            Action::None { .. } => self.heartbeat(),
            Action::Down { purge_volumes, .. } => {
                let sha = self.state.applied_sha.clone();
                self.retire(*purge_volumes)
                    .inspect_err(|e| self.conclude_error(sha.as_deref(), e))
            }
            // The sha is 64 lowercase hex digits, or the answer never decoded: safe in a path,
            // a URL and a comparison with the release's own.
            Action::Apply { sha, bundle_url } => {
                if self.state.failed_sha.as_deref() != Some(sha.as_str()) {
                    // Tenancy wants something else now: the old failure no longer counts.
                    self.state.clear_failed();
                }
                if let Some(deadline) = self.backoff_deadline(sha) {
                    return self.report_waiting(sha, deadline);
                }
                self.apply(sha, bundle_url)
                    .inspect_err(|e| self.conclude_error(Some(sha.as_str()), e))
            }
        }
    }

    /// The applied sha. State keeps its text until it holds the type; a text that is no sha
    /// (a hand-edited state.json) names no release.
    fn applied_sha(&self) -> Option<Sha> {
        let text = self.state.applied_sha.as_deref()?;
        Sha::parse(text).ok()
    }

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
