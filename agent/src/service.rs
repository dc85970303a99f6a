//! Service targets: the RDMA connections of this host's jobs that a shard probes along their own
//! path. Owns the bounded per-shard table of traced connections ([`ServiceTable`]), its admission
//! rate ([`TokenBucket`]), and the events the tracer thread hands to shards ([`ServiceEvent`]).
//!
//! The table is preallocated to `max_targets_per_shard` slots when the shard starts; adding a
//! connection allocates only its dictionary entry and name (once per connection, bounded by the
//! admission rate), never per probe. A slot's generation changes when it is freed, so schedule
//! entries of a removed connection are recognised and dropped when they come due.

/// A connection the tracer saw reach RTR on a GID this shard owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewService {
    pub local_qpn: u32,
    pub remote_qpn: u32,
    pub pid: u32,
    pub comm: String,
    pub remote_gid: [u8; 16],
    /// The label the connection's packets carry (see `rocemesh_bpf::effective_flow_label`).
    pub flow_label: u32,
    pub traffic_class: u8,
    /// When the QP reached RTR (CLOCK_MONOTONIC ns, the tracer's clock).
    pub rtr_mono_ns: u64,
}

/// What the tracer thread tells a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceEvent {
    /// Probe this connection.
    Add(NewService),
    /// Stop probing the connection with this local QPN (destroyed, or its process exited).
    Remove { local_qpn: u32, why: RemoveReason },
}

/// Why a service target ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoveReason {
    /// The QP was destroyed (the job closed it, or exited and the kernel cleaned up).
    Destroyed,
    /// The process that owned it is gone and no destroy event was seen (one was dropped).
    ProcessGone,
}

/// Why a connection was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Every slot is in use (`max_targets_per_shard`).
    TableFull,
    /// More new connections than `max_new_targets_per_s` (a connection storm).
    Rate,
    /// Already a target (the same local QPN re-entered RTR).
    Duplicate,
}

/// A token bucket: `rate` per second, burst `burst`. Time is passed in, so it is deterministic.
#[derive(Clone, Copy, Debug)]
pub struct TokenBucket {
    rate_per_ns: f64,
    burst: f64,
    tokens: f64,
    last_ns: u64,
}

impl TokenBucket {
    /// Full at `now_ns`.
    pub fn new(rate_per_s: f64, burst: f64, now_ns: u64) -> Self {
        Self { rate_per_ns: rate_per_s / 1e9, burst, tokens: burst, last_ns: now_ns }
    }

    /// Take one token if there is one.
    pub fn take(&mut self, now_ns: u64) -> bool {
        let dt = now_ns.saturating_sub(self.last_ns) as f64;
        self.last_ns = self.last_ns.max(now_ns);
        self.tokens = (self.tokens + dt * self.rate_per_ns).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Counters of a shard's service targets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    /// Connections being probed now.
    pub active: u64,
    /// The most connections probed at once since start.
    pub peak_active: u64,
    /// Connections taken since start.
    pub added: u64,
    /// Connections that ended (destroyed or their process gone).
    pub removed: u64,
    /// Refused because the table was full.
    pub refused_full: u64,
    /// Refused by the admission rate (a connection storm).
    pub refused_rate: u64,
    /// Events for a connection already probed, or removals of one that is not.
    pub duplicates: u64,
}

/// Schedule entries of service slots carry this bit; the low 12 bits are the slot and the
/// 19 bits above them the slot's generation.
pub const SERVICE_BIT: u32 = 1 << 31;
const SLOT_BITS: u32 = 12;
const GEN_MASK: u32 = (1 << 19) - 1;

/// One traced connection being probed.
#[derive(Clone, Copy, Debug)]
pub struct Slot<A> {
    pub local_qpn: u32,
    /// Dictionary id of its `Service` endpoint.
    pub id: u32,
    pub addr: A,
    pub flow_label: u32,
    /// The remote's ToR slot in the live metrics.
    pub tor_slot: u16,
    generation: u32,
    live: bool,
}

/// The bounded table of a shard's service targets.
#[derive(Debug)]
pub struct ServiceTable<A> {
    slots: Vec<Slot<A>>,
    free: Vec<u16>,
    bucket: TokenBucket,
    pub interval_ns: u64,
    stats: ServiceStats,
}

impl<A: Copy> ServiceTable<A> {
    /// `capacity` slots (at most 4096), new targets at `new_per_s`, each probed every
    /// `interval_ns`.
    pub fn new(capacity: usize, new_per_s: f64, interval_ns: u64, null: A, now_ns: u64) -> Self {
        assert!(capacity <= 1 << SLOT_BITS, "config validation bounds max_targets_per_shard");
        let slot = Slot { local_qpn: 0, id: 0, addr: null, flow_label: 0, tor_slot: 0, generation: 0, live: false };
        Self {
            slots: vec![slot; capacity],
            free: (0..capacity as u16).rev().collect(),
            bucket: TokenBucket::new(new_per_s, new_per_s.max(1.0), now_ns),
            interval_ns,
            stats: ServiceStats::default(),
        }
    }

