//! `bench formats`: the segment store's write, seal and read paths against their bare baselines.
//!
//! Every figure is single-threaded (records/s on one core) and printed beside the baseline
//! measured in the same run on the same records: memcpy of the same bytes, and rkyv
//! serialisation alone. It also measures the row layout the column layout was chosen over.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use rkyv::rancor;
use rkyv::ser::allocator::Arena;
use rkyv::util::AlignedVec;
use rocemesh_formats::record::{ArchivedProbeRecord, EndpointRole, ProbeColumns, ProbeRecord};
use rocemesh_formats::segment::{
    SealedSummary, SegmentReader, SegmentWriter, SummaryRead, WriteMode, WriterConfig, WriterIdentity, read_summary,
    seal,
};

use crate::synth::ShardStream;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Records to write.
    pub records: usize,
    /// Records per chunk.
    pub chunk_records: usize,
    /// Size of each open segment.
    pub segment_bytes: u64,
    /// zstd level for sealing.
    pub zstd_level: i32,
    /// Keep the sealed segments here instead of a temporary directory.
    pub keep: Option<PathBuf>,
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Line {
    /// What was measured.
    pub what: String,
    /// Records per second (or another rate, see `unit`).
    pub value: f64,
    /// Unit of `value`.
    pub unit: &'static str,
    /// Free-text comparison with the baseline.
    pub note: String,
}

/// The measurements, in report order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Lines.
    pub lines: Vec<Line>,
    /// Where the sealed segments are (when kept).
    pub kept: Option<PathBuf>,
}

impl Report {
    fn push(&mut self, what: &str, value: f64, unit: &'static str, note: String) {
        self.lines.push(Line { what: what.into(), value, unit, note });
    }

    /// The value of the line whose `what` starts with `prefix`.
    pub fn value(&self, prefix: &str) -> Option<f64> {
        self.lines.iter().find(|l| l.what.starts_with(prefix)).map(|l| l.value)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for l in &self.lines {
            let v =
                if l.unit == "records/s" { format!("{:>8.1} M", l.value / 1e6) } else { format!("{:>10.2}", l.value) };
            writeln!(f, "{:<52} {v} {:<10} {}", l.what, l.unit, l.note)?;
        }
        Ok(())
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    n as f64 / secs
}

/// Best of `runs` timings of `f`, in seconds.
fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Run the benchmark.
pub fn run(opt: &Options) -> Result<Report> {
    let n = opt.records;
    let records = ShardStream::new(42, 1_700_000_000_000_000_000).take_vec(n);
    let mut report = Report::default();
    let memcpy = memcpy_baseline(&mut report, n);
    let ser = rkyv_baseline(&mut report, &records, opt.chunk_records, n);
    let tmp = tempfile::tempdir().context("temporary directory")?;
    let closed = measure_appends(&mut report, &records, opt, tmp.path(), memcpy, ser)?;
    // A read that fails would be timed as a fast one: the first failure of a timing is kept
    // in `failure`, and the bench stops on it once that timing is done.
    let mut failure: Option<anyhow::Error> = None;
    let open_read = measure_open_read(&mut report, &closed, n, memcpy, &mut failure)?;
    let (sealed, per_probe) = measure_seal(&mut report, &closed, n, opt.zstd_level)?;
    measure_sealed_read(&mut report, &sealed, n, &mut failure)?;
    measure_planning(&mut report, &sealed, &mut failure)?;
    let row_chunks = measure_row_size(&mut report, &records, opt, per_probe)?;
    measure_row_transpose(&mut report, &row_chunks, n, open_read, &mut failure)?;
    report.kept = opt.keep.clone();
    Ok(report)
}

/// Baseline 1: memcpy of the records' bytes; its rate, records/s.
fn memcpy_baseline(report: &mut Report, n: usize) -> f64 {
    let row_bytes = n * size_of::<ArchivedProbeRecord>();
    // Baseline 1: memcpy of the same number of bytes, into a pre-faulted buffer.
    let src = vec![0x5Au8; row_bytes];
    let mut dst = vec![0u8; row_bytes];
    let memcpy_s = best_of(3, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
    });
    let memcpy = rate(n, memcpy_s);
    report.push(
        "baseline: memcpy of the same bytes (48 B/record)",
        memcpy,
        "records/s",
        format!("{:.1} GB/s", row_bytes as f64 / memcpy_s / 1e9),
    );
    drop((src, dst));
    memcpy
}

