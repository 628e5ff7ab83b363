//! Option negotiation for a read request: which of the client's options this
//! server accepts, with what values, and the OACK that says so (RFC 2347).
//! Pure; the transfer applies the result.
//!
//! Supported: `blksize` (RFC 2348), `tsize` and `timeout` (RFC 2349),
//! `windowsize` (RFC 7440). Unknown options and values out of range are left
//! out of the OACK, which RFC 2347 allows; if nothing is accepted no OACK is
//! sent and the transfer uses RFC 1350 defaults.

use std::time::Duration;

/// RFC 1350's fixed block size, used when `blksize` is not negotiated.
pub const DEFAULT_BLKSIZE: u16 = 512;
/// RFC 2348 section 2: valid block sizes.
pub const BLKSIZE_RANGE: std::ops::RangeInclusive<u16> = 8..=65464;
/// The largest window this server uses (RFC 7440 allows up to 65535); it
/// bounds per-transfer memory at `windowsize × blksize`.
pub const MAX_WINDOWSIZE: u16 = 64;
/// RFC 2349 section 2: valid timeouts, in seconds.
pub const TIMEOUT_RANGE: std::ops::RangeInclusive<u64> = 1..=255;

/// What the server allows, from its configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_blksize: u16,
    pub max_windowsize: u16,
    /// Retransmission timeout when the client does not choose one.
    pub timeout: Duration,
}

/// The parameters a transfer runs with, and the OACK that announces them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub blksize: u16,
    pub windowsize: u16,
    pub timeout: Duration,
    /// True when the client chose `timeout`: RFC 2349 makes it the
    /// retransmission interval, so the transfer does not back off from it.
    pub client_timeout: bool,
    /// Accepted options in the client's order, with the values sent back;
    /// empty means no OACK.
    pub oack: Vec<(&'static str, String)>,
}

/// Negotiates `options` (as parsed from the request) for a file of `size`
/// bytes. `size` is `None` when it is not known up front (netascii), in
/// which case `tsize` is not acknowledged. The first occurrence of an option
/// counts.
pub fn negotiate(options: &[(&[u8], &[u8])], limits: Limits, size: Option<u64>) -> Negotiated {
    let mut out = Negotiated {
        blksize: DEFAULT_BLKSIZE,
        windowsize: 1,
        timeout: limits.timeout,
        client_timeout: false,
        oack: Vec::new(),
    };
    let mut seen = Vec::with_capacity(4);
    for &(name, value) in options {
        let Some(known) = Known::from_name(name) else {
            continue;
        };
        if seen.contains(&known.name()) {
            continue;
        }
        seen.push(known.name());
        let Some(value) = number(value) else {
            continue;
        };
        let accepted = match known {
            // RFC 2348: a server may answer with a smaller block size.
            Known::Blksize if value >= u64::from(*BLKSIZE_RANGE.start()) => {
                let clamped = value
                    .min(u64::from(*BLKSIZE_RANGE.end()))
                    .min(u64::from(limits.max_blksize));
                out.blksize = u16::try_from(clamped).unwrap_or(DEFAULT_BLKSIZE);
                Some(out.blksize.to_string())
            }
            // RFC 7440 section 3: a server may answer with a smaller window.
            Known::Windowsize if (1..=65535).contains(&value) => {
                let clamped = value
                    .min(u64::from(limits.max_windowsize))
                    .min(u64::from(MAX_WINDOWSIZE));
                out.windowsize = u16::try_from(clamped).unwrap_or(1);
                Some(out.windowsize.to_string())
            }
            // RFC 2349 section 3: the server answers with the file's size
            // (a client reading sends 0, but any number asks the question).
            Known::Tsize => size.map(|size| size.to_string()),
            // RFC 2349 section 2: the value must be echoed unchanged.
            Known::Timeout if TIMEOUT_RANGE.contains(&value) => {
                out.timeout = Duration::from_secs(value);
                out.client_timeout = true;
                Some(value.to_string())
            }
            Known::Blksize | Known::Windowsize | Known::Timeout => None,
        };
        if let Some(accepted) = accepted {
            out.oack.push((known.name(), accepted));
        }
    }
    out
}

#[derive(Clone, Copy)]
enum Known {
    Blksize,
    Windowsize,
    Tsize,
    Timeout,
}

impl Known {
    /// Option names are case-insensitive (RFC 2347 section 2).
    fn from_name(name: &[u8]) -> Option<Known> {
        [
            Known::Blksize,
            Known::Windowsize,
            Known::Tsize,
            Known::Timeout,
        ]
        .into_iter()
        .find(|k| name.eq_ignore_ascii_case(k.name().as_bytes()))
    }

