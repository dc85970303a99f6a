//! `ctl gen-pinglists`: one pinglist per host from the inventory.
//!
//! **ToR-mesh.** Every RNIC probes every other RNIC under its own ToR (with several RNICs per
//! host, each local RNIC probes the others under *its* ToR).
//!
//! **Inter-ToR.** ToRs are grouped into *planes*: one per rail on a rail-optimised fabric
//! (cross-rail RDMA traffic does not exist there, so probing it would test paths no job uses),
//! else one plane of all ToRs; `cross_rail` makes one plane of a rail-optimised fabric too.
//! Within a plane of T ToRs, the ToRs are put on a ring in a seeded random order, fixed for the
//! seed. A pair of ToRs is covered when either probes the other, so the ring distances
//! 1..=H with H = ⌊T/2⌋ cover every pair; they are cut into B = ⌈H/K⌉ *blocks* of K distances
//! (the last block topped up with other distances so that every RNIC always has K peers). In
//! generation g, RNIC j (in name order) of a ToR with R RNICs probes, through block
//! `(phase + g·R + j) mod B`, one RNIC in each of the K ToRs at those distances. A ToR's RNICs
//! thus take R consecutive blocks per generation and the next generation continues where this
//! one stopped: **every ToR pair of a plane is probed in any ⌈B/R_min⌉ consecutive
//! generations** (R_min: the fewest RNICs under a ToR of that plane), in a single generation
//! once ToRs hold at least B RNICs. Which RNIC of the far ToR is probed rotates with the
//! generation, so all RNIC pairs of a ToR pair are sampled over time.
//!
//! **Flow labels.** Each inter-ToR target gets n labels, n from the coverage formula
//! ([`labels_for_coverage`]) for m ECMP paths and probability p. Labels are drawn per
//! (seed, prober, target), not per generation: a pair probed again keeps its labels, so that
//! `ctl diff` shows only real changes and agents keep their address handles (cached per GID
//! and label). They are drawn so that no two labels of one target give the same RoCEv2 UDP
//! source port
//! (`((fl & 0x3FFF) ^ (fl >> 14)) | 0xC000`): switches hash the port, not the label, and two
//! labels with one port are one path, which would quietly lower the coverage.
//!
//! **Determinism.** Everything is a function of the inventory, the options, the seed and the
//! generation; RNIC order comes from names, not positions in the inventory file, and all
//! randomness from [`crate::rng`]. Same inputs, byte-identical files.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::pinglist::{
    self, MAX_FLOW_LABEL, MAX_RATE_PPS_PER_TARGET, MAX_TARGETS, MAX_TIMEOUT_MS, Pinglist, ProbeKind, Target,
};

use crate::error::{Error, host_name_problem};
use crate::import::natural_cmp;
use crate::rng::{self, Derivation, SplitMix64};

/// ToR-mesh probes per second per target (rpingmesh's cap).
pub const DEFAULT_TOR_MESH_RATE_PPS: f64 = 10.0;
/// Inter-ToR probes per second per target (rpingmesh's cap).
pub const DEFAULT_INTER_TOR_RATE_PPS: f64 = 1.0;
/// Other ToRs each RNIC probes per generation (rpingmesh samples 5).
pub const DEFAULT_INTER_TOR_PEERS: usize = 5;
/// Probability that an inter-ToR target's labels cover all ECMP paths.
pub const DEFAULT_COVERAGE_PROBABILITY: f64 = 0.99;
/// ECMP paths assumed when the inventory declares no spines.
pub const DEFAULT_ECMP_PATHS: u32 = 4;
/// The number of distinct RoCEv2 UDP source ports a flow label can select (14 bits).
pub const MAX_DISTINCT_PATH_LABELS: usize = 1 << 14;

