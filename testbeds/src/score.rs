//! Scoring `analyze localize` findings against a scenario's truth, by the rules of
//! `testbeds/scenarios/README.md`: a finding matches a fault when kind and entity agree (a
//! host_stall expects kind `host`) and its span overlaps the fault's span widened by one window
//! on each side. Precision is over network findings (rnic, tor, link, spine); recall over the
//! faults that expect one.

use std::fmt::Write as _;

use rocemesh_formats::scenario::{Entity, FaultKind, Scenario};
use serde::Deserialize;

/// One finding as `analyze localize --format json` prints it (extra fields are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Finding {
    /// rnic, tor, link, spine or host.
    pub kind: String,
    /// Entity name.
    pub entity: String,
    /// Wall-clock ns of the first window in which the finding held.
    pub start_ns: u64,
    /// Wall-clock ns of the end of the last window; `None` = still open.
    pub end_ns: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Findings {
    findings: Vec<Finding>,
}

/// Why findings could not be scored.
#[derive(Debug, thiserror::Error)]
#[error("findings JSON: {0} (fix: pass the output of `analyze localize --format json`)")]
pub struct FindingsError(#[from] serde_json::Error);

/// Parses the JSON object `analyze localize --format json` prints.
pub fn parse_findings(json: &str) -> Result<Vec<Finding>, FindingsError> {
    Ok(serde_json::from_str::<Findings>(json)?.findings)
}

/// How one fault fared.
#[derive(Debug, Clone)]
pub struct FaultScore {
    /// Index in the scenario's fault list.
    pub index: usize,
    /// Its kind.
    pub kind: FaultKind,
    /// Its target.
    pub target: String,
    /// Whether it expects a network finding (counts toward recall).
    pub expects_network: bool,
    /// Indexes of the findings that matched it.
    pub matched_by: Vec<usize>,
}

/// The score of one scenario.
#[derive(Debug, Clone)]
pub struct Score {
    /// Network findings (rnic, tor, link, spine) emitted.
    pub network_findings: usize,
    /// Of those, how many match a fault.
    pub matching_network_findings: usize,
    /// Faults expecting a network finding.
    pub faults_expecting: usize,
    /// Of those, how many were found.
    pub faults_found: usize,
    /// Per fault.
    pub faults: Vec<FaultScore>,
    /// Network findings that match nothing.
    pub false_positives: Vec<Finding>,
    /// Whether the host_stall faults got a `host` finding (welcome, not required).
    pub stalls_named: usize,
}

impl Score {
    /// Matching network findings / network findings; 1 when there are none.
    pub fn precision(&self) -> f64 {
        if self.network_findings == 0 {
            1.0
        } else {
            self.matching_network_findings as f64 / self.network_findings as f64
        }
    }

    /// Faults found / faults expecting a network finding; 1 when none expect one.
    pub fn recall(&self) -> f64 {
        if self.faults_expecting == 0 { 1.0 } else { self.faults_found as f64 / self.faults_expecting as f64 }
    }

    /// A per-fault table and the false positives.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{:<4} {:<14} {:<22} {:<8} matched by", "#", "kind", "target", "expects");
        for f in &self.faults {
            let expects = if f.expects_network { f.kind.expected_finding().unwrap_or("-") } else { "none" };
            let _ =
                writeln!(s, "{:<4} {:<14} {:<22} {:<8} {:?}", f.index, f.kind.name(), f.target, expects, f.matched_by);
        }
        for fp in &self.false_positives {
            let _ = writeln!(s, "false positive: {} {} {}..{:?}", fp.kind, fp.entity, fp.start_ns, fp.end_ns);
        }
        let _ = writeln!(
            s,
            "precision {:.3} ({}/{})  recall {:.3} ({}/{})",
            self.precision(),
            self.matching_network_findings,
            self.network_findings,
            self.recall(),
            self.faults_found,
            self.faults_expecting
        );
        s
    }
}

fn is_network(kind: &str) -> bool {
    matches!(kind, "rnic" | "tor" | "link" | "spine")
}

