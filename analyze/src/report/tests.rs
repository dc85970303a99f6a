use super::*;
use super::{pairs::*, render::*};
use rocemesh_formats::record::{Arrived, TsSource};

/// The packed byte keeps class and timestamp source apart, for every class and source byte.
#[test]
fn packed_bytes_keep_class_and_source() {
    for class in Class::ALL {
        for ts in [0u8, 1, 2, 3, 4, 200] {
            let b = packed::pack(class, ts);
            assert_eq!(packed::class(b), class as u8);
            assert_eq!(packed::is_ok(b), class == Class::Ok);
            let want = if class == Class::Ok { u64::from(TsSources::of(ts).0) } else { 0 };
            assert_eq!(packed::sample_ts_bit(b), want, "{class:?} ts {ts}");
            assert!(packed::sample_ts_bit(b) < 1 << TS_SLOT, "stays out of the other slots' way");
        }
    }
}

/// The pair table counts like a map, through growth, merges of tables of either size, and
/// keys that collide in the low bits the front cache of `prepare` is indexed by; its
/// timestamp-source slot merges by OR.
#[test]
fn pair_table_counts_like_a_map() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut want: std::collections::BTreeMap<u64, [u64; 8]> = std::collections::BTreeMap::new();
    let mut tables = vec![PairTable::default(), PairTable::default(), PairTable::default()];
    for i in 0..200_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Few keys in the first table, many in the others; multiples of 64 collide.
        let key = if i % 3 == 0 { (x % 50) * 64 } else { x % 30_000 };
        let class = (x >> 40) as usize % TS_SLOT;
        let ts = 1u64 << ((x >> 50) % 5);
        let mut one = [0u64; 8];
        one[class] = 1;
        one[TS_SLOT] = ts;
        tables[(i % 3) as usize].add_counts(key, &one);
        let w = want.entry(key).or_default();
        w[class] += 1;
        w[TS_SLOT] |= ts;
    }
    let [a, b, c] = <[PairTable; 3]>::try_from(tables).ok().expect("three tables");
    let merged = a.merge(b).merge(c);
    let mut got: Vec<(u64, [u64; 8])> = merged
        .keys
        .iter()
        .zip(&merged.counts)
        .filter(|(k, _)| **k != PairTable::EMPTY)
        .map(|(k, c)| (*k, *c))
        .collect();
    got.sort_unstable_by_key(|e| e.0);
    assert_eq!(merged.len, want.len());
    assert_eq!(got, want.into_iter().collect::<Vec<_>>());
}

/// The ok delays of `scope` keyed for polars to group by hashing, and polars' own quantiles of
/// each group: an implementation apart from [`PairSamples`] to hold it to.
pub(super) fn quantiles_hashed(p: &Prepared, scope: Scope, whole: bool) -> PolarsResult<DataFrame> {
    let c = p.columns()?;
    let (mut key, mut delays) = (Vec::new(), [Vec::new(), Vec::new(), Vec::new()]);
    for i in (0..c.class.len()).filter(|&i| packed::is_ok(c.class[i])) {
        let d = if whole { 0 } else { u64::from(c.d[i]) };
        let (a, b) = p.keys.keys(scope, d, c.prober[i], c.target[i], &p.rnic_tor);
        for k in std::iter::once(a).chain(b) {
            key.push(k);
            for (v, col) in delays.iter_mut().zip(c.delays) {
                v.push(col[i]);
            }
        }
    }
    let mut columns = vec![UInt64Chunked::from_vec("key".into(), key).into_column()];
    for (name, v) in DELAYS.iter().zip(delays) {
        columns.push(Int32Chunked::from_vec((*name).into(), v).into_column());
    }
    DataFrame::new(columns[0].len(), columns)?
        .lazy()
        .group_by([col("key")])
        .agg(
            QUANTILES
                .iter()
                .map(|(c, name, q)| {
                    col(*c).quantile(lit(*q), QuantileMethod::Equiprobable).strict_cast(DataType::Int64).alias(*name)
                })
                .collect::<Vec<_>>(),
        )
        .collect()
}

