//! `agent doctor` on this machine, as an operator runs it: the demo's config loads, every check
//! prints, and a host without RDMA (CI's) gets a warning with the fix, not a failure or a crash.

use std::process::Command;

use serde_json::Value;

#[test]
fn doctor_on_this_host_checks_everything_and_fails_nothing_it_should_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = rocemesh_agent::demo::write(dir.path(), 2, 18_761, false).expect("demo config");
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["doctor", "--format", "json", "--config"])
        .arg(&config)
        .output()
        .expect("run agent doctor");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let checks = doc["checks"].as_array().expect("checks");
    let level = |area: &str| checks.iter().find(|c| c["area"] == area).map(|c| c["level"].as_str().unwrap_or(""));
    assert_eq!(level("config"), Some("ok"), "{doc:#}");
    assert_eq!(level("pinglist"), Some("ok"), "{doc:#}");
    for area in ["memlock", "caps", "btf", "time", "core"] {
        assert!(level(area).is_some(), "no {area} check: {doc:#}");
    }
    let no_rdma = std::fs::read_dir("/sys/class/infiniband").map_or(true, |mut d| d.next().is_none());
    if no_rdma {
        assert_eq!(level("rdma"), Some("warn"), "a host without RDMA warns: {doc:#}");
    }
    // The exit code is the worst level's: 0 ok or info, 1 warn, 2 fail.
    let want = match doc["worst"].as_str() {
        Some("ok" | "info") => 0,
        Some("warn") => 1,
        _ => 2,
    };
    assert_eq!(out.status.code(), Some(want), "{doc:#}");
    let failed: Vec<&Value> = checks.iter().filter(|c| c["level"] == "fail").collect();
    // The one failure a CI host may rightly have is a memlock limit below glommio's minimum.
    assert!(failed.iter().all(|c| c["area"] == "memlock"), "{failed:#?}");
}
