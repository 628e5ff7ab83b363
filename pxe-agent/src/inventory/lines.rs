//! Where a [`Problem`] points in an inventory file: the line of the entry
//! of `hosts`, `subnets`, `profiles` (and a profile's `rules`) that it
//! names, or of the top-level key (`discovery`, `ipxe`), so that `check`
//! can lead with `file:line:`. Owns reading entries' lines from the text;
//! which entry a problem names is in its `host` and `field`, as validation
//! wrote them, and the host-list cut is `patch`'s.

use std::collections::HashMap;

use super::{Problem, patch::cut};

/// The lines of a file's entries, looked up by problem.
#[derive(Debug, Default)]
pub struct Locator {
    /// By the label problems name the host by (later entries win).
    hosts: HashMap<String, usize>,
    subnets: Vec<usize>,
    profiles: Vec<ProfileLines>,
    /// Every top-level key, for problems of a block (`discovery.policy`)
    /// and of entries of a list written as a flow list.
    keys: HashMap<String, usize>,
}

#[derive(Debug)]
struct ProfileLines {
    /// As validation names the profile's fields (`profiles[worker]`).
    name: Option<String>,
    line: usize,
    rules: Vec<usize>,
}

impl Locator {
    /// The lines of `text`'s entries; lists it cannot read entry by entry
    /// (flow lists, anchors in the host list) give no lines.
    pub fn new(text: &str) -> Locator {
        let hosts = host_lines(text)
            .map(|entries| entries.into_iter().collect())
            .unwrap_or_default();
        let subnets = list(text, (0, text.len()), "subnets")
            .map(|entries| {
                entries
                    .iter()
                    .map(|&(start, _)| line_of(text, start))
                    .collect()
            })
            .unwrap_or_default();
        let profiles = list(text, (0, text.len()), "profiles")
            .unwrap_or_default()
            .into_iter()
            .map(|range| {
                let name = entry_value(&text[range.0..range.1])
                    .as_ref()
                    .and_then(|v| v.get("name"))
                    .and_then(|v| v.as_str())
                    .map(|name| name.escape_debug().to_string());
                ProfileLines {
                    name,
                    line: line_of(text, range.0),
                    rules: list(text, range, "rules")
                        .map(|rules| rules.iter().map(|&(s, _)| line_of(text, s)).collect())
                        .unwrap_or_default(),
                }
            })
            .collect();
        let mut keys = HashMap::new();
        for (start, _, line) in lines(text, (0, text.len())) {
            if let Some(key) = key_of(line).filter(|_| !line.starts_with(' ')) {
                keys.entry(key.to_owned())
                    .or_insert_with(|| line_of(text, start));
            }
        }
        Locator {
            hosts,
            subnets,
            profiles,
            keys,
        }
    }

    /// The line `problem` points at: its host's entry, else the entry or
    /// key its field starts with (`subnets[1].dns[0]`,
    /// `profiles[worker].rules[0].boot`, `discovery.profile`).
    pub fn line(&self, problem: &Problem) -> Option<usize> {
        if let Some(host) = &problem.host {
            return self.hosts.get(host).copied();
        }
        let field = problem.field.as_str();
        let entry = if let Some((index, _)) = field
            .strip_prefix("subnets[")
            .and_then(|r| r.split_once(']'))
        {
            index
                .parse()
                .ok()
                .and_then(|i: usize| self.subnets.get(i))
                .copied()
        } else if field.starts_with("profiles[") {
            self.profile(field).map(|(profile, rest)| {
                let rule = rest
                    .strip_prefix(".rules[")
                    .and_then(|r| r.split_once(']'))
                    .and_then(|(i, _)| i.parse::<usize>().ok())
                    .and_then(|i| profile.rules.get(i));
                *rule.unwrap_or(&profile.line)
            })
        } else {
            None
        };
        // A list written as a flow list has no entry lines: its key's.
        entry.or_else(|| self.keys.get(field.split(['.', '[']).next()?).copied())
    }

