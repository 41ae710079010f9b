//! `cargo xtask tidy`: the crate rules of docs/architecture.md, checked over `cargo metadata`,
//! and its code rules, checked over the sources (`code`).
//!
//! The crate rules are about what ships: each library's normal and build dependencies, followed
//! transitively, with every feature on (a feature that pulls a forbidden crate is caught too).
//! Dev-dependencies are exempt, because the tests of one peer's fake may wire in the other's.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::state;

mod code;

/// Crates that speak to the network, which `monky-bundle` must never reach.
const NETWORK: &[&str] = &[
    "reqwest",
    "hyper",
    "hyper-util",
    "h2",
    "tokio",
    "mio",
    "socket2",
    "tiny_http",
    "rustls",
    "ureq",
];

/// The TLS stacks and crypto backends: xtask builds and runs `tidy` without any of them.
const TLS: &[&str] = &[
    "rustls",
    "rustls-webpki",
    "aws-lc-rs",
    "aws-lc-sys",
    "ring",
    "openssl",
    "openssl-sys",
    "native-tls",
    "reqwest",
    "hyper-rustls",
    "tokio-rustls",
];

/// One rule: `krate` must not depend, directly or through others, on any of `forbidden`.
struct Rule {
    krate: &'static str,
    forbidden: &'static [&'static str],
    why: &'static str,
}

const RULES: &[Rule] = &[
    Rule {
        krate: "monky-agent-proto",
        forbidden: &["monky-bundle", "monky-compose", "monky-deployd"],
        why: "tenancy's own tooling imports the wire crate; it carries no agent policy",
    },
    Rule {
        krate: "monky-bundle",
        forbidden: &[
            "monky-agent-proto",
            "monky-bao-client",
            "monky-compose",
            "monky-deployd",
        ],
        why: "the bundle is parsed and judged offline, knowing no peer",
    },
    Rule {
        krate: "monky-bundle",
        forbidden: NETWORK,
        why: "monky-bundle does no network IO",
    },
    Rule {
        krate: "monky-compose",
        forbidden: &["monky-agent-proto", "monky-bao-client", "monky-deployd"],
        why: "the docker driver knows neither tenancy nor OpenBao",
    },
    Rule {
        krate: "monky-bao-client",
        forbidden: &["monky-agent-proto", "monky-deployd"],
        why: "the OpenBao client knows nothing of tenancy's wire format",
    },
    Rule {
        krate: "xtask",
        forbidden: TLS,
        why: "xtask runs tidy without the agent's TLS stack (the agent writes its own man pages)",
    },
];

/// The test support crate: a dev-dependency only, never shipped.
const TESTKIT: &str = "monky-testkit";

/// Only these workspace members may depend on the agent binary's crate (`fuzz/`, its own
/// workspace, does too).
const AGENT_USERS: &[&str] = &[];

