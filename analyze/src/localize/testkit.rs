//! Fixtures the stages' tests share: datasets built record by record, every stage run over
//! one table ([`stages`]), and the constants of their windows and timestamp sources.

pub(super) use super::*;
pub(super) use super::{baseline::*, blame::*, evidence::*, noise::*, render::*, services::*, statistics::*, tally::*};
pub(super) use crate::ingest::{AgentFile, Rnic};
pub(super) use crate::probe::TsSources;
pub(super) use rocemesh_formats::record::{Arrived, Outcome, TsSource};

pub(super) const W: u64 = 30_000_000_000;
pub(super) const T0: u64 = 1_700_000_010_000_000_000 / W * W;
/// The window index of T0.
pub(super) const W0: u32 = (T0 / W) as u32;
pub(super) const KS: u8 = TsSource::KernelSoftware as u8;
pub(super) const HP: u8 = TsSource::HostPoll as u8;

/// One record: prober, target, window, outcome, rtt, prober delay, ts source.
#[derive(Clone, Copy)]
pub(super) struct Rec(
    pub(super) u32,
    pub(super) u32,
    pub(super) u64,
    pub(super) Outcome,
    pub(super) i32,
    pub(super) i32,
    pub(super) u8,
);

/// `rnics` RNICs `h<i>/d0` under ToRs `t0`, `t1` (alternating), one agent file each
/// covering windows 0..`windows`, and `recs` spread over their windows.
pub(super) fn dataset(rnics: u32, windows: u64, recs: &[Rec]) -> Dataset {
    dataset_with_tors(rnics, windows, recs, |i| i % 2)
}

/// [`dataset`] with RNIC `i` under ToR `t<tor(i)>`.
pub(super) fn dataset_with_tors(rnics: u32, windows: u64, recs: &[Rec], tor: impl Fn(u32) -> u32) -> Dataset {
    let mut ds = Dataset {
        rnics: (0..rnics)
            .map(|i| Rnic { name: format!("h{i}/d0"), tor: format!("t{}", tor(i)), host: format!("h{i}") })
            .collect(),
        ..Dataset::default()
    };
    for (k, &Rec(pr, tg, w, outcome, rtt, pd, ts)) in recs.iter().enumerate() {
        let p = &mut ds.probes;
        p.t1_unix_ns.push(T0 + w * W + 1_000 + k as u64);
        p.network_rtt_ns.push(rtt);
        p.prober_delay_ns.push(pd);
        p.responder_delay_ns.push(1_000);
        p.prober.push(pr);
        p.target.push(tg);
        p.flow_label.push(0);
        p.responder_epoch.push(1);
        p.kind.push(0);
        p.outcome.push(outcome as u8);
        p.arrived.push(if outcome == Outcome::Ok { Arrived::ALL.0 } else { Arrived::PROBE_SENT });
        p.ts_source.push(ts);
    }
    ds.agents = (0..rnics)
        .map(|rnic| AgentFile {
            rnic,
            agent_epoch: 1,
            first_ns: T0,
            last_ns: T0 + windows * W - 1,
            records: 1,
            long_gaps: Vec::new(),
            median_gap_ns: 100_000_000,
        })
        .collect();
    ds
}

/// The stages up to the evidence over `ds`, as one range.
pub(super) struct Stages {
    pub(super) base: Baselines,
    pub(super) tally: Tally,
    pub(super) range: RangeTally,
    pub(super) noise: Noise,
    pub(super) hosts: Hosts,
    pub(super) agents: Agents,
    pub(super) tor_of: Vec<u32>,
}

impl Stages {
    pub(super) fn cx(&self) -> TallyContext<'_> {
        TallyContext {
            base: &self.base,
            tor_of: &self.tor_of,
            noise: &self.noise,
            hosts: &self.hosts,
            agents: &self.agents,
            window_ns: W,
        }
    }
}

pub(super) fn stages(ds: &Dataset) -> Stages {
    let opts = Options::default();
    let tor_of = tor_ids(ds);
    let base = baselines(&ds.probes, &tor_of, &opts);
    let (hosts, agents) = (Hosts::of(ds), Agents::of(ds, W));
    let mut scan = NoiseScan::default();
    scan.add(ds, &ds.probes, &hosts, &tor_of, &base, &opts, W);
    let noise = Noise::new(ds, &hosts, &base, &opts, W, scan);
    let mut st = Stages { base, tally: Tally::new(ds), range: RangeTally::default(), noise, hosts, agents, tor_of };
    let mut tally = Tally::new(ds);
    st.range = tally_range(ds, &ds.probes, &st.cx(), &mut tally);
    tally.finish(ds, &st.noise, &st.hosts);
    st.tally = tally;
    st
}

/// Stage 1 over one table.
pub(super) fn baselines(p: &Probes, tor_of: &[u32], opts: &Options) -> Baselines {
    let mut s = Sampler::new(p.len());
    s.add(p, tor_of, W);
    s.finish(opts)
}

/// A null for covers in unit tests: the loss floor, and a cut any real excess passes.
pub(super) const NULL: Null = Null { share: 1e-5, llr_cut: 5.0 };
