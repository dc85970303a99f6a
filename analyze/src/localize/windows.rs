//! Stages 1 to 3 fed by window summaries ([`crate::ingest::Windows`]) instead of records: the
//! same baselines, noise and counters per (window, prober, target, label), from per-key counts
//! and histograms, for the stages after them to run unchanged ([`super::localize_windows`]).
//!
//! Where a summary holds less than the records, the rule is said where it is applied:
//! - a value is its bucket's midpoint, within `formats::window::RELATIVE_ERROR` (1/64): a
//!   probe is slow, a leg late or a stall's, when its bucket's midpoint is above the threshold;
//! - baselines are computed from the histograms expanded at bucket midpoints, one probe in the
//!   records' stride over the whole input (a source thinner than that whole, as for records),
//!   and the p99 of a probe's larger host delay from the
//!   prober and responder delays' histograms taken as independent (`P(max <= x) = F_pd(x)
//!   F_rd(x)`), since a summary keeps no pairs;
//! - a probe's send time is known to its key's span in a summary window (5 s by default):
//!   late host delays are dated to that span, which widens a cluster and so weakens the stall
//!   test for a short freeze (its Poisson null grows with the span), and a stall leaves out a
//!   key's probes in every summary window its padded span touches (records: only the probes
//!   within the pad);
//! - a frozen host is also one whose shard said its schedule slipped by more than its send gaps
//!   must be (twice its usual spacing plus 100 ms, `formats::segment::send_gaps`' rule);
//! - a restarted target is heard again at its key's first ok send after the restart, or at the
//!   key's last send where the responder's epoch changed inside the key.

use super::Options;
use super::baseline::{Baselines, SAMPLE_MIN, SAMPLE_TARGET, SHIFT_SAMPLE_TARGET, ends_inter};
use super::noise::{Agents, Hosts, NoiseScan, Own, ScannedBlock, host_in_rtt};
use super::tally::{
    Acc, Block, BlockTally, Key, NO_LABEL, RangeTally, Tally, TallyContext, crosses_fabric, first_heard,
};
use crate::ingest::{Dataset, KeyCell, WindowKey, Windows};
use crate::probe::{Class, TS_CODES, TsSources};
use rocemesh_formats::window::{BUCKETS, Measure, bucket_value};
use std::collections::HashMap;
use std::ops::Range;

/// A histogram of the whole input: a count per bucket, dense (a few of them, 15 KiB each).
#[derive(Clone)]
struct Hist(Vec<u64>);

impl Default for Hist {
    fn default() -> Self {
        Hist(vec![0; usize::from(BUCKETS)])
    }
}

impl Hist {
    fn add(&mut self, bucket: u16, n: u64) {
        if let Some(x) = self.0.get_mut(usize::from(bucket)) {
            *x += n;
        }
    }

    /// (bucket, count) of the non-empty buckets, ascending.
    fn iter(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.0.iter().enumerate().filter(|(_, n)| **n > 0).map(|(b, &n)| (b as u16, n))
    }

    fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// Whether `k`'s probes run between two ToRs (by its ends, as records are judged).
fn is_inter(k: &WindowKey, tor_of: &[u32]) -> bool {
    ends_inter(tor_of, k.prober, k.target, k.kind)
}

/// The analysis window of `k`.
fn window_of(k: &WindowKey, window_ns: u64) -> u32 {
    (k.start_ns / window_ns) as u32
}

/// A histogram given as (bucket, count) ascending, as values at bucket midpoints, one per
/// `stride` probes (a stride that keeps every bucket's share, rounding aside).
fn expand(h: impl Iterator<Item = (u16, u64)>, stride: u64) -> Vec<f64> {
    let stride = stride.max(1);
    let mut out = Vec::new();
    let mut cum = 0u64;
    for (b, n) in h {
        let take = (cum + n) / stride - cum / stride;
        cum += n;
        out.extend(std::iter::repeat_n(bucket_value(b).max(1) as f64, take as usize));
    }
    out
}

/// The smallest bucket midpoint at which `P(pd <= x) P(rd <= x)` reaches 0.99: the p99 of a
/// probe's larger host delay, the two taken as independent.
fn max_p99(pd: &Hist, rd: &Hist) -> i64 {
    let (np, nr) = (pd.total() as f64, rd.total() as f64);
    if np == 0.0 || nr == 0.0 {
        return 0;
    }
    let (mut cp, mut cr) = (0u64, 0u64);
    let mut last = 0;
    for (b, (p, r)) in pd.0.iter().zip(&rd.0).enumerate().filter(|(_, (p, r))| **p + **r > 0) {
        cp += p;
        cr += r;
        last = b as u16;
        if (cp as f64 / np) * (cr as f64 / nr) >= 0.99 {
            break;
        }
    }
    i64::try_from(bucket_value(last)).unwrap_or(i64::MAX)
}

/// Stage 1 from summaries: [`Baselines`] from the ok probes' histograms.
/// The keys are counted in blocks on every core ([`super::in_blocks`]), whose counts add.
pub(super) fn baselines(w: &Windows, tor_of: &[u32], opts: &Options, window_ns: u64) -> Baselines {
    let parts = super::in_blocks(w.keys(), |_, r| {
        let mut c = BaselineCounts::default();
        for (k, cells) in w.keys_in(r) {
            c.add(k, cells, tor_of, window_ns);
        }
        c
    });
    let mut parts = parts.into_iter();
    let mut counts = parts.next().unwrap_or_default();
    for c in parts {
        counts.merge(&c);
    }
    counts.probes = w.probes;
    counts.baselines(opts)
}

/// What stage 1 takes from summaries, which adds up over keys and windows: the ok probes'
/// histograms by source and scope, the ToR-mesh RTTs by (window, source, ToR), the probes.
/// The live analyzer keeps one per window and sums the recent ones, so that its baselines are
/// those of the recent windows' keys without keeping the keys.
#[derive(Clone, Default)]
pub struct BaselineCounts {
    rtt: [[Hist; 2]; TS_CODES],
    legs: [[Hist; 2]; TS_CODES],
    /// The ToR-mesh RTTs by (window, source, ToR, bucket): sparse, since a long input has many
    /// windows and each ToR's RTTs fill few buckets.
    shift: HashMap<(u32, usize, u32, u16), u64, foldhash::fast::RandomState>,
    /// Probes of every class in the keys added (the sampling strides follow it).
    pub probes: u64,
}

impl std::fmt::Debug for BaselineCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaselineCounts").field("probes", &self.probes).field("shift_cells", &self.shift.len()).finish()
    }
}

impl BaselineCounts {
    /// Adds one key's cells. `tor_of` gives each RNIC id a ToR id (any numbering that gives
    /// one ToR one id: ToR-mesh and inter-ToR keys are told apart, and the RTT shift is voted,
    /// by it); `probes` is left to the caller.
    pub fn add(&mut self, k: &WindowKey, cells: &[KeyCell], tor_of: &[u32], window_ns: u64) {
        let inter = is_inter(k, tor_of);
        let win = window_of(k, window_ns);
        let tor = tor_of.get(k.prober as usize).copied().unwrap_or(u32::MAX);
        for &c in cells {
            let code = usize::from(c.ts_source());
            let n = u64::from(c.count());
            match c.measure() {
                Measure::NetworkRtt => {
                    self.rtt[code][usize::from(inter)].add(c.bucket(), n);
                    if !inter {
                        *self.shift.entry((win, code, tor, c.bucket())).or_default() += n;
                    }
                }
                Measure::ProberDelay => self.legs[code][0].add(c.bucket(), n),
                Measure::ResponderDelay => self.legs[code][1].add(c.bucket(), n),
            }
        }
    }

    /// Adds another's counts (another window's, or more of one window's).
    pub fn merge(&mut self, other: &BaselineCounts) {
        for (mine, theirs) in self.rtt.iter_mut().zip(&other.rtt).chain(self.legs.iter_mut().zip(&other.legs)) {
            for (m, t) in mine.iter_mut().zip(theirs) {
                m.0.iter_mut().zip(&t.0).for_each(|(a, b)| *a += b);
            }
        }
        for (&k, &n) in &other.shift {
            *self.shift.entry(k).or_default() += n;
        }
        self.probes += other.probes;
    }

