//! Window summaries: what a shard's probes of one wall-clock window add up to, written beside
//! the raw records so that analysis can count without reading every probe.
//!
//! A [`WindowSummary`] covers one window (`start_unix_ns` a multiple of `window_ns`, aligned on
//! the Unix epoch so that every agent's windows line up) and holds, per (prober, target, flow
//! label) key, the probes by [`Class`], the first and last send times, and log-linear histograms
//! ([`bucket_of`]) of the ok probes' network RTT and both host-delay legs, by timestamp source.
//! Within a ToR the flow label chooses no path, so probes whose two ends share a ToR are keyed
//! under [`ALL_LABELS`]. It also holds the shard's own noise: sends its schedule made late, and
//! the spans in which it fell behind by more than [`STALL_NS`] (a frozen host's timers fire
//! when it thaws; the shard knows when that happened and need not be inferred from its records).
//!
//! Summaries are additive: a window may be summarised in parts (a segment that closes mid-window
//! carries the part it holds, the next segment the rest; a record that completes after its
//! window was closed opens a part of its own), and any reader sums the parts of one window.
//! Every part is built from records in the same file, at the flush that writes them, so a closed
//! segment's summaries count exactly its probe records, which its reader checks (the segment
//! module's `SegmentReader::summaries_complete`).
//!
//! Histograms: 32 buckets per power of two above 64 ns and one per nanosecond below, so a value
//! read back as its bucket's midpoint ([`bucket_value`]) is within [`RELATIVE_ERROR`] (1/64,
//! 1.6%) of what was measured, and any quantile within the same bound of the exact one.

use std::collections::HashMap;

use rkyv::{Archive, Deserialize, Serialize};

use crate::record::{Class, ProbeColumns};

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Values below this have a bucket each.
const EXACT_BELOW: u64 = 2 * SUB;
/// Buckets of a `u64` value.
pub const BUCKETS: u16 = (EXACT_BELOW + (64 - SUB_BITS as u64 - 1) * SUB) as u16;
/// The largest `|bucket_value(bucket_of(v)) - v| / v`: half a bucket's width over its lower
/// bound, which is at least [`SUB`] widths.
pub const RELATIVE_ERROR: f64 = 1.0 / (2 * SUB) as f64;

/// The window summaries are designed for, s: short enough for findings in seconds, long
/// enough to hold a few probes of each ToR-mesh peer. Agents write none unless configured
/// (`summary_window_s`); the simulator and the bench write summaries of this length.
pub const DEFAULT_WINDOW_S: u64 = 5;
/// Whether `window_s` is a summary window length a writer takes: a divisor of an hour (so that
/// every agent's windows line up and every hour starts one), or 0 for none; the error says so.
pub fn check_window_s(window_s: u64) -> Result<(), String> {
    if window_s > 3600 || (window_s > 0 && !3600u64.is_multiple_of(window_s)) {
        return Err(format!(
            "{window_s}: use a divisor of 3600 (1, 2, 5, 10, 15, 30, 60, ... 3600), or 0 for no summaries"
        ));
    }
    Ok(())
}

/// The label of a key whose probes stay under one ToR (the label chooses no path there).
pub const ALL_LABELS: u32 = u32::MAX;
/// Sends later than this past their due time are counted as late ([`WindowSummary::late_sends`]).
pub const LATE_SEND_NS: u64 = 1_000_000;
/// A schedule behind by more than this is a stall the summary lists
/// ([`WindowSummary::stalls`]): 100 ms, the floor analysis applies to a long send gap (the
/// segment module's `LONG_GAP_MIN_NS`, which a test holds equal), far beyond any scheduling
/// jitter of a healthy agent.
pub const STALL_NS: u64 = 100_000_000;
/// Stalls kept per window; more are counted in [`WindowSummary::stalls_dropped`].
pub const MAX_STALLS: usize = 32;

/// What a histogram cell measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Measure {
    /// [`crate::record::ProbeRecord::network_rtt_ns`].
    NetworkRtt = 0,
    /// [`crate::record::ProbeRecord::prober_delay_ns`].
    ProberDelay = 1,
    /// [`crate::record::ProbeRecord::responder_delay_ns`].
    ResponderDelay = 2,
}

