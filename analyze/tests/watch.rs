//! `analyze watch` end to end: sealed segments of four agents arrive in a collection directory
//! over (data) time, one of them late but within the grace, one damaged, one after its windows
//! were emitted; a watch is killed mid-run and restarted. Every window must be emitted exactly
//! once, with rows identical to a batch `analyze report` over the same files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use rocemesh_formats::segment::SegmentReader;
use serde_json::Value;

mod common;
use common::{MINUTES, SEGMENT_NS, T0, host_file, write_agents};

const WINDOW_S: u64 = 30;
const GRACE_S: u64 = 300;
const SCOPES: &str = "cluster,tor_pair,tor,rnic,pair";

fn analyze(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).output().expect("run analyze")
}

/// Moves a file into the collection as `ctl collect` does: whole under a temporary name, then
/// renamed into place.
fn deliver(file: &Path, store: &Path, col: &Path) -> PathBuf {
    let rel = file.strip_prefix(store).expect("in the store");
    let to = col.join(rel);
    std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
    let part = to.with_extension("part");
    std::fs::copy(file, &part).expect("copy");
    std::fs::rename(&part, &to).expect("rename");
    to
}

fn last_ns(file: &Path) -> u64 {
    SegmentReader::open(file).expect("open").time_range().expect("records").1
}

fn records_of(file: &Path) -> u64 {
    SegmentReader::open(file).expect("open").probe_chunks().map(|c| c.t1_unix_ns.len() as u64).sum()
}

fn watch_args<'a>(state: &'a str, output: &'a str, col: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["watch", "--state", state, "--output", output, "--scope", SCOPES, "--window-s", "30"];
    v.extend(["--grace-s", "300", "--sla-loss", "0.01"]);
    v.extend(extra);
    v.push(col);
    v
}

fn lines(output: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(output).expect("read the output");
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn emitted_to(state: &Path) -> u64 {
    std::fs::read_to_string(state)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["emitted_to_ns"].as_u64())
        .unwrap_or(0)
}

