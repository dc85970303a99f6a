//! Ingest: segment files (open and sealed) into one columnar table with fleet-wide ids.
//!
//! Files are opened and validated in parallel; their dictionaries are merged into one
//! name -> id map (segment ids are per file); then every file's column chunks are copied, in
//! parallel, straight into disjoint slices of preallocated column vectors, remapping the two id
//! columns on the way. Those vectors become polars columns without another copy
//! ([`Probes::into_frame`]). Damaged files contribute what validated; unreadable ones are
//! reported and skipped.
//!
//! Ingest also keeps what only the file structure tells: which agent instance wrote which file
//! (restarts), and each prober's send-time gaps (a frozen host's timers fire late).
//!
//! Traced service connections (dictionary entries of role `Service`) become [`Service`]s. Their
//! probes travel the fabric to the connection's remote RNIC, so the target column holds that
//! RNIC's fleet id, and every analysis by RNIC (report scopes, localisation evidence) counts them
//! there; the [`Probes::service`] column keeps which connection each one probed. The remote RNIC
//! is, in this order ([`Resolution`]): the name the agent wrote (`ServiceConn::remote`); the
//! inventory RNIC whose GID (or IPv4-mapped address) is the entry's address; an RNIC entry of any
//! file's dictionary with that address; else an RNIC named after the GID (`gid:::ffff:10.0.1.2`),
//! which the outputs list as unresolved. The per-file tables that map segment ids do this
//! resolution once per dictionary entry, so the per-record copy stays a table lookup.
//!
//! Path traces ([`Dataset::paths`]) name their hops by dictionary entries of role `Switch`.
//! Simulated traces name the switch (`spine2`, address zero) and are taken as they are. The
//! agent's know only the address that answered (`name` is its text, `addr` the address): the
//! inventory's switch addresses ([`Inventory::switch_addrs`]) name it, so one switch seen from
//! several addresses or agents is one switch id. A hop whose address no inventory switch lists
//! (every such hop, without an inventory) is *unmapped*: its traces are left out, since they
//! would vote on an element nobody can name, and counted by address in
//! [`Dataset::unmapped_hops`]. A trace of an ACK path ends at the prober, which the responder
//! knows only by address (a dictionary entry of role `Peer`): it is the RNIC whose own dictionary
//! entry declares that address, else an RNIC entry of any file's dictionary with it, else the
//! inventory RNIC with it as ip or GID. A `Peer` is never an RNIC of its own; traces to one that
//! nothing resolves are left out and the file reported.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use polars::prelude::*;
use rayon::prelude::*;
use rocemesh_formats::gid::{gid_bytes, ip_of};
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::record::{Endpoint, EndpointRole, ServiceConn};
use rocemesh_formats::segment::{SealedSummary, SegmentReader, SummaryRead, WriterIdentity, read_summary, send_gaps};
use serde::Serialize;

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

    fn zeroed(n: usize, fields: Fields, services: bool) -> Probes {
        let all = if fields == Fields::All { n } else { 0 };
        Probes {
            t1_unix_ns: vec![0; n],
            network_rtt_ns: vec![0; n],
            prober_delay_ns: vec![0; n],
            responder_delay_ns: vec![0; n],
            prober: vec![0; n],
            target: vec![0; n],
            flow_label: vec![0; all],
            responder_epoch: vec![0; all],
            kind: vec![0; all],
            outcome: vec![0; n],
            arrived: vec![0; n],
            ts_source: vec![0; n],
            service: if services { vec![NO_SERVICE; n] } else { Vec::new() },
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
fn gid_name(addr: &[u8; 16], service: &str) -> String {
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

    fn switch_id(&mut self, name: &str) -> u32 {
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

/// A send gap is host-noise evidence from this length up (see [`send_gaps`]).
pub use rocemesh_formats::segment::LONG_GAP_MIN_NS;

/// Reads every file in `files` (see [`crate::inspect::find_segments`]). `progress` draws a bar on
/// stderr when it is a terminal.
pub fn ingest(files: &[PathBuf], progress: bool) -> Dataset {
    ingest_fields(files, progress, Fields::All)
}

/// [`ingest`] of some of the probe columns; the others are left empty.
pub fn ingest_fields(files: &[PathBuf], progress: bool, fields: Fields) -> Dataset {
    ingest_with(files, progress, fields, None)
}

/// [`ingest_fields`], resolving services' remote RNICs through `inventory` where the agent did
/// not name them (see the module documentation).
pub fn ingest_with(files: &[PathBuf], progress: bool, fields: Fields, inventory: Option<&Inventory>) -> Dataset {
    let bar = if progress && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let b = ProgressBar::with_draw_target(Some(files.len() as u64 * 2), ProgressDrawTarget::stderr());
        // The template is a constant that parses; were it ever broken, the plain bar loses
        // nothing but the message.
        b.set_style(
            ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len}").unwrap_or(ProgressStyle::default_bar()),
        );
        b.set_message("reading segments");
        b
    } else {
        ProgressBar::hidden()
    };
    let opened: Vec<(PathBuf, Result<SegmentReader, String>)> = files
        .par_iter()
        .map(|p| {
            let r = SegmentReader::open(p).map_err(|e| e.to_string());
            bar.inc(1);
            (p.clone(), r)
        })
        .collect();
    let mut ds = Dataset { files: files.len(), ..Dataset::default() };
    let mut merger = Merger::new(inventory);
    let mut readers = Vec::new();
    let mut remaps: Vec<Remap> = Vec::new();
    for (path, r) in opened {
        let reader = match r {
            Ok(r) => r,
            Err(problem) => {
                ds.problems.push(FileProblem { path, problem, skipped: true });
                continue;
            }
        };
        ds.problems.extend(damage_problems(&path, &reader));
        remaps.push(merger.add(&mut ds, reader.identity(), reader.dictionary()));
        readers.push((path, reader));
    }
    let rnic_ids = merger.finish(&mut ds, &mut remaps, inventory);
    place_paths(&mut ds, &readers, &remaps);
    let counts: Vec<usize> = readers.iter().map(|(_, r)| r.probe_chunks().map(|c| c.len()).sum()).collect();
    let total: usize = counts.iter().sum();
    let mut probes = Probes::zeroed(total, fields, !ds.services.is_empty());
    {
        let mut slices = split(&mut probes, &counts);
        let filled: Vec<(AgentFile, u64)> = readers
            .par_iter()
            .zip(remaps.par_iter())
            .zip(slices.par_iter_mut())
            .map(|(((_, reader), m), out)| {
                let unknown_ids = fill(reader, m, out, fields, None, 0, usize::MAX);
                let agent = agent_file(reader, out.t1, out.prober.first().copied(), &rnic_ids);
                bar.inc(1);
                (agent, unknown_ids)
            })
            .collect();
        for (((path, _), m), (agent, unknown_ids)) in readers.iter().zip(&remaps).zip(filled) {
            claim_services(&mut ds, m, agent.rnic);
            ds.problems.extend(unknown_ids_problem(path, unknown_ids));
            ds.agents.push(agent);
        }
    }
    bar.finish_and_clear();
    ds.probes = probes;
    ds
}

/// The fleet-wide ids, built from the files' dictionaries one file at a time, in file order
/// (the first file to name an RNIC gives its id).
struct Merger<'i> {
    rnic_ids: HashMap<String, u32>,
    switch_ids: HashMap<String, u32>,
    service_ids: HashMap<String, u32>,
    /// The ToR each service's entry gave its remote end, by service id.
    service_tors: Vec<String>,
    /// RNIC entries' non-zero addresses (the first name seen for each), for resolving services
    /// and peers; and the address each writer declares for itself, which a peer prefers.
    rnic_by_addr: HashMap<[u8; 16], u32>,
    own_by_addr: HashMap<[u8; 16], u32>,
    switch_by_addr: HashMap<[u8; 16], &'i str>,
}

impl<'i> Merger<'i> {
    fn new(inventory: Option<&'i Inventory>) -> Self {
        Merger {
            rnic_ids: HashMap::new(),
            switch_ids: HashMap::new(),
            service_ids: HashMap::new(),
            service_tors: Vec::new(),
            rnic_by_addr: HashMap::new(),
            own_by_addr: HashMap::new(),
            switch_by_addr: inventory.map(Inventory::switch_addrs).unwrap_or_default(),
        }
    }

    /// One readable file's dictionary: its ids mapped to fleet-wide ones.
    fn add(&mut self, ds: &mut Dataset, identity: &WriterIdentity, dict: &[Endpoint]) -> Remap {
        let max_id = dict.iter().map(|e| e.id as usize + 1).max().unwrap_or(0);
        let mut m = Remap {
            prober: vec![u32::MAX; max_id],
            target: vec![u32::MAX; max_id],
            switch: vec![u32::MAX; max_id],
            service: Vec::new(),
            peer: Vec::new(),
            addrs: HashMap::new(),
        };
        let own_name = format!("{}/{}", identity.host, identity.device);
        for e in dict {
            if e.role == EndpointRole::Switch as u8 {
                // Named by the simulator (zero address), else by the inventory's address map.
                let name =
                    if e.addr == [0; 16] { Some(e.name.as_str()) } else { self.switch_by_addr.get(&e.addr).copied() };
                let Some(name) = name else {
                    m.switch[e.id as usize] = UNMAPPED;
                    m.addrs.insert(e.id, e.addr);
                    continue;
                };
                let next = self.switch_ids.len() as u32;
                let id = *self.switch_ids.entry(name.to_owned()).or_insert_with(|| {
                    ds.switches.push(name.to_owned());
                    next
                });
                m.switch[e.id as usize] = id;
            } else if e.role == EndpointRole::Peer as u8 {
                // Resolved below, once every dictionary's RNICs are known.
                if m.peer.is_empty() {
                    m.peer = vec![u32::MAX; max_id];
                }
                m.peer[e.id as usize] = UNRESOLVED_PEER;
                m.addrs.insert(e.id, e.addr);
            } else if e.role == EndpointRole::Service as u8 {
                // Resolved below, once every dictionary's RNICs are known.
                let next = self.service_ids.len() as u32;
                let id = *self.service_ids.entry(e.name.clone()).or_insert_with(|| {
                    ds.services.push(Service {
                        name: e.name.clone(),
                        prober: u32::MAX,
                        remote: u32::MAX,
                        resolution: Resolution::Unresolved,
                        addr: e.addr,
                        conn: e.service.clone().unwrap_or_default(),
                    });
                    self.service_tors.push(e.tor.clone());
                    next
                });
                if m.service.is_empty() {
                    m.service = vec![NO_SERVICE; max_id];
                }
                m.service[e.id as usize] = id;
            } else {
                let id = rnic_id(&mut ds.rnics, &mut self.rnic_ids, &e.name, &e.tor);
                if e.addr != [0; 16] {
                    self.rnic_by_addr.entry(e.addr).or_insert(id);
                    if e.name == own_name {
                        self.own_by_addr.entry(e.addr).or_insert(id);
                    }
                }
                m.prober[e.id as usize] = id;
                m.target[e.id as usize] = id;
            }
        }
        m
    }

    /// Services and peers, once every dictionary is in; returns the RNIC ids by name.
    fn finish(mut self, ds: &mut Dataset, remaps: &mut [Remap], inventory: Option<&Inventory>) -> HashMap<String, u32> {
        let inv_rnics = InventoryRnics::of(inventory);
        resolve_services(ds, &mut self.rnic_ids, &self.service_tors, &self.rnic_by_addr, &inv_rnics);
        for m in remaps.iter_mut() {
            for (t, &s) in m.target.iter_mut().zip(&m.service) {
                if s != NO_SERVICE {
                    *t = ds.services[s as usize].remote;
                }
            }
            for (id, p) in m.peer.iter_mut().enumerate() {
                if *p == UNRESOLVED_PEER
                    && let Some(addr) = m.addrs.get(&(id as u32))
                    && let Some(rnic) =
                        resolve_peer(ds, &mut self.rnic_ids, addr, &self.own_by_addr, &self.rnic_by_addr, &inv_rnics)
                {
                    *p = rnic;
                }
            }
        }
        self.rnic_ids
    }
}

/// What a file's reader says it had to skip, as problems of that file.
pub fn damage_problems<'a>(
    path: &'a std::path::Path,
    reader: &'a SegmentReader,
) -> impl Iterator<Item = FileProblem> + 'a {
    reader.damage().iter().map(move |d| damage_problem(path, d))
}

