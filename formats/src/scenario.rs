//! Fault scenarios, format version 1 (`testbeds/scenarios/README.md`): a fabric, how it is
//! probed, what healthy looks like, and the faults injected into it.
//!
//! The scenario is the contract between the simulator (`testbeds simulate`), the accuracy
//! harness (`testbeds score`) and the testbeds that run real agents: all of them read it through
//! this module, so a name or a parameter means the same thing everywhere. Entity names follow
//! the README: `tor3`, `spine1`, `tor3-h5` (or `h5` in a rail-optimised fabric), `tor3-h5/rnic0`,
//! `tor3|spine1`.
//!
//! Two keys beyond the README, both optional: `probing.pinglist_refresh_s` (how long peers keep
//! probing a restarted agent's stale endpoint; default 60) and `normal.ts_source` (`"nic"`, the
//! default: T2..T5 are NIC completion stamps; `"host"`: they are taken by the host when it polls,
//! as on soft-RoCE, so a frozen host inflates the network RTT its peers measure).

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::tomlfile::FileError;
use crate::tomlfile::{self, Document, FieldPath, VersionGate};

/// The scenario format version this build reads.
pub const VERSION: u32 = 1;

const GATE: VersionGate<'static> = VersionGate {
    format: "scenario",
    supported: VERSION as i64,
    mismatch_fix: "write the scenario in format version 1 (testbeds/scenarios/README.md)",
};

/// A whole scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Format version; must be [`VERSION`].
    pub version: u32,
    /// Free text.
    pub name: String,
    /// The simulator's output is a function of the file, this seed included.
    pub seed: u64,
    /// Simulated time, seconds.
    pub duration_s: u64,
    /// Analysis window the truth is scored in, seconds.
    pub window_s: u64,
    /// Wall clock of simulated t = 0, Unix seconds.
    #[serde(default = "default_start_unix_s")]
    pub start_unix_s: u64,
    /// The fabric.
    pub topology: Topology,
    /// How it is probed.
    pub probing: Probing,
    /// Healthy behaviour.
    pub normal: Normal,
    /// The injected faults: the ground truth.
    #[serde(default, rename = "fault")]
    pub faults: Vec<Fault>,
}

fn default_start_unix_s() -> u64 {
    1_700_000_000
}

/// `[topology]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Spine switches; every ToR links to every spine.
    pub spines: u32,
    /// ToRs.
    pub tors: u32,
    /// Hosts under each ToR, or (rail-optimised) hosts in the fabric.
    pub hosts_per_tor: u32,
    /// RNICs per host.
    #[serde(default = "one")]
    pub rnics_per_host: u32,
    /// RNIC k of every host sits under rail ToR k.
    #[serde(default)]
    pub rail_optimised: bool,
}

fn one() -> u32 {
    1
}

/// `[probing]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probing {
    /// Probes per second to each ToR-mesh target (fractions allowed: 0.1 = one every 10 s).
    pub tor_mesh_pps: f64,
    /// Other ToRs each RNIC probes.
    pub inter_tor_tors: u32,
    /// Probes per second per inter-ToR target.
    pub inter_tor_pps: f64,
    /// Flow labels cycled per inter-ToR target.
    pub flow_labels: u32,
    /// A probe not complete after this is lost.
    pub timeout_ms: u64,
    /// Peers of a restarted agent keep probing its stale endpoint until the next refresh, which
    /// happens at multiples of this many seconds of simulated time.
    #[serde(default = "default_refresh_s")]
    pub pinglist_refresh_s: u64,
}

fn default_refresh_s() -> u64 {
    60
}

/// A delay distribution given by two quantiles (microseconds); the simulator fits a log-normal.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quantiles {
    /// Median, µs.
    pub p50: f64,
    /// 99th percentile, µs.
    pub p99: f64,
}

/// Where T2..T5 come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TsModel {
    /// NIC completion stamps: host stalls show in the prober and responder delays.
    #[default]
    Nic,
    /// Host stamps taken at completion-poll time: host stalls show in the network RTT.
    Host,
}

