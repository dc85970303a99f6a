//! The pinglist: what one host's agent probes, at what rate, with which flow labels.
//! `ctl gen-pinglists` writes one per host from the [inventory](crate::inventory); the
//! agent reads it and reloads it when it changes.
//!
//! Loading validates the whole file; every refusal is a [`FileError`] naming the line,
//! the field (`target[12].flow_labels[3]`), what is wrong and how to fix it.
//!
//! ```toml
//! version = 1
//! host = "tor0-h0"
//! generation = 42                 # monotonically increasing; bumped by every `ctl gen-pinglists`
//! generated_unix_ns = 1700000000000000000
//! timeout_ms = 500                # optional, default 500; a probe not complete after this is lost
//!
//! [[target]]
//! from = "mlx5_0"                 # local device (UDP transport: the name of a local endpoint)
//! to = "tor0-h1/mlx5_0"           # entity name of the target RNIC
//! tor = "tor0"                     # optional: the target's ToR (the agent's metrics count per ToR)
//! kind = "tor_mesh"               # tor_mesh | inter_tor | service
//! addr = "10.0.0.2"               # target IP (UDP, and RoCEv2's IPv4-mapped GID) or IPv6/GID
//! port = 18515                    # optional: responder UDP port (UDP transport)
//! qpn = 0                         # optional: UD QPN of the responder (verbs); 0 = resolve at run time
//! rate_pps = 10.0
//! flow_labels = [1, 2, 3]         # cycled per probe; each 1..=0xFFFFF
//!
//! [[target]]
//! from = "mlx5_0"
//! to = "tor1-h0/mlx5_0"
//! kind = "inter_tor"
//! addr = "fd00::1:1"
//! rate_pps = 2.5
//! flow_labels = [0x12345, 0xFFFFF]
//! ```
//!
//! Rules beyond the syntax: `host`, `from` and `to` are not empty and no target is the
//! host's own device; `timeout_ms` is in `1..=`[`MAX_TIMEOUT_MS`]; `rate_pps` is finite,
//! positive and at most [`MAX_RATE_PPS_PER_TARGET`]; every target has at least one flow
//! label, each in `1..=`[`MAX_FLOW_LABEL`] and listed once; no two targets share
//! `(from, to, kind)`; and there are at most [`MAX_TARGETS`] targets.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::inventory::Inventory;
pub use crate::tomlfile::FileError;
use crate::tomlfile::{self, Document, FieldPath, VersionGate};

/// The pinglist format version this build reads and writes.
pub const VERSION: u32 = 1;
/// `timeout_ms` when the file does not say.
pub const DEFAULT_TIMEOUT_MS: u32 = 500;
/// Highest `rate_pps` of one target, so that a typo cannot flood the fabric.
pub const MAX_RATE_PPS_PER_TARGET: f64 = 1000.0;
/// Highest `timeout_ms`.
pub const MAX_TIMEOUT_MS: u32 = 10_000;
/// Highest flow label: the IPv6 flow label is 20 bits.
pub const MAX_FLOW_LABEL: u32 = 0xF_FFFF;
/// Most targets one pinglist may hold.
pub const MAX_TARGETS: usize = 100_000;

const GATE: VersionGate<'static> = VersionGate {
    format: "pinglist",
    supported: VERSION as i64,
    mismatch_fix: "regenerate the file with a matching `ctl`, or upgrade the agent",
};

/// Everything one host's agent probes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Pinglist {
    pub version: u32,
    /// The host this pinglist is for.
    pub host: String,
    /// Bumped by every `ctl gen-pinglists`; a reader can tell a newer list from an older one.
    pub generation: u64,
    pub generated_unix_ns: u64,
    /// A probe not complete after this long is counted as lost.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u32,
    #[serde(rename = "target", default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<Target>,
}

/// One probed pair: a local device and a remote RNIC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Target {
    /// Local device (UDP transport: the name of a local endpoint).
    pub from: String,
    /// Entity name of the target RNIC, `"{host}/{device}"`.
    pub to: String,
    /// The target RNIC's ToR: the agent's live metrics count probes per target ToR (a bounded
    /// label; never per target RNIC). Empty (pinglists from before it) is shown as "unknown".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tor: String,
    pub kind: ProbeKind,
    /// Target IP (UDP, and RoCEv2's IPv4-mapped GID) or IPv6 address / GID.
    pub addr: IpAddr,
    /// Responder UDP port (UDP transport).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// UD QPN of the responder (verbs); 0 means resolve at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qpn: Option<u32>,
    pub rate_pps: f64,
    /// Cycled per probe, so that successive probes take different ECMP paths.
    pub flow_labels: Vec<u32>,
}

