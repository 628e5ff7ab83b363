//! QEMU virtual machines that network-boot with real firmware: SeaBIOS with
//! the NIC's iPXE option ROM, or OVMF doing UEFI PXE or UEFI HTTP boot
//! (over IPv4, or over IPv6 with the system UUID its DUID carries).
//!
//! A VM runs under TCG (KVM is not usable on the machines this runs on), on
//! a tap device inside a lab namespace, with one virtio-net NIC and no
//! disks, and its serial console written to a file. [`Vm`] follows that
//! file for the markers the guest's `/init` prints (see
//! [`super::initramfs`]) and stops QEMU, by its PID, when dropped.

use std::{
    ffi::OsString,
    fs,
    io::{Read as _, Seek as _, SeekFrom},
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::initramfs::{BOOTED_MARKER, FAILED_MARKER, PHONED_HOME_MARKER};
use crate::process::ChildGuard;

/// The QEMU binary (Debian package `qemu-system-x86`).
pub const QEMU: &str = "qemu-system-x86_64";
/// OVMF's code and variable store templates (Debian package `ovmf`).
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE.fd";
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS.fd";
/// OVMF built with Secure Boot (its variables in SMM-protected flash), and
/// a variable store with Microsoft's keys enrolled and Secure Boot on, as
/// on a stock PC (Debian package `ovmf`).
pub const OVMF_SECBOOT_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
pub const OVMF_MS_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd";
/// Guest memory unless a spec says otherwise.
pub const DEFAULT_MEMORY_MB: u32 = 384;

/// What the VM's firmware does to boot from the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS runs the NIC's option ROM (Debian's ipxe-qemu: iPXE), whose
    /// very first DHCP request already says user class "iPXE".
    Bios,
    /// OVMF's own PXE client (arch 7): TFTP boot file, then iPXE.
    UefiPxe,
    /// OVMF's HTTP boot client (vendor class "HTTPClient", arch 16), with
    /// PXE switched off.
    UefiHttp,
    /// OVMF's PXE client over IPv6 (DHCPv6, option 59 `tftp://[..]/file`),
    /// its IPv4 PXE switched off.
    UefiPxe6,
    /// OVMF's HTTP boot client, which tries IPv4 and then IPv6, with PXE
    /// switched off: on a segment without IPv4 it boots over IPv6.
    UefiHttp6,
}

impl Firmware {
    pub fn label(self) -> &'static str {
        match self {
            Firmware::Bios => "BIOS (SeaBIOS + iPXE ROM)",
            Firmware::UefiPxe => "UEFI PXE (OVMF)",
            Firmware::UefiHttp => "UEFI HTTP boot (OVMF)",
            Firmware::UefiPxe6 => "UEFI PXE over IPv6 (OVMF)",
            Firmware::UefiHttp6 => "UEFI HTTP boot over IPv6 (OVMF)",
        }
    }

    fn uefi(self) -> bool {
        !matches!(self, Firmware::Bios)
    }
}

/// Where the firmware looks for something to boot, as a BMC's boot device
/// selects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BootSource {
    /// The NIC: the firmware's network boot (`-boot order=n` under SeaBIOS).
    #[default]
    Network,
    /// The (absent) disk only: `-boot order=c,strict=on`, and no network
    /// boot code in the firmware, so it finds nothing to boot and never
    /// tries the network. `strict` alone does not stop SeaBIOS: QEMU only
    /// writes its `HALT` entry when some device has a `bootindex`, and
    /// SeaBIOS then falls through from the disk to the NIC's option ROM,
    /// so the NIC gets no ROM. OVMF gets its IPv4 PXE switched off (its
    /// HTTP boot client stays; not used with [`Firmware::UefiHttp`]).
    Disk,
}

