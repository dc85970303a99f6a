//! The probe protocol on the wire: one fixed 64-byte packet for the probe and both ACKs.
//!
//! A probe exchange is three packets (R-Pingmesh's six timestamps):
//! the prober sends PROBE (T1 posted, T2 sent); the responder receives it (T3) and answers ACK1
//! carrying T3; once ACK1's own send timestamp (T4) is known it sends ACK2 carrying T4. The
//! prober receives ACK1 (T5) and sees it in the application (T6). Two ACKs, because T4 exists
//! only after ACK1 has left.
//!
//! Every field is little-endian; the last four bytes are a crc32c of the first 60, so garbage
//! that happens to start with the magic is still refused. Decoding never panics.

/// Size of every packet.
pub const PACKET_BYTES: usize = 64;
const MAGIC: u32 = u32::from_le_bytes(*b"RMPB");
const VERSION: u8 = 1;

/// What a packet is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Prober → responder.
    Probe = 1,
    /// Responder → prober, carrying T3.
    Ack1 = 2,
    /// Responder → prober, carrying T4.
    Ack2 = 3,
}

/// Whether `packet`, one this agent encoded, is a probe (rather than an ACK).
pub fn is_probe(packet: &[u8; PACKET_BYTES]) -> bool {
    packet[5] == Kind::Probe as u8
}

/// A decoded packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// What it is.
    pub kind: Kind,
    /// The prober's sequence number (its epoch in the high 32 bits), echoed by the ACKs.
    pub seq: u64,
    /// The flow label the probe was sent with, echoed.
    pub flow_label: u32,
    /// The responder's epoch (0 in a probe).
    pub responder_epoch: u32,
    /// T3, responder receive time of the probe, ns (0 in a probe).
    pub t3_ns: u64,
    /// T4, responder send time of ACK1, ns, in ACK2. In ACK1 this field carries the responder's
    /// own token instead (it matches ACK1's send timestamp to the pending ACK2); probers ignore it.
    pub t4_ns: u64,
}

/// Why a datagram was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not 64 bytes.
    Length,
    /// Wrong magic: not ours at all.
    Magic,
    /// Our magic, another protocol version.
    Version,
    /// Unknown packet kind.
    Kind,
    /// Checksum mismatch: damaged or forged.
    Checksum,
}

impl Packet {
    /// Serialise into `out`.
    pub fn encode(&self, out: &mut [u8; PACKET_BYTES]) {
        out.fill(0);
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = VERSION;
        out[5] = self.kind as u8;
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..20].copy_from_slice(&self.flow_label.to_le_bytes());
        out[20..24].copy_from_slice(&self.responder_epoch.to_le_bytes());
        out[24..32].copy_from_slice(&self.t3_ns.to_le_bytes());
        out[32..40].copy_from_slice(&self.t4_ns.to_le_bytes());
        let crc = crc32c::crc32c(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
    }

    /// Parse a datagram.
    pub fn decode(b: &[u8]) -> Result<Packet, Refused> {
        if b.len() != PACKET_BYTES {
            return Err(Refused::Length);
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        if u32_at(0) != MAGIC {
            return Err(Refused::Magic);
        }
        if b[4] != VERSION {
            return Err(Refused::Version);
        }
        if crc32c::crc32c(&b[..60]) != u32_at(60) {
            return Err(Refused::Checksum);
        }
        let kind = match b[5] {
            1 => Kind::Probe,
            2 => Kind::Ack1,
            3 => Kind::Ack2,
            _ => return Err(Refused::Kind),
        };
        Ok(Packet {
            kind,
            seq: u64_at(8),
            flow_label: u32_at(16),
            responder_epoch: u32_at(20),
            t3_ns: u64_at(24),
            t4_ns: u64_at(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_single_bit_flip_is_refused() {
        let p = Packet {
            kind: Kind::Ack2,
            seq: 0xDEAD_BEEF_0000_0007,
            flow_label: 9,
            responder_epoch: 3,
            t3_ns: 11,
            t4_ns: 12,
        };
        let mut b = [0u8; PACKET_BYTES];
        p.encode(&mut b);
        assert_eq!(Packet::decode(&b), Ok(p));
        for byte in 0..PACKET_BYTES {
            for bit in 0..8 {
                let mut c = b;
                c[byte] ^= 1 << bit;
                assert!(Packet::decode(&c).is_err(), "flip of bit {bit} in byte {byte} accepted");
            }
        }
        assert_eq!(Packet::decode(&b[..63]), Err(Refused::Length));
        assert_eq!(Packet::decode(&[0u8; 64]), Err(Refused::Magic));
    }
}