    /// The profile a `profiles[...]` field names, and the rest of the
    /// field: by name, as validation names fields, or by position, as it
    /// names a profile's `name` and the fields of a profile without one.
    fn profile<'f>(&self, field: &'f str) -> Option<(&ProfileLines, &'f str)> {
        let after = |label: &str| {
            let rest = field
                .strip_prefix("profiles[")?
                .strip_prefix(label)?
                .strip_prefix(']')?;
            (rest.is_empty() || rest.starts_with('.')).then_some(rest)
        };
        let by_index = self
            .profiles
            .iter()
            .enumerate()
            .find_map(|(i, p)| Some((p, after(&i.to_string())?)));
        let by_name = self
            .profiles
            .iter()
            .find_map(|p| Some((p, after(p.name.as_deref()?)?)));
        match by_index {
            Some((_, ".name")) => by_index,
            _ => by_name.or(by_index),
        }
    }
}

/// The 1-based line of byte `at`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// The lines of `text[range]`, with their byte offsets.
fn lines(text: &str, (from, to): (usize, usize)) -> impl Iterator<Item = (usize, usize, &str)> {
    text[from..to].split_inclusive('\n').scan(from, |at, line| {
        let start = *at;
        *at += line.len();
        Some((start, *at, line))
    })
}

/// The key a line of a block mapping starts, without its value.
fn key_of(line: &str) -> Option<&str> {
    let content = line.trim_start();
    if content.starts_with('#') || content.starts_with('-') {
        return None;
    }
    let (key, _) = content.split_once(':')?;
    (!key.is_empty() && !key.contains(' ')).then_some(key)
}

/// The entries of the block list under the first `key:` line within
/// `text[range]`: each entry from its `-` line to the next one's, comments
/// between them with the earlier. `None` when there is no such line or it
/// holds no block list.
fn list(text: &str, range: (usize, usize), key: &str) -> Option<Vec<(usize, usize)>> {
    let indent_of = |line: &str| line.len() - line.trim_start_matches(' ').len();
    let mut rest = lines(text, range);
    let key_indent = loop {
        let (_, _, line) = rest.next()?;
        let content = line.trim();
        let content = content
            .split_once(" #")
            .map_or(content, |(k, _)| k)
            .trim_end();
        if content.strip_suffix(':') == Some(key) {
            break indent_of(line);
        }
    };
    let mut entries: Vec<(usize, usize)> = Vec::new();
    let mut dash: Option<usize> = None;
    let mut end = range.1;
    for (start, line_end, line) in rest {
        let indent = indent_of(line);
        let content = line[indent..].trim_end();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let item = content == "-" || content.starts_with("- ");
        match dash {
            None if item && indent >= key_indent => dash = Some(indent),
            // Not a block list (a flow list, a scalar).
            None => return None,
            Some(d) if indent == d && item => {}
            Some(d) if indent > d => continue,
            // The next key of the mapping the list is in ends it.
            Some(_) if indent <= key_indent => {
                end = start;
                break;
            }
            Some(_) => return None,
        }
        if let Some(last) = entries.last_mut() {
            last.1 = start;
        }
        entries.push((start, line_end));
    }
    if let Some(last) = entries.last_mut() {
        last.1 = end;
    }
    Some(entries)
}

/// An entry's text (from its `-`) parsed on its own, as the one item of a
/// list; `None` when it does not parse so.
fn entry_value(entry: &str) -> Option<serde_norway::Value> {
    serde_norway::from_str::<serde_norway::Value>(&dedent(entry))
        .ok()
        .and_then(|v| v.as_sequence().and_then(|s| s.first().cloned()))
}