/// Baseline 2: rkyv serialisation of the records' columns alone; its rate, records/s.
fn rkyv_baseline(report: &mut Report, records: &[ProbeRecord], chunk_records: usize, n: usize) -> f64 {
    // Baseline 2: rkyv serialisation alone, columns, into a reused buffer (no file, no crc).
    let mut cols = ProbeColumns::with_capacity(chunk_records);
    let mut arena = Arena::new();
    let mut buf = AlignedVec::<16>::with_capacity(ProbeColumns::archived_bound(chunk_records));
    let ser_s = best_of(3, || {
        for chunk in records.chunks(chunk_records) {
            cols.clear();
            for r in chunk {
                cols.push(r);
            }
            buf.clear();
            let out = rkyv::api::high::to_bytes_in_with_alloc::<_, _, rancor::Error>(
                &cols,
                std::mem::take(&mut buf),
                arena.acquire(),
            );
            buf = out.unwrap_or_default();
            std::hint::black_box(&buf);
        }
    });
    let ser = rate(n, ser_s);
    report.push("baseline: rkyv serialise columns alone", ser, "records/s", String::new());
    ser
}

/// Appends through the real writer once per write mode; the default mode's closed segments.
fn measure_appends(
    report: &mut Report,
    records: &[ProbeRecord],
    opt: &Options,
    tmp: &Path,
    memcpy: f64,
    ser: f64,
) -> Result<Vec<PathBuf>> {
    // Append through the real writer into real files, rotation and closing included, once per
    // write mode; the default mode's segments go on to be read and sealed.
    let dir = opt.keep.clone().unwrap_or_else(|| tmp.join("default"));
    let mut closed = Vec::new();
    for mode in [WriteMode::Mmap, WriteMode::Pwrite] {
        let is_default = mode == WriteMode::default();
        let out = if is_default { dir.clone() } else { tmp.join(format!("{mode:?}")) };
        let (paths, secs) = append_all(records, &out, opt, mode, 0)?;
        let append = rate(opt.records, secs);
        report.push(
            &format!("append: SegmentWriter, {mode:?} mode{}", if is_default { " (default)" } else { "" }),
            append,
            "records/s",
            format!("{:.2}x memcpy, {:.2}x rkyv alone; {} segments", append / memcpy, append / ser, paths.len()),
        );
        if is_default {
            closed = paths;
        } else {
            std::fs::remove_dir_all(&out).with_context(|| format!("remove {}", out.display()))?;
        }
    }
    // Window summaries of 5 s on (the writer folds every chunk it writes): its cost per record
    // and in bytes, against the default mode without them, in the same run.
    let plain = report.value("append: SegmentWriter, Pwrite mode").unwrap_or(f64::NAN);
    let out = tmp.join("summarised");
    let window_ns = rocemesh_formats::window::DEFAULT_WINDOW_S * 1_000_000_000;
    let (paths, secs) = append_all(records, &out, opt, WriteMode::Pwrite, window_ns)?;
    let summarised = rate(opt.records, secs);
    let bytes = |ps: &[PathBuf]| -> Result<u64> {
        ps.iter().map(|p| Ok(std::fs::metadata(p).with_context(|| format!("stat {}", p.display()))?.len())).sum()
    };
    let (with, without) = (bytes(&paths)?, bytes(&closed)?);
    report.push(
        "append with window summaries of 5 s: SegmentWriter, Pwrite mode",
        summarised,
        "records/s",
        format!(
            "{:.2}x the rate without ({:.1} against {:.1} ns per record); open segments {:.1} against {:.1} B per probe ({:.2}x)",
            summarised / plain,
            1e9 / summarised,
            1e9 / plain,
            with as f64 / opt.records as f64,
            without as f64 / opt.records as f64,
            with as f64 / without as f64
        ),
    );
    // Sealed, the summaries sit in frames of their own between the chunks' (not timed).
    let mut sealed = Vec::new();
    let mut sealed_bytes = 0u64;
    for p in &paths {
        let rep = seal(p, opt.zstd_level)?;
        sealed_bytes += rep.sealed_bytes;
        sealed.push(rep.sealed_path);
    }
    sealed_bytes_row(report, " with window summaries", &sealed, sealed_bytes, opt.records, opt.zstd_level)?;
    std::fs::remove_dir_all(&out).with_context(|| format!("remove {}", out.display()))?;
    Ok(closed)
}

