//! The live analyzer (`analyze live`, issue 36) fed the window summaries a simulated fleet
//! wrote, as the agents push them (`formats::live`, encoded and decoded as on the wire), one
//! window at a time on the simulation's clock: it opens what the batch localisation of the same
//! summaries finds, in the window the fault starts, and nothing on a clean fleet; what it is
//! sent wrongly (a replay, a damaged or forged datagram, a window far from its clock, a late
//! one) is counted and said once; a window an RNIC stops pushing goes out at its deadline,
//! naming that RNIC.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rocemesh_analyze::ingest::ingest_windows;
use rocemesh_analyze::inspect::find_segments;
use rocemesh_analyze::live::{Config, EXPECT_WINDOWS, Event, Live};
use rocemesh_analyze::localize::{Options, localize_windows};
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::live::{Keys, Name, Seal, Sender, decode, encode};
use rocemesh_formats::record::PathRecord;
use rocemesh_formats::scenario::Scenario;
use rocemesh_formats::segment::SegmentReader;
use rocemesh_formats::window::WindowSummary;

const WINDOW_NS: u64 = 5_000_000_000;
const DEADLINE_NS: u64 = 3_000_000_000;

fn scenario(name: &str, duration_s: u64) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testbeds/scenarios").join(name);
    let mut s = Scenario::load(&path).unwrap();
    s.duration_s = duration_s;
    s
}

/// Simulates `s` with 5 s summaries; its directory (kept alive), files and inventory.
fn simulate(s: &Scenario) -> (tempfile::TempDir, Vec<PathBuf>, Inventory) {
    let dir = tempfile::tempdir().unwrap();
    rocemesh_testbeds::simulate(s, dir.path(), 0).unwrap();
    let files = find_segments(&[dir.path().join("segments")]).unwrap();
    let inv = Inventory::load(dir.path().join("inventory.toml")).unwrap();
    (dir, files, inv)
}

/// Every file's pushes, by window start: what its agent would have sent as each window closed.
fn pushes(files: &[PathBuf], seal: Option<&Seal>) -> BTreeMap<u64, Vec<Vec<u8>>> {
    let mut by_window: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for f in files {
        let r = SegmentReader::open(f).unwrap();
        let id = r.identity();
        let sender = Sender {
            host: id.host.clone(),
            rnic: format!("{}/{}", id.host, id.device),
            tor: id.tor.clone(),
            agent_epoch: id.agent_epoch,
        };
        let dict = r.dictionary();
        let name_of = |i: u32| {
            let e = dict.iter().find(|e| e.id == i)?;
            Some(Name { id: i, role: e.role, name: e.name.clone(), tor: e.tor.clone(), addr: e.addr })
        };
        let mut paths: Vec<PathRecord> =
            r.path_records().map(|p| rkyv::deserialize::<_, rkyv::rancor::Error>(p).unwrap()).collect();
        paths.sort_by_key(|p| p.t_unix_ns);
        let mut seq = 0;
        for a in r.window_summaries() {
            let s: WindowSummary = rkyv::deserialize::<_, rkyv::rancor::Error>(a).unwrap();
            let mut out = Vec::new();
            // The traces taken before the window closed go with its push.
            let due = paths.partition_point(|p| p.t_unix_ns < s.start_unix_ns + s.window_ns);
            let taken =
                encode(&sender, &mut seq, s.start_unix_ns, true, &s, &paths[..due], &name_of, seal, &mut out).unwrap();
            paths.drain(..taken);
            by_window.entry(s.start_unix_ns).or_default().extend(out);
        }
    }
    by_window
}

fn config() -> Config {
    Config {
        window_ns: WINDOW_NS,
        deadline_ns: DEADLINE_NS,
        history_windows: 24,
        max_skew_ns: 120_000_000_000,
        opts: Options::default(),
    }
}

/// Feeds every window's pushes, then ticks a second after the window's end; the lines.
fn replay(live: &mut Live, by_window: &BTreeMap<u64, Vec<Vec<u8>>>) -> Vec<Event> {
    let mut events = Vec::new();
    for (&start, pushes) in by_window {
        let now = start + WINDOW_NS + 1_000_000_000;
        for p in pushes {
            live.add(decode(p, &Keys::Unchecked).unwrap(), "sim", now, &mut events);
        }
        live.tick(now, &mut events);
    }
    events
}

fn opened(events: &[Event]) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for e in events {
        if let Event::Open { kind, entity, window_start_ns, .. } = e {
            out.entry((kind.clone(), entity.clone())).or_insert(*window_start_ns);
        }
    }
    out
}

