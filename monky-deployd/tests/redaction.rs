//! Known secret values never reach stderr, stdout, reports, state.json or any file but the
//! ones meant to hold them (.env, bao.token, the docker config).

use crate::util::*;

fn check_clean(w: &World, runs: &[Run]) {
    let token = std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap_or_default();
    let mut secrets = vec![
        GEMINI.to_string(),
        PGPASS.to_string(),
        REGISTRY_PASS.to_string(),
    ];
    if !token.is_empty() {
        secrets.push(token.trim().to_string());
    }
    let texts = ways_out(w, runs);
    for (where_, text) in &texts {
        for s in &secrets {
            if let Some(at) = text.find(s.as_str()) {
                let from = text[..at].rfind('\n').map_or(0, |n| n + 1);
                let to = text[at..].find('\n').map_or(text.len(), |n| at + n);
                panic!("a secret leaked into {where_}: {}", &text[from..to]);
            }
        }
        assert!(!text.contains("eyJ"), "a JWT leaked into {where_}:\n{text}");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        } else if p.is_file() {
            out.push(p);
        }
    }
    out
}

#[test]
fn full_ticks_leak_no_secret_anywhere() {
    let w = World::new();
    w.config_extra("log_level: DEBUG\n");
    w.stage_grant();
    // The container prints its environment into the compose logs, and turns unhealthy.
    let logs = w.path("logs.txt");
    std::fs::write(
        &logs,
        format!("web-1 | GEMINI_API_KEY={GEMINI}\nweb-1 | POSTGRES_PASSWORD={PGPASS}\n"),
    )
    .unwrap();
    w.stub("LOGS_FILE", logs.to_str().unwrap());
    w.stub("HEALTH", "unhealthy");
    w.publish(&TestBundle::default().with_registry_auth());
    let mut runs = Vec::new();
    let run = w.tick();
    run.expect(1);
    runs.push(run);
    assert!(
        w.last_report().log_tail.contains("GEMINI_API_KEY=***"),
        "{}",
        w.last_report().log_tail
    );

    w.clear_stub();
    w.publish(&TestBundle::tagged("2").with_registry_auth());
    for args in [
        &["run", "--once"][..],
        &["run", "--once"],
        &["status"],
        &["status", "--json"],
    ] {
        runs.push(w.run(args));
    }
    // A pull failure whose text quotes the credential.
    w.stub(
        "PULL_FAIL",
        &format!("unauthorized: robot:{REGISTRY_PASS} rejected"),
    );
    w.publish(&TestBundle::tagged("3").with_registry_auth());
    let run = w.tick();
    run.expect(1);
    runs.push(run);
    check_clean(&w, &runs);

    // The docker children saw no secret in argv or environment.
    let log = w.docker_log();
    for s in [GEMINI, PGPASS, REGISTRY_PASS] {
        assert!(!log.contains(s), "a secret reached a docker child:\n{log}");
    }
}

/// The default bundle, reading the latest version of every secret (it pins GEMINI_API_KEY to
/// version 1), so a test can put its own values.
fn latest_secrets() -> TestBundle {
    let mut b = TestBundle::default();
    b.manifest["entries"][0]["version"] = serde_json::Value::Null;
    b
}

/// Every way out of the agent after these runs: stderr and stdout of each run, the reports and
/// requests tenancy saw, and every file of the state dir but the ones meant to hold secrets.
fn ways_out(w: &World, runs: &[Run]) -> Vec<(String, String)> {
    let mut texts: Vec<(String, String)> = Vec::new();
    for r in runs {
        texts.push(("stderr".into(), r.stderr()));
        texts.push(("stdout".into(), r.stdout()));
    }
    for r in w.reports() {
        texts.push(("report".into(), serde_json::to_string(&r).unwrap()));
    }
    for r in w.requests() {
        texts.push(("request".into(), format!("{r:?}")));
    }
    for e in walk(&w.state_dir()) {
        let name = e.file_name().unwrap().to_string_lossy().to_string();
        if [".env", "bao.token", "config.json", "credential.json"].contains(&name.as_str()) {
            continue;
        }
        texts.push((
            e.display().to_string(),
            String::from_utf8_lossy(&std::fs::read(&e).unwrap()).into_owned(),
        ));
    }
    texts
}

