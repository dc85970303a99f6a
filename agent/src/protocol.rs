//! The probe protocol on the wire: one fixed 64-byte packet for the probe and both ACKs.
//!
//! A probe exchange is three packets (R-Pingmesh's six timestamps):
//! the prober sends PROBE (T1 posted, T2 sent); the responder receives it (T3) and answers ACK1
//! carrying T3; once ACK1's own send timestamp (T4) is known it sends ACK2 carrying T4. The
//! prober receives ACK1 (T5) and sees it in the application (T6). Two ACKs, because T4 exists
//! only after ACK1 has left.
//!
//! Every field is little-endian. Two versions share the layout of the first 40 bytes:
//!
//! - version 1 (unauthenticated): the last four bytes are a crc32c of the first 60, so garbage
//!   that happens to start with the magic is still refused;
//! - version 6 (authenticated, when the fleet has a key, [`crate::auth`]): byte 6 names the key,
//!   bytes 40..48 carry the sender's clock when it sealed the packet (the replay window's
//!   reference), and bytes 48..64 a MAC: the first 16 bytes of keyed BLAKE3 over bytes 0..48
//!   and the receiver's [`Binding`] (its address and port as the sender names them; 64 bytes,
//!   one BLAKE3 block). The MAC replaces the checksum; it catches damage as well as forgery,
//!   and a packet captured on its way to one receiver fails it at every other, so a replay
//!   cannot fill other receivers' replay tables. Version 2 (the same without the binding, an
//!   earlier release's) is parsed but never admitted: a peer keyed otherwise.
//!
//! A fourth kind, REFUSAL, is always version 1: a responder that refuses a probe for its
//! authentication alone (unsealed while it seals, or sealed with a key it does not hold: a key
//! roll-out that missed a host) says so, so that the prober records the probe as refused by
//! authentication rather than as network loss ([`crate::auth`]).
//!
//! Decoding never panics.

/// Size of every packet.
pub const PACKET_BYTES: usize = 64;
const MAGIC: u32 = u32::from_le_bytes(*b"RMPB");
const VERSION_PLAIN: u8 = 1;
/// The bound MAC's version: 6, not 3, which one flipped bit of a plain packet's 1 reaches (6
/// is three bits from it), so damage to a plain packet never passes its structure as keyed.
const VERSION_KEYED: u8 = 6;
/// The earlier releases' keyed version: the same, without the receiver in the MAC. Parsed so
/// that an upgrade under way reads as keyed otherwise ([`crate::auth`]), never admitted.
const VERSION_KEYED_OLD: u8 = 2;
/// Bytes a MAC covers: everything before it.
const MAC_COVERS: usize = 48;
/// Bytes of the MAC (a 128-bit tag).
pub const MAC_BYTES: usize = 16;

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
    /// Responder → prober: the probe was refused for its authentication alone (version 1).
    Refusal = 4,
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

/// The authentication a version-2 packet carries; checked by [`crate::auth::Auth::admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seal {
    /// Which fleet key made the MAC.
    pub key_id: u8,
    /// The sender's CLOCK_REALTIME when it sealed the packet, ns.
    pub sent_unix_ns: u64,
    /// The tag.
    pub mac: [u8; MAC_BYTES],
    /// Version 2 (an earlier release's, no receiver in its MAC): never admitted.
    pub old: bool,
}

/// What a sealed packet binds into its MAC besides its bytes: the receiving end's address and
/// port as the sender names them. An IPv4 (or IPv4-mapped GID) end is its 16-byte mapped
/// address with the port in bytes 0..4 (zero in a mapped address) and `tag` in byte 4, so
/// distinct ends bind distinct values; a native IPv6 end has them XORed into its first five
/// bytes, which two ends of one fleet share unless their prefixes differ by exactly that.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Binding(pub [u8; 16]);

impl Binding {
    /// The end at `addr` (16 bytes: IPv6, IPv4-mapped or a GID), `port` (a UDP port, an RDMA CM
    /// service port or a QPN), `tag` telling those apart where one end has several.
    pub fn new(addr: [u8; 16], port: u32, tag: u8) -> Self {
        let mut b = addr;
        for (x, y) in b[..4].iter_mut().zip(port.to_le_bytes()) {
            *x ^= y;
        }
        b[4] ^= tag;
        Binding(b)
    }

