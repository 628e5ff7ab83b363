//! BMCs for out-of-band recovery tests: an `ipmi_sim` whose chassis powers
//! a real QEMU guest in a boot lab ([`GuestBmc`]), and a fleet of record-only
//! simulators on one namespace ([`BmcFleet`]), its own lab's or the caller's.
//!
//! How a power request reaches the guest: ipmi_sim runs the chassis
//! program ([`crate::bmc_sim`]); with the guest marker present, the
//! program writes the request to a file and waits; [`PoweredGuest`]'s
//! watcher thread, in the test process, acts on it (starts QEMU with the
//! command line `xtask::vm` builds, or stops it by PID), answers, and keeps
//! the power file `get power` reads in step with QEMU (within one 20 ms
//! tick of QEMU exiting by itself). QEMU is the test's own child, so it is
//! stopped and reaped when the guest is dropped, even on a panic.
//!
//! The boot device in force when the guest powers on decides how QEMU
//! starts: `pxe` boots from the NIC, `none` (no override) from the NIC too
//! (an empty machine falls through to the network), anything else
//! (`default` = disk, `bios`, `cdrom`) from the absent disk only, so it
//! never network-boots. The device is kept until changed (ipmi_sim keeps no
//! persistent/one-shot bit).
//!
//! Addresses: a guest's BMC listens on 10.67.0.<n> on the loopback of the
//! boot lab's server namespace, where the agent runs; a fleet's BMCs on
//! 10.67.0.1..N on the server end of a veth lab, its clients on the other.

