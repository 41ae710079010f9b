//! The rule "no crate's module graph has a circle", over each crate's `src/` files.
//!
//! The nodes of a graph are the modules below one module: the crate's top-level modules
//! (`src/foo.rs` and `src/foo/…` are `foo`), and the child modules of each directory module
//! (`src/foo/bar.rs` and an inline `mod bar { … }` in `src/foo.rs` are `foo::bar`). An edge is a
//! `crate::…`, `super::…` or `self::…` path, in a `use` or in code, that names a module: it
//! joins the two modules below the place where the referring module and the named one part.
//! The files are masked as the code rules mask them, so comments, strings and `#[cfg(test)]`
//! items make no edge. A re-export is not followed: `crate::Name` is the crate root's.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

use super::code::{Masked, ident_char, ident_start, rust_files, words};

/// The rule's name, as docs/architecture.md states it.
pub const RULE: &str = "no crate's module graph has a circle";

/// A module path from the crate root (`[]` is the root).
type ModPath = Vec<String>;

/// Each graph, keyed by the module its nodes are children of: node -> node it refers to ->
/// where it first does (file, 1-based line).
type Graphs = BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, (String, usize)>>>;

/// Every circle in the crates below `root` (each folder with a `Cargo.toml` and a `src/`), one
/// line each.
pub fn check_tree(root: &Path) -> Result<Vec<String>> {
    let mut crates: Vec<_> = fs::read_dir(root)
        .with_context(|| format!("cannot read {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .collect();
    crates.sort();
    let mut found = Vec::new();
    for dir in crates {
        let src = dir.join("src");
        let mut paths = Vec::new();
        rust_files(&src, &mut paths)?;
        let mut files = Vec::new();
        for path in paths {
            let rel = path
                .strip_prefix(&src)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            let text = fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            files.push((rel, text));
        }
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        found.extend(circles(&name, &files));
    }
    Ok(found)
}

/// The circles of crate `krate`, whose `src/` holds `files` (path below `src/`, text).
pub fn circles(krate: &str, files: &[(String, String)]) -> Vec<String> {
    let files: Vec<(&str, ModPath, Masked)> = files
        .iter()
        .filter(|(rel, _)| !rel.starts_with("bin/"))
        .map(|(rel, text)| (rel.as_str(), file_module(rel), Masked::new(text)))
        .collect();
    let mut modules: BTreeSet<ModPath> = BTreeSet::new();
    let mut inline = Vec::new();
    for (_, path, masked) in &files {
        for n in 1..=path.len() {
            modules.insert(path[..n].to_vec());
        }
        let mods = inline_modules(masked.code());
        for (_, _, names) in &mods {
            modules.insert(path.iter().chain(names).cloned().collect());
        }
        inline.push(mods);
    }
    let mut graphs = Graphs::new();
    for ((rel, path, masked), mods) in files.iter().zip(&inline) {
        let code = masked.code();
        for head in ["crate", "super", "self"] {
            for at in words(code, head) {
                if code[..at].trim_end().ends_with("::") {
                    continue;
                }
                let mut here = path.clone();
                if let Some((_, _, names)) = mods
                    .iter()
                    .filter(|(start, end, _)| (*start..*end).contains(&at))
                    .max_by_key(|(_, _, names)| names.len())
                {
                    here.extend(names.iter().cloned());
                }
                for segments in use_tree(code, at) {
                    let Some(target) = resolve(&here, &segments) else {
                        continue;
                    };
                    let common = here.iter().zip(&target).take_while(|(a, b)| a == b).count();
                    if common >= here.len()
                        || common >= target.len()
                        || !modules.contains(&target[..=common])
                    {
                        continue;
                    }
                    graphs
                        .entry(target[..common].to_vec())
                        .or_default()
                        .entry(here[common].clone())
                        .or_default()
                        .entry(target[common].clone())
                        .or_insert_with(|| (rel.to_string(), masked.line(at)));
                }
            }
        }
    }
    let mut found = Vec::new();
    for (parent, graph) in &graphs {
        let name = |node: &str| {
            parent
                .iter()
                .map(String::as_str)
                .chain([node])
                .collect::<Vec<_>>()
                .join("::")
        };
        let mut covered = BTreeSet::new();
        for start in graph.keys() {
            if covered.contains(start) {
                continue;
            }
            let Some(cycle) = shortest_cycle(graph, start) else {
                continue;
            };
            let names: Vec<String> = cycle.iter().map(|n| name(n)).collect();
            let places: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let (file, line) = &graph[&w[0]][&w[1]];
                    format!("src/{file}:{line} uses {}", name(&w[1]))
                })
                .collect();
            found.push(format!(
                "{krate}: circle {} ({})",
                names.join(" -> "),
                places.join(", ")
            ));
            covered.extend(cycle);
        }
    }
    found
}

