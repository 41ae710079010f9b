//! `monky-deployd explain`: what the box runs, what tenancy wants, and why they differ, from local
//! state and the docker socket only (no tenancy or OpenBao request).

use crate::config::Config;
use crate::exit::Exit;
use crate::redact::redact;
use crate::state::{self, State};
use crate::tick::short;

/// What to do next for each code the agent reports (docs/OPERATIONS.md has the same table).
pub const NEXT_STEPS: &[(&str, &str)] = &[
    (
        "ENV_INCOMPLETE",
        "the bundle uses variables its manifest does not provide: fix the manifest or .env.template in the renderer",
    ),
    (
        "ENV_VALUE_UNSAFE",
        "a secret's value cannot be written where .env.template puts it unquoted: quote that line in the template (KEY=\"...${VAR}...\")",
    ),
    (
        "PRIVILEGED_REFUSED",
        "the compose file asks for host privileges: remove them, or set allow_privileged in bundle.json if this env really needs them",
    ),
    (
        "ROLLBACK_REFUSED",
        "tenancy asks for an older release: set allow_rollback in bundle.json to roll back on purpose",
    ),
    (
        "DISK_INSUFFICIENT",
        "too little free space on the docker data root: run `monky-deployd run --once --prune` or grow the disk",
    ),
    (
        "RENDERER_REFUSED",
        "bundle.json names a renderer other than compose: re-render the bundle with the compose renderer",
    ),
    (
        "MANIFEST_VALUE_REFUSED",
        "the manifest carries a secret value: the renderer must ship paths only; rotate the exposed value",
    ),
    (
        "MANIFEST_PATH_REFUSED",
        "a manifest path is outside this env's prefix: fix it to <kv_mount>/<env_id>/see/<name>",
    ),
    (
        "BUNDLE_SHA_MISMATCH",
        "the bundle does not hash to the desired sha: publish the bundle again from tenancy",
    ),
    (
        "BUNDLE_INVALID",
        "the bundle tar is malformed: re-render it and check it with `monky-deployd bundle check`",
    ),
    (
        "BUNDLE_TOO_LARGE",
        "the bundle is over the size limit: keep large files out of the bundle",
    ),
    (
        "COMPOSE_PULL_FAILED",
        "the registry refused the pull (its message is in the detail): check the registry-auth secret and the image tag",
    ),
    (
        "COMPOSE_UP_FAILED",
        "compose could not start the release: read `journalctl -u monky-deployd` and the compose logs",
    ),
    (
        "UNHEALTHY",
        "containers did not become healthy: read the compose log tail in the report or `docker compose -p <project> logs`",
    ),
    (
        "NOT_RUNNING",
        "no container of the project runs: run `monky-deployd run --once --force` to apply again",
    ),
    (
        "COMPOSE_CONFIG_FAILED",
        "compose could not read the bundle: run `monky-deployd bundle check` on it",
    ),
    (
        "COMPOSE_DOWN_FAILED",
        "compose down failed: check that the docker daemon answers",
    ),
    (
        "STATE_DIR_UNSAFE",
        "the state dir, or something below it, is owned or writable by another user or is a link the agent did not make: remove what was planted, `chown -R` the state dir to the agent's user and `chmod 0700` it",
    ),
    (
        "GRANT_UNSAFE",
        "the bootstrap grant is a link, FIFO or device, readable by others, owned by another user, or too large: stage it again as a regular 0600 file owned by the agent's user (re-run the install kit)",
    ),
    (
        "RELEASE_MODIFIED",
        "a release's files or its .env changed on disk since the agent wrote it, so it was not started: find what wrote it (a container binding its own release dir?), then apply a release again from tenancy",
    ),
    (
        "NO_CREDENTIALS",
        "no OpenBao token and no bootstrap grant: re-run the install kit",
    ),
    (
        "AGENT_UNAUTHENTICATED",
        "the token was superseded or revoked: re-run the install kit for a fresh bootstrap grant",
    ),
    (
        "AGENT_ENV_MISMATCH",
        "the token belongs to another env: fix env_id in config.yaml or re-run the install kit for this env",
    ),
    (
        "LEASE_RATE_LIMITED",
        "tenancy's lease budget (5 per hour) is spent: the next ticks retry on their own",
    ),
    (
        "BAO_UNAVAILABLE",
        "OpenBao is unreachable or sealed: check the proxy transport and the mesh; the next tick retries",
    ),
    (
        "BAO_PERMISSION_DENIED",
        "OpenBao refused a read: check the manifest paths and the token's policy",
    ),
    (
        "SECRET_NOT_FOUND",
        "a pinned secret version does not exist: seed it in OpenBao or fix the manifest's version",
    ),
    (
        "BAO_LOGIN_REJECTED",
        "OpenBao refused the grant: re-run the install kit; check the jwt-tenancy mount and role",
    ),
];

