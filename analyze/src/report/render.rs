//! The report's renderings: the polars frame of its rows ([`frame`]), then a table for a
//! terminal, JSON, CSV or Parquet ([`write`]); delays in µs in the table, ns elsewhere.

use super::{ReportError, Row, ServiceColumns};
use crate::probe::{Scope, Sla, Violation};
use polars::prelude::*;
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

/// How to print a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for a terminal, delays in µs.
    Table,
    /// One JSON document: parameters and rows, delays in ns.
    Json,
    /// CSV with a header line, delays in ns.
    Csv,
    /// A Parquet file (needs --output), delays in ns.
    Parquet,
}

/// What a rendered report says about itself.
#[derive(Clone, Debug, Serialize)]
pub struct Meta {
    /// Window length, s.
    pub window_s: u64,
    /// Thresholds applied.
    pub sla: Sla,
    /// Segment files looked at.
    pub files: usize,
    /// Records read.
    pub records: usize,
    /// Files skipped or read with damage, one line each.
    pub problems: Vec<String>,
    /// Scopes reported (the `service` scope adds the connection's columns to CSV and Parquet).
    pub scopes: Vec<Scope>,
}

/// The rows as a DataFrame (the CSV and Parquet schema); `service_columns` appends the
/// [`ServiceColumns`] (null in rows of other scopes).
pub fn frame(rows: &[Row], service_columns: bool) -> PolarsResult<DataFrame> {
    let u = |name: &str, f: fn(&Row) -> u64| {
        UInt64Chunked::from_vec(name.into(), rows.iter().map(f).collect()).into_column()
    };
    let q = |name: &str, f: fn(&Row) -> Option<i64>| {
        Int64Chunked::from_iter_options(name.into(), rows.iter().map(f)).into_column()
    };
    let s = |name: &str, v: Vec<String>| StringChunked::from_iter_values(name.into(), v.into_iter()).into_column();
    let mut columns = vec![
        u("window_start_ns", |r| r.window_start_ns),
        s("window_start", rows.iter().map(|r| r.window_start.clone()).collect()),
        s("scope", rows.iter().map(|r| r.scope.name().to_owned()).collect()),
        s("entity", rows.iter().map(|r| r.entity.clone()).collect()),
        u("probes", |r| r.probes),
        u("ok", |r| r.ok),
        u("lost", |r| r.lost),
        u("partial", |r| r.partial),
        u("invalid", |r| r.invalid),
        u("refused", |r| r.refused),
        u("unreachable", |r| r.unreachable),
        Float64Chunked::from_iter_options("loss_ratio".into(), rows.iter().map(|r| r.loss_ratio)).into_column(),
        q("rtt_ns_p50", |r| r.rtt_ns_p50),
        q("rtt_ns_p99", |r| r.rtt_ns_p99),
        q("rtt_ns_p999", |r| r.rtt_ns_p999),
        q("prober_delay_ns_p50", |r| r.prober_delay_ns_p50),
        q("prober_delay_ns_p99", |r| r.prober_delay_ns_p99),
        q("responder_delay_ns_p50", |r| r.responder_delay_ns_p50),
        q("responder_delay_ns_p99", |r| r.responder_delay_ns_p99),
        s("sla_violations", rows.iter().map(|r| violations_text(&r.sla_violations)).collect()),
        // Added after the original columns, so positional readers keep theirs.
        u("local_drop", |r| r.local_drop),
        StringChunked::from_iter_options("ts_source".into(), rows.iter().map(|r| r.ts_source.as_deref())).into_column(),
    ];
    if service_columns {
        let text = |name: &str, f: fn(&ServiceColumns) -> &str| {
            StringChunked::from_iter_options(name.into(), rows.iter().map(|r| r.service.as_ref().map(f))).into_column()
        };
        let number = |name: &str, f: fn(&ServiceColumns) -> u32| {
            UInt32Chunked::from_iter_options(name.into(), rows.iter().map(|r| r.service.as_ref().map(f))).into_column()
        };
        columns.extend([
            text("service", |s| &s.service),
            text("prober", |s| &s.prober),
            text("remote", |s| &s.remote),
            text("remote_resolution", |s| s.remote_resolution),
            number("pid", |s| s.pid),
            text("comm", |s| &s.comm),
            number("local_qpn", |s| s.local_qpn),
            number("remote_qpn", |s| s.remote_qpn),
            number("flow_label", |s| s.flow_label),
        ]);
    }
    DataFrame::new(rows.len(), columns)
}

