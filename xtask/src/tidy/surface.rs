//! The rule "the agent's library exports only what another crate uses": each `pub` item of
//! `monky-deployd/src` (a function, type, trait, constant, static, module, re-export or named
//! field, outside `#[cfg(test)]`) is named somewhere in the code that builds against the
//! library from outside: the binary's `main.rs`, its integration tests, benches and examples,
//! and the fuzz workspace. Anything else is `pub(crate)`.
//!
//! The check is by name, not by resolved path: a `pub fn new` is used when any outside file
//! says `new`. So it can miss an export that shares its name with one in use, but it never
//! refuses one that is used. The files are masked as the code rules mask them, so a mention in
//! a comment or a string keeps nothing public.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

use super::code::{Masked, Violation, ident_char, rust_files};

/// The rule's name, as docs/architecture.md's `Held by:` sentences name it.
pub const RULE: &str = "agent-pub-used";

/// The library's sources, relative to the workspace root.
const LIB: &str = "monky-deployd/src";

/// The code outside the library that builds against it: a file, or a folder of them.
const USERS: &[&str] = &[
    "monky-deployd/src/main.rs",
    "monky-deployd/tests",
    "monky-deployd/benches",
    "monky-deployd/examples",
    "fuzz",
];

/// The item keywords that a `pub` may come before (after `unsafe`/`async`/`extern` ones).
const ITEMS: &[&str] = &[
    "fn", "struct", "enum", "union", "trait", "type", "const", "static", "mod", "use",
];

/// Every `pub` item of the library below `root` that no outside user names.
pub fn check_tree(root: &Path) -> Result<Vec<Violation>> {
    let mut used = BTreeSet::new();
    for user in USERS {
        let path = root.join(user);
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files)?;
        } else if path.is_file() {
            files.push(path);
        }
        for file in files {
            let text = fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            // An outside user's own tests use the library too: they are not masked away.
            used.extend(idents(&blank_comments(&text)));
        }
    }
    let mut files = Vec::new();
    rust_files(&root.join(LIB), &mut files)?;
    files.sort();
    let mut found = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .to_string_lossy()
            .replace('\\', "/");
        if USERS.contains(&rel.as_str()) {
            continue;
        }
        let text =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        found.extend(items(&rel, &Masked::new(&text)));
    }
    Ok(unreached(found, &used))
}

/// The library file's masked code without its string literals' contents: the outside users'
/// code is read the same way, minus the test masking.
fn blank_comments(text: &str) -> String {
    // Masking hides `#[cfg(test)]` items too; an outside user's unit tests are rare and
    // would only make the rule stricter, so its whole text counts but for comments and
    // strings, which `Masked` blanks the same way.
    let marker = "#[cfg(test)]";
    Masked::new(&text.replace(marker, &" ".repeat(marker.len())))
        .code()
        .to_owned()
}

/// The identifiers in `code`.
fn idents(code: &str) -> impl Iterator<Item = String> + '_ {
    code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty() && !w.starts_with(|c: char| c.is_ascii_digit()))
        .map(str::to_owned)
}

/// A `pub` item of the library: where it is, its name and its declaration (a function's
/// signature, a field's type, a trait's body), whose types an outside user reaches through it.
struct Item {
    file: String,
    line: usize,
    name: String,
    decl: String,
}

/// The `pub` items of `src`, the library file `file`.
fn items(file: &str, src: &Masked) -> Vec<Item> {
    let code = src.code();
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for (at, _) in code.match_indices("pub") {
        let end = at + 3;
        if at > 0 && ident_char(bytes[at - 1]) || end >= bytes.len() || ident_char(bytes[end]) {
            continue;
        }
        let rest = &code[end..];
        // `pub(crate)`, `pub(super)`, `pub(in ..)`: not exported.
        if rest.trim_start().starts_with('(') {
            continue;
        }
        let decl = declaration(rest).to_owned();
        for name in item_names(rest) {
            found.push(Item {
                file: file.to_owned(),
                line: src.line(at),
                name,
                decl: decl.clone(),
            });
        }
    }
    found
}

/// The declaration that starts `rest`: up to a body's `{` or the `;`, a field's to its line's
/// end, a trait's with its body.
fn declaration(rest: &str) -> &str {
    let head = rest.find(['{', ';']).map_or(rest, |n| &rest[..n]);
    let line = rest.find('\n').map_or(rest, |n| &rest[..n]);
    let first = rest.split_whitespace().next().unwrap_or("");
    if first == "trait" {
        let mut depth = 0usize;
        for (n, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth <= 1 => return &rest[..n],
                '}' => depth -= 1,
                ';' if depth == 0 => return &rest[..n],
                _ => {}
            }
        }
        return rest;
    }
    if ITEMS.contains(&first) || first.starts_with("fn") {
        head
    } else {
        // A field, or a qualified `const fn` / `unsafe fn`: the shorter of the two ends.
        if line.len() < head.len() { line } else { head }
    }
}

