//! The fabric inventory: the one TOML file on the bastion that says which ToRs, spines,
//! links, hosts and RNICs exist. `ctl` generates every pinglist from it, and the entity
//! names used everywhere else (`tor3-h5/mlx5_0`) are built from the names it declares.
//!
//! Loading validates the whole file; every refusal is a [`FileError`] naming the line,
//! the field (`host[4].rnic[1].tor`), what is wrong and how to fix it.
//!
//! ```toml
//! version = 1
//!
//! [[tor]]
//! name = "tor0"
//! rail = 0            # optional: rail index in rail-optimised clusters
//! addrs = ["172.16.0.1", "172.16.1.1"]   # optional: the switch's own addresses (see below)
//!
//! [[tor]]
//! name = "tor1"
//! rail = 1
//!
//! [[spine]]
//! name = "spine0"
//! addrs = ["172.16.255.1", "fd00:ff::1"]
//!
//! [[link]]            # optional: ToR-spine links, for link-level localisation
//! a = "tor0"
//! b = "spine0"
//! a_port = "Ethernet48"   # optional: the interface at each end (`ctl inventory lldp`)
//! b_port = "Ethernet0"
//!
//! [[link]]
//! a = "spine0"        # either order
//! b = "tor1"
//!
//! [[host]]
//! name = "tor0-h0"
//!
//! [[host.rnic]]
//! device = "mlx5_0"
//! tor = "tor0"
//! ip = "10.0.0.1"                 # IPv4 or IPv6 address of the RNIC (RoCEv2)
//! gid = "::ffff:10.0.0.1"         # optional: GID as IPv6 text; default derived from ip
//! port = 1                        # optional, default 1
//! gid_index = 3                   # optional
//! tor_port = "Ethernet0"          # optional: the ToR's interface it is cabled to
//! netdev = "ens1f0np0"            # optional: the host's netdev behind the port
//!
//! [[host.rnic]]
//! device = "mlx5_1"
//! tor = "tor1"
//! ip = "fd00::11"
//!
//! [[host]]
//! name = "tor1-h0"
//!
//! [[host.rnic]]
//! device = "mlx5_0"
//! tor = "tor1"
//! ip = "10.0.1.1"
//! ```
//!
//! Rules beyond the syntax: tor, spine and host names share one namespace and, like device
//! names, use only `[A-Za-z0-9._:-]`; every host has at least one RNIC, each attached to a
//! declared ToR; no two RNICs share an address or a GID; a link joins a declared ToR and a
//! declared spine, once; and either every ToR has a `rail` or none does. A port (`a_port`,
//! `b_port`, `tor_port`) is an interface name as the switch reports it, and a `netdev` as the
//! host does (printable, no spaces, at most 64 bytes), and no switch port is given to two
//! cables.
//!
//! A switch's `addrs` are the addresses it answers from (interface and loopback addresses):
//! an agent's path trace knows a hop only by the source of its ICMP time-exceeded reply, and
//! `analyze` names the hop after the switch that lists that address ([`Inventory::switch_addrs`]).
//! `ctl inventory switch-addrs` fills them in from a `switch,addr` list. Each address belongs to
//! one switch and is no RNIC's address or GID (IPv4 `a.b.c.d` and its IPv4-mapped IPv6 form
//! `::ffff:a.b.c.d` are the same address), or a hop would name two elements.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::tomlfile::{self, Document, FieldPath, VersionGate};
pub use crate::tomlfile::{FileError, NAME_FIX, name_problem};

/// The inventory format version this build reads and writes.
pub const VERSION: u32 = 1;

const GATE: VersionGate<'static> = VersionGate {
    format: "inventory",
    supported: VERSION as i64,
    mismatch_fix: "write the inventory in the version this `ctl` reads, or upgrade `ctl`",
};

/// The whole fabric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Inventory {
    pub version: u32,
    #[serde(rename = "tor", default, skip_serializing_if = "Vec::is_empty")]
    pub tors: Vec<Tor>,
    #[serde(rename = "spine", default, skip_serializing_if = "Vec::is_empty")]
    pub spines: Vec<Spine>,
    #[serde(rename = "link", default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
    #[serde(rename = "host", default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<Host>,
}

/// A top-of-rack (leaf) switch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Tor {
    pub name: String,
    /// Rail index in rail-optimised clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail: Option<u16>,
    /// The addresses the switch answers path traces from (see the module documentation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addrs: Vec<IpAddr>,
}

/// A spine switch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Spine {
    pub name: String,
    /// The addresses the switch answers path traces from (see the module documentation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addrs: Vec<IpAddr>,
}

/// A ToR-spine link; `a` and `b` are one ToR and one spine, in either order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Link {
    pub a: String,
    pub b: String,
    /// The interface at `a`'s end, as LLDP names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_port: Option<String>,
    /// The interface at `b`'s end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b_port: Option<String>,
}

impl Link {
    /// A link with no ports known.
    pub fn new(a: impl Into<String>, b: impl Into<String>) -> Link {
        Link { a: a.into(), b: b.into(), a_port: None, b_port: None }
    }

    /// The port at the end named `node`, if that end is `node` and its port is known.
    pub fn port_at(&self, node: &str) -> Option<&str> {
        match () {
            () if self.a == node => self.a_port.as_deref(),
            () if self.b == node => self.b_port.as_deref(),
            () => None,
        }
    }
}

/// A server and its RDMA NICs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Host {
    pub name: String,
    #[serde(rename = "rnic", default, skip_serializing_if = "Vec::is_empty")]
    pub rnics: Vec<Rnic>,
}

/// One RDMA NIC port of a host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Rnic {
    /// Verbs device name, e.g. `mlx5_0`.
    pub device: String,
    /// Name of the ToR this port is cabled to.
    pub tor: String,
    pub ip: IpAddr,
    /// GID, when it is not the one derived from `ip` (see [`Rnic::gid_or_mapped`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<Ipv6Addr>,
    #[serde(default = "default_port")]
    pub port: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u16>,
    /// The ToR's interface this port is cabled to, as LLDP names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tor_port: Option<String>,
    /// The host's netdev behind the port (`agent describe` finds it): a host's own LLDP table
    /// names its cables by it, which tells apart two RNICs under one ToR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
}

fn default_port() -> u8 {
    1
}

impl Rnic {
    /// The GID: the configured one, else what RoCEv2 derives from `ip` (the IPv4-mapped
    /// `::ffff:a.b.c.d`, or the IPv6 address itself).
    pub fn gid_or_mapped(&self) -> Ipv6Addr {
        self.gid.unwrap_or_else(|| crate::gid::gid_of(self.ip))
    }
}

