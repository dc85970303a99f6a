//! The segment reader: validates a whole segment once, then hands out zero-copy views.
//!
//! Open segments are mmap'd read-only; sealed ones are decompressed into one aligned buffer,
//! whole ([`SegmentReader::open`]) or in part ([`SegmentReader::open_part`]: the zstd frames of
//! one time range's probe chunks, or of the window summaries, found through the sealed file's
//! frame index, `frames`). Either way the reader checks the header, the close block, every
//! frame checksum and every rkyv payload it holds before it returns, and records what it had to
//! skip as [`Damage`]. After that, column access costs nothing.

use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use rkyv::rancor;
use rkyv::util::AlignedVec;
use rkyv::vec::ArchivedVec;
use rkyv::{Archive, Deserialize, Serialize};

use super::frames::{Content, Pick, SealedFrame};
use super::layout::{
    CloseBlock, FRAME_HEADER_BYTES, FrameHeaderError, FrameKind, HEADER_BYTES, HeaderFields, HeaderProblem,
    IDENTITY_OFFSET, WriterIdentity, decode_close, decode_frame_header, decode_header, frame_span,
};
use super::{FORMAT_VERSION, SegmentError, io_err};
use crate::record::{
    ArchivedEndpoint, ArchivedEndpointV1, ArchivedPathRecord, ArchivedProbeColumns, Endpoint, EndpointV1, MAX_HOPS,
    READABLE_SCHEMA_HASHES, SCHEMA_HASH,
};
use crate::window::ArchivedWindowSummary;

/// A sealed segment never decompresses beyond this: a corrupt or hostile `.zst` must not be
/// able to exhaust memory.
const MAX_DECOMPRESSED_BYTES: u64 = 4 << 30;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// What kind of damage a segment had.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub enum DamageKind {
    /// The last frame is incomplete: the writer died mid-write. Expected after a crash.
    TornTail,
    /// A frame whose header holds but whose payload fails its checksum or validation; the
    /// frames after it are still read.
    CorruptChunk,
    /// A frame header that does not decode before the end the close block promises: nothing
    /// after it can be located.
    CorruptFrameHeader,
    /// The close block is present but damaged, or promises more data than the file has.
    CloseBlock,
    /// Window summaries that fail validation, or that count other probes than the file's
    /// records: they are not used, and the records stand (nothing is lost).
    Summary,
}

/// One thing the reader had to skip, and where.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct Damage {
    /// Byte offset in the (decompressed) segment.
    pub offset: u64,
    /// What it was.
    pub kind: DamageKind,
    /// Records known to be lost with it (`None` when the frame header itself was unreadable).
    pub records_lost: Option<u32>,
    /// Human-readable detail.
    pub detail: String,
}

enum Bytes {
    Mapped(Mmap),
    Owned(AlignedVec<16>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A validated segment.
pub struct SegmentReader {
    path: PathBuf,
    bytes: Bytes,
    created_unix_ns: u64,
    identity: WriterIdentity,
    close: Option<CloseBlock>,
    /// Read in part ([`SegmentReader::open_part`]).
    partial: bool,
    found: Scanned,
}

impl std::fmt::Debug for SegmentReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentReader")
            .field("path", &self.path)
            .field("sealed", &self.is_sealed())
            .field("identity", &self.identity)
            .field("records", &self.found.records)
            .field("damage", &self.found.damage)
            .finish_non_exhaustive()
    }
}

