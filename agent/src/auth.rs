//! Probe authentication: which packets a shard seals, and which it lets through.
//!
//! Without a key file (`[auth]` unset) every packet is version 1 and nothing is checked beyond
//! the checksum. With one ([`rocemesh_formats::keys`]), a shard seals every probe and ACK with
//! the key in force ([`FleetKeys::send_key`]) and admits a packet only if
//! 1. it is sealed (version 1 is refused once this shard itself sends sealed packets; until then,
//!    during a roll-out, both are taken),
//! 2. its key id names a key of the file that is still accepted,
//! 3. its MAC verifies,
//! 4. the sender's clock in it is within `window` of ours, and
//! 5. it was not admitted before: the first 8 bytes of every admitted MAC are kept in a table
//!    until the packet would be stale anyway.
//!
//! A refused packet is counted by reason. A forged, damaged, stale or replayed one is not
//! answered, and an ACK is not matched to a probe. A packet refused for its authentication
//! alone (unsealed while this shard seals, sealed with a key it does not hold, or sealed by an
//! agent of an earlier release: the sign of a key roll-out that missed a host, of a host
//! holding an old file, or of an upgrade under way) is a peer that is alive
//! but keyed differently, which must never read as network loss: a refused probe is answered
//! with a REFUSAL (version 1, at most [`REFUSALS_PER_S`] a second, so the shard is no
//! reflector), and a probe whose ACK or REFUSAL came back so, with no admitted ACK1, is recorded
//! `auth_refused` (`Outcome::AuthRefused`, classed `refused`: neither loss nor evidence). A
//! forger can turn a lost probe into a refused one that way, never into an answered one, and
//! only for a target that has not answered the prober within a probe timeout (a keying
//! difference refuses every probe of the pair); the refusals are counted, by reason, on both
//! sides. A REFUSAL goes only where the transport needs no new state to send it (verbs: an
//! address handle for the sender's address and label exists), since the sender chooses both.
//!
//! Roll-out of the first key: every key in a file is accepted from the moment it arrives, and a
//! shard keeps taking unsealed packets until it sends sealed ones itself (the key's
//! `send_from_unix_s`, `ctl keys rotate --grace-s` after the rotation), so a push that reaches
//! every host within the grace changes nothing on the wire but the seals. The replay table is allocated when keys are first loaded
//! (sized from the config) and never grows: a lookup scans a fixed neighbourhood of
//! [`NEIGHBOURHOOD`] slots, so admitting costs the same whatever arrives. Forged packets never
//! enter it (they fail the MAC first), so only the fleet's own traffic can fill it. Each tag has
//! two candidate buckets of 8 slots (two independent parts of the MAC) and goes into the emptier
//! one: with linear probing over 16 slots, 1.5e-4 of packets found their neighbourhood full at
//! half load (`bench auth`); with two choices, none did. A full pair of buckets refuses the
//! packet (`replay_table_full`) rather than risk answering a replay, and is logged with the
//! setting to raise.

use rocemesh_formats::keys::{FleetKeys, MAX_KEYS};

use crate::protocol::{Binding, MacKey, PACKET_BYTES, Packet, Seal};

/// Why an authenticated shard refused a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthRefusal {
    /// Version 1 (no MAC) while this shard sends sealed packets.
    Unauthenticated,
    /// The key id is not in the key file, or that key is no longer accepted (an old key past
    /// its grace, a wrong fleet, a forger's guess).
    UnknownKey,
    /// The MAC does not verify: forged, damaged, or made with another secret under the same id.
    BadMac,
    /// The sender's clock in the packet is further than the window from ours: a replay of an
    /// old packet, or a host whose clock is off.
    Stale,
    /// Admitted before: a replay within the window.
    Replay,
    /// The replay table has no free slot where this packet's tag goes: refused unchecked.
    ReplayTableFull,
    /// Sealed by an agent of an earlier release (version 2: its MAC binds no receiver): keyed
    /// otherwise, as a peer without this key is; upgrade it.
    OldVersion,
}

