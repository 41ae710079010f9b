//! The documented exit statuses and the error that carries one up to `main`.
//!
//! A step of the tick fails with a `Failure`, whose code is required; a lower module's
//! `anyhow::Error` is given the code it fails the tick with where the step calls it
//! (`OrCode::or_code`). The commands outside the tick return `anyhow::Error`, and [`Exit::of`]
//! decides their status by the first `Failure` in the chain (an error without one is 1).

use std::fmt;
use std::time::Duration;

use crate::code::{Code, CodePolicy as _};
use crate::redact::Redacted;

pub use crate::code::Exit;

impl Exit {
    /// The status an error chain maps to: the class of its first failure's code.
    pub fn of(err: &anyhow::Error) -> Self {
        Failure::of(err).map_or(Self::Fail, Failure::exit)
    }
}

/// An error with a code, whose class decides the exit status: the agent's one type for a
/// refusal or a failure (a bundle's [`monky_bundle::Refusal`] or [`monky_bundle::Error`] becomes
/// one by `From`).
///
/// The message never starts with the code: `Display` writes `CODE: message` from the typed code,
/// so every way out (the final error line, the journal, a report's detail, state's last error)
/// shows the code where it is composed, and nothing reads it back out of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The refusal or failure code (`ENV_INCOMPLETE`, `AGENT_UNAUTHENTICATED`, ...); its class
    /// is how the process ends.
    pub(crate) code: Code,
    /// What happened, names only, without the code.
    pub(crate) message: String,
    /// How long the peer asked to wait before the next try (`Retry-After`), for the loop.
    pub(crate) retry_after: Option<Duration>,
    /// The tail of the compose logs of a release that did not come up healthy, redacted: the
    /// evidence the failure's report carries. Never part of the message.
    pub(crate) compose_logs: Option<Redacted>,
    /// The whole error chain it was taken from, when that says more than `CODE: message`:
    /// the journal's second line (see [`Failure::or_code`]). Never reported.
    pub(crate) chain: Option<String>,
}

impl Failure {
    /// A failure with `code`, which decides the exit class; `message` names what is wrong and
    /// what to do, without the code.
    pub(crate) fn coded(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            retry_after: None,
            compose_logs: None,
            chain: None,
        }
    }

    /// Says what the failure happened in, for the journal's whole chain (as `anyhow`'s context
    /// does); the report's detail stays `CODE: message`.
    #[must_use]
    pub(crate) fn context(mut self, what: impl fmt::Display) -> Self {
        self.chain = Some(format!("{what}: {}", self.full()));
        self
    }

    /// The failure with the whole chain it was taken from, for the journal: `CODE: message`,
    /// or the chain when it says more.
    #[must_use]
    pub(crate) fn full(&self) -> String {
        self.chain.clone().unwrap_or_else(|| self.to_string())
    }

    /// How a tick that ends with this failure exits: its code's class.
    #[must_use]
    pub(crate) fn exit(&self) -> Exit {
        self.code.exit()
    }

    /// Carries the peer's `Retry-After` up to the loop.
    #[must_use]
    pub(crate) fn with_retry_after(mut self, wait: Option<Duration>) -> Self {
        self.retry_after = wait;
        self
    }

    /// Attaches the compose logs a failed release's report carries; they are redacted here.
    #[must_use]
    pub(crate) fn with_compose_logs(mut self, logs: &str) -> Self {
        self.compose_logs = Some(crate::redact::redact(logs));
        self
    }

    /// Marks an existing error chain with a code (and so an exit status).
    pub(crate) fn wrap(code: Code, err: anyhow::Error) -> anyhow::Error {
        anyhow::Error::new(Self::coded(code, format!("{err:#}")))
    }

    /// The first failure in a chain.
    pub(crate) fn of(err: &anyhow::Error) -> Option<&Failure> {
        err.chain().find_map(|e| e.downcast_ref::<Failure>())
    }

    /// The code of the first failure in a chain.
    pub(crate) fn code_of(err: &anyhow::Error) -> Option<Code> {
        Self::of(err).map(|f| f.code)
    }

    /// The failure an error of a lower module (the state dir, the disk, a release's files, a
    /// peer's client) fails a tick with: the first failure it carries, else `code` with its
    /// innermost cause. The whole chain is kept for the journal when it says more.
    pub(crate) fn or_code(err: &anyhow::Error, code: Code) -> Failure {
        let mut f = match Self::of(err) {
            Some(f) => f.clone(),
            None => Self::coded(code, err.root_cause().to_string()),
        };
        let full = format!("{err:#}");
        if full != f.to_string() {
            f.chain = Some(full);
        }
        f
    }
}