/// The module a file below `src/` is: `lib.rs` and `main.rs` the root, `a/mod.rs` and `a.rs`
/// `a`, `a/b.rs` `a::b`.
fn file_module(rel: &str) -> ModPath {
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut path: ModPath = rel.split('/').map(str::to_owned).collect();
    if path.len() == 1 && (path[0] == "lib" || path[0] == "main") || path.last().unwrap() == "mod" {
        path.pop();
    }
    path
}

/// The inline `mod name { … }` items of masked `code`: their byte range and their path below
/// the file's module.
fn inline_modules(code: &str) -> Vec<(usize, usize, ModPath)> {
    let bytes = code.as_bytes();
    let mut found: Vec<(usize, usize, ModPath)> = Vec::new();
    for at in words(code, "mod") {
        let rest = &code[at + 3..];
        let name_start = rest.len() - rest.trim_start().len();
        let name: String = rest[name_start..]
            .bytes()
            .take_while(|b| ident_char(*b))
            .map(char::from)
            .collect();
        let after = rest[name_start + name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0usize;
        let mut end = code.len();
        for (j, b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        let mut path: ModPath = found
            .iter()
            .filter(|(s, e, _)| (*s..*e).contains(&at))
            .max_by_key(|(_, _, p)| p.len())
            .map(|(_, _, p)| p.clone())
            .unwrap_or_default();
        path.push(name);
        found.push((at, end, path));
    }
    found
}

/// The paths of the use tree (or plain path) that starts at `at` in `code`, each as its
/// segments: `crate::a::{b, c::D}` is `[crate, a, b]` and `[crate, a, c, D]`.
fn use_tree(code: &str, at: usize) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = at;
    tree(code.as_bytes(), &mut i, &mut Vec::new(), &mut out);
    out
}

fn skip_space(code: &[u8], i: &mut usize) {
    while *i < code.len() && code[*i].is_ascii_whitespace() {
        *i += 1;
    }
}

/// One use tree at `*i`, below `prefix`: a path, a `{…}` group, or `*`.
fn tree(code: &[u8], i: &mut usize, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let depth = prefix.len();
    loop {
        skip_space(code, i);
        if code.get(*i) == Some(&b'{') {
            *i += 1;
            loop {
                skip_space(code, i);
                match code.get(*i) {
                    None => break,
                    Some(b'}') => {
                        *i += 1;
                        break;
                    }
                    Some(b',') => *i += 1,
                    Some(_) => {
                        let before = *i;
                        tree(code, i, prefix, out);
                        if *i == before {
                            *i += 1;
                        }
                    }
                }
            }
            break;
        }
        if !code.get(*i).is_some_and(|b| ident_start(*b)) {
            out.push(prefix.clone());
            break;
        }
        let start = *i;
        while *i < code.len() && ident_char(code[*i]) {
            *i += 1;
        }
        prefix.push(String::from_utf8_lossy(&code[start..*i]).into_owned());
        let mut j = *i;
        skip_space(code, &mut j);
        if code[j..].starts_with(b"::") {
            *i = j + 2;
        } else {
            out.push(prefix.clone());
            // `as name` and whatever follows a path in code end it.
            break;
        }
    }
    prefix.truncate(depth);
}

/// The module path that `segments` (starting with `crate`, `super` or `self`) names from the
/// module `here`, or `None` where it climbs above the root.
fn resolve(here: &[String], segments: &[String]) -> Option<ModPath> {
    let mut path: ModPath = match segments.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        _ => here.to_vec(),
    };
    for (n, segment) in segments.iter().enumerate() {
        match segment.as_str() {
            "crate" if n == 0 => {}
            "self" => {}
            "super" => {
                path.pop()?;
            }
            _ => path.push(segment.clone()),
        }
    }
    Some(path)
}

