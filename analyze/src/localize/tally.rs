//! Stage 3: counters per (window, prober, target, label) of one range ([`tally_range`], passes 3
//! and 4; the label only where it chooses a path through the fabric, [`NO_LABEL`] within a ToR),
//! leaving out probes that met a stall or that no agent could have answered
//! ([`excluded`]: a target whose agent was not running, a restarted one until the prober hears
//! it); what is no evidence is counted by why, and traced services' own figures are kept apart.

use super::NotEvidence;
use super::baseline::{Baselines, is_inter};
use super::noise::{Agents, Hosts, Noise, host_in_rtt};
use crate::ingest::{Dataset, NO_SERVICE, Probes};
use crate::probe::{Class, TsSources};
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;

/// Counters of one (window, prober, target, label).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Acc {
    /// ok + lost + partial (what loss is measured over; invalid, refused and local drops
    /// excluded).
    pub(super) valid: u32,
    pub(super) lost: u32,
    pub(super) ok: u32,
    pub(super) slow: u32,
    /// Timestamp sources of the slow probes ([`TsSources`] bits), for the evidence text.
    pub(super) slow_ts: u8,
}

impl Acc {
    pub(super) fn add(&mut self, o: &Acc) {
        // Saturating: summaries come from other machines, and their counts are only bounded
        // per key.
        self.valid = self.valid.saturating_add(o.valid);
        self.lost = self.lost.saturating_add(o.lost);
        self.ok = self.ok.saturating_add(o.ok);
        self.slow = self.slow.saturating_add(o.slow);
        self.slow_ts |= o.slow_ts;
    }
}

/// What a cover round counts as bad.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Mode {
    Lossy,
    Slow,
}

pub(super) type Key = (u32, u32, u32, u32); // window, prober, target, label

/// The label of a key whose probes stay under one ToR: their label chooses no path, and keeping
/// it would make one key per probe of a wide fleet (8,192 RNICs probing each ToR-mesh peer a few
/// times a window over 33 labels), where one per (window, prober, target) holds the same
/// evidence.
pub(super) const NO_LABEL: u32 = u32::MAX;

/// What a pass over the records gathers across its ranges.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// (prober, restarted target, restart's first record) -> first ok T1 from the new instance,
    /// so far: a range's windows are judged on what was heard up to its end, which is exactly
    /// what the whole input says of them (a window is excluded while nothing was heard before
    /// it; what is heard later cannot change that).
    pub(super) heard_again: HashMap<(u32, u32, u64), u64>,
    /// Records looked at.
    pub(super) records: u64,
    /// Local drops by prober id.
    pub(super) local_drops: Vec<u64>,
    /// Windows holding records.
    pub(super) windows: BTreeSet<u32>,
    pub(super) not_evidence: NotEvidence,
    /// By service id: the service's own probes.
    pub(super) services: Vec<ServiceTally>,
    /// Keys the last range held: the next range's table starts that large rather than
    /// doubling its way there (rehashing millions of keys on a wide fleet).
    pub(super) last_range_keys: usize,
}

impl Tally {
    pub(super) fn new(ds: &Dataset) -> Tally {
        Tally {
            services: vec![ServiceTally::default(); ds.services.len()],
            local_drops: vec![0; ds.rnics.len()],
            ..Tally::default()
        }
    }

    /// What is counted once the last range is in.
    pub(super) fn finish(&mut self, ds: &Dataset, noise: &Noise, hosts: &Hosts) {
        for (rnic, &n) in self.local_drops.iter().enumerate().filter(|(_, n)| **n > 0) {
            self.not_evidence.local_drop_by_prober.insert(ds.rnics[rnic].name.clone(), n);
        }
        for &(host, _) in &noise.busy {
            *self.not_evidence.busy_host_windows.entry(hosts.names[host as usize].clone()).or_default() += 1;
        }
    }
}

