//! `testbeds clos`: a two-tier Clos fabric of network namespaces on the host kernel
//! ([`net`]: 2 spines, 4 ToRs, 3 hosts per ToR, routed with ECMP over the spines), one real
//! `agent` per host on the UDP transport, set up by the operator's flow ([`ops`]: `agent
//! describe` on each host, `ctl inventory import`, `ctl inventory lldp` over the fabric's real
//! LLDP tables, `ctl gen-pinglists`, `ctl push-pinglist` over ssh from the management network),
//! faults injected on a timeline
//! with nftables and signals, and the verdict of `analyze localize`, scored as the simulator's
//! accuracy suite scores it ([`crate::score`]) against a [`Scenario`] carrying the real times.
//! Runs as root; needs `ip`, `nft` and `ping`, no RDMA and no netem.
//!
//! Timeline (every phase a whole number of analysis windows, so no window mixes two phases):
//! warm-up, clean, a host's ToR port down (`rnic_down`), gap, one ToR-spine link dropping 25 %
//! both ways (`link_loss`), gap, a spine dropping 5 % on all its links (`spine_loss`), gap, an
//! agent SIGKILLed and restarted (`agent_restart`: no network finding), an agent stopped 2 s of
//! every 5 (`host_stall`: no network finding around it), tail.
//!
//! With path tracing in the agents (`[path_tracing]`, used when the agent accepts it), the run
//! also checks the traces against the kernel ([`traces`]): the spine a trace found for a flow
//! label is the next hop `ip route get` gives for that label's UDP 5-tuple.
//!
//! Everything lands under `--out`: descriptions/ (what `agent describe` said), inventory.toml,
//! lldp/ (the tables), generated/ (the bastion's pinglists), ssh/ (keys, configs, sshd logs,
//! push results), pinglists/ (what the push installed on each host), agents/ (configs and logs),
//! segments/, faults/ (the nft rules), scenario.toml, localize.json (from the records),
//! localize-summaries.json (from the window summaries), live.jsonl (what `analyze live` wrote,
//! each line with its arrival time), switch-counters.om (the switches' port counters, sampled
//! each second: [`counters`]), localize-switches.json (localised with those counters served by
//! a real Prometheus, under prometheus/), localize-tor-addrs-unlisted.json and
//! localize-addrs-from-prometheus.json (localised without the ToRs' addresses, and without any
//! switch address but those the switches' IP-MIB series give), prometheus-live/ (the Prometheus
//! that scraped them through the run for `analyze live --prometheus`), result.json.
//!
//! The agents also push their window summaries and path traces to `analyze live` on the
//! management network ([`live`]): its findings are scored by the same checks, and each fault it
//! must find is timed from injection to its `open` line.

pub mod counters;
pub mod live;
pub mod lldp;
pub mod net;
pub mod ops;
pub mod traces;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rocemesh_formats::pinglist::{Pinglist, ProbeKind};
use rocemesh_formats::record::Outcome;
use rocemesh_formats::scenario::{Fault, FaultKind, Normal, Probing, Quantiles, Scenario, Topology, TsModel};
use serde::Serialize;

use crate::harness::{AGENT_PORT, Agents, Check, Phase, now_ns, read_records, spawn_agent};
use crate::score::{self, Finding};
use net::{DEVICE, Fabric, Plan};
use traces::{HostPorts, Ports, TraceCheck};

/// The fabric: spines, ToRs, hosts per ToR.
pub const SPINES: u32 = 2;
pub const TORS: u32 = 4;
pub const HOSTS_PER_TOR: u32 = 3;

/// Whose fault is whose: (ToR, host) or indexes.
const RNIC_DOWN: (u32, u32) = (1, 2);
const LOSSY_LINK: (u32, u32) = (1, 0);
const LOSSY_SPINE: u32 = 1;
const RESTARTED: (u32, u32) = (3, 0);
const STALLED: (u32, u32) = (2, 1);
/// host_stall: stopped this long every period.
const STALL_MS: u64 = 2_000;
const STALL_PERIOD_MS: u64 = 5_000;

/// Whether the agents trace paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PathTracing {
    /// When the agent accepts `[path_tracing]` (`agent check-config`).
    Auto,
    On,
    Off,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ClosOptions {
    /// Configs, logs, segments, findings and the result go here.
    pub out: PathBuf,
    /// Where the `agent`, `ctl` and `analyze` binaries are.
    pub bin: PathBuf,
    /// Analysis window, s.
    pub window_s: u64,
    /// Windows per fault phase.
    pub fault_windows: u64,
    /// Probe rates per target.
    pub tor_mesh_pps: f64,
    pub inter_tor_pps: f64,
    /// UDP source-port sockets per agent (flow labels).
    pub source_ports: usize,
    pub path_tracing: PathTracing,
    /// Loss on the faulty link and spine, percent.
    pub link_loss_percent: u32,
    pub spine_loss_percent: u32,
    /// (source, destination, label) tuples the trace check compares with the kernel.
    pub trace_samples: usize,
}

impl ClosOptions {
    pub fn new(out: PathBuf, bin: PathBuf) -> Self {
        ClosOptions {
            out,
            bin,
            window_s: 10,
            fault_windows: 3,
            tor_mesh_pps: 5.0,
            inter_tor_pps: 10.0,
            source_ports: 8,
            path_tracing: PathTracing::Auto,
            link_loss_percent: 25,
            // 5%, not 3%: at 3% a window holds a few dozen losses on the spine, and in one run
            // of this session chance piled enough of them on one of its links for `analyze` to
            // name that link too (a statistics problem of the localiser, issue 17, not of the
            // traces).
            spine_loss_percent: 5,
            trace_samples: 200,
        }
    }
}

/// Everything a run found.
#[derive(Debug, Clone, Serialize)]
pub struct ClosResult {
    /// The namespace prefix of the run (`rmc<pid>`).
    pub fabric: String,
    pub phases: Vec<Phase>,
    pub checks: Vec<Check>,
    /// `Score::render()` of the findings against the run's scenario.
    pub score: String,
    pub precision: f64,
    pub recall: f64,
    /// The same, localised from the agents' window summaries (`analyze localize --evidence
    /// summaries`).
    pub precision_summaries: f64,
    pub recall_summaries: f64,
    /// Findings that ended before the timeline began (agents starting), not scored.
    pub start_up_findings: Vec<String>,
    pub path_tracing: bool,
    /// Whether the inventory lists each switch's addresses.
    pub inventory_addrs: bool,
    pub traces: Option<TraceCheck>,
    /// During the lossy link: how soon lost probes' paths were traced again.
    pub retrace_after_loss: Option<traces::RetraceAfterLoss>,
    /// Packets each fault's nft rules dropped.
    pub fault_drops: BTreeMap<String, u64>,
    pub records: u64,
    pub seconds: f64,
    /// What `analyze live` said during the timeline.
    pub live: Option<live::LiveResult>,
}

impl ClosResult {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    /// The score table, then the checks.
    pub fn render(&self) -> String {
        let mut s = self.score.clone();
        s.push('\n');
        for c in &self.checks {
            s.push_str(&format!("{:4}  {:44} {}\n", if c.ok { "ok" } else { "FAIL" }, c.name, c.detail));
        }
        if let Some(r) = &self.retrace_after_loss {
            s.push_str(&format!("retrace after loss (link_loss phase): {}\n", r.summary()));
        }
        s.push_str(&format!(
            "path tracing {}; {} probe records; {:.0} s\n",
            if self.path_tracing { "on" } else { "off" },
            self.records,
            self.seconds
        ));
        s
    }
}

// Ctrl-C, SIGTERM and SIGHUP end the run between two steps: the sleeps poll this flag, and the
// guards (agents, then the fabric) clean up as the error unwinds.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe; the
        // sigaction struct is fully initialised (zeroed, then the handler set).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&raw mut sa.sa_mask);
            libc::sigaction(sig, &raw const sa, std::ptr::null_mut());
        }
    }
}

