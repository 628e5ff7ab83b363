//! The profiles' and rules' part of the inventory's rules: each profile's
//! boot files, URLs, kernel, grub and rules checked, every problem named by
//! the profile's name and field.

use super::*;

pub(super) fn profiles(raw: &[RawProfile], problems: &mut Vec<Problem>) -> Vec<Profile> {
    let mut out: Vec<Profile> = Vec::with_capacity(raw.len());
    for (index, entry) in raw.iter().enumerate() {
        // Fields are named by profile name, which operators search for; the
        // name itself is named by position, as it may be empty or repeated.
        let prefix = if entry.name.is_empty() {
            format!("profiles[{index}]")
        } else {
            format!("profiles[{}]", entry.name.escape_debug())
        };
        if entry.name.is_empty() {
            problems.push(Problem::new(
                None,
                format!("profiles[{index}].name"),
                "must not be empty",
            ));
        } else if let Some(message) = control_problem(&entry.name) {
            problems.push(Problem::new(
                None,
                format!("profiles[{index}].name"),
                message,
            ));
        } else if let Some(first) = out.iter().position(|p| p.name == entry.name) {
            problems.push(Problem::new(
                None,
                format!("profiles[{index}].name"),
                format!(
                    "profile name {:?} is already used by profiles[{first}]",
                    entry.name
                ),
            ));
        }
        let mut report = |key: &str, message: String| {
            problems.push(Problem::new(None, format!("{prefix}.{key}"), message));
        };

        if let Some(boot) = &entry.boot {
            check_boot(boot, &mut report);
        }
        if let Some(url) = &entry.chain
            && let Some(message) = url_problem(url, MAX_BOOT_URL_LEN, "dhcp option 67")
        {
            report("chain", message);
        }
        let rules: Vec<Rule> = entry
            .rules
            .iter()
            .enumerate()
            .map(|(position, rule)| {
                check_rule(rule, &mut |key: &str, message| {
                    let field = if key.is_empty() {
                        format!("rules[{position}]")
                    } else {
                        format!("rules[{position}].{key}")
                    };
                    report(&field, message);
                })
            })
            .collect();
        if entry.kernel.as_deref() == Some("") {
            report("kernel", "must not be empty".to_owned());
        } else if let Some(message) = entry.kernel.as_deref().and_then(control_problem) {
            report("kernel", message);
        }
        for (position, initrd) in entry.initrd.iter().enumerate() {
            let message = if initrd.is_empty() {
                Some("must not be empty".to_owned())
            } else {
                control_problem(initrd)
            };
            if let Some(message) = message {
                report(&format!("initrd[{position}]"), message);
            }
        }
        if let Some(message) = entry.cmdline.as_deref().and_then(control_problem) {
            report("cmdline", message);
        }
        if let Some(bmc) = &entry.bmc {
            oob::check_profile_bmc(bmc, &mut report);
        }
        if let Some(recovery) = &entry.recovery {
            oob::check_profile_recovery(recovery, &mut report);
        }
        if let Some(grub) = &entry.grub {
            check_grub(entry, grub, &mut report);
        }
        let netboot = netboot(entry.netboot.as_deref(), &mut report).unwrap_or_default();
        let options = options(&entry.options, &mut |key, message| {
            report(&format!("options.{key}"), message)
        });
        if entry.kernel.is_none() {
            if !entry.initrd.is_empty() {
                report(
                    "initrd",
                    "is set but kernel is not; an initrd is only loaded with a kernel".to_owned(),
                );
            }
            if entry.cmdline.is_some() {
                report(
                    "cmdline",
                    "is set but kernel is not; a command line is only passed to a kernel"
                        .to_owned(),
                );
            }
        }

        out.push(Profile {
            name: entry.name.clone(),
            boot: entry.boot.as_ref().map(boot_files),
            kernel: entry.kernel.clone(),
            initrd: entry.initrd.clone(),
            cmdline: entry.cmdline.clone(),
            chain: entry.chain.clone(),
            local_disk: entry.local_disk,
            rules,
            grub: entry.grub.as_ref().map(grub_settings),
            netboot,
            options,
        });
    }
    out
}

/// The file name a grub profile's config is served under: leading `/`
/// dropped, as the TFTP server takes names relative to its root.
fn grub_settings(raw: &RawGrub) -> GrubSettings {
    let config = raw.config.as_deref().unwrap_or(DEFAULT_GRUB_CONFIG);
    GrubSettings {
        config: config.trim_start_matches('/').to_owned(),
    }
}

