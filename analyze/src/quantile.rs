//! Exact quantiles by nearest rank: the selection every figure of `report`, `html` and
//! `localize` goes through, so that their p50, p99 and p99.9 are the same numbers as polars'
//! `QuantileMethod::Equiprobable` and DuckDB's `quantile_disc` give on the same samples.

/// The 0-based index of the q-quantile among `n` sorted samples (nearest rank, 1-based rank
/// ceil(q * n)), computed exactly as polars' `QuantileMethod::Equiprobable` does it.
pub fn nearest_rank_index(n: usize, q: f64) -> usize {
    ((n as f64 * q).ceil() - 1.0).max(0.0) as usize
}

/// The values at the nearest ranks of `qs` (ascending) among the values of `pieces` (not all
/// empty).
pub fn select_ranks(pieces: &[&[i32]], qs: [f64; 3]) -> [i32; 3] {
    let n = pieces.iter().map(|p| p.len()).sum();
    debug_assert!(n > 0 && qs.is_sorted());
    let ranks = qs.map(|q| nearest_rank_index(n, q));
    let mut out = [0; 3];
    radix_select(pieces, &ranks, &mut out);
    out
}

/// Radix select buckets: 2^11 counters (8 KiB) stay in L1 next to the values being counted.
const RADIX_BITS: u32 = 11;
/// Below this many values, comparison selection beats counting.
const RADIX_MIN_LEN: usize = 512;