/// A lower module's `anyhow` result as a tick's: the code it fails with, named where it is
/// called (see [`Failure::or_code`]), so no error reaches a tick's outcome without a code.
pub(crate) trait OrCode<T> {
    /// The result, its error given `code` unless it carries a failure of its own.
    ///
    /// # Errors
    /// The failure.
    fn or_code(self, code: Code) -> Result<T, Failure>;
}

impl<T> OrCode<T> for anyhow::Result<T> {
    fn or_code(self, code: Code) -> Result<T, Failure> {
        self.map_err(|e| Failure::or_code(&e, code))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code.as_str())?;
        if self.message.is_empty() {
            return Ok(());
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for Failure {}

impl From<&monky_bundle::Refusal> for Failure {
    fn from(r: &monky_bundle::Refusal) -> Self {
        Self::coded(Code::of_refusal(r.code), r.message())
    }
}

impl From<&monky_bundle::Error> for Failure {
    /// A bundle that cannot be read: its refusal when it has one, else `BUNDLE_INVALID`.
    fn from(e: &monky_bundle::Error) -> Self {
        match e.refusal() {
            Some(r) => Self::from(r),
            None => Self::coded(Code::BundleInvalid, e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn the_status_comes_from_the_failure_anywhere_in_the_chain() {
        let e = anyhow::Error::new(Failure::coded(
            Code::TenancyUnavailable,
            "tenancy unreachable",
        ))
        .context("checkin");
        assert_eq!(Exit::of(&e), Exit::Temporary);
        assert_eq!(Exit::of(&anyhow::anyhow!("plain")), Exit::Fail);
        let coded: anyhow::Result<()> =
            Err(Failure::coded(Code::EnvIncomplete, "unresolved: A").into());
        let e = coded.context("apply").unwrap_err();
        assert_eq!(Failure::code_of(&e), Some(Code::EnvIncomplete));
        assert_eq!(Exit::of(&e), Exit::Fail);
        assert_eq!(format!("{e:#}"), "apply: ENV_INCOMPLETE: unresolved: A");
        assert_eq!(Failure::or_code(&e, Code::Failed).retry_after, None);
        let waited = anyhow::Error::new(
            Failure::coded(Code::RateLimited, "slow down")
                .with_retry_after(Some(Duration::from_secs(30))),
        )
        .context("checkin");
        assert_eq!(
            Failure::or_code(&waited, Code::Failed).retry_after,
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            [Exit::Ok, Exit::Fail, Exit::Temporary, Exit::Config].map(Exit::code),
            [0, 1, 75, 78]
        );
    }

    #[test]
    fn the_exit_class_is_the_codes_and_the_code_is_shown_once() {
        for code in Code::ALL {
            let f = Failure::coded(*code, "names");
            assert_eq!(f.exit(), code.exit(), "{code}");
            assert_eq!(f.to_string(), format!("{code}: names"));
        }
        let e = Failure::wrap(
            Code::ConfigInvalid,
            anyhow::anyhow!("log_level: no such level"),
        );
        assert_eq!(Exit::of(&e), Exit::Config);
        assert_eq!(format!("{e:#}"), "CONFIG_INVALID: log_level: no such level");
        // A bundle refusal's own text starts with its code; the failure shows it once.
        let r = monky_bundle::Refusal::new(monky_bundle::RefusalCode::EnvIncomplete, ["A"]);
        let f = Failure::from(&r);
        assert_eq!(
            (f.code, f.message.as_str()),
            (Code::EnvIncomplete, "unresolved: A")
        );
        assert_eq!(f.to_string(), r.to_string());
        let bare = monky_bundle::Refusal::new(
            monky_bundle::RefusalCode::BundleInvalid,
            Vec::<String>::new(),
        );
        assert_eq!(Failure::from(&bare).to_string(), "BUNDLE_INVALID");
        // An error without a failure takes the code its caller names, with its innermost
        // cause; the whole chain is kept for the journal, never for the report.
        let plain = anyhow::anyhow!("disk gone").context("save");
        let first = Failure::or_code(&plain, Code::Failed);
        assert_eq!(
            (first.code, first.to_string()),
            (Code::Failed, "FAILED: disk gone".to_string())
        );
        assert_eq!(first.full(), "save: disk gone");
        let healed: Result<(), Failure> = Err(plain).or_code(Code::HealFailed);
        assert_eq!(healed.unwrap_err().to_string(), "HEAL_FAILED: disk gone");
        // One that carries a failure keeps that failure's code, whatever the caller names.
        let coded = anyhow::Error::new(Failure::coded(Code::ReleaseModified, "web changed"))
            .context("verify");
        let kept = Failure::or_code(&coded, Code::HealFailed);
        assert_eq!(kept.to_string(), "RELEASE_MODIFIED: web changed");
        assert_eq!(kept.full(), "verify: RELEASE_MODIFIED: web changed");
        assert_eq!(
            kept.context("heal").full(),
            "heal: verify: RELEASE_MODIFIED: web changed"
        );
    }
}
