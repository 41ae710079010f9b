//! The apply's stages as types: fetched, checked, staged, pulled, promoted. Each step takes the
//! stage before it and returns the next or a failure, and only its step makes a stage, so a
//! release cannot be promoted that was not staged, pulled and judged, nor staged from a bundle
//! that was not fetched as the desired sha and checked. Each step that works on the release is
//! also handed its sha, so its signature says which release it touches; what it takes carries
//! the same sha (the bundle proved it hashes to it, the staged release is named by it).
//!
//! Each step is a function, not a method of the tick: its arguments are what it reads (the
//! `Agent`'s config, state dir and clients, the state, the token, this tick's `Judged`
//! memo) and its result is what it found; the tick folds that (tidy rule `stages`).

use std::collections::BTreeMap;

use monky_agent_proto::Sha;
use monky_bundle as bundle;
use secrecy::{ExposeSecret, SecretString};
use tracing::{info, warn};

use std::cell::RefCell;

use monky_bao_client as bao;

use super::{Agent, Judged};
use crate::code::{Code, CodePolicy as _};
use crate::exit::{Exit, Failure, OrCode as _};
use crate::refusals;
use crate::state::State;
use crate::{failpoint, peers, redact, release};
use monky_bundle::ResolvedEntry;

/// Steps 1-2 passed: the bundle tenancy served, parsed within the limits, hashing to `sha`.
pub(super) struct Fetched {
    bundle: bundle::Bundle,
}

/// Step 3 passed: nothing the bundle alone shows is wrong, and each manifest entry has its KV
/// path.
pub(super) struct Checked {
    bundle: bundle::Bundle,
    manifest: Vec<ResolvedEntry>,
}

impl Checked {
    /// Whether the manifest names a secret, so the read needs a token.
    pub(super) fn reads_secrets(&self) -> bool {
        !self.manifest.is_empty()
    }
}

impl Fetched {
    /// What the bundle says it needs on disk, for `doctor`.
    pub(super) fn disk_need(&self) -> Option<u64> {
        self.bundle.meta().disk_need_bytes
    }
}

/// Steps 4-6 passed: the value of every manifest entry (the registry credential is in the
/// agent's docker config already). Names only ever leave it.
pub(super) struct Secrets(BTreeMap<String, SecretString>);

impl Secrets {
    /// The variables the original agent's `.env` handed to the app differently from how this
    /// agent writes them (names only).
    pub(super) fn handed_differently(&self) -> Vec<String> {
        crate::statefile::handed_differently(&self.0)
    }
}

/// Steps 7-9 passed: `.env` rendered, the release written to `staging/` and compose's model of
/// it judged by the policy.
pub(super) struct Staged {
    prod: bool,
    release: release::Staged,
    /// The images compose's model names.
    images: Vec<String>,
    /// Who each service runs as and which secrets it gets, judged once its images are here.
    runs_as: Vec<bundle::RunsAs>,
}

/// Step 10 passed: the staged release's images are on the box.
pub(super) struct Pulled(Staged);

/// Step 11 passed: `releases/<sha>`, named by `current`, verified on disk. Made only by
/// [`promote`] from a pulled release, or by [`Promoted::resumed`] for the release an
/// interrupted apply promoted: what `up` takes.
pub(super) struct Promoted {
    prod: bool,
    release: release::Release,
    /// The services that get a secret, by the count the stages judged; `None` for a resumed
    /// release, whose count the look makes again.
    holders: Option<std::collections::BTreeSet<String>>,
}

impl Promoted {
    /// The release an interrupted apply promoted before it was cut short, which `current`
    /// names again: `release::point_current` gave it, once `release::verify` and the policy
    /// gate (compose's model, the registry, the images' proof) passed on it.
    pub(super) fn resumed(release: release::Release) -> Self {
        Self {
            prod: release.is_prod(),
            release,
            holders: None,
        }
    }

    /// The services that get a secret, when the stages counted them.
    pub(super) fn holders(&self) -> Option<&std::collections::BTreeSet<String>> {
        self.holders.as_ref()
    }