impl Inventory {
    /// The entity name of an RNIC, `"{host}/{device}"`, as used in pinglists, records and
    /// reports.
    pub fn rnic_name(host: &str, device: &str) -> String {
        format!("{host}/{device}")
    }

    /// Switch names by address, for naming the hops of path traces: an agent's trace knows a
    /// hop only by the address that answered, one of a switch's `addrs`. Keys are the 16 bytes
    /// a record's dictionary carries ([`crate::gid::gid_bytes`]: IPv4-mapped for IPv4), so an
    /// `Endpoint::addr` is looked up as it is. Validation makes every address one switch's;
    /// a switch without `addrs` is not in the map.
    pub fn switch_addrs(&self) -> HashMap<[u8; 16], &str> {
        self.switches()
            .flat_map(|(_, name, addrs)| addrs.iter().map(move |a| (crate::gid::gid_bytes(*a), name)))
            .collect()
    }

    /// Every ToR, then every spine: (`"tor"` or `"spine"`, name, addresses).
    fn switches(&self) -> impl Iterator<Item = (&'static str, &str, &[IpAddr])> {
        let tors = self.tors.iter().map(|t| ("tor", t.name.as_str(), t.addrs.as_slice()));
        tors.chain(self.spines.iter().map(|s| ("spine", s.name.as_str(), s.addrs.as_slice())))
    }

