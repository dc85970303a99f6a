//! Stage 1: the fleet's usual delays. [`Sampler`] takes a strided sample of ok probes by
//! position in the whole input (pass 1); [`Baselines`] turns it into one baseline per timestamp
//! source and scope (ToR-mesh, inter-ToR): when a probe is slow (above a robust p99), when a host
//! delay is a stall, and per window how far the fleet's ToR-mesh RTT rose (the shift that scales
//! that window's slow thresholds, voted by ToR).

use super::statistics::{lower_quartile, median, order_statistic, robust_p99};
use super::{Baseline, HOST_NOISE_OVER_FLEET_P99, Options, RttShift};
use crate::ingest::{Dataset, Probes};
use crate::probe::{Class, TS_CODES, ts_code, ts_name};
use std::collections::HashMap;

/// A ToR's ToR-mesh ok probes of one source in a window, at least, for its RTT factor to vote
/// on the window's shift, whatever [`shift_min_samples`] asks.
pub const SHIFT_MIN_SAMPLES: usize = 10;
/// A ToR's factor votes once its lower quartile is known to this relative standard error.
pub(super) const SHIFT_SE_MAX: f64 = 0.05;
/// The standard error of a sample's lower quartile, in units of the log-RTT's sigma over the
/// square root of the samples: sqrt(p (1 - p)) / phi(z_p) at p = 1/4 for a normal (log-normal
/// RTT): sqrt(3/16) / 0.3178.
pub(super) const LQ_SE_PER_SIGMA: f64 = 1.362;
/// ToRs that must see a window's RTT rise, at least, for it to be the fleet's: one ToR's rise
/// is that ToR's.
pub(super) const SHIFT_MIN_TORS: usize = 2;
/// Ok probes sampled for the windows' RTT shifts, across all windows (a stride over the input).
pub(super) const SHIFT_SAMPLE_TARGET: usize = 2_000_000;

/// Samples a ToR needs in a window for its factor to vote ([`SHIFT_SE_MAX`]), given the log-RTT
/// spread `sigma` of the source's ToR-mesh baseline: (1.362 sigma / 0.05)^2, at least
/// [`SHIFT_MIN_SAMPLES`] (about 67 for a healthy fleet's sigma of 0.3).
pub(super) fn shift_min_samples(sigma: f64) -> usize {
    let n = (LQ_SE_PER_SIGMA * sigma / SHIFT_SE_MAX).powi(2);
    if n.is_finite() { (n.ceil() as usize).max(SHIFT_MIN_SAMPLES) } else { SHIFT_MIN_SAMPLES }
}

/// Ok probes sampled for a baseline: a median and a p99 need no more.
pub(super) const SAMPLE_TARGET: usize = 200_000;
/// A timestamp source with fewer samples than this in the fleet-wide strided sample is sampled
/// whole.
pub(super) const SAMPLE_MIN: usize = 1_000;
/// Scopes of a baseline: index 0 within one ToR, 1 between ToRs.
pub(super) const SCOPES: [&str; 2] = ["tor_mesh", "inter_tor"];
/// One [`Baseline`] per timestamp-source code and scope; `None` where no ok probe is.
#[derive(Debug, Clone, Default)]
pub struct Baselines {
    pub(super) by_code: [[Option<Baseline>; 2]; TS_CODES],
    /// (window, source code) -> how far the window's ToR-mesh RTT lower quartile lies above the
    /// baseline's, where it does ([`Baselines::measure_shifts`]).
    /// Looked up for every ok probe: foldhash, not SipHash (`shift`).
    pub(super) shifts: HashMap<(u32, usize), f64, foldhash::fast::RandomState>,
    /// What a source without a baseline gets (an empty sample: no ok probe of it exists).
    pub(super) slow_default_ns: f64,
    pub(super) noise_default_ns: i64,
    /// By source code: the share of the sampled ok probes' host-delay legs above the stall
    /// threshold, (late + 1) / (legs + 1): never zero, since a sample cannot tell a rate below
    /// one in its size ([`stall`]'s null).
    pub(super) late_share: [Option<f64>; TS_CODES],
    /// By source code: the robust p99 ([`robust_p99`]) of one host-delay leg (prober and
    /// responder delays pooled), ns: a leg above it is late for the busy test ([`busy_host`]).
    pub(super) leg_p99_robust_ns: [Option<f64>; TS_CODES],
}

