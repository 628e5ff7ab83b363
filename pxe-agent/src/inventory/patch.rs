//! Reloading a large inventory file at the cost of what changed in it: the
//! host list is cut into its entries by their text, and a reload whose text
//! outside the host list is unchanged parses and checks only the entries
//! that differ from the inventory in force, keeping the others' hosts.
//!
//! Owns the cut ([`Layout`]) and the patch. The result is the inventory a
//! full parse gives, or no result: whatever the cut cannot vouch for
//! (anchors, flow lists, tabs, several documents, any problem at all) goes
//! to the full parse, whose messages name the file's own lines.

use std::{
    hash::{DefaultHasher, Hash as _, Hasher as _},
    path::Path,
};

use super::{Inventory, oob};

/// Entries changed past this share of the list are parsed with the rest:
/// a patch that large saves little and a full parse is the reference.
pub(crate) const MOST_CHANGED: usize = 4;

/// Where a file's host entries are, and what their text hashes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Hash of the text outside the host entries.
    frame: u64,
    /// Hash of each entry's text, in file order.
    entries: Vec<u64>,
}

/// The byte ranges of a file's host list and of its entries.
pub(super) struct Cut<'a> {
    text: &'a str,
    /// Where the entries start and end (the lines after `hosts:`).
    list: (usize, usize),
    /// Each entry's range, in order, covering `list`.
    pub entries: Vec<(usize, usize)>,
}

impl Cut<'_> {
    fn layout(&self) -> Layout {
        let mut frame = DefaultHasher::new();
        self.text[..self.list.0].hash(&mut frame);
        self.text[self.list.1..].hash(&mut frame);
        Layout {
            frame: frame.finish(),
            entries: self
                .entries
                .iter()
                .map(|&(start, end)| {
                    let mut h = DefaultHasher::new();
                    self.text[start..end].hash(&mut h);
                    h.finish()
                })
                .collect(),
        }
    }

    /// The file with only the entries `which` (ascending) in its host list.
    pub fn with_entries(&self, which: &[usize]) -> String {
        let (head, tail) = (&self.text[..self.list.0], &self.text[self.list.1..]);
        let body: usize = which
            .iter()
            .map(|&i| self.entries[i].1 - self.entries[i].0)
            .sum();
        let mut doc = String::with_capacity(head.len() + body + tail.len() + 4);
        doc.push_str(head);
        if which.is_empty() {
            // `hosts:` alone would be null, not an empty list.
            doc.truncate(doc.trim_end().len());
            doc.push_str(" []\n");
        }
        for &i in which {
            doc.push_str(&self.text[self.entries[i].0..self.entries[i].1]);
        }
        doc.push_str(tail);
        doc
    }
}

/// Cuts `text` into its host entries, or `None` when the host list is not a
/// plain block sequence under a top-level `hosts:` whose entries the cut can
/// tell apart by their lines alone.
pub(super) fn cut(text: &str) -> Option<Cut<'_>> {
    let bytes = text.as_bytes();
    if memchr::memchr(b'\t', bytes).is_some()
        || memchr::memmem::find(bytes, b"\n---").is_some()
        || text.starts_with("---")
    {
        return None;
    }
    let mut lines = Lines::new(text);
    let list_start = loop {
        let (_, end, line) = lines.next()?;
        let key = line.trim_end();
        let key = key.split_once(" #").map_or(key, |(k, _)| k).trim_end();
        if key == "hosts:" {
            break end;
        }
    };
    let mut entries: Vec<(usize, usize)> = Vec::new();
    let mut dash: Option<usize> = None;
    let mut list_end = text.len();
    // Bytes, not chars: YAML's indentation and markers are ASCII, and a
    // fleet's file is some 100 bytes a line.
    for (start, end, line) in lines {
        let line = line.as_bytes();
        let indent = line.iter().position(|&b| b != b' ').unwrap_or(line.len());
        let content = &line[indent..];
        let trimmed = content.trim_ascii_end();
        if trimmed.is_empty() || trimmed[0] == b'#' {
            continue;
        }
        let is_item = trimmed == b"-" || content.starts_with(b"- ");
        match dash {
            None if is_item => dash = Some(indent),
            // Not a block sequence (a flow list, a scalar): not cut.
            None => return None,
            Some(d) if indent == d && is_item => {}
            Some(d) if indent > d => continue,
            // The next top-level key ends the list.
            Some(_) if indent == 0 => {
                list_end = start;
                break;
            }
            Some(_) => return None,
        }
        if let Some(last) = entries.last_mut() {
            last.1 = start;
        }
        entries.push((start, end));
    }
    let first = entries.first()?.0;
    if let Some(last) = entries.last_mut() {
        last.1 = list_end;
    }
    let list = &bytes[first..list_end];
    // Anchors, aliases, tags and merge keys tie entries to each other.
    if memchr::memchr3(b'&', b'*', b'!', list).is_some()
        || memchr::memmem::find(list, b"<<").is_some()
    {
        return None;
    }
    Some(Cut {
        text,
        list: (list_start, list_end),
        entries,
    })
}

