//! Per-profile conditional rules and their evaluation: which rules of a
//! profile apply to a request, and the boot answer and extra options that
//! result. Owns the match semantics documented in `docs/inventory.md` and
//! the parsing of the two request options rules look into (user class,
//! RFC 3004; relay agent circuit id, RFC 3046). Works on plain bytes, not on
//! `dhcproto` types: reading them out of a request, and deciding whether a
//! host can be answered by the fast path, is the DHCP code's job.

use std::collections::BTreeMap;

use super::{BootFiles, Profile};

/// What [`Profile::boot_for`] returns: the boot answer (`None`: none) and
/// the extra options of the profile and its matching rules (code ->
/// encoded value).
pub type BootAnswer = (Option<BootFiles>, BTreeMap<u8, Vec<u8>>);

/// One rule of a profile: when `when` matches, `boot`'s entries replace the
/// profile's and `options` are added to the answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    /// Written `match` in the file, a keyword in Rust.
    pub when: Match,
    /// Entries that override the profile's boot answer; unset entries keep
    /// the profile's.
    pub boot: BootFiles,
    /// Extra DHCP options: code -> encoded value bytes (at most 255), as in
    /// [`Host::options`](super::Host::options).
    pub options: BTreeMap<u8, Vec<u8>>,
}

/// What a request and its host must show for a rule to apply. Every key that
/// is set must match; an unset key (or empty list or map) matches anything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Match {
    /// Client system architectures (option 93, RFC 4578); empty = any. A
    /// request without option 93 matches only an empty list.
    pub arch: Vec<u16>,
    /// Prefix of the vendor class identifier (option 60).
    pub vendor_class: Option<String>,
    /// One entry of the user class option (77), compared exactly; see
    /// [`parse_user_classes`].
    pub user_class: Option<String>,
    /// The relay agent's circuit id (option 82 sub-option 1), compared
    /// exactly as bytes.
    pub circuit_id: Option<String>,
    /// Every pair must be among the host's labels.
    pub labels: BTreeMap<String, String>,
}

/// What a request says about the client, as far as rules look at it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traits<'a> {
    /// Option 93; the first architecture when the client lists several.
    pub arch: Option<u16>,
    /// Option 60, as sent.
    pub vendor_class: Option<&'a [u8]>,
    /// The RFC 3004 entries of option 77, each without its length byte
    /// ([`parse_user_classes`]); empty without option 77.
    pub user_classes: &'a [Vec<u8>],
    /// Option 82 sub-option 1 ([`circuit_id`]).
    pub circuit_id: Option<&'a [u8]>,
}

impl Match {
    /// Whether a request with `req` from a host with `labels` satisfies every
    /// key of this match.
    pub fn matches(&self, req: &Traits, labels: &BTreeMap<String, String>) -> bool {
        self.labels_match(labels)
            && self.arch_matches(req.arch)
            && self.vendor_class.as_ref().is_none_or(|prefix| {
                req.vendor_class
                    .is_some_and(|sent| sent.starts_with(prefix.as_bytes()))
            })
            && self.user_class.as_ref().is_none_or(|class| {
                req.user_classes
                    .iter()
                    .any(|sent| sent.as_slice() == class.as_bytes())
            })
            && self
                .circuit_id
                .as_ref()
                .is_none_or(|id| req.circuit_id == Some(id.as_bytes()))
    }

    /// True when the outcome depends on nothing in the request but the
    /// architecture: no vendor class, user class or circuit id key.
    pub fn depends_on_request_only_through_arch(&self) -> bool {
        self.vendor_class.is_none() && self.user_class.is_none() && self.circuit_id.is_none()
    }

    /// The outcome for every request whose option 93 is one of `arches`
    /// (`None`: no option 93) from a host with `labels`, or `None` when
    /// requests in that set can differ: the match reads the vendor class,
    /// user class or circuit id, or its `arch` list takes some of `arches`
    /// but not all. Lets the DHCP code compile a firmware class ahead of
    /// time (BIOS, for example, is `[None, Some(0)]`).
    pub fn outcome_for_arches(
        &self,
        arches: &[Option<u16>],
        labels: &BTreeMap<String, String>,
    ) -> Option<bool> {
        if !self.labels_match(labels) {
            return Some(false);
        }
        let matching = arches
            .iter()
            .filter(|arch| self.arch_matches(**arch))
            .count();
        if matching == 0 {
            // Covers an empty `arches`, too: no request, no match.
            return Some(false);
        }
        if !self.depends_on_request_only_through_arch() || matching != arches.len() {
            return None;
        }
        Some(true)
    }