#[test]
fn every_window_once_identical_to_a_batch_report() {
    assert_eq!(GRACE_S % WINDOW_S, 0);
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("store");
    let col = tmp.path().join("collection");
    std::fs::create_dir_all(&col).expect("mkdir");
    let agents = write_agents(&store);
    for files in &agents {
        assert!(files.len() >= 7, "every agent must rotate several times: {files:?}");
    }
    let (state, output) = (tmp.path().join("watch.state"), tmp.path().join("watch.jsonl"));
    let (state_s, output_s, col_s) =
        (state.to_str().expect("utf-8"), output.to_str().expect("utf-8"), col.to_str().expect("utf-8"));

    // wa-h1's third file arrives one batch late (within the grace); wb-h0's fifth is damaged;
    // wb-h1's first arrives only after its windows were emitted.
    let held = agents[1][2].clone();
    let damaged = agents[2][4].clone();
    let too_late = agents[3][0].clone();
    let mut bytes = std::fs::read(&damaged).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid..mid + 64].fill(0xA5);
    std::fs::write(&damaged, bytes).expect("damage");

    // Batches by data time: the files whose last record falls in each 2-minute step.
    let mut pending: Vec<PathBuf> =
        agents.iter().flatten().filter(|f| **f != too_late && **f != damaged).cloned().collect();
    let damaged_last = agents[2][3].clone();
    let step_count = MINUTES * 60_000_000_000 / SEGMENT_NS + 1;
    let mut delivered = Vec::new();
    let mut held_back = None;
    for step in 0..step_count {
        let until = T0 + (step + 1) * SEGMENT_NS;
        let (now, later): (Vec<PathBuf>, Vec<PathBuf>) = pending.into_iter().partition(|f| last_ns(f) < until);
        pending = later;
        for f in now {
            if f == held {
                held_back = Some(f);
                continue;
            }
            delivered.push(deliver(&f, &store, &col));
            if f == damaged_last {
                delivered.push(deliver(&damaged, &store, &col));
            }
        }
        if step == 3 {
            let f = held_back.take().expect("the held file's batch has passed");
            delivered.push(deliver(&f, &store, &col));
        }
        if step == 4 {
            // A watch that goes on by itself, killed once it has emitted something new: the
            // restart after it must neither lose nor repeat a window.
            let before = emitted_to(&state);
            let mut child = Command::new(env!("CARGO_BIN_EXE_analyze"))
                .args(watch_args(state_s, output_s, col_s, &["--poll-s", "0.05"]))
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn watch");
            let start = std::time::Instant::now();
            while emitted_to(&state) == before {
                assert!(start.elapsed().as_secs() < 120, "the running watch emitted nothing in 120 s");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            child.kill().expect("kill");
            child.wait().expect("wait");
            continue;
        }
        let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(0) || out.status.code() == Some(1), "step {step}: {stderr}");
    }
    assert!(pending.is_empty(), "undelivered: {pending:?}");
    assert!(emitted_to(&state) > T0 + 8 * 60_000_000_000, "windows must have been emitted along the way");

    // The too-late file, then the end of the collection.
    let too_late_at = deliver(&too_late, &store, &col);
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(1), "a late file is said: {}", String::from_utf8_lossy(&out.stderr));
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--flush"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    let all = lines(&output);
    let of = |kind: &str| all.iter().filter(|l| l["type"] == kind).collect::<Vec<_>>();
    let problems = of("problem");
    assert!(!problems.is_empty(), "the damaged file is said");
    let damaged_name = damaged.file_name().and_then(|n| n.to_str()).expect("name");
    let mut said = BTreeSet::new();
    for p in &problems {
        assert!(p["file"].as_str().expect("file").ends_with(damaged_name), "{p}");
        assert!(said.insert(p.to_string()), "said twice: {p}");
    }
    let late = of("late");
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0]["file"], Value::from(too_late_at.to_str().expect("utf-8")));
    assert_eq!(late[0]["records"], Value::from(records_of(&too_late)), "all its records were too late");

    // Rows: each (window, scope, entity) once, and exactly the batch report's rows over the
    // files the watch reported (all delivered ones but the too-late file).
    let mut watched = BTreeMap::new();
    for l in of("row") {
        let mut row = l.clone();
        row.as_object_mut().expect("object").remove("type");
        let key =
            (row["window_start_ns"].as_u64().expect("window"), row["scope"].to_string(), row["entity"].to_string());
        assert!(watched.insert(key.clone(), row).is_none(), "row {key:?} emitted twice");
    }
    let mut batch_args: Vec<&str> =
        vec!["report", "--format", "json", "--scope", SCOPES, "--window-s", "30", "--sla-loss", "0.01"];
    let delivered_s: Vec<String> = delivered.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    batch_args.extend(delivered_s.iter().map(String::as_str));
    let out = analyze(&batch_args);
    assert_eq!(out.status.code(), Some(1), "the damaged file is a problem: {}", String::from_utf8_lossy(&out.stderr));
    let batch: Value = serde_json::from_slice(&out.stdout).expect("json");
    let batch_rows = batch["rows"].as_array().expect("rows");
    let windows: BTreeSet<u64> = batch_rows.iter().map(|r| r["window_start_ns"].as_u64().expect("window")).collect();
    assert!(windows.len() >= 30, "the batch must span the 16 minutes: {} windows", windows.len());
    assert_eq!(watched.len(), batch_rows.len(), "row count");
    for r in batch_rows {
        let key = (r["window_start_ns"].as_u64().expect("window"), r["scope"].to_string(), r["entity"].to_string());
        assert_eq!(watched.get(&key), Some(r), "row {key:?}");
    }
    // The planted cases are among them: a window of the dead pair, and the held-back file's.
    assert!(batch_rows.iter().any(|r| r["scope"] == "pair"
        && r["entity"] == "wb-h1/mlx5_0->wa-h0/mlx5_0"
        && r["unreachable"].as_u64() > Some(0)));
    let held_window = T0 / 1_000_000_000 / WINDOW_S * WINDOW_S * 1_000_000_000 + 5 * 60_000_000_000;
    assert!(watched.keys().any(|(w, _, e)| *w == held_window && e == "\"wa-h1/mlx5_0\""));

    // Lines already written stay put: a restart over a complete state adds nothing.
    let before = std::fs::read(&output).expect("read");
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&output).expect("read"), before);
}

