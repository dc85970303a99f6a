//! `ctl inventory check`: what ctl needs of an inventory beyond the format's own validation
//! (which [`Inventory::load`] has already done), and a summary of the fabric.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::pinglist::MAX_TARGETS;

use crate::error::host_name_problem;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Worth knowing; probing works.
    Note,
    /// Probing will have a blind spot or ctl cannot serve this part of the fabric.
    Problem,
}

/// One thing found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub message: String,
}

/// Counts of what the inventory declares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    pub hosts: usize,
    pub rnics: usize,
    pub tors: usize,
    /// Distinct rail numbers (0 when the fabric is not rail-optimised).
    pub rails: usize,
    pub spines: usize,
    pub links: usize,
    /// Switch addresses (`addrs` of ToRs and spines), which name the hops of path traces.
    pub switch_addrs: usize,
    /// ToRs and spines with at least one address.
    pub switches_with_addrs: usize,
    /// RNICs under a ToR: smallest, median, largest (over ToRs with at least one).
    pub rnics_per_tor: (usize, usize, usize),
    /// RNICs of a host: smallest and largest.
    pub rnics_per_host: (usize, usize),
}

/// The result of [`check`].
#[derive(Debug, Clone)]
pub struct Report {
    pub summary: Summary,
    pub findings: Vec<Finding>,
}

impl Report {
    /// Whether any finding is a [`Severity::Problem`].
    pub fn has_problems(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Problem)
    }
}

