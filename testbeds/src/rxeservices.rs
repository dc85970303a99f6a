//! The service-tracing part of the rxe lab (issue 16): what the agents' eBPF tracers must have
//! seen and done with two real perftest RC connections and a connection storm, checked from the
//! agents' logs, their segments and `analyze localize`'s `services` section.
//!
//! Connection A (tor1-h1 -> tor0-h0) crosses tor1's uplink, which the lab makes lossy while A
//! runs; connection B (tor2-h1 -> tor0-h1) does not. Both ends of each are traced (both QPs
//! reach RTR), so each connection gives two service targets.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use rocemesh_formats::pinglist::ProbeKind;
use rocemesh_formats::record::{EndpointRole, Outcome};
use rocemesh_formats::segment::SegmentReader;
use serde::Serialize;

use crate::harness::Check;

/// The command the connections run (perftest's `ib_write_bw`), as the tracer reports it (`comm`).
pub const COMM: &str = "ib_write_bw";

/// One traced connection end, as its agent logged it.
#[derive(Debug, Clone, Serialize)]
pub struct Discovery {
    pub host: String,
    pub service: String,
    pub delay_ms: f64,
}

/// A "service target removed" line: (host, local QPN).
pub type Removal = (String, String);

/// Every "service target added" and "removed" line of the agents' logs under `dir`
/// (`<host>.log`).
pub fn discoveries(dir: &Path) -> anyhow::Result<(Vec<Discovery>, Vec<Removal>)> {
    let mut added = Vec::new();
    let mut removed = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let p = e?.path();
        let Some(host) = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".log")) else {
            continue;
        };
        let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        for line in text.lines() {
            if line.contains("service target added") {
                let service = between(line, "service=", " flow_label=").unwrap_or_default().to_string();
                let delay_ms = between(line, "discovery_delay_ms=", " ")
                    .or_else(|| line.split("discovery_delay_ms=").nth(1))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(f64::INFINITY);
                added.push(Discovery { host: host.to_string(), service, delay_ms });
            } else if line.contains("service target removed") {
                let qpn = between(line, "local_qpn=", " ").unwrap_or_default().to_string();
                removed.push((host.to_string(), qpn));
            }
        }
    }
    Ok((added, removed))
}

fn between<'a>(line: &'a str, from: &str, to: &str) -> Option<&'a str> {
    let rest = &line[line.find(from)? + from.len()..];
    Some(&rest[..rest.find(to).unwrap_or(rest.len())])
}

/// Service probes of one connection end, from the segments.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Probed {
    pub prober: String,
    pub name: String,
    pub flow_label: u32,
    pub local_qpn: u32,
    pub probes: u64,
    pub ok: u64,
    /// Probes whose flow label was not the connection's.
    pub other_label: u64,
    pub last_t1_ns: u64,
}

/// Service probes under `dir`, by dictionary name.
pub fn probed(dir: &Path) -> anyhow::Result<BTreeMap<String, Probed>> {
    let mut out: BTreeMap<String, Probed> = BTreeMap::new();
    for p in crate::harness::segment_files(dir)? {
        let r = SegmentReader::open(&p).map_err(|e| anyhow::anyhow!("{e}"))?;
        let dict = r.dictionary();
        for c in r.probe_chunks() {
            for i in 0..c.len() {
                let row = c.row(i);
                if row.kind != ProbeKind::Service.as_u8() {
                    continue;
                }
                let Some(e) = dict.get(row.target as usize) else { continue };
                let Some(conn) = e.service.as_ref().filter(|_| e.role == EndpointRole::Service as u8) else {
                    continue;
                };
                let s = out.entry(e.name.clone()).or_insert_with(|| Probed {
                    prober: dict.get(row.prober as usize).map(|p| p.name.clone()).unwrap_or_default(),
                    name: e.name.clone(),
                    flow_label: conn.flow_label,
                    local_qpn: conn.local_qpn,
                    ..Probed::default()
                });
                s.probes += 1;
                s.ok += u64::from(row.outcome == Outcome::Ok as u8);
                s.other_label += u64::from(row.flow_label != conn.flow_label);
                s.last_t1_ns = s.last_t1_ns.max(row.t1_unix_ns);
            }
        }
    }
    Ok(out)
}

