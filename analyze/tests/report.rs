//! `analyze report`, `export` and `html` end to end: hand-built segments with known records
//! (several pairs, ToRs and windows; lost, partial, invalid, refused, unknown outcomes; a dead
//! peer; a pair whose only replies are partial; a self-probe; an RNIC without a ToR), every
//! number of every scope compared with a plain-Rust reference computed from the same records;
//! plus damaged input, exit codes, Parquet and HTML output.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use polars::prelude::*;
use rocemesh_analyze::ingest::{Fields, ingest};
use rocemesh_analyze::inspect::find_segments;
use rocemesh_analyze::report::{Sla, Span, prepare};
use rocemesh_formats::record::{Arrived, EndpointRole, Outcome, ProbeRecord, TsSource};
use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity};
use serde_json::Value;

mod common;
use common::Rng;

const WINDOW_NS: u64 = 30_000_000_000;
/// Not window-aligned on purpose: the first window is partly empty.
const T0: u64 = 1_700_000_010_000_000_000 + 7_000_000_000;

/// (name, tor) of every RNIC; "" = ToR unknown.
const RNICS: [(&str, &str); 6] = [
    ("ta-h0/mlx5_0", "tor-a"),
    ("ta-h1/mlx5_0", "tor-a"),
    ("ta-h2/mlx5_0", "tor-a"),
    ("tb-h0/mlx5_0", "tor-b"),
    ("tb-h1/mlx5_0", "tor-b"),
    ("x-h0/mlx5_0", ""),
];

/// What a pair's records look like in a window.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Mostly ok; every 23rd lost, every 11th partial, every 13th invalid, every 29th unknown.
    Mixed,
    /// Ok, but RTTs around 600 µs.
    Slow,
    /// Every record lost (a dead peer).
    Dead,
    /// Every record refused (agent down, host up).
    Refused,
    /// Lost 1 in 3, else ok.
    Lossy,
    /// No ok at all: half lost, half partial (alive, not unreachable).
    PartialOnly,
    /// Lost with a send error (nothing arrived) or ok.
    SendErrors,
}

/// (prober, target, behaviour per window 0..4, records per window).
fn plan() -> Vec<(usize, usize, [Behaviour; 4], u64)> {
    use Behaviour::*;
    vec![
        (0, 1, [Mixed, Mixed, Mixed, Mixed], 60),
        (0, 3, [Mixed, Slow, Mixed, Mixed], 40),
        (1, 4, [Mixed, Mixed, Dead, Mixed], 30),
        (2, 4, [Mixed, Mixed, Refused, Mixed], 20),
        (3, 2, [Lossy, Mixed, Lossy, Mixed], 50),
        (5, 0, [Mixed, PartialOnly, Mixed, Mixed], 25),
        (5, 5, [Mixed, Mixed, Mixed, Mixed], 10),
        (4, 3, [SendErrors, Mixed, Mixed, Dead], 33),
        (1, 0, [Mixed, Mixed, Mixed, Mixed], 45),
    ]
}

/// A record as the reference sees it.
#[derive(Clone, Debug)]
struct Rec {
    window: u64,
    prober: usize,
    target: usize,
    outcome: u8,
    arrived: u8,
    rtt: i32,
    pd: i32,
    rd: i32,
}

