//! Localisation accuracy on scenarios it was not tuned on: the four public examples and a
//! generated suite (random topologies of 2 to 64 RNICs per ToR, every fault kind, overlapping
//! faults, both timestamp models, several seeds), simulated, localised and scored by the
//! scenarios README's rules. Prints the per-kind table; fails below the bars of issue 6.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rocemesh_analyze::ingest::{ingest, ingest_windows};
use rocemesh_analyze::inspect::find_segments;
use rocemesh_analyze::localize::{Options, localize, localize_windows};
use rocemesh_formats::scenario::{Fault, FaultKind, Scenario};
use rocemesh_testbeds::score::{FaultScore, Finding, Score, on_host, score};

// Issue 17's bar, over a suite in which half the faults are faint (0.1-1% loss, RTT up by 2-10x
// the fleet's p99, 1-2 s flaps).
const MIN_PRECISION: f64 = 0.98;
const MIN_RECALL: f64 = 0.95;

fn run(s: &Scenario) -> (Score, Vec<Finding>) {
    run_with(s, s.window_s)
}

/// Simulates `s` and localises it with `window_s` windows (the scenario's own for scoring).
fn run_with(s: &Scenario, window_s: u64) -> (Score, Vec<Finding>) {
    run_both(s, window_s, false).0
}

/// Simulates `s` (with window summaries, as `testbeds simulate` writes them) and localises it
/// from the records and, when `summaries`, from the summaries too (else that result is empty).
/// A scenario's score and the findings scored.
type Scored = (Score, Vec<Finding>);

fn run_both(s: &Scenario, window_s: u64, summaries: bool) -> (Scored, Option<Scored>) {
    let dir = tempfile::tempdir().unwrap();
    rocemesh_testbeds::simulate(s, dir.path(), 0).unwrap();
    let files = find_segments(&[dir.path().join("segments")]).unwrap();
    let opts = Options { window_s, ..Options::default() };
    let scored = |findings: Vec<rocemesh_analyze::localize::Finding>| {
        let found: Vec<Finding> = findings
            .into_iter()
            .map(|f| Finding { kind: f.kind, entity: f.entity, start_ns: f.start_ns, end_ns: f.end_ns })
            .collect();
        (score(s, &found), found)
    };
    let ds = ingest(&files, false);
    assert!(ds.problems.is_empty(), "{:?}", ds.problems);
    let records = scored(localize(&ds, &opts).findings);
    if !summaries {
        return (records, None);
    }
    let (ds, w) = ingest_windows(&files, None, window_s * 1_000_000_000);
    assert!(ds.problems.is_empty(), "{:?}", ds.problems);
    assert_eq!(w.files_folded, 0, "the simulator summarises every file");
    (records, Some(scored(localize_windows(&ds, &w, &opts).findings)))
}

#[derive(Default)]
struct KindRow {
    faults: u32,
    found: u32,
    /// Network findings on the host of a host-only fault (stall, restart, clock step).
    blamed_network: u32,
    /// Seconds from the fault's onset to the end of the first window that names it.
    to_finding_s: Vec<f64>,
}

impl KindRow {
    fn line(&self, label: &str, expects: bool) -> String {
        let (found, recall) = if expects {
            (self.found.to_string(), format!("{:.3}", f64::from(self.found) / f64::from(self.faults.max(1))))
        } else {
            ("-".into(), "-".into())
        };
        let mut t = self.to_finding_s.clone();
        t.sort_by(f64::total_cmp);
        let (median, max) = match t.len() {
            0 => ("-".into(), "-".into()),
            n => (format!("{:.0}", t[n / 2]), format!("{:.0}", t[n - 1])),
        };
        format!(
            "{label:<30} {:>6} {found:>6} {recall:>7} {median:>10} {max:>7} {:>8}",
            self.faults, self.blamed_network
        )
    }
}

