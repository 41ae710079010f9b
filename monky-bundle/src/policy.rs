//! The compose policy: one default-deny table that says, for every key a compose file may use,
//! whether a bundle may use it freely, under a constraint, only with `allow_privileged`, or not
//! at all. A key the table does not know is refused, so a new compose feature never slips
//! through unjudged.
//!
//! The same table judges the compose file as the bundle carries it (before any lease) and
//! compose's own interpolated model (`docker compose config --format json`), which is the
//! authority: only there is a value that came from a secret visible.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use serde_json::{Map, Value};

use crate::budget::{Budget, tmpfs_options};
use crate::checks::{interpolate_compose, parse_compose, scrub};
use crate::interp::{key_value, raw_vars};
use crate::member::MemberName;
use crate::mount::{Mount, MountKind, truthy};
use crate::refusal::{Refusal, RefusalCode, printable};

mod paths;
pub mod registries;
mod routes;
mod table;

use Constraint as C;
use table::index;
pub use table::{Constraint, Rule, TABLE, TableRow, rule_of};

/// Docker's default capabilities: adding one back after a `cap_drop` gives nothing docker
/// would not give anyway.
const DEFAULT_CAPS: [&str; 14] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// A host path prefix the box's admin allows to be bound into containers, read-only or not.
///
/// Parsed from `path:ro` or `path:rw`; the path must be absolute and plain (no `.` or `..`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedBind {
    prefix: PathBuf,
    writable: bool,
}

impl AllowedBind {
    /// The box's default: the clock's time zone, read-only.
    #[must_use]
    pub fn defaults() -> Vec<AllowedBind> {
        vec![
            AllowedBind {
                prefix: "/etc/localtime".into(),
                writable: false,
            },
            AllowedBind {
                prefix: "/etc/timezone".into(),
                writable: false,
            },
        ]
    }

    fn covers(&self, path: &Path, writable: bool) -> bool {
        path.starts_with(&self.prefix) && (self.writable || !writable)
    }
}

impl FromStr for AllowedBind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (path, mode) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?}: expected path:ro or path:rw"))?;
        let writable = match mode {
            "ro" => false,
            "rw" => true,
            _ => return Err(format!("{s:?}: the mode must be ro or rw")),
        };
        let prefix = PathBuf::from(path);
        let plain = prefix.is_absolute()
            && prefix
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
            && !path.ends_with('/');
        if !plain || path.contains("//") {
            return Err(format!(
                "{s:?}: the path must be absolute, without . or .. or a trailing /"
            ));
        }
        Ok(AllowedBind { prefix, writable })
    }
}

impl fmt::Display for AllowedBind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.writable { "rw" } else { "ro" };
        write!(f, "{}:{mode}", self.prefix.display())
    }
}

/// The compose policy of one box for one bundle: the agent's project name, the box admin's
/// allowlists, and the bundle's `allow_privileged`.
///
/// ```
/// use monky_bundle::ComposePolicy;
/// let policy = ComposePolicy::new("monky-env-qa-02");
/// let ok = "services:\n  web:\n    image: nginx\n    volumes:\n      - ./conf:/conf:ro\n";
/// let secrets = Default::default();
/// policy.check_file(ok, &|_| None, &secrets)?;
/// let bad = "services:\n  web:\n    image: nginx\n    cap_add: [SYS_MODULE]\n";
/// let err = policy.check_file(bad, &|_| None, &secrets).unwrap_err();
/// assert_eq!(err.to_string(), "PRIVILEGED_REFUSED: web: cap_add SYS_MODULE");
/// assert!(policy.allow_privileged(true).check_file(bad, &|_| None, &secrets).is_ok());
/// # Ok::<(), monky_bundle::Refusal>(())
/// ```
#[derive(Debug, Clone)]
pub struct ComposePolicy {
    project: String,
    allowed_binds: Vec<AllowedBind>,
    external_volumes: BTreeSet<String>,
    external_networks: BTreeSet<String>,
    allow_privileged: bool,
    budget: Budget,
    pids_supplied: bool,
    allow_unprefixed_names: bool,
    registry_host: Option<String>,
    registries: Option<registries::Registries>,
    allow_secrets_on_command_lines: bool,
    route_hosts: Vec<String>,
}

impl ComposePolicy {
    /// The policy for `project` with the default allowlists and no `allow_privileged`.
    #[must_use]
    pub fn new(project: &str) -> Self {
        ComposePolicy {
            project: project.to_string(),
            allowed_binds: AllowedBind::defaults(),
            external_volumes: BTreeSet::new(),
            external_networks: BTreeSet::new(),
            allow_privileged: false,
            budget: Budget::default(),
            pids_supplied: false,
            allow_unprefixed_names: false,
            registry_host: None,
            registries: None,
            allow_secrets_on_command_lines: false,
            route_hosts: Vec::new(),
        }
    }

    /// Adds hosts that routing labels (traefik's router rules, caddy-docker-proxy's site
    /// addresses) may name: the env's own address (bundle.json's `address`) and the box's
    /// `allowed_route_hosts` (exact names, `*.suffix` for the names below a domain, `*` for
    /// any). A label naming another host, or one whose hosts cannot be read off it, is refused.
    #[must_use]
    pub fn route_hosts<S: Into<String>>(mut self, hosts: impl IntoIterator<Item = S>) -> Self {
        self.route_hosts.extend(
            hosts
                .into_iter()
                .map(Into::into)
                .filter(|h: &String| !h.trim().is_empty()),
        );
        self
    }

    /// The compose project name the policy holds a bundle to.
    #[must_use]
    pub fn project(&self) -> &str {
        &self.project
    }

    /// The host paths the box allows to be bound (`allowed_binds`).
    #[must_use]
    pub fn allowed_binds(mut self, binds: Vec<AllowedBind>) -> Self {
        self.allowed_binds = binds;
        self
    }

    /// The external volumes the box allows (`allowed_external_volumes`).
    #[must_use]
    pub fn allowed_external_volumes<I: IntoIterator<Item = String>>(mut self, names: I) -> Self {
        self.external_volumes = names.into_iter().collect();
        self
    }

    /// The external networks the box allows (`allowed_external_networks`).
    #[must_use]
    pub fn allowed_external_networks<I: IntoIterator<Item = String>>(mut self, names: I) -> Self {
        self.external_networks = names.into_iter().collect();
        self
    }

    /// The bundle's `allow_privileged`: waives every `PRIVILEGED_REFUSED` finding, never a
    /// `BUNDLE_INVALID` one.
    #[must_use]
    pub fn allow_privileged(mut self, allow: bool) -> Self {
        self.allow_privileged = allow;
        self
    }

    /// The box's `allow_secrets_on_command_lines`: waives every `SECRET_ON_COMMAND_LINE`
    /// finding, on a box whose admin knows that no other account reads a process's arguments
    /// (`/proc` mounted `hidepid`, no host account sharing a container's uid).
    #[must_use]
    pub fn allow_secrets_on_command_lines(mut self, allow: bool) -> Self {
        self.allow_secrets_on_command_lines = allow;
        self
    }

    /// Whether [`ComposePolicy::allow_secrets_on_command_lines`] is set.
    #[must_use]
    pub fn secrets_on_command_lines_allowed(&self) -> bool {
        self.allow_secrets_on_command_lines
    }

