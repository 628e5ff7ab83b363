//! Compiles the inventory into the fast path's map values: a `HostRecord`
//! per host port and the `ReplyBody`s hosts share.
//!
//! Each reply is the slow path's own encoding of a DHCPOFFER, made against
//! a request whose per-request fields are zero. The encoder puts the host's
//! own options last; the reply is cut there. What comes before (yiaddr
//! zeroed) is the body, kept once however many hosts have it; the host's
//! address and options are its record. The XDP program splices both and
//! fills in the request's fields. There is no second reply builder.

use std::{collections::HashMap, sync::Arc};

use pxe_ebpf_common::{BODY_WHOLE, BootClass, HostRecord, MacKey, NO_BODY, ReplyBody, bootp};

use super::{
    Request,
    encode::encode_split,
    fast_path::{Decision, fast_path},
    host_table::{HostTable, RecordRef, Records},
    reply::{Reply, ReplyKind, Server},
};
use crate::inventory::Host;
use crate::inventory::{Inventory, Problem};

/// An inventory compiled for one server: every host port's record, whose
/// body slots index `bodies`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Compiled {
    pub hosts: HostTable,
    /// The distinct bodies, each once.
    pub bodies: Vec<ReplyBody>,
}

impl Compiled {
    /// The body `host` gets for `class`, and whether its own options follow.
    pub fn body(&self, host: &HostRecord, class: BootClass) -> Option<(&ReplyBody, bool)> {
        let (slot, with_host) = host.body(class)?;
        Some((self.bodies.get(slot as usize)?, with_host))
    }

    /// Answers compiled: host ports times the classes each is answered in.
    pub fn replies(&self) -> usize {
        self.hosts
            .records()
            .map(|h| h.bodies.iter().filter(|b| **b != NO_BODY).count())
            .sum()
    }

    /// The whole reply (a DHCPOFFER with the per-request fields zero) the
    /// kernel assembles for `mac` asking in `class`, as the XDP program
    /// does: body, the host's options, the end option, padding.
    pub fn reply(&self, mac: [u8; 6], class: BootClass) -> Option<Vec<u8>> {
        let host = self.hosts.get(&MacKey::new(mac))?;
        let (body, with_host) = self.body(&host, class)?;
        Some(assemble(body, &host, with_host))
    }
}

/// Body, host options, end and padding, as the XDP program splices them.
pub fn assemble(body: &ReplyBody, host: &HostRecord, with_host: bool) -> Vec<u8> {
    let mut out = body.payload[..body.len as usize].to_vec();
    out[bootp::OFF_YIADDR..bootp::OFF_YIADDR + 4].copy_from_slice(&host.yiaddr);
    if with_host {
        out.extend_from_slice(&host.options[..host.len as usize]);
    }
    out.push(bootp::OPT_END);
    if out.len() < bootp::MIN_REPLY {
        out.resize(bootp::MIN_REPLY, 0);
    }
    out
}

/// Interns bodies: equal bodies get one index.
#[derive(Default)]
struct Interner {
    bodies: Vec<ReplyBody>,
    index: HashMap<ReplyBody, u32>,
}

impl Interner {
    fn intern(&mut self, body: ReplyBody) -> u32 {
        *self.index.entry(body).or_insert_with(|| {
            self.bodies.push(body);
            (self.bodies.len() - 1) as u32
        })
    }
}

/// One class's reply, cut: the body, and the host's own options.
struct Cut {
    body: ReplyBody,
    own: Vec<u8>,
    yiaddr: [u8; 4],
}

/// Hosts one compiling thread takes at least: fewer are not worth a thread.
const HOSTS_PER_THREAD: usize = 4096;

/// What a reload compiles beside: the inventory in force and what was
/// compiled from it for the same server. A host that is the same in both
/// inventories, under the same subnets, profiles and settings, keeps its
/// record: it would compile to the same bytes.
#[derive(Clone, Copy)]
pub struct Reuse<'a> {
    pub inv: &'a Inventory,
    pub compiled: &'a Compiled,
}

impl<'a> Reuse<'a> {
    /// The record `host` (at `at` in `inv.hosts`) had, if nothing that goes
    /// into its replies changed. A reload mostly keeps hosts where they
    /// were, so the same position is looked at before the index, and the
    /// record after the last one found before a search (`hint`).
    fn record(
        &self,
        inv: &Inventory,
        at: usize,
        host: &Host,
        hint: &mut usize,
    ) -> Option<RecordRef<'a>> {
        let before = match self.inv.hosts.get(at) {
            Some(same) if same.mac == host.mac => same,
            _ => self.inv.host_by_mac(host.mac)?,
        };
        if before != host
            || self.inv.provisioned.contains(&host.mac) != inv.provisioned.contains(&host.mac)
        {
            return None;
        }
        self.compiled
            .hosts
            .find_near(&MacKey::new(host.mac.0), hint)
    }
}

