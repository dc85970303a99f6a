//! Sealing closed segments for shipping, and keeping a segment directory under its quota.
//!
//! Sealing runs off the shard's hot path (a sealer thread in the agent, or at start-up for
//! segments a crashed agent left open). It never loses data: the compressed copy is written to
//! a temporary name, fsync'd, read back and validated, and only then renamed into place and the
//! original removed. The copy is a run of zstd frames, one per group of frames of one content
//! (`frames`), and ends in its summary (`summary`) with their index, checked the same way.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::frames::{Group, groups, index_matches, write_groups};
use super::layout::{CloseBlock, HEADER_BYTES, OPEN_SUFFIX, SEALED_SUFFIX, encode_close};
use super::reader::{Damage, DamageKind, SegmentReader};
use super::summary::{SealedSummary, SummaryRead, read_summary};
use super::writer::{lock_exclusive, sync_dir};
use super::{SegmentError, io_err};

/// What sealing one segment did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealReport {
    /// The sealed file.
    pub sealed_path: PathBuf,
    /// Probe records it holds.
    pub records: u64,
    /// Bytes of segment data compressed (header page and frames; the unused tail excluded).
    pub raw_bytes: u64,
    /// Size of the sealed file.
    pub sealed_bytes: u64,
    /// Damage found in the source (a torn tail after a crash is normal); torn tails are not
    /// carried into the sealed copy, corrupt chunks are (as evidence), and so are window
    /// summaries that are not of the records; every reader of it reports them again.
    pub damage: Vec<Damage>,
}

/// Compress the open-format segment at `path` into `<name>.rseg.zst` next to it and remove the
/// original. `zstd_level` 1-19; 3 is the default trade-off (see `bench formats`).
///
/// Works on segments the writer closed and on ones a crashed writer left open; the sealed copy
/// always has a valid close block.
pub fn seal(path: &Path, zstd_level: i32) -> Result<SealReport, SegmentError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let Some(stem) = name.strip_suffix(OPEN_SUFFIX) else {
        return Err(SegmentError::Config(format!(
            "{}: only open segments (*{OPEN_SUFFIX}) are sealed; this name does not end in {OPEN_SUFFIX}",
            path.display()
        )));
    };
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let sealed_path = dir.join(format!("{stem}{SEALED_SUFFIX}"));
    let tmp_path = dir.join(format!("{stem}{SEALED_SUFFIX}.tmp"));

    let _lock = lock_for_sealing(path)?;
    let source = SegmentReader::open(path)?;
    if source.is_sealed() {
        return Err(SegmentError::Config(format!(
            "{}: already compressed; rename it to {stem}{SEALED_SUFFIX}",
            path.display()
        )));
    }
    // Corrupt chunks stay as evidence, and summaries that are not of the records stay set
    // aside: the sealed copy's reader finds both again.
    let carried: Vec<Damage> = source
        .damage()
        .iter()
        .filter(|d| matches!(d.kind, DamageKind::CorruptChunk | DamageKind::Summary))
        .cloned()
        .collect();

    if sealed_path.exists() {
        return finish_interrupted_seal(path, &dir, &source, sealed_path);
    }

    let end = source.frames_end();
    let header = closed_header(&source);

    // What the sealed copy will hold, for planners that must not inflate it (`summary`): the
    // source's facts, with the damage a reader of the copy reports (a torn tail is not copied),
    // and the index of its zstd frames once they are written.
    let mut summary = SealedSummary::of(&source, carried.clone());
    let groups = groups_of(&source);
    write_sealed(&tmp_path, &header, source.raw(), &groups, &mut summary, zstd_level)?;

    verify_sealed(&tmp_path, &source, &carried, &summary)?;
    std::fs::rename(&tmp_path, &sealed_path).map_err(io_err(&tmp_path, "rename sealed segment into place"))?;
    sync_dir(&dir)?;
    let report = SealReport {
        sealed_path: sealed_path.clone(),
        records: source.records(),
        raw_bytes: end as u64,
        sealed_bytes: file_len(&sealed_path)?,
        damage: source.damage().to_vec(),
    };
    drop(source);
    std::fs::remove_file(path).map_err(io_err(path, "remove sealed original"))?;
    sync_dir(&dir)?;
    Ok(report)
}

