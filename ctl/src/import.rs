//! `ctl inventory import`: an inventory from what the agents say about their hosts
//! ([`crate::describe`]) plus where each port is cabled, which hosts cannot know.
//!
//! The ToR of each RNIC comes from one of:
//! - a **ToR map** file ([`TorMap`]): CSV lines `host,device,tor[,rail]`, `device` may be `*`
//!   for every RNIC of the host; what an operator exports from a cabling sheet or LLDP;
//! - a **name rule** ([`NameRule`]): a regex on the host name whose captures fill a ToR name
//!   template, e.g. `^(?P<rack>r[0-9]+)-n[0-9]+$` and `tor-{rack}`;
//! - **rails**: in a rail-optimised fabric RNIC k of every host is under the ToR of rail k, so
//!   the template may use `{rail}` (`su{su}-rail{rail}`, or just `rail{rail}` for one scalable
//!   unit). Rail k is the k-th device name in natural order over all hosts (mlx5_2 before
//!   mlx5_10), or the k-th of an explicit device list.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

use regex::Regex;
use rocemesh_formats::inventory::{self, FileError, Host, Inventory, Link, NAME_FIX, Rnic, Spine, Tor, name_problem};

use crate::describe::HostDescription;
use crate::error::Error;

/// The records of a ctl CSV file (the ToR map, the switch address list): (1-based line, fields
/// trimmed), after `#` comments, blank lines left out.
pub(crate) fn csv_records(text: &str) -> impl Iterator<Item = (usize, Vec<&str>)> {
    text.lines().enumerate().filter_map(|(i, raw)| {
        let content = raw.split('#').next().unwrap_or("").trim();
        (!content.is_empty()).then(|| (i + 1, content.split(',').map(str::trim).collect()))
    })
}

/// A host description and the file it came from.
#[derive(Debug, Clone)]
pub struct Described {
    pub file: PathBuf,
    pub description: HostDescription,
}

/// Reads host descriptions from files, and from `*.toml` files in directories (sorted, not
/// recursive).
pub fn load_descriptions(paths: &[PathBuf]) -> Result<Vec<Described>, Error> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|e| Error::io(path, "list the directory", e))?;
            let mut found = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(path, "list the directory", e))?;
                let p = entry.path();
                if p.extension().is_some_and(|x| x == "toml") && p.is_file() {
                    found.push(p);
                }
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    if files.is_empty() {
        return Err(Error::invalid(
            format!("no host descriptions (*.toml) in {paths:?}"),
            "collect `agent describe` output from every host into one directory and pass it",
        ));
    }
    files.into_iter().map(|file| Ok(Described { description: HostDescription::load(&file)?, file })).collect()
}

/// Where one RNIC is cabled, as a ToR map says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    tor: String,
    rail: Option<u16>,
    line: usize,
}

/// A ToR map: CSV lines `host,device,tor[,rail]`; `#` starts a comment; a line `host,*,tor`
/// places every RNIC of the host not placed by its own line.
#[derive(Debug, Clone)]
pub struct TorMap {
    file: PathBuf,
    exact: HashMap<(String, String), Placement>,
    any_device: HashMap<String, Placement>,
}