fn damage_problem(path: &std::path::Path, d: &rocemesh_formats::segment::Damage) -> FileProblem {
    FileProblem {
        path: path.to_path_buf(),
        problem: format!("{:?} at byte {}: {}", d.kind, d.offset, d.detail),
        skipped: false,
    }
}

/// How a problem of a file the first pass read, and a range could not, begins.
pub const READ_AGAIN_FAILED: &str = "could not be read again";

/// A file [`Plan`] reads again for each time range it overlaps.
#[derive(Debug)]
struct Planned {
    path: PathBuf,
    remap: Remap,
    /// Smallest and largest T1.
    first_ns: u64,
    last_ns: u64,
    records: usize,
    /// Entries and [`dictionary_hash`] of its dictionary.
    dictionary: (usize, u64),
    /// A range could not read it as planned (said then): the later ones do not try again.
    left_out: bool,
    /// Its first record's position in the whole input ([`Probes::index`]).
    offset: u64,
    /// Its path traces were gathered ([`Plan::with_paths`]).
    traced: bool,
}

/// Ingest one time range at a time, for passes whose windows are independent (`analyze
/// report`): memory follows the records of a range, not of the input. A first pass reads every
/// file once, one reader per thread at a time, for what the whole input decides (dictionaries
/// and so fleet-wide ids, services, each file's span and agent facts) and keeps none of its
/// records; [`Plan::read`] then copies a range's records from the files that overlap it. The
/// ids, RNICs, services and problems are those [`ingest_with`] gives for the same files; path
/// traces are not read ([`Dataset::paths`] stays empty).
#[derive(Debug)]
pub struct Plan {
    /// Everything but the probes ([`Dataset::probes`] stays empty).
    pub ds: Dataset,
    files: Vec<Planned>,
    fields: Fields,
    /// Unknown prober or target ids per file, summed over the ranges read.
    unknown_ids: Vec<u64>,
    window_ns: u64,
    /// Readers of the files that went on past the last range read (see [`Plan::read`]).
    carried: Vec<(usize, SegmentReader)>,
    /// Records per window index, over every file.
    per_window: std::collections::BTreeMap<u64, u64>,
    /// Records the ranges read so far (a file that cannot be read again is not in it).
    read_records: usize,
    /// Whether ranges carry each record's position in the whole input ([`Plan::with_index`]).
    indexed: bool,
    /// Path traces gathered from the files the ranges opened ([`Plan::with_paths`]).
    traces: Option<PathTraces>,
}

