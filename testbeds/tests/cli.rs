//! The `testbeds` binary's exit codes, where they can be had without root or the VM: 0 clean,
//! 1 ran but found problems, 2 could not run (README, "Exit codes").

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn testbeds(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_testbeds")).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn scenario() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("scenarios/one-dead-rnic.toml")
}

/// Writes `findings` as `analyze localize --format json` would, and scores them with `extra`.
fn score(dir: &Path, findings: &str, extra: &[&str]) -> Output {
    let path = dir.join("findings.json");
    std::fs::write(&path, format!("{{\"findings\": [{findings}]}}")).unwrap();
    let (s, f) = (scenario(), path);
    let mut args = vec!["score", s.to_str().unwrap(), f.to_str().unwrap()];
    args.extend_from_slice(extra);
    testbeds(&args)
}

#[test]
fn score_fails_by_default_when_a_fault_is_missed_or_a_finding_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    // one-dead-rnic.toml: tor3-h5/rnic0 is dead from 90 s to the end.
    let right = r#"{"kind": "rnic", "entity": "tor3-h5/rnic0", "start_ns": 1700000090000000000, "end_ns": null}"#;
    let wrong = r#"{"kind": "rnic", "entity": "tor1-h2/rnic0", "start_ns": 1700000090000000000, "end_ns": null}"#;

    let out = score(tmp.path(), right, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Nothing found: recall 0. The old defaults (0) passed this.
    let out = score(tmp.path(), "", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // A false positive beside the right finding: precision 0.5.
    let out = score(tmp.path(), &format!("{right}, {wrong}"), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // Bars can still be lowered on purpose.
    let out = score(tmp.path(), &format!("{right}, {wrong}"), &["--min-precision", "0.5"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = score(tmp.path(), "", &["--min-recall", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn score_cannot_run_on_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let out = score(tmp.path(), "", &["--min-recall", "95"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--min-recall 95 is not a ratio"), "{}", text(&out));
    let path = tmp.path().join("findings.json");
    std::fs::write(&path, "not json").unwrap();
    let out = testbeds(&["score", scenario().to_str().unwrap(), path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("findings.json"), "{}", text(&out));
}

/// A VM that cannot be prepared is "could not run", 2 (it was 125).
#[test]
fn rxe_vm_that_cannot_be_prepared_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let blocker = tmp.path().join("a-file");
    std::fs::write(&blocker, "").unwrap();
    let cache = blocker.join("cache");
    let out = testbeds(&["rxe-vm", "--cache", cache.to_str().unwrap(), "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("creating the cache directory"), "{}", text(&out));
}
