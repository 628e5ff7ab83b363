//! DHCPv4 policy and wire encoding, shared by the slow path and the XDP
//! templates.
//!
//! `decide` is the one place where DHCP policy lives; `reply` is the reply
//! model and assembles a reply from the parts `decide` picks; `encode`
//! turns a reply into bytes with dhcproto; `template` compiles the same replies into
//! the fast path's map values. This module never touches sockets or maps.

pub mod decide;
pub mod encode;
pub mod host_table;
pub mod reply;
pub mod request;
pub mod template;

pub use decide::{Answer, Decision, PoolAsk, Pools, decide, decide_shared, fast_path, pool_reply};
pub use encode::encode;
pub use reply::{Reply, ReplyKind, Server, nak};
pub use request::Request;
pub mod server;