impl SegmentReader {
    /// Open and validate an open (`.rseg`) or sealed (`.rseg.zst`) segment, recognised by content.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SegmentError> {
        let path = path.as_ref();
        let mut file = File::open(path).map_err(io_err(path, "open segment"))?;
        let mut magic = [0u8; 8];
        let got = read_up_to(&mut file, &mut magic).map_err(io_err(path, "read segment"))?;
        let bytes = if got >= 4 && magic[..4] == ZSTD_MAGIC {
            Bytes::Owned(decompress(path, file)?)
        } else {
            if path.to_string_lossy().ends_with(super::OPEN_SUFFIX) && magic[..got].iter().all(|&b| b == 0) {
                return Err(SegmentError::Unwritten { path: path.into() });
            }
            if got < 8 || magic != super::layout::SEGMENT_MAGIC {
                return Err(SegmentError::Foreign { path: path.into(), found: hex(&magic[..got]) });
            }
            // SAFETY: mapped read-only. A rocemesh writer only appends frames after the ones
            // validated below and truncates only past its data end, so validated bytes never
            // change under us; a foreign process truncating the file is outside the contract.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err(path, "mmap segment"))?;
            Bytes::Mapped(map)
        };
        Self::validate(path.to_path_buf(), bytes)
    }

    /// Open a sealed segment in part: its header page, its dictionary and the zstd frames of
    /// `index` (the file's sealed summary's, `read_summary`) that `pick` wants, each inflated
    /// and validated as [`SegmentReader::open`] validates the whole file, and each checked
    /// against its index entry. The reader then holds those frames only: [`Self::records`] and
    /// [`Self::time_range`] are of the probe chunks read, [`Self::file_records`] is the file's,
    /// and damage is reported for what was read: a group whose zstd frame does not inflate (bit
    /// rot) is damage whose records are lost, on every read of it. Summaries that count more
    /// probes than the file holds are set aside as damage; a whole read also says whether a
    /// corrupt chunk explains them. An index that disagrees with what it inflates is an error
    /// (read the file whole instead); an empty index is read whole.
    pub fn open_part(path: impl AsRef<Path>, index: &[SealedFrame], pick: &Pick) -> Result<Self, SegmentError> {
        let path = path.as_ref();
        if index.is_empty() {
            return Self::open(path);
        }
        let bad = |reason: String| SegmentError::BadSealed { path: path.into(), reason };
        let chosen: Vec<&SealedFrame> = index.iter().filter(|f| pick.wants(f)).collect();
        let total = chosen.iter().map(|f| f.raw_len).fold(0u64, u64::saturating_add);
        if total >= MAX_DECOMPRESSED_BYTES {
            return Err(bad(format!("its frame index inflates to more than {MAX_DECOMPRESSED_BYTES} bytes")));
        }
        let file = File::open(path).map_err(io_err(path, "open segment"))?;
        let mut out = AlignedVec::<16>::with_capacity(total as usize);
        let (mut src, mut dctx) = (Vec::new(), zstd::zstd_safe::DCtx::create());
        let mut parts = Vec::with_capacity(chosen.len());
        let mut lost = Vec::new();
        for f in chosen {
            src.resize(f.len as usize, 0);
            file.read_exact_at(&mut src, f.at).map_err(io_err(path, "read sealed segment"))?;
            // Not one whole zstd frame where the index says: the index lies, not the data.
            if zstd::zstd_safe::find_frame_compressed_size(&src) != Ok(src.len()) {
                return Err(bad(format!("the index places a zstd frame at byte {} that is not there", f.at)));
            }
            let start = out.len();
            let n = match dctx.decompress(&mut Appending { v: &mut out, start }, &src) {
                Ok(n) => n as u64,
                // A whole frame that fails its checksum or its blocks: damage to its group only,
                // lost on every read, as a corrupt chunk is. The header and the dictionary are
                // needed by every record: without them the file cannot be read.
                Err(code) if matches!(f.content, Content::Probes | Content::Windows | Content::Paths) => {
                    out.resize(start, 0);
                    lost.push(lost_group(f, zstd::zstd_safe::get_error_name(code)));
                    continue;
                }
                Err(code) => {
                    let why = zstd::zstd_safe::get_error_name(code);
                    return Err(bad(format!("the zstd frame at byte {} does not inflate: {why}", f.at)));
                }
            };
            if n != f.raw_len {
                return Err(bad(format!(
                    "the zstd frame at byte {} inflates to {n} bytes, its index says {}",
                    f.at, f.raw_len
                )));
            }
            parts.push((start..out.len(), f));
        }
        Self::validate_part(path.to_path_buf(), Bytes::Owned(out), &parts, lost)
    }

    /// [`Self::validate`] for [`Self::open_part`]'s buffer: `parts` are the frames it holds, in
    /// file order, the header page first.
    fn validate_part(
        path: PathBuf,
        bytes: Bytes,
        parts: &[(Range<usize>, &SealedFrame)],
        lost: Vec<Damage>,
    ) -> Result<Self, SegmentError> {
        let b = bytes.as_slice();
        let (header, identity) = header_page(&path, b)?;
        let bad = |reason: String| SegmentError::BadSealed { path: path.clone(), reason };
        let close = match decode_close(b) {
            Ok(Some(c)) => c,
            Ok(None) => return Err(bad("no close block: a partial read needs a sealed file's".into())),
            Err(reason) => return Err(bad(format!("close block: {reason}"))),
        };
        let mut scan = Scan::new(b, b.len(), true);
        scan.damage = lost;
        let (mut lo, mut hi) = (u64::MAX, 0);
        for (range, f) in parts.iter().filter(|(_, f)| f.content != Content::Header) {
            let (records, damaged) = (scan.records, scan.damage.len());
            scan.base = f.records_before.wrapping_sub(records);
            scan.limit = range.end;
            scan.lo = u64::MAX;
            scan.hi = 0;
            scan.run_from(range.start);
            // Offsets said in the segment's terms, as a whole read says them.
            let shift = f.raw_at.wrapping_sub(range.start as u64);
            scan.damage[damaged..].iter_mut().for_each(|d| d.offset = d.offset.wrapping_add(shift));
            let span = (scan.records > records).then_some((scan.lo, scan.hi));
            if scan.records - records != f.records || span != f.t1_span {
                return Err(bad(format!(
                    "the frame at raw byte {} holds {} records in {span:?} where its index says {} in {:?}",
                    f.raw_at,
                    scan.records - records,
                    f.records,
                    f.t1_span
                )));
            }
            lo = lo.min(scan.lo);
            hi = hi.max(scan.hi);
        }
        let read_span = (scan.records > 0).then_some((lo, hi));
        // The summaries read are held to the whole file's records, as the close block counts
        // them (the records themselves may not have been read).
        let said = scan.damage.len();
        let mut read = scan.finish(close.records, (close.first_unix_ns, close.last_unix_ns), read_span);
        // What `finish` added is said at an offset in the buffer: put it in the segment's terms.
        for d in &mut read.damage[said..] {
            let part = parts.iter().find(|(r, _)| r.contains(&(d.offset as usize)));
            d.offset = part.map_or(d.offset, |(r, f)| f.raw_at.wrapping_add(d.offset - r.start as u64));
        }
        let (created_unix_ns, close) = (header.created_unix_ns, Some(close));
        Ok(Self { path, bytes, created_unix_ns, identity, close, partial: true, found: read })
    }

    fn validate(path: PathBuf, bytes: Bytes) -> Result<Self, SegmentError> {
        let b = bytes.as_slice();
        let (header, identity) = header_page(&path, b)?;
        let mut damage = Vec::new();
        let close = match decode_close(b) {
            Ok(c) => c,
            Err(reason) => {
                damage.push(Damage {
                    offset: super::layout::CLOSE_OFFSET as u64,
                    kind: DamageKind::CloseBlock,
                    records_lost: None,
                    detail: reason.into(),
                });
                None
            }
        };
        let mut limit = b.len();
        if let Some(c) = close {
            if c.data_end as usize > b.len() || (c.data_end as usize) < HEADER_BYTES {
                damage.push(Damage {
                    offset: c.data_end,
                    kind: DamageKind::CloseBlock,
                    records_lost: None,
                    detail: format!("close block says data ends at {} but the file has {} bytes", c.data_end, b.len()),
                });
            } else {
                limit = c.data_end as usize;
            }
        }

        let mut scan = Scan::new(b, limit, close.is_some());
        scan.damage = damage;
        scan.run_from(HEADER_BYTES);
        let (records, lo, hi) = (scan.records, scan.lo, scan.hi);
        let read = scan.finish(records, (lo, hi), (records > 0).then_some((lo, hi)));
        Ok(Self { path, bytes, created_unix_ns: header.created_unix_ns, identity, close, partial: false, found: read })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this is a sealed (compressed) segment.
    pub fn is_sealed(&self) -> bool {
        matches!(self.bytes, Bytes::Owned(_))
    }

    /// Whether the writer closed the segment (false: still being written, or the writer died).
    pub fn is_closed(&self) -> bool {
        self.close.is_some()
    }

    /// Who wrote it.
    pub fn identity(&self) -> &WriterIdentity {
        &self.identity
    }

    /// When the writer created it (time of its first record).
    pub fn created_unix_ns(&self) -> u64 {
        self.created_unix_ns
    }

    /// The endpoint dictionary; `dictionary()[id]` is the endpoint with that id.
    pub fn dictionary(&self) -> &[Endpoint] {
        &self.found.dictionary
    }

    /// Complete, valid probe records in the segment (in the chunks read, when read in part).
    pub fn records(&self) -> u64 {
        self.found.records
    }

    /// Whether only some of the file's frames were read ([`Self::open_part`]).
    pub fn is_partial(&self) -> bool {
        self.partial
    }

    /// The file's valid probe records: [`Self::records`], or its close block's count when read
    /// in part.
    pub fn file_records(&self) -> u64 {
        match self.close {
            Some(c) if self.partial => c.records,
            _ => self.found.records,
        }
    }

    /// Smallest and largest probe `t1_unix_ns`, if there is any record.
    pub fn time_range(&self) -> Option<(u64, u64)> {
        self.found.time_range
    }

    /// What had to be skipped. Empty for a healthy segment.
    pub fn damage(&self) -> &[Damage] {
        &self.found.damage
    }

    /// The probe chunks, in file order, as zero-copy column views.
    pub fn probe_chunks(&self) -> impl ExactSizeIterator<Item = &ArchivedProbeColumns> + '_ {
        let b = self.bytes.as_slice();
        self.found.probe_chunks.iter().map(move |r| {
            // SAFETY: `r` was validated with `rkyv::access::<ArchivedProbeColumns>` in `open`,
            // and the bytes behind it are immutable for the reader's lifetime.
            unsafe { rkyv::access_unchecked::<ArchivedProbeColumns>(&b[r.clone()]) }
        })
    }

    /// The probe chunks, each with the position in the file of its first record (the valid
    /// records before it): what places a partial read's records among the file's.
    pub fn probe_chunks_at(&self) -> impl ExactSizeIterator<Item = (u64, &ArchivedProbeColumns)> + '_ {
        self.found.probe_bases.iter().copied().zip(self.probe_chunks())
    }

    /// Every path trace, in file order.
    pub fn path_records(&self) -> impl Iterator<Item = &ArchivedPathRecord> + '_ {
        let b = self.bytes.as_slice();
        self.found.path_chunks.iter().flat_map(move |r| {
            // SAFETY: validated as `ArchivedVec<ArchivedPathRecord>` in `open`; bytes immutable.
            let v = unsafe { rkyv::access_unchecked::<ArchivedVec<ArchivedPathRecord>>(&b[r.clone()]) };
            v.iter()
        })
    }

    /// The window summaries ([`crate::window`]), in file order: each validated, and together
    /// counting no probe the file does not hold.
    pub fn window_summaries(&self) -> impl Iterator<Item = &ArchivedWindowSummary> + '_ {
        let b = self.bytes.as_slice();
        self.found.window_frames.iter().flat_map(move |r| {
            // SAFETY: validated as `ArchivedVec<ArchivedWindowSummary>` in `open`; bytes immutable.
            let v = unsafe { rkyv::access_unchecked::<ArchivedVec<ArchivedWindowSummary>>(&b[r.clone()]) };
            v.iter()
        })
    }

    /// Probes the window summaries count.
    pub fn summarized_records(&self) -> u64 {
        self.found.summarized
    }

    /// Whether the window summaries count every record of the file: a closed segment whose
    /// writer summarised (an open one's summaries trail its records by the open windows).
    pub fn summaries_complete(&self) -> bool {
        !self.found.window_frames.is_empty() && self.close.is_some() && self.found.summarized == self.file_records()
    }

    /// The raw (decompressed) bytes.
    pub(crate) fn raw(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// End of the last frame whose header could be read: what sealing keeps.
    pub(crate) fn frames_end(&self) -> usize {
        self.found.frames_end
    }

    /// Probe chunks in the segment (valid ones).
    pub(crate) fn chunk_count(&self) -> usize {
        self.found.probe_chunks.len()
    }

    /// Where each valid probe chunk's payload lies in [`Self::raw`].
    pub(crate) fn probe_ranges(&self) -> &[Range<usize>] {
        &self.found.probe_chunks
    }
}

