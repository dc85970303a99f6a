//! Analysis over shipped segments.
//!
//! Today this crate owns [`inspect`]: finding segment files, validating them, and saying what
//! each holds and what a reader had to skip. The SLA report and fault localisation (polars,
//! issue 5) will live here too, and only here: polars takes ~17 minutes to build on 2 cores.

pub mod inspect;

/// Exit codes shared by rocemesh's binaries, so scripts can tell "ran, found problems" from
/// "could not run".
pub mod exit {
    /// Everything read cleanly.
    pub const OK: i32 = 0;
    /// The command ran, but found problems in its input (damaged or skipped files).
    pub const PROBLEMS: i32 = 1;
    /// The command could not run: bad arguments, no input, unreadable configuration.
    pub const USAGE: i32 = 2;
}
