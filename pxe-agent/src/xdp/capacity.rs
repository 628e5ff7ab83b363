//! How many host entries and body slots the fast path's maps hold: sized
//! from the inventory when the program is loaded (or set by
//! `--map-capacity`), and the one check every inventory meets before it is
//! put in force, at start, at reload and in `pxe-agent check`.

use pxe_ebpf_common::{DEFAULT_BODIES, DEFAULT_HOSTS};

use crate::dhcp::template::Compiled;
use crate::inventory::Problem;

/// The most host entries (host ports) one agent's map may be given: a
/// hash map's buckets are allocated for its capacity, 16 bytes each.
pub const MAX_HOSTS: u32 = 4 << 20;
/// The most body slots: each is a whole reply's room, allocated up front.
pub const MAX_BODIES: u32 = 1 << 18;

/// The sizes of the hosts map and the bodies array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub hosts: u32,
    pub bodies: u32,
}

impl Default for Capacity {
    /// What the object declares; for tests and the lab helpers.
    fn default() -> Capacity {
        Capacity {
            hosts: DEFAULT_HOSTS,
            bodies: DEFAULT_BODIES,
        }
    }
}

impl Capacity {
    /// The largest the maps may be, for `check` without `--map-capacity`.
    pub const LARGEST: Capacity = Capacity {
        hosts: MAX_HOSTS,
        bodies: MAX_BODIES,
    };

    /// Room for `compiled` (each of the interfaces' sets) and as much again
    /// for reloads; `hosts` from `--map-capacity` when given. Bodies get
    /// twice their number so that a reload that changes every body finds
    /// free slots beside the ones in use.
    pub fn for_inventory<'a>(
        compiled: impl IntoIterator<Item = &'a Compiled>,
        hosts: Option<u32>,
    ) -> Capacity {
        let (mut ports, mut bodies) = (0usize, 0usize);
        for c in compiled {
            ports = ports.max(c.hosts.len());
            bodies = bodies.max(c.bodies.len());
        }
        let doubled = |n: usize, min: u32, max: u32| {
            u32::try_from(n.saturating_mul(2))
                .unwrap_or(u32::MAX)
                .clamp(min, max)
        };
        Capacity {
            hosts: hosts.unwrap_or_else(|| doubled(ports, DEFAULT_HOSTS, MAX_HOSTS)),
            bodies: doubled(bodies, DEFAULT_BODIES, MAX_BODIES),
        }
    }

    /// Refuses `compiled` when it needs more than the maps hold, naming the
    /// limit and what to do; `hosts` is the inventory's host count, for the
    /// message.
    pub fn fits(&self, compiled: &Compiled, hosts: usize) -> Result<(), Problem> {
        let ports = compiled.hosts.len();
        if ports > self.hosts as usize {
            return Err(Problem::new(
                None,
                "hosts",
                format!(
                    "{hosts} hosts have {ports} ports (MACs) to answer, but the fast path's \
                     hosts map holds {}; start the agent with a larger --map-capacity (at most \
                     {MAX_HOSTS}), or split the inventory between agents",
                    self.hosts
                ),
            ));
        }
        // A reload may need its new bodies beside the old ones; what must
        // fit in any case is the inventory's own.
        let bodies = compiled.bodies.len();
        if bodies > self.bodies as usize {
            return Err(Problem::new(
                None,
                "profiles",
                format!(
                    "the replies of {hosts} hosts have {bodies} distinct shared parts, but the \
                     fast path holds {}; replies differ per host where boot files or options \
                     name the host (such as `{{mac}}` in a boot file name): restart the agent \
                     to size the map anew, or share boot files between hosts",
                    self.bodies
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    use pxe_ebpf_common::{HostRecord, MacKey, ReplyBody};

    use super::*;

    fn compiled(ports: u32, bodies: usize) -> Compiled {
        Compiled {
            hosts: (0..ports)
                .map(|i| {
                    let [_, a, b, c] = i.to_be_bytes();
                    (MacKey::new([2, 0, 0, a, b, c]), HostRecord::zeroed())
                })
                .collect(),
            bodies: vec![ReplyBody::zeroed(); bodies],
        }
    }

    #[test]
    fn sized_to_twice_the_inventory_within_bounds() {
        let small = Capacity::for_inventory([&compiled(10, 3)], None);
        assert_eq!(small, Capacity::default());
        let big = Capacity::for_inventory([&compiled(200_000, 2_000)], None);
        assert_eq!((big.hosts, big.bodies), (400_000, 4_000));
        let flag = Capacity::for_inventory([&compiled(100_000, 5)], Some(150_000));
        assert_eq!(flag.hosts, 150_000);
    }

    #[test]
    fn an_inventory_past_the_hosts_map_is_refused_naming_the_limit_and_the_flag() {
        let cap = Capacity {
            hosts: 4096,
            bodies: 1024,
        };
        assert!(cap.fits(&compiled(4096, 5), 4000).is_ok());
        let problem = cap
            .fits(&compiled(4097, 5), 4001)
            .expect_err("one port too many");
        assert_eq!(problem.field, "hosts");
        for expect in ["4001 hosts have 4097 ports", "holds 4096", "--map-capacity"] {
            assert!(
                problem.message.contains(expect),
                "{expect:?} missing: {problem}"
            );
        }
        let problem = cap.fits(&compiled(10, 1025), 10).expect_err("bodies");
        assert!(problem.message.contains("1025 distinct"), "{problem}");
    }
}
