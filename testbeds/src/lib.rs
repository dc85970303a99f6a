//! Testbeds: the deterministic fault-scenario simulator and the scorer of `analyze localize`'s
//! findings (issue 6), and the soft-RoCE VM that runs real verbs in CI (issue 7): [`rxevm`] boots
//! it from the host, [`rxefabric`] builds the ToR/host network and its faults inside it.
//!
//! The simulator turns a scenario (`rocemesh_formats::scenario`) into the segment files every
//! agent of that fabric would have written, through `rocemesh_formats::segment::SegmentWriter`,
//! the writer the agent uses, so analysis reads simulated and real data by the same code.
//!
//! [`clos`] (issue 15) runs real agents on the UDP transport in a two-tier Clos fabric of
//! network namespaces on the host kernel, injects faults on a timeline and scores `analyze`'s
//! findings as the simulator's accuracy suite does.

pub mod cli;
pub mod clockstep;
pub mod clos;
mod fabric;
pub mod harness;
mod rxeagent;
mod rxedoctor;
pub mod rxefabric;
pub mod rxelab;
pub mod rxemetrics;
pub mod rxeservices;
pub mod rxeview;
pub mod rxevm;
pub mod score;
pub mod simulate;
pub mod suite;

pub use score::{Finding, Score, parse_findings, score};
pub use simulate::{SimError, SimSummary, simulate, simulate_summarised};