/// What the first pass keeps of one file: its summary (`formats::segment::read_summary`) when
/// it is sealed with one, so that it is not inflated, else the same facts from reading it whole.
struct Head {
    identity: WriterIdentity,
    facts: SealedSummary,
    /// Why a summary the file has could not be used (it was read whole instead).
    unusable_summary: Option<String>,
}

impl Head {
    /// `Err`: the file cannot be read, and why.
    fn of(path: &std::path::Path) -> Result<Head, String> {
        let unusable_summary = match read_summary(path) {
            Ok(SummaryRead::Found(s)) => {
                return Ok(Head { identity: s.identity, facts: s.facts, unusable_summary: None });
            }
            Ok(SummaryRead::Unusable(why)) => Some(why),
            // An error here is one `open` gives again, with its message.
            Ok(SummaryRead::Absent) | Err(_) => None,
        };
        let r = SegmentReader::open(path).map_err(|e| e.to_string())?;
        Ok(Head { identity: r.identity().clone(), facts: SealedSummary::of(&r, r.damage().to_vec()), unusable_summary })
    }

    /// Records per window index, ascending (a few dozen: a segment spans minutes).
    fn per_window(&self, window_ns: u64) -> Vec<(u64, u64)> {
        // floor(t / (k s)) = floor(floor(t / 1 s) / k): seconds add up to whole windows.
        let window_s = window_ns / 1_000_000_000;
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &(s, n) in &self.facts.per_second {
            let w = s / window_s;
            match out.last_mut() {
                Some((last, m)) if *last == w => *m += n,
                _ => out.push((w, n)),
            }
        }
        out
    }
}

/// Whether `r` holds what the first pass planned `f` from: the same records and dictionary. An
/// open segment may have grown since (its writer still appends: `analyze` run on a live agent's
/// directory); a writer never rewrites, so its planned part must be unchanged.
fn as_planned(r: &SegmentReader, f: &Planned) -> bool {
    let (entries, hash) = f.dictionary;
    let d = r.dictionary();
    if r.is_sealed() {
        r.records() as usize == f.records && d.len() == entries && dictionary_hash(d) == hash
    } else {
        r.records() as usize >= f.records && d.len() >= entries && dictionary_hash(&d[..entries]) == hash
    }
}

/// Tells a file's dictionary from another's, so that a file whose records are read is the one
/// its first pass planned (a summary could be forged, a file replaced).
fn dictionary_hash(d: &[Endpoint]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    d.hash(&mut h);
    h.finish()
}

