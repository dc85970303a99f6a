//! Switch counters beside findings, from a real Prometheus (Debian's package): a simulated
//! fabric with three faults is localised with `--prometheus`, against TSDB blocks made by
//! `promtool tsdb create-blocks-from openmetrics` from switch series in snmp_exporter's
//! (`if_mib`) and gnmic's naming, for every port of the simulator's inventory.
//!
//! - A lossy link, tor1|spine0: tor1's port to spine0 discards what it cannot send and
//!   spine0's port to tor1 counts input errors, from the fault's start to its end. The finding
//!   names both ports and is corroborated.
//! - A lossy RNIC whose ToR port's counters tick at their usual rate throughout: silent.
//! - A lossy RNIC whose ToR port has no series: said so.
//! - Every port ticks at a usual rate of one a minute on each counter, so nothing is flat by
//!   construction.
//!
//! The same localisation with an unreachable Prometheus, and without one, gives the same
//! findings and exit code; the unreachable one is said once.
//!
//! `analyze live`'s asking, against the same Prometheus: the same verdicts at a finding's open
//! (its first window) and close (all of it).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rocemesh_analyze::live::Event;
use rocemesh_analyze::live::ask::Asker;
use rocemesh_analyze::switches::map::CounterMap;
use rocemesh_analyze::switches::prom::Prometheus as Prom;
use rocemesh_analyze::switches::{Judge, Options, learn_addresses};
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::scenario::Scenario;

const SCENARIO: &str = r#"
version = 1
name = "switch counters: a lossy link, two lossy RNICs"
seed = 21
duration_s = 600
window_s = 30

[topology]
spines = 4
tors = 8
hosts_per_tor = 8

[probing]
tor_mesh_pps = 10
inter_tor_tors = 7
inter_tor_pps = 2
flow_labels = 32
timeout_ms = 500

[normal]
network_rtt_us = { p50 = 4.0, p99 = 12.0 }
prober_delay_us = { p50 = 2.0, p99 = 15.0 }
responder_delay_us = { p50 = 1.0, p99 = 6.0 }
loss = 1e-6

[[fault]]
kind = "link_loss"
target = "tor1|spine0"
loss = 0.3
start_s = 300
end_s = 480

[[fault]]
kind = "rnic_loss"
target = "tor2-h1/rnic0"
loss = 0.3
start_s = 300
end_s = 480

[[fault]]
kind = "rnic_loss"
target = "tor3-h2/rnic0"
loss = 0.3
start_s = 300
end_s = 480
"#;

const SILENT: &str = "tor2-h1/rnic0";
const BARE: &str = "tor3-h2/rnic0";
const STEP_S: u64 = 15;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Every switch port the inventory cables, as (switch, port).
fn ports(inv: &Inventory) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for l in &inv.links {
        out.push((l.a.clone(), l.a_port.clone().expect("the simulator's inventory has ports")));
        out.push((l.b.clone(), l.b_port.clone().expect("ports")));
    }
    for r in inv.hosts.iter().flat_map(|h| &h.rnics) {
        out.push((r.tor.clone(), r.tor_port.clone().expect("ports")));
    }
    out
}

/// The port of the inventory's RNIC `name` (host/device).
fn rnic_port(inv: &Inventory, name: &str) -> (String, String) {
    let (host, device) = name.split_once('/').unwrap();
    let r = inv.hosts.iter().find(|h| h.name == host).unwrap().rnics.iter().find(|r| r.device == device).unwrap();
    (r.tor.clone(), r.tor_port.clone().unwrap())
}

