//! Each fault kind of the scenario README leaves its own signature in the segments the simulator
//! writes, and nothing outside the fault's elements and time span is touched.
//!
//! Every test simulates a 4-ToR fabric for two or three minutes and measures the signature
//! against a control: the same measurement on healthy elements or outside the fault's span.
//! Rates are checked against the loss the physics implies, inside the 5-sigma interval of the
//! binomial they follow, and every such check also asserts that the interval excludes the rate
//! the control would have had (or the fault would have given), so that a simulator that forgot
//! the fault, or leaked it, fails. Delays are checked against the scenario's own p50/p99: the
//! count of samples at or below a quantile is binomial too.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use rocemesh_formats::record::{ABSURD_DELAY_NS, ABSURD_RTT_NS, Arrived, Outcome, ProbeRecord};
use rocemesh_formats::scenario::Scenario;
use rocemesh_formats::segment::SegmentReader;

const NS: i64 = 1_000_000_000;
const MS: i64 = 1_000_000;
const US: i64 = 1_000;

// The fabric every test probes, small enough to simulate in tens of milliseconds.
const MESH_PPS: f64 = 10.0;
const INTER_TORS: u32 = 3;
const INTER_PPS: f64 = 4.0;
const TIMEOUT_MS: i64 = 500;
/// Background per-packet loss: high enough that controls measure a nonzero rate.
const LOSS: f64 = 1e-4;
const RTT_US: (f64, f64) = (4.0, 12.0);
const RESPONDER_US: (f64, f64) = (1.0, 6.0);

/// A probe is decided within its timeout of being sent, so one sent this long after a fault
/// boundary (and this long before the next) saw only one side of it.
const SETTLE: i64 = 2 * TIMEOUT_MS * MS;

/// A control must be able to catch the fault leaking onto it at this rate.
const LEAK: f64 = 0.01;

/// One-sided tail of a 5-sigma normal interval.
const TAIL: f64 = 2.866_515_7e-7;

#[derive(Debug, Clone)]
struct Base {
    seed: u64,
    duration_s: u64,
    spines: u32,
    hosts_per_tor: u32,
    rnics_per_host: u32,
    ts_source: &'static str,
}

impl Default for Base {
    fn default() -> Self {
        Base { seed: 7, duration_s: 120, spines: 4, hosts_per_tor: 4, rnics_per_host: 1, ts_source: "nic" }
    }
}

fn fault(kind: &str, target: &str, params: &str) -> String {
    format!("[[fault]]\nkind = \"{kind}\"\ntarget = \"{target}\"\n{params}\n")
}

fn scenario(b: &Base, faults: &str) -> Scenario {
    let text = format!(
        r#"version = 1
name = "signatures"
seed = {seed}
duration_s = {duration}
window_s = 30

[topology]
spines = {spines}
tors = 4
hosts_per_tor = {hosts}
rnics_per_host = {rnics}

[probing]
tor_mesh_pps = {MESH_PPS}
inter_tor_tors = {INTER_TORS}
inter_tor_pps = {INTER_PPS}
flow_labels = 8
timeout_ms = {TIMEOUT_MS}

[normal]
network_rtt_us = {{ p50 = {r50}, p99 = {r99} }}
prober_delay_us = {{ p50 = 2.0, p99 = 15.0 }}
responder_delay_us = {{ p50 = {d50}, p99 = {d99} }}
loss = {LOSS}
ts_source = "{ts}"

{faults}"#,
        seed = b.seed,
        duration = b.duration_s,
        spines = b.spines,
        hosts = b.hosts_per_tor,
        rnics = b.rnics_per_host,
        r50 = RTT_US.0,
        r99 = RTT_US.1,
        d50 = RESPONDER_US.0,
        d99 = RESPONDER_US.1,
        ts = b.ts_source,
    );
    Scenario::parse(&text, Path::new("signatures.toml")).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// A probe record with its ids translated to the simulation-wide name table.
#[derive(Debug, Clone, Copy)]
struct Probe {
    r: ProbeRecord,
    /// Index of the segment it was read from.
    seg: usize,
}

#[derive(Debug)]
struct Seg {
    file: String,
    writer: u32,
    epoch: u32,
}

#[derive(Debug)]
struct Sim {
    start_unix_ns: i64,
    names: Vec<String>,
    ids: HashMap<String, u32>,
    tor_of: HashMap<u32, u32>,
    /// In file order, segments in file-name order.
    probes: Vec<Probe>,
    /// (src, dst, flow label) -> [src ToR, spine, dst ToR].
    paths: HashMap<(u32, u32, u32), [u32; 3]>,
    segs: Vec<Seg>,
    files: BTreeMap<String, Vec<u8>>,
}

impl Sim {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        id
    }

    fn id(&self, name: &str) -> u32 {
        *self.ids.get(name).unwrap_or_else(|| panic!("{name} appears in no segment"))
    }

    /// Send time, ns since the scenario's start, on the prober's clock.
    fn t(&self, p: &Probe) -> i64 {
        p.r.t1_unix_ns as i64 - self.start_unix_ns
    }

    fn tor(&self, rnic: u32) -> u32 {
        self.tor_of[&rnic]
    }

    fn touches_tor(&self, p: &Probe, tor: u32) -> bool {
        self.tor(p.r.prober) == tor || self.tor(p.r.target) == tor
    }

    /// Forward and ACK paths of an inter-ToR probe, from the path traces of both ends.
    fn route(&self, p: &Probe) -> ([u32; 3], [u32; 3]) {
        let get = |s: u32, d: u32| {
            *self.paths.get(&(s, d, p.r.flow_label)).unwrap_or_else(|| {
                panic!(
                    "no path trace {} -> {} label {}",
                    self.names[s as usize], self.names[d as usize], p.r.flow_label
                )
            })
        };
        (get(p.r.prober, p.r.target), get(p.r.target, p.r.prober))
    }

    fn own(&self, rnic: u32) -> Vec<Probe> {
        self.probes.iter().copied().filter(|p| p.r.prober == rnic).collect()
    }
}

fn simulate_into(s: &Scenario, dir: &Path, threads: usize) -> rocemesh_testbeds::SimSummary {
    rocemesh_testbeds::simulate(s, dir, threads).unwrap_or_else(|e| panic!("simulate: {e}"))
}

fn run(s: &Scenario) -> Sim {
    let dir = tempfile::tempdir().expect("tempdir");
    let summary = simulate_into(s, dir.path(), 2);
    let sim = read(s, dir.path());
    assert_eq!(summary.records, sim.probes.len() as u64, "summary and segments disagree on the record count");
    assert_eq!(summary.segments, sim.segs.len() as u64);
    assert_eq!(summary.rnics as u32, s.topology.rnic_count());
    sim
}

