//! `cargo xtask tidy`: the crate rules of docs/architecture.md, checked over `cargo metadata`,
//! its code rules, checked over the sources (`code`, and `circles` for each crate's module
//! graph), and its invariants held to the code (`docs`: each names the tidy rules and tests that
//! hold it, and each rule is named).
//!
//! The crate rules are about what ships: each library's normal and build dependencies, followed
//! transitively, with every feature on (a feature that pulls a forbidden crate is caught too),
//! or, for a rule about a feature set (proto's wire types alone, its client), those features of
//! the root only.
//! Dev-dependencies are exempt, because the tests of one peer's fake may wire in the other's.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::state;

mod circles;
mod code;
mod docs;
mod surface;
mod walks;

/// Crates that speak to the network or do TLS; a name ending in `*` is a prefix.
const NETWORK: &[&str] = &[
    "reqwest*",
    "hyper*",
    "h2",
    "h3*",
    "http",
    "url",
    "tokio*",
    "mio",
    "socket2",
    "tiny_http",
    "ureq",
    "rustls*",
    "webpki*",
    "ring",
    "aws-lc-*",
    "native-tls",
    "openssl*",
];

/// The TLS stacks and crypto backends: xtask builds and runs `tidy` without any of them.
const TLS: &[&str] = &[
    "rustls*",
    "webpki*",
    "aws-lc-*",
    "ring",
    "openssl*",
    "native-tls",
    "reqwest*",
    "hyper-rustls",
    "tokio-rustls",
];

/// The archive and YAML readers (and the crate that brings them): the shared vocabulary and
/// the OpenBao client pull none, so tenancy's tooling that imports them does not either.
const ARCHIVE_AND_YAML: &[&str] = &[
    "monky-bundle",
    "tar",
    "flate2",
    "miniz_oxide",
    "serde-saphyr",
    "saphyr*",
    "serde_yaml*",
    "yaml-*",
    "unsafe-libyaml",
];

/// One rule: `krate` must not depend, directly or through others, on any of `forbidden`, and
/// its graph holds at most `max_crates` crates (itself included), if given.
struct Rule {
    /// The rule's name, as docs/architecture.md's `Held by:` sentences name it.
    name: &'static str,
    krate: &'static str,
    /// `None`: every feature of `krate` on. `Some(list)`: exactly these features (no default),
    /// followed through the workspace's resolve with every feature on, so the graph checked is
    /// an upper bound of `cargo tree -p <krate> --no-default-features -F <list> -e normal`.
    features: Option<&'static [&'static str]>,
    forbidden: &'static [&'static str],
    max_crates: Option<usize>,
    why: &'static str,
}

