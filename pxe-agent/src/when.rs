//! Times for the command-line tables: how long ago a step happened, or
//! how long until a lease expires, instead of raw unix time.

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

#[cfg(test)]
mod tests {
    use super::*;

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
