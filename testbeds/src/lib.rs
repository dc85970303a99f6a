//! Testbeds: the deterministic fault-scenario simulator (issue 6), the network-namespace
//! fabric, and the soft-RoCE VM that runs real verbs in CI (issue 7).
//!
//! Not built yet. The simulator will write its segments through
//! `rocemesh_formats::segment::SegmentWriter`, the same writer the agent uses.
