//! `state.json` as found on disk: this agent's own, or the original (Python) agent's, which has
//! no `version` field, taken over: read for what the next tick needs, and the facts it lacks
//! derived from the release on disk. A file that is neither is set aside.
//!
//! The first tick after an upgrade must look to tenancy exactly like the tick before it: the
//! running sha in checkin (else tenancy answers `apply` and the box spends a lease and redeploys
//! what it already runs), the prod flag of the running release (else a first purge on a prod env
//! would drop its volumes), and the token facts (else the token is never renewed). Everything
//! here is read defensively: the file is the original agent's and the disk is the box's, so a
//! value of the wrong shape is dropped, never trusted.

use serde_json::{Map, Value};

use monky_agent_proto::Sha;

use crate::layout::Layout;
use crate::state::{Original, STATE_VERSION, State, TokenSource, TokenState};

/// As [`State::peek`], for `env_id`'s box: the original agent's file is taken over as the
/// tick would take it over, in memory only, so an upgraded box shows what it runs before
/// its first tick.
pub(crate) fn peek(layout: &Layout) -> State {
    let Some(bytes) = layout.peek_state() else {
        return State::default();
    };
    if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes)
        && is_original(&doc)
    {
        return from_original(&doc, layout).unwrap_or_default();
    }
    serde_json::from_slice(&bytes).unwrap_or_default()
}

/// Loads the state; a corrupt or foreign file is moved aside and a clean state returned,
/// with a note saying where the old file went.
pub(crate) fn load(layout: &Layout) -> anyhow::Result<(State, Option<String>)> {
    let env_id = layout.env_id();
    let fresh = State::new(env_id);
    let Some(bytes) = layout.read_state()? else {
        return Ok((fresh, None));
    };
    // This agent's own file, as on almost every tick: parsed once. The original agent's file
    // has no `version`, so it never parses to this one (a missing `version` is 0).
    let parsed = match serde_json::from_slice::<State>(&bytes) {
        Ok(s) if s.version() == STATE_VERSION && s.env_id() == env_id => return Ok((s, None)),
        other => other,
    };
    // The original agent's file has no `version`: taken over, not set aside.
    if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes)
        && is_original(&doc)
    {
        match from_original(&doc, layout) {
            Ok(s) => {
                let note = format!(
                    "state.json was written by the original agent; taken over (applied {})",
                    s.applied_sha().map_or("none", Sha::short)
                );
                return Ok((s, Some(note)));
            }
            Err(problem) => return set_aside(layout, fresh, &problem),
        }
    }
    let problem = match parsed {
        Ok(s) if s.version() != STATE_VERSION => format!("unknown version {}", s.version()),
        Ok(s) => format!("it belongs to env {:?}", s.env_id()),
        Err(e) => format!("it does not parse ({e})"),
    };
    set_aside(layout, fresh, &problem)
}

fn set_aside(
    layout: &Layout,
    fresh: State,
    problem: &str,
) -> anyhow::Result<(State, Option<String>)> {
    let aside = layout.set_state_aside(crate::clock::wall())?;
    Ok((
        fresh,
        Some(format!(
            "state.json set aside as {} because {problem}; starting clean",
            aside.display()
        )),
    ))
}

/// The most of `current/bundle.json` read to learn the tier; a real one is a few KiB.
const MAX_BUNDLE_JSON: u64 = 1 << 20;

/// Whether a parsed `state.json` is the original agent's shape (it never wrote `version`).
pub(crate) fn is_original(doc: &Value) -> bool {
    doc.as_object().is_some_and(|o| !o.contains_key("version"))
}

