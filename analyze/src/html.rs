//! `analyze html`: one self-contained HTML page for operators: loss ratio and RTT p99 per window
//! with the findings on the same time axis ([`timeline`]), ToR x ToR and RNIC x RNIC heatmaps of
//! loss ratio and RTT p99 over the whole range, the SLA violations, and the findings of `analyze
//! localize` with the traced service connections they touch.
//!
//! Self-contained means inline CSS and JS and nothing fetched: the page is mailed, attached to
//! tickets and opened on bastions without internet access. The heatmaps are drawn by a few
//! lines of JS on canvases from the (sparse) cells embedded as JSON, because a 256 x 256 SVG
//! would weigh megabytes and stall browsers.

use std::fmt::Write as _;

use serde::Serialize;

use std::collections::BTreeMap;

use crate::ingest::Plan;
use crate::inspect::utc;
use crate::localize::ServiceImpact;
use crate::report::{Meta, Prepared, ReportError, Row, Scope, Sla, Span};

mod p99;
pub mod timeline;
use p99::PairP99;
use timeline::Timeline;

/// At most this many RNICs per axis of the RNIC x RNIC heatmap (and ToRs of the ToR one).
pub const MAX_HEATMAP_AXIS: usize = 256;
/// At most this many violation rows are listed; the page says how many there were.
pub const MAX_VIOLATION_ROWS: usize = 2000;
/// At most this many services are listed (worst first); the page says how many there were.
pub const MAX_SERVICE_ROWS: usize = 2000;

/// Localisation's findings, as the page shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Findings {
    pub rows: Vec<FindingRow>,
    /// What they were counted from (`localize::counted_from`).
    pub counted_from: String,
}

/// One finding of `analyze localize`, as the page shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FindingRow {
    /// What kind of fault (e.g. `rnic`, `tor_uplink`, `host_noise`).
    pub kind: String,
    /// The entity blamed.
    pub entity: String,
    /// First evidence, Unix ns.
    pub start_ns: u64,
    /// Last evidence, Unix ns; `None` while it lasts to the end of the data.
    pub end_ns: Option<u64>,
    /// Why, in one line.
    pub evidence: String,
    /// What the switches' counters of its ports did (`crate::switches`), when asked.
    pub switches: Option<String>,
}

/// What the page shows of a pair over the whole range: one heatmap cell.
#[derive(Clone, Debug, PartialEq)]
pub struct PairCell {
    /// `from->to`.
    pub entity: String,
    /// The two ends (prober, target).
    pub ends: (String, String),
    /// As [`Row`]'s fields of the same names, over the whole range.
    pub probes: u64,
    /// See `probes`.
    pub unreachable: u64,
    /// See `probes`.
    pub local_drop: u64,
    /// See `probes`.
    pub loss_ratio: Option<f64>,
    /// See `probes` (the nearest-rank p99 of every ok probe of the pair in the range).
    pub rtt_ns_p99: Option<i64>,
}

impl PairCell {
    fn of(r: &Row) -> Option<PairCell> {
        Some(PairCell {
            entity: r.entity.clone(),
            ends: r.ends.clone()?,
            probes: r.probes,
            unreachable: r.unreachable,
            local_drop: r.local_drop,
            loss_ratio: r.loss_ratio,
            rtt_ns_p99: r.rtt_ns_p99,
        })
    }
}

/// What the page shows, computed from a [`Prepared`] table ([`HtmlReport::build`]) or a plan's
/// ranges ([`HtmlReport::build_ranges`]): the same figures.
#[derive(Clone, Debug)]
pub struct HtmlReport {
    /// Inputs, window and thresholds.
    pub meta: Meta,
    /// Start of the first window and end of the last, Unix ns.
    pub range_ns: Option<(u64, u64)>,
    /// Whole-range figures of the `tor_pair` scope, by entity.
    pub tor_pairs: Vec<PairCell>,
    /// Whole-range figures of the `pair` scope, by entity.
    pub rnic_pairs: Vec<PairCell>,
    /// Per-window rows (cluster, ToR pair, ToR, RNIC) that break the SLA.
    pub violations: Vec<Row>,
    /// Per-window figures of the cluster and the ToR pairs, for the time charts.
    pub timeline: Timeline,
}