    /// The sha the release is.
    pub(super) fn sha(&self) -> &Sha {
        self.release.sha()
    }

    /// Whether the bundle says prod (its own `bundle.json`, before the config's override).
    pub(super) fn bundle_prod(&self) -> bool {
        self.prod
    }

    /// The release `current` names.
    pub(super) fn release(&self) -> &release::Release {
        &self.release
    }
}

/// Why the apply's stages stopped short of a release that is up.
pub(super) enum Stop {
    /// Refused or failed before the release itself was tried (a refusal of the bundle alone,
    /// a peer that did not answer, the disk): no backoff, nothing to fall back from.
    Halted(Failure),
    /// The release itself failed (its `.env`, compose's model, the pull, the up or the health
    /// wait): recovery runs next, the backoff and, when it had started, the fallback.
    Failed(Box<Failed>),
}

impl Stop {
    /// A release that failed before anything of it started.
    fn failed(failure: Failure) -> Self {
        Self::Failed(Box::new(Failed {
            failure,
            started: None,
        }))
    }
}

impl From<Failure> for Stop {
    fn from(f: Failure) -> Self {
        Self::Halted(f)
    }
}

/// A release that failed: why, and what of it had started.
pub(super) struct Failed {
    /// The failure's code and what happened, names only.
    pub(super) failure: Failure,
    /// Its tier and compose logs, when its containers were started.
    pub(super) started: Option<Started>,
}

/// A failed release that had started: its tier (for `on_failure`) and the tail of its compose
/// logs (for the report).
#[derive(Debug, Clone)]
pub(super) struct Started {
    /// Whether it is prod, by its bundle and the config.
    pub(super) prod: bool,
    /// The tail of its compose logs.
    pub(super) compose_logs: String,
}

/// Steps 1-2: the bundle from tenancy, parsed within the limits and proven to be `sha`;
/// also its raw bytes, kept on the box when the bundle author must fix it.
pub(super) fn fetch(
    agent: &Agent,
    bearer: &SecretString,
    sha: &Sha,
    url: &str,
) -> Result<(Fetched, Vec<u8>), Failure> {
    let dl = agent
        .tenancy
        .bundle(bearer, url)
        .map_err(|e| peers::tenancy_failure("bundle", e))?;
    let b = bundle::Bundle::parse(&dl.bytes, &bundle::Limits::default())
        .map_err(|e| Failure::from(&e))
        .inspect_err(|e| keep_bad_bundle(agent, sha, &dl.bytes, e))?;
    b.check_sha(&sha.digest()).map_err(refusal)?;
    if let Some(h) = dl.header_sha.as_deref().filter(|h| *h != b.sha().as_str()) {
        // The header is tenancy's claim, not a checked sha: its first 12 characters.
        warn!(
            "bundle header sha {} disagrees with its content {}",
            h.chars().take(12).collect::<String>(),
            sha.short()
        );
    }
    failpoint::hit("after-fetch");
    let fetched = Fetched { bundle: b };
    Ok((fetched, dl.bytes))
}