/// `out[i]` = the value at 0-based position `ranks[i]` (ascending) of the sorted values of
/// `pieces`. Counting, not comparing: one pass finds the range, one counts values into
/// 2^[`RADIX_BITS`] buckets of equal width, one copies out the buckets holding a wanted rank,
/// which recurse (each level resolves 11 more bits, so at most 3 levels for 32-bit values).
/// Against nested `select_nth_unstable` (p50 over all, p99 over the upper half, p99.9 above
/// that) it saves the data-dependent branches of partitioning, and it reads the samples where
/// they lie, in pieces, without gathering them first. (Log-linear buckets, which keep a single
/// outlier from pushing everything into one bucket, measured slower on the bench's data.)
fn radix_select(pieces: &[&[i32]], ranks: &[usize], out: &mut [i32]) {
    let n: usize = pieces.iter().map(|p| p.len()).sum();
    debug_assert!(ranks.is_sorted() && ranks.last().is_none_or(|&r| r < n));
    if n < RADIX_MIN_LEN {
        let mut small = [0i32; RADIX_MIN_LEN];
        for (s, x) in small.iter_mut().zip(pieces.iter().flat_map(|p| p.iter().copied())) {
            *s = x;
        }
        let v = &mut small[..n];
        // `done`: v[..done] holds the smallest `done` values, v[done - 1] the largest of them.
        let mut done = 0usize;
        for (o, &at) in out.iter_mut().zip(ranks) {
            if at < done {
                // Ranks only repeat (equal q, or tiny n): the previous rank's value.
                *o = v[done - 1];
                continue;
            }
            let (_, x, _) = v[done..].select_nth_unstable(at - done);
            *o = *x;
            done = at + 1;
        }
        return;
    }
    let (lo, hi) = pieces
        .iter()
        .map(|p| p.iter().fold((i32::MAX, i32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x))))
        .fold((i32::MAX, i32::MIN), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)));
    let shift = (u32::BITS - hi.abs_diff(lo).leading_zeros()).saturating_sub(RADIX_BITS);
    let bucket = |x: i32| (x.abs_diff(lo) >> shift) as usize;
    // Four interleaved counters per bucket: runs of equal values would otherwise make each
    // increment wait for the previous one's store.
    let mut lanes = [[0u32; 1 << RADIX_BITS]; 4];
    for p in pieces {
        let mut quads = p.chunks_exact(4);
        for q in &mut quads {
            for (lane, &x) in lanes.iter_mut().zip(q) {
                lane[bucket(x)] += 1;
            }
        }
        for &x in quads.remainder() {
            lanes[0][bucket(x)] += 1;
        }
    }
    let [mut counts, l1, l2, l3] = lanes;
    for (((c, a), b), d) in counts.iter_mut().zip(l1).zip(l2).zip(l3) {
        *c += a + b + d;
    }
    // Each rank's bucket and how many values lie in lower buckets.
    let mut found = [(0usize, 0usize); 3];
    let (mut b, mut below) = (0usize, 0usize);
    for (f, &r) in found.iter_mut().zip(ranks) {
        while below + counts[b] as usize <= r {
            below += counts[b] as usize;
            b += 1;
        }
        *f = (b, below);
    }
    let found = &found[..ranks.len()];
    if shift == 0 {
        // One value per bucket: the bucket is the answer.
        for (o, &(b, _)) in out.iter_mut().zip(found) {
            *o = (i64::from(lo) + b as i64) as i32;
        }
        return;
    }
    // The distinct wanted buckets, copied out side by side, then each selected in.
    let mut wanted: Vec<usize> = found.iter().map(|f| f.0).collect();
    wanted.dedup();
    let mut start = vec![0usize; wanted.len() + 1];
    for (i, &w) in wanted.iter().enumerate() {
        start[i + 1] = start[i] + counts[w] as usize;
    }
    // Without a branch per value (which bucket a value falls in is a coin toss near a rank):
    // every value is written, those of no wanted bucket to a last slot that is overwritten.
    let sink = start[wanted.len()];
    let mut picked = vec![0i32; sink + 1];
    let mut at = [sink; 4];
    at[..wanted.len()].copy_from_slice(&start[..wanted.len()]);
    let mut w = [usize::MAX; 3];
    w[..wanted.len()].copy_from_slice(&wanted);
    for p in pieces {
        for &x in p.iter() {
            let b = bucket(x);
            let i = if b == w[0] {
                0
            } else if b == w[1] {
                1
            } else if b == w[2] {
                2
            } else {
                3
            };
            picked[at[i]] = x;
            at[i] += usize::from(i < 3);
        }
    }
    for (i, &w) in wanted.iter().enumerate() {
        let (mut sub_ranks, mut outs) = (Vec::with_capacity(3), Vec::with_capacity(3));
        for (j, &(b, below)) in found.iter().enumerate() {
            if b == w {
                sub_ranks.push(ranks[j] - below);
                outs.push(j);
            }
        }
        let mut sub_out = [0i32; 3];
        radix_select(&[&picked[start[i]..start[i + 1]]], &sub_ranks, &mut sub_out[..sub_ranks.len()]);
        for (k, &j) in outs.iter().enumerate() {
            out[j] = sub_out[k];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        // 1-based rank ceil(q n): n = 10 -> p50 rank 5, p99 rank 10; n = 1000 -> p99.9 rank 999.
        assert_eq!(nearest_rank_index(10, 0.5), 4);
        assert_eq!(nearest_rank_index(10, 0.99), 9);
        assert_eq!(nearest_rank_index(1000, 0.999), 998);
        assert_eq!(nearest_rank_index(1, 0.5), 0);
    }

    /// The selection gives the sorted samples' nearest ranks, for sizes where ranks coincide
    /// (1, 2, 3) or sit at the edges (100, 1000, 1001), on both sides of the counting threshold,
    /// with many ties and with none, with extremes that force every counting level, whole or in
    /// pieces.
    #[test]
    fn selected_ranks_are_the_sorted_ones() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in [1usize, 2, 3, 7, 10, 99, 100, 101, 511, 512, 999, 1000, 1001, 4096, 100_000] {
            for (spread, outliers) in [(1u64, false), (5, false), (1 << 30, false), (5, true), (3000, true)] {
                let mut v: Vec<i32> = (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % spread) as i32 - (spread / 3) as i32
                    })
                    .collect();
                if outliers && n > 4 {
                    // The extremes stretch the first level's buckets: the ranks land in one
                    // bucket holding nearly everything, which takes the next levels.
                    v[n / 2] = i32::MAX;
                    v[n / 3] = i32::MIN;
                }
                let mut sorted = v.clone();
                sorted.sort_unstable();
                for qs in [[0.5, 0.99, 0.999], [0.5, 0.99, 0.99]] {
                    let want = qs.map(|q| sorted[nearest_rank_index(n, q)]);
                    assert_eq!(select_ranks(&[&v], qs), want, "n {n} spread {spread} {qs:?}");
                    // The same values in pieces, one of them empty, as the layout hands them over.
                    let (a, b) = v.split_at(n / 3);
                    assert_eq!(select_ranks(&[a, &[], b], qs), want, "n {n} spread {spread} {qs:?} in pieces");
                }
            }
        }
    }
}