    /// The box's own registry (`registry_host`), the one registry on the box's loopback an
    /// image may name. Without it (a check with no box behind it, tenancy's tooling) a
    /// registry on loopback is not judged: which one is the box's own, only the box knows.
    #[must_use]
    pub fn registry_host(mut self, host: Option<&str>) -> Self {
        self.registry_host = host.map(str::to_ascii_lowercase);
        self
    }

    /// The box's view of registries (its resolver and the registries its admin allows on its
    /// own addresses): an image whose registry resolves to an address of the box is refused
    /// (`REGISTRY_NOT_ALLOWED`) unless allowed by name, and one the resolver cannot answer for
    /// is not judged (`REGISTRY_UNAVAILABLE`). Without it (no box behind the check) only the
    /// spelling is judged.
    #[must_use]
    pub fn registries(mut self, registries: Option<registries::Registries>) -> Self {
        self.registries = registries;
        self
    }

    /// One more registry allowed on the box's own addresses (the env's credential's, which
    /// the agent proves the box's before it hands the credential to dockerd); nothing without
    /// [`ComposePolicy::registries`].
    #[must_use]
    pub fn registry_allowed(mut self, registry: &str) -> Self {
        self.registries = self.registries.take().map(|r| r.allowing(registry));
        self
    }

    /// The box's [`Budget`]: what one project may take of the box (`BUDGET_EXCEEDED`).
    #[must_use]
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// The budget in force.
    #[must_use]
    pub fn budget_of(&self) -> &Budget {
        &self.budget
    }

    /// Whether the agent supplies the budget's defaults (a pids and a memory limit, bounded
    /// logging) to services that set none, through the override of
    /// [`Budget::budget_override`]: then compose's model must show each for every service, and
    /// a service without one is refused.
    #[must_use]
    pub fn pids_supplied(mut self, supplied: bool) -> Self {
        self.pids_supplied = supplied;
        self
    }

    /// The box's `allow_unprefixed_names`: waives every `BUNDLE_NONCONFORMING` finding (a
    /// container, volume or network name outside the project's), never a host-access one.
    #[must_use]
    pub fn allow_unprefixed_names(mut self, allow: bool) -> Self {
        self.allow_unprefixed_names = allow;
        self
    }

    /// Judges the compose file as the bundle carries it, before any secret is read.
    ///
    /// The YAML is parsed under limits (duplicate keys refused, aliases and merge keys
    /// expanded), every string is interpolated through `env` with compose's rules (the
    /// values known before the lease: the template's literals and defaults), and the tree
    /// is judged against [`TABLE`]. Relative paths are judged against the release dir, as
    /// compose resolves them.
    ///
    /// `secrets` names the variables whose values are secrets, unknown until the lease. A file
    /// path (`env_file`, `label_file`, a config's or secret's `file`) may not take its value
    /// from one: compose reads those files into its model, so the model could not show them.
    pub fn check_file(
        &self,
        compose_yaml: &str,
        env: &dyn Fn(&str) -> Option<String>,
        secrets: &BTreeSet<String>,
    ) -> Result<(), Refusal> {
        first(self.findings_file(compose_yaml, env, secrets))
    }

    /// Every refusal of [`check_file`](Self::check_file): at most one per code, host access
    /// first (`PRIVILEGED_REFUSED`, `BUNDLE_INVALID`, `BUNDLE_NONCONFORMING`,
    /// `BUDGET_EXCEEDED`).
    pub fn findings_file(
        &self,
        compose_yaml: &str,
        env: &dyn Fn(&str) -> Option<String>,
        secrets: &BTreeSet<String>,
    ) -> Vec<Refusal> {
        self.judge_file(compose_yaml, env, secrets)
            .unwrap_or_else(|unreadable| vec![unreadable])
    }

    /// [`findings_file`](Self::findings_file), with the refusal that the file cannot be read
    /// as a compose document at all (its YAML, its interpolation, or a top level that is not
    /// a mapping) as `Err`, so a caller knows compose's own model of it is not worth building.
    pub(crate) fn judge_file(
        &self,
        compose_yaml: &str,
        env: &dyn Fn(&str) -> Option<String>,
        secrets: &BTreeSet<String>,
    ) -> Result<Vec<Refusal>, Refusal> {
        let mut doc = parse_compose(compose_yaml)?;
        // The file as written holds no secret value: it may be kept to name variables.
        let raw = doc.clone();
        // compose sets COMPOSE_PROJECT_NAME to the `-p` project for interpolation, whatever
        // `.env` says (measured with compose 2.26). The agent runs compose in the release dir
        // with `PWD` set to it, as a shell there would have it, and the process's environment
        // wins over `.env`: `$PWD` is the release dir, which a relative path here stands for.
        let env = |n: &str| match n {
            "COMPOSE_PROJECT_NAME" => Some(self.project.clone()),
            "PWD" => Some(".".to_owned()),
            _ => env(n),
        };
        let verdict = match interpolate_compose(&mut doc, &env) {
            Ok(()) if !doc.is_object() => Err(not_a_mapping()),
            Ok(()) => {
                let ctx = Ctx {
                    policy: self,
                    release: None,
                    release_dir: None,
                    read_link: &|_| None,
                    secrets: Some(secrets),
                };
                Ok(ctx.judge(&doc, &raw, false))
            }
            // Too many bytes of values interpolated: the document reads, it is only too large.
            Err(r) if r.code == RefusalCode::BundleTooLarge => Ok(vec![r]),
            Err(r) => Err(r),
        };
        // Interpolated strings may hold values: zero them before the tree is freed.
        scrub(&mut doc);
        verdict
    }

    /// Judges compose's own model of a release (`docker compose config --format json`),
    /// whose paths compose made absolute from `release_dir`.
    ///
    /// `raw_yaml` is the release's compose file: a finding whose key takes any value from a
    /// variable names the variable instead of printing the value. Paths are resolved through
    /// `read_link` (symlinks on the box, e.g. a link a container planted in a bound dir)
    /// before they are judged. The model is zeroed before it is freed, whatever the verdict.
    pub fn check_model(
        &self,
        model: Value,
        raw_yaml: &str,
        release_dir: &Path,
        read_link: &dyn Fn(&Path) -> Option<PathBuf>,
    ) -> Result<(), Refusal> {
        first(self.findings_model(model, raw_yaml, release_dir, read_link))
    }

    /// Every refusal of [`check_model`](Self::check_model): at most one per code, in the
    /// order of [`findings_file`](Self::findings_file).
    pub fn findings_model(
        &self,
        mut model: Value,
        raw_yaml: &str,
        release_dir: &Path,
        read_link: &dyn Fn(&Path) -> Option<PathBuf>,
    ) -> Vec<Refusal> {
        let raw = parse_compose(raw_yaml).unwrap_or(Value::Null);
        let release = resolve(&lexical(release_dir), read_link);
        let ctx = Ctx {
            policy: self,
            release: Some(release),
            release_dir: Some(lexical(release_dir)),
            read_link,
            secrets: None,
        };
        let verdict = ctx.judge(&model, &raw, true);
        scrub(&mut model);
        verdict
    }
}

fn not_a_mapping() -> Refusal {
    Refusal::invalid("compose file: not a mapping")
}

fn first(mut refusals: Vec<Refusal>) -> Result<(), Refusal> {
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(refusals.swap_remove(0))
    }
}

