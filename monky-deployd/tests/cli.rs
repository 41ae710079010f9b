//! The command line: version, status, config errors and exit codes.

use crate::util::*;

#[test]
fn version_needs_no_config() {
    let w = World::new();
    let run = w.run(&["version"]);
    run.ok();
    assert!(
        run.stdout().starts_with("monky-deployd "),
        "{}",
        run.stdout()
    );
}

#[test]
fn status_json_has_the_documented_keys() {
    let w = World::new();
    let sha = w.applied();
    let run = w.run(&["status", "--json"]);
    run.ok();
    let doc: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
    for key in [
        "env_id",
        "applied_sha",
        "desired_sha",
        "token",
        "last_result",
        "last_error",
        "last_checkin",
        "containers",
    ] {
        assert!(doc.get(key).is_some(), "missing {key}: {doc}");
    }
    assert_eq!(doc["applied_sha"], serde_json::json!(sha));
    assert_eq!(doc["token"]["present"], true);
    assert_eq!(doc["token"]["source"], "lease");
    assert_eq!(doc["containers"][0]["health"], "healthy");
    w.run(&["status"]).ok().prints(&["present (lease"]);
}

#[test]
fn an_unusable_config_exits_78_naming_the_key() {
    let w = World::new();
    let text = std::fs::read_to_string(w.config_path()).unwrap() + "tenancy_port: 8081\n";
    std::fs::write(w.config_path(), text).unwrap();
    let run = w.tick();
    run.expect(78);
    run.says(&["tenancy_port"]);
    let run = Run(
        std::process::Command::new(env!("CARGO_BIN_EXE_monky-deployd"))
            .args(["--config", "/nonexistent/config.yaml", "run", "--once"])
            .output()
            .unwrap(),
    );
    run.expect(78);
    run.says(&["/nonexistent/config.yaml"]);
}

#[test]
fn the_config_comes_from_the_environment_too() {
    let w = World::new();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_monky-deployd"))
        .args(["status", "--json"])
        .env("MONKY_DEPLOYD_CONFIG", w.config_path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// The README's command list names every command the binary has (`--help`'s list).
#[test]
fn the_readme_lists_every_command() {
    const README: &str = include_str!("../../README.md");
    let w = World::new();
    let help = w.run(&["--help"]);
    help.ok();
    let out = help.stdout();
    let commands: Vec<&str> = out
        .split("Commands:\n")
        .nth(1)
        .expect("--help lists the commands")
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.contains(&"logs"), "{commands:?}");
    for c in commands {
        assert!(
            README.contains(&format!("\nmonky-deployd {c}")),
            "README's command list lacks `{c}`"
        );
    }
}