/// The damage of a group whose zstd frame does not inflate (`why`): its records are lost.
fn lost_group(f: &SealedFrame, why: &str) -> Damage {
    let (kind, records_lost) = match f.content {
        Content::Windows => (DamageKind::Summary, None),
        _ => (DamageKind::CorruptChunk, Some(u32::try_from(f.records).unwrap_or(u32::MAX))),
    };
    Damage {
        offset: f.raw_at,
        kind,
        records_lost,
        detail: format!("the zstd frame at byte {} of the file does not inflate ({why}): its group is lost", f.at),
    }
}

/// The header page of the segment whose bytes start `b`, checked as [`SegmentReader::open`]
/// checks it: magic, version, checksum, schema, and the writer identity.
pub(super) fn header_page(path: &Path, b: &[u8]) -> Result<(HeaderFields, WriterIdentity), SegmentError> {
    let header = decode_header(b).map_err(|p| match p {
        HeaderProblem::Foreign => SegmentError::Foreign { path: path.into(), found: hex(&b[..b.len().min(8)]) },
        HeaderProblem::Version(found) => {
            SegmentError::UnsupportedVersion { path: path.into(), found, supported: FORMAT_VERSION }
        }
        HeaderProblem::Damaged(reason) => SegmentError::BadHeader { path: path.into(), reason },
    })?;
    if !READABLE_SCHEMA_HASHES.contains(&header.schema_hash) {
        return Err(SegmentError::SchemaMismatch {
            path: path.into(),
            found: header.schema_hash,
            expected: SCHEMA_HASH,
        });
    }
    let id_bytes = &b[IDENTITY_OFFSET..IDENTITY_OFFSET + header.identity_len as usize];
    let identity = rkyv::from_bytes::<WriterIdentity, rancor::Error>(id_bytes)
        .map_err(|e| SegmentError::BadHeader { path: path.into(), reason: format!("writer identity: {e}") })?;
    Ok((header, identity))
}

