//! Files made per client instead of read from the root: a provider the
//! server asks first, by the requesting address and the sanitized name
//! (such as a host's rendered grub.cfg). What a provider serves is its own
//! affair; the server only sends the bytes.

use std::{fmt, net::IpAddr, path::Path};

/// Makes the file `name` (sanitized, relative to the root) for the client
/// at `peer`, or `None` to let the root serve the name as usual. Called on
/// the transfer's thread, so it may block briefly.
pub trait Generated: Send + Sync {
    fn file(&self, peer: IpAddr, name: &Path) -> Option<Vec<u8>>;
}

impl fmt::Debug for dyn Generated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Generated")
    }
}
