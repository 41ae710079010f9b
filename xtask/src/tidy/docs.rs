//! The invariants of docs/architecture.md held to the code: every `**Invariant:**` paragraph ends
//! with a `Held by:` sentence naming what holds it, each named tidy rule is one of tidy's rules
//! and each named test is a `#[test]` function where its path says, and every tidy rule is
//! named by at least one invariant.
//!
//! The sentence's form, one holder or more separated by `; `:
//!
//! ```text
//! Held by: tidy rule `bundle-no-network`; test `monky_bundle::tests::policy::a_test`; review.
//! ```
//!
//! A test's path is its crate (the folder's name with `_` for `-`), then the file's path below
//! `src/` (`a::b` for `src/a/b.rs` or `src/a/b/mod.rs`, nothing for `lib.rs` or `main.rs`) or
//! `tests::` and the path below `tests/`, then the function's name. `review` says that no rule
//! or test holds the claim (or a part of it) and a person must.

use std::collections::BTreeSet;

/// What a `Held by:` sentence can name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Holder {
    Rule(String),
    Test(String),
    Review,
}

/// One `**Invariant:**` paragraph: its first line's number (1-based), a short quote of its
/// start, and its text joined into one line.
struct Paragraph {
    line: usize,
    quote: String,
    text: String,
}

/// Where a paragraph's holders start.
const HELD_BY: &str = "Held by: ";

/// Every broken pairing between `doc` (docs/architecture.md's text) and the code: `rules` are
/// tidy's rule names; `read` gives a workspace file's text by its path relative to the root.
pub fn check(doc: &str, rules: &[&str], read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut broken = Vec::new();
    let mut named = BTreeSet::new();
    for p in paragraphs(doc) {
        let at = format!(
            "docs/architecture.md:{}: the invariant \"{}\"",
            p.line, p.quote
        );
        let holders = match holders(&p.text) {
            Ok(holders) => holders,
            Err(why) => {
                broken.push(format!("{at} {why}"));
                continue;
            }
        };
        for holder in holders {
            match holder {
                Holder::Rule(name) => {
                    if !rules.contains(&name.as_str()) {
                        broken.push(format!(
                            "{at} names tidy rule `{name}`, which is not one of tidy's rules ({})",
                            rules.join(", ")
                        ));
                    }
                    named.insert(name);
                }
                Holder::Test(path) => {
                    if let Err(why) = find_test(&path, read) {
                        broken.push(format!("{at} names test `{path}`, but {why}"));
                    }
                }
                Holder::Review => {}
            }
        }
    }
    for rule in rules {
        if !named.contains(*rule) {
            broken.push(format!(
                "tidy rule `{rule}` is named by no invariant of docs/architecture.md: add it to \
                 the `Held by:` of the invariant it holds"
            ));
        }
    }
    broken
}

/// The `**Invariant:**` paragraphs of `doc`.
fn paragraphs(doc: &str) -> Vec<Paragraph> {
    let mut found = Vec::new();
    let mut current: Option<Paragraph> = None;
    for (n, line) in doc.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            found.extend(current.take());
            continue;
        }
        match &mut current {
            Some(p) => {
                p.text.push(' ');
                p.text.push_str(line);
            }
            None => {
                if let Some(rest) = line.strip_prefix("**Invariant:**") {
                    let quote: Vec<&str> = rest.split_whitespace().take(8).collect();
                    current = Some(Paragraph {
                        line: n + 1,
                        quote: format!("{} ...", quote.join(" ")),
                        text: line.to_owned(),
                    });
                }
            }
        }
    }
    found.extend(current);
    found
}

