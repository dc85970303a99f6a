//! The end-to-end soft-RoCE run of issue 7, executed inside the rxe VM as root: a fabric of rxe
//! hosts ([`crate::rxefabric`]), pinglists from `ctl`, one real `agent` per host on the verbs
//! transport, faults injected on a timeline, and the verdict from `analyze localize` and from the
//! records themselves.
//!
//! Timeline (phases aligned to the analysis window, so that a window never mixes two phases):
//! warm-up, clean, an RNIC killed (ingress drop of RoCEv2 on one host: "RNIC dead, host alive"),
//! a quiet gap, netem loss on one ToR's uplink, a quiet gap, the rxe device of a third host
//! deleted under its running agent and added back, and a tail in which probing must resume.
//!
//! Why 3 ToRs of 2 hosts and not 2 of 3: with two ToRs, every inter-ToR probe crosses both
//! uplinks, so no probe can tell which uplink drops; a third ToR is the least that separates
//! them. The inventory's single spine gives `analyze` the path without traces.

use crate::harness::{AGENT_PORT, Agents, Check, Phase, Rec, gen_pinglists, localize, now_ns, read_records};
use crate::rxeagent::{AgentSpec, SERVICE_MAX_TARGETS, SERVICE_NEW_PER_S, SERVICE_PROBE_PPS, start_agent};
use crate::rxefabric::{self, Layout};
use crate::rxeservices;
use anyhow::{Context, bail};
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::record::Outcome;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What to run.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Results, configs, segments and logs go here (the VM's read-write share).
    pub lab: PathBuf,
    /// Where the `agent`, `ctl` and `analyze` binaries are.
    pub bin: PathBuf,
    /// Analysis window, s; every phase is a whole number of windows.
    pub window_s: u64,
    /// Windows per fault phase.
    pub fault_windows: u64,
    /// ToR-mesh and inter-ToR probe rates.
    pub tor_mesh_pps: f64,
    pub inter_tor_pps: f64,
    /// Netem loss on the faulty uplink, percent.
    pub uplink_loss_percent: f64,
}

impl LabOptions {
    /// Defaults for `lab` and `bin`.
    pub fn new(lab: PathBuf, bin: PathBuf) -> Self {
        Self {
            lab,
            bin,
            window_s: 10,
            fault_windows: 3,
            tor_mesh_pps: 10.0,
            inter_tor_pps: 5.0,
            uplink_loss_percent: 20.0,
        }
    }
}

/// Everything the run found.
#[derive(Debug, Clone, Serialize)]
pub struct LabResult {
    pub phases: Vec<Phase>,
    pub checks: Vec<Check>,
    pub records: u64,
    pub findings: serde_json::Value,
    pub services: ServicesRun,
    /// One-sided collection's bench line (`rxeview`).
    pub view: crate::rxeview::ViewBench,
}

/// What the service-tracing part measured besides its checks.
#[derive(Debug, Clone, Serialize)]
pub struct ServicesRun {
    /// How each perftest end exited.
    pub perftest: Vec<String>,
    pub storm: rxeservices::StormResult,
    pub tracer_cpu: TracerCpu,
}

/// The tracer's cost when loaded and idle: agent CPU over the clean phase (no QP events), agents
/// with the tracer against agents without, in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct TracerCpu {
    pub seconds: f64,
    /// Mean CPU per agent, percent of one core.
    pub traced_cpu_percent: f64,
    pub untraced_cpu_percent: f64,
    pub per_agent: Vec<(String, bool, f64)>,
}

