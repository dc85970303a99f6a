//! What the switches saw beside each finding: the error, discard, pause and ECN counters of the
//! ports a finding involves, from the Prometheus the operators already scrape their switches
//! into, over the finding's span and the time before it. Each finding is then `corroborated`
//! (a counter moved with it), `silent` (every port has series and none moved: loss that only
//! probing finds), `no_series` (a port involved has no series, nothing moved on the rest) or
//! `no_ports` (the inventory knows none of its ports: `ctl inventory lldp` learns them).
//!
//! The ports come from the inventory: a link's two ends (`a_port`, `b_port`), an RNIC's ToR
//! port (`tor_port`), every port of a ToR or spine. Host and ambiguous findings involve no
//! switch port. Which series hold a port's counters is the counter map's ([`map`]).
//!
//! Moved: the counter's increase during the finding is improbable under its rate before it,
//! and at least twice that rate ([`MIN_RATE_RATIO`]). Given the n events the two spans hold
//! together, under an unchanged rate the finding's span holds a binomial share of them, its
//! share of the time; the Chernoff bound of that binomial tail, exp(-n KL(k/n || share)), must
//! be at most `alpha` over the number of counters the finding tests (Bonferroni). Both spans
//! are measured between the samples that bound them, and increases are summed sample to sample
//! with resets counted from zero, so nothing is extrapolated.
//!
//! A Prometheus that cannot be reached, or refuses a query, is said once, and the findings
//! stand as they were.
//!
//! The same Prometheus often holds the switches' address tables too (snmp_exporter's IP-MIB):
//! [`learn_addresses`] adds them to the inventory before the traces are read, so hops that
//! answer from interface addresses LLDP did not advertise are named.

pub mod map;
pub mod prom;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use rocemesh_formats::inventory::Inventory;
use serde::Serialize;

use crate::localize::{Finding, Localization};
use map::{Counter, CounterMap};
use prom::{Prometheus, Series};

/// What to ask, and where.
#[derive(Debug, Clone)]
pub struct Options {
    pub prometheus: Prometheus,
    pub map: CounterMap,
    /// How far before a finding its counters' usual rate is taken from, s.
    pub before_s: u64,
    /// How far past either end of a span a bounding sample is looked for: at least the
    /// switches' scrape interval, s.
    pub lookback_s: u64,
    /// The false-positive rate a finding's counters are held to together.
    pub alpha: f64,
    /// The analysis window, ns: a finding still holding ends with its last blamed window.
    pub window_ns: u64,
}

/// The verdict on one finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Corroborated,
    Silent,
    NoSeries,
    NoPorts,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Corroborated => "corroborated",
            Verdict::Silent => "silent",
            Verdict::NoSeries => "no_series",
            Verdict::NoPorts => "no_ports",
        }
    }
}

/// One counter of one port: its increase during the finding and before it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CounterMove {
    pub counter: &'static str,
    /// Increase between the samples bounding the finding's span.
    pub during: f64,
    /// Seconds between those samples.
    pub during_s: f64,
    /// Increase over the span before, up to the sample the finding's span starts at.
    pub before: f64,
    pub before_s: f64,
    /// The bound on the chance of so large an increase at the earlier rate (1 when not above it).
    pub p_bound: f64,
    pub moved: bool,
    /// A sample at or after the span's end bounds it (else the span judged was cut short: the
    /// scrape past the end had not been stored when asked).
    #[serde(skip)]
    pub reaches_end: bool,
}

/// One port a finding involves and what its counters did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortCounters {
    pub switch: String,
    pub port: String,
    /// The counters judged: those with samples bounding both spans.
    pub counters: Vec<CounterMove>,
    /// Counters with a series for this port but without samples bounding the spans (its
    /// scrapes stopped, or began during the finding): not judged.
    pub without_samples: Vec<&'static str>,
}

/// The switch-side evidence of one finding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FindingCounters {
    pub verdict: Verdict,
    /// Every port involved, with series or not (a port without series has no counters).
    pub ports: Vec<PortCounters>,
    /// Ends of the finding whose port the inventory does not know.
    pub without_port: Vec<String>,
}

impl FindingCounters {
    /// Every port has series, and each counter a sample at or after the span's end: asking
    /// again later would not change the answer.
    pub fn settled(&self) -> bool {
        self.ports
            .iter()
            .all(|p| !p.counters.is_empty() && p.without_samples.is_empty() && p.counters.iter().all(|c| c.reaches_end))
    }