/// Lines with their byte ranges (end includes the newline).
struct Lines<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Lines<'a> {
        Lines { text, at: 0 }
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = (usize, usize, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.text.len() {
            return None;
        }
        let start = self.at;
        let end = memchr::memchr(b'\n', &self.text.as_bytes()[start..])
            .map_or(self.text.len(), |i| start + i + 1);
        self.at = end;
        Some((start, end, &self.text[start..end]))
    }
}

/// The layout of `text`, when it can be cut.
pub fn layout(text: &str) -> Option<Layout> {
    cut(text).map(|c| c.layout())
}

/// `text` as [`Inventory::parse_with`] reads it, built from `previous` (the
/// inventory loaded from the file's previous text, whose layout is
/// `before`) by parsing only the entries that changed; with the new
/// layout. `None` when the patch cannot vouch for the result: the caller
/// then parses the whole file.
pub fn patch(
    path: &Path,
    text: &str,
    previous: &Inventory,
    before: &Layout,
    secrets: &dyn oob::SecretSource,
) -> Option<(Inventory, Layout)> {
    let cut = cut(text)?;
    let after = cut.layout();
    if after.frame != before.frame || before.entries.len() != previous.hosts.len() {
        return None;
    }
    let (old, new) = (&before.entries, &after.entries);
    let keep = kept_entries(old, new);
    let parsed: Vec<usize> = (0..new.len()).filter(|&i| keep[i].is_none()).collect();
    if parsed.len() * MOST_CHANGED > new.len().max(1) {
        return None;
    }
    // The changed entries, checked in the file's own frame: subnets,
    // profiles and settings are parsed (and their secrets read) anew.
    let fresh = Inventory::parse_with(path, &cut.with_entries(&parsed), secrets).ok()?;
    let inventory = splice(previous, &keep, fresh, path, secrets)?;
    Some((inventory, after))
}

/// The inventory of `fresh`'s frame (subnets, profiles, settings) whose
/// hosts are, for each entry of `keep`, `previous`'s host at that index or,
/// for `None`, the next of `fresh`'s hosts (the changed ones, in order).
/// `None` when that cannot be vouched for: `fresh` has another number of
/// hosts, a kept host's BMC password no longer reads as it did (`label`
/// names the source, `secrets` reads them), or two hosts share a MAC or
/// an address, which a whole validation would refuse.
pub(crate) fn splice(
    previous: &Inventory,
    keep: &[Option<usize>],
    mut fresh: Inventory,
    label: &Path,
    secrets: &dyn oob::SecretSource,
) -> Option<Inventory> {
    if fresh.hosts.len() != keep.iter().filter(|k| k.is_none()).count() {
        return None;
    }
    let kept = keep.iter().flatten().map(|&at| &*previous.hosts[at]);
    if !passwords_unchanged(kept, label, secrets) {
        return None;
    }
    let mut fresh_hosts = std::mem::take(&mut fresh.hosts).into_iter();
    // Sized up front: grown as it fills, the list would be copied (and its
    // pages faulted in) several times over at fleet size.
    let mut hosts = Vec::with_capacity(keep.len());
    for k in keep {
        hosts.push(match k {
            Some(at) => previous.hosts.get(*at)?.clone(),
            None => fresh_hosts.next()?,
        });
    }
    let mut inventory = Inventory { hosts, ..fresh };
    inventory.reindex();
    // The index keeps one entry a key: fewer than the hosts (or their
    // ports) when two of them share an address or a MAC.
    let ports = inventory
        .hosts
        .iter()
        .map(|h| h.ports().len())
        .sum::<usize>();
    if inventory.index.by_mac.len() != ports || inventory.index.by_ip.len() != inventory.hosts.len()
    {
        return None;
    }
    Some(inventory)
}

