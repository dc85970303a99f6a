//! Probe semantics, the one place that says what a probe record counts as: its class, the
//! unreachable rule, the loss ratio, the timestamp-source label, the report scopes and the SLA
//! thresholds with their breach test. `analyze report`, `html`, `export` and `localize` all
//! classify through this module, so an outcome means the same in every output.
//!
//! The rule itself, per record ([`Class::of`], defined in `formats::record` so that the agent's
//! live metrics classify with the same function), per pair (the unreachable rule,
//! [`split_unreachable`]) and for the loss ratio ([`loss_ratio`]), is written once, with why each
//! class counts as it does: docs/design/analysis.md#what-a-probe-counts-as. This module is its
//! code; change both together.
//!
//! Timestamp sources ([`TsSources`]): delays are only comparable within one source (a
//! host-poll stamp includes the poll loop's latency, a NIC stamp does not), so a set of samples
//! carries the set of sources it came from, and it is rendered as the one source's name
//! (`nic`, `host_poll`, `kernel_software`, `kernel_hardware`, `unknown` for a byte this build
//! does not know) or as `mixed(<a>+<b>...)` in that order. Reports label each row's quantiles
//! with it; localisation keeps one fleet baseline per source.

use std::path::{Path, PathBuf};

use rocemesh_formats::record::TsSource;
use serde::{Deserialize, Serialize};

pub use rocemesh_formats::record::Class;

/// Per (window, prober, target): `(lost, unreachable)` from the raw counts. A pair with no ok
/// and no partial but some lost is a dead peer, and its losses are `unreachable`.
pub fn split_unreachable(ok: u64, partial: u64, lost_raw: u64) -> (u64, u64) {
    if ok + partial == 0 { (0, lost_raw) } else { (lost_raw, 0) }
}

/// lost / (ok + partial + lost); `None` when nothing was in the network.
pub fn loss_ratio(ok: u64, partial: u64, lost: u64) -> Option<f64> {
    let denominator = ok + partial + lost;
    (denominator > 0).then(|| lost as f64 / denominator as f64)
}

/// Distinct timestamp-source codes: the four [`TsSource`]s, then one for bytes this build does
/// not know.
pub const TS_CODES: usize = 5;

/// The timestamp-source code of a record's `ts_source` byte: the byte itself for a known
/// source, [`TS_CODES`] - 1 for any other.
#[inline]
pub fn ts_code(ts_source: u8) -> u8 {
    ts_source.min(TS_CODES as u8 - 1)
}

/// The name of a timestamp-source code.
pub fn ts_name(code: u8) -> &'static str {
    match TsSource::from_u8(code) {
        Some(TsSource::Nic) => "nic",
        Some(TsSource::HostPoll) => "host_poll",
        Some(TsSource::KernelSoftware) => "kernel_software",
        Some(TsSource::KernelHardware) => "kernel_hardware",
        None => "unknown",
    }
}

/// A set of timestamp sources: bit `c` for [`ts_code`] `c`. A bitmask so that the report can
/// OR it per key instead of looking anything up per record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TsSources(pub u8);

impl TsSources {
    /// The set holding the source of one `ts_source` byte.
    #[inline]
    pub fn of(ts_source: u8) -> TsSources {
        TsSources(1 << ts_code(ts_source))
    }

    /// Whether no source is in the set (no sample).
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set's codes, ascending.
    pub fn codes(self) -> impl Iterator<Item = u8> {
        (0..TS_CODES as u8).filter(move |c| self.0 & (1 << c) != 0)
    }

    /// `host_poll`, `mixed(host_poll+kernel_software)`, or `None` for the empty set.
    pub fn label(self) -> Option<String> {
        let names: Vec<&str> = self.codes().map(ts_name).collect();
        match names.as_slice() {
            [] => None,
            [one] => Some((*one).to_owned()),
            many => Some(format!("mixed({})", many.join("+"))),
        }
    }
}

/// What a report row aggregates over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The whole fleet.
    Cluster,
    /// Prober's ToR -> target's ToR.
    #[value(name = "tor_pair")]
    TorPair,
    /// Records whose prober or target hangs off the ToR (a ToR-local record once): a broken
    /// ToR hurts both directions.
    Tor,
    /// Records whose prober or target is the RNIC (a self-probe once).
    Rnic,
    /// Prober -> target.
    Pair,
    /// One traced service connection (an RDMA QP of a job): its own probes only, which follow
    /// the connection's GIDs and flow label. Every other scope counts them at the remote RNIC.
    Service,
}