    /// Whether the match has any key at all; one without keys would apply
    /// to every request, which validation refuses.
    pub(super) fn is_empty(&self) -> bool {
        self.arch.is_empty()
            && self.depends_on_request_only_through_arch()
            && self.labels.is_empty()
    }

    fn labels_match(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
    }

    fn arch_matches(&self, arch: Option<u16>) -> bool {
        self.arch.is_empty() || arch.is_some_and(|arch| self.arch.contains(&arch))
    }
}

impl Profile {
    /// The boot answer and extra options for a request with `traits` from a
    /// host with `host_labels`: the profile's boot files with the entries of
    /// every matching rule laid over them in order, and the profile's own
    /// options with those of the matching rules laid over them, a later
    /// rule's value winning per code. The boot
    /// answer is `None` only when the profile has no `boot` and no matching
    /// rule sets a boot entry.
    pub fn boot_for(&self, host_labels: &BTreeMap<String, String>, traits: &Traits) -> BootAnswer {
        self.apply(
            self.rules
                .iter()
                .filter(|rule| rule.when.matches(traits, host_labels)),
        )
    }

    /// [`Profile::boot_for`] for every request whose option 93 is one of
    /// `arches` at once, or `None` when some rule's outcome differs within
    /// that set (see [`Match::outcome_for_arches`]) and only the request can
    /// tell.
    pub fn boot_for_arches(
        &self,
        host_labels: &BTreeMap<String, String>,
        arches: &[Option<u16>],
    ) -> Option<BootAnswer> {
        let mut applying = Vec::new();
        for rule in &self.rules {
            if rule.when.outcome_for_arches(arches, host_labels)? {
                applying.push(rule);
            }
        }
        Some(self.apply(applying))
    }

    /// True when any rule reads the vendor class, user class or circuit id,
    /// so that some answers of this profile depend on the request.
    pub fn has_request_dependent_rules(&self) -> bool {
        self.rules
            .iter()
            .any(|rule| !rule.when.depends_on_request_only_through_arch())
    }

    fn apply<'r>(&self, rules: impl IntoIterator<Item = &'r Rule>) -> BootAnswer {
        let mut boot = self.boot.clone();
        let mut options = self.options.clone();
        for rule in rules {
            if !rule.boot.is_empty() {
                boot.get_or_insert_with(BootFiles::default)
                    .overlay(&rule.boot);
            }
            options.extend(
                rule.options
                    .iter()
                    .map(|(code, value)| (*code, value.clone())),
            );
        }
        (boot, options)
    }
}

impl BootFiles {
    /// True when no entry is set.
    pub fn is_empty(&self) -> bool {
        self.bios.is_none()
            && self.uefi.is_none()
            && self.uefi_arm64.is_none()
            && self.http.is_none()
            && self.http_arm64.is_none()
            && self.http_ia32.is_none()
    }

    /// Replaces each entry that `other` sets.
    fn overlay(&mut self, other: &BootFiles) {
        for (mine, theirs) in [
            (&mut self.bios, &other.bios),
            (&mut self.uefi, &other.uefi),
            (&mut self.uefi_arm64, &other.uefi_arm64),
            (&mut self.http, &other.http),
            (&mut self.http_arm64, &other.http_arm64),
            (&mut self.http_ia32, &other.http_ia32),
        ] {
            if theirs.is_some() {
                mine.clone_from(theirs);
            }
        }
    }
}

/// The entries of a user class option (77) value.
///
/// RFC 3004 section 4 makes the value a sequence of entries, each a length
/// octet followed by that many bytes; iPXE sends exactly that (`\x04iPXE`).
/// Some clients send a bare string instead, so when the value is not such a
/// sequence (a length runs past the end, or is zero) the whole value is
/// returned as the only entry. An empty value has no entries.
pub fn parse_user_classes(option77: &[u8]) -> Vec<Vec<u8>> {
    let mut entries = Vec::new();
    let mut rest = option77;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len);
        if len == 0 || len > tail.len() {
            return vec![option77.to_vec()];
        }
        let (entry, tail) = tail.split_at(len);
        entries.push(entry.to_vec());
        rest = tail;
    }
    entries
}