/// Validated read of the open segments; its rate, records/s.
fn measure_open_read(
    report: &mut Report,
    closed: &[PathBuf],
    n: usize,
    memcpy: f64,
    failure: &mut Option<anyhow::Error>,
) -> Result<f64> {
    // Validated read of the open-format segments (page cache warm, as right after writing).
    let open_read_s = best_of(3, || match read_all(closed) {
        Ok(sum) => _ = std::hint::black_box(sum),
        Err(e) => _ = failure.get_or_insert(e),
    });
    stop_on(failure, "validated read of the open segments")?;
    let open_read = rate(n, open_read_s);
    report.push(
        "validated read: open segments (mmap, crc + bytecheck)",
        open_read,
        "records/s",
        format!("{:.2}x memcpy; includes opening, validation and one pass over a column", open_read / memcpy),
    );
    Ok(open_read)
}

/// Seals the closed segments; the sealed paths and the sealed bytes per probe.
fn measure_seal(report: &mut Report, closed: &[PathBuf], n: usize, zstd_level: i32) -> Result<(Vec<PathBuf>, f64)> {
    // Seal: zstd, fsync, read-back verification, rename.
    let raw_bytes: u64 = closed.iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum();
    let t = Instant::now();
    let mut sealed = Vec::new();
    let mut sealed_bytes = 0u64;
    for p in closed {
        let rep = seal(p, zstd_level)?;
        sealed_bytes += rep.sealed_bytes;
        sealed.push(rep.sealed_path);
    }
    let seal_s = t.elapsed().as_secs_f64();
    report.push(
        &format!("seal: zstd-{zstd_level} + fsync + verify, input MB/s"),
        raw_bytes as f64 / seal_s / 1e6,
        "MB/s",
        format!("{:.1} M records/s", rate(n, seal_s) / 1e6),
    );
    sealed_bytes_row(report, "", &sealed, sealed_bytes, n, zstd_level)?;
    let per_probe = sealed_bytes as f64 / n as f64;
    Ok((sealed, per_probe))
}

/// The bytes of `sealed` files (zstd frames per group of one content, summary and frame index)
/// against the same segments as one zstd frame each, as files were sealed before the index
/// (`formats::segment::frames`): what cutting a file into independent frames costs.
fn sealed_bytes_row(
    report: &mut Report,
    what: &str,
    sealed: &[PathBuf],
    sealed_bytes: u64,
    n: usize,
    zstd_level: i32,
) -> Result<()> {
    let mut one_frame = 0u64;
    for p in sealed {
        let raw = zstd::stream::decode_all(std::fs::File::open(p)?)?;
        one_frame += zstd::bulk::compress(&raw, zstd_level)?.len() as u64;
    }
    report.push(
        &format!("sealed bytes{what}: zstd-{zstd_level} frames per group of one content, summary and index"),
        sealed_bytes as f64 / n as f64,
        "B/record",
        format!(
            "{:.3}x one zstd frame of the same segments, without summary ({:.2} B/record)",
            sealed_bytes as f64 / one_frame as f64,
            one_frame as f64 / n as f64
        ),
    );
    Ok(())
}

