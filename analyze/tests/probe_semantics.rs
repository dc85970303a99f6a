//! Issue 14 end to end: local drops are their own class (never loss, never evidence) and the
//! timestamp source of every sample reaches `report`, `export` and `localize`. Segments are
//! written with the agent's writer, then read by the `analyze` binary or the library.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use polars::prelude::*;
use rocemesh_analyze::ingest::ingest;
use rocemesh_analyze::inspect::find_segments;
use rocemesh_analyze::localize::{Options, localize};
use rocemesh_formats::record::{Arrived, EndpointRole, Outcome, ProbeRecord, TsSource};
use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity};
use serde_json::Value;

const WINDOW_NS: u64 = 30_000_000_000;
/// Window-aligned, so that every test's probes fall in whole windows.
const T0: u64 = 1_700_000_010_000_000_000 / WINDOW_NS * WINDOW_NS;

/// One probe as a test plans it; RNICs are indices into the test's (name, tor) list.
#[derive(Clone, Copy, Debug)]
struct Probe {
    prober: usize,
    target: usize,
    t1_unix_ns: u64,
    outcome: Outcome,
    arrived: u8,
    rtt_ns: i32,
    ts_source: TsSource,
}

impl Probe {
    fn ok(prober: usize, target: usize, t1_unix_ns: u64, rtt_ns: i32, ts_source: TsSource) -> Probe {
        Probe { prober, target, t1_unix_ns, outcome: Outcome::Ok, arrived: Arrived::ALL.0, rtt_ns, ts_source }
    }

    fn with(self, outcome: Outcome, arrived: u8) -> Probe {
        Probe { outcome, arrived, rtt_ns: 0, ..self }
    }
}

/// One segment directory per prober, records in send order, every RNIC in every dictionary.
fn write_segments(dir: &Path, rnics: &[(&str, &str)], probes: &[Probe]) -> PathBuf {
    let seg = dir.join("segments");
    let mut by_prober: BTreeMap<usize, Vec<Probe>> = BTreeMap::new();
    for p in probes {
        by_prober.entry(p.prober).or_default().push(*p);
    }
    for (prober, mut list) in by_prober {
        list.sort_by_key(|p| p.t1_unix_ns);
        let (name, tor) = rnics[prober];
        let (host, device) = name.split_once('/').expect("host/device");
        let id = WriterIdentity {
            host: host.into(),
            device: device.into(),
            tor: tor.into(),
            agent_epoch: 1,
            tool: "probe-semantics-test".into(),
        };
        let mut w = SegmentWriter::new(WriterConfig::new(seg.join(host)), id).expect("writer");
        let ids: Vec<u32> = rnics.iter().map(|(n, t)| w.endpoint(EndpointRole::Rnic, n, t, [0; 16])).collect();
        for (seq, p) in list.iter().enumerate() {
            w.append(&ProbeRecord {
                t1_unix_ns: p.t1_unix_ns,
                seq: seq as u64,
                network_rtt_ns: p.rtt_ns,
                prober_delay_ns: 2_000,
                responder_delay_ns: 1_000,
                prober: ids[p.prober],
                target: ids[p.target],
                flow_label: 1,
                responder_epoch: 1,
                kind: 0,
                outcome: p.outcome as u8,
                arrived: p.arrived,
                ts_source: p.ts_source as u8,
            })
            .expect("append");
        }
        w.finish().expect("finish");
    }
    seg
}

fn analyze(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).output().expect("run analyze")
}

fn report_json(seg: &Path, scopes: &str) -> Vec<Value> {
    let out = analyze(&["report", "--format", "json", "--scope", scopes, seg.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    doc["rows"].as_array().expect("rows").clone()
}

fn row<'a>(rows: &'a [Value], scope: &str, entity: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["scope"] == scope && r["entity"] == entity)
        .unwrap_or_else(|| panic!("no {scope} row for {entity} in {rows:?}"))
}

const PAIR_RNICS: [(&str, &str); 4] =
    [("a/mlx5_0", "tor-a"), ("b/mlx5_0", "tor-a"), ("c/mlx5_0", "tor-b"), ("d/mlx5_0", "tor-b")];

