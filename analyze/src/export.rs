//! `analyze export`: the raw probe table as one Parquet file, for DuckDB, Spark or pandas users.
//!
//! One row per probe record, with the names of prober and target and of their ToRs next to
//! the fleet ids of this export, and the start of the record's window. The raw bytes
//! (`outcome`, `arrived`, `ts_source`) are kept as written; `class` names what the record
//! counts as in `analyze report` ([`crate::probe::Class`]: ok, lost, partial, invalid,
//! refused, local_drop, unknown), so SQL over the export need not re-derive the rules. The table is written in
//! row groups of [`ROW_GROUP_ROWS`], each built from the ingested columns just before it is
//! written; `analyze export` ingests a range of windows at a time ([`write_parquet_parts`]), so
//! memory stays at one range plus one row group whatever the input size. Rows are in the order
//! of the ranges (time), and within one range of the files.
//! Names are gathered as string views over one small array of distinct names, and Parquet
//! dictionary-encodes them, so they cost a few bits per row on disk. A traced service's probe
//! has its remote RNIC as target and the connection's dictionary name in the last column,
//! `service` (null for every other probe).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use polars::prelude::*;

use crate::ingest::{Dataset, Fields, NO_SERVICE, NO_TOR, Probes, Rnic, Service, UNKNOWN_RNIC};
use crate::probe::Class;

/// Rows per Parquet row group: large enough for good compression and few footers, small
/// enough that readers (DuckDB scans one row group per thread) get parallelism.
pub const ROW_GROUP_ROWS: usize = 1 << 20;

/// What can go wrong exporting.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// polars could not build or write a row group.
    #[error("polars: {0}")]
    Polars(#[from] PolarsError),
    /// The output file could not be created or written.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// An option is out of range.
    #[error("{0}")]
    Usage(String),
}

/// Parquet page compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Compression {
    /// zstd (polars' default level): smallest files.
    #[default]
    Zstd,
    /// LZ4 (raw): fastest to decode.
    Lz4,
    /// Snappy: what older Spark setups expect.
    Snappy,
    /// None.
    Uncompressed,
}

impl Compression {
    fn parquet(self) -> ParquetCompression {
        match self {
            Compression::Zstd => ParquetCompression::Zstd(None),
            Compression::Lz4 => ParquetCompression::Lz4Raw,
            Compression::Snappy => ParquetCompression::Snappy,
            Compression::Uncompressed => ParquetCompression::Uncompressed,
        }
    }
}

/// Writes every probe of `ds` to `path`; returns the rows written.
pub fn write_parquet(
    ds: &Dataset,
    path: &Path,
    window_ns: u64,
    compression: Compression,
) -> Result<usize, ExportError> {
    let mut whole = Some(&ds.probes);
    write_parquet_parts(&ds.rnics, &ds.services, path, window_ns, compression, || whole.take())
}

