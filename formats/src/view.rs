//! The agent's live view: one fixed, versioned memory region per shard that a collector reads
//! with RDMA READ while the agent does nothing (MicroView's one-sided collection).
//!
//! The region is an array of little-endian 64-bit words; every offset below is in words. It is
//! written only by its shard's thread, with plain stores, and read by a remote NIC at any time.
//!
//! ```text
//! word  0        magic "RMVIEW01"
//!       1        layout version (LAYOUT_VERSION)
//!       2        region length, words
//!       3        ToR slots (capacity)
//!       4        ToR slots in use
//!       5        head version: written last by an update
//!       6        unix ns of the update
//!       7        window length, ns
//!       8..16    host name, 64 bytes, NUL-padded
//!      16..20    device name, 32 bytes
//!      20..24    the shard's own ToR, 32 bytes
//!      24..40    state (STATE_NAMES): agent epoch, pinglist generation and load time, targets,
//!                flags (FLAG_*), start of the current and of the last window, ...
//!      40..104   counters (COUNTER_NAMES), cumulative since the agent started
//!     104..121   prober delay histogram (BUCKETS) and its sum, ns
//!     121..138   responder delay histogram and its sum
//!     138        fixed tail version
//!     139..      ToR slots, SLOT_WORDS each:
//!                  0..4    target ToR name, 32 bytes
//!                  4..27   current window: outcomes (OUTCOMES), RTT histogram, RTT sum
//!                 27..50   last complete window: the same
//!                 50       slot tail version
//! ```
//!
//! **Torn reads.** An update writes every tail version first (the fixed tail and each slot's),
//! then the body, then the head version, each phase fenced from the next. A reader that reads
//! ascending addresses (rxe copies with memcpy; NICs read a region in ascending order) and
//! accepts only when the head version equals the tail version of the last unit it read can
//! never accept a mix: if an update's body stores overlapped the reader's pass over the body,
//! the update's tail stores came before the reader reached the tail (it read the new version)
//! and its head store after the reader had read the head (the old one). A reader may read a
//! prefix (the header, the fixed part and the slots in use) and still check, since every unit
//! ends in a tail. A reader whose NIC reads out of order would need a version per cache line;
//! none of ours does, and the torn-read test drives the rule with a reader that stops mid-region.
//!
//! **Access.** The region holds only this, in its own allocation; the agent registers exactly
//! its bytes, remote-read only, in a protection domain of their own (see the agent's `view`).

use std::sync::atomic::{AtomicU64, Ordering, fence};

use thiserror::Error;

/// "RMVIEW01", little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RMVIEW01");
/// The layout this module writes and reads.
pub const LAYOUT_VERSION: u64 = 1;

const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_LEN: usize = 2;
const W_SLOTS: usize = 3;
const W_SLOTS_USED: usize = 4;
const W_HEAD: usize = 5;
const W_UPDATED: usize = 6;
const W_WINDOW_NS: usize = 7;
const W_HOST: usize = 8;
const HOST_WORDS: usize = 8;
const W_DEVICE: usize = 16;
const NAME_WORDS: usize = 4;
const W_TOR: usize = 20;
const W_STATE: usize = 24;
const STATE_WORDS: usize = 16;
const W_COUNTERS: usize = 40;
const COUNTER_WORDS: usize = 64;
const W_PROBER_DELAY: usize = 104;
const W_RESPONDER_DELAY: usize = 121;
const W_FIXED_TAIL: usize = 138;
/// Words before the first ToR slot.
pub const FIXED_WORDS: usize = 139;

/// Histogram buckets: the agent's live histograms' (upper bounds in [`BOUNDS_NS`], the last
/// unbounded).
pub const BUCKETS: usize = 16;
/// The buckets' upper bounds, ns: a 1-2-5 series from 2 µs to 100 ms, then +Inf.
pub const BOUNDS_NS: [u64; BUCKETS - 1] = [
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
];
/// Probe outcome classes counted per slot and window, in this order.
pub const OUTCOMES: [&str; 6] = ["ok", "lost", "partial", "invalid", "refused", "local_drop"];
/// A window's words: outcomes, RTT histogram, RTT sum.
const WINDOW_WORDS: usize = OUTCOMES.len() + BUCKETS + 1;
/// Words per ToR slot.
pub const SLOT_WORDS: usize = NAME_WORDS + 2 * WINDOW_WORDS + 1;

