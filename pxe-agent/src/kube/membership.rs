//! Membership of the agents sharing the pools, over coordination.k8s.io/v1
//! Leases in the agent's namespace: one Lease `pxe-agent-slot-<i>` per pool
//! slot, held by a node (holderIdentity = node name) and renewed every
//! third of its duration. Owns claiming a slot, renewing it, and reading
//! which slots are live into the [`State`]'s [`Share`]; the arithmetic of
//! slices and buckets is `share`'s, the DHCP policy `dhcp::decide`'s.
//!
//! The claim rule, in [`candidates`]: a slot whose Lease already names this
//! node first (a restart on the same node gets its slice and its lease
//! store's clients back), else the lowest slot with no Lease (created;
//! 409 means another agent won it), else the lowest one whose holder's
//! Lease ran out longer ago than the longest pool lease time (replaced at
//! its resourceVersion; 409 means another agent won it): every address the
//! departed agent leased from that slice has expired by then, so no two
//! clients ever hold one address. See docs/peers.md.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use tracing::{debug, error, info, warn};

use super::coordination::{HOST_LABEL, leases_api};
use crate::{clock, share::Share, shutdown::Shutdown, state::State};

/// The annotation on each slot Lease that says how many slots its holder
/// cuts the pools into: agents that disagree would cut overlapping slices.
pub const SLOTS_ANNOTATION: &str = "pxe-agent.io/pool-slots";

/// The Lease of slot `slot`.
pub fn lease_name(slot: u16) -> String {
    format!("pxe-agent-slot-{slot}")
}

/// The slot a Lease name stands for.
pub fn slot_of(name: &str) -> Option<u16> {
    let n = name.strip_prefix("pxe-agent-slot-")?;
    // No leading zeros or signs: one name per slot.
    if n.is_empty() || (n.len() > 1 && n.starts_with('0')) || !n.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    n.parse().ok()
}

/// What the membership reads of one slot's Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub slot: u16,
    pub holder: Option<String>,
    /// renewTime (else acquireTime), unix milliseconds; `None` when neither
    /// is set.
    pub renewed: Option<i64>,
    /// leaseDurationSeconds, in milliseconds.
    pub duration: i64,
    pub resource_version: Option<String>,
    /// The holder's `--pool-slots`, from [`SLOTS_ANNOTATION`].
    pub slots: Option<u16>,
}

impl Seen {
    pub fn from_lease(lease: &Lease) -> Option<Seen> {
        let slot = slot_of(lease.metadata.name.as_deref()?)?;
        let spec = lease.spec.as_ref();
        let time = |t: &Option<MicroTime>| t.as_ref().map(|t| t.0.as_millisecond());
        Some(Seen {
            slot,
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renewed: spec.and_then(|s| time(&s.renew_time).or_else(|| time(&s.acquire_time))),
            duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .map_or(0, |d| i64::from(d) * 1000),
            resource_version: lease.metadata.resource_version.clone(),
            slots: lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SLOTS_ANNOTATION))
                .and_then(|n| n.parse().ok()),
        })
    }

    /// Whether its holder is live at `now` (unix milliseconds): renewed
    /// within its duration.
    pub fn is_live(&self, now: i64) -> bool {
        self.holder.is_some() && self.renewed.is_some_and(|r| r + self.duration > now)
    }

    /// Whether another node may take the slot at `now`: its holder's Lease
    /// ran out more than `pool_lease` milliseconds ago, so every address that
    /// holder leased from the slice has expired too.
    pub fn is_reusable(&self, now: i64, pool_lease: i64) -> bool {
        match self.renewed {
            // Never renewed: nobody can have leased from it under this Lease.
            None => true,
            Some(r) => r.saturating_add(self.duration).saturating_add(pool_lease) <= now,
        }
    }
}

/// How to try to take a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The Lease already names this node: renew it.
    Own { slot: u16, resource_version: String },
    /// No Lease for the slot: create it.
    Create { slot: u16 },
    /// A Lease whose holder is gone for good: replace it at this version.
    Take { slot: u16, resource_version: String },
}

