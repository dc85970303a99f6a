//! A realistic probe stream for benchmarks: what one shard of a healthy fabric writes.
//!
//! 31 ToR-mesh targets at 10 probes/s and 5 inter-ToR targets at 1 probe/s cycling 16 flow
//! labels (the rpingmesh caps, a 32-RNIC ToR), log-normal delays fitted to the scenario
//! defaults (network RTT p50 4 us / p99 12 us, prober delay 2/15 us, responder delay 1/6 us),
//! and a per-packet loss of 1e-5. Compression ratios measured on uniform random data would flatter
//! nobody; measured on constant data they would lie: this is the middle that a real agent sees.

use rocemesh_formats::record::{Arrived, Outcome, ProbeRecord, TsSource};

const TOR_MESH_TARGETS: u32 = 31;
const INTER_TOR_TARGETS: u32 = 5;
const FLOW_LABELS: u32 = 16;
/// Probes per second of the shard: 31 × 10 + 5 × 1.
const PROBES_PER_S: u64 = (TOR_MESH_TARGETS as u64) * 10 + INTER_TOR_TARGETS as u64;

/// Deterministic generator of [`ProbeRecord`]s.
#[derive(Debug, Clone)]
pub struct ShardStream {
    rng: u64,
    i: u64,
    start_unix_ns: u64,
    epoch: u64,
    flow_cursor: [u32; INTER_TOR_TARGETS as usize],
}

impl ShardStream {
    /// A stream starting at `start_unix_ns`; `seed` picks the epoch and the noise.
    pub fn new(seed: u64, start_unix_ns: u64) -> Self {
        let mut s = Self { rng: seed | 1, i: 0, start_unix_ns, epoch: 0, flow_cursor: [0; INTER_TOR_TARGETS as usize] };
        s.epoch = s.next_u64() & 0xFFFF_FFFF;
        s
    }

    fn next_u64(&mut self) -> u64 {
        // xorshift64*: fast, deterministic, good enough for noise.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn lognormal(&mut self, p50: f64, p99: f64) -> f64 {
        let sigma = (p99 / p50).ln() / 2.326_348;
        let z = (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos();
        p50 * (sigma * z).exp()
    }

    /// The next probe.
    pub fn next_record(&mut self) -> ProbeRecord {
        let i = self.i;
        self.i += 1;
        let second = i / PROBES_PER_S;
        let slot = i % PROBES_PER_S;
        // Inter-ToR probes are spread over the second: slot 62, 125, ... of every 63.
        let (kind, target, flow_label) = if slot % 63 == 62 {
            let t = (slot / 63) as usize;
            let fl = 1 + self.flow_cursor[t];
            self.flow_cursor[t] = (self.flow_cursor[t] + 1) % FLOW_LABELS;
            (1u8, 1 + TOR_MESH_TARGETS + t as u32, 0x1000 + fl)
        } else {
            (0u8, 1 + ((slot - slot / 63) as u32 % TOR_MESH_TARGETS), 0x10)
        };
        let jitter_ns = self.next_u64() % 4_000;
        let t1 = self.start_unix_ns + second * 1_000_000_000 + slot * (1_000_000_000 / PROBES_PER_S) + jitter_ns;
        // Three packets at 1e-5 each.
        let lost = self.uniform() < 3e-5;
        let mut r = ProbeRecord {
            t1_unix_ns: t1,
            seq: (self.epoch << 32) | (i & 0xFFFF_FFFF),
            prober: 0,
            target,
            flow_label,
            responder_epoch: 0x5EED_0000 | target,
            kind,
            ts_source: TsSource::Nic as u8,
            ..ProbeRecord::default()
        };
        if lost {
            r.outcome = Outcome::Lost as u8;
            r.arrived = Arrived::PROBE_SENT;
            r.responder_epoch = 0;
        } else {
            r.outcome = Outcome::Ok as u8;
            r.arrived = Arrived::ALL.0;
            r.network_rtt_ns = self.lognormal(4_000.0, 12_000.0) as i32;
            r.prober_delay_ns = self.lognormal(2_000.0, 15_000.0) as i32;
            r.responder_delay_ns = self.lognormal(1_000.0, 6_000.0) as i32;
        }
        r
    }

    /// `n` records.
    pub fn take_vec(&mut self, n: usize) -> Vec<ProbeRecord> {
        (0..n).map(|_| self.next_record()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_has_the_advertised_shape() {
        let v = ShardStream::new(7, 1_700_000_000_000_000_000).take_vec(PROBES_PER_S as usize * 100);
        let inter = v.iter().filter(|r| r.kind == 1).count();
        assert_eq!(inter, 500, "5 inter-ToR probes per second");
        assert!(v.windows(2).all(|w| w[0].t1_unix_ns < w[1].t1_unix_ns), "time-ordered");
        let mut rtts: Vec<i32> = v.iter().filter(|r| r.outcome == 0).map(|r| r.network_rtt_ns).collect();
        rtts.sort_unstable();
        let p50 = rtts[rtts.len() / 2];
        let p99 = rtts[rtts.len() * 99 / 100];
        assert!((3_700..4_300).contains(&p50), "p50 {p50}");
        assert!((10_500..13_500).contains(&p99), "p99 {p99}");
        let labels: std::collections::HashSet<u32> =
            v.iter().filter(|r| r.target == 32).map(|r| r.flow_label).collect();
        assert_eq!(labels.len(), 16);
    }
}
