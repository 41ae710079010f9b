//! The command line: `monky-deployd [--config PATH] <command>`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::DEFAULT_CONFIG_PATH;

pub(crate) mod docs;

/// The on-box pull agent for Monky backends.
#[derive(Debug, Parser)]
#[command(name = "monky-deployd", version = crate::host::VERSION, about, long_about = None)]
pub struct Cli {
    /// The config file.
    #[arg(
        long,
        global = true,
        env = "MONKY_DEPLOYD_CONFIG",
        default_value = DEFAULT_CONFIG_PATH,
        value_name = "PATH"
    )]
    pub(crate) config: PathBuf,

    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run one tick (what the timer runs), or loop without a timer.
    Run {
        /// One tick, then exit with its status.
        #[arg(long)]
        once: bool,
        /// After a successful apply, drop old releases and prune unused images.
        #[arg(long)]
        prune: bool,
        /// Apply now even if a failed release is still waiting out its backoff.
        #[arg(long)]
        force: bool,
    },
    /// Explain, from local state, what runs, what tenancy wants, and why they differ.
    Explain,
    /// Check the box: config, state dir, compose, docker socket, mesh, OpenBao, token, disk, timer.
    Doctor {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Show token, applied and desired sha, last checkin and report, and containers.
    Status {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Hold the box: ticks check in and report, but apply, heal and retire nothing.
    Hold {
        /// Why, for the reports, `status` and `explain` (one line).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// When the hold ends by itself: an RFC 3339 time (2026-12-01T18:00:00Z,
        /// 2026-12-01T19:00:00+01:00) or a duration (2h, 30m, 1day).
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        /// Replace the hold in force (without it, a second hold is refused, naming the first).
        #[arg(long)]
        replace: bool,
    },
    /// End a hold: the next tick converges the box again.
    Unhold,
    /// Print the compose logs and probe outputs kept from a failed release (the newest, or the
    /// one whose sha starts with SHA); run it as the agent's user.
    Logs {
        /// A sha, or its first 7 or more hex digits.
        sha: Option<String>,
    },
    /// Log in to OpenBao with the kit's bootstrap grant and store the token.
    Bootstrap {
        /// Replace an existing token.
        #[arg(long)]
        force: bool,
    },
    /// Offline checks of a bundle on disk, for the renderer's and tenancy's developers.
    Bundle {
        /// What to do with the bundle.
        #[command(subcommand)]
        command: BundleCommand,
    },
    /// Print the version.
    Version,
    /// Write the man pages and shell completions into DIR, a new directory (what
    /// `cargo xtask dist` packages).
    #[command(hide = true)]
    GenerateDocs {
        /// The directory to create.
        dir: PathBuf,
    },
}

/// `bundle` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum BundleCommand {
    /// Run every offline check of an apply on a bundle (a tar or a directory of its members),
    /// the compose policy included (the box's own when its config exists), and compose's own
    /// model when `docker compose` is installed: prints `sha256 <hex>`, then `FAIL CODE: names`
    /// per finding or one `ok` line; exit 0 or 1.
    Check {
        /// The bundle: a .tar, a .tar.gz, or a directory holding its members.
        path: PathBuf,
        /// The env the bundle is for (its manifest paths must be this env's).
        #[arg(long = "env", value_name = "ENV_ID")]
        env_id: String,
        /// The KV mount the manifest paths live under.
        #[arg(long, default_value = "monky")]
        kv_mount: String,
        /// Also check the bundle's sha against this one (BUNDLE_SHA_MISMATCH).
        #[arg(long)]
        sha: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_global_before_or_after_the_command() {
        let a = Cli::try_parse_from(["m", "--config", "/x.yaml", "run", "--once"]).unwrap();
        let b = Cli::try_parse_from(["m", "run", "--once", "--config", "/x.yaml"]).unwrap();
        assert_eq!(a.config, PathBuf::from("/x.yaml"));
        assert_eq!(b.config, PathBuf::from("/x.yaml"));
        assert!(matches!(
            b.command,
            Command::Run {
                once: true,
                prune: false,
                force: false
            }
        ));
    }

    #[test]
    fn hold_takes_a_reason_and_an_end() {
        let c = Cli::try_parse_from(["m", "hold", "--reason", "db work", "--until", "2h"]).unwrap();
        assert!(matches!(
            c.command,
            Command::Hold { reason: Some(ref r), until: Some(ref u), replace: false } if r == "db work" && u == "2h"
        ));
        assert!(matches!(
            Cli::try_parse_from(["m", "unhold"]).unwrap().command,
            Command::Unhold
        ));
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
