//! Which Prometheus series hold a switch port's counters: the counter map. Three presets name
//! what common exporters write; a TOML file names anything else.
//!
//! ```toml
//! switch_label = "instance"      # the label that names the switch (its name or an address,
//!                                # with or without :port or a domain)
//! port_label = "ifName"          # the label that names the interface, as LLDP names it
//!
//! [counters]                     # any of the seven; each a series selector
//! in_errors = 'ifInErrors'
//! in_discards = 'ifInDiscards'
//! out_errors = 'ifOutErrors'
//! out_discards = 'ifOutDiscards'
//! rx_pause = 'sonic_interface_receive_errs{type="pause"}'
//! tx_pause = 'sonic_interface_transmit_errs{type="pause"}'
//! ecn_marked = 'SAI_QUEUE_STAT_WRED_ECN_MARKED_PACKETS'
//!
//! [addresses]                    # optional: series whose label holds one of a switch's
//! ipAdEntAddr = 'ipAdEntIfIndex' # addresses (the label, then the selector): they name the
//!                                # path-trace hops the inventory does not list
//! ```
//!
//! A selector is a metric name with optional `label="value"` matchers; both labels above are
//! added to it when querying. Every series must be a counter (reset-aware increases are taken).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The counters a finding is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Counter {
    InErrors,
    InDiscards,
    OutErrors,
    OutDiscards,
    RxPause,
    TxPause,
    EcnMarked,
}

impl Counter {
    pub const ALL: [Counter; 7] = [
        Counter::InErrors,
        Counter::InDiscards,
        Counter::OutErrors,
        Counter::OutDiscards,
        Counter::RxPause,
        Counter::TxPause,
        Counter::EcnMarked,
    ];

    /// The name in the counter map and in the output.
    pub fn name(self) -> &'static str {
        match self {
            Counter::InErrors => "in_errors",
            Counter::InDiscards => "in_discards",
            Counter::OutErrors => "out_errors",
            Counter::OutDiscards => "out_discards",
            Counter::RxPause => "rx_pause",
            Counter::TxPause => "tx_pause",
            Counter::EcnMarked => "ecn_marked",
        }
    }

    fn from_name(name: &str) -> Option<Counter> {
        Counter::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// A series selector: a metric name and label equalities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: String,
    pub matchers: Vec<(String, String)>,
}

impl Selector {
    /// Parses `name` or `name{a="x",b="y"}`; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let text = text.trim();
        let (metric, rest) = match text.find('{') {
            Some(i) => (&text[..i], Some(&text[i..])),
            None => (text, None),
        };
        if !is_name(metric, true) {
            return Err(format!("{metric:?} is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"));
        }
        let mut matchers = Vec::new();
        if let Some(rest) = rest {
            let inner = rest
                .strip_prefix('{')
                .and_then(|r| r.strip_suffix('}'))
                .ok_or_else(|| format!("{rest:?}: label matchers end with `}}`"))?;
            for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let (k, v) = part.split_once('=').ok_or_else(|| format!("{part:?} is not label=\"value\""))?;
                let (k, v) = (k.trim(), v.trim());
                let v = v
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .filter(|v| !v.contains(['"', '\\']))
                    .ok_or_else(|| {
                        format!("{part:?}: only label=\"value\" equalities, without quotes or backslashes in the value")
                    })?;
                if !is_name(k, false) {
                    return Err(format!("{k:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"));
                }
                matchers.push((k.to_string(), v.to_string()));
            }
        }
        Ok(Selector { metric: metric.to_string(), matchers })
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.metric)?;
        if !self.matchers.is_empty() {
            let m: Vec<String> = self.matchers.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            write!(f, "{{{}}}", m.join(","))?;
        }
        Ok(())
    }
}

fn is_name(s: &str, colon: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
    };
    let mut chars = s.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// Where a counter map came from and what it maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterMap {
    /// The preset's name or the file's path.
    pub name: String,
    pub switch_label: String,
    pub port_label: String,
    pub counters: Vec<(Counter, Selector)>,
    /// Series whose label (the second) holds one of the switch's addresses.
    pub addresses: Vec<(Selector, String)>,
}

/// A counter map file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("{path}: {source} (fix: name a preset, {presets}, or a readable TOML file)", presets = PRESETS.join(", "))]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message} (fix: see `analyze localize --help`, --counter-map, for the file's shape)")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: field {field}: {message}")]
    Field { path: PathBuf, field: String, message: String },
}