    fn name(self) -> &'static str {
        match self {
            Known::Blksize => "blksize",
            Known::Windowsize => "windowsize",
            Known::Tsize => "tsize",
            Known::Timeout => "timeout",
        }
    }
}

/// A decimal number of ASCII digits only.
fn number(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_blksize: 1468,
        max_windowsize: 16,
        timeout: Duration::from_secs(1),
    };

    fn opts<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<(&'a [u8], &'a [u8])> {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
            .collect()
    }

    fn oack(n: &Negotiated) -> Vec<(&str, &str)> {
        n.oack.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    #[test]
    fn no_options_means_rfc1350_defaults_and_no_oack() {
        let n = negotiate(&[], LIMITS, Some(10));
        assert_eq!((n.blksize, n.windowsize), (512, 1));
        assert_eq!(n.timeout, Duration::from_secs(1));
        assert!(!n.client_timeout);
        assert!(n.oack.is_empty());
    }

    #[test]
    fn blksize_is_clamped_to_the_configured_maximum() {
        let n = negotiate(&opts(&[("blksize", "65464")]), LIMITS, Some(0));
        assert_eq!(n.blksize, 1468);
        assert_eq!(oack(&n), [("blksize", "1468")]);
        let n = negotiate(&opts(&[("BLKSIZE", "1024")]), LIMITS, Some(0));
        assert_eq!(oack(&n), [("blksize", "1024")]);
        let n = negotiate(&opts(&[("blksize", "8")]), LIMITS, Some(0));
        assert_eq!(n.blksize, 8);
        let n = negotiate(&opts(&[("blksize", "99999999")]), LIMITS, Some(0));
        assert_eq!(n.blksize, 1468);
    }

    #[test]
    fn invalid_values_are_left_out_of_the_oack() {
        for (name, value) in [
            ("blksize", "7"),
            ("blksize", "0"),
            ("blksize", "-1"),
            ("blksize", "12a"),
            ("blksize", ""),
            ("windowsize", "0"),
            ("windowsize", "65536"),
            ("timeout", "0"),
            ("timeout", "256"),
            ("multicast", "1"),
        ] {
            let n = negotiate(&opts(&[(name, value)]), LIMITS, Some(1));
            assert!(n.oack.is_empty(), "{name}={value} accepted");
            assert_eq!((n.blksize, n.windowsize), (512, 1));
        }
    }

    #[test]
    fn tsize_reports_the_file_size_when_known() {
        let n = negotiate(&opts(&[("tsize", "0")]), LIMITS, Some(1_048_583));
        assert_eq!(oack(&n), [("tsize", "1048583")]);
        let n = negotiate(&opts(&[("tsize", "0")]), LIMITS, None);
        assert!(n.oack.is_empty());
    }

    #[test]
    fn windowsize_and_timeout_follow_the_client_within_limits() {
        let n = negotiate(
            &opts(&[
                ("windowsize", "8"),
                ("timeout", "3"),
                ("blksize", "1428"),
                ("tsize", "0"),
            ]),
            LIMITS,
            Some(5),
        );
        assert_eq!((n.blksize, n.windowsize), (1428, 8));
        assert_eq!(n.timeout, Duration::from_secs(3));
        assert!(n.client_timeout);
        assert_eq!(
            oack(&n),
            [
                ("windowsize", "8"),
                ("timeout", "3"),
                ("blksize", "1428"),
                ("tsize", "5")
            ]
        );
        let n = negotiate(&opts(&[("windowsize", "65535")]), LIMITS, Some(5));
        assert_eq!(oack(&n), [("windowsize", "16")]);
        let wide = Limits {
            max_windowsize: 1000,
            ..LIMITS
        };
        let n = negotiate(&opts(&[("windowsize", "65535")]), wide, Some(5));
        assert_eq!(n.windowsize, MAX_WINDOWSIZE);
    }

    #[test]
    fn the_first_occurrence_of_an_option_counts() {
        let n = negotiate(
            &opts(&[("blksize", "1024"), ("Blksize", "600")]),
            LIMITS,
            Some(5),
        );
        assert_eq!(oack(&n), [("blksize", "1024")]);
        assert_eq!(n.blksize, 1024);
        let n = negotiate(
            &opts(&[("blksize", "x"), ("blksize", "600")]),
            LIMITS,
            Some(5),
        );
        assert!(n.oack.is_empty());
    }
}