/// Runs tidy with the command-line `args` (after `tidy`).
pub fn main(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        if arg == "-h" || arg == "--help" {
            println!(
                "cargo xtask tidy\n  checks the crate dependency rules and the code rules of \
                 docs/architecture.md"
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
    let all: Vec<&code::CodeRule> = code::RULES.iter().collect();
    for (rule, v) in code::check_tree(&state::workspace_root(), &all)? {
        broken.push(format!("{v} ({rule})"));
    }
    if broken.is_empty() {
        println!(
            "tidy: the crate rules hold ({rules} rules), and the code rules hold ({})",
            code::RULES.len(),
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
        let reach = graph.reachable(rule.krate)?;
        for bad in rule.forbidden.iter().filter(|name| reach.contains(**name)) {
            broken.push(format!(
                "{} depends on {bad}, which it must not: {}",
                rule.krate, rule.why
            ));
        }
    }
    for member in &graph.members {
        let reach = graph.reachable(member)?;
        if member != "monky-deployd"
            && !AGENT_USERS.contains(&member.as_str())
            && reach.contains("monky-deployd")
        {
            broken.push(format!(
                "{member} depends on monky-deployd: only fuzz may depend on the agent"
            ));
        }
        if reach.contains(TESTKIT) {
            broken.push(format!(
                "{member} depends on {TESTKIT}: test support is a dev-dependency only"
            ));
        }
    }
    Ok(broken)
}

/// The shipped dependency graph by package name: normal and build edges only.
struct Graph {
    members: Vec<String>,
    edges: HashMap<String, Vec<String>>,
}

impl Graph {
    fn from_metadata(metadata: &Value) -> Result<Self> {
        let names: HashMap<&str, &str> = metadata["packages"]
            .as_array()
            .context("cargo metadata: no packages")?
            .iter()
            .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
            .collect();
        let name_of = |id: &str| -> Result<String> {
            names
                .get(id)
                .map(|n| n.to_string())
                .with_context(|| format!("cargo metadata: unknown package id {id}"))
        };
        let members = metadata["workspace_members"]
            .as_array()
            .context("cargo metadata: no workspace_members")?
            .iter()
            .map(|id| name_of(id.as_str().unwrap_or_default()))
            .collect::<Result<_>>()?;
        let mut edges: HashMap<String, Vec<String>> = HashMap::new();
        let nodes = metadata["resolve"]["nodes"]
            .as_array()
            .context("cargo metadata: no resolve graph")?;
        for node in nodes {
            let from = name_of(node["id"].as_str().unwrap_or_default())?;
            let deps = edges.entry(from).or_default();
            for dep in node["deps"].as_array().into_iter().flatten() {
                let shipped = dep["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null() || k["kind"] == "build");
                if shipped {
                    deps.push(name_of(dep["pkg"].as_str().unwrap_or_default())?);
                }
            }
        }
        Ok(Self { members, edges })
    }

    /// Every package `root` reaches through shipped edges (not `root` itself).
    fn reachable(&self, root: &str) -> Result<BTreeSet<String>> {
        if !self.edges.contains_key(root) {
            bail!(
                "tidy: {root} is not in the dependency graph (renamed? update xtask/src/tidy.rs)"
            );
        }
        let mut seen = BTreeSet::new();
        let mut todo = vec![root.to_string()];
        while let Some(name) = todo.pop() {
            for dep in self.edges.get(&name).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
        }
        Ok(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A metadata document with the workspace's five crates and `extra` shipped edges on top
    /// of the allowed ones.
    fn metadata(extra: &[(&str, &str, Option<&str>)]) -> Value {
        let crates = [
            "monky-agent-proto",
            "monky-bao-client",
            "monky-bundle",
            "monky-compose",
            "monky-deployd",
            "monky-testkit",
            "xtask",
            "reqwest",
            "hyper",
            "serde",
            "rustls",
            "anyhow",
        ];
        let mut edges: Vec<(&str, &str, Option<&str>)> = vec![
            ("monky-deployd", "monky-agent-proto", None),
            ("monky-deployd", "monky-bundle", None),
            ("monky-deployd", "monky-compose", None),
            ("monky-deployd", "monky-bao-client", None),
            ("monky-bao-client", "reqwest", None),
            ("reqwest", "hyper", None),
            ("reqwest", "rustls", None),
            ("monky-bundle", "serde", None),
            ("xtask", "anyhow", None),
            ("monky-testkit", "monky-agent-proto", None),
            ("monky-testkit", "reqwest", None),
            // Tests may wire the two fakes together, through the testkit.
            ("monky-bao-client", "monky-agent-proto", Some("dev")),
            ("monky-bao-client", "monky-testkit", Some("dev")),
            ("monky-deployd", "monky-testkit", Some("dev")),
        ];
        edges.extend_from_slice(extra);
        let id = |n: &str| format!("id-{n}");
        let packages: Vec<Value> = crates
            .iter()
            .map(|n| json!({"id": id(n), "name": n}))
            .collect();
        let nodes: Vec<Value> = crates
            .iter()
            .map(|n| {
                let deps: Vec<Value> = edges
                    .iter()
                    .filter(|(from, _, _)| from == n)
                    .map(|(_, to, kind)| {
                        json!({"pkg": id(to), "dep_kinds": [{"kind": kind, "target": null}]})
                    })
                    .collect();
                json!({"id": id(n), "deps": deps})
            })
            .collect();
        json!({
            "packages": packages,
            "workspace_members": crates[..7].iter().map(|n| id(n)).collect::<Vec<_>>(),
            "resolve": {"nodes": nodes},
        })
    }

    #[test]
    fn the_allowed_graph_passes() {
        assert_eq!(violations(&metadata(&[])).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_planted_forbidden_dependency_fails_naming_it() {
        let cases: &[(&str, &str, Option<&str>, &str)] = &[
            // Transitive: bundle reaches hyper through reqwest.
            (
                "monky-bundle",
                "reqwest",
                None,
                "monky-bundle depends on hyper",
            ),
            (
                "monky-bundle",
                "monky-compose",
                Some("build"),
                "monky-bundle depends on monky-compose",
            ),
            (
                "monky-agent-proto",
                "monky-bundle",
                None,
                "monky-agent-proto depends on monky-bundle",
            ),
            (
                "monky-compose",
                "monky-bao-client",
                None,
                "monky-compose depends on monky-bao-client",
            ),
            (
                "monky-bao-client",
                "monky-agent-proto",
                None,
                "monky-bao-client depends on monky-agent-proto",
            ),
            (
                "monky-compose",
                "monky-deployd",
                None,
                "monky-compose depends on monky-deployd",
            ),
            (
                "xtask",
                "monky-deployd",
                None,
                "xtask depends on monky-deployd",
            ),
            // Transitive: the agent brings reqwest and rustls with it.
            ("xtask", "monky-deployd", None, "xtask depends on rustls"),
            ("xtask", "reqwest", None, "xtask depends on reqwest"),
            (
                "monky-deployd",
                "monky-testkit",
                None,
                "monky-deployd depends on monky-testkit",
            ),
            (
                "xtask",
                "monky-testkit",
                Some("build"),
                "xtask depends on monky-testkit",
            ),
        ];
        for (from, to, kind, expected) in cases {
            let broken = violations(&metadata(&[(from, to, *kind)])).unwrap();
            assert!(
                broken.iter().any(|line| line.starts_with(expected)),
                "{from} -> {to}: {broken:?}"
            );
        }
    }

    #[test]
    fn the_workspace_itself_keeps_the_rules() {
        // The same check `cargo xtask ci` runs, so `cargo test` alone catches a new edge or a
        // new spawn.
        main(&[]).unwrap();
    }
}