/// Validated read of the sealed segments, beside the streaming inflate it replaced.
fn measure_sealed_read(
    report: &mut Report,
    sealed: &[PathBuf],
    n: usize,
    failure: &mut Option<anyhow::Error>,
) -> Result<()> {
    let sealed_read_s = best_of(3, || match read_all(sealed) {
        Ok(sum) => _ = std::hint::black_box(sum),
        Err(e) => _ = failure.get_or_insert(e),
    });
    stop_on(failure, "validated read of the sealed segments")?;
    // Baseline: how the reader inflated a sealed file before it did so in one call: a zstd
    // stream copied through a small buffer into a growing one, with no validation at all.
    let stream_s = best_of(3, || {
        let mut bytes = 0usize;
        for p in sealed {
            match stream_inflate(p) {
                Ok(n) => bytes += n,
                Err(e) => _ = failure.get_or_insert(e),
            }
        }
        std::hint::black_box(bytes);
    });
    // A failure of this baseline stays in `failure`: the next stop (after planning) reports it.
    report.push(
        "baseline: stream-inflate sealed segments into a growing buffer (no validation)",
        rate(n, stream_s),
        "records/s",
        "what SegmentReader::open did to a sealed file before validating it".into(),
    );
    report.push(
        "validated read: sealed segments (zstd + validate)",
        rate(n, sealed_read_s),
        "records/s",
        format!("{:.2}x the streaming inflate alone", stream_s / sealed_read_s),
    );
    Ok(())
}

/// Planning a read of the sealed files from their summaries against inflating them.
fn measure_planning(report: &mut Report, sealed: &[PathBuf], failure: &mut Option<anyhow::Error>) -> Result<()> {
    // Planning a read of sealed files (analyze's first pass): from the summary each ends in,
    // against inflating the file for the same facts.
    let from_summary_s = best_of(3, || {
        for p in sealed {
            match read_summary(p) {
                Ok(SummaryRead::Found(s)) => _ = std::hint::black_box(s),
                Ok(other) => {
                    _ = failure.get_or_insert(anyhow::anyhow!("{}: no usable summary: {other:?}", p.display()))
                }
                Err(e) => _ = failure.get_or_insert(e.into()),
            }
        }
    });
    let inflated_s = best_of(3, || {
        for p in sealed {
            match SegmentReader::open(p) {
                Ok(r) => _ = std::hint::black_box(SealedSummary::of(&r, r.damage().to_vec())),
                Err(e) => _ = failure.get_or_insert(e.into()),
            }
        }
    });
    stop_on(failure, "reading back the sealed segments this run wrote")?;
    report.push(
        "plan sealed segments: from their summaries",
        sealed.len() as f64 / from_summary_s,
        "files/s",
        format!(
            "{:.0}x inflating each for the same facts ({:.0} files/s)",
            inflated_s / from_summary_s,
            sealed.len() as f64 / inflated_s
        ),
    );
    Ok(())
}

/// The row layout's sealed size beside the columns'; the rows' rkyv chunks.
fn measure_row_size(
    report: &mut Report,
    records: &[ProbeRecord],
    opt: &Options,
    per_probe: f64,
) -> Result<Vec<AlignedVec<16>>> {
    // The alternative layout: rows. Same records, same chunking, same zstd level.
    let n = opt.records;
    let mut row_chunks: Vec<AlignedVec<16>> = Vec::new();
    let mut row_sealed = 0usize;
    for chunk in records.chunks(opt.chunk_records) {
        let v: Vec<ProbeRecord> = chunk.to_vec();
        let bytes = rkyv::to_bytes::<rancor::Error>(&v)?;
        row_sealed += zstd::bulk::compress(&bytes, opt.zstd_level)?.len();
        row_chunks.push(bytes);
    }
    report.push(
        &format!("sealed bytes per probe: columns, zstd-{}", opt.zstd_level),
        per_probe,
        "B/probe",
        format!(
            "rows at the same level: {:.2} B/probe ({:.2}x)",
            row_sealed as f64 / n as f64,
            row_sealed as f64 / n as f64 / per_probe
        ),
    );
    Ok(row_chunks)
}

/// What analyze must do with rows, validate and transpose, against reading columns.
fn measure_row_transpose(
    report: &mut Report,
    row_chunks: &[AlignedVec<16>],
    n: usize,
    open_read: f64,
    failure: &mut Option<anyhow::Error>,
) -> Result<()> {
    // What analyze must do with rows: validate, then transpose into column vectors.
    let transpose_s = best_of(3, || match transpose(row_chunks, n) {
        Ok(out) => _ = std::hint::black_box(out),
        Err(e) => _ = failure.get_or_insert(anyhow::anyhow!("{e}")),
    });
    stop_on(failure, "row layout: a chunk the bench wrote failed to validate or deserialize")?;
    let transpose = rate(n, transpose_s);
    report.push(
        "row layout: validate + transpose into columns",
        transpose,
        "records/s",
        format!("columns are read {:.1}x faster (zero-copy, no transposition)", open_read / transpose),
    );
    Ok(())
}