/// Compiles all hosts; reports every host whose reply does not fit.
pub fn compile(inv: &Inventory, server: &Server) -> Result<Compiled, Vec<Problem>> {
    compile_reusing(inv, server, None)
}

/// [`compile`], keeping the records of hosts `reuse` says are unchanged, so
/// that a reload costs what changed, not what the inventory holds.
///
/// Large inventories are compiled on every core, in slices of hosts whose
/// bodies are then merged, so that the time to be ready follows the hosts
/// divided by the cores.
pub fn compile_reusing(
    inv: &Inventory,
    server: &Server,
    reuse: Option<Reuse>,
) -> Result<Compiled, Vec<Problem>> {
    let reuse = reuse.filter(|r| r.inv.same_replies_context(inv));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_thread = inv.hosts.len().div_ceil(threads).max(HOSTS_PER_THREAD);
    let slices: Vec<Slice> = if inv.hosts.len() <= per_thread {
        vec![compile_slice(inv, (0, &inv.hosts), server, reuse)]
    } else {
        std::thread::scope(|scope| {
            let running: Vec<_> = inv
                .hosts
                .chunks(per_thread)
                .enumerate()
                .map(|(n, hosts)| {
                    let first = n * per_thread;
                    scope.spawn(move || compile_slice(inv, (first, hosts), server, reuse))
                })
                .collect();
            running
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        })
    };
    let mut interner = Interner::default();
    // Collected, then sorted into the table in one go.
    let mut hosts = Records::default();
    let mut problems = Vec::new();
    for mut slice in slices {
        let slots: Vec<u32> = slice
            .bodies
            .into_iter()
            .map(|body| interner.intern(body))
            .collect();
        for bodies in slice.hosts.bodies_mut() {
            for b in bodies {
                if *b != NO_BODY {
                    *b = slots[(*b & !BODY_WHOLE) as usize] | (*b & BODY_WHOLE);
                }
            }
        }
        hosts.append(slice.hosts);
        problems.extend(slice.problems);
    }
    if problems.is_empty() {
        Ok(Compiled {
            hosts: hosts.into(),
            bodies: interner.bodies,
        })
    } else {
        Err(problems)
    }
}

/// What one thread compiled: records whose slots index its own bodies.
struct Slice {
    hosts: Records,
    bodies: Vec<ReplyBody>,
    problems: Vec<Problem>,
}

/// Compiles `hosts`, the slice of `inv.hosts` that starts at `first`.
fn compile_slice(
    inv: &Inventory,
    (first, hosts): (usize, &[Arc<Host>]),
    server: &Server,
    reuse: Option<Reuse>,
) -> Slice {
    let mut interner = Interner::default();
    let mut out = Records::with_capacity(hosts.len());
    let mut problems = Vec::new();
    // The previous compile's body indices, as this slice's.
    let mut reused: HashMap<u32, u32> = HashMap::new();
    let mut hint = 0;
    // Every port gets the same record: nothing in a reply depends on the
    // port (`{mac}` is the host's primary MAC), and the XDP program fills
    // in the request's own chaddr.
    let push = |out: &mut Records, host: &Host, record: RecordRef<'_>| {
        for mac in host.ports() {
            out.push(MacKey::new(mac.0), record);
        }
    };
    for (at, host) in (first..).zip(hosts) {
        let kept = reuse.and_then(|r| Some((r, r.record(inv, at, host, &mut hint)?)));
        match kept {
            Some((r, mut record)) => {
                for b in &mut record.bodies {
                    if *b != NO_BODY {
                        let i = *b & !BODY_WHOLE;
                        let local = *reused
                            .entry(i)
                            .or_insert_with(|| interner.intern(r.compiled.bodies[i as usize]));
                        *b = local | (*b & BODY_WHOLE);
                    }
                }
                push(&mut out, host, record);
            }
            None => match compile_host(inv, host, server, &mut interner) {
                Ok(Some(record)) => push(&mut out, host, RecordRef::of(&record)),
                Ok(None) => {}
                Err(problem) => problems.push(problem),
            },
        }
    }
    Slice {
        hosts: out,
        bodies: interner.bodies,
        problems,
    }
}

