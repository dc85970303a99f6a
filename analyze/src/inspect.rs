//! `analyze inspect`: what is in a set of segment files, and what is wrong with them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rocemesh_formats::record::Class;
use rocemesh_formats::segment::{
    Content, DamageKind, OPEN_SUFFIX, SEALED_SUFFIX, SegmentReader, SummaryRead, read_summary,
};
use rocemesh_formats::window::{ArchivedWindowSummary, Measure, bucket_value};

/// One file's verdict.
#[derive(Debug)]
pub struct FileReport {
    /// The file.
    pub path: PathBuf,
    /// What was read, or why nothing could be.
    pub outcome: Result<Summary, String>,
}

/// What a readable segment holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Sealed (compressed) or open format.
    pub sealed: bool,
    /// Whether its writer closed it.
    pub closed: bool,
    /// `host/device`.
    pub writer: String,
    /// The writer's agent epoch.
    pub agent_epoch: u32,
    /// Valid probe records.
    pub records: u64,
    /// First and last probe time.
    pub time_range: Option<(u64, u64)>,
    /// Dictionary entries.
    pub endpoints: usize,
    /// Path traces.
    pub paths: usize,
    /// One line per damage found.
    pub damage: Vec<String>,
    /// Records known lost to damage.
    pub records_lost: u64,
    /// Window summaries (parts of a window each count), and the probes they count.
    pub window_summaries: u64,
    pub summarized: u64,
    /// The summaries' (prober, target, label) keys and histogram cells: what localisation from
    /// summaries reads instead of the records.
    pub summary_keys: u64,
    pub summary_cells: u64,
    /// zstd bytes of the probe chunks' frames and of the window summaries' frames, as a sealed
    /// file's frame index gives them (both 0 for an open file); `None` for a sealed file without
    /// a usable index (sealed as one frame, or its summary unreadable), which the totals count.
    pub sealed_bytes: Option<[u64; 2]>,
    /// Its window summaries as `analyze inspect --windows` prints them, a line per window after
    /// the file's name; empty unless asked for ([`inspect`]).
    pub windows: Vec<String>,
}

/// Every segment file under `inputs` (files are taken as given; directories are walked).
pub fn find_segments(inputs: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            walk(p, &mut out)?;
        } else {
            out.push(p.clone());
        }
    }
    out.sort();
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else if let Some(name) = p.file_name().and_then(|n| n.to_str())
            && (name.ends_with(OPEN_SUFFIX) || name.ends_with(SEALED_SUFFIX))
        {
            out.push(p);
        }
    }
    Ok(())
}

/// Validate one file; with `windows`, also render its window summaries (from the same read).
pub fn inspect(path: &Path, windows: bool) -> FileReport {
    let outcome = SegmentReader::open(path).map_err(|e| e.to_string()).map(|r| {
        let id = r.identity();
        Summary {
            sealed: r.is_sealed(),
            closed: r.is_closed(),
            writer: format!("{}/{}", id.host, id.device),
            agent_epoch: id.agent_epoch,
            records: r.records(),
            time_range: r.time_range(),
            endpoints: r.dictionary().len(),
            paths: r.path_records().count(),
            damage: r
                .damage()
                .iter()
                .map(|d| {
                    let kind = match d.kind {
                        DamageKind::TornTail => "torn tail",
                        DamageKind::CorruptChunk => "corrupt chunk",
                        DamageKind::CorruptFrameHeader => "corrupt frame header",
                        DamageKind::CloseBlock => "close block",
                        DamageKind::Summary => "window summary",
                    };
                    let lost = d.records_lost.map(|n| format!(", {n} records lost")).unwrap_or_default();
                    format!("{kind} at byte {}{lost}: {}", d.offset, d.detail)
                })
                .collect(),
            records_lost: r.damage().iter().filter_map(|d| d.records_lost).map(u64::from).sum(),
            window_summaries: r.window_summaries().count() as u64,
            summarized: r.summarized_records(),
            summary_keys: r.window_summaries().map(|w| w.keys.len() as u64).sum(),
            summary_cells: r.window_summaries().map(|w| w.cells.len() as u64).sum(),
            sealed_bytes: if r.is_sealed() { sealed_bytes(path) } else { Some([0; 2]) },
            windows: if windows { r.window_summaries().map(window_line).collect() } else { Vec::new() },
        }
    });
    FileReport { path: path.to_path_buf(), outcome }
}