impl TracerCpu {
    fn new(before: &[(String, u64)], after: &[(String, u64)], seconds: f64) -> Self {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let per_agent: Vec<(String, bool, f64)> = after
            .iter()
            .filter_map(|(h, a)| {
                let b = before.iter().find(|(hb, _)| hb == h)?.1;
                let pct = a.saturating_sub(b) as f64 / hz / seconds * 100.0;
                Some((h.clone(), !UNTRACED.contains(&h.as_str()), pct))
            })
            .collect();
        let mean = |traced: bool| {
            let v: Vec<f64> = per_agent.iter().filter(|a| a.1 == traced).map(|a| a.2).collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        TracerCpu { seconds, traced_cpu_percent: mean(true), untraced_cpu_percent: mean(false), per_agent }
    }
}

/// Run the storm in `host`'s namespace (`testbeds rxe-fabric storm`), towards `peer`'s GID.
fn storm_in(testbeds: &Path, host: &str, peer: &str, qps: u32) -> anyhow::Result<rxefabric::storm::Storm> {
    // SCHED_IDLE, as the perftest connections run: in the VM the routers, the rxe devices and
    // the agents share the emulated CPUs with the storm, and a storm at normal priority slowed
    // every probe of the fabric (once, 5.7 s of 1,000 QPs made 20% of all probes slow, and
    // `analyze` blamed a ToR and a link for the emulator's CPU). A real storm cannot slow the
    // switches; here it must not either.
    let out = Command::new("ip")
        .args(["netns", "exec", host, "chrt", "--idle", "0"])
        .arg(testbeds)
        .args(["rxe-fabric", "storm", host, peer, "--qps", &qps.to_string()])
        .output()
        .context("running testbeds rxe-fabric storm")?;
    if !out.status.success() {
        bail!("the QP storm failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("the storm printed no result: {}", String::from_utf8_lossy(&out.stdout)))
}

impl LabResult {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    /// The checks as a table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for c in &self.checks {
            s.push_str(&format!("{:4}  {:28} {}\n", if c.ok { "ok" } else { "FAIL" }, c.name, c.detail));
        }
        s.push_str(&self.view.render());
        s
    }
}

/// Agents write segments to the guest's tmpfs, as they would to a node's local disk: over the
/// 9p share every page of an mmap'd segment is a round trip to the host, and under TCG that
/// stalled the agents for a minute and more at start. They are copied to the lab at the end.
fn local_segments() -> PathBuf {
    PathBuf::from("/tmp/rocemesh-rxe-lab/segments")
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for e in std::fs::read_dir(from).with_context(|| format!("listing {}", from.display()))? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type()?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
        }
    }
    Ok(())
}

/// Sleep until the next multiple of `window_ns` (plus a small margin), return that boundary.
fn align(window_ns: u64) -> u64 {
    let now = now_ns();
    let next = (now / window_ns + 1) * window_ns;
    std::thread::sleep(Duration::from_nanos(next - now + 50_000_000));
    next
}

fn sleep_until(t_ns: u64) {
    let now = now_ns();
    if t_ns > now {
        std::thread::sleep(Duration::from_nanos(t_ns - now));
    }
}

/// Hosts whose agents run without the tracer: the CPU baseline of the tracer's cost.
const UNTRACED: [&str; 2] = ["tor1-h0", "tor2-h0"];

/// Run the whole lab. Errors are setup failures; a run whose checks fail returns Ok with
/// `passed() == false`.
pub fn run(opts: &LabOptions) -> anyhow::Result<LabResult> {
    let lab = &opts.lab;
    let (inv, inventory) = prepare(opts)?;
    load_fault_modules()?;
    crate::rxemetrics::mount_host_sysfs()?;
    let mut agents = start_agents(opts, &inv)?;
    let h0 = &inv.hosts[0];
    let doctor = crate::rxedoctor::check(
        &opts.bin.join("agent"),
        &h0.name,
        &lab.join("agents").join(format!("{}.toml", h0.name)),
        &h0.rnics[0].ip.to_string(),
        lab,
    )?;

    let w = opts.window_s * 1_000_000_000;
    let mut tl = Timeline { w, fw: opts.fault_windows * w, phases: Vec::new() };
    let (clean_from, mut scrapes, tracer_cpu) = clean_phase(&mut tl, opts, &agents, &inv)?;
    rnic_killed_phase(&mut tl)?;
    let rc = rc_start_gap(&mut tl)?;
    let lossy = uplink_loss_phase(&mut tl, opts.uplink_loss_percent)?;
    let (perftest, perftest_ended_ns) = rc_end_gap(&mut tl, rc);
    let (removed, removed_rnic) = rdma_deleted_phase(&mut tl, opts, &mut scrapes)?;
    let storm_run = storm_phase(&mut tl, opts, &agents)?;
    agents.stop();
    copy_tree(&local_segments(), &lab.join("segments"))?;

    // Verdicts.
    let records = read_records(&lab.join("segments"))?;
    let findings = localize_findings(opts, &inventory)?;
    let mut checks = verdicts(&tl.phases, &records, &findings, removed, &removed_rnic, w);
    checks.push(doctor);
    let lossy_link = format!("{lossy}|{}", rxefabric::SPINE);
    checks.extend(rxeservices::connection_checks(
        &lab.join("agents"),
        &lab.join("segments"),
        &findings,
        &lossy_link,
        perftest_ended_ns,
    )?);
    let storm = storm_result(lab, &records, &storm_run, clean_from, tl.fw)?;
    checks.push(rxeservices::storm_check(&storm, SERVICE_MAX_TARGETS, SERVICE_NEW_PER_S, SERVICE_PROBE_PPS));
    checks.extend(crate::rxemetrics::checks(&scrapes));
    let (view_checks, view) = crate::rxeview::run(&opts.bin, &lab.join("view"))?;
    checks.extend(view_checks);
    // Last: it steps the guest's clock (and puts it back).
    checks.extend(crate::clockstep::run(&opts.bin.join("agent"), &lab.join("clockstep"))?);
    let services = ServicesRun { perftest, storm, tracer_cpu };
    let result = LabResult { phases: tl.phases, checks, records: records.len() as u64, findings, services, view };
    std::fs::write(lab.join("result.json"), serde_json::to_vec_pretty(&result)?)?;
    Ok(result)
}

