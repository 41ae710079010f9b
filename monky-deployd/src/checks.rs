//! The offline checks of a bundle: everything an apply refuses before any lease, secret read or
//! docker call that needs no knowledge of the box. The tick refuses on the first finding;
//! `monky-deployd bundle check` prints them all.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use monky_bao_client::KvPath;
use monky_bundle as bundle;
use secrecy::{ExposeSecret, SecretString};

use crate::exit::{Exit, Failure};

/// One refusal: its code and `CODE: names` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The refusal code.
    pub code: String,
    /// `CODE: names`, never a value.
    pub text: String,
}

impl Finding {
    fn from_refusal(r: &bundle::Refusal) -> Self {
        Self {
            code: r.code.as_str().to_string(),
            text: r.to_string(),
        }
    }

    /// The failure a tick ends with for this finding.
    pub fn into_failure(self) -> anyhow::Error {
        Failure::new(Exit::Fail, Some(self.code), self.text).into()
    }
}

/// Manifest paths, unresolved variables and privileged compose: the checks that need only the
/// bundle, the env id and the KV mount. Returns the KV paths to read and every finding.
pub fn offline(b: &bundle::Bundle, env_id: &str, kv_mount: &str) -> (Vec<KvPath>, Vec<Finding>) {
    let manifest = b.manifest();
    let mut findings = Vec::new();
    let mut paths = Vec::new();
    let mut outside = Vec::new();
    for e in &manifest.entries {
        match KvPath::parse(&e.path, kv_mount, env_id) {
            Ok(p) => paths.push(p),
            Err(_) => outside.push(if e.var.is_empty() {
                e.path.clone()
            } else {
                e.var.clone()
            }),
        }
    }
    if !outside.is_empty() {
        findings.push(Finding {
            code: "MANIFEST_PATH_REFUSED".into(),
            text: format!(
                "MANIFEST_PATH_REFUSED: outside {kv_mount}/data/{env_id}/see/: {}",
                outside.join(", ")
            ),
        });
    }
    let provided: BTreeSet<String> = manifest.env_entries().map(|e| e.var.clone()).collect();
    if let Err(r) = bundle::check_env_complete(b.env_template(), &provided) {
        findings.push(Finding::from_refusal(&r));
    }
    let known = known_env_values(b.env_template(), &provided);
    if !b.meta().allow_privileged
        && let Err(r) = bundle::check_privileged(b.compose(), &|n| known.get(n).cloned())
    {
        findings.push(Finding::from_refusal(&r));
    }
    (paths, findings)
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
    let Ok(rendered) = bundle::render_env(template, &unknown) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for line in rendered.expose_secret().lines() {
        let line = line.trim();
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let value = match value.as_bytes() {
            [q @ (b'"' | b'\''), .., e] if q == e => &value[1..value.len() - 1],
            _ => value.split(" #").next().unwrap_or_default().trim_end(),
        };
        if !line.starts_with('#') && !value.contains('$') {
            out.insert(name.trim().to_string(), value.to_string());
        }
    }
    out
}

/// A bundle from disk: a tar (optionally gzipped) or a directory of its members.
pub fn load(path: &Path) -> anyhow::Result<Result<bundle::Bundle, Finding>> {
    let bytes = if path.is_dir() {
        let mut files = std::collections::BTreeMap::new();
        for entry in
            std::fs::read_dir(path).with_context(|| format!("cannot read {}", path.display()))?
        {
            let entry = entry?;
            let name = entry.file_name();
            let member = bundle::MemberName::parse(name.as_encoded_bytes())
                .map_err(|r| anyhow::anyhow!("{}: {r}", entry.path().display()));
            match member {
                Ok(m) => {
                    files.insert(m, std::fs::read(entry.path())?);
                }
                Err(e) => {
                    return Ok(Err(Finding {
                        code: "BUNDLE_INVALID".into(),
                        text: format!("BUNDLE_INVALID: {e}"),
                    }));
                }
            }
        }
        bundle::pack_tar(&files)
    } else {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    Ok(
        bundle::Bundle::parse(&bytes, &bundle::Limits::default()).map_err(|e| match e.refusal() {
            Some(r) => Finding::from_refusal(r),
            None => Finding {
                code: "BUNDLE_INVALID".into(),
                text: format!("BUNDLE_INVALID: {e}"),
            },
        }),
    )
}

/// `monky-deployd bundle check <dir|tar> --env <env_id>`: prints the sha and each finding;
/// exit 0 when the bundle would pass every offline check.
pub fn bundle_check(
    path: &Path,
    env_id: &str,
    kv_mount: &str,
    expected_sha: Option<&str>,
) -> anyhow::Result<Exit> {
    let b = match load(path)? {
        Ok(b) => b,
        Err(f) => {
            outln!("FAIL {}", f.text);
            return Ok(Exit::Fail);
        }
    };
    outln!("sha256 {}", b.sha());
    let mut findings = Vec::new();
    if let Some(want) = expected_sha
        && let Err(r) = b.check_sha(want)
    {
        findings.push(Finding::from_refusal(&r));
    }
    findings.extend(offline(&b, env_id, kv_mount).1);
    for f in &findings {
        outln!("FAIL {}", f.text);
    }
    if findings.is_empty() {
        outln!(
            "ok   {} secret(s), renderer compose, no refusal",
            b.manifest().entries.len()
        );
        Ok(Exit::Ok)
    } else {
        Ok(Exit::Fail)
    }
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
    }
}
