//! One node's LLDP neighbour table, as `lldpcli -f json show neighbors` prints it.
//!
//! lldpcli's `json` format changes shape with the data: `interface` is an object keyed by the
//! local interface when there is one neighbour and an array of such one-key objects when there
//! are several; `mgmt-ip` is a string for one address and an array for more; a chassis with a
//! system name is an object keyed by that name, one without is the bare `{id, ...}`. All of
//! these are read; anything else is refused with the file and the fix.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rocemesh_formats::inventory::FileError;
use serde_json::Value;

/// What the node saw on one of its interfaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// 1-based line of the entry in the file (the line of its interface key).
    pub line: usize,
    /// The node's own interface.
    pub port: String,
    /// The neighbour's system name; `None` when it sent none.
    pub peer: Option<String>,
    /// The neighbour's interface: the port ID when it is an interface name, else the port
    /// description (lldpd puts the interface name there when it sends a MAC as port ID).
    pub peer_port: Option<String>,
    /// The management addresses the neighbour advertised.
    pub mgmt: Vec<IpAddr>,
}

/// A table: the node it was taken on (the file's stem) and what it saw.
#[derive(Debug, Clone)]
pub struct Table {
    pub file: PathBuf,
    pub node: String,
    pub seen: Vec<Seen>,
}

const FIX: &str = "give the output of `lldpcli -f json show neighbors` taken on the node the file is named after";

impl Table {
    /// Reads the table at `path`; the node is the file name without its extension.
    pub fn load(path: &Path) -> Result<Table, FileError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            FileError::new(path, None, "", format!("cannot read the LLDP table: {e}"), "check the path")
        })?;
        let node = path.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
        Table::parse(&text, path, node)
    }

    /// Parses `text`, taken on `node`; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path, node: String) -> Result<Table, FileError> {
        let bad = |field: &str, problem: String| FileError::new(path, None, field, problem, FIX);
        let root: Value = serde_json::from_str(text)
            .map_err(|e| FileError::new(path, Some(e.line()), "", format!("not JSON: {e}"), FIX))?;
        // `json0` (lldpcli's other JSON) puts an array here: refused rather than read as empty.
        let lldp = root.get("lldp").filter(|v| v.is_object()).ok_or_else(|| {
            bad("lldp", "no `lldp` object at the top (lldpcli's `json0` and `xml` formats are not read)".into())
        })?;
        let entries: Vec<(&String, &Value)> = match lldp.get("interface") {
            None => Vec::new(),
            Some(Value::Object(m)) => m.iter().collect(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_object).flat_map(|m| m.iter()).collect(),
            Some(_) => return Err(bad("lldp.interface", "neither an object nor an array".into())),
        };
        let mut lines = KeyLines::new(text);
        let mut seen = Vec::with_capacity(entries.len());
        for (port, entry) in entries {
            let line = lines.next_of(port);
            let (peer, chassis) = chassis(entry.get("chassis"));
            seen.push(Seen {
                line,
                port: port.clone(),
                peer,
                peer_port: peer_port(entry.get("port")),
                mgmt: chassis.map(mgmt_addrs).unwrap_or_default(),
            });
        }
        Ok(Table { file: path.to_path_buf(), node, seen })
    }
}

/// The chassis' system name and its fields.
fn chassis(v: Option<&Value>) -> (Option<String>, Option<&Value>) {
    let Some(Value::Object(m)) = v else { return (None, None) };
    // Unnamed: the chassis' own fields sit directly under `chassis`.
    if m.contains_key("id") {
        return (None, v);
    }
    match m.iter().next() {
        Some((name, fields)) => (Some(name.clone()), Some(fields)),
        None => (None, None),
    }
}

fn peer_port(v: Option<&Value>) -> Option<String> {
    let port = v?;
    let id = port.get("id");
    let id_type = id.and_then(|i| i.get("type")).and_then(Value::as_str);
    let id_value = id.and_then(|i| i.get("value")).and_then(Value::as_str);
    let descr = port.get("descr").and_then(Value::as_str);
    match id_type {
        Some("ifname" | "local") => id_value.or(descr),
        _ => descr.or(id_value),
    }
    .map(str::to_string)
}

fn mgmt_addrs(chassis: &Value) -> Vec<IpAddr> {
    let texts: Vec<&str> = match chassis.get("mgmt-ip") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    texts.iter().filter_map(|t| t.parse().ok()).collect()
}

/// Finds the line of each interface key in turn: the k-th entry named `port` is at the k-th
/// `"port": {` in the text (lldpcli prints entries in order).
struct KeyLines<'t> {
    text: &'t str,
    used: std::collections::HashMap<String, usize>,
}

impl<'t> KeyLines<'t> {
    fn new(text: &'t str) -> Self {
        KeyLines { text, used: std::collections::HashMap::new() }
    }

    fn next_of(&mut self, port: &str) -> usize {
        let key = format!("{}:", serde_json::Value::String(port.to_string()));
        let from = self.used.get(port).copied().unwrap_or(0);
        let found = self.text[from..]
            .match_indices(&key)
            .map(|(i, _)| from + i)
            .find(|&i| self.text[i + key.len()..].trim_start().starts_with('{'));
        match found {
            Some(at) => {
                self.used.insert(port.to_string(), at + key.len());
                crate::error::line_of(self.text, at)
            }
            None => 1,
        }
    }
}