/// The scopes of the violations listed.
const VIOLATION_SCOPES: [Scope; 4] = [Scope::Cluster, Scope::TorPair, Scope::Tor, Scope::Rnic];

impl HtmlReport {
    /// Computes the page's figures.
    pub fn build(prepared: &Prepared, meta: Meta) -> Result<HtmlReport, ReportError> {
        let sla = meta.sla;
        let whole = |scope| -> Result<Vec<PairCell>, ReportError> {
            let mut cells: Vec<PairCell> =
                prepared.rows(&[scope], Span::WholeRange, &sla)?.iter().filter_map(PairCell::of).collect();
            cells.sort_by(|a, b| a.entity.cmp(&b.entity));
            Ok(cells)
        };
        let mut violations = prepared.rows(&VIOLATION_SCOPES, Span::PerWindow, &sla)?;
        let mut timeline = Timeline::new(prepared.window_ns);
        timeline.add(&violations);
        violations.retain(|r| !r.sla_violations.is_empty());
        let range_ns = prepared.windows.map(|(a, b)| {
            (a.saturating_mul(prepared.window_ns), b.saturating_add(1).saturating_mul(prepared.window_ns))
        });
        Ok(HtmlReport {
            range_ns,
            tor_pairs: whole(Scope::TorPair)?,
            rnic_pairs: whole(Scope::Pair)?,
            violations,
            timeline,
            meta,
        })
    }