/// Step 3: every refusal an apply can meet before any lease or secret read.
pub(super) fn check(
    agent: &Agent,
    state: &State,
    sha: &Sha,
    fetched: Fetched,
) -> Result<Checked, Failure> {
    let Fetched { bundle: b } = fetched;
    debug_assert_eq!(b.sha(), sha);
    let (manifest, refused) = refusals::offline(
        &b,
        &agent.cfg.env_id,
        &agent.kv_mount(state),
        &agent.offline_policy(&b),
    );
    if let Some(f) = refusals::all(refused) {
        return Err(f);
    }
    bundle::check_rollback(sha, state.applied_history(), b.meta().allow_rollback)
        .map_err(refusal)?;
    // The byte cap of releases/ and staging/, before anything is leased or staged; the
    // running release, the last good one and a sha waiting out its backoff are never pruned
    // for room.
    let need = b
        .files()
        .values()
        .map(|bytes| bytes.len() as u64)
        .sum::<u64>()
        .saturating_add(ENV_ALLOWANCE);
    let protect: Vec<&str> = [
        Some(sha),
        state.applied_sha(),
        state.failed().map(|f| &f.sha),
    ]
    .into_iter()
    .flatten()
    .map(Sha::as_str)
    .collect();
    release::make_room(&agent.layout, agent.cfg, need, &protect).or_code(Code::StateWriteFailed)?;
    match agent.docker.free_bytes() {
        Ok(free) => bundle::check_disk(
            free,
            b.meta().disk_need_bytes.unwrap_or(0),
            agent.cfg.disk_factor,
            agent.cfg.disk_headroom_bytes,
        )
        .map_err(refusal)?,
        Err(e) => {
            warn!("cannot read the docker data root's free space ({e}); disk check skipped")
        }
    }
    Ok(Checked {
        bundle: b,
        manifest,
    })
}

/// Steps 4-6: the token for reading (a lease, unless a valid one is held), then every
/// manifest entry's value; the registry credential goes to the agent's docker config.
/// Names are logged, values never.
pub(super) fn read_secrets(
    agent: &Agent,
    judged: &RefCell<Judged>,
    token: Option<&bao::Token>,
    checked: &Checked,
) -> Result<Secrets, Failure> {
    let manifest = &checked.manifest;
    let mut values: BTreeMap<String, SecretString> = BTreeMap::new();
    if manifest.is_empty() {
        return Ok(Secrets(values));
    }
    let token = token.ok_or_else(|| Failure::coded(Code::Failed, "no token"))?;
    for ResolvedEntry { entry, path } in manifest {
        let v = agent
            .bao()?
            .read_kv(token, path, entry.version)
            .map_err(|e| peers::bao_failure(&format!("read {}", entry.var), e))?;
        redact::register(v.expose_secret());
        if entry.is_registry_auth() {
            judged.borrow_mut().registry_entry = Some(format!(
                "the manifest's entry {} (`use: registry-auth`), read from OpenBao at {path}",
                entry.var
            ));
            agent.write_registry_auth(&v)?;
        } else {
            values.insert(entry.var.clone(), v);
        }
    }
    info!(
        "read {} secret(s): {}",
        values.len(),
        values.keys().cloned().collect::<Vec<_>>().join(", ")
    );
    Ok(Secrets(values))
}

/// Steps 7-9: render `.env` from `secrets`; write the release to `staging/`; judge
/// compose's model of it.
pub(super) fn stage(
    agent: &Agent,
    judged: &RefCell<Judged>,
    sha: &Sha,
    checked: Checked,
    secrets: Secrets,
) -> Result<Staged, Stop> {
    let Checked { bundle: b, .. } = checked;
    debug_assert_eq!(b.sha(), sha);
    // 7. A value that cannot be written where the template puts it fails here, before
    // staging, and waits out the backoff: the pinned versions make it fail the same way
    // next time.
    let env_text = bundle::render_env(b.env_template(), &secrets.0)
        .map_err(|r| Stop::failed(Failure::from(&r)))?;
    drop(secrets);
    // 8. Stage the release.
    let staged =
        release::stage(&agent.layout, sha, &b, &env_text).or_code(Code::StateWriteFailed)?;
    failpoint::hit("after-staging");
    // 9. Compose's model is the authority, since a value from a secret is only visible
    // there. A refusal here waits out the backoff as a render failure does: with the same
    // pinned versions the next tick would read the secrets only to be refused again.
    let (images, runs_as) = match agent.judge(judged, staged.release()) {
        Ok(judged) => judged,
        // A finding of the release's own (a refusal of its model, a name another project
        // holds) waits out the backoff; a failure of the box (a state write, or no code of its
        // own) does not.
        Err(e)
            if e.exit() == Exit::Fail
                && !matches!(e.code, Code::Failed | Code::StateWriteFailed) =>
        {
            return Err(Stop::failed(e));
        }
        Err(e) => return Err(Stop::Halted(e)),
    };
    Ok(Staged {
        prod: b.meta().is_prod(),
        release: staged,
        images,
        runs_as,
    })
}