/// The state words, in order; unused ones stay 0.
pub const STATE_NAMES: [&str; 8] = [
    "agent_epoch",
    "pinglist_generation",
    "pinglist_loaded_unix_ns",
    "targets",
    "flags",
    "window_start_unix_ns",
    "last_window_start_unix_ns",
    "publishes",
];
/// `flags`: the RNIC is up.
pub const FLAG_DEVICE_UP: u64 = 1;
/// `flags`: the service tracer is running.
pub const FLAG_TRACING: u64 = 2;
/// `flags`: the shard is draining (the agent is stopping).
pub const FLAG_DRAINING: u64 = 4;

/// Counter words: at most this many; names in [`COUNTER_NAMES`] order.
pub const MAX_COUNTERS: usize = COUNTER_WORDS;

/// The counters of layout version 1, in word order: the agent's shard counters of the same
/// names (its stats line and `/metrics`). New counters are appended; a reader shows those it
/// knows.
pub const COUNTER_NAMES: [&str; 30] = [
    "probes_sent",
    "ok",
    "lost",
    "unreachable",
    "local_drops",
    "invalid",
    "late",
    "unknown",
    "malformed",
    "auth_refused",
    "duplicate_acks",
    "clock_steps",
    "peer_down",
    "answered",
    "acks_not_sent",
    "recv_errors",
    "tx_stamp_errors",
    "write_errors",
    "inflight_overflow",
    "records_dropped",
    "services_active",
    "services_added",
    "services_removed",
    "services_refused_full",
    "services_refused_rate",
    "traces_started",
    "traces_written",
    "trace_packets_sent",
    "trace_arrivals",
    "transport_errors",
];

// The layout table in the module docs, checked.
const _: () = {
    assert!(W_DEVICE == W_HOST + HOST_WORDS && W_TOR == W_DEVICE + NAME_WORDS && W_STATE == W_TOR + NAME_WORDS);
    assert!(STATE_NAMES.len() <= STATE_WORDS && W_COUNTERS == W_STATE + STATE_WORDS);
    assert!(W_PROBER_DELAY == W_COUNTERS + COUNTER_WORDS);
    assert!(W_RESPONDER_DELAY == W_PROBER_DELAY + BUCKETS + 1);
    assert!(W_FIXED_TAIL == W_RESPONDER_DELAY + BUCKETS + 1 && FIXED_WORDS == W_FIXED_TAIL + 1);
    assert!(SLOT_WORDS == 51);
    assert!(COUNTER_NAMES.len() <= MAX_COUNTERS);
};

/// The region length, words, for `slots` ToR slots.
pub const fn region_words(slots: usize) -> usize {
    FIXED_WORDS + slots * SLOT_WORDS
}

/// What an agent tells an accepted collector in the RDMA CM private data of its accept: where
/// the view is and the key to read it with. 24 bytes: "RMVG", the layout version (u32), the
/// address (u64), the rkey (u32), the length in bytes (u32), all little-endian. (RDMA CM, not a
/// file: the collector learns it on the connection it reads over, and it changes whenever the
/// agent restarts or re-registers the region.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

/// The grant's size on the wire.
pub const GRANT_BYTES: usize = 24;
const GRANT_MAGIC: [u8; 4] = *b"RMVG";

