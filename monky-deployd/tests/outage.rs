//! The token through a long tenancy outage, against the fake OpenBao and the real one alike:
//! renewal follows OpenBao's TTL whatever tenancy answers (503, connection refused, 429), so a
//! token renewed within its max TTL never needs the kit; and a max TTL that draws near while
//! tenancy is away is said in the journal, `explain`, `doctor` and the metrics, in time.
//! Short TTL roles make the outages last seconds.

use std::time::{Duration, Instant};

use monky_agent_proto::ReportResult;
use monky_testkit::bao::{BaoPeer, RealBao};
use monky_testkit::tenancy::{Endpoint, Fault};
use serde_json::Value;

use crate::util::*;

/// How tenancy is away.
#[derive(Debug, Clone, Copy)]
enum Away {
    /// It answers 503.
    Unavailable,
    /// Nothing listens on its address.
    Refused,
    /// It answers 429 with `Retry-After`.
    RateLimited,
}

/// The role's TTL in the outage tests: the outage lasts three of it.
const TTL: Duration = Duration::from_secs(6);

fn fake(ttl: Duration, max: Duration) -> World {
    World::fake_bao_with(|b| b.token_ttl(ttl).token_max_ttl(max))
}

fn real(ttl: Duration, max: Duration) -> Option<World<RealBao>> {
    World::real_bao_with(None, |b| b.token_ttl(ttl).token_max_ttl(max))
}

/// Sends tenancy away as `away` says; returns what brings it back.
fn go_away<B: BaoPeer + 'static>(w: &World<B>, away: Away) {
    match away {
        Away::Unavailable => w.tenancy.set_fault(
            Endpoint::Checkin,
            Fault::Status {
                status: 503,
                body: r#"{"code":"UNAVAILABLE","detail":"maintenance"}"#.into(),
            },
        ),
        Away::RateLimited => w.tenancy.set_fault(Endpoint::Checkin, Fault::RetryAfter(1)),
        Away::Refused => {
            // A port that was free a moment ago: nothing listens there now.
            let dead = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            let text = std::fs::read_to_string(w.config_path()).unwrap();
            let base = format!("base_url: {}", w.tenancy.url());
            assert!(text.contains(&base), "{text}");
            let moved = text.replace(&base, &format!("base_url: http://{dead}/"));
            std::fs::write(w.config_path(), moved).unwrap();
        }
    }
}

fn come_back<B: BaoPeer + 'static>(w: &World<B>) {
    w.tenancy.clear_faults();
    // Rewrites the config with tenancy's own address.
    w.config_extra("");
}

fn token<B: BaoPeer + 'static>(w: &World<B>) -> Vec<u8> {
    std::fs::read(w.state_dir().join("bao.token")).unwrap()
}

/// Ticks about every `every` while tenancy is away, for `long`; each tick is temporary (75).
/// Returns the ticks' stderr.
fn ticks_while_away<B: BaoPeer + 'static>(
    w: &World<B>,
    long: Duration,
    every: Duration,
    until: impl Fn(&str) -> bool,
) -> Vec<String> {
    let started = Instant::now();
    let mut out = Vec::new();
    while started.elapsed() < long {
        let tick = Instant::now();
        let run = w.tick();
        run.expect(75);
        out.push(run.stderr());
        if until(&run.stderr()) {
            break;
        }
        std::thread::sleep(every.saturating_sub(tick.elapsed()));
    }
    out
}

/// An outage of three TTLs: the token is renewed at every tick, by OpenBao alone, and is the
/// same working bearer when tenancy comes back: no lease, no bootstrap, no kit.
fn the_token_outlives<B: BaoPeer + 'static>(w: &World<B>, away: Away) {
    let sha = w.applied();
    let before = token(w);
    let leases = w.tenancy.lease_count(ENV);
    go_away(w, away);
    let ticks = ticks_while_away(w, TTL * 3 + Duration::from_secs(1), TTL / 4, |_| false);
    assert!(ticks.len() >= 4, "{} ticks", ticks.len());
    come_back(w);
    let run = w.tick();
    run.ok();
    for stderr in &ticks {
        assert!(
            stderr.contains(&format!("token renewed (ttl {}s)", TTL.as_secs())),
            "{away:?}, {} OpenBao: every tick renews:\n{stderr}",
            w.bao.kind()
        );
    }
    let r = w.last_report();
    assert_report(&r, ReportResult::Applied, None);
    assert_eq!(r.sha.as_ref().map(|s| s.as_str()), Some(sha.as_str()));
    assert_eq!(token(w), before, "the same token, kept alive");
    assert_eq!(w.tenancy.lease_count(ENV), leases, "no lease was needed");
    assert!(!run.stderr().contains("AGENT_UNAUTHENTICATED"));
}