/// a -> b: 20 ok, 10 dropped locally; c -> d: 10 ok, 5 lost, 30 dropped locally; d -> a: only
/// local drops (its RNIC is gone), which is neither loss nor a dead peer.
fn local_drop_fleet() -> Vec<Probe> {
    let mut v = Vec::new();
    let t = |i: u64| T0 + 1_000_000_000 + i * 10_000_000;
    let ks = TsSource::KernelSoftware;
    for i in 0..20 {
        v.push(Probe::ok(0, 1, t(i), 10_000, ks));
    }
    for i in 20..30 {
        v.push(Probe::ok(0, 1, t(i), 0, ks).with(Outcome::LocalDrop, 0));
    }
    for i in 0..10 {
        v.push(Probe::ok(2, 3, t(i), 12_000, ks));
    }
    for i in 10..15 {
        v.push(Probe::ok(2, 3, t(i), 0, ks).with(Outcome::Lost, Arrived::PROBE_SENT));
    }
    for i in 15..45 {
        v.push(Probe::ok(2, 3, t(i), 0, ks).with(Outcome::LocalDrop, 0));
    }
    for i in 0..25 {
        v.push(Probe::ok(3, 0, t(i), 0, ks).with(Outcome::LocalDrop, 0));
    }
    v
}

/// The report counts local drops in their own column of every format, and leaves them out of
/// the loss ratio's numerator and denominator (old code: no such column, and outcome 4 was an
/// unknown byte).
#[test]
fn report_counts_local_drops_apart_from_loss_in_every_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg = write_segments(dir.path(), &PAIR_RNICS, &local_drop_fleet());
    let rows = report_json(&seg, "cluster,pair,rnic");
    let ab = row(&rows, "pair", "a/mlx5_0->b/mlx5_0");
    assert_eq!((ab["probes"].as_u64(), ab["ok"].as_u64(), ab["local_drop"].as_u64()), (Some(30), Some(20), Some(10)));
    assert_eq!(ab["loss_ratio"].as_f64(), Some(0.0));
    let cd = row(&rows, "pair", "c/mlx5_0->d/mlx5_0");
    assert_eq!((cd["lost"].as_u64(), cd["local_drop"].as_u64()), (Some(5), Some(30)));
    assert_eq!(cd["loss_ratio"].as_f64(), Some(5.0 / 15.0), "local drops are not in the denominator");
    let da = row(&rows, "pair", "d/mlx5_0->a/mlx5_0");
    assert_eq!(
        (da["local_drop"].as_u64(), da["lost"].as_u64(), da["unreachable"].as_u64()),
        (Some(25), Some(0), Some(0)),
        "a pair with nothing but local drops is not a dead peer"
    );
    assert!(da["loss_ratio"].is_null() && da["sla_violations"].as_array().is_some_and(Vec::is_empty));
    assert_eq!(row(&rows, "cluster", "cluster")["local_drop"].as_u64(), Some(65));
    assert_eq!(row(&rows, "rnic", "d/mlx5_0")["local_drop"].as_u64(), Some(55));

    let seg_s = seg.to_str().expect("utf-8");
    let csv = analyze(&["report", "--format", "csv", "--scope", "cluster", seg_s]);
    assert_eq!(csv.status.code(), Some(0));
    let text = String::from_utf8(csv.stdout).expect("utf-8");
    let header: Vec<&str> = text.lines().next().expect("header").split(',').collect();
    let at = header.iter().position(|c| *c == "local_drop").expect("a local_drop column");
    let cluster: Vec<&str> = text.lines().nth(1).expect("cluster row").split(',').collect();
    assert_eq!(cluster[at], "65");

    let pq = dir.path().join("report.parquet");
    let out = analyze(&["report", "--format", "parquet", "--output", pq.to_str().expect("utf-8"), seg_s]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let df = ParquetReader::new(std::fs::File::open(&pq).expect("open")).finish().expect("read parquet");
    let drops = df.column("local_drop").expect("local_drop column").u64().expect("u64");
    assert_eq!(drops.iter().flatten().max(), Some(65));

    let table = analyze(&["report", "--scope", "cluster", seg_s]);
    let text = String::from_utf8(table.stdout).expect("utf-8");
    assert!(text.lines().nth(1).is_some_and(|h| h.contains("local")), "{text}");
}