impl AuthRefusal {
    /// Number of reasons.
    pub const COUNT: usize = 7;
    /// Names, indexed by [`AuthRefusal::index`], as logs and `/metrics` show them.
    pub const NAMES: [&'static str; Self::COUNT] =
        ["unauthenticated", "unknown_key", "bad_mac", "stale", "replay", "replay_table_full", "old_version"];

    /// Dense index for counters.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// REFUSALs a shard sends at most per second (and in a burst): a roll-out that missed a host
/// sees its probes refused at their rate (tens a second per peer), while a forger spraying
/// unsealed probes with another's source address gets 64-byte answers at this rate at most.
pub const REFUSALS_PER_S: u32 = 1_000;

/// Slots of one bucket of the replay table; a lookup scans two buckets.
pub const BUCKET: usize = 8;
/// Slots one lookup of the replay table scans.
pub const NEIGHBOURHOOD: usize = 2 * BUCKET;

/// What the configuration says (`[auth]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthParams {
    /// Packets whose sender's clock is further than this from ours are refused as stale, ns.
    pub window_ns: u64,
    /// Slots of the replay table (rounded up to a power of two).
    pub replay_slots: usize,
}

#[derive(Clone, Debug)]
struct Slot {
    key: MacKey,
    send_from_ns: u64,
    accept_until_ns: u64,
}

/// A shard's authentication state.
#[derive(Debug)]
pub struct Auth {
    params: AuthParams,
    keys: Vec<Slot>,
    /// Index into `keys` of the key packets are sealed with; `None`: send version 1.
    send: Option<usize>,
    /// When `send` or the accepted set changes next (a key's time comes or goes), ns.
    next_change_ns: u64,
    /// The replay table: a tag (0 = empty) and when its packet goes stale, ns. Empty until
    /// keys are loaded.
    tags: Box<[u64]>,
    expiry_ns: Box<[u64]>,
    /// Packets refused, per [`AuthRefusal::index`].
    pub refused: [u64; AuthRefusal::COUNT],
    /// REFUSALs sent.
    pub refusals_sent: u64,
    /// REFUSALs held back: by [`REFUSALS_PER_S`], or where the transport would have had to
    /// create state to send them (the shard counts those here too).
    pub refusals_held: u64,
    /// The REFUSAL budget left, and when it was last refilled (ns).
    refusal_tokens: u32,
    refusal_refill_ns: u64,
    /// Whether a full replay neighbourhood was logged (once per shard).
    full_logged: bool,
}

impl Auth {
    /// No keys: version 1 only.
    pub fn new(params: AuthParams) -> Self {
        Auth {
            params,
            keys: Vec::with_capacity(MAX_KEYS),
            send: None,
            next_change_ns: u64::MAX,
            tags: Box::new([]),
            expiry_ns: Box::new([]),
            refused: [0; AuthRefusal::COUNT],
            refusals_sent: 0,
            refusals_held: 0,
            refusal_tokens: REFUSALS_PER_S,
            refusal_refill_ns: 0,
            full_logged: false,
        }
    }

    /// Take the keys of a (re)loaded key file. The replay table is allocated the first time
    /// and kept across reloads, so a rotation does not forget what was admitted.
    pub fn set_keys(&mut self, file: &FleetKeys, now_ns: u64) {
        self.keys.clear();
        for k in file.keys.iter().take(MAX_KEYS) {
            // A file that `FleetKeys::parse` accepted has valid secrets; one built otherwise may not.
            let Some(secret) = k.secret_bytes() else {
                tracing::error!(id = k.id, "fleet key skipped: its secret is not 64 hex digits");
                continue;
            };
            self.keys.push(Slot {
                key: MacKey::new(k.id, secret),
                send_from_ns: k.send_from_unix_s.saturating_mul(1_000_000_000),
                accept_until_ns: k.accept_until_unix_s.map_or(u64::MAX, |u| u.saturating_mul(1_000_000_000)),
            });
        }
        if self.tags.is_empty() && !self.keys.is_empty() {
            let slots = self.params.replay_slots.max(NEIGHBOURHOOD).next_power_of_two();
            self.tags = vec![0; slots].into_boxed_slice();
            self.expiry_ns = vec![0; slots].into_boxed_slice();
        }
        self.next_change_ns = 0;
        self.refresh(now_ns);
    }

