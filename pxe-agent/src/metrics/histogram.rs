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

/// Observations counted per bucket (not cumulative here; the writer sums).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    /// Sum of the observations, in nanoseconds.
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|le| secs <= *le) {
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
            cumulative,
            sum_seconds: self.sum_ns.load(Relaxed) as f64 / 1e9,
            count: self.count.load(Relaxed),
        }
    }
}

/// A [`Histogram`] read for one scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// Observations at or below each of [`BUCKETS`].
    pub cumulative: [u64; BUCKETS.len()],
    pub sum_seconds: f64,
    /// Every observation (the `+Inf` bucket).
    pub count: u64,
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