#[test]
fn a_state_of_another_window_or_a_shorter_output_is_refused_with_the_fix() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let col = tmp.path().join("collection");
    let agents = write_agents(&col);
    assert!(!agents[0].is_empty());
    let (state, output) = (tmp.path().join("s.json"), tmp.path().join("o.jsonl"));
    let (state_s, output_s, col_s) =
        (state.to_str().expect("utf-8"), output.to_str().expect("utf-8"), col.to_str().expect("utf-8"));
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::metadata(&output).expect("output").len() > 0);

    let mut other = watch_args(state_s, output_s, col_s, &["--once"]);
    let w = other.iter().position(|a| *a == "30").expect("window");
    other[w] = "60";
    let out = analyze(&other);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--window-s 30") && stderr.contains(state_s), "{stderr}");

    std::fs::write(&output, b"").expect("truncate");
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("move the state file away"), "{stderr}");
}

#[test]
fn a_file_gone_before_its_windows_are_emitted_is_said() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let col = tmp.path().join("collection");
    let agents = write_agents(&col);
    let (state, output) = (tmp.path().join("s.json"), tmp.path().join("o.jsonl"));
    let (state_s, output_s, col_s) =
        (state.to_str().expect("utf-8"), output.to_str().expect("utf-8"), col.to_str().expect("utf-8"));
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // The newest file of an agent: its windows are within the grace, so not emitted yet.
    let gone = agents[0].last().expect("files");
    assert!(emitted_to(&state) <= last_ns(gone), "its windows must still be pending");
    std::fs::remove_file(gone).expect("remove");
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--flush"]));
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let said: Vec<Value> = lines(&output).into_iter().filter(|l| l["type"] == "problem").collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0]["file"], Value::from(gone.to_str().expect("utf-8")));
}

