//! The summary a sealed segment carries after its data: what a pass that plans a read of
//! thousands of sealed files needs of each (`analyze report`'s first pass, every `analyze watch`
//! pass), so that it need not inflate them. Inflating every file twice, once to plan and once to
//! read, was half of `analyze report`'s time on sealed input.
//!
//! It is a zstd skippable frame after the data frame, so `zstd -d`, [`SegmentReader::open`] and
//! every other zstd decoder skip it, and it ends in a fixed tail so that it is found from the end
//! of the file:
//!
//! ```text
//! data frame (the segment) | 5E 2A 4D 18 | frame size u32 | rkyv body | body length u32 |
//!     body crc32c u32 | summary version u32 | "RSUM"
//! ```
//!
//! It is a copy of facts of the data, not the data: the reader never consults it, and a file
//! without one (sealed by an earlier build) is simply inflated to plan. The sealer checks it
//! against the sealed copy before that copy replaces the open segment, but a reader of the
//! summary alone cannot tell a forged one from a true one: whoever plans from it checks the
//! records and dictionary it promised when it reads the file (`analyze` does).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use rkyv::rancor;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

use super::frames::{SealedFrame, check_index};
use super::layout::{HEADER_BYTES, WriterIdentity, decode_close};
use super::reader::{Damage, SegmentReader, header_page};
use super::{SegmentError, io_err};
use crate::record::Endpoint;

/// A zstd skippable frame's magic (any of 0x184D2A50..=0x184D2A5F; this one is the summary's).
const SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
/// Last four bytes of a file that ends in a summary.
const TAIL_MAGIC: [u8; 4] = *b"RSUM";
/// Bytes after the body: length, checksum, version, magic.
const TAIL_BYTES: usize = 16;
/// The summary this build writes. Bump it whenever [`SealedSummary`]'s fields, or the rule of
/// [`send_gaps`], change: a summary of another version is not used, except version 1 (files
/// sealed as one zstd frame, without a frame index), which is read as this one without frames.
pub const SUMMARY_VERSION: u32 = 2;
/// A summary larger than this is not one (a dictionary of a million endpoints is ~100 MB; a
/// segment's has hundreds).
const MAX_SUMMARY_BYTES: u64 = 64 << 20;

/// A send gap is long above this many times the prober's median spacing, plus
/// [`LONG_GAP_MIN_NS`].
pub const LONG_GAP_FACTOR: u64 = 2;
/// See [`LONG_GAP_FACTOR`]: 100 ms, far beyond any scheduling jitter of a healthy agent.
pub const LONG_GAP_MIN_NS: u64 = 100_000_000;

/// One prober's long send gaps and its usual spacing ([`send_gaps`]).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct SendGaps {
    /// (send time before the gap, gap length), ns, in send-time order.
    pub long: Vec<(u64, u64)>,
    /// Median spacing between consecutive distinct send times, ns (0 with fewer than 3 records).
    pub median_ns: u64,
}

/// What a pass that plans a read needs of one segment, as its reader would tell it.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct SealedSummary {
    /// [`SegmentReader::records`].
    pub records: u64,
    /// [`SegmentReader::time_range`].
    pub time_range: Option<(u64, u64)>,
    /// [`SegmentReader::dictionary`].
    pub dictionary: Vec<Endpoint>,
    /// [`SegmentReader::damage`] of the sealed file.
    pub damage: Vec<Damage>,
    /// Records per second of T1 (`t1_unix_ns / 10^9`, records), ascending: records per window of
    /// any whole number of seconds.
    pub per_second: Vec<(u64, u64)>,
    /// [`send_gaps`] of every record's T1.
    pub send_gaps: SendGaps,
    /// Prober id of the file's first record.
    pub first_prober: Option<u32>,
    /// The file's zstd frames ([`SealedFrame`]), which a partial read inflates from
    /// ([`SegmentReader::open_part`]). Empty in a summary of a reader ([`SealedSummary::of`])
    /// and in files sealed as one frame: those are read whole.
    pub frames: Vec<SealedFrame>,
}

/// [`SealedSummary`] as version 1 wrote it, before the frame index.
#[derive(Archive, Serialize, Deserialize)]
struct SealedSummaryV1 {
    records: u64,
    time_range: Option<(u64, u64)>,
    dictionary: Vec<Endpoint>,
    damage: Vec<Damage>,
    per_second: Vec<(u64, u64)>,
    send_gaps: SendGaps,
    first_prober: Option<u32>,
}

