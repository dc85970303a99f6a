//! The rocemesh agent: one shard per RNIC (UDP: per local address), each pinned to its core,
//! probing its pinglist's targets with the six-timestamp protocol and answering other agents'
//! probes, and writing every probe into its segment files.
//!
//! - [`protocol`]: the 64-byte packet on the wire; [`auth`]: which packets are sealed with the
//!   fleet key and which are let in (MAC, replay window).
//! - [`transport`]: the trait a transport implements; [`udp`] is the kernel-UDP one, [`verbs`]
//!   the RDMA one (UD queue pairs, RDMA CM peer resolution, device recovery).
//! - [`shard`]: prober and responder state, sized at pinglist load, allocation-free per probe.
//! - [`pathtrace`]: the switches each inter-ToR (target, flow label) and each answer crosses,
//!   traced with the probes' own 5-tuple.
//! - [`runtime`]: executors, signals, pinglist reload, sealing.
//! - [`live`]: what each shard publishes while it runs; [`exporter`]: `/metrics` (Prometheus),
//!   with the RNIC's hardware counters and PFC pause counters ([`hwcounters`]); [`view`]: the
//!   same, kept in a fixed memory region a collector reads with RDMA READ.
//! - [`caps`]: capabilities used during setup only, then dropped per thread.
//! - [`errlog`]: errors the agent survives, counted and logged once per kind and interval.
//! - [`cli`]: the `agent` command line; [`config`]: the configuration file; [`demo`]: the
//!   embedded default (loopback shards) and its injected fault; [`describe`]: what `ctl
//!   inventory import` needs to know about this host; [`doctor`]: the checks of a node before
//!   the service is enabled.

pub mod auth;
pub mod caps;
pub mod cli;
pub mod clock;
pub mod config;
pub mod demo;
pub mod describe;
pub mod doctor;
pub mod errlog;
pub mod exporter;
pub mod hwcounters;
pub mod live;
pub mod pathtrace;
pub mod protocol;
pub mod push;
pub mod runtime;
pub mod service;
pub mod shard;
pub mod stats;
pub mod tracer;
pub mod transport;
pub mod udp;
pub mod verbs;
pub mod view;
