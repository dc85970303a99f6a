//! Issue 17: the smallest fault each window size can show for a given probe rate, computed by
//! `localize::smallest_detectable` with the default options, and checked against the table in
//! docs/design/localisation.md#the-smallest-fault-a-window-can-show, so that the table is computed, never guessed, and stays
//! true when a default changes. On a mismatch the test prints the table to paste.

use std::path::PathBuf;

use rocemesh_analyze::localize::{Options, Signal, smallest_detectable};

/// Probes per second crossing one element (an RNIC sees its ToR-mesh and inter-ToR probes both
/// ways; a link only the inter-ToR probes hashed onto it).
const RATES: [u32; 6] = [1, 3, 10, 30, 100, 300];
const WINDOWS_S: [u32; 3] = [10, 30, 60];
/// (element, window) tests the false-discovery cut is set over: 1,000 RNICs and their switches
/// over 10 windows.
const TESTS: u64 = 10_000;
const POWER: f64 = 0.95;

fn cell(x: Option<f64>) -> String {
    match x {
        None => "-".to_owned(),
        Some(x) if x >= 0.1 => format!("{:.0}%", x * 100.0),
        Some(x) if x >= 0.01 => format!("{:.1}%", x * 100.0),
        Some(x) => format!("{:.2}%", x * 100.0),
    }
}

fn table() -> String {
    let opts = Options::default();
    let mut s = String::from("| probes/s crossing it |");
    for w in WINDOWS_S {
        s.push_str(&format!(" {w} s: lost | {w} s: slow |"));
    }
    s.push_str("\n|---:|");
    s.push_str(&"---:|---:|".repeat(WINDOWS_S.len()));
    s.push('\n');
    for r in RATES {
        s.push_str(&format!("| {r} |"));
        for w in WINDOWS_S {
            let n = r * w;
            let loss = smallest_detectable(n, Signal::Loss, &opts, TESTS, POWER);
            let slow = smallest_detectable(n, Signal::Slowness, &opts, TESTS, POWER);
            s.push_str(&format!(" {} | {} |", cell(loss), cell(slow)));
        }
        s.push('\n');
    }
    s
}

#[test]
fn the_detectability_table_in_architecture_md_is_the_computed_one() {
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../docs/design/localisation.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (begin, end) = ("<!-- detectability:begin -->\n", "<!-- detectability:end -->");
    let at = doc.find(begin).unwrap_or_else(|| panic!("{}: no {begin:?} marker", path.display())) + begin.len();
    let len = doc[at..].find(end).unwrap_or_else(|| panic!("{}: no {end:?} marker", path.display()));
    let computed = table();
    println!("{computed}");
    assert_eq!(
        &doc[at..at + len],
        computed,
        "docs/design/localisation.md's table is stale: paste the one printed above"
    );
}

#[test]
fn more_probes_show_fainter_faults() {
    let opts = Options::default();
    let at = |n: u32| smallest_detectable(n, Signal::Loss, &opts, TESTS, POWER);
    assert_eq!(at(2), None, "fewer probes than lost_min can show nothing");
    let (a, b, c) = (at(300).unwrap(), at(3_000).unwrap(), at(30_000).unwrap());
    assert!(a > b && b > c, "{a} {b} {c}");
    // A dead element (every probe lost) is shown by lost_min probes.
    assert!(at(opts.lost_min).is_some_and(|p| p > 0.9));
    // Slowness needs at least slow_ratio_min of the probes slow, however many there are.
    let slow = smallest_detectable(1_000_000, Signal::Slowness, &opts, TESTS, POWER).unwrap();
    assert!(slow >= opts.slow_ratio_min && slow < opts.slow_ratio_min * 1.01, "{slow}");
}