/// How long after `f`'s onset the first matching finding's first window ended, seconds (its
/// findings' start is the start of a window of `window_s`).
fn to_finding_s(s: &Scenario, f: &FaultScore, fault: &Fault, found: &[Finding], window_s: u64) -> Option<f64> {
    let onset_ns = (s.start_unix_s as f64 + fault.start_s) * 1e9;
    f.matched_by
        .iter()
        .map(|&i| (found[i].start_ns + window_s * 1_000_000_000) as f64 - onset_ns)
        .min_by(f64::total_cmp)
        .map(|ns| ns / 1e9)
}

/// The scenario files in `dir`, sorted. A test that finds no input must fail rather than pass
/// having checked nothing, so a missing, unreadable or empty directory is an error naming it.
fn scenario_paths(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "{}: cannot read the public scenarios ({e}); they ship with the repository: restore them",
            dir.display()
        )
    })?;
    let mut paths = Vec::new();
    for e in entries {
        let p = e.map_err(|e| format!("{}: cannot list ({e})", dir.display()))?.path();
        if p.extension().is_some_and(|e| e == "toml") {
            paths.push(p);
        }
    }
    if paths.is_empty() {
        return Err(format!("{}: no *.toml scenario in it; restore the public scenarios", dir.display()));
    }
    paths.sort();
    Ok(paths)
}

/// `ROCEMESH_SUITE_SEEDS` (`9,10`), or the default seeds when it is unset. A value that is not a
/// seed is an error naming it: dropping it would score fewer seeds than asked for and still pass.
fn suite_seeds(var: Option<&str>) -> Result<Vec<u64>, String> {
    let Some(v) = var else { return Ok(vec![1, 2, 3, 4]) };
    // An empty value splits into one empty field, which is refused like any other non-number.
    v.split(',')
        .map(|s| {
            s.trim().parse().map_err(|_| {
                format!(
                    "ROCEMESH_SUITE_SEEDS={v:?}: {:?} is not a seed; give comma-separated integers, e.g. 9,10",
                    s.trim()
                )
            })
        })
        .collect()
}

#[test]
fn public_scenarios_are_localised() {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../testbeds/scenarios");
    let paths = scenario_paths(&dir).unwrap_or_else(|e| panic!("{e}"));
    for p in paths {
        let s = Scenario::load(&p).unwrap();
        let (sc, _) = run(&s);
        println!("{}\n{}", p.display(), sc.render());
        assert_eq!((sc.precision(), sc.recall()), (1.0, 1.0), "{}", p.display());
    }
}

#[test]
fn a_missing_or_empty_scenario_directory_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("scenarios");
    let e = scenario_paths(&missing).unwrap_err();
    assert!(e.contains(&missing.display().to_string()), "{e}");
    std::fs::create_dir(&missing).unwrap();
    std::fs::write(missing.join("README.md"), "not a scenario").unwrap();
    let e = scenario_paths(&missing).unwrap_err();
    assert!(e.contains(&missing.display().to_string()) && e.contains("no *.toml"), "{e}");
}

#[test]
fn an_unparsable_or_empty_seed_list_fails() {
    assert_eq!(suite_seeds(None), Ok(vec![1, 2, 3, 4]));
    assert_eq!(suite_seeds(Some(" 9, 10")), Ok(vec![9, 10]));
    let e = suite_seeds(Some("9,1O")).unwrap_err();
    assert!(e.contains("\"1O\" is not a seed"), "{e}");
    assert!(suite_seeds(Some("9,")).unwrap_err().contains("\"\" is not a seed"));
    assert!(suite_seeds(Some("")).is_err());
}

