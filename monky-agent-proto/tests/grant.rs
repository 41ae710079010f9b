//! The `grant` feature against the real OpenBao set up as deployed (`jwt-tenancy` mount, role
//! `see-env`): a grant this test signs with `GrantSigner`, whose JWK Set it serves as tenancy
//! does, logs in and yields a token bound to its env and jti; a grant the role's bindings refuse
//! does not. Needs the `bao` binary that `cargo xtask setup` installs (`MONKY_BAO_BIN`).

use std::sync::Arc;
use std::thread::JoinHandle;

use monky_agent_proto::grant::{AUDIENCE, GrantClaims, GrantSigner, KIND};
use monky_bao_client::{BaoClient, ErrorKind};
use monky_testkit::bao::RealBao;
use secrecy::SecretString;
use url::Url;

/// Serves `jwks` at `/.well-known/agent-jwks.json` on 127.0.0.1, as tenancy does.
struct JwksServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    url: Url,
}

impl JwksServer {
    fn start(jwks: &serde_json::Value) -> Self {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let addr = server.server_addr().to_ip().unwrap();
        let body = jwks.to_string();
        let thread = {
            let server = Arc::clone(&server);
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    let header =
                        tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                    let _ = request.respond(
                        tiny_http::Response::from_string(body.clone()).with_header(header),
                    );
                }
            })
        };
        let url = Url::parse(&format!("http://{addr}/.well-known/agent-jwks.json")).unwrap();
        Self {
            server,
            thread: Some(thread),
            url,
        }
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn login(
    client: &BaoClient,
    jwt: &SecretString,
) -> monky_bao_client::Result<monky_bao_client::Login> {
    client.login_jwt("jwt-tenancy", "see-env", jwt)
}

#[test]
fn real_openbao_accepts_a_grant_signed_here_and_refuses_what_its_role_does_not_bind() {
    let signer = GrantSigner::generate().unwrap();
    let jwks = JwksServer::start(signer.jwks());
    let bao = RealBao::builder().jwks_url(jwks.url.clone()).start();
    let client = BaoClient::builder(bao.url()).build().unwrap();

    let claims = GrantClaims::new("https://tenancy.test", "env-qa-02").unwrap();
    let grant = signer.sign(&claims).unwrap();
    let logged_in = login(&client, &grant)
        .unwrap_or_else(|e| panic!("OpenBao {} refused the grant: {e}", bao.version()));
    assert_eq!(
        logged_in.metadata.get("env_id").map(String::as_str),
        Some("env-qa-02")
    );
    assert_eq!(
        logged_in.metadata.get("grant_jti").map(String::as_str),
        Some(claims.jti.as_str())
    );
    assert!(
        logged_in.policies.iter().any(|p| p == "see-env"),
        "{:?}",
        logged_in.policies
    );

    // The role's bindings, as deployed: another audience, another kind, an expired grant, or
    // another key are each refused at login.
    let mut wrong_aud = GrantClaims::new("https://tenancy.test", "env-qa-02").unwrap();
    wrong_aud.aud = "openbao-other".into();
    let mut wrong_kind = GrantClaims::new("https://tenancy.test", "env-qa-02").unwrap();
    wrong_kind.kind = "bootstrap".into();
    let expired = GrantClaims::at("https://tenancy.test", "env-qa-02", "old".into(), 1_000_000);
    let stranger = GrantSigner::generate().unwrap();
    for (what, jwt) in [
        ("another audience", signer.sign(&wrong_aud).unwrap()),
        ("another kind", signer.sign(&wrong_kind).unwrap()),
        ("an expired grant", signer.sign(&expired).unwrap()),
        (
            "another key",
            stranger
                .sign(&GrantClaims::new("https://tenancy.test", "env-qa-02").unwrap())
                .unwrap(),
        ),
    ] {
        let err = login(&client, &jwt).expect_err(what);
        assert_eq!(err.kind(), ErrorKind::LoginRejected, "{what}: {err}");
    }
    assert_eq!((AUDIENCE, KIND), ("openbao-see-env", "deploy-grant"));
}