/// One range's counters.
#[derive(Default)]
pub(super) struct RangeTally {
    /// Counters by key, ascending (so later stages are deterministic, and ranges in time order
    /// give the keys in the order one table would), and whether the key's probes cross the
    /// fabric (inter-ToR probes, which vote on links and spines).
    pub(super) acc: Vec<(Key, Acc, bool)>,
}

/// One traced service's own probes.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ServiceTally {
    /// Every record.
    pub(super) probes: u64,
    /// First and last T1.
    pub(super) first_ns: u64,
    pub(super) last_ns: u64,
    /// The prober of its earliest record (the smallest id among those of one instant), whatever
    /// order the records are read in.
    pub(super) prober: u32,
    /// Counters per window (every record counted, evidence or not).
    pub(super) windows: BTreeMap<u32, Acc>,
    /// Its ok probes' RTTs, and how far each lies above its source's slow threshold.
    pub(super) rtt: Vec<i32>,
    pub(super) excess: Vec<i64>,
}

impl Default for ServiceTally {
    fn default() -> Self {
        ServiceTally {
            probes: 0,
            first_ns: u64::MAX,
            last_ns: 0,
            prober: u32::MAX,
            windows: BTreeMap::new(),
            rtt: Vec::new(),
            excess: Vec::new(),
        }
    }
}

/// The context [`tally`] classifies records in.
pub(super) struct TallyContext<'a> {
    pub(super) base: &'a Baselines,
    pub(super) tor_of: &'a [u32],
    pub(super) noise: &'a Noise,
    pub(super) hosts: &'a Hosts,
    pub(super) agents: &'a Agents,
    pub(super) window_ns: u64,
}

/// Stage 3, one range of whole windows: counters per key, leaving out probes that met a host's
/// stall, and when each prober first heard a restarted target. The range is tallied in blocks
/// on every core ([`super::in_blocks`]) and the blocks merged in order: counts add, spans and
/// firsts take their minimum, a service's RTTs follow record order, so the tally is the one a
/// single pass in order makes.
pub(super) fn tally_range(ds: &Dataset, p: &Probes, cx: &TallyContext, t: &mut Tally) -> RangeTally {
    let parts = super::in_blocks(p.len(), |blocks, r| tally_block(ds, p, cx, r, t.last_range_keys / blocks));
    t.merge(parts)
}

/// What one block of a range adds to a [`Tally`] besides its counters by key.
#[derive(Default)]
pub(super) struct BlockTally {
    /// Records (probes) looked at.
    pub(super) records: u64,
    pub(super) heard_again: HashMap<(u32, u32, u64), u64>,
    /// Windows holding records, once per run of records in one window (the tally's set keeps
    /// each once).
    pub(super) windows: Vec<u32>,
    pub(super) not_evidence: NotEvidence,
    /// Local drops by prober id (empty when none).
    pub(super) local_drops: Vec<u64>,
    pub(super) services: Vec<ServiceTally>,
}

impl BlockTally {
    pub(super) fn new(ds: &Dataset) -> BlockTally {
        BlockTally { services: vec![ServiceTally::default(); ds.services.len()], ..BlockTally::default() }
    }

    /// `n` local drops of prober `pr`, of a fleet of `rnics`.
    pub(super) fn add_local_drops(&mut self, pr: u32, n: u64, rnics: usize) {
        if self.local_drops.is_empty() {
            self.local_drops = vec![0; rnics];
        }
        self.local_drops[pr as usize] += n;
    }
}

/// That the prober of `key` (prober, restarted target, restart's first record) heard the new
/// instance at `at_ns`: the earliest time heard is kept ([`Tally::heard_again`]).
pub(super) fn first_heard(heard_again: &mut HashMap<(u32, u32, u64), u64>, key: (u32, u32, u64), at_ns: u64) {
    let e = heard_again.entry(key).or_insert(u64::MAX);
    *e = (*e).min(at_ns);
}