/// See [`Plan`]: the first pass over `files`, for ranges of `window_ns` windows.
pub fn plan(files: &[PathBuf], fields: Fields, inventory: Option<&Inventory>, window_ns: u64) -> Plan {
    assert!(window_ns > 0 && window_ns.is_multiple_of(1_000_000_000), "the CLI's windows are whole seconds");
    // One reader per thread at a time: a reader holds its whole (decompressed) file.
    let heads: Vec<(PathBuf, Result<Head, String>)> = files.par_iter().map(|p| (p.clone(), Head::of(p))).collect();
    let mut ds = Dataset { files: files.len(), ..Dataset::default() };
    let mut merger = Merger::new(inventory);
    let mut kept = Vec::new();
    let mut remaps = Vec::new();
    for (path, head) in heads {
        match head {
            Err(problem) => ds.problems.push(FileProblem { path, problem, skipped: true }),
            Ok(h) => {
                if let Some(why) = &h.unusable_summary {
                    ds.problems.push(FileProblem {
                        path: path.clone(),
                        problem: format!("its summary cannot be used ({why}): read whole to plan"),
                        skipped: false,
                    });
                }
                ds.problems.extend(h.facts.damage.iter().map(|d| damage_problem(&path, d)));
                remaps.push(merger.add(&mut ds, &h.identity, &h.facts.dictionary));
                kept.push((path, h));
            }
        }
    }
    let rnic_ids = merger.finish(&mut ds, &mut remaps, inventory);
    let mut planned = Vec::new();
    let mut offset = 0u64;
    let mut per_window: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for ((path, h), m) in kept.into_iter().zip(remaps) {
        let first = h.facts.first_prober.map(|v| m.prober.get(v as usize).copied().unwrap_or(u32::MAX));
        let rnic = writer_rnic(&h.identity, first, &rnic_ids);
        claim_services(&mut ds, &m, rnic);
        let (first_ns, last_ns) = h.facts.time_range.unwrap_or((0, 0));
        for (w, n) in h.per_window(window_ns) {
            *per_window.entry(w).or_default() += n;
        }
        let records = h.facts.records as usize;
        let dictionary = (h.facts.dictionary.len(), dictionary_hash(&h.facts.dictionary));
        ds.agents.push(AgentFile {
            rnic,
            agent_epoch: h.identity.agent_epoch,
            first_ns,
            last_ns,
            records: h.facts.records,
            long_gaps: h.facts.send_gaps.long,
            median_gap_ns: h.facts.send_gaps.median_ns,
        });
        if h.facts.time_range.is_some() {
            planned.push(Planned {
                path,
                remap: m,
                first_ns,
                last_ns,
                records,
                dictionary,
                left_out: false,
                offset,
                traced: false,
            });
        }
        offset += h.facts.records;
    }
    let unknown_ids = vec![0; planned.len()];
    Plan {
        ds,
        files: planned,
        fields,
        unknown_ids,
        window_ns,
        carried: Vec::new(),
        per_window,
        read_records: 0,
        indexed: false,
        traces: None,
    }
}

impl Plan {
    /// Whether ranges read from now on carry each record's position in the whole input
    /// ([`Probes::index`]: 8 B per record, so only while a reader needs it).
    pub fn with_index(&mut self, on: bool) {
        self.indexed = on;
    }

    /// The files that ranges open from now on give their path traces, placed into
    /// [`Dataset::paths`] by [`Plan::place_paths`] once a pass over every range opened them all.
    pub fn with_paths(&mut self) {
        self.traces.get_or_insert_default();
    }

    /// Places the path traces gathered since [`Plan::with_paths`] (see [`place_paths`]); later
    /// ranges gather none.
    pub fn place_paths(&mut self) {
        if let Some(t) = self.traces.take() {
            t.place(&mut self.ds);
        }
    }

    /// Starts another pass over the ranges: what [`Plan::records_read`] and the unknown-id
    /// problems count is the next pass's, and no reader is carried into its first range.
    pub fn rewind(&mut self) {
        self.read_records = 0;
        self.unknown_ids.iter_mut().for_each(|u| *u = 0);
        self.carried.clear();
    }

    /// The start of every window that holds a record of the readable files, ascending.
    pub fn windows_held(&self) -> impl Iterator<Item = u64> + '_ {
        let window_ns = self.window_ns;
        self.per_window.keys().map(move |&w| w.saturating_mul(window_ns))
    }

    /// Records in the readable files, as the first pass counted them.
    pub fn records(&self) -> usize {
        self.files.iter().map(|f| f.records).sum()
    }

    /// Records the ranges read so far: after every range, what the output counts (less than
    /// [`Plan::records`] when a file could not be read again).
    pub fn records_read(&self) -> usize {
        self.read_records
    }

    /// Consecutive time ranges `[from, to)` of whole windows that together hold every record,
    /// each holding at most `budget` records, or one window however many it holds (a window is
    /// never split). A stretch without records between two ranges belongs to neither. A range
    /// ending at `u64::MAX` includes it (a forged or corrupt T1 is still counted).
    pub fn ranges(&self, budget: usize) -> Vec<(u64, u64)> {
        let window_ns = self.window_ns;
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut held = 0u64;
        for (&w, &n) in &self.per_window {
            match ranges.last_mut() {
                Some(r) if held + n <= budget as u64 => {
                    r.1 = (w + 1).saturating_mul(window_ns);
                    held += n;
                }
                _ => {
                    ranges.push((w * window_ns, (w + 1).saturating_mul(window_ns)));
                    held = n;
                }
            }
        }
        ranges
    }

    /// The records with T1 in `[from, to)`, read from the files whose span overlaps it.
    pub fn read(&mut self, from: u64, to: u64) -> Probes {
        // Readers of files that went on past the last range are kept for this one: a sealed
        // file is decompressed whole, and is then not decompressed again for each range.
        let mut readers: Vec<(usize, SegmentReader)> =
            std::mem::take(&mut self.carried).into_iter().filter(|(i, _)| self.files[*i].last_ns >= from).collect();
        let chosen: Vec<usize> = (0..self.files.len())
            .filter(|&i| self.files[i].first_ns < to && self.files[i].last_ns >= from && !self.files[i].left_out)
            .filter(|i| !readers.iter().any(|(c, _)| c == i))
            .collect();
        let opened: Vec<Result<SegmentReader, String>> =
            chosen.par_iter().map(|&i| SegmentReader::open(&self.files[i].path).map_err(|e| e.to_string())).collect();
        for (&i, r) in chosen.iter().zip(opened) {
            let f = &self.files[i];
            match r {
                Ok(r) if as_planned(&r, f) => readers.push((i, r)),
                // Not what the first pass planned from: a summary that lied (a sealed file's
                // plan comes from it), or another file put in its place since.
                Ok(r) => self.left_out(i, FileProblem {
                    path: f.path.clone(),
                    problem: format!(
                        "{READ_AGAIN_FAILED}: it holds {} records and {} dictionary entries where the first pass (its summary, when sealed) said {} and {}{}: left out",
                        r.records(),
                        r.dictionary().len(),
                        f.records,
                        f.dictionary.0,
                        if r.dictionary().len() == f.dictionary.0 { " with other entries" } else { "" }
                    ),
                    skipped: false,
                }),
                // Read in the first pass, gone or changed since: its records of this range
                // are not counted, and the outputs say so.
                Err(problem) => self.left_out(i, FileProblem {
                    path: f.path.clone(),
                    problem: format!("{READ_AGAIN_FAILED}: {problem}"),
                    skipped: false,
                }),
            }
        }
        if let Some(traces) = &mut self.traces {
            for (i, r) in &readers {
                let f = &mut self.files[*i];
                if !f.traced {
                    f.traced = true;
                    traces.add(&mut self.ds, &f.path, r, &f.remap);
                }
            }
        }
        let files = &self.files;
        let counts: Vec<usize> = readers.par_iter().map(|(i, r)| records_in(r, from, to, files[*i].records)).collect();
        self.read_records += counts.iter().sum::<usize>();
        let mut probes = Probes::zeroed(counts.iter().sum(), self.fields, !self.ds.services.is_empty());
        if self.indexed {
            probes.index = vec![0; probes.len()];
        }
        let mut slices = split(&mut probes, &counts);
        let (files, fields) = (&self.files, self.fields);
        let unknown: Vec<u64> = readers
            .par_iter()
            .zip(slices.par_iter_mut())
            .map(|((i, r), out)| {
                let f = &files[*i];
                fill(r, &f.remap, out, fields, Some((from, to)), f.offset, f.records)
            })
            .collect();
        for ((i, _), u) in readers.iter().zip(unknown) {
            self.unknown_ids[*i] += u;
        }
        // At most one file per writer goes on past a range: what is kept is bounded by the
        // fleet, not by the input.
        self.carried = readers.into_iter().filter(|(i, _)| self.files[*i].last_ns >= to).collect();
        probes
    }

    /// Leaves file `i` out of every range from now on, said once.
    fn left_out(&mut self, i: usize, problem: FileProblem) {
        self.files[i].left_out = true;
        self.ds.problems.push(problem);
    }

    /// The dataset, with the problems only the ranges read could tell (taken: the plan is
    /// spent).
    pub fn finish(&mut self) -> Dataset {
        for (f, &u) in self.files.iter().zip(&self.unknown_ids) {
            self.ds.problems.extend(unknown_ids_problem(&f.path, u));
        }
        self.files.clear();
        self.carried.clear();
        std::mem::take(&mut self.ds)
    }
}