use std::{
    fs,
    future::Future,
    path::Path,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::bail;
use pxe_agent::bmc::{IpmiBmc, RetryPolicy};
use xtask::{
    Lab, process,
    vm::{BootLab, BootReport, BootSource, Vm, VmSpec},
};

use crate::bmc_sim::{
    BOOT_FILE, GUEST_MARKER, IpmiSim, POWER_FILE, READY_TIMEOUT, REPLY_FILE, REQUEST_FILE,
    block_on_in,
};

/// How often the watcher looks for requests and for QEMU exiting.
const TICK: Duration = Duration::from_millis(20);

/// How a guest's BMC is spoken to: ipmi_sim answers a power request only
/// when the chassis program has exited, which waits (at most 10 s) for the
/// watcher to start or stop QEMU. Each attempt waits past that, so a slow
/// start on a busy machine is answered, not retried as a second power-on.
pub const GUEST_POLICY: RetryPolicy = RetryPolicy {
    deadline: Duration::from_secs(30),
    attempt_timeout: Duration::from_secs(12),
    initial_backoff: Duration::from_millis(200),
    max_backoff: Duration::from_secs(1),
    max_attempts: 2,
};

/// The address of BMC `index` (0-based) on the BMC network.
pub fn bmc_ip(index: usize) -> String {
    assert!(index < 250, "the BMC network holds 250 BMCs");
    format!("10.67.0.{}", index + 1)
}

/// One start of the guest's QEMU.
#[derive(Debug, Clone)]
pub struct Boot {
    pub at: Instant,
    pub source: BootSource,
    pub pid: u32,
}

/// A QEMU guest whose power a chassis program controls. Stops QEMU and the
/// watcher on drop.
pub struct PoweredGuest {
    state: Arc<Mutex<GuestState>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    spec: VmSpec,
}

struct GuestState {
    ns: String,
    spec: VmSpec,
    /// The current (or last, if it exited by itself) VM.
    vm: Option<Vm>,
    /// The report of the VM powered off last.
    last: Option<BootReport>,
    boots: Vec<Boot>,
}

impl PoweredGuest {
    /// Hands `sim`'s power requests to a watcher that runs `spec` in `ns`.
    pub fn attach(sim: &IpmiSim, ns: &str, spec: VmSpec) -> PoweredGuest {
        let dir = sim.chassis_dir();
        fs::write(dir.join(GUEST_MARKER), &spec.name).expect("write guest marker");
        write_power(&dir, false);
        let state = Arc::new(Mutex::new(GuestState {
            ns: ns.to_owned(),
            spec: spec.clone(),
            vm: None,
            last: None,
            boots: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            thread::spawn(move || watch(&dir, &state, &stop))
        };
        PoweredGuest {
            state,
            stop,
            thread: Some(thread),
            spec,
        }
    }

    fn lock(&self) -> MutexGuard<'_, GuestState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether QEMU is running.
    pub fn is_on(&self) -> bool {
        self.lock().is_on()
    }

    /// QEMU's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.lock().vm.as_ref().and_then(Vm::pid)
    }

    /// Every QEMU start so far.
    pub fn boots(&self) -> Vec<Boot> {
        self.lock().boots.clone()
    }

    /// The running (or last) VM's report.
    pub fn report(&self) -> Option<BootReport> {
        let state = self.lock();
        match &state.vm {
            Some(vm) => Some(vm.report().clone()),
            None => state.last.clone(),
        }
    }

    /// Waits until QEMU has started `count` times in all.
    pub fn wait_boots(&self, count: usize, timeout: Duration) -> Vec<Boot> {
        let deadline = Instant::now() + timeout;
        loop {
            let boots = self.boots();
            if boots.len() >= count || Instant::now() >= deadline {
                return boots;
            }
            thread::sleep(TICK);
        }
    }

    /// Waits until the running guest phoned home, gave up, or stopped, or
    /// `timeout` passed; returns its report so far.
    pub fn wait_phoned_home(&self, timeout: Duration) -> BootReport {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let state = self.lock();
                if let Some(vm) = &state.vm {
                    let report = vm.report();
                    let done = report.phoned_home || report.failure.is_some() || vm.pid().is_none();
                    if done || Instant::now() >= deadline {
                        return report.clone();
                    }
                } else if Instant::now() >= deadline {
                    panic!("the guest never powered on");
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last `lines` lines of the current (or last) console.
    pub fn console_tail(&self, lines: usize) -> String {
        self.spec.console_tail(lines)
    }

    /// QEMU's own output of the current (or last) start.
    pub fn qemu_log(&self) -> String {
        self.spec.qemu_log()
    }
}

impl Drop for PoweredGuest {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // Stops QEMU (SIGTERM, then SIGKILL, by PID) and reaps it.
        self.lock().vm = None;
    }
}

impl GuestState {
    fn is_on(&self) -> bool {
        self.vm.as_ref().is_some_and(|vm| vm.pid().is_some())
    }

    /// Acts on one chassis request (`<parm> <value>`).
    fn act(&mut self, request: &str, dir: &Path) -> anyhow::Result<()> {
        match request {
            "power 1" if !self.is_on() => self.power_on(dir)?,
            "power 1" => {}
            "power 0" | "shutdown 1" => self.power_off(),
            // A hard reset of a chassis that is off does nothing.
            "reset 1" if self.is_on() => {
                self.power_off();
                self.power_on(dir)?;
            }
            "reset 1" => {}
            other => bail!("unknown chassis request {other:?}"),
        }
        Ok(())
    }

    fn power_on(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.power_off();
        let device = fs::read_to_string(dir.join(BOOT_FILE)).unwrap_or_default();
        let source = boot_source(device.trim());
        let spec = self.spec.clone().boot_from(source);
        let vm = Vm::start(&self.ns, &spec)?;
        self.boots.push(Boot {
            at: Instant::now(),
            source,
            pid: vm.pid().unwrap_or_default(),
        });
        self.vm = Some(vm);
        Ok(())
    }

    fn power_off(&mut self) {
        if let Some(mut vm) = self.vm.take() {
            let _ = vm.poll(&mut |_| {});
            self.last = Some(vm.report().clone());
            // Dropping the VM stops QEMU by its PID.
        }
    }

    fn poll(&mut self) {
        if let Some(vm) = self.vm.as_mut()
            && vm.pid().is_some()
            && let Err(err) = vm.poll(&mut |_| {})
        {
            eprintln!("guest {}: {err:#}", self.spec.name);
        }
    }
}

/// What the guest boots from for ipmi_sim's boot device name.
fn boot_source(device: &str) -> BootSource {
    match device {
        "pxe" | "none" => BootSource::Network,
        // "default" (disk, also when never set), "bios", "cdrom".
        _ => BootSource::Disk,
    }
}

fn write_power(dir: &Path, on: bool) {
    let tmp = dir.join("power.tmp");
    fs::write(&tmp, if on { "1\n" } else { "0\n" }).expect("write power file");
    fs::rename(&tmp, dir.join(POWER_FILE)).expect("replace power file");
}

/// The watcher: requests first, then QEMU's own exit, every [`TICK`].
fn watch(dir: &Path, state: &Mutex<GuestState>, stop: &AtomicBool) {
    let request = dir.join(REQUEST_FILE);
    let mut written = Some(false);
    while !stop.load(Ordering::Relaxed) {
        {
            let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
            if let Ok(text) = fs::read_to_string(&request) {
                let reply = match state.act(text.trim(), dir) {
                    Ok(()) => "ok".to_owned(),
                    Err(err) => format!("{err:#}"),
                };
                // The power file first, so `get power` after the answer agrees.
                let on = state.is_on();
                write_power(dir, on);
                written = Some(on);
                fs::write(dir.join(REPLY_FILE), format!("{reply}\n")).expect("write reply");
                let _ = fs::remove_file(&request);
            }
            state.poll();
            let on = state.is_on();
            if written != Some(on) {
                write_power(dir, on);
                written = Some(on);
            }
        }
        thread::sleep(TICK);
    }
}

/// A BMC in a boot lab whose chassis is a QEMU guest. Field order: the
/// guest (QEMU, watcher) stops before the simulator.
pub struct GuestBmc {
    guest: PoweredGuest,
    sim: IpmiSim,
}

impl GuestBmc {
    /// Starts BMC `index` (address [`bmc_ip`]) in `lab`'s server namespace
    /// for the guest `spec` (use [`BootLab::vm_spec`]); the guest is off.
    pub fn start(lab: &BootLab, index: usize, spec: VmSpec) -> GuestBmc {
        let ip = bmc_ip(index);
        add_bmc_address(lab, &ip);
        let sim = IpmiSim::spawn(lab.server_ns(), &ip);
        let guest = PoweredGuest::attach(&sim, lab.server_ns(), spec);
        sim.wait_ready(READY_TIMEOUT);
        GuestBmc { guest, sim }
    }

    pub fn sim(&self) -> &IpmiSim {
        &self.sim
    }

    pub fn guest(&self) -> &PoweredGuest {
        &self.guest
    }

    /// The Administrator's IPMI client (run it with [`GuestBmc::run`]),
    /// patient enough for a chassis that starts QEMU ([`GUEST_POLICY`]).
    pub fn client(&self) -> IpmiBmc {
        self.sim.admin(GUEST_POLICY)
    }

    /// Runs `f` where the agent runs: the boot lab's server namespace.
    pub fn run<T: Send + 'static, F: Future<Output = T> + 'static>(
        &self,
        f: impl FnOnce() -> F + Send + 'static,
    ) -> T {
        block_on_in(self.sim.ns(), f)
    }

    /// ipmitool from the agent's namespace.
    pub fn ipmitool(&self, args: &[&str]) -> anyhow::Result<String> {
        self.sim.ipmitool(self.sim.ns(), args)
    }
}

/// Puts `ip` on the loopback of `lab`'s server namespace (this kernel has
/// no dummy links): local to the agent, unseen by the guests.
fn add_bmc_address(lab: &BootLab, ip: &str) {
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["-n", lab.server_ns(), "addr", "add", &format!("{ip}/32")])
        .args(["dev", "lo"]);
    process::run(&mut cmd).expect("address BMC");
}

/// The fleet's own address on its BMC network, and its clients'.
const FLEET_SERVER_CIDR: &str = "10.67.0.254/24";
const FLEET_CLIENT_CIDR: &str = "10.67.0.253/24";

/// N record-only BMCs (no guests), each chassis recording power-on times
/// ([`IpmiSim::power_ons`]): on the server end of a veth lab of their own,
/// the IPMI clients in its client namespace ([`BmcFleet::start`]), or on an
/// interface of a namespace the caller made ([`BmcFleet::start_on`]).
/// Field order: simulators before the lab.
pub struct BmcFleet {
    sims: Vec<IpmiSim>,
    client_ns: String,
    lab: Option<Lab>,
}

impl BmcFleet {
    /// Starts `count` simulators at once on a lab of their own and waits
    /// until all answer.
    pub fn start(prefix: &str, count: usize) -> BmcFleet {
        let lab = Lab::new_with(prefix, FLEET_SERVER_CIDR).expect("create fleet lab");
        lab.run_in(
            lab.client_ns(),
            &[
                "ip",
                "addr",
                "add",
                FLEET_CLIENT_CIDR,
                "dev",
                lab.client_if(),
            ],
        )
        .expect("address client end");
        let mut fleet =
            BmcFleet::start_on(lab.server_ns(), lab.server_if(), lab.client_ns(), count);
        fleet.lab = Some(lab);
        fleet
    }

    /// Starts `count` simulators at once on [`bmc_ip`]`/24` addresses of
    /// `iface` in `ns`, for clients in `client_ns` (which must reach
    /// 10.67.0.0/24; the caller routes it), and waits until all answer.
    /// The namespaces stay the caller's.
    pub fn start_on(ns: &str, iface: &str, client_ns: &str, count: usize) -> BmcFleet {
        let batch: String = (0..count)
            .map(|i| format!("addr add {}/24 dev {iface}\n", bmc_ip(i)))
            .collect();
        let batch_file =
            std::env::temp_dir().join(format!("pxe-fleet-{}-{ns}.ip", std::process::id()));
        fs::write(&batch_file, batch).expect("write ip batch");
        let added = process::run(
            std::process::Command::new("ip")
                .args(["-n", ns, "-batch"])
                .arg(&batch_file),
        );
        let _ = fs::remove_file(&batch_file);
        added.expect("address BMCs");
        let sims: Vec<IpmiSim> = (0..count).map(|i| IpmiSim::spawn(ns, &bmc_ip(i))).collect();
        for sim in &sims {
            sim.wait_ready(READY_TIMEOUT);
        }
        BmcFleet {
            sims,
            client_ns: client_ns.to_owned(),
            lab: None,
        }
    }

    pub fn sims(&self) -> &[IpmiSim] {
        &self.sims
    }

    /// Where the clients run.
    pub fn client_ns(&self) -> &str {
        &self.client_ns
    }

    /// One Administrator client per BMC, in order.
    pub fn clients(&self, policy: RetryPolicy) -> Vec<IpmiBmc> {
        self.sims.iter().map(|s| s.admin(policy)).collect()
    }

    /// Runs `f` in the clients' namespace.
    pub fn run<T: Send + 'static, F: Future<Output = T> + 'static>(
        &self,
        f: impl FnOnce() -> F + Send + 'static,
    ) -> T {
        block_on_in(&self.client_ns, f)
    }
}

impl Drop for BmcFleet {
    fn drop(&mut self) {
        // All at once; each guard then only reaps.
        for sim in &self.sims {
            sim.begin_stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use pxe_agent::bmc::{Bmc as _, BootDevice, BootTarget, PowerAction, PowerState};
    use tokio::task::JoinSet;
    use xtask::vm::{BootLabConfig, Firmware, initramfs};

    use super::*;
    use crate::{
        agent::agent_bin,
        bmc_sim::quick,
        boot_vm::{assert_host_booted, xdp_counter},
        fixture::assert_root,
    };

    /// One boot takes 8–25 s under TCG; room for a busy machine.
    const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
    /// How long a guest left on disk is watched for DHCP.
    const NO_DHCP_WINDOW: Duration = Duration::from_secs(10);
    const FLEET_SIZE: usize = 20;

    const GUEST_MAC: &str = "52:54:00:12:35:01";
    const GUEST_IP: &str = "10.66.1.20";

    const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    lease_time: 3600
profiles:
  - name: installed
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: "@CMDLINE@"
hosts:
  - mac: "52:54:00:12:35:01"
    ip: 10.66.1.20
    hostname: bmc-node-1
    profile: installed
"#;

    /// A boot lab for the guest, whose BMC is BMC 0; the guest stays up
    /// after phoning home, so powering it off is the BMC's doing.
    fn guest_lab(prefix: &str) -> (GuestBmc, BootLab) {
        assert_root();
        let cmdline = format!("{} {}", initramfs::PROFILE_CMDLINE, initramfs::STAY_PARAM);
        let inventory = INVENTORY.replace("@CMDLINE@", &cmdline);
        let cfg = BootLabConfig::new(prefix, &agent_bin(), &inventory).xdp_mode("native");
        let lab = BootLab::start(&cfg).unwrap_or_else(|e| panic!("boot lab {prefix}: {e:#}"));
        let spec = lab.vm_spec("bmcguest", GUEST_MAC, Firmware::Bios, 0);
        (GuestBmc::start(&lab, 0, spec), lab)
    }

    fn context(lab: &BootLab, bmc: &GuestBmc) -> String {
        format!(
            "{}\n--- chassis calls ---\n{}\n--- console (last 40 lines) ---\n{}\n--- qemu ---\n{}\n\
             --- agent log (last 30 lines) ---\n{}",
            bmc.guest()
                .report()
                .map(|r| r.summary())
                .unwrap_or_default(),
            bmc.sim().state("calls.log"),
            bmc.guest().console_tail(40),
            bmc.guest().qemu_log().trim(),
            lab.agent_log_tail(30),
        )
    }

    fn target(device: BootDevice) -> BootTarget {
        BootTarget {
            device,
            persistent: true,
            efi: false,
        }
    }

    fn assert_phoned_home(lab: &BootLab, bmc: &GuestBmc) -> BootReport {
        let report = bmc.guest().wait_phoned_home(BOOT_TIMEOUT);
        eprintln!("{}", report.summary());
        assert!(
            report.phoned_home && report.ip.as_deref() == Some(GUEST_IP),
            "the BMC-powered guest did not boot\n{}",
            context(lab, bmc)
        );
        report
    }

    fn pid_exists(pid: u32) -> bool {
        Path::new("/proc").join(pid.to_string()).exists()
    }

    #[test]
    fn bmc_power_on_network_boots_the_guest_and_power_off_stops_it() {
        let (bmc, lab) = guest_lab("pxbmcvm");
        assert!(!bmc.guest().is_on());
        let status = bmc.ipmitool(&["power", "status"]).expect("ipmitool");
        assert!(status.contains("is off"), "ipmitool: {status}");

        let client = bmc.client();
        let before = SystemTime::now();
        let c = client.clone();
        let power = bmc.run(move || async move {
            c.set_boot_device(target(BootDevice::Pxe)).await?;
            c.power(PowerAction::On).await?;
            c.power_status().await
        });
        assert_eq!(power.expect("boot device and power on"), PowerState::On);
        let boots = bmc.guest().boots();
        assert_eq!(boots.len(), 1, "{boots:?}");
        assert_eq!(boots[0].source, BootSource::Network);
        let ons = bmc.sim().power_ons();
        assert!(
            ons.len() == 1 && ons[0] >= before && ons[0] <= SystemTime::now(),
            "power-on record: {ons:?}"
        );

        let report = assert_phoned_home(&lab, &bmc);
        eprintln!(
            "power on to phone-home: {:.1}s",
            report.phoned_home_after.unwrap_or_default().as_secs_f64()
        );
        assert_host_booted(&lab, GUEST_MAC);
        // It stays up: power is on because QEMU runs.
        let pid = bmc.guest().pid().expect("QEMU runs after the phone-home");
        let status = bmc.ipmitool(&["power", "status"]).expect("ipmitool");
        assert!(status.contains("is on"), "ipmitool: {status}");

        let c = client.clone();
        let power = bmc.run(move || async move {
            c.power(PowerAction::Off).await?;
            c.power_status().await
        });
        assert_eq!(power.expect("power off"), PowerState::Off);
        assert!(!bmc.guest().is_on());
        assert!(
            !pid_exists(pid),
            "QEMU (pid {pid}) still runs after power off"
        );
        let status = bmc.ipmitool(&["power", "status"]).expect("ipmitool");
        assert!(status.contains("is off"), "ipmitool: {status}");
        assert_eq!(bmc.sim().power_ons().len(), 1);
    }

    #[test]
    fn guest_left_on_disk_does_not_network_boot_until_pxe_and_a_cycle() {
        let (bmc, lab) = guest_lab("pxbmcdisk");
        let client = bmc.client();
        let c = client.clone();
        bmc.run(move || async move {
            c.set_boot_device(target(BootDevice::Disk)).await?;
            c.power(PowerAction::On).await
        })
        .expect("boot from disk and power on");
        let boots = bmc.guest().boots();
        assert_eq!(boots.len(), 1, "{boots:?}");
        assert_eq!(boots[0].source, BootSource::Disk);

        let deadline = Instant::now() + NO_DHCP_WINDOW;
        while Instant::now() < deadline {
            assert!(
                bmc.guest().is_on(),
                "the guest stopped while on disk\n{}",
                context(&lab, &bmc)
            );
            thread::sleep(Duration::from_millis(500));
        }
        // The firmware ran and found nothing to boot.
        assert!(
            bmc.guest()
                .console_tail(usize::MAX)
                .contains("No bootable device"),
            "the guest on disk did not stop in its firmware\n{}",
            context(&lab, &bmc)
        );
        let seen = xdp_counter(&lab, "rx");
        assert_eq!(
            seen,
            0,
            "a guest on disk sent DHCP\n{}",
            context(&lab, &bmc)
        );
        assert!(
            !lab.agent_log().contains(GUEST_MAC),
            "the agent heard from the guest on disk\n{}",
            context(&lab, &bmc)
        );

        // Cycle: ipmi_sim sends `set power 0`, and `set power 1` 1 s later.
        let c = client.clone();
        bmc.run(move || async move {
            c.set_boot_device(target(BootDevice::Pxe)).await?;
            c.power(PowerAction::Cycle).await
        })
        .expect("boot from PXE and power cycle");
        let boots = bmc.guest().wait_boots(2, Duration::from_secs(10));
        assert_eq!(
            boots.iter().map(|b| b.source).collect::<Vec<_>>(),
            [BootSource::Disk, BootSource::Network],
            "{}",
            context(&lab, &bmc)
        );
        assert!(!pid_exists(boots[0].pid), "the disk boot's QEMU still runs");
        assert_phoned_home(&lab, &bmc);
        assert_host_booted(&lab, GUEST_MAC);
        assert_eq!(bmc.sim().power_ons().len(), 2);
    }

    #[test]
    fn fleet_of_bmcs_records_one_power_on_each() {
        assert_root();
        let started = Instant::now();
        let fleet = BmcFleet::start("pxbmcfleet", FLEET_SIZE);
        eprintln!(
            "{FLEET_SIZE} BMCs answered after {:.2}s",
            started.elapsed().as_secs_f64()
        );
        let clients = fleet.clients(quick());
        let before = SystemTime::now();
        let results = fleet.run(move || async move {
            let mut set = JoinSet::new();
            for (i, c) in clients.into_iter().enumerate() {
                set.spawn(async move {
                    let result = async {
                        c.power(PowerAction::On).await?;
                        c.power_status().await
                    }
                    .await;
                    (i, result)
                });
            }
            let mut out = Vec::new();
            while let Some(joined) = set.join_next().await {
                out.push(joined.expect("power-on task"));
            }
            out
        });
        let after = SystemTime::now();
        assert_eq!(results.len(), FLEET_SIZE);
        for (i, result) in results {
            assert_eq!(
                result.unwrap_or_else(|e| panic!("BMC {i}: {e}")),
                PowerState::On
            );
        }
        for (i, sim) in fleet.sims().iter().enumerate() {
            let ons = sim.power_ons();
            assert!(
                ons.len() == 1 && ons[0] >= before && ons[0] <= after,
                "BMC {i} ({}): power-on record {ons:?} in {}",
                sim.ip(),
                sim.chassis_dir().display()
            );
        }
        let stopping = Instant::now();
        drop(fleet);
        eprintln!(
            "{FLEET_SIZE} BMCs stopped in {:.2}s",
            stopping.elapsed().as_secs_f64()
        );
    }
}
