//! pxe-agent: compiles a host inventory into the XDP fast path's maps, keeps
//! them in step with the inventory file and exports the fast path's counters.

pub mod app;
pub mod dhcp;
pub mod inventory;
pub mod metrics;
pub mod netdev;
pub mod xdp;