/// [`Remap::switch`] of a switch entry whose address the inventory does not map.
const UNMAPPED: u32 = u32::MAX - 1;
/// [`Remap::peer`] of a peer entry whose address nothing resolves to an RNIC.
const UNRESOLVED_PEER: u32 = u32::MAX - 1;

/// Path traces (few: one per traced (pair, label)) into [`Dataset::paths`]. A trace toward a
/// service entry is the path to its remote RNIC, one toward a peer entry the path to the RNIC
/// that declares its address. A trace naming an id its file's dictionary lacks (or an RNIC where
/// a switch belongs), or ending at a peer nothing resolves, cannot be placed: it is left out and
/// the file reported. One through an unmapped hop is left out and counted in
/// [`Dataset::unmapped_hops`].
fn place_paths(ds: &mut Dataset, readers: &[(PathBuf, SegmentReader)], remaps: &[Remap]) {
    let mut traces = PathTraces::default();
    for ((path, reader), m) in readers.iter().zip(remaps) {
        traces.add(ds, path, reader, m);
    }
    traces.place(ds);
}

/// Path traces gathered file by file, in any order, and placed once every file is in
/// ([`place_paths`]; a [`Plan`] gathers them as its first pass over the ranges opens each file).
#[derive(Debug, Default)]
struct PathTraces {
    /// Traces by unmapped hop address.
    unmapped: HashMap<[u8; 16], u64>,
    history: HashMap<PathKey, Vec<TimedPath>>,
}

impl PathTraces {
    /// One file's traces; what cannot be placed is said as the file's problem in `ds`.
    fn add(&mut self, ds: &mut Dataset, path: &std::path::Path, reader: &SegmentReader, m: &Remap) {
        let PathTraces { unmapped, history } = self;
        let (mut undefined, mut to_unresolved) = (0u64, 0u64);
        let mut unresolved_addrs: BTreeSet<String> = BTreeSet::new();
        for p in reader.path_records() {
            let get = |table: &[u32], v: u32| table.get(v as usize).copied().unwrap_or(u32::MAX);
            // An end: the RNIC (or a service's remote) it names, else the peer it stands for.
            let end = |v: u32| match get(&m.target, v) {
                u32::MAX => get(&m.peer, v),
                rnic => rnic,
            };
            let ends = [p.src.to_native(), p.dst.to_native()];
            let (src, dst) = (end(ends[0]), end(ends[1]));
            let n = (p.hop_count.to_native() as usize).min(p.hops.len());
            let hops: Vec<u32> = p.hops[..n].iter().map(|h| get(&m.switch, h.to_native())).collect();
            if [src, dst].contains(&u32::MAX) || hops.contains(&u32::MAX) {
                undefined += 1;
                continue;
            }
            let mut placed = true;
            if src == UNRESOLVED_PEER || dst == UNRESOLVED_PEER {
                to_unresolved += 1;
                for (v, r) in ends.into_iter().zip([src, dst]) {
                    if let Some(addr) = m.addrs.get(&v).filter(|_| r == UNRESOLVED_PEER) {
                        unresolved_addrs.insert(addr_text(addr));
                    }
                }
                placed = false;
            }
            // Each unmapped address once per trace, however often the trace crosses it.
            let mut seen: Vec<[u8; 16]> = Vec::new();
            for (h, &id) in p.hops[..n].iter().zip(&hops) {
                if id == UNMAPPED
                    && let Some(&addr) = m.addrs.get(&h.to_native())
                    && !seen.contains(&addr)
                {
                    seen.push(addr);
                    *unmapped.entry(addr).or_default() += 1;
                    placed = false;
                }
            }
            if placed {
                history.entry((src, dst, p.flow_label.to_native())).or_default().push((p.t_unix_ns.to_native(), hops));
            }
        }
        if undefined > 0 {
            ds.problems.push(FileProblem {
                path: path.to_path_buf(),
                problem: format!("{undefined} path traces name ids its dictionary does not define: left out"),
                skipped: false,
            });
        }
        if to_unresolved > 0 {
            let addrs: Vec<String> = unresolved_addrs.into_iter().collect();
            ds.problems.push(FileProblem {
                path: path.to_path_buf(),
                problem: format!(
                    "{to_unresolved} path traces end at a peer address that no RNIC's dictionary entry and no inventory RNIC declares ({}): left out (fix: read the probers' segments too, or give an inventory that lists the address)",
                    addrs.join(", ")
                ),
                skipped: false,
            });
        }
    }

