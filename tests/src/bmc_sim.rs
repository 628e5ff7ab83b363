//! One OpenIPMI `ipmi_sim` process: its `lan.conf`, emulation file, state
//! directory and `chassis_control` program, started by PID in a namespace
//! the test made, and the ways tests talk to it (the IPMI client, ipmitool)
//! and read what it was asked to do.
//!
//! It owns no namespace and no address: callers bring both (`bmc.rs` a
//! veth lab, `bmc_lab.rs` a boot lab or a fleet). What the chassis program
//! does with power requests is either recorded only, or handed to a guest
//! watcher (see [`crate::bmc_lab`]) when the state directory holds a file
//! named [`GUEST_MARKER`].

use std::{
    fs,
    future::Future,
    net::UdpSocket,
    os::unix::fs::PermissionsExt as _,
    path::PathBuf,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime},
};

use pxe_agent::bmc::{BootFlagEcho, Credentials, IpmiBmc, Password, RetryPolicy};
use xtask::{ChildGuard, process};

use crate::{agent::Scratch, raw::in_netns};

/// The password of both simulator users.
pub const PASSWORD: &str = "pxe-sim-secret";
/// The simulator's Administrator user.
pub const ADMIN: &str = "admin";
/// A user whose privilege is limited to User.
pub const VIEWER: &str = "viewer";
/// The RMCP port ipmi_sim listens on.
pub const PORT: u16 = 623;

/// Its presence in the chassis directory hands power requests to a guest
/// watcher instead of only recording them.
pub const GUEST_MARKER: &str = "guest";
/// The chassis directory file one power request waits in for the watcher.
pub const REQUEST_FILE: &str = "request";
/// The watcher's answer to the request: `ok`, or why it failed.
pub const REPLY_FILE: &str = "reply";
/// `0` or `1`: what `get power` answers.
pub const POWER_FILE: &str = "power";
/// The boot device ipmi_sim last set (`pxe`, `default` for disk, `bios`, …).
pub const BOOT_FILE: &str = "boot";
/// One line per `set power 1` received: Unix time, `seconds.nanoseconds`.
pub const POWER_ON_LOG: &str = "power-on.log";
/// Seconds (`0.5`) every chassis call sleeps before acting, when present:
/// makes calls long enough that overlapping ones are seen in [`SPAN_LOG`].
pub const DELAY_FILE: &str = "delay";
/// One line per chassis call: its start and end (Unix time, as in
/// [`POWER_ON_LOG`]), then its arguments.
pub const SPAN_LOG: &str = "spans.log";

/// ipmi_sim runs this through `sh -c` (popen) as `<prog> get <parm>...` or
/// `<prog> set <parm> "<value>"...` and waits for it to exit, answering the
/// IPMI request only then: power on/off is `set power 1|0`, power cycle is
/// `set power 0` and, from a 1 s timer, `set power 1`; hard reset
/// `set reset 1`; soft off `set shutdown 1`; the boot device
/// `set boot pxe|default|bios|cdrom|none` (disk is `default`). Every call is
/// logged, every power-on time-stamped, every call's start and end kept
/// (after the sleep [`DELAY_FILE`] asks for). With a guest watcher the power
/// requests wait (at most 10 s) for the watcher to act on them, and an
/// error from it fails the IPMI request.
const CHASSIS_SCRIPT: &str = r#"#!/bin/sh
dir=$(dirname "$0")
start=$(date +%s.%N) args="$*"
echo "$@" >> "$dir/calls.log"
[ -f "$dir/delay" ] && sleep "$(cat "$dir/delay")"
op=$1; shift
[ -f "$dir/power" ] || echo 0 > "$dir/power"
to_guest() {
  echo "$1 $2" > "$dir/request.tmp" && mv "$dir/request.tmp" "$dir/request"
  i=0
  while [ -e "$dir/request" ]; do
    i=$((i + 1))
    if [ $i -gt 500 ]; then rm -f "$dir/request"; echo "no guest watcher" >&2; exit 1; fi
    sleep 0.02
  done
  reply=$(cat "$dir/reply")
  [ "$reply" = ok ] || { echo "$reply" >&2; exit 1; }
}
if [ "$op" = get ]; then
  for p in "$@"; do
    case $p in
      power) echo "power:$(cat "$dir/power")";;
      boot) echo "boot:$(cat "$dir/boot" 2>/dev/null || echo default)";;
    esac
  done
else
  while [ $# -gt 1 ]; do
    [ "$1 $2" = "power 1" ] && date +%s.%N >> "$dir/power-on.log"
    case $1 in
      boot) echo "$2" > "$dir/boot";;
      power|reset|shutdown)
        [ "$1" = power ] || echo "$1 $2" >> "$dir/actions"
        if [ -e "$dir/guest" ]; then to_guest "$1" "$2"
        elif [ "$1" = power ]; then echo "$2" > "$dir/power"; fi;;
      *) echo "$1 $2" >> "$dir/actions";;
    esac
    shift 2
  done
