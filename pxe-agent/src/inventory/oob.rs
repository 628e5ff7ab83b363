//! Out-of-band settings of a host: its BMC (address, user, where the
//! password comes from, boot mode) and its recovery policy (whether a boot
//! is expected, deadlines, attempts, heartbeat, what is left set once
//! booted). Owns the recovery model, the defaults of both, the merge of a
//! profile's defaults with a host's own block, reading the password when
//! the inventory loads, and the duration format (`30s`, `10m`, `1h30m`).
//! The BMC settings' model is `bmc::settings`'.
//!
//! It does not talk to a BMC nor decide when to recover a host: that is
//! `bmc` and `recovery`. Passwords are never inline in the file and never
//! appear in a [`Problem`].

use std::{
    collections::HashMap,
    ffi::OsString,
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use super::raw::{RawBmc, RawRecovery, RawStages};
use crate::bmc::{
    BmcAddress, Credentials, Password, TlsOptions,
    settings::{BmcSettings, BootMode, DriverKind, FallbackSettings, PasswordSource},
};

/// Default of `recovery.deadline`: how long a host marked `expect_boot` has
/// to phone home, and the phone-home stage of a recovery.
pub const DEFAULT_RECOVERY_DEADLINE: Duration = Duration::from_secs(10 * 60);
/// Default of `recovery.max_attempts`.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Highest `recovery.max_attempts`: more is a loop, not a policy.
const MAX_ATTEMPTS_LIMIT: u32 = 100;
/// Default of `recovery.stages.dhcp`: power action to the first DHCP answer.
pub const DEFAULT_DHCP_DEADLINE: Duration = Duration::from_secs(3 * 60);
/// Default of `recovery.stages.boot_file`: DHCP answer to the boot file.
pub const DEFAULT_BOOT_FILE_DEADLINE: Duration = Duration::from_secs(2 * 60);
/// Default of `recovery.stages.script`: boot file to the iPXE script.
pub const DEFAULT_SCRIPT_DEADLINE: Duration = Duration::from_secs(2 * 60);

/// Default of `bmc.fallback_hold`.
pub const DEFAULT_FALLBACK_HOLD: Duration = crate::bmc::fallback::DEFAULT_HOLD;

/// What boot device is left set once a recovered host has booted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterBoot {
    /// Persistent boot from disk, so the next reboot does not reinstall.
    #[default]
    Disk,
    /// Leave the boot device alone (the PXE override was one-time).
    None,
}

/// Deadlines of the stages of a recovery before the phone-home.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageDeadlines {
    /// From the power action to the first DHCP answer.
    pub dhcp: Duration,
    /// From the DHCP answer to the boot file (TFTP or HTTP).
    pub boot_file: Duration,
    /// From the boot file to the iPXE script.
    pub script: Duration,
}

impl Default for StageDeadlines {
    fn default() -> Self {
        StageDeadlines {
            dhcp: DEFAULT_DHCP_DEADLINE,
            boot_file: DEFAULT_BOOT_FILE_DEADLINE,
            script: DEFAULT_SCRIPT_DEADLINE,
        }
    }
}

/// When and how a host is recovered through its BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoverySettings {
    /// Recover the host when it has not phoned home within `deadline` of
    /// the agent learning of it.
    pub expect_boot: bool,
    /// How long to wait for the phone-home (also the last stage of a
    /// recovery).
    pub deadline: Duration,
    /// Recovery attempts before the host is `failed`; at least 1.
    pub max_attempts: u32,
    /// A booted host that has not phoned home for this long is recovered.
    pub heartbeat: Option<Duration>,
    pub after_boot: AfterBoot,
    pub stages: StageDeadlines,
}

impl Default for RecoverySettings {
    fn default() -> Self {
        RecoverySettings {
            expect_boot: false,
            deadline: DEFAULT_RECOVERY_DEADLINE,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            heartbeat: None,
            after_boot: AfterBoot::Disk,
            stages: StageDeadlines::default(),
        }
    }
}

/// Where validation reads passwords from: the real file system and
/// environment, a fake in tests, or the Secrets the Kubernetes source read
/// (which answers `password_env` names it made up itself).
pub trait SecretSource {
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn var(&self, name: &str) -> Option<OsString>;
}

/// The process's file system and environment.
pub(super) struct System;

impl SecretSource for System {
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn var(&self, name: &str) -> Option<OsString> {
        std::env::var_os(name)
    }
}