/// Both ways of selecting quantiles (from the pair layout, polars' over a hashed group-by) give
/// the same rows, on records with every outcome, an unknown RNIC id, an RNIC without a ToR and
/// a self-probe.
#[test]
fn laid_out_and_hashed_agree() {
    let rnics: Vec<Rnic> = (0..7)
        .map(|i| Rnic {
            name: format!("h{i}/d0"),
            tor: if i == 6 { String::new() } else { format!("t{}", i % 3) },
            host: format!("h{i}"),
        })
        .collect();
    let n = 20_000usize;
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut p = Probes::default();
    for i in 0..n {
        let r = next();
        p.t1_unix_ns.push(1_700_000_000_000_000_000 + (i as u64) * 6_000_000 + r % 1000);
        p.network_rtt_ns.push((r >> 10) as i32 & 0xFFFF);
        p.prober_delay_ns.push((r >> 26) as i32 & 0xFFF);
        p.responder_delay_ns.push((r >> 38) as i32 & 0xFFF);
        p.prober.push(if r % 997 == 0 { u32::MAX } else { (r >> 3) as u32 % 7 });
        p.target.push((r >> 7) as u32 % 7);
        p.flow_label.push(0);
        p.responder_epoch.push(0);
        p.kind.push(0);
        p.outcome.push([0, 0, 0, 0, 0, 1, 1, 2, 3, 4, 9][(r >> 50) as usize % 11]);
        p.arrived.push((r >> 54) as u8 & 7);
        p.ts_source.push([1, 2, 2, 2, 7][(r >> 58) as usize % 5]);
    }
    let prepared = prepare(p, &rnics, 30_000_000_000).expect("prepare");
    let scopes = [Scope::Cluster, Scope::TorPair, Scope::Tor, Scope::Rnic, Scope::Pair];
    let check = || {
        for span in [Span::PerWindow, Span::WholeRange] {
            let laid_out = prepared.rows(&scopes, span, &Sla::default()).expect("laid out");
            let hashed = prepared.rows_with(&scopes, span, &Sla::default(), QuantilesBy::Hashed).expect("hashed");
            assert!(laid_out.len() > 50, "{}", laid_out.len());
            assert_eq!(laid_out, hashed);
            assert!(laid_out.iter().any(|r| r.entity == UNKNOWN_RNIC));
            assert!(laid_out.iter().any(|r| r.entity == NO_TOR));
            assert!(laid_out.iter().any(|r| r.local_drop > 0));
            // A key with probes but no ok sample: counted, without quantiles.
            if span == Span::PerWindow {
                assert!(laid_out.iter().any(|r| r.probes > 0 && r.ok == 0 && r.rtt_ns_p50.is_none()));
            }
            assert!(
                laid_out.iter().any(|r| r.ts_source.as_deref() == Some("mixed(host_poll+kernel_software+unknown)"))
            );
        }
    };
    // One part; the records cut into parts whose samples of one pair lie apart; more threads
    // than the records' blocks.
    for threads in [1, 3, 32] {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool").install(check);
    }
}

/// Probes in one window from (prober, target, outcome, arrived, ts_source, rtt).
fn probes(recs: &[(u32, u32, u8, u8, u8, i32)]) -> Probes {
    let mut p = Probes::default();
    for (i, &(prober, target, outcome, arrived, ts, rtt)) in recs.iter().enumerate() {
        p.t1_unix_ns.push(1_700_000_010_000_000_000 + i as u64);
        p.network_rtt_ns.push(rtt);
        p.prober_delay_ns.push(100);
        p.responder_delay_ns.push(100);
        p.prober.push(prober);
        p.target.push(target);
        p.outcome.push(outcome);
        p.arrived.push(arrived);
        p.ts_source.push(ts);
    }
    p
}

fn three_rnics() -> Vec<Rnic> {
    (0..3).map(|i| Rnic { name: format!("h{i}/d0"), tor: "t0".into(), host: format!("h{i}") }).collect()
}

fn row<'a>(rows: &'a [Row], scope: Scope, entity: &str) -> &'a Row {
    rows.iter().find(|r| r.scope == scope && r.entity == entity).unwrap_or_else(|| panic!("{entity}: {rows:?}"))
}