fn read(s: &Scenario, dir: &Path) -> Sim {
    let mut sim = Sim {
        start_unix_ns: s.start_unix_ns() as i64,
        names: Vec::new(),
        ids: HashMap::new(),
        tor_of: HashMap::new(),
        probes: Vec::new(),
        paths: HashMap::new(),
        segs: Vec::new(),
        files: BTreeMap::new(),
    };
    let mut files: Vec<_> =
        std::fs::read_dir(dir.join("segments")).expect("segments dir").map(|e| e.expect("dir entry").path()).collect();
    files.sort();
    for path in files {
        let file = path.file_name().and_then(|n| n.to_str()).expect("utf-8 name").to_owned();
        sim.files.insert(file.clone(), std::fs::read(&path).expect("read segment"));
        let reader = SegmentReader::open(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(reader.damage().is_empty(), "{file}: {:?}", reader.damage());
        assert!(reader.is_closed(), "{file} was left open");
        let ident = reader.identity();
        let writer = sim.intern(&format!("{}/{}", ident.host, ident.device));
        let map: Vec<u32> = reader.dictionary().iter().map(|e| sim.intern(&e.name)).collect();
        for e in reader.dictionary() {
            if !e.tor.is_empty() {
                let tor = sim.intern(&e.tor);
                sim.tor_of.insert(map[e.id as usize], tor);
            }
        }
        let seg = sim.segs.len();
        sim.segs.push(Seg { file, writer, epoch: ident.agent_epoch });
        for c in reader.probe_chunks() {
            for i in 0..c.len() {
                let mut r = c.row(i);
                r.prober = map[r.prober as usize];
                r.target = map[r.target as usize];
                assert_eq!(r.prober, writer, "a segment holds only its writer's probes");
                sim.probes.push(Probe { r, seg });
            }
        }
        for p in reader.path_records() {
            assert_eq!(p.hop_count.to_native(), 3, "ToR, spine, ToR");
            let hop = |i: usize| map[p.hops[i].to_native() as usize];
            let key = (map[p.src.to_native() as usize], map[p.dst.to_native() as usize], p.flow_label.to_native());
            let hops = [hop(0), hop(1), hop(2)];
            if let Some(old) = sim.paths.insert(key, hops) {
                assert_eq!(old, hops, "two traces of one (src, dst, label) disagree");
            }
        }
    }
    sim
}

/// The 5-sigma acceptance interval of Binomial(n, q): both tails beyond it hold at most `TAIL`.
/// Exact (summed in log space), so it is right for small counts where the normal is not.
fn binomial_range(n: u64, q: f64) -> (u64, u64) {
    if q <= 0.0 {
        return (0, 0);
    }
    if q >= 1.0 {
        return (n, n);
    }
    let (lq, lr) = (q.ln(), (1.0 - q).ln());
    let mut log_pmf = n as f64 * lr;
    let mut cdf = 0.0;
    let mut lo = None;
    for k in 0..=n {
        if k > 0 {
            log_pmf += ((n - k + 1) as f64).ln() - (k as f64).ln() + lq - lr;
        }
        cdf += log_pmf.exp();
        if lo.is_none() && cdf > TAIL {
            lo = Some(k);
        }
        if cdf >= 1.0 - TAIL {
            return (lo.unwrap_or(k), k);
        }
    }
    (lo.unwrap_or(0), n)
}

/// `k` of `n` is what a rate `q` gives, and would not be what `other` (the control's rate, or
/// the fault's) gives: the measurement both holds and has the power to tell the two apart.
fn check_rate(what: &str, k: u64, n: u64, q: f64, other: f64) {
    let (lo, hi) = binomial_range(n, q);
    let (olo, ohi) = binomial_range(n, other);
    println!(
        "{what}: {k}/{n} = {:.5} (expected {q:.5}: 5-sigma {lo}..={hi}; {other:.5} would give {olo}..={ohi})",
        ratio(k, n)
    );
    assert!(n > 0, "{what}: no samples");
    assert!((lo..=hi).contains(&k), "{what}: {k}/{n} is outside {lo}..={hi}, the 5-sigma range of rate {q}");
    assert!(hi < olo || ohi < lo, "{what}: {n} samples cannot tell rate {q} from {other}: test too small");
}

fn ratio(k: u64, n: u64) -> f64 {
    k as f64 / n.max(1) as f64
}

/// Probe failed: it or ACK1 was lost (or it timed out, or the port was down). ACK2 only
/// carries T4 and does not decide whether the path works.
fn failed(p: &Probe) -> bool {
    !Arrived(p.r.arrived).has(Arrived::ACK1)
}

fn fails<'a>(it: impl IntoIterator<Item = &'a Probe>) -> (u64, u64) {
    it.into_iter().fold((0, 0), |(k, n), p| (k + u64::from(failed(p)), n + 1))
}

/// Chance a probe fails when its probe packet and ACK1 each cross `crossings` elements
/// dropping with `p` besides the background loss every packet has.
fn fail_rate(p: f64, fwd_crossings: i32, ack_crossings: i32) -> f64 {
    let pass = |c| (1.0 - LOSS) * (1.0 - p).powi(c);
    1.0 - pass(fwd_crossings) * pass(ack_crossings)
}

const BACKGROUND: f64 = 2.0 * LOSS - LOSS * LOSS;

/// Delays (ns) follow a log-normal whose p50 and p99 are `q` (µs), after removing `shift_ns`:
/// the counts at or below each quantile are Binomial(n, 0.5) and Binomial(n, 0.99).
fn check_quantiles(what: &str, samples: &[i64], q: (f64, f64), shift_ns: i64) {
    let n = samples.len() as u64;
    assert!(n > 0, "{what}: no samples");
    for (p, at_us) in [(0.5, q.0), (0.99, q.1)] {
        let at = (at_us * 1e3) as i64 + shift_ns;
        let k = samples.iter().filter(|&&x| x <= at).count() as u64;
        let (lo, hi) = binomial_range(n, p);
        println!("{what}: {k}/{n} at or below {} us (expected p{}: 5-sigma {lo}..={hi})", at as f64 / 1e3, p * 100.0);
        assert!((lo..=hi).contains(&k), "{what}: {k}/{n} samples <= {at} ns, expected {lo}..={hi} (p{p})");
    }
}

fn rtts<'a>(it: impl IntoIterator<Item = &'a Probe>) -> Vec<i64> {
    it.into_iter().filter(|p| p.r.outcome == Outcome::Ok as u8).map(|p| i64::from(p.r.network_rtt_ns)).collect()
}

/// Probes an RNIC sends per second: its ToR-mesh peers plus its inter-ToR targets.
fn sends_per_s(s: &Scenario) -> f64 {
    let peers = s.topology.hosts_per_tor * s.topology.rnics_per_host - 1;
    f64::from(peers) * MESH_PPS + f64::from(INTER_TORS) * INTER_PPS
}

/// Each of the agent's two round robins (mesh, inter-ToR) sends within one probe of its rate
/// over any span.
fn check_send_count(what: &str, n: usize, s: &Scenario, span_ns: i64) {
    let want = sends_per_s(s) * span_ns as f64 / 1e9;
    println!("{what}: {n} probes sent, schedule says {want:.1}");
    assert!((n as f64 - want).abs() <= 2.0, "{what}: {n} probes sent over {span_ns} ns, the schedule says {want:.1}");
}