impl TorMap {
    /// Reads and checks the map at `path`.
    pub fn load(path: &Path) -> Result<TorMap, FileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| FileError::new(path, None, "", format!("cannot read the ToR map: {e}"), "check the path"))?;
        Self::parse(&text, path)
    }

    /// Parses `text`; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<TorMap, FileError> {
        let mut map = TorMap { file: path.to_path_buf(), exact: HashMap::new(), any_device: HashMap::new() };
        let mut tor_rails: HashMap<String, (Option<u16>, usize)> = HashMap::new();
        let mut with_rail: Option<usize> = None;
        let mut without_rail: Option<usize> = None;
        for (line, fields) in csv_records(text) {
            let format_fix = "write `host,device,tor` or `host,device,tor,rail` (device `*` for all RNICs of the host)";
            if !(3..=4).contains(&fields.len()) {
                return Err(FileError::new(
                    path,
                    Some(line),
                    "",
                    format!("{} fields; a line has 3 or 4", fields.len()),
                    format_fix,
                ));
            }
            if line == 1 && fields[..3] == ["host", "device", "tor"] {
                continue;
            }
            for (column, value) in ["host", "device", "tor"].iter().zip(&fields) {
                if *column == "device" && *value == "*" {
                    continue;
                }
                if let Some(problem) = name_problem(value) {
                    return Err(FileError::new(path, Some(line), *column, problem, NAME_FIX));
                }
            }
            let rail = match fields.get(3) {
                Some(r) => Some(r.parse::<u16>().map_err(|_| {
                    FileError::new(
                        path,
                        Some(line),
                        "rail",
                        format!("rail {r:?} is not a number in 0..=65535"),
                        format_fix,
                    )
                })?),
                None => None,
            };
            *(if rail.is_some() { &mut with_rail } else { &mut without_rail }) = Some(line);
            if let (Some(a), Some(b)) = (with_rail, without_rail) {
                return Err(FileError::new(
                    path,
                    Some(line),
                    "rail",
                    format!("line {a} gives a rail and line {b} does not; either every ToR has a rail or none does"),
                    "give every line a rail column, or none",
                ));
            }
            let tor = fields[2].to_owned();
            match tor_rails.get(&tor) {
                Some((other, first)) if *other != rail => {
                    return Err(FileError::new(
                        path,
                        Some(line),
                        "rail",
                        format!(
                            "ToR {tor:?} is on rail {} here and on rail {} at line {first}",
                            show(rail),
                            show(*other)
                        ),
                        "a ToR is on one rail: correct one of the lines",
                    ));
                }
                Some(_) => {}
                None => {
                    tor_rails.insert(tor.clone(), (rail, line));
                }
            }
            let placement = Placement { tor, rail, line };
            let (host, device) = (fields[0].to_owned(), fields[1]);
            let previous = if device == "*" {
                map.any_device.insert(host.clone(), placement)
            } else {
                map.exact.insert((host.clone(), device.to_owned()), placement)
            };
            if let Some(first) = previous {
                return Err(FileError::new(
                    path,
                    Some(line),
                    "",
                    format!("{host},{device} is also placed at line {}", first.line),
                    "place each RNIC once: remove one of the lines",
                ));
            }
        }
        Ok(map)
    }

    fn place(&self, host: &str, device: &str) -> Option<&Placement> {
        self.exact.get(&(host.to_owned(), device.to_owned())).or_else(|| self.any_device.get(host))
    }
}

fn show(rail: Option<u16>) -> String {
    rail.map_or_else(|| "none".to_owned(), |r| r.to_string())
}

/// A ToR name computed from the host name (and, on rail-optimised fabrics, the rail).
#[derive(Debug, Clone)]
pub struct NameRule {
    host_regex: Option<Regex>,
    template: Vec<Piece>,
    template_text: String,
    uses_rail: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Host,
    Device,
    Rail,
    Group(String),
}

impl NameRule {
    /// `host_regex` must match every host name; `template` may use `{host}`, `{device}`,
    /// `{rail}` and the regex's groups (`{rack}`, `{1}`).
    pub fn new(host_regex: Option<&str>, template: &str) -> Result<NameRule, Error> {
        let host_regex = match host_regex {
            Some(r) => Some(Regex::new(r).map_err(|e| {
                Error::invalid(format!("--host-regex {r:?} is not a valid regex: {e}"), "correct the expression")
            })?),
            None => None,
        };
        let mut pieces = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_owned()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(Error::invalid(
                    format!("--tor-name {template:?} has an unclosed '{{'"),
                    "close every placeholder: {rack}, {rail}",
                ));
            };
            let name = &rest[open + 1..open + close];
            pieces.push(match name {
                "host" => Piece::Host,
                "device" => Piece::Device,
                "rail" => Piece::Rail,
                group => {
                    let known = host_regex.as_ref().is_some_and(|r| {
                        r.capture_names().flatten().any(|n| n == group)
                            || group.parse::<usize>().is_ok_and(|n| n > 0 && n < r.captures_len())
                    });
                    if !known {
                        return Err(Error::invalid(
                            format!("--tor-name {template:?} uses {{{group}}}, which is not a group of --host-regex"),
                            "use {host}, {device}, {rail}, or a named or numbered group of --host-regex",
                        ));
                    }
                    Piece::Group(group.to_owned())
                }
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        let uses_rail = pieces.contains(&Piece::Rail);
        Ok(NameRule { host_regex, template: pieces, template_text: template.to_owned(), uses_rail })
    }

    fn expand(&self, host: &str, device: &str, rail: Option<u16>) -> Result<String, String> {
        let captures = match &self.host_regex {
            Some(r) => {
                Some(r.captures(host).ok_or_else(|| format!("host name {host:?} does not match --host-regex {r}"))?)
            }
            None => None,
        };
        let mut out = String::new();
        for piece in &self.template {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Host => out.push_str(host),
                Piece::Device => out.push_str(device),
                Piece::Rail => out.push_str(&show(rail)),
                Piece::Group(g) => {
                    let m = captures.as_ref().and_then(|c| match g.parse::<usize>() {
                        Ok(n) => c.get(n),
                        Err(_) => c.name(g),
                    });
                    let m = m.ok_or_else(|| format!("group {{{g}}} of --host-regex did not match in {host:?}"))?;
                    out.push_str(m.as_str());
                }
            }
        }
        Ok(out)
    }
}