/// The presets' names.
pub const PRESETS: [&str; 3] = ["if_mib", "gnmic", "sonic"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    switch_label: String,
    port_label: String,
    counters: BTreeMap<String, String>,
    #[serde(default)]
    addresses: BTreeMap<String, String>,
}

impl CounterMap {
    /// A preset by name, or the TOML file at `arg`.
    pub fn resolve(arg: &str) -> Result<CounterMap, MapError> {
        match CounterMap::preset(arg) {
            Some(m) => Ok(m),
            None => CounterMap::load(Path::new(arg)),
        }
    }

    /// The presets:
    /// - `if_mib`: snmp_exporter's if_mib module (`ifInErrors`, `ifInDiscards`, `ifOutErrors`,
    ///   `ifOutDiscards`; the switch is the scrape's `instance`, the port `ifName`). No pause
    ///   or ECN counters: IF-MIB has none.
    /// - `gnmic`: gnmic's Prometheus output of the OpenConfig interface counters, no metric
    ///   prefix (`interfaces_interface_state_counters_in_errors`, ...; the switch is the
    ///   target, `source`, the port `interface_name`).
    /// - `sonic`: sonic-exporter's interface collector (`sonic_interface_receive_errs` and
    ///   `sonic_interface_transmit_errs` by `type`: error, discard, pause; the port is
    ///   `device`, the switch the scrape's `instance`).
    ///
    /// Only `if_mib` names addresses: snmp_exporter's IP-MIB walks (`ipAdEntIfIndex` labelled
    /// `ipAdEntAddr`, IPv4; `ipAddressIfIndex` labelled `ipAddressAddr`, either family).
    pub fn preset(name: &str) -> Option<CounterMap> {
        let (switch_label, port_label, counters): (&str, &str, Vec<(Counter, &str)>) = match name {
            "if_mib" => (
                "instance",
                "ifName",
                vec![
                    (Counter::InErrors, "ifInErrors"),
                    (Counter::InDiscards, "ifInDiscards"),
                    (Counter::OutErrors, "ifOutErrors"),
                    (Counter::OutDiscards, "ifOutDiscards"),
                ],
            ),
            "gnmic" => (
                "source",
                "interface_name",
                vec![
                    (Counter::InErrors, "interfaces_interface_state_counters_in_errors"),
                    (Counter::InDiscards, "interfaces_interface_state_counters_in_discards"),
                    (Counter::OutErrors, "interfaces_interface_state_counters_out_errors"),
                    (Counter::OutDiscards, "interfaces_interface_state_counters_out_discards"),
                ],
            ),
            "sonic" => (
                "instance",
                "device",
                vec![
                    (Counter::InErrors, "sonic_interface_receive_errs{type=\"error\"}"),
                    (Counter::InDiscards, "sonic_interface_receive_errs{type=\"discard\"}"),
                    (Counter::OutErrors, "sonic_interface_transmit_errs{type=\"error\"}"),
                    (Counter::OutDiscards, "sonic_interface_transmit_errs{type=\"discard\"}"),
                    (Counter::RxPause, "sonic_interface_receive_errs{type=\"pause\"}"),
                    (Counter::TxPause, "sonic_interface_transmit_errs{type=\"pause\"}"),
                ],
            ),
            _ => return None,
        };
        let counters = counters.into_iter().map(|(c, s)| (c, Selector::parse(s).expect("a preset's selector parses")));
        let addresses: &[(&str, &str)] = match name {
            "if_mib" => &[("ipAdEntIfIndex", "ipAdEntAddr"), ("ipAddressIfIndex", "ipAddressAddr")],
            _ => &[],
        };
        Some(CounterMap {
            name: name.to_string(),
            switch_label: switch_label.to_string(),
            port_label: port_label.to_string(),
            counters: counters.collect(),
            addresses: addresses
                .iter()
                .map(|(s, l)| (Selector::parse(s).expect("a preset's selector parses"), l.to_string()))
                .collect(),
        })
    }

