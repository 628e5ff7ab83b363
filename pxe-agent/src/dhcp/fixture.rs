//! What the policy's and the fast path's unit tests share: an inventory
//! in mode server and one in mode proxy, the server that answers them, the
//! requests built from a DISCOVER, and a fast-path decision reduced to a
//! table row.

use std::{net::Ipv4Addr, path::Path};

use dhcproto::v4::MessageType;
use pxe_ebpf_common::{Counter, VendorClass};

use super::{
    Request,
    fast_path::Decision,
    reply::{ReplyKind, Server},
};
use crate::{inventory::Inventory, mac::MacAddr};

const INV: &str = r#"
subnets:
  - cidr: 10.66.0.0/16
    router: 10.66.0.1
    lease_time: 600
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}/ipxe.efi"}
  - name: bare
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.11, profile: bare}
"#;
pub(super) const SERVER: Server = Server {
    ip: Ipv4Addr::new(10, 66, 0, 1),
    mac: [2, 0, 0, 0, 0, 1],
};
pub(super) const WORKER: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
pub(super) const BARE: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 2]);
pub(super) const RESERVED: Ipv4Addr = Ipv4Addr::new(10, 66, 1, 10);

pub(super) fn inv() -> Inventory {
    Inventory::parse(Path::new("t.yaml"), INV).expect("valid")
}

pub(super) fn discover(mac: MacAddr) -> Request {
    Request {
        chaddr: mac,
        ..Request::template_skeleton()
    }
}

pub(super) fn pxe(mut r: Request, arch: u16) -> Request {
    r.arch = Some(arch);
    r.vendor = VendorClass::PxeClient;
    r
}

pub(super) fn request(mut r: Request) -> Request {
    r.msg_type = Some(MessageType::Request);
    r
}

/// What a decision amounts to, for table rows.
#[derive(Debug, PartialEq)]
pub(super) enum Want {
    Offer(Option<String>),
    Ack,
    Pass(Counter),
    Drop,
}

pub(super) fn summarize(d: Decision) -> Want {
    match d {
        Decision::Reply(r) if r.kind == ReplyKind::Ack => Want::Ack,
        Decision::Reply(r) => Want::Offer(r.file),
        Decision::Pass(c) => Want::Pass(c),
        Decision::Drop(_) => Want::Drop,
    }
}

const PROXY_INV: &str = r#"
subnets:
  - {cidr: 10.66.0.0/16, mode: proxy, router: 10.66.0.254, dns: [10.66.0.254]}
profiles:
  - name: worker
    boot: {bios: undionly.kpxe, uefi: ipxe.efi, http: "http://{server}/ipxe.efi"}
  - name: bare
hosts:
  - {mac: "52:54:00:00:00:01", ip: 10.66.1.10, profile: worker}
  - {mac: "52:54:00:00:00:02", ip: 10.66.1.11, profile: bare}
"#;

pub(super) fn proxy_inv() -> Inventory {
    Inventory::parse(Path::new("t.yaml"), PROXY_INV).expect("valid")
}