/// `[normal]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Normal {
    /// Network RTT, µs.
    pub network_rtt_us: Quantiles,
    /// Prober host delay, µs.
    pub prober_delay_us: Quantiles,
    /// Responder host delay, µs.
    pub responder_delay_us: Quantiles,
    /// Per-packet loss on every path.
    pub loss: f64,
    /// Timestamp model.
    #[serde(default)]
    pub ts_source: TsModel,
}

/// Fault kinds of the README's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    RnicDown,
    RnicLoss,
    RnicFlap,
    RnicSlow,
    TorDown,
    TorLoss,
    LinkLoss,
    LinkFlap,
    LinkSlow,
    SpineLoss,
    HostStall,
    AgentRestart,
    ClockStep,
}

/// What kind of entity a fault's `target` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityKind {
    Rnic,
    Tor,
    Link,
    Spine,
    Host,
}

impl FaultKind {
    /// Every kind, in the README's order.
    pub const ALL: [FaultKind; 13] = [
        FaultKind::RnicDown,
        FaultKind::RnicLoss,
        FaultKind::RnicFlap,
        FaultKind::RnicSlow,
        FaultKind::TorDown,
        FaultKind::TorLoss,
        FaultKind::LinkLoss,
        FaultKind::LinkFlap,
        FaultKind::LinkSlow,
        FaultKind::SpineLoss,
        FaultKind::HostStall,
        FaultKind::AgentRestart,
        FaultKind::ClockStep,
    ];

    /// The snake_case name used in files.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::RnicDown => "rnic_down",
            FaultKind::RnicLoss => "rnic_loss",
            FaultKind::RnicFlap => "rnic_flap",
            FaultKind::RnicSlow => "rnic_slow",
            FaultKind::TorDown => "tor_down",
            FaultKind::TorLoss => "tor_loss",
            FaultKind::LinkLoss => "link_loss",
            FaultKind::LinkFlap => "link_flap",
            FaultKind::LinkSlow => "link_slow",
            FaultKind::SpineLoss => "spine_loss",
            FaultKind::HostStall => "host_stall",
            FaultKind::AgentRestart => "agent_restart",
            FaultKind::ClockStep => "clock_step",
        }
    }

    /// The kind of entity `target` must name.
    pub fn target_kind(self) -> EntityKind {
        match self {
            FaultKind::RnicDown | FaultKind::RnicLoss | FaultKind::RnicFlap | FaultKind::RnicSlow => EntityKind::Rnic,
            FaultKind::TorDown | FaultKind::TorLoss => EntityKind::Tor,
            FaultKind::LinkLoss | FaultKind::LinkFlap | FaultKind::LinkSlow => EntityKind::Link,
            FaultKind::SpineLoss => EntityKind::Spine,
            FaultKind::HostStall | FaultKind::AgentRestart | FaultKind::ClockStep => EntityKind::Host,
        }
    }

    /// The finding kind `analyze localize` must report for this fault; `None` for the host
    /// kinds, which must produce no network finding (a `host` finding is welcome for a stall).
    pub fn expected_finding(self) -> Option<&'static str> {
        match self.target_kind() {
            EntityKind::Rnic => Some("rnic"),
            EntityKind::Tor => Some("tor"),
            EntityKind::Link => Some("link"),
            EntityKind::Spine => Some("spine"),
            EntityKind::Host => None,
        }
    }

    /// Parameters this kind requires, beyond target and times.
    fn required(self) -> &'static [&'static str] {
        match self {
            FaultKind::RnicLoss | FaultKind::TorLoss | FaultKind::LinkLoss | FaultKind::SpineLoss => &["loss"],
            FaultKind::RnicFlap | FaultKind::LinkFlap => &["period_s", "down_s"],
            FaultKind::RnicSlow | FaultKind::LinkSlow => &["extra_rtt_us"],
            FaultKind::HostStall => &["stall_ms", "period_s"],
            FaultKind::ClockStep => &["step_ms"],
            FaultKind::RnicDown | FaultKind::TorDown | FaultKind::AgentRestart => &[],
        }
    }
}