/// The `items` that neither an outside user names (`used`) nor a used item's declaration
/// reaches (a type in a used function's signature or field).
fn unreached(items: Vec<Item>, used: &BTreeSet<String>) -> Vec<Violation> {
    let mut reached = used.clone();
    loop {
        let before = reached.len();
        let more: Vec<String> = items
            .iter()
            .filter(|i| reached.contains(&i.name))
            .flat_map(|i| idents(&i.decl))
            .collect();
        reached.extend(more);
        if reached.len() == before {
            break;
        }
    }
    items
        .into_iter()
        .filter(|i| !reached.contains(&i.name))
        .map(|i| Violation {
            file: i.file,
            line: i.line,
            what: format!(
                "`pub` item `{}` of the agent's library is used by no other crate (main.rs, \
                 tests, benches, examples, fuzz), nor in a signature they use: make it \
                 `pub(crate)`",
                i.name
            ),
        })
        .collect()
}

/// The names a `pub` before `rest` exports: an item's (each name a `use` brings in, or its
/// alias), or a named field's. None for a tuple field and for what is not an item.
fn item_names(rest: &str) -> Vec<String> {
    let ident = |w: &str| -> String {
        w.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let words: Vec<&str> = rest.split_whitespace().take(6).collect();
    let mut at = 0;
    // Qualifiers of a function: `const fn`, `unsafe fn`, `async fn`, `extern "C" fn`.
    while let (Some(w), Some(next)) = (words.get(at), words.get(at + 1)) {
        let qualifier = matches!(*w, "unsafe" | "async" | "extern" | "\"C\"")
            || (*w == "const"
                && matches!(ident(next).as_str(), "fn" | "unsafe" | "async" | "extern"));
        if !qualifier {
            break;
        }
        at += 1;
    }
    let Some(word) = words.get(at) else {
        return Vec::new();
    };
    if ident(word) == "use" {
        let Some(start) = rest.find("use") else {
            return Vec::new();
        };
        let path = rest[start + 3..].split(';').next().unwrap_or("");
        // Each name of the path's group (or the path's last), or what it is renamed to.
        let tail = path.rsplit("::").next().unwrap_or(path);
        return tail
            .split(['{', '}', ','])
            .filter_map(|part| part.split_whitespace().last())
            .map(ident)
            .filter(|n| !n.is_empty() && n != "self")
            .collect();
    }
    if ITEMS.contains(&ident(word).as_str()) {
        let name = words.get(at + 1).map(|w| ident(w)).unwrap_or_default();
        return if name.is_empty() {
            Vec::new()
        } else {
            vec![name]
        };
    }
    // A named field: `pub name: Type`.
    let name = ident(word);
    let after = rest.trim_start()[name.len()..].trim_start();
    if !name.is_empty() && after.starts_with(':') && !after.starts_with("::") {
        vec![name]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(lib: &str, users: &str) -> Vec<String> {
        let used: BTreeSet<String> = idents(&blank_comments(users)).collect();
        unreached(items("monky-deployd/src/a.rs", &Masked::new(lib)), &used)
            .into_iter()
            .map(|v| format!("{}:{}", v.line, v.what.split('`').nth(3).unwrap_or("")))
            .collect()
    }

    #[test]
    fn a_pub_item_no_other_crate_names_is_refused_with_its_line() {
        let lib = "pub fn used() {}\n\
                   pub fn lonely() {}\n\
                   pub(crate) fn inner() {}\n\
                   pub struct Cfg {\n    pub port: u16,\n    pub(crate) key: u8,\n    pub spare: u8,\n}\n\
                   pub struct Tuple(pub u8);\n\
                   pub const MAX: u64 = 1;\n\
                   pub unsafe fn raw() {}\n\
                   pub use crate::host::VERSION;\n\
                   pub mod tick;\n\
                   pub fn used_too(x: Arg) -> Ret {}\n\
                   pub struct Arg; pub struct Ret; pub struct Orphan;\n\
                   pub trait Policy { fn owner(&self) -> Owner; }\n\
                   pub enum Owner { A }\n\
                   /// pub fn in_a_comment() {}\n\
                   #[cfg(test)]\nmod tests { pub fn helper() {} }\n";
        let users = "use monky_deployd::{used, Cfg, tick};\n\
                     fn f(c: Cfg) -> u16 { c.port + Tuple + used_too + Policy }\n\
                     // lonely raw MAX spare\n\
                     const S: &str = \"VERSION\";\n\
                     #[cfg(test)]\nmod t { fn g() { monky_deployd::raw(); } }\n";
        assert_eq!(
            check(lib, users),
            ["2:lonely", "7:spare", "10:MAX", "12:VERSION", "15:Orphan",]
        );
    }

    #[test]
    fn the_name_of_each_kind_of_item() {
        for (rest, names) in [
            (" fn run(cli: Cli)", &["run"][..]),
            (" struct Redacted(String);", &["Redacted"]),
            (" enum Exit {", &["Exit"]),
            (" const MAX: u64 = 1;", &["MAX"]),
            (" const fn wall() -> u64", &["wall"]),
            (" const unsafe fn raw()", &["raw"]),
            (" async fn go()", &["go"]),
            (" use crate::code::Exit;", &["Exit"]),
            (" use crate::host::{VERSION, NAME};", &["VERSION", "NAME"]),
            (" use crate::x::Y as Z;", &["Z"]),
            (" port: u16,", &["port"]),
            (" u8);", &[]),
            (" x::y", &[]),
        ] {
            assert_eq!(item_names(rest), names, "{rest}");
        }
    }
}
