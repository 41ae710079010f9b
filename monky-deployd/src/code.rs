//! The codes the agent prints, reports and explains: the proto crate's report vocabulary, with
//! the agent's policy about each (exit class, next step, whose move) written once here, so a
//! code is never read back out of a message.

use std::fmt;

use monky_agent_proto as proto;
use monky_bundle as bundle;
use serde::{Deserialize, Deserializer};

/// A failure, refusal or warning code; its text is what tenancy, the journal and state.json see.
/// The vocabulary is tenancy's too, so it lives in the proto crate; the policy is [`CodePolicy`].
pub use proto::ReportCode as Code;

/// The process exit statuses the systemd unit and operators rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exit {
    /// Converged, heartbeat sent, offline in laptop mode, or another tick holds the lock.
    Ok,
    /// A refusal or a failure, reported to tenancy as `failed`.
    Fail,
    /// Temporary: the next tick retries (`SuccessExitStatus=75`).
    Temporary,
    /// The token is pinned to another env, or the configuration is unusable: never retried.
    Config,
}

impl Exit {
    /// The numeric status.
    pub fn code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Fail => 1,
            Self::Temporary => 75,
            Self::Config => 78,
        }
    }
}

/// The agent's policy about each code of the report vocabulary ([`Code`], the proto crate's
/// `ReportCode`): how a tick that ends with it exits, what an operator does next, whose move it
/// is, and which code the agent gives a bundle refusal or one of tenancy's codes.
pub trait CodePolicy: Sized {
    /// How a tick that ends with this code exits.
    fn exit(self) -> Exit;
    /// What an operator does next (`explain`; docs/OPERATIONS.md says the same).
    fn next_step(self) -> &'static str;
    /// Whose move it is. docs/OPERATIONS.md's "Whose move" list says the same (a unit test
    /// checks they agree).
    fn owner(self) -> Owner;
    /// The code whose text is `text`; used only for a code stored as a code (state.json's
    /// `last_code`), never on a message.
    fn from_text(text: &str) -> Option<Self>;
    /// The agent's code for a bundle refusal.
    fn of_refusal(code: bundle::RefusalCode) -> Self;
    /// The agent's code for one of tenancy's (or the tenancy client's) codes; `None` for a
    /// code the agent does not know, which the caller names in the message.
    fn of_tenancy(code: &proto::ErrorCode) -> Option<Self>;
}

macro_rules! policy {
    ($( $variant:ident, $exit:ident, $step:literal; )+) => {
        /// Exhaustive: a code the proto crate adds fails to compile here until it has an exit
        /// class and a next step.
        fn exit_and_step(code: Code) -> (Exit, &'static str) {
            match code {
                $( Code::$variant => (Exit::$exit, $step), )+
            }
        }
    };
}