    /// Reads and validates the inventory at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Inventory, FileError> {
        let path = path.as_ref();
        Self::parse(&tomlfile::read_text(path)?, path)
    }

    /// Parses and validates `text`; `path` is only used in errors.
    ///
    /// A large inventory is parsed in parts, on all cores (see [`in_parts`]); any failure
    /// there falls back to parsing the whole text at once, which is what names the problem.
    pub fn parse(text: &str, path: &Path) -> Result<Inventory, FileError> {
        Self::parse_with(text, path, PARALLEL_FROM_BYTES, default_threads())
    }

    fn parse_with(text: &str, path: &Path, parallel_from_bytes: usize, threads: usize) -> Result<Inventory, FileError> {
        let (inventory, doc) = match in_parts(text, parallel_from_bytes, threads) {
            Some(inventory) => (inventory, Document::unparsed(path, text)),
            None => {
                let mut doc = Document::parse(path, text, &GATE)?;
                (doc.deserialize().map_err(with_addr_fix)?, doc)
            }
        };
        inventory.validate(&doc)?;
        Ok(inventory)
    }

    /// The inventory as TOML that [`Inventory::parse`] reads back unchanged. Fails only if
    /// toml cannot represent a value, which these types never produce.
    pub fn to_toml_string(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    fn validate(&self, doc: &Document<'_>) -> Result<(), FileError> {
        let root = FieldPath::root();
        let mut names = Names::default();

        for (i, tor) in self.tors.iter().enumerate() {
            let path = root.key("tor").index(i).key("name");
            names.claim(doc, &tor.name, Kind::Tor, path)?;
        }
        self.check_rails(doc)?;
        for (i, spine) in self.spines.iter().enumerate() {
            let path = root.key("spine").index(i).key("name");
            names.claim(doc, &spine.name, Kind::Spine, path)?;
        }
        self.check_links(doc, &names)?;
        for (i, host) in self.hosts.iter().enumerate() {
            let path = root.key("host").index(i).key("name");
            names.claim(doc, &host.name, Kind::Host, path)?;
        }
        self.check_rnics(doc, &names)?;
        self.check_ports(doc)?;
        self.check_switch_addrs(doc)
    }

    // A switch port holds one cable: two entries on one port mean one of them is wrong, and
    // the switch counters joined to findings by port would be joined to both.
    fn check_ports(&self, doc: &Document<'_>) -> Result<(), FileError> {
        for (i, h) in self.hosts.iter().enumerate() {
            let mut seen: Vec<&str> = Vec::new();
            for (j, netdev) in h.rnics.iter().enumerate().filter_map(|(j, r)| Some((j, r.netdev.as_ref()?))) {
                let path = FieldPath::root().key("host").index(i).key("rnic").index(j).key("netdev");
                if let Some(problem) = port_problem(netdev) {
                    return Err(doc.error(&path, problem, "write the netdev as `ip link` names it, or leave it out"));
                }
                if seen.contains(&netdev.as_str()) {
                    let problem = format!("netdev {netdev:?} is also another RNIC's of host {:?}", h.name);
                    return Err(doc.error(&path, problem, "give each RNIC the netdev `agent describe` found for it"));
                }
                seen.push(netdev);
            }
        }
        let mut taken: HashMap<(&str, &str), FieldPath> = HashMap::new();
        let links = self.links.iter().enumerate().flat_map(|(i, l)| {
            let path = FieldPath::root().key("link").index(i);
            [(&l.a, &l.a_port, path.key("a_port")), (&l.b, &l.b_port, path.key("b_port"))]
        });
        let rnics = self.hosts.iter().enumerate().flat_map(|(i, h)| {
            h.rnics.iter().enumerate().map(move |(j, r)| {
                (&r.tor, &r.tor_port, FieldPath::root().key("host").index(i).key("rnic").index(j).key("tor_port"))
            })
        });
        for (switch, port, path) in links.chain(rnics) {
            let Some(port) = port else { continue };
            if let Some(problem) = port_problem(port) {
                return Err(doc.error(&path, problem, PORT_FIX));
            }
            match taken.entry((switch, port)) {
                Entry::Occupied(first) => {
                    return Err(doc.error(
                        &path,
                        format!(
                            "port {port:?} of {switch:?} is also given{}; a port holds one cable",
                            at_line(doc.line_of_path(first.get()))
                        ),
                        "correct one of the two (`ctl inventory lldp` reads the ports from the switches)",
                    ));
                }
                Entry::Vacant(slot) => {
                    slot.insert(path);
                }
            }
        }
        Ok(())
    }

    // Rail-aware pinglist generation needs every ToR's rail once any is given. Rails are not
    // unique across ToRs: with several pods (scalable units) each rail has one ToR per pod.
    fn check_rails(&self, doc: &Document<'_>) -> Result<(), FileError> {
        let with = self.tors.iter().position(|t| t.rail.is_some());
        let without = self.tors.iter().position(|t| t.rail.is_none());
        let (Some(with), Some(without)) = (with, without) else {
            return Ok(());
        };
        let tors = FieldPath::root().key("tor");
        let other_line = doc.line_of_path(&tors.index(with).key("rail"));
        Err(doc.error(
            &tors.index(without).key("rail"),
            format!(
                "tor {:?} has no rail, but tor {:?}{} has one; either every tor has a rail or none does",
                self.tors[without].name,
                self.tors[with].name,
                at_line(other_line),
            ),
            "give every [[tor]] a `rail`, or remove `rail` from all of them",
        ))
    }

    fn check_links(&self, doc: &Document<'_>, names: &Names<'_>) -> Result<(), FileError> {
        let mut seen: HashMap<(&str, &str), FieldPath> = HashMap::new();
        for (i, link) in self.links.iter().enumerate() {
            let path = FieldPath::root().key("link").index(i);
            let mut ends = Vec::with_capacity(2);
            for (key, name) in [("a", &link.a), ("b", &link.b)] {
                match names.kind_of(name) {
                    Some(kind @ (Kind::Tor | Kind::Spine)) => ends.push((kind, name.as_str())),
                    Some(Kind::Host) => {
                        return Err(doc.error(
                            &path.key(key),
                            format!("{name:?} is a host; a link joins a tor and a spine"),
                            "name a [[tor]] at one end and a [[spine]] at the other",
                        ));
                    }
                    None => {
                        return Err(doc.error(
                            &path.key(key),
                            format!("there is no tor or spine named {name:?}"),
                            format!("add a [[tor]] or [[spine]] named {name:?} or correct the name"),
                        ));
                    }
                }
            }
            let (tor, spine) = match (ends[0], ends[1]) {
                ((Kind::Tor, t), (Kind::Spine, s)) | ((Kind::Spine, s), (Kind::Tor, t)) => (t, s),
                ((kind, _), _) => {
                    return Err(doc.error(
                        &path.key("b"),
                        format!(
                            "the link joins two {}s ({:?} and {:?}); a link joins a tor and a spine",
                            kind.as_str(),
                            link.a,
                            link.b
                        ),
                        "name a [[tor]] at one end and a [[spine]] at the other",
                    ));
                }
            };
            match seen.entry((tor, spine)) {
                Entry::Occupied(first) => {
                    return Err(doc.error(
                        &path,
                        format!("the link {tor:?}-{spine:?} is also defined{}", at_line(doc.line_of_path(first.get()))),
                        "remove the duplicate [[link]]",
                    ));
                }
                Entry::Vacant(slot) => {
                    slot.insert(path);
                }
            }
        }
        Ok(())
    }

    fn check_rnics(&self, doc: &Document<'_>, names: &Names<'_>) -> Result<(), FileError> {
        // Two RNICs answering to one address would make probes to either land on whichever
        // the fabric routes to, so addresses and GIDs are unique fabric-wide.
        let mut ips: HashMap<IpAddr, (FieldPath, String)> = HashMap::new();
        let mut gids: HashMap<Ipv6Addr, (FieldPath, String)> = HashMap::new();
        for (i, host) in self.hosts.iter().enumerate() {
            let host_path = FieldPath::root().key("host").index(i);
            if host.rnics.is_empty() {
                return Err(doc.error(
                    &host_path.key("rnic"),
                    format!("host {:?} has no [[host.rnic]]", host.name),
                    "add a [[host.rnic]] after this [[host]] for each of its RDMA NICs, or remove the host",
                ));
            }
            let mut devices: HashMap<&str, FieldPath> = HashMap::new();
            for (j, rnic) in host.rnics.iter().enumerate() {
                let path = host_path.key("rnic").index(j);
                let name = Inventory::rnic_name(&host.name, &rnic.device);

                let device_path = path.key("device");
                if let Some(problem) = name_problem(&rnic.device) {
                    return Err(doc.error(&device_path, problem, NAME_FIX));
                }
                if let Some(first) = devices.get(rnic.device.as_str()) {
                    return Err(doc.error(
                        &device_path,
                        format!(
                            "device {:?} is also defined{} for this host",
                            rnic.device,
                            at_line(doc.line_of_path(first))
                        ),
                        "give each RNIC of a host its own device name, or remove the duplicate",
                    ));
                }
                devices.insert(&rnic.device, device_path);

                match names.kind_of(&rnic.tor) {
                    Some(Kind::Tor) => {}
                    other => {
                        let what = match other {
                            Some(kind) => {
                                format!("{:?} is a {}, not a tor", rnic.tor, kind.as_str())
                            }
                            None => format!("there is no tor named {:?}", rnic.tor),
                        };
                        return Err(doc.error(
                            &path.key("tor"),
                            what,
                            format!("add a [[tor]] named {:?} or correct the name", rnic.tor),
                        ));
                    }
                }

                if rnic.port == 0 {
                    return Err(doc.error(
                        &path.key("port"),
                        "port 0 does not exist: RDMA ports are numbered from 1",
                        "use the port number `ibv_devinfo` shows (usually 1), or omit `port`",
                    ));
                }

                let ip_path = path.key("ip");
                if let Some((first, owner)) = ips.get(&rnic.ip) {
                    return Err(doc.error(
                        &ip_path,
                        format!("ip {} is also claimed by {owner}{}", rnic.ip, at_line(doc.line_of_path(first))),
                        "give every RNIC its own address",
                    ));
                }
                ips.insert(rnic.ip, (ip_path.clone(), name.clone()));

                let gid = rnic.gid_or_mapped();
                let gid_path = if rnic.gid.is_some() { path.key("gid") } else { ip_path };
                if let Some((first, owner)) = gids.get(&gid) {
                    return Err(doc.error(
                        &gid_path,
                        format!("GID {gid} is also the GID of {owner}{}", at_line(doc.line_of_path(first))),
                        "give every RNIC its own GID (an omitted `gid` is derived from `ip`)",
                    ));
                }
                gids.insert(gid, (gid_path, name));
            }
        }
        Ok(())
    }

    // A hop's address must name one element: a switch address that another switch or an RNIC
    // (by ip or GID) also has would put the trace's votes on the wrong one. Compared as the
    // 16 bytes records carry, so `10.0.0.1` and `::ffff:10.0.0.1` are the same address.
    fn check_switch_addrs(&self, doc: &Document<'_>) -> Result<(), FileError> {
        if self.switches().all(|(_, _, addrs)| addrs.is_empty()) {
            return Ok(());
        }
        let root = FieldPath::root();
        let mut owners: HashMap<[u8; 16], (FieldPath, String)> = HashMap::new();
        for (i, host) in self.hosts.iter().enumerate() {
            for (j, rnic) in host.rnics.iter().enumerate() {
                let path = root.key("host").index(i).key("rnic").index(j);
                let owner = format!("the address of RNIC {}", Inventory::rnic_name(&host.name, &rnic.device));
                owners.entry(crate::gid::gid_bytes(rnic.ip)).or_insert_with(|| (path.key("ip"), owner.clone()));
                if let Some(gid) = rnic.gid {
                    let owner = format!("the GID of RNIC {}", Inventory::rnic_name(&host.name, &rnic.device));
                    owners.entry(gid.octets()).or_insert_with(|| (path.key("gid"), owner));
                }
            }
        }
        let (mut tor, mut spine) = (0, 0);
        for (kind, name, addrs) in self.switches() {
            let counter = if kind == "tor" { &mut tor } else { &mut spine };
            let switch_path = root.key(kind).index(*counter);
            *counter += 1;
            for (k, addr) in addrs.iter().enumerate() {
                let path = switch_path.key("addrs").index(k);
                let key = crate::gid::gid_bytes(*addr);
                if let Some((first, owner)) = owners.get(&key) {
                    return Err(doc.error(
                        &path,
                        format!("address {addr} is also {owner} ({first}{})", at_line(doc.line_of_path(first))),
                        "give every address to one switch only, and none that an RNIC uses as ip or GID: a path-trace hop from it must name one element",
                    ));
                }
                owners.insert(key, (path, format!("an address of {kind} {name:?}")));
            }
        }
        Ok(())
    }
}