impl Measure {
    /// Every measure, in discriminant order.
    pub const ALL: [Measure; 3] = [Measure::NetworkRtt, Measure::ProberDelay, Measure::ResponderDelay];

    /// The measure of a stored byte; `None` for one this build does not know.
    pub fn from_u8(v: u8) -> Option<Measure> {
        Measure::ALL.get(usize::from(v)).copied()
    }
}

/// The bucket of `v` ns.
#[inline]
pub fn bucket_of(v: u64) -> u16 {
    if v < EXACT_BELOW {
        return v as u16;
    }
    let e = 63 - v.leading_zeros(); // >= SUB_BITS + 1
    let shift = e - SUB_BITS;
    let sub = (v >> shift) - SUB;
    (EXACT_BELOW + u64::from(e - SUB_BITS - 1) * SUB + sub) as u16
}

/// The lowest value of `bucket` and its width (`None` past the last bucket).
pub fn bucket_bounds(bucket: u16) -> Option<(u64, u64)> {
    let b = u64::from(bucket);
    if b < EXACT_BELOW {
        return Some((b, 1));
    }
    if bucket >= BUCKETS {
        return None;
    }
    let k = b - EXACT_BELOW;
    let shift = (k / SUB) as u32 + 1;
    let sub = k % SUB;
    Some(((SUB + sub) << shift, 1 << shift))
}

/// What `bucket` reads back as: its midpoint, within [`RELATIVE_ERROR`] of every value in it.
pub fn bucket_value(bucket: u16) -> u64 {
    bucket_bounds(bucket).map_or(u64::MAX, |(lo, width)| lo + width / 2)
}

/// One histogram cell of a key: `count` ok probes whose `measure`, stamped by `ts_source`, fell
/// in `bucket`.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct Cell {
    /// Probes.
    pub count: u32,
    /// [`bucket_of`] the value.
    pub bucket: u16,
    /// [`Measure`].
    pub measure: u8,
    /// [`crate::record::TsSource`] of the probes.
    pub ts_source: u8,
}

/// One (prober, target, label)'s probes in a window.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct KeySummary {
    /// Earliest and latest T1 of its probes.
    pub first_t1_ns: u64,
    pub last_t1_ns: u64,
    /// Earliest T1 of an ok probe; `u64::MAX` when none (when a restarted target was heard).
    pub first_ok_t1_ns: u64,
    /// Dictionary ids, as the records have them.
    pub prober: u32,
    pub target: u32,
    /// The probes' flow label, or [`ALL_LABELS`] when both ends are under one ToR.
    pub flow_label: u32,
    /// The responder epoch of the last ok probe (0 when none), and how many times it changed
    /// between ok probes of the key (a restarted responder).
    pub responder_epoch: u32,
    pub epoch_changes: u32,
    /// Probes by [`Class`], in its discriminant order.
    pub counts: [u32; 7],
    /// Its cells: `cells[cells_start..cells_start + cells_len]` of the summary, by (measure,
    /// timestamp source, bucket).
    pub cells_start: u32,
    pub cells_len: u32,
    /// [`crate::record::ProbeRecord::kind`] of its last probe.
    pub kind: u8,
}

impl KeySummary {
    /// Probes of every class.
    pub fn probes(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }
}

/// One window of one writer's probes (or a part of it: summaries are additive).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct WindowSummary {
    /// The window: `[start_unix_ns, start_unix_ns + window_ns)`, start a multiple of `window_ns`.
    pub start_unix_ns: u64,
    pub window_ns: u64,
    /// The most any send of the window was late, ns.
    pub late_max_ns: u64,
    /// Sends more than [`LATE_SEND_NS`] late.
    pub late_sends: u32,
    /// Stalls beyond the first [`MAX_STALLS`].
    pub stalls_dropped: u32,
    /// (due time of the first late send, how late it left), ns, for schedules behind by more
    /// than [`STALL_NS`]; overlapping ones merged; ascending.
    pub stalls: Vec<(u64, u64)>,
    /// Keys ascending by (prober, target, flow label).
    pub keys: Vec<KeySummary>,
    pub cells: Vec<Cell>,
}

