//! The heap the agent keeps for each inventory host, counted by this test
//! binary's own allocator: it must stay small and the same from a small
//! inventory to a large one (a fleet's memory follows its hosts).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    path::Path,
    sync::atomic::{AtomicUsize, Ordering},
};

use pxe_agent::{inventory::Inventory, progress::Progress};

/// Counts the bytes in use and their peak; allocates with [`System`].
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// A fleet as large sites write it: one profile with every boot class, a
/// host name and one extra option per host, in a /8.
fn fleet(hosts: usize) -> String {
    let mut out = String::from(
        "subnets:\n  - cidr: 10.0.0.0/8\n    router: 10.0.0.1\n    dns: [10.0.0.1]\n    \
         domain: fleet.example\n\
         profiles:\n  - name: worker\n    boot:\n      bios: undionly.kpxe\n      \
         uefi: ipxe.efi\n      uefi_arm64: ipxe-arm64.efi\n      \
         http: \"http://{server}:8080/ipxe.efi\"\n\
         hosts:\n",
    );
    for n in 0..hosts {
        let [_, a, b, c] = u32::try_from(n).expect("small fleet").to_be_bytes();
        let [_, x, y, z] = u32::try_from(n + 256).expect("small fleet").to_be_bytes();
        out.push_str(&format!(
            "  - mac: \"02:00:00:{a:02x}:{b:02x}:{c:02x}\"\n    ip: 10.{x}.{y}.{z}\n    \
             hostname: node-{n}\n    profile: worker\n    options: {{224: \"node-{n}-tag\"}}\n"
        ));
    }
    out
}

/// What loading `hosts` hosts leaves on the heap, per host: the inventory
/// (hosts and indexes), and the progress tracker's share of them.
fn kept_per_host(hosts: usize) -> (usize, usize) {
    let text = fleet(hosts);
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let inventory = Inventory::parse(Path::new("fleet.yaml"), &text).expect("valid fleet");
    assert_eq!(inventory.hosts.len(), hosts);
    let kept = LIVE.load(Ordering::Relaxed) - base;
    let peak = PEAK.load(Ordering::Relaxed) - base;
    let progress = Progress::default();
    let before = LIVE.load(Ordering::Relaxed);
    progress.set_hosts(&inventory.hosts);
    let tracked = LIVE.load(Ordering::Relaxed) - before;
    eprintln!(
        "{hosts} hosts: parse peak {} B, inventory {} B, progress {} B a host",
        peak / hosts,
        kept / hosts,
        tracked / hosts
    );
    (kept / hosts, tracked / hosts)
}

// One test in this binary, so that nothing else allocates while it counts.
#[test]
fn inventory_heap_per_host_is_small_and_flat_from_1000_to_20000_hosts() {
    let (small, small_progress) = kept_per_host(1_000);
    let (large, large_progress) = kept_per_host(20_000);
    // A host is some 184 bytes (its name and a short option inline), the
    // reference counts that let reloads share it 16, its place in the list
    // 8 and the two indexes 20: about 228. A map per host, an inline BMC
    // block or an index rounded up to a power of two each break the bound.
    for (hosts, bytes) in [(1_000, small), (20_000, large)] {
        assert!(bytes <= 240, "{hosts} hosts keep {bytes} B a host");
    }
    assert!(
        small.abs_diff(large) <= 8,
        "per-host heap grows with the fleet: {small} B at 1,000 hosts, {large} B at 20,000"
    );
    assert!(
        small_progress <= 32 && large_progress <= 32,
        "progress keeps {small_progress} / {large_progress} B a host before any boot"
    );
}