/// A dead RNIC: live opens it in the window its fault starts, the batch localisation of the
/// same summaries names it too, and live opens nothing the batch does not name.
#[test]
fn live_opens_what_the_batch_finds_in_the_window_the_fault_starts() {
    let s = scenario("one-dead-rnic.toml", 180);
    let (_dir, files, inv) = simulate(&s);
    let by_window = pushes(&files, None);
    let mut live = Live::new(config(), Some(&inv));
    let events = replay(&mut live, &by_window);

    let windows: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::Window { .. })).collect();
    assert_eq!(windows.len(), by_window.len(), "every window localised once");
    assert!(windows.iter().all(|e| matches!(e, Event::Window { complete: true, .. })), "every RNIC pushed");
    assert!(live.counts.refused.is_empty(), "{:?}", live.counts.refused);

    let opened = opened(&events);
    let fault = &s.faults[0];
    let fault_ns = s.start_unix_s * 1_000_000_000 + (fault.start_s * 1e9) as u64;
    let dead = opened.get(&("rnic".to_owned(), fault.target.clone())).copied();
    let dead = dead.unwrap_or_else(|| panic!("{} not opened: {opened:?}", fault.target));
    assert!(dead <= fault_ns + WINDOW_NS, "opened in the window at {dead}, the fault began at {fault_ns}");

    let (ds, w) = ingest_windows(&files, Some(&inv), WINDOW_NS);
    let batch = localize_windows(&ds, &w, &Options { window_s: WINDOW_NS / 1_000_000_000, ..Options::default() });
    let named: BTreeSet<(String, String)> = batch.findings.iter().map(|f| (f.kind.clone(), f.entity.clone())).collect();
    for key in opened.keys() {
        assert!(named.contains(key), "live opened {key:?}, which the batch does not name ({named:?})");
    }
}

/// A clean fleet: windows go out, nothing opens.
#[test]
fn a_clean_fleet_opens_nothing() {
    let mut s = scenario("one-dead-rnic.toml", 120);
    s.faults.clear();
    let (_dir, files, inv) = simulate(&s);
    let mut live = Live::new(config(), Some(&inv));
    let events = replay(&mut live, &pushes(&files, None));
    assert!(opened(&events).is_empty(), "{:?}", opened(&events));
    assert!(events.iter().any(|e| matches!(e, Event::Window { .. })));
}

/// Bad pushes are counted by reason and each reason said once; none moves a count.
#[test]
fn replayed_damaged_forged_skewed_and_late_pushes_are_counted_and_said_once() {
    let mut s = scenario("one-dead-rnic.toml", 60);
    s.faults.clear();
    let (_dir, files, inv) = simulate(&s);
    let key = Seal { id: 2, secret: [7; 32] };
    let by_window = pushes(&files, Some(&key));
    let mut live = Live::new(config(), Some(&inv));
    let mut events = Vec::new();
    let (&first, pushes) = by_window.iter().next().unwrap();
    let now = first + WINDOW_NS + 1_000_000_000;
    let holds = |id: u8| (id == 2).then(|| key.clone());
    let checked = Keys::Checked(&holds);
    for p in pushes {
        live.add(decode(p, &checked).unwrap(), "sim", now, &mut events);
    }
    let taken = live.counts.taken;
    // The same pushes again: replays.
    for p in pushes.iter().take(3) {
        live.add(decode(p, &checked).unwrap(), "sim", now, &mut events);
    }
    assert_eq!(live.counts.refused.get("replayed"), Some(&3));
    // A forged one does not decode under the keys.
    let mut forged = pushes[0].clone();
    let at = forged.len() - 40;
    forged[at] ^= 1;
    assert!(decode(&forged, &checked).is_err());
    // A window from a clock ten minutes ahead.
    live.add(decode(&pushes[1], &checked).unwrap(), "sim", now - 600_000_000_000, &mut events);
    assert_eq!(live.counts.refused.get("clock_skew"), Some(&1));
    assert_eq!(live.counts.taken, taken, "nothing refused was taken");
    live.tick(now + DEADLINE_NS, &mut events);
    // The window is out (at its deadline: the first windows wait, not knowing whom to expect);
    // a push for it now is late (kept as history, said).
    let mut again = Vec::new();
    let sender = Sender { host: "tor0-h0".into(), rnic: "tor0-h0/rnic0".into(), tor: "tor0".into(), agent_epoch: 99 };
    let summary = WindowSummary { start_unix_ns: first, window_ns: WINDOW_NS, ..WindowSummary::default() };
    encode(&sender, &mut 0, now, true, &summary, &[], &|_| None, None, &mut again).unwrap();
    live.add(decode(&again[0], &Keys::Unchecked).unwrap(), "sim", now, &mut events);
    assert_eq!(live.counts.refused.get("late"), Some(&1));
    let problems: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::Problem { reason, .. } => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(problems, ["replayed", "clock_skew", "late"], "each reason said once, in order");
}