    /// One line for the findings table.
    pub fn line(&self) -> String {
        let mut parts = Vec::new();
        for p in &self.ports {
            if p.counters.is_empty() {
                let why = match p.without_samples.is_empty() {
                    true => "no series".to_string(),
                    false => format!("no samples bounding the spans for {}", p.without_samples.join(", ")),
                };
                parts.push(format!("{} {}: {why}", p.switch, p.port));
                continue;
            }
            let said = |c: &CounterMove| {
                format!(
                    "{} +{} in {:.0} s ({} in {:.0} s before)",
                    c.counter, c.during, c.during_s, c.before, c.before_s
                )
            };
            // The counters that moved; else how many stayed at their usual rate, and the largest.
            let moved: Vec<String> = p.counters.iter().filter(|c| c.moved).map(said).collect();
            let largest = p.counters.iter().max_by(|a, b| a.during.total_cmp(&b.during));
            let shown = match (moved.is_empty(), largest) {
                (false, _) | (true, None) => moved.join(", "),
                (true, Some(c)) => {
                    format!("{} counters at their usual rate, the largest {}", p.counters.len(), said(c))
                }
            };
            parts.push(format!("{} {}: {shown}", p.switch, p.port));
        }
        if !self.without_port.is_empty() {
            parts.push(format!("port unknown: {} (ctl inventory lldp learns it)", self.without_port.join(", ")));
        }
        format!("switches {}: {}", self.verdict.name(), parts.join("; "))
    }
}

/// The run's switch-side evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchCounters {
    pub prometheus: String,
    pub counter_map: String,
    /// Why there is none, when Prometheus could not be asked.
    pub error: Option<String>,
    pub alpha: f64,
    pub before_s: u64,
    /// Findings by verdict.
    pub verdicts: BTreeMap<&'static str, u64>,
    /// One per finding, in the findings' order; `None` for a finding without switch ports
    /// (host, ambiguous) or when Prometheus could not be asked.
    #[serde(skip)]
    pub per_finding: Vec<Option<FindingCounters>>,
}

/// What [`learn_addresses`] found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AddressesLearned {
    /// Addresses added to an inventory switch.
    pub added: usize,
    /// Addresses given for two switches, or for another switch than the inventory lists them
    /// under: not taken.
    pub conflicting: Vec<String>,
    /// Series whose switch label names no inventory switch, or whose address does not parse.
    pub ignored: usize,
}

/// Adds to `inv`'s switches the addresses the counter map's address series give them: one
/// series listing per address series (every switch, all the time Prometheus holds, so data
/// from any day is named). An address the inventory lists under another switch, or that two
/// switches claim (one re-addressed within the retention, say), is not taken.
pub fn learn_addresses(inv: &mut Inventory, opts: &Options) -> Result<AddressesLearned, prom::PromError> {
    let switches = Switches::of(inv);
    let mut claims: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    let mut out = AddressesLearned::default();
    for (selector, label) in &opts.map.addresses {
        for labels in opts.prometheus.series(&selector.to_string())? {
            let switch = labels.get(&opts.map.switch_label).and_then(|v| switches.named(v));
            // Every switch lists its loopback, link-local and reserved addresses (SONiC's
            // docker bridge is 240.127.1.1): no hop answers from them across the fabric.
            let addr = labels.get(label).and_then(|a| a.parse::<IpAddr>().ok()).filter(|a| routable(*a));
            match (switch, addr) {
                (Some(s), Some(a)) => {
                    let owners = claims.entry(a).or_default();
                    if !owners.iter().any(|o| o == s) {
                        owners.push(s.to_string());
                    }
                }
                _ => out.ignored += 1,
            }
        }
    }
    let listed: HashMap<IpAddr, &str> =
        switches.addrs.iter().flat_map(|(n, addrs)| addrs.iter().map(move |a| (*a, n.as_str()))).collect();
    let mut adds: Vec<(String, IpAddr)> = Vec::new();
    for (addr, owners) in claims {
        match (&owners[..], listed.get(&addr)) {
            ([one], Some(l)) if one == l => {}
            ([one], None) => adds.push((one.clone(), addr)),
            ([one], Some(l)) => out.conflicting.push(format!("{addr} ({one}; the inventory lists it under {l})")),
            _ => out.conflicting.push(format!("{addr} ({})", owners.join(", "))),
        }
    }
    for (name, addr) in adds {
        let addrs = match inv.tors.iter_mut().find(|t| t.name == name) {
            Some(t) => &mut t.addrs,
            None => match inv.spines.iter_mut().find(|s| s.name == name) {
                Some(s) => &mut s.addrs,
                None => continue,
            },
        };
        addrs.push(addr);
        out.added += 1;
    }
    Ok(out)
}

