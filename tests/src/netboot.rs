//! `netboot: once` on every route, with real clients in the lab's client
//! namespace at the host's own address: before its phone-home the host is
//! given its boot file everywhere; after it (with the script's token), a
//! BIOS PXE, a UEFI PXE and a UEFI HTTP-boot request answered by the XDP
//! program, and an iPXE request answered by the slow path, each lease the
//! host's address with no boot file, the iPXE script exits to the next
//! boot device, TFTP and HTTP refuse the boot files; the state survives an
//! agent restart and shows in `pxe-agent hosts`; after `reprovision` every
//! route boots the host again. Under QEMU, SeaBIOS with the NIC's iPXE ROM
//! goes through the whole loop (boot, phone-home, a boot that falls
//! through, reprovision, boot), and OVMF's PXE and HTTP boot fall through
//! when the host is done and boot after `reprovision`. With a BMC
//! (ipmi_sim), `reprovision` hands the host to the recovery controller.

use std::{
    collections::BTreeMap,
    fs,
    time::{Duration, Instant},
};

use xtask::vm::{BootLabConfig, Firmware, initramfs::PROFILE_CMDLINE};

use crate::{
    agent::{Scratch, Served, agent_bin},
    fixture::assert_root,
};

const MAC: &str = "52:54:00:12:34:56";
const IP: &str = "10.66.1.10";
const SERVER: &str = "10.66.0.1";
const TOKEN: &str = "netboot-operator-token-0123456789";

const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    lease_time: 3600
profiles:
  - name: install
    netboot: once
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
      http: "http://{server}:8080/ipxe.efi"
    kernel: "http://{server}:8080/artifacts/vmlinuz"
    initrd: ["http://{server}:8080/artifacts/initrd.img"]
    cmdline: console=ttyS0
hosts:
  - mac: "52:54:00:12:34:56"
    ip: 10.66.1.10
    hostname: node-1
    profile: install
"#;

/// The agent with a boot root (TFTP and HTTP boot files), artifacts and an
/// API token; the client at the host's MAC and address.
struct Rig {
    served: Served,
    files: Scratch,
    args: Vec<String>,
}

