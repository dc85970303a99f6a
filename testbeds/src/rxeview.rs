//! The soft-RoCE VM's one-sided collection check (issue 22): five verbs agents with `[view]`,
//! and `ctl scrape` on the sixth host reading all five with RDMA READ at 10 Hz for a minute.
//!
//! Promised: every tick of every agent gives a consistent snapshot (torn reads are read again);
//! what the collector read matches the agents' own stats lines within one update; a wrong rkey
//! and a read past the region fail on the collector's side, the agent goes on probing and is
//! read again afterwards; a collector the allow list does not name is refused. Measured, as a
//! bench line (never asserted): the agents' CPU with and without the collector, and the
//! collector's snapshots per CPU second.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use rocemesh_formats::inventory::Inventory;

use crate::harness::{Agents, Check, gen_pinglists};
use crate::rxeagent::{AgentSpec, start_agent};
use crate::rxefabric::{self, Layout};

/// The host the collector runs on; the other five run agents.
const COLLECTOR: &str = "tor2-h1";
const VIEW_PORT: u16 = 18_601;
const RATE_HZ: f64 = 10.0;
const SCRAPE_S: u64 = 60;
const BASELINE_S: u64 = 30;
/// Agents log their stats this often (s): the lines the collector's reads are compared with.
const STATS_S: u64 = 2;
const SEGMENTS: &str = "/tmp/rocemesh-rxe-view";
/// The collector's Prometheus file, rewritten at every tick: on the guest's tmpfs, as the
/// segments are (over 9p each rewrite stalls the collector's loop for ticks under TCG), and
/// copied into the lab when the collector is done.
const PROM: &str = "/tmp/rocemesh-rxe-view.prom";

/// What the run measured, for the bench line.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ViewBench {
    /// Agents' CPU (% of one core, mean over the five) without and with the collector.
    pub agent_cpu_percent_idle: f64,
    pub agent_cpu_percent_scraped: f64,
    /// Consistent snapshots per second over all targets, and per second of collector CPU.
    pub snapshots_per_s: f64,
    pub snapshots_per_cpu_s: f64,
    pub torn: u64,
}

fn scrape(ctl: &Path, targets: &[String], extra: &[&str], out: &Path) -> anyhow::Result<(bool, String)> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", COLLECTOR]).arg(ctl).arg("scrape").arg("--targets").arg(targets.join(","));
    cmd.args(extra);
    let o = cmd.output().context("running ctl scrape")?;
    std::fs::write(out, &o.stdout).with_context(|| format!("writing {}", out.display()))?;
    Ok((o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned()))
}

/// A number after `key=` in a log line.
fn field(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(&format!(" {key}="))? + key.len() + 2..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The time of a log line (RFC 3339 at its start), Unix ns.
fn line_time_ns(line: &str) -> Option<u64> {
    let ts = line.split_whitespace().next()?;
    // 2026-11-24T15:09:59.243973Z
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let days = days_from_civil(d[0], d[1], d[2]);
    let frac_ns: u64 = format!("{frac:0<9}")[..9].parse().ok()?;
    Some(((days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2]) as u64) * 1_000_000_000 + frac_ns)
}