/// Reads secrets through a [`SecretSource`], each file and variable once
/// however many hosts share it.
pub(super) struct Secrets<'a> {
    source: &'a dyn SecretSource,
    /// Relative `password_file`s are relative to this directory (the
    /// inventory file's).
    base: PathBuf,
    cache: HashMap<PasswordSource, Result<Password, String>>,
}

impl<'a> Secrets<'a> {
    pub(super) fn new(source: &'a dyn SecretSource, inventory: &Path) -> Secrets<'a> {
        Secrets {
            source,
            base: inventory
                .parent()
                .map(Path::to_owned)
                .unwrap_or_else(|| PathBuf::from(".")),
            cache: HashMap::new(),
        }
    }

    fn resolve(&self, file: &str) -> PathBuf {
        let path = Path::new(file);
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.base.join(path)
        }
    }

    /// The password, or why it cannot be had; the reason never holds any
    /// of the secret.
    fn password(&mut self, from: &PasswordSource) -> Result<Password, String> {
        if let Some(cached) = self.cache.get(from) {
            return cached.clone();
        }
        let read = match from {
            PasswordSource::File(path) => self
                .source
                .read_file(path)
                .map_err(|e| format!("cannot read password file {}: {e}", path.display()))
                .map(trim_line_end)
                .and_then(|bytes| {
                    if bytes.is_empty() {
                        Err(format!("password file {} is empty", path.display()))
                    } else {
                        Ok(Password::new(bytes))
                    }
                }),
            PasswordSource::Env(name) => match self.source.var(name) {
                None => Err(format!("environment variable {name} is not set")),
                Some(value) if value.is_empty() => {
                    Err(format!("environment variable {name} is empty"))
                }
                Some(value) => Ok(Password::new(value.into_encoded_bytes())),
            },
        };
        self.cache.insert(from.clone(), read.clone());
        read
    }

    /// Whether `bmc`'s password source still gives the password it holds.
    pub(super) fn still_reads(&mut self, bmc: &BmcSettings) -> bool {
        self.password(&bmc.password_from)
            .is_ok_and(|now| &now == bmc.credentials.password())
    }
}

/// A password file usually ends with the newline of the editor or of
/// `echo`: one trailing `\n` or `\r\n` is not part of the password.
fn trim_line_end(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    bytes
}

/// Parses `30s`, `10m`, `1h`, `1h30m`, `500ms` as every duration is
/// written ([`crate::when::parse_duration`]); at least 1 s in total.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let total = crate::when::parse_duration(text)?;
    if total < Duration::from_secs(1) {
        return Err(format!("{text:?} is shorter than the minimum of 1s"));
    }
    // Deadlines become unix-millisecond times: keep far from overflow.
    if total > Duration::from_secs(365 * 24 * 3600) {
        return Err(format!("{text:?} is longer than the maximum of one year"));
    }
    Ok(total)
}

/// A profile's `bmc` block as defaults for its hosts; `report` gets keys
/// relative to the block.
pub(super) fn check_profile_bmc(raw: &RawBmc, report: &mut impl FnMut(&str, String)) {
    if raw.password.is_some() {
        report("bmc.password", inline_password());
    }
    if raw.address.is_some() {
        report(
            "bmc.address",
            "is per host: a BMC address in a profile would be shared by all its hosts; \
             set it on each host"
                .to_owned(),
        );
    }
    if raw.password_file.is_some() && raw.password_env.is_some() {
        report("bmc.password_env", both_sources());
    }
    if let Some(mode) = &raw.boot_mode
        && let Err(message) = boot_mode(mode)
    {
        report("bmc.boot_mode", message);
    }
    check_profile_fallback(raw, report);
}

/// A profile's `drivers` and `fallback_hold` (its hosts' defaults); `ipmi`
/// is per host, as `address` is.
fn check_profile_fallback(raw: &RawBmc, report: &mut impl FnMut(&str, String)) {
    if raw.ipmi.is_some() {
        report(
            "bmc.ipmi",
            "is per host, as bmc.address is: set it on each host".to_owned(),
        );
    }
    if let Some(list) = &raw.drivers {
        let _ = driver_list(list).map_err(|m| report("bmc.drivers", m));
    }
    if let Some(text) = &raw.fallback_hold {
        let _ = parse_duration(text).map_err(|m| report("bmc.fallback_hold", m));
    }
}

/// `bmc.drivers` as kinds: one or two, no repeats.
fn driver_list(list: &[String]) -> Result<Vec<DriverKind>, String> {
    let kinds = list
        .iter()
        .map(|d| DriverKind::parse(d))
        .collect::<Result<Vec<_>, _>>()?;
    match kinds.as_slice() {
        [] => Err("lists no driver (expected e.g. [redfish, ipmi])".to_owned()),
        [_] => Ok(kinds),
        [a, b] if a != b => Ok(kinds),
        [_, _] => Err(format!("lists {} twice", kinds[0].name())),
        _ => Err("lists more than two drivers (expected e.g. [redfish, ipmi])".to_owned()),
    }
}

