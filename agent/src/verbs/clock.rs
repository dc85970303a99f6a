//! Where a verbs shard's completion timestamps (T2..T5) come from, decided once per device
//! open from what the device reports, and how a NIC's raw clock becomes nanoseconds.
//!
//! Pure: the device is queried and the CQs created in `resources`; this module turns the
//! device's answers into the order of what to try, and converts stamps. Each rule is a unit test
//! (rxe, the only RDMA device CI has, reports no completion timestamps, so the NIC path cannot run
//! here).
//!
//! - A device whose `completion_timestamp_mask` is 0 has no completion timestamps: host poll.
//! - Otherwise try wall-clock stamps first (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`: the
//!   provider converts the NIC clock to ns), then raw ticks (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`)
//!   converted with the device's own core clock frequency (`hca_core_clock`, kHz). A device that
//!   reports no frequency cannot have its ticks converted: wall clock or nothing.
//! - Raw ticks are converted one stamp at a time into ns of *that device's* counter; the shard
//!   only subtracts stamps of one device (T5-T2 on the prober, T4-T3 on the responder), never
//!   across devices (PingWeave's bug). A counter wrap between two stamps of one probe makes
//!   that probe `Invalid` (a negative delay), counted and never used as a sample.

/// How stamps of a CQ are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// `ibv_wc_read_completion_wallclock_ns`: already ns.
    Wallclock,
    /// `ibv_wc_read_completion_ts`: ticks of the device's core clock.
    Ticks {
        /// The core clock's frequency, kHz (`hca_core_clock`).
        khz: u64,
        /// The valid bits of a stamp (`completion_timestamp_mask`).
        mask: u64,
    },
}

impl Clock {
    /// A raw stamp in ns of this clock's domain.
    pub fn ns(self, raw: u64) -> u64 {
        match self {
            Clock::Wallclock => raw,
            Clock::Ticks { khz, mask } => {
                // u128: ticks up to 2^64 times 10^6 must not overflow.
                ((u128::from(raw & mask) * 1_000_000) / u128::from(khz.max(1))) as u64
            }
        }
    }
}

/// What the device said about its clock (`ibv_query_device_ex`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockCaps {
    /// Valid bits of a completion timestamp; 0 = none.
    pub completion_timestamp_mask: u64,
    /// Core clock frequency in kHz; 0 = not reported.
    pub hca_core_clock_khz: u64,
}

/// The clocks to try, best first; empty means host poll, with the reason.
pub fn candidates(caps: ClockCaps) -> Result<Vec<Clock>, &'static str> {
    if caps.completion_timestamp_mask == 0 {
        return Err("the device reports no completion timestamps");
    }
    let mut c = vec![Clock::Wallclock];
    if caps.hca_core_clock_khz > 0 {
        c.push(Clock::Ticks { khz: caps.hca_core_clock_khz, mask: caps.completion_timestamp_mask });
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_chosen_from_the_capabilities() {
        let rxe = ClockCaps { completion_timestamp_mask: 0, hca_core_clock_khz: 0 };
        assert_eq!(candidates(rxe), Err("the device reports no completion timestamps"));
        let cx6 = ClockCaps { completion_timestamp_mask: u64::MAX >> 1, hca_core_clock_khz: 1_000_000 };
        assert_eq!(
            candidates(cx6),
            Ok(vec![Clock::Wallclock, Clock::Ticks { khz: 1_000_000, mask: u64::MAX >> 1 }]),
            "wall clock first, ticks with the device's own frequency second"
        );
        let no_freq = ClockCaps { completion_timestamp_mask: 0xFFFF_FFFF, hca_core_clock_khz: 0 };
        assert_eq!(candidates(no_freq), Ok(vec![Clock::Wallclock]), "ticks without a frequency are unusable");
    }

    #[test]
    fn ticks_become_ns_of_the_devices_own_clock() {
        let ghz = Clock::Ticks { khz: 1_000_000, mask: u64::MAX };
        assert_eq!(ghz.ns(123_456), 123_456);
        // 156.25 MHz: one tick is 6.4 ns.
        let slow = Clock::Ticks { khz: 156_250, mask: u64::MAX };
        assert_eq!(slow.ns(1_000), 6_400);
        assert_eq!(slow.ns(5) - slow.ns(0), 32);
        // Bits above the mask are not part of the stamp.
        let masked = Clock::Ticks { khz: 1_000_000, mask: 0xFFFF };
        assert_eq!(masked.ns(0x1_0005), 5);
        // No overflow at the top of the counter.
        assert_eq!(ghz.ns(u64::MAX), u64::MAX);
        assert_eq!(Clock::Wallclock.ns(1_700_000_000_000_000_000), 1_700_000_000_000_000_000);
    }
}