impl Baselines {
    /// A probe stamped by `ts_source` is slow above this RTT, ns; `inter` for a probe between
    /// two ToRs. A scope without samples borrows the other scope's threshold.
    pub fn slow_ns(&self, ts_source: u8, inter: bool) -> f64 {
        let both = &self.by_code[usize::from(ts_code(ts_source))];
        both[usize::from(inter)]
            .as_ref()
            .or(both[usize::from(!inter)].as_ref())
            .map_or(self.slow_default_ns, |b| b.slow_threshold_ns)
    }

    /// [`Baselines::slow_ns`] in window `w`: scaled by the window's shift.
    pub fn slow_ns_in(&self, ts_source: u8, inter: bool, w: u32) -> f64 {
        self.slow_ns(ts_source, inter) * self.shift(w, ts_source)
    }

    /// How far window `w`'s ToR-mesh RTT of `ts_source` lies above the baseline (1 when not).
    pub(super) fn shift(&self, w: u32, ts_source: u8) -> f64 {
        if self.shifts.is_empty() {
            return 1.0;
        }
        self.shifts.get(&(w, usize::from(ts_code(ts_source)))).copied().unwrap_or(1.0)
    }

    /// Measures, per window and timestamp source, how far the fleet's ToR-mesh RTT rose, and
    /// scales that window's slow thresholds (both scopes) by as much. A probe is slow above a
    /// fixed threshold, so a fleet slowed as a whole (a busy machine, a kernel slowed by
    /// something else) pushes many healthy probes past it, and the RNICs it slows a little more
    /// cross the bar: the Clos testbed's CI run shifted every probe's RTT by 1.7x for 23 s and
    /// named three RNICs at 69-80% slow against a null of 27-30%.
    ///
    /// Each ToR votes once: its factor is the lower quartile of its ToR-mesh RTT in the window
    /// over its own across the input (ToR-mesh probes cross their ToR and no spine, so a slow
    /// link or spine moves no factor; an RNIC is a minority of its ToR's pairs). The window's
    /// shift is the lower median of the factors (the `ceil(n / 2)`-th smallest) of at least
    /// [`SHIFT_MIN_TORS`] ToRs with enough samples ([`shift_min_samples`]): a shift seen by at
    /// least half of the ToRs. Where fewer ToRs have enough (a thin strided sample of a long,
    /// wide input), the window's pooled lower quartile against the baseline's, unless one ToR
    /// holds more than half of the window's samples; a single-ToR fabric gets no shift (its
    /// ToR's slowness and a fleet's cannot be told apart, and the fault is what must show). A pooled quartile let one ToR decide: a ToR with 24 RNICs
    /// against one of 8 holds 91% of the mesh pairs, and when it turned 3x slow, its own rise
    /// scaled its thresholds away and it was never named. A window where half the ToRs or
    /// more rose together is indistinguishable from a fleet-wide shift, and is taken for one.
    /// `by` holds the samples by (window, source code, ToR), as [`Sampler`] sampled them.
    pub(super) fn measure_shifts(&mut self, by: HashMap<(u32, usize, u32), Vec<f64>>) {
        let mut own: HashMap<(usize, u32), Vec<f64>> = HashMap::new();
        for (&(_, c, tor), v) in &by {
            own.entry((c, tor)).or_default().extend_from_slice(v);
        }
        let usual: HashMap<(usize, u32), f64> = own.into_iter().map(|(k, mut v)| (k, lower_quartile(&mut v))).collect();
        // Per (window, source): the voting ToRs' factors, and every sample with the most any
        // one ToR holds (for the pooled fallback).
        let mut factors: HashMap<(u32, usize), Vec<f64>> = HashMap::new();
        let mut pooled: HashMap<(u32, usize), (Vec<f64>, usize)> = HashMap::new();
        for ((w, c, tor), mut v) in by {
            let Some(b) = self.by_code[c][0].as_ref() else { continue };
            let min = b.shift_min_samples();
            let p = pooled.entry((w, c)).or_default();
            p.1 = p.1.max(v.len());
            p.0.extend_from_slice(&v);
            let base = usual.get(&(c, tor)).copied().unwrap_or(0.0);
            if v.len() >= min && base > 0.0 {
                factors.entry((w, c)).or_default().push(lower_quartile(&mut v) / base);
            }
        }
        let mut shifts = HashMap::default();
        for (key, (mut all, most)) in pooled {
            let voted = factors.remove(&key).filter(|f| f.len() >= SHIFT_MIN_TORS);
            let factor = match voted {
                Some(mut f) => {
                    let k = (f.len() - 1) / 2;
                    order_statistic(&mut f, k)
                }
                // Too few ToRs with enough samples to vote (a thin strided sample of a long,
                // wide input): the pooled quartile against the baseline's, unless one ToR holds
                // more than half of it (then it would decide alone, as a single-ToR fabric's
                // would: no shift there).
                None => match self.by_code[key.1][0].as_ref() {
                    Some(b) if 2 * most <= all.len() && all.len() >= b.shift_min_samples() && b.rtt_ns_p25 > 0.0 => {
                        lower_quartile(&mut all) / b.rtt_ns_p25
                    }
                    _ => continue,
                },
            };
            if factor > 1.0 {
                shifts.insert(key, factor);
            }
        }
        self.shifts = shifts;
    }

