//! The loaded XDP program filled from a test inventory, and a runner for
//! `BPF_PROG_TEST_RUN`.

use std::path::Path;

use aya::programs::{TestRun as _, TestRunOptions, Xdp};
use pxe_agent::{
    dhcp::{Server, template},
    inventory::Inventory,
    xdp::{FastPath, Stats},
};

use crate::frame::{SERVER_IP, SERVER_MAC};

/// The inventory the in-kernel tests answer from.
pub const TEST_INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    dns: [10.66.0.1]
    domain: lab.example
    lease_time: 3600
profiles:
  - name: worker
    boot:
      bios: undionly.kpxe
      uefi: ipxe.efi
      uefi_arm64: ipxe-arm64.efi
      http: "http://{server}:8080/ipxe.efi"
  - name: bare
hosts:
  - mac: "52:54:00:00:00:01"
    ip: 10.66.1.10
    hostname: node-1
    profile: worker
    options: {42: 10.66.0.1}
  - mac: "52:54:00:00:00:02"
    ip: 10.66.1.11
    hostname: node-2
    profile: bare
"#;

pub const WORKER_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
pub const BARE_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];
pub const UNKNOWN_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0x7f];

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;

pub struct Fixture {
    pub fast: FastPath,
    pub inv: Inventory,
    pub server: Server,
}

impl Fixture {
    /// Loads the program (panicking with the verifier's reason if the kernel
    /// refuses it) and fills its map from [`TEST_INVENTORY`].
    #[expect(
        clippy::new_without_default,
        reason = "loading a program is not a default value"
    )]
    pub fn new() -> Fixture {
        Fixture::with_inventory(TEST_INVENTORY)
    }

    pub fn with_inventory(yaml: &str) -> Fixture {
        assert_root();
        let inv = Inventory::parse(Path::new("test-inventory.yaml"), yaml)
            .expect("test inventory is valid");
        let server = Server {
            ip: SERVER_IP,
            mac: SERVER_MAC,
        };
        let compiled = template::compile(&inv, &server).expect("test inventory compiles");
        let mut fast =
            FastPath::load().unwrap_or_else(|e| panic!("XDP program failed to load: {e:?}"));
        fast.sync(compiled)
            .expect("the maps accept the compiled inventory");
        Fixture { fast, inv, server }
    }

    /// The address the test inventory reserves for [`WORKER_MAC`].
    pub fn worker_ip(&self) -> std::net::Ipv4Addr {
        self.inv
            .hosts
            .iter()
            .find(|host| host.mac.0 == WORKER_MAC)
            .expect("test inventory has the worker host")
            .ipv4()
            .expect("the worker has an IPv4 address")
    }

    /// Runs the program once on `frame`: the XDP action and the frame after it.
    pub fn run(&self, frame: &[u8]) -> (u32, Vec<u8>) {
        let mut out = vec![0u8; 4096];
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.data_out = Some(&mut out);
        let res = self
            .fast
            .program()
            .test_run(opts)
            .expect("BPF_PROG_TEST_RUN");
        out.truncate(res.data_size_out as usize);
        (res.return_value, out)
    }

    /// Kernel time of one run of `frame`, averaged over `runs` runs (see
    /// [`time_per_run`]).
    pub fn time_per_run(&self, frame: &[u8], runs: u32) -> std::time::Duration {
        time_per_run(self.fast.program(), frame, runs)
    }

    pub fn stats(&self) -> Stats {
        Stats::read(self.fast.counters()).expect("counters readable")
    }
}

/// Kernel time of one run of `program` on `frame`, averaged over `runs`
/// runs; panics unless every run answers (XDP_TX).
///
/// Each run is its own `BPF_PROG_TEST_RUN` with repeat 1: with a larger
/// repeat the kernel reruns the program on the frame it just rewrote
/// into a reply, which measures the reply being ignored, not answered.
pub fn time_per_run(program: &Xdp, frame: &[u8], runs: u32) -> std::time::Duration {
    let mut total = std::time::Duration::ZERO;
    let mut out = vec![0u8; 4096];
    for _ in 0..runs {
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.data_out = Some(&mut out);
        let res = program.test_run(opts).expect("BPF_PROG_TEST_RUN");
        assert_eq!(res.return_value, XDP_TX, "timed frame was not answered");
        total += res.duration;
    }
    total / runs
}

/// Privileged tests fail loudly, never skip.
pub fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "privileged test: run as root (CAP_BPF, CAP_NET_ADMIN), e.g. `cargo xtask test`"
    );
}