impl WindowSummary {
    /// Probes summarised.
    pub fn probes(&self) -> u64 {
        self.keys.iter().map(KeySummary::probes).sum()
    }
}

impl ArchivedWindowSummary {
    /// Probes summarised.
    pub fn probes(&self) -> u64 {
        self.keys.iter().map(|k| k.counts.iter().map(|c| u64::from(c.to_native())).sum::<u64>()).sum()
    }

    /// The cells of key `i`.
    pub fn cells_of(&self, i: usize) -> &[ArchivedCell] {
        let k = &self.keys[i];
        let start = k.cells_start.to_native() as usize;
        &self.cells[start..start + k.cells_len.to_native() as usize]
    }

    /// Why this summary cannot be true of any probes, or `None`: what a reader checks before it
    /// hands one out (a forged or damaged frame must not pass for counts).
    pub fn problem(&self) -> Option<String> {
        let (start, window) = (self.start_unix_ns.to_native(), self.window_ns.to_native());
        if window == 0 || start % window != 0 {
            return Some(format!("window of {window} ns starting at {start}: not aligned"));
        }
        let end = start.saturating_add(window);
        let mut next_cell = 0u64;
        let mut last_key = None;
        for (i, k) in self.keys.iter().enumerate() {
            let key = (k.prober.to_native(), k.target.to_native(), k.flow_label.to_native());
            if last_key.is_some_and(|last| last >= key) {
                return Some(format!("key {i} out of order"));
            }
            last_key = Some(key);
            let (first, last) = (k.first_t1_ns.to_native(), k.last_t1_ns.to_native());
            if first < start || last >= end || first > last {
                return Some(format!("key {i}: probes sent at {first}..={last}, outside the window"));
            }
            if u64::from(k.cells_start.to_native()) != next_cell {
                return Some(format!("key {i}: cells do not follow the previous key's"));
            }
            next_cell += u64::from(k.cells_len.to_native());
            if next_cell > self.cells.len() as u64 {
                return Some(format!("key {i}: cells past the summary's {}", self.cells.len()));
            }
            // No pinglist probes a target faster than MAX_RATE_PPS_PER_TARGET; a shard catching up
            // after a stall sends its overdue probes in the windows after it, so the bound is
            // PROBES_OVER_RATE times that. A summary counting more is forged or damaged (and
            // its counts would overflow what readers sum them into).
            let probes: u64 = k.counts.iter().map(|c| u64::from(c.to_native())).sum();
            let rate = crate::pinglist::MAX_RATE_PPS_PER_TARGET * PROBES_OVER_RATE;
            // Writers' windows are whole seconds (`check_window_s`); a shorter one counts as one.
            let most = ((window as f64 / 1e9).max(1.0) * rate).ceil() as u64;
            if probes > most {
                return Some(format!(
                    "key {i}: {probes} probes in a window of {window} ns, more than any pinglist sends"
                ));
            }
            let ok = u64::from(k.counts[Class::Ok as usize].to_native());
            let mut per_measure = [0u64; 3];
            let mut last_cell = None;
            for c in self.cells_of(i) {
                let Some(m) = Measure::from_u8(c.measure) else {
                    return Some(format!("key {i}: a cell of unknown measure {}", c.measure));
                };
                let at = (c.measure, c.ts_source, c.bucket.to_native());
                if c.bucket.to_native() >= BUCKETS || c.count.to_native() == 0 || last_cell.is_some_and(|l| l >= at) {
                    return Some(format!("key {i}: a cell out of range or out of order"));
                }
                last_cell = Some(at);
                per_measure[m as usize] += u64::from(c.count.to_native());
            }
            if per_measure.iter().any(|&n| n != ok) {
                return Some(format!("key {i}: histograms hold {per_measure:?} probes where {ok} were ok"));
            }
        }
        if next_cell != self.cells.len() as u64 {
            return Some("cells no key owns".into());
        }
        if self.stalls.len() > MAX_STALLS {
            return Some(format!("{} stalls, more than {MAX_STALLS}", self.stalls.len()));
        }
        None
    }
}

