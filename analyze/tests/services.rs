//! Traced service connections end to end: segments with service dictionary entries and service
//! probes (kind 2, target = the service entry, the connection's flow label) beside an ordinary
//! mesh, read by the `analyze` binary: `report --scope service`, `localize` (JSON and table) and
//! `html`; and segments without services, which must still work and list no services.
//!
//! The fleet: three ToRs under one spine, two RNICs each. The uplink tor1|spine0 drops every
//! 5th probe crossing it (20%), which localisation finds from the inventory's single-spine path.
//! Services (all probed from tor0 or tor2):
//! - A `tor0-h0 -> tor1-h0`, named by the agent, crosses the lossy link and loses 20% itself;
//! - B `tor0-h1 -> tor2-h0`, remote GID only (the inventory or the dictionary names it), clean;
//! - C `tor0-h1 -> 10.9.9.9`, a GID nothing knows (unresolved), loses 10% with no finding to
//!   explain it;
//! - D `tor2-h1 -> tor1-h1`, crosses the lossy link but its own probes stay clean (exposure).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;

use rocemesh_analyze::ingest::{Resolution, ingest};
use rocemesh_analyze::inspect::find_segments;
use rocemesh_formats::gid::gid_bytes;
use rocemesh_formats::record::{Arrived, EndpointRole, Outcome, ProbeRecord, ServiceConn, TsSource};
use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity};
use serde_json::Value;

const WINDOW_NS: u64 = 30_000_000_000;
/// Window-aligned, so that every window is whole.
const T0: u64 = 1_700_000_010_000_000_000 / WINDOW_NS * WINDOW_NS;
const WINDOWS: u64 = 4;
/// Probes per mesh pair and per service in a window.
const PER_PAIR: u64 = 10;
const PER_SERVICE: u64 = 20;

/// RNIC `i`: `tor{i / 2}-h{i % 2}/rxe0` under `tor{i / 2}`, address 10.0.{i / 2}.{i % 2 + 1}.
fn rnic(i: usize) -> (String, String, IpAddr) {
    let (t, h) = (i / 2, i % 2);
    (format!("tor{t}-h{h}/rxe0"), format!("tor{t}"), IpAddr::V4(Ipv4Addr::new(10, 0, t as u8, h as u8 + 1)))
}
const RNICS: usize = 6;

/// The fabric's inventory: tor0..tor2 under spine0, the six RNICs.
fn inventory() -> String {
    let mut s = String::from("version = 1\n[[spine]]\nname = \"spine0\"\n");
    for t in 0..3 {
        s += &format!("[[tor]]\nname = \"tor{t}\"\n[[link]]\na = \"tor{t}\"\nb = \"spine0\"\n");
    }
    for i in 0..RNICS {
        let (name, tor, ip) = rnic(i);
        let (host, device) = name.split_once('/').expect("host/device");
        s += &format!(
            "[[host]]\nname = \"{host}\"\n[[host.rnic]]\ndevice = \"{device}\"\ntor = \"{tor}\"\nip = \"{ip}\"\n"
        );
    }
    s
}

/// A traced connection as the agent of `prober` defines it.
struct Svc {
    prober: usize,
    /// The remote RNIC index, or `None` for the GID nothing knows.
    remote: Option<usize>,
    /// Whether the agent wrote the remote's name (else only its GID).
    named: bool,
    /// Every `lose_every`-th probe is lost (0 = none).
    lose_every: u64,
    conn: ServiceConn,
}

fn services() -> Vec<Svc> {
    let conn = |pid: u32, lq: u32, rq: u32, flow_label: u32| ServiceConn {
        pid,
        local_qpn: lq,
        remote_qpn: rq,
        flow_label,
        traffic_class: 106,
        comm: "ib_write_bw".into(),
        remote: String::new(),
    };
    vec![
        Svc { prober: 0, remote: Some(2), named: true, lose_every: 5, conn: conn(4242, 17, 18, 0xABCDE) },
        Svc { prober: 1, remote: Some(4), named: false, lose_every: 0, conn: conn(4243, 19, 20, 0x12345) },
        Svc { prober: 1, remote: None, named: false, lose_every: 10, conn: conn(4244, 21, 22, 0x54321) },
        Svc { prober: 5, remote: Some(3), named: false, lose_every: 0, conn: conn(4245, 23, 24, 0x11111) },
    ]
}

