//! The rxe lab's verbs agent: the configuration every lab host's agent runs with (metrics on the
//! host's sysfs, optional service tracing within the bounds the storm check holds it to, an
//! optional live view), written and started in the host's namespace.

use std::path::Path;
use std::process::Child;

use anyhow::Context;

use crate::harness::{AGENT_PORT, spawn_agent};

/// One verbs agent of the lab: its configuration, written as `<dir>/<host>.toml`.
pub(crate) struct AgentSpec<'a> {
    pub(crate) host: &'a str,
    pub(crate) device: &'a str,
    pub(crate) tor: &'a str,
    pub(crate) ip: std::net::IpAddr,
    pub(crate) pinglist: &'a Path,
    pub(crate) segments: &'a Path,
    pub(crate) mode: &'a str,
    pub(crate) core: usize,
    pub(crate) stats_interval_s: u64,
    pub(crate) flush_interval_ms: u64,
    pub(crate) rust_log: &'a str,
    pub(crate) duration_s: Option<u64>,
    /// Load the eBPF service tracer (`[service_tracing]`).
    pub(crate) service_tracing: bool,
    /// `[view] allow` (one collector address): serve the live view.
    pub(crate) view_allow: Option<&'a str>,
}

/// `[service_tracing]` of the lab's agents: the bounds the storm check holds them to.
pub(crate) const SERVICE_PROBE_PPS: f64 = 5.0;
pub(crate) const SERVICE_MAX_TARGETS: u64 = 64;
pub(crate) const SERVICE_NEW_PER_S: f64 = 20.0;
/// Write the agent's configuration and start it in its host's namespace, logging to
/// `<dir>/<host>.log`.
pub(crate) fn start_agent(agent: &Path, s: &AgentSpec, dir: &Path) -> anyhow::Result<Child> {
    let cfg = dir.join(format!("{}.toml", s.host));
    let text = format!(
        "host = \"{host}\"\npinglist = \"{pl}\"\nsegment_dir = \"{seg}\"\nmode = \"{mode}\"\n\
         stats_interval_s = {stats}\nflush_interval_ms = {flush}\nsegment_mib = 4\nsegment_quota_mib = 256\n\n\
         [metrics]\nlisten = \"127.0.0.1:{metrics}\"\nsysfs = \"{sysfs}\"\n\n\
         [[shard]]\ndevice = \"{dev}\"\ntransport = \"verbs\"\ntor = \"{tor}\"\nbind = \"{ip}:{AGENT_PORT}\"\ncore = {core}\n",
        metrics = crate::rxemetrics::METRICS_PORT,
        sysfs = crate::rxemetrics::HOST_SYSFS,
        host = s.host,
        pl = s.pinglist.display(),
        seg = s.segments.display(),
        mode = s.mode,
        stats = s.stats_interval_s,
        flush = s.flush_interval_ms,
        dev = s.device,
        tor = s.tor,
        ip = s.ip,
        core = s.core,
    );
    let text = if s.service_tracing {
        format!(
            "{text}\n[service_tracing]\nenabled = true\nprobe_pps = {SERVICE_PROBE_PPS}\n\
             max_targets_per_shard = {SERVICE_MAX_TARGETS}\nmax_new_targets_per_s = {SERVICE_NEW_PER_S}\n"
        )
    } else {
        text
    };
    let text = match s.view_allow {
        Some(a) => format!("{text}\n[view]\nallow = [\"{a}\"]\n"),
        None => text,
    };
    std::fs::write(&cfg, text).with_context(|| format!("writing {}", cfg.display()))?;
    let log = std::fs::File::create(dir.join(format!("{}.log", s.host)))?;
    spawn_agent(agent, s.host, &cfg, log, s.rust_log, s.duration_s)
        .with_context(|| format!("starting the agent of {}", s.host))
}