    /// [`HtmlReport::build`] over a plan's ranges of whole windows, so that memory follows a
    /// range and the fleet, not the hours read; the same figures, exactly. The violations are
    /// per window, so each range gives its own; a pair's whole-range counts add up over the
    /// ranges; its whole-range RTT p99 is an exact nearest rank, found by radix selection over
    /// four reads of the ranges ([`PairP99`]). Returns the page's figures (with `meta` as given:
    /// the caller fills in what only the end of the reads knows) and the records whose outcome
    /// byte this build does not know.
    pub fn build_ranges(plan: &mut Plan, ranges: &[(u64, u64)], meta: Meta) -> Result<(HtmlReport, u64), ReportError> {
        let (sla, window_ns) = (meta.sla, meta.window_s.max(1) * 1_000_000_000);
        let mut p99 = PairP99::new(&plan.ds.rnics);
        let mut sums: BTreeMap<(Scope, String), (Row, u64)> = BTreeMap::new();
        let mut violations = Vec::new();
        let mut timeline = Timeline::new(window_ns);
        let (mut windows, mut unknown_outcomes): (Option<(u64, u64)>, u64) = (None, 0);
        plan.rewind();
        for &(from, to) in ranges {
            let probes = plan.read(from, to);
            p99.count(&probes, 0)?;
            let prepared = crate::report::prepare_with(probes, &plan.ds.rnics, &plan.ds.services, window_ns)?;
            unknown_outcomes += prepared.unknown_outcomes;
            if let Some((a, b)) = prepared.windows {
                windows = Some(windows.map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
            }
            let mut v = prepared.rows(&VIOLATION_SCOPES, Span::PerWindow, &sla)?;
            timeline.add(&v);
            v.retain(|r| !r.sla_violations.is_empty());
            violations.extend(v);
            for r in prepared.rows(&[Scope::TorPair, Scope::Pair], Span::WholeRange, &sla)? {
                match sums.entry((r.scope, r.entity.clone())) {
                    std::collections::btree_map::Entry::Vacant(e) => {
                        let ok = r.ok;
                        e.insert((r, ok));
                    }
                    std::collections::btree_map::Entry::Occupied(mut e) => {
                        let (s, ok) = e.get_mut();
                        s.probes += r.probes;
                        s.lost += r.lost;
                        s.partial += r.partial;
                        s.unreachable += r.unreachable;
                        s.local_drop += r.local_drop;
                        *ok += r.ok;
                    }
                }
            }
        }
        for level in 1..PairP99::LEVELS {
            p99.select(level - 1)?;
            plan.rewind();
            for &(from, to) in ranges {
                p99.count(&plan.read(from, to), level)?;
            }
        }
        p99.select(PairP99::LEVELS - 1)?;
        crate::report::sort_rows(&mut violations);
        let (mut tor_pairs, mut rnic_pairs) = (Vec::new(), Vec::new());
        for ((scope, entity), (s, ok)) in sums {
            let ends = s.ends.clone().unwrap_or_default();
            let rtt_ns_p99 = p99.value(scope, &ends);
            let counted = rtt_ns_p99.map_or(0, |(_, n)| n);
            if counted != ok {
                return Err(ReportError::Columns(format!(
                    "{entity}: {counted} ok probes counted for its RTT p99 where its rows count {ok}"
                )));
            }
            let cell = PairCell {
                loss_ratio: crate::probe::loss_ratio(ok, s.partial, s.lost),
                rtt_ns_p99: rtt_ns_p99.map(|(v, _)| i64::from(v)),
                entity,
                ends,
                probes: s.probes,
                unreachable: s.unreachable,
                local_drop: s.local_drop,
            };
            if scope == Scope::TorPair { tor_pairs.push(cell) } else { rnic_pairs.push(cell) }
        }
        let range_ns =
            windows.map(|(a, b)| (a.saturating_mul(window_ns), b.saturating_add(1).saturating_mul(window_ns)));
        Ok((HtmlReport { meta, range_ns, tor_pairs, rnic_pairs, violations, timeline }, unknown_outcomes))
    }
}

/// One heatmap cell: row, column, loss_ratio, rtt_ns_p99, probes, unreachable, local_drop (a
/// tuple, so the embedded JSON stays small).
type Cell = (usize, usize, Option<f64>, Option<i64>, u64, u64, u64);

/// One heatmap's data as the page's JS reads it.
#[derive(Serialize)]
struct Heatmap {
    id: &'static str,
    labels: Vec<String>,
    cells: Vec<Cell>,
    loss_sla: f64,
    rtt_sla_ns: f64,
}

/// The heatmap of pair rows (rows with `ends`); returns it and how many entities there were
/// before capping.
fn heatmap(id: &'static str, rows: &[PairCell], sla: &Sla) -> (Heatmap, usize) {
    use std::collections::BTreeSet;
    // Each entity's worst pair, to keep the most interesting ones when capping.
    let mut worst: BTreeMap<&str, (f64, i64)> = BTreeMap::new();
    for r in rows {
        let (a, b) = &r.ends;
        for e in [a.as_str(), b.as_str()] {
            let w = worst.entry(e).or_insert((0.0, 0));
            w.0 = w.0.max(r.loss_ratio.unwrap_or(0.0));
            w.1 = w.1.max(r.rtt_ns_p99.unwrap_or(0));
        }
    }
    let total = worst.len();
    let mut ranked: Vec<(&str, (f64, i64))> = worst.into_iter().collect();
    ranked.sort_by(|x, y| y.1.0.total_cmp(&x.1.0).then(y.1.1.cmp(&x.1.1)).then(x.0.cmp(y.0)));
    ranked.truncate(MAX_HEATMAP_AXIS);
    let kept: BTreeSet<&str> = ranked.iter().map(|(n, _)| *n).collect();
    let labels: Vec<String> = kept.iter().map(|s| (*s).to_owned()).collect();
    let index = |n: &str| labels.binary_search_by(|l| l.as_str().cmp(n)).ok();
    let cells = rows
        .iter()
        .filter_map(|r| {
            let (a, b) = &r.ends;
            Some((index(a)?, index(b)?, r.loss_ratio, r.rtt_ns_p99, r.probes, r.unreachable, r.local_drop))
        })
        .collect();
    (Heatmap { id, labels, cells, loss_sla: sla.loss_ratio, rtt_sla_ns: sla.rtt_p99_us * 1e3 }, total)
}

/// Text safe inside HTML elements and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn us(ns: Option<i64>) -> String {
    ns.map_or_else(|| "–".into(), |v| format!("{:.1}", v as f64 / 1e3))
}

fn pct(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |v| format!("{:.3}%", v * 100.0))
}