    /// Whether a connection may be added now: a free slot, not a duplicate, and a token.
    /// Takes the token; call [`ServiceTable::insert`] next.
    pub fn admit(&mut self, local_qpn: u32, now_ns: u64) -> Result<(), Refused> {
        if self.find(local_qpn).is_some() {
            self.stats.duplicates += 1;
            return Err(Refused::Duplicate);
        }
        if self.free.is_empty() {
            self.stats.refused_full += 1;
            return Err(Refused::TableFull);
        }
        if !self.bucket.take(now_ns) {
            self.stats.refused_rate += 1;
            return Err(Refused::Rate);
        }
        Ok(())
    }

    /// Put an admitted connection in a free slot; returns its schedule key.
    pub fn insert(&mut self, local_qpn: u32, id: u32, addr: A, flow_label: u32) -> u32 {
        let Some(i) = self.free.pop() else {
            // admit() checked; a caller that skipped it loses the connection, counted.
            self.stats.refused_full += 1;
            return 0;
        };
        let s = &mut self.slots[usize::from(i)];
        *s = Slot { local_qpn, id, addr, flow_label, tor_slot: 0, generation: s.generation, live: true };
        self.stats.added += 1;
        self.stats.active += 1;
        self.stats.peak_active = self.stats.peak_active.max(self.stats.active);
        key(usize::from(i), s.generation)
    }

    /// End the connection with `local_qpn`; false if it is not a target.
    pub fn remove(&mut self, local_qpn: u32) -> bool {
        let Some(i) = self.find(local_qpn) else {
            self.stats.duplicates += 1;
            return false;
        };
        let s = &mut self.slots[i];
        s.live = false;
        s.generation = (s.generation + 1) & GEN_MASK;
        self.free.push(i as u16);
        self.stats.removed += 1;
        self.stats.active -= 1;
        true
    }

    /// Where the connection's probes are counted in the live metrics.
    pub fn set_tor_slot(&mut self, key: u32, tor_slot: u16) {
        let i = (key & ((1 << SLOT_BITS) - 1)) as usize;
        if let Some(s) = self.slots.get_mut(i) {
            s.tor_slot = tor_slot;
        }
    }

    /// The live slot a schedule key names; `None` once it was removed (or reused).
    pub fn get(&self, key: u32) -> Option<&Slot<A>> {
        let i = (key & ((1 << SLOT_BITS) - 1)) as usize;
        let generation = (key >> SLOT_BITS) & GEN_MASK;
        self.slots.get(i).filter(|s| s.live && s.generation == generation)
    }

    /// Schedule keys and flow labels of every live connection.
    pub fn live(&self) -> impl Iterator<Item = (u32, &Slot<A>)> {
        self.slots.iter().enumerate().filter(|(_, s)| s.live).map(|(i, s)| (key(i, s.generation), s))
    }

