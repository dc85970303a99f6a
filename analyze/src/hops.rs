//! Switch addresses learned from where they stand in path traces, for hops no inventory switch
//! lists: a trace's first hop is the prober's own ToR (TTL 1 expires there), its last the
//! target's ToR (the last switch before the target). Real switches advertise one management
//! address over LLDP while their ICMP answers come from interface addresses, so a fabric's ToR
//! hops are often unknown to the inventory; its endpoints' ToRs are not.
//!
//! An address is learned only when every trace agrees: all its first- and last-hop places name
//! one ToR, and it never stands between two hops (a ToR never does in a Clos; a spine whose
//! traces were all cut short might stand last). Anything else stays unmapped, with the fix
//! named where the unmapped hops are reported.

use std::collections::HashMap;

/// The most addresses the learner holds: beyond it, new addresses are not learned (a fabric
/// has a few per switch port).
pub const MAX_ADDRS: usize = 1 << 16;

#[derive(Debug, Clone, PartialEq)]
enum Seen {
    /// At a trace's end, always as this ToR's.
    Tor(String),
    /// At ends of different ToRs, at an end with no ToR known, or between two hops.
    Not,
}

/// The learner: every trace with an unmapped hop is shown to it ([`EndHops::see`]) before any
/// is placed ([`EndHops::tor_of`]).
#[derive(Debug, Default, Clone)]
pub struct EndHops {
    seen: HashMap<[u8; 16], Seen>,
}

impl EndHops {
    /// One trace: each hop's address where the inventory does not name it (`None` where it
    /// does), the prober's ToR and the target's ("" when unknown). Between two ToRs a whole
    /// trace crosses at least three switches (ToR, spine, ToR): a shorter one was cut short
    /// (the hops past it silent), its last hop no ToR, and says nothing of its end.
    pub fn see(&mut self, unnamed: &[Option<[u8; 16]>], src_tor: &str, dst_tor: &str) {
        let cut_short = src_tor != dst_tor && unnamed.len() < 3;
        let last = if cut_short { usize::MAX } else { unnamed.len().saturating_sub(1) };
        for (i, addr) in unnamed.iter().enumerate() {
            let Some(addr) = addr else { continue };
            let mut verdicts = Vec::with_capacity(2);
            if i == 0 {
                verdicts.push(src_tor);
            }
            if i == last {
                verdicts.push(dst_tor);
            }
            if verdicts.is_empty() {
                self.mark(*addr, None);
            }
            for tor in verdicts {
                self.mark(*addr, Some(tor).filter(|t| !t.is_empty()));
            }
        }
    }

    fn mark(&mut self, addr: [u8; 16], tor: Option<&str>) {
        if !self.seen.contains_key(&addr) && self.seen.len() >= MAX_ADDRS {
            return;
        }
        let now = match (self.seen.get(&addr), tor) {
            (_, None) | (Some(Seen::Not), _) => Seen::Not,
            (None, Some(t)) => Seen::Tor(t.to_string()),
            (Some(Seen::Tor(was)), Some(t)) if was == t => return,
            (Some(Seen::Tor(_)), Some(_)) => Seen::Not,
        };
        self.seen.insert(addr, now);
    }

    /// The ToR `addr` belongs to, if every trace seen agrees.
    pub fn tor_of(&self, addr: &[u8; 16]) -> Option<&str> {
        match self.seen.get(addr) {
            Some(Seen::Tor(t)) => Some(t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(n: u8) -> [u8; 16] {
        let mut x = [0; 16];
        x[15] = n;
        x
    }

    #[test]
    fn ends_are_their_tors_and_the_middle_is_not_guessed() {
        let mut h = EndHops::default();
        // tor1 -> spine (unknown) -> tor2, from tor1's RNIC to tor2's.
        h.see(&[Some(a(1)), Some(a(9)), Some(a(2))], "tor1", "tor2");
        h.see(&[Some(a(1)), None, Some(a(3))], "tor1", "tor3");
        assert_eq!(h.tor_of(&a(1)), Some("tor1"));
        assert_eq!(h.tor_of(&a(2)), Some("tor2"));
        assert_eq!(h.tor_of(&a(3)), Some("tor3"));
        assert_eq!(h.tor_of(&a(9)), None, "a middle hop is not a ToR");
    }

    #[test]
    fn disagreement_or_a_middle_place_unlearns_an_address() {
        let mut h = EndHops::default();
        // A spine that answered last on a cut-short trace between two ToRs: not taken as the
        // target's ToR.
        h.see(&[Some(a(1)), Some(a(9))], "tor1", "tor2");
        assert_eq!(h.tor_of(&a(9)), None);
        assert_eq!(h.tor_of(&a(1)), Some("tor1"), "its first hop still is the prober's ToR");
        // One last on a longer cut-short trace (a 3-tier fabric's), then between hops on a
        // whole one.
        h.see(&[Some(a(1)), Some(a(20)), Some(a(10))], "tor1", "tor2");
        assert_eq!(h.tor_of(&a(10)), Some("tor2"));
        h.see(&[Some(a(1)), Some(a(20)), Some(a(10)), Some(a(21)), Some(a(3))], "tor1", "tor3");
        assert_eq!(h.tor_of(&a(10)), None);
        // Last for tor2's RNICs and for tor3's: not one ToR's.
        h.see(&[None, None, Some(a(5))], "tor1", "tor2");
        h.see(&[None, None, Some(a(5))], "tor1", "tor3");
        assert_eq!(h.tor_of(&a(5)), None);
        // Once unlearned, agreement later does not bring it back.
        h.see(&[None, None, Some(a(5))], "tor1", "tor2");
        assert_eq!(h.tor_of(&a(5)), None);
        // An end whose RNIC's ToR nobody knows.
        h.see(&[Some(a(7)), None], "", "tor2");
        assert_eq!(h.tor_of(&a(7)), None);
        // One hop: the prober's and the target's ToR alike.
        h.see(&[Some(a(8))], "tor4", "tor4");
        assert_eq!(h.tor_of(&a(8)), Some("tor4"));
        // One hop between two ToRs: cut short, its first hop still the prober's ToR.
        h.see(&[Some(a(6))], "tor4", "tor5");
        assert_eq!(h.tor_of(&a(6)), Some("tor4"));
    }
}
