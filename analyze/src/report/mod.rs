//! `analyze report`: SLA figures per time window and per scope over the ingested probe table
//! (pair counts and exact quantiles in plain Rust, roll-ups and joins in polars), and their
//! renderings (table, JSON, CSV, Parquet).
//!
//! What a record counts as (ok, lost, partial, invalid, refused, local_drop, unknown), the
//! unreachable rule, the loss ratio, the scopes and the SLA test are [`crate::probe`]'s; this
//! module counts by them:
//!
//! - window = floor(t1_unix_ns / window_ns), aligned on the wall clock.
//! - counts are summed from the per-window pair counts, so the unreachable rule is applied per
//!   pair before any roll-up. Local drops have their own column (`local_drop`) and, like
//!   refused and invalid probes, stay out of the loss ratio. Outcome bytes this build does not
//!   know count in `probes` only ([`Prepared::unknown_outcomes`] says how many).
//! - delay quantiles are over ok records only, nearest rank: the value at 1-based rank
//!   ceil(q * n) of the sorted samples ([`crate::quantile::nearest_rank_index`]; polars' `Equiprobable`, which is
//!   also DuckDB's `quantile_disc`).
//! - each row's `ts_source` names the timestamp sources its quantiles came from
//!   ([`crate::probe::TsSources::label`]: `kernel_software`, or `mixed(host_poll+kernel_software)`
//!   when samples of several sources were pooled; null without ok samples). Samples are not
//!   split by source: the label says when they were pooled, so no mix goes unseen. The set is a
//!   bitmask ORed per pair while pairs are counted (no lookup per record), then per scope key.
//!
//! Scopes: `pair` (prober -> target), `rnic` (every record where the RNIC is the prober or the
//! target, a self-probe once: a broken RNIC hurts both directions), `tor` (every record whose
//! prober or target hangs off the ToR, a ToR-local record once), `tor_pair` (prober's ToR ->
//! target's ToR) and `cluster`; quantiles come from the ok records of the scope's entity
//! directly. A service probe (a traced connection's, see [`crate::ingest::Service`]) counts in
//! those scopes at its remote RNIC, like any probe to that RNIC.
//!
//! The `service` scope has one row per (window, traced connection) over that connection's own
//! probes, with the same counts and quantiles; the unreachable rule applies per (window,
//! connection), which is one prober, one target and one flow label. Its `entity` is a readable
//! label (`ib_write_bw[4242] qp 17->18 tor0-h0/rxe0->tor1-h0/rxe0`) and its rows carry the
//! connection's fields ([`ServiceColumns`]). Service probes are few (a bounded rate per
//! connection), so they are gathered and counted directly rather than through the pair table.
//!
//! Output columns (CSV and Parquet, in this order; JSON has the same names): window_start_ns,
//! window_start, scope, entity, probes, ok, lost, partial, invalid, refused, unreachable,
//! loss_ratio, the seven quantiles, sla_violations, then local_drop and ts_source (added last, so
//! positional readers of earlier reports keep their columns); when the `service` scope is
//! reported, then service, prober, remote, remote_resolution, pid, comm, local_qpn, remote_qpn,
//! flow_label (null in rows of other scopes; JSON has them in service rows only).

mod pairs;
mod render;
mod samples;
#[cfg(test)]
mod tests;

use crate::ingest::{Fields, NO_SERVICE, NO_TOR, Probes, Rnic, Service, UNKNOWN_RNIC};
use crate::inspect::utc;
use crate::probe::{Class, SlaError, TsSources};
use crate::quantile::select_ranks;
use pairs::{KeySpace, PairTable, TS_SLOT, counts_of, packed, pair_counts};
use polars::prelude::*;
use rayon::prelude::*;
pub use render::{Format, Meta, frame, table, write};
use samples::PairSamples;
use serde::Serialize;
use std::path::PathBuf;

pub use crate::probe::{DEFAULT_SCOPES, Scope, Sla, Violation};

