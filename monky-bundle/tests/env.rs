//! `.env` rendering and reference discovery, by example and by property.

use std::collections::{BTreeMap, BTreeSet};

use monky_bundle::{check_env_complete, referenced_vars, render_env};
use proptest::prelude::*;
use secrecy::{ExposeSecret, SecretString};

fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, SecretString> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), SecretString::from(*v)))
        .collect()
}

fn check(template: &str, pairs: &[(&str, &str)], expected: &str) {
    let out = render_env(template, &values(pairs));
    assert_eq!(out.expose_secret(), expected, "{template:?}");
}

#[test]
fn rendering_by_example() {
    check("A=${A}\n", &[("A", "1")], "A=1\n");
    check("A=$A\n", &[("A", "1")], "A=1\n");
    check(
        "URL=postgres://u:${PW}@db/x\n",
        &[("PW", "p@ss")],
        "URL=postgres://u:p@ss@db/x\n",
    );
    check("A=${A:-dflt}\nB=${B-dflt}\n", &[], "A=dflt\nB=dflt\n");
    check(
        "A=${A:-dflt}\nB=${B-dflt}\n",
        &[("A", ""), ("B", "")],
        "A=dflt\nB=\n",
    );
    check("A=${A:+on}\nB=${B:+on}\n", &[("A", "x")], "A=on\nB=\n");
    check("PRICE=$$5 ${A}\n", &[("A", "1")], "PRICE=$$5 1\n");
    check("A=${MISSING}\n", &[], "A=${MISSING}\n");
    check(
        "# every ${A} is substituted\nA=${A}\n",
        &[("A", "1")],
        "# every ${A} is substituted\nA=1\n",
    );
    check("  #indented ${A}\n", &[("A", "1")], "  #indented ${A}\n");
    check(
        "no newline at end ${A}",
        &[("A", "1")],
        "no newline at end 1",
    );
    check("", &[], "");
}

#[test]
fn comment_lines_never_count_as_references() {
    // The renderer's own header, which once refused the first bundle on env-qa-02.
    let template = "# Rendered by monky-deploy. The on-box agent substitutes every ${VAR}\n\
                    # from OpenBao per secrets.manifest.json.\nGEMINI_API_KEY=${GEMINI_API_KEY}\n";
    let refs: Vec<String> = referenced_vars(template).into_iter().collect();
    assert_eq!(refs, ["GEMINI_API_KEY"]);
    let provided = BTreeSet::from(["GEMINI_API_KEY".to_string()]);
    assert_eq!(check_env_complete(template, &provided), Ok(()));
}

/// Text without `$` and without a comment marker.
fn plain() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_=:/. @-]{0,40}"
}

fn var_name() -> impl Strategy<Value = String> {
    "[A-Z_][A-Z0-9_]{0,12}"
}

proptest! {
    #[test]
    fn text_without_dollar_renders_unchanged(lines in prop::collection::vec(plain(), 0..8)) {
        let template = lines.join("\n");
        let out = render_env(&template, &values(&[("A", "x")]));
        prop_assert_eq!(out.expose_secret(), template.as_str());
        prop_assert!(referenced_vars(&template).is_empty());
    }

    #[test]
    fn a_value_is_inserted_verbatim(name in var_name(), value in any::<String>(), pre in plain(), post in plain()) {
        // Whatever the value holds ($, newlines, ${...}), it is inserted once and never rescanned.
        let template = format!("{pre}${{{name}}}#{post}");
        let map = BTreeMap::from([(name.clone(), SecretString::from(value.clone()))]);
        let out = render_env(&template, &map);
        prop_assert_eq!(out.expose_secret(), format!("{pre}{value}#{post}"));
    }

    #[test]
    fn comment_lines_are_copied_verbatim(body in any::<String>(), indent in "[ \t]{0,3}") {
        let body = body.replace('\n', " ");
        let template = format!("{indent}#{body}\n");
        let out = render_env(&template, &values(&[("A", "1"), ("B", "2")]));
        prop_assert_eq!(out.expose_secret(), template.as_str());
        prop_assert!(referenced_vars(&template).is_empty());
    }

    #[test]
    fn escaped_dollars_stay_escaped(name in var_name()) {
        let template = format!("X=$${name} $${{{name}}}\n");
        let out = render_env(&template, &values(&[(name.as_str(), "v")]));
        prop_assert_eq!(out.expose_secret(), template.as_str());
        prop_assert!(referenced_vars(&template).is_empty());
    }

    #[test]
    fn provided_references_are_complete_and_fully_rendered(
        names in prop::collection::btree_set(var_name(), 1..6),
        bare in any::<bool>(),
    ) {
        let template: String = names
            .iter()
            .map(|n| if bare { format!("{n}=${n}\n") } else { format!("{n}=${{{n}}}\n") })
            .collect();
        let provided: BTreeSet<String> = names.iter().cloned().collect();
        prop_assert_eq!(referenced_vars(&template), provided.clone());
        prop_assert_eq!(check_env_complete(&template, &provided), Ok(()));
        let map: BTreeMap<String, SecretString> =
            names.iter().map(|n| (n.clone(), SecretString::from("value"))).collect();
        let out = render_env(&template, &map);
        prop_assert!(!out.expose_secret().contains('$'));
        // Dropping any one name makes the template incomplete, naming exactly that name.
        for missing in &names {
            let mut fewer = provided.clone();
            fewer.remove(missing);
            let refusal = check_env_complete(&template, &fewer).expect_err("incomplete");
            prop_assert_eq!(refusal.names, vec![missing.clone()]);
        }
    }

    #[test]
    fn arbitrary_templates_never_panic(template in any::<String>()) {
        let out = render_env(&template, &values(&[("A", "1")]));
        // A's value is shorter than any reference to it and a missing reference is kept as
        // written, so rendering can only shrink this template.
        prop_assert!(out.expose_secret().len() <= template.len());
        let _ = referenced_vars(&template);
    }
}