/// The page. `findings` and `services` are `None` when localisation was not run.
pub fn render(
    report: &HtmlReport,
    findings: Option<&Findings>,
    services: Option<&[ServiceImpact]>,
) -> Result<String, ReportError> {
    let mut h = String::with_capacity(1 << 16);
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n");
    h.push_str("<title>rocemesh report</title>\n<style>");
    h.push_str(CSS);
    h.push_str("</style></head><body>\n<h1>rocemesh fabric report</h1>\n");

    render_summary(&mut h, report);
    let rows = findings.map(|f| f.rows.as_slice());
    let chart = render_timeline(&mut h, report, rows);
    render_findings(&mut h, findings);
    render_services(&mut h, services);
    let maps = render_heatmaps(&mut h, report);
    render_violations(&mut h, report);
    let spans: Vec<ChartSpan> = rows.unwrap_or_default().iter().map(ChartSpan::of).collect();
    let sla = report.meta.sla;
    let _ = write!(
        h,
        "<script>const MAPS = {};\nconst CHART = {};\nconst SPANS = {};\n\
         const CHART_SLA = {{\"loss\": {}, \"rtt_us\": {}}};\n{JS}\n{}</script>\n</body></html>\n",
        script_json(&maps)?,
        script_json(&chart)?,
        script_json(&spans)?,
        sla.loss_ratio,
        sla.rtt_p99_us,
        timeline::JS
    );
    Ok(h)
}

/// `v` as JSON for the page's script: `<` is escaped so that no name can close the script element.
fn script_json<T: Serialize>(v: &T) -> Result<String, ReportError> {
    Ok(serde_json::to_string(v)?.replace('<', "\\u003c"))
}

/// A finding as the time charts draw it: a span, in seconds since the epoch.
#[derive(Serialize)]
struct ChartSpan<'a> {
    kind: &'a str,
    entity: &'a str,
    start: u64,
    /// None while it lasts to the end of the data.
    end: Option<u64>,
}

impl ChartSpan<'_> {
    fn of(f: &FindingRow) -> ChartSpan<'_> {
        ChartSpan {
            kind: &f.kind,
            entity: &f.entity,
            start: f.start_ns / 1_000_000_000,
            end: f.end_ns.map(|e| e.div_ceil(1_000_000_000)),
        }
    }
}

/// The time charts' section; returns their data, which the page's script draws.
fn render_timeline(h: &mut String, report: &HtmlReport, findings: Option<&[FindingRow]>) -> timeline::Chart {
    let chart = report.timeline.chart(report.meta.window_s);
    h.push_str("<section><h2>Over time</h2>");
    if chart.is_empty() {
        h.push_str("<p>No probes.</p></section>\n");
        return chart;
    }
    let per_point = if chart.bucket_windows > 1 {
        format!("each point the worst of {} windows", chart.bucket_windows)
    } else {
        "one point per window".to_owned()
    };
    let spans = match findings {
        None => "no findings drawn (localisation was not run)",
        Some([]) => "no findings to draw",
        Some(_) => "the findings shaded, labelled by kind and entity",
    };
    let _ = writeln!(
        h,
        "<p class=\"note\">Cluster in blue ({per_point}); the SLA threshold dashed red; {spans}. \
         ToR pair <select id=\"pair\"><option value=\"\">none</option></select> drawn in orange \
         (pick one of the {} of {} pairs that lost the most). Hover for the figures.</p>\
         <figure><figcaption>loss ratio per window</figcaption><canvas id=\"time-loss\"></canvas></figure>\
         <figure><figcaption>network RTT p99 per window</figcaption><canvas id=\"time-rtt\"></canvas></figure>\
         </section>",
        chart.pairs_shown(),
        chart.pairs_total
    );
    chart
}