/// The timeline as it runs: the analysis window and a fault phase's length (ns), the phases so far.
struct Timeline {
    w: u64,
    fw: u64,
    phases: Vec<Phase>,
}

impl Timeline {
    /// Records a phase that ran from `from` to `to` (wall clock, ns).
    fn phase(&mut self, name: &str, entity: &str, expect: &str, from: u64, to: u64) {
        self.phases.push(Phase {
            name: name.into(),
            entity: entity.into(),
            expect: expect.into(),
            from_ns: from,
            to_ns: to,
        });
    }
}

/// The two RC connections that run through the uplink fault, and how long they run (s).
struct RcPairs {
    a: rxefabric::RcPair,
    b: rxefabric::RcPair,
    seconds: u64,
}

/// What the storm phase measured, for the storm's result.
struct StormRun {
    host: &'static str,
    storm: rxefabric::storm::Storm,
    rss_before: u64,
    rss_after: u64,
    from: u64,
    to: u64,
}

/// Empty lab directories and local segments, the 3x2 fabric and its inventory, the pinglists.
fn prepare(opts: &LabOptions) -> anyhow::Result<(Inventory, PathBuf)> {
    let lab = &opts.lab;
    for sub in ["agents", "segments", "pinglists"] {
        let p = lab.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| format!("clearing {}", p.display()))?;
        }
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
    }
    // A second run in the same guest must not read the first one's segments.
    let local = local_segments();
    if local.exists() {
        std::fs::remove_dir_all(&local).with_context(|| format!("clearing {}", local.display()))?;
    }
    let layout = Layout::new(3, 2)?;
    let inv = rxefabric::up(layout)?;
    let inventory = lab.join("inventory.toml");
    rxefabric::write_inventory(&inv, &inventory)?;
    gen_pinglists(
        &opts.bin.join("ctl"),
        &inventory,
        &lab.join("pinglists"),
        2,
        opts.tor_mesh_pps,
        opts.inter_tor_pps,
        &["--timeout-ms", "1000"],
    )?;
    Ok((inv, inventory))
}

/// Each fault injected and healed once, before the agents start, so that tc's modules are loaded.
fn load_fault_modules() -> anyhow::Result<()> {
    // Inject each fault once before the agents start: the guest loads tc's modules (clsact,
    // flower, netem) on first use, and a module load under TCG freezes the whole VM for about a
    // second, which analyze rightly reads as every host stalling at once.
    rxefabric::rnic_kill("tor0-h1")?;
    rxefabric::rnic_heal("tor0-h1")?;
    rxefabric::uplink_loss("tor1", 1.0)?;
    rxefabric::uplink_heal("tor1")?;
    Ok(())
}

/// One verbs agent per host (the service tracer on all but `UNTRACED`), segments to the tmpfs.
fn start_agents(opts: &LabOptions, inv: &Inventory) -> anyhow::Result<Agents> {
    let lab = &opts.lab;
    let mut agents = Agents { children: Vec::new() };
    for (i, h) in inv.hosts.iter().enumerate() {
        let r = &h.rnics[0];
        let spec = AgentSpec {
            host: &h.name,
            device: &r.device,
            tor: &r.tor,
            ip: r.ip,
            pinglist: &lab.join("pinglists").join(format!("{}.toml", h.name)),
            segments: &local_segments().join(&h.name),
            mode: "event",
            core: i % 2,
            stats_interval_s: 10,
            flush_interval_ms: 200,
            rust_log: "info,rocemesh_agent=debug",
            duration_s: None,
            service_tracing: !UNTRACED.contains(&h.name.as_str()),
            view_allow: None,
        };
        let child = start_agent(&opts.bin.join("agent"), &spec, &lab.join("agents"))?;
        agents.children.push((h.name.clone(), child));
    }
    Ok(agents)
}

/// Warm-up, then the clean phase; its start, one agent's metrics around it, the tracer's CPU cost.
fn clean_phase(
    tl: &mut Timeline,
    opts: &LabOptions,
    agents: &Agents,
    inv: &Inventory,
) -> anyhow::Result<(u64, crate::rxemetrics::Scrapes, TracerCpu)> {
    let (w, fw) = (tl.w, tl.fw);
    let bin = |name: &str| opts.bin.join(name);
    // Warm-up: agents start, resolve each other's QPNs over RDMA CM.
    let t0 = align(w);
    let clean_from = t0 + w;
    sleep_until(clean_from);
    let cpu_before = agents.cpu_ticks()?;
    let scraped = inv.hosts.iter().find(|h| h.name == "tor0-h0").context("no host tor0-h0")?;
    let mut scrapes = crate::rxemetrics::Scrapes {
        clean: (scraped.name.clone(), scraped.rnics[0].device.clone()),
        ..Default::default()
    };
    scrapes.clean_from = crate::rxemetrics::scrape(&bin("testbeds"), &scrapes.clean.0)?;
    sleep_until(clean_from + fw);
    let cpu_after = agents.cpu_ticks()?;
    scrapes.clean_to = crate::rxemetrics::scrape(&bin("testbeds"), &scrapes.clean.0)?;
    tl.phase("clean", "", "", clean_from, clean_from + fw);
    let tracer_cpu = TracerCpu::new(&cpu_before, &cpu_after, (fw as f64) / 1e9);
    Ok((clean_from, scrapes, tracer_cpu))
}