/// The state to continue with, from the original agent's `state.json` and the env's directory
/// (which holds `releases/<sha>` and `current` in both agents), read through `layout`.
///
/// `Err` names why the file cannot be taken over (it belongs to another env), so the caller
/// sets it aside as it does any foreign file.
pub(crate) fn from_original(doc: &Value, layout: &Layout) -> Result<State, String> {
    let env_id = layout.env_id();
    let o = doc.as_object().ok_or("it is not a json object")?;
    if let Some(other) = o.get("env_id").and_then(Value::as_str)
        && other != env_id
    {
        return Err(format!("it belongs to env {other:?}"));
    }
    let running = running_sha(layout);
    let mut applied_sha = o.get("applied_sha").and_then(sha);
    // The release `current` names is what runs; the file can only be older than that.
    if running.is_some() {
        applied_sha.clone_from(&running);
    }
    // The original's history, when it kept one, keeps rollback checks meaningful.
    let mut history: Vec<Sha> = o
        .get("applied_history")
        .and_then(Value::as_array)
        .map(|h| h.iter().filter_map(sha).collect())
        .unwrap_or_default();
    if let Some(a) = &applied_sha {
        history.retain(|s| s != a);
        history.push(a.clone());
    }
    let excess = history.len().saturating_sub(50);
    history.drain(..excess);
    Ok(State::taken_over(
        env_id,
        Original {
            applied_prod: applied_sha
                .as_ref()
                .and_then(|s| release_is_prod(layout, s.as_str())),
            applied_sha,
            applied_history: history,
            desired_sha: o.get("desired_sha").and_then(sha),
            last_checkin: o.get("last_checkin").and_then(seconds),
            last_report: o.get("last_report").and_then(seconds),
            last_result: o
                .get("last_result")
                .and_then(Value::as_str)
                // The original's state may say `refused`; this agent reports a refusal as
                // `failed`.
                .and_then(|r| match r {
                    "applied" | "failed" | "down" => Some(r),
                    "refused" => Some("failed"),
                    _ => None,
                })
                .map(str::to_string),
            token: o.get("token").and_then(Value::as_object).and_then(token),
        },
    ))
}

/// The sha `current` points at (`releases/<sha>`), when that release is on disk.
fn running_sha(layout: &Layout) -> Option<Sha> {
    let target = layout.current_target().ok()??;
    let name = target.file_name()?.to_str()?;
    let name = sha(&Value::String(name.to_string()))?;
    layout
        .releases_if_any()
        .ok()??
        .sub(name.as_str())
        .ok()?
        .map(|_| name)
}

/// Whether a release's `bundle.json` says `tier: prod`; `None` when it cannot be read.
fn release_is_prod(layout: &Layout, sha: &str) -> Option<bool> {
    // Bounded, regular files only: a link or FIFO planted there is not followed.
    let bytes = layout
        .releases_if_any()
        .ok()??
        .sub(sha)
        .ok()??
        .read(
            monky_bundle::MemberName::BUNDLE_JSON.as_str(),
            MAX_BUNDLE_JSON,
        )
        .ok()?;
    let doc: Value = serde_json::from_slice(&bytes).ok()?;
    Some(doc.get("tier").and_then(Value::as_str) == Some("prod"))
}

/// A sha as tenancy sends it: 64 lowercase hex digits.
fn sha(v: &Value) -> Option<Sha> {
    Sha::parse(v.as_str()?).ok()
}

/// Unix seconds as the original wrote them (`time.time()`: a float), or an integer.
fn seconds(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    (0.0..1e12).contains(&f).then_some(f as u64)
}

/// The first of `keys` that holds a time.
fn first_seconds(o: &Map<String, Value>, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| o.get(*k).and_then(seconds))
}

/// The token facts, when the original recorded both when the token was minted and when it
/// expires (or its TTL). Missing facts are learnt from OpenBao on the first tick instead.
fn token(o: &Map<String, Value>) -> Option<TokenState> {
    let source = match o.get("source").and_then(Value::as_str)? {
        "lease" => TokenSource::Lease,
        "bootstrap" => TokenSource::Bootstrap,
        _ => return None,
    };
    let obtained_at = first_seconds(o, &["obtained_at", "issued_at", "created_at", "minted_at"])?;
    let expires_at = first_seconds(o, &["expires_at", "expire_at", "expiry"]).or_else(|| {
        first_seconds(o, &["ttl_s", "ttl"]).map(|ttl| obtained_at.saturating_add(ttl))
    })?;
    Some(TokenState::from_wall(source, obtained_at, expires_at))
}

