//! Path traces as the agent writes them: hops known only by the address that answered
//! (`Switch` entries named by the address text, `addr` the IPv4-mapped address) and ACK-path
//! traces ending at a prober the responder knows only by address (a `Peer` entry). Ingest names
//! the hops through the inventory's switch addresses, leaves out and reports traces through
//! addresses it does not map, and resolves a peer to the RNIC that declares its address; the
//! `localize` binary lists the unmapped addresses in its table and JSON. A trace's first and last
//! hop, when no inventory switch lists them, are the endpoints' own ToRs.
//!
//! The fleet: tor0-h0/rxe0 (A, 10.0.0.1) under tor0, tor1-h0/rxe0 (B, 10.0.1.1) under tor1, and
//! spine0 between them. tor0 answers from 172.16.0.1 and 172.16.0.2, tor1 from 172.16.1.1 and
//! spine0 from 172.16.255.1 (the inventory's `addrs`); 172.16.254.9 is a switch the inventory
//! does not list. A probes B on flow labels 7 and 8 and traces both: label 7 crosses spine0,
//! label 8 the unlisted switch. B does not probe A; it traces the ACK path of label 7 back to A
//! (a peer), reaching tor0 through its other address; it probes only tor1-h1/rxe0 (C), under
//! its own ToR (so that its agent is seen running).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use rocemesh_analyze::ingest::{Dataset, Fields, UnmappedHop, ingest_with};
use rocemesh_analyze::inspect::find_segments;
use rocemesh_formats::gid::gid_bytes;
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::record::{Arrived, EndpointRole, MAX_HOPS, Outcome, PathRecord, ProbeRecord, TsSource};
use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity};
use serde_json::Value;

const T0: u64 = 1_700_000_010_000_000_000;
const A: &str = "tor0-h0/rxe0";
const B: &str = "tor1-h0/rxe0";
const C: &str = "tor1-h1/rxe0";
const UNLISTED: &str = "172.16.254.9";

fn ip(text: &str) -> IpAddr {
    text.parse().expect("address")
}

const INVENTORY: &str = r#"version = 1
[[tor]]
name = "tor0"
addrs = ["172.16.0.1", "172.16.0.2"]
[[tor]]
name = "tor1"
addrs = ["172.16.1.1"]
[[spine]]
name = "spine0"
addrs = ["172.16.255.1"]
[[host]]
name = "tor0-h0"
[[host.rnic]]
device = "rxe0"
tor = "tor0"
ip = "10.0.0.1"
[[host]]
name = "tor1-h0"
[[host.rnic]]
device = "rxe0"
tor = "tor1"
ip = "10.0.1.1"
[[host]]
name = "tor1-h1"
[[host.rnic]]
device = "rxe0"
tor = "tor1"
ip = "10.0.1.2"
"#;

/// How B's file names the hops and the prober of its ACK-path trace.
#[derive(Clone, Copy, PartialEq)]
enum Style {
    /// As the agent: hops and the prober by address; A's own entry has no address (as today's
    /// agent writes it).
    Agent,
    /// Hops by name (simulator style, zero address); the prober by address, which A's own entry
    /// declares.
    NamedHops,
}

fn writer(dir: &Path, host: &str, tor: &str) -> SegmentWriter {
    let id = WriterIdentity {
        host: host.into(),
        device: "rxe0".into(),
        tor: tor.into(),
        agent_epoch: 1,
        tool: "path-traces-test".into(),
    };
    SegmentWriter::new(WriterConfig::new(dir.join(host)), id).expect("writer")
}

/// A switch entry as the agent writes it: named by the address, with the address.
fn hop(w: &mut SegmentWriter, addr: &str) -> u32 {
    w.endpoint(EndpointRole::Switch, addr, "", gid_bytes(ip(addr)))
}

/// 20 probes, 100 ms apart from T0, alternating flow labels 7 and 8, all answered.
fn probes(w: &mut SegmentWriter, prober: u32, target: u32, kind: u8) {
    for (i, label) in [7u32, 8].iter().cycle().take(20).enumerate() {
        w.append(&ProbeRecord {
            t1_unix_ns: T0 + i as u64 * 100_000_000,
            seq: i as u64,
            network_rtt_ns: 10_000,
            prober_delay_ns: 2_000,
            responder_delay_ns: 1_000,
            prober,
            target,
            flow_label: *label,
            responder_epoch: 1,
            kind,
            outcome: Outcome::Ok as u8,
            arrived: Arrived::ALL.0,
            ts_source: TsSource::KernelSoftware as u8,
        })
        .expect("append");
    }
}

