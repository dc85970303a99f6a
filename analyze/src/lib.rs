//! Analysis over shipped segments.
//!
//! [`inspect`] finds segment files and says what each holds and what a reader had to skip;
//! [`ingest`] reads them into one columnar table with fleet-wide ids; [`probe`] says what each
//! record counts as (ok, lost, partial, invalid, refused, local_drop), the scopes and the SLA;
//! [`report`], [`export`] and [`html`] render that; [`localize`] turns it into findings, and
//! [`switches`] puts the switches' own counters (from Prometheus) beside them. Polars
//! lives in this crate only: it takes ~17 minutes to build on 2 cores.

pub mod cli;
pub mod export;
pub mod hops;
pub mod html;
pub mod ingest;
pub mod inspect;
pub mod live;
pub mod localize;
pub mod probe;
pub mod quantile;
pub mod report;
pub mod switches;
pub mod watch;

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
