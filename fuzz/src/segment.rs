//! Segment files for the fuzzer: valid checksums on mutated bytes, and a reader run that
//! touches everything the reader hands out.
//!
//! Every part of a segment is checksummed (header, close block, each frame header and payload),
//! so nearly every mutation of a real segment dies at the first checksum and the rkyv validation
//! behind it would never see fuzzed bytes. [`fix_checksums`] recomputes them, so the targets run
//! each input both as it is and with its checksums made right.
//!
//! The offsets below copy `formats/src/segment/layout.rs`, where they are crate-private;
//! [`self_check`] runs before a target's first input and stops it if they have drifted apart.

use std::path::Path;

use rocemesh_formats::record::{
    Arrived, EndpointRole, MAX_HOPS, Outcome, PathRecord, ProbeRecord, ServiceConn, TsSource,
};
use rocemesh_formats::segment::{
    HEADER_BYTES, OPEN_SUFFIX, Pick, SEALED_SUFFIX, SealedSummary, SegmentReader, SegmentWriter, SummaryRead, WriterConfig,
    WriterIdentity, read_summary, seal,
};

const SEGMENT_MAGIC: &[u8; 8] = b"ROCEMSEG";
const IDENTITY_OFFSET: usize = 48;
const MAX_IDENTITY_BYTES: usize = CLOSE_OFFSET - IDENTITY_OFFSET;
const CLOSE_OFFSET: usize = HEADER_BYTES - 64;
const CLOSE_MAGIC: &[u8; 4] = b"RMCL";
const FRAME_HEADER_BYTES: usize = 32;
const FRAME_ALIGN: usize = 16;
const FRAME_MAGIC: &[u8; 4] = b"RMCK";

/// The first bytes of a zstd frame: a sealed segment.
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Makes every checksum of the segment in `b` match its bytes, as far as the structure can be
/// followed: the header (if its identity length fits), the close block (if it has its magic),
/// and the frames from the end of the header page on, until a frame header without its magic.
/// Returns how many frame headers it rewrote.
pub fn fix_checksums(b: &mut [u8]) -> usize {
    rewrite_checksums(b, |_, crc| crc)
}

/// Walks the structure as [`fix_checksums`] does; `put(field, computed)` gives what to store.
fn rewrite_checksums(b: &mut [u8], mut put: impl FnMut(Field, u32) -> u32) -> usize {
    if b.len() < HEADER_BYTES || &b[..8] != SEGMENT_MAGIC {
        return 0;
    }
    let identity_len = u32_at(b, 12) as usize;
    if identity_len <= MAX_IDENTITY_BYTES {
        let crc = crc32c::crc32c(&b[0..32]);
        let crc = crc32c::crc32c_append(crc, &b[IDENTITY_OFFSET..IDENTITY_OFFSET + identity_len]);
        set_u32(b, 32, put(Field::Header, crc));
    }
    let close = &mut b[CLOSE_OFFSET..HEADER_BYTES];
    if &close[..4] == CLOSE_MAGIC {
        let crc = crc32c::crc32c(&close[..60]);
        set_u32(close, 60, put(Field::Close, crc));
    }
    let mut frames = 0;
    let mut off = HEADER_BYTES;
    while off + FRAME_HEADER_BYTES <= b.len() && &b[off..off + 4] == FRAME_MAGIC {
        let payload_start = off + FRAME_HEADER_BYTES;
        let payload_len = u32_at(b, off + 8) as usize;
        let whole = payload_start + payload_len <= b.len();
        if whole {
            let crc = crc32c::crc32c(&b[payload_start..payload_start + payload_len]);
            set_u32(b, off + 24, put(Field::Payload, crc));
        }
        let crc = crc32c::crc32c(&b[off..off + 28]);
        set_u32(b, off + 28, put(Field::FrameHeader, crc));
        frames += 1;
        if !whole {
            break;
        }
        off += (FRAME_HEADER_BYTES + payload_len).next_multiple_of(FRAME_ALIGN);
    }
    frames
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Header,
    Close,
    Payload,
    FrameHeader,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn set_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// What [`read_all`] found in a segment the reader accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contents {
    pub records: u64,
    pub dictionary: usize,
    pub paths: usize,
}