/// The summary section: the range read, the SLA, the input problems, how probes count.
fn render_summary(h: &mut String, report: &HtmlReport) {
    let m = &report.meta;
    let range = report.range_ns.map_or_else(|| "no records".into(), |(a, b)| format!("{} to {}", utc(a), utc(b)));
    let _ = write!(
        h,
        "<section><h2>Summary</h2><table class=\"kv\">\
         <tr><th>time range (UTC)</th><td>{}</td></tr>\
         <tr><th>records</th><td>{}</td></tr>\
         <tr><th>segment files</th><td>{}</td></tr>\
         <tr><th>window</th><td>{} s</td></tr>\
         <tr><th>SLA</th><td>loss ratio &le; {}%, network RTT p99 &le; {} µs</td></tr>\
         <tr><th>SLA violations</th><td>{} window rows</td></tr></table>",
        escape(&range),
        m.records,
        m.files,
        m.window_s,
        m.sla.loss_ratio * 100.0,
        m.sla.rtt_p99_us,
        report.violations.len()
    );
    if !m.problems.is_empty() {
        let _ = write!(
            h,
            "<p class=\"warn\">{} input problems (damaged files were read in part, unreadable ones skipped):</p><ul>",
            m.problems.len()
        );
        for p in &m.problems {
            let _ = write!(h, "<li>{}</li>", escape(p));
        }
        h.push_str("</ul>");
    }
    h.push_str(
        "<p class=\"note\">Loss ratio = lost / (ok + partial + lost); a pair with nothing but losses in a \
         window is a dead peer (unreachable), not loss; probes dropped on the prober's own host (local drop) \
         and refused or invalid ones are in neither. Delays are nearest-rank quantiles over ok probes; \
         the timestamp source column says which clocks stamped them (mixed(...) when several were pooled).</p>\
         </section>\n",
    );
}

/// The findings table, or why there is none.
fn render_findings(h: &mut String, findings: Option<&Findings>) {
    h.push_str("<section><h2>Findings</h2>");
    if let Some(f) = findings {
        let _ = write!(h, "<p>{}.</p>", escape(&f.counted_from));
    }
    match findings.map(|f| f.rows.as_slice()) {
        None => h.push_str("<p>findings: run <code>analyze localize</code></p>"),
        Some([]) => h.push_str("<p>No findings: localisation blamed nothing.</p>"),
        Some(f) => {
            // The switches' column only when Prometheus was asked about some finding.
            let switches = f.iter().any(|f| f.switches.is_some());
            let _ = write!(
                h,
                "<table><tr><th>kind</th><th>entity</th><th>from (UTC)</th><th>to (UTC)</th><th>evidence</th>{}</tr>",
                if switches { "<th>switch ports and counters</th>" } else { "" }
            );
            for f in f {
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                    escape(&f.kind),
                    escape(&f.entity),
                    utc(f.start_ns),
                    f.end_ns.map_or_else(|| "ongoing".into(), utc),
                    escape(&f.evidence)
                );
                if switches {
                    let _ = write!(h, "<td>{}</td>", escape(f.switches.as_deref().unwrap_or("-")));
                }
                h.push_str("</tr>");
            }
            h.push_str("</table>");
        }
    }
    h.push_str("</section>\n");
}

/// The ToR and RNIC heatmap sections; returns their data, which the page's script draws.
fn render_heatmaps(h: &mut String, report: &HtmlReport) -> Vec<Heatmap> {
    let m = &report.meta;
    let mut maps = Vec::new();
    for (id, title, rows, what) in
        [("tor", "ToR × ToR", &report.tor_pairs, "ToRs"), ("rnic", "RNIC × RNIC", &report.rnic_pairs, "RNICs")]
    {
        let (map, total) = heatmap(id, rows, &m.sla);
        let _ = write!(h, "<section><h2>{title} over the whole range</h2>");
        if total > map.labels.len() {
            let _ = write!(
                h,
                "<p class=\"warn\">Capped: showing {} of {total} {what}, those with the worst loss ratio \
                 and RTT p99 in any pair.</p>",
                map.labels.len()
            );
        }
        if map.labels.is_empty() {
            h.push_str("<p>No probes.</p></section>\n");
            continue;
        }
        let _ = writeln!(
            h,
            "<p class=\"note\">Rows: prober, columns: target. Hover a cell for its figures.</p>\
             <div class=\"maps\"><figure><figcaption>loss ratio</figcaption><canvas id=\"{id}-loss\"></canvas></figure>\
             <figure><figcaption>network RTT p99</figcaption><canvas id=\"{id}-rtt\"></canvas></figure></div>{LEGEND}</section>"
        );
        maps.push(map);
    }
    maps
}

