//! The refusals of a bundle, as [`Failure`]s: everything an apply refuses before any lease,
//! secret read or docker call that needs no knowledge of the box, and the compose policy on
//! compose's own model. The tick refuses on the first; `monky-deployd bundle check` prints them
//! all.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use monky_bundle as bundle;
use monky_bundle::ResolvedEntry;
use secrecy::{ExposeSecret, SecretString};

use crate::code::Code;
use crate::exit::{Exit, Failure};

/// Manifest paths, unresolved variables, the compose policy on the file as the bundle carries
/// it and a secret on a command line: the bundle crate's offline verdict
/// ([`bundle::Verdict::offline`]), its refusals as the agent's failures. Returns every manifest
/// entry whose path resolved, with that path, and every refusal.
pub(crate) fn offline(
    b: &bundle::Bundle,
    env_id: &str,
    kv_mount: &str,
    base: &bundle::ComposePolicy,
) -> (Vec<ResolvedEntry>, Vec<Failure>) {
    let (entries, refused) = bundle::Verdict::offline(b, env_id, kv_mount, base).into_parts();
    (entries, refused.iter().map(Failure::from).collect())
}

/// Every refusal as one failure, for the tick's error and the report's detail: the first
/// refusal's code (host access comes first) and every refusal's text, so an operator sees every
/// finding at once instead of one per backoff.
pub(crate) fn all(refused: Vec<Failure>) -> Option<Failure> {
    let (first, rest) = refused.split_first()?;
    // The first's code is the combined failure's own, shown once in front; every other
    // refusal shows its own code.
    let message = (!first.message.is_empty())
        .then(|| first.message.clone())
        .into_iter()
        .chain(rest.iter().map(ToString::to_string))
        .collect::<Vec<_>>()
        .join("; ");
    Some(Failure::coded(first.code, message))
}

/// The compose policy on compose's own model of a release dir (`docker compose config`):
/// every refusal, or the failure of `compose config` itself (`COMPOSE_CONFIG_FAILED`); and
/// what else the model says: the images it names and the names it makes.
///
/// `raw_yaml` is the release's compose file, so that a value that came from a variable is
/// named by it; `dir` is the release dir compose resolved the model's paths against. Links on
/// the way of a path are followed as they are on disk now.
pub(crate) fn model(
    policy: &bundle::ComposePolicy,
    project: &monky_compose::Compose,
    raw_yaml: &str,
    dir: &Path,
    secret_keys: &std::collections::BTreeSet<String>,
) -> anyhow::Result<(Vec<Failure>, ModelFacts)> {
    let model = project
        .config_json()
        .map_err(|e| Failure::coded(Code::ComposeConfigFailed, config_cause(&e, dir)))?;
    let images: std::collections::BTreeSet<String> = model
        .get("services")
        .and_then(serde_json::Value::as_object)
        .into_iter()
        .flat_map(|services| services.values())
        .filter_map(|s| s.get("image")?.as_str())
        .map(str::to_owned)
        .collect();
    let made = crate::names::made_by(&model, project.project());
    let runs_as = bundle::runs_as(&model, raw_yaml, secret_keys);
    // What a `.env` value brings into a command for the container's shell to expand is only
    // visible here, after the secrets are read and before anything is pulled or started.
    let on_command_lines = if policy.secrets_on_command_lines_allowed() {
        Vec::new()
    } else {
        bundle::secrets_on_command_lines_model(&model, &runs_as)
    };
    let read_link = |p: &Path| std::fs::read_link(p).ok();
    let refused = policy
        .findings_model(model, raw_yaml, dir, &read_link)
        .iter()
        .chain(&on_command_lines)
        .map(Failure::from)
        .collect();
    let facts = ModelFacts {
        images: images.into_iter().collect(),
        made,
        runs_as,
    };
    Ok((refused, facts))
}

/// What compose's model of a release says besides the policy's findings.
#[derive(Debug, Default)]
pub(crate) struct ModelFacts {
    /// The images it names, each once, in order.
    pub(crate) images: Vec<String>,
    /// The containers, volumes and networks it makes.
    pub(crate) made: Vec<crate::names::Made>,
    /// Who each service runs as and which secret `.env` keys it gets.
    pub(crate) runs_as: Vec<bundle::RunsAs>,
}

/// Compose's own complaint first, the release dir cut out of it: the dir is a staging path
/// gone by the time an operator reads the message, and the member name is what they fix.
fn config_cause(e: &monky_compose::Error, dir: &Path) -> String {
    let dir = format!("{}/", dir.display());
    format!("compose config: {}", e.cause().replace(&dir, ""))
}