struct Scan<'a> {
    b: &'a [u8],
    limit: usize,
    closed: bool,
    dictionary: Vec<Endpoint>,
    probes: Vec<Range<usize>>,
    /// Position of each probe chunk's first record: `base` plus the records accepted before it.
    bases: Vec<u64>,
    base: u64,
    paths: Vec<Range<usize>>,
    windows: Vec<Range<usize>>,
    summarized: u64,
    /// Earliest and latest send time the summaries count.
    summary_span: (u64, u64),
    records: u64,
    lo: u64,
    hi: u64,
    damage: Vec<Damage>,
    end: usize,
}

/// What a scan found, once its window summaries are held to the records ([`Scan::finish`]):
/// what a reader holds of its file besides the header and close block.
struct Scanned {
    dictionary: Vec<Endpoint>,
    probe_chunks: Vec<Range<usize>>,
    /// Position in the file of each probe chunk's first record (valid records before it).
    probe_bases: Vec<u64>,
    path_chunks: Vec<Range<usize>>,
    window_frames: Vec<Range<usize>>,
    summarized: u64,
    records: u64,
    /// Of the records read.
    time_range: Option<(u64, u64)>,
    frames_end: usize,
    damage: Vec<Damage>,
}

impl<'a> Scan<'a> {
    fn new(b: &'a [u8], limit: usize, closed: bool) -> Self {
        Scan {
            b,
            limit,
            closed,
            dictionary: Vec::new(),
            probes: Vec::new(),
            bases: Vec::new(),
            base: 0,
            paths: Vec::new(),
            windows: Vec::new(),
            summarized: 0,
            summary_span: (u64::MAX, 0),
            records: 0,
            lo: u64::MAX,
            hi: 0,
            damage: Vec::new(),
            end: HEADER_BYTES,
        }
    }

