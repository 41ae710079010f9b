//! The offline verdict on a bundle: every refusal that needs only the bundle, the env, the KV
//! mount and the box's compose policy, so tenancy's renderer refuses at render time what a box
//! refuses at apply time, before any lease or secret read.

use std::collections::{BTreeMap, BTreeSet};

use secrecy::{ExposeSecret, SecretString};

use crate::refusal::{Refusal, RefusalCode};
use crate::{Bundle, ComposePolicy, KvPath, ManifestEntry};

/// A manifest entry with the KV path it reads: the manifest as an apply reads it, each entry
/// resolved once where its path is checked, so entries and paths never travel as two lists.
#[derive(Debug, Clone)]
pub struct ResolvedEntry {
    /// The entry as the manifest gives it.
    pub entry: ManifestEntry,
    /// Its path, proven to be under the env's own prefix.
    pub path: KvPath,
}

/// The offline checks' outcome: each manifest entry with its KV path, and every refusal, in the order the checks
/// run (manifest paths, unresolved variables, the compose policy on the file as the bundle
/// carries it, a secret on a command line).
///
/// ```
/// use std::collections::BTreeMap;
/// use monky_bundle::{Bundle, ComposePolicy, Limits, MemberName, RefusalCode, Verdict, pack_tar};
///
/// let files = BTreeMap::from([
///     (MemberName::DOCKER_COMPOSE_YML, b"services:\n  web:\n    image: nginx\n    privileged: true\n".to_vec()),
///     (MemberName::ENV_TEMPLATE, b"KEY=${KEY}\n".to_vec()),
///     (
///         MemberName::SECRETS_MANIFEST,
///         br#"{"vault_mode":"openbao","entries":[{"var":"KEY","path":"monky/env-qa-03/see/key","kind":"supplied","version":1}]}"#.to_vec(),
///     ),
///     (MemberName::BUNDLE_JSON, br#"{"env_id":"env-qa-02","tier":"dev","renderer":"compose"}"#.to_vec()),
/// ]);
/// let bundle = Bundle::parse(&pack_tar(&files), &Limits::default())?;
/// let verdict = Verdict::offline(&bundle, "env-qa-02", "monky", &ComposePolicy::new("monky-env-qa-02"));
/// let codes: Vec<RefusalCode> = verdict.refusals().iter().map(|r| r.code).collect();
/// assert_eq!(codes, [RefusalCode::ManifestPathRefused, RefusalCode::PrivilegedRefused]);
/// assert!(verdict.entries().is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Verdict {
    entries: Vec<ResolvedEntry>,
    refusals: Vec<Refusal>,
    /// The index in `refusals` of the one saying the compose file cannot be read.
    unreadable: Option<usize>,
}

impl Verdict {
    /// Judges `bundle` for `env_id` with the box's `policy` (whose `allow_privileged` is
    /// replaced by the bundle's own, and whose routing hosts gain the bundle's `address`): manifest paths under `kv_mount`, the variables of
    /// `.env.template`, the compose policy on the compose file with the values known before any
    /// secret is read, and a secret on a command line. No IO.
    #[must_use]
    pub fn offline(bundle: &Bundle, env_id: &str, kv_mount: &str, policy: &ComposePolicy) -> Self {
        let manifest = bundle.manifest();
        let mut refusals = Vec::new();
        let mut entries = Vec::new();
        let mut outside = Vec::new();
        for e in &manifest.entries {
            match KvPath::parse(&e.path, kv_mount, env_id) {
                Ok(path) => entries.push(ResolvedEntry {
                    entry: e.clone(),
                    path,
                }),
                Err(_) => outside.push(if e.var.is_empty() {
                    e.path.clone()
                } else {
                    e.var.clone()
                }),
            }
        }
        if !outside.is_empty() {
            refusals.push(Refusal::one(
                RefusalCode::ManifestPathRefused,
                format!(
                    "outside {kv_mount}/data/{env_id}/see/: {}",
                    outside.join(", ")
                ),
            ));
        }
        let provided: BTreeSet<String> = manifest.env_entries().map(|e| e.var.clone()).collect();
        if let Err(r) = crate::check_env_complete(bundle.env_template(), &provided) {
            refusals.push(r);
        }
        let known = known_env_values(bundle.env_template(), &provided);
        let policy = policy
            .clone()
            .allow_privileged(bundle.meta().allow_privileged)
            .route_hosts([bundle.meta().address.clone()]);
        let mut unreadable = None;
        match policy.judge_file(bundle.compose(), &|n| known.get(n).cloned(), &provided) {
            Ok(found) => refusals.extend(found),
            Err(r) => {
                unreadable = Some(refusals.len());
                refusals.push(r);
            }
        }
        if !policy.secrets_on_command_lines_allowed() {
            let secret_keys = crate::secret_keys(bundle.env_template(), &provided);
            refusals.extend(crate::secrets_on_command_lines(
                bundle.compose(),
                &secret_keys,
            ));
        }
        Verdict {
            entries,
            refusals,
            unreadable,
        }
    }

