//! The IPMI driver against OpenIPMI's `ipmi_sim` in a lab namespace, and
//! against a fixture proxy that rewrites or mangles the simulator's answers
//! (refused cipher suite, truncated and garbled packets).
//!
//! The simulator listens on the server end of the lab (10.66.0.1); the
//! driver runs in the client namespace (10.66.0.2). No traffic leaves the
//! lab's namespaces.

use std::{
    future::Future,
    net::UdpSocket,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use pxe_agent::bmc::{
    Bmc, BmcError, BootDevice, BootTarget, Credentials, IpmiBmc, Password, PowerAction, PowerState,
    ProtocolError, RetryPolicy,
};
use xtask::Lab;

use crate::{
    bmc_sim::{IpmiSim, PASSWORD, VIEWER, block_on_in, quick},
    raw::in_netns,
};

const BMC_IP: &str = "10.66.0.1";
const CLIENT_CIDR: &str = "10.66.0.2/16";

/// The simulator on the lab's server end, the driver in its client
/// namespace. Field order matters: the simulator stops before the lab goes.
struct Sim {
    sim: IpmiSim,
    lab: Lab,
}

impl Sim {
    fn start() -> Sim {
        let lab = Lab::new("pxbmc").expect("create lab");
        lab.run_in(
            lab.client_ns(),
            &["ip", "addr", "add", CLIENT_CIDR, "dev", lab.client_if()],
        )
        .expect("address client end");
        let sim = IpmiSim::start(lab.server_ns(), BMC_IP);
        Sim { sim, lab }
    }

    /// Kills the simulator by its PID and starts it again.
    fn restart(&mut self) {
        self.sim.restart();
    }

    fn ipmitool(&self, args: &[&str]) -> anyhow::Result<String> {
        self.sim.ipmitool(self.lab.client_ns(), args)
    }

    fn state(&self, file: &str) -> String {
        self.sim.state(file)
    }

    fn client(&self, port: u16, user: &str, password: &str, policy: RetryPolicy) -> IpmiBmc {
        self.sim.client(port, user, password, policy)
    }

    /// Runs `f` on a current-thread runtime inside the client namespace.
    fn run<T: Send + 'static, F: Future<Output = T> + 'static>(
        &self,
        f: impl FnOnce() -> F + Send + 'static,
    ) -> T {
        block_on_in(self.lab.client_ns(), f)
    }
}

#[test]
fn every_command_reaches_the_simulator() {
    let sim = Sim::start();
    let bmc = sim.client(623, "admin", PASSWORD, quick());
    let b = bmc.clone();
    let info = sim.run(move || async move { b.info().await });
    let info = info.expect("device id");
    assert_eq!(info.ipmi_version, (2, 0));
    assert_eq!(info.manufacturer_id, 0x1291);
    assert_eq!(info.product_id, 0x0f02);

    for (action, want) in [
        (PowerAction::On, PowerState::On),
        (PowerAction::Off, PowerState::Off),
    ] {
        let b = bmc.clone();
        let status = sim.run(move || async move {
            b.power(action).await?;
            b.power_status().await
        });
        assert_eq!(status.expect("power"), want);
        let tool = sim.ipmitool(&["power", "status"]).unwrap();
        let word = if want == PowerState::On { "on" } else { "off" };
        assert!(tool.contains(&format!("is {word}")), "ipmitool says {tool}");
    }
    for action in [PowerAction::Cycle, PowerAction::Reset, PowerAction::SoftOff] {
        let b = bmc.clone();
        sim.run(move || async move { b.power(action).await })
            .unwrap_or_else(|e| panic!("{action:?}: {e}"));
    }
    let calls = sim.state("calls.log");
    assert!(
        calls.contains("set power 1") && calls.contains("set power 0"),
        "{calls}"
    );
    let actions = sim.state("actions");
    assert!(
        actions.contains("reset 1") && actions.contains("shutdown 1"),
        "{actions}"
    );

    // ipmi_sim keeps only the selector; its program sees disk as "default".
    for (device, recorded, tool) in [
        (BootDevice::Pxe, "pxe", "Force PXE"),
        (BootDevice::Disk, "default", "Hard-Drive"),
        (BootDevice::BiosSetup, "bios", "BIOS Setup"),
    ] {
        let b = bmc.clone();
        let target = BootTarget {
            device,
            persistent: true,
            efi: true,
        };
        let read = sim.run(move || async move {
            b.set_boot_device(target).await?;
            b.boot_device().await
        });
        let read = read.unwrap_or_else(|e| panic!("{device:?}: {e}"));
        assert_eq!(read.device(), Some(device));
        assert_eq!(sim.state("boot"), recorded);
        let out = sim.ipmitool(&["chassis", "bootparam", "get", "5"]).unwrap();
        assert!(out.contains(tool), "ipmitool: {out}");
    }
    // One session served all of it.
    assert_eq!(bmc.handshakes(), 1);
}

#[test]
fn wrong_password_fails_once_with_a_clear_error() {
    let sim = Sim::start();
    let bmc = sim.client(623, "admin", "not-the-password", quick());
    let b = bmc.clone();
    let err = sim
        .run(move || async move { b.power_status().await })
        .unwrap_err();
    assert!(matches!(err, BmcError::AuthFailed { .. }), "{err}");
    assert!(err.is_permanent());
    let text = format!("{err} {err:?}");
    assert!(
        text.contains("admin") && !text.contains("not-the-password"),
        "{text}"
    );
    assert_eq!(bmc.handshakes(), 1, "auth failures must not be retried");
}

#[test]
fn user_below_administrator_is_refused_clearly() {
    let sim = Sim::start();
    let bmc = sim.client(623, VIEWER, PASSWORD, quick());
    let b = bmc.clone();
    let err = sim
        .run(move || async move { b.power(PowerAction::On).await })
        .unwrap_err();
    assert!(
        matches!(err, BmcError::InsufficientPrivilege { .. }),
        "{err}"
    );
    assert!(err.is_permanent());
    let text = format!("{err} {err:?}");
    assert!(
        text.contains(VIEWER) && text.contains("Administrator") && !text.contains(PASSWORD),
        "{text}"
    );
    assert_eq!(bmc.handshakes(), 1, "privilege errors must not be retried");
}

#[test]
fn user_below_administrator_with_a_wrong_password_is_auth_failed() {
    let sim = Sim::start();
    let bmc = sim.client(623, VIEWER, "not-the-password", quick());
    let b = bmc.clone();
    let err = sim
        .run(move || async move { b.power_status().await })
        .unwrap_err();
    assert!(matches!(err, BmcError::AuthFailed { .. }), "{err}");
    assert_eq!(bmc.handshakes(), 1, "auth failures must not be retried");
}

#[test]
fn unreachable_bmc_fails_within_the_deadline() {
    let sim = Sim::start();
    let creds = Credentials::new("admin", Password::new(PASSWORD)).unwrap();
    // In the lab's subnet, but no host answers ARP for it.
    let addr = "ipmi://10.66.0.99".parse().unwrap();
    let policy = RetryPolicy {
        deadline: Duration::from_secs(2),
        ..quick()
    };
    let bmc = IpmiBmc::new(&addr, creds, policy).unwrap();
    let started = Instant::now();
    let err = sim
        .run(move || async move { bmc.power_status().await })
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err, BmcError::Unreachable { .. } | BmcError::Timeout { .. }),
        "{err}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn restarted_bmc_gets_a_new_session() {
    let mut sim = Sim::start();
    let bmc = sim.client(623, "admin", PASSWORD, quick());
    let b = bmc.clone();
    sim.run(move || async move { b.power_status().await })
        .expect("first status");
    sim.restart();
    let b = bmc.clone();
    sim.run(move || async move { b.power_status().await })
        .expect("status after restart");
    assert_eq!(bmc.handshakes(), 2);
}