/// One VM to start.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// Short name; names its files in `dir`.
    pub name: String,
    /// The NIC's MAC address, `52:54:00:…` style.
    pub mac: String,
    pub firmware: Firmware,
    pub boot: BootSource,
    /// The tap device (in the namespace the VM runs in) its NIC is wired to.
    pub tap: String,
    pub memory_mb: u32,
    /// UEFI firmware with Secure Boot enforcing (Microsoft's keys enrolled)
    /// instead of the plain OVMF build; see [`VmSpec::secure_boot`].
    pub secure_boot: bool,
    /// The SMBIOS system UUID (`-uuid`), which UEFI firmware sends as its
    /// DHCPv6 DUID-UUID and iPXE as its DUID.
    pub uuid: Option<String>,
    /// Where the console log, QEMU's own output and the UEFI variable store go.
    pub dir: PathBuf,
}

impl VmSpec {
    pub fn new(name: &str, mac: &str, firmware: Firmware, tap: &str, dir: &Path) -> Self {
        Self {
            name: name.to_owned(),
            mac: mac.to_ascii_lowercase(),
            firmware,
            boot: BootSource::Network,
            tap: tap.to_owned(),
            memory_mb: DEFAULT_MEMORY_MB,
            secure_boot: false,
            uuid: None,
            dir: dir.to_path_buf(),
        }
    }

    /// Runs the UEFI firmware with Secure Boot enforcing: the secboot OVMF
    /// build on a q35 machine with SMM (which guards its variable store),
    /// and a copy of the variable store with Microsoft's keys enrolled, so
    /// only images signed by Microsoft's UEFI CA (such as shim) start.
    pub fn secure_boot(mut self) -> Self {
        self.secure_boot = true;
        self
    }

    /// The firmware code and variable store template this VM runs with.
    fn ovmf(&self) -> (&'static str, &'static str) {
        if self.secure_boot {
            (OVMF_SECBOOT_CODE, OVMF_MS_VARS)
        } else {
            (OVMF_CODE, OVMF_VARS)
        }
    }

    /// The system UUID the firmware reports (`-uuid`).
    pub fn uuid(mut self, uuid: &str) -> Self {
        self.uuid = Some(uuid.to_owned());
        self
    }

    pub fn memory_mb(mut self, mb: u32) -> Self {
        self.memory_mb = mb;
        self
    }

    pub fn boot_from(mut self, boot: BootSource) -> Self {
        self.boot = boot;
        self
    }

    /// The serial console's log file.
    pub fn console_path(&self) -> PathBuf {
        self.dir.join(format!("{}.console.log", self.name))
    }

    /// QEMU's own output.
    pub fn qemu_log_path(&self) -> PathBuf {
        self.dir.join(format!("{}.qemu.log", self.name))
    }