/// The host's second driver from its `ipmi`, `drivers` and
/// `fallback_hold` over its profile's; `Err` after reporting a problem.
fn fallback(
    own: &RawBmc,
    profile: Option<&RawBmc>,
    address: &BmcAddress,
    report: &mut impl FnMut(&str, String),
) -> Result<Option<FallbackSettings>, ()> {
    let ipmi = match &own.ipmi {
        None => None,
        Some(text) => match text.parse::<BmcAddress>() {
            Ok(a @ BmcAddress::Ipmi { .. }) => Some(a),
            Ok(other) => {
                report(
                    "bmc.ipmi",
                    format!("must be an ipmi:// address, not {other}"),
                );
                return Err(());
            }
            Err(e) => {
                report("bmc.ipmi", e.to_string());
                return Err(());
            }
        },
    };
    if ipmi.is_some() && DriverKind::of(address) == DriverKind::Ipmi {
        report(
            "bmc.ipmi",
            "bmc.address is already an IPMI address: bmc.ipmi names the IPMI address \
             beside a Redfish bmc.address"
                .to_owned(),
        );
        return Err(());
    }
    let own_list = own.drivers.as_ref();
    let drivers = match own_list.or_else(|| profile.and_then(|p| p.drivers.as_ref())) {
        None => None,
        Some(list) => match driver_list(list) {
            Ok(kinds) => Some(kinds),
            Err(message) => {
                // A profile's list was reported with the profile.
                if own_list.is_some() {
                    report("bmc.drivers", message);
                }
                return Err(());
            }
        },
    };
    let Some(ipmi) = ipmi else {
        let kind = DriverKind::of(address);
        // A profile's list is for those of its hosts that have two
        // addresses; a host's own must match its one address.
        if let Some(kinds) = drivers.as_ref().filter(|_| own_list.is_some())
            && let Some(missing) = kinds.iter().find(|k| **k != kind)
        {
            let hint = match missing {
                DriverKind::Ipmi => "set bmc.ipmi: ipmi://HOST beside the Redfish bmc.address",
                DriverKind::Redfish => {
                    "make bmc.address the Redfish address and name the IPMI one in bmc.ipmi"
                }
            };
            report(
                "bmc.drivers",
                format!(
                    "lists {} but the host has no {} address: {hint}",
                    missing.name(),
                    missing.name()
                ),
            );
            return Err(());
        }
        if own.fallback_hold.is_some() {
            report(
                "bmc.fallback_hold",
                "applies to a host with two drivers only (bmc.ipmi beside a Redfish bmc.address)"
                    .to_owned(),
            );
            return Err(());
        }
        return Ok(None);
    };
    let first = match drivers.as_deref() {
        None => DriverKind::Redfish,
        Some([first, _]) => *first,
        Some([only]) => {
            report(
                "bmc.drivers",
                format!(
                    "lists only {} but bmc.ipmi is set: list both (e.g. [redfish, ipmi]) or \
                     drop bmc.ipmi",
                    only.name()
                ),
            );
            return Err(());
        }
        Some(_) => return Err(()),
    };
    let hold = match own
        .fallback_hold
        .as_ref()
        .or_else(|| profile.and_then(|p| p.fallback_hold.as_ref()))
    {
        None => DEFAULT_FALLBACK_HOLD,
        Some(text) => match parse_duration(text) {
            Ok(d) => d,
            Err(message) => {
                if own.fallback_hold.is_some() {
                    report("bmc.fallback_hold", message);
                }
                return Err(());
            }
        },
    };
    Ok(Some(FallbackSettings {
        ipmi,
        first,
        hold,
        host: String::new(),
    }))
}

/// A profile's `recovery` block as defaults for its hosts.
pub(super) fn check_profile_recovery(raw: &RawRecovery, report: &mut impl FnMut(&str, String)) {
    apply(&mut RecoverySettings::default(), raw, report);
}

fn inline_password() -> String {
    "inline passwords are refused: the inventory is often world-readable, \
     kept in version control and printed in diffs; use password_file (a file \
     readable only by the agent) or password_env (an environment variable) instead"
        .to_owned()
}

fn both_sources() -> String {
    "set either password_file or password_env, not both".to_owned()
}

