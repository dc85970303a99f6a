//! `/metrics`: a [`View`] in the Prometheus text exposition format (version 0.0.4), written by
//! hand (the workspace takes no exporter crate). The series' names and labels are listed in
//! `deploy/README.md`; the `rocemesh-live` alert rules in `deploy/prometheus/` use only these.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use super::view::{HTTP_ERRORS, OpenView, View};

/// The exposition, with a `# HELP` and `# TYPE` line before each family.
pub fn render_metrics(v: &View) -> String {
    let mut m = Prom(String::with_capacity(4096 + 512 * v.open.len()));
    findings(&mut m, v);
    pushes(&mut m, v);
    last_window(&mut m, v);
    state(&mut m, v);
    m.0
}

/// A series per open finding: its name, help, and value.
type FindingFamily = (&'static str, &'static str, fn(&OpenView) -> f64);

fn findings(m: &mut Prom, v: &View) {
    let families: [FindingFamily; 3] = [
        ("rocemesh_live_finding_open", "1 for each finding open now.", |_| 1.0),
        (
            "rocemesh_live_finding_score",
            "The last blaming window's score: the bad share of the probes crossing the entity.",
            |f| f.score,
        ),
        (
            "rocemesh_live_finding_since_timestamp_seconds",
            "Start of the window that first blamed the entity, Unix seconds.",
            |f| secs(f.since_ns),
        ),
    ];
    for (name, help, value) in families {
        m.family(name, "gauge", help);
        for f in &v.open {
            m.sample(name, &[("kind", &f.kind), ("entity", &f.entity)], value(f));
        }
    }
    m.scalar("rocemesh_live_findings_open", "gauge", "Findings open now.", v.open.len() as f64);
}

fn pushes(m: &mut Prom, v: &View) {
    m.scalar("rocemesh_live_pushes_received_total", "counter", "Window-summary pushes received.", v.received as f64);
    m.scalar("rocemesh_live_pushes_taken_total", "counter", "Pushes taken into a window.", v.taken as f64);
    let name = "rocemesh_live_pushes_refused_total";
    m.family(name, "counter", "Pushes refused, by reason (the `problem` lines' reasons).");
    for (reason, n) in &v.refused {
        m.sample(name, &[("reason", reason)], *n as f64);
    }
    if let Some(checks) = &v.switch_checks {
        let name = "rocemesh_live_switch_checks_total";
        let help = "Findings' switch counters asked of Prometheus (--prometheus), by result: a verdict \
                    (corroborated, silent, no_series, no_ports), failed, or dropped (too many waiting).";
        m.family(name, "counter", help);
        for (result, n) in checks {
            m.sample(name, &[("result", result)], *n as f64);
        }
    }
}

/// The newest window localised; nothing before the first (no made-up times).
fn last_window(m: &mut Prom, v: &View) {
    let Some(w) = v.windows.last() else { return };
    let end = secs(w.start_ns.saturating_add(v.window_ns));
    let scalars: [(&str, &str, f64); 7] = [
        ("end_timestamp_seconds", "End of the newest window localised, Unix seconds.", end),
        ("lag_seconds", "How long after its end the newest window was localised.", w.after_end_ms as f64 / 1e3),
        ("localise_seconds", "How long the newest window's localisation took.", w.localise_ms as f64 / 1e3),
        (
            "complete",
            "1 if every RNIC expected pushed all of the newest window, else 0.",
            f64::from(u8::from(w.complete)),
        ),
        ("rnics_heard", "RNICs that pushed some of the newest window.", w.rnics_heard as f64),
        ("rnics_missing", "Expected RNICs that pushed none or part of the newest window.", w.rnics_missing as f64),
        ("probes", "Probes in the newest window.", w.probes as f64),
    ];
    for (suffix, help, value) in scalars {
        m.scalar(&format!("rocemesh_live_last_window_{suffix}"), "gauge", help, value);
    }
}

fn state(m: &mut Prom, v: &View) {
    let gauges: [(&str, &str, f64); 4] = [
        ("rocemesh_live_rnics_known", "RNICs the inventory or a push named.", v.rnics_known as f64),
        ("rocemesh_live_queue_pushes", "Pushes received and waiting to be taken.", v.queued as f64),
        (
            "rocemesh_live_queue_capacity_pushes",
            "Pushes that may wait; beyond it they are refused (overload).",
            v.queue_capacity as f64,
        ),
        (
            "rocemesh_live_started_timestamp_seconds",
            "When the analyzer started, Unix seconds.",
            secs(v.started_unix_ns),
        ),
    ];
    for (name, help, value) in gauges {
        m.scalar(name, "gauge", help, value);
    }
    let lost = "JSON lines that could not be written (a full disk, a closed pipe).";
    m.scalar("rocemesh_live_lines_lost_total", "counter", lost, v.lines_lost as f64);
    let errors =
        "HTTP connections of /metrics and the page that ended in an error (malformed, timed out, refused busy).";
    m.scalar("rocemesh_live_http_errors_total", "counter", errors, HTTP_ERRORS.load(Ordering::Relaxed) as f64);
}

