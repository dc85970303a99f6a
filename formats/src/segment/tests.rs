use std::path::{Path, PathBuf};

use super::layout::{FRAME_HEADER_BYTES, HEADER_BYTES, encode_header};
use super::*;
use crate::record::{
    Arrived, Endpoint, EndpointRole, EndpointV1, Outcome, PathRecord, ProbeRecord, READABLE_SCHEMA_HASHES, SCHEMA_HASH,
    ServiceConn, TsSource,
};

const T0: u64 = 1_700_000_000_000_000_000;

fn rec(i: u64) -> ProbeRecord {
    ProbeRecord {
        t1_unix_ns: T0 + i * 100_000,
        seq: (7 << 32) | i,
        network_rtt_ns: 4_000 + (i % 13) as i32,
        prober_delay_ns: 2_000 + (i % 5) as i32,
        responder_delay_ns: 1_000,
        prober: 0,
        target: 1 + (i % 3) as u32,
        flow_label: 1 + (i % 16) as u32,
        responder_epoch: 9,
        kind: (i % 2) as u8,
        outcome: if i % 1000 == 999 { Outcome::Lost as u8 } else { Outcome::Ok as u8 },
        arrived: Arrived::ALL.0,
        ts_source: TsSource::KernelSoftware as u8,
    }
}

fn identity() -> WriterIdentity {
    WriterIdentity {
        host: "tor0-h1".into(),
        device: "mlx5_0".into(),
        tor: "tor0".into(),
        agent_epoch: 0xBEEF,
        tool: "test".into(),
    }
}

fn writer(dir: &Path, chunk: usize) -> SegmentWriter {
    let mut cfg = WriterConfig::new(dir);
    cfg.chunk_records = chunk;
    cfg.segment_bytes = 2 << 20;
    let mut w = SegmentWriter::new(cfg, identity()).expect("writer");
    assert_eq!(w.endpoint(EndpointRole::Rnic, "tor0-h1/mlx5_0", "tor0", [0; 16]), 0);
    for t in 1..4 {
        assert_eq!(w.endpoint(EndpointRole::Rnic, &format!("tor0-h{}/mlx5_0", t + 1), "tor0", [t as u8; 16]), t);
    }
    w
}

fn all_records(r: &SegmentReader) -> Vec<ProbeRecord> {
    r.probe_chunks().flat_map(|c| (0..c.len()).map(move |i| c.row(i))).collect()
}

fn segments(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}

/// One closed segment of `n` records in chunks of `chunk`, returned as its bytes.
fn one_segment(n: u64, chunk: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), chunk);
    for i in 0..n {
        w.append(&rec(i)).expect("append");
    }
    let closed = w.finish().expect("finish");
    assert_eq!(closed.len(), 1);
    (dir, closed[0].clone())
}

#[test]
fn round_trip_open_and_sealed_with_dictionary_and_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), 100);
    let sw = w.endpoint(EndpointRole::Switch, "spine2", "", [0; 16]);
    for i in 0..1_234 {
        w.append(&rec(i)).expect("append");
    }
    let path =
        PathRecord { t_unix_ns: T0, src: 0, dst: 2, flow_label: 5, hop_count: 3, hops: [1, sw, 3, 0, 0, 0, 0, 0] };
    w.append_path(&path).expect("path");
    let stats = w.stats();
    let closed = w.finish().expect("finish");
    assert_eq!(stats.records_appended, 1_234);
    assert_eq!(closed.len(), 1);

    let r = SegmentReader::open(&closed[0]).expect("open");
    assert!(r.damage().is_empty(), "{:?}", r.damage());
    assert!(r.is_closed() && !r.is_sealed());
    assert_eq!(r.identity(), &identity());
    assert_eq!(r.records(), 1_234);
    assert_eq!(r.probe_chunks().len(), 13);
    assert_eq!(all_records(&r), (0..1_234).map(rec).collect::<Vec<_>>());
    assert_eq!(r.time_range(), Some((T0, T0 + 1_233 * 100_000)));
    let names: Vec<&str> = r.dictionary().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["tor0-h1/mlx5_0", "tor0-h2/mlx5_0", "tor0-h3/mlx5_0", "tor0-h4/mlx5_0", "spine2"]);
    let paths: Vec<PathRecord> =
        r.path_records().map(|p| rkyv::deserialize::<PathRecord, rkyv::rancor::Error>(p).expect("de")).collect();
    assert_eq!(paths, [path]);
    drop(r);

    let report = seal(&closed[0], 3).expect("seal");
    assert!(!closed[0].exists(), "original removed after sealing");
    assert_eq!(report.records, 1_234);
    assert!(report.sealed_bytes < report.raw_bytes / 2, "{report:?}");
    let s = SegmentReader::open(&report.sealed_path).expect("open sealed");
    assert!(s.is_sealed() && s.is_closed() && s.damage().is_empty());
    assert_eq!(all_records(&s), (0..1_234).map(rec).collect::<Vec<_>>());
    assert_eq!(s.dictionary().len(), 5);
    assert_eq!(s.path_records().count(), 1);
}

/// A dictionary larger than one dictionary frame holds is written in several, in every segment
/// (each repeats it whole), and reads back whole, open and sealed, in either write mode.
#[test]
fn a_large_dictionary_reads_back_whole_from_every_segment() {
    for mode in [WriteMode::Pwrite, WriteMode::Mmap] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = WriterConfig::new(dir.path());
        (cfg.chunk_records, cfg.segment_bytes, cfg.write_mode) = (100, 2 << 20, mode);
        let mut w = SegmentWriter::new(cfg, identity()).expect("writer");
        let names: Vec<String> = (0..2_500).map(|i| format!("tor{}-h{}/mlx5_0", i / 16, i % 16)).collect();
        w.reserve_endpoints(names.iter().map(String::as_str));
        for (i, n) in names.iter().enumerate() {
            assert_eq!(w.endpoint(EndpointRole::Rnic, n, "", [0; 16]) as usize, i);
        }
        // Enough chunks to rotate (each segment holds the dictionary again).
        for i in 0..60_000 {
            w.append(&rec(i)).expect("append");
        }
        let closed = w.finish().expect("finish");
        assert!(closed.len() >= 2, "{mode:?}: {} segments", closed.len());
        let mut records = 0;
        for path in &closed {
            let sealed = seal(path, 1).expect("seal").sealed_path;
            let r = SegmentReader::open(&sealed).expect("open");
            assert!(r.damage().is_empty(), "{:?}", r.damage());
            let got: Vec<&str> = r.dictionary().iter().map(|e| e.name.as_str()).collect();
            assert_eq!(got, names, "{mode:?} {}", sealed.display());
            assert!(r.dictionary().iter().enumerate().all(|(i, e)| e.id as usize == i));
            records += r.records();
        }
        assert_eq!(records, 60_000);
    }
}