/// How to generate; everything but the generation number and time.
#[derive(Debug, Clone, PartialEq)]
pub struct GenOptions {
    /// Seeds the ToR rings, the RNIC rotation and the flow labels.
    pub seed: u64,
    /// K: other ToRs each RNIC probes per generation.
    pub inter_tor_peers: usize,
    /// m: equal-cost paths between two ToRs; `None` = the inventory's spines, or
    /// [`DEFAULT_ECMP_PATHS`] without spines.
    pub ecmp_paths: Option<u32>,
    /// p: probability that one target's labels cover all m paths.
    pub coverage_probability: f64,
    pub tor_mesh_rate_pps: f64,
    pub inter_tor_rate_pps: f64,
    /// Labels per ToR-mesh target (one ToR, one path: 1 unless the ToR has bonded uplinks).
    pub tor_mesh_flow_labels: usize,
    /// Responder port written into every target: the agent's UDP port, and the RDMA CM service
    /// port it resolves the UD QPN through (see docs/design/agent.md#ctl-and-agent-restarts).
    pub probe_port: Option<u16>,
    pub timeout_ms: u32,
    /// Probe between rails of a rail-optimised fabric as if it were one plane.
    pub cross_rail: bool,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            seed: 0,
            inter_tor_peers: DEFAULT_INTER_TOR_PEERS,
            ecmp_paths: None,
            coverage_probability: DEFAULT_COVERAGE_PROBABILITY,
            tor_mesh_rate_pps: DEFAULT_TOR_MESH_RATE_PPS,
            inter_tor_rate_pps: DEFAULT_INTER_TOR_RATE_PPS,
            tor_mesh_flow_labels: 1,
            probe_port: None,
            timeout_ms: pinglist::DEFAULT_TIMEOUT_MS,
            cross_rail: false,
        }
    }
}

/// n = ⌈ln(1 − p^(1/m)) / ln((m−1)/m)⌉: labels so that m equal ECMP paths are all taken with
/// probability p (each label a uniform path; the m "path missed" events treated as
/// independent, which can make n short of the exact figure: by one label for p = 0.9 and some
/// m, by none for p ≥ 0.99 and m ≤ 32; the tests compare it with inclusion-exclusion). m = 1 needs one label. Both logarithms are computed without
/// cancellation (`exp_m1`, `ln_1p`), because p^(1/m) is close to 1.
pub fn labels_for_coverage(ecmp_paths: u32, probability: f64) -> usize {
    if ecmp_paths <= 1 {
        return 1;
    }
    let m = f64::from(ecmp_paths);
    let miss_all = -(probability.ln() / m).exp_m1(); // 1 - p^(1/m)
    let n = (miss_all.ln() / (-1.0 / m).ln_1p()).ceil();
    n.max(1.0) as usize
}

/// The RoCEv2 UDP source port mlx5 derives from a flow label, minus its fixed top bits.
pub fn source_port_bits(label: u32) -> u16 {
    ((label & 0x3FFF) ^ ((label & 0xF_C000) >> 14)) as u16
}

/// Coverage of one plane (a rail, or the whole fabric).
#[derive(Debug, Clone, PartialEq)]
pub struct PlaneCoverage {
    /// The rail, on a rail-optimised fabric probed per rail.
    pub rail: Option<u16>,
    /// ToRs with at least one RNIC.
    pub tors: usize,
    /// Other ToRs each RNIC probes per generation (K, at most tors − 1).
    pub peers_per_rnic: usize,
    /// B: blocks of ring distances.
    pub blocks: usize,
    /// Fewest RNICs under one of the plane's ToRs.
    pub min_rnics_per_tor: usize,
    /// Every ToR pair of the plane is probed in any this many consecutive generations.
    pub generations: u64,
}

/// What a generation covers, and with which parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Coverage {
    /// m.
    pub ecmp_paths: u32,
    /// Whether m came from the inventory's spines.
    pub ecmp_paths_from_spines: bool,
    /// p.
    pub coverage_probability: f64,
    /// n for inter-ToR targets.
    pub inter_tor_flow_labels: usize,
    pub planes: Vec<PlaneCoverage>,
    /// N: every ToR pair within every plane is probed in any N consecutive generations.
    pub generations_to_cover: u64,
    /// Highest probe rate one RNIC sends, over all its targets.
    pub max_rnic_rate_pps: f64,
}