    /// Reads a counter map file (see the module documentation).
    pub fn load(path: &Path) -> Result<CounterMap, MapError> {
        let text = std::fs::read_to_string(path).map_err(|source| MapError::Read { path: path.into(), source })?;
        let file: File =
            toml::from_str(&text).map_err(|e| MapError::Parse { path: path.into(), message: e.to_string() })?;
        let field = |field: &str, message: String| MapError::Field { path: path.into(), field: field.into(), message };
        for (field_name, label) in [("switch_label", &file.switch_label), ("port_label", &file.port_label)] {
            if !is_name(label, false) {
                return Err(field(field_name, format!("{label:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)")));
            }
        }
        let mut counters = Vec::new();
        for (name, text) in &file.counters {
            let at = format!("counters.{name}");
            let counter = Counter::from_name(name).ok_or_else(|| {
                let known: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
                field(&at, format!("not a counter this map can name (fix: use one of {})", known.join(", ")))
            })?;
            let selector =
                Selector::parse(text).map_err(|m| field(&at, format!("{m} (fix: write e.g. 'ifInDiscards')")))?;
            counters.push((counter, selector));
        }
        if counters.is_empty() {
            return Err(field("counters", "names no counter (fix: map at least in_discards or out_discards)".into()));
        }
        counters.sort_by_key(|(c, _)| *c);
        let mut addresses = Vec::new();
        for (label, text) in &file.addresses {
            let at = format!("addresses.{label}");
            if !is_name(label, false) {
                return Err(field(&at, format!("{label:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)")));
            }
            let selector =
                Selector::parse(text).map_err(|m| field(&at, format!("{m} (fix: write e.g. 'ipAdEntIfIndex')")))?;
            addresses.push((selector, label.clone()));
        }
        Ok(CounterMap {
            name: path.display().to_string(),
            switch_label: file.switch_label,
            port_label: file.port_label,
            counters,
            addresses,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse_and_print_back() {
        let s = Selector::parse(r#"sonic_interface_receive_errs{type="pause", x="y"}"#).unwrap();
        assert_eq!(s.metric, "sonic_interface_receive_errs");
        assert_eq!(s.matchers, vec![("type".into(), "pause".into()), ("x".into(), "y".into())]);
        assert_eq!(s.to_string(), r#"sonic_interface_receive_errs{type="pause",x="y"}"#);
        for bad in ["9x", "a{b=c}", r#"a{b!="c"}"#, r#"a{b="c""#, r#"a{b="c\"d"}"#, ""] {
            assert!(Selector::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn every_preset_resolves_and_a_file_is_checked_field_by_field() {
        for p in PRESETS {
            assert!(CounterMap::resolve(p).is_ok(), "{p}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("map.toml");
        let write = |t: &str| std::fs::write(&path, t).unwrap();
        write("switch_label = \"source\"\nport_label = \"port\"\n[counters]\nout_discards = 'drops{q=\"3\"}'\n");
        let m = CounterMap::resolve(path.to_str().unwrap()).unwrap();
        assert_eq!((m.switch_label.as_str(), m.counters.len(), m.addresses.len()), ("source", 1, 0));
        write(
            "switch_label = \"source\"\nport_label = \"port\"\n[counters]\nout_discards = 'drops'\n[addresses]\naddr = 'if_addr{family=\"4\"}'\n",
        );
        let m = CounterMap::load(&path).unwrap();
        assert_eq!(m.addresses, vec![(Selector::parse("if_addr{family=\"4\"}").unwrap(), "addr".to_string())]);
        write(
            "switch_label = \"source\"\nport_label = \"port\"\n[counters]\nout_discards = 'drops'\n[addresses]\naddr = '9x'\n",
        );
        assert!(CounterMap::load(&path).unwrap_err().to_string().contains("field addresses.addr"));
        write("switch_label = \"source\"\nport_label = \"port\"\n[counters]\nout_drops = 'drops'\n");
        let e = CounterMap::load(&path).unwrap_err().to_string();
        assert!(e.contains("field counters.out_drops") && e.contains("in_discards"), "{e}");
        write("switch_label = \"9\"\nport_label = \"port\"\n[counters]\nout_discards = 'drops'\n");
        assert!(CounterMap::load(&path).unwrap_err().to_string().contains("field switch_label"));
        let e = CounterMap::resolve("/nonexistent/map.toml").unwrap_err().to_string();
        assert!(e.contains("if_mib, gnmic, sonic"), "{e}");
    }
}