    /// The last `lines` lines this guest wrote to its console (in its last
    /// run, if it is not running), cleaned of terminal escapes.
    pub fn console_tail(&self, lines: usize) -> String {
        let text = fs::read(self.console_path()).unwrap_or_default();
        let all: Vec<String> = text.split(|&b| b == b'\n').map(clean_line).collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// QEMU's own output of this guest's last start.
    pub fn qemu_log(&self) -> String {
        fs::read_to_string(self.qemu_log_path()).unwrap_or_default()
    }

    /// QEMU's arguments; `vars` is this VM's copy of the UEFI variable store.
    fn args(&self, vars: Option<&Path>) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut push = |a: &str| args.push(a.into());
        push("-name");
        push(&self.name);
        push("-accel");
        push("tcg");
        push("-m");
        push(&self.memory_mb.to_string());
        push("-smp");
        push("1");
        push("-nodefaults");
        if let Some(uuid) = &self.uuid {
            push("-uuid");
            push(uuid);
        }
        if self.secure_boot {
            // The secboot build keeps its variables in flash only SMM code
            // may write, so the OS cannot switch Secure Boot off.
            push("-machine");
            push("q35,smm=on");
            push("-global");
            push("driver=cfi.pflash01,property=secure,value=on");
        }
        // No display; with -nographic, QEMU also tells SeaBIOS to copy its
        // screen (and the option ROM's, iPXE's) to the serial port.
        push("-nographic");
        push("-monitor");
        push("none");
        // Power-off and panics end the QEMU process instead of rebooting.
        push("-no-reboot");
        push("-netdev");
        push(&format!(
            "tap,id=net0,ifname={},script=no,downscript=no",
            self.tap
        ));
        // OVMF drives virtio-net itself; an empty romfile keeps the NIC's
        // iPXE ROM out, so the firmware's own PXE / HTTP client runs. On
        // disk, SeaBIOS gets no ROM either (see `BootSource::Disk`).
        let rom = if self.firmware.uefi() || self.boot == BootSource::Disk {
            ",romfile="
        } else {
            ""
        };
        push("-device");
        push(&format!("virtio-net-pci,netdev=net0,mac={}{rom}", self.mac));
        match (self.firmware, self.boot) {
            (Firmware::Bios, BootSource::Network) => {
                push("-boot");
                push("order=n");
            }
            (_, BootSource::Disk) => {
                push("-boot");
                push("order=c,strict=on");
            }
            _ => {}
        }
        if self.firmware.uefi() {
            let (code, _) = self.ovmf();
            push("-drive");
            push(&format!(
                "if=pflash,format=raw,unit=0,readonly=on,file={code}"
            ));
            let v6 = if self.firmware == Firmware::UefiPxe6 {
                "y"
            } else {
                "n"
            };
            push("-fw_cfg");
            push(&format!(
                "name=opt/org.tianocore/IPv6PXESupport,string={v6}"
            ));
            if matches!(
                self.firmware,
                Firmware::UefiHttp | Firmware::UefiPxe6 | Firmware::UefiHttp6
            ) || self.boot == BootSource::Disk
            {
                push("-fw_cfg");
                push("name=opt/org.tianocore/IPv4PXESupport,string=n");
            }
        }
        if let Some(vars) = vars {
            args.push("-drive".into());
            let mut drive = OsString::from("if=pflash,format=raw,unit=1,file=");
            drive.push(vars);
            args.push(drive);
        }
        args.push("-serial".into());
        let mut serial = OsString::from("file:");
        serial.push(self.console_path());
        args.push(serial);
        args
    }
}

/// Fails with what to install when QEMU or the firmware `spec` runs is
/// missing.
pub fn check_prerequisites(spec: &VmSpec) -> anyhow::Result<()> {
    if crate::process::output(Command::new(QEMU).arg("--version")).is_err() {
        bail!("{QEMU} not found: install qemu-system-x86 and ipxe-qemu (`cargo xtask setup`)");
    }
    if spec.firmware.uefi() {
        let (code, vars) = spec.ovmf();
        for file in [code, vars] {
            if !Path::new(file).is_file() {
                bail!("{file} not found: install ovmf (`cargo xtask setup`)");
            }
        }
    }
    Ok(())
}

/// How a VM's boot went.
#[derive(Debug, Clone)]
pub struct BootReport {
    pub name: String,
    pub mac: String,
    pub firmware: Firmware,
    /// From start to the guest's `PXE-AGENT-BOOTED` line (address leased).
    pub booted_after: Option<Duration>,
    /// The guest's phone-home POST succeeded (`PXE-AGENT-PHONED-HOME <mac> ok`).
    pub phoned_home: bool,
    /// From start to the phone-home line.
    pub phoned_home_after: Option<Duration>,
    /// The address the guest leased, from its marker line.
    pub ip: Option<String>,
    /// Why the guest gave up, from its `PXE-AGENT-FAILED` line.
    pub failure: Option<String>,
    /// QEMU's exit status, unless it was stopped at the deadline.
    pub exit: Option<ExitStatus>,
    pub timed_out: bool,
}

impl BootReport {
    /// One line for logs and assertion messages.
    pub fn summary(&self) -> String {
        let secs =
            |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64()));
        format!(
            "{} {} [{}]: phoned home: {} (after {}), address {} (after {}){}{}",
            self.name,
            self.mac,
            self.firmware.label(),
            if self.phoned_home { "yes" } else { "NO" },
            secs(self.phoned_home_after),
            self.ip.as_deref().unwrap_or("-"),
            secs(self.booted_after),
            self.failure
                .as_deref()
                .map(|f| format!(", guest failed: {f}"))
                .unwrap_or_default(),
            if self.timed_out {
                ", timed out".to_string()
            } else {
                self.exit.map(|s| format!(", qemu {s}")).unwrap_or_default()
            },
        )
    }
}

