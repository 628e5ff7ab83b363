//! `storm-client`: the boot storm simulator `cargo xtask storm` runs in its
//! client namespace. Only the command line lives here; the work is in
//! [`pxe_tests::storm`].

use std::{process::ExitCode, time::Duration};

use pxe_tests::storm::{self, Options};

const USAGE: &str = "usage:
  storm-client --machines FILE --server IP --relay IP --out DIR
               [--spread SECS (0)] [--seed N (1)] [--limit SECS (240)]
               [--ipxe-user-class TEXT (iPXE)] [--phone-home-port PORT]
               [--uuid on|off (on)]

Plays every machine of FILE (mac<TAB>class<TAB>windowsize a line) through
the netboot chain: firmware DHCP relayed from RELAY:67 to SERVER:67, the boot
file over TFTP (or HTTP for uefi_http), iPXE DHCP, the script, its kernel
and initrds, and the phone-home. Each machine starts at a uniform random
offset in --spread; machines not booted within --limit of the start fail.
Writes machines.csv, timeline.csv and summary.json into DIR and prints one
line of key=value fields. --uuid off leaves out option 97.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match options(&args).and_then(|opts| storm::run(&opts).map_err(|err| format!("{err:#}"))) {
        Ok(summary) => {
            println!("{}", summary.line());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("storm-client: {err}");
            ExitCode::FAILURE
        }
    }
}

fn options(args: &[String]) -> Result<Options, String> {
    const KNOWN: &[&str] = &[
        "machines",
        "server",
        "relay",
        "out",
        "spread",
        "seed",
        "limit",
        "ipxe-user-class",
        "phone-home-port",
        "uuid",
    ];
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let name = arg
            .strip_prefix("--")
            .filter(|name| KNOWN.contains(name))
            .ok_or_else(|| format!("unexpected argument {arg:?}\n{USAGE}"))?;
        let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
        pairs.push((name, value));
    }
    let get = |name: &str| {
        pairs
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    };
    let required = |name: &str| get(name).ok_or_else(|| format!("--{name} is required\n{USAGE}"));
    let ip = |name: &str| {
        let text = required(name)?;
        text.parse()
            .map_err(|_| format!("--{name}: {text:?} is not an IPv4 address"))
    };
    let seconds = |name: &str, default: &str| {
        let text = get(name).unwrap_or(default);
        text.parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| format!("--{name}: {text:?} is not a number of seconds"))
    };
    let seed = get("seed").unwrap_or("1");
    let port = get("phone-home-port")
        .map(|p| {
            p.parse()
                .map_err(|_| format!("--phone-home-port: {p:?} is not a port"))
        })
        .transpose()?;
    let uuid = match get("uuid").unwrap_or("on") {
        "on" => true,
        "off" => false,
        other => return Err(format!("--uuid: {other:?} is not on or off")),
    };
    Ok(Options {
        machines: required("machines")?.into(),
        server: ip("server")?,
        relay: ip("relay")?,
        out: required("out")?.into(),
        spread: seconds("spread", "0")?,
        seed: seed
            .parse()
            .map_err(|_| format!("--seed: {seed:?} is not a whole number"))?,
        limit: seconds("limit", "240")?,
        ipxe_user_class: get("ipxe-user-class").unwrap_or("iPXE").to_owned(),
        phone_home_port: port,
        uuid,
    })
}