policy! {
    NoCredentials, Fail,
        "no OpenBao token and no bootstrap grant: re-run the install kit";
    GrantUnsafe, Fail,
        "the bootstrap grant is a link, FIFO or device, readable by others, owned by another user, or too large: stage it again as a regular 0600 file owned by the agent's user (re-run the install kit)";
    AgentUnauthenticated, Fail,
        "the token is gone, and the message says why (revoked or superseded by tenancy, expired by its TTL, or at its max TTL): re-run the install kit for a fresh bootstrap grant, or stage one and run `monky-deployd bootstrap --force`";
    AgentEnvMismatch, Config,
        "the token belongs to another env: fix env_id in config.yaml or re-run the install kit for this env";
    ConfigInvalid, Config,
        "the configuration cannot be used (the message names the key and line, or the file): fix it in /etc/monky-deployd/config.yaml (`monky-deployd doctor` checks it); no tick retries until it changes";
    LeaseRateLimited, Temporary,
        "tenancy's lease budget (5 per hour) is spent: the next ticks retry on their own";
    RateLimited, Temporary,
        "tenancy asked the agent to slow down: the next ticks retry on their own, after the wait tenancy named";
    LeaseShape, Fail,
        "tenancy answered a lease in the retired AppRole shape: upgrade tenancy";
    LeaseInvalid, Fail,
        "tenancy's lease answer was of the wrong shape or for another env: a tenancy bug, look at tenancy's logs";
    CheckinInvalid, Fail,
        "tenancy's checkin answer cannot be acted on (the message names the field): a tenancy bug, the running release stays";
    BundleNotFound, Fail,
        "tenancy does not publish the desired sha: publish the bundle, or correct the desired sha";
    TenancyUnavailable, Temporary,
        "tenancy is unreachable: check the mesh (`systemctl status monky-deployd-proxy`, the tunneler); the next tick retries";
    TenancyRefused, Fail,
        "tenancy refused a call (the message carries its status or code): look at tenancy's logs";
    TenancyListenerUntrusted, Fail,
        "a process of another user (the message names its uid and user) listens where the agent dials tenancy, and was sent nothing: find it with `ss -ltnpe`, stop it, then `systemctl restart monky-deployd-proxy`; if the proxy really runs as that user, name it in tenancy.listener_user";
    BaoListenerUntrusted, Fail,
        "a process of another user (the message names its uid and user) listens where the agent dials OpenBao, and was sent nothing: find it with `ss -ltnpe`, stop it, then `systemctl restart monky-deployd-proxy`; if the proxy really runs as that user, name it in bao.listener_user";
    RegistryListenerUntrusted, Fail,
        "the registry credential names a registry whose name resolves to an address of this box (loopback, a bridge, its own address) where an untrusted process listens or a connection is not accepted in time (the message names it: another user's, or a container's published port), so the credential was not handed to dockerd: stop that process, or, for a registry the box's admin runs in a container on purpose, name it in trusted_registries";
    RegistryNotAllowed, Fail,
        "an image's registry resolves to an address of this box (loopback, link-local, one of its own; the message names the image, the registry and the address), where dockerd would dial it: the box's admin names a registry it runs on this box on purpose in registry_host or trusted_registries; otherwise the bundle author takes the image from the box's own registry or the network's";
    RegistryUnavailable, Temporary,
        "a registry on this box could not be proven the box's own (nothing answers on one of its addresses, or the resolver did not answer for its name), so nothing was pulled and no credential handed to dockerd: start the registry, or fix the resolver; the next tick retries";
    SecretReadableOnHost, Fail,
        "a service that gets a secret would run, or was seen running, as a uid that a host account also has (the message names the service, the uid and the account; a process seen running, its pid), and the engine does not remap user namespaces, so that account could read the secret in /proc/<pid>/environ; judged before start nothing started, seen running its containers were stopped and the last good release brought back: enable userns-remap (install.sh --userns-remap), or keep that uid free of host accounts, or, if the box's admin accepts it, name the uid in allowed_shared_uids";
    TenancyRefusedToken, Fail,
        "tenancy refuses a token OpenBao still accepts, so the token is kept: after a kit re-reveal or a retire, re-run the install kit (the agent bootstraps with the new grant); otherwise tenancy cannot check tokens, look at tenancy's logs";
    BaoUnavailable, Temporary,
        "OpenBao is unreachable or sealed: check the proxy transport and the mesh; the next tick retries";
    TlsClock, Fail,
        "a peer's certificate is expired or not yet valid by this box's clock, or the clock is more than 30 s off OpenBao's: check the clock (`timedatectl`, NTP sync); if the clock is right, the peer's operator renews the certificate";
    BaoPermissionDenied, Fail,
        "OpenBao refused a read: check the manifest paths and the token's policy";
    SecretNotFound, Fail,
        "a pinned secret version does not exist: seed it in OpenBao or fix the manifest's version";
    BaoLoginRejected, Fail,
        "OpenBao refused the grant: re-run the install kit; check the jwt-tenancy mount and role";
    BaoRefused, Fail,
        "OpenBao refused a call: check bao.addr and bao.ca_bundle in config.yaml";
    BaoSealed, Temporary,
        "OpenBao is sealed: its operators must unseal it (nothing to change on this box); the next tick retries";
    BaoTlsUnknownCa, Fail,
        "OpenBao's certificate is not signed by the CA this box trusts: the box admin points bao.ca_bundle in config.yaml at OpenBao's CA (or OpenBao's operators serve a certificate from it)";
    BaoTlsWrongName, Fail,
        "OpenBao's certificate is for another host name than bao.addr's: the box admin fixes bao.addr in config.yaml (the name, not an IP), or OpenBao's operators add the name to the certificate";
    EnvIncomplete, Fail,
        "the bundle uses variables its manifest does not provide: fix the manifest or .env.template in the renderer";
    EnvValueUnsafe, Fail,
        "a secret's value cannot be written where .env.template puts it unquoted: quote that line in the template (KEY=\"...${VAR}...\")";
    PrivilegedRefused, Fail,
        "the compose file asks for host privileges: remove them, or set allow_privileged in bundle.json if this env really needs them";
    BundleNonconforming, Fail,
        "the compose file names a container, volume or network outside the project's own names: use the accepted name the message gives, or set allow_unprefixed_names in config.yaml if this box really wants it; a routing label that names another host: name the env's own address, or the box's admin adds the host to allowed_route_hosts";
    BudgetExceeded, Fail,
        "the compose file asks for more of the box than its budget: bring the named value within the budget in the bundle, or widen the named budget key in config.yaml (raise a `max_*`, lower a `min_*`)";
    SecretOnCommandLine, Fail,
        "compose, or a shell in the container expanding $$NAME, would put a secret into a process's arguments, readable by every local user in /proc/<pid>/cmdline: give it to the service in its environment and let the program read it there or from a file (a _FILE variable, a config file its entrypoint writes, REDISCLI_AUTH for redis-cli, PGPASSWORD for psql); a box whose /proc is mounted hidepid may set allow_secrets_on_command_lines";
    RollbackRefused, Fail,
        "tenancy asks for an older release: set allow_rollback in bundle.json to roll back on purpose";
    DiskInsufficient, Fail,
        "too little free space on the docker data root: the box admin frees it (`docker image prune -a`, OPERATIONS.md \"Free disk\") or grows the disk; the next tick retries";
    ReleasesOverCap, Fail,
        "the releases the agent wrote (bundle files and .env, each inode once) would be over releases_max_bytes even after pruning the older releases; what containers write into their release dirs does not count: raise releases_max_bytes";
    RendererRefused, Fail,
        "bundle.json names a renderer other than compose: re-render the bundle with the compose renderer";
    ManifestValueRefused, Fail,
        "the manifest carries a secret value: the renderer must ship paths only; rotate the exposed value";
    ManifestPathRefused, Fail,
        "a manifest path is outside this env's prefix: fix it to <kv_mount>/<env_id>/see/<name>";
    BundleShaMismatch, Fail,
        "the bundle does not hash to the desired sha: publish the bundle again from tenancy";
    BundleInvalid, Fail,
        "the bundle is malformed, or its compose file uses a feature the agent never runs (the message names the service and key): fix the renderer's output and check it with `monky-deployd bundle check`";
    BundleTooLarge, Fail,
        "the bundle is over the size limit: keep large files out of the bundle";
    ComposeConfigFailed, Fail,
        "compose could not read the bundle: run `monky-deployd bundle check` on it";
    ComposePullFailed, Fail,
        "the registry refused the pull (its message is in the detail): check the registry-auth secret and the image tag";
    ImageNotFound, Fail,
        "the registry has no image with the tag the bundle names: the bundle author pushes the image or fixes the tag in the compose file, then tenancy publishes a new bundle";
    ComposeUpFailed, Fail,
        "compose could not start the release (docker's reason is in the message): a port or name taken on the box is the box admin's to free, a wrong option in the compose file the bundle author's; `monky-deployd logs` shows the kept compose logs";
    Unhealthy, Fail,
        "containers did not become healthy: the message carries the last probe output; `monky-deployd logs` shows the failed release's kept compose logs (the bundle author's to fix)";
    NotRunning, Fail,
        "no container of the project runs: run `monky-deployd run --once --force` to apply again";
    ComposeDownFailed, Fail,
        "compose down failed: check that the docker daemon answers";
    DockerUnavailable, Fail,
        "the docker daemon did not answer (a container listing, or whether it remaps user namespaces): check `systemctl status docker` and the agent's access to its socket";
    StateDirUnsafe, Fail,
        "the state dir, or something below it, is owned or writable by another user or is a link the agent did not make: remove what was planted, `chown -R` the state dir to the agent's user and `chmod 0700` it";
    StateWriteFailed, Fail,
        "the agent could not write below its state dir (the message names the path): free space on its file system or make it writable again (`monky-deployd doctor` checks it); the next tick tries again and the running release is untouched";
    EngineAnswerInvalid, Fail,
        "the docker engine answered something the agent cannot read (the message names the call): check what listens on DOCKER_HOST (a proxy in front of the socket?) and the engine's version (`docker version`)";
    ReleaseModified, Fail,
        "a release's files or its .env changed on disk since the agent wrote it, so it was not started: find what wrote it (a container binding its own release dir?), then apply a release again from tenancy";
    TickTimeout, Temporary,
        "the tick ran past tick_timeout_s: the journal shows the step it was in; raise tick_timeout_s only if pulls are legitimately that slow";
    EnvQuotingChanged, Ok,
        "the named variables now reach the app exactly as stored: update an app value initialised with the original agent's form";
    Drift, Fail,
        "the containers differ from the current release (the detail names each) and were not healed: self_heal is off, or a heal waits out its backoff; `monky-deployd run --once --force` heals now";
    HealFailed, Fail,
        "the current release could not be brought back up after drift: read the compose log tail in the report; the next heal waits out a backoff, `run --once --force` tries now";
    Healed, Ok,
        "the agent brought the current release back up after the drift the detail names: find out who or what stopped or changed the containers";
    CrashLoop, Fail,
        "a service keeps dying: the agent healed it again within the hour; read its own output (`monky-deployd logs`, `docker logs <container>`) for why it exits, and fix the bundle or what it needs; the box counts as converged again once no heal is needed for an hour";
    ApplyInterrupted, Ok,
        "an apply was cut short (kill, reboot, OOM) and the next tick finished or rolled it back: nothing to do unless it repeats";
    Held, Ok,
        "an operator held the box (`monky-deployd hold`): nothing is applied, healed or retired, and a service stopped meanwhile is theirs, until `monky-deployd unhold` or the hold's end";
    Failed, Fail,
        "read `journalctl -u monky-deployd` for the whole error chain; the next tick tries again";
}