const RULES: &[Rule] = &[
    Rule {
        name: "proto-wire-small-offline",
        krate: "monky-agent-proto",
        features: Some(&[]),
        forbidden: NETWORK,
        max_crates: Some(25),
        why: "tenancy's tooling imports the wire types alone: they stay a small, offline graph",
    },
    Rule {
        name: "proto-client-no-monky",
        krate: "monky-agent-proto",
        features: Some(&["client", "schema"]),
        forbidden: &[
            "monky-bao-client",
            "monky-bundle",
            "monky-compose",
            "monky-deployd",
        ],
        max_crates: None,
        why: "tenancy's own tooling imports the wire crate and its client; they carry no agent policy",
    },
    Rule {
        name: "proto-any-feature-no-monky",
        krate: "monky-agent-proto",
        features: None,
        forbidden: &[
            "monky-bao-client",
            "monky-bundle",
            "monky-compose",
            "monky-deployd",
        ],
        max_crates: None,
        why: "tenancy's own tooling imports the wire crate with any of its features; it carries no agent policy",
    },
    Rule {
        name: "bundle-no-monky",
        krate: "monky-bundle",
        features: None,
        forbidden: &[
            "monky-agent-proto",
            "monky-bao-client",
            "monky-compose",
            "monky-deployd",
        ],
        max_crates: None,
        why: "the bundle is parsed and judged offline, knowing no peer",
    },
    Rule {
        name: "bundle-no-network",
        krate: "monky-bundle",
        features: None,
        forbidden: NETWORK,
        max_crates: None,
        why: "monky-bundle does no network IO",
    },
    Rule {
        name: "compose-no-peers",
        krate: "monky-compose",
        features: None,
        forbidden: &["monky-agent-proto", "monky-bao-client", "monky-deployd"],
        max_crates: None,
        why: "the docker driver knows neither tenancy nor OpenBao",
    },
    Rule {
        name: "bao-no-proto",
        krate: "monky-bao-client",
        features: None,
        forbidden: &["monky-agent-proto", "monky-deployd"],
        max_crates: None,
        why: "the OpenBao client knows nothing of tenancy's wire format",
    },
    Rule {
        name: "bao-no-archive-yaml",
        krate: "monky-bao-client",
        features: None,
        forbidden: ARCHIVE_AND_YAML,
        max_crates: None,
        why: "the OpenBao client needs the KV path alone, which the vocabulary crate holds",
    },
    Rule {
        name: "http-no-monky",
        krate: "monky-http",
        features: None,
        forbidden: &[
            "monky-agent-proto",
            "monky-bao-client",
            "monky-bundle",
            "monky-compose",
            "monky-deployd",
        ],
        max_crates: None,
        why: "the hardened HTTP client knows neither peer: each client keeps its own errors and calls",
    },
    Rule {
        name: "vocab-small-offline",
        krate: "monky-vocab",
        features: Some(&[]),
        forbidden: NETWORK,
        max_crates: Some(12),
        why: "the shared vocabulary is std and serde only: every crate and tenancy's tooling import it",
    },
    Rule {
        name: "vocab-no-archive-yaml",
        krate: "monky-vocab",
        features: None,
        forbidden: ARCHIVE_AND_YAML,
        max_crates: None,
        why: "the shared vocabulary reads no bundle",
    },
    Rule {
        name: "xtask-no-tls",
        krate: "xtask",
        features: None,
        forbidden: TLS,
        max_crates: None,
        why: "xtask runs tidy without the agent's TLS stack (the agent writes its own man pages)",
    },
];

/// The test support crate: a dev-dependency only, never shipped.
const TESTKIT: &str = "monky-testkit";

/// The name of the rule that keeps [`TESTKIT`] a dev-dependency.
const TESTKIT_RULE: &str = "testkit-dev-only";

/// The name of the rule that keeps the agent's crate out of every other member's graph.
const AGENT_RULE: &str = "only-fuzz-uses-agent";

/// Every tidy rule that holds an invariant of the code, by name: the crate rules, then the code
/// rules. The checks of docs/architecture.md itself (`walks`, `docs`) hold none and are not here.
fn rule_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = RULES.iter().map(|r| r.name).collect();
    names.extend([AGENT_RULE, TESTKIT_RULE]);
    names.extend(code::RULES.iter().map(|r| r.name));
    names.push(circles::RULE);
    names.push(surface::RULE);
    names
}

/// Only these workspace members may depend on the agent binary's crate (`fuzz/`, its own
/// workspace, does too).
const AGENT_USERS: &[&str] = &[];

