//! Shared by the integration tests: a deterministic record stream and a directory reader.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rocemesh_formats::record::{Arrived, EndpointRole, Outcome, ProbeRecord, TsSource};
use rocemesh_formats::segment::{SegmentReader, SegmentWriter, WriteMode, WriterConfig, WriterIdentity};

pub const T0: u64 = 1_700_000_000_000_000_000;

/// Record `i` of the stream; `seq == i`, so gaps and reordering are visible.
pub fn rec(i: u64) -> ProbeRecord {
    ProbeRecord {
        t1_unix_ns: T0 + i * 10_000,
        seq: i,
        network_rtt_ns: 3_000 + (i % 97) as i32,
        prober_delay_ns: 1_500,
        responder_delay_ns: 900,
        prober: 0,
        target: 1 + (i % 31) as u32,
        flow_label: 1 + (i % 16) as u32,
        responder_epoch: 3,
        kind: 0,
        outcome: Outcome::Ok as u8,
        arrived: Arrived::ALL.0,
        ts_source: TsSource::KernelSoftware as u8,
    }
}

pub fn writer(dir: &Path, chunk_records: usize, segment_bytes: u64) -> SegmentWriter {
    writer_in(dir, chunk_records, segment_bytes, WriteMode::default())
}

pub fn writer_in(dir: &Path, chunk_records: usize, segment_bytes: u64, mode: WriteMode) -> SegmentWriter {
    let mut cfg = WriterConfig::new(dir);
    cfg.write_mode = mode;
    cfg.chunk_records = chunk_records;
    cfg.segment_bytes = segment_bytes;
    let id = WriterIdentity {
        host: "h0".into(),
        device: "d0".into(),
        tor: "t0".into(),
        agent_epoch: 1,
        tool: "test".into(),
    };
    let mut w = SegmentWriter::new(cfg, id).expect("writer");
    for t in 0..32 {
        w.endpoint(EndpointRole::Rnic, &format!("h{t}/d0"), "t0", [0; 16]);
    }
    w
}

/// Segment files in `dir` whose name ends with `suffix`, oldest first.
pub fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}

pub fn records_of(r: &SegmentReader) -> Vec<ProbeRecord> {
    r.probe_chunks().flat_map(|c| (0..c.len()).map(move |i| c.row(i))).collect()
}
