//! DHCPv6 wire formats (RFC 8415): what a client message carries and the
//! relays it came through (`request`), who is asking (`identity`: DUIDs,
//! EUI-64 addresses, system UUIDs), and the reply model with its encoding,
//! relay wrapping included (`reply`). On them: the policy's DHCPv6
//! message flow (`decide`), the serve loop that owns the sockets
//! (`server`), and the router advertisements that tell clients to ask
//! (`advert`).

pub mod advert;
pub mod decide;
pub mod identity;
pub mod reply;
pub mod request;
pub mod server;

pub use decide::{
    Answer6, KnownBy, PoolAsk6, PoolKind6, Pools6, Server6, decide6, decide6_shared, pool_reply6,
};

pub use identity::{Duid, eui64_link_local, mac_from_eui64, swap_uuid_fields};
pub use reply::{
    EncodeError6, IaNaReply, Lifetimes, Reply6, Status, StatusCode6, encode_domain_name, encode6,
    try_encode6,
};
pub use request::{HOP_COUNT_LIMIT, IaNa, ParseError6, RelayHop, Request6, VendorClass6};