impl Scope {
    /// The name used in every output.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::TorPair => "tor_pair",
            Scope::Tor => "tor",
            Scope::Rnic => "rnic",
            Scope::Pair => "pair",
            Scope::Service => "service",
        }
    }
}

/// The default scopes: `pair` is left out because it has one row per probed pair and window.
pub const DEFAULT_SCOPES: [Scope; 3] = [Scope::Cluster, Scope::Tor, Scope::Rnic];

/// An SLA configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SlaError {
    /// The file could not be read.
    #[error("{}: read SLA configuration: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file does not parse, or a threshold is out of range.
    #[error("{}: {detail}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        detail: String,
    },
}

/// SLA thresholds; a row breaking either is a violation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sla {
    /// Highest acceptable loss ratio (0.001 = Pingmesh's 0.1%).
    #[serde(default = "default_loss_ratio")]
    pub loss_ratio: f64,
    /// Highest acceptable network RTT p99, µs (rpingmesh's phase-1 bound is 500).
    #[serde(default = "default_rtt_p99_us")]
    pub rtt_p99_us: f64,
}

fn default_loss_ratio() -> f64 {
    0.001
}

fn default_rtt_p99_us() -> f64 {
    500.0
}

impl Default for Sla {
    fn default() -> Self {
        Sla { loss_ratio: default_loss_ratio(), rtt_p99_us: default_rtt_p99_us() }
    }
}

impl Sla {
    /// Thresholds from a TOML file with the optional keys `loss_ratio` and `rtt_p99_us`
    /// (missing keys keep their defaults; unknown keys are refused, a typo must not silently
    /// keep a default).
    pub fn from_file(path: &Path) -> Result<Sla, SlaError> {
        let text = std::fs::read_to_string(path).map_err(|source| SlaError::Io { path: path.to_owned(), source })?;
        let sla: Sla = toml::from_str(&text).map_err(|e| SlaError::Invalid {
            path: path.to_owned(),
            detail: format!("{e}; the file holds `loss_ratio = 0.001` and `rtt_p99_us = 500`, both optional"),
        })?;
        sla.check().map_err(|detail| SlaError::Invalid { path: path.to_owned(), detail })?;
        Ok(sla)
    }

    /// Whether both thresholds make sense.
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.loss_ratio) {
            return Err(format!("loss_ratio = {} is not a ratio: use 0 to 1 (0.001 is 0.1%)", self.loss_ratio));
        }
        if !self.rtt_p99_us.is_finite() || self.rtt_p99_us < 0.0 {
            return Err(format!("rtt_p99_us = {} must be a non-negative number of µs", self.rtt_p99_us));
        }
        Ok(())
    }

    /// The thresholds a row with these figures breaks (strictly above the threshold).
    pub fn violations(&self, loss_ratio: Option<f64>, rtt_ns_p99: Option<i64>) -> Vec<Violation> {
        let mut v = Vec::new();
        if loss_ratio.is_some_and(|l| l > self.loss_ratio) {
            v.push(Violation::Loss);
        }
        if rtt_ns_p99.is_some_and(|r| r as f64 > self.rtt_p99_us * 1e3) {
            v.push(Violation::RttP99);
        }
        v
    }
}

/// Which threshold a row broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Violation {
    /// loss_ratio above [`Sla::loss_ratio`].
    Loss,
    /// rtt_ns_p99 above [`Sla::rtt_p99_us`].
    RttP99,
}