/// Everything that can go wrong computing or writing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// polars refused a query or a write.
    #[error("polars: {0}")]
    Polars(#[from] PolarsError),
    /// A file could not be read or written.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Writing to standard output failed (closed pipe, full disk).
    #[error("writing the report: {0}")]
    Output(#[from] std::io::Error),
    /// The SLA configuration file is not valid.
    #[error(transparent)]
    Sla(#[from] SlaError),
    /// The probe columns handed over differ in length (a caller's bug, or columns left out).
    #[error("probe columns differ in length: {0}")]
    Columns(String),
    /// An option is out of range.
    #[error("{0}")]
    Usage(String),
    /// JSON serialisation failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// One line of the report: one scope entity in one window (or over the whole range).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Start of the window, Unix ns (for a whole-range row: of the first window).
    pub window_start_ns: u64,
    /// The same, as RFC 3339 UTC.
    pub window_start: String,
    /// What the row aggregates over.
    pub scope: Scope,
    /// `cluster`, a ToR, an RNIC, or `from->to` for the pair scopes.
    pub entity: String,
    /// For `pair` and `tor_pair`: the two ends of `entity`.
    #[serde(skip)]
    pub ends: Option<(String, String)>,
    /// Every record.
    pub probes: u64,
    /// Outcome ok.
    pub ok: u64,
    /// Lost before ACK1, outside unreachable pairs.
    pub lost: u64,
    /// Only ACK2 missing.
    pub partial: u64,
    /// Implausible timestamps.
    pub invalid: u64,
    /// Refused by the peer's host (agent down).
    pub refused: u64,
    /// Never left the prober's host (a local reason): neither loss nor a sample.
    pub local_drop: u64,
    /// Lost probes of pairs that had nothing but losses in the window (dead peer).
    pub unreachable: u64,
    /// lost / (ok + partial + lost); `None` when that is 0.
    pub loss_ratio: Option<f64>,
    /// Network RTT quantiles over ok records, ns.
    pub rtt_ns_p50: Option<i64>,
    /// See `rtt_ns_p50`.
    pub rtt_ns_p99: Option<i64>,
    /// See `rtt_ns_p50`.
    pub rtt_ns_p999: Option<i64>,
    /// Prober host delay quantiles over ok records, ns.
    pub prober_delay_ns_p50: Option<i64>,
    /// See `prober_delay_ns_p50`.
    pub prober_delay_ns_p99: Option<i64>,
    /// Responder host delay quantiles over ok records, ns.
    pub responder_delay_ns_p50: Option<i64>,
    /// See `responder_delay_ns_p50`.
    pub responder_delay_ns_p99: Option<i64>,
    /// Timestamp sources of the quantiles' samples: one name (`kernel_software`) or
    /// `mixed(a+b)`; `None` without ok samples.
    pub ts_source: Option<String>,
    /// Thresholds broken, empty when within the SLA.
    pub sla_violations: Vec<Violation>,
    /// For the `service` scope: which connection.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceColumns>,
}

/// The identifying columns of a `service` row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceColumns {
    /// The connection's dictionary name.
    pub service: String,
    /// The RNIC that probes it (the connection's local end).
    pub prober: String,
    /// The remote RNIC its probes reach.
    pub remote: String,
    /// How `remote` was found: agent, inventory, dictionary or unresolved.
    pub remote_resolution: &'static str,
    /// Process that owns the QP.
    pub pid: u32,
    /// Its command.
    pub comm: String,
    /// Local QP number.
    pub local_qpn: u32,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// The connection's flow label (its probes carry it).
    pub flow_label: u32,
}

impl ServiceColumns {
    /// The columns of `s` with names from `rnics`.
    pub fn of(s: &Service, rnics: &[Rnic]) -> ServiceColumns {
        let name = |id: u32| rnics.get(id as usize).map_or(UNKNOWN_RNIC, |r| r.name.as_str()).to_owned();
        ServiceColumns {
            service: s.name.clone(),
            prober: name(s.prober),
            remote: name(s.remote),
            remote_resolution: s.resolution.name(),
            pid: s.conn.pid,
            comm: s.conn.comm.clone(),
            local_qpn: s.conn.local_qpn,
            remote_qpn: s.conn.remote_qpn,
            flow_label: s.conn.flow_label,
        }
    }
}

/// The [`QUANTILES`] of one key's samples: each delay column given as the pieces it lies in.
fn select_quantiles([rtt, pd, rd]: [&[&[i32]]; 3]) -> [i32; QUANTILES.len()] {
    let [r50, r99, r999] = select_ranks(rtt, [0.5, 0.99, 0.999]);
    let [p50, p99, _] = select_ranks(pd, [0.5, 0.99, 0.99]);
    let [d50, d99, _] = select_ranks(rd, [0.5, 0.99, 0.99]);
    [r50, r99, r999, p50, p99, d50, d99]
}

/// The frame of [`QUANTILES`] by key, from per-thread parts in ascending key order.
fn quantile_frame(parts: Vec<(Vec<u64>, Vec<[i32; QUANTILES.len()]>)>) -> PolarsResult<DataFrame> {
    let rows: usize = parts.iter().map(|p| p.0.len()).sum();
    let mut key = Vec::with_capacity(rows);
    let mut columns: Vec<Vec<i64>> = (0..QUANTILES.len()).map(|_| Vec::with_capacity(rows)).collect();
    for (k, q) in parts {
        key.extend(k);
        for row in q {
            for (c, v) in columns.iter_mut().zip(row) {
                c.push(i64::from(v));
            }
        }
    }
    let mut out = vec![UInt64Chunked::from_vec("key".into(), key).into_column()];
    for ((_, name, _), v) in QUANTILES.iter().zip(columns) {
        out.push(Int64Chunked::from_vec((*name).into(), v).into_column());
    }
    DataFrame::new(rows, out)
}

/// (source column, output column, quantile).
const QUANTILES: [(&str, &str, f64); 7] = [
    ("network_rtt_ns", "rtt_ns_p50", 0.5),
    ("network_rtt_ns", "rtt_ns_p99", 0.99),
    ("network_rtt_ns", "rtt_ns_p999", 0.999),
    ("prober_delay_ns", "prober_delay_ns_p50", 0.5),
    ("prober_delay_ns", "prober_delay_ns_p99", 0.99),
    ("responder_delay_ns", "responder_delay_ns_p50", 0.5),
    ("responder_delay_ns", "responder_delay_ns_p99", 0.99),
];

/// Counted columns of the pair-count table, summed by every scope; the `C_*` constants index it.
const COUNTS: [&str; 8] = ["probes", "ok", "lost", "partial", "invalid", "refused", "unreachable", "local_drop"];
const C_PROBES: usize = 0;
const C_OK: usize = 1;
const C_LOST: usize = 2;
const C_PARTIAL: usize = 3;
const C_INVALID: usize = 4;
const C_REFUSED: usize = 5;
const C_UNREACHABLE: usize = 6;
const C_LOCAL_DROP: usize = 7;

/// The probe table reduced to what reports need: per-window pair counts, and per record its
/// class, window index, ends and delays.
///
/// Every group-by runs on one integer key that packs the window's index with the entity's ids
/// (see `KeySpace`): polars groups a single integer column several times faster than a
/// multi-column key, which it row-encodes and hashes as bytes (measured: 0.77 s against 0.07 s
/// for the pair counts of 10^7 records, when polars still counted them), and the plain-Rust
/// passes index their tables with it.
#[derive(Debug)]
pub struct Prepared {
    /// Window length, ns.
    pub window_ns: u64,
    /// First and last window index (floor(t1 / window_ns)); `None` without records.
    pub windows: Option<(u64, u64)>,
    /// Records read.
    pub records: usize,
    /// RNIC names by fleet id; the last one stands for ids no dictionary defined.
    pub rnic_names: Vec<String>,
    /// ToR names by ToR id.
    pub tor_names: Vec<String>,
    /// The windows that hold records, ascending: a window's dense index `d` is its position.
    window_list: Vec<u64>,
    keys: KeySpace,
    /// d, prober, target (u32), then [`COUNTS`] (u64), then `ts_mask` (u8: the
    /// [`TsSources`] of the pair's ok samples).
    pair_counts: DataFrame,
    /// Records whose outcome byte this build does not know (counted in `probes` only).
    pub unknown_outcomes: u64,
    /// class, d, prober, target and the three delays of every record.
    base: DataFrame,
    /// ToR id by RNIC id (the unknown RNIC's is the "no ToR" one).
    rnic_tor: Vec<u32>,
    /// Service id of every record ([`Probes::service`]; empty when none is a service probe).
    service: Vec<u32>,
    /// Label and columns of each service, by service id.
    services: Vec<(String, ServiceColumns)>,
}

/// The outputs' row order: violations first, then by window, scope and entity (one row per
/// those three, so rows computed apart sort into the order computed together).
pub fn sort_rows(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        // `false < true`: rows with violations sort first.
        a.sla_violations
            .is_empty()
            .cmp(&b.sla_violations.is_empty())
            .then(a.window_start_ns.cmp(&b.window_start_ns))
            .then(a.scope.cmp(&b.scope))
            .then_with(|| a.entity.cmp(&b.entity))
    });
}