/// Checks `inventory` (already validated by the format) for what pinglist generation and
/// pushing need.
pub fn check(inventory: &Inventory) -> Report {
    let mut findings = Vec::new();
    let mut problem = |message: String| findings.push(Finding { severity: Severity::Problem, message });

    for host in &inventory.hosts {
        if let Some(p) = host_name_problem(&host.name) {
            problem(format!("{p}; rename the host in the inventory"));
        }
    }

    let mut per_tor: BTreeMap<&str, Vec<String>> =
        inventory.tors.iter().map(|t| (t.name.as_str(), Vec::new())).collect();
    for host in &inventory.hosts {
        for r in &host.rnics {
            per_tor.entry(r.tor.as_str()).or_default().push(Inventory::rnic_name(&host.name, &r.device));
        }
    }
    let mut counts: Vec<usize> = per_tor.values().map(Vec::len).filter(|&n| n > 0).collect();
    counts.sort_unstable();
    for (tor, rnics) in &per_tor {
        match rnics.len() {
            0 => findings.push(Finding {
                severity: Severity::Note,
                message: format!("ToR {tor:?} has no RNIC: nothing probes through it"),
            }),
            1 => findings.push(Finding {
                severity: Severity::Problem,
                message: format!(
                    "ToR {tor:?} has a single RNIC ({}): no ToR-mesh probing there, and its faults cannot be told from the RNIC's",
                    rnics[0]
                ),
            }),
            2 => findings.push(Finding {
                severity: Severity::Note,
                message: format!(
                    "ToR {tor:?} has two RNICs: when the mesh between them fails, ToR-mesh alone cannot tell which is at fault"
                ),
            }),
            n if n > MAX_TARGETS => findings.push(Finding {
                severity: Severity::Problem,
                message: format!("ToR {tor:?} has {n} RNICs; a pinglist holds at most {MAX_TARGETS} targets"),
            }),
            _ => {}
        }
    }

    let rails: BTreeSet<u16> = inventory.tors.iter().filter_map(|t| t.rail).collect();
    if !rails.is_empty() {
        let rail_of: HashMap<&str, u16> =
            inventory.tors.iter().filter_map(|t| Some((t.name.as_str(), t.rail?))).collect();
        for host in &inventory.hosts {
            let mut seen: HashMap<u16, &str> = HashMap::new();
            for r in &host.rnics {
                let Some(&rail) = rail_of.get(r.tor.as_str()) else { continue };
                if let Some(other) = seen.insert(rail, &r.device) {
                    findings.push(Finding {
                        severity: Severity::Problem,
                        message: format!(
                            "host {:?} has {other} and {} on rail {rail}; in a rail-optimised fabric each RNIC of a host is on its own rail (check the cabling or the ToRs' rails)",
                            host.name, r.device
                        ),
                    });
                }
            }
        }
        for rail in &rails {
            let tors = inventory.tors.iter().filter(|t| t.rail == Some(*rail)).count();
            if tors == 1 {
                findings.push(Finding {
                    severity: Severity::Note,
                    message: format!(
                        "rail {rail} has one ToR: no inter-ToR probing within it (only with --cross-rail)"
                    ),
                });
            }
        }
    }

    if !inventory.links.is_empty() {
        let linked: BTreeSet<&str> = inventory.links.iter().flat_map(|l| [l.a.as_str(), l.b.as_str()]).collect();
        let unlinked: Vec<&str> = inventory
            .tors
            .iter()
            .map(|t| t.name.as_str())
            .chain(inventory.spines.iter().map(|s| s.name.as_str()))
            .filter(|n| !linked.contains(n))
            .collect();
        if !unlinked.is_empty() {
            findings.push(Finding {
                severity: Severity::Problem,
                message: format!(
                    "{} switch(es) have no [[link]] although links are declared, so faults cannot be localised to their links: {}",
                    unlinked.len(),
                    preview(&unlinked)
                ),
            });
        }
    }
    if inventory.spines.is_empty() && inventory.tors.len() > 1 {
        findings.push(Finding {
            severity: Severity::Note,
            message: "no [[spine]]: gen-pinglists sizes flow labels for 4 ECMP paths unless told --ecmp-paths"
                .to_owned(),
        });
    }

    // Once some switches have addresses, path traces through the others cannot be named: the
    // traces through them are left out of localisation.
    let switch_addrs: Vec<(&str, usize)> = inventory
        .tors
        .iter()
        .map(|t| (t.name.as_str(), t.addrs.len()))
        .chain(inventory.spines.iter().map(|s| (s.name.as_str(), s.addrs.len())))
        .collect();
    let switches_with_addrs = switch_addrs.iter().filter(|(_, n)| *n > 0).count();
    if switches_with_addrs > 0 && switches_with_addrs < switch_addrs.len() {
        let without: Vec<&str> = switch_addrs.iter().filter(|(_, n)| *n == 0).map(|(name, _)| *name).collect();
        findings.push(Finding {
            severity: Severity::Note,
            message: format!(
                "{} switch(es) have no `addrs` while others do: `analyze` cannot name path-trace hops they answer and leaves those traces out (add them with `ctl inventory switch-addrs`): {}",
                without.len(),
                preview(&without)
            ),
        });
    }

    let per_host: Vec<usize> = inventory.hosts.iter().map(|h| h.rnics.len()).collect();
    let summary = Summary {
        hosts: inventory.hosts.len(),
        rnics: per_host.iter().sum(),
        tors: inventory.tors.len(),
        rails: rails.len(),
        spines: inventory.spines.len(),
        links: inventory.links.len(),
        switch_addrs: switch_addrs.iter().map(|(_, n)| n).sum(),
        switches_with_addrs,
        rnics_per_tor: match counts.as_slice() {
            [] => (0, 0, 0),
            c => (c[0], c[c.len() / 2], c[c.len() - 1]),
        },
        rnics_per_host: (per_host.iter().copied().min().unwrap_or(0), per_host.iter().copied().max().unwrap_or(0)),
    };
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    Report { summary, findings }
}