/// A bundle from disk: a tar (optionally gzipped) or a directory of its members.
pub(crate) fn load(path: &Path) -> anyhow::Result<Result<bundle::Bundle, Failure>> {
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
                    return Ok(Err(Failure::coded(Code::BundleInvalid, e.to_string())));
                }
            }
        }
        bundle::pack_tar(&files)
    } else {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    Ok(bundle::Bundle::parse(&bytes, &bundle::Limits::default()).map_err(|e| Failure::from(&e)))
}

/// `monky-deployd bundle check <dir|tar> --env <env_id>`: prints the sha and each refusal;
/// exit 0 when the bundle would pass every offline check.
///
/// The compose policy is the box's when `cfg` is given (its project name, allowlists and
/// budget), else the defaults for `env_id`. When `docker compose` is present, compose's own
/// model of the bundle is judged too, as the tick judges it, with the template's literal
/// values in `.env` and every secret a [`PLACEHOLDER`]; a model compose cannot build fails the
/// check (`COMPOSE_CONFIG_FAILED`), as it fails the tick. Findings that name a secret's
/// variable are noted as ones a real secret could still change.
pub(crate) fn bundle_check(
    path: &Path,
    env_id: &str,
    kv_mount: &str,
    expected_sha: Option<&str>,
    cfg: Option<&crate::config::Config>,
) -> anyhow::Result<Exit> {
    let b = match load(path)? {
        Ok(b) => b,
        Err(f) => {
            outln!("FAIL {f}");
            return Ok(Exit::Fail);
        }
    };
    outln!("sha256 {}", b.sha());
    let mut refusals = Vec::new();
    if let Some(want) = expected_sha {
        // A person's argument: read leniently (blanks around it, upper-case hex) into a sha;
        // text that is still no sha is a mismatch naming what was typed.
        let checked = match monky_agent_proto::Sha::parse(&want.trim().to_ascii_lowercase()) {
            Ok(sha) => b.check_sha(&sha.digest()),
            Err(_) => Err(b.sha_mismatch(want.trim())),
        };
        if let Err(r) = checked {
            refusals.push(Failure::from(&r));
        }
    }
    let base = match cfg {
        Some(c) => c.compose_policy(false),
        // The defaults a config without `budget:` would give on this box.
        None => bundle::ComposePolicy::new(&format!("monky-{env_id}")).budget(bundle::Budget {
            max_memory: crate::host::memory_bytes(),
            max_cpus: crate::host::cpus(),
            ..bundle::Budget::default()
        }),
    };
    let verdict = bundle::Verdict::offline(&b, env_id, kv_mount, &base);
    refusals.extend(verdict.refusals().iter().map(Failure::from));
    let mut runs = Vec::new();
    if verdict.compose_unreadable().is_none() {
        let (found, facts) = model_of_bundle(&b, &base, cfg)?;
        runs = facts;
        for f in found {
            if !refusals.contains(&f) {
                refusals.push(f);
            }
        }
    }
    for f in &refusals {
        outln!("FAIL {f}");
        if let Some(line) = locate(b.compose(), &f.message) {
            outln!("     at {}:{line}", b.compose_file_name());
        }
        outln!("     fix: {}", fix_for(f));
    }
    let secret_vars: Vec<String> = b
        .manifest()
        .env_entries()
        .map(|e| format!("${{{}}}", e.var))
        .filter(|v| refusals.iter().any(|f| f.message.contains(v.as_str())))
        .collect();
    if !secret_vars.is_empty() {
        outln!(
            "note: judged with placeholder secrets; a real secret could still change the findings that name {}",
            secret_vars.join(", ")
        );
    }
    for line in shared_uid_notes(&runs) {
        outln!("{line}");
    }
    for limit in bundle::Budget::per_uid_ulimits_of(b.compose()) {
        outln!("note: {limit}: {PER_UID_ULIMIT}");
    }
    if refusals.is_empty() {
        outln!(
            "ok   {} secret(s), renderer compose, no refusal",
            b.manifest().entries.len()
        );
        Ok(Exit::Ok)
    } else {
        Ok(Exit::Fail)
    }
}

/// The fix of one finding: for a service key the policy's table refuses outright (`web:
/// build`), that key's own reason and its removal; otherwise its code's next step.
fn fix_for(f: &Failure) -> String {
    let step = crate::code::CodePolicy::next_step(f.code);
    let Some((service, rest)) = f.message.split_once(": ") else {
        return step.to_owned();
    };
    let key: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let whole_key = rest.len() == key.len() || rest[key.len()..].starts_with([',', ' ']);
    let row = bundle::policy::TABLE.iter().find(|r| {
        r.path.strip_prefix("services.*.") == Some(key.as_str())
            && matches!(r.rule, bundle::policy::Rule::Refused)
    });
    match row {
        Some(row) if whole_key && !service.contains(char::is_whitespace) => format!(
            "remove `{key}` from {service}: {} (`monky-deployd bundle check` again once the \
             renderer's output changed)",
            row.why
        ),
        _ => step.to_owned(),
    }
}