    /// The windows whose thresholds were scaled, in time then source order.
    pub(super) fn rtt_shifts(&self, window_ns: u64) -> Vec<RttShift> {
        let mut v: Vec<RttShift> = self
            .shifts
            .iter()
            .map(|(&(w, c), &factor)| RttShift {
                window_start_ns: u64::from(w) * window_ns,
                ts_source: ts_name(c as u8),
                factor,
            })
            .collect();
        v.sort_by(|a, b| a.window_start_ns.cmp(&b.window_start_ns).then(a.ts_source.cmp(b.ts_source)));
        v
    }

    /// A host delay stamped by `ts_source` above this is a stall, ns.
    pub fn noise_ns(&self, ts_source: u8) -> i64 {
        self.either_scope(ts_source).map_or(self.noise_default_ns, |b| b.host_noise_threshold_ns)
    }

    /// A host-delay leg of `ts_source` above this is late for the busy test, ns; `None`
    /// without a sample of the source.
    pub(super) fn leg_late_ns(&self, ts_source: u8) -> Option<f64> {
        self.leg_p99_robust_ns[usize::from(ts_code(ts_source))]
    }

    /// A baseline of `ts_source`, either scope: the host-delay figures are the source's, the
    /// same in both.
    pub(super) fn either_scope(&self, ts_source: u8) -> Option<&Baseline> {
        self.by_code[usize::from(ts_code(ts_source))].iter().flatten().next()
    }

    /// The share of host-delay legs above the stall threshold in the fleet, the largest over
    /// the timestamp sources (1 without a sample: then no cluster is a stall).
    pub(super) fn late_share(&self) -> f64 {
        self.late_share.iter().flatten().copied().reduce(f64::max).unwrap_or(1.0)
    }

    /// Every baseline, in (source, scope) order.
    pub(super) fn all(&self) -> impl Iterator<Item = &Baseline> {
        self.by_code.iter().flatten().flatten()
    }
}

/// The ToR id of each RNIC (RNICs without a ToR share id `u32::MAX`), for telling ToR-mesh from
/// inter-ToR probes by their ends.
pub(super) fn tor_ids(ds: &Dataset) -> Vec<u32> {
    let mut ids: HashMap<&str, u32> = HashMap::new();
    ds.rnics
        .iter()
        .map(|r| {
            if r.tor.is_empty() {
                return u32::MAX;
            }
            let next = ids.len() as u32;
            *ids.entry(r.tor.as_str()).or_insert(next)
        })
        .collect()
}

/// Whether probe `i` runs between two ToRs (by its ends, so service probes count too).
pub(super) fn is_inter(p: &Probes, tor_of: &[u32], i: usize) -> bool {
    ends_inter(tor_of, p.prober[i], p.target[i], p.kind[i])
}

/// Whether probes from `prober` to `target` run between two ToRs, by their ends' ToRs; by the
/// probe `kind` where an end is no known RNIC.
pub(super) fn ends_inter(tor_of: &[u32], prober: u32, target: u32, kind: u8) -> bool {
    match (tor_of.get(prober as usize), tor_of.get(target as usize)) {
        (Some(a), Some(b)) => a != b,
        _ => kind == 1,
    }
}

/// One sampled ok probe: (RTT, prober delay, responder delay, inter-ToR).
pub(super) type Sample = (i32, i32, i32, bool);

