//! `analyze report`: SLA figures per time window and per scope over the ingested probe table
//! (pair counts and exact quantiles in plain Rust, roll-ups and joins in polars), and their
//! renderings (table, JSON, CSV, Parquet).
//!
//! This module owns the counting semantics that `analyze localize` shares (keep them in step):
//!
//! - per record: ok = outcome 0; invalid = outcome 2; refused = outcome 3 (the peer's host
//!   answered, its agent is down); lost = outcome 1 without ACK1; partial = outcome 1 with ACK1
//!   (only ACK2 missing: the forward path and the responder are proven alive, so it is neither a
//!   loss nor an RTT sample). Outcome bytes this build does not know count in `probes` only.
//! - window = floor(t1_unix_ns / window_ns), aligned on the wall clock.
//! - a (window, prober, target) whose records hold no ok and no partial but some lost is
//!   *unreachable* (Pingmesh: a dead peer is not packet loss); its lost probes count as
//!   `unreachable`, not `lost`.
//! - loss_ratio = lost / (ok + partial + lost), null when that is 0.
//! - delay quantiles are over ok records only, nearest rank: the value at 1-based rank
//!   ceil(q * n) of the sorted samples ([`nearest_rank_index`]; polars' `Equiprobable`, which is
//!   also DuckDB's `quantile_disc`).
//!
//! Scopes: `pair` (prober -> target), `rnic` (every record where the RNIC is the prober or the
//! target, a self-probe once: a broken RNIC hurts both directions), `tor` (every record whose
//! prober or target hangs off the ToR, a ToR-local record once), `tor_pair` (prober's ToR ->
//! target's ToR) and `cluster`. Counts are summed from the per-window pair counts, so the
//! unreachable rule is applied per pair before any roll-up; quantiles come from the ok records
//! of the scope's entity directly.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use polars::prelude::*;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::ingest::{Probes, Rnic};
use crate::inspect::utc;

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
    #[error("{}: {detail}", path.display())]
    SlaConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// An option is out of range.
    #[error("{0}")]
    Usage(String),
    /// JSON serialisation failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// Record classes, the `class` column the aggregations count.
pub mod class {
    use rocemesh_formats::record::Arrived;

    /// Outcome ok: a loss-free exchange and an RTT sample.
    pub const OK: u8 = 0;
    /// Lost before ACK1 came back.
    pub const LOST: u8 = 1;
    /// Only ACK2 missing.
    pub const PARTIAL: u8 = 2;
    /// Timestamps implausible.
    pub const INVALID: u8 = 3;
    /// The peer's host refused (agent down).
    pub const REFUSED: u8 = 4;
    /// An outcome byte this build does not know.
    pub const UNKNOWN: u8 = 5;

    /// The class of a record from its outcome byte and arrival bitmap.
    pub fn of(outcome: u8, arrived: u8) -> u8 {
        match outcome {
            0 => OK,
            1 if arrived & Arrived::ACK1 != 0 => PARTIAL,
            1 => LOST,
            2 => INVALID,
            3 => REFUSED,
            _ => UNKNOWN,
        }
    }
}

/// What a row aggregates over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The whole fleet.
    Cluster,
    /// Prober's ToR -> target's ToR.
    #[value(name = "tor_pair")]
    TorPair,
    /// Records whose prober or target hangs off the ToR.
    Tor,
    /// Records whose prober or target is the RNIC.
    Rnic,
    /// Prober -> target.
    Pair,
}

impl Scope {
    /// The name used in every output.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::TorPair => "tor_pair",
            Scope::Tor => "tor",
            Scope::Rnic => "rnic",
            Scope::Pair => "pair",
        }
    }
}

/// The default scopes: `pair` is left out because it has one row per probed pair and window.
pub const DEFAULT_SCOPES: [Scope; 3] = [Scope::Cluster, Scope::Tor, Scope::Rnic];

/// SLA thresholds; a row breaking either is a violation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sla {
    /// Highest acceptable loss ratio (0.001 = Pingmesh's 0.1%).
    #[serde(default = "default_loss_ratio")]
    pub loss_ratio: f64,
    /// Highest acceptable network RTT p99, µs (rpingmesh's phase-1 bound is 500).
    #[serde(default = "default_rtt_p99_us")]
    pub rtt_p99_us: f64,
}

fn default_loss_ratio() -> f64 {
    0.001
}

fn default_rtt_p99_us() -> f64 {
    500.0
}

impl Default for Sla {
    fn default() -> Self {
        Sla { loss_ratio: default_loss_ratio(), rtt_p99_us: default_rtt_p99_us() }
    }
}