pub(super) fn violations_text(v: &[Violation]) -> String {
    v.iter().map(|v| v.name()).collect::<Vec<_>>().join(";")
}

/// Writes `rows` in `format` to `output` (standard output when `None`; Parquet needs a file).
pub fn write(rows: &[Row], meta: &Meta, format: Format, output: Option<&Path>) -> Result<(), ReportError> {
    let create = |p: &Path| {
        std::fs::File::create(p).map_err(|source| ReportError::Io {
            path: p.to_owned(),
            what: "create the report file",
            source,
        })
    };
    let mut sink: Box<dyn std::io::Write> = match output {
        Some(p) => Box::new(std::io::BufWriter::new(create(p)?)),
        None if format == Format::Parquet => {
            return Err(ReportError::Usage("--format parquet needs --output FILE".into()));
        }
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let service_columns = meta.scopes.contains(&Scope::Service);
    match format {
        Format::Table => sink.write_all(table(rows, meta).as_bytes())?,
        Format::Json => {
            serde_json::to_writer_pretty(&mut sink, &serde_json::json!({ "meta": meta, "rows": rows }))?;
            sink.write_all(b"\n")?;
        }
        Format::Csv => CsvWriter::new(&mut sink).finish(&mut frame(rows, service_columns)?)?,
        Format::Parquet => {
            ParquetWriter::new(&mut sink).finish(&mut frame(rows, service_columns)?)?;
        }
    }
    sink.flush()?;
    Ok(())
}

pub(super) fn us(ns: Option<i64>) -> String {
    ns.map_or_else(|| "-".into(), |v| format!("{:.1}", v as f64 / 1e3))
}

/// The operator's view: SLA violations first, delays in µs, loss in %.
pub fn table(rows: &[Row], meta: &Meta) -> String {
    let mut s = String::new();
    let violating = rows.iter().filter(|r| !r.sla_violations.is_empty()).count();
    let _ = writeln!(
        s,
        "{} records from {} files, windows of {} s, delays in µs; SLA: loss <= {}%, RTT p99 <= {} µs; {violating} of {} rows violate it{}",
        meta.records,
        meta.files,
        meta.window_s,
        meta.sla.loss_ratio * 100.0,
        meta.sla.rtt_p99_us,
        rows.len(),
        if meta.problems.is_empty() {
            String::new()
        } else {
            format!("; {} input problems (stderr)", meta.problems.len())
        }
    );
    let entity_width = rows.iter().map(|r| r.entity.chars().count()).max().unwrap_or(6).clamp(6, 60);
    let ts_width = rows.iter().filter_map(|r| r.ts_source.as_ref().map(String::len)).max().unwrap_or(9).max(9);
    let _ = writeln!(
        s,
        "{:<20} {:<8} {:<entity_width$} {:>10} {:>10} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  {:<ts_width$}  SLA",
        "window (UTC)",
        "scope",
        "entity",
        "probes",
        "ok",
        "lost",
        "partial",
        "invalid",
        "refused",
        "local",
        "unreach",
        "loss %",
        "rtt p50",
        "rtt p99",
        "p99.9",
        "prb p50",
        "prb p99",
        "rsp p50",
        "rsp p99",
        "ts source",
    );
    for r in rows {
        let loss = r.loss_ratio.map_or_else(|| "-".into(), |l| format!("{:.3}", l * 100.0));
        let sla = r
            .sla_violations
            .iter()
            .map(|v| match v {
                Violation::Loss => format!("LOSS > {}%", meta.sla.loss_ratio * 100.0),
                Violation::RttP99 => format!("RTT p99 > {} µs", meta.sla.rtt_p99_us),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "{:<20} {:<8} {:<entity_width$} {:>10} {:>10} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  {:<ts_width$}  {}",
            r.window_start,
            r.scope.name(),
            r.entity,
            r.probes,
            r.ok,
            r.lost,
            r.partial,
            r.invalid,
            r.refused,
            r.local_drop,
            r.unreachable,
            loss,
            us(r.rtt_ns_p50),
            us(r.rtt_ns_p99),
            us(r.rtt_ns_p999),
            us(r.prober_delay_ns_p50),
            us(r.prober_delay_ns_p99),
            us(r.responder_delay_ns_p50),
            us(r.responder_delay_ns_p99),
            r.ts_source.as_deref().unwrap_or("-"),
            sla,
        );
    }
    s
}
