//! The trace-vs-kernel check: the spine an agent's path trace found for (source RNIC,
//! destination, flow label) must be the next hop the source ToR's kernel picks for the UDP
//! 5-tuple that label's probes use (`ip route get ... iif h<i> ipproto udp sport S dport D`).
//!
//! A trace names the flow label, not the source port that plays it on UDP (the agent's transport
//! binds its source-port sockets to ports the kernel picks). The port of each label comes from
//! the agent's log when it says it (a line with `flow_label=L` and `source_port=P` or `sport=P`),
//! else from the running agent itself ([`ports_from_proc`]): its sockets on its address, in the
//! order it opened them (file descriptor order), and the label-to-socket assignment of its UDP
//! transport applied to its pinglist ([`label_sockets`]).
//!
//! Agents trace two directions: the forward path of each (target, label) they probe, and, as
//! responders, the path of their answers back to each (prober, label), from their bound port to
//! the prober's port of that label. A record does not say which: an answer path's destination is
//! a `Peer` entry unless the responder also probes the prober, and then it is that RNIC, as a
//! forward trace's is. The label tells them apart ([`direction`]): a forward trace's label is one
//! the source probes the destination with, an answer path's one the destination probes the
//! source with (labels are random 20-bit numbers; a label in both sets is left out).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::Context;
use rocemesh_formats::pinglist::Pinglist;
use rocemesh_formats::record::EndpointRole;
use rocemesh_formats::segment::SegmentReader;
use serde::Serialize;

use super::net::{DEVICE, Fabric, Plan};
use crate::harness::segment_files;

/// One traced inter-ToR path: who traced it, to where, on which label, what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub t_unix_ns: u64,
    /// Source host, as (ToR, index).
    pub src: (u32, u32),
    pub dst: Ipv4Addr,
    pub flow_label: u32,
    /// The answering address of each hop (`None`: no answer, or not an IPv4 address).
    pub hops: Vec<Option<Ipv4Addr>>,
    /// The destination is a `Peer` entry: an answer path for certain.
    pub to_peer: bool,
}

/// Which way a trace went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Source probes destination: from the source's port of the label to the agent port.
    Forward,
    /// Source answers destination's probes: from the agent port to the destination's port of
    /// the label.
    Answer,
}

/// The labels each host probes each address with, from the pinglists.
pub type Labels = BTreeMap<(u32, u32), HashMap<Ipv4Addr, HashSet<u32>>>;

/// The labels of one host's pinglist by target address.
pub fn labels_of(pinglist: &Pinglist) -> HashMap<Ipv4Addr, HashSet<u32>> {
    let mut out: HashMap<Ipv4Addr, HashSet<u32>> = HashMap::new();
    for t in pinglist.targets.iter().filter(|t| t.from == DEVICE) {
        if let std::net::IpAddr::V4(a) = t.addr {
            out.entry(a).or_default().extend(t.flow_labels.iter().copied());
        }
    }
    out
}

/// A trace's direction (see the module docs); `None` when its label does not say.
pub fn direction(labels: &Labels, plan: &Plan, t: &Trace) -> Option<Direction> {
    let probes = |from: (u32, u32), to: Ipv4Addr| {
        labels.get(&from).and_then(|m| m.get(&to)).is_some_and(|l| l.contains(&t.flow_label))
    };
    let forward = !t.to_peer && probes(t.src, t.dst);
    let answer = plan.host_of(t.dst).is_some_and(|d| probes(d, Plan::host_ip(t.src.0, t.src.1)));
    match (forward, answer || t.to_peer) {
        (true, false) => Some(Direction::Forward),
        (false, true) => Some(Direction::Answer),
        _ => None,
    }
}