/// A grub profile: a config name grub can ask for, no iPXE `chain`, and
/// kernel and initrds that grub can fetch (`tftp://` or `http://` URLs).
fn check_grub(entry: &RawProfile, grub: &RawGrub, report: &mut dyn FnMut(&str, String)) {
    if let Some(config) = &grub.config {
        let name = config.trim_start_matches('/');
        if name.is_empty() || name.ends_with('/') {
            report("grub.config", format!("{config:?} names no file"));
        } else if name.split('/').any(|c| c == "..") {
            report("grub.config", format!("{config:?} has a `..` component"));
        } else if name.len() > 255 {
            report("grub.config", "is longer than 255 bytes".to_owned());
        } else if let Some(message) = control_problem(config) {
            report("grub.config", message);
        } else if config.contains(char::is_whitespace) {
            report("grub.config", format!("{config:?} contains whitespace"));
        }
    }
    if entry.chain.is_some() {
        report(
            "chain",
            "grub cannot chain an iPXE script: a grub profile boots its kernel".to_owned(),
        );
    }
    let urls = entry.kernel.iter().map(|k| ("kernel".to_owned(), k)).chain(
        entry
            .initrd
            .iter()
            .enumerate()
            .map(|(i, u)| (format!("initrd[{i}]"), u)),
    );
    for (key, url) in urls {
        if super::super::grub_path(url).is_none() {
            report(
                &key,
                format!("{url:?} is not a tftp:// or http:// URL with a host, which grub needs"),
            );
        }
    }
}

fn boot_files(boot: &RawBoot) -> BootFiles {
    BootFiles {
        bios: boot.bios.clone(),
        uefi: boot.uefi.clone(),
        uefi_arm64: boot.uefi_arm64.clone(),
        http: boot.http.clone(),
        http_arm64: boot.http_arm64.clone(),
        http_ia32: boot.http_ia32.clone(),
    }
}

/// Checks one rule of a profile; `report` gets keys relative to the rule,
/// the empty key meaning the rule as a whole.
fn check_rule(raw: &RawRule, report: &mut impl FnMut(&str, String)) -> Rule {
    let RawMatch {
        arch,
        vendor_class,
        user_class,
        circuit_id,
        labels,
    } = &raw.when;
    let when = Match {
        arch: arch.clone(),
        vendor_class: vendor_class.clone(),
        user_class: user_class.clone(),
        circuit_id: circuit_id.clone(),
        labels: labels.clone(),
    };
    if when.is_empty() {
        report(
            "match",
            "matches every request; set at least one of arch, vendor_class, user_class, \
             circuit_id or labels (or change the profile itself)"
                .to_owned(),
        );
    }
    for (key, text) in [
        ("match.vendor_class", vendor_class),
        ("match.user_class", user_class),
        ("match.circuit_id", circuit_id),
    ] {
        if let Some(text) = text
            && let Some(message) = class_problem(text)
        {
            report(key, message);
        }
    }

    let boot = raw.boot.as_ref().map(boot_files).unwrap_or_default();
    if let Some(raw_boot) = &raw.boot {
        check_boot(raw_boot, report);
    }
    let options = options(&raw.options, &mut |field, message| {
        report(&format!("options.{field}"), message)
    });
    if boot.is_empty() && raw.options.is_empty() {
        report(
            "",
            "changes nothing; give it a boot entry or options".to_owned(),
        );
    }
    Rule {
        when,
        boot,
        options,
    }
}

/// Option 60 prefixes, option 77 entries and circuit ids: non-empty text
/// that fits one length octet.
pub(super) fn class_problem(text: &str) -> Option<String> {
    if text.is_empty() {
        Some("must not be empty".to_owned())
    } else if text.len() > MAX_CLASS_LEN {
        Some(format!(
            "is {} bytes; a dhcp option holds at most {MAX_CLASS_LEN}",
            text.len()
        ))
    } else {
        None
    }
}

fn check_boot(boot: &RawBoot, report: &mut impl FnMut(&str, String)) {
    let files = [
        ("boot.bios", &boot.bios),
        ("boot.uefi", &boot.uefi),
        ("boot.uefi_arm64", &boot.uefi_arm64),
    ];
    for (key, file) in files {
        let Some(file) = file else { continue };
        if file.is_empty() {
            report(key, "must not be empty".to_owned());
        } else if let Some(message) = control_problem(file)
            .or_else(|| too_long(file, MAX_BOOT_FILE_LEN, "the bootp file field"))
        {
            report(key, message);
        }
    }
    let urls = [
        ("boot.http", &boot.http),
        ("boot.http_arm64", &boot.http_arm64),
        ("boot.http_ia32", &boot.http_ia32),
    ];
    for (key, url) in urls {
        if let Some(url) = url
            && let Some(message) = url_problem(url, MAX_BOOT_URL_LEN, "dhcp option 67")
        {
            report(key, message);
        }
    }
}