/// Whose move it is after a code: who can fix what the code names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// Whoever runs this box: its config, disk, docker, state dir, install kit.
    BoxAdmin,
    /// Whoever renders the bundle: its compose file, manifest, template, images.
    BundleAuthor,
    /// Tenancy's operators: the control plane, its answers, its budgets, the mesh to it.
    Tenancy,
    /// OpenBao's operators: its seal, certificate, mounts, policies, secrets.
    BaoOperators,
    /// The image registry's operators.
    Registry,
    /// Nobody: the agent retries on its own (or it is only a warning).
    NoOne,
    /// The operator who held the box (`monky-deployd hold`): what the hold explains is theirs.
    Operator,
}

impl Owner {
    /// The words an operator reads (`explain`, `status`, the journal).
    #[must_use]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Owner::BoxAdmin => "box admin",
            Owner::BundleAuthor => "bundle author",
            Owner::Tenancy => "tenancy",
            Owner::BaoOperators => "OpenBao operators",
            Owner::Registry => "registry",
            Owner::NoOne => "no one (retries on its own)",
            Owner::Operator => "operator",
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl CodePolicy for Code {
    fn exit(self) -> Exit {
        exit_and_step(self).0
    }

    fn next_step(self) -> &'static str {
        exit_and_step(self).1
    }