/// The agent's dictionary name of service `s` (opaque to analysis).
fn svc_name(s: &Svc) -> String {
    let remote = s.remote.map_or_else(|| "10.9.9.9".to_owned(), |r| rnic(r).0);
    format!("svc {} qp {} -> {remote} qp {}", rnic(s.prober).0, s.conn.local_qpn, s.conn.remote_qpn)
}

/// What a probe targets.
#[derive(Clone, Copy)]
enum Target {
    Rnic(usize),
    Service(usize),
}

/// Writes one segment directory per prober: a full mesh (kind 0 inside a ToR, 1 between ToRs;
/// probes crossing tor1|spine0 lose every 5th) and, with `with_services`, the service probes.
/// Every prober's sends are evenly spaced (no gap a frozen host would leave).
fn write_fleet(dir: &Path, with_services: bool) -> PathBuf {
    let seg = dir.join("segments");
    let svcs = if with_services { services() } else { Vec::new() };
    for prober in 0..RNICS {
        let (name, tor, _) = rnic(prober);
        let (host, device) = name.split_once('/').expect("host/device");
        let id = WriterIdentity {
            host: host.into(),
            device: device.into(),
            tor: tor.clone(),
            agent_epoch: 1,
            tool: "services-test".into(),
        };
        let mut cfg = WriterConfig::new(seg.join(host));
        cfg.chunk_records = 64;
        let mut w = SegmentWriter::new(cfg, id).expect("writer");
        // Agents write their own entry without an address and their targets' with their GID.
        let ids: Vec<u32> = (0..RNICS)
            .map(|i| {
                let (n, t, ip) = rnic(i);
                w.endpoint(EndpointRole::Rnic, &n, &t, if i == prober { [0; 16] } else { gid_bytes(ip) })
            })
            .collect();
        let mut svc_ids = BTreeMap::new();
        for (k, s) in svcs.iter().enumerate().filter(|(_, s)| s.prober == prober) {
            let (addr, tor, remote) = match s.remote {
                Some(r) if s.named => (gid_bytes(rnic(r).2), rnic(r).1, rnic(r).0),
                Some(r) => (gid_bytes(rnic(r).2), String::new(), String::new()),
                None => (gid_bytes("10.9.9.9".parse().expect("ip")), String::new(), String::new()),
            };
            let conn = ServiceConn { remote, ..s.conn.clone() };
            svc_ids.insert(k, w.service_endpoint(&svc_name(s), &tor, addr, &conn));
        }
        let mut seq = 0u64;
        for win in 0..WINDOWS {
            // This window's sends, in order: PER_PAIR rounds over the mesh targets, then the
            // services' probes interleaved.
            let mut slots: Vec<(Target, u64)> = Vec::new();
            for round in 0..PER_PAIR {
                for t in (0..RNICS).filter(|&t| t != prober) {
                    slots.push((Target::Rnic(t), round));
                }
            }
            for &k in svc_ids.keys() {
                for i in 0..PER_SERVICE {
                    let at = (i as usize * slots.len()) / PER_SERVICE as usize + i as usize % 3;
                    slots.insert(at.min(slots.len()), (Target::Service(k), i));
                }
            }
            let spacing = WINDOW_NS / slots.len() as u64;
            for (j, &(target, n)) in slots.iter().enumerate() {
                let t1 = T0 + win * WINDOW_NS + j as u64 * spacing;
                let (target_id, kind, flow_label, lost) = match target {
                    Target::Rnic(t) => {
                        let inter = t / 2 != prober / 2;
                        let crosses_lossy_link = inter && (t / 2 == 1 || prober / 2 == 1);
                        (ids[t], u8::from(inter), 1, crosses_lossy_link && n % 5 == 0)
                    }
                    Target::Service(k) => {
                        let s = &svcs[k];
                        (svc_ids[&k], 2, s.conn.flow_label, s.lose_every > 0 && n % s.lose_every == 0)
                    }
                };
                w.append(&ProbeRecord {
                    t1_unix_ns: t1,
                    seq,
                    network_rtt_ns: if lost { 0 } else { 10_000 + (j % 7) as i32 * 100 },
                    prober_delay_ns: 2_000,
                    responder_delay_ns: 1_000,
                    prober: ids[prober],
                    target: target_id,
                    flow_label,
                    responder_epoch: 1,
                    kind,
                    outcome: if lost { Outcome::Lost as u8 } else { Outcome::Ok as u8 },
                    arrived: if lost { Arrived::PROBE_SENT } else { Arrived::ALL.0 },
                    ts_source: TsSource::KernelSoftware as u8,
                })
                .expect("append");
                seq += 1;
            }
        }
        w.finish().expect("finish");
    }
    seg
}

