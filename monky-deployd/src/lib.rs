//! monky-deployd: the agent that composes the protocol crates into ticks.
//!
//! [`run`] is the whole program behind `main`: it reads the config, runs the command and returns
//! the exit status. A tick (`tick::run_once`) takes the state dir's lock, makes sure it holds
//! an OpenBao token, checks in with tenancy and then heartbeats, retires or applies.

#[macro_use]
mod out;

mod backoff;
pub mod cli;
pub mod clock;
pub mod code;
pub mod config;
pub(crate) mod doctor;
pub(crate) mod drift;
pub(crate) mod evidence;
pub mod exit;
pub(crate) mod explain;
mod failpoint;
mod fsx;
pub(crate) mod hold;
mod host;
pub(crate) mod interrupted;
pub(crate) mod layout;
pub(crate) mod logging;
pub(crate) mod metrics;
pub(crate) mod names;
mod operator;
mod peers;
pub mod redact;
pub(crate) mod refusals;
mod release;
mod resolve;
mod runloop;
pub mod runtime_look;
pub mod shared_uid;
pub(crate) mod state;
mod statefile;
pub(crate) mod status;
pub(crate) mod tick;
pub(crate) mod verdict;
mod watchdog;

use crate::cli::{BundleCommand, Cli, Command};
use crate::config::Config;
use crate::exit::Exit;

pub use crate::host::VERSION;

/// Prints panics through the redactor: the journal keeps whatever stderr gets, and a panic
/// message may quote a value (an `expect` on a formatted request, a parsed secret).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let message = redact::try_redact(&message)
            .unwrap_or_else(|| "(message withheld: the redactor was busy)".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("monky-deployd: internal error{at}: {message}");
        let trace = std::backtrace::Backtrace::capture();
        if trace.status() == std::backtrace::BacktraceStatus::Captured {
            eprintln!("{trace}");
        }
    }));
}

/// Keeps the secrets this process will hold off the disk and away from other processes of its
/// user: no core file (also for the docker CLI it starts, which inherits the limit) and no
/// ptrace or `/proc/<pid>/mem` by the same uid. The unit sets `LimitCORE=0` too; this covers the
/// loop started by hand on a laptop. Best effort: a kernel that refuses leaves the process as
/// it was, which is how the original agent ran.
pub fn protect_memory() {
    use rustix::process::{DumpableBehavior, Resource, Rlimit, set_dumpable_behavior, setrlimit};
    let none = Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    if let Err(e) = setrlimit(Resource::Core, none) {
        eprintln!("monky-deployd: cannot disable core files: {e}");
    }
    if let Err(e) = set_dumpable_behavior(DumpableBehavior::NotDumpable) {
        eprintln!("monky-deployd: cannot mark the process undumpable: {e}");
    }
}

/// Runs a parsed command line; the returned status is the process's.
pub fn run(cli: Cli) -> anyhow::Result<Exit> {
    let load = || -> anyhow::Result<Config> {
        let cfg = Config::load(&cli.config)?;
        logging::init(cfg.log_level);
        Ok(cfg)
    };
    match cli.command {
        Command::Bundle {
            command:
                BundleCommand::Check {
                    path,
                    env_id,
                    kv_mount,
                    sha,
                },
        } => {
            // The box's own policy when this box has a config; the defaults elsewhere (a
            // renderer's CI has no config file) and when this user cannot read it.
            let cfg = if cli.config.exists() {
                Config::load(&cli.config)
                    .map_err(|e| {
                        errln!("note: the default compose policy applies: {e:#}");
                    })
                    .ok()
            } else {
                None
            };
            refusals::bundle_check(&path, &env_id, &kv_mount, sha.as_deref(), cfg.as_ref())
        }
        Command::Version => {
            outln!("monky-deployd {VERSION}");
            Ok(Exit::Ok)
        }
        Command::GenerateDocs { dir } => cli::docs::write(&dir).map(|()| Exit::Ok),
        Command::Run { once, prune, force } => {
            let opts = tick::TickOptions { prune, force };
            if once {
                Ok(tick::run_once(&load()?, opts).exit)
            } else {
                runloop::run(&load()?, opts)
            }
        }
        Command::Explain => explain::show(&load()?),
        Command::Doctor { json } => doctor::show(&load()?, json),
        Command::Status { json } => status::show(&load()?, json),
        Command::Bootstrap { force } => tick::bootstrap_command(&load()?, force),
        Command::Hold {
            reason,
            until,
            replace,
        } => operator::hold_command(&load()?, reason, until, replace),
        Command::Unhold => operator::unhold_command(&load()?),
        Command::Logs { sha } => evidence::show(&load()?, sha.as_deref()),
    }
}

#[cfg(test)]
mod tests {
    /// Changes the process for good, so it runs in a child: this test binary, run again.
    #[test]
    fn protect_memory_leaves_no_core_and_no_dump() {
        use rustix::process::{DumpableBehavior, Resource, dumpable_behavior, getrlimit};
        if std::env::var_os("MONKY_DEPLOYD_PROTECT_CHILD").is_some() {
            assert_eq!(dumpable_behavior().unwrap(), DumpableBehavior::Dumpable);
            super::protect_memory();
            assert_eq!(dumpable_behavior().unwrap(), DumpableBehavior::NotDumpable);
            let core = getrlimit(Resource::Core);
            assert_eq!((core.current, core.maximum), (Some(0), Some(0)));
            // What the agent starts inherits the limit.
            let out = std::process::Command::new("sh")
                .args(["-c", "ulimit -c; ulimit -H -c"])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n0\n");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::protect_memory_leaves_no_core_and_no_dump",
                "--test-threads=1",
            ])
            .env("MONKY_DEPLOYD_PROTECT_CHILD", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("1 passed"), "{stdout}");
    }

    /// The hook is process-wide, so it is installed in a child: this test binary, run again
    /// for this test alone.
    #[test]
    fn a_panic_prints_through_the_redactor() {
        const SECRET: &str = "panic-Secret-Value-0042";
        if std::env::var_os("MONKY_DEPLOYD_PANIC_CHILD").is_some() {
            super::install_panic_hook();
            super::redact::register(SECRET);
            let token = "hvs.CAESIJ7abcdefghijklmnopqrstuv";
            panic!("lost {SECRET} and {token}");
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::a_panic_prints_through_the_redactor",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("MONKY_DEPLOYD_PANIC_CHILD", "1")
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains("monky-deployd: internal error at ") && stderr.contains("src/lib.rs:"),
            "{stderr}"
        );
        assert!(stderr.contains("lost *** and ***"), "{stderr}");
        assert!(!stderr.contains(SECRET), "{stderr}");
        assert!(!stderr.contains("hvs.CAES"), "{stderr}");
    }
}
