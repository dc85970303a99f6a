//! The simulated fabric: RNICs, their ToRs and pinglists, ECMP paths, and the fault timelines
//! a scenario injects, as functions of simulated time.
//!
//! Everything here is immutable once built and shared by the simulator's threads; each RNIC's
//! probes are then a function of (scenario, RNIC), which is what makes the simulator both
//! deterministic and parallel.

use rocemesh_formats::scenario::{Entity, Fault, FaultKind, Scenario};

pub(crate) const NS: u64 = 1_000_000_000;
/// How long a restarted agent is away before its new instance answers.
pub(crate) const RESTART_DOWN_NS: u64 = 2 * NS;

/// SplitMix64's finaliser.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A hash of several parts, for deterministic choices that must not depend on iteration order.
pub(crate) fn hash(parts: &[u64]) -> u64 {
    parts.iter().fold(0x243F_6A88_85A3_08D3, |h, &p| mix(h ^ mix(p)))
}

/// What a fault does to an element while it is active.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Effect {
    Down,
    Loss(f64),
    SlowNs(u64),
}

/// One fault on one element: active inside `[start, end)`, and, if `period_ns` is set, only
/// during the first `on_ns` of each period (a flap's down time, a stall).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeline {
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) period_ns: u64,
    pub(crate) on_ns: u64,
    pub(crate) effect: Effect,
}

impl Timeline {
    fn active(&self, t: u64) -> bool {
        t >= self.start_ns
            && t < self.end_ns
            && (self.period_ns == 0 || (t - self.start_ns) % self.period_ns < self.on_ns)
    }

    /// End of the active phase containing `t` (only meaningful when `active(t)`).
    fn phase_end(&self, t: u64) -> u64 {
        let end = if self.period_ns == 0 { self.end_ns } else { t - (t - self.start_ns) % self.period_ns + self.on_ns };
        end.min(self.end_ns)
    }
}

/// Per-element fault state: drop probability and extra one-way delay at a time.
#[derive(Debug, Clone, Default)]
pub(crate) struct Element {
    timelines: Vec<Timeline>,
}

impl Element {
    /// (drop probability, extra delay ns) at `t`.
    #[inline]
    pub(crate) fn at(&self, t: u64) -> (f64, u64) {
        let mut pass = 1.0;
        let mut extra = 0;
        for tl in &self.timelines {
            if tl.active(t) {
                match tl.effect {
                    Effect::Down => pass = 0.0,
                    Effect::Loss(p) => pass *= 1.0 - p,
                    Effect::SlowNs(ns) => extra += ns,
                }
            }
        }
        (1.0 - pass, extra)
    }

    pub(crate) fn is_down(&self, t: u64) -> bool {
        self.timelines.iter().any(|tl| matches!(tl.effect, Effect::Down) && tl.active(t))
    }
}

/// What happens to a host: CPU stalls, agent restarts, wall-clock steps.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostState {
    stalls: Vec<Timeline>,
    /// Restart instants, ns of simulated time, ascending.
    pub(crate) restarts_ns: Vec<u64>,
    /// (instant, step) pairs, ascending by instant.
    steps: Vec<(u64, i64)>,
}

impl HostState {
    /// When a CPU that wants to run at `t` actually runs: at `t`, or at the end of the stall
    /// that contains `t` (stalls may chain).
    #[inline]
    pub(crate) fn unstall(&self, mut t: u64) -> u64 {
        loop {
            let Some(tl) = self.stalls.iter().find(|tl| tl.active(t)) else { return t };
            t = tl.phase_end(t);
        }
    }

    /// Whether the host's agent is not running at `t` (between a restart and its return).
    pub(crate) fn agent_down(&self, t: u64) -> bool {
        self.restarts_ns.iter().any(|&r| t >= r && t < r + RESTART_DOWN_NS)
    }

    /// Which agent instance runs at `t`: 0 before the first restart, 1 after it, ...
    pub(crate) fn incarnation(&self, t: u64) -> usize {
        self.restarts_ns.iter().filter(|&&r| t >= r).count()
    }

    /// The host's wall clock at true time `t`, as Unix ns.
    #[inline]
    pub(crate) fn clock(&self, start_unix_ns: u64, t: u64) -> u64 {
        let mut c = (start_unix_ns + t) as i64;
        for &(at, step) in &self.steps {
            if t >= at {
                c += step;
            }
        }
        c.max(1) as u64
    }
}

/// An inter-ToR target with its flow labels.
#[derive(Debug, Clone)]
pub(crate) struct InterTarget {
    pub(crate) rnic: u32,
    pub(crate) labels: Vec<u32>,
}