/// Opens `path` as `analyze` and `ctl collect` do and reads everything the reader hands out,
/// checking that its summary agrees with its contents. `None`: the reader refused the file.
pub fn read_all(path: &Path) -> Option<Contents> {
    // The summary parser sees every input too (hostile tails included); a summary cannot be
    // checked against the data without reading it, which is `analyze`'s job, so only that it
    // does not panic and, when found, agrees with the close block it was checked against.
    // A partial read through a hostile index is refused or read, never a panic; what it reads
    // it holds to the index.
    if let Ok(SummaryRead::Found(s)) = read_summary(path) {
        let _ = format!("{s:?}");
        for pick in [
            Pick { windows: true, paths: true, probes: None },
            Pick { probes: Some((0, u64::MAX)), ..Pick::default() },
        ] {
            if let Ok(part) = SegmentReader::open_part(path, &s.facts.frames, &pick) {
                assert!(part.records() <= part.file_records(), "a partial read holds more than its file");
                let _ = part.window_summaries().count() + part.path_records().count();
            }
        }
    }
    let r = SegmentReader::open(path).ok()?;
    let (mut records, mut lo, mut hi) = (0u64, u64::MAX, 0u64);
    for chunk in r.probe_chunks() {
        for i in 0..chunk.len() {
            let t = chunk.row(i).t1_unix_ns;
            lo = lo.min(t);
            hi = hi.max(t);
        }
        records += chunk.len() as u64;
    }
    assert_eq!(records, r.records(), "records() disagrees with the probe chunks");
    assert_eq!(r.time_range(), (records > 0).then_some((lo, hi)), "time_range() disagrees with the records");
    for (i, e) in r.dictionary().iter().enumerate() {
        assert_eq!(e.id as usize, i, "dictionary()[{i}] has id {}", e.id);
    }
    let mut paths = 0;
    for p in r.path_records() {
        let hops = p.hop_count.to_native();
        assert!(hops as usize <= MAX_HOPS, "a path record with {hops} hops");
        paths += 1;
    }
    // Window summaries: each validated, together never counting more probes than the file holds.
    let mut summarized = 0;
    for w in r.window_summaries() {
        for i in 0..w.keys.len() {
            let _ = w.cells_of(i);
        }
        summarized += w.probes();
    }
    assert_eq!(summarized, r.summarized_records(), "summarized_records() disagrees with the summaries");
    assert!(summarized <= records, "summaries count {summarized} probes of {records} records");
    // Damage and identity end up in logs and in `analyze inspect`: format them as those do.
    let _ = format!("{r:?} {:?}", r.created_unix_ns());
    Some(Contents { records, dictionary: r.dictionary().len(), paths })
}

/// Runs an open-segment input through the reader and, if the reader accepts it, through
/// [`seal`], as the agent does with the segments a crashed run left behind: the sealed copy
/// must read back with everything the open one had.
pub fn check_open(bytes: &[u8]) {
    let path = crate::scratch_file(&format!("input{OPEN_SUFFIX}"), bytes);
    let Some(open) = read_all(&path) else { return };
    let sealed_path = crate::scratch_path(&format!("input{SEALED_SUFFIX}"));
    // A sealed file already there would make seal() take its crash-recovery branch instead.
    let _ = std::fs::remove_file(&sealed_path);
    let Ok(report) = seal(&path, 1) else { return };
    assert_eq!(report.sealed_path, sealed_path);
    assert_eq!(report.records, open.records, "seal() reported other records than the reader read");
    let sealed = read_all(&sealed_path).expect("seal() wrote a segment the reader refuses");
    assert_eq!(sealed, open, "the sealed copy reads back differently");
    let reader = SegmentReader::open(&sealed_path).expect("read above");
    match read_summary(&sealed_path) {
        Ok(SummaryRead::Found(s)) => {
            let of = SealedSummary { frames: s.facts.frames.clone(), ..SealedSummary::of(&reader, reader.damage().to_vec()) };
            assert_eq!(s.facts, of, "seal() wrote a wrong summary");
            // Read in part for every record, the sealed copy gives every record.
            let all = Pick { probes: Some((0, u64::MAX)), windows: true, paths: true };
            let part = SegmentReader::open_part(&sealed_path, &s.facts.frames, &all).expect("its own index reads");
            assert_eq!(part.records(), reader.records(), "a partial read of everything reads other records");
        }
        other => panic!("seal() wrote no usable summary: {other:?}"),
    }
    let _ = std::fs::remove_file(&sealed_path);
}