/// A file whose windows are emitted over several passes, removed before the first of them, is
/// said once: at the first pass that plans it (each pass makes its own plan).
#[test]
fn a_file_gone_across_several_emitting_passes_is_said_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("store");
    let col = tmp.path().join("collection");
    std::fs::create_dir_all(&col).expect("mkdir");
    let agents = write_agents(&store);
    let (state, output) = (tmp.path().join("s.json"), tmp.path().join("o.jsonl"));
    let (state_s, output_s, col_s) =
        (state.to_str().expect("utf-8"), output.to_str().expect("utf-8"), col.to_str().expect("utf-8"));
    let deliver_until = |until: u64| -> Vec<PathBuf> {
        agents.iter().flatten().filter(|f| last_ns(f) < until).map(|f| deliver(f, &store, &col)).collect()
    };
    let window_ns = WINDOW_S * 1_000_000_000;
    // Where a pass will emit to, as the module documents it: every host live here, and the
    // fleet's time the newest T1 more than a quarter of them reached (the second newest of 4).
    let complete_to = |files: &[PathBuf]| -> u64 {
        let mut newest: BTreeMap<String, u64> = BTreeMap::new();
        for f in files {
            let host = f.parent().expect("parent").to_string_lossy().into_owned();
            let n = newest.entry(host).or_default();
            *n = (*n).max(last_ns(f));
        }
        let mut by_host: Vec<u64> = newest.into_values().collect();
        by_host.sort_unstable_by(|a, b| b.cmp(a));
        let fleet = by_host[by_host.len() / 4];
        (fleet - GRACE_S * 1_000_000_000) / window_ns * window_ns
    };
    let first = deliver_until(T0 + 8 * 60_000_000_000);
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let emitted_a = emitted_to(&state);
    assert_eq!(emitted_a, complete_to(&first), "the test's model of completion is the watch's");
    // The next batch moves completion into the middle of one of wa-h0's files: that file's
    // windows go out over this pass and the flush after it. It is removed before either.
    let second = deliver_until(T0 + 10 * 60_000_000_000);
    let emitted_b = complete_to(&second);
    let newest = second.iter().map(|f| last_ns(f)).max().expect("files");
    let in_col = |f: &PathBuf| col.join(f.strip_prefix(&store).expect("in the store"));
    let gone = agents[0]
        .iter()
        .map(in_col)
        .filter(|f| second.contains(f))
        .find(|f| {
            let (a, b) = (SegmentReader::open(f).expect("open").time_range().expect("records").0, last_ns(f));
            a >= emitted_a && a < emitted_b && b >= emitted_b
        })
        .expect("a file of wa-h0 across the second pass's end");
    std::fs::remove_file(&gone).expect("remove");
    let problems_of = |output: &Path| -> Vec<Value> {
        lines(output)
            .into_iter()
            .filter(|l| l["type"] == "problem" && l["file"] == gone.to_str().expect("utf-8"))
            .collect()
    };
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(1), "the gone file is a problem: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(emitted_to(&state), emitted_b, "the pass ends inside the gone file's span");
    assert_eq!(problems_of(&output).len(), 1, "said at the first pass that plans it");
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--flush"]));
    assert_eq!(out.status.code(), Some(0), "nothing new to say: {}", String::from_utf8_lossy(&out.stderr));
    assert!(emitted_to(&state) > newest, "flushed past the newest record");
    let said = problems_of(&output);
    assert_eq!(said.len(), 1, "said once over both passes: {said:?}");
    assert!(said[0]["problem"].as_str().is_some_and(|p| !p.is_empty()), "{said:?}");
}

/// The public scenario `name`.
fn public_scenario(name: &str) -> rocemesh_formats::scenario::Scenario {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../testbeds/scenarios/{name}.toml"));
    rocemesh_formats::scenario::Scenario::load(&p)
        .unwrap_or_else(|e| panic!("{}: {e}; restore the public scenarios", p.display()))
}

/// `s` simulated under `dir`, its segments sealed into `dir/collection`; returns that.
fn sealed_collection(s: &rocemesh_formats::scenario::Scenario, dir: &Path) -> PathBuf {
    let (sim, col) = (dir.join("sim"), dir.join("collection"));
    rocemesh_testbeds::simulate(s, &sim, 0).expect("simulate");
    let files = rocemesh_analyze::inspect::find_segments(&[sim.join("segments")]).expect("list");
    assert!(!files.is_empty(), "the simulator wrote no segment");
    std::fs::create_dir_all(&col).expect("mkdir");
    for f in files {
        let sealed = common::seal_closed(&f, 1);
        let to = col.join(sealed.file_name().expect("name"));
        std::fs::rename(&sealed, &to).expect("move into the collection");
    }
    col
}

/// The `finding` lines and the last `findings_emitted` line of an output.
fn findings_of(output: &Path) -> (Vec<Value>, Option<Value>) {
    let all = lines(output);
    let findings = all.iter().filter(|l| l["type"] == "finding").cloned().collect();
    let last = all.iter().rev().find(|l| l["type"] == "findings_emitted").cloned();
    (findings, last)
}

