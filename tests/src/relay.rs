//! A relayed segment end to end: a client behind the ISC relay agent
//! (dhcrelay, adding option 82), which forwards to the agent. The XDP
//! program passes relayed requests with option 82 up; the slow path answers
//! them through the kernel stack to the relay, echoing option 82.
//!
//! ```text
//! server ns                 relay ns (the lab's client ns)          client ns
//! pxsrv0 10.66.0.1/16 ──── pxcli0 10.66.0.2/16 │ pxrly0 10.77.0.1/24 ──── pxcli0 (no address)
//! agent + XDP              dhcrelay -iu pxcli0 -id pxrly0          udhcpc
//! ```

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use dhcproto::{Decodable as _, Decoder, v4::Message};
use xtask::ChildGuard;

use crate::{
    agent::vars,
    agent::{Served, script},
    frame::parse_reply,
    persistence::discovered,
    raw::{RawSocket, in_netns},
};

const INVENTORY: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    lease_time: 3600
    pool: {start: 10.66.200.1, end: 10.66.200.50}
  - cidr: 10.77.0.0/24
    router: 10.77.0.1
    lease_time: 1800
    pool: {start: 10.77.0.100, end: 10.77.0.199}
discovery: {policy: inspect, profile: inspector, lease_time: 600}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe}
  - name: inspector
    boot: {bios: undionly.kpxe}
hosts:
  - mac: "52:54:00:77:00:50"
    ip: 10.77.0.50
    hostname: rack7-node50
    profile: worker
"#;

/// The relay's downstream interface: dhcrelay's circuit id (option 82
/// sub-option 1) is its name.
const RELAY_DOWN: &str = "pxrly0";
const CLIENT_IF: &str = "pxcli0";

/// Field order matters: the relay stops before the lab goes.
struct Relayed {
    _relay: ChildGuard,
    served: Served,
    client_ns: String,
}

impl Relayed {
    fn start(name: &str) -> Relayed {
        let mut served = Served::start(name, INVENTORY);
        let relay_ns = served.lab.client_ns().to_string();
        let server_ns = served.lab.server_ns().to_string();
        // A lab-owned namespace for the client; its link to the server goes,
        // the client hangs off the relay instead.
        let link = served
            .lab
            .add_client_ns("client")
            .expect("client namespace");
        let client_ns = link.client_ns.clone();
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .expect("run ip");
            assert!(
                out.status.success(),
                "`ip {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ip(&["-n", &server_ns, "link", "del", &link.server_if]);
        ip(&[
            "-n", &relay_ns, "link", "add", RELAY_DOWN, "type", "veth", "peer", "name", CLIENT_IF,
            "netns", &client_ns,
        ]);
        ip(&[
            "-n",
            &relay_ns,
            "addr",
            "add",
            "10.66.0.2/16",
            "dev",
            served.lab.client_if(),
        ]);
        ip(&[
            "-n",
            &relay_ns,
            "addr",
            "add",
            "10.77.0.1/24",
            "dev",
            RELAY_DOWN,
        ]);
        ip(&["-n", &relay_ns, "link", "set", RELAY_DOWN, "up"]);
        ip(&["-n", &client_ns, "link", "set", CLIENT_IF, "up"]);
        ip(&[
            "-n",
            &server_ns,
            "route",
            "add",
            "10.77.0.0/24",
            "via",
            "10.66.0.2",
        ]);
        served
            .lab
            .run_in(&relay_ns, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])
            .expect("ip_forward in the relay namespace");

        let log = served.dir.path("dhcrelay.log");
        let relay = ChildGuard::spawn(
            served
                .lab
                .cmd_in(&relay_ns, "dhcrelay")
                .args(["-4", "-d", "-a", "-D", "--no-pid", "-iu"])
                .arg(served.lab.client_if())
                .args(["-id", RELAY_DOWN, "10.66.0.1"])
                .stdout(std::fs::File::create(&log).expect("relay log"))
                .stderr(
                    std::fs::File::options()
                        .append(true)
                        .open(&log)
                        .expect("relay log"),
                ),
        )
        .expect("spawn dhcrelay (isc-dhcp-relay)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Socket/fallback")
        {
            assert!(
                Instant::now() < deadline,
                "dhcrelay did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Relayed {
            _relay: relay,
            served,
            client_ns,
        }
    }

    fn set_client_mac(&self, mac: &str) {
        self.served
            .lab
            .run_in(
                &self.client_ns,
                &["ip", "link", "set", "dev", CLIENT_IF, "address", mac],
            )
            .expect("set client MAC");
    }

    /// Runs busybox udhcpc once on the relayed segment; the variables its
    /// script saw on `bound`.
    fn udhcpc(&self) -> BTreeMap<String, String> {
        let hook = script(
            &self.served.dir.0,
            "udhcpc.sh",
            r#"[ "$1" = bound ] && echo "ip=$ip router=$router serverid=$serverid lease=$lease boot_file=$boot_file""#,
        );
        let out = self
            .served
            .lab
            .cmd_in(&self.client_ns, "busybox")
            .args([
                "udhcpc", "-f", "-q", "-n", "-t", "5", "-T", "1", "-i", CLIENT_IF, "-s",
            ])
            .arg(&hook)
            .args(["-V", "PXEClient", "-x", "0x5d:0000"])
            .output()
            .expect("run udhcpc");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "udhcpc got no lease through the relay: {text}{}\nrelay log:\n{}\nagent log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.relay_log(),
            self.served.log()
        );
        vars(&text)
    }