/// The holders a paragraph's last sentence names, or why they cannot be read.
fn holders(text: &str) -> Result<Vec<Holder>, String> {
    let Some(at) = text.rfind(HELD_BY) else {
        return Err(format!(
            "names no holder: end it with \"{HELD_BY}tidy rule `name`; test `crate::path::fn`.\" \
             or \"{HELD_BY}review.\""
        ));
    };
    let list = text[at + HELD_BY.len()..].strip_suffix('.');
    let Some(list) = list.filter(|list| !list.contains(". ")) else {
        return Err(format!(
            "has its `{HELD_BY}` sentence before its end, or without the closing period"
        ));
    };
    list.split("; ")
        .map(|item| {
            let named = |prefix: &str| {
                item.strip_prefix(prefix)
                    .and_then(|rest| rest.strip_prefix('`')?.strip_suffix('`'))
                    .filter(|name| !name.is_empty() && !name.contains('`'))
                    .map(str::to_owned)
            };
            if item == "review" {
                Ok(Holder::Review)
            } else if let Some(name) = named("tidy rule ") {
                Ok(Holder::Rule(name))
            } else if let Some(path) = named("test ") {
                Ok(Holder::Test(path))
            } else {
                Err(format!(
                    "has a holder that is not \"tidy rule `name`\", \"test `crate::path::fn`\" \
                     or \"review\": {item:?}"
                ))
            }
        })
        .collect()
}

/// Whether the test `path` is a `#[test]` function in the file its path names.
fn find_test(path: &str, read: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    let parts: Vec<&str> = path.split("::").collect();
    let (Some(krate), Some(name)) = (parts.first(), parts.last()) else {
        return Err("it is empty".into());
    };
    if parts.len() < 2 {
        return Err("a test is named `crate::path::fn`".into());
    }
    let dir = krate.replace('_', "-");
    let modules = &parts[1..parts.len() - 1];
    let files: Vec<String> = match modules.split_first() {
        None => vec![format!("{dir}/src/lib.rs"), format!("{dir}/src/main.rs")],
        Some((&"tests", rest)) if !rest.is_empty() => {
            let rest = rest.join("/");
            vec![
                format!("{dir}/tests/{rest}.rs"),
                format!("{dir}/tests/{rest}/mod.rs"),
            ]
        }
        Some(_) => {
            let rest = modules.join("/");
            vec![
                format!("{dir}/src/{rest}.rs"),
                format!("{dir}/src/{rest}/mod.rs"),
            ]
        }
    };
    let Some((file, text)) = files.iter().find_map(|f| Some((f, read(f)?))) else {
        return Err(format!("there is no {}", files.join(" or ")));
    };
    if test_fns(&text).contains(*name) {
        Ok(())
    } else {
        Err(format!("{file} has no `#[test]` function `{name}`"))
    }
}