/// Watches `s`'s sealed segments twice, in blocks of two windows: two passes (one before the
/// collection ends, one at its end) and one pass at the end. Asserts that both give the same
/// `finding` lines, each (window, entity) once, and every emitted window localised; returns
/// them.
fn findings_whatever_the_passes(s: &rocemesh_formats::scenario::Scenario) -> Vec<Value> {
    let tmp = tempfile::tempdir().expect("tempdir");
    let col = sealed_collection(s, tmp.path());
    let col_s = col.to_str().expect("utf-8");
    let run = |name: &str, passes: &[&str]| -> (PathBuf, PathBuf) {
        let (state, output) = (tmp.path().join(format!("{name}.state")), tmp.path().join(format!("{name}.jsonl")));
        for pass in passes {
            let args = [
                "watch",
                "--state",
                state.to_str().expect("utf-8"),
                "--output",
                output.to_str().expect("utf-8"),
                "--window-s",
                "30",
                "--grace-s",
                "60",
                "--findings-block-windows",
                "2",
                pass,
                col_s,
            ];
            let out = analyze(&args);
            assert_eq!(out.status.code(), Some(0), "{name} {pass}: {}", String::from_utf8_lossy(&out.stderr));
        }
        (state, output)
    };
    let (two_state, two) = run("two", &["--once", "--flush"]);
    let (one_state, one) = run("one", &["--flush"]);
    let marks: Vec<u64> = lines(&two)
        .iter()
        .filter(|l| l["type"] == "findings_emitted")
        .map(|l| l["findings_to_ns"].as_u64().expect("findings_to_ns"))
        .collect();
    assert!(marks.len() == 2 && marks[0] < marks[1], "the first pass must localise some blocks: {marks:?}");
    let (found, last) = findings_of(&two);
    let (found_once, last_once) = findings_of(&one);
    assert!(!found.is_empty(), "{}: no finding", s.name);
    assert_eq!(found, found_once, "{}: two passes and one give other findings", s.name);
    let to = |l: Option<Value>| l.expect("a findings_emitted line")["findings_to_ns"].as_u64();
    assert_eq!(to(last), Some(emitted_to(&two_state)), "every emitted window localised");
    assert_eq!(to(last_once), Some(emitted_to(&one_state)), "every emitted window localised");
    let mut seen = BTreeSet::new();
    for f in &found {
        let key = (f["window_start_ns"].as_u64().expect("window"), f["kind"].to_string(), f["entity"].to_string());
        assert!(seen.insert(key.clone()), "{key:?} said twice");
    }
    found
}

/// The network's findings among `found`.
fn network(found: &[Value]) -> Vec<&Value> {
    found.iter().filter(|f| ["rnic", "tor", "link", "spine"].contains(&f["kind"].as_str().unwrap_or(""))).collect()
}

/// Findings: each window's localisation goes out once, in blocks aligned whatever the passes;
/// the simulated lossy ToR is named in the windows of its loss, and nothing else of the network.
#[test]
fn findings_name_the_fault_once_per_window_whatever_the_passes() {
    let s = public_scenario("tor-loss");
    let found = findings_whatever_the_passes(&s);
    let fault = &s.faults[0];
    let t0_ns = s.start_unix_s * 1_000_000_000;
    let (on_ns, off_ns) = (t0_ns + (fault.start_s * 1e9) as u64, t0_ns + (fault.end_s.expect("end") * 1e9) as u64);
    let window_ns = WINDOW_S * 1_000_000_000;
    let network = network(&found);
    for f in &network {
        let w = f["window_start_ns"].as_u64().expect("window");
        assert_eq!(f["entity"], "tor6", "only the lossy ToR is of the network: {f}");
        assert!(w + window_ns > on_ns && w < off_ns, "tor6 named outside its loss: {f}");
    }
    let named: BTreeSet<u64> = network.iter().map(|f| f["window_start_ns"].as_u64().expect("window")).collect();
    let inside: BTreeSet<u64> = (on_ns.div_ceil(window_ns)..off_ns / window_ns).map(|w| w * window_ns).collect();
    assert!(inside.len() >= 3, "{inside:?}");
    assert!(inside.is_subset(&named), "every window wholly inside the loss names tor6: {named:?} {inside:?}");
}

