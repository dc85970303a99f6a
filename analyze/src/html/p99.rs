//! The exact whole-range RTT p99 of every ToR pair and RNIC pair on `analyze html`'s heatmaps,
//! over reads of the same ranges ([`PairP99`]), counted on every core of rayon's pool.
//!
//! A pair's p99 is the nearest rank of its ok probes' RTTs over all the hours read, and the
//! page must not hold those RTTs: each read settles one byte of the (order-preserving, unsigned)
//! value, each pair counting the 256 values of that byte among the values that share the bytes
//! chosen so far. Memory: 2 KiB per pair, whatever the hours read.
//!
//! The count of a read runs in batches of records, each in two passes. The first cuts the batch
//! into parts, at most one per thread; each part finds its records' pairs and writes an entry
//! (the pair's index and the byte) for each of an ok probe's two pairs into one list per shard
//! of the pairs. The second gives each shard to one thread, which adds its lists' entries to the
//! buckets of the pairs it alone owns. The counts are sums, so any number of threads counts the
//! same.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::ingest::{NO_TOR, Probes, Rnic, UNKNOWN_RNIC};
use crate::probe::Class;
use crate::quantile::nearest_rank_index;
use crate::report::{ReportError, Scope};

/// Records per batch: their entries (at most two a record, 4 bytes each) are held at once,
/// 16 MiB, whatever a range's size; with the lists' spare capacity ([`PairP99::count_batch`])
/// at most 64 MiB. The tests' few thousand records make several batches.
const BATCH: usize = if cfg!(test) { 1 << 10 } else { 1 << 21 };
/// Fewest records a part is given, so that a small batch is not cut finer than is worth a thread.
const PART_MIN: usize = if cfg!(test) { 1 << 6 } else { 1 << 14 };
/// An entry packs a pair's index within its shard above the byte.
const INDEX_MAX: usize = 1 << 24;
/// Pairs a part remembers, by their RNIC ids: a part's records come from a file or two, so from
/// one prober and its targets, and a lookup of the map is rarely needed.
const RECENT: usize = 256;
/// No pair in a [`RECENT`] slot.
const NO_KEY: u64 = u64::MAX;

/// Exact whole-range RTT p99 per ToR pair and RNIC pair. Every read must see the records the
/// first one saw (a file that grew or changed between reads would make the selection pick a
/// value no record has): each level's buckets must add up to the bucket chosen before, or the
/// page is not written.
pub(super) struct PairP99 {
    /// ToR id by RNIC id (the last: an unknown RNIC), as `report` names ToRs.
    tor_of: Vec<u32>,
    /// Ids by the names rows give the ends (the first RNIC of a name, as `report` keys them).
    tor_ids: HashMap<String, u32>,
    rnic_ids: HashMap<String, u32>,
    /// The unknown RNIC's id.
    unknown: u32,
    /// Prober and target RNIC ids ([`key`]) -> the pairs they count in: their ToR pair's, their
    /// RNIC pair's.
    pairs: HashMap<u64, [u32; 2]>,
    /// Two ToR ids ([`key`]) -> their pair.
    tor_pairs: HashMap<u64, u32>,
    /// Pair `g` is `shards[g % shards.len()]`'s `g / shards.len()`.
    shards: Vec<Shard>,
    /// The entries of the batch being counted, by part then shard (kept between batches).
    entries: Vec<Vec<Vec<u32>>>,
}

/// The pairs one thread counts into.
#[derive(Default)]
struct Shard {
    /// The value's bytes chosen so far, by pair: what the first pass compares.
    prefix: Vec<u32>,
    selections: Vec<Selection>,
}

/// One pair's selection so far.
struct Selection {
    /// Ok probes (counted in the first read).
    n: u64,
    /// The rank still wanted among the values sharing the prefix.
    rank: u64,
    /// How many values share the prefix: what the next read's buckets must add up to.
    sharing: u64,
    /// u64: one bucket can hold every ok probe of a pair over weeks (past 2^32).
    buckets: [u64; 256],
}