/// Where the ToRs come from.
#[derive(Debug, Clone)]
pub enum TorSource {
    Map(TorMap),
    Rule(NameRule),
}

/// Everything `import` needs besides the descriptions.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub tors: TorSource,
    /// Rail-optimised fabric: RNIC k of each host is on rail k (with a [`NameRule`]), and every
    /// ToR must get a rail.
    pub rail_optimised: bool,
    /// Device names in rail order; default: every device name seen, in natural order.
    pub rail_devices: Option<Vec<String>>,
    /// Add this many spines, `spine0`...
    pub spines: usize,
    /// Link every ToR to every spine (a two-tier Clos).
    pub link_all: bool,
    /// Start from this inventory (switches maintained by hand); described hosts replace its
    /// hosts of the same name, the others are kept.
    pub base: Option<Inventory>,
}

/// The imported inventory and what the operator should know about it.
#[derive(Debug, Clone)]
pub struct Imported {
    pub inventory: Inventory,
    /// Device name of each rail, in rail order (rail-optimised imports with a name rule).
    pub rail_devices: Vec<String>,
    /// Hosts added and hosts replaced in the base.
    pub added: usize,
    pub replaced: usize,
    /// Things worth a look that do not stop the import.
    pub notes: Vec<String>,
}

/// Compares names with their digit runs as numbers: `mlx5_2` < `mlx5_10`, `n9` < `n10`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let db = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let (na, nb) = (trim_zeros(&a[..da]), trim_zeros(&b[..db]));
                let order = na.len().cmp(&nb.len()).then(na.cmp(nb)).then(da.cmp(&db));
                if order != Ordering::Equal {
                    return order;
                }
                (a, b) = (&a[da..], &b[db..]);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                (a, b) = (&a[1..], &b[1..]);
            }
        }
    }
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let zeros = digits.iter().take_while(|&&c| c == b'0').count();
    &digits[zeros.min(digits.len().saturating_sub(1))..]
}

/// Builds the inventory. The result has passed [`Inventory::parse`]; `out` is the path it
/// will be written to, named in errors.
pub fn import(described: &[Described], opts: &ImportOptions, out: &Path) -> Result<Imported, Error> {
    let by_host = description_files(described)?;
    let rail_devices = rail_device_order(described, opts)?;
    let mut draft = Draft::from_base(opts.base.as_ref());
    let mut new_tors: BTreeMap<String, Option<u16>> = BTreeMap::new();
    let (added, replaced) = draft.add_described_hosts(described, opts, &rail_devices, &by_host, &mut new_tors)?;
    draft.add_new_tors(new_tors, opts.base.as_ref())?;
    draft.add_spines_and_links(opts)?;
    check_unique_addresses(&draft.hosts, &draft.host_source)?;
    let notes = notes(described, &rail_devices, &draft.hosts, &draft.tors);
    let inventory = draft.into_inventory();
    check_as_written(&inventory, out)?;
    Ok(Imported { inventory, rail_devices, added, replaced, notes })
}

/// Each described host's file; a host described twice is refused, naming both files.
fn description_files(described: &[Described]) -> Result<HashMap<&str, &Path>, Error> {
    let mut by_host: HashMap<&str, &Path> = HashMap::new();
    for d in described {
        if let Some(first) = by_host.insert(&d.description.host, &d.file) {
            return Err(Error::invalid(
                format!(
                    "host {:?} is described in {} and in {}",
                    d.description.host,
                    first.display(),
                    d.file.display()
                ),
                "keep one description per host (an old file after a rename?)",
            ));
        }
    }
    Ok(by_host)
}

/// The inventory while it is assembled: the base's switches and hosts, then the described hosts
/// and the ToRs they bring.
struct Draft {
    tors: Vec<Tor>,
    /// Position of each ToR in `tors`, by name.
    tor_index: HashMap<String, usize>,
    spines: Vec<Spine>,
    links: Vec<Link>,
    hosts: Vec<Host>,
    /// Where each host of `hosts` came from (a description file, or the base), for errors.
    host_source: Vec<String>,
}