/// Writes one segment directory per prober and returns every record written.
fn write_fleet(dir: &Path) -> Vec<Rec> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut by_prober: BTreeMap<usize, Vec<(u64, usize, ProbeRecord)>> = BTreeMap::new();
    let mut all = Vec::new();
    for (prober, target, behaviours, per_window) in plan() {
        for (w, b) in behaviours.iter().enumerate() {
            for i in 0..per_window {
                // Spread over the window; window 0 starts 7 s late (T0 is not aligned).
                let start = (T0 / WINDOW_NS + w as u64) * WINDOW_NS;
                let from = start.max(T0);
                let t1 = from + (rng.next() % (start + WINDOW_NS - from));
                let mut rtt = 2_000 + (rng.next() % 20_000) as i32;
                let pd = 500 + (rng.next() % 9_000) as i32;
                let rd = 300 + (rng.next() % 4_000) as i32;
                let (outcome, arrived) = match b {
                    Behaviour::Mixed if i % 29 == 5 => (7, Arrived::ALL.0),
                    Behaviour::Mixed if i % 23 == 3 => (Outcome::Lost as u8, Arrived::PROBE_SENT),
                    Behaviour::Mixed if i % 11 == 4 => (Outcome::Lost as u8, Arrived::PROBE_SENT | Arrived::ACK1),
                    Behaviour::Mixed if i % 13 == 6 => (Outcome::Invalid as u8, Arrived::ALL.0),
                    Behaviour::Mixed => (Outcome::Ok as u8, Arrived::ALL.0),
                    Behaviour::Slow => {
                        rtt = 550_000 + (rng.next() % 100_000) as i32;
                        (Outcome::Ok as u8, Arrived::ALL.0)
                    }
                    Behaviour::Dead => (Outcome::Lost as u8, Arrived::PROBE_SENT),
                    Behaviour::Refused => (Outcome::Refused as u8, Arrived::PROBE_SENT),
                    Behaviour::Lossy if i % 3 == 0 => (Outcome::Lost as u8, Arrived::PROBE_SENT),
                    Behaviour::Lossy => (Outcome::Ok as u8, Arrived::ALL.0),
                    Behaviour::PartialOnly if i % 2 == 0 => (Outcome::Lost as u8, Arrived::PROBE_SENT),
                    Behaviour::PartialOnly => (Outcome::Lost as u8, Arrived::PROBE_SENT | Arrived::ACK1),
                    Behaviour::SendErrors if i % 4 == 0 => (Outcome::Lost as u8, 0),
                    Behaviour::SendErrors => (Outcome::Ok as u8, Arrived::ALL.0),
                };
                if outcome != Outcome::Ok as u8 && outcome != Outcome::Invalid as u8 {
                    rtt = 0;
                }
                let r = ProbeRecord {
                    t1_unix_ns: t1,
                    seq: i,
                    network_rtt_ns: rtt,
                    prober_delay_ns: pd,
                    responder_delay_ns: rd,
                    prober: 0,
                    target: 0,
                    flow_label: 7,
                    responder_epoch: 1,
                    kind: 0,
                    outcome,
                    arrived,
                    ts_source: TsSource::KernelSoftware as u8,
                };
                by_prober.entry(prober).or_default().push((t1, target, r));
                all.push(Rec { window: t1 / WINDOW_NS, prober, target, outcome, arrived, rtt, pd, rd });
            }
        }
    }
    for (prober, mut recs) in by_prober {
        recs.sort_by_key(|r| r.0);
        let (name, tor) = RNICS[prober];
        let (host, device) = name.split_once('/').expect("host/device");
        let mut cfg = WriterConfig::new(dir.join(host));
        cfg.chunk_records = 64;
        let id = WriterIdentity {
            host: host.into(),
            device: device.into(),
            tor: tor.into(),
            agent_epoch: 1,
            tool: "report-test".into(),
        };
        let mut w = SegmentWriter::new(cfg, id).expect("writer");
        let me = w.endpoint(EndpointRole::Rnic, name, tor, [0; 16]);
        // Define targets in reverse order so that segment ids differ from fleet ids.
        let mut ids = BTreeMap::new();
        for t in (0..RNICS.len()).rev() {
            if t != prober && recs.iter().any(|r| r.1 == t) {
                ids.insert(t, w.endpoint(EndpointRole::Rnic, RNICS[t].0, RNICS[t].1, [0; 16]));
            }
        }
        ids.insert(prober, me);
        for (_, t, mut r) in recs {
            r.prober = me;
            r.target = ids[&t];
            w.append(&r).expect("append");
        }
        w.finish().expect("finish");
    }
    all
}

/// Nearest rank: the value at 1-based rank ceil(q n) (the report's documented definition).
fn quantile(v: &mut [i32], q: f64) -> Option<i64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let idx = ((v.len() as f64 * q).ceil() - 1.0).max(0.0) as usize;
    Some(i64::from(v[idx.min(v.len() - 1)]))
}

/// A reference row: the counts, loss ratio and quantiles in the report's field names.
type RefRow = BTreeMap<&'static str, Value>;

fn tor_of(i: usize) -> &'static str {
    if RNICS[i].1.is_empty() { "(no tor)" } else { RNICS[i].1 }
}