fn interrupted() -> anyhow::Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; the fabric and the agents are being removed");
    }
    Ok(())
}

/// Sleeps until `t_ns` (wall clock), waking for signals.
fn sleep_until(t_ns: u64) -> anyhow::Result<()> {
    loop {
        interrupted()?;
        let now = now_ns();
        if now >= t_ns {
            return Ok(());
        }
        std::thread::sleep(Duration::from_nanos((t_ns - now).min(100_000_000)));
    }
}

/// The first window boundary after `now_ns` (windows are wall-clock aligned, as analyze's are).
pub fn next_boundary(now_ns: u64, window_ns: u64) -> u64 {
    (now_ns / window_ns + 1) * window_ns
}

/// Root, the tools, and the binaries; says what is missing and how to get it.
fn preflight(bin: &Path) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("testbeds clos builds network namespaces and nftables rules: run it as root");
    }
    for (tool, package) in [
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("ping", "iputils-ping"),
        ("promtool", "prometheus"),
        ("prometheus", "prometheus"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
        ("/usr/sbin/sshd", "openssh-server"),
    ] {
        if Command::new(tool).arg("-V").output().is_err() {
            bail!("`{tool}` is not installed: apt-get install {package}");
        }
    }
    lldp::preflight()?;
    for b in ["agent", "ctl", "analyze"] {
        if !bin.join(b).is_file() {
            bail!(
                "no {b} binary in {} (build them: cargo build -p rocemesh-agent -p rocemesh-ctl -p rocemesh-analyze; \
                 or pass --bin)",
                bin.display()
            );
        }
    }
    Ok(())
}

/// `ctl inventory lldp` over the fabric's real LLDP tables, on `inventory` as `ctl inventory
/// import` made it (no ports, no switch addresses). The check: every link and RNIC port
/// learned, and every address the switches answer traces from. Returns it and whether the
/// inventory names switches by address.
fn lldp_inventory(opts: &ClosOptions, plan: &Plan, inventory: &Path, dir: &Path) -> anyhow::Result<(Check, bool)> {
    let nodes = lldp::nodes(plan);
    let mut daemons = lldp::start(plan, &nodes, dir)?;
    daemons.collect(&nodes, dir)?;
    drop(daemons);
    let (code, said) = lldp::learn(&opts.bin.join("ctl"), inventory, dir)?;
    let learned = rocemesh_formats::inventory::Inventory::load(inventory)?;
    let has = |name: &str| -> Vec<std::net::IpAddr> {
        let tor = learned.tors.iter().find(|t| t.name == name).map(|t| &t.addrs);
        tor.or(learned.spines.iter().find(|s| s.name == name).map(|s| &s.addrs)).cloned().unwrap_or_default()
    };
    let planned = (0..plan.tors)
        .map(|t| (Plan::tor(t), plan.tor_addrs(t)))
        .chain((0..plan.spines).map(|s| (Plan::spine(s), plan.spine_addrs(s))));
    let mut missing = Vec::new();
    for (name, addrs) in planned {
        let learned = has(&name);
        missing.extend(addrs.into_iter().filter(|a| !learned.contains(&(*a).into())).map(|a| format!("{name} {a}")));
    }
    let complete = said.contains("still without ports: 0 links, 0 RNICs");
    let check = Check {
        name: "LLDP: every port and switch address learned".into(),
        ok: code == Some(0) && complete && missing.is_empty(),
        detail: format!(
            "{}; exit {code:?}; trace addresses not learned: {}",
            said.trim(),
            if missing.is_empty() { "none".into() } else { missing.join(", ") }
        ),
    };
    let named = learned.tors.iter().any(|t| !t.addrs.is_empty()) || learned.spines.iter().any(|s| !s.addrs.is_empty());
    Ok((check, named))
}

fn fresh_dir(p: &Path) -> anyhow::Result<()> {
    if p.exists() {
        std::fs::remove_dir_all(p).with_context(|| format!("clearing {}", p.display()))?;
    }
    std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))
}

/// The fabric's own checks: ECMP spreads UDP flows over every spine, hosts reach each other
/// across ToRs, and TTL expiry is answered by the source ToR, a spine and the destination ToR.
pub fn fabric_checks(fabric: &Fabric) -> anyhow::Result<Vec<Check>> {
    let plan = &fabric.plan;
    let mut checks = Vec::new();
    // ECMP: 32 source ports from host 0 of each ToR to host 0 of every other.
    let mut pairs = Vec::new();
    let mut narrow = Vec::new();
    for t in 0..plan.tors {
        for u in (0..plan.tors).filter(|&u| u != t) {
            let mut per_spine: BTreeMap<String, u32> = BTreeMap::new();
            for sport in (40_000..).step_by(97).take(32) {
                let r = fabric.route_get(t, 0, Plan::host_ip(u, 0), sport, AGENT_PORT)?;
                let spine = r.via.and_then(|v| plan.switch_of(v)).unwrap_or_else(|| format!("{r:?}"));
                *per_spine.entry(spine).or_default() += 1;
            }
            if per_spine.len() != plan.spines as usize || !per_spine.keys().all(|k| k.starts_with("spine")) {
                narrow.push(format!("tor{t}->tor{u} {per_spine:?}"));
            }
            pairs.push(per_spine.values().map(u32::to_string).collect::<Vec<_>>().join("/"));
        }
    }
    checks.push(Check {
        name: "fabric: ECMP over every spine".into(),
        ok: narrow.is_empty(),
        detail: if narrow.is_empty() {
            format!("32 UDP source ports per ToR pair, split per spine: {}", pairs.join(" "))
        } else {
            format!("pairs not spread over every spine: {}", narrow.join("; "))
        },
    });
    // Reachability: every host pings a host under the next ToR and its neighbour.
    let mut failed = Vec::new();
    let mut n = 0;
    for (t, h) in plan.hosts() {
        let mut dsts = vec![Plan::host_ip((t + 1) % plan.tors, h)];
        if plan.hosts_per_tor > 1 {
            dsts.push(Plan::host_ip(t, (h + 1) % plan.hosts_per_tor));
        }
        for d in dsts {
            n += 1;
            let host = Plan::host(t, h);
            if fabric.exec(&host, &["ping", "-n", "-q", "-c", "1", "-W", "2", &d.to_string()]).is_err() {
                failed.push(format!("{host} -> {d}"));
            }
        }
    }
    checks.push(Check {
        name: "fabric: hosts reach each other".into(),
        ok: failed.is_empty(),
        detail: if failed.is_empty() {
            format!("{n} pings answered")
        } else {
            format!("unanswered: {}", failed.join(", "))
        },
    });
    // TTL expiry: 1 -> source ToR, 2 -> a spine, 3 -> destination ToR.
    let mut seen = Vec::new();
    let mut ok = true;
    for (src, dst) in [((0, 0), (1, 1)), ((2, 2), (3, 0)), ((1, 1), (0, 2))] {
        if src.0 >= plan.tors || dst.0 >= plan.tors || src.1 >= plan.hosts_per_tor || dst.1 >= plan.hosts_per_tor {
            continue;
        }
        let want = [Plan::tor(src.0), "spine".to_string(), Plan::tor(dst.0)];
        let mut got = Vec::new();
        for (i, w) in want.iter().enumerate() {
            let ttl = (i + 1).to_string();
            let out = Command::new("ip")
                .args(["netns", "exec", &plan.ns(&Plan::host(src.0, src.1)), "ping", "-n", "-c", "1", "-W", "2"])
                .args(["-t", &ttl, &Plan::host_ip(dst.0, dst.1).to_string()])
                .output()
                .context("running ping")?;
            let from = net::parse_ttl_exceeded(&String::from_utf8_lossy(&out.stdout));
            let switch = from.and_then(|a| plan.switch_of(a));
            ok &= switch.as_ref().is_some_and(|s| s.starts_with(w.as_str()));
            got.push(format!("{} ({})", from.map_or("-".into(), |a| a.to_string()), switch.unwrap_or_default()));
        }
        seen.push(format!("{} -> {}: {}", Plan::host(src.0, src.1), Plan::host(dst.0, dst.1), got.join(", ")));
    }
    checks.push(Check { name: "fabric: TTL 1/2/3 expire at ToR/spine/ToR".into(), ok, detail: seen.join("; ") });
    Ok(checks)
}