/// An RNIC dead (RoCEv2 dropped on arrival, the host alive) for a fault phase, then healed.
fn rnic_killed_phase(tl: &mut Timeline) -> anyhow::Result<()> {
    let killed = "tor0-h1";
    let killed_rnic = format!("{killed}/{}", rxefabric::device_name(killed));
    let t = now_ns();
    rxefabric::rnic_kill(killed)?;
    sleep_until(t + tl.fw);
    rxefabric::rnic_heal(killed)?;
    tl.phase("rnic_killed", &killed_rnic, "rnic", t, now_ns());
    Ok(())
}

/// The first quiet gap, in which the two RC connections through the uplink fault start.
fn rc_start_gap(tl: &mut Timeline) -> anyhow::Result<RcPairs> {
    let (w, fw) = (tl.w, tl.fw);
    let gap_from = now_ns();
    // Two real RC connections through the uplink fault to come: A across the lossy uplink, B not.
    let rc_s = (2 * w + fw) / 1_000_000_000 + 5;
    let pair_a = rxefabric::start_rc("tor0-h0", "tor1-h1", rxefabric::TOOL_PORT, rc_s)?;
    let pair_b = rxefabric::start_rc("tor0-h1", "tor2-h1", rxefabric::TOOL_PORT + 1, rc_s)?;
    sleep_until(gap_from + 2 * w);
    tl.phase("gap1", "", "", gap_from, now_ns());
    Ok(RcPairs { a: pair_a, b: pair_b, seconds: rc_s })
}

/// Netem loss on one ToR's uplink for a fault phase, then healed; the ToR.
fn uplink_loss_phase(tl: &mut Timeline, loss_percent: f64) -> anyhow::Result<&'static str> {
    let lossy = "tor1";
    let t = now_ns();
    rxefabric::uplink_loss(lossy, loss_percent)?;
    sleep_until(t + tl.fw);
    rxefabric::uplink_heal(lossy)?;
    tl.phase("uplink_loss", &format!("{lossy}|{}", rxefabric::SPINE), "link", t, now_ns());
    Ok(lossy)
}

/// The second quiet gap, in which the RC connections end; how each end exited, and when.
fn rc_end_gap(tl: &mut Timeline, rc: RcPairs) -> (Vec<String>, u64) {
    let RcPairs { a: pair_a, b: pair_b, seconds: rc_s } = rc;
    let gap_from = now_ns();
    let mut perftest = Vec::new();
    for (name, pair) in [("A", pair_a), ("B", pair_b)] {
        let left = Duration::from_secs(rc_s + 30);
        let (c, s) = (pair.client.finish(left), pair.server.finish(Duration::from_secs(10)));
        perftest.push(format!("{name}: client {}, server {}", c.describe(), s.describe()));
    }
    let perftest_ended_ns = now_ns();
    sleep_until(gap_from + 2 * tl.w);
    tl.phase("gap2", "", "", gap_from, now_ns());
    (perftest, perftest_ended_ns)
}

/// A host's rxe device deleted under its agent and added back, then recovery; the host and RNIC.
fn rdma_deleted_phase(
    tl: &mut Timeline,
    opts: &LabOptions,
    scrapes: &mut crate::rxemetrics::Scrapes,
) -> anyhow::Result<(&'static str, String)> {
    let (w, fw) = (tl.w, tl.fw);
    let bin = |name: &str| opts.bin.join(name);
    let removed = "tor2-h0";
    let removed_rnic = format!("{removed}/{}", rxefabric::device_name(removed));
    scrapes.removed = (removed.to_owned(), rxefabric::device_name(removed));
    scrapes.before_removal = crate::rxemetrics::scrape(&bin("testbeds"), removed)?;
    let t = now_ns();
    rxefabric::rdma_delete(removed)?;
    sleep_until(t + w);
    scrapes.during_removal = crate::rxemetrics::scrape(&bin("testbeds"), removed)?;
    sleep_until(t + 2 * w);
    rxefabric::rdma_add(removed)?;
    let back = now_ns();
    tl.phase("rdma_deleted", &removed_rnic, "rnic", t, back);
    sleep_until(back + fw);
    scrapes.after_readd = crate::rxemetrics::scrape(&bin("testbeds"), removed)?;
    tl.phase("recovered", "", "", back, now_ns());
    Ok((removed, removed_rnic))
}