impl ViewBench {
    /// The bench line.
    pub fn render(&self) -> String {
        format!(
            "bench view: agent CPU {:.2}% of a core without the collector, {:.2}% while read at {RATE_HZ} Hz \
             (ratio {:.2}); collector {:.1} snapshots/s, {:.0} per CPU second; {} torn reads read again\n",
            self.agent_cpu_percent_idle,
            self.agent_cpu_percent_scraped,
            self.agent_cpu_percent_scraped / self.agent_cpu_percent_idle.max(1e-9),
            self.snapshots_per_s,
            self.snapshots_per_cpu_s,
            self.torn
        )
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Run the check in the VM; fails only on setup errors.
pub fn run(bin: &Path, dir: &Path) -> anyhow::Result<(Vec<Check>, ViewBench)> {
    let inv = prepare(bin, dir)?;
    let (mut agents, targets) = start_agents(bin, dir, &inv)?;
    let ctl = bin.join("ctl");
    let scraped = baseline_and_scrape(&ctl, dir, &targets, &agents)?;
    let forged = forged_reads(&ctl, dir, &targets)?;
    let (outsider_ok, refused) = outsider_read(&ctl, &inv, &targets)?;
    agents.stop();

    let mut checks = Vec::new();
    // Snapshots per target.
    let lines = read_snapshots(&scraped.path)?;
    let per_target = by_target(&lines);
    checks.push(rate_check(&targets, &per_target, &lines, &scraped));
    let stats = compare_with_stats(dir, &inv, &targets, &per_target)?;
    checks.push(window_check(&per_target, &stats.rates));
    checks.push(stats_check(&stats));
    checks.push(prometheus_check(dir)?);
    checks.push(forged_check(&forged));
    checks.push(refused_check(outsider_ok, &refused));
    let bench = view_bench(&scraped, lines.len());
    std::fs::write(dir.join("view-bench.json"), serde_json::to_vec_pretty(&bench)?)?;
    Ok((checks, bench))
}

/// Snapshots as the collector wrote them, by the target they were read from.
type PerTarget<'a> = BTreeMap<String, Vec<&'a serde_json::Value>>;

/// The agents' CPU ticks around the baseline and the collector's minute, and what it reported.
struct Scraped {
    before: Vec<(String, u64)>,
    mid: Vec<(String, u64)>,
    after: Vec<(String, u64)>,
    /// Whether `ctl scrape` exited 0, and its stderr (its summary).
    ok: bool,
    summary: String,
    /// The snapshots it wrote, one JSON line each.
    path: PathBuf,
}

/// How the forged reads and the plain read after them ended: exit 0, and stderr.
struct Forged {
    rkey_ok: bool,
    rkey_err: String,
    oob_ok: bool,
    oob_err: String,
    again_ok: bool,
    again_err: String,
}

/// What the collector read against the agents' own stats lines.
struct StatsComparison {
    mismatches: Vec<String>,
    compared: usize,
    /// Each agent's own probe rate (per ns), from its stats lines.
    rates: BTreeMap<String, f64>,
}

/// A clean run directory and segment store, the 3x2 fabric, its inventory and the pinglists.
fn prepare(bin: &Path, dir: &Path) -> anyhow::Result<Inventory> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    match std::fs::remove_dir_all(SEGMENTS) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("clearing {SEGMENTS}"));
        }
        _ => {}
    }
    std::fs::create_dir_all(dir.join("pinglists"))?;
    let inv = rxefabric::up(Layout::new(3, 2)?)?;
    let inventory = dir.join("inventory.toml");
    rxefabric::write_inventory(&inv, &inventory)?;
    gen_pinglists(&bin.join("ctl"), &inventory, &dir.join("pinglists"), 2, 10.0, 10.0, &[])?;
    Ok(inv)
}

/// An agent serving the view on every host but the collector's; the agents and view addresses.
fn start_agents(bin: &Path, dir: &Path, inv: &Inventory) -> anyhow::Result<(Agents, Vec<String>)> {
    let collector = rxefabric::host(inv, COLLECTOR)?;
    let allow = collector.ip.to_string();
    let mut agents = Agents { children: Vec::new() };
    let mut targets = Vec::new();
    for (i, h) in inv.hosts.iter().filter(|h| h.name != COLLECTOR).enumerate() {
        let r = &h.rnics[0];
        let spec = AgentSpec {
            host: &h.name,
            device: &r.device,
            tor: &r.tor,
            ip: r.ip,
            pinglist: &dir.join("pinglists").join(format!("{}.toml", h.name)),
            segments: &PathBuf::from(SEGMENTS).join(&h.name),
            mode: "event",
            core: i % 2,
            stats_interval_s: STATS_S,
            flush_interval_ms: 200,
            rust_log: "info",
            duration_s: None,
            service_tracing: false,
            view_allow: Some(&allow),
        };
        agents.children.push((h.name.clone(), start_agent(&bin.join("agent"), &spec, dir)?));
        targets.push(format!("{}:{VIEW_PORT}", r.ip));
    }
    Ok((agents, targets))
}

/// Warm-up, the agents alone, then the collector at 10 Hz for a minute; the agents' CPU around it.
fn baseline_and_scrape(ctl: &Path, dir: &Path, targets: &[String], agents: &Agents) -> anyhow::Result<Scraped> {
    // Warm-up, then the agents alone.
    std::thread::sleep(Duration::from_secs(10));
    let before = agents.cpu_ticks()?;
    std::thread::sleep(Duration::from_secs(BASELINE_S));
    let mid = agents.cpu_ticks()?;
    // The collector, 10 Hz, a minute.
    let scraped = dir.join("scrape.jsonl");
    let (ok, summary) = scrape(
        ctl,
        targets,
        &["--rate-hz", &RATE_HZ.to_string(), "--duration-s", &SCRAPE_S.to_string(), "--prom", PROM],
        &scraped,
    )?;
    let after = agents.cpu_ticks()?;
    std::fs::write(dir.join("scrape.stderr"), &summary)?;
    // Missing when the collector died before its first tick: its stderr (above) says why, and
    // the Prometheus check fails on the file's absence.
    if let Err(e) = std::fs::copy(PROM, dir.join("view.prom")) {
        eprintln!("rxeview: copying {PROM} into the lab: {e}");
    }
    Ok(Scraped { before, mid, after, ok, summary, path: scraped })
}