struct RnicInfo {
    device: String,
    name: String,
    /// `mix(name_hash(name))`, the RNIC's part of its pairs' label seeds.
    name_mix: u64,
    addr: IpAddr,
    tor: usize,
    /// Index among its ToR's RNICs (name order).
    pos: usize,
}

struct TorInfo {
    name: String,
    name_hash: u64,
    rnics: Vec<usize>,
    /// Plane and ring position, for ToRs with RNICs.
    ring: Option<(usize, usize)>,
}

struct Plane {
    ring: Vec<usize>,
    blocks: Vec<Vec<usize>>,
    phase: u64,
}

/// The inventory indexed for generation; [`Generator::generate`] makes one generation.
pub struct Generator {
    opts: GenOptions,
    /// The label seeds' common prefix, by `ProbeKind::as_u8` (ToR-mesh, inter-ToR, service).
    label_seeds: [Derivation; 3],
    inter_tor_labels: usize,
    rnics: Vec<RnicInfo>,
    tors: Vec<TorInfo>,
    planes: Vec<Plane>,
    /// Host names in output order, each with its RNICs in device order.
    hosts: Vec<(String, Vec<usize>)>,
    /// Every host, device and RNIC name can be written unescaped (see
    /// [`Generator::render_toml`]); inventory names always can.
    plain_names: bool,
    coverage: Coverage,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator").field("hosts", &self.hosts.len()).field("coverage", &self.coverage).finish()
    }
}