fn during(t: i64, from_s: f64, to_s: f64) -> bool {
    t >= (from_s * 1e9) as i64 + SETTLE && t < (to_s * 1e9) as i64 - SETTLE
}

/// Every probe was lost, and `arrived` says where: 0 when the prober's own port was down (the
/// send failed), PROBE_SENT when the probe or ACK1 died on the way.
fn all_lost_with(what: &str, probes: &[&Probe], arrived: u8) {
    let lost = probes.iter().filter(|p| p.r.outcome == Outcome::Lost as u8 && p.r.arrived == arrived).count();
    println!("{what}: {lost}/{} lost with arrived = {arrived}", probes.len());
    // Fewer would not tell "all lost" from bad luck convincingly, however rare loss is.
    assert!(probes.len() >= 50, "{what}: only {} probes", probes.len());
    assert_eq!(lost, probes.len(), "{what}: every probe must be lost with arrived = {arrived}");
}

#[test]
fn rnic_down() {
    let (start, end) = (40.0, 100.0);
    let s =
        scenario(&Base::default(), &fault("rnic_down", "tor1-h2/rnic0", &format!("start_s = {start}\nend_s = {end}")));
    let sim = run(&s);
    let x = sim.id("tor1-h2/rnic0");
    let ps = &sim.probes;
    let own: Vec<_> = ps.iter().filter(|p| p.r.prober == x && during(sim.t(p), start, end)).collect();
    check_send_count("rnic_down own probes during the fault", own.len(), &s, ((end - start) * 1e9) as i64 - 2 * SETTLE);
    // Its port is down: the send itself fails, nothing leaves.
    all_lost_with("rnic_down own probes", &own, 0);
    let to: Vec<_> = ps.iter().filter(|p| p.r.target == x && during(sim.t(p), start, end)).collect();
    all_lost_with("rnic_down probes to it", &to, Arrived::PROBE_SENT);

    let (k, n) = fails(ps.iter().filter(|p| p.r.prober != x && p.r.target != x && during(sim.t(p), start, end)));
    check_rate("rnic_down healthy pairs during the fault", k, n, BACKGROUND, LEAK);
    let outside = |p: &&Probe| {
        let t = sim.t(p);
        (p.r.prober == x || p.r.target == x) && (t < (start * 1e9) as i64 - SETTLE || t >= (end * 1e9) as i64 + SETTLE)
    };
    let (k, n) = fails(ps.iter().filter(outside));
    check_rate("rnic_down its pairs before and after", k, n, BACKGROUND, LEAK);
}

#[test]
fn rnic_loss() {
    let (p, start) = (0.05, 30.0);
    let s = scenario(&Base::default(), &fault("rnic_loss", "tor2-h1/rnic0", &format!("start_s = {start}\nloss = {p}")));
    let sim = run(&s);
    let x = sim.id("tor2-h1/rnic0");
    let end = s.duration_s as f64 + 1.0;
    let on = |q: &&Probe| during(sim.t(q), start, end);
    // Probe and ACK1 each cross the RNIC once, whichever end it is.
    let q = fail_rate(p, 1, 1);
    let (k, n) = fails(sim.probes.iter().filter(on).filter(|q| q.r.prober == x));
    check_rate("rnic_loss probes it sends", k, n, q, BACKGROUND);
    let (k, n) = fails(sim.probes.iter().filter(on).filter(|q| q.r.target == x));
    check_rate("rnic_loss probes to it", k, n, q, BACKGROUND);
    // ACK2 is a third packet through the RNIC, dropped on its own once ACK1 made it.
    let acked: Vec<_> =
        sim.probes.iter().filter(on).filter(|q| (q.r.prober == x || q.r.target == x) && !failed(q)).collect();
    let k = acked.iter().filter(|q| !Arrived(q.r.arrived).has(Arrived::ACK2)).count() as u64;
    check_rate("rnic_loss ACK2 lost after ACK1", k, acked.len() as u64, fail_rate(p, 1, 0), LOSS);
    let (k, n) = fails(sim.probes.iter().filter(on).filter(|q| q.r.prober != x && q.r.target != x));
    check_rate("rnic_loss healthy pairs", k, n, BACKGROUND, LEAK);
    let (k, n) =
        fails(sim.probes.iter().filter(|q| (q.r.prober == x || q.r.target == x) && during(sim.t(q), 0.0, start)));
    check_rate("rnic_loss its pairs before the fault", k, n, BACKGROUND, q);
}

#[test]
fn rnic_flap() {
    let (start, end, period, down) = (10.0, 110.0, 20.0, 5.0);
    let params = format!("start_s = {start}\nend_s = {end}\nperiod_s = {period}\ndown_s = {down}");
    let s = scenario(&Base::default(), &fault("rnic_flap", "tor0-h3/rnic0", &params));
    let sim = run(&s);
    let x = sim.id("tor0-h3/rnic0");
    let (start_ns, end_ns) = ((start * 1e9) as i64, (end * 1e9) as i64);
    let (period_ns, down_ns) = ((period * 1e9) as i64, (down * 1e9) as i64);
    let mine: Vec<Probe> = sim.probes.iter().copied().filter(|p| p.r.prober == x || p.r.target == x).collect();
    let inside = |p: &Probe| (start_ns..end_ns).contains(&sim.t(p));
    let phase = |p: &Probe| (sim.t(p) - start_ns) % period_ns;
    let in_phase = |p: &Probe, from: i64, to: i64| inside(p) && (from..to).contains(&phase(p));
    let down_part: Vec<&Probe> = mine.iter().filter(|p| in_phase(p, SETTLE, down_ns - SETTLE)).collect();
    let own_down: Vec<_> = down_part.iter().copied().filter(|p| p.r.prober == x).collect();
    all_lost_with("rnic_flap own probes in the down part", &own_down, 0);
    let to_down: Vec<_> = down_part.iter().copied().filter(|p| p.r.target == x).collect();
    all_lost_with("rnic_flap probes to it in the down part", &to_down, Arrived::PROBE_SENT);
    let (k, n) = fails(mine.iter().filter(|p| in_phase(p, down_ns + SETTLE, period_ns - SETTLE)));
    check_rate("rnic_flap its pairs in the up part", k, n, BACKGROUND, down / period);
    let (k, n) = fails(mine.iter().filter(|p| sim.t(p) < start_ns - SETTLE || sim.t(p) >= end_ns + SETTLE));
    check_rate("rnic_flap its pairs outside the fault", k, n, BACKGROUND, down / period);

    // One burst of loss per period, and every other lost probe as rare as background loss.
    let in_down = |p: &Probe| in_phase(p, 0, down_ns + SETTLE);
    let lost: Vec<&Probe> = mine.iter().filter(|p| failed(p)).collect();
    let flaps: std::collections::BTreeSet<i64> =
        lost.iter().filter(|p| in_down(p)).map(|p| (sim.t(p) - start_ns) / period_ns).collect();
    let periods = ((end - start) / period) as i64;
    let n_down = lost.iter().filter(|p| in_down(p)).count();
    println!("rnic_flap: {n_down} of {} lost probes of its pairs fall in the {periods} down parts", lost.len());
    assert_eq!(flaps, (0..periods).collect(), "a loss burst in each period");
    let (k, n) = fails(mine.iter().filter(|p| !in_down(p)));
    check_rate("rnic_flap its pairs outside the down parts", k, n, BACKGROUND, down / period);
    let (k, n) = fails(sim.probes.iter().filter(|p| p.r.prober != x && p.r.target != x));
    check_rate("rnic_flap healthy pairs", k, n, BACKGROUND, LEAK);
}

