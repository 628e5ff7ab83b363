//! DHCPv4 policy and wire encoding, shared by the slow path and the XDP
//! templates.
//!
//! `decide` is the one place where DHCP policy lives; `encode` turns its
//! reply into bytes with dhcproto; `template` compiles the same replies into
//! the fast path's map values. This module never touches sockets or maps.

pub mod decide;
pub mod encode;
pub mod host_table;
pub mod request;
pub mod template;

pub use decide::{
    Answer, Decision, PoolAsk, Pools, Reply, ReplyKind, Server, decide, decide_shared, fast_path,
    nak, pool_reply,
};
pub use encode::encode;
pub use request::Request;
pub mod server;