/// The groups `r`'s bytes are sealed in ([`groups`]), counting its valid probe chunks.
fn groups_of(r: &SegmentReader) -> Vec<Group> {
    let chunks = r.probe_ranges().iter().zip(r.probe_chunks());
    groups(r.raw(), r.frames_end(), chunks.map(|(range, c)| (range.start, c.t1_unix_ns.iter().map(|t| t.to_native()))))
}

/// The segment's lock, taken exclusively: a segment that a live writer still holds must not be
/// sealed, since the writer would go on appending to a file that is about to be deleted.
fn lock_for_sealing(path: &Path) -> Result<File, SegmentError> {
    let lock = File::open(path).map_err(io_err(path, "open segment"))?;
    if let Err(e) = lock_exclusive(&lock) {
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            SegmentError::Config(format!(
                "{}: still being written by a live writer; seal it after the writer rotates it",
                path.display()
            ))
        } else {
            SegmentError::Io { path: path.to_path_buf(), op: "lock segment".into(), source: e }
        });
    }
    Ok(lock)
}

/// A sealed copy already exists: a crash between the rename and the removal of the original.
/// The copy was validated before the rename, so if it holds the same records, finish the job.
fn finish_interrupted_seal(
    path: &Path,
    dir: &Path,
    source: &SegmentReader,
    sealed_path: PathBuf,
) -> Result<SealReport, SegmentError> {
    let existing = SegmentReader::open(&sealed_path)?;
    if existing.records() == source.records() {
        std::fs::remove_file(path).map_err(io_err(path, "remove sealed original"))?;
        sync_dir(dir)?;
        let sealed_bytes = file_len(&sealed_path)?;
        return Ok(SealReport {
            sealed_path,
            records: existing.records(),
            raw_bytes: source.frames_end() as u64,
            sealed_bytes,
            damage: source.damage().to_vec(),
        });
    }
    Err(SegmentError::Config(format!(
        "{} already exists with {} records while {} has {}: move one of them away by hand",
        sealed_path.display(),
        existing.records(),
        path.display(),
        source.records()
    )))
}

/// The source's header page with a close block, which a crashed writer may not have written.
fn closed_header(source: &SegmentReader) -> Vec<u8> {
    let mut header = source.raw()[..HEADER_BYTES].to_vec();
    let (lo, hi) = source.time_range().unwrap_or((source.created_unix_ns(), source.created_unix_ns()));
    encode_close(
        &mut header,
        &CloseBlock {
            first_unix_ns: lo,
            last_unix_ns: hi,
            records: source.records(),
            data_end: source.frames_end() as u64,
            chunks: source.chunk_count() as u64,
        },
    );
    header
}

/// The compressed copy at `tmp_path`: `header`, then `raw`'s `groups` each as a zstd frame, then
/// `summary` with their index, fsync'd; removed on failure.
fn write_sealed(
    tmp_path: &Path,
    header: &[u8],
    raw: &[u8],
    groups: &[Group],
    summary: &mut SealedSummary,
    zstd_level: i32,
) -> Result<(), SegmentError> {
    // A stale temporary is a previous seal that died before its rename: ours, incomplete.
    let _ = std::fs::remove_file(tmp_path);
    let file = OpenOptions::new().write(true).create_new(true).open(tmp_path).map_err(io_err(tmp_path, "create"))?;
    let write = || -> std::io::Result<File> {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        summary.frames = write_groups(&mut out, header, raw, groups, zstd_level)?;
        out.write_all(&summary.frame())?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(file)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(tmp_path);
        return Err(SegmentError::Io { path: tmp_path.to_path_buf(), op: "write sealed segment".into(), source: e });
    }
    Ok(())
}

