//! What an agent says about its own host (`agent describe`), so that nobody types GIDs by
//! hand: `ctl inventory import` turns a directory of these into an inventory. It lives here,
//! with the other contracts, because the agent writes it and ctl reads it.
//!
//! A host does not know which ToR each of its ports is cabled to, so a description has no
//! ToR; the operator supplies that mapping at import (`ctl inventory import`).
//!
//! ```toml
//! version = 1
//! host = "node017"
//!
//! [[rnic]]
//! device = "mlx5_0"               # verbs device
//! ip = "10.0.17.1"                # address of the port's netdev (RoCEv2)
//! gid = "::ffff:10.0.17.1"        # optional: the GID at gid_index; default derived from ip
//! port = 1                        # optional, default 1
//! gid_index = 3                   # optional: the RoCEv2 GID index the agent uses
//! netdev = "ens1f0np0"            # optional: the netdev behind the port
//!
//! [[rnic]]
//! device = "mlx5_1"
//! ip = "10.1.17.1"
//! gid_index = 3
//! netdev = "ens2f0np0"
//! ```
//!
//! Rules beyond the syntax: `version = 1`; `host` and `device` are valid inventory names (only
//! `[A-Za-z0-9._:-]`) and the host name can be a file name and an ssh destination; at least one
//! `[[rnic]]`; devices and addresses are unique within the host; `port` is at least 1.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

use crate::inventory::FileError;
use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::tomlfile::{line_of, name_problem};

/// The description format version this build reads and writes.
pub const VERSION: u32 = 1;

/// One host as its agent sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostDescription {
    pub version: u32,
    /// The host's name, as the inventory and ssh will know it.
    pub host: String,
    #[serde(rename = "rnic", default, skip_serializing_if = "Vec::is_empty")]
    pub rnics: Vec<RnicDescription>,
}

/// One RDMA port of the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RnicDescription {
    /// Verbs device name, e.g. `mlx5_0`.
    pub device: String,
    pub ip: IpAddr,
    /// The GID at `gid_index`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<Ipv6Addr>,
    #[serde(default = "default_port")]
    pub port: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u16>,
    /// The netdev behind the port; `ctl inventory import` keeps it, and `ctl inventory lldp`
    /// uses it to place a host's cables when the host has two RNICs under one ToR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
}

fn default_port() -> u8 {
    1
}

// The same shape with spans, so that semantic errors can name their line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    #[allow(dead_code, reason = "checked before deserialising, kept so the field is accepted")]
    version: u32,
    host: Spanned<String>,
    #[serde(default)]
    rnic: Vec<Spanned<RawRnic>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRnic {
    device: Spanned<String>,
    ip: Spanned<IpAddr>,
    #[serde(default)]
    gid: Option<Ipv6Addr>,
    #[serde(default)]
    port: Option<Spanned<u8>>,
    #[serde(default)]
    gid_index: Option<u16>,
    #[serde(default)]
    netdev: Option<Spanned<String>>,
}

