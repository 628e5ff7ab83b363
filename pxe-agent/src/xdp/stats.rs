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

    /// Totals over the programs of several interfaces.
    pub fn read_all<'a>(
        maps: impl IntoIterator<Item = &'a PerCpuArray<MapData, u64>>,
    ) -> Result<Stats, MapError> {
        let mut out = Stats::default();
        for map in maps {
            let one = Stats::read(map)?;
            for (total, n) in out.0.iter_mut().zip(one.0) {
                *total += n;
            }
        }
        Ok(out)
    }

    pub fn get(&self, c: Counter) -> u64 {
        self.0[c as usize]
    }
}
