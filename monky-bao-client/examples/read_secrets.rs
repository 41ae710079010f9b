//! A box's read of its env's secrets, against `monky-testkit`'s fake OpenBao: each manifest path
//! becomes a `KvPath` (the vocabulary crate's, the same check tenancy's renderer runs) before the
//! client reads it, so another env's path is refused locally and never requested. Values are
//! compared, never printed. Exits non-zero if any step does not do what it shows.
//!
//! `cargo run -p monky-bao-client --example read_secrets`

use std::process::ExitCode;

use monky_bao_client::{BaoClient, Error, ErrorKind, KvPath, PathRefusal, Token};
use monky_testkit::bao::FakeBao;
use secrecy::{ExposeSecret, SecretString};

const ENV: &str = "env-qa-02";

fn run() -> Result<(), String> {
    let bao = FakeBao::builder().start();
    let version = bao.put_secret(ENV, "db_password", "example-value-1");
    bao.put_secret("env-qa-03", "db_password", "another-envs-value");
    // A token as the agent holds it after its JWT login with a deploy grant.
    let token = SecretString::from("s.ExampleExampleExample1");
    bao.insert_token(&token, ENV, "grant-1");
    let token = Token::new(token.expose_secret().to_owned());

    let client = BaoClient::builder(bao.url())
        .build()
        .map_err(|e| format!("client: {e}"))?;
    let path = KvPath::parse("monky/env-qa-02/see/db_password", "monky", ENV)
        .map_err(|e| e.to_string())?;
    let value = client
        .read_kv(&token, &path, Some(version))
        .map_err(|e| format!("read {path}: {e}"))?;
    println!(
        "read {path} version {version}: {} bytes",
        value.expose_secret().len()
    );
    if value.expose_secret() != "example-value-1" {
        return Err(format!("{path}: not the stored value"));
    }

    // Another env's secret: refused by the path's type, before any request.
    let sent = bao.agent_requests().len();
    let refused = KvPath::parse("monky/env-qa-03/see/db_password", "monky", ENV)
        .map_err(Error::from)
        .and_then(|p| client.read_kv(&token, &p, None));
    match refused {
        Err(e) if e.path_refusal() == Some(PathRefusal::OtherEnv) => {
            println!("refused locally: {e}");
            if e.kind() != ErrorKind::Refused {
                return Err(format!("{e}: kind {:?}", e.kind()));
            }
        }
        other => return Err(format!("another env's path: {other:?}")),
    }
    if bao.agent_requests().len() != sent {
        return Err("a refused path was requested".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("read_secrets: {e}");
            ExitCode::FAILURE
        }
    }
}