/// The report computed the obvious way: pair counts per window with the unreachable rule, then
/// every scope's entities by membership. `whole` = one bucket for all windows.
fn reference(recs: &[Rec], sla: &Sla, whole: bool) -> BTreeMap<(u64, String, String), RefRow> {
    // (window, prober, target) -> [probes, ok, lost_raw, partial, invalid, refused]
    let mut pairs: BTreeMap<(u64, usize, usize), [u64; 6]> = BTreeMap::new();
    for r in recs {
        let c = pairs.entry((r.window, r.prober, r.target)).or_default();
        c[0] += 1;
        match (r.outcome, r.arrived & Arrived::ACK1 != 0) {
            (0, _) => c[1] += 1,
            (1, false) => c[2] += 1,
            (1, true) => c[3] += 1,
            (2, _) => c[4] += 1,
            (3, _) => c[5] += 1,
            _ => {}
        }
    }
    let members = |scope: &str, p: usize, t: usize| -> Vec<String> {
        match scope {
            "cluster" => vec!["cluster".into()],
            "pair" => vec![format!("{}->{}", RNICS[p].0, RNICS[t].0)],
            "tor_pair" => vec![format!("{}->{}", tor_of(p), tor_of(t))],
            "rnic" => {
                let set: BTreeSet<String> = [RNICS[p].0.to_owned(), RNICS[t].0.to_owned()].into();
                set.into_iter().collect()
            }
            "tor" => {
                let set: BTreeSet<String> = [tor_of(p).to_owned(), tor_of(t).to_owned()].into();
                set.into_iter().collect()
            }
            _ => unreachable!(),
        }
    };
    let bucket = |w: u64| if whole { recs.iter().map(|r| r.window).min().unwrap_or(0) } else { w };
    let mut out: BTreeMap<(u64, String, String), RefRow> = BTreeMap::new();
    for scope in ["cluster", "tor_pair", "tor", "rnic", "pair"] {
        // (bucket, entity) -> [probes, ok, lost, partial, invalid, refused, unreachable]
        let mut counts: BTreeMap<(u64, String), [u64; 7]> = BTreeMap::new();
        for (&(w, p, t), c) in &pairs {
            let unreachable = if c[1] + c[3] == 0 { c[2] } else { 0 };
            let row = [c[0], c[1], c[2] - unreachable, c[3], c[4], c[5], unreachable];
            for e in members(scope, p, t) {
                let s = counts.entry((bucket(w), e)).or_default();
                for k in 0..7 {
                    s[k] += row[k];
                }
            }
        }
        let mut samples: BTreeMap<(u64, String), [Vec<i32>; 3]> = BTreeMap::new();
        for r in recs.iter().filter(|r| r.outcome == 0) {
            for e in members(scope, r.prober, r.target) {
                let s = samples.entry((bucket(r.window), e)).or_default();
                s[0].push(r.rtt);
                s[1].push(r.pd);
                s[2].push(r.rd);
            }
        }
        for ((w, e), c) in counts {
            let mut row = RefRow::new();
            for (k, name) in ["probes", "ok", "lost", "partial", "invalid", "refused", "unreachable"].iter().enumerate()
            {
                row.insert(name, Value::from(c[k]));
            }
            let den = c[1] + c[2] + c[3];
            let loss = (den > 0).then(|| c[2] as f64 / den as f64);
            row.insert("loss_ratio", loss.map_or(Value::Null, Value::from));
            let mut s = samples.remove(&(w, e.clone())).unwrap_or_default();
            let q = |v: &mut Vec<i32>, q: f64| quantile(v, q).map_or(Value::Null, Value::from);
            let p99 = quantile(&mut s[0], 0.99);
            row.insert("rtt_ns_p50", q(&mut s[0], 0.5));
            row.insert("rtt_ns_p99", q(&mut s[0], 0.99));
            row.insert("rtt_ns_p999", q(&mut s[0], 0.999));
            row.insert("prober_delay_ns_p50", q(&mut s[1], 0.5));
            row.insert("prober_delay_ns_p99", q(&mut s[1], 0.99));
            row.insert("responder_delay_ns_p50", q(&mut s[2], 0.5));
            row.insert("responder_delay_ns_p99", q(&mut s[2], 0.99));
            let mut v = Vec::new();
            if loss.is_some_and(|l| l > sla.loss_ratio) {
                v.push(Value::from("loss"));
            }
            if p99.is_some_and(|p| p as f64 > sla.rtt_p99_us * 1e3) {
                v.push(Value::from("rtt_p99"));
            }
            row.insert("sla_violations", Value::Array(v));
            row.insert("window_start_ns", Value::from(w * WINDOW_NS));
            out.insert((w * WINDOW_NS, scope.to_owned(), e), row);
        }
    }
    out
}

fn analyze(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).output().expect("run analyze")
}

fn fleet() -> (tempfile::TempDir, PathBuf, Vec<Rec>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg = dir.path().join("segments");
    let recs = write_fleet(&seg);
    (dir, seg, recs)
}

/// Compares report rows (JSON) with the reference, every field of every row.
fn compare(rows: &[Value], expected: &BTreeMap<(u64, String, String), RefRow>) {
    let mut seen = BTreeSet::new();
    for r in rows {
        let key = (
            r["window_start_ns"].as_u64().expect("window_start_ns"),
            r["scope"].as_str().expect("scope").to_owned(),
            r["entity"].as_str().expect("entity").to_owned(),
        );
        let want = expected.get(&key).unwrap_or_else(|| panic!("unexpected row {key:?}"));
        for (field, v) in want {
            match (v.as_f64(), r[*field].as_f64()) {
                // serde_json parses floats to within one ulp (no `float_roundtrip`); the counts
                // the ratio is made of are compared exactly.
                (Some(a), Some(b)) if *field == "loss_ratio" => {
                    assert!((a - b).abs() <= 1e-15 * a.abs().max(1e-300), "{key:?} {field}: {b} != {a}")
                }
                _ => assert_eq!(&r[*field], v, "{key:?} {field}"),
            }
        }
        assert!(seen.insert(key.clone()), "duplicate row {key:?}");
    }
    let missing: Vec<_> = expected.keys().filter(|k| !seen.contains(*k)).collect();
    assert!(missing.is_empty(), "rows missing from the report: {missing:?}");
}