/// Record `i` of `p` as a [`Sample`].
fn sample(p: &Probes, i: usize, inter: bool) -> Sample {
    (p.network_rtt_ns[i], p.prober_delay_ns[i], p.responder_delay_ns[i], inter)
}

/// What [`Sampler::add`] takes from one block of a range.
#[derive(Default)]
struct SampledBlock {
    /// Ok probes by source code.
    ok: [usize; TS_CODES],
    samples: [Vec<Sample>; TS_CODES],
    shift: HashMap<(u32, usize, u32), Vec<f64>>,
}

/// Stage 1: the fleet's usual RTT and host delays per timestamp source (and, for RTT, per
/// scope), from a strided sample of ok probes. Host noise is judged against the fleet's own host
/// delays: a fleet whose healthy hosts take milliseconds to turn a probe around (soft-RoCE, a
/// VM) must not be all "noisy". Per source, because a host-poll stamp includes the poll loop's
/// latency where a kernel or NIC stamp does not: a pooled baseline would call every host-poll
/// RNIC slow. The sample is by position in the whole input ([`Probes::index_of`]), so that a
/// range at a time samples what the whole input would.
pub(super) struct Sampler {
    pub(super) stride: u64,
    pub(super) shift_stride: u64,
    /// (RTT, larger host delay, inter-ToR) by source code.
    pub(super) samples: [Vec<Sample>; TS_CODES],
    /// Every ok probe of a source while its strided sample is thinner than [`SAMPLE_MIN`] (and
    /// the stride above 1): a source rare in the fleet (one host-poll RNIC among
    /// kernel-stamped ones) has few or no probes in the fleet-wide stride and is sampled whole,
    /// which is little (fewer than SAMPLE_MIN in the stride means about SAMPLE_MIN x stride,
    /// n / 200, at most). Dropped once the strided sample is thick enough.
    pub(super) whole: [Option<Vec<Sample>>; TS_CODES],
    /// ToR-mesh ok RTTs by (window, source code, the ToR), for [`Baselines::measure_shifts`].
    pub(super) shift: HashMap<(u32, usize, u32), Vec<f64>>,
}

impl Sampler {
    /// For an input of `n` records.
    pub(super) fn new(n: usize) -> Sampler {
        let stride = (n / SAMPLE_TARGET).max(1) as u64;
        Sampler {
            stride,
            shift_stride: (n / SHIFT_SAMPLE_TARGET).max(1) as u64,
            samples: Default::default(),
            whole: std::array::from_fn(|_| (stride > 1).then(Vec::new)),
            shift: HashMap::new(),
        }
    }

    /// One range: its strided samples in blocks on every core ([`super::in_blocks`]), appended
    /// in record order, and, for a source whose strided sample is still thinner than
    /// [`SAMPLE_MIN`] after them, every ok probe of the range (a second pass, made only then):
    /// what one pass in order keeps.
    pub(super) fn add(&mut self, p: &Probes, tor_of: &[u32], window_ns: u64) {
        let (stride, shift_stride) = (self.stride, self.shift_stride);
        let parts = super::in_blocks(p.len(), |_, r| {
            let mut part = SampledBlock::default();
            for i in r {
                if Class::of(p.outcome[i], p.arrived[i]) != Class::Ok {
                    continue;
                }
                let (at, c, inter) = (p.index_of(i), usize::from(ts_code(p.ts_source[i])), is_inter(p, tor_of, i));
                part.ok[c] += 1;
                if at.is_multiple_of(stride) {
                    part.samples[c].push(sample(p, i, inter));
                }
                if at.is_multiple_of(shift_stride) && !inter {
                    let tor = tor_of.get(p.prober[i] as usize).copied().unwrap_or(u32::MAX);
                    let key = ((p.t1_unix_ns[i] / window_ns) as u32, c, tor);
                    part.shift.entry(key).or_default().push(f64::from(p.network_rtt_ns[i].max(1)));
                }
            }
            part
        });
        let mut ok = [0usize; TS_CODES];
        for part in parts {
            for (mine, theirs) in self.samples.iter_mut().zip(&part.samples) {
                mine.extend_from_slice(theirs);
            }
            for (n, m) in ok.iter_mut().zip(part.ok) {
                *n += m;
            }
            for (key, v) in part.shift {
                self.shift.entry(key).or_default().extend(v);
            }
        }
        let mut thin = [false; TS_CODES];
        for c in 0..TS_CODES {
            if self.samples[c].len() >= SAMPLE_MIN {
                self.whole[c] = None;
            }
            thin[c] = self.whole[c].is_some() && ok[c] > 0;
        }
        if !thin.contains(&true) {
            return;
        }
        let parts = super::in_blocks(p.len(), |_, r| {
            let mut whole: [Vec<Sample>; TS_CODES] = Default::default();
            for i in r {
                let c = usize::from(ts_code(p.ts_source[i]));
                if thin[c] && Class::of(p.outcome[i], p.arrived[i]) == Class::Ok {
                    whole[c].push(sample(p, i, is_inter(p, tor_of, i)));
                }
            }
            whole
        });
        for part in parts {
            for (w, v) in self.whole.iter_mut().zip(part) {
                if let Some(w) = w {
                    w.extend(v);
                }
            }
        }
    }