/// The map key of two ids.
fn key(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

/// The key of record `i`'s prober and target if it is an ok probe (ids past the dictionary's
/// `unknown` as the unknown RNIC).
#[inline]
fn ok_key(p: &Probes, i: usize, unknown: u32) -> Option<u64> {
    (Class::of(p.outcome[i], p.arrived[i]) == Class::Ok)
        .then(|| key(p.prober[i].min(unknown), p.target[i].min(unknown)))
}

impl PairP99 {
    /// Bytes of a 32-bit value: reads of the ranges.
    pub(super) const LEVELS: u32 = 4;

    pub(super) fn new(rnics: &[Rnic]) -> PairP99 {
        let mut tor_ids: HashMap<String, u32> = HashMap::new();
        let tor_of: Vec<u32> = rnics
            .iter()
            .map(|r| r.tor.as_str())
            .chain([NO_TOR])
            .map(|t| {
                let t = if t.is_empty() { NO_TOR } else { t };
                let next = tor_ids.len() as u32;
                *tor_ids.entry(t.to_owned()).or_insert(next)
            })
            .collect();
        let mut rnic_ids: HashMap<String, u32> = HashMap::new();
        for (i, name) in rnics.iter().map(|r| r.name.as_str()).chain([UNKNOWN_RNIC]).enumerate() {
            rnic_ids.entry(name.to_owned()).or_insert(i as u32);
        }
        let threads = rayon::current_num_threads().max(1);
        PairP99 {
            tor_of,
            tor_ids,
            rnic_ids,
            unknown: rnics.len() as u32,
            pairs: HashMap::new(),
            tor_pairs: HashMap::new(),
            shards: (0..threads).map(|_| Shard::default()).collect(),
            entries: vec![vec![Vec::new(); threads]; threads],
        }
    }

    /// Counts one read's ok probes into the buckets of `level` (the first read finds the pairs).
    pub(super) fn count(&mut self, p: &Probes, level: u32) -> Result<(), ReportError> {
        for from in (0..p.len()).step_by(BATCH) {
            let batch = from..(from + BATCH).min(p.len());
            if level == 0 {
                self.add_pairs(p, batch.clone())?;
            }
            let strangers = self.count_batch(p, batch, level);
            if strangers > 0 {
                return Err(ReportError::Columns(format!(
                    "read {} of the input found {strangers} ok probes of RNIC pairs the first read did not have: a segment changed between the reads (an agent still writing it?); run again on sealed segments",
                    level + 1
                )));
            }
        }
        Ok(())
    }

    /// The parts of `batch`, one per thread at most.
    fn parts(&self, batch: std::ops::Range<usize>) -> Vec<std::ops::Range<usize>> {
        let per = batch.len().div_ceil(self.entries.len()).max(PART_MIN);
        batch.clone().step_by(per).map(|s| s..(s + per).min(batch.end)).collect()
    }

    /// Gives a pair of each scope to the ok probes of `batch` whose ends have none yet, in the
    /// order of their ids (so that the same input numbers its pairs the same way).
    fn add_pairs(&mut self, p: &Probes, batch: std::ops::Range<usize>) -> Result<(), ReportError> {
        let (pairs, unknown) = (&self.pairs, self.unknown);
        let mut new: Vec<u64> = self
            .parts(batch)
            .into_par_iter()
            .flat_map_iter(|r| {
                let mut seen = [NO_KEY; RECENT];
                let mut new = Vec::new();
                for i in r {
                    let Some(k) = ok_key(p, i, unknown) else { continue };
                    let slot = &mut seen[k as usize % RECENT];
                    if *slot != k {
                        *slot = k;
                        if !pairs.contains_key(&k) {
                            new.push(k);
                        }
                    }
                }
                new.sort_unstable();
                new.dedup();
                new
            })
            .collect();
        new.sort_unstable();
        new.dedup();
        for k in new {
            let (a, b) = ((k >> 32) as usize, k as u32 as usize);
            let t = key(self.tor_of[a], self.tor_of[b]);
            let tor = match self.tor_pairs.get(&t) {
                Some(&g) => g,
                None => {
                    let g = self.add_pair()?;
                    self.tor_pairs.insert(t, g);
                    g
                }
            };
            let rnic = self.add_pair()?;
            self.pairs.insert(k, [tor, rnic]);
        }
        Ok(())
    }

    /// A new pair's index.
    fn add_pair(&mut self) -> Result<u32, ReportError> {
        let (g, n) = (self.shards.iter().map(|s| s.prefix.len()).sum::<usize>(), self.shards.len());
        if g / n >= INDEX_MAX - 1 || g >= u32::MAX as usize {
            return Err(ReportError::Columns(format!(
                "more than {g} ToR and RNIC pairs for the page's heatmaps; run `analyze report --scope pair` instead"
            )));
        }
        let shard = &mut self.shards[g % n];
        shard.prefix.push(0);
        shard.selections.push(Selection { n: 0, rank: 0, sharing: 0, buckets: [0; 256] });
        Ok(g as u32)
    }

    /// Counts the ok probes of `batch` into the buckets of `level`: the parts write entries on
    /// every thread, then each shard adds its own. Returns the ok probes of RNIC pairs that have
    /// no index (none in the first read, which gives every pair one first). A part's lists keep
    /// their capacity from batch to batch unless together they hold more than twice what a part
    /// can write (two entries a record): then they are freed, so that a batch that filled some
    /// shards' lists and the next that filled others cannot leave every list at its largest.
    fn count_batch(&mut self, p: &Probes, batch: std::ops::Range<usize>, level: u32) -> u64 {
        let parts = self.parts(batch);
        let used = parts.len();
        let shift = 8 * (Self::LEVELS - 1 - level);
        let Self { pairs, shards, entries, unknown, .. } = self;
        let (pairs, unknown, n) = (&*pairs, *unknown, shards.len());
        let prefix: Vec<&[u32]> = shards.iter().map(|s| s.prefix.as_slice()).collect();
        let strangers = entries.par_iter_mut().zip(parts.into_par_iter()).map(|(out, r)| {
            out.iter_mut().for_each(Vec::clear);
            if out.iter().map(Vec::capacity).sum::<usize>() > 4 * r.len() {
                out.iter_mut().for_each(Vec::shrink_to_fit);
            }
            let mut recent = [(NO_KEY, [0u32; 2]); RECENT];
            let mut strangers = 0u64;
            for i in r {
                let Some(k) = ok_key(p, i, unknown) else { continue };
                let slot = &mut recent[k as usize % RECENT];
                if slot.0 != k {
                    let Some(&g) = pairs.get(&k) else {
                        strangers += 1;
                        continue;
                    };
                    *slot = (k, g);
                }
                let v = (p.network_rtt_ns[i] as u32) ^ 0x8000_0000;
                for g in slot.1 {
                    let (s, at) = (g as usize % n, g / n as u32);
                    if level > 0 && v >> (shift + 8) != prefix[s][at as usize] {
                        continue;
                    }
                    out[s].push((at << 8) | ((v >> shift) & 0xff));
                }
            }
            strangers
        });
        let strangers = strangers.sum();
        // A small batch leaves the lists past its last part as an earlier batch wrote them.
        let entries = &entries[..used];
        shards.par_iter_mut().enumerate().for_each(|(s, shard)| {
            for part in entries {
                for &e in &part[s] {
                    shard.selections[(e >> 8) as usize].buckets[(e & 0xff) as usize] += 1;
                }
            }
        });
        strangers
    }

    /// After the read of `level`: each pair's next byte, the bucket holding its rank.
    pub(super) fn select(&mut self, level: u32) -> Result<(), ReportError> {
        // Every shard's outcome, so that the error said is the first shard's, however the
        // threads ran.
        let outcomes: Vec<Result<(), ReportError>> = self.shards.par_iter_mut().map(|shard| {
            for (s, prefix) in shard.selections.iter_mut().zip(&mut shard.prefix) {
                let counted: u64 = s.buckets.iter().sum();
                if level == 0 {
                    s.n = counted;
                    s.rank = nearest_rank_index(s.n as usize, 0.99) as u64;
                    s.sharing = s.n;
                }
                if counted != s.sharing {
                    return Err(ReportError::Columns(format!(
                        "read {} of the input counted {counted} ok probes of a pair where read {level} counted {}: a segment changed between the reads (an agent still writing it?); run again on sealed segments",
                        level + 1,
                        s.sharing
                    )));
                }
                let mut below = 0u64;
                for (d, &c) in s.buckets.iter().enumerate() {
                    if below + c > s.rank {
                        *prefix = (*prefix << 8) | d as u32;
                        s.rank -= below;
                        s.sharing = c;
                        break;
                    }
                    below += c;
                }
                s.buckets = [0; 256];
            }
            Ok(())
        }).collect();
        outcomes.into_iter().collect()
    }

    /// The p99 of the pair with `ends` in `scope`, and its ok probes; `None` without any.
    pub(super) fn value(&self, scope: Scope, (a, b): &(String, String)) -> Option<(i32, u64)> {
        let g = if scope == Scope::TorPair {
            *self.tor_pairs.get(&key(*self.tor_ids.get(a)?, *self.tor_ids.get(b)?))?
        } else {
            self.pairs.get(&key(*self.rnic_ids.get(a)?, *self.rnic_ids.get(b)?))?[1]
        };
        let shard = &self.shards[g as usize % self.shards.len()];
        let at = g as usize / self.shards.len();
        let s = &shard.selections[at];
        (s.n > 0).then_some(((shard.prefix[at] ^ 0x8000_0000) as i32, s.n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RNICs `h<i>/d` under ToR `t<i % 3>`, the last with no ToR.
    fn rnics(n: u32) -> Vec<Rnic> {
        (0..n)
            .map(|i| Rnic {
                name: format!("h{i}/d"),
                tor: if i + 1 == n { String::new() } else { format!("t{}", i % 3) },
                host: format!("h{i}"),
            })
            .collect()
    }

    /// A read of (prober, target, RTT, ok) records.
    fn read(recs: &[(u32, u32, i32, bool)]) -> Probes {
        let n = recs.len();
        Probes {
            t1_unix_ns: vec![0; n],
            network_rtt_ns: recs.iter().map(|r| r.2).collect(),
            prober_delay_ns: vec![0; n],
            responder_delay_ns: vec![0; n],
            prober: recs.iter().map(|r| r.0).collect(),
            target: recs.iter().map(|r| r.1).collect(),
            outcome: recs.iter().map(|r| if r.3 { 0 } else { 1 }).collect(),
            arrived: vec![0; n],
            ts_source: vec![0; n],
            ..Probes::default()
        }
    }

    /// The four reads of `reads`, in another order each level, as `build_ranges` makes them.
    fn select(p99: &mut PairP99, reads: &[Probes]) -> Result<(), ReportError> {
        for level in 0..PairP99::LEVELS {
            if level > 0 {
                p99.select(level - 1)?;
            }
            let mut order: Vec<&Probes> = reads.iter().collect();
            if level % 2 == 1 {
                order.reverse();
            }
            for r in order {
                p99.count(r, level)?;
            }
        }
        p99.select(PairP99::LEVELS - 1)
    }

    fn nearest_rank(mut values: Vec<i32>) -> Option<(i32, u64)> {
        values.sort_unstable();
        let n = values.len();
        (n > 0).then(|| (values[nearest_rank_index(n, 0.99)], n as u64))
    }

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// The selection gives every pair's nearest-rank p99 of its ok RTTs, negative and extreme
    /// values included, over reads in any order, on pools of 1, 3 and 32 threads (so in one
    /// shard and in many, one part and many, and in batches of the reads). The records come in
    /// runs of a prober, as files give them, and interleaved; ids past the dictionary are the
    /// unknown RNIC; ids 1 and 257 share a slot of a part's recent pairs.
    #[test]
    fn every_pairs_p99_is_the_nearest_rank_of_its_ok_rtts_on_any_number_of_threads() {
        let names = rnics(300);
        let ids = [0u32, 1, 2, 3, 257, 258, 299, 1_000, 5_000];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut recs = Vec::new();
        for run in 0..60 {
            let prober = ids[run % ids.len()];
            for _ in 0..150 {
                let r = xorshift(&mut x);
                let target = ids[(r >> 8) as usize % ids.len()];
                let rtt = ((r >> 40) as i32 - (1 << 22)).wrapping_mul(if r & 1 == 0 { 1 } else { 255 });
                recs.push((prober, target, rtt, !r.is_multiple_of(7)));
            }
        }
        for r in 0..3_000 {
            let v = xorshift(&mut x);
            recs.push((ids[r % ids.len()], ids[(v >> 3) as usize % ids.len()], (v >> 33) as i32, !v.is_multiple_of(5)));
        }
        recs.extend([(0, 1, i32::MIN, true), (0, 1, i32::MAX, true), (0, 1, -1, true), (0, 1, i32::MAX, true)]);
        // A pair whose probes were all lost: it has no p99.
        recs.extend([(4, 5, 123, false); 3]);
        let reads: Vec<Probes> = [0..4_321, 4_321..4_322, 4_322..recs.len()].map(|r| read(&recs[r])).into();
        let unknown = names.len() as u32;
        let name = |id: u32| {
            let id = id.min(unknown) as usize;
            names.get(id).map_or(UNKNOWN_RNIC.to_owned(), |r| r.name.clone())
        };
        let tor = |id: u32| {
            let t = names.get(id.min(unknown) as usize).map_or("", |r| r.tor.as_str());
            if t.is_empty() { NO_TOR.to_owned() } else { t.to_owned() }
        };
        let mut want: std::collections::BTreeMap<(Scope, (String, String)), Vec<i32>> = Default::default();
        for &(a, b, rtt, ok) in &recs {
            for (scope, ends) in [(Scope::Pair, (name(a), name(b))), (Scope::TorPair, (tor(a), tor(b)))] {
                let values = want.entry((scope, ends)).or_default();
                if ok {
                    values.push(rtt);
                }
            }
        }
        assert!(want.values().any(Vec::is_empty), "a pair with no ok probe");
        for threads in [1, 3, 32] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
            let p99 = pool.install(|| {
                let mut p99 = PairP99::new(&names);
                select(&mut p99, &reads).expect("every read saw the same records");
                p99
            });
            for ((scope, ends), values) in &want {
                assert_eq!(
                    p99.value(*scope, ends),
                    nearest_rank(values.clone()),
                    "{threads} threads: {scope:?} {ends:?}"
                );
            }
        }
    }

    /// A read that misses records the first one counted (a file changed between them) is an
    /// error, not a value no record has.
    #[test]
    fn a_read_that_lost_records_is_refused() {
        let mut x = 7u64;
        let values: Vec<i32> = (0..5_000).map(|_| (xorshift(&mut x) >> 40) as i32).collect();
        let recs: Vec<(u32, u32, i32, bool)> = values.iter().map(|&v| (0, 1, v, true)).collect();
        let mut p99 = PairP99::new(&rnics(2));
        p99.count(&read(&recs), 0).expect("first read");
        p99.select(0).expect("one read");
        let g = p99.pairs[&key(0, 1)][1] as usize;
        let prefix = p99.shards[g % p99.shards.len()].prefix[g / p99.shards.len()];
        let top = |v: i32| (v as u32 ^ 0x8000_0000) >> 24;
        let in_bucket: Vec<_> = recs.iter().copied().filter(|r| top(r.2) == prefix).collect();
        assert!(in_bucket.len() > 1, "the chosen bucket holds {}", in_bucket.len());
        p99.count(&read(&in_bucket[..1]), 1).expect("second read");
        let e = p99.select(1).expect_err("records missing from the second read");
        assert!(e.to_string().contains("a segment changed between the reads"), "{e}");
    }

    /// A later read with an RNIC pair the first read did not have (a file that grew or
    /// changed) is refused too: its probes have no selection to count into.
    #[test]
    fn a_read_with_a_pair_the_first_did_not_have_is_refused() {
        let mut p99 = PairP99::new(&rnics(3));
        p99.count(&read(&[(0, 1, 5_000, true)]), 0).expect("first read");
        p99.select(0).expect("one read");
        let e = p99.count(&read(&[(0, 1, 5_000, true), (0, 2, 5_000, true)]), 1).expect_err("a new pair");
        assert!(e.to_string().contains("1 ok probes of RNIC pairs the first read did not have"), "{e}");
    }
}