/// An address a trace hop could answer from across the fabric.
fn routable(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.octets()[0] >= 240)
        }
        IpAddr::V6(v6) => !(v6.is_loopback() || v6.is_unspecified() || v6.is_multicast() || v6.is_unicast_link_local()),
    }
}

/// The run's switch evidence when Prometheus could not be asked at all (`error`): no finding
/// carries any.
pub fn unasked(l: &Localization, opts: &Options, error: String) -> SwitchCounters {
    SwitchCounters { error: Some(error), ..SwitchCounters::none_yet(l, opts) }
}

impl SwitchCounters {
    /// What `opts` asks, with no finding answered yet.
    fn none_yet(l: &Localization, opts: &Options) -> SwitchCounters {
        SwitchCounters {
            prometheus: opts.prometheus.url().to_string(),
            counter_map: opts.map.name.clone(),
            error: None,
            alpha: opts.alpha,
            before_s: opts.before_s,
            verdicts: BTreeMap::new(),
            per_finding: vec![None; l.findings.len()],
        }
    }
}

/// Asks Prometheus about every finding of `l`.
pub fn enrich(l: &Localization, inv: &Inventory, opts: &Options) -> SwitchCounters {
    let mut out = SwitchCounters::none_yet(l, opts);
    let switches = Switches::of(inv);
    // The end of the last window each entity was blamed in, in one pass over the blamed.
    let mut last_blamed: HashMap<(&str, &str), u64> = HashMap::new();
    for b in &l.blamed {
        let end = last_blamed.entry((b.kind.as_str(), b.entity.as_str())).or_default();
        *end = (*end).max(b.window_start_ns + opts.window_ns);
    }
    for (i, f) in l.findings.iter().enumerate() {
        let Some(inv_of) = involved(&f.kind, &f.entity, inv) else { continue };
        let span = span_of(f, last_blamed.get(&(f.kind.as_str(), f.entity.as_str())).copied(), opts.window_ns);
        match finding_counters(inv_of, span, &switches, opts) {
            Ok(fc) => {
                *out.verdicts.entry(fc.verdict.name()).or_default() += 1;
                out.per_finding[i] = Some(fc);
            }
            Err(e) => {
                out.error = Some(e.to_string());
                out.verdicts.clear();
                out.per_finding = vec![None; l.findings.len()];
                break;
            }
        }
    }
    out
}

/// The switch ports a finding involves, as (switch, port), and the ends whose port the
/// inventory lacks.
#[derive(Debug, Default)]
struct Involved {
    ports: Vec<(String, String)>,
    without_port: Vec<String>,
}

/// Whether a finding of `kind` involves switch ports (a host or an ambiguous one does not).
pub fn involves_ports(kind: &str) -> bool {
    matches!(kind, "link" | "rnic" | "tor" | "spine")
}

/// What a finding of `kind` on `entity` involves; `None` when its kind involves no switch port.
fn involved(kind: &str, entity: &str, inv: &Inventory) -> Option<Involved> {
    if !involves_ports(kind) {
        return None;
    }
    let (mut ports, mut without) = (Vec::new(), Vec::new());
    let mut end = |switch: &str, port: Option<&str>, what: String| match port {
        Some(p) => ports.push((switch.to_string(), p.to_string())),
        None => without.push(what),
    };
    match kind {
        "link" => {
            let (tor, spine) = entity.split_once('|')?;
            let link = inv.links.iter().find(|l| (l.a == tor && l.b == spine) || (l.a == spine && l.b == tor));
            for node in [tor, spine] {
                end(node, link.and_then(|l| l.port_at(node)), format!("{node}'s end"));
            }
        }
        "rnic" => {
            let (host, device) = entity.split_once('/')?;
            let rnic = inv.hosts.iter().filter(|h| h.name == host).flat_map(|h| &h.rnics).find(|r| r.device == device);
            match rnic {
                Some(r) => end(&r.tor, r.tor_port.as_deref(), format!("{}'s port for {entity}", r.tor)),
                None => end("", None, format!("the ToR port of {entity} (not in the inventory)")),
            }
        }
        "tor" | "spine" => {
            let node = entity;
            for l in inv.links.iter().filter(|l| l.a == node || l.b == node) {
                let other = if l.a == node { &l.b } else { &l.a };
                end(node, l.port_at(node), format!("{node}'s port to {other}"));
            }
            if kind == "tor" {
                for (h, r) in
                    inv.hosts.iter().flat_map(|h| h.rnics.iter().map(move |r| (h, r))).filter(|(_, r)| r.tor == node)
                {
                    end(node, r.tor_port.as_deref(), format!("{node}'s port for {}/{}", h.name, r.device));
                }
            }
        }
        _ => return None,
    }
    Some(Involved { ports, without_port: without })
}