/// Reduces the probe columns (moved in, and reused in place: at 10^8 records every extra
/// column costs hundreds of MiB) to [`Prepared`]. Service probes count at their remote RNIC;
/// the `service` scope needs [`prepare_with`].
pub fn prepare(probes: Probes, rnics: &[Rnic], window_ns: u64) -> Result<Prepared, ReportError> {
    prepare_with(probes, rnics, &[], window_ns)
}

/// [`prepare`], with the traced connections ([`crate::ingest::Dataset::services`]) that the
/// `service` scope's rows name.
pub fn prepare_with(
    probes: Probes,
    rnics: &[Rnic],
    services: &[Service],
    window_ns: u64,
) -> Result<Prepared, ReportError> {
    if window_ns == 0 {
        return Err(ReportError::Usage("the window must be at least 1 s".into()));
    }
    let records = probes.len();
    let mut tor_names: Vec<String> = Vec::new();
    let mut tor_ids = std::collections::HashMap::new();
    let mut tor_of = |name: &str| -> u32 {
        let name = if name.is_empty() { NO_TOR } else { name };
        *tor_ids.entry(name.to_owned()).or_insert_with(|| {
            tor_names.push(name.to_owned());
            tor_names.len() as u32 - 1
        })
    };
    let mut rnic_tor: Vec<u32> = rnics.iter().map(|r| tor_of(&r.tor)).collect();
    rnic_tor.push(tor_of(NO_TOR));
    let mut rnic_names: Vec<String> = rnics.iter().map(|r| r.name.clone()).collect();
    rnic_names.push(UNKNOWN_RNIC.to_owned());
    let unknown = rnics.len() as u32;
    let keys = KeySpace { rnics: rnic_names.len() as u64, tors: tor_names.len() as u64 };

    if let Some((name, len)) = probes.uneven_column(Fields::Report) {
        return Err(ReportError::Columns(format!("{name} has {len} values for {records} records")));
    }
    let Probes {
        t1_unix_ns: mut window,
        network_rtt_ns,
        prober_delay_ns,
        responder_delay_ns,
        mut prober,
        mut target,
        flow_label,
        responder_epoch,
        kind,
        outcome: mut class,
        arrived,
        ts_source,
        service,
        index,
    } = probes;
    // Reports do not use these (ingest leaves them empty for `analyze report`).
    drop((flow_label, responder_epoch, kind, index));
    const BLOCK: usize = 1 << 16;
    // Pass 1: window (in place of t1), class and timestamp source (packed in place of the
    // outcome), ids clamped to the known ones (ToRs are looked up from them where a key needs
    // one). Records of one file are in time order, so consecutive records mostly share a
    // window: a range check replaces the 64-bit division, and only run starts are collected as
    // windows.
    let window_runs: Vec<Vec<u64>> = window
        .par_chunks_mut(BLOCK)
        .zip(class.par_chunks_mut(BLOCK))
        .zip(arrived.par_chunks(BLOCK))
        .zip(ts_source.par_chunks(BLOCK))
        .zip(prober.par_chunks_mut(BLOCK))
        .zip(target.par_chunks_mut(BLOCK))
        .map(|(((((t, c), a), ts), p), g)| {
            let (mut lo, mut hi, mut w) = (1u64, 0u64, 0u64);
            let mut runs = Vec::new();
            for i in 0..t.len() {
                if t[i] < lo || t[i] >= hi {
                    w = t[i] / window_ns;
                    lo = w * window_ns;
                    hi = lo.saturating_add(window_ns);
                    runs.push(w);
                }
                t[i] = w;
                c[i] = packed::pack(Class::of(c[i], a[i]), ts[i]);
                p[i] = p[i].min(unknown);
                g[i] = g[i].min(unknown);
            }
            runs.sort_unstable();
            runs.dedup();
            runs
        })
        .collect();
    drop((arrived, ts_source));
    let mut window_list: Vec<u64> = window_runs.into_iter().flatten().collect();
    window_list.sort_unstable();
    window_list.dedup();
    let (r, windows) = (keys.rnics, window_list.len() as u64);
    if windows.checked_mul(r).and_then(|x| x.checked_mul(r)).and_then(|x| x.checked_mul(8)).is_none() {
        return Err(ReportError::Usage(format!(
            "{windows} windows x {r}^2 RNIC pairs do not fit one 64-bit group key: report a shorter time range or use a longer --window-s"
        )));
    }
    // Pass 2: the dense window index, and the records per (window, prober, target, class),
    // counted in a table per block range: a block's records come from one or two files, so
    // from one prober and its few dozen targets, and the table's live entries stay in cache
    // (polars' group-by on a 64-bit key column took 4x as long and 8 bytes more per record).
    let mut dense = crate::ingest::filled(records, 0u32);
    let blocks = records.div_ceil(BLOCK);
    let min_len = (blocks / (4 * rayon::current_num_threads().max(1))).max(1);
    let pair_table = dense
        .par_chunks_mut(BLOCK)
        .zip(window.par_chunks(BLOCK))
        .zip(class.par_chunks(BLOCK))
        .zip(prober.par_chunks(BLOCK))
        .zip(target.par_chunks(BLOCK))
        .with_min_len(min_len)
        .fold(PairTable::default, |mut table, ((((d, w), c), p), g)| {
            let (mut last, mut at) = (u64::MAX, 0u64);
            // Direct-mapped in front of the table: a block's live pairs (one prober's targets
            // in one window) mostly differ in their low key bits, so they rarely evict each other.
            let mut recent = [(PairTable::EMPTY, [0u64; 8]); 64];
            for i in 0..w.len() {
                if w[i] != last {
                    last = w[i];
                    at = window_list.binary_search(&last).unwrap_or(0) as u64;
                }
                d[i] = at as u32;
                let key = keys.pair(at, p[i], g[i]);
                let slot = &mut recent[(key & 63) as usize];
                if slot.0 != key {
                    if slot.0 != PairTable::EMPTY {
                        table.add_counts(slot.0, &slot.1);
                    }
                    *slot = (key, [0; 8]);
                }
                slot.1[usize::from(packed::class(c[i]))] += 1;
                slot.1[TS_SLOT] |= packed::sample_ts_bit(c[i]);
            }
            for (key, counts) in recent {
                if key != PairTable::EMPTY {
                    table.add_counts(key, &counts);
                }
            }
            table
        })
        .reduce(PairTable::default, PairTable::merge);
    drop(window);
    let (pair_counts, unknown_outcomes) = pair_counts(pair_table, keys)?;

    let base = DataFrame::new(
        records,
        vec![
            UInt8Chunked::from_vec("class".into(), class).into_column(),
            UInt32Chunked::from_vec("d".into(), dense).into_column(),
            UInt32Chunked::from_vec("prober".into(), prober).into_column(),
            UInt32Chunked::from_vec("target".into(), target).into_column(),
            Int32Chunked::from_vec("network_rtt_ns".into(), network_rtt_ns).into_column(),
            Int32Chunked::from_vec("prober_delay_ns".into(), prober_delay_ns).into_column(),
            Int32Chunked::from_vec("responder_delay_ns".into(), responder_delay_ns).into_column(),
        ],
    )?;
    let windows = window_list.first().copied().zip(window_list.last().copied());
    Ok(Prepared {
        window_ns,
        windows,
        records,
        rnic_names,
        tor_names,
        window_list,
        keys,
        pair_counts,
        unknown_outcomes,
        base,
        rnic_tor,
        service,
        services: services.iter().map(|s| (s.label(rnics), ServiceColumns::of(s, rnics))).collect(),
    })
}

