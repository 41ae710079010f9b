//! The command line: `monky-deployd [--config PATH] <command>`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::DEFAULT_CONFIG_PATH;

/// The on-box pull agent for Monky backends.
#[derive(Debug, Parser)]
#[command(name = "monky-deployd", version = crate::VERSION, about, long_about = None)]
pub struct Cli {
    /// The config file.
    #[arg(
        long,
        global = true,
        env = "MONKY_DEPLOYD_CONFIG",
        default_value = DEFAULT_CONFIG_PATH,
        value_name = "PATH"
    )]
    pub config: PathBuf,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one tick (what the timer runs), or loop without a timer.
    Run {
        /// One tick, then exit with its status.
        #[arg(long)]
        once: bool,
        /// After a successful apply, drop old releases and prune unused images.
        #[arg(long)]
        prune: bool,
    },
    /// Show token, applied and desired sha, last checkin and report, and containers.
    Status {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Log in to OpenBao with the kit's bootstrap grant and store the token.
    Bootstrap {
        /// Replace an existing token.
        #[arg(long)]
        force: bool,
    },
    /// Print the version.
    Version,
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
                prune: false
            }
        ));
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
