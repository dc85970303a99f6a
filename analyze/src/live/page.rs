//! The live page (`/` of `--http`): one self-contained HTML page of a [`View`], for a person at
//! a browser (Prometheus reads `/metrics`). It loads nothing and runs no script: it reloads
//! itself every 5 s. Every string from the view is escaped: entity names, evidence, ToR and RNIC
//! names and reasons come from the agents' pushes, that is from the network.

use std::fmt::Write;

use rocemesh_formats::time::civil_utc;

use super::view::{View, WindowView};
use crate::html::escape;
use crate::inspect::utc;

/// ToR rows the heatmap shows at most: beyond it the page stops fitting a screen and a browser
/// slows down, and the ToRs that lost nothing are the least interesting to show.
pub const MAX_HEATMAP_TORS: usize = 64;

/// The cell colours, as the report page's (`analyze html`) heatmaps.
const GREEN: [u8; 3] = [26, 152, 80];
const YELLOW: [u8; 3] = [254, 224, 139];
const RED: [u8; 3] = [215, 48, 39];
const NO_PROBES: &str = "#eeeeee";
/// The loss ratios at the ends of the yellow-to-red scale (log10): 0.01% is at the edge of
/// what a window's probes resolve, 10% is a link or ToR gone bad.
const SCALE_LOG10: (f64, f64) = (-4.0, -1.0);

const CSS: &str = "body{font:14px system-ui,sans-serif;margin:.8em 1.5em;color:#222}\
h1{font-size:1.3em;margin:.2em 0}\
h2{font-size:1.1em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin:.9em 0 .4em}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}\
th{background:#f4f4f4}td.n{text-align:right}td.ev{max-width:60em}\
.top{margin:.2em 0}.bad{color:#b71c1c;font-weight:600}.note{color:#555}\
table.heat td{width:20px;height:11px;padding:0;border:1px solid #fff}\
table.heat th{font-weight:normal;font-size:11px;padding:0 4px;background:none;border:none;text-align:right;\
white-space:nowrap}\
table.heat th.t{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;padding:2px 0}\
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle;\
border:1px solid #ccc}";

/// The page.
pub fn render_page(v: &View) -> String {
    let mut h = String::with_capacity(16_384 + 160 * v.tors.len().min(MAX_HEATMAP_TORS) * v.windows.len());
    h.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"5\">\n<title>rocemesh live</title>\n<style>",
    );
    h.push_str(CSS);
    h.push_str("</style></head><body>\n<h1>rocemesh live</h1>\n");
    header(&mut h, v);
    findings(&mut h, v);
    heatmap(&mut h, v);
    windows(&mut h, v);
    refused(&mut h, v);
    h.push_str("</body></html>\n");
    h
}

/// One line: up since, the last window, RNICs, pushes.
fn header(h: &mut String, v: &View) {
    let last = match v.windows.last() {
        Some(w) => format!(
            "last window ended {}, localised {:.1} s later, {}; {} of {} RNICs heard",
            utc(w.start_ns.saturating_add(v.window_ns)),
            w.after_end_ms as f64 / 1e3,
            if w.complete { "complete" } else { "<span class=\"bad\">incomplete</span>" },
            w.rnics_heard,
            v.rnics_known
        ),
        None => format!("no window localised yet; {} RNICs known", v.rnics_known),
    };
    let refused = v.refused.values().fold(0u64, |a, &n| a.saturating_add(n));
    let refused =
        if refused > 0 { format!("<span class=\"bad\">{refused} refused</span>") } else { "0 refused".into() };
    let _ = writeln!(
        h,
        "<p class=\"top\">Up since {}; as of {}. {last}. Pushes: {} received, {} taken, {refused}.</p>",
        utc(v.started_unix_ns),
        hms(v.now_unix_ns),
        v.received,
        v.taken
    );
}

