//! `ctl inventory lldp`: the cabling as the switches' and hosts' LLDP tables see it, checked
//! against the inventory and written into it.
//!
//! Each table ([`Table`]) is one node's `lldpcli -f json show neighbors`, in a file named after
//! the node (`tor1.json`, `tor1-h0.json`). A neighbour is matched to the inventory by its
//! system name (or that name up to its first dot). From what the tables saw:
//!
//! - every ToR-spine link gets the interface at each end (`a_port`, `b_port`);
//! - every RNIC gets the ToR interface it is cabled to (`tor_port`). The RNIC is the one whose
//!   `netdev` the cable's host interface is (the local port of the host's own table, or the
//!   neighbour port id of a ToR's when lldpd sends interface names); else the one whose
//!   address the host advertised to the ToR; else the host's one RNIC under that ToR;
//! - every switch gets the management addresses its neighbours heard it advertise, added to its
//!   `addrs` (never removed: `ctl inventory switch-addrs` replaces a switch's list), so that
//!   path-trace hops answering from them are named without a hand-written map. Link-local,
//!   loopback and unspecified addresses are left out.
//!
//! Cabling that disagrees with the inventory is a [`Problem`] naming the table's file and line:
//! a cable between a ToR and a spine the inventory does not link (a ToR on the wrong spine), a
//! port other than the one the inventory gives (swapped cables), an RNIC seen under another
//! ToR than its `tor`, a declared link that no table read from either end shows, two tables
//! that disagree about one cable, and an address two switches (or a switch and an RNIC) claim.
//! What disagrees is not written; everything else is.

mod table;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rocemesh_formats::gid::gid_bytes;
use rocemesh_formats::inventory::Inventory;

pub use table::{Seen, Table};

/// Cabling that disagrees with the inventory, or tables that disagree with each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub what: String,
    pub fix: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        write!(f, ": {} (fix: {})", self.what, self.fix)
    }
}

/// The inventory with what the tables taught, and what they contradicted.
#[derive(Debug, Clone)]
pub struct Learned {
    pub inventory: Inventory,
    /// Link ends and RNIC ports set that the inventory did not have.
    pub link_ports: usize,
    pub rnic_ports: usize,
    /// Switch addresses added.
    pub addrs: usize,
    /// Links and RNICs still without a port after all the tables.
    pub links_unported: usize,
    pub rnics_unported: usize,
    pub problems: Vec<Problem>,
    /// Neighbours not in the inventory (servers' management ports, other fabrics): ignored.
    pub ignored: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tor,
    Spine,
    Host,
}

/// Where an observation came from, for problems.
#[derive(Debug, Clone)]
struct From {
    file: PathBuf,
    line: usize,
}

impl From {
    /// A problem found at this place of a table.
    fn problem(&self, what: impl Into<String>, fix: impl Into<String>) -> Problem {
        Problem { file: self.file.clone(), line: Some(self.line), what: what.into(), fix: fix.into() }
    }
}

/// A ToR-spine cable as one table saw it.
#[derive(Debug, Clone)]
struct CableSeen {
    tor: String,
    spine: String,
    tor_port: Option<String>,
    spine_port: Option<String>,
    from: From,
}

/// A host-ToR cable as one table saw it.
#[derive(Debug, Clone)]
struct HostSeen {
    host: String,
    tor: String,
    tor_port: Option<String>,
    /// The host's addresses, when the ToR's table carries them.
    addrs: Vec<IpAddr>,
    /// The host's interface on this cable, as the host's own table names its local port.
    local_if: Option<String>,
    /// The neighbour's port id in a ToR's table: the host's interface name, or its MAC
    /// (lldpd's default), so it can only pick, never rule out.
    peer_if: Option<String>,
    from: From,
}