#[test]
fn both_write_modes_write_the_same_bytes() {
    let mut files = Vec::new();
    for mode in [WriteMode::Pwrite, WriteMode::Mmap] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = WriterConfig::new(dir.path());
        cfg.chunk_records = 100;
        cfg.segment_bytes = 2 << 20;
        cfg.write_mode = mode;
        let mut w = SegmentWriter::new(cfg, identity()).expect("writer");
        w.endpoint(EndpointRole::Rnic, "tor0-h1/mlx5_0", "tor0", [0; 16]);
        for i in 0..1_050 {
            w.append(&rec(i)).expect("append");
        }
        let closed = w.finish().expect("finish");
        let r = SegmentReader::open(&closed[0]).expect("open");
        assert!(r.damage().is_empty(), "{mode:?}");
        assert_eq!(all_records(&r), (0..1_050).map(rec).collect::<Vec<_>>(), "{mode:?}");
        files.push((dir, std::fs::read(&closed[0]).expect("read")));
    }
    assert!(files[0].1 == files[1].1, "pwrite and mmap files differ");
}

#[test]
fn rotates_by_size_and_by_age_and_each_segment_stands_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), 512);
    // 2 MiB segments hold < 40k 48-byte records: 100k records need at least 3 segments.
    for i in 0..100_000 {
        w.append(&rec(i)).expect("append");
    }
    // Then a record 11 minutes later: age rotation (per chunk, so flush the old ones first).
    w.flush().expect("flush");
    let mut late = rec(100_000);
    late.t1_unix_ns = T0 + 11 * 60 * 1_000_000_000;
    w.append(&late).expect("append");
    let closed = w.finish().expect("finish");
    assert!(closed.len() >= 4, "{closed:?}");
    let mut seen = Vec::new();
    for p in &closed {
        let r = SegmentReader::open(p).expect("open");
        assert!(r.damage().is_empty());
        assert_eq!(r.dictionary().len(), 4, "every segment carries the whole dictionary");
        seen.extend(all_records(&r));
    }
    let last = SegmentReader::open(closed.last().expect("last")).expect("open");
    assert_eq!(last.records(), 1, "the late record starts its own segment");
    let mut want: Vec<_> = (0..100_000).map(rec).collect();
    want.push(late);
    assert_eq!(seen, want);
}

#[test]
fn rotate_if_older_closes_idle_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), 10);
    w.append(&rec(0)).expect("append");
    w.flush().expect("flush");
    assert_eq!(w.rotate_if_older(T0 + 1_000).expect("rotate"), None);
    let closed = w.rotate_if_older(T0 + 601 * 1_000_000_000).expect("rotate");
    assert!(closed.is_some());
    assert_eq!(w.current_path(), None);
}

#[test]
fn other_version_and_other_schema_are_refused_clearly() {
    let (_d, path) = one_segment(10, 10);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[8] = 2;
    std::fs::write(&path, &bytes).expect("write");
    let e = SegmentReader::open(&path).expect_err("version 2");
    assert!(matches!(e, SegmentError::UnsupportedVersion { found: 2, supported: 1, .. }), "{e}");
    assert!(e.to_string().contains(&path.display().to_string()));

    // A correctly checksummed header with another schema hash: another build wrote it.
    bytes[8] = 1;
    let mut page = vec![0u8; HEADER_BYTES];
    let id_len = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    encode_header(&mut page, 5, SCHEMA_HASH ^ 1, &bytes[48..48 + id_len]);
    bytes[..HEADER_BYTES].copy_from_slice(&page);
    std::fs::write(&path, &bytes).expect("write");
    let e = SegmentReader::open(&path).expect_err("schema");
    assert!(
        matches!(e, SegmentError::SchemaMismatch { found, expected, .. } if found == SCHEMA_HASH ^ 1 && expected == SCHEMA_HASH),
        "{e}"
    );
    assert!(e.to_string().contains("different rocemesh build"));
}

fn conn(i: u32) -> ServiceConn {
    ServiceConn {
        pid: 4242 + i,
        local_qpn: 0x11 + i,
        remote_qpn: 0x22 + i,
        flow_label: 0xABCDE,
        traffic_class: 106,
        comm: "ib_write_bw".into(),
        remote: if i.is_multiple_of(2) { format!("tor1-h{i}/mlx5_0") } else { String::new() },
    }
}

#[test]
fn service_endpoints_round_trip_open_and_sealed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), 10);
    let a = w.service_endpoint("svc tor0-h1/mlx5_0 qp 17", "tor1", [7; 16], &conn(0));
    let b = w.service_endpoint("svc tor0-h1/mlx5_0 qp 18", "", [8; 16], &conn(1));
    assert_eq!((a, b), (4, 5));
    assert_eq!(w.service_endpoint("svc tor0-h1/mlx5_0 qp 17", "tor1", [7; 16], &conn(0)), a, "defined once");
    for i in 0..25 {
        w.append(&ProbeRecord { target: if i % 2 == 0 { a } else { b }, kind: 2, ..rec(i) }).expect("append");
    }
    let closed = w.finish().expect("finish");
    for sealed in [false, true] {
        let path = if sealed { seal(&closed[0], 3).expect("seal").sealed_path } else { closed[0].clone() };
        let r = SegmentReader::open(&path).expect("open");
        assert!(r.damage().is_empty(), "{:?}", r.damage());
        let d = r.dictionary();
        assert_eq!(d.len(), 6);
        assert!(d[..4].iter().all(|e| e.service.is_none() && e.role == EndpointRole::Rnic as u8));
        assert_eq!(d[4].role, EndpointRole::Service as u8);
        assert_eq!((d[4].tor.as_str(), d[4].addr), ("tor1", [7; 16]));
        assert_eq!(d[4].service, Some(conn(0)));
        assert_eq!(d[5].service, Some(conn(1)));
        assert_eq!(all_records(&r).iter().filter(|x| x.target == b).count(), 12);
    }
}

