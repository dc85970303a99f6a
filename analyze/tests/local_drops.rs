//! End to end: a real agent (in-process, UDP transport on loopback) whose sends to one target
//! fail in its own kernel, then `analyze report` and `analyze localize` over what it wrote.
//! Those probes must show as local drops, not as loss, and localize must find nothing: at
//! f9b751e the agent recorded them `Lost` and both blamed the network for a fault of the host.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rocemesh_formats::pinglist::Pinglist;
use serde_json::Value;

fn analyze(args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).output().expect("run analyze");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    (out.status.code().unwrap_or(-1), doc, stderr)
}

#[test]
fn sends_that_fail_locally_are_local_drops_in_report_and_no_finding_in_localize() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = rocemesh_agent::demo::write(dir.path(), 3, 18_731, false).expect("demo config");
    // Shard lo0 also probes a target its kernel refuses to send to: the IPv4 broadcast address
    // without SO_BROADCAST fails with EACCES before anything leaves the host.
    let pl_path = dir.path().join("pinglist.toml");
    let mut pl = Pinglist::load(&pl_path).expect("pinglist");
    let mut unsendable = pl.targets[0].clone();
    unsendable.to = "loopback/bcast".into();
    unsendable.addr = std::net::Ipv4Addr::BROADCAST.into();
    unsendable.rate_pps = 20.0;
    pl.targets.push(unsendable);
    std::fs::write(&pl_path, pl.to_toml_string().expect("toml")).expect("write pinglist");

    let cfg = rocemesh_agent::config::AgentConfig::load(&config).expect("config");
    let reports = rocemesh_agent::runtime::run(&cfg, Some(Duration::from_secs(5))).expect("agent run");
    let lo0 = reports.iter().find(|r| r.device == "lo0").expect("lo0 ran");
    let local: u64 = lo0.stats.local_drops.iter().sum();
    assert!(local >= 60, "5 s at 20/s to the unsendable target: {:?}", lo0.stats);
    assert_eq!(lo0.stats.lost, 0, "{:?}", lo0.stats);

    let seg = dir.path().join("segments");
    let seg_s = seg.to_str().expect("utf-8");
    let (code, doc, err) = analyze(&["report", "--format", "json", "--scope", "cluster,pair", seg_s]);
    assert_eq!(code, 0, "{err}");
    let rows = doc["rows"].as_array().expect("rows");
    let to_bcast: Vec<&Value> = rows
        .iter()
        .filter(|r| r["scope"] == "pair" && r["entity"].as_str().is_some_and(|e| e.ends_with("->loopback/bcast")))
        .collect();
    assert!(!to_bcast.is_empty(), "the unsendable pair has rows");
    let drops: u64 = to_bcast.iter().map(|r| r["local_drop"].as_u64().expect("local_drop column")).sum();
    assert_eq!(drops, local, "every local drop the agent counted is in the report");
    for r in &to_bcast {
        assert_eq!((r["lost"].as_u64(), r["unreachable"].as_u64()), (Some(0), Some(0)), "{r}");
        assert!(r["sla_violations"].as_array().is_none_or(|v| v.is_empty()), "not an SLA breach: {r}");
    }
    for r in rows.iter().filter(|r| r["scope"] == "cluster") {
        assert_eq!(r["lost"].as_u64(), Some(0), "{r}");
        let ratio = r["loss_ratio"].as_f64().unwrap_or(0.0);
        assert!(ratio == 0.0, "the cluster lost nothing: {r}");
    }

    let (code, doc, err) = analyze(&["localize", "--format", "json", seg_s]);
    assert_eq!(code, 0, "{err}");
    let findings = doc["findings"].as_array().expect("findings");
    // On a loaded machine the in-process agent can freeze for a while (152 ms once in CI, against
    // its usual 25 ms spacing): localize then rightly finds that host frozen, from the send gap
    // its own records show. That is neither a network fault nor about the local drops; any other
    // finding, or a frozen host without such a gap, fails.
    let longest_gap_ns = longest_send_gap_ns(&seg);
    for f in findings {
        let evidence = f["evidence"].as_str().unwrap_or_default();
        assert!(
            f["kind"] == "host" && evidence.contains("no probe sent for"),
            "a host's own send failures are no network fault: {findings:#?}"
        );
        assert!(
            longest_gap_ns >= rocemesh_analyze::ingest::LONG_GAP_MIN_NS,
            "a frozen host without a send gap in its records ({longest_gap_ns} ns at most): {f}"
        );
    }
    assert!(doc["records"].as_u64().is_some_and(|n| n > 0), "localize read the agent's records");
    assert!(Path::new(&seg).join("lo0").exists());
}

/// The longest time between two consecutive send times of one file's records, over every file.
fn longest_send_gap_ns(dir: &Path) -> u64 {
    let files = rocemesh_analyze::inspect::find_segments(&[dir.to_path_buf()]).expect("list segments");
    assert!(!files.is_empty(), "the agent wrote segments");
    let mut longest = 0;
    for f in files {
        let r = rocemesh_formats::segment::SegmentReader::open(&f).expect("open");
        let mut t1: Vec<u64> = r.probe_chunks().flat_map(|c| c.t1_unix_ns.iter().map(|t| t.to_native())).collect();
        t1.sort_unstable();
        longest = t1.windows(2).map(|p| p[1] - p[0]).max().unwrap_or(0).max(longest);
    }
    longest
}