    fn relay_log(&self) -> String {
        std::fs::read_to_string(self.served.dir.path("dhcrelay.log")).unwrap_or_default()
    }

    fn slow(&self, name: &str) -> u64 {
        self.served.stats().get(name).copied().unwrap_or(0)
    }
}

/// A DHCP message seen on the server's interface.
struct Seen {
    /// BOOTP op: 1 request, 2 reply.
    op: u8,
    xid: u32,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    giaddr: Ipv4Addr,
    /// The raw value of option 82, if present.
    relay_info: Option<Vec<u8>>,
}

/// The value of option `code` in a BOOTP message.
fn raw_option(bootp: &[u8], code: u8) -> Option<Vec<u8>> {
    let mut off = 240;
    while off < bootp.len() {
        match bootp[off] {
            0 => off += 1,
            255 => return None,
            c => {
                let len = usize::from(*bootp.get(off + 1)?);
                let value = bootp.get(off + 2..off + 2 + len)?;
                if c == code {
                    return Some(value.to_vec());
                }
                off += 2 + len;
            }
        }
    }
    None
}

/// Records DHCP traffic between server and relay on the server's interface
/// (both directions) until stopped.
fn capture(served: &Served) -> (Arc<AtomicBool>, JoinHandle<Vec<Seen>>) {
    let ns = served.lab.server_ns().to_string();
    let iface = served.lab.server_if().to_string();
    let sock = in_netns(&ns, move || RawSocket::open(&iface))
        .expect("enter server namespace")
        .expect("raw socket");
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !flag.load(Ordering::Relaxed) {
            let Some(f) = sock.recv(Duration::from_millis(20)).expect("capture") else {
                continue;
            };
            let is_dhcp = f.len() > 42
                && f[12..14] == [0x08, 0x00]
                && f[14] == 0x45
                && f[23] == 17
                && (f[36..38] == [0, 67] || f[36..38] == [0, 68]);
            if !is_dhcp {
                continue;
            }
            let r = parse_reply(&f);
            let Ok(msg) = Message::decode(&mut Decoder::new(&r.payload)) else {
                continue;
            };
            seen.push(Seen {
                op: r.payload[0],
                xid: msg.xid(),
                src: r.ip_src,
                dst: r.ip_dst,
                giaddr: msg.giaddr(),
                relay_info: raw_option(&r.payload, 82),
            });
        }
        seen
    });
    (stop, handle)
}

