//! A host's name, kept inside the host: owns its storage, not its rules
//! (`validate` checks names, at most [`MAX`] bytes).

use std::{fmt, ops::Deref};

/// Longest host name the inventory accepts (one DNS label, RFC 1035 2.3.4).
pub const MAX: usize = 63;

/// A host name of at most [`MAX`] bytes, stored inline: one allocation per
/// host, made while the parser's garbage is live, pins pages of memory
/// after the garbage is freed, and a fleet's names are short.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hostname {
    len: u8,
    bytes: [u8; MAX],
}

impl Hostname {
    /// `None` when `name` is longer than [`MAX`] bytes.
    pub fn new(name: &str) -> Option<Hostname> {
        let mut bytes = [0; MAX];
        bytes
            .get_mut(..name.len())?
            .copy_from_slice(name.as_bytes());
        Some(Hostname {
            len: name.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only whole `str`s are copied in, so the bytes are UTF-8.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl Deref for Hostname {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Hostname {
    /// Cuts names past [`MAX`] bytes at a character boundary: the loader
    /// refuses those before a host is made, so only tests get here.
    fn from(name: &str) -> Hostname {
        let mut end = name.len().min(MAX);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        Hostname::new(&name[..end]).unwrap_or_else(|| Hostname::new("").expect("empty fits"))
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq<str> for Hostname {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_up_to_a_label_are_kept_whole() {
        let name = "n".repeat(MAX);
        assert_eq!(Hostname::new(&name).expect("fits").as_str(), name);
        assert!(Hostname::new(&format!("{name}x")).is_none());
        assert_eq!(&*Hostname::from("node-1"), "node-1");
        assert_eq!(Hostname::from("é".repeat(40).as_str()).len(), 62);
    }
}