/// The record of one host, or `None` when the kernel answers none of its
/// classes (or it has no IPv4 address).
fn compile_host(
    inv: &Inventory,
    host: &Host,
    server: &Server,
    interner: &mut Interner,
) -> Result<Option<HostRecord>, Problem> {
    let Some(subnet) = inv.subnet_of(host) else {
        return Ok(None);
    };
    let mut record = HostRecord::zeroed();
    let mut own: Option<Vec<u8>> = None;
    let mut any = false;
    for class in BootClass::ALL {
        let Some(offer) = class_reply(inv, host, class, ReplyKind::Offer, server) else {
            continue;
        };
        let cut = cut(&offer, server, subnet).map_err(|message| {
            Problem::new(
                Some(host.label()),
                "options",
                format!("{class:?} reply: {message}"),
            )
        })?;
        if any && cut.yiaddr != record.yiaddr {
            return Err(Problem::new(
                Some(host.label()),
                "ip",
                format!("{class:?} reply names another address than the host's other classes"),
            ));
        }
        record.yiaddr = cut.yiaddr;
        any = true;
        // The first class's own options are the record's; a class whose own
        // options differ, or that has more than the record holds, gets a
        // body of its own that holds them.
        let shared = cut.own.len() <= bootp::HOST_BYTES
            && own.get_or_insert_with(|| cut.own.clone()) == &cut.own;
        record.bodies[class as usize] = if shared {
            interner.intern(cut.body)
        } else {
            interner.intern(whole(cut)) | BODY_WHOLE
        };
    }
    let own = own.unwrap_or_default();
    if own.len() <= bootp::HOST_BYTES {
        record.len = own.len() as u16;
        record.options[..own.len()].copy_from_slice(&own);
        record.sum = sum16(&own);
    }
    Ok(any.then_some(record))
}

/// A body that holds the host's own options too.
fn whole(cut: Cut) -> ReplyBody {
    let mut body = cut.body;
    let at = body.len as usize;
    body.payload[at..at + cut.own.len()].copy_from_slice(&cut.own);
    body.len += cut.own.len() as u16;
    let mut ack = body.payload[..body.len as usize].to_vec();
    body.csum_offer = sum16(&ack);
    ack[body.msg_type_off as usize] = bootp::DHCPACK;
    body.csum_ack = sum16(&ack);
    body
}

/// The reply the fast path gives every request of `class` from `host`, or
/// `None` when it passes them: `decide`'s answer to the class's request,
/// as far as [`fast_path`] lets the kernel give it.
pub fn class_reply(
    inv: &Inventory,
    host: &Host,
    class: BootClass,
    kind: ReplyKind,
    server: &Server,
) -> Option<Reply> {
    let ack_for = (kind == ReplyKind::Ack).then_some(host.ipv4()?);
    match fast_path(&Request::of_class(host.mac, class, ack_for), inv, server) {
        Decision::Reply(reply) => Some(reply),
        Decision::Pass(_) | Decision::Drop(_) => None,
    }
}

/// Cuts an OFFER where the host's own options begin.
fn cut(offer: &Reply, server: &Server, subnet: &crate::inventory::Subnet) -> Result<Cut, String> {
    let skeleton = Request::template_skeleton();
    let (bytes, own) = encode_split(offer, &skeleton).map_err(|e| e.to_string())?;
    // The end option and padding follow the host's options: the kernel
    // writes those itself.
    if bytes.get(own.end) != Some(&bootp::OPT_END) || bytes[own.end + 1..].iter().any(|b| *b != 0) {
        return Err("the encoder wrote options after the host's own".to_string());
    }
    if own.end + 1 > bootp::MAX_REPLY {
        return Err(format!(
            "{} bytes, more than the {} a DHCP reply may have",
            own.end + 1,
            bootp::MAX_REPLY
        ));
    }
    let msg_type_off = find_option(&bytes, bootp::OPT_MESSAGE_TYPE)
        .filter(|off| *off < own.start)
        .ok_or_else(|| "the message type is not before the host's own options".to_string())?;
    let mut body = ReplyBody::zeroed();
    body.server_ip = server.ip.octets();
    body.server_mac = server.mac;
    body.proxy = u8::from(offer.is_proxy());
    body.subnet = subnet.network.octets();
    body.netmask = subnet.netmask().octets();
    body.len = own.start as u16;
    body.msg_type_off = msg_type_off as u16;
    let mut head = bytes[..own.start].to_vec();
    head[bootp::OFF_YIADDR..bootp::OFF_YIADDR + 4].fill(0);
    body.payload[..head.len()].copy_from_slice(&head);
    body.csum_offer = sum16(&head);
    head[msg_type_off] = bootp::DHCPACK;
    body.csum_ack = sum16(&head);
    Ok(Cut {
        body,
        own: bytes[own].to_vec(),
        yiaddr: offer.yiaddr.octets(),
    })
}

