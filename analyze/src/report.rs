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
//!   ceil(q * n) of the sorted samples ([`nearest_rank_index`]; polars' `Equiprobable`, which is
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

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use polars::prelude::*;
use rayon::prelude::*;
use serde::Serialize;

use crate::ingest::{Fields, NO_SERVICE, NO_TOR, Probes, Rnic, Service, UNKNOWN_RNIC};
use crate::inspect::utc;
use crate::probe::{Class, SlaError, TsSources, split_unreachable};
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

/// The 0-based index of the q-quantile among `n` sorted samples (nearest rank, 1-based rank
/// ceil(q * n)), computed exactly as polars' `QuantileMethod::Equiprobable` does it.
pub fn nearest_rank_index(n: usize, q: f64) -> usize {
    ((n as f64 * q).ceil() - 1.0).max(0.0) as usize
}

/// The [`QUANTILES`] of one key's samples: each delay column given as the pieces it lies in.
fn select_quantiles([rtt, pd, rd]: [&[&[i32]]; 3]) -> [i32; QUANTILES.len()] {
    let [r50, r99, r999] = select_ranks(rtt, [0.5, 0.99, 0.999]);
    let [p50, p99, _] = select_ranks(pd, [0.5, 0.99, 0.99]);
    let [d50, d99, _] = select_ranks(rd, [0.5, 0.99, 0.99]);
    [r50, r99, r999, p50, p99, d50, d99]
}

/// The values at the nearest ranks of `qs` (ascending) among the values of `pieces` (not all
/// empty).
fn select_ranks(pieces: &[&[i32]], qs: [f64; 3]) -> [i32; 3] {
    let n = pieces.iter().map(|p| p.len()).sum();
    debug_assert!(n > 0 && qs.is_sorted());
    let ranks = qs.map(|q| nearest_rank_index(n, q));
    let mut out = [0; 3];
    radix_select(pieces, &ranks, &mut out);
    out
}

/// Radix select buckets: 2^11 counters (8 KiB) stay in L1 next to the values being counted.
const RADIX_BITS: u32 = 11;
/// Below this many values, comparison selection beats counting.
const RADIX_MIN_LEN: usize = 512;

/// `out[i]` = the value at 0-based position `ranks[i]` (ascending) of the sorted values of
/// `pieces`. Counting, not comparing: one pass finds the range, one counts values into
/// 2^[`RADIX_BITS`] buckets of equal width, one copies out the buckets holding a wanted rank,
/// which recurse (each level resolves 11 more bits, so at most 3 levels for 32-bit values).
/// Against nested `select_nth_unstable` (p50 over all, p99 over the upper half, p99.9 above
/// that) it saves the data-dependent branches of partitioning, and it reads the samples where
/// they lie, in pieces, without gathering them first. (Log-linear buckets, which keep a single
/// outlier from pushing everything into one bucket, measured slower on the bench's data.)
fn radix_select(pieces: &[&[i32]], ranks: &[usize], out: &mut [i32]) {
    let n: usize = pieces.iter().map(|p| p.len()).sum();
    debug_assert!(ranks.is_sorted() && ranks.last().is_none_or(|&r| r < n));
    if n < RADIX_MIN_LEN {
        let mut small = [0i32; RADIX_MIN_LEN];
        for (s, x) in small.iter_mut().zip(pieces.iter().flat_map(|p| p.iter().copied())) {
            *s = x;
        }
        let v = &mut small[..n];
        // `done`: v[..done] holds the smallest `done` values, v[done - 1] the largest of them.
        let mut done = 0usize;
        for (o, &at) in out.iter_mut().zip(ranks) {
            if at < done {
                // Ranks only repeat (equal q, or tiny n): the previous rank's value.
                *o = v[done - 1];
                continue;
            }
            let (_, x, _) = v[done..].select_nth_unstable(at - done);
            *o = *x;
            done = at + 1;
        }
        return;
    }
    let (lo, hi) = pieces
        .iter()
        .map(|p| p.iter().fold((i32::MAX, i32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x))))
        .fold((i32::MAX, i32::MIN), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)));
    let shift = (u32::BITS - hi.abs_diff(lo).leading_zeros()).saturating_sub(RADIX_BITS);
    let bucket = |x: i32| (x.abs_diff(lo) >> shift) as usize;
    // Four interleaved counters per bucket: runs of equal values would otherwise make each
    // increment wait for the previous one's store.
    let mut lanes = [[0u32; 1 << RADIX_BITS]; 4];
    for p in pieces {
        let mut quads = p.chunks_exact(4);
        for q in &mut quads {
            for (lane, &x) in lanes.iter_mut().zip(q) {
                lane[bucket(x)] += 1;
            }
        }
        for &x in quads.remainder() {
            lanes[0][bucket(x)] += 1;
        }
    }
    let [mut counts, l1, l2, l3] = lanes;
    for (((c, a), b), d) in counts.iter_mut().zip(l1).zip(l2).zip(l3) {
        *c += a + b + d;
    }
    // Each rank's bucket and how many values lie in lower buckets.
    let mut found = [(0usize, 0usize); 3];
    let (mut b, mut below) = (0usize, 0usize);
    for (f, &r) in found.iter_mut().zip(ranks) {
        while below + counts[b] as usize <= r {
            below += counts[b] as usize;
            b += 1;
        }
        *f = (b, below);
    }
    let found = &found[..ranks.len()];
    if shift == 0 {
        // One value per bucket: the bucket is the answer.
        for (o, &(b, _)) in out.iter_mut().zip(found) {
            *o = (i64::from(lo) + b as i64) as i32;
        }
        return;
    }
    // The distinct wanted buckets, copied out side by side, then each selected in.
    let mut wanted: Vec<usize> = found.iter().map(|f| f.0).collect();
    wanted.dedup();
    let mut start = vec![0usize; wanted.len() + 1];
    for (i, &w) in wanted.iter().enumerate() {
        start[i + 1] = start[i] + counts[w] as usize;
    }
    // Without a branch per value (which bucket a value falls in is a coin toss near a rank):
    // every value is written, those of no wanted bucket to a last slot that is overwritten.
    let sink = start[wanted.len()];
    let mut picked = vec![0i32; sink + 1];
    let mut at = [sink; 4];
    at[..wanted.len()].copy_from_slice(&start[..wanted.len()]);
    let mut w = [usize::MAX; 3];
    w[..wanted.len()].copy_from_slice(&wanted);
    for p in pieces {
        for &x in p.iter() {
            let b = bucket(x);
            let i = if b == w[0] {
                0
            } else if b == w[1] {
                1
            } else if b == w[2] {
                2
            } else {
                3
            };
            picked[at[i]] = x;
            at[i] += usize::from(i < 3);
        }
    }
    for (i, &w) in wanted.iter().enumerate() {
        let (mut sub_ranks, mut outs) = (Vec::with_capacity(3), Vec::with_capacity(3));
        for (j, &(b, below)) in found.iter().enumerate() {
            if b == w {
                sub_ranks.push(ranks[j] - below);
                outs.push(j);
            }
        }
        let mut sub_out = [0i32; 3];
        radix_select(&[&picked[start[i]..start[i + 1]]], &sub_ranks, &mut sub_out[..sub_ranks.len()]);
        for (k, &j) in outs.iter().enumerate() {
            out[j] = sub_out[k];
        }
    }
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