/// Every path trace under `segments` whose source is a host of `plan` and whose destination
/// (an RNIC or a peer address) is a host under another ToR.
pub fn read_traces(plan: &Plan, segments: &Path) -> anyhow::Result<Vec<Trace>> {
    let mut out = Vec::new();
    for p in segment_files(segments)? {
        let r = SegmentReader::open(&p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        let dict: HashMap<u32, &rocemesh_formats::record::Endpoint> =
            r.dictionary().iter().map(|e| (e.id, e)).collect();
        let v4 = |id: u32| dict.get(&id).and_then(|e| mapped_v4(&e.addr));
        for rec in r.path_records() {
            let (src, dst) = (rec.src.to_native(), rec.dst.to_native());
            let Some(src_e) = dict.get(&src) else { continue };
            let Some(dst_e) = dict.get(&dst) else { continue };
            let to_peer = dst_e.role == EndpointRole::Peer as u8;
            if src_e.role != EndpointRole::Rnic as u8 || !(to_peer || dst_e.role == EndpointRole::Rnic as u8) {
                continue;
            }
            let Some(src_host) = src_e.name.strip_suffix(&format!("/{DEVICE}")).and_then(|h| parse_host(plan, h))
            else {
                continue;
            };
            let Some(dst_ip) = mapped_v4(&dst_e.addr) else { continue };
            if plan.host_of(dst_ip).is_none_or(|(t, _)| t == src_host.0) {
                continue;
            }
            let n = (rec.hop_count.to_native() as usize).min(rec.hops.len());
            out.push(Trace {
                t_unix_ns: rec.t_unix_ns.to_native(),
                src: src_host,
                dst: dst_ip,
                flow_label: rec.flow_label.to_native(),
                hops: rec.hops[..n].iter().map(|h| v4(h.to_native())).collect(),
                to_peer,
            });
        }
    }
    out.sort_by_key(|t| t.t_unix_ns);
    Ok(out)
}

fn mapped_v4(addr: &[u8; 16]) -> Option<Ipv4Addr> {
    match std::net::Ipv6Addr::from(*addr).to_ipv4_mapped() {
        Some(v4) if !v4.is_unspecified() => Some(v4),
        _ => None,
    }
}

/// `tor1-h2` -> (1, 2), if it is a host of `plan`.
pub fn parse_host(plan: &Plan, name: &str) -> Option<(u32, u32)> {
    let (t, h) = name.strip_prefix("tor")?.split_once("-h")?;
    let (t, h) = (t.parse().ok()?, h.parse().ok()?);
    (t < plan.tors && h < plan.hosts_per_tor && Plan::host(t, h) == name).then_some((t, h))
}

/// The spine a trace crossed: the first hop that answered from a spine's address.
pub fn traced_spine(plan: &Plan, t: &Trace) -> Option<String> {
    t.hops.iter().flatten().filter_map(|a| plan.switch_of(*a)).find(|s| s.starts_with("spine"))
}

/// Source port of each flow label, per host, and since when it holds (the agent's start).
#[derive(Debug, Clone, Default)]
pub struct Ports {
    /// host name -> (valid from, ns; label -> port; where it came from)
    pub hosts: BTreeMap<String, HostPorts>,
}

#[derive(Debug, Clone, Default)]
pub struct HostPorts {
    pub since_ns: u64,
    /// The agent was restarted during the run: its peers' answer-path traces to it may be of
    /// its old ports (see [`check`]).
    pub restarted: bool,
    pub by_label: HashMap<u32, u16>,
    /// `log` or `proc`.
    pub source: &'static str,
}

/// The UDP transport's plan as the agent logs it at every change: `labels=L:P,L:P,...` on its
/// "flow label source ports (label:port)" lines; a later line of a label wins.
pub fn ports_from_log(log: &str) -> HashMap<u32, u16> {
    let mut out = HashMap::new();
    for line in log.lines().filter(|l| l.contains("flow label source ports")) {
        let Some(plan) = line.split_whitespace().find_map(|w| w.strip_prefix("labels=")) else { continue };
        for pair in plan.split(',') {
            if let Some((l, p)) = pair.split_once(':')
                && let (Ok(l), Ok(p)) = (l.parse::<u32>(), p.parse::<u16>())
            {
                out.insert(l, p);
            }
        }
    }
    out
}

/// The UDP transport's assignment of flow labels to its `k` source-port sockets for the
/// pinglist's targets from `device`, in pinglist order (agent/src/udp.rs, `plan_labels`): a
/// target's labels take consecutive sockets from `first label mod k`, and a label already
/// placed keeps its socket.
pub fn label_sockets(pinglist: &Pinglist, device: &str, k: usize) -> HashMap<u32, usize> {
    let mut out = HashMap::new();
    if k == 0 {
        return out;
    }
    for t in pinglist.targets.iter().filter(|t| t.from == device) {
        let base = t.flow_labels.first().map_or(0, |&l| l as usize % k);
        for (i, &label) in t.flow_labels.iter().enumerate() {
            out.entry(label).or_insert((base + i) % k);
        }
    }
    out
}

/// Local (address, port) by socket inode, from `/proc/<pid>/net/udp` text.
pub fn udp_sockets(proc_net_udp: &str) -> HashMap<u64, (Ipv4Addr, u16)> {
    proc_net_udp
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (addr, port) = f.get(1)?.split_once(':')?;
            let ip = Ipv4Addr::from(u32::from_str_radix(addr, 16).ok()?.swap_bytes());
            let port = u16::from_str_radix(port, 16).ok()?;
            Some((f.get(9)?.parse().ok()?, (ip, port)))
        })
        .collect()
}