/// Step 10: pull from the staging dir, every image from its registry whatever the
/// bundle's `pull_policy`; a registry refusal leaves `current` naming the release that is
/// still running.
pub(super) fn pull(
    agent: &Agent,
    judged: &RefCell<Judged>,
    staged: Staged,
) -> Result<Pulled, Stop> {
    // A service whose own `user:` names its uid is judged before anything is pulled; one
    // that runs as its image's `USER` once the image is here to say which.
    let (by_user, by_image): (Vec<_>, Vec<_>) = staged.runs_as.iter().cloned().partition(|r| {
        r.user
            .as_deref()
            .and_then(crate::shared_uid::plain_uid)
            .is_some()
    });
    if let Err((code, why)) = agent.shared_uid_gate(&by_user) {
        return Err(Stop::failed(Failure::coded(code, why)));
    }
    agent.registry_gate()?;
    if let Err(e) = agent.pull_release(judged, staged.release.release(), &staged.images) {
        // The box's registry not proven is the box's, not the release's: no backoff.
        if matches!(
            e.code,
            Code::RegistryListenerUntrusted
                | Code::RegistryUnavailable
                | Code::Failed
                | Code::StateWriteFailed
        ) {
            return Err(Stop::Halted(e));
        }
        let mut e = e;
        if e.code == Code::ImageNotFound {
            e.message = blame_missing(&e.message, &staged.runs_as);
        }
        // A credential the registry rejects is fixed where it is kept: name the entry.
        if credential_rejected(&e.message)
            && let Some(entry) = &judged.borrow().registry_entry
        {
            e.message.push_str(&format!(
                "; the registry rejected the credential from {entry}: correct its value there"
            ));
        }
        return Err(Stop::failed(e));
    }
    if let Err((code, why)) = agent.shared_uid_gate(&by_image) {
        return Err(Stop::failed(Failure::coded(code, why)));
    }
    Ok(Pulled(staged))
}

/// Step 11, once `apply::mark_under_way` marked the apply under way: make the release
/// `releases/<sha>` named by `current` (a retry's release judged again), and verify it on disk.
pub(super) fn promote(
    agent: &Agent,
    judged: &RefCell<Judged>,
    sha: &Sha,
    pulled: Pulled,
) -> Result<Promoted, Failure> {
    let Pulled(Staged {
        prod,
        release,
        runs_as,
        ..
    }) = pulled;
    let holders = Some(crate::runtime_look::holders(&runs_as));
    // The staged release is of the sha its stages carried: the bundle was fetched and
    // checked as it, and stage wrote it as it.
    debug_assert_eq!(release.release().sha(), sha);
    let release = release::promote(&agent.layout, release, &|r| agent.policy_gate(judged, r))
        .or_code(Code::Failed)?;
    failpoint::hit("after-swap");
    release::verify(&agent.layout, sha).or_code(Code::Failed)?;
    Ok(Promoted {
        prod,
        release,
        holders,
    })
}

