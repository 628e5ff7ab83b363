//! The bytes a transfer sends, block by block: the file as is (`octet`) or
//! translated to netascii (RFC 1350 section 1 and RFC 764: LF becomes CR LF,
//! a bare CR becomes CR NUL). It reads sequentially and holds at most one
//! block of raw input, so memory stays bounded whatever the file size; the
//! transfer keeps the unacknowledged window. Blocking; callers run it off
//! the async runtime.

use std::io::{self, Read};

/// Transfer modes (RFC 1350 section 1); `mail` is not supported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Octet,
    Netascii,
}

impl Mode {
    /// Modes are case-insensitive.
    pub fn from_wire(mode: &[u8]) -> Option<Mode> {
        if mode.eq_ignore_ascii_case(b"octet") {
            Some(Mode::Octet)
        } else if mode.eq_ignore_ascii_case(b"netascii") {
            Some(Mode::Netascii)
        } else {
            None
        }
    }
}

/// Reads blocks from `R` in a mode.
#[derive(Debug)]
pub struct Source<R> {
    input: R,
    mode: Mode,
    /// Netascii: raw bytes read but not yet translated.
    raw: Vec<u8>,
    raw_pos: usize,
    /// Netascii: the second byte of a pair that did not fit the last block.
    carry: Option<u8>,
    eof: bool,
}

impl<R: Read> Source<R> {
    pub fn new(input: R, mode: Mode) -> Self {
        Source {
            input,
            mode,
            raw: Vec::new(),
            raw_pos: 0,
            carry: None,
            eof: false,
        }
    }

    /// Appends the next block of up to `size` bytes to `out`. Fewer than
    /// `size` bytes (possibly none) means the end of the file.
    pub fn read_block(&mut self, out: &mut Vec<u8>, size: usize) -> io::Result<()> {
        match self.mode {
            Mode::Octet => self.read_octet(out, size),
            Mode::Netascii => self.read_netascii(out, size),
        }
    }

    fn read_octet(&mut self, out: &mut Vec<u8>, size: usize) -> io::Result<()> {
        if !self.eof {
            let n = read_full(&mut self.input, out, size)?;
            self.eof = n < size;
        }
        Ok(())
    }

    fn read_netascii(&mut self, out: &mut Vec<u8>, size: usize) -> io::Result<()> {
        let end = out.len() + size;
        while out.len() < end {
            if let Some(b) = self.carry.take() {
                out.push(b);
                continue;
            }
            if self.raw_pos == self.raw.len() && !self.refill(size)? {
                break;
            }
            let b = self.raw[self.raw_pos];
            self.raw_pos += 1;
            let (first, second) = match b {
                b'\n' => (b'\r', Some(b'\n')),
                b'\r' => (b'\r', Some(0)),
                b => (b, None),
            };
            out.push(first);
            self.carry = second;
        }
        Ok(())
    }

    /// Reads more raw input; false at the end of the file.
    fn refill(&mut self, size: usize) -> io::Result<bool> {
        self.raw.clear();
        self.raw_pos = 0;
        if self.eof {
            return Ok(false);
        }
        let size = size.max(1);
        let n = read_full(&mut self.input, &mut self.raw, size)?;
        self.eof = n < size;
        Ok(n > 0)
    }
}

/// Appends up to `size` bytes from `input` to `out`, fewer only at the end
/// of the input; returns how many. On error `out` is left as it was.
fn read_full(input: &mut impl Read, out: &mut Vec<u8>, size: usize) -> io::Result<usize> {
    let start = out.len();
    out.resize(start + size, 0);
    let mut filled = 0;
    while filled < size {
        match input.read(&mut out[start + filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                out.truncate(start);
                return Err(e);
            }
        }
    }
    out.truncate(start + filled);
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(input: &[u8], mode: Mode, size: usize) -> Vec<Vec<u8>> {
        let mut src = Source::new(input, mode);
        let mut out = Vec::new();
        loop {
            let mut block = Vec::new();
            src.read_block(&mut block, size).expect("read");
            let last = block.len() < size;
            out.push(block);
            if last {
                return out;
            }
        }
    }

    #[test]
    fn octet_blocks_end_with_a_short_or_empty_block() {
        assert_eq!(blocks(b"", Mode::Octet, 4), [b""]);
        assert_eq!(blocks(b"abcd", Mode::Octet, 4), [&b"abcd"[..], b""]);
        assert_eq!(blocks(b"abcdef", Mode::Octet, 4), [&b"abcd"[..], b"ef"]);
    }

    #[test]
    fn netascii_translates_line_ends_across_block_boundaries() {
        let got: Vec<u8> = blocks(b"ab\ncd\re\n", Mode::Netascii, 3).concat();
        assert_eq!(got, b"ab\r\ncd\r\0e\r\n");
        // CR LF in the file is sent as CR NUL CR LF, which clients turn
        // back into CR LF.
        let got = blocks(b"\r\n", Mode::Netascii, 1);
        assert_eq!(got, [b"\r", b"\0", b"\r", b"\n", &b""[..]]);
    }

    #[test]
    fn netascii_of_a_full_last_block_sends_an_empty_one() {
        assert_eq!(blocks(b"a\n", Mode::Netascii, 3), [&b"a\r\n"[..], b""]);
    }

    #[test]
    fn modes_are_case_insensitive() {
        assert_eq!(Mode::from_wire(b"OCTET"), Some(Mode::Octet));
        assert_eq!(Mode::from_wire(b"NetAscii"), Some(Mode::Netascii));
        assert_eq!(Mode::from_wire(b"mail"), None);
        assert_eq!(Mode::from_wire(b"binary"), None);
    }

    /// A reader that returns one byte per call, as a slow pipe would.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Some((&b, rest)) = self.0.split_first() else {
                return Ok(0);
            };
            if buf.is_empty() {
                return Ok(0);
            }
            buf[0] = b;
            self.0 = rest;
            Ok(1)
        }
    }

    #[test]
    fn short_reads_still_fill_whole_blocks() {
        let mut src = Source::new(Trickle(b"abcdefg"), Mode::Octet);
        let mut block = Vec::new();
        src.read_block(&mut block, 4).expect("read");
        assert_eq!(block, b"abcd");
        block.clear();
        src.read_block(&mut block, 4).expect("read");
        assert_eq!(block, b"efg");
    }
}