thread_local! {
    /// One target's flow labels while [`Generator::render_toml`] writes them.
    static LABELS: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

const TAG_TOR_RING: u64 = 1;
const TAG_ROTATION: u64 = 2;
const TAG_LABELS: u64 = 3;
const TAG_PHASE: u64 = 4;

impl Generator {
    /// Indexes `inventory` (already validated by the format) and checks `opts`.
    pub fn new(inventory: &Inventory, opts: &GenOptions) -> Result<Generator, Error> {
        check_options(opts)?;
        let (ecmp_paths, from_spines) = resolve_ecmp_paths(inventory, opts);
        let inter_tor_labels = inter_tor_flow_labels(ecmp_paths, opts)?;
        let mut tors = tor_infos(inventory);
        let mut rnics = Vec::new();
        let hosts = index_hosts(inventory, &mut tors, &mut rnics)?;
        rank_tor_rnics(&mut tors, &mut rnics);
        let (planes, plane_coverage) = build_planes(inventory, opts, &mut tors);
        let max_rnic_rate_pps = check_targets_and_max_rate(&hosts, &rnics, &tors, &planes, opts)?;
        let generations_to_cover = plane_coverage.iter().map(|p| p.generations).max().unwrap_or(0);
        let coverage = Coverage {
            ecmp_paths,
            ecmp_paths_from_spines: from_spines,
            coverage_probability: opts.coverage_probability,
            inter_tor_flow_labels: inter_tor_labels,
            planes: plane_coverage,
            generations_to_cover,
            max_rnic_rate_pps,
        };
        let label_seeds = std::array::from_fn(|kind| Derivation::new(&[opts.seed, TAG_LABELS, kind as u64]));
        let plain_names = hosts.iter().all(|(h, _)| pinglist::is_plain(h))
            && rnics.iter().all(|r| pinglist::is_plain(&r.device) && pinglist::is_plain(&r.name))
            && tors.iter().all(|t| pinglist::is_plain(&t.name));
        Ok(Generator {
            opts: opts.clone(),
            label_seeds,
            inter_tor_labels,
            rnics,
            tors,
            planes,
            hosts,
            plain_names,
            coverage,
        })
    }

    /// What every generation covers.
    pub fn coverage(&self) -> &Coverage {
        &self.coverage
    }

    /// Number of pinglists a generation has (one per host).
    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// The pinglist of the `i`-th host in name order (`i < self.hosts()`). Writing a whole
    /// generation does not build pinglists: see [`Generator::render_toml`].
    pub fn pinglist(&self, i: usize, generation: u64, generated_unix_ns: u64) -> Pinglist {
        let mut out = empty_pinglist();
        self.pinglist_into(i, generation, generated_unix_ns, &mut out);
        out
    }

    /// [`Generator::pinglist`] into `out`, whatever it held before: its strings and vectors
    /// are reused, so that a caller building thousands of pinglists one after another
    /// allocates for the first few only.
    pub fn pinglist_into(&self, i: usize, generation: u64, generated_unix_ns: u64, out: &mut Pinglist) {
        let (host, own) = &self.hosts[i];
        self.build_into(host, own, generation, generated_unix_ns, out);
    }

    /// All pinglists of `generation`, sorted by host name; built on all cores.
    pub fn generate(&self, generation: u64, generated_unix_ns: u64) -> Vec<Pinglist> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(self.hosts.len().max(1));
        let chunk = self.hosts.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .hosts
                .chunks(chunk)
                .map(|hosts| {
                    s.spawn(move || {
                        hosts
                            .iter()
                            .map(|(host, own)| {
                                let mut out = empty_pinglist();
                                self.build_into(host, own, generation, generated_unix_ns, &mut out);
                                out
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
        })
    }

    /// The `i`-th host's pinglist as TOML, appended to `text` and its host name to `host`:
    /// the bytes of [`Generator::pinglist`] written by `Pinglist::write_toml`, without building
    /// the pinglist (copying two names into each of 3.6 M targets and then out again was a
    /// third of writing a 100,000-host generation).
    pub fn render_toml(
        &self,
        i: usize,
        generation: u64,
        generated_unix_ns: u64,
        text: &mut String,
        host: &mut String,
    ) -> Result<(), Error> {
        let (name, own) = &self.hosts[i];
        host.push_str(name);
        if !self.plain_names {
            let p = self.pinglist(i, generation, generated_unix_ns);
            return crate::pinglist_dir::serialise_into(&p, text);
        }
        pinglist::write_toml_header(text, pinglist::VERSION, name, generation, generated_unix_ns, self.opts.timeout_ms);
        LABELS.with_borrow_mut(|labels| {
            self.each_target(own, generation, |me, peer, kind| {
                let to = &self.rnics[peer];
                let rate_pps = self.target_labels(me, to, kind, labels);
                let qpn = self.opts.probe_port.map(|_| 0);
                pinglist::write_toml_target(
                    text,
                    &me.device,
                    &to.name,
                    &self.tors[to.tor].name,
                    kind,
                    to.addr,
                    self.opts.probe_port,
                    qpn,
                    rate_pps,
                    labels,
                );
            });
        });
        Ok(())
    }

    /// Targets in one generation, over all hosts.
    pub fn targets(&self) -> usize {
        self.hosts.iter().map(|(_, own)| self.target_count(own)).sum()
    }

    fn target_count(&self, own: &[usize]) -> usize {
        own.iter()
            .map(|&r| {
                let tor = &self.tors[self.rnics[r].tor];
                let inter = tor.ring.map_or(0, |(p, _)| self.planes[p].blocks.first().map_or(0, Vec::len));
                tor.rnics.len() - 1 + inter
            })
            .sum()
    }

    fn build_into(&self, host: &str, own: &[usize], generation: u64, generated_unix_ns: u64, out: &mut Pinglist) {
        out.version = pinglist::VERSION;
        host.clone_into(&mut out.host);
        out.generation = generation;
        out.generated_unix_ns = generated_unix_ns;
        out.timeout_ms = self.opts.timeout_ms;
        let count = self.target_count(own);
        out.targets.reserve(count.saturating_sub(out.targets.len()));
        let mut n = 0;
        self.each_target(own, generation, |me, peer, kind| {
            self.set_target(&mut out.targets, n, me, peer, kind);
            n += 1;
        });
        out.targets.truncate(n);
    }

    /// Calls `f(me, peer, kind)` for each target of a host with the RNICs `own`, in file order.
    fn each_target(&self, own: &[usize], generation: u64, mut f: impl FnMut(&RnicInfo, usize, ProbeKind)) {
        for &r in own {
            let me = &self.rnics[r];
            let tor = &self.tors[me.tor];
            for &peer in &tor.rnics {
                if peer != r {
                    f(me, peer, ProbeKind::TorMesh);
                }
            }
            let Some((p, ring_pos)) = tor.ring else { continue };
            let plane = &self.planes[p];
            if plane.blocks.is_empty() {
                continue;
            }
            let b = plane.blocks.len() as u128;
            let block =
                (u128::from(plane.phase) + u128::from(generation) * tor.rnics.len() as u128 + me.pos as u128) % b;
            for &distance in &plane.blocks[block as usize] {
                let far = &self.tors[plane.ring[(ring_pos + distance) % plane.ring.len()]];
                let rotation = rng::derive(&[self.opts.seed, TAG_ROTATION, generation, tor.name_hash, far.name_hash]);
                let pick = (me.pos as u64).wrapping_add(rotation) % far.rnics.len() as u64;
                f(me, far.rnics[pick as usize], ProbeKind::InterTor);
            }
        }
    }

    /// The flow labels of `me` → `to` into `labels`; returns the target's rate.
    fn target_labels(&self, me: &RnicInfo, to: &RnicInfo, kind: ProbeKind, labels: &mut Vec<u32>) -> f64 {
        let (n, rate_pps) = match kind {
            ProbeKind::InterTor => (self.inter_tor_labels, self.opts.inter_tor_rate_pps),
            _ => (self.opts.tor_mesh_flow_labels, self.opts.tor_mesh_rate_pps),
        };
        // derive(&[seed, TAG_LABELS, kind, name_hash(me), name_hash(to)]), without refolding
        // the prefix and remixing the names for each of millions of targets.
        let seed = self.label_seeds[usize::from(kind.as_u8())].then_mixed(me.name_mix).then_mixed(to.name_mix).value();
        flow_labels_into(seed, n, labels);
        rate_pps
    }

    /// Makes `targets[n]` the target `me` → `peer`, overwriting the slot when there is one.
    fn set_target(&self, targets: &mut Vec<Target>, n: usize, me: &RnicInfo, peer: usize, kind: ProbeKind) {
        let to = &self.rnics[peer];
        if n == targets.len() {
            targets.push(Target {
                from: String::new(),
                to: String::new(),
                tor: String::new(),
                kind,
                addr: to.addr,
                port: None,
                qpn: None,
                rate_pps: 0.0,
                flow_labels: Vec::new(),
            });
        }
        let t = &mut targets[n];
        me.device.clone_into(&mut t.from);
        to.name.clone_into(&mut t.to);
        self.tors[to.tor].name.clone_into(&mut t.tor);
        t.kind = kind;
        t.addr = to.addr;
        t.port = self.opts.probe_port;
        // 0: the agent resolves the responder's UD QPN at run time (RDMA CM service ID
        // resolution on `port`), so an agent restart does not wait for a new pinglist.
        t.qpn = self.opts.probe_port.map(|_| 0);
        t.rate_pps = self.target_labels(me, to, kind, &mut t.flow_labels);
    }
}

fn empty_pinglist() -> Pinglist {
    Pinglist {
        version: pinglist::VERSION,
        host: String::new(),
        generation: 0,
        generated_unix_ns: 0,
        timeout_ms: pinglist::DEFAULT_TIMEOUT_MS,
        targets: Vec::new(),
    }
}

/// Ring distances 1..=half in blocks of `k`; the last block is topped up with the smallest
/// other distances in 1..t so that each block has exactly `k` distinct distances.
fn distance_blocks(t: usize, half: usize, k: usize) -> Vec<Vec<usize>> {
    let mut blocks: Vec<Vec<usize>> = (1..=half).collect::<Vec<_>>().chunks(k).map(<[usize]>::to_vec).collect();
    if let Some(last) = blocks.last_mut() {
        let mut fill = 1..t;
        while last.len() < k {
            match fill.next() {
                Some(d) if !last.contains(&d) => last.push(d),
                Some(_) => {}
                None => break,
            }
        }
    }
    blocks
}

/// [`flow_labels_into`] a new vector.
#[cfg(test)]
fn flow_labels(seed: u64, n: usize) -> Vec<u32> {
    let mut labels = Vec::with_capacity(n);
    flow_labels_into(seed, n, &mut labels);
    labels
}

/// `n` distinct nonzero labels with pairwise distinct UDP source ports, from `seed`, into
/// `labels` (what it held is dropped, its capacity kept).
fn flow_labels_into(seed: u64, n: usize, labels: &mut Vec<u32>) {
    let mut rng = SplitMix64::new(seed);
    labels.clear();
    // Few labels: a linear scan beats clearing a 2 KiB bitmap per target.
    let mut used_ports: Option<Vec<u64>> = (n > 64).then(|| vec![0; MAX_DISTINCT_PATH_LABELS / 64]);
    while labels.len() < n {
        let label = (rng.next_u64() & u64::from(MAX_FLOW_LABEL)) as u32;
        if label == 0 {
            continue;
        }
        let port = source_port_bits(label);
        let fresh = match &mut used_ports {
            Some(bits) => {
                let (word, bit) = (usize::from(port) / 64, 1u64 << (port % 64));
                let fresh = bits[word] & bit == 0;
                bits[word] |= bit;
                fresh
            }
            None => !labels.iter().any(|&l| source_port_bits(l) == port),
        };
        if fresh {
            labels.push(label);
        }
    }
}

/// m, and whether it came from the inventory's spines: the option, else the spine count, else
/// [`DEFAULT_ECMP_PATHS`].
fn resolve_ecmp_paths(inventory: &Inventory, opts: &GenOptions) -> (u32, bool) {
    match opts.ecmp_paths {
        Some(m) => (m, false),
        None if !inventory.spines.is_empty() => (inventory.spines.len() as u32, true),
        None => (DEFAULT_ECMP_PATHS, false),
    }
}

/// n for inter-ToR targets; refused when more labels are needed than give distinct source ports.
fn inter_tor_flow_labels(ecmp_paths: u32, opts: &GenOptions) -> Result<usize, Error> {
    let inter_tor_labels = labels_for_coverage(ecmp_paths, opts.coverage_probability);
    if inter_tor_labels > MAX_DISTINCT_PATH_LABELS {
        return Err(Error::invalid(
            format!(
                "{ecmp_paths} ECMP paths at p = {} need {inter_tor_labels} flow labels; only {MAX_DISTINCT_PATH_LABELS} give distinct UDP source ports",
                opts.coverage_probability
            ),
            "lower --coverage-probability or --ecmp-paths",
        ));
    }
    Ok(inter_tor_labels)
}

/// The inventory's ToRs in its order, without RNICs or ring places yet.
fn tor_infos(inventory: &Inventory) -> Vec<TorInfo> {
    inventory
        .tors
        .iter()
        .map(|t| TorInfo { name: t.name.clone(), name_hash: rng::name_hash(&t.name), rnics: Vec::new(), ring: None })
        .collect()
}

/// Appends every host's RNICs to `rnics` and to their ToRs' lists; returns the hosts in output
/// order, each with its RNICs in device order.
fn index_hosts(
    inventory: &Inventory,
    tors: &mut [TorInfo],
    rnics: &mut Vec<RnicInfo>,
) -> Result<Vec<(String, Vec<usize>)>, Error> {
    let tor_ids: HashMap<&str, usize> = inventory.tors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let mut hosts = Vec::with_capacity(inventory.hosts.len());
    for host in &inventory.hosts {
        if let Some(problem) = host_name_problem(&host.name) {
            return Err(Error::invalid(problem, "rename the host in the inventory (`ctl inventory check` lists all)"));
        }
        let mut own = Vec::with_capacity(host.rnics.len());
        for r in &host.rnics {
            let Some(&tor) = tor_ids.get(r.tor.as_str()) else {
                return Err(Error::invalid(
                    format!(
                        "{}/{} is under ToR {:?}, which the inventory does not declare",
                        host.name, r.device, r.tor
                    ),
                    "load the inventory with Inventory::load, which refuses this",
                ));
            };
            let name = Inventory::rnic_name(&host.name, &r.device);
            let gid = r.gid_or_mapped();
            // The address the agent probes: the IP, unless an explicit GID is not the one
            // RoCEv2 derives from it (then only the GID reaches the port).
            let addr = if gid == rocemesh_formats::gid::gid_of(r.ip) { r.ip } else { IpAddr::V6(gid) };
            own.push(rnics.len());
            tors[tor].rnics.push(rnics.len());
            rnics.push(RnicInfo {
                device: r.device.clone(),
                name_mix: rng::mix(rng::name_hash(&name)),
                name,
                addr,
                tor,
                pos: 0,
            });
        }
        own.sort_by(|&a, &b| natural_cmp(&rnics[a].device, &rnics[b].device));
        hosts.push((host.name.clone(), own));
    }
    hosts.sort_by(|a, b| natural_cmp(&a.0, &b.0));
    Ok(hosts)
}

/// Puts each ToR's RNICs in name order and gives every RNIC its index there
/// ([`RnicInfo::pos`]).
fn rank_tor_rnics(tors: &mut [TorInfo], rnics: &mut [RnicInfo]) {
    for tor in tors.iter_mut() {
        tor.rnics.sort_by(|&a, &b| natural_cmp(&rnics[a].name, &rnics[b].name));
        for (pos, &r) in tor.rnics.iter().enumerate() {
            rnics[r].pos = pos;
        }
    }
}

/// The planes of the ToRs with RNICs, each a seeded ring, and what each covers; every such ToR
/// learns its plane and ring position.
fn build_planes(inventory: &Inventory, opts: &GenOptions, tors: &mut [TorInfo]) -> (Vec<Plane>, Vec<PlaneCoverage>) {
    // Planes: one per rail, or one for all; ToRs in name order before the seeded shuffle,
    // so that the ring does not depend on the order of the inventory file.
    let mut by_plane: BTreeMap<Option<u16>, Vec<usize>> = BTreeMap::new();
    let per_rail = !opts.cross_rail && inventory.tors.iter().all(|t| t.rail.is_some()) && !inventory.tors.is_empty();
    for (i, t) in inventory.tors.iter().enumerate() {
        if !tors[i].rnics.is_empty() {
            by_plane.entry(if per_rail { t.rail } else { None }).or_default().push(i);
        }
    }
    let mut planes = Vec::new();
    let mut plane_coverage = Vec::new();
    for (rail, mut ring) in by_plane {
        ring.sort_by(|&a, &b| natural_cmp(&inventory.tors[a].name, &inventory.tors[b].name));
        let plane_key = rail.map_or(u64::MAX, u64::from);
        let mut shuffle = SplitMix64::new(rng::derive(&[opts.seed, TAG_TOR_RING, plane_key]));
        for i in (1..ring.len()).rev() {
            ring.swap(i, shuffle.below(i as u64 + 1) as usize);
        }
        let (plane, coverage) = plane_on_ring(rail, plane_key, ring, planes.len(), opts, tors);
        plane_coverage.push(coverage);
        planes.push(plane);
    }
    (planes, plane_coverage)
}

/// Plane number `index` over `ring` (ToRs in ring order): its distance blocks and phase, and what
/// it covers; marks each of its ToRs with its ring position.
fn plane_on_ring(
    rail: Option<u16>,
    plane_key: u64,
    ring: Vec<usize>,
    index: usize,
    opts: &GenOptions,
    tors: &mut [TorInfo],
) -> (Plane, PlaneCoverage) {
    let t = ring.len();
    let k = opts.inter_tor_peers.min(t.saturating_sub(1));
    let half = t / 2;
    let blocks = if k == 0 { Vec::new() } else { distance_blocks(t, half, k) };
    let min_rnics = ring.iter().map(|&x| tors[x].rnics.len()).min().unwrap_or(0);
    let generations = if blocks.is_empty() {
        0
    } else {
        ring.iter().map(|&x| blocks.len().div_ceil(tors[x].rnics.len()) as u64).max().unwrap_or(0)
    };
    let phase = rng::derive(&[opts.seed, TAG_PHASE, plane_key]);
    for (pos, &x) in ring.iter().enumerate() {
        tors[x].ring = Some((index, pos));
    }
    let coverage = PlaneCoverage {
        rail,
        tors: t,
        peers_per_rnic: k,
        blocks: blocks.len(),
        min_rnics_per_tor: min_rnics,
        generations,
    };
    (Plane { ring, blocks, phase }, coverage)
}

/// Refuses a host with more targets than a pinglist holds; returns the highest probe rate one
/// RNIC sends, over all its targets.
fn check_targets_and_max_rate(
    hosts: &[(String, Vec<usize>)],
    rnics: &[RnicInfo],
    tors: &[TorInfo],
    planes: &[Plane],
    opts: &GenOptions,
) -> Result<f64, Error> {
    let mut max_rnic_rate_pps: f64 = 0.0;
    for (host, own) in hosts {
        let mut targets = 0;
        for &r in own {
            let tor = &tors[rnics[r].tor];
            let mesh = tor.rnics.len() - 1;
            let inter = tor.ring.map_or(0, |(p, _)| planes[p].blocks.first().map_or(0, Vec::len));
            targets += mesh + inter;
            let rate = mesh as f64 * opts.tor_mesh_rate_pps + inter as f64 * opts.inter_tor_rate_pps;
            max_rnic_rate_pps = max_rnic_rate_pps.max(rate);
        }
        if targets > MAX_TARGETS {
            return Err(Error::invalid(
                format!("host {host:?} would have {targets} targets; a pinglist holds at most {MAX_TARGETS}"),
                "lower --inter-tor-peers, or split the host's ToR",
            ));
        }
    }
    Ok(max_rnic_rate_pps)
}

fn check_options(opts: &GenOptions) -> Result<(), Error> {
    let p = opts.coverage_probability;
    if !(p > 0.0 && p < 1.0) {
        return Err(Error::invalid(
            format!("coverage probability {p} is not strictly between 0 and 1"),
            "use e.g. --coverage-probability 0.99 (1 would need infinitely many labels)",
        ));
    }
    if opts.ecmp_paths == Some(0) {
        return Err(Error::invalid("0 ECMP paths", "use the number of spines (equal-cost paths), at least 1"));
    }
    for (name, rate) in
        [("--tor-mesh-rate-pps", opts.tor_mesh_rate_pps), ("--inter-tor-rate-pps", opts.inter_tor_rate_pps)]
    {
        if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE_PPS_PER_TARGET) {
            return Err(Error::invalid(
                format!("{name} {rate} is outside (0, {MAX_RATE_PPS_PER_TARGET}]"),
                "use a positive rate within the pinglist format's per-target cap",
            ));
        }
    }
    if !(1..=MAX_DISTINCT_PATH_LABELS).contains(&opts.tor_mesh_flow_labels) {
        return Err(Error::invalid(
            format!("{} ToR-mesh flow labels", opts.tor_mesh_flow_labels),
            format!("use 1..={MAX_DISTINCT_PATH_LABELS}"),
        ));
    }
    if !(1..=MAX_TIMEOUT_MS).contains(&opts.timeout_ms) {
        return Err(Error::invalid(
            format!("timeout {} ms is outside 1..={MAX_TIMEOUT_MS}", opts.timeout_ms),
            "use a timeout the pinglist format accepts",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
