//! The fast path from userspace: loading and attaching the XDP program,
//! writing compiled templates into its map, reading its counters and the
//! verdicts of traced MACs.

pub mod events;
pub mod loader;
pub mod maps;
pub mod stats;
pub mod trace;

pub use loader::{AttachMode, FastPath, VethPeer, XdpError, sync_each};
pub use maps::SyncError;
pub use stats::Stats;
pub use trace::TraceFilter;