/// What a finding costs: `PRIVILEGED_REFUSED` (waived by `allow_privileged`),
/// `BUNDLE_INVALID` (never waived), or `BUNDLE_NONCONFORMING` (waived by the box's
/// `allow_unprefixed_names`; no host access).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Severity {
    Privileged,
    Invalid,
    Nonconforming,
    Registry,
    Unresolved,
    /// A routing label naming a host that is not the env's: `BUNDLE_NONCONFORMING`, which
    /// only the box's `allowed_route_hosts` widens (not `allow_unprefixed_names`, nor the
    /// bundle's `allow_privileged`).
    Route,
}

struct Ctx<'a> {
    policy: &'a ComposePolicy,
    /// The release dir with its links resolved; `None` for the file as the bundle carries it.
    release: Option<PathBuf>,
    /// The release dir as compose was given it (lexical), which the model's paths start with.
    release_dir: Option<PathBuf>,
    read_link: &'a dyn Fn(&Path) -> Option<PathBuf>,
    /// The secret variables, when the file as the bundle carries it is judged.
    secrets: Option<&'a BTreeSet<String>>,
}

/// Where a key sits while the tree is walked.
#[derive(Clone, Copy)]
struct Site<'a> {
    /// `web` for a service, `volumes.pgdata` for a top-level volume, empty at the top.
    subject: &'a str,
    /// The object holding the key.
    parent: &'a Map<String, Value>,
    /// The compose file's own (uninterpolated) value of the subject's first key: it names the
    /// variables a model value came from, and the secrets a file path may not come from.
    raw: Option<&'a Value>,
}

struct Walk {
    findings: Vec<(Severity, String)>,
    /// Judging compose's model, whose values may hold secrets, rather than the file.
    model: bool,
    /// The project's own services, which namespaces and `volumes_from` may name.
    services: BTreeSet<String>,
    /// The top-level networks some service joins (`default` for a service that names none):
    /// compose creates no other, and drops the rest from its model, so they are not judged.
    used_networks: BTreeSet<String>,
    /// The top-level volumes some service mounts, for the same reason.
    used_volumes: BTreeSet<String>,
}

/// The top-level volumes the services of `top` mount: the name each `volumes` entry may give
/// one ([`Mount::volume_name`]).
fn used_volumes(top: &Map<String, Value>) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let services = top.get("services").and_then(Value::as_object);
    for service in services.into_iter().flat_map(|m| m.values()) {
        let Some(Value::Array(volumes)) = service.get("volumes") else {
            continue;
        };
        for m in volumes.iter().filter_map(Mount::parse) {
            used.insert(m.volume_name().to_owned());
        }
    }
    used
}

/// The networks the services of `top` join: the keys or items of each one's `networks`, and
/// `default` for a service without `networks` and without a `network_mode`.
fn used_networks(top: &Map<String, Value>) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let services = top.get("services").and_then(Value::as_object);
    for service in services.into_iter().flat_map(|m| m.values()) {
        match service.get("networks") {
            Some(Value::Object(m)) => used.extend(m.keys().cloned()),
            Some(Value::Array(a)) => {
                used.extend(a.iter().filter_map(Value::as_str).map(str::to_owned))
            }
            Some(_) => {}
            None if service.get("network_mode").is_none() => {
                used.insert("default".to_owned());
            }
            None => {}
        }
    }
    used
}

impl Walk {
    /// `key value` refused with `sev`.
    fn bad(&mut self, site: &Site<'_>, shown: &str, sev: Severity, value: &str) {
        let text = self.key_value(site, shown, value);
        self.add(sev, site, &text);
    }

    /// A driver (`logging.driver`, a volume's or a network's) that must be one of `allowed`.
    fn driver(&mut self, site: &Site<'_>, shown: &str, value: &Value, allowed: &[&str]) {
        if let Some(d) = value.as_str()
            && !allowed.contains(&d)
        {
            self.bad(site, shown, Severity::Privileged, d);
        }
    }

    fn add(&mut self, sev: Severity, site: &Site<'_>, what: &str) {
        let text = if site.subject.is_empty() {
            what.to_string()
        } else {
            format!("{}: {what}", site.subject)
        };
        if !self.findings.iter().any(|(_, t)| *t == text) {
            self.findings.push((sev, text));
        }
    }

    /// Whether [`key_value`](Self::key_value) prints the value itself, so that a hint built
    /// from it (the accepted name, the allowlist line) may be printed too.
    fn shows_value(&self, site: &Site<'_>) -> bool {
        if !self.model {
            return true;
        }
        site.raw.is_some_and(|raw| {
            let mut vars = BTreeSet::new();
            raw_vars(raw, &mut vars);
            vars.is_empty()
        })
    }

    /// `key value`, where a value that may have come from a variable is named by it.
    fn key_value(&self, site: &Site<'_>, key: &str, value: &str) -> String {
        key_value(self.model, site.raw, key, value, 80)
    }
}

fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_string()
    } else {
        format!("{base}.{key}")
    }
}