/// A wrong rkey and a read past the region against the first agent, then a plain read of it.
fn forged_reads(ctl: &Path, dir: &Path, targets: &[String]) -> anyhow::Result<Forged> {
    // Forged reads against the first agent, then a plain read of it again.
    let first = std::slice::from_ref(&targets[0]);
    let (rkey_ok, rkey_err) =
        scrape(ctl, first, &["--forge", "rkey", "--duration-s", "3", "--quiet"], &dir.join("forge-rkey.jsonl"))?;
    let (oob_ok, oob_err) =
        scrape(ctl, first, &["--forge", "oob", "--duration-s", "3", "--quiet"], &dir.join("forge-oob.jsonl"))?;
    let (again_ok, again_err) = scrape(ctl, first, &["--duration-s", "3", "--rate-hz", "5"], &dir.join("again.jsonl"))?;
    Ok(Forged { rkey_ok, rkey_err, oob_ok, oob_err, again_ok, again_err })
}

/// A read by a collector the agents do not allow: whether it exited 0, and its stderr.
fn outsider_read(ctl: &Path, inv: &Inventory, targets: &[String]) -> anyhow::Result<(bool, String)> {
    // A collector the agents do not allow: from an agent's own host.
    let outsider = inv.hosts.iter().find(|h| h.name != COLLECTOR).map(|h| h.name.clone()).context("no agent host")?;
    let o = Command::new("ip")
        .args(["netns", "exec", &outsider])
        .arg(ctl)
        .args(["scrape", "--targets", &targets[1], "--duration-s", "3", "--quiet"])
        .output()?;
    let refused = String::from_utf8_lossy(&o.stderr).into_owned();
    Ok((o.status.success(), refused))
}

/// The snapshots the collector wrote, one JSON line each (lines that do not parse left out).
fn read_snapshots(scraped: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(scraped).with_context(|| format!("reading {}", scraped.display()))?;
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// The snapshots grouped by the target they were read from.
fn by_target(lines: &[serde_json::Value]) -> PerTarget<'_> {
    let mut per_target: PerTarget = BTreeMap::new();
    for l in lines {
        per_target.entry(l["target"].as_str().unwrap_or("").to_string()).or_default().push(l);
    }
    per_target
}

/// Every agent read at every tick the collector made, for the whole minute.
fn rate_check(targets: &[String], per_target: &PerTarget, lines: &[serde_json::Value], scraped: &Scraped) -> Check {
    // The collector ticks at 10 Hz; a tick that passes while its own loop is descheduled or
    // busy (the guest's two emulated CPUs also run five agents and rxe, and rxe's work for a
    // read runs in the kernel beside it) is counted as missed in its summary and cannot be
    // read. What the collector answers for is the ticks it made: every agent must be read at
    // 90% of them (a read still in flight at a tick is read again when it completes), over at
    // least 100 ticks, so that the 10% allowed is at least 10 reads and not a rounding. How
    // slow the guest was shows in the detail (reads' times, ticks missed).
    let nominal = (RATE_HZ * SCRAPE_S as f64) as usize;
    let count = |what: &str| -> Option<usize> {
        scraped.summary.lines().find_map(|l| l.split_once(what).and_then(|(h, _)| h.rsplit(' ').next()?.parse().ok()))
    };
    // Not said: nothing was made.
    let made = count(" ticks made").unwrap_or(0);
    let missed = count(" missed while the collector").unwrap_or(nominal);
    let counts: Vec<String> =
        targets.iter().map(|t| format!("{t} {}", per_target.get(t).map_or(0, Vec::len))).collect();
    Check {
        name: "view: every agent read at each 10 Hz tick".into(),
        ok: scraped.ok
            && made >= 100
            && targets.iter().all(|t| per_target.get(t).is_some_and(|v| v.len() * 10 >= made * 9)),
        detail: format!(
            "{} snapshots; {made} ticks made of {nominal} nominal ({missed} missed while the collector's loop was late), \
             per agent: {}; {}",
            lines.len(),
            counts.join(", "),
            scraped.summary.trim()
        ),
    }
}

