//! Fault localisation (`../shared/reference/localisation.md`): which RNIC, ToR, link or spine
//! is at fault, window by window, and which hosts were too noisy to be evidence.
//!
//! The evidence is counts against thresholds, not quantiles, so it is gathered in one pass over
//! the probe columns into per (window, prober, target, label) counters; everything after that
//! works on those counters (thousands of entries, not millions of records).
//!
//! Steps, per wall-clock window:
//! 0. Classify probes (lost = no ACK1; a missing ACK2 alone is not loss), and exclude evidence
//!    that is not about the network: probes from or to a host that was stalling (its own send
//!    times show gaps, or its host delays blow up), probes to an RNIC whose agent was not
//!    running, and probes to a restarted agent until that prober hears from the new instance.
//! 1. Voting over every element a probe's packets cross: both RNICs and their ToRs (ToR-mesh and
//!    inter-ToR probes alike), and for inter-ToR probes the links and spines of the traced
//!    forward and ACK paths. A greedy cover picks the element with the worst bad ratio, and
//!    among the nearly-as-bad the most specific one that explains nearly as much: so a dead ToR
//!    beats its RNICs, a dead RNIC beats its ToR, a spine beats its links and a link its spine.
//!    A two-RNIC ToR is decided by the same rule: a dead RNIC also fails toward every other
//!    ToR, its healthy peer does not. What the pick explains is removed and the round repeats;
//!    once for loss, once for slowness.
//! 2. Hysteresis: a finding holds from its first bad window until `close_after_quiet_windows`
//!    quiet windows pass, so a flap is one finding with a flap count.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use rocemesh_formats::record::{Arrived, Outcome};
use serde::Serialize;

use crate::ingest::Dataset;

/// Tunables. The defaults are starting points from the reference notes, checked against the
/// generated scenario suite (see testbeds), not fitted to the public examples.
#[derive(Debug, Clone)]
pub struct Options {
    /// Window length, seconds.
    pub window_s: u64,
    /// Quiet windows after which a finding closes.
    pub close_after_quiet_windows: u64,
    /// An element is blamed for loss with at least this many lost probes crossing it...
    pub lost_min: u32,
    /// ...and at least this share of the probes crossing it lost.
    pub loss_ratio_min: f64,
    /// An element is blamed for slowness when at least this share of its ok probes is slow.
    pub slow_ratio_min: f64,
    /// A probe is slow above `slow_factor` x the fleet's median RTT plus `slow_margin_ns`.
    pub slow_factor: f64,
    /// See `slow_factor`.
    pub slow_margin_ns: f64,
    /// A host delay above this is a stalled host, not a network delay (ns); raised to
    /// [`HOST_NOISE_OVER_FLEET_P99`] times the fleet's p99 host delay where that is higher.
    pub host_delay_noise_ns: i64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            window_s: 30,
            close_after_quiet_windows: 3,
            lost_min: 3,
            loss_ratio_min: 0.01,
            slow_ratio_min: 0.2,
            slow_factor: 3.0,
            slow_margin_ns: 30_000.0,
            host_delay_noise_ns: 1_000_000,
        }
    }
}

/// A host delay this many times the fleet's p99 is a stall whatever the absolute threshold says.
pub const HOST_NOISE_OVER_FLEET_P99: i64 = 10;

/// One finding, in the JSON shape of `../shared/scenarios/README.md` plus evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// rnic, tor, link, spine, host, or ambiguous (two candidates nothing separates).
    pub kind: String,
    /// Entity name (inventory names; links `tor|spine`).
    pub entity: String,
    /// Wall-clock ns of the start of the first window in which it held.
    pub start_ns: u64,
    /// End of the last window in which it held; `None` = still holding at the end of the data.
    pub end_ns: Option<u64>,
    /// Windows in which it held.
    pub windows: u64,
    /// Separate bad spells inside the finding (1 = no flapping).
    pub flaps: u64,
    /// Strongest per-window score (share of the evidence that was bad), 0-1.
    pub score: f64,
    /// Why, from the worst window.
    pub evidence: String,
}