/// The shortest path from `start` back to itself in `graph`, both ends included.
fn shortest_cycle(
    graph: &BTreeMap<String, BTreeMap<String, (String, usize)>>,
    start: &String,
) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
    let mut todo = VecDeque::from([start]);
    while let Some(node) = todo.pop_front() {
        for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            if next == start {
                let mut cycle = vec![start.clone(), node.clone()];
                let mut at = node;
                while at != start {
                    at = came_from[at];
                    cycle.push(at.clone());
                }
                cycle.reverse();
                return Some(cycle);
            }
            if !came_from.contains_key(next) {
                came_from.insert(next, node);
                todo.push_back(next);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(files: &[(&str, &str)]) -> Vec<String> {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect();
        circles("monky-x", &files)
    }

    #[test]
    fn a_planted_two_module_circle_is_named() {
        let files = [
            ("lib.rs", "mod code;\nmod exit;\n"),
            ("code.rs", "//! Codes.\nuse crate::exit::Class;\n"),
            (
                "exit.rs",
                "//! Exits.\n\nfn f() { super::code::Code::A; }\n",
            ),
        ];
        assert_eq!(
            check(&files),
            [
                "monky-x: circle code -> exit -> code (src/code.rs:2 uses exit, \
              src/exit.rs:3 uses code)"
            ]
        );
    }

    #[test]
    fn a_circle_of_siblings_in_a_directory_module_is_named() {
        let files = [
            ("lib.rs", "mod tick;\n"),
            ("tick.rs", "mod a;\nmod b;\nuse a::X;\n"),
            ("tick/a.rs", "use crate::tick::{b::{self, Y}, Z};\n"),
            ("tick/b.rs", "use super::{a as other};\n"),
        ];
        assert_eq!(
            check(&files),
            [
                "monky-x: circle tick::a -> tick::b -> tick::a (src/tick/a.rs:1 uses tick::b, \
              src/tick/b.rs:1 uses tick::a)"
            ]
        );
    }

    #[test]
    fn a_dag_passes() {
        let files = [
            ("lib.rs", "mod a;\nmod b;\nmod c;\npub use a::A;\n"),
            // Items of the root, children, and the parent are no edges to a sibling.
            (
                "a.rs",
                "use crate::{b::B, c};\nuse super::A;\nmod inner { use super::X; }\n",
            ),
            ("b.rs", "use crate::c::C;\nuse self::x::Y;\nmod x;\n"),
            ("b/x.rs", "use super::super::c::D;\n"),
            (
                "c.rs",
                "pub(crate) struct C; fn f() -> Self::Out { $crate::Z }\n",
            ),
        ];
        assert_eq!(check(&files), Vec::<String>::new());
    }

    #[test]
    fn comments_strings_and_tests_make_no_edge() {
        let files = [
            ("a.rs", "use crate::b::B;\n"),
            (
                "b.rs",
                "// crate::a::A\nconst S: &str = \"crate::a\";\n\
                 #[cfg(test)]\nmod tests { use crate::a::A; }\n",
            ),
        ];
        assert_eq!(check(&files), Vec::<String>::new());
    }
}