/// The first windows wait for their deadline; after them, an RNIC that stops pushing holds the
/// windows after it until their deadline, each naming it, for [`EXPECT_WINDOWS`] windows; after
/// that it is silent (counted, not waited for).
#[test]
fn a_silent_rnic_is_waited_for_until_the_deadline_and_named() {
    let mut s = scenario("one-dead-rnic.toml", 60);
    s.faults.clear();
    let (_dir, files, inv) = simulate(&s);
    let silent = SegmentReader::open(&files[0]).unwrap().identity().clone();
    let silent_name = format!("{}/{}", silent.host, silent.device);
    let by_window = pushes(&files, None);
    let mut live = Live::new(config(), Some(&inv));
    let mut events = Vec::new();
    let starts: Vec<u64> = by_window.keys().copied().collect();
    let warm_up = EXPECT_WINDOWS as usize;
    let stops = warm_up + 1;
    for (i, (&start, pushes)) in by_window.iter().enumerate() {
        for p in pushes {
            let r = decode(p, &Keys::Unchecked).unwrap();
            if i >= stops && r.push.rnic == silent_name {
                continue;
            }
            live.add(r, "sim", start + WINDOW_NS, &mut events);
        }
        let before = events.len();
        live.tick(start + WINDOW_NS + 1_000_000_000, &mut events);
        if i < warm_up {
            assert_eq!(events.len(), before, "window {i}: the first windows wait for their deadline");
            live.tick(start + WINDOW_NS + DEADLINE_NS, &mut events);
            assert!(matches!(events.last(), Some(Event::Window { complete: true, .. })), "window {i}");
            continue;
        }
        if i < stops {
            assert!(events.len() > before, "window {i}: every RNIC pushed, out at once");
            continue;
        }
        let waits = (i - (stops - 1)) as u64 <= EXPECT_WINDOWS;
        if waits {
            assert_eq!(events.len(), before, "window {i} waits for {silent_name}");
            live.tick(start + WINDOW_NS + DEADLINE_NS, &mut events);
        }
        let Some(Event::Window { complete, missing, window_start_ns, rnics_heard, rnics_known, .. }) = events.last()
        else {
            panic!("window {i} not out: {:?}", events.last())
        };
        assert_eq!((*window_start_ns, *complete), (starts[i], !waits), "window {i}");
        let named: &[String] = if waits { std::slice::from_ref(&silent_name) } else { &[] };
        assert_eq!(missing, named, "window {i}");
        assert_eq!(*rnics_heard + 1, *rnics_known, "window {i}: one silent");
    }
}

/// End to end: real agents (in-process, UDP on loopback, 1 s summaries) push to `analyze live`
/// (the binary): every window goes out complete, with every probe the segments' summaries
/// count for it, nothing is refused, and a clean loopback opens nothing.
#[test]
fn real_agents_push_every_window_and_the_binary_localises_each() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = rocemesh_agent::demo::write(dir.path(), 3, 18_767, false).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let text = format!("summary_window_s = 1\n{text}\n[live]\ncollectors = [\"127.0.0.1:{port}\"]\n");
    std::fs::write(&config, text).unwrap();
    let lines = dir.path().join("live.jsonl");
    let analyzer = std::process::Command::new(env!("CARGO_BIN_EXE_analyze"))
        .args(["live", "--listen", &format!("127.0.0.1:{port}"), "--window-s", "1", "--deadline-s", "5"])
        .args(["--for-s", "16", "--output", lines.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let cfg = rocemesh_agent::config::AgentConfig::load(&config).unwrap();
    let reports = rocemesh_agent::runtime::run(&cfg, Some(std::time::Duration::from_secs(6))).unwrap();
    for r in &reports {
        let l = r.stats.live;
        assert!(l.windows >= 3 && l.failed == 0 && l.sent >= l.windows, "{}: {l:?}", r.device);
    }
    let out = analyzer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("refused by reason {}"), "{stderr}");

    let mut summarised: BTreeMap<u64, u64> = BTreeMap::new();
    for f in find_segments(&[dir.path().join("segments")]).unwrap() {
        for s in SegmentReader::open(&f).unwrap().window_summaries() {
            *summarised.entry(s.start_unix_ns.to_native()).or_default() += s.probes();
        }
    }
    let text = std::fs::read_to_string(&lines).unwrap();
    let mut windows = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["event"], "window", "a clean loopback: {line}");
        assert_eq!(v["complete"].as_bool(), Some(true), "{line}");
        // The shards start within a few ms of each other, so the first window may miss one.
        assert!(i == 0 || v["rnics_heard"].as_u64() == Some(3), "{line}");
        // Pushes leave a flush after the window closes, a grace after its end; the first
        // windows wait for their deadline.
        assert!(v["after_end_ms"].as_u64().is_some_and(|ms| ms < 6_000), "{line}");
        windows.insert(v["window_start_ns"].as_u64().unwrap(), v["probes"].as_u64().unwrap());
    }
    assert_eq!(windows, summarised, "every window, every probe its summaries count");
}