/// The byte [`prepare`] leaves in place of each record's outcome: its [`Class`] in the low three
/// bits and its timestamp-source code ([`crate::probe::ts_code`]) above them. The source thus
/// costs no column of its own after `prepare`, and the pair count reads it with the class.
mod packed {
    use crate::probe::{Class, ts_code};

    const CLASS_MASK: u8 = 0b111;
    const TS_SHIFT: u32 = 3;

    /// The byte of a record.
    #[inline]
    pub fn pack(class: Class, ts_source: u8) -> u8 {
        class as u8 | ts_code(ts_source) << TS_SHIFT
    }

    /// The class's discriminant.
    #[inline]
    pub fn class(b: u8) -> u8 {
        b & CLASS_MASK
    }

    /// Whether the record is an ok sample.
    #[inline]
    pub fn is_ok(b: u8) -> bool {
        b & CLASS_MASK == Class::Ok as u8
    }

    /// The record's timestamp-source bit ([`crate::probe::TsSources`]) if it is an ok sample,
    /// else 0: computed without a branch, on the pair count's hot path.
    #[inline]
    pub fn sample_ts_bit(b: u8) -> u64 {
        u64::from(is_ok(b)) << (b >> TS_SHIFT)
    }
}

/// The slot of a pair-count entry that holds the OR of its ok samples' timestamp-source bits
/// (slots below it count records by class, which stay below it: [`Class::Unknown`] is 6).
const TS_SLOT: usize = 7;

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

/// Sizes of the id spaces packed into group keys: a window index `d` and one or two ids, as
/// `d * n + x` or `(d * n + x) * n + y` ([`KeySpace::keys`]).
#[derive(Debug, Clone, Copy)]
struct KeySpace {
    /// RNIC ids, the unknown one included.
    rnics: u64,
    /// ToR ids.
    tors: u64,
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
    let mut dense = vec![0u32; records];
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
                let key = (at * r + u64::from(p[i])) * r + u64::from(g[i]);
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

/// Record counts per pair key `(d * rnics + prober) * rnics + target` and class: an
/// open-addressing table (linear probing, multiplicative hash), grown at half load.
#[derive(Default)]
struct PairTable {
    /// Pair keys, [`PairTable::EMPTY`] in free slots; a power of two long (or empty).
    keys: Vec<u64>,
    /// Counts by [`Class`] discriminant, beside `keys`; slot [`TS_SLOT`] is a bitmask, merged
    /// by OR.
    counts: Vec<[u64; 8]>,
    len: usize,
}

impl PairTable {
    /// No real key: [`prepare`] refuses key spaces beyond 2^61.
    const EMPTY: u64 = u64::MAX;

    fn slot(&self, key: u64) -> usize {
        let mask = self.keys.len() - 1;
        let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & mask;
        while self.keys[i] != key && self.keys[i] != Self::EMPTY {
            i = (i + 1) & mask;
        }
        i
    }

    fn add_counts(&mut self, key: u64, counts: &[u64; 8]) {
        let entry = self.entry(key);
        for (c, n) in entry[..TS_SLOT].iter_mut().zip(counts) {
            *c += n;
        }
        entry[TS_SLOT] |= counts[TS_SLOT];
    }

    fn entry(&mut self, key: u64) -> &mut [u64; 8] {
        if 2 * (self.len + 1) > self.keys.len() {
            self.grow();
        }
        let i = self.slot(key);
        if self.keys[i] == Self::EMPTY {
            self.keys[i] = key;
            self.len += 1;
        }
        &mut self.counts[i]
    }

    fn grow(&mut self) {
        let size = (self.keys.len() * 2).max(1024);
        let keys = std::mem::replace(&mut self.keys, vec![Self::EMPTY; size]);
        let counts = std::mem::replace(&mut self.counts, vec![[0; 8]; size]);
        self.len = 0;
        for (k, c) in keys.into_iter().zip(counts) {
            if k != Self::EMPTY {
                self.add_counts(k, &c);
            }
        }
    }