    pub fn stats(&self) -> ServiceStats {
        self.stats
    }

    fn find(&self, local_qpn: u32) -> Option<usize> {
        // A linear scan of at most max_targets_per_shard slots, on add and remove only.
        self.slots.iter().position(|s| s.live && s.local_qpn == local_qpn)
    }
}

fn key(slot: usize, generation: u32) -> u32 {
    SERVICE_BIT | (generation << SLOT_BITS) | slot as u32
}

/// The endpoint name of a connection: unique per (prober RNIC, local QPN, process), readable.
pub fn endpoint_name(prober: &str, s: &NewService, remote: &str) -> String {
    format!("svc {prober} qp {} -> {remote} qp {} ({}[{}])", s.local_qpn, s.remote_qpn, s.comm, s.pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_admits_its_burst_then_its_rate() {
        let mut b = TokenBucket::new(10.0, 10.0, 0);
        assert_eq!((0..100).filter(|_| b.take(0)).count(), 10);
        // One second later: ten more, not a hundred.
        assert_eq!((0..100).filter(|_| b.take(1_000_000_000)).count(), 10);
        // Time going backwards gives nothing.
        assert!(!b.take(500_000_000));
    }

    #[test]
    fn table_is_bounded_and_keys_of_removed_slots_go_stale() {
        let mut t = ServiceTable::new(2, 1_000.0, 1_000_000, 0u8, 0);
        t.admit(1, 0).expect("room");
        let k1 = t.insert(1, 10, 1, 5);
        t.admit(2, 0).expect("room");
        let k2 = t.insert(2, 11, 2, 6);
        assert_eq!(t.admit(3, 0), Err(Refused::TableFull));
        assert_eq!(t.admit(1, 0), Err(Refused::Duplicate));
        assert_eq!(t.get(k1).map(|s| s.id), Some(10));
        assert!(t.remove(1));
        assert!(t.get(k1).is_none(), "a removed connection's schedule entry is stale");
        assert!(!t.remove(1));
        t.admit(3, 0).expect("the slot is free again");
        let k3 = t.insert(3, 12, 3, 7);
        assert_ne!(k3, k1, "a reused slot has a new generation");
        assert!(t.get(k1).is_none());
        assert_eq!(t.get(k3).map(|s| s.local_qpn), Some(3));
        assert_eq!(t.get(k2).map(|s| s.local_qpn), Some(2));
        let s = t.stats();
        assert_eq!((s.active, s.added, s.removed, s.refused_full, s.duplicates), (2, 3, 1, 1, 2));
        assert_eq!(s.peak_active, 2);
        assert_eq!(t.live().count(), 2);
    }

    #[test]
    fn a_storm_is_admitted_at_the_rate() {
        // 1,000 connections created and destroyed within one second: 20 taken, the rest counted.
        let mut t = ServiceTable::new(64, 20.0, 1_000_000, 0u8, 0);
        let mut taken = 0;
        for q in 0..1_000u32 {
            let now = u64::from(q) * 1_000_000;
            if t.admit(q, now).is_ok() {
                t.insert(q, q, 0, 0);
                taken += 1;
            }
            t.remove(q);
        }
        let s = t.stats();
        assert_eq!(taken, s.added);
        assert!((20..=40).contains(&taken), "{taken}");
        assert_eq!(s.refused_rate, 1_000 - taken);
        assert_eq!(s.active, 0);
    }

    #[test]
    fn keys_carry_the_service_bit_and_the_slot() {
        let mut t = ServiceTable::new(4096, 1e6, 1, 0u8, 0);
        let mut last = 0;
        for q in 0..4096 {
            t.admit(q, 0).expect("room");
            last = t.insert(q, q, 0, 0);
            assert!(last & SERVICE_BIT != 0);
        }
        assert_eq!(t.get(last).map(|s| s.local_qpn), Some(4095));
        assert_eq!(t.admit(5000, 0), Err(Refused::TableFull));
    }
}
