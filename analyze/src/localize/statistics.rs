//! The statistics the stages test with, apart from what they test: order statistics over
//! samples, binomial and Poisson tails, the log-likelihood ratios of a share's excess and of a
//! split, the false-discovery cut over every (element, window) test, and
//! [`smallest_detectable`], which says what a window of a given size can show under those rules.

use super::Options;

/// z of the 99th percentile of the standard normal.
pub(super) const Z99: f64 = 2.326_347_874;
/// Median absolute deviation to standard deviation, for a normal.
pub(super) const MAD_TO_SIGMA: f64 = 1.482_6;

/// The p99 a log-normal through the median and the median absolute deviation of the logs of
/// `v` (all > 0) puts: a p99 that a minority of large values cannot move (a plain p99 is the
/// minority's own as soon as it holds 1% of them). Reorders `v`; 0 when empty.
pub(super) fn robust_p99(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut logs: Vec<f64> = v.iter().map(|r| r.ln()).collect();
    let log_median = median(&mut logs);
    let mut dev: Vec<f64> = logs.iter().map(|l| (l - log_median).abs()).collect();
    let sigma = median(&mut dev) * MAD_TO_SIGMA;
    (log_median + Z99 * sigma).exp()
}

/// The lower quartile the nulls take of bad shares over RNICs or hosts (element
/// `(len - 1) / 4` in order), reordering `v`; 0 when empty.
pub(super) fn null_quartile(v: &mut [f64]) -> f64 {
    let k = v.len().saturating_sub(1) / 4;
    order_statistic(v, k)
}

/// The lower quartile of `v` (element `len / 4` in order), reordering it; 0 when empty.
pub(super) fn lower_quartile(v: &mut [f64]) -> f64 {
    order_statistic(v, v.len() / 4)
}

/// The median (upper middle) of `v`, reordering it; 0 when empty.
pub(super) fn median(v: &mut [f64]) -> f64 {
    order_statistic(v, v.len() / 2)
}

/// Element `k` of `v` in order, reordering it; 0 when empty.
pub(super) fn order_statistic(v: &mut [f64], k: usize) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    *v.select_nth_unstable_by(k, f64::total_cmp).1
}

/// The largest share `p` with `n` x KL(k/n || p) <= `llr`: an upper confidence bound on the
/// share that `k` of `n` measured (1 when `n` is 0).
pub(super) fn share_upper_bound(k: u32, n: u32, llr: f64) -> f64 {
    if n == 0 {
        return 1.0;
    }
    let r = f64::from(k) / f64::from(n);
    let (mut lo, mut hi) = (r, 1.0);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if f64::from(n) * kl(r, mid) <= llr { lo = mid } else { hi = mid }
    }
    lo
}

/// P(Poisson(`lambda`) >= `k`), summed in log space.
pub(super) fn poisson_tail(lambda: f64, k: u32) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if lambda <= 0.0 {
        return 0.0;
    }
    // At or below the mean the tail is about a half or more (and summing from k would
    // underflow for a large lambda): above any alpha.
    if f64::from(k) <= lambda {
        return 1.0;
    }
    // ln of the k-th term, then terms k.. until they no longer count.
    let mut ln_term = -lambda + f64::from(k) * lambda.ln() - (1..=k).map(|j| f64::from(j).ln()).sum::<f64>();
    let mut sum = 0.0;
    for j in k..k.saturating_add(10_000) {
        let term = ln_term.exp();
        sum += term;
        if term < sum * 1e-15 && f64::from(j) > lambda {
            break;
        }
        ln_term += lambda.ln() - f64::from(j + 1).ln();
    }
    sum.min(1.0)
}

/// RNICs with fewer probes than this in a window do not vote on the window's null share.
pub(super) const NULL_MIN_PROBES: u32 = 10;

/// Kullback-Leibler divergence of Bernoulli(`a`) from Bernoulli(`b`), nats; `b` in (0, 1).
pub(super) fn kl(a: f64, b: f64) -> f64 {
    let term = |x: f64, y: f64| if x <= 0.0 { 0.0 } else { x * (x / y).ln() };
    term(a, b) + term(1.0 - a, 1.0 - b)
}

/// The log-likelihood ratio of `bad` of `total` having a higher bad share than `null`:
/// `total` x KL(bad/total || null) when above it, else 0. exp(-llr) bounds the binomial tail
/// P(X >= bad) from above (Chernoff), so it is also a conservative p-value.
pub(super) fn excess_llr(bad: u32, total: u32, null: f64) -> f64 {
    if total == 0 {
        return 0.0;
    }
    let r = f64::from(bad) / f64::from(total);
    let null = null.clamp(1e-12, 1.0 - 1e-12);
    if r <= null { 0.0 } else { f64::from(total) * kl(r, null) }
}

/// The log-likelihood ratio of two bad shares, a's above b's, against one pooled share.
pub(super) fn split_llr(bad_a: u32, total_a: u32, bad_b: u32, total_b: u32) -> f64 {
    if total_a == 0 || total_b == 0 {
        return 0.0;
    }
    let (ra, rb) = (f64::from(bad_a) / f64::from(total_a), f64::from(bad_b) / f64::from(total_b));
    if ra <= rb {
        return 0.0;
    }
    let pooled = f64::from(bad_a + bad_b) / f64::from(total_a + total_b);
    f64::from(total_a) * kl(ra, pooled) + f64::from(total_b) * kl(rb, pooled)
}

