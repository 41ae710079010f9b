//! The walks of docs/architecture.md ("Follow the sha", "Follow a secret") held to the code:
//! every step names files and functions, and each function, type (`Sha`) or enum variant
//! (`Fact::CheckedIn`) it names must be defined in a file its step names, so a rename or a move
//! that the walk does not follow fails tidy.

use std::path::Path;

use anyhow::{Context, Result};

/// The rule's name in tidy's output.
pub const RULE: &str = "the architecture's walks name functions that exist";

/// The walks' headings.
const WALKS: &[&str] = &["#### Follow the sha", "#### Follow a secret"];

/// The broken steps of the walks in `root`'s docs/architecture.md.
pub fn check_tree(root: &Path) -> Result<Vec<String>> {
    let doc = std::fs::read_to_string(root.join("docs/architecture.md"))
        .context("cannot read docs/architecture.md")?;
    Ok(check(&doc, &|file| {
        std::fs::read_to_string(root.join(file)).ok()
    }))
}

/// The broken steps of the walks in `doc`, reading a named file through `read`.
fn check(doc: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut broken = Vec::new();
    for heading in WALKS {
        let Some(steps) = section(doc, heading) else {
            broken.push(format!("docs/architecture.md has no {heading:?}"));
            continue;
        };
        if steps.is_empty() {
            broken.push(format!("{heading:?} has no numbered step"));
        }
        for (n, step) in steps.iter().enumerate() {
            let (files, fns, types) = names(step);
            let at = format!("{heading:?} step {}", n + 1);
            if files.is_empty() || fns.is_empty() {
                broken.push(format!("{at} names no `file.rs` and function"));
                continue;
            }
            let texts: Vec<(&str, Option<String>)> = files.iter().map(|f| (*f, read(f))).collect();
            for (file, text) in &texts {
                if text.is_none() {
                    broken.push(format!("{at}: {file} does not exist"));
                }
            }
            let defined_in = |test: &dyn Fn(&str) -> bool| {
                texts.iter().filter_map(|(_, t)| t.as_deref()).any(test)
            };
            for name in fns {
                if !defined_in(&|t| defines(t, name)) {
                    broken.push(format!("{at}: no `fn {name}` in {}", files.join(" or ")));
                }
            }
            for name in types {
                if !defined_in(&|t| defines_type(t, name)) {
                    broken.push(format!("{at}: no type `{name}` in {}", files.join(" or ")));
                }
            }
        }
    }
    broken
}

/// The numbered steps below `heading`, up to the next heading, each joined into one line.
fn section(doc: &str, heading: &str) -> Option<Vec<String>> {
    let start = doc.lines().position(|l| l.trim_end() == heading)?;
    let mut steps: Vec<String> = Vec::new();
    for line in doc.lines().skip(start + 1) {
        if line.starts_with('#') {
            break;
        }
        let numbered = line
            .split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if numbered {
            steps.push(line.to_string());
        } else if let Some(last) = steps.last_mut()
            && line.starts_with("   ")
        {
            last.push(' ');
            last.push_str(line.trim());
        }
    }
    Some(steps)
}

/// The files (`a/b.rs`), the functions (a snake-case name) and the types (`Sha`, or an enum's
/// variant `Fact::Applied`) a step names in backticks; other backticked text (a path) is prose.
fn names(step: &str) -> (Vec<&str>, Vec<&str>, Vec<&str>) {
    let (mut files, mut fns, mut types) = (Vec::new(), Vec::new(), Vec::new());
    for (i, quoted) in step.split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        if quoted.ends_with(".rs") && !quoted.contains(' ') {
            files.push(quoted);
        } else if is_fn_name(quoted) {
            fns.push(quoted);
        } else if is_type_name(quoted) {
            types.push(quoted);
        }
    }
    (files, fns, types)
}

