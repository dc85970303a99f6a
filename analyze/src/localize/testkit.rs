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

/// 12,000 records over 12 RNICs and 5 windows with something of every kind a stage counts: a
/// stall (h0, window 1), a busy host (h7, window 3), a restarted agent heard again (h3),
/// refused probes and local drops, an unknown prober id, two traced services, and host-poll
/// stamps on one probe in 60 (a source thin enough to be sampled whole).
pub(super) fn mixed_dataset() -> Dataset {
    let outcomes = [Outcome::Ok, Outcome::Ok, Outcome::Ok, Outcome::Lost, Outcome::Ok, Outcome::LocalDrop];
    let recs: Vec<Rec> = (0..12_000u32)
        .map(|k| {
            let (pr, tg) = (k % 12, (k * 5 + 1) % 12);
            let outcome = if k % 41 == 0 { Outcome::Refused } else { outcomes[(k / 7) as usize % outcomes.len()] };
            let pd = if k % 97 == 0 { 5_000_000 } else { 1_000 + (k * 7_919 % 20) as i32 };
            let rtt = 8_000 + (k * 104_729 % 20_000) as i32;
            Rec(pr, tg, u64::from(k % 5), outcome, rtt, pd, if k % 60 == 0 { HP } else { KS })
        })
        .collect();
    let mut ds = dataset(12, 5, &recs);
    let n = ds.probes.len();
    ds.probes.prober[n / 2] = 40;
    for k in (0..n).filter(|k| k % 12 == 0 && k % 5 == 1).take(40) {
        ds.probes.prober_delay_ns[k] = 150_000_000;
    }
    // A third of h7's probes in window 3 are late.
    for k in (0..n).filter(|k| k % 12 == 7 && k % 5 == 3 && k / 60 % 3 == 0) {
        ds.probes.prober_delay_ns[k] = 3_000_000;
    }
    // h3's agent is down from 10 s to 70 s.
    ds.agents[3].last_ns = T0 + 10_000_000_000;
    ds.agents.push(AgentFile { agent_epoch: 2, first_ns: T0 + 70_000_000_000, ..ds.agents[3].clone() });
    ds.agents.last_mut().unwrap().last_ns = T0 + 5 * W - 1;
    ds.services = (0..2)
        .map(|i| crate::ingest::Service {
            name: format!("s{i}"),
            prober: i,
            remote: 5 + i,
            resolution: crate::ingest::Resolution::Agent,
            addr: [0; 16],
            conn: Default::default(),
        })
        .collect();
    ds.probes.service =
        (0..n as u32).map(|k| if k % 11 == 0 { k / 11 % 2 } else { crate::ingest::NO_SERVICE }).collect();
    ds
}

/// `ds`'s records as window summaries of one record a key (summary windows of [`W`]), cut into
/// `files` parts as files are: a summarised input whose every stage sees what the records say,
/// within a bucket's width.
pub(super) fn record_keys(ds: &Dataset, files: usize) -> crate::ingest::Windows {
    use crate::ingest::{KeyCell, WindowKey};
    use rocemesh_formats::window::{Measure, bucket_of};
    let p = &ds.probes;
    let per = p.len().div_ceil(files.max(1)).max(1);
    let parts = (0..p.len())
        .step_by(per)
        .map(|from| {
            let (mut keys, mut cells) = (Vec::new(), Vec::new());
            for i in from..(from + per).min(p.len()) {
                let class = crate::probe::Class::of(p.outcome[i], p.arrived[i]);
                let first = cells.len() as u32;
                if class == crate::probe::Class::Ok {
                    let ts = p.ts_source[i];
                    let delays = [
                        (p.network_rtt_ns[i], Measure::NetworkRtt),
                        (p.prober_delay_ns[i], Measure::ProberDelay),
                        (p.responder_delay_ns[i], Measure::ResponderDelay),
                    ];
                    for (v, m) in delays {
                        KeyCell::push(&mut cells, 1, bucket_of(v.max(0) as u64), m as u8, ts);
                    }
                }
                let t1 = p.t1_unix_ns[i];
                let mut counts = [0; 7];
                counts[class as usize] = 1;
                keys.push(WindowKey {
                    start_ns: t1 / W * W,
                    prober: p.prober[i],
                    target: p.target[i],
                    service: p.service_of(i),
                    flow_label: p.flow_label[i],
                    kind: p.kind[i],
                    counts,
                    first_ns: t1,
                    last_ns: t1,
                    first_ok_ns: if class == crate::probe::Class::Ok { t1 } else { u64::MAX },
                    epoch_changes: 0,
                    cells: (first, cells.len() as u32),
                });
            }
            (keys, cells)
        })
        .collect();
    crate::ingest::Windows::from_parts(parts)
}
