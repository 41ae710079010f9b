//! The override that makes every pull ask the registry: an image already on the engine proves
//! nothing about who may pull it.

use serde_json::{Map, Value, json};

/// The name of the override the agent writes next to a release's compose file and hands to
/// `compose pull` only: not a bundle member, so no bundle can carry or replace it.
pub const PULL_OVERRIDE_FILE: &str = ".monky-pull.yml";

/// The override that sets `pull_policy: always` on every service of `compose_yaml`, so
/// `compose pull` asks the registry with this env's credential for each image, whatever the
/// bundle's own `pull_policy` (`never`, `missing`, `if_not_present` skip an image already on
/// the engine). JSON, which compose reads as YAML; `None` when the file does not parse (the
/// policy refuses it) or has no service.
///
/// ```
/// let text = monky_bundle::pull_override("services:\n  web:\n    image: nginx\n    pull_policy: never\n");
/// assert_eq!(text.as_deref(), Some(r#"{"services":{"web":{"pull_policy":"always"}}}"#));
/// ```
#[must_use]
pub fn pull_override(compose_yaml: &str) -> Option<String> {
    let doc = crate::checks::parse_compose(compose_yaml).ok()?;
    let services: Map<String, Value> = doc
        .get("services")?
        .as_object()?
        .keys()
        .map(|name| (name.clone(), json!({ "pull_policy": "always" })))
        .collect();
    (!services.is_empty()).then(|| json!({ "services": services }).to_string())
}