impl Grant {
    pub fn encode(&self) -> [u8; GRANT_BYTES] {
        let mut b = [0u8; GRANT_BYTES];
        b[0..4].copy_from_slice(&GRANT_MAGIC);
        b[4..8].copy_from_slice(&(LAYOUT_VERSION as u32).to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b[20..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// The grant in an accept's private data (which the CM pads with zeros).
    pub fn decode(b: &[u8]) -> Result<Self, ViewError> {
        if b.len() < GRANT_BYTES {
            return Err(ViewError::Short { got: b.len(), need: GRANT_BYTES, what: "grant" });
        }
        if b[0..4] != GRANT_MAGIC {
            return Err(ViewError::Foreign(u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let version = u64::from(u32_at(4));
        if version != LAYOUT_VERSION {
            return Err(ViewError::Version { found: version });
        }
        let addr = u64::from_le_bytes(b[8..16].try_into().unwrap_or([0; 8]));
        Ok(Self { addr, rkey: u32_at(16), len: u32_at(20) })
    }
}

/// What a reader found wrong with a region's bytes.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ViewError {
    #[error("not a rocemesh view: magic {0:#018x} (the address or the rkey points elsewhere)")]
    Foreign(u64),
    #[error("view layout version {found}, this reader knows {LAYOUT_VERSION}: upgrade the collector")]
    Version { found: u64 },
    #[error("{got} bytes read, the view's {what} needs {need}")]
    Short { got: usize, need: usize, what: &'static str },
    #[error("torn read: head version {head}, tail version {tail} (an update ran during the read; read again)")]
    Torn { head: u64, tail: u64 },
    #[error("the view was never written (version 0)")]
    Unwritten,
    #[error("the view says it has {used} of {slots} ToR slots in use, or is {len} words long: inconsistent")]
    Inconsistent { used: u64, slots: u64, len: u64 },
}

/// One window of one target ToR.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// Probes per class, [`OUTCOMES`] order.
    pub outcomes: [u64; OUTCOMES.len()],
    /// Network RTT of ok probes, [`BOUNDS_NS`] buckets.
    pub rtt_buckets: [u64; BUCKETS],
    pub rtt_sum_ns: u64,
}

impl Window {
    fn read(w: &[u64]) -> Self {
        let mut out = Window::default();
        out.outcomes.copy_from_slice(&w[..OUTCOMES.len()]);
        out.rtt_buckets.copy_from_slice(&w[OUTCOMES.len()..OUTCOMES.len() + BUCKETS]);
        out.rtt_sum_ns = w[OUTCOMES.len() + BUCKETS];
        out
    }

    fn words(&self) -> impl Iterator<Item = u64> + '_ {
        self.outcomes.iter().chain(&self.rtt_buckets).copied().chain(std::iter::once(self.rtt_sum_ns))
    }
}

/// A target ToR's slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub tor: String,
    /// The window in progress (since `window_start_unix_ns`).
    pub current: Window,
    /// The last complete window (from `last_window_start_unix_ns`, one window long).
    pub last: Window,
}

/// A consistent snapshot of a view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The update's version: grows by one per update.
    pub version: u64,
    pub updated_unix_ns: u64,
    pub window_ns: u64,
    pub host: String,
    pub device: String,
    pub tor: String,
    /// [`STATE_NAMES`] order.
    pub state: [u64; STATE_NAMES.len()],
    /// Counter values, in the order of the names the writer was given ([`Snapshot::counter`]).
    pub counters: Vec<u64>,
    pub prober_delay: ([u64; BUCKETS], u64),
    pub responder_delay: ([u64; BUCKETS], u64),
    /// The slots in use (those the read covered).
    pub slots: Vec<Slot>,
    /// ToR slots in use in the view; `slots` may be fewer when the read covered fewer.
    pub slots_used: u64,
}

impl Snapshot {
    /// A state word by name.
    pub fn state(&self, name: &str) -> Option<u64> {
        STATE_NAMES.iter().position(|n| *n == name).map(|i| self.state[i])
    }

    /// Bytes to read to cover the header, the fixed part and every slot in use.
    pub fn read_bytes(&self) -> usize {
        8 * region_words(self.slots_used as usize)
    }
}

fn name_of(words: &[u64]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// `name` as `N` words, NUL-padded and truncated to leave at least one NUL. No allocation: the
/// shard calls this at every update.
fn name_words<const N: usize>(name: &str) -> [u64; N] {
    let b = name.as_bytes();
    let n = b.len().min(N * 8 - 1);
    let mut out = [0u64; N];
    for (i, w) in out.iter_mut().enumerate() {
        let mut word = [0u8; 8];
        let from = (i * 8).min(n);
        let to = (i * 8 + 8).min(n);
        word[..to - from].copy_from_slice(&b[from..to]);
        *w = u64::from_le_bytes(word);
    }
    out
}

/// Decodes what a reader read, from the region's first byte: the header, the fixed part, and as
/// many whole slots in use as `bytes` covers. `counters` is how many counter words to return.
pub fn read(bytes: &[u8], counters: usize) -> Result<Snapshot, ViewError> {
    let words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    if words.len() < W_SLOTS_USED + 1 {
        return Err(ViewError::Short { got: bytes.len(), need: 8 * (W_SLOTS_USED + 1), what: "header" });
    }
    if words[W_MAGIC] != MAGIC {
        return Err(ViewError::Foreign(words[W_MAGIC]));
    }
    if words[W_VERSION] != LAYOUT_VERSION {
        return Err(ViewError::Version { found: words[W_VERSION] });
    }
    let (len, slots, used) = (words[W_LEN], words[W_SLOTS], words[W_SLOTS_USED]);
    if used > slots || len != region_words(slots as usize) as u64 {
        return Err(ViewError::Inconsistent { used, slots, len });
    }
    if words.len() < FIXED_WORDS {
        return Err(ViewError::Short { got: bytes.len(), need: 8 * FIXED_WORDS, what: "fixed part" });
    }
    let covered = ((words.len() - FIXED_WORDS) / SLOT_WORDS).min(used as usize);
    let tail = if covered == 0 { words[W_FIXED_TAIL] } else { words[FIXED_WORDS + covered * SLOT_WORDS - 1] };
    let head = words[W_HEAD];
    if head != tail {
        return Err(ViewError::Torn { head, tail });
    }
    if head == 0 {
        return Err(ViewError::Unwritten);
    }
    let hist = |at: usize| {
        let mut b = [0u64; BUCKETS];
        b.copy_from_slice(&words[at..at + BUCKETS]);
        (b, words[at + BUCKETS])
    };
    let mut state = [0u64; STATE_NAMES.len()];
    state.copy_from_slice(&words[W_STATE..W_STATE + STATE_NAMES.len()]);
    let slots_read = (0..covered)
        .map(|i| {
            let s = &words[FIXED_WORDS + i * SLOT_WORDS..FIXED_WORDS + (i + 1) * SLOT_WORDS];
            Slot {
                tor: name_of(&s[..NAME_WORDS]),
                current: Window::read(&s[NAME_WORDS..]),
                last: Window::read(&s[NAME_WORDS + WINDOW_WORDS..]),
            }
        })
        .collect();
    Ok(Snapshot {
        version: head,
        updated_unix_ns: words[W_UPDATED],
        window_ns: words[W_WINDOW_NS],
        host: name_of(&words[W_HOST..W_HOST + HOST_WORDS]),
        device: name_of(&words[W_DEVICE..W_DEVICE + NAME_WORDS]),
        tor: name_of(&words[W_TOR..W_TOR + NAME_WORDS]),
        state,
        counters: words[W_COUNTERS..W_COUNTERS + counters.min(MAX_COUNTERS)].to_vec(),
        prober_delay: hist(W_PROBER_DELAY),
        responder_delay: hist(W_RESPONDER_DELAY),
        slots: slots_read,
        slots_used: used,
    })
}

/// The region itself: `region_words(slots)` words, zeroed, in an allocation of its own that
/// never moves or grows (a NIC holds its address).
///
/// Only one thread may call [`Region::update`] (the shard's); it takes `&self` because a NIC
/// (or, in tests, another thread) reads the words at the same time.
pub struct Region {
    words: Box<[AtomicU64]>,
    slots: usize,
    version: AtomicU64,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("slots", &self.slots).field("version", &self.version()).finish()
    }
}

/// What an update writes: everything but the versions.
#[derive(Debug, Clone, Default)]
pub struct Update<'a> {
    pub updated_unix_ns: u64,
    pub window_ns: u64,
    pub host: &'a str,
    pub device: &'a str,
    pub tor: &'a str,
    pub state: [u64; STATE_NAMES.len()],
    /// At most [`MAX_COUNTERS`]; the rest stay 0.
    pub counters: &'a [u64],
    pub prober_delay: ([u64; BUCKETS], u64),
    pub responder_delay: ([u64; BUCKETS], u64),
}

impl Region {
    /// A region of `slots` ToR slots, all zero (readers see [`ViewError::Unwritten`] until the
    /// first update).
    pub fn new(slots: usize) -> Self {
        let n = region_words(slots);
        let words: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        words[W_MAGIC].store(MAGIC, Ordering::Relaxed);
        words[W_VERSION].store(LAYOUT_VERSION, Ordering::Relaxed);
        words[W_LEN].store(n as u64, Ordering::Relaxed);
        words[W_SLOTS].store(slots as u64, Ordering::Relaxed);
        Self { words, slots, version: AtomicU64::new(0) }
    }