impl Violation {
    /// The name used in every output.
    pub fn name(self) -> &'static str {
        match self {
            Violation::Loss => "loss",
            Violation::RttP99 => "rtt_p99",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemesh_formats::record::Arrived;

    /// Every outcome byte against every arrival bitmap: only ACK1 separates lost from
    /// partial, and only for outcome 1.
    #[test]
    fn classification_table() {
        let (none, sent, ack1, ack2) = (0u8, Arrived::PROBE_SENT, Arrived::ACK1, Arrived::ACK2);
        for arrived in 0..8u8 {
            assert_eq!(Class::of(0, arrived), Class::Ok, "ok whatever arrived says");
            assert_eq!(Class::of(2, arrived), Class::Invalid);
            assert_eq!(Class::of(3, arrived), Class::Refused);
            assert_eq!(Class::of(4, arrived), Class::LocalDrop, "a local drop is never loss");
            assert_eq!(Class::of(5, arrived), Class::Refused, "refused by authentication is never loss");
            for unknown in [6u8, 7, 0x80, 255] {
                assert_eq!(Class::of(unknown, arrived), Class::Unknown, "byte {unknown} is never ok");
            }
        }
        // Outcome lost: the arrival bitmap decides.
        assert_eq!(Class::of(1, none), Class::Lost, "verbs: target not resolved over the network");
        assert_eq!(Class::of(1, sent), Class::Lost);
        assert_eq!(Class::of(1, sent | ack2), Class::Lost, "ACK2 without ACK1 proves nothing");
        assert_eq!(Class::of(1, sent | ack1), Class::Partial);
        assert_eq!(Class::of(1, ack1), Class::Partial);
        assert_eq!(Class::of(1, sent | ack1 | ack2), Class::Partial);
    }

    #[test]
    fn classes_round_trip_and_fit_three_bits() {
        for c in Class::ALL {
            assert_eq!(Class::from_u8(c as u8), Some(c));
            assert!((c as u8) < 8);
        }
        assert_eq!(Class::from_u8(7), None);
        let denominators: Vec<&str> = Class::ALL.iter().filter(|c| c.in_loss_denominator()).map(|c| c.name()).collect();
        assert_eq!(denominators, ["ok", "lost", "partial"]);
    }

    #[test]
    fn unreachable_and_loss_ratio() {
        assert_eq!(split_unreachable(0, 0, 5), (0, 5), "nothing but losses: a dead peer");
        assert_eq!(split_unreachable(0, 1, 5), (5, 0), "a partial reply proves the peer alive");
        assert_eq!(split_unreachable(3, 0, 5), (5, 0));
        assert_eq!(split_unreachable(0, 0, 0), (0, 0), "only local drops: not unreachable");
        assert_eq!(loss_ratio(0, 0, 0), None);
        assert_eq!(loss_ratio(10, 0, 5), Some(5.0 / 15.0));
        assert_eq!(loss_ratio(0, 0, 3), Some(1.0));
    }

    #[test]
    fn timestamp_source_labels() {
        assert_eq!(TsSources::default().label(), None);
        assert_eq!(TsSources::of(TsSource::HostPoll as u8).label().as_deref(), Some("host_poll"));
        let mixed = TsSources(TsSources::of(2).0 | TsSources::of(1).0);
        assert_eq!(mixed.label().as_deref(), Some("mixed(host_poll+kernel_software)"));
        assert_eq!(TsSources::of(9), TsSources::of(200), "every unknown byte is one source");
        assert_eq!(TsSources::of(9).label().as_deref(), Some("unknown"));
        assert_eq!(ts_code(3), 3);
        let every = TsSources((1 << TS_CODES) - 1);
        assert_eq!(every.label().as_deref(), Some("mixed(nic+host_poll+kernel_software+kernel_hardware+unknown)"));
    }

    #[test]
    fn sla_breaches_are_strictly_above() {
        let sla = Sla { loss_ratio: 0.01, rtt_p99_us: 500.0 };
        assert!(sla.violations(Some(0.01), Some(500_000)).is_empty());
        assert_eq!(sla.violations(Some(0.011), Some(500_001)), vec![Violation::Loss, Violation::RttP99]);
        assert!(sla.violations(None, None).is_empty(), "no figures, no breach");
    }

    #[test]
    fn sla_file_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("sla.toml");
        std::fs::write(&p, "loss_ratio = 0.01\n").expect("write");
        assert_eq!(Sla::from_file(&p).expect("valid"), Sla { loss_ratio: 0.01, rtt_p99_us: 500.0 });
        std::fs::write(&p, "loss_ration = 0.01\n").expect("write");
        assert!(matches!(Sla::from_file(&p), Err(SlaError::Invalid { .. })));
        std::fs::write(&p, "loss_ratio = 5\n").expect("write");
        assert!(matches!(Sla::from_file(&p), Err(SlaError::Invalid { .. })));
        assert!(matches!(Sla::from_file(&dir.path().join("missing.toml")), Err(SlaError::Io { .. })));
    }
}