fn boot_mode(text: &str) -> Result<BootMode, String> {
    match text {
        "legacy" => Ok(BootMode::Legacy),
        "uefi" => Ok(BootMode::Uefi),
        other => Err(format!(
            "unknown boot mode {other:?} (expected legacy or uefi)"
        )),
    }
}

/// The host's BMC from its own block over its profile's; `None` without
/// an address in either (reported when the host has a block of its own).
/// `report` gets keys relative to the host (`bmc.password_file`).
pub(super) fn bmc(
    profile: Option<&RawBmc>,
    host: Option<&RawBmc>,
    secrets: &mut Secrets<'_>,
    report: &mut impl FnMut(&str, String),
) -> Option<BmcSettings> {
    let own = host?;
    let mut ok = true;
    if own.password.is_some() {
        report("bmc.password", inline_password());
        ok = false;
    }
    if own.password_file.is_some() && own.password_env.is_some() {
        report("bmc.password_env", both_sources());
        ok = false;
    }
    let address = match &own.address {
        None => {
            report(
                "bmc.address",
                "is required: the BMC's address, e.g. ipmi://10.77.0.2:623".to_owned(),
            );
            None
        }
        Some(text) => match text.parse::<BmcAddress>() {
            Ok(address) => Some(address),
            Err(e) => {
                report("bmc.address", e.to_string());
                None
            }
        },
    };
    let pick = |f: fn(&RawBmc) -> Option<&String>| f(own).or_else(|| profile.and_then(f)).cloned();
    let username = pick(|b| b.username.as_ref());
    if username.is_none() {
        report(
            "bmc.username",
            "is required (on the host or in its profile's bmc block)".to_owned(),
        );
    }
    let mode = match (&own.boot_mode, profile.and_then(|p| p.boot_mode.as_ref())) {
        (Some(text), _) => boot_mode(text)
            .map_err(|message| report("bmc.boot_mode", message))
            .ok(),
        // Reported with the profile, not again for each of its hosts.
        (None, Some(text)) => boot_mode(text).ok(),
        (None, None) => Some(BootMode::default()),
    };
    // The password source is one setting: a host that names one replaces
    // its profile's, whichever kind either is.
    let source_of = |b: &RawBmc| {
        b.password_file
            .as_deref()
            .map(|f| {
                (
                    "bmc.password_file",
                    PasswordSource::File(secrets.resolve(f)),
                )
            })
            .or_else(|| {
                b.password_env
                    .clone()
                    .map(|n| ("bmc.password_env", PasswordSource::Env(n)))
            })
    };
    let source = source_of(own).or_else(|| profile.and_then(source_of));
    let password = match &source {
        None => {
            report(
                "bmc.password_file",
                "a password is required: set password_file or password_env (on the host \
                 or in its profile's bmc block)"
                    .to_owned(),
            );
            None
        }
        Some((field, from)) => secrets
            .password(from)
            .map_err(|message| report(field, message))
            .ok(),
    };
    let ca_file = pick(|b| b.ca_file.as_ref()).map(|f| secrets.resolve(&f));
    let insecure = own
        .insecure
        .or_else(|| profile.and_then(|p| p.insecure))
        .unwrap_or(false);
    let https = matches!(&address, Some(BmcAddress::Redfish(r)) if r.https);
    if let Some(address) = &address
        && !https
    {
        let what = match address {
            BmcAddress::Redfish(_) => "a redfish+http:// address (plain HTTP)",
            BmcAddress::Ipmi { .. } => "an IPMI address",
        };
        if own.ca_file.is_some() {
            report(
                "bmc.ca_file",
                format!("applies to Redfish over HTTPS only, not to {what}"),
            );
            ok = false;
        }
        if own.insecure == Some(true) {
            report(
                "bmc.insecure",
                format!("applies to Redfish over HTTPS only, not to {what}"),
            );
            ok = false;
        }
    }
    if insecure && own.ca_file.is_some() {
        report(
            "bmc.insecure",
            "set either ca_file (verify against that CA) or insecure: true (verify nothing),              not both"
                .to_owned(),
        );
        ok = false;
    }
    let fallback = match &address {
        Some(address) => fallback(own, profile, address, report).ok(),
        None => Some(None),
    };
    let (address, username, mode, password, (field, from), fallback) =
        (address?, username?, mode?, password?, source?, fallback?);
    if !ok {
        return None;
    }
    let credentials = Credentials::new(username, password)
        .and_then(|c| {
            // The IPMI limits bind only a host spoken to over IPMI.
            if DriverKind::of(&address) == DriverKind::Ipmi || fallback.is_some() {
                c.check_ipmi()?;
            }
            Ok(c)
        })
        .map_err(|e| {
            let field = match e {
                crate::bmc::CredentialError::PasswordTooLong { .. } => field,
                _ => "bmc.username",
            };
            let also = if fallback.is_some() {
                " (the limit of its bmc.ipmi address)"
            } else {
                ""
            };
            report(field, format!("{e}{also}"));
        })
        .ok()?;
    Some(BmcSettings {
        address,
        credentials,
        password_from: from,
        boot_mode: mode,
        tls: TlsOptions {
            ca_file: ca_file.filter(|_| !insecure),
            insecure,
        },
        fallback,
    })
}

