//! The tick's deadline (`tick_timeout_s`): a watchdog thread that ends a tick still running
//! when it passes.
//!
//! Every call of a tick has a deadline of its own, but a tick makes many, and nothing can
//! interrupt a blocking call from outside. So at the tick's deadline the watchdog ends the
//! process: it logs `TICK_TIMEOUT`, records the timeout in state.json for `status` and
//! `explain` (a repeat counted as any tick's), writes the tick's summary line and its metrics
//! as every tick does, kills every docker child (their process groups would otherwise outlive
//! the agent) and exits 75, which releases the state dir's flock. Files are never left half written:
//! every write of the agent is a temp file renamed into place, and the record in state.json is
//! taken under the lock that the tick's own save takes too.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;

use tracing::{error, warn};

use crate::code::Code;
use crate::config::Config;
use crate::layout::Layout;
use crate::state::{self, State};

/// A running deadline; dropping it (the tick ended in time) stops the watchdog.
pub(crate) struct Watchdog {
    /// When the tick's deadline passes.
    deadline: std::time::Instant,
    disarm: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// How a tick ends once its deadline recorded the timeout: its summary line and metrics, as
/// any tick's end writes them (the tick's own `end_timed_out`).
pub(crate) type End = fn(&Config, &State, std::time::Duration);

/// Starts the deadline of a tick that runs for `cfg`; `end` writes what every tick's end
/// writes.
pub(crate) fn arm(cfg: &Config, layout: &Layout, end: End) -> Watchdog {
    let (disarm, disarmed) = mpsc::channel::<()>();
    let limit = cfg.tick_timeout;
    let started = std::time::Instant::now();
    let cfg = cfg.clone();
    // Its own fd on the tick's state dir: the tick's is not the thread's to borrow.
    let layout = layout.try_clone();
    let thread = std::thread::Builder::new()
        .name("tick-deadline".into())
        .spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = disarmed.recv_timeout(limit) {
                expire(&cfg, started, layout, end);
            }
        });
    let thread = match thread {
        Ok(t) => Some(t),
        Err(e) => {
            warn!("cannot start the tick's deadline ({e}); this tick runs without one");
            None
        }
    };
    Watchdog {
        deadline: started + limit,
        disarm: Some(disarm),
        thread,
    }
}

impl Watchdog {
    /// When the tick's deadline passes: a start of a release is budgeted so that the fallback
    /// after it still ends before this.
    #[must_use]
    pub(crate) fn deadline(&self) -> std::time::Instant {
        self.deadline
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Closing the channel wakes the watchdog, which then returns.
        self.disarm.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Ends the process: the tick ran past `cfg`'s limit.
fn expire(
    cfg: &Config,
    started: std::time::Instant,
    layout: anyhow::Result<Layout>,
    end: End,
) -> ! {
    let limit = cfg.tick_timeout;
    let failure = crate::exit::Failure::coded(
        Code::TickTimeout,
        format!(
            "the tick ran past tick_timeout_s ({}s); its docker commands were killed and the \
             next tick starts over",
            limit.as_secs()
        ),
    );
    let detail = failure.to_string();
    error!("{detail}");
    // Held until the process is gone: the tick cannot save over this record afterwards.
    let _no_more_saves = state::save_lock();
    match layout.and_then(|l| crate::statefile::load(&l).map(|loaded| (l, loaded))) {
        Ok((layout, (mut st, _))) => {
            // The one outcome not recorded by `Run::conclude`: the tick cannot conclude any
            // more, so its deadline folds the timeout in as the one fact it adds.
            st.fold(state::Fact::TimedOut(crate::redact::redact(&detail)));
            if let Err(e) = st.save_holding_lock(&layout) {
                error!("cannot record the timeout in state.json: {e:#}");
            }
            end(cfg, &st, started.elapsed());
        }
        Err(e) => error!("cannot record the timeout in state.json: {e:#}"),
    }
    // Last, right before the exit: a call whose child dies returns to the tick, and the tick
    // should get no time to act on that (a fallback `up`, a report) before the process ends.
    monky_compose::process::kill_all();
    std::process::exit(i32::from(failure.exit().code()));
}