/// The SLA violations table, capped at [`MAX_VIOLATION_ROWS`] rows.
fn render_violations(h: &mut String, report: &HtmlReport) {
    h.push_str("<section><h2>SLA violations per window</h2>");
    if report.violations.is_empty() {
        h.push_str("<p>None: every window of every cluster, ToR pair, ToR and RNIC row is within the SLA.</p>");
    } else {
        if report.violations.len() > MAX_VIOLATION_ROWS {
            let _ = write!(
                h,
                "<p class=\"warn\">Showing the first {MAX_VIOLATION_ROWS} of {} rows; \
                 <code>analyze report --format csv</code> lists them all.</p>",
                report.violations.len()
            );
        }
        h.push_str(
            "<table><tr><th>window (UTC)</th><th>scope</th><th>entity</th><th>broke</th><th>probes</th><th>lost</th>\
             <th>unreachable</th><th>local drop</th><th>loss</th><th>RTT p50 µs</th><th>RTT p99 µs</th>\
             <th>RTT p99.9 µs</th><th>timestamp source</th></tr>",
        );
        for r in report.violations.iter().take(MAX_VIOLATION_ROWS) {
            let broke = r.sla_violations.iter().map(|v| v.name()).collect::<Vec<_>>().join(", ");
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"bad\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                r.window_start,
                r.scope.name(),
                escape(&r.entity),
                broke,
                r.probes,
                r.lost,
                r.unreachable,
                r.local_drop,
                pct(r.loss_ratio),
                us(r.rtt_ns_p50),
                us(r.rtt_ns_p99),
                us(r.rtt_ns_p999),
                r.ts_source.as_deref().map_or_else(|| "–".into(), escape)
            );
        }
        h.push_str("</table>");
    }
    h.push_str("</section>\n<div id=\"tip\"></div>\n");
}

/// The "Services" section: traced connections ranked by impact, with the findings on their path.
fn render_services(h: &mut String, services: Option<&[ServiceImpact]>) {
    h.push_str("<section><h2>Services</h2>");
    let services = match services {
        None => {
            h.push_str("<p>services: run <code>analyze localize</code></p></section>\n");
            return;
        }
        Some([]) => {
            h.push_str("<p>No traced service connections in the data.</p></section>\n");
            return;
        }
        Some(s) => s,
    };
    h.push_str(
        "<p class=\"note\">Traced RDMA connections of jobs, probed along their own flow label. Grade high: its own \
         probes broke the SLA loss ratio or were slow; medium: a finding lay on its path while its probes stayed \
         clean; low: some loss or slow probes below that; none: clean.</p>",
    );
    if services.len() > MAX_SERVICE_ROWS {
        let _ = write!(
            h,
            "<p class=\"warn\">Showing the worst {MAX_SERVICE_ROWS} of {} services; \
             <code>analyze localize --format json</code> lists them all.</p>",
            services.len()
        );
    }
    h.push_str(
        "<table><tr><th>rank</th><th>grade</th><th>service</th><th>prober</th><th>remote</th><th>lost/probes</th>\
         <th>RTT p99 µs</th><th>affected by</th></tr>",
    );
    for s in services.iter().take(MAX_SERVICE_ROWS) {
        let mut affected: Vec<String> = s
            .affected_by
            .iter()
            .map(|a| {
                let confirmed = if a.confirmed { " (confirmed)" } else { "" };
                escape(&format!("{} {} from {}{confirmed}", a.kind, a.entity, utc(a.start_ns)))
            })
            .collect();
        if let Some(note) = &s.note {
            affected.push(format!("<i>{}</i>", escape(note)));
        }
        let grade = s.grade.name();
        let class = if grade == "high" { " class=\"bad\"" } else { "" };
        let remote = if s.remote_resolution == crate::ingest::Resolution::Unresolved {
            format!("{} (unresolved)", escape(&s.remote))
        } else {
            escape(&s.remote)
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td{class}>{grade}</td><td title=\"{}\">{}</td><td>{}</td><td>{remote}</td><td>{}/{}</td>\
             <td>{}</td><td>{}</td></tr>",
            s.rank,
            escape(&s.name),
            escape(&s.label),
            escape(&s.prober),
            s.lost,
            s.probes,
            us(s.rtt_ns_p99),
            affected.join("<br>")
        );
    }
    h.push_str("</table></section>\n");
}

