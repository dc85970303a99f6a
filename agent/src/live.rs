//! Live state: what each shard publishes for the `/metrics` exporter while it runs.
//!
//! The shard is the only writer. Per-probe figures (outcomes and RTT per target ToR, host-delay
//! histograms) are single-writer atomics: a relaxed load and a relaxed store, which on x86 and
//! arm64 are plain moves, so the probe path takes no lock, makes no syscall and allocates
//! nothing. A scrape reads them from another thread; it may see one histogram a probe ahead of
//! another, never a torn value. Counters the shard already keeps ([`ShardStats`]) are copied in
//! a few times per second behind a `try_lock`, which never waits.
//!
//! Labels stay bounded: probes are counted per *target ToR*, never per target RNIC (rpingmesh's
//! rule). Each shard has [`MAX_TORS`] ToR slots, taken at pinglist load and kept for the life of
//! the process (a counter must not vanish and come back at zero); ToRs beyond them share the
//! slot [`OVERFLOW_TOR`], said once in the log.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub use rocemesh_formats::record::Class;

use crate::stats::ShardStats;

/// Upper bounds (ns) of the RTT and host-delay histogram buckets, a 1-2-5 series from 2 µs to
/// 100 ms. The SLA's RTT p99 bound (500 µs, `deploy/sla.toml`) is one of them, so the alert
/// "p99 above 500 µs" is exact: more than 1% of samples above `le="0.0005"`. They are the live
/// view's (`formats::view`), whose layout a collector reads.
pub const BOUNDS_NS: [u64; 15] = rocemesh_formats::view::BOUNDS_NS;
/// Buckets, the last one unbounded (+Inf).
pub const BUCKETS: usize = BOUNDS_NS.len() + 1;

/// The classes probes are counted in: `analyze`'s ([`Class`], shared through `formats`), so that a
/// loss ratio from Prometheus means what `analyze report` means: lost / (ok + partial + lost).
/// An agent writes no outcome it does not know, so `unknown` is not among them.
pub const CLASSES: [Class; 6] =
    [Class::Ok, Class::Lost, Class::Partial, Class::Invalid, Class::Refused, Class::LocalDrop];

/// ToR slots per shard, preallocated (about 190 B each).
pub const MAX_TORS: usize = 1024;
/// The `target_tor` of ToRs past [`MAX_TORS`].
pub const OVERFLOW_TOR: &str = "_other";
/// The `target_tor` of targets whose pinglist entry names no ToR (pinglists from before
/// `tor` existed, service targets the dictionary does not place).
pub const UNKNOWN_TOR: &str = "unknown";

/// Add `n` to a counter only this thread writes: no read-modify-write instruction needed.
#[inline]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// A fixed-bucket histogram of nanoseconds.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

/// A histogram as read: per-bucket (not cumulative) counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Samples per bucket; bucket i holds values <= `BOUNDS_NS[i]`, the last the rest.
    pub buckets: [u64; BUCKETS],
    /// Sum of the samples, ns.
    pub sum_ns: u64,
}

impl HistogramSnapshot {
    /// Samples in all buckets.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

impl Histogram {
    #[inline]
    fn observe(&self, ns: u64) {
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        bump(&self.buckets[i], 1);
        bump(&self.sum_ns, ns);
    }

    /// The histogram now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// One target ToR's figures.
#[derive(Debug, Default)]
struct TorCells {
    outcomes: [AtomicU64; CLASSES.len()],
    rtt: Histogram,
}

/// What a shard publishes; shared with the exporter through an `Arc`.
#[derive(Debug)]
pub struct LiveShard {
    /// The shard's device (pinglist `from`).
    pub device: String,
    /// Its ToR.
    pub tor: String,
    cells: Box<[TorCells]>,
    /// Slot names in slot order, and the index by name (written at load, read at scrape).
    names: Mutex<TorNames>,
    prober_delay: Histogram,
    responder_delay: Histogram,
    stats: Mutex<ShardStats>,
    generation: AtomicU64,
    generated_unix_ns: AtomicU64,
    loaded_unix_ns: AtomicU64,
    targets: AtomicU64,
    device_up: AtomicBool,
}

#[derive(Debug, Default)]
struct TorNames {
    names: Vec<String>,
    index: HashMap<String, u16>,
    overflow_logged: bool,
}

/// One target ToR's figures as read.
#[derive(Clone, Debug)]
pub struct TorSnapshot {
    /// `target_tor`.
    pub name: String,
    /// Probes per class, in [`CLASSES`] order.
    pub outcomes: [u64; CLASSES.len()],
    /// Network RTT of ok probes.
    pub rtt: HistogramSnapshot,
}

/// Pinglist figures as read.
#[derive(Clone, Copy, Debug, Default)]
pub struct PinglistState {
    /// Generation in force (0 before the first load).
    pub generation: u64,
    /// When ctl generated it (Unix ns).
    pub generated_unix_ns: u64,
    /// When this shard loaded it (Unix ns).
    pub loaded_unix_ns: u64,
    /// Targets it gave this shard.
    pub targets: u64,
}

impl LiveShard {
    /// Empty live state for the shard of `device` under `tor`; every table is allocated here.
    pub fn new(device: &str, tor: &str) -> Self {
        let mut names = TorNames::default();
        names.names.reserve(MAX_TORS + 1);
        names.index.reserve(MAX_TORS + 1);
        Self {
            device: device.to_owned(),
            tor: tor.to_owned(),
            cells: (0..=MAX_TORS).map(|_| TorCells::default()).collect(),
            names: Mutex::new(names),
            prober_delay: Histogram::default(),
            responder_delay: Histogram::default(),
            stats: Mutex::new(ShardStats::default()),
            generation: AtomicU64::new(0),
            generated_unix_ns: AtomicU64::new(0),
            loaded_unix_ns: AtomicU64::new(0),
            targets: AtomicU64::new(0),
            device_up: AtomicBool::new(true),
        }
    }

