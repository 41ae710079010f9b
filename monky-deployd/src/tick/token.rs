//! The OpenBao token's lifecycle: loaded from disk or bootstrapped from the kit's grant, swapped
//! for a lease before an apply reads secrets, renewed or leased again when due, and revoked when
//! replaced.

use std::path::PathBuf;
use std::time::Duration;

use monky_agent_proto as proto;
use monky_bao_client as bao;
use secrecy::{ExposeSecret, SecretString};
use tracing::{info, warn};

use super::Run;
use crate::clock::{self, BootDeadline};
use crate::code::Code;
use crate::exit::{Failure, OrCode as _};
use crate::state::{Fact, TokenSource, TokenState};
use crate::{fsx, peers, redact};

/// Lease again when the token is older than its max TTL (30 d) less two days.
const LEASE_AGAIN_AFTER: Duration = Duration::from_secs(28 * 24 * 3600);

/// The largest bootstrap grant read (a deploy grant JWT is well under 4 KiB).
pub(crate) const MAX_GRANT_BYTES: u64 = 16 * 1024;

impl Run<'_> {
    pub(super) fn token_path(&self) -> PathBuf {
        self.agent.layout.token_path()
    }

    /// The stored token's text, read without following a link and bounded.
    pub(super) fn read_token(&self) -> Result<Option<zeroize::Zeroizing<String>>, Failure> {
        Ok(self
            .agent
            .layout
            .read_token()
            .or_code(Code::Failed)?
            .map(|b| zeroize::Zeroizing::new(String::from_utf8_lossy(&b).into_owned())))
    }

    /// Loads the stored token, or bootstraps one from the kit's grant.
    pub(super) fn ensure_token(&mut self) -> Result<(), Failure> {
        if self.tick.token.is_some() {
            return Ok(());
        }
        if let Some(text) = self.read_token()?
            && !text.trim().is_empty()
        {
            redact::register(text.trim());
            self.tick.token = Some(bao::Token::new(text.trim().to_string()));
            return Ok(());
        }
        self.bootstrap()
    }

    /// Logs in with the bootstrap grant, stores the token and deletes the grant.
    pub(super) fn bootstrap(&mut self) -> Result<(), Failure> {
        let grant_path = &self.agent.cfg.bootstrap_file;
        let grant = match fsx::read_private(grant_path, MAX_GRANT_BYTES) {
            Ok(g) if !String::from_utf8_lossy(&g).trim().is_empty() => {
                let g = zeroize::Zeroizing::new(g);
                SecretString::from(String::from_utf8_lossy(&g).trim().to_string())
            }
            Err(
                p @ (fsx::ReadProblem::NotRegular(_)
                | fsx::ReadProblem::Readable(_)
                | fsx::ReadProblem::Owner(_)
                | fsx::ReadProblem::TooLarge(_)),
            ) => {
                return Err(Failure::coded(
                    Code::GrantUnsafe,
                    format!(
                        "bootstrap grant {} refused: {p}; stage it again as a regular file, mode \
                         0600, owned by the agent's user (the install kit does this)",
                        grant_path.display()
                    ),
                ));
            }
            // A token lost before keeps its cause until a grant brings a new one: the tick
            // after the loss says the same as the tick that saw it.
            _ => {
                return Err(match self.tick.state.token_lost() {
                    Some(loss) => lost_token(loss, grant_path),
                    None => Failure::coded(
                        Code::NoCredentials,
                        format!(
                            "no OpenBao token and no bootstrap grant at {}: re-run the install kit",
                            grant_path.display()
                        ),
                    ),
                });
            }
        };
        redact::register(grant.expose_secret());
        info!("bootstrapping: logging in to OpenBao with the kit's grant");
        let login = self
            .agent
            .bao()?
            .login_jwt(
                &self.agent.cfg.bao.auth_mount,
                &self.agent.cfg.bao.role,
                &grant,
            )
            .map_err(|e| {
                // Neither a transport failure nor a certificate outside its dates says anything
                // about the grant.
                let not_the_grant = matches!(
                    e.kind(),
                    bao::ErrorKind::Temporary | bao::ErrorKind::CertificateTime
                );
                let f = peers::bao_failure("bootstrap login", e);
                if not_the_grant {
                    f
                } else {
                    f.context("the bootstrap grant was refused: re-run the install kit")
                }
            })?;
        self.install_token(login.token, TokenSource::Bootstrap, login.ttl)?;
        match std::fs::remove_file(grant_path) {
            Ok(()) => info!("bootstrap grant consumed and deleted"),
            Err(e) => warn!("cannot delete {}: {e}", grant_path.display()),
        }
        Ok(())
    }

    /// Stores a new token (0600, atomically) and its facts; revokes the one it replaces.
    pub(super) fn install_token(
        &mut self,
        token: bao::Token,
        source: TokenSource,
        ttl: Duration,
    ) -> Result<(), Failure> {
        redact::register(token.expose_secret());
        self.agent
            .layout
            .write_token(token.expose_secret().as_bytes())
            .or_code(Code::StateWriteFailed)?;
        let now = crate::clock::wall();
        let boot = clock::boot();
        self.record(Fact::TokenFacts(Some(TokenState {
            source,
            obtained_at: now,
            expires_at: now.saturating_add(ttl.as_secs()),
            obtained_boot: boot.as_ref().map(|b| BootDeadline::after(b, 0)),
            expires_boot: boot.as_ref().map(|b| BootDeadline::after(b, ttl.as_secs())),
            creation_ttl_s: Some(ttl.as_secs()),
            max_ttl_near: false,
            max_expires_at: None,
        })));
        if let Some(old) = self.tick.token.replace(token)
            && old.expose_secret() != self.tick.token.as_ref().map_or("", |t| t.expose_secret())
            && let Err(e) = match self.agent.bao() {
                Ok(b) => b.revoke_self(&old).map_err(|e| e.to_string()),
                Err(f) => Err(f.full()),
            }
        {
            // The policy may not grant revoke-self; the old token then simply expires.
            warn!("could not revoke the previous token: {e}");
        }
        Ok(())
    }

    pub(super) fn bearer(&self) -> Result<SecretString, Failure> {
        self.tick
            .token
            .as_ref()
            .map(|t| SecretString::from(t.expose_secret().to_string()))
            .ok_or_else(|| Failure::coded(Code::Failed, "no token"))
    }

    pub(super) fn forget_token(&mut self) {
        self.tick.token = None;
        self.record(Fact::TokenFacts(None));
        let _ = self.agent.layout.remove_token();
    }

    /// Tenancy answered 401 and no fresh grant is staged: the token is deleted only when
    /// OpenBao refuses it too (`lookup-self` over the pinned TLS). A token OpenBao accepts is
    /// kept and the failure is tenancy's; one OpenBao cannot be asked about is kept as well.
    pub(super) fn token_refused_by_tenancy(&mut self, refused: &proto::Error) -> Failure {
        let looked_up = match (&self.tick.token, self.agent.bao()) {
            (Some(tok), Ok(client)) => client.lookup_self(tok),
            (None, _) => return Failure::coded(Code::Failed, "no token"),
            (_, Err(e)) => return e,
        };
        match looked_up {
            Ok(info) => Failure::coded(
                Code::TenancyRefusedToken,
                format!(
                    "checkin: {refused}; OpenBao still accepts the token (ttl {}s), so it is \
                     kept: re-run the install kit if tenancy superseded the grant, otherwise \
                     look at tenancy's logs",
                    info.ttl.as_secs()
                ),
            ),
            Err(e) if e.kind() == bao::ErrorKind::PermissionDenied => {
                warn!("OpenBao refuses the token too ({e}); deleting it");
                let loss =
                    crate::state::TokenLoss::judged(self.tick.state.token(), crate::clock::wall());
                self.forget_token();
                self.record(Fact::TokenLost(loss));
                lost_token(&loss, &self.agent.cfg.bootstrap_file)
            }
            Err(e) => peers::bao_failure(
                "asking OpenBao about the token tenancy refused (the token is kept)",
                e,
            ),
        }
    }

    /// Leases a grant, logs in with it, and makes the new token the bearer.
    pub(super) fn lease_login(&mut self, reason: &str) -> Result<(), Failure> {
        let req = proto::LeaseRequest {
            env_id: self.agent.cfg.env_id.clone(),
            reason: reason.to_string(),
        };
        let lease = self
            .agent
            .tenancy
            .lease(&self.bearer()?, &req)
            .map_err(|e| peers::tenancy_failure("lease", e))?;
        redact::register(lease.login_jwt.expose_secret());
        let login = self
            .agent
            .bao()?
            .login_jwt(&lease.mount, &lease.role, &lease.login_jwt)
            .map_err(|e| peers::bao_failure("lease login", e))?;
        info!("leased a deploy grant ({reason}); new OpenBao token in place");
        self.install_token(login.token, TokenSource::Lease, login.ttl)
    }

    /// The token to read secrets with: a valid lease token is reused, a bootstrap token is
    /// swapped for a lease once, and a rate-limited lease does not stop a deploy that already
    /// holds a working token.
    pub(super) fn token_for_apply(&mut self) -> Result<(), Failure> {
        if let (
            Some(tok),
            Some(TokenState {
                source: TokenSource::Lease,
                ..
            }),
        ) = (&self.tick.token, self.tick.state.token())
        {
            match self.agent.bao()?.lookup_self(tok) {
                Ok(info) if info.ttl.as_secs() > self.agent.cfg.bao.renew_below_s => return Ok(()),
                Ok(_) => info!("lease token is close to expiry; leasing a new one"),
                Err(e) if e.kind() == bao::ErrorKind::Temporary => {
                    return Err(peers::bao_failure("token lookup", e));
                }
                Err(e) => info!("lease token no longer valid ({e}); leasing a new one"),
            }
        }
        match self.lease_login("apply") {
            Ok(()) => Ok(()),
            Err(e) if e.code == Code::LeaseRateLimited && self.tick.token.is_some() => {
                warn!("lease rate-limited; applying with the current token, swap deferred");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// A token on disk without facts in the state (taken over from the original agent, whose
    /// state did not say when it expires): asks OpenBao, so upkeep renews it when due instead
    /// of letting it die at its TTL. Best effort: a failed lookup leaves the next tick to ask.
    pub(super) fn learn_token_facts(&mut self) {
        let Some(tok) = &self.tick.token else { return };
        if self.tick.state.token().is_some() {
            return;
        }
        let looked_up = self.agent.bao().and_then(|b| {
            b.lookup_self(tok)
                .map_err(|e| peers::bao_failure("lookup-self", e))
        });
        match looked_up {
            Ok(info) => {
                let now = crate::clock::wall();
                // Where the token came from is not recorded; as a bootstrap token it is swapped
                // for a lease at the next apply, which is safe either way.
                let mut facts = TokenState::from_wall(
                    TokenSource::Bootstrap,
                    if info.creation_time > 0 {
                        info.creation_time.min(now)
                    } else {
                        now
                    },
                    now,
                );
                facts.creation_ttl_s = Some(info.creation_ttl.as_secs()).filter(|t| *t > 0);
                self.record(Fact::TokenFacts(Some(facts)));
                self.record_ttl(info.ttl);
                info!(
                    "token facts learnt from OpenBao (ttl {}s)",
                    info.ttl.as_secs()
                );
            }
            Err(e) => warn!("cannot look up the stored token: {e:#}"),
        }
    }

    /// Records OpenBao's remaining TTL for the token: on the boot clock, which schedules the
    /// renewal, and on the wall clock, which `status` shows.
    fn record_ttl(&mut self, ttl: Duration) {
        let now = crate::clock::wall();
        let boot = clock::boot();
        self.record(Fact::TokenTtlLearnt {
            expires_at: now.saturating_add(ttl.as_secs()),
            expires_boot: boot.as_ref().map(|b| BootDeadline::after(b, ttl.as_secs())),
        });
    }

    /// Renews or re-leases the token when due; runs at the end of every tick that has one,
    /// whatever tenancy answered, so the token lives as long as OpenBao lets it however long
    /// tenancy is away. Only the re-lease near the max TTL needs tenancy
    /// (`tenancy_reached`); without it, or when it fails, the current token is renewed as
    /// usual meanwhile.
    ///
    /// Scheduled by OpenBao's own TTL counted on the boot clock, so a step of the wall clock by
    /// any amount, either way, neither skips a renewal nor stores an expiry that later honest
    /// ticks trust. After a reboot (or with facts from an older state) the boot clock says
    /// nothing: the stored wall-clock expiry renews at once when it says due (a renewal answers
    /// the true TTL), and otherwise `lookup-self` asks OpenBao what is left, so a backward step
    /// cannot postpone the renewal either. One OpenBao call per boot at most, beyond renewals.
    pub(super) fn upkeep(&mut self, tenancy_reached: bool) -> Result<(), Failure> {
        let (Some(tok), Some(ts)) = (self.tick.token.clone(), self.tick.state.token().cloned())
        else {
            return Ok(());
        };
        let boot = clock::boot();
        // The age by the boot clock; minted in another boot, by the wall clock, where a forward
        // step costs one early lease and a backward one is caught by the capped renewal below.
        let age = boot
            .as_ref()
            .and_then(|b| ts.obtained_boot.as_ref()?.elapsed(b))
            .unwrap_or_else(|| crate::clock::wall().saturating_sub(ts.obtained_at));
        if age > LEASE_AGAIN_AFTER.as_secs() {
            self.record(Fact::TokenMaxTtlNear);
        }
        let mut leased_tried = false;
        if self.tick.state.token().is_some_and(|t| t.max_ttl_near) && tenancy_reached {
            info!("token is close to its max TTL; re-leasing");
            leased_tried = true;
            match self.lease_login("renew") {
                Ok(()) => return Ok(()),
                Err(e) => warn!("cannot lease a new token ({e:#}); renewing the current one"),
            }
        }
        let renew_below = self.agent.cfg.bao.renew_below_s;
        // More left than the token was ever granted is no OpenBao answer: asked again below.
        let granted = ts.creation_ttl_s.unwrap_or(u64::MAX);
        let left = match boot
            .as_ref()
            .and_then(|b| ts.expires_boot.as_ref()?.remaining(b))
            .filter(|left| *left <= granted)
        {
            Some(left) => left,
            None if ts.expires_at.saturating_sub(crate::clock::wall()) < renew_below => 0,
            // No boot clock at all (no boot id): the wall clock is all there is, and asking
            // OpenBao at every tick would be a call per heartbeat.
            None if boot.is_none() => ts.expires_at.saturating_sub(crate::clock::wall()),
            None => {
                let info = self
                    .agent
                    .bao()?
                    .lookup_self(&tok)
                    .map_err(|e| peers::bao_failure("token lookup", e))?;
                info!(
                    "token facts for this boot learnt from OpenBao (ttl {}s)",
                    info.ttl.as_secs()
                );
                self.record_ttl(info.ttl);
                info.ttl.as_secs()
            }
        };
        if left >= renew_below {
            return Ok(());
        }
        let renewal = self
            .agent
            .bao()?
            .renew_self(&tok, None)
            .map_err(|e| peers::bao_failure("token renew", e))?;
        for w in &renewal.warnings {
            warn!("renew: {w}");
        }
        info!("token renewed (ttl {}s)", renewal.ttl.as_secs());
        self.record_ttl(renewal.ttl);
        // OpenBao grants less than the token's own TTL only when its max TTL caps the renewal:
        // the token then ends for good with this TTL. Lease again while there is time left
        // (this tick, and the next ones until one works).
        if let Some(c) = ts.creation_ttl_s
            && is_capped(renewal.ttl.as_secs(), c)
        {
            self.record(Fact::TokenMaxTtlReached(
                crate::clock::wall().saturating_add(renewal.ttl.as_secs()),
            ));
            if tenancy_reached && !leased_tried {
                info!("the renewal was capped by the token's max TTL; re-leasing");
                return self.lease_login("renew");
            }
        }
        Ok(())
    }
}

/// `AGENT_UNAUTHENTICATED` for a token lost as `loss` says, with no grant at `grant_path`.
fn lost_token(loss: &crate::state::TokenLoss, grant_path: &std::path::Path) -> Failure {
    Failure::coded(
        Code::AgentUnauthenticated,
        format!(
            "{loss}, and no bootstrap grant is at {}: re-run the install kit, or stage a fresh \
             grant and run `monky-deployd bootstrap --force` (OPERATIONS.md, \"Rotate the token\")",
            grant_path.display()
        ),
    )
}

/// Whether a renewal granting `ttl` seconds was capped by the max TTL, for a token minted
/// with `creation` seconds: OpenBao grants the role's TTL again otherwise, exactly; a little
/// slack (a twentieth, at most a minute) keeps a role's TTL trimmed by seconds from counting.
fn is_capped(ttl: u64, creation: u64) -> bool {
    ttl.saturating_add((creation / 20).min(60)) < creation
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_renewal_short_of_the_creation_ttl_is_capped() {
        use super::is_capped;
        assert!(!is_capped(86_400, 86_400));
        assert!(!is_capped(86_350, 86_400), "within a minute");
        assert!(is_capped(86_300, 86_400));
        assert!(!is_capped(5, 5));
        assert!(is_capped(4, 5), "a short role's TTL: no slack");
        assert!(is_capped(0, 5));
    }
}