/// Runs tidy with the command-line `args` (after `tidy`).
pub fn main(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        if arg == "-h" || arg == "--help" {
            println!(
                "cargo xtask tidy\n  checks the crate dependency rules and the code rules of \
                 docs/architecture.md, and that its invariants name what holds them"
            );
            return Ok(());
        }
        bail!("tidy: unknown argument {arg:?} (try --help)");
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
            "--locked",
        ])
        .current_dir(state::workspace_root())
        .output()
        .context("cannot run cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let metadata: Value =
        serde_json::from_slice(&out.stdout).context("cargo metadata printed no JSON")?;
    let mut broken = violations(&metadata)?;
    let rules = RULES.len() + 2;
    let root = state::workspace_root();
    let all: Vec<&code::CodeRule> = code::RULES.iter().collect();
    for (rule, v) in code::check_tree(&root, &all)? {
        broken.push(format!("{v} ({rule})"));
    }
    for circle in circles::check_tree(&root)? {
        broken.push(format!("{circle} ({})", circles::RULE));
    }
    for v in surface::check_tree(&root)? {
        broken.push(format!("{v} ({})", surface::RULE));
    }
    for step in walks::check_tree(&root)? {
        broken.push(format!("{step} ({})", walks::RULE));
    }
    let doc = std::fs::read_to_string(root.join("docs/architecture.md"))
        .context("cannot read docs/architecture.md")?;
    let read = |path: &str| std::fs::read_to_string(root.join(path)).ok();
    broken.extend(docs::check(&doc, &rule_names(), &read));
    if broken.is_empty() {
        println!(
            "tidy: the crate rules hold ({rules} rules), the code rules hold ({}), and every \
             invariant of docs/architecture.md names what holds it",
            code::RULES.len() + 3,
        );
        return Ok(());
    }
    for line in &broken {
        eprintln!("tidy: {line}");
    }
    bail!("tidy: {} rule(s) broken", broken.len())
}

/// Every broken rule in `metadata` (the JSON of `cargo metadata --format-version 1`), one line
/// each, naming the crate, the forbidden dependency and the rule's reason.
fn violations(metadata: &Value) -> Result<Vec<String>> {
    let graph = Graph::from_metadata(metadata)?;
    let mut broken = Vec::new();
    for rule in RULES {
        let reach = graph.reachable(rule.krate, rule.features)?;
        let names: BTreeSet<&str> = reach.iter().map(|id| graph.names[id].as_str()).collect();
        for bad in names
            .iter()
            .filter(|name| matches_any(name, rule.forbidden))
        {
            broken.push(format!(
                "{} depends on {bad}, which it must not: {} ({})",
                rule.krate, rule.why, rule.name
            ));
        }
        // `cargo tree` counts a crate's versions apart, and the root too.
        if let Some(max) = rule.max_crates.filter(|max| reach.len() + 1 > *max) {
            broken.push(format!(
                "{} reaches {} crates, over its {max}: {} ({})",
                rule.krate,
                reach.len() + 1,
                rule.why,
                rule.name
            ));
        }
    }
    for member in &graph.members {
        let reach = graph.reachable(member, None)?;
        let reaches = |name: &str| reach.iter().any(|id| graph.names[id] == name);
        if member != "monky-deployd"
            && !AGENT_USERS.contains(&member.as_str())
            && reaches("monky-deployd")
        {
            broken.push(format!(
                "{member} depends on monky-deployd: only fuzz may depend on the agent \
                 ({AGENT_RULE})"
            ));
        }
        if reaches(TESTKIT) {
            broken.push(format!(
                "{member} depends on {TESTKIT}: test support is a dev-dependency only \
                 ({TESTKIT_RULE})"
            ));
        }
    }
    Ok(broken)
}

/// Whether crate `name` is one of `patterns` (a pattern ending in `*` is a prefix).
fn matches_any(name: &str, patterns: &[&str]) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *p,
    })
}

/// The shipped dependency graph by package id: normal and build edges only.
struct Graph<'m> {
    members: Vec<String>,
    names: HashMap<String, String>,
    packages: HashMap<String, &'m Value>,
    /// Each package's shipped dependencies: (the name it uses for it, its id).
    edges: HashMap<String, Vec<(String, String)>>,
}