    /// A UDP socket's end.
    pub fn of_socket(addr: std::net::SocketAddr) -> Self {
        let ip = match addr.ip() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            std::net::IpAddr::V6(v6) => v6,
        };
        Binding::new(ip.octets(), u32::from(addr.port()), 0)
    }
}

/// A fleet key, ready to seal and check packets.
#[derive(Clone)]
pub struct MacKey {
    /// The id carried in byte 6.
    pub id: u8,
    secret: [u8; 32],
}

impl std::fmt::Debug for MacKey {
    // Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MacKey({})", self.id)
    }
}

impl MacKey {
    /// The key `id` with `secret`.
    pub fn new(id: u8, secret: [u8; 32]) -> Self {
        MacKey { id, secret }
    }

    /// The secret, for what else the fleet key seals (live pushes).
    pub(crate) fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// The tag of a packet's authenticated bytes sent to `to`.
    fn tag(&self, covered: &[u8], to: &Binding) -> [u8; MAC_BYTES] {
        let mut h = blake3::Hasher::new_keyed(&self.secret);
        h.update(covered);
        h.update(&to.0);
        let full = h.finalize();
        let mut t = [0u8; MAC_BYTES];
        t.copy_from_slice(&full.as_bytes()[..MAC_BYTES]);
        t
    }