fn findings(h: &mut String, v: &View) {
    let _ = write!(h, "<section><h2>Open findings: {}</h2>", v.open.len());
    if v.open.is_empty() {
        h.push_str("<p>No findings open.</p></section>\n");
        return;
    }
    let asked = v.switch_checks.is_some();
    h.push_str(
        "<table><tr><th>kind</th><th>entity</th><th>since (UTC)</th><th>windows</th><th>score</th>\
         <th>evidence</th>",
    );
    h.push_str(if asked { "<th>switch ports and counters</th></tr>" } else { "</tr>" });
    for f in &v.open {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"ev\">{}</td>",
            escape(&f.kind),
            escape(&f.entity),
            utc(f.since_ns),
            f.windows,
            percent(f.score, 1),
            escape(&f.evidence)
        );
        if asked {
            let said = f.switches.as_deref().unwrap_or("not answered yet (asked a lookback after its first window)");
            let _ = write!(h, "<td class=\"ev\">{}</td>", escape(said));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table></section>\n");
}

/// ToRs by window: the share of the probes toward each ToR's RNICs that were lost.
fn heatmap(h: &mut String, v: &View) {
    h.push_str("<section><h2>Loss toward each ToR</h2>");
    if v.windows.is_empty() || v.tors.is_empty() {
        h.push_str("<p>No window localised yet, or no ToR known.</p></section>\n");
        return;
    }
    let rows = shown_tors(v);
    if rows.len() < v.tors.len() {
        let _ = write!(
            h,
            "<p class=\"note\">{} of {} ToRs shown: those that lost the most probes in the last window \
             (<code>/findings.json</code> has them all).</p>",
            rows.len(),
            v.tors.len()
        );
    }
    legend(h);
    h.push_str("<table class=\"heat\"><tr><th></th>");
    for w in &v.windows {
        let _ = write!(h, "<th class=\"t\">{}</th>", hms(w.start_ns));
    }
    h.push_str("</tr>\n");
    for i in rows {
        let tor = escape(v.tors.get(i).map_or("", String::as_str));
        let _ = write!(h, "<tr><th>{tor}</th>");
        for w in &v.windows {
            let (probes, lost) = cell(w, i);
            let _ = write!(
                h,
                "<td style=\"background:{}\" title=\"{tor} {}: {}\"></td>",
                colour(probes, lost),
                hms(w.start_ns),
                tip(probes, lost)
            );
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table></section>\n");
}

fn legend(h: &mut String) {
    h.push_str("<p class=\"note legend\">Lost / probes toward the ToR's RNICs, per window (UTC):");
    let swatches = [(NO_PROBES.to_owned(), "no probes"), (rgb(GREEN), "none lost")];
    let scale = [(1, 10_000, "0.01%"), (1, 1000, "0.1%"), (1, 100, "1%"), (1, 10, "10% and more")];
    let scale = scale.map(|(lost, probes, label)| (colour(probes, lost), label));
    for (c, label) in swatches.iter().chain(&scale) {
        let _ = write!(h, "<span style=\"background:{c}\"></span>{label}");
    }
    h.push_str(". Hover a cell for its figures.</p>");
}

/// The heatmap's rows, indices into [`View::tors`] in name order: all of them, or beyond
/// [`MAX_HEATMAP_TORS`] those that lost the most probes in the last window.
fn shown_tors(v: &View) -> Vec<usize> {
    let mut rows: Vec<usize> = (0..v.tors.len()).collect();
    if rows.len() > MAX_HEATMAP_TORS {
        let last = v.windows.last();
        let worst = |i: usize| {
            let (probes, lost) = last.map_or((0, 0), |w| cell(w, i));
            (lost, probes)
        };
        // Stable: among equals the first by name stay.
        rows.sort_by_key(|&i| std::cmp::Reverse(worst(i)));
        rows.truncate(MAX_HEATMAP_TORS);
        rows.sort_unstable();
    }
    rows
}

/// (probes, lost) of ToR `i` in `w`; none where the window predates the ToR.
fn cell(w: &WindowView, i: usize) -> (u64, u64) {
    (w.tor_probes.get(i).copied().unwrap_or(0), w.tor_lost.get(i).copied().unwrap_or(0))
}

/// Grey without probes, green without loss, then yellow to red on a log scale.
fn colour(probes: u64, lost: u64) -> String {
    if probes == 0 {
        return NO_PROBES.to_owned();
    }
    if lost == 0 {
        return rgb(GREEN);
    }
    let (lo, hi) = SCALE_LOG10;
    let t = (((lost as f64 / probes as f64).log10() - lo) / (hi - lo)).clamp(0.0, 1.0);
    rgb(std::array::from_fn(|i| {
        let (a, b) = (f64::from(YELLOW[i]), f64::from(RED[i]));
        (a + (b - a) * t).round() as u8
    }))
}

fn rgb(c: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

fn tip(probes: u64, lost: u64) -> String {
    if probes == 0 {
        return "no probes".into();
    }
    format!("{lost}/{probes} lost ({})", percent(lost as f64 / probes as f64, 3))
}

fn percent(ratio: f64, decimals: usize) -> String {
    if ratio.is_finite() { format!("{:.decimals$}%", ratio * 100.0) } else { "–".into() }
}

/// `HH:MM:SS` (UTC) of Unix ns: the heatmap's columns, within a day of each other.
fn hms(ns: u64) -> String {
    let c = civil_utc((ns / 1_000_000_000) as i64);
    format!("{:02}:{:02}:{:02}", c.hour, c.minute, c.second)
}

/// The windows localised, the newest first.
fn windows(h: &mut String, v: &View) {
    h.push_str("<section><h2>Windows</h2>");
    if v.windows.is_empty() {
        h.push_str("<p>None localised yet.</p></section>\n");
        return;
    }
    h.push_str(
        "<table><tr><th>start (UTC)</th><th>complete</th><th>after end (s)</th><th>localise (ms)</th>\
         <th>RNICs heard</th><th>probes</th><th>RNICs missing</th></tr>",
    );
    for w in v.windows.iter().rev() {
        let complete = if w.complete { "yes" } else { "<span class=\"bad\">no</span>" };
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{complete}</td><td class=\"n\">{:.1}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            utc(w.start_ns),
            w.after_end_ms as f64 / 1e3,
            w.localise_ms,
            w.rnics_heard,
            w.probes,
            missing(w)
        );
    }
    h.push_str("</table></section>\n");
}

/// The count, and the names the window kept.
fn missing(w: &WindowView) -> String {
    if w.rnics_missing == 0 {
        return "0".into();
    }
    let names: Vec<String> = w.missing.iter().map(|n| escape(n)).collect();
    let more = if w.rnics_missing > names.len() { ", …" } else { "" };
    format!("{}: {}{more}", w.rnics_missing, names.join(", "))
}

fn refused(h: &mut String, v: &View) {
    h.push_str("<section><h2>Refused pushes</h2>");
    if v.refused.is_empty() {
        h.push_str("<p>No push refused.</p></section>\n");
        return;
    }
    h.push_str("<table><tr><th>reason</th><th>pushes</th></tr>");
    for (reason, n) in &v.refused {
        let _ = write!(h, "<tr><td>{}</td><td class=\"n\">{n}</td></tr>", escape(reason));
    }
    h.push_str(
        "</table><p class=\"note\">The first push of each reason is said in a <code>problem</code> line of \
         the JSON lines.</p></section>\n",
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::metrics::tests::sample_view;

    #[test]
    fn an_empty_view_renders() {
        let p = render_page(&View::default());
        assert!(p.starts_with("<!DOCTYPE html>") && p.ends_with("</html>\n"), "{p}");
        for said in ["No findings open.", "No window localised yet", "None localised yet.", "No push refused."] {
            assert!(p.contains(said), "{said} in {p}");
        }
    }

    #[test]
    fn findings_render_with_their_evidence_escaped() {
        let p = render_page(&sample_view());
        assert!(p.contains("<td>h1/mlx5_0</td>"), "{p}");
        assert!(p.contains("h1/mlx5_0: 40 of 1000 probes &lt;lost&gt; &amp; &quot;late&quot;"), "{p}");
        assert!(p.contains("<td>tor&quot;2&quot;\\a\nb</td>"), "{p}");
        assert!(p.contains("<td>2023-11-14T22:13:25Z</td>") && p.contains("<td class=\"n\">4.0%</td>"), "{p}");
        assert!(p.contains("title=\"tor3 22:13:30: 40/2000 lost (2.000%)\""), "{p}");
        assert!(p.contains("title=\"tor2 22:13:30: no probes\""), "{p}");
        assert!(p.contains("1: h9/mlx5_0") && p.contains("<td>clock_skew</td>"), "{p}");
        assert!(!p.contains("<lost>"), "{p}");
        assert!(p.contains("<th>switch ports and counters</th>"), "{p}");
        assert!(p.contains("switches corroborated: tor1 h3: out_discards +7 &lt;in&gt; 5 s"), "{p}");
        assert!(p.contains("not answered yet (asked a lookback after its first window)"), "{p}");
        let without = render_page(&View { switch_checks: None, ..sample_view() });
        assert!(!without.contains("switch ports and counters"), "not asked, no column");
    }

    #[test]
    fn nothing_from_the_network_gets_into_the_markup() {
        let mut v = sample_view();
        let evil = "<script>alert('x')</script>\"><img src=x>";
        v.open[0].entity = evil.into();
        v.open[0].evidence = evil.into();
        v.open[0].kind = evil.into();
        v.open[0].switches = Some(evil.into());
        v.tors[0] = evil.into();
        v.windows[1].missing = vec![evil.into()];
        v.refused.insert(evil.into(), 1);
        let p = render_page(&v);
        assert!(!p.contains("<script") && !p.contains("<img"), "{p}");
        assert!(p.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&gt;&lt;img src=x&gt;"), "{p}");
        // Self-contained: nothing to fetch.
        assert!(!p.contains("http://") && !p.contains("https://") && !p.contains("<link"), "{p}");
    }

    #[test]
    fn colours_run_from_green_through_yellow_to_red() {
        assert_eq!(colour(0, 0), NO_PROBES);
        assert_eq!(colour(100, 0), "#1a9850");
        assert_eq!(colour(10_000, 1), "#fee08b", "0.01%: the yellow end");
        assert_eq!(colour(10, 1), "#d73027", "10%: the red end");
        assert_eq!(colour(1, 5), "#d73027", "more lost than sent stays red");
        assert_eq!(colour(100_000, 1), "#fee08b", "below the scale: yellow, not green");
        assert_ne!(colour(1000, 1), colour(100, 1));
    }

    #[test]
    fn a_large_fabric_shows_the_tors_that_lost_the_most() {
        let mut v = sample_view();
        let n = MAX_HEATMAP_TORS + 6;
        v.tors = (0..n).map(|i| format!("tor{i:03}")).collect();
        for w in &mut v.windows {
            w.tor_probes = vec![100; n];
            w.tor_lost = vec![0; n];
        }
        let last = v.windows.len() - 1;
        v.windows[last].tor_lost[n - 1] = 7;
        let p = render_page(&v);
        assert!(p.contains(&format!("{MAX_HEATMAP_TORS} of {n} ToRs shown")), "{p}");
        assert!(p.contains(&format!("<th>tor{:03}</th>", n - 1)), "the one that lost is shown");
        assert!(!p.contains(&format!("<th>tor{:03}</th>", n - 2)), "the rest by name");
        assert_eq!(p.matches(" title=\"").count(), MAX_HEATMAP_TORS * v.windows.len());
    }
}
