//! `bench auth`: what probe authentication costs per packet, in process, against the
//! unauthenticated packet path in the same run.
//!
//! Baseline: encode a version-1 packet (crc32c) and parse it back. Authenticated: seal a
//! version-2 packet (keyed BLAKE3), parse it, and admit it (key lookup, MAC check, window, replay
//! table at its default size). A probe is three packets, each sealed by one agent and admitted
//! by the other, so 3 x the difference is the added CPU per probe.

use std::hint::black_box;
use std::time::Instant;

use rocemesh_agent::auth::{Auth, AuthParams};
use rocemesh_agent::protocol::{Binding, Kind, PACKET_BYTES, Packet};
use rocemesh_formats::keys::FleetKeys;

use crate::agent::Figure;

fn probe(seq: u64) -> Packet {
    Packet { kind: Kind::Probe, seq, flow_label: 3, responder_epoch: 0, t3_ns: 0, t4_ns: 0 }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Rounds of each; the median is reported (a round is tens of ms, so a preemption moves one).
const ROUNDS: usize = 15;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Time `packets` packets each way, [`ROUNDS`] times; median ns per packet.
pub fn run(packets: u64) -> anyhow::Result<Vec<Figure>> {
    let mut b = [0u8; PACKET_BYTES];
    let mut keys = FleetKeys::new();
    keys.rotate(0, 0, [0x3c; 32]).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (mut plain, mut keyed) = (Vec::new(), Vec::new());
    let mut refused = 0u64;
    let to = Binding::of_socket(std::net::SocketAddr::from(([10, 0, 0, 1], 18515)));
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for seq in 0..packets {
            probe(seq).encode(&mut b);
            black_box(Packet::parse(black_box(&b)).map_err(|e| anyhow::anyhow!("{e:?}"))?);
        }
        plain.push(start.elapsed().as_nanos() as f64 / packets as f64);

        // Window and table as a default agent has them (a fresh table per round: the same
        // sequence numbers again would be replays); the clock read once per 1,024 packets, as a
        // shard reads it once per batch.
        let mut sealer = Auth::new(AuthParams { window_ns: 2_000_000_000, replay_slots: 131_072 });
        let mut admitter = Auth::new(AuthParams { window_ns: 2_000_000_000, replay_slots: 131_072 });
        let mut now = now_ns();
        sealer.set_keys(&keys, now);
        admitter.set_keys(&keys, now);
        let start = Instant::now();
        for seq in 0..packets {
            if seq % 1024 == 0 {
                now = now_ns();
            }
            sealer.encode(&probe(seq), &mut b, now, &to);
            let (_, seal) = Packet::parse(black_box(&b)).map_err(|e| anyhow::anyhow!("{e:?}"))?;
            refused += u64::from(admitter.admit(&b, seal, now, &to).is_err());
        }
        keyed.push(start.elapsed().as_nanos() as f64 / packets as f64);
    }
    let (plain_ns, keyed_ns) = (median(&mut plain), median(&mut keyed));
    // More packets than the table holds within one window would be refused as table-full;
    // the run is sized so that none are.
    anyhow::ensure!(refused == 0, "{refused} of {packets} packets refused: the replay table is too small for the run");
    Ok(vec![
        Figure {
            what: "unauthenticated packet: encode (crc32c) + parse".into(),
            value: plain_ns,
            unit: "ns",
            note: format!("baseline, median of {ROUNDS} rounds of {packets} packets"),
        },
        Figure {
            what: "authenticated packet: seal (keyed BLAKE3) + parse + admit (MAC, window, replay table)".into(),
            value: keyed_ns,
            unit: "ns",
            note: format!(
                "{:.1}x the baseline; a probe is 3 packets each way: +{:.2} us of CPU per probe",
                keyed_ns / plain_ns,
                3.0 * (keyed_ns - plain_ns) / 1e3
            ),
        },
    ])
}