/// A window a segment's rotation cut in two (a summary that is not the window's last) is not
/// complete for its RNIC until the rest arrives.
#[test]
fn a_window_cut_by_a_rotation_waits_for_its_last_summary() {
    let mut s = scenario("one-dead-rnic.toml", 60);
    s.faults.clear();
    let (_dir, files, inv) = simulate(&s);
    let by_window = pushes(&files, None);
    let mut live = Live::new(config(), Some(&inv));
    let mut events = Vec::new();
    let cut = EXPECT_WINDOWS as usize + 1;
    for (i, (&start, pushes)) in by_window.iter().enumerate() {
        let now = start + WINDOW_NS + 1_000_000_000;
        let mut held = None;
        for (j, p) in pushes.iter().enumerate() {
            let r = decode(p, &Keys::Unchecked).unwrap();
            if i != cut || j != 0 {
                live.add(r, "sim", now, &mut events);
                continue;
            }
            // The first RNIC's summary as a rotation leaves it: not the last of the window.
            let names = r.push.names.clone();
            let name_of = |id: u32| names.iter().find(|n| n.id == id).cloned();
            let sender = Sender {
                host: r.push.host.clone(),
                rnic: r.push.rnic.clone(),
                tor: r.push.tor.clone(),
                agent_epoch: r.header.agent_epoch,
            };
            let mut out = Vec::new();
            encode(&sender, &mut 1_000, now, false, &r.push.summary, &[], &name_of, None, &mut out).unwrap();
            for d in &out {
                live.add(decode(d, &Keys::Unchecked).unwrap(), "sim", now, &mut events);
            }
            let rest = WindowSummary { start_unix_ns: start, window_ns: WINDOW_NS, ..WindowSummary::default() };
            out.clear();
            encode(&sender, &mut 2_000, now, true, &rest, &[], &name_of, None, &mut out).unwrap();
            held = Some(out);
        }
        let before = events.len();
        live.tick(now + if i < EXPECT_WINDOWS as usize { DEADLINE_NS } else { 0 }, &mut events);
        if let Some(rest) = held {
            assert_eq!(events.len(), before, "window {i} waits for the rest of the cut summary");
            live.add(decode(&rest[0], &Keys::Unchecked).unwrap(), "sim", now, &mut events);
            live.tick(now, &mut events);
            assert!(matches!(events.last(), Some(Event::Window { complete: true, .. })), "{:?}", events.last());
        }
    }
    assert!(live.counts.refused.is_empty(), "{:?}", live.counts.refused);
}

/// A restart with the state taken back (`--state`): a finding still blamed goes on without a
/// second `open`, where a fresh analyzer without it opens the same finding again.
#[test]
fn a_restart_with_its_state_does_not_open_a_finding_twice() {
    // A lossy ToR from 60 s to the end: its hosts' agents go on pushing throughout.
    let s = scenario("tor-loss.toml", 180);
    let (_dir, files, inv) = simulate(&s);
    let by_window = pushes(&files, None);
    let mut first = Live::new(config(), Some(&inv));
    let mut events = Vec::new();
    let mut rest = BTreeMap::new();
    for (&start, p) in &by_window {
        if first.open_findings() > 0 {
            rest.insert(start, p.clone());
        } else {
            events.extend(replay(&mut first, &BTreeMap::from([(start, p.clone())])));
        }
    }
    let open = opened(&events);
    assert!(!open.is_empty() && !rest.is_empty(), "the fault opened before the end: {open:?}");
    let state = first.open_state();

    let mut restored = Live::new(config(), Some(&inv));
    assert_eq!(restored.restore(&state).unwrap(), first.open_findings());
    let after = replay(&mut restored, &rest);
    let again: Vec<_> = opened(&after).into_keys().filter(|k| open.contains_key(k)).collect();
    assert!(again.is_empty(), "opened again after the restart: {again:?}");
    assert!(restored.open_findings() >= 1, "the finding is still held");

    let mut fresh = Live::new(config(), Some(&inv));
    let fresh_open = opened(&replay(&mut fresh, &rest));
    assert!(open.keys().any(|k| fresh_open.contains_key(k)), "without the state it opens again: {fresh_open:?}");
}
