//! Test input shared by the report, watch and Spark tests: four agents' sealed segments, and a
//! reproducible random source.

#![allow(dead_code, reason = "each test binary that includes this module uses a part of it")]

use std::path::{Path, PathBuf};

use rocemesh_formats::gid::gid_bytes;
use rocemesh_formats::record::{Arrived, EndpointRole, Outcome, ProbeRecord, ServiceConn, TsSource};
use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity, seal};

/// Not window-aligned: the first window is partly empty.
pub const T0: u64 = 1_700_000_010_000_000_000 + 7_000_000_000;
/// Each agent's segments close after two minutes of records.
pub const SEGMENT_NS: u64 = 120_000_000_000;
pub const MINUTES: u64 = 16;
const RNICS: [(&str, &str); 4] =
    [("wa-h0/mlx5_0", "tor-a"), ("wa-h1/mlx5_0", "tor-a"), ("wb-h0/mlx5_0", "tor-b"), ("wb-h1/mlx5_0", "tor-b")];

/// xorshift64: reproducible test data without a dependency.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Every agent probes the other three twice a second; a few losses, partials, invalid, refused
/// and local drops everywhere, and wb-h1 -> wa-h0 dead for minutes 5 and 6. Returns each agent's sealed files, in order.
pub fn write_agents(dir: &Path) -> Vec<Vec<PathBuf>> {
    write_fleet(dir, false, 0)
}

/// The label `analyze report --scope service` gives [`write_agents_with_services`]' connection
/// from wa-h0 (its remote named by the agent).
pub const NAMED_SERVICE: &str = "ib_write_bw[4242] qp 17->18 wa-h0/mlx5_0->wb-h1/mlx5_0";
/// The address of the other connection's remote end, which nothing names (unresolved).
pub const UNKNOWN_REMOTE: &str = "10.9.9.9";

/// [`write_agents`]' fleet and records, where every 4th probe of wa-h0 and of wb-h0 (but the
/// self-probes) goes to a traced connection instead (kind 2, the connection's flow label):
/// wa-h0's to wb-h1, named by the agent ([`NAMED_SERVICE`]); wb-h0's to [`UNKNOWN_REMOTE`],
/// which no dictionary or inventory names, and dead for minutes 8 and 9 (its unreachable
/// windows). Outcomes and timestamp sources are drawn as for the mesh probes.
pub fn write_agents_with_services(dir: &Path) -> Vec<Vec<PathBuf>> {
    write_fleet(dir, true, 0)
}

/// [`write_agents_with_services`], the writers summarising windows of `summary_window_ns` as an
/// agent with `summary_window_s` set does.
pub fn write_agents_summarised(dir: &Path, summary_window_ns: u64) -> Vec<Vec<PathBuf>> {
    write_fleet(dir, true, summary_window_ns)
}