/// How [`Prepared::rows_with`] computes the quantile columns.
#[derive(Clone, Copy)]
enum QuantilesBy {
    /// Selected from the samples laid out by pair ([`PairSamples`]): what ships.
    PairLayout,
    /// polars' own quantile over a hashed group-by: the reference the tests hold it to.
    #[cfg(test)]
    Hashed,
}

/// Whether rows are per window or over the whole range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// One row per window and entity.
    PerWindow,
    /// One row per entity over every window (counts still classified per window).
    WholeRange,
}

/// The base columns as slices (each a single chunk: built from vectors in [`prepare`]).
struct Columns<'a> {
    class: &'a [u8],
    d: &'a [u32],
    prober: &'a [u32],
    target: &'a [u32],
    delays: [&'a [i32]; 3],
}

const DELAYS: [&str; 3] = ["network_rtt_ns", "prober_delay_ns", "responder_delay_ns"];

impl Prepared {
    /// The rows of `scopes` over `span`, SLA violations first, then by window, scope and entity.
    pub fn rows(&self, scopes: &[Scope], span: Span, sla: &Sla) -> Result<Vec<Row>, ReportError> {
        self.rows_with(scopes, span, sla, QuantilesBy::PairLayout)
    }

    /// [`Prepared::rows`], with the quantiles computed `by`.
    fn rows_with(&self, scopes: &[Scope], span: Span, sla: &Sla, by: QuantilesBy) -> Result<Vec<Row>, ReportError> {
        if self.window_list.is_empty() {
            return Ok(Vec::new());
        }
        let whole = span == Span::WholeRange;
        let mut scopes = scopes.to_vec();
        scopes.sort();
        scopes.dedup();
        let mut rows = Vec::new();
        // Laid out once, for the first scope that needs it: every scope selects from it, and the
        // last one lets it go before its join.
        let mut laid_out: Option<PairSamples> = None;
        let last = scopes.iter().rposition(|s| *s != Scope::Service);
        for (i, scope) in scopes.into_iter().enumerate() {
            if scope == Scope::Service {
                self.service_rows(whole, sla, &mut rows)?;
                continue;
            }
            let keys = self.pair_scope_keys(scope, whole)?;
            let (counts, ts_masks) = self.count_input(&keys)?;
            let counts =
                counts.lazy().group_by([col("key")]).agg(COUNTS.iter().map(|c| col(*c).sum()).collect::<Vec<_>>());
            let quantiles = match by {
                QuantilesBy::PairLayout => {
                    let samples = match laid_out {
                        Some(ref s) => s,
                        None => laid_out.insert(self.lay_out()?),
                    };
                    let parts = samples.quantiles(&keys);
                    if Some(i) == last {
                        laid_out = None;
                    }
                    quantile_frame(parts)?
                }
                #[cfg(test)]
                QuantilesBy::Hashed => tests::quantiles_hashed(self, scope, whole)?,
            };
            let df =
                counts.join(quantiles.lazy(), [col("key")], [col("key")], JoinArgs::new(JoinType::Left)).collect()?;
            self.collect_rows(scope, &df, &ts_masks, sla, &mut rows)?;
        }
        sort_rows(&mut rows);
        Ok(rows)
    }

