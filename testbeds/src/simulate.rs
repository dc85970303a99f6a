//! The simulator: every RNIC's agent, probing its pinglist through the faulty fabric, writing
//! what the real agent would write through the same segment writer.
//!
//! Each RNIC is simulated on its own from a seed derived from (scenario seed, RNIC), so the
//! output does not depend on thread count or order, and memory is one writer per thread.
//! The physics follows the agent's protocol step by step: a probe is three packets (probe,
//! ACK1, ACK2), each dropped along its own ECMP path; T1..T6 are taken where the real agent
//! takes them, on the clock that would take them, late when the host that takes them is frozen;
//! the record is classified by the same function the agent uses.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rocemesh_formats::inventory::{self, Inventory};
use rocemesh_formats::record::{
    Arrived, EndpointRole, MAX_HOPS, Outcome, PathRecord, ProbeRecord, TsSource, six_timestamp_delays,
};
use rocemesh_formats::scenario::{Quantiles, Scenario, TsModel};
use rocemesh_formats::segment::{SegmentError, SegmentWriter, WriterConfig, WriterIdentity};

use crate::fabric::{Fabric, NS, hash};

/// What went wrong while simulating.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A segment could not be written.
    #[error("writing segments for {rnic}: {source}")]
    Segment {
        /// The RNIC whose agent was being simulated.
        rnic: String,
        /// The writer's error (it names the file).
        #[source]
        source: SegmentError,
    },
    /// The output directory or inventory could not be written.
    #[error("{path}: {source} (fix: check that the output directory is writable and has space)")]
    Io {
        /// What could not be written.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What a simulation wrote.
#[derive(Debug, Clone, Default)]
pub struct SimSummary {
    /// RNICs simulated.
    pub rnics: usize,
    /// Probe records written.
    pub records: u64,
    /// Path records written.
    pub paths: u64,
    /// Segment files written.
    pub segments: u64,
    /// Bytes of segment files.
    pub bytes: u64,
}

/// xoshiro256++ seeded through SplitMix64: fast, and ours, so streams never change under us.
#[derive(Debug, Clone)]
pub(crate) struct Rng([u64; 4]);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        let mut s = [0; 4];
        let mut x = seed;
        for v in &mut s {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            *v = crate::fabric::mix(x);
        }
        Rng(s)
    }

    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1).
    #[inline]
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller; one of the pair is enough here).
    #[inline]
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// A log-normal fitted to a p50 and a p99 given in µs, drawn in ns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogNormal {
    mu: f64,
    sigma: f64,
}

/// z of the 99th percentile of the standard normal.
const Z99: f64 = 2.326_347_874;

impl LogNormal {
    pub(crate) fn fit(q: Quantiles) -> LogNormal {
        let p50 = q.p50 * 1e3;
        let p99 = (q.p99 * 1e3).max(p50);
        LogNormal { mu: p50.ln(), sigma: (p99 / p50).ln() / Z99 }
    }

    #[inline]
    pub(crate) fn draw(&self, rng: &mut Rng) -> u64 {
        (self.mu + self.sigma * rng.normal()).exp().round().max(1.0) as u64
    }
}

/// Simulate `scenario` into `out`: `out/inventory.toml` and `out/segments/*.rseg`, with window
/// summaries of 5 s (agents write none unless configured; the simulator writes them so that
/// the analysis of them has data). `threads` = 0 uses every core.
pub fn simulate(scenario: &Scenario, out: &Path, threads: usize) -> Result<SimSummary, SimError> {
    simulate_summarised(scenario, out, threads, rocemesh_formats::window::DEFAULT_WINDOW_S * 1_000_000_000)
}