fn trace(w: &mut SegmentWriter, src: u32, dst: u32, flow_label: u32, hops: &[u32]) {
    let mut all = [0u32; MAX_HOPS];
    all[..hops.len()].copy_from_slice(hops);
    w.append_path(&PathRecord { t_unix_ns: T0, src, dst, flow_label, hop_count: hops.len() as u32, hops: all })
        .expect("append path");
}

/// Writes A's and B's segments under `dir`; with `stray_peer`, B also traces toward 10.0.9.9,
/// an address nothing declares.
fn write_fleet(dir: &Path, style: Style, stray_peer: bool) -> PathBuf {
    let seg = dir.join("segments");
    let mut a = writer(&seg, "tor0-h0", "tor0");
    let own = if style == Style::Agent { [0; 16] } else { gid_bytes(ip("10.0.0.1")) };
    let a_id = a.endpoint(EndpointRole::Rnic, A, "tor0", own);
    let b_id = a.endpoint(EndpointRole::Rnic, B, "", gid_bytes(ip("10.0.1.1")));
    probes(&mut a, a_id, b_id, 1);
    let hops7 = [hop(&mut a, "172.16.0.1"), hop(&mut a, "172.16.255.1"), hop(&mut a, "172.16.1.1")];
    trace(&mut a, a_id, b_id, 7, &hops7);
    let hops8 = [hop(&mut a, "172.16.0.1"), hop(&mut a, UNLISTED), hop(&mut a, "172.16.1.1")];
    trace(&mut a, a_id, b_id, 8, &hops8);
    a.finish().expect("finish");

    let mut b = writer(&seg, "tor1-h0", "tor1");
    let b_self = b.endpoint(EndpointRole::Rnic, B, "tor1", [0; 16]);
    let c_id = b.endpoint(EndpointRole::Rnic, C, "tor1", gid_bytes(ip("10.0.1.2")));
    probes(&mut b, b_self, c_id, 0);
    let peer = b.endpoint(EndpointRole::Peer, "10.0.0.1", "", gid_bytes(ip("10.0.0.1")));
    let back = match style {
        Style::Agent => [hop(&mut b, "172.16.1.1"), hop(&mut b, "172.16.255.1"), hop(&mut b, "172.16.0.2")],
        Style::NamedHops => ["tor1", "spine0", "tor0"].map(|n| b.endpoint(EndpointRole::Switch, n, "", [0; 16])),
    };
    trace(&mut b, b_self, peer, 7, &back);
    if stray_peer {
        let stray = b.endpoint(EndpointRole::Peer, "10.0.9.9", "", gid_bytes(ip("10.0.9.9")));
        trace(&mut b, b_self, stray, 7, &back);
    }
    b.finish().expect("finish");
    seg
}

fn load(seg: &Path, inventory: Option<&Inventory>) -> Dataset {
    let files = find_segments(&[seg.to_path_buf()]).expect("list");
    assert_eq!(files.len(), 2, "{files:?}");
    ingest_with(&files, false, Fields::All, inventory)
}

fn inventory() -> Inventory {
    Inventory::parse(INVENTORY, Path::new("inventory.toml")).expect("inventory")
}

/// The path as switch names.
fn named(ds: &Dataset, from: &str, to: &str, label: u32) -> Option<Vec<String>> {
    let key = (ds.rnic_id(from)?, ds.rnic_id(to)?, label);
    ds.paths.get(&key).map(|hops| hops.iter().map(|&h| ds.switches[h as usize].clone()).collect())
}

