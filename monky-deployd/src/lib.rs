//! monky-deployd: the agent that composes the protocol crates into ticks.
//!
//! [`run`] is the whole program behind `main`: it reads the config, runs the command and returns
//! the exit status. A tick ([`tick::run_once`]) takes the state dir's lock, makes sure it holds
//! an OpenBao token, checks in with tenancy and then heartbeats, retires or applies.

pub mod checks;
pub mod cli;
pub mod config;
pub mod doctor;
pub mod exit;
pub mod explain;
mod failpoint;
mod fsx;
mod host;
pub mod logging;
pub mod metrics;
mod peers;
pub mod redact;
mod release;
mod runloop;
pub mod state;
pub mod status;
pub mod tick;

use crate::cli::{BundleCommand, Cli, Command};
use crate::config::Config;
use crate::exit::Exit;

/// The agent's version, reported in checkin.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

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

/// Runs a parsed command line; the returned status is the process's.
pub fn run(cli: Cli) -> anyhow::Result<Exit> {
    let load = || -> anyhow::Result<Config> {
        let cfg = Config::load(&cli.config)?;
        logging::init(&cfg.log_level);
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
        } => checks::bundle_check(&path, &env_id, &kv_mount, sha.as_deref()),
        Command::Version => {
            println!("monky-deployd {VERSION}");
            Ok(Exit::Ok)
        }
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
    }
}

#[cfg(test)]
mod tests {
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
