//! The refusal checks an apply runs before it leases anything. Names only, never values.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeSet;

use secrecy::zeroize::Zeroize;
use serde_json::Value;

use crate::Sha;
use crate::env::unresolved_vars;
use crate::interp::{self, Mode};
use crate::refusal::{Refusal, RefusalCode};

/// The default free-space factor applied to a bundle's `disk_need_bytes`.
pub const DEFAULT_DISK_FACTOR: f64 = 1.5;

/// The default free-space headroom on top of `need x factor`: 2 GiB.
pub const DEFAULT_DISK_HEADROOM: u64 = 2 * GIB;

const GIB: u64 = 1024 * 1024 * 1024;
const MIB: u64 = 1024 * 1024;

/// Refuses with `ENV_INCOMPLETE` naming every variable `template` needs that `provided`
/// lacks (see [`unresolved_vars`](crate::unresolved_vars) for what counts).
///
/// ```
/// use std::collections::BTreeSet;
/// let provided = BTreeSet::from(["KEY".to_string()]);
/// let err = monky_bundle::check_env_complete("# ${VAR}\nKEY=$KEY\nTOKEN=${TOKEN}\n", &provided)
///     .unwrap_err();
/// assert_eq!(err.to_string(), "ENV_INCOMPLETE: unresolved: TOKEN");
/// ```
pub fn check_env_complete(template: &str, provided: &BTreeSet<String>) -> Result<(), Refusal> {
    let missing = unresolved_vars(template, provided);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Refusal::new(RefusalCode::EnvIncomplete, missing))
    }
}

/// Refuses with `ROLLBACK_REFUSED` when `sha` was applied before but is not the current one.
///
/// `applied_history` is oldest first; its last entry is the currently applied sha, which may
/// be re-applied. With `allow` (the bundle's `allow_rollback`) nothing is refused. The names
/// give the two shas' first 12 characters. Both are [`Sha`]s, lowercase by construction, so
/// they compare as they are.
pub fn check_rollback(sha: &Sha, applied_history: &[Sha], allow: bool) -> Result<(), Refusal> {
    let current = applied_history.last();
    if allow || current == Some(sha) || !applied_history.contains(sha) {
        return Ok(());
    }
    let current = current.map_or("", Sha::short);
    Err(Refusal::new(
        RefusalCode::RollbackRefused,
        [sha.short().to_string(), format!("current {current}")],
    ))
}

/// Refuses with `DISK_INSUFFICIENT` when `free < need x factor + headroom`.
///
/// A `factor` that is not a finite non-negative number is replaced by
/// [`DEFAULT_DISK_FACTOR`] rather than letting a NaN wave everything through. The names give
/// the required and the free space, e.g. `need 3.5 GiB, free 1.2 GiB`.
pub fn check_disk(free: u64, need: u64, factor: f64, headroom: u64) -> Result<(), Refusal> {
    let factor = if factor.is_finite() && factor >= 0.0 {
        factor
    } else {
        DEFAULT_DISK_FACTOR
    };
    let scaled = (need as f64 * factor).ceil();
    // `as` saturates for floats beyond u64::MAX.
    let required = (scaled as u64).saturating_add(headroom);
    if free >= required {
        return Ok(());
    }
    Err(Refusal::new(
        RefusalCode::DiskInsufficient,
        [
            format!("need {}", human(required)),
            format!("free {}", human(free)),
        ],
    ))
}

/// Bytes as the journal shows them: GiB or MiB with one decimal, plain bytes below that.
fn human(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

/// The compose file's YAML budget (see docs/compose-policy.md): far above real files (production
/// stacks use ~140 merges of one anchor), small enough that an alias bomb (billion laughs) or a
/// merge-key storm is refused instead of expanded. The refusal names the limit that was hit.
pub(crate) const YAML_MAX_ALIASES: usize = 2_000;
pub(crate) const YAML_MAX_ANCHORS: usize = 2_000;
pub(crate) const YAML_MAX_MERGE_KEYS: usize = 2_000;
pub(crate) const YAML_MAX_NODES: usize = 100_000;
pub(crate) const YAML_MAX_EVENTS: usize = 200_000;
pub(crate) const YAML_MAX_DEPTH: usize = 64;
pub(crate) const YAML_MAX_REPLAYED_EVENTS: usize = 100_000;
pub(crate) const YAML_MAX_EXPANSIONS_PER_ANCHOR: usize = 1_000;
pub(crate) const YAML_MAX_REPLAY_DEPTH: usize = 16;

fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: YAML_MAX_EVENTS,
            max_aliases: YAML_MAX_ALIASES,
            max_anchors: YAML_MAX_ANCHORS,
            max_nodes: YAML_MAX_NODES,
            max_depth: YAML_MAX_DEPTH,
            max_documents: 1,
            max_merge_keys: YAML_MAX_MERGE_KEYS,
            max_recorded_anchor_events: YAML_MAX_REPLAYED_EVENTS,
            max_recorded_anchor_bytes: 4 * 1024 * 1024,
            // The ratio heuristic refused 100 uses of one anchor, which real files have; the
            // absolute limits above and the replay limits below bound an alias bomb instead.
            enforce_alias_anchor_ratio: false,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: YAML_MAX_REPLAYED_EVENTS,
            max_replay_stack_depth: YAML_MAX_REPLAY_DEPTH,
            max_alias_expansions_per_anchor: YAML_MAX_EXPANSIONS_PER_ANCHOR,
        },
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        // compose's go-yaml reads YAML 1.2 booleans only: `n`, `yes`, `off` are strings to it
        // (a network named `n`, `DEBUG: off`), and must stay strings in the rewrite it runs.
        strict_booleans: true,
        legacy_octal_numbers: true,
    }
}