/// What localisation saw and concluded.
#[derive(Debug, Clone, Serialize)]
pub struct Localization {
    /// Findings, network first, then by start.
    pub findings: Vec<Finding>,
    /// Windows analysed.
    pub windows: u64,
    /// Probe records looked at.
    pub records: u64,
    /// The fleet's median network RTT, ns, and the per-probe slowness threshold derived from it.
    pub rtt_ns_p50: f64,
    /// See `rtt_ns_p50`.
    pub slow_threshold_ns: f64,
    /// Inter-ToR probes that could not vote because no path trace covered them.
    pub inter_tor_without_path: u64,
}

/// Counters of one (window, prober, target, label).
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    /// ok + lost (what loss is measured over; invalid and refused excluded).
    valid: u32,
    lost: u32,
    ok: u32,
    slow: u32,
}

impl Acc {
    fn add(&mut self, o: &Acc) {
        self.valid += o.valid;
        self.lost += o.lost;
        self.ok += o.ok;
        self.slow += o.slow;
    }
}

/// What a cover round counts as bad.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Lossy,
    Slow,
}

type Key = (u32, u32, u32, u32); // window, prober, target, label

/// Runs localisation over a dataset (probe columns still in place).
pub fn localize(ds: &Dataset, opts: &Options) -> Localization {
    let window_ns = opts.window_s.max(1) * 1_000_000_000;
    let p = &ds.probes;
    let n = p.len();
    let win = |t: u64| (t / window_ns) as u32;

    // The fleet's usual RTT and host delays, from one strided sample of ok probes. Host noise
    // is judged against the fleet's own host delays: a fleet whose healthy hosts take
    // milliseconds to turn a probe around (soft-RoCE, a VM) must not be all "noisy".
    let (mut sample, mut hd): (Vec<i32>, Vec<i32>) = (0..n)
        .step_by((n / 200_000).max(1))
        .filter(|&i| p.outcome[i] == Outcome::Ok as u8)
        .map(|i| (p.network_rtt_ns[i], p.prober_delay_ns[i].max(p.responder_delay_ns[i])))
        .unzip();
    let rtt_p50 = if sample.is_empty() {
        0.0
    } else {
        let mid = sample.len() / 2;
        f64::from(*sample.select_nth_unstable(mid).1)
    };
    let slow_ns = rtt_p50 * opts.slow_factor + opts.slow_margin_ns;
    let host_delay_p99 = if hd.is_empty() {
        0
    } else {
        let k = (hd.len() * 99 / 100).min(hd.len() - 1);
        i64::from(*hd.select_nth_unstable(k).1)
    };
    let noise_ns = opts.host_delay_noise_ns.max(host_delay_p99.saturating_mul(HOST_NOISE_OVER_FLEET_P99));

    // Hosts by index, so that per-key checks do not compare strings.
    let rnics = ds.rnics.len();
    let mut host_ids: HashMap<&str, u32> = HashMap::new();
    let host_of: Vec<u32> = ds
        .rnics
        .iter()
        .map(|r| {
            let next = host_ids.len() as u32;
            *host_ids.entry(r.host.as_str()).or_insert(next)
        })
        .collect();
    let mut host_names = vec![String::new(); host_ids.len()];
    for (name, &id) in &host_ids {
        host_names[id as usize] = (*name).to_owned();
    }
    // Agents: coverage per RNIC, restarts.
    let mut covered: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); rnics];
    let mut noisy: BTreeMap<(u32, u32), String> = BTreeMap::new();
    let mut files_by_rnic: Vec<Vec<usize>> = vec![Vec::new(); rnics];
    for (i, a) in ds.agents.iter().enumerate() {
        if (a.rnic as usize) < rnics && a.records > 0 {
            files_by_rnic[a.rnic as usize].push(i);
            for w in win(a.first_ns)..=win(a.last_ns) {
                covered[a.rnic as usize].insert(w);
            }
            for &(t, gap) in &a.long_gaps {
                let host = host_of[a.rnic as usize];
                for w in win(t)..=win(t + gap) {
                    noisy.entry((host, w)).or_insert_with(|| {
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
    }
    // Restarts: (target, down_from, back_at).
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

    // One pass: counters, host-delay noise, and when each prober first heard a restarted target.
    let mut acc: HashMap<Key, Acc> = HashMap::new();
    let mut pd_noise: HashMap<(u32, u32), u32> = HashMap::new();
    let mut rd_noise: HashMap<(u32, u32), u32> = HashMap::new();
    let mut heard_again: HashMap<(u32, u32, u64), u64> = HashMap::new();
    let mut inter_keys: HashSet<Key> = HashSet::new();
    let mut windows = BTreeSet::new();
    for i in 0..n {
        let (pr, tg) = (p.prober[i], p.target[i]);
        if pr as usize >= rnics || tg as usize >= rnics {
            continue;
        }
        let w = win(p.t1_unix_ns[i]);
        windows.insert(w);
        let outcome = p.outcome[i];
        let mut a = Acc::default();
        if outcome == Outcome::Ok as u8 {
            a.ok = 1;
            a.valid = 1;
            a.slow = u32::from(f64::from(p.network_rtt_ns[i]) > slow_ns);
            if i64::from(p.prober_delay_ns[i]) > noise_ns {
                *pd_noise.entry((pr, w)).or_default() += 1;
            }
            if i64::from(p.responder_delay_ns[i]) > noise_ns {
                *rd_noise.entry((tg, w)).or_default() += 1;
            }
            if let Some(list) = restarts.get(&tg) {
                for &(_, back) in list {
                    if p.t1_unix_ns[i] >= back {
                        let e = heard_again.entry((pr, tg, back)).or_insert(u64::MAX);
                        *e = (*e).min(p.t1_unix_ns[i]);
                    }
                }
            }
        } else if outcome == Outcome::Lost as u8 {
            a.valid = 1;
            // Only ACK2 missing proves the forward path and the responder alive: not loss.
            a.lost = u32::from(p.arrived[i] & Arrived::ACK1 == 0);
        } else {
            continue;
        }
        let key = (w, pr, tg, p.flow_label[i]);
        if p.kind[i] == 1 {
            inter_keys.insert(key);
        }
        acc.entry(key).or_default().add(&a);
    }
    let noise_ms = noise_ns as f64 / 1e6;
    for (&(rnic, w), &count) in pd_noise.iter() {
        if count >= 3 {
            let r = &ds.rnics[rnic as usize];
            noisy
                .entry((host_of[rnic as usize], w))
                .or_insert_with(|| format!("{}: {count} probes with prober delay > {noise_ms} ms", r.name));
        }
    }
    for (&(rnic, w), &count) in rd_noise.iter() {
        if count >= 3 {
            let r = &ds.rnics[rnic as usize];
            noisy
                .entry((host_of[rnic as usize], w))
                .or_insert_with(|| format!("{}: answered {count} probes > {noise_ms} ms late", r.name));
        }
    }

    // Step 0 exclusions.
    let excluded = |w: u32, pr: u32, tg: u32| -> bool {
        if noisy.contains_key(&(host_of[pr as usize], w)) || noisy.contains_key(&(host_of[tg as usize], w)) {
            return true;
        }
        if !covered[tg as usize].contains(&w) {
            return true;
        }
        if let Some(list) = restarts.get(&tg) {
            for &(down, back) in list {
                let heard = heard_again.get(&(pr, tg, back)).copied().unwrap_or(u64::MAX);
                let (lo, hi) = (u64::from(w) * window_ns, (u64::from(w) + 1) * window_ns);
                if down < hi && heard >= lo {
                    return true;
                }
            }
        }
        false
    };

    // Elements a probe's packets cross: both RNICs and ToRs always; for inter-ToR probes, the
    // links and spines of the traced forward and ACK paths.
    let mut element_names: Vec<(&'static str, String)> = Vec::new();
    let mut element_ids: HashMap<(&'static str, String), u32> = HashMap::new();
    let mut intern = |kind: &'static str, name: &str| -> u32 {
        let next = element_names.len() as u32;
        *element_ids.entry((kind, name.to_owned())).or_insert_with(|| {
            element_names.push((kind, name.to_owned()));
            next
        })
    };
    let rnic_element: Vec<u32> = ds.rnics.iter().map(|r| intern("rnic", &r.name)).collect();
    let tor_element: Vec<u32> = ds.rnics.iter().map(|r| intern("tor", &r.tor)).collect();
    let mut path_cache: HashMap<(u32, u32, u32), Option<Vec<u32>>> = HashMap::new();
    let mut by_window: BTreeMap<u32, Vec<Group>> = BTreeMap::new();
    let mut without_path = 0u64;
    for (&key, a) in &acc {
        let (w, pr, tg, label) = key;
        if excluded(w, pr, tg) {
            continue;
        }
        let mut elements = vec![rnic_element[pr as usize], rnic_element[tg as usize], tor_element[pr as usize]];
        if tor_element[tg as usize] != tor_element[pr as usize] {
            elements.push(tor_element[tg as usize]);
        }
        if inter_keys.contains(&key) {
            let fabric = path_cache.entry((pr, tg, label)).or_insert_with(|| {
                let traced = ds.paths.get(&(pr, tg, label)).zip(ds.paths.get(&(tg, pr, label)));
                let (fwd, rev) = match traced {
                    Some(t) => t,
                    None => {
                        let (ta, tb) = (&ds.rnics[pr as usize].tor, &ds.rnics[tg as usize].tor);
                        (ds.tor_paths.get(&(ta.clone(), tb.clone()))?, ds.tor_paths.get(&(tb.clone(), ta.clone()))?)
                    }
                };
                let mut v = Vec::new();
                for hops in [fwd, rev] {
                    for (kind, name) in path_elements(&ds.switches, hops) {
                        let id = intern(kind, &name);
                        if !v.contains(&id) {
                            v.push(id);
                        }
                    }
                }
                Some(v)
            });
            match fabric {
                Some(v) => elements.extend(v.iter().copied()),
                None => without_path += u64::from(a.valid),
            }
        }
        by_window.entry(w).or_default().push(Group { elements, acc: *a });
    }

    let mut held: BTreeMap<(String, String), BTreeMap<u32, (f64, String)>> = BTreeMap::new();
    let mut hold = |kind: &str, entity: &str, w: u32, score: f64, evidence: String| {
        let e = held.entry((kind.to_owned(), entity.to_owned())).or_default();
        let slot = e.entry(w).or_insert((score, evidence.clone()));
        if score > slot.0 {
            *slot = (score, evidence);
        }
    };
    for ((host, w), why) in &noisy {
        hold("host", &host_names[*host as usize], *w, 1.0, why.clone());
    }
    let mut tor_rnic_elements: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (i, &t) in tor_element.iter().enumerate() {
        tor_rnic_elements.entry(t).or_default().push(rnic_element[i]);
    }
    for (&w, groups) in &by_window {
        let mut explained = vec![false; groups.len()];
        for (mode, how) in [(Mode::Lossy, "lost"), (Mode::Slow, "slow")] {
            let mut picks = cover(groups, &mut explained, mode, element_names.len(), opts);
            // Every RNIC of a ToR picked (a lossy two-RNIC ToR can read so): that is the ToR.
            for (tor, members) in &tor_rnic_elements {
                if members.len() >= 2 && members.iter().all(|m| picks.iter().any(|p| p.0 == *m)) {
                    let parts: Vec<(u32, f64, u32, u32)> =
                        picks.iter().filter(|p| members.contains(&p.0)).copied().collect();
                    picks.retain(|p| !members.contains(&p.0));
                    let (bad, total) = parts.iter().fold((0, 0), |a, p| (a.0 + p.2, a.1 + p.3));
                    let ratio = f64::from(bad) / f64::from(total.max(1));
                    picks.push((*tor, ratio, bad, total));
                }
            }
            for (e, ratio, bad, total) in picks {
                let (kind, name) = &element_names[e as usize];
                let ev = format!("{name}: {bad}/{total} probes crossing it {how} ({:.1}%)", ratio * 100.0);
                hold(kind, name, w, ratio, ev);
            }
        }
    }

    // Hysteresis.
    let last_window = windows.iter().next_back().copied();
    let mut findings = Vec::new();
    for ((kind, entity), ws) in held {
        let mut runs: Vec<Vec<(u32, f64, String)>> = Vec::new();
        for (w, (score, ev)) in ws {
            match runs.last_mut() {
                Some(run) if u64::from(w - run.last().map_or(w, |r| r.0)) <= opts.close_after_quiet_windows + 1 => {
                    run.push((w, score, ev))
                }
                _ => runs.push(vec![(w, score, ev)]),
            }
        }
        for run in runs {
            let first = run[0].0;
            let last = run[run.len() - 1].0;
            let flaps = 1 + run.windows(2).filter(|p| p[1].0 > p[0].0 + 1).count() as u64;
            let (score, evidence) =
                run.iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|r| (r.1, r.2.clone())).unwrap_or_default();
            findings.push(Finding {
                kind: kind.clone(),
                entity: entity.clone(),
                start_ns: u64::from(first) * window_ns,
                end_ns: (Some(last) != last_window).then_some((u64::from(last) + 1) * window_ns),
                windows: run.len() as u64,
                flaps,
                score,
                evidence,
            });
        }
    }
    let order = |k: &str| match k {
        "rnic" | "tor" | "link" | "spine" => 0,
        "ambiguous" => 1,
        _ => 2,
    };
    findings.sort_by(|a, b| (order(&a.kind), a.start_ns, &a.entity).cmp(&(order(&b.kind), b.start_ns, &b.entity)));
    Localization {
        findings,
        windows: windows.len() as u64,
        records: n as u64,
        rtt_ns_p50: rtt_p50,
        slow_threshold_ns: slow_ns,
        inter_tor_without_path: without_path,
    }
}

/// Links and devices along a traced switch path. The ends of a path are its ToRs and the hops
/// between them the fabric's upper tiers (spines); a link is named lower tier first,
/// `tor|spine`, as in the inventory and the scenarios.
fn path_elements(switches: &[String], hops: &[u32]) -> Vec<(&'static str, String)> {
    let names: Vec<&str> = hops.iter().filter_map(|&h| switches.get(h as usize).map(String::as_str)).collect();
    let mut out = Vec::new();
    if names.len() < 2 {
        return out;
    }
    let half = names.len() / 2;
    for (i, pair) in names.windows(2).enumerate() {
        // Before the middle the path climbs (lower tier first); after it, it descends.
        let link = if i < half { format!("{}|{}", pair[0], pair[1]) } else { format!("{}|{}", pair[1], pair[0]) };
        out.push(("link", link));
    }
    for n in &names[1..names.len() - 1] {
        out.push(("spine", (*n).to_owned()));
    }
    out
}

/// Probes of one (window, prober, target, label), and the elements their packets cross.
struct Group {
    elements: Vec<u32>,
    acc: Acc,
}

/// Greedy cover of the bad probes by elements: (element, ratio, bad, total) in pick order.
///
/// Each round tallies, per element, the bad and all probes crossing it (probes not yet
/// explained), takes the elements whose bad ratio is near the worst, and among them the most
/// specific one that still explains nearly as much as any: a dead ToR beats its RNICs (it
/// explains more), a dead RNIC beats its ToR (same bad probes, higher ratio), a spine beats its
/// links, a link beats its spine. The probes it explains are removed and the round repeats.
fn cover(
    groups: &[Group],
    explained: &mut [bool],
    mode: Mode,
    elements: usize,
    opts: &Options,
) -> Vec<(u32, f64, u32, u32)> {
    let count = |a: &Acc| match mode {
        Mode::Slow => (a.slow, a.ok),
        Mode::Lossy => (a.lost, a.valid),
    };
    let (min_bad, min_ratio) = match mode {
        Mode::Slow => (opts.lost_min, opts.slow_ratio_min),
        Mode::Lossy => (opts.lost_min, opts.loss_ratio_min),
    };
    let mut picked = Vec::new();
    let mut tally: Vec<(u32, u32)> = vec![(0, 0); elements];
    loop {
        tally.iter_mut().for_each(|t| *t = (0, 0));
        for (g, group) in groups.iter().enumerate() {
            if explained[g] {
                continue;
            }
            let (bad, total) = count(&group.acc);
            for &e in &group.elements {
                tally[e as usize].0 += bad;
                tally[e as usize].1 += total;
            }
        }
        let candidates: Vec<(u32, f64, u32, u32)> = tally
            .iter()
            .enumerate()
            .filter(|(_, (bad, total))| {
                *bad >= min_bad && *total > 0 && f64::from(*bad) >= min_ratio * f64::from(*total)
            })
            .map(|(e, &(bad, total))| (e as u32, f64::from(bad) / f64::from(total), bad, total))
            .collect();
        let Some(max_ratio) = candidates.iter().map(|c| c.1).max_by(f64::total_cmp) else { break };
        let near: Vec<&(u32, f64, u32, u32)> = candidates.iter().filter(|c| c.1 >= 0.8 * max_ratio).collect();
        let most = near.iter().map(|c| c.2).max().unwrap_or(0);
        let Some(&&best) = near
            .iter()
            .filter(|c| f64::from(c.2) >= 0.9 * f64::from(most))
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
        else {
            break;
        };
        for (g, group) in groups.iter().enumerate() {
            if group.elements.contains(&best.0) {
                explained[g] = true;
            }
        }
        picked.push(best);
    }
    prune(groups, picked, &count, opts)
}

/// Drops picks that the other picks explain. A probe crossing a lossy ToR and a lossy spine is
/// lossier than either, so its link can look worst of all and be picked first; it is kept only
/// if its probes fail clearly more than the other picks predict (each other pick's ratio
/// measured on probes that avoid the candidate, combined as independent drops).
fn prune(
    groups: &[Group],
    mut picked: Vec<(u32, f64, u32, u32)>,
    count: &dyn Fn(&Acc) -> (u32, u32),
    opts: &Options,
) -> Vec<(u32, f64, u32, u32)> {
    // Most specific first: the fewest probes.
    let mut order: Vec<u32> = picked.iter().map(|p| p.0).collect();
    order.sort_by_key(|e| picked.iter().find(|p| p.0 == *e).map_or(0, |p| p.3));
    for e in order {
        if picked.len() < 2 {
            break;
        }
        let others: Vec<u32> = picked.iter().map(|p| p.0).filter(|&o| o != e).collect();
        let ratio_without = |f: u32| {
            let (mut bad, mut total) = (0u64, 0u64);
            for g in groups.iter().filter(|g| g.elements.contains(&f) && !g.elements.contains(&e)) {
                let (b, t) = count(&g.acc);
                bad += u64::from(b);
                total += u64::from(t);
            }
            if total == 0 { 0.0 } else { bad as f64 / total as f64 }
        };
        let rates: Vec<(u32, f64)> = others.iter().map(|&f| (f, ratio_without(f))).collect();
        let (mut observed, mut expected) = (0.0, 0.0);
        for g in groups.iter().filter(|g| g.elements.contains(&e)) {
            let (b, t) = count(&g.acc);
            let pass: f64 = rates.iter().filter(|(f, _)| g.elements.contains(f)).map(|(_, r)| 1.0 - r).product();
            observed += f64::from(b);
            expected += (1.0 - pass) * f64::from(t);
        }
        if observed <= expected * 1.3 + f64::from(opts.lost_min) {
            picked.retain(|p| p.0 != e);
        }
    }
    picked
}

/// A readable table of findings with their evidence.
pub fn render_table(l: &Localization) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} findings over {} windows, {} records (fleet RTT p50 {:.1} us; a probe is slow above {:.1} us)",
        l.findings.len(),
        l.windows,
        l.records,
        l.rtt_ns_p50 / 1e3,
        l.slow_threshold_ns / 1e3
    );
    if l.inter_tor_without_path > 0 {
        let _ =
            writeln!(s, "{} inter-ToR probes had no path trace and could not vote on links", l.inter_tor_without_path);
    }
    let _ = writeln!(
        s,
        "{:<9} {:<24} {:<20} {:<20} {:>4} {:>5} evidence",
        "kind", "entity", "from (UTC)", "to (UTC)", "win", "flaps"
    );
    for f in &l.findings {
        let to = f.end_ns.map_or_else(|| "still holding".to_owned(), crate::inspect::utc);
        let _ = writeln!(
            s,
            "{:<9} {:<24} {:<20} {:<20} {:>4} {:>5} {}",
            f.kind,
            f.entity,
            crate::inspect::utc(f.start_ns),
            to,
            f.windows,
            f.flaps,
            f.evidence
        );
    }
    s
}
