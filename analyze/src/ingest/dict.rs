//! Dictionaries: each file's endpoint ids mapped to fleet-wide ones ([`Merger`], [`Remap`]),
//! RNICs named by what their agent wrote, services resolved to their remote RNIC in
//! [`crate::ingest::Resolution`]'s order, and a path trace's `Peer` resolved to the RNIC that
//! declared its address. Done once per dictionary entry, so the per-record copy stays a lookup.

use super::model::{AgentFile, Dataset, FileProblem, NO_SERVICE, Resolution, Rnic, Service, UNKNOWN_RNIC, gid_name};
use rocemesh_formats::gid::gid_bytes;
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::record::{Endpoint, EndpointRole};
use rocemesh_formats::segment::{SegmentReader, WriterIdentity, send_gaps};
use std::collections::HashMap;

/// The fleet-wide ids, built from the files' dictionaries one file at a time, in file order
/// (the first file to name an RNIC gives its id).
pub(super) struct Merger<'i> {
    pub(super) rnic_ids: HashMap<String, u32>,
    pub(super) switch_ids: HashMap<String, u32>,
    pub(super) service_ids: HashMap<String, u32>,
    /// The ToR each service's entry gave its remote end, by service id.
    pub(super) service_tors: Vec<String>,
    /// RNIC entries' non-zero addresses (the first name seen for each), for resolving services
    /// and peers; and the address each writer declares for itself, which a peer prefers.
    pub(super) rnic_by_addr: HashMap<[u8; 16], u32>,
    pub(super) own_by_addr: HashMap<[u8; 16], u32>,
    pub(super) switch_by_addr: HashMap<[u8; 16], &'i str>,
}

impl<'i> Merger<'i> {
    pub(super) fn new(inventory: Option<&'i Inventory>) -> Self {
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
    pub(super) fn add(&mut self, ds: &mut Dataset, identity: &WriterIdentity, dict: &[Endpoint]) -> Remap {
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
                // Path placement may have named switches too (a trace's end ToRs).
                let id = *self.switch_ids.entry(name.to_owned()).or_insert_with(|| ds.switch_id(name));
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
    pub(super) fn finish(
        mut self,
        ds: &mut Dataset,
        remaps: &mut [Remap],
        inventory: Option<&Inventory>,
    ) -> HashMap<String, u32> {
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

/// [`Remap::switch`] of a switch entry whose address the inventory does not map.
pub(super) const UNMAPPED: u32 = u32::MAX - 1;
/// [`Remap::peer`] of a peer entry whose address nothing resolves to an RNIC.
pub(super) const UNRESOLVED_PEER: u32 = u32::MAX - 1;

/// The RNIC a peer entry's address stands for (see the module documentation), defining it
/// from the inventory when no dictionary named it; `None` when nothing declares the address.
pub(super) fn resolve_peer(
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
pub(super) struct InventoryRnics {
    pub(super) by_addr: HashMap<[u8; 16], (String, String)>,
    pub(super) tor: HashMap<String, String>,
}

impl InventoryRnics {
    pub(super) fn of(inventory: Option<&Inventory>) -> InventoryRnics {
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
pub(super) struct Remap {
    /// As a prober: RNIC entries only (a service entry is no prober).
    pub(super) prober: Vec<u32>,
    /// As a target: RNIC entries, and service entries as their remote RNIC.
    pub(super) target: Vec<u32>,
    /// Switch entries; [`UNMAPPED`] for one whose address the inventory does not map.
    pub(super) switch: Vec<u32>,
    /// Service entries' service ids ([`NO_SERVICE`] elsewhere); empty when the file has none.
    pub(super) service: Vec<u32>,
    /// Peer entries' RNICs ([`UNRESOLVED_PEER`] when nothing declares the address, `u32::MAX`
    /// for other entries); empty when the file has none. Used for path traces only: no probe
    /// targets a peer.
    pub(super) peer: Vec<u32>,
    /// The addresses of unmapped switch entries and of peer entries, by dictionary id.
    pub(super) addrs: HashMap<u32, [u8; 16]>,
}

/// The fleet id of the RNIC `name`, defining it (with `tor`) on first sight. A dictionary may
/// name an RNIC without its ToR (agents know only their own): the RNIC's own files, or any entry
/// that has one, fill it in.
pub(super) fn rnic_id(rnics: &mut Vec<Rnic>, ids: &mut HashMap<String, u32>, name: &str, tor: &str) -> u32 {
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
pub(super) fn resolve_services(
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

/// What a file says about the agent that wrote it: `t1` are its records' send times, `first_prober`
/// the fleet id of its first record's prober (who wrote it, when the dictionary does not say).
pub(super) fn agent_file(
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
pub(super) fn writer_rnic(
    identity: &WriterIdentity,
    first_prober: Option<u32>,
    rnic_ids: &HashMap<String, u32>,
) -> u32 {
    let name = format!("{}/{}", identity.host, identity.device);
    rnic_ids.get(&name).copied().unwrap_or_else(|| first_prober.unwrap_or(u32::MAX))
}

/// A service's prober is the writer of the files that define it: the first such file's, `rnic`.
pub(super) fn claim_services(ds: &mut Dataset, m: &Remap, rnic: u32) {
    for &s in m.service.iter().filter(|&&s| s != NO_SERVICE) {
        let svc = &mut ds.services[s as usize];
        if svc.prober == u32::MAX {
            svc.prober = rnic;
        }
    }
}

/// The problem of a file whose records name `n` ids its dictionary does not define, if any.
pub(super) fn unknown_ids_problem(path: &std::path::Path, n: u64) -> Option<FileProblem> {
    (n > 0).then(|| FileProblem {
        path: path.to_path_buf(),
        problem: format!("{n} probe records name an RNIC id its dictionary does not define: counted as {UNKNOWN_RNIC}"),
        skipped: false,
    })
}