    fn lock_names(&self) -> std::sync::MutexGuard<'_, TorNames> {
        self.names.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The slot of target ToR `name` (empty: [`UNKNOWN_TOR`]), taking a new one if needed.
    /// At pinglist load and when a service target is added, never per probe.
    pub fn tor_slot(&self, name: &str) -> u16 {
        let name = if name.is_empty() { UNKNOWN_TOR } else { name };
        let mut n = self.lock_names();
        if let Some(&slot) = n.index.get(name) {
            return slot;
        }
        if n.names.len() >= MAX_TORS {
            if !n.overflow_logged {
                n.overflow_logged = true;
                tracing::warn!(
                    device = %self.device,
                    "more than {MAX_TORS} target ToRs: the rest are counted together as target_tor=\"{OVERFLOW_TOR}\""
                );
            }
            return MAX_TORS as u16;
        }
        let slot = n.names.len() as u16;
        n.names.push(name.to_owned());
        n.index.insert(name.to_owned(), slot);
        slot
    }

    /// A finished probe to a target under ToR slot `slot`; `delays` (network RTT, prober delay,
    /// responder delay, ns) for ok probes.
    #[inline]
    pub fn probe(&self, slot: u16, class: Class, delays: Option<(u64, u64, u64)>) {
        let cells = &self.cells[usize::from(slot).min(MAX_TORS)];
        // CLASSES is in discriminant order; `Unknown` (never written by an agent) is dropped.
        if let Some(c) = cells.outcomes.get(class as usize) {
            bump(c, 1);
        }
        if let Some((rtt, pd, rd)) = delays {
            cells.rtt.observe(rtt);
            self.prober_delay.observe(pd);
            self.responder_delay.observe(rd);
        }
    }

    /// The shard's counters, copied in unless a scrape is reading them at this instant (then
    /// the next publication brings them).
    pub fn publish_stats(&self, stats: &ShardStats) {
        if let Ok(mut s) = self.stats.try_lock() {
            *s = *stats;
        }
    }

    /// A pinglist came into force.
    pub fn pinglist_loaded(&self, generation: u64, generated_unix_ns: u64, targets: usize) {
        self.generation.store(generation, Ordering::Relaxed);
        self.generated_unix_ns.store(generated_unix_ns, Ordering::Relaxed);
        self.loaded_unix_ns.store(crate::clock::now_ns(), Ordering::Relaxed);
        self.targets.store(targets as u64, Ordering::Relaxed);
    }

    /// Whether the device is usable (verbs: present, its QP working).
    pub fn set_device_up(&self, up: bool) {
        self.device_up.store(up, Ordering::Relaxed);
    }

    /// Every target ToR seen so far, with its figures.
    pub fn tors(&self) -> Vec<TorSnapshot> {
        let names: Vec<String> = self.lock_names().names.clone();
        let mut out: Vec<TorSnapshot> =
            names.into_iter().enumerate().map(|(i, name)| self.tor_snapshot(i, name)).collect();
        let overflow = self.tor_snapshot(MAX_TORS, OVERFLOW_TOR.to_owned());
        if overflow.outcomes.iter().any(|&n| n > 0) {
            out.push(overflow);
        }
        out
    }

    fn tor_snapshot(&self, slot: usize, name: String) -> TorSnapshot {
        let c = &self.cells[slot];
        TorSnapshot {
            name,
            outcomes: std::array::from_fn(|i| c.outcomes[i].load(Ordering::Relaxed)),
            rtt: c.rtt.snapshot(),
        }
    }