impl Agent<'_> {
    /// The policy for the file as the bundle carries it, before any secret is read. An image's
    /// registry on the box's own addresses is allowed by the config, or by the credential
    /// stored at an earlier apply; a bundle that brings a credential of its own has its
    /// registries judged on compose's model instead, once the credential is read and knows
    /// its registry.
    fn offline_policy(&self, b: &bundle::Bundle) -> bundle::ComposePolicy {
        let policy = self.cfg.compose_policy(false);
        if b.manifest().entries.iter().any(|e| e.is_registry_auth()) {
            return policy.registries(None);
        }
        self.with_stored_registries(policy)
    }

    /// `policy`, allowing the registries the stored credential names: the box's own, which the
    /// agent proves on every address before it hands that credential to dockerd.
    fn with_stored_registries(&self, policy: bundle::ComposePolicy) -> bundle::ComposePolicy {
        peers::stored_registries(self.cfg)
            .unwrap_or_default()
            .iter()
            .fold(policy, |p, r| p.registry_allowed(r))
    }

    /// Before the pull for a service whose `user:` is a uid, after it for one that runs as its
    /// image's `USER` (known once the image is here): no service that gets a secret runs
    /// as a uid a host account shares, unless the engine remaps user namespaces or the box's
    /// admin names the uid in `allowed_shared_uids` (see `shared_uid`). A heal, a fallback or
    /// a finished apply starts a release judged so at its own apply, from recorded images.
    /// An engine that cannot say whether it remaps starts nothing (`DOCKER_UNAVAILABLE`).
    fn shared_uid_gate(&self, runs: &[bundle::RunsAs]) -> Result<(), (Code, String)> {
        if !runs.iter().any(bundle::RunsAs::gets_a_secret) {
            return Ok(());
        }
        let engine = self.docker.engine();
        match engine.info() {
            Ok(info) if info.userns_remap() => return Ok(()),
            Ok(_) => {}
            // Not judged is not passed: a secret at a shared uid would start unseen.
            Err(e) => {
                // An answer that cannot be read is not an engine that did not answer.
                let code = match e.kind() {
                    monky_compose::ErrorKind::Protocol => Code::EngineAnswerInvalid,
                    _ => Code::DockerUnavailable,
                };
                return Err((
                    code,
                    format!(
                        "cannot ask the engine whether it remaps user namespaces ({e}), so \
                         whether a host account shares a container's uid is not judged"
                    ),
                ));
            }
        }
        let accounts = crate::shared_uid::HostAccounts::read();
        let user_of = |r: &bundle::RunsAs| -> Result<Option<u32>, String> {
            let user = match &r.user {
                Some(u) => Some(u.clone()),
                None => engine.image_user(&r.image).map_err(|e| e.to_string())?,
            };
            let Some(user) = user else { return Ok(None) };
            if let Some(uid) = crate::shared_uid::plain_uid(&user) {
                return Ok(Some(uid));
            }
            let passwd = engine.image_passwd(&r.image).map_err(|e| e.to_string())?;
            crate::shared_uid::uid_of(&user, passwd.as_deref()).map(Some)
        };
        let found =
            crate::shared_uid::findings(runs, &accounts, &self.cfg.allowed_shared_uids, &user_of);
        if found.is_empty() {
            Ok(())
        } else {
            Err((
                Code::SecretReadableOnHost,
                format!(
                    "{}; without userns-remap a container's uid is the host's, and that account \
                 could read /proc/<pid>/environ, and a secret's file through /proc/<pid>/root: \
                 enable userns-remap, keep the uid free of host accounts, or name it in \
                 allowed_shared_uids",
                    found.join("; ")
                ),
            ))
        }
    }

    /// `compose pull` of `rel` with the agent's pull override (`pull_policy: always` on every
    /// service), so each image comes from its registry with this env's credential; then the
    /// IDs of `images` go into the env's record of what it pulled itself.
    fn pull_release(
        &self,
        judged: &RefCell<Judged>,
        rel: &release::Release,
        images: &[String],
    ) -> Result<(), Failure> {
        info!("compose pull (every image from its registry)");
        let project = match rel.write_pull_override() {
            Ok(Some(file)) => rel.compose(&self.docker, self.cfg).with_override(&file),
            Ok(None) => rel.compose(&self.docker, self.cfg),
            Err(e) => {
                return Err(Failure::coded(
                    Code::ComposePullFailed,
                    format!("cannot write the pull override: {e:#}"),
                ));
            }
        };
        let on_box = self.hand_credential()?;
        let pulled = project.pull();
        if on_box && let Err(e) = self.layout.remove_docker_config() {
            warn!("cannot remove the registry credential after the pull ({e:#})");
        }
        pulled.map_err(|e| Failure::coded(pull_code(&e), e.to_string()))?;
        let ids: Vec<String> = images
            .iter()
            .filter_map(|i| self.docker.image_id(i).ok().flatten())
            .collect();
        if let Err(e) = self.layout.record_pulled_images(&ids) {
            warn!("cannot record the pulled images ({e:#}); the next up pulls them again");
        }
        judged.borrow_mut().pulled.extend(images.iter().cloned());
        Ok(())
    }

    /// Every image of `images` is one this env pulled itself: the engine's image for the
    /// reference has an ID in the env's record. Else `rel` is pulled now, from each registry
    /// with this env's credential, before anything starts: an image another env pulled, or
    /// a tag moved on the engine since, proves nothing.
    fn prove_images(
        &self,
        judged: &RefCell<Judged>,
        rel: &release::Release,
        images: &[String],
    ) -> Result<(), Failure> {
        let pulled = judged.borrow().pulled.clone();
        if images.iter().all(|i| pulled.contains(i)) {
            return Ok(());
        }
        let record = self.layout.pulled_images();
        let unproven: Vec<&str> = images
            .iter()
            .filter(|i| {
                !(self.docker.image_id(i).ok().flatten()).is_some_and(|id| record.contains(&id))
            })
            .map(String::as_str)
            .collect();
        if unproven.is_empty() {
            return Ok(());
        }
        info!(
            "image(s) this env has not pulled itself: {}",
            unproven.join(", ")
        );
        self.pull_release(judged, rel, images)
    }

    /// The compose policy on compose's model of `rel`, before compose pulls or starts it: the
    /// staged release, a retried one updated in place before `current` names it, and a release
    /// fallen back to, whose files may have changed on disk since it was checked.
    pub(super) fn policy_gate(
        &self,
        judged: &RefCell<Judged>,
        rel: &release::Release,
    ) -> Result<(), Failure> {
        let (images, _) = self.judge(judged, rel)?;
        // compose's `up` pulls too (a service's `pull_policy: always`, an image gone from the
        // engine), with the stored credential: its registry is judged before every up.
        self.registry_gate()?;
        self.prove_images(judged, rel, &images)
    }

    /// The compose policy on compose's model of `rel`, and the names it makes against every
    /// project on the box ([`Agent::policy_gate`] without the images' proof, for a release
    /// whose pull comes next): the images the model names, and who each service runs as.
    pub(super) fn judge(
        &self,
        judged: &RefCell<Judged>,
        rel: &release::Release,
    ) -> Result<(Vec<String>, Vec<bundle::RunsAs>), Failure> {
        // The override is written before the model is built, so the model carries the pids
        // limit the agent supplies, and compose's model must show one for every service. The
        // file compose reads is the agent's own rewrite of what it judged.
        rel.write_plain_compose().or_code(Code::StateWriteFailed)?;
        rel.write_budget_override(self.cfg)
            .or_code(Code::StateWriteFailed)?;
        let policy = self
            .with_stored_registries(
                self.cfg
                    .compose_policy(rel.allow_privileged())
                    .route_hosts(rel.address()),
            )
            .pids_supplied(true);
        let raw = rel.compose_yaml().or_code(Code::Failed)?;
        let (refused, facts) = refusals::model(
            &policy,
            &rel.compose(&self.docker, self.cfg),
            &raw,
            rel.dir(),
            &rel.secret_keys(),
        )
        .or_code(Code::Failed)?;
        if let Some(f) = refusals::all(refused) {
            return Err(f);
        }
        if judged.borrow().names.contains(rel.sha()) {
            return Ok((facts.images, facts.runs_as));
        }
        match self.docker.named_objects() {
            Ok(on_engine) => {
                let others = crate::names::configured_projects(&self.cfg.path);
                let taken = crate::names::conflicts(
                    &self.cfg.compose_project,
                    &facts.made,
                    &others,
                    &on_engine,
                );
                if !taken.is_empty() {
                    return Err(Failure::coded(Code::BundleNonconforming, taken.join("; ")));
                }
                judged.borrow_mut().names.insert(rel.sha().clone());
            }
            // The engine's own failure is the up's to report, under its own code.
            Err(e) => warn!("cannot list the engine's names ({e}); names not checked"),
        }
        Ok((facts.images, facts.runs_as))
    }

    /// Before every pull: dockerd sends the stored credential to its registry, so a registry on
    /// an address of this box must still be served by a trusted listener, whoever listened
    /// there when the credential was written.
    ///
    /// # Errors
    /// `REGISTRY_LISTENER_UNTRUSTED`: nothing is pulled.
    fn registry_gate(&self) -> Result<(), Failure> {
        for who in peers::handed_registry_check(self.cfg).or_code(Code::Failed)? {
            info!("{who}");
        }
        Ok(())
    }

    /// Right before the agent's own pull: the stored credential goes into `config.json` for
    /// the docker CLI, once each registry it names is proven the box's on every address its
    /// name resolves to, when it is on this box. `true` when it is: the caller removes
    /// `config.json` after the pull, so the credential of a registry on this box is in
    /// dockerd's reach for that pull only. A credential stored by an older agent in
    /// `config.json` alone is kept at rest first.
    ///
    /// # Errors
    /// `REGISTRY_LISTENER_UNTRUSTED`, `REGISTRY_UNAVAILABLE`: nothing is pulled.
    fn hand_credential(&self) -> Result<bool, Failure> {
        let stored = match self.stored_credential() {
            Ok(Some(json)) => json,
            Ok(None) => return Ok(false),
            // Nothing is handed to dockerd: the pull goes without a credential, as it does
            // after a credential that could not be stored.
            Err(e) => {
                warn!("registry credential not readable ({e}); the pull goes without it");
                return Ok(false);
            }
        };
        let mut on_box = false;
        for registry in peers::auths_of(&stored) {
            if let Some(who) = peers::registry_check(self.cfg, &registry).or_code(Code::Failed)? {
                info!("{who}");
                on_box = true;
            }
        }
        self.layout
            .write_docker_config(&stored)
            .or_code(Code::Failed)?;
        Ok(on_box)
    }

    /// The credential at rest; one stored by an older agent in `config.json` alone is kept at
    /// rest first.
    fn stored_credential(&self) -> Result<Option<zeroize::Zeroizing<Vec<u8>>>, Failure> {
        if let Some(json) = self.layout.read_credential().or_code(Code::Failed)? {
            return Ok(Some(json));
        }
        let Some(json) = self.layout.read_docker_config().or_code(Code::Failed)? else {
            return Ok(None);
        };
        self.layout
            .write_credential(&json)
            .or_code(Code::StateWriteFailed)?;
        Ok(Some(json))
    }

    /// Writes the registry credential for dockerd, after the registry's listener is judged when
    /// it is on an address of this box (dockerd speaks plain HTTP to loopback registries).
    ///
    /// # Errors
    /// `REGISTRY_LISTENER_UNTRUSTED`; an unusable credential only warns (public images pull).
    fn write_registry_auth(&self, value: &SecretString) -> Result<(), Failure> {
        let mut on_box = false;
        if let Ok(auth) = bundle::RegistryAuth::parse(value, Some(&self.cfg.registry_host))
            && let Some(who) =
                peers::registry_check(self.cfg, auth.registry()).or_code(Code::Failed)?
        {
            info!("{who}");
            on_box = true;
        }
        let result = bundle::RegistryAuth::parse(value, Some(&self.cfg.registry_host))
            .map_err(anyhow::Error::new)
            .and_then(|auth| {
                redact::register_basic_auth(auth.username(), auth.password().expose_secret());
                let json = auth.docker_config_json();
                redact::register(json.expose_secret());
                let bytes = json.expose_secret().as_bytes();
                self.layout.write_credential(bytes)?;
                // A registry of this box gets its credential for each pull only; the network's
                // keeps it in config.json, for compose's own pulls too.
                if on_box {
                    self.layout.remove_docker_config()?;
                } else {
                    self.layout.write_docker_config(bytes)?;
                }
                Ok(auth.registry().to_string())
            });
        match result {
            Ok(registry) => info!("registry credential in place for {registry}"),
            Err(e) => warn!("registry credential unusable ({e:#}); private images will not pull"),
        }
        Ok(())
    }
}

