//! One's-complement sums for the IPv4 header and UDP checksums (RFC 1071).

/// Adds a big-endian 16-bit word.
#[inline(always)]
pub fn add16(sum: u32, word: u16) -> u32 {
    sum + word as u32
}

/// Adds four bytes as two big-endian words.
#[inline(always)]
pub fn add4(sum: u32, b: [u8; 4]) -> u32 {
    sum + u16::from_be_bytes([b[0], b[1]]) as u32 + u16::from_be_bytes([b[2], b[3]]) as u32
}

/// Folds the carries and complements; a zero UDP checksum is sent as 0xffff
/// (RFC 768).
#[inline(always)]
pub fn finish(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    let c = !(sum as u16);
    if c == 0 { 0xffff } else { c }
}