fn analyze(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).output().expect("run analyze")
}

/// The fleet's segment directory and inventory file.
fn fleet(with_services: bool) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg = write_fleet(dir.path(), with_services);
    let inv = dir.path().join("inventory.toml");
    std::fs::write(&inv, inventory()).expect("write inventory");
    (dir, seg, inv)
}

fn json_rows(out: &std::process::Output) -> Vec<Value> {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    doc["rows"].as_array().expect("rows").clone()
}

/// Ingest gives service probes to the remote RNIC, keeps which connection each probed, and
/// resolves the remote: the agent's name, else the inventory, else a dictionary entry with
/// the GID, else an RNIC named after the GID.
#[test]
fn ingest_resolves_each_service_remote_and_keeps_the_service_column() {
    let (_dir, seg, inv) = fleet(true);
    let files = find_segments(&[seg]).expect("list");
    let ds = ingest(&files, false);
    assert!(ds.problems.is_empty(), "{:?}", ds.problems);
    let svcs = services();
    assert_eq!(ds.services.len(), svcs.len());
    let by_name = |s: &Svc| ds.services.iter().find(|x| x.name == svc_name(s)).expect("service ingested");
    let remote = |s: &Svc| ds.rnics[by_name(s).remote as usize].name.clone();
    let how: Vec<Resolution> = svcs.iter().map(|s| by_name(s).resolution).collect();
    assert_eq!(how, [Resolution::Agent, Resolution::Dictionary, Resolution::Unresolved, Resolution::Dictionary]);
    assert_eq!(remote(&svcs[0]), rnic(2).0);
    assert_eq!(remote(&svcs[1]), rnic(4).0);
    assert_eq!(remote(&svcs[2]), "gid:::ffff:10.9.9.9");
    assert_eq!(ds.rnics[by_name(&svcs[1]).remote as usize].tor, "tor2", "the dictionary entry's ToR");
    assert_eq!(ds.rnics[by_name(&svcs[0]).prober as usize].name, rnic(0).0, "the defining file's writer");
    assert_eq!(ds.unresolved_services().count(), 1);
    // No RNIC is named after a service, and every service probe targets its remote RNIC.
    assert!(ds.rnics.iter().all(|r| !r.name.starts_with("svc ")), "{:?}", ds.rnics);
    let p = &ds.probes;
    assert_eq!(p.service.len(), p.len());
    let mut per_service = vec![0u64; svcs.len()];
    for i in 0..p.len() {
        let s = p.service[i];
        if s != rocemesh_analyze::ingest::NO_SERVICE {
            per_service[s as usize] += 1;
            assert_eq!(p.target[i], ds.services[s as usize].remote);
            assert_eq!(p.kind[i], 2);
        }
    }
    assert_eq!(per_service, vec![PER_SERVICE * WINDOWS; svcs.len()]);

    // With the inventory, B's and D's remotes are the inventory's.
    let inv = rocemesh_formats::inventory::Inventory::load(&inv).expect("inventory");
    let ds = rocemesh_analyze::ingest::ingest_with(&files, false, rocemesh_analyze::ingest::Fields::Report, Some(&inv));
    let how: Vec<Resolution> =
        svcs.iter().map(|s| ds.services.iter().find(|x| x.name == svc_name(s)).expect("service").resolution).collect();
    assert_eq!(how, [Resolution::Agent, Resolution::Inventory, Resolution::Unresolved, Resolution::Inventory]);
    assert_eq!(ds.probes.service.len(), ds.probes.len(), "report ingest reads the service column too");
}