/// What a release's `.env` is counted as before its values are read: a few hundred secrets of
/// a few hundred bytes.
const ENV_ALLOWANCE: u64 = 256 * 1024;

/// A bundle the bundle author must fix is kept on the box, so the advice to run
/// `bundle check` on it can be followed.
pub(super) fn keep_bad_bundle(agent: &Agent, sha: &Sha, raw: &[u8], e: &Failure) {
    if e.code.owner() != crate::code::Owner::BundleAuthor {
        return;
    }
    match crate::evidence::keep_bundle(&agent.layout, sha.as_str(), raw) {
        Ok(Some(path)) => info!(
            "kept the bundle as {}: `monky-deployd bundle check {} --env {}`",
            path.display(),
            path.display(),
            agent.cfg.env_id
        ),
        Ok(None) => {}
        Err(e) => warn!("cannot keep the failed bundle: {e:#}"),
    }
}

/// A missing image's pull failure, blamed on the services whose own image it is: compose
/// reports the one registry error for every service whose pull it cut short (`web Error
/// manifest for <worker's image> not found`), so those lines are dropped and the message
/// starts with `service: image <ref> not found`.
fn blame_missing(message: &str, runs: &[bundle::RunsAs]) -> String {
    let missing: Vec<String> = runs
        .iter()
        .filter(|r| {
            message.contains(&format!("manifest for {} not found", r.image))
                || message.contains(&format!("{}: not found", r.image))
        })
        .map(|r| format!("{}: image {} not found", r.service, r.image))
        .collect();
    if missing.is_empty() {
        return message.to_owned();
    }
    let words: Vec<&str> = message
        .split(" | ")
        .filter(|part| {
            !runs.iter().any(|r| {
                let said = part
                    .strip_prefix("compose pull failed: ")
                    .unwrap_or(part)
                    .starts_with(&format!("{} Error ", r.service));
                said && !part.contains(&r.image)
            })
        })
        .collect();
    format!("{}; {}", missing.join(", "), words.join(" | "))
}

