//! [`Peers`]: the fake tenancy and an OpenBao peer, started and wired to each other as in the
//! mesh.
//!
//! Each peer needs the other: OpenBao's JWT mount fetches tenancy's JWKS to verify deploy
//! grants, and tenancy looks bearers up on OpenBao with its root token. So tenancy starts
//! first, then OpenBao with tenancy's JWKS URL, then tenancy is pointed at OpenBao (with the CA
//! that signed OpenBao's certificate when it serves TLS). This is the one place that order is
//! written; tests, examples, benches and the demo's peers all start their pair here.

use std::convert::Infallible;

use crate::bao::{BaoPeer, FakeBao, FakeBaoBuilder, RealBao, RealBaoBuilder};
use crate::pki::Pki;
use url::Url;

use crate::tenancy::FakeTenancy;

/// Tenancy and an OpenBao (`FakeBao` by default, or `RealBao`) wired to each other.
///
/// ```
/// use monky_testkit::bao::BaoPeer;
/// use monky_testkit::peers::Peers;
///
/// let Peers { tenancy, bao } = Peers::fake();
/// bao.put_secret("env-qa-02", "see_value", "a value");
/// // A grant tenancy signs logs in at OpenBao, which verifies it against tenancy's JWKS.
/// let grant = tenancy.mint_grant("env-qa-02");
/// let client = monky_bao_client::BaoClient::builder(bao.url()).build().unwrap();
/// let login = client.login_jwt("jwt-tenancy", "see-env", &grant).unwrap();
/// assert_eq!(login.metadata["env_id"], "env-qa-02");
/// ```
#[derive(Debug)]
pub struct Peers<B = FakeBao> {
    /// The fake tenancy, checking bearers against `bao`.
    pub tenancy: FakeTenancy,
    /// The OpenBao, verifying grants against `tenancy`'s JWKS.
    pub bao: B,
}

impl Peers {
    /// A builder: plain HTTP unless [`PeersBuilder::tls`].
    pub fn builder() -> PeersBuilder {
        PeersBuilder::default()
    }

    /// Tenancy and a plain-HTTP [`FakeBao`] with the deployment's defaults.
    #[must_use]
    pub fn fake() -> Self {
        Self::builder().fake()
    }
}

/// How to start a [`Peers`]: whether OpenBao serves TLS, then which OpenBao.
#[derive(Debug, Default)]
#[must_use]
pub struct PeersBuilder {
    tls: Option<Pki>,
}

impl PeersBuilder {
    /// OpenBao serves HTTPS with `pki`'s certificate and key; tenancy (and a real server's own
    /// set-up calls) trust `pki`'s CA.
    pub fn tls(mut self, pki: &Pki) -> Self {
        self.tls = Some(pki.clone());
        self
    }

    /// Starts tenancy and a [`FakeBao`].
    #[must_use]
    pub fn fake(self) -> Peers<FakeBao> {
        self.fake_with(|bao| bao)
    }

    /// Starts tenancy and a [`FakeBao`] that `configure` sets up further (role, TTLs, mounts)
    /// on a builder that already has tenancy's JWKS URL and the TLS.
    #[must_use]
    pub fn fake_with(
        self,
        configure: impl FnOnce(FakeBaoBuilder) -> FakeBaoBuilder,
    ) -> Peers<FakeBao> {
        let tls = self.tls;
        let Ok(peers) = Peers::start(tls.as_ref(), |jwks| {
            let mut bao = FakeBao::builder().jwks_url(jwks);
            if let Some(pki) = &tls {
                bao = bao.tls(pki.cert_pem.clone().into(), pki.key_pem.clone().into());
            }
            Ok::<_, Infallible>(configure(bao).start())
        });
        peers
    }

    /// Starts tenancy and a [`RealBao`], set up as production.
    ///
    /// # Errors
    ///
    /// When the `bao` binary is missing or the server does not come up (the message names the
    /// set-up command or carries the server's log).
    pub fn real(self) -> Result<Peers<RealBao>, String> {
        self.real_with(|bao| bao)
    }

    /// Starts tenancy and a [`RealBao`] that `configure` sets up further (role TTLs, binary)
    /// on a builder that already has tenancy's JWKS URL and the TLS.
    ///
    /// # Errors
    ///
    /// As [`PeersBuilder::real`].
    pub fn real_with(
        self,
        configure: impl FnOnce(RealBaoBuilder) -> RealBaoBuilder,
    ) -> Result<Peers<RealBao>, String> {
        let tls = self.tls;
        Peers::start(tls.as_ref(), |jwks| {
            let mut bao = RealBao::builder().jwks_url(jwks);
            if let Some(pki) = &tls {
                bao = bao.tls(
                    pki.cert_pem.clone().into(),
                    pki.key_pem.clone().into(),
                    pki.ca_pem.clone().into(),
                );
            }
            configure(bao).try_start()
        })
    }
}

impl<B: BaoPeer> Peers<B> {
    /// The order both peers need: tenancy, then OpenBao from tenancy's JWKS URL, then tenancy
    /// pointed at OpenBao, trusting `tls`'s CA when it is given.
    fn start<E>(tls: Option<&Pki>, bao: impl FnOnce(Url) -> Result<B, E>) -> Result<Self, E> {
        let tenancy = FakeTenancy::builder().start();
        let bao = bao(tenancy.jwks_url())?;
        let ca_pem = tls.map(|pki| pki.ca_pem.clone().into_bytes());
        tenancy.set_bao(bao.url(), ca_pem, bao.root_token());
        Ok(Self { tenancy, bao })
    }
}
