//! `.env` rendering and reference discovery, by example and by property.

use std::collections::{BTreeMap, BTreeSet};

use monky_bundle::{check_env_complete, read_env, referenced_vars, render_env};
use proptest::prelude::*;
use secrecy::{ExposeSecret, SecretString};

fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, SecretString> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), SecretString::from(*v)))
        .collect()
}

fn check(template: &str, pairs: &[(&str, &str)], expected: &str) {
    let out = render_env(template, &values(pairs)).unwrap();
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

/// `.env` lines and the value compose 2.26 gives each (measured with `docker compose config`
/// on the same file); `None`: not an assignment compose reads.
const COMPOSE_READS: &[(&str, Option<(&str, &str)>)] = &[
    ("A=plain", Some(("A", "plain"))),
    ("B=y # space comment", Some(("B", "y"))),
    ("E=x  #y", Some(("E", "x"))),
    // A tab before `#` does not start a comment, nor does a `#` at the value's start.
    ("T=x\t# tab comment", Some(("T", "x\t# tab comment"))),
    ("H=#x", Some(("H", "#x"))),
    ("H= #x", Some(("H", "#x"))),
    (" F = spaced ", Some(("F", "spaced"))),
    ("export E=plain", Some(("E", "plain"))),
    ("export  I=2", Some(("I", "2"))),
    ("J =\"k\"", Some(("J", "k"))),
    ("K=  \"lead\"", Some(("K", "lead"))),
    ("G=\t\"q\"", Some(("G", "q"))),
    // Double quotes: escapes, `$$`, and nothing after the closing quote.
    ("C=\"q\\\"d\" # c", Some(("C", "q\"d"))),
    ("I=\"x\"y", Some(("I", "x"))),
    ("G=\"a$$b\"", Some(("G", "a$b"))),
    // Single quotes: literal but for `\'`.
    ("D='s\\'x'", Some(("D", "s'x"))),
    ("J='a # b'", Some(("J", "a # b"))),
    ("S='a$$b'", Some(("S", "a$$b"))),
    // Unquoted: `$$` is a dollar, a backslash is itself.
    ("U=a$$b", Some(("U", "a$b"))),
    ("V=a\\nb", Some(("V", "a\\nb"))),
    ("# A=commented", None),
    ("  # A=commented", None),
    ("no assignment", None),
    // compose's reader takes any letters, digits, `_ . - [ ]` for a key (measured with
    // `env_file: .env`), and YAML's `:` for `=`.
    ("1A=digit first", Some(("1A", "digit first"))),
    ("a.b-c=dotted", Some(("a.b-c", "dotted"))),
    ("K: yaml", Some(("K", "yaml"))),
];

#[test]
fn env_is_read_as_compose_reads_it() {
    for (line, expected) in COMPOSE_READS {
        let got: Vec<(&str, String)> = read_env(line).collect();
        let expected: Vec<(&str, String)> =
            expected.iter().map(|(k, v)| (*k, v.to_string())).collect();
        assert_eq!(got, expected, "{line:?}");
    }
    // Line endings and order are kept; a later assignment is another entry.
    let got: Vec<(&str, String)> = read_env("A=1\r\nB=2\nA=3").collect();
    assert_eq!(
        got,
        [("A", "1".into()), ("B", "2".into()), ("A", "3".into())]
    );
    // A quoted value spans lines, a `#` line inside it included (measured: compose gives
    // `M` the three lines).
    let got: Vec<(&str, String)> = read_env("M=\"x\n#c\ny\"\nB='p\nq'\n").collect();
    assert_eq!(got, [("M", "x\n#c\ny".into()), ("B", "p\nq".into())]);
}

/// A template value that spans lines is one variable: a secret on its second line makes the
/// key a secret key, is substituted, and reads back as compose reads it.
#[test]
fn a_value_spanning_lines_is_one_variable() {
    let vars = BTreeSet::from(["PW".to_string()]);
    let template = "MULTI=\"x\n${PW}\"\nSPLIT='a\n#${PW}'\nPLAIN=y\n# ${PW}\n";
    let keys = monky_bundle::secret_keys(template, &vars);
    assert_eq!(
        keys,
        BTreeSet::from(["MULTI".to_string(), "SPLIT".to_string()])
    );
    assert_eq!(referenced_vars(template), vars);
    let env = render_env(template, &values(&[("PW", "s\\e\"c$r")])).unwrap();
    let read: Vec<(&str, String)> = read_env(env.expose_secret()).collect();
    assert_eq!(
        read,
        [
            ("MULTI", "x\ns\\e\"c$r".into()),
            ("SPLIT", "a\n#s\\e\"c$r".into()),
            ("PLAIN", "y".into())
        ]
    );
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
        let out = render_env(&template, &values(&[("A", "x")])).unwrap();
        prop_assert_eq!(out.expose_secret(), template.as_str());
        prop_assert!(referenced_vars(&template).is_empty());
    }

    #[test]
    fn a_whole_value_reads_back_exactly(name in var_name(), value in any::<String>()) {
        // Whatever the value holds ($, #, quotes, newlines, ${...}), compose reads it back.
        let template = format!("{name}=${{{name}}}\n");
        let map = BTreeMap::from([(name.clone(), SecretString::from(value.clone()))]);
        let out = render_env(&template, &map).unwrap();
        let line = out.expose_secret();
        prop_assert_eq!(line.matches('\n').count(), 1, "one line: {:?}", line);
        prop_assert_eq!(read_back(line), Some((name.clone(), value.clone())));
        let plain = !value.is_empty() && value.chars().all(|c| c.is_ascii_alphanumeric());
        if plain {
            prop_assert_eq!(line, format!("{name}={value}\n"), "a plain value is written as it is");
        }
    }

    #[test]
    fn secret_values_reads_back_what_render_wrote(name in var_name(), value in any::<String>()) {
        prop_assume!(name != "PLAIN");
        let template = format!("# ${{{name}}}\n{name}=${{{name}}}\nQ=\"<${{{name}}}>\"\nPLAIN=x\n");
        let map = BTreeMap::from([(name.clone(), SecretString::from(value.clone()))]);
        let out = render_env(&template, &map).unwrap();
        let secret = BTreeSet::from([name.clone()]);
        let read = monky_bundle::secret_values(&template, out.expose_secret(), &secret);
        let read: Vec<&str> = read.iter().map(|v| v.expose_secret()).collect();
        let quoted = format!("<{value}>");
        prop_assert_eq!(read, [value.as_str(), quoted.as_str()]);
    }

    #[test]
    fn a_value_inside_double_quotes_reads_back_exactly(
        name in var_name(), value in any::<String>(), pre in plain(), post in plain(),
    ) {
        let template = format!("{name}=\"{pre}${{{name}}}{post}\" # note\n");
        let map = BTreeMap::from([(name.clone(), SecretString::from(value.clone()))]);
        let out = render_env(&template, &map).unwrap();
        prop_assert_eq!(read_back(out.expose_secret()), Some((name, format!("{pre}{value}{post}"))));
    }

    #[test]
    fn a_value_inside_single_quotes_reads_back_or_is_refused(
        name in var_name(), value in any::<String>(), pre in plain(),
    ) {
        let template = format!("{name}='{pre}${{{name}}}'\n");
        let map = BTreeMap::from([(name.clone(), SecretString::from(value.clone()))]);
        match render_env(&template, &map) {
            Ok(out) => prop_assert_eq!(
                read_back(out.expose_secret()),
                Some((name, format!("{pre}{value}")))
            ),
            Err(refusal) => {
                prop_assert!(value.ends_with('\\') || value.contains("\\'"), "{value:?}");
                prop_assert_eq!(refusal.to_string(), format!("ENV_VALUE_UNSAFE: {name}, .env.template line 1"));
            }
        }
    }

    #[test]
    fn a_value_inside_an_unquoted_value_reads_back_or_is_refused(
        name in var_name(), value in any::<String>(),
    ) {
        let template = format!("# header\n{name}=postgres://u:${{{name}}}@db/x\n");
        let map = BTreeMap::from([(name.clone(), SecretString::from(value.clone()))]);
        match render_env(&template, &map) {
            Ok(out) => {
                let text = out.expose_secret();
                let line = text.strip_prefix("# header\n").unwrap();
                prop_assert_eq!(read_back(line), Some((name, format!("postgres://u:{value}@db/x"))));
            }
            Err(refusal) => {
                prop_assert!(
                    value.contains(['#', '"', '\'', '\n', '\r'])
                        || value.starts_with(char::is_whitespace)
                        || value.ends_with(char::is_whitespace),
                    "{value:?}"
                );
                // Names and the line only: the value never reaches a refusal.
                prop_assert_eq!(refusal.to_string(), format!("ENV_VALUE_UNSAFE: {name}, .env.template line 2"));
            }
        }
    }

    #[test]
    fn comment_lines_are_copied_verbatim(body in any::<String>(), indent in "[ \t]{0,3}") {
        let body = body.replace('\n', " ");
        let template = format!("{indent}#{body}\n");
        let out = render_env(&template, &values(&[("A", "1"), ("B", "2")])).unwrap();
        prop_assert_eq!(out.expose_secret(), template.as_str());
        prop_assert!(referenced_vars(&template).is_empty());
    }

    #[test]
    fn escaped_dollars_stay_escaped(name in var_name()) {
        let template = format!("X=$${name} $${{{name}}}\n");
        let out = render_env(&template, &values(&[(name.as_str(), "v")])).unwrap();
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
        let out = render_env(&template, &map).unwrap();
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
        let out = render_env(&template, &values(&[("A", "1")])).unwrap();
        // A's value is shorter than any reference to it and a missing reference is kept as
        // written, so rendering can only shrink this template.
        prop_assert!(out.expose_secret().len() <= template.len());
        let _ = referenced_vars(&template);
    }
}

