//! `bundle.json`: what the renderer says about the bundle and what the agent may allow.

use serde_json::{Map, Value};

use crate::manifest::{opt_str, parse_json};
use crate::refusal::{Refusal, RefusalCode, printable};

const FILE: &str = "bundle.json";

/// The renderer this agent runs.
pub const RENDERER_COMPOSE: &str = "compose";

/// The fields of `bundle.json` the agent acts on. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleMeta {
    /// `env_id` (empty when absent).
    pub env_id: String,
    /// `tier`; `prod` makes the environment prod (empty when absent).
    pub tier: String,
    /// `site` (empty when absent).
    pub site: String,
    /// `renderer`; always `compose` in a parsed bundle.
    pub renderer: String,
    /// `allow_privileged`, at the top level or under `agent`: true when either says true.
    pub allow_privileged: bool,
    /// `allow_rollback`, at the top level or under `agent`: true when either says true.
    pub allow_rollback: bool,
    /// `disk_need_bytes` at the top level, else under `agent`, else `disk.need_bytes`.
    pub disk_need_bytes: Option<u64>,
    /// `address`: the env's own host name, which routing labels may name (empty when absent).
    pub address: String,
}

impl BundleMeta {
    /// Whether the environment is prod (`tier == "prod"`): volumes are never purged there.
    pub fn is_prod(&self) -> bool {
        self.tier == "prod"
    }

    /// Parses `bundle.json`.
    ///
    /// Refusals: `RENDERER_REFUSED` naming the renderer (or `missing`) unless it is exactly
    /// `compose`; `BUNDLE_INVALID` for malformed JSON or a known field of the wrong type.
    pub fn parse(bytes: &[u8]) -> Result<BundleMeta, Refusal> {
        let Value::Object(root) = parse_json(FILE, bytes)? else {
            return Err(Refusal::invalid(format!("{FILE}: not a json object")));
        };
        let renderer = opt_str(&root, "renderer", FILE)?;
        match renderer.as_deref() {
            Some(RENDERER_COMPOSE) => {}
            Some(other) => {
                return Err(Refusal::one(
                    RefusalCode::RendererRefused,
                    printable(other, 40),
                ));
            }
            None => return Err(Refusal::one(RefusalCode::RendererRefused, "missing")),
        }
        let agent = match root.get("agent") {
            None | Some(Value::Null) => None,
            Some(Value::Object(a)) => Some(a),
            Some(_) => return Err(Refusal::invalid(format!("{FILE}: agent is not an object"))),
        };
        let disk = match root.get("disk") {
            None | Some(Value::Null) => None,
            Some(Value::Object(d)) => Some(d),
            Some(_) => return Err(Refusal::invalid(format!("{FILE}: disk is not an object"))),
        };
        let flag = |key: &str| -> Result<bool, Refusal> {
            let top = opt_bool(&root, key, FILE)?;
            let nested = match agent {
                Some(a) => opt_bool(a, key, &format!("{FILE}: agent"))?,
                None => None,
            };
            Ok(top == Some(true) || nested == Some(true))
        };
        let disk_need_bytes = match opt_bytes(&root, "disk_need_bytes", FILE)? {
            Some(n) => Some(n),
            None => match (
                agent.map(|a| opt_bytes(a, "disk_need_bytes", &format!("{FILE}: agent"))),
                disk.map(|d| opt_bytes(d, "need_bytes", &format!("{FILE}: disk"))),
            ) {
                (Some(Err(e)), _) | (_, Some(Err(e))) => return Err(e),
                (Some(Ok(Some(n))), _) => Some(n),
                (_, Some(Ok(n))) => n,
                _ => None,
            },
        };
        Ok(BundleMeta {
            env_id: opt_str(&root, "env_id", FILE)?.unwrap_or_default(),
            tier: opt_str(&root, "tier", FILE)?.unwrap_or_default(),
            site: opt_str(&root, "site", FILE)?.unwrap_or_default(),
            renderer: RENDERER_COMPOSE.to_owned(),
            allow_privileged: flag("allow_privileged")?,
            allow_rollback: flag("allow_rollback")?,
            disk_need_bytes,
            address: opt_str(&root, "address", FILE)?.unwrap_or_default(),
        })
    }
}

fn opt_bool(m: &Map<String, Value>, key: &str, where_: &str) -> Result<Option<bool>, Refusal> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(Refusal::invalid(format!(
            "{where_}: {key} is not a boolean"
        ))),
    }
}