/// Asks about one finding at a time, for callers that hold findings of their own (`analyze
/// live`, which asks as its findings open and close).
#[derive(Debug, Clone)]
pub struct Judge {
    inv: Inventory,
    switches: Switches,
    opts: Options,
}

impl Judge {
    pub fn new(inv: Inventory, opts: Options) -> Judge {
        Judge { switches: Switches::of(&inv), inv, opts }
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// What the counters of the ports a finding of `kind` on `entity` involves did over
    /// `span_s` (Unix seconds) and before it; `None` when its kind involves no switch port.
    pub fn finding(
        &self,
        kind: &str,
        entity: &str,
        span_s: (u64, u64),
    ) -> Option<Result<FindingCounters, prom::PromError>> {
        let inv_of = involved(kind, entity, &self.inv)?;
        Some(finding_counters(inv_of, span_s, &self.switches, &self.opts))
    }
}

/// The finding's span, Unix seconds: from its first window to its end, or to `last` (the end
/// of the last window it was blamed in) when it still holds.
fn span_of(f: &Finding, last: Option<u64>, window_ns: u64) -> (u64, u64) {
    let end = f.end_ns.or(last).unwrap_or(f.start_ns + f.windows.max(1) * window_ns);
    (f.start_ns / 1_000_000_000, end.div_ceil(1_000_000_000))
}

/// Every switch's name and addresses, to tell which switch a series' label names.
#[derive(Debug, Clone)]
struct Switches {
    addrs: Vec<(String, Vec<IpAddr>)>,
}

impl Switches {
    fn of(inv: &Inventory) -> Switches {
        let tors = inv.tors.iter().map(|t| (t.name.clone(), t.addrs.clone()));
        Switches { addrs: tors.chain(inv.spines.iter().map(|s| (s.name.clone(), s.addrs.clone()))).collect() }
    }

    /// The switch a label value names: its name (or its name's first DNS label) or one of its
    /// addresses, with or without `:port`.
    fn named(&self, value: &str) -> Option<&str> {
        let host = match value.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(v6),
            None if value.matches(':').count() == 1 => value.split(':').next().unwrap_or(value),
            None => value,
        };
        let ip = host.parse::<IpAddr>().ok();
        self.addrs
            .iter()
            .find(|(name, addrs)| match ip {
                Some(ip) => addrs.contains(&ip) || host == name.as_str(),
                None => host == name.as_str() || host.strip_prefix(name.as_str()).is_some_and(|r| r.starts_with('.')),
            })
            .map(|(n, _)| n.as_str())
    }

    /// A PromQL regex (RE2, anchored, already escaped for a double-quoted string) matching
    /// every label value [`Switches::named`] maps to one of `names`.
    fn regex(&self, names: &[&str]) -> String {
        let mut alts = Vec::new();
        for (name, addrs) in self.addrs.iter().filter(|(n, _)| names.contains(&n.as_str())) {
            alts.push(format!("{}(\\..*)?(:[0-9]+)?", escape_re(name)));
            for a in addrs {
                match a {
                    IpAddr::V4(_) => alts.push(format!("{}(:[0-9]+)?", escape_re(&a.to_string()))),
                    IpAddr::V6(_) => alts.push(format!("\\[?{}(\\]:[0-9]+|\\])?", escape_re(&a.to_string()))),
                }
            }
        }
        promql_string(&alts.join("|"))
    }
}

