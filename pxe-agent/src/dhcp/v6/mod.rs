//! DHCPv6 wire formats (RFC 8415): what a client message carries and the
//! relays it came through (`request`), who is asking (`identity`: DUIDs,
//! EUI-64 addresses, system UUIDs), and the reply model with its encoding,
//! relay wrapping included (`reply`). The policy that decides what to
//! answer (`decide`) and the serve loop that owns the sockets (`server`)
//! are built on these.

pub mod identity;
pub mod reply;
pub mod request;

pub use identity::{
    Duid, eui64_link_local, mac_from_eui64, parse_uuid, swap_uuid_fields, uuid_text,
};
pub use reply::{
    EncodeError6, IaNaReply, Lifetimes, Reply6, Status, StatusCode6, encode_domain_name, encode6,
    try_encode6,
};
pub use request::{HOP_COUNT_LIMIT, IaNa, ParseError6, RelayHop, Request6, VendorClass6};