/// How the fixture proxy changes the simulator's answers.
#[derive(Debug, Clone, Copy)]
enum Mangle {
    /// Open Session answered with RMCP+ status 11h (no cipher suite match).
    NoCipherSuite,
    /// The ASF pong cut after its length byte.
    TruncatedPong,
    /// Open Session "accepts" HMAC-MD5-128 integrity, which ipmi-rs lacks.
    UnsupportedIntegrity,
    /// Every session answer cut in half.
    TruncatedSession,
    /// Every session answer with its payload bytes flipped.
    Garbled,
    /// Answers to the ping only; silence after.
    SilentAfterPing,
}

fn mangle(mode: Mangle, mut pkt: Vec<u8>) -> Option<Vec<u8>> {
    let asf = pkt.get(3) == Some(&0x06);
    let payload_type = pkt.get(5).map(|t| t & 0x3f);
    match mode {
        Mangle::NoCipherSuite if payload_type == Some(0x11) && pkt.len() >= 24 => {
            // Error form: tag, status, reserved, console session ID.
            pkt[16 + 1] = 0x11;
            pkt.truncate(24);
            pkt[14] = 8;
            pkt[15] = 0;
        }
        Mangle::TruncatedPong if asf => pkt.truncate(14),
        Mangle::UnsupportedIntegrity if payload_type == Some(0x11) && pkt.len() >= 52 => {
            pkt[16 + 24] = 0x02;
        }
        Mangle::TruncatedSession if !asf => {
            let half = pkt.len() / 2;
            pkt.truncate(half);
        }
        Mangle::Garbled if !asf && pkt.len() > 16 => {
            pkt[16..].iter_mut().for_each(|b| *b ^= 0xa5);
        }
        Mangle::SilentAfterPing if !asf => return None,
        _ => {}
    }
    Some(pkt)
}

