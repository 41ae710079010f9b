//! `monky-deployd status [--json]`: what the box holds, from local state and the docker socket.
//! No tenancy or OpenBao request is made: the clock is judged by the last tick's reading of
//! OpenBao's, carried to now on the boot clock.

use monky_agent_proto::Sha;
use serde_json::json;

use crate::clock::rfc3339;
use crate::code::CodePolicy as _;
use crate::config::Config;
use crate::exit::Exit;
use crate::layout::Layout;
use crate::redact::redact;
use crate::state::TokenState;

/// Prints the status; exits 0 when it could be read.
pub(crate) fn show(cfg: &Config, as_json: bool) -> anyhow::Result<Exit> {
    let layout = Layout::peek(cfg);
    let st = crate::statefile::peek(&layout);
    let token_present = layout.has_token();
    let listed = monky_compose::Engine::from_env()
        .containers(&cfg.compose_project)
        .map(|cs| crate::drift::settled(cs, st.converged()))
        .map_err(|e| e.to_string());
    let marker = crate::interrupted::peek(&layout);
    let boot = crate::clock::boot();
    let now = crate::clock::wall();
    let seen = crate::verdict::Seen {
        now,
        token_present,
        containers: Some(&listed),
        boot: boot.as_ref(),
        state_free: monky_compose::engine::free_bytes(&cfg.state_dir).ok(),
    };
    let mut why_not = crate::verdict::not_converged(&st, seen);
    if let Some(m) = &marker {
        why_not.push(format!(
            "the apply of {} did not finish",
            m.sha.as_ref().map_or("-", Sha::short)
        ));
    }
    // A clock gone wrong since the last tick is the box admin's move too.
    let code = st
        .last_code()
        .filter(|_| st.last_error().is_some())
        .or_else(|| crate::verdict::clock_problem(&st, seen).map(|_| crate::code::Code::TlsClock));
    let failed_logs = crate::evidence::latest(&layout)
        .filter(|_| code.is_some() || st.failed().is_some())
        .map(|sha| {
            crate::evidence::log_path(&layout, &sha)
                .display()
                .to_string()
        });
    let containers = match listed {
        Ok(cs) => cs
            .into_iter()
            .map(|c| json!({"name": c.name, "state": c.state, "health": c.health}))
            .collect(),
        Err(_) => st
            .containers()
            .iter()
            .map(|c| json!({"name": c.name, "state": c.state, "health": c.health, "stale": true}))
            .collect::<Vec<_>>(),
    };
    let mut token = token_json(token_present, st.token());
    if !token_present {
        // Why there is none, until a token is stored again.
        token["lost"] = json!(st.token_lost().map(|l| json!({
            "cause": l.cause_name(),
            "seen_at": rfc3339(l.seen_at),
            "ended_at": l.ended_at.map(rfc3339),
            "detail": l.to_string(),
        })));
        token["grant_staged"] = json!(crate::verdict::grant_staged(&cfg.bootstrap_file));
    }
    let hold = crate::hold::peek(&layout, st.clock()).map(
        |h| json!({"reason": h.reason, "since": rfc3339(h.since), "until": h.until.map(rfc3339)}),
    );
    let interrupted = marker.map(
        |m| json!({"sha": m.sha, "previous": m.previous, "started_at": rfc3339(m.started_at)}),
    );
    let doc = json!({
        "env_id": cfg.env_id,
        "applied_sha": st.applied_sha(),
        "desired_sha": st.desired_sha(),
        "converged": why_not.is_empty(),
        "not_converged": why_not,
        "whose_move": code.map(|c| c.owner().as_str()),
        "next_step": code.map(crate::code::Code::next_step),
        "failed_logs": failed_logs,
        "token": token,
        "last_checkin": st.last_checkin().map(rfc3339),
        "last_report": st.last_report().map(rfc3339),
        "last_result": st.last_result(),
        "last_error": st.last_error(),
        "last_note": st.last_note(),
        "hold": hold,
        "interrupted_apply": interrupted,
        "next_heal_at": st.next_heal_at().map(rfc3339),
        "containers": containers,
        "transport": cfg.transport.as_str(),
    });
    if as_json {
        outblock!("{}", redact(&serde_json::to_string_pretty(&doc)?));
        return Ok(Exit::Ok);
    }
    let line = |k: &str, v: &serde_json::Value| {
        let v = match v {
            serde_json::Value::Null => "-".to_string(),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        outln!("{k:<14} {}", redact(&v));
    };
    for k in [
        "env_id",
        "applied_sha",
        "desired_sha",
        "converged",
        "last_checkin",
        "last_report",
        "last_result",
        "last_error",
        "last_note",
        "whose_move",
        "failed_logs",
    ] {
        line(k, &doc[k]);
    }
    if let Some(h) = doc["hold"].as_object() {
        outln!(
            "{:<14} {}",
            "held",
            redact(&format!(
                "since {}, until {}: {}",
                h["since"].as_str().unwrap_or("?"),
                h["until"].as_str().unwrap_or("`monky-deployd unhold`"),
                h["reason"].as_str().unwrap_or("no reason given")
            ))
        );
    }
    if let Some(m) = doc["interrupted_apply"].as_object() {
        outln!(
            "{:<14} {} started {} did not finish; the next tick finishes or rolls it back",
            "interrupted",
            m["sha"]
                .as_str()
                .and_then(|t| Sha::parse(t).ok())
                .as_ref()
                .map_or("-", Sha::short),
            m["started_at"].as_str().unwrap_or("?")
        );
    }
    for why in &why_not {
        outln!("{:<14} {}", "not converged", redact(why));
    }
    let t = &doc["token"];
    outln!(
        "{:<14} {}",
        "token",
        if t["present"] == true {
            format!(
                "present ({}, expires {})",
                t["source"].as_str().unwrap_or("unknown source"),
                t["expires_at"].as_str().unwrap_or("unknown")
            )
        } else {
            // Why there is none, or that a staged grant is the next tick's login.
            let (_, said) = crate::verdict::token_absence(
                &st,
                crate::verdict::grant_staged(&cfg.bootstrap_file),
            );
            match said.strip_prefix("none: ") {
                Some(why) => format!("absent: {why}"),
                None if said == "no token stored" => "absent".to_string(),
                None => format!("absent: {said}"),
            }
        }
    );
    if let Some(end) = crate::verdict::token_max_ttl(&st, now).filter(|_| token_present) {
        outln!("{:<14} {}", "token max TTL", redact(&end.to_string()));
    }
    outln!("containers:");
    for c in doc["containers"].as_array().into_iter().flatten() {
        outln!(
            "  {:<32} {:<10} {}",
            c["name"].as_str().unwrap_or("?"),
            c["state"].as_str().unwrap_or("?"),
            c["health"].as_str().unwrap_or("-")
        );
    }
    Ok(Exit::Ok)
}

fn token_json(present: bool, t: Option<&TokenState>) -> serde_json::Value {
    json!({
        "present": present,
        "source": t.map(|t| t.source),
        "obtained_at": t.map(|t| rfc3339(t.obtained_at)),
        "expires_at": t.map(|t| rfc3339(t.expires_at)),
        // When it ends for good, whatever renews it (see `verdict::token_max_ttl`).
        "max_ttl_end": t.map(|t| rfc3339(t.max_ttl_end().0)),
        "max_ttl_near": t.is_some_and(|t| t.max_ttl_near),
    })
}