#[test]
fn fake_the_token_outlives_tenancy_answering_503() {
    the_token_outlives(&fake(TTL, Duration::from_secs(3600)), Away::Unavailable);
}

#[test]
fn fake_the_token_outlives_tenancy_refusing_connections() {
    the_token_outlives(&fake(TTL, Duration::from_secs(3600)), Away::Refused);
}

#[test]
fn fake_the_token_outlives_tenancy_rate_limiting() {
    the_token_outlives(&fake(TTL, Duration::from_secs(3600)), Away::RateLimited);
}

#[test]
fn real_the_token_outlives_tenancy_answering_503() {
    let Some(w) = real(TTL, Duration::from_secs(3600)) else {
        return;
    };
    the_token_outlives(&w, Away::Unavailable);
}

#[test]
fn real_the_token_outlives_tenancy_refusing_connections() {
    let Some(w) = real(TTL, Duration::from_secs(3600)) else {
        return;
    };
    the_token_outlives(&w, Away::Refused);
}

#[test]
fn real_the_token_outlives_tenancy_rate_limiting() {
    let Some(w) = real(TTL, Duration::from_secs(3600)) else {
        return;
    };
    the_token_outlives(&w, Away::RateLimited);
}

/// The metrics textfile's sample of `name` (without the prefix).
fn sample(prom: &str, name: &str) -> f64 {
    let head = format!("monky_deployd_{name}{{env_id=\"{ENV}\"}} ");
    prom.lines()
        .find_map(|l| l.strip_prefix(&head))
        .unwrap_or_else(|| panic!("no {name}:\n{prom}"))
        .parse()
        .unwrap()
}

/// A role of a 20 s TTL under a 40 s max TTL and tenancy away: once OpenBao caps a renewal,
/// every view says when the token ends for good and what to do, at error priority in the
/// journal; when tenancy is back the next tick leases a new token and the warning is gone.
fn the_max_ttl_is_said_in_time<B: BaoPeer + 'static>(w: &World<B>) {
    let prom_path = w.path("metrics/agent.prom");
    std::fs::create_dir_all(prom_path.parent().unwrap()).unwrap();
    w.config_extra(&format!("metrics_textfile: {}\n", prom_path.display()));
    let minted = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    w.applied();
    let prom = std::fs::read_to_string(&prom_path).unwrap();
    assert_eq!(sample(&prom, "token_max_ttl_near"), 0.0, "{prom}");
    assert!(!w.run(&["explain"]).stdout().contains("max TTL"));

    go_away(w, Away::Unavailable);
    let said = "reaches its max TTL at";
    let ticks = ticks_while_away(w, Duration::from_secs(40), Duration::from_secs(2), |e| {
        e.contains(said)
    });
    let last = ticks.last().unwrap();
    let line = last
        .lines()
        .find(|l| l.contains(said))
        .unwrap_or_else(|| panic!("{} OpenBao: never said:\n{}", w.bao.kind(), ticks.join("")));
    assert!(line.starts_with("ERROR"), "error priority: {line}");
    assert!(
        line.contains("OpenBao capped its renewal there")
            && line.contains("re-run the install kit"),
        "{line}"
    );
    let end = w.state()["token"]["max_expires_at"].as_u64().unwrap();
    assert!(
        (minted + 35..=minted + 50).contains(&end),
        "the max TTL's end {end}, minted {minted}"
    );

    w.run(&["status"]).ok().prints(&["token max TTL", said]);
    let status: Value = serde_json::from_str(&w.run(&["status", "--json"]).stdout()).unwrap();
    assert_eq!(status["token"]["max_ttl_near"], true, "{status:#}");
    let explain = w.run(&["explain"]);
    explain.ok();
    explain.prints(&["max TTL", said, "OpenBao capped its renewal there"]);
    let doctor: Value = serde_json::from_str(&w.run(&["doctor", "--json"]).stdout()).unwrap();
    let check = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "token max TTL")
        .unwrap_or_else(|| panic!("{doctor:#}"));
    assert_eq!(check["verdict"], "fail", "{check:#}");
    assert!(
        check["detail"].as_str().unwrap().contains(said),
        "{check:#}"
    );
    assert_eq!(doctor["ok"], false);
    let prom = std::fs::read_to_string(&prom_path).unwrap();
    assert_eq!(sample(&prom, "token_max_ttl_near"), 1.0, "{prom}");
    assert_eq!(
        sample(&prom, "token_max_ttl_expiry_timestamp_seconds"),
        end as f64,
        "{prom}"
    );

    // Tenancy is back before the end: a new token, and every view is quiet again.
    come_back(w);
    let leases = w.tenancy.lease_count(ENV);
    let run = w.tick();
    run.ok();
    run.says(&["token is close to its max TTL; re-leasing"]);
    assert!(!run.stderr().contains(said), "{}", run.stderr());
    assert_eq!(w.tenancy.lease_count(ENV), leases + 1);
    let prom = std::fs::read_to_string(&prom_path).unwrap();
    assert_eq!(sample(&prom, "token_max_ttl_near"), 0.0, "{prom}");
    assert!(sample(&prom, "token_max_ttl_expiry_timestamp_seconds") > end as f64);
    assert!(!w.run(&["explain"]).stdout().contains("max TTL"));
    assert!(!w.run(&["status"]).stdout().contains("max TTL"));
}

