//! A renderer's check of a bundle before it publishes it, as tenancy would run it: the bundle
//! built in memory, judged by the same offline verdict the agent runs at apply time, and every
//! refusal printed. Exits non-zero if the verdict is not the expected one.
//!
//! `cargo run -p monky-bundle --example render_check`

use std::collections::BTreeMap;
use std::process::ExitCode;

use monky_bundle::{
    Bundle, ComposePolicy, Limits, MemberName, RefusalCode, Verdict, bundle_sha, pack_tar,
};

const ENV: &str = "env-qa-02";

/// A bundle for `ENV` with this compose file and these manifest paths (one variable each).
fn render(compose: &str, secrets: &[(&str, &str)]) -> Vec<u8> {
    let template: String = secrets
        .iter()
        .map(|(var, _)| format!("{var}=${{{var}}}\n"))
        .collect();
    let entries: Vec<String> = secrets
        .iter()
        .map(|(var, path)| {
            format!(r#"{{"var":"{var}","path":"{path}","kind":"supplied","version":1}}"#)
        })
        .collect();
    let files = BTreeMap::from([
        (MemberName::DOCKER_COMPOSE_YML, compose.as_bytes().to_vec()),
        (MemberName::ENV_TEMPLATE, template.into_bytes()),
        (
            MemberName::SECRETS_MANIFEST,
            format!(
                r#"{{"vault_mode":"openbao","entries":[{}]}}"#,
                entries.join(",")
            )
            .into_bytes(),
        ),
        (
            MemberName::BUNDLE_JSON,
            format!(r#"{{"env_id":"{ENV}","tier":"dev","renderer":"compose"}}"#).into_bytes(),
        ),
    ]);
    pack_tar(&files)
}

/// Parses and judges a rendered bundle as the box will; prints the verdict.
fn check(name: &str, tar: &[u8]) -> Result<Vec<RefusalCode>, String> {
    let bundle = Bundle::parse(tar, &Limits::default()).map_err(|e| format!("{name}: {e}"))?;
    // The box's defaults for this env: its project name and the default budget.
    let policy = ComposePolicy::new(&format!("monky-{ENV}"));
    let verdict = Verdict::offline(&bundle, ENV, "monky", &policy);
    println!("{name}: sha256 {}", bundle.sha());
    for resolved in verdict.entries() {
        let path = &resolved.path;
        println!("  reads {path}");
    }
    for refusal in verdict.refusals() {
        println!("  REFUSED {refusal}");
    }
    if verdict.refusals().is_empty() {
        println!("  ok: the box will accept it");
    }
    Ok(verdict.refusals().iter().map(|r| r.code).collect())
}

fn main() -> ExitCode {
    let good = render(
        "services:\n  web:\n    image: nginx:1.27\n    environment:\n      DB_PASSWORD: ${DB_PASSWORD}\n",
        &[("DB_PASSWORD", "monky/env-qa-02/see/db_password")],
    );
    let bad = render(
        "services:\n  web:\n    image: nginx:1.27\n    network_mode: host\n    command: serve --token ${TOKEN}\n",
        &[
            ("TOKEN", "monky/env-qa-02/see/token"),
            ("STOLEN", "monky/env-qa-03/see/token"),
        ],
    );
    let expected_bad = [
        RefusalCode::ManifestPathRefused,
        RefusalCode::PrivilegedRefused,
        RefusalCode::SecretOnCommandLine,
    ];
    let outcome = check("good", &good).and_then(|codes| {
        if !codes.is_empty() {
            return Err(format!("good bundle refused: {codes:?}"));
        }
        let codes = check("bad", &bad)?;
        if codes != expected_bad {
            return Err(format!("bad bundle: {codes:?}, expected {expected_bad:?}"));
        }
        // The sha is the protocol's content hash: the one tenancy publishes as desired.
        let b = Bundle::parse(&good, &Limits::default()).map_err(|e| e.to_string())?;
        let again = bundle_sha(b.files().iter().map(|(n, c)| (n.as_str(), c.as_slice())));
        if &again != b.sha() {
            return Err("the bundle sha is not stable".into());
        }
        Ok(())
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("render_check: {e}");
            ExitCode::FAILURE
        }
    }
}
