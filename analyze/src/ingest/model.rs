//! The ingested data: the probe columns ([`Probes`]) with fleet-wide ids, the RNICs, traced
//! services, agent files, path traces and problems of a [`Dataset`], and the names that stand for
//! what no file named.

use polars::prelude::*;
use rocemesh_formats::record::ServiceConn;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;

/// The probe columns, all the same length, ids fleet-wide (see [`Dataset::rnics`]).
#[derive(Debug, Default)]
pub struct Probes {
    /// T1, Unix ns.
    pub t1_unix_ns: Vec<u64>,
    /// Network RTT, ns (0 unless ok).
    pub network_rtt_ns: Vec<i32>,
    /// Prober host delay, ns.
    pub prober_delay_ns: Vec<i32>,
    /// Responder host delay, ns.
    pub responder_delay_ns: Vec<i32>,
    /// Prober RNIC id.
    pub prober: Vec<u32>,
    /// Target RNIC id.
    pub target: Vec<u32>,
    /// Flow label.
    pub flow_label: Vec<u32>,
    /// Responder epoch from the ACK (0 if none).
    pub responder_epoch: Vec<u32>,
    /// Probe kind (0 tor_mesh, 1 inter_tor, 2 service).
    pub kind: Vec<u8>,
    /// Outcome byte (`formats::record::Outcome`; [`crate::probe::Class::of`] says what it
    /// counts as).
    pub outcome: Vec<u8>,
    /// Arrival bitmap.
    pub arrived: Vec<u8>,
    /// Timestamp source byte (`formats::record::TsSource`): delays of different sources are
    /// not comparable ([`crate::probe::TsSources`]).
    pub ts_source: Vec<u8>,
    /// The traced connection a service probe probed ([`Dataset::services`] index), [`NO_SERVICE`]
    /// for every other probe. Empty when no file defines a service (then no probe is one): fleets
    /// without traced connections pay nothing for it. Read for every [`Fields`].
    pub service: Vec<u32>,
    /// Each record's position in the whole input as [`ingest_with`] orders it (files in order,
    /// each file's records in order), for a range that a [`Plan`] read with
    /// [`Plan::with_index`]: a strided sample by position is then the same sample, range by
    /// range, as over the whole input. Empty: the position is the record's index here.
    pub index: Vec<u64>,
}

/// `n` copies of `v`, written on every core of rayon's pool. A range's columns are hundreds of
/// megabytes, and filling them on the calling thread (mimalloc clears the memory it hands out
/// again; the kernel clears each page at first touch) was the longest stretch of a range's read
/// with one core busy (docs/PERFORMANCE.md, "Serial stretches").
pub(crate) fn filled<T: Copy + Send + Sync>(n: usize, v: T) -> Vec<T> {
    use rayon::prelude::*;
    let mut out = Vec::with_capacity(n);
    out.par_extend(rayon::iter::repeat_n(v, n));
    out
}

impl Probes {
    /// Records held.
    pub fn len(&self) -> usize {
        self.t1_unix_ns.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.t1_unix_ns.is_empty()
    }

    /// Record `i`'s position in the whole input (see [`Probes::index`]).
    #[inline]
    pub fn index_of(&self, i: usize) -> u64 {
        self.index.get(i).copied().unwrap_or(i as u64)
    }

    /// The service id of record `i` ([`NO_SERVICE`] when it probed no traced connection).
    #[inline]
    pub fn service_of(&self, i: usize) -> u32 {
        self.service.get(i).copied().unwrap_or(NO_SERVICE)
    }

    /// The first column read for `fields` whose length is not [`Probes::len`], with its
    /// length: passes that zip columns would stop at the shortest and silently drop records.
    pub fn uneven_column(&self, fields: Fields) -> Option<(&'static str, usize)> {
        let mut lengths = vec![
            ("network_rtt_ns", self.network_rtt_ns.len()),
            ("prober_delay_ns", self.prober_delay_ns.len()),
            ("responder_delay_ns", self.responder_delay_ns.len()),
            ("prober", self.prober.len()),
            ("target", self.target.len()),
            ("outcome", self.outcome.len()),
            ("arrived", self.arrived.len()),
            ("ts_source", self.ts_source.len()),
        ];
        if fields == Fields::All {
            lengths.extend([
                ("flow_label", self.flow_label.len()),
                ("responder_epoch", self.responder_epoch.len()),
                ("kind", self.kind.len()),
            ]);
        }
        // The service column is empty when no probe is a service probe.
        if !self.service.is_empty() {
            lengths.push(("service", self.service.len()));
        }
        lengths.into_iter().find(|&(_, len)| len != self.len())
    }