/// The fabric a scenario describes, with its pinglists and faults resolved to indexes.
#[derive(Debug)]
pub(crate) struct Fabric {
    pub(crate) scenario: Scenario,
    pub(crate) rnic_host: Vec<u32>,
    pub(crate) rnic_tor: Vec<u32>,
    pub(crate) rnic_names: Vec<String>,
    pub(crate) host_names: Vec<String>,
    pub(crate) tor_rnics: Vec<Vec<u32>>,
    pub(crate) inter: Vec<Vec<InterTarget>>,
    /// For each RNIC, the (prober, label) pairs that probe it inter-ToR: whose ACK paths it traces.
    pub(crate) inter_in: Vec<Vec<(u32, u32)>>,
    pub(crate) rnics: Vec<Element>,
    pub(crate) tors: Vec<Element>,
    pub(crate) spines: Vec<Element>,
    /// Index `tor * spines + spine`.
    pub(crate) links: Vec<Element>,
    pub(crate) hosts: Vec<HostState>,
}

/// A flow label for (prober, target, index): nonzero and 20 bits, as the agent requires.
pub(crate) fn flow_label(seed: u64, p: u32, t: u32, i: u32) -> u32 {
    1 + (hash(&[seed, 0xF10, u64::from(p), u64::from(t), u64::from(i)]) % 0xF_FFFE) as u32
}

impl Fabric {
    pub(crate) fn new(scenario: Scenario) -> Fabric {
        let t = scenario.topology.clone();
        let n_hosts = t.host_count();
        let k = t.rnics_per_host;
        let n = (n_hosts * k) as usize;
        let mut rnic_host = Vec::with_capacity(n);
        let mut rnic_tor = Vec::with_capacity(n);
        let mut rnic_names = Vec::with_capacity(n);
        let host_names: Vec<String> = (0..n_hosts).map(|h| t.host_name(h)).collect();
        let mut tor_rnics = vec![Vec::new(); t.tors as usize];
        for h in 0..n_hosts {
            for r in 0..k {
                let id = h * k + r;
                let tor = t.tor_of(h, r);
                rnic_host.push(h);
                rnic_tor.push(tor);
                rnic_names.push(format!("{}/rnic{r}", host_names[h as usize]));
                tor_rnics[tor as usize].push(id);
            }
        }
        let p = &scenario.probing;
        let mut inter = Vec::with_capacity(n);
        let mut inter_in = vec![Vec::new(); n];
        let others = t.tors.saturating_sub(1);
        for id in 0..n as u32 {
            let mut targets = Vec::new();
            if others > 0 {
                let tor = rnic_tor[id as usize];
                let base = hash(&[scenario.seed, 0x1A7, u64::from(id)]) % u64::from(others);
                let pos = tor_rnics[tor as usize].iter().position(|&x| x == id).unwrap_or(0) as u64;
                for i in 0..p.inter_tor_tors.min(others) {
                    let other = (tor + 1 + ((base + u64::from(i)) % u64::from(others)) as u32) % t.tors;
                    let members = &tor_rnics[other as usize];
                    // Pingmesh's rule (server i of x probes server i of y), shifted per pair so
                    // that small ToRs are not always probed at the same RNIC.
                    let shift = hash(&[scenario.seed, 0x5F7, u64::from(id), u64::from(other)]) % 4;
                    let target = members[((pos + shift) % members.len() as u64) as usize];
                    let labels: Vec<u32> =
                        (0..p.flow_labels).map(|l| flow_label(scenario.seed, id, target, l)).collect();
                    for &l in &labels {
                        inter_in[target as usize].push((id, l));
                    }
                    targets.push(InterTarget { rnic: target, labels });
                }
            }
            inter.push(targets);
        }
        let mut fabric = Fabric {
            rnic_host,
            rnic_tor,
            rnic_names,
            host_names,
            tor_rnics,
            inter,
            inter_in,
            rnics: vec![Element::default(); n],
            tors: vec![Element::default(); t.tors as usize],
            spines: vec![Element::default(); t.spines as usize],
            links: vec![Element::default(); (t.tors * t.spines) as usize],
            hosts: vec![HostState::default(); n_hosts as usize],
            scenario,
        };
        for f in fabric.scenario.faults.clone() {
            fabric.inject(&f);
        }
        for h in &mut fabric.hosts {
            h.restarts_ns.sort_unstable();
            h.steps.sort_unstable();
        }
        fabric
    }