/// The frame payload: the summaries one flush closed.
pub type WindowSummaries = Vec<WindowSummary>;

/// Windows a summariser keeps open at once, at least; more where the grace spans more
/// windows (`Summariser::new`), up to [`MAX_OPEN_CAP`]. A record past them closes the oldest.
const MAX_OPEN: usize = 4;
/// The most windows ever open at once (1 s windows under a grace of a minute).
const MAX_OPEN_CAP: usize = 64;
/// Closed summaries kept while none can be written (no segment can be opened: a full disk);
/// older ones are dropped and counted.
const MAX_READY: usize = 256;

/// One open window: counters by key and cells, in tables reused from window to window, so that
/// a shard's steady state allocates nothing per probe.
#[derive(Debug, Default)]
struct Open {
    start: u64,
    /// (prober << 32 | target, label) -> index into `keys`.
    index: HashMap<(u64, u32), u32, Fixed>,
    keys: Vec<KeySummary>,
    /// [`cell_key`] -> probes.
    cells: HashMap<u64, u32, Fixed>,
    late_max_ns: u64,
    late_sends: u32,
    stalls: Vec<(u64, u64)>,
    stalls_dropped: u32,
}

impl Open {
    fn reset(&mut self, start: u64) {
        self.start = start;
        self.index.clear();
        self.keys.clear();
        self.cells.clear();
        (self.late_max_ns, self.late_sends, self.stalls_dropped) = (0, 0, 0);
        self.stalls.clear();
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.late_sends == 0 && self.late_max_ns == 0
    }

    /// Bytes its summary archives to, at most.
    fn bound(&self) -> usize {
        summary_bound(self.keys.len(), self.cells.len(), self.stalls.len())
    }

    fn summary(&self, window_ns: u64) -> WindowSummary {
        let mut order: Vec<u32> = (0..self.keys.len() as u32).collect();
        let key = |i: &u32| {
            let k = &self.keys[*i as usize];
            (k.prober, k.target, k.flow_label)
        };
        order.sort_unstable_by_key(key);
        // Sorted as packed words (key, measure, source, bucket): a window holds a few cells per
        // probe, and sorting tuples field by field was most of the summariser's time.
        let mut cells: Vec<(u64, u32)> = self.cells.iter().map(|(&c, &n)| (c, n)).collect();
        cells.sort_unstable_by_key(|c| c.0);
        let mut keys = Vec::with_capacity(order.len());
        let mut out = Vec::with_capacity(cells.len());
        for i in order {
            let mut k = self.keys[i as usize];
            let from = cells.partition_point(|c| (c.0 >> 32) < u64::from(i));
            let to = cells.partition_point(|c| (c.0 >> 32) <= u64::from(i));
            k.cells_start = out.len() as u32;
            k.cells_len = (to - from) as u32;
            out.extend(cells[from..to].iter().map(|&(c, count)| Cell {
                count,
                bucket: c as u16,
                measure: (c >> 24) as u8,
                ts_source: (c >> 16) as u8,
            }));
            keys.push(k);
        }
        WindowSummary {
            start_unix_ns: self.start,
            window_ns,
            late_max_ns: self.late_max_ns,
            late_sends: self.late_sends,
            stalls_dropped: self.stalls_dropped,
            stalls: self.stalls.clone(),
            keys,
            cells: out,
        }
    }
}

/// A histogram cell's place in an open window's table: key index, measure, timestamp source and
/// bucket in one word, hashed once.
#[inline]
fn cell_key(key: u32, measure: Measure, ts_source: u8, bucket: u16) -> u64 {
    (u64::from(key) << 32) | (u64::from(measure as u8) << 24) | (u64::from(ts_source) << 16) | u64::from(bucket)
}

/// How many times the fastest pinglist rate a key of a summary may count (see `problem`).
const PROBES_OVER_RATE: f64 = 16.0;