#[test]
fn address_named_hops_become_inventory_switches_and_a_peer_its_rnic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg = write_fleet(dir.path(), Style::Agent, false);
    let ds = load(&seg, Some(&inventory()));
    assert!(ds.problems.is_empty(), "{:?}", ds.problems);
    // tor0 answered A from one address and B from another: one switch.
    let mut switches = ds.switches.clone();
    switches.sort();
    assert_eq!(switches, ["spine0", "tor0", "tor1"]);
    assert_eq!(named(&ds, A, B, 7).expect("A -> B traced"), ["tor0", "spine0", "tor1"]);
    // B's ACK-path trace ends at the peer 10.0.0.1: A, found through the inventory (A's own
    // entry has no address).
    assert_eq!(named(&ds, B, A, 7).expect("B -> A traced"), ["tor1", "spine0", "tor0"]);
    // Label 8 crossed a switch the inventory does not list: left out, and reported.
    assert_eq!(named(&ds, A, B, 8), None);
    assert_eq!(ds.unmapped_hops, [UnmappedHop { addr: UNLISTED.into(), traces: 1 }]);
    assert_eq!(ds.paths.len(), 2);
    // The peer is no RNIC of its own.
    let names: Vec<&str> = ds.rnics.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [A, B, C]);
}

#[test]
fn without_an_inventory_only_the_ends_tors_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg = write_fleet(dir.path(), Style::Agent, false);
    let ds = load(&seg, None);
    // Every trace crosses a middle hop nobody names: none is placed.
    assert!(ds.paths.is_empty() && ds.switches.is_empty(), "{:?} {:?}", ds.paths, ds.switches);
    let hops: Vec<(&str, u64)> = ds.unmapped_hops.iter().map(|h| (h.addr.as_str(), h.traces)).collect();
    // Most traces first, then by address; each trace counts once per address. A's traces teach
    // their ends from the agents' own ToRs; B's trace toward the peer 10.0.0.1 teaches nothing,
    // its target unknown, so tor0's 172.16.0.2 at its end stays unmapped.
    assert_eq!(hops, [("172.16.255.1", 2), ("172.16.0.2", 1), (UNLISTED, 1)]);
    assert_eq!(ds.hops_learned, 0, "tor0's 172.16.0.1 and tor1's 172.16.1.1 are learned, but name no placed trace");
    let names: Vec<&str> = ds.rnics.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [A, B, C]);
    // Nothing declares the peer's address either (A's own entry has none): B's file says so.
    assert_eq!(ds.problems.len(), 1, "{:?}", ds.problems);
    assert!(ds.problems[0].problem.contains("peer address that no RNIC's dictionary entry"), "{:?}", ds.problems);
}

#[test]
fn a_peer_is_the_rnic_that_declares_its_address_and_an_undeclared_one_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg = write_fleet(dir.path(), Style::NamedHops, true);
    // No inventory: A's own dictionary entry declares 10.0.0.1.
    let ds = load(&seg, None);
    assert_eq!(named(&ds, B, A, 7).expect("B -> A traced"), ["tor1", "spine0", "tor0"]);
    let names: Vec<&str> = ds.rnics.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [A, B, C], "neither peer is an RNIC of its own");
    // The trace toward 10.0.9.9 is left out, and B's file reported with the address.
    assert_eq!(ds.problems.len(), 1, "{:?}", ds.problems);
    let p = &ds.problems[0];
    assert!(p.path.to_string_lossy().contains("tor1-h0"), "{p:?}");
    assert!(!p.skipped);
    assert!(
        p.problem.starts_with("1 path traces end at a peer address that no RNIC's dictionary entry and no inventory RNIC declares (10.0.9.9)"),
        "{}",
        p.problem
    );
}

fn analyze(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).output().expect("run analyze")
}

