//! Storm guard for the slow path: a token bucket per client MAC, and one
//! shared by all MACs not in the inventory, so a flood of unknown or iPXE
//! requests neither starves known hosts nor grows memory without bound.

use std::collections::HashMap;

use crate::inventory::MacAddr;

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

    /// Takes a token for a request from `mac` at `now` (seconds).
    pub fn admit(&mut self, mac: MacAddr, known: bool, now: f64) -> Result<(), Limited> {
        if !known && !self.unknown_bucket.take(self.unknown, now) {
            return Err(Limited::Unknown);
        }
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
        if bucket.take(rate, now) {
            Ok(())
        } else {
            Err(Limited::Mac)
        }
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