    /// The baselines of the keys added, as [`baselines`] gives them over the same keys.
    pub fn baselines(&self, opts: &Options) -> Baselines {
        let BaselineCounts { rtt, legs, shift, probes } = self;
        let probes = *probes;
        let fleet_stride = (probes / SAMPLE_TARGET as u64).max(1);
        let mut out = Baselines::empty(opts);
        for code in 0..TS_CODES {
            let total: u64 = rtt[code].iter().map(Hist::total).sum();
            if total == 0 {
                continue;
            }
            // The records' sample: one probe in `n / SAMPLE_TARGET` of the whole input, and every
            // ok probe of a source that leaves fewer than SAMPLE_MIN in that stride.
            let stride = if total / fleet_stride < SAMPLE_MIN as u64 { 1 } else { fleet_stride };
            let scoped = std::array::from_fn(|scope| expand(rtt[code][scope].iter(), stride));
            let [pd, rd] = &legs[code];
            let pooled = pd.0.iter().zip(&rd.0).enumerate().filter(|(_, (p, r))| **p + **r > 0);
            let legs_sample = expand(pooled.map(|(b, (p, r))| (b as u16, p + r)), stride);
            out.set_source(code, scoped, legs_sample, max_p99(pd, rd), opts);
        }
        // The records' shift sample: one probe in `n / SHIFT_SAMPLE_TARGET` of the whole input.
        let stride = (probes / SHIFT_SAMPLE_TARGET as u64).max(1);
        let mut cells: Vec<((u32, usize, u32, u16), u64)> = shift.iter().map(|(&k, &n)| (k, n)).collect();
        cells.sort_unstable_by_key(|c| c.0);
        let mut samples: HashMap<(u32, usize, u32), Vec<f64>> = HashMap::new();
        for run in cells.chunk_by(|a, b| (a.0.0, a.0.1, a.0.2) == (b.0.0, b.0.1, b.0.2)) {
            let (w, c, tor, _) = run[0].0;
            samples.insert((w, c, tor), expand(run.iter().map(|&((.., b), n)| (b, n)), stride));
        }
        out.measure_shifts(samples);
        out
    }
}

/// Stage 2's scan from summaries: late host delays (dated to their key's span), each host's
/// legs and span, and the busy (host, window)s, as [`NoiseScan::add`] gathers them from records
/// (in blocks of keys on every core, merged in order as it merges blocks of records).
pub(super) fn noise_scan(
    ds: &Dataset,
    w: &Windows,
    hosts: &Hosts,
    tor_of: &[u32],
    base: &Baselines,
    opts: &Options,
    window_ns: u64,
) -> NoiseScan {
    let parts = super::in_blocks(w.keys(), |_, r| scan_keys(ds, w, r, hosts, tor_of, base, window_ns));
    let mut scan = NoiseScan::default();
    scan.merge(parts, opts);
    scan
}

