//! The library's modules in layers: each top-level module of `src/` may
//! import (by a `crate::` path in code, comments and tests left out) only
//! modules of its own layer or below, so that what owns what stays
//! visible. The layers, bottom to top, are [`LAYERS`]; an upward import is
//! a name defined a layer too high, and is moved down rather than allowed.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Bottom to top. A module imports from its own layer and those before it.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "vocabulary",
        &[
            "mac",
            "clock",
            "netdev",
            "wire",
            "rawsock",
            "logging",
            "audit",
            "health",
            "terminal",
            "when",
            "trust",
            "open_files",
            "metrics",
            "share",
            "shutdown",
            "sync",
        ],
    ),
    (
        "engines",
        &[
            "admission",
            "bmc",
            "tftp",
            "trace",
            "discovered",
            "ratelimit",
            "mac_records",
            "client",
        ],
    ),
    ("model", &["inventory", "netboot"]),
    (
        "records",
        &["lease", "progress", "recovery", "import", "other_server"],
    ),
    ("shared state", &["state", "control"]),
    ("paths", &["dhcp", "view"]),
    ("services", &["xdp", "http"]),
    ("serving", &["rollout"]),
    ("sources", &["kube", "fuzzing"]),
    ("front door", &["api"]),
    ("wiring", &["app"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// The code of `text` without comments (line and block; string contents
/// that look like comments are rare in `use` lines and cut at worst the
/// rest of their line) and without its `#[cfg(test)] mod tests { ... }`
/// block: what comes after that block still counts.
fn code(text: &str) -> String {
    let code = without_comments(text);
    let Some(at) = code.find("#[cfg(test)]\nmod tests") else {
        return code;
    };
    let Some(open) = code[at..].find('{').map(|i| at + i) else {
        return code[..at].to_string();
    };
    let mut depth = 0usize;
    for (i, ch) in code[open..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => continue,
        }
        if depth == 0 {
            return format!("{}{}", &code[..at], &code[open + i + 1..]);
        }
    }
    code[..at].to_string()
}

/// `text` with its line and block comments left out.
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |end| &after[end + 2..]);
        } else if rest.starts_with("//") {
            rest = rest.find('\n').map_or("", |end| &rest[end..]);
        } else if rest.starts_with('"') {
            // A string literal, copied whole so `//` inside it stays.
            let bytes = rest.as_bytes();
            let mut end = 1;
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            let end = (end + 1).min(rest.len());
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        } else {
            let ch = rest.chars().next().expect("not empty");
            out.push(ch);
            rest = &rest[ch.len_utf8()..];
        }
    }
    out
}

/// The top-level modules named by `crate::` paths in `code`, braces
/// (`crate::{a, b::{c, d}}`) included.
fn imports(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `pxe_crate::` and the like
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(inner) = rest.strip_prefix('{') {
            // The names at depth 0 of the group.
            let (mut depth, mut start) = (0usize, true);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        start = false;
                        let name = ident(&inner[i..]);
                        if !name.is_empty() {
                            found.insert(name);
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found.retain(|m| m != "self" && m != "super");
    found
}

/// The top-level module a source file belongs to (`src/dhcp/server.rs`:
/// `dhcp`); `None` for the crate roots and the binary's `cli/`.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let module = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(module, "lib" | "main" | "cli")).then(|| module.to_owned())
}

/// The files only tests compile: those declared `#[cfg(test)] mod name;`,
/// and what they declare in turn.
fn test_only(files: &[(PathBuf, String)]) -> BTreeSet<PathBuf> {
    // Where a file's child modules live: beside `mod.rs`, else in the
    // directory named after the file.
    let children = |path: &Path| -> PathBuf {
        match path.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => {
                path.parent().map(Path::to_path_buf).unwrap_or_default()
            }
            _ => path.with_extension(""),
        }
    };
    let mut only = BTreeSet::new();
    for (path, text) in files {
        let mut rest = text.as_str();
        while let Some(at) = rest.find("#[cfg(test)]") {
            rest = &rest[at + "#[cfg(test)]".len()..];
            let next = rest.trim_start();
            let next = next.strip_prefix("pub(super) ").unwrap_or(next);
            let next = next.strip_prefix("pub(crate) ").unwrap_or(next);
            let Some(decl) = next.strip_prefix("mod ") else {
                continue;
            };
            let name: String = decl
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if decl[name.len()..].starts_with(';') {
                let dir = children(path);
                only.insert(dir.join(format!("{name}.rs")));
                only.insert(dir.join(&name));
            }
        }
    }
    only
}

/// Every problem with the layering of `files` (path below `src/`, text):
/// upward imports and modules in no layer.
fn check(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut edges: BTreeMap<(String, String), PathBuf> = BTreeMap::new();
    let mut modules = BTreeSet::new();
    let tests = test_only(files);
    for (path, text) in files {
        if path.ancestors().any(|a| tests.contains(a)) {
            continue;
        }
        let Some(from) = module_of(path) else {
            continue;
        };
        for to in imports(&code(text)) {
            if to != from {
                edges
                    .entry((from.clone(), to))
                    .or_insert_with(|| path.clone());
            }
        }
        modules.insert(from);
    }
    let mut problems = Vec::new();
    for module in &modules {
        if layer_of(module).is_none() {
            problems.push(format!("module {module} is in no layer: add it to LAYERS"));
        }
    }
    for ((from, to), path) in &edges {
        let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) else {
            continue;
        };
        if b > a {
            problems.push(format!(
                "{} imports {to} ({}) from {from} ({}): a layer above its own",
                path.display(),
                LAYERS[b].0,
                LAYERS[a].0
            ));
        }
    }
    problems
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) {
    for entry in fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).expect("read source");
            out.push((path.strip_prefix(root).expect("below src").to_owned(), text));
        }
    }
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(files.len() > 50, "found only {} sources", files.len());
    let problems = check(&files);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn an_upward_import_is_refused() {
    let file = |path: &str, text: &str| (PathBuf::from(path), text.to_owned());
    let files = [
        file("mac.rs", "use crate::{clock, app::run};\n"),
        file(
            "state.rs",
            "// crate::app in a comment\nuse crate::mac::MacAddr;\n",
        ),
        file(
            "dhcp/server.rs",
            "use crate::{\n    inventory::{Host, Inventory},\n    state::State,\n};\n\
             #[cfg(test)]\nmod tests {\n    use crate::app::run;\n}\n",
        ),
        file(
            "clock.rs",
            "#[cfg(test)]\nmod tests {\n    fn f() { let _ = \"{}\"; }\n}\nuse crate::view::HostView;\n",
        ),
        file("newthing.rs", "use crate::mac::MacAddr;\n"),
        file("trace.rs", "#[cfg(test)]\nmod golden;\n"),
        file("trace/golden.rs", "use crate::app::run;\n"),
        file("trace/golden/deeper.rs", "use crate::app::run;\n"),
    ];
    let problems = check(&files);
    assert_eq!(
        problems,
        [
            "module newthing is in no layer: add it to LAYERS",
            "clock.rs imports view (paths) from clock (vocabulary): a layer above its own",
            "mac.rs imports app (wiring) from mac (vocabulary): a layer above its own",
        ],
    );
}