/// A slow RNIC's evidence quotes the slow thresholds of the baselines it was judged against,
/// which come from the records read with its block: the same whatever the passes.
#[test]
fn slowness_findings_quote_the_same_baselines_whatever_the_passes() {
    let text = r#"
version = 1
name = "a slow RNIC"
seed = 4
duration_s = 240
window_s = 30

[topology]
spines = 2
tors = 4
hosts_per_tor = 4

[probing]
tor_mesh_pps = 10
inter_tor_tors = 3
inter_tor_pps = 2
flow_labels = 4
timeout_ms = 500

[normal]
network_rtt_us = { p50 = 4.0, p99 = 12.0 }
prober_delay_us = { p50 = 2.0, p99 = 15.0 }
responder_delay_us = { p50 = 1.0, p99 = 6.0 }
loss = 1e-6

[[fault]]
kind = "rnic_slow"
target = "tor2-h1/rnic0"
start_s = 60
end_s = 180
extra_rtt_us = 200
"#;
    let s = rocemesh_formats::scenario::Scenario::parse(text, Path::new("inline.toml")).expect("scenario");
    let found = findings_whatever_the_passes(&s);
    let network = network(&found);
    assert!(network.len() >= 3, "{found:?}");
    for f in network {
        assert_eq!(f["entity"], "tor2-h1/rnic0", "{f}");
        assert!(f["evidence"].as_str().unwrap_or("").contains("baseline (RTT above"), "{f}");
    }
}

/// One stray T1 (a forged or corrupt record, decades before the rest) stretches its file's span
/// over millions of findings blocks; the watch localises the blocks whose windows hold records,
/// so it costs one more block, and its lone window is reported like any other.
#[test]
fn a_stray_t1_costs_one_findings_block_not_one_per_block_of_its_span() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let col = tmp.path().join("collection");
    let agents = write_agents(&col);
    assert!(agents.iter().all(|f| !f.is_empty()), "no input written");
    const STRAY_NS: u64 = 1_000_000_000;
    host_file(&col, "wz-h0", &[STRAY_NS, T0 + 60_000_000_000, T0 + 61_000_000_000]);
    let (state, output) = (tmp.path().join("w.state"), tmp.path().join("w.jsonl"));
    let (state_s, output_s, col_s) =
        (state.to_str().expect("utf-8"), output.to_str().expect("utf-8"), col.to_str().expect("utf-8"));
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--findings-block-windows", "4", "--flush"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, last) = findings_of(&output);
    let last = last.expect("a findings_emitted line");
    // 16 minutes of 30 s windows in blocks of 4 (2 minutes), not aligned: at most 9 blocks hold
    // them, 10 with the stray record's; its file's span is about 1.4e7 blocks.
    let blocks = last["blocks"].as_u64().expect("blocks");
    assert!((9..=10).contains(&blocks), "{blocks} blocks localised: {last}");
    let all = lines(&output);
    assert!(
        all.iter().any(|l| l["type"] == "row" && l["window_start_ns"] == 0 && l["scope"] == "cluster"),
        "the stray record's window is reported"
    );
}

/// The unix ns of now.
fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64
}