    /// Deliberately without a catch-all arm: a new code must say who acts.
    fn owner(self) -> Owner {
        use Code as C;
        match self {
            // The kit's grant and token live on the box; re-running the kit is the admin's.
            C::NoCredentials | C::GrantUnsafe | C::AgentUnauthenticated => Owner::BoxAdmin,
            C::AgentEnvMismatch | C::StateDirUnsafe | C::ReleaseModified => Owner::BoxAdmin,
            C::ConfigInvalid => Owner::BoxAdmin,
            C::DiskInsufficient | C::DockerUnavailable | C::ComposeDownFailed => Owner::BoxAdmin,
            C::NotRunning | C::Failed | C::BaoRefused => Owner::BoxAdmin,
            C::StateWriteFailed | C::EngineAnswerInvalid => Owner::BoxAdmin,
            C::BaoTlsUnknownCa | C::BaoTlsWrongName | C::ComposeUpFailed => Owner::BoxAdmin,
            C::LeaseRateLimited | C::RateLimited | C::TenancyUnavailable => Owner::NoOne,
            C::BaoUnavailable | C::TickTimeout | C::RegistryUnavailable => Owner::NoOne,
            C::LeaseShape | C::LeaseInvalid | C::CheckinInvalid => Owner::Tenancy,
            C::BundleNotFound | C::TenancyRefused | C::BundleShaMismatch => Owner::Tenancy,
            C::BaoPermissionDenied | C::BaoLoginRejected | C::BaoSealed => Owner::BaoOperators,
            C::SecretNotFound => Owner::BaoOperators,
            C::EnvIncomplete | C::EnvValueUnsafe | C::PrivilegedRefused => Owner::BundleAuthor,
            C::RollbackRefused | C::RendererRefused | C::ManifestValueRefused => {
                Owner::BundleAuthor
            }
            C::ManifestPathRefused | C::BundleInvalid | C::BundleTooLarge => Owner::BundleAuthor,
            C::ComposeConfigFailed | C::ImageNotFound | C::Unhealthy => Owner::BundleAuthor,
            C::CrashLoop => Owner::BundleAuthor,
            C::EnvQuotingChanged => Owner::BundleAuthor,
            C::BundleNonconforming | C::BudgetExceeded | C::SecretOnCommandLine => {
                Owner::BundleAuthor
            }
            C::ComposePullFailed => Owner::Registry,
            // Someone else's process on the box's loopback port, the box's clock, its disk.
            C::TenancyListenerUntrusted
            | C::BaoListenerUntrusted
            | C::RegistryListenerUntrusted
            | C::RegistryNotAllowed
            | C::SecretReadableOnHost
            | C::TlsClock => Owner::BoxAdmin,
            C::ReleasesOverCap | C::Drift | C::HealFailed => Owner::BoxAdmin,
            // Warnings: the tick went on, and who stopped the containers or the apply is the
            // box's question.
            C::Healed | C::ApplyInterrupted => Owner::BoxAdmin,
            // The hold, and whatever it explains (a service stopped for a restore), is the
            // operator's who put it.
            C::Held => Owner::Operator,
            // OpenBao still accepts the token tenancy refused.
            C::TenancyRefusedToken => Owner::Tenancy,
        }
    }