/// Reads a one-line `KEY=value` the way compose's `.env` reader does (as measured against
/// `docker compose config`; the e2e suite checks the same values on the real tool): `"..."`
/// takes `\\`, `\"`, `\n`, `\r` and `$$`; `'...'` is literal but for `\'`; an unquoted value
/// ends at ` #`, is trimmed and takes `$$`. `None` when compose would interpolate a `$` or the
/// line is not one assignment.
fn read_back(line: &str) -> Option<(String, String)> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let (key, rest) = line.split_once('=')?;
    let mut chars = rest.chars().peekable();
    let mut value = String::new();
    match chars.peek() {
        Some('"') => {
            chars.next();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => value.push(match chars.next()? {
                        'n' => '\n',
                        'r' => '\r',
                        c @ ('\\' | '"') => c,
                        _ => return None,
                    }),
                    '$' => {
                        (chars.next()? == '$').then_some(())?;
                        value.push('$');
                    }
                    c => value.push(c),
                }
            }
        }
        Some('\'') => {
            chars.next();
            loop {
                match chars.next()? {
                    '\'' => break,
                    '\\' if chars.peek() == Some(&'\'') => {
                        chars.next();
                        value.push('\'');
                    }
                    c => value.push(c),
                }
            }
        }
        _ => {
            let raw: String = chars.by_ref().collect();
            let raw = raw.split(" #").next().unwrap_or_default().trim();
            let mut it = raw.chars();
            while let Some(c) = it.next() {
                if c == '$' {
                    (it.next()? == '$').then_some(())?;
                }
                value.push(c);
            }
        }
    }
    let tail: String = chars.collect();
    (tail.trim().is_empty() || tail.trim_start().starts_with('#')).then_some(())?;
    Some((key.to_string(), value))
}

#[test]
fn a_template_cannot_amplify_a_secret_into_gigabytes() {
    // 2 MiB of template (the member limit) could reference a 4 KiB secret ~500,000 times.
    let value = "x".repeat(1024);
    let map = BTreeMap::from([("BIG".to_string(), SecretString::from(value.as_str()))]);
    let over = "A=${BIG}${BIG}${BIG}${BIG}\n".repeat(1100);
    let refusal = render_env(&over, &map).expect_err("over the value budget");
    assert_eq!(
        refusal.to_string(),
        "BUNDLE_TOO_LARGE: .env.template renders over 4194304 bytes of values"
    );
    // Well within it: every value written, nothing refused.
    let within = "A=${BIG}${BIG}${BIG}${BIG}\n".repeat(900);
    let out = render_env(&within, &map).unwrap();
    assert_eq!(out.expose_secret().len(), 900 * (2 + 4 * 1024 + 1));
}