#[test]
fn rnic_slow() {
    let (extra_us, start) = (300.0, 40.0);
    let s = scenario(
        &Base::default(),
        &fault("rnic_slow", "tor3-h0/rnic0", &format!("start_s = {start}\nextra_rtt_us = {extra_us}")),
    );
    let sim = run(&s);
    let x = sim.id("tor3-h0/rnic0");
    let extra = (extra_us * 1e3) as i64;
    let end = s.duration_s as f64 + 1.0;
    let mine = |p: &&Probe| p.r.prober == x || p.r.target == x;
    // Both directions cross the RNIC, each carrying half the extra.
    let slow = rtts(sim.probes.iter().filter(mine).filter(|p| during(sim.t(p), start, end)));
    check_quantiles("rnic_slow its pairs' RTT - extra", &slow, RTT_US, extra);
    let min = slow.iter().min().copied().unwrap_or(0);
    println!("rnic_slow: min RTT of its pairs {min} ns (extra {extra} ns)");
    assert!(min > extra, "every probe through the slow RNIC carries the extra RTT");
    let before = rtts(sim.probes.iter().filter(mine).filter(|p| during(sim.t(p), 0.0, start)));
    check_quantiles("rnic_slow its pairs' RTT before", &before, RTT_US, 0);
    let healthy = rtts(sim.probes.iter().filter(|p| !mine(p)));
    check_quantiles("rnic_slow healthy pairs' RTT", &healthy, RTT_US, 0);
    let max = before.iter().chain(&healthy).max().copied().unwrap_or(i64::MAX);
    println!("rnic_slow: max RTT of the controls {max} ns");
    assert!(max < extra / 2, "no probe outside the fault is delayed even by one crossing");
    // Slow is not lossy: 300 µs is far inside the timeout.
    let (k, n) = fails(sim.probes.iter().filter(mine).filter(|p| during(sim.t(p), start, end)));
    check_rate("rnic_slow its pairs' loss", k, n, BACKGROUND, LEAK);
}

#[test]
fn tor_down() {
    let (start, end) = (30.0, 90.0);
    let s = scenario(&Base::default(), &fault("tor_down", "tor2", &format!("start_s = {start}\nend_s = {end}")));
    let sim = run(&s);
    let tor = sim.id("tor2");
    let on: Vec<_> = sim.probes.iter().filter(|p| during(sim.t(p), start, end)).collect();
    // The RNICs' ports are up: their probes leave and die in the ToR, like the probes to them.
    let touching: Vec<_> = on.iter().copied().filter(|p| sim.touches_tor(p, tor)).collect();
    all_lost_with("tor_down pairs touching the ToR", &touching, Arrived::PROBE_SENT);
    // All of the ToR's mesh probes and its inter-ToR probes both ways are in there: each of its
    // RNICs' round robins, and one target in this ToR for every RNIC of the three others.
    let hosts = f64::from(s.topology.hosts_per_tor);
    let span = (end - start) - 2.0 * SETTLE as f64 / 1e9;
    let mesh = touching.iter().filter(|p| p.r.kind == 0).count() as f64;
    let want_mesh = hosts * (hosts - 1.0) * MESH_PPS * span;
    let inter = touching.len() as f64 - mesh;
    let want_inter = 2.0 * hosts * f64::from(INTER_TORS) * INTER_PPS * span;
    println!("tor_down: {mesh} mesh probes (schedule {want_mesh}), {inter} inter-ToR (schedule {want_inter})");
    assert!((mesh - want_mesh).abs() <= hosts, "{mesh} mesh probes touching the ToR");
    assert!((inter - want_inter).abs() <= hosts * 4.0, "{inter} inter-ToR probes touching the ToR");
    let (k, n) = fails(on.iter().copied().filter(|p| !sim.touches_tor(p, tor)));
    check_rate("tor_down pairs not touching it", k, n, BACKGROUND, LEAK);
    let (k, n) =
        fails(sim.probes.iter().filter(|p| sim.touches_tor(p, tor) && !during(sim.t(p), start - 1.0, end + 1.0)));
    check_rate("tor_down its pairs before and after", k, n, BACKGROUND, LEAK);
}

#[test]
fn tor_loss() {
    let (p, start) = (0.03, 20.0);
    let s = scenario(&Base::default(), &fault("tor_loss", "tor1", &format!("start_s = {start}\nloss = {p}")));
    let sim = run(&s);
    let tor = sim.id("tor1");
    let end = s.duration_s as f64 + 1.0;
    let on: Vec<_> = sim.probes.iter().filter(|q| during(sim.t(q), start, end)).collect();
    // Every packet touching the ToR crosses it once, inside its mesh or to another ToR.
    let q = fail_rate(p, 1, 1);
    let (k, n) = fails(on.iter().copied().filter(|r| r.r.kind == 0 && sim.touches_tor(r, tor)));
    check_rate("tor_loss its mesh", k, n, q, BACKGROUND);
    let (k, n) = fails(on.iter().copied().filter(|r| r.r.kind == 1 && sim.tor(r.r.prober) == tor));
    check_rate("tor_loss inter-ToR probes from it", k, n, q, BACKGROUND);
    let (k, n) = fails(on.iter().copied().filter(|r| r.r.kind == 1 && sim.tor(r.r.target) == tor));
    check_rate("tor_loss inter-ToR probes to it", k, n, q, BACKGROUND);
    let (k, n) = fails(on.iter().copied().filter(|r| !sim.touches_tor(r, tor)));
    check_rate("tor_loss pairs not touching it", k, n, BACKGROUND, LEAK);
    let (k, n) = fails(sim.probes.iter().filter(|r| sim.touches_tor(r, tor) && during(sim.t(r), 0.0, start)));
    check_rate("tor_loss its pairs before", k, n, BACKGROUND, q);
}

/// Inter-ToR probes split by whether their forward and ACK paths cross an element.
fn by_crossing<'a>(
    sim: &'a Sim,
    probes: impl Iterator<Item = &'a Probe>,
    cross: impl Fn(&[u32; 3]) -> bool,
) -> [Vec<&'a Probe>; 4] {
    let mut out: [Vec<&Probe>; 4] = Default::default();
    for p in probes.filter(|p| p.r.kind == 1) {
        let (fwd, ack) = sim.route(p);
        out[usize::from(cross(&fwd)) + 2 * usize::from(cross(&ack))].push(p);
    }
    out
}

const CROSSING: [&str; 4] = ["neither path", "forward path only", "ACK path only", "both paths"];