/// The fix for a switch address that is no IP address (serde's own says "correct the value").
const ADDR_FIX: &str =
    "write the address as IPv4 (`172.16.0.1`) or IPv6 (`fd00::1`) text: an address the switch answers path traces from";

fn with_addr_fix(mut e: FileError) -> FileError {
    let in_addrs = |kind: &str| e.field.starts_with(&format!("{kind}[")) && e.field.contains("].addrs[");
    if in_addrs("tor") || in_addrs("spine") {
        e.fix = ADDR_FIX.to_owned();
    }
    e
}

/// Below this size an inventory is parsed in one piece (10,000 hosts are about 1 MB).
const PARALLEL_FROM_BYTES: usize = 1 << 20;
/// Parts per thread: small parts keep toml's token and event buffers small and reused,
/// instead of one peak of ~50 bytes per byte of text that the kernel zeroes page by page.
const PARTS_PER_THREAD: usize = 8;

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// A part of a split inventory: the array-of-tables entries it holds, in file order.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Part {
    #[serde(default)]
    tor: Vec<Tor>,
    #[serde(default)]
    spine: Vec<Spine>,
    #[serde(default)]
    link: Vec<Link>,
    #[serde(default)]
    host: Vec<Host>,
}

/// The inventory from `text` cut into parts at `[[host]]` lines, each part parsed on its own,
/// or `None` when the text is small, has no place to cut, or any part fails.
///
/// Parsing a 100,000-host inventory in one piece took ~1 s, half of it the kernel zeroing the
/// half-gigabyte peak of toml's token and event buffers; parts keep the peak small and share
/// the work among the cores. A part that starts at a `[[host]]` line holds only whole
/// array-of-tables entries, so appending the parts' arrays in order gives what one parse
/// gives. A cut inside a multi-line string or array leaves the part before it unterminated,
/// and a later part whose headers refer back to an earlier part's entries (`[tor.x]`) makes
/// tables where arrays belong: both fail, and so fall back to the whole parse.
fn in_parts(text: &str, parallel_from_bytes: usize, threads: usize) -> Option<Inventory> {
    if text.len() < parallel_from_bytes || threads == 0 {
        return None;
    }
    let parts = threads * PARTS_PER_THREAD;
    let mut cuts = vec![0];
    // The first `[[host]]` line at or after each k/parts of the text (only at the start of a
    // line, and alone on it but for trailing blanks).
    const HEADER: &str = "\n[[host]]";
    let mut from = 0;
    while cuts.len() < parts {
        from = from.max(cuts.len() * text.len() / parts);
        let Some(at) = text.get(from..).and_then(|t| t.find(HEADER)).map(|i| from + i + 1) else { break };
        from = at + HEADER.len() - 1;
        let rest = &text[from..];
        if rest[..rest.find('\n').unwrap_or(rest.len())].trim().is_empty() {
            cuts.push(at);
        }
    }
    if cuts.len() < 2 {
        return None;
    }
    cuts.push(text.len());
    let chunks: Vec<(usize, &str)> = cuts.windows(2).map(|w| &text[w[0]..w[1]]).enumerate().collect();
    let parse = |&(i, chunk): &(usize, &str)| -> Option<(Option<u32>, Part)> {
        if i > 0 {
            return Some((None, Document::quietly::<Part>(chunk)?));
        }
        let head = Document::quietly::<Inventory>(chunk)?;
        Some((Some(head.version), Part { tor: head.tors, spine: head.spines, link: head.links, host: head.hosts }))
    };
    let parsed: Vec<(Option<u32>, Part)> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .chunks(chunks.len().div_ceil(threads))
            .map(|mine| s.spawn(move || mine.iter().map(parse).collect::<Option<Vec<_>>>()))
            .collect();
        let mut all = Vec::with_capacity(chunks.len());
        for handle in handles {
            all.extend(handle.join().ok()??);
        }
        Some(all)
    })?;
    let mut parts = parsed.into_iter();
    let (version, first) = parts.next()?;
    let mut inventory =
        Inventory { version: version?, tors: first.tor, spines: first.spine, links: first.link, hosts: first.host };
    if i64::from(inventory.version) != GATE.supported {
        return None;
    }
    for (_, part) in parts {
        inventory.tors.extend(part.tor);
        inventory.spines.extend(part.spine);
        inventory.links.extend(part.link);
        inventory.hosts.extend(part.host);
    }
    Some(inventory)
}

const PORT_FIX: &str = "write the interface name as the switch reports it (e.g. `Ethernet48`, `swp1`, `Ethernet1/1`)";

/// What is wrong with an interface name, if anything: empty, longer than 64 bytes, or holding
/// a space, a quote or a control character (names go into Prometheus labels and HTML).
pub fn port_problem(port: &str) -> Option<String> {
    if port.is_empty() || port.len() > 64 {
        return Some(format!("port {port:?} is {} bytes; a port name has 1 to 64", port.len()));
    }
    port.chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '"' | '\\' | '\''))
        .map(|c| format!("port {port:?} holds {c:?}; a port name is printable ASCII with no space or quote"))
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tor,
    Spine,
    Host,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Tor => "tor",
            Kind::Spine => "spine",
            Kind::Host => "host",
        }
    }
}

/// Tor, spine and host names share one namespace: links and RNICs refer to switches by
/// name alone, and reports mix switch and host entities.
#[derive(Default)]
struct Names<'a> {
    seen: HashMap<&'a str, (Kind, FieldPath)>,
}