/// The ports of the source-port sockets of the agent `pid` bound to `ip` (every UDP socket on
/// `ip` but the one on `bound_port`), in the order it opened them.
pub fn source_port_sockets(pid: u32, ip: Ipv4Addr, bound_port: u16) -> anyhow::Result<Vec<u16>> {
    let udp = std::fs::read_to_string(format!("/proc/{pid}/net/udp")).context("reading the agent's /proc/net/udp")?;
    let by_inode = udp_sockets(&udp);
    let mut fds = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).context("listing the agent's fds")? {
        let e = e?;
        let Ok(fd) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(link) = std::fs::read_link(e.path()) else { continue };
        let link = link.to_string_lossy().into_owned();
        let Some(inode) = link.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) else { continue };
        if let Some(&(a, port)) = inode.parse::<u64>().ok().and_then(|i| by_inode.get(&i))
            && a == ip
            && port != bound_port
        {
            fds.push((fd, port));
        }
    }
    fds.sort_unstable();
    Ok(fds.into_iter().map(|(_, p)| p).collect())
}

/// Label -> port of the running agent `pid` of host (t, h), from /proc and its pinglist.
pub fn ports_from_proc(
    pid: u32,
    t: u32,
    h: u32,
    pinglist: &Pinglist,
    bound_port: u16,
) -> anyhow::Result<HashMap<u32, u16>> {
    let ports = source_port_sockets(pid, Plan::host_ip(t, h), bound_port)?;
    let sockets = label_sockets(pinglist, DEVICE, ports.len());
    Ok(sockets.into_iter().filter_map(|(l, i)| Some((l, *ports.get(i)?))).collect())
}

/// The outcome of the check.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TraceCheck {
    /// Forward inter-ToR traces read.
    pub traces: usize,
    /// Distinct (source, destination, label) among them.
    pub tuples: usize,
    /// Tuples checked against the kernel.
    pub sampled: usize,
    pub agree: usize,
    pub disagree: Vec<String>,
    /// Sampled tuples by direction.
    pub forward: usize,
    pub answer: usize,
    /// Tuples left out: direction unknown (label in both hosts' sets), no spine hop answered,
    /// or no known source port for the label.
    pub no_direction: usize,
    pub no_spine: usize,
    pub no_port: usize,
    /// Answer paths to a prober that was restarted: left out, a responder keeps re-tracing the
    /// path to the old process's ports and the record does not say which port it traced.
    pub prober_restarted: usize,
    /// Sampled traces whose destination ToR answered from its uplink to the same spine
    /// (`icmp_errors_use_inbound_ifaddr`: the link it came in over), of those where it answered.
    pub dst_tor_same_spine: usize,
    pub dst_tor_answered: usize,
    /// The same tuples with the label's port changed (lowest bit flipped): how often the kernel
    /// still picks the traced spine. Near 1/spines, or the check could not tell right ports
    /// from wrong ones.
    pub control_agree: usize,
    /// Where the ports came from: hosts by source.
    pub port_sources: BTreeMap<String, String>,
}

