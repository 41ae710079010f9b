//! `.gitlab-ci.yml`: it parses, and its jobs run the commands the README and the release
//! procedure name, when they should.

use serde_json::Value;

use super::{check_command, read};

fn pipeline() -> Value {
    serde_saphyr::from_str(&read(".gitlab-ci.yml")).expect(".gitlab-ci.yml is YAML")
}

fn script(job: &Value) -> Vec<String> {
    job["script"]
        .as_array()
        .unwrap_or_else(|| panic!("a job without a script: {job}"))
        .iter()
        .map(|l| l.as_str().expect("a script line is a string").to_string())
        .collect()
}

/// The `if` of each of a job's rules, with its `when`.
fn rules(job: &Value) -> Vec<(String, String)> {
    job["rules"]
        .as_array()
        .map(|rules| {
            rules
                .iter()
                .map(|r| {
                    (
                        r["if"].as_str().unwrap_or_default().to_string(),
                        r["when"].as_str().unwrap_or("on_success").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_pipeline_tests_every_change_packages_and_releases_tags() {
    let p = pipeline();
    let stages: Vec<&str> = p["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(stages, ["test", "package", "release"]);
    let jobs: Vec<&String> = p
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| !matches!(k.as_str(), "workflow" | "stages" | "default" | "variables"))
        .collect();
    assert_eq!(jobs, ["package", "release", "release:gitea", "test"]);
    for job in &jobs {
        let j = &p[job.as_str()];
        let stage = j["stage"].as_str().unwrap();
        assert!(stages.contains(&stage), "{job}: stage {stage}");
        for line in script(j) {
            check_command(&line).unwrap_or_else(|why| panic!("{job}: `{line}`: {why}"));
        }
    }

    // test: the README's test command, on every branch and merge request (no rules of its own).
    assert!(read("README.md").contains("cargo xtask ci       # the whole test suite"));
    assert_eq!(script(&p["test"]), ["cargo xtask ci"]);
    assert!(p["test"]["rules"].is_null() && p["test"]["only"].is_null());
    let workflow = rules(&p["workflow"]);
    for wanted in [
        "$CI_PIPELINE_SOURCE == \"merge_request_event\"",
        "$CI_COMMIT_BRANCH",
        "$CI_COMMIT_TAG",
    ] {
        assert!(
            workflow
                .iter()
                .any(|(i, w)| i == wanted && w == "on_success"),
            "{workflow:?}"
        );
    }

    // package: dist's folder, kept for the release jobs.
    assert_eq!(script(&p["package"]), ["cargo xtask dist"]);
    assert_eq!(p["package"]["artifacts"]["paths"][0], "target/dist-pkg/");

    // release: on a v* tag, from package's artifacts, to GitLab.
    let release = &p["release"];
    assert_eq!(script(release), ["cargo xtask release --gitlab"]);
    assert_eq!(
        rules(release),
        [(
            "$CI_COMMIT_TAG =~ /^v/".to_string(),
            "on_success".to_string()
        )]
    );
    assert_eq!(release["dependencies"][0], "package");

    // release:gitea: automatic when GITEA_TOKEN is set, by hand otherwise (and then it does not
    // hold the pipeline's verdict).
    let gitea = &p["release:gitea"];
    assert_eq!(script(gitea), ["cargo xtask release --gitea"]);
    assert_eq!(
        rules(gitea),
        [
            (
                "$CI_COMMIT_TAG =~ /^v/ && $GITEA_TOKEN".to_string(),
                "on_success".to_string()
            ),
            ("$CI_COMMIT_TAG =~ /^v/".to_string(), "manual".to_string()),
        ]
    );
    assert_eq!(gitea["rules"][1]["allow_failure"], true);
    assert_eq!(gitea["dependencies"][0], "package");
}