/// The open windows' tables hash integers the writer chose (its own dictionary ids, labels,
/// buckets), never bytes a peer sent: a fast fixed hash, not SipHash, which took most of the
/// fold's time.
type Fixed = foldhash::fast::FixedState;

/// Bytes a summary of `keys` keys, `cells` cells and `stalls` stalls archives to, at most.
pub fn summary_bound(keys: usize, cells: usize, stalls: usize) -> usize {
    128 + keys * size_of::<ArchivedKeySummary>() + cells * size_of::<ArchivedCell>() + stalls * 16 + 64
}

/// Builds a writer's window summaries from the records it writes (the segment writer owns one).
#[derive(Debug)]
pub struct Summariser {
    window_ns: u64,
    grace_ns: u64,
    open: Vec<Open>,
    spare: Vec<Open>,
    /// Closed, not yet written.
    ready: Vec<WindowSummary>,
    /// Latest T1 folded: windows that ended a grace before it are closed.
    watermark: u64,
    /// Windows open at once at most (see [`MAX_OPEN`]).
    max_open: usize,
    /// Parts of a window opened for records that came after its summary was closed (a probe
    /// completing more than the grace after its window ended).
    pub late_parts: u64,
    /// Closed summaries dropped unwritten ([`MAX_READY`]).
    pub dropped: u64,
    /// Which dictionary ids are RNICs under one ToR with the writer's (their probes' label
    /// chooses no path): ids of the writer's dictionary, grown as it grows.
    same_tor: Vec<bool>,
}

impl Summariser {
    /// Summaries of `window_ns` windows, each closed once a record sent `grace_ns` after its end
    /// has been written (records are written when their probe completes, up to a timeout after
    /// it was sent).
    pub fn new(window_ns: u64, grace_ns: u64) -> Summariser {
        // A window stays open until a grace past its end: the windows the grace spans, the one
        // it ends in, the current one and one spare.
        let spanned = usize::try_from(grace_ns / window_ns.max(1)).unwrap_or(usize::MAX).saturating_add(3);
        let max_open = spanned.clamp(MAX_OPEN, MAX_OPEN_CAP);
        Summariser {
            window_ns,
            grace_ns,
            open: Vec::with_capacity(max_open + 1),
            spare: Vec::with_capacity(max_open + 1),
            ready: Vec::new(),
            watermark: 0,
            max_open,
            late_parts: 0,
            dropped: 0,
            same_tor: Vec::new(),
        }
    }

    /// How long after its end a window is closed.
    pub fn grace_ns(&self) -> u64 {
        self.grace_ns
    }

    /// Close windows `grace_ns` after their end from now on (no more than the grace given to
    /// [`Summariser::new`], which sized the windows held open).
    pub fn set_grace(&mut self, grace_ns: u64) {
        self.grace_ns = grace_ns;
    }

    /// Dictionary id `id` is (`true`) or is not an endpoint under the writer's own ToR.
    pub fn set_same_tor(&mut self, id: u32, same: bool) {
        let id = id as usize;
        if self.same_tor.len() <= id {
            self.same_tor.resize(id + 1, false);
        }
        self.same_tor[id] = same;
    }

    fn window(&mut self, t_ns: u64, record: bool) -> &mut Open {
        let start = t_ns - t_ns % self.window_ns;
        if let Some(i) = self.open.iter().rposition(|o| o.start == start) {
            return &mut self.open[i];
        }
        if record && start.saturating_add(self.window_ns).saturating_add(self.grace_ns) <= self.watermark {
            self.late_parts += 1;
        }
        if self.open.len() >= self.max_open {
            let oldest = (0..self.open.len()).min_by_key(|&i| self.open[i].start).unwrap_or(0);
            let o = self.open.swap_remove(oldest);
            self.close(o);
        }
        let mut o = self.spare.pop().unwrap_or_default();
        o.reset(start);
        self.open.push(o);
        let last = self.open.len() - 1;
        &mut self.open[last]
    }

    fn close(&mut self, o: Open) {
        if !o.is_empty() {
            if self.ready.len() >= MAX_READY {
                self.ready.remove(0);
                self.dropped += 1;
            }
            self.ready.push(o.summary(self.window_ns));
        }
        self.spare.push(o);
    }