/// A connection storm on a traced host, its agent's RSS around it, then a window of quiet.
fn storm_phase(tl: &mut Timeline, opts: &LabOptions, agents: &Agents) -> anyhow::Result<StormRun> {
    // A connection storm on a traced host: 1,000 RC QPs to RTR and destroyed.
    let storm_host = "tor1-h1";
    let storm_pid = agents.pid(storm_host).with_context(|| format!("no agent runs on {storm_host}"))?;
    let rss_before = rxeservices::rss_kib(storm_pid)?;
    let storm_from = now_ns();
    let storm = storm_in(&opts.bin.join("testbeds"), storm_host, "tor1-h0", 1_000)?;
    let rss_after = rxeservices::rss_kib(storm_pid)?;
    let storm_to = now_ns();
    sleep_until(storm_to + tl.w);
    tl.phase("storm", "", "", storm_from, now_ns());
    Ok(StormRun { host: storm_host, storm, rss_before, rss_after, from: storm_from, to: storm_to })
}

/// `analyze localize` over the lab's segments, its JSON parsed.
fn localize_findings(opts: &LabOptions, inventory: &Path) -> anyhow::Result<serde_json::Value> {
    // The lab's agents write no window summaries: the records, as `auto` would read them.
    let out = localize(&opts.bin.join("analyze"), opts.window_s, inventory, &opts.lab, "records")?;
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("analyze localize printed no JSON ({})", String::from_utf8_lossy(&out.stderr)))
}

/// The storm's result: agent RSS, service counts, the host's probe rate in it and when clean.
fn storm_result(
    lab: &Path,
    records: &[Rec],
    run: &StormRun,
    clean_from: u64,
    fw: u64,
) -> anyhow::Result<rxeservices::StormResult> {
    let storm_host = run.host;
    let storm_log_path = lab.join("agents").join(format!("{storm_host}.log"));
    let storm_log =
        std::fs::read_to_string(&storm_log_path).with_context(|| format!("reading {}", storm_log_path.display()))?;
    let per_s = |from: u64, to: u64| {
        let n = records
            .iter()
            .filter(|r| r.prober.starts_with(&format!("{storm_host}/")) && r.t1_ns >= from && r.t1_ns < to)
            .count();
        n as f64 / ((to - from) as f64 / 1e9)
    };
    Ok(rxeservices::StormResult {
        host: storm_host.into(),
        qps: run.storm.qps,
        seconds: run.storm.seconds,
        rss_kib_before: run.rss_before,
        rss_kib_after: run.rss_after,
        services_added: rxeservices::max_stat(&storm_log, "services_added"),
        services_refused_rate: rxeservices::max_stat(&storm_log, "services_refused_rate"),
        services_active_max: rxeservices::max_stat(&storm_log, "services_peak"),
        probes_per_s_storm: per_s(run.from, run.to.max(run.from + 1)),
        probes_per_s_clean: per_s(clean_from, clean_from + fw),
    })
}

