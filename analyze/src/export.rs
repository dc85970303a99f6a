//! `analyze export`: the raw probe table as one Parquet file, for DuckDB, Spark or pandas users.
//!
//! One row per probe record, with the names of prober and target and of their ToRs next to
//! the fleet ids of this export, and the start of the record's window. The raw bytes
//! (`outcome`, `arrived`, `ts_source`) are kept as written; `class` names what the record
//! counts as in `analyze report` ([`crate::probe::Class`]: ok, lost, partial, invalid,
//! refused, local_drop, unknown), so SQL over the export need not re-derive the rules. The table is written in
//! row groups of [`ROW_GROUP_ROWS`], each built from the ingested columns just before it is
//! written; `analyze export` ingests a range of windows at a time ([`write_parquet_parts`]). A
//! range's row groups are built, encoded and compressed on every core ([`Layout`]), a batch of
//! two per core at a time, and written in order by one thread: polars' own writer encodes and
//! compresses each page on the writing thread, which held an export to one core's speed. Memory
//! stays at one range plus two row groups per core whatever the input size. Rows are in the
//! order of the ranges (time), and within one range of the files.
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
use polars_parquet::parquet::error::ParquetError;
use polars_parquet::write::{
    CompressedPage, Compressor, Encoding, ParquetType, StatisticsOptions, WriteOptions, array_to_columns,
};
use rayon::prelude::*;

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
    /// The export failed, and the file it had begun could not be removed.
    #[error("{first}; {} could not be removed ({source}): delete it, it has no footer and no reader can use it", path.display())]
    LeftBehind {
        /// Why the export failed.
        first: Box<ExportError>,
        /// The file cut short.
        path: PathBuf,
        /// Why it could not be removed.
        source: std::io::Error,
    },
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
/// `services` name their ids. Returns the rows written. An export that fails once the file is
/// created removes it: a file cut short would have no footer, and no reader could use it.
pub fn write_parquet_parts<P: std::borrow::Borrow<Probes>>(
    rnics: &[Rnic],
    services: &[Service],
    path: &Path,
    window_ns: u64,
    compression: Compression,
    parts: impl FnMut() -> Option<P>,
) -> Result<usize, ExportError> {
    let names = Names::new(rnics, services, window_ns)?;
    let file = std::fs::File::create(path).map_err(io(path, "create the Parquet file"))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let written = write_to(&names, &mut out, compression, parts)
        .and_then(|n| out.flush().map(|()| n).map_err(io(path, "write the Parquet file")));
    let Err(first) = written else { return written };
    drop(out);
    match std::fs::remove_file(path) {
        Ok(()) => Err(first),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(first),
        Err(source) => Err(ExportError::LeftBehind { first: Box::new(first), path: path.to_owned(), source }),
    }
}

/// [`write_parquet_parts`] into `out`, unflushed.
fn write_to<P: std::borrow::Borrow<Probes>>(
    names: &Names,
    out: &mut std::io::BufWriter<std::fs::File>,
    compression: Compression,
    mut parts: impl FnMut() -> Option<P>,
) -> Result<usize, ExportError> {
    let (mut writer, layout) = names.writer(out, compression)?;
    let threads = rayon::current_num_threads().max(1);
    // Held to one thread (`RAYON_NUM_THREADS=1`), the row groups are written where they are
    // encoded, in turn: a writing thread would be a second core the setting did not give.
    // Otherwise a thread of its own writes them in order while the cores encode the next ones:
    // written between batches, every core but the writing one waited for the writes.
    let n = if threads == 1 {
        let n = encode_parts(names, &layout, 2, &mut parts, &mut |g| Ok(writer.write_row_group(g.rows, &g.pages)?))?;
        writer.finish()?;
        n
    } else {
        // Two row groups per core encoded at a time, and as many waiting to be written: what is
        // held is bounded by the cores, not the range.
        let batch = 2 * threads;
        std::thread::scope(|s| {
            // `None` once every row group is sent: only then does the footer go out, so an
            // export that failed half way leaves no file that reads as a whole one.
            let (tx, rx) = std::sync::mpsc::sync_channel::<Option<Encoded>>(batch);
            let writing = s.spawn(move || -> Result<(), ExportError> {
                while let Ok(g) = rx.recv() {
                    match g {
                        Some(g) => writer.write_row_group(g.rows, &g.pages)?,
                        None => {
                            writer.finish()?;
                            break;
                        }
                    }
                }
                Ok(())
            });
            // A send fails only once the writing thread has stopped on an error: its join
            // gives that error, so what the send returns is never the one reported.
            let send = |g: Option<Encoded>| {
                tx.send(g).map_err(|_| ExportError::Usage("the thread writing the Parquet file stopped".into()))
            };
            let encoded = encode_parts(names, &layout, batch, &mut parts, &mut |g| send(Some(g)))
                .and_then(|n| send(None).map(|()| n));
            drop(tx);
            writing.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            encoded
        })?
    };
    Ok(n)
}