/// [`simulate`], with window summaries of `summary_window_ns` (0: none, as agents configured
/// with `summary_window_s = 0` write).
pub fn simulate_summarised(
    scenario: &Scenario,
    out: &Path,
    threads: usize,
    summary_window_ns: u64,
) -> Result<SimSummary, SimError> {
    let segments = out.join("segments");
    std::fs::create_dir_all(&segments).map_err(|source| SimError::Io { path: segments.clone(), source })?;
    let fabric = Fabric::new(scenario.clone());
    let inventory_path = out.join("inventory.toml");
    let text = inventory_of(&fabric).to_toml_string().expect("inventory types always serialise");
    std::fs::write(&inventory_path, text).map_err(|source| SimError::Io { path: inventory_path, source })?;

    let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
    let next = AtomicUsize::new(0);
    let total = Arc::new(Mutex::new(SimSummary::default()));
    let first_error: Mutex<Option<SimError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                let mut mine = SimSummary::default();
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= fabric.rnic_count() || first_error.lock().map(|e| e.is_some()).unwrap_or(true) {
                        break;
                    }
                    if let Err(e) = simulate_rnic(&fabric, id as u32, &segments, summary_window_ns, &mut mine) {
                        if let Ok(mut slot) = first_error.lock() {
                            slot.get_or_insert(e);
                        }
                        break;
                    }
                }
                if let Ok(mut t) = total.lock() {
                    t.rnics += mine.rnics;
                    t.records += mine.records;
                    t.paths += mine.paths;
                    t.segments += mine.segments;
                    t.bytes += mine.bytes;
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().ok().flatten() {
        return Err(e);
    }
    let summary = total.lock().map(|t| t.clone()).unwrap_or_default();
    Ok(summary)
}

/// The inventory of the simulated fabric, as ctl would read it, with its cabling as
/// `ctl inventory lldp` would learn it: ToR i's port to spine j is `s{j}`, the spine's is
/// `t{i}`, and the n-th RNIC under a ToR is on its port `h{n}` (the Clos testbed's names).
fn inventory_of(f: &Fabric) -> Inventory {
    let t = &f.scenario.topology;
    let tors = (0..t.tors)
        .map(|i| inventory::Tor {
            name: format!("tor{i}"),
            rail: t.rail_optimised.then_some(i as u16),
            addrs: Vec::new(),
        })
        .collect();
    let spines = (0..t.spines).map(|j| inventory::Spine { name: format!("spine{j}"), addrs: Vec::new() }).collect();
    let links = (0..t.tors)
        .flat_map(|i| {
            (0..t.spines).map(move |j| inventory::Link {
                a_port: Some(format!("s{j}")),
                b_port: Some(format!("t{i}")),
                ..inventory::Link::new(format!("tor{i}"), format!("spine{j}"))
            })
        })
        .collect();
    let k = t.rnics_per_host;
    let mut under_tor = vec![0u32; t.tors as usize];
    let hosts = f
        .host_names
        .iter()
        .enumerate()
        .map(|(h, name)| inventory::Host {
            name: name.clone(),
            rnics: (0..k)
                .map(|r| {
                    let id = h as u32 * k + r;
                    let tor = f.rnic_tor[id as usize];
                    let n = under_tor[tor as usize];
                    under_tor[tor as usize] += 1;
                    inventory::Rnic {
                        device: format!("rnic{r}"),
                        tor: format!("tor{tor}"),
                        ip: ip_of(id).into(),
                        gid: None,
                        port: 1,
                        gid_index: None,
                        tor_port: Some(format!("h{n}")),
                        netdev: None,
                    }
                })
                .collect(),
        })
        .collect();
    Inventory { version: inventory::VERSION, tors, spines, links, hosts }
}

fn ip_of(id: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, (id >> 16) as u8, (id >> 8) as u8, id as u8)
}

fn mapped(id: u32) -> [u8; 16] {
    rocemesh_formats::gid::gid_bytes(ip_of(id).into())
}

/// One simulated agent instance's writer and its dictionary ids.
struct Agent {
    writer: SegmentWriter,
    self_id: u32,
    /// Dictionary id per fabric RNIC, assigned on first use (u32::MAX = not yet).
    ids: Vec<u32>,
    incarnation: usize,
    paths: u64,
}

struct Dists {
    rtt: LogNormal,
    prober: LogNormal,
    responder: LogNormal,
}

