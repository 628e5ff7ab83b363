//! The guest's initramfs: busybox-static, the NIC modules and an `/init`
//! that takes an address by DHCP, says so on the console and phones home.
//!
//! `/init` mounts proc, sys and dev, loads the NIC modules in dependency
//! order, runs `udhcpc` on the first network interface (the agent answers
//! it) or, when the phone-home URL names the agent by an IPv6 address,
//! configures the address `pxe.ip6=` gives (busybox has no DHCPv6
//! client; the agent fills it in from the host's `ipv6`), prints
//! `PXE-AGENT-BOOTED <mac> <ip>`, POSTs to the URL given as
//! `pxe.phonehome=` on the kernel command line (with the boot's token, the
//! `pxe_agent.token=` the agent's script puts there, as `?token=`), prints
//! `PXE-AGENT-PHONED-HOME <mac> ok` (or `failed`), and powers off. Anything
//! that goes wrong prints `PXE-AGENT-FAILED <why>` and powers off, so a VM
//! run with `-no-reboot` always ends. With `pxe.stay` on the command line it
//! stays up after the phone-home instead, like an installed host, until
//! something outside (a BMC's power off) stops it. With
//! `pxe.heartbeats=N pxe.heartbeat_every=S` it POSTs to the same URL N more
//! times, S seconds apart, after the phone-home (printing
//! `PXE-AGENT-HEARTBEAT <mac> <i>` each time), then falls silent: a host
//! whose heartbeat stops, for the agent's watchdog. With `pxe.installed`
//! the phone-home is the one shipped for installed systems
//! (`deploy/phone-home/pxe-phone-home`, at the path its systemd unit runs
//! it from), which reads the URL and the token from the command line
//! itself, instead of `/init`'s own.
//!
//! The archive is written here (cpio "newc") and compressed with `gzip`.

use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use super::guest::GuestAssets;

/// Printed once the guest has its address; followed by `<mac> <ip>`.
pub const BOOTED_MARKER: &str = "PXE-AGENT-BOOTED";
/// Printed after the phone-home; followed by `<mac> ok` or `<mac> failed`.
pub const PHONED_HOME_MARKER: &str = "PXE-AGENT-PHONED-HOME";
/// Printed when the guest gives up; followed by the reason.
pub const FAILED_MARKER: &str = "PXE-AGENT-FAILED";

/// The kernel command line parameter `/init` reads the phone-home URL from.
pub const PHONE_HOME_PARAM: &str = "pxe.phonehome";

/// The kernel command line parameter with the guest's IPv6 address and
/// prefix length (`fd00:66::10/64`), configured instead of running DHCP
/// when the phone-home URL names the agent by an IPv6 address (busybox
/// has no DHCPv6 client).
pub const IPV6_PARAM: &str = "pxe.ip6";

/// The kernel command line flag that keeps the guest running after it
/// phoned home (see the module docs).
pub const STAY_PARAM: &str = "pxe.stay";

/// The kernel command line parameters of the heartbeats after the
/// phone-home: how many, and seconds between them (see the module docs).
pub const HEARTBEATS_PARAM: &str = "pxe.heartbeats";
pub const HEARTBEAT_EVERY_PARAM: &str = "pxe.heartbeat_every";

/// The kernel command line flag that makes `/init` phone home with the
/// script shipped for installed systems (see the module docs).
pub const INSTALLED_PARAM: &str = "pxe.installed";

/// The phone-home shipped for installed systems, as the guest runs it.
const INSTALLED_PHONE_HOME: &str = include_str!("../../../deploy/phone-home/pxe-phone-home");

/// Where the guest has it: where `pxe-phone-home.service` runs it from.
const INSTALLED_PHONE_HOME_PATH: &str = "usr/local/sbin/pxe-phone-home";

/// Printed after each heartbeat; followed by `<mac> <i>`.
pub const HEARTBEAT_MARKER: &str = "PXE-AGENT-HEARTBEAT";

/// A profile `cmdline` for this guest: serial console, reboot (so QEMU with
/// `-no-reboot` exits) a second after a panic, and the agent's phone-home
/// URL with the inventory's `{server}` and `{mac}` placeholders.
pub const PROFILE_CMDLINE: &str =
    "console=ttyS0 panic=1 pxe.phonehome=http://{server}:8080/api/v1/hosts/{mac}/booted";

