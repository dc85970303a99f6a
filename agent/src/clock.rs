//! The host clock the agent stamps T1 and T6 with.

/// CLOCK_REALTIME in ns: the clock the kernel's socket timestamps use, so T1/T6 and the
/// kernel's T2/T5 subtract within one clock domain. A step of this clock between T1 and T6
/// makes a delay negative or absurd, and the probe is then recorded as invalid, not dropped.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &raw mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC in ns: the clock of the service tracer's events (`bpf_ktime_get_ns`).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the struct we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