/// The frame bound the writer reserves before serialising must hold for any entry, strings of
/// every small length included (rkyv inlines strings of up to 8 bytes).
#[test]
fn dictionary_bound_holds() {
    for len in 0..40 {
        let s = "x".repeat(len);
        for service in [None, Some(ServiceConn { comm: s.clone(), remote: s.clone(), ..conn(0) })] {
            let entries: Vec<Endpoint> = (0..3)
                .map(|id| Endpoint {
                    id,
                    role: 2,
                    name: s.clone(),
                    tor: s.clone(),
                    addr: [1; 16],
                    service: service.clone(),
                })
                .collect();
            let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&entries).expect("serialise");
            assert!(layout::frame_span(bytes.len()) <= super::writer::dictionary_bound(&entries), "len {len}");
        }
    }
}

/// Segments of earlier releases carry dictionary frames of kind 1 (no service field) under their
/// own schema hash: they open, and their entries have no service.
#[test]
fn earlier_dictionary_frames_stay_readable() {
    let (_d, path) = one_segment(30, 10);
    let full = std::fs::read(&path).expect("read");
    let r = SegmentReader::open(&path).expect("open");
    let entries = r.dictionary().to_vec();
    let records = all_records(&r);
    drop(r);
    // Rebuild the file: old schema hash, the dictionary as a kind-1 frame, the probe frames as
    // they were; unclosed, as an old agent that crashed leaves it.
    let mut bytes = vec![0u8; HEADER_BYTES];
    let id_len = u32::from_le_bytes(full[12..16].try_into().expect("4 bytes")) as usize;
    encode_header(&mut bytes, 5, READABLE_SCHEMA_HASHES[2], &full[48..48 + id_len]);
    let v1: Vec<EndpointV1> = entries
        .iter()
        .map(|e| EndpointV1 { id: e.id, role: e.role, name: e.name.clone(), tor: e.tor.clone(), addr: e.addr })
        .collect();
    let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&v1).expect("serialise");
    let mut frame = vec![0u8; layout::frame_span(payload.len())];
    frame[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + payload.len()].copy_from_slice(&payload);
    layout::seal_frame_header(&mut frame, layout::FrameKind::DictionaryV1, v1.len() as u32, 0, payload.len());
    bytes.extend_from_slice(&frame);
    let first_len = u32::from_le_bytes(full[HEADER_BYTES + 8..HEADER_BYTES + 12].try_into().expect("4")) as usize;
    bytes.extend_from_slice(&full[HEADER_BYTES + layout::frame_span(first_len)..]);
    let old = path.with_file_name("old.rseg");
    std::fs::write(&old, &bytes).expect("write");
    let r = SegmentReader::open(&old).expect("an earlier release's segment opens");
    assert_eq!(r.dictionary(), &entries[..]);
    assert!(r.dictionary().iter().all(|e| e.service.is_none()));
    assert_eq!(all_records(&r), records);
}

/// Every complete chunk survives, whatever byte the last chunk was cut at; the cut is reported.
#[test]
fn torn_tail_at_every_byte_of_the_last_chunk() {
    let (_d, path) = one_segment(40, 8); // 5 chunks of 8
    let full = std::fs::read(&path).expect("read");
    let r = SegmentReader::open(&path).expect("open");
    assert_eq!(r.records(), 40);
    drop(r);
    // Frames: dictionary, then 5 probe chunks. Find where the last one starts.
    let mut starts = Vec::new();
    let mut off = HEADER_BYTES;
    while off < full.len() {
        starts.push(off);
        let len = u32::from_le_bytes(full[off + 8..off + 12].try_into().expect("4")) as usize;
        off += layout::frame_span(len);
    }
    let last = *starts.last().expect("frames");
    let torn = path.with_file_name("torn.rseg");
    let mut unclosed = full.clone();
    unclosed[layout::CLOSE_OFFSET..HEADER_BYTES].fill(0); // as a crashed writer leaves it
    let last_len = u32::from_le_bytes(full[last + 8..last + 12].try_into().expect("4")) as usize;
    let last_end = last + FRAME_HEADER_BYTES + last_len;
    assert!(full.len() - last_end < 16, "only padding follows the last payload");
    for cut in last..last_end {
        // (a) preallocated open segment: the rest of the frame is still zeros.
        let mut zeroed = unclosed.clone();
        zeroed[cut..].fill(0);
        zeroed.resize(full.len() + 4096, 0);
        // (b) a copy that simply ends there.
        let truncated = unclosed[..cut].to_vec();
        for (what, bytes) in [("zeroed", &zeroed), ("truncated", &truncated)] {
            std::fs::write(&torn, bytes).expect("write");
            let r = SegmentReader::open(&torn).unwrap_or_else(|e| panic!("{what} cut at {cut}: {e}"));
            if what == "zeroed" && unclosed[cut..].iter().all(|&b| b == 0) {
                // The "cut" only zeroed bytes that were zero already: nothing was lost.
                assert_eq!((r.records(), r.damage().len()), (40, 0), "cut at {cut}");
                continue;
            }
            assert_eq!(r.records(), 32, "{what} cut at {cut}");
            assert_eq!(all_records(&r), (0..32).map(rec).collect::<Vec<_>>(), "{what} cut at {cut}");
            if cut == last {
                assert!(r.damage().is_empty(), "nothing of the last frame written is a clean end");
            } else {
                assert_eq!(r.damage().len(), 1, "{what} cut at {cut}: {:?}", r.damage());
                assert_eq!(r.damage()[0].kind, DamageKind::TornTail, "{what} cut at {cut}");
                assert_eq!(r.damage()[0].offset, last as u64);
            }
        }
    }
    // A payload written but its header not (the writer's order): reported as torn too.
    let mut headerless = unclosed.clone();
    headerless[last..last + FRAME_HEADER_BYTES].fill(0);
    std::fs::write(&torn, &headerless).expect("write");
    let r = SegmentReader::open(&torn).expect("open");
    assert_eq!((r.records(), r.damage()[0].kind), (32, DamageKind::TornTail));
}