/// Checks `inv` against `tables` and fills in what they teach.
pub fn apply(inv: &Inventory, inv_path: &Path, tables: &[Table]) -> Learned {
    let kinds = kinds(inv);
    let mut out = Learned {
        inventory: inv.clone(),
        link_ports: 0,
        rnic_ports: 0,
        addrs: 0,
        links_unported: 0,
        rnics_unported: 0,
        problems: Vec::new(),
        ignored: Vec::new(),
    };
    let mut cables = Vec::new();
    let mut hosts = Vec::new();
    let mut heard: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    for t in tables {
        let Some(&kind) = kinds.get(t.node.as_str()) else {
            out.problems.push(Problem {
                file: t.file.clone(),
                line: None,
                what: format!("no tor, spine or host is named {:?} in {}", t.node, inv_path.display()),
                fix: "name each table's file after the node it was taken on (`tor1.json`)".into(),
            });
            continue;
        };
        for s in &t.seen {
            classify(&kinds, t, kind, s, &mut cables, &mut hosts, &mut heard, &mut out);
        }
    }
    links(&mut out, &cables, tables, inv_path);
    rnics(&mut out, &hosts, inv_path);
    addresses(&mut out, &heard, inv_path);
    out.links_unported = out.inventory.links.iter().filter(|l| l.a_port.is_none() || l.b_port.is_none()).count();
    out.rnics_unported = out.inventory.hosts.iter().flat_map(|h| &h.rnics).filter(|r| r.tor_port.is_none()).count();
    out
}

/// The tables in `paths`: files, or directories of `*.json` files (in name order).
pub fn load_tables(paths: &[PathBuf]) -> Result<Vec<Table>, crate::error::Error> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|e| crate::error::Error::io(p, "list the directory", e))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "json"))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(p.clone());
        }
    }
    if files.is_empty() {
        return Err(crate::error::Error::invalid(
            "no LLDP tables (*.json) in the paths given",
            "collect `lldpcli -f json show neighbors` from each switch and host into NODE.json",
        ));
    }
    files.iter().map(|f| Table::load(f).map_err(Into::into)).collect()
}

fn kinds(inv: &Inventory) -> HashMap<&str, Kind> {
    let mut kinds = HashMap::new();
    kinds.extend(inv.tors.iter().map(|t| (t.name.as_str(), Kind::Tor)));
    kinds.extend(inv.spines.iter().map(|s| (s.name.as_str(), Kind::Spine)));
    kinds.extend(inv.hosts.iter().map(|h| (h.name.as_str(), Kind::Host)));
    kinds
}

/// The inventory name of a neighbour's system name: itself, or the longest part of it before a
/// dot that is one (`leaf1.pod1.example.com` finds `leaf1.pod1` or `leaf1`).
fn resolve<'k>(kinds: &HashMap<&'k str, Kind>, name: &str) -> Option<(&'k str, Kind)> {
    let cuts = name.char_indices().filter(|(_, c)| *c == '.').map(|(i, _)| i).rev();
    std::iter::once(name.len()).chain(cuts).find_map(|end| kinds.get_key_value(&name[..end]).map(|(k, v)| (*k, *v)))
}

#[allow(clippy::too_many_arguments)]
fn classify(
    kinds: &HashMap<&str, Kind>,
    t: &Table,
    kind: Kind,
    s: &Seen,
    cables: &mut Vec<CableSeen>,
    hosts: &mut Vec<HostSeen>,
    heard: &mut BTreeMap<String, BTreeSet<IpAddr>>,
    out: &mut Learned,
) {
    let from = From { file: t.file.clone(), line: s.line };
    let Some((peer, peer_kind)) = s.peer.as_deref().and_then(|p| resolve(kinds, p)) else {
        out.ignored.push(format!("{} port {}: {}", t.node, s.port, s.peer.as_deref().unwrap_or("(no system name)")));
        return;
    };
    if peer_kind != Kind::Host {
        heard.entry(peer.to_string()).or_default().extend(s.mgmt.iter().copied().filter(|a| usable(*a)));
    }
    let (me, port, peer_port) = (t.node.clone(), Some(s.port.clone()), s.peer_port.clone());
    match (kind, peer_kind) {
        (Kind::Tor, Kind::Spine) => {
            cables.push(CableSeen { tor: me, spine: peer.into(), tor_port: port, spine_port: peer_port, from })
        }
        (Kind::Spine, Kind::Tor) => {
            cables.push(CableSeen { tor: peer.into(), spine: me, tor_port: peer_port, spine_port: port, from })
        }
        (Kind::Tor, Kind::Host) => hosts.push(HostSeen {
            host: peer.into(),
            tor: me,
            tor_port: port,
            addrs: s.mgmt.clone(),
            local_if: None,
            peer_if: peer_port,
            from,
        }),
        (Kind::Host, Kind::Tor) => hosts.push(HostSeen {
            host: me,
            tor: peer.into(),
            tor_port: peer_port,
            addrs: Vec::new(),
            local_if: port,
            peer_if: None,
            from,
        }),
        (Kind::Host, Kind::Host) => {}
        (Kind::Tor, Kind::Tor) | (Kind::Spine, Kind::Spine) => {
            out.ignored.push(format!("{me} port {}: a peer link to {peer} (not in the inventory's model)", s.port))
        }
        (a, b) => out.problems.push(from.problem(
            format!("{me} port {} reaches {peer} ({b:?}), a {a:?} cabled to a {b:?}", s.port),
            "a ToR is cabled to spines and hosts, a spine to ToRs: check this cable",
        )),
    }
}

