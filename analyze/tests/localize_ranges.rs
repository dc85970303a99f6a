//! Localisation a range at a time (`localize_ranges`, what `analyze localize` runs) gives the
//! same output as over one table (`localize`), number for number: on the public examples and a
//! generated scenario of every fault kind, one window per range and a few windows per range,
//! and on an input large enough that the baselines are a strided sample.

use std::path::{Path, PathBuf};

use rocemesh_analyze::ingest::{Fields, ingest, plan};
use rocemesh_analyze::inspect::find_segments;
use rocemesh_analyze::localize::{Localization, Options, localize, localize_ranges};
use rocemesh_formats::scenario::{FaultKind, Scenario};

/// Simulates `s`; returns its directory (kept alive) and segment files.
fn simulate(s: &Scenario) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    rocemesh_testbeds::simulate(s, dir.path(), 0).unwrap();
    let files = find_segments(&[dir.path().join("segments")]).unwrap();
    assert!(!files.is_empty(), "{}: the simulator wrote no segment", s.name);
    (dir, files)
}

/// The two outputs as JSON, so that every number (and every evidence text) is compared.
fn json(l: &Localization) -> serde_json::Value {
    serde_json::to_value(l).unwrap()
}

/// Asserts that ranges of at most `budget` records give the one-table output; returns the
/// number of ranges, and the records.
fn same_by_ranges(files: &[PathBuf], window_s: u64, budget: usize, whole: &serde_json::Value, what: &str) -> usize {
    let opts = Options { window_s, ..Options::default() };
    let mut p = plan(files, Fields::All, None, window_s * 1_000_000_000);
    let ranges = p.ranges(budget);
    let n = ranges.len();
    let ranged = localize_ranges(&mut p, ranges, &opts);
    assert_eq!(p.records_read(), p.records(), "{what}: every record read in the last pass");
    let ds = p.finish();
    assert!(ds.problems.is_empty(), "{what}: {:?}", ds.problems);
    let ranged = json(&ranged);
    if &ranged != whole {
        // The first field that differs, not two pages of JSON.
        let (a, b) = (whole.as_object().unwrap(), ranged.as_object().unwrap());
        let field = a.keys().find(|k| a[*k] != b[*k]).cloned().unwrap_or_default();
        panic!(
            "{what}, {n} ranges of at most {budget} records: `{field}` differs\none table: {}\nranges:    {}",
            a[&field], b[&field]
        );
    }
    n
}

/// One table, then ranges of one window, then ranges of about a quarter of the records.
fn check(s: &Scenario) -> (usize, u64) {
    let (_dir, files) = simulate(s);
    let ds = ingest(&files, false);
    assert!(ds.problems.is_empty(), "{}: {:?}", s.name, ds.problems);
    let whole = localize(&ds, &Options { window_s: s.window_s, ..Options::default() });
    let records = ds.probes.len();
    assert!(records > 0 && whole.windows > 2, "{}: {} records over {} windows", s.name, records, whole.windows);
    let whole = json(&whole);
    let one = same_by_ranges(&files, s.window_s, 1, &whole, &s.name);
    assert_eq!(one as u64, whole["windows"].as_u64().unwrap(), "{}: one window per range", s.name);
    let few = same_by_ranges(&files, s.window_s, records / 4, &whole, &s.name);
    assert!(few > 1 && few < one, "{}: {few} ranges of about a quarter", s.name);
    (records, whole["findings"].as_array().map_or(0, Vec::len) as u64)
}

#[test]
fn public_examples_localise_the_same_a_range_at_a_time() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testbeds/scenarios");
    let mut checked = 0;
    for name in ["host-stall-only", "link-flap", "one-dead-rnic", "tor-loss"] {
        let p = dir.join(format!("{name}.toml"));
        let s = Scenario::load(&p).unwrap_or_else(|e| panic!("{}: {e}; restore the public scenarios", p.display()));
        let (records, findings) = check(&s);
        println!("{name}: {records} records, {findings} findings: same");
        checked += 1;
    }
    assert_eq!(checked, 4);
}

#[test]
fn every_fault_kind_localises_the_same_a_range_at_a_time() {
    let mut findings = 0;
    for i in 0..FaultKind::ALL.len() as u64 {
        let s = rocemesh_testbeds::suite::generate(5, i);
        let (records, n) = check(&s);
        println!("{}: {records} records, {n} findings: same", s.name);
        findings += n;
    }
    assert!(findings > 0, "the suite's faults must give findings to compare");
}

/// Over 400,000 records the baselines sample every second ok probe or fewer, by position in the
/// whole input: a range must sample the same probes.
#[test]
fn a_strided_baseline_sample_is_the_same_a_range_at_a_time() {
    let text = r#"
version = 1
name = "strided: 4 ToRs x 16 hosts"
seed = 3
duration_s = 300
window_s = 10

[topology]
spines = 2
tors = 4
hosts_per_tor = 16

[probing]
tor_mesh_pps = 10
inter_tor_tors = 3
inter_tor_pps = 10
flow_labels = 4
timeout_ms = 500

[normal]
network_rtt_us = { p50 = 4.0, p99 = 12.0 }
prober_delay_us = { p50 = 2.0, p99 = 15.0 }
responder_delay_us = { p50 = 1.0, p99 = 6.0 }
loss = 1e-5

[[fault]]
kind = "link_loss"
target = "tor1|spine0"
start_s = 100
end_s = 200
loss = 0.05
"#;
    let s = Scenario::parse(text, Path::new("inline.toml")).unwrap();
    let (records, findings) = check(&s);
    println!("{}: {records} records, {findings} findings: same", s.name);
    assert!(records >= 400_000, "{records} records: too few for a strided sample");
    assert!(findings > 0);
}