/// The next step for a `CODE: ...` text, if the code is known.
pub fn next_step(last_error: &str) -> Option<&'static str> {
    let code = last_error.split(':').next()?.trim();
    NEXT_STEPS
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, step)| *step)
}

fn ago(now: u64, t: Option<u64>) -> String {
    match t {
        None => "never".into(),
        Some(t) if t > now => format!("in {}", human(t - now)),
        Some(t) => format!("{} ago", human(now - t)),
    }
}

fn human(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Prints the explanation.
pub fn show(cfg: &Config) -> anyhow::Result<Exit> {
    let st: State = crate::fsx::read_bounded(
        &state::path(&cfg.state_dir),
        crate::fsx::MAX_STATE_FILE_BYTES,
    )
    .ok()
    .and_then(|b| serde_json::from_slice(&b).ok())
    .unwrap_or_default();
    let now = state::now();
    let containers = monky_compose::Engine::from_env()
        .containers(&cfg.compose_project)
        .ok();
    let mut lines: Vec<(&str, String)> = vec![("env", cfg.env_id.clone())];
    let health = match &containers {
        Some(cs) => {
            let ready = cs.iter().filter(|c| c.is_ready()).count();
            format!("{ready}/{} container(s) running and healthy", cs.len())
        }
        None => "docker socket not reachable".into(),
    };
    lines.push((
        "running",
        format!("{} ({health})", short(st.applied_sha.as_deref())),
    ));
    lines.push(("desired", short(st.desired_sha.as_deref()).to_string()));
    let converged = st.applied_sha.is_some() && st.applied_sha == st.desired_sha;
    let why = if converged {
        "converged".to_string()
    } else if st.last_checkin.is_none() {
        "no checkin has succeeded yet".to_string()
    } else if let Some(deadline) = st
        .next_attempt_at
        .filter(|d| *d > now && st.failed_sha == st.desired_sha)
    {
        format!(
            "{} failed and waits: next attempt {} ({})",
            short(st.failed_sha.as_deref()),
            crate::status::rfc3339(deadline),
            ago(now, Some(deadline))
        )
    } else if st.last_error.is_some() {
        "the last apply did not succeed".to_string()
    } else {
        "an apply is due at the next tick".to_string()
    };
    lines.push(("state", why));
    if let Some(err) = &st.last_error {
        lines.push((
            "last error",
            format!("{} ({})", err, ago(now, st.last_report.or(st.last_checkin))),
        ));
    }
    if !st.quoting_changed.is_empty() {
        lines.push((
            "env change",
            format!(
                "{}: the original agent's .env handed these to the app differently; \
                 the app now gets the exact value",
                st.quoting_changed.join(", ")
            ),
        ));
    }
    lines.push(("checkin", ago(now, st.last_checkin)));
    let token_present = cfg.state_dir.join("bao.token").exists();
    lines.push((
        "token",
        match (&st.token, token_present) {
            (_, false) => "absent: re-run the install kit (or stage a bootstrap grant)".into(),
            (Some(t), true) => format!(
                "{}, expires {}",
                serde_json::to_value(t.source)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                ago(now, Some(t.expires_at))
            ),
            (None, true) => "present".into(),
        },
    ));
    let step = if converged {
        "nothing to do".to_string()
    } else if !token_present {
        "re-run the install kit".to_string()
    } else {
        st.last_error
            .as_deref()
            .and_then(next_step)
            .unwrap_or("wait for the next tick, or run `monky-deployd run --once`")
            .to_string()
    };
    lines.push(("next step", step));
    for (k, v) in lines {
        outln!("{k:<11} {}", redact(&v));
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_step_and_lookup_uses_the_code_prefix() {
        let mut codes: Vec<&str> = NEXT_STEPS.iter().map(|(c, _)| *c).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), NEXT_STEPS.len(), "duplicate code");
        assert!(
            next_step("ENV_INCOMPLETE: unresolved: A")
                .unwrap()
                .contains("manifest")
        );
        assert_eq!(next_step("SOMETHING_ELSE: x"), None);
        assert_eq!(human(59), "59s");
        assert_eq!(human(3600), "60m");
        assert_eq!(human(90_000), "25h");
    }

    #[test]
    fn operations_md_documents_every_code() {
        let doc = include_str!("../../docs/OPERATIONS.md");
        for (code, _) in NEXT_STEPS {
            assert!(
                doc.contains(&format!("`{code}`")),
                "docs/OPERATIONS.md lacks {code}"
            );
        }
    }
}