    /// The (window, prober, target) of every pair of the pair-count table, in its order.
    fn pair_ids(&self) -> PolarsResult<[Vec<u32>; 3]> {
        let ids = |name: &str| -> PolarsResult<Vec<u32>> {
            Ok(self.pair_counts.column(name)?.u32()?.iter().map(|v| v.unwrap_or(0)).collect())
        };
        Ok([ids("d")?, ids("prober")?, ids("target")?])
    }

    /// The ok samples laid out by pair ([`PairSamples`]).
    fn lay_out(&self) -> PolarsResult<PairSamples> {
        let [d, p, g] = self.pair_ids()?;
        let pair_keys: Vec<u64> = (0..d.len()).map(|i| self.keys.pair(u64::from(d[i]), p[i], g[i])).collect();
        Ok(PairSamples::lay_out(&self.columns()?, &pair_keys, self.keys))
    }

    /// Each pair's keys in `scope` ([`KeySpace::keys`]), in the pair-count table's order.
    fn pair_scope_keys(&self, scope: Scope, whole: bool) -> PolarsResult<Vec<(u64, Option<u64>)>> {
        let [d, p, g] = self.pair_ids()?;
        Ok((0..d.len())
            .map(|i| {
                let w = if whole { 0 } else { u64::from(d[i]) };
                self.keys.keys(scope, w, p[i], g[i], &self.rnic_tor)
            })
            .collect())
    }

