//! Stage 2: when a host was noise rather than evidence. [`NoiseScan`] reads each host's own send
//! gaps and host delays (pass 2); [`Noise`] turns them into spans of time: stalls (a cluster of
//! late host delays the fleet's rate makes unlikely, [`stall`]) become `host` findings, and a busy
//! host's host-stamped RTTs stop being slowness evidence ([`busy_host`]) unless they are slower
//! than its busyness explains ([`slowed_beyond_busy`]). Also the hosts and agent instances by
//! index, so later stages compare integers, not names.

use super::Options;
use super::baseline::{Baselines, is_inter};
use super::statistics::{NULL_MIN_PROBES, excess_llr, null_quartile, poisson_tail, share_upper_bound};
use crate::ingest::{Dataset, Probes};
use crate::probe::Class;
use rocemesh_formats::record::TsSource;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Hosts by index, so that per-key checks do not compare strings.
pub(super) struct Hosts {
    /// Host id by RNIC id.
    pub(super) of_rnic: Vec<u32>,
    /// Host names by host id.
    pub(super) names: Vec<String>,
}

impl Hosts {
    pub(super) fn of(ds: &Dataset) -> Hosts {
        let mut ids: HashMap<&str, u32> = HashMap::new();
        let of_rnic = ds
            .rnics
            .iter()
            .map(|r| {
                let next = ids.len() as u32;
                *ids.entry(r.host.as_str()).or_insert(next)
            })
            .collect();
        let mut names = vec![String::new(); ids.len()];
        for (name, &id) in &ids {
            names[id as usize] = (*name).to_owned();
        }
        Hosts { of_rnic, names }
    }
}

/// What the agents' files say: which windows each RNIC's agent covered and when agents
/// restarted.
pub(super) struct Agents {
    /// Windows in which each RNIC's agent wrote records, as sorted disjoint runs (first, last):
    /// a file covers its span's windows, and a day's windows per RNIC would not fit as a set.
    pub(super) covered: Vec<Vec<(u32, u32)>>,
    /// Restarts by RNIC: (last record of the old instance, first of the new one).
    pub(super) restarts: HashMap<u32, Vec<(u64, u64)>>,
}

