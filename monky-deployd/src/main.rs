//! The `monky-deployd` binary: parse, run, map the outcome to the documented exit status.

use std::process::ExitCode;

use clap::Parser;
use monky_deployd::exit::Exit;

fn main() -> ExitCode {
    monky_deployd::install_panic_hook();
    monky_deployd::protect_memory();
    let cli = monky_deployd::cli::Cli::parse();
    match monky_deployd::run(cli) {
        Ok(exit) => ExitCode::from(exit.code()),
        Err(e) => {
            let exit = Exit::of(&e);
            eprintln!(
                "monky-deployd: {}",
                monky_deployd::redact::redact(&format!("{e:#}"))
            );
            ExitCode::from(exit.code())
        }
    }
}