/// A running VM; QEMU is stopped (SIGTERM, then SIGKILL, by PID) on drop.
#[derive(Debug)]
pub struct Vm {
    spec: VmSpec,
    guard: Option<ChildGuard>,
    started: Instant,
    /// Bytes of the console log already read, and an unfinished last line.
    read: u64,
    partial: Vec<u8>,
    report: BootReport,
}

impl Vm {
    /// Starts QEMU for `spec` inside network namespace `ns`
    /// (`ip netns exec <ns> qemu-system-x86_64 …`).
    pub fn start(ns: &str, spec: &VmSpec) -> anyhow::Result<Vm> {
        check_prerequisites(spec)?;
        fs::create_dir_all(&spec.dir)
            .with_context(|| format!("failed to create {}", spec.dir.display()))?;
        let vars = if spec.firmware.uefi() {
            let (_, template) = spec.ovmf();
            let vars = spec.dir.join(format!("{}.vars.fd", spec.name));
            fs::copy(template, &vars).with_context(|| format!("failed to copy {template}"))?;
            Some(vars)
        } else {
            None
        };
        // A fresh console file, so markers of an earlier run cannot match.
        fs::write(spec.console_path(), b"")?;
        let log = fs::File::create(spec.qemu_log_path())?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, QEMU])
            .args(spec.args(vars.as_deref()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let guard = ChildGuard::spawn(&mut cmd)?;
        Ok(Vm {
            report: BootReport {
                name: spec.name.clone(),
                mac: spec.mac.clone(),
                firmware: spec.firmware,
                booted_after: None,
                phoned_home: false,
                phoned_home_after: None,
                ip: None,
                failure: None,
                exit: None,
                timed_out: false,
            },
            spec: spec.clone(),
            guard: Some(guard),
            started: Instant::now(),
            read: 0,
            partial: Vec::new(),
        })
    }

    pub fn spec(&self) -> &VmSpec {
        &self.spec
    }

    /// QEMU's PID while it runs (until [`Vm::poll`] has seen it exit).
    pub fn pid(&self) -> Option<u32> {
        self.guard.as_ref().map(ChildGuard::id)
    }

    /// The report so far.
    pub fn report(&self) -> &BootReport {
        &self.report
    }

    /// Reads new console lines (handing each, cleaned of terminal escapes,
    /// to `on_line`) and checks whether QEMU has exited; true once it has.
    pub fn poll(&mut self, on_line: &mut dyn FnMut(&str)) -> anyhow::Result<bool> {
        // Checked first, so the lines read below include its last output.
        let exited = match self.guard.as_mut() {
            Some(guard) => guard.try_wait()?,
            None => return Ok(true),
        };
        for line in self.read_new_lines()? {
            self.observe(&line);
            on_line(&line);
        }
        if let Some(status) = exited {
            if !self.partial.is_empty() {
                let line = clean_line(&std::mem::take(&mut self.partial));
                self.observe(&line);
                on_line(&line);
            }
            self.report.exit = Some(status);
            self.guard = None;
            return Ok(true);
        }
        Ok(false)
    }

    /// Polls until QEMU exits (the guest powers off after phoning home, or
    /// gives up) or `timeout` has passed since the start, then stops it.
    pub fn wait(
        &mut self,
        timeout: Duration,
        on_line: &mut dyn FnMut(&str),
    ) -> anyhow::Result<BootReport> {
        while !self.poll(on_line)? {
            if self.started.elapsed() >= timeout {
                self.stop(on_line)?;
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(self.report.clone())
    }

    /// Stops QEMU now, marking the report as timed out.
    fn stop(&mut self, on_line: &mut dyn FnMut(&str)) -> anyhow::Result<()> {
        if let Some(guard) = self.guard.take() {
            self.report.timed_out = true;
            guard.stop()?;
            for line in self.read_new_lines()? {
                self.observe(&line);
                on_line(&line);
            }
        }
        Ok(())
    }

    /// The last `lines` console lines, cleaned of terminal escapes.
    pub fn console_tail(&self, lines: usize) -> String {
        self.spec.console_tail(lines)
    }

    /// QEMU's own output (errors such as a missing tap or firmware file).
    pub fn qemu_log(&self) -> String {
        self.spec.qemu_log()
    }

    fn read_new_lines(&mut self) -> anyhow::Result<Vec<String>> {
        let path = self.spec.console_path();
        let mut file =
            fs::File::open(&path).with_context(|| format!("failed to open {}", path.display()))?;
        file.seek(SeekFrom::Start(self.read))?;
        let mut fresh = Vec::new();
        file.read_to_end(&mut fresh)?;
        self.read += fresh.len() as u64;
        self.partial.extend_from_slice(&fresh);
        let mut lines = Vec::new();
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = self.partial.drain(..=end).collect();
            lines.push(clean_line(&raw));
        }
        Ok(lines)
    }

    fn observe(&mut self, line: &str) {
        let at = self.started.elapsed();
        let mac = self.spec.mac.as_str();
        if let Some(rest) = marker_args(line, BOOTED_MARKER) {
            let mut words = rest.split_whitespace();
            if words.next().is_some_and(|m| m.eq_ignore_ascii_case(mac)) {
                self.report.booted_after.get_or_insert(at);
                self.report.ip = words.next().map(|w| unmixed(w).to_owned());
            }
        } else if let Some(rest) = marker_args(line, PHONED_HOME_MARKER) {
            let mut words = rest.split_whitespace();
            if words.next().is_some_and(|m| m.eq_ignore_ascii_case(mac)) {
                self.report.phoned_home = words.next().map(unmixed) == Some("ok");
                self.report.phoned_home_after = Some(at);
            }
        } else if let Some(rest) = marker_args(line, FAILED_MARKER) {
            self.report.failure = Some(rest.trim().to_owned());
        }
    }
}

/// Waits for every VM like [`Vm::wait`], all against one deadline;
/// `on_line` gets the VM's name with each console line.
pub fn wait_all(
    vms: &mut [Vm],
    timeout: Duration,
    on_line: &mut dyn FnMut(&str, &str),
) -> anyhow::Result<Vec<BootReport>> {
    let started = Instant::now();
    loop {
        let mut running = 0;
        for vm in vms.iter_mut() {
            let name = vm.spec.name.clone();
            if !vm.poll(&mut |line| on_line(&name, line))? {
                running += 1;
            }
        }
        if running == 0 {
            break;
        }
        if started.elapsed() >= timeout {
            for vm in vms.iter_mut() {
                let name = vm.spec.name.clone();
                vm.stop(&mut |line| on_line(&name, line))?;
            }
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(vms.iter().map(|vm| vm.report.clone()).collect())
}

/// The text after `marker` when the line carries it (the kernel may prefix
/// console output, so the marker need not start the line).
fn marker_args<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let at = line.find(marker)?;
    let rest = &line[at + marker.len()..];
    rest.starts_with(' ').then_some(rest)
}

/// A marker's word without a kernel message the console wrote into the
/// same line right after it (`10.66.2.3[    5.1] ...`): the guest's own
/// output and printk share the serial port.
fn unmixed(word: &str) -> &str {
    word.split('[').next().unwrap_or(word)
}

/// A console line without ANSI escape sequences, carriage returns and
/// other control characters (firmware draws its screens with them).
pub fn clean_line(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // CSI: ESC [ parameters final-byte; other escapes: ESC + one char.
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\t' => out.push(' '),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_line_strips_escapes_and_carriage_returns() {
        assert_eq!(
            clean_line(b"\x1b[0;1miPXE 1.0.0\x1b[0m -- boot\r\n"),
            "iPXE 1.0.0 -- boot"
        );
        assert_eq!(
            clean_line(b"\x1b[2J\x1b[01;01HBdsDxe: loading"),
            "BdsDxe: loading"
        );
        assert_eq!(clean_line(b"plain"), "plain");
    }

    #[test]
    fn markers_are_found_after_console_prefixes() {
        let line = "[    2.5] PXE-AGENT-BOOTED 52:54:00:12:34:56 10.66.1.10";
        assert_eq!(
            marker_args(line, BOOTED_MARKER),
            Some(" 52:54:00:12:34:56 10.66.1.10")
        );
        assert_eq!(marker_args("PXE-AGENT-BOOTEDX", BOOTED_MARKER), None);
        // A kernel message written into the line right after the address.
        assert_eq!(unmixed("10.66.2.3[    4.39]"), "10.66.2.3");
        assert_eq!(unmixed("ok"), "ok");
        assert_eq!(marker_args("nothing here", BOOTED_MARKER), None);
    }

    #[test]
    fn firmware_selects_rom_pflash_and_fw_cfg() {
        let dir = Path::new("/tmp/vm");
        let joined = |spec: &VmSpec, vars: Option<&Path>| {
            spec.args(vars)
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let bios = VmSpec::new("b", "52:54:00:AA:00:01", Firmware::Bios, "pxtap0", dir);
        let args = joined(&bios, None);
        assert!(
            args.contains("virtio-net-pci,netdev=net0,mac=52:54:00:aa:00:01 "),
            "{args}"
        );
        assert!(
            args.contains("-boot order=n") && !args.contains("pflash"),
            "{args}"
        );
        assert!(
            args.contains("-serial file:/tmp/vm/b.console.log"),
            "{args}"
        );
        assert!(
            args.contains("-accel tcg") && args.contains("-no-reboot"),
            "{args}"
        );

        let pxe = VmSpec::new("p", "52:54:00:aa:00:02", Firmware::UefiPxe, "pxtap1", dir);
        let args = joined(&pxe, Some(Path::new("/tmp/vm/p.vars.fd")));
        assert!(args.contains(",romfile="), "{args}");
        assert!(
            args.contains("readonly=on,file=/usr/share/OVMF/OVMF_CODE.fd"),
            "{args}"
        );
        assert!(args.contains("unit=1,file=/tmp/vm/p.vars.fd"), "{args}");
        assert!(args.contains("IPv6PXESupport,string=n"), "{args}");
        assert!(!args.contains("IPv4PXESupport"), "{args}");

        let http = VmSpec::new("h", "52:54:00:aa:00:03", Firmware::UefiHttp, "pxtap2", dir);
        let args = joined(&http, Some(Path::new("/tmp/vm/h.vars.fd")));
        assert!(args.contains("IPv4PXESupport,string=n"), "{args}");
        assert!(!args.contains("-uuid"), "{args}");

        let uuid = "8a5c2e6b-1e0f-4c1d-9b7a-0123456789ab";
        let pxe6 =
            VmSpec::new("p6", "52:54:00:aa:00:04", Firmware::UefiPxe6, "pxtap0", dir).uuid(uuid);
        let args = joined(&pxe6, Some(Path::new("/tmp/vm/p6.vars.fd")));
        assert!(
            args.contains("IPv6PXESupport,string=y") && args.contains("IPv4PXESupport,string=n"),
            "{args}"
        );
        assert!(args.contains(&format!("-uuid {uuid}")), "{args}");
        let http6 = VmSpec::new(
            "h6",
            "52:54:00:aa:00:05",
            Firmware::UefiHttp6,
            "pxtap0",
            dir,
        );
        let args = joined(&http6, Some(Path::new("/tmp/vm/h6.vars.fd")));
        assert!(
            args.contains("IPv6PXESupport,string=n") && args.contains("IPv4PXESupport,string=n"),
            "{args}"
        );

        let disk = bios.clone().boot_from(BootSource::Disk);
        let args = joined(&disk, None);
        assert!(
            args.contains("-boot order=c,strict=on")
                && !args.contains("order=n")
                && args.contains(",romfile="),
            "{args}"
        );
        let disk = pxe.boot_from(BootSource::Disk);
        let args = joined(&disk, Some(Path::new("/tmp/vm/p.vars.fd")));
        assert!(
            args.contains("-boot order=c,strict=on") && args.contains("IPv4PXESupport,string=n"),
            "{args}"
        );
    }
}