/// What a `ulimits` line the kernel counts per host uid means on a shared box, for `bundle
/// check` and `doctor`: information, not a refusal.
pub(crate) const PER_UID_ULIMIT: &str = "applies to this container only, but the kernel counts it per \
     host uid: processes (or signals, or queue bytes) of any container or host account running \
     as the same uid, in any env, count toward it, so the service may fail to fork where \
     another env runs as its uid; its own processes are bounded by its pids limit";

/// What `bundle check` can say of `SECRET_READABLE_ON_HOST`, which only the box judges (its
/// accounts, its engine's user namespaces, the image's `USER` after the pull): one note per
/// service that gets a secret and does not run as root by its own `user:`.
fn shared_uid_notes(runs: &[bundle::RunsAs]) -> Vec<String> {
    runs.iter()
        .filter(|r| r.gets_a_secret())
        .filter_map(|r| {
            let who = match r.user.as_deref() {
                Some(u) => match crate::shared_uid::plain_uid(u) {
                    Some(0) => return None,
                    Some(uid) => format!("runs as uid {uid}"),
                    None => format!("runs as user {u:?} (a name the image's /etc/passwd resolves)"),
                },
                None => "runs as its image's USER".to_owned(),
            };
            let secrets: BTreeSet<&str> = r
                .secrets
                .iter()
                .chain(&r.files)
                .chain(&r.configs)
                .map(String::as_str)
                .collect();
            Some(format!(
                "note: {}: {who} and gets {}; judged on the box after the pull, not here: \
                 SECRET_READABLE_ON_HOST where a host account has that uid and the engine does \
                 not remap user namespaces",
                r.service,
                secrets.into_iter().collect::<Vec<_>>().join(", ")
            ))
        })
        .collect()
}

/// The line of the compose file a finding names, when it names a service and a key
/// (`web: network_mode host`, `web: ports 8200 ...`, `web: cap_add SYS_ADMIN`): the service's
/// line under `services:`, then the first line of its block that holds the key. A finding of
/// another shape (a manifest's, a total, a top-level network's) has none.
fn locate(compose: &str, message: &str) -> Option<usize> {
    let (service, rest) = message.split_once(": ")?;
    if service.is_empty() || service.contains(char::is_whitespace) {
        return None;
    }
    let key: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let lines: Vec<&str> = compose.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let named = |l: &str, name: &str| {
        let t = l.trim_start();
        t.strip_prefix(name)
            .or_else(|| t.strip_prefix(&format!("\"{name}\"")))
            .or_else(|| t.strip_prefix(&format!("'{name}'")))
            .is_some_and(|r| r.trim_start().starts_with(':'))
    };
    let services = lines
        .iter()
        .position(|l| indent(l) == 0 && named(l, "services"))?;
    let (at, head) = lines
        .iter()
        .enumerate()
        .skip(services + 1)
        .find(|(_, l)| indent(l) > 0 && named(l, service))?;
    let depth = indent(head);
    let mut found = at;
    if !key.is_empty() {
        for (n, l) in lines.iter().enumerate().skip(at + 1) {
            if !l.trim().is_empty() && !l.trim_start().starts_with('#') && indent(l) <= depth {
                break;
            }
            if named(l, &key) {
                found = n;
                break;
            }
        }
    }
    Some(found + 1)
}

/// What `bundle check` puts in `.env` for every secret: digits, which compose accepts wherever
/// a template puts a value (a string, a port, a count, a size in bytes, a name), so a model
/// compose builds with the real values builds with these too. The values a real secret brings
/// are judged by the tick on the real model.
pub(crate) const PLACEHOLDER: &str = "1024";