/// One evidence's scores over the suite: the per-kind and per-band table, and the totals.
#[derive(Default)]
struct Tables {
    rows: BTreeMap<FaultKind, KindRow>,
    bands: BTreeMap<(FaultKind, &'static str), KindRow>,
    net: usize,
    matching: usize,
    expecting: usize,
    found: usize,
    failures: String,
}

impl Tables {
    fn add(&mut self, s: &Scenario, sc: &Score, findings: &[Finding]) {
        self.net += sc.network_findings;
        self.matching += sc.matching_network_findings;
        self.expecting += sc.faults_expecting;
        self.found += sc.faults_found;
        for f in &sc.faults {
            let fault = &s.faults[f.index];
            let band = rocemesh_testbeds::suite::band(s, fault);
            for row in [self.rows.entry(f.kind).or_default(), self.bands.entry((f.kind, band)).or_default()] {
                row.faults += 1;
                if f.expects_network && !f.matched_by.is_empty() {
                    row.found += 1;
                    row.to_finding_s.extend(to_finding_s(s, f, fault, findings, s.window_s));
                }
            }
            if !f.expects_network {
                let host = s.topology.entity(&f.target).and_then(|e| match e {
                    rocemesh_formats::scenario::Entity::Host(h) => Some(h),
                    _ => None,
                });
                let blamed = findings.iter().filter(|x| {
                    matches!(x.kind.as_str(), "rnic" | "tor" | "link" | "spine")
                        && host.is_some_and(|h| on_host(s, &x.entity, h))
                });
                let n = blamed.count() as u32;
                self.rows.entry(f.kind).or_default().blamed_network += n;
                self.bands.entry((f.kind, band)).or_default().blamed_network += n;
            }
        }
        if sc.precision() < 1.0 || sc.recall() < 1.0 {
            self.failures.push_str(&format!("--- {} ({:?})\n{}", s.name, s.topology, sc.render()));
            for f in &s.faults {
                self.failures.push_str(&format!("    truth: {f:?}\n"));
            }
        }
    }

    fn precision(&self) -> f64 {
        if self.net == 0 { 1.0 } else { self.matching as f64 / self.net as f64 }
    }

    fn recall(&self) -> f64 {
        if self.expecting == 0 { 1.0 } else { self.found as f64 / self.expecting as f64 }
    }

