//! One tick: lock, token, checkin, then heartbeat, retire or apply, report, upkeep, save. The
//! box's clients are the `Agent`; what one tick learns is its `Tick`; a `Run` of the two
//! drives the tick and folds what its steps found into the state (`Run::record`).

use std::time::Duration;

use anyhow::Context;
use monky_agent_proto as proto;
use monky_bao_client as bao;
use monky_compose as compose;
use proto::{Action, Sha};
use tracing::{info, warn};

use crate::code::{Code, CodePolicy as _};
use crate::config::Config;
use crate::exit::{Exit, Failure, OrCode as _};
use crate::layout::Layout;
use crate::state::{self, Fact, SeenContainer, State};
use crate::{logging, metrics, peers, redact};

mod apply;
pub(crate) mod backoff;
mod bootstrap;
mod checkin;
mod fallback;
mod heal;
mod heartbeat;
mod journal;
mod look;
mod outcome;
mod stages;
mod token;

use journal::{log_error, summary};
use outcome::Outcome;

pub(crate) use bootstrap::bootstrap_command;
pub(crate) use token::MAX_GRANT_BYTES;

/// How a tick was asked to run.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TickOptions {
    /// Drop old releases and prune images after a successful apply.
    pub(crate) prune: bool,
    /// Apply now even if the desired sha is waiting out a failure backoff.
    pub(crate) force: bool,
}

/// What a tick ended with, for the loop's pacing.
#[derive(Debug)]
pub(crate) struct TickOutcome {
    /// The process status this tick maps to.
    pub(crate) exit: Exit,
    /// Tenancy's checkin interval, when it said one.
    pub(crate) interval: Option<Duration>,
    /// Retry-After from a 429.
    pub(crate) retry_after: Option<Duration>,
}

/// Runs one tick and maps its result to an exit status; errors are logged, redacted, here.
pub(crate) fn run_once(cfg: &Config, opts: TickOptions) -> TickOutcome {
    let started = std::time::Instant::now();
    let (outcome, ended) = run_tick(cfg, opts);
    // The state the tick saved, as it holds it: read again only when it ended before it had one.
    let st = ended.unwrap_or_else(|| State::peek(&Layout::peek(cfg)));
    // Offline on a laptop is one quiet line, already written.
    let offline = cfg.laptop_mode
        && outcome.exit == Exit::Ok
        && st.last_error().is_some()
        && st.last_code().is_some_and(|c| c.exit() == Exit::Temporary);
    if !offline {
        summary(&st, outcome.exit, started.elapsed());
    }
    write_metrics(cfg, &st, outcome.exit, started.elapsed());
    outcome
}

/// The end of a tick its deadline cut short, as any tick ends: the summary line and the
/// metrics of the state the deadline recorded (`TICK_TIMEOUT`, exit 75).
fn end_timed_out(cfg: &Config, st: &State, took: Duration) {
    summary(st, Exit::Temporary, took);
    write_metrics(cfg, st, Exit::Temporary, took);
}

/// The metrics textfile of a tick that ended with `exit` after `took`, when the config asks
/// for one.
fn write_metrics(cfg: &Config, st: &State, exit: Exit, took: Duration) {
    if let Some(path) = &cfg.metrics_textfile {
        let facts = metrics::TickFacts {
            exit,
            duration: took,
            ended_at: crate::clock::wall(),
            ended_boot: crate::clock::boot(),
        };
        if let Err(e) = metrics::write(path, &metrics::render(&cfg.env_id, st, facts)) {
            warn!("cannot write the metrics file {}: {e:#}", path.display());
        }
    }
}

/// Runs the tick; with its outcome, the state it ended with, when it got as far as one.
fn run_tick(cfg: &Config, opts: TickOptions) -> (TickOutcome, Option<State>) {
    logging::start_capture();
    let mut retry_after = None;
    let mut interval = None;
    let mut ended = None;
    let exit = match tick(cfg, opts, &mut interval, &mut ended) {
        Ok(exit) => exit,
        Err(e) => {
            // The tenancy error itself was turned into a Failure on the way up; it kept the
            // wait tenancy asked for.
            retry_after = e.retry_after;
            let exit = e.exit();
            if exit == Exit::Temporary && cfg.laptop_mode {
                info!("offline (laptop mode): {}", redact::redact(&e.message));
                Exit::Ok
            } else {
                let repeats = match &ended {
                    Some(st) => st.repeats(),
                    None => State::peek(&Layout::peek(cfg)).repeats(),
                };
                log_error(&e, repeats > 0);
                exit
            }
        }
    };
    let outcome = TickOutcome {
        exit,
        interval,
        retry_after,
    };
    (outcome, ended)
}