    /// The per-window pair counts under each pair's `keys` in a scope ([`Prepared::pair_scope_keys`];
    /// small: one row per pair, window and end), and the timestamp sources of each key's ok
    /// samples, ascending by key. polars sums the counts; the sources are ORed here, as this
    /// build of polars has no bitwise aggregation.
    fn count_input(&self, keys: &[(u64, Option<u64>)]) -> PolarsResult<(DataFrame, Vec<(u64, TsSources)>)> {
        let pc = &self.pair_counts;
        let ts_mask: Vec<u8> = pc.column("ts_mask")?.u8()?.iter().map(|v| v.unwrap_or(0)).collect();
        let mut masks: Vec<(u64, TsSources)> = Vec::new();
        let counts: Vec<Vec<u64>> = COUNTS
            .iter()
            .map(|c| Ok(pc.column(c)?.u64()?.iter().map(|v| v.unwrap_or(0)).collect()))
            .collect::<PolarsResult<_>>()?;
        let (mut key, mut rows) = (Vec::with_capacity(pc.height()), Vec::with_capacity(pc.height()));
        for (i, &(a, b)) in keys.iter().enumerate() {
            for k in std::iter::once(a).chain(b) {
                key.push(k);
                rows.push(i as IdxSize);
                if ts_mask[i] != 0 {
                    masks.push((k, TsSources(ts_mask[i])));
                }
            }
        }
        masks.sort_unstable_by_key(|m| m.0);
        masks.dedup_by(|next, kept| {
            let same = next.0 == kept.0;
            if same {
                kept.1 = TsSources(kept.1.0 | next.1.0);
            }
            same
        });
        let rows = IdxCa::from_vec("rows".into(), rows);
        let mut columns = vec![UInt64Chunked::from_vec("key".into(), key).into_column()];
        for (name, v) in COUNTS.iter().zip(counts) {
            columns.push(UInt64Chunked::from_vec((*name).into(), v).take(&rows)?.into_column());
        }
        Ok((DataFrame::new(rows.len(), columns)?, masks))
    }