impl Sla {
    /// Thresholds from a TOML file with the optional keys `loss_ratio` and `rtt_p99_us`
    /// (missing keys keep their defaults; unknown keys are refused, a typo must not silently
    /// keep a default).
    pub fn from_file(path: &Path) -> Result<Sla, ReportError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
            path: path.to_owned(),
            what: "read SLA configuration",
            source,
        })?;
        let sla: Sla = toml::from_str(&text).map_err(|e| ReportError::SlaConfig {
            path: path.to_owned(),
            detail: format!("{e}; the file holds `loss_ratio = 0.001` and `rtt_p99_us = 500`, both optional"),
        })?;
        sla.check().map_err(|detail| ReportError::SlaConfig { path: path.to_owned(), detail })?;
        Ok(sla)
    }

    /// Whether both thresholds make sense.
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.loss_ratio) {
            return Err(format!("loss_ratio = {} is not a ratio: use 0 to 1 (0.001 is 0.1%)", self.loss_ratio));
        }
        if !self.rtt_p99_us.is_finite() || self.rtt_p99_us < 0.0 {
            return Err(format!("rtt_p99_us = {} must be a non-negative number of µs", self.rtt_p99_us));
        }
        Ok(())
    }

    fn violations(&self, loss_ratio: Option<f64>, rtt_ns_p99: Option<i64>) -> Vec<Violation> {
        let mut v = Vec::new();
        if loss_ratio.is_some_and(|l| l > self.loss_ratio) {
            v.push(Violation::Loss);
        }
        if rtt_ns_p99.is_some_and(|r| r as f64 > self.rtt_p99_us * 1e3) {
            v.push(Violation::RttP99);
        }
        v
    }
}

/// Which threshold a row broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Violation {
    /// loss_ratio above [`Sla::loss_ratio`].
    Loss,
    /// rtt_ns_p99 above [`Sla::rtt_p99_us`].
    RttP99,
}

impl Violation {
    /// The name used in every output.
    pub fn name(self) -> &'static str {
        match self {
            Violation::Loss => "loss",
            Violation::RttP99 => "rtt_p99",
        }
    }
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
    /// Thresholds broken, empty when within the SLA.
    pub sla_violations: Vec<Violation>,
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

/// Counted columns of the pair-count table, summed by every scope.
const COUNTS: [&str; 7] = ["probes", "ok", "lost", "partial", "invalid", "refused", "unreachable"];

/// Name of records whose ToR is unknown, and of ids no dictionary defined.
const NO_TOR: &str = "(no tor)";
const UNKNOWN_RNIC: &str = "(unknown rnic)";

/// The probe table reduced to what reports need: per-window pair counts, and per record its
/// class, window index, ends and delays.
///
/// Every group-by runs on one integer key that packs the window's index with the entity's ids
/// (see [`KeySpace`]): polars groups a single integer column several times faster than a
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
    /// d, prober, target (u32), then [`COUNTS`] (u64).
    pair_counts: DataFrame,
    /// class, d, prober, target and the three delays of every record.
    base: DataFrame,
    /// ToR id by RNIC id (the unknown RNIC's is the "no ToR" one).
    rnic_tor: Vec<u32>,
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
/// column costs hundreds of MiB) to [`Prepared`].
pub fn prepare(probes: Probes, rnics: &[Rnic], window_ns: u64) -> Result<Prepared, ReportError> {
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
    } = probes;
    // Reports do not use these (ingest leaves them empty for `analyze report`).
    drop((flow_label, responder_epoch, kind));
    const BLOCK: usize = 1 << 16;
    // Pass 1: window (in place of t1), class (of outcome), ids clamped to the known ones (ToRs
    // are looked up from them where a key needs one). Records of one file are in time order, so consecutive records mostly share a window: a range check
    // replaces the 64-bit division, and only run starts are collected as windows.
    let window_runs: Vec<Vec<u64>> = window
        .par_chunks_mut(BLOCK)
        .zip(class.par_chunks_mut(BLOCK))
        .zip(arrived.par_chunks(BLOCK))
        .zip(prober.par_chunks_mut(BLOCK))
        .zip(target.par_chunks_mut(BLOCK))
        .map(|((((t, c), a), p), g)| {
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
                c[i] = class::of(c[i], a[i]);
                p[i] = p[i].min(unknown);
                g[i] = g[i].min(unknown);
            }
            runs.sort_unstable();
            runs.dedup();
            runs
        })
        .collect();
    drop(arrived);
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
                slot.1[usize::from(c[i] & 7)] += 1;
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
    let pair_counts = pair_counts(pair_table, keys)?;

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
    Ok(Prepared { window_ns, windows, records, rnic_names, tor_names, window_list, keys, pair_counts, base, rnic_tor })
}