/// `settings` with the host's name in its fallback, for the log and the
/// audit log.
pub(super) fn named(mut settings: BmcSettings, host: &str) -> BmcSettings {
    if let Some(f) = &mut settings.fallback {
        f.host = host.to_owned();
    }
    settings
}

/// The host's recovery policy from its own block over its profile's;
/// `None` when neither has one. `report` gets keys relative to the host
/// (`recovery.deadline`); the profile's own problems were reported with
/// the profile ([`check_profile_recovery`]), not again for each host.
pub(super) fn recovery(
    profile: Option<&RawRecovery>,
    host: Option<&RawRecovery>,
    report: &mut impl FnMut(&str, String),
) -> Option<RecoverySettings> {
    if profile.is_none() && host.is_none() {
        return None;
    }
    let mut out = RecoverySettings::default();
    if let Some(profile) = profile {
        apply(&mut out, profile, &mut |_, _| {});
    }
    if let Some(host) = host {
        apply(&mut out, host, report);
    }
    Some(out)
}

/// Sets the keys `raw` has over `out`.
fn apply(out: &mut RecoverySettings, raw: &RawRecovery, report: &mut impl FnMut(&str, String)) {
    fn duration(key: &str, text: &str, report: &mut impl FnMut(&str, String)) -> Option<Duration> {
        parse_duration(text)
            .map_err(|message| report(&format!("recovery.{key}"), message))
            .ok()
    }
    if let Some(expect) = raw.expect_boot {
        out.expect_boot = expect;
    }
    if let Some(d) = raw
        .deadline
        .as_ref()
        .and_then(|t| duration("deadline", t, report))
    {
        out.deadline = d;
    }
    if let Some(text) = &raw.heartbeat {
        if text == "off" {
            out.heartbeat = None;
        } else if let Some(d) = duration("heartbeat", text, report) {
            out.heartbeat = Some(d);
        }
    }
    if let Some(RawStages {
        dhcp,
        boot_file,
        script,
    }) = &raw.stages
    {
        for (key, text, slot) in [
            ("stages.dhcp", dhcp, &mut out.stages.dhcp),
            ("stages.boot_file", boot_file, &mut out.stages.boot_file),
            ("stages.script", script, &mut out.stages.script),
        ] {
            if let Some(d) = text.as_ref().and_then(|t| duration(key, t, report)) {
                *slot = d;
            }
        }
    }
    if let Some(attempts) = raw.max_attempts {
        if (1..=MAX_ATTEMPTS_LIMIT).contains(&attempts) {
            out.max_attempts = attempts;
        } else {
            report(
                "recovery.max_attempts",
                format!("{attempts} is out of range 1..={MAX_ATTEMPTS_LIMIT}"),
            );
        }
    }
    if let Some(after) = &raw.after_boot {
        match after.as_str() {
            "disk" => out.after_boot = AfterBoot::Disk,
            "none" => out.after_boot = AfterBoot::None,
            other => report(
                "recovery.after_boot",
                format!("unknown after_boot {other:?} (expected disk or none)"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_largest_first() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1s500ms"), Ok(Duration::from_millis(1500)));
        for bad in ["", "10", "m", "10x", "1m1h", "1s1s", "-1s", "1.5m", "10 m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_duration("500ms").unwrap_err().contains("minimum"));
        assert!(parse_duration("9000h").unwrap_err().contains("maximum"));
        assert!(parse_duration("99999999999999999999h").is_err());
    }

    #[test]
    fn one_trailing_newline_is_not_part_of_a_password_file() {
        assert_eq!(trim_line_end(b"secret\n".to_vec()), b"secret");
        assert_eq!(trim_line_end(b"secret\r\n".to_vec()), b"secret");
        assert_eq!(trim_line_end(b"secret\n\n".to_vec()), b"secret\n");
        assert_eq!(trim_line_end(b" secret ".to_vec()), b" secret ");
    }
}