/// Each row says which timestamp sources its quantiles came from: one name, or `mixed(..)`
/// (old code: no such field, samples of every source pooled silently).
#[test]
fn report_rows_name_the_timestamp_sources_of_their_quantiles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut probes = Vec::new();
    for i in 0..40u64 {
        let t1 = T0 + 2_000_000_000 + i * 50_000_000;
        probes.push(Probe::ok(0, 1, t1, 150_000, TsSource::HostPoll));
        probes.push(Probe::ok(2, 1, t1, 10_000, TsSource::KernelSoftware));
    }
    // A lost probe carries no sample: its source must not show up in the label.
    probes.push(Probe::ok(3, 1, T0 + 1_000, 0, TsSource::Nic).with(Outcome::Lost, Arrived::PROBE_SENT));
    let seg = write_segments(dir.path(), &PAIR_RNICS, &probes);
    let rows = report_json(&seg, "cluster,rnic,pair");
    assert_eq!(row(&rows, "rnic", "a/mlx5_0")["ts_source"], "host_poll");
    assert_eq!(row(&rows, "rnic", "c/mlx5_0")["ts_source"], "kernel_software");
    assert_eq!(row(&rows, "rnic", "b/mlx5_0")["ts_source"], "mixed(host_poll+kernel_software)");
    assert_eq!(row(&rows, "cluster", "cluster")["ts_source"], "mixed(host_poll+kernel_software)");
    assert!(row(&rows, "pair", "d/mlx5_0->b/mlx5_0")["ts_source"].is_null(), "no ok sample, no source");

    let seg_s = seg.to_str().expect("utf-8");
    let csv = analyze(&["report", "--format", "csv", "--scope", "rnic", seg_s]);
    let text = String::from_utf8(csv.stdout).expect("utf-8");
    assert!(text.lines().next().is_some_and(|h| h.split(',').any(|c| c == "ts_source")), "{text}");
    assert!(text.contains("mixed(host_poll+kernel_software)"), "{text}");
}