fn check_crossing_loss(what: &str, groups: &[Vec<&Probe>; 4], p: f64) {
    for (i, g) in groups.iter().enumerate() {
        let (fwd, ack) = (i32::from(i & 1 == 1), i32::from(i & 2 == 2));
        let q = fail_rate(p, fwd, ack);
        let other = if i == 0 { fail_rate(p, 1, 0) } else { BACKGROUND };
        let (k, n) = fails(g.iter().copied());
        check_rate(&format!("{what} inter-ToR probes crossing it on {}", CROSSING[i]), k, n, q, other);
    }
}

#[test]
fn link_loss() {
    let (p, start) = (0.1, 20.0);
    let s = scenario(&Base::default(), &fault("link_loss", "tor0|spine1", &format!("start_s = {start}\nloss = {p}")));
    let sim = run(&s);
    let (tor, spine) = (sim.id("tor0"), sim.id("spine1"));
    let end = s.duration_s as f64 + 1.0;
    let cross = |h: &[u32; 3]| h[1] == spine && (h[0] == tor || h[2] == tor);
    let on = by_crossing(&sim, sim.probes.iter().filter(|q| during(sim.t(q), start, end)), cross);
    check_crossing_loss("link_loss", &on, p);
    // The ToR's own mesh never leaves it; probes touching the ToR over other spines are clean.
    let (k, n) = fails(sim.probes.iter().filter(|q| q.r.kind == 0 && during(sim.t(q), start, end)));
    check_rate("link_loss ToR-mesh probes", k, n, BACKGROUND, LEAK);
    let other_spines: Vec<_> = on[0].iter().copied().filter(|q| sim.touches_tor(q, tor)).collect();
    let (k, n) = fails(other_spines);
    check_rate("link_loss probes touching tor0 over other spines", k, n, BACKGROUND, fail_rate(p, 1, 0));
    let before = by_crossing(&sim, sim.probes.iter().filter(|q| during(sim.t(q), 0.0, start)), cross);
    let (k, n) = fails(before[1..].iter().flatten().copied());
    check_rate("link_loss crossing probes before the fault", k, n, BACKGROUND, fail_rate(p, 1, 0));
}

#[test]
fn link_flap() {
    let (start, end, period, down) = (10.0, 110.0, 20.0, 4.0);
    let params = format!("start_s = {start}\nend_s = {end}\nperiod_s = {period}\ndown_s = {down}");
    let s = scenario(&Base::default(), &fault("link_flap", "spine2|tor1", &params));
    let sim = run(&s);
    let (tor, spine) = (sim.id("tor1"), sim.id("spine2"));
    let cross = |h: &[u32; 3]| h[1] == spine && (h[0] == tor || h[2] == tor);
    let (start_ns, end_ns, period_ns, down_ns) =
        ((start * 1e9) as i64, (end * 1e9) as i64, (period * 1e9) as i64, (down * 1e9) as i64);
    let phase = |p: &&Probe| (sim.t(p) - start_ns) % period_ns;
    let inside = |p: &&Probe| (start_ns..end_ns).contains(&sim.t(p));
    let down_part = by_crossing(
        &sim,
        sim.probes.iter().filter(inside).filter(|p| (SETTLE..down_ns - SETTLE).contains(&phase(p))),
        cross,
    );
    let up_part = by_crossing(
        &sim,
        sim.probes.iter().filter(inside).filter(|p| (down_ns + SETTLE..period_ns - SETTLE).contains(&phase(p))),
        cross,
    );
    // Forward crossing: the probe dies; ACK crossing: ACK1 dies. Either way, PROBE_SENT only.
    for (i, g) in down_part.iter().enumerate().skip(1) {
        all_lost_with(&format!("link_flap down part, crossing on {}", CROSSING[i]), g, Arrived::PROBE_SENT);
    }
    // Were the traces not the paths the packets took, the losses would spread over all probes.
    let crossing = down_part[1..].iter().map(Vec::len).sum::<usize>() as f64;
    let spread = crossing / (crossing + down_part[0].len() as f64);
    let (k, n) = fails(down_part[0].iter().copied());
    check_rate("link_flap down part, probes crossing elsewhere", k, n, BACKGROUND, spread);
    let (k, n) = fails(down_part[0].iter().copied().filter(|p| sim.touches_tor(p, tor)));
    check_rate("link_flap down part, tor1 probes over other spines", k, n, BACKGROUND, spread);
    let (k, n) = fails(up_part[1..].iter().flatten().copied());
    check_rate("link_flap up part, crossing probes", k, n, BACKGROUND, down / period);
    let (k, n) = fails(sim.probes.iter().filter(|p| p.r.kind == 0 && inside(p) && phase(p) < down_ns));
    check_rate("link_flap down part, ToR-mesh probes", k, n, BACKGROUND, LEAK);
    let outside = |p: &&Probe| sim.t(p) < start_ns - SETTLE || sim.t(p) >= end_ns + SETTLE;
    let (k, n) = fails(by_crossing(&sim, sim.probes.iter().filter(outside), cross)[1..].iter().flatten().copied());
    check_rate("link_flap crossing probes outside the fault", k, n, BACKGROUND, down / period);
    let periods: std::collections::BTreeSet<i64> =
        down_part[1..].iter().flatten().map(|p| (sim.t(p) - start_ns) / period_ns).collect();
    assert_eq!(periods, (0..((end - start) / period) as i64).collect(), "crossing probes die in every down part");
}

#[test]
fn link_slow() {
    let (extra_us, start) = (200.0, 30.0);
    let s = scenario(
        &Base::default(),
        &fault("link_slow", "tor3|spine0", &format!("start_s = {start}\nextra_rtt_us = {extra_us}")),
    );
    let sim = run(&s);
    let (tor, spine) = (sim.id("tor3"), sim.id("spine0"));
    let cross = |h: &[u32; 3]| h[1] == spine && (h[0] == tor || h[2] == tor);
    let half = (extra_us * 500.0) as i64;
    let end = s.duration_s as f64 + 1.0;
    let on = by_crossing(&sim, sim.probes.iter().filter(|p| during(sim.t(p), start, end)), cross);
    // Each crossing carries half the extra RTT.
    for (i, g) in on.iter().enumerate() {
        let crossings = (i & 1) as i64 + (i >> 1) as i64;
        let rtt = rtts(g.iter().copied());
        check_quantiles(&format!("link_slow RTT crossing on {}", CROSSING[i]), &rtt, RTT_US, crossings * half);
        let (min, max) = (rtt.iter().min().copied().unwrap_or(0), rtt.iter().max().copied().unwrap_or(0));
        println!("link_slow crossing on {}: RTT {min}..={max} ns", CROSSING[i]);
        // Healthy RTTs stay far below one crossing's extra, so the groups cannot overlap.
        assert!(min > crossings * half && max < crossings * half + half, "{}: RTT {min}..{max}", CROSSING[i]);
    }
    let mesh = rtts(sim.probes.iter().filter(|p| p.r.kind == 0));
    check_quantiles("link_slow ToR-mesh RTT", &mesh, RTT_US, 0);
    assert!(mesh.iter().all(|&r| r < half), "no mesh probe crosses a link");
    let before = by_crossing(&sim, sim.probes.iter().filter(|p| during(sim.t(p), 0.0, start)), cross);
    let rtt = rtts(before[3].iter().chain(&before[1]).chain(&before[2]).copied());
    check_quantiles("link_slow RTT of crossing probes before", &rtt, RTT_US, 0);
}