    pub(super) fn finish(self, opts: &Options) -> Baselines {
        let Sampler { mut samples, whole, shift, .. } = self;
        for (c, w) in whole.into_iter().enumerate() {
            if let Some(w) = w
                && samples[c].len() < SAMPLE_MIN
            {
                samples[c] = w;
            }
        }
        let mut out = Baselines::empty(opts);
        for (c, s) in samples.iter_mut().enumerate() {
            if s.is_empty() {
                continue;
            }
            let k = (s.len() * 99 / 100).min(s.len() - 1);
            s.select_nth_unstable_by_key(k, |x| x.1.max(x.2));
            let host_delay_ns_p99 = i64::from(s[k].1.max(s[k].2));
            let legs: Vec<f64> = s.iter().flat_map(|x| [x.1, x.2]).map(|d| f64::from(d.max(1))).collect();
            let rtt = std::array::from_fn(|scope| {
                s.iter().filter(|x| usize::from(x.3) == scope).map(|x| f64::from(x.0.max(1))).collect()
            });
            out.set_source(c, rtt, legs, host_delay_ns_p99, opts);
        }
        out.measure_shifts(shift);
        out
    }
}

impl Baselines {
    /// No baseline yet: what a source without samples gets.
    pub(super) fn empty(opts: &Options) -> Baselines {
        Baselines {
            by_code: Default::default(),
            shifts: HashMap::default(),
            slow_default_ns: opts.slow_margin_ns,
            noise_default_ns: opts.host_delay_noise_ns,
            late_share: [None; TS_CODES],
            leg_p99_robust_ns: [None; TS_CODES],
        }
    }