const LEGEND: &str = "<p class=\"legend\"><span style=\"background:#1a9850\"></span>0 / well within \
<span style=\"background:#fee08b\"></span>at the SLA <span style=\"background:#d73027\"></span>far beyond \
<span style=\"background:#9e9e9e\"></span>no ok/lost samples (dead peer, refused) \
<span style=\"background:#f4f4f4;border:1px solid #ccc\"></span>not probed</p>";

const CSS: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.15em;border-bottom:1px solid #ddd;padding-bottom:.2em}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}\
th{background:#f4f4f4}td:nth-child(-n+3){text-align:left}table.kv td,table.kv th{text-align:left}\
.warn{color:#a04000}.note{color:#555}.bad{color:#b71c1c;font-weight:600}\
.maps{display:flex;flex-wrap:wrap;gap:2em}figure{margin:0}figcaption{font-weight:600;margin-bottom:.3em}\
canvas{image-rendering:pixelated;border:1px solid #ccc}\
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}\
#tip{position:fixed;display:none;background:#fff;border:1px solid #888;padding:4px 8px;font-size:12px;\
pointer-events:none;box-shadow:1px 1px 4px #aaa;white-space:pre}";

/// Draws every heatmap; a cell's colour is its value against the SLA threshold.
const JS: &str = r#"
(function () {
  const tip = document.getElementById('tip');
  function mix(a, b, t) { return a.map((x, i) => Math.round(x + (b[i] - x) * Math.max(0, Math.min(1, t)))); }
  const GREEN = [26, 152, 80], YELLOW = [254, 224, 139], RED = [215, 48, 39];
  function colour(v, sla) {
    if (v === null) return 'rgb(158,158,158)';
    let c;
    if (v <= 0) c = GREEN;
    else if (v <= sla) c = mix(GREEN, YELLOW, v / Math.max(sla, 1e-12));
    else c = mix(YELLOW, RED, Math.log10(v / sla) / 2);
    return 'rgb(' + c.join(',') + ')';
  }
  function fmt(c, m) {
    const loss = c[2] === null ? 'no samples' : (c[2] * 100).toFixed(3) + '%';
    const rtt = c[3] === null ? 'no samples' : (c[3] / 1000).toFixed(1) + ' µs';
    return m.labels[c[0]] + ' → ' + m.labels[c[1]] + '\nloss ' + loss + ', RTT p99 ' + rtt +
      '\n' + c[4] + ' probes, ' + c[5] + ' unreachable, ' + c[6] + ' dropped locally';
  }
  for (const m of MAPS) {
    const n = m.labels.length;
    const cell = Math.max(2, Math.min(24, Math.floor(720 / n)));
    const label = cell >= 10 ? Math.min(220, 7 * Math.max(...m.labels.map(l => l.length))) : 0;
    const grid = new Map();
    for (const c of m.cells) grid.set(c[0] * n + c[1], c);
    for (const [suffix, idx, sla] of [['loss', 2, m.loss_sla], ['rtt', 3, m.rtt_sla_ns]]) {
      const cv = document.getElementById(m.id + '-' + suffix);
      cv.width = label + n * cell; cv.height = label + n * cell;
      const g = cv.getContext('2d');
      g.fillStyle = '#f4f4f4'; g.fillRect(label, label, n * cell, n * cell);
      for (const c of m.cells) {
        g.fillStyle = colour(c[idx], sla);
        g.fillRect(label + c[1] * cell, label + c[0] * cell, cell, cell);
      }
      if (label) {
        g.fillStyle = '#222'; g.font = Math.min(12, cell) + 'px sans-serif'; g.textBaseline = 'middle';
        m.labels.forEach((l, i) => {
          g.textAlign = 'right'; g.fillText(l, label - 3, label + i * cell + cell / 2);
          g.save(); g.translate(label + i * cell + cell / 2, label - 3); g.rotate(-Math.PI / 2);
          g.textAlign = 'left'; g.fillText(l, 0, 0); g.restore();
        });
      }
      cv.addEventListener('mousemove', e => {
        const r = cv.getBoundingClientRect();
        const x = Math.floor((e.clientX - r.left - label) / cell), y = Math.floor((e.clientY - r.top - label) / cell);
        const c = x >= 0 && y >= 0 && x < n && y < n ? grid.get(y * n + x) : undefined;
        if (!c) { tip.style.display = 'none'; return; }
        tip.textContent = fmt(c, m);
        tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px'; tip.style.display = 'block';
      });
      cv.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
    }
  }
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn row(a: &str, b: &str, loss: Option<f64>) -> Row {
        Row { ends: Some((a.into(), b.into())), ..row_of(Scope::Pair, &format!("{a}->{b}"), 0, 0, loss) }
    }

    /// A report row of `scope` and `entity` in the window starting at `window_start_ns`: 10
    /// probes, `lost` of them lost, RTT p50/p99/p99.9 of 1, 2 and 3 ns.
    pub(super) fn row_of(scope: Scope, entity: &str, window_start_ns: u64, lost: u64, loss: Option<f64>) -> Row {
        Row {
            window_start_ns,
            window_start: utc(window_start_ns),
            scope,
            entity: entity.into(),
            ends: None,
            probes: 10,
            ok: 10 - lost.min(10),
            lost,
            partial: 0,
            invalid: 0,
            refused: 0,
            local_drop: 0,
            unreachable: 0,
            loss_ratio: loss,
            rtt_ns_p50: Some(1),
            rtt_ns_p99: Some(2),
            rtt_ns_p999: Some(3),
            prober_delay_ns_p50: None,
            prober_delay_ns_p99: None,
            responder_delay_ns_p50: None,
            responder_delay_ns_p99: None,
            ts_source: Some("kernel_software".into()),
            sla_violations: Vec::new(),
            service: None,
        }
    }

    #[test]
    fn heatmap_caps_keeping_the_worst() {
        let mut rows: Vec<PairCell> = (0..300)
            .filter_map(|i| PairCell::of(&row(&format!("r{i:03}"), &format!("r{:03}", (i + 1) % 300), Some(0.0))))
            .collect();
        rows.extend(PairCell::of(&row("r299", "zz-bad", Some(0.5))));
        let (m, total) = heatmap("x", &rows, &Sla::default());
        assert_eq!(total, 301);
        assert_eq!(m.labels.len(), MAX_HEATMAP_AXIS);
        assert!(m.labels.iter().any(|l| l == "zz-bad"), "the worst RNIC survives the cap");
        assert!(m.labels.windows(2).all(|w| w[0] < w[1]), "sorted by name");
    }

    #[test]
    fn violations_show_local_drops_and_timestamp_sources() {
        let mut r = row("a", "b", Some(0.5));
        r.local_drop = 42;
        r.ts_source = Some("mixed(host_poll+kernel_software)".into());
        r.sla_violations = vec![crate::probe::Violation::Loss];
        let rep = HtmlReport {
            meta: Meta {
                window_s: 30,
                sla: Sla::default(),
                files: 1,
                records: 1,
                problems: Vec::new(),
                scopes: Vec::new(),
            },
            range_ns: Some((0, 30_000_000_000)),
            tor_pairs: Vec::new(),
            rnic_pairs: PairCell::of(&r).into_iter().collect(),
            violations: vec![r],
            timeline: Timeline::new(30_000_000_000),
        };
        let page = render(&rep, None, None).expect("render");
        assert!(page.contains("<th>local drop</th>") && page.contains("<td>42</td>"), "local drops shown");
        assert!(page.contains("<td>mixed(host_poll+kernel_software)</td>"), "timestamp sources shown");
        assert!(page.contains("0,1,0.5,2,10,0,42"), "heatmap cells carry local drops: {page}");
    }

    #[test]
    fn names_cannot_break_out() {
        let rep = HtmlReport {
            meta: Meta {
                window_s: 30,
                sla: Sla::default(),
                files: 1,
                records: 1,
                problems: vec!["<b>".into()],
                scopes: Vec::new(),
            },
            range_ns: Some((0, 30_000_000_000)),
            tor_pairs: PairCell::of(&row("</script><script>alert(1)</script>", "t", Some(0.0))).into_iter().collect(),
            rnic_pairs: Vec::new(),
            violations: Vec::new(),
            timeline: Timeline::new(30_000_000_000),
        };
        let page = render(&rep, None, None).expect("render");
        assert!(!page.contains("</script><script>alert"));
        assert!(!page.contains("<b>"));
        assert!(page.contains("findings: run <code>analyze localize</code>"));
    }
}