fn tick(
    cfg: &Config,
    opts: TickOptions,
    interval: &mut Option<Duration>,
    ended: &mut Option<State>,
) -> Result<Exit, Failure> {
    let layout = Layout::open(cfg).or_code(Code::StateWriteFailed)?;
    let Some(_lock) = layout.lock().or_code(Code::StateWriteFailed)? else {
        info!("another tick holds the lock; nothing to do");
        return Ok(Exit::Ok);
    };
    // Declared after the lock, so dropped before it: the deadline stops, then the lock goes.
    let deadline = crate::watchdog::arm(cfg, &layout, end_timed_out);
    end_orphans(&layout)?;
    let (mut state, note) = crate::statefile::load(&layout).or_code(Code::Failed)?;
    if let Some(note) = note {
        warn!("{note}");
    }
    // This tick's action, once tenancy answers; none if it never does.
    state.fold(state::Fact::TickBegan);
    let mut run = Run::new(cfg, layout, state, opts)?;
    run.agent.tick_deadline = Some(deadline.deadline());
    let result = run.converge();
    run.token_upkeep(&result);
    let result = run.judge_clock(result);
    // Clamped again: a state.json written before the bounds existed may hold any number.
    *interval = run
        .tick
        .state
        .checkin_interval_s()
        .map(|s| proto::CheckinInterval::from_secs(s).get());
    let saved = run.finish(&result);
    *ended = Some(std::mem::take(&mut run.tick.state));
    match (result, saved) {
        // Converged, but the next tick would not know it: as much a failure as any other.
        (Ok(_), Err(e)) => Err(e),
        (result, Err(e)) => {
            tracing::error!("{}", e.full());
            result
        }
        (result, Ok(())) => result,
    }
}

/// How long a call a killed tick left running gets to end on a SIGTERM (and then on a SIGKILL).
const ORPHAN_GRACE: Duration = Duration::from_secs(10);

/// Ends the docker and compose calls a killed tick left running (its lock went with it, its
/// children did not: they lead process groups of their own), before this tick makes any call
/// of its own, so two `compose up`s of the project never run at once. One that does not end
/// fails the tick.
fn end_orphans(layout: &Layout) -> Result<(), Failure> {
    let dir = layout.children().or_code(Code::StateWriteFailed)?;
    let found = compose::process::end_orphans(dir.path(), ORPHAN_GRACE)
        .with_context(|| format!("cannot list {}", dir.path().display()))
        .or_code(Code::Failed)?;
    for orphan in found {
        if !orphan.ended {
            return Err(Failure::coded(
                Code::Failed,
                format!(
                    "process group {} that a killed tick left running (a docker or compose \
                     call) outlived a SIGTERM and a SIGKILL, so this tick runs none of its own \
                     beside it: look at it with `ps -g {}`",
                    orphan.group, orphan.group
                ),
            ));
        }
        warn!(
            "ended process group {} (a docker or compose call) that a killed tick left running, \
             before this tick's own calls",
            orphan.group
        );
    }
    Ok(())
}

/// The box as one tick's run of it sees it: its config, state dir and clients (tenancy,
/// OpenBao, docker), and nothing a tick learns. What a tick learns is its [`Tick`].
pub(crate) struct Agent<'a> {
    pub(crate) cfg: &'a Config,
    /// The state dir, opened once for the tick.
    pub(crate) layout: Layout,
    opts: TickOptions,
    tenancy: proto::Client,
    /// The peers' listeners judged the box's at an earlier tick (see `peers::Listeners`).
    listeners: std::sync::Arc<peers::Listeners>,
    /// Built on first use: a heartbeat never speaks to OpenBao, and building the client costs
    /// a runtime and the CA bundle's parsing (or the system's roots without one).
    bao: std::cell::OnceCell<bao::BaoClient>,
    docker: compose::Docker,
    /// When the tick's deadline (`tick_timeout_s`) passes; `None` for a run without one (the
    /// bootstrap). Every start of a release is budgeted inside it (see `fallback.rs`).
    tick_deadline: Option<std::time::Instant>,
}