/// Offset of the value of option `code` in a BOOTP message.
pub fn find_option(msg: &[u8], code: u8) -> Option<usize> {
    let mut off = bootp::OFF_OPTIONS;
    while off < msg.len() {
        match msg[off] {
            bootp::OPT_PAD => off += 1,
            bootp::OPT_END => return None,
            c => {
                let len = *msg.get(off + 1)? as usize;
                if c == code {
                    return Some(off + 2);
                }
                off += 2 + len;
            }
        }
    }
    None
}

/// One's-complement sum of big-endian 16-bit words, folded (RFC 1071).
pub fn sum16(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, path::Path};

    use super::*;
    use crate::dhcp::{ReplyKind, encode};

    const SERVER: Server = Server {
        ip: Ipv4Addr::new(10, 66, 0, 1),
        mac: [2, 0, 0, 0, 0, 1],
    };
    const MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];

    fn inventory(extra_options: &str) -> Inventory {
        let yaml = format!(
            r#"
subnets:
  - {{cidr: 10.66.0.0/16, router: 10.66.0.1, dns: [10.66.0.1], domain: lab.example}}
profiles:
  - name: worker
    boot: {{bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{{server}}:8080/ipxe.efi"}}
hosts:
  - {{mac: "52:54:00:00:00:01", ip: 10.66.1.10, hostname: node-1, profile: worker, options: {extra_options}}}
"#
        );
        Inventory::parse(Path::new("t.yaml"), &yaml).expect("valid inventory")
    }

    fn classes(c: &Compiled, mac: [u8; 6]) -> Vec<u8> {
        let host = c.hosts.get(&MacKey::new(mac)).expect("compiled");
        BootClass::ALL
            .into_iter()
            .filter(|class| host.body(*class).is_some())
            .map(|class| class as u8)
            .collect()
    }

    /// The UDP payload sum the XDP program computes from the parts (see
    /// `pxe-ebpf/src/reply.rs`), before the request's fields are added.
    fn kernel_sum(body: &ReplyBody, host: &HostRecord, with_host: bool, ack: bool) -> u16 {
        let mut sum = u32::from(if ack { body.csum_ack } else { body.csum_offer });
        let host_len = if with_host { host.len as usize } else { 0 };
        if host_len != 0 {
            sum += u32::from(if body.len.is_multiple_of(2) {
                host.sum
            } else {
                host.sum.swap_bytes()
            });
        }
        let end = body.len as usize + host_len;
        sum += if end.is_multiple_of(2) {
            0xff00
        } else {
            0x00ff
        };
        sum += u32::from(u16::from_be_bytes([host.yiaddr[0], host.yiaddr[1]]));
        sum += u32::from(u16::from_be_bytes([host.yiaddr[2], host.yiaddr[3]]));
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    /// Every class of every port: the kernel's assembly is the encoder's
    /// reply, byte for byte, and its checksum arithmetic the reply's sum.
    fn assert_assembles_to_the_encoders(inv: &Inventory, c: &Compiled) {
        for host in &inv.hosts {
            for mac in host.ports() {
                let Some(record) = c.hosts.get(&MacKey::new(mac.0)) else {
                    continue;
                };
                for class in BootClass::ALL {
                    let Some((body, with_host)) = c.body(&record, class) else {
                        continue;
                    };
                    let offer = class_reply(inv, host, class, ReplyKind::Offer, &SERVER)
                        .expect("a class the record answers is answered");
                    let want = encode(&offer, &Request::template_skeleton()).expect("encodes");
                    let got = assemble(body, &record, with_host);
                    assert_eq!(got, want, "{} {class:?}", host.label());
                    assert_eq!(kernel_sum(body, &record, with_host, false), sum16(&want));
                    let mut ack = got;
                    ack[body.msg_type_off as usize] = bootp::DHCPACK;
                    assert_eq!(kernel_sum(body, &record, with_host, true), sum16(&ack));
                }
            }
        }
    }

    #[test]
    fn subnet_and_profile_options_are_in_the_shared_body_and_a_hosts_own_replace_them() {
        let yaml = r#"
subnets:
  - {cidr: 10.66.0.0/16, router: 10.66.0.1, options: {42: 10.66.0.4, 224: subnet}}
profiles:
  - {name: worker, boot: {bios: undionly.kpxe}, options: {225: profile}}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.11, profile: worker}
  - {mac: "52:54:00:00:00:03", ip: 10.66.1.12, profile: worker, options: {42: 10.66.0.9}}
"#;
        let inv = Inventory::parse(Path::new("t.yaml"), yaml).expect("valid inventory");
        let c = compile(&inv, &SERVER).expect("compiles");
        assert_assembles_to_the_encoders(&inv, &c);
        let record = |last: u8| {
            c.hosts
                .get(&MacKey::new([0x52, 0x54, 0, 0, 0, last]))
                .expect("compiled")
        };
        let (one, two) = (record(1), record(2));
        // Nothing of their own: one body, the shared options in it.
        assert_eq!(one.len, 0);
        assert_eq!(one.body(BootClass::Bios), two.body(BootClass::Bios));
        let (body, _) = c.body(&one, BootClass::Bios).expect("answered");
        let bytes = &body.payload[..body.len as usize];
        let at = find_option(bytes, 42).expect("option 42 in the body");
        assert_eq!(bytes[at..at + 4], [10, 66, 0, 4]);
        assert!(find_option(bytes, 224).is_some() && find_option(bytes, 225).is_some());
        // The third host's 42 is its own, and the only one it gets.
        let three = record(3);
        let reply = c
            .reply([0x52, 0x54, 0, 0, 0, 3], BootClass::Bios)
            .expect("answered");
        let at = find_option(&reply, 42).expect("option 42");
        assert_eq!(reply[at..at + 4], [10, 66, 0, 9]);
        assert_eq!(three.options[..three.len as usize], [42, 4, 10, 66, 0, 9]);
        let (body, _) = c.body(&three, BootClass::Bios).expect("answered");
        assert_eq!(find_option(&body.payload[..body.len as usize], 42), None);
    }

    #[test]
    fn assembled_replies_are_the_encoders_offers_with_request_fields_zero() {
        let inv = inventory("{42: 10.66.0.1}");
        let c = compile(&inv, &SERVER).expect("compiles");
        // Plain, BIOS, UEFI x64, HTTP; no arm64 file, so no arm64 answer.
        assert_eq!(classes(&c, MAC), vec![0, 1, 2, 4]);
        assert_assembles_to_the_encoders(&inv, &c);
        let record = c.hosts.get(&MacKey::new(MAC)).expect("compiled");
        assert_eq!(record.yiaddr, [10, 66, 1, 10]);
        for class in [BootClass::Plain, BootClass::Bios] {
            let (body, with_host) = c.body(&record, class).expect("answered");
            assert!(with_host);
            assert_eq!(body.payload[body.msg_type_off as usize], bootp::DHCPOFFER);
            assert_eq!(
                (body.subnet, body.netmask),
                ([10, 66, 0, 0], [255, 255, 0, 0])
            );
            assert_eq!(
                (body.server_ip, body.server_mac),
                (SERVER.ip.octets(), SERVER.mac)
            );
            let bytes = &body.payload[..body.len as usize];
            // The per-request fields the XDP program fills, and yiaddr, are zero.
            assert!(
                bytes[bootp::OFF_XID..bootp::OFF_SIADDR]
                    .iter()
                    .all(|b| *b == 0)
            );
            assert!(
                bytes[bootp::OFF_GIADDR..bootp::OFF_SNAME]
                    .iter()
                    .all(|b| *b == 0)
            );
            // The host's name and option are its record's, not the body's.
            assert!(find_option(bytes, 12).is_none() && find_option(bytes, 42).is_none());
        }
        let own = &record.options[..record.len as usize];
        assert_eq!(
            own,
            &[
                12, 6, b'n', b'o', b'd', b'e', b'-', b'1', 42, 4, 10, 66, 0, 1
            ]
        );
    }

    #[test]
    fn own_options_that_fill_the_record_stay_in_it() {
        // node-1 (8 bytes) and a root path of 118 (120 bytes): exactly
        // HOST_BYTES, so the record has no room for the end option and the
        // kernel writes it after the record's options.
        let inv = inventory(&format!("{{17: \"/{}\"}}", "r".repeat(117)));
        let c = compile(&inv, &SERVER).expect("compiles");
        let record = c.hosts.get(&MacKey::new(MAC)).expect("compiled");
        assert_eq!(usize::from(record.len), bootp::HOST_BYTES);
        assert!(
            BootClass::ALL
                .iter()
                .filter_map(|class| c.body(&record, *class))
                .all(|(_, with_host)| with_host)
        );
        assert_assembles_to_the_encoders(&inv, &c);
    }

    #[test]
    fn hosts_of_one_profile_share_one_body_per_class() {
        let mut yaml = String::from(
            "subnets:\n  - {cidr: 10.66.0.0/16, router: 10.66.0.1}\nprofiles:\n  - name: worker\n    \
             boot: {bios: undionly.kpxe, uefi: ipxe.efi, uefi_arm64: arm.efi, http: \"http://{server}/ipxe.efi\"}\nhosts:\n",
        );
        for i in 1..=200u32 {
            yaml.push_str(&format!(
                "  - {{mac: \"02:00:00:00:{:02x}:{:02x}\", ip: 10.66.{}.{}, hostname: node-{i}, profile: worker, options: {{224: \"rack-{}\"}}}}\n",
                i >> 8, i & 0xff, (i >> 8) + 1, i & 0xff, i % 7
            ));
        }
        let inv = Inventory::parse(Path::new("t.yaml"), &yaml).expect("valid");
        let c = compile(&inv, &SERVER).expect("compiles");
        assert_eq!(c.hosts.len(), 200);
        // Plain, BIOS, UEFI x64, UEFI arm64, HTTP: five bodies for all.
        assert_eq!(c.bodies.len(), 5);
        assert_eq!(c.replies(), 1000);
        assert_assembles_to_the_encoders(&inv, &c);
    }

    #[test]
    fn compiling_on_several_threads_gives_what_one_thread_gives() {
        let mut yaml = String::from(
            "subnets:\n  - {cidr: 10.0.0.0/8}\nprofiles:\n  - name: a\n    boot: {bios: a.kpxe}\n  - name: b\n    \
             boot: {bios: b.kpxe, uefi: b.efi}\nhosts:\n",
        );
        let hosts = 2 * HOSTS_PER_THREAD as u32 + 100;
        for i in 1..=hosts {
            let [_, x, y, z] = i.to_be_bytes();
            let profile = if i % 3 == 0 { "a" } else { "b" };
            yaml.push_str(&format!(
                "  - {{mac: \"02:00:00:{x:02x}:{y:02x}:{z:02x}\", ip: 10.{x}.{y}.{z}, hostname: n{i}, profile: {profile}}}\n"
            ));
        }
        let inv = Inventory::parse(Path::new("t.yaml"), &yaml).expect("valid");
        let c = compile(&inv, &SERVER).expect("compiles");
        let one = compile_slice(&inv, (0, &inv.hosts), &SERVER, None);
        assert!(one.problems.is_empty());
        let one = Compiled {
            hosts: one.hosts.into(),
            bodies: one.bodies,
        };
        assert_eq!(c.hosts.len(), hosts as usize);
        // Plain and BIOS of a, plain, BIOS and UEFI of b; plain is shared.
        assert_eq!(c.bodies.len(), one.bodies.len());
        assert_eq!(c.bodies.len(), 4);
        for key in one.hosts.keys() {
            for class in BootClass::ALL {
                assert_eq!(c.reply(key.mac, class), one.reply(key.mac, class));
            }
        }
    }

    /// Every reply of every port of `inv`, as the kernel assembles it.
    fn all_replies(inv: &Inventory, c: &Compiled) -> Vec<Option<Vec<u8>>> {
        inv.hosts
            .iter()
            .flat_map(|h| h.ports().iter())
            .flat_map(|mac| BootClass::ALL.map(|class| c.reply(mac.0, class)))
            .collect()
    }

    #[test]
    fn a_reload_beside_the_inventory_in_force_compiles_to_what_a_fresh_compile_gives() {
        let base = |router: &str, node2: &str| {
            let yaml = format!(
                "subnets:\n  - {{cidr: 10.66.0.0/16, router: {router}}}\nprofiles:\n  - name: w\n    \
                 boot: {{bios: a.kpxe, uefi: b.efi}}\nhosts:\n\
                 - {{mac: \"02:00:00:00:00:01\", ip: 10.66.1.1, hostname: n1, profile: w}}\n\
                 - {{mac: \"02:00:00:00:00:02\", ip: 10.66.1.2, hostname: {node2}, profile: w}}\n\
                 - {{mac: \"02:00:00:00:00:03\", ip: 10.66.1.3, profile: w, options: {{224: x}}}}\n"
            );
            Inventory::parse(Path::new("t.yaml"), &yaml).expect("valid")
        };
        let before = base("10.66.0.1", "n2");
        let compiled = compile(&before, &SERVER).expect("compiles");
        let reuse = Reuse {
            inv: &before,
            compiled: &compiled,
        };
        // One host renamed; then the subnet's router changed, which every
        // host's reply holds.
        for after in [base("10.66.0.1", "renamed"), base("10.66.0.254", "n2")] {
            let fresh = compile(&after, &SERVER).expect("compiles");
            let beside = compile_reusing(&after, &SERVER, Some(reuse)).expect("compiles");
            assert_eq!(all_replies(&after, &beside), all_replies(&after, &fresh));
            assert_eq!(beside.bodies.len(), fresh.bodies.len());
        }
        // A host provisioned meanwhile is compiled anew.
        let mut after = base("10.66.0.1", "n2");
        after.provisioned.insert(after.hosts[0].mac);
        let fresh = compile(&after, &SERVER).expect("compiles");
        let beside = compile_reusing(&after, &SERVER, Some(reuse)).expect("compiles");
        assert_eq!(all_replies(&after, &beside), all_replies(&after, &fresh));
    }

    #[test]
    fn host_options_too_large_for_the_record_go_into_bodies_of_their_own() {
        let big = format!("{{224: \"{}\"}}", "x".repeat(200));
        let inv = inventory(&big);
        let c = compile(&inv, &SERVER).expect("compiles");
        let record = c.hosts.get(&MacKey::new(MAC)).expect("compiled");
        assert_eq!(record.len, 0);
        for class in [BootClass::Plain, BootClass::Bios] {
            assert!(!c.body(&record, class).expect("answered").1);
        }
        assert_assembles_to_the_encoders(&inv, &c);
    }

    #[test]
    fn patching_the_message_type_gives_the_encoders_ack() {
        let inv = inventory("{}");
        let c = compile(&inv, &SERVER).expect("compiles");
        let record = c.hosts.get(&MacKey::new(MAC)).expect("compiled");
        let (body, with_host) = c.body(&record, BootClass::Bios).expect("bios");
        let ack = class_reply(
            &inv,
            &inv.hosts[0],
            BootClass::Bios,
            ReplyKind::Ack,
            &SERVER,
        )
        .expect("reply");
        let mut patched = assemble(body, &record, with_host);
        patched[body.msg_type_off as usize] = bootp::DHCPACK;
        assert_eq!(
            patched,
            encode(&ack, &Request::template_skeleton()).expect("encodes")
        );
    }

    #[test]
    fn extra_options_are_compiled_in() {
        let inv = inventory("{42: 10.66.0.1, 66: tftp.lab.example}");
        let c = compile(&inv, &SERVER).expect("compiles");
        let payload = c.reply(MAC, BootClass::Plain).expect("plain");
        let ntp = find_option(&payload, 42).expect("option 42");
        assert_eq!(&payload[ntp - 1..ntp + 4], &[4, 10, 66, 0, 1]);
        let name = find_option(&payload, 66).expect("option 66");
        assert_eq!(&payload[name..name + 16], b"tftp.lab.example");
    }

    #[test]
    fn reply_too_large_is_refused_naming_the_host() {
        let big = format!(
            "{{224: \"{}\", 225: \"{}\"}}",
            "x".repeat(200),
            "y".repeat(200)
        );
        let Err(problems) = compile(&inventory(&big), &SERVER) else {
            panic!("a reply too large compiled")
        };
        assert!(!problems.is_empty());
        let text = problems[0].to_string();
        assert!(
            text.contains("node-1") && text.contains("options") && text.contains("544"),
            "{text}"
        );
    }

    #[test]
    fn short_replies_are_padded_to_the_bootp_minimum() {
        let inv = inventory("{}");
        let c = compile(&inv, &SERVER).expect("compiles");
        for class in BootClass::ALL {
            if let Some(reply) = c.reply(MAC, class) {
                assert!(reply.len() >= bootp::MIN_REPLY);
            }
        }
    }

    #[test]
    fn sum16_folds_carries_and_pads_odd_lengths() {
        assert_eq!(sum16(&[0xff, 0xff, 0x00, 0x01]), 0x0001);
        assert_eq!(sum16(&[0x12]), 0x1200);
    }

    const RULES: &str = r#"
subnets:
  - {cidr: 10.66.0.0/16}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}/ipxe.efi"}
    rules:
      - match: {labels: {rack: r1}}
        boot: {bios: rack1.kpxe}
        options: {66: tftp-r1}
      - match: {arch: [7]}
        boot: {uefi: seven.efi}
      - match: {vendor_class: "HTTPClient:Arch:00019"}
        boot: {http: "http://{server}/arm.efi"}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker, labels: {rack: r1}}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.11, profile: worker, labels: {rack: r2}}