    /// Every manifest entry whose path is the env's own, with that path, in manifest order.
    #[must_use]
    pub fn entries(&self) -> &[ResolvedEntry] {
        &self.entries
    }

    /// Every refusal, in the order the checks ran; empty when the bundle passes.
    #[must_use]
    pub fn refusals(&self) -> &[Refusal] {
        &self.refusals
    }

    /// The refusal saying the compose file cannot be read as a compose document (its YAML, its
    /// interpolation, a top level that is not a mapping), when it cannot: compose's own model
    /// of such a file is not worth building.
    #[must_use]
    pub fn compose_unreadable(&self) -> Option<&Refusal> {
        self.unreadable.map(|i| &self.refusals[i])
    }

    /// The resolved entries and the refusals.
    #[must_use]
    pub fn into_parts(self) -> (Vec<ResolvedEntry>, Vec<Refusal>) {
        (self.entries, self.refusals)
    }
}

/// The values compose will interpolate from `.env` that are known before any secret is read:
/// the template's literal assignments and the defaults of variables no manifest entry provides.
/// A line that still holds a reference depends on a secret and is left out, so a compose file
/// made privileged by `NET=host` in the template is refused here, before the lease; one made
/// privileged by a secret's value is refused after staging, on compose's own interpolation.
fn known_env_values(template: &str, provided: &BTreeSet<String>) -> BTreeMap<String, String> {
    // Every provided variable renders as a bare `$`, which marks its line as unknown.
    let unknown: BTreeMap<String, SecretString> = provided
        .iter()
        .map(|n| (n.clone(), SecretString::from("$")))
        .collect();
    // `$` can be written in every place a template puts a value, so rendering cannot refuse.
    let Ok(rendered) = crate::render_env(template, &unknown) else {
        return BTreeMap::new();
    };
    // Read as compose reads it; a value still holding a `$` depends on a secret.
    crate::read_env(rendered.expose_secret())
        .filter(|(_, value)| !value.contains('$'))
        .map(|(name, value)| (name.to_string(), value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(template: &str, provided: &[&str], expected: &[(&str, &str)]) {
        let provided = provided.iter().map(|s| s.to_string()).collect();
        let got = known_env_values(template, &provided);
        let expected: BTreeMap<String, String> = expected
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, expected, "{template}");
    }

    #[test]
    fn known_values_are_literals_and_unprovided_defaults() {
        check("NET=host\n# X=y\n\nnoise\n", &[], &[("NET", "host")]);
        check(
            "A=\"quoted # kept\"\nB='single'\nexport C=plain # comment\n",
            &[],
            &[("A", "quoted # kept"), ("B", "single"), ("C", "plain")],
        );
        // A provided variable is a secret: unknown, default or not.
        check(
            "S=${SOCK:-/var/run/docker.sock}\nT=${SECRET}\nU=x${SECRET}y\n",
            &["SOCK", "SECRET"],
            &[],
        );
        check(
            "S=${SOCK:-/var/run/docker.sock}\nD=$$literal\n",
            &[],
            &[("S", "/var/run/docker.sock")],
        );
        // Quoting as compose reads it (the agent's own reader once kept escapes and the quotes
        // of a quoted value followed by a comment).
        check(
            "A=\"q\\\"d\" # note\nB='s\\'x'\nC=\"x\"y\nD=x\t#y\n",
            &[],
            &[("A", "q\"d"), ("B", "s'x"), ("C", "x"), ("D", "x\t#y")],
        );
    }
}