/// `report --scope service`: one row per (window, service) with the service's own figures and
/// its identifying columns; the service probes also count at the remote RNIC's rows.
#[test]
fn report_service_scope_has_a_row_per_window_and_connection() {
    let (_dir, seg, _inv) = fleet(true);
    let seg_s = seg.to_str().expect("utf-8");
    let out = analyze(&["report", "--format", "json", "--scope", "service,rnic", seg_s]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stderr.contains("1 of 4 traced services") && stderr.contains("gid:::ffff:10.9.9.9"), "{stderr}");
    let rows = json_rows(&out);
    let service_rows: Vec<&Value> = rows.iter().filter(|r| r["scope"] == "service").collect();
    assert_eq!(service_rows.len(), 4 * WINDOWS as usize, "{service_rows:?}");
    let svcs = services();
    let of =
        |s: &Svc| -> Vec<&Value> { service_rows.iter().copied().filter(|r| r["service"] == svc_name(s)).collect() };

    let a = of(&svcs[0]);
    assert_eq!(a.len(), WINDOWS as usize);
    for r in &a {
        assert_eq!((r["probes"].as_u64(), r["lost"].as_u64(), r["ok"].as_u64()), (Some(20), Some(4), Some(16)));
        assert_eq!(r["loss_ratio"].as_f64(), Some(0.2));
        assert_eq!(r["sla_violations"], serde_json::json!(["loss"]));
        assert_eq!(r["entity"], "ib_write_bw[4242] qp 17->18 tor0-h0/rxe0->tor1-h0/rxe0");
        assert_eq!((r["prober"].as_str(), r["remote"].as_str()), (Some("tor0-h0/rxe0"), Some("tor1-h0/rxe0")));
        assert_eq!((r["pid"].as_u64(), r["comm"].as_str()), (Some(4242), Some("ib_write_bw")));
        assert_eq!((r["local_qpn"].as_u64(), r["remote_qpn"].as_u64()), (Some(17), Some(18)));
        assert_eq!((r["flow_label"].as_u64(), r["remote_resolution"].as_str()), (Some(0xABCDE), Some("agent")));
        assert!(r["rtt_ns_p99"].as_i64().is_some_and(|v| (10_000..11_000).contains(&v)), "{r}");
    }
    let b = of(&svcs[1]);
    assert_eq!(b.len(), WINDOWS as usize);
    for r in &b {
        assert_eq!((r["probes"].as_u64(), r["lost"].as_u64()), (Some(20), Some(0)));
        assert_eq!(r["loss_ratio"].as_f64(), Some(0.0));
        assert_eq!((r["remote"].as_str(), r["remote_resolution"].as_str()), (Some("tor2-h0/rxe0"), Some("dictionary")));
    }
    let c = of(&svcs[2]);
    assert!(c.iter().all(|r| r["remote"] == "gid:::ffff:10.9.9.9" && r["remote_resolution"] == "unresolved"));
    assert!(c.iter().all(|r| r["lost"] == 2), "{c:?}");
    // Rows of other scopes carry no service fields.
    assert!(rows.iter().filter(|r| r["scope"] == "rnic").all(|r| r.get("service").is_none()));

    // tor1-h0 answers 5 probers x 10, probes 5 targets x 10, and is A's remote: 20 more.
    let first = (T0 / WINDOW_NS) * WINDOW_NS;
    let remote_row = rows
        .iter()
        .find(|r| r["scope"] == "rnic" && r["entity"] == "tor1-h0/rxe0" && r["window_start_ns"] == first)
        .expect("tor1-h0 row");
    assert_eq!(remote_row["probes"].as_u64(), Some(100 + PER_SERVICE));
    assert!(
        rows.iter().all(|r| !r["entity"].as_str().unwrap_or("").starts_with("svc ")),
        "no RNIC named after a service"
    );

    // CSV: the connection's columns after the existing ones; without the service scope, none.
    let csv = analyze(&["report", "--format", "csv", "--scope", "service", seg_s]);
    assert_eq!(csv.status.code(), Some(0));
    let text = String::from_utf8(csv.stdout).expect("utf-8");
    assert!(
        text.lines().next().is_some_and(|h| h.ends_with(
            "local_drop,ts_source,service,prober,remote,remote_resolution,pid,comm,local_qpn,remote_qpn,flow_label"
        )),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1 + 4 * WINDOWS as usize);
    let plain = analyze(&["report", "--format", "csv", "--scope", "cluster", seg_s]);
    let text = String::from_utf8(plain.stdout).expect("utf-8");
    assert!(text.lines().next().is_some_and(|h| h.ends_with("local_drop,ts_source")), "{text}");

    // Whole range through the table format: one line per service.
    let table = analyze(&["report", "--scope", "service", seg_s]);
    let text = String::from_utf8(table.stdout).expect("utf-8");
    assert!(text.contains("ib_write_bw[4243] qp 19->20 tor0-h1/rxe0->tor2-h0/rxe0"), "{text}");
}