/// The variables whose value reached the app differently through the original agent's `.env`
/// than it does now (names only). The original wrote each value unquoted (`KEY=value`), where
/// compose expands `$`, cuts at ` #`, trims blanks and strips quotes; this agent quotes what
/// needs quoting, so the app now gets the value itself. An app whose database was initialised
/// with the mangled value sees a new password, and its operator needs to know which.
pub(crate) fn handed_differently(
    values: &std::collections::BTreeMap<String, secrecy::SecretString>,
) -> Vec<String> {
    use secrecy::ExposeSecret;
    values
        .iter()
        .filter(|(name, v)| {
            let v = v.expose_secret();
            if v.contains(['$', '\n', '\r']) {
                return true;
            }
            let template = format!("{name}=${{{name}}}\n");
            let env = zeroize::Zeroizing::new(format!("{name}={v}\n"));
            let read = monky_bundle::secret_values(
                &template,
                &env,
                &std::collections::BTreeSet::from([(*name).clone()]),
            );
            read.first().is_none_or(|r| r.expose_secret() != v)
        })
        .map(|(name, _)| name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const A: &str = "3f9c000000000000000000000000000000000000000000000000000000000001";
    const B: &str = "7a10000000000000000000000000000000000000000000000000000000000002";

    /// A state dir holding env `e1`.
    fn state_dir() -> (tempfile::TempDir, Layout) {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open_at(dir.path(), "e1").unwrap();
        layout.env().unwrap();
        (dir, layout)
    }

    fn release(layout: &Layout, sha: &str, tier: &str) {
        let dir = layout.releases_path().join(sha);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(monky_bundle::MemberName::BUNDLE_JSON.as_str()),
            json!({"env_id": "e1", "tier": tier, "renderer": "compose"}).to_string(),
        )
        .unwrap();
    }

    #[test]
    fn the_original_shape_keeps_its_sha_and_token_facts_and_learns_prod_from_disk() {
        let (_dir, layout) = state_dir();
        release(&layout, A, "prod");
        // The original agent's link, which may be absolute.
        std::os::unix::fs::symlink(layout.releases_path().join(A), layout.current_path()).unwrap();
        let doc = json!({
            "env_id": "e1", "applied_sha": A, "desired_sha": A, "last_result": "applied",
            "last_checkin": 1_790_000_000.25,
            "token": {"source": "lease", "obtained_at": 1_790_000_000.5, "expires_at": 1_790_086_400.5},
        });
        assert!(is_original(&doc));
        let s = from_original(&doc, &layout).unwrap();
        assert_eq!(s.version(), crate::state::STATE_VERSION);
        assert_eq!(s.applied_sha().map(Sha::as_str), Some(A));
        assert_eq!(s.applied_history().len(), 1);
        assert_eq!(s.applied_history()[0].as_str(), A);
        assert_eq!(s.applied_prod(), Some(true));
        assert_eq!(s.original_release().map(Sha::as_str), Some(A));
        assert_eq!(s.last_checkin(), Some(1_790_000_000));
        assert_eq!(
            s.token(),
            Some(&TokenState::from_wall(
                TokenSource::Lease,
                1_790_000_000,
                1_790_086_400
            ))
        );
    }

    #[test]
    fn values_the_original_env_mangled_are_named() {
        use secrecy::SecretString;
        let values: std::collections::BTreeMap<String, SecretString> = [
            ("PLAIN", "s3cret-Value_1"),
            ("DOLLAR", "pa$word"),
            ("HASH", "abc #def"),
            ("QUOTED", "'x'"),
            ("BLANK", "trailing "),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), SecretString::from(v)))
        .collect();
        assert_eq!(
            handed_differently(&values),
            ["BLANK", "DOLLAR", "HASH", "QUOTED"]
        );
    }

    #[test]
    fn missing_facts_come_from_current_and_bad_shapes_are_dropped() {
        let (_dir, layout) = state_dir();
        release(&layout, B, "qa");
        std::os::unix::fs::symlink(layout.releases_path().join(B), layout.current_path()).unwrap();
        // No applied_sha, a token without times, a sha of the wrong shape elsewhere.
        let doc = json!({"desired_sha": "not-a-sha", "token": {"source": "lease"}, "last_result": "weird"});
        let s = from_original(&doc, &layout).unwrap();
        assert_eq!(s.applied_sha().map(Sha::as_str), Some(B));
        assert_eq!(s.applied_prod(), Some(false));
        assert_eq!(s.desired_sha(), None);
        assert_eq!(s.token(), None);
        assert_eq!(s.last_result(), None);
        // A TTL instead of an expiry.
        let t = token(
            json!({"source": "bootstrap", "issued_at": 100, "ttl": 86400})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!((t.source, t.expires_at), (TokenSource::Bootstrap, 86500));
        // Nothing on disk and nothing in the file: an empty state, not a guess.
        let (_empty, empty) = state_dir();
        let s = from_original(&json!({}), &empty).unwrap();
        assert_eq!((s.applied_sha(), s.applied_prod()), (None, None));
        // Another env's file is not taken over.
        assert!(from_original(&json!({"env_id": "e2"}), &empty).is_err());
        assert!(!is_original(&json!({"version": 1})));
    }
}
