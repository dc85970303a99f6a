//! The shard's side of one-sided collection (issue 22): it keeps its [`Region`]
//! (`rocemesh_formats::view`) up to date from what it already publishes for `/metrics`, on its
//! own thread, with plain stores, no syscall and no lock it could wait on. A collector reads the
//! region with RDMA READ; the agent is never asked.
//!
//! Windows: the live counters are cumulative; the view also carries, per target ToR, the
//! window in progress and the last complete one, wall-clock aligned as `analyze` aligns them.
//! At each update the publisher keeps the cumulative figures at the window's start, so a window
//! costs a subtraction, not a second set of per-probe counters. A window rolls at the first
//! update after its end (updates come every 250 ms), so a window's figures hold the probes up to
//! that update: within one update of exact.

use std::sync::Arc;

use rocemesh_formats::view::{
    BUCKETS, COUNTER_NAMES, FLAG_DEVICE_UP, FLAG_DRAINING, FLAG_TRACING, OUTCOMES, Region, Update, Window,
};

use crate::live::{CLASSES, LiveShard, MAX_TORS};
use crate::stats::ShardStats;

const _: () = assert!(CLASSES.len() == OUTCOMES.len() && crate::live::BUCKETS == BUCKETS);

/// ToR slots of every shard's view: the live state's, plus its overflow slot.
pub const VIEW_SLOTS: usize = MAX_TORS + 1;

/// Keeps one shard's view region.
#[derive(Debug)]
pub struct ViewPublisher {
    region: Arc<Region>,
    host: String,
    window_ns: u64,
    epoch: u64,
    window_start_unix_ns: u64,
    last_window_start_unix_ns: u64,
    /// Per slot: the cumulative figures at the current window's start, the cumulative figures
    /// now, the window in progress and the last complete one. Preallocated.
    at_start: Vec<Window>,
    now: Vec<Window>,
    current: Vec<Window>,
    last: Vec<Window>,
    counters: [u64; COUNTER_NAMES.len()],
    publishes: u64,
    /// Updates skipped because a scrape held the ToR names at that instant.
    pub skipped: u64,
}

impl ViewPublisher {
    /// A publisher for a shard of `host`, windows of `window_ns`; `epoch` is the agent's.
    pub fn new(host: &str, window_ns: u64, epoch: u32) -> Self {
        assert!(window_ns > 0, "view window must be positive (config validation)");
        Self {
            region: Arc::new(Region::new(VIEW_SLOTS)),
            host: host.to_owned(),
            window_ns,
            epoch: u64::from(epoch),
            window_start_unix_ns: 0,
            last_window_start_unix_ns: 0,
            at_start: vec![Window::default(); VIEW_SLOTS],
            now: vec![Window::default(); VIEW_SLOTS],
            current: vec![Window::default(); VIEW_SLOTS],
            last: vec![Window::default(); VIEW_SLOTS],
            counters: [0; COUNTER_NAMES.len()],
            publishes: 0,
            skipped: 0,
        }
    }

    /// The region, for the thread that registers it with the RNIC.
    pub fn region(&self) -> Arc<Region> {
        self.region.clone()
    }

    /// One update at `now_unix_ns` from the shard's live state and counters. Skipped (counted)
    /// when a scrape holds the live state's ToR names at that instant.
    pub fn update(&mut self, live: &LiveShard, stats: &ShardStats, now_unix_ns: u64, tracing: bool, draining: bool) {
        let start = now_unix_ns - now_unix_ns % self.window_ns;
        // The first window starts with the agent: what came before is not in it.
        let first = self.window_start_unix_ns == 0;
        let rolls = !first && start > self.window_start_unix_ns;
        // A gap of more than a window (a stalled shard) leaves in `last` the figures since the
        // window that was in progress: its start says so.
        let (window_start, last_start) = match (first, rolls) {
            (true, _) => (start, 0),
            (false, true) => (start, self.window_start_unix_ns),
            (false, false) => (self.window_start_unix_ns, self.last_window_start_unix_ns),
        };
        self.counters = counters(stats);
        let publishes = self.publishes + 1;
        let p = live.pinglist();
        let flags = if stats.device_up { FLAG_DEVICE_UP } else { 0 }
            | if tracing { FLAG_TRACING } else { 0 }
            | if draining { FLAG_DRAINING } else { 0 };
        let state = [self.epoch, p.generation, p.loaded_unix_ns, p.targets, flags, window_start, last_start, publishes];
        let [pd, rd] = live.host_delays();
        let u = Update {
            updated_unix_ns: now_unix_ns,
            window_ns: self.window_ns,
            host: &self.host,
            device: &live.device,
            tor: &live.tor,
            state,
            counters: &self.counters,
            prober_delay: (pd.buckets, pd.sum_ns),
            responder_delay: (rd.buckets, rd.sum_ns),
        };
        let (region, at_start, now, current, last) =
            (&self.region, &mut self.at_start, &mut self.now, &mut self.current, &mut self.last);
        let done = live.try_view_tors(|tors| {
            let used = tors.len().min(VIEW_SLOTS);
            for (i, w) in now[..used].iter_mut().enumerate() {
                let (outcomes, rtt) = tors.figures(i);
                *w = Window { outcomes, rtt_buckets: rtt.buckets, rtt_sum_ns: rtt.sum_ns };
            }
            if first {
                at_start[..used].copy_from_slice(&now[..used]);
            } else if rolls {
                for ((l, n), a) in last[..used].iter_mut().zip(&now[..used]).zip(&at_start[..used]) {
                    *l = minus(n, a);
                }
                at_start[..used].copy_from_slice(&now[..used]);
            }
            for ((c, n), a) in current[..used].iter_mut().zip(&now[..used]).zip(&at_start[..used]) {
                *c = minus(n, a);
            }
            region.update(&u, (0..used).map(|i| (tors.name(i), &current[i], &last[i])));
        });
        match done {
            Some(()) => {
                (self.window_start_unix_ns, self.last_window_start_unix_ns) = (window_start, last_start);
                self.publishes = publishes;
            }
            None => self.skipped += 1,
        }
    }
}

