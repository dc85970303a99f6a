//! Testbeds: the deterministic fault-scenario simulator and the scorer of `analyze localize`'s
//! findings (issue 6); the soft-RoCE VM that runs real verbs in CI (issue 7) is not built yet.
//!
//! The simulator turns a scenario (`rocemesh_formats::scenario`) into the segment files every
//! agent of that fabric would have written, through `rocemesh_formats::segment::SegmentWriter`,
//! the writer the agent uses, so analysis reads simulated and real data by the same code.

mod fabric;
pub mod score;
pub mod simulate;
pub mod suite;

pub use score::{Finding, Score, parse_findings, score};
pub use simulate::{SimError, SimSummary, simulate};