impl TraceCheck {
    /// Every sampled tuple agrees, and a wrong port would not have (the control stays below
    /// 90 %: with 2 spines it is about half).
    pub fn passed(&self) -> bool {
        self.sampled > 0 && self.disagree.is_empty() && (self.control_agree as f64) < 0.9 * self.sampled as f64
    }

    pub fn summary(&self) -> String {
        format!(
            "{}/{} sampled tuples agree ({} forward, {} answer paths; {} traces, {} distinct tuples; left out: {} of \
             unknown direction, {} without a spine hop, {} without a known port, {} answer paths to a restarted prober); \
             destination ToR answered over the \
             traced spine {}/{}; control (a wrong port): {}/{} agree{}",
            self.agree,
            self.sampled,
            self.forward,
            self.answer,
            self.traces,
            self.tuples,
            self.no_direction,
            self.no_spine,
            self.no_port,
            self.prober_restarted,
            self.dst_tor_same_spine,
            self.dst_tor_answered,
            self.control_agree,
            self.sampled,
            if self.disagree.is_empty() { String::new() } else { format!("; disagree: {}", self.disagree.join("; ")) }
        )
    }
}

/// Compares up to `max_samples` distinct (source, destination, label) tuples (the latest trace of
/// each, spread evenly over them) with the kernel's choice at the source's ToR.
pub fn check(
    fabric: &Fabric,
    traces: &[Trace],
    labels: &Labels,
    ports: &Ports,
    agent_port: u16,
    max_samples: usize,
) -> anyhow::Result<TraceCheck> {
    let plan = &fabric.plan;
    let mut c = TraceCheck { traces: traces.len(), ..TraceCheck::default() };
    for (h, p) in &ports.hosts {
        c.port_sources.insert(h.clone(), format!("{} ({} labels)", p.source, p.by_label.len()));
    }
    let mut latest: BTreeMap<((u32, u32), Ipv4Addr, u32), &Trace> = BTreeMap::new();
    for t in traces {
        latest.insert((t.src, t.dst, t.flow_label), t);
    }
    c.tuples = latest.len();
    let all: Vec<&Trace> = latest.values().copied().collect();
    let step = (all.len() / max_samples.max(1)).max(1);
    for t in all.iter().step_by(step).take(max_samples) {
        let Some(dir) = direction(labels, plan, t) else {
            c.no_direction += 1;
            continue;
        };
        let Some(spine) = traced_spine(plan, t) else {
            c.no_spine += 1;
            continue;
        };
        // Whose port plays the label: the source's (forward) or the prober's (answer path).
        let prober = match dir {
            Direction::Forward => Some(t.src),
            Direction::Answer => plan.host_of(t.dst),
        };
        let prober_ports = prober.and_then(|(pt, ph)| ports.hosts.get(&Plan::host(pt, ph)));
        if dir == Direction::Answer && prober_ports.is_some_and(|p| p.restarted) {
            c.prober_restarted += 1;
            continue;
        }
        let port = prober_ports.and_then(|p| {
            if t.t_unix_ns < p.since_ns {
                return None;
            }
            p.by_label.get(&t.flow_label).copied()
        });
        let Some(port) = port else {
            c.no_port += 1;
            continue;
        };
        let (sport, dport) = match dir {
            Direction::Forward => (port, agent_port),
            Direction::Answer => (agent_port, port),
        };
        c.sampled += 1;
        match dir {
            Direction::Forward => c.forward += 1,
            Direction::Answer => c.answer += 1,
        }
        let route = fabric.route_get(t.src.0, t.src.1, t.dst, sport, dport)?;
        let kernel = route.via.and_then(|v| plan.switch_of(v));
        let (csport, cdport) = match dir {
            Direction::Forward => (sport ^ 1, dport),
            Direction::Answer => (sport, dport ^ 1),
        };
        let control = fabric.route_get(t.src.0, t.src.1, t.dst, csport, cdport)?;
        if control.via.and_then(|v| plan.switch_of(v)).as_deref() == Some(spine.as_str()) {
            c.control_agree += 1;
        }
        if kernel.as_deref() == Some(spine.as_str()) {
            c.agree += 1;
        } else {
            c.disagree.push(format!(
                "{} -> {} label {} ({dir:?}, sport {sport} dport {dport}): traced {spine}, kernel {route:?}",
                Plan::host(t.src.0, t.src.1),
                t.dst,
                t.flow_label
            ));
        }
        // The destination ToR's answer: from the uplink the trace came in over.
        if let Some((dt, _)) = plan.host_of(t.dst)
            && let Some(a) = t.hops.iter().flatten().find(|a| plan.switch_of(**a) == Some(Plan::tor(dt)))
        {
            c.dst_tor_answered += 1;
            let [x, _, s, _] = a.octets();
            if x == 172 && Plan::spine(u32::from(s)) == spine {
                c.dst_tor_same_spine += 1;
            }
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_read_from_log_lines() {
        let log = "2026-01-01T00:00:00Z  INFO rocemesh_agent::udp: flow label source ports (label:port) local=10.0.0.1:18600 labels=17:40001,18:40009\n\
                   2026-01-01T00:00:01Z  INFO rocemesh_agent::udp: flow label source ports (label:port) local=10.0.0.1:18600 labels=18:40002\n\
                   INFO other: labels=19:1\n";
        let m = ports_from_log(log);
        assert_eq!(m.get(&17), Some(&40001));
        assert_eq!(m.get(&18), Some(&40002), "the later plan wins");
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn labels_take_consecutive_sockets_from_their_first() {
        let text = r#"version = 1
host = "tor0-h0"
generation = 1
generated_unix_ns = 0
timeout_ms = 1000

[[target]]
from = "rnic0"
to = "tor0-h1/rnic0"
kind = "tor_mesh"
addr = "10.0.0.3"
port = 18600
rate_pps = 10.0
flow_labels = [5]

[[target]]
from = "rnic0"
to = "tor1-h0/rnic0"
kind = "inter_tor"
addr = "10.0.1.1"
port = 18600
rate_pps = 5.0
flow_labels = [13, 5, 21, 22]
"#;
        let pl = Pinglist::parse(text, Path::new("p.toml")).unwrap();
        let m = label_sockets(&pl, DEVICE, 8);
        // 5 -> 5 (first target); 13 -> 13 % 8 = 5, 5 kept, 21 -> 7, 22 -> 0.
        assert_eq!((m[&5], m[&13], m[&21], m[&22]), (5, 5, 7, 0));
        assert!(label_sockets(&pl, DEVICE, 0).is_empty());
        assert!(label_sockets(&pl, "rnic1", 8).is_empty());
        // tor0-h0 probes tor1-h0 (10.0.1.1) with 13, 5, 21, 22; tor1-h0 probes it with 22, 40.
        let plan = Plan::new("rmc1", 2, 4, 3).unwrap();
        let mut labels = Labels::new();
        labels.insert((0, 0), labels_of(&pl));
        labels.insert((1, 0), HashMap::from([(Plan::host_ip(0, 0), HashSet::from([22, 40]))]));
        let trace = |src, dst, flow_label, to_peer| Trace { t_unix_ns: 0, src, dst, flow_label, hops: vec![], to_peer };
        let (a, b) = (Plan::host_ip(0, 0), Plan::host_ip(1, 0));
        assert_eq!(direction(&labels, &plan, &trace((0, 0), b, 13, false)), Some(Direction::Forward));
        assert_eq!(direction(&labels, &plan, &trace((1, 0), a, 13, false)), Some(Direction::Answer));
        assert_eq!(direction(&labels, &plan, &trace((1, 0), a, 40, false)), Some(Direction::Forward));
        assert_eq!(direction(&labels, &plan, &trace((1, 0), a, 22, false)), None, "both probe with 22");
        assert_eq!(direction(&labels, &plan, &trace((1, 0), a, 99, true)), Some(Direction::Answer));
        assert_eq!(direction(&labels, &plan, &trace((1, 0), a, 99, false)), None);
    }

    #[test]
    fn proc_net_udp_gives_address_and_port_by_inode() {
        let udp = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                   \x20 123: 0500000A:48A8 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0\n";
        assert_eq!(udp_sockets(udp).get(&4242), Some(&(Ipv4Addr::new(10, 0, 0, 5), 18600)));
    }

    #[test]
    fn the_traced_spine_is_the_first_spine_hop() {
        let plan = Plan::new("rmc1", 2, 4, 3).unwrap();
        let t = Trace {
            t_unix_ns: 0,
            src: (1, 0),
            dst: Plan::host_ip(2, 1),
            flow_label: 9,
            hops: vec![Some(Plan::host_gw(1, 0)), None, Some(Plan::uplink_ip(2, 1))],
            to_peer: false,
        };
        assert_eq!(traced_spine(&plan, &t), None);
        let t = Trace { hops: vec![Some(Plan::host_gw(1, 0)), Some(Plan::downlink_ip(1, 1))], ..t };
        assert_eq!(traced_spine(&plan, &t).as_deref(), Some("spine1"));
        assert_eq!(parse_host(&plan, "tor3-h2"), Some((3, 2)));
        assert_eq!(parse_host(&plan, "tor4-h0"), None);
        assert_eq!(parse_host(&plan, "tor01-h0"), None);
    }
}

/// How soon after loss appeared on a traced (prober, target, label) its prober traced it again.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RetraceAfterLoss {
    /// (prober, target, label) keys with a lost probe inside the window.
    pub lossy_paths: usize,
    /// Of those, how many were traced again after their first loss in the window.
    pub retraced: usize,
    /// From the first lost probe's send time to the start of the next trace, ms (sorted).
    pub delays_ms: Vec<u64>,
}

impl RetraceAfterLoss {
    fn quantile(&self, q: f64) -> u64 {
        let n = self.delays_ms.len();
        if n == 0 { 0 } else { self.delays_ms[((n - 1) as f64 * q).round() as usize] }
    }

    /// One line: counts, median, p90 and max.
    pub fn summary(&self) -> String {
        format!(
            "{}/{} lossy inter-ToR (prober, target, label) paths traced again after their first loss; \
             first loss to new trace: median {} ms, p90 {} ms, max {} ms",
            self.retraced,
            self.lossy_paths,
            self.quantile(0.5),
            self.quantile(0.9),
            self.delays_ms.last().copied().unwrap_or(0)
        )
    }
}

/// [`RetraceAfterLoss`] for the inter-ToR probes sent in `[from_ns, to_ns)`, from the agents'
/// own records: their lost probes and their path records, matched by dictionary names.
pub fn retrace_after_loss(segments: &Path, from_ns: u64, to_ns: u64) -> anyhow::Result<RetraceAfterLoss> {
    use rocemesh_formats::record::Outcome;
    let inter = rocemesh_formats::pinglist::ProbeKind::InterTor.as_u8();
    let mut first_loss: HashMap<(String, String, u32), u64> = HashMap::new();
    let mut traced: HashMap<(String, String, u32), Vec<u64>> = HashMap::new();
    for f in segment_files(segments)? {
        let r = SegmentReader::open(&f).with_context(|| format!("reading {}", f.display()))?;
        let dict = r.dictionary();
        let name = |id: u32| dict.get(id as usize).map(|e| e.name.clone()).unwrap_or_default();
        for c in r.probe_chunks() {
            for i in 0..c.len() {
                let p = c.row(i);
                if p.kind == inter && p.outcome == Outcome::Lost as u8 && (from_ns..to_ns).contains(&p.t1_unix_ns) {
                    let t = first_loss.entry((name(p.prober), name(p.target), p.flow_label)).or_insert(u64::MAX);
                    *t = (*t).min(p.t1_unix_ns);
                }
            }
        }
        for p in r.path_records() {
            let key = (name(p.src.to_native()), name(p.dst.to_native()), p.flow_label.to_native());
            traced.entry(key).or_default().push(p.t_unix_ns.to_native());
        }
    }
    let mut out = RetraceAfterLoss { lossy_paths: first_loss.len(), ..RetraceAfterLoss::default() };
    for (key, loss) in &first_loss {
        if let Some(t) = traced.get(key).and_then(|v| v.iter().filter(|&&t| t >= *loss).min()) {
            out.retraced += 1;
            out.delays_ms.push((t - loss) / 1_000_000);
        }
    }
    out.delays_ms.sort_unstable();
    Ok(out)
}