    /// Holds the summaries to the file's `records` sent over `span`; `time_range` is that of the
    /// records read.
    ///
    /// A segment's summaries count its records, or fewer: the writer summarises each chunk
    /// it writes and closes every window into the file before closing it, but an open
    /// segment's trail its records by the windows still open, and a writer that died, or had
    /// no room for them, left some unwritten (`summaries_complete` says whether they count
    /// them all). Summaries that count more, or probes sent when none of the file's were,
    /// are not of these records: explained when records were lost to damage (they are then
    /// simply not used), else another file's or a forgery, which is said.
    fn finish(self, records: u64, (lo, hi): (u64, u64), time_range: Option<(u64, u64)>) -> Scanned {
        let (read, end) = (self.records, self.end);
        let Scan { dictionary, probes, bases, paths, mut windows, summarized, summary_span, mut damage, .. } = self;
        let problem = if summarized > records {
            Some(format!("window summaries count {summarized} probes where the file holds {records} records"))
        } else if summarized > 0 && (summary_span.0 < lo || summary_span.1 > hi) {
            Some(format!(
                "window summaries count probes sent at {}..={} ns, outside the records' {lo}..={hi}",
                summary_span.0, summary_span.1
            ))
        } else {
            None
        };
        let explained = damage.iter().any(|d| d.kind != DamageKind::Summary);
        if problem.is_some() && explained {
            windows.clear();
        }
        if let Some(problem) = problem.filter(|_| !windows.is_empty()) {
            damage.push(Damage {
                offset: windows[0].start as u64,
                kind: DamageKind::Summary,
                records_lost: None,
                detail: format!("{problem}: the summaries are not used, the records are"),
            });
            windows.clear();
        }
        let summarized = if windows.is_empty() { 0 } else { summarized };
        Scanned {
            dictionary,
            probe_chunks: probes,
            probe_bases: bases,
            path_chunks: paths,
            window_frames: windows,
            summarized,
            records: read,
            time_range,
            frames_end: end,
            damage,
        }
    }