fn open_agent(
    f: &Fabric,
    rnic: u32,
    incarnation: usize,
    dir: &Path,
    start_t: u64,
    summary_window_ns: u64,
) -> Result<Agent, SegmentError> {
    let s = &f.scenario;
    let host = f.rnic_host[rnic as usize];
    let tor = format!("tor{}", f.rnic_tor[rnic as usize]);
    let p = &s.probing;
    let per_rnic = (f.inter[rnic as usize].len() as f64 * p.inter_tor_pps
        + (f.tor_rnics[f.rnic_tor[rnic as usize] as usize].len() - 1) as f64 * p.tor_mesh_pps)
        * s.duration_s as f64;
    // Sized to what this agent will write (closed segments are truncated to their data), so a
    // 10,000-RNIC fabric does not preallocate 64 MiB per RNIC.
    // Window summaries cost up to about 112 bytes per probe where keys are sparse (a probe per
    // key and window).
    let per_probe = if summary_window_ns > 0 { 48.0 + 112.0 } else { 48.0 };
    let segment_bytes = ((per_rnic * per_probe * 1.1) as u64 + (4 << 20)).min(256 << 20);
    let cfg = WriterConfig { segment_bytes, max_age_ns: u64::MAX / 4, summary_window_ns, ..WriterConfig::new(dir) };
    let identity = WriterIdentity {
        host: f.host_names[host as usize].clone(),
        device: f.rnic_names[rnic as usize].rsplit('/').next().unwrap_or("rnic0").to_owned(),
        tor: tor.clone(),
        agent_epoch: f.epoch(host, incarnation),
        tool: format!("testbeds simulate (scenario {:?}, seed {})", s.name, s.seed),
    };
    let mut writer = SegmentWriter::new(cfg, identity)?;
    let self_id = writer.endpoint(EndpointRole::Rnic, &f.rnic_names[rnic as usize], &tor, mapped(rnic));
    let mut agent = Agent { writer, self_id, ids: vec![u32::MAX; f.rnic_count()], incarnation, paths: 0 };
    agent.ids[rnic as usize] = self_id;
    // Traces are stamped by the agent, on its host's (possibly stepped) clock.
    write_paths(f, rnic, &mut agent, f.hosts[host as usize].clock(s.start_unix_ns(), start_t))?;
    Ok(agent)
}

impl Agent {
    fn id(&mut self, f: &Fabric, rnic: u32) -> u32 {
        let slot = &mut self.ids[rnic as usize];
        if *slot == u32::MAX {
            let tor = format!("tor{}", f.rnic_tor[rnic as usize]);
            *slot = self.writer.endpoint(EndpointRole::Rnic, &f.rnic_names[rnic as usize], &tor, mapped(rnic));
        }
        *slot
    }
}

/// Path traces: the forward path of every inter-ToR (target, label) this RNIC probes, and the
/// ACK path of every (prober, label) that probes it, as a tracer using the same label would see
/// them. Hops are the switches: source ToR, spine, destination ToR.
fn write_paths(f: &Fabric, rnic: u32, agent: &mut Agent, t_unix_ns: u64) -> Result<(), SegmentError> {
    let mut switch_ids = std::collections::HashMap::new();
    let mut switch = |agent: &mut Agent, name: String| -> u32 {
        *switch_ids
            .entry(name.clone())
            .or_insert_with(|| agent.writer.endpoint(EndpointRole::Switch, &name, "", [0; 16]))
    };
    let mut trace = |agent: &mut Agent, src: u32, dst: u32, label: u32| -> Result<(), SegmentError> {
        let sp = f.spine_of(src, dst, label);
        let mut hops = [0u32; MAX_HOPS];
        hops[0] = switch(agent, format!("tor{}", f.rnic_tor[src as usize]));
        hops[1] = switch(agent, format!("spine{sp}"));
        hops[2] = switch(agent, format!("tor{}", f.rnic_tor[dst as usize]));
        let (src_id, dst_id) = (agent.id(f, src), agent.id(f, dst));
        agent.paths += 1;
        agent.writer.append_path(&PathRecord {
            t_unix_ns,
            src: src_id,
            dst: dst_id,
            flow_label: label,
            hop_count: 3,
            hops,
        })
    };
    for target in &f.inter[rnic as usize] {
        for &label in &target.labels {
            trace(agent, rnic, target.rnic, label)?;
        }
    }
    for &(prober, label) in &f.inter_in[rnic as usize] {
        trace(agent, rnic, prober, label)?;
    }
    Ok(())
}

/// The probes one RNIC's agent sends, in send order: a round robin over its ToR-mesh targets
/// and one over its inter-ToR targets (cycling labels), each spread evenly over time.
struct Schedule {
    mesh: Vec<u32>,
    mesh_interval_ns: f64,
    inter_interval_ns: f64,
    next_mesh: f64,
    next_inter: f64,
    mesh_n: u64,
    inter_n: u64,
}