/// OpenMetrics text for every port but `bare`, a sample every 15 s: a usual rate of one a
/// minute on each counter (phased by port and counter), and during the fault 40 discards/s out
/// of tor1's port to spine0 and 15 input errors/s into spine0's port from tor1. In
/// snmp_exporter's naming (ToRs by a domain name and port, spines by name) and gnmic's.
fn openmetrics(inv: &Inventory, bare: &(String, String), from_s: u64, to_s: u64, fault: (u64, u64)) -> String {
    let tor1_up = inv.links.iter().find(|l| l.a == "tor1" && l.b == "spine0").unwrap();
    let lossy_out = ("tor1".to_string(), tor1_up.a_port.clone().unwrap());
    let lossy_in = ("spine0".to_string(), tor1_up.b_port.clone().unwrap());
    let counters = ["in_errors", "in_discards", "out_errors", "out_discards"];
    let if_mib = ["ifInErrors", "ifInDiscards", "ifOutErrors", "ifOutDiscards"];
    let gnmic = counters.map(|c| format!("interfaces_interface_state_counters_{c}"));
    let all: Vec<(String, String)> = ports(inv).into_iter().filter(|p| p != bare).collect();
    let mut text = String::new();
    for (i, (switch, port)) in all.iter().enumerate() {
        for (c, _) in counters.iter().enumerate() {
            let mut value = 0u64;
            let instance =
                if switch.starts_with("tor") { format!("{switch}.pod1.example:9116") } else { switch.clone() };
            let mut series = Vec::new();
            for t in (from_s..=to_s).step_by(STEP_S as usize) {
                // The usual rate: one a minute.
                if (t / STEP_S + (i * 4 + c) as u64).is_multiple_of(4) {
                    value += 1;
                }
                let faulty = t > fault.0 && t <= fault.1;
                if faulty && c == 3 && (switch, port) == (&lossy_out.0, &lossy_out.1) {
                    value += 40 * STEP_S;
                }
                if faulty && c == 0 && (switch, port) == (&lossy_in.0, &lossy_in.1) {
                    value += 15 * STEP_S;
                }
                series.push((t, value));
            }
            for (t, v) in &series {
                let _ =
                    writeln!(text, "{}{{instance=\"{instance}\",job=\"snmp\",ifName=\"{port}\"}} {v} {t}", if_mib[c]);
                let _ = writeln!(text, "{}{{source=\"{switch}\",interface_name=\"{port}\"}} {v} {t}", gnmic[c]);
            }
        }
    }
    // The switches' addresses, as snmp_exporter's IP-MIB walks name them: two of tor1's, one
    // of spine0's (ipAddressTable, IPv6), one both tor2 and tor3 claim, one of a switch the
    // inventory does not have.
    for (metric, instance, label, addr) in [
        ("ipAdEntIfIndex", "tor1.pod1.example:9116", "ipAdEntAddr", "172.31.1.1"),
        ("ipAdEntIfIndex", "tor1.pod1.example:9116", "ipAdEntAddr", "172.31.1.2"),
        ("ipAddressIfIndex", "spine0", "ipAddressAddr", "fd00:31::1"),
        ("ipAdEntIfIndex", "tor2.pod1.example:9116", "ipAdEntAddr", "172.31.9.9"),
        ("ipAdEntIfIndex", "tor3.pod1.example:9116", "ipAdEntAddr", "172.31.9.9"),
        ("ipAdEntIfIndex", "leaf9", "ipAdEntAddr", "172.31.8.8"),
    ] {
        let _ = writeln!(text, "{metric}{{instance=\"{instance}\",job=\"snmp\",{label}=\"{addr}\"}} 3 {from_s}");
    }
    text.push_str("# EOF\n");
    text
}

/// The test's switch-counter options: the `if_mib` map, 240 s before, a 30 s lookback, 30 s
/// windows.
fn options(url: &str) -> Options {
    Options {
        prometheus: Prom::new(url).unwrap(),
        map: CounterMap::resolve("if_mib").unwrap(),
        before_s: 240,
        lookback_s: 30,
        alpha: 0.001,
        window_ns: 30_000_000_000,
    }
}

/// The switches' addresses from the same Prometheus (snmp_exporter's IP-MIB series) added to an
/// inventory that lists none: each taken once, the one two switches claim and the unknown
/// switch's not.
fn learns_addresses(inv: &Inventory, url: &str) {
    let mut bare = inv.clone();
    for t in &mut bare.tors {
        t.addrs.clear();
    }
    for s in &mut bare.spines {
        s.addrs.clear();
    }
    let opts = options(url);
    let learned = learn_addresses(&mut bare, &opts).unwrap();
    assert_eq!(learned.added, 3, "{learned:?}");
    assert_eq!(learned.conflicting, ["172.31.9.9 (tor2, tor3)"], "{learned:?}");
    assert_eq!(learned.ignored, 1, "leaf9 is no inventory switch: {learned:?}");
    let addrs = |name: &str| -> Vec<String> {
        let t = bare.tors.iter().map(|t| (&t.name, &t.addrs)).chain(bare.spines.iter().map(|s| (&s.name, &s.addrs)));
        t.filter(|(n, _)| *n == name).flat_map(|(_, a)| a.iter().map(ToString::to_string)).collect()
    };
    assert_eq!(addrs("tor1"), ["172.31.1.1", "172.31.1.2"]);
    assert_eq!(addrs("spine0"), ["fd00:31::1"]);
    assert!(addrs("tor2").is_empty() && addrs("tor3").is_empty());
    // Asked again: everything is listed already.
    let again = learn_addresses(&mut bare, &opts).unwrap();
    assert_eq!((again.added, again.conflicting.len()), (0, 1), "{again:?}");
    // An address the inventory lists under another switch is not moved.
    let mut moved = bare.clone();
    moved.tors.iter_mut().find(|t| t.name == "tor1").unwrap().addrs.clear();
    moved.tors.iter_mut().find(|t| t.name == "tor4").unwrap().addrs.push("172.31.1.1".parse().unwrap());
    let m = learn_addresses(&mut moved, &opts).unwrap();
    assert_eq!(m.added, 1, "{m:?}");
    assert!(m.conflicting.iter().any(|c| c.starts_with("172.31.1.1 ")), "{m:?}");
}

