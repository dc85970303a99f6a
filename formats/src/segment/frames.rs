//! A sealed segment's zstd frames and their index: what lets a reader inflate only the part of
//! a sealed file it needs (one time range's probe chunks, or the window summaries alone).
//!
//! The sealer cuts the segment's bytes into groups of consecutive frames of one content (probe
//! chunks, window summaries, path traces, dictionary entries), each at most [`GROUP_RAW_BYTES`]
//! unless a single frame is larger, and compresses each group as an independent zstd frame with
//! its own checksum. The header page is a frame of its own, the one frame that states no size:
//! a build from before the index sizes its buffer by the first frame's stated size, and without
//! one streams the file whole instead of failing on the frames after it. Inflated one after the
//! other, the groups give back the segment byte for byte, so a whole-file read (and `zstd -d`)
//! sees what it always saw. The index ([`SealedFrame`], one per zstd frame) rides in the sealed summary
//! (`summary`): where each frame lies in the file and in the segment, what it holds, and for
//! probe chunks their valid records and send-time span.
//!
//! Why per content and not per size alone: a reader of the window summaries (`analyze
//! localize` from summaries) then inflates none of the records, and a reader of a range of
//! records none of the summaries. Why 1 MiB: a ranged read holds the groups that overlap its
//! range in every file the range touches, so the group bounds what one file costs a range
//! (about 20,000 records). What it costs (`bench formats`): 2.4% more bytes than one frame for
//! records alone; 12.9% with window summaries, whose frames come between every chunk's, so
//! that each zstd frame is one chunk or one batch of summaries and keeps less context.
//!
//! The index is a copy of facts, as the rest of the summary is: [`check_index`] holds it to the
//! file's own layout (contiguous frames that end where the summary starts, raw offsets that end
//! where the close block says the data ends, record counts that add up to the file's), and a
//! partial read checks every group it inflates against its entry; a group no read inflates is
//! not checked.

use std::io::Write;
use std::ops::Range;

use rkyv::{Archive, Deserialize, Serialize};

use super::layout::{FRAME_ALIGN, FRAME_HEADER_BYTES, FrameKind, HEADER_BYTES, decode_frame_header, frame_span};

/// Raw bytes past which the sealer starts another group of the same content.
pub const GROUP_RAW_BYTES: usize = 1 << 20;

/// What one zstd frame of a sealed segment holds.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub enum Content {
    /// The header page (with the close block).
    Header,
    /// Dictionary frames: every partial read inflates them, since every id needs them.
    Dictionary,
    /// Probe chunks.
    Probes,
    /// Path traces.
    Paths,
    /// Window summaries.
    Windows,
    /// Bytes after a frame header that does not decode: kept as evidence, never read in part.
    Other,
}

/// One zstd frame of a sealed segment.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct SealedFrame {
    /// What its segment frames hold.
    pub content: Content,
    /// Offset of the zstd frame in the file.
    pub at: u64,
    /// Its compressed length.
    pub len: u64,
    /// Offset of what it inflates to in the segment.
    pub raw_at: u64,
    /// Length of what it inflates to.
    pub raw_len: u64,
    /// Valid probe records in the frames before it: the position of its first record in the file.
    pub records_before: u64,
    /// Valid probe records in it.
    pub records: u64,
    /// Smallest and largest T1 of those records.
    pub t1_span: Option<(u64, u64)>,
}

/// Which parts of a sealed segment a partial read inflates ([`SegmentReader::open_part`]). The
/// header page and the dictionary are always read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pick {
    /// Probe chunks whose send times reach into this inclusive range, if any.
    pub probes: Option<(u64, u64)>,
    /// The window summaries.
    pub windows: bool,
    /// The path traces.
    pub paths: bool,
}

impl Pick {
    /// Whether a read of this pick inflates `f`.
    pub fn wants(&self, f: &SealedFrame) -> bool {
        match f.content {
            Content::Header | Content::Dictionary => true,
            Content::Probes => match (self.probes, f.t1_span) {
                (Some((lo, hi)), Some((first, last))) => first <= hi && last >= lo,
                _ => false,
            },
            Content::Paths => self.paths,
            Content::Windows => self.windows,
            Content::Other => false,
        }
    }
}

/// A group of segment frames the sealer compresses as one zstd frame (a [`SealedFrame`] before
/// it has a place in the file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Group {
    content: Content,
    raw: Range<usize>,
    records: u64,
    t1_span: Option<(u64, u64)>,
}

fn content_of(kind: FrameKind) -> Content {
    match kind {
        FrameKind::DictionaryV1 | FrameKind::Dictionary => Content::Dictionary,
        FrameKind::Probes => Content::Probes,
        FrameKind::Paths => Content::Paths,
        FrameKind::Windows => Content::Windows,
    }
}