#[test]
fn every_number_of_every_scope_matches_the_reference() {
    let (_dir, seg, recs) = fleet();
    let seg_s = seg.to_str().expect("utf-8 path");
    let out = analyze(&[
        "report",
        "--scope",
        "cluster,tor_pair,tor,rnic,pair",
        "--format",
        "json",
        "--sla-loss",
        "0.1",
        "--sla-rtt-p99-us",
        "500",
        seg_s,
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = doc["rows"].as_array().expect("rows");
    let sla = Sla { loss_ratio: 0.1, rtt_p99_us: 500.0 };
    let expected = reference(&recs, &sla, false);
    compare(rows, &expected);
    assert_eq!(doc["meta"]["records"], Value::from(recs.len()));

    // The planted cases are there, so the comparison above covered them.
    let row = |scope: &str, entity: &str, w: u64| {
        let start = (T0 / WINDOW_NS + w) * WINDOW_NS;
        rows.iter()
            .find(|r| r["scope"] == scope && r["entity"] == entity && r["window_start_ns"] == start)
            .unwrap_or_else(|| panic!("no row {scope} {entity} {w}"))
    };
    let dead = row("pair", "ta-h1/mlx5_0->tb-h1/mlx5_0", 2);
    assert_eq!((dead["unreachable"].as_u64(), dead["lost"].as_u64()), (Some(30), Some(0)));
    assert!(dead["loss_ratio"].is_null());
    let partial_only = row("pair", "x-h0/mlx5_0->ta-h0/mlx5_0", 1);
    assert_eq!(partial_only["unreachable"], 0, "partial replies prove the peer alive");
    assert!(partial_only["lost"].as_u64() > Some(0));
    assert_eq!(row("pair", "ta-h2/mlx5_0->tb-h1/mlx5_0", 2)["refused"], 20);
    assert_eq!(row("tor", "(no tor)", 0)["probes"], 35, "self-probe counted once, x-h0 -> ta-h0 once");
    assert_eq!(row("rnic", "x-h0/mlx5_0", 0)["probes"], 35);
    let slow = row("pair", "ta-h0/mlx5_0->tb-h0/mlx5_0", 1);
    assert_eq!(slow["sla_violations"], serde_json::json!(["rtt_p99"]));
    assert_eq!(row("pair", "tb-h0/mlx5_0->ta-h2/mlx5_0", 0)["sla_violations"], serde_json::json!(["loss"]));
    assert_eq!(slow["window_start"], rocemesh_analyze::inspect::utc(slow["window_start_ns"].as_u64().unwrap_or(0)));

    // Violations first.
    let first_clean = rows.iter().position(|r| r["sla_violations"].as_array().is_some_and(|v| v.is_empty()));
    let last_violation = rows.iter().rposition(|r| r["sla_violations"].as_array().is_some_and(|v| !v.is_empty()));
    assert!(last_violation.is_some());
    assert!(first_clean > last_violation, "violations are listed first");
}

#[test]
fn read_a_window_at_a_time_the_report_is_the_same() {
    // `--range-records 1` reads every window on its own (a window is never split), so every
    // file that spans several windows is read once per window and cut at its boundaries.
    let (_dir, seg, recs) = fleet();
    let seg_s = seg.to_str().expect("utf-8 path");
    let run = |range_records: &str| {
        let out = analyze(&[
            "report",
            "--scope",
            "cluster,tor_pair,tor,rnic,pair",
            "--format",
            "json",
            "--sla-loss",
            "0.1",
            "--range-records",
            range_records,
            seg_s,
        ]);
        assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (serde_json::from_slice::<Value>(&out.stdout).expect("json"), stderr)
    };
    let (whole, whole_err) = run("100000000");
    let (apart, apart_err) = run("1");
    let windows: std::collections::BTreeSet<u64> = recs.iter().map(|r| r.window).collect();
    assert!(windows.len() >= 3, "the fleet must span several windows: {windows:?}");
    assert!(whole_err.contains("; 1 ranges)"), "{whole_err}");
    assert!(apart_err.contains(&format!("; {} ranges)", windows.len())), "{apart_err}");
    assert_eq!(whole["meta"]["records"], Value::from(recs.len()));
    assert_eq!(whole["meta"], apart["meta"]);
    assert!(!whole["rows"].as_array().expect("rows").is_empty());
    assert_eq!(whole["rows"], apart["rows"], "same rows, same order");
}

/// `analyze` run on a live agent's directory: the open segment grows between the plan and the
/// read. The records it held when planned are read, on every pass, and no others; it is not
/// taken for a changed file.
#[test]
fn an_open_segment_that_grew_since_the_plan_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = WriterConfig::new(dir.path());
    cfg.chunk_records = 4;
    let id = WriterIdentity {
        host: "live-h0".into(),
        device: "mlx5_0".into(),
        tor: "tor-a".into(),
        agent_epoch: 1,
        tool: "report-test".into(),
    };
    let mut w = SegmentWriter::new(cfg, id).expect("writer");
    let me = w.endpoint(EndpointRole::Rnic, "live-h0/mlx5_0", "tor-a", [0; 16]);
    let peer = w.endpoint(EndpointRole::Rnic, "live-h1/mlx5_0", "tor-a", [1; 16]);
    let start = (T0 / WINDOW_NS + 1) * WINDOW_NS;
    let rec = |i: u64| ProbeRecord {
        t1_unix_ns: start + i * 100_000_000,
        seq: i,
        network_rtt_ns: 5_000,
        prober_delay_ns: 1_000,
        responder_delay_ns: 1_000,
        prober: me,
        target: peer,
        flow_label: 1,
        responder_epoch: 1,
        kind: 0,
        outcome: Outcome::Ok as u8,
        arrived: Arrived::ALL.0,
        ts_source: TsSource::KernelSoftware as u8,
    };
    for i in 0..8 {
        w.append(&rec(i)).expect("append");
    }
    w.flush().expect("flush");
    let files = find_segments(&[dir.path().to_path_buf()]).expect("list");
    assert_eq!(files.len(), 1, "{files:?}");
    let mut plan = rocemesh_analyze::ingest::plan(&files, Fields::Report, None, WINDOW_NS);
    assert_eq!(plan.records(), 8);
    // The agent goes on writing, in the same window and with a new dictionary entry.
    let third = w.endpoint(EndpointRole::Rnic, "live-h2/mlx5_0", "tor-a", [2; 16]);
    for i in 8..16 {
        w.append(&ProbeRecord { target: third, ..rec(i) }).expect("append");
    }
    w.flush().expect("flush");
    let mut read = 0;
    for (from, to) in plan.ranges(1) {
        read += plan.read(from, to).len();
    }
    // A second pass (localize and html read the ranges four times) sees the same records,
    // however much the file grew in between.
    for i in 16..24 {
        w.append(&ProbeRecord { target: third, ..rec(i) }).expect("append");
    }
    w.flush().expect("flush");
    plan.rewind();
    let mut again = 0;
    for (from, to) in plan.ranges(1) {
        again += plan.read(from, to).len();
    }
    let ds = plan.finish();
    assert!(ds.problems.iter().all(|p| !p.problem.contains("could not be read again")), "{:?}", ds.problems);
    assert_eq!((read, again), (8, 8), "the planned records are read, and only those");
    drop(w);
}

/// `Plan::each_range` (localize's passes) reads the next range while the stages count one: the
/// stages get every range in order with the records `read` gives, and a file gone before a
/// pass is said once, in the dataset by the time the stages count the range that missed it.
#[test]
fn ranges_read_ahead_come_in_order_and_a_gone_file_is_said_once() {
    ranges_in_order_and_a_gone_file_said_once();
}

/// Held to one thread, ranges are read and counted in turn: the same records and problems.
#[test]
fn ranges_read_in_turn_on_one_thread_come_as_read_ahead_gives_them() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
    pool.install(ranges_in_order_and_a_gone_file_said_once);
}