#[test]
fn fake_the_max_ttl_is_said_in_time() {
    the_max_ttl_is_said_in_time(&fake(Duration::from_secs(20), Duration::from_secs(40)));
}

#[test]
fn real_the_max_ttl_is_said_in_time() {
    let Some(w) = real(Duration::from_secs(20), Duration::from_secs(40)) else {
        return;
    };
    the_max_ttl_is_said_in_time(&w);
}

/// OPERATIONS.md's alert for a token near its max TTL, as written there, run by `promtool test
/// rules` on the metrics the agent writes: it fires for a box whose token is near its end with
/// less than a day left, not before, and not for a box whose end is further out.
#[test]
fn the_documented_max_ttl_alert_fires_as_promtool_evaluates_it() {
    const DOC: &str = include_str!("../../docs/OPERATIONS.md");
    let after = DOC
        .split("Alert on a token near its max TTL with, for instance:\n")
        .nth(1)
        .expect("OPERATIONS.md gives the alert");
    let expr = after
        .strip_prefix("\n```\n")
        .and_then(|b| b.split("```").next())
        .expect("a fenced block after it")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(expr.contains("monky_deployd_token_max_ttl_near"), "{expr}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yml"),
        format!(
            "groups:\n- name: monky-deployd\n  rules:\n  - alert: TokenNearMaxTtl\n    expr: '{}'\n",
            expr.replace('\'', "''")
        ),
    )
    .unwrap();
    // time() starts at 0: an end at 50 000 s is less than a day away, one at 200 000 s is not.
    let near = "monky_deployd_token_max_ttl_near";
    let end = "monky_deployd_token_max_ttl_expiry_timestamp_seconds";
    let tests = format!(
        r#"rule_files: [rules.yml]
evaluation_interval: 1m
tests:
- interval: 1m
  input_series:
  - series: '{near}{{env_id="stranding"}}'
    values: '0 0 1 1'
  - series: '{end}{{env_id="stranding"}}'
    values: '50000 50000 50000 50000'
  - series: '{near}{{env_id="in-time"}}'
    values: '1 1 1 1'
  - series: '{end}{{env_id="in-time"}}'
    values: '200000 200000 200000 200000'
  alert_rule_test:
  - eval_time: 1m
    alertname: TokenNearMaxTtl
    exp_alerts: []
  - eval_time: 3m
    alertname: TokenNearMaxTtl
    exp_alerts:
    - exp_labels: {{env_id: stranding}}
"#
    );
    std::fs::write(dir.path().join("tests.yml"), tests).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["test", "rules", "tests.yml"])
        .current_dir(dir.path())
        .output()
        .expect("promtool is needed (Debian package promtool; `cargo xtask setup` installs it)");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// OPERATIONS.md's alerting recipe, as written there, run by `promtool test rules` against