fn localize(seg: &Path, inv: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_analyze"))
        .arg("localize")
        .arg(seg)
        .arg("--inventory")
        .arg(inv)
        .args(["--format", "json", "--counters-before-s", "240", "--counters-lookback-s", "30"])
        .args(extra)
        .output()
        .expect("running analyze localize")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    })
}

/// The findings without what the switches said.
fn bare_findings(v: &serde_json::Value) -> serde_json::Value {
    let mut f = v["findings"].clone();
    for x in f.as_array_mut().unwrap() {
        x.as_object_mut().unwrap().remove("switch");
    }
    f
}

fn finding<'a>(v: &'a serde_json::Value, kind: &str, entity: &str) -> &'a serde_json::Value {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == kind && f["entity"] == entity)
        .unwrap_or_else(|| panic!("no {kind} {entity} finding in {:#}", v["findings"]))
}

/// The counters of (switch, port) in a finding's switch evidence, by counter name.
fn port_counters(f: &serde_json::Value, switch: &str, port: &str) -> Option<BTreeMap<String, serde_json::Value>> {
    let p = f["switch"]["ports"].as_array()?.iter().find(|p| p["switch"] == switch && p["port"] == port)?;
    Some(p["counters"].as_array()?.iter().map(|c| (c["counter"].as_str().unwrap().to_string(), c.clone())).collect())
}