/// One `[[fault]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// What breaks.
    pub kind: FaultKind,
    /// Entity name (see the module docs).
    pub target: String,
    /// Start, seconds of simulated time.
    #[serde(default)]
    pub start_s: f64,
    /// End, seconds; `None` = until the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_s: Option<f64>,
    /// Per-packet loss, both directions (0-1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Flap or stall period, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_s: Option<f64>,
    /// Down time per flap period, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_s: Option<f64>,
    /// Extra RTT through the slow element, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_rtt_us: Option<f64>,
    /// CPU freeze per period, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_ms: Option<f64>,
    /// Wall-clock jump, ms (negative = backwards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_ms: Option<f64>,
}

impl Fault {
    /// A fault of `kind` on `target` from `start_s` to `end_s`, its parameters unset (the
    /// generator and the testbeds set those their kind takes).
    pub fn new(kind: FaultKind, target: impl Into<String>, start_s: f64, end_s: Option<f64>) -> Fault {
        Fault {
            kind,
            target: target.into(),
            start_s,
            end_s,
            loss: None,
            period_s: None,
            down_s: None,
            extra_rtt_us: None,
            stall_ms: None,
            step_ms: None,
        }
    }

    /// End of the fault in seconds, given the scenario's duration.
    pub fn end_or(&self, duration_s: u64) -> f64 {
        self.end_s.unwrap_or(duration_s as f64)
    }

    fn param(&self, name: &str) -> Option<f64> {
        match name {
            "loss" => self.loss,
            "period_s" => self.period_s,
            "down_s" => self.down_s,
            "extra_rtt_us" => self.extra_rtt_us,
            "stall_ms" => self.stall_ms,
            "step_ms" => self.step_ms,
            _ => None,
        }
    }
}

/// A parsed entity name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entity {
    /// `tor{i}`.
    Tor(u32),
    /// `spine{j}`.
    Spine(u32),
    /// `tor{i}|spine{j}` (either order).
    Link { tor: u32, spine: u32 },
    /// A host by index in the fabric (ToR-major for non-rail fabrics).
    Host(u32),
    /// An RNIC: host index and RNIC index within the host.
    Rnic { host: u32, rnic: u32 },
}