    fn run_from(&mut self, start: usize) {
        let mut off = start;
        while off < self.limit {
            if off + FRAME_HEADER_BYTES > self.limit {
                if self.b[off..self.limit].iter().any(|&x| x != 0) {
                    self.torn(off, None, "frame header cut off by the end of the file".into());
                }
                return;
            }
            let h = match decode_frame_header(&self.b[off..off + FRAME_HEADER_BYTES]) {
                Ok(h) => h,
                Err(FrameHeaderError::Zero) => {
                    // The writer puts the payload down before its header: a zero header followed
                    // by data is a chunk that was being written when the writer died.
                    let probe_end = (off + FRAME_HEADER_BYTES + 256).min(self.limit);
                    if self.closed {
                        self.push(
                            off,
                            DamageKind::CorruptFrameHeader,
                            None,
                            "zeros where the close block promises frames".into(),
                        );
                    } else if self.b[off + FRAME_HEADER_BYTES..probe_end].iter().any(|&x| x != 0) {
                        self.torn(off, None, "payload written but its frame header not: writer died mid-chunk".into());
                    }
                    return;
                }
                Err(FrameHeaderError::Bad(reason)) => {
                    if self.closed {
                        self.push(off, DamageKind::CorruptFrameHeader, None, reason.into());
                    } else {
                        self.torn(off, None, reason.into());
                    }
                    return;
                }
            };
            let payload_start = off + FRAME_HEADER_BYTES;
            let payload_end = payload_start + h.payload_len as usize;
            if payload_end > self.limit {
                self.torn(
                    off,
                    Some(h.records),
                    format!("payload of {} bytes cut off by the end of the data", h.payload_len),
                );
                return;
            }
            let next = off + frame_span(h.payload_len as usize);
            let payload = &self.b[payload_start..payload_end];
            // A summary frame's count is of probes whose records are elsewhere in the file: its
            // damage loses none of them.
            let (lost, kind) = match h.kind {
                FrameKind::Windows => (None, DamageKind::Summary),
                _ => (Some(h.records), DamageKind::CorruptChunk),
            };
            if crc32c::crc32c(payload) != h.payload_crc {
                let is_last = next >= self.limit
                    || next + FRAME_HEADER_BYTES > self.limit
                    || decode_frame_header(&self.b[next..next + FRAME_HEADER_BYTES]).is_err();
                if is_last && !self.closed {
                    self.torn(off, lost, "last chunk's payload checksum does not match: torn write".into());
                    return;
                }
                self.push(off, kind, lost, "payload checksum does not match".into());
            } else if let Err(reason) = self.accept(h.kind, h.records, payload_start..payload_end) {
                self.push(off, kind, lost, reason);
            }
            self.end = next.min(self.limit);
            off = next;
        }
    }