/// Parses compose YAML into a JSON value under [`yaml_options`]. The refusal names the kind of
/// problem and its position, never the text around it.
pub(crate) fn parse_compose(yaml: &str) -> Result<Value, Refusal> {
    serde_saphyr::from_str_with_options::<Value>(yaml, yaml_options()).map_err(|e| {
        use serde_saphyr::Error as E;
        // Classified by variant: the rendered message quotes the YAML around the error.
        let mut inner = &e;
        while let E::WithSnippet { error, .. } | E::AliasError { error, .. } = inner {
            inner = error;
        }
        use serde_saphyr::budget::BudgetBreach as B;
        let what = match inner {
            E::Budget {
                breach: B::Documents { .. },
                ..
            }
            | E::MultipleDocuments { .. } => "more than one yaml document".to_string(),
            E::Budget { breach, .. } => match breach {
                B::Aliases { .. } => format!("yaml over its budget of {YAML_MAX_ALIASES} aliases"),
                B::Anchors { .. } => format!("yaml over its budget of {YAML_MAX_ANCHORS} anchors"),
                B::MergeKeys { .. } => {
                    format!("yaml over its budget of {YAML_MAX_MERGE_KEYS} merge keys")
                }
                B::Nodes { .. } => format!("yaml over its budget of {YAML_MAX_NODES} nodes"),
                B::Events { .. } => format!("yaml over its budget of {YAML_MAX_EVENTS} events"),
                B::Depth { .. } => {
                    format!("yaml nested over its budget of {YAML_MAX_DEPTH} levels")
                }
                B::RecordedAnchorEvents { .. } | B::RecordedAnchorBytes { .. } => {
                    "yaml anchors over their budget of 100000 events or 4 MiB".to_string()
                }
                _ => "yaml over its size budget".to_string(),
            },
            E::AliasReplayCounterOverflow { .. } | E::AliasReplayLimitExceeded { .. } => format!(
                "yaml aliases expand to over its budget of {YAML_MAX_REPLAYED_EVENTS} events"
            ),
            E::AliasExpansionLimitExceeded { .. } => format!(
                "yaml uses one anchor over its budget of {YAML_MAX_EXPANSIONS_PER_ANCHOR} times"
            ),
            E::AliasReplayStackDepthExceeded { .. } => {
                format!("yaml aliases nest over its budget of {YAML_MAX_REPLAY_DEPTH} levels")
            }
            E::DuplicateMappingKey { .. } => "duplicate key".to_string(),
            _ => "invalid yaml".to_string(),
        };
        match e.location() {
            Some(l) if l.line() > 0 => Refusal::invalid(format!(
                "compose file: {what} at line {} column {}",
                l.line(),
                l.column()
            )),
            _ => Refusal::invalid(format!("compose file: {what}")),
        }
    })
}

/// The most the values interpolated into a compose file may add up to: far above any real
/// file, far below what a small file referencing a long value thousands of times would need.
const MAX_INTERPOLATED_VALUE_BYTES: usize = 8 * 1024 * 1024;

/// Interpolates every string value (not keys) the way compose does, through `env`. `used`
/// counts the value bytes substituted so far across the document.
fn interpolate(
    v: &mut Value,
    env: &dyn Fn(&str) -> Option<String>,
    used: &Cell<usize>,
) -> Result<(), Refusal> {
    match v {
        Value::String(s) => {
            if s.contains('$') {
                let over = Cell::new(false);
                let lookup = |n: &str| {
                    if over.get() {
                        return None;
                    }
                    let value = env(n)?;
                    if used.get() + value.len() > MAX_INTERPOLATED_VALUE_BYTES {
                        over.set(true);
                        return None;
                    }
                    used.set(used.get() + value.len());
                    Some(Cow::Owned(value))
                };
                let mut out = String::with_capacity(s.len());
                interp::expand_into(s, &lookup, &interp::verbatim, Mode::Compose, 0, &mut out)
                    .map_err(|_| {
                        Refusal::invalid("compose file: interpolation nested too deeply")
                    })?;
                if over.get() {
                    out.zeroize();
                    return Err(Refusal::one(
                        RefusalCode::BundleTooLarge,
                        format!(
                            "compose file interpolates over {MAX_INTERPOLATED_VALUE_BYTES} bytes of values"
                        ),
                    ));
                }
                *s = out;
            }
        }
        Value::Array(a) => {
            for item in a {
                interpolate(item, env, used)?;
            }
        }
        Value::Object(m) => {
            for item in m.values_mut() {
                interpolate(item, env, used)?;
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
    Ok(())
}

/// Interpolates every string value of a parsed compose file through `env`, with the cap on
/// the values substituted.
pub(crate) fn interpolate_compose(
    doc: &mut Value,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), Refusal> {
    interpolate(doc, env, &Cell::new(0))
}

/// Zeroes every string of a tree that may hold secret values, before it is freed.
pub(crate) fn scrub(v: &mut Value) {
    match v {
        Value::String(s) => s.zeroize(),
        Value::Array(a) => a.iter_mut().for_each(scrub),
        Value::Object(m) => m.values_mut().for_each(scrub),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human(0), "0 bytes");
        assert_eq!(human(MIB), "1.0 MiB");
        assert_eq!(human(3 * GIB + GIB / 2), "3.5 GiB");
    }
}