/// The `[path_tracing]` section of the agents' configs, tracing or not.
fn path_tracing_section(enabled: bool) -> String {
    format!("\n[path_tracing]\nenabled = {enabled}\nrefresh_s = 60\nmin_retrace_interval_s = 5\ntraces_per_s = 5.0\n")
}

/// One agent's configuration; `path_tracing`: the `[path_tracing]` section with `enabled` as
/// given, or none (an agent without path tracing refuses the section).
fn agent_config(opts: &ClosOptions, out: &Path, t: u32, h: u32, core: usize, path_tracing: Option<bool>) -> String {
    let host = Plan::host(t, h);
    let text = format!(
        "host = \"{host}\"\npinglist = \"{pl}\"\nsegment_dir = \"{seg}\"\nmode = \"event\"\n\
         stats_interval_s = 10\nflush_interval_ms = 200\nsegment_mib = 4\nsegment_quota_mib = 256\n\
         summary_window_s = {SUMMARY_WINDOW_S}\n\n\
         [live]\ncollectors = [\"{collector}:{port}\"]\n\n\
         [[shard]]\ndevice = \"{DEVICE}\"\ntransport = \"udp\"\ntor = \"{tor}\"\nbind = \"{ip}:{AGENT_PORT}\"\n\
         core = {core}\nsource_ports = {sp}\n",
        pl = out.join("pinglists").join(format!("{host}.toml")).display(),
        seg = out.join("segments").join(&host).display(),
        tor = Plan::tor(t),
        ip = Plan::host_ip(t, h),
        sp = opts.source_ports,
        collector = Plan::collector_ip(),
        port = live::PORT,
    );
    match path_tracing {
        Some(enabled) => format!("{text}{}", path_tracing_section(enabled)),
        None => text,
    }
}

/// The agents write window summaries of this many seconds, and the run is localised from them
/// as well as from the records (issue 35: every check holds either way).
const SUMMARY_WINDOW_S: u64 = 5;

fn config_path(out: &Path, host: &str) -> PathBuf {
    out.join("agents").join(format!("{host}.toml"))
}

/// The `[path_tracing]` the agents get: `Some(enabled)` when the agent takes the section
/// (`agent check-config` on a config with it), `None` when it refuses it (an agent without path
/// tracing; `--path-tracing on` then fails).
fn path_tracing_config(opts: &ClosOptions, out: &Path) -> anyhow::Result<Option<bool>> {
    let probe = out.join("agents").join("path-tracing-probe.toml");
    std::fs::write(&probe, agent_config(opts, out, 0, 0, 0, Some(true)))?;
    let r = Command::new(opts.bin.join("agent")).args(["check-config", "--config"]).arg(&probe).output()?;
    let _ = std::fs::remove_file(&probe);
    let err = String::from_utf8_lossy(&r.stderr);
    match (r.status.success(), opts.path_tracing) {
        (true, mode) => Ok(Some(mode != PathTracing::Off)),
        (false, PathTracing::Auto | PathTracing::Off) if err.contains("path_tracing") => Ok(None),
        _ => bail!("agent check-config refused the clos config: {}", err.trim()),
    }
}

fn start_agent(
    opts: &ClosOptions,
    plan: &Plan,
    agents: &mut Agents,
    t: u32,
    h: u32,
    log_name: &str,
) -> anyhow::Result<()> {
    let host = Plan::host(t, h);
    let log_path = opts.out.join("agents").join(log_name);
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let child = spawn_agent(
        &opts.bin.join("agent"),
        &plan.ns(&host),
        &config_path(&opts.out, &host),
        log,
        "info,rocemesh_agent=debug",
        None,
    )
    .with_context(|| format!("starting the agent of {host}"))?;
    agents.children.retain(|(n, _)| n != &host);
    agents.children.push((host, child));
    Ok(())
}