/// The claims to try, in order (see the module doc), at `now` (unix
/// milliseconds). `pool_lease` is the longest pool lease time in
/// milliseconds; `None` (an infinite lease) means no slot of another node
/// is ever reusable.
pub fn candidates(
    node: &str,
    slots: u16,
    seen: &[Seen],
    now: i64,
    pool_lease: Option<i64>,
) -> Vec<Claim> {
    let by_slot = |slot| seen.iter().find(|s| s.slot == slot);
    let mut out = Vec::new();
    for s in seen.iter().filter(|s| s.slot < slots) {
        if s.holder.as_deref() == Some(node)
            && let Some(rv) = &s.resource_version
        {
            out.push(Claim::Own {
                slot: s.slot,
                resource_version: rv.clone(),
            });
        }
    }
    for slot in 0..slots {
        match by_slot(slot) {
            None => out.push(Claim::Create { slot }),
            Some(s) if s.holder.as_deref() == Some(node) => {}
            Some(s) => {
                if let (Some(pool), Some(rv)) = (pool_lease, &s.resource_version)
                    && s.is_reusable(now, pool)
                {
                    out.push(Claim::Take {
                        slot,
                        resource_version: rv.clone(),
                    });
                }
            }
        }
    }
    out
}

/// The live slots among `seen` at `now`, this node's own left out (its
/// liveness is what it last renewed, not what it last read).
pub fn live_others(node: &str, slots: u16, seen: &[Seen], now: i64) -> BTreeSet<u16> {
    seen.iter()
        .filter(|s| s.slot < slots && s.holder.as_deref() != Some(node) && s.is_live(now))
        .map(|s| s.slot)
        .collect()
}

/// The live Leases of other nodes whose holders cut the pools into another
/// number of slots than `slots` (or hold a slot beyond it): while any is
/// live, slices may overlap, so no pool client may be answered.
pub fn disagreeing<'a>(node: &str, slots: u16, seen: &'a [Seen], now: i64) -> Vec<&'a Seen> {
    seen.iter()
        .filter(|s| s.holder.as_deref() != Some(node) && s.is_live(now))
        .filter(|s| s.slot >= slots || s.slots.is_some_and(|n| n != slots))
        .collect()
}

/// How the membership runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The Leases' namespace; the client's default (the service account's
    /// or the kubeconfig's, else `default`) when unset.
    pub namespace: Option<String>,
    pub node: String,
    pub slots: u16,
    /// leaseDurationSeconds of our Lease; renewed and re-read every third.
    pub lease_secs: u32,
}

/// Unix milliseconds: the Leases' times are compared to the millisecond,
/// so that a short lease duration is not eaten up by rounding.
fn unix_now() -> i64 {
    i64::try_from(clock::now_ms()).unwrap_or(i64::MAX)
}

fn micro(ms: i64) -> Option<MicroTime> {
    Timestamp::from_millisecond(ms).ok().map(MicroTime)
}

/// The longest pool lease time of the inventory in force, in milliseconds;
/// `None` when some pool leases forever.
fn longest_pool_lease(state: &State) -> Option<i64> {
    let inv = state.inventory();
    let mut longest = 0i64;
    for subnet in inv.subnets.iter().filter(|s| s.pool.is_some()) {
        let t = inv.discovery.lease_time_in(subnet);
        if t == u32::MAX {
            return None;
        }
        longest = longest.max(i64::from(t));
    }
    Some(longest * 1000)
}

/// Keeps this agent's slot and the live slots in `state.share` until
/// `shutdown`. Never releases the slot: a departed agent's clients keep
/// their addresses until they expire, and only then may its slice be
/// reused (see the module doc).
pub async fn run(cfg: Config, client: Client, state: Arc<State>, mut shutdown: Shutdown) {
    let (api, _) = leases_api(client, cfg.namespace.as_deref());
    let period =
        Duration::from_millis(u64::from(cfg.lease_secs) * 1000 / 3).max(Duration::from_millis(200));
    let mut m = Member {
        cfg,
        api,
        mine: None,
        renewed_at: None,
        acquired: 0,
        others: BTreeSet::new(),
        names: BTreeMap::new(),
        disagree: false,
    };
    loop {
        m.round(&state).await;
        state.set_share(m.share());
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            () = shutdown.stopped() => return,
        }
    }
}

