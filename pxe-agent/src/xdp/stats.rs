//! Sums the per-CPU counters of the fast path.

use aya::maps::{MapData, MapError, PerCpuArray};
use pxe_ebpf_common::Counter;

/// Counter totals over all CPUs, indexed by `Counter`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats(pub [u64; Counter::Count as usize]);

impl Stats {
    pub fn read(map: &PerCpuArray<MapData, u64>) -> Result<Stats, MapError> {
        let mut out = Stats::default();
        for c in Counter::ALL {
            out.0[c as usize] = map.get(&(c as u32), 0)?.iter().sum();
        }
        Ok(out)
    }

    pub fn get(&self, c: Counter) -> u64 {
        self.0[c as usize]
    }
}
