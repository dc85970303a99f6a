//! The agent: one glommio shard per RNIC, pinned to its core, probing its pinglist's targets
//! with the six-timestamp protocol and answering other agents' probes.
//!
//! Not built yet (issue 3: UDP transport first; issue 7: verbs). What exists for it today is the
//! contract it writes to: `rocemesh_formats::segment::SegmentWriter` (one per shard, appending
//! `ProbeRecord`s without allocating) and `rocemesh_formats::pinglist` (what it probes).