/// The table `analyze inspect` prints, and whether anything was wrong.
pub fn render(reports: &[FileReport]) -> (String, bool) {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<64} {:<7} {:<6} {:<28} {:>10} {:<20} {:<20} {:>5} {:>8}",
        "FILE", "FORMAT", "CLOSED", "WRITER (EPOCH)", "RECORDS", "FIRST (UTC)", "LAST (UTC)", "ENDPT", "WINDOWS"
    );
    let (mut records, mut lost, mut bad_files, mut damaged, mut summarized) = (0u64, 0u64, 0, 0, 0u64);
    let (mut keys, mut cells, mut sealed, mut unindexed) = (0u64, 0u64, [0u64; 2], 0usize);
    for r in reports {
        let name = r.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match &r.outcome {
            Ok(m) => {
                records += m.records;
                lost += m.records_lost;
                summarized += m.summarized;
                (keys, cells) = (keys + m.summary_keys, cells + m.summary_cells);
                match m.sealed_bytes {
                    Some(b) => sealed = [sealed[0] + b[0], sealed[1] + b[1]],
                    None => unindexed += 1,
                }
                let (a, b) = m.time_range.map(|(a, b)| (utc(a), utc(b))).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "{:<64} {:<7} {:<6} {:<28} {:>10} {:<20} {:<20} {:>5} {:>8}",
                    name,
                    if m.sealed { "sealed" } else { "open" },
                    if m.closed { "yes" } else { "no" },
                    format!("{} ({:08x})", m.writer, m.agent_epoch),
                    m.records,
                    a,
                    b,
                    m.endpoints,
                    m.window_summaries
                );
                if !m.damage.is_empty() {
                    damaged += 1;
                }
                for d in &m.damage {
                    let _ = writeln!(s, "    damage: {d}");
                }
            }
            Err(e) => {
                bad_files += 1;
                let _ = writeln!(s, "{name:<64} UNREADABLE: {e}");
            }
        }
    }
    let _ = writeln!(
        s,
        "{} files: {} records readable ({} counted by window summaries), {} with damage ({} records lost), {} unreadable",
        reports.len(),
        records,
        summarized,
        damaged,
        lost,
        bad_files
    );
    if summarized > 0 {
        let _ = writeln!(
            s,
            "window summaries: {keys} keys, {cells} histogram cells ({:.2} per probe counted)",
            cells as f64 / summarized as f64
        );
    }
    if sealed[1] > 0 || unindexed > 0 {
        let _ = writeln!(
            s,
            "sealed frames: probe records {:.1} MB, window summaries {:.1} MB ({:.2}x the records'); {unindexed} sealed files without a usable frame index not counted",
            sealed[0] as f64 / 1e6,
            sealed[1] as f64 / 1e6,
            sealed[1] as f64 / sealed[0].max(1) as f64
        );
    }
    (s, bad_files > 0 || damaged > 0)
}

/// zstd bytes of `path`'s probe frames and window-summary frames, from its sealed frame index;
/// `None` without one (sealed as one frame, or a summary that does not read).
fn sealed_bytes(path: &Path) -> Option<[u64; 2]> {
    let Ok(SummaryRead::Found(found)) = read_summary(path) else { return None };
    if found.facts.frames.is_empty() {
        return None;
    }
    let mut out = [0u64; 2];
    for f in &found.facts.frames {
        match f.content {
            Content::Probes => out[0] += f.len,
            Content::Windows => out[1] += f.len,
            _ => {}
        }
    }
    Some(out)
}

/// Every readable file's window summaries, a line per window (or part of one): what `analyze
/// inspect --windows` prints after the table (unreadable files are said there).
pub fn render_windows(reports: &[FileReport]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n{:<64} {:<20} {:>5} {:>8} {:>8} {:>8} {:>8} {:>11} {:>11} {:>6} {:>9} {:>6}",
        "WINDOWS OF FILE",
        "START (UTC)",
        "LEN_S",
        "KEYS",
        "PROBES",
        "OK",
        "LOST",
        "RTT_NS_P50",
        "RTT_NS_P99",
        "LATE",
        "LATE_MS",
        "STALLS"
    );
    for r in reports {
        let Ok(m) = &r.outcome else { continue };
        let name = r.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for line in &m.windows {
            let _ = writeln!(s, "{name:<64} {line}");
        }
    }
    s
}