fn signal(agents: &Agents, host: &str, sig: libc::c_int) -> anyhow::Result<()> {
    let pid = agents.pid(host).with_context(|| format!("no agent runs on {host}"))?;
    // SAFETY: kill has no memory preconditions; the pid is our live child.
    if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
        bail!("signal {sig} to the agent of {host}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The timeline's bookkeeping: phases, the scenario's faults, what the nft rules dropped.
struct Timeline {
    phases: Vec<Phase>,
    faults: Vec<Fault>,
    drops: BTreeMap<String, u64>,
    /// Scenario t = 0, ns (a window boundary, whole seconds).
    start_ns: u64,
}

impl Timeline {
    fn phase(&mut self, name: &str, entity: &str, expect: &str, from_ns: u64, to_ns: u64) {
        self.phases.push(Phase { name: name.into(), entity: entity.into(), expect: expect.into(), from_ns, to_ns });
    }

    fn fault(&mut self, kind: FaultKind, target: &str, from_ns: u64, to_ns: u64, set: impl FnOnce(&mut Fault)) {
        let s = |ns: u64| (ns.saturating_sub(self.start_ns)) as f64 / 1e9;
        let mut f = Fault::new(kind, target, s(from_ns), Some(s(to_ns)));
        set(&mut f);
        self.faults.push(f);
    }
}

/// Loss on `nodes` ((node, its egress interfaces)) for `len_ns`; returns (from, to).
fn loss_phase(
    fabric: &Fabric,
    tl: &mut Timeline,
    faults_dir: &Path,
    nodes: &[(String, Vec<String>)],
    percent: u32,
    len_ns: u64,
) -> anyhow::Result<(u64, u64)> {
    let from = now_ns();
    for (node, oifs) in nodes {
        fabric.nft_load(node, &net::loss_rules(percent, oifs), faults_dir)?;
    }
    let slept = sleep_until(from + len_ns);
    for (node, _) in nodes {
        let dropped = fabric.nft_clear(node)?;
        *tl.drops.entry(format!("{node} {percent}%")).or_default() += dropped;
    }
    slept?;
    Ok((from, now_ns()))
}

/// The whole run. Errors are setup failures; a run whose checks fail returns Ok with
/// `passed() == false`.
pub fn run(opts: &ClosOptions) -> anyhow::Result<ClosResult> {
    run_with(opts, true)
}

/// Only the fabric, the agents with path tracing for a minute, and the trace-vs-kernel check.
pub fn check_traces(opts: &ClosOptions) -> anyhow::Result<ClosResult> {
    run_with(opts, false)
}

fn run_with(opts: &ClosOptions, timeline: bool) -> anyhow::Result<ClosResult> {
    preflight(&opts.bin)?;
    install_signal_handlers();
    let started = Instant::now();
    let removed = net::remove_stale()?;
    if !removed.is_empty() {
        eprintln!("testbeds clos: removed {} namespaces of earlier runs: {}", removed.len(), removed.join(" "));
    }
    let out = &opts.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let out = &out.canonicalize()?;
    for sub in ["agents", "segments", "pinglists", "faults", "lldp", "descriptions", "generated", "ssh"] {
        fresh_dir(&out.join(sub))?;
    }
    let plan = Plan::for_this_process(SPINES, TORS, HOSTS_PER_TOR)?;
    let fabric = Fabric::up(plan.clone())?;
    eprintln!("testbeds clos: fabric {} up ({:.1} s)", plan.prefix, started.elapsed().as_secs_f64());
    let mut checks = fabric_checks(&fabric)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let write_configs = |tracing: Option<bool>| -> anyhow::Result<()> {
        for (i, (t, h)) in plan.hosts().enumerate() {
            std::fs::write(config_path(out, &Plan::host(t, h)), agent_config(opts, out, t, h, i % cores, tracing))?;
        }
        Ok(())
    };
    // The operator's flow (ops): describe on every host, import, LLDP, generate, push over ssh.
    // The hosts describe themselves from their configs without [path_tracing]: whether this
    // agent takes the section is asked with `agent check-config`, which needs the pinglist
    // the push installs.
    write_configs(None)?;
    let inventory = out.join("inventory.toml");
    ops::describe(&opts.bin.join("agent"), &plan, |host| config_path(out, host), &out.join("descriptions"))?;
    checks.push(ops::import(&opts.bin.join("ctl"), &plan, &out.join("descriptions"), &inventory)?);
    let (lldp_check, inventory_addrs) = lldp_inventory(opts, &plan, &inventory, &out.join("lldp"))?;
    eprintln!(
        "testbeds clos: {} ({:.1} s)",
        lldp_check.detail.lines().next().unwrap_or(""),
        started.elapsed().as_secs_f64()
    );
    checks.push(lldp_check);
    // Every RNIC probes one RNIC under each other ToR.
    let (mesh, inter) = (opts.tor_mesh_pps, opts.inter_tor_pps);
    let generated = out.join("generated");
    crate::harness::gen_pinglists(&opts.bin.join("ctl"), &inventory, &generated, plan.tors - 1, mesh, inter, &[])?;
    let remote_path = out.join("pinglists").join("{host}.toml");
    let sshds = ops::Sshds::start(&plan, &out.join("ssh"))?;
    let push_check = sshds.push(&opts.bin.join("ctl"), &plan, &generated, &remote_path.to_string_lossy())?;
    drop(sshds);
    eprintln!("testbeds clos: {} ({:.1} s)", push_check.detail, started.elapsed().as_secs_f64());
    if !push_check.ok {
        bail!("the pinglists did not reach the hosts: {}", push_check.detail);
    }
    checks.push(push_check);
    let tracing_config = path_tracing_config(opts, out)?;
    write_configs(tracing_config)?;
    let tracing = tracing_config == Some(true);
    if tracing_config.is_none() {
        eprintln!(
            "testbeds clos: this agent refuses [path_tracing]: running without path traces (link and spine faults \
             cannot be localised with 2 spines, and the trace check is skipped)"
        );
    }
    if !timeline && !tracing {
        bail!("--check-traces needs agents that trace paths, and this agent refuses [path_tracing]");
    }
    // The switches' counters, sampled through the timeline, are also scraped as it runs by a
    // Prometheus on the management network, which the live analyzer asks.
    let mut scraped = match timeline {
        true => Some(counters::Scraped::start(&plan, &out.join("prometheus-live"))?),
        false => None,
    };
    let analyzer = match &scraped {
        Some(s) => {
            let before_s = opts.fault_windows * opts.window_s * 2;
            let log = out.join("agents").join("live.log");
            Some(live::start(&opts.bin, &plan, &inventory, SUMMARY_WINDOW_S, &log, Some((s.url(), before_s)))?)
        }
        None => None,
    };
    let mut agents = Agents { children: Vec::new() };
    let mut since: BTreeMap<String, u64> = BTreeMap::new();
    for (t, h) in plan.hosts() {
        let host = Plan::host(t, h);
        start_agent(opts, &plan, &mut agents, t, h, &format!("{host}.log"))?;
        since.insert(host, now_ns());
    }
    let w = opts.window_s * 1_000_000_000;
    // Agents up for a moment before the first whole window.
    sleep_until(now_ns() + 2_000_000_000)?;
    let t0 = next_boundary(now_ns(), w);
    sleep_until(t0)?;
    let mut tl = Timeline { phases: Vec::new(), faults: Vec::new(), drops: BTreeMap::new(), start_ns: t0 };
    let faults_dir = out.join("faults");
    if let Some(s) = &mut scraped {
        let ran = run_timeline(opts, &fabric, &mut agents, &mut tl, &faults_dir, &mut since);
        let samples = s.stop_sampling();
        ran?;
        let addresses = counters::switch_addresses(&plan)?;
        std::fs::write(out.join("switch-counters.om"), counters::openmetrics(&samples?, &addresses))?;
    } else {
        sleep_until(t0 + 6 * w)?;
        tl.phase("traced", "", "", t0, now_ns());
    }
    let end_ns = now_ns();

    // Trace check: ports while the agents run, traces once they have sealed their segments.
    let mut ports = Ports::default();
    let mut labels = traces::Labels::new();
    if tracing {
        for (t, h) in plan.hosts() {
            let host = Plan::host(t, h);
            let pl = Pinglist::load(out.join("pinglists").join(format!("{host}.toml")))?;
            labels.insert((t, h), traces::labels_of(&pl));
            // The log of the agent running now (the restarted one's is its second).
            let name = if since[&host] > t0 { format!("{host}.restarted.log") } else { format!("{host}.log") };
            // The testbed wrote this log itself: unreadable is an error, not "no ports in it".
            let log_path = out.join("agents").join(name);
            let log = std::fs::read_to_string(&log_path).with_context(|| format!("{}", log_path.display()))?;
            let from_log = traces::ports_from_log(&log);
            let (by_label, source) = if !from_log.is_empty() {
                (from_log, "log")
            } else {
                let pid = agents.pid(&host).context("agent gone")?;
                (traces::ports_from_proc(pid, t, h, &pl, AGENT_PORT)?, "proc")
            };
            let hp = HostPorts { since_ns: since[&host], restarted: since[&host] > t0, by_label, source };
            ports.hosts.insert(host, hp);
        }
    }
    agents.stop();
    // The agents push the windows they close as they stop.
    std::thread::sleep(Duration::from_millis(500));
    let live_lines = analyzer.map(live::Analyzer::stop).unwrap_or_default();
    drop(scraped);
    let text: String = live_lines.iter().map(|(at, l)| format!("{at} {l}\n")).collect();
    std::fs::write(out.join("live.jsonl"), text)?;
    let trace_check = if tracing {
        let found = traces::read_traces(&plan, &out.join("segments"))?;
        let c = traces::check(&fabric, &found, &labels, &ports, AGENT_PORT, opts.trace_samples)?;
        checks.push(Check { name: "path traces agree with the kernel".into(), ok: c.passed(), detail: c.summary() });
        Some(c)
    } else {
        None
    };
    drop(agents);
    drop(fabric);

    let records = read_records(&out.join("segments"))?;
    let mut result = ClosResult {
        fabric: plan.prefix.clone(),
        phases: tl.phases.clone(),
        checks,
        score: String::new(),
        precision: f64::NAN,
        recall: f64::NAN,
        precision_summaries: f64::NAN,
        recall_summaries: f64::NAN,
        start_up_findings: Vec::new(),
        path_tracing: tracing,
        inventory_addrs,
        traces: trace_check,
        retrace_after_loss: match tl.phases.iter().find(|p| p.name == "link_loss") {
            Some(p) if tracing => Some(traces::retrace_after_loss(&out.join("segments"), p.from_ns, p.to_ns)?),
            _ => None,
        },
        fault_drops: tl.drops.clone(),
        records: records.len() as u64,
        seconds: 0.0,
        live: None,
    };
    if timeline {
        let scenario = scenario(opts, out, &tl, end_ns, tracing)?;
        std::fs::write(out.join("scenario.toml"), scenario.to_toml_string()?)?;
        let mut from_records = Vec::new();
        for evidence in ["records", "summaries"] {
            let findings = localize(opts, out, &inventory, evidence)?;
            if evidence == "records" {
                from_records = findings.clone();
            }
            let (scored, early): (Vec<Finding>, Vec<Finding>) =
                findings.into_iter().partition(|f| f.end_ns.is_none_or(|e| e > tl.start_ns));
            let sc = score::score(&scenario, &scored);
            let mut checks = verdicts(&tl, &records, &scored, &sc, w, tracing);
            if evidence == "records" {
                result.start_up_findings = early.iter().map(|f| format!("{} {}", f.kind, f.entity)).collect();
                result.score = sc.render();
                result.precision = sc.precision();
                result.recall = sc.recall();
            } else {
                result.score.push_str(&format!("localised from the window summaries:\n{}", sc.render()));
                result.precision_summaries = sc.precision();
                result.recall_summaries = sc.recall();
                for c in &mut checks {
                    c.name = format!("{} (summaries)", c.name);
                }
            }
            result.checks.extend(checks);
        }
        if tracing {
            result.checks.extend(switch_counters_check(opts, out, &inventory, &from_records)?);
            result.checks.push(end_hops_check(opts, out, &inventory, &from_records)?);
        }
        let named = tracing && result.inventory_addrs;
        let (checks, live) = live_verdicts(&tl, &records, &scenario, &live_lines, w, named);
        result.checks.extend(checks);
        result.live = Some(live);
        if named {
            result.checks.push(live_switches_check(&live_lines));
        }
    }
    result.seconds = started.elapsed().as_secs_f64();
    std::fs::write(out.join("result.json"), serde_json::to_vec_pretty(&result)?)?;
    Ok(result)
}

fn run_timeline(
    opts: &ClosOptions,
    fabric: &Fabric,
    agents: &mut Agents,
    tl: &mut Timeline,
    faults_dir: &Path,
    since: &mut BTreeMap<String, u64>,
) -> anyhow::Result<()> {
    let plan = &fabric.plan;
    let w = opts.window_s * 1_000_000_000;
    let fw = opts.fault_windows * w;
    let t0 = tl.start_ns;
    tl.phase("warm-up", "", "", t0, t0 + w);
    sleep_until(t0 + w)?;
    let clean = t0 + w;
    sleep_until(clean + fw)?;
    tl.phase("clean", "", "", clean, clean + fw);

    // A host's ToR port down: its RNIC and cable are gone, the host is alive.
    let (t, h) = RNIC_DOWN;
    let rnic = format!("{}/{DEVICE}", Plan::host(t, h));
    let port = Plan::host_port(h);
    let from = now_ns();
    fabric.ip(&Plan::tor(t), &["link", "set", &port, "down"])?;
    let slept = sleep_until(from + fw);
    fabric.ip(&Plan::tor(t), &["link", "set", &port, "up"])?;
    slept?;
    let to = now_ns();
    tl.phase("rnic_down", &rnic, "rnic", from, to);
    tl.fault(FaultKind::RnicDown, &rnic, from, to, |_| {});
    let gap = now_ns();
    sleep_until(gap + w)?;
    tl.phase("gap1", "", "", gap, now_ns());

    // A lossy ToR-spine link, both directions.
    let (t, s) = LOSSY_LINK;
    let link = format!("{}|{}", Plan::tor(t), Plan::spine(s));
    let ends = [(Plan::tor(t), vec![Plan::uplink(s)]), (Plan::spine(s), vec![Plan::downlink(t)])];
    let (from, to) = loss_phase(fabric, tl, faults_dir, &ends, opts.link_loss_percent, fw)?;
    tl.phase("link_loss", &link, "link", from, to);
    let loss = f64::from(opts.link_loss_percent) / 100.0;
    tl.fault(FaultKind::LinkLoss, &link, from, to, |f| f.loss = Some(loss));
    let gap = now_ns();
    sleep_until(gap + w)?;
    tl.phase("gap2", "", "", gap, now_ns());

    // A lossy spine: every packet it sends out, whichever link.
    let spine = Plan::spine(LOSSY_SPINE);
    let every_port = (0..plan.tors).map(Plan::downlink).collect();
    let (from, to) = loss_phase(fabric, tl, faults_dir, &[(spine.clone(), every_port)], opts.spine_loss_percent, fw)?;
    tl.phase("spine_loss", &spine, "spine", from, to);
    let loss = f64::from(opts.spine_loss_percent) / 100.0;
    tl.fault(FaultKind::SpineLoss, &spine, from, to, |f| f.loss = Some(loss));
    let gap = now_ns();
    sleep_until(gap + w)?;
    tl.phase("gap3", "", "", gap, now_ns());

    // An agent SIGKILLed and started again: its peers lose a second of answers, the network
    // is fine.
    let (t, h) = RESTARTED;
    let host = Plan::host(t, h);
    let from = now_ns();
    sleep_until(from + 1_000_000_000)?;
    let killed = now_ns();
    signal(agents, &host, libc::SIGKILL)?;
    if let Some((_, c)) = agents.children.iter_mut().find(|(n, _)| n == &host) {
        let _ = c.wait();
    }
    start_agent(opts, plan, agents, t, h, &format!("{host}.restarted.log"))?;
    let back = now_ns();
    since.insert(host.clone(), back);
    tl.fault(FaultKind::AgentRestart, &host, killed, back, |_| {});
    sleep_until(from + 2 * w)?;
    tl.phase("agent_restart", &host, "", from, now_ns());

    // A stalling host: its agent stopped STALL_MS of every STALL_PERIOD_MS.
    let (t, h) = STALLED;
    let host = Plan::host(t, h);
    let from = now_ns();
    let mut next = from;
    let stalled = loop {
        if next + STALL_PERIOD_MS * 1_000_000 > from + fw {
            break Ok(());
        }
        signal(agents, &host, libc::SIGSTOP)?;
        let slept = sleep_until(next + STALL_MS * 1_000_000);
        signal(agents, &host, libc::SIGCONT)?;
        if slept.is_err() {
            break slept;
        }
        next += STALL_PERIOD_MS * 1_000_000;
        if let Err(e) = sleep_until(next) {
            break Err(e);
        }
    };
    stalled?;
    sleep_until(from + fw)?;
    let to = now_ns();
    tl.phase("host_stall", &host, "", from, to);
    tl.fault(FaultKind::HostStall, &host, from, to, |f| {
        f.stall_ms = Some(STALL_MS as f64);
        f.period_s = Some(STALL_PERIOD_MS as f64 / 1e3);
    });
    let tail = now_ns();
    sleep_until(next_boundary(tail, w) + w)?;
    tl.phase("tail", "", "", tail, now_ns());
    Ok(())
}

/// `analyze localize --format json --evidence EVIDENCE` over the run's segments (kept in
/// localize.json, localize-summaries.json).
fn localize(opts: &ClosOptions, out: &Path, inventory: &Path, evidence: &str) -> anyhow::Result<Vec<Finding>> {
    let r = crate::harness::localize(&opts.bin.join("analyze"), opts.window_s, inventory, out, evidence)?;
    if !r.status.success() {
        bail!("analyze localize failed ({}): {}", r.status, String::from_utf8_lossy(&r.stderr));
    }
    Ok(score::parse_findings(&String::from_utf8_lossy(&r.stdout))?)
}

/// Switches that advertise one management address over LLDP answer traces from interface
/// addresses the inventory does not list. The ToRs' addresses taken out of the inventory (the
/// spines' kept), the traces' first and last hops are named as the endpoints' ToRs: the same
/// findings as with every address listed, no hop left unnamed. Kept as
/// localize-tor-addrs-unlisted.json.
fn end_hops_check(opts: &ClosOptions, out: &Path, inventory: &Path, listed: &[Finding]) -> anyhow::Result<Check> {
    let r = localize_unlisted(opts, out, inventory, "tor-addrs-unlisted", false, &[])?;
    Ok(Check {
        name: "path hops: ToR addresses unlisted, named as the traces' end ToRs".into(),
        ok: r.same_as(listed) && r.learned > 0,
        detail: format!("{}; {} hop addresses learned as end ToRs", r.said(listed), r.learned),
    })
}

/// `analyze localize` (records) with the inventory's ToR addresses (and with `spines` the
/// spines' too) taken out, `extra` arguments added; kept as localize-NAME.json beside its
/// inventory-NAME.toml.
fn localize_unlisted(
    opts: &ClosOptions,
    out: &Path,
    inventory: &Path,
    name: &str,
    spines: bool,
    extra: &[&str],
) -> anyhow::Result<Unlisted> {
    let mut inv = rocemesh_formats::inventory::Inventory::load(inventory)?;
    let mut taken = inv.tors.iter_mut().map(|t| std::mem::take(&mut t.addrs).len()).sum::<usize>();
    if spines {
        taken += inv.spines.iter_mut().map(|s| std::mem::take(&mut s.addrs).len()).sum::<usize>();
    }
    let path = out.join(format!("inventory-{name}.toml"));
    std::fs::write(&path, inv.to_toml_string()?)?;
    let r = Command::new(opts.bin.join("analyze"))
        .args(["localize", "--format", "json", "--window-s", &opts.window_s.to_string(), "--evidence", "records"])
        .arg("--inventory")
        .arg(&path)
        .args(extra)
        .arg(out.join("segments"))
        .output()
        .context("running analyze localize")?;
    std::fs::write(out.join(format!("localize-{name}.json")), &r.stdout)?;
    let stderr = String::from_utf8_lossy(&r.stderr).into_owned();
    let doc: serde_json::Value =
        serde_json::from_slice(&r.stdout).with_context(|| format!("analyze localize: {stderr}"))?;
    Ok(Unlisted {
        taken,
        found: score::parse_findings(&String::from_utf8_lossy(&r.stdout))?,
        unmapped: doc["unmapped_hops"].as_array().map_or(0, Vec::len),
        learned: doc["hops_learned"].as_u64().unwrap_or(0),
        stderr,
    })
}

/// What [`localize_unlisted`] found.
struct Unlisted {
    /// Switch addresses taken out of the inventory.
    taken: usize,
    found: Vec<Finding>,
    unmapped: usize,
    learned: u64,
    stderr: String,
}

impl Unlisted {
    fn names(fs: &[Finding]) -> BTreeSet<String> {
        fs.iter().map(|f| format!("{} {}", f.kind, f.entity)).collect()
    }

    /// The same findings as with every address listed, none of which was empty, and no hop
    /// left unnamed.
    fn same_as(&self, listed: &[Finding]) -> bool {
        !listed.is_empty() && Self::names(listed) == Self::names(&self.found) && self.unmapped == 0
    }

    fn said(&self, listed: &[Finding]) -> String {
        format!(
            "{} switch addresses taken out; {} hops unmapped; findings {:?} (with every address listed: {:?})",
            self.taken,
            self.unmapped,
            Self::names(&self.found),
            Self::names(listed)
        )
    }
}

/// What the switches' counters must say of each fault's finding: (kind, entity, verdict). The
/// lossy link and spine corroborated; the port set down silent (its connected route goes with
/// it, so nothing is counted).
fn switch_verdicts_wanted() -> [(&'static str, String, &'static str); 3] {
    let (t, s) = LOSSY_LINK;
    let (rt, rh) = RNIC_DOWN;
    [
        ("link", format!("{}|{}", Plan::tor(t), Plan::spine(s)), "corroborated"),
        ("spine", Plan::spine(LOSSY_SPINE), "corroborated"),
        ("rnic", format!("{}/{DEVICE}", Plan::host(rt, rh)), "silent"),
    ]
}

/// The live analyzer's `switches` lines at each fault's open, from the Prometheus that scraped
/// the switches through the run: the lossy link and spine corroborated, the port set down
/// silent, and no failure to ask.
fn live_switches_check(lines: &[(u64, String)]) -> Check {
    let parsed: Vec<serde_json::Value> = lines.iter().filter_map(|(_, l)| serde_json::from_str(l).ok()).collect();
    let want = switch_verdicts_wanted();
    let failed = parsed.iter().find(|v| v["event"] == "problem" && v["reason"] == "prometheus");
    let mut ok = failed.is_none();
    let mut said = Vec::new();
    for (kind, entity, verdict) in want {
        let got = parsed.iter().find(|v| {
            v["event"] == "switches" && v["at"] == "open" && v["kind"] == kind && v["entity"] == entity.as_str()
        });
        let v = got.and_then(|v| v["counters"]["verdict"].as_str()).unwrap_or("no switches line");
        ok &= v == verdict;
        let summary = got.and_then(|v| v["summary"].as_str()).unwrap_or("");
        said.push(format!("{kind} {entity}: {v} (want {verdict}) {summary}"));
    }
    if let Some(f) = failed {
        said.push(format!("failed: {}", f["detail"]));
    }
    Check { name: "live: switch counters beside the findings as they open".into(), ok, detail: said.join("; ") }
}

/// The switches' counters beside the findings: the run's own port counters
/// (`switch-counters.om`) served by a real Prometheus to `analyze localize --prometheus`. The
/// lossy link is corroborated on both its ports, the lossy spine on its ports, and the port
/// set down (its route gone, nothing counted) is silent. Kept as localize-switches.json. And the
/// switches' IP-MIB addresses from the same Prometheus name every hop of an inventory that
/// lists no switch address ([`addresses_from_prometheus_check`]).
fn switch_counters_check(
    opts: &ClosOptions,
    out: &Path,
    inventory: &Path,
    listed: &[Finding],
) -> anyhow::Result<Vec<Check>> {
    let om = std::fs::read_to_string(out.join("switch-counters.om"))?;
    let prom = counters::Prometheus::serve(&om, &out.join("prometheus"))?;
    let before_s = (opts.fault_windows * opts.window_s * 2).to_string();
    let r = Command::new(opts.bin.join("analyze"))
        .args(["localize", "--format", "json", "--window-s", &opts.window_s.to_string(), "--evidence", "records"])
        .arg("--inventory")
        .arg(inventory)
        .args(["--prometheus", &prom.url, "--counter-map", "if_mib", "--counters-lookback-s", "3"])
        .args(["--counters-before-s", &before_s])
        .arg(out.join("segments"))
        .output()
        .context("running analyze localize --prometheus")?;
    let addresses = addresses_from_prometheus_check(opts, out, inventory, &prom.url, listed);
    drop(prom);
    std::fs::write(out.join("localize-switches.json"), &r.stdout)?;
    let doc: serde_json::Value = serde_json::from_slice(&r.stdout)
        .with_context(|| format!("analyze localize --prometheus: {}", String::from_utf8_lossy(&r.stderr)))?;
    let want = switch_verdicts_wanted();
    let findings = doc["findings"].as_array().cloned().unwrap_or_default();
    let mut said = Vec::new();
    let mut ok = doc["switch_counters"]["error"].is_null();
    for (kind, entity, verdict) in want {
        let got = findings.iter().find(|f| f["kind"] == kind && f["entity"] == entity.as_str());
        let v = got.and_then(|f| f["switch"]["verdict"].as_str()).unwrap_or("no finding");
        ok &= v == verdict;
        said.push(format!("{kind} {entity}: {v} (want {verdict})"));
    }
    // Both ends of the lossy link named, each with its discards.
    let link = findings.iter().find(|f| f["kind"] == "link");
    let ports: Vec<String> = link
        .and_then(|f| f["switch"]["ports"].as_array())
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let discards = p["counters"]
                        .as_array()
                        .and_then(|cs| cs.iter().find(|c| c["counter"] == "out_discards"))
                        .map_or(-1.0, |c| c["during"].as_f64().unwrap_or(-1.0));
                    format!(
                        "{} {} out_discards +{discards}",
                        p["switch"].as_str().unwrap_or("?"),
                        p["port"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    ok &= ports.len() == 2;
    let counters = Check {
        name: "switch counters from Prometheus beside the findings".into(),
        ok,
        detail: format!(
            "{}; link ports: {}; error: {}",
            said.join(", "),
            ports.join(", "),
            doc["switch_counters"]["error"]
        ),
    };
    Ok(vec![counters, addresses?])
}

/// The inventory's switch addresses all taken out, `localize --prometheus` names every hop from
/// the switches' IP-MIB series: the same findings as with the addresses listed, no hop
/// unmapped. Kept as localize-addrs-from-prometheus.json.
fn addresses_from_prometheus_check(
    opts: &ClosOptions,
    out: &Path,
    inventory: &Path,
    url: &str,
    listed: &[Finding],
) -> anyhow::Result<Check> {
    let extra = ["--prometheus", url, "--counters-lookback-s", "3"];
    let r = localize_unlisted(opts, out, inventory, "addrs-from-prometheus", true, &extra)?;
    let said = r.stderr.lines().find(|l| l.contains("switch addresses") || l.contains("switch counters")).unwrap_or("");
    Ok(Check {
        name: "path hops: no switch address listed, named from Prometheus's IP-MIB series".into(),
        // Every hop named by an address Prometheus gave, none by where it stands.
        ok: r.same_as(listed) && r.learned == 0,
        detail: format!("{}; {said}; {} named as end ToRs instead", r.said(listed), r.learned),
    })
}

/// The run as a scenario: this fabric, how ctl's pinglists probe it, the faults at their times.
fn scenario(opts: &ClosOptions, out: &Path, tl: &Timeline, end_ns: u64, tracing: bool) -> anyhow::Result<Scenario> {
    let mut labels = 1;
    for (t, h) in (0..TORS).flat_map(|t| (0..HOSTS_PER_TOR).map(move |h| (t, h))) {
        let pl = Pinglist::load(out.join("pinglists").join(format!("{}.toml", Plan::host(t, h))))?;
        let inter = pl.targets.iter().filter(|x| x.kind == ProbeKind::InterTor);
        labels = labels.max(inter.map(|x| x.flow_labels.len()).max().unwrap_or(1));
    }
    let q = |p50: f64, p99: f64| Quantiles { p50, p99 };
    let s = Scenario {
        version: rocemesh_formats::scenario::VERSION,
        name: format!("testbeds clos (path tracing {})", if tracing { "on" } else { "off" }),
        seed: 7,
        duration_s: (end_ns - tl.start_ns).div_ceil(1_000_000_000),
        window_s: opts.window_s,
        start_unix_s: tl.start_ns / 1_000_000_000,
        topology: Topology {
            spines: SPINES,
            tors: TORS,
            hosts_per_tor: HOSTS_PER_TOR,
            rnics_per_host: 1,
            rail_optimised: false,
        },
        probing: Probing {
            tor_mesh_pps: opts.tor_mesh_pps,
            inter_tor_tors: TORS - 1,
            inter_tor_pps: opts.inter_tor_pps,
            flow_labels: labels as u32,
            timeout_ms: u64::from(rocemesh_formats::pinglist::DEFAULT_TIMEOUT_MS),
            pinglist_refresh_s: 60,
        },
        // Nominal: veths and kernel UDP stamps (only the simulator reads these).
        normal: Normal {
            network_rtt_us: q(30.0, 300.0),
            prober_delay_us: q(20.0, 500.0),
            responder_delay_us: q(20.0, 500.0),
            loss: 1e-9,
            ts_source: TsModel::Host,
        },
        faults: tl.faults.clone(),
    };
    // What the scorer reads must be what the parser accepts.
    Scenario::parse(&s.to_toml_string()?, &out.join("scenario.toml"))?;
    Ok(s)
}

fn network(kind: &str) -> bool {
    matches!(kind, "rnic" | "tor" | "link" | "spine" | "ambiguous")
}

fn overlaps(f: &Finding, from: u64, to: u64) -> bool {
    f.start_ns < to && f.end_ns.is_none_or(|e| e > from)
}

/// Whether a finding's entity is on host (t, h) or its ToR, or a link of that ToR.
fn around(entity: &str, t: u32, h: u32) -> bool {
    let (host, tor) = (Plan::host(t, h), Plan::tor(t));
    entity == host || entity.starts_with(&format!("{host}/")) || entity == tor || entity.split('|').any(|e| e == tor)
}

/// The run's checks beyond the score: a quiet clean phase, each fault found, nothing on the
/// restarted or stalling host, nothing else blamed.
fn verdicts(
    tl: &Timeline,
    records: &[crate::harness::Rec],
    findings: &[Finding],
    sc: &score::Score,
    window_ns: u64,
    tracing: bool,
) -> Vec<Check> {
    let mut checks = Vec::new();
    let show = |fs: &[&Finding]| -> Vec<String> { fs.iter().map(|f| format!("{} {}", f.kind, f.entity)).collect() };
    if let Some(p) = tl.phases.iter().find(|p| p.name == "clean") {
        let in_phase = records.iter().filter(|r| r.t1_ns >= p.from_ns && r.t1_ns < p.to_ns);
        let (mut ok, mut lost, mut other) = (0u64, 0u64, 0u64);
        for r in in_phase {
            match r.outcome {
                o if o == Outcome::Ok as u8 => ok += 1,
                o if o == Outcome::Lost as u8 => lost += 1,
                _ => other += 1,
            }
        }
        checks.push(Check {
            name: "clean phase: zero loss".into(),
            ok: lost == 0 && ok > 100,
            detail: format!("ok {ok}, lost {lost}, other {other}"),
        });
        let noisy: Vec<&Finding> = findings.iter().filter(|f| overlaps(f, p.from_ns, p.to_ns)).collect();
        checks.push(Check::none_of("clean phase: no finding", &show(&noisy)));
    }
    for (fault, fs) in tl.faults.iter().zip(&sc.faults) {
        let Some(want) = fault.kind.expected_finding() else { continue };
        let needs_traces = matches!(fault.kind, FaultKind::LinkLoss | FaultKind::SpineLoss);
        let found: Vec<String> =
            fs.matched_by.iter().map(|&i| format!("{} {}", findings[i].kind, findings[i].entity)).collect();
        let (ok, note) = match (found.is_empty(), needs_traces && !tracing) {
            (false, _) => (true, String::new()),
            (true, true) => (true, " (not required: without path traces nothing tells the spines apart)".to_string()),
            (true, false) => (false, String::new()),
        };
        checks.push(Check {
            name: format!("{}: {want} {}", fault.kind.name(), fault.target),
            ok,
            detail: if found.is_empty() { format!("not found{note}") } else { format!("found: {}", found.join(", ")) },
        });
    }
    for (name, (t, h)) in [("agent_restart", RESTARTED), ("host_stall", STALLED)] {
        let Some(p) = tl.phases.iter().find(|p| p.name == name) else { continue };
        let (from, to) = (p.from_ns.saturating_sub(window_ns), p.to_ns + window_ns);
        let near: Vec<&Finding> =
            findings.iter().filter(|f| network(&f.kind) && around(&f.entity, t, h) && overlaps(f, from, to)).collect();
        checks.push(Check::none_of(&format!("{name} {}: no network finding", Plan::host(t, h)), &show(&near)));
    }
    // Stray: network findings matching no fault. Without path traces, findings during the link
    // and spine faults are what analyze can say without knowing the spine: listed, tolerated.
    let tolerated = |f: &Finding| {
        !tracing
            && tl
                .phases
                .iter()
                .filter(|p| p.name == "link_loss" || p.name == "spine_loss")
                .any(|p| overlaps(f, p.from_ns.saturating_sub(window_ns), p.to_ns + window_ns))
    };
    let stray: Vec<&Finding> = sc.false_positives.iter().filter(|f| !tolerated(f)).collect();
    let mut c = Check::none_of("no stray network findings", &show(&stray));
    let excused: Vec<&Finding> = sc.false_positives.iter().filter(|f| tolerated(f)).collect();
    if !excused.is_empty() {
        c.detail.push_str(&format!("; during link/spine faults without traces: {}", show(&excused).join(", ")));
    }
    checks.push(c);
    checks
}

/// A fault the live analyzer must find is found within this long of its injection.
const LIVE_DELAY_MAX_MS: u64 = 20_000;

/// The live analyzer's findings held to the batch checks, and each fault it must find timed
/// from injection to its `open` line. `traced`: the agents pushed path traces whose hops the
/// inventory names (else link and spine faults are not required, as for batch without traces).
fn live_verdicts(
    tl: &Timeline,
    records: &[crate::harness::Rec],
    scenario: &Scenario,
    lines: &[(u64, String)],
    window_ns: u64,
    traced: bool,
) -> (Vec<Check>, live::LiveResult) {
    let (found, mut after_end) = live::findings(lines);
    let scored: Vec<Finding> = found.iter().map(live::LiveFinding::scored).collect();
    let (scored, _early): (Vec<Finding>, Vec<Finding>) =
        scored.into_iter().partition(|f| f.end_ns.is_none_or(|e| e > tl.start_ns));
    let sc = score::score(scenario, &scored);
    let mut checks = verdicts(tl, records, &scored, &sc, window_ns, traced);
    for c in &mut checks {
        c.name = format!("{} (live)", c.name);
    }
    let mut delays_ms = Vec::new();
    let mut late = Vec::new();
    let mut delays = Vec::new();
    for fault in &tl.faults {
        let Some(want) = fault.kind.expected_finding() else { continue };
        let from = tl.start_ns + (fault.start_s * 1e9) as u64;
        let first = found
            .iter()
            .filter(|f| f.kind == want && f.entity == fault.target && f.opened_at_ns >= from)
            .map(|f| (f.opened_at_ns - from) / 1_000_000)
            .min();
        let required = traced || !matches!(fault.kind, FaultKind::LinkLoss | FaultKind::SpineLoss);
        match first {
            Some(ms) => delays.push(ms),
            None if required => late.push(format!("{} not opened", fault.target)),
            None => {}
        }
        if let Some(ms) = first.filter(|&ms| ms > LIVE_DELAY_MAX_MS) {
            late.push(format!("{} after {ms} ms", fault.target));
        }
        delays_ms.push((fault.kind.name().to_owned(), fault.target.clone(), first));
    }
    let shown: Vec<String> = delays_ms
        .iter()
        .map(|(k, t, d)| format!("{k} {t} {}", d.map_or("not opened".into(), |d| format!("{d} ms"))))
        .collect();
    checks.push(Check {
        name: format!("live: each fault it must find within {} s", LIVE_DELAY_MAX_MS / 1000),
        ok: late.is_empty() && !delays.is_empty(),
        detail: format!("median {} ms; {}", live::median(&mut delays), shown.join(", ")),
    });
    let largest = after_end.iter().copied().max().unwrap_or(0);
    let result = live::LiveResult {
        findings: found,
        delays_ms,
        window_after_end_ms: (live::median(&mut after_end), largest),
        lines: lines.len(),
    };
    (checks, result)
}

/// `testbeds clos --cleanup`: the namespaces of runs that are gone.
pub fn cleanup() -> anyhow::Result<Vec<String>> {
    net::remove_stale()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_start_on_window_boundaries() {
        let w = 10_000_000_000;
        assert_eq!(next_boundary(1_700_000_003_000_000_000, w), 1_700_000_010_000_000_000);
        assert_eq!(next_boundary(1_700_000_010_000_000_000, w), 1_700_000_020_000_000_000);
        assert_eq!(next_boundary(0, w), w);
    }

    #[test]
    fn findings_around_a_host_are_its_own_its_tor_and_its_links() {
        for e in ["tor2-h1", "tor2-h1/rnic0", "tor2", "tor2|spine0", "spine1|tor2"] {
            assert!(around(e, 2, 1), "{e}");
        }
        for e in ["tor2-h10", "tor2-h0/rnic0", "tor1", "tor12|spine0", "spine1"] {
            assert!(!around(e, 2, 1), "{e}");
        }
    }

    #[test]
    fn agent_configs_are_udp_with_source_ports_and_optional_tracing() {
        let opts = ClosOptions::new(PathBuf::from("/o"), PathBuf::from("/b"));
        let c = agent_config(&opts, Path::new("/o"), 1, 2, 1, None);
        assert!(c.contains("host = \"tor1-h2\"\n"), "{c}");
        assert!(c.contains("bind = \"10.0.1.5:18600\"\n"), "{c}");
        assert!(c.contains("transport = \"udp\"\n") && c.contains("source_ports = 8\n"), "{c}");
        assert!(c.contains("segment_dir = \"/o/segments/tor1-h2\""), "{c}");
        assert!(!c.contains("path_tracing"));
        assert!(c.contains("[live]\ncollectors = [\"192.168.255.254:18620\"]\n"), "{c}");
        let on = agent_config(&opts, Path::new("/o"), 1, 2, 1, Some(true));
        assert!(
            on.ends_with(
                "\n[path_tracing]\nenabled = true\nrefresh_s = 60\nmin_retrace_interval_s = 5\ntraces_per_s = 5.0\n"
            ),
            "{on}"
        );
        assert!(
            agent_config(&opts, Path::new("/o"), 1, 2, 1, Some(false)).contains("[path_tracing]\nenabled = false\n")
        );
    }

    #[test]
    fn the_timeline_becomes_a_valid_scenario() {
        let dir = tempfile::tempdir().unwrap();
        let plan = Plan::new("rmc1", SPINES, TORS, HOSTS_PER_TOR).unwrap();
        std::fs::create_dir_all(dir.path().join("pinglists")).unwrap();
        for (t, h) in plan.hosts() {
            let text = format!(
                "version = 1\nhost = \"{}\"\ngeneration = 1\ngenerated_unix_ns = 0\ntimeout_ms = 500\n",
                Plan::host(t, h)
            );
            std::fs::write(dir.path().join("pinglists").join(format!("{}.toml", Plan::host(t, h))), text).unwrap();
        }
        let s0 = 1_700_000_000_000_000_000u64;
        let mut tl = Timeline { phases: Vec::new(), faults: Vec::new(), drops: BTreeMap::new(), start_ns: s0 };
        let sec = 1_000_000_000;
        tl.fault(FaultKind::RnicDown, "tor1-h2/rnic0", s0 + 40 * sec, s0 + 70 * sec, |_| {});
        tl.fault(FaultKind::LinkLoss, "tor1|spine0", s0 + 80 * sec, s0 + 110 * sec, |f| f.loss = Some(0.25));
        tl.fault(FaultKind::HostStall, "tor2-h1", s0 + 120 * sec, s0 + 150 * sec, |f| {
            f.stall_ms = Some(2000.0);
            f.period_s = Some(5.0);
        });
        let opts = ClosOptions::new(dir.path().to_path_buf(), PathBuf::new());
        let s = scenario(&opts, dir.path(), &tl, s0 + 170 * sec + 1, true).unwrap();
        assert_eq!((s.duration_s, s.start_unix_s, s.faults.len()), (171, 1_700_000_000, 3));
        assert_eq!(s.faults[1].start_s, 80.0);
        // Scored as the accuracy suite scores: a link finding in time matches, a stray rnic does not.
        let f = |kind: &str, entity: &str, a: u64, b: u64| Finding {
            kind: kind.into(),
            entity: entity.into(),
            start_ns: s0 + a * sec,
            end_ns: Some(s0 + b * sec),
        };
        let sc = score::score(&s, &[f("rnic", "tor1-h2/rnic0", 40, 70), f("link", "spine0|tor1", 80, 110)]);
        assert_eq!((sc.precision(), sc.recall()), (1.0, 1.0));
        // A network finding on the stalling host fails its check, and is stray.
        tl.phase("host_stall", "tor2-h1", "", s0 + 120 * sec, s0 + 150 * sec);
        let on_stalled = [f("rnic", "tor2-h1/rnic0", 130, 140)];
        let checks = verdicts(&tl, &[], &on_stalled, &score::score(&s, &on_stalled), 10 * sec, true);
        let failed: Vec<&str> = checks.iter().filter(|c| !c.ok).map(|c| c.name.as_str()).collect();
        assert!(failed.contains(&"host_stall tor2-h1: no network finding"), "{failed:?}");
        assert!(failed.contains(&"no stray network findings"), "{failed:?}");
        assert!(failed.contains(&"rnic_down: rnic tor1-h2/rnic0"), "{failed:?}");
        // Without path traces a missed link fault is reported, not failed.
        let checks = verdicts(&tl, &[], &[], &score::score(&s, &[]), 10 * sec, false);
        let link = checks.iter().find(|c| c.name == "link_loss: link tor1|spine0").unwrap();
        assert!(link.ok && link.detail.contains("not required"), "{link:?}");
    }
}