fn ranges_in_order_and_a_gone_file_said_once() {
    let (_dir, seg, _) = fleet();
    let files = find_segments(&[seg]).expect("list");
    let mut plan = rocemesh_analyze::ingest::plan(&files, Fields::Report, None, WINDOW_NS);
    let ranges = plan.ranges(1);
    assert!(ranges.len() > 2, "{ranges:?}");
    let one_at_a_time: Vec<Vec<u64>> = ranges.iter().map(|&(a, b)| plan.read(a, b).t1_unix_ns).collect();
    plan.rewind();
    let mut ahead = Vec::new();
    plan.each_range(&ranges, &mut |_, p| ahead.push(p.t1_unix_ns.clone()));
    assert_eq!(ahead, one_at_a_time, "the same records, range by range, in order");

    let gone = files[0].clone();
    let (first_ns, _) =
        rocemesh_formats::segment::SegmentReader::open(&gone).expect("open").time_range().expect("records");
    let missed = ranges.iter().position(|r| r.1 > first_ns).expect("a range holds its records");
    std::fs::remove_file(&gone).expect("remove");
    plan.rewind();
    let mut problems_seen = Vec::new();
    plan.each_range(&ranges, &mut |ds, _| problems_seen.push(ds.problems.len()));
    let ds = plan.finish();
    let said: Vec<_> = ds.problems.iter().filter(|p| p.problem.contains("could not be read again")).collect();
    assert_eq!(said.len(), 1, "said once: {:?}", ds.problems);
    assert_eq!(said[0].path, gone);
    // As a read of one range at a time says it: with the range that missed it, not before.
    assert!(problems_seen[missed] >= 1, "said by range {missed}: {problems_seen:?}");
    assert!(problems_seen[..missed].iter().all(|&n| n == 0), "not before range {missed}: {problems_seen:?}");
}

#[test]
fn a_file_gone_between_the_passes_is_said_and_not_counted() {
    let (_dir, seg, recs) = fleet();
    let files = find_segments(&[seg]).expect("list");
    let mut plan = rocemesh_analyze::ingest::plan(&files, Fields::Report, None, WINDOW_NS);
    assert_eq!(plan.records(), recs.len());
    let gone = &files[0];
    let gone_records: usize = rocemesh_formats::segment::SegmentReader::open(gone)
        .expect("open")
        .probe_chunks()
        .map(|c| c.t1_unix_ns.len())
        .sum();
    assert!(gone_records > 0);
    std::fs::remove_file(gone).expect("remove");
    let mut read = 0;
    for (from, to) in plan.ranges(1) {
        read += plan.read(from, to).len();
    }
    assert_eq!(read, recs.len() - gone_records);
    assert_eq!(plan.records_read(), read, "what the outputs count is what was read");
    let ds = plan.finish();
    assert!(
        ds.problems.iter().any(|p| p.path == *gone && p.problem.contains("could not be read again")),
        "{:?}",
        ds.problems
    );
}