    fn inject(&mut self, f: &Fault) {
        let s = &self.scenario;
        let start_ns = (f.start_s * 1e9) as u64;
        let end_ns = (f.end_or(s.duration_s) * 1e9) as u64;
        let secs = |v: Option<f64>| (v.unwrap_or(0.0) * 1e9) as u64;
        let tl = |effect, period_ns, on_ns| Timeline { start_ns, end_ns, period_ns, on_ns, effect };
        let entity = s.topology.entity(&f.target).expect("validated when the scenario was loaded");
        let k = s.topology.rnics_per_host;
        let spines = s.topology.spines;
        let timeline = match f.kind {
            FaultKind::RnicDown | FaultKind::TorDown => tl(Effect::Down, 0, 0),
            FaultKind::RnicLoss | FaultKind::TorLoss | FaultKind::LinkLoss | FaultKind::SpineLoss => {
                tl(Effect::Loss(f.loss.unwrap_or(0.0)), 0, 0)
            }
            FaultKind::RnicFlap | FaultKind::LinkFlap => tl(Effect::Down, secs(f.period_s), secs(f.down_s)),
            // The extra is on the round trip; each crossing of the element adds half.
            FaultKind::RnicSlow | FaultKind::LinkSlow => {
                tl(Effect::SlowNs((f.extra_rtt_us.unwrap_or(0.0) * 500.0) as u64), 0, 0)
            }
            FaultKind::HostStall => {
                let Entity::Host(h) = entity else { return };
                let stall = tl(Effect::Down, secs(f.period_s), (f.stall_ms.unwrap_or(0.0) * 1e6) as u64);
                self.hosts[h as usize].stalls.push(stall);
                return;
            }
            FaultKind::AgentRestart => {
                let Entity::Host(h) = entity else { return };
                self.hosts[h as usize].restarts_ns.push(start_ns);
                return;
            }
            FaultKind::ClockStep => {
                let Entity::Host(h) = entity else { return };
                self.hosts[h as usize].steps.push((start_ns, (f.step_ms.unwrap_or(0.0) * 1e6) as i64));
                return;
            }
        };
        let element = match entity {
            Entity::Rnic { host, rnic } => &mut self.rnics[(host * k + rnic) as usize],
            Entity::Tor(t) => &mut self.tors[t as usize],
            Entity::Spine(sp) => &mut self.spines[sp as usize],
            Entity::Link { tor, spine } => &mut self.links[(tor * spines + spine) as usize],
            Entity::Host(_) => return,
        };
        element.timelines.push(timeline);
    }

    pub(crate) fn rnic_count(&self) -> usize {
        self.rnic_host.len()
    }

    /// The spine ECMP picks for a packet from `src` to `dst` with `label`. The hash is not
    /// symmetric, so a probe and its ACKs usually cross different spines.
    #[inline]
    pub(crate) fn spine_of(&self, src: u32, dst: u32, label: u32) -> u32 {
        (hash(&[self.scenario.seed, 0xEC, u64::from(src), u64::from(dst), u64::from(label)])
            % u64::from(self.scenario.topology.spines)) as u32
    }

    /// (drop probability, extra delay) of one packet from `src` to `dst` with `label` at `t`:
    /// both RNICs, the ToRs, and for inter-ToR packets the two links and the spine on the way.
    #[inline]
    pub(crate) fn one_way(&self, src: u32, dst: u32, label: u32, t: u64) -> (f64, u64) {
        let (ts, td) = (self.rnic_tor[src as usize], self.rnic_tor[dst as usize]);
        let mut pass = 1.0 - self.scenario.normal.loss;
        let mut extra = 0;
        let mut add = |e: &Element| {
            let (p, x) = e.at(t);
            pass *= 1.0 - p;
            extra += x;
        };
        add(&self.rnics[src as usize]);
        add(&self.tors[ts as usize]);
        if ts != td {
            let sp = self.spine_of(src, dst, label);
            let spines = self.scenario.topology.spines;
            add(&self.links[(ts * spines + sp) as usize]);
            add(&self.spines[sp as usize]);
            add(&self.links[(td * spines + sp) as usize]);
            add(&self.tors[td as usize]);
        }
        add(&self.rnics[dst as usize]);
        (1.0 - pass, extra)
    }

    /// Whether peers probing `host`'s RNICs at `t` still address an agent instance that is
    /// gone: from a restart until the next pinglist refresh after it.
    pub(crate) fn stale_target(&self, host: u32, t: u64) -> bool {
        let refresh = self.scenario.probing.pinglist_refresh_s * NS;
        self.hosts[host as usize].restarts_ns.iter().any(|&r| t >= r && t < (r / refresh + 1) * refresh)
    }

    /// The agent epoch of `host`'s incarnation `i` (nonzero, as the agent's are).
    pub(crate) fn epoch(&self, host: u32, incarnation: usize) -> u32 {
        (hash(&[self.scenario.seed, 0xE90C, u64::from(host), incarnation as u64]) as u32) | 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_timelines_are_active_in_the_first_part_of_each_period() {
        let tl = Timeline { start_ns: 10, end_ns: 100, period_ns: 20, on_ns: 5, effect: Effect::Down };
        let active: Vec<u64> = (0..110).filter(|&t| tl.active(t)).collect();
        let want: Vec<u64> = (10..100).filter(|t| (t - 10) % 20 < 5).collect();
        assert_eq!(active, want);
        assert_eq!(tl.phase_end(32), 35);
        assert_eq!(tl.phase_end(92), 95);
    }

    #[test]
    fn a_stall_releases_at_its_end() {
        let h = HostState {
            stalls: vec![Timeline { start_ns: 0, end_ns: 1_000, period_ns: 100, on_ns: 30, effect: Effect::Down }],
            ..HostState::default()
        };
        assert_eq!(h.unstall(5), 30);
        assert_eq!(h.unstall(30), 30);
        assert_eq!(h.unstall(150), 150);
        assert_eq!(h.unstall(1_010), 1_010);
    }
}