/// The other side of the write: the sealed copy read back must hold exactly what the source
/// held, before the source goes away; the summary too: found, agreeing with the header, and
/// what the copy's own reader says. A copy that does not is removed.
fn verify_sealed(
    tmp_path: &Path,
    source: &SegmentReader,
    carried: &[Damage],
    summary: &SealedSummary,
) -> Result<(), SegmentError> {
    let check = SegmentReader::open(tmp_path);
    let summary_back = read_summary(tmp_path);
    let verified = match (&check, &summary_back) {
        (Ok(r), Ok(SummaryRead::Found(back))) => {
            r.records() == source.records()
                && r.is_closed()
                && r.damage().iter().all(|d| matches!(d.kind, DamageKind::CorruptChunk | DamageKind::Summary))
                && r.damage().len() == carried.len()
                && r.dictionary() == source.dictionary()
                && back.facts == *summary
                && back.facts
                    == SealedSummary { frames: back.facts.frames.clone(), ..SealedSummary::of(r, r.damage().to_vec()) }
                && index_matches(&back.facts.frames, &groups_of(r))
                && back.identity == *r.identity()
        }
        _ => false,
    };
    if verified {
        return Ok(());
    }
    let _ = std::fs::remove_file(tmp_path);
    Err(SegmentError::BadSealed {
        path: tmp_path.to_path_buf(),
        reason: format!(
            "read-back of the sealed copy does not match the source ({}): source kept",
            match (check, summary_back) {
                (Ok(r), Ok(back)) => format!(
                    "{} records vs {}, damage {:?}, summary {}",
                    r.records(),
                    source.records(),
                    r.damage(),
                    match back {
                        SummaryRead::Found(_) => "found".to_owned(),
                        SummaryRead::Absent => "absent".to_owned(),
                        SummaryRead::Unusable(why) => why,
                    }
                ),
                (Err(e), _) | (_, Err(e)) => e.to_string(),
            }
        ),
    })
}

/// What [`enforce_quota`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Eviction {
    /// Sealed segments deleted, oldest first.
    pub files_evicted: u64,
    /// Their total size.
    pub bytes_evicted: u64,
    /// Bytes of segments left in the directory.
    pub bytes_remaining: u64,
    /// True when the directory is still over quota because the open segments alone exceed it
    /// (they belong to running writers and are never deleted): raise the quota.
    pub still_over_quota: bool,
}

/// Delete the oldest sealed segments in `dir` until all segments there fit in `quota_bytes`.
///
/// Age is read from the file name, which every writer starts with its first record's time in
/// milliseconds, so that "oldest" holds across writers sharing the directory. Open segments and
/// foreign files are never touched.
pub fn enforce_quota(dir: &Path, quota_bytes: u64) -> Result<Eviction, SegmentError> {
    let mut sealed: Vec<(String, u64)> = Vec::new();
    let mut total = 0u64;
    for entry in std::fs::read_dir(dir).map_err(io_err(dir, "list segment directory"))? {
        let entry = entry.map_err(io_err(dir, "list segment directory"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_sealed = name.ends_with(SEALED_SUFFIX);
        if !is_sealed && !name.ends_with(OPEN_SUFFIX) {
            continue;
        }
        let len = entry.metadata().map_err(io_err(&entry.path(), "stat segment"))?.len();
        total += len;
        if is_sealed {
            sealed.push((name, len));
        }
    }
    sealed.sort();
    let mut ev = Eviction::default();
    for (name, len) in sealed {
        if total <= quota_bytes {
            break;
        }
        let p = dir.join(&name);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            // Another evictor or an operator got there first: the space is free either way.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(SegmentError::Io { path: p, op: "evict sealed segment".into(), source: e }),
        }
        total -= len;
        ev.files_evicted += 1;
        ev.bytes_evicted += len;
    }
    if ev.files_evicted > 0 {
        sync_dir(dir)?;
    }
    ev.bytes_remaining = total;
    ev.still_over_quota = total > quota_bytes;
    Ok(ev)
}

fn file_len(p: &Path) -> Result<u64, SegmentError> {
    std::fs::metadata(p).map(|m| m.len()).map_err(io_err(p, "stat"))
}
