//! The ok samples of a range laid out once by pair (window, prober, target), and every scope's
//! quantiles selected from the slices of the pairs it rolls up.
//!
//! Each scope's key is a function of a pair (its window and its two ends), so a scope's samples
//! are the union of its pairs' samples: one counting sort by pair serves every scope, where a
//! counting sort per scope read the whole table twice for each (those passes were half of
//! `report`'s CPU on the bench's data). Pairs are laid out in the pair table's order (window,
//! prober, target), so the pairs of a key taken from the prober's end sit side by side (a
//! window's, one prober's targets) and a key taken from the target's end has a run per prober:
//! a run of consecutive pairs is a single slice.

use super::pairs::{KeySpace, packed};
use super::{Columns, QUANTILES, select_quantiles};
use crate::ingest::filled;
use rayon::prelude::*;

/// Records per block when cutting the table into parts (whole blocks, as the other passes cut);
/// the tests' twenty thousand records are cut into several parts too.
const BLOCK: usize = if cfg!(test) { 1 << 10 } else { 1 << 16 };
/// Most pair counters over all parts (8 bytes each, and as many cursors while samples are
/// placed): a range of more than this many pairs over the threads is cut into fewer parts than
/// threads, down to one, so the counters stay within 256 MiB up to 2^24 pairs and at 16 bytes
/// a pair past that (a pair has at least one record: a range's pairs are at most its records).
const COUNTERS_MAX: usize = 1 << 24;
/// A record that is not an ok sample, in the per-record pair index.
const NO_PAIR: u32 = u32::MAX;

/// The three delay columns of every ok sample, by part then pair.
pub(super) struct PairSamples {
    /// Per part (a range of records, at most one per thread), pair `k`'s samples are
    /// `delays[c][at[part][k]..at[part][k + 1]]`: within a part, pairs follow each other.
    at: Vec<Vec<usize>>,
    delays: [Vec<i32>; 3],
    /// Ok samples per pair, over all parts.
    ok: Vec<usize>,
}

impl PairSamples {
    /// Lays out the ok samples of `c` by pair. `pair_keys` are the pair table's keys
    /// ([`KeySpace::pair`]), ascending, one per pair that has records; a pair's index is its
    /// position there.
    pub(super) fn lay_out(c: &Columns<'_>, pair_keys: &[u64], keys: KeySpace) -> PairSamples {
        let n = c.class.len();
        let pairs = pair_keys.len();
        assert!(pairs < NO_PAIR as usize, "{pairs} pairs in one range: a smaller --range-records reads them");
        let parts = rayon::current_num_threads().clamp(1, (COUNTERS_MAX / (pairs + 1)).max(1));
        let per = n.div_ceil(parts).div_ceil(BLOCK).max(1) * BLOCK;
        let ranges: Vec<std::ops::Range<usize>> = (0..n).step_by(per).map(|s| s..(s + per).min(n)).collect();
        // Pass 1: each record's pair index, and each part's samples per pair.
        let mut pair_of = filled(n, NO_PAIR);
        let mut at: Vec<Vec<usize>> = pair_of
            .par_chunks_mut(per)
            .zip(ranges.par_iter())
            .map(|(out, r)| {
                let mut count = vec![0usize; pairs + 1];
                // A block's records come from a file or two, so from one prober and its few
                // dozen targets in one window: the pairs recently found answer most lookups.
                let mut recent = [(u64::MAX, 0u32); 64];
                for (o, i) in out.iter_mut().zip(r.clone()) {
                    if !packed::is_ok(c.class[i]) {
                        continue;
                    }
                    let key = keys.pair(u64::from(c.d[i]), c.prober[i], c.target[i]);
                    let slot = &mut recent[(key & 63) as usize];
                    if slot.0 != key {
                        let k = pair_keys.binary_search(&key).expect("prepare counted every record's pair");
                        *slot = (key, k as u32);
                    }
                    *o = slot.1;
                    count[slot.1 as usize] += 1;
                }
                count
            })
            .collect();
        // Each part's counts become offsets: part regions in turn, pairs in order within each.
        let mut total = 0usize;
        for offsets in at.iter_mut() {
            for x in offsets.iter_mut() {
                (*x, total) = (total, total + *x);
            }
        }
        let mut delays = [filled(total, 0i32), filled(total, 0i32), filled(total, 0i32)];
        // Pass 2: each part places its samples in its region.
        {
            let mut regions = Vec::with_capacity(at.len());
            let [mut r0, mut r1, mut r2] = delays.each_mut().map(|v| v.as_mut_slice());
            for offsets in &at {
                let len = offsets[pairs] - offsets[0];
                let (a, ar) = std::mem::take(&mut r0).split_at_mut(len);
                let (b, br) = std::mem::take(&mut r1).split_at_mut(len);
                let (e, er) = std::mem::take(&mut r2).split_at_mut(len);
                (r0, r1, r2) = (ar, br, er);
                regions.push([a, b, e]);
            }
            ranges.par_iter().zip(pair_of.par_chunks(per)).zip(regions).zip(&at).for_each(
                |(((r, pair_of), [o0, o1, o2]), offsets)| {
                    let base = offsets[0];
                    let mut cursor: Vec<usize> = offsets[..pairs].iter().map(|x| x - base).collect();
                    for (&k, i) in pair_of.iter().zip(r.clone()) {
                        if k == NO_PAIR {
                            continue;
                        }
                        let at = &mut cursor[k as usize];
                        (o0[*at], o1[*at], o2[*at]) = (c.delays[0][i], c.delays[1][i], c.delays[2][i]);
                        *at += 1;
                    }
                    // Pass 2 found the samples pass 1 counted: every pair's part is filled exactly.
                    assert!(
                        cursor.iter().zip(&offsets[1..]).all(|(c, end)| c + base == *end),
                        "a pair's samples changed between passes"
                    );
                },
            );
        }
        let ok = (0..pairs).map(|k| at.iter().map(|o| o[k + 1] - o[k]).sum()).collect();
        PairSamples { at, delays, ok }
    }