#[test]
fn a_value_in_gos_quoting_is_masked_in_every_way_out() {
    let w = World::new();
    // Non-ASCII, an ideographic space Go escapes even in %q, and a tab.
    let value = "pässwort\u{3000}Geheim\t0004";
    w.bao.put_secret(ENV, "gemini_api_key", value);
    w.stage_grant();
    // docker compose quoting the value it could not use: Go's %q, %+q and byte-wise.
    let spellings = [
        r"pässwort\u3000Geheim\t0004",
        r"p\u00e4sswort\u3000Geheim\t0004",
        r"p\xc3\xa4sswort\xe3\x80\x80Geheim\t0004",
    ];
    let up_fail: String = spellings
        .iter()
        .map(|s| format!("invalid value \"{s}\" for GEMINI_API_KEY\n"))
        .collect();
    w.stub("UP_FAIL", &up_fail);
    w.publish(&latest_secrets());
    let tick = w.tick();
    tick.expect(1);
    let status = w.run(&["status"]);
    let status_json = w.run(&["status", "--json"]);
    let explain = w.run(&["explain"]);
    let report = w.last_report();
    assert!(
        report
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("invalid value \"***\""),
        "the failure is reported, masked: {report:?}"
    );
    for (where_, text) in ways_out(&w, &[tick, status, status_json, explain]) {
        for s in spellings.iter().copied().chain([value, "sswort"]) {
            assert!(!text.contains(s), "{s:?} leaked into {where_}:\n{text}");
        }
    }
}

#[test]
fn a_secret_that_is_a_common_word_does_not_wreck_the_log() {
    let w = World::new();
    w.bao.put_secret(ENV, "gemini_api_key", "compose");
    w.stage_grant();
    w.publish(&latest_secrets());
    let tick = w.tick();
    tick.ok();
    // The agent's own words stay readable...
    let tail = w.last_report().log_tail;
    assert!(tail.contains("compose pull"), "{tail}");
    assert!(tail.contains("compose up -d"), "{tail}");
    // ...while the value, where it stands as one, is masked.
    w.stub(
        "UP_FAIL",
        "service web: GEMINI_API_KEY=compose is not a key",
    );
    let mut second = latest_secrets();
    second.compose = second.compose.replace("web:1", "web:2");
    w.publish(&second);
    let run = w.tick();
    run.expect(1);
    run.says(&["GEMINI_API_KEY=***"]);
    assert!(!run.stderr().contains("=compose"), "{}", run.stderr());
}