#[test]
fn a_corrupt_chunk_in_the_middle_is_skipped_and_reported() {
    let (_d, path) = one_segment(40, 8);
    let mut bytes = std::fs::read(&path).expect("read");
    // Second probe frame: header of the dictionary frame, then the first probe frame.
    let dict_len = u32::from_le_bytes(bytes[HEADER_BYTES + 8..HEADER_BYTES + 12].try_into().expect("4")) as usize;
    let first = HEADER_BYTES + layout::frame_span(dict_len);
    let len = u32::from_le_bytes(bytes[first + 8..first + 12].try_into().expect("4")) as usize;
    let second = first + layout::frame_span(len);
    bytes[second + FRAME_HEADER_BYTES + 3] ^= 0x40;
    std::fs::write(&path, &bytes).expect("write");
    let r = SegmentReader::open(&path).expect("open");
    assert_eq!(r.records(), 32);
    let want: Vec<_> = (0..8).chain(16..40).map(rec).collect();
    assert_eq!(all_records(&r), want);
    assert_eq!(r.damage().len(), 1);
    assert_eq!(
        (r.damage()[0].kind, r.damage()[0].offset, r.damage()[0].records_lost),
        (DamageKind::CorruptChunk, second as u64, Some(8))
    );

    // Sealing keeps the damaged chunk as evidence and the sealed reader reports it again.
    let report = seal(&path, 3).expect("seal");
    assert_eq!(report.records, 32);
    let s = SegmentReader::open(&report.sealed_path).expect("sealed");
    assert_eq!(s.damage().len(), 1);
    assert_eq!(s.damage()[0].kind, DamageKind::CorruptChunk);
    assert_eq!(all_records(&s), want);

    // A flipped header byte in a closed segment: the rest cannot be located, and it says so.
    let (_d2, path2) = one_segment(40, 8);
    let mut bytes = std::fs::read(&path2).expect("read");
    bytes[second + 13] ^= 1;
    std::fs::write(&path2, &bytes).expect("write");
    let r = SegmentReader::open(&path2).expect("open");
    assert_eq!(r.records(), 8);
    assert_eq!(r.damage()[0].kind, DamageKind::CorruptFrameHeader);
}

#[test]
fn foreign_files_are_refused_without_panicking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("zeros", vec![0; 8192]),
        ("png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec()),
        ("text", b"version = 1\nhost = \"x\"\n".to_vec()),
        ("short-magic", b"ROCEM".to_vec()),
        ("magic-only", b"ROCEMSEG\x01\x00".to_vec()),
        ("random", (0..10_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()),
        ("zstd-text", zstd::encode_all(&b"hello, not a segment"[..], 3).expect("zstd")),
    ];
    // Version is read before the checksum (so that a newer format gets the upgrade message),
    // so garbage after the magic reads as an unknown version; with version 1 it is a bad header.
    let mut magic_and_garbage = b"ROCEMSEG".to_vec();
    magic_and_garbage.extend((0..8_000u32).map(|i| (i * 31) as u8));
    cases.push(("magic-garbage", magic_and_garbage.clone()));
    magic_and_garbage[8..10].copy_from_slice(&1u16.to_le_bytes());
    cases.push(("v1-garbage", magic_and_garbage));
    cases.push(("bad-zstd", vec![0x28, 0xB5, 0x2F, 0xFD, 1, 2, 3, 4, 5, 6]));
    for (name, bytes) in cases {
        let p = dir.path().join(format!("{name}.rseg"));
        std::fs::write(&p, &bytes).expect("write");
        let e = SegmentReader::open(&p).expect_err(name);
        let msg = e.to_string();
        assert!(msg.contains(&p.display().to_string()), "{name}: {msg}");
        match name {
            "empty" | "zeros" => assert!(matches!(e, SegmentError::Unwritten { .. }), "{name}: {msg}"),
            "png" | "text" | "short-magic" | "random" | "zstd-text" => {
                assert!(matches!(e, SegmentError::Foreign { .. }), "{name}: {msg}")
            }
            "magic-garbage" => assert!(matches!(e, SegmentError::UnsupportedVersion { .. }), "{name}: {msg}"),
            "magic-only" | "v1-garbage" => assert!(matches!(e, SegmentError::BadHeader { .. }), "{name}: {msg}"),
            "bad-zstd" => assert!(matches!(e, SegmentError::BadSealed { .. }), "{name}: {msg}"),
            _ => unreachable!(),
        }
    }
    let e = SegmentReader::open(dir.path().join("missing.rseg")).expect_err("missing");
    assert!(matches!(e, SegmentError::Io { .. }) && e.to_string().contains("missing.rseg"), "{e}");
}

#[test]
fn a_segment_left_open_by_a_crash_is_read_and_sealed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), 64);
    for i in 0..1_000 {
        w.append(&rec(i)).expect("append");
    }
    let open = segments(dir.path(), OPEN_SUFFIX);
    assert_eq!(open.len(), 1);
    let e = seal(&open[0], 3).expect_err("a live writer holds it");
    assert!(e.to_string().contains("still being written by a live writer"), "{e}");
    assert!(open[0].exists(), "refusing must not touch the file");
    // As kill -9 would: no flush of the partial chunk, no close, no truncation.
    w.crash();
    let r = SegmentReader::open(&open[0]).expect("open");
    assert!(!r.is_closed());
    assert_eq!(r.records(), 960, "15 complete chunks of 64; the 40 buffered records were never written");
    assert!(r.damage().is_empty());
    drop(r);
    let report = seal(&open[0], 3).expect("seal");
    assert_eq!(report.records, 960);
    let s = SegmentReader::open(&report.sealed_path).expect("sealed");
    assert!(s.is_closed());
    assert_eq!(all_records(&s), (0..960).map(rec).collect::<Vec<_>>());
}

#[test]
fn seal_refuses_what_it_must_not_touch() {
    let (_d, path) = one_segment(10, 10);
    let report = seal(&path, 3).expect("seal");
    let e = seal(&report.sealed_path, 3).expect_err("sealed twice");
    assert!(e.to_string().contains("only open segments"), "{e}");
}