/// The checks of the two perftest connections. `ended_ns`: when both perftest pairs had exited.
pub fn connection_checks(
    agents_dir: &Path,
    segments: &Path,
    findings: &serde_json::Value,
    lossy_link: &str,
    ended_ns: u64,
) -> anyhow::Result<Vec<Check>> {
    let (added, removed) = discoveries(agents_dir)?;
    let ours: Vec<&Discovery> = added.iter().filter(|d| d.service.contains(&format!("({COMM}["))).collect();
    let mut checks = Vec::new();
    let slow: Vec<String> =
        ours.iter().filter(|d| d.delay_ms >= 1_000.0).map(|d| format!("{} {:.0} ms", d.host, d.delay_ms)).collect();
    let delays: Vec<String> = ours.iter().map(|d| format!("{} {:.1} ms", d.host, d.delay_ms)).collect();
    // An end that was not discovered: what its agent's tracer and shard said, so that a failure
    // in CI (where only this line is kept) tells which step lost it.
    let missing: Vec<String> = ENDS
        .iter()
        .filter(|h| !ours.iter().any(|d| d.host == **h))
        .map(|h| format!("{h} [{}]", why_missing(&agents_dir.join(format!("{h}.log")))))
        .collect();
    checks.push(Check {
        name: "services: discovered < 1 s".into(),
        // Both ends of both connections.
        ok: ours.len() >= 4 && slow.is_empty(),
        detail: format!(
            "{} connection ends: {}{}",
            ours.len(),
            delays.join(", "),
            if missing.is_empty() { String::new() } else { format!("; missing: {}", missing.join("; ")) }
        ),
    });
    let probed = probed(segments)?;
    let mine: Vec<&Probed> = probed.values().filter(|p| p.name.contains(&format!("({COMM}["))).collect();
    let label_ok = mine.len() >= 4 && mine.iter().all(|p| p.ok > 0 && p.other_label == 0 && p.flow_label != 0);
    checks.push(Check {
        name: "services: probed on their labels".into(),
        ok: label_ok,
        detail: mine
            .iter()
            .map(|p| {
                format!("{} label {:#x}: {}/{} ok, {} other", p.prober, p.flow_label, p.ok, p.probes, p.other_label)
            })
            .collect::<Vec<_>>()
            .join("; "),
    });
    // Ended: each end's agent logged the removal, and nothing was probed a few seconds after.
    let late: Vec<String> = mine
        .iter()
        .filter(|p| p.last_t1_ns > ended_ns + 3_000_000_000)
        .map(|p| format!("{} {:.1} s after perftest ended", p.prober, (p.last_t1_ns - ended_ns) as f64 / 1e9))
        .collect();
    let removals = mine
        .iter()
        .filter(|p| {
            let host = p.prober.split('/').next().unwrap_or("");
            removed.iter().any(|(h, q)| h == host && q == &p.local_qpn.to_string())
        })
        .count();
    checks.push(Check {
        name: "services: dropped at exit".into(),
        ok: !mine.is_empty() && removals == mine.len() && late.is_empty(),
        detail: format!("{removals}/{} removals logged; probed late: {}", mine.len(), late.join(", ")),
    });
    // Impact: the connection across the lossy uplink is affected by that finding, hurt (grade
    // high) and ranked above the other, which the uplink fault does not touch and which was not
    // hurt. Another finding on B's hosts (the host finding the RNIC-kill phase leaves on
    // tor0-h1 while B starts) may still be on its path: that is exposure, listed in the detail.
    let services = findings["services"].as_array().cloned().unwrap_or_default();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for s in services.iter().filter(|s| s["comm"].as_str() == Some(COMM)) {
        let prober = s["prober"].as_str().unwrap_or("");
        let on_a = prober.starts_with("tor1-h1/") || prober.starts_with("tor0-h0/");
        let by: Vec<String> = s["affected_by"]
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|f| format!("{} {}", f["kind"].as_str().unwrap_or("?"), f["entity"].as_str().unwrap_or("?")))
                    .collect()
            })
            .unwrap_or_default();
        let rank = s["rank"].as_u64().unwrap_or(u64::MAX);
        let line =
            (rank, format!("{prober} grade {} rank {rank} affected_by {by:?}", s["grade"].as_str().unwrap_or("?")));
        let hit = by.iter().any(|f| f.ends_with(&format!(" {lossy_link}")));
        let grade = s["grade"].as_str().unwrap_or("?");
        if on_a {
            a.push((hit && grade == "high", line));
        } else {
            b.push((!hit && grade != "high", line));
        }
    }
    let a_worst_rank = a.iter().map(|x| x.1.0).max().unwrap_or(u64::MAX);
    let b_best_rank = b.iter().map(|x| x.1.0).min().unwrap_or(0);
    checks.push(Check {
        name: "services: impact".into(),
        ok: a.len() == 2 && b.len() == 2 && a.iter().chain(&b).all(|x| x.0) && a_worst_rank < b_best_rank,
        detail: format!(
            "across {lossy_link}: {:?}; not across it: {:?}",
            a.iter().map(|x| &x.1.1).collect::<Vec<_>>(),
            b.iter().map(|x| &x.1.1).collect::<Vec<_>>()
        ),
    });
    Ok(checks)
}

/// The hosts at the ends of connections A and B.
const ENDS: [&str; 4] = ["tor0-h0", "tor1-h1", "tor0-h1", "tor2-h1"];