/// [`PROFILE_CMDLINE`] for hosts that may boot over IPv6: the host's IPv6
/// address from the inventory (`{ipv6}`) in the /64 of the boot lab's
/// segment. Over IPv4 `{server}` is an IPv4 address and the guest runs
/// DHCP as before.
pub const PROFILE_CMDLINE6: &str = "console=ttyS0 panic=1 \
     pxe.phonehome=http://{server}:8080/api/v1/hosts/{mac}/booted pxe.ip6={ipv6}/64";

const INIT: &str = r#"#!/bin/busybox sh
# pxe-agent test guest: network up by DHCP, phone home, power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
fail() { echo "PXE-AGENT-FAILED $*"; sync; poweroff -f; }
for m in $(cat /etc/modules); do
    insmod "/lib/modules/$m.ko" || echo "insmod $m failed"
done
IF=
for i in $(seq 100); do
    for d in /sys/class/net/*; do
        n=${d##*/}
        [ "$n" = lo ] || { IF=$n; break; }
    done
    [ -n "$IF" ] && break
    sleep 0.1
done
[ -n "$IF" ] || fail "no network interface"
MAC=$(cat "/sys/class/net/$IF/address")
URL=
IP6=
STAY=
INSTALLED=
BEATS=0
EVERY=10
TOKEN=
for a in $(cat /proc/cmdline); do
    case "$a" in
    pxe.phonehome=*) URL=${a#pxe.phonehome=} ;;
    pxe.ip6=*) IP6=${a#pxe.ip6=} ;;
    pxe_agent.token=*) TOKEN=${a#pxe_agent.token=} ;;
    pxe.stay) STAY=1 ;;
    pxe.installed) INSTALLED=1 ;;
    pxe.heartbeats=*) BEATS=${a#pxe.heartbeats=} ;;
    pxe.heartbeat_every=*) EVERY=${a#pxe.heartbeat_every=} ;;
    esac
done
ip link set lo up
case "$URL" in
*://\[*)
    # The agent was reached over IPv6 (its address in the URL is
    # bracketed): take the host's address from the command line.
    [ -n "$IP6" ] || fail "no pxe.ip6= on the kernel command line for an IPv6 phone-home"
    echo 0 > "/proc/sys/net/ipv6/conf/$IF/accept_dad"
    echo 0 > "/proc/sys/net/ipv6/conf/$IF/autoconf"
    ip link set "$IF" up
    ip -6 addr add "$IP6" dev "$IF" || fail "cannot configure $IP6 on $IF ($MAC)"
    IP=${IP6%/*}
    ;;
*)
    ip link set "$IF" up
    udhcpc -i "$IF" -s /etc/udhcpc.sh -f -q -n -t 10 -T 2 || fail "no DHCP lease on $IF ($MAC)"
    IP=$(cat /tmp/ip)
    ;;
esac
echo "PXE-AGENT-BOOTED $MAC $IP"
[ -n "$URL" ] || fail "no pxe.phonehome= on the kernel command line"
if [ -n "$TOKEN" ]; then
    case "$URL" in
    *\?*) URL="$URL&token=$TOKEN" ;;
    *) URL="$URL?token=$TOKEN" ;;
    esac
fi
phone_home() {
    if [ -n "$INSTALLED" ]; then
        # As an installed system's unit runs it: it reads the command line.
        /usr/local/sbin/pxe-phone-home
    else
        # busybox 1.35's own `wget -T` crashes (static build); bound it
        # from outside.
        timeout 20 wget -q -O /dev/null --post-data "ramdisk up on $IP, kernel $(uname -r)" "$URL"
    fi
}
if phone_home; then
    echo "PXE-AGENT-PHONED-HOME $MAC ok"
else
    echo "PXE-AGENT-PHONED-HOME $MAC failed"
fi
sync
i=0
while [ "$i" -lt "$BEATS" ]; do
    sleep "$EVERY"
    i=$((i + 1))
    timeout 20 wget -q -O /dev/null --post-data "heartbeat $i" "$URL" && echo "PXE-AGENT-HEARTBEAT $MAC $i"
done
if [ -n "$STAY" ]; then
    while :; do sleep 3600; done
fi
poweroff -f
"#;

/// udhcpc's hook: configures the leased address and remembers it.
const UDHCPC_SCRIPT: &str = r#"#!/bin/sh
case "$1" in
bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    [ -n "$router" ] && ip route add default via "${router%% *}" dev "$interface"
    echo "$ip" > /tmp/ip
    ;;
esac
exit 0
"#;

/// Writes the gzip-compressed initramfs for `assets` to `out`.
pub fn build(assets: &GuestAssets, out: &Path) -> anyhow::Result<()> {
    let cpio = archive(assets)?;
    let tmp = out.with_extension("cpio.tmp");
    fs::write(&tmp, &cpio).with_context(|| format!("failed to write {}", tmp.display()))?;
    let result = gzip(&tmp, out);
    let _ = fs::remove_file(&tmp);
    result
}

/// The uncompressed cpio archive.
fn archive(assets: &GuestAssets) -> anyhow::Result<Vec<u8>> {
    let mut cpio = Cpio::default();
    for dir in [
        "bin",
        "dev",
        "etc",
        "lib",
        "lib/modules",
        "proc",
        "sys",
        "tmp",
        "usr",
        "usr/local",
        "usr/local/sbin",
    ] {
        cpio.dir(dir);
    }
    // The console the kernel opens for /init before devtmpfs is mounted.
    cpio.char_dev("dev/console", 0o600, 5, 1);
    let busybox = fs::read(&assets.busybox)
        .with_context(|| format!("failed to read {}", assets.busybox.display()))?;
    cpio.file("bin/busybox", 0o755, &busybox);
    cpio.file("init", 0o755, INIT.as_bytes());
    cpio.file("etc/udhcpc.sh", 0o755, UDHCPC_SCRIPT.as_bytes());
    cpio.file(
        INSTALLED_PHONE_HOME_PATH,
        0o755,
        INSTALLED_PHONE_HOME.as_bytes(),
    );
    let mut order = String::new();
    for module in &assets.kernel.modules {
        let name = module
            .file_stem()
            .and_then(|n| n.to_str())
            .context("module file name")?;
        let bytes =
            fs::read(module).with_context(|| format!("failed to read {}", module.display()))?;
        cpio.file(&format!("lib/modules/{name}.ko"), 0o644, &bytes);
        order.push_str(name);
        order.push('\n');
    }
    cpio.file("etc/modules", 0o644, order.as_bytes());
    Ok(cpio.finish())
}

fn gzip(input: &Path, out: &Path) -> anyhow::Result<()> {
    let src =
        fs::File::open(input).with_context(|| format!("failed to open {}", input.display()))?;
    let dst =
        fs::File::create(out).with_context(|| format!("failed to create {}", out.display()))?;
    let status = Command::new("gzip")
        .args(["-n", "-c"])
        .stdin(src)
        .stdout(dst)
        .stderr(Stdio::inherit())
        .status()
        .context("failed to run gzip")?;
    if !status.success() {
        bail!("gzip failed ({status}) writing {}", out.display());
    }
    Ok(())
}

/// A cpio archive in the "newc" format the kernel unpacks (see the kernel's
/// Documentation/driver-api/early-userspace/buffer-format.rst). Owner root,
/// mtime 0, so the same inputs give the same bytes.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;

impl Cpio {
    fn dir(&mut self, name: &str) {
        self.entry(name, S_IFDIR | 0o755, 2, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, S_IFREG | perm, 1, (0, 0), data);
    }

    fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) {
        self.entry(name, S_IFCHR | perm, 1, (major, minor), &[]);
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let size = u32::try_from(data.len()).expect("cpio newc entries are under 4 GiB");
        let namesize = u32::try_from(name.len() + 1).expect("short name");
        let fields = [
            self.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, namesize, 0,
        ];
        self.buf.extend_from_slice(b"070701");
        for field in fields {
            self.buf
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.ino = 0;
        self.entry("TRAILER!!!", 0, 1, (0, 0), &[]);
        self.buf
    }
}

/// Whether an archive holds `name`.
#[cfg(test)]
fn contains(cpio: &[u8], name: &str) -> anyhow::Result<bool> {
    let mut at = 0;
    while at + 110 <= cpio.len() {
        anyhow::ensure!(&cpio[at..at + 6] == b"070701", "bad cpio magic at {at}");
        let field = |i: usize| -> anyhow::Result<usize> {
            let hex = std::str::from_utf8(&cpio[at + 6 + i * 8..at + 14 + i * 8])?;
            Ok(usize::from_str_radix(hex, 16)?)
        };
        let (size, namesize) = (field(6)?, field(11)?);
        let name_start = at + 110;
        let entry = std::str::from_utf8(&cpio[name_start..name_start + namesize - 1])?;
        if entry == "TRAILER!!!" {
            return Ok(false);
        }
        if entry == name {
            return Ok(true);
        }
        let data_start = (name_start + namesize).next_multiple_of(4);
        at = (data_start + size).next_multiple_of(4);
    }
    bail!("cpio archive ends without a trailer")
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::vm::guest::GuestKernel;

    #[test]
    fn newc_entries_are_aligned_and_end_with_a_trailer() {
        let mut cpio = Cpio::default();
        cpio.dir("bin");
        cpio.file("init", 0o755, b"#!/bin/sh\n");
        cpio.char_dev("dev/console", 0o600, 5, 1);
        let bytes = cpio.finish();
        assert_eq!(bytes.len() % 4, 0);
        assert!(bytes.starts_with(b"070701"));
        assert!(contains(&bytes, "init").expect("parses"));
        assert!(contains(&bytes, "dev/console").expect("parses"));
        assert!(!contains(&bytes, "etc/missing").expect("parses"));
        // The mode field of the first entry is a directory.
        assert_eq!(&bytes[14..22], b"000041ed");
    }

    #[test]
    fn archive_holds_init_busybox_and_modules_in_order() {
        let dir = std::env::temp_dir().join(format!("pxe-initramfs-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let path = |name: &str| -> PathBuf {
            let p = dir.join(name);
            fs::write(&p, name).expect("write");
            p
        };
        let assets = GuestAssets {
            kernel: GuestKernel {
                package: "linux-image-test".into(),
                release: "test".into(),
                vmlinuz: path("vmlinuz"),
                modules: vec![path("virtio_ring.ko"), path("virtio_net.ko")],
            },
            busybox: path("busybox"),
        };
        let bytes = archive(&assets).expect("archive");
        for name in [
            "init",
            "bin/busybox",
            "etc/udhcpc.sh",
            INSTALLED_PHONE_HOME_PATH,
            "lib/modules/virtio_ring.ko",
            "lib/modules/virtio_net.ko",
        ] {
            assert!(contains(&bytes, name).expect("parses"), "{name} missing");
        }
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("virtio_ring\nvirtio_net\n"), "module order");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn init_prints_the_markers_the_tests_look_for() {
        for marker in [
            BOOTED_MARKER,
            PHONED_HOME_MARKER,
            FAILED_MARKER,
            HEARTBEAT_MARKER,
        ] {
            assert!(INIT.contains(marker), "{marker}");
        }
        assert!(INIT.contains(&format!("{PHONE_HOME_PARAM}=")));
        assert!(INIT.contains(&format!("{STAY_PARAM})")));
        assert!(INIT.contains(&format!("{INSTALLED_PARAM})")));
        assert!(INIT.contains(&format!("/{INSTALLED_PHONE_HOME_PATH}\n")));
        assert!(INIT.contains(&format!("{IPV6_PARAM}=*)")));
        assert!(PROFILE_CMDLINE6.contains(&format!("{IPV6_PARAM}={{ipv6}}/")));
        assert!(INIT.contains(&format!("{HEARTBEATS_PARAM}=*)")));
        assert!(INIT.contains(&format!("{HEARTBEAT_EVERY_PARAM}=*)")));
        assert!(PROFILE_CMDLINE.contains(&format!("{PHONE_HOME_PARAM}=")));
    }

    #[test]
    fn the_guest_has_the_installed_phone_home_where_its_unit_runs_it() {
        let unit = include_str!("../../../deploy/phone-home/pxe-phone-home.service");
        assert!(
            unit.lines()
                .any(|l| l == format!("ExecStart=/{INSTALLED_PHONE_HOME_PATH}")),
            "{unit}"
        );
        assert!(INSTALLED_PHONE_HOME.contains(&format!("{PHONE_HOME_PARAM}=*)")));
    }
}