/// Encodes the row groups of every part `parts` yields, `batch` at a time on every core, and
/// hands them to `put` in order; returns the rows.
fn encode_parts<P: std::borrow::Borrow<Probes>>(
    names: &Names,
    layout: &Layout,
    batch: usize,
    parts: &mut impl FnMut() -> Option<P>,
    put: &mut dyn FnMut(Encoded) -> Result<(), ExportError>,
) -> Result<usize, ExportError> {
    let mut n = 0;
    while let Some(part) = parts() {
        let p = part.borrow();
        even(p)?;
        let spans: Vec<(usize, usize)> =
            (0..p.len()).step_by(ROW_GROUP_ROWS).map(|a| (a, (a + ROW_GROUP_ROWS).min(p.len()))).collect();
        for spans in spans.chunks(batch) {
            let groups: Vec<Result<Encoded, ExportError>> =
                spans.par_iter().map(|&(a, b)| layout.encode(&names.columns(p, &Rows::Span(a, b)))).collect();
            for g in groups {
                put(g?)?;
            }
        }
        n += p.len();
    }
    Ok(n)
}

/// A row group's column chunks, encoded and compressed, ready to be written.
struct Encoded {
    rows: u64,
    /// Per leaf column, its pages.
    pages: Vec<Vec<CompressedPage>>,
}

/// How the writer of one file lays its row groups out: what [`Layout::encode`] needs to build
/// them off the writing thread, taken from the writer itself so the two cannot disagree.
struct Layout {
    fields: Vec<ParquetType>,
    encodings: Vec<Vec<Encoding>>,
    options: WriteOptions,
}

impl Layout {
    /// Encodes and compresses a row group's `columns` on the calling thread.
    fn encode(&self, columns: &GroupColumns) -> Result<Encoded, ExportError> {
        if columns.len() != self.fields.len() {
            return Err(
                polars_err!(ShapeMismatch: "export: {} columns for a schema of {}", columns.len(), self.fields.len())
                    .into(),
            );
        }
        let mut pages = Vec::with_capacity(self.fields.len());
        for (i, (ty, encoding)) in self.fields.iter().zip(&self.encodings).enumerate() {
            let col = columns.column(i)?;
            for column in array_to_columns(&col.array, ty.clone(), self.options, encoding)? {
                // The compressor takes parquet's errors; an encoding error is kept as polars gave
                // it (the pages stop there) and returned once the compressor is done.
                let mut failed: Option<PolarsError> = None;
                let column = column.map_while(|page| page.map_err(|e| failed = Some(e)).ok().map(Ok));
                let compressed: Result<Vec<CompressedPage>, ParquetError> =
                    Compressor::new_from_vec(column, self.options.compression, Vec::new()).collect();
                if let Some(e) = failed {
                    return Err(e.into());
                }
                pages.push(compressed.map_err(PolarsError::from)?);
            }
        }
        Ok(Encoded { rows: columns.rows() as u64, pages })
    }
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
        order.par_sort_by_key(|&i| key(i));
        let mut groups = Vec::new();
        for group in order.chunk_by(|&a, &b| key(a) == key(b)) {
            let first = group[0];
            let c = rocemesh_formats::time::civil_utc((p.t1_unix_ns[first] / 1_000_000_000) as i64);
            let sub = dir
                .join(format!("date={:04}-{:02}-{:02}", c.year, c.month, c.day))
                .join(format!("hour={:02}", c.hour))
                .join(format!("tor={}", hive_escape(names.tor_name(p.prober[first]))));
            std::fs::create_dir_all(&sub).map_err(io(&sub, "create the partition directory"))?;
            groups.push((sub, group));
        }
        // A file per partition, the partitions on every core: each file is written by the
        // thread that encodes it, so no order is to be kept between them.
        let written: Vec<PathBuf> = groups
            .into_par_iter()
            .map(|(sub, group)| {
                let path = sub.join(format!("part-{part_no:05}.parquet"));
                let file = std::fs::File::create(&path).map_err(io(&path, "create the Parquet file"))?;
                let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
                let (mut w, layout) = names.writer(&mut out, compression)?;
                for rows in group.chunks(ROW_GROUP_ROWS) {
                    let g = layout.encode(&names.columns(p, &Rows::Picked(rows)))?;
                    w.write_row_group(g.rows, &g.pages)?;
                }
                w.finish()?;
                out.flush().map_err(io(&path, "write the Parquet file"))?;
                Ok(sub)
            })
            .collect::<Result<_, ExportError>>()?;
        for sub in written {
            partitions.insert(sub);
            done.files += 1;
        }
        done.rows += p.len();
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
    fn pick<T: Copy>(&self, v: &[T]) -> Vec<T> {
        match self {
            Rows::Span(a, b) => v[*a..*b].to_vec(),
            Rows::Picked(ix) => ix.iter().map(|&i| v[i]).collect(),
        }
    }