/// Writes the probes `parts` yields, one part after the other (ranges of an
/// [`crate::ingest::Plan`], each dropped before the next is read), to `path`; `rnics` and
/// `services` name their ids. Returns the rows written.
pub fn write_parquet_parts<P: std::borrow::Borrow<Probes>>(
    rnics: &[Rnic],
    services: &[Service],
    path: &Path,
    window_ns: u64,
    compression: Compression,
    mut parts: impl FnMut() -> Option<P>,
) -> Result<usize, ExportError> {
    if window_ns == 0 {
        return Err(ExportError::Usage("the window must be at least 1 s".into()));
    }
    // Distinct names once; rows gather views into them. The last entry stands for ids no
    // dictionary defined (ingest maps those to u32::MAX).
    let mut rnic_names: Vec<&str> = rnics.iter().map(|r| r.name.as_str()).collect();
    rnic_names.push(UNKNOWN_RNIC);
    let mut tor_names: Vec<&str> = Vec::new();
    let mut tor_of_rnic: Vec<IdxSize> = Vec::with_capacity(rnic_names.len());
    for r in rnics {
        let t = if r.tor.is_empty() { NO_TOR } else { r.tor.as_str() };
        let id = match tor_names.iter().position(|n| *n == t) {
            Some(i) => i,
            None => {
                tor_names.push(t);
                tor_names.len() - 1
            }
        };
        tor_of_rnic.push(id as IdxSize);
    }
    tor_names.push(NO_TOR);
    tor_of_rnic.push((tor_names.len() - 1) as IdxSize);
    let rnic_names = StringChunked::from_iter_values("name".into(), rnic_names.into_iter());
    let tor_names = StringChunked::from_iter_values("tor".into(), tor_names.into_iter());
    let unknown = (rnic_names.len() - 1) as IdxSize;
    let class_names = StringChunked::from_iter_values("class".into(), Class::ALL.iter().map(|c| c.name()));
    let service_names = StringChunked::from_iter_values("service".into(), services.iter().map(|s| s.name.as_str()));

    let file = std::fs::File::create(path).map_err(|source| ExportError::Io {
        path: path.to_owned(),
        what: "create the Parquet file",
        source,
    })?;
    let batch = |p: &Probes, a: usize, b: usize| -> PolarsResult<DataFrame> {
        let rnic_idx = |ids: &[u32]| -> Vec<IdxSize> {
            ids.iter().map(|&i| if (i as usize) < rnics.len() { i as IdxSize } else { unknown }).collect()
        };
        let (prober, target) = (rnic_idx(&p.prober[a..b]), rnic_idx(&p.target[a..b]));
        let tor_idx = |idx: &[IdxSize]| -> IdxCa {
            IdxCa::from_vec("idx".into(), idx.iter().map(|&i| tor_of_rnic[i as usize]).collect())
        };
        let (prober_tor, target_tor) = (tor_idx(&prober), tor_idx(&target));
        let (prober, target) = (IdxCa::from_vec("idx".into(), prober), IdxCa::from_vec("idx".into(), target));
        let names = |ca: &StringChunked, idx: &IdxCa, name: &str| -> PolarsResult<Column> {
            Ok(ca.take(idx)?.with_name(name.into()).into_column())
        };
        let class = IdxCa::from_vec(
            "idx".into(),
            p.outcome[a..b].iter().zip(&p.arrived[a..b]).map(|(&o, &r)| Class::of(o, r) as IdxSize).collect(),
        );
        let service = IdxCa::from_iter_options(
            "idx".into(),
            (a..b).map(|i| {
                let s = p.service_of(i);
                (s != NO_SERVICE && (s as usize) < services.len()).then_some(s as IdxSize)
            }),
        );
        DataFrame::new(
            b - a,
            vec![
                UInt64Chunked::from_slice("t1_unix_ns".into(), &p.t1_unix_ns[a..b]).into_column(),
                UInt64Chunked::from_vec(
                    "window_start_ns".into(),
                    p.t1_unix_ns[a..b].iter().map(|t| t / window_ns * window_ns).collect(),
                )
                .into_column(),
                names(&rnic_names, &prober, "prober")?,
                names(&tor_names, &prober_tor, "prober_tor")?,
                names(&rnic_names, &target, "target")?,
                names(&tor_names, &target_tor, "target_tor")?,
                UInt32Chunked::from_slice("prober_id".into(), &p.prober[a..b]).into_column(),
                UInt32Chunked::from_slice("target_id".into(), &p.target[a..b]).into_column(),
                UInt8Chunked::from_slice("kind".into(), &p.kind[a..b]).into_column(),
                UInt8Chunked::from_slice("outcome".into(), &p.outcome[a..b]).into_column(),
                UInt8Chunked::from_slice("arrived".into(), &p.arrived[a..b]).into_column(),
                UInt32Chunked::from_slice("flow_label".into(), &p.flow_label[a..b]).into_column(),
                UInt32Chunked::from_slice("responder_epoch".into(), &p.responder_epoch[a..b]).into_column(),
                Int32Chunked::from_slice("network_rtt_ns".into(), &p.network_rtt_ns[a..b]).into_column(),
                Int32Chunked::from_slice("prober_delay_ns".into(), &p.prober_delay_ns[a..b]).into_column(),
                Int32Chunked::from_slice("responder_delay_ns".into(), &p.responder_delay_ns[a..b]).into_column(),
                UInt8Chunked::from_slice("ts_source".into(), &p.ts_source[a..b]).into_column(),
                names(&class_names, &class, "class")?,
                names(&service_names, &service, "service")?,
            ],
        )
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut writer = None;
    let mut n = 0;
    while let Some(part) = parts() {
        let p = part.borrow();
        if let Some((name, len)) = p.uneven_column(Fields::All) {
            return Err(ExportError::Usage(format!(
                "probe column {name} has {len} values for {} records (ingested without every column?)",
                p.len()
            )));
        }
        let mut at = 0;
        while at < p.len() {
            let end = (at + ROW_GROUP_ROWS).min(p.len());
            let group = batch(p, at, end)?;
            if writer.is_none() {
                writer =
                    Some(ParquetWriter::new(&mut out).with_compression(compression.parquet()).batched(group.schema())?);
            }
            if let Some(w) = &mut writer {
                w.write_batch(&group)?;
            }
            at = end;
        }
        n += p.len();
    }
    // No record at all: a file with the columns and no row.
    if writer.is_none() {
        let empty = batch(&Probes::default(), 0, 0)?;
        let mut w = ParquetWriter::new(&mut out).with_compression(compression.parquet()).batched(empty.schema())?;
        w.write_batch(&empty)?;
        writer = Some(w);
    }
    if let Some(w) = writer {
        w.finish()?;
    }
    out.flush().map_err(|source| ExportError::Io { path: path.to_owned(), what: "write the Parquet file", source })?;
    Ok(n)
}
