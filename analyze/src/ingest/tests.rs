use super::{columns::*, model::*, plan::*};

#[test]
fn ranges_hold_whole_windows_up_to_the_budget() {
    let w = 30_000_000_000u64;
    let plan = |counts: &[(u64, u64)]| Plan {
        ds: Dataset::default(),
        files: Vec::new(),
        fields: Fields::Report,
        unknown_ids: Vec::new(),
        window_ns: w,
        carried: Vec::new(),
        per_window: counts.iter().copied().collect(),
        read_records: 0,
        indexed: false,
        traces: None,
    };
    // 10 and 11 fit in 10 records; 12 holds 20 alone (a window is never split); 13 is empty.
    let p = plan(&[(10, 5), (11, 5), (12, 20), (14, 1)]);
    assert_eq!(p.ranges(10), vec![(10 * w, 12 * w), (12 * w, 13 * w), (14 * w, 15 * w)]);
    assert_eq!(p.ranges(1 << 20), vec![(10 * w, 15 * w)]);
    // A T1 at the top of the clock (a corrupt record) ends its range at u64::MAX, included.
    let top = u64::MAX / w;
    assert_eq!(plan(&[(top, 1)]).ranges(10), vec![(top * w, u64::MAX)]);
    assert!(within(u64::MAX, top * w, u64::MAX) && !within(5, 6, 9) && within(8, 6, 9) && !within(9, 6, 9));
}

#[test]
fn a_path_that_changed_is_the_one_in_force_at_the_time_asked() {
    // A prober restarted at t = 100 s: its label 7 left from a new port, over another spine.
    // Reproduces the Clos run in which every window before the restart voted on the new path.
    let mut ds = Dataset::default();
    let key = (0, 1, 7);
    ds.paths.insert(key, vec![0, 3, 2]);
    ds.path_changes.insert(key, vec![(10_000_000_000, vec![0, 1, 2]), (100_000_000_000, vec![0, 3, 2])]);
    assert_eq!(ds.path_at(&key, 5_000_000_000), Some(&vec![0, 1, 2]), "before the first trace: the first");
    assert_eq!(ds.path_at(&key, 99_999_999_999), Some(&vec![0, 1, 2]));
    assert_eq!(ds.path_at(&key, 100_000_000_000), Some(&vec![0, 3, 2]));
    assert_eq!(ds.path_at(&key, u64::MAX), Some(&vec![0, 3, 2]));
    // A key that never changed is its one path; an untraced one has none.
    ds.paths.insert((1, 0, 7), vec![2, 1, 0]);
    assert_eq!(ds.path_at(&(1, 0, 7), 0), Some(&vec![2, 1, 0]));
    assert_eq!(ds.path_at(&(5, 0, 7), 0), None);
}