/// Each agent's stats lines against the snapshots read just before them, and its own probe rate.
fn compare_with_stats(
    dir: &Path,
    inv: &Inventory,
    targets: &[String],
    per_target: &PerTarget,
) -> anyhow::Result<StatsComparison> {
    // The agents' own stats lines against what was read. The shard publishes its view (counters
    // taken, then the wall clock stamped) and logs its stats line (counters taken, then the
    // line's time) on its own thread, so their order is exact: a snapshot stamped before a
    // line says probes_sent no more than the line, and one stamped after it no less. Each line
    // logged while the collector ran is held between the two snapshots nearest it (each at
    // most 300 ms away: one 250 ms publication and the read), which pins the view to the
    // counters with no allowance for how evenly the agent sends.
    let mut mismatches = Vec::new();
    let mut compared = 0;
    let mut rates: BTreeMap<String, f64> = BTreeMap::new();
    for (host, _) in inv.hosts.iter().filter(|h| h.name != COLLECTOR).map(|h| (h.name.clone(), ())) {
        let log = std::fs::read_to_string(dir.join(format!("{host}.log")))?;
        let t = targets
            .iter()
            .find(|t| per_target.get(*t).is_some_and(|v| v.first().is_some_and(|s| s["host"] == host.as_str())));
        let Some(snaps) = t.and_then(|t| per_target.get(t)) else {
            mismatches.push(format!("{host}: not read"));
            continue;
        };
        let logged: Vec<(u64, u64)> = log
            .lines()
            .filter(|l| l.contains("shard stats") && l.contains("final_=false"))
            .filter_map(|l| Some((line_time_ns(l)?, field(l, "sent")?)))
            .collect();
        let rate_per_ns = match (logged.first(), logged.last()) {
            (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) as f64 / (b.0 - a.0) as f64,
            _ => 0.0,
        };
        rates.insert(host.clone(), rate_per_ns);
        let stamped = |s: &serde_json::Value| s["updated_unix_ns"].as_u64().unwrap_or(0);
        for &(at, sent) in &logged {
            let before = snaps.iter().rfind(|s| stamped(s) <= at);
            let after = snaps.iter().find(|s| stamped(s) > at);
            let (Some(b), Some(a)) = (before, after) else { continue };
            if at - stamped(b) > 300_000_000 || stamped(a) - at > 300_000_000 {
                continue;
            }
            compared += 1;
            let read = |s: &serde_json::Value| s["counters"]["probes_sent"].as_u64();
            let (rb, ra) = (read(b), read(a));
            if rb.is_none_or(|r| r > sent) || ra.is_none_or(|r| r < sent) {
                mismatches.push(format!(
                    "{host}: logged sent={sent}, read {rb:?} {} ms before and {ra:?} {} ms after",
                    (at - stamped(b)) / 1_000_000,
                    (stamped(a) - at) / 1_000_000
                ));
            }
        }
    }
    Ok(StatsComparison { mismatches, compared, rates })
}

/// The last complete window of each agent's last snapshot: about a window of its probes, aligned.
fn window_check(per_target: &PerTarget, rates: &BTreeMap<String, f64>) -> Check {
    // Windows: in each agent's last snapshot, the last complete window holds about a window's
    // worth of its probes (its own rate from its stats lines), and windows start on multiples of
    // their length.
    let mut windows = Vec::new();
    let mut windows_ok = !per_target.is_empty();
    for (t, snaps) in per_target {
        let Some(s) = snaps.last() else { continue };
        let window_ns = s["window_ns"].as_u64().unwrap_or(0);
        let start = s["last_window_start_unix_ns"].as_u64().unwrap_or(1);
        let probes: u64 = s["tors"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .flat_map(|t| t["last"].as_object().into_iter().flatten())
                    .filter(|(k, _)| !matches!(k.as_str(), "rtt_buckets" | "rtt_sum_ns"))
                    .filter_map(|(_, v)| v.as_u64())
                    .sum()
            })
            .unwrap_or(0);
        let host = s["host"].as_str().unwrap_or("?");
        let expected = rates.get(host).copied().unwrap_or(0.0) * window_ns as f64;
        let ok = window_ns > 0 && start % window_ns == 0 && (probes as f64 - expected).abs() <= 0.1 * expected;
        windows_ok &= ok;
        windows.push(format!("{t} {probes} (about {expected:.0})"));
    }
    Check {
        name: "view: last window per ToR".into(),
        ok: windows_ok,
        detail: format!("probes in the last complete window: {}", windows.join(", ")),
    }
}