/// The export carries each probe's timestamp source and names its class, local drops included
/// (old code: neither column).
#[test]
fn export_carries_the_timestamp_source_and_the_class_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut probes = local_drop_fleet();
    probes.push(Probe::ok(1, 0, T0 + 5_000_000_000, 20_000, TsSource::HostPoll));
    let seg = write_segments(dir.path(), &PAIR_RNICS, &probes);
    let pq = dir.path().join("probes.parquet");
    let out = analyze(&["export", "--parquet", pq.to_str().expect("utf-8"), seg.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let df = ParquetReader::new(std::fs::File::open(&pq).expect("open")).finish().expect("read parquet");
    let class = df.column("class").expect("class column").str().expect("str");
    let outcome = df.column("outcome").expect("outcome").u8().expect("u8");
    let ts = df.column("ts_source").expect("ts_source column").u8().expect("u8");
    let mut by_class: BTreeMap<(String, u8), usize> = BTreeMap::new();
    for i in 0..df.height() {
        *by_class.entry((class.get(i).unwrap_or("").to_owned(), outcome.get(i).unwrap_or(9))).or_default() += 1;
    }
    assert_eq!(by_class.get(&("local_drop".to_owned(), Outcome::LocalDrop as u8)), Some(&65));
    assert_eq!(by_class.get(&("lost".to_owned(), Outcome::Lost as u8)), Some(&5));
    assert_eq!(by_class.get(&("ok".to_owned(), Outcome::Ok as u8)), Some(&31));
    assert_eq!(ts.iter().filter(|t| *t == Some(TsSource::HostPoll as u8)).count(), 1);
}

/// (name, tor) of a 12-RNIC fleet over 3 ToRs.
fn fleet_rnics() -> Vec<(String, String)> {
    (0..12).map(|i| (format!("t{}-h{i}/mlx5_0", i % 3), format!("tor{}", i % 3))).collect()
}

/// Send spacing of [`full_mesh`]: 110 probes a window per prober.
const SPACING_NS: u64 = WINDOW_NS / 110;

/// Every RNIC probes every other one 10 times a window for `windows` windows; `probe` shapes
/// each probe from (prober, target).
fn full_mesh(windows: u64, probe: impl Fn(usize, usize, u64) -> Probe) -> Vec<Probe> {
    let mut v = Vec::new();
    for w in 0..windows {
        for round in 0..10u64 {
            for p in 0..12 {
                for (k, t) in (0..12).filter(|&t| t != p).enumerate() {
                    // Evenly spaced sends, across window ends too: no gap a frozen host would leave.
                    let t1 = T0 + w * WINDOW_NS + (round * 11 + k as u64) * SPACING_NS;
                    v.push(probe(p, t, t1));
                }
            }
        }
    }
    v
}

/// The (kind, entity, evidence) of every finding of `analyze localize` over three windows of
/// [`full_mesh`] probes shaped by `probe`, and the fleet's RNIC names.
fn mesh_findings(probe: impl Fn(usize, usize, u64) -> Probe) -> (Vec<String>, Vec<(String, String, String)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let names = fleet_rnics();
    let rnics: Vec<(&str, &str)> = names.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
    let seg = write_segments(dir.path(), &rnics, &full_mesh(3, probe));
    let ds = ingest(&find_segments(&[seg]).expect("list"), false);
    assert!(ds.problems.is_empty(), "{:?}", ds.problems);
    let l = localize(&ds, &Options::default());
    let findings = l.findings.into_iter().map(|f| (f.kind, f.entity, f.evidence)).collect();
    (names.into_iter().map(|n| n.0).collect(), findings)
}

/// One RNIC whose agent stamps at poll time reads every RTT far above the kernel-stamped
/// fleet. Against a pooled baseline that is a slow RNIC (old code: an `rnic` finding); against
/// its own source's baseline it is nothing.
#[test]
fn a_host_poll_rnic_is_not_slow_for_being_host_poll() {
    let (_, findings) = mesh_findings(|p, t, t1| {
        if p == 4 {
            Probe::ok(p, t, t1, 150_000 + (t1 % 7_000) as i32, TsSource::HostPoll)
        } else {
            Probe::ok(p, t, t1, 10_000 + (t1 % 3_000) as i32, TsSource::KernelSoftware)
        }
    });
    assert!(findings.is_empty(), "a timestamp source is not a fault: {findings:?}");
}

/// A slow RNIC is still found, and its evidence names the timestamp source it was judged in.
#[test]
fn a_slow_rnic_is_found_and_its_evidence_names_the_source() {
    let (names, findings) = mesh_findings(|p, t, t1| {
        let slow = p == 7 || t == 7;
        Probe::ok(p, t, t1, if slow { 400_000 } else { 10_000 + (t1 % 3_000) as i32 }, TsSource::KernelSoftware)
    });
    assert_eq!(findings.len(), 1, "{findings:?}");
    let (kind, entity, evidence) = &findings[0];
    assert_eq!((kind.as_str(), entity.as_str()), ("rnic", names[7].as_str()));
    assert!(evidence.contains("kernel_software"), "{evidence}");
}

/// An RNIC whose every probe fails locally (its device is gone) is no network evidence: no
/// finding, while a lossy RNIC beside it still is one.
#[test]
fn local_drops_are_never_loss_evidence() {
    let (names, findings) = mesh_findings(|p, t, t1| {
        let base = Probe::ok(p, t, t1, 10_000 + (t1 % 3_000) as i32, TsSource::KernelSoftware);
        if p == 5 {
            base.with(Outcome::LocalDrop, 0)
        } else if (p == 9 || t == 9) && ((t1 - T0) / SPACING_NS).is_multiple_of(3) {
            base.with(Outcome::Lost, Arrived::PROBE_SENT)
        } else {
            base
        }
    });
    let blamed: Vec<(&str, &str)> = findings.iter().map(|f| (f.0.as_str(), f.1.as_str())).collect();
    assert_eq!(blamed, vec![("rnic", names[9].as_str())], "{findings:?}");
}
