//! Random scenarios for the accuracy suite: topologies of 2 to 64 RNICs per ToR (plain and
//! rail-optimised), every fault kind, overlapping faults, ToR- and NIC-timestamp models, half
//! the faults faint (issue 17: 0.1-1% loss, extra RTT of 2-10x the fleet's p99, 1-2 s flaps).
//!
//! The generator avoids only what no prober could tell apart, and says why at each rule: a
//! fault inside another fault's blast radius (an RNIC under a dead ToR), and link or spine
//! faults in fabrics too small for inter-ToR probes to separate a link from its spine.

use rocemesh_formats::scenario::{Fault, FaultKind, Normal, Probing, Quantiles, Scenario, Topology, TsModel, VERSION};

use crate::simulate::Rng;

/// Generates suite scenario `index` for `seed`. `index` also picks the fault kinds, so that a
/// suite of `FaultKind::ALL.len()` consecutive scenarios contains every kind.
pub fn generate(seed: u64, index: u64) -> Scenario {
    let mut rng = Rng::new(crate::fabric::hash(&[seed, 0x5017E, index]));
    let mut pick = |n: u64| (rng.next_u64() % n.max(1)) as u32;
    let primary = FaultKind::ALL[(index % FaultKind::ALL.len() as u64) as usize];
    let needs_fabric =
        matches!(primary, FaultKind::LinkLoss | FaultKind::LinkFlap | FaultKind::LinkSlow | FaultKind::SpineLoss);
    let rail = pick(5) == 0;
    let topology = if rail {
        let rails = [2u32, 4, 8][pick(3) as usize];
        let rails = if needs_fabric { rails.max(4) } else { rails };
        Topology {
            spines: 2 + pick(3),
            tors: rails,
            hosts_per_tor: 2 + pick(23),
            rnics_per_host: rails,
            rail_optimised: true,
        }
    } else {
        let per_tor = [2u32, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64][pick(11) as usize];
        let max_tors = (256 / per_tor).clamp(2, 6);
        let min_tors = if needs_fabric { 4 } else { 2 };
        let tors = min_tors + pick(u64::from(max_tors.max(min_tors) - min_tors + 1));
        Topology { spines: 2 + pick(3), tors, hosts_per_tor: per_tor, rnics_per_host: 1, rail_optimised: false }
    };
    let per_tor =
        if topology.rail_optimised { topology.hosts_per_tor } else { topology.hosts_per_tor * topology.rnics_per_host };
    let mesh_peers = per_tor.saturating_sub(1).max(1);
    // Large ToRs probe each peer less often, as deployments do, to bound probes per RNIC.
    let tor_mesh_pps = (100.0 / f64::from(mesh_peers)).clamp(1.0, 10.0).round();
    let probing = Probing {
        tor_mesh_pps,
        inter_tor_tors: (topology.tors - 1).min(4),
        inter_tor_pps: f64::from(1 + pick(2)),
        flow_labels: [8, 16, 32][pick(3) as usize],
        timeout_ms: 500,
        pinglist_refresh_s: 60,
    };
    let normal = Normal {
        network_rtt_us: Quantiles { p50: 4.0, p99: 12.0 },
        prober_delay_us: Quantiles { p50: 2.0, p99: 15.0 },
        responder_delay_us: Quantiles { p50: 1.0, p99: 6.0 },
        loss: 1e-6,
        ts_source: if pick(2) == 0 { TsModel::Nic } else { TsModel::Host },
    };
    let mut s = Scenario {
        version: VERSION,
        name: format!("suite seed {seed} #{index}"),
        seed: seed ^ index.wrapping_mul(0x9E37_79B9),
        duration_s: 240,
        window_s: 30,
        start_unix_s: 1_700_000_000,
        topology,
        probing,
        normal,
        faults: Vec::new(),
    };
    let extra = pick(3);
    let mut kinds = vec![primary];
    for _ in 0..extra {
        let k = FaultKind::ALL[pick(FaultKind::ALL.len() as u64) as usize];
        let fabric_ok = s.topology.tors >= 4
            || !matches!(k, FaultKind::LinkLoss | FaultKind::LinkFlap | FaultKind::LinkSlow | FaultKind::SpineLoss);
        if fabric_ok {
            kinds.push(k);
        }
    }
    for kind in kinds {
        for _attempt in 0..20 {
            let f = random_fault(&mut rng, &s, kind);
            if !s.faults.iter().any(|g| entangled(&s, g, &f)) {
                s.faults.push(f);
                break;
            }
        }
    }
    s
}

