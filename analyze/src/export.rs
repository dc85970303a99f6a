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
//! has its remote RNIC as target, the connection's dictionary name in `service`, and in the
//! `service_*` columns after it what `analyze report --scope service` keys and labels its rows
//! by ([`SERVICE_COLUMNS`]): so a reader of the export (the Spark SQL report) can group a
//! connection's probes as the report does. All of them are null for every other probe, and
//! they are written only when the input defines a service.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use polars::prelude::*;

use crate::ingest::{Dataset, Fields, NO_SERVICE, NO_TOR, Probes, Rnic, Service, UNKNOWN_RNIC};
use crate::probe::Class;
use crate::report::ServiceColumns;

/// The columns after `service`, in order, when some file of the input defines a service (a
/// mesh-only export has none of them): the `service` scope's entity (the connection's label)
/// and [`ServiceColumns`] but its dictionary name (already `service`), each prefixed `service_`
/// because the row's own `prober` (and the others) are the probe's.
pub const SERVICE_COLUMNS: [&str; 9] = [
    "service_entity",
    "service_prober",
    "service_remote",
    "service_remote_resolution",
    "service_pid",
    "service_comm",
    "service_local_qpn",
    "service_remote_qpn",
    "service_flow_label",
];

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
    let names = Names::new(rnics, services, window_ns)?;
    let file = std::fs::File::create(path).map_err(io(path, "create the Parquet file"))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut writer = None;
    let mut n = 0;
    while let Some(part) = parts() {
        let p = part.borrow();
        even(p)?;
        let mut at = 0;
        while at < p.len() {
            let end = (at + ROW_GROUP_ROWS).min(p.len());
            let group = names.frame(p, &Rows::Span(at, end))?;
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
        let empty = names.frame(&Probes::default(), &Rows::Span(0, 0))?;
        let mut w = ParquetWriter::new(&mut out).with_compression(compression.parquet()).batched(empty.schema())?;
        w.write_batch(&empty)?;
        writer = Some(w);
    }
    if let Some(w) = writer {
        w.finish()?;
    }
    out.flush().map_err(io(path, "write the Parquet file"))?;
    Ok(n)
}

/// What [`write_partitioned_parts`] wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Partitioned {
    /// Probe rows.
    pub rows: usize,
    /// Parquet files.
    pub files: usize,
    /// Partition directories (date, hour, ToR).
    pub partitions: usize,
}