/// The groups a segment's bytes `raw` are sealed in: the header page, then its frames up to
/// `end`, cut where the content changes or a group would pass [`GROUP_RAW_BYTES`]. `chunks` are
/// its valid probe chunks in file order (where the payload starts, its records' T1), which the
/// groups' records and spans count.
pub(super) fn groups<T: Iterator<Item = u64>>(
    raw: &[u8],
    end: usize,
    chunks: impl Iterator<Item = (usize, T)>,
) -> Vec<Group> {
    let mut out = vec![Group { content: Content::Header, raw: 0..HEADER_BYTES, records: 0, t1_span: None }];
    let mut off = HEADER_BYTES;
    while off < end {
        let (content, next) = match raw.get(off..off + FRAME_HEADER_BYTES).map(decode_frame_header) {
            Some(Ok(h)) => (content_of(h.kind), (off + frame_span(h.payload_len as usize)).min(end)),
            _ => (Content::Other, end),
        };
        match out.last_mut() {
            Some(g) if g.content == content && next - g.raw.start <= GROUP_RAW_BYTES => g.raw.end = next,
            _ => out.push(Group { content, raw: off..next, records: 0, t1_span: None }),
        }
        off = next;
    }
    let mut g = 0;
    for (start, t1) in chunks {
        while g + 1 < out.len() && !out[g].raw.contains(&start) {
            g += 1;
        }
        let group = &mut out[g];
        for t in t1 {
            group.records += 1;
            let (lo, hi) = group.t1_span.get_or_insert((t, t));
            *lo = (*lo).min(t);
            *hi = (*hi).max(t);
        }
    }
    out
}

/// Compresses `header` (the sealed copy's header page) and `raw`'s groups, each as one zstd
/// frame with a checksum and its size, into `out`; the index of what was written.
pub(super) fn write_groups(
    out: &mut impl Write,
    header: &[u8],
    raw: &[u8],
    groups: &[Group],
    zstd_level: i32,
) -> std::io::Result<Vec<SealedFrame>> {
    use zstd::zstd_safe::CParameter::{ChecksumFlag, ContentSizeFlag};
    let mut z = zstd::bulk::Compressor::new(zstd_level)?;
    z.set_parameter(ChecksumFlag(true))?;
    let mut buf = Vec::new();
    let (mut at, mut records_before) = (0u64, 0u64);
    let mut index = Vec::with_capacity(groups.len());
    for g in groups {
        let src = if g.content == Content::Header { header } else { &raw[g.raw.clone()] };
        // The header page's frame states no size: a build before the index sizes its buffer by
        // the first frame's stated size and would fail on the frames after it; without one, it
        // streams the file, every frame, and reads it whole. Every other frame states its size.
        z.set_parameter(ContentSizeFlag(g.content != Content::Header))?;
        buf.clear();
        buf.reserve(zstd::zstd_safe::compress_bound(src.len()));
        z.compress_to_buffer(src, &mut buf)?;
        out.write_all(&buf)?;
        index.push(SealedFrame {
            content: g.content,
            at,
            len: buf.len() as u64,
            raw_at: g.raw.start as u64,
            raw_len: src.len() as u64,
            records_before,
            records: g.records,
            t1_span: g.t1_span,
        });
        at += buf.len() as u64;
        records_before += g.records;
    }
    Ok(index)
}

/// Whether `index` is what sealing the reader's bytes wrote, in everything but the compressed
/// offsets (the sealer's read-back check).
pub(super) fn index_matches(index: &[SealedFrame], groups: &[Group]) -> bool {
    index.len() == groups.len()
        && index.iter().zip(groups).all(|(f, g)| {
            f.content == g.content
                && f.raw_at == g.raw.start as u64
                && f.raw_len == g.raw.len() as u64
                && f.records == g.records
                && f.t1_span == g.t1_span
        })
}

/// Checks an index against the file it came with: frames back to back from the file's start
/// to `data_len` (where the summary's frame starts), inflating back to back from the header page
/// to `data_end`, with records adding up to `records`. An empty index (a file sealed as one
/// frame) passes: it is read whole.
pub(super) fn check_index(index: &[SealedFrame], data_len: u64, data_end: u64, records: u64) -> Result<(), String> {
    let Some(first) = index.first() else { return Ok(()) };
    if first.content != Content::Header || first.at != 0 || first.raw_at != 0 || first.raw_len != HEADER_BYTES as u64 {
        return Err("its first frame is not the header page".into());
    }
    let (mut at, mut raw_at, mut before) = (0u64, 0u64, 0u64);
    for (i, f) in index.iter().enumerate() {
        let placed = f.at == at && f.raw_at == raw_at && f.records_before == before;
        // Frames start 16-aligned, so every group but the last (which may end in a frame's
        // padding) is a multiple of 16 long: a partial read's groups then stay aligned for rkyv.
        let aligned = f.raw_len % FRAME_ALIGN as u64 == 0 || i + 1 == index.len();
        let shaped = f.len > 0 && f.raw_len > 0 && aligned;
        let counted = f.content == Content::Probes || (f.records == 0 && f.t1_span.is_none());
        let spanned = f.t1_span.is_none_or(|(lo, hi)| lo <= hi) && (f.records == 0) == f.t1_span.is_none();
        if !(placed && shaped && counted && spanned) {
            return Err(format!("frame {i} does not follow frame {} or does not add up", i.saturating_sub(1)));
        }
        let next = (at.checked_add(f.len), raw_at.checked_add(f.raw_len), before.checked_add(f.records));
        let (Some(a), Some(r), Some(b)) = next else {
            return Err(format!("frame {i} runs past the largest offset"));
        };
        (at, raw_at, before) = (a, r, b);
    }
    if (at, raw_at, before) != (data_len, data_end, records) {
        return Err(format!(
            "its frames end at byte {at}, inflate to {raw_at} bytes and hold {before} records where the file's data ends at {data_len}, inflates to {data_end} and holds {records}"
        ));
    }
    Ok(())
}