impl From<SealedSummaryV1> for SealedSummary {
    fn from(v: SealedSummaryV1) -> Self {
        let SealedSummaryV1 { records, time_range, dictionary, damage, per_second, send_gaps, first_prober } = v;
        SealedSummary {
            records,
            time_range,
            dictionary,
            damage,
            per_second,
            send_gaps,
            first_prober,
            frames: Vec::new(),
        }
    }
}

impl SealedSummary {
    /// The summary of what `reader` holds, with `damage` as what a reader of the sealed copy
    /// reports (sealing drops a torn tail).
    pub fn of(reader: &SegmentReader, damage: Vec<Damage>) -> SealedSummary {
        let t1: Vec<u64> = reader.probe_chunks().flat_map(|c| c.t1_unix_ns.iter().map(|t| t.to_native())).collect();
        let mut seconds: Vec<u64> = t1.iter().map(|t| t / 1_000_000_000).collect();
        seconds.sort_unstable();
        let mut per_second: Vec<(u64, u64)> = Vec::new();
        for s in seconds {
            match per_second.last_mut() {
                Some((last, n)) if *last == s => *n += 1,
                _ => per_second.push((s, 1)),
            }
        }
        SealedSummary {
            records: reader.records(),
            time_range: reader.time_range(),
            dictionary: reader.dictionary().to_vec(),
            damage,
            per_second,
            send_gaps: send_gaps(&t1),
            first_prober: reader.probe_chunks().find_map(|c| c.prober.first().map(|v| v.to_native())),
            frames: Vec::new(),
        }
    }

    /// The summary as the skippable frame that ends a sealed file ([`crate::segment::seal`]
    /// appends it; tests and the fuzzer build forgeries with it).
    pub fn frame(&self) -> Vec<u8> {
        let body = rkyv::to_bytes::<rancor::Error>(self).expect("serialising plain data into memory cannot fail");
        frame_of(&body, SUMMARY_VERSION)
    }

    /// The summary as a build before the frame index wrote it (version 1, without frames).
    #[cfg(test)]
    pub(super) fn frame_v1(&self) -> Vec<u8> {
        let s = self.clone();
        let v1 = SealedSummaryV1 {
            records: s.records,
            time_range: s.time_range,
            dictionary: s.dictionary,
            damage: s.damage,
            per_second: s.per_second,
            send_gaps: s.send_gaps,
            first_prober: s.first_prober,
        };
        let body = rkyv::to_bytes::<rancor::Error>(&v1).expect("serialising plain data into memory cannot fail");
        frame_of(&body, 1)
    }
}

/// A summary's skippable frame around its serialised `body`.
fn frame_of(body: &[u8], version: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len() + TAIL_BYTES);
    out.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
    out.extend_from_slice(&((body.len() + TAIL_BYTES) as u32).to_le_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&TAIL_MAGIC);
    out
}

/// A sealed segment's summary with its header's facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// [`SegmentReader::identity`].
    pub identity: WriterIdentity,
    /// [`SegmentReader::created_unix_ns`].
    pub created_unix_ns: u64,
    /// The rest.
    pub facts: SealedSummary,
}

/// What [`read_summary`] found at the end of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SummaryRead {
    /// A summary this build reads, which agrees with the file's header and close block.
    Found(Box<Summary>),
    /// No summary: an open segment, or one sealed by a build before summaries.
    Absent,
    /// A summary that cannot be used, and why (damaged, another version, or disagreeing with
    /// the header): read the file whole instead.
    Unusable(String),
}