    fn merge(mut self, other: PairTable) -> PairTable {
        if self.len < other.len {
            return other.merge(self);
        }
        for (k, c) in other.keys.into_iter().zip(other.counts) {
            if k != Self::EMPTY {
                self.add_counts(k, &c);
            }
        }
        self
    }
}

/// Per (window, prober, target): every count, with the unreachable rule applied, from the
/// record counts per pair and class, and the pair's `ts_mask`; and the records of unknown
/// outcome over all pairs.
fn pair_counts(table: PairTable, keys: KeySpace) -> PolarsResult<(DataFrame, u64)> {
    let mut pairs: Vec<(u64, [u64; 8])> =
        table.keys.into_iter().zip(table.counts).filter(|(k, _)| *k != PairTable::EMPTY).collect();
    pairs.sort_unstable_by_key(|p| p.0);
    let r = keys.rnics;
    let m = pairs.len();
    let (mut d, mut p, mut t) = (Vec::with_capacity(m), Vec::with_capacity(m), Vec::with_capacity(m));
    let mut ts_mask = Vec::with_capacity(m);
    let mut counts: [Vec<u64>; COUNTS.len()] = Default::default();
    let mut unknown_outcomes = 0;
    for (k, c) in pairs {
        let (prober, target) = ((k / r % r) as u32, (k % r) as u32);
        d.push((k / r / r) as u32);
        p.push(prober);
        t.push(target);
        // Only the low bits are ever set (one per timestamp-source code).
        ts_mask.push(c[TS_SLOT] as u8);
        unknown_outcomes += c[Class::Unknown as usize];
        for (v, x) in counts.iter_mut().zip(counts_of(&c)) {
            v.push(x);
        }
    }
    let mut columns = vec![
        UInt32Chunked::from_vec("d".into(), d).into_column(),
        UInt32Chunked::from_vec("prober".into(), p).into_column(),
        UInt32Chunked::from_vec("target".into(), t).into_column(),
    ];
    for (name, v) in COUNTS.iter().zip(counts) {
        columns.push(UInt64Chunked::from_vec((*name).into(), v).into_column());
    }
    columns.push(UInt8Chunked::from_vec("ts_mask".into(), ts_mask).into_column());
    Ok((DataFrame::new(m, columns)?, unknown_outcomes))
}

/// The [`COUNTS`] of one (window, prober, target) from its records per [`Class`] (slots below
/// [`TS_SLOT`]), with the unreachable rule applied.
fn counts_of(c: &[u64; 8]) -> [u64; COUNTS.len()] {
    let at = |class: Class| c[class as usize];
    let (lost, unreachable) = split_unreachable(at(Class::Ok), at(Class::Partial), at(Class::Lost));
    let mut row = [0u64; COUNTS.len()];
    row[C_PROBES] = c[..TS_SLOT].iter().sum();
    row[C_OK] = at(Class::Ok);
    row[C_LOST] = lost;
    row[C_PARTIAL] = at(Class::Partial);
    row[C_INVALID] = at(Class::Invalid);
    row[C_REFUSED] = at(Class::Refused);
    row[C_UNREACHABLE] = unreachable;
    row[C_LOCAL_DROP] = at(Class::LocalDrop);
    row
}

/// Whether rows are per window or over the whole range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// One row per window and entity.
    PerWindow,
    /// One row per entity over every window (counts still classified per window).
    WholeRange,
}

/// Above this many possible keys a scope's samples are grouped by hashing instead of being laid
/// out by key (the layout needs a counter per possible key and thread): 4 Mi keys is 32 MiB of
/// counters per thread, beyond any cluster, ToR or RNIC scope; only the `pair` scope of a large
/// fleet over many windows gets there.
const LAYOUT_KEYS_MAX: u64 = 1 << 22;

/// The key of samples that must not count, on the hashing path: their group is dropped by the
/// join with the counts, which never produce it ([`prepare`] keeps real keys below 2^61).
const JUNK_KEY: u64 = u64::MAX;

impl KeySpace {
    /// The number of keys `scope` can produce over `windows` windows.
    fn bound(self, scope: Scope, windows: u64) -> u64 {
        let (r, t) = (self.rnics, self.tors);
        windows.max(1)
            * match scope {
                Scope::Cluster => 1,
                Scope::Pair => r * r,
                Scope::TorPair => t * t,
                Scope::Rnic => r,
                Scope::Tor => t,
                // Not keyed here: `Prepared::service_rows` counts it (nothing is laid out).
                Scope::Service => 0,
            }
    }

    /// The group key of a record (window index `d`, RNICs `p` -> `g`, whose ToRs `tor` gives)
    /// in `scope`, and for the either-end scopes the key of its second end when the ends differ
    /// (so that a self-probe or a ToR-local record counts once).
    fn keys(self, scope: Scope, d: u64, p: u32, g: u32, tor: &[u32]) -> (u64, Option<u64>) {
        let (r, t) = (self.rnics, self.tors);
        let (pt, gt) = (u64::from(tor[p as usize]), u64::from(tor[g as usize]));
        let (p, g) = (u64::from(p), u64::from(g));
        match scope {
            Scope::Cluster => (d, None),
            Scope::Pair => ((d * r + p) * r + g, None),
            Scope::TorPair => ((d * t + pt) * t + gt, None),
            Scope::Rnic => (d * r + p, (g != p).then_some(d * r + g)),
            Scope::Tor => (d * t + pt, (gt != pt).then_some(d * t + gt)),
            Scope::Service => unreachable!("the service scope is not keyed by RNIC ids"),
        }
    }

    /// (d, first id, second id) of a key of `scope`.
    fn decode(self, scope: Scope, key: u64) -> (u64, u64, u64) {
        let (r, t) = (self.rnics, self.tors);
        match scope {
            Scope::Cluster => (key, 0, 0),
            Scope::Pair => (key / r / r, key / r % r, key % r),
            Scope::TorPair => (key / t / t, key / t % t, key % t),
            Scope::Rnic => (key / r, key % r, 0),
            Scope::Tor => (key / t, key % t, 0),
            Scope::Service => unreachable!("the service scope is not keyed by RNIC ids"),
        }
    }
}

/// The base columns as slices (each a single chunk: built from vectors in [`prepare`]).
struct Columns<'a> {
    class: &'a [u8],
    d: &'a [u32],
    prober: &'a [u32],
    target: &'a [u32],
    /// ToR id by RNIC id.
    tor: &'a [u32],
    delays: [&'a [i32]; 3],
}

const DELAYS: [&str; 3] = ["network_rtt_ns", "prober_delay_ns", "responder_delay_ns"];

impl Prepared {
    /// The rows of `scopes` over `span`, SLA violations first, then by window, scope and entity.
    pub fn rows(&self, scopes: &[Scope], span: Span, sla: &Sla) -> Result<Vec<Row>, ReportError> {
        self.rows_with(scopes, span, sla, LAYOUT_KEYS_MAX)
    }

