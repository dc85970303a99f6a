//! Peer resolution as a pure state machine: for each target (GID, RDMA CM port), which QPN its
//! probes go to, whether to ask RDMA CM again, and what a probe that cannot be sent means.
//!
//! It makes no verbs call. The transport starts a resolution with a CM id it owns (`H`, an RAII
//! handle whose drop destroys the id), reports how it ended ([`Resolution`]), and asks
//! [`Peers::route`] for every packet. Tests drive it with plain integers as handles, so every
//! rule here runs without a device.
//!
//! The rules, and why:
//! - A target is *wanted* from the first probe to it; the start-up grace period counts from
//!   then, not from the first resolution that got started: a resolution that fails at once on
//!   every try (no route) must end the grace period like one that times out, or the target is
//!   hidden forever.
//! - Within the grace period an unresolved target's probes stay local ([`Route::Resolving`]):
//!   agents start together, and a peer not resolved yet is nobody's fault.
//! - Past it, an unresolved target is [`Route::Unreachable`]: its probes are loss, because the
//!   network (or the target) did not let us reach it.
//! - A SIDR reject is [`Route::Refused`] (the host is up, its agent is not: not loss) only until
//!   a later attempt says otherwise: a refused target that then times out is unreachable.

use std::collections::HashMap;

/// A target as resolution knows it: its GID and its RDMA CM service port.
pub type PeerKey = ([u8; 16], u16);

/// A target whose first resolution has not succeeded within this is treated as unreachable
/// (its probes are lost, not "refused"): a dead RNIC must not hide behind a pending SIDR.
pub const FIRST_RESOLUTION_GRACE_NS: u64 = 3_000_000_000;
/// A SIDR attempt older than this is abandoned. The kernel gives up by itself after about a
/// minute (15 retries of 4 s) and reports it; destroying an id whose request is still being
/// retried made `rdma_destroy_id` block the shard for about a second in the VM, so this is only
/// a backstop beyond the kernel's own timeout.
pub const RESOLUTION_GIVE_UP_NS: u64 = 90_000_000_000;
/// Consecutive unanswered probes that trigger a re-resolution of the target's QPN.
pub const MISSES_BEFORE_RESOLVE: u32 = 3;

/// Exponential backoff between attempts: doubles after each failure up to a cap, back to the
/// floor after a success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    step_ns: u64,
}

impl Backoff {
    /// First wait after a failure.
    pub const MIN_NS: u64 = 1_000_000_000;
    /// Longest wait.
    pub const MAX_NS: u64 = 30_000_000_000;

    /// At the floor.
    pub const fn new() -> Self {
        Self { step_ns: Self::MIN_NS }
    }

    /// A failure at `now_ns`: when to try next; the wait after that doubles.
    pub fn next_after_failure(&mut self, now_ns: u64) -> u64 {
        let at = now_ns.saturating_add(self.step_ns);
        self.step_ns = (self.step_ns.saturating_mul(2)).min(Self::MAX_NS);
        at
    }

    /// A success: the next failure waits the floor again.
    pub fn reset(&mut self) {
        self.step_ns = Self::MIN_NS;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// How one resolution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The peer answered with its QPN.
    Resolved(u32),
    /// The peer's host answered that nothing listens on the port (its agent is down).
    Refused,
    /// No answer, or no way to send the request (no route, address or route resolution
    /// failed, a timeout): the network or the peer's host is at fault.
    Unreachable,
}

/// What to do with a packet for a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Send it to this QPN.
    Send(u32),
    /// Not sent: the peer's agent is down (its host refused the resolution).
    Refused,
    /// Not sent, and loss: the target could not be resolved past the grace period.
    Unreachable,
    /// Not sent, and local: the target is still being resolved within the grace period.
    Resolving,
    /// Not sent, and local: the destination table is full.
    TableFull,
}