/// The summary at the end of the sealed segment `path`, and its header page (inflating the first
/// block of the file only). `Err` when the file cannot be read or its header is one that
/// [`SegmentReader::open`] refuses, with the same error.
pub fn read_summary(path: &Path) -> Result<SummaryRead, SegmentError> {
    let mut file = File::open(path).map_err(io_err(path, "open segment"))?;
    let len = file.metadata().map_err(io_err(path, "stat segment"))?.len();
    let mut magic = [0u8; 4];
    if len < (8 + TAIL_BYTES) as u64 || read_at(&mut file, path, 0, &mut magic)? != [0x28, 0xB5, 0x2F, 0xFD] {
        return Ok(SummaryRead::Absent);
    }
    let mut tail = [0u8; TAIL_BYTES];
    read_at(&mut file, path, len - TAIL_BYTES as u64, &mut tail)?;
    if tail[12..16] != TAIL_MAGIC {
        return Ok(SummaryRead::Absent);
    }
    let word = |i: usize| u32::from_le_bytes([tail[i], tail[i + 1], tail[i + 2], tail[i + 3]]);
    let (body_len, crc, version) = (u64::from(word(0)), word(4), word(8));
    if version != SUMMARY_VERSION && version != 1 {
        return Ok(SummaryRead::Unusable(format!(
            "summary version {version}; this build reads 1 and {SUMMARY_VERSION}"
        )));
    }
    if body_len > MAX_SUMMARY_BYTES || body_len + (8 + TAIL_BYTES) as u64 > len {
        return Ok(SummaryRead::Unusable(format!("summary length {body_len} does not fit the file's {len} bytes")));
    }
    let start = len - TAIL_BYTES as u64 - body_len - 8;
    let mut frame_header = [0u8; 8];
    read_at(&mut file, path, start, &mut frame_header)?;
    let frame_size = u32::from_le_bytes([frame_header[4], frame_header[5], frame_header[6], frame_header[7]]);
    if frame_header[..4] != SKIPPABLE_MAGIC.to_le_bytes() || u64::from(frame_size) != body_len + TAIL_BYTES as u64 {
        return Ok(SummaryRead::Unusable("the summary's tail is not at the end of its zstd skippable frame".into()));
    }
    let mut body = AlignedVec::<16>::with_capacity(body_len as usize);
    body.resize(body_len as usize, 0);
    read_at(&mut file, path, start + 8, &mut body)?;
    if crc32c::crc32c(&body) != crc {
        return Ok(SummaryRead::Unusable("summary checksum does not match".into()));
    }
    let facts = match version {
        1 => rkyv::from_bytes::<SealedSummaryV1, rancor::Error>(&body).map(SealedSummary::from),
        _ => rkyv::from_bytes::<SealedSummary, rancor::Error>(&body),
    };
    let facts = match facts {
        Ok(f) => f,
        Err(e) => return Ok(SummaryRead::Unusable(format!("summary does not decode: {e}"))),
    };

    // The header page is the first 4 KiB the data frame inflates to: one block, not the file.
    file.seek(SeekFrom::Start(0)).map_err(io_err(path, "seek"))?;
    let bad = |reason: String| SegmentError::BadSealed { path: path.into(), reason };
    let dec = zstd::stream::read::Decoder::new(file).map_err(|e| bad(e.to_string()))?;
    let mut page = Vec::with_capacity(HEADER_BYTES);
    dec.take(HEADER_BYTES as u64).read_to_end(&mut page).map_err(|e| bad(e.to_string()))?;
    let (header, identity) = header_page(path, &page)?;
    let close = match decode_close(&page) {
        Ok(Some(c)) => c,
        Ok(None) => return Ok(SummaryRead::Unusable("the segment has no close block; sealing writes one".into())),
        Err(reason) => return Ok(SummaryRead::Unusable(format!("close block: {reason}"))),
    };
    let promised = (close.records, (close.records > 0).then_some((close.first_unix_ns, close.last_unix_ns)));
    if promised != (facts.records, facts.time_range) {
        return Ok(SummaryRead::Unusable(format!(
            "the summary says {} records in {:?}, the close block {} in {:?}",
            facts.records, facts.time_range, promised.0, promised.1
        )));
    }
    if let Err(why) = check_index(&facts.frames, start, close.data_end, close.records) {
        return Ok(SummaryRead::Unusable(format!("frame index: {why}")));
    }
    Ok(SummaryRead::Found(Box::new(Summary { identity, created_unix_ns: header.created_unix_ns, facts })))
}

fn read_at<'b>(file: &mut File, path: &Path, at: u64, buf: &'b mut [u8]) -> Result<&'b [u8], SegmentError> {
    file.seek(SeekFrom::Start(at)).map_err(io_err(path, "seek"))?;
    file.read_exact(buf).map_err(io_err(path, "read summary"))?;
    Ok(buf)
}

