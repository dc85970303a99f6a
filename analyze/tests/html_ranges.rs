//! `analyze html` reads ranges of whole windows (`HtmlReport::build_ranges`): the page's
//! figures (violations, and each pair's whole-range counts, loss ratio and exact RTT p99) are
//! those of one table (`HtmlReport::build`), on simulated faults, one window per range and a
//! few windows per range.

use std::path::Path;

use rocemesh_analyze::html::HtmlReport;
use rocemesh_analyze::ingest::{Fields, ingest, plan};
use rocemesh_analyze::inspect::find_segments;
use rocemesh_analyze::report::{Meta, Scope, Sla, prepare_with};
use rocemesh_formats::scenario::Scenario;

fn check(name: &str) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../testbeds/scenarios/{name}.toml"));
    let s = Scenario::load(&p).unwrap_or_else(|e| panic!("{}: {e}; restore the public scenarios", p.display()));
    let dir = tempfile::tempdir().unwrap();
    rocemesh_testbeds::simulate(&s, dir.path(), 0).unwrap();
    let files = find_segments(&[dir.path().join("segments")]).unwrap();
    assert!(!files.is_empty(), "{name}: no segment");
    let window_ns = s.window_s * 1_000_000_000;
    // An SLA the faults break, so that there are violations to compare.
    let sla = Sla { loss_ratio: 0.001, rtt_p99_us: 8.0 };
    let meta = Meta {
        window_s: s.window_s,
        sla,
        files: files.len(),
        records: 0,
        problems: Vec::new(),
        scopes: vec![Scope::Pair],
    };
    let ds = ingest(&files, false);
    let prepared = prepare_with(ds.probes, &ds.rnics, &ds.services, window_ns).unwrap();
    let one = HtmlReport::build(&prepared, meta.clone()).unwrap();
    assert!(!one.violations.is_empty() && !one.rnic_pairs.is_empty() && !one.tor_pairs.is_empty(), "{name}");
    let mut budgets = vec![1, prepared.records / 3];
    budgets.dedup();
    // `analyze html` reads a report's columns when localisation reads summaries.
    for (budget, fields) in budgets.into_iter().flat_map(|b| [(b, Fields::All), (b, Fields::Report)]) {
        let mut p = plan(&files, fields, None, window_ns);
        let ranges = p.ranges(budget);
        assert!(ranges.len() > 1, "{name}: one range");
        let (ranged, unknown) = HtmlReport::build_ranges(&mut p, &ranges, meta.clone()).unwrap();
        assert_eq!(unknown, 0);
        let what = format!("{name}, {} ranges, {fields:?}", ranges.len());
        assert_eq!(ranged.range_ns, one.range_ns, "{what}");
        assert_eq!(ranged.violations, one.violations, "{what}");
        assert_eq!(ranged.tor_pairs, one.tor_pairs, "{what}");
        assert_eq!(ranged.rnic_pairs.len(), one.rnic_pairs.len(), "{what}");
        for (a, b) in ranged.rnic_pairs.iter().zip(&one.rnic_pairs) {
            assert_eq!(a, b, "{what}");
        }
    }
}

#[test]
fn a_lossy_tor_is_the_same_page_a_range_at_a_time() {
    check("tor-loss");
}

#[test]
fn a_flapping_link_is_the_same_page_a_range_at_a_time() {
    check("link-flap");
}