/// The agent circuit id, sub-option 1 of a relay agent information option
/// (82) value (RFC 3046 section 2.0: sub-options are a code octet, a length
/// octet and that many bytes). `None` when the value has no sub-option 1
/// before its end or before a sub-option whose length runs past the end.
pub fn circuit_id(option82: &[u8]) -> Option<&[u8]> {
    const CIRCUIT_ID: u8 = 1;
    let mut rest = option82;
    while let [code, len, tail @ ..] = rest {
        let value = tail.get(..usize::from(*len))?;
        if *code == CIRCUIT_ID {
            return Some(value);
        }
        rest = &tail[value.len()..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn file(name: &str) -> Option<String> {
        Some(name.to_owned())
    }

    #[test]
    fn user_classes_are_split_into_rfc_3004_entries() {
        assert_eq!(parse_user_classes(b"\x04iPXE"), vec![b"iPXE".to_vec()]);
        assert_eq!(
            parse_user_classes(b"\x04iPXE\x03abc"),
            vec![b"iPXE".to_vec(), b"abc".to_vec()]
        );
    }

    #[test]
    fn user_class_that_is_not_length_prefixed_is_one_entry() {
        // 'i' (105) runs past the end, so this is a bare string.
        assert_eq!(parse_user_classes(b"iPXE"), vec![b"iPXE".to_vec()]);
        assert_eq!(
            parse_user_classes(b"\x04iPXE\x09x"),
            vec![b"\x04iPXE\x09x".to_vec()]
        );
        assert_eq!(parse_user_classes(b"\x00ab"), vec![b"\x00ab".to_vec()]);
        assert!(parse_user_classes(b"").is_empty());
    }

    #[test]
    fn circuit_id_is_read_from_sub_option_1() {
        // Sub-option 2 (remote id) first, then 1 (circuit id).
        let option82 = b"\x02\x06\x00\x11\x22\x33\x44\x55\x01\x0frack1-sw1-port3";
        assert_eq!(circuit_id(option82), Some(&b"rack1-sw1-port3"[..]));
        assert_eq!(
            circuit_id(b"\x01\x03abc\x02\x01z"),
            Some(&b"abc"[..]),
            "circuit id first"
        );
    }

    #[test]
    fn circuit_id_is_absent_without_sub_option_1_or_when_truncated() {
        assert_eq!(circuit_id(b"\x02\x02ab"), None);
        assert_eq!(circuit_id(b"\x01\x05ab"), None);
        assert_eq!(circuit_id(b"\x02\x09ab\x01\x01x"), None);
        assert_eq!(circuit_id(b""), None);
        assert_eq!(circuit_id(b"\x01"), None);
    }

    #[test]
    fn match_evaluation_table() {
        let ipxe = parse_user_classes(b"\x04iPXE");
        let bare = parse_user_classes(b"iPXE");
        let other = parse_user_classes(b"\x05gPXE2");
        let option82 = b"\x01\x0frack1-sw1-port3\x02\x02ab";
        let rack1 = labels(&[("rack", "r1"), ("role", "worker")]);
        let rack2 = labels(&[("rack", "r2")]);
        let uefi = Traits {
            arch: Some(7),
            vendor_class: Some(b"PXEClient:Arch:00007:UNDI:003016"),
            user_classes: &ipxe,
            circuit_id: circuit_id(option82),
        };
        let bios = Traits {
            arch: Some(0),
            vendor_class: Some(b"PXEClient:Arch:00000:UNDI:002001"),
            user_classes: &bare,
            circuit_id: None,
        };
        let plain = Traits::default();
        let other_class = Traits {
            user_classes: &other,
            ..plain
        };

        let arch = Match {
            arch: vec![7, 9],
            ..Match::default()
        };
        let vendor = Match {
            vendor_class: Some("PXEClient:Arch:00007".into()),
            ..Match::default()
        };
        let user = Match {
            user_class: Some("iPXE".into()),
            ..Match::default()
        };
        let circuit = Match {
            circuit_id: Some("rack1-sw1-port3".into()),
            ..Match::default()
        };
        let label = Match {
            labels: labels(&[("rack", "r1")]),
            ..Match::default()
        };
        let all = Match {
            arch: vec![7],
            vendor_class: Some("PXEClient".into()),
            user_class: Some("iPXE".into()),
            circuit_id: Some("rack1-sw1-port3".into()),
            labels: labels(&[("rack", "r1")]),
        };

        type Labels = BTreeMap<String, String>;
        let table: &[(&str, &Match, &Traits, &Labels, bool)] = &[
            ("arch in list", &arch, &uefi, &rack1, true),
            ("arch not in list", &arch, &bios, &rack1, false),
            ("no arch, list set", &arch, &plain, &rack1, false),
            ("vendor prefix", &vendor, &uefi, &rack1, true),
            ("vendor other prefix", &vendor, &bios, &rack1, false),
            ("no vendor class", &vendor, &plain, &rack1, false),
            ("user class entry", &user, &uefi, &rack1, true),
            ("bare user class", &user, &bios, &rack1, true),
            ("other user class", &user, &other_class, &rack1, false),
            ("no user class", &user, &plain, &rack1, false),
            ("circuit id", &circuit, &uefi, &rack1, true),
            ("no option 82", &circuit, &bios, &rack1, false),
            ("label equal", &label, &plain, &rack1, true),
            ("label differs", &label, &plain, &rack2, false),
            ("label missing", &label, &plain, &BTreeMap::new(), false),
            ("every key", &all, &uefi, &rack1, true),
            ("every key but labels", &all, &uefi, &rack2, false),
            ("every key but arch", &all, &bios, &rack1, false),
        ];
        for (what, when, traits, host_labels, expected) in table {
            assert_eq!(when.matches(traits, host_labels), *expected, "{what}");
        }
    }

    #[test]
    fn vendor_class_prefix_is_case_sensitive_bytes() {
        let when = Match {
            vendor_class: Some("PXEClient".into()),
            ..Match::default()
        };
        let lower = Traits {
            vendor_class: Some(b"pxeclient:Arch:00007"),
            ..Traits::default()
        };
        assert!(!when.matches(&lower, &BTreeMap::new()));
    }

    #[test]
    fn only_arch_and_labels_keep_a_match_request_independent() {
        let mut when = Match {
            arch: vec![7],
            labels: labels(&[("rack", "r1")]),
            ..Match::default()
        };
        assert!(when.depends_on_request_only_through_arch());
        for set in [
            |m: &mut Match| m.vendor_class = Some("PXEClient".into()),
            |m: &mut Match| m.user_class = Some("iPXE".into()),
            |m: &mut Match| m.circuit_id = Some("port3".into()),
        ] {
            let mut changed = when.clone();
            set(&mut changed);
            assert!(!changed.depends_on_request_only_through_arch());
        }
        when.arch.clear();
        when.labels.clear();
        assert!(when.is_empty());
    }

    #[test]
    fn outcome_for_arches_is_known_only_when_the_class_agrees() {
        let bios: &[Option<u16>] = &[None, Some(0)];
        let uefi: &[Option<u16>] = &[Some(7), Some(9)];
        let r1 = labels(&[("rack", "r1")]);
        let both = Match {
            arch: vec![7, 9],
            ..Match::default()
        };
        assert_eq!(both.outcome_for_arches(uefi, &r1), Some(true));
        assert_eq!(both.outcome_for_arches(bios, &r1), Some(false));
        let split = Match {
            arch: vec![7],
            ..Match::default()
        };
        assert_eq!(split.outcome_for_arches(uefi, &r1), None, "splits uefi");
        let zero = Match {
            arch: vec![0],
            ..Match::default()
        };
        assert_eq!(zero.outcome_for_arches(bios, &r1), None, "no option 93");
        let by_label = Match {
            labels: labels(&[("rack", "r1")]),
            ..Match::default()
        };
        assert_eq!(by_label.outcome_for_arches(bios, &r1), Some(true));
        assert_eq!(
            by_label.outcome_for_arches(bios, &BTreeMap::new()),
            Some(false)
        );
        let by_user_class = Match {
            user_class: Some("iPXE".into()),
            labels: labels(&[("rack", "r1")]),
            ..Match::default()
        };
        assert_eq!(by_user_class.outcome_for_arches(uefi, &r1), None);
        assert_eq!(
            by_user_class.outcome_for_arches(uefi, &BTreeMap::new()),
            Some(false),
            "a label mismatch decides without the request"
        );
        let by_user_class_on_arm = Match {
            arch: vec![11],
            ..by_user_class
        };
        assert_eq!(
            by_user_class_on_arm.outcome_for_arches(uefi, &r1),
            Some(false),
            "outside its arch list a match never applies"
        );
    }

    fn worker() -> Profile {
        Profile {
            name: "worker".into(),
            boot: Some(BootFiles {
                bios: file("undionly.kpxe"),
                uefi: file("ipxe.efi"),
                uefi_arm64: None,
                http: file("http://{server}:8080/ipxe.efi"),
                ..BootFiles::default()
            }),
            kernel: None,
            initrd: vec![],
            cmdline: None,
            chain: None,
            local_disk: false,
            netboot: Default::default(),
            options: Default::default(),
            rules: vec![
                Rule {
                    when: Match {
                        arch: vec![7, 9],
                        ..Match::default()
                    },
                    boot: BootFiles {
                        uefi: file("snponly.efi"),
                        ..BootFiles::default()
                    },
                    options: BTreeMap::from([(66, b"first".to_vec()), (150, vec![1])]),
                },
                Rule {
                    when: Match {
                        labels: labels(&[("rack", "r1")]),
                        ..Match::default()
                    },
                    boot: BootFiles {
                        uefi: file("r1.efi"),
                        uefi_arm64: file("r1-arm64.efi"),
                        ..BootFiles::default()
                    },
                    options: BTreeMap::from([(66, b"second".to_vec())]),
                },
                Rule {
                    when: Match {
                        user_class: Some("iPXE".into()),
                        ..Match::default()
                    },
                    boot: BootFiles::default(),
                    options: BTreeMap::from([(224, b"ipxe".to_vec())]),
                },
            ],
            grub: None,
        }
    }

    #[test]
    fn boot_for_lays_matching_rules_over_the_profile_in_order() {
        let profile = worker();
        let uefi = Traits {
            arch: Some(7),
            ..Traits::default()
        };
        let (boot, options) = profile.boot_for(&labels(&[("rack", "r1")]), &uefi);
        let boot = boot.expect("profile has boot");
        assert_eq!(boot.uefi, file("r1.efi"), "the later rule wins");
        assert_eq!(boot.uefi_arm64, file("r1-arm64.efi"), "added by a rule");
        assert_eq!(boot.bios, file("undionly.kpxe"), "kept from the profile");
        assert_eq!(
            options,
            BTreeMap::from([(66, b"second".to_vec()), (150, vec![1])])
        );

        let (boot, options) = profile.boot_for(&labels(&[("rack", "r2")]), &uefi);
        assert_eq!(boot.expect("boot").uefi, file("snponly.efi"));
        assert_eq!(
            options,
            BTreeMap::from([(66, b"first".to_vec()), (150, vec![1])])
        );

        let (boot, options) = profile.boot_for(&BTreeMap::new(), &Traits::default());
        assert_eq!(boot, profile.boot, "no rule matches");
        assert!(options.is_empty());
    }

    #[test]
    fn boot_for_a_profile_without_boot_takes_the_rules_entries() {
        let mut profile = worker();
        profile.boot = None;
        let (boot, _) = profile.boot_for(&labels(&[("rack", "r1")]), &Traits::default());
        assert_eq!(
            boot,
            Some(BootFiles {
                uefi: file("r1.efi"),
                uefi_arm64: file("r1-arm64.efi"),
                ..BootFiles::default()
            })
        );
        let ipxe = parse_user_classes(b"\x04iPXE");
        let traits = Traits {
            user_classes: &ipxe,
            ..Traits::default()
        };
        let (boot, options) = profile.boot_for(&BTreeMap::new(), &traits);
        assert_eq!(boot, None, "an options-only rule adds no boot answer");
        assert_eq!(options, BTreeMap::from([(224, b"ipxe".to_vec())]));
    }

    #[test]
    fn boot_for_arches_needs_the_request_only_where_rules_read_it() {
        let profile = worker();
        let r1 = labels(&[("rack", "r1")]);
        assert!(profile.has_request_dependent_rules());
        // The user-class rule reads the request for every class.
        assert_eq!(profile.boot_for_arches(&r1, &[Some(7), Some(9)]), None);

        let mut compiled = worker();
        compiled.rules.pop();
        assert!(!compiled.has_request_dependent_rules());
        let uefi = compiled
            .boot_for_arches(&r1, &[Some(7), Some(9)])
            .expect("decided for the whole class");
        let traits = Traits {
            arch: Some(9),
            ..Traits::default()
        };
        assert_eq!(uefi, compiled.boot_for(&r1, &traits));
        let (bios, options) = compiled
            .boot_for_arches(&labels(&[("rack", "r2")]), &[None, Some(0)])
            .expect("decided");
        assert_eq!(bios, compiled.boot);
        assert!(options.is_empty());
        assert_eq!(
            compiled.boot_for_arches(&r1, &[Some(7), Some(11)]),
            None,
            "the arch rule splits this set"
        );
    }
}
