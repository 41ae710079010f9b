//! The shared vocabulary as tenancy's tooling uses it: a sha from a request checked and
//! compared with a computed digest, a manifest path judged as a box judges it, and a report's
//! code kept even when it is newer than this version. Exits non-zero if any step does not do
//! what it shows.
//!
//! `cargo run -p monky-vocab --example vocabulary`

use std::process::ExitCode;

use monky_vocab::{AnyReportCode, KvPath, PathRefusal, ReportCode, ReportResult, Sha};

fn run() -> Result<(), String> {
    // A desired sha as an operator typed it: padding or capitals are refused, not folded.
    let typed = "7A10".repeat(16);
    if Sha::parse(&typed).is_ok() {
        return Err("an upper-case sha was accepted".into());
    }
    let desired = Sha::parse(&typed.to_lowercase()).map_err(|e| e.to_string())?;
    // The digest a bundle was hashed to, as the bundle crate computes it, is the same type.
    let computed = Sha::from_digest(&desired.digest());
    if computed != desired {
        return Err(format!("{computed} is not {desired}"));
    }
    println!("desired {} matches the bundle's content", desired.short());

    // A manifest path is the env's own `see/` secret, or refused before any request.
    let own = KvPath::parse("monky/env-qa-02/see/db_password", "monky", "env-qa-02")
        .map_err(|e| e.to_string())?;
    println!("reads {}", own.api_path());
    match KvPath::parse("monky/env-qa-03/see/db_password", "monky", "env-qa-02") {
        Err(refused) if refused.path_refusal() == PathRefusal::OtherEnv => {
            println!("refused: {refused}");
        }
        other => return Err(format!("another env's path: {other:?}")),
    }

    // A report from a newer agent: its code is kept verbatim, a known one is typed.
    let report = r#"{"result": "failed", "code": "FROM_A_NEWER_AGENT"}"#;
    let value: serde_json::Value = serde_json::from_str(report).map_err(|e| e.to_string())?;
    let result: ReportResult =
        serde_json::from_value(value["result"].clone()).map_err(|e| e.to_string())?;
    let code: AnyReportCode =
        serde_json::from_value(value["code"].clone()).map_err(|e| e.to_string())?;
    if result != ReportResult::Failed || code.known().is_some() {
        return Err(format!("decoded {result} {code}"));
    }
    println!("report {result}: {code} (unknown here, kept)");
    if AnyReportCode::from("UNHEALTHY").known() != Some(ReportCode::Unhealthy) {
        return Err("a known code was not typed".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vocabulary: {e}");
            ExitCode::FAILURE
        }
    }
}