#[test]
fn quota_evicts_oldest_sealed_first_and_never_open_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sealed = Vec::new();
    for s in 0..5u64 {
        let mut w = writer(dir.path(), 100);
        for i in 0..2_000 {
            let mut r = rec(i);
            r.t1_unix_ns += s * 3_600 * 1_000_000_000; // one hour apart: distinct, ordered names
            w.append(&r).expect("append");
        }
        for p in w.finish().expect("finish") {
            sealed.push(seal(&p, 3).expect("seal"));
        }
    }
    let mut open_writer = writer(dir.path(), 100);
    open_writer.append(&rec(0)).expect("append");
    open_writer.flush().expect("flush");
    let open_len = std::fs::metadata(open_writer.current_path().expect("open")).expect("stat").len();

    let size = |r: &SealReport| r.sealed_bytes;
    let all: u64 = sealed.iter().map(size).sum::<u64>() + open_len;
    let quota = all - size(&sealed[0]) - size(&sealed[1]) / 2;
    let ev = enforce_quota(dir.path(), quota).expect("quota");
    assert_eq!(ev.files_evicted, 2);
    assert_eq!(ev.bytes_evicted, size(&sealed[0]) + size(&sealed[1]));
    assert!(!ev.still_over_quota);
    assert!(!sealed[0].sealed_path.exists() && !sealed[1].sealed_path.exists());
    assert!(sealed[2..].iter().all(|r| r.sealed_path.exists()));

    // A quota smaller than the open segment: every sealed file goes, the open one stays.
    let ev = enforce_quota(dir.path(), 1).expect("quota");
    assert_eq!(ev.files_evicted, 3);
    assert!(ev.still_over_quota);
    assert!(open_writer.current_path().expect("open").exists());
    std::fs::write(dir.path().join("notes.txt"), b"keep me").expect("write");
    enforce_quota(dir.path(), 0).expect("quota");
    assert!(dir.path().join("notes.txt").exists(), "foreign files are never evicted");
}

#[test]
fn config_errors_say_what_to_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = WriterConfig::new(dir.path());
    cfg.segment_bytes = 1 << 20;
    let e = SegmentWriter::new(cfg.clone(), identity()).expect_err("too small");
    assert!(e.to_string().contains("raise segment_bytes"), "{e}");
    cfg.segment_bytes = 64 << 20;
    cfg.chunk_records = 0;
    assert!(SegmentWriter::new(cfg, identity()).expect_err("zero").to_string().contains("chunk_records"));
    let mut long = identity();
    long.host = "h".repeat(5000);
    let e = SegmentWriter::new(WriterConfig::new(dir.path()), long).expect_err("long identity");
    assert!(e.to_string().contains("shorten the host"), "{e}");
}

#[test]
fn an_unwritable_directory_is_an_error_naming_it_and_records_are_counted_as_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), 4);
    // Replace the directory with a file: creation of the first segment must fail cleanly.
    std::fs::remove_dir(dir.path()).expect("rmdir");
    std::fs::write(dir.path(), b"not a directory").expect("write");
    for i in 0..3 {
        w.append(&rec(i)).expect("buffered, not yet written");
    }
    let e = w.append(&rec(3)).expect_err("no directory");
    assert!(e.to_string().contains(&dir.path().display().to_string()), "{e}");
    assert_eq!(w.stats().records_dropped, 4);
    assert_eq!(w.stats().write_errors, 1);
    // The directory comes back: the writer carries on.
    std::fs::remove_file(dir.path()).expect("rm");
    std::fs::create_dir(dir.path()).expect("mkdir");
    for i in 4..8 {
        w.append(&rec(i)).expect("append");
    }
    let closed = w.finish().expect("finish");
    let r = SegmentReader::open(&closed[0]).expect("open");
    assert_eq!(all_records(&r), (4..8).map(rec).collect::<Vec<_>>());
}

/// The summary a sealed file ends in: what its reader says, found without inflating the data;
/// a file without one, or with a damaged or foreign one, is said to be so and still reads whole.
#[test]
fn a_sealed_segment_carries_a_summary_of_what_its_reader_says() {
    // Records over 3 s, a second-long stall in the middle, a corrupt chunk carried as evidence.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), 8);
    let t1 = |i: u64| T0 + i * 50_000_000 + if i >= 20 { 1_000_000_000 } else { 0 };
    for i in 0..40 {
        w.append(&ProbeRecord { t1_unix_ns: t1(i), ..rec(i) }).expect("append");
    }
    let open = w.finish().expect("finish").remove(0);
    let mut bytes = std::fs::read(&open).expect("read");
    let dict_len = u32::from_le_bytes(bytes[HEADER_BYTES + 8..HEADER_BYTES + 12].try_into().expect("4")) as usize;
    let first = HEADER_BYTES + layout::frame_span(dict_len);
    bytes[first + FRAME_HEADER_BYTES + 3] ^= 0x40;
    std::fs::write(&open, &bytes).expect("write");
    let sealed = seal(&open, 3).expect("seal").sealed_path;

    let r = SegmentReader::open(&sealed).expect("the reader skips the summary's frame");
    assert_eq!((r.records(), r.damage().len()), (32, 1));
    let SummaryRead::Found(s) = read_summary(&sealed).expect("read") else { panic!("no summary") };
    assert_eq!(s.facts, SealedSummary { frames: s.facts.frames.clone(), ..SealedSummary::of(&r, r.damage().to_vec()) });
    assert_eq!((s.identity, s.created_unix_ns), (identity(), r.created_unix_ns()));
    // Every record is in its second; the stall is the one long gap.
    let (sec0, per) = (T0 / 1_000_000_000, &s.facts.per_second);
    assert_eq!(per.iter().map(|p| p.1).sum::<u64>(), 32);
    assert!(per.iter().all(|&(sec, _)| (sec0..sec0 + 4).contains(&sec)), "{per:?}");
    assert_eq!(s.facts.send_gaps.long, vec![(t1(19), t1(20) - t1(19))]);
    assert_eq!(s.facts.first_prober, Some(0));

    let sealed_bytes = std::fs::read(&sealed).expect("read");
    let frame = s.facts.frame();
    assert!(sealed_bytes.ends_with(&frame));
    let data_len = sealed_bytes.len() - frame.len();
    // Any zstd decoder skips it: streaming the file gives exactly what its data frame holds.
    let inflated = zstd::stream::decode_all(&sealed_bytes[..]).expect("inflate");
    assert_eq!(inflated, zstd::stream::decode_all(&sealed_bytes[..data_len]).expect("inflate the data frame"));
    assert_eq!(inflated[..8], *b"ROCEMSEG");
    let variant = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(format!("{name}{SEALED_SUFFIX}"));
        std::fs::write(&p, bytes).expect("write");
        p
    };
    // Sealed by a build before summaries: absent, and the file reads as before.
    let bare = variant("bare", &sealed_bytes[..data_len]);
    assert_eq!(read_summary(&bare).expect("read"), SummaryRead::Absent);
    assert_eq!(SegmentReader::open(&bare).expect("open").records(), 32);
    // A flipped bit in the body: unusable, said why; the data still reads.
    let mut flipped = sealed_bytes.clone();
    flipped[data_len + 20] ^= 1;
    let flipped = variant("flipped", &flipped);
    assert!(matches!(read_summary(&flipped), Ok(SummaryRead::Unusable(why)) if why.contains("checksum")));
    assert_eq!(SegmentReader::open(&flipped).expect("open").records(), 32);
    // Another version, and a length that does not fit.
    let mut other = sealed_bytes.clone();
    let v = other.len() - 8;
    other[v] = 9;
    assert!(
        matches!(read_summary(&variant("v9", &other)), Ok(SummaryRead::Unusable(why)) if why.contains("version 9"))
    );
    let mut long = sealed_bytes.clone();
    let l = long.len() - 16;
    long[l..l + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(
        matches!(read_summary(&variant("long", &long)), Ok(SummaryRead::Unusable(why)) if why.contains("does not fit"))
    );
    // A summary whose counts disagree with the close block (a forgery that kept its checksum).
    let mut forged = s.facts.clone();
    forged.records += 1;
    let mut bytes = sealed_bytes[..data_len].to_vec();
    bytes.extend_from_slice(&forged.frame());
    assert!(
        matches!(read_summary(&variant("forged", &bytes)), Ok(SummaryRead::Unusable(why)) if why.contains("close block"))
    );
    // An open segment has none; a foreign file is refused as the reader refuses it.
    let (_d, open2) = one_segment(10, 4);
    assert_eq!(read_summary(&open2).expect("read"), SummaryRead::Absent);
    let mut foreign = compress_foreign();
    foreign.extend_from_slice(&frame);
    assert!(matches!(read_summary(&variant("foreign", &foreign)), Err(SegmentError::Foreign { .. })));
}