impl Agents {
    pub(super) fn of(ds: &Dataset, window_ns: u64) -> Agents {
        let win = |t: u64| (t / window_ns) as u32;
        let rnics = ds.rnics.len();
        let mut covered: Vec<Vec<(u32, u32)>> = vec![Vec::new(); rnics];
        let mut files_by_rnic: Vec<Vec<usize>> = vec![Vec::new(); rnics];
        for (i, a) in ds.agents.iter().enumerate() {
            if (a.rnic as usize) < rnics && a.records > 0 {
                files_by_rnic[a.rnic as usize].push(i);
                covered[a.rnic as usize].push((win(a.first_ns), win(a.last_ns)));
            }
        }
        for runs in &mut covered {
            runs.sort_unstable();
            let mut merged: Vec<(u32, u32)> = Vec::with_capacity(runs.len());
            for &(a, b) in runs.iter() {
                match merged.last_mut() {
                    Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            *runs = merged;
        }
        let mut restarts: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for (rnic, files) in files_by_rnic.iter_mut().enumerate() {
            files.sort_by_key(|&i| ds.agents[i].first_ns);
            for pair in files.windows(2) {
                let (a, b) = (&ds.agents[pair[0]], &ds.agents[pair[1]]);
                if a.agent_epoch != b.agent_epoch {
                    restarts.entry(rnic as u32).or_default().push((a.last_ns, b.first_ns));
                }
            }
        }
        Agents { covered, restarts }
    }

    /// Whether `rnic`'s agent wrote records in window `w`.
    pub(super) fn covers(&self, rnic: u32, w: u32) -> bool {
        let runs = &self.covered[rnic as usize];
        let i = runs.partition_point(|&(first, _)| first <= w);
        i > 0 && runs[i - 1].1 >= w
    }
}

/// A host's own host-delay legs exceed the fleet's robust p99 at this rate when it is like the
/// fleet (by the p99's definition): the busy test's null, or the rate of a typical host in the
/// window where that is higher (a fleet whose delays are heavier-tailed than a log-normal).
pub(super) const BUSY_NULL: f64 = 0.01;
/// A (host, window) is busy, and busy slowness is told from a slow RNIC, with a log-likelihood
/// ratio of at least this against its null (exp(-llr) bounds the binomial tail: p <= 1e-3 per
/// (host, window)). Each error costs little and only one way: a host wrongly busy loses that
/// window's host-stamped slowness evidence; so a moderate cut, not the false-discovery one.
pub(super) const BUSY_LLR: f64 = 6.907_755;
/// A busy host's contention reaches the stamps of its probes' RTTs (the kernel's receive path,
/// the poller) at up to this many times the rate it reaches its own host delays: each probe
/// puts one RTT stamp and one host-delay leg on each of its hosts, and twice is the margin for
/// contention that hits the receive path (an interrupt core) more often than the agent's thread.
pub(super) const BUSY_STAMP_FACTOR: f64 = 2.0;

/// A host is busy in a window when the share of its own host-delay legs there (its prober
/// delays, and its responder delays when answering) above the fleet's robust p99 leg of the
/// probe's timestamp source ([`robust_p99`]: busy hosts do not move it, as they move a plain
/// p99 once they hold 1% of the legs) is significantly above `null`, the share of a typical
/// host in the window, at least the 1% of [`BUSY_NULL`] ([`BUSY_LLR`]: 7 of 100, 12 of 300). Such a source's network RTT is taken in the hosts'
/// kernels (software socket stamps) or by their polling threads, so it holds the host's own
/// delays too: a busy host (a core shared with a training job's threads, a vCPU with steal
/// time) makes its RNIC look slow to every peer, both ways, the signature of a slow RNIC. Its
/// host-stamped RTTs are then no slowness evidence, unless they are slower than its busyness
/// explains: more of them above the slow threshold than [`BUSY_STAMP_FACTOR`] times its busy
/// share (at its upper bound; plus the null floor) by [`BUSY_LLR`]: a slow RNIC on a
/// CPU-loaded training node delays every probe, however busy its host. A host busy half the
/// time or more (about 40% with 280 legs in a window) explains any share, and its RNIC is
/// judged by NIC stamps only. A NIC's stamps do not see the host and are
/// not affected by this rule.
pub fn busy_host(delayed: u32, legs: u32, null: f64) -> bool {
    delayed > 0 && excess_llr(delayed, legs, null) >= BUSY_LLR
}

/// Whether `slow` of a busy host's `rtts` host-stamped RTTs are more than its busy share
/// (`delayed` of `legs` host delays above the fleet's p99) explains ([`busy_host`]). The share is
/// itself measured: it is taken at its upper bound (the largest share the legs allow at
/// [`BUSY_LLR`]), so that a share measured low by chance does not pass for an RNIC's slowness.
pub fn slowed_beyond_busy(slow: u32, rtts: u32, delayed: u32, legs: u32, slow_null: f64) -> bool {
    let explained = (BUSY_STAMP_FACTOR * share_upper_bound(delayed, legs, BUSY_LLR)).min(1.0);
    excess_llr(slow, rtts, explained + (1.0 - explained) * slow_null) >= BUSY_LLR
}

/// Whether late host delays clustered on one host are a stall: `late` of them within one pad
/// of each other over `span_ns`, on a host with `legs_per_s` host-delay legs a second of which
/// a share `p_late` (the fleet's own) is above the stall threshold. Under the null the late
/// legs of a pad-long interval are Poisson(legs_per_s x (span + pad) x p_late); a cluster is a
/// stall when that tail is below `alpha`, the false-discovery rate spread over the run's
/// host-intervals of one pad. A freeze makes every leg in flight late at once, far beyond it;
/// scattered late legs on a host whose fleet has many are not (the Clos testbed's clean phase
/// on 2 shared cores: three answers 3-7 ms late within 176 ms).
pub fn stall(late: u32, span_ns: u64, pad_ns: u64, legs_per_s: f64, p_late: f64, alpha: f64) -> bool {
    let lambda = legs_per_s * (span_ns.saturating_add(pad_ns)) as f64 / 1e9 * p_late;
    poisson_tail(lambda, late) <= alpha
}

/// Whether probes stamped by `ts_source` carry their hosts' own delays in their network RTT.
pub(super) fn host_in_rtt(ts_source: u8) -> bool {
    matches!(TsSource::from_u8(ts_source), Some(TsSource::HostPoll | TsSource::KernelSoftware))
}

/// When each host was noise, from its own files: send gaps far beyond its usual spacing (a
/// frozen host's timers fire late), and host delays above the stall threshold. Probes are
/// excluded by time, not by window: a stall in a window's last millisecond used to throw the
/// whole window's probes of that host away, and with them any fault it held.
pub(super) struct Noise {
    /// Per host, sorted spans (start, end), Unix ns, not yet padded.
    pub(super) spans: Vec<Vec<(u64, u64)>>,
    /// (host, window) -> why it is noise: the `host` findings.
    pub(super) windows: BTreeMap<(u32, u32), String>,
    /// (host, window) where the host was busy ([`busy_host`]), counted over host-stamped ok
    /// probes only, and its host-stamped RTTs no slowness evidence.
    pub(super) busy: BTreeSet<(u32, u32)>,
    pub(super) pad_ns: u64,
    pub(super) lost_pad_ns: u64,
}

/// Stage 2's pass over the records: host delays above the stall threshold (a prober delay
/// stalls the prober's host, a responder delay the target's, over the probe's whole exchange),
/// each host's host-delay legs and their span (the stall test's rate), and the windows in which
/// each host was busy.
#[derive(Default)]
pub(super) struct NoiseScan {
    /// (host, start, end, RNIC, answering, late legs), ns; few (late probes only). A record
    /// is one late leg; a window summary's cell as many as it counts, over its key's span.
    pub(super) events: Vec<(u32, u64, u64, u32, bool, u32)>,
    /// By host: (host-delay legs, first T1, last T1). Foldhash, not SipHash: two lookups per
    /// ok probe.
    pub(super) legs: HashMap<u32, (u64, u64, u64), foldhash::fast::RandomState>,
    /// (host, window) where the host was busy ([`busy_host`]) and its host-stamped RTTs no
    /// slowness evidence (not those slowed beyond it, [`slowed_beyond_busy`]: evidence kept).
    pub(super) busy: BTreeSet<(u32, u32)>,
}

/// What one block of a range adds to a [`NoiseScan`].
pub(super) struct ScannedBlock {
    /// By host id: (host-delay legs, first T1, last T1), legs 0 where none.
    legs: Vec<(u64, u64, u64)>,
    pub(super) own: OwnMap,
    pub(super) events: Vec<(u32, u64, u64, u32, bool, u32)>,
}

impl ScannedBlock {
    pub(super) fn new(hosts: &Hosts) -> ScannedBlock {
        ScannedBlock { legs: vec![(0, 0, 0); hosts.names.len()], own: OwnMap::default(), events: Vec::new() }
    }

    /// `n` (> 0) host-delay legs of `host` sent from `first_ns` to `last_ns`.
    pub(super) fn add_legs(&mut self, host: u32, n: u64, first_ns: u64, last_ns: u64) {
        let l = &mut self.legs[host as usize];
        *l = if l.0 == 0 { (n, first_ns, last_ns) } else { (l.0 + n, l.1.min(first_ns), l.2.max(last_ns)) };
    }
}

/// [`NoiseScan::add`] over records `r` of `p`.
fn scan_block(
    ds: &Dataset,
    p: &Probes,
    r: std::ops::Range<usize>,
    hosts: &Hosts,
    tor_of: &[u32],
    base: &Baselines,
    window_ns: u64,
) -> ScannedBlock {
    let win = |t: u64| (t / window_ns) as u32;
    let mut b = ScannedBlock::new(hosts);
    for i in r {
        let (pr, tg) = (p.prober[i] as usize, p.target[i] as usize);
        if pr >= ds.rnics.len() || tg >= ds.rnics.len() || Class::of(p.outcome[i], p.arrived[i]) != Class::Ok {
            continue;
        }
        let noise_ns = base.noise_ns(p.ts_source[i]);
        let (pd, rd) = (i64::from(p.prober_delay_ns[i]), i64::from(p.responder_delay_ns[i]));
        let t1 = p.t1_unix_ns[i];
        for host in [hosts.of_rnic[pr], hosts.of_rnic[tg]] {
            b.add_legs(host, 1, t1, t1);
        }
        if host_in_rtt(p.ts_source[i])
            && let Some(late_ns) = base.leg_late_ns(p.ts_source[i])
        {
            let w = win(t1);
            let slow = f64::from(p.network_rtt_ns[i]) > base.slow_ns_in(p.ts_source[i], is_inter(p, tor_of, i), w);
            for (host, delay_ns) in [(hosts.of_rnic[pr], pd), (hosts.of_rnic[tg], rd)] {
                let c = b.own.entry((host, w)).or_default();
                c.delayed += u32::from(delay_ns as f64 > late_ns);
                c.legs += 1;
                c.slow += u32::from(slow);
                c.rtts += 1;
            }
        }
        if pd <= noise_ns && rd <= noise_ns {
            continue;
        }
        // Saturating: T1 and the delays are what the files say.
        let end = t1.saturating_add((i64::from(p.network_rtt_ns[i]).max(0) + pd.max(0) + rd.max(0)) as u64);
        if pd > noise_ns {
            b.events.push((hosts.of_rnic[pr], t1, end, pr as u32, false, 1));
        }
        if rd > noise_ns {
            b.events.push((hosts.of_rnic[tg], t1, end, tg as u32, true, 1));
        }
    }
    b
}

/// [`Own`] by (host, window), one range's: foldhash, two lookups per host-stamped ok probe.
pub(super) type OwnMap = HashMap<(u32, u32), Own, foldhash::fast::RandomState>;

/// One (host, window)'s host-stamped ok probes, for [`busy_host`].
#[derive(Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Own {
    /// Its host-delay legs above the fleet's p99, and all of them.
    pub(super) delayed: u32,
    pub(super) legs: u32,
    /// Their RTTs above the slow threshold, and all of them.
    pub(super) slow: u32,
    pub(super) rtts: u32,
}

impl Own {
    /// Adds another's counts (saturating: summaries come from other machines).
    pub(super) fn add(&mut self, o: &Own) {
        self.delayed = self.delayed.saturating_add(o.delayed);
        self.legs = self.legs.saturating_add(o.legs);
        self.slow = self.slow.saturating_add(o.slow);
        self.rtts = self.rtts.saturating_add(o.rtts);
    }
}

impl NoiseScan {
    /// One range of whole windows: a window's busy hosts are decided within it. The range is
    /// scanned in blocks on every core ([`super::in_blocks`]) and the blocks merged in order:
    /// counts add, spans widen, late legs keep record order.
    #[allow(clippy::too_many_arguments, reason = "one pass's context, as the tally's")]
    pub(super) fn add(
        &mut self,
        ds: &Dataset,
        p: &Probes,
        hosts: &Hosts,
        tor_of: &[u32],
        base: &Baselines,
        opts: &Options,
        window_ns: u64,
    ) {
        let parts = super::in_blocks(p.len(), |_, r| scan_block(ds, p, r, hosts, tor_of, base, window_ns));
        self.merge(parts, opts);
    }

