//! Stage 7: which traced service connections (jobs' RDMA QPs) the findings touch. Per connection
//! its own figures, its bad windows, its path through the fabric and the findings on that path,
//! graded and ranked by impact ([`service_impacts`]).

use super::baseline::Baselines;
use super::evidence::path_elements;
use super::render::slow_sources;
use super::tally::ServiceTally;
use super::{AffectedBy, BadWindow, Finding, Grade, Options, ServiceImpact};
use crate::ingest::{Dataset, Resolution, UNKNOWN_RNIC};
use crate::probe::TsSources;
use crate::quantile::nearest_rank_index;
use std::collections::BTreeSet;

/// Stage 7: every traced service with its own figures, bad windows, path and the findings on
/// it, graded and ranked (the rule is in the module documentation).
pub(super) fn service_impacts(
    ds: &Dataset,
    tallies: &[ServiceTally],
    findings: &[Finding],
    base: &Baselines,
    opts: &Options,
    window_ns: u64,
) -> Vec<ServiceImpact> {
    let name = |id: u32| ds.rnics.get(id as usize).map_or(UNKNOWN_RNIC, |r| r.name.as_str()).to_owned();
    let mut out: Vec<(ServiceImpact, i64)> = Vec::with_capacity(ds.services.len());
    for (s, t) in ds.services.iter().zip(tallies) {
        let prober = if s.prober == u32::MAX { t.prober } else { s.prober };
        let (path, fabric_path_known) = service_path(ds, prober, s.remote, s.conn.flow_label);
        let mut bad_windows = Vec::new();
        let mut bad: BTreeSet<u32> = BTreeSet::new();
        for (&w, a) in &t.windows {
            let mut why = Vec::new();
            if a.valid > 0 && f64::from(a.lost) > opts.sla.loss_ratio * f64::from(a.valid) {
                why.push(format!(
                    "loss {}/{} ({:.1}%) above the SLA's {}%",
                    a.lost,
                    a.valid,
                    f64::from(a.lost) * 100.0 / f64::from(a.valid),
                    opts.sla.loss_ratio * 100.0
                ));
            }
            if a.slow >= opts.lost_min && f64::from(a.slow) >= opts.slow_ratio_min * f64::from(a.ok) {
                why.push(format!("{}/{} probes slow{}", a.slow, a.ok, slow_sources(TsSources(a.slow_ts), base, w)));
            }
            if !why.is_empty() {
                bad.insert(w);
                bad_windows.push(BadWindow {
                    start_ns: u64::from(w) * window_ns,
                    valid: u64::from(a.valid),
                    lost: u64::from(a.lost),
                    slow: u64::from(a.slow),
                    why: why.join("; "),
                });
            }
        }
        // A finding covers windows [start, end) (end = None: to the end of the data).
        let mut affected_by = Vec::new();
        for f in findings {
            if !path.iter().any(|(k, e)| *k == f.kind && *e == f.entity) {
                continue;
            }
            let (lo, hi) = (f.start_ns / window_ns, f.end_ns.map_or(u64::MAX, |e| e.div_ceil(window_ns)));
            let within = |w: &u32| (lo..hi).contains(&u64::from(*w));
            if !t.windows.keys().any(within) {
                continue;
            }
            affected_by.push(AffectedBy {
                entity: f.entity.clone(),
                kind: f.kind.clone(),
                start_ns: f.start_ns,
                end_ns: f.end_ns,
                confirmed: bad.iter().any(within),
                evidence: f.evidence.clone(),
            });
        }
        let lost: u64 = t.windows.values().map(|a| u64::from(a.lost)).sum();
        let slow: u64 = t.windows.values().map(|a| u64::from(a.slow)).sum();
        let valid: u64 = t.windows.values().map(|a| u64::from(a.valid)).sum();
        let mut notes = Vec::new();
        let grade = if !bad_windows.is_empty() {
            if affected_by.is_empty() {
                notes.push("no finding on its path explains it".to_owned());
            } else if !affected_by.iter().any(|a| a.confirmed) {
                notes.push("no finding on its path overlaps its bad windows".to_owned());
            }
            Grade::High
        } else if !affected_by.is_empty() {
            notes.push("a finding lies on its path; its own probes stayed within the SLA and the baseline".to_owned());
            Grade::Medium
        } else if lost + slow > 0 {
            Grade::Low
        } else {
            Grade::None
        };
        if s.resolution == Resolution::Unresolved {
            notes.push("remote RNIC unresolved: only the prober's side of its path is known".into());
        }
        let p99 = |v: &[i64]| -> Option<i64> {
            let mut v = v.to_vec();
            let at = nearest_rank_index(v.len(), 0.99);
            (!v.is_empty()).then(|| *v.select_nth_unstable(at).1)
        };
        let rtt: Vec<i64> = t.rtt.iter().map(|&r| i64::from(r)).collect();
        let excess = p99(&t.excess).map(|e| e.max(0));
        out.push((
            ServiceImpact {
                rank: 0,
                grade,
                name: s.name.clone(),
                label: s.label(&ds.rnics),
                prober: name(prober),
                remote: name(s.remote),
                remote_resolution: s.resolution,
                pid: s.conn.pid,
                comm: s.conn.comm.clone(),
                local_qpn: s.conn.local_qpn,
                remote_qpn: s.conn.remote_qpn,
                flow_label: s.conn.flow_label,
                traffic_class: s.conn.traffic_class,
                first_ns: (t.probes > 0).then_some(t.first_ns),
                last_ns: (t.probes > 0).then_some(t.last_ns),
                windows: t.windows.len() as u64,
                probes: t.probes,
                lost,
                loss_ratio: (valid > 0).then(|| lost as f64 / valid as f64),
                rtt_ns_p99: p99(&rtt),
                rtt_ns_p99_excess: excess,
                bad_windows,
                path: path.iter().map(|(k, e)| format!("{k}:{e}")).collect(),
                fabric_path_known,
                affected_by,
                note: (!notes.is_empty()).then(|| notes.join("; ")),
            },
            excess.unwrap_or(0),
        ));
    }
    out.sort_by(|(a, ae), (b, be)| {
        (a.grade, std::cmp::Reverse(a.lost), std::cmp::Reverse(a.bad_windows.len()), std::cmp::Reverse(*ae), &a.name)
            .cmp(&(
                b.grade,
                std::cmp::Reverse(b.lost),
                std::cmp::Reverse(b.bad_windows.len()),
                std::cmp::Reverse(*be),
                &b.name,
            ))
    });
    out.into_iter()
        .enumerate()
        .map(|(i, (mut s, _))| {
            s.rank = i as u64 + 1;
            s
        })
        .collect()
}