/// A zstd file that is no segment.
fn compress_foreign() -> Vec<u8> {
    zstd::bulk::compress(&[7u8; 5000], 3).expect("compress")
}

/// Counts per (window, prober, target, label) and RTT buckets, from the records themselves, as
/// the writer's summaries must give them.
type Counts = std::collections::BTreeMap<(u64, u32, u32, u32), ([u32; 7], Vec<u16>)>;

fn counts_of_records(r: &SegmentReader, window_ns: u64, same_tor: &dyn Fn(u32) -> bool) -> Counts {
    let mut out = Counts::new();
    for rec in all_records(r) {
        let label = if same_tor(rec.target) { crate::window::ALL_LABELS } else { rec.flow_label };
        let key = (rec.t1_unix_ns - rec.t1_unix_ns % window_ns, rec.prober, rec.target, label);
        let e = out.entry(key).or_default();
        let class = crate::record::Class::of(rec.outcome, rec.arrived);
        e.0[class as usize] += 1;
        if class == crate::record::Class::Ok {
            e.1.push(crate::window::bucket_of(rec.network_rtt_ns as u64));
        }
    }
    out.values_mut().for_each(|v| v.1.sort_unstable());
    out
}

fn counts_of_summaries(r: &SegmentReader) -> Counts {
    let mut out = Counts::new();
    for w in r.window_summaries() {
        for (i, k) in w.keys.iter().enumerate() {
            let key =
                (w.start_unix_ns.to_native(), k.prober.to_native(), k.target.to_native(), k.flow_label.to_native());
            let e = out.entry(key).or_default();
            for (c, n) in e.0.iter_mut().zip(k.counts.iter()) {
                *c += n.to_native();
            }
            for c in w.cells_of(i).iter().filter(|c| c.measure == crate::window::Measure::NetworkRtt as u8) {
                e.1.extend(std::iter::repeat_n(c.bucket.to_native(), c.count.to_native() as usize));
            }
        }
    }
    out.values_mut().for_each(|v| v.1.sort_unstable());
    out
}