/// An agent's own account of a connection end it did not add: its tracer's start (or why it is
/// off), the tracer stats line with the most events, and every line about a service target
/// refused or without an address or from the service tracer's error log.
fn why_missing(log: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(log) else { return format!("no log {}", log.display()) };
    let mut out: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("service tracing")
                || l.contains("service target refused")
                || l.contains("service target has no address")
                || l.contains("scope=service-tracer")
        })
        .take(8)
        .collect();
    // The first stats lines at which the tracer's event count moved (before the storm's).
    let mut last_events = 0;
    let moved: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("service tracer stats"))
        .filter(|l| {
            let events = between(l, " events=", " ").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let moved = events != last_events;
            last_events = events;
            moved
        })
        .take(2)
        .collect();
    out.extend(moved);
    out.iter()
        .map(|l| l.split_once(" INFO ").or_else(|| l.split_once(" WARN ")).map_or(*l, |x| x.1))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// What the storm did to one agent.
#[derive(Debug, Clone, Serialize)]
pub struct StormResult {
    pub host: String,
    pub qps: u32,
    pub seconds: f64,
    pub rss_kib_before: u64,
    pub rss_kib_after: u64,
    /// The agent's service counters after the storm (its last stats line).
    pub services_added: u64,
    pub services_refused_rate: u64,
    /// The most service targets the agent probed at once (its `services_peak`).
    pub services_active_max: u64,
    /// Its probes per second in the storm window and in the clean phase.
    pub probes_per_s_storm: f64,
    pub probes_per_s_clean: f64,
}

/// Resident memory of a process, KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("{path} has no readable VmRSS line"))
}

/// The largest value of `key=` in the agent's "shard stats" lines.
pub fn max_stat(log: &str, key: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("shard stats"))
        .filter_map(|l| between(l, &format!(" {key}="), " ").and_then(|v| v.parse().ok()))
        .max()
        .unwrap_or(0)
}

/// The storm's verdict: the agent stayed within its bounds.
pub fn storm_check(s: &StormResult, max_targets: u64, new_per_s: f64, probe_pps: f64) -> Check {
    let admitted_bound = (new_per_s * (s.seconds + 12.0)) as u64 + new_per_s as u64;
    let rate_bound = s.probes_per_s_clean + max_targets as f64 * probe_pps;
    let rss_growth_kib = s.rss_kib_after.saturating_sub(s.rss_kib_before);
    let ok = s.services_added <= admitted_bound
        && s.services_active_max <= max_targets
        && s.probes_per_s_storm <= rate_bound * 1.1
        && rss_growth_kib < 16 * 1024
        && s.services_added > 0;
    Check {
        name: "services: storm bounded".into(),
        ok,
        detail: format!(
            "{} QPs in {:.1} s on {}: {} taken (bound {admitted_bound}), {} refused by rate, at most {} active \
             (bound {max_targets}); {:.0} probes/s vs {:.0} clean (bound {rate_bound:.0}); RSS {} -> {} KiB",
            s.qps,
            s.seconds,
            s.host,
            s.services_added,
            s.services_refused_rate,
            s.services_active_max,
            s.probes_per_s_storm,
            s.probes_per_s_clean,
            s.rss_kib_before,
            s.rss_kib_after
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::cpu_ticks;

    #[test]
    fn log_fields_are_found() {
        let l = "2026-11-24T01:00:00Z  INFO rocemesh_agent::runtime: service target added device=\"rxe_tor0-h0\" \
                 service=svc tor0-h0/rxe_tor0-h0 qp 17 -> 10.0.1.2 qp 18 (ib_send_lat[42]) flow_label=12345 \
                 discovery_delay_ms=3.5";
        assert_eq!(
            between(l, "service=", " flow_label="),
            Some("svc tor0-h0/rxe_tor0-h0 qp 17 -> 10.0.1.2 qp 18 (ib_send_lat[42])")
        );
        let v: f64 = l.split("discovery_delay_ms=").nth(1).expect("field").trim().parse().expect("number");
        assert_eq!(v, 3.5);
        let stats = "INFO x: shard stats device=\"d\" sent=5 services_active=3 services_added=9 ";
        assert_eq!(max_stat(&format!("{stats}\n{}", stats.replace("=3 ", "=7 ")), "services_active"), 7);
        assert_eq!(max_stat(stats, "missing"), 0);
    }

    #[test]
    fn cpu_ticks_reads_this_process() {
        let pid = std::process::id();
        // Spin (the optimiser must not fold it away) until a clock tick is charged; a parser
        // that reads the wrong fields stays at 0 and the test fails after 5 s.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut x = 0u64;
        while cpu_ticks(pid).expect("stat") == 0 && std::time::Instant::now() < until {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_add(i));
            }
        }
        assert!(cpu_ticks(pid).expect("stat") > 0, "no CPU time read from /proc/{pid}/stat after spinning");
        assert!(rss_kib(pid).expect("status") > 0);
        assert!(cpu_ticks(u32::MAX).is_err() && rss_kib(u32::MAX).is_err(), "a missing process is an error, not 0");
    }
}