/// A row pooling samples of two timestamp sources says so; a row of one source names it;
/// a lost probe's source is no sample's, so it labels nothing.
#[test]
fn rows_name_the_timestamp_sources_of_their_samples() {
    let all = Arrived::ALL.0;
    let recs = [
        (0, 1, 0, all, TsSource::HostPoll as u8, 90_000),
        (0, 1, 0, all, TsSource::HostPoll as u8, 95_000),
        (2, 1, 0, all, TsSource::KernelSoftware as u8, 9_000),
        (2, 0, 1, Arrived::PROBE_SENT, TsSource::Nic as u8, 0),
    ];
    let prepared = prepare(probes(&recs), &three_rnics(), 30_000_000_000).expect("prepare");
    for span in [Span::PerWindow, Span::WholeRange] {
        let rows = prepared.rows(&[Scope::Cluster, Scope::Rnic, Scope::Pair], span, &Sla::default()).expect("rows");
        let label = |scope, entity| row(&rows, scope, entity).ts_source.clone();
        assert_eq!(label(Scope::Rnic, "h0/d0").as_deref(), Some("host_poll"));
        assert_eq!(label(Scope::Rnic, "h1/d0").as_deref(), Some("mixed(host_poll+kernel_software)"));
        assert_eq!(label(Scope::Rnic, "h2/d0").as_deref(), Some("kernel_software"));
        assert_eq!(label(Scope::Pair, "h0/d0->h1/d0").as_deref(), Some("host_poll"));
        assert_eq!(label(Scope::Pair, "h2/d0->h0/d0"), None, "a lost probe is no sample");
        assert_eq!(label(Scope::Cluster, "cluster").as_deref(), Some("mixed(host_poll+kernel_software)"));
    }
}

/// Local drops have their own count and stay out of the loss ratio; a pair with nothing
/// else is not unreachable. Unknown outcome bytes count in `probes` only, and are counted.
#[test]
fn local_drops_and_unknown_outcomes_count_apart() {
    let (all, sent, ks) = (Arrived::ALL.0, Arrived::PROBE_SENT, TsSource::KernelSoftware as u8);
    let mut recs = vec![(0, 1, 0, all, ks, 5_000); 6];
    recs.extend([(0, 1, 1, sent, ks, 0), (0, 1, 4, 0, ks, 0), (0, 1, 4, 0, ks, 0), (0, 1, 200, all, ks, 7)]);
    recs.extend([(2, 0, 4, 0, ks, 0); 5]);
    let prepared = prepare(probes(&recs), &three_rnics(), 30_000_000_000).expect("prepare");
    assert_eq!(prepared.unknown_outcomes, 1);
    let rows = prepared.rows(&[Scope::Pair, Scope::Cluster], Span::PerWindow, &Sla::default()).expect("rows");
    let r = row(&rows, Scope::Pair, "h0/d0->h1/d0");
    assert_eq!((r.probes, r.ok, r.lost, r.local_drop, r.unreachable), (10, 6, 1, 2, 0));
    assert_eq!(r.loss_ratio, Some(1.0 / 7.0));
    assert_eq!(r.rtt_ns_p99, Some(5_000), "the unknown byte's delay is no sample");
    let dropped = row(&rows, Scope::Pair, "h2/d0->h0/d0");
    assert_eq!((dropped.local_drop, dropped.lost, dropped.unreachable), (5, 0, 0));
    assert_eq!((dropped.loss_ratio, dropped.sla_violations.len()), (None, 0));
    assert_eq!(row(&rows, Scope::Cluster, "cluster").local_drop, 7);
}