/// The names of the functions in `text` that a `#[test]` attribute marks (other attributes,
/// doc comments and comments may stand between the two), proptest's included.
fn test_fns(text: &str) -> BTreeSet<String> {
    const ATTR: &str = "#[test]";
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices(ATTR) {
        let mut rest = &text[at + ATTR.len()..];
        loop {
            rest = rest.trim_start();
            if rest.starts_with("//") {
                rest = rest.split_once('\n').map_or("", |(_, after)| after);
            } else if rest.starts_with("#[") {
                rest = skip_attribute(rest);
            } else if let Some(after) = ["pub ", "async ", "unsafe "]
                .iter()
                .find_map(|word| rest.strip_prefix(word))
            {
                rest = after;
            } else {
                break;
            }
        }
        if let Some(after) = rest.strip_prefix("fn ") {
            let name: String = after
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// `text` after the attribute it starts with (`#[...]`, brackets nested).
fn skip_attribute(text: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &text[i + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const RULES: &[&str] = &["bundle-no-network", "spawns"];

    /// The planted workspace's files.
    fn files() -> HashMap<&'static str, &'static str> {
        HashMap::from([
            (
                "monky-bundle/tests/policy.rs",
                "#[test]\nfn every_key() {}\n\nfn helper() {}\n",
            ),
            (
                "monky-deployd/src/tick/backoff.rs",
                "#[cfg(test)]\nmod tests {\n    #[test]\n    #[ignore = \"slow\"]\n    \
                 /// Doc.\n    fn waits() {}\n}\n",
            ),
            ("monky-deployd/src/lib.rs", "#[test]\nfn at_the_root() {}\n"),
        ])
    }

    /// The broken pairings of `doc` against the planted workspace.
    fn check_planted(doc: &str) -> Vec<String> {
        let files = files();
        check(doc, RULES, &|path: &str| {
            files.get(path).map(|text| (*text).to_owned())
        })
    }

    const GOOD: &str = "# Architecture\n\nSome prose.\n\n\
        **Invariant:** `monky-bundle` does no network IO and spawns no process.\n\
        Held by: tidy rule `bundle-no-network`; tidy rule `spawns`.\n\n\
        **Invariant:** every key is classified. Held by: test\n\
        `monky_bundle::tests::policy::every_key`; test `monky_deployd::tick::backoff::waits`;\n\
        test `monky_deployd::at_the_root`; review.\n\n\
        **Invariant:** a claim a person checks. Held by: review.\n";

    #[test]
    fn a_doc_whose_invariants_and_rules_pair_passes() {
        assert_eq!(check_planted(GOOD), Vec::<String>::new());
        let texts: Vec<String> = paragraphs(GOOD).into_iter().map(|p| p.text).collect();
        assert_eq!(texts.len(), 3);
        assert_eq!(
            holders(&texts[1]).unwrap(),
            [
                Holder::Test("monky_bundle::tests::policy::every_key".into()),
                Holder::Test("monky_deployd::tick::backoff::waits".into()),
                Holder::Test("monky_deployd::at_the_root".into()),
                Holder::Review,
            ]
        );
    }

    #[test]
    fn each_broken_pairing_names_its_paragraph_and_holder() {
        // (what replaces what in GOOD, what the one broken line must say)
        let cases: &[(&str, &str, &str)] = &[
            (
                " Held by: review.\n",
                "\n",
                ":12: the invariant \"a claim a person checks. ...\" names no holder",
            ),
            (
                "tidy rule `spawns`",
                "tidy rule `spawn`",
                ":5: the invariant \"`monky-bundle` does no network IO and spawns no ...\" \
                 names tidy rule `spawn`, which is not one of tidy's rules",
            ),
            (
                "policy::every_key`",
                "policy::every_keys`",
                "names test `monky_bundle::tests::policy::every_keys`, but \
                 monky-bundle/tests/policy.rs has no `#[test]` function `every_keys`",
            ),
            (
                "`monky_bundle::tests::policy::every_key`",
                "`monky_bundle::tests::policy::helper`",
                "monky-bundle/tests/policy.rs has no `#[test]` function `helper`",
            ),
            (
                "tick::backoff::waits",
                "tick::waits",
                "names test `monky_deployd::tick::waits`, but there is no \
                 monky-deployd/src/tick.rs or monky-deployd/src/tick/mod.rs",
            ),
            (
                "; review.\n\n**Invariant:** a claim",
                "; maybe.\n\n**Invariant:** a claim",
                "has a holder that is not",
            ),
            (
                "checks. Held by: review.",
                "checks. Held by: review. More.",
                "before its end",
            ),
            (
                "Held by: tidy rule `bundle-no-network`; tidy rule `spawns`.",
                "Held by: tidy rule `bundle-no-network`.",
                "tidy rule `spawns` is named by no invariant of docs/architecture.md",
            ),
        ];
        for (from, to, expected) in cases {
            assert!(GOOD.contains(from), "{from}");
            let doc = GOOD.replacen(from, to, 1);
            let broken = check_planted(&doc);
            assert!(
                broken.iter().any(|line| line.contains(expected)),
                "{from} -> {to}: {broken:#?}"
            );
        }
    }

    #[test]
    fn test_functions_are_found_past_attributes_and_comments() {
        let text = "#[test]\nfn plain() {}\n\
                    #[test]\n#[cfg_attr(not(unix), ignore = \"[x]\")]\n// why\npub async fn marked() {}\n\
                    fn not_a_test() {}\n\
                    proptest! {\n    #[test]\n    fn a_property(x in 0..3u8) {}\n}\n\
                    #[test]\nconst NOT_A_FN: u8 = 0;\n";
        assert_eq!(
            test_fns(text).into_iter().collect::<Vec<_>>(),
            ["a_property", "marked", "plain"]
        );
    }

    #[test]
    fn every_rule_name_is_one_word_and_unique() {
        let names = crate::tidy::rule_names();
        let unique: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for name in names {
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
    }
}