impl Rig {
    fn start(name: &str) -> Rig {
        let files = Scratch::new(&format!("{name}-files"));
        for dir in ["root", "artifacts"] {
            fs::create_dir_all(files.path(dir)).expect("mkdir");
        }
        fs::write(files.path("root/undionly.kpxe"), b"bios loader").expect("write");
        fs::write(files.path("root/ipxe.efi"), b"uefi loader").expect("write");
        fs::write(files.path("artifacts/vmlinuz"), b"kernel").expect("write");
        fs::write(files.path("artifacts/initrd.img"), b"initrd").expect("write");
        fs::write(files.path("tokens"), format!("ops {TOKEN}\n")).expect("write");
        fs::write(files.path("token"), format!("{TOKEN}\n")).expect("write");
        let path = |p: &str| files.path(p).to_str().expect("utf-8").to_owned();
        let args = vec![
            "--boot-root".to_owned(),
            path("root"),
            "--artifacts".to_owned(),
            path("artifacts"),
            "--api-token-file".to_owned(),
            path("tokens"),
        ];
        let served = Served::start_with(
            name,
            INVENTORY,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        served.set_client_mac(MAC);
        served.add_client_address(&format!("{IP}/16"));
        Rig {
            served,
            files,
            args,
        }
    }

    fn token_file(&self) -> String {
        self.files.path("token").to_str().expect("utf-8").to_owned()
    }

    /// udhcpc as the firmware of `class` asks: its lease.
    fn lease(&self, class: Client) -> BTreeMap<String, String> {
        let args: &[&str] = match class {
            Client::BiosPxe => &["-V", "PXEClient:Arch:00000:UNDI:002001", "-x", "0x5d:0000"],
            Client::UefiPxe => &["-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007"],
            Client::UefiHttp => &["-V", "HTTPClient:Arch:00016:UNDI:003001", "-x", "0x5d:0010"],
            // User class "iPXE" as iPXE sends it (RFC 3004).
            Client::Ipxe => &[
                "-V",
                "PXEClient:Arch:00000:UNDI:002001",
                "-x",
                "0x5d:0000",
                "-x",
                "0x4d:0469505845",
            ],
        };
        self.served.udhcpc(args)
    }

    fn curl(&self, args: &[&str]) -> (String, String) {
        let out = self
            .served
            .client_cmd("curl")
            .args(["-s", "--max-time", "10"])
            .args(args)
            .output()
            .expect("run curl");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `GET url`: status code and body.
    fn get(&self, url: &str) -> (String, String) {
        let (out, _) = self.curl(&["-w", "\n%{http_code}", url]);
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
        (code.trim().to_owned(), body.to_owned())
    }

    /// A TFTP download of `file` with curl: the bytes, or curl's error.
    fn tftp(&self, file: &str) -> Result<String, String> {
        let out = self
            .served
            .client_cmd("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                &format!("tftp://{SERVER}/{file}"),
            ])
            .output()
            .expect("run curl");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn script(&self) -> String {
        let (code, body) = self.get(&format!("http://{SERVER}:8080/boot/{MAC}.ipxe"));
        assert_eq!(code, "200", "script: {body}");
        body
    }

    fn phone_home(&self) {
        let script = self.script();
        let token = script
            .split_whitespace()
            .find_map(|a| a.strip_prefix("pxe_agent.token="))
            .unwrap_or_else(|| panic!("no token in the script:\n{script}"))
            .to_owned();
        let url = format!("http://{SERVER}:8080/api/v1/hosts/{MAC}/booted?token={token}");
        let (code, _) = self.curl(&[
            "-X",
            "POST",
            "-d",
            "installed",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ]);
        assert_eq!(code.trim(), "204", "phone-home refused");
    }

    fn stat(&self, name: &str) -> u64 {
        self.served.stats().get(name).copied().unwrap_or(0)
    }

    /// The `netboot` object of the host in `pxe-agent hosts --output json`.
    fn netboot_json(&self) -> serde_json::Value {
        let text = self.served.cli(&["hosts", "--format", "json"]);
        let hosts: serde_json::Value = serde_json::from_str(&text).expect("json");
        hosts[0]["netboot"].clone()
    }
}

#[derive(Clone, Copy, Debug)]
enum Client {
    BiosPxe,
    UefiPxe,
    UefiHttp,
    Ipxe,
}

const FAST: [Client; 3] = [Client::BiosPxe, Client::UefiPxe, Client::UefiHttp];

fn field<'a>(lease: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    lease.get(key).map_or("", String::as_str)
}

/// What the host is told to boot, whichever way (BOOTP file or option 67).
fn boot_file(lease: &BTreeMap<String, String>) -> String {
    format!("{}{}", field(lease, "boot_file"), field(lease, "bootfile"))
}

/// Every route gives the host its boot file.
fn assert_boots(rig: &Rig, when: &str) {
    for (client, want) in [
        (Client::BiosPxe, "undionly.kpxe"),
        (Client::UefiPxe, "ipxe.efi"),
        (Client::UefiHttp, "http://10.66.0.1:8080/ipxe.efi"),
        (
            Client::Ipxe,
            "http://10.66.0.1:8080/boot/52:54:00:12:34:56.ipxe",
        ),
    ] {
        let lease = rig.lease(client);
        assert_eq!(field(&lease, "ip"), IP, "{when}, {client:?}: {lease:?}");
        assert_eq!(boot_file(&lease), want, "{when}, {client:?}: {lease:?}");
    }
    assert_eq!(
        rig.tftp("undionly.kpxe").as_deref(),
        Ok("bios loader"),
        "{when}"
    );
    let (code, body) = rig.get(&format!("http://{SERVER}:8080/ipxe.efi"));
    assert_eq!(
        (code.as_str(), body.as_str()),
        ("200", "uefi loader"),
        "{when}"
    );
    let script = rig.script();
    assert!(
        script.contains("\nkernel http://10.66.0.1:8080/artifacts/vmlinuz"),
        "{when}: {script}"
    );
}

/// Every route gives the host its address and nothing to boot.
fn assert_withheld(rig: &Rig, when: &str) {
    for client in FAST {
        let (offers, acks) = (rig.served.counter("tx_offer"), rig.served.counter("tx_ack"));
        let lease = rig.lease(client);
        assert_eq!(field(&lease, "ip"), IP, "{when}, {client:?}: {lease:?}");
        assert_eq!(boot_file(&lease), "", "{when}, {client:?}: {lease:?}");
        assert!(
            matches!(field(&lease, "siaddr"), "" | "0.0.0.0"),
            "{when}, {client:?}: {lease:?}"
        );
        // The reply came from the kernel: the fast path's template.
        assert!(
            rig.served.counter("tx_offer") > offers && rig.served.counter("tx_ack") > acks,
            "{when}, {client:?}: not answered by the XDP program"
        );
    }
    let passed = rig.served.counter("pass_ipxe");
    let lease = rig.lease(Client::Ipxe);
    assert_eq!(field(&lease, "ip"), IP, "{when}, iPXE: {lease:?}");
    assert_eq!(boot_file(&lease), "", "{when}, iPXE: {lease:?}");
    assert!(
        rig.served.counter("pass_ipxe") > passed,
        "{when}: iPXE not on the slow path"
    );
    let refused = rig.stat("pxe_netboot_refused_total{route=\"tftp\"}");
    let err = rig
        .tftp("undionly.kpxe")
        .expect_err("TFTP served a done host");
    // curl's code for a TFTP access violation (error 2).
    assert!(err.contains("(69)"), "{when}: {err}");
    assert_eq!(
        rig.stat("pxe_netboot_refused_total{route=\"tftp\"}"),
        refused + 1
    );
    let (code, body) = rig.get(&format!("http://{SERVER}:8080/ipxe.efi"));
    assert_eq!(code, "403", "{when}: {body}");
    assert!(body.contains("netboot"), "{when}: {body}");
    let (code, _) = rig.get(&format!("http://{SERVER}:8080/artifacts/vmlinuz"));
    assert_eq!(code, "403", "{when}");
    let script = rig.script();
    assert!(
        script.contains("\nexit") && !script.contains("kernel "),
        "{when}: {script}"
    );
}

#[test]
fn once_host_gets_an_address_and_no_boot_file_on_every_route_after_phone_home_until_reprovisioned()
{
    let mut rig = Rig::start("pxnetb");
    assert_boots(&rig, "armed");
    assert_eq!(rig.netboot_json()["state"], "armed");
    rig.phone_home();
    assert!(
        rig.served
            .log()
            .contains("provisioning done: no boot file from now on"),
        "{}",
        rig.served.log()
    );
    // The fast path's maps follow within moments of the phone-home.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !boot_file(&rig.lease(Client::BiosPxe)).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the fast path still gives the boot file"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_withheld(&rig, "after phone-home");
    let netboot = rig.netboot_json();
    assert_eq!(
        (
            &netboot["policy"],
            &netboot["state"],
            &netboot["by"],
            &netboot["boots"]
        ),
        (
            &"once".into(),
            &"done".into(),
            &"phone-home".into(),
            &false.into()
        ),
        "{netboot}"
    );
    let table = rig.served.cli(&["hosts"]);
    assert!(
        table.contains("NETBOOT") && table.contains("once done (phone-home"),
        "{table}"
    );
    assert_eq!(
        rig.stat("pxe_netboot_changes_total{to=\"done\",by=\"phone-home\"}"),
        1
    );
    assert_eq!(rig.stat("pxe_netboot_done_hosts"), 1);

    // Persisted: a restarted agent still gives it nothing to boot.
    rig.served.signal_agent(libc::SIGTERM);
    let args: Vec<&str> = rig.args.iter().map(String::as_str).collect();
    rig.served.restart(&args);
    assert_withheld(&rig, "after a restart");

    // Without the token the API refuses; with it, reprovision arms the host.
    let out = rig
        .served
        .lab
        .cmd_in(rig.served.lab.server_ns(), agent_bin())
        .args(["reprovision", "node-1", "--no-power"])
        .env_remove("PXE_AGENT_TOKEN_FILE")
        .output()
        .expect("run pxe-agent");
    assert!(
        !out.status.success(),
        "reprovision without a token succeeded"
    );
    let token = rig.token_file();
    let said = rig.served.cli(&[
        "reprovision",
        "node-1",
        "--no-power",
        "--token-file",
        &token,
    ]);
    assert!(said.contains("once armed (operator"), "{said}");
    assert_boots(&rig, "after reprovision");
    assert_eq!(
        rig.stat("pxe_netboot_changes_total{to=\"armed\",by=\"operator\"}"),
        1
    );

    // The operator's `hosts done` withholds it again, at once.
    let said = rig
        .served
        .cli(&["hosts", "done", "node-1", "--token-file", &token]);
    assert!(said.contains("once done (operator"), "{said}");
    assert_withheld(&rig, "after hosts done");
}

#[test]
fn never_host_gets_its_address_and_no_boot_file_and_done_is_refused() {
    let inventory = INVENTORY.replace("    netboot: once\n", "    netboot: never\n");
    let files = Scratch::new("pxnbnev-files");
    fs::write(files.path("tokens"), format!("ops {TOKEN}\n")).expect("write");
    fs::write(files.path("token"), format!("{TOKEN}\n")).expect("write");
    let tokens = files.path("tokens");
    let served = Served::start_with(
        "pxnbnev",
        &inventory,
        &["--api-token-file", tokens.to_str().expect("utf-8")],
    );
    served.set_client_mac(MAC);
    let hook_args = ["-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007"];
    let lease = served.udhcpc(&hook_args);
    assert_eq!((field(&lease, "ip"), boot_file(&lease).as_str()), (IP, ""));
    // `hosts done` means nothing to a never host: refused, with the reason.
    let out = served
        .lab
        .cmd_in(served.lab.server_ns(), agent_bin())
        .args(["hosts", "done", "node-1", "--token-file"])
        .arg(files.path("token"))
        .output()
        .expect("run pxe-agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("netboot: never"),
        "{err}"
    );
}

/// A boot lab whose agent serves [`INVENTORY`] (with the guest's command
/// line) and takes the API token.
fn vm_lab(prefix: &str) -> (xtask::vm::BootLab, Scratch) {
    assert_root();
    let files = Scratch::new(&format!("{prefix}-files"));
    fs::write(files.path("tokens"), format!("ops {TOKEN}\n")).expect("write");
    fs::write(files.path("token"), format!("{TOKEN}\n")).expect("write");
    let inventory = INVENTORY.replace("console=ttyS0", PROFILE_CMDLINE);
    let tokens = files.path("tokens");
    let cfg = BootLabConfig::new(prefix, &agent_bin(), &inventory)
        .xdp_mode("native")
        .arg("--api-token-file")
        .arg(tokens.to_str().expect("utf-8"));
    let lab = xtask::vm::BootLab::start(&cfg).unwrap_or_else(|e| panic!("boot lab: {e:#}"));
    (lab, files)
}

const VM_TIMEOUT: Duration = Duration::from_secs(150);

/// Boots `firmware` to the end: it must phone home with the host's address.
fn boot_fully(lab: &xtask::vm::BootLab, name: &str, firmware: Firmware) {
    let mut vm = lab
        .start_vm(&lab.vm_spec(name, MAC, firmware, 0))
        .unwrap_or_else(|e| panic!("start {name}: {e:#}"));
    let report = vm
        .wait(VM_TIMEOUT, &mut |_| {})
        .unwrap_or_else(|e| panic!("follow {name}: {e:#}"));
    assert!(
        report.phoned_home && report.ip.as_deref() == Some(IP),
        "{name} did not boot\n{}\n{}\n{}",
        report.summary(),
        vm.console_tail(40),
        lab.agent_log_tail(40)
    );
}

/// Boots `firmware` for a done host: the firmware must start its network
/// boot, be given nothing to boot and go on to the next boot device (its
/// console shows `fell_through`); nothing is fetched from the agent. The
/// console is returned.
fn falls_through(
    lab: &xtask::vm::BootLab,
    name: &str,
    firmware: Firmware,
    fell_through: &str,
) -> String {
    let fetched_before = fetches(lab);
    let mut vm = lab
        .start_vm(&lab.vm_spec(name, MAC, firmware, 0))
        .unwrap_or_else(|e| panic!("start {name}: {e:#}"));
    let deadline = Instant::now() + VM_TIMEOUT;
    let console = loop {
        let console = vm.console_tail(usize::MAX);
        if console.contains(fell_through) {
            break console;
        }
        let exited = vm.poll(&mut |_| {}).expect("poll");
        assert!(
            !exited && Instant::now() < deadline,
            "{name} did not fall through\n{console}\n{}",
            lab.agent_log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    for fetched in [
        "/boot/52:54:00:12:34:56.ipxe",
        "NBP filename",
        "URI: http",
        "PXE-AGENT-BOOTED",
    ] {
        assert!(
            !console.contains(fetched),
            "{name}: the done host was given something to boot ({fetched}):\n{console}"
        );
    }
    assert_eq!(
        fetches(lab),
        fetched_before,
        "{name}: the agent served a file"
    );
    drop(vm);
    console
}

/// What the agent recorded the host fetching last: TFTP, script, artifact.
fn fetches(lab: &xtask::vm::BootLab) -> String {
    let text = lab.cli(&["hosts", "--format", "json"]).expect("hosts");
    let hosts: serde_json::Value = serde_json::from_str(&text).expect("json");
    let p = &hosts[0]["progress"];
    format!(
        "{} {} {} {}",
        p["tftp"], p["script"], p["artifact"], p["artifacts_fetched"]
    )
}

fn reprovision(lab: &xtask::vm::BootLab, files: &Scratch) {
    let token = files.path("token");
    let said = lab
        .cli(&[
            "reprovision",
            "node-1",
            "--no-power",
            "--token-file",
            token.to_str().expect("utf-8"),
        ])
        .expect("reprovision");
    assert!(said.contains("armed"), "{said}");
}

/// SeaBIOS with the NIC's iPXE ROM: boots and phones home; booted again it
/// leases its address, is given nothing to boot and falls through to the
/// next boot device; after `reprovision` it boots and phones home again.
#[test]
fn bios_vm_provisions_once_then_falls_through_until_reprovisioned() {
    let (lab, files) = vm_lab("pxvmnb");
    boot_fully(&lab, "first", Firmware::Bios);
    let hosts = lab.cli(&["hosts"]).expect("hosts");
    assert!(hosts.contains("once done (phone-home"), "{hosts}");
    let console = falls_through(&lab, "again", Firmware::Bios, "No bootable device");
    // iPXE configured the address it leased before it gave up.
    assert!(console.contains(IP), "no address leased:\n{console}");
    reprovision(&lab, &files);
    boot_fully(&lab, "reprovisioned", Firmware::Bios);
}

/// OVMF's PXE and HTTP boot for a host an operator marked done: each falls
/// through without fetching anything; after `reprovision` each boots.
#[test]
fn uefi_pxe_and_http_boot_vms_fall_through_when_done_and_boot_after_reprovision() {
    let (lab, files) = vm_lab("pxvmnbu");
    let token = files.path("token");
    for (name, firmware) in [("pxe", Firmware::UefiPxe), ("http", Firmware::UefiHttp)] {
        let said = lab
            .cli(&[
                "hosts",
                "done",
                "node-1",
                "--token-file",
                token.to_str().expect("utf-8"),
            ])
            .expect("hosts done");
        // Done by the operator, or by the phone-home of the boot before.
        assert!(said.contains("once done ("), "{said}");
        let offers = crate::boot_vm::xdp_counter(&lab, "tx_offer");
        falls_through(
            &lab,
            &format!("{name}-done"),
            firmware,
            "BdsDxe: failed to load",
        );
        // The firmware asked and the kernel answered it, address only.
        assert!(
            crate::boot_vm::xdp_counter(&lab, "tx_offer") > offers,
            "{name}: no offer"
        );
        reprovision(&lab, &files);
        boot_fully(&lab, &format!("{name}-again"), firmware);
    }
}

/// With a BMC, `reprovision` arms the host and hands it to the recovery
/// controller, as `recover` does: PXE set on the BMC (ipmi_sim), the host
/// powered up, the controller awaiting its DHCP; the host boots again.
#[test]
fn reprovision_with_a_bmc_arms_the_host_and_hands_it_to_the_recovery_controller() {
    let rig = crate::oob::Rig::start_with("pxnbbmc", "    netboot: once\n", &[]);
    let token = rig.token();
    let said = rig.ok(&["hosts", "done", "node-1", "--token-file", &token]);
    assert!(said.contains("once done (operator"), "{said}");
    // The client end carries the simulator too: its MAC stays, so the
    // withheld answers are checked through the API here (the DHCP routes
    // have their own test above).
    assert!(rig.get("/api/v1/hosts").contains(r#""boots":false"#));
    let said = rig.ok(&["reprovision", "node-1", "--token-file", &token]);
    assert!(
        said.contains("once armed (operator") && said.contains("recovery "),
        "{said}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let hosts = rig.get("/api/v1/hosts");
        if hosts.contains(r#""recovery":"awaiting-dhcp""#) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not awaiting-dhcp after 20 s: {hosts}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(rig.sim.state("boot"), "pxe", "the BMC was not set to PXE");
    assert!(rig.get("/api/v1/hosts").contains(r#""boots":true"#));
    let audit = rig.get("/api/v1/audit");
    assert!(
        audit.contains(r#""action":"reprovision""#) && audit.contains(r#""action":"recover""#),
        "{audit}"
    );
}