#[test]
fn localize_lists_unmapped_hops_in_its_table_and_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg = write_fleet(dir.path(), Style::Agent, false);
    let inv = dir.path().join("inventory.toml");
    std::fs::write(&inv, INVENTORY).expect("write inventory");
    let (seg, inv) = (seg.to_str().expect("utf-8"), inv.to_str().expect("utf-8"));

    let out = analyze(&["localize", "--format", "json", "--inventory", inv, seg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["unmapped_hops"], serde_json::json!([{ "addr": UNLISTED, "traces": 1 }]));
    // Label 7 votes on the traced path; label 8's probes have none.
    assert_eq!(doc["inter_tor_without_path"], 10);
    assert!(
        stderr.contains(&format!(
            "1 path-trace hop addresses no inventory switch lists, their traces left out: {UNLISTED} (1 traces)"
        )),
        "{stderr}"
    );

    let out = analyze(&["localize", "--inventory", inv, seg]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(
        table.contains(&format!("1 path-trace hop addresses no inventory switch lists; the traces through them were left out: {UNLISTED} (1 traces)")),
        "{table}"
    );
    assert!(table.contains("fix: add them to the inventory with `ctl inventory switch-addrs`"), "{table}");

    // Without the inventory nothing is named: every address is listed, and no probe has a path.
    // Exit 1: nothing names the peer of B's trace either (an input problem).
    let out = analyze(&["localize", "--format", "json", seg]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["unmapped_hops"].as_array().map(Vec::len), Some(3), "{}", doc["unmapped_hops"]);
    assert_eq!(doc["inter_tor_without_path"], 20);
    assert!(String::from_utf8_lossy(&out.stderr).contains("and pass --inventory"));
}

/// Switches that advertise one management address (the spine's here) answer traces from
/// interface addresses nobody listed: the ends of each trace are its endpoints' ToRs, so with
/// the spine's address alone every path of label 7 is whole.
#[test]
fn a_traces_first_and_last_hop_are_its_endpoints_tors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg = write_fleet(dir.path(), Style::Agent, false);
    let spine_only =
        INVENTORY.replace("addrs = [\"172.16.0.1\", \"172.16.0.2\"]\n", "").replace("addrs = [\"172.16.1.1\"]\n", "");
    assert!(!spine_only.contains("172.16.0.1") && !spine_only.contains("172.16.1.1"));
    let inv = Inventory::parse(&spine_only, Path::new("inventory.toml")).expect("inventory");
    let ds = load(&seg, Some(&inv));
    assert!(ds.problems.is_empty(), "{:?}", ds.problems);
    assert_eq!(named(&ds, A, B, 7).expect("A -> B traced"), ["tor0", "spine0", "tor1"]);
    assert_eq!(named(&ds, B, A, 7).expect("B -> A traced"), ["tor1", "spine0", "tor0"]);
    assert_eq!(named(&ds, A, B, 8), None, "its middle hop is no one's end");
    assert_eq!(ds.unmapped_hops, [UnmappedHop { addr: UNLISTED.into(), traces: 1 }]);
    assert_eq!(ds.hops_learned, 3, "172.16.0.1, 172.16.0.2 and 172.16.1.1");
    let mut switches = ds.switches.clone();
    switches.sort();
    assert_eq!(switches, ["spine0", "tor0", "tor1"]);
}

/// A switch entry with no address (the simulator's) keeps its name even with an inventory.
#[test]
fn named_hops_keep_their_names_with_an_inventory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg = write_fleet(dir.path(), Style::NamedHops, false);
    let ds = load(&seg, Some(&inventory()));
    assert_eq!(named(&ds, B, A, 7).expect("B -> A traced"), ["tor1", "spine0", "tor0"]);
    assert_eq!(named(&ds, A, B, 7).expect("A -> B traced"), ["tor0", "spine0", "tor1"]);
    assert_eq!(ds.switches.len(), 3, "{:?}", ds.switches);
}

/// A plan's ranges gather the same path traces as one ingest (placed, changed, unmapped, and
/// the problems of traces that cannot be placed), and localise the same.
#[test]
fn ranges_place_the_same_paths_and_localise_the_same() {
    use rocemesh_analyze::ingest::plan;
    use rocemesh_analyze::localize::{Options, localize, localize_ranges};
    for stray_peer in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let seg = write_fleet(dir.path(), Style::Agent, stray_peer);
        let inv = inventory();
        let whole = load(&seg, Some(&inv));
        assert!(!whole.paths.is_empty() && !whole.unmapped_hops.is_empty());
        let files = find_segments(&[seg]).expect("list");
        let mut p = plan(&files, Fields::All, Some(&inv), 30_000_000_000);
        let ranges = p.ranges(1);
        let opts = Options::default();
        let ranged = localize_ranges(&mut p, ranges, &opts);
        let ds = p.finish();
        assert_eq!(ds.paths, whole.paths);
        assert_eq!(ds.path_changes, whole.path_changes);
        assert_eq!(ds.unmapped_hops, whole.unmapped_hops);
        let said = |ds: &Dataset| {
            let mut v: Vec<String> =
                ds.problems.iter().map(|p| format!("{}: {}", p.path.display(), p.problem)).collect();
            v.sort();
            v
        };
        assert_eq!(said(&ds), said(&whole));
        assert_eq!(stray_peer, !said(&ds).is_empty());
        let json = |l| serde_json::to_value(l).expect("json");
        assert_eq!(json(&ranged), json(&localize(&whole, &opts)));
    }
}