/// Record counts per pair key `(d * rnics + prober) * rnics + target` and class: an
/// open-addressing table (linear probing, multiplicative hash), grown at half load.
#[derive(Default)]
struct PairTable {
    /// Pair keys, [`PairTable::EMPTY`] in free slots; a power of two long (or empty).
    keys: Vec<u64>,
    /// Counts by [`class`] value, beside `keys`.
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
        for (c, n) in self.entry(key).iter_mut().zip(counts) {
            *c += n;
        }
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
/// record counts per pair and class.
fn pair_counts(table: PairTable, keys: KeySpace) -> PolarsResult<DataFrame> {
    // pair key -> [probes, ok, lost_raw, partial, invalid, refused], in key order.
    let mut pairs: Vec<(u64, [u64; 6])> = table
        .keys
        .into_iter()
        .zip(table.counts)
        .filter(|(k, _)| *k != PairTable::EMPTY)
        .map(|(k, c)| {
            let at = |class: u8| c[usize::from(class)];
            (
                k,
                [
                    c.iter().sum(),
                    at(class::OK),
                    at(class::LOST),
                    at(class::PARTIAL),
                    at(class::INVALID),
                    at(class::REFUSED),
                ],
            )
        })
        .collect();
    pairs.sort_unstable_by_key(|p| p.0);
    let r = keys.rnics;
    let m = pairs.len();
    let (mut d, mut p, mut t) = (Vec::with_capacity(m), Vec::with_capacity(m), Vec::with_capacity(m));
    let mut counts: [Vec<u64>; 7] = Default::default();
    for (k, c) in pairs {
        let (prober, target) = ((k / r % r) as u32, (k % r) as u32);
        d.push((k / r / r) as u32);
        p.push(prober);
        t.push(target);
        // A dead peer is not packet loss: a pair with only losses is unreachable.
        let unreachable = if c[1] + c[3] == 0 { c[2] } else { 0 };
        for (v, x) in counts.iter_mut().zip([c[0], c[1], c[2] - unreachable, c[3], c[4], c[5], unreachable]) {
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
    DataFrame::new(m, columns)
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
            let counts = self
                .count_input(scope, whole)?
                .lazy()
                .group_by([col("key")])
                .agg(COUNTS.iter().map(|c| col(*c).sum()).collect::<Vec<_>>());
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
            self.collect_rows(scope, &df, sla, &mut rows)?;
        }
        rows.sort_by(|a, b| {
            // `false < true`: rows with violations sort first.
            a.sla_violations
                .is_empty()
                .cmp(&b.sla_violations.is_empty())
                .then(a.window_start_ns.cmp(&b.window_start_ns))
                .then(a.scope.cmp(&b.scope))
                .then_with(|| a.entity.cmp(&b.entity))
        });
        Ok(rows)
    }

    /// The per-window pair counts keyed for `scope` (small: one row per pair, window and end).
    fn count_input(&self, scope: Scope, whole: bool) -> PolarsResult<DataFrame> {
        let pc = &self.pair_counts;
        let ids = |name: &str| -> PolarsResult<Vec<u32>> {
            Ok(pc.column(name)?.u32()?.iter().map(|v| v.unwrap_or(0)).collect())
        };
        let (d, p, g) = (ids("d")?, ids("prober")?, ids("target")?);
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
            }
        }
        let rows = IdxCa::from_vec("rows".into(), rows);
        let mut columns = vec![UInt64Chunked::from_vec("key".into(), key).into_column()];
        for (name, v) in COUNTS.iter().zip(counts) {
            columns.push(UInt64Chunked::from_vec((*name).into(), v).take(&rows)?.into_column());
        }
        DataFrame::new(rows.len(), columns)
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
            if c.class[i] != class::OK {
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
        let first = shared(column(n, &|i| (c.class[i] == class::OK).then(|| key_of(i).0)))?;
        if !matches!(scope, Scope::Rnic | Scope::Tor) {
            return Ok(first);
        }
        let second_of = |i: usize| (c.class[i] == class::OK).then(|| key_of(i).1).flatten();
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

    fn collect_rows(&self, scope: Scope, df: &DataFrame, sla: &Sla, out: &mut Vec<Row>) -> PolarsResult<()> {
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
            };
            let c = |j: usize| counts[j][i];
            let (ok, lost, partial) = (c(1), c(2), c(3));
            let denominator = ok + partial + lost;
            let loss_ratio = (denominator > 0).then(|| lost as f64 / denominator as f64);
            let window = self.window_list.get(d as usize).copied().unwrap_or(0);
            let window_start_ns = window.saturating_mul(self.window_ns);
            out.push(Row {
                window_start_ns,
                window_start: utc(window_start_ns),
                scope,
                entity,
                ends,
                probes: c(0),
                ok,
                lost,
                partial,
                invalid: c(4),
                refused: c(5),
                unreachable: c(6),
                loss_ratio,
                rtt_ns_p50: q[0][i],
                rtt_ns_p99: q[1][i],
                rtt_ns_p999: q[2][i],
                prober_delay_ns_p50: q[3][i],
                prober_delay_ns_p99: q[4][i],
                responder_delay_ns_p50: q[5][i],
                responder_delay_ns_p99: q[6][i],
                sla_violations: sla.violations(loss_ratio, q[1][i]),
            });
        }
        Ok(())
    }
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
}