fn escape_re(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `s` as the inside of a PromQL double-quoted string.
fn promql_string(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Queries each counter of the map over the ports, and judges them.
fn finding_counters(
    Involved { ports, without_port }: Involved,
    (from_s, to_s): (u64, u64),
    switches: &Switches,
    opts: &Options,
) -> Result<FindingCounters, prom::PromError> {
    let mut per_port: Vec<PortCounters> = ports
        .iter()
        .map(|(s, p)| PortCounters {
            switch: s.clone(),
            port: p.clone(),
            counters: Vec::new(),
            without_samples: Vec::new(),
        })
        .collect();
    if ports.is_empty() {
        return Ok(FindingCounters { verdict: Verdict::NoPorts, ports: per_port, without_port });
    }
    let names: Vec<&str> = ports.iter().map(|(s, _)| s.as_str()).collect();
    let port_alts: Vec<String> = ports.iter().map(|(_, p)| escape_re(p)).collect();
    let before_from_s = from_s.saturating_sub(opts.before_s);
    let at_s = to_s + opts.lookback_s;
    let range_s = at_s - before_from_s.saturating_sub(opts.lookback_s);
    for (counter, selector) in &opts.map.counters {
        let mut matchers: Vec<String> =
            selector.matchers.iter().map(|(k, v)| format!("{k}=\"{}\"", promql_string(v))).collect();
        matchers.push(format!("{}=~\"{}\"", opts.map.switch_label, switches.regex(&names)));
        matchers.push(format!("{}=~\"{}\"", opts.map.port_label, promql_string(&port_alts.join("|"))));
        let query = format!("{}{{{}}}", selector.metric, matchers.join(","));
        for series in opts.prometheus.samples(&query, at_s, range_s)? {
            let Some(switch) = series.labels.get(&opts.map.switch_label).and_then(|v| switches.named(v)) else {
                continue;
            };
            let Some(port) = series.labels.get(&opts.map.port_label) else { continue };
            let Some(pc) = per_port.iter_mut().find(|pc| pc.switch == switch && &pc.port == port) else { continue };
            let name = counter.name();
            if pc.counters.iter().any(|c| c.counter == name) || pc.without_samples.contains(&name) {
                continue;
            }
            match judge(*counter, &series, (before_from_s, from_s, to_s), opts.lookback_s) {
                Some(m) => pc.counters.push(m),
                None => pc.without_samples.push(name),
            }
        }
    }
    let tests = per_port.iter().map(|p| p.counters.len()).sum::<usize>().max(1);
    for c in per_port.iter_mut().flat_map(|p| p.counters.iter_mut()) {
        c.moved =
            c.p_bound <= opts.alpha / tests as f64 && c.during >= MIN_RATE_RATIO * c.before * c.during_s / c.before_s;
    }
    let moved = per_port.iter().any(|p| p.counters.iter().any(|c| c.moved));
    let bare =
        per_port.iter().any(|p| p.counters.is_empty() || !p.without_samples.is_empty()) || !without_port.is_empty();
    let verdict = match (moved, bare) {
        (true, _) => Verdict::Corroborated,
        (false, false) => Verdict::Silent,
        (false, true) => Verdict::NoSeries,
    };
    Ok(FindingCounters { verdict, ports: per_port, without_port })
}

/// The counter's increase during [from, to] and over [before_from, from], each between the
/// samples that bound it (within `lookback_s`; the span before ends at the sample the finding's
/// starts at, so no increase counts in both), and the bound on the chance of that increase
/// during at the rate before. `None` when samples do not bound both spans: it cannot be judged.
fn judge(
    counter: Counter,
    s: &Series,
    (before_from, from, to): (u64, u64, u64),
    lookback_s: u64,
) -> Option<CounterMove> {
    let lookback = lookback_s as f64;
    let (during, during_s, start) = increase(&s.samples, from as f64, to as f64, lookback)?;
    let (before, before_s, _) = increase(&s.samples, before_from as f64, start, lookback)?;
    Some(CounterMove {
        counter: counter.name(),
        during,
        during_s,
        before,
        before_s,
        p_bound: rate_excess_bound(during, during_s, before, before_s),
        moved: false,
        reaches_end: start + during_s >= to as f64,
    })
}

/// Congestion counters (ECN marks, pause frames, discards on a busy port) come in bursts, far
/// from the even rate the binomial test assumes, so a rise it finds significant may be their
/// usual burstiness: a counter moves with a finding only when its rate at least doubled too.
const MIN_RATE_RATIO: f64 = 2.0;

/// The increase between the last sample at or before `a` (else the first after it) and the
/// first at or after `b` (else the last before it), the seconds between them and the time of
/// the first; resets count from zero. `None` without two such samples.
fn increase(samples: &[(f64, f64)], a: f64, b: f64, lookback: f64) -> Option<(f64, f64, f64)> {
    let near: Vec<(f64, f64)> =
        samples.iter().copied().filter(|(t, _)| *t >= a - lookback && *t <= b + lookback).collect();
    let start = near.iter().rposition(|(t, _)| *t <= a).or_else(|| near.iter().position(|(t, _)| *t > a && *t < b))?;
    let end = near.iter().position(|(t, _)| *t >= b).or_else(|| near.iter().rposition(|(t, _)| *t < b && *t > a))?;
    if end <= start {
        return None;
    }
    let sum = near[start..=end].windows(2).map(|w| if w[1].1 >= w[0].1 { w[1].1 - w[0].1 } else { w[1].1 }).sum();
    Some((sum, near[end].0 - near[start].0, near[start].0))
}

/// exp(-n KL(k/n || q)), q the finding's share of the time and n the events of both spans: a
/// bound on P(X >= k) for X ~ Binomial(n, q), the finding's share of them at an unchanged rate.
/// 1 when k is not above its share.
fn rate_excess_bound(k: f64, k_s: f64, b: f64, b_s: f64) -> f64 {
    let n = k + b;
    let q = k_s / (k_s + b_s);
    if n <= 0.0 || k / n <= q {
        return 1.0;
    }
    let r = k / n;
    let term = |x: f64, y: f64| if x <= 0.0 { 0.0 } else { x * (x / y).ln() };
    (-n * (term(r, q) + term(1.0 - r, 1.0 - q))).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increases_are_taken_between_bounding_samples_and_count_resets() {
        let s: Vec<(f64, f64)> = vec![(0.0, 5.0), (15.0, 5.0), (30.0, 9.0), (45.0, 2.0), (60.0, 4.0), (75.0, 4.0)];
        // 15..60: 5 -> 9 (+4), reset to 2 (+2), -> 4 (+2).
        assert_eq!(increase(&s, 20.0, 50.0, 30.0), Some((8.0, 45.0, 15.0)));
        assert_eq!(increase(&s, 0.0, 15.0, 30.0), Some((0.0, 15.0, 0.0)));
        assert_eq!(increase(&s[..1], 0.0, 15.0, 30.0), None);
        assert_eq!(increase(&s, 200.0, 260.0, 30.0), None);
    }

    #[test]
    fn a_counter_moves_only_well_above_its_earlier_rate() {
        // 600 s before, 60 s during: the finding holds 1/11 of the time.
        assert!(rate_excess_bound(0.0, 60.0, 0.0, 600.0) > 0.99);
        assert!(rate_excess_bound(3.0, 60.0, 0.0, 600.0) < 1e-3);
        assert!(rate_excess_bound(2.0, 60.0, 0.0, 600.0) > 1e-3);
        // The same rate throughout: never moved, however large.
        assert!(rate_excess_bound(1000.0, 60.0, 10_000.0, 600.0) > 0.99);
        // Twice the rate over many events: moved.
        assert!(rate_excess_bound(2000.0, 60.0, 10_000.0, 600.0) < 1e-9);
    }

    #[test]
    fn a_label_names_a_switch_by_name_domain_or_address() {
        let sw =
            Switches { addrs: vec![("tor1".into(), vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()])] };
        for v in ["tor1", "tor1:9116", "tor1.dc.example", "10.0.0.1", "10.0.0.1:161", "[fd00::1]:9339", "fd00::1"] {
            assert_eq!(sw.named(v), Some("tor1"), "{v}");
        }
        for v in ["tor10", "tor1x.dc", "10.0.0.10"] {
            assert_eq!(sw.named(v), None, "{v}");
        }
        assert_eq!(
            sw.regex(&["tor1"]),
            "tor1(\\\\..*)?(:[0-9]+)?|10\\\\.0\\\\.0\\\\.1(:[0-9]+)?|\\\\[?fd00::1(\\\\]:[0-9]+|\\\\])?"
        );
    }
}