struct Member {
    cfg: Config,
    api: Api<Lease>,
    /// Our slot and the resourceVersion of our last write to its Lease.
    mine: Option<(u16, String)>,
    /// When we last renewed our Lease successfully (unix milliseconds).
    renewed_at: Option<i64>,
    /// When we claimed it: its acquireTime.
    acquired: i64,
    /// The other live slots as last read.
    others: BTreeSet<u16>,
    /// The node holding each live slot, ours included.
    names: BTreeMap<u16, String>,
    /// A live peer cuts the pools into another number of slots.
    disagree: bool,
}

impl Member {
    /// The share as this member knows it: our own slot live only while the
    /// last renewal we made is within the Lease's duration.
    fn share(&self) -> Share {
        let slots = self.cfg.slots;
        let Some((slot, _)) = self.mine.as_ref().filter(|_| !self.disagree) else {
            return Share::unclaimed(slots)
                .expect("slots validated at start")
                .with_live(self.others.iter().copied())
                .with_names(self.names.clone());
        };
        let base = Share::new(*slot, slots).expect("slots validated at start");
        let ours_live = self
            .renewed_at
            .is_some_and(|r| r + self.lease_ms() > unix_now());
        let mut live = self.others.clone();
        live.remove(slot);
        if ours_live {
            live.insert(*slot);
        }
        let mut names = self.names.clone();
        names.insert(*slot, self.cfg.node.clone());
        base.with_live(live).with_names(names)
    }

    /// One round: read every slot Lease, claim or renew ours, update the
    /// other live slots. On an unreachable API the last membership stays.
    async fn round(&mut self, state: &State) {
        // The hosts' shared records are Leases too (`host_records`): not
        // read here.
        let slots_only = ListParams::default().labels(&format!("!{HOST_LABEL}"));
        let seen = match self.api.list(&slots_only).await {
            Ok(list) => list
                .items
                .iter()
                .filter_map(Seen::from_lease)
                .collect::<Vec<_>>(),
            Err(e) => {
                warn!(error = %e, "failed to list the pool slot Leases; keeping the last membership");
                // Still try to renew what we hold.
                if self.mine.is_some() {
                    self.renew(None).await;
                }
                return;
            }
        };
        let now = unix_now();
        if let Some((slot, _)) = &self.mine {
            let slot = *slot;
            match seen.iter().find(|s| s.slot == slot) {
                Some(s) if s.holder.as_deref() != Some(self.cfg.node.as_str()) => {
                    warn!(
                        slot,
                        holder = ?s.holder,
                        "our pool slot's Lease names another node now; answering only reserved hosts until a slot is claimed"
                    );
                    self.mine = None;
                    self.renewed_at = None;
                }
                Some(s) => self.renew(s.resource_version.clone()).await,
                None => {
                    warn!(slot, "our pool slot's Lease is gone; claiming a slot again");
                    self.mine = None;
                    self.renewed_at = None;
                }
            }
        }
        if self.mine.is_none() {
            self.claim(&seen, now, longest_pool_lease(state)).await;
        }
        let now = unix_now();
        self.others = live_others(&self.cfg.node, self.cfg.slots, &seen, now);
        self.names = seen
            .iter()
            .filter(|s| self.others.contains(&s.slot))
            .filter_map(|s| Some((s.slot, s.holder.clone()?)))
            .collect();
        let odd = disagreeing(&self.cfg.node, self.cfg.slots, &seen, now);
        if !odd.is_empty() && !self.disagree {
            error!(
                slots = self.cfg.slots,
                peers = ?odd.iter().map(|s| (s.slot, s.holder.clone(), s.slots)).collect::<Vec<_>>(),
                "agents disagree on --pool-slots, so their slices could overlap; answering only \
                 reserved hosts until every live agent runs with the same --pool-slots"
            );
        } else if odd.is_empty() && self.disagree {
            info!("every live agent runs with the same --pool-slots again");
        }
        self.disagree = !odd.is_empty();
        debug!(mine = ?self.mine.as_ref().map(|m| m.0), others = ?self.others, "pool membership");
    }