    /// Count `cols` (records just written), then close the windows the newest of them has left
    /// a grace behind.
    pub fn fold(&mut self, cols: &ProbeColumns) {
        for i in 0..cols.t1_unix_ns.len() {
            let t1 = cols.t1_unix_ns[i];
            self.watermark = self.watermark.max(t1);
            let (prober, target) = (cols.prober[i], cols.target[i]);
            let same_tor = self.same_tor.get(target as usize).copied().unwrap_or(false);
            let label = if same_tor { ALL_LABELS } else { cols.flow_label[i] };
            let class = Class::of(cols.outcome[i], cols.arrived[i]);
            let o = self.window(t1, true);
            let next = o.keys.len() as u32;
            let k = *o.index.entry(((u64::from(prober) << 32) | u64::from(target), label)).or_insert(next);
            if k == next {
                o.keys.push(KeySummary {
                    first_t1_ns: t1,
                    last_t1_ns: t1,
                    first_ok_t1_ns: u64::MAX,
                    prober,
                    target,
                    flow_label: label,
                    ..KeySummary::default()
                });
            }
            let key = &mut o.keys[k as usize];
            key.first_t1_ns = key.first_t1_ns.min(t1);
            key.last_t1_ns = key.last_t1_ns.max(t1);
            key.kind = cols.kind[i];
            key.counts[class as usize] += 1;
            if class != Class::Ok {
                continue;
            }
            key.first_ok_t1_ns = key.first_ok_t1_ns.min(t1);
            let epoch = cols.responder_epoch[i];
            if key.responder_epoch != 0 && key.responder_epoch != epoch {
                key.epoch_changes += 1;
            }
            key.responder_epoch = epoch;
            let ts = cols.ts_source[i];
            let values = [cols.network_rtt_ns[i], cols.prober_delay_ns[i], cols.responder_delay_ns[i]];
            for (m, v) in Measure::ALL.into_iter().zip(values) {
                *o.cells.entry(cell_key(k, m, ts, bucket_of(v.max(0) as u64))).or_default() += 1;
            }
        }
        let cut = self.watermark.saturating_sub(self.grace_ns);
        while let Some(i) = self.open.iter().position(|o| o.start.saturating_add(self.window_ns) <= cut) {
            let o = self.open.swap_remove(i);
            self.close(o);
        }
    }

    /// A send due at `due_ns` left `late_ns` late (the shard's own schedule slipping).
    pub fn note_late(&mut self, due_ns: u64, late_ns: u64) {
        let o = self.window(due_ns, false);
        o.late_max_ns = o.late_max_ns.max(late_ns);
        o.late_sends += u32::from(late_ns > LATE_SEND_NS);
        if late_ns <= STALL_NS {
            return;
        }
        let end = due_ns.saturating_add(late_ns);
        let full = o.stalls.len() >= MAX_STALLS;
        match o.stalls.last_mut() {
            Some(last) if due_ns <= last.0.saturating_add(last.1) => {
                last.1 = last.1.max(end.saturating_sub(last.0));
            }
            _ if full => o.stalls_dropped += 1,
            _ => o.stalls.push((due_ns, late_ns)),
        }
    }

    /// Close every open window (the segment holding their records is closing).
    pub fn close_all(&mut self) {
        while let Some(o) = self.open.pop() {
            self.close(o);
        }
    }

    /// Closed summaries not yet written, oldest first.
    pub fn ready(&mut self) -> &WindowSummaries {
        self.ready.sort_by_key(|s| s.start_unix_ns);
        &self.ready
    }

    /// Move the closed summaries onto `out`, oldest first (written; kept for a live push).
    pub fn take_ready_into(&mut self, out: &mut Vec<WindowSummary>) {
        self.ready.sort_by_key(|s| s.start_unix_ns);
        out.append(&mut self.ready);
    }

    /// Forget the closed summaries (written, or belonging to a segment that closed without
    /// them).
    pub fn clear_ready(&mut self) {
        self.ready.clear();
    }