    /// Into `ds`: each key's path, its changes, and the unmapped hops.
    fn place(self, ds: &mut Dataset) {
        let PathTraces { unmapped, history } = self;
        // The latest trace of each key is its path; a key whose path changed keeps its changes.
        // Ordered by hops too, so that two traces of one instant come out the same whatever order
        // the files were read in.
        for (key, mut traces) in history {
            traces.sort_unstable();
            traces.dedup_by(|later, earlier| later.1 == earlier.1);
            let latest = traces.last().map(|(_, h)| h.clone()).unwrap_or_default();
            if traces.len() > 1 {
                ds.path_changes.insert(key, traces);
            }
            ds.paths.insert(key, latest);
        }
        let mut hops: Vec<UnmappedHop> =
            unmapped.into_iter().map(|(addr, traces)| UnmappedHop { addr: addr_text(&addr), traces }).collect();
        hops.sort_by(|a, b| b.traces.cmp(&a.traces).then_with(|| a.addr.cmp(&b.addr)));
        ds.unmapped_hops = hops;
    }
}

/// An address as operators write it: IPv4 for an IPv4-mapped address.
fn addr_text(addr: &[u8; 16]) -> String {
    ip_of(addr).to_string()
}

/// The RNIC a peer entry's address stands for (see the module documentation), defining it
/// from the inventory when no dictionary named it; `None` when nothing declares the address.
fn resolve_peer(
    ds: &mut Dataset,
    rnic_ids: &mut HashMap<String, u32>,
    addr: &[u8; 16],
    own_by_addr: &HashMap<[u8; 16], u32>,
    rnic_by_addr: &HashMap<[u8; 16], u32>,
    inv: &InventoryRnics,
) -> Option<u32> {
    if *addr == [0; 16] {
        return None;
    }
    if let Some(&id) = own_by_addr.get(addr).or_else(|| rnic_by_addr.get(addr)) {
        return Some(id);
    }
    let (name, tor) = inv.by_addr.get(addr)?;
    Some(rnic_id(&mut ds.rnics, rnic_ids, name, tor))
}

/// The inventory's RNICs (none without an inventory): by GID, and by the IPv4-mapped address
/// where the GID differs, with their ToR; and each RNIC's ToR by name.
#[derive(Default)]
struct InventoryRnics {
    by_addr: HashMap<[u8; 16], (String, String)>,
    tor: HashMap<String, String>,
}

impl InventoryRnics {
    fn of(inventory: Option<&Inventory>) -> InventoryRnics {
        let mut inv = InventoryRnics::default();
        for h in inventory.iter().flat_map(|inv| &inv.hosts) {
            for r in &h.rnics {
                let name = Inventory::rnic_name(&h.name, &r.device);
                for addr in [r.gid_or_mapped().octets(), gid_bytes(r.ip)] {
                    inv.by_addr.entry(addr).or_insert_with(|| (name.clone(), r.tor.clone()));
                }
                inv.tor.insert(name, r.tor.clone());
            }
        }
        inv
    }
}

/// One file's dictionary ids mapped to fleet-wide ids.
#[derive(Debug)]
struct Remap {
    /// As a prober: RNIC entries only (a service entry is no prober).
    prober: Vec<u32>,
    /// As a target: RNIC entries, and service entries as their remote RNIC.
    target: Vec<u32>,
    /// Switch entries; [`UNMAPPED`] for one whose address the inventory does not map.
    switch: Vec<u32>,
    /// Service entries' service ids ([`NO_SERVICE`] elsewhere); empty when the file has none.
    service: Vec<u32>,
    /// Peer entries' RNICs ([`UNRESOLVED_PEER`] when nothing declares the address, `u32::MAX`
    /// for other entries); empty when the file has none. Used for path traces only: no probe
    /// targets a peer.
    peer: Vec<u32>,
    /// The addresses of unmapped switch entries and of peer entries, by dictionary id.
    addrs: HashMap<u32, [u8; 16]>,
}

/// The fleet id of the RNIC `name`, defining it (with `tor`) on first sight. A dictionary may
/// name an RNIC without its ToR (agents know only their own): the RNIC's own files, or any entry
/// that has one, fill it in.
fn rnic_id(rnics: &mut Vec<Rnic>, ids: &mut HashMap<String, u32>, name: &str, tor: &str) -> u32 {
    let next = ids.len() as u32;
    let id = *ids.entry(name.to_owned()).or_insert_with(|| {
        let host = name.rsplit_once('/').map_or(name, |(h, _)| h).to_owned();
        rnics.push(Rnic { name: name.to_owned(), tor: tor.to_owned(), host });
        next
    });
    if rnics[id as usize].tor.is_empty() && !tor.is_empty() {
        rnics[id as usize].tor = tor.to_owned();
    }
    id
}

/// Finds every service's remote RNIC (see the module documentation), defining it as an RNIC
/// when no dictionary did.
fn resolve_services(
    ds: &mut Dataset,
    rnic_ids: &mut HashMap<String, u32>,
    service_tors: &[String],
    rnic_by_addr: &HashMap<[u8; 16], u32>,
    inv: &InventoryRnics,
) {
    let (inv_by_addr, inv_tor) = (&inv.by_addr, &inv.tor);
    let mut services = std::mem::take(&mut ds.services);
    for (s, tor) in services.iter_mut().zip(service_tors) {
        let known = s.addr != [0; 16];
        let (name, how, inv) = if !s.conn.remote.is_empty() {
            (s.conn.remote.clone(), Resolution::Agent, None)
        } else if let Some((name, tor)) = inv_by_addr.get(&s.addr).filter(|_| known) {
            (name.clone(), Resolution::Inventory, Some(tor.clone()))
        } else if let Some(&id) = rnic_by_addr.get(&s.addr).filter(|_| known) {
            (ds.rnics[id as usize].name.clone(), Resolution::Dictionary, None)
        } else {
            (gid_name(&s.addr, &s.name), Resolution::Unresolved, None)
        };
        let tor = match inv.or_else(|| inv_tor.get(&name).cloned()) {
            Some(t) if tor.is_empty() => t,
            _ => tor.clone(),
        };
        s.remote = rnic_id(&mut ds.rnics, rnic_ids, &name, &tor);
        s.resolution = how;
    }
    ds.services = services;
}

