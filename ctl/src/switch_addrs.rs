//! `ctl inventory switch-addrs`: the switches' own addresses into an inventory, from a list an
//! operator exports from IPAM, LLDP or the switches' configuration.
//!
//! Path traces know a hop only by the address its ICMP time-exceeded reply came from (an
//! interface or loopback address of the switch); `analyze` names the hop after the switch whose
//! inventory `addrs` list that address, and leaves out traces through addresses no switch lists.
//!
//! The list ([`AddrList`]) is CSV lines `switch,addr`, one address per line and a switch on as
//! many lines as it has addresses; `#` starts a comment, blank lines are ignored, and a first
//! line `switch,addr` is a header. Each switch the list names gets exactly the listed addresses
//! (its previous `addrs` are replaced, so a corrected list removes stale ones); the switches it
//! does not name keep theirs.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rocemesh_formats::gid::gid_bytes;
use rocemesh_formats::inventory::{FileError, Inventory, NAME_FIX, name_problem};

use crate::error::Error;

/// One line of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    line: usize,
    switch: String,
    addr: IpAddr,
}

/// A checked `switch,addr` list: names are usable and no address is given twice.
#[derive(Debug, Clone)]
pub struct AddrList {
    file: PathBuf,
    entries: Vec<Entry>,
}

const FORMAT_FIX: &str = "write `switch,addr` lines, e.g. `spine1,172.16.255.1` (one address per line)";

impl AddrList {
    /// Reads and checks the list at `path`.
    pub fn load(path: &Path) -> Result<AddrList, FileError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            FileError::new(
                path,
                None,
                "",
                format!("cannot read the switch address list: {e}"),
                "check the path; the file must be readable UTF-8 text",
            )
        })?;
        Self::parse(&text, path)
    }

    /// Parses `text`; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<AddrList, FileError> {
        let mut entries: Vec<Entry> = Vec::new();
        // An address twice would be ambiguous on two switches and redundant on one; compared as
        // records carry it, so `172.16.0.1` and `::ffff:172.16.0.1` are the same.
        let mut seen: HashMap<[u8; 16], usize> = HashMap::new();
        for (line, fields) in crate::import::csv_records(text) {
            let [switch, addr] = fields[..] else {
                return Err(FileError::new(
                    path,
                    Some(line),
                    "",
                    format!("{} fields; a line has 2", fields.len()),
                    FORMAT_FIX,
                ));
            };
            if entries.is_empty() && [switch, addr] == ["switch", "addr"] {
                continue;
            }
            if let Some(problem) = name_problem(switch) {
                return Err(FileError::new(path, Some(line), "switch", problem, NAME_FIX));
            }
            let addr: IpAddr = addr.parse().map_err(|_| {
                FileError::new(
                    path,
                    Some(line),
                    "addr",
                    format!("{addr:?} is not an IP address"),
                    "write the address as IPv4 (`172.16.0.1`) or IPv6 (`fd00::1`) text",
                )
            })?;
            if let Some(first) = seen.insert(gid_bytes(addr), line) {
                let first_switch = entries.iter().find(|e| e.line == first).map_or("", |e| e.switch.as_str());
                return Err(FileError::new(
                    path,
                    Some(line),
                    "addr",
                    format!("address {addr} is also given at line {first} (for {first_switch})"),
                    "give every address once, for the one switch that answers from it: remove one of the lines",
                ));
            }
            entries.push(Entry { line, switch: switch.to_owned(), addr });
        }
        Ok(AddrList { file: path.to_path_buf(), entries })
    }

    /// Addresses listed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the list gives no address.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What [`apply`] made.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The inventory with the listed switches' addresses; it has passed [`Inventory::parse`].
    pub inventory: Inventory,
    /// Switches whose addresses the list set.
    pub switches: usize,
    /// Addresses the list set.
    pub addrs: usize,
    /// Addresses those switches had that the list does not give: (switch, address).
    pub removed: Vec<(String, IpAddr)>,
}