#[test]
fn spine_loss() {
    let (p, start) = (0.08, 20.0);
    let s = scenario(&Base::default(), &fault("spine_loss", "spine1", &format!("start_s = {start}\nloss = {p}")));
    let sim = run(&s);
    let spine = sim.id("spine1");
    let end = s.duration_s as f64 + 1.0;
    let on = by_crossing(&sim, sim.probes.iter().filter(|q| during(sim.t(q), start, end)), |h| h[1] == spine);
    check_crossing_loss("spine_loss", &on, p);
    // Every ToR sends through the spine: the loss is not tied to one ToR.
    for t in 0..4 {
        let tor = sim.id(&format!("tor{t}"));
        let (k, n) = fails(on[1].iter().copied().filter(|q| sim.tor(q.r.prober) == tor));
        check_rate(&format!("spine_loss forward crossings from tor{t}"), k, n, fail_rate(p, 1, 0), BACKGROUND);
    }
    let (k, n) = fails(sim.probes.iter().filter(|q| q.r.kind == 0 && during(sim.t(q), start, end)));
    check_rate("spine_loss ToR-mesh probes", k, n, BACKGROUND, LEAK);
    let before = by_crossing(&sim, sim.probes.iter().filter(|q| during(sim.t(q), 0.0, start)), |h| h[1] == spine);
    let (k, n) = fails(before[1..].iter().flatten().copied());
    check_rate("spine_loss crossing probes before the fault", k, n, BACKGROUND, fail_rate(p, 1, 0));
}

struct Stall {
    start_ns: i64,
    end_ns: i64,
    period_ns: i64,
    stall_ns: i64,
}

impl Stall {
    /// End of the stall that `t` falls in, if any.
    fn thaw(&self, t: i64) -> Option<i64> {
        let phase = (t - self.start_ns).rem_euclid(self.period_ns);
        ((self.start_ns..self.end_ns).contains(&t) && phase < self.stall_ns).then(|| t - phase + self.stall_ns)
    }

    fn count(&self) -> i64 {
        (self.end_ns - self.start_ns + self.period_ns - 1) / self.period_ns
    }
}

/// Measures a host stall's signature; `inflated` picks, from a probe to the stalled host, the
/// delay that carries the wait (responder delay with NIC stamps, network RTT with host ones),
/// and `plain` the other one.
fn check_host_stall(ts_source: &'static str, inflated: fn(&ProbeRecord) -> i32, plain: fn(&ProbeRecord) -> i32) {
    let st = Stall { start_ns: 20 * NS, end_ns: 100 * NS, period_ns: 10 * NS, stall_ns: 200 * MS };
    let params = format!("start_s = 20\nend_s = 100\nperiod_s = 10\nstall_ms = {}", st.stall_ns / MS);
    let s = scenario(&Base { ts_source, ..Base::default() }, &fault("host_stall", "tor1-h1", &params));
    let sim = run(&s);
    let x = sim.id("tor1-h1/rnic0");
    let what = format!("host_stall ({ts_source} stamps)");

    // Timers: the host sends nothing during a stall, then its overdue probes leave at once.
    let mesh_gap = (1e9 / (f64::from(s.topology.hosts_per_tor - 1) * MESH_PPS)).ceil() as i64 + 1;
    let gaps = |rnic: u32| -> Vec<(i64, i64)> {
        let t: Vec<i64> = sim.own(rnic).iter().map(|p| sim.t(p)).collect();
        t.windows(2).filter(|w| w[1] - w[0] > mesh_gap).map(|w| (w[0], w[1])).collect()
    };
    let big = gaps(x);
    println!("{what}: send gaps over {mesh_gap} ns: {:?}", big.iter().map(|g| (g.1 - g.0) / US).collect::<Vec<_>>());
    assert_eq!(big.len() as i64, st.count(), "one send gap per stall");
    let rate = sends_per_s(&s);
    for (k, &(before, after)) in big.iter().enumerate() {
        let thaw = st.start_ns + k as i64 * st.period_ns + st.stall_ns;
        assert_eq!(after, thaw, "the first send after gap {k} is at the stall's end");
        assert!((st.stall_ns..=st.stall_ns + mesh_gap).contains(&(after - before)), "gap {k}: {} ns", after - before);
        let burst = sim.own(x).iter().filter(|p| sim.t(p) == thaw).count();
        let want = rate * st.stall_ns as f64 / 1e9;
        assert!((burst as f64 - want).abs() <= 2.0, "burst {k}: {burst} probes at the thaw, {want:.1} were due");
    }
    for rnic in (0..sim.names.len() as u32).filter(|&r| r != x && sim.tor_of.contains_key(&r)) {
        assert!(gaps(rnic).is_empty(), "{} has send gaps", sim.names[rnic as usize]);
    }

    // Replies: a probe reaching the host in a stall waits for the thaw.
    let to: Vec<_> = sim.probes.iter().filter(|p| p.r.target == x).collect();
    let healthy: Vec<_> = sim.probes.iter().filter(|p| p.r.target != x && p.r.prober != x).collect();
    let max = |f: fn(&ProbeRecord) -> i32| healthy.iter().map(|p| i64::from(f(&p.r))).max().unwrap_or(0);
    // What a probe adds besides the wait: its trip there and its normal reply delay.
    let slack = max(|r| r.network_rtt_ns) + max(|r| r.responder_delay_ns);
    // It arrives microseconds after it was sent; keep clear of the stall's edges by far more.
    let edge = MS;
    let mut stalled = 0;
    let mut worst: i64 = 0;
    for p in &to {
        let t = sim.t(p);
        let (Some(thaw), Some(thaw2)) = (st.thaw(t + edge), st.thaw(t - edge)) else {
            continue;
        };
        if thaw != thaw2 {
            continue;
        }
        assert_eq!(p.r.outcome, Outcome::Ok as u8, "{what}: a {} ms stall is inside the timeout", st.stall_ns / MS);
        let residual = i64::from(inflated(&p.r)) - (thaw - t);
        worst = worst.max(residual.abs());
        stalled += 1;
    }
    let want = st.count() as f64 * (st.stall_ns - 2 * edge) as f64 / 1e9 * to.len() as f64 / (s.duration_s as f64);
    println!(
        "{what}: {stalled} probes reached the host in a stall (~{want:.0} expected); delay - wait for the thaw: max |{worst}| ns, slack {slack} ns"
    );
    assert!((stalled as f64 - want).abs() <= 5.0 * want.sqrt(), "{stalled} probes in stalls, ~{want:.0} expected");
    assert!(worst <= slack, "{what}: a stalled reply's delay is off its wait by {worst} ns");
    // Outside the stalls, and in the other delay always, the host replies like any other.
    let clear = |p: &&&Probe| st.thaw(sim.t(p) - edge).is_none() && st.thaw(sim.t(p) + edge).is_none();
    let ok = |p: &&&Probe| p.r.outcome == Outcome::Ok as u8;
    let other: Vec<i64> = to.iter().filter(clear).filter(ok).map(|p| i64::from(inflated(&p.r))).collect();
    let inflated_q = if ts_source == "nic" { RESPONDER_US } else { RTT_US };
    check_quantiles(&format!("{what} probes to it outside stalls, inflatable delay"), &other, inflated_q, 0);
    let plain_q = if ts_source == "nic" { RTT_US } else { RESPONDER_US };
    let all: Vec<i64> = to.iter().filter(ok).map(|p| i64::from(plain(&p.r))).collect();
    check_quantiles(&format!("{what} probes to it, other delay"), &all, plain_q, 0);
    let rtt = rtts(healthy.iter().copied());
    check_quantiles(&format!("{what} network RTT of other pairs"), &rtt, RTT_US, 0);
    // The network is fine.
    let (k, n) = fails(sim.probes.iter().filter(|p| p.r.prober == x || p.r.target == x));
    check_rate(&format!("{what} its pairs' loss"), k, n, BACKGROUND, LEAK);
}

