//! One sushy-tools `sushy-emulator` process with its fake systems driver:
//! its Python config file, htpasswd file (bcrypt, the only digest it
//! accepts) and optional TLS certificate, started by PID on a loopback
//! port and killed by PID when dropped; plus the test CA that signs that
//! certificate (made with the `openssl` CLI).
//!
//! The fake driver keeps systems in a state directory inside the scratch
//! directory, so no state is carried from one run to the next. It applies
//! power changes after a random 1-11 s delay and always reports
//! `BootSourceOverrideEnabled: Continuous`.

use std::{
    fs,
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use pxe_agent::bmc::{Credentials, Password, RedfishBmc, RetryPolicy, TlsOptions};
use xtask::{ChildGuard, process};

use crate::agent::Scratch;

/// The emulator's user.
pub const USER: &str = "admin";
/// Its password.
pub const PASSWORD: &str = "sushy-test-secret";
/// UUIDs of the fake systems (the Systems collection lists them).
pub const SYSTEM_1: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef094";
pub const SYSTEM_2: &str = "5a1c5f4b-2b1e-4a5e-9a44-4c7bfa1c9a02";

/// A running emulator.
pub struct SushyEmulator {
    child: Option<ChildGuard>,
    pub port: u16,
    pub scratch: Scratch,
    /// Serves HTTPS with a certificate signed by [`SushyEmulator::ca_file`].
    pub tls: bool,
}

impl SushyEmulator {
    /// Plain HTTP, with `systems` fake systems (1 or 2), all powered off.
    pub fn start(systems: usize) -> SushyEmulator {
        SushyEmulator::start_with(systems, false)
    }

    /// HTTPS with a certificate for 127.0.0.1 signed by a test CA.
    pub fn start_tls() -> SushyEmulator {
        SushyEmulator::start_with(1, true)
    }

    fn start_with(systems: usize, tls: bool) -> SushyEmulator {
        let venv = xtask::setup::python_tools_dir().expect("cache directory");
        let emulator = venv.join("bin/sushy-emulator");
        assert!(
            emulator.exists(),
            "{} is missing: run `cargo xtask setup` (installs sushy-tools into the Python tools venv)",
            emulator.display()
        );
        let scratch = Scratch::new("sushy");
        let hash = process::run(Command::new(venv.join("bin/python")).args([
            "-c",
            "import bcrypt, sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(4)).decode())",
            PASSWORD,
        ]))
        .expect("bcrypt the emulator's password");
        fs::write(
            scratch.path("htpasswd"),
            format!("{USER}:{}\n", hash.trim()),
        )
        .unwrap();
        let list: Vec<String> = [SYSTEM_1, SYSTEM_2]
            .iter()
            .take(systems)
            .enumerate()
            .map(|(i, uuid)| {
                format!(
                    "{{'uuid': '{uuid}', 'name': 'node-{n}', 'power_state': 'Off', \
                     'external_notifier': False, \
                     'nics': [{{'mac': '52:54:00:00:00:0{n}', 'ip': '10.0.0.{n}'}}]}}",
                    n = i + 1
                )
            })
            .collect();
        let config = format!(
            "SUSHY_EMULATOR_FAKE_DRIVER = True\n\
             SUSHY_EMULATOR_FAKE_SYSTEMS = [{}]\n\
             SUSHY_EMULATOR_AUTH_FILE = '{}'\n\
             SUSHY_EMULATOR_STATE_DIR = '{}'\n",
            list.join(", "),
            scratch.path("htpasswd").display(),
            scratch.path("state").display(),
        );
        fs::write(scratch.path("emulator.conf"), config).unwrap();
        if tls {
            make_certificates(&scratch);
        }
        let port = free_port();
        let mut cmd = Command::new(&emulator);
        cmd.arg("--config")
            .arg(scratch.path("emulator.conf"))
            .args(["--fake", "-i", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(fs::File::create(scratch.path("emulator.log")).unwrap())
            .stderr(fs::File::create(scratch.path("emulator.err")).unwrap());
        if tls {
            cmd.arg("--ssl-certificate")
                .arg(scratch.path("bmc.pem"))
                .arg("--ssl-key")
                .arg(scratch.path("bmc.key"));
        }
        let child = ChildGuard::spawn(&mut cmd).expect("start sushy-emulator");
        let emu = SushyEmulator {
            child: Some(child),
            port,
            scratch,
            tls,
        };
        emu.wait_listening();
        emu
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "sushy-emulator did not listen on 127.0.0.1:{} within 20 s; stderr:\n{}",
            self.port,
            self.log()
        );
    }

    /// The emulator's stderr (Flask logs requests there).
    pub fn log(&self) -> String {
        fs::read_to_string(self.scratch.path("emulator.err")).unwrap_or_default()
    }

    /// `redfish+http(s)://127.0.0.1:PORT` with `path` appended.
    pub fn address(&self, path: &str) -> String {
        let scheme = if self.tls {
            "redfish+https"
        } else {
            "redfish+http"
        };
        format!("{scheme}://127.0.0.1:{}{path}", self.port)
    }

    /// The address of fake system `uuid`.
    pub fn system(&self, uuid: &str) -> String {
        self.address(&format!("/redfish/v1/Systems/{uuid}"))
    }

    /// The test CA's certificate (TLS emulators only).
    pub fn ca_file(&self) -> PathBuf {
        self.scratch.path("ca.pem")
    }

    /// A driver for `address` with the emulator's credentials.
    pub fn driver(&self, address: &str, tls: TlsOptions, policy: RetryPolicy) -> RedfishBmc {
        driver(address, PASSWORD, tls, policy)
    }
}

impl Drop for SushyEmulator {
    fn drop(&mut self) {
        // ChildGuard kills and reaps its own PID.
        drop(self.child.take());
        let _ = fs::remove_dir_all(&self.scratch.0);
    }
}

/// A driver for `address` as user [`USER`] with `password`.
pub fn driver(address: &str, password: &str, tls: TlsOptions, policy: RetryPolicy) -> RedfishBmc {
    RedfishBmc::new(
        &address.parse().expect("BMC address"),
        Credentials::new(USER, Password::new(password)).unwrap(),
        &tls,
        policy,
    )
    .expect("driver")
}

/// A port that was free on 127.0.0.1 a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}

/// A test CA (`ca.pem`) and a certificate for 127.0.0.1 it signed
/// (`bmc.pem`, `bmc.key`): the shape of a BMC with a private CA. A bare
/// self-signed certificate would not do as a trust anchor for itself with
/// webpki (a CA certificate may not be the end entity).
fn make_certificates(scratch: &Scratch) {
    let dir = &scratch.0;
    crate::certs::make_ca(dir, "ca");
    crate::certs::make_server(dir, "ca", "bmc", "1");
    fs::copy(dir.join("bmc.crt"), dir.join("bmc.pem")).expect("bmc.pem");
}