    /// Runs `f` over the target ToRs without allocating or waiting: None (and `f` not run) when a
    /// scrape holds the names at this instant. For the shard's view (`crate::view`).
    pub fn try_view_tors<R>(&self, f: impl FnOnce(&TorView<'_>) -> R) -> Option<R> {
        let names = self.names.try_lock().ok()?;
        let overflow = self.cells[MAX_TORS].outcomes.iter().any(|c| c.load(Ordering::Relaxed) > 0);
        Some(f(&TorView { live: self, names: &names.names, overflow }))
    }

    /// Prober and responder delay histograms.
    pub fn host_delays(&self) -> [HistogramSnapshot; 2] {
        [self.prober_delay.snapshot(), self.responder_delay.snapshot()]
    }

    /// The counters last published.
    pub fn stats(&self) -> ShardStats {
        *self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pinglist in force.
    pub fn pinglist(&self) -> PinglistState {
        PinglistState {
            generation: self.generation.load(Ordering::Relaxed),
            generated_unix_ns: self.generated_unix_ns.load(Ordering::Relaxed),
            loaded_unix_ns: self.loaded_unix_ns.load(Ordering::Relaxed),
            targets: self.targets.load(Ordering::Relaxed),
        }
    }

    /// Whether the device is usable.
    pub fn device_up(&self) -> bool {
        self.device_up.load(Ordering::Relaxed)
    }
}

/// The target ToRs in slot order, the overflow slot last when it counted anything.
#[derive(Debug)]
pub struct TorView<'a> {
    live: &'a LiveShard,
    names: &'a [String],
    overflow: bool,
}

impl TorView<'_> {
    /// Slots in use.
    pub fn len(&self) -> usize {
        self.names.len() + usize::from(self.overflow)
    }

    /// Whether no slot is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slot `i`'s `target_tor`.
    pub fn name(&self, i: usize) -> &str {
        self.names.get(i).map_or(OVERFLOW_TOR, String::as_str)
    }

    /// Slot `i`'s probes per class ([`CLASSES`] order) and RTT histogram.
    pub fn figures(&self, i: usize) -> ([u64; CLASSES.len()], HistogramSnapshot) {
        let c = &self.live.cells[if i < self.names.len() { i } else { MAX_TORS }];
        (std::array::from_fn(|k| c.outcomes[k].load(Ordering::Relaxed)), c.rtt.snapshot())
    }
}

/// Agent-wide counters of the threads around the shards (watcher, sealer).
#[derive(Debug, Default)]
pub struct AgentCounters {
    /// Pinglists reloaded (valid new versions published).
    pub pinglist_reloads: AtomicU64,
    /// New versions refused (invalid); the previous stays in force.
    pub pinglist_reload_errors: AtomicU64,
    /// Fleet key files reloaded (valid new versions published).
    pub keys_reloads: AtomicU64,
    /// Fleet key files refused (invalid, readable by others); the keys in force stay.
    pub keys_reload_errors: AtomicU64,
    /// Segments sealed.
    pub segments_sealed: AtomicU64,
    /// Seals that failed (the open segment is kept).
    pub seal_errors: AtomicU64,
    /// Sealed segments evicted by the disk quota.
    pub evictions: AtomicU64,
    /// Their bytes.
    pub evicted_bytes: AtomicU64,
}

impl AgentCounters {
    /// Add `n` to `c` (several threads write these: a real read-modify-write).
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_on_a_bound_goes_into_that_bucket() {
        let h = Histogram::default();
        for ns in [1, 2_000, 2_001, 500_000, 500_001, 100_000_000, 100_000_001, u64::MAX / 4] {
            h.observe(ns);
        }
        let s = h.snapshot();
        assert_eq!(s.buckets[0], 2, "1 and 2000 ns are <= 2 us");
        assert_eq!(s.buckets[1], 1, "2001 ns");
        assert_eq!(s.buckets[7], 1, "500 us is <= le=0.0005");
        assert_eq!(s.buckets[8], 1, "500.001 us");
        assert_eq!(s.buckets[14], 1, "100 ms");
        assert_eq!(s.buckets[15], 2, "beyond 100 ms: +Inf");
        assert_eq!(s.count(), 8);
    }

    #[test]
    fn tor_slots_are_stable_and_bounded() {
        let l = LiveShard::new("mlx5_0", "tor0");
        let a = l.tor_slot("tor1");
        let b = l.tor_slot("tor2");
        assert_eq!(l.tor_slot("tor1"), a, "one slot per name");
        assert_ne!(a, b);
        assert_eq!(l.tor_slot(""), l.tor_slot(UNKNOWN_TOR));
        for i in 0..MAX_TORS + 10 {
            l.tor_slot(&format!("t{i}"));
        }
        let over = l.tor_slot("one-too-many");
        assert_eq!(usize::from(over), MAX_TORS);
        l.probe(over, Class::Lost, None);
        l.probe(a, Class::Ok, Some((3_000, 1_000, 1_000)));
        let tors = l.tors();
        assert_eq!(tors.len(), MAX_TORS + 1, "every slot, and the overflow once it counted something");
        assert_eq!(tors.last().map(|t| t.name.as_str()), Some(OVERFLOW_TOR));
        assert_eq!(tors[usize::from(a)].outcomes[Class::Ok as usize], 1);
        assert_eq!(tors[usize::from(a)].rtt.buckets[1], 1, "3 us is in (2, 5] us");
        assert_eq!(l.host_delays()[0].count(), 1);
    }
}