/// [`noise_scan`] over keys `r` of `w`.
fn scan_keys(
    ds: &Dataset,
    w: &Windows,
    r: Range<usize>,
    hosts: &Hosts,
    tor_of: &[u32],
    base: &Baselines,
    window_ns: u64,
) -> ScannedBlock {
    let mut b = ScannedBlock::new(hosts);
    let rnics = ds.rnics.len();
    for (k, cells) in w.keys_in(r) {
        let (pr, tg) = (k.prober as usize, k.target as usize);
        let ok = k.counts[Class::Ok as usize];
        if pr >= rnics || tg >= rnics || ok == 0 {
            continue;
        }
        let (hp, ht) = (hosts.of_rnic[pr], hosts.of_rnic[tg]);
        for host in [hp, ht] {
            b.add_legs(host, u64::from(ok), k.first_ns, k.last_ns);
        }
        let win = window_of(k, window_ns);
        let inter = is_inter(k, tor_of);
        // The key's share of its hosts' (host, window) counts, added once per key.
        let (mut rtt, mut prober_legs, mut responder_legs) = (Own::default(), Own::default(), Own::default());
        for &c in cells {
            let (v, ts, n) = (bucket_value(c.bucket()), c.ts_source(), c.count());
            let busy_test = host_in_rtt(ts).then(|| base.leg_late_ns(ts)).flatten();
            match c.measure() {
                Measure::NetworkRtt if busy_test.is_some() => {
                    let slow = v as f64 > base.slow_ns_in(ts, inter, win);
                    rtt.slow = rtt.slow.saturating_add(if slow { n } else { 0 });
                    rtt.rtts = rtt.rtts.saturating_add(n);
                }
                m @ (Measure::ProberDelay | Measure::ResponderDelay) => {
                    let (host, rnic, answering, o) = if m == Measure::ProberDelay {
                        (hp, pr, false, &mut prober_legs)
                    } else {
                        (ht, tg, true, &mut responder_legs)
                    };
                    if let Some(late_ns) = busy_test {
                        o.delayed = o.delayed.saturating_add(if v as f64 > late_ns { n } else { 0 });
                        o.legs = o.legs.saturating_add(n);
                    }
                    if i64::try_from(v).unwrap_or(i64::MAX) > base.noise_ns(ts) {
                        let end = k.last_ns.saturating_add(v);
                        b.events.push((host, k.first_ns, end, rnic as u32, answering, n));
                    }
                }
                Measure::NetworkRtt => {}
            }
        }
        for (host, o) in [(hp, rtt), (ht, rtt), (hp, prober_legs), (ht, responder_legs)] {
            if o != Own::default() {
                b.own.entry((host, win)).or_default().add(&o);
            }
        }
    }
    b
}

/// Stage 3 from summaries: the counters per (window, prober, target, label), leaving out the
/// keys whose span met a stall, and when each prober first heard a restarted target (in blocks
/// of keys on every core, merged in order as [`super::tally::tally_range`] merges its blocks).
pub(super) fn tally(ds: &Dataset, w: &Windows, cx: &TallyContext, t: &mut Tally) -> RangeTally {
    let parts = super::in_blocks(w.keys(), |_, r| tally_keys(ds, w, r, cx));
    t.merge(parts)
}

/// [`tally`] over keys `r` of `w`.
fn tally_keys(ds: &Dataset, w: &Windows, r: Range<usize>, cx: &TallyContext) -> Block {
    let rnics = ds.rnics.len();
    let mut acc: HashMap<Key, (Acc, bool), foldhash::fast::RandomState> = HashMap::default();
    let mut t = BlockTally::new(ds);
    for (k, cells) in w.keys_in(r) {
        let probes = k.probes();
        t.records += probes;
        let win = window_of(k, cx.window_ns);
        if let Some(s) = t.services.get_mut(k.service as usize) {
            service(s, k, cells, cx, win);
        }
        if k.prober as usize >= rnics || k.target as usize >= rnics {
            t.not_evidence.unknown_rnic += probes;
            continue;
        }
        if t.windows.last() != Some(&win) {
            t.windows.push(win);
        }
        let Some((a, inter)) = key_acc(ds, k, cells, cx, &mut t, win) else { continue };
        let label = if inter { k.flow_label } else { NO_LABEL };
        let e = acc.entry((win, k.prober, k.target, label)).or_default();
        e.0.add(&a);
        e.1 |= inter;
    }
    Block { acc, rest: t }
}