fn preview(names: &[&str]) -> String {
    let shown: Vec<&str> = names.iter().take(8).copied().collect();
    let more = names.len().saturating_sub(shown.len());
    if more > 0 { format!("{} and {more} more", shown.join(", ")) } else { shown.join(", ") }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "hosts   {:>8}   RNICs per host {}..{}", self.hosts, self.rnics_per_host.0, self.rnics_per_host.1)?;
        writeln!(f, "RNICs   {:>8}", self.rnics)?;
        let (min, median, max) = self.rnics_per_tor;
        writeln!(f, "ToRs    {:>8}   RNICs per ToR min {min}, median {median}, max {max}", self.tors)?;
        if self.rails > 0 {
            writeln!(f, "rails   {:>8}   (rail-optimised)", self.rails)?;
        } else {
            writeln!(f, "rails   {:>8}   (not rail-optimised)", 0)?;
        }
        writeln!(f, "spines  {:>8}", self.spines)?;
        writeln!(f, "links   {:>8}", self.links)?;
        writeln!(
            f,
            "addrs   {:>8}   switch addresses (name path-trace hops), on {} of {} switches",
            self.switch_addrs,
            self.switches_with_addrs,
            self.tors + self.spines
        )
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.severity {
            Severity::Note => "note",
            Severity::Problem => "problem",
        };
        write!(f, "{tag}: {}", self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn inv(text: &str) -> Inventory {
        Inventory::parse(text, Path::new("inv.toml")).unwrap()
    }

    const RAILS: &str = r#"
version = 1
[[tor]]
name = "r0"
rail = 0
[[tor]]
name = "r1"
rail = 1
[[spine]]
name = "s0"
[[link]]
a = "r0"
b = "s0"
[[host]]
name = "h0"
[[host.rnic]]
device = "mlx5_0"
tor = "r0"
ip = "10.0.0.1"
[[host.rnic]]
device = "mlx5_1"
tor = "r0"
ip = "10.0.1.1"
[[host]]
name = "h1"
[[host.rnic]]
device = "mlx5_0"
tor = "r0"
ip = "10.0.0.2"
[[host.rnic]]
device = "mlx5_1"
tor = "r1"
ip = "10.0.1.2"
"#;

    #[test]
    fn summary_counts_and_problems() {
        let report = check(&inv(RAILS));
        let s = &report.summary;
        assert_eq!((s.hosts, s.rnics, s.tors, s.rails, s.spines, s.links), (2, 4, 2, 2, 1, 1));
        assert_eq!((s.switch_addrs, s.switches_with_addrs), (0, 0));
        assert_eq!(s.rnics_per_tor, (1, 3, 3));
        assert_eq!(s.rnics_per_host, (2, 2));
        let text: Vec<String> = report.findings.iter().map(ToString::to_string).collect();
        let has = |needle: &str| text.iter().any(|t| t.contains(needle));
        assert!(has("problem: ToR \"r1\" has a single RNIC (h1/mlx5_1)"), "{text:#?}");
        assert!(has("host \"h0\" has mlx5_0 and mlx5_1 on rail 0"), "{text:#?}");
        assert!(has("have no [[link]]") && has(": r1"), "{text:#?}");
        assert!(has("note: rail 0 has one ToR"), "{text:#?}");
        assert!(report.has_problems());
        // Problems first.
        assert_eq!(report.findings[0].severity, Severity::Problem);
    }

    #[test]
    fn a_healthy_fabric_has_no_problems() {
        let mut text =
            String::from("version = 1\n[[tor]]\nname = \"t0\"\n[[tor]]\nname = \"t1\"\n[[spine]]\nname = \"s0\"\n");
        for h in 0..6 {
            text.push_str(&format!(
                "[[host]]\nname = \"h{h}\"\n[[host.rnic]]\ndevice = \"d\"\ntor = \"t{}\"\nip = \"10.0.0.{}\"\n",
                h % 2,
                h + 1
            ));
        }
        let report = check(&inv(&text));
        assert!(!report.has_problems(), "{:?}", report.findings);
        assert_eq!(report.summary.rnics_per_tor, (3, 3, 3));
        assert!(report.summary.to_string().contains("addrs          0   switch addresses"), "{}", report.summary);
    }

    #[test]
    fn switch_addresses_are_counted_and_switches_without_them_noted() {
        let text = "version = 1\n[[tor]]\nname = \"t0\"\naddrs = [\"172.16.0.1\", \"172.16.0.2\"]\n\
                    [[tor]]\nname = \"t1\"\n[[spine]]\nname = \"s0\"\naddrs = [\"172.16.255.1\"]\n";
        let report = check(&inv(text));
        assert_eq!((report.summary.switch_addrs, report.summary.switches_with_addrs), (3, 2));
        assert!(
            report
                .summary
                .to_string()
                .contains("addrs          3   switch addresses (name path-trace hops), on 2 of 3 switches")
        );
        let notes: Vec<String> = report.findings.iter().map(ToString::to_string).collect();
        assert!(
            notes.iter().any(|n| n.starts_with("note: 1 switch(es) have no `addrs`") && n.ends_with(": t1")),
            "{notes:#?}"
        );
    }
}
