//! The command line against itself and against the documentation: every
//! argument of every subcommand's `--help` (walked from `pxe-agent --help`
//! down) has a help line, and every `pxe-agent SUBCOMMAND ... --flag` the
//! README and docs/*.md write, in code blocks and inline code, names a
//! subcommand and flags that `--help` lists. The client commands' older
//! flag names keep working.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
};

/// One `--help` page: its subcommands, its long flags, and the entries
/// that have no help line.
#[derive(Default)]
struct Page {
    subcommands: BTreeSet<String>,
    flags: BTreeSet<String>,
    no_help: Vec<String>,
}

/// The help pages of the whole command tree, by subcommand path (the
/// top level is the empty path).
struct Tree(BTreeMap<Vec<String>, Page>);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_pxe-agent")
}

/// `pxe-agent PATH... --help`, parsed.
fn help(path: &[String]) -> Page {
    let out = Command::new(bin())
        .args(path)
        .arg("--help")
        .output()
        .expect("failed to run pxe-agent");
    let text = String::from_utf8(out.stdout).expect("help is UTF-8");
    assert!(
        out.status.success(),
        "pxe-agent {} --help failed: {}",
        path.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_help(&text)
}

/// The entries of the `Commands:`, `Arguments:` and `Options:` sections
/// of a help page. An entry is a line indented by two spaces; its help
/// follows on the same line after a run of spaces, or on the more indented
/// lines below it (the layout `--help` takes when some entry has a long
/// help). Defaults, environment variables and possible values are not help.
fn parse_help(text: &str) -> Page {
    #[derive(PartialEq)]
    enum Section {
        None,
        Commands,
        Entries,
    }
    let mut page = Page::default();
    let mut section = Section::None;
    // The entry being read and whether it has a help line yet.
    let mut entry: Option<(String, bool)> = None;
    let finish = |entry: &mut Option<(String, bool)>, page: &mut Page| {
        if let Some((name, false)) = entry.take() {
            page.no_help.push(name);
        }
    };
    for line in text.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            finish(&mut entry, &mut page);
            section = match line {
                "Commands:" => Section::Commands,
                "Arguments:" | "Options:" => Section::Entries,
                _ => Section::None,
            };
            continue;
        }
        if section == Section::None || line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        if indent > 6 {
            // A help line (or its possible values) of the entry above.
            if let Some((_, has)) = &mut entry
                && !body.starts_with("Possible values:")
                && !body.starts_with("- ")
                && !is_annotation(body)
            {
                *has = true;
            }
            continue;
        }
        finish(&mut entry, &mut page);
        let (spec, rest) = body.split_once("  ").unwrap_or((body, ""));
        let described = !strip_annotations(rest.trim()).is_empty();
        if section == Section::Commands {
            page.subcommands.insert(spec.to_string());
        } else {
            for word in spec.split([' ', ',']) {
                if let Some(flag) = word.strip_prefix("--") {
                    page.flags.insert(flag.to_string());
                }
            }
        }
        entry = Some((spec.to_string(), described));
    }
    finish(&mut entry, &mut page);
    page
}

/// `[default: ..]`, `[env: ..]`, `[possible values: ..]`, `[aliases: ..]`.
fn is_annotation(s: &str) -> bool {
    strip_annotations(s).is_empty()
}

fn strip_annotations(s: &str) -> &str {
    let mut s = s.trim_end();
    while s.ends_with(']') {
        match s.rfind(" [").or_else(|| s.starts_with('[').then_some(0)) {
            Some(i) => s = s[..i].trim_end(),
            None => break,
        }
    }
    s
}

