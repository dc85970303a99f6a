//! `analyze inspect`: what is in a set of segment files, and what is wrong with them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rocemesh_formats::segment::{DamageKind, OPEN_SUFFIX, SEALED_SUFFIX, SegmentReader};

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

/// Validate one file.
pub fn inspect(path: &Path) -> FileReport {
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
                    };
                    let lost = d.records_lost.map(|n| format!(", {n} records lost")).unwrap_or_default();
                    format!("{kind} at byte {}{lost}: {}", d.offset, d.detail)
                })
                .collect(),
            records_lost: r.damage().iter().filter_map(|d| d.records_lost).map(u64::from).sum(),
        }
    });
    FileReport { path: path.to_path_buf(), outcome }
}

/// The table `analyze inspect` prints, and whether anything was wrong.
pub fn render(reports: &[FileReport]) -> (String, bool) {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<64} {:<7} {:<6} {:<28} {:>10} {:<20} {:<20} {:>5}",
        "FILE", "FORMAT", "CLOSED", "WRITER (EPOCH)", "RECORDS", "FIRST (UTC)", "LAST (UTC)", "ENDPT"
    );
    let (mut records, mut lost, mut bad_files, mut damaged) = (0u64, 0u64, 0, 0);
    for r in reports {
        let name = r.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match &r.outcome {
            Ok(m) => {
                records += m.records;
                lost += m.records_lost;
                let (a, b) = m.time_range.map(|(a, b)| (utc(a), utc(b))).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "{:<64} {:<7} {:<6} {:<28} {:>10} {:<20} {:<20} {:>5}",
                    name,
                    if m.sealed { "sealed" } else { "open" },
                    if m.closed { "yes" } else { "no" },
                    format!("{} ({:08x})", m.writer, m.agent_epoch),
                    m.records,
                    a,
                    b,
                    m.endpoints
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
        "{} files: {} records readable, {} with damage ({} records lost), {} unreadable",
        reports.len(),
        records,
        damaged,
        lost,
        bad_files
    );
    (s, bad_files > 0 || damaged > 0)
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
        let mut w = SegmentWriter::new(cfg, id).expect("writer");
        for i in 0..25u64 {
            w.append(&ProbeRecord { t1_unix_ns: 1_700_000_000_000_000_000 + i, seq: i, ..Default::default() })
                .expect("append");
        }
        let closed = w.finish().expect("finish");
        let sealed = seal(&closed[0], 3).expect("seal").sealed_path;

        let clean = find_segments(&[dir.path().to_path_buf()]).expect("find");
        assert_eq!(clean, vec![sealed.clone()]);
        let (table, problems) = render(&clean.iter().map(|p| inspect(p)).collect::<Vec<_>>());
        assert!(!problems, "{table}");
        assert!(table.contains("h1/mlx5_0 (000000ab)") && table.contains(" 25 "), "{table}");
        assert!(table.contains("1 files: 25 records readable, 0 with damage"), "{table}");

        std::fs::write(dir.path().join("junk.rseg"), b"GIF89a not a segment").expect("write");
        let all = find_segments(&[dir.path().to_path_buf()]).expect("find");
        let (table, problems) = render(&all.iter().map(|p| inspect(p)).collect::<Vec<_>>());
        assert!(problems);
        assert!(
            table.contains("junk.rseg") && table.contains("UNREADABLE") && table.contains("not a rocemesh segment")
        );
        assert!(table.contains("1 unreadable"), "{table}");
    }
}