/// Issue 33, item 1: a host whose clock runs two hours ahead, and one forged record years
/// ahead of the analyzer's own clock, neither emit windows early (from partial data) nor make
/// the honest hosts' files late. Both are said once as outliers; the fast host's records are
/// reported when the fleet reaches their windows (here: at the flush). On 997f2d7 the first pass
/// emitted every window up to the forged record's, and every honest file after it was late.
#[test]
fn hosts_ahead_of_the_fleet_neither_emit_early_nor_make_the_fleet_late() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (store, col) = (tmp.path().join("store"), tmp.path().join("collection"));
    std::fs::create_dir_all(&col).expect("mkdir");
    let agents = write_agents(&store);
    let (state, output) = (tmp.path().join("s.json"), tmp.path().join("o.jsonl"));
    let (state_s, output_s, col_s) =
        (state.to_str().expect("utf-8"), output.to_str().expect("utf-8"), col.to_str().expect("utf-8"));
    let hour = 3_600_000_000_000u64;
    let fast = host_file(&col, "wx-h9", &[T0 + 2 * hour, T0 + 2 * hour + 1_000_000_000]);
    let forged_ns = now_ns() + 20 * 365 * 24 * hour;
    let forged = host_file(&col, "wy-h8", &[T0 + 60_000_000_000, forged_ns]);
    let half = T0 + 8 * 60_000_000_000;
    let (first, rest): (Vec<&PathBuf>, Vec<&PathBuf>) = agents.iter().flatten().partition(|f| last_ns(f) < half);
    let newest_first = first.iter().map(|f| last_ns(f)).max().expect("files");
    for f in &first {
        deliver(f, &store, &col);
    }
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(1), "outliers are said: {}", String::from_utf8_lossy(&out.stderr));
    let emitted = emitted_to(&state);
    assert!(
        emitted > T0 && emitted + GRACE_S * 1_000_000_000 <= newest_first,
        "emitted to {emitted}: the honest hosts' time"
    );
    let all = lines(&output);
    let outliers: BTreeMap<String, &Value> = all
        .iter()
        .filter(|l| l["type"] == "outlier")
        .map(|l| (l["host"].as_str().expect("host").to_owned(), l))
        .collect();
    assert_eq!(outliers.keys().collect::<Vec<_>>(), ["wx-h9", "wy-h8"], "{outliers:?}");
    for l in outliers.values() {
        assert_eq!(l["direction"], "ahead", "{l}");
    }
    assert!(outliers["wx-h9"]["by_ns"].as_u64().expect("by") > hour, "{}", outliers["wx-h9"]);
    assert!(outliers["wy-h8"]["why"].as_str().expect("why").contains("analyzer's clock"), "{}", outliers["wy-h8"]);

    // The rest of the honest files arrive: none is late, and nobody is said again.
    for f in &rest {
        deliver(f, &store, &col);
    }
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--flush"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let all = lines(&output);
    assert!(!all.iter().any(|l| l["type"] == "late"), "no honest file is late");
    assert_eq!(all.iter().filter(|l| l["type"] == "outlier").count(), 2, "each outlier said once");
    // The fast host's records are reported in their (wrong) windows, once the fleet is there.
    let rows_of = |entity: &str| all.iter().filter(|l| l["type"] == "row" && l["entity"] == entity).count();
    assert!(rows_of("wx-h9/mlx5_0") > 0 && rows_of("wy-h8/mlx5_0") > 0, "their records are not dropped");
    let _ = (fast, forged);
}

/// Issue 33, item 1: a host whose clock runs an hour behind delivers files whose records all
/// lie in windows already emitted: each file is late, and the host is said once to be behind
/// (its clock, or its collection), not once per file.
#[test]
fn a_host_behind_the_fleet_is_said_once_as_an_outlier() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let col = tmp.path().join("collection");
    write_agents(&col);
    let (state, output) = (tmp.path().join("s.json"), tmp.path().join("o.jsonl"));
    let (state_s, output_s, col_s) =
        (state.to_str().expect("utf-8"), output.to_str().expect("utf-8"), col.to_str().expect("utf-8"));
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let emitted = emitted_to(&state);
    let behind_ns = T0 + 60_000_000_000;
    assert!(emitted > behind_ns + 60_000_000_000, "windows emitted past the slow host's records");
    let other = tmp.path().join("later");
    for k in 0..2u64 {
        let f = host_file(&other, "wz-h7", &[behind_ns + k * 30_000_000_000]);
        let to = col.join("wz-h7").join(f.file_name().expect("name"));
        std::fs::create_dir_all(to.parent().expect("dir")).expect("mkdir");
        std::fs::rename(&f, &to).expect("deliver");
        let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let all = lines(&output);
    assert_eq!(all.iter().filter(|l| l["type"] == "late").count(), 2);
    let said: Vec<&Value> = all.iter().filter(|l| l["type"] == "outlier").collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!((said[0]["host"].as_str(), said[0]["direction"].as_str()), (Some("wz-h7"), Some("behind")));
}

