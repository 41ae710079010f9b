//! `monky-deployd explain`: what the box runs, what tenancy wants, and why they differ, from local
//! state and the docker socket only (no tenancy or OpenBao request; the clock is judged by the
//! last tick's reading of OpenBao's).

use monky_agent_proto::Sha;

use crate::code::CodePolicy as _;
use crate::config::Config;
use crate::exit::Exit;
use crate::layout::Layout;
use crate::redact::redact;

/// A sha read from disk as `Sha::short` shows it: `-` for none, or for text that is no sha.
fn shown(text: Option<&str>) -> String {
    text.and_then(|t| Sha::parse(t).ok())
        .map_or_else(|| "-".to_owned(), |s| s.short().to_owned())
}

fn ago(now: u64, t: Option<u64>) -> String {
    match t {
        None => "never".into(),
        Some(t) if t > now => format!("in {}", human(t - now)),
        Some(t) => format!("{} ago", human(now - t)),
    }
}

/// One rounding of a span for every view (the tick's messages, `doctor`, `explain`): the same
/// skew or wait never reads 3m in one place and 2m in another.
use crate::clock::human;

/// Prints the explanation.
pub(crate) fn show(cfg: &Config) -> anyhow::Result<Exit> {
    let layout = Layout::peek(cfg);
    let st = crate::statefile::peek(&layout);
    let now = crate::clock::wall();
    let listed = monky_compose::Engine::from_env()
        .containers(&cfg.compose_project)
        .map(|cs| crate::drift::settled(cs, st.converged()))
        .map_err(|e| e.to_string());
    let token_present = layout.has_token();
    let grant_staged = crate::verdict::grant_staged(&cfg.bootstrap_file);
    let boot = crate::clock::boot();
    let seen = crate::verdict::Seen {
        now,
        token_present,
        containers: Some(&listed),
        boot: boot.as_ref(),
        state_free: monky_compose::engine::free_bytes(&cfg.state_dir).ok(),
    };
    let why_not = crate::verdict::not_converged(&st, seen);
    // A clock gone wrong since the last tick is the box admin's move too.
    let clock = crate::verdict::clock_problem(&st, seen).map(|_| crate::code::Code::TlsClock);
    let containers = listed.as_ref().ok();
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
        format!("{} ({health})", st.applied_sha().map_or("-", Sha::short)),
    ));
    lines.push((
        "desired",
        st.desired_sha().map_or("-", Sha::short).to_string(),
    ));
    let hold = crate::hold::peek(&layout, st.clock());
    let interrupted = crate::interrupted::peek(&layout);
    let converged = why_not.is_empty()
        && interrupted.is_none()
        && st.last_code() != Some(crate::code::Code::Drift)
        && st.last_code() != Some(crate::code::Code::HealFailed);
    let verdict_key = crate::tick::backoff::verdict_key(cfg);
    // A backoff is what stands between the operator and a retry: the next step says how to
    // retry now.
    let mut waiting = false;
    let why = if let Some(h) = &hold {
        format!("held: {}", h.describe())
    } else if let Some(m) = &interrupted {
        format!(
            "the apply of {} started {} was cut short (kill, reboot, OOM): the next tick \
             clears compose's leftovers and finishes it, or rolls back to {}",
            m.sha.as_ref().map_or("-", Sha::short),
            ago(now, Some(m.started_at)),
            m.previous.as_ref().map_or("-", Sha::short)
        )
    } else if let Some(code @ (crate::code::Code::Drift | crate::code::Code::HealFailed)) =
        st.last_code().filter(|_| st.last_error().is_some())
    {
        format!(
            "the containers drifted from {} ({code}); {}",
            st.applied_sha().map_or("-", Sha::short),
            match st.next_heal_at().filter(|t| *t > now) {
                _ if !cfg.self_heal => "self_heal is off, so no tick heals it: \
                     `monky-deployd run --once --force` does"
                    .to_string(),
                None => "the next tick heals it".to_string(),
                Some(t) => format!("the next heal may run {}", ago(now, Some(t))),
            }
        )
    } else if converged {
        "converged".to_string()
    } else if st.last_checkin().is_none() && !token_present && grant_staged {
        "installed, before the first tick: it logs in with the staged grant, checks in and \
         applies what tenancy wants"
            .to_string()
    } else if st.last_checkin().is_none() {
        "no checkin has succeeded yet".to_string()
    } else if let Some(failed) = st
        .failed()
        .filter(|f| Some(&f.sha) == st.desired_sha())
        .filter(|_| crate::tick::backoff::ReleaseBackoff::config_changed(&st, &verdict_key))
    {
        format!(
            "{} failed under another config (waivers, budget, allowed_*, health wait): the \
             next tick tries it again",
            failed.sha.short()
        )
    } else if let Some((failed, deadline)) = st
        .failed()
        .filter(|f| Some(&f.sha) == st.desired_sha())
        .and_then(|f| Some((f, f.next_attempt_at.filter(|d| *d > now)?)))
    {
        waiting = true;
        format!(
            "{} failed and waits: next attempt {} ({}); `monky-deployd run --once --force` \
             tries it now",
            failed.sha.short(),
            crate::clock::rfc3339(deadline),
            ago(now, Some(deadline))
        )
    } else {
        why_not.join("; ")
    };
    lines.push(("state", why));
    if let Some(err) = &st.last_error() {
        lines.push((
            "last error",
            format!(
                "{} ({})",
                err,
                ago(now, st.last_report().or(st.last_checkin()))
            ),
        ));
    }
    if let Some(note) = &st.last_note() {
        lines.push((
            "last note",
            format!("{note} ({})", ago(now, st.last_report())),
        ));
    }
    if !st.quoting_changed().is_empty() {
        lines.push((
            "env change",
            format!(
                "{}: the original agent's .env handed these to the app differently; \
                 the app now gets the exact value",
                st.quoting_changed().join(", ")
            ),
        ));
    }
    let code = st.last_code().filter(|_| st.last_error().is_some());
    if let Some(code) = code
        .or(clock)
        .or(hold.as_ref().map(|_| crate::code::Code::Held))
    {
        lines.push(("whose move", code.owner().to_string()));
    }
    if let Some(sha) = crate::evidence::latest(&layout).filter(|_| code.is_some()) {
        lines.push((
            "logs",
            format!(
                "`monky-deployd logs {}` ({})",
                shown(Some(&sha)),
                crate::evidence::log_path(&layout, &sha).display()
            ),
        ));
    }
    lines.push(("checkin", ago(now, st.last_checkin())));
    lines.push((
        "token",
        match (&st.token(), token_present) {
            (_, false) => match crate::verdict::token_absence(&st, grant_staged) {
                (true, said) => said,
                (false, said) => format!(
                    "{said}: re-run the install kit (or stage a bootstrap grant and run \
                     `monky-deployd bootstrap --force`)"
                ),
            },
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
    let max_ttl = crate::verdict::token_max_ttl(&st, now).filter(|_| token_present);
    if let Some(end) = &max_ttl {
        lines.push(("max TTL", end.to_string()));
    }
    let step = if hold.is_some() {
        crate::code::Code::Held.next_step().to_string()
    } else if interrupted.is_some() {
        crate::code::Code::ApplyInterrupted.next_step().to_string()
    } else if let Some(end) = max_ttl.filter(|_| converged) {
        format!(
            "lease a new token before {}: bring tenancy back, or re-run the install kit",
            crate::clock::rfc3339(end.end)
        )
    } else if converged {
        "nothing to do".to_string()
    } else if !token_present && grant_staged {
        "the next tick logs in with the staged bootstrap grant: wait for the timer, or run \
         `sudo -u monky-deployd monky-deployd run --once`"
            .to_string()
    } else if !token_present {
        "re-run the install kit (or stage a bootstrap grant and run `monky-deployd bootstrap \
         --force`)"
            .to_string()
    } else {
        // The code as stored, never read back out of the error's text.
        let step = st
            .last_code()
            .filter(|_| st.last_error().is_some())
            .or(clock)
            .map_or(
                "wait for the next tick, or run `monky-deployd run --once`",
                |c| c.next_step(),
            );
        if waiting {
            format!(
                "{step}; then `monky-deployd run --once --force` retries before the backoff ends"
            )
        } else {
            step.to_string()
        }
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
    fn a_span_reads_the_same_here_as_in_the_ticks_messages() {
        // 150 s off: the tick's TLS_CLOCK message says "3m"; explain said "2m".
        assert_eq!(ago(10_000, Some(10_000 - 150)), "3m ago");
        assert!(
            crate::clock::skew_problem(150)
                .unwrap()
                .contains("is 3m ahead")
        );
        assert_eq!(ago(10_000, Some(10_000 + 5399)), "in 90m");
        assert_eq!(ago(200_000, Some(200_000 - 129_599)), "36h ago");
        assert_eq!(ago(10, None), "never");
    }

    #[test]
    fn ages_read_in_the_largest_fitting_unit() {
        assert_eq!(human(59), "59s");
        assert_eq!(human(3600), "60m");
        assert_eq!(human(90_000), "25h");
    }
}