fn opt_bytes(m: &Map<String, Value>, key: &str, where_: &str) -> Result<Option<u64>, Refusal> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(v) = n.as_u64() {
                return Ok(Some(v));
            }
            // A renderer that computed the size as a float still means a byte count.
            match n.as_f64() {
                Some(f) if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < 1.8e19 => {
                    Ok(Some(f as u64))
                }
                _ => Err(Refusal::invalid(format!(
                    "{where_}: {key} is not a non-negative integer"
                ))),
            }
        }
        Some(_) => Err(Refusal::invalid(format!("{where_}: {key} is not a number"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str, expected: &str) {
        let got = match BundleMeta::parse(json.as_bytes()) {
            Ok(m) => format!(
                "prod={} privileged={} rollback={} need={:?}",
                m.is_prod(),
                m.allow_privileged,
                m.allow_rollback,
                m.disk_need_bytes
            ),
            Err(r) => r.to_string(),
        };
        assert_eq!(got, expected, "{json}");
    }

    /// `bundle.json` texts and the flags and disk need read from them.
    const FLAGS: &[(&str, &str)] = &[
        (
            r#"{"renderer":"compose"}"#,
            "prod=false privileged=false rollback=false need=None",
        ),
        (
            r#"{"renderer":"compose","tier":"prod","x":{"y":1}}"#,
            "prod=true privileged=false rollback=false need=None",
        ),
        (
            r#"{"renderer":"compose","tier":"Prod"}"#,
            "prod=false privileged=false rollback=false need=None",
        ),
        (
            r#"{"renderer":"compose","allow_privileged":true}"#,
            "prod=false privileged=true rollback=false need=None",
        ),
        (
            r#"{"renderer":"compose","agent":{"allow_rollback":true}}"#,
            "prod=false privileged=false rollback=true need=None",
        ),
        (
            r#"{"renderer":"compose","allow_rollback":false,"agent":{"allow_rollback":true}}"#,
            "prod=false privileged=false rollback=true need=None",
        ),
        (
            r#"{"renderer":"compose","disk_need_bytes":3}"#,
            "prod=false privileged=false rollback=false need=Some(3)",
        ),
        (
            r#"{"renderer":"compose","agent":{"disk_need_bytes":5}}"#,
            "prod=false privileged=false rollback=false need=Some(5)",
        ),
        (
            r#"{"renderer":"compose","disk":{"need_bytes":7}}"#,
            "prod=false privileged=false rollback=false need=Some(7)",
        ),
        (
            r#"{"renderer":"compose","disk":{"need_bytes":7.0}}"#,
            "prod=false privileged=false rollback=false need=Some(7)",
        ),
        (
            r#"{"renderer":"compose","disk_need_bytes":1,"agent":{"disk_need_bytes":5}}"#,
            "prod=false privileged=false rollback=false need=Some(1)",
        ),
    ];

    #[test]
    fn flags_and_need_spellings() {
        for (json, expected) in FLAGS {
            check(json, expected);
        }
    }

    /// `bundle.json` texts refused, and the refusal.
    const REFUSED: &[(&str, &str)] = &[
        (r#"{"renderer":"helm"}"#, "RENDERER_REFUSED: helm"),
        (r#"{"tier":"dev"}"#, "RENDERER_REFUSED: missing"),
        (r#"{"renderer":"Compose"}"#, "RENDERER_REFUSED: Compose"),
        (
            r#"{"renderer":1}"#,
            "BUNDLE_INVALID: bundle.json: renderer is not a string",
        ),
        (
            r#"{"renderer":"compose","allow_privileged":"yes"}"#,
            "BUNDLE_INVALID: bundle.json: allow_privileged is not a boolean",
        ),
        (
            r#"{"renderer":"compose","agent":[]}"#,
            "BUNDLE_INVALID: bundle.json: agent is not an object",
        ),
        (
            r#"{"renderer":"compose","disk":{"need_bytes":-1}}"#,
            "BUNDLE_INVALID: bundle.json: disk: need_bytes is not a non-negative integer",
        ),
        ("[1]", "BUNDLE_INVALID: bundle.json: not a json object"),
    ];

    #[test]
    fn refusals() {
        for (json, expected) in REFUSED {
            check(json, expected);
        }
    }
}