#[derive(Debug)]
struct Dest<H> {
    /// Last resolved QPN, 0 if none.
    qpn: u32,
    /// The last attempt was refused (nothing listens there now).
    refused: bool,
    /// A resolution in flight: its handle and when it started.
    resolving: Option<(H, u64)>,
    /// When the first probe wanted this target: the grace period counts from here.
    first_wanted_ns: u64,
    next_attempt_ns: u64,
    backoff: Backoff,
    misses: u32,
}

/// What [`Peers::drive`] did in one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Driven {
    /// Resolutions started.
    pub started: u32,
    /// Resolutions that could not even be started (counted as unreachable attempts).
    pub start_failed: u32,
    /// Resolutions abandoned after [`RESOLUTION_GIVE_UP_NS`].
    pub given_up: u32,
}

/// The resolution state of every target of a shard, bounded.
#[derive(Debug)]
pub struct Peers<H> {
    dests: HashMap<PeerKey, Dest<H>>,
    capacity: usize,
}

impl<H> Peers<H> {
    /// A table of at most `capacity` targets.
    pub fn new(capacity: usize) -> Self {
        Self { dests: HashMap::new(), capacity }
    }

    /// Where a packet for `key` goes at `now_ns`. The first call for a target starts wanting
    /// it (and the grace period); [`Peers::drive`] then starts its resolution.
    pub fn route(&mut self, key: PeerKey, now_ns: u64) -> Route {
        if !self.dests.contains_key(&key) {
            if self.dests.len() >= self.capacity {
                return Route::TableFull;
            }
            self.dests.insert(
                key,
                Dest {
                    qpn: 0,
                    refused: false,
                    resolving: None,
                    first_wanted_ns: now_ns,
                    next_attempt_ns: now_ns,
                    backoff: Backoff::new(),
                    misses: 0,
                },
            );
        }
        let Some(d) = self.dests.get(&key) else { return Route::TableFull };
        if d.qpn != 0 {
            Route::Send(d.qpn)
        } else if d.refused {
            Route::Refused
        } else if now_ns.saturating_sub(d.first_wanted_ns) < FIRST_RESOLUTION_GRACE_NS {
            Route::Resolving
        } else {
            Route::Unreachable
        }
    }

    /// Start the resolutions that are due with `start` (which returns the new resolution's
    /// handle, or why none could be started), and give up those pending for too long.
    pub fn drive<E>(
        &mut self,
        now_ns: u64,
        mut start: impl FnMut(&PeerKey) -> Result<H, E>,
        mut start_failed: impl FnMut(&PeerKey, E),
    ) -> Driven {
        let mut done = Driven::default();
        for (key, d) in &mut self.dests {
            if let Some((_, since)) = &d.resolving {
                if now_ns.saturating_sub(*since) > RESOLUTION_GIVE_UP_NS {
                    d.resolving = None;
                    Self::failed(d, Resolution::Unreachable, now_ns);
                    done.given_up += 1;
                }
                continue;
            }
            let wanted = d.qpn == 0 || d.misses >= MISSES_BEFORE_RESOLVE;
            if !wanted || now_ns < d.next_attempt_ns {
                continue;
            }
            match start(key) {
                Ok(h) => {
                    d.resolving = Some((h, now_ns));
                    d.misses = 0;
                    done.started += 1;
                }
                Err(e) => {
                    start_failed(key, e);
                    Self::failed(d, Resolution::Unreachable, now_ns);
                    done.start_failed += 1;
                }
            }
        }
        done
    }

    /// The target whose resolution `is_it` recognises (a CM event's id), if any. A scan: CM
    /// events are rare, a handful per target per backoff period.
    pub fn find(&self, mut is_it: impl FnMut(&H) -> bool) -> Option<PeerKey> {
        self.dests.iter().find(|(_, d)| d.resolving.as_ref().is_some_and(|(h, _)| is_it(h))).map(|(k, _)| *k)
    }