/// Window summaries count exactly the records of the file they are in, rotation mid-window
/// included (each segment carries its part), open and sealed; probes within the writer's ToR
/// are keyed under every label; a chunk lost to damage makes the file's summaries unusable,
/// never wrong.
#[test]
fn window_summaries_count_exactly_the_records_of_their_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = WriterConfig::new(dir.path());
    cfg.chunk_records = 64;
    cfg.segment_bytes = 2 << 20;
    // 100 us between records: 1 ms windows of 10 records, segments of 0.25 s.
    cfg.summary_window_ns = 1_000_000;
    cfg.summary_grace_ns = 300_000;
    cfg.max_age_ns = 250_000_000;
    let mut w = SegmentWriter::new(cfg, identity()).expect("writer");
    w.endpoint(EndpointRole::Rnic, "tor0-h1/mlx5_0", "tor0", [0; 16]);
    w.endpoint(EndpointRole::Rnic, "tor0-h2/mlx5_0", "tor0", [1; 16]);
    w.endpoint(EndpointRole::Rnic, "tor1-h1/mlx5_0", "tor1", [2; 16]);
    w.endpoint(EndpointRole::Rnic, "tor1-h2/mlx5_0", "tor1", [3; 16]);
    let n = 10_000;
    for i in 0..n {
        w.append(&rec(i)).expect("append");
    }
    let stats = w.stats();
    let closed = w.finish().expect("finish");
    assert!(closed.len() >= 4, "{closed:?}");
    assert!(stats.summaries_written > 0);
    let same_tor = |t: u32| t == 1;
    let mut total = 0;
    for path in &closed {
        let r = SegmentReader::open(path).expect("open");
        assert!(r.summaries_complete(), "{path:?}: {:?}", r.damage());
        assert_eq!(r.summarized_records(), r.records());
        assert_eq!(counts_of_summaries(&r), counts_of_records(&r, 1_000_000, &same_tor), "{path:?}");
        total += r.records();
        let sealed = seal(path, 1).expect("seal");
        let s = SegmentReader::open(&sealed.sealed_path).expect("sealed");
        assert!(s.summaries_complete());
        assert_eq!(counts_of_summaries(&s), counts_of_records(&s, 1_000_000, &same_tor));
    }
    assert_eq!(total, n);

    // A probe chunk lost to a flipped byte: the summaries count records the file no longer
    // holds, which the damage explains: they are not used, and the file still seals.
    let (_d, path) = {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = WriterConfig::new(dir.path());
        cfg.chunk_records = 8;
        cfg.summary_window_ns = 1_000_000;
        let mut w = SegmentWriter::new(cfg, identity()).expect("writer");
        for i in 0..40 {
            w.append(&rec(i)).expect("append");
        }
        let closed = w.finish().expect("finish");
        (dir, closed[0].clone())
    };
    let mut bytes = std::fs::read(&path).expect("read");
    let dict_len = u32::from_le_bytes(bytes[HEADER_BYTES + 8..HEADER_BYTES + 12].try_into().expect("4")) as usize;
    let first = HEADER_BYTES + layout::frame_span(dict_len);
    bytes[first + FRAME_HEADER_BYTES + 3] ^= 0x40;
    std::fs::write(&path, &bytes).expect("write");
    let r = SegmentReader::open(&path).expect("open");
    assert_eq!(r.records(), 32);
    assert!(!r.summaries_complete());
    assert_eq!(r.window_summaries().count(), 0);
    let kinds: Vec<_> = r.damage().iter().map(|d| (d.kind, d.records_lost)).collect();
    assert_eq!(kinds, [(DamageKind::CorruptChunk, Some(8))]);
    drop(r);
    let sealed = seal(&path, 1).expect("a file with a corrupt chunk and its summaries seals");
    let s = SegmentReader::open(&sealed.sealed_path).expect("sealed");
    assert_eq!((s.records(), s.window_summaries().count()), (32, 0));

    // A writer killed with windows open: its summaries count fewer records than it holds. They
    // are incomplete, not damage, and the segment seals as every crashed one does.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = WriterConfig::new(dir.path());
    cfg.chunk_records = 8;
    cfg.summary_window_ns = 1_000_000;
    cfg.summary_grace_ns = 0;
    let mut w = SegmentWriter::new(cfg, identity()).expect("writer");
    for i in 0..100 {
        w.append(&rec(i)).expect("append");
    }
    w.flush().expect("flush");
    let path = w.current_path().expect("open segment").to_path_buf();
    w.crash();
    let r = SegmentReader::open(&path).expect("open");
    assert!(r.summarized_records() > 0 && r.summarized_records() < r.records(), "{r:?}");
    assert!(!r.summaries_complete() && r.damage().is_empty(), "{:?}", r.damage());
    drop(r);
    let sealed = seal(&path, 1).expect("a crashed segment with summaries seals");
    let s = SegmentReader::open(&sealed.sealed_path).expect("sealed");
    assert!(s.is_closed() && !s.summaries_complete() && s.damage().is_empty(), "{:?}", s.damage());
    assert_eq!(s.records(), 100);
}

/// Summaries that count as many probes as an open segment holds, but sent an hour after its
/// records: not of this file, so not used, and said.
#[test]
fn summaries_of_other_times_than_the_records_are_set_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), 8);
    for i in 0..40 {
        w.append(&rec(i)).expect("append");
    }
    w.flush().expect("flush");
    let path = w.current_path().expect("open segment").to_path_buf();
    w.crash();
    let end = SegmentReader::open(&path).expect("open").frames_end();
    let mut cols = crate::record::ProbeColumns::with_capacity(40);
    for i in 0..40 {
        cols.push(&ProbeRecord { t1_unix_ns: rec(i).t1_unix_ns + 3_600_000_000_000, ..rec(i) });
    }
    let mut s = crate::window::Summariser::new(1_000_000_000, 0);
    s.fold(&cols);
    s.close_all();
    let forged = s.take_ready();
    let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&forged).expect("serialise");
    let mut frame = vec![0u8; layout::frame_span(payload.len())];
    frame[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + payload.len()].copy_from_slice(&payload);
    layout::seal_frame_header(&mut frame, layout::FrameKind::Windows, 40, forged[0].start_unix_ns, payload.len());
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[end..end + frame.len()].copy_from_slice(&frame);
    std::fs::write(&path, &bytes).expect("write");
    let r = SegmentReader::open(&path).expect("open");
    assert_eq!(r.records(), 40);
    assert_eq!((r.window_summaries().count(), r.summarized_records()), (0, 0));
    let d = r.damage();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0].kind, d[0].records_lost), (DamageKind::Summary, None));
    assert!(d[0].detail.contains("outside the records'"), "{}", d[0].detail);
}

/// A shard's own stall and a long send gap in its records start at the same floor.
#[test]
fn a_summary_stall_starts_where_a_long_send_gap_does() {
    assert_eq!(crate::window::STALL_NS, LONG_GAP_MIN_NS);
}