/// Whole seconds exactly (a timestamp's ns do not fit an f64's mantissa), the fraction after.
fn secs(ns: u64) -> f64 {
    (ns / 1_000_000_000) as f64 + (ns % 1_000_000_000) as f64 / 1e9
}

/// The exposition being written.
struct Prom(String);

impl Prom {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {}\n# TYPE {name} {kind}", help_text(help));
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        for (i, (k, v)) in labels.iter().enumerate() {
            self.0.push(if i == 0 { '{' } else { ',' });
            let _ = write!(self.0, "{k}=\"{}\"", label_value(v));
        }
        if !labels.is_empty() {
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", number(value));
    }

    fn scalar(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// A label value as the format quotes it: entity names and reasons come from the network.
fn label_value(s: &str) -> String {
    s.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// HELP text escapes backslash and newline only.
fn help_text(s: &str) -> String {
    s.replace('\\', r"\\").replace('\n', r"\n")
}

/// Rust writes infinities as `inf`; the format wants `+Inf`.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::live::view::WindowView;

    /// Two findings (one with a name that needs escaping), two refusal reasons, two windows.
    pub(in crate::live) fn sample_view() -> View {
        let finding = |kind: &str, entity: &str, since_ns: u64, score: f64| OpenView {
            kind: kind.into(),
            entity: entity.into(),
            since_ns,
            last_blamed_ns: since_ns + 5_000_000_000,
            windows: 2,
            score,
            evidence: format!("{entity}: 40 of 1000 probes <lost> & \"late\""),
            switches: (kind == "rnic").then(|| "switches corroborated: tor1 h3: out_discards +7 <in> 5 s".into()),
        };
        let window = |start_ns: u64, complete: bool| WindowView {
            start_ns,
            complete,
            after_end_ms: 1_500,
            localise_ms: 42,
            rnics_heard: 3,
            rnics_missing: usize::from(!complete),
            missing: if complete { Vec::new() } else { vec!["h9/mlx5_0".into()] },
            probes: 3000,
            tor_probes: vec![1000, 0, 2000],
            tor_lost: vec![0, 0, 40],
            open: 2,
        };
        View {
            started_unix_ns: 1_700_000_000_000_000_000,
            now_unix_ns: 1_700_000_020_000_000_000,
            window_ns: 5_000_000_000,
            deadline_ns: 6_000_000_000,
            open: vec![
                finding("rnic", "h1/mlx5_0", 1_700_000_005_000_000_000, 0.04),
                finding("tor", "tor\"2\"\\a\nb", 1_700_000_010_000_000_000, 0.5),
            ],
            windows: vec![window(1_700_000_005_000_000_000, true), window(1_700_000_010_000_000_000, false)],
            tors: vec!["tor1".into(), "tor2".into(), "tor3".into()],
            rnics_known: 4,
            received: 10,
            taken: 7,
            refused: [("clock_skew".to_owned(), 2), ("replayed".to_owned(), 1)].into_iter().collect(),
            lines_lost: 0,
            queued: 1,
            queue_capacity: 32_768,
            switch_checks: Some([("corroborated".to_owned(), 1), ("failed".to_owned(), 2)].into_iter().collect()),
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no line {prefix} in\n{text}"))
    }

    #[test]
    fn findings_pushes_and_the_last_window_are_series() {
        let t = render_metrics(&sample_view());
        assert_eq!(
            line(&t, r#"rocemesh_live_finding_open{kind="rnic",entity="h1/mlx5_0"}"#).split(' ').nth(1),
            Some("1")
        );
        assert!(t.contains(r#"rocemesh_live_finding_score{kind="rnic",entity="h1/mlx5_0"} 0.04"#), "{t}");
        assert!(t.contains(r#"rocemesh_live_finding_open{kind="tor",entity="tor\"2\"\\a\nb"} 1"#), "escaped: {t}");
        assert!(
            t.contains(r#"rocemesh_live_finding_since_timestamp_seconds{kind="rnic",entity="h1/mlx5_0"} 1700000005"#)
        );
        assert!(t.contains("rocemesh_live_findings_open 2\n"), "{t}");
        assert!(
            t.contains("rocemesh_live_pushes_received_total 10\n")
                && t.contains("rocemesh_live_pushes_taken_total 7\n")
        );
        assert!(t.contains("rocemesh_live_pushes_refused_total{reason=\"clock_skew\"} 2\n"), "{t}");
        assert!(t.contains("rocemesh_live_switch_checks_total{result=\"corroborated\"} 1\n"), "{t}");
        assert!(t.contains("rocemesh_live_switch_checks_total{result=\"failed\"} 2\n"), "{t}");
        let without = render_metrics(&View { switch_checks: None, ..sample_view() });
        assert!(!without.contains("rocemesh_live_switch_checks_total"), "not asked, not rendered");
        assert!(t.contains("rocemesh_live_pushes_refused_total{reason=\"replayed\"} 1\n"), "{t}");
        assert!(t.contains("# TYPE rocemesh_live_pushes_refused_total counter\n"));
        // The newest window (the second): ends at 1_700_000_015 s, incomplete.
        assert!(t.contains("rocemesh_live_last_window_end_timestamp_seconds 1700000015\n"), "{t}");
        assert!(t.contains("rocemesh_live_last_window_lag_seconds 1.5\n"));
        assert!(t.contains("rocemesh_live_last_window_localise_seconds 0.042\n"));
        assert!(t.contains("rocemesh_live_last_window_complete 0\n"));
        assert!(t.contains("rocemesh_live_last_window_rnics_missing 1\n"));
        assert!(t.contains("rocemesh_live_last_window_probes 3000\n"));
        assert!(t.contains("rocemesh_live_queue_capacity_pushes 32768\n"));
        assert!(t.contains("rocemesh_live_started_timestamp_seconds 1700000000\n"));
        assert!(t.contains("rocemesh_live_lines_lost_total 0\n"));
    }

    #[test]
    fn no_window_yet_no_window_series_and_no_findings_no_samples() {
        let t = render_metrics(&View::default());
        assert!(!t.contains("rocemesh_live_last_window"), "{t}");
        assert!(t.contains("# TYPE rocemesh_live_finding_open gauge\n"));
        assert!(!t.contains("rocemesh_live_finding_open{"));
        assert!(t.contains("rocemesh_live_findings_open 0\n"));
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }

    /// `name value` or `name{k="v",...} value`, the value a float the format reads.
    fn parse_sample(l: &str) -> Result<&str, String> {
        let name_end = l.find(['{', ' ']).ok_or("no value")?;
        let name = &l[..name_end];
        let mut ok = !name.is_empty()
            && name
                .chars()
                .enumerate()
                .all(|(i, c)| c == '_' || c == ':' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
        let mut rest = &l[name_end..];
        if let Some(labels) = rest.strip_prefix('{') {
            let mut chars = labels.char_indices();
            let close = loop {
                // A label: name="value", then , or }.
                let key: String = chars.by_ref().take_while(|&(_, c)| c != '=').map(|(_, c)| c).collect();
                ok &= !key.is_empty() && key.chars().all(|c| c == '_' || c.is_ascii_alphanumeric());
                ok &= chars.next().map(|(_, c)| c) == Some('"');
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => ok &= matches!(chars.next(), Some((_, '\\' | '"' | 'n'))),
                        '"' => break,
                        '\n' => ok = false,
                        _ => {}
                    }
                }
                match chars.next() {
                    Some((_, ',')) => {}
                    Some((i, '}')) => break i,
                    _ => return Err(format!("labels not closed: {l}")),
                }
            };
            rest = &labels[close + 1..];
        }
        let value = rest.strip_prefix(' ').ok_or("no space before the value")?;
        ok &= matches!(value, "NaN" | "+Inf" | "-Inf") || value.parse::<f64>().is_ok();
        if ok { Ok(name) } else { Err(format!("malformed: {l}")) }
    }

    #[test]
    fn every_line_is_a_comment_or_a_sample_of_a_declared_family() {
        let t = render_metrics(&sample_view());
        let mut declared = std::collections::HashSet::new();
        for l in t.lines() {
            if let Some(decl) = l.strip_prefix("# TYPE ") {
                let (name, kind) = decl.split_once(' ').expect("name and type");
                assert!(matches!(kind, "gauge" | "counter"), "{l}");
                assert!(declared.insert(name.to_owned()), "{name} declared twice");
                continue;
            }
            if l.starts_with("# HELP ") {
                continue;
            }
            let name = parse_sample(l).unwrap_or_else(|e| panic!("{e}"));
            assert!(declared.contains(name), "{name} has no # TYPE before it");
            if name.ends_with("_total") {
                assert!(t.contains(&format!("# TYPE {name} counter\n")), "{name} is a counter");
            }
        }
        assert!(declared.len() >= 20, "{declared:?}");
        assert!(parse_sample(r#"x{a="b\"c"} 1"#).is_ok() && parse_sample(r#"x{a="b"c"} 1"#).is_err());
        assert!(parse_sample("x 1 2").is_err() && parse_sample("x{a=\"b\"}1").is_err());
    }

    /// The rules file's `rocemesh_live_*` names are all rendered (agent/tests/dashboard.rs checks
    /// the agent's names the same way).
    #[test]
    fn every_live_alert_rule_queries_a_rendered_family() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/rocemesh-alerts.yml");
        let rules = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let t = render_metrics(&sample_view());
        let mut used = 0;
        for (at, _) in rules.match_indices("rocemesh_live_") {
            let name: String = rules[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            assert!(t.contains(&format!("# TYPE {name} ")), "{path} uses {name}, which /metrics does not have");
            used += 1;
        }
        assert!(used >= 6, "{path}: only {used} rocemesh_live_ names");
    }
}