/// [`model`] for `bundle check`: the members and a `.env` with [`PLACEHOLDER`] secrets in a
/// private temp dir, compose run there, and who each service runs as. No refusal when
/// `docker compose` is not there to ask; `COMPOSE_CONFIG_FAILED` when compose cannot build the
/// model.
fn model_of_bundle(
    b: &bundle::Bundle,
    base: &bundle::ComposePolicy,
    cfg: Option<&crate::config::Config>,
) -> anyhow::Result<(Vec<Failure>, Vec<bundle::RunsAs>)> {
    let docker_bin = cfg.map_or_else(
        || Path::new("docker").to_path_buf(),
        |c| c.docker_bin.clone(),
    );
    let dir = tempfile::Builder::new()
        .prefix("monky-bundle-check.")
        .tempdir()
        .context("cannot make a temp dir for compose's model")?;
    let docker = monky_compose::Docker::builder(docker_bin)
        .docker_config(dir.path().join("docker"))
        .build()
        .context("docker")?;
    if let Err(e) = docker.compose_info() {
        errln!("note: compose's model not checked: {e}");
        return Ok((Vec::new(), Vec::new()));
    }
    let release = dir.path().join("release");
    std::fs::create_dir(&release)?;
    for (name, bytes) in b.files() {
        std::fs::write(release.join(name.as_str()), bytes)?;
    }
    let provided: BTreeMap<String, SecretString> = b
        .manifest()
        .env_entries()
        .map(|e| (e.var.clone(), SecretString::from(PLACEHOLDER)))
        .collect();
    let env = bundle::render_env(b.env_template(), &provided)
        .map(|e| e.expose_secret().to_string())
        .unwrap_or_default();
    std::fs::write(release.join(crate::release::ENV_FILE), env)?;
    // compose reads the agent's plain rewrite, as in a tick; a file that does not parse was
    // refused above already, and its own text then goes to compose for its own complaint.
    let file = match bundle::plain_compose(b.compose()) {
        Ok(plain) => {
            std::fs::write(release.join(bundle::PLAIN_COMPOSE_FILE), plain)?;
            release.join(bundle::PLAIN_COMPOSE_FILE)
        }
        Err(_) => release.join(b.compose_file_name()),
    };
    let mut compose = docker.compose(
        base.project(),
        &release,
        &file,
        &release.join(crate::release::ENV_FILE),
    );
    // The pids limit the tick supplies, as the tick supplies it.
    if let Some(text) = base.budget_of().budget_override_for(b.compose()) {
        let over = release.join(bundle::budget::OVERRIDE_FILE);
        std::fs::write(&over, text)?;
        compose = compose.with_override(&over);
    }
    let policy = base
        .clone()
        .allow_privileged(b.meta().allow_privileged)
        .route_hosts([b.meta().address.clone()])
        .pids_supplied(true);
    let vars = b.manifest().env_entries().map(|e| e.var.clone()).collect();
    let secret_keys = bundle::secret_keys(b.env_template(), &vars);
    // The temp dir is gone when the findings are read: a path under it is the release's own,
    // named as the bundle names it (`./x`), so the same finding of both checks is listed once.
    let relative = |f: Failure| {
        let shown = f
            .message
            .replace(&format!("{}/", release.display()), "./")
            .replace(&release.display().to_string(), ".");
        Failure::coded(f.code, shown)
    };
    match model(&policy, &compose, b.compose(), &release, &secret_keys) {
        Ok((refused, facts)) => Ok((refused.into_iter().map(relative).collect(), facts.runs_as)),
        // The tick fails on the same model: so does the check.
        Err(e) => {
            let (code, why) = Failure::of(&e).map_or_else(
                || (Code::ComposeConfigFailed, format!("{e:#}")),
                |f| (f.code, f.message.clone()),
            );
            Ok((
                vec![Failure::coded(
                    code,
                    crate::redact::redact(&why).into_string(),
                )],
                Vec::new(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_finding_is_located_at_its_services_key() {
        let compose = "x-a: 1\nservices:\n  db:\n    image: pg\n    cap_add: [X]\n  \"web\":\n    image: x\n\n    # note\n    network_mode: host\nnetworks:\n  web: {}\n";
        assert_eq!(super::locate(compose, "web: network_mode host"), Some(10));
        assert_eq!(super::locate(compose, "db: cap_add SYS_ADMIN"), Some(5));
        // A key the service does not spell out (a default, an extends): its own line.
        assert_eq!(super::locate(compose, "web: pids_limit unset"), Some(6));
        assert_eq!(super::locate(compose, "api: ports 22"), None);
        assert_eq!(super::locate(compose, "outside monky/data/x: STOLEN"), None);
    }

    use super::*;

    #[test]
    fn a_config_failure_says_composes_words_first_without_the_staging_path() {
        let dir = Path::new("/var/lib/monky-deployd/staging/0123abcd");
        let e = monky_compose::Error::Failed {
            what: format!(
                "docker compose --ansi never -p monky-env-qa -f {}/compose.yaml --env-file {}/.env --profile * config --format json",
                dir.display(),
                dir.display()
            ),
            code: Some(15),
            stderr: format!(
                "validating {}/compose.yaml: services.web.ports must be a array\n",
                dir.display()
            ),
        };
        assert_eq!(
            config_cause(&e, dir),
            "compose config: validating compose.yaml: services.web.ports must be a array"
        );
    }
}
