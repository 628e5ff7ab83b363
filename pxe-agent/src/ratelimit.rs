//! Storm guard for the slow path: a token bucket per client MAC, and one
//! shared by all MACs not in the inventory, so a flood of unknown or iPXE
//! requests neither starves known hosts nor grows memory without bound;
//! and [`TokenBucket`], one bucket on the monotonic clock, for what the
//! agent writes to the Kubernetes API (statuses, shared host records).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use crate::mac::MacAddr;

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate: u32, now: Instant) -> TokenBucket {
        let rate = f64::from(rate.max(1));
        TokenBucket {
            rate,
            burst: rate,
            tokens: rate,
            last: now,
        }
    }

    /// Takes a token if one is there.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long until the next token.
    pub fn wait(&self) -> Duration {
        Duration::from_secs_f64(((1.0 - self.tokens) / self.rate).max(0.0))
    }
}

/// Tokens per second and burst size of one bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub per_sec: f64,
    pub burst: f64,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    /// Seconds (monotonic, caller's clock) of the last refill.
    at: f64,
}

impl Bucket {
    fn full(rate: Rate, now: f64) -> Bucket {
        Bucket {
            tokens: rate.burst,
            at: now,
        }
    }

    fn take(&mut self, rate: Rate, now: f64) -> bool {
        self.tokens = (self.tokens + (now - self.at).max(0.0) * rate.per_sec).min(rate.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limited {
    /// This MAC sent faster than its own rate.
    Mac,
    /// Unknown MACs together sent faster than their shared rate.
    Unknown,
    /// The table of MACs is full of recently active ones.
    Table,
}

pub struct Limiter {
    per_mac: Rate,
    unknown: Rate,
    unknown_bucket: Bucket,
    buckets: HashMap<MacAddr, Bucket>,
    capacity: usize,
}

impl Limiter {
    /// `capacity` bounds the MACs tracked (and so the memory).
    pub fn new(per_mac: Rate, unknown: Rate, capacity: usize) -> Limiter {
        Limiter {
            per_mac,
            unknown,
            unknown_bucket: Bucket::full(unknown, 0.0),
            buckets: HashMap::new(),
            capacity,
        }
    }

    /// Takes a token for a request from `mac` at `now` (seconds). The MAC's
    /// own bucket is charged first: a request it refuses costs the shared
    /// unknown bucket nothing, so one unknown MAC sending far above its rate
    /// spends at most its own rate of the shared budget and cannot starve
    /// the other unknown machines. A request the shared bucket refuses gets
    /// its MAC's token back.
    pub fn admit(&mut self, mac: MacAddr, known: bool, now: f64) -> Result<(), Limited> {
        if !self.buckets.contains_key(&mac) && self.buckets.len() >= self.capacity {
            self.evict_idle(now);
            if self.buckets.len() >= self.capacity {
                return Err(Limited::Table);
            }
        }
        let rate = self.per_mac;
        let bucket = self
            .buckets
            .entry(mac)
            .or_insert_with(|| Bucket::full(rate, now));
        if !bucket.take(rate, now) {
            return Err(Limited::Mac);
        }
        if !known && !self.unknown_bucket.take(self.unknown, now) {
            bucket.tokens += 1.0;
            return Err(Limited::Unknown);
        }
        Ok(())
    }

    /// Forgets buckets that have refilled completely: they hold no state.
    fn evict_idle(&mut self, now: f64) {
        let rate = self.per_mac;
        let full_after = rate.burst / rate.per_sec;
        self.buckets.retain(|_, b| now - b.at < full_after);
    }

    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_rate() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(10, t0);
        let burst = (0..100).filter(|_| bucket.try_take(t0)).count();
        assert_eq!(burst, 10);
        // Over the next second, ten more: never more than the rate.
        let mut sent = 0;
        for ms in (10..=1000).step_by(10) {
            if bucket.try_take(t0 + Duration::from_millis(ms)) {
                sent += 1;
            }
        }
        assert!((9..=10).contains(&sent), "{sent}");
        assert!(!bucket.try_take(t0 + Duration::from_millis(1000)));
        assert!(bucket.wait() <= Duration::from_millis(100));
    }

    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);

    fn limiter(capacity: usize) -> Limiter {
        Limiter::new(
            Rate {
                per_sec: 2.0,
                burst: 4.0,
            },
            Rate {
                per_sec: 100.0,
                burst: 100.0,
            },
            capacity,
        )
    }

    #[test]
    fn burst_then_rate_per_mac() {
        let mut l = limiter(10);
        for _ in 0..4 {
            assert_eq!(l.admit(MAC, true, 0.0), Ok(()));
        }
        assert_eq!(l.admit(MAC, true, 0.0), Err(Limited::Mac));
        assert_eq!(l.admit(MAC, true, 0.5), Ok(()));
        assert_eq!(l.admit(MAC, true, 0.5), Err(Limited::Mac));
    }

    #[test]
    fn one_flooding_mac_does_not_limit_another() {
        let mut l = limiter(10);
        for _ in 0..100 {
            let _ = l.admit(MAC, false, 0.0);
        }
        assert_eq!(l.admit(MacAddr([2, 0, 0, 0, 0, 2]), true, 0.0), Ok(()));
    }

    #[test]
    fn unknown_macs_share_one_budget_known_ones_do_not() {
        let mut l = Limiter::new(
            Rate {
                per_sec: 10.0,
                burst: 10.0,
            },
            Rate {
                per_sec: 5.0,
                burst: 5.0,
            },
            1000,
        );
        let admitted = (0..50u8)
            .filter(|i| l.admit(MacAddr([2, 0, 0, 0, 1, *i]), false, 0.0).is_ok())
            .count();
        assert_eq!(admitted, 5);
        assert_eq!(l.admit(MAC, true, 0.0), Ok(()));
    }

    #[test]
    fn one_hot_unknown_mac_does_not_starve_other_unknown_macs() {
        // The agent's defaults: 10/s (burst 20) per MAC, 2,000/s for all
        // unknown MACs together; a shared budget below the hot MAC's rate
        // shows it is not the shared bucket that sheds the hot MAC.
        let mut l = Limiter::new(
            Rate {
                per_sec: 10.0,
                burst: 20.0,
            },
            Rate {
                per_sec: 200.0,
                burst: 200.0,
            },
            1000,
        );
        let hot = MacAddr([2, 0, 0, 0, 9, 9]);
        let others: Vec<MacAddr> = (0..50u8).map(|i| MacAddr([2, 0, 0, 0, 4, i])).collect();
        let (mut hot_admitted, mut refused) = (0, Vec::new());
        // Five seconds in steps of 0.5 ms: the hot MAC sends at each step
        // (2,000/s); every 10 ms the next of the others sends, so each sends
        // twice a second, as a firmware retrying its DISCOVER does.
        for step in 0..10_000u32 {
            let now = f64::from(step) * 0.0005;
            if l.admit(hot, false, now).is_ok() {
                hot_admitted += 1;
            }
            if step % 20 == 0 {
                let mac = others[(step / 20) as usize % others.len()];
                if let Err(why) = l.admit(mac, false, now) {
                    refused.push((now, mac, why));
                }
            }
        }
        assert!(
            refused.is_empty(),
            "other unknown MACs refused: {refused:?}"
        );
        // Its burst plus its rate over the five seconds, no more.
        assert!(
            hot_admitted <= 20 + 50 + 1,
            "hot MAC admitted {hot_admitted}"
        );
    }

    #[test]
    fn a_request_the_shared_bucket_refuses_keeps_its_mac_token() {
        let mut l = Limiter::new(
            Rate {
                per_sec: 1.0,
                burst: 1.0,
            },
            Rate {
                per_sec: 1.0,
                burst: 1.0,
            },
            10,
        );
        assert_eq!(l.admit(MacAddr([2, 0, 0, 0, 5, 1]), false, 0.0), Ok(()));
        let mac = MacAddr([2, 0, 0, 0, 5, 2]);
        assert_eq!(l.admit(mac, false, 0.0), Err(Limited::Unknown));
        // Known, it has the token the shared refusal did not spend.
        assert_eq!(l.admit(mac, true, 0.0), Ok(()));
    }

    #[test]
    fn table_is_bounded_and_idle_buckets_are_evicted() {
        let mut l = limiter(3);
        for i in 0..3u8 {
            assert!(l.admit(MacAddr([2, 0, 0, 0, 2, i]), true, 0.0).is_ok());
        }
        assert_eq!(
            l.admit(MacAddr([2, 0, 0, 0, 3, 0]), true, 0.1),
            Err(Limited::Table)
        );
        assert_eq!(l.tracked(), 3);
        // Refilled after burst / rate = 2 s: those buckets carry no state.
        assert!(l.admit(MacAddr([2, 0, 0, 0, 3, 0]), true, 5.0).is_ok());
        assert_eq!(l.tracked(), 1);
    }
}
