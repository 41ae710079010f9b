//! The grant flow with monky-agent-proto's fake tenancy: its JWKS and grants log in at the fake
//! OpenBao, and tenancy verifies the resulting bearer with the root token.

use monky_agent_proto::Client;
use monky_bao_client::BaoClient;
use monky_testkit::peers::Peers;
use monky_testkit::tenancy::checkin_request;
use secrecy::SecretString;

#[test]
fn tenancy_grant_logs_in_and_the_bearer_checks_in() {
    // A policy that grants revoke-self (the deployment's does not).
    let Peers { tenancy, bao } = Peers::builder().fake_with(|bao| bao.revoke_self_allowed(true));
    let client = BaoClient::builder(bao.url()).build().unwrap();

    let login = client
        .login_jwt("jwt-tenancy", "see-env", &tenancy.mint_grant("env-qa-02"))
        .unwrap();
    assert_eq!(login.metadata["env_id"], "env-qa-02");
    assert_eq!(
        tenancy.current_grants("env-qa-02"),
        [login.metadata["grant_jti"].clone()]
    );

    let bearer = SecretString::from(login.token.expose_secret().to_owned());
    let api = Client::builder(tenancy.url()).build().unwrap();
    api.checkin(&bearer, &checkin_request("env-qa-02")).unwrap();
    assert!(
        bao.requests()
            .iter()
            .any(|r| r.by_root && r.path == "/v1/auth/token/lookup"),
        "tenancy looked the bearer up with the root token"
    );

    client.revoke_self(&login.token).unwrap();
    assert!(api.checkin(&bearer, &checkin_request("env-qa-02")).is_err());
}