fn simulate_rnic(
    f: &Fabric,
    rnic: u32,
    dir: &Path,
    summary_window_ns: u64,
    sum: &mut SimSummary,
) -> Result<(), SimError> {
    let err = |source| SimError::Segment { rnic: f.rnic_names[rnic as usize].clone(), source };
    let s = &f.scenario;
    let host = f.rnic_host[rnic as usize];
    let hs = &f.hosts[host as usize];
    let mut rng = Rng::new(hash(&[s.seed, 0x5105, u64::from(rnic)]));
    let d = Dists {
        rtt: LogNormal::fit(s.normal.network_rtt_us),
        prober: LogNormal::fit(s.normal.prober_delay_us),
        responder: LogNormal::fit(s.normal.responder_delay_us),
    };
    let mesh: Vec<u32> =
        f.tor_rnics[f.rnic_tor[rnic as usize] as usize].iter().copied().filter(|&x| x != rnic).collect();
    let inter = &f.inter[rnic as usize];
    let mesh_interval_ns =
        if mesh.is_empty() { f64::INFINITY } else { 1e9 / (mesh.len() as f64 * s.probing.tor_mesh_pps) };
    let inter_interval_ns =
        if inter.is_empty() { f64::INFINITY } else { 1e9 / (inter.len() as f64 * s.probing.inter_tor_pps) };
    // The phase draws happen even for an empty stream so that the random stream is the same
    // whatever the pinglist; an empty stream never fires.
    let (mesh_phase, inter_phase) = (rng.uniform(), rng.uniform());
    let mut sched = Schedule {
        next_mesh: if mesh.is_empty() { f64::INFINITY } else { mesh_phase * mesh_interval_ns.min(1e9) },
        next_inter: if inter.is_empty() { f64::INFINITY } else { inter_phase * inter_interval_ns.min(1e9) },
        mesh,
        mesh_interval_ns,
        inter_interval_ns,
        mesh_n: 0,
        inter_n: 0,
    };
    let duration_ns = s.duration_s * NS;
    let mut agent: Option<Agent> = None;
    let mut counter: u32 = 0;
    while sched.next_mesh.is_finite() || sched.next_inter.is_finite() {
        let (intended, target, label, kind) = if sched.next_mesh <= sched.next_inter {
            let i = (sched.mesh_n % sched.mesh.len() as u64) as usize;
            let t = sched.mesh[i];
            let out = (sched.next_mesh as u64, t, crate::fabric::flow_label(s.seed, rnic, t, 0), 0u8);
            sched.mesh_n += 1;
            sched.next_mesh += sched.mesh_interval_ns;
            out
        } else {
            let n = inter.len() as u64;
            let target = &inter[(sched.inter_n % n) as usize];
            let label = target.labels[((sched.inter_n / n) % target.labels.len() as u64) as usize];
            let out = (sched.next_inter as u64, target.rnic, label, 1u8);
            sched.inter_n += 1;
            sched.next_inter += sched.inter_interval_ns;
            out
        };
        if intended >= duration_ns {
            break;
        }
        // A frozen host's timers fire when it thaws: the probe leaves then.
        let sent = hs.unstall(intended);
        if hs.agent_down(intended) || hs.agent_down(sent) || sent >= duration_ns {
            continue;
        }
        let incarnation = hs.incarnation(sent);
        if agent.as_ref().is_none_or(|a| a.incarnation != incarnation) {
            if let Some(old) = agent.take() {
                finish(old, sum).map_err(err)?;
            }
            agent = Some(open_agent(f, rnic, incarnation, dir, sent, summary_window_ns).map_err(err)?);
            counter = 0;
        }
        let Some(a) = agent.as_mut() else { continue };
        counter = counter.wrapping_add(1).max(1);
        let epoch = f.epoch(host, incarnation);
        let mut r = probe(f, &d, &mut rng, rnic, target, label, sent);
        r.seq = (u64::from(epoch) << 32) | u64::from(counter);
        r.kind = kind;
        r.prober = a.self_id;
        r.target = a.id(f, target);
        r.flow_label = label;
        let late_ns = sent - intended;
        if late_ns > rocemesh_formats::window::LATE_SEND_NS {
            // The agent's schedule slipped while its host was frozen, and it knows by how much.
            a.writer.note_late(r.t1_unix_ns.saturating_sub(late_ns), late_ns);
        }
        a.writer.append(&r).map_err(err)?;
        sum.records += 1;
    }
    if let Some(a) = agent {
        finish(a, sum).map_err(err)?;
    }
    sum.rnics += 1;
    Ok(())
}