impl Draft {
    /// Everything the base inventory declares; empty without a base.
    fn from_base(base: Option<&Inventory>) -> Draft {
        let mut draft = Draft {
            tors: Vec::new(),
            tor_index: HashMap::new(),
            spines: Vec::new(),
            links: Vec::new(),
            hosts: Vec::new(),
            host_source: Vec::new(),
        };
        if let Some(base) = base {
            for t in &base.tors {
                draft.tor_index.insert(t.name.clone(), draft.tors.len());
                draft.tors.push(t.clone());
            }
            draft.spines = base.spines.clone();
            draft.links = base.links.clone();
            draft.hosts = base.hosts.clone();
            draft.host_source = base.hosts.iter().map(|_| "the base inventory".to_owned()).collect();
        }
        draft
    }

    /// Adds the described hosts in natural name order, each replacing the base's host of its name;
    /// returns how many were added and how many replaced. ToRs the base lacks go to `new_tors`.
    fn add_described_hosts(
        &mut self,
        described: &[Described],
        opts: &ImportOptions,
        rail_devices: &[String],
        by_host: &HashMap<&str, &Path>,
        new_tors: &mut BTreeMap<String, Option<u16>>,
    ) -> Result<(usize, usize), Error> {
        let mut sorted: Vec<&Described> = described.iter().collect();
        sorted.sort_by(|a, b| natural_cmp(&a.description.host, &b.description.host));
        let (mut added, mut replaced) = (0, 0);
        for d in sorted {
            let rnics = self.described_rnics(d, opts, rail_devices, by_host, new_tors)?;
            let host = Host { name: d.description.host.clone(), rnics };
            match self.hosts.iter().position(|h| h.name == d.description.host) {
                Some(i) => {
                    self.hosts[i] = host;
                    self.host_source[i] = d.file.display().to_string();
                    replaced += 1;
                }
                None => {
                    self.hosts.push(host);
                    self.host_source.push(d.file.display().to_string());
                    added += 1;
                }
            }
        }
        Ok((added, replaced))
    }

    /// One described host's RNICs, each placed under its ToR; ToRs the base lacks go to `new_tors`.
    fn described_rnics(
        &self,
        d: &Described,
        opts: &ImportOptions,
        rail_devices: &[String],
        by_host: &HashMap<&str, &Path>,
        new_tors: &mut BTreeMap<String, Option<u16>>,
    ) -> Result<Vec<Rnic>, Error> {
        let desc = &d.description;
        let mut rnics = Vec::with_capacity(desc.rnics.len());
        for r in &desc.rnics {
            let (tor, rail) = place(d, &r.device, opts, rail_devices)?;
            self.check_tor_name(&tor, &desc.host, &r.device, by_host)?;
            if opts.rail_optimised && rail.is_none() {
                return Err(Error::invalid(
                    format!("--rail-optimised, but the ToR map gives no rail for {}/{}", desc.host, r.device),
                    "add a rail column to the ToR map (`host,device,tor,rail`)",
                ));
            }
            self.check_tor_rail(&tor, rail, &desc.host, &r.device, new_tors)?;
            rnics.push(Rnic {
                device: r.device.clone(),
                ip: r.ip,
                // Only when it is not the one the format derives from `ip`: shorter files, and
                // an address change cannot leave a stale GID behind.
                gid: r.gid.filter(|g| *g != rocemesh_formats::gid::gid_of(r.ip)),
                port: r.port,
                gid_index: r.gid_index,
                // A re-described RNIC still under the same ToR keeps the port `inventory lldp`
                // found for it; one that moved has to be found again.
                tor_port: self.base_tor_port(&desc.host, &r.device, &tor),
                netdev: r.netdev.clone().or_else(|| self.base_netdev(&desc.host, &r.device)),
                tor,
            });
        }
        Ok(rnics)
    }

    /// The base's ToR port of `host`/`device`, if the base has it under `tor`.
    /// The netdev the base inventory gives `host`/`device`, for a description without one.
    fn base_netdev(&self, host: &str, device: &str) -> Option<String> {
        let h = self.hosts.iter().find(|h| h.name == host)?;
        h.rnics.iter().find(|r| r.device == device)?.netdev.clone()
    }

    fn base_tor_port(&self, host: &str, device: &str, tor: &str) -> Option<String> {
        let h = self.hosts.iter().find(|h| h.name == host)?;
        let r = h.rnics.iter().find(|r| r.device == device && r.tor == tor)?;
        r.tor_port.clone()
    }