/// For each new entry, the old entry whose host it keeps, or `None` when it
/// is parsed: the entries that differ in place when the count is the same,
/// else all but the common head and tail.
fn kept_entries(old: &[u64], new: &[u64]) -> Vec<Option<usize>> {
    if old.len() == new.len() {
        return (0..new.len())
            .map(|i| (old[i] == new[i]).then_some(i))
            .collect();
    }
    let head = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let tail = old[head..]
        .iter()
        .rev()
        .zip(new[head..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    (0..new.len())
        .map(|i| {
            if i < head {
                Some(i)
            } else if i >= new.len() - tail {
                Some(i + old.len() - new.len())
            } else {
                None
            }
        })
        .collect()
}

/// Whether every kept host's BMC password still reads as it did: a reload
/// reads passwords again, as a full parse would.
fn passwords_unchanged<'a>(
    kept: impl Iterator<Item = &'a super::Host>,
    path: &Path,
    secrets: &dyn oob::SecretSource,
) -> bool {
    let mut secrets = oob::Secrets::new(secrets, path);
    kept.filter_map(|h| h.bmc.as_deref())
        .all(|bmc| secrets.still_reads(bmc))
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    const FRAME: &str = "subnets:\n  - cidr: 10.66.0.0/16\n    router: 10.66.0.1\n\
        profiles:\n  - name: worker\n    boot: {bios: undionly.kpxe, uefi: ipxe.efi}\n  - name: bare\n";

    /// Hosts `0..n` in flow style, every third one in block style with a
    /// comment, then a top-level key after the list.
    fn file(hosts: impl IntoIterator<Item = (usize, &'static str)>) -> String {
        let mut text = format!("{FRAME}# the fleet\nhosts:\n");
        for (i, tag) in hosts {
            if i % 3 == 0 {
                let _ = write!(
                    text,
                    "  - mac: \"52:54:00:00:{:02x}:{:02x}\"\n    ip: 10.66.{}.{}\n    \
                     # rack {i}\n    hostname: node-{i}\n    profile: worker\n    \
                     options: {{224: \"{tag}-{i}\"}}\n",
                    i / 256,
                    i % 256,
                    1 + i / 200,
                    10 + i % 200
                );
            } else {
                let _ = writeln!(
                    text,
                    "  - {{mac: \"52:54:00:00:{:02x}:{:02x}\", ip: 10.66.{}.{}, profile: bare, \
                     hostname: node-{i}, options: {{224: \"{tag}-{i}\"}}}}",
                    i / 256,
                    i % 256,
                    1 + i / 200,
                    10 + i % 200
                );
            }
        }
        text.push_str("ipxe:\n  user_class: iPXE\n");
        text
    }

    fn parse(text: &str) -> Inventory {
        Inventory::parse(Path::new("inv.yaml"), text).expect("valid")
    }

    /// Patches `after` from `before`; checks it equals the full parse.
    fn patched(before: &str, after: &str) -> Option<Inventory> {
        let previous = parse(before);
        let layout = layout(before).expect("cut");
        let (inv, new_layout) = patch(
            Path::new("inv.yaml"),
            after,
            &previous,
            &layout,
            &oob::System,
        )?;
        let full = parse(after);
        assert_eq!(inv, full, "the patch differs from the full parse");
        assert_eq!(Some(new_layout), super::layout(after));
        for host in &full.hosts {
            assert_eq!(
                inv.host_by_mac(host.mac),
                Some(&**host),
                "index of {}",
                host.mac
            );
            assert_eq!(inv.host_by_ip(host.ipv4().unwrap()), Some(&**host));
        }
        Some(inv)
    }

    fn tags(n: usize) -> Vec<(usize, &'static str)> {
        (0..n).map(|i| (i, "rack")).collect()
    }

    #[test]
    fn cuts_one_entry_per_host_whatever_its_style() {
        let text = file(tags(10));
        let cut = cut(&text).expect("cut");
        assert_eq!(cut.entries.len(), 10);
        assert!(text[cut.entries[0].0..].starts_with("  - mac:"));
        assert!(text[cut.list.1..].starts_with("ipxe:"));
        let every: String = cut.entries.iter().map(|&(a, b)| &text[a..b]).collect();
        assert_eq!(every, text[cut.entries[0].0..cut.list.1]);
    }

    #[test]
    fn a_changed_host_is_the_only_one_parsed_and_the_result_is_the_full_parse() {
        let before = file(tags(300));
        let mut changed = tags(300);
        changed[150].1 = "moved";
        changed[3].1 = "moved";
        let inv = patched(&before, &file(changed)).expect("patched");
        assert_eq!(inv.hosts.len(), 300);
    }

    #[test]
    fn hosts_added_removed_and_inserted_patch_to_the_full_parse() {
        let before = file(tags(300));
        patched(&before, &file(tags(310))).expect("added at the end");
        patched(&before, &file(tags(290))).expect("removed at the end");
        let mut dropped = tags(300);
        dropped.remove(100);
        patched(&before, &file(dropped)).expect("removed in the middle");
        let mut inserted = tags(300);
        inserted.insert(7, (400, "new"));
        patched(&before, &file(inserted)).expect("inserted");
        patched(&file(tags(10)), &file(tags(11))).expect("a small inventory");
    }

    #[test]
    fn what_the_patch_cannot_vouch_for_goes_to_the_full_parse() {
        let before = file(tags(300));
        let previous = parse(&before);
        let layout = layout(&before).expect("cut");
        let attempt = |after: &str| {
            patch(
                Path::new("inv.yaml"),
                after,
                &previous,
                &layout,
                &oob::System,
            )
            .map(|(i, _)| i)
        };
        // Another frame: subnets and profiles may give every host new values.
        let frame = before.replace("router: 10.66.0.1", "router: 10.66.0.2");
        assert!(attempt(&frame).is_none());
        // Most entries changed.
        let moved: Vec<_> = (0..300).map(|i| (i, "moved")).collect();
        assert!(attempt(&file(moved)).is_none());
        // A changed host now takes an unchanged one's address.
        let mut clash = before.clone();
        clash = clash.replacen("ip: 10.66.1.11,", "ip: 10.66.1.12,", 1);
        assert!(Inventory::parse(Path::new("x"), &clash).is_err());
        assert!(attempt(&clash).is_none());
        // A changed host that is itself invalid.
        assert!(attempt(&before.replacen("profile: bare", "profile: nope", 1)).is_none());
        // Anchors, tabs, flow lists: not cut.
        assert!(cut(&before.replacen("profile: bare", "profile: &p bare", 1)).is_none());
        assert!(cut(&before.replacen("    hostname", "\thostname", 1)).is_none());
        assert!(cut(&format!("{FRAME}hosts: []\n")).is_none());
        assert!(cut(&format!("{FRAME}hosts:\n  [{{mac: x}}]\n")).is_none());
    }

    #[test]
    fn a_changed_bmc_password_is_read_again_by_a_full_parse() {
        let dir = std::env::temp_dir().join(format!("pxe-patch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let secret = dir.join("bmc.pass");
        std::fs::write(&secret, "first\n").expect("write");
        let bmc = format!(
            "  - mac: \"52:54:00:00:10:01\"\n    ip: 10.66.9.9\n    profile: bare\n    \
             bmc: {{address: \"ipmi://10.66.0.50\", username: admin, password_file: {}}}\n",
            secret.display()
        );
        let before = file(tags(10)).replace("hosts:\n", &format!("hosts:\n{bmc}"));
        let previous = parse(&before);
        let layout = layout(&before).expect("cut");
        let after = before.replace("hostname: node-5,", "hostname: node-five,");
        let run = || {
            patch(
                Path::new("inv.yaml"),
                &after,
                &previous,
                &layout,
                &oob::System,
            )
        };
        assert!(run().is_some(), "same password: patched");
        std::fs::write(&secret, "second\n").expect("write");
        assert!(run().is_none(), "new password: parsed whole");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