fn verdicts(
    phases: &[Phase],
    recs: &[Rec],
    findings: &serde_json::Value,
    removed_host: &str,
    removed_rnic: &str,
    window_ns: u64,
) -> Vec<Check> {
    let mut checks = Vec::new();
    let list: Vec<(String, String, u64, u64)> = findings["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["kind"].as_str().unwrap_or("").to_owned(),
                        f["entity"].as_str().unwrap_or("").to_owned(),
                        f["start_ns"].as_u64().unwrap_or(0),
                        f["end_ns"].as_u64().unwrap_or(u64::MAX),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let network = |k: &str| matches!(k, "rnic" | "tor" | "link" | "spine" | "ambiguous");
    let overlaps = |a: u64, b: u64, c: u64, d: u64| a < d && c < b;
    // A finding names an injected fault: same kind and entity, overlapping its phase (plus one
    // window, as findings start and end on window boundaries).
    let names = |f: &(String, String, u64, u64), p: &Phase| {
        !p.expect.is_empty() && f.0 == p.expect && f.1 == p.entity && overlaps(f.2, f.3, p.from_ns, p.to_ns + window_ns)
    };
    // Clean phase: no loss at all, no finding.
    if let Some(p) = phases.iter().find(|p| p.name == "clean") {
        let in_phase: Vec<&Rec> = recs.iter().filter(|r| r.t1_ns >= p.from_ns && r.t1_ns < p.to_ns).collect();
        let mut by: BTreeMap<u8, u64> = BTreeMap::new();
        for r in &in_phase {
            *by.entry(r.outcome).or_default() += 1;
        }
        let lost = by.get(&(Outcome::Lost as u8)).copied().unwrap_or(0);
        let ok = by.get(&(Outcome::Ok as u8)).copied().unwrap_or(0);
        let mut rtts: Vec<i32> = in_phase.iter().filter(|r| r.outcome == Outcome::Ok as u8).map(|r| r.rtt_ns).collect();
        rtts.sort_unstable();
        let q = |f: f64| rtts.get(((rtts.len() as f64 * f) as usize).min(rtts.len().saturating_sub(1))).copied();
        checks.push(Check {
            name: "clean run: zero loss".into(),
            ok: lost == 0 && ok > 100,
            detail: format!(
                "{} probes: ok {ok}, lost {lost}, other {:?}; network RTT p50 {:?} ns, p99 {:?} ns",
                in_phase.len(),
                by.iter().filter(|(k, _)| **k > 1).collect::<Vec<_>>(),
                q(0.5),
                q(0.99)
            ),
        });
        let noisy: Vec<String> = list
            .iter()
            .filter(|f| network(&f.0) && overlaps(f.2, f.3, p.from_ns, p.to_ns))
            .map(|f| format!("{} {}", f.0, f.1))
            .collect();
        checks.push(Check::none_of("clean run: no finding", &noisy));
    }
    // Each fault: found, as the right kind and entity, overlapping its phase.
    for p in phases.iter().filter(|p| !p.expect.is_empty()) {
        let hit = list.iter().find(|f| names(f, p));
        checks.push(Check {
            name: format!("{}: localised", p.name),
            ok: hit.is_some(),
            detail: match hit {
                Some(f) => format!("{} {} from {} to {}", f.0, f.1, f.2, f.3),
                None => format!("expected {} {}; findings: {:?}", p.expect, p.entity, list),
            },
        });
    }
    // Nothing else blamed: every network finding from the clean phase on matches an injected
    // fault. Findings that end before it are about the agents starting, six at once under TCG
    // (once: "6/26 probes crossing it slow" in the first, partial window), not the fabric.
    let timeline_from = phases.first().map_or(0, |p| p.from_ns);
    let stray: Vec<String> = list
        .iter()
        .filter(|f| network(&f.0) && f.3 > timeline_from)
        .filter(|f| !phases.iter().any(|p| names(f, p)))
        .map(|f| format!("{} {}", f.0, f.1))
        .collect();
    checks.push(Check::none_of("no stray findings", &stray));
    // Recovery: after the device came back, the host probes again and is probed again.
    if let Some(p) = phases.iter().find(|p| p.name == "recovered") {
        let after = |r: &&Rec| r.t1_ns >= p.from_ns && r.t1_ns < p.to_ns && r.outcome == Outcome::Ok as u8;
        let own = recs.iter().filter(after).filter(|r| r.prober.starts_with(&format!("{removed_host}/"))).count();
        let to_it = recs.iter().filter(after).filter(|r| r.target == removed_rnic).count();
        let first_ok = recs
            .iter()
            .filter(|r| r.t1_ns >= p.from_ns && r.outcome == Outcome::Ok as u8 && r.target == removed_rnic)
            .map(|r| r.t1_ns)
            .min()
            .map(|t| (t - p.from_ns) as f64 / 1e9);
        checks.push(Check {
            name: "recovery: probing resumed".into(),
            ok: own > 0 && to_it > 0,
            detail: format!(
                "after the device returned: {own} ok probes from {removed_host}, {to_it} ok probes to it \
                 (first {first_ok:?} s after re-add)"
            ),
        });
    }
    checks
}

/// `bench` in the VM: the agent beside perftest on the same rxe path, as ratios (TCG makes
/// absolute numbers meaningless).
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub perftest: rxefabric::PerftestResult,
    /// The prober's CPU (percent of a core) at `tracer_bench_pps` in event mode, without and
    /// with the service tracer loaded (and idle: no QP events), and their ratio.
    pub tracer_bench_pps: f64,
    pub tracer_off_cpu_percent: f64,
    pub tracer_on_cpu_percent: f64,
    pub tracer_cpu_ratio: f64,
    /// The agent's network RTT (the six-timestamp RTT, responder time removed), p50, us.
    pub agent_rtt_us_p50: f64,
    /// ib_send_lat's typical one-way latency, doubled (a round trip), us.
    pub perftest_rtt_us: f64,
    /// agent RTT p50 / perftest round trip.
    pub rtt_ratio: f64,
    /// The same with both agents busy-polling, as perftest does.
    pub agent_busy_rtt_us_p50: f64,
    /// agent busy-poll RTT p50 / perftest round trip.
    pub busy_rtt_ratio: f64,
    /// Probes per second the prober completed (ACK1 and ACK2 in), offered far above what it can do.
    pub agent_probes_per_s: f64,
    /// Packets per second that is (probe, ACK1, ACK2).
    pub agent_packets_per_s: f64,
    /// ib_send_bw -c UD messages per second.
    pub perftest_msgs_per_s: f64,
    /// agent packets/s / perftest messages/s.
    pub rate_ratio: f64,
    /// Probes offered, completed, lost in the rate run.
    pub offered: u64,
    pub completed: u64,
    pub lost: u64,
}