/// One block's counters by key (foldhash, seeded per process as hashbrown's own default,
/// instead of SipHash, which took a quarter of localize's time at 8,192 RNICs), and the rest.
pub(super) struct Block {
    pub(super) acc: HashMap<Key, (Acc, bool), foldhash::fast::RandomState>,
    pub(super) rest: BlockTally,
}

impl Tally {
    /// One range's blocks, in record order, into its counters by key and this tally.
    pub(super) fn merge(&mut self, parts: Vec<Block>) -> RangeTally {
        let mut acc: Vec<(Key, Acc, bool)> = Vec::with_capacity(parts.iter().map(|b| b.acc.len()).sum());
        for part in parts {
            acc.extend(part.acc.into_iter().map(|(k, (a, inter))| (k, a, inter)));
            self.add(part.rest);
        }
        // A key can be in several blocks, so blocks merge by sorting. A range's records come file
        // by file, so a key's are mostly in one block and the blocks' tables hold about the
        // range's keys once; a table interleaved in time would hold them up to once per block
        // until here.
        acc.par_sort_unstable_by_key(|e| e.0);
        acc.dedup_by(|next, kept| {
            let same = next.0 == kept.0;
            if same {
                kept.1.add(&next.1);
                kept.2 |= next.2;
            }
            same
        });
        self.last_range_keys = acc.len();
        RangeTally { acc }
    }

    /// Adds a block's figures, blocks in record order.
    fn add(&mut self, b: BlockTally) {
        self.records += b.records;
        for (k, at_ns) in b.heard_again {
            first_heard(&mut self.heard_again, k, at_ns);
        }
        self.windows.extend(b.windows);
        // Every field named, so that a counter added to NotEvidence must be merged here too.
        let NotEvidence {
            local_drop_by_prober,
            invalid,
            refused,
            unknown_outcome,
            unknown_rnic,
            host_noise,
            busy_host_rtt,
            busy_host_windows,
        } = b.not_evidence;
        debug_assert!(local_drop_by_prober.is_empty() && busy_host_windows.is_empty(), "filled by Tally::finish");
        let n = &mut self.not_evidence;
        n.invalid += invalid;
        n.refused += refused;
        n.unknown_outcome += unknown_outcome;
        n.unknown_rnic += unknown_rnic;
        n.host_noise += host_noise;
        n.busy_host_rtt += busy_host_rtt;
        debug_assert!(b.local_drops.is_empty() || b.local_drops.len() == self.local_drops.len());
        for (mine, theirs) in self.local_drops.iter_mut().zip(b.local_drops) {
            *mine += theirs;
        }
        for (mine, theirs) in self.services.iter_mut().zip(b.services) {
            mine.add(theirs);
        }
    }
}

impl ServiceTally {
    /// Adds the figures of records that follow this one's.
    fn add(&mut self, o: ServiceTally) {
        self.probes += o.probes;
        // The earliest record's prober, the smallest id among those of one instant.
        if (o.first_ns, o.prober) < (self.first_ns, self.prober) {
            self.prober = o.prober;
        }
        (self.first_ns, self.last_ns) = (self.first_ns.min(o.first_ns), self.last_ns.max(o.last_ns));
        for (w, a) in o.windows {
            self.windows.entry(w).or_default().add(&a);
        }
        self.rtt.extend(o.rtt);
        self.excess.extend(o.excess);
    }
}