/// One key's counters, and whether its probes cross the fabric; `None` when nothing of it is
/// evidence (what is not is counted by why).
fn key_acc(
    ds: &Dataset,
    k: &WindowKey,
    cells: &[KeyCell],
    cx: &TallyContext,
    t: &mut BlockTally,
    win: u32,
) -> Option<(Acc, bool)> {
    let TallyContext { base, tor_of, noise, hosts, agents, .. } = *cx;
    let count = |c: Class| k.counts[c as usize];
    let (hp, ht) = (hosts.of_rnic[k.prober as usize], hosts.of_rnic[k.target as usize]);
    let met =
        |pad: u64| noise.hit_span(hp, k.first_ns, k.last_ns, pad) || noise.hit_span(ht, k.first_ns, k.last_ns, pad);
    let (ok_met, lost_met) = (met(noise.pad_ns), met(noise.lost_pad_ns));
    if count(Class::LocalDrop) > 0 {
        t.add_local_drops(k.prober, u64::from(count(Class::LocalDrop)), ds.rnics.len());
    }
    let ne = &mut t.not_evidence;
    ne.invalid += u64::from(count(Class::Invalid));
    ne.refused += u64::from(count(Class::Refused));
    ne.unknown_outcome += u64::from(count(Class::Unknown));
    let mut a = Acc::default();
    if lost_met {
        ne.host_noise += u64::from(count(Class::Lost)) + u64::from(count(Class::Partial));
    } else {
        a.valid = a.valid.saturating_add(count(Class::Lost).saturating_add(count(Class::Partial)));
        a.lost = a.lost.saturating_add(count(Class::Lost));
    }
    if ok_met {
        ne.host_noise += u64::from(count(Class::Ok));
    } else if count(Class::Ok) > 0 {
        a.valid = a.valid.saturating_add(count(Class::Ok));
        let inter = is_inter(k, tor_of);
        for c in cells.iter().filter(|c| c.measure() == Measure::NetworkRtt) {
            let (ts, n) = (c.ts_source(), c.count());
            if host_in_rtt(ts) && (noise.busy(hp, win) || noise.busy(ht, win)) {
                ne.busy_host_rtt += u64::from(n);
                continue;
            }
            a.ok = a.ok.saturating_add(n);
            if bucket_value(c.bucket()) as f64 > base.slow_ns_in(ts, inter, win) {
                a.slow = a.slow.saturating_add(n);
                a.slow_ts |= TsSources::of(ts).0;
            }
        }
        heard(k, agents, t);
    }
    if a.valid == 0 {
        return None;
    }
    Some((a, crosses_fabric(ds, k.kind, k.service, k.prober, k.target)))
}

/// When `k`'s prober heard its restarted target again (see the module documentation).
fn heard(k: &WindowKey, agents: &Agents, t: &mut BlockTally) {
    let Some(list) = agents.restarts.get(&k.target) else { return };
    for &(_, back) in list {
        let at = if k.first_ok_ns >= back && k.first_ok_ns != u64::MAX {
            k.first_ok_ns
        } else if k.last_ns >= back && k.epoch_changes > 0 {
            k.last_ns
        } else {
            continue;
        };
        first_heard(&mut t.heard_again, (k.prober, k.target, back), at);
    }
}