impl HostDescription {
    /// Reads and validates the description at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<HostDescription, FileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            FileError::new(
                path,
                None,
                "",
                format!("cannot read the host description: {e}"),
                "check the path; write it with `agent describe > FILE` on the host",
            )
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text`; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<HostDescription, FileError> {
        check_version(text, path)?;
        let raw: RawHost = toml::from_str(text).map_err(|e| {
            let (line, field) = match e.span() {
                Some(span) => (Some(line_of(text, span.start)), field_at(text, span.start)),
                None => (None, String::new()),
            };
            let message = e.message().to_owned();
            let fix = if message.starts_with("unknown field") {
                "remove the field or correct its spelling (the accepted fields are listed)"
            } else if message.starts_with("missing field") {
                "add the missing field"
            } else {
                "correct the value"
            };
            FileError::new(path, line, field, message, fix)
        })?;
        validate(raw, text, path)
    }

    /// The description as TOML that [`HostDescription::parse`] reads back unchanged.
    pub fn to_toml_string(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }
}

fn check_version(text: &str, path: &Path) -> Result<(), FileError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        FileError::new(
            path,
            e.span().map(|s| line_of(text, s.start)),
            "",
            format!("invalid TOML: {}", e.message()),
            "correct the TOML syntax at this line",
        )
    })?;
    match table.get("version") {
        Some(toml::Value::Integer(v)) if *v == i64::from(VERSION) => Ok(()),
        Some(other) => Err(FileError::new(
            path,
            line_of_key(text, "version"),
            "version",
            format!("host description version {other} is not supported by this build (it reads version {VERSION})"),
            "describe the host with an agent matching this ctl, or upgrade ctl",
        )),
        None => Err(FileError::new(
            path,
            None,
            "version",
            "the host description has no `version`",
            format!("add `version = {VERSION}` at the top of the file"),
        )),
    }
}

fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| l.trim_start().strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('=')))
        .map(|i| i + 1)
}

/// The field an error at `offset` is about: the key on that line, inside the `[[rnic]]` it
/// belongs to (`rnic[1].gid_idx`).
fn field_at(text: &str, offset: usize) -> String {
    let line = line_of(text, offset);
    let mut rnic: Option<usize> = None;
    let mut key = String::new();
    for (i, l) in text.lines().enumerate().take(line) {
        let l = l.trim();
        if l.starts_with("[[rnic]]") {
            rnic = Some(rnic.map_or(0, |n| n + 1));
            key.clear();
        } else if i + 1 == line
            && let Some((k, _)) = l.split_once('=')
        {
            key = k.trim().to_owned();
        }
    }
    match (rnic, key.is_empty()) {
        (Some(n), false) => format!("rnic[{n}].{key}"),
        (Some(n), true) => format!("rnic[{n}]"),
        (None, _) => key,
    }
}

fn validate(raw: RawHost, text: &str, path: &Path) -> Result<HostDescription, FileError> {
    let at = |span: std::ops::Range<usize>| Some(line_of(text, span.start));
    let host_line = at(raw.host.span());
    let host = raw.host.into_inner();
    if let Some(problem) = name_problem(&host).or_else(|| host_name_problem(&host)) {
        return Err(FileError::new(
            path,
            host_line,
            "host",
            problem,
            "describe the host under the name the inventory and ssh use for it (A-Z a-z 0-9 . _ : -)",
        ));
    }
    if raw.rnic.is_empty() {
        return Err(FileError::new(
            path,
            host_line,
            "rnic",
            format!("host {host:?} has no [[rnic]]"),
            "describe a host with at least one RDMA port (is the RDMA driver loaded? `ibv_devices`)",
        ));
    }
    let mut devices: HashMap<String, usize> = HashMap::new();
    let mut ips: HashMap<IpAddr, usize> = HashMap::new();
    let mut rnics = Vec::with_capacity(raw.rnic.len());
    for (i, spanned) in raw.rnic.into_iter().enumerate() {
        let r = spanned.into_inner();
        let device_line = at(r.device.span());
        let device = r.device.into_inner();
        if let Some(problem) = name_problem(&device) {
            return Err(FileError::new(
                path,
                device_line,
                format!("rnic[{i}].device"),
                problem,
                "use the verbs device name `ibv_devices` shows",
            ));
        }
        if let Some(first) = devices.insert(device.clone(), i) {
            return Err(FileError::new(
                path,
                device_line,
                format!("rnic[{i}].device"),
                format!("device {device:?} is also rnic[{first}]"),
                "list each device once",
            ));
        }
        let ip_line = at(r.ip.span());
        let ip = r.ip.into_inner();
        if let Some(first) = ips.insert(ip, i) {
            return Err(FileError::new(
                path,
                ip_line,
                format!("rnic[{i}].ip"),
                format!("ip {ip} is also the address of rnic[{first}]"),
                "give each port its own address",
            ));
        }
        let port = match r.port {
            Some(p) if *p.get_ref() == 0 => {
                return Err(FileError::new(
                    path,
                    at(p.span()),
                    format!("rnic[{i}].port"),
                    "port 0 does not exist: RDMA ports are numbered from 1",
                    "use the port number `ibv_devinfo` shows (usually 1), or omit `port`",
                ));
            }
            Some(p) => p.into_inner(),
            None => default_port(),
        };
        let netdev = match r.netdev {
            Some(n) if n.get_ref().is_empty() => {
                return Err(FileError::new(
                    path,
                    at(n.span()),
                    format!("rnic[{i}].netdev"),
                    "`netdev` is empty",
                    "name the netdev behind the port (`rdma link show`), or omit `netdev`",
                ));
            }
            Some(n) => Some(n.into_inner()),
            None => None,
        };
        rnics.push(RnicDescription { device, ip, gid: r.gid, port, gid_index: r.gid_index, netdev });
    }
    Ok(HostDescription { version: VERSION, host, rnics })
}

/// Host names become file names (`DIR/<host>.toml`) and ssh destinations, so some names the
/// inventory format accepts cannot be used as hosts. `None` when `host` is fine.
pub fn host_name_problem(host: &str) -> Option<String> {
    if host == "." || host == ".." {
        Some(format!("host name {host:?} cannot be a file name"))
    } else if host.starts_with('-') {
        Some(format!("host name {host:?} starts with '-', which ssh would read as an option"))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> String {
        // The module doc's example, without the `//! ` prefixes.
        let src = include_str!("describe.rs");
        let start = src.find("//! ```toml\n").map(|i| i + "//! ```toml\n".len()).unwrap_or(0);
        src[start..]
            .lines()
            .take_while(|l| *l != "//! ```")
            .map(|l| l.strip_prefix("//! ").or_else(|| l.strip_prefix("//!")).unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn err(text: &str) -> FileError {
        match HostDescription::parse(text, Path::new("d.toml")) {
            Ok(d) => panic!("expected an error, parsed {d:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn the_documented_example_parses_and_round_trips() {
        let d = HostDescription::parse(&example(), Path::new("d.toml")).unwrap();
        assert_eq!(d.host, "node017");
        assert_eq!(d.rnics.len(), 2);
        assert_eq!(d.rnics[0].gid, Some("::ffff:10.0.17.1".parse().unwrap()));
        assert_eq!((d.rnics[0].port, d.rnics[0].gid_index), (1, Some(3)));
        assert_eq!(d.rnics[1].netdev.as_deref(), Some("ens2f0np0"));
        let text = d.to_toml_string().unwrap();
        assert_eq!(HostDescription::parse(&text, Path::new("d.toml")).unwrap(), d);
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let e = err("version = 1\nhost = \"h0\"\n[[rnic]]\ndevice = \"mlx5_0\"\nip = \"10.0.0.1\"\ngid_idx = 3\n");
        assert_eq!((e.line, e.field.as_str()), (Some(6), "rnic[0].gid_idx"));
        assert!(e.problem.contains("unknown field"), "{e}");

        let e = err(
            "version = 1\nhost = \"h0\"\n[[rnic]]\ndevice = \"mlx5_0\"\nip = \"10.0.0.1\"\n[[rnic]]\ndevice = \"mlx5_0\"\nip = \"10.0.0.2\"\n",
        );
        assert_eq!((e.line, e.field.as_str()), (Some(7), "rnic[1].device"));
        assert!(e.problem.contains("also rnic[0]"), "{e}");

        let e = err("version = 1\nhost = \"h0\"\n[[rnic]]\ndevice = \"mlx5_0\"\nip = \"10.0.0.300\"\n");
        assert_eq!((e.line, e.field.as_str()), (Some(5), "rnic[0].ip"));

        let e = err("version = 1\nhost = \"h0\"\n[[rnic]]\ndevice = \"mlx5_0\"\nip = \"10.0.0.1\"\nport = 0\n");
        assert_eq!((e.line, e.field.as_str()), (Some(6), "rnic[0].port"));

        let e = err("version = 1\nhost = \"h0\"\n");
        assert_eq!((e.line, e.field.as_str()), (Some(2), "rnic"));
        assert!(e.fix.contains("ibv_devices"), "{e}");

        let e = err("version = 1\nhost = \"-oProxyCommand\"\n[[rnic]]\ndevice = \"d\"\nip = \"10.0.0.1\"\n");
        assert_eq!((e.line, e.field.as_str()), (Some(2), "host"));
        assert!(e.problem.contains("ssh"), "{e}");

        let e = err("version = 2\nhost = \"h0\"\n");
        assert_eq!((e.line, e.field.as_str()), (Some(1), "version"));
        assert!(e.problem.contains("version 2 is not supported"), "{e}");

        let e = err("host = \"h0\"\n");
        assert!(e.problem.contains("no `version`"), "{e}");
    }
}