/// Writes the probes `parts` yields as a Hive-partitioned dataset under `dir`, for Spark, Trino
/// or DuckDB (`read_parquet('dir/**/*.parquet', hive_partitioning = true)`):
/// `date=YYYY-MM-DD/hour=HH/tor=NAME/part-NNNNN.parquet`, by the UTC hour of T1 and the
/// prober's ToR (the agent that measured it). Each part (a range of windows) writes its own
/// file in every partition it touches, so no file is reopened and memory stays at one range.
/// The files hold every column of [`write_parquet_parts`]'s; the partition values are in the
/// paths only (ToR names are %-escaped there as Hive escapes them). `dir` must be new or empty:
/// files of an older export would join the dataset.
pub fn write_partitioned_parts<P: std::borrow::Borrow<Probes>>(
    rnics: &[Rnic],
    services: &[Service],
    dir: &Path,
    window_ns: u64,
    compression: Compression,
    mut parts: impl FnMut() -> Option<P>,
) -> Result<Partitioned, ExportError> {
    let names = Names::new(rnics, services, window_ns)?;
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(ExportError::Usage(format!(
                    "{} is not empty: a partitioned export writes a whole dataset, and files already there would join it; remove them or pick a new directory",
                    dir.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(dir, "read the output directory")(e)),
    }
    const HOUR_NS: u64 = 3_600_000_000_000;
    let mut done = Partitioned::default();
    let mut partitions = std::collections::BTreeSet::new();
    let mut part_no = 0usize;
    while let Some(part) = parts() {
        let p = part.borrow();
        even(p)?;
        let key = |i: usize| (p.t1_unix_ns[i] / HOUR_NS, names.tor_of_rnic[names.rnic_idx(p.prober[i]) as usize]);
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by_key(|&i| key(i));
        for group in order.chunk_by(|&a, &b| key(a) == key(b)) {
            let first = group[0];
            let c = rocemesh_formats::time::civil_utc((p.t1_unix_ns[first] / 1_000_000_000) as i64);
            let sub = dir
                .join(format!("date={:04}-{:02}-{:02}", c.year, c.month, c.day))
                .join(format!("hour={:02}", c.hour))
                .join(format!("tor={}", hive_escape(names.tor_name(p.prober[first]))));
            std::fs::create_dir_all(&sub).map_err(io(&sub, "create the partition directory"))?;
            let path = sub.join(format!("part-{part_no:05}.parquet"));
            let file = std::fs::File::create(&path).map_err(io(&path, "create the Parquet file"))?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            // `chunk_by` yields no empty group, so the first chunk is there.
            let mut chunks = group.chunks(ROW_GROUP_ROWS);
            let frame = names.frame(p, &Rows::Picked(chunks.next().unwrap_or_default()))?;
            let mut w = ParquetWriter::new(&mut out).with_compression(compression.parquet()).batched(frame.schema())?;
            w.write_batch(&frame)?;
            for rows in chunks {
                w.write_batch(&names.frame(p, &Rows::Picked(rows))?)?;
            }
            w.finish()?;
            out.flush().map_err(io(&path, "write the Parquet file"))?;
            done.files += 1;
            done.rows += group.len();
            partitions.insert(sub);
        }
        part_no += 1;
    }
    done.partitions = partitions.len();
    Ok(done)
}

/// An I/O error of `path` while doing `what`.
fn io(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> ExportError {
    let path = path.to_owned();
    move |source| ExportError::Io { path, what, source }
}

/// A partition value as Hive writes it in a path: `%XX` for every byte outside
/// `[A-Za-z0-9._-]`, so `/`, `=` and `%` cannot split or forge a partition.
fn hive_escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn even(p: &Probes) -> Result<(), ExportError> {
    match p.uneven_column(Fields::All) {
        None => Ok(()),
        Some((name, len)) => Err(ExportError::Usage(format!(
            "probe column {name} has {len} values for {} records (ingested without every column?)",
            p.len()
        ))),
    }
}

/// Which records of a [`Probes`] a row group holds.
enum Rows<'a> {
    /// `[a, b)`.
    Span(usize, usize),
    /// These, in this order.
    Picked(&'a [usize]),
}

impl Rows<'_> {
    fn len(&self) -> usize {
        match self {
            Rows::Span(a, b) => b - a,
            Rows::Picked(ix) => ix.len(),
        }
    }

    fn pick<T: Copy>(&self, v: &[T]) -> Vec<T> {
        match self {
            Rows::Span(a, b) => v[*a..*b].to_vec(),
            Rows::Picked(ix) => ix.iter().map(|&i| v[i]).collect(),
        }
    }

    fn indices(&self) -> Box<dyn Iterator<Item = usize> + '_> {
        match self {
            Rows::Span(a, b) => Box::new(*a..*b),
            Rows::Picked(ix) => Box::new(ix.iter().copied()),
        }
    }
}

/// The names an export's rows point into, and how a row group is built from them.
struct Names {
    rnics: usize,
    services: usize,
    window_ns: u64,
    rnic_names: StringChunked,
    tor_names: StringChunked,
    /// ToR index of each RNIC index (the last RNIC index is "unknown").
    tor_of_rnic: Vec<IdxSize>,
    unknown: IdxSize,
    class_names: StringChunked,
    service_names: StringChunked,
    /// Per service id, the values of [`SERVICE_COLUMNS`] (one small array each: rows gather);
    /// empty without services.
    service_columns: Vec<Column>,
}

impl Names {
    fn new(rnics: &[Rnic], services: &[Service], window_ns: u64) -> Result<Names, ExportError> {
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
        let cols: Vec<(String, ServiceColumns)> =
            services.iter().map(|s| (s.label(rnics), ServiceColumns::of(s, rnics))).collect();
        let text = |i: usize, f: fn(&(String, ServiceColumns)) -> &str| {
            StringChunked::from_iter_values(SERVICE_COLUMNS[i].into(), cols.iter().map(f)).into_column()
        };
        let number = |i: usize, f: fn(&ServiceColumns) -> u32| {
            UInt32Chunked::from_iter_values(SERVICE_COLUMNS[i].into(), cols.iter().map(|c| f(&c.1))).into_column()
        };
        // Written only when the input defines a service: a mesh-only export (the usual one)
        // would spend ~10% of its time writing nine columns of nulls (docs/design/analysis.md#export).
        let service_columns = if cols.is_empty() {
            Vec::new()
        } else {
            vec![
                text(0, |c| &c.0),
                text(1, |c| &c.1.prober),
                text(2, |c| &c.1.remote),
                text(3, |c| c.1.remote_resolution),
                number(4, |c| c.pid),
                text(5, |c| &c.1.comm),
                number(6, |c| c.local_qpn),
                number(7, |c| c.remote_qpn),
                number(8, |c| c.flow_label),
            ]
        };
        Ok(Names {
            rnics: rnics.len(),
            services: services.len(),
            window_ns,
            rnic_names,
            tor_names,
            tor_of_rnic,
            unknown,
            class_names: StringChunked::from_iter_values("class".into(), Class::ALL.iter().map(|c| c.name())),
            service_names: StringChunked::from_iter_values("service".into(), services.iter().map(|s| s.name.as_str())),
            service_columns,
        })
    }