    /// Whether `b` (a version-6 packet) carries this key's MAC for a packet sent to `me`.
    /// Compared without an early exit, so the time taken does not tell a forger how many bytes
    /// were right.
    pub fn verify(&self, b: &[u8; PACKET_BYTES], me: &Binding) -> bool {
        let want = self.tag(&b[..MAC_COVERS], me);
        want.iter().zip(&b[MAC_COVERS..]).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl Packet {
    fn write_fields(&self, out: &mut [u8; PACKET_BYTES], version: u8) {
        out.fill(0);
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = version;
        out[5] = self.kind as u8;
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..20].copy_from_slice(&self.flow_label.to_le_bytes());
        out[20..24].copy_from_slice(&self.responder_epoch.to_le_bytes());
        out[24..32].copy_from_slice(&self.t3_ns.to_le_bytes());
        out[32..40].copy_from_slice(&self.t4_ns.to_le_bytes());
    }

    /// Serialise into `out`, unauthenticated (version 1).
    pub fn encode(&self, out: &mut [u8; PACKET_BYTES]) {
        self.write_fields(out, VERSION_PLAIN);
        let crc = crc32c::crc32c(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
    }

    /// Serialise into `out`, authenticated with `key` (version 6) for the end `to`;
    /// `sent_unix_ns` is this host's clock now.
    pub fn seal(&self, out: &mut [u8; PACKET_BYTES], key: &MacKey, sent_unix_ns: u64, to: &Binding) {
        self.write_fields(out, VERSION_KEYED);
        out[6] = key.id;
        out[40..48].copy_from_slice(&sent_unix_ns.to_le_bytes());
        let tag = key.tag(&out[..MAC_COVERS], to);
        out[MAC_COVERS..].copy_from_slice(&tag);
    }

    /// Parse a datagram's structure, either version. A version-2 packet's MAC is NOT checked
    /// here: that is [`crate::auth::Auth::admit`]'s work, with the returned [`Seal`]; a packet
    /// from the network is admitted by it before anything acts on it.
    pub fn parse(b: &[u8]) -> Result<(Packet, Option<Seal>), Refused> {
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
        let seal = match b[4] {
            VERSION_PLAIN => {
                if crc32c::crc32c(&b[..60]) != u32_at(60) {
                    return Err(Refused::Checksum);
                }
                None
            }
            VERSION_KEYED | VERSION_KEYED_OLD => {
                let mut mac = [0u8; MAC_BYTES];
                mac.copy_from_slice(&b[MAC_COVERS..]);
                Some(Seal { key_id: b[6], sent_unix_ns: u64_at(40), mac, old: b[4] == VERSION_KEYED_OLD })
            }
            _ => return Err(Refused::Version),
        };
        let kind = match b[5] {
            1 => Kind::Probe,
            2 => Kind::Ack1,
            3 => Kind::Ack2,
            4 if seal.is_none() => Kind::Refusal,
            _ => return Err(Refused::Kind),
        };
        let p = Packet {
            kind,
            seq: u64_at(8),
            flow_label: u32_at(16),
            responder_epoch: u32_at(20),
            t3_ns: u64_at(24),
            t4_ns: u64_at(32),
        };
        Ok((p, seal))
    }

    /// [`Packet::parse`] without the seal: for packets this agent encoded itself (the
    /// transport's send echoes) and tests. Never for a packet from the network.
    pub fn decode(b: &[u8]) -> Result<Packet, Refused> {
        Self::parse(b).map(|(p, _)| p)
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

    #[test]
    fn a_sealed_packet_verifies_with_its_key_only_and_every_bit_flip_breaks_it() {
        let p = Packet { kind: Kind::Probe, seq: 42, flow_label: 7, responder_epoch: 0, t3_ns: 0, t4_ns: 0 };
        let key = MacKey::new(9, [0x5a; 32]);
        let to = Binding::of_socket("10.0.0.1:18515".parse().expect("addr"));
        let mut b = [0u8; PACKET_BYTES];
        p.seal(&mut b, &key, 1_000, &to);
        let (q, seal) = Packet::parse(&b).expect("structure");
        assert_eq!(q, p);
        let seal = seal.expect("version 6 carries a seal");
        assert_eq!((seal.key_id, seal.sent_unix_ns), (9, 1_000));
        assert!(key.verify(&b, &to));
        assert!(!MacKey::new(9, [0x5b; 32]).verify(&b, &to), "another secret");
        for byte in 0..PACKET_BYTES {
            for bit in 0..8 {
                let mut c = b;
                c[byte] ^= 1 << bit;
                // A flip either breaks the structure or the MAC; never both pass.
                assert!(
                    Packet::parse(&c).is_err() || !key.verify(&c, &to),
                    "flip of bit {bit} in byte {byte} accepted"
                );
            }
        }
    }

    /// Issue 33, item 8: a sealed packet verifies only at the end it was sent to: another
    /// address, another port of the same address, or the same GID's other QPN all refuse it.
    #[test]
    fn a_sealed_packet_verifies_only_at_the_end_it_was_sent_to() {
        let p = Packet { kind: Kind::Probe, seq: 42, flow_label: 7, responder_epoch: 0, t3_ns: 0, t4_ns: 0 };
        let key = MacKey::new(9, [0x5a; 32]);
        let end = |a: &str| Binding::of_socket(a.parse().expect("addr"));
        let mut b = [0u8; PACKET_BYTES];
        p.seal(&mut b, &key, 1_000, &end("10.0.0.1:18515"));
        assert!(key.verify(&b, &end("10.0.0.1:18515")));
        for other in ["10.0.0.2:18515", "10.0.0.1:18516", "[::ffff:10.0.0.1]:18516", "[fe80::1]:18515"] {
            assert!(!key.verify(&b, &end(other)), "{other}");
        }
        let gid = end("10.0.0.1:0").0;
        p.seal(&mut b, &key, 1_000, &Binding::new(gid, 4711, 2));
        assert!(key.verify(&b, &Binding::new(gid, 4711, 2)));
        assert!(!key.verify(&b, &Binding::new(gid, 4712, 2)), "another QPN");
        assert!(!key.verify(&b, &Binding::new(gid, 4711, 1)), "a service port of the same number");
        // Version 2 (an earlier release's, no binding) parses, marked old, and never verifies.
        b[4] = 2;
        let (_, seal) = Packet::parse(&b).expect("structure");
        assert!(seal.expect("sealed").old);
        b[4] = 3;
        assert_eq!(Packet::parse(&b), Err(Refused::Version));
    }

    #[test]
    fn a_refusal_is_plain_only() {
        let r = Packet { kind: Kind::Refusal, seq: 42, flow_label: 7, responder_epoch: 3, t3_ns: 0, t4_ns: 0 };
        let mut b = [0u8; PACKET_BYTES];
        r.encode(&mut b);
        assert_eq!(Packet::parse(&b), Ok((r, None)));
        r.seal(&mut b, &MacKey::new(1, [1; 32]), 5, &Binding::default());
        assert_eq!(Packet::parse(&b), Err(Refused::Kind), "a sealed refusal is no packet of ours");
    }
}
