//! The fast path from userspace: loading and attaching the XDP program,
//! writing the compiled inventory into its maps, reading its counters and the
//! verdicts of traced MACs, pinning it all in bpffs across restarts.

pub mod capacity;
pub mod events;
pub mod loader;
pub mod maps;
pub mod pin;
pub mod stats;
pub mod trace;

pub use capacity::Capacity;
pub use loader::{Adoption, AttachMode, FastPath, VethPeer, XdpError, sync_each};
pub use maps::{Installed, SyncError, SyncReport};
pub use stats::Stats;
pub use trace::TraceFilter;