/// The services of a localisation JSON document, by name.
fn services_by_name(doc: &Value) -> BTreeMap<String, Value> {
    doc["services"]
        .as_array()
        .expect("services")
        .iter()
        .map(|s| (s["name"].as_str().expect("name").to_owned(), s.clone()))
        .collect()
}

/// `localize --inventory --json` (the spelling of earlier releases, kept hidden: the table on
/// standard output and the JSON in a file): the lossy link is found; A (through it, lossy itself) ranks
/// first as high and confirmed; C (lossy, nothing on its path) is high with a note; D (through
/// it, clean) is medium; B is unaffected.
#[test]
fn localize_ranks_services_by_the_findings_on_their_path() {
    let (dir, seg, inv) = fleet(true);
    let out_json = dir.path().join("out.json");
    let out = analyze(&[
        "localize",
        "--inventory",
        inv.to_str().expect("utf-8"),
        "--json",
        out_json.to_str().expect("utf-8"),
        seg.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).expect("utf-8");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&out_json).expect("out.json")).expect("json");
    let findings: Vec<(&str, &str)> = doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| (f["kind"].as_str().unwrap_or(""), f["entity"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(findings, [("link", "tor1|spine0")], "{doc}");

    let svcs = services();
    let list = doc["services"].as_array().expect("services");
    assert_eq!(list.len(), 4);
    let ranks: Vec<u64> = list.iter().filter_map(|s| s["rank"].as_u64()).collect();
    assert_eq!(ranks, [1, 2, 3, 4], "listed worst first");
    let by = services_by_name(&doc);
    let (a, b, c, d) =
        (&by[&svc_name(&svcs[0])], &by[&svc_name(&svcs[1])], &by[&svc_name(&svcs[2])], &by[&svc_name(&svcs[3])]);

    assert_eq!((a["rank"].as_u64(), a["grade"].as_str()), (Some(1), Some("high")), "{a}");
    assert_eq!(a["label"], "ib_write_bw[4242] qp 17->18 tor0-h0/rxe0->tor1-h0/rxe0");
    assert_eq!((a["prober"].as_str(), a["remote"].as_str()), (Some("tor0-h0/rxe0"), Some("tor1-h0/rxe0")));
    assert_eq!((a["pid"].as_u64(), a["comm"].as_str()), (Some(4242), Some("ib_write_bw")));
    assert_eq!(
        (a["local_qpn"].as_u64(), a["remote_qpn"].as_u64(), a["flow_label"].as_u64()),
        (Some(17), Some(18), Some(0xABCDE))
    );
    assert_eq!((a["probes"].as_u64(), a["lost"].as_u64()), (Some(PER_SERVICE * WINDOWS), Some(4 * WINDOWS)));
    assert_eq!(a["bad_windows"].as_array().map(Vec::len), Some(WINDOWS as usize));
    let affected = a["affected_by"].as_array().expect("affected_by");
    assert_eq!(affected.len(), 1, "{a}");
    assert_eq!((affected[0]["entity"].as_str(), affected[0]["kind"].as_str()), (Some("tor1|spine0"), Some("link")));
    assert_eq!(affected[0]["confirmed"], true);
    assert!(a["note"].is_null(), "{a}");
    assert!(a["path"].as_array().is_some_and(|p| p.iter().any(|e| e == "link:tor1|spine0")), "{a}");

    assert_eq!((c["rank"].as_u64(), c["grade"].as_str()), (Some(2), Some("high")), "{c}");
    assert!(c["affected_by"].as_array().is_some_and(Vec::is_empty));
    assert!(c["note"].as_str().is_some_and(|n| n.contains("no finding on its path explains it")), "{c}");
    assert_eq!(
        (c["remote"].as_str(), c["remote_resolution"].as_str()),
        (Some("gid:::ffff:10.9.9.9"), Some("unresolved"))
    );
    assert_eq!(doc["unresolved_services"], serde_json::json!([svc_name(&svcs[2])]));

    assert_eq!((d["rank"].as_u64(), d["grade"].as_str()), (Some(3), Some("medium")), "{d}");
    assert_eq!(d["affected_by"][0]["entity"], "tor1|spine0");
    assert_eq!(d["affected_by"][0]["confirmed"], false);
    assert_eq!(d["remote_resolution"], "inventory");

    assert_eq!((b["rank"].as_u64(), b["grade"].as_str()), (Some(4), Some("none")), "{b}");
    assert!(b["affected_by"].as_array().is_some_and(Vec::is_empty), "B's path avoids tor1: {b}");
    assert_eq!((b["lost"].as_u64(), b["remote_resolution"].as_str()), (Some(0), Some("inventory")));
    assert!(b["path"].as_array().is_some_and(|p| p.iter().any(|e| e == "link:tor2|spine0")), "{b}");

    // The table says the same, worst first.
    let at = |needle: &str| table.find(needle).unwrap_or_else(|| panic!("{needle} missing from\n{table}"));
    assert!(table.contains("4 traced service connections"), "{table}");
    assert!(at("ib_write_bw[4242] qp 17->18") < at("ib_write_bw[4243] qp 19->20"), "{table}");
    assert!(table.contains("link tor1|spine0 (confirmed)"), "{table}");

    // --format json prints the same document.
    let out = analyze(&[
        "localize",
        "--format",
        "json",
        "--inventory",
        inv.to_str().expect("utf-8"),
        seg.to_str().expect("utf-8"),
    ]);
    let printed: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(printed, doc);
}

/// The export names each service probe's connection, and its target is the remote RNIC; the
/// `service_*` columns carry what the report's service rows are keyed and labelled by, null on
/// every mesh probe.
#[test]
fn export_names_the_service_of_each_service_probe() {
    let (dir, seg, _inv) = fleet(true);
    let pq = dir.path().join("probes.parquet");
    let out = analyze(&["export", "--parquet", pq.to_str().expect("utf-8"), seg.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    use polars::prelude::*;
    let df = ParquetReader::new(std::fs::File::open(&pq).expect("open")).finish().expect("read parquet");
    let service = df.column("service").expect("service column").str().expect("str");
    let target = df.column("target").expect("target").str().expect("str");
    let svcs = services();
    let a = svc_name(&svcs[0]);
    let rows: Vec<usize> = (0..df.height()).filter(|&i| service.get(i) == Some(a.as_str())).collect();
    assert_eq!(rows.len() as u64, PER_SERVICE * WINDOWS);
    assert!(rows.iter().all(|&i| target.get(i) == Some("tor1-h0/rxe0")));
    let mesh = (0..df.height()).filter(|&i| service.get(i).is_none()).count();
    assert_eq!(mesh as u64, RNICS as u64 * (RNICS as u64 - 1) * PER_PAIR * WINDOWS);
    let text = |c: &str| df.column(c).unwrap_or_else(|e| panic!("{c}: {e}")).str().expect("str").clone();
    let number = |c: &str| df.column(c).unwrap_or_else(|e| panic!("{c}: {e}")).u32().expect("u32").clone();
    let (entity, resolution, comm) = (text("service_entity"), text("service_remote_resolution"), text("service_comm"));
    let (prober, remote) = (text("service_prober"), text("service_remote"));
    let (pid, lq, rq, label) = (
        number("service_pid"),
        number("service_local_qpn"),
        number("service_remote_qpn"),
        number("service_flow_label"),
    );
    for &i in &rows {
        assert_eq!(entity.get(i), Some("ib_write_bw[4242] qp 17->18 tor0-h0/rxe0->tor1-h0/rxe0"));
        assert_eq!((prober.get(i), remote.get(i)), (Some("tor0-h0/rxe0"), Some("tor1-h0/rxe0")));
        assert_eq!((resolution.get(i), comm.get(i)), (Some("agent"), Some("ib_write_bw")));
        assert_eq!((pid.get(i), lq.get(i), rq.get(i), label.get(i)), (Some(4242), Some(17), Some(18), Some(0xABCDE)));
    }
    let with_entity = (0..df.height()).filter(|&i| entity.get(i).is_some()).count();
    assert_eq!(with_entity, df.height() - mesh, "a service_entity on every service probe and on no other");
    for c in ["service_entity", "service_prober", "service_pid", "service_flow_label"] {
        assert_eq!(df.column(c).expect("column").null_count(), mesh, "{c}: null on every mesh probe");
    }
}

/// The HTML page lists the services, worst first, escaped.
#[test]
fn html_page_lists_the_services() {
    let (dir, seg, inv) = fleet(true);
    let page = dir.path().join("report.html");
    let out = analyze(&[
        "html",
        "--output",
        page.to_str().expect("utf-8"),
        "--inventory",
        inv.to_str().expect("utf-8"),
        seg.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).expect("page");
    let section = &html[html.find("<h2>Services</h2>").expect("a services section")..];
    let at = |needle: &str| section.find(needle).unwrap_or_else(|| panic!("{needle} missing"));
    assert!(at("ib_write_bw[4242] qp 17-&gt;18") < at("ib_write_bw[4243] qp 19-&gt;20"), "worst first, escaped");
    assert!(section.contains("link tor1|spine0 from") && section.contains("(confirmed)"));
    assert!(section.contains("gid:::ffff:10.9.9.9 (unresolved)"));
    assert!(!html.contains("qp 17->18"), "labels are escaped");
}

/// Segments without services (as every earlier agent wrote them) still report and localise,
/// with no service rows and an empty services section.
#[test]
fn segments_without_services_give_an_empty_services_section() {
    let (_dir, seg, inv) = fleet(false);
    let seg_s = seg.to_str().expect("utf-8");
    let ds = ingest(&find_segments(std::slice::from_ref(&seg)).expect("list"), false);
    assert!(ds.services.is_empty() && ds.probes.service.is_empty() && !ds.probes.is_empty());

    let rows = json_rows(&analyze(&["report", "--format", "json", "--scope", "cluster,service", seg_s]));
    assert!(!rows.is_empty() && rows.iter().all(|r| r["scope"] == "cluster"), "{rows:?}");

    let out = analyze(&["localize", "--format", "json", "--inventory", inv.to_str().expect("utf-8"), seg_s]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["findings"][0]["entity"], "tor1|spine0", "the data is there: {doc}");
    assert_eq!(doc["services"], serde_json::json!([]));
    assert_eq!(doc["unresolved_services"], serde_json::json!([]));
    let table = analyze(&["localize", "--inventory", inv.to_str().expect("utf-8"), seg_s]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("no traced service connections"));
}

/// `analyze localize` reads a window at a time (`localize_ranges`): the same output, services
/// and all, as localisation over one table of the same files.
#[test]
fn localize_is_the_same_a_window_at_a_time() {
    use rocemesh_analyze::ingest::{Fields, ingest_with, plan};
    use rocemesh_analyze::localize::{Options, localize, localize_ranges};
    let (_dir, seg, inv) = fleet(true);
    let inv = rocemesh_formats::inventory::Inventory::load(&inv).expect("inventory");
    let files = find_segments(&[seg]).expect("list");
    let mut whole = ingest_with(&files, false, Fields::All, Some(&inv));
    whole.add_single_paths(&inv);
    let opts = Options::default();
    let one = localize(&whole, &opts);
    assert!(!one.services.is_empty() && !one.findings.is_empty(), "{one:?}");
    let mut p = plan(&files, Fields::All, Some(&inv), WINDOW_NS);
    p.ds.add_single_paths(&inv);
    let ranges = p.ranges(1);
    assert_eq!(ranges.len() as u64, WINDOWS);
    let ranged = localize_ranges(&mut p, ranges, &opts);
    assert_eq!(serde_json::to_value(&ranged).expect("json"), serde_json::to_value(&one).expect("json"));
}
