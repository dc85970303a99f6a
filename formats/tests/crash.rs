//! kill -9 of a writer process at arbitrary moments: every complete chunk must come back,
//! in order, with no gap and no garbage; the torn tail is reported, and sealing recovers it.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{files, rec, records_of, writer_in};
use rocemesh_formats::segment::{DamageKind, SegmentError, SegmentReader, WriteMode, seal};

const CHILD_ENV: &str = "ROCEMESH_CRASH_CHILD_DIR";
const MODE_ENV: &str = "ROCEMESH_CRASH_CHILD_MODE";

const TEST_NAME: &str = "kill_nine_at_arbitrary_moments_loses_only_the_unwritten_tail";

/// The victim the parent kills: this same test, re-executed with [`CHILD_ENV`] set. It is a mode
/// of the real test rather than a test of its own, because a separate child #[test] would pass,
/// having checked nothing, whenever the harness ran it directly.
fn victim(dir: &str) -> ! {
    let mode = if std::env::var(MODE_ENV).as_deref() == Ok("mmap") { WriteMode::Mmap } else { WriteMode::Pwrite };
    // Small segments so that kills also land in rotation, creation and close.
    let mut w = writer_in(dir.as_ref(), 256, 2 << 20, mode);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0u64;
    while Instant::now() < deadline {
        for _ in 0..1_000 {
            w.append(&rec(i)).expect("append");
            i += 1;
        }
        // A timer flush, as the agent does: short chunks too. The pause keeps the victim near
        // 1 M records/s, so that kills land in rotation often without gigabytes to verify.
        w.flush().expect("flush");
        std::thread::sleep(Duration::from_micros(500));
    }
    // Nobody killed it: a stray CHILD_ENV in the environment must not turn the test into a pass.
    panic!("{CHILD_ENV} is set but no parent killed this victim within 20 s; unset {CHILD_ENV} to run the test");
}

#[test]
fn kill_nine_at_arbitrary_moments_loses_only_the_unwritten_tail() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        victim(&dir);
    }
    let exe = std::env::current_exe().expect("exe");
    let mut total = 0u64;
    let mut torn_seen = 0;
    for round in 0..16u64 {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(&exe)
            .args([TEST_NAME, "--exact", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .env(MODE_ENV, if round % 2 == 0 { "pwrite" } else { "mmap" })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        // Deterministic spread of kill times from 3 to ~300 ms.
        std::thread::sleep(Duration::from_millis(3 + (round * 7919) % 300));
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");

        // Odd rounds ran the mmap writer, even rounds the pwrite one.
        let mut seen = Vec::new();
        let open = files(dir.path(), ".rseg");
        for (k, p) in open.iter().enumerate() {
            let last = k + 1 == open.len();
            let r = match SegmentReader::open(p) {
                Ok(r) => r,
                // Killed between creating the newest file and writing its header.
                Err(SegmentError::Unwritten { .. }) if last => continue,
                Err(e) => panic!("round {round}: {e}"),
            };
            for d in r.damage() {
                assert!(last, "round {round}: damage in a segment that was not the last: {d:?}");
                assert_eq!(d.kind, DamageKind::TornTail, "round {round}: {d:?}");
                torn_seen += 1;
            }
            seen.extend(records_of(&r));
        }
        let n = seen.len() as u64;
        assert_eq!(seen, (0..n).map(rec).collect::<Vec<_>>(), "round {round}: a gap, a reorder or garbage");
        total += n;

        // Recovery: seal everything left behind; the sealed copies hold the same records.
        let mut resealed = Vec::new();
        for p in &open {
            match seal(p, 1) {
                Ok(rep) => resealed.extend(records_of(&SegmentReader::open(&rep.sealed_path).expect("sealed"))),
                Err(SegmentError::Unwritten { .. }) => {}
                Err(e) => panic!("round {round}: seal: {e}"),
            }
        }
        assert_eq!(resealed.len() as u64, n, "round {round}");
    }
    assert!(total > 100_000, "the victim wrote too little for the test to mean anything: {total}");
    eprintln!("{total} records recovered over 16 kills, {torn_seen} torn tails seen");
}

/// The harness lists only tests that check something: no victim-only entry that would pass on
/// its own (as `crash_child` did when run without its parent).
#[test]
fn every_listed_test_checks_something() {
    let exe = std::env::current_exe().expect("exe");
    let out = Command::new(&exe).args(["--list", "--format", "terse"]).output().expect("list the tests");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut listed: Vec<&str> = stdout.lines().filter_map(|l| l.strip_suffix(": test")).collect();
    listed.sort_unstable();
    assert_eq!(listed, ["every_listed_test_checks_something", TEST_NAME]);
}
