//! `dhcp-loadgen`: the DHCP load generator `cargo xtask bench dhcp` runs
//! inside a client namespace, and the `BPF_PROG_TEST_RUN` timer.
//!
//! ```text
//! dhcp-loadgen run --interface IF [--send-on IF] --macs FILE [--rate N|max] [--duration S]
//!                  [--drain S] [--timeout S] [--window N] [--user-class TEXT]
//!                  [--relay GIADDR --server IP --server-mac MAC]
//! dhcp-loadgen prog-test-run [--runs N] [--pinned DIR --mac MAC [--class CLASS]]
//! ```
//!
//! Each prints one machine-readable line of `key=value` fields. Only the
//! command line lives here; the work is in [`pxe_tests::loadgen`].

use std::{process::ExitCode, time::Duration};

use pxe_tests::loadgen::{self, Class, Options, Relay};

const USAGE: &str = "usage:
  dhcp-loadgen run --interface IF [--send-on IF] --macs FILE [--rate N|max] [--duration SECS]
                   [--drain SECS] [--timeout SECS] [--window N] [--user-class TEXT]
                   [--relay GIADDR --server IP --server-mac MAC]
  dhcp-loadgen prog-test-run [--runs N] [--pinned DIR --mac MAC [--class CLASS]]

run: DORA exchanges at N new ones per second (max: as fast as the window
of outstanding exchanges allows, default 1024) for --duration (3 s), then
waits up to --drain (1 s) for late answers; an exchange is lost after
--timeout (1 s). --user-class puts TEXT in option 77 of every request
(iPXE sends `iPXE`). Answers are read on --interface; requests are sent
there too, or on --send-on. --relay sends the requests as a relay agent
would (from GIADDR:67, with giaddr set and the MAC of --interface, unicast
to the server's IP and MAC), instead of as broadcasts from the clients.

prog-test-run: the XDP program's kernel time per reply, a DISCOVER and its
REQUEST each run N times (100000), one BPF_PROG_TEST_RUN call a run. On a
program loaded with the test inventory, or with --pinned on the program a
running agent pinned in DIR (its --pin-dir joined with the interface) and
its maps, for the host --mac, asking as --class (bios, uefi, uefi_arm64 or
http; default bios).";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.split_first() {
        Some((cmd, rest)) if cmd == "run" => run(rest),
        Some((cmd, rest)) if cmd == "prog-test-run" => prog_test_run(rest),
        _ => Err(USAGE.to_owned()),
    };
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("dhcp-loadgen: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<String, String> {
    let flags = Flags::parse(
        args,
        &[
            "interface",
            "send-on",
            "macs",
            "rate",
            "duration",
            "drain",
            "timeout",
            "window",
            "user-class",
            "relay",
            "server",
            "server-mac",
        ],
    )?;
    let macs_path = flags.required("macs")?;
    let text = std::fs::read_to_string(macs_path)
        .map_err(|err| format!("failed to read {macs_path}: {err}"))?;
    let rate = match flags.get("rate").unwrap_or("max") {
        "max" => None,
        n => Some(parse_number(n, "rate")?),
    };
    // A rate needs no window: the bucket bounds it, and the table holds
    // far more exchanges than a timeout's worth at any rate it can send.
    let window = match (flags.get("window"), rate) {
        (Some(n), _) => parse_number(n, "window")? as usize,
        (None, None) => 1024,
        (None, Some(_)) => usize::MAX,
    };
    let opts = Options {
        iface: flags.required("interface")?.to_owned(),
        send_iface: flags.get("send-on").map(str::to_owned),
        macs: loadgen::parse_macs(&text).map_err(|err| format!("{macs_path}: {err}"))?,
        rate,
        duration: seconds(flags.get("duration").unwrap_or("3"), "duration")?,
        drain: seconds(flags.get("drain").unwrap_or("1"), "drain")?,
        timeout: seconds(flags.get("timeout").unwrap_or("1"), "timeout")?,
        window,
        user_class: flags.get("user-class").map(|c| c.as_bytes().to_vec()),
        relay: relay(&flags)?,
    };
    if opts.window == 0 {
        return Err("--window must be at least 1".to_owned());
    }
    if opts
        .user_class
        .as_ref()
        .is_some_and(|c| c.is_empty() || c.len() > 255)
    {
        return Err("--user-class must be 1 to 255 bytes".to_owned());
    }
    let report =
        loadgen::run(&opts).map_err(|err| format!("load on {} failed: {err}", opts.iface))?;
    Ok(report.line())
}