    fn from_text(text: &str) -> Option<Code> {
        Code::parse(text)
    }

    fn of_refusal(code: bundle::RefusalCode) -> Code {
        use bundle::RefusalCode as R;
        match code {
            R::EnvIncomplete => Code::EnvIncomplete,
            R::PrivilegedRefused => Code::PrivilegedRefused,
            R::RollbackRefused => Code::RollbackRefused,
            R::DiskInsufficient => Code::DiskInsufficient,
            R::RendererRefused => Code::RendererRefused,
            R::ManifestValueRefused => Code::ManifestValueRefused,
            R::ManifestPathRefused => Code::ManifestPathRefused,
            R::BundleShaMismatch => Code::BundleShaMismatch,
            R::BundleInvalid => Code::BundleInvalid,
            R::BundleTooLarge => Code::BundleTooLarge,
            R::EnvValueUnsafe => Code::EnvValueUnsafe,
            R::BundleNonconforming => Code::BundleNonconforming,
            R::BudgetExceeded => Code::BudgetExceeded,
            R::SecretOnCommandLine => Code::SecretOnCommandLine,
            R::RegistryNotAllowed => Code::RegistryNotAllowed,
            R::RegistryUnresolved => Code::RegistryUnavailable,
            // A refusal code this agent does not know yet is still a malformed bundle to it.
            _ => Code::BundleInvalid,
        }
    }