fn random_fault(rng: &mut Rng, s: &Scenario, kind: FaultKind) -> Fault {
    let t = &s.topology;
    let mut pick = |n: u64| (rng.next_u64() % n.max(1)) as u32;
    let host = pick(u64::from(t.host_count()));
    let target = match kind.target_kind() {
        rocemesh_formats::scenario::EntityKind::Rnic => {
            format!("{}/rnic{}", t.host_name(host), pick(u64::from(t.rnics_per_host)))
        }
        rocemesh_formats::scenario::EntityKind::Tor => format!("tor{}", pick(u64::from(t.tors))),
        rocemesh_formats::scenario::EntityKind::Link => {
            format!("tor{}|spine{}", pick(u64::from(t.tors)), pick(u64::from(t.spines)))
        }
        rocemesh_formats::scenario::EntityKind::Spine => format!("spine{}", pick(u64::from(t.spines))),
        rocemesh_formats::scenario::EntityKind::Host => t.host_name(host),
    };
    // At least two windows long, so that a finding has time to hold.
    let start_s = f64::from(30 + pick(100));
    let end_s = if pick(2) == 0 { None } else { Some((start_s + f64::from(60 + pick(60))).min(s.duration_s as f64)) };
    let mut f = Fault::new(kind, target, start_s, end_s);
    // Half the faults are faint (issue 17): what operators chase for weeks, not what alarms.
    let faint = pick(2) == 0;
    // Log-uniform over the faint range, so each decade is as likely.
    let (u_loss, u_rtt) = (f64::from(pick(1_000_001)) / 1e6, f64::from(pick(1_000_001)) / 1e6);
    let log_uniform = |lo: f64, hi: f64, u: f64| lo * (hi / lo).powf(u);
    let loss =
        if faint { (log_uniform(0.001, 0.01, u_loss) * 1e5).round() / 1e5 } else { f64::from(5 + pick(26)) / 100.0 };
    let fleet_p99_us = s.normal.network_rtt_us.p99;
    let extra_rtt_us = if faint {
        (log_uniform(2.0, 10.0, u_rtt) * fleet_p99_us * 10.0).round() / 10.0
    } else {
        f64::from(100 + pick(900))
    };
    match kind {
        FaultKind::RnicLoss | FaultKind::TorLoss | FaultKind::LinkLoss | FaultKind::SpineLoss => f.loss = Some(loss),
        FaultKind::RnicFlap | FaultKind::LinkFlap => {
            if faint {
                // Short flaps: down for 1 to 2 s every 10 to 30 s.
                let period = f64::from(10 + pick(21));
                f.period_s = Some(period);
                f.down_s = Some(f64::from(10 + pick(11)) / 10.0);
            } else {
                let period = f64::from(15 + pick(30));
                f.period_s = Some(period);
                f.down_s = Some(f64::from(2 + pick((period / 4.0) as u64)));
            }
        }
        FaultKind::RnicSlow | FaultKind::LinkSlow => f.extra_rtt_us = Some(extra_rtt_us),
        FaultKind::HostStall => {
            let period = f64::from(3 + pick(8));
            f.period_s = Some(period);
            f.stall_ms = Some(f64::from(200 + pick(1300)).min(period * 500.0));
        }
        FaultKind::ClockStep => {
            let ms = f64::from(50 + pick(4950));
            f.step_ms = Some(if pick(2) == 0 { ms } else { -ms });
        }
        FaultKind::RnicDown | FaultKind::TorDown | FaultKind::AgentRestart => {}
    }
    f
}

/// How faint a fault is, for per-band accuracy: the band's name. Loss and extra RTT are banded
/// by size (extra RTT in multiples of the scenario's healthy p99), flaps by how long they are
/// down; kinds without a size (dead RNICs and ToRs, host faults) are `-`.
pub fn band(s: &Scenario, f: &Fault) -> &'static str {
    if let Some(loss) = f.loss {
        return match loss {
            l if l < 0.003 => "loss 0.1-0.3%",
            l if l < 0.01 => "loss 0.3-1%",
            l if l < 0.05 => "loss 1-5%",
            _ => "loss >=5%",
        };
    }
    if let Some(extra) = f.extra_rtt_us {
        return match extra / s.normal.network_rtt_us.p99 {
            x if x < 4.0 => "rtt +2-4x p99",
            x if x <= 10.0 => "rtt +4-10x p99",
            _ => "rtt +>10x p99",
        };
    }
    if let Some(down) = f.down_s {
        return if down <= 2.0 { "down <=2 s" } else { "down >2 s" };
    }
    "-"
}

/// Whether two faults cannot be told apart or one hides the other, whatever the analysis:
/// they share a ToR (an RNIC under a faulty ToR, two faults in one ToR-mesh that would read as
/// the ToR), or they touch the same spine-side element. Overlap in time is allowed and wanted.
fn entangled(s: &Scenario, a: &Fault, b: &Fault) -> bool {
    use rocemesh_formats::scenario::Entity;
    let t = &s.topology;
    let tors_of = |f: &Fault| -> Vec<u32> {
        match t.entity(&f.target) {
            Some(Entity::Rnic { host, rnic }) => vec![t.tor_of(host, rnic)],
            Some(Entity::Host(h)) => (0..t.rnics_per_host).map(|k| t.tor_of(h, k)).collect(),
            Some(Entity::Tor(x)) => vec![x],
            Some(Entity::Link { tor, .. }) => vec![tor],
            _ => Vec::new(),
        }
    };
    let spine_of = |f: &Fault| match t.entity(&f.target) {
        Some(Entity::Spine(x)) | Some(Entity::Link { spine: x, .. }) => Some(x),
        _ => None,
    };
    let shared_tor = tors_of(a).iter().any(|x| tors_of(b).contains(x));
    let shared_spine = spine_of(a).is_some() && spine_of(a) == spine_of(b);
    shared_tor || shared_spine || a.target == b.target
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;

    #[test]
    fn generated_scenarios_are_valid_and_cover_every_kind() {
        let mut kinds = BTreeSet::new();
        for i in 0..40 {
            let s = generate(7, i);
            let text = s.to_toml_string().unwrap();
            let again = Scenario::parse(&text, Path::new("gen.toml")).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(again, s);
            kinds.extend(s.faults.iter().map(|f| f.kind));
            // Rail ToRs hold one RNIC per host; plain ToRs hold hosts_per_tor single-RNIC hosts.
            assert!((2..=64).contains(&s.topology.hosts_per_tor));
        }
        assert_eq!(kinds.len(), FaultKind::ALL.len());
        assert_eq!(generate(7, 3), generate(7, 3));
    }
}