#[test]
fn host_stall() {
    check_host_stall("nic", |r| r.responder_delay_ns, |r| r.network_rtt_ns);
}

#[test]
fn host_stall_with_host_timestamps() {
    check_host_stall("host", |r| r.network_rtt_ns, |r| r.responder_delay_ns);
}

#[test]
fn agent_restart() {
    let (at, down) = (70.0, 2.0);
    let b = Base { duration_s: 180, rnics_per_host: 2, ..Base::default() };
    let s = scenario(&b, &fault("agent_restart", "tor2-h3", &format!("start_s = {at}")));
    let sim = run(&s);
    let refresh: f64 = 60.0;
    let back = (at / refresh).floor() * refresh + refresh;
    let host: Vec<u32> = (0..2).map(|k| sim.id(&format!("tor2-h3/rnic{k}"))).collect();
    let (at_ns, up_ns, back_ns) = ((at * 1e9) as i64, ((at + down) * 1e9) as i64, (back * 1e9) as i64);

    // Every other RNIC wrote one segment; each of the host's two: one per agent instance.
    let mut epochs: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for seg in &sim.segs {
        epochs.entry(seg.writer).or_default().push(seg.epoch);
    }
    for (&w, e) in &epochs {
        let want = if host.contains(&w) { 2 } else { 1 };
        assert_eq!(e.len(), want, "{} wrote {} segments", sim.names[w as usize], e.len());
    }
    let (old, new) = (epochs[&host[0]][0], epochs[&host[0]][1]);
    println!("agent_restart: epochs {old:#x} -> {new:#x}");
    assert_ne!(old, new, "a new agent instance has a new epoch");
    assert_eq!(epochs[&host[1]], vec![old, new], "both RNICs of the host belong to the same instances");
    for &r in &host {
        let own = sim.own(r);
        for p in &own {
            let seg = &sim.segs[p.seg];
            assert_eq!(p.r.seq >> 32, u64::from(seg.epoch), "probe seq carries its agent's epoch");
            let t = sim.t(p);
            assert!(
                if seg.epoch == old { t < at_ns } else { t >= up_ns },
                "t = {t} in the segment of epoch {:#x}",
                seg.epoch
            );
        }
        let first_back = own.iter().map(|p| sim.t(p)).filter(|&t| t >= at_ns).min().unwrap_or(i64::MAX);
        let interval = (1e9 / (f64::from(s.topology.hosts_per_tor * 2 - 1) * MESH_PPS)).ceil() as i64;
        println!(
            "agent_restart: {} sends again {} ms after the restart",
            sim.names[r as usize],
            (first_back - at_ns) / MS
        );
        assert!((up_ns..=up_ns + interval).contains(&first_back), "first probe after the restart at {first_back}");
        check_send_count(
            "agent_restart probes of the new instance",
            own.iter().filter(|p| sim.t(p) >= up_ns).count(),
            &s,
            (s.duration_s as i64) * NS - up_ns,
        );
    }

    // Peers keep addressing the old instance until their pinglists are refreshed.
    let to = |p: &&Probe| host.contains(&p.r.target);
    let stale: Vec<_> = sim.probes.iter().filter(to).filter(|p| during(sim.t(p), at, back)).collect();
    all_lost_with("agent_restart peers' probes until the refresh", &stale, Arrived::PROBE_SENT);
    let after: Vec<_> = sim.probes.iter().filter(to).filter(|p| sim.t(p) >= back_ns + SETTLE).collect();
    let (k, n) = fails(after.iter().copied());
    check_rate("agent_restart peers' probes after the refresh", k, n, BACKGROUND, LEAK);
    assert!(after.iter().filter(|p| !failed(p)).all(|p| p.r.responder_epoch == new), "answered by the new instance");
    let before: Vec<_> = sim.probes.iter().filter(to).filter(|p| sim.t(p) < at_ns - SETTLE).collect();
    assert!(before.iter().filter(|p| !failed(p)).all(|p| p.r.responder_epoch == old), "answered by the old instance");
    let (k, n) = fails(before.iter().copied());
    check_rate("agent_restart peers' probes before the restart", k, n, BACKGROUND, LEAK);
    // The new instance's probes to other hosts are fine at once (those between its own RNICs
    // go by the same stale pinglist as everyone's, and are in the lost set above).
    let (k, n) = fails(sim.probes.iter().filter(|p| host.contains(&p.r.prober) && !to(p) && sim.t(p) >= up_ns));
    check_rate("agent_restart the new instance's probes", k, n, BACKGROUND, LEAK);
    let (k, n) = fails(sim.probes.iter().filter(|p| !host.contains(&p.r.prober) && !host.contains(&p.r.target)));
    check_rate("agent_restart pairs not touching the host", k, n, BACKGROUND, LEAK);
}