/// One window summary's columns, after the file's name.
fn window_line(w: &ArchivedWindowSummary) -> String {
    let sum = |class: Class| -> u64 { w.keys.iter().map(|k| u64::from(k.counts[class as usize].to_native())).sum() };
    // Every key's RTT cells, by bucket: a histogram of the window's ok probes.
    let mut rtt: Vec<(u16, u64)> = (0..w.keys.len())
        .flat_map(|i| w.cells_of(i).iter())
        .filter(|c| c.measure == Measure::NetworkRtt as u8)
        .map(|c| (c.bucket.to_native(), u64::from(c.count.to_native())))
        .collect();
    rtt.sort_unstable();
    let q = |p: f64| histogram_quantile(&rtt, p).map_or_else(|| "-".to_owned(), |v| v.to_string());
    format!(
        "{:<20} {:>5} {:>8} {:>8} {:>8} {:>8} {:>11} {:>11} {:>6} {:>9.1} {:>6}",
        utc(w.start_unix_ns.to_native()),
        w.window_ns.to_native() / 1_000_000_000,
        w.keys.len(),
        w.probes(),
        sum(Class::Ok),
        sum(Class::Lost),
        q(0.5),
        q(0.99),
        w.late_sends.to_native(),
        w.late_max_ns.to_native() as f64 / 1e6,
        w.stalls.len() as u64 + u64::from(w.stalls_dropped.to_native()),
    )
}