fn finish(agent: Agent, sum: &mut SimSummary) -> Result<(), SegmentError> {
    sum.paths += agent.paths;
    let files = agent.writer.finish()?;
    sum.segments += files.len() as u64;
    for p in &files {
        sum.bytes += std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    }
    Ok(())
}

/// One probe from `p` to `t` with `label`, leaving at true time `s` (ns since scenario start).
/// Returns the record without its ids, seq and kind, which the caller fills.
fn probe(f: &Fabric, d: &Dists, rng: &mut Rng, p: u32, t: u32, label: u32, s: u64) -> ProbeRecord {
    let sc = &f.scenario;
    let start = sc.start_unix_ns();
    let host_model = sc.normal.ts_source == TsModel::Host;
    let (hp, ht) = (f.rnic_host[p as usize], f.rnic_host[t as usize]);
    let (prober, responder) = (&f.hosts[hp as usize], &f.hosts[ht as usize]);
    let mut r = ProbeRecord {
        t1_unix_ns: prober.clock(start, s),
        outcome: Outcome::Lost as u8,
        ts_source: if host_model { TsSource::HostPoll as u8 } else { TsSource::Nic as u8 },
        ..ProbeRecord::default()
    };
    // A port that is down fails the send: no send completion at all.
    if f.rnics[p as usize].is_down(s) {
        return r;
    }
    // Posting to the NIC and the wire: a fixed 300 ns, so T2 > T1.
    let wire = s + 300;
    r.arrived = Arrived::PROBE_SENT;
    let (drop_fwd, extra_fwd) = f.one_way(p, t, label, wire);
    if rng.uniform() < drop_fwd {
        return r;
    }
    let rtt = d.rtt.draw(rng);
    let arrive = wire + rtt / 2 + extra_fwd;
    // The target's agent is gone, or the prober still addresses its previous instance.
    if responder.agent_down(arrive) || f.stale_target(ht, arrive) {
        return r;
    }
    // The responder's CPU sees the probe when it is not frozen.
    let polled = responder.unstall(arrive);
    let ack1_out = polled + d.responder.draw(rng);
    let (drop_rev, extra_rev) = f.one_way(t, p, label, ack1_out);
    if rng.uniform() < drop_rev {
        return r;
    }
    let back = ack1_out + (rtt - rtt / 2) + extra_rev;
    if back.saturating_sub(s) > sc.probing.timeout_ms * 1_000_000 {
        return r;
    }
    r.arrived |= Arrived::ACK1;
    r.responder_epoch = f.epoch(ht, responder.incarnation(polled));
    // ACK2 leaves as soon as ACK1's send completes; it crosses the reverse path a moment later.
    let (drop_ack2, _) = f.one_way(t, p, label, ack1_out + 1_000);
    if rng.uniform() < drop_ack2 {
        return r;
    }
    r.arrived |= Arrived::ACK2;
    let seen = prober.unstall(back);
    let app = seen + d.prober.draw(rng);
    // NIC stamps are taken on the wire on the NIC's (PTP) clock; host stamps when the host's CPU
    // polls, on its wall clock. T1 and T6 are always the host's.
    let ts = if host_model {
        [
            r.t1_unix_ns,
            prober.clock(start, wire),
            responder.clock(start, polled),
            responder.clock(start, ack1_out),
            prober.clock(start, seen),
            prober.clock(start, app),
        ]
    } else {
        [r.t1_unix_ns, start + wire, start + arrive, start + ack1_out, start + back, prober.clock(start, app)]
    };
    match six_timestamp_delays(ts) {
        Some((rtt_ns, prober_ns, responder_ns)) => {
            r.network_rtt_ns = rtt_ns;
            r.prober_delay_ns = prober_ns;
            r.responder_delay_ns = responder_ns;
            r.outcome = Outcome::Ok as u8;
        }
        None => r.outcome = Outcome::Invalid as u8,
    }
    r
}