    /// [`Rows::pick`] for reading only: a span is borrowed, not copied.
    fn read<'v, T: Copy>(&self, v: &'v [T]) -> std::borrow::Cow<'v, [T]> {
        match self {
            Rows::Span(a, b) => std::borrow::Cow::Borrowed(&v[*a..*b]),
            Rows::Picked(_) => std::borrow::Cow::Owned(self.pick(v)),
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

    /// A Parquet writer over `out` for the row groups [`Names::columns`] builds, and the
    /// layout to encode them by.
    fn writer<W: std::io::Write>(
        &self,
        out: W,
        compression: Compression,
    ) -> Result<(polars::io::parquet::write::BatchedWriter<W>, Layout), ExportError> {
        let schema = self.schema()?;
        let mut writer = ParquetWriter::new(out)
            .with_compression(compression.parquet())
            .with_statistics(StatisticsOptions::default())
            .batched(&schema)?;
        // The writer's own options: row groups encoded here match those it would encode.
        let options = match writer.get_writer().lock() {
            Ok(w) => w.options(),
            Err(poisoned) => poisoned.into_inner().options(),
        };
        let mut encodings = get_encodings(&schema.to_arrow(CompatLevel::newest())).to_vec();
        // Send times as plain values: the writer would estimate their distinct count in every
        // row group and, where they repeat, keep a dictionary that compresses worse (the bench's
        // 10^8 records: 334 MB plain against 414 MB, 92 of 98 row groups in a dictionary).
        if let Some(i) = schema.index_of("t1_unix_ns") {
            encodings[i] = vec![Encoding::Plain];
        }
        let layout = Layout { fields: writer.parquet_schema().fields().to_vec(), encodings, options };
        Ok((writer, layout))
    }

    /// The columns of a row group holding `rows` of `p`, in the file's order, each built when
    /// [`GroupColumns::column`] is asked for it.
    fn columns<'a>(&'a self, p: &'a Probes, rows: &'a Rows<'a>) -> GroupColumns<'a> {
        let rnic_idx = |ids: &[u32]| -> Vec<IdxSize> { rows.pick(ids).into_iter().map(|i| self.rnic_idx(i)).collect() };
        let service = rows
            .indices()
            .map(|i| {
                let s = p.service_of(i);
                (s != NO_SERVICE && (s as usize) < self.services).then_some(s as IdxSize)
            })
            .collect();
        GroupColumns { names: self, p, rows, prober: rnic_idx(&p.prober), target: rnic_idx(&p.target), service }
    }

    /// The schema of every row group: [`Names::columns`]' names and types.
    fn schema(&self) -> PolarsResult<Schema> {
        let (p, rows) = (Probes::default(), Rows::Span(0, 0));
        let empty = self.columns(&p, &rows);
        (0..empty.len()).map(|i| empty.column(i).map(|c| Field::new(c.name.into(), c.dtype))).collect()
    }
}