    /// Re-evaluate which key is sent and which are accepted, when a key's time has come or
    /// gone; once per shard round (a compare, unless something changed).
    pub fn refresh(&mut self, now_ns: u64) {
        if now_ns < self.next_change_ns {
            return;
        }
        let mut next = u64::MAX;
        self.send = None;
        for (i, s) in self.keys.iter().enumerate() {
            for t in [s.send_from_ns, s.accept_until_ns] {
                if t > now_ns {
                    next = next.min(t);
                }
            }
            let usable = s.send_from_ns <= now_ns && now_ns < s.accept_until_ns;
            if usable
                && self
                    .send
                    .is_none_or(|j| (self.keys[j].send_from_ns, self.keys[j].key.id) < (s.send_from_ns, s.key.id))
            {
                self.send = Some(i);
            }
        }
        self.next_change_ns = next;
    }

    /// The id of the key packets are sealed with now (`None`: version 1).
    pub fn send_key_id(&self) -> Option<u8> {
        self.send.map(|i| self.keys[i].key.id)
    }

    /// The key in force as a live push's seal ([`crate::push`]); `None`: pushes go unsealed.
    pub fn send_seal(&self) -> Option<rocemesh_formats::live::Seal> {
        self.send.map(|i| {
            let k = &self.keys[i].key;
            rocemesh_formats::live::Seal { id: k.id, secret: *k.secret() }
        })
    }

    /// Serialise `p` into `out` for the end `to`: sealed with the key in force, or version 1
    /// without one.
    pub fn encode(&self, p: &Packet, out: &mut [u8; PACKET_BYTES], now_ns: u64, to: &Binding) {
        match self.send {
            Some(i) => p.seal(out, &self.keys[i].key, now_ns, to),
            None => p.encode(out),
        }
    }

    /// Whether a packet refused for `why` is refused for its authentication alone: a peer that
    /// is alive but keyed differently (module documentation).
    pub fn keyed_differently(why: AuthRefusal) -> bool {
        matches!(why, AuthRefusal::Unauthenticated | AuthRefusal::UnknownKey | AuthRefusal::OldVersion)
    }

    /// Whether a REFUSAL may be sent now ([`REFUSALS_PER_S`]); counts it either way.
    pub fn take_refusal(&mut self, now_ns: u64) -> bool {
        let elapsed_ns = now_ns.saturating_sub(self.refusal_refill_ns);
        let earned = elapsed_ns.saturating_mul(u64::from(REFUSALS_PER_S)) / 1_000_000_000;
        if earned > 0 {
            self.refusal_tokens = (u64::from(self.refusal_tokens) + earned).min(u64::from(REFUSALS_PER_S)) as u32;
            self.refusal_refill_ns = now_ns;
        }
        if self.refusal_tokens == 0 {
            self.refusals_held += 1;
            return false;
        }
        self.refusal_tokens -= 1;
        self.refusals_sent += 1;
        true
    }

    /// Whether the packet `bytes` (which [`Packet::parse`] accepted, giving `seal`), received
    /// at the end `me`, may be acted on. Refusals are counted in [`Auth::refused`].
    pub fn admit(&mut self, bytes: &[u8], seal: Option<Seal>, now_ns: u64, me: &Binding) -> Result<(), AuthRefusal> {
        let r = self.check(bytes, seal, now_ns, me);
        if let Err(why) = r {
            self.refused[why.index()] += 1;
            if why == AuthRefusal::ReplayTableFull && !self.full_logged {
                self.full_logged = true;
                tracing::error!(
                    slots = self.tags.len(),
                    "the replay table is full where a packet's tag goes: packets are refused unchecked \
                     (raise `[auth] replay_slots` to at least 2 x packets received per second x window, \
                     or lower `[auth] window_ms`)"
                );
            }
        }
        r
    }