/// Long send-time gaps of one prober's records, and its median spacing. Records are in the order
/// the agent finalised them, not of T1: a lost probe is written a timeout after it was sent,
/// behind probes sent later. So gaps are measured on the send times sorted, whatever order the
/// file holds them in; a gap measured in file order (even against the latest T1 seen) put a
/// timeout-long "frozen host" on every RNIC whose outage ended, because the first ok probe after
/// it is written before the lost ones sent just before it.
pub fn send_gaps(t1: &[u64]) -> SendGaps {
    if t1.len() < 3 {
        return SendGaps::default();
    }
    let mut sorted = t1.to_vec();
    sorted.sort_unstable();
    let steps: Vec<(u64, u64)> = sorted.windows(2).filter(|p| p[1] > p[0]).map(|p| (p[0], p[1] - p[0])).collect();
    if steps.is_empty() {
        return SendGaps::default();
    }
    // The median of a strided sample is plenty to know the usual spacing.
    let stride = (steps.len() / 4096).max(1);
    let mut sample: Vec<u64> = steps.iter().step_by(stride).map(|s| s.1).collect();
    let mid = sample.len() / 2;
    let median_ns = *sample.select_nth_unstable(mid).1;
    // Saturating: T1 is whatever the file says, and a forged one spaces probes by centuries.
    let limit = median_ns.saturating_mul(LONG_GAP_FACTOR).saturating_add(LONG_GAP_MIN_NS);
    // Not `steps.into_iter()...collect()`: that collects in place and keeps the capacity of
    // every step for the few long ones (3 MB per file held for a whole run, 6.5 GB over 2,176
    // files of a ranged `report`).
    let long = steps.iter().copied().filter(|s| s.1 > limit).collect();
    SendGaps { long, median_ns }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 17's real-fabric report: an RNIC's port comes back after an outage. Every probe of
    /// the outage is written a 500 ms timeout after it was sent; the first ok probe after the
    /// outage is written at once, ahead of the lost ones sent in the 500 ms before it. Its agent
    /// never stopped sending, so there is no send gap.
    #[test]
    fn the_first_ok_probe_after_an_outage_is_not_a_send_gap() {
        let spacing = 20_000_000u64;
        let timeout = 500_000_000u64;
        // (T1, written at): lost probes from 0 to 2 s, ok ones after.
        let mut written: Vec<(u64, u64)> = (0..200u64)
            .map(|i| {
                let t1 = i * spacing;
                let lost = t1 < 2_000_000_000;
                (t1, if lost { t1 + timeout } else { t1 + 50_000 })
            })
            .collect();
        written.sort_by_key(|w| w.1);
        let t1: Vec<u64> = written.iter().map(|w| w.0).collect();
        assert_ne!(t1.windows(2).filter(|p| p[1] < p[0]).count(), 0, "the file is out of send order");
        assert_eq!(send_gaps(&t1), SendGaps { long: Vec::new(), median_ns: spacing });
    }

    #[test]
    fn a_loss_written_a_timeout_late_is_not_a_send_gap() {
        // 50 ms spacing; the probe sent at 0 was lost and written after the one sent at 1000 ms.
        let mut t1: Vec<u64> = (1..=20).map(|i| i * 50_000_000).collect();
        t1.insert(20, 0);
        t1.extend((21..=40).map(|i| i * 50_000_000));
        assert_eq!(send_gaps(&t1), SendGaps { long: Vec::new(), median_ns: 50_000_000 });
        // A real stall still is one.
        let mut stalled = t1.clone();
        stalled.extend((0..5).map(|i| 3_000_000_000 + i * 50_000_000));
        assert_eq!(send_gaps(&stalled).long, vec![(2_000_000_000, 1_000_000_000)]);
    }

    /// Fuzzing (segment_open, sealing a forged open segment) found the limit overflowing when
    /// the usual spacing is near u64::MAX / 2.
    #[test]
    fn send_times_spaced_by_centuries_do_not_overflow() {
        let t1 = [0, u64::MAX / 2, u64::MAX - 1];
        let g = send_gaps(&t1);
        assert_eq!(g.median_ns, u64::MAX / 2, "{g:?}");
        assert!(g.long.is_empty(), "nothing is longer than a saturated limit: {g:?}");
    }
}