/// series in the shape the agent writes: each alert fires for the box in its situation and for
/// no other.
#[test]
fn the_documented_alerting_recipe_fires_as_promtool_evaluates_it() {
    const DOC: &str = include_str!("../../docs/OPERATIONS.md");
    let rules = DOC
        .split("### Alerting recipe\n")
        .nth(1)
        .and_then(|after| after.split("```yaml\n").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("OPERATIONS.md gives the recipe in a yaml block");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yml"), rules).unwrap();
    // time() starts at 0; one sample a minute.
    let tests = r#"rule_files: [rules.yml]
evaluation_interval: 1m
tests:
- interval: 1m
  input_series:
  - series: 'monky_deployd_converged{env_id="fine"}'
    values: '1x20'
  - series: 'monky_deployd_converged{env_id="stuck"}'
    values: '0x20'
  - series: 'monky_deployd_converged{env_id="blip"}'
    values: '0 0 0 1x17'
  - series: 'monky_deployd_crash_loop{env_id="looping"}'
    values: '0 0 1x18'
  - series: 'monky_deployd_crash_loop{env_id="fine"}'
    values: '0x20'
  - series: 'monky_deployd_failure_streak{env_id="hang",code="TICK_TIMEOUT"}'
    values: '0 0 1 2 3x16'
  - series: 'monky_deployd_failure_streak{env_id="once",code="TICK_TIMEOUT"}'
    values: '0 0 1x18'
  - series: 'monky_deployd_converged{env_id="held"}'
    values: '0x20'
  - series: 'monky_deployd_held{env_id="held"}'
    values: '1x20'
  - series: 'monky_deployd_token_lost{env_id="lost",cause="revoked"}'
    values: '0 0 1x18'
  - series: 'monky_deployd_token_lost{env_id="fine",cause="revoked"}'
    values: '0x20'
  - series: 'monky_deployd_last_tick_timestamp_seconds{env_id="fine"}'
    values: '0+60x20'
  - series: 'monky_deployd_last_tick_timestamp_seconds{env_id="stopped"}'
    values: '0x20'
  - series: 'monky_deployd_token_max_ttl_near{env_id="stranding"}'
    values: '1x20'
  - series: 'monky_deployd_token_max_ttl_expiry_timestamp_seconds{env_id="stranding"}'
    values: '50000x20'
  - series: 'monky_deployd_token_max_ttl_near{env_id="fine"}'
    values: '0x20'
  - series: 'monky_deployd_token_max_ttl_expiry_timestamp_seconds{env_id="fine"}'
    values: '50000x20'
  alert_rule_test:
  - eval_time: 15m
    alertname: MonkyNotConverged
    exp_alerts:
    - exp_labels: {env_id: stuck}
  - eval_time: 15m
    alertname: MonkyCrashLoop
    exp_alerts:
    - exp_labels: {env_id: looping}
  - eval_time: 15m
    alertname: MonkyTicksTimingOut
    exp_alerts:
    - exp_labels: {env_id: hang, code: TICK_TIMEOUT}
  - eval_time: 15m
    alertname: MonkyTicksStopped
    exp_alerts:
    - exp_labels: {env_id: stopped}
  - eval_time: 15m
    alertname: MonkyTokenLost
    exp_alerts:
    - exp_labels: {env_id: lost, cause: revoked}
  - eval_time: 15m
    alertname: MonkyTokenNearMaxTtl
    exp_alerts:
    - exp_labels: {env_id: stranding}
"#;
    std::fs::write(dir.path().join("tests.yml"), tests).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["test", "rules", "tests.yml"])
        .current_dir(dir.path())
        .output()
        .expect("promtool is needed (Debian package promtool; `cargo xtask setup` installs it)");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
