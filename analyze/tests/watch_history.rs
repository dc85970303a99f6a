//! Issue 33, item 2: a watch over a collection that grows for weeks keeps a state, and lists a
//! collection, the size of its grace, not of the collection's age. Three hosts deliver a file
//! an hour, in `ctl collect`'s dated layout, for twelve days; a pass runs after each half day.
//! The state's size and the files a pass lists and keeps must stay flat once the first days
//! are behind, while every window with records is still emitted exactly once. Pass times are
//! printed (never asserted: timings belong in benchmarks).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rocemesh_analyze::probe::{Scope, Sla};
use rocemesh_analyze::watch::{Config, Watch};
use serde_json::Value;

mod common;
use common::host_file;

const HOUR_NS: u64 = 3_600_000_000_000;
const DAY_NS: u64 = 24 * HOUR_NS;
/// Midnight UTC, 2023-11-15.
const START_NS: u64 = 1_700_006_400_000_000_000;
const HOSTS: [&str; 3] = ["ha", "hb", "hc"];
const DAYS: u64 = 12;

/// `ctl collect`'s place for `file` of `host`: OUT/<date of its first record>/<host>/mlx5_0/.
fn deliver(file: &Path, out: &Path, host: &str, first_ns: u64) -> PathBuf {
    let c = rocemesh_formats::time::civil_utc((first_ns / 1_000_000_000) as i64);
    let dir = out.join(format!("{:04}-{:02}-{:02}", c.year, c.month, c.day)).join(host).join("mlx5_0");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let to = dir.join(file.file_name().expect("name"));
    std::fs::rename(file, &to).expect("rename into place");
    to
}

#[test]
fn state_and_listing_stay_flat_as_the_collection_grows() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (staging, col) = (tmp.path().join("staging"), tmp.path().join("collection"));
    std::fs::create_dir_all(&col).expect("mkdir");
    let cfg = Config {
        dir: col.clone(),
        state: tmp.path().join("watch.state"),
        output: Some(tmp.path().join("watch.jsonl")),
        stdout: false,
        window_ns: 60_000_000_000,
        grace_ns: HOUR_NS,
        scopes: vec![Scope::Cluster],
        sla: Sla::default(),
        range_records: 1 << 20,
        flush: false,
        findings: None,
    };
    // Each pass: (state bytes, files listed, files kept).
    let mut seen = Vec::new();
    let mut windows_with_records = BTreeSet::new();
    let mut next_hour = 0u64;
    for half_day in 0..2 * DAYS {
        let until = (half_day + 1) * 12;
        for hour in next_hour..until {
            for host in HOSTS {
                // A record every 15 minutes, the first one hour in: one window each.
                let t1s: Vec<u64> = (0..4).map(|q| START_NS + hour * HOUR_NS + q * 15 * 60_000_000_000).collect();
                windows_with_records.extend(t1s.iter().map(|t| t / 60_000_000_000 * 60_000_000_000));
                let f = host_file(&staging, host, &t1s);
                deliver(&f, &col, host, t1s[0]);
            }
        }
        next_hour = until;
        let started = std::time::Instant::now();
        let mut watch = Watch::open(&cfg, None).expect("open");
        let pass = watch.pass().expect("pass");
        let state_bytes = std::fs::metadata(&cfg.state).expect("state").len();
        println!(
            "day {:>4.1}: {:>4} files in the collection, {:>3} listed, {:>3} kept, state {:>6} bytes, pass {:?}",
            f64::from(half_day as u32 + 1) / 2.0,
            until * 3,
            pass.files_listed,
            pass.files_kept,
            state_bytes,
            started.elapsed()
        );
        seen.push((state_bytes, pass.files_listed, pass.files_kept));
    }
    // From day 3 on the collection keeps growing (by 36 files a half day) and nothing else may.
    let settled = &seen[6..];
    let bound = |f: fn(&(u64, u64, u64)) -> u64| settled.iter().map(f).max().unwrap_or(0);
    let floor = |f: fn(&(u64, u64, u64)) -> u64| settled.iter().map(f).min().unwrap_or(0);
    // Kept: files within about two graces (two hours, three hosts) and the last half day's
    // arrivals, whatever the age; listed: the dates still listed (up to three days' files).
    assert!(bound(|s| s.2) <= 3 * 12 + 3 * 4, "files kept grow: {seen:?}");
    assert!(bound(|s| s.1) <= 3 * 24 * 3 + 36, "files listed grow: {seen:?}");
    assert!(bound(|s| s.0) <= floor(|s| s.0) * 3 / 2, "the state grows: {seen:?}");
    assert!(seen.last().expect("passes").1 < (DAYS * 24 * 3) / 3, "the listing skips old dates: {seen:?}");

    // Every window with records up to the last emission is emitted once, none twice.
    let text = std::fs::read_to_string(cfg.output.as_ref().expect("output")).expect("output");
    let mut emitted = BTreeSet::new();
    let mut emitted_to = 0;
    for l in text.lines() {
        let v: Value = serde_json::from_str(l).expect("json");
        match v["type"].as_str() {
            Some("row") => assert!(emitted.insert(v["window_start_ns"].as_u64().expect("window")), "twice: {l}"),
            Some("emitted") => emitted_to = v["emitted_to_ns"].as_u64().expect("to"),
            Some("late" | "problem" | "outlier") => panic!("nothing is late or wrong here: {l}"),
            _ => {}
        }
    }
    let due: BTreeSet<u64> = windows_with_records.into_iter().filter(|&w| w < emitted_to).collect();
    assert!(emitted_to > START_NS + (DAYS - 1) * DAY_NS, "emitted to the last half day");
    assert_eq!(emitted, due, "every window with records, once");
}
