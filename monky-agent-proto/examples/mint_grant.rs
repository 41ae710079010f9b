//! Tenancy's side of a deploy grant, as tenancy's tooling would write it with the `grant`
//! feature: generate (or load) the ES256 key, publish its JWK Set where OpenBao's `jwt-tenancy`
//! mount fetches it, sign a grant for an env, and hand it to the agent. Here the testkit's fake
//! OpenBao, which verifies grants as the mount does, stands in for OpenBao, and the agent's
//! login is `monky-bao-client`'s. Exits non-zero if any step does not do what it shows.
//!
//! `cargo run -p monky-agent-proto --features grant --example mint_grant`

use std::process::ExitCode;
use std::sync::Arc;

use monky_agent_proto::grant::{AUDIENCE, GrantClaims, GrantSigner, KIND, TTL};
use monky_bao_client::BaoClient;
use monky_testkit::bao::FakeBao;
use secrecy::ExposeSecret;

const ENV: &str = "env-qa-02";

fn run() -> Result<(), String> {
    // Tenancy: one key; its public half is the document at /.well-known/agent-jwks.json.
    let signer = GrantSigner::generate().map_err(|e| e.to_string())?;
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").map_err(|e| e.to_string())?);
    let addr = server.server_addr().to_ip().ok_or("no ip listener")?;
    let jwks = signer.jwks().to_string();
    {
        let server = Arc::clone(&server);
        std::thread::spawn(move || {
            for request in server.incoming_requests() {
                let _ = request.respond(tiny_http::Response::from_string(jwks.clone()));
            }
        });
    }
    let jwks_url = url::Url::parse(&format!("http://{addr}/.well-known/agent-jwks.json"))
        .map_err(|e| e.to_string())?;

    // Kit reveal: a grant for the env, valid for an hour, with a single-use jti.
    let claims = GrantClaims::new("https://tenancy.example", ENV).map_err(|e| e.to_string())?;
    let grant = signer.sign(&claims).map_err(|e| e.to_string())?;
    if claims.aud != AUDIENCE || claims.kind != KIND || claims.exp - claims.iat != TTL.as_secs() {
        return Err(format!("the claims are not a deploy grant's: {claims:?}"));
    }
    println!(
        "signed a grant for {ENV} (kid {}, jti {}, {} bytes)",
        signer.kid(),
        claims.jti,
        grant.expose_secret().len()
    );

    // The agent: log in to OpenBao with it; the token is bound to the env and the grant's jti.
    let bao = FakeBao::builder().jwks_url(jwks_url).start();
    let client = BaoClient::builder(bao.url())
        .build()
        .map_err(|e| e.to_string())?;
    let login = client
        .login_jwt("jwt-tenancy", "see-env", &grant)
        .map_err(|e| format!("login: {e}"))?;
    let bound = |key: &str| login.metadata.get(key).map(String::as_str);
    if bound("env_id") != Some(ENV) || bound("grant_jti") != Some(claims.jti.as_str()) {
        return Err(format!(
            "the token is not bound to the grant: {:?}",
            login.metadata
        ));
    }
    println!(
        "OpenBao logged the grant in: token for env_id {ENV}, grant_jti {}",
        claims.jti
    );
    server.unblock();
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mint_grant: {e}");
            ExitCode::FAILURE
        }
    }
}
