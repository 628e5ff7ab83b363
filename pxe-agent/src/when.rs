//! Times for the command-line tables: how long ago a step happened, or
//! how long until a lease expires, instead of raw unix time. And durations
//! as people write them (`30s`, `10m`, `1h30m`, `250ms`): the one grammar
//! of the inventory's and the command line's durations ([`parse_duration`],
//! [`DurationArg`]).

use std::{fmt, str::FromStr, time::Duration};

/// `at_ms` (unix milliseconds) as an age relative to `now_ms`: "now",
/// "850ms ago", "42s ago", "7m ago", "3h ago", "2d ago".
pub fn ago(at_ms: u64, now_ms: u64) -> String {
    let ms = now_ms.saturating_sub(at_ms);
    if ms == 0 {
        return "now".into();
    }
    format!("{} ago", span(ms))
}

/// `at` (unix seconds) as the time left from `now`: "in 9m", or
/// "expired" once it has passed.
pub fn until(at: u64, now: u64) -> String {
    match at.checked_sub(now) {
        Some(s) if s > 0 => format!("in {}", span(s * 1000)),
        _ => "expired".into(),
    }
}

/// `at_ms` (unix milliseconds) as a UTC time of day, "14:03:27.412Z":
/// trace lines are read as they scroll by, so the date is left out.
pub fn clock(at_ms: u64) -> String {
    let ms_of_day = at_ms % 86_400_000;
    let (h, m) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
    let (s, ms) = (ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{h:02}:{m:02}:{s:02}.{ms:03}Z")
}

/// A duration in milliseconds in its largest whole unit.
fn span(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    UNITS
        .iter()
        .find(|(size, _)| ms >= *size)
        .map_or(format!("{ms}ms"), |(size, unit)| {
            format!("{}{unit}", ms / size)
        })
}

/// Units of a written duration, largest first, in microseconds.
const DURATION_UNITS: [(&str, u64); 5] = [
    ("h", 3_600_000_000),
    ("m", 60_000_000),
    ("s", 1_000_000),
    ("ms", 1000),
    ("us", 1),
];

/// Parses `30s`, `10m`, `1h`, `1h30m`, `250ms`, `50us`, `0s`: whole
/// numbers, each with a unit (`us`, `ms`, `s`, `m`, `h`), largest first.
/// Bounds are the caller's.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let malformed = || {
        format!("{text:?} is not a duration (expected a number with a unit: 30s, 10m, 1h, 1h30m)")
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(malformed());
    }
    let mut total: u64 = 0;
    let mut last_unit = u64::MAX;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(malformed());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| malformed())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_us = DURATION_UNITS
            .iter()
            .find(|(name, _)| *name == &rest[..unit_len])
            .map(|(_, us)| *us)
            .ok_or_else(malformed)?;
        if unit_us >= last_unit {
            return Err(malformed());
        }
        last_unit = unit_us;
        rest = &rest[unit_len..];
        total = number
            .checked_mul(unit_us)
            .and_then(|us| total.checked_add(us))
            .ok_or_else(malformed)?;
    }
    Ok(Duration::from_micros(total))
}

/// `d` as [`parse_duration`] reads it, in the fewest parts: `250ms`,
/// `1h30m`, `0s`.
pub fn duration_text(d: Duration) -> String {
    let mut us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    if us == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (name, size) in DURATION_UNITS {
        if us >= size {
            out.push_str(&format!("{}{name}", us / size));
            us %= size;
        }
    }
    out
}

/// A duration flag of the command line, written as [`parse_duration`]
/// reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationArg(pub Duration);

impl FromStr for DurationArg {
    type Err = String;
    fn from_str(s: &str) -> Result<DurationArg, String> {
        parse_duration(s).map(DurationArg)
    }
}

impl fmt::Display for DurationArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&duration_text(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_largest_first_and_read_back() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("30s"), Ok(ms(30_000)));
        assert_eq!(parse_duration("10m"), Ok(ms(600_000)));
        assert_eq!(parse_duration("1h30m"), Ok(ms(5_400_000)));
        assert_eq!(parse_duration("250ms"), Ok(ms(250)));
        assert_eq!(parse_duration("1s500ms"), Ok(ms(1500)));
        assert_eq!(parse_duration("50us"), Ok(Duration::from_micros(50)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in [
            "", "10", "m", "10x", "1m1h", "1s1s", "-1s", "1.5m", "10 m", "1d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("9999999999999h").is_err());
        for text in ["250ms", "1h30m", "0s", "50us", "2m5s", "30s"] {
            assert_eq!(duration_text(parse_duration(text).expect(text)), text);
        }
        assert_eq!("10m".parse::<DurationArg>(), Ok(DurationArg(ms(600_000))));
    }

    #[test]
    fn ages_take_their_largest_whole_unit() {
        let now = 1_000_000_000;
        assert_eq!(ago(now, now), "now");
        assert_eq!(ago(now - 850, now), "850ms ago");
        assert_eq!(ago(now - 42_999, now), "42s ago");
        assert_eq!(ago(now - 7 * 60_000, now), "7m ago");
        assert_eq!(ago(now - 3 * 3_600_000, now), "3h ago");
        assert_eq!(ago(now - 2 * 86_400_000, now), "2d ago");
        // A clock that stepped back is not a future age.
        assert_eq!(ago(now + 5, now), "now");
    }

    #[test]
    fn clock_is_the_utc_time_of_day() {
        // 2024-01-02T14:03:27.412Z
        assert_eq!(clock(1_704_204_207_412), "14:03:27.412Z");
        assert_eq!(clock(0), "00:00:00.000Z");
    }

    #[test]
    fn expiry_counts_down_then_says_so() {
        assert_eq!(until(1_600, 1_000), "in 10m");
        assert_eq!(until(1_000, 1_000), "expired");
        assert_eq!(until(900, 1_000), "expired");
    }
}