#[test]
fn relayed_known_host_gets_its_reservation_with_option_82_echoed() {
    let relayed = Relayed::start("pxrelay");
    relayed.set_client_mac("52:54:00:77:00:50");
    let served = &relayed.served;
    let (pass_relay, acks) = (
        served.counter("pass_relay"),
        relayed.slow("pxe_slow_replies_total{type=\"ack\"}"),
    );
    let (stop, capture) = capture(served);
    let lease = relayed.udhcpc();
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let seen = capture.join().expect("capture thread");

    assert_eq!(lease["ip"], "10.77.0.50", "not the reservation: {lease:?}");
    assert_eq!(
        lease["router"], "10.77.0.1",
        "not the relayed subnet's router"
    );
    assert_eq!(
        lease["lease"], "1800",
        "not the relayed subnet's lease time"
    );
    assert_eq!(lease["serverid"], "10.66.0.1");
    assert_eq!(lease["boot_file"], "undionly.kpxe");
    assert!(
        served.counter("pass_relay") >= pass_relay + 2,
        "XDP did not pass the relayed DISCOVER and REQUEST up (pass_relay)"
    );
    assert!(
        relayed.slow("pxe_slow_replies_total{type=\"ack\"}") > acks,
        "the slow path sent no ACK"
    );

    // dhcrelay -a -D forwards a reply only when it carries the relay's own
    // option 82, so the lease above already shows the echo; the capture on
    // the server's interface shows it byte for byte.
    let requests: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.op == 1 && s.src == Ipv4Addr::new(10, 66, 0, 2))
        .collect();
    let replies: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.op == 2 && s.dst == Ipv4Addr::new(10, 77, 0, 1))
        .collect();
    assert!(
        requests.len() >= 2 && replies.len() >= 2,
        "expected relayed DISCOVER/REQUEST and OFFER/ACK on the server's link, saw {} requests and {} replies",
        requests.len(),
        replies.len()
    );
    for reply in &replies {
        let request = requests
            .iter()
            .find(|r| r.xid == reply.xid)
            .unwrap_or_else(|| {
                panic!("reply with xid {:#x} answers no relayed request", reply.xid)
            });
        assert_eq!(
            request.giaddr,
            Ipv4Addr::new(10, 77, 0, 1),
            "relay's giaddr"
        );
        let info = request
            .relay_info
            .as_ref()
            .expect("dhcrelay -a added no option 82");
        assert!(
            info.windows(RELAY_DOWN.len())
                .any(|w| w == RELAY_DOWN.as_bytes()),
            "circuit id is not the relay's downstream interface: {info:?}"
        );
        assert_eq!(
            reply.relay_info.as_ref(),
            Some(info),
            "reply does not echo the request's option 82 unchanged"
        );
    }
}

#[test]
fn relayed_unknown_mac_leases_from_the_pool_of_the_relay_subnet() {
    let relayed = Relayed::start("pxrelayp");
    relayed.set_client_mac("52:54:00:77:aa:01");
    let served = &relayed.served;
    let pass_relay = served.counter("pass_relay");
    let lease = relayed.udhcpc();
    let ip: Ipv4Addr = lease["ip"].parse().expect("leased address");
    assert!(
        (Ipv4Addr::new(10, 77, 0, 100)..=Ipv4Addr::new(10, 77, 0, 199)).contains(&ip),
        "{ip} is not from the pool of the relay's subnet 10.77.0.0/24"
    );
    assert_eq!(lease["router"], "10.77.0.1");
    assert_eq!(lease["lease"], "600", "not the discovery lease time");
    assert!(
        served.counter("pass_relay") >= pass_relay + 2,
        "XDP did not pass the relayed requests up"
    );
    let listed = served.cli(&["hosts", "--discovered"]);
    let row = listed
        .lines()
        .find(|l| l.starts_with("52:54:00:77:aa:01"))
        .unwrap_or_else(|| panic!("not listed for adoption: {listed}"));
    assert!(
        row.contains(&lease["ip"]) && row.contains("10.77.0.1"),
        "row lacks its address or relay: {row}"
    );
    assert_eq!(
        discovered(served).get("52:54:00:77:aa:01"),
        Some(&lease["ip"])
    );
    let api = served
        .lab
        .run_in(
            served.lab.server_ns(),
            &["curl", "-sf", "http://127.0.0.1:9465/api/v1/discovered"],
        )
        .expect("GET /api/v1/discovered");
    assert!(
        api.contains(&format!("\"circuit_id\":\"{RELAY_DOWN}\"")),
        "the relay's circuit id is not recorded: {api}"
    );
}