/// A row group's columns, built one at a time as they are encoded: built all at once, a row
/// group of [`ROW_GROUP_ROWS`] held 70-100 MiB on each core encoding one. What several columns
/// read is kept: the rows' RNIC indexes and services.
struct GroupColumns<'a> {
    names: &'a Names,
    p: &'a Probes,
    rows: &'a Rows<'a>,
    prober: Vec<IdxSize>,
    target: Vec<IdxSize>,
    service: Vec<Option<IdxSize>>,
}

impl GroupColumns<'_> {
    /// Columns before the services' own ([`SERVICE_COLUMNS`]).
    const PROBE_COLUMNS: usize = 19;

    fn len(&self) -> usize {
        Self::PROBE_COLUMNS + self.names.service_columns.len()
    }

    /// Rows.
    fn rows(&self) -> usize {
        self.prober.len()
    }

    /// Column `i` of the file's order. Names (of RNICs, ToRs, classes, services) are dictionary
    /// arrays over the distinct names, keyed by the ids the rows already carry: polars' writer
    /// would otherwise hash every string of a row group to find the dictionary Parquet stores
    /// them by (about a quarter of an export's CPU).
    fn column(&self, i: usize) -> PolarsResult<Col> {
        let (names, p, rows, n) = (self.names, self.p, self.rows, self.rows());
        let rnic = || names.rnic_names.clone().into_series();
        let tor = || names.tor_names.clone().into_series();
        let some = |i: &IdxSize| Some(*i);
        let tor_of = |i: &IdxSize| Some(names.tor_of_rnic[*i as usize]);
        Ok(match i {
            0 => Col::plain("t1_unix_ns", DataType::UInt64, rows.pick(&p.t1_unix_ns)),
            1 => windows(&rows.read(&p.t1_unix_ns), names.window_ns)?,
            2 => Col::names("prober", &rnic(), self.prober.iter().map(some), n)?,
            3 => Col::names("prober_tor", &tor(), self.prober.iter().map(tor_of), n)?,
            4 => Col::names("target", &rnic(), self.target.iter().map(some), n)?,
            5 => Col::names("target_tor", &tor(), self.target.iter().map(tor_of), n)?,
            6 => Col::ints("prober_id", DataType::UInt32, rows.pick(&p.prober))?,
            7 => Col::ints("target_id", DataType::UInt32, rows.pick(&p.target))?,
            8 => Col::plain("kind", DataType::UInt8, rows.pick(&p.kind)),
            9 => Col::plain("outcome", DataType::UInt8, rows.pick(&p.outcome)),
            10 => Col::plain("arrived", DataType::UInt8, rows.pick(&p.arrived)),
            11 => Col::ints("flow_label", DataType::UInt32, rows.pick(&p.flow_label))?,
            12 => Col::ints("responder_epoch", DataType::UInt32, rows.pick(&p.responder_epoch))?,
            13 => Col::ints("network_rtt_ns", DataType::Int32, rows.pick(&p.network_rtt_ns))?,
            14 => Col::ints("prober_delay_ns", DataType::Int32, rows.pick(&p.prober_delay_ns))?,
            15 => Col::ints("responder_delay_ns", DataType::Int32, rows.pick(&p.responder_delay_ns))?,
            16 => Col::plain("ts_source", DataType::UInt8, rows.pick(&p.ts_source)),
            17 => {
                let class = rows.indices().map(|i| Some(Class::of(p.outcome[i], p.arrived[i]) as IdxSize));
                Col::names("class", &names.class_names.clone().into_series(), class, n)?
            }
            18 => Col::names("service", &names.service_names.clone().into_series(), self.service.iter().copied(), n)?,
            i => {
                let k = i - Self::PROBE_COLUMNS;
                let (Some(name), Some(values)) = (SERVICE_COLUMNS.get(k), names.service_columns.get(k)) else {
                    polars_bail!(OutOfBounds: "export: column {i} of {}", self.len());
                };
                Col::names(name, values.as_materialized_series(), self.service.iter().copied(), n)?
            }
        })
    }
}

