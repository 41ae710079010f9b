//! Only images this env may pull run (stub docker): every apply pulls each image from its
//! registry whatever the bundle's `pull_policy`, and records the IDs it got; a heal, a fallback
//! or a finished interrupted apply starts only images in that record, pulling the others first.

use monky_agent_proto::ReportResult;
use monky_compose::testkit::default_image_id;

use crate::apply::compose_sub;
use crate::util::*;

/// The image of the stub's model of every bundle (its `compose config`).
const IMAGE: &str = "x";

/// The env's record of the images it pulled itself.
fn record(w: &World) -> Vec<String> {
    std::fs::read_to_string(w.env_dir().join("pulled-images"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The compose subcommands of the calls from `from` on.
fn subs_since(w: &World, from: usize) -> Vec<String> {
    w.docker_calls()[from..]
        .iter()
        .filter_map(|c| compose_sub(c).map(str::to_owned))
        .collect()
}

#[test]
fn an_apply_pulls_every_image_from_its_registry_whatever_the_bundles_pull_policy() {
    for policy in ["never", "missing", "if_not_present", "always"] {
        let w = World::new();
        w.stage_grant();
        w.publish(&TestBundle {
            compose: format!(
                "services:\n  web:\n    image: {IMAGE}\n    pull_policy: {policy}\n    env_file: .env\n"
            ),
            ..TestBundle::default()
        });
        w.tick().ok();
        assert_report(&w.last_report(), ReportResult::Applied, None);
        let pull = w
            .docker_call_records()
            .into_iter()
            .find(|c| c.args.iter().any(|a| a == "pull"))
            .expect("a compose pull");
        assert!(
            pull.args.iter().any(|a| a.ends_with("/.monky-pull.yml")),
            "{policy}: no pull override in {}",
            pull.command_line()
        );
        // The override is handed to the pull only: up runs what the bundle and the budget say.
        assert!(
            w.docker_calls()
                .iter()
                .filter(|c| compose_sub(c) == Some("up"))
                .all(|c| !c.contains(".monky-pull.yml")),
            "{policy}"
        );
        assert_eq!(record(&w), vec![default_image_id(IMAGE)], "{policy}");
    }
}

/// The compose subcommands of a heal of a stopped container, on a box that applied the default
/// bundle, with the engine's image for the release's tag `engine_image` (`None`: the one this
/// env pulled).
fn heal_with(engine_image: Option<&str>) -> (World, Vec<String>) {
    let w = World::new();
    w.applied();
    assert_eq!(record(&w), vec![default_image_id(IMAGE)]);
    if let Some(id) = engine_image {
        w.set_engine_image(IMAGE, Some(id));
    }
    let path = w.stub_dir().join("containers.json");
    let mut cs: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    cs[0]["State"] = "exited".into();
    cs[0]["Status"] = "Exited (1) 2 seconds ago".into();
    std::fs::write(&path, serde_json::to_vec(&cs).unwrap()).unwrap();
    let from = w.docker_calls().len();
    w.tick().ok();
    let subs = subs_since(&w, from);
    (w, subs)
}

#[test]
fn a_heal_starts_only_images_this_env_pulled_and_pulls_the_others_first() {
    // The image on the engine is the one this env pulled: the heal starts it, no pull.
    let (_, subs) = heal_with(None);
    assert!(subs.contains(&"up".to_owned()), "{subs:?}");
    assert!(!subs.contains(&"pull".to_owned()), "{subs:?}");

    // The tag now names another image on the engine (another env pulled it, or it was tagged
    // by hand): the heal pulls from the registry before it starts anything, and records it.
    let (w, subs) = heal_with(Some("sha256:from-another-env"));
    let (pull, up) = (
        subs.iter().position(|s| s == "pull"),
        subs.iter().position(|s| s == "up"),
    );
    assert!(pull.is_some() && pull < up, "{subs:?}");
    assert!(record(&w).contains(&"sha256:from-another-env".to_owned()));
}

#[test]
fn a_heal_whose_image_cannot_be_pulled_starts_nothing() {
    let w = World::new();
    w.applied();
    w.set_engine_image(IMAGE, Some("sha256:from-another-env"));
    let path = w.stub_dir().join("containers.json");
    std::fs::write(&path, "[]").unwrap();
    w.stub("PULL_FAIL", "1");
    let from = w.docker_calls().len();
    w.tick().expect(1);
    let subs = subs_since(&w, from);
    assert!(subs.contains(&"pull".to_owned()), "{subs:?}");
    assert!(!subs.contains(&"up".to_owned()), "{subs:?}");
    assert!(!record(&w).contains(&"sha256:from-another-env".to_owned()));
}
