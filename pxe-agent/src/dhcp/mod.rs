//! DHCP policy, replies and wire encoding, shared by the slow path and the
//! XDP templates; DHCPv6 beside them (`v6`) under the same policy.
//!
//! `decide` is the one place where DHCP policy lives; `fast_path` projects
//! it onto the requests the XDP program can answer exactly; `reply` is the
//! reply model and assembles a reply from the parts `decide` picks;
//! `encode` turns a reply into bytes with dhcproto; `template` compiles the
//! fast path's replies into the host records (`host_table`) and bodies the
//! maps hold; `request` is the parsed request. `server` is the slow path's
//! serve loop and the only part that touches sockets; none of it touches
//! the BPF maps. `fixture` is what the unit tests of `decide` and
//! `fast_path` share. `v6` is DHCPv6: its wire formats, who is asking, its
//! message flow (which takes the boot answer from `decide`), its server and
//! the router advertisements that start it.

pub mod decide;
pub mod encode;
pub mod fast_path;
pub mod host_table;
pub mod reply;
pub mod request;
pub mod server;
pub mod template;
pub mod v6;

pub use decide::{Answer, PoolAsk, Pools, decide, decide_shared, pool_reply};
pub use encode::encode;
pub use fast_path::{Decision, fast_path};
pub use reply::{Reply, ReplyKind, Server, nak};
pub use request::Request;

#[cfg(test)]
mod fixture;