/// [`tally_range`] over records `r` of `p`, its table sized for `keys`.
fn tally_block(ds: &Dataset, p: &Probes, cx: &TallyContext, r: Range<usize>, keys: usize) -> Block {
    let TallyContext { base, tor_of, noise, hosts, agents, window_ns } = *cx;
    let restarts = &agents.restarts;
    let rnics = ds.rnics.len();
    let mut acc: HashMap<Key, (Acc, bool), foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(keys, Default::default());
    let mut t = BlockTally { records: r.len() as u64, ..BlockTally::new(ds) };
    let mut last_w = None;
    for i in r {
        let (pr, tg) = (p.prober[i], p.target[i]);
        let class = Class::of(p.outcome[i], p.arrived[i]);
        let service = p.service_of(i);
        if let Some(s) = t.services.get_mut(service as usize) {
            let t1 = p.t1_unix_ns[i];
            s.probes += 1;
            if (t1, pr) < (s.first_ns, s.prober) {
                s.prober = pr;
            }
            (s.first_ns, s.last_ns) = (s.first_ns.min(t1), s.last_ns.max(t1));
            let w = (t1 / window_ns) as u32;
            let a = s.windows.entry(w).or_default();
            match class {
                Class::Ok => {
                    let inter = is_inter(p, tor_of, i);
                    let slow_ns = base.slow_ns(p.ts_source[i], inter);
                    let rtt = p.network_rtt_ns[i];
                    a.ok += 1;
                    a.valid += 1;
                    if f64::from(rtt) > base.slow_ns_in(p.ts_source[i], inter, w) {
                        a.slow += 1;
                        a.slow_ts |= TsSources::of(p.ts_source[i]).0;
                    }
                    s.rtt.push(rtt);
                    s.excess.push(i64::from(rtt) - slow_ns.ceil() as i64);
                }
                Class::Lost => {
                    a.valid += 1;
                    a.lost += 1;
                }
                Class::Partial => a.valid += 1,
                _ => {}
            }
        }
        if pr as usize >= rnics || tg as usize >= rnics {
            t.not_evidence.unknown_rnic += 1;
            continue;
        }
        let w = (p.t1_unix_ns[i] / window_ns) as u32;
        if last_w != Some(w) {
            last_w = Some(w);
            t.windows.push(w);
        }
        let (hp, ht) = (hosts.of_rnic[pr as usize], hosts.of_rnic[tg as usize]);
        let t1 = p.t1_unix_ns[i];
        let met_stall = match class {
            Class::Ok => noise.hit(hp, t1, noise.pad_ns) || noise.hit(ht, t1, noise.pad_ns),
            // A lost probe is dated by its prober's clock alone, which may be seconds off the
            // stalled host's (a stepped clock in the suite dated a probe sent into a stall 2.4 s
            // after it): its pad is wider. Not the whole window: a port that comes back makes
            // its first probes wait for the neighbour entry, a "stall" at the outage's end, and
            // leaving out that window's lost probes cut the RNIC's finding short in the Clos
            // testbed.
            Class::Lost | Class::Partial => {
                noise.hit(hp, t1, noise.lost_pad_ns) || noise.hit(ht, t1, noise.lost_pad_ns)
            }
            _ => false,
        };
        if met_stall {
            t.not_evidence.host_noise += 1;
            continue;
        }
        let mut a = Acc::default();
        match class {
            Class::Ok => {
                let ts = p.ts_source[i];
                a.valid = 1;
                if host_in_rtt(ts) && (noise.busy(hp, w) || noise.busy(ht, w)) {
                    t.not_evidence.busy_host_rtt += 1;
                } else {
                    a.ok = 1;
                    a.slow = u32::from(f64::from(p.network_rtt_ns[i]) > base.slow_ns_in(ts, is_inter(p, tor_of, i), w));
                    if a.slow > 0 {
                        a.slow_ts = TsSources::of(ts).0;
                    }
                }
                if let Some(list) = restarts.get(&tg) {
                    for &(_, back) in list {
                        if p.t1_unix_ns[i] >= back {
                            first_heard(&mut t.heard_again, (pr, tg, back), p.t1_unix_ns[i]);
                        }
                    }
                }
            }
            Class::Lost => {
                a.valid = 1;
                a.lost = 1;
            }
            // Only ACK2 missing proves the forward path and the responder alive: not loss.
            Class::Partial => a.valid = 1,
            Class::LocalDrop => {
                t.add_local_drops(pr, 1, rnics);
                continue;
            }
            Class::Invalid => {
                t.not_evidence.invalid += 1;
                continue;
            }
            Class::Refused => {
                t.not_evidence.refused += 1;
                continue;
            }
            Class::Unknown => {
                t.not_evidence.unknown_outcome += 1;
                continue;
            }
        }
        let inter = crosses_fabric(ds, p.kind[i], service, pr, tg);
        let key = (w, pr, tg, if inter { p.flow_label[i] } else { NO_LABEL });
        let e = acc.entry(key).or_default();
        e.0.add(&a);
        e.1 |= inter;
    }
    Block { acc, rest: t }
}