fn usable(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v) => !(v.is_loopback() || v.is_link_local() || v.is_unspecified() || v.is_multicast()),
        IpAddr::V6(v) => {
            !(v.is_loopback() || v.is_unspecified() || v.is_multicast() || (v.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// Link ports from the cables seen, and the links the tables contradict or do not show.
fn links(out: &mut Learned, cables: &[CableSeen], tables: &[Table], inv_path: &Path) {
    // One cable per (switch, port): the first table to see it decides, a later one that
    // disagrees is a problem (a stale table, or a cable moved between the two readings).
    let mut by_port: HashMap<(String, String), &CableSeen> = HashMap::new();
    let mut shown: BTreeSet<(String, String)> = BTreeSet::new();
    let mut owners = Owners::of(&out.inventory);
    // Every (tor, spine, end, port) some table saw: a link's inventory port seen on a cable
    // between the same two switches makes another port pair a parallel cable, not a swap.
    let seen_ends: BTreeSet<(&str, &str, &str, &str)> = cables
        .iter()
        .flat_map(|c| {
            let ends = [(c.tor.as_str(), c.tor_port.as_deref()), (c.spine.as_str(), c.spine_port.as_deref())];
            ends.into_iter().filter_map(move |(n, p)| Some((c.tor.as_str(), c.spine.as_str(), n, p?)))
        })
        .collect();
    for c in cables {
        shown.insert((c.tor.clone(), c.spine.clone()));
        let ends = [(&c.tor, &c.tor_port), (&c.spine, &c.spine_port)];
        let mut consistent = true;
        for (node, port) in ends {
            let Some(port) = port else { continue };
            if let Some(first) = by_port.get(&(node.clone(), port.clone()))
                && !same_cable(first, c)
            {
                out.problems.push(c.from.problem(
                    format!(
                        "{node} port {port} is seen here as {} to {}, but {}:{} sees {} to {}",
                        show(&c.tor, &c.tor_port),
                        show(&c.spine, &c.spine_port),
                        first.from.file.display(),
                        first.from.line,
                        show(&first.tor, &first.tor_port),
                        show(&first.spine, &first.spine_port)
                    ),
                    "take both tables again at the same time; if they still disagree, trace the cable",
                ));
                consistent = false;
            }
        }
        if !consistent {
            continue;
        }
        for (node, port) in ends {
            if let Some(port) = port {
                by_port.entry((node.clone(), port.clone())).or_insert(c);
            }
        }
        set_link_ports(out, &mut owners, &seen_ends, c, inv_path);
    }
    let read: BTreeSet<&str> = tables.iter().map(|t| t.node.as_str()).collect();
    for (i, l) in out.inventory.links.iter().enumerate() {
        let (tor, spine) = if out.inventory.tors.iter().any(|t| t.name == l.a) { (&l.a, &l.b) } else { (&l.b, &l.a) };
        let from: Vec<&str> = [tor.as_str(), spine.as_str()].into_iter().filter(|n| read.contains(n)).collect();
        if from.is_empty() || shown.contains(&(tor.clone(), spine.clone())) {
            continue;
        }
        out.problems.push(Problem {
            file: inv_path.to_path_buf(),
            line: None,
            what: format!("link[{i}] {tor}|{spine} is in no LLDP table ({} read)", from.join(" and ")),
            fix:
                "check the cable and both ports (down, or on another switch); remove the [[link]] if it does not exist"
                    .into(),
        });
    }
}

/// Whether two sightings are one cable: the same switches, and the same ports where both say.
fn same_cable(a: &CableSeen, b: &CableSeen) -> bool {
    let agree = |x: &Option<String>, y: &Option<String>| x.is_none() || y.is_none() || x == y;
    a.tor == b.tor && a.spine == b.spine && agree(&a.tor_port, &b.tor_port) && agree(&a.spine_port, &b.spine_port)
}

fn show(node: &str, port: &Option<String>) -> String {
    match port {
        Some(p) => format!("{node} port {p}"),
        None => format!("{node} (port not said)"),
    }
}

/// Ports of the inventory's link for cable `c`: filled where missing, a problem where different.
fn set_link_ports(
    out: &mut Learned,
    owners: &mut Owners,
    seen_ends: &BTreeSet<(&str, &str, &str, &str)>,
    c: &CableSeen,
    inv_path: &Path,
) {
    let Some(link) =
        out.inventory.links.iter_mut().find(|l| (l.a == c.tor && l.b == c.spine) || (l.a == c.spine && l.b == c.tor))
    else {
        let declared: Vec<&str> = out
            .inventory
            .links
            .iter()
            .filter_map(|l| match () {
                () if l.a == c.tor => Some(l.b.as_str()),
                () if l.b == c.tor => Some(l.a.as_str()),
                () => None,
            })
            .collect();
        let what = format!(
            "{} reaches {}, but {} has no link {}|{} ({} is linked to {})",
            show(&c.tor, &c.tor_port),
            show(&c.spine, &c.spine_port),
            inv_path.display(),
            c.tor,
            c.spine,
            c.tor,
            if declared.is_empty() { "no spine".to_string() } else { declared.join(", ") }
        );
        let fix = format!(
            "if {} belongs on another spine, move this cable; if the cabling is right, add [[link]] a = {:?} b = {:?}",
            c.tor, c.tor, c.spine
        );
        out.problems.push(c.from.problem(what, fix));
        return;
    };
    let owner = format!("link {}|{}", link.a, link.b);
    let a_is_tor = link.a == c.tor;
    let (tor_slot, spine_slot) =
        if a_is_tor { (&mut link.a_port, &mut link.b_port) } else { (&mut link.b_port, &mut link.a_port) };
    for (node, slot, seen) in [(&c.tor, tor_slot, &c.tor_port), (&c.spine, spine_slot, &c.spine_port)] {
        let Some(seen) = seen else { continue };
        match owners.fill(node, &owner, slot, seen) {
            Fill::Set => out.link_ports += 1,
            Fill::Same => {}
            Fill::Differs(have)
                if seen_ends.contains(&(c.tor.as_str(), c.spine.as_str(), node.as_str(), have.as_str())) =>
            {
                out.ignored.push(format!(
                    "{node} port {seen}: a second cable of {}|{} (the inventory keeps one link per pair, on {node} port {have})",
                    c.tor, c.spine
                ));
            }
            Fill::Refused(why) => out.problems.push(refused(&c.from, why)),
            Fill::Differs(have) => out.problems.push(c.from.problem(
                format!(
                    "link {}|{} is on {node} port {seen}, but {} puts it on {node} port {have} (cables swapped?)",
                    c.tor,
                    c.spine,
                    inv_path.display()
                ),
                format!("move the cable back to {node} port {have}, or correct the link's port in the inventory"),
            )),
        }
    }
}

/// Who holds each switch port, (switch, port) → the link or RNIC: seeded from the inventory,
/// then from every port filled, so that no fill gives a port two cables.
struct Owners(HashMap<(String, String), String>);

/// What filling a port did.
enum Fill {
    Set,
    Same,
    /// The inventory says another port (left as it is).
    Differs(String),
    /// The port is another link's or RNIC's already, or is no usable name: the problem.
    Refused(String),
}

impl Owners {
    fn of(inv: &Inventory) -> Owners {
        let mut m = HashMap::new();
        for l in &inv.links {
            for (node, port) in [(&l.a, &l.a_port), (&l.b, &l.b_port)] {
                if let Some(p) = port {
                    m.insert((node.clone(), p.clone()), format!("link {}|{}", l.a, l.b));
                }
            }
        }
        for h in &inv.hosts {
            for r in &h.rnics {
                if let Some(p) = &r.tor_port {
                    m.insert((r.tor.clone(), p.clone()), format!("RNIC {}", Inventory::rnic_name(&h.name, &r.device)));
                }
            }
        }
        Owners(m)
    }

    /// Sets `owner`'s empty port `slot` on `switch` to `seen`.
    fn fill(&mut self, switch: &str, owner: &str, slot: &mut Option<String>, seen: &str) -> Fill {
        match slot {
            Some(have) if have == seen => return Fill::Same,
            Some(have) => return Fill::Differs(have.clone()),
            None => {}
        }
        if let Some(problem) = rocemesh_formats::inventory::port_problem(seen) {
            return Fill::Refused(format!("{switch}: {problem}"));
        }
        let key = (switch.to_string(), seen.to_string());
        match self.0.get(&key) {
            Some(other) if other != owner => Fill::Refused(format!(
                "{switch} port {seen} is {other}'s in the inventory, and LLDP sees {owner} on it"
            )),
            _ => {
                self.0.insert(key, owner.to_string());
                *slot = Some(seen.to_string());
                Fill::Set
            }
        }
    }
}

/// RNIC ports from the host cables seen.
fn rnics(out: &mut Learned, seen: &[HostSeen], inv_path: &Path) {
    let mut taken: HashMap<String, &HostSeen> = HashMap::new();
    let mut owners = Owners::of(&out.inventory);
    for s in seen {
        let Some(h) = out.inventory.hosts.iter_mut().find(|h| h.name == s.host) else { continue };
        // The interface names the RNIC where the inventory knows its netdev, wherever the
        // inventory puts it (a cable on another ToR is a miscabling, not another RNIC); else a
        // host advertises every address on every port, so the addresses pick among the RNICs
        // the inventory puts under this ToR; one RNIC there is the one.
        let under: Vec<usize> = (0..h.rnics.len()).filter(|&j| h.rnics[j].tor == s.tor).collect();
        let named = |name: &Option<String>| h.rnics.iter().position(|r| name.is_some() && r.netdev == *name);
        let by_netdev = named(&s.local_if).or_else(|| named(&s.peer_if));
        if by_netdev.is_some_and(|j| h.rnics[j].tor != s.tor) {
            out.problems.push(elsewhere(h, s, inv_path));
            continue;
        }
        // The host's own interface, and no RNIC's under this ToR (a management port): not an
        // RNIC's cable.
        if by_netdev.is_none() && s.local_if.is_some() && under.iter().all(|&j| h.rnics[j].netdev.is_some()) {
            let port = s.tor_port.as_deref().unwrap_or("?");
            let local = s.local_if.as_deref().unwrap_or("?");
            out.ignored.push(format!("{} {local} to {} port {port}: no RNIC's netdev", h.name, s.tor));
            continue;
        }
        let by_addr: Vec<usize> = under.iter().copied().filter(|&j| s.addrs.contains(&h.rnics[j].ip)).collect();
        let j = match (by_netdev.as_ref(), &by_addr[..], &under[..]) {
            (Some(j), _, _) | (None, [j], _) | (None, _, [j]) => *j,
            // Several RNICs under this ToR and nothing to tell them apart: left without a port.
            (None, _, [_, ..]) => continue,
            (None, _, []) => {
                out.problems.push(elsewhere(h, s, inv_path));
                continue;
            }
        };
        let r = &mut h.rnics[j];
        let name = Inventory::rnic_name(&h.name, &r.device);
        let Some(port) = &s.tor_port else { continue };
        if let Some(first) = taken.get(&name)
            && first.tor_port.as_ref() != Some(port)
        {
            out.problems.push(s.from.problem(
                format!(
                    "RNIC {name} is seen here on {}, but {}:{} sees it on {}",
                    show(&s.tor, &s.tor_port),
                    first.from.file.display(),
                    first.from.line,
                    show(&first.tor, &first.tor_port)
                ),
                "take both tables again at the same time; if they still disagree, trace the cable",
            ));
            continue;
        }
        taken.entry(name.clone()).or_insert(s);
        match owners.fill(&s.tor, &format!("RNIC {name}"), &mut r.tor_port, port) {
            Fill::Set => out.rnic_ports += 1,
            Fill::Same => {}
            Fill::Refused(why) => out.problems.push(refused(&s.from, why)),
            Fill::Differs(have) => out.problems.push(s.from.problem(
                format!(
                    "RNIC {name} is on {} port {port}, but {} puts it on port {have} (cables swapped?)",
                    s.tor,
                    inv_path.display()
                ),
                format!("move the cable back to {} port {have}, or correct its `tor_port` in the inventory", s.tor),
            )),
        }
    }
}

/// A host seen on a ToR the inventory puts none of its RNICs under: the RNIC named when the
/// host has one, or its addresses pick one.
fn elsewhere(h: &rocemesh_formats::inventory::Host, s: &HostSeen, inv_path: &Path) -> Problem {
    let by_netdev: Vec<&rocemesh_formats::inventory::Rnic> =
        h.rnics.iter().filter(|r| r.netdev.is_some() && (r.netdev == s.local_if || r.netdev == s.peer_if)).collect();
    let by_addr: Vec<&rocemesh_formats::inventory::Rnic> = h.rnics.iter().filter(|r| s.addrs.contains(&r.ip)).collect();
    let which = match (&by_netdev[..], &by_addr[..], &h.rnics[..]) {
        ([r], _, _) | (_, [r], _) => Some(*r),
        (_, _, [r]) => Some(r),
        _ => None,
    };
    let (what, fix) = match which {
        Some(r) => (
            format!(
                "RNIC {} is cabled to {}, but {} puts it under {}",
                Inventory::rnic_name(&h.name, &r.device),
                show(&s.tor, &s.tor_port),
                inv_path.display(),
                r.tor
            ),
            format!("correct its `tor` to {:?} in the inventory, or re-cable it to {}", s.tor, r.tor),
        ),
        None => (
            format!(
                "host {} is cabled to {}, but {} puts none of its RNICs under {}",
                h.name,
                show(&s.tor, &s.tor_port),
                inv_path.display(),
                s.tor
            ),
            format!("correct the `tor` of the RNIC on this cable to {:?}, or re-cable it", s.tor),
        ),
    };
    s.from.problem(what, fix)
}

/// A port that could not be filled: taken by another cable, or no usable name.
fn refused(from: &From, why: String) -> Problem {
    from.problem(why, "trace the cable on that port; correct the inventory's port or re-cable, then run again")
}

/// Switch addresses heard, added where no one else claims them.
fn addresses(out: &mut Learned, heard: &BTreeMap<String, BTreeSet<IpAddr>>, inv_path: &Path) {
    let inv = &out.inventory;
    let mut owner: HashMap<[u8; 16], String> = HashMap::new();
    for h in &inv.hosts {
        for r in &h.rnics {
            let name = Inventory::rnic_name(&h.name, &r.device);
            owner.insert(gid_bytes(r.ip), format!("RNIC {name}"));
            owner.insert(r.gid_or_mapped().octets(), format!("RNIC {name} (its GID)"));
        }
    }
    let switches = inv.tors.iter().map(|t| (&t.name, &t.addrs)).chain(inv.spines.iter().map(|s| (&s.name, &s.addrs)));
    for (name, addrs) in switches {
        for a in addrs {
            owner.insert(gid_bytes(*a), name.clone());
        }
    }
    // An address heard from two switches is neither's.
    let mut claimed: HashMap<[u8; 16], BTreeSet<&str>> = HashMap::new();
    for (switch, addrs) in heard {
        for a in addrs {
            claimed.entry(gid_bytes(*a)).or_default().insert(switch);
        }
    }
    let mut add: Vec<(String, IpAddr)> = Vec::new();
    let mut said: BTreeSet<[u8; 16]> = BTreeSet::new();
    for (switch, addrs) in heard {
        for a in addrs {
            let key = gid_bytes(*a);
            let who = &claimed[&key];
            let taken_by = owner.get(&key).filter(|o| *o != switch);
            if who.len() > 1 || taken_by.is_some() {
                if !said.insert(key) {
                    continue;
                }
                let other =
                    taken_by.cloned().unwrap_or_else(|| who.iter().find(|w| **w != switch).unwrap_or(&"?").to_string());
                out.problems.push(Problem {
                    file: inv_path.to_path_buf(),
                    line: None,
                    what: format!(
                        "{switch} advertises {a}, which is also {other}'s: a trace hop from it would name both"
                    ),
                    fix: "set the switch's management addresses (LLDP) to its own; the address is left out".into(),
                });
                continue;
            }
            if !owner.contains_key(&key) {
                add.push((switch.clone(), *a));
            }
        }
    }
    for (switch, a) in add {
        if let Some(t) = out.inventory.tors.iter_mut().find(|t| t.name == switch) {
            t.addrs.push(a);
        } else if let Some(s) = out.inventory.spines.iter_mut().find(|s| s.name == switch) {
            s.addrs.push(a);
        }
        out.addrs += 1;
    }
}