/// What a service's packets cross, as (kind, entity) from the prober to the remote: RNIC, host
/// and ToR of the prober; the links and spines of the traced forward and reverse paths of
/// (prober, remote, label), else of the inventory's single path between the two ToRs; the
/// remote's ToR, host and RNIC. The flag says whether the part between the ToRs is known.
pub(super) fn service_path(ds: &Dataset, prober: u32, remote: u32, label: u32) -> (Vec<(&'static str, String)>, bool) {
    let mut v: Vec<(&'static str, String)> = Vec::new();
    let push = |v: &mut Vec<(&'static str, String)>, kind: &'static str, name: &str| {
        if !name.is_empty() && !v.iter().any(|(k, n)| *k == kind && n == name) {
            v.push((kind, name.to_owned()));
        }
    };
    let (a, b) = (ds.rnics.get(prober as usize), ds.rnics.get(remote as usize));
    if let Some(a) = a {
        push(&mut v, "rnic", &a.name);
        push(&mut v, "host", &a.host);
        push(&mut v, "tor", &a.tor);
    }
    let traced: Vec<&Vec<u32>> = [ds.paths.get(&(prober, remote, label)), ds.paths.get(&(remote, prober, label))]
        .into_iter()
        .flatten()
        .collect();
    let mut known = !traced.is_empty();
    let mut hops = traced;
    if let (Some(a), Some(b)) = (a, b)
        && hops.is_empty()
        && !a.tor.is_empty()
        && !b.tor.is_empty()
    {
        if a.tor == b.tor {
            known = true;
        } else {
            hops =
                [ds.tor_paths.get(&(a.tor.clone(), b.tor.clone())), ds.tor_paths.get(&(b.tor.clone(), a.tor.clone()))]
                    .into_iter()
                    .flatten()
                    .collect();
            known = !hops.is_empty();
        }
    }
    for h in hops {
        for (kind, name) in path_elements(&ds.switches, h) {
            push(&mut v, kind, &name);
        }
    }
    if let Some(b) = b {
        push(&mut v, "tor", &b.tor);
        push(&mut v, "host", &b.host);
        push(&mut v, "rnic", &b.name);
    }
    (v, known)
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    /// A service's path: both ends' RNIC, host and ToR, and between the ToRs the traced paths of
    /// its own flow label, else the inventory's single path, else nothing known.
    #[test]
    fn service_paths_come_from_traces_then_the_inventory() {
        let mut ds = dataset(4, 1, &[]);
        ds.switches = vec!["t0".into(), "s0".into(), "t1".into(), "s1".into()];
        ds.tor_paths.insert(("t0".into(), "t1".into()), vec![0, 1, 2]);
        ds.tor_paths.insert(("t1".into(), "t0".into()), vec![2, 1, 0]);
        // h0 -> h1 label 7 is traced through s1.
        ds.paths.insert((0, 1, 7), vec![0, 3, 2]);
        ds.paths.insert((1, 0, 7), vec![2, 3, 0]);
        let names = |(v, known): (Vec<(&'static str, String)>, bool)| -> (Vec<String>, bool) {
            (v.into_iter().map(|(k, n)| format!("{k}:{n}")).collect(), known)
        };
        let ends = |mid: &[&str]| -> Vec<String> {
            let mut v = vec!["rnic:h0/d0", "host:h0", "tor:t0"];
            v.extend_from_slice(mid);
            v.extend(["tor:t1", "host:h1", "rnic:h1/d0"]);
            v.into_iter().map(String::from).collect()
        };
        assert_eq!(
            names(service_path(&ds, 0, 1, 7)),
            (ends(&["link:t0|s1", "link:t1|s1", "spine:s1"]), true),
            "its own label's trace"
        );
        assert_eq!(
            names(service_path(&ds, 0, 1, 8)),
            (ends(&["link:t0|s0", "link:t1|s0", "spine:s0"]), true),
            "untraced label: the inventory's path"
        );
        ds.tor_paths.clear();
        assert_eq!(names(service_path(&ds, 0, 1, 8)), (ends(&[]), false), "nothing known between the ToRs");
        let same_tor = names(service_path(&ds, 0, 2, 8));
        assert_eq!(same_tor.0, ["rnic:h0/d0", "host:h0", "tor:t0", "host:h2", "rnic:h2/d0"]);
        assert!(same_tor.1, "under one ToR nothing lies between");
    }
}