fi
echo "$start $(date +%s.%N) $args" >> "$dir/spans.log"
"#;

/// The BMC's device: manufacturer 0x1291, product 0x0f02, IPMI 2.0.
const EMULATION: &str =
    "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nmc_enable 0x20\n";

/// How long [`IpmiSim::start`] waits for the first answer.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running ipmi_sim. Field order matters: the process stops before its
/// directory goes.
pub struct IpmiSim {
    child: Option<ChildGuard>,
    ns: String,
    ip: String,
    dir: Scratch,
}

impl IpmiSim {
    /// Starts ipmi_sim in `ns` on `ip`:623 and waits until it answers.
    pub fn start(ns: &str, ip: &str) -> IpmiSim {
        let sim = IpmiSim::spawn(ns, ip);
        sim.wait_ready(READY_TIMEOUT);
        sim
    }

    /// Writes the configuration and starts ipmi_sim without waiting for it
    /// (so many can start at once; see [`IpmiSim::wait_ready`]).
    pub fn spawn(ns: &str, ip: &str) -> IpmiSim {
        let dir = Scratch::new("ipmisim");
        let script = dir.path("chassis.sh");
        fs::write(&script, CHASSIS_SCRIPT).expect("write chassis program");
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755))
            .expect("make chassis program executable");
        let lan = format!(
            r#"name "pxesim"
set_working_mc 0x20
  startlan 1
    addr {ip} {PORT}
    priv_limit admin
    allowed_auths_callback none md5 straight
    allowed_auths_user none md5 straight
    allowed_auths_operator none md5 straight
    allowed_auths_admin none md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "{}"
  user 2 true "{ADMIN}" "{PASSWORD}" admin 10 md5 straight none
  user 3 true "{VIEWER}" "{PASSWORD}" user 10 md5 straight none
"#,
            script.display()
        );
        fs::write(dir.path("lan.conf"), lan).expect("write lan.conf");
        fs::write(dir.path("sim.emu"), EMULATION).expect("write emulation file");
        fs::create_dir_all(dir.path("state")).expect("create state dir");
        let mut sim = IpmiSim {
            child: None,
            ns: ns.to_owned(),
            ip: ip.to_owned(),
            dir,
        };
        sim.spawn_process();
        sim
    }

    fn spawn_process(&mut self) {
        let log = fs::File::create(self.dir.path("sim.log")).expect("create sim.log");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, "ipmi_sim", "-c"])
            .arg(self.dir.path("lan.conf"))
            .arg("-f")
            .arg(self.dir.path("sim.emu"))
            .arg("-s")
            .arg(self.dir.path("state"))
            .arg("-n")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log);
        self.child =
            Some(ChildGuard::spawn(&mut cmd).expect("spawn ipmi_sim (apt-get install openipmi)"));
    }

    /// Waits until the simulator answers an RMCP presence ping (ASF, DMTF
    /// DSP0136 §3.2.4.1) on its address, from its own namespace.
    pub fn wait_ready(&self, timeout: Duration) {
        let sock = in_netns(&self.ns, || UdpSocket::bind("0.0.0.0:0"))
            .expect("enter BMC namespace")
            .expect("bind ping socket");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("socket timeout");
        // RMCP v1.0, no ACK, class ASF; IANA 4542, Presence Ping, tag 1.
        let ping = [
            0x06, 0x00, 0xff, 0x06, 0x00, 0x00, 0x11, 0xbe, 0x80, 0x01, 0x00, 0x00,
        ];
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 64];
        while Instant::now() < deadline {
            let _ = sock.send_to(&ping, (self.ip.as_str(), PORT));
            // Presence Pong: message type 0x40.
            if let Ok(n) = sock.recv(&mut buf)
                && n > 8
                && buf[8] == 0x40
            {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "ipmi_sim on {} in {} did not answer within {timeout:?}; its log:\n{}",
            self.ip,
            self.ns,
            self.log()
        );
    }

    /// Kills the simulator by its PID and starts it again (same state
    /// directory, so the power state and boot device survive).
    pub fn restart(&mut self) {
        if let Some(child) = self.child.take() {
            child.stop().expect("stop ipmi_sim");
        }
        self.spawn_process();
        self.wait_ready(READY_TIMEOUT);
    }

    /// Sends SIGTERM without waiting, so a fleet stops in parallel; the
    /// guard reaps it on drop.
    pub fn begin_stop(&self) {
        if let Some(child) = &self.child
            && let Ok(pid) = libc::pid_t::try_from(child.id())
        {
            // SAFETY: kill(2) with our own unreaped child's PID.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }

    pub fn ip(&self) -> &str {
        &self.ip
    }

    /// The namespace the simulator runs in.
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// Where the chassis program keeps its files (see the `*_FILE` consts).
    pub fn chassis_dir(&self) -> PathBuf {
        self.dir.0.clone()
    }

    /// A chassis file, trimmed; empty if missing.
    pub fn state(&self, file: &str) -> String {
        fs::read_to_string(self.dir.path(file))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// ipmi_sim's own output.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path("sim.log")).unwrap_or_default()
    }

    /// Every `set power 1` the chassis program received, in order.
    pub fn power_ons(&self) -> Vec<SystemTime> {
        parse_power_ons(&self.state(POWER_ON_LOG))
    }

    /// Every chassis call so far: (start, end, arguments), in order.
    pub fn spans(&self) -> Vec<Span> {
        parse_spans(&self.state(SPAN_LOG))
    }

    /// Makes every later chassis call sleep `delay` before acting.
    pub fn set_call_delay(&self, delay: Duration) {
        fs::write(
            self.dir.path(DELAY_FILE),
            format!("{:.3}\n", delay.as_secs_f64()),
        )
        .expect("write chassis delay");
    }

    /// An IPMI client for `user` on `port` of this BMC.
    pub fn client(&self, port: u16, user: &str, password: &str, policy: RetryPolicy) -> IpmiBmc {
        let creds = Credentials::new(user, Password::new(password)).expect("credentials");
        let addr = format!("ipmi://{}:{port}", self.ip)
            .parse()
            .expect("BMC address");
        // ipmi_sim keeps only the device selector of the boot flags.
        IpmiBmc::new(&addr, creds, policy)
            .expect("IPMI client")
            .with_boot_flag_echo(BootFlagEcho::DeviceOnly)
    }

    /// The Administrator's client on the RMCP port.
    pub fn admin(&self, policy: RetryPolicy) -> IpmiBmc {
        self.client(PORT, ADMIN, PASSWORD, policy)
    }

    /// Runs `ipmitool -I lanplus -C 3` as the Administrator from `from_ns`.
    pub fn ipmitool(&self, from_ns: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns", "exec", from_ns, "ipmitool", "-I", "lanplus", "-C", "3",
        ])
        .args(["-H", &self.ip, "-U", ADMIN, "-P", PASSWORD])
        .args(args);
        process::run(&mut cmd)
    }
}