#[test]
fn clock_step() {
    // The steps are placed inside a probe's flight, found in a run without them: the
    // simulator's draws do not depend on the clock, so that probe repeats in the stepped run
    // and straddles the step, the only way a step reaches a delay (each delay is taken in one
    // clock domain).
    let b = Base::default();
    let plain = run(&scenario(&b, ""));
    let name = "tor0-h2/rnic0";
    let x = plain.id(name);
    let base = plain.own(x);
    let straddle = |after_s: i64| -> (usize, i64) {
        let i = base
            .iter()
            .position(|p| plain.t(p) >= after_s * NS && p.r.outcome == Outcome::Ok as u8)
            .expect("a probe to straddle");
        let r = &base[i].r;
        let flight = i64::from(r.prober_delay_ns) + i64::from(r.network_rtt_ns) + i64::from(r.responder_delay_ns);
        (i, plain.t(&base[i]) + flight / 2)
    };
    let steps = [(straddle(60), -300 * MS), (straddle(100), 2500 * MS)];
    let mut faults = String::new();
    for &((i, at), step) in &steps {
        let start_s = at as f64 / 1e9;
        let lands = (start_s * 1e9) as i64;
        let t = plain.t(&base[i]);
        assert!(
            lands > t && lands < at * 2 - t,
            "step instant {lands} must fall inside the flight of the probe at {t}"
        );
        faults += &fault("clock_step", "tor0-h2", &format!("start_s = {start_s}\nstep_ms = {}", step / MS));
    }
    let s = scenario(&b, &faults);
    let sim = run(&s);
    assert_eq!(sim.id(name), x);

    // The step is the host's alone: every other agent wrote exactly what it wrote without it.
    let host_file = |sim: &Sim| sim.segs.iter().find(|g| g.writer == x).map(|g| g.file.clone()).expect("host segment");
    assert_eq!(host_file(&sim), host_file(&plain));
    for (f, bytes) in &plain.files {
        if *f != host_file(&plain) {
            assert!(sim.files.get(f) == Some(bytes), "{f} changed");
        }
    }
    // The host's T1s shift by the steps in force; its delays do not change, except for the
    // probes in flight at a step, which must come out Invalid, never as a negative or absurd Ok.
    let stepped = sim.own(x);
    assert_eq!(stepped.len(), base.len());
    let mut invalid = Vec::new();
    for (i, (a, p)) in base.iter().zip(&stepped).enumerate() {
        let t = plain.t(a);
        let shift: i64 = steps.iter().filter(|((_, at), _)| t >= *at).map(|(_, step)| step).sum();
        let moved = ProbeRecord { t1_unix_ns: (a.r.t1_unix_ns as i64 + shift) as u64, ..a.r };
        if steps.iter().any(|((j, _), _)| *j == i) {
            let want = ProbeRecord {
                outcome: Outcome::Invalid as u8,
                network_rtt_ns: 0,
                prober_delay_ns: 0,
                responder_delay_ns: 0,
                ..moved
            };
            assert_eq!(p.r, want, "probe {i} straddles a step");
            invalid.push(i);
        } else {
            assert_eq!(p.r, moved, "probe {i}, {shift} ns of steps in force");
        }
    }
    let drops: Vec<_> = stepped.windows(2).map(|w| w[1].r.t1_unix_ns as i64 - w[0].r.t1_unix_ns as i64).collect();
    let backwards: Vec<_> = drops.iter().enumerate().filter(|(_, d)| **d < 0).collect();
    println!(
        "clock_step: T1 goes backwards at {backwards:?}, largest forward jump {} ms; invalid probes {invalid:?}",
        drops.iter().max().unwrap_or(&0) / MS
    );
    assert_eq!(backwards.len(), 1, "the T1 sequence steps back once");
    assert!(*backwards[0].1 >= -300 * MS && *backwards[0].1 < -250 * MS, "back by the step less one send interval");
    assert!(*drops.iter().max().unwrap_or(&0) >= 2500 * MS, "forward by the second step");
    assert_eq!(
        sim.probes.iter().filter(|p| p.r.outcome == Outcome::Invalid as u8).count(),
        2,
        "only the straddlers are invalid"
    );
    for p in &sim.probes {
        if p.r.outcome == Outcome::Ok as u8 {
            let r = &p.r;
            let sane = (0..ABSURD_RTT_NS).contains(&i64::from(r.network_rtt_ns))
                && (0..ABSURD_DELAY_NS).contains(&i64::from(r.prober_delay_ns))
                && (0..ABSURD_DELAY_NS).contains(&i64::from(r.responder_delay_ns));
            assert!(sane, "an Ok probe with a negative or absurd delay: {r:?}");
        }
    }
}

#[test]
fn simulation_is_deterministic_across_thread_counts() {
    let faults = [
        fault("rnic_loss", "tor0-h1/rnic0", "start_s = 10\nloss = 0.1"),
        fault("link_flap", "tor2|spine1", "start_s = 20\nend_s = 100\nperiod_s = 15\ndown_s = 3"),
        fault("host_stall", "tor3-h2", "start_s = 5\nperiod_s = 7\nstall_ms = 300"),
        fault("agent_restart", "tor1-h0", "start_s = 50"),
        fault("clock_step", "tor1-h3", "start_s = 40\nstep_ms = -700"),
    ]
    .concat();
    let s = scenario(&Base { ts_source: "host", ..Base::default() }, &faults);
    let dirs: Vec<_> = [1, 2]
        .iter()
        .map(|&threads| {
            let dir = tempfile::tempdir().expect("tempdir");
            simulate_into(&s, dir.path(), threads);
            dir
        })
        .collect();
    let listing = |d: &Path| -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        out.insert("inventory.toml".into(), std::fs::read(d.join("inventory.toml")).expect("inventory"));
        for e in std::fs::read_dir(d.join("segments")).expect("segments") {
            let p = e.expect("entry").path();
            out.insert(
                p.file_name().and_then(|n| n.to_str()).expect("name").to_owned(),
                std::fs::read(&p).expect("read"),
            );
        }
        out
    };
    let (a, b) = (listing(dirs[0].path()), listing(dirs[1].path()));
    let rnics = s.topology.rnic_count() as usize;
    println!("determinism: {} files, {} bytes", a.len(), a.values().map(Vec::len).sum::<usize>());
    // One segment per RNIC, one more for the restarted host, plus the inventory.
    assert_eq!(a.len(), rnics + 2);
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "same file names");
    for (name, bytes) in &a {
        assert!(b[name] == *bytes, "{name} differs between 1 and 2 threads");
    }
}

// Simulator bugs found while writing these tests, kept as regression tests for their fixes.

#[test]
fn path_traces_are_stamped_on_the_agents_clock() {
    // A step at t = 0 is in force for the whole run: the agent's traces and probes share a clock.
    let s = scenario(&Base::default(), &fault("clock_step", "tor0-h2", "start_s = 0\nstep_ms = 5000"));
    let dir = tempfile::tempdir().expect("tempdir");
    simulate_into(&s, dir.path(), 1);
    for e in std::fs::read_dir(dir.path().join("segments")).expect("segments") {
        let r = SegmentReader::open(e.expect("entry").path()).unwrap_or_else(|e| panic!("{e}"));
        let first_probe = r.probe_chunks().next().map(|c| c.row(0).t1_unix_ns).expect("a probe");
        let trace = r.path_records().next().map(|p| p.t_unix_ns.to_native()).expect("a trace");
        let gap_ms = (first_probe as i64 - trace as i64) / MS;
        assert!(gap_ms.abs() < 1_000, "{}: traces {gap_ms} ms off its probes", r.identity().host);
    }
}

#[test]
fn fabrics_with_one_host_per_tor_simulate() {
    // Valid scenarios: one host per ToR leaves every RNIC without ToR-mesh peers.
    let s = scenario(&Base { hosts_per_tor: 1, ..Base::default() }, "");
    let dir = tempfile::tempdir().expect("tempdir");
    let sum = simulate_into(&s, dir.path(), 1);
    let want = 4.0 * f64::from(INTER_TORS) * INTER_PPS * s.duration_s as f64;
    assert!((sum.records as f64 - want).abs() <= 4.0, "{} records, the schedule says {want}", sum.records);
}