    /// Source `c`'s baselines from its samples: ok RTTs by scope, host-delay legs (prober and
    /// responder delays pooled, each at least 1 ns) and the p99 of a probe's larger host delay.
    pub(super) fn set_source(
        &mut self,
        c: usize,
        rtt: [Vec<f64>; 2],
        mut legs: Vec<f64>,
        host_delay_ns_p99: i64,
        opts: &Options,
    ) {
        let out = self;
        {
            let host_noise_threshold_ns =
                opts.host_delay_noise_ns.max(host_delay_ns_p99.saturating_mul(HOST_NOISE_OVER_FLEET_P99));
            let late = legs.iter().filter(|&&d| d > host_noise_threshold_ns as f64).count();
            out.late_share[c] = Some((late + 1) as f64 / (legs.len() + 1) as f64);
            // Whole ns: a fleet of equal delays must not find its own delays above their p99
            // for the rounding of exp(ln).
            out.leg_p99_robust_ns[c] = Some(robust_p99(&mut legs).ceil());
            for (scope, (name, mut rtt)) in SCOPES.iter().zip(rtt).enumerate() {
                if rtt.is_empty() {
                    continue;
                }
                let rtt_ns_p50 = median(&mut rtt);
                let rtt_ns_p25 = lower_quartile(&mut rtt);
                let rtt_ns_p99_robust = robust_p99(&mut rtt);
                let slow_threshold_ns =
                    rtt_ns_p99_robust.max(rtt_ns_p50 * opts.slow_p50_factor).max(rtt_ns_p50 + opts.slow_margin_ns);
                out.by_code[c][scope] = Some(Baseline {
                    ts_source: ts_name(c as u8),
                    scope: name,
                    samples: rtt.len() as u64,
                    rtt_ns_p50,
                    rtt_ns_p25,
                    rtt_ns_p99_robust,
                    slow_threshold_ns,
                    host_delay_ns_p99,
                    host_noise_threshold_ns,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn baselines_are_per_timestamp_source_and_scope() {
        // Kernel-stamped: 10 us within a ToR (h0 -> h2), 20 us between ToRs (h0 -> h1), each
        // spread +-10% so that the robust p99 has a spread to measure.
        let mut recs: Vec<Rec> =
            (0..100).map(|i| Rec(0, 2, 0, Outcome::Ok, 9_000 + (i % 21) * 100, 2_000, KS)).collect();
        recs.extend((0..100).map(|i| Rec(0, 1, 0, Outcome::Ok, 18_000 + (i % 21) * 200, 2_000, KS)));
        recs.extend([Rec(2, 1, 0, Outcome::Ok, 200_000, 300_000, HP); 10]);
        recs.push(Rec(2, 1, 0, Outcome::Lost, 0, 0, TsSource::Nic as u8));
        let ds = dataset(3, 1, &recs);
        let b = baselines(&ds.probes, &tor_ids(&ds), &Options::default());
        let [mesh, inter] = b.by_code[usize::from(KS)].clone().map(|x| x.expect("both scopes"));
        assert_eq!(
            (mesh.ts_source, mesh.scope, mesh.samples, mesh.rtt_ns_p50),
            ("kernel_software", "tor_mesh", 100, 10e3)
        );
        assert_eq!((inter.scope, inter.samples, inter.rtt_ns_p50), ("inter_tor", 100, 20e3));
        // The robust p99 of a +-10% spread lies within it; the floor of 1.5 x the median holds.
        assert!(mesh.rtt_ns_p99_robust > 10.5e3 && mesh.rtt_ns_p99_robust < 13e3, "{mesh:?}");
        assert_eq!((mesh.slow_threshold_ns, inter.slow_threshold_ns), (15e3, 30e3));
        assert_eq!(mesh.host_noise_threshold_ns, 1_000_000, "10x a 2 us p99 is below the 1 ms floor");
        let hp = b.by_code[usize::from(HP)][1].clone().expect("host_poll between ToRs");
        assert!(b.by_code[usize::from(HP)][0].is_none(), "no host-poll probe within a ToR");
        assert_eq!((hp.rtt_ns_p50, hp.slow_threshold_ns, hp.host_noise_threshold_ns), (200e3, 300e3, 3_000_000));
        assert!(b.by_code[TsSource::Nic as usize].iter().all(Option::is_none), "a lost probe is no sample");
        assert_eq!((b.slow_ns(KS, false), b.slow_ns(KS, true)), (15e3, 30e3));
        assert_eq!(b.slow_ns(HP, false), 300e3, "a scope without samples borrows the other's");
        assert_eq!(b.slow_ns(TsSource::Nic as u8, true), Options::default().slow_margin_ns);
    }

    /// A source too rare to appear in the fleet-wide stride is sampled on its own, instead of
    /// being judged against another source's baseline.
    #[test]
    fn a_rare_source_outside_the_stride_gets_its_own_baseline() {
        let n = 3 * SAMPLE_TARGET;
        let recs: Vec<Rec> = (0..n)
            .map(|i| {
                if i % 3 == 1 && i < 3_000 {
                    Rec(1, 0, 0, Outcome::Ok, 500_000, 1_000, HP)
                } else {
                    Rec(0, 1, 0, Outcome::Ok, 10_000, 1_000, KS)
                }
            })
            .collect();
        let ds = dataset(2, 1, &recs);
        let b = baselines(&ds.probes, &tor_ids(&ds), &Options::default());
        let hp = b.by_code[usize::from(HP)][1].clone().expect("host_poll baseline");
        assert_eq!((hp.samples, hp.rtt_ns_p50), (1_000, 500e3));
        let ks = b.by_code[usize::from(KS)][1].clone().expect("kernel_software baseline");
        assert_eq!(ks.samples, SAMPLE_TARGET as u64, "the common source keeps the fleet-wide stride");
    }

    /// The Clos CI run: the whole machine slowed for 23 s, every RTT by ~1.7x, some RNICs' a
    /// little more, and against fixed thresholds those were slow RNICs. Here every probe of
    /// window 3 takes 1.4x its usual RTT and those of h0 and h2 1.7x: the window's ToR-mesh
    /// lower quartile rose 1.4x, its thresholds with it, and nothing is slow. Controls: without
    /// the ToR-mesh shift (only inter-ToR probes slower) the thresholds stay and h0, h2 are
    /// named; an RNIC 3x slow is named within the shift.
    #[test]
    fn a_fleet_wide_rtt_shift_scales_that_windows_thresholds() {
        let run = |slow_factor: f64, mesh_shifts: bool| {
            let mut recs = Vec::new();
            for w in 0..10 {
                for pr in 0..8u32 {
                    for tg in (0..8).filter(|&t| t != pr) {
                        let inter = pr % 2 != tg % 2;
                        let f = match w {
                            3 if [pr, tg].iter().any(|r| [0, 2].contains(r)) => slow_factor,
                            3 if inter || mesh_shifts => 1.4,
                            _ => 1.0,
                        };
                        let rtt = (if inter { 20_000.0 } else { 10_000.0 } * f) as i32;
                        recs.extend([Rec(pr, tg, w, Outcome::Ok, rtt, 1_000, KS); 20]);
                    }
                }
            }
            localize(&dataset(8, 10, &recs), &Options::default())
        };
        let rnics = |l: &Localization| -> Vec<String> {
            l.findings.iter().filter(|f| f.kind == "rnic").map(|f| f.entity.clone()).collect()
        };
        let shifted = run(1.7, true);
        assert!(shifted.findings.is_empty(), "{:?}", shifted.findings);
        let s: Vec<(u64, &str, f64)> =
            shifted.rtt_shifts.iter().map(|r| (r.window_start_ns, r.ts_source, r.factor)).collect();
        assert_eq!(s, [(T0 + 3 * W, "kernel_software", 1.4)]);
        assert!(render_table(&shifted).contains("ToR-mesh RTT rose in 1 windows (most: x1.40"));
        let mesh_steady = run(1.7, false);
        assert!(mesh_steady.rtt_shifts.is_empty(), "{:?}", mesh_steady.rtt_shifts);
        assert_eq!(rnics(&mesh_steady), ["h0/d0", "h2/d0"], "{:?}", mesh_steady.findings);
        let slow = run(3.0, true);
        assert_eq!(rnics(&slow), ["h0/d0", "h2/d0"], "{:?}", slow.findings);
        assert!(slow.findings[0].evidence.contains("x1.40 with the fleet's ToR-mesh RTT"), "{:?}", slow.findings);
    }

    /// Issue 33, item 3: one ToR holding most of the mesh (24 RNICs against 8: 91% of the
    /// ToR-mesh pairs) turns 3x slow for a window. A pooled quartile took its rise for the
    /// fleet's, scaled its own thresholds by 3 and never named it; each ToR voting once, the
    /// other ToR's steady RTT keeps the thresholds, and the ToR is named. Control: the whole
    /// fleet 1.4x slow in another window is still a shift, and names nothing.
    #[test]
    fn a_tor_holding_most_of_the_mesh_cannot_scale_its_own_slowness_away() {
        let tor = |i: u32| u32::from(i >= 24);
        let mut recs = Vec::new();
        for w in 0..10 {
            for pr in 0..32u32 {
                // As pinglists do: the whole ToR mesh, and a few RNICs under the other ToR.
                for tg in (0..32).filter(|&t| t != pr && (tor(t) == tor(pr) || (t + pr) % 8 == 0)) {
                    let mesh = tor(pr) == tor(tg);
                    let f = match w {
                        3 if tor(pr) == 0 || tor(tg) == 0 => 3.0,
                        6 => 1.4,
                        _ => 1.0,
                    };
                    let rtt = (if mesh { 10_000.0 } else { 20_000.0 } * f) as i32;
                    recs.extend([Rec(pr, tg, w, Outcome::Ok, rtt, 1_000, KS); 3]);
                }
            }
        }
        let l = localize(&dataset_with_tors(32, 10, &recs, tor), &Options::default());
        let shifts: Vec<(u64, f64)> = l.rtt_shifts.iter().map(|r| (r.window_start_ns, r.factor)).collect();
        assert_eq!(shifts, [(T0 + 6 * W, 1.4)], "window 6 only: {shifts:?}");
        let named: Vec<(&str, &str, u64)> =
            l.findings.iter().map(|f| (f.kind.as_str(), f.entity.as_str(), f.start_ns)).collect();
        assert_eq!(named, [("tor", "t0", T0 + 3 * W)], "{:?}", l.findings);
    }
}