/// Perftest first, then one agent pair at `rtt_pps` (RTT) and at `flood_pps` (rate), each for
/// `seconds`, between two hosts under different ToRs.
/// Probe rate of the tracer cost runs (event mode).
const TRACER_BENCH_PPS: f64 = 200.0;

pub fn bench(opts: &LabOptions, rtt_pps: f64, flood_pps: f64, seconds: u64) -> anyhow::Result<BenchResult> {
    let lab = &opts.lab;
    crate::rxemetrics::mount_host_sysfs()?;
    let layout = Layout::new(2, 1)?;
    let inv = rxefabric::up(layout)?;
    let inventory = lab.join("bench-inventory.toml");
    rxefabric::write_inventory(&inv, &inventory)?;
    let (a, b) = (Layout::host_name(0, 0), Layout::host_name(1, 0));
    let perftest = rxefabric::perftest(&b, &a, rxefabric::PerftestOptions::default())?;
    let mut runs = Vec::new();
    // The service tracer's idle cost: the same event-mode workload with the tracer loaded (no
    // QP events while it runs) and without, back to back, prober CPU over the steady span.
    let mut tracer_cpu = Vec::new();
    let runs_spec = [
        ("rtt", rtt_pps),
        ("rtt-busy", rtt_pps),
        ("rate", flood_pps),
        ("tracer-off", TRACER_BENCH_PPS),
        ("tracer-on", TRACER_BENCH_PPS),
    ];
    for (name, pps) in runs_spec {
        let dir = lab.join(format!("bench-{name}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        // Only `a` probes; `b` answers (its pinglist targets nobody: inter-ToR rate 0 is refused
        // by ctl, so the pinglists are written here).
        let mut agents = Agents { children: Vec::new() };
        for (host, peer) in [(&a, Some(&b)), (&b, None)] {
            let h = rxefabric::host(&inv, host)?;
            let mut pl =
                format!("version = 1\nhost = \"{host}\"\ngeneration = 1\ngenerated_unix_ns = 0\ntimeout_ms = 1000\n");
            if let Some(peer) = peer {
                let p = rxefabric::host(&inv, peer)?;
                // A pinglist caps one target at 1000 probes/s: the flood is several targets
                // (names suffixed .bK) on the same responder.
                let n = (pps / rocemesh_formats::pinglist::MAX_RATE_PPS_PER_TARGET).ceil().max(1.0) as usize;
                for k in 0..n {
                    let to = if k == 0 { format!("{peer}/{}", p.device) } else { format!("{peer}/{}.b{k}", p.device) };
                    pl.push_str(&format!(
                        "\n[[target]]\nfrom = \"{}\"\nto = \"{to}\"\nkind = \"inter_tor\"\naddr = \"{}\"\n\
                         port = {AGENT_PORT}\nrate_pps = {}\nflow_labels = [1, 2, 3, 4]\n",
                        h.device,
                        p.ip,
                        pps / n as f64
                    ));
                }
            }
            let plp = dir.join(format!("{host}.pinglist.toml"));
            std::fs::write(&plp, pl)?;
            let spec = AgentSpec {
                host,
                device: &h.device,
                tor: &h.tor,
                ip: h.ip,
                pinglist: &plp,
                segments: &local_segments().join(format!("bench-{name}")).join(host),
                // RTT in event mode (what the testbed runs) and with both ends busy-polling
                // (as perftest does); the rate run busy-polls on the prober.
                mode: match (name, peer.is_some()) {
                    ("rtt-busy", _) | ("rate", true) => "busy_poll",
                    _ => "event",
                },
                core: usize::from(peer.is_none()),
                stats_interval_s: 5,
                flush_interval_ms: 1_000,
                rust_log: "info",
                duration_s: Some(seconds + 4),
                service_tracing: name == "tracer-on",
                view_allow: None,
            };
            let child = start_agent(&opts.bin.join("agent"), &spec, &dir)?;
            agents.children.push((host.clone(), child));
        }
        // CPU over the steady span (after start-up, BPF load and QPN resolution; before drain).
        std::thread::sleep(Duration::from_secs(3));
        let cpu_from = agents.cpu_ticks()?;
        std::thread::sleep(Duration::from_secs(seconds - 2));
        let cpu_to = agents.cpu_ticks()?;
        std::thread::sleep(Duration::from_secs(5));
        agents.stop();
        if name.starts_with("tracer") {
            let cpu = TracerCpu::new(&cpu_from, &cpu_to, (seconds - 2) as f64);
            let prober = cpu.per_agent.iter().find(|(h, _, _)| h == &a).map_or(f64::NAN, |x| x.2);
            tracer_cpu.push(prober);
        }
        copy_tree(&local_segments().join(format!("bench-{name}")), &dir.join("segments"))?;
        let recs = read_records(&dir.join("segments"))?;
        let mine: Vec<&Rec> = recs.iter().filter(|r| r.prober.starts_with(&format!("{a}/"))).collect();
        // Skip the first 2 s (QPN resolution) and the drain at the end.
        let t_min = mine.iter().map(|r| r.t1_ns).min().unwrap_or(0) + 2_000_000_000;
        let t_max = t_min + (seconds - 2) * 1_000_000_000;
        let steady: Vec<&&Rec> = mine.iter().filter(|r| r.t1_ns >= t_min && r.t1_ns < t_max).collect();
        let ok: Vec<i32> = {
            let mut v: Vec<i32> = steady.iter().filter(|r| r.outcome == Outcome::Ok as u8).map(|r| r.rtt_ns).collect();
            v.sort_unstable();
            v
        };
        let lost = steady.iter().filter(|r| r.outcome == Outcome::Lost as u8).count() as u64;
        runs.push((steady.len() as u64, ok, lost, (seconds - 2) as f64));
    }
    let (_, rtt_ok, _, _) = &runs[0];
    if rtt_ok.is_empty() {
        bail!("the RTT run completed no probe; see {}/bench-rtt/*.log", lab.display());
    }
    let agent_rtt_us_p50 = f64::from(rtt_ok[rtt_ok.len() / 2]) / 1e3;
    let (_, busy_ok, _, _) = &runs[1];
    let agent_busy_rtt_us_p50 = busy_ok.get(busy_ok.len() / 2).map_or(f64::NAN, |&v| f64::from(v) / 1e3);
    let perftest_rtt_us = 2.0 * perftest.latency.typical_us;
    let (offered, rate_ok, lost, secs) = &runs[2];
    let agent_probes_per_s = rate_ok.len() as f64 / secs;
    let perftest_msgs_per_s = perftest.bandwidth.msgs_per_s();
    let result = BenchResult {
        agent_rtt_us_p50,
        perftest_rtt_us,
        rtt_ratio: agent_rtt_us_p50 / perftest_rtt_us,
        agent_busy_rtt_us_p50,
        busy_rtt_ratio: agent_busy_rtt_us_p50 / perftest_rtt_us,
        agent_probes_per_s,
        agent_packets_per_s: 3.0 * agent_probes_per_s,
        perftest_msgs_per_s,
        rate_ratio: 3.0 * agent_probes_per_s / perftest_msgs_per_s,
        offered: *offered,
        completed: rate_ok.len() as u64,
        lost: *lost,
        perftest,
        tracer_bench_pps: TRACER_BENCH_PPS,
        tracer_off_cpu_percent: tracer_cpu[0],
        tracer_on_cpu_percent: tracer_cpu[1],
        tracer_cpu_ratio: tracer_cpu[1] / tracer_cpu[0],
    };
    std::fs::write(lab.join("bench.json"), serde_json::to_vec_pretty(&result)?)?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &str, entity: &str, expect: &str, from_ns: u64, to_ns: u64) -> Phase {
        Phase { name: name.into(), entity: entity.into(), expect: expect.into(), from_ns, to_ns }
    }

    fn check<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).expect("the check exists")
    }

    #[test]
    fn start_up_findings_are_not_stray_but_timeline_ones_are() {
        let phases = [phase("clean", "", "", 100, 200), phase("rnic_killed", "h1/d", "rnic", 200, 300)];
        let finding = |kind: &str, entity: &str, start: u64, end: u64| serde_json::json!({ "kind": kind, "entity": entity, "start_ns": start, "end_ns": end });
        // Before the clean phase (agents starting) and the injected fault: nothing stray.
        let quiet =
            serde_json::json!({ "findings": [finding("rnic", "h9/d", 90, 100), finding("rnic", "h1/d", 200, 300)] });
        let checks = verdicts(&phases, &[], &quiet, "none", "none/d", 10);
        assert!(check(&checks, "no stray findings").ok, "{:?}", check(&checks, "no stray findings"));
        assert!(check(&checks, "rnic_killed: localised").ok);
        // The same RNIC blamed once the timeline has begun is stray.
        let stray =
            serde_json::json!({ "findings": [finding("rnic", "h9/d", 200, 210), finding("rnic", "h1/d", 200, 300)] });
        let checks = verdicts(&phases, &[], &stray, "none", "none/d", 10);
        let c = check(&checks, "no stray findings");
        assert!(!c.ok && c.detail.contains("h9/d"), "{c:?}");
    }
}