    /// [`Prepared::rows`], laying samples out by key up to `layout_keys_max` possible keys.
    fn rows_with(
        &self,
        scopes: &[Scope],
        span: Span,
        sla: &Sla,
        layout_keys_max: u64,
    ) -> Result<Vec<Row>, ReportError> {
        if self.window_list.is_empty() {
            return Ok(Vec::new());
        }
        let whole = span == Span::WholeRange;
        let mut scopes = scopes.to_vec();
        scopes.sort();
        scopes.dedup();
        let mut rows = Vec::new();
        for scope in scopes {
            if scope == Scope::Service {
                self.service_rows(whole, sla, &mut rows)?;
                continue;
            }
            let (counts, ts_masks) = self.count_input(scope, whole)?;
            let counts =
                counts.lazy().group_by([col("key")]).agg(COUNTS.iter().map(|c| col(*c).sum()).collect::<Vec<_>>());
            let windows = if whole { 1 } else { self.window_list.len() as u64 };
            let quantiles = if self.keys.bound(scope, windows) <= layout_keys_max {
                self.quantiles_by_key(scope, whole)?
            } else {
                self.samples_hashed(scope, whole)?
                    .group_by([col("key")])
                    .agg(
                        QUANTILES
                            .iter()
                            .map(|(c, name, q)| {
                                col(*c)
                                    .quantile(lit(*q), QuantileMethod::Equiprobable)
                                    .strict_cast(DataType::Int64)
                                    .alias(*name)
                            })
                            .collect::<Vec<_>>(),
                    )
                    .with_column(col("key").strict_cast(DataType::UInt64))
                    .collect()?
            };
            let df =
                counts.join(quantiles.lazy(), [col("key")], [col("key")], JoinArgs::new(JoinType::Left)).collect()?;
            self.collect_rows(scope, &df, &ts_masks, sla, &mut rows)?;
        }
        sort_rows(&mut rows);
        Ok(rows)
    }