#[test]
fn doctor_names_a_secret_too_short_to_be_masked_everywhere() {
    let w = World::new();
    w.bao.put_secret(ENV, "gemini_api_key", "abc");
    w.bao.put_secret(ENV, "pg_password", "hunter22");
    w.stage_grant();
    w.publish(&latest_secrets());
    w.tick().ok();
    let run = w.run(&["doctor", "--json"]);
    let out: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
    let check = out["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "secrets")
        .cloned()
        .expect("a secrets check");
    assert_eq!(check["verdict"], "warn", "{check}");
    let detail = check["detail"].as_str().unwrap();
    assert!(
        detail.contains("GEMINI_API_KEY is shorter than 4 bytes"),
        "{detail}"
    );
    assert!(
        detail.contains("POSTGRES_PASSWORD is shorter than 12"),
        "{detail}"
    );
    // Names, never values.
    let text = format!("{}{}", run.stdout(), run.stderr());
    assert!(!text.contains("hunter22"), "{text}");
    assert!(
        !text.contains(": abc") && !text.contains("\"abc\""),
        "{text}"
    );
    // A warning is not a failure of the box.
    let plain = w.run(&["doctor"]);
    plain.prints(&["warn secrets"]);
}

/// Tenancy's error text with a carriage return, a line break and terminal escapes cannot forge
/// a journal line or move the operator's cursor: the journal, `status` and `explain` show it
/// escaped, on the line of the event it belongs to.
#[test]
fn a_peers_control_characters_are_escaped_in_the_journal_and_every_view() {
    use monky_testkit::tenancy::{Endpoint, Fault};
    let w = World::new();
    w.applied();
    let forged = "down\r INFO tick: action=apply sha=abcdefabcdef outcome=applied code=- \
                  duration=1.0s exit=0\n INFO applied abcdefabcdef healthy\u{1b}[2K\u{9b}1A";
    w.tenancy.set_fault(
        Endpoint::Checkin,
        Fault::Status {
            status: 503,
            body: serde_json::json!({"code": "UNAVAILABLE", "detail": forged}).to_string(),
        },
    );
    let run = w.tick();
    run.expect(75);
    let mut outputs = vec![("journal", run.stderr())];
    outputs.push(("status", w.run(&["status"]).stdout()));
    outputs.push(("explain", w.run(&["explain"]).stdout()));
    for (what, text) in outputs {
        for c in ['\r', '\u{1b}', '\u{9b}'] {
            assert!(!text.contains(c), "{what} holds {c:?}: {text:?}");
        }
        for line in text.lines() {
            assert!(
                !line.starts_with(" INFO applied") && !line.starts_with(" INFO tick:"),
                "{what} has a forged line {line:?} in {text}"
            );
        }
    }
    assert!(
        run.stderr().contains("down\\r INFO tick:"),
        "{}",
        run.stderr()
    );
}

/// U+202E (right-to-left override) and the other bidi and invisible formatting characters
/// from a peer (tenancy's answer, a compose error, a container's log line) are escaped in the
/// journal, `status` and `explain`, as every control character is: they would reorder what
/// the operator reads.
#[test]
fn a_peers_bidi_controls_are_escaped_in_the_journal_status_and_explain() {
    use monky_testkit::tenancy::{Endpoint, Fault};
    type Setup = fn(&World) -> i32;
    let cases: [(&str, Setup); 3] = [
        ("tenancy's answer", |w| {
            w.tenancy.set_fault(
                Endpoint::Checkin,
                Fault::Status {
                    status: 503,
                    body: serde_json::json!({"code": "UNAVAILABLE",
                        "detail": "down\u{202e}\u{2066}gnp.exe"})
                    .to_string(),
                },
            );
            75
        }),
        ("a compose error", |w| {
            w.stub(
                "PULL_FAIL",
                "Error response from daemon: \u{202e}\u{2066}gnp.exe",
            );
            w.publish(&TestBundle::tagged("2"));
            1
        }),
        ("a container's log line", |w| {
            let logs = w.path("logs.txt");
            std::fs::write(&logs, "web-1  | refused \u{202e}\u{2066}gnp.exe\n").unwrap();
            w.stub("LOGS_FILE", logs.to_str().unwrap());
            w.stub("HEALTH", "unhealthy");
            w.publish(&TestBundle::tagged("2"));
            1
        }),
    ];
    for (peer, setup) in cases {
        let w = World::new();
        w.applied();
        let code = setup(&w);
        let run = w.tick();
        run.expect(code);
        let outputs = [
            ("journal", run.stderr()),
            ("status", w.run(&["status"]).stdout()),
            ("explain", w.run(&["explain"]).stdout()),
        ];
        for (what, text) in &outputs {
            for c in ['\u{202e}', '\u{2066}'] {
                assert!(!text.contains(c), "{peer}: {what} holds {c:?}: {text:?}");
            }
        }
        assert!(
            outputs
                .iter()
                .any(|(_, text)| text.contains("\\u{202e}\\u{2066}gnp.exe")),
            "{peer}: escaped, not dropped: {outputs:?}"
        );
        assert!(
            outputs[0].1.contains("\\u{202e}"),
            "{peer}: the journal says it: {}",
            outputs[0].1
        );
    }
}