    fn lease_ms(&self) -> i64 {
        i64::from(self.cfg.lease_secs) * 1000
    }

    fn lease(&self, slot: u16, rv: Option<String>, now: i64, acquired: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(lease_name(slot)),
                namespace: None,
                resource_version: rv,
                labels: Some(
                    [(
                        "app.kubernetes.io/name".to_string(),
                        "pxe-agent".to_string(),
                    )]
                    .into(),
                ),
                annotations: Some(
                    [(SLOTS_ANNOTATION.to_string(), self.cfg.slots.to_string())].into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.cfg.node.clone()),
                lease_duration_seconds: i32::try_from(self.cfg.lease_secs).ok(),
                acquire_time: micro(acquired),
                renew_time: micro(now),
                ..LeaseSpec::default()
            }),
        }
    }

    async fn claim(&mut self, seen: &[Seen], now: i64, pool_lease: Option<i64>) {
        for claim in candidates(&self.cfg.node, self.cfg.slots, seen, now, pool_lease) {
            let (slot, result) = match &claim {
                // Our own slot back, or a lapsed one taken over: both replace
                // the Lease as last seen, so a 409 means someone else won.
                Claim::Own {
                    slot,
                    resource_version,
                }
                | Claim::Take {
                    slot,
                    resource_version,
                } => {
                    let lease = self.lease(*slot, Some(resource_version.clone()), now, now);
                    let r = self
                        .api
                        .replace(&lease_name(*slot), &PostParams::default(), &lease)
                        .await;
                    (*slot, r)
                }
                Claim::Create { slot } => {
                    let lease = self.lease(*slot, None, now, now);
                    (*slot, self.api.create(&PostParams::default(), &lease).await)
                }
            };
            match result {
                Ok(lease) => {
                    info!(slot, slots = self.cfg.slots, ?claim, "claimed pool slot");
                    self.mine = Some((slot, lease.metadata.resource_version.unwrap_or_default()));
                    self.renewed_at = Some(now);
                    self.acquired = now;
                    return;
                }
                Err(kube::Error::Api(status))
                    if status.is_conflict() || status.is_already_exists() =>
                {
                    debug!(slot, "another agent won pool slot {slot}");
                }
                Err(e) => {
                    warn!(slot, error = %e, "failed to claim pool slot {slot}");
                    return;
                }
            }
        }
        warn!(
            slots = self.cfg.slots,
            "no pool slot free; answering only reserved hosts until one is"
        );
    }

    /// Renews our Lease at `rv` (the version just read), else at the
    /// version of our last write.
    async fn renew(&mut self, rv: Option<String>) {
        let Some((slot, last)) = self.mine.clone() else {
            return;
        };
        let now = unix_now();
        let lease = self.lease(slot, Some(rv.unwrap_or(last)), now, self.acquired);
        match self
            .api
            .replace(&lease_name(slot), &PostParams::default(), &lease)
            .await
        {
            Ok(lease) => {
                self.mine = Some((slot, lease.metadata.resource_version.unwrap_or_default()));
                self.renewed_at = Some(now);
            }
            Err(e) => {
                let lapsed = self.renewed_at.is_none_or(|r| r + self.lease_ms() <= now);
                warn!(
                    slot,
                    error = %e,
                    lapsed,
                    "failed to renew our pool slot's Lease{}",
                    if lapsed {
                        ": it has run out, so pool clients are left to the other agents until it is renewed"
                    } else {
                        ""
                    }
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(slot: u16, holder: &str, renewed: i64, rv: &str) -> Seen {
        Seen {
            slot,
            holder: Some(holder.into()),
            renewed: Some(renewed),
            duration: 15_000,
            resource_version: Some(rv.into()),
            slots: Some(4),
        }
    }

    #[test]
    fn lease_names_round_trip_and_reject_lookalikes() {
        assert_eq!(slot_of(&lease_name(7)), Some(7));
        assert_eq!(slot_of("pxe-agent-slot-0"), Some(0));
        for bad in [
            "pxe-agent-slot-",
            "pxe-agent-slot-07",
            "pxe-agent-slot--1",
            "x-1",
        ] {
            assert_eq!(slot_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_lease_object_reads_to_the_millisecond() {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some("pxe-agent-slot-2".into()),
                resource_version: Some("7".into()),
                annotations: Some([(SLOTS_ANNOTATION.to_string(), "8".to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("node-a".into()),
                lease_duration_seconds: Some(15),
                renew_time: micro(1_700_000_000_123),
                ..LeaseSpec::default()
            }),
        };
        let s = Seen::from_lease(&lease).expect("a slot lease");
        assert_eq!(
            s,
            Seen {
                slot: 2,
                holder: Some("node-a".into()),
                renewed: Some(1_700_000_000_123),
                duration: 15_000,
                resource_version: Some("7".into()),
                slots: Some(8),
            }
        );
        assert!(s.is_live(1_700_000_015_122));
        assert!(!s.is_live(1_700_000_015_123));
        let mut other = lease;
        other.metadata.name = Some("kube-scheduler".into());
        assert_eq!(Seen::from_lease(&other), None);
    }

    #[test]
    fn a_node_takes_its_own_slot_back_first() {
        let now = 1_000_000;
        let s = [seen(0, "a", now, "1"), seen(3, "me", now - 500_000, "9")];
        let c = candidates("me", 4, &s, now, Some(600_000));
        assert_eq!(
            c[0],
            Claim::Own {
                slot: 3,
                resource_version: "9".into()
            }
        );
        assert_eq!(c[1], Claim::Create { slot: 1 });
    }

    #[test]
    fn a_dead_nodes_slot_is_reused_only_after_its_leases_expired() {
        let pool = 600_000;
        // Renewed at 0 for 15 s: out at 15 s, its clients' leases out by 615 s.
        let s = [seen(0, "dead", 0, "5")];
        let take = Claim::Take {
            slot: 0,
            resource_version: "5".into(),
        };
        assert!(!candidates("me", 1, &s, 614_999, Some(pool)).contains(&take));
        assert!(candidates("me", 1, &s, 615_000, Some(pool)).contains(&take));
        // An infinite pool lease: never.
        assert!(candidates("me", 1, &s, i64::MAX / 2, None).is_empty());
        // Free slots come before reusable ones in slot order.
        let s = [seen(0, "dead", 0, "5"), seen(2, "b", 10_000_000, "6")];
        let c = candidates("me", 3, &s, 10_000_000, Some(pool));
        assert_eq!(c, vec![take, Claim::Create { slot: 1 }]);
    }

    #[test]
    fn a_live_peer_with_another_slot_count_is_found() {
        let mut odd = seen(1, "b", 100_000, "1");
        odd.slots = Some(8);
        let beyond = seen(6, "c", 100_000, "1");
        let mut dead = seen(2, "d", 0, "1");
        dead.slots = Some(8);
        let s = [
            seen(0, "a", 100_000, "1"),
            odd.clone(),
            beyond.clone(),
            dead,
        ];
        let found = disagreeing("me", 4, &s, 101_000);
        assert_eq!(found, vec![&odd, &beyond]);
        assert!(disagreeing("me", 4, &s[..1], 101_000).is_empty());
    }

    #[test]
    fn live_slots_are_those_renewed_within_their_duration() {
        let s = [
            seen(0, "a", 100_000, "1"),
            seen(1, "b", 90_000, "1"),
            seen(2, "me", 100_000, "1"),
            seen(9, "c", 100_000, "1"),
        ];
        // At 105 s: a (100 + 15) live, b (90 + 15 = 105) not, ours left out,
        // slot 9 beyond the slots.
        assert_eq!(live_others("me", 4, &s, 105_000), BTreeSet::from([0]));
    }
}
