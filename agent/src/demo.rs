//! The embedded default: several shards on 127.0.0.x loopback addresses probing each other, so
//! that the agent runs end to end on any Linux box, with no RNIC and no inventory; and the fault
//! `agent demo` injects into it ([`inject_loss`]) so that the run shows what localisation is for.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use anyhow::{Context, Result, bail};
use rocemesh_formats::pinglist::{Pinglist, ProbeKind, Target};

use crate::config::AgentConfig;

/// Write `agent.toml` and `pinglist.toml` for `shards` loopback shards into `dir`; returns the
/// config path. Shard i binds 127.0.0.(i+1):`port` and probes every other shard at 20/s
/// (ToR-mesh, as if all sat under one ToR), cycling 4 flow labels: enough probes that a 15 s
/// run split across two 30 s windows still shows an injected 25% loss in each.
pub fn write(dir: &Path, shards: usize, port: u16, busy_poll: bool) -> Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut cfg = String::from(
        "# The embedded default: loopback shards probing each other (see `agent demo --help`).\n\
         # `agent demo --inject-loss` makes its last shard drop a share of the probes it receives on\n\
         # top of this file; `agent run --config` on this file injects nothing.\n\
         host = \"loopback\"\npinglist = \"pinglist.toml\"\nsegment_dir = \"segments\"\n",
    );
    cfg.push_str(&format!(
        "mode = \"{}\"\nflush_interval_ms = 200\nstats_interval_s = 5\n",
        if busy_poll { "busy_poll" } else { "event" }
    ));
    let addr = |i: usize| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, (i + 1) as u8)), port);
    for i in 0..shards {
        cfg.push_str(&format!(
            "\n[[shard]]\ndevice = \"lo{i}\"\ntor = \"tor0\"\nbind = \"{}\"\ncore = {}\n",
            addr(i),
            i % cores
        ));
    }
    let mut targets = Vec::new();
    for i in 0..shards {
        for j in (0..shards).filter(|&j| j != i) {
            targets.push(Target {
                from: format!("lo{i}"),
                to: format!("loopback/lo{j}"),
                tor: "tor0".into(),
                kind: ProbeKind::TorMesh,
                addr: addr(j).ip(),
                port: Some(port),
                qpn: None,
                rate_pps: 20.0,
                flow_labels: vec![1, 2, 3, 4],
            });
        }
    }
    let pinglist = Pinglist {
        version: 1,
        host: "loopback".into(),
        generation: 1,
        generated_unix_ns: crate::clock::now_ns(),
        timeout_ms: 500,
        targets,
    };
    std::fs::write(dir.join("pinglist.toml"), pinglist.to_toml_string()?).context("write pinglist.toml")?;
    let path = dir.join("agent.toml");
    std::fs::write(&path, cfg).context("write agent.toml")?;
    Ok(path)
}

/// Make the last shard of `cfg` (a [`write`] config) silently ignore `fraction` of the probes it
/// receives, as an RNIC losing packets would: its peers see their probes to it lost, while its
/// own probes are answered. Returns that RNIC's inventory name (`host/device`), what
/// localisation should name, or None for a fraction of 0 (nothing injected). This is the shards' `ignore_probe_fraction` test hook, set here
/// rather than in the file, so that the demo's config stays one production accepts.
pub fn inject_loss(cfg: &mut AgentConfig, fraction: f64) -> Result<Option<String>> {
    if !(0.0..1.0).contains(&fraction) {
        bail!("--inject-loss {fraction}: use a share of the received probes in [0, 1), 0 for none");
    }
    if fraction == 0.0 {
        return Ok(None);
    }
    if cfg.shards.len() < 3 {
        // Two peers of the faulty shard make its loss stand out against the rest of the fleet.
        bail!(
            "--inject-loss needs at least 3 shards (--shards {}): add shards, or pass --inject-loss 0",
            cfg.shards.len()
        );
    }
    let host = cfg.host.clone();
    let last = cfg.shards.last_mut().context("no shard")?;
    last.ignore_probe_fraction = fraction;
    Ok(Some(format!("{host}/{}", last.device)))
}