    /// Prints the failures, the table and the totals, headed by `what`.
    fn print(&self, what: &str, seeds: &[u64]) {
        println!("=== localised from {what}\n{}", self.failures);
        let header = format!(
            "{:<30} {:>6} {:>6} {:>7} {:>10} {:>7} {:>8}",
            "fault kind / band", "faults", "found", "recall", "to find s", "max s", "blamed"
        );
        println!("{header}\n(to find: onset to the end of the first window naming it, median and max)");
        for (k, r) in &self.rows {
            println!("{}", r.line(k.name(), k.expected_finding().is_some()));
            for ((_, band), b) in self.bands.range((*k, "")..).take_while(|((bk, _), _)| bk == k) {
                if *band != "-" {
                    println!("{}", b.line(&format!("  {band}"), k.expected_finding().is_some()));
                }
            }
        }
        println!(
            "suite seeds {seeds:?}, from {what}: precision {:.3} ({}/{}), recall {:.3} ({}/{})",
            self.precision(),
            self.matching,
            self.net,
            self.recall(),
            self.found,
            self.expecting
        );
    }
}

/// The generated suite, localised from the records and from the window summaries of the same
/// simulated files (issue 35: the summaries must score no lower, at the same bar).
#[test]
fn generated_suite_meets_the_bar() {
    let var = match std::env::var("ROCEMESH_SUITE_SEEDS") {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(e) => panic!("ROCEMESH_SUITE_SEEDS: {e}; give comma-separated integers, e.g. 9,10"),
    };
    let seeds = suite_seeds(var.as_deref()).unwrap_or_else(|e| panic!("{e}"));
    let (mut records, mut summaries) = (Tables::default(), Tables::default());
    for &seed in &seeds {
        for i in 0..FaultKind::ALL.len() as u64 {
            let s = rocemesh_testbeds::suite::generate(seed, i);
            let (r, w) = run_both(&s, s.window_s, true);
            records.add(&s, &r.0, &r.1);
            let w = w.expect("asked for");
            summaries.add(&s, &w.0, &w.1);
        }
    }
    records.print("records", &seeds);
    summaries.print("window summaries", &seeds);
    for (what, t) in [("records", &records), ("window summaries", &summaries)] {
        assert!(
            t.precision() >= MIN_PRECISION && t.recall() >= MIN_RECALL,
            "from {what}, below the bar: precision {:.3}, recall {:.3}",
            t.precision(),
            t.recall()
        );
    }
    assert!(
        summaries.precision() >= records.precision() && summaries.recall() >= records.recall(),
        "window summaries score lower than the records: precision {:.3} against {:.3}, recall {:.3} against {:.3}",
        summaries.precision(),
        records.precision(),
        summaries.recall(),
        records.recall()
    );
}

/// Issue 17: with 10 s windows, a dead RNIC, a dead ToR and a dead link are named in the window
/// that holds their onset, on every generated scenario that has one.
#[test]
fn dead_elements_are_named_in_the_window_of_their_onset() {
    const WINDOW_S: u64 = 10;
    let mut checked = Vec::new();
    let mut late = Vec::new();
    for seed in 1..=4u64 {
        for kind in [FaultKind::RnicDown, FaultKind::TorDown, FaultKind::LinkLoss] {
            let i = FaultKind::ALL.iter().position(|k| *k == kind).unwrap() as u64;
            let mut s = rocemesh_testbeds::suite::generate(seed, i);
            // The primary fault, dead for good, alone: onset timing is what is measured.
            s.faults.truncate(1);
            if kind == FaultKind::LinkLoss {
                s.faults[0].loss = Some(1.0);
            }
            let (sc, found) = run_with(&s, WINDOW_S);
            let f = &sc.faults[0];
            let onset_window = (s.start_unix_s as f64 + s.faults[0].start_s) as u64 / WINDOW_S;
            let first = f.matched_by.iter().map(|&m| found[m].start_ns / 1_000_000_000 / WINDOW_S).min();
            checked.push(format!("{} {}: onset window {onset_window}, named in {first:?}", kind.name(), f.target));
            if first != Some(onset_window) {
                late.push(checked.last().cloned().unwrap_or_default());
            }
        }
    }
    println!("{}", checked.join("\n"));
    assert_eq!(checked.len(), 12);
    assert!(late.is_empty(), "named after the window of their onset:\n{}", late.join("\n"));
}

/// Real agents do not trace paths. In a fabric where two ToRs share one spine, the inventory
/// alone gives the path, and a lossy uplink is still found as the link (the soft-RoCE testbed's
/// case): without the inventory the same data can only blame RNICs and ToRs.
#[test]
fn single_spine_uplink_loss_is_found_from_the_inventory_without_traces() {
    let text = r#"
version = 1
name = "uplink loss, one spine, no path traces"
seed = 11
duration_s = 180
window_s = 30

[topology]
spines = 1
tors = 3
hosts_per_tor = 3

[probing]
tor_mesh_pps = 10
inter_tor_tors = 2
inter_tor_pps = 2
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
loss = 0.2
start_s = 60
end_s = 120
"#;
    let s = Scenario::parse(text, Path::new("inline.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    rocemesh_testbeds::simulate(&s, dir.path(), 0).unwrap();
    let files = find_segments(&[dir.path().join("segments")]).unwrap();
    let mut ds = ingest(&files, false);
    ds.paths.clear();
    let opts = Options { window_s: s.window_s, ..Options::default() };
    let findings = |ds: &rocemesh_analyze::ingest::Dataset| -> Vec<Finding> {
        localize(ds, &opts)
            .findings
            .into_iter()
            .map(|f| Finding { kind: f.kind, entity: f.entity, start_ns: f.start_ns, end_ns: f.end_ns })
            .collect()
    };
    let blind = findings(&ds);
    assert!(!blind.iter().any(|f| f.kind == "link"), "no path, no link vote: {blind:?}");
    let inv = rocemesh_formats::inventory::Inventory::load(dir.path().join("inventory.toml")).unwrap();
    assert_eq!(ds.add_single_paths(&inv), 6, "3 ToRs: 6 ordered pairs, all through spine0");
    let found = findings(&ds);
    let sc = score(&s, &found);
    println!("{}", sc.render());
    assert_eq!((sc.precision(), sc.recall()), (1.0, 1.0), "{found:?}");
}