/// One file's share of every column.
struct Slices<'a> {
    t1: &'a mut [u64],
    rtt: &'a mut [i32],
    pd: &'a mut [i32],
    rd: &'a mut [i32],
    prober: &'a mut [u32],
    target: &'a mut [u32],
    label: &'a mut [u32],
    epoch: &'a mut [u32],
    kind: &'a mut [u8],
    outcome: &'a mut [u8],
    arrived: &'a mut [u8],
    ts_source: &'a mut [u8],
    service: &'a mut [u32],
    index: &'a mut [u64],
}

fn split<'a>(p: &'a mut Probes, counts: &[usize]) -> Vec<Slices<'a>> {
    let mut rest = Slices {
        t1: &mut p.t1_unix_ns,
        rtt: &mut p.network_rtt_ns,
        pd: &mut p.prober_delay_ns,
        rd: &mut p.responder_delay_ns,
        prober: &mut p.prober,
        target: &mut p.target,
        label: &mut p.flow_label,
        epoch: &mut p.responder_epoch,
        kind: &mut p.kind,
        outcome: &mut p.outcome,
        arrived: &mut p.arrived,
        ts_source: &mut p.ts_source,
        service: &mut p.service,
        index: &mut p.index,
    };
    let mut out = Vec::with_capacity(counts.len());
    for &n in counts {
        macro_rules! cut {
            ($f:ident) => {{
                // Columns left out (see [`Fields`]) are empty and stay so.
                let at = n.min(rest.$f.len());
                let (a, b) = std::mem::take(&mut rest.$f).split_at_mut(at);
                rest.$f = b;
                a
            }};
        }
        out.push(Slices {
            t1: cut!(t1),
            rtt: cut!(rtt),
            pd: cut!(pd),
            rd: cut!(rd),
            prober: cut!(prober),
            target: cut!(target),
            label: cut!(label),
            epoch: cut!(epoch),
            kind: cut!(kind),
            outcome: cut!(outcome),
            arrived: cut!(arrived),
            ts_source: cut!(ts_source),
            service: cut!(service),
            index: cut!(index),
        });
    }
    out
}

/// Copies one file's records (those with T1 in `range`, every one without) into its slices;
/// returns how many prober or target ids its dictionary does not define as RNICs or services
/// (remapped to `u32::MAX`, the unknown RNIC of reports). A service probe's target becomes its
/// remote RNIC and its service id goes to the service column: table lookups, nothing allocated.
/// `offset`: the file's first record's position in the whole input ([`Probes::index`], written
/// when that slice is not empty).
fn fill(
    reader: &SegmentReader,
    m: &Remap,
    out: &mut Slices<'_>,
    fields: Fields,
    range: Option<(u64, u64)>,
    offset: u64,
    planned: usize,
) -> u64 {
    let mut at = 0;
    // Position of the current chunk's first record in the file, skipped chunks included.
    let mut chunk_at = offset;
    let mut unknown_ids = 0u64;
    let remap = |table: &[u32], v: u32| table.get(v as usize).copied().unwrap_or(u32::MAX);
    // Which of a chunk's rows to take: all of them (a plain copy, the usual case), or the
    // ones inside the range (and planned), which only a chunk straddling a boundary needs.
    let mut picked: Vec<u32> = Vec::new();
    for (c, keep) in planned_chunks(reader, planned) {
        let first = chunk_at;
        chunk_at += c.len() as u64;
        let mut whole = keep == c.len();
        if let Some((from, to)) = range {
            let (lo, hi) = chunk_span(c);
            if hi < from || !within(lo, 0, to) {
                continue;
            }
            whole &= within(lo, from, to) && within(hi, from, to);
        }
        if !whole {
            picked.clear();
            picked.extend(
                c.t1_unix_ns[..keep]
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| range.is_none_or(|(from, to)| within(t.to_native(), from, to)))
                    .map(|(i, _)| i as u32),
            );
        }
        let n = if whole { c.len() } else { picked.len() };
        let r = at..at + n;
        macro_rules! copy {
            ($dst:expr, $src:expr, $v:ident => $e:expr) => {{
                if whole {
                    for (o, $v) in $dst[r.clone()].iter_mut().zip($src.iter()) {
                        *o = $e;
                    }
                } else {
                    for (o, &i) in $dst[r.clone()].iter_mut().zip(&picked) {
                        let $v = &$src[i as usize];
                        *o = $e;
                    }
                }
            }};
        }
        copy!(out.t1, c.t1_unix_ns, v => v.to_native());
        copy!(out.rtt, c.network_rtt_ns, v => v.to_native());
        copy!(out.pd, c.prober_delay_ns, v => v.to_native());
        copy!(out.rd, c.responder_delay_ns, v => v.to_native());
        copy!(out.prober, c.prober, v => remap(&m.prober, v.to_native()));
        copy!(out.target, c.target, v => remap(&m.target, v.to_native()));
        unknown_ids +=
            out.prober[r.clone()].iter().chain(&out.target[r.clone()]).filter(|&&v| v == u32::MAX).count() as u64;
        // The column exists when some file defines a service; it was made all NO_SERVICE.
        if !out.service.is_empty() && !m.service.is_empty() {
            copy!(out.service, c.target, v => m
                .service
                .get(v.to_native() as usize)
                .copied()
                .unwrap_or(NO_SERVICE));
        }
        if fields == Fields::All {
            copy!(out.label, c.flow_label, v => v.to_native());
            copy!(out.epoch, c.responder_epoch, v => v.to_native());
            copy!(out.kind, c.kind, v => *v);
        }
        copy!(out.outcome, c.outcome, v => *v);
        copy!(out.arrived, c.arrived, v => *v);
        copy!(out.ts_source, c.ts_source, v => *v);
        if !out.index.is_empty() {
            if whole {
                for (k, o) in out.index[r.clone()].iter_mut().enumerate() {
                    *o = first + k as u64;
                }
            } else {
                for (o, &i) in out.index[r.clone()].iter_mut().zip(&picked) {
                    *o = first + u64::from(i);
                }
            }
        }
        at += n;
    }
    unknown_ids
}

