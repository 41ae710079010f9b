//! The code-level rules of docs/architecture.md, as plain text scans of the sources: who spawns
//! processes, who spells the names below the state root, who writes state's outcome fields, who
//! folds facts into State, that a stage of the apply is a function and no method of the tick,
//! who ends the process, who prints, and that no crate compiles another's
//! file in by `#[path]`.
//!
//! Each file is first masked: comments, string literals and `#[cfg(test)]` items become
//! spaces (newlines kept, so lines stay where they were), and the string literals outside
//! tests are kept aside. The rules then look at the masked code or at those literals; a
//! mention in a comment, a message or a test is never a violation.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// One broken rule at one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The file, relative to the workspace root, with `/` separators.
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// What is wrong and why, naming the rule.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.what)
    }
}

/// A code rule: which files it reads and what it finds in one of them.
pub struct CodeRule {
    /// The rule's name, as docs/architecture.md states it.
    pub name: &'static str,
    applies: fn(&str) -> bool,
    check: fn(&str, &Masked) -> Vec<Violation>,
}

/// The code rules, in docs/architecture.md's order.
pub const RULES: &[CodeRule] = &[
    CodeRule {
        name: "spawns",
        applies: |_| true,
        check: spawns,
    },
    CodeRule {
        name: "state-root",
        applies: |file| {
            file.starts_with("monky-deployd/src/") && file != "monky-deployd/src/layout.rs"
        },
        check: state_root,
    },
    CodeRule {
        name: "outcome-fields",
        applies: |file| {
            file.starts_with("monky-deployd/src/")
                && file != "monky-deployd/src/state.rs"
                && !file.starts_with("monky-deployd/src/state/")
        },
        check: outcome_fields,
    },
    CodeRule {
        name: "folds",
        applies: |file| {
            file.starts_with("monky-deployd/src/")
                && !matches!(
                    file,
                    "monky-deployd/src/state.rs"
                        | "monky-deployd/src/tick.rs"
                        | "monky-deployd/src/watchdog.rs"
                )
        },
        check: folds,
    },
    CodeRule {
        name: "one-fold",
        applies: |file| file == "monky-deployd/src/state.rs",
        check: setters,
    },
    CodeRule {
        name: "coded-steps",
        applies: |file| {
            (file == "monky-deployd/src/tick.rs" || file.starts_with("monky-deployd/src/tick/"))
                && file != "monky-deployd/src/tick/bootstrap.rs"
        },
        check: uncoded_steps,
    },
    CodeRule {
        name: "stages",
        applies: |file| file.starts_with("monky-deployd/src/tick/"),
        check: stages,
    },
    CodeRule {
        name: "exits",
        applies: |file| !file.starts_with("monky-deployd/src/"),
        check: exits,
    },
    CodeRule {
        name: "prints",
        applies: |file| {
            file.starts_with("monky-deployd/src/")
                && !matches!(
                    file,
                    "monky-deployd/src/lib.rs"
                        | "monky-deployd/src/out.rs"
                        | "monky-deployd/src/main.rs"
                        | "monky-deployd/src/logging.rs"
                )
        },
        check: prints,
    },
    CodeRule {
        name: "one-backoff",
        applies: |file| {
            let mut parts = file.split('/');
            let krate = parts.next().unwrap_or("");
            parts.next() == Some("src")
                && krate.starts_with("monky-")
                && !matches!(krate, "monky-bundle" | "monky-testkit")
                && file != "monky-deployd/src/backoff.rs"
        },
        check: backoff_formulas,
    },
    CodeRule {
        name: "no-path-modules",
        applies: |file| file.split('/').nth(1) == Some("src"),
        check: module_paths,
    },
];

/// Every violation of `rules` in the workspace at `root`, by rule.
pub fn check_tree(root: &Path, rules: &[&CodeRule]) -> Result<Vec<(&'static str, Violation)>> {
    let mut files = Vec::new();
    rust_files(root, &mut files)?;
    files.sort();
    let mut found = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .to_string_lossy()
            .replace('\\', "/");
        let rules: Vec<&&CodeRule> = rules.iter().filter(|r| (r.applies)(&rel)).collect();
        if rules.is_empty() {
            continue;
        }
        let text =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let masked = Masked::new(&text);
        for rule in rules {
            let mut found_here = (rule.check)(&rel, &masked);
            found_here.sort_by_key(|v| v.line);
            for v in found_here {
                found.push((rule.name, v));
            }
        }
    }
    Ok(found)
}

/// The `.rs` files below `dir`, without build output, hidden folders and test data.
pub(super) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if name.starts_with('.') || name == "target" || name == "data" {
                continue;
            }
            rust_files(&path, out)?;
        } else if kind.is_file() && name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// A source file with comments, string literals and `#[cfg(test)]` items blanked out.
pub struct Masked {
    /// The code: same length and lines as the file.
    code: String,
    /// The string literals outside tests: where each starts, and its contents as written.
    strings: Vec<(usize, String)>,
}