/// The inventory `inv` (read from `inv_path`) with every switch the list names given exactly
/// its listed addresses; `out` is where it will be written (only used in errors). Refuses, naming
/// the list's line, a switch the inventory does not declare and an address an RNIC (ip or GID)
/// or a switch the list does not name already has.
pub fn apply(inv: &Inventory, inv_path: &Path, list: &AddrList, out: &Path) -> Result<Applied, Error> {
    let list_file = list.file.as_path();
    let inv_name = inv_path.display();
    let mut switch_kind: HashMap<&str, &'static str> = HashMap::new();
    switch_kind.extend(inv.tors.iter().map(|t| (t.name.as_str(), "tor")));
    switch_kind.extend(inv.spines.iter().map(|s| (s.name.as_str(), "spine")));
    let mut listed: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
    for e in &list.entries {
        if !switch_kind.contains_key(e.switch.as_str()) {
            let what = if inv.hosts.iter().any(|h| h.name == e.switch) {
                format!("{:?} is a host in {inv_name}, not a switch", e.switch)
            } else {
                format!("there is no tor or spine named {:?} in {inv_name}", e.switch)
            };
            return Err(FileError::new(
                list_file,
                Some(e.line),
                "switch",
                what,
                format!("correct the name, or add a [[tor]] or [[spine]] named {:?} to the inventory", e.switch),
            )
            .into());
        }
        listed.entry(e.switch.as_str()).or_default().push(e.addr);
    }

    // Who else answers from an address: RNICs (ip and GID), and the switches the list leaves as
    // they are (the listed ones' old addresses are being replaced).
    let mut owners: HashMap<[u8; 16], String> = HashMap::new();
    for h in &inv.hosts {
        for r in &h.rnics {
            let name = Inventory::rnic_name(&h.name, &r.device);
            owners.entry(gid_bytes(r.ip)).or_insert_with(|| format!("the address of RNIC {name}"));
            owners.entry(r.gid_or_mapped().octets()).or_insert_with(|| format!("the GID of RNIC {name}"));
        }
    }
    let kept = inv
        .tors
        .iter()
        .map(|t| ("tor", &t.name, &t.addrs))
        .chain(inv.spines.iter().map(|s| ("spine", &s.name, &s.addrs)));
    for (kind, name, addrs) in kept.filter(|(_, name, _)| !listed.contains_key(name.as_str())) {
        for a in addrs {
            owners
                .entry(gid_bytes(*a))
                .or_insert_with(|| format!("an address of {kind} {name:?}, which the list does not name"));
        }
    }
    for e in &list.entries {
        if let Some(owner) = owners.get(&gid_bytes(e.addr)) {
            return Err(FileError::new(
                list_file,
                Some(e.line),
                "addr",
                format!("address {} is {owner} in {inv_name}", e.addr),
                "correct the address: a path-trace hop from it must name one switch (list every address of a switch you move it to, and none of an RNIC)",
            )
            .into());
        }
    }

    let mut inventory = inv.clone();
    let mut removed = Vec::new();
    let mut set = |name: &str, addrs: &mut Vec<IpAddr>| {
        if let Some(new) = listed.get(name) {
            let gone = addrs.iter().filter(|a| !new.iter().any(|n| gid_bytes(*n) == gid_bytes(**a)));
            removed.extend(gone.map(|a| (name.to_owned(), *a)));
            addrs.clone_from(new);
        }
    };
    for t in &mut inventory.tors {
        set(&t.name, &mut t.addrs);
    }
    for s in &mut inventory.spines {
        set(&s.name, &mut s.addrs);
    }
    // What is written must read back: the format's own validation, on the text.
    let text = inventory.to_toml_string().map_err(|e| {
        Error::invalid(
            format!("cannot serialise the inventory: {e}"),
            "report this as a bug: the inventory types always serialise",
        )
    })?;
    Inventory::parse(&text, out)?;
    Ok(Applied { inventory, switches: listed.len(), addrs: list.len(), removed })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INV: &str = r#"
version = 1
[[tor]]
name = "tor0"
addrs = ["172.16.0.9"]
[[tor]]
name = "tor1"
addrs = ["172.16.1.1"]
[[spine]]
name = "spine0"
[[host]]
name = "h0"
[[host.rnic]]
device = "d"
tor = "tor0"
ip = "10.0.0.1"
"#;

    fn inv() -> Inventory {
        Inventory::parse(INV, Path::new("inv.toml")).unwrap()
    }

    fn list(text: &str) -> Result<AddrList, FileError> {
        AddrList::parse(text, Path::new("addrs.csv"))
    }

    fn apply_text(text: &str) -> Result<Applied, Error> {
        apply(&inv(), Path::new("inv.toml"), &list(text).unwrap(), Path::new("out.toml"))
    }

    #[test]
    fn listed_switches_get_exactly_their_addresses_and_others_keep_theirs() {
        let text = "switch,addr\n# spines\nspine0, 172.16.255.1\nspine0,fd00:ff::1  # loopback\n\ntor0,172.16.0.1\n";
        let applied = apply_text(text).unwrap();
        let i = &applied.inventory;
        assert_eq!(i.spines[0].addrs, ["172.16.255.1".parse::<IpAddr>().unwrap(), "fd00:ff::1".parse().unwrap()]);
        assert_eq!(i.tors[0].addrs, ["172.16.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(i.tors[1].addrs, ["172.16.1.1".parse::<IpAddr>().unwrap()], "not listed: kept");
        assert_eq!((applied.switches, applied.addrs), (2, 3));
        assert_eq!(applied.removed, [("tor0".to_owned(), "172.16.0.9".parse().unwrap())]);
        assert_eq!(i.switch_addrs().len(), 4);
    }

    #[test]
    fn list_lines_are_checked() {
        let e = list("spine0,172.16.0.1,x\n").unwrap_err();
        assert_eq!((e.line, e.problem.as_str()), (Some(1), "3 fields; a line has 2"));
        let e = list("switch,addr\nspine 0,172.16.0.1\n").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(2), "switch"));
        assert_eq!(e.fix, NAME_FIX);
        let e = list("spine0,172.16.0.300\n").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(1), "addr"));
        assert!(e.problem.contains("\"172.16.0.300\" is not an IP address"), "{e}");
        let e = list("spine0,172.16.0.1\n\ntor1,::ffff:172.16.0.1\n").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(3), "addr"));
        assert!(e.problem.contains("also given at line 1 (for spine0)"), "{e}");
        assert!(list("# nothing yet\n").unwrap().is_empty());
    }

    #[test]
    fn unknown_switches_and_taken_addresses_are_refused_at_their_line() {
        let text = |e: Error| e.to_string();
        let e = text(apply_text("spine0,172.16.255.1\nspine9,172.16.255.2\n").unwrap_err());
        assert!(e.starts_with("addrs.csv:2: switch: there is no tor or spine named \"spine9\" in inv.toml"), "{e}");
        let e = text(apply_text("h0,172.16.255.1\n").unwrap_err());
        assert!(e.contains("\"h0\" is a host in inv.toml, not a switch"), "{e}");
        let e = text(apply_text("spine0,10.0.0.1\n").unwrap_err());
        assert!(e.starts_with("addrs.csv:1: addr: address 10.0.0.1 is the address of RNIC h0/d in inv.toml"), "{e}");
        // tor1 is not listed, so its address stays its own.
        let e = text(apply_text("spine0,172.16.1.1\n").unwrap_err());
        assert!(e.contains("is an address of tor \"tor1\", which the list does not name"), "{e}");
        // Moving it is listing both switches.
        let moved = apply_text("spine0,172.16.1.1\ntor1,172.16.1.2\n").unwrap();
        assert_eq!(moved.inventory.switch_addrs()[&gid_bytes("172.16.1.1".parse().unwrap())], "spine0");
    }
}