#[test]
#[ignore = "needs Debian's prometheus package (promtool and prometheus; scripts/setup installs it); scripts/test runs it"]
fn findings_say_what_the_switch_counters_did() {
    let dir = tempfile::tempdir().unwrap();
    let s = Scenario::parse(SCENARIO, Path::new("inline.toml")).unwrap();
    rocemesh_testbeds::simulate(&s, dir.path(), 0).unwrap();
    let inv_path: PathBuf = dir.path().join("inventory.toml");
    let inv = Inventory::load(&inv_path).unwrap();
    let seg = dir.path().join("segments");
    let start = s.start_unix_s;
    let bare = rnic_port(&inv, BARE);
    let text = openmetrics(&inv, &bare, start, start + s.duration_s + 60, (start + 300, start + 480));
    // The Clos testbed's: promtool's blocks, a real Prometheus on them, ready.
    let prom = rocemesh_testbeds::clos::counters::Prometheus::serve(&text, &dir.path().join("prometheus")).unwrap();
    let url = prom.url.clone();

    let plain = localize(&seg, &inv_path, &[]);
    let plain_json = json(&plain);
    for preset in ["if_mib", "gnmic"] {
        let out = localize(&seg, &inv_path, &["--prometheus", &url, "--counter-map", preset]);
        let v = json(&out);
        assert_eq!(out.status.code(), plain.status.code(), "{preset}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(bare_findings(&v), bare_findings(&plain_json), "{preset}: the findings are the same");
        assert_eq!(v["switch_counters"]["error"], serde_json::Value::Null, "{preset}: {:#}", v["switch_counters"]);

        // The lossy link: both ports named, the discards and errors shown and judged moved.
        let link = finding(&v, "link", "tor1|spine0");
        assert_eq!(link["switch"]["verdict"], "corroborated", "{preset}: {:#}", link["switch"]);
        let l = inv.links.iter().find(|l| l.a == "tor1" && l.b == "spine0").unwrap();
        let out_port = port_counters(link, "tor1", l.a_port.as_deref().unwrap()).expect("tor1's port named");
        let in_port = port_counters(link, "spine0", l.b_port.as_deref().unwrap()).expect("spine0's port named");
        assert_eq!(out_port["out_discards"]["moved"], true, "{preset}: {out_port:#?}");
        assert!(out_port["out_discards"]["during"].as_f64().unwrap() >= 40.0 * 150.0, "{preset}: {out_port:#?}");
        assert_eq!(in_port["in_errors"]["moved"], true, "{preset}: {in_port:#?}");
        // The counters that only ticked at their usual rate did not move.
        assert_eq!(out_port["in_errors"]["moved"], false, "{preset}: {out_port:#?}");

        // The RNIC whose port ticked as usual: silent, its port's counters shown.
        let silent = finding(&v, "rnic", SILENT);
        assert_eq!(silent["switch"]["verdict"], "silent", "{preset}: {:#}", silent["switch"]);
        let (tor, port) = rnic_port(&inv, SILENT);
        let c = port_counters(silent, &tor, &port).expect("its port named");
        assert_eq!(c.len(), 4, "{preset}: every counter of the map has series: {c:#?}");
        assert!(c.values().all(|c| c["moved"] == false && c["during"].as_f64().unwrap() > 0.0), "{preset}: {c:#?}");

        // The RNIC whose port has no series: said so.
        let bare_f = finding(&v, "rnic", BARE);
        assert_eq!(bare_f["switch"]["verdict"], "no_series", "{preset}: {:#}", bare_f["switch"]);
        let c = port_counters(bare_f, &bare.0, &bare.1).expect("its port named");
        assert!(c.is_empty(), "{preset}: {c:#?}");

        // The table says it under each finding.
        let table = Command::new(env!("CARGO_BIN_EXE_analyze"))
            .arg("localize")
            .arg(&seg)
            .arg("--inventory")
            .arg(&inv_path)
            .args([
                "--counters-before-s",
                "240",
                "--counters-lookback-s",
                "30",
                "--prometheus",
                &url,
                "--counter-map",
                preset,
            ])
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&table.stdout);
        println!("{preset}:\n{table}");
        assert!(
            table.contains(&format!("switches corroborated: tor1 {}: out_discards +", l.a_port.as_deref().unwrap())),
            "{table}"
        );
        assert!(table.contains(&format!("switches no_series: {} {}: no series", bare.0, bare.1)), "{table}");
    }

    // The page shows them beside each finding.
    let page = dir.path().join("page.html");
    let out = Command::new(env!("CARGO_BIN_EXE_analyze"))
        .arg("html")
        .arg("--output")
        .arg(&page)
        .arg("--inventory")
        .arg(&inv_path)
        .args(["--counters-before-s", "240", "--counters-lookback-s", "30", "--prometheus", &url])
        .arg(&seg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), plain.status.code(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = std::fs::read_to_string(&page).unwrap();
    let l = inv.links.iter().find(|l| l.a == "tor1" && l.b == "spine0").unwrap();
    assert!(page.contains("<th>switch ports and counters</th>"), "no switches column");
    assert!(
        page.contains(&format!("<td>switches corroborated: tor1 {}: out_discards +", l.a_port.as_deref().unwrap()))
    );
    assert!(page.contains("<td>switches silent: "));
    if let Some(keep) = std::env::var_os("ROCEMESH_KEEP_PAGE") {
        std::fs::copy(dir.path().join("page.html"), keep).unwrap();
    }

    // Unreachable: said once, nothing else changes.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let out = localize(&seg, &inv_path, &["--prometheus", &nowhere]);
    let v = json(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), plain.status.code(), "{stderr}");
    assert_eq!(v["findings"], plain_json["findings"], "no finding gains a switch field");
    assert_eq!(stderr.matches("switch counters:").count(), 1, "{stderr}");
    assert!(stderr.contains(&nowhere) && stderr.contains("the findings stand without them"), "{stderr}");

    live_asks(&inv, &url, &nowhere, start);
    learns_addresses(&inv, &url);
}