    /// A resolution of `key` ended. Returns its handle (the caller destroys it, after acking
    /// the event that ended it); `None` if `key` had none in flight.
    pub fn finish(&mut self, key: &PeerKey, how: Resolution, now_ns: u64) -> Option<H> {
        let d = self.dests.get_mut(key)?;
        let handle = d.resolving.take().map(|(h, _)| h);
        match how {
            Resolution::Resolved(qpn) => {
                if d.qpn == qpn {
                    // Same QPN and still no answers: the fault is elsewhere; do not ask again
                    // at every third probe (an answered probe resets the backoff).
                    d.next_attempt_ns = d.backoff.next_after_failure(now_ns);
                } else {
                    d.backoff.reset();
                }
                d.qpn = qpn;
                d.refused = false;
                d.misses = 0;
            }
            Resolution::Refused | Resolution::Unreachable => Self::failed(d, how, now_ns),
        }
        handle
    }

    fn failed(d: &mut Dest<H>, how: Resolution, now_ns: u64) {
        if how == Resolution::Refused {
            // Nothing listens there now: the QPN we had is gone with its agent.
            d.qpn = 0;
            d.refused = true;
        } else {
            // A timeout says nothing about a listener: what was refused before may be a dead
            // host now, which is loss. A QPN resolved before is kept: probes to it go on and
            // their fate is the network's to tell.
            d.refused = false;
        }
        d.next_attempt_ns = d.backoff.next_after_failure(now_ns);
    }

    /// What became of a probe to `key`: answered or not. Misses trigger a re-resolution (a
    /// restarted peer has a new QPN); an answer resets the backoff.
    pub fn observe(&mut self, key: &PeerKey, answered: bool) {
        if let Some(d) = self.dests.get_mut(key) {
            if answered {
                d.misses = 0;
                d.backoff.reset();
            } else {
                d.misses = d.misses.saturating_add(1);
            }
        }
    }

    /// Re-resolve every target now (our device came back: peers' agents may have restarted
    /// meanwhile).
    pub fn resolve_all_now(&mut self, now_ns: u64) {
        for d in self.dests.values_mut() {
            d.next_attempt_ns = now_ns;
            d.misses = MISSES_BEFORE_RESOLVE;
        }
    }