/// The line (1-based) of each host entry of `text` and the label problems
/// name its host by, for messages that point into the file; `None` when
/// the host list cannot be cut into entries (see `patch`).
fn host_lines(text: &str) -> Option<Vec<(String, usize)>> {
    let cut = cut(text)?;
    let mut out = Vec::with_capacity(cut.entries.len());
    for (index, &(start, end)) in cut.entries.iter().enumerate() {
        let entry = &text[start..end];
        // The entry's first line that is not blank or a comment: its `-`.
        let skipped = entry
            .split_inclusive('\n')
            .take_while(|l| {
                let l = l.trim_start();
                l.is_empty() || l.starts_with('#')
            })
            .count();
        let line = text[..start].matches('\n').count() + 1 + skipped;
        // Parsed as the list it sits in; an entry that does not parse on
        // its own is named by position, as validation names it then.
        let value = entry_value(entry);
        let field = |k: &str| {
            value
                .as_ref()
                .and_then(|v| v.get(k))
                .and_then(|v| v.as_str())
        };
        let first_mac = field("mac").or_else(|| {
            value
                .as_ref()
                .and_then(|v| v.get("macs"))
                .and_then(|m| m.as_sequence())
                .and_then(|m| m.first())
                .and_then(|m| m.as_str())
        });
        let mac = first_mac.and_then(|m| m.parse().ok());
        out.push((
            super::validate::host_label(index, mac, field("hostname")),
            line,
        ));
    }
    Some(out)
}

/// `entry` with the indentation of its first item line removed, so that it
/// parses as a list on its own.
fn dedent(entry: &str) -> String {
    let indent = entry
        .lines()
        .find(|l| l.trim_start().starts_with('-'))
        .map_or(0, |l| l.len() - l.trim_start().len());
    entry
        .lines()
        .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::inventory::{Inventory, LoadError};

    /// Each problem validation finds in `text`, with the line it points at.
    fn located(text: &str) -> Vec<(Option<usize>, String)> {
        let Err(LoadError::Invalid { problems, .. }) = Inventory::parse(Path::new("t.yaml"), text)
        else {
            panic!("the inventory is valid")
        };
        let locator = Locator::new(text);
        problems
            .iter()
            .map(|p| (locator.line(p), p.to_string()))
            .collect()
    }

    fn line_of_field(found: &[(Option<usize>, String)], field: &str) -> Option<usize> {
        found
            .iter()
            .find(|(_, p)| p.contains(&format!("field {field}:")))
            .unwrap_or_else(|| panic!("no problem with {field}: {found:#?}"))
            .0
    }

    const TEXT: &str = "\
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1

  # the second subnet, after a comment
  - cidr: 10.67.0.0/16
    dns: [nope]
    options: {42: nope}
  - {cidr: 10.68.0.1/16}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe}
    # a comment between a profile's keys
    rules:
      - match: {arch: [7]}
        boot: {uefi: ipxe.efi}
      # a comment between rules
      - match: {arch: [9]}
    options: {51: 60}
  # a comment between profiles
  - name: \"\"
    kernel: \"\"
  - name: worker
hosts:
  - {mac: \"52:54:00:00:00:01\", ip: 10.66.1.1, profile: nope}
discovery:
  policy: inspekt
";

    #[test]
    fn subnet_profile_and_rule_problems_point_at_their_entries() {
        let found = located(TEXT);
        assert_eq!(line_of_field(&found, "subnets[1].dns[0]"), Some(6));
        assert_eq!(line_of_field(&found, "subnets[1].options.42"), Some(6));
        assert_eq!(line_of_field(&found, "subnets[2].cidr"), Some(9));
        assert_eq!(line_of_field(&found, "profiles[worker].rules[1]"), Some(18));
        assert_eq!(
            line_of_field(&found, "profiles[worker].options.51"),
            Some(11)
        );
        // Named by position: the empty name, its fields, the second worker.
        assert_eq!(line_of_field(&found, "profiles[1].name"), Some(21));
        assert_eq!(line_of_field(&found, "profiles[1].kernel"), Some(21));
        assert_eq!(line_of_field(&found, "profiles[2].name"), Some(23));
        assert_eq!(line_of_field(&found, "discovery.policy"), Some(26));
        let host = found
            .iter()
            .find(|(_, p)| p.contains("field profile:"))
            .expect("the host's unknown profile");
        assert_eq!(host.0, Some(25));
    }

    #[test]
    fn entries_of_a_flow_list_point_at_its_key() {
        let text = "\
subnets: [{cidr: 10.66.0.1/16}]
profiles: [{name: p, options: {53: 1}}]
hosts: []
";
        let found = located(text);
        assert_eq!(line_of_field(&found, "subnets[0].cidr"), Some(1));
        assert_eq!(line_of_field(&found, "profiles[p].options.53"), Some(2));
    }
}
