//! OPERATIONS.md's alerting recipe, as written there, run by `promtool test rules` over the
//! textfiles the agent wrote in end-to-end scenarios (a hold, a lost token, timed-out ticks, a
//! crash loop; heal.rs brings its own): each tick's file is held for the minutes until the
//! next tick, as node_exporter serves the last file written, and exactly the alerts a person
//! should get fire.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::util::*;

const DOC: &str = include_str!("../../docs/OPERATIONS.md");

/// The recipe's yaml block.
fn rules() -> &'static str {
    DOC.split("### Alerting recipe\n")
        .nth(1)
        .and_then(|after| after.split("```yaml\n").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("OPERATIONS.md gives the recipe in a yaml block")
}

/// The textfiles of one box, tick after tick, each with the minutes it was served.
#[derive(Default)]
pub(crate) struct Timeline {
    ticks: Vec<(String, u32)>,
}

impl Timeline {
    /// The file the last tick wrote at `path`, served for `minutes`.
    pub(crate) fn served(mut self, path: &Path, minutes: u32) -> Self {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("no textfile at {}: {e}", path.display()));
        self.ticks.push((text, minutes));
        self
    }

    /// Asserts that at the end of the timeline exactly `firing` fire: each an alert's name
    /// and its labels beyond `env_id` (`code: TICK_TIMEOUT`), as promtool evaluates the rules.
    #[track_caller]
    pub(crate) fn fires(&self, firing: &[(&str, &str)]) {
        let total: u32 = self.ticks.iter().map(|(_, m)| m).sum();
        // Every series any tick wrote, with its value minute by minute (`_`: not written then).
        let mut series: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut at = 0usize;
        for (text, minutes) in &self.ticks {
            for line in text
                .lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
            {
                let (name, value) = line.rsplit_once(' ').expect("a sample line");
                let values = series
                    .entry(name.to_string())
                    .or_insert_with(|| vec!["_".to_string(); total as usize]);
                for v in &mut values[at..at + *minutes as usize] {
                    *v = value.to_string();
                }
            }
            at += *minutes as usize;
        }
        let mut tests = String::from(
            "rule_files: [rules.yml]\nevaluation_interval: 1m\ntests:\n- interval: 1m\n  input_series:\n",
        );
        for (name, values) in &series {
            tests.push_str(&format!(
                "  - series: '{}'\n    values: '{}'\n",
                name.replace('\'', "''"),
                values.join(" ")
            ));
        }
        tests.push_str("  alert_rule_test:\n");
        let names: Vec<&str> = rules()
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- alert: "))
            .collect();
        for (alert, _) in firing {
            assert!(names.contains(alert), "the recipe has no {alert}");
        }
        for name in names {
            tests.push_str(&format!(
                "  - eval_time: {}m\n    alertname: {name}\n    exp_alerts:",
                total.saturating_sub(1)
            ));
            let expected: Vec<&str> = firing
                .iter()
                .filter(|(a, _)| *a == name)
                .map(|(_, labels)| *labels)
                .collect();
            if expected.is_empty() {
                tests.push_str(" []\n");
            } else {
                tests.push('\n');
                for labels in expected {
                    let sep = if labels.is_empty() { "" } else { ", " };
                    tests.push_str(&format!(
                        "    - exp_labels: {{env_id: {ENV}{sep}{labels}}}\n"
                    ));
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yml"), rules()).unwrap();
        std::fs::write(dir.path().join("tests.yml"), &tests).unwrap();
        let out = std::process::Command::new("promtool")
            .args(["test", "rules", "tests.yml"])
            .current_dir(dir.path())
            .output()
            .expect(
                "promtool is needed (Debian package promtool; `cargo xtask setup` installs it)",
            );
        assert!(
            out.status.success(),
            "promtool: {}{}\n{tests}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A box that writes its textfile.
fn box_with_metrics() -> (World, std::path::PathBuf) {
    let w = World::new();
    let prom = w.path("metrics.prom");
    w.config_extra(&format!("metrics_textfile: {}\n", prom.display()));
    (w, prom)
}

/// An operator's hold over a box tenancy wants to move: held for half an hour, the box is not
/// converged and pages nobody.
#[test]
fn a_planned_hold_pages_nobody() {
    let (w, prom) = box_with_metrics();
    w.applied();
    w.run(&["hold", "--reason", "planned maintenance"]).ok();
    w.publish(&TestBundle::tagged("2"));
    let mut timeline = Timeline::default();
    for _ in 0..3 {
        w.tick().ok();
        timeline = timeline.served(&prom, 10);
    }
    let text = std::fs::read_to_string(&prom).unwrap();
    assert!(
        text.contains(&format!("monky_deployd_converged{{env_id=\"{ENV}\"}} 0")),
        "{text}"
    );
    assert!(
        text.contains(&format!("monky_deployd_held{{env_id=\"{ENV}\"}} 1")),
        "{text}"
    );
    timeline.fires(&[]);
}

/// A token revoked at OpenBao and superseded at tenancy: the loss pages at once, with its
/// cause, and the box is not converged.
#[test]
fn a_lost_token_pages_with_its_cause() {
    let (w, prom) = box_with_metrics();
    w.applied();
    let timeline = Timeline::default().served(&prom, 1);
    w.tenancy.supersede(ENV);
    assert!(w.bao.revoke_tokens_for_env(ENV) >= 1);
    let mut timeline = timeline;
    for _ in 0..3 {
        w.tick().expect(1);
        timeline = timeline.served(&prom, 5);
    }
    timeline.fires(&[
        ("MonkyNotConverged", ""),
        ("MonkyTokenLost", "cause: revoked"),
    ]);
}

/// Ticks that hang until their deadline, at the default `tick_timeout_s` (1500 s): each such
/// tick's file is served for the 26 minutes to the next one. The second in a row pages.
#[test]
fn ticks_timing_out_at_the_default_deadline_page() {
    let (w, prom) = box_with_metrics();
    w.applied();
    let mut timeline = Timeline::default().served(&prom, 1);
    // The deadline is shortened for the test; the time between ticks is the default's.
    w.config_extra("tick_timeout_s: 6\n");
    w.stub("PULL_HANG", "300");
    w.publish(&TestBundle::tagged("2"));
    let default_gap = 1500 / 60 + 1;
    let first = w.tick();
    first.expect(75);
    // One timeout is a blip, not yet a page.
    Timeline::default()
        .served(&prom, 1)
        .served(&prom, default_gap)
        .fires(&[("MonkyNotConverged", "")]);
    timeline = timeline.served(&prom, default_gap);
    w.tenancy.advance_clock(Duration::from_secs(60));
    w.tick().expect(75);
    timeline = timeline.served(&prom, default_gap);
    timeline.fires(&[
        ("MonkyNotConverged", ""),
        ("MonkyTicksTimingOut", "code: TICK_TIMEOUT"),
    ]);
}