/// Whether a pull failed because the registry refused the credential it was given (not a
/// missing tag, not a registry that is down).
fn credential_rejected(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    [
        "unauthorized",
        "authentication required",
        "incorrect username or password",
    ]
    .iter()
    .any(|p| lower.contains(p))
}

/// A pull's code: a tag never pushed is the bundle's, not the registry's (no credential fixes
/// it).
fn pull_code(e: &monky_compose::Error) -> Code {
    if e.is_missing_image() {
        Code::ImageNotFound
    } else {
        Code::ComposePullFailed
    }
}

fn refusal(r: bundle::Refusal) -> Failure {
    Failure::from(&r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_image_is_blamed_on_its_own_service() {
        let runs = |service: &str, image: &str| bundle::RunsAs {
            service: service.into(),
            image: image.into(),
            user: None,
            secrets: std::collections::BTreeSet::new(),
            files: std::collections::BTreeSet::new(),
            configs: std::collections::BTreeSet::new(),
            vars: std::collections::BTreeSet::new(),
        };
        let runs = [runs("web", "r/web:1"), runs("worker", "r/web:missing")];
        let said = "compose pull failed: worker Error manifest for r/web:missing not found: \
                    manifest unknown | web Error manifest for r/web:missing not found: manifest \
                    unknown | Error response from daemon: manifest for r/web:missing not found";
        let blamed = blame_missing(said, &runs);
        assert!(
            blamed.starts_with("worker: image r/web:missing not found; "),
            "{blamed}"
        );
        assert!(!blamed.contains("web Error"), "{blamed}");
        assert!(blamed.contains("worker Error manifest"), "{blamed}");
        assert_eq!(blame_missing("registry down", &runs), "registry down");
    }
}