    pub(super) fn zeroed(n: usize, fields: Fields, services: bool) -> Probes {
        let all = if fields == Fields::All { n } else { 0 };
        Probes {
            t1_unix_ns: filled(n, 0),
            network_rtt_ns: filled(n, 0),
            prober_delay_ns: filled(n, 0),
            responder_delay_ns: filled(n, 0),
            prober: filled(n, 0),
            target: filled(n, 0),
            flow_label: filled(all, 0),
            responder_epoch: filled(all, 0),
            kind: filled(all, 0),
            outcome: filled(n, 0),
            arrived: filled(n, 0),
            ts_source: filled(n, 0),
            service: if services { filled(n, NO_SERVICE) } else { Vec::new() },
            index: Vec::new(),
        }
    }

    /// A polars frame over the same memory (the vectors are moved, not copied).
    pub fn into_frame(self) -> PolarsResult<DataFrame> {
        let n = self.len();
        let service = if self.service.is_empty() { vec![NO_SERVICE; n] } else { self.service };
        DataFrame::new(
            n,
            vec![
                UInt64Chunked::from_vec("t1_unix_ns".into(), self.t1_unix_ns).into_column(),
                Int32Chunked::from_vec("network_rtt_ns".into(), self.network_rtt_ns).into_column(),
                Int32Chunked::from_vec("prober_delay_ns".into(), self.prober_delay_ns).into_column(),
                Int32Chunked::from_vec("responder_delay_ns".into(), self.responder_delay_ns).into_column(),
                UInt32Chunked::from_vec("prober".into(), self.prober).into_column(),
                UInt32Chunked::from_vec("target".into(), self.target).into_column(),
                UInt32Chunked::from_vec("flow_label".into(), self.flow_label).into_column(),
                UInt32Chunked::from_vec("responder_epoch".into(), self.responder_epoch).into_column(),
                UInt8Chunked::from_vec("kind".into(), self.kind).into_column(),
                UInt8Chunked::from_vec("outcome".into(), self.outcome).into_column(),
                UInt8Chunked::from_vec("arrived".into(), self.arrived).into_column(),
                UInt8Chunked::from_vec("ts_source".into(), self.ts_source).into_column(),
                UInt32Chunked::from_vec("service".into(), service).into_column(),
            ],
        )
    }
}

/// Which probe columns to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fields {
    /// Every column.
    All,
    /// Without `flow_label`, `responder_epoch` and `kind`, which reports never read: 9 bytes a
    /// record neither copied nor paged in (0.9 GB at 10^8 records). Those columns stay empty, so
    /// [`Probes::into_frame`] refuses such a table (its columns differ in length). `ts_source`
    /// is read: a report says which sources its quantiles came from.
    Report,
}

/// An RNIC (probing endpoint) known to some file's dictionary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rnic {
    /// Entity name, e.g. `tor3-h5/rnic0`.
    pub name: String,
    /// Its ToR ("" when unknown).
    pub tor: String,
    /// Its host: the part of the name before the last `/` (the whole name if none).
    pub host: String,
}

/// The service id of probes that probed no traced connection ([`Probes::service`]).
pub const NO_SERVICE: u32 = u32::MAX;

/// How a service's remote RNIC was found (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// The agent named it (`ServiceConn::remote`).
    Agent,
    /// The inventory RNIC with the connection's remote GID.
    Inventory,
    /// A dictionary's RNIC entry with the connection's remote GID.
    Dictionary,
    /// Nothing knew the GID: the remote is an RNIC named after it (`gid:...`).
    Unresolved,
}

impl Resolution {
    /// The name used in every output.
    pub fn name(self) -> &'static str {
        match self {
            Resolution::Agent => "agent",
            Resolution::Inventory => "inventory",
            Resolution::Dictionary => "dictionary",
            Resolution::Unresolved => "unresolved",
        }
    }
}