/// What one tick has learned so far: the state it folds its facts into, and the flags and
/// looks of this tick alone. Made new for every tick; nothing of it outlives the tick but the
/// state it saves.
pub(crate) struct Tick {
    pub(crate) state: State,
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
    previous: (Option<Code>, Option<crate::redact::Redacted>),
    /// The tick's outcome went out (`conclude`): it goes out once.
    concluded: bool,
    /// What this tick has judged already, so the gate before `up` does not ask the engine
    /// again about the release the apply judged and pulled moments before: the shas whose
    /// names passed, and the image references this tick pulled.
    judged: std::cell::RefCell<Judged>,
}

/// One tick's run: the box's [`Agent`] and what the [`Tick`] has learned.
pub(crate) struct Run<'a> {
    pub(crate) agent: Agent<'a>,
    pub(crate) tick: Tick,
}

/// See [`Tick::judged`].
#[derive(Debug, Default)]
struct Judged {
    names: std::collections::HashSet<Sha>,
    pulled: std::collections::BTreeSet<String>,
    /// The manifest entry the registry credential came from and its OpenBao path, named when
    /// the registry rejects the credential.
    registry_entry: Option<String>,
}

impl<'a> Run<'a> {
    pub(crate) fn new(
        cfg: &'a Config,
        layout: Layout,
        state: State,
        opts: TickOptions,
    ) -> Result<Self, Failure> {
        let mut builder = compose::Docker::builder(cfg.docker_bin.clone())
            .docker_config(crate::layout::docker_config_dir(&cfg.state_dir))
            .ledger(layout.children().or_code(Code::StateWriteFailed)?.path());
        if let Some(hint) = state.compose().cloned() {
            builder = builder.compose_hint(hint);
        }
        if let Some(hint) = state.engine().cloned() {
            builder = builder.engine_hint(hint);
        }
        let docker = builder.build().context("docker").or_code(Code::Failed)?;
        let hold = crate::hold::load(&layout, state.clock()).or_code(Code::Failed)?;
        let listeners = std::sync::Arc::new(peers::Listeners::load(&layout));
        let mut state = state;
        state.fold(state::Fact::HoldFound(hold.clone()));
        let agent = Agent {
            tenancy: peers::tenancy(cfg, Some(&listeners)).or_code(Code::Failed)?,
            listeners,
            bao: std::cell::OnceCell::new(),
            docker,
            cfg,
            layout,
            opts,
            tick_deadline: None,
        };
        let tick = Tick {
            previous: (state.last_code(), state.last_error().cloned()),
            judged: std::cell::RefCell::default(),
            state,
            token: None,
            docker_error: None,
            facts: Vec::new(),
            hold,
            marker_settled: false,
            concluded: false,
        };
        Ok(Self { agent, tick })
    }
}

impl Agent<'_> {
    /// The OpenBao client, built the first time a tick needs it.
    fn bao(&self) -> Result<&bao::BaoClient, Failure> {
        if let Some(client) = self.bao.get() {
            return Ok(client);
        }
        let client = peers::openbao(self.cfg, Some(&self.listeners)).or_code(Code::Failed)?;
        Ok(self.bao.get_or_init(|| client))
    }

    /// The KV mount secrets are read from: tenancy's, once adopted, else the config's.
    fn kv_mount(&self, state: &State) -> String {
        state
            .kv_mount()
            .map_or_else(|| self.cfg.bao.kv_mount.clone(), str::to_owned)
    }
}