/// `window_start_ns` of rows sent at `t1`: a dictionary of the windows they start, keyed by
/// the window's place after the first, unless the row group spans more windows than both its
/// rows and 1,024 (a range spans a few); plain values then. polars' writer would hash every row's start
/// to find the same dictionary.
fn windows(t1: &[u64], window_ns: u64) -> PolarsResult<Col> {
    let first = t1.iter().min().map_or(0, |t| t / window_ns);
    let last = t1.iter().max().map_or(0, |t| t / window_ns);
    let span = (last - first) as usize + 1;
    if span > t1.len().max(1024) {
        let starts = t1.iter().map(|t| t / window_ns * window_ns).collect();
        return Ok(Col::plain("window_start_ns", DataType::UInt64, starts));
    }
    let starts =
        UInt64Chunked::from_iter_values("window_start_ns".into(), (0..span as u64).map(|i| (first + i) * window_ns));
    let keys = t1.iter().map(|t| Some((t / window_ns - first) as IdxSize));
    Col::names("window_start_ns", &starts.into_series(), keys, t1.len())
}

/// One column of a row group: its name and type in the schema, and the Arrow array its pages
/// are encoded from.
struct Col {
    name: &'static str,
    dtype: DataType,
    array: ArrayRef,
}

impl Col {
    fn plain<T: polars_arrow::types::NativeType>(name: &'static str, dtype: DataType, values: Vec<T>) -> Col {
        Col { name, dtype, array: polars_arrow::array::PrimitiveArray::from_vec(values).boxed() }
    }

    /// 32-bit `values` stored as polars' writer stores them, without its hash map: values
    /// spanning at most 2^16 are left to the writer (it keeps a bitmap over the span, cheaper
    /// than any map); wider ones become a dictionary of the distinct values in first-use order,
    /// as the writer's own dictionary holds them, unless more than 3 in 4 values of a row group
    /// over 128 rows are distinct (plain values then, as the writer decides from its estimate of
    /// that share). The writer's map took a fifth of an export's CPU, the delays' most of it.
    fn ints<T>(name: &'static str, dtype: DataType, values: Vec<T>) -> PolarsResult<Col>
    where
        T: polars_arrow::types::NativeType + Into<i64>,
    {
        use polars_arrow::array::{DictionaryArray, PrimitiveArray};
        use polars_arrow::datatypes::{ArrowDataType, IntegerType};
        let (lo, hi) = values.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &v| (lo.min(v.into()), hi.max(v.into())));
        if values.is_empty() || hi - lo <= i64::from(u16::MAX) {
            return Ok(Col::plain(name, dtype, values));
        }
        let most = if values.len() > 128 { values.len() * 3 / 4 } else { values.len() };
        let mut distinct = Distinct::new();
        let mut keys: Vec<u32> = Vec::with_capacity(values.len());
        for &v in &values {
            keys.push(distinct.key(v));
            if distinct.values.len() > most {
                return Ok(Col::plain(name, dtype, values));
            }
        }
        let values = PrimitiveArray::from_vec(distinct.values).boxed();
        let arrow = ArrowDataType::Dictionary(IntegerType::UInt32, Box::new(values.dtype().clone()), false);
        let keys = PrimitiveArray::<u32>::from_vec(keys);
        Ok(Col { name, dtype, array: DictionaryArray::try_new(arrow, keys, values)?.boxed() })
    }

    /// `values` picked by the `rows` `keys` (`None`: null), as a dictionary of the values the
    /// keys use, each once, so that Parquet's dictionary page (and the min and max of the column
    /// chunk's statistics, drawn from it) holds only what the row group has.
    fn names(
        name: &'static str,
        values: &Series,
        keys: impl Iterator<Item = Option<IdxSize>>,
        rows: usize,
    ) -> PolarsResult<Col> {
        use polars_arrow::array::{DictionaryArray, PrimitiveArray};
        use polars_arrow::datatypes::{ArrowDataType, IntegerType};
        let dtype = values.dtype().clone();
        let mut slot = vec![IdxSize::MAX; values.len()];
        let mut used: Vec<IdxSize> = Vec::new();
        let mut compact: Vec<u32> = Vec::with_capacity(rows);
        let mut valid = polars_arrow::bitmap::MutableBitmap::with_capacity(rows);
        for k in keys {
            let Some(k) = k else {
                compact.push(0);
                valid.push(false);
                continue;
            };
            let Some(s) = slot.get_mut(k as usize) else {
                polars_bail!(OutOfBounds: "export: {name} key {k} past the {} names", values.len());
            };
            if *s == IdxSize::MAX {
                *s = used.len() as IdxSize;
                used.push(k);
            }
            compact.push(*s);
            valid.push(true);
        }
        let validity = (valid.unset_bits() > 0).then(|| valid.into());
        let keys = PrimitiveArray::<u32>::new(ArrowDataType::UInt32, compact.into(), validity);
        let values = values.take(&IdxCa::from_vec("idx".into(), used))?.rechunk().to_arrow(0, CompatLevel::newest());
        let arrow = ArrowDataType::Dictionary(IntegerType::UInt32, Box::new(values.dtype().clone()), false);
        let array = DictionaryArray::try_new(arrow, keys, values)?.boxed();
        Ok(Col { name, dtype, array })
    }
}