impl Ctx<'_> {
    fn judge(&self, doc: &Value, raw: &Value, model: bool) -> Vec<Refusal> {
        let Value::Object(top) = doc else {
            return vec![not_a_mapping()];
        };
        let mut walk = Walk {
            findings: Vec::new(),
            model,
            services: top
                .get("services")
                .and_then(Value::as_object)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default(),
            used_networks: used_networks(top),
            used_volumes: used_volumes(top),
        };
        self.object(&mut walk, "", "", "", top, Some(raw));
        self.paths(&mut walk, top, raw);
        let mut invalid = Vec::new();
        let mut privileged = Vec::new();
        let mut names = Vec::new();
        let mut registry = Vec::new();
        let mut unresolved = Vec::new();
        let mut routes = Vec::new();
        for (sev, text) in walk.findings {
            match sev {
                Severity::Invalid => invalid.push(text),
                Severity::Privileged => privileged.push(text),
                Severity::Nonconforming => names.push(text),
                Severity::Registry => registry.push(text),
                Severity::Unresolved => unresolved.push(text),
                Severity::Route => routes.push(text),
            }
        }
        let budget = self
            .policy
            .budget
            .findings(doc, raw, model, self.policy.pids_supplied);
        // Host access first, so an operator who fixes the names is not refused again for the
        // socket: every finding of every code is listed at once.
        let mut out = Vec::new();
        if !privileged.is_empty() && !self.policy.allow_privileged {
            out.push(Refusal::new(RefusalCode::PrivilegedRefused, privileged));
        }
        // A registry of the box is the box's admin's to allow, never the bundle's
        // `allow_privileged`.
        if !registry.is_empty() {
            out.push(Refusal::new(RefusalCode::RegistryNotAllowed, registry));
        }
        if !invalid.is_empty() {
            out.push(Refusal::new(RefusalCode::BundleInvalid, invalid));
        }
        if self.policy.allow_unprefixed_names {
            names.clear();
        }
        names.extend(routes);
        if !names.is_empty() {
            out.push(Refusal::new(RefusalCode::BundleNonconforming, names));
        }
        if !budget.is_empty() {
            out.push(Refusal::new(RefusalCode::BudgetExceeded, budget));
        }
        if !unresolved.is_empty() {
            out.push(Refusal::new(RefusalCode::RegistryUnresolved, unresolved));
        }
        out
    }

    /// Judges every key of `obj`, found at table path `pat`.
    #[allow(clippy::too_many_arguments)]
    fn object(
        &self,
        walk: &mut Walk,
        pat: &str,
        subject: &str,
        rel: &str,
        obj: &Map<String, Value>,
        raw: Option<&Value>,
    ) {
        let named_map = index().rules.contains_key(join(pat, "*").as_str());
        for (key, value) in obj {
            // Extensions are inert: compose ignores them, and anchors that pull them into
            // real keys are expanded before anything is judged.
            if key.starts_with("x-") {
                continue;
            }
            // A network no service joins is never created: nothing of it reaches the box.
            if pat == "networks" && subject.is_empty() && !walk.used_networks.contains(key) {
                continue;
            }
            if pat == "volumes" && subject.is_empty() && !walk.used_volumes.contains(key) {
                continue;
            }
            let (child_pat, child_subject, child_rel) = match (named_map, subject.is_empty()) {
                // A service, a volume, a network ... becomes the subject of what is below it.
                (true, true) if pat == "services" => (join(pat, "*"), key.clone(), String::new()),
                (true, true) => (join(pat, "*"), format!("{pat}.{key}"), String::new()),
                (true, false) => (join(pat, "*"), subject.to_string(), join(rel, key)),
                (false, _) => (join(pat, key), subject.to_string(), join(rel, key)),
            };
            // The raw value is tracked down to the subject's first key: every model value below
            // it is printed only when that whole raw value holds no variable.
            let child_raw = if rel.is_empty() || subject.is_empty() {
                raw.and_then(|r| r.get(key))
            } else {
                raw
            };
            let site = Site {
                subject: &child_subject,
                parent: obj,
                raw: child_raw,
            };
            let Some(rule) = rule_of(&child_pat) else {
                let name = if child_rel.is_empty() {
                    key.as_str()
                } else {
                    child_rel.as_str()
                };
                walk.add(
                    Severity::Invalid,
                    &site,
                    &format!("unknown key {}", printable(name, 80)),
                );
                continue;
            };
            let shown_key = if child_rel.is_empty() {
                key.as_str()
            } else {
                child_rel.as_str()
            };
            match rule {
                Rule::Allowed => {}
                Rule::Constrained(c) => self.constraint(walk, c, &site, value, shown_key),
                Rule::Privileged => {
                    if present(value) {
                        walk.add(Severity::Privileged, &site, shown_key);
                    }
                    continue;
                }
                Rule::Refused => {
                    if present(value) {
                        walk.add(Severity::Invalid, &site, shown_key);
                    }
                    continue;
                }
            }
            self.descend(
                walk,
                &child_pat,
                &child_subject,
                &child_rel,
                value,
                child_raw,
            );
        }
    }

    fn descend(
        &self,
        walk: &mut Walk,
        pat: &str,
        subject: &str,
        rel: &str,
        value: &Value,
        raw: Option<&Value>,
    ) {
        let parents = &index().parents;
        match value {
            Value::Object(m) if parents.contains(pat) => {
                self.object(walk, pat, subject, rel, m, raw);
            }
            Value::Array(items) => {
                let item_pat = format!("{pat}[]");
                if parents.contains(&item_pat) {
                    for item in items {
                        if let Value::Object(m) = item {
                            self.object(walk, &item_pat, subject, rel, m, raw);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Whether the key's value in the compose file takes anything from a secret: before the
    /// lease it would be judged as empty, so it is judged on compose's model instead.
    fn takes_a_secret(&self, site: &Site<'_>) -> bool {
        let (Some(secrets), Some(raw)) = (self.secrets, site.raw) else {
            return false;
        };
        let mut vars = BTreeSet::new();
        raw_vars(raw, &mut vars);
        vars.iter().any(|v| secrets.contains(v))
    }

    /// Judges `value` at `site` against the table's constraint `c`; each key family with more than
    /// a line to say has its own method below.
    fn constraint(
        &self,
        walk: &mut Walk,
        c: Constraint,
        site: &Site<'_>,
        value: &Value,
        shown: &str,
    ) {
        match c {
            C::False => {
                if truthy(value) {
                    walk.add(Severity::Privileged, site, shown);
                }
            }
            C::ContainerName => self.container_name(walk, site, value, shown),
            C::Labels => self.labels(walk, site, value, shown),
            C::CapAdd => self.cap_add(walk, site, value, shown),
            C::SecurityOpt => self.security_opt(walk, site, value, shown),
            C::Sysctls => self.sysctls(walk, site, value, shown),
            C::Namespace(private) => self.namespace(walk, site, value, shown, private),
            C::VolumesFrom => self.volumes_from(walk, site, value, shown),
            C::ServiceVolumes => self.service_volumes(walk, site, value, shown),
            C::InRelease => self.in_release(walk, site, value, shown),
            // Judged on the compose file's own text in `paths`: compose inlines the file into
            // its model, so neither the interpolated value nor the model can be trusted.
            C::EnvFile => {}
            C::OomScoreAdj => self.oom_score_adj(walk, site, value, shown),
            C::Ulimits => self.ulimits(walk, site, value, shown),
            C::LogDriver => walk.driver(
                site,
                shown,
                value,
                &["", "json-file", "local", "journald", "none"],
            ),
            C::PullPolicy => {
                if value.as_str() == Some("build") {
                    walk.bad(site, shown, Severity::Invalid, "build");
                }
            }
            C::Image => self.image(walk, site, value, shown),
            C::Dns => self.dns(walk, site, value, shown),
            C::ExternalVolume | C::ExternalNetwork => self.external(walk, site, value, shown, c),
            C::OwnName => self.own_name(walk, site, value, shown),
            C::VolumeDriverOpts => {
                if present(value) && !tmpfs_driver_opts(value) {
                    walk.add(Severity::Privileged, site, shown);
                }
            }
            C::VolumeDriver => walk.driver(site, shown, value, &["", "local"]),
            C::NetworkDriver => walk.driver(site, shown, value, &["", "bridge"]),
            C::Empty => {
                if present(value) {
                    walk.add(Severity::Privileged, site, shown);
                }
            }
        }
    }

    /// `container_name`: the project's own prefix, or a nonconforming name with the one accepted.
    fn container_name(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        let p = self.policy;
        if let Some(name) = value.as_str()
            && !own_container_name(&p.project, name)
            && !self.takes_a_secret(site)
        {
            let mut text = walk.key_value(site, shown, name);
            if walk.shows_value(site) {
                text += &format!(" (accepted: {})", accepted_container_name(&p.project, name));
            }
            walk.add(Severity::Nonconforming, site, &text);
        }
    }

    /// `labels`: none in compose's own namespace, and routing labels only for this env's own hosts.
    fn labels(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        let p = self.policy;
        for name in keys_of(value) {
            if name.starts_with("com.docker.compose.") {
                walk.bad(site, shown, Severity::Invalid, &name);
            }
        }
        for (key, text) in labels_of(value) {
            let why = match routes::judge(&key, &text, &p.route_hosts) {
                routes::Route::Own => continue,
                routes::Route::Foreign(host) => format!(
                    "names {}, not this env's own address (the box's admin may allow \
                     it with allowed_route_hosts: [{}])",
                    printable(&host, 80),
                    printable(&host, 80)
                ),
                routes::Route::Unjudged(why) => format!(
                    "cannot be judged: {why} (the box's admin may allow any host for \
                     this env with allowed_route_hosts: [\"*\"])"
                ),
            };
            let shown = format!("labels {}", printable(&key, 80));
            walk.add(Severity::Route, site, &format!("{shown} {why}"));
        }
    }

    /// `cap_add`: only capabilities of docker's default set.
    fn cap_add(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        // An empty entry is compose's to refuse; it asks for nothing.
        for cap in strings(value).iter().filter(|c| !c.trim().is_empty()) {
            let upper = cap.trim().to_ascii_uppercase();
            let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
            if !DEFAULT_CAPS.contains(&bare) {
                walk.bad(site, shown, Severity::Privileged, bare);
            }
        }
    }

    /// `security_opt`: only `no-new-privileges`.
    fn security_opt(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        for opt in strings(value).iter().filter(|o| !o.trim().is_empty()) {
            if !paths::no_new_privileges(opt) {
                walk.bad(site, shown, Severity::Privileged, opt.trim());
            }
        }
    }

    /// `sysctls`: only those docker namespaces per container, read as the runtime reads the name.
    fn sysctls(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        for name in keys_of(value) {
            // Judged as the runtime will apply it; a name it would not read as a plain
            // dotted name is refused.
            let plain = paths::sysctl_name(&name);
            if !plain.as_deref().is_some_and(namespaced_sysctl) {
                walk.bad(site, shown, Severity::Privileged, name.trim());
            }
        }
    }

    /// A namespace mode (`pid`, `ipc`, `network_mode`...): a service of this project or one of the
    /// `private` modes.
    fn namespace(
        &self,
        walk: &mut Walk,
        site: &Site<'_>,
        value: &Value,
        shown: &str,
        private: &[&str],
    ) {
        let Some(mode) = value.as_str() else { return };
        let mode = mode.trim();
        let own = mode
            .strip_prefix("service:")
            .is_some_and(|s| walk.services.contains(s));
        if !(mode.is_empty() || own || private.contains(&mode)) {
            walk.bad(site, shown, Severity::Privileged, mode);
        }
    }

    /// `volumes_from`: only services of this project.
    fn volumes_from(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        for from in strings(value) {
            let name = from.strip_prefix("service:").unwrap_or(&from);
            let name = name
                .strip_suffix(":ro")
                .or_else(|| name.strip_suffix(":rw"))
                .unwrap_or(name);
            if !walk.services.contains(name) {
                walk.bad(site, shown, Severity::Privileged, &from);
            }
        }
    }

    /// A service's `volumes`, entry by entry ([`Ctx::volume`]).
    fn service_volumes(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        if let Value::Array(items) = value {
            for m in items.iter().filter_map(Mount::parse) {
                if let Some((sev, what)) = self.volume(&m) {
                    // A hint after the value is printed only with the value itself.
                    let (what, hint) = what.split_once(HINT).unwrap_or((&what, ""));
                    let mut text = walk.key_value(site, shown, what);
                    if !hint.is_empty() && walk.shows_value(site) {
                        text += &format!(" ({hint})");
                    }
                    walk.add(sev, site, &text);
                }
            }
        }
    }

    /// A file bound into a container: where compose's value resolves, inside the release dir.
    fn in_release(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        // The compose file's own text is judged in `paths` (a literal inside the
        // release dir); here the value compose will use, where its link resolves to.
        // An empty path is compose's to refuse.
        let judged = if self.release.is_some() {
            paths_of(value)
        } else {
            Vec::new()
        };
        for path in judged.into_iter().filter(|p| !p.trim().is_empty()) {
            match self.place(&path) {
                Place::Release(rest) if !rest.is_empty() => {}
                _ => walk.bad(site, shown, Severity::Privileged, &path),
            }
        }
    }

    /// `oom_score_adj`: 0 or more.
    fn oom_score_adj(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        let n = match value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok(),
            _ => None,
        };
        if n.is_some_and(|n| n < 0.0) {
            walk.bad(site, shown, Severity::Privileged, &value_text(value));
        }
    }

    /// `ulimits`: no `rtprio` or `rttime`, and `memlock` only under a memory limit.
    fn ulimits(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        let p = self.policy;
        for name in keys_of(value) {
            match paths::ulimit_name(&name).as_str() {
                "rtprio" | "rttime" => walk.bad(site, shown, Severity::Privileged, name.trim()),
                // Locked pages are charged to the container's memory cgroup: under a
                // memory limit (its own, judged by the budget, or the one the agent
                // supplies) memlock, unlimited included, takes nothing the limit does
                // not already bound. Without a readable limit it is refused.
                "memlock" if p.budget.service_memory(site.parent).is_none() => {
                    walk.bad(site, shown, Severity::Privileged, name.trim());
                }
                _ => {}
            }
        }
    }

    /// `image`: a registry reference, off the box's loopback unless it is the box's own registry.
    fn image(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        let p = self.policy;
        if let Some(image) = value.as_str()
            && let Some(why) = image_problem(image, p.registry_host.as_deref())
            && (p.registry_host.is_some() || why == LOCAL_IMAGE_ID || why == ID_PREFIX)
        {
            walk.bad(
                site,
                shown,
                Severity::Privileged,
                &format!("{why}: {}", image.trim()),
            );
        } else if let Some(image) = value.as_str()
            && let Some(found) = p.registries.as_ref().and_then(|r| r.judge(image))
        {
            let sev = match found {
                registries::RegistryFinding::OnTheBox { .. } => Severity::Registry,
                registries::RegistryFinding::Unresolved { .. } => Severity::Unresolved,
            };
            // A value that came from a secret is named by its variable, never shown.
            let text = if walk.shows_value(site) {
                found.to_string()
            } else {
                format!(
                    "{}: {}",
                    walk.key_value(site, shown, image),
                    found.unnamed()
                )
            };
            walk.add(sev, site, &text);
        }
    }

    /// `dns`: no server on the box's own addresses.
    fn dns(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        let servers = match value {
            Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
            Value::String(s) => vec![s.as_str()],
            _ => Vec::new(),
        };
        for server in servers {
            if server
                .trim()
                .parse::<std::net::IpAddr>()
                .is_ok_and(on_box_address)
            {
                walk.bad(site, shown, Severity::Privileged, server.trim());
            }
        }
    }

    /// `external` volumes and networks: only names on the box's allowlists.
    fn external(
        &self,
        walk: &mut Walk,
        site: &Site<'_>,
        value: &Value,
        shown: &str,
        c: Constraint,
    ) {
        let p = self.policy;
        let external = truthy(value) || value.is_object();
        if !external {
            return;
        }
        let name = value
            .get("name")
            .and_then(Value::as_str)
            .or_else(|| site.parent.get("name").and_then(Value::as_str))
            .map(str::to_string)
            .unwrap_or_else(|| {
                site.subject
                    .split_once('.')
                    .map_or(site.subject, |(_, n)| n)
                    .to_string()
            });
        let allowed = if c == C::ExternalVolume {
            &p.external_volumes
        } else {
            &p.external_networks
        };
        if !allowed.contains(&name) {
            let key = if c == C::ExternalVolume {
                "allowed_external_volumes"
            } else {
                "allowed_external_networks"
            };
            let mut text = walk.key_value(site, shown, &name);
            if walk.shows_value(site) {
                text += &format!(
                    " (the box's admin may allow it with {key}: [{}])",
                    printable(&name, 80)
                );
            }
            walk.add(Severity::Privileged, site, &text);
        }
    }

    /// A custom `name` of a volume or network: the project's own prefix.
    fn own_name(&self, walk: &mut Walk, site: &Site<'_>, value: &Value, shown: &str) {
        let p = self.policy;
        let external = site
            .parent
            .get("external")
            .is_some_and(|e| truthy(e) || e.is_object());
        // The name compose gives the key by default is the project's own, whatever
        // a longer project could read into it: compose's model spells it out.
        let default = site
            .subject
            .split_once('.')
            .map(|(_, key)| format!("{}_{key}", p.project));
        if let Some(name) = value.as_str()
            && !external
            && default.as_deref() != Some(name)
            && !own_object_name(&p.project, name)
            && !self.takes_a_secret(site)
        {
            let mut text = walk.key_value(site, shown, name);
            if walk.shows_value(site) {
                text += &format!(" (accepted: {})", accepted_object_name(&p.project, name));
            }
            walk.add(Severity::Nonconforming, site, &text);
        }
    }

    /// Judges one entry of a service's `volumes`: the reason it is refused, if it is.
    fn volume(&self, m: &Mount<'_>) -> Option<(Severity, String)> {
        let priv_ = |s: String| Some((Severity::Privileged, s));
        // compose reads a drive letter or a UNC name as a bind source; dockerd on this box
        // would not read it as the policy would.
        if let Some(text) = m.foreign {
            return priv_(format!("{} not a path on this box", printable(text, 80)));
        }
        let source = m.source;
        match m.kind {
            // A named volume: compose refuses one the file does not declare.
            MountKind::Anonymous => None,
            MountKind::Bind => {
                // compose's model holds absolute sources only; in the file, a plain relative
                // name (`source: data`) is relative to the release dir.
                let relative_in_model = m.long
                    && self.release.is_some()
                    && !source.trim().is_empty()
                    && !source.starts_with('/');
                if relative_in_model {
                    return priv_(format!("{} not a path on this box", printable(source, 80)));
                }
                if let Some(p) = m.modes.iter().find(|o| paths::shares_mounts(o)) {
                    return priv_(format!("{source} propagation {p}"));
                }
                if m.recursive
                    .is_some_and(|r| r.trim().eq_ignore_ascii_case("writable"))
                {
                    return priv_(format!("{source} recursive writable"));
                }
                self.bind(source, m.read_only, m.relabel)
            }
            MountKind::Volume => match m.subpath {
                Some(s)
                    if Path::new(s).is_absolute()
                        || Path::new(s).components().any(|c| c == Component::ParentDir) =>
                {
                    priv_(format!("{source} subpath {}", printable(s, 80)))
                }
                _ => None,
            },
            // dockerd refuses a tmpfs with a source; one that reached it anyway would be
            // judged as a host path nowhere else.
            MountKind::Tmpfs if !source.trim().is_empty() => {
                priv_(format!("tmpfs with the source {}", printable(source, 80)))
            }
            MountKind::Tmpfs => None,
            MountKind::Other(other) => priv_(format!("type {}", printable(other, 40))),
        }
    }

    fn bind(&self, source: &str, read_only: bool, relabel: bool) -> Option<(Severity, String)> {
        let shown = printable(source, 120);
        match self.place(source) {
            Place::Release(rest) => {
                let own_file = rest.is_empty()
                    || (rest.len() == 1
                        && (rest[0] == ".env"
                            || rest[0] == crate::budget::OVERRIDE_FILE
                            || MemberName::all().any(|m| m.as_str() == rest[0])));
                if own_file && !read_only {
                    return Some((
                        Severity::Privileged,
                        format!("{shown} writable over the release's own files"),
                    ));
                }
                None
            }
            Place::Host(path) => {
                let writable = !read_only;
                // The allowed prefix is resolved like the path: `/etc/localtime` is itself a link,
                // and a link planted below an allowed dir must not lead out of it.
                let allowed = self.policy.allowed_binds.iter().any(|a| {
                    let prefix = AllowedBind {
                        prefix: resolve(&a.prefix, self.read_link),
                        writable: a.writable,
                    };
                    prefix.covers(&path, writable) || a.covers(&path, writable)
                });
                // The host path itself is the worst of a bind that is not allowed: it is named,
                // with the allowed_binds line that would allow it, before any relabel.
                if !allowed {
                    let mode = if writable { "rw" } else { "ro" };
                    // A waiver no wider than the finding: the exact path the file names, never
                    // one this check can only guess (relative, `~`) nor `/` or a home directory.
                    let parts: Vec<_> = path.components().skip(1).collect();
                    let too_wide = match parts.as_slice() {
                        [] => true,
                        [one] => matches!(one.as_os_str().to_str(), Some("root" | "home")),
                        [first, _] => first.as_os_str() == "home",
                        _ => false,
                    };
                    let exact = source.starts_with('/') && !too_wide;
                    Some((
                        Severity::Privileged,
                        if exact {
                            format!(
                                "{shown}{HINT}a host path; the box's admin may allow it with allowed_binds: [{}:{mode}]",
                                printable(&path.to_string_lossy(), 120)
                            )
                        } else {
                            format!("{shown}{HINT}a host path")
                        },
                    ))
                } else if relabel {
                    Some((
                        Severity::Privileged,
                        format!("{shown} relabels a host path"),
                    ))
                } else {
                    None
                }
            }
        }
    }

    /// Where a path lands: inside the release dir (the components below it), or on the host.
    fn place(&self, raw: &str) -> Place {
        let raw = raw.trim();
        if raw.starts_with('~') {
            // compose expands `~` to the home of the user it runs as: root's.
            return Place::Host(PathBuf::from("/root"));
        }
        let path = Path::new(raw);
        match &self.release {
            None => {
                if path.is_absolute() {
                    return Place::Host(lexical(path));
                }
                let mut parts: Vec<String> = Vec::new();
                for c in path.components() {
                    match c {
                        Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
                        // Climbing out of the release dir lands somewhere on the host.
                        Component::ParentDir if parts.is_empty() => {
                            return Place::Host(PathBuf::from("/"));
                        }
                        Component::ParentDir => {
                            parts.pop();
                        }
                        _ => {}
                    }
                }
                Place::Release(parts)
            }
            Some(release) => {
                let abs = if path.is_absolute() {
                    lexical(path)
                } else {
                    lexical(&release.join(path))
                };
                let resolved = resolve(&abs, self.read_link);
                match resolved.strip_prefix(release) {
                    Ok(rest) => Place::Release(
                        rest.components()
                            .map(|c| c.as_os_str().to_string_lossy().into_owned())
                            .collect(),
                    ),
                    Err(_) => Place::Host(resolved),
                }
            }
        }
    }
}

enum Place {
    Release(Vec<String>),
    Host(PathBuf),
}

/// Separates a finding's value from a hint that repeats it (the allowlist line), which is
/// printed only where the value is.
const HINT: char = '\u{1}';

/// Whether `project` could be a compose project name: a lowercase letter or digit, then
/// lowercase letters, digits, `-` and `_` (compose's own rule).
fn project_shaped(name: &str) -> bool {
    name.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Whether `rest`, read as `<x><sep><y>`, names a longer project `<project><sep'><x>` and an
/// object `<y>` of it: `x` project-shaped and `y` not empty, for some `sep` in `rest`.
fn splits_as_longer_project(rest: &str, sep: char) -> bool {
    rest.match_indices(sep)
        .any(|(i, _)| i + 1 < rest.len() && project_shaped(&rest[..i]))
}

/// `rest` without compose's suffix of a container's default name (`-<replica>`, or
/// `-run-<id>` for a one-off), when it has one.
fn without_replica(rest: &str) -> Option<&str> {
    let (head, last) = rest.rsplit_once('-')?;
    if last.is_empty() || !last.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Some(head);
    }
    head.strip_suffix("-run")
}

/// Whether a container name is the project's own: `<project>-<rest>`, and not the name compose
/// gives by default to a container of a longer project (`<project>-<x>-<service>-<n>`, or a
/// one-off's `<project>-<x>-<service>-run-<id>`), which belongs to that project even while it
/// does not exist yet.
fn own_container_name(project: &str, name: &str) -> bool {
    name.strip_prefix(project)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|rest| {
            without_replica(rest).is_none_or(|head| !splits_as_longer_project(head, '-'))
        })
}

/// Whether a volume or network name is the project's own: `<project>_<rest>`, and not the
/// name compose gives by default to a volume or network of a longer project
/// (`<project>_<x>_<key>`, the project `<project>_<x>`).
fn own_object_name(project: &str, name: &str) -> bool {
    name.strip_prefix(project)
        .and_then(|r| r.strip_prefix('_'))
        .is_some_and(|rest| !splits_as_longer_project(rest, '_'))
}

/// The container name the policy would accept for `name`: the project's own prefix in front
/// of it, without a suffix that would make it a longer project's default name.
fn accepted_container_name(project: &str, name: &str) -> String {
    let shown = printable(name, 60);
    let mut rest = name
        .strip_prefix(project)
        .and_then(|r| r.strip_prefix('-'))
        .unwrap_or(&shown);
    while let Some(head) = without_replica(rest)
        && splits_as_longer_project(head, '-')
    {
        rest = head;
    }
    format!("{project}-{rest}")
}

/// The volume or network name the policy would accept for `name`: the project's own prefix
/// in front of it, its own `_` made `-` so that no longer project's name can be read into it.
fn accepted_object_name(project: &str, name: &str) -> String {
    let shown = printable(name, 60);
    let rest = name
        .strip_prefix(project)
        .and_then(|r| r.strip_prefix('_'))
        .unwrap_or(&shown);
    format!("{project}_{}", rest.replace('_', "-"))
}

/// Whether docker gives each container its own copy of a sysctl (runc's list: the network
/// namespace's `net.*`, and the IPC namespace's message queues, semaphores and shared memory).
/// `ipc: host` and host networking, which would share them, are refused on their own.
fn namespaced_sysctl(name: &str) -> bool {
    const IPC: [&str; 8] = [
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
    ];
    name.starts_with("net.") || name.starts_with("fs.mqueue.") || IPC.contains(&name)
}

/// Whether a top-level volume's `driver_opts` is exactly the local driver's tmpfs shape:
/// `type: tmpfs`, `device: tmpfs` (or absent), and `o` of memory options only. `bind`, a device
/// path or any other key would mount something of the host's.
fn tmpfs_driver_opts(opts: &Value) -> bool {
    let Value::Object(m) = opts else {
        return false;
    };
    let s = |k: &str| m.get(k).and_then(Value::as_str).map(str::trim);
    if s("type") != Some("tmpfs") || !matches!(s("device"), None | Some("tmpfs")) {
        return false;
    }
    if m.keys()
        .any(|k| !matches!(k.as_str(), "type" | "device" | "o"))
    {
        return false;
    }
    let Some(o) = m.get("o") else { return true };
    let Some(o) = o.as_str() else { return false };
    tmpfs_options(o).all(|opt| {
        !opt.spaced_name
            && matches!(
                opt.name,
                "size" | "mode" | "uid" | "gid" | "nr_inodes" | "noexec" | "nosuid" | "nodev"
            )
    })
}

/// `path` with `.` and `..` applied lexically (`..` at the root stays at the root).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// `path` (absolute, lexical) with every symlink on the way replaced by its target, as the
/// kernel would follow them when docker mounts it. Forty links at most, as the kernel allows.
fn resolve(path: &Path, read_link: &dyn Fn(&Path) -> Option<PathBuf>) -> PathBuf {
    let mut out = PathBuf::from("/");
    let mut todo: std::collections::VecDeque<std::ffi::OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        if part == ".." {
            out.pop();
            continue;
        }
        out.push(&part);
        if let Some(target) = read_link(&out) {
            hops += 1;
            if hops > 40 {
                // A loop: whatever it names, it is not a plain path inside the release.
                return PathBuf::from("/");
            }
            out.pop();
            if target.is_absolute() {
                out = PathBuf::from("/");
            }
            for c in target.components().rev() {
                match c {
                    Component::Normal(n) => todo.push_front(n.to_owned()),
                    Component::ParentDir => todo.push_front("..".into()),
                    _ => {}
                }
            }
        }
    }
    out
}

/// Whether a refused key is actually used: null, false, `""`, `[]` and `{}` ask for nothing.
fn present(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::String(s) => !s.trim().is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        Value::Number(_) => true,
    }
}

/// Why `image` cannot be proven this env's, or `None`: a local image ID (or what dockerd
/// would take for a prefix of one), or a registry on the box's loopback other than the box's
/// own `registry_host`. The domain is found as dockerd finds it: the first component, when it
/// holds a `.`, a `:` or a capital letter, or is `localhost`.
#[must_use]
pub fn image_problem(image: &str, registry_host: Option<&str>) -> Option<&'static str> {
    let image = image.trim();
    let name = image.split_once('@').map_or(image, |(n, _)| n);
    if image.to_ascii_lowercase().starts_with("sha256:") {
        return Some(LOCAL_IMAGE_ID);
    }
    let (first, rest) = name.split_once('/').unwrap_or(("", name));
    let domain = (first.contains(['.', ':'])
        || first == "localhost"
        || first.bytes().any(|b| b.is_ascii_uppercase()))
    .then_some(first);
    let Some(domain) = domain else {
        // No domain: a bare name with no tag made only of hex digits is an image ID's prefix
        // to dockerd once no repository of that name exists.
        let bare = !rest.contains(['/', ':']) && !image.contains('@');
        if bare && !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Some(ID_PREFIX);
        }
        return None;
    };
    let domain = domain.to_ascii_lowercase();
    if registry_host.is_some_and(|own| own.eq_ignore_ascii_case(&domain)) {
        return None;
    }
    let host = match domain.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or(v6, |(h, _)| h),
        None => domain.rsplit_once(':').map_or(domain.as_str(), |(h, _)| h),
    };
    // A trailing dot is the same name to the resolver.
    let host = host.strip_suffix('.').unwrap_or(host);
    // The C resolver reads `127.1`, `2130706433`, `0x7f000001` and `0` as addresses too
    // (inet_aton): a numeric host that is not a plain dotted quad is refused whatever it
    // names.
    let numeric = !host.is_empty()
        && (host.bytes().all(|b| b.is_ascii_digit() || b == b'.') || host.starts_with("0x"));
    let on_box = host == "localhost"
        || host.ends_with(".localhost")
        || (numeric && host.parse::<std::net::Ipv4Addr>().is_err())
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| {
            on_box_address(ip)
                || registries::Place::of(registries::Address {
                    ip,
                    this_box: false,
                }) == registries::Place::LinkLocal
        });
    on_box.then_some(LOOPBACK_REGISTRY)
}

