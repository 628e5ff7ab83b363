//! A read request as the request loop hands it on (to a waiting queue, a
//! transfer's mailbox or a new transfer): owned, so it outlives its
//! datagram. Owns that form only; parsing is `packet`'s.

use super::source::Mode;

/// A read request that outlives its datagram.
#[derive(Debug)]
pub(super) struct ReadRequest {
    pub filename: Vec<u8>,
    /// `filename` as lossy UTF-8, for logs and events.
    pub file: String,
    pub mode: Mode,
    pub options: Vec<(Vec<u8>, Vec<u8>)>,
}

#[cfg(test)]
impl ReadRequest {
    /// An octet request for `name` without options.
    pub fn octet(name: &str) -> ReadRequest {
        ReadRequest {
            filename: name.as_bytes().to_vec(),
            file: name.to_string(),
            mode: Mode::Octet,
            options: Vec::new(),
        }
    }
}