/// The `service` scope counts each connection's own probes per window (the unreachable rule
/// per window and connection, before a whole-range sum), and only those; the other scopes
/// count them at the remote RNIC like any probe.
#[test]
fn service_rows_count_each_connection_alone() {
    use crate::ingest::{Resolution, Service};
    use rocemesh_formats::record::ServiceConn;
    let (all, sent, ks) = (Arrived::ALL.0, Arrived::PROBE_SENT, TsSource::KernelSoftware as u8);
    // (window, prober, target, service, outcome, arrived, rtt)
    let mut recs: Vec<(u64, u32, u32, u32, u8, u8, i32)> = Vec::new();
    // Service 0 (h0 -> h1): window 0: 8 ok, 2 lost; window 1: 3 lost only (unreachable).
    recs.extend((0..8).map(|i| (0, 0, 1, 0, 0, all, 1_000 + i)));
    recs.extend([(0, 0, 1, 0, 1, sent, 0); 2]);
    recs.extend([(1, 0, 1, 0, 1, sent, 0); 3]);
    // Service 1 (h2 -> h1): window 1: 4 ok.
    recs.extend((0..4).map(|i| (1, 2, 1, 1, 0, all, 5_000 + i)));
    // Mesh probes h0 -> h1, lossy: in no service row.
    recs.extend([(0, 0, 1, NO_SERVICE, 1, sent, 0); 5]);
    recs.extend([(0, 0, 1, NO_SERVICE, 0, all, 9_999); 5]);
    let mut p = Probes::default();
    for (k, &(w, prober, target, service, outcome, arrived, rtt)) in recs.iter().enumerate() {
        p.t1_unix_ns.push(1_700_000_010_000_000_000 / 30_000_000_000 * 30_000_000_000 + w * 30_000_000_000 + k as u64);
        p.network_rtt_ns.push(rtt);
        p.prober_delay_ns.push(100);
        p.responder_delay_ns.push(100);
        p.prober.push(prober);
        p.target.push(target);
        p.outcome.push(outcome);
        p.arrived.push(arrived);
        p.ts_source.push(ks);
        p.service.push(service);
    }
    let conn = |pid| ServiceConn {
        pid,
        local_qpn: 7,
        remote_qpn: 8,
        flow_label: 9,
        comm: "nccl".into(),
        ..ServiceConn::default()
    };
    let services: Vec<Service> = [(0, 1, 10), (2, 1, 11)]
        .into_iter()
        .enumerate()
        .map(|(i, (prober, remote, pid))| Service {
            name: format!("svc{i}"),
            prober,
            remote,
            resolution: Resolution::Agent,
            addr: [0; 16],
            conn: conn(pid),
        })
        .collect();
    let prepared = prepare_with(p, &three_rnics(), &services, 30_000_000_000).expect("prepare");
    let rows = prepared.rows(&[Scope::Service, Scope::Rnic], Span::PerWindow, &Sla::default()).expect("rows");
    let svc: Vec<&Row> = rows.iter().filter(|r| r.scope == Scope::Service).collect();
    assert_eq!(svc.len(), 3, "{svc:?}");
    let find = |name: &str, unreachable: u64| {
        svc.iter()
            .find(|r| r.service.as_ref().is_some_and(|s| s.service == name) && r.unreachable == unreachable)
            .unwrap_or_else(|| panic!("{name}: {svc:?}"))
    };
    let w0 = find("svc0", 0);
    assert_eq!((w0.probes, w0.ok, w0.lost, w0.loss_ratio), (10, 8, 2, Some(0.2)));
    assert_eq!((w0.rtt_ns_p50, w0.rtt_ns_p99), (Some(1_003), Some(1_007)), "its own samples only");
    assert_eq!(w0.entity, "nccl[10] qp 7->8 h0/d0->h1/d0");
    let cols = w0.service.as_ref().expect("columns");
    assert_eq!((cols.prober.as_str(), cols.remote.as_str(), cols.flow_label), ("h0/d0", "h1/d0", 9));
    assert_eq!(w0.sla_violations, vec![Violation::Loss]);
    let w1 = find("svc0", 3);
    assert_eq!((w1.probes, w1.lost, w1.loss_ratio), (3, 0, None), "a window of nothing but losses: unreachable");
    assert!(w1.window_start_ns > w0.window_start_ns);
    let other = find("svc1", 0);
    assert_eq!((other.probes, other.ok, other.ts_source.as_deref()), (4, 4, Some("kernel_software")));
    // h1 is the remote of both: every probe to it is in its rnic rows.
    let h1: u64 = rows.iter().filter(|r| r.scope == Scope::Rnic && r.entity == "h1/d0").map(|r| r.probes).sum();
    assert_eq!(h1, recs.len() as u64);

    let whole = prepared.rows(&[Scope::Service], Span::WholeRange, &Sla::default()).expect("rows");
    assert_eq!(whole.len(), 2);
    let r = whole.iter().find(|r| r.service.as_ref().is_some_and(|s| s.service == "svc0")).expect("svc0");
    assert_eq!((r.probes, r.lost, r.unreachable), (13, 2, 3), "unreachable decided per window, then summed");

    // Without services (earlier data), the scope has no rows and the rest is unchanged.
    let plain = prepare(probes(&[(0, 1, 0, all, ks, 5)]), &three_rnics(), 30_000_000_000).expect("prepare");
    assert!(plain.rows(&[Scope::Service], Span::PerWindow, &Sla::default()).expect("rows").is_empty());
    let csv = frame(&rows, true).expect("frame");
    assert_eq!(csv.width(), frame(&rows, false).expect("frame").width() + 9);
    assert_eq!(csv.column("flow_label").expect("flow_label").null_count(), rows.len() - svc.len());
}

#[test]
fn columns_of_different_lengths_are_refused() {
    let mut p = probes(&[(0, 1, 0, 7, 2, 5); 3]);
    p.ts_source.clear();
    let e = prepare(p, &three_rnics(), 30_000_000_000).expect_err("ts_source is empty");
    assert!(e.to_string().contains("ts_source has 0 values for 3 records"), "{e}");
}

#[test]
fn utc_strings() {
    assert_eq!(utc(1_700_000_010_000_000_000), "2023-11-14T22:13:30Z");
}
