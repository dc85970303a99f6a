//! The kit the testbeds share: starting and stopping real agents in network namespaces, ctl's
//! pinglists and analyze's verdict run as the binaries an operator runs, reading what the agents
//! wrote back as named records, and the phase and check types their results are made of. The
//! rxe lab, its metrics, services, view and clock-step parts, and the Clos testbed build on it;
//! it builds on none of them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use rocemesh_formats::segment::SegmentReader;
use serde::Serialize;

/// The agents' UDP/RDMA CM service port (perftest's tools use [`crate::rxefabric::TOOL_PORT`]).
pub const AGENT_PORT: u16 = 18_600;

/// A phase of the timeline, wall-clock ns.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: String,
    /// The entity the fault is on (analyze's naming), empty for clean phases.
    pub entity: String,
    /// The finding kind expected for it, empty if none.
    pub expect: String,
    pub from_ns: u64,
    pub to_ns: u64,
}

/// One check and how it came out.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

impl Check {
    /// A check that passes when `found` is empty, and otherwise lists it.
    pub(crate) fn none_of(name: &str, found: &[String]) -> Check {
        let detail = if found.is_empty() { "none".into() } else { found.join(", ") };
        Check { name: name.into(), ok: found.is_empty(), detail }
    }
}

pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// `agent run --config <cfg>` in network namespace `netns`, stdout and stderr to `log`.
pub(crate) fn spawn_agent(
    agent: &Path,
    netns: &str,
    cfg: &Path,
    log: std::fs::File,
    rust_log: &str,
    duration_s: Option<u64>,
) -> anyhow::Result<Child> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]).arg(agent).arg("run");
    if let Some(d) = duration_s {
        cmd.args(["--duration-s", &d.to_string()]);
    }
    Ok(cmd
        .arg("--config")
        .arg(cfg)
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn()?)
}

/// Running agents by host name; killed when dropped.
pub(crate) struct Agents {
    pub(crate) children: Vec<(String, Child)>,
}

impl Agents {
    /// SIGTERM to every agent, then wait up to 20 s for each (SIGKILL after that).
    pub(crate) fn stop(&mut self) {
        for (_, c) in &mut self.children {
            // SAFETY: sending SIGTERM to a child we spawned (its pid is live until we wait).
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        for (host, c) in &mut self.children {
            loop {
                match c.try_wait() {
                    Ok(Some(st)) => {
                        if !st.success() {
                            eprintln!("rxe-lab: the agent of {host} exited with {st}");
                        }
                        break;
                    }
                    Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                    _ => {
                        eprintln!("rxe-lab: the agent of {host} did not stop on SIGTERM; killing it");
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                }
            }
        }
        self.children.clear();
    }
}

impl Agents {
    pub(crate) fn pid(&self, host: &str) -> Option<u32> {
        self.children.iter().find(|(h, _)| h == host).map(|(_, c)| c.id())
    }

    /// CPU time of each agent so far, in clock ticks.
    pub(crate) fn cpu_ticks(&self) -> anyhow::Result<Vec<(String, u64)>> {
        self.children.iter().map(|(h, c)| Ok((h.clone(), cpu_ticks(c.id())?))).collect()
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `ctl gen-pinglists` from `inventory` into `out` (seed 7): each RNIC probes `inter_tor_peers`
/// other ToRs, every target on [`AGENT_PORT`]; `extra` are more ctl flags.
pub(crate) fn gen_pinglists(
    ctl: &Path,
    inventory: &Path,
    out: &Path,
    inter_tor_peers: u32,
    tor_mesh_pps: f64,
    inter_tor_pps: f64,
    extra: &[&str],
) -> anyhow::Result<()> {
    let status = Command::new(ctl)
        .args(["gen-pinglists", "--inventory"])
        .arg(inventory)
        .arg("--out")
        .arg(out)
        .args(["--seed", "7", "--inter-tor-peers", &inter_tor_peers.to_string()])
        .args(extra)
        .args(["--probe-port", &AGENT_PORT.to_string()])
        .args(["--tor-mesh-rate-pps", &tor_mesh_pps.to_string()])
        .args(["--inter-tor-rate-pps", &inter_tor_pps.to_string()])
        .status()
        .context("running ctl gen-pinglists")?;
    if !status.success() {
        bail!("ctl gen-pinglists failed ({status})");
    }
    Ok(())
}

/// `analyze localize --format json` over `<dir>/segments`; its stdout and stderr are kept as
/// `<dir>/localize.json` and `<dir>/localize.stderr`.
pub(crate) fn localize(
    analyze: &Path,
    window_s: u64,
    inventory: &Path,
    dir: &Path,
    evidence: &str,
) -> anyhow::Result<Output> {
    let out = Command::new(analyze)
        .args(["localize", "--format", "json", "--window-s", &window_s.to_string(), "--evidence", evidence])
        .arg("--inventory")
        .arg(inventory)
        .arg(dir.join("segments"))
        .output()
        .context("running analyze localize")?;
    let name = if evidence == "records" { "localize".to_owned() } else { format!("localize-{evidence}") };
    std::fs::write(dir.join(format!("{name}.json")), &out.stdout)?;
    std::fs::write(dir.join(format!("{name}.stderr")), &out.stderr)?;
    Ok(out)
}

/// A probe, with names instead of file-local ids.
#[derive(Debug, Clone)]
pub struct Rec {
    pub prober: String,
    pub target: String,
    pub t1_ns: u64,
    pub outcome: u8,
    pub rtt_ns: i32,
}

/// Every segment file (open or sealed) under `dir`, at any depth.
pub fn segment_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".rseg") || p.to_string_lossy().ends_with(".rseg.zst") {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// Every probe record under `dir`.
pub fn read_records(dir: &Path) -> anyhow::Result<Vec<Rec>> {
    let mut out = Vec::new();
    for p in segment_files(dir)? {
        let r = SegmentReader::open(&p).map_err(|e| anyhow::anyhow!("{e}"))?;
        let names: Vec<String> = r.dictionary().iter().map(|e| e.name.clone()).collect();
        for c in r.probe_chunks() {
            for i in 0..c.len() {
                let row = c.row(i);
                out.push(Rec {
                    prober: names.get(row.prober as usize).cloned().unwrap_or_default(),
                    target: names.get(row.target as usize).cloned().unwrap_or_default(),
                    t1_ns: row.t1_unix_ns,
                    outcome: row.outcome,
                    rtt_ns: row.network_rtt_ns,
                });
            }
        }
    }
    Ok(out)
}

/// CPU time (user + system) of a process, in clock ticks (`/proc/<pid>/stat`).
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // Fields after the command (which may hold spaces) start after the last ')'; utime and
    // stime are fields 14 and 15 of stat(5), so 11 and 12 counted from 0 after it.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    get(11).zip(get(12)).map(|(u, s)| u + s).with_context(|| format!("{path}: no utime and stime fields"))
}