    fn check(&mut self, bytes: &[u8], seal: Option<Seal>, now_ns: u64, me: &Binding) -> Result<(), AuthRefusal> {
        let Some(seal) = seal else {
            return if self.send.is_some() { Err(AuthRefusal::Unauthenticated) } else { Ok(()) };
        };
        if seal.old {
            return Err(AuthRefusal::OldVersion);
        }
        let key = self
            .keys
            .iter()
            .find(|s| s.key.id == seal.key_id && now_ns < s.accept_until_ns)
            .ok_or(AuthRefusal::UnknownKey)?;
        let Ok(b) = <&[u8; PACKET_BYTES]>::try_from(bytes) else { return Err(AuthRefusal::BadMac) };
        if !key.key.verify(b, me) {
            return Err(AuthRefusal::BadMac);
        }
        if seal.sent_unix_ns.abs_diff(now_ns) > self.params.window_ns {
            return Err(AuthRefusal::Stale);
        }
        self.remember(&seal, now_ns)
    }

    /// The replay table: refuse a tag already there, else store it until its packet is stale.
    fn remember(&mut self, seal: &Seal, now_ns: u64) -> Result<(), AuthRefusal> {
        let part = |o: usize| {
            let mut t = [0u8; 8];
            t.copy_from_slice(&seal.mac[o..o + 8]);
            u64::from_le_bytes(t)
        };
        // A MAC is uniformly random to anyone without the key, so its bytes are the hashes: the
        // first 8 are the tag (0 marks an empty slot), the next 8 choose the two buckets.
        let tag = part(0).max(1);
        let choice = part(8);
        let buckets = self.tags.len() / BUCKET;
        let pick = [(choice as usize) % buckets, ((choice >> 32) as usize) % buckets];
        let mut free = [None; 2];
        let mut free_count = [0usize; 2];
        for (k, &b) in pick.iter().enumerate() {
            for i in b * BUCKET..(b + 1) * BUCKET {
                let live = self.tags[i] != 0 && self.expiry_ns[i] > now_ns;
                if live && self.tags[i] == tag {
                    return Err(AuthRefusal::Replay);
                }
                if !live {
                    free_count[k] += 1;
                    free[k].get_or_insert(i);
                }
            }
        }
        let k = usize::from(free_count[1] > free_count[0]);
        let i = free[k].ok_or(AuthRefusal::ReplayTableFull)?;
        self.tags[i] = tag;
        self.expiry_ns[i] = seal.sent_unix_ns.saturating_add(self.params.window_ns);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Kind;

    const S: u64 = 1_000_000_000;
    /// The end every test packet is sent to.
    const ME: Binding = Binding([7; 16]);

    fn params() -> AuthParams {
        AuthParams { window_ns: 2 * S, replay_slots: 1024 }
    }

    fn file(keys: &[(u8, u8, u64, Option<u64>)]) -> FleetKeys {
        let mut f = FleetKeys::new();
        for &(id, fill, from, until) in keys {
            let mut k = rocemesh_formats::keys::FleetKey::new(id, [fill; 32], from);
            k.accept_until_unix_s = until;
            f.keys.push(k);
        }
        f
    }

    fn probe(seq: u64) -> Packet {
        Packet { kind: Kind::Probe, seq, flow_label: 1, responder_epoch: 0, t3_ns: 0, t4_ns: 0 }
    }

    fn admit(a: &mut Auth, b: &[u8; PACKET_BYTES], now: u64) -> Result<(), AuthRefusal> {
        let (_, seal) = Packet::parse(b).expect("structure");
        a.admit(b, seal, now, &ME)
    }

    #[test]
    fn without_keys_only_plain_packets_pass() {
        let mut a = Auth::new(params());
        let mut b = [0u8; PACKET_BYTES];
        a.encode(&probe(1), &mut b, 10 * S, &ME);
        assert_eq!(admit(&mut a, &b, 10 * S), Ok(()));
        probe(1).seal(&mut b, &MacKey::new(1, [1; 32]), 10 * S, &ME);
        assert_eq!(admit(&mut a, &b, 10 * S), Err(AuthRefusal::UnknownKey));
    }

    #[test]
    fn forged_replayed_stale_and_plain_packets_are_refused_and_counted() {
        let now = 100 * S;
        let mut a = Auth::new(params());
        a.set_keys(&file(&[(1, 0x11, 50, None)]), now);
        assert_eq!(a.send_key_id(), Some(1));
        let mut b = [0u8; PACKET_BYTES];
        a.encode(&probe(7), &mut b, now, &ME);
        assert_eq!(admit(&mut a, &b, now), Ok(()));
        assert_eq!(admit(&mut a, &b, now + S), Err(AuthRefusal::Replay));
        // Past the window the same bytes are stale rather than a replay (the table forgot them).
        assert_eq!(admit(&mut a, &b, now + 3 * S), Err(AuthRefusal::Stale));
        let mut forged = b;
        forged[9] ^= 1;
        assert_eq!(admit(&mut a, &forged, now), Err(AuthRefusal::BadMac));
        let mut other = [0u8; PACKET_BYTES];
        probe(8).seal(&mut other, &MacKey::new(1, [0x12; 32]), now, &ME);
        assert_eq!(admit(&mut a, &other, now), Err(AuthRefusal::BadMac), "same id, wrong secret");
        probe(8).seal(&mut other, &MacKey::new(2, [0x11; 32]), now, &ME);
        assert_eq!(admit(&mut a, &other, now), Err(AuthRefusal::UnknownKey));
        probe(9).encode(&mut other);
        assert_eq!(admit(&mut a, &other, now), Err(AuthRefusal::Unauthenticated));
        let counts: Vec<u64> = a.refused.to_vec();
        assert_eq!(counts, vec![1, 1, 2, 1, 1, 0, 0]);
    }

    #[test]
    fn rotation_accepts_both_keys_in_the_grace_period_and_the_old_one_not_after() {
        // Key 1 until t=200 s; key 2 sent from t=150 s.
        let f = file(&[(1, 0x11, 0, Some(200)), (2, 0x22, 150, None)]);
        let mut a = Auth::new(params());
        a.set_keys(&f, 100 * S);
        assert_eq!(a.send_key_id(), Some(1));
        let mut new = [0u8; PACKET_BYTES];
        probe(1).seal(&mut new, &MacKey::new(2, [0x22; 32]), 100 * S, &ME);
        assert_eq!(admit(&mut a, &new, 100 * S), Ok(()), "the next key is accepted before it is sent");
        a.refresh(150 * S);
        assert_eq!(a.send_key_id(), Some(2));
        let mut old = [0u8; PACKET_BYTES];
        probe(2).seal(&mut old, &MacKey::new(1, [0x11; 32]), 160 * S, &ME);
        assert_eq!(admit(&mut a, &old, 160 * S), Ok(()), "the old key within its grace");
        probe(3).seal(&mut old, &MacKey::new(1, [0x11; 32]), 200 * S, &ME);
        a.refresh(200 * S);
        assert_eq!(admit(&mut a, &old, 200 * S), Err(AuthRefusal::UnknownKey), "the old key after its grace");
    }

    /// Issue 33, item 8: a sealed probe captured on its way to one shard and replayed to another
    /// fails the other's MAC check (the receiver is bound into the MAC), so it never takes a
    /// slot of the other's replay table: a flood of such replays refuses nothing genuine there.
    #[test]
    fn a_packet_replayed_to_another_receiver_fails_its_mac_and_fills_nothing() {
        let now = 100 * S;
        let other_end = Binding([8; 16]);
        let mut a = Auth::new(AuthParams { window_ns: 2 * S, replay_slots: NEIGHBOURHOOD });
        a.set_keys(&file(&[(1, 0x11, 0, None)]), now);
        let mut b = [0u8; PACKET_BYTES];
        for seq in 0..200u64 {
            a.encode(&probe(seq), &mut b, now, &other_end);
            let (_, seal) = Packet::parse(&b).expect("structure");
            assert_eq!(a.admit(&b, seal, now, &ME), Err(AuthRefusal::BadMac));
        }
        // The whole table (two buckets) is still free for the packets sent to this end.
        for seq in 0..BUCKET as u64 {
            a.encode(&probe(1000 + seq), &mut b, now, &ME);
            assert_eq!(admit(&mut a, &b, now), Ok(()), "probe {seq}");
        }
        assert_eq!(a.refused[AuthRefusal::ReplayTableFull.index()], 0);
    }

    /// An earlier release's sealed packet (version 2: its MAC binds no receiver) is keyed
    /// otherwise: refused as old_version, never admitted, whatever its MAC.
    #[test]
    fn a_packet_of_an_earlier_release_is_refused_as_old_version() {
        let now = 100 * S;
        let mut a = Auth::new(params());
        a.set_keys(&file(&[(1, 0x11, 50, None)]), now);
        let mut b = [0u8; PACKET_BYTES];
        a.encode(&probe(7), &mut b, now, &ME);
        b[4] = 2;
        assert_eq!(admit(&mut a, &b, now), Err(AuthRefusal::OldVersion));
        assert!(Auth::keyed_differently(AuthRefusal::OldVersion));
        let mut unkeyed = Auth::new(params());
        assert_eq!(admit(&mut unkeyed, &b, now), Err(AuthRefusal::OldVersion), "nor by an agent without keys");
    }

    /// REFUSALs: only for packets refused for their authentication alone, and at most
    /// REFUSALS_PER_S a second.
    #[test]
    fn refusals_answer_only_keying_differences_and_are_rate_limited() {
        for (why, aloud) in [
            (AuthRefusal::Unauthenticated, true),
            (AuthRefusal::UnknownKey, true),
            (AuthRefusal::OldVersion, true),
            (AuthRefusal::BadMac, false),
            (AuthRefusal::Stale, false),
            (AuthRefusal::Replay, false),
            (AuthRefusal::ReplayTableFull, false),
        ] {
            assert_eq!(Auth::keyed_differently(why), aloud, "{why:?}");
        }
        let mut a = Auth::new(params());
        let now = 100 * S;
        let sent = (0..3 * REFUSALS_PER_S).filter(|_| a.take_refusal(now)).count() as u32;
        assert_eq!(sent, REFUSALS_PER_S, "one second's budget at once");
        assert!(!a.take_refusal(now + S / 1000 - 1), "nothing earned within a millisecond");
        let later = (0..3 * REFUSALS_PER_S).filter(|_| a.take_refusal(now + S / 2)).count() as u32;
        assert_eq!(later, REFUSALS_PER_S / 2, "half a second earns half");
        assert_eq!(a.refusals_sent, u64::from(REFUSALS_PER_S * 3 / 2));
    }

    #[test]
    fn the_replay_table_refuses_rather_than_forgets_when_a_neighbourhood_is_full() {
        let now = 100 * S;
        // The whole table is two buckets of 8.
        let mut a = Auth::new(AuthParams { window_ns: 2 * S, replay_slots: NEIGHBOURHOOD });
        a.set_keys(&file(&[(1, 0x11, 0, None)]), now);
        let mut b = [0u8; PACKET_BYTES];
        let mut admitted = Vec::new();
        for seq in 0..40u64 {
            a.encode(&probe(seq), &mut b, now, &ME);
            match admit(&mut a, &b, now) {
                Ok(()) => admitted.push(b),
                Err(e) => assert_eq!(e, AuthRefusal::ReplayTableFull),
            }
        }
        assert!((BUCKET..=NEIGHBOURHOOD).contains(&admitted.len()), "{} admitted", admitted.len());
        assert_eq!(a.refused[AuthRefusal::ReplayTableFull.index()], 40 - admitted.len() as u64);
        // What was admitted is still known: a full table never forgets a live tag.
        for b in &admitted {
            assert_eq!(admit(&mut a, b, now + S), Err(AuthRefusal::Replay));
        }
        // Once the window has passed, the slots are free again.
        a.encode(&probe(99), &mut b, now + 3 * S, &ME);
        assert_eq!(admit(&mut a, &b, now + 3 * S), Ok(()));
    }
}