    /// The [`QUANTILES`] of every key that has samples, ascending by key, in parts as
    /// `quantile_frame` takes them. `keys[k]` are pair `k`'s keys in the scope: one, or two for
    /// the either-end scopes when its ends differ.
    pub(super) fn quantiles(&self, keys: &[(u64, Option<u64>)]) -> Vec<(Vec<u64>, Vec<[i32; QUANTILES.len()]>)> {
        let mut entries: Vec<(u64, u32)> = Vec::with_capacity(keys.len() * 2);
        for (k, &(a, b)) in keys.iter().enumerate() {
            debug_assert!(b != Some(a), "a pair counts once per key");
            if self.ok[k] > 0 {
                entries.extend(std::iter::once(a).chain(b).map(|key| (key, k as u32)));
            }
        }
        entries.par_sort_unstable();
        // Runs of entries of about equal samples, cut between keys: a few per thread.
        let total: usize = entries.iter().map(|e| self.ok[e.1 as usize]).sum();
        let share = total.div_ceil(4 * rayon::current_num_threads()).max(1);
        let mut cuts = vec![0usize];
        let mut seen = 0usize;
        for (i, e) in entries.iter().enumerate() {
            if seen >= share && entries[i - 1].0 != e.0 {
                cuts.push(i);
                seen = 0;
            }
            seen += self.ok[e.1 as usize];
        }
        cuts.push(entries.len());
        cuts.par_windows(2)
            .map(|w| {
                let (mut key, mut q) = (Vec::new(), Vec::new());
                let mut pieces: [Vec<&[i32]>; 3] = Default::default();
                for group in entries[w[0]..w[1]].chunk_by(|a, b| a.0 == b.0) {
                    self.pieces(group, &mut pieces);
                    key.push(group[0].0);
                    q.push(select_quantiles(pieces.each_ref().map(Vec::as_slice)));
                }
                (key, q)
            })
            .collect()
    }

    /// The slices holding the samples of `group`'s pairs (ascending): a run of consecutive pairs
    /// is one slice per part.
    fn pieces<'a>(&'a self, group: &[(u64, u32)], pieces: &mut [Vec<&'a [i32]>; 3]) {
        pieces.iter_mut().for_each(Vec::clear);
        for run in group.chunk_by(|a, b| a.1 + 1 == b.1) {
            let (from, to) = (run[0].1 as usize, run[run.len() - 1].1 as usize + 1);
            for offsets in &self.at {
                let r = offsets[from]..offsets[to];
                if !r.is_empty() {
                    for (p, d) in pieces.iter_mut().zip(&self.delays) {
                        p.push(&d[r.clone()]);
                    }
                }
            }
        }
    }
}