/// The rows as a DataFrame (the CSV and Parquet schema).
pub fn frame(rows: &[Row]) -> PolarsResult<DataFrame> {
    let u = |name: &str, f: fn(&Row) -> u64| {
        UInt64Chunked::from_vec(name.into(), rows.iter().map(f).collect()).into_column()
    };
    let q = |name: &str, f: fn(&Row) -> Option<i64>| {
        Int64Chunked::from_iter_options(name.into(), rows.iter().map(f)).into_column()
    };
    let s = |name: &str, v: Vec<String>| StringChunked::from_iter_values(name.into(), v.into_iter()).into_column();
    DataFrame::new(
        rows.len(),
        vec![
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
        ],
    )
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
    match format {
        Format::Table => sink.write_all(table(rows, meta).as_bytes())?,
        Format::Json => {
            serde_json::to_writer_pretty(&mut sink, &serde_json::json!({ "meta": meta, "rows": rows }))?;
            sink.write_all(b"\n")?;
        }
        Format::Csv => CsvWriter::new(&mut sink).finish(&mut frame(rows)?)?,
        Format::Parquet => {
            ParquetWriter::new(&mut sink).finish(&mut frame(rows)?)?;
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
    let _ = writeln!(
        s,
        "{:<20} {:<8} {:<entity_width$} {:>10} {:>10} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  SLA",
        "window (UTC)",
        "scope",
        "entity",
        "probes",
        "ok",
        "lost",
        "partial",
        "invalid",
        "refused",
        "unreach",
        "loss %",
        "rtt p50",
        "rtt p99",
        "p99.9",
        "prb p50",
        "prb p99",
        "rsp p50",
        "rsp p99",
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
            "{:<20} {:<8} {:<entity_width$} {:>10} {:>10} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  {}",
            r.window_start,
            r.scope.name(),
            r.entity,
            r.probes,
            r.ok,
            r.lost,
            r.partial,
            r.invalid,
            r.refused,
            r.unreachable,
            loss,
            us(r.rtt_ns_p50),
            us(r.rtt_ns_p99),
            us(r.rtt_ns_p999),
            us(r.prober_delay_ns_p50),
            us(r.prober_delay_ns_p99),
            us(r.responder_delay_ns_p50),
            us(r.responder_delay_ns_p99),
            sla,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class::of(0, 7), class::OK);
        assert_eq!(class::of(1, 1), class::LOST);
        assert_eq!(class::of(1, 3), class::PARTIAL);
        assert_eq!(class::of(1, 0), class::LOST);
        assert_eq!(class::of(2, 7), class::INVALID);
        assert_eq!(class::of(3, 1), class::REFUSED);
        assert_eq!(class::of(9, 7), class::UNKNOWN);
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
    /// keys that collide in the low bits the front cache of `prepare` is indexed by.
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
            let class = (x >> 40) as u8 % 8;
            let mut one = [0u64; 8];
            one[usize::from(class)] = 1;
            tables[(i % 3) as usize].add_counts(key, &one);
            want.entry(key).or_default()[usize::from(class)] += 1;
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

    #[test]
    fn sla_file_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("sla.toml");
        std::fs::write(&p, "loss_ratio = 0.01\n").expect("write");
        assert_eq!(Sla::from_file(&p).expect("valid"), Sla { loss_ratio: 0.01, rtt_p99_us: 500.0 });
        std::fs::write(&p, "loss_ration = 0.01\n").expect("write");
        assert!(matches!(Sla::from_file(&p), Err(ReportError::SlaConfig { .. })));
        std::fs::write(&p, "loss_ratio = 5\n").expect("write");
        assert!(matches!(Sla::from_file(&p), Err(ReportError::SlaConfig { .. })));
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
            p.outcome.push([0, 0, 0, 0, 0, 1, 1, 2, 3, 9][(r >> 50) as usize % 10]);
            p.arrived.push((r >> 54) as u8 & 7);
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
        }
    }

    #[test]
    fn utc_strings() {
        assert_eq!(utc(1_700_000_010_000_000_000), "2023-11-14T22:13:30Z");
    }
}