/// Why a pair is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// Between RNICs under the same ToR.
    TorMesh,
    /// Between RNICs under different ToRs, through the spines.
    InterTor,
    /// To a service endpoint.
    Service,
}

impl ProbeKind {
    /// The value stored in on-disk records. Never renumber: records outlive builds.
    pub fn as_u8(self) -> u8 {
        match self {
            ProbeKind::TorMesh => 0,
            ProbeKind::InterTor => 1,
            ProbeKind::Service => 2,
        }
    }

    /// The inverse of [`ProbeKind::as_u8`]; `None` for a value this build does not know.
    pub fn from_u8(value: u8) -> Option<ProbeKind> {
        match value {
            0 => Some(ProbeKind::TorMesh),
            1 => Some(ProbeKind::InterTor),
            2 => Some(ProbeKind::Service),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            ProbeKind::TorMesh => "tor_mesh",
            ProbeKind::InterTor => "inter_tor",
            ProbeKind::Service => "service",
        }
    }
}

fn default_timeout_ms() -> u32 {
    DEFAULT_TIMEOUT_MS
}

impl Pinglist {
    /// Reads and validates the pinglist at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Pinglist, FileError> {
        let path = path.as_ref();
        Self::parse(&tomlfile::read_text(path)?, path)
    }

    /// Parses and validates `text`; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Pinglist, FileError> {
        let mut doc = Document::parse(path, text, &GATE)?;
        let pinglist: Pinglist = doc.deserialize()?;
        pinglist.validate(&doc)?;
        Ok(pinglist)
    }

    /// The pinglist as TOML that [`Pinglist::parse`] reads back unchanged. Fails only if
    /// toml cannot represent a value, which these types never produce.
    pub fn to_toml_string(&self) -> Result<String, toml::ser::Error> {
        let mut out = String::new();
        self.write_toml(&mut out)?;
        Ok(out)
    }

    /// Appends [`Pinglist::to_toml_string`]'s text to `out`.
    ///
    /// The bytes are the toml crate's (a test compares them), but written directly: ctl
    /// writes 100,000 pinglists of 3.6 M targets per generation, and serde's TOML writer
    /// took 3.4 s of one core for them. Strings that would need quoting other than `"..."`
    /// (quotes, backslashes, control or non-ASCII characters; names never have them) make
    /// the whole list go through the toml crate instead, so the output never depends on
    /// which path wrote it.
    pub fn write_toml(&self, out: &mut String) -> Result<(), toml::ser::Error> {
        if !is_plain(&self.host)
            || self.targets.iter().any(|t| !is_plain(&t.from) || !is_plain(&t.to) || !is_plain(&t.tor))
        {
            out.push_str(&toml::to_string(self)?);
            return Ok(());
        }
        write_toml_header(out, self.version, &self.host, self.generation, self.generated_unix_ns, self.timeout_ms);
        for t in &self.targets {
            write_toml_target(out, &t.from, &t.to, &t.tor, t.kind, t.addr, t.port, t.qpn, t.rate_pps, &t.flow_labels);
        }
        Ok(())
    }

    /// Probes per second sent from the local device `from`, over all its targets.
    pub fn total_rate_pps(&self, from: &str) -> f64 {
        self.targets.iter().filter(|t| t.from == from).map(|t| t.rate_pps).sum()
    }

    fn validate(&self, doc: &Document<'_>) -> Result<(), FileError> {
        let root = FieldPath::root();
        if self.host.is_empty() {
            return Err(doc.error(
                &root.key("host"),
                "`host` is empty",
                "set `host` to the inventory name of the host this pinglist is for",
            ));
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(doc.error(
                &root.key("timeout_ms"),
                format!("timeout_ms {} is outside 1..={MAX_TIMEOUT_MS}", self.timeout_ms),
                format!("use a timeout between 1 and {MAX_TIMEOUT_MS} ms, or omit it for {DEFAULT_TIMEOUT_MS}"),
            ));
        }
        if self.targets.len() > MAX_TARGETS {
            return Err(doc.error(
                &root.key("target").index(MAX_TARGETS),
                format!("{} targets; a pinglist holds at most {MAX_TARGETS}", self.targets.len()),
                "probe fewer pairs from this host (a sparser inter-ToR mesh)",
            ));
        }
        let mut seen: HashMap<(&str, &str, ProbeKind), FieldPath> = HashMap::new();
        for (i, target) in self.targets.iter().enumerate() {
            let path = root.key("target").index(i);
            self.validate_target(doc, target, &path)?;
            match seen.entry((&target.from, &target.to, target.kind)) {
                Entry::Occupied(first) => {
                    let first_at = doc
                        .line_of_path(first.get())
                        .map_or_else(|| "listed earlier".to_owned(), |l| format!("at line {l}"));
                    return Err(doc.error(
                        &path,
                        format!(
                            "target from {:?} to {:?} of kind {} is also {first_at}",
                            target.from,
                            target.to,
                            target.kind.as_str(),
                        ),
                        "remove the duplicate [[target]]",
                    ));
                }
                Entry::Vacant(slot) => {
                    slot.insert(path);
                }
            }
        }
        Ok(())
    }

    fn validate_target(&self, doc: &Document<'_>, target: &Target, path: &FieldPath) -> Result<(), FileError> {
        if target.from.is_empty() {
            return Err(doc.error(
                &path.key("from"),
                "`from` is empty",
                "name the local device to probe from, e.g. \"mlx5_0\"",
            ));
        }
        if target.to.is_empty() {
            return Err(doc.error(
                &path.key("to"),
                "`to` is empty",
                "name the target RNIC as \"host/device\", e.g. \"tor0-h1/mlx5_0\"",
            ));
        }
        if target.to == Inventory::rnic_name(&self.host, &target.from) {
            return Err(doc.error(
                &path.key("to"),
                format!("target {:?} is the probing device itself ({:?} on this host)", target.to, target.from),
                "remove the target: a device does not probe itself",
            ));
        }

        let rate = target.rate_pps;
        let rate_path = path.key("rate_pps");
        if !rate.is_finite() || rate <= 0.0 {
            return Err(doc.error(
                &rate_path,
                format!("rate_pps {rate} is not a positive number"),
                format!("use a rate above 0 and at most {MAX_RATE_PPS_PER_TARGET} probes per second"),
            ));
        }
        if rate > MAX_RATE_PPS_PER_TARGET {
            return Err(doc.error(
                &rate_path,
                format!("rate_pps {rate} is above the per-target cap of {MAX_RATE_PPS_PER_TARGET}"),
                format!(
                    "use at most {MAX_RATE_PPS_PER_TARGET} probes per second; the cap keeps a typo from flooding the fabric"
                ),
            ));
        }

        let labels_path = path.key("flow_labels");
        if target.flow_labels.is_empty() {
            return Err(doc.error(
                &labels_path,
                "`flow_labels` is empty",
                format!("list at least one flow label in 1..={MAX_FLOW_LABEL:#X}"),
            ));
        }
        let mut seen: HashMap<u32, usize> = HashMap::new();
        for (j, &label) in target.flow_labels.iter().enumerate() {
            let label_path = labels_path.index(j);
            if label == 0 {
                return Err(doc.error(
                    &label_path,
                    "flow label 0 is not allowed",
                    format!(
                        "use labels in 1..={MAX_FLOW_LABEL:#X}: with label 0 mlx5 picks the UDP source port itself, \
                         which pins the pair to one random ECMP path and leaves the others unprobed"
                    ),
                ));
            }
            if label > MAX_FLOW_LABEL {
                return Err(doc.error(
                    &label_path,
                    format!("flow label {label} ({label:#X}) does not fit the 20-bit flow label"),
                    format!("use labels in 1..={MAX_FLOW_LABEL:#X}"),
                ));
            }
            if let Some(first) = seen.insert(label, j) {
                return Err(doc.error(
                    &label_path,
                    format!("flow label {label} is also at flow_labels[{first}]"),
                    "list each flow label once (the labels are cycled in order)",
                ));
            }
        }
        Ok(())
    }
}

