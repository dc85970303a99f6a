//! The embedded default as `scripts/run` runs it: real agent shards on loopback, one of them
//! the injected faulty RNIC (`agent demo --inject-loss`), then `analyze localize` must name that
//! RNIC and nothing else, and `analyze html` must write a page with it on the time axis.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

fn analyze(args: &[&str]) -> (i32, Vec<u8>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).output().expect("run analyze");
    (out.status.code().unwrap_or(-1), out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A UDP port free on 127.0.0.1 now (the shards bind it on 127.0.0.1-3).
fn free_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.local_addr().expect("addr").port()
}

#[test]
fn the_demo_finds_its_injected_fault_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = rocemesh_agent::demo::write(dir.path(), 3, free_port(), false).expect("demo config");
    let mut cfg = rocemesh_agent::config::AgentConfig::load(&config).expect("config");
    let faulty = rocemesh_agent::demo::inject_loss(&mut cfg, 0.25).expect("inject").expect("a fault");
    assert_eq!(faulty, "loopback/lo2");
    // 12 s at 20 probes/s from each of two peers, in windows of 5 s as scripts/run reads them:
    // at least one whole window, 200 probes to the faulty RNIC, ~50 of them lost.
    let reports = rocemesh_agent::runtime::run(&cfg, Some(Duration::from_secs(12))).expect("agent run");
    assert_eq!(reports.len(), 3, "every shard ran");

    let seg = dir.path().join("segments");
    let seg_s = seg.to_str().expect("utf-8");
    let (code, out, err) = analyze(&["localize", "--window-s", "5", "--format", "json", seg_s]);
    assert_eq!(code, 0, "{err}");
    let doc: Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}: {err}"));
    let findings = doc["findings"].as_array().expect("findings");
    let named: Vec<&Value> = findings.iter().filter(|f| f["kind"] == "rnic" && f["entity"] == faulty).collect();
    assert!(!named.is_empty(), "the injected RNIC is named: {findings:#?}");
    // A loaded machine can freeze the in-process agent for a while, and localize then rightly
    // finds its host frozen from the send gap in its records (analyze/tests/local_drops.rs);
    // any other finding is a false one.
    for f in findings.iter().filter(|f| f["entity"] != faulty) {
        let evidence = f["evidence"].as_str().unwrap_or_default();
        assert!(
            f["kind"] == "host" && evidence.contains("no probe sent for"),
            "only the injected fault: {findings:#?}"
        );
    }

    let page = dir.path().join("report.html");
    let (code, _, err) = analyze(&["html", "--window-s", "5", "--output", page.to_str().expect("utf-8"), seg_s]);
    assert_eq!(code, 0, "{err}");
    let html = std::fs::read_to_string(&page).expect("the page");
    // The finding is a span on the time charts' axis, and the cluster's series has a point per
    // window.
    let spans = html.split("const SPANS = ").nth(1).and_then(|s| s.split(";\n").next()).expect("the spans");
    let spans: Value = serde_json::from_str(spans).expect("spans are JSON");
    assert!(
        spans.as_array().is_some_and(|a| a.iter().any(|s| s["entity"] == faulty && s["kind"] == "rnic")),
        "{spans}"
    );
    let chart = html.split("const CHART = ").nth(1).and_then(|s| s.split(";\n").next()).expect("the chart");
    let chart: Value = serde_json::from_str(chart).expect("the chart is JSON");
    assert!(chart["cluster"].as_array().is_some_and(|c| c.len() >= 2), "a point per window: {chart}");
}