    fn rnic_idx(&self, id: u32) -> IdxSize {
        if (id as usize) < self.rnics { id as IdxSize } else { self.unknown }
    }

    /// The ToR name of the RNIC with fleet id `id`.
    fn tor_name(&self, id: u32) -> &str {
        let t = self.tor_of_rnic[self.rnic_idx(id) as usize] as usize;
        self.tor_names.get(t).unwrap_or(NO_TOR)
    }

    fn frame(&self, p: &Probes, rows: &Rows<'_>) -> PolarsResult<DataFrame> {
        let rnic_idx = |ids: &[u32]| -> Vec<IdxSize> { rows.pick(ids).into_iter().map(|i| self.rnic_idx(i)).collect() };
        let (prober, target) = (rnic_idx(&p.prober), rnic_idx(&p.target));
        let tor_idx = |idx: &[IdxSize]| -> IdxCa {
            IdxCa::from_vec("idx".into(), idx.iter().map(|&i| self.tor_of_rnic[i as usize]).collect())
        };
        let (prober_tor, target_tor) = (tor_idx(&prober), tor_idx(&target));
        let (prober, target) = (IdxCa::from_vec("idx".into(), prober), IdxCa::from_vec("idx".into(), target));
        let names = |ca: &StringChunked, idx: &IdxCa, name: &str| -> PolarsResult<Column> {
            Ok(ca.take(idx)?.with_name(name.into()).into_column())
        };
        let class = IdxCa::from_vec(
            "idx".into(),
            rows.indices().map(|i| Class::of(p.outcome[i], p.arrived[i]) as IdxSize).collect(),
        );
        let service = IdxCa::from_iter_options(
            "idx".into(),
            rows.indices().map(|i| {
                let s = p.service_of(i);
                (s != NO_SERVICE && (s as usize) < self.services).then_some(s as IdxSize)
            }),
        );
        let t1 = rows.pick(&p.t1_unix_ns);
        let window_ns = self.window_ns;
        let window: Vec<u64> = t1.iter().map(|t| t / window_ns * window_ns).collect();
        let mut columns = vec![
            UInt64Chunked::from_vec("t1_unix_ns".into(), t1).into_column(),
            UInt64Chunked::from_vec("window_start_ns".into(), window).into_column(),
            names(&self.rnic_names, &prober, "prober")?,
            names(&self.tor_names, &prober_tor, "prober_tor")?,
            names(&self.rnic_names, &target, "target")?,
            names(&self.tor_names, &target_tor, "target_tor")?,
            UInt32Chunked::from_vec("prober_id".into(), rows.pick(&p.prober)).into_column(),
            UInt32Chunked::from_vec("target_id".into(), rows.pick(&p.target)).into_column(),
            UInt8Chunked::from_vec("kind".into(), rows.pick(&p.kind)).into_column(),
            UInt8Chunked::from_vec("outcome".into(), rows.pick(&p.outcome)).into_column(),
            UInt8Chunked::from_vec("arrived".into(), rows.pick(&p.arrived)).into_column(),
            UInt32Chunked::from_vec("flow_label".into(), rows.pick(&p.flow_label)).into_column(),
            UInt32Chunked::from_vec("responder_epoch".into(), rows.pick(&p.responder_epoch)).into_column(),
            Int32Chunked::from_vec("network_rtt_ns".into(), rows.pick(&p.network_rtt_ns)).into_column(),
            Int32Chunked::from_vec("prober_delay_ns".into(), rows.pick(&p.prober_delay_ns)).into_column(),
            Int32Chunked::from_vec("responder_delay_ns".into(), rows.pick(&p.responder_delay_ns)).into_column(),
            UInt8Chunked::from_vec("ts_source".into(), rows.pick(&p.ts_source)).into_column(),
            names(&self.class_names, &class, "class")?,
            names(&self.service_names, &service, "service")?,
        ];
        for c in &self.service_columns {
            columns.push(c.take(&service)?);
        }
        DataFrame::new(rows.len(), columns)
    }
}
