//! A latency histogram with fixed buckets that any thread bumps without a
//! lock, read once a scrape as a [`HistogramSnapshot`] and written by
//! [`Exposition::histogram`](super::exposition::Exposition::histogram).

use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

/// Upper bounds of the buckets, in seconds: from half a millisecond (an
/// answer from memory) to a second (a lease commit waiting on a slow
/// disk). `+Inf` is implied.
pub const BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Upper bounds of the buckets of a wait, in seconds: from 10 ms (a turn
/// that came at once) to a minute (a boot storm's queue). `+Inf` is
/// implied.
pub const WAIT_BUCKETS: [f64; 11] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Observations counted per bucket (not cumulative here; the writer sums).
#[derive(Debug)]
pub struct Histogram {
    /// The buckets' upper bounds: [`BUCKETS`] or [`WAIT_BUCKETS`].
    bounds: &'static [f64; BUCKETS.len()],
    buckets: [AtomicU64; BUCKETS.len()],
    /// Sum of the observations, in nanoseconds.
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Default for Histogram {
    /// A latency histogram, over [`BUCKETS`].
    fn default() -> Histogram {
        Histogram::with_bounds(&BUCKETS)
    }
}

impl Histogram {
    /// A histogram over `bounds`.
    pub fn with_bounds(bounds: &'static [f64; BUCKETS.len()]) -> Histogram {
        Histogram {
            bounds,
            buckets: Default::default(),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|le| secs <= *le) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// The counts now, cumulative per bucket as the format has them.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = [0; BUCKETS.len()];
        let mut total = 0;
        for (out, b) in cumulative.iter_mut().zip(&self.buckets) {
            total += b.load(Relaxed);
            *out = total;
        }
        HistogramSnapshot {
            bounds: self.bounds,
            cumulative,
            sum_seconds: self.sum_ns.load(Relaxed) as f64 / 1e9,
            count: self.count.load(Relaxed),
        }
    }
}

/// A [`Histogram`] read for one scrape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// The buckets' upper bounds.
    pub bounds: &'static [f64; BUCKETS.len()],
    /// Observations at or below each of `bounds`.
    pub cumulative: [u64; BUCKETS.len()],
    pub sum_seconds: f64,
    /// Every observation (the `+Inf` bucket).
    pub count: u64,
}

impl Default for HistogramSnapshot {
    fn default() -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: &BUCKETS,
            cumulative: [0; BUCKETS.len()],
            sum_seconds: 0.0,
            count: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_the_snapshot_is_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(3));
        let s = h.snapshot();
        assert_eq!(s.cumulative, [1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3]);
        assert_eq!(s.count, 4);
        assert!((s.sum_seconds - 3.0313).abs() < 1e-9, "{}", s.sum_seconds);
    }
}