fn write_fleet(dir: &Path, services: bool, summary_window_ns: u64) -> Vec<Vec<PathBuf>> {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut out = Vec::new();
    for (me, (name, tor)) in RNICS.iter().enumerate() {
        let (host, device) = name.split_once('/').expect("host/device");
        let mut cfg = WriterConfig::new(dir.join(host));
        cfg.chunk_records = 64;
        cfg.max_age_ns = SEGMENT_NS;
        cfg.summary_window_ns = summary_window_ns;
        let id = WriterIdentity {
            host: host.into(),
            device: device.into(),
            tor: (*tor).into(),
            agent_epoch: 1,
            tool: "watch-test".into(),
        };
        let mut w = SegmentWriter::new(cfg, id).expect("writer");
        let ids: Vec<u32> = RNICS.iter().map(|(n, t)| w.endpoint(EndpointRole::Rnic, n, t, [0; 16])).collect();
        let conn = |pid: u32, local_qpn: u32, remote_qpn: u32, comm: &str, remote: &str| ServiceConn {
            pid,
            local_qpn,
            remote_qpn,
            flow_label: 0x1_0000 + pid,
            traffic_class: 106,
            comm: comm.into(),
            remote: remote.into(),
        };
        let service = match me {
            _ if !services => None,
            0 => {
                let c = conn(4242, 17, 18, "ib_write_bw", RNICS[3].0);
                Some((w.service_endpoint("svc wa-h0 qp 17", RNICS[3].1, gid_bytes([10, 0, 1, 2].into()), &c), c))
            }
            2 => {
                let c = conn(77, 40, 41, "all_reduce_perf", "");
                let addr = gid_bytes(UNKNOWN_REMOTE.parse().expect("ip"));
                Some((w.service_endpoint("svc wb-h0 qp 40", "", addr, &c), c))
            }
            _ => None,
        };
        let step_ns = 500_000_000 / 3;
        let mut seq = 0u64;
        let mut t1 = T0 + me as u64 * 7_000_000;
        while t1 < T0 + MINUTES * 60_000_000_000 {
            // Every 17th probe is a self-probe (counted once in its RNIC's and ToR's rows).
            let target = if seq.is_multiple_of(17) { me } else { (me + 1 + (seq % 3) as usize) % RNICS.len() };
            let minute = (t1 - T0) / 60_000_000_000;
            let traced = service.as_ref().filter(|_| seq % 4 == 2 && target != me);
            let dead = match traced {
                Some(_) => me == 2 && (8..10).contains(&minute),
                None => me == 3 && target == 0 && (5..7).contains(&minute),
            };
            let roll = rng.next() % 100;
            let (outcome, arrived) = match roll {
                _ if dead => (Outcome::Lost as u8, Arrived::PROBE_SENT),
                0..=1 => (Outcome::Lost as u8, Arrived::PROBE_SENT),
                2 => (Outcome::Lost as u8, Arrived::PROBE_SENT | Arrived::ACK1),
                3 => (Outcome::Invalid as u8, Arrived::ALL.0),
                4 => (Outcome::Refused as u8, Arrived::PROBE_SENT),
                5 => (Outcome::LocalDrop as u8, 0),
                _ => (Outcome::Ok as u8, Arrived::ALL.0),
            };
            let ok = outcome == Outcome::Ok as u8 || outcome == Outcome::Invalid as u8;
            let r = ProbeRecord {
                t1_unix_ns: t1,
                seq,
                network_rtt_ns: if ok { 2_000 + (rng.next() % 40_000) as i32 } else { 0 },
                prober_delay_ns: 500 + (rng.next() % 9_000) as i32,
                responder_delay_ns: 300 + (rng.next() % 4_000) as i32,
                prober: ids[me],
                target: traced.map_or(ids[target], |s| s.0),
                flow_label: traced.map_or(7, |s| s.1.flow_label),
                responder_epoch: 1,
                kind: if traced.is_some() { 2 } else { 0 },
                outcome,
                arrived,
                // wb-h0 polls for some of its timestamps: its rows pool two sources.
                ts_source: if me == 2 && seq.is_multiple_of(5) { TsSource::HostPoll } else { TsSource::KernelSoftware }
                    as u8,
            };
            w.append(&r).expect("append");
            seq += 1;
            t1 += step_ns;
        }
        let mut files: Vec<PathBuf> = w.finish().expect("finish").iter().map(|p| seal_closed(p, 3)).collect();
        files.sort();
        out.push(files);
    }
    out
}

/// One sealed file of `host/mlx5_0` under `dir/host/` holding one ok probe to wa-h0 at each
/// of `t1s`; returns it.
pub fn host_file(dir: &Path, host: &str, t1s: &[u64]) -> PathBuf {
    let mut cfg = WriterConfig::new(dir.join(host));
    cfg.chunk_records = 64;
    cfg.max_age_ns = u64::MAX / 2;
    let id = WriterIdentity {
        host: host.into(),
        device: "mlx5_0".into(),
        tor: "tor-z".into(),
        agent_epoch: 1,
        tool: "watch-test".into(),
    };
    let mut w = SegmentWriter::new(cfg, id).expect("writer");
    let me = w.endpoint(EndpointRole::Rnic, &format!("{host}/mlx5_0"), "tor-z", [0; 16]);
    let peer = w.endpoint(EndpointRole::Rnic, "wa-h0/mlx5_0", "tor-a", [0; 16]);
    for (seq, &t1) in t1s.iter().enumerate() {
        w.append(&ProbeRecord {
            t1_unix_ns: t1,
            seq: seq as u64,
            network_rtt_ns: 5_000,
            prober_delay_ns: 1_000,
            responder_delay_ns: 1_000,
            prober: me,
            target: peer,
            flow_label: 7,
            responder_epoch: 1,
            kind: 0,
            outcome: Outcome::Ok as u8,
            arrived: Arrived::ALL.0,
            ts_source: TsSource::KernelSoftware as u8,
        })
        .expect("append");
    }
    let files = w.finish().expect("finish");
    assert_eq!(files.len(), 1, "one segment");
    seal_closed(&files[0], 3)
}

/// Seals a segment its writer has closed; returns the sealed path. Another test of the binary
/// spawning a process at that moment holds a copy of the closed file's descriptor, and with it
/// the writer's lock, from its fork until its exec: seal then refuses the file as "still being
/// written", so that refusal is waited out (a second at most) rather than failing the test.
pub fn seal_closed(path: &Path, zstd_level: i32) -> PathBuf {
    for _ in 0..100 {
        match seal(path, zstd_level) {
            Ok(r) => return r.sealed_path,
            Err(rocemesh_formats::segment::SegmentError::Config(m)) if m.contains("still being written") => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("seal {}: {e}", path.display()),
        }
    }
    panic!("{}: still locked after a second", path.display())
}