/// The crash path, deterministically: a pass's lines reached the output but its state never
/// replaced the old one (the process died in between). The next pass cuts the output back to
/// what the old state counts and emits those windows again, once: the output ends the same,
/// byte for byte, as a run without the crash.
#[test]
fn output_past_the_saved_state_is_cut_and_emitted_again_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("store");
    let agents = write_agents(&store);
    let half = T0 + 9 * 60_000_000_000;
    let (first, rest): (Vec<&PathBuf>, Vec<&PathBuf>) = agents.iter().flatten().partition(|f| last_ns(f) < half);
    // Each run its own collection at the same path relative to its root, so that the lines
    // (which name files) compare.
    let run = |name: &str, crash: bool| -> Vec<u8> {
        let root = tmp.path().join(name);
        let col = root.join("collection");
        std::fs::create_dir_all(&col).expect("mkdir");
        let (state, output) = (root.join("watch.state"), root.join("watch.jsonl"));
        let (state_s, output_s, col_s) =
            (state.to_str().expect("utf-8"), output.to_str().expect("utf-8"), col.to_str().expect("utf-8"));
        let once = || {
            let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
            assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stderr).into_owned()
        };
        for f in &first {
            deliver(f, &store, &col);
        }
        once();
        let (old_state, before, emitted_before) = (
            std::fs::read(&state).expect("state"),
            std::fs::metadata(&output).expect("output").len(),
            emitted_to(&state),
        );
        for f in &rest {
            deliver(f, &store, &col);
        }
        let stderr = once();
        assert!(emitted_to(&state) > emitted_before, "the second pass emits windows: {stderr}");
        if crash {
            std::fs::write(&state, &old_state).expect("the state of before the pass");
            let stderr = once();
            assert!(std::fs::metadata(&output).expect("output").len() > before, "{stderr}");
            assert!(stderr.contains("cutting") && stderr.contains("emitted again"), "{stderr}");
        }
        let text = std::fs::read_to_string(&output).expect("output");
        text.replace(root.to_str().expect("utf-8"), "ROOT").into_bytes()
    };
    let plain = run("plain", false);
    let crashed = run("crashed", true);
    assert!(plain.len() > 1000, "{}", String::from_utf8_lossy(&plain));
    assert_eq!(String::from_utf8_lossy(&crashed), String::from_utf8_lossy(&plain));
}

/// One forged record years ahead in a lone host's file does not keep that host out of the vote:
/// it votes with its newest record that was not ahead of the analyzer's clock, so its honest
/// later files move the report on (a review of the fix found the host silenced until the
/// clock reached the forged time).
#[test]
fn a_forged_record_does_not_silence_its_host() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let col = tmp.path().join("collection");
    let (state, output) = (tmp.path().join("s.json"), tmp.path().join("o.jsonl"));
    let (state_s, output_s, col_s) =
        (state.to_str().expect("utf-8"), output.to_str().expect("utf-8"), col.to_str().expect("utf-8"));
    let minute = 60_000_000_000u64;
    host_file(&col, "wq-h1", &[T0, now_ns() + 20 * 365 * 24 * 60 * minute]);
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(1), "the outlier is said: {}", String::from_utf8_lossy(&out.stderr));
    for k in 1..=12u64 {
        let f = host_file(&tmp.path().join("later"), "wq-h1", &[T0 + k * minute]);
        std::fs::rename(&f, col.join("wq-h1").join(f.file_name().expect("name"))).expect("deliver");
    }
    let out = analyze(&watch_args(state_s, output_s, col_s, &["--once"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let emitted = emitted_to(&state);
    assert!(emitted + GRACE_S * 1_000_000_000 > T0 + 11 * minute, "the honest files moved the report on: {emitted}");
    assert_eq!(lines(&output).iter().filter(|l| l["type"] == "outlier").count(), 1);
}