/// The distinct values of a column chunk in first-use order, and each value's place among them:
/// open addressing (linear probing, multiplicative hash) over their places, grown at half load,
/// so that the few thousand distinct delays of a row group stay in L2.
struct Distinct<T> {
    values: Vec<T>,
    /// 1 + a value's place, 0 where free; a power of two long.
    slots: Vec<u32>,
}

impl<T: Copy + Into<i64>> Distinct<T> {
    fn new() -> Distinct<T> {
        Distinct { values: Vec::new(), slots: vec![0; 1 << 12] }
    }

    fn slot(slots: &[u32], values: &[T], v: i64) -> usize {
        let mask = slots.len() - 1;
        let bits = slots.len().trailing_zeros();
        let mut i = ((v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize;
        while slots[i] != 0 && values[slots[i] as usize - 1].into() != v {
            i = (i + 1) & mask;
        }
        i
    }

    /// `v`'s place, added last if it is new.
    fn key(&mut self, v: T) -> u32 {
        let i = Self::slot(&self.slots, &self.values, v.into());
        if self.slots[i] != 0 {
            return self.slots[i] - 1;
        }
        self.values.push(v);
        self.slots[i] = self.values.len() as u32;
        if 2 * self.values.len() > self.slots.len() {
            let mut slots = vec![0u32; self.slots.len() * 2];
            for (k, &x) in self.values.iter().enumerate() {
                let j = Self::slot(&slots, &self.values, x.into());
                slots[j] = k as u32 + 1;
            }
            self.slots = slots;
        }
        self.values.len() as u32 - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polars_arrow::array::{Array, PrimitiveArray};
    use polars_arrow::datatypes::{ArrowDataType, Field as ArrowField};
    use polars_parquet::parquet::page::Page;
    use polars_parquet::write::to_parquet_type;

    /// `n` ok probes from h0 to h1, a millisecond apart.
    fn probes(n: usize) -> Probes {
        Probes {
            t1_unix_ns: (0..n as u64).map(|i| 1_700_000_000_000_000_000 + i * 1_000_000).collect(),
            network_rtt_ns: vec![4_000; n],
            prober_delay_ns: vec![2_000; n],
            responder_delay_ns: vec![1_000; n],
            prober: vec![0; n],
            target: vec![1; n],
            flow_label: vec![7; n],
            responder_epoch: vec![1; n],
            kind: vec![0; n],
            outcome: vec![0; n],
            arrived: vec![0b1111; n],
            ts_source: vec![0; n],
            service: Vec::new(),
            index: Vec::new(),
        }
    }

    /// An export that fails half way, on a range whose columns differ in length after a good
    /// range went to the writer, leaves no file behind that could pass for a whole export,
    /// whether the row groups are written inline (one thread) or by a thread of their own; the
    /// same parts without the bad one make a file.
    #[test]
    fn a_failed_export_leaves_no_file() {
        let rnics: Vec<Rnic> =
            (0..2).map(|i| Rnic { name: format!("h{i}/d0"), tor: "t0".into(), host: format!("h{i}") }).collect();
        let dir = tempfile::tempdir().unwrap();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let path = dir.path().join(format!("probes-{threads}.parquet"));
            let export = |bad: bool| {
                let mut parts = vec![probes(3_000), probes(2_000)];
                if bad {
                    parts[1].network_rtt_ns.pop();
                }
                let mut parts = parts.into_iter();
                pool.install(|| {
                    write_parquet_parts(&rnics, &[], &path, 30_000_000_000, Compression::Zstd, || parts.next())
                })
            };
            assert_eq!(export(false).unwrap(), 5_000, "{threads} threads");
            assert!(path.exists());
            let e = export(true).expect_err("uneven columns");
            assert!(e.to_string().contains("network_rtt_ns"), "{threads} threads: {e}");
            assert!(!path.exists(), "{threads} threads: a cut-short file was left at {}", path.display());
        }
    }

    /// The pages polars' writer makes of `array` as a column of `dtype`: dictionary page
    /// first, if any, then data pages, each as (is a dictionary, bytes).
    fn pages(array: &dyn Array, dtype: ArrowDataType) -> Vec<(bool, Vec<u8>)> {
        let ty = to_parquet_type(&ArrowField::new("c".into(), dtype, false)).expect("type");
        let options = WriteOptions {
            statistics: StatisticsOptions::default(),
            compression: polars_parquet::write::CompressionOptions::Uncompressed,
            version: polars_parquet::write::Version::V1,
            data_page_size: None,
        };
        let mut out = Vec::new();
        for column in array_to_columns(array, ty, options, &[Encoding::RleDictionary]).expect("columns") {
            for page in column {
                match page.expect("page") {
                    Page::Data(p) => out.push((false, p.buffer().to_vec())),
                    Page::Dict(p) => out.push((true, p.buffer.to_vec())),
                }
            }
        }
        out
    }

    /// `Col::ints` gives the writer what makes the pages it makes of the plain values itself
    /// (a dictionary in the same order, or plain values), on both sides of each of its choices:
    /// a span within 2^16 or past it, distinct values below and above 3 in 4, 128 rows or more.
    #[test]
    fn ints_make_the_pages_the_writer_makes_of_plain_values() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // (case, values, a dictionary from `Col::ints`, a dictionary page from the writer).
        let mut cases: Vec<(&str, Vec<i32>, bool, bool)> = Vec::new();
        // Delays: a few thousand distinct values over a span past 2^16, the tail rare.
        let delays: Vec<i32> =
            (0..100_000).map(|_| (next() % 4_000) as i32 + if next() % 50 == 0 { 200_000 } else { 3_000 }).collect();
        cases.push(("wide, repeating", delays, true, true));
        // Within 2^16: left to the writer, whose dictionary is then sorted, not in first-use order.
        cases.push(("narrow", (0..10_000).map(|_| (next() % 600) as i32 * 100).collect(), false, true));
        // 70% and 80% distinct values, spread past 2^16: either side of the 3 in 4.
        for (name, share, dictionary) in [("70% distinct", 70, true), ("80% distinct", 80, false)] {
            let v: Vec<i32> =
                (0..10_000).map(|i| if i % 100 < share { i * 1_000 } else { ((next() % 8) * 1_000) as i32 }).collect();
            cases.push((name, v, dictionary, dictionary));
        }
        cases.push(("128 distinct", (0..128).map(|i| i * 100_000).collect(), true, true));
        cases.push(("negative", (0..5_000).map(|_| -((next() % 100) as i32) * 10_000).collect(), true, true));
        cases.push(("empty", Vec::new(), false, true));
        for (name, values, ours, writers) in cases {
            let want = pages(&PrimitiveArray::from_vec(values.clone()), ArrowDataType::Int32);
            let col = Col::ints("c", DataType::Int32, values).expect("ints");
            let is_dictionary = matches!(col.array.dtype(), ArrowDataType::Dictionary(..));
            assert_eq!(is_dictionary, ours, "{name}");
            assert_eq!(pages(col.array.as_ref(), ArrowDataType::Int32), want, "{name}");
            // What the writer chose from the plain values: a dictionary page or none.
            assert_eq!(want.first().is_some_and(|p| p.0), writers, "{name}: the writer chose otherwise");
        }
        let epochs: Vec<u32> = (0..20_000).map(|i| [7, 3_000_000_000, 4_000_000_000][i % 3]).collect();
        let want = pages(&PrimitiveArray::from_vec(epochs.clone()), ArrowDataType::UInt32);
        let col = Col::ints("c", DataType::UInt32, epochs).expect("ints");
        assert!(matches!(col.array.dtype(), ArrowDataType::Dictionary(..)));
        assert_eq!(pages(col.array.as_ref(), ArrowDataType::UInt32), want);
    }
}