    /// Refuses a ToR name (for `host`/`device`) that is unusable, or that a host has too.
    fn check_tor_name(&self, tor: &str, host: &str, device: &str, by_host: &HashMap<&str, &Path>) -> Result<(), Error> {
        if let Some(problem) = name_problem(tor) {
            return Err(Error::invalid(
                format!("the ToR name for {host}/{device} is unusable: {problem}"),
                format!("change the ToR map or --tor-name: {NAME_FIX}"),
            ));
        }
        if by_host.contains_key(tor) || self.hosts.iter().any(|h| h.name == tor) {
            return Err(Error::invalid(
                format!("the ToR name {tor:?} for {host}/{device} is also the name of a host"),
                "tor and host names share one namespace: change the ToR map or --tor-name",
            ));
        }
        Ok(())
    }

    /// Refuses a rail for `tor` other than the base's or an earlier RNIC's; a ToR the base lacks
    /// is noted in `new_tors` with its rail.
    fn check_tor_rail(
        &self,
        tor: &str,
        rail: Option<u16>,
        host: &str,
        device: &str,
        new_tors: &mut BTreeMap<String, Option<u16>>,
    ) -> Result<(), Error> {
        match self.tor_index.get(tor) {
            Some(&i) if self.tors[i].rail != rail => {
                return Err(Error::invalid(
                    format!(
                        "ToR {tor:?} is on rail {} in the base inventory but {host}/{device} puts it on rail {}",
                        show(self.tors[i].rail),
                        show(rail)
                    ),
                    "make the ToR map or rail order agree with the base inventory",
                ));
            }
            Some(_) => {}
            None => match new_tors.get(tor) {
                Some(other) if *other != rail => {
                    return Err(Error::invalid(
                        format!("ToR {tor:?} would be on rail {} and on rail {}", show(*other), show(rail)),
                        "with --rail-optimised, --tor-name must contain {rail} (one ToR per rail)",
                    ));
                }
                Some(_) => {}
                None => {
                    new_tors.insert(tor.to_owned(), rail);
                }
            },
        }
        Ok(())
    }

    /// Appends the ToRs the described hosts brought, in natural name order, once their rails
    /// agree with the base's: either every ToR has a rail or none does.
    fn add_new_tors(&mut self, new_tors: BTreeMap<String, Option<u16>>, base: Option<&Inventory>) -> Result<(), Error> {
        let base_rails = base.and_then(|b| b.tors.first()).map(|t| t.rail.is_some());
        let mut new_tors: Vec<(String, Option<u16>)> = new_tors.into_iter().collect();
        new_tors.sort_by(|a, b| natural_cmp(&a.0, &b.0));
        if let (Some(base_has), Some((name, rail))) = (base_rails, new_tors.first())
            && base_has != rail.is_some()
        {
            return Err(Error::invalid(
                format!(
                    "the base inventory's ToRs {} rails, but the new ToR {name:?} {}",
                    if base_has { "have" } else { "have no" },
                    if rail.is_some() { "has one" } else { "has none" }
                ),
                "either every ToR has a rail or none does: match --rail-optimised / the map's rail column to the base",
            ));
        }
        for (name, rail) in new_tors {
            self.tor_index.insert(name.clone(), self.tors.len());
            self.tors.push(Tor { name, rail, addrs: Vec::new() });
        }
        Ok(())
    }

    /// `--spines` (refused when the base declares spines too) and `--link-all` (each ToR-spine
    /// link the base lacks, in either direction).
    fn add_spines_and_links(&mut self, opts: &ImportOptions) -> Result<(), Error> {
        if opts.spines > 0 {
            if !self.spines.is_empty() {
                return Err(Error::invalid(
                    format!(
                        "--spines {} but the base inventory already declares {} spines",
                        opts.spines,
                        self.spines.len()
                    ),
                    "drop --spines, or declare the spines in one place",
                ));
            }
            self.spines = (0..opts.spines).map(|i| Spine { name: format!("spine{i}"), addrs: Vec::new() }).collect();
        }
        if opts.link_all {
            let existing: BTreeSet<(String, String)> =
                self.links.iter().flat_map(|l| [(l.a.clone(), l.b.clone()), (l.b.clone(), l.a.clone())]).collect();
            for t in &self.tors {
                for s in &self.spines {
                    if !existing.contains(&(t.name.clone(), s.name.clone())) {
                        self.links.push(Link::new(t.name.clone(), s.name.clone()));
                    }
                }
            }
        }
        Ok(())
    }

    /// The inventory, in the current format version.
    fn into_inventory(self) -> Inventory {
        let Draft { tors, spines, links, hosts, .. } = self;
        Inventory { version: inventory::VERSION, tors, spines, links, hosts }
    }
}