/// A type's name (`Sha`) or an enum's variant (`Fact::Applied`): identifiers that each start
/// with an upper-case letter.
fn is_type_name(text: &str) -> bool {
    let mut parts = text.split("::");
    let well_formed = |part: &str| {
        part.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    parts.clone().count() <= 2 && parts.all(well_formed)
}

fn is_fn_name(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Whether `text` defines a function `name` (`fn name(` or `fn name<`).
fn defines(text: &str, name: &str) -> bool {
    ["(", "<"]
        .iter()
        .any(|open| text.contains(&format!("fn {name}{open}")))
}

/// Whether `text` defines the type `name` (`struct`, `enum`, `type` or `trait`), or for
/// `Enum::Variant` the enum and, on a line of its own, the variant.
fn defines_type(text: &str, name: &str) -> bool {
    let item = |ty: &str| {
        ["struct", "enum", "type", "trait"].iter().any(|kind| {
            text.match_indices(&format!("{kind} {ty}"))
                .any(|(at, found)| {
                    !text[at + found.len()..]
                        .bytes()
                        .next()
                        .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
                })
        })
    };
    match name.split_once("::") {
        None => item(name),
        Some((ty, variant)) => {
            item(ty)
                && text.lines().any(|line| {
                    line.trim_start().strip_prefix(variant).is_some_and(|rest| {
                        !rest
                            .bytes()
                            .next()
                            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
                    })
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
# A

#### Follow the sha

Prose with `Sha` and `fold` outside a step.

1. Decoded (`a/wire.rs`: `parse`, `Sha`).
2. Kept as `Fact::Kept` (`a/state.rs`: `fold`;
   `a/tick.rs`: `record`).

#### Follow a secret

1. Read (`a/read.rs`: `read_kv`).

## Next
";

    fn files(file: &str) -> Option<String> {
        match file {
            "a/wire.rs" => Some("pub struct Sha(String);\npub fn parse(text: &str) {}".into()),
            "a/state.rs" => {
                Some("enum Fact {\n    Kept { sha: Sha },\n}\nfn fold(&mut self) {}".into())
            }
            "a/tick.rs" => Some("fn record<T>(&mut self) {}".into()),
            "a/read.rs" => Some("fn read_kv(\n".into()),
            _ => None,
        }
    }

    #[test]
    fn walks_whose_functions_exist_pass() {
        assert_eq!(check(DOC, &files), Vec::<String>::new());
    }

    #[test]
    fn a_renamed_function_a_missing_file_and_a_missing_walk_are_named() {
        let renamed = DOC.replace("`record`", "`remember`");
        assert_eq!(
            check(&renamed, &files),
            ["\"#### Follow the sha\" step 2: no `fn remember` in a/state.rs or a/tick.rs"]
        );
        let moved = DOC.replace("a/read.rs", "a/gone.rs");
        assert_eq!(
            check(&moved, &files),
            [
                "\"#### Follow a secret\" step 1: a/gone.rs does not exist",
                "\"#### Follow a secret\" step 1: no `fn read_kv` in a/gone.rs",
            ]
        );
        let cut = &DOC[..DOC.find("#### Follow a secret").unwrap()];
        assert_eq!(
            check(cut, &files),
            ["docs/architecture.md has no \"#### Follow a secret\""]
        );
    }

    #[test]
    fn a_renamed_type_or_variant_is_named() {
        let renamed = DOC.replace("`Sha`", "`Digest`");
        assert_eq!(
            check(&renamed, &files),
            ["\"#### Follow the sha\" step 1: no type `Digest` in a/wire.rs"]
        );
        let variant = DOC.replace("`Fact::Kept`", "`Fact::Held`");
        assert_eq!(
            check(&variant, &files),
            ["\"#### Follow the sha\" step 2: no type `Fact::Held` in a/state.rs or a/tick.rs"]
        );
        // A longer name that starts with the type's is not its definition.
        assert!(!defines_type("pub struct ShaSet;", "Sha"));
    }

    #[test]
    fn the_workspace_walks_hold() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        assert_eq!(check_tree(&root).unwrap(), Vec::<String>::new());
    }
}
