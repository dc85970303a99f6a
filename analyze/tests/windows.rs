//! Localisation from window summaries (issue 35): the writer's summaries and the same records
//! folded by analyze give the same counters, hence the same output; both name what the records
//! name; `analyze localize` says which it counted from, and `--evidence records` reads none.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use rocemesh_analyze::ingest::{ingest, ingest_windows};
use rocemesh_analyze::localize::{Localization, Options, localize, localize_windows};
use serde_json::Value;

const WINDOW_S: u64 = 30;

fn files(per_agent: Vec<Vec<PathBuf>>) -> Vec<PathBuf> {
    per_agent.into_iter().flatten().collect()
}

/// The JSON of `l` without what says how it was read.
fn counted(l: &Localization) -> Value {
    let mut v = serde_json::to_value(l).expect("serialises");
    v.as_object_mut().expect("an object").remove("evidence");
    v
}

fn findings(l: &Localization) -> Vec<(String, String, u64, Option<u64>)> {
    l.findings.iter().map(|f| (f.kind.clone(), f.entity.clone(), f.start_ns, f.end_ns)).collect()
}

#[test]
fn summaries_and_folded_records_count_alike_and_name_what_the_records_name() {
    let dir = tempfile::tempdir().unwrap();
    let with = files(common::write_agents_summarised(&dir.path().join("with"), 5_000_000_000));
    let without = files(common::write_agents_summarised(&dir.path().join("without"), 0));
    let opts = Options { window_s: WINDOW_S, ..Options::default() };
    let window_ns = WINDOW_S * 1_000_000_000;

    let (ds, w) = ingest_windows(&with, None, window_ns);
    assert!(ds.problems.is_empty(), "{:?}", ds.problems);
    assert_eq!((w.files_summarised, w.files_folded), (with.len(), 0));
    let from_summaries = localize_windows(&ds, &w, &opts);
    assert_eq!(from_summaries.evidence.from, "window_summaries");

    let (ds, w) = ingest_windows(&without, None, window_ns);
    assert_eq!((w.files_summarised, w.files_folded), (0, without.len()), "no summaries: every file folded");
    let folded = localize_windows(&ds, &w, &opts);
    assert_eq!(counted(&from_summaries), counted(&folded), "the writer's summaries and analyze's folding differ");

    let records = localize(&ingest(&with, false), &opts);
    assert_eq!(records.evidence.from, "records");
    assert_eq!(findings(&from_summaries), findings(&records));
    assert!(!records.findings.is_empty(), "the fixture's dead pair and services leave something to name");
    assert_eq!(from_summaries.records, records.records);
    assert_eq!(from_summaries.windows, records.windows);
    let (a, b) = (&from_summaries.not_evidence, &records.not_evidence);
    assert_eq!(
        (&a.local_drop_by_prober, a.invalid, a.refused, a.unknown_outcome, a.unknown_rnic),
        (&b.local_drop_by_prober, b.invalid, b.refused, b.unknown_outcome, b.unknown_rnic)
    );
    // Services: the same connections, graded alike, their loss exact; p99 within a bucket.
    assert_eq!(from_summaries.services.len(), records.services.len());
    for (s, r) in from_summaries.services.iter().zip(&records.services) {
        assert_eq!((&s.name, s.grade, s.probes, s.lost, s.windows), (&r.name, r.grade, r.probes, r.lost, r.windows));
        let (ps, pr) = (s.rtt_ns_p99.unwrap_or(0) as f64, r.rtt_ns_p99.unwrap_or(0) as f64);
        assert!((ps - pr).abs() <= pr / 64.0 + 1.0, "{ps} against {pr}");
    }
}

/// A summary window that does not divide the analysis window cannot be summed into it: that
/// file's records are folded instead.
#[test]
fn summaries_that_do_not_divide_the_window_are_folded_from_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let with = files(common::write_agents_summarised(dir.path(), 20_000_000_000));
    let (_, w) = ingest_windows(&with, None, WINDOW_S * 1_000_000_000);
    assert_eq!((w.files_summarised, w.files_folded), (0, with.len()));
    let (_, w) = ingest_windows(&with, None, 60_000_000_000);
    assert_eq!((w.files_summarised, w.files_folded), (with.len(), 0));
}

fn analyze(args: &[&str], dir: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).arg(dir).output().expect("run analyze");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn localize_says_what_it_counted_from() {
    let dir = tempfile::tempdir().unwrap();
    let with = dir.path().join("with");
    let without = dir.path().join("without");
    common::write_agents_summarised(&with, 5_000_000_000);
    common::write_agents_summarised(&without, 0);
    let n = std::fs::read_dir(&with)
        .unwrap()
        .flatten()
        .map(|h| std::fs::read_dir(h.path()).unwrap().count())
        .sum::<usize>();
    let line = format!("counted from the window summaries of {n} files (values within 1/64");
    let (code, table) = analyze(&["localize"], &with);
    assert_eq!(code, 0);
    assert!(table.contains(&line), "auto, with summaries: {table}");
    let (code, table) = analyze(&["localize", "--evidence", "records"], &with);
    assert_eq!(code, 0);
    assert!(!table.contains("counted from the window summaries"), "{table}");
    let (_, table) = analyze(&["localize"], &without);
    assert!(!table.contains("counted from the window summaries"), "auto, without summaries: the records: {table}");
    let (_, json) = analyze(&["localize", "--evidence", "summaries", "--format", "json"], &without);
    let v: Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(v["evidence"]["from"], "window_summaries");
    assert_eq!(v["evidence"]["files_summarised"], 0);
    assert_eq!(v["evidence"]["files_folded"].as_u64(), Some(n as u64));
}

/// The page's findings (the spans on its time axis), and the line saying what they were counted
/// from.
fn page_findings(dir: &Path, evidence: &str) -> (Value, String) {
    let page = dir.join(format!("page-{evidence}.html"));
    let out = Command::new(env!("CARGO_BIN_EXE_analyze"))
        .args(["html", "--window-s", "30", "--evidence", evidence, "--output"])
        .arg(&page)
        .arg(dir.join("with"))
        .output()
        .expect("run analyze");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).expect("the page");
    let spans = html.split("const SPANS = ").nth(1).and_then(|s| s.split(";\n").next()).expect("the spans");
    let counted = html.split("<h2>Findings</h2><p>").nth(1).and_then(|s| s.split("</p>").next()).expect("the line");
    (serde_json::from_str(spans).expect("spans are JSON"), counted.to_owned())
}

#[test]
fn html_localises_from_summaries_as_localize_does() {
    let dir = tempfile::tempdir().unwrap();
    common::write_agents_summarised(&dir.path().join("with"), 5_000_000_000);
    let (auto, said) = page_findings(dir.path(), "auto");
    assert!(said.starts_with("counted from the window summaries of "), "{said}");
    let (records, said) = page_findings(dir.path(), "records");
    assert_eq!(said, "counted from the records.");
    assert!(auto.as_array().is_some_and(|a| !a.is_empty()), "the fixture leaves something to name: {auto}");
    assert_eq!(auto, records, "the same findings either way");
}