impl Tree {
    /// Whether `path` is a subcommand hidden from its parent's list (a lab
    /// helper): its `--help` still answers. Its page joins the tree.
    fn hidden(&mut self, path: &[String]) -> bool {
        if self.0.contains_key(path) {
            return true;
        }
        let word = path.last().expect("a subcommand path");
        if word.starts_with('-') || !word.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
            return false;
        }
        let answers = Command::new(bin())
            .args(path)
            .arg("--help")
            .output()
            .is_ok_and(|o| o.status.success());
        if answers {
            self.0.insert(path.to_vec(), help(path));
        }
        answers
    }

    /// Every page, from `pxe-agent --help` down.
    fn walk() -> Tree {
        let mut pages = BTreeMap::new();
        let mut todo = vec![Vec::<String>::new()];
        while let Some(path) = todo.pop() {
            let page = help(&path);
            for sub in &page.subcommands {
                if sub != "help" {
                    let mut next = path.clone();
                    next.push(sub.clone());
                    todo.push(next);
                }
            }
            pages.insert(path, page);
        }
        Tree(pages)
    }

    /// What is wrong with one command line as the docs write it (the
    /// words after `pxe-agent`); `strict` when it stands where a command
    /// starts, so that an unknown first word is a stale subcommand rather
    /// than prose or another program's argument.
    fn check(&mut self, words: &[&str], strict: bool) -> Option<String> {
        let mut path: Vec<String> = Vec::new();
        let mut words = words.iter().peekable();
        while let Some(w) = words.peek() {
            let mut next = path.clone();
            next.push(w.to_string());
            if (self.0[&path].subcommands.contains(**w) && **w != "help") || self.hidden(&next) {
                path = next;
                words.next();
            } else {
                break;
            }
        }
        if path.is_empty() {
            match words.peek() {
                Some(w) if !w.starts_with('-') => {
                    return strict.then(|| format!("no subcommand {w:?}"));
                }
                // Another program's flags (`cargo test -p pxe-agent --lib`).
                _ if !strict => return None,
                _ => {}
            }
        }
        // A flag named on a command with subcommands (`pxe-agent bmc
        // --direct`) is one of theirs.
        let flags: BTreeSet<&String> = self
            .0
            .iter()
            .filter(|(p, _)| p.starts_with(&path))
            .flat_map(|(_, page)| &page.flags)
            .collect();
        for w in words {
            let w = w.trim_start_matches('[');
            if let Some(flag) = w.strip_prefix("--") {
                let flag = flag.split(['=', ']']).next().unwrap_or_default();
                if flag.is_empty() || !flag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                    continue;
                }
                if !flags.contains(&flag.to_string()) {
                    return Some(format!("`pxe-agent {}` has no --{flag}", path.join(" ")));
                }
            }
        }
        None
    }
}