/// A sealed file is read by ranges in part (the zstd frames that reach into each range, found
/// through its index), never carried whole from range to range, and gives every record once,
/// at its place in the input, as the whole read does; an index that lies about a frame is said
/// once and the file read whole, its records all counted.
#[test]
fn ranges_read_indexed_sealed_files_in_part_and_whole_files_when_the_index_lies() {
    use rocemesh_formats::record::{Arrived, EndpointRole, Outcome, ProbeRecord, TsSource};
    use rocemesh_formats::segment::{SegmentWriter, SummaryRead, WriterConfig, WriterIdentity, read_summary, seal};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = WriterConfig::new(dir.path());
    cfg.chunk_records = 1024;
    cfg.segment_bytes = 16 << 20;
    cfg.summary_window_ns = 5_000_000_000;
    let identity = |host: &str| WriterIdentity {
        host: host.into(),
        device: "mlx5_0".into(),
        tor: "tor0".into(),
        agent_epoch: 1,
        tool: "test".into(),
    };
    let t0 = 1_700_000_000_000_000_000u64;
    let mut sealed = Vec::new();
    for (h, host) in ["tor0-h0", "tor0-h1"].iter().enumerate() {
        let mut w = SegmentWriter::new(cfg.clone(), identity(host)).expect("writer");
        w.endpoint(EndpointRole::Rnic, &format!("{host}/mlx5_0"), "tor0", [h as u8; 16]);
        w.endpoint(EndpointRole::Rnic, "tor0-h9/mlx5_0", "tor0", [9; 16]);
        // 1,000 probes a second for 120 s: several frame groups of records per file.
        for i in 0..120_000u64 {
            let r = ProbeRecord {
                t1_unix_ns: t0 + i * 1_000_000 + h as u64,
                seq: i,
                network_rtt_ns: 5_000 + (i % 97) as i32,
                prober_delay_ns: 1_000,
                responder_delay_ns: 1_000,
                prober: 0,
                target: 1,
                flow_label: (i % 8) as u32,
                responder_epoch: 1,
                kind: 0,
                outcome: if i % 500 == 0 { Outcome::Lost as u8 } else { Outcome::Ok as u8 },
                arrived: Arrived::ALL.0,
                ts_source: TsSource::KernelSoftware as u8,
            };
            w.append(&r).expect("append");
        }
        for p in w.finish().expect("finish") {
            sealed.push(seal(&p, 3).expect("seal").sealed_path);
        }
    }
    sealed.sort();
    let whole = super::ingest_with(&sealed, false, Fields::All, None);
    let by_index = |p: &Probes| {
        let mut v: Vec<(u64, u64, u32)> =
            (0..p.len()).map(|i| (p.index_of(i), p.t1_unix_ns[i], p.network_rtt_ns[i] as u32)).collect();
        v.sort_unstable();
        v
    };
    let expected = by_index(&whole.probes);
    let read_by_ranges = |files: &[std::path::PathBuf], in_part: bool| {
        let mut p = plan(files, Fields::All, None, 5_000_000_000);
        p.with_index(true);
        let mut passes = Vec::new();
        let mut groups = 0;
        for _ in 0..2 {
            p.rewind();
            let mut got = Vec::new();
            for (from, to) in p.ranges(20_000) {
                let probes = p.read(from, to);
                groups += 1;
                assert!(!in_part || p.carried.is_empty(), "a file read in part is not carried to the next range");
                got.extend(by_index(&probes));
            }
            got.sort_unstable();
            passes.push(got);
        }
        assert_eq!(passes[0], passes[1], "every pass reads the same records");
        (passes.remove(0), groups / 2, p.finish())
    };
    assert!(sealed.iter().all(|f| match read_summary(f) {
        Ok(SummaryRead::Found(s)) => s.facts.frames.iter().filter(|f| f.records > 0).count() >= 4,
        _ => false,
    }));
    let (got, ranges, ds) = read_by_ranges(&sealed, true);
    assert!(ranges >= 10, "{ranges} ranges");
    assert_eq!(got, expected);
    assert!(ds.problems.is_empty(), "{:?}", ds.problems);

    // The second file's index misdates one of its frames (the structure holds): said, read whole.
    let victim = &sealed[1];
    let SummaryRead::Found(s) = read_summary(victim).expect("read") else { panic!("summary") };
    let mut forged = s.facts.clone();
    let k = forged.frames.iter().position(|f| f.records > 0).expect("a frame of records");
    forged.frames[k].t1_span = forged.frames[k].t1_span.map(|(lo, hi)| (lo, hi + 1));
    let bytes = std::fs::read(victim).expect("read");
    let mut out = bytes[..bytes.len() - s.facts.frame().len()].to_vec();
    out.extend_from_slice(&forged.frame());
    std::fs::write(victim, out).expect("write");
    let (got, _, ds) = read_by_ranges(&sealed, false);
    assert_eq!(got, expected, "every record, once, at its place");
    let said: Vec<_> = ds.problems.iter().filter(|p| p.problem.contains("frame index does not hold")).collect();
    assert_eq!(said.len(), 1, "{:?}", ds.problems);
    assert_eq!(said[0].path, *victim);

    // The first file's bytes rot in one of its groups of records: that group's records are
    // lost on every pass, said once; the rest of the file is read.
    let rotten = &sealed[0];
    let SummaryRead::Found(s) = read_summary(rotten).expect("read") else { panic!("summary") };
    let f = *s.facts.frames.iter().filter(|f| f.records > 0).nth(2).expect("a third frame of records");
    let mut bytes = std::fs::read(rotten).expect("read");
    bytes[(f.at + f.len / 2) as usize] ^= 0x5A;
    std::fs::write(rotten, bytes).expect("write");
    let (got, _, ds) = read_by_ranges(&sealed, false);
    let group = f.records_before..f.records_before + f.records;
    let kept: Vec<_> = expected.iter().filter(|r| !group.contains(&r.0)).copied().collect();
    assert_eq!((expected.len() - kept.len()) as u64, f.records, "the first file's records come first in the input");
    assert_eq!(got, kept);
    let rot: Vec<_> = ds.problems.iter().filter(|p| p.problem.contains("does not inflate")).collect();
    assert_eq!(rot.len(), 1, "{:?}", ds.problems);
    assert_eq!(rot[0].path, *rotten);
}