fn index_after(s: &str, prefix: &str) -> Option<u32> {
    let digits = s.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

impl Topology {
    /// Hosts in the fabric.
    pub fn host_count(&self) -> u32 {
        if self.rail_optimised { self.hosts_per_tor } else { self.tors * self.hosts_per_tor }
    }

    /// RNICs in the fabric.
    pub fn rnic_count(&self) -> u32 {
        self.host_count() * self.rnics_per_host
    }

    /// Name of host `h`.
    pub fn host_name(&self, h: u32) -> String {
        if self.rail_optimised {
            format!("h{h}")
        } else {
            format!("tor{}-h{}", h / self.hosts_per_tor, h % self.hosts_per_tor)
        }
    }

    /// ToR of RNIC `k` of host `h`.
    pub fn tor_of(&self, h: u32, k: u32) -> u32 {
        if self.rail_optimised { k } else { h / self.hosts_per_tor }
    }

    /// Parses an entity name against this topology; `None` if it names nothing in it.
    pub fn entity(&self, name: &str) -> Option<Entity> {
        if let Some((a, b)) = name.split_once('|') {
            let (tor, spine) = match (index_after(a, "tor"), index_after(b, "spine")) {
                (Some(t), Some(s)) => (t, s),
                _ => (index_after(b, "tor")?, index_after(a, "spine")?),
            };
            return (tor < self.tors && spine < self.spines).then_some(Entity::Link { tor, spine });
        }
        if let Some((host, rnic)) = name.split_once('/') {
            let Entity::Host(h) = self.entity(host)? else { return None };
            let k = index_after(rnic, "rnic")?;
            return (k < self.rnics_per_host).then_some(Entity::Rnic { host: h, rnic: k });
        }
        if let Some(s) = index_after(name, "spine") {
            return (s < self.spines).then_some(Entity::Spine(s));
        }
        if let Some(t) = index_after(name, "tor") {
            return (t < self.tors).then_some(Entity::Tor(t));
        }
        if self.rail_optimised {
            let h = index_after(name, "h")?;
            return (h < self.hosts_per_tor).then_some(Entity::Host(h));
        }
        let (tor, host) = name.split_once("-h")?;
        let (t, j) = (index_after(tor, "tor")?, index_after(&format!("h{host}"), "h")?);
        (t < self.tors && j < self.hosts_per_tor).then_some(Entity::Host(t * self.hosts_per_tor + j))
    }
}

/// Bounds that keep a scenario something this machine can simulate and analyse.
const MAX_RNICS: u32 = 200_000;

impl Scenario {
    /// Reads and validates the scenario at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Scenario, FileError> {
        let path = path.as_ref();
        Self::parse(&tomlfile::read_text(path)?, path)
    }

    /// Parses and validates `text`; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Scenario, FileError> {
        let mut doc = Document::parse(path, text, &GATE)?;
        let scenario: Scenario = doc.deserialize()?;
        scenario.validate(&doc)?;
        Ok(scenario)
    }

    /// The scenario as TOML that [`Scenario::parse`] reads back unchanged.
    pub fn to_toml_string(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// Start of simulated time, Unix ns.
    pub fn start_unix_ns(&self) -> u64 {
        self.start_unix_s * 1_000_000_000
    }

    fn validate(&self, doc: &Document<'_>) -> Result<(), FileError> {
        let root = FieldPath::root();
        let positive = |path: FieldPath, v: f64, what: &str| -> Result<(), FileError> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(doc.error(&path, format!("{what} must be a positive number, found {v}"), "give a value above 0"))
            }
        };
        if self.duration_s == 0 || self.window_s == 0 || self.window_s > self.duration_s {
            return Err(doc.error(
                &root.key("window_s"),
                format!("window_s = {} with duration_s = {}", self.window_s, self.duration_s),
                "use 0 < window_s <= duration_s",
            ));
        }
        let topo = root.key("topology");
        let t = &self.topology;
        for (key, v) in [
            ("spines", t.spines),
            ("tors", t.tors),
            ("hosts_per_tor", t.hosts_per_tor),
            ("rnics_per_host", t.rnics_per_host),
        ] {
            if v == 0 {
                return Err(doc.error(&topo.key(key), format!("{key} = 0"), "a fabric needs at least one of each"));
            }
        }
        if t.rail_optimised && t.tors != t.rnics_per_host {
            return Err(doc.error(
                &topo.key("tors"),
                format!(
                    "a rail-optimised fabric has one rail ToR per RNIC of a host: tors = {}, rnics_per_host = {}",
                    t.tors, t.rnics_per_host
                ),
                "set tors equal to rnics_per_host",
            ));
        }
        if u64::from(t.host_count()) * u64::from(t.rnics_per_host) > u64::from(MAX_RNICS) {
            return Err(doc.error(&topo, format!("more than {MAX_RNICS} RNICs"), "simulate a smaller fabric"));
        }
        let p = &self.probing;
        let probing = root.key("probing");
        positive(probing.key("tor_mesh_pps"), p.tor_mesh_pps, "tor_mesh_pps")?;
        positive(probing.key("inter_tor_pps"), p.inter_tor_pps, "inter_tor_pps")?;
        if p.tor_mesh_pps > 1000.0 || p.inter_tor_pps > 1000.0 {
            return Err(doc.error(
                &probing,
                "a per-target rate above 1000/s",
                "probe each target at most 1000 times a second",
            ));
        }
        if p.inter_tor_tors >= t.tors.max(1) && t.tors > 1 {
            return Err(doc.error(
                &probing.key("inter_tor_tors"),
                format!("inter_tor_tors = {} but there are only {} other ToRs", p.inter_tor_tors, t.tors - 1),
                "probe at most tors - 1 other ToRs",
            ));
        }
        if p.flow_labels == 0 || p.flow_labels > 4096 {
            return Err(doc.error(
                &probing.key("flow_labels"),
                format!("flow_labels = {}", p.flow_labels),
                "use 1 to 4096 labels",
            ));
        }
        if p.timeout_ms == 0 || p.timeout_ms > 60_000 {
            return Err(doc.error(
                &probing.key("timeout_ms"),
                format!("timeout_ms = {}", p.timeout_ms),
                "use 1 to 60000 ms",
            ));
        }
        if p.pinglist_refresh_s == 0 {
            return Err(doc.error(
                &probing.key("pinglist_refresh_s"),
                "pinglist_refresh_s = 0",
                "use a refresh period of at least 1 s",
            ));
        }
        let normal = root.key("normal");
        for (key, q) in [
            ("network_rtt_us", self.normal.network_rtt_us),
            ("prober_delay_us", self.normal.prober_delay_us),
            ("responder_delay_us", self.normal.responder_delay_us),
        ] {
            if !(q.p50.is_finite() && q.p50 > 0.0 && q.p99.is_finite() && q.p99 >= q.p50) {
                return Err(doc.error(
                    &normal.key(key),
                    format!("p50 = {}, p99 = {}", q.p50, q.p99),
                    "use 0 < p50 <= p99 (µs)",
                ));
            }
        }
        if !(0.0..1.0).contains(&self.normal.loss) {
            return Err(doc.error(
                &normal.key("loss"),
                format!("loss = {}", self.normal.loss),
                "use a per-packet loss in [0, 1)",
            ));
        }
        for (i, f) in self.faults.iter().enumerate() {
            self.validate_fault(doc, &root.key("fault").index(i), f)?;
        }
        Ok(())
    }

    fn validate_fault(&self, doc: &Document<'_>, at: &FieldPath, f: &Fault) -> Result<(), FileError> {
        let entity = self.topology.entity(&f.target);
        let wanted = f.kind.target_kind();
        let ok = matches!(
            (entity, wanted),
            (Some(Entity::Rnic { .. }), EntityKind::Rnic)
                | (Some(Entity::Tor(_)), EntityKind::Tor)
                | (Some(Entity::Link { .. }), EntityKind::Link)
                | (Some(Entity::Spine(_)), EntityKind::Spine)
                | (Some(Entity::Host(_)), EntityKind::Host)
        );
        if !ok {
            return Err(doc.error(
                &at.key("target"),
                format!("`{}` is not a {:?} of this topology (fault kind {})", f.target, wanted, f.kind.name()),
                "name it as in the scenarios README: tor3, spine1, tor3|spine1, tor3-h5 (h5 when rail-optimised), tor3-h5/rnic0",
            ));
        }
        let end = f.end_or(self.duration_s);
        if !(f.start_s.is_finite() && f.start_s >= 0.0 && end > f.start_s && end <= self.duration_s as f64) {
            return Err(doc.error(
                &at.key("start_s"),
                format!("fault spans {}..{} s in a {} s scenario", f.start_s, end, self.duration_s),
                "use 0 <= start_s < end_s <= duration_s",
            ));
        }
        for &name in f.kind.required() {
            let Some(v) = f.param(name) else {
                return Err(doc.error(
                    at,
                    format!("a {} fault needs `{name}`", f.kind.name()),
                    format!("add `{name} = ...`"),
                ));
            };
            let valid = match name {
                "loss" => v > 0.0 && v <= 1.0,
                "step_ms" => v.is_finite() && v != 0.0,
                _ => v.is_finite() && v > 0.0,
            };
            if !valid {
                return Err(doc.error(
                    &at.key(name),
                    format!("{name} = {v}"),
                    "loss in (0, 1]; step_ms nonzero; others above 0",
                ));
            }
        }
        if let (Some(period), Some(down)) = (f.period_s, f.down_s)
            && down >= period
        {
            return Err(doc.error(
                &at.key("down_s"),
                format!("down_s = {down} >= period_s = {period}"),
                "a flap must be up part of each period",
            ));
        }
        if let (Some(period), Some(stall)) = (f.period_s, f.stall_ms)
            && stall >= period * 1000.0
        {
            return Err(doc.error(
                &at.key("stall_ms"),
                format!("stall_ms = {stall} fills the whole period"),
                "stall for less than period_s",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
version = 1
name = "one-dead-rnic"
seed = 42
duration_s = 300
window_s = 30

[topology]
spines = 4
tors = 8
hosts_per_tor = 16

[probing]
tor_mesh_pps = 10
inter_tor_tors = 5
inter_tor_pps = 1
flow_labels = 16
timeout_ms = 500

[normal]
network_rtt_us = { p50 = 4.0, p99 = 12.0 }
prober_delay_us = { p50 = 2.0, p99 = 15.0 }
responder_delay_us = { p50 = 1.0, p99 = 6.0 }
loss = 1e-6

[[fault]]
kind = "rnic_down"
target = "tor3-h5/rnic0"
start_s = 60
"#;

    fn parse(text: &str) -> Result<Scenario, FileError> {
        Scenario::parse(text, Path::new("s.toml"))
    }

    #[test]
    fn readme_example_parses_and_round_trips() {
        let s = parse(EXAMPLE).unwrap();
        assert_eq!(s.start_unix_s, 1_700_000_000);
        assert_eq!(s.faults[0].kind, FaultKind::RnicDown);
        assert_eq!(s.topology.entity("tor3-h5/rnic0"), Some(Entity::Rnic { host: 53, rnic: 0 }));
        let again = parse(&s.to_toml_string().unwrap()).unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn entity_names_follow_the_readme() {
        let s = parse(EXAMPLE).unwrap();
        let t = &s.topology;
        assert_eq!(t.entity("spine1|tor3"), Some(Entity::Link { tor: 3, spine: 1 }));
        assert_eq!(t.entity("tor3|spine1"), Some(Entity::Link { tor: 3, spine: 1 }));
        assert_eq!(t.entity("tor8"), None);
        assert_eq!(t.entity("tor3-h16"), None);
        assert_eq!(t.entity("tor03"), None);
        assert_eq!(t.entity("tor3-h5/rnic1"), None);
        assert_eq!(t.host_name(53), "tor3-h5");
        let rail = Topology { spines: 2, tors: 8, hosts_per_tor: 100, rnics_per_host: 8, rail_optimised: true };
        assert_eq!(rail.entity("h7/rnic3"), Some(Entity::Rnic { host: 7, rnic: 3 }));
        assert_eq!(rail.tor_of(7, 3), 3);
        assert_eq!(rail.host_name(7), "h7");
    }

    #[test]
    fn bad_faults_name_the_field_and_line() {
        let e = parse(&EXAMPLE.replace("tor3-h5/rnic0", "tor9-h5/rnic0")).unwrap_err();
        assert_eq!(e.field, "fault[0].target");
        assert_eq!(e.line, Some(28));
        let e = parse(&EXAMPLE.replace("rnic_down", "rnic_loss")).unwrap_err();
        assert!(e.problem.contains("needs `loss`"), "{e}");
        let e = parse(&EXAMPLE.replace("rnic_down", "rnic_melts")).unwrap_err();
        assert_eq!(e.field, "fault[0].kind");
        let e = parse(&EXAMPLE.replace("start_s = 60", "start_s = 600")).unwrap_err();
        assert_eq!(e.field, "fault[0].start_s");
        let e = parse(&EXAMPLE.replace("version = 1", "version = 2")).unwrap_err();
        assert!(e.problem.contains("version 2"), "{e}");
    }
}