/// An address on the box itself: loopback or unspecified, an IPv4-mapped IPv6 one included
/// (Go takes `::ffff:127.0.0.1` for 127.0.0.1).
fn on_box_address(ip: std::net::IpAddr) -> bool {
    let ip = match ip {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    };
    ip.is_loopback() || ip.is_unspecified()
}

/// Short, as findings are: the policy doc says why.
const LOCAL_IMAGE_ID: &str = "local image ID";
const ID_PREFIX: &str = "image ID prefix";
const LOOPBACK_REGISTRY: &str = "registry on loopback";

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The strings of a value that may be one string or a list.
fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// The names of a list-or-map value: a map's keys, or the part of each `NAME=value` item
/// before the `=`.
/// The labels of a map or `key=value` list, values as compose writes them.
fn labels_of(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                (k.clone(), text)
            })
            .collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .map(|s| match s.split_once('=') {
                Some((k, v)) => (k.trim().to_string(), v.to_string()),
                None => (s.trim().to_string(), String::new()),
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn keys_of(v: &Value) -> Vec<String> {
    match v {
        Value::Object(m) => m.keys().cloned().collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .map(|s| s.split(['=', ':']).next().unwrap_or(s).trim().to_string())
            .collect(),
        _ => Vec::new(),
    }
}

/// The paths of a path-or-list value, where a list item may be `{path: ...}`.
fn paths_of(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|x| match x {
                Value::String(s) => Some(s.clone()),
                Value::Object(m) => m.get("path").and_then(Value::as_str).map(str::to_string),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_image_is_proven_only_by_a_registry_off_the_box_or_the_boxs_own() {
        let own = Some("127.0.0.1:5000");
        for (image, refused) in [
            ("nginx", false),
            ("nginx:1.27", false),
            ("library/nginx@sha256:0123", false),
            ("ghcr.io/acme/api:2", false),
            ("registry.example.com:5000/api", false),
            ("127.0.0.1:5000/api:1", false),
            ("beef1", true),
            ("beef-1", false),
            ("cafe:1", false),
            ("sha256:0123abcd", true),
            ("SHA256:0123abcd", true),
            ("0123abcd", true),
            ("deadbeef@sha256:00", false),
            ("127.0.0.1:5001/api", true),
            ("127.9.9.9/api", true),
            ("localhost:5000/api", true),
            ("LOCALHOST/api", true),
            ("reg.localhost:80/api", true),
            ("[::1]:5000/api", true),
            ("0.0.0.0:5000/api", true),
            ("[::ffff:127.0.0.1]:5000/api", true),
            ("localhost.:5000/api", true),
            ("127.1:5000/api", true),
            ("2130706433:5000/api", true),
            ("0x7f000001:5000/api", true),
            ("0:5000/api", true),
            ("10.1.2.3:5000/api", false),
            ("169.254.169.254/api", true),
            ("[fe80::1]:5000/api", true),
            ("[0:0:0:0:0:0:0:1]:5000/api", true),
            ("[::]:5000/api", true),
            ("registry.example.com./api", false),
        ] {
            let got = super::image_problem(image, own);
            assert_eq!(got.is_some(), refused, "{image}: {got:?}");
        }
        assert!(super::image_problem("127.0.0.1:5000/api", None).is_some());
    }

    use super::*;

    #[test]
    fn a_network_no_service_joins_is_not_judged_and_one_joined_any_way_is() {
        let p = ComposePolicy::new("monky-env-qa");
        let none = |_: &str| None;
        let secrets = BTreeSet::new();
        let net = "networks:\n  dual:\n    ipam:\n      config: [{subnet: 10.9.0.0/16}]\n";
        // Declared only: compose creates nothing of it (a real file's case).
        let unused = format!("services:\n  web:\n    image: x\n{net}");
        assert!(p.check_file(&unused, &none, &secrets).is_ok());
        for joined in [
            "services:\n  web:\n    image: x\n    networks: [dual]\n",
            "services:\n  web:\n    image: x\n    networks: {dual: {aliases: [a]}}\n",
            "services:\n  base:\n    image: x\n    networks: [dual]\n  web:\n    extends: {service: base}\n",
        ] {
            let text = format!("{joined}{net}");
            let err = p.check_file(&text, &none, &secrets).expect_err(joined);
            assert!(err.to_string().contains("networks.dual"), "{err}");
        }
        // A volume no service mounts is never created either; one mounted is judged.
        let vol = "volumes:\n  root:\n    driver_opts: {type: none, o: bind, device: /}\n";
        let unused = format!("services:\n  web:\n    image: x\n{vol}");
        assert!(p.check_file(&unused, &none, &secrets).is_ok());
        for mounted in [
            "services:\n  web:\n    image: x\n    volumes: [\"root:/r:ro\"]\n",
            "services:\n  web:\n    image: x\n    volumes: [{type: volume, source: root, target: /r}]\n",
        ] {
            let text = format!("{mounted}{vol}");
            let err = p.check_file(&text, &none, &secrets).expect_err(mounted);
            assert!(err.to_string().contains("volumes.root"), "{err}");
        }
        // The old readings of `- /data` disagreed (an anonymous volume, or a volume named
        // `/data`); the stricter is kept: a top-level volume `/data` is judged.
        let text = "services:\n  web:\n    image: x\n    volumes: [\"/data\"]\nvolumes:\n  /data:\n    driver_opts: {type: none, o: bind, device: /}\n";
        let err = p.check_file(text, &none, &secrets).expect_err(text);
        assert!(err.to_string().contains("volumes./data"), "{err}");
        // `default` is joined by every service that names no network and has no network_mode.
        let default = "services:\n  web:\n    image: x\nnetworks:\n  default:\n    ipam:\n      config: [{subnet: 10.9.0.0/16}]\n";
        assert!(p.check_file(default, &none, &secrets).is_err());
    }

    #[test]
    fn resolve_follows_links() {
        let links = |p: &Path| match p.to_str()? {
            "/r/current" => Some(PathBuf::from("releases/abc")),
            "/r/releases/abc/data/up" => Some(PathBuf::from("../../..")),
            "/r/releases/abc/data/etc" => Some(PathBuf::from("/etc")),
            "/loop" => Some(PathBuf::from("/loop")),
            _ => None,
        };
        assert_eq!(
            resolve(Path::new("/r/current/x"), &links),
            Path::new("/r/releases/abc/x")
        );
        assert_eq!(
            resolve(Path::new("/r/current/data/up/y"), &links),
            Path::new("/r/y")
        );
        assert_eq!(
            resolve(Path::new("/r/current/data/etc/shadow"), &links),
            Path::new("/etc/shadow")
        );
        assert_eq!(resolve(Path::new("/loop/x"), &links), Path::new("/"));
    }

    #[test]
    fn allowed_binds_parse() {
        assert_eq!(
            "/srv/shared:rw".parse::<AllowedBind>().unwrap().to_string(),
            "/srv/shared:rw"
        );
        for bad in [
            "srv:ro",
            "/srv",
            "/srv:rx",
            "/srv/../etc:ro",
            "/srv/:ro",
            "//srv:ro",
        ] {
            assert!(bad.parse::<AllowedBind>().is_err(), "{bad}");
        }
        let a: AllowedBind = "/srv/shared:ro".parse().unwrap();
        assert!(a.covers(Path::new("/srv/shared/x"), false));
        assert!(!a.covers(Path::new("/srv/shared/x"), true));
        assert!(!a.covers(Path::new("/srv/sharedx"), false));
    }

    #[test]
    fn every_parent_row_is_allowed_or_constrained() {
        // A refused key's children are covered by its refusal; rows under one would be dead.
        for r in TABLE {
            let mut p = r.path;
            while let Some(cut) = p.rfind(['.', '[']) {
                p = &p[..cut];
                if let Some(rule) = rule_of(p) {
                    assert!(
                        matches!(rule, Rule::Allowed | Rule::Constrained(_)),
                        "{} sits under refused {p}",
                        r.path
                    );
                }
            }
        }
    }
}
