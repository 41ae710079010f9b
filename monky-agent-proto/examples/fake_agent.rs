//! A fake agent against tenancy's side of the protocol, as a tenancy test would play one: the
//! `monky-testkit`'s `FakeTenancy` stands in for tenancy here, and the agent's half speaks only this
//! crate's wire types and client. The agent checks in, fetches the bundle it is told to run,
//! reports a failure with a code of the report vocabulary, and tenancy reads that code back.
//! Exits non-zero if any step does not do what it shows.
//!
//! `cargo run -p monky-agent-proto --example fake_agent`

use std::process::ExitCode;

use monky_agent_proto::{Action, AnyReportCode, ReportCode, ReportResult, bundle_path};
use monky_testkit::tenancy::{Desired, FakeTenancy, checkin_request, report_request};

const ENV: &str = "env-qa-02";

fn run() -> Result<(), String> {
    let tenancy = FakeTenancy::builder().start();
    let sha = "7a10".repeat(16);
    tenancy.publish_bundle(ENV, &sha, b"a rendered bundle".to_vec());
    tenancy.set_desired(ENV, Desired::sha(&sha));
    // The bearer an agent holds after its login (here one the fake knows without OpenBao).
    let bearer = tenancy.issue_token(ENV);
    let client = tenancy.client();

    // The agent: check in, learn the desired sha, fetch its bundle.
    let answer = client
        .checkin(&bearer, &checkin_request(ENV))
        .map_err(|e| format!("checkin: {e}"))?;
    // The action carries its data: an apply always has its sha and where to fetch it.
    let Action::Apply {
        sha: desired,
        bundle_url: url,
    } = answer.action
    else {
        return Err(format!(
            "tenancy answered {:?}, not an apply",
            answer.action
        ));
    };
    println!("agent: tenancy wants {} (apply)", desired.short());
    if desired.as_str() != sha {
        return Err(format!("desired {desired:?}, published {sha}"));
    }
    if url != bundle_path(ENV, desired.as_str()) {
        return Err(format!(
            "the bundle is at {url}, not the protocol's default path"
        ));
    }
    let bundle = client
        .bundle(&bearer, &url)
        .map_err(|e| format!("bundle: {e}"))?;
    println!("agent: fetched {} bytes from {url}", bundle.bytes.len());
    if bundle.bytes != b"a rendered bundle" {
        return Err("the bundle is not the one published".into());
    }

    // It did not come up: the report's detail starts with a code of the vocabulary.
    let mut report = report_request(ENV, ReportResult::Failed);
    report.sha = Some(monky_agent_proto::Sha::parse(&sha).expect("the fake answers a sha"));
    report.detail = Some(format!("{}: web (exit 1)", ReportCode::Unhealthy));
    client
        .report(&bearer, &report)
        .map_err(|e| format!("report: {e}"))?;

    // Tenancy: what it received, and the code it can act on.
    let received = tenancy.reports(ENV);
    let last = received.last().ok_or("tenancy recorded no report")?;
    let detail = last.detail.as_deref().unwrap_or_default();
    let code = AnyReportCode::from(detail.split_once(':').map_or(detail, |(c, _)| c));
    println!(
        "tenancy: {} for {}: {detail}",
        last.result.as_str(),
        last.sha.as_ref().map(|s| s.as_str()).unwrap_or("-")
    );
    if code != AnyReportCode::Known(ReportCode::Unhealthy) || last.result != ReportResult::Failed {
        return Err(format!("tenancy read {code} from {detail:?}"));
    }
    // A code from a newer agent is kept verbatim rather than refused.
    let newer = AnyReportCode::from("FROM_A_NEWER_AGENT");
    if newer.known().is_some() || newer.as_str() != "FROM_A_NEWER_AGENT" {
        return Err(format!("an unknown code was not kept: {newer:?}"));
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake_agent: {e}");
            ExitCode::FAILURE
        }
    }
}