    fn accept(&mut self, kind: FrameKind, records: u32, range: Range<usize>) -> Result<(), String> {
        let payload = &self.b[range.clone()];
        match kind {
            FrameKind::Probes => {
                let cols = rkyv::access::<ArchivedProbeColumns, rancor::Error>(payload)
                    .map_err(|e| format!("probe chunk: {e}"))?;
                if !cols.is_rectangular() || cols.len() != records as usize {
                    return Err(format!("probe chunk columns disagree with each other or with its {records} records"));
                }
                for t in cols.t1_unix_ns.iter() {
                    let t = t.to_native();
                    self.lo = self.lo.min(t);
                    self.hi = self.hi.max(t);
                }
                self.bases.push(self.base.wrapping_add(self.records));
                self.records += u64::from(records);
                self.probes.push(range);
            }
            FrameKind::Dictionary => {
                let v = rkyv::access::<ArchivedVec<ArchivedEndpoint>, rancor::Error>(payload)
                    .map_err(|e| format!("dictionary: {e}"))?;
                for (i, e) in v.iter().enumerate() {
                    self.check_next_id(i, e.id.to_native())?;
                    let e = rkyv::deserialize::<Endpoint, rancor::Error>(e).map_err(|e| format!("dictionary: {e}"))?;
                    self.dictionary.push(e);
                }
            }
            FrameKind::DictionaryV1 => {
                let v = rkyv::access::<ArchivedVec<ArchivedEndpointV1>, rancor::Error>(payload)
                    .map_err(|e| format!("dictionary: {e}"))?;
                for (i, e) in v.iter().enumerate() {
                    self.check_next_id(i, e.id.to_native())?;
                    let e =
                        rkyv::deserialize::<EndpointV1, rancor::Error>(e).map_err(|e| format!("dictionary: {e}"))?;
                    self.dictionary.push(e.into());
                }
            }
            FrameKind::Paths => {
                let v = rkyv::access::<ArchivedVec<ArchivedPathRecord>, rancor::Error>(payload)
                    .map_err(|e| format!("path chunk: {e}"))?;
                if v.len() != records as usize || v.iter().any(|p| p.hop_count.to_native() as usize > MAX_HOPS) {
                    return Err("path chunk length or hop count out of range".into());
                }
                self.paths.push(range);
            }
            FrameKind::Windows => {
                let v = rkyv::access::<ArchivedVec<ArchivedWindowSummary>, rancor::Error>(payload)
                    .map_err(|e| format!("window summaries: {e}"))?;
                let problem = v.iter().enumerate().find_map(|(i, w)| w.problem().map(|p| format!("summary {i}: {p}")));
                let probes: u64 = v.iter().map(ArchivedWindowSummary::probes).sum();
                match problem {
                    Some(p) => return Err(format!("window summaries: {p}")),
                    None if probes != u64::from(records) => {
                        return Err(format!("window summaries count {probes} probes, their frame says {records}"));
                    }
                    None => {}
                }
                self.summarized += probes;
                for k in v.iter().flat_map(|w| w.keys.iter()) {
                    self.summary_span.0 = self.summary_span.0.min(k.first_t1_ns.to_native());
                    self.summary_span.1 = self.summary_span.1.max(k.last_t1_ns.to_native());
                }
                self.windows.push(range);
            }
        }
        Ok(())
    }

    /// Dictionary ids are dense: entry `i` of a frame must continue the previous frames' ids.
    fn check_next_id(&self, i: usize, id: u32) -> Result<(), String> {
        let want = self.dictionary.len() as u32;
        if id == want { Ok(()) } else { Err(format!("dictionary entry {i} has id {id} where {want} was expected")) }
    }

    fn torn(&mut self, off: usize, records_lost: Option<u32>, detail: String) {
        self.push(off, DamageKind::TornTail, records_lost, detail);
    }

    fn push(&mut self, off: usize, kind: DamageKind, records_lost: Option<u32>, detail: String) {
        self.damage.push(Damage { offset: off as u64, kind, records_lost, detail });
    }
}

/// Inflates a sealed segment whole. Its zstd frames state their sizes (the sealer's do), so the
/// file is inflated in one call into a buffer of exactly their sum: streaming it through a
/// small buffer into a growing one cost a copy of every byte and the growth's copies besides. A
/// frame that does not state its size (not the sealer's) is streamed, under the same limit.
fn decompress(path: &Path, mut file: File) -> Result<AlignedVec<16>, SegmentError> {
    let bad = |reason: String| SegmentError::BadSealed { path: path.into(), reason };
    let len = file.metadata().map_err(io_err(path, "stat sealed segment"))?.len();
    // zstd never makes data much larger than it was: a file this size cannot be a segment.
    if len > MAX_DECOMPRESSED_BYTES + (MAX_DECOMPRESSED_BYTES >> 6) {
        return Err(bad(format!(
            "{len} bytes is more than any sealed segment ({MAX_DECOMPRESSED_BYTES} bytes inflated)"
        )));
    }
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0)).map_err(io_err(path, "seek"))?;
    let mut src = Vec::with_capacity(len as usize);
    file.read_to_end(&mut src).map_err(io_err(path, "read sealed segment"))?;
    // Look at the first bytes before inflating the rest: a foreign .zst is refused cheaply.
    let mut head = [0u8; 8];
    let mut peek = zstd::stream::read::Decoder::with_buffer(&src[..]).map_err(|e| bad(e.to_string()))?;
    let got = read_up_to(&mut peek, &mut head).map_err(|e| bad(e.to_string()))?;
    if got < 8 || head != super::layout::SEGMENT_MAGIC {
        return Err(SegmentError::Foreign {
            path: path.into(),
            found: format!("zstd data starting with {}", hex(&head[..got])),
        });
    }
    let mut out = AlignedVec::<16>::new();
    inflate_frames(&src, &mut out).map_err(bad)?;
    Ok(out)
}