    /// One range's blocks, in order: a host's legs add and its span widens, a (host, window)'s
    /// counts add, late legs keep their order; then the range's busy (host, window)s.
    pub(super) fn merge(&mut self, parts: Vec<ScannedBlock>, opts: &Options) {
        let mut own = OwnMap::default();
        for part in parts {
            for (host, &(n, first, last)) in part.legs.iter().enumerate().filter(|(_, l)| l.0 > 0) {
                let l = self.legs.entry(host as u32).or_insert((0, first, last));
                *l = (l.0 + n, l.1.min(first), l.2.max(last));
            }
            for (key, c) in part.own {
                own.entry(key).or_default().add(&c);
            }
            self.events.extend(part.events);
        }
        self.decide_busy(own, opts);
    }

    /// The busy (host, window)s of `own` (one range's whole windows).
    fn decide_busy(&mut self, own: OwnMap, opts: &Options) {
        // The null of each window: the late share of a typical host there, the lower quartile
        // over hosts with enough legs to say (as the loss and slowness nulls, over RNICs), at
        // least the 1% a host like the fleet has.
        let mut shares: HashMap<u32, Vec<f64>> = HashMap::new();
        for (&(_, w), c) in own.iter().filter(|(_, c)| c.legs >= NULL_MIN_PROBES) {
            shares.entry(w).or_default().push(f64::from(c.delayed) / f64::from(c.legs));
        }
        let null: HashMap<u32, f64> =
            shares.into_iter().map(|(w, mut v)| (w, null_quartile(&mut v).max(BUSY_NULL))).collect();
        for (key, c) in own {
            if !busy_host(c.delayed, c.legs, null.get(&key.1).copied().unwrap_or(BUSY_NULL)) {
                continue;
            }
            if !slowed_beyond_busy(c.slow, c.rtts, c.delayed, c.legs, opts.slow_null_floor) {
                self.busy.insert(key);
            }
        }
    }
}

impl Noise {
    pub(super) fn new(
        ds: &Dataset,
        hosts: &Hosts,
        base: &Baselines,
        opts: &Options,
        window_ns: u64,
        scan: NoiseScan,
    ) -> Noise {
        let win = |t: u64| (t / window_ns) as u32;
        let mut spans: Vec<Vec<(u64, u64)>> = vec![Vec::new(); hosts.names.len()];
        let mut windows: BTreeMap<(u32, u32), String> = BTreeMap::new();
        for a in ds.agents.iter().filter(|a| (a.rnic as usize) < ds.rnics.len()) {
            let host = hosts.of_rnic[a.rnic as usize];
            for &(t, gap) in &a.long_gaps {
                spans[host as usize].push((t, t.saturating_add(gap)));
                for w in win(t)..=win(t.saturating_add(gap)) {
                    windows.entry((host, w)).or_insert_with(|| {
                        format!(
                            "{}: no probe sent for {:.0} ms (usual spacing {:.1} ms): a frozen host",
                            ds.rnics[a.rnic as usize].name,
                            gap as f64 / 1e6,
                            a.median_gap_ns as f64 / 1e6
                        )
                    });
                }
            }
        }
        let NoiseScan { mut events, busy, legs, .. } = scan;
        events.sort_unstable();
        let thresholds: BTreeSet<i64> = base.all().map(|b| b.host_noise_threshold_ns).collect();
        let noise_ms = match (thresholds.first(), thresholds.last()) {
            (Some(lo), Some(hi)) if lo != hi => format!("{}-{}", *lo as f64 / 1e6, *hi as f64 / 1e6),
            (Some(t), _) => format!("{}", *t as f64 / 1e6),
            _ => format!("{}", base.noise_default_ns as f64 / 1e6),
        };
        // The stall test's null (`stall`): each host's rate of host-delay legs, the fleet's
        // share of them above the threshold, and the run's pad-long host-intervals.
        let pad = opts.stall_pad_ns.max(1);
        let span_of = |l: &(u64, u64, u64)| (l.2 - l.1).max(1_000_000_000);
        // Summed as integers: a float sum would follow the table's order, which is seeded per
        // process.
        let intervals = legs.values().map(|l| u128::from(span_of(l))).sum::<u128>() as f64 / pad as f64;
        let alpha = opts.fdr / intervals.max(1.0);
        let p_late = base.late_share();
        // Events of one host closer than the pad are one cluster.
        let mut i = 0;
        while i < events.len() {
            let (host, start, mut end, rnic, answering, mut count) = events[i];
            let mut j = i + 1;
            while j < events.len() && events[j].0 == host && events[j].1 <= end.saturating_add(opts.stall_pad_ns) {
                end = end.max(events[j].2);
                count = count.saturating_add(events[j].5);
                j += 1;
            }
            let legs_per_s = legs.get(&host).map_or(0.0, |l| l.0 as f64 / (span_of(l) as f64 / 1e9));
            if stall(count, end - start, pad, legs_per_s, p_late, alpha) {
                spans[host as usize].push((start, end));
                let name = &ds.rnics[rnic as usize].name;
                for w in win(start)..=win(end) {
                    windows.entry((host, w)).or_insert_with(|| {
                        if answering {
                            format!("{name}: answered {count} probes > {noise_ms} ms late")
                        } else {
                            format!("{name}: {count} probes with prober delay > {noise_ms} ms")
                        }
                    });
                }
            }
            i = j;
        }
        for s in &mut spans {
            s.sort_unstable();
        }
        Noise {
            spans,
            windows,
            busy,
            pad_ns: opts.stall_pad_ns,
            lost_pad_ns: opts.stall_pad_ns + opts.clock_offset_max_ns,
        }
    }

