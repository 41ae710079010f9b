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