/// A sealed file in several zstd frames, one per group of frames of one content, indexed in its
/// summary: read whole it is what it always was; read in part, a time range's probe chunks come
/// with their places in the file, and the window summaries come alone; an index that lies is
/// refused, structurally when read, in content when a frame it describes is inflated; and a
/// summary from before the index still plans the file.
#[test]
fn a_sealed_segment_reads_in_part_through_its_frame_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = WriterConfig::new(dir.path());
    cfg.chunk_records = 512;
    cfg.segment_bytes = 8 << 20;
    // 100 us between records: 20 ms windows, a summary frame every few chunks.
    cfg.summary_window_ns = 20_000_000;
    cfg.summary_grace_ns = 1_000_000;
    let mut w = SegmentWriter::new(cfg, identity()).expect("writer");
    for t in 0..4 {
        w.endpoint(EndpointRole::Rnic, &format!("tor{}-h{t}/mlx5_0", t / 2), &format!("tor{}", t / 2), [t as u8; 16]);
    }
    let n = 60_000u64;
    for i in 0..n {
        w.append(&rec(i)).expect("append");
        if i % 20_000 == 0 {
            let path = PathRecord {
                t_unix_ns: T0 + i,
                src: 0,
                dst: 2,
                flow_label: 5,
                hop_count: 2,
                hops: [1, 3, 0, 0, 0, 0, 0, 0],
            };
            w.append_path(&path).expect("path");
        }
    }
    let open = w.finish().expect("finish").remove(0);
    let sealed = seal(&open, 3).expect("seal").sealed_path;
    let full = SegmentReader::open(&sealed).expect("whole");
    assert_eq!((full.records(), full.is_partial(), full.file_records()), (n, false, n));
    assert!(full.summaries_complete());
    let SummaryRead::Found(s) = read_summary(&sealed).expect("read") else { panic!("no summary") };
    let frames = &s.facts.frames;
    let contents: std::collections::BTreeSet<_> = frames.iter().map(|f| format!("{:?}", f.content)).collect();
    assert_eq!(contents.into_iter().collect::<Vec<_>>(), ["Dictionary", "Header", "Paths", "Probes", "Windows"]);
    assert!(frames.iter().all(|f| f.raw_len as usize <= GROUP_RAW_BYTES), "{frames:?}");
    assert_eq!(frames.iter().map(|f| f.records).sum::<u64>(), n);
    // Every record's place in the file, from the whole read.
    let place: std::collections::HashMap<u64, (u64, &crate::record::ArchivedProbeColumns)> =
        full.probe_chunks_at().map(|(base, c)| (base, (base, c))).collect();

    // The window summaries alone: no record inflated, and they count the whole file.
    let only = Pick { windows: true, ..Pick::default() };
    let w = SegmentReader::open_part(&sealed, frames, &only).expect("windows");
    assert_eq!((w.records(), w.file_records(), w.is_partial()), (0, n, true));
    assert!(w.summaries_complete() && w.damage().is_empty(), "{:?}", w.damage());
    assert_eq!(counts_of_summaries(&w), counts_of_summaries(&full));
    assert_eq!(w.dictionary(), full.dictionary());
    assert_eq!(w.path_records().count(), 0);

    // A middle range's probe chunks: every record of the range, each chunk in its place.
    let (lo, hi) = (T0 + 2_000_000_000, T0 + 3_500_000_000);
    let range = Pick { probes: Some((lo, hi)), paths: true, ..Pick::default() };
    let r = SegmentReader::open_part(&sealed, frames, &range).expect("range");
    assert!(r.records() < n / 2 && r.window_summaries().count() == 0, "{}", r.records());
    assert_eq!(r.path_records().count(), full.path_records().count());
    let in_range = |rd: &SegmentReader| {
        rd.probe_chunks()
            .flat_map(|c| c.t1_unix_ns.iter().map(|t| t.to_native()))
            .filter(|t| (lo..=hi).contains(t))
            .count()
    };
    assert_eq!(in_range(&r), in_range(&full));
    for (base, c) in r.probe_chunks_at() {
        let (_, whole) = place.get(&base).expect("a chunk where the whole read has one");
        assert_eq!(
            (0..c.len()).map(|i| c.row(i)).collect::<Vec<_>>(),
            (0..whole.len()).map(|i| whole.row(i)).collect::<Vec<_>>()
        );
    }

    let sealed_bytes = std::fs::read(&sealed).expect("read");
    let data_len = sealed_bytes.len() - s.facts.frame().len();
    let with_summary = |name: &str, frame: Vec<u8>| {
        let p = dir.path().join(format!("{name}{SEALED_SUFFIX}"));
        let mut b = sealed_bytes[..data_len].to_vec();
        b.extend_from_slice(&frame);
        std::fs::write(&p, b).expect("write");
        p
    };
    // An index whose counts do not add up to the file's: the summary is not used.
    let mut forged = s.facts.clone();
    let k = forged.frames.iter().position(|f| f.records > 0).expect("a probe frame");
    forged.frames[k].records += 1;
    let p = with_summary("uncounted", forged.frame());
    assert!(
        matches!(read_summary(&p), Ok(SummaryRead::Unusable(why)) if why.contains("frame index")),
        "{:?}",
        read_summary(&p)
    );
    // An index that adds up but misplaces a frame's records in time: refused when inflated.
    let mut forged = s.facts.clone();
    let f = &mut forged.frames[k];
    f.t1_span = f.t1_span.map(|(a, b)| (a, b + 1));
    let p = with_summary("misdated", forged.frame());
    let SummaryRead::Found(back) = read_summary(&p).expect("read") else { panic!("structure holds") };
    let wide = Pick { probes: Some((0, u64::MAX)), ..Pick::default() };
    let e = SegmentReader::open_part(&p, &back.facts.frames, &wide).expect_err("misdated");
    assert!(e.to_string().contains("its index says"), "{e}");
    // A version 1 summary (sealed before the index, here over the same data): planned from, no frames.
    let p = with_summary("v1", s.facts.frame_v1());
    let SummaryRead::Found(v1) = read_summary(&p).expect("read") else { panic!("v1 is read") };
    assert_eq!(v1.facts, SealedSummary { frames: Vec::new(), ..s.facts.clone() });
    assert_eq!(SegmentReader::open_part(&p, &v1.facts.frames, &only).expect("whole").records(), n);
    // Whole reads and any zstd decoder see the segment byte for byte. The first frame states
    // no size, so a build before the index (which sized its buffer by the first frame) streams
    // the file whole instead of failing on the frames after it.
    let inflated = zstd::stream::decode_all(&sealed_bytes[..]).expect("inflate");
    assert_eq!(inflated.len() as u64, frames.last().map(|f| f.raw_at + f.raw_len).expect("frames"));
    assert_eq!(&inflated[HEADER_BYTES..], &full.raw()[HEADER_BYTES..]);
    assert!(matches!(zstd::zstd_safe::get_frame_content_size(&sealed_bytes), Ok(None)));

    // Bit rot in one group of records: a whole read fails; a partial read loses that group's
    // records only, as damage, and the summaries read on.
    let f = *frames.iter().filter(|f| f.records > 0).nth(1).expect("a second group of records");
    let mut rotten = sealed_bytes.clone();
    rotten[(f.at + f.len / 2) as usize] ^= 0x5A;
    let p = dir.path().join(format!("rotten{SEALED_SUFFIX}"));
    std::fs::write(&p, &rotten).expect("write");
    assert!(matches!(SegmentReader::open(&p), Err(SegmentError::BadSealed { .. })));
    let all = Pick { probes: Some((0, u64::MAX)), windows: true, paths: true };
    let r = SegmentReader::open_part(&p, frames, &all).expect("the rest reads");
    assert_eq!(r.records(), n - f.records);
    let lost: Vec<_> = r.damage().iter().map(|d| (d.kind, d.records_lost, d.offset)).collect();
    assert_eq!(lost, [(DamageKind::CorruptChunk, Some(f.records as u32), f.raw_at)]);
    assert!(r.damage()[0].detail.contains("does not inflate"), "{:?}", r.damage());
    let w = SegmentReader::open_part(&p, frames, &only).expect("windows");
    assert!(w.summaries_complete() && w.damage().is_empty());
}