    /// Whether `host` was busy in window `w` ([`busy_host`]), its slowness not beyond it.
    pub(super) fn busy(&self, host: u32, w: u32) -> bool {
        self.busy.contains(&(host, w))
    }

    /// Whether probes sent from `from_ns` to `to_ns` from or to `host` may have met its stall,
    /// `pad_ns` either side (a window summary's key knows its probes' span, not each send).
    pub(super) fn hit_span(&self, host: u32, from_ns: u64, to_ns: u64, pad_ns: u64) -> bool {
        self.spans.get(host as usize).is_some_and(|s| {
            s.iter().any(|&(a, b)| to_ns.saturating_add(pad_ns) >= a && from_ns <= b.saturating_add(pad_ns))
        })
    }

    /// Whether a probe sent at `t_ns` from or to `host` met its stall, `pad_ns` either side.
    pub(super) fn hit(&self, host: u32, t_ns: u64, pad_ns: u64) -> bool {
        self.spans.get(host as usize).is_some_and(|s| {
            s.iter().any(|&(a, b)| t_ns.saturating_add(pad_ns) >= a && t_ns <= b.saturating_add(pad_ns))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    /// A busy host (CI: a vCPU shared with other work) slows its own host-stamped RTTs, to and
    /// from every peer, as a slow RNIC would; its host delays say why. The same slowness with
    /// NIC stamps, or without the host delays, is the RNIC's; and a slow RNIC on a busy host,
    /// slower than its busyness explains, is named (issue 33: it was not).
    #[test]
    fn a_busy_host_is_not_a_slow_rnic_when_the_host_stamps_the_rtt() {
        let run = |ts: u8, delayed_of_20: u32, slow_of_20: u32| {
            // 8 RNICs probe each other, 20 probes per pair and window, over 10 windows. In
            // window 1, `delayed_of_20` of each 20 probes h0 sends waited 200 us on its host
            // (above the fleet's p99 host delay, far below a stall), and `slow_of_20` of each 20
            // of h0's probes, both ways, took 4x the RTT (mostly other probes than the delayed).
            let mut recs = Vec::new();
            for w in 0..10 {
                for pr in 0..8 {
                    for tg in (0..8).filter(|&t| t != pr) {
                        for k in 0..20 {
                            let on_h0 = w == 1 && (pr == 0 || tg == 0);
                            let rtt = if on_h0 && k >= 20 - slow_of_20 { 40_000 } else { 10_000 };
                            let pd = if w == 1 && pr == 0 && k < delayed_of_20 { 200_000 } else { 1_000 };
                            recs.push(Rec(pr, tg, w, Outcome::Ok, rtt, pd, ts));
                        }
                    }
                }
            }
            localize(&dataset(8, 10, &recs), &Options::default())
        };
        let rnic_h0 = |l: &Localization| l.findings.iter().any(|f| f.kind == "rnic" && f.entity == "h0/d0");
        // 30% of h0's host-delay legs late (84 of 280) and 60% of its RTTs slow: busyness
        // explains up to twice its share.
        let l = run(KS, 12, 12);
        assert!(!rnic_h0(&l), "{:?}", l.findings);
        assert!(l.findings.iter().all(|f| f.kind == "host"), "nothing in the network: {:?}", l.findings);
        assert_eq!(l.not_evidence.busy_host_rtt, 2 * 7 * 20, "h0's probes of window 1, both ways");
        assert_eq!(l.not_evidence.busy_host_windows, BTreeMap::from([("h0".to_owned(), 1)]));
        assert!(render_table(&l).contains("280 host-stamped RTTs were no slowness evidence"), "{}", render_table(&l));
        // Controls: the rule is what keeps h0 out, not a lack of evidence.
        let quiet = run(KS, 0, 12);
        assert!(rnic_h0(&quiet), "no host delay, the slowness is the RNIC's: {:?}", quiet.findings);
        assert_eq!(quiet.not_evidence.busy_host_rtt, 0);
        let nic = run(TsSource::Nic as u8, 12, 12);
        assert!(rnic_h0(&nic), "NIC stamps leave the host out of the RTT: {:?}", nic.findings);
        assert_eq!(nic.not_evidence.busy_host_rtt, 0);
        // A slow RNIC on the same busy host: every RTT slow, far beyond what 30% busy explains.
        let slow = run(KS, 12, 20);
        assert!(rnic_h0(&slow), "a slow RNIC on a busy host: {:?}", slow.findings);
        assert_eq!(slow.not_evidence.busy_host_rtt, 0);
    }

    /// A fleet generated for the threshold margins below: 8 RNICs (h0..h7, two ToRs), 20
    /// probes per ordered pair and window over 10 windows, kernel-software stamps; RTTs ~10 us
    /// (log-normal, sigma 0.15), host delays ~2 us. In windows 3..6 h0 may be busy (each of its
    /// host-delay legs 200 us late with probability `busy`, each RTT touching it 40 us late with
    /// probability `stamp`), slow (every RTT touching it `extra_ns` longer), or the whole fleet
    /// slowed (each RTT 2x with probability `fleet`); h3 may freeze for `freeze_ns` 10 s into
    /// window 5 (every leg on it waits for the freeze to end).
    #[derive(Clone, Copy, Default)]
    struct Gen {
        busy: f64,
        stamp: f64,
        extra_ns: f64,
        fleet: f64,
        freeze_ns: u64,
    }

    fn generated(seed: u64, g: Gen) -> Dataset {
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut uniform = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut ds = dataset(8, 10, &[]);
        for w in 0..10u64 {
            for pr in 0..8u32 {
                for tg in (0..8).filter(|&t| t != pr) {
                    for k in 0..20u64 {
                        let on = (3..7).contains(&w) && (pr == 0 || tg == 0);
                        let normal = (-2.0 * (1.0 - uniform()).ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
                        let mut rtt = 10_000.0 * (0.15 * normal).exp();
                        if on && uniform() < g.stamp {
                            rtt += 40_000.0;
                        }
                        if on {
                            rtt += g.extra_ns;
                        }
                        if (3..7).contains(&w) && uniform() < g.fleet {
                            rtt *= 2.0;
                        }
                        let late = |host_is_h0: bool, u: f64| {
                            if host_is_h0 && (3..7).contains(&w) && u < g.busy { 200_000 } else { 2_000 }
                        };
                        let (mut pd, mut rd) = (late(pr == 0, uniform()), late(tg == 0, uniform()));
                        let t1 = T0 + w * W + k * (W / 20) + (uniform() * (W / 20) as f64) as u64;
                        let freeze = T0 + 5 * W + 10_000_000_000;
                        if (freeze..freeze + g.freeze_ns).contains(&t1) {
                            let wait = (freeze + g.freeze_ns - t1) as i32;
                            if pr == 3 {
                                pd = wait;
                            }
                            if tg == 3 {
                                rd = wait;
                            }
                        }
                        let p = &mut ds.probes;
                        p.t1_unix_ns.push(t1);
                        p.network_rtt_ns.push(rtt as i32);
                        p.prober_delay_ns.push(pd);
                        p.responder_delay_ns.push(rd);
                        p.prober.push(pr);
                        p.target.push(tg);
                        p.flow_label.push(0);
                        p.responder_epoch.push(1);
                        p.kind.push(0);
                        p.outcome.push(Outcome::Ok as u8);
                        p.arrived.push(Arrived::ALL.0);
                        p.ts_source.push(KS);
                    }
                }
            }
        }
        ds
    }

    /// Issue 33, item 4: the busy, busy-beyond, slowed-fleet and stall rules on generated fleets,
    /// 100 seeds a case, both sides of each bar. Prints the margins (the note quotes them):
    /// - a busy host (5-35% of its legs late) whose stamps are late as often as its legs is no
    ///   slow RNIC; nor at twice that rate (the model's bound), save the rare chance p <= 1e-3
    ///   the cut allows, which the cover's 50% bar and false-discovery cut then stop;
    /// - a slow RNIC (+30 us, 3x the fleet's p99 excess) on such a busy host is named;
    /// - a fleet slowed as a whole (5-40% of all RTTs 2x) names nothing; a slow RNIC in it is
    ///   named;
    /// - no stall on these fleets' healthy hosts; a host frozen 150-800 ms is one.
    #[test]
    fn busy_slowed_and_stall_rules_hold_with_margin_on_generated_fleets() {
        let rnic_h0 = |l: &Localization| l.findings.iter().any(|f| f.kind == "rnic" && f.entity == "h0/d0");
        let network = |l: &Localization| l.findings.iter().filter(|f| f.kind != "host").count();
        let (mut named, mut runs, mut frozen, mut met3) = ([0u32; 6], 0u32, 0u32, 0u32);
        for seed in 1..=100u64 {
            runs += 1;
            let b = 0.05 + 0.3 * ((seed * 37) % 100) as f64 / 100.0;
            let q = 0.05 + 0.35 * ((seed * 53) % 100) as f64 / 100.0;
            let cases = [
                Gen { busy: b, stamp: b, ..Gen::default() },
                Gen { busy: b, stamp: (2.0 * b).min(1.0), ..Gen::default() },
                Gen { busy: b, stamp: b, extra_ns: 30_000.0, ..Gen::default() },
                Gen { fleet: q, ..Gen::default() },
                Gen { fleet: q, extra_ns: 30_000.0, ..Gen::default() },
                Gen { extra_ns: 30_000.0, ..Gen::default() },
            ];
            for (c, g) in cases.into_iter().enumerate() {
                let l = localize(&generated(seed, g), &Options::default());
                assert!(
                    l.findings.iter().all(|f| f.kind != "host"),
                    "case {c} seed {seed}: no stall here: {:?}",
                    l.findings
                );
                named[c] += u32::from(rnic_h0(&l));
                if [0, 1, 3].contains(&c) {
                    assert_eq!(network(&l), usize::from(rnic_h0(&l)), "case {c} seed {seed}: {:?}", l.findings);
                }
            }
            // A freeze of 150-800 ms: named a host whenever 3 legs or more met it (the fewest a
            // stall needed before; here 2 may do, where the fleet's own late legs are rare).
            let freeze_ns = 150_000_000 + (seed * 61 % 100) * 6_500_000;
            let ds = generated(seed, Gen { freeze_ns, ..Gen::default() });
            let p = &ds.probes;
            let met = (0..p.len())
                .filter(|&i| {
                    (p.prober[i] == 3 && p.prober_delay_ns[i] > 1_000_000)
                        || (p.target[i] == 3 && p.responder_delay_ns[i] > 1_000_000)
                })
                .count();
            let l = localize(&ds, &Options::default());
            assert_eq!(network(&l), 0, "seed {seed}: a frozen host is no network fault: {:?}", l.findings);
            let named = l.findings.iter().any(|f| f.kind == "host" && f.entity == "h3");
            assert!(named || met < 3, "seed {seed}: a {} ms freeze met by {met} legs", freeze_ns / 1_000_000);
            frozen += u32::from(named);
            if met >= 3 {
                met3 += 1;
            }
        }
        println!(
            "of {runs} seeds, h0 named: busy {}, busy at twice the stamp rate {}, busy + slow RNIC {}, slowed fleet {}, slow RNIC in a slowed fleet {}, slow RNIC {}; h3 frozen and named a host {frozen} (met by 3 legs or more: {met3})",
            named[0], named[1], named[2], named[3], named[4], named[5]
        );
        assert!(met3 >= runs / 2, "most freezes are met by 3 legs or more: {met3}");
        assert_eq!(named[0], 0, "a busy host whose stamps are late as often as its legs");
        assert!(named[1] <= 1, "at the model's bound, a chance of p <= 1e-3 per (host, window) at most");
        assert_eq!(named[2], runs, "a slow RNIC on a busy host");
        assert_eq!(named[3], 0, "a fleet slowed as a whole");
        assert_eq!(named[4], runs, "a slow RNIC in a slowed fleet");
        assert_eq!(named[5], runs, "a slow RNIC");
    }

    /// The busy and stall tests' statistics at their bars, both sides (the numbers the docs and
    /// the note quote).
    #[test]
    fn busy_and_stall_bars_both_sides() {
        // Busy: of 100 legs, 7 above the fleet's p99 are (p <= 1e-3 against 1%), 6 are not.
        assert!(busy_host(7, 100, 0.01) && !busy_host(6, 100, 0.01));
        assert!(busy_host(12, 300, 0.01) && !busy_host(11, 300, 0.01));
        // Beyond: 30 of 300 legs late (10%, at most 17.6% at the bound) explains up to 35.3% of
        // the RTTs slow (plus the 1% floor): 150 of 300 slow are beyond it, 100 are not.
        assert!(
            (share_upper_bound(30, 300, BUSY_LLR) - 0.1763).abs() < 1e-3,
            "{}",
            share_upper_bound(30, 300, BUSY_LLR)
        );
        assert!(!slowed_beyond_busy(100, 300, 30, 300, 0.01));
        assert!(slowed_beyond_busy(150, 300, 30, 300, 0.01));
        assert!(!slowed_beyond_busy(300, 300, 150, 300, 0.01), "half the legs late explains everything");
        // Stall: a host with 100 legs a second in a fleet where 1e-4 of them are late, a 1 s pad,
        // over 10,000 host-seconds at 1%: alpha = 1e-6; lambda = 0.01; 3 late legs in one pad
        // (p = 1.7e-7) are a stall, 2 (p = 5e-5) are not.
        let alpha = 0.01 / 10_000.0;
        assert!(stall(3, 0, 1_000_000_000, 100.0, 1e-4, alpha) && !stall(2, 0, 1_000_000_000, 100.0, 1e-4, alpha));
        // The Clos testbed's clean phase: three answers 3-7 ms late within 176 ms on a host of
        // ~80 legs a second, in a fleet with ~1e-3 of its legs past the threshold: not a stall.
        assert!(!stall(3, 176_000_000, 1_000_000_000, 80.0, 1e-3, 0.01 / 14_400.0));
        assert!((poisson_tail(0.01, 3) - 1.6546e-7).abs() < 1e-10, "{}", poisson_tail(0.01, 3));
        // A long cluster on a busy host: many late legs expected, a few seen: no stall (the
        // tail must not underflow to 0).
        assert_eq!(poisson_tail(15_000.0, 3), 1.0);
        assert!(!stall(5, 3_600_000_000_000, 1_000_000_000, 5_000.0, 1e-3, 1e-9));
        assert!(poisson_tail(15_000.0, 16_000) < 1e-10 && poisson_tail(15_000.0, 16_000) > 0.0);
    }
}
