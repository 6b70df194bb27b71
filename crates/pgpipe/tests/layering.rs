//! The crate's allowed directions (docs/ARCHITECTURE.md), checked: every
//! `crate::…` path in `src/` (outside comments and `#[cfg(test)]` parts)
//! may point only down the layers, the top-level modules import each other
//! in no circle but `pool` ↔ `builder`, and no file is longer than one
//! sitting.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, top first. A module may import its own layer's modules (no
/// circles) and any layer below; the leaves anyone may import.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "pool and handles",
        &[
            "lib", "pool", "builder", "routed", "slow", "within", "batch", "executor", "listener",
            "guide",
        ],
    ),
    ("hosts", &["hosts"]),
    ("lane", &["lane"]),
    ("exclusive", &["exclusive"]),
    ("shared", &["shared"]),
    ("conn", &["conn"]),
    ("protocol", &["protocol"]),
    (
        "leaves",
        &[
            "error",
            "config",
            "metrics",
            "trace",
            "answer",
            "status",
            "sync",
            "target",
            "pooler",
            "ordered",
            "budget",
            "statement",
        ],
    ),
];

/// The one circle allowed: the builder makes the pool, the pool hands out
/// its builder.
const ALLOWED_CIRCLE: (&str, &str) = ("builder", "pool");

/// Longest a file may be before its tests, and with them.
const MAX_LINES: usize = 400;
const MAX_LINES_WITH_TESTS: usize = 600;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`lib` for lib.rs).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// The code before `#[cfg(test)]`, without comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap();
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `code` names through `crate::`.
fn imports(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        // `$crate::` in a macro is the same crate; `foo_crate::` is not.
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::{c, d}}`: the first name of each top-level item.
            let (mut depth, mut start) = (0, 0);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.insert(ident(&group[start..j]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(ident(&group[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found.remove("");
    found
}

fn layer_of(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
        .unwrap_or_else(|| {
            panic!(
                "module `{module}` is in no layer: add it to LAYERS here and to \
                 docs/ARCHITECTURE.md"
            )
        })
}

/// Each file with the top-level modules it imports.
type PerFile = Vec<(PathBuf, BTreeSet<String>)>;
/// Each top-level module with the ones it imports.
type Edges = BTreeMap<String, BTreeSet<String>>;

/// Every file's top-level imports, and the module graph they make.
fn graph() -> (PerFile, Edges) {
    let mut paths = Vec::new();
    files(&src(), &mut paths);
    paths.sort();
    let mut per_file = Vec::new();
    let mut edges = Edges::new();
    for path in paths {
        let from = module_of(&path);
        let found = imports(&code(&std::fs::read_to_string(&path).unwrap()));
        for to in &found {
            if *to != from {
                edges.entry(from.clone()).or_default().insert(to.clone());
            }
        }
        per_file.push((path, found));
    }
    (per_file, edges)
}

#[test]
fn imports_point_down_the_layers() {
    let (per_file, _) = graph();
    let mut upward = Vec::new();
    for (path, found) in &per_file {
        let from = module_of(path);
        let here = layer_of(&from);
        for to in found {
            if *to != from && layer_of(to) < here {
                upward.push(format!(
                    "{} ({}) imports crate::{to} ({})",
                    path.strip_prefix(src()).unwrap().display(),
                    LAYERS[here].0,
                    LAYERS[layer_of(to)].0,
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that climb upward (docs/ARCHITECTURE.md names the directions):\n{}",
        upward.join("\n")
    );
}

#[test]
fn top_level_modules_import_each_other_in_no_circle() {
    let (_, edges) = graph();
    let allowed = |a: &str, b: &str| (a, b) == ALLOWED_CIRCLE || (b, a) == ALLOWED_CIRCLE;
    // Depth-first search for a path back to the start, per module.
    let mut circles = Vec::new();
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if allowed(&at, next) {
                    continue;
                }
                if next == start {
                    let mut circle = path.clone();
                    circle.push(next.clone());
                    circles.push(circle.join(" → "));
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn every_file_can_be_read_in_one_sitting() {
    let mut paths = Vec::new();
    files(&src(), &mut paths);
    let mut long = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let total = text.lines().count();
        let before_tests = text
            .lines()
            .take_while(|l| !l.contains("#[cfg(test)]"))
            .count();
        if before_tests > MAX_LINES || total > MAX_LINES_WITH_TESTS {
            long.push(format!(
                "{}: {before_tests} lines before its tests, {total} in all",
                path.strip_prefix(src()).unwrap().display()
            ));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines before their tests or {MAX_LINES_WITH_TESTS} with them \
         (give the concept a module):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_scanner_reads_grouped_and_nested_imports() {
    let found = imports(
        "use crate::{a, b::{c, d}, e::f};\nlet x = crate::g::h();\nuse $crate::i;\nmy_crate::j",
    );
    let want: BTreeSet<String> = ["a", "b", "e", "g", "i"].map(String::from).into();
    assert_eq!(found, want);
}
