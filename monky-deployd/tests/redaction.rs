//! Known secret values never reach stderr, stdout, reports, state.json or any file but the
//! ones meant to hold them (.env, bao.token, the docker config).

use crate::util::*;

fn check_clean(w: &World, outputs: &[String]) {
    let token = std::fs::read_to_string(w.state_dir().join("bao.token")).unwrap_or_default();
    let mut secrets = vec![
        GEMINI.to_string(),
        PGPASS.to_string(),
        REGISTRY_PASS.to_string(),
    ];
    if !token.is_empty() {
        secrets.push(token.trim().to_string());
    }
    let mut texts: Vec<(String, String)> = outputs
        .iter()
        .map(|o| ("output".to_string(), o.clone()))
        .collect();
    for r in w.reports() {
        texts.push(("report".into(), serde_json::to_string(&r).unwrap()));
    }
    for r in w.requests() {
        texts.push(("request".into(), format!("{r:?}")));
    }
    for e in walk(&w.state_dir()) {
        let name = e.file_name().unwrap().to_string_lossy().to_string();
        if [".env", "bao.token", "config.json"].contains(&name.as_str()) {
            continue;
        }
        texts.push((
            e.display().to_string(),
            String::from_utf8_lossy(&std::fs::read(&e).unwrap()).into_owned(),
        ));
    }
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
    let mut outputs = Vec::new();
    let run = w.tick();
    run.expect(1);
    outputs.extend([run.stderr(), run.stdout()]);
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
        let run = w.run(args);
        outputs.extend([run.stderr(), run.stdout()]);
    }
    // A pull failure whose text quotes the credential.
    w.stub(
        "PULL_FAIL",
        &format!("unauthorized: robot:{REGISTRY_PASS} rejected"),
    );
    w.publish(&TestBundle::tagged("3").with_registry_auth());
    let run = w.tick();
    run.expect(1);
    outputs.extend([run.stderr(), run.stdout()]);
    check_clean(&w, &outputs);

    // The docker children saw no secret in argv or environment.
    let log = w.docker_log();
    for s in [GEMINI, PGPASS, REGISTRY_PASS] {
        assert!(!log.contains(s), "a secret reached a docker child:\n{log}");
    }
}