/// `analyze live --prometheus`'s asking ([`Asker`]) against the same Prometheus: each finding's
/// first window once it opens, its whole span once it closes; a host finding is not asked; an
/// unreachable Prometheus is said once and counted.
fn live_asks(inv: &Inventory, url: &str, nowhere: &str, start: u64) {
    let s_ns = |s: u64| s * 1_000_000_000;
    let window_ns = s_ns(30);
    let judge = |url: &str| Judge::new(inv.clone(), options(url));
    let open_at = |kind: &str, entity: &str, at_s: u64| Event::Open {
        kind: kind.into(),
        entity: entity.into(),
        window_start_ns: s_ns(start + at_s),
        score: 0.3,
        evidence: String::new(),
    };
    let open = |kind: &str, entity: &str| open_at(kind, entity, 300);
    let link_close_at = |end_s: u64| Event::Close {
        kind: "link".into(),
        entity: "tor1|spine0".into(),
        start_ns: s_ns(start + 300),
        end_ns: s_ns(start + end_s),
        windows: (end_s - 300) / 30,
    };
    let link_close = link_close_at(480);
    let opened = [open("link", "tor1|spine0"), open("rnic", SILENT), open("rnic", BARE), open("host", "tor4-h0")];
    // Until all `n` answers are in (the asking thread takes a query each), or `wait_s` passed.
    let answers = |asker: &mut Asker, now_ns: u64, n: usize, wait_s: u64| {
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(wait_s);
        while lines.len() < n && Instant::now() < deadline {
            asker.poll(now_ns, &mut lines);
            std::thread::sleep(Duration::from_millis(20));
        }
        lines
    };
    let mut asker = Asker::start(judge(url), window_ns).unwrap();
    asker.note(&opened);
    // Not yet due (the first window's end plus the lookback): nothing is asked in 2 s, though
    // an answer takes a few ms.
    assert!(answers(&mut asker, s_ns(start + 330 + 29), 1, 2).is_empty(), "asked before a sample past the span");
    assert_eq!(
        asker.line_of("host", "tor4-h0").map(String::as_str),
        Some("not asked: a host finding involves no switch port")
    );
    assert!(
        asker.line_of("rnic", BARE).is_some_and(|l| l.starts_with("not answered yet")),
        "{:?}",
        asker.line_of("rnic", BARE)
    );
    let mut lines = answers(&mut asker, s_ns(start + 330 + 30), 2, 60);
    // The port without series is not settled: asked once more a lookback later, and only
    // that answer is written.
    assert!(asker.line_of("rnic", BARE).is_some_and(|l| l.starts_with("not answered yet")), "{lines:#?}");
    assert!(answers(&mut asker, s_ns(start + 330 + 59), 1, 2).is_empty(), "asked again before a lookback passed");
    lines.extend(answers(&mut asker, s_ns(start + 330 + 60), 1, 60));
    let verdict = |lines: &[Event], entity: &str, at: &str| {
        lines
            .iter()
            .find_map(|e| match e {
                Event::Switches { entity: e, at: a, counters, summary, .. } if e == entity && *a == at => {
                    Some((counters.verdict.name(), summary.clone()))
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("no {at} answer for {entity} in {lines:#?}"))
    };
    assert_eq!(lines.len(), 3, "the host finding involves no switch port: {lines:#?}");
    let (link_v, link_line) = verdict(&lines, "tor1|spine0", "open");
    assert_eq!(link_v, "corroborated", "{link_line}");
    assert_eq!(verdict(&lines, SILENT, "open").0, "silent");
    assert_eq!(verdict(&lines, BARE, "open").0, "no_series");
    assert_eq!(asker.line_of("link", "tor1|spine0"), Some(&link_line), "the page shows the open finding's");
    asker.note(&[link_close]);
    assert_eq!(asker.line_of("link", "tor1|spine0"), None, "closed: no longer shown");
    let closed = answers(&mut asker, s_ns(start + 480 + 30), 1, 60);
    assert_eq!(verdict(&closed, "tor1|spine0", "close").0, "corroborated");
    assert_eq!(asker.counts.get("corroborated"), Some(&2), "{:?}", asker.counts);

    // Opened, closed and opened again before the first open's answer: that answer is not the
    // second occurrence's.
    let mut again = Asker::start(judge(url), window_ns).unwrap();
    again.note(&[open("link", "tor1|spine0"), link_close_at(330), open_at("link", "tor1|spine0", 360)]);
    let first = answers(&mut again, s_ns(start + 330 + 30), 2, 60);
    assert_eq!(first.len(), 2, "the first occurrence's open and close: {first:#?}");
    let shown = again.line_of("link", "tor1|spine0").cloned().unwrap_or_default();
    assert!(shown.starts_with("not answered yet"), "the reopened finding shows {shown}");

    // Unreachable: one problem line, every question counted as failed.
    let mut down = Asker::start(judge(nowhere), window_ns).unwrap();
    down.note(&opened);
    let mut said = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while down.counts.get("failed") != Some(&3) && Instant::now() < deadline {
        down.poll(s_ns(start + 400), &mut said);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(down.counts.get("failed"), Some(&3), "{:?}", down.counts);
    let page = down.line_of("link", "tor1|spine0").cloned().unwrap_or_default();
    assert!(page.starts_with("not answered: ") && page.contains(nowhere), "{page}");
    assert!(
        matches!(&said[..], [Event::Problem { reason, from, .. }] if reason == "prometheus" && from == nowhere),
        "{said:#?}"
    );
}