impl Masked {
    /// Masks `text`.
    pub fn new(text: &str) -> Self {
        let (mut code, mut strings) = blank_comments_and_strings(text);
        for (start, end) in test_items(&code) {
            blank(&mut code, start, end);
            strings.retain(|(at, _)| *at < start || *at >= end);
        }
        let code = String::from_utf8(code).expect("only ASCII bytes were replaced");
        Self { code, strings }
    }

    /// The masked code: the file's length and lines.
    pub(super) fn code(&self) -> &str {
        &self.code
    }

    /// The 1-based line of byte `at`.
    pub(super) fn line(&self, at: usize) -> usize {
        self.code.as_bytes()[..at]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1
    }

    fn at(&self, file: &str, at: usize, what: String) -> Violation {
        Violation {
            file: file.to_owned(),
            line: self.line(at),
            what,
        }
    }
}

/// Replaces `code[start..end]` with spaces, newlines kept.
fn blank(code: &mut [u8], start: usize, end: usize) {
    for b in &mut code[start..end] {
        if *b != b'\n' {
            *b = b' ';
        }
    }
}

/// The file's bytes with comments and string/char literal contents blanked, and each string
/// literal's start and contents.
fn blank_comments_and_strings(text: &str) -> (Vec<u8>, Vec<(usize, String)>) {
    let src = text.as_bytes();
    let mut code = src.to_vec();
    let mut strings = Vec::new();
    let mut i = 0;
    while i < src.len() {
        let rest = &src[i..];
        if rest.starts_with(b"//") {
            let end = src[i..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(src.len(), |n| i + n);
            blank(&mut code, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            let mut j = i;
            while j < src.len() {
                if src[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if src[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut code, i, j);
            i = j;
        } else if let Some((open, hashes)) = raw_string_start(src, i) {
            let body = i + open;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let end = src[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(src.len(), |n| body + n);
            strings.push((i, text[body..end].to_owned()));
            blank(&mut code, body, end);
            i = (end + close.len()).min(src.len());
        } else if src[i] == b'"' || (rest.starts_with(b"b\"") && !ident_before(src, i)) {
            let body = if src[i] == b'"' { i + 1 } else { i + 2 };
            let mut j = body;
            while j < src.len() && src[j] != b'"' {
                j += if src[j] == b'\\' { 2 } else { 1 };
            }
            let end = j.min(src.len());
            strings.push((i, text[body..end].to_owned()));
            blank(&mut code, body, end);
            i = end + 1;
        } else if src[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}', 'é') or a lifetime ('a).
            let end = if src.get(i + 1) == Some(&b'\\') {
                src[i + 2..]
                    .iter()
                    .position(|b| *b == b'\'')
                    .map(|n| i + 2 + n)
            } else {
                let width = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (src.get(i + 1 + width) == Some(&b'\'')).then_some(i + 1 + width)
            };
            match end {
                Some(end) => {
                    blank(&mut code, i + 1, end);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else if ident_start(src[i]) {
            // A whole identifier, so an `r` or a `b` inside one never starts a literal.
            while i < src.len() && ident_char(src[i]) {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    (code, strings)
}

/// At `i`, `r"`, `r#"`, `br"`, ...: the length of the opening and the number of `#`.
fn raw_string_start(src: &[u8], i: usize) -> Option<(usize, usize)> {
    if ident_before(src, i) {
        return None;
    }
    let mut j = i;
    if src.get(j) == Some(&b'b') {
        j += 1;
    }
    if src.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = src[j..].iter().take_while(|b| **b == b'#').count();
    j += hashes;
    (src.get(j) == Some(&b'"')).then_some((j + 1 - i, hashes))
}

pub(super) fn ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

pub(super) fn ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn ident_before(src: &[u8], i: usize) -> bool {
    i > 0 && ident_char(src[i - 1])
}

/// The byte ranges of `#[cfg(test)]` items in masked code: the attribute through the item's
/// closing brace (or semicolon).
fn test_items(code: &[u8]) -> Vec<(usize, usize)> {
    const ATTR: &[u8] = b"#[cfg(test)]";
    let mut ranges = Vec::new();
    let mut from = 0;
    while let Some(n) = code[from..].windows(ATTR.len()).position(|w| w == ATTR) {
        let start = from + n;
        let mut j = start + ATTR.len();
        let mut depth = 0usize;
        let mut end = code.len();
        while j < code.len() {
            match code[j] {
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        ranges.push((start, end));
        from = end;
    }
    ranges
}

/// Every start of `word` in `code` as a whole word (no identifier character on either side).
pub(super) fn words<'a>(code: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    let bytes = code.as_bytes();
    code.match_indices(word)
        .map(|(at, _)| at)
        .filter(move |&at| {
            let end = at + word.len();
            !ident_before(bytes, at) && (end >= bytes.len() || !ident_char(bytes[end]))
        })
}

/// Rule: processes are spawned by `monky-compose`'s wrapper; test support, xtask and tests may
/// spawn their own.
fn spawns(file: &str, src: &Masked) -> Vec<Violation> {
    let allowed = file.starts_with("monky-compose/src/")
        || file.starts_with("monky-testkit/")
        || file.starts_with("xtask/")
        || file
            .split('/')
            .any(|part| matches!(part, "tests" | "benches" | "examples"));
    if allowed {
        return Vec::new();
    }
    let code = src.code.as_str();
    let mut found = Vec::new();
    for at in words(code, "Command") {
        let before = code[..at].trim_end();
        let after = &code[at + "Command".len()..];
        let std_path = before.ends_with("process::");
        let constructed = after.trim_start().starts_with("::new") && !before.ends_with("clap::");
        // `use std::process::{Child, Command}`: the name inside a `process::{...}` group.
        let grouped = before
            .rfind("process::{")
            .is_some_and(|open| !code[open..at].contains('}'));
        if std_path || constructed || grouped {
            found.push(
                src.at(
                    file,
                    at,
                    "spawns a process (std::process::Command): only monky-compose's wrapper does; \
                 run it through monky_compose::process"
                        .into(),
                ),
            );
        }
    }
    found
}

/// Rule: the agent's binary decides the process's exit status; a library returns its error
/// instead of ending the process, and test support, xtask and tests may end their own.
fn exits(file: &str, src: &Masked) -> Vec<Violation> {
    let allowed = file.starts_with("monky-testkit/")
        || file.starts_with("xtask/")
        || file
            .split('/')
            .any(|part| matches!(part, "tests" | "benches" | "examples"));
    if allowed {
        return Vec::new();
    }
    let code = src.code.as_str();
    words(code, "exit")
        .filter(|&at| {
            code[..at].trim_end().ends_with("process::")
                && code[at + "exit".len()..].trim_start().starts_with('(')
        })
        .map(|at| {
            src.at(
                file,
                at,
                "ends the process (std::process::exit): only monky-deployd decides the exit \
                 status; return the error instead"
                    .into(),
            )
        })
        .collect()
}

/// Rule: the agent prints through its printers (`outln!`, `errln!`, the log sink), which
/// escape every control character a peer's text may carry; a bare `println!` would not.
fn prints(file: &str, src: &Masked) -> Vec<Violation> {
    let code = src.code.as_str();
    let mut found = Vec::new();
    for word in ["println", "eprintln", "print", "eprint", "stdout", "stderr"] {
        for at in words(code, word) {
            let after = &code[at + word.len()..];
            let macro_call = after.starts_with('!');
            let stream = matches!(word, "stdout" | "stderr") && after.trim_start().starts_with('(');
            if macro_call || stream {
                found.push(src.at(
                    file,
                    at,
                    format!(
                        "prints with `{word}`: print through `outln!`, `errln!` or tracing, \
                         which escape peers' control characters"
                    ),
                ));
            }
        }
    }
    found
}

/// Rule: a crate's `src/` compiles no file in by `#[path]` (nor `#[cfg_attr(.., path = ..)]`).
/// A file compiled into two crates makes two sets of distinct types and a crate that does not
/// package; code two crates share lives in a crate both depend on.
fn module_paths(file: &str, src: &Masked) -> Vec<Violation> {
    let code = src.code.as_str();
    let mut found = Vec::new();
    for at in words(code, "path") {
        let in_attribute = code[..at]
            .rfind("#[")
            .is_some_and(|open| !code[open..at].contains(']'));
        if in_attribute && code[at + "path".len()..].trim_start().starts_with('=') {
            found.push(src.at(
                file,
                at,
                "compiles a module from another path (`#[path]`): share the code through a crate \
                 both depend on"
                    .into(),
            ));
        }
    }
    found
}

/// Names below the state root that `monky-deployd/src/layout.rs` alone spells. Each is a
/// string literal exactly this, anywhere outside tests.
const STATE_NAMES: &[&str] = &[
    "state.json",
    "bao.token",
    "release.key",
    "env-digests",
    "releases",
    "staging",
    "applying",
    "lock",
];

/// Names below the state root that are also ordinary words elsewhere (a result, a JSON key):
/// a violation only where a path is built or opened with them, or a constant holds them.
const STATE_NAMES_IN_PATHS: &[&str] = &["current", "failed", "hold", "config.json", "listeners"];

/// The calls that build or open a path, whose string arguments are path names.
const PATH_CALLS: &[&str] = &[
    ".join",
    ".ensure_sub",
    ".sub",
    ".open_plain",
    ".read_link",
    ".remove_file",
    ".remove_tree",
    ".swap_symlink",
    ".write_atomic",
    "Path::new",
    "PathBuf::from",
];

/// Rule: the state root and the names below it are `layout.rs`'s.
fn state_root(file: &str, src: &Masked) -> Vec<Violation> {
    let mut found = Vec::new();
    for (at, text) in &src.strings {
        let ambiguous = STATE_NAMES_IN_PATHS.contains(&text.as_str());
        if !STATE_NAMES.contains(&text.as_str()) && !ambiguous {
            continue;
        }
        if ambiguous && !in_path_position(&src.code, *at) {
            continue;
        }
        found.push(src.at(
            file,
            *at,
            format!(
                "spells {text:?}, a name below the state root: only monky-deployd/src/layout.rs \
                 does; ask the Layout for it"
            ),
        ));
    }
    let code = src.code.as_str();
    for at in words(code, "state_root") {
        let before = code[..at].trim_end();
        if code[at + "state_root".len()..]
            .trim_start()
            .starts_with('(')
            && !before.ends_with("fn")
        {
            found.push(src.at(
                file,
                at,
                "opens the state root: only monky-deployd/src/layout.rs does".into(),
            ));
        }
    }
    for at in words(code, "state_dir") {
        if code[at + "state_dir".len()..].starts_with(".join(") {
            found.push(
                src.at(
                    file,
                    at,
                    "builds a path below the state root from state_dir: only \
                 monky-deployd/src/layout.rs does"
                        .into(),
                ),
            );
        }
    }
    found
}

/// Whether the string literal at `at` is an argument of a path call, or a constant's value.
fn in_path_position(code: &str, at: usize) -> bool {
    let bytes = code.as_bytes();
    // The innermost call still open at `at`, within its statement.
    let mut depth = 0usize;
    let mut j = at;
    while j > 0 {
        j -= 1;
        match bytes[j] {
            b')' | b']' => depth += 1,
            b'(' | b'[' if depth > 0 => depth -= 1,
            b'(' => {
                let callee = code[..j].trim_end();
                return PATH_CALLS.iter().any(|call| callee.ends_with(call));
            }
            b'[' | b';' | b'{' | b'}' => break,
            _ => {}
        }
    }
    // `const NAME: &str = "..."` / `static`.
    let before = code[..at].trim_end();
    let line_start = before.rfind('\n').map_or(0, |n| n + 1);
    let line = before[line_start..].trim_start();
    let line = line.strip_prefix("pub ").unwrap_or(line);
    let line = line.strip_prefix("pub(crate) ").unwrap_or(line);
    (line.starts_with("const ") || line.starts_with("static ")) && line.ends_with('=')
}

/// Rule: the outcome fields and the failed release change inside `state.rs` only.
fn outcome_fields(file: &str, src: &Masked) -> Vec<Violation> {
    const FIELDS: &[&str] = &["last_result", "last_error", "last_code", "failed"];
    let code = src.code.as_str();
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for (at, _) in code.match_indices('.') {
        let name_end = bytes[at + 1..]
            .iter()
            .position(|b| !ident_char(*b))
            .map_or(bytes.len(), |n| at + 1 + n);
        let name = &code[at + 1..name_end];
        let outcome = FIELDS.contains(&name) || name.starts_with("failed_");
        if !outcome {
            continue;
        }
        let after = code[name_end..].trim_start();
        let assigned = (after.starts_with('=') && !after.starts_with("=="))
            || [
                "+=",
                "-=",
                ".take()",
                ".replace(",
                ".insert(",
                ".get_or_insert",
            ]
            .iter()
            .any(|op| after.starts_with(op));
        if assigned {
            found.push(src.at(
                file,
                at + 1,
                format!(
                    "writes State's `{name}` outside monky-deployd/src/state.rs: the outcome \
                     changes by State::fold of a Fact"
                ),
            ));
        }
    }
    found
}

/// Rule: a `State` takes its facts in the tick's one fold (`Run::record` in `tick.rs`) and the
/// deadline's (`watchdog.rs`); a read-only command or a step never folds one itself.
fn folds(file: &str, src: &Masked) -> Vec<Violation> {
    let code = src.code.as_str();
    code.match_indices(".fold(")
        .filter(|(at, m)| {
            let arg = code[at + m.len()..].trim_start();
            ["Fact::", "state::Fact::", "crate::state::Fact::"]
                .iter()
                .any(|p| arg.starts_with(p))
        })
        .map(|(at, _)| {
            src.at(
                file,
                at + 1,
                "folds a Fact into State outside the tick's one fold (tick.rs) and the \
                 deadline's (watchdog.rs): a step says what happened through Run::record"
                    .to_string(),
            )
        })
        .collect()
}

/// Rule: `State`'s one public way to change is `fold`: no other `pub` method of `state.rs`
/// takes `&mut self`, so a change is always a `Fact` that the fold rule can see.
fn setters(file: &str, src: &Masked) -> Vec<Violation> {
    let code = src.code.as_str();
    code.match_indices("fn ")
        .filter_map(|(at, _)| {
            let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
            let head = code[line_start..at].trim_start();
            if !head.starts_with("pub") {
                return None;
            }
            let rest = &code[at + 3..];
            let name_end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
            let name = &rest[..name_end];
            let args = rest[name_end..]
                .trim_start()
                .strip_prefix('(')?
                .trim_start();
            (args.starts_with("&mut self") && name != "fold").then(|| {
                src.at(
                    file,
                    at,
                    format!(
                        "`pub fn {name}(&mut self` in state.rs: a State changes only by folding a \
                         Fact (State::fold); make it private and reach it from fold"
                    ),
                )
            })
        })
        .collect()
}

/// The apply's stages, as docs/architecture.md's "What a tick does" numbers them: the functions
/// of `tick/stages.rs` (fetch, check, the secrets, stage, pull, promote) and the start and its
/// looks (`tick/fallback.rs`, `tick/look.rs`).
const STAGES: &[&str] = &[
    "fetch",
    "check",
    "read_secrets",
    "stage",
    "pull",
    "promote",
    "start_fits",
    "up_healthy",
    "judge_what_runs",
];

/// Rule: a stage of the apply is a function, never a method of the tick: none of [`STAGES`] in
/// `tick/` takes a `self`, so its arguments are what it reads and its result is what it found;
/// and `tick/stages.rs`, the stages' own file, holds no `&mut self` method and no `impl Run`
/// (the tick's run, whose `record` is the one fold).
fn stages(file: &str, src: &Masked) -> Vec<Violation> {
    let code = src.code.as_str();
    let own_file = file == "monky-deployd/src/tick/stages.rs";
    let mut found: Vec<Violation> = code
        .match_indices("fn ")
        .filter(|(at, _)| *at == 0 || !ident_char(code.as_bytes()[at - 1]))
        .filter_map(|(at, _)| {
            let rest = &code[at + 3..];
            let name_end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
            let name = &rest[..name_end];
            let args = rest[name_end..]
                .trim_start()
                .strip_prefix('(')?
                .trim_start();
            let receiver = args.strip_prefix('&').unwrap_or(args).trim_start();
            let receiver = receiver
                .strip_prefix("mut ")
                .unwrap_or(receiver)
                .trim_start();
            let takes_self = receiver.starts_with("self")
                && !receiver[4..].starts_with(|c: char| c.is_alphanumeric() || c == '_');
            if STAGES.contains(&name) && takes_self {
                return Some(src.at(
                    file,
                    at,
                    format!(
                        "the stage `{name}` is a method: a stage is a function whose arguments are \
                         what it reads (the Agent, the state, this tick's judged memo) and whose \
                         result is what it found, for the tick's one fold"
                    ),
                ));
            }
            (own_file && args.starts_with("&mut self")).then(|| {
                src.at(
                    file,
                    at,
                    format!(
                        "`fn {name}(&mut self` in tick/stages.rs: a stage writes nothing it \
                         was not handed; return what it found instead"
                    ),
                )
            })
        })
        .collect();
    if own_file {
        found.extend(words(code, "impl").filter_map(|at| {
            let rest = code[at + 4..].trim_start();
            rest.starts_with("Run").then(|| {
                src.at(
                    file,
                    at,
                    "`impl Run` in tick/stages.rs: the stages are functions over the Agent and \
                     what they read, never the tick's run"
                        .to_string(),
                )
            })
        }));
    }
    found
}

/// Rule: a wait that grows with a count is a `monky_deployd::backoff::Backoff`, whose module
/// holds the one formula: no other shipped code raises to a power (`pow`, `powi`, `powf`,
/// `checked_pow`, ...) or shifts by a computed amount (`1 << attempts`), the two ways a second
/// exponential backoff is written. A shift by a literal (`16 << 20`, a size) is no formula.
/// `monky-bundle`, which never waits, parses its size units with a computed shift.
fn backoff_formulas(file: &str, src: &Masked) -> Vec<Violation> {
    let code = src.code.as_str();
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for word in [
        "pow",
        "powi",
        "powf",
        "checked_pow",
        "saturating_pow",
        "wrapping_pow",
        "overflowing_pow",
        "strict_pow",
    ] {
        for at in words(code, word) {
            let called = code[at + word.len()..].trim_start().starts_with(['(', ':']);
            let method_or_path = code[..at].trim_end().ends_with(['.', ':']);
            if called && method_or_path {
                found.push(src.at(
                    file,
                    at,
                    format!(
                        "raises to a power (`{word}`): a growing wait is a `Backoff` \
                         (monky-deployd/src/backoff.rs), the one formula"
                    ),
                ));
            }
        }
    }
    for (at, _) in code.match_indices("<<") {
        // `<<` of `<<=` or a generic's `<<` (`Vec<<T as X>::Y>`) is not a shift by a count.
        if at > 0 && bytes[at - 1] == b'<' || bytes.get(at + 2) == Some(&b'<') {
            continue;
        }
        let rhs = code[at + 2..].trim_start_matches('=').trim_start();
        let literal = rhs.starts_with(|c: char| c.is_ascii_digit());
        let generic = code[..at]
            .trim_end()
            .ends_with(|c: char| c.is_alphanumeric() || c == '_')
            && rhs.starts_with(|c: char| c.is_uppercase());
        if !literal && !generic {
            found.push(
                src.at(
                    file,
                    at,
                    "shifts by a computed amount (`1 << n`): a growing wait is a `Backoff` \
                 (monky-deployd/src/backoff.rs), the one formula"
                        .into(),
                ),
            );
        }
    }
    found
}

/// Rule: a step of the tick fails with a `Failure`, whose code is required, never with an
/// `anyhow` error that would reach the outcome as a generic `FAILED`; a lower module's error
/// is given its code where the step calls it (`OrCode::or_code`).
fn uncoded_steps(file: &str, src: &Masked) -> Vec<Violation> {
    let code = src.code.as_str();
    ["-> anyhow::Result", "-> anyhow::Error", "Result<Exit>"]
        .iter()
        .flat_map(|pattern| code.match_indices(pattern))
        .map(|(at, m)| {
            src.at(
                file,
                at,
                format!(
                    "`{m}` in a step of the tick: return `Result<_, Failure>` and name the code \
                     of a lower module's error with `or_code`"
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str) -> &'static CodeRule {
        RULES.iter().find(|r| r.name == name).unwrap()
    }

    /// The violations of `rule` in `text` as `file:line`, if the rule applies to `file`.
    fn check(rule_name: &str, file: &str, text: &str) -> Vec<String> {
        let rule = rule(rule_name);
        if !(rule.applies)(file) {
            return Vec::new();
        }
        let mut found = (rule.check)(file, &Masked::new(text));
        found.sort_by_key(|v| v.line);
        found
            .into_iter()
            .map(|v| format!("{}:{}", v.file, v.line))
            .collect()
    }

    #[test]
    fn masking_keeps_lines_and_hides_comments_strings_and_tests() {
        let text = "let a = \"x // y\"; // Command::new\n\
                    /* outer /* nested \"q\" */ still */ let b = r#\"a \"quoted\" b\"#;\n\
                    let c = '\"'; let l: &'static str = b\"z\";\n\
                    #[cfg(test)]\nmod tests {\n    fn f() { \"in test\"; }\n}\nlet d = \"after\";\n";
        let m = Masked::new(text);
        assert_eq!(m.code.len(), text.len());
        assert_eq!(m.code.lines().count(), text.lines().count());
        assert!(!m.code.contains("Command"), "{}", m.code);
        assert!(!m.code.contains("nested") && !m.code.contains("in test"));
        let strings: Vec<(usize, &str)> = m
            .strings
            .iter()
            .map(|(at, s)| (m.line(*at), s.as_str()))
            .collect();
        assert_eq!(
            strings,
            [(1, "x // y"), (2, "a \"quoted\" b"), (3, "z"), (8, "after"),]
        );
    }

    #[test]
    fn a_planted_print_is_named_with_its_line() {
        const RULE: &str = "prints";
        let planted = "fn f() {\n    println!(\"{x}\");\n    outln!(\"ok\");\n\
                       let _ = std::io::stdout().lock();\n    eprint!(\"x\");\n}\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/status.rs", planted),
            [
                "monky-deployd/src/status.rs:2",
                "monky-deployd/src/status.rs:4",
                "monky-deployd/src/status.rs:5"
            ]
        );
        assert!(check(RULE, "monky-deployd/src/lib.rs", planted).is_empty());
    }

    #[test]
    fn a_planted_spawn_is_named_with_its_line() {
        const RULE: &str = "spawns";
        let planted = "//! The agent.\n\
                       use std::process::{Child, Command};\n\
                       fn f() {\n    let _ = std::process::Command::new(\"sh\");\n}\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/doctor.rs", planted),
            [
                "monky-deployd/src/doctor.rs:2",
                "monky-deployd/src/doctor.rs:4"
            ]
        );
        assert_eq!(
            check(
                RULE,
                "monky-bundle/src/lib.rs",
                "fn f() { Command::new(x); }"
            ),
            ["monky-bundle/src/lib.rs:1"]
        );
        // The wrapper, test support, xtask and tests may spawn; unit tests anywhere too.
        for file in [
            "monky-compose/src/process.rs",
            "monky-testkit/src/bao/real.rs",
            "xtask/src/cmd.rs",
            "monky-deployd/tests/util.rs",
            "monky-deployd/benches/perf.rs",
            "monky-deployd/examples/devpeers.rs",
        ] {
            assert_eq!(check(RULE, file, planted), Vec::<String>::new(), "{file}");
        }
        let quiet = "/// Runs `Command::new`.\nfn f() { clap::Command::new(\"m\"); g(\"Command::new\"); }\n\
                     #[cfg(test)]\nmod tests {\n  fn t() { std::process::Command::new(\"sh\"); }\n}\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/lib.rs", quiet),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_planted_state_root_name_is_named_with_its_line() {
        const RULE: &str = "state-root";
        let planted = "fn f(cfg: &Config) {\n\
                       let t = cfg.state_dir.join(\"bao.token\");\n\
                       let r = Dir::state_root(&cfg.state_dir)?;\n\
                       r.swap_symlink(&Path::new(\"releases\").join(sha), \"current\")?;\n\
                       let res = Some(\"failed\"); let k = doc[\"hold\"];\n\
                       }\n\
                       const DIR: &str = \"failed\";\n\
                       pub fn state_root(p: &Path) {}\n\
                       #[cfg(test)]\nmod tests { const F: &str = \"state.json\"; }\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/status.rs", planted),
            [
                // "bao.token" and `state_dir.join`.
                "monky-deployd/src/status.rs:2",
                "monky-deployd/src/status.rs:2",
                "monky-deployd/src/status.rs:3",
                // "releases", and "current" as a path call's second argument.
                "monky-deployd/src/status.rs:4",
                "monky-deployd/src/status.rs:4",
                "monky-deployd/src/status.rs:7",
            ]
        );
        assert_eq!(
            check(RULE, "monky-deployd/src/layout.rs", planted),
            Vec::<String>::new()
        );
        assert_eq!(
            check(RULE, "monky-compose/src/lib.rs", planted),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_planted_outcome_write_is_named_with_its_line() {
        const RULE: &str = "outcome-fields";
        let planted = "fn f(st: &mut State) {\n\
                       st.last_result = Some(r);\n\
                       if st.last_error == None { st.failed_sha.take(); }\n\
                       self.state.failed = None; st.last_code += 1;\n\
                       let e = st.last_error.clone();\n\
                       }\n\
                       #[cfg(test)]\nmod tests { fn t(st: &mut State) { st.last_result = None; } }\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/watchdog.rs", planted),
            [
                "monky-deployd/src/watchdog.rs:2",
                "monky-deployd/src/watchdog.rs:3",
                "monky-deployd/src/watchdog.rs:4",
                "monky-deployd/src/watchdog.rs:4",
            ]
        );
        for file in [
            "monky-deployd/src/state.rs",
            "monky-deployd/src/state/failed.rs",
        ] {
            assert_eq!(check(RULE, file, planted), Vec::<String>::new(), "{file}");
        }
    }

    #[test]
    fn a_planted_fold_is_named_with_its_line() {
        const RULE: &str = "folds";
        let planted = "fn f(st: &mut State) {\n\
                       st.fold(Fact::TickBegan);\n\
                       let n = xs.iter().fold(0, |a, b| a + b);\n\
                       st.fold( state::Fact::FailureForgotten);\n\
                       }\n\
                       #[cfg(test)]\nmod tests { fn t(st: &mut State) { st.fold(Fact::TickBegan); } }\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/status.rs", planted),
            [
                "monky-deployd/src/status.rs:2",
                "monky-deployd/src/status.rs:4"
            ]
        );
        for file in [
            "monky-deployd/src/state.rs",
            "monky-deployd/src/tick.rs",
            "monky-deployd/src/watchdog.rs",
        ] {
            assert_eq!(check(RULE, file, planted), Vec::<String>::new(), "{file}");
        }
    }

    #[test]
    fn a_planted_setter_of_state_is_named_with_its_line() {
        const RULE: &str = "one-fold";
        let planted = "impl State {\n\
                       pub fn fold(&mut self, fact: Fact) {}\n\
                       pub fn forget(&mut self) {}\n\
                       pub(crate) fn save(&self) {}\n\
                       fn record(&mut self) {}\n\
                       pub(crate) fn mark(\n        &mut self,\n    ) {}\n\
                       }\n\
                       #[cfg(test)]\nimpl State { pub fn patch(&mut self) {} }\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/state.rs", planted),
            [
                "monky-deployd/src/state.rs:3",
                "monky-deployd/src/state.rs:6"
            ]
        );
        assert!(check(RULE, "monky-deployd/src/hold.rs", planted).is_empty());
    }

    #[test]
    fn a_stage_that_is_a_method_of_the_tick_is_named_with_its_line() {
        const RULE: &str = "stages";
        let planted = "impl Run<'_> {\n\
                       pub(super) fn pull(&self, staged: Staged) {}\n\
                       fn record(&mut self) {}\n\
                       }\n\
                       impl Agent<'_> {\n\
                       pub(super) fn judge(&self) {}\n\
                       fn up_healthy(\n        &mut self,\n    ) {}\n\
                       }\n\
                       pub(super) fn fetch(agent: &Agent, sha: &Sha) {}\n\
                       fn prefetch(&mut self) {}\n\
                       #[cfg(test)]\nmod tests { fn check(&self) {} }\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/tick/stages.rs", planted),
            [
                "monky-deployd/src/tick/stages.rs:1",
                "monky-deployd/src/tick/stages.rs:2",
                "monky-deployd/src/tick/stages.rs:3",
                "monky-deployd/src/tick/stages.rs:7",
                "monky-deployd/src/tick/stages.rs:12"
            ]
        );
        // Beside the stages' own file a method of the tick is allowed; a stage as one is not.
        assert_eq!(
            check(RULE, "monky-deployd/src/tick/fallback.rs", planted),
            [
                "monky-deployd/src/tick/fallback.rs:2",
                "monky-deployd/src/tick/fallback.rs:7"
            ]
        );
        // The stages as they are: functions of what they read.
        let held = "pub(super) fn fetch(agent: &Agent, bearer: &SecretString) {}\n\
                    pub(super) fn up_healthy(agent: &Agent, state: &State) -> (Seen, R) {}\n\
                    impl Agent<'_> { fn policy_gate(&self, judged: &RefCell<Judged>) {} }\n";
        assert!(check(RULE, "monky-deployd/src/tick/stages.rs", held).is_empty());
        assert!(check(RULE, "monky-deployd/src/release.rs", planted).is_empty());
    }

    #[test]
    fn a_planted_uncoded_step_is_named_with_its_line() {
        const RULE: &str = "coded-steps";
        let planted = "fn a(&self) -> anyhow::Result<()> {}\n\
                       fn b(&self) -> Result<(), Failure> {}\n\
                       fn c(e: &anyhow::Error) -> anyhow::Error { e }\n\
                       #[cfg(test)]\nmod tests { fn t() -> anyhow::Result<()> { Ok(()) } }\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/tick/stages.rs", planted),
            [
                "monky-deployd/src/tick/stages.rs:1",
                "monky-deployd/src/tick/stages.rs:3"
            ]
        );
        assert_eq!(
            check(RULE, "monky-deployd/src/tick.rs", planted),
            ["monky-deployd/src/tick.rs:1", "monky-deployd/src/tick.rs:3"]
        );
        for file in [
            "monky-deployd/src/tick/bootstrap.rs",
            "monky-deployd/src/release.rs",
            "monky-deployd/src/ticker.rs",
        ] {
            assert_eq!(check(RULE, file, planted), Vec::<String>::new(), "{file}");
        }
    }

    #[test]
    fn a_planted_exit_is_named_with_its_line() {
        const RULE: &str = "exits";
        let planted = "fn f() {\n    std::process::exit(1);\n    let e = exit(2);\n\
                       process::exit (3)\n}\n";
        assert_eq!(
            check(RULE, "monky-compose/src/process.rs", planted),
            [
                "monky-compose/src/process.rs:2",
                "monky-compose/src/process.rs:4"
            ]
        );
        for file in [
            "monky-deployd/src/lib.rs",
            "monky-deployd/src/watchdog.rs",
            "monky-deployd/benches/perf.rs",
            "monky-testkit/src/bao/real.rs",
            "xtask/src/main.rs",
        ] {
            assert_eq!(check(RULE, file, planted), Vec::<String>::new(), "{file}");
        }
    }

    #[test]
    fn a_planted_module_path_is_named_with_its_line() {
        const RULE: &str = "no-path-modules";
        let planted = "//! A crate.\n\
                       #[path = \"../../other/src/connect.rs\"]\n\
                       pub mod connect;\n\
                       #[cfg_attr(unix, path = \"unix.rs\")]\nmod sys;\n\
                       #[ path= \"x.rs\" ]\nmod x;\n";
        assert_eq!(
            check(RULE, "monky-agent-proto/src/lib.rs", planted),
            [
                "monky-agent-proto/src/lib.rs:2",
                "monky-agent-proto/src/lib.rs:4",
                "monky-agent-proto/src/lib.rs:6",
            ]
        );
        assert_eq!(
            check(RULE, "xtask/src/openbao.rs", planted),
            [
                "xtask/src/openbao.rs:2",
                "xtask/src/openbao.rs:4",
                "xtask/src/openbao.rs:6",
            ]
        );
        // Outside a crate's `src/` (a bench sharing its tests' helpers), and a mention in a
        // comment, a string, a plain path or a test, are no violation.
        assert!(check(RULE, "monky-deployd/benches/perf.rs", planted).is_empty());
        let quiet = "/// Not `#[path = \"x\"]`.\nfn f(path: &Path) { let p = path; g(\"#[path = x]\"); }\n\
                     #[derive(Debug)]\nstruct S { path: String }\n\
                     #[cfg(test)]\nmod tests {\n  #[path = \"t.rs\"]\n  mod t;\n}\n";
        assert_eq!(
            check(RULE, "monky-bundle/src/lib.rs", quiet),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_planted_backoff_formula_is_named_with_its_line() {
        const RULE: &str = "one-backoff";
        let planted = "fn wait(n: u32) -> u64 {\n\
                       let a = 60u64 << n.saturating_sub(1);\n\
                       let b = 2f64.powi(n as i32); let c = 2u64.pow(n);\n\
                       let d = u64::checked_pow(2, n);\n\
                       let mut e = 1u64; e <<= n;\n\
                       a\n}\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/runloop.rs", planted),
            [
                "monky-deployd/src/runloop.rs:2",
                "monky-deployd/src/runloop.rs:3",
                "monky-deployd/src/runloop.rs:3",
                "monky-deployd/src/runloop.rs:4",
                "monky-deployd/src/runloop.rs:5",
            ]
        );
        assert_eq!(
            check(RULE, "monky-http/src/lib.rs", planted).len(),
            5,
            "every shipped crate that may wait"
        );
        // The one formula's own module, the size grammars of the crate that never waits, test
        // support and tests are no violation; nor are sizes, generics, comments, strings and
        // unit tests.
        for file in [
            "monky-deployd/src/backoff.rs",
            "monky-bundle/src/budget.rs",
            "monky-testkit/src/lib.rs",
            "monky-deployd/tests/heal.rs",
            "xtask/src/bench.rs",
        ] {
            assert_eq!(check(RULE, file, planted), Vec::<String>::new(), "{file}");
        }
        let quiet = "/// Not `1 << n` nor `x.pow(2)`.\n\
                     const MAX: u64 = 16 << 20; let w = u64::from(hi) << 32 | lo;\n\
                     fn f(pow: u32) -> Vec<<T as X>::Y> { g(\"a << b\", pow) }\n\
                     #[cfg(test)]\nmod tests { fn t(n: u32) { let _ = 1 << n; } }\n";
        assert_eq!(
            check(RULE, "monky-deployd/src/config.rs", quiet),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_violation_prints_as_file_line_and_rule() {
        let v = Violation {
            file: "monky-deployd/src/a.rs".into(),
            line: 7,
            what: "spawns".into(),
        };
        assert_eq!(v.to_string(), "monky-deployd/src/a.rs:7: spawns");
    }
}