    fn columns(&self) -> PolarsResult<Columns<'_>> {
        let b = &self.base;
        let u32s = |name: &str| -> PolarsResult<&[u32]> { b.column(name)?.u32()?.cont_slice() };
        let i32s = |name: &str| -> PolarsResult<&[i32]> { b.column(name)?.i32()?.cont_slice() };
        Ok(Columns {
            class: b.column("class")?.u8()?.cont_slice()?,
            d: u32s("d")?,
            prober: u32s("prober")?,
            target: u32s("target")?,
            delays: [i32s(DELAYS[0])?, i32s(DELAYS[1])?, i32s(DELAYS[2])?],
        })
    }

    fn rnic_name(&self, id: u64) -> &str {
        self.rnic_names.get(id as usize).map_or(UNKNOWN_RNIC, String::as_str)
    }

    fn tor_name(&self, id: u64) -> &str {
        self.tor_names.get(id as usize).map_or(NO_TOR, String::as_str)
    }

    fn collect_rows(
        &self,
        scope: Scope,
        df: &DataFrame,
        ts_masks: &[(u64, TsSources)],
        sla: &Sla,
        out: &mut Vec<Row>,
    ) -> PolarsResult<()> {
        let u64s = |name: &str| -> PolarsResult<Vec<u64>> {
            let c = df.column(name)?.cast(&DataType::UInt64)?;
            Ok(c.u64()?.iter().map(|v| v.unwrap_or(0)).collect())
        };
        let quantile = |name: &str| -> PolarsResult<Vec<Option<i64>>> {
            let c = df.column(name)?.cast(&DataType::Int64)?;
            Ok(c.i64()?.iter().collect())
        };
        let key = u64s("key")?;
        let counts: Vec<Vec<u64>> = COUNTS.iter().map(|c| u64s(c)).collect::<PolarsResult<_>>()?;
        let q: Vec<Vec<Option<i64>>> = QUANTILES.iter().map(|(_, n, _)| quantile(n)).collect::<PolarsResult<_>>()?;
        for i in 0..df.height() {
            let (d, a, b) = self.keys.decode(scope, key[i]);
            let (entity, ends) = match scope {
                Scope::Cluster => ("cluster".to_owned(), None),
                Scope::Tor => (self.tor_name(a).to_owned(), None),
                Scope::Rnic => (self.rnic_name(a).to_owned(), None),
                Scope::TorPair => {
                    let (a, b) = (self.tor_name(a).to_owned(), self.tor_name(b).to_owned());
                    (format!("{a}->{b}"), Some((a, b)))
                }
                Scope::Pair => {
                    let (a, b) = (self.rnic_name(a).to_owned(), self.rnic_name(b).to_owned());
                    (format!("{a}->{b}"), Some((a, b)))
                }
                Scope::Service => unreachable!("service rows come from service_rows"),
            };
            let c: [u64; COUNTS.len()] = std::array::from_fn(|j| counts[j][i]);
            let ts_source = ts_masks
                .binary_search_by_key(&key[i], |m| m.0)
                .ok()
                .map_or_else(TsSources::default, |at| ts_masks[at].1);
            let quantiles: [Option<i64>; QUANTILES.len()] = std::array::from_fn(|j| q[j][i]);
            let mut row = self.make_row(scope, d, entity, Figures { counts: c, quantiles, ts_source }, sla);
            row.ends = ends;
            out.push(row);
        }
        Ok(())
    }

    /// One row (without `ends` or service columns) from its figures; `d` is the dense window
    /// index.
    fn make_row(&self, scope: Scope, d: u64, entity: String, figures: Figures, sla: &Sla) -> Row {
        let Figures { counts: c, quantiles: q, ts_source } = figures;
        let (ok, lost, partial) = (c[C_OK], c[C_LOST], c[C_PARTIAL]);
        let loss_ratio = crate::probe::loss_ratio(ok, partial, lost);
        let window = self.window_list.get(d as usize).copied().unwrap_or(0);
        let window_start_ns = window.saturating_mul(self.window_ns);
        Row {
            window_start_ns,
            window_start: utc(window_start_ns),
            scope,
            entity,
            ends: None,
            probes: c[C_PROBES],
            ok,
            lost,
            partial,
            invalid: c[C_INVALID],
            refused: c[C_REFUSED],
            local_drop: c[C_LOCAL_DROP],
            unreachable: c[C_UNREACHABLE],
            loss_ratio,
            rtt_ns_p50: q[0],
            rtt_ns_p99: q[1],
            rtt_ns_p999: q[2],
            prober_delay_ns_p50: q[3],
            prober_delay_ns_p99: q[4],
            responder_delay_ns_p50: q[5],
            responder_delay_ns_p99: q[6],
            ts_source: ts_source.label(),
            sla_violations: sla.violations(loss_ratio, q[1]),
            service: None,
        }
    }

    /// The `service` scope's rows: per (window, service), or per service over the whole range,
    /// from the service probes alone. They are gathered (few: a bounded rate per connection),
    /// sorted by (service, window) and counted per run; the unreachable rule applies per
    /// (window, service) before a whole-range sum, as it does per pair in the other scopes.
    fn service_rows(&self, whole: bool, sla: &Sla, out: &mut Vec<Row>) -> PolarsResult<()> {
        if self.service.is_empty() {
            return Ok(());
        }
        let c = self.columns()?;
        let mut recs: Vec<(u64, usize)> = self
            .service
            .par_iter()
            .enumerate()
            .filter(|(_, s)| **s != NO_SERVICE)
            .map(|(i, &s)| ((u64::from(s) << 32) | u64::from(c.d[i]), i))
            .collect();
        recs.par_sort_unstable();
        let quantiles = |samples: &[Vec<i32>; 3]| -> [Option<i64>; QUANTILES.len()] {
            if samples[0].is_empty() {
                return [None; QUANTILES.len()];
            }
            let [rtt, pd, rd] = samples.each_ref().map(Vec::as_slice);
            select_quantiles([&[rtt], &[pd], &[rd]]).map(|v| Some(i64::from(v)))
        };
        for run in recs.chunk_by(|a, b| a.0 >> 32 == b.0 >> 32) {
            let sid = (run[0].0 >> 32) as usize;
            let (label, columns) = match self.services.get(sid) {
                Some((label, columns)) => (label.clone(), Some(columns.clone())),
                None => (format!("(unknown service {sid})"), None),
            };
            let mut total = [0u64; COUNTS.len()];
            let mut ts = TsSources::default();
            let mut samples: [Vec<i32>; 3] = Default::default();
            for window in run.chunk_by(|a, b| a.0 == b.0) {
                let d = window[0].0 & 0xFFFF_FFFF;
                let mut by_class = [0u64; 8];
                for &(_, i) in window {
                    let b = c.class[i];
                    by_class[usize::from(packed::class(b))] += 1;
                    if packed::is_ok(b) {
                        ts.0 |= packed::sample_ts_bit(b) as u8;
                        for (s, delays) in samples.iter_mut().zip(c.delays) {
                            s.push(delays[i]);
                        }
                    }
                }
                let counts = counts_of(&by_class);
                if whole {
                    for (t, n) in total.iter_mut().zip(counts) {
                        *t += n;
                    }
                    continue;
                }
                let figures = Figures { counts, quantiles: quantiles(&samples), ts_source: ts };
                let mut row = self.make_row(Scope::Service, d, label.clone(), figures, sla);
                row.service = columns.clone();
                out.push(row);
                ts = TsSources::default();
                samples.iter_mut().for_each(Vec::clear);
            }
            if whole {
                let figures = Figures { counts: total, quantiles: quantiles(&samples), ts_source: ts };
                let mut row = self.make_row(Scope::Service, 0, label, figures, sla);
                row.service = columns;
                out.push(row);
            }
        }
        Ok(())
    }
}

/// What a row is computed from: its [`COUNTS`], its [`QUANTILES`] and the timestamp sources of
/// their samples.
struct Figures {
    counts: [u64; COUNTS.len()],
    quantiles: [Option<i64>; QUANTILES.len()],
    ts_source: TsSources,
}