#[test]
fn every_argument_has_a_help_line() {
    let tree = Tree::walk();
    assert!(tree.0.len() > 10, "the walk found too few subcommands");
    let missing: Vec<String> = tree
        .0
        .iter()
        .flat_map(|(path, page)| {
            page.no_help
                .iter()
                .map(move |e| format!("pxe-agent {}: {e}", path.join(" ")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "arguments without a help line:\n{}",
        missing.join("\n")
    );
}

/// README.md and docs/*.md (and the docs' subdirectories).
fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).expect("docs/ is readable") {
            let p = e.expect("docs/ entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// The code of a markdown file as `(line, text)`: each line of a fenced
/// block (with `\` continuations joined), and each inline code span
/// (joined across line breaks).
fn code(md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut pending: Option<(usize, String)> = None;
    // The prose of the current paragraph, for inline spans.
    let mut prose: Vec<(usize, &str)> = Vec::new();
    let spans = |prose: &mut Vec<(usize, &str)>, out: &mut Vec<(usize, String)>| {
        let mut open: Option<(usize, String)> = None;
        for (n, line) in prose.drain(..) {
            for (i, part) in line.split('`').enumerate() {
                if i > 0 {
                    open = match open.take() {
                        Some(span) => {
                            out.push(span);
                            None
                        }
                        None => Some((n, String::new())),
                    };
                }
                if let Some((_, s)) = &mut open {
                    if !s.is_empty() && i == 0 {
                        s.push(' ');
                    }
                    s.push_str(part);
                }
            }
        }
    };
    for (i, line) in md.lines().enumerate() {
        let n = i + 1;
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            spans(&mut prose, &mut out);
            continue;
        }
        if fenced {
            let (start, mut text) = pending.take().unwrap_or((n, String::new()));
            text.push_str(line.trim_end());
            if let Some(cut) = text.strip_suffix('\\') {
                pending = Some((start, format!("{cut} ")));
            } else {
                out.push((start, text));
            }
        } else if line.trim().is_empty() {
            spans(&mut prose, &mut out);
        } else {
            prose.push((n, line));
        }
    }
    spans(&mut prose, &mut out);
    out
}

/// The `pxe-agent` command lines in one piece of code: the words after
/// each `pxe-agent` (or `.../pxe-agent`) up to the end of its command,
/// and whether it stands where a command starts (first word, or after
/// `$`, `sudo`, `exec`, `env`, `|`, `&&`, `;`, `VAR=value`).
fn commands(code: &str) -> Vec<(Vec<&str>, bool)> {
    let words: Vec<&str> = code.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let w = w.trim_start_matches(['(', '"', '\'']);
        let (dir, bare) = w.rsplit_once(['/', '=']).unwrap_or(("", w));
        if bare != "pxe-agent" {
            continue;
        }
        // A binary's path (`target/release/pxe-agent`, `/usr/bin/pxe-agent`),
        // not a directory (`/sys/fs/bpf/pxe-agent`, `/var/lib/pxe-agent`).
        let binary = dir.is_empty()
            || dir.ends_with("bin")
            || dir.ends_with("release")
            || dir.ends_with("debug")
            || w.contains('=');
        if !binary {
            continue;
        }
        let starts = i == 0
            || !dir.is_empty()
            || matches!(
                words[i - 1],
                "$" | "#" | "sudo" | "exec" | "env" | "|" | "&&" | ";"
            )
            || words[i - 1].contains('=');
        let args: Vec<&str> = words[i + 1..]
            .iter()
            .take_while(|a| {
                !matches!(**a, "|" | "&&" | "||" | ";" | ">" | "2>&1" | "#") && !a.starts_with('>')
            })
            .map(|a| {
                a.trim_start_matches('[')
                    .trim_end_matches([',', ')', ';', '.', ':', ']'])
            })
            .collect();
        out.push((args, starts));
    }
    out
}

#[test]
fn docs_name_only_subcommands_and_flags_that_exist() {
    let mut tree = Tree::walk();
    let mut stale = Vec::new();
    let mut seen = 0;
    for file in doc_files() {
        let md = fs::read_to_string(&file).expect("doc is readable");
        for (line, text) in code(&md) {
            for (words, strict) in commands(&text) {
                seen += 1;
                if let Some(why) = tree.check(&words, strict) {
                    stale.push(format!("{}:{line}: {why} ({text})", file.display()));
                }
            }
        }
    }
    assert!(
        seen > 20,
        "found only {seen} pxe-agent commands in the docs"
    );
    assert!(
        stale.is_empty(),
        "the docs name what the command line does not have:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_checker_catches_stale_names() {
    let mut tree = Tree::walk();
    assert!(tree.check(&["hosts", "--no-such-flag"], true).is_some());
    assert!(tree.check(&["no-such-command"], true).is_some());
    assert!(tree.check(&["no-such-command"], false).is_none());
    assert!(tree.check(&["run", "--interface", "eth0"], true).is_none());
    assert!(tree.check(&["bmc", "power", "on", "--all"], true).is_none());
    assert!(
        tree.check(&["veth-peer", "--interface", "v0"], true)
            .is_none()
    );
    assert!(tree.check(&["veth-peer", "--no-such-flag"], true).is_some());
    let page = parse_help(
        "Options:\n      --bare  \n      --told  Says so\n  -x, --ex <N>  [default: 1]\n",
    );
    assert_eq!(page.no_help, ["--bare", "-x, --ex <N>"]);
    let code = code(
        "see `pxe-agent run\n--interface eth0` and\n\n```\nsudo pxe-agent hosts \\\n  --discovered\n```\n",
    );
    assert_eq!(code[0].1, "pxe-agent run --interface eth0");
    assert_eq!(code[1].1, "sudo pxe-agent hosts    --discovered");
    assert!(!commands("kubectl -n pxe-agent get pods")[0].1);
}

/// What `pxe-agent ARGS` printed, run with `env`, when it failed (the
/// out-of-band commands print a failed host's error in their output).
fn output_of(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(bin())
        .args(args)
        .env_remove("PXE_AGENT_ADDR")
        .env_remove("PXE_AGENT_API")
        .envs(env.iter().copied())
        .output()
        .expect("failed to run pxe-agent");
    assert!(
        !out.status.success(),
        "pxe-agent {args:?} found an agent on a closed port"
    );
    String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout)
}

#[test]
fn client_commands_take_the_agent_by_flag_env_and_older_names() {
    // Port 1 on loopback: nothing answers, and the error names the address
    // the command tried.
    let tried = |args: &[&str], env: &[(&str, &str)], addr: &str| {
        let err = output_of(args, env);
        assert!(err.contains(addr), "pxe-agent {args:?} {env:?}: {err}");
    };
    tried(&["hosts", "--agent", "127.0.0.1:1"], &[], "127.0.0.1:1");
    tried(
        &["leases", "--api", "127.0.0.2:1", "--output", "json"],
        &[],
        "127.0.0.2:1",
    );
    tried(
        &["trace", "node-1"],
        &[("PXE_AGENT_ADDR", "127.0.0.3:1")],
        "127.0.0.3:1",
    );
    tried(
        &["hosts", "--format", "json"],
        &[("PXE_AGENT_API", "127.0.0.4:1")],
        "127.0.0.4:1",
    );
    tried(
        &["bmc", "info", "node-1", "--format", "json"],
        &[
            ("PXE_AGENT_ADDR", "127.0.0.5:1"),
            ("PXE_AGENT_API", "127.0.0.6:1"),
        ],
        "127.0.0.5:1",
    );
    let err = output_of(&["hosts", "--format", "yaml"], &[]);
    assert!(err.contains("possible values"), "{err}");
}