impl<'a> Names<'a> {
    fn claim(&mut self, doc: &Document<'_>, name: &'a str, kind: Kind, path: FieldPath) -> Result<(), FileError> {
        if let Some(problem) = name_problem(name) {
            return Err(doc.error(&path, problem, NAME_FIX));
        }
        match self.seen.entry(name) {
            Entry::Occupied(first) => {
                let (first_kind, first_path) = first.get();
                let at = at_line(doc.line_of_path(first_path));
                let problem = if *first_kind == kind {
                    format!("{} name {name:?} is also defined{at}", kind.as_str())
                } else {
                    format!("{} name {name:?} is also the name of a {}{at}", kind.as_str(), first_kind.as_str())
                };
                Err(doc.error(&path, problem, "give every tor, spine and host its own name"))
            }
            Entry::Vacant(slot) => {
                slot.insert((kind, path));
                Ok(())
            }
        }
    }

    fn kind_of(&self, name: &str) -> Option<Kind> {
        self.seen.get(name).map(|(kind, _)| *kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    use crate::tomlfile::testing::doc;

    fn doc_example() -> String {
        crate::tomlfile::testing::doc_example(include_str!("inventory.rs"))
    }

    fn parse(text: &str) -> Result<Inventory, FileError> {
        Inventory::parse(&doc(text), Path::new("inv.toml"))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn err(text: &str) -> FileError {
        match parse(text) {
            Ok(inv) => panic!("expected an error, parsed {inv:?}"),
            Err(e) => e,
        }
    }

    const HEAD: &str = r#"
        version = 1
        [[tor]]
        name = "tor0"
        [[spine]]
        name = "spine0"
    "#;

    fn with_head(rest: &str) -> String {
        // HEAD is lines 1-5; `rest` starts on line 6.
        format!("{}\n{}", HEAD.trim_end(), rest.trim_start_matches('\n'))
    }

    #[test]
    fn the_documented_example_parses() {
        let text = doc_example();
        assert!(text.starts_with("version = 1\n"), "{text}");
        let inv = Inventory::parse(&text, Path::new("inv.toml")).unwrap();
        assert_eq!(inv.version, 1);
        assert_eq!(
            inv.tors,
            vec![
                Tor { name: "tor0".into(), rail: Some(0), addrs: vec![ip("172.16.0.1"), ip("172.16.1.1")] },
                Tor { name: "tor1".into(), rail: Some(1), addrs: Vec::new() }
            ]
        );
        assert_eq!(
            inv.spines,
            vec![Spine { name: "spine0".into(), addrs: vec![ip("172.16.255.1"), ip("fd00:ff::1")] }]
        );
        assert_eq!(inv.links.len(), 2);
        assert_eq!(inv.links[1].a, "spine0");
        assert_eq!(inv.hosts.len(), 2);
        let r0 = &inv.hosts[0].rnics[0];
        assert_eq!(
            *r0,
            Rnic {
                device: "mlx5_0".into(),
                tor: "tor0".into(),
                ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                gid: Some(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped()),
                port: 1,
                gid_index: Some(3),
                tor_port: Some("Ethernet0".into()),
                netdev: Some("ens1f0np0".into()),
            }
        );
        assert_eq!(
            (inv.links[0].port_at("tor0"), inv.links[0].port_at("spine0")),
            (Some("Ethernet48"), Some("Ethernet0"))
        );
        let r1 = &inv.hosts[0].rnics[1];
        assert_eq!((r1.port, r1.gid, r1.gid_index), (1, None, None));
        assert_eq!(r1.ip, "fd00::11".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn round_trips_through_toml() {
        let inv = Inventory::parse(&doc_example(), Path::new("inv.toml")).unwrap();
        let text = inv.to_toml_string().unwrap();
        let again = Inventory::parse(&text, Path::new("inv.toml")).unwrap();
        assert_eq!(again, inv);
        // Optional fields that are absent stay absent rather than being written as defaults.
        assert!(!text.contains("gid_index = 0"), "{text}");
    }

    #[test]
    fn an_empty_inventory_is_valid() {
        let inv = parse("version = 1").unwrap();
        assert!(inv.tors.is_empty() && inv.hosts.is_empty() && inv.links.is_empty());
        assert_eq!(inv.to_toml_string().unwrap(), "version = 1\n");
    }

    #[test]
    fn gid_defaults_to_the_address() {
        let mut rnic = Rnic {
            device: "mlx5_0".into(),
            tor: "tor0".into(),
            ip: "10.1.2.3".parse().unwrap(),
            gid: None,
            port: 1,
            gid_index: None,
            tor_port: None,
            netdev: None,
        };
        assert_eq!(rnic.gid_or_mapped(), "::ffff:10.1.2.3".parse::<Ipv6Addr>().unwrap());
        rnic.ip = "fd00::7".parse().unwrap();
        assert_eq!(rnic.gid_or_mapped(), "fd00::7".parse::<Ipv6Addr>().unwrap());
        rnic.gid = Some("fe80::1".parse().unwrap());
        assert_eq!(rnic.gid_or_mapped(), "fe80::1".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn rnic_name_joins_host_and_device() {
        assert_eq!(Inventory::rnic_name("tor3-h5", "rnic0"), "tor3-h5/rnic0");
    }

    #[test]
    fn bad_characters_in_a_name_are_refused() {
        let e = err(r#"
            version = 1
            [[tor]]
            name = "tor0"
            [[tor]]
            name = "tor/1"
        "#);
        assert_eq!((e.field.as_str(), e.line), ("tor[1].name", Some(5)));
        assert!(e.problem.contains("'/'"), "{e}");
        assert!(e.fix.contains("letters, digits"), "{e}");
    }

    #[test]
    fn an_empty_host_name_is_refused() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = ""
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].name", Some(7)));
        assert!(e.problem.contains("empty"), "{e}");
    }

    #[test]
    fn a_bad_device_name_is_refused() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5 0"
            tor = "tor0"
            ip = "10.0.0.1"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[0].device", Some(9)));
        assert!(e.problem.contains("' '"), "{e}");
    }

    #[test]
    fn duplicate_tor_says_where_the_first_is() {
        let e = err(r#"
            version = 1
            [[tor]]
            name = "tor0"
            [[tor]]
            name = "tor1"
            [[tor]]
            name = "tor0"
        "#);
        assert_eq!((e.field.as_str(), e.line), ("tor[2].name", Some(7)));
        assert!(e.problem.contains("also defined at line 3"), "{e}");
        assert!(e.fix.contains("its own name"), "{e}");
    }

    #[test]
    fn duplicate_spine_is_refused() {
        let e = err(&with_head(
            r#"
            [[spine]]
            name = "spine0"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("spine[1].name", Some(7)));
        assert!(e.problem.contains("also defined at line 5"), "{e}");
    }

    #[test]
    fn a_spine_may_not_reuse_a_tor_name() {
        let e = err(r#"
            version = 1
            [[tor]]
            name = "sw0"
            [[spine]]
            name = "sw0"
        "#);
        assert_eq!((e.field.as_str(), e.line), ("spine[0].name", Some(5)));
        assert!(e.problem.contains("name of a tor at line 3"), "{e}");
    }

    #[test]
    fn duplicate_host_is_refused() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.2"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[1].name", Some(13)));
        assert!(e.problem.contains("also defined at line 7"), "{e}");
    }

    #[test]
    fn duplicate_device_within_a_host_is_refused() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.2"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[1].device", Some(13)));
        assert!(e.problem.contains("also defined at line 9"), "{e}");
    }

    #[test]
    fn the_same_device_name_on_two_hosts_is_fine() {
        let inv = parse(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            [[host]]
            name = "h1"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.2"
        "#,
        ))
        .unwrap();
        assert_eq!(inv.hosts.len(), 2);
    }

    #[test]
    fn a_host_without_rnic_is_refused() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic", Some(6)));
        assert!(e.problem.contains("has no [[host.rnic]]"), "{e}");
    }