/// Whether `s` is written as `"s"` with nothing escaped (names always are): printable ASCII
/// without quotes or backslashes. Only such strings may go to [`write_toml_header`] and
/// [`write_toml_target`]; [`Pinglist::write_toml`] sends anything else through the toml crate.
pub fn is_plain(s: &str) -> bool {
    s.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
}

/// The top of a pinglist's TOML, as [`Pinglist::write_toml`] writes it; `host` must be
/// [plain](is_plain). For writers that stream targets without building a [`Pinglist`].
pub fn write_toml_header(
    out: &mut String,
    version: u32,
    host: &str,
    generation: u64,
    generated_unix_ns: u64,
    timeout_ms: u32,
) {
    let mut int = itoa::Buffer::new();
    line(out, "version", int.format(version));
    quoted(out, "host", host);
    line(out, "generation", int.format(generation));
    line(out, "generated_unix_ns", int.format(generated_unix_ns));
    line(out, "timeout_ms", int.format(timeout_ms));
}

/// One `[[target]]` table, as [`Pinglist::write_toml`] writes it; `from` and `to` must be
/// [plain](is_plain).
#[allow(clippy::too_many_arguments)]
pub fn write_toml_target(
    out: &mut String,
    from: &str,
    to: &str,
    tor: &str,
    kind: ProbeKind,
    addr: IpAddr,
    port: Option<u16>,
    qpn: Option<u32>,
    rate_pps: f64,
    flow_labels: &[u32],
) {
    let mut int = itoa::Buffer::new();
    out.push_str("\n[[target]]\n");
    quoted(out, "from", from);
    quoted(out, "to", to);
    if !tor.is_empty() {
        quoted(out, "tor", tor);
    }
    quoted(out, "kind", kind.as_str());
    out.push_str("addr = \"");
    push_addr(out, addr);
    out.push_str("\"\n");
    if let Some(port) = port {
        line(out, "port", int.format(port));
    }
    if let Some(qpn) = qpn {
        line(out, "qpn", int.format(qpn));
    }
    out.push_str("rate_pps = ");
    push_float(out, rate_pps);
    out.push_str("\nflow_labels = [");
    for (i, label) in flow_labels.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(int.format(*label));
    }
    out.push_str("]\n");
}