"#;

    #[test]
    fn label_rules_are_compiled_and_request_dependent_ones_leave_the_class_to_the_slow_path() {
        let inv = Inventory::parse(Path::new("t.yaml"), RULES).expect("valid");
        let c = compile(&inv, &SERVER).expect("compiles");
        assert_assembles_to_the_encoders(&inv, &c);
        let file = |mac: u8, class: BootClass| {
            c.reply([0x52, 0x54, 0, 0, 0, mac], class).map(|t| {
                let f = &t[bootp::OFF_FILE..bootp::OFF_FILE + 128];
                String::from_utf8_lossy(&f[..f.iter().position(|b| *b == 0).unwrap_or(128)])
                    .into_owned()
            })
        };
        // Labels are known ahead of time: compiled per host.
        assert_eq!(file(1, BootClass::Bios).as_deref(), Some("rack1.kpxe"));
        assert_eq!(file(2, BootClass::Bios).as_deref(), Some("undionly.kpxe"));
        let opt66 = |mac: u8| {
            let t = c
                .reply([0x52, 0x54, 0, 0, 0, mac], BootClass::Plain)
                .expect("plain");
            find_option(&t, 66).is_some()
        };
        assert!(opt66(1) && !opt66(2));
        // arch [7] splits the UEFI x64 class (7 and 9): only a request can tell.
        assert_eq!(file(1, BootClass::UefiX64), None);
        // A vendor-class rule that may apply to HTTP boot: that class too.
        assert_eq!(file(1, BootClass::Http), None);
        assert!(c.reply(MAC, BootClass::Plain).is_some());
    }

    #[test]
    fn a_proxy_subnet_compiles_proxy_offers_for_pxe_classes_only() {
        let yaml = r#"
subnets:
  - {cidr: 10.66.0.0/16, mode: proxy}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}:8080/ipxe.efi"}
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
"#;
        let inv = Inventory::parse(Path::new("t.yaml"), yaml).expect("valid");
        let c = compile(&inv, &SERVER).expect("compiles");
        // BIOS and UEFI x64 PXE; no plain client or HTTP boot is answered.
        assert_eq!(classes(&c, MAC), vec![1, 2]);
        assert_assembles_to_the_encoders(&inv, &c);
        let record = c.hosts.get(&MacKey::new(MAC)).expect("compiled");
        assert_eq!(record.yiaddr, [0; 4]);
        for class in [BootClass::Bios, BootClass::UefiX64] {
            let (body, _) = c.body(&record, class).expect("answered");
            assert_eq!(body.proxy, 1);
            let payload = c.reply(MAC, class).expect("answered");
            let vendor = find_option(&payload, 60).expect("option 60");
            assert_eq!(&payload[vendor..vendor + 9], b"PXEClient");
            assert!(find_option(&payload, 51).is_none());
        }
        let server_mode = compile(&inventory("{}"), &SERVER).expect("compiles");
        assert!(server_mode.bodies.iter().all(|b| b.proxy == 0));
    }

    #[test]
    fn a_provisioned_host_recompiles_to_address_only_replies_and_only_its_own_change() {
        let mut inv = inventory("{}");
        inv.profiles[0].netboot = crate::inventory::Netboot::Once;
        let armed = compile(&inv, &SERVER).expect("compiles");
        inv.provisioned.insert(inv.hosts[0].mac);
        let done = compile(&inv, &SERVER).expect("compiles");
        assert_eq!(classes(&armed, MAC), classes(&done, MAC));
        assert_assembles_to_the_encoders(&inv, &done);
        let plain = done.reply(MAC, BootClass::Plain).expect("plain");
        for class in BootClass::ALL {
            let Some(payload) = done.reply(MAC, class) else {
                continue;
            };
            assert!(
                payload[bootp::OFF_FILE..bootp::OFF_FILE + 128]
                    .iter()
                    .all(|b| *b == 0)
            );
            assert_eq!(&payload[bootp::OFF_SIADDR..bootp::OFF_SIADDR + 4], &[0; 4]);
            for code in [43, 60, 66, 67, 175] {
                assert!(
                    find_option(&payload, code).is_none(),
                    "{class:?} option {code}"
                );
            }
            assert_eq!(
                &payload[bootp::OFF_YIADDR..bootp::OFF_YIADDR + 4],
                &[10, 66, 1, 10]
            );
            assert!(find_option(&payload, 3).is_some() && find_option(&payload, 12).is_some());
            // Every class gets the plain address-only reply.
            assert_eq!(payload, plain);
        }
    }
}