/// A traced service connection (a dictionary entry of role `Service`), fleet-wide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// The dictionary name (unique per connection; opaque).
    pub name: String,
    /// Fleet id of the RNIC that probes it (the writer of the files that define it);
    /// `u32::MAX` when no file names its writer.
    pub prober: u32,
    /// Fleet id of the remote RNIC its probes are attributed to.
    pub remote: u32,
    /// How `remote` was found.
    pub resolution: Resolution,
    /// The remote GID (16 bytes, network order; all zero when the agent did not know it).
    pub addr: [u8; 16],
    /// The connection: process, QP numbers, flow label.
    pub conn: ServiceConn,
}

impl Service {
    /// A readable label: `ib_write_bw[4242] qp 17->18 tor0-h0/rxe0->tor1-h0/rxe0`.
    pub fn label(&self, rnics: &[Rnic]) -> String {
        let name = |id: u32| rnics.get(id as usize).map_or(UNKNOWN_RNIC, |r| r.name.as_str());
        let comm = if self.conn.comm.is_empty() { "?" } else { self.conn.comm.as_str() };
        format!(
            "{comm}[{}] qp {}->{} {}->{}",
            self.conn.pid,
            self.conn.local_qpn,
            self.conn.remote_qpn,
            name(self.prober),
            name(self.remote)
        )
    }
}

/// The RNIC name of a remote GID nothing resolved: `gid:::ffff:10.0.1.2`, or for a zero GID
/// (the agent did not know it) one per connection.
pub(super) fn gid_name(addr: &[u8; 16], service: &str) -> String {
    if *addr == [0; 16] {
        format!("gid:unknown ({service})")
    } else {
        format!("gid:{}", std::net::Ipv6Addr::from(*addr))
    }
}

/// One agent instance's file: who wrote it and when.
#[derive(Debug, Clone)]
pub struct AgentFile {
    /// Fleet id of the writing RNIC.
    pub rnic: u32,
    /// The writer's agent epoch (a new one per agent start).
    pub agent_epoch: u32,
    /// First and last T1 in the file.
    pub first_ns: u64,
    /// See `first_ns`.
    pub last_ns: u64,
    /// Records.
    pub records: u64,
    /// Send-time gaps of this prober far above its usual spacing: (T1 before the gap, gap ns).
    pub long_gaps: Vec<(u64, u64)>,
    /// Median spacing between consecutive probes, ns.
    pub median_gap_ns: u64,
}

/// A path-trace hop address no inventory switch lists (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnmappedHop {
    /// The address, as text (`172.16.0.1`, `fd00::1`).
    pub addr: String,
    /// Path traces through it, left out of [`Dataset::paths`].
    pub traces: u64,
}

/// A traced path's key: (source RNIC, destination RNIC, flow label).
pub type PathKey = (u32, u32, u32);
/// A path as traced at a time: (first trace that found it, ns; switch ids in order).
pub type TimedPath = (u64, Vec<u32>);

/// A file that could not be read, or was read with damage.
#[derive(Debug, Clone)]
pub struct FileProblem {
    /// The file.
    pub path: PathBuf,
    /// What was wrong; `skipped` = nothing of it was used.
    pub problem: String,
    /// Whether the whole file was skipped.
    pub skipped: bool,
}

/// Everything read from a set of segment files.
#[derive(Debug, Default)]
pub struct Dataset {
    /// Probe records.
    pub probes: Probes,
    /// RNICs by fleet id.
    pub rnics: Vec<Rnic>,
    /// Switch names by switch id (from path traces).
    pub switches: Vec<String>,
    /// Traced service connections by service id ([`Probes::service`]).
    pub services: Vec<Service>,
    /// Traced paths: (src RNIC, dst RNIC, flow label) -> switch ids in order (the latest trace).
    pub paths: HashMap<(u32, u32, u32), Vec<u32>>,
    /// Keys whose traces found more than one path over the data's span: each change, as (time
    /// of the first trace that found it, switch ids), in time order. A path changes when a
    /// prober restarts (its UDP source ports, hence its ECMP paths, are new) or routing moves;
    /// a probe must vote on the path of its own time ([`Dataset::path_at`]), not the last one.
    pub path_changes: HashMap<PathKey, Vec<TimedPath>>,
    /// Hop addresses no inventory switch lists, most traces first (then by address): their
    /// traces are not in `paths`. The fix is `ctl inventory switch-addrs`.
    pub unmapped_hops: Vec<UnmappedHop>,
    /// Hop addresses no inventory switch lists that were named as their traces' end ToRs
    /// ([`crate::hops::EndHops`]) in traces placed.
    pub hops_learned: usize,
    /// Paths the inventory alone determines, for probes without a trace: (src ToR, dst ToR) ->
    /// switch ids, for ToR pairs that share exactly one spine (see [`Dataset::add_single_paths`]).
    pub tor_paths: HashMap<(String, String), Vec<u32>>,
    /// One entry per readable file.
    pub agents: Vec<AgentFile>,
    /// Unreadable or damaged files.
    pub problems: Vec<FileProblem>,
    /// Files looked at.
    pub files: usize,
}