/// The smallest and largest T1 of a chunk.
fn chunk_span(c: &rocemesh_formats::record::ArchivedProbeColumns) -> (u64, u64) {
    c.t1_unix_ns.iter().fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t.to_native()), hi.max(t.to_native())))
}

/// A file's chunks, each with how many of its records were planned: the first `planned` of
/// the file. A file that grew since its plan (an open segment an agent still appends to) is
/// read as planned, so that every pass over a plan's ranges sees the same records.
fn planned_chunks(
    reader: &SegmentReader,
    planned: usize,
) -> impl Iterator<Item = (&rocemesh_formats::record::ArchivedProbeColumns, usize)> {
    let mut left = planned;
    reader.probe_chunks().map_while(move |c| {
        if left == 0 {
            return None;
        }
        let keep = c.len().min(left);
        left -= keep;
        Some((c, keep))
    })
}

/// Planned records of a file (see [`planned_chunks`]) with T1 in `[from, to)`.
fn records_in(reader: &SegmentReader, from: u64, to: u64, planned: usize) -> usize {
    planned_chunks(reader, planned)
        .map(|(c, keep)| c.t1_unix_ns[..keep].iter().filter(|t| within(t.to_native(), from, to)).count())
        .sum()
}

/// Whether `t` is in the range `[from, to)`, `to = u64::MAX` included (see [`Plan::ranges`]).
fn within(t: u64, from: u64, to: u64) -> bool {
    t >= from && (t < to || to == u64::MAX)
}

/// What a file says about the agent that wrote it: `t1` are its records' send times, `first_prober`
/// the fleet id of its first record's prober (who wrote it, when the dictionary does not say).
fn agent_file(
    reader: &SegmentReader,
    t1: &[u64],
    first_prober: Option<u32>,
    rnic_ids: &HashMap<String, u32>,
) -> AgentFile {
    let id = reader.identity();
    let rnic = writer_rnic(id, first_prober, rnic_ids);
    let gaps = send_gaps(t1);
    let (first_ns, last_ns) = reader.time_range().unwrap_or((0, 0));
    AgentFile {
        rnic,
        agent_epoch: id.agent_epoch,
        first_ns,
        last_ns,
        records: t1.len() as u64,
        long_gaps: gaps.long,
        median_gap_ns: gaps.median_ns,
    }
}

/// The fleet id of a file's writer: its own endpoint by name, else `first_prober` (the fleet id
/// of the file's first record's prober).
fn writer_rnic(identity: &WriterIdentity, first_prober: Option<u32>, rnic_ids: &HashMap<String, u32>) -> u32 {
    let name = format!("{}/{}", identity.host, identity.device);
    rnic_ids.get(&name).copied().unwrap_or_else(|| first_prober.unwrap_or(u32::MAX))
}

/// A service's prober is the writer of the files that define it: the first such file's, `rnic`.
fn claim_services(ds: &mut Dataset, m: &Remap, rnic: u32) {
    for &s in m.service.iter().filter(|&&s| s != NO_SERVICE) {
        let svc = &mut ds.services[s as usize];
        if svc.prober == u32::MAX {
            svc.prober = rnic;
        }
    }
}

/// The problem of a file whose records name `n` ids its dictionary does not define, if any.
fn unknown_ids_problem(path: &std::path::Path, n: u64) -> Option<FileProblem> {
    (n > 0).then(|| FileProblem {
        path: path.to_path_buf(),
        problem: format!("{n} probe records name an RNIC id its dictionary does not define: counted as {UNKNOWN_RNIC}"),
        skipped: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_hold_whole_windows_up_to_the_budget() {
        let w = 30_000_000_000u64;
        let plan = |counts: &[(u64, u64)]| Plan {
            ds: Dataset::default(),
            files: Vec::new(),
            fields: Fields::Report,
            unknown_ids: Vec::new(),
            window_ns: w,
            carried: Vec::new(),
            per_window: counts.iter().copied().collect(),
            read_records: 0,
            indexed: false,
            traces: None,
        };
        // 10 and 11 fit in 10 records; 12 holds 20 alone (a window is never split); 13 is empty.
        let p = plan(&[(10, 5), (11, 5), (12, 20), (14, 1)]);
        assert_eq!(p.ranges(10), vec![(10 * w, 12 * w), (12 * w, 13 * w), (14 * w, 15 * w)]);
        assert_eq!(p.ranges(1 << 20), vec![(10 * w, 15 * w)]);
        // A T1 at the top of the clock (a corrupt record) ends its range at u64::MAX, included.
        let top = u64::MAX / w;
        assert_eq!(plan(&[(top, 1)]).ranges(10), vec![(top * w, u64::MAX)]);
        assert!(within(u64::MAX, top * w, u64::MAX) && !within(5, 6, 9) && within(8, 6, 9) && !within(9, 6, 9));
    }

    #[test]
    fn a_path_that_changed_is_the_one_in_force_at_the_time_asked() {
        // A prober restarted at t = 100 s: its label 7 left from a new port, over another spine.
        // Reproduces the Clos run in which every window before the restart voted on the new path.
        let mut ds = Dataset::default();
        let key = (0, 1, 7);
        ds.paths.insert(key, vec![0, 3, 2]);
        ds.path_changes.insert(key, vec![(10_000_000_000, vec![0, 1, 2]), (100_000_000_000, vec![0, 3, 2])]);
        assert_eq!(ds.path_at(&key, 5_000_000_000), Some(&vec![0, 1, 2]), "before the first trace: the first");
        assert_eq!(ds.path_at(&key, 99_999_999_999), Some(&vec![0, 1, 2]));
        assert_eq!(ds.path_at(&key, 100_000_000_000), Some(&vec![0, 3, 2]));
        assert_eq!(ds.path_at(&key, u64::MAX), Some(&vec![0, 3, 2]));
        // A key that never changed is its one path; an untraced one has none.
        ds.paths.insert((1, 0, 7), vec![2, 1, 0]);
        assert_eq!(ds.path_at(&(1, 0, 7), 0), Some(&vec![2, 1, 0]));
        assert_eq!(ds.path_at(&(5, 0, 7), 0), None);
    }
}