/// Write `records` through a fresh writer into `dir`; the closed segments and the seconds taken.
fn append_all(
    records: &[ProbeRecord],
    dir: &Path,
    opt: &Options,
    mode: WriteMode,
    summary_window_ns: u64,
) -> Result<(Vec<PathBuf>, f64)> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut cfg = WriterConfig::new(dir);
    cfg.chunk_records = opt.chunk_records;
    cfg.segment_bytes = opt.segment_bytes;
    cfg.write_mode = mode;
    cfg.summary_window_ns = summary_window_ns;
    let identity = WriterIdentity {
        host: "bench-h0".into(),
        device: "mlx5_0".into(),
        tor: "tor0".into(),
        agent_epoch: 1,
        tool: "rocemesh-bench".into(),
    };
    let mut w = SegmentWriter::new(cfg, identity)?;
    for t in 0..=36 {
        w.endpoint(EndpointRole::Rnic, &format!("bench-h{t}/mlx5_0"), if t <= 31 { "tor0" } else { "tor1" }, [0; 16]);
    }
    let t = Instant::now();
    for r in records {
        w.append(r)?;
    }
    let closed = w.finish()?;
    Ok((closed, t.elapsed().as_secs_f64()))
}

/// Open, validate and touch every record of `paths`; returns a checksum of the RTT column.
fn read_all(paths: &[PathBuf]) -> Result<i64> {
    let mut sum = 0i64;
    for p in paths {
        let r = SegmentReader::open(p)?;
        anyhow::ensure!(r.damage().is_empty(), "{}: {:?}", p.display(), r.damage());
        for c in r.probe_chunks() {
            sum += c.network_rtt_ns.iter().map(|v| i64::from(v.to_native())).sum::<i64>();
        }
    }
    Ok(sum)
}

/// Rows in rkyv chunks validated, then transposed into column vectors.
fn transpose(chunks: &[AlignedVec<16>], n: usize) -> Result<ProbeColumns, rancor::Error> {
    let mut out = ProbeColumns::with_capacity(n);
    for b in chunks {
        for r in rkyv::access::<rkyv::vec::ArchivedVec<ArchivedProbeRecord>, rancor::Error>(b)?.iter() {
            out.push(&rkyv::deserialize::<ProbeRecord, rancor::Error>(r)?);
        }
    }
    Ok(out)
}

/// The first failure a timing kept, with what was being timed: a figure is not given for work
/// that failed.
fn stop_on(failure: &mut Option<anyhow::Error>, what: &'static str) -> Result<()> {
    failure.take().map_or(Ok(()), |e| Err(e.context(what)))
}

/// Where `--keep` put the segments, for the README's run command.
pub fn describe_kept(p: &Path) -> String {
    format!("sealed segments kept in {}", p.display())
}

/// [`SegmentReader::open`]'s inflation of a sealed file before it was one call: bytes inflated.
fn stream_inflate(path: &Path) -> Result<usize> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut out = AlignedVec::<16>::new();
    let mut dec = zstd::stream::read::Decoder::new(file)?;
    std::io::copy(&mut dec, &mut out)?;
    Ok(out.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget, not a timing: sealed size depends only on the records, the layout and the zstd
    /// level, and it is what decides how much a fleet ships per day.
    #[test]
    fn realistic_records_seal_within_twenty_bytes_per_probe_and_read_back() {
        let opt = Options { records: 300_000, chunk_records: 4096, segment_bytes: 64 << 20, zstd_level: 3, keep: None };
        let report = run(&opt).expect("bench runs");
        let per_probe = report.value("sealed bytes per probe").expect("line");
        assert!(per_probe <= 20.0, "{per_probe} B/probe\n{report}");
        assert!(per_probe > 4.0, "implausibly small: is the synthetic stream degenerate? {per_probe}");
        for what in [
            "append: SegmentWriter, Pwrite",
            "append: SegmentWriter, Mmap",
            "validated read: open",
            "validated read: sealed",
        ] {
            assert!(report.value(what).is_some_and(|v| v > 0.0), "{what} missing\n{report}");
        }
    }
}
