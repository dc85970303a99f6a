//! rocemesh's benchmarks. Each prints its figures beside a baseline measured in the same run,
//! because absolute numbers on a shared 2-core VM mean little and ratios travel.

pub mod agent;
pub mod analyze;
pub mod auth;
pub mod cli;
pub mod collect;
pub mod formats;
pub mod live;
pub mod pinglists;
pub mod synth;