/// Runs a sealed-segment input (the bytes of a `.rseg.zst` file) through the reader.
pub fn check_sealed(bytes: &[u8]) {
    let path = crate::scratch_file(&format!("input{SEALED_SUFFIX}"), bytes);
    read_all(&path);
}

/// Compresses an open-format segment as `seal` does (zstd with a content checksum).
pub fn compress(segment: &[u8]) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).expect("zstd encoder");
    enc.include_checksum(true).expect("zstd checksum flag");
    std::io::Write::write_all(&mut enc, segment).expect("compress into memory");
    enc.finish().expect("finish zstd frame")
}

/// Stops the target unless [`fix_checksums`] still knows where the writer puts its checksums:
/// on a segment the real writer wrote (dictionary, service endpoint, probe chunks, a path
/// trace), it must leave every byte as it is, find every frame, and restore every checksum
/// from zero.
pub fn self_check() {
    let dir = crate::scratch_path("self-check");
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = WriterConfig::new(&dir);
    cfg.chunk_records = 2;
    cfg.segment_bytes = 2 << 20;
    // Windows of 2 ns: the five records make summary frames of their own.
    cfg.summary_window_ns = 2;
    cfg.summary_grace_ns = 1;
    let identity = WriterIdentity {
        host: "tor0-h1".into(),
        device: "mlx5_0".into(),
        tor: "tor0".into(),
        agent_epoch: 7,
        tool: "rocemesh-fuzz".into(),
    };
    let mut w = SegmentWriter::new(cfg, identity).expect("segment writer");
    let me = w.endpoint(EndpointRole::Rnic, "tor0-h1/mlx5_0", "tor0", [1; 16]);
    let peer = w.endpoint(EndpointRole::Rnic, "tor0-h2/mlx5_0", "tor0", [2; 16]);
    let conn = ServiceConn {
        pid: 1,
        local_qpn: 2,
        remote_qpn: 3,
        flow_label: 4,
        traffic_class: 5,
        comm: "ib_write_bw".into(),
        remote: "tor0-h2/mlx5_0".into(),
    };
    w.service_endpoint("svc tor0-h1/mlx5_0 qp 2", "tor0", [3; 16], &conn);
    for i in 0..5u64 {
        w.append(&ProbeRecord {
            t1_unix_ns: 1_700_000_000_000_000_000 + i,
            seq: i,
            network_rtt_ns: 4_000,
            prober_delay_ns: 2_000,
            responder_delay_ns: 1_000,
            prober: me,
            target: peer,
            flow_label: 1,
            responder_epoch: 9,
            kind: 0,
            outcome: Outcome::Ok as u8,
            arrived: Arrived::ALL.0,
            ts_source: TsSource::KernelSoftware as u8,
        })
        .expect("append");
    }
    let hops = [me, peer, 0, 0, 0, 0, 0, 0];
    w.append_path(&PathRecord { t_unix_ns: 1, src: me, dst: peer, flow_label: 1, hop_count: 2, hops })
        .expect("append path");
    let closed = w.finish().expect("finish");
    let written = std::fs::read(&closed[0]).expect("read the written segment");
    std::fs::remove_dir_all(&dir).expect("remove the self-check segment");

    let mut b = written.clone();
    // Three probe chunks, a path chunk, summaries, and at least one dictionary frame.
    let frames = fix_checksums(&mut b);
    assert!(frames >= 6, "fix_checksums found {frames} frames in a segment of at least 6: update it from layout.rs");
    assert!(b == written, "fix_checksums changed a valid segment: update it from layout.rs");
    let mut fields = Vec::new();
    rewrite_checksums(&mut b, |field, _| {
        fields.push(field);
        0
    });
    assert!(fields.contains(&Field::Header) && fields.contains(&Field::Close), "{fields:?}");
    fix_checksums(&mut b);
    assert!(b == written, "fix_checksums did not restore zeroed checksums: update it from layout.rs");
}