    #[test]
    fn an_rnic_on_an_undefined_tor_is_refused() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor9"
            ip = "10.0.0.1"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[0].tor", Some(10)));
        assert!(e.problem.contains("no tor named \"tor9\""), "{e}");
        assert_eq!(e.fix, "add a [[tor]] named \"tor9\" or correct the name");
    }

    #[test]
    fn an_rnic_on_a_spine_is_refused() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "spine0"
            ip = "10.0.0.1"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[0].tor", Some(10)));
        assert!(e.problem.contains("is a spine, not a tor"), "{e}");
    }

    #[test]
    fn port_zero_is_refused() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            port = 0
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[0].port", Some(12)));
        assert!(e.problem.contains("numbered from 1"), "{e}");
    }

    #[test]
    fn an_unparseable_ip_has_its_line() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.256"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[0].ip", Some(11)));
        assert!(e.problem.contains("invalid IP address"), "{e}");
    }

    #[test]
    fn an_ipv4_gid_has_its_line() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            gid = "10.0.0.1"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[0].gid", Some(12)));
        assert!(e.problem.contains("invalid IPv6 address"), "{e}");
    }

    #[test]
    fn a_duplicate_ip_is_refused() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            [[host]]
            name = "h1"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[1].rnic[0].ip", Some(17)));
        assert!(e.problem.contains("10.0.0.1 is also claimed by h0/mlx5_0 at line 11"), "{e}");
    }

    #[test]
    fn a_duplicate_gid_is_refused_even_when_derived() {
        // h1's explicit GID is what h0's IPv4 address maps to.
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            [[host]]
            name = "h1"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.2"
            gid = "::ffff:10.0.0.1"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[1].rnic[0].gid", Some(18)));
        assert!(e.problem.contains("GID ::ffff:10.0.0.1 is also the GID of h0/mlx5_0 at line 11"), "{e}");
    }

    #[test]
    fn a_link_to_an_unknown_switch_is_refused() {
        let e = err(&with_head(
            r#"
            [[link]]
            a = "tor0"
            b = "spine7"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("link[0].b", Some(8)));
        assert!(e.problem.contains("no tor or spine named \"spine7\""), "{e}");
        assert!(e.fix.contains("add a [[tor]] or [[spine]]"), "{e}");
    }

    #[test]
    fn a_link_between_two_tors_is_refused() {
        let e = err(&with_head(
            r#"
            [[tor]]
            name = "tor1"
            [[link]]
            a = "tor0"
            b = "tor1"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("link[0].b", Some(10)));
        assert!(e.problem.contains("joins two tors"), "{e}");
    }

    #[test]
    fn a_duplicate_link_in_either_order_is_refused() {
        let e = err(&with_head(
            r#"
            [[link]]
            a = "tor0"
            b = "spine0"
            [[link]]
            a = "spine0"
            b = "tor0"
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("link[1]", Some(9)));
        assert!(e.problem.contains("also defined at line 6"), "{e}");
    }

    #[test]
    fn a_switch_port_holds_one_cable_and_port_names_are_checked() {
        let links = r#"
            [[link]]
            a = "tor0"
            b = "spine0"
            a_port = "Ethernet1/1"
            b_port = "Ethernet0"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            tor_port = "PORT"
        "#;
        let inv = parse(&with_head(&links.replace("PORT", "Ethernet2"))).unwrap();
        assert_eq!((inv.links[0].port_at("spine0"), inv.links[0].port_at("tor1")), (Some("Ethernet0"), None));
        assert_eq!(inv.hosts[0].rnics[0].tor_port.as_deref(), Some("Ethernet2"));
        let e = err(&with_head(&links.replace("PORT", "Ethernet1/1")));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[0].tor_port", Some(17)));
        assert!(e.problem.contains("port \"Ethernet1/1\" of \"tor0\" is also given at line 9"), "{e}");
        let e = err(&with_head(&links.replace("PORT", "eth 2")));
        assert_eq!(e.field.as_str(), "host[0].rnic[0].tor_port");
        assert!(e.problem.contains("holds ' '") && e.fix.contains("Ethernet48"), "{e}");
        let netdev =
            links.replace("PORT", "Ethernet2").replace("tor_port", "netdev = \"ens1 f0\"\n            tor_port");
        let e = err(&with_head(&netdev));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[0].netdev", Some(17)));
        assert!(e.problem.contains("holds ' '") && e.fix.contains("ip link"), "{e}");
        let twice = format!(
            "{}\n            [[host.rnic]]\n            device = \"mlx5_1\"\n            tor = \"tor0\"\n            ip = \"10.0.0.2\"\n            netdev = \"ens1\"\n",
            links.replace("PORT", "Ethernet2").replace("tor_port", "netdev = \"ens1\"\n            tor_port")
        );
        let e = err(&with_head(&twice));
        assert_eq!(e.field.as_str(), "host[0].rnic[1].netdev", "{e}");
        assert!(e.problem.contains("also another RNIC's of host \"h0\""), "{e}");
    }

    #[test]
    fn rails_are_all_or_nothing() {
        let e = err(r#"
            version = 1
            [[tor]]
            name = "tor0"
            rail = 0
            [[tor]]
            name = "tor1"
        "#);
        // The missing rail is reported at its [[tor]].
        assert_eq!((e.field.as_str(), e.line), ("tor[1].rail", Some(5)));
        assert!(e.problem.contains("\"tor0\" at line 4 has one"), "{e}");
        // Two pods: each rail has one ToR per pod.
        let inv = parse(
            r#"
            version = 1
            [[tor]]
            name = "pod0-rail0"
            rail = 0
            [[tor]]
            name = "pod1-rail0"
            rail = 0
        "#,
        )
        .unwrap();
        assert_eq!(inv.tors[1].rail, Some(0));
    }

    #[test]
    fn version_two_is_refused_before_its_fields() {
        let e = err(r#"
            version = 2
            [[switch]]
            name = "tor0"
        "#);
        assert_eq!((e.field.as_str(), e.line), ("version", Some(1)));
        assert_eq!(e.problem, "inventory format version 2 is not supported by this build (it reads version 1)");
    }

    #[test]
    fn a_missing_version_is_refused() {
        let e = err(r#"
            [[tor]]
            name = "tor0"
        "#);
        assert_eq!((e.field.as_str(), e.line), ("version", None));
        assert!(e.problem.contains("no `version`"), "{e}");
        assert!(e.fix.contains("version = 1"), "{e}");
    }

    #[test]
    fn an_unknown_field_is_named() {
        let e = err(&with_head(
            r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            gid_idx = 3
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("host[0].rnic[0].gid_idx", Some(12)));
        assert!(e.problem.contains("unknown field `gid_idx`"), "{e}");
    }

    #[test]
    fn a_syntax_error_has_its_line() {
        let e = err(r#"
            version = 1
            [[tor]]
            name = "tor0"
            [[tor]
            name = "tor1"
        "#);
        assert_eq!(e.line, Some(4));
        assert!(e.problem.starts_with("invalid TOML"), "{e}");
    }

    #[test]
    fn switch_addrs_map_every_address_to_its_switch() {
        let inv = Inventory::parse(&doc_example(), Path::new("inv.toml")).unwrap();
        let map = inv.switch_addrs();
        assert_eq!(map.len(), 4, "{map:?}");
        let at = |text: &str| map.get(&crate::gid::gid_bytes(ip(text))).copied();
        assert_eq!((at("172.16.0.1"), at("172.16.1.1")), (Some("tor0"), Some("tor0")));
        assert_eq!((at("172.16.255.1"), at("fd00:ff::1")), (Some("spine0"), Some("spine0")));
        assert_eq!(at("10.0.0.1"), None, "an RNIC's address is no switch's");
        // Keys are what a record's dictionary carries for IPv4: the IPv4-mapped bytes.
        let mapped: Ipv6Addr = "::ffff:172.16.0.1".parse().unwrap();
        assert_eq!(map.get(&mapped.octets()).copied(), Some("tor0"));
    }

    #[test]
    fn inventories_without_switch_addrs_serialise_as_before() {
        let text = doc(HEAD);
        let inv = Inventory::parse(&text, Path::new("inv.toml")).unwrap();
        assert!(inv.switch_addrs().is_empty());
        let written = inv.to_toml_string().unwrap();
        assert!(!written.contains("addrs"), "{written}");
        let with = parse(&with_head("addrs = [\"172.16.0.1\"]\n")).unwrap();
        assert_eq!(with.spines[0].addrs, vec![ip("172.16.0.1")]);
        let written = with.to_toml_string().unwrap();
        assert!(written.contains("addrs = [\"172.16.0.1\"]"), "{written}");
        assert_eq!(Inventory::parse(&written, Path::new("inv.toml")).unwrap(), with);
    }

    #[test]
    fn an_unparseable_switch_address_names_its_field_line_and_fix() {
        let e = err(&with_head(
            r#"
            [[spine]]
            name = "spine1"
            addrs = ["172.16.0.1",
                     "172.16.0.300"]
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("spine[1].addrs[1]", Some(9)));
        assert!(e.problem.contains("invalid IP address"), "{e}");
        assert_eq!(e.fix, ADDR_FIX);
        let e = err(r#"
            version = 1
            [[tor]]
            name = "tor0"
            addrs = "172.16.0.1"
        "#);
        assert_eq!((e.field.as_str(), e.line), ("tor[0].addrs", Some(4)));
    }

    #[test]
    fn a_switch_address_used_twice_names_both_places() {
        // Two switches.
        let e = err(&with_head(
            r#"
            [[tor]]
            name = "tor1"
            addrs = ["172.16.0.1"]
            [[spine]]
            name = "spine1"
            addrs = ["fd00::9", "::ffff:172.16.0.1"]
        "#,
        ));
        assert_eq!((e.field.as_str(), e.line), ("spine[1].addrs[1]", Some(11)));
        assert!(
            e.problem
                .contains("address ::ffff:172.16.0.1 is also an address of tor \"tor1\" (tor[1].addrs[0] at line 8)"),
            "{e}"
        );
        assert!(e.fix.contains("one switch only"), "{e}");
        // One switch, twice.
        let e = err(&with_head("addrs = [\"172.16.0.1\", \"172.16.0.1\"]\n"));
        assert_eq!((e.field.as_str(), e.line), ("spine[0].addrs[1]", Some(6)));
        assert!(e.problem.contains("also an address of spine \"spine0\" (spine[0].addrs[0] at line 6)"), "{e}");
    }

    #[test]
    fn a_switch_address_may_not_be_an_rnic_address_or_gid() {
        let rnics = r#"
            [[host]]
            name = "h0"
            [[host.rnic]]
            device = "mlx5_0"
            tor = "tor0"
            ip = "10.0.0.1"
            gid = "fd00::77"
        "#;
        let e = err(&format!("{}[[spine]]\nname = \"spine1\"\naddrs = [\"10.0.0.1\"]\n", with_head(rnics)));
        assert_eq!((e.field.as_str(), e.line), ("spine[1].addrs[0]", Some(15)));
        assert!(
            e.problem
                .contains("address 10.0.0.1 is also the address of RNIC h0/mlx5_0 (host[0].rnic[0].ip at line 11)"),
            "{e}"
        );
        let e = err(&format!("{}[[spine]]\nname = \"spine1\"\naddrs = [\"fd00::77\"]\n", with_head(rnics)));
        assert_eq!(e.field, "spine[1].addrs[0]");
        assert!(e.problem.contains("is also the GID of RNIC h0/mlx5_0 (host[0].rnic[0].gid at line 12)"), "{e}");
    }

    #[test]
    fn load_reads_the_file_and_names_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inventory.toml");
        let e = Inventory::load(&path).unwrap_err();
        assert_eq!(e.file, path);
        assert!(e.to_string().contains("inventory.toml"), "{e}");

        std::fs::write(&path, doc_example()).unwrap();
        let inv = Inventory::load(&path).unwrap();
        assert_eq!(inv.hosts[1].name, "tor1-h0");

        std::fs::write(&path, "version = 1\n[[tor]]\nname = \"\"\n").unwrap();
        let e = Inventory::load(&path).unwrap_err();
        assert_eq!((e.file.as_path(), e.line), (path.as_path(), Some(3)));
    }

    fn name_prefix() -> impl Strategy<Value = String> {
        "[A-Za-z0-9._:-]{1,8}"
    }

    prop_compose! {
        fn arb_inventory()(
            tor_prefixes in proptest::collection::vec(name_prefix(), 1..5),
            switch_addr_counts in proptest::collection::vec((0..3usize, any::<bool>()), 8),
            rails in any::<bool>(),
            rail_values in proptest::collection::vec(any::<u16>(), 5),
            spine_prefixes in proptest::collection::vec(name_prefix(), 0..3),
            link_picks in proptest::collection::vec(any::<bool>(), 0..12),
            hosts in proptest::collection::vec(
                (name_prefix(), proptest::collection::vec(
                    (name_prefix(), any::<usize>(), any::<bool>(), any::<bool>(),
                     any::<u8>(), proptest::option::of(any::<u16>())),
                    1..4)),
                0..5),
        ) -> Inventory {
            // A counter suffix after the last '-' keeps random names unique.
            let mut counter = 0u32;
            let mut unique = |prefix: &str| {
                counter += 1;
                format!("{prefix}-{counter}")
            };
            // Switch addresses from their own ranges (172.16/16, fd01::/16), unlike the RNICs'.
            let mut switch_address = 0u32;
            let mut counts = switch_addr_counts.iter().copied();
            let mut addrs = || -> Vec<IpAddr> {
                let (n, v6) = counts.next().unwrap_or((0, false));
                (0..n)
                    .map(|_| {
                        switch_address += 1;
                        if v6 {
                            IpAddr::V6(Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, switch_address as u16))
                        } else {
                            IpAddr::V4(Ipv4Addr::from(0xac10_0000 + switch_address))
                        }
                    })
                    .collect()
            };
            let tors: Vec<Tor> = tor_prefixes
                .iter()
                .enumerate()
                .map(|(i, p)| Tor { name: unique(p), rail: rails.then(|| rail_values[i]), addrs: addrs() })
                .collect();
            let spines: Vec<Spine> = spine_prefixes
                .iter()
                .map(|p| Spine { name: unique(p), addrs: addrs() })
                .collect();
            let mut links = Vec::new();
            let mut pick = link_picks.iter();
            for (ti, tor) in tors.iter().enumerate() {
                for spine in &spines {
                    if pick.next().copied().unwrap_or(false) {
                        // Alternate the order: either is valid.
                        links.push(if ti % 2 == 0 {
                            Link::new(tor.name.clone(), spine.name.clone())
                        } else {
                            Link::new(spine.name.clone(), tor.name.clone())
                        });
                    }
                }
            }
            let mut address = 0u32;
            let hosts = hosts
                .iter()
                .map(|(host_prefix, rnics)| Host {
                    name: unique(host_prefix),
                    rnics: rnics
                        .iter()
                        .map(|(device, tor, v6, explicit_gid, port, gid_index)| {
                            address += 1;
                            let ip = if *v6 {
                                IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, address as u16))
                            } else {
                                IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + address))
                            };
                            Rnic {
                                device: unique(device),
                                tor: tors[tor % tors.len()].name.clone(),
                                ip,
                                gid: explicit_gid
                                    .then(|| Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, address as u16)),
                                port: (*port).max(1),
                                gid_index: *gid_index,
                                tor_port: None,
                                netdev: None,
                            }
                        })
                        .collect(),
                })
                .collect();
            Inventory { version: VERSION, tors, spines, links, hosts }
        }
    }

    fn whole(text: &str) -> Result<Inventory, FileError> {
        Inventory::parse_with(text, Path::new("inv.toml"), usize::MAX, 1)
    }

    fn in_three_threads(text: &str) -> Result<Inventory, FileError> {
        Inventory::parse_with(text, Path::new("inv.toml"), 0, 3)
    }

    fn hosts(n: usize, bad: Option<usize>) -> String {
        (0..n)
            .map(|h| {
                let ip = if bad == Some(h) { "10.0.0.999".to_owned() } else { format!("10.0.0.{}", h + 1) };
                format!(
                    "[[host]]\nname = \"h{h}\"\n[[host.rnic]]\ndevice = \"mlx5_0\"\ntor = \"tor0\"\nip = \"{ip}\"\n"
                )
            })
            .collect()
    }

    #[test]
    fn a_large_inventory_is_parsed_in_parts_like_the_whole() {
        let text = format!("{}\n{}[[tor]]\nname = \"tor1\"\n{}", doc(HEAD), hosts(40, None), hosts(0, None));
        assert!(in_parts(&text, 0, 3).is_some(), "the parts path was not taken");
        let inv = in_three_threads(&text).unwrap();
        assert_eq!(Ok(&inv), whole(&text).as_ref());
        assert_eq!((inv.hosts.len(), inv.tors.len()), (40, 2));
        assert_eq!(inv.hosts[39].name, "h39");
    }

    #[test]
    fn what_the_parts_cannot_mean_alike_falls_back_to_the_whole_parse() {
        let head = doc(HEAD);
        // A `[[host]]` line inside a multi-line string: the part before the cut is unterminated.
        let in_string =
            format!("{head}{}[[host]]\nname = \"\"\"\n[[host]]\nx\"\"\"\n{}", hosts(5, None), hosts(5, None));
        // A later part's header that refers back to an earlier part's array entry.
        let back = format!("{head}{}[tor.extra]\nx = 1\n", hosts(10, None));
        // A bad value in a late part, and a duplicate across parts (a validation error).
        let late_bad = format!("{head}{}", hosts(10, Some(8)));
        let duplicate = format!("{head}{}{}", hosts(6, None), hosts(1, None));
        for (text, cut) in [(in_string, false), (back, false), (late_bad, false), (duplicate, true)] {
            assert_eq!(in_parts(&text, 0, 3).is_some(), cut, "{text}");
            let e = whole(&text).unwrap_err();
            assert!(e.line.is_some(), "{e}");
            assert_eq!(in_three_threads(&text).unwrap_err(), e);
        }
    }

    proptest! {
        #[test]
        fn parts_parse_like_the_whole(inv in arb_inventory()) {
            let text = inv.to_toml_string().unwrap();
            prop_assert_eq!(in_three_threads(&text), Ok(inv));
        }

        #[test]
        fn valid_inventories_round_trip(inv in arb_inventory()) {
            let text = inv.to_toml_string().unwrap();
            let parsed = Inventory::parse(&text, Path::new("inv.toml"));
            prop_assert_eq!(parsed, Ok(inv), "{}", text);
        }
    }
}