/// The smallest log-likelihood ratio Benjamini-Hochberg rejects at `fdr` among `tests` tests
/// (0 for a test with no excess), taking exp(-llr) as each p-value; infinity when none. `llrs`
/// need hold only the ratios of at least -ln(`fdr`) ([`Llrs`]): no smaller one can be rejected,
/// and the larger ones keep their ranks.
pub(super) fn bh_llr_cut(mut llrs: Vec<f64>, tests: u64, fdr: f64) -> f64 {
    let m = tests as f64;
    llrs.sort_by(|a, b| b.total_cmp(a));
    let mut cut = f64::INFINITY;
    for (i, &g) in llrs.iter().enumerate() {
        if -g <= ((i + 1) as f64 * fdr / m).ln() {
            cut = g;
        }
    }
    cut
}

/// The share of its probes an element must have bad to be a candidate, against the window's
/// null share. Loss: `loss_ratio_min`. Slowness: `slow_ratio_min` of the probes the window's
/// null leaves fast. A healthy probe is slow with the null's probability q (at least the floor:
/// 1% above a robust p99), and an element that slows a share f of its otherwise fast probes has
/// q + (1 - q) f of them slow: the bar asks f >= `slow_ratio_min` (50%) whatever q, with q the
/// null's excess over its floor. A slow element delays every probe crossing it (f near 1),
/// while a fleet slowed as a whole leaves its healthy elements at f near 0 (their shares are
/// binomial around q), so the bar sits halfway between the two: on generated fleets 5-40%
/// slowed as a whole, 100 seeds, no element was named, and every slow RNIC (+30 us) was
/// (`busy_slowed_and_stall_rules_hold_with_margin_on_generated_fleets`). A busy host's share
/// is the busy rule's, not this bar's ([`busy_host`]).
pub(super) fn ratio_bar(slowness: bool, opts: &Options, null: f64) -> f64 {
    if !slowness {
        return opts.loss_ratio_min;
    }
    let shift = ((null - opts.slow_null_floor) / (1.0 - opts.slow_null_floor)).max(0.0);
    opts.slow_ratio_min + (1.0 - opts.slow_ratio_min) * shift
}

/// What [`smallest_detectable`] is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// A share of lost probes.
    Loss,
    /// A share of slow probes (above the fleet's robust p99).
    Slowness,
}

/// The smallest bad share (lost, or slow, per probe) that an element crossed by `probes` probes
/// in a window is named for with probability `power`, by this module's rules with `opts`, when
/// the window's null is its floor and the false-discovery cut is the one the first of `tests`
/// (element, window) tests must pass (llr >= ln(tests / fdr)). `None` when no share can be (too
/// few probes for `lost_min`). This is the table in docs/design/localisation.md#the-smallest-fault-a-window-can-show.
pub fn smallest_detectable(probes: u32, signal: Signal, opts: &Options, tests: u64, power: f64) -> Option<f64> {
    let null = match signal {
        Signal::Loss => opts.loss_null_floor,
        Signal::Slowness => opts.slow_null_floor,
    };
    let ratio_min = ratio_bar(signal == Signal::Slowness, opts, null);
    let cut = (tests as f64 / opts.fdr).ln();
    let n = probes;
    let named = |k: u32| {
        let r = f64::from(k) / f64::from(n);
        k >= opts.lost_min && r >= ratio_min && r >= opts.excess_over_null_min * null && excess_llr(k, n, null) >= cut
    };
    let k_min = (0..=n).find(|&k| named(k))?;
    // P(Binomial(n, p) >= k_min), summed in log space (n ln(1 - p) underflows for large n).
    let tail = |p: f64| -> f64 {
        let (lp, lq) = (p.ln(), (1.0 - p).ln());
        let mut ln_term = f64::from(n) * lq;
        let mut below = 0.0;
        for j in 0..k_min {
            below += ln_term.exp();
            ln_term += f64::from(n - j).ln() - f64::from(j + 1).ln() + lp - lq;
        }
        1.0 - below
    };
    let (mut lo, mut hi) = (1e-9f64, 1.0 - 1e-9);
    if tail(hi) < power {
        return None;
    }
    for _ in 0..100 {
        let mid = (lo * hi).sqrt();
        if tail(mid) >= power {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn the_false_discovery_cut_is_benjamini_hochberg_on_chernoff_p_values() {
        // p = exp(-llr): 1e-6, 1e-3, 0.02, 0.5 and 96 tests with no excess. At 1% over 100
        // tests: 1e-6 <= 1 x 1e-4 and 1e-3 <= 2 x 1e-4 fails, 0.02 > 3 x 1e-4: one rejected.
        let mut llrs = vec![-(1e-6f64).ln(), -(1e-3f64).ln(), -(0.02f64).ln(), -(0.5f64).ln()];
        llrs.extend([0.0; 96]);
        assert_eq!(bh_llr_cut(llrs.clone(), 100, 0.01), -(1e-6f64).ln());
        // At 10%: 1e-3 <= 2 x 1e-3 passes too.
        assert_eq!(bh_llr_cut(llrs.clone(), 100, 0.1), -(1e-3f64).ln());
        assert_eq!(bh_llr_cut(vec![0.0; 10], 10, 0.01), f64::INFINITY, "nothing in excess, nothing passes");
        // What Llrs keeps (the ratios that could pass, and the count of tests) cuts the same.
        for fdr in [0.01, 0.1] {
            let keep_from = Llrs::new(fdr).keep_from;
            let kept: Vec<f64> = llrs.iter().copied().filter(|&g| g >= keep_from).collect();
            assert!(kept.len() < llrs.len());
            assert_eq!(bh_llr_cut(kept, 100, fdr), bh_llr_cut(llrs.clone(), 100, fdr));
        }
        // The Chernoff bound is conservative: 3 of 1000 at a null of 1e-4 has an exact tail of
        // about 1.5e-4; the bound is larger, never smaller.
        let bound = (-excess_llr(3, 1000, 1e-4)).exp();
        assert!(bound > 1.5e-4 && bound < 1e-2, "{bound}");
    }
}