    /// Drop every resolution in flight (their handles first, before the channel they belong
    /// to goes).
    pub fn cancel_all(&mut self) {
        for d in self.dests.values_mut() {
            d.resolving = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const PEER: PeerKey = ([7; 16], 18515);

    /// A handle that counts its drops, as a CM id's destroy would.
    #[derive(Debug)]
    struct Id(std::rc::Rc<std::cell::Cell<u32>>);

    impl Drop for Id {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    fn no_route(_: &PeerKey) -> Result<u32, &'static str> {
        Err("ENETUNREACH")
    }

    #[test]
    fn a_target_that_fails_to_resolve_at_once_forever_is_unreachable_after_the_grace_period() {
        // f9b751e started the grace period at the first resolution that got started, so a
        // target whose every attempt failed at once stayed "refused" forever, out of loss.
        let mut p: Peers<u32> = Peers::new(8);
        let mut failures = 0;
        for t in 0..10 {
            let now = t * S;
            let route = p.route(PEER, now);
            if now < FIRST_RESOLUTION_GRACE_NS {
                assert_eq!(route, Route::Resolving, "t={t}s: nobody's fault yet");
            } else {
                assert_eq!(route, Route::Unreachable, "t={t}s: loss, so the fault shows");
            }
            failures += p.drive(now, no_route, |_, _| {}).start_failed;
        }
        // Backoff 1, 2, 4 s: attempts at 0, 1, 3, 7 s.
        assert_eq!(failures, 4);
    }

    #[test]
    fn a_target_wanted_while_nothing_can_be_started_is_unreachable_after_the_grace_period() {
        // The device is gone: the transport never calls drive. The grace period still ends.
        let mut p: Peers<u32> = Peers::new(8);
        assert_eq!(p.route(PEER, 5 * S), Route::Resolving);
        assert_eq!(p.route(PEER, 5 * S + FIRST_RESOLUTION_GRACE_NS), Route::Unreachable);
    }

    #[test]
    fn refused_means_agent_down_until_an_attempt_times_out() {
        let mut p: Peers<u32> = Peers::new(8);
        p.route(PEER, 0);
        assert_eq!(p.drive(0, |_| Ok::<u32, ()>(1), |_, _| {}).started, 1);
        assert_eq!(p.finish(&PEER, Resolution::Refused, S), Some(1));
        assert_eq!(p.route(PEER, 10 * S), Route::Refused, "host up, agent down: not loss");
        p.drive(10 * S, |_| Ok::<u32, ()>(2), |_, _| {});
        p.finish(&PEER, Resolution::Unreachable, 11 * S);
        assert_eq!(p.route(PEER, 11 * S), Route::Unreachable, "now the host does not answer: loss");
    }

    #[test]
    fn resolved_targets_are_sent_to_and_re_resolved_after_misses() {
        let mut p: Peers<u32> = Peers::new(8);
        p.route(PEER, 0);
        p.drive(0, |_| Ok::<u32, ()>(1), |_, _| {});
        assert_eq!(p.find(|&h| h == 1), Some(PEER));
        p.finish(&PEER, Resolution::Resolved(0x11), S);
        assert_eq!(p.route(PEER, S), Route::Send(0x11));
        assert_eq!(p.drive(2 * S, |_| Ok::<u32, ()>(2), |_, _| {}).started, 0, "resolved and answering");
        for _ in 0..MISSES_BEFORE_RESOLVE {
            p.observe(&PEER, false);
        }
        assert_eq!(p.drive(2 * S, |_| Ok::<u32, ()>(3), |_, _| {}).started, 1, "three misses: ask again");
        // The same QPN again: the fault is elsewhere, so the next attempt backs off.
        p.finish(&PEER, Resolution::Resolved(0x11), 3 * S);
        for _ in 0..MISSES_BEFORE_RESOLVE {
            p.observe(&PEER, false);
        }
        assert_eq!(p.drive(3 * S, |_| Ok::<u32, ()>(4), |_, _| {}).started, 0, "backing off");
        assert_eq!(p.drive(4 * S, |_| Ok::<u32, ()>(4), |_, _| {}).started, 1);
        // A timeout keeps the QPN: probes go on, and their fate is the network's to tell.
        p.finish(&PEER, Resolution::Unreachable, 5 * S);
        assert_eq!(p.route(PEER, 5 * S), Route::Send(0x11));
    }

    #[test]
    fn stale_resolutions_are_given_up_and_their_handles_destroyed() {
        let drops = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut p: Peers<Id> = Peers::new(8);
        p.route(PEER, 0);
        let d = drops.clone();
        p.drive(0, move |_| Ok::<Id, ()>(Id(d.clone())), |_, _| {});
        let r = p.drive(RESOLUTION_GIVE_UP_NS + 1, |_| Err(()), |_, _| {});
        assert_eq!(r.given_up, 1);
        assert_eq!(drops.get(), 1, "the abandoned CM id was destroyed");
        assert_eq!(p.route(PEER, RESOLUTION_GIVE_UP_NS + 1), Route::Unreachable);
        let d = drops.clone();
        p.drive(RESOLUTION_GIVE_UP_NS + 10 * S, move |_| Ok::<Id, ()>(Id(d.clone())), |_, _| {});
        p.cancel_all();
        assert_eq!(drops.get(), 2, "cancel_all destroys what is in flight");
    }

    #[test]
    fn the_table_is_bounded() {
        let mut p: Peers<u32> = Peers::new(1);
        assert_eq!(p.route(PEER, 0), Route::Resolving);
        assert_eq!(p.route(([8; 16], 1), 0), Route::TableFull);
        assert_eq!(p.route(PEER, 0), Route::Resolving, "the first one is still there");
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new();
        let waits: Vec<u64> = (0..7).map(|_| b.next_after_failure(0) / S).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30]);
        b.reset();
        assert_eq!(b.next_after_failure(0), S);
    }
}