/// Runs `f` on a current-thread runtime inside namespace `ns`; sockets the
/// IPMI client opens there (on its blocking pool) stay in it.
pub fn block_on_in<T: Send + 'static, F: Future<Output = T> + 'static>(
    ns: &str,
    f: impl FnOnce() -> F + Send + 'static,
) -> T {
    in_netns(ns, move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f())
    })
    .expect("enter namespace")
}

/// Lines of `seconds.nanoseconds` (what `date +%s.%N` prints).
fn parse_power_ons(log: &str) -> Vec<SystemTime> {
    log.lines()
        .filter_map(|line| parse_time(line.trim()))
        .collect()
}

fn parse_time(text: &str) -> Option<SystemTime> {
    let (secs, frac) = text.split_once('.')?;
    // `%N` prints nine digits; shorter fractions are tenths, hundredths, ….
    let nanos = format!("{frac:0<9}");
    let at = Duration::new(secs.parse().ok()?, nanos.get(..9)?.parse().ok()?);
    Some(SystemTime::UNIX_EPOCH + at)
}

/// One chassis program run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub start: SystemTime,
    pub end: SystemTime,
    /// `get power`, `set power "1"`, …
    pub args: String,
}

/// Lines of `start end args...` ([`SPAN_LOG`]).
fn parse_spans(log: &str) -> Vec<Span> {
    log.lines()
        .filter_map(|line| {
            let mut parts = line.trim().splitn(3, ' ');
            Some(Span {
                start: parse_time(parts.next()?)?,
                end: parse_time(parts.next()?)?,
                args: parts.next().unwrap_or_default().to_owned(),
            })
        })
        .collect()
}

/// A retry policy short enough for tests on a local link.
pub fn quick() -> RetryPolicy {
    RetryPolicy {
        deadline: Duration::from_secs(4),
        attempt_timeout: Duration::from_millis(500),
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(400),
        max_attempts: 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_spans_parse_from_the_span_log() {
        let spans = parse_spans("1700000000.5 1700000001.25 set power 1\nbad\n");
        assert_eq!(
            spans,
            [Span {
                start: SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 500_000_000),
                end: SystemTime::UNIX_EPOCH + Duration::new(1_700_000_001, 250_000_000),
                args: "set power 1".into(),
            }]
        );
    }

    #[test]
    fn power_on_times_parse_from_date_output() {
        let times = parse_power_ons("1700000000.000000001\n1700000001.500000000\n\ngarbage\n");
        assert_eq!(
            times,
            [
                SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 1),
                SystemTime::UNIX_EPOCH + Duration::new(1_700_000_001, 500_000_000),
            ]
        );
    }
}