fn line(out: &mut String, key: &str, value: &str) {
    out.push_str(key);
    out.push_str(" = ");
    out.push_str(value);
    out.push('\n');
}

fn quoted(out: &mut String, key: &str, value: &str) {
    out.push_str(key);
    out.push_str(" = \"");
    out.push_str(value);
    out.push_str("\"\n");
}

/// `addr` as its `Display` text, IPv4 without the formatting machinery (most targets).
fn push_addr(out: &mut String, addr: IpAddr) {
    match addr {
        IpAddr::V4(v4) => {
            let mut int = itoa::Buffer::new();
            for (i, octet) in v4.octets().iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(int.format(*octet));
            }
        }
        IpAddr::V6(_) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{addr}");
        }
    }
}

/// `value` as toml writes an f64: `Display`, with `.0` after whole numbers, `nan`/`-nan`.
fn push_float(out: &mut String, value: f64) {
    use std::fmt::Write as _;
    if value.is_nan() {
        out.push_str(if value.is_sign_negative() { "-nan" } else { "nan" });
    } else if value == 0.0 {
        out.push_str(if value.is_sign_negative() { "-0.0" } else { "0.0" });
    } else if value % 1.0 == 0.0 && value.abs() < 9.0e15 {
        // Exactly an integer below 2^53: its digits are its Display text.
        out.push_str(itoa::Buffer::new().format(value as i64));
        out.push_str(".0");
    } else if value % 1.0 == 0.0 {
        let _ = write!(out, "{value}.0");
    } else {
        let _ = write!(out, "{value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::tomlfile::testing::doc;

    fn doc_example() -> String {
        crate::tomlfile::testing::doc_example(include_str!("pinglist.rs"))
    }

    fn parse(text: &str) -> Result<Pinglist, FileError> {
        Pinglist::parse(&doc(text), Path::new("pl.toml"))
    }

    fn err(text: &str) -> FileError {
        match parse(text) {
            Ok(p) => panic!("expected an error, parsed {p:?}"),
            Err(e) => e,
        }
    }

    /// Lines 1-4; a `rest` passed to [`with_head`] starts on line 5.
    const HEAD: &str = r#"
        version = 1
        host = "h0"
        generation = 1
        generated_unix_ns = 0
    "#;

    fn with_head(rest: &str) -> String {
        doc(&format!("{}\n{}", HEAD.trim_end(), rest.trim_start_matches('\n')))
    }

    /// A valid target at lines 5-11 with `line` replacing the line starting with the same key.
    fn one_target(replace: &str) -> String {
        let key = replace.split('=').next().unwrap_or("").trim();
        let mut lines = vec![
            "[[target]]",
            "from = \"mlx5_0\"",
            "to = \"h1/mlx5_0\"",
            "kind = \"tor_mesh\"",
            "addr = \"10.0.0.2\"",
            "rate_pps = 10.0",
            "flow_labels = [1, 2, 3]",
        ];
        let mut replaced = false;
        for line in &mut lines {
            if !key.is_empty() && line.split('=').next().unwrap_or("").trim() == key {
                *line = replace;
                replaced = true;
            }
        }
        if !replaced && !replace.is_empty() {
            lines.push(replace);
        }
        with_head(&lines.join("\n"))
    }

    #[test]
    fn the_documented_example_parses() {
        let text = doc_example();
        assert!(text.starts_with("version = 1\n"), "{text}");
        let p = Pinglist::parse(&text, Path::new("pl.toml")).unwrap();
        assert_eq!(p.host, "tor0-h0");
        assert_eq!(p.generation, 42);
        assert_eq!(p.generated_unix_ns, 1_700_000_000_000_000_000);
        assert_eq!(p.timeout_ms, 500);
        assert_eq!(
            p.targets[0],
            Target {
                from: "mlx5_0".into(),
                to: "tor0-h1/mlx5_0".into(),
                tor: "tor0".into(),
                kind: ProbeKind::TorMesh,
                addr: "10.0.0.2".parse().unwrap(),
                port: Some(18515),
                qpn: Some(0),
                rate_pps: 10.0,
                flow_labels: vec![1, 2, 3],
            }
        );
        let t1 = &p.targets[1];
        assert_eq!((t1.kind, t1.port, t1.qpn), (ProbeKind::InterTor, None, None));
        assert_eq!(t1.tor, "", "`tor` is optional");
        assert_eq!(t1.flow_labels, vec![0x12345, 0xFFFFF]);
        assert_eq!(p.total_rate_pps("mlx5_0"), 12.5);
        assert_eq!(p.total_rate_pps("mlx5_1"), 0.0);
    }

    #[test]
    fn round_trips_through_toml() {
        let p = Pinglist::parse(&doc_example(), Path::new("pl.toml")).unwrap();
        let text = p.to_toml_string().unwrap();
        assert_eq!(Pinglist::parse(&text, Path::new("pl.toml")).unwrap(), p);
    }

    #[test]
    fn defaults_apply_and_an_empty_list_is_valid() {
        let p = parse(HEAD).unwrap();
        assert_eq!(p.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert!(p.targets.is_empty());
        // An integer rate is accepted as well as a float.
        let p = Pinglist::parse(&one_target("rate_pps = 7"), Path::new("pl.toml")).unwrap();
        assert_eq!(p.targets[0].rate_pps, 7.0);
    }

    #[test]
    fn the_whole_u64_range_round_trips() {
        // TOML integers are i64, but toml reads and writes u64 beyond that range.
        let mut p = parse(HEAD).unwrap();
        p.generation = u64::MAX;
        p.generated_unix_ns = u64::MAX - 1;
        let text = p.to_toml_string().unwrap();
        assert!(text.contains("generation = 18446744073709551615"), "{text}");
        assert_eq!(Pinglist::parse(&text, Path::new("pl.toml")).unwrap(), p);
    }

    #[test]
    fn probe_kind_codes_are_fixed() {
        for (kind, code) in [(ProbeKind::TorMesh, 0), (ProbeKind::InterTor, 1), (ProbeKind::Service, 2)] {
            assert_eq!(kind.as_u8(), code);
            assert_eq!(ProbeKind::from_u8(code), Some(kind));
        }
        assert_eq!(ProbeKind::from_u8(3), None);
        assert_eq!(ProbeKind::from_u8(255), None);
    }

    fn read(text: String) -> FileError {
        match Pinglist::parse(&text, Path::new("pl.toml")) {
            Ok(p) => panic!("expected an error, parsed {p:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn an_empty_host_is_refused() {
        let e = err(r#"
            version = 1
            host = ""
            generation = 1
            generated_unix_ns = 0
        "#);
        assert_eq!((e.field.as_str(), e.line), ("host", Some(2)));
        assert!(e.problem.contains("empty"), "{e}");
    }

    #[test]
    fn timeout_must_be_in_range() {
        let e = err(&with_head("timeout_ms = 0"));
        assert_eq!((e.field.as_str(), e.line), ("timeout_ms", Some(5)));
        assert!(e.problem.contains("outside 1..=10000"), "{e}");
        let e = err(&with_head("timeout_ms = 10001"));
        assert_eq!((e.field.as_str(), e.line), ("timeout_ms", Some(5)));
        assert_eq!(parse(&with_head("timeout_ms = 10000")).unwrap().timeout_ms, 10_000);
    }

    #[test]
    fn empty_from_and_to_are_refused() {
        let e = read(one_target("from = \"\""));
        assert_eq!((e.field.as_str(), e.line), ("target[0].from", Some(6)));
        assert!(e.problem.contains("`from` is empty"), "{e}");
        let e = read(one_target("to = \"\""));
        assert_eq!((e.field.as_str(), e.line), ("target[0].to", Some(7)));
        assert!(e.problem.contains("`to` is empty"), "{e}");
    }

    #[test]
    fn a_self_target_is_refused() {
        let e = read(one_target("to = \"h0/mlx5_0\""));
        assert_eq!((e.field.as_str(), e.line), ("target[0].to", Some(7)));
        assert!(e.problem.contains("probing device itself"), "{e}");
        // Another device on the same host is a legitimate target.
        let p = Pinglist::parse(&one_target("to = \"h0/mlx5_1\""), Path::new("pl.toml"));
        assert!(p.is_ok(), "{p:?}");
    }

    #[test]
    fn rate_must_be_positive_finite_and_capped() {
        for bad in ["rate_pps = 0.0", "rate_pps = -1.0", "rate_pps = nan", "rate_pps = inf"] {
            let e = read(one_target(bad));
            assert_eq!((e.field.as_str(), e.line), ("target[0].rate_pps", Some(10)), "{bad}");
            assert!(e.problem.contains("not a positive number"), "{e}");
        }
        let e = read(one_target("rate_pps = 1000.5"));
        assert_eq!((e.field.as_str(), e.line), ("target[0].rate_pps", Some(10)));
        assert!(e.problem.contains("cap of 1000"), "{e}");
        assert!(e.fix.contains("flooding"), "{e}");
        let p = Pinglist::parse(&one_target("rate_pps = 1000.0"), Path::new("pl.toml")).unwrap();
        assert_eq!(p.targets[0].rate_pps, MAX_RATE_PPS_PER_TARGET);
    }

    #[test]
    fn flow_labels_must_not_be_empty() {
        let e = read(one_target("flow_labels = []"));
        assert_eq!((e.field.as_str(), e.line), ("target[0].flow_labels", Some(11)));
        assert!(e.problem.contains("empty"), "{e}");
    }

    #[test]
    fn flow_label_zero_is_refused_with_the_reason() {
        let e = read(one_target("flow_labels = [\n  1,\n  2,\n  0,\n]"));
        assert_eq!((e.field.as_str(), e.line), ("target[0].flow_labels[2]", Some(14)));
        assert!(e.problem.contains("flow label 0"), "{e}");
        assert!(e.fix.contains("ECMP path"), "{e}");
    }

    #[test]
    fn flow_labels_are_20_bits() {
        let e = read(one_target("flow_labels = [0xFFFFF, 0x100000]"));
        assert_eq!((e.field.as_str(), e.line), ("target[0].flow_labels[1]", Some(11)));
        assert!(e.problem.contains("0x100000"), "{e}");
    }

    #[test]
    fn a_duplicate_flow_label_is_refused() {
        let e = read(one_target("flow_labels = [5, 6, 5]"));
        assert_eq!((e.field.as_str(), e.line), ("target[0].flow_labels[2]", Some(11)));
        assert!(e.problem.contains("also at flow_labels[0]"), "{e}");
    }

    #[test]
    fn a_duplicate_target_says_where_the_first_is() {
        let target = "[[target]]\nfrom = \"mlx5_0\"\nto = \"h1/mlx5_0\"\nkind = \"tor_mesh\"\naddr = \"10.0.0.2\"\nrate_pps = 1.0\nflow_labels = [1]\n";
        let other_kind = target.replace("tor_mesh", "service");
        // Targets at lines 5, 12 (same pair, other kind: fine) and 19 (duplicate of 5).
        let e = read(with_head(&format!("{target}{other_kind}{target}")));
        assert_eq!((e.field.as_str(), e.line), ("target[2]", Some(19)));
        assert!(e.problem.contains("also at line 5"), "{e}");
        assert!(e.problem.contains("tor_mesh"), "{e}");
    }

    #[test]
    fn too_many_targets_are_refused() {
        let mut text = with_head("");
        for i in 0..=MAX_TARGETS {
            text.push_str(&format!(
                "[[target]]\nfrom=\"d\"\nto=\"h/{i}\"\nkind=\"tor_mesh\"\naddr=\"10.0.0.1\"\nrate_pps=1\nflow_labels=[1]\n"
            ));
        }
        let e = read(text);
        assert_eq!(e.field, format!("target[{MAX_TARGETS}]"));
        assert_eq!(e.line, Some(5 + 7 * MAX_TARGETS));
        assert!(e.problem.contains("at most 100000"), "{e}");
    }

    #[test]
    fn an_unknown_kind_has_its_line() {
        let e = read(one_target("kind = \"mesh\""));
        assert_eq!((e.field.as_str(), e.line), ("target[0].kind", Some(8)));
        assert!(e.problem.contains("unknown variant `mesh`"), "{e}");
        assert!(e.problem.contains("`tor_mesh`"), "{e}");
    }

    #[test]
    fn an_unknown_field_is_named() {
        let e = read(one_target("rate_ps = 10.0"));
        assert_eq!((e.field.as_str(), e.line), ("target[0].rate_ps", Some(12)));
        assert!(e.problem.contains("unknown field `rate_ps`"), "{e}");
        assert!(e.fix.contains("spelling"), "{e}");
    }

    #[test]
    fn a_missing_field_points_at_its_target() {
        let text = one_target("") + "[[target]]\nfrom = \"mlx5_0\"\nto = \"h2/mlx5_0\"\n";
        let e = read(text);
        assert_eq!((e.field.as_str(), e.line), ("target[1]", Some(12)));
        assert!(e.problem.contains("missing field"), "{e}");
    }

    #[test]
    fn a_syntax_error_has_its_line() {
        let e = read(one_target("flow_labels = [1, 2"));
        assert_eq!(e.line, Some(11));
        assert!(e.problem.starts_with("invalid TOML"), "{e}");
    }

    #[test]
    fn version_two_is_refused_before_its_fields() {
        let e = err(r#"
            version = 2
            host = "h0"
            probes_per_second = 5
        "#);
        assert_eq!((e.field.as_str(), e.line), ("version", Some(1)));
        assert_eq!(e.problem, "pinglist format version 2 is not supported by this build (it reads version 1)");
        assert_eq!(e.fix, "regenerate the file with a matching `ctl`, or upgrade the agent");
    }

    #[test]
    fn a_missing_version_is_refused() {
        let e = err(r#"
            host = "h0"
            generation = 1
            generated_unix_ns = 0
        "#);
        assert_eq!((e.field.as_str(), e.line), ("version", None));
        assert!(e.problem.contains("no `version`"), "{e}");
    }

    #[test]
    fn load_reads_the_file_and_names_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pinglist.toml");
        let e = Pinglist::load(&path).unwrap_err();
        assert_eq!((e.file.as_path(), e.line), (path.as_path(), None));
        assert!(e.to_string().starts_with(&path.display().to_string()), "{e}");
        assert!(e.problem.contains("cannot read"), "{e}");

        std::fs::write(&path, doc_example()).unwrap();
        assert_eq!(Pinglist::load(&path).unwrap().generation, 42);
    }

    fn arb_target(host: String, k: usize) -> impl Strategy<Value = Target> {
        (
            prop_oneof![Just("mlx5_0"), Just("mlx5_1"), Just("eth0:18515")],
            "[A-Za-z0-9._:-]{1,8}",
            prop_oneof![Just(ProbeKind::TorMesh), Just(ProbeKind::InterTor), Just(ProbeKind::Service)],
            any::<IpAddr>(),
            proptest::option::of(any::<u16>()),
            proptest::option::of(any::<u32>()),
            prop_oneof![1e-3f64..=MAX_RATE_PPS_PER_TARGET, Just(MAX_RATE_PPS_PER_TARGET)],
            proptest::collection::btree_set(1..=MAX_FLOW_LABEL, 1..6)
                .prop_map(|s| s.into_iter().collect::<Vec<_>>())
                .prop_shuffle(),
        )
            .prop_map(move |(from, device, kind, addr, port, qpn, rate_pps, flow_labels)| Target {
                from: from.to_owned(),
                // The peer's host name differs from `host`, and `k` keeps (from, to, kind)
                // unique.
                to: format!("{host}-peer{k}/{device}"),
                tor: if k.is_multiple_of(2) { String::new() } else { format!("tor{k}") },
                kind,
                addr,
                port,
                qpn,
                rate_pps,
                flow_labels,
            })
    }

    fn arb_pinglist() -> impl Strategy<Value = Pinglist> {
        ("[A-Za-z0-9._:-]{1,12}", any::<u64>(), any::<u64>(), 1..=MAX_TIMEOUT_MS, 0..6usize).prop_flat_map(
            |(host, generation, generated_unix_ns, timeout_ms, n)| {
                let targets: Vec<_> = (0..n).map(|k| arb_target(host.clone(), k)).collect();
                targets.prop_map(move |targets| Pinglist {
                    version: VERSION,
                    host: host.clone(),
                    generation,
                    generated_unix_ns,
                    timeout_ms,
                    targets,
                })
            },
        )
    }

    /// Any pinglist, valid or not, with strings that need escaping now and then.
    fn arb_any_pinglist() -> impl Strategy<Value = Pinglist> {
        let text = || prop_oneof![4 => "[A-Za-z0-9._:/-]{0,10}", 1 => any::<String>(), 1 => "[a\"'\\\\ \t\n]{0,4}"];
        let target = (
            text(),
            text(),
            prop_oneof![Just(ProbeKind::TorMesh), Just(ProbeKind::InterTor), Just(ProbeKind::Service)],
            any::<IpAddr>(),
            proptest::option::of(any::<u16>()),
            proptest::option::of(any::<u32>()),
            prop_oneof![
                any::<f64>(),
                (0..100_000u32).prop_map(f64::from),
                Just(1e20),
                Just(1e300),
                Just(-0.0),
                Just(f64::NAN)
            ],
            proptest::collection::vec(any::<u32>(), 0..4),
        )
            .prop_map(|(from, to, kind, addr, port, qpn, rate_pps, flow_labels)| Target {
                from,
                to,
                tor: String::new(),
                kind,
                addr,
                port,
                qpn,
                rate_pps,
                flow_labels,
            });
        (text(), any::<u32>(), any::<u64>(), any::<u64>(), any::<u32>(), proptest::collection::vec(target, 0..4))
            .prop_map(|(host, version, generation, generated_unix_ns, timeout_ms, targets)| Pinglist {
                version,
                host,
                generation,
                generated_unix_ns,
                timeout_ms,
                targets,
            })
    }

    proptest! {
        #[test]
        fn the_direct_writer_writes_the_toml_crates_bytes(p in arb_any_pinglist()) {
            let direct = p.to_toml_string().unwrap();
            let reference = toml::to_string(&p).unwrap();
            prop_assert_eq!(direct, reference);
        }

        #[test]
        fn valid_pinglists_round_trip(p in arb_pinglist()) {
            let text = p.to_toml_string().unwrap();
            let parsed = Pinglist::parse(&text, Path::new("pl.toml"));
            prop_assert_eq!(parsed, Ok(p), "{}", text);
        }
    }
}