    fn of_tenancy(code: &proto::ErrorCode) -> Option<Code> {
        use proto::ErrorCode as E;
        Some(match code {
            E::AgentEnvMismatch => Code::AgentEnvMismatch,
            E::AgentUnauthenticated => Code::AgentUnauthenticated,
            E::LeaseRateLimited => Code::LeaseRateLimited,
            E::RateLimited => Code::RateLimited,
            E::BundleNotFound => Code::BundleNotFound,
            E::BundleTooLarge => Code::BundleTooLarge,
            E::LeaseShape => Code::LeaseShape,
            E::CheckinInvalid => Code::CheckinInvalid,
            E::LeaseInvalid => Code::LeaseInvalid,
            _ => return None,
        })
    }
}

/// For state.json: a code another version wrote and this one does not know reads as none, so
/// the rest of the state is kept.
pub(crate) fn lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Code>, D::Error> {
    let text = Option::<serde_json::Value>::deserialize(d)?;
    Ok(text
        .as_ref()
        .and_then(serde_json::Value::as_str)
        .and_then(Code::from_text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_code_has_a_distinct_text_and_a_next_step() {
        let texts: BTreeSet<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(texts.len(), Code::ALL.len(), "two codes share a text");
        for code in Code::ALL {
            let text = code.as_str();
            assert!(
                !text.is_empty() && text.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{text}"
            );
            assert!(code.next_step().len() > 20, "{text} has no real next step");
            assert_eq!(Code::from_text(text), Some(*code));
        }
        assert_eq!(Code::from_text("SOMETHING_ELSE"), None);
    }

    #[test]
    fn exit_classes_match_the_documented_statuses() {
        let temporary: Vec<&str> = Code::ALL
            .iter()
            .filter(|c| c.exit() == Exit::Temporary)
            .map(|c| c.as_str())
            .collect();
        assert_eq!(
            temporary,
            [
                "LEASE_RATE_LIMITED",
                "RATE_LIMITED",
                "TENANCY_UNAVAILABLE",
                "REGISTRY_UNAVAILABLE",
                "BAO_UNAVAILABLE",
                "BAO_SEALED",
                "TICK_TIMEOUT"
            ]
        );
        assert_eq!(Code::AgentEnvMismatch.exit(), Exit::Config);
        assert_eq!(Code::EnvQuotingChanged.exit(), Exit::Ok);
        assert_eq!(Code::ReleaseModified.exit(), Exit::Fail);
    }

    #[test]
    fn every_bundle_refusal_and_known_tenancy_code_keeps_its_text() {
        use bundle::RefusalCode as R;
        for r in [
            R::EnvIncomplete,
            R::PrivilegedRefused,
            R::RollbackRefused,
            R::DiskInsufficient,
            R::RendererRefused,
            R::ManifestValueRefused,
            R::ManifestPathRefused,
            R::BundleShaMismatch,
            R::BundleInvalid,
            R::BundleTooLarge,
            R::EnvValueUnsafe,
            R::BundleNonconforming,
            R::BudgetExceeded,
        ] {
            assert_eq!(Code::of_refusal(r).as_str(), r.as_str());
        }
        for text in [
            "AGENT_ENV_MISMATCH",
            "AGENT_UNAUTHENTICATED",
            "LEASE_RATE_LIMITED",
            "RATE_LIMITED",
            "BUNDLE_NOT_FOUND",
            "BUNDLE_TOO_LARGE",
            "LEASE_SHAPE",
            "CHECKIN_INVALID",
            "LEASE_INVALID",
        ] {
            let code = Code::of_tenancy(&proto::ErrorCode::from(text));
            assert_eq!(code.map(Code::as_str), Some(text));
        }
        assert_eq!(Code::of_tenancy(&proto::ErrorCode::from("NEW_THING")), None);
    }

    #[test]
    fn a_stored_code_round_trips_and_an_unknown_one_reads_as_none() {
        #[derive(Deserialize)]
        struct S {
            #[serde(deserialize_with = "lenient", default)]
            c: Option<Code>,
        }
        let s: S = serde_json::from_str(r#"{"c":"RELEASE_MODIFIED"}"#).unwrap();
        assert_eq!(s.c, Some(Code::ReleaseModified));
        let s: S = serde_json::from_str(r#"{"c":"FROM_THE_FUTURE"}"#).unwrap();
        assert_eq!(s.c, None);
        let s: S = serde_json::from_str(r#"{"c":null}"#).unwrap();
        assert_eq!(s.c, None);
        assert_eq!(
            serde_json::to_string(&Code::TickTimeout).unwrap(),
            "\"TICK_TIMEOUT\""
        );
    }

    #[test]
    fn operations_md_says_whose_move_each_code_is() {
        let doc = include_str!("../../docs/OPERATIONS.md");
        let section = doc
            .split("\n### Whose move\n")
            .nth(1)
            .expect("docs/OPERATIONS.md has a ### Whose move section");
        let section = section.split("\n#").next().unwrap_or(section);
        let mut seen = BTreeSet::new();
        for line in section.lines().filter(|l| l.starts_with("- **")) {
            let (head, rest) = line[4..]
                .split_once("**")
                .expect("- **owner, exit N**: codes");
            let (owner, exit) = head.split_once(", exit ").expect("owner, exit N");
            // The codes come first; the argument after the first full stop may quote keys.
            let codes = rest.split(". ").next().unwrap_or(rest);
            for code in codes.split('`').skip(1).step_by(2) {
                let c = Code::from_text(code).unwrap_or_else(|| panic!("unknown code {code}"));
                assert_eq!(c.owner().as_str(), owner, "{code}'s owner");
                assert_eq!(c.exit().code().to_string(), exit, "{code}'s exit");
                assert!(seen.insert(c), "{code} listed twice");
            }
        }
        let missing: Vec<_> = Code::ALL.iter().filter(|c| !seen.contains(c)).collect();
        assert!(missing.is_empty(), "### Whose move lacks {missing:?}");
    }

    #[test]
    fn operations_md_lists_exactly_the_codes() {
        let doc = include_str!("../../docs/OPERATIONS.md");
        let table = doc
            .split("\n### Codes\n")
            .nth(1)
            .expect("docs/OPERATIONS.md has a ### Codes section");
        let documented: BTreeSet<&str> = table
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .collect();
        let known: BTreeSet<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        let missing: Vec<_> = known.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&known).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "docs/OPERATIONS.md's codes table lacks {missing:?} and names unknown {unknown:?}"
        );
    }
}