/// Scores `findings` against the faults of `scenario`.
pub fn score(scenario: &Scenario, findings: &[Finding]) -> Score {
    let topo = &scenario.topology;
    let window_ns = scenario.window_s * 1_000_000_000;
    let start = scenario.start_unix_ns();
    let same_entity = |a: &str, b: &str| match (topo.entity(a), topo.entity(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    };
    let mut faults = Vec::new();
    let mut matched_finding = vec![false; findings.len()];
    let mut stalls_named = 0;
    for (index, fault) in scenario.faults.iter().enumerate() {
        let want = match fault.kind {
            FaultKind::HostStall => Some("host"),
            k => k.expected_finding(),
        };
        let lo = (start + (fault.start_s * 1e9) as u64).saturating_sub(window_ns);
        let hi = start + (fault.end_or(scenario.duration_s) * 1e9) as u64 + window_ns;
        let mut matched_by = Vec::new();
        if let Some(want) = want {
            for (i, f) in findings.iter().enumerate() {
                let overlaps = f.start_ns <= hi && f.end_ns.is_none_or(|e| e >= lo);
                if f.kind == want && overlaps && same_entity(&f.entity, &fault.target) {
                    matched_by.push(i);
                    matched_finding[i] = true;
                }
            }
        }
        let expects_network = fault.kind.expected_finding().is_some();
        if fault.kind == FaultKind::HostStall && !matched_by.is_empty() {
            stalls_named += 1;
        }
        faults.push(FaultScore { index, kind: fault.kind, target: fault.target.clone(), expects_network, matched_by });
    }
    let network: Vec<usize> = (0..findings.len()).filter(|&i| is_network(&findings[i].kind)).collect();
    let matching = network.iter().filter(|&&i| matched_finding[i]).count();
    let false_positives = network.iter().filter(|&&i| !matched_finding[i]).map(|&i| findings[i].clone()).collect();
    let expecting: Vec<&FaultScore> = faults.iter().filter(|f| f.expects_network).collect();
    Score {
        network_findings: network.len(),
        matching_network_findings: matching,
        faults_expecting: expecting.len(),
        faults_found: expecting.iter().filter(|f| !f.matched_by.is_empty()).count(),
        faults,
        false_positives,
        stalls_named,
    }
}

/// Whether `entity` (a finding's) is on or under `host` (an index): the host, its RNICs.
pub fn on_host(scenario: &Scenario, entity: &str, host: u32) -> bool {
    match scenario.topology.entity(entity) {
        Some(Entity::Host(h)) | Some(Entity::Rnic { host: h, .. }) => h == host,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn scenario() -> Scenario {
        Scenario::parse(
            r#"
version = 1
name = "t"
seed = 1
duration_s = 300
window_s = 30
[topology]
spines = 2
tors = 2
hosts_per_tor = 4
[probing]
tor_mesh_pps = 10
inter_tor_tors = 1
inter_tor_pps = 1
flow_labels = 4
timeout_ms = 500
[normal]
network_rtt_us = { p50 = 4.0, p99 = 12.0 }
prober_delay_us = { p50 = 2.0, p99 = 15.0 }
responder_delay_us = { p50 = 1.0, p99 = 6.0 }
loss = 1e-6
[[fault]]
kind = "link_loss"
target = "tor1|spine0"
loss = 0.1
start_s = 60
end_s = 120
[[fault]]
kind = "host_stall"
target = "tor0-h1"
stall_ms = 500
period_s = 5
"#,
            Path::new("t.toml"),
        )
        .unwrap()
    }

    fn finding(kind: &str, entity: &str, start_s: u64, end_s: Option<u64>) -> Finding {
        let base = 1_700_000_000 * 1_000_000_000u64;
        Finding {
            kind: kind.into(),
            entity: entity.into(),
            start_ns: base + start_s * 1_000_000_000,
            end_ns: end_s.map(|e| base + e * 1_000_000_000),
        }
    }

    #[test]
    fn matching_follows_the_readme_rules() {
        let s = scenario();
        // Link named in the other order, window-widened overlap: matches.
        let f = [finding("link", "spine0|tor1", 140, Some(170)), finding("host", "tor0-h1", 0, None)];
        let sc = score(&s, &f);
        assert_eq!((sc.precision(), sc.recall(), sc.stalls_named), (1.0, 1.0, 1));
        // Outside the widened span; wrong kind; a network finding on the stalled host.
        let f = [
            finding("link", "tor1|spine0", 151, Some(170)),
            finding("spine", "spine0", 60, Some(120)),
            finding("rnic", "tor0-h1/rnic0", 60, None),
        ];
        let sc = score(&s, &f);
        assert_eq!((sc.network_findings, sc.matching_network_findings, sc.faults_found), (3, 0, 0));
        assert_eq!(sc.false_positives.len(), 3);
        assert!(on_host(&s, "tor0-h1/rnic0", 1));
        assert!(sc.render().contains("precision 0.000"));
    }

    #[test]
    fn findings_json_is_read_with_extra_fields() {
        let f = parse_findings(
            r#"{"findings":[{"kind":"rnic","entity":"a/rnic0","start_ns":5,"end_ns":null,"score":0.9}]}"#,
        )
        .unwrap();
        assert_eq!(f[0].end_ns, None);
        assert!(parse_findings("{}").unwrap_err().to_string().contains("analyze localize"));
    }
}