/// Whether probes of `kind` (to traced connection `service`, or [`NO_SERVICE`]) from `pr` to
/// `tg` (both known RNICs) vote on links and spines: inter-ToR probes, and a service probe
/// between two ToRs, which crosses the fabric as an inter-ToR probe does.
pub(super) fn crosses_fabric(ds: &Dataset, kind: u8, service: u32, pr: u32, tg: u32) -> bool {
    kind == 1
        || (service != NO_SERVICE && {
            let (tp, tt) = (&ds.rnics[pr as usize].tor, &ds.rnics[tg as usize].tor);
            !tp.is_empty() && !tt.is_empty() && tp != tt
        })
}

/// Stage 4: whether the probes of (window, prober, target) are no network evidence, beyond the
/// host stalls [`tally_range`] left out.
pub(super) fn excluded(
    cx: &TallyContext,
    heard_again: &HashMap<(u32, u32, u64), u64>,
    w: u32,
    pr: u32,
    tg: u32,
) -> bool {
    // Pingmesh: probes to an RNIC whose agent was not running say nothing of the network.
    if !cx.agents.covers(tg, w) {
        return true;
    }
    if let Some(list) = cx.agents.restarts.get(&tg) {
        for &(down, back) in list {
            let heard = heard_again.get(&(pr, tg, back)).copied().unwrap_or(u64::MAX);
            let (lo, hi) = (u64::from(w) * cx.window_ns, (u64::from(w) + 1) * cx.window_ns);
            if down < hi && heard >= lo {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use crate::probe::{Class, ts_code};

    #[test]
    fn tally_classifies_through_probe_semantics() {
        let recs = [
            Rec(0, 1, 0, Outcome::Ok, 10_000, 1_000, KS),
            Rec(0, 1, 0, Outcome::Lost, 0, 0, KS),
            Rec(0, 1, 0, Outcome::LocalDrop, 0, 0, KS),
            Rec(0, 1, 0, Outcome::Refused, 0, 0, KS),
            Rec(0, 1, 0, Outcome::Invalid, 0, 0, KS),
            Rec(2, 1, 0, Outcome::LocalDrop, 0, 0, KS),
            Rec(2, 9, 0, Outcome::Ok, 10_000, 1_000, KS),
            Rec(0, 1, 0, Outcome::Ok, 10_000, 1_000, KS),
        ];
        let mut ds = dataset(3, 1, &recs);
        // A newer agent's outcome byte, with every packet arrived: still no ok.
        ds.probes.outcome[7] = 77;
        let st = stages(&ds);
        let t = &st.tally;
        assert_eq!(st.range.acc.len(), 1, "only h0 -> h1 has evidence");
        let a = st.range.acc[0].1;
        assert_eq!((a.valid, a.lost, a.ok), (2, 1, 1));
        let ne = &t.not_evidence;
        let drops: Vec<(&str, u64)> = ne.local_drop_by_prober.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(drops, [("h0/d0", 1), ("h2/d0", 1)]);
        assert_eq!((ne.refused, ne.invalid, ne.unknown_outcome, ne.unknown_rnic), (1, 1, 1, 1));
    }

    /// The stages' per-record loops run in blocks on every core and merge in order: a pool of
    /// one thread (one block) and pools of 3 and 32 threads (blocks of a few dozen records
    /// here) must gather the same samples, noise, tally and findings, including what only some
    /// blocks see (a restart heard again, a stall, local drops, unknown ids, services' RTTs in
    /// record order, a timestamp source sampled whole).
    #[test]
    fn stages_in_blocks_on_any_number_of_threads_count_as_one_pass() {
        let ds = mixed_dataset();
        let n = ds.probes.len();
        let opts = Options::default();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let mut sampler = Sampler { stride: 7, shift_stride: 3, ..Sampler::new(n) };
                sampler.whole = std::array::from_fn(|_| Some(Vec::new()));
                sampler.add(&ds.probes, &tor_ids(&ds), W);
                let st = stages(&ds);
                let mut scan = NoiseScan::default();
                scan.add(&ds, &ds.probes, &st.hosts, &st.tor_of, &st.base, &opts, W);
                let services = st.tally.services.clone();
                let t = &st.tally;
                let tally = (t.heard_again.clone(), t.windows.clone(), t.not_evidence.clone(), t.local_drops.clone());
                let json = serde_json::to_value(localize(&ds, &opts)).unwrap();
                (
                    sampler.samples,
                    sampler.whole,
                    sampler.shift,
                    scan.events,
                    scan.legs,
                    scan.busy,
                    st.range.acc,
                    services,
                    tally,
                    json,
                )
            })
        };
        // The baselines' sample against the loop it replaced, over two ranges: at stride 5 the
        // kernel-stamped sample is thin after the first and thick after the second, the
        // host-poll one thin throughout (sampled whole).
        let halves = [0..n / 2, n / 2..n].map(|r| part(&ds.probes, r));
        for threads in [1, 3, 32] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let tor_of = tor_ids(&ds);
            let mut sampler = Sampler { stride: 5, shift_stride: 3, ..Sampler::new(n) };
            sampler.whole = std::array::from_fn(|_| Some(Vec::new()));
            let mut reference = Sampler { stride: 5, shift_stride: 3, ..Sampler::new(n) };
            reference.whole = std::array::from_fn(|_| Some(Vec::new()));
            for half in &halves {
                pool.install(|| sampler.add(half, &tor_of, W));
                sample_in_order(&mut reference, half, &tor_of);
                if threads == 1 && half.index[0] == 0 {
                    let ks = usize::from(ts_code(KS));
                    assert!(reference.samples[ks].len() < SAMPLE_MIN && reference.whole[ks].is_some());
                }
            }
            let ks = usize::from(ts_code(KS));
            assert!(reference.samples[ks].len() >= SAMPLE_MIN && reference.whole[ks].is_none());
            assert!(reference.whole[usize::from(ts_code(HP))].as_ref().is_some_and(|w| !w.is_empty()));
            assert!(sampler.samples == reference.samples, "strided samples on {threads} threads");
            assert!(sampler.whole == reference.whole, "whole sources on {threads} threads");
            assert!(sampler.shift == reference.shift, "shift samples on {threads} threads");
        }
        let one = run(1);
        assert!(one.1[usize::from(ts_code(HP))].as_ref().is_some_and(|w| !w.is_empty()), "a source sampled whole");
        assert!(one.0[usize::from(ts_code(KS))].len() >= SAMPLE_MIN && one.1[usize::from(ts_code(KS))].is_none());
        assert!(!one.3.is_empty() && !one.5.is_empty(), "late legs and a busy host: {} {}", one.3.len(), one.5.len());
        assert!(one.7.iter().all(|s| s.rtt.len() > 100), "services' RTTs");
        assert!(!one.8.0.is_empty() && one.8.2.host_noise > 0 && one.8.2.unknown_rnic == 1 && one.8.2.refused > 0);
        for threads in [3, 32] {
            let many = run(threads);
            assert!(one.0 == many.0 && one.1 == many.1 && one.2 == many.2, "samples on {threads} threads");
            assert!(one.3 == many.3 && one.4 == many.4 && one.5 == many.5, "noise on {threads} threads");
            assert!(one.6 == many.6, "the counters by key on {threads} threads");
            assert!(one.7 == many.7 && one.8 == many.8, "the tally on {threads} threads");
            assert_eq!(one.9, many.9, "the findings on {threads} threads");
        }
    }

    /// Records `r` of `p` as a range a plan reads: their positions in the whole input kept.
    fn part(p: &Probes, r: std::ops::Range<usize>) -> Probes {
        Probes {
            t1_unix_ns: p.t1_unix_ns[r.clone()].to_vec(),
            network_rtt_ns: p.network_rtt_ns[r.clone()].to_vec(),
            prober_delay_ns: p.prober_delay_ns[r.clone()].to_vec(),
            responder_delay_ns: p.responder_delay_ns[r.clone()].to_vec(),
            prober: p.prober[r.clone()].to_vec(),
            target: p.target[r.clone()].to_vec(),
            flow_label: p.flow_label[r.clone()].to_vec(),
            responder_epoch: p.responder_epoch[r.clone()].to_vec(),
            kind: p.kind[r.clone()].to_vec(),
            outcome: p.outcome[r.clone()].to_vec(),
            arrived: p.arrived[r.clone()].to_vec(),
            ts_source: p.ts_source[r.clone()].to_vec(),
            service: p.service.get(r.clone()).map_or_else(Vec::new, <[u32]>::to_vec),
            index: r.map(|i| i as u64).collect(),
        }
    }

    /// `Sampler::add` as one loop over the records in order (what it was before it ran in
    /// blocks): the reference its blocks are held to.
    fn sample_in_order(s: &mut Sampler, p: &Probes, tor_of: &[u32]) {
        for i in 0..p.len() {
            if Class::of(p.outcome[i], p.arrived[i]) != Class::Ok {
                continue;
            }
            let (at, c, inter) = (p.index_of(i), usize::from(ts_code(p.ts_source[i])), is_inter(p, tor_of, i));
            let x = (p.network_rtt_ns[i], p.prober_delay_ns[i], p.responder_delay_ns[i], inter);
            if at.is_multiple_of(s.stride) {
                s.samples[c].push(x);
                if s.samples[c].len() >= SAMPLE_MIN {
                    s.whole[c] = None;
                }
            }
            if let Some(v) = &mut s.whole[c] {
                v.push(x);
            }
            if at.is_multiple_of(s.shift_stride) && !inter {
                let tor = tor_of.get(p.prober[i] as usize).copied().unwrap_or(u32::MAX);
                let key = ((p.t1_unix_ns[i] / W) as u32, c, tor);
                s.shift.entry(key).or_default().push(f64::from(p.network_rtt_ns[i].max(1)));
            }
        }
    }

    #[test]
    fn exclusions_cover_stalls_uncovered_targets_and_restarts() {
        // h0 takes 150 ms to handle its own probes in window 1: a stall (against a fleet p99 of
        // 1 us, so the 1 ms floor holds). Three probes 5 ms late in window 2 are a busy host.
        let mut recs = vec![Rec(0, 1, 0, Outcome::Ok, 10_000, 1_000, KS); 300];
        recs.extend([Rec(0, 1, 1, Outcome::Ok, 10_000, 150_000_000, KS); 3]);
        recs.extend([Rec(0, 1, 2, Outcome::Ok, 10_000, 5_000_000, KS); 3]);
        // h3's agent restarts (down at 10 s, back at 70 s); h0 hears it again at 95 s.
        recs.push(Rec(0, 3, 3, Outcome::Ok, 10_000, 1_000, KS));
        let heard = recs.len() - 1;
        let mut ds = dataset(4, 5, &recs);
        ds.probes.t1_unix_ns[heard] = T0 + 95_000_000_000;
        ds.agents[3].last_ns = T0 + 10_000_000_000;
        ds.agents.push(AgentFile {
            rnic: 3,
            agent_epoch: 2,
            first_ns: T0 + 70_000_000_000,
            last_ns: T0 + 5 * W - 1,
            records: 1,
            long_gaps: Vec::new(),
            median_gap_ns: 100_000_000,
        });
        // h2's agent covers window 0 only, and froze for 2 s in window 4.
        ds.agents[2].last_ns = T0 + W - 1;
        ds.agents[1].long_gaps.push((T0 + 4 * W + 1_000_000_000, 2_000_000_000));
        let st = stages(&ds);
        let (t, noise) = (&st.tally, &st.noise);
        let noisy: Vec<(u32, u32, &str)> =
            noise.windows.iter().map(|((h, w), why)| (*h, *w - W0, why.as_str())).collect();
        assert_eq!(noisy.len(), 2, "{noisy:?}");
        assert!(
            noisy[0].0 == 0 && noisy[0].1 == 1 && noisy[0].2.contains("3 probes with prober delay > 50 ms"),
            "{noisy:?}"
        );
        assert!(noisy[1].0 == 1 && noisy[1].1 == 4 && noisy[1].2.contains("frozen host"), "{noisy:?}");
        assert_eq!(t.not_evidence.host_noise, 3, "the stalled probes are no evidence, and counted");
        assert!(!st.range.acc.iter().any(|(k, _, _)| k.0 == W0 + 1), "{:?}", st.range.acc);
        let cx = st.cx();
        let excluded = |w: u32, pr: u32, tg: u32| excluded(&cx, &t.heard_again, W0 + w, pr, tg);
        assert!(!excluded(0, 0, 1));
        assert!(excluded(1, 0, 2) && !excluded(0, 0, 2), "to an RNIC whose agent is not running");
        assert!(excluded(2, 0, 3) && excluded(3, 0, 3), "to a restarted agent until heard again");
        assert!(!excluded(4, 0, 3), "heard again in window 3");
        assert!(excluded(4, 2, 3), "h2 has not heard it again yet");
    }

    /// Issue 17: a stall that began in a window's last millisecond threw away every probe of
    /// that host in the window. Now probes are left out only within the stall's pad of it, a
    /// wider one for lost probes, dated by their prober's clock alone.
    #[test]
    fn a_stall_at_a_windows_end_leaves_the_windows_other_ok_probes() {
        // h0 -> h1 every 100 ms over two windows, and one lost probe 5 s into window 0.
        let mut recs = vec![Rec(0, 1, 0, Outcome::Ok, 10_000, 1_000, KS); 600];
        recs.push(Rec(0, 1, 0, Outcome::Lost, 0, 0, KS));
        let mut ds = dataset(2, 2, &recs);
        for (i, t) in ds.probes.t1_unix_ns.iter_mut().enumerate().take(600) {
            *t = T0 + i as u64 * 100_000_000;
        }
        ds.probes.t1_unix_ns[600] = T0 + 5_000_000_000;
        // h1 froze for 2 s from 1 ms before the end of window 0.
        ds.agents[1].long_gaps.push((T0 + W - 1_000_000, 2_000_000_000));
        let st = stages(&ds);
        let (t, noise) = (&st.tally, &st.noise);
        assert_eq!(noise.windows.keys().map(|k| k.1 - W0).collect::<Vec<_>>(), [0, 1]);
        let ok_in = |w: u32| st.range.acc.iter().filter(|(k, _, _)| k.0 == W0 + w).map(|(_, a, _)| a.ok).sum::<u32>();
        let lost_in =
            |w: u32| st.range.acc.iter().filter(|(k, _, _)| k.0 == W0 + w).map(|(_, a, _)| a.lost).sum::<u32>();
        // Window 0: probes from 29.0 s on are within the 1 s pad (10 of 300); window 1: up to
        // 32.999 s (30 of 300). The lost probe, 25 s before the stall, is evidence; one 5.5 s
        // before it is not (a lost probe's pad allows for 5 s of clock offset).
        assert_eq!((ok_in(0), ok_in(1)), (290, 270));
        assert_eq!(lost_in(0), 1);
        assert_eq!(t.not_evidence.host_noise, 10 + 30);
        ds.probes.t1_unix_ns[600] = T0 + W - 5_500_000_000;
        assert_eq!(stages(&ds).tally.not_evidence.host_noise, 10 + 30 + 1);
    }
}