/// A UDP proxy in the server namespace: the driver talks to `port`, the
/// proxy relays to ipmi_sim and mangles its answers. Stops on drop.
struct Proxy {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    fn start(sim: &Sim, mode: Mangle) -> Proxy {
        let (front, back) = in_netns(sim.lab.server_ns(), || {
            let front = UdpSocket::bind((BMC_IP, 0)).expect("bind proxy");
            let back = UdpSocket::bind((BMC_IP, 0)).expect("bind upstream");
            back.connect((BMC_IP, 623)).expect("connect upstream");
            (front, back)
        })
        .expect("enter server namespace");
        let port = front.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            let tick = Some(Duration::from_millis(20));
            front.set_read_timeout(tick).unwrap();
            back.set_read_timeout(tick).unwrap();
            let mut client = None;
            let mut buf = [0u8; 2048];
            while !flag.load(Ordering::Relaxed) {
                if let Ok((n, from)) = front.recv_from(&mut buf) {
                    client = Some(from);
                    let _ = back.send(&buf[..n]);
                }
                if let (Ok(n), Some(to)) = (back.recv(&mut buf), client)
                    && let Some(out) = mangle(mode, buf[..n].to_vec())
                {
                    let _ = front.send_to(&out, to);
                }
            }
        });
        Proxy {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn bmc_without_cipher_suite_3_is_reported_without_panic() {
    let sim = Sim::start();
    let proxy = Proxy::start(&sim, Mangle::NoCipherSuite);
    let bmc = sim.client(proxy.port, "admin", PASSWORD, quick());
    let b = bmc.clone();
    let err = sim
        .run(move || async move { b.power_status().await })
        .unwrap_err();
    assert!(matches!(err, BmcError::NoCipherSuite { .. }), "{err}");
    assert_eq!(bmc.handshakes(), 1);
}

#[test]
fn malformed_answers_fail_within_the_deadline_without_panic() {
    let sim = Sim::start();
    for mode in [
        Mangle::TruncatedPong,
        Mangle::UnsupportedIntegrity,
        Mangle::TruncatedSession,
        Mangle::Garbled,
        Mangle::SilentAfterPing,
    ] {
        let proxy = Proxy::start(&sim, mode);
        let policy = quick();
        let bmc = sim.client(proxy.port, "admin", PASSWORD, policy);
        let started = Instant::now();
        let err = sim
            .run(move || async move { bmc.power_status().await })
            .expect_err("mangled answers must fail");
        let took = started.elapsed();
        eprintln!("{mode:?}: {err} after {took:?}");
        assert!(
            took <= policy.deadline + Duration::from_secs(1),
            "{mode:?} took {took:?}"
        );
        if matches!(mode, Mangle::TruncatedPong | Mangle::UnsupportedIntegrity) {
            assert!(
                matches!(
                    err,
                    BmcError::Protocol {
                        source: ProtocolError::LibraryPanic | ProtocolError::Handshake(_),
                        ..
                    } | BmcError::Timeout { .. }
                ),
                "{mode:?}: {err}"
            );
        }
    }
}