fn minus(a: &Window, b: &Window) -> Window {
    Window {
        outcomes: std::array::from_fn(|i| a.outcomes[i].wrapping_sub(b.outcomes[i])),
        rtt_buckets: std::array::from_fn(|i| a.rtt_buckets[i].wrapping_sub(b.rtt_buckets[i])),
        rtt_sum_ns: a.rtt_sum_ns.wrapping_sub(b.rtt_sum_ns),
    }
}

/// The shard's counters in [`COUNTER_NAMES`] order.
fn counters(s: &ShardStats) -> [u64; COUNTER_NAMES.len()] {
    [
        s.probes_sent,
        s.ok,
        s.lost,
        s.unreachable,
        s.local_drops.iter().sum(),
        s.invalid,
        s.late,
        s.unknown,
        s.malformed,
        s.auth_refused.iter().sum(),
        s.duplicate_acks,
        s.clock_steps,
        s.peer_down,
        s.answered,
        s.acks_not_sent,
        s.recv_errors,
        s.tx_stamp_errors,
        s.write_errors,
        s.inflight_overflow,
        s.records_dropped,
        s.services.active,
        s.services.added,
        s.services.removed,
        s.services.refused_full,
        s.services.refused_rate,
        s.paths.started,
        s.paths.written,
        s.paths.packets_sent,
        s.trace_arrivals,
        s.transport_errors.iter().sum(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemesh_formats::record::Class;
    use rocemesh_formats::view::read;

    const W: u64 = 10_000_000_000;

    fn snapshot(p: &ViewPublisher) -> rocemesh_formats::view::Snapshot {
        let r = p.region();
        read(&r.copy_ascending(r.len_bytes(), |_| {}), COUNTER_NAMES.len()).expect("a consistent view")
    }

    #[test]
    fn windows_roll_on_the_wall_clock_and_counters_follow_the_shard() {
        let live = LiveShard::new("rxe0", "tor0");
        let (a, b) = (live.tor_slot("tor1"), live.tor_slot("tor2"));
        let mut p = ViewPublisher::new("h0", W, 7);
        let mut stats = ShardStats { probes_sent: 3, ok: 2, device_up: true, ..ShardStats::default() };
        // Before the first update: one ok probe to tor1 (not in the first window).
        live.probe(a, Class::Ok, Some((10_000, 1_000, 1_000)));
        let t0 = 5 * W + W / 2;
        p.update(&live, &stats, t0, true, false);
        live.probe(a, Class::Ok, Some((10_000, 1_000, 1_000)));
        live.probe(b, Class::Lost, None);
        p.update(&live, &stats, t0 + 1, true, false);
        let s = snapshot(&p);
        assert_eq!((s.host.as_str(), s.device.as_str(), s.tor.as_str()), ("h0", "rxe0", "tor0"));
        assert_eq!(s.state("agent_epoch"), Some(7));
        assert_eq!(s.state("window_start_unix_ns"), Some(5 * W));
        assert_eq!(s.state("flags"), Some(FLAG_DEVICE_UP | FLAG_TRACING));
        assert_eq!(s.slots.iter().map(|s| s.tor.as_str()).collect::<Vec<_>>(), ["tor1", "tor2"]);
        assert_eq!(s.slots[0].current.outcomes[0], 1);
        assert_eq!(s.slots[1].current.outcomes[1], 1);
        assert_eq!(s.slots[0].current.rtt_buckets.iter().sum::<u64>(), 1);
        assert_eq!(s.counters[..2], [3, 2]);
        // The next window: the one in progress becomes the last.
        live.probe(a, Class::Ok, Some((10_000, 1_000, 1_000)));
        stats.probes_sent = 9;
        p.update(&live, &stats, 6 * W + 1, false, true);
        let s = snapshot(&p);
        assert_eq!(s.state("last_window_start_unix_ns"), Some(5 * W));
        assert_eq!(s.state("window_start_unix_ns"), Some(6 * W));
        assert_eq!((s.slots[0].last.outcomes[0], s.slots[0].current.outcomes[0]), (2, 0));
        assert_eq!(s.state("flags"), Some(FLAG_DEVICE_UP | FLAG_DRAINING));
        assert_eq!(s.counters[0], 9);
        assert_eq!(s.state("publishes"), Some(3));
    }
}