/// Inflates `src`'s zstd frames one after another into `out`, under [`MAX_DECOMPRESSED_BYTES`]
/// in all: a frame that states its size in one call into exactly that room (no copy, no
/// growth), one that does not (the sealer's header page, so that a build before the frame index
/// streams the file whole) through a stream; skippable frames (the summary) are skipped.
fn inflate_frames(src: &[u8], out: &mut AlignedVec<16>) -> Result<(), String> {
    let sized = stated_size(src)?;
    if sized >= MAX_DECOMPRESSED_BYTES {
        return Err(format!("decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes"));
    }
    // Room for every frame that states its size, and a header page for one that does not.
    out.reserve(sized as usize + HEADER_BYTES);
    let mut dctx = zstd::zstd_safe::DCtx::create();
    let mut off = 0usize;
    while off < src.len() {
        let rest = &src[off..];
        let step = zstd::zstd_safe::find_frame_compressed_size(rest)
            .map_err(|code| format!("zstd frame at byte {off}: {}", zstd::zstd_safe::get_error_name(code)))?;
        let frame = &rest[..step.min(rest.len())];
        if !is_skippable(frame) {
            let start = out.len();
            match zstd::zstd_safe::get_frame_content_size(frame) {
                Ok(Some(n)) => {
                    out.reserve(n as usize);
                    let got = dctx
                        .decompress(&mut Appending { v: out, start }, frame)
                        .map_err(|code| zstd::zstd_safe::get_error_name(code).to_owned())?;
                    if got as u64 != n {
                        return Err(format!("the frame at byte {off} inflated to {got} bytes where it says {n}"));
                    }
                }
                Ok(None) => {
                    let dec = zstd::stream::read::Decoder::with_buffer(frame).map_err(|e| e.to_string())?;
                    let left = MAX_DECOMPRESSED_BYTES.saturating_sub(start as u64);
                    std::io::copy(&mut dec.take(left), out).map_err(|e| e.to_string())?;
                }
                Err(e) => return Err(format!("zstd frame header at byte {off}: {e:?}")),
            }
            if out.len() as u64 >= MAX_DECOMPRESSED_BYTES {
                return Err(format!("decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes"));
            }
        }
        off += step.max(1);
    }
    Ok(())
}

fn is_skippable(frame: &[u8]) -> bool {
    frame.len() >= 8 && (frame[0] & 0xF0) == 0x50 && frame[1..4] == [0x2A, 0x4D, 0x18]
}

/// The sum of the sizes `src`'s zstd frames state, walking their headers (a frame that states
/// none counts nothing). Stops counting past [`MAX_DECOMPRESSED_BYTES`].
fn stated_size(src: &[u8]) -> Result<u64, String> {
    let (mut off, mut total) = (0usize, 0u64);
    while off < src.len() && total < MAX_DECOMPRESSED_BYTES {
        let rest = &src[off..];
        if !is_skippable(rest) {
            match zstd::zstd_safe::get_frame_content_size(rest) {
                Ok(n) => total = total.saturating_add(n.unwrap_or(0)),
                Err(e) => return Err(format!("zstd frame header at byte {off}: {e:?}")),
            }
        }
        let step = zstd::zstd_safe::find_frame_compressed_size(rest)
            .map_err(|code| format!("zstd frame at byte {off}: {}", zstd::zstd_safe::get_error_name(code)))?;
        off += step.max(1);
    }
    Ok(total)
}

/// The spare capacity of an [`AlignedVec`] past `start` (its length), which zstd inflates into
/// without zeroing it first: [`SegmentReader::open_part`] appends one frame after another.
struct Appending<'a> {
    v: &'a mut AlignedVec<16>,
    start: usize,
}

// SAFETY: `start` is the vector's length when it is made. `as_slice` is the initialised part
// past `start`; `as_mut_ptr` and `capacity` describe the vector's own allocation past `start`,
// which zstd never writes beyond; `filled_until` is called by zstd-safe only with the count
// zstd reports having written from there.
unsafe impl zstd::zstd_safe::WriteBuf for Appending<'_> {
    fn as_slice(&self) -> &[u8] {
        &self.v.as_slice()[self.start..]
    }

    fn capacity(&self) -> usize {
        self.v.capacity() - self.start
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: `start` is the vector's length, within its allocation.
        unsafe { self.v.as_mut_ptr().add(self.start) }
    }

    unsafe fn filled_until(&mut self, n: usize) {
        // SAFETY: the `n` bytes past `start` were written by zstd.
        unsafe { self.v.set_len(self.start + n) }
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn hex(b: &[u8]) -> String {
    if b.is_empty() {
        return "nothing (empty file)".into();
    }
    b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
}