impl<'m> Graph<'m> {
    fn from_metadata(metadata: &'m Value) -> Result<Self> {
        let packages: HashMap<String, &Value> = metadata["packages"]
            .as_array()
            .context("cargo metadata: no packages")?
            .iter()
            .filter_map(|p| Some((p["id"].as_str()?.to_string(), p)))
            .collect();
        let names: HashMap<String, String> = packages
            .iter()
            .filter_map(|(id, p)| Some((id.clone(), p["name"].as_str()?.to_string())))
            .collect();
        let known = |id: &str| -> Result<String> {
            if names.contains_key(id) {
                Ok(id.to_string())
            } else {
                bail!("cargo metadata: unknown package id {id}")
            }
        };
        let members = metadata["workspace_members"]
            .as_array()
            .context("cargo metadata: no workspace_members")?
            .iter()
            .map(|id| known(id.as_str().unwrap_or_default()).map(|id| names[&id].clone()))
            .collect::<Result<_>>()?;
        let mut edges: HashMap<String, Vec<(String, String)>> = HashMap::new();
        let nodes = metadata["resolve"]["nodes"]
            .as_array()
            .context("cargo metadata: no resolve graph")?;
        for node in nodes {
            let from = known(node["id"].as_str().unwrap_or_default())?;
            let deps = edges.entry(from).or_default();
            for dep in node["deps"].as_array().into_iter().flatten() {
                let shipped = dep["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null() || k["kind"] == "build");
                if shipped {
                    let name = dep["name"].as_str().unwrap_or_default().to_string();
                    deps.push((name, known(dep["pkg"].as_str().unwrap_or_default())?));
                }
            }
        }
        Ok(Self {
            members,
            names,
            packages,
            edges,
        })
    }

    /// Every package id the member `root` reaches through shipped edges (not `root` itself),
    /// with `features` of `root` on (`None`: all of them).
    fn reachable(&self, root: &str, features: Option<&[&str]>) -> Result<BTreeSet<String>> {
        let Some(id) = self
            .names
            .iter()
            .find(|(id, name)| *name == root && self.edges.contains_key(*id))
            .map(|(id, _)| id)
        else {
            bail!(
                "tidy: {root} is not in the dependency graph (renamed? update xtask/src/tidy.rs)"
            );
        };
        let wanted = features.map(|f| self.root_deps(id, f));
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&String> = self.edges[id]
            .iter()
            .filter(|(name, _)| wanted.as_ref().is_none_or(|w| w.contains(name)))
            .map(|(_, dep)| dep)
            .collect();
        while let Some(dep) = todo.pop() {
            if seen.insert(dep.clone()) {
                todo.extend(self.edges.get(dep).into_iter().flatten().map(|(_, d)| d));
            }
        }
        Ok(seen)
    }

    /// The names (as the resolve graph spells them) of `id`'s shipped dependencies with exactly
    /// `features` on: the non-optional ones and the optional ones those features enable.
    fn root_deps(&self, id: &str, features: &[&str]) -> BTreeSet<String> {
        let package = self.packages[id];
        let table = &package["features"];
        let mut enabled = BTreeSet::new();
        let mut todo: Vec<String> = features.iter().map(|f| f.to_string()).collect();
        while let Some(f) = todo.pop() {
            if !enabled.insert(f.clone()) {
                continue;
            }
            for item in table[&f].as_array().into_iter().flatten() {
                let item = item.as_str().unwrap_or_default();
                // `dep:x` and `x/feature` enable the dependency x; `x?/feature` does not.
                let dep = item.strip_prefix("dep:").unwrap_or(item);
                match dep.split_once('/') {
                    Some((d, _)) if !d.ends_with('?') => todo.push(d.to_string()),
                    Some(_) => {}
                    None => todo.push(dep.to_string()),
                }
            }
        }
        package["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].is_null() || d["kind"] == "build")
            .filter_map(|d| {
                let name = d["rename"].as_str().or(d["name"].as_str())?;
                let on = d["optional"] != true || enabled.contains(name);
                on.then(|| name.replace('-', "_"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An edge of the fixture: from, to, dependency kind, and the feature of `from` that
    /// enables it (`None`: not optional).
    type Edge<'a> = (&'a str, &'a str, Option<&'a str>, Option<&'a str>);

    /// A metadata document with the workspace's crates and `extra` shipped edges on top of the
    /// allowed ones; a crate an edge names is added to the packages.
    fn metadata(extra: &[Edge<'_>]) -> Value {
        let mut edges: Vec<Edge<'_>> = vec![
            ("monky-deployd", "monky-agent-proto", None, None),
            ("monky-deployd", "monky-bundle", None, None),
            ("monky-deployd", "monky-compose", None, None),
            ("monky-deployd", "monky-bao-client", None, None),
            ("monky-bao-client", "reqwest", None, None),
            ("monky-bao-client", "monky-vocab", None, None),
            ("monky-bao-client", "monky-http", None, None),
            ("monky-agent-proto", "monky-http", None, Some("client")),
            ("monky-http", "reqwest", None, None),
            ("monky-bundle", "monky-vocab", None, None),
            ("monky-agent-proto", "monky-vocab", None, None),
            ("monky-vocab", "serde", None, None),
            ("monky-bundle", "tar", None, None),
            ("monky-bundle", "serde-saphyr", None, None),
            ("reqwest", "hyper", None, None),
            ("monky-bundle", "serde", None, None),
            ("monky-agent-proto", "serde", None, None),
            ("monky-agent-proto", "reqwest", None, Some("client")),
            ("reqwest", "rustls", None, None),
            ("xtask", "anyhow", None, None),
            ("monky-testkit", "monky-agent-proto", None, None),
            ("monky-testkit", "reqwest", None, None),
            // Tests may wire the two fakes together, through the testkit.
            ("monky-bao-client", "monky-agent-proto", Some("dev"), None),
            ("monky-bao-client", "monky-testkit", Some("dev"), None),
            ("monky-deployd", "monky-testkit", Some("dev"), None),
        ];
        edges.extend_from_slice(extra);
        let members = [
            "monky-agent-proto",
            "monky-bao-client",
            "monky-bundle",
            "monky-compose",
            "monky-deployd",
            "monky-http",
            "monky-testkit",
            "monky-vocab",
            "xtask",
        ];
        let mut crates: Vec<&str> = members.to_vec();
        for (from, to, _, _) in &edges {
            for n in [from, to] {
                if !crates.contains(n) {
                    crates.push(n);
                }
            }
        }
        let id = |n: &str| format!("id-{n}");
        fn from<'e, 'a>(edges: &'e [Edge<'a>], n: &'e str) -> impl Iterator<Item = &'e Edge<'a>> {
            edges.iter().filter(move |e| e.0 == n)
        }
        let packages: Vec<Value> = crates
            .iter()
            .map(|n| {
                let mut features = serde_json::Map::new();
                let deps: Vec<Value> = from(&edges, n)
                    .map(|(_, to, kind, feature)| {
                        if let Some(f) = feature {
                            features.insert(f.to_string(), json!([format!("dep:{to}")]));
                        }
                        json!({"name": to, "rename": null, "kind": kind, "optional": feature.is_some()})
                    })
                    .collect();
                json!({"id": id(n), "name": n, "dependencies": deps, "features": features})
            })
            .collect();
        let nodes: Vec<Value> = crates
            .iter()
            .map(|n| {
                let deps: Vec<Value> = from(&edges, n)
                    .map(|(_, to, kind, _)| {
                        json!({"name": to.replace('-', "_"), "pkg": id(to),
                               "dep_kinds": [{"kind": kind, "target": null}]})
                    })
                    .collect();
                json!({"id": id(n), "deps": deps})
            })
            .collect();
        json!({
            "packages": packages,
            "workspace_members": members.iter().map(|n| id(n)).collect::<Vec<_>>(),
            "resolve": {"nodes": nodes},
        })
    }

    #[test]
    fn the_allowed_graph_passes() {
        assert_eq!(violations(&metadata(&[])).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_planted_forbidden_dependency_fails_naming_it() {
        let cases: &[(Edge<'_>, &str)] = &[
            // Transitive: bundle reaches hyper through reqwest.
            (
                ("monky-bundle", "reqwest", None, None),
                "monky-bundle depends on hyper",
            ),
            (
                ("monky-bundle", "url", None, None),
                "monky-bundle depends on url",
            ),
            // A prefix: any of AWS-LC's crates.
            (
                ("monky-bundle", "aws-lc-sys", Some("build"), None),
                "monky-bundle depends on aws-lc-sys",
            ),
            (
                ("monky-bundle", "monky-compose", Some("build"), None),
                "monky-bundle depends on monky-compose",
            ),
            (
                ("monky-agent-proto", "monky-bundle", None, None),
                "monky-agent-proto depends on monky-bundle",
            ),
            // Proto's wire types alone: no network crate, even one the client feature has.
            (
                ("monky-agent-proto", "url", None, None),
                "monky-agent-proto depends on url",
            ),
            // The client feature must not reach the OpenBao crate.
            (
                (
                    "monky-agent-proto",
                    "monky-bao-client",
                    None,
                    Some("client"),
                ),
                "monky-agent-proto depends on monky-bao-client",
            ),
            // Every feature on: never the docker side.
            (
                ("monky-agent-proto", "monky-compose", None, Some("testkit")),
                "monky-agent-proto depends on monky-compose",
            ),
            (
                ("xtask", "monky-deployd", None, None),
                "xtask depends on monky-deployd",
            ),
            // Transitive: the agent brings reqwest and rustls with it.
            (
                ("xtask", "monky-deployd", None, None),
                "xtask depends on rustls",
            ),
            (("xtask", "reqwest", None, None), "xtask depends on reqwest"),
            (
                ("monky-deployd", "monky-testkit", None, None),
                "monky-deployd depends on monky-testkit",
            ),
            (
                ("xtask", "monky-testkit", Some("build"), None),
                "xtask depends on monky-testkit",
            ),
            (
                ("monky-compose", "monky-bao-client", None, None),
                "monky-compose depends on monky-bao-client",
            ),
            (
                ("monky-bao-client", "monky-agent-proto", None, None),
                "monky-bao-client depends on monky-agent-proto",
            ),
            (
                ("monky-compose", "monky-deployd", None, None),
                "monky-compose depends on monky-deployd",
            ),
            // The OpenBao client: no archive or YAML reader, directly or through the bundle.
            (
                ("monky-bao-client", "flate2", None, None),
                "monky-bao-client depends on flate2",
            ),
            (
                ("monky-bao-client", "monky-bundle", None, None),
                "monky-bao-client depends on tar",
            ),
            (
                ("monky-bao-client", "monky-bundle", None, None),
                "monky-bao-client depends on serde-saphyr",
            ),
            (
                ("monky-http", "monky-bao-client", None, None),
                "monky-http depends on monky-bao-client",
            ),
            (
                ("monky-vocab", "tar", None, None),
                "monky-vocab depends on tar",
            ),
            (
                ("monky-vocab", "url", None, None),
                "monky-vocab depends on url",
            ),
        ];
        for (edge, expected) in cases {
            let broken = violations(&metadata(&[*edge])).unwrap();
            assert!(
                broken.iter().any(|line| line.starts_with(expected)),
                "{edge:?}: {broken:?}"
            );
        }
    }

    #[test]
    fn the_wire_types_alone_stay_under_their_crate_count() {
        let names: Vec<String> = (0..30).map(|n| format!("dep{n}")).collect();
        // serde, monky-vocab and 22 more: 25 with proto itself, the limit.
        let edges = |count: usize| -> Vec<Edge<'_>> {
            names[..count]
                .iter()
                .map(|n| ("monky-agent-proto", n.as_str(), None, None))
                .collect()
        };
        assert_eq!(
            violations(&metadata(&edges(22))).unwrap(),
            Vec::<String>::new()
        );
        let broken = violations(&metadata(&edges(23))).unwrap();
        assert!(
            broken
                .iter()
                .any(|l| l.starts_with("monky-agent-proto reaches 26 crates, over its 25")),
            "{broken:?}"
        );
        // Crates behind a feature do not count for the wire types alone.
        let behind: Vec<Edge<'_>> = names
            .iter()
            .map(|n| ("monky-agent-proto", n.as_str(), None, Some("client")))
            .collect();
        assert_eq!(
            violations(&metadata(&behind)).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_workspace_itself_keeps_the_rules() {
        // The same check `cargo xtask ci` runs, so `cargo test` alone catches a new edge or a
        // new spawn.
        main(&[]).unwrap();
    }
}