/// The nearest-rank `p` quantile of a histogram given as (bucket, count) ascending by bucket,
/// read back as the bucket's midpoint; `None` when it holds nothing.
fn histogram_quantile(cells: &[(u16, u64)], p: f64) -> Option<u64> {
    let total: u64 = cells.iter().map(|c| c.1).sum();
    if total == 0 {
        return None;
    }
    let rank = ((p * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    cells
        .iter()
        .find(|c| {
            seen += c.1;
            seen >= rank
        })
        .map(|c| bucket_value(c.0))
}

/// `2023-11-14T22:13:20Z` from Unix nanoseconds (UTC, no time-zone database needed).
pub fn utc(unix_ns: u64) -> String {
    let c = rocemesh_formats::time::civil_utc((unix_ns / 1_000_000_000) as i64);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", c.year, c.month, c.day, c.hour, c.minute, c.second)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemesh_formats::record::ProbeRecord;
    use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity, seal};

    #[test]
    fn windows_show_counts_quantiles_and_the_shards_own_slips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = WriterConfig::new(dir.path());
        cfg.summary_window_ns = 1_000_000_000;
        let mut w = SegmentWriter::new(cfg, WriterIdentity::default()).expect("writer");
        const T: u64 = 1_700_000_000_000_000_000;
        // 100 ok probes with RTTs 10,000..=10,990 ns and one lost, in the first second; the
        // schedule slipped by 250 ms in it.
        for i in 0..101u64 {
            let outcome = if i == 100 { 1 } else { 0 };
            let rtt = if i == 100 { 0 } else { 10_000 + 10 * i as i32 };
            w.append(&ProbeRecord {
                t1_unix_ns: T + i * 1_000_000,
                network_rtt_ns: rtt,
                outcome,
                ..Default::default()
            })
            .expect("append");
        }
        w.note_late(T + 500_000_000, 250_000_000);
        let files = w.finish().expect("finish");
        let out = render_windows(&files.iter().map(|p| inspect(p, true)).collect::<Vec<_>>());
        let line = out.lines().nth(2).expect("a window line");
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&cols[1..7], ["2023-11-14T22:13:20Z", "1", "1", "101", "100", "1"], "{out}");
        let (p50, p99): (f64, f64) = (cols[7].parse().expect("p50"), cols[8].parse().expect("p99"));
        assert!((p50 - 10_490.0).abs() <= 10_490.0 / 64.0, "{out}");
        assert!((p99 - 10_980.0).abs() <= 10_980.0 / 64.0, "{out}");
        assert_eq!(&cols[9..], ["1", "250.0", "1"], "{out}");
    }

    #[test]
    fn utc_matches_known_instants() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_700_000_000_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc(951_782_400_000_000_000), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn reports_good_damaged_and_foreign_files_and_flags_problems() {
        let dir = tempfile::tempdir().expect("tempdir");
        let id = WriterIdentity { host: "h1".into(), device: "mlx5_0".into(), agent_epoch: 0xAB, ..Default::default() };
        let mut cfg = WriterConfig::new(dir.path());
        cfg.chunk_records = 10;
        cfg.segment_bytes = 2 << 20;
        cfg.summary_window_ns = 10;
        let mut w = SegmentWriter::new(cfg, id).expect("writer");
        for i in 0..25u64 {
            w.append(&ProbeRecord { t1_unix_ns: 1_700_000_000_000_000_000 + i, seq: i, ..Default::default() })
                .expect("append");
        }
        let closed = w.finish().expect("finish");
        let sealed = seal(&closed[0], 3).expect("seal").sealed_path;

        let clean = find_segments(&[dir.path().to_path_buf()]).expect("find");
        assert_eq!(clean, vec![sealed.clone()]);
        let (table, problems) = render(&clean.iter().map(|p| inspect(p, false)).collect::<Vec<_>>());
        assert!(!problems, "{table}");
        assert!(table.contains("h1/mlx5_0 (000000ab)") && table.contains(" 25 "), "{table}");
        // Windows of 10 ns over 25 records 1 ns apart: 3 summaries.
        assert!(table.lines().nth(1).is_some_and(|l| l.ends_with(" 3")), "{table}");
        assert!(
            table.contains("1 files: 25 records readable (25 counted by window summaries), 0 with damage"),
            "{table}"
        );
        // What localisation from summaries reads, and what the summaries cost on disk.
        let r = SegmentReader::open(&sealed).expect("open");
        let cells: usize = r.window_summaries().map(|w| w.cells.len()).sum();
        assert!(cells > 0);
        let line =
            format!("window summaries: 3 keys, {cells} histogram cells ({:.2} per probe counted)", cells as f64 / 25.0);
        assert!(table.contains(&line), "{table}");
        let [probes, windows] = sealed_bytes(&sealed).expect("a frame index");
        assert!(probes > 0 && windows > 0, "{probes} {windows}");
        assert!(table.contains("sealed frames: probe records "), "{table}");
        assert!(table.contains("; 0 sealed files without a usable frame index not counted"), "{table}");
        // A summary whose checksum fails: the file still reads whole, its frames are not
        // counted, and the totals say so.
        let bad = dir.path().join("bad").join(sealed.file_name().expect("name"));
        std::fs::create_dir_all(bad.parent().expect("dir")).expect("mkdir");
        let mut bytes = std::fs::read(&sealed).expect("read");
        // The summary's 16-byte tail ends the file: length, CRC32C, version, magic.
        let crc_at = bytes.len() - 16 + 4;
        bytes[crc_at] ^= 0xFF;
        std::fs::write(&bad, &bytes).expect("write");
        let report = inspect(&bad, false);
        assert_eq!(report.outcome.as_ref().expect("reads whole").sealed_bytes, None);
        let (table, _) = render(&[report]);
        assert!(table.contains("; 1 sealed files without a usable frame index not counted"), "{table}");
        std::fs::remove_dir_all(dir.path().join("bad")).expect("rm");

        std::fs::write(dir.path().join("junk.rseg"), b"GIF89a not a segment").expect("write");
        // No frame index: nothing said of its frames.
        assert_eq!(sealed_bytes(&dir.path().join("junk.rseg")), None);
        let all = find_segments(&[dir.path().to_path_buf()]).expect("find");
        let (table, problems) = render(&all.iter().map(|p| inspect(p, false)).collect::<Vec<_>>());
        assert!(problems);
        assert!(
            table.contains("junk.rseg") && table.contains("UNREADABLE") && table.contains("not a rocemesh segment")
        );
        assert!(table.contains("1 unreadable"), "{table}");
    }
}