/// A traced service's own figures from one of its keys (every probe counted, evidence or not).
fn service(s: &mut super::tally::ServiceTally, k: &WindowKey, cells: &[KeyCell], cx: &TallyContext, win: u32) {
    s.probes += k.probes();
    if (k.first_ns, k.prober) < (s.first_ns, s.prober) {
        s.prober = k.prober;
    }
    (s.first_ns, s.last_ns) = (s.first_ns.min(k.first_ns), s.last_ns.max(k.last_ns));
    let a = s.windows.entry(win).or_default();
    let (ok, lost, partial) =
        (k.counts[Class::Ok as usize], k.counts[Class::Lost as usize], k.counts[Class::Partial as usize]);
    a.valid = a.valid.saturating_add(ok.saturating_add(lost).saturating_add(partial));
    a.lost = a.lost.saturating_add(lost);
    a.ok = a.ok.saturating_add(ok);
    let inter = is_inter(k, cx.tor_of);
    for c in cells.iter().filter(|c| c.measure() == Measure::NetworkRtt) {
        let (v, ts, n) = (bucket_value(c.bucket()), c.ts_source(), c.count());
        if v as f64 > cx.base.slow_ns_in(ts, inter, win) {
            a.slow = a.slow.saturating_add(n);
            a.slow_ts |= TsSources::of(ts).0;
        }
        let rtt = i32::try_from(v).unwrap_or(i32::MAX);
        let excess = i64::from(rtt) - cx.base.slow_ns(ts, inter).ceil() as i64;
        s.rtt.extend(std::iter::repeat_n(rtt, n as usize));
        s.excess.extend(std::iter::repeat_n(excess, n as usize));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemesh_formats::window::bucket_of;

    fn hist(values: &[(u64, u64)]) -> Hist {
        let mut h = Hist::default();
        for &(v, n) in values {
            h.add(bucket_of(v), n);
        }
        h
    }

    #[test]
    fn expansion_keeps_every_buckets_share_at_its_midpoint() {
        let h = hist(&[(1_000, 300), (2_000, 600), (50_000, 100)]);
        let all = expand(h.iter(), 1);
        assert_eq!(all.len(), 1_000);
        let strided = expand(h.iter(), 10);
        assert_eq!(strided.len(), 100);
        let at = |v: u64| strided.iter().filter(|&&x| x == bucket_value(bucket_of(v)) as f64).count();
        assert_eq!((at(1_000), at(2_000), at(50_000)), (30, 60, 10));
        for x in all {
            let nearest = [1_000.0, 2_000.0, 50_000.0].into_iter().map(|v: f64| (x - v).abs() / v).fold(1.0, f64::min);
            assert!(nearest <= rocemesh_formats::window::RELATIVE_ERROR, "{x}");
        }
    }

    /// The p99 of the larger of two independent delays: with 2% of responder delays at 100 us
    /// and every prober delay at 1 us, 2% of probes have a 100 us larger delay, so the p99 is
    /// there; with 0.5% it is 1 us. Control: both sources late 0.6% of the time, independently,
    /// make about 1.2% of probes late, above 1%.
    #[test]
    fn the_larger_host_delays_p99_takes_the_two_delays_as_independent() {
        let pd = hist(&[(1_000, 1_000)]);
        let near = |x: i64, v: f64| (x as f64 - v).abs() <= v / 64.0;
        assert!(near(max_p99(&pd, &hist(&[(1_000, 980), (100_000, 20)])), 100_000.0));
        assert!(near(max_p99(&pd, &hist(&[(1_000, 995), (100_000, 5)])), 1_000.0));
        let both = hist(&[(1_000, 994), (100_000, 6)]);
        assert!(near(max_p99(&both, &both), 100_000.0));
        assert_eq!(max_p99(&Hist::default(), &pd), 0, "no legs, no p99");
    }

    /// The stages from summaries run in blocks of keys on every core and merge in order: a pool
    /// of one thread (one block: the single loop over the keys they replaced) and pools of 3 and
    /// 32 threads (blocks of 1,000 and 94 keys here, cut across files) must give the same
    /// baselines, noise, tally and findings, including what only some blocks see. What does not
    /// hang on a bucket's width is held to the records' own tally of the same probes.
    #[test]
    fn stages_from_summaries_in_blocks_on_any_number_of_threads_count_as_one_pass() {
        use crate::localize::testkit::{W, mixed_dataset, record_keys, stages};
        let ds = mixed_dataset();
        // Seven files of 1,715 keys, and an empty one among them.
        let mut parts = record_keys(&ds, 7).into_parts();
        parts.insert(3, (Vec::new(), Vec::new()));
        let w = Windows::from_parts(parts);
        assert_eq!(w.keys(), ds.probes.len());
        let sent = |r: Range<usize>| w.keys_in(r).map(|(k, _)| k.first_ns).collect::<Vec<_>>();
        assert_eq!(sent(1_713..5_200), ds.probes.t1_unix_ns[1_713..5_200], "across files");
        assert_eq!(sent(11_990..20_000), ds.probes.t1_unix_ns[11_990..], "past the last key");
        let (from, to) = (7, 3);
        assert!(sent(from..to).is_empty(), "a reversed range holds no key");
        let opts = Options::default();
        assert_eq!(opts.window_s * 1_000_000_000, W);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let tor_of = super::super::tor_ids(&ds);
                let base = baselines(&w, &tor_of, &opts, W);
                let mut shifts: Vec<_> = base.shifts.iter().map(|(k, v)| (*k, v.to_bits())).collect();
                shifts.sort_unstable();
                let base_said =
                    (format!("{:?} {:?} {:?}", base.by_code, base.late_share, base.leg_p99_robust_ns), shifts);
                let hosts = Hosts::of(&ds);
                let agents = Agents::of(&ds, W);
                let scan = noise_scan(&ds, &w, &hosts, &tor_of, &base, &opts, W);
                let mut events = scan.events.clone();
                events.sort_unstable();
                let mut legs: Vec<_> = scan.legs.iter().map(|(h, l)| (*h, *l)).collect();
                legs.sort_unstable();
                let noise_said = (events, legs, scan.busy.clone());
                let noise = super::super::noise::Noise::new(&ds, &hosts, &base, &opts, W, scan);
                let cx = TallyContext {
                    base: &base,
                    tor_of: &tor_of,
                    noise: &noise,
                    hosts: &hosts,
                    agents: &agents,
                    window_ns: W,
                };
                let mut t = Tally::new(&ds);
                let range = tally(&ds, &w, &cx, &mut t);
                let services = t.services.clone();
                let tally_said = (
                    t.records,
                    t.heard_again.clone(),
                    t.windows.clone(),
                    t.not_evidence.clone(),
                    t.local_drops.clone(),
                    services,
                );
                let json = serde_json::to_value(super::super::localize_windows(&ds, &w, &opts)).unwrap();
                (base_said, noise_said, range.acc, tally_said, json)
            })
        };
        let one = run(1);
        let (noise, tally) = (&one.1, &one.3);
        // Counted straight from the records, and by the records' own tally.
        let p = &ds.probes;
        let known = |i: &usize| (p.prober[*i] as usize) < ds.rnics.len() && (p.target[*i] as usize) < ds.rnics.len();
        let of = |c: Class| (0..p.len()).filter(known).filter(|&i| Class::of(p.outcome[i], p.arrived[i]) == c).count();
        let ne = &tally.3;
        assert_eq!(tally.0, p.len() as u64);
        assert_eq!((ne.unknown_rnic, ne.refused), (1, of(Class::Refused) as u64));
        assert_eq!((ne.invalid, ne.unknown_outcome), (of(Class::Invalid) as u64, of(Class::Unknown) as u64));
        assert_eq!(tally.4.iter().sum::<u64>(), of(Class::LocalDrop) as u64);
        let records = stages(&ds).tally;
        assert_eq!((&tally.2, &tally.4), (&records.windows, &records.local_drops));
        let service = |s: &crate::localize::tally::ServiceTally| (s.probes, s.first_ns, s.last_ns, s.prober);
        assert!(tally.5.iter().map(service).eq(records.services.iter().map(service)), "services");
        assert!(
            !noise.0.is_empty() && !noise.2.is_empty(),
            "late legs and a busy host: {} {}",
            noise.0.len(),
            noise.2.len()
        );
        assert!(tally.0 == ds.probes.len() as u64 && !tally.1.is_empty(), "every probe, and a restart heard again");
        assert!(
            tally.3.host_noise > 0
                && tally.3.unknown_rnic == 1
                && tally.3.refused > 0
                && tally.4.iter().sum::<u64>() > 0
        );
        assert!(tally.5.iter().all(|s| s.rtt.len() > 100), "services' RTTs");
        assert!(one.4["findings"].as_array().is_some_and(|f| !f.is_empty()), "{}", one.4);
        for threads in [3, 32] {
            let many = run(threads);
            assert!(one.0 == many.0, "the baselines on {threads} threads");
            assert!(one.1 == many.1, "the noise on {threads} threads");
            assert!(one.2 == many.2, "the counters by key on {threads} threads");
            assert!(one.3 == many.3, "the tally on {threads} threads");
            assert_eq!(one.4, many.4, "the findings on {threads} threads");
        }
    }
}
