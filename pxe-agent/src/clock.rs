//! The only reader of the wall clock: now as a `SystemTime`, in unix
//! seconds and milliseconds, and read together with `CLOCK_MONOTONIC`
//! ([`Clocks`]). Also turns a `SystemTime` (a file's mtime, say) into unix
//! time. Not the monotonic `Instant`s that timers and rate limits use.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, as the wall clock reads it: for records that keep a `SystemTime`.
pub fn now() -> SystemTime {
    SystemTime::now()
}

/// Now, in unix milliseconds.
pub fn now_ms() -> u64 {
    unix_ms(now())
}

/// Now, in unix seconds.
pub fn now_secs() -> u64 {
    since_epoch(now()).as_secs()
}

/// `t` as time since the unix epoch; zero for a time before it.
pub fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// `t` in unix milliseconds: 0 before the epoch, `u64::MAX` past what fits.
pub fn unix_ms(t: SystemTime) -> u64 {
    u64::try_from(since_epoch(t).as_millis()).unwrap_or(u64::MAX)
}

/// The wall clock and `CLOCK_MONOTONIC` read together once, to turn
/// monotonic readings (what the XDP program stamps its events with) into
/// wall time: one reading serves a whole drain of the event ring.
#[derive(Clone, Copy, Debug)]
pub struct Clocks {
    wall_ms: u64,
    monotonic_ns: u64,
}

impl Clocks {
    pub fn now() -> Clocks {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; on failure it stays
        // zero, and every reading then maps to now.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        Clocks {
            wall_ms: now_ms(),
            monotonic_ns: u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000
                + u64::try_from(ts.tv_nsec).unwrap_or(0),
        }
    }

    pub fn monotonic_ns(&self) -> u64 {
        self.monotonic_ns
    }

    /// The unix-millisecond time of the monotonic reading `at_ns`.
    pub fn wall_ms_of(&self, at_ns: u64) -> u64 {
        self.wall_ms
            .saturating_sub(self.monotonic_ns.saturating_sub(at_ns) / 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_times_count_from_the_epoch_and_stop_at_zero_before_it() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(unix_ms(t), 1_700_000_000_123);
        assert_eq!(since_epoch(t).as_secs(), 1_700_000_000);
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!((unix_ms(before), since_epoch(before)), (0, Duration::ZERO));
    }

    #[test]
    fn now_agrees_in_seconds_and_milliseconds() {
        let (secs, ms) = (now_secs(), now_ms());
        // 2023-11-14 or later: the clock is read, not a constant.
        assert!(secs >= 1_700_000_000, "{secs}");
        assert!(ms / 1000 >= secs && ms / 1000 - secs <= 1, "{ms} {secs}");
    }

    #[test]
    fn a_monotonic_reading_maps_to_the_wall_time_it_was_taken_at() {
        let clocks = Clocks::now();
        let at = clocks.monotonic_ns() - 250_000_000;
        assert_eq!(clocks.wall_ms_of(at), clocks.wall_ms - 250);
        // A reading after the pair was taken maps to the pair's time.
        assert_eq!(clocks.wall_ms_of(clocks.monotonic_ns() + 5), clocks.wall_ms);
    }
}