    /// Closed summaries not yet written, oldest first, taken (tests look at them so).
    #[cfg(test)]
    pub(crate) fn take_ready(&mut self) -> WindowSummaries {
        let ready = self.ready().clone();
        self.clear_ready();
        ready
    }

    /// Bytes the summaries of every open and closed window archive to, at most, plus what
    /// `records` more records sent over `span_ns` could add: a key and three cells each, and a
    /// window of their own for every window they span (records in send order, as a shard's
    /// nearly are; a pathological order can open more, and then the summaries do not fit and
    /// are dropped, never the records).
    pub fn bound(&self, records: usize, span_ns: u64) -> usize {
        let open: usize = self.open.iter().map(Open::bound).sum();
        let ready: usize = self.ready.iter().map(|s| summary_bound(s.keys.len(), s.cells.len(), s.stalls.len())).sum();
        let spanned = usize::try_from(span_ns / self.window_ns.max(1)).unwrap_or(usize::MAX).saturating_add(2);
        let windows = if records == 0 { 0 } else { spanned.min(records) };
        64 + open + ready + windows * summary_bound(0, 0, 0) + summary_bound(records, 3 * records, 0)
    }

    /// Whether nothing is open or waiting.
    #[cfg(test)]
    fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.open.iter().all(Open::is_empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_reads_back_within_the_stated_error() {
        let mut v = 0u64;
        let mut last_bucket = 0;
        // Every value below 2^16, then a geometric walk with odd offsets up to u64::MAX.
        while v < u64::MAX / 2 {
            let b = bucket_of(v);
            assert!(b >= last_bucket && b < BUCKETS, "{v}: bucket {b}");
            last_bucket = b;
            let (lo, width) = bucket_bounds(b).expect("a bucket of a value has bounds");
            assert!(lo <= v && v - lo < width, "{v} outside bucket {b} = [{lo}, +{width})");
            let back = bucket_value(b);
            let err = back.abs_diff(v) as f64;
            assert!(err <= RELATIVE_ERROR * v as f64, "{v} reads back as {back}");
            v = if v < 1 << 16 { v + 1 } else { v + v / 37 + 3 };
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_bounds(BUCKETS), None);
        const { assert!(RELATIVE_ERROR <= 0.03, "the stated bound: 3%") };
    }

    fn cols(rows: &[(u64, u32, u32, u8, i32)]) -> ProbeColumns {
        let mut c = ProbeColumns::with_capacity(rows.len());
        for &(t1, target, label, outcome, rtt) in rows {
            c.push(&crate::record::ProbeRecord {
                t1_unix_ns: t1,
                network_rtt_ns: rtt,
                prober_delay_ns: 2_000,
                responder_delay_ns: 3_000,
                prober: 0,
                target,
                flow_label: label,
                responder_epoch: 7,
                outcome,
                arrived: if outcome == 0 { 7 } else { 1 },
                ..Default::default()
            });
        }
        c
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn windows_close_a_grace_after_their_end_and_late_records_open_a_part() {
        let mut s = Summariser::new(5 * S, 2 * S);
        s.set_same_tor(1, true);
        // Window [100, 105) s: target 1 (same ToR, labels merged), target 2 over two labels.
        let c = cols(&[
            (100 * S, 1, 5, 0, 10_000),
            (101 * S, 1, 6, 0, 10_100),
            (102 * S, 2, 5, 1, 0),
            (103 * S, 2, 6, 0, 20_000),
            (106 * S, 2, 6, 0, 20_000),
        ]);
        s.fold(&c);
        assert!(s.take_ready().is_empty(), "106 s is not a grace past 105 s");
        let c2 = cols(&[(107 * S, 2, 6, 0, 20_000), (104 * S, 1, 5, 0, 9_000)]);
        s.fold(&c2);
        let ready = s.take_ready();
        assert_eq!(ready.len(), 1);
        let w = &ready[0];
        assert_eq!((w.start_unix_ns, w.probes()), (100 * S, 5));
        let keys: Vec<(u32, u32, [u32; 7])> = w.keys.iter().map(|k| (k.target, k.flow_label, k.counts)).collect();
        assert_eq!(
            keys,
            [(1, ALL_LABELS, [3, 0, 0, 0, 0, 0, 0]), (2, 5, [0, 1, 0, 0, 0, 0, 0]), (2, 6, [1, 0, 0, 0, 0, 0, 0])]
        );
        // One RTT cell per distinct bucket, 10,000 and 10,100 ns within one bucket (width 256).
        let rtt: Vec<(u64, u32)> = w
            .cells
            .iter()
            .take(w.keys[0].cells_len as usize)
            .filter(|c| c.measure == Measure::NetworkRtt as u8)
            .map(|c| (bucket_value(c.bucket), c.count))
            .collect();
        assert_eq!(rtt.iter().map(|r| r.1).sum::<u32>(), 3);
        assert_eq!(rtt.len(), 2, "{rtt:?}");
        // A record of the closed window opens a part of its own, counted.
        s.fold(&cols(&[(104 * S, 1, 5, 0, 9_000)]));
        assert_eq!(s.late_parts, 1);
        s.close_all();
        let parts: Vec<(u64, u64)> = s.take_ready().iter().map(|w| (w.start_unix_ns / S, w.probes())).collect();
        assert_eq!(parts, [(100, 1), (105, 2)]);
        assert!(s.is_idle());
    }

    #[test]
    fn the_schedule_slipping_is_noted_in_its_window() {
        let mut s = Summariser::new(5 * S, 2 * S);
        s.note_late(100 * S, 2_000_000);
        s.note_late(101 * S, 300_000_000);
        // Due during the stall, sent at the same thaw: one stall.
        s.note_late(101 * S + 100_000_000, 200_000_000);
        s.note_late(103 * S, 150_000_000);
        for i in 0..40 {
            s.note_late(104 * S + i * 20_000_000, 101_000_000 - i * 1_000_000);
        }
        s.close_all();
        let w = &s.take_ready()[0];
        assert_eq!(w.late_sends, 44);
        assert_eq!(w.late_max_ns, 300_000_000);
        assert_eq!(&w.stalls[..2], &[(101 * S, 300_000_000), (103 * S, 150_000_000)]);
        assert!(w.stalls.len() <= MAX_STALLS);
    }

    #[test]
    fn a_checked_summary_is_one_the_summariser_writes_and_forgeries_are_named() {
        let mut s = Summariser::new(5 * S, 2 * S);
        s.fold(&cols(&[(100 * S, 1, 5, 0, 10_000), (101 * S, 2, 6, 0, 30_000), (102 * S, 2, 6, 1, 0)]));
        s.close_all();
        let ready = s.take_ready();
        let check = |w: &WindowSummary| {
            let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(w).expect("serialise");
            let a = rkyv::access::<ArchivedWindowSummary, rkyv::rancor::Error>(&bytes).expect("access");
            a.problem()
        };
        assert_eq!(check(&ready[0]), None);
        let forge = |f: &dyn Fn(&mut WindowSummary)| {
            let mut w = ready[0].clone();
            f(&mut w);
            check(&w).expect("a forgery is named")
        };
        assert!(forge(&|w| w.start_unix_ns += 1).contains("not aligned"));
        assert!(forge(&|w| w.keys[0].counts[0] += 1).contains("histograms hold"));
        assert!(forge(&|w| w.keys[1].target = 0).contains("out of order"));
        assert!(forge(&|w| w.keys[1].last_t1_ns = 200 * S).contains("outside the window"));
        assert!(forge(&|w| w.cells[0].bucket = BUCKETS).contains("out of range"));
        assert!(forge(&|w| w.keys[1].cells_len += 1).contains("past the summary"));
        // Lost probes need no cells: only the rate bound stops a count that would overflow
        // what readers sum (16 x 1,000/s over 5 s is 80,000).
        assert_eq!(
            check(&{
                let mut w = ready[0].clone();
                w.keys[0].counts[Class::Lost as usize] = 79_000;
                w
            }),
            None
        );
        assert!(forge(&|w| w.keys[0].counts[Class::Lost as usize] = u32::MAX).contains("more than any pinglist"));
    }
}
