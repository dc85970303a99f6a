//! Path traces: the hops each trace names, mapped to inventory switches by address, else (for a
//! trace's first and last hop) to the endpoints' own ToRs where every trace agrees
//! ([`crate::hops::EndHops`]); traces with a hop nobody can name are left out and counted by
//! address ([`crate::ingest::UnmappedHop`]).

use super::dict::{Remap, UNMAPPED, UNRESOLVED_PEER};
use super::model::{Dataset, FileProblem, PathKey, TimedPath, UnmappedHop};
use crate::hops::EndHops;
use rocemesh_formats::gid::ip_of;
use rocemesh_formats::segment::SegmentReader;
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

/// Path traces (few: one per traced (pair, label)) into [`Dataset::paths`]. A trace toward a
/// service entry is the path to its remote RNIC, one toward a peer entry the path to the RNIC
/// that declares its address. A trace naming an id its file's dictionary lacks (or an RNIC where
/// a switch belongs), or ending at a peer nothing resolves, cannot be placed: it is left out and
/// the file reported. One through an unmapped hop is left out and counted in
/// [`Dataset::unmapped_hops`].
pub(super) fn place_paths(ds: &mut Dataset, readers: &[(PathBuf, SegmentReader)], remaps: &[Remap]) {
    let mut traces = PathTraces::default();
    for ((path, reader), m) in readers.iter().zip(remaps) {
        traces.add(&mut ds.problems, path, reader, m);
    }
    traces.place(ds);
}

/// Path traces gathered file by file, in any order, and placed once every file is in
/// ([`place_paths`]; a [`Plan`] gathers them as its first pass over the ranges opens each file).
#[derive(Debug, Default)]
pub(super) struct PathTraces {
    /// Traces by unmapped hop address.
    pub(super) unmapped: HashMap<[u8; 16], u64>,
    pub(super) history: HashMap<PathKey, Vec<TimedPath>>,
    /// Traces with a hop the inventory does not name, and each hop's address where it does not:
    /// placed once every RNIC's ToR is known, through what their ends teach.
    unnamed: Vec<Unnamed>,
}

impl PathTraces {
    /// One file's traces; what cannot be placed is said as the file's problem.
    pub(super) fn add(
        &mut self,
        problems: &mut Vec<FileProblem>,
        path: &std::path::Path,
        reader: &SegmentReader,
        m: &Remap,
    ) {
        let PathTraces { history, unnamed, .. } = self;
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
            let addrs: Vec<Option<[u8; 16]>> = p.hops[..n]
                .iter()
                .zip(&hops)
                .map(|(h, &id)| if id == UNMAPPED { m.addrs.get(&h.to_native()).copied() } else { None })
                .collect();
            let key = (src, dst, p.flow_label.to_native());
            if addrs.iter().any(Option::is_some) {
                unnamed.push(Unnamed { key, t: p.t_unix_ns.to_native(), hops, addrs, placed });
            } else if placed {
                history.entry(key).or_default().push((p.t_unix_ns.to_native(), hops));
            }
        }
        if undefined > 0 {
            problems.push(FileProblem {
                path: path.to_path_buf(),
                problem: format!("{undefined} path traces name ids its dictionary does not define: left out"),
                skipped: false,
            });
        }
        if to_unresolved > 0 {
            let addrs: Vec<String> = unresolved_addrs.into_iter().collect();
            problems.push(FileProblem {
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
    pub(super) fn place(self, ds: &mut Dataset) {
        let PathTraces { mut unmapped, mut history, unnamed } = self;
        let mut ends = EndHops::default();
        // A trace that cannot be placed (its target unknown) teaches nothing about its ends.
        for u in unnamed.iter().filter(|u| u.placed) {
            ends.see(&u.addrs, ds.tor_of_rnic(u.key.0), ds.tor_of_rnic(u.key.1));
        }
        let mut tor_ids: HashMap<String, u32> = HashMap::new();
        let mut used: std::collections::HashSet<[u8; 16]> = std::collections::HashSet::new();
        for Unnamed { key, t, mut hops, addrs, placed } in unnamed {
            if !placed || addrs.iter().flatten().any(|a| ends.tor_of(a).is_none()) {
                count_unmapped(&mut unmapped, addrs.iter().flatten().filter(|a| ends.tor_of(a).is_none()));
                continue;
            }
            used.extend(addrs.iter().flatten());
            for (hop, addr) in hops.iter_mut().zip(&addrs) {
                if let Some(name) = addr.as_ref().and_then(|a| ends.tor_of(a)) {
                    *hop = *tor_ids.entry(name.to_string()).or_insert_with(|| ds.switch_id(name));
                }
            }
            history.entry(key).or_default().push((t, hops));
        }
        ds.hops_learned = used.len();
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

/// A trace with a hop the inventory does not name ([`PathTraces::unnamed`]).
#[derive(Debug)]
struct Unnamed {
    key: PathKey,
    t: u64,
    /// Switch ids, [`UNMAPPED`] where `addrs` holds the hop's address.
    hops: Vec<u32>,
    addrs: Vec<Option<[u8; 16]>>,
    /// Both ends are known RNICs.
    placed: bool,
}

/// Each address once per trace, however often the trace crosses it.
fn count_unmapped<'a>(unmapped: &mut HashMap<[u8; 16], u64>, addrs: impl Iterator<Item = &'a [u8; 16]>) {
    let mut seen: Vec<[u8; 16]> = Vec::new();
    for addr in addrs {
        if !seen.contains(addr) {
            seen.push(*addr);
            *unmapped.entry(*addr).or_default() += 1;
        }
    }
}

/// An address as operators write it: IPv4 for an IPv4-mapped address.
pub(super) fn addr_text(addr: &[u8; 16]) -> String {
    ip_of(addr).to_string()
}