/// Writes `inventory` as TOML and parses it back as if loaded from `out`.
fn check_as_written(inventory: &Inventory, out: &Path) -> Result<(), Error> {
    // The format's validation is the contract; anything it still refuses is reported as it
    // would be when the written file is loaded.
    let text = inventory
        .to_toml_string()
        .map_err(|e| Error::invalid(format!("cannot write the inventory as TOML: {e}"), "report this as a ctl bug"))?;
    Inventory::parse(&text, out)?;
    Ok(())
}

fn rail_device_order(described: &[Described], opts: &ImportOptions) -> Result<Vec<String>, Error> {
    if !opts.rail_optimised || matches!(opts.tors, TorSource::Map(_)) {
        return Ok(Vec::new());
    }
    if let TorSource::Rule(rule) = &opts.tors
        && !rule.uses_rail
    {
        return Err(Error::invalid(
            format!("--rail-optimised, but --tor-name {:?} does not use {{rail}}", rule.template_text),
            "put {rail} in --tor-name (e.g. `su{su}-rail{rail}`), so that each rail gets its own ToR",
        ));
    }
    let order = match &opts.rail_devices {
        Some(list) => list.clone(),
        None => {
            let mut all: Vec<String> = described
                .iter()
                .flat_map(|d| d.description.rnics.iter().map(|r| r.device.clone()))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            all.sort_by(|a, b| natural_cmp(a, b));
            all
        }
    };
    if order.len() > usize::from(u16::MAX) {
        return Err(Error::invalid(format!("{} rails", order.len()), "a fabric has at most 65535 rails"));
    }
    Ok(order)
}

fn place(d: &Described, device: &str, opts: &ImportOptions, rails: &[String]) -> Result<(String, Option<u16>), Error> {
    let host = &d.description.host;
    match &opts.tors {
        TorSource::Map(map) => match map.place(host, device) {
            Some(p) => Ok((p.tor.clone(), p.rail)),
            None => Err(Error::invalid(
                format!(
                    "the ToR map {} does not place {host}/{device} (described in {})",
                    map.file.display(),
                    d.file.display()
                ),
                format!("add a line `{host},{device},<tor>` (or `{host},*,<tor>`) to the ToR map"),
            )),
        },
        TorSource::Rule(rule) => {
            let rail = if opts.rail_optimised {
                let k = rails.iter().position(|r| r == device).ok_or_else(|| {
                    Error::invalid(
                        format!(
                            "{host}/{device} (described in {}) is not in --rail-devices {rails:?}",
                            d.file.display()
                        ),
                        "add the device to --rail-devices in its rail's position, or fix the host",
                    )
                })?;
                Some(k as u16)
            } else {
                None
            };
            let tor = rule.expand(host, device, rail).map_err(|problem| {
                Error::invalid(
                    format!("{problem} (described in {})", d.file.display()),
                    "change --host-regex so that it matches every host name, or use a ToR map file",
                )
            })?;
            Ok((tor, rail))
        }
    }
}

fn check_unique_addresses(hosts: &[Host], sources: &[String]) -> Result<(), Error> {
    let mut ips: HashMap<IpAddr, (String, &str)> = HashMap::new();
    let mut gids: HashMap<Ipv6Addr, (String, &str)> = HashMap::new();
    for (host, source) in hosts.iter().zip(sources) {
        for r in &host.rnics {
            let name = Inventory::rnic_name(&host.name, &r.device);
            if let Some((other, other_source)) = ips.insert(r.ip, (name.clone(), source)) {
                return Err(Error::invalid(
                    format!("ip {} of {name} ({source}) is also the address of {other} ({other_source})", r.ip),
                    "every RNIC needs its own address: re-describe the hosts after fixing their configuration",
                ));
            }
            let gid = r.gid_or_mapped();
            if let Some((other, other_source)) = gids.insert(gid, (name.clone(), source)) {
                return Err(Error::invalid(
                    format!("GID {gid} of {name} ({source}) is also the GID of {other} ({other_source})"),
                    "every RNIC needs its own GID: check the hosts' gid_index",
                ));
            }
        }
    }
    Ok(())
}