impl Dataset {
    /// The ToR of RNIC `id` ("" when unknown or no such RNIC).
    pub fn tor_of_rnic(&self, id: u32) -> &str {
        self.rnics.get(id as usize).map_or("", |r| r.tor.as_str())
    }

    /// Fleet id of an RNIC name.
    pub fn rnic_id(&self, name: &str) -> Option<u32> {
        self.rnics.iter().position(|r| r.name == name).map(|i| i as u32)
    }

    /// The traced path of `key` in force at `t_ns`: the latest trace at or before it, else the
    /// earliest one (probes before a path's first trace took it too, as far as anyone knows).
    pub fn path_at(&self, key: &PathKey, t_ns: u64) -> Option<&Vec<u32>> {
        match self.path_changes.get(key) {
            Some(changes) => {
                let i = changes.partition_point(|(t, _)| *t <= t_ns).saturating_sub(1);
                changes.get(i).map(|(_, hops)| hops)
            }
            None => self.paths.get(key),
        }
    }

    /// Services whose remote RNIC nothing resolved ([`Resolution::Unresolved`]).
    pub fn unresolved_services(&self) -> impl Iterator<Item = &Service> {
        self.services.iter().filter(|s| s.resolution == Resolution::Unresolved)
    }

    /// Paths that need no trace: in a two-tier fabric, traffic between two ToRs crosses one
    /// spine both are linked to, so a ToR pair with exactly one common spine in the inventory
    /// has one path (`tor_a, spine, tor_b`) whatever the flow label. Agents without path tracing
    /// (all real ones today) then still vote on links and spines for those pairs. Returns the
    /// number of ordered ToR pairs added.
    pub fn add_single_paths(&mut self, inv: &rocemesh_formats::inventory::Inventory) -> usize {
        let is_spine = |n: &str| inv.spines.iter().any(|s| s.name == n);
        let mut uplinks: HashMap<&str, Vec<&str>> = HashMap::new();
        for l in &inv.links {
            let (tor, spine) = if is_spine(&l.b) { (l.a.as_str(), l.b.as_str()) } else { (l.b.as_str(), l.a.as_str()) };
            uplinks.entry(tor).or_default().push(spine);
        }
        let mut tors: Vec<String> = self.rnics.iter().map(|r| r.tor.clone()).collect();
        tors.sort();
        tors.dedup();
        let mut added = 0;
        for a in &tors {
            for b in &tors {
                if a == b {
                    continue;
                }
                let (Some(ua), Some(ub)) = (uplinks.get(a.as_str()), uplinks.get(b.as_str())) else { continue };
                let common: Vec<&&str> = ua.iter().filter(|s| ub.contains(s)).collect();
                if common.len() != 1 {
                    continue;
                }
                let hops = [a.as_str(), common[0], b.as_str()].map(|n| self.switch_id(n));
                self.tor_paths.insert((a.clone(), b.clone()), hops.to_vec());
                added += 1;
            }
        }
        added
    }

    pub fn switch_id(&mut self, name: &str) -> u32 {
        match self.switches.iter().position(|s| s == name) {
            Some(i) => i as u32,
            None => {
                self.switches.push(name.to_owned());
                self.switches.len() as u32 - 1
            }
        }
    }
}

/// How reports and exports name an id no dictionary defined as an RNIC.
pub const UNKNOWN_RNIC: &str = "(unknown rnic)";
/// How reports and exports name the ToR of an RNIC whose ToR no dictionary gave.
pub const NO_TOR: &str = "(no tor)";