    /// The region's first byte, for registering it with a NIC.
    pub fn as_ptr(&self) -> *const u8 {
        self.words.as_ptr().cast()
    }

    /// Its length in bytes.
    pub fn len_bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Its ToR slot capacity.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The version of the last update (0: none yet).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    /// A copy of the region's bytes as a reader reading ascending addresses would take them,
    /// `upto` bytes from the start; `between` runs after each word (tests use it to update the
    /// region mid-read).
    pub fn copy_ascending(&self, upto: usize, mut between: impl FnMut(usize)) -> Vec<u8> {
        let n = (upto / 8).min(self.words.len());
        let mut out = Vec::with_capacity(n * 8);
        for i in 0..n {
            out.extend_from_slice(&self.words[i].load(Ordering::Acquire).to_le_bytes());
            between(i);
        }
        out
    }

    /// Publishes one update: tails, then `u` and `slots` (name, current, last per slot in use;
    /// beyond the capacity they are dropped), then the head. Plain stores; no allocation.
    pub fn update<'s>(&self, u: &Update<'_>, slots: impl ExactSizeIterator<Item = (&'s str, &'s Window, &'s Window)>) {
        let v = self.version() + 1;
        let used = slots.len().min(self.slots);
        let w = &self.words;
        let put = |at: usize, x: u64| w[at].store(x, Ordering::Relaxed);
        // Phase 1: every tail, so a reader that reaches any of them after this sees `v`.
        put(W_FIXED_TAIL, v);
        for i in 0..self.slots {
            put(FIXED_WORDS + (i + 1) * SLOT_WORDS - 1, v);
        }
        fence(Ordering::Release);
        // Phase 2: the body.
        put(W_SLOTS_USED, used as u64);
        put(W_UPDATED, u.updated_unix_ns);
        put(W_WINDOW_NS, u.window_ns);
        for (i, x) in name_words::<HOST_WORDS>(u.host).into_iter().enumerate() {
            put(W_HOST + i, x);
        }
        for (i, x) in name_words::<NAME_WORDS>(u.device).into_iter().enumerate() {
            put(W_DEVICE + i, x);
        }
        for (i, x) in name_words::<NAME_WORDS>(u.tor).into_iter().enumerate() {
            put(W_TOR + i, x);
        }
        for (i, x) in u.state.iter().enumerate() {
            put(W_STATE + i, *x);
        }
        for i in 0..COUNTER_WORDS {
            put(W_COUNTERS + i, u.counters.get(i).copied().unwrap_or(0));
        }
        for (at, (b, sum)) in [(W_PROBER_DELAY, &u.prober_delay), (W_RESPONDER_DELAY, &u.responder_delay)] {
            for (i, x) in b.iter().enumerate() {
                put(at + i, *x);
            }
            put(at + BUCKETS, *sum);
        }
        for (i, (name, current, last)) in slots.take(used).enumerate() {
            let at = FIXED_WORDS + i * SLOT_WORDS;
            for (j, x) in name_words::<NAME_WORDS>(name).into_iter().enumerate() {
                put(at + j, x);
            }
            for (j, x) in current.words().chain(last.words()).enumerate() {
                put(at + NAME_WORDS + j, x);
            }
        }
        fence(Ordering::Release);
        // Phase 3: the head.
        put(W_HEAD, v);
        self.version.store(v, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(n: u64) -> Window {
        Window { outcomes: [n; OUTCOMES.len()], rtt_buckets: [n; BUCKETS], rtt_sum_ns: n }
    }

    /// An update whose every number is `n`.
    fn publish(r: &Region, n: u64, tors: &[String], w: &Window) {
        let counters = [n; 10];
        let u = Update {
            updated_unix_ns: n,
            window_ns: 10_000_000_000,
            host: "tor0-h0",
            device: "rxe_tor0-h0",
            tor: "tor0",
            state: [n; STATE_NAMES.len()],
            counters: &counters,
            prober_delay: ([n; BUCKETS], n),
            responder_delay: ([n; BUCKETS], n),
        };
        r.update(&u, tors.iter().map(|t| (t.as_str(), w, w)));
    }

    /// Every number of a snapshot is the same `n` (an update's), and the version is `n` too
    /// when updates are numbered from 1.
    fn consistent(s: &Snapshot) -> bool {
        let n = s.updated_unix_ns;
        s.version == n
            && s.state.iter().all(|x| *x == n)
            && s.counters.iter().all(|x| *x == n)
            && s.prober_delay.0.iter().all(|x| *x == n)
            && s.slots.iter().all(|sl| sl.current == window(n) && sl.last == window(n))
    }

    #[test]
    fn round_trip_of_names_counters_and_slots() {
        let r = Region::new(4);
        assert_eq!(read(&r.copy_ascending(r.len_bytes(), |_| {}), 10), Err(ViewError::Unwritten));
        let tors: Vec<String> = vec!["tor1".into(), "a-very-long-tor-name-beyond-thirty-two-bytes".into()];
        publish(&r, 1, &tors, &window(1));
        let s = read(&r.copy_ascending(r.len_bytes(), |_| {}), 10).unwrap();
        assert!(consistent(&s), "{s:?}");
        assert_eq!((s.host.as_str(), s.device.as_str(), s.tor.as_str()), ("tor0-h0", "rxe_tor0-h0", "tor0"));
        assert_eq!(
            s.slots.iter().map(|s| s.tor.as_str()).collect::<Vec<_>>(),
            ["tor1", "a-very-long-tor-name-beyond-thi"]
        );
        assert_eq!((s.slots_used, s.read_bytes()), (2, 8 * region_words(2)));
        assert_eq!(s.state("targets"), Some(1));
        // A prefix covering the header, the fixed part and the slots in use is enough.
        let prefix = read(&r.copy_ascending(s.read_bytes(), |_| {}), 10).unwrap();
        assert_eq!(prefix, s);
        // One slot fewer is still a consistent snapshot, of fewer slots.
        let shorter = read(&r.copy_ascending(s.read_bytes() - 8, |_| {}), 10).unwrap();
        assert_eq!(shorter.slots.len(), 1);
    }

    /// An update between the two halves of a read is always caught, wherever the read is
    /// split, and whether or not the read covers the slots.
    #[test]
    fn an_update_during_the_read_is_a_torn_read_at_every_split() {
        let tors: Vec<String> = (0..3).map(|i| format!("tor{i}")).collect();
        for upto_slots in [0usize, 3] {
            let words = region_words(upto_slots);
            for split in 0..words {
                let r = Region::new(3);
                publish(&r, 1, &tors, &window(1));
                // The update must run mid-read, with the region borrowed for reading: read the
                // two halves around it.
                let first = r.copy_ascending(8 * (split + 1), |_| {});
                publish(&r, 2, &tors, &window(2));
                let rest = r.copy_ascending(8 * words, |_| {});
                let mut bytes = first;
                bytes.extend_from_slice(&rest[8 * (split + 1)..]);
                match read(&bytes, 10) {
                    // Splits inside the header's fixed words before the head, or after the
                    // last tail, read one update whole.
                    Ok(s) => assert!(consistent(&s), "split {split}: accepted a mix {s:?}"),
                    Err(ViewError::Torn { head, tail }) => assert_eq!((head, tail), (1, 2), "split {split}"),
                    Err(e) => panic!("split {split}: {e}"),
                }
            }
        }
    }

    /// A writer thread updating as fast as it can and a reader copying word by word: every
    /// snapshot accepted is one update's, and torn reads are seen and retried.
    #[test]
    fn concurrent_reads_accept_only_whole_updates() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let tors: Vec<String> = (0..8).map(|i| format!("tor{i}")).collect();
        let r = Arc::new(Region::new(8));
        publish(&r, 1, &tors, &window(1));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, r2) = (stop.clone(), r.clone());
        let writer = std::thread::spawn(move || {
            let mut n = 2;
            while !s2.load(Ordering::Relaxed) {
                publish(&r2, n, &tors, &window(n));
                n += 1;
            }
        });
        let (mut ok, mut torn) = (0u32, 0u32);
        while (ok < 200 || torn == 0) && ok + torn < 2_000_000 {
            let bytes = r.copy_ascending(r.len_bytes(), |i| {
                if i % 64 == 0 {
                    std::hint::spin_loop();
                }
            });
            match read(&bytes, 10) {
                Ok(s) => {
                    assert!(consistent(&s), "accepted a mix: {s:?}");
                    ok += 1;
                }
                Err(ViewError::Torn { .. }) => torn += 1,
                Err(e) => panic!("{e}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(r.version() > 1);
        assert!(ok > 0 && torn > 0, "ok {ok}, torn {torn}: the test did not force a torn read");
    }

    #[test]
    fn grants_round_trip_and_foreign_ones_are_refused() {
        let g = Grant { addr: 0x7f00_1234_5678, rkey: 0xabcd, len: 8 * region_words(3) as u32 };
        let mut padded = g.encode().to_vec();
        padded.resize(196, 0);
        assert_eq!(Grant::decode(&padded), Ok(g));
        assert!(matches!(Grant::decode(&padded[..10]), Err(ViewError::Short { what: "grant", .. })));
        assert!(matches!(Grant::decode(&[0u8; 24]), Err(ViewError::Foreign(0))));
        padded[4] = 9;
        assert_eq!(Grant::decode(&padded), Err(ViewError::Version { found: 9 }));
    }

    #[test]
    fn foreign_short_and_future_regions_are_refused_by_name() {
        let r = Region::new(1);
        publish(&r, 1, &[], &window(1));
        let good = r.copy_ascending(r.len_bytes(), |_| {});
        assert!(matches!(read(&good[..16], 0), Err(ViewError::Short { what: "header", .. })));
        assert!(matches!(read(&good[..8 * 100], 0), Err(ViewError::Short { what: "fixed part", .. })));
        let mut foreign = good.clone();
        foreign[0] ^= 1;
        assert!(matches!(read(&foreign, 0), Err(ViewError::Foreign(_))));
        let mut future = good.clone();
        future[8] = 2;
        assert_eq!(read(&future, 0), Err(ViewError::Version { found: 2 }));
        let mut lying = good;
        lying[8 * W_SLOTS_USED] = 5;
        assert!(matches!(read(&lying, 0), Err(ViewError::Inconsistent { .. })));
    }
}