impl Run<'_> {
    /// Reads OpenBao's clock from its last answer of this tick, if any, and judges the box's
    /// clock by the latest reading: off by more than a certificate check tolerates, a tick that
    /// did its action ends `TLS_CLOCK` (the report already went: the release is fine, the box
    /// is not), and a tick that failed otherwise keeps its own code and warns.
    fn judge_clock(&mut self, result: Result<Exit, Failure>) -> Result<Exit, Failure> {
        let boot = crate::clock::boot();
        if let Some(d) = self.agent.bao.get().and_then(bao::BaoClient::server_date) {
            self.record(Fact::ClockRead(crate::clock::ClockReading::of(
                d.date,
                d.sent,
                d.received,
                boot.as_ref(),
            )));
        }
        let Some(problem) =
            (self.tick.state.clock()).and_then(|r| r.problem(crate::clock::wall(), boot.as_ref()))
        else {
            return result;
        };
        match result {
            Ok(Exit::Ok) => Err(Failure::coded(Code::TlsClock, problem)),
            other => {
                warn!("{}", Failure::coded(Code::TlsClock, problem));
                other
            }
        }
    }

    /// The whole tick after the lock: token, checkin, action.
    fn converge(&mut self) -> Result<Exit, Failure> {
        self.ensure_token()?;
        let resp = self
            .checkin()
            .inspect_err(|e| self.conclude_checkin_error(e))?;
        self.learn_token_facts();
        let wanted_before = self.tick.state.desired_sha().cloned();
        self.record(Fact::CheckedIn {
            action: resp.action.kind(),
            desired: resp.desired_sha().cloned(),
            interval_s: resp.checkin_interval_s.map(|i| i.as_secs()),
            at: crate::clock::wall(),
        });
        // A new desired sha is saved before its fetch and pull, which can take minutes and be
        // cut short by a kill or the tick's deadline: `status` then names what tenancy wants,
        // not the sha before it. A heartbeat writes nothing here.
        if self.tick.state.desired_sha() != wanted_before.as_ref()
            && let Err(e) = self.tick.state.save(&self.agent.layout)
        {
            warn!("cannot save the desired sha before applying it ({e:#})");
        }
        if let Some(mount) = resp.vault.as_ref().and_then(|v| v.mount.clone()) {
            if mount != self.agent.cfg.bao.kv_mount && self.tick.state.kv_mount() != Some(&mount) {
                info!(
                    "adopting KV mount {mount:?} from tenancy (config says {:?})",
                    self.agent.cfg.bao.kv_mount
                );
            }
            self.record(Fact::KvMountAdopted(
                (mount != self.agent.cfg.bao.kv_mount).then_some(mount),
            ));
        }
        info!(
            "checkin: action={} desired={} applied={}",
            resp.action,
            resp.desired_sha().map_or("-", Sha::short),
            self.tick.state.applied_sha().map_or("-", Sha::short)
        );
        if let Some(hold) = self.tick.hold.clone() {
            return self.held(&hold, &resp.action);
        }
        if let Some(exit) = self.recover_interrupted(&resp.action)? {
            return Ok(exit);
        }
        match &resp.action {
            Action::None { .. } => self.heartbeat(),
            Action::Down { purge_volumes, .. } => {
                let sha = self.tick.state.applied_sha().cloned();
                self.retire(*purge_volumes)
                    .inspect_err(|e| self.conclude_error(sha.as_ref(), e))
            }
            // The sha is 64 lowercase hex digits, or the answer never decoded: safe in a path,
            // a URL and a comparison with the release's own.
            Action::Apply { sha, bundle_url } => {
                if self.tick.state.failed().is_some_and(|f| f.sha != *sha) {
                    // Tenancy wants something else now: the old failure no longer counts.
                    self.record(Fact::FailureForgotten);
                }
                if let Some(deadline) = self.backoff_deadline(sha) {
                    return self.report_waiting(sha, deadline);
                }
                apply::apply(self, sha, bundle_url)
                    .inspect_err(|e| self.conclude_error(Some(sha), e))
            }
        }
    }

    /// Folds what a step found into the state: the tick's one way to change it.
    pub(crate) fn record(&mut self, fact: Fact) {
        self.tick.state.fold(fact);
    }
}

/// The containers that are not up (running and healthy, or a one-shot that completed), as
/// `name (state or health)`.
fn not_ready(containers: &[SeenContainer]) -> Vec<String> {
    containers
        .iter()
        .filter(|c| !c.is_ready())
        .map(|c| format!("{} ({})", c.name, c.health.as_deref().unwrap_or(&c.state)))
        .collect()
}