/// `--relay GIADDR --server IP --server-mac MAC`, all or none.
fn relay(flags: &Flags) -> Result<Option<Relay>, String> {
    let Some(giaddr) = flags.get("relay") else {
        return Ok(None);
    };
    let ip = |name: &str| -> Result<std::net::Ipv4Addr, String> {
        let text = flags.required(name)?;
        text.parse()
            .map_err(|_| format!("--{name}: {text:?} is not an IPv4 address"))
    };
    let mac = |text: &str, what: &str| {
        loadgen::parse_macs(text)
            .ok()
            .and_then(|macs| macs.first().copied())
            .ok_or_else(|| format!("{what}: {text:?} is not a MAC address"))
    };
    let iface = flags.required("interface")?;
    let path = format!("/sys/class/net/{iface}/address");
    let own = std::fs::read_to_string(&path).map_err(|err| format!("{path}: {err}"))?;
    let giaddr = giaddr
        .parse()
        .map_err(|_| format!("--relay: {giaddr:?} is not an IPv4 address"))?;
    Ok(Some(Relay {
        giaddr,
        relay_mac: mac(own.trim(), &path)?,
        server_ip: ip("server")?,
        server_mac: mac(flags.required("server-mac")?, "--server-mac")?,
    }))
}

fn prog_test_run(args: &[String]) -> Result<String, String> {
    let flags = Flags::parse(args, &["runs", "pinned", "mac", "class"])?;
    let runs = parse_number(flags.get("runs").unwrap_or("100000"), "runs")?;
    if runs == 0 {
        return Err("--runs must be at least 1".to_owned());
    }
    let Some(dir) = flags.get("pinned") else {
        if flags.get("mac").is_some() || flags.get("class").is_some() {
            return Err(format!("--mac and --class go with --pinned\n{USAGE}"));
        }
        return Ok(loadgen::kernel_time_per_reply(runs).line());
    };
    let text = flags.required("mac")?;
    let mac = loadgen::parse_macs(text)
        .ok()
        .and_then(|macs| macs.first().copied())
        .ok_or_else(|| format!("--mac: {text:?} is not a MAC address"))?;
    let class = flags.get("class").unwrap_or("bios");
    let class = Class::parse(class)
        .ok_or_else(|| format!("--class: {class:?} is not one of bios, uefi, uefi_arm64, http"))?;
    Ok(loadgen::kernel_time_pinned(std::path::Path::new(dir), mac, class, runs)?.line())
}

/// `--name value` pairs, each name from a fixed list.
struct Flags(Vec<(String, String)>);

impl Flags {
    fn parse(args: &[String], known: &[&str]) -> Result<Flags, String> {
        let mut pairs = Vec::new();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let name = arg
                .strip_prefix("--")
                .filter(|name| known.contains(name))
                .ok_or_else(|| format!("unexpected argument {arg:?}\n{USAGE}"))?;
            let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
            pairs.push((name.to_owned(), value.clone()));
        }
        Ok(Flags(pairs))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn required(&self, name: &str) -> Result<&str, String> {
        self.get(name)
            .ok_or_else(|| format!("--{name} is required\n{USAGE}"))
    }
}

fn parse_number(text: &str, name: &str) -> Result<u32, String> {
    text.parse()
        .map_err(|_| format!("--{name}: {text:?} is not a whole number"))
}

fn seconds(text: &str, name: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("--{name}: {text:?} is not a number of seconds"))
}