    /// The per-window pair counts keyed for `scope` (small: one row per pair, window and end),
    /// and the timestamp sources of each key's ok samples, ascending by key. polars sums the
    /// counts; the sources are ORed here, as this build of polars has no bitwise aggregation.
    fn count_input(&self, scope: Scope, whole: bool) -> PolarsResult<(DataFrame, Vec<(u64, TsSources)>)> {
        let pc = &self.pair_counts;
        let ids = |name: &str| -> PolarsResult<Vec<u32>> {
            Ok(pc.column(name)?.u32()?.iter().map(|v| v.unwrap_or(0)).collect())
        };
        let (d, p, g) = (ids("d")?, ids("prober")?, ids("target")?);
        let ts_mask: Vec<u8> = pc.column("ts_mask")?.u8()?.iter().map(|v| v.unwrap_or(0)).collect();
        let mut masks: Vec<(u64, TsSources)> = Vec::new();
        let counts: Vec<Vec<u64>> = COUNTS
            .iter()
            .map(|c| Ok(pc.column(c)?.u64()?.iter().map(|v| v.unwrap_or(0)).collect()))
            .collect::<PolarsResult<_>>()?;
        let (mut key, mut rows) = (Vec::with_capacity(pc.height()), Vec::with_capacity(pc.height()));
        for i in 0..pc.height() {
            let w = if whole { 0 } else { u64::from(d[i]) };
            let (a, b) = self.keys.keys(scope, w, p[i], g[i], &self.rnic_tor);
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
            tor: &self.rnic_tor,
            delays: [i32s(DELAYS[0])?, i32s(DELAYS[1])?, i32s(DELAYS[2])?],
        })
    }

    /// The quantile columns of `scope` (`key` and [`QUANTILES`]), one row per key with ok
    /// records, computed without polars. The records are cut into one range per thread; each
    /// counts its samples per key, then lays their delays out by key in its own region of the
    /// buffers (a counting sort, reading the table once); then each key's pieces, one per region,
    /// are selected where they lie ([`radix_select`]). Hashing 10^8 keys and gathering every
    /// group's values from all over the table is what this avoids (a target's records are spread
    /// over every prober's file: one value per cache line gathered); polars' own quantile on
    /// laid-out groups copied each group once per quantile.
    fn quantiles_by_key(&self, scope: Scope, whole: bool) -> PolarsResult<DataFrame> {
        let c = self.columns()?;
        let keys = self.keys;
        let windows = if whole { 1 } else { self.window_list.len() as u64 };
        let nkeys = keys.bound(scope, windows) as usize;
        let n = c.class.len();
        // A record's sample keys: none unless ok; in the either-end scopes, a second one for the
        // other end when it differs.
        let key_of = |i: usize| -> Option<(usize, Option<usize>)> {
            if !packed::is_ok(c.class[i]) {
                return None;
            }
            let d = if whole { 0 } else { u64::from(c.d[i]) };
            let (a, b) = keys.keys(scope, d, c.prober[i], c.target[i], c.tor);
            Some((a as usize, b.map(|b| b as usize)))
        };
        const BLOCK: usize = 1 << 16;
        let threads = rayon::current_num_threads().max(1);
        let per = n.div_ceil(threads).div_ceil(BLOCK).max(1) * BLOCK;
        let ranges: Vec<std::ops::Range<usize>> = (0..n).step_by(per).map(|s| s..(s + per).min(n)).collect();
        // Pass 1: each range's samples per key, as region offsets (key k's part of range t's
        // region is starts[t][k]..starts[t][k + 1]).
        let starts: Vec<Vec<usize>> = ranges
            .par_iter()
            .map(|r| {
                let mut h = vec![0usize; nkeys + 1];
                for i in r.clone() {
                    if let Some((a, b)) = key_of(i) {
                        h[a] += 1;
                        if let Some(b) = b {
                            h[b] += 1;
                        }
                    }
                }
                let mut total = 0;
                for x in h.iter_mut() {
                    (*x, total) = (total, total + *x);
                }
                h
            })
            .collect();
        let total: usize = starts.iter().map(|s| s[nkeys]).sum();
        let mut delays = [vec![0i32; total], vec![0i32; total], vec![0i32; total]];
        // Pass 2: each range places its samples in its region.
        {
            let mut regions = Vec::with_capacity(ranges.len());
            let [mut r0, mut r1, mut r2] = delays.each_mut().map(|v| v.as_mut_slice());
            for s in &starts {
                let len = s[nkeys];
                let (a, ar) = std::mem::take(&mut r0).split_at_mut(len);
                let (b, br) = std::mem::take(&mut r1).split_at_mut(len);
                let (e, er) = std::mem::take(&mut r2).split_at_mut(len);
                (r0, r1, r2) = (ar, br, er);
                regions.push([a, b, e]);
            }
            ranges.par_iter().zip(regions).zip(&starts).for_each(|((r, [o0, o1, o2]), s)| {
                let mut cursor = s[..nkeys].to_vec();
                for i in r.clone() {
                    if let Some((a, b)) = key_of(i) {
                        let v = [c.delays[0][i], c.delays[1][i], c.delays[2][i]];
                        for k in std::iter::once(a).chain(b) {
                            let at = &mut cursor[k];
                            (o0[*at], o1[*at], o2[*at]) = (v[0], v[1], v[2]);
                            *at += 1;
                        }
                    }
                }
                // Pass 2 found the samples pass 1 counted: every key's part is filled exactly.
                assert!(cursor.iter().zip(&s[1..]).all(|(c, end)| c == end), "a key's samples changed between passes");
            });
        }
        // Selection: key ranges of about equal sample counts, one per thread.
        let samples = |k: usize| starts.iter().map(|s| s[k + 1] - s[k]).sum::<usize>();
        let mut bounds = vec![0usize];
        let mut seen = 0usize;
        for k in 0..nkeys {
            if seen * threads >= total * bounds.len() && bounds.len() < threads {
                bounds.push(k);
            }
            seen += samples(k);
        }
        bounds.push(nkeys);
        let mut offset = 0;
        let regions: Vec<[&[i32]; 3]> = starts
            .iter()
            .map(|s| {
                let r = offset..offset + s[nkeys];
                offset = r.end;
                delays.each_ref().map(|v| &v[r.clone()])
            })
            .collect();
        let parts: Vec<(Vec<u64>, Vec<[i32; QUANTILES.len()]>)> = bounds
            .windows(2)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|w| {
                let (mut key, mut q) = (Vec::new(), Vec::new());
                let mut pieces: [Vec<&[i32]>; 3] = Default::default();
                for k in w[0]..w[1] {
                    if samples(k) == 0 {
                        continue;
                    }
                    for (col, p) in pieces.iter_mut().enumerate() {
                        p.clear();
                        p.extend(regions.iter().zip(&starts).map(|(r, s)| &r[col][s[k]..s[k + 1]]));
                    }
                    key.push(k as u64);
                    q.push(select_quantiles(pieces.each_ref().map(Vec::as_slice)));
                }
                (key, q)
            })
            .collect();
        quantile_frame(parts)
    }

    /// The ok records' delays of `scope` with a key column, for polars to group by hashing: the
    /// path for key spaces too large to lay out. Records that must not count get [`JUNK_KEY`] rather than being filtered out, so the
    /// delay columns are shared with the table, not copied. The second ends of either-end
    /// scopes are a second part: compact (gathered) when few records have one, as in the `tor`
    /// scope where most probes stay under one ToR.
    fn samples_hashed(&self, scope: Scope, whole: bool) -> PolarsResult<LazyFrame> {
        let c = self.columns()?;
        let keys = self.keys;
        let n = c.class.len();
        let key_of = |i: usize| {
            let d = if whole { 0 } else { u64::from(c.d[i]) };
            keys.keys(scope, d, c.prober[i], c.target[i], c.tor)
        };
        // u32 keys where they fit (the junk key then is u32::MAX): half the memory, and polars
        // hashes them faster.
        let windows = if whole { 1 } else { self.window_list.len() as u64 };
        let narrow = keys.bound(scope, windows) < u64::from(u32::MAX);
        let column = |len: usize, key: &(dyn Fn(usize) -> Option<u64> + Sync)| -> Column {
            if narrow {
                let v: Vec<u32> = (0..len).into_par_iter().map(|i| key(i).map_or(u32::MAX, |k| k as u32)).collect();
                UInt32Chunked::from_vec("key".into(), v).into_column()
            } else {
                let v: Vec<u64> = (0..len).into_par_iter().map(|i| key(i).unwrap_or(JUNK_KEY)).collect();
                UInt64Chunked::from_vec("key".into(), v).into_column()
            }
        };
        let shared = |key: Column| -> PolarsResult<LazyFrame> {
            let mut columns = vec![key];
            for name in DELAYS {
                columns.push(self.base.column(name)?.clone());
            }
            Ok(DataFrame::new(n, columns)?.lazy())
        };
        let first = shared(column(n, &|i| packed::is_ok(c.class[i]).then(|| key_of(i).0)))?;
        if !matches!(scope, Scope::Rnic | Scope::Tor) {
            return Ok(first);
        }
        let second_of = |i: usize| packed::is_ok(c.class[i]).then(|| key_of(i).1).flatten();
        let rows: Vec<IdxSize> =
            (0..n).into_par_iter().filter(|&i| second_of(i).is_some()).map(|i| i as IdxSize).collect();
        let second = if rows.len() > n / 2 {
            shared(column(n, &second_of))?
        } else {
            let mut columns = vec![column(rows.len(), &|j| second_of(rows[j] as usize))];
            let rows = IdxCa::from_vec("rows".into(), rows);
            for name in DELAYS {
                columns.push(self.base.column(name)?.take(&rows)?);
            }
            DataFrame::new(rows.len(), columns)?.lazy()
        };
        concat([first, second], UnionArgs { rechunk: true, ..UnionArgs::default() })
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

fn violations_text(v: &[Violation]) -> String {
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

fn us(ns: Option<i64>) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use rocemesh_formats::record::{Arrived, TsSource};

    /// The packed byte keeps class and timestamp source apart, for every class and source byte.
    #[test]
    fn packed_bytes_keep_class_and_source() {
        for class in Class::ALL {
            for ts in [0u8, 1, 2, 3, 4, 200] {
                let b = packed::pack(class, ts);
                assert_eq!(packed::class(b), class as u8);
                assert_eq!(packed::is_ok(b), class == Class::Ok);
                let want = if class == Class::Ok { u64::from(TsSources::of(ts).0) } else { 0 };
                assert_eq!(packed::sample_ts_bit(b), want, "{class:?} ts {ts}");
                assert!(packed::sample_ts_bit(b) < 1 << TS_SLOT, "stays out of the other slots' way");
            }
        }
    }

    #[test]
    fn nearest_rank() {
        // 1-based rank ceil(q n): n = 10 -> p50 rank 5, p99 rank 10; n = 1000 -> p99.9 rank 999.
        assert_eq!(nearest_rank_index(10, 0.5), 4);
        assert_eq!(nearest_rank_index(10, 0.99), 9);
        assert_eq!(nearest_rank_index(1000, 0.999), 998);
        assert_eq!(nearest_rank_index(1, 0.5), 0);
    }

    /// The selection gives the sorted samples' nearest ranks, for sizes where ranks coincide
    /// (1, 2, 3) or sit at the edges (100, 1000, 1001), on both sides of the counting threshold,
    /// with many ties and with none, with extremes that force every counting level, whole or in
    /// pieces.
    #[test]
    fn selected_ranks_are_the_sorted_ones() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in [1usize, 2, 3, 7, 10, 99, 100, 101, 511, 512, 999, 1000, 1001, 4096, 100_000] {
            for (spread, outliers) in [(1u64, false), (5, false), (1 << 30, false), (5, true), (3000, true)] {
                let mut v: Vec<i32> = (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % spread) as i32 - (spread / 3) as i32
                    })
                    .collect();
                if outliers && n > 4 {
                    // The extremes stretch the first level's buckets: the ranks land in one
                    // bucket holding nearly everything, which takes the next levels.
                    v[n / 2] = i32::MAX;
                    v[n / 3] = i32::MIN;
                }
                let mut sorted = v.clone();
                sorted.sort_unstable();
                for qs in [[0.5, 0.99, 0.999], [0.5, 0.99, 0.99]] {
                    let want = qs.map(|q| sorted[nearest_rank_index(n, q)]);
                    assert_eq!(select_ranks(&[&v], qs), want, "n {n} spread {spread} {qs:?}");
                    // The same values in pieces, one of them empty, as the layout hands them over.
                    let (a, b) = v.split_at(n / 3);
                    assert_eq!(select_ranks(&[a, &[], b], qs), want, "n {n} spread {spread} {qs:?} in pieces");
                }
            }
        }
    }

    /// The pair table counts like a map, through growth, merges of tables of either size, and
    /// keys that collide in the low bits the front cache of `prepare` is indexed by; its
    /// timestamp-source slot merges by OR.
    #[test]
    fn pair_table_counts_like_a_map() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut want: std::collections::BTreeMap<u64, [u64; 8]> = std::collections::BTreeMap::new();
        let mut tables = vec![PairTable::default(), PairTable::default(), PairTable::default()];
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few keys in the first table, many in the others; multiples of 64 collide.
            let key = if i % 3 == 0 { (x % 50) * 64 } else { x % 30_000 };
            let class = (x >> 40) as usize % TS_SLOT;
            let ts = 1u64 << ((x >> 50) % 5);
            let mut one = [0u64; 8];
            one[class] = 1;
            one[TS_SLOT] = ts;
            tables[(i % 3) as usize].add_counts(key, &one);
            let w = want.entry(key).or_default();
            w[class] += 1;
            w[TS_SLOT] |= ts;
        }
        let [a, b, c] = <[PairTable; 3]>::try_from(tables).ok().expect("three tables");
        let merged = a.merge(b).merge(c);
        let mut got: Vec<(u64, [u64; 8])> = merged
            .keys
            .iter()
            .zip(&merged.counts)
            .filter(|(k, _)| **k != PairTable::EMPTY)
            .map(|(k, c)| (*k, *c))
            .collect();
        got.sort_unstable_by_key(|e| e.0);
        assert_eq!(merged.len, want.len());
        assert_eq!(got, want.into_iter().collect::<Vec<_>>());
    }

    /// Both ways of grouping samples (laid out by key, hashed) give the same rows, on records
    /// with every outcome, an unknown RNIC id, an RNIC without a ToR and a self-probe.
    #[test]
    fn laid_out_and_hashed_agree() {
        let rnics: Vec<Rnic> = (0..7)
            .map(|i| Rnic {
                name: format!("h{i}/d0"),
                tor: if i == 6 { String::new() } else { format!("t{}", i % 3) },
                host: format!("h{i}"),
            })
            .collect();
        let n = 20_000usize;
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut p = Probes::default();
        for i in 0..n {
            let r = next();
            p.t1_unix_ns.push(1_700_000_000_000_000_000 + (i as u64) * 6_000_000 + r % 1000);
            p.network_rtt_ns.push((r >> 10) as i32 & 0xFFFF);
            p.prober_delay_ns.push((r >> 26) as i32 & 0xFFF);
            p.responder_delay_ns.push((r >> 38) as i32 & 0xFFF);
            p.prober.push(if r % 997 == 0 { u32::MAX } else { (r >> 3) as u32 % 7 });
            p.target.push((r >> 7) as u32 % 7);
            p.flow_label.push(0);
            p.responder_epoch.push(0);
            p.kind.push(0);
            p.outcome.push([0, 0, 0, 0, 0, 1, 1, 2, 3, 4, 9][(r >> 50) as usize % 11]);
            p.arrived.push((r >> 54) as u8 & 7);
            p.ts_source.push([1, 2, 2, 2, 7][(r >> 58) as usize % 5]);
        }
        let prepared = prepare(p, &rnics, 30_000_000_000).expect("prepare");
        let scopes = [Scope::Cluster, Scope::TorPair, Scope::Tor, Scope::Rnic, Scope::Pair];
        for span in [Span::PerWindow, Span::WholeRange] {
            let laid_out = prepared.rows(&scopes, span, &Sla::default()).expect("laid out");
            let hashed = prepared.rows_with(&scopes, span, &Sla::default(), 0).expect("hashed");
            assert!(laid_out.len() > 50, "{}", laid_out.len());
            assert_eq!(laid_out, hashed);
            assert!(laid_out.iter().any(|r| r.entity == UNKNOWN_RNIC));
            assert!(laid_out.iter().any(|r| r.entity == NO_TOR));
            assert!(laid_out.iter().any(|r| r.local_drop > 0));
            assert!(
                laid_out.iter().any(|r| r.ts_source.as_deref() == Some("mixed(host_poll+kernel_software+unknown)"))
            );
        }
    }

    /// Probes in one window from (prober, target, outcome, arrived, ts_source, rtt).
    fn probes(recs: &[(u32, u32, u8, u8, u8, i32)]) -> Probes {
        let mut p = Probes::default();
        for (i, &(prober, target, outcome, arrived, ts, rtt)) in recs.iter().enumerate() {
            p.t1_unix_ns.push(1_700_000_010_000_000_000 + i as u64);
            p.network_rtt_ns.push(rtt);
            p.prober_delay_ns.push(100);
            p.responder_delay_ns.push(100);
            p.prober.push(prober);
            p.target.push(target);
            p.outcome.push(outcome);
            p.arrived.push(arrived);
            p.ts_source.push(ts);
        }
        p
    }

    fn three_rnics() -> Vec<Rnic> {
        (0..3).map(|i| Rnic { name: format!("h{i}/d0"), tor: "t0".into(), host: format!("h{i}") }).collect()
    }

    fn row<'a>(rows: &'a [Row], scope: Scope, entity: &str) -> &'a Row {
        rows.iter().find(|r| r.scope == scope && r.entity == entity).unwrap_or_else(|| panic!("{entity}: {rows:?}"))
    }

    /// A row pooling samples of two timestamp sources says so; a row of one source names it;
    /// a lost probe's source is no sample's, so it labels nothing.
    #[test]
    fn rows_name_the_timestamp_sources_of_their_samples() {
        let all = Arrived::ALL.0;
        let recs = [
            (0, 1, 0, all, TsSource::HostPoll as u8, 90_000),
            (0, 1, 0, all, TsSource::HostPoll as u8, 95_000),
            (2, 1, 0, all, TsSource::KernelSoftware as u8, 9_000),
            (2, 0, 1, Arrived::PROBE_SENT, TsSource::Nic as u8, 0),
        ];
        let prepared = prepare(probes(&recs), &three_rnics(), 30_000_000_000).expect("prepare");
        for span in [Span::PerWindow, Span::WholeRange] {
            let rows = prepared.rows(&[Scope::Cluster, Scope::Rnic, Scope::Pair], span, &Sla::default()).expect("rows");
            let label = |scope, entity| row(&rows, scope, entity).ts_source.clone();
            assert_eq!(label(Scope::Rnic, "h0/d0").as_deref(), Some("host_poll"));
            assert_eq!(label(Scope::Rnic, "h1/d0").as_deref(), Some("mixed(host_poll+kernel_software)"));
            assert_eq!(label(Scope::Rnic, "h2/d0").as_deref(), Some("kernel_software"));
            assert_eq!(label(Scope::Pair, "h0/d0->h1/d0").as_deref(), Some("host_poll"));
            assert_eq!(label(Scope::Pair, "h2/d0->h0/d0"), None, "a lost probe is no sample");
            assert_eq!(label(Scope::Cluster, "cluster").as_deref(), Some("mixed(host_poll+kernel_software)"));
        }
    }

    /// Local drops have their own count and stay out of the loss ratio; a pair with nothing
    /// else is not unreachable. Unknown outcome bytes count in `probes` only, and are counted.
    #[test]
    fn local_drops_and_unknown_outcomes_count_apart() {
        let (all, sent, ks) = (Arrived::ALL.0, Arrived::PROBE_SENT, TsSource::KernelSoftware as u8);
        let mut recs = vec![(0, 1, 0, all, ks, 5_000); 6];
        recs.extend([(0, 1, 1, sent, ks, 0), (0, 1, 4, 0, ks, 0), (0, 1, 4, 0, ks, 0), (0, 1, 200, all, ks, 7)]);
        recs.extend([(2, 0, 4, 0, ks, 0); 5]);
        let prepared = prepare(probes(&recs), &three_rnics(), 30_000_000_000).expect("prepare");
        assert_eq!(prepared.unknown_outcomes, 1);
        let rows = prepared.rows(&[Scope::Pair, Scope::Cluster], Span::PerWindow, &Sla::default()).expect("rows");
        let r = row(&rows, Scope::Pair, "h0/d0->h1/d0");
        assert_eq!((r.probes, r.ok, r.lost, r.local_drop, r.unreachable), (10, 6, 1, 2, 0));
        assert_eq!(r.loss_ratio, Some(1.0 / 7.0));
        assert_eq!(r.rtt_ns_p99, Some(5_000), "the unknown byte's delay is no sample");
        let dropped = row(&rows, Scope::Pair, "h2/d0->h0/d0");
        assert_eq!((dropped.local_drop, dropped.lost, dropped.unreachable), (5, 0, 0));
        assert_eq!((dropped.loss_ratio, dropped.sla_violations.len()), (None, 0));
        assert_eq!(row(&rows, Scope::Cluster, "cluster").local_drop, 7);
    }

    /// The `service` scope counts each connection's own probes per window (the unreachable rule
    /// per window and connection, before a whole-range sum), and only those; the other scopes
    /// count them at the remote RNIC like any probe.
    #[test]
    fn service_rows_count_each_connection_alone() {
        use crate::ingest::{Resolution, Service};
        use rocemesh_formats::record::ServiceConn;
        let (all, sent, ks) = (Arrived::ALL.0, Arrived::PROBE_SENT, TsSource::KernelSoftware as u8);
        // (window, prober, target, service, outcome, arrived, rtt)
        let mut recs: Vec<(u64, u32, u32, u32, u8, u8, i32)> = Vec::new();
        // Service 0 (h0 -> h1): window 0: 8 ok, 2 lost; window 1: 3 lost only (unreachable).
        recs.extend((0..8).map(|i| (0, 0, 1, 0, 0, all, 1_000 + i)));
        recs.extend([(0, 0, 1, 0, 1, sent, 0); 2]);
        recs.extend([(1, 0, 1, 0, 1, sent, 0); 3]);
        // Service 1 (h2 -> h1): window 1: 4 ok.
        recs.extend((0..4).map(|i| (1, 2, 1, 1, 0, all, 5_000 + i)));
        // Mesh probes h0 -> h1, lossy: in no service row.
        recs.extend([(0, 0, 1, NO_SERVICE, 1, sent, 0); 5]);
        recs.extend([(0, 0, 1, NO_SERVICE, 0, all, 9_999); 5]);
        let mut p = Probes::default();
        for (k, &(w, prober, target, service, outcome, arrived, rtt)) in recs.iter().enumerate() {
            p.t1_unix_ns
                .push(1_700_000_010_000_000_000 / 30_000_000_000 * 30_000_000_000 + w * 30_000_000_000 + k as u64);
            p.network_rtt_ns.push(rtt);
            p.prober_delay_ns.push(100);
            p.responder_delay_ns.push(100);
            p.prober.push(prober);
            p.target.push(target);
            p.outcome.push(outcome);
            p.arrived.push(arrived);
            p.ts_source.push(ks);
            p.service.push(service);
        }
        let conn = |pid| ServiceConn {
            pid,
            local_qpn: 7,
            remote_qpn: 8,
            flow_label: 9,
            comm: "nccl".into(),
            ..ServiceConn::default()
        };
        let services: Vec<Service> = [(0, 1, 10), (2, 1, 11)]
            .into_iter()
            .enumerate()
            .map(|(i, (prober, remote, pid))| Service {
                name: format!("svc{i}"),
                prober,
                remote,
                resolution: Resolution::Agent,
                addr: [0; 16],
                conn: conn(pid),
            })
            .collect();
        let prepared = prepare_with(p, &three_rnics(), &services, 30_000_000_000).expect("prepare");
        let rows = prepared.rows(&[Scope::Service, Scope::Rnic], Span::PerWindow, &Sla::default()).expect("rows");
        let svc: Vec<&Row> = rows.iter().filter(|r| r.scope == Scope::Service).collect();
        assert_eq!(svc.len(), 3, "{svc:?}");
        let find = |name: &str, unreachable: u64| {
            svc.iter()
                .find(|r| r.service.as_ref().is_some_and(|s| s.service == name) && r.unreachable == unreachable)
                .unwrap_or_else(|| panic!("{name}: {svc:?}"))
        };
        let w0 = find("svc0", 0);
        assert_eq!((w0.probes, w0.ok, w0.lost, w0.loss_ratio), (10, 8, 2, Some(0.2)));
        assert_eq!((w0.rtt_ns_p50, w0.rtt_ns_p99), (Some(1_003), Some(1_007)), "its own samples only");
        assert_eq!(w0.entity, "nccl[10] qp 7->8 h0/d0->h1/d0");
        let cols = w0.service.as_ref().expect("columns");
        assert_eq!((cols.prober.as_str(), cols.remote.as_str(), cols.flow_label), ("h0/d0", "h1/d0", 9));
        assert_eq!(w0.sla_violations, vec![Violation::Loss]);
        let w1 = find("svc0", 3);
        assert_eq!((w1.probes, w1.lost, w1.loss_ratio), (3, 0, None), "a window of nothing but losses: unreachable");
        assert!(w1.window_start_ns > w0.window_start_ns);
        let other = find("svc1", 0);
        assert_eq!((other.probes, other.ok, other.ts_source.as_deref()), (4, 4, Some("kernel_software")));
        // h1 is the remote of both: every probe to it is in its rnic rows.
        let h1: u64 = rows.iter().filter(|r| r.scope == Scope::Rnic && r.entity == "h1/d0").map(|r| r.probes).sum();
        assert_eq!(h1, recs.len() as u64);

        let whole = prepared.rows(&[Scope::Service], Span::WholeRange, &Sla::default()).expect("rows");
        assert_eq!(whole.len(), 2);
        let r = whole.iter().find(|r| r.service.as_ref().is_some_and(|s| s.service == "svc0")).expect("svc0");
        assert_eq!((r.probes, r.lost, r.unreachable), (13, 2, 3), "unreachable decided per window, then summed");

        // Without services (earlier data), the scope has no rows and the rest is unchanged.
        let plain = prepare(probes(&[(0, 1, 0, all, ks, 5)]), &three_rnics(), 30_000_000_000).expect("prepare");
        assert!(plain.rows(&[Scope::Service], Span::PerWindow, &Sla::default()).expect("rows").is_empty());
        let csv = frame(&rows, true).expect("frame");
        assert_eq!(csv.width(), frame(&rows, false).expect("frame").width() + 9);
        assert_eq!(csv.column("flow_label").expect("flow_label").null_count(), rows.len() - svc.len());
    }

    #[test]
    fn columns_of_different_lengths_are_refused() {
        let mut p = probes(&[(0, 1, 0, 7, 2, 5); 3]);
        p.ts_source.clear();
        let e = prepare(p, &three_rnics(), 30_000_000_000).expect_err("ts_source is empty");
        assert!(e.to_string().contains("ts_source has 0 values for 3 records"), "{e}");
    }

    #[test]
    fn utc_strings() {
        assert_eq!(utc(1_700_000_010_000_000_000), "2023-11-14T22:13:30Z");
    }
}