fn notes(described: &[Described], rails: &[String], hosts: &[Host], tors: &[Tor]) -> Vec<String> {
    let mut notes = Vec::new();
    for (k, device) in rails.iter().enumerate() {
        let lacking: Vec<&str> = described
            .iter()
            .filter(|d| !d.description.rnics.iter().any(|r| &r.device == device))
            .map(|d| d.description.host.as_str())
            .collect();
        if !lacking.is_empty() {
            notes.push(format!(
                "{} host(s) have no {device} (rail {k}), e.g. {}: a port down when described?",
                lacking.len(),
                lacking.iter().take(5).copied().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    let mut per_tor: HashMap<&str, usize> = tors.iter().map(|t| (t.name.as_str(), 0)).collect();
    for r in hosts.iter().flat_map(|h| &h.rnics) {
        *per_tor.entry(r.tor.as_str()).or_default() += 1;
    }
    let mut lonely: Vec<&str> = per_tor.iter().filter(|(_, n)| **n == 1).map(|(t, _)| *t).collect();
    lonely.sort_by(|a, b| natural_cmp(a, b));
    if !lonely.is_empty() {
        notes.push(format!(
            "{} ToR(s) have a single RNIC, so no ToR-mesh probing: {}",
            lonely.len(),
            lonely.iter().take(5).copied().collect::<Vec<_>>().join(", ")
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::describe::RnicDescription;

    fn desc(host: &str, rnics: &[(&str, &str)]) -> Described {
        Described {
            file: PathBuf::from(format!("{host}.toml")),
            description: HostDescription {
                version: 1,
                host: host.to_owned(),
                rnics: rnics
                    .iter()
                    .map(|(device, ip)| RnicDescription {
                        device: (*device).to_owned(),
                        ip: ip.parse().unwrap(),
                        gid: None,
                        port: 1,
                        gid_index: Some(3),
                        netdev: None,
                    })
                    .collect(),
            },
        }
    }

    fn opts(tors: TorSource, rail_optimised: bool) -> ImportOptions {
        ImportOptions { tors, rail_optimised, rail_devices: None, spines: 0, link_all: false, base: None }
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1", "mlx5_01", "a", "mlx5_"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["a", "mlx5_", "mlx5_1", "mlx5_01", "mlx5_2", "mlx5_10"]);
    }

    #[test]
    fn rails_follow_natural_device_order_and_the_pod_group() {
        let mut ds = Vec::new();
        for (n, h) in ["su0-n1", "su0-n2", "su1-n1"].iter().enumerate() {
            let devices: Vec<(String, String)> =
                [0, 1, 2, 10].iter().map(|k| (format!("mlx5_{k}"), format!("10.{n}.{k}.1"))).collect();
            let refs: Vec<(&str, &str)> = devices.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            ds.push(desc(h, &refs));
        }
        let rule = NameRule::new(Some("^su(?P<su>[0-9]+)-"), "su{su}-rail{rail}").unwrap();
        let got = import(&ds, &opts(TorSource::Rule(rule), true), Path::new("inv.toml")).unwrap();
        assert_eq!(got.rail_devices, ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_10"]);
        let inv = &got.inventory;
        let tor_of = |h: &str, d: &str| {
            inv.hosts.iter().find(|x| x.name == h).unwrap().rnics.iter().find(|r| r.device == d).unwrap().tor.clone()
        };
        assert_eq!(tor_of("su0-n2", "mlx5_10"), "su0-rail3");
        assert_eq!(tor_of("su1-n1", "mlx5_2"), "su1-rail2");
        assert_eq!(inv.tors.len(), 8);
        assert!(inv.tors.iter().all(|t| t.rail.is_some()));
        assert_eq!(inv.tors.iter().find(|t| t.name == "su1-rail3").unwrap().rail, Some(3));
    }

    #[test]
    fn rail_mode_needs_rail_in_the_template() {
        let ds = vec![desc("h1", &[("mlx5_0", "10.0.0.1")])];
        let rule = NameRule::new(None, "tor0").unwrap();
        let e = import(&ds, &opts(TorSource::Rule(rule), true), Path::new("inv.toml")).unwrap_err();
        assert!(e.to_string().contains("{rail}"), "{e}");
    }

    #[test]
    fn template_groups_are_checked_up_front() {
        let e = NameRule::new(Some("^(?P<rack>r[0-9]+)-"), "tor-{rak}").unwrap_err();
        assert!(e.to_string().contains("{rak}"), "{e}");
        assert!(NameRule::new(Some("^(r[0-9]+)-"), "tor-{1}").is_ok());
        assert!(NameRule::new(Some("^(r[0-9]+)-"), "tor-{2}").is_err());
        assert!(NameRule::new(None, "tor-{host").is_err());
    }

    #[test]
    fn a_host_the_regex_does_not_match_is_named_with_its_file() {
        let ds = vec![desc("r1-n1", &[("mlx5_0", "10.0.0.1")]), desc("odd", &[("mlx5_0", "10.0.0.2")])];
        let rule = NameRule::new(Some("^(?P<rack>r[0-9]+)-"), "tor-{rack}").unwrap();
        let e = import(&ds, &opts(TorSource::Rule(rule), false), Path::new("inv.toml")).unwrap_err().to_string();
        assert!(e.contains("\"odd\" does not match") && e.contains("odd.toml"), "{e}");
    }

    #[test]
    fn the_map_places_by_device_then_by_host() {
        let map = TorMap::parse(
            "host,device,tor,rail\n# comment\nh1,*,torA,0\nh1,mlx5_1,torB,1 # the second port\nh2,mlx5_0,torA,0\n",
            Path::new("map.csv"),
        )
        .unwrap();
        let ds = vec![
            desc("h1", &[("mlx5_0", "10.0.0.1"), ("mlx5_1", "10.0.1.1")]),
            desc("h2", &[("mlx5_0", "10.0.0.2"), ("mlx5_1", "10.0.1.2")]),
        ];
        let e = import(&ds, &opts(TorSource::Map(map.clone()), true), Path::new("inv.toml")).unwrap_err();
        assert!(e.to_string().contains("does not place h2/mlx5_1"), "{e}");
        assert!(e.to_string().contains("`h2,mlx5_1,<tor>`"), "{e}");
        let ds = &ds[..1];
        let got = import(ds, &opts(TorSource::Map(map), true), Path::new("inv.toml")).unwrap();
        let tors: Vec<&str> = got.inventory.hosts[0].rnics.iter().map(|r| r.tor.as_str()).collect();
        assert_eq!(tors, ["torA", "torB"]);
    }

    #[test]
    fn map_errors_have_lines() {
        let e = TorMap::parse("h1,mlx5_0,torA,0\nh2,mlx5_0,torA,1\n", Path::new("m.csv")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(2), "rail"));
        assert!(e.problem.contains("at line 1"), "{e}");
        let e = TorMap::parse("h1,mlx5_0,torA,0\nh2,mlx5_0,torB\n", Path::new("m.csv")).unwrap_err();
        assert_eq!(e.line, Some(2));
        let e = TorMap::parse("h1,mlx5_0\n", Path::new("m.csv")).unwrap_err();
        assert_eq!(e.line, Some(1));
        let e = TorMap::parse("h1,mlx5_0,tor A\n", Path::new("m.csv")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(1), "tor"));
        let e = TorMap::parse("h1,*,a\nh1,*,b\n", Path::new("m.csv")).unwrap_err();
        assert!(e.problem.contains("also placed at line 1"), "{e}");
    }

    #[test]
    fn duplicate_hosts_and_addresses_name_both_files() {
        let rule = || TorSource::Rule(NameRule::new(None, "tor0").unwrap());
        let mut a = desc("h1", &[("mlx5_0", "10.0.0.1")]);
        a.file = "a/h1.toml".into();
        let e = import(&[a.clone(), desc("h1", &[("mlx5_0", "10.0.0.2")])], &opts(rule(), false), Path::new("i"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a/h1.toml") && e.contains("and in h1.toml"), "{e}");
        let e = import(&[a, desc("h2", &[("mlx5_0", "10.0.0.1")])], &opts(rule(), false), Path::new("i"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a/h1.toml") && e.contains("h2.toml") && e.contains("10.0.0.1"), "{e}");
    }

    #[test]
    fn a_base_keeps_its_switches_and_other_hosts() {
        let rule = || TorSource::Rule(NameRule::new(Some("^(?P<r>r[0-9]+)-"), "tor-{r}").unwrap());
        let first = import(
            &[desc("r1-n1", &[("mlx5_0", "10.0.0.1")]), desc("r1-n2", &[("mlx5_0", "10.0.0.2")])],
            &ImportOptions { spines: 2, link_all: true, ..opts(rule(), false) },
            Path::new("i"),
        )
        .unwrap();
        assert_eq!((first.inventory.spines.len(), first.inventory.links.len()), (2, 2));
        let second = import(
            &[desc("r1-n2", &[("mlx5_0", "10.0.0.22")]), desc("r2-n1", &[("mlx5_0", "10.0.1.1")])],
            &ImportOptions { base: Some(first.inventory), link_all: true, ..opts(rule(), false) },
            Path::new("i"),
        )
        .unwrap();
        let inv = second.inventory;
        assert_eq!((second.added, second.replaced), (1, 1));
        let names: Vec<&str> = inv.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["r1-n1", "r1-n2", "r2-n1"]);
        assert_eq!(inv.hosts[1].rnics[0].ip.to_string(), "10.0.0.22");
        assert_eq!((inv.tors.len(), inv.spines.len(), inv.links.len()), (2, 2, 4));
    }
}