/// The comparison with the agents' stats lines, as a check.
fn stats_check(stats: &StatsComparison) -> Check {
    Check {
        name: "view: matches the agents' stats".into(),
        ok: stats.mismatches.is_empty() && stats.compared >= 20,
        detail: format!(
            "{} stats lines compared; mismatches: {}",
            stats.compared,
            if stats.mismatches.is_empty() { "none".into() } else { stats.mismatches.join("; ") }
        ),
    }
}

/// The Prometheus text file the collector kept, as promtool reads it.
fn prometheus_check(dir: &Path) -> anyhow::Result<Check> {
    // The Prometheus file the collector kept, as promtool reads it.
    let prom = dir.join("view.prom");
    let lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&prom).with_context(|| format!("opening {}", prom.display()))?)
        .output();
    let (lint_ok, lint_said) = match lint {
        Ok(o) => (
            o.status.success(),
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        ),
        Err(e) => (false, format!("promtool: {e} (apt-get install prometheus)")),
    };
    let series = std::fs::read_to_string(&prom)?.lines().filter(|l| !l.starts_with('#')).count();
    Ok(Check {
        name: "view: Prometheus text file".into(),
        ok: lint_ok && series > 0,
        detail: format!(
            "{series} series; promtool check metrics: {}",
            if lint_said.trim().is_empty() { "clean" } else { lint_said.trim() }
        ),
    })
}

/// The forged reads failed on the collector's side, and the agent was read again after them.
fn forged_check(f: &Forged) -> Check {
    let forged = |ok: bool, err: &str| !ok && err.contains("RDMA READ failed");
    Check {
        name: "view: forged reads fail cleanly".into(),
        ok: forged(f.rkey_ok, &f.rkey_err) && forged(f.oob_ok, &f.oob_err) && f.again_ok,
        detail: format!(
            "wrong rkey: {}; out of bounds: {}; read again after: {}",
            f.rkey_err.lines().find(|l| l.contains("RDMA READ")).unwrap_or(f.rkey_err.trim()),
            f.oob_err.lines().find(|l| l.contains("RDMA READ")).unwrap_or(f.oob_err.trim()),
            f.again_err.lines().last().unwrap_or("")
        ),
    }
}

/// The collector the allow list does not name was refused.
fn refused_check(outsider_ok: bool, refused: &str) -> Check {
    Check {
        name: "view: a collector not allowed is refused".into(),
        ok: !outsider_ok && refused.contains("not in [view] allow"),
        detail: refused.lines().find(|l| l.contains("rejected")).unwrap_or(refused.trim()).to_string(),
    }
}

/// The bench line's figures: the agents' CPU without and with the collector, its snapshot rates.
fn view_bench(scraped: &Scraped, snapshots: usize) -> ViewBench {
    let ticks_per_s = 100.0; // USER_HZ
    let cpu = |a: &[(String, u64)], b: &[(String, u64)], s: u64| {
        let total: u64 = a.iter().zip(b).map(|(x, y)| y.1 - x.1).sum();
        100.0 * total as f64 / ticks_per_s / s as f64 / a.len() as f64
    };
    let snapshots: f64 = snapshots as f64;
    let summary = &scraped.summary;
    let cpu_s: f64 = summary
        .lines()
        .find_map(|l| l.split("collector CPU ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or(f64::NAN);
    ViewBench {
        agent_cpu_percent_idle: cpu(&scraped.before, &scraped.mid, BASELINE_S),
        agent_cpu_percent_scraped: cpu(&scraped.mid, &scraped.after, SCRAPE_S),
        snapshots_per_s: snapshots / SCRAPE_S as f64,
        snapshots_per_cpu_s: snapshots / cpu_s,
        torn: summary.lines().filter_map(|l| l.split(" torn").next()?.rsplit('(').next()?.parse::<u64>().ok()).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_times_and_fields_parse() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        let l = "2026-11-24T15:09:59.243973Z  INFO rocemesh_agent::runtime: shard stats device=\"rxe0\" final_=false sent=201 ok=197";
        assert_eq!(line_time_ns(l), Some(1_795_532_999_243_973_000));
        assert_eq!((field(l, "sent"), field(l, "ok")), (Some(201), Some(197)));
    }
}