#[test]
fn whole_range_rows_match_the_reference() {
    let (_dir, seg, recs) = fleet();
    let ds = ingest(&find_segments(&[seg]).expect("list"), false);
    assert!(ds.problems.is_empty(), "{:?}", ds.problems);
    let sla = Sla::default();
    let prepared = prepare(ds.probes, &ds.rnics, WINDOW_NS).expect("prepare");
    use rocemesh_analyze::report::Scope::*;
    let rows = prepared.rows(&[Cluster, TorPair, Tor, Rnic, Pair], Span::WholeRange, &sla).expect("rows");
    let rows: Vec<Value> = rows.iter().map(|r| serde_json::to_value(r).expect("json")).collect();
    compare(&rows, &reference(&recs, &sla, true));
}

#[test]
fn csv_table_and_parquet_carry_the_same_rows() {
    let (dir, seg, _recs) = fleet();
    let seg_s = seg.to_str().expect("utf-8");
    let json = analyze(&["report", "--format", "json", seg_s]);
    assert_eq!(json.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&json.stdout).expect("json");
    let n = doc["rows"].as_array().map_or(0, Vec::len);
    assert!(n > 0);
    // Default scopes only.
    assert!(
        doc["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|r| ["cluster", "tor", "rnic"].contains(&r["scope"].as_str().unwrap_or("")))
    );

    let csv = analyze(&["report", "--format", "csv", seg_s]);
    assert_eq!(csv.status.code(), Some(0));
    let text = String::from_utf8(csv.stdout).expect("utf-8");
    assert_eq!(text.lines().count(), n + 1);
    assert!(text.starts_with("window_start_ns,window_start,scope,entity,probes,ok,lost,partial,invalid,refused,unreachable,loss_ratio,rtt_ns_p50"));

    let table = analyze(&["report", seg_s]);
    assert_eq!(table.status.code(), Some(0));
    let text = String::from_utf8(table.stdout).expect("utf-8");
    assert!(text.contains("rtt p99") && text.contains("delays in µs"), "{text}");
    assert_eq!(text.lines().count(), n + 2, "summary, header, then one line per row");

    let pq = dir.path().join("report.parquet");
    let out = analyze(&["report", "--format", "parquet", "--output", pq.to_str().expect("utf-8"), seg_s]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let df = ParquetReader::new(std::fs::File::open(&pq).expect("open")).finish().expect("read parquet");
    assert_eq!(df.height(), n);
    assert_eq!(df.column("rtt_ns_p99").expect("column").dtype(), &DataType::Int64);

    let no_output = analyze(&["report", "--format", "parquet", seg_s]);
    assert_eq!(no_output.status.code(), Some(2), "parquet without --output is a usage error");
}

#[test]
fn damaged_and_foreign_files_are_reported_and_skipped() {
    let (_dir, seg, recs) = fleet();
    let junk = seg.join("ta-h0").join("0000-junk.rseg");
    std::fs::write(&junk, b"this is not a segment, just some bytes that happen to be here").expect("junk");
    let out = analyze(&["report", "--format", "json", "--scope", "cluster", seg.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "input problems exit 1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("0000-junk.rseg") && stderr.contains("skipped"), "{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("the report is still written");
    let probes: u64 = doc["rows"].as_array().into_iter().flatten().filter_map(|r| r["probes"].as_u64()).sum();
    assert_eq!(probes, recs.len() as u64, "the readable files are all counted");
    assert_eq!(doc["meta"]["problems"].as_array().map(Vec::len), Some(1));

    let empty = tempfile::tempdir().expect("tempdir");
    let out = analyze(&["report", empty.path().to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2), "no input is a usage error");
    let out = analyze(&["report", "--window-s", "0", seg.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2));
    let out = analyze(&["report", "--sla-loss", "2", seg.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2), "a loss ratio above 1 is refused");
}

#[test]
fn export_reads_back_with_every_probe() {
    // In one range, and a window at a time (each file cut at every window boundary).
    for range_records in ["100000000", "1"] {
        export_reads_back_with_every_probe_in_ranges_of(range_records);
    }
}

fn export_reads_back_with_every_probe_in_ranges_of(range_records: &str) {
    let (dir, seg, recs) = fleet();
    let pq = dir.path().join("probes.parquet");
    let out = analyze(&[
        "export",
        "--range-records",
        range_records,
        "--parquet",
        pq.to_str().expect("utf-8"),
        seg.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let df = ParquetReader::new(std::fs::File::open(&pq).expect("open")).finish().expect("read parquet");
    assert_eq!(df.height(), recs.len());
    // No file defines a service: the connection columns are not written at all.
    assert!(df.column("service").is_ok(), "the service column is always there");
    assert!(df.get_column_names().iter().all(|c| !c.starts_with("service_")), "{:?}", df.get_column_names());
    // Names and windows as the reference has them.
    let prober = df.column("prober").expect("prober").str().expect("str");
    let tor = df.column("target_tor").expect("target_tor").str().expect("str");
    let window = df.column("window_start_ns").expect("window").u64().expect("u64");
    let mut got: BTreeMap<(String, String, u64), usize> = BTreeMap::new();
    for i in 0..df.height() {
        let key =
            (prober.get(i).unwrap_or("").to_owned(), tor.get(i).unwrap_or("").to_owned(), window.get(i).unwrap_or(0));
        *got.entry(key).or_default() += 1;
    }
    let mut want: BTreeMap<(String, String, u64), usize> = BTreeMap::new();
    for r in &recs {
        *want.entry((RNICS[r.prober].0.to_owned(), tor_of(r.target).to_owned(), r.window * WINDOW_NS)).or_default() +=
            1;
    }
    assert_eq!(got, want);
}

#[test]
fn partitioned_export_holds_the_same_rows_each_in_its_partition() {
    let (dir, seg, recs) = fleet();
    let (pq, parts) = (dir.path().join("probes.parquet"), dir.path().join("dataset"));
    let seg_s = seg.to_str().expect("utf-8");
    let run = |args: &[&str]| {
        let out = analyze(args);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["export", "--parquet", pq.to_str().expect("utf-8"), seg_s]);
    assert_eq!(code, Some(0), "{err}");
    let parts_s = parts.to_str().expect("utf-8");
    // A window at a time: several parts per partition.
    let (code, err) = run(&["export", "--range-records", "1", "--partitioned", parts_s, seg_s]);
    assert_eq!(code, Some(0), "{err}");

    // Every column but the partition values, per row, as text: the two exports' multisets.
    fn rows_of(df: &DataFrame) -> Vec<String> {
        (0..df.height())
            .map(|i| df.columns().iter().map(|c| format!("{}", c.get(i).expect("value"))).collect::<Vec<_>>().join("|"))
            .collect()
    }
    let whole = ParquetReader::new(std::fs::File::open(&pq).expect("open")).finish().expect("read parquet");
    let mut want = rows_of(&whole);
    let mut got = Vec::new();
    let mut files = 0;
    let mut tors = BTreeSet::new();
    for path in walk_files(&parts) {
        let rel = path.strip_prefix(&parts).expect("under the dataset").to_str().expect("utf-8").to_owned();
        let keys: Vec<(&str, &str)> = rel.split('/').filter_map(|c| c.split_once('=')).collect::<Vec<_>>();
        assert_eq!(keys.iter().map(|k| k.0).collect::<Vec<_>>(), ["date", "hour", "tor"], "{rel}");
        let unescape = |v: &str| {
            let b = v.as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' {
                    out.push(u8::from_str_radix(&v[i + 1..i + 3], 16).expect("hex"));
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8(out).expect("utf-8")
        };
        let tor = unescape(keys[2].1);
        tors.insert(tor.clone());
        let df = ParquetReader::new(std::fs::File::open(&path).expect("open")).finish().expect("read parquet");
        assert!(df.height() > 0, "{rel} is empty");
        let t1 = df.column("t1_unix_ns").expect("t1").u64().expect("u64");
        let prober_tor = df.column("prober_tor").expect("prober_tor").str().expect("str");
        for i in 0..df.height() {
            let c = rocemesh_formats::time::civil_utc((t1.get(i).expect("t1") / 1_000_000_000) as i64);
            assert_eq!(keys[0].1, format!("{:04}-{:02}-{:02}", c.year, c.month, c.day), "{rel}");
            assert_eq!(keys[1].1, format!("{:02}", c.hour), "{rel}");
            assert_eq!(prober_tor.get(i), Some(tor.as_str()), "{rel}");
        }
        // Each row group's statistics name only what it holds: a reader prunes files and row
        // groups by them (a dictionary of every name would give every file the fleet's range).
        let probers: BTreeSet<&str> =
            (0..df.height()).filter_map(|i| df.column("prober").expect("prober").str().expect("str").get(i)).collect();
        let stats = name_statistics(&path, "prober_tor");
        assert!(stats.iter().all(|s| s == &(tor.clone(), tor.clone())), "{rel}: {stats:?}");
        let (first, last) = (probers.first().expect("a prober"), probers.last().expect("a prober"));
        for (min, max) in name_statistics(&path, "prober") {
            assert_eq!((min.as_str(), max.as_str()), (*first, *last), "{rel}: one row group, its probers' bounds");
        }
        got.extend(rows_of(&df));
        files += 1;
    }
    assert!(files >= 3, "one file per window and prober ToR: {files}");
    assert!(tors.iter().any(|t| t.contains(' ')), "the RNIC without a ToR has an escaped partition: {tors:?}");
    assert_eq!(got.len(), recs.len());
    want.sort();
    got.sort();
    assert!(want == got, "the partitioned rows differ from the single file's");

    let (code, err) = run(&["export", "--partitioned", parts_s, seg_s]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is not empty") && err.contains(parts_s), "{err}");
}

/// The min and max of the string column `column` in each row group of the Parquet file `path`.
fn name_statistics(path: &Path, column: &str) -> Vec<(String, String)> {
    use polars_parquet::parquet::statistics::Statistics;
    let mut reader = ParquetReader::new(std::fs::File::open(path).expect("open"));
    let md = reader.get_metadata().expect("footer").clone();
    let mut out = Vec::new();
    for rg in &md.row_groups {
        for c in rg.parquet_columns().iter().filter(|c| c.descriptor().path_in_schema[0].as_str() == column) {
            let Some(Ok(Statistics::Binary(s))) = c.statistics(&md.footer_buf) else {
                panic!("{}: no string statistics for {column}", path.display());
            };
            let text = |v: Option<Vec<u8>>| String::from_utf8(v.expect("a bound")).expect("utf-8");
            out.push((text(s.min_value), text(s.max_value)));
        }
    }
    assert!(!out.is_empty(), "{}: no column {column}", path.display());
    out
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn html_page_is_self_contained() {
    let (dir, seg, _recs) = fleet();
    let page = dir.path().join("report.html");
    let out = analyze(&[
        "html",
        "--output",
        page.to_str().expect("utf-8"),
        "--sla-loss",
        "0.1",
        seg.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).expect("page");
    for needle in
        ["ToR × ToR", "RNIC × RNIC", "tor-loss", "rnic-rtt", "SLA violations", "<h2>Findings</h2>", "tb-h0/mlx5_0"]
    {
        assert!(html.contains(needle), "missing {needle}");
    }
    // The html command runs localisation itself: the page says what it found, not "run it".
    assert!(!html.contains("findings: run"), "localize's findings are on the page");
    assert!(!html.contains("http://") && !html.contains("https://") && !html.contains(" src="), "nothing fetched");
}

/// Sealed files are planned from their summaries (not inflated until their ranges are read):
/// the report is the one a plan from the whole files gives, and a summary that does not match
/// its file's data is said and that file left out, never read under a wrong dictionary.
#[test]
fn planned_from_summaries_or_from_whole_files_the_report_is_the_same() {
    use rocemesh_formats::segment::{SummaryRead, read_summary};
    let with = tempfile::tempdir().expect("tempdir");
    let files: Vec<PathBuf> = common::write_agents(with.path()).into_iter().flatten().collect();
    assert!(files.len() >= 8, "{files:?}");
    // The same files as a build before summaries sealed them: the data frame only.
    let without = tempfile::tempdir().expect("tempdir");
    let strip = |bytes: &[u8]| {
        assert_eq!(bytes[bytes.len() - 4..], *b"RSUM", "sealing wrote no summary");
        let body = u32::from_le_bytes(bytes[bytes.len() - 16..bytes.len() - 12].try_into().expect("4")) as usize;
        bytes[..bytes.len() - body - 24].to_vec()
    };
    for f in &files {
        let to = without.path().join(f.strip_prefix(with.path()).expect("under"));
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::write(&to, strip(&std::fs::read(f).expect("read"))).expect("write");
        assert_eq!(read_summary(&to).expect("read"), SummaryRead::Absent);
    }
    let run = |dir: &Path, code: i32| {
        let out = analyze(&[
            "report",
            "--scope",
            "cluster,tor_pair,tor,rnic,pair",
            "--format",
            "json",
            "--range-records",
            "2000",
            dir.to_str().expect("utf-8"),
        ]);
        assert_eq!(out.status.code(), Some(code), "stderr: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).expect("json")
    };
    let (a, b) = (run(with.path(), 0), run(without.path(), 0));
    assert!(a["rows"].as_array().is_some_and(|r| r.len() > 50), "{a}");
    assert!(a["meta"]["records"].as_u64().is_some_and(|n| n > 10_000), "{a}");
    assert_eq!(a, b, "planned from summaries and from whole files");

    // A forgery: one file's summary renames an RNIC of its dictionary (checksum made right).
    let victim = &files[1];
    let SummaryRead::Found(s) = read_summary(victim).expect("read") else { panic!("no summary: {victim:?}") };
    let mut forged = s.facts.clone();
    forged.dictionary[1].name = "forged-h9/mlx5_0".into();
    let mut bytes = strip(&std::fs::read(victim).expect("read"));
    bytes.extend_from_slice(&forged.frame());
    std::fs::write(victim, bytes).expect("write");
    // Damaged input: exit 1 (the report is still written), the file said once though it
    // spans several ranges.
    let c = run(with.path(), 1);
    let problems = c["meta"]["problems"].as_array().expect("problems");
    let said = problems
        .iter()
        .filter(|p| p.to_string().contains("could not be read again") && p.to_string().contains("with other entries"))
        .count();
    assert_eq!(said, 1, "{problems:?}");
    assert_eq!(
        c["meta"]["records"].as_u64(),
        a["meta"]["records"].as_u64().map(|n| n - s.facts.records),
        "the forged file's records are left out"
    );
    assert!(!c.to_string().contains("forged-h9"), "nothing is read under the forged dictionary");
}
