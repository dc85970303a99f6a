//! The RDMA side of a node: devices, ports, RoCE v2 GIDs, the MTU, PFC and ECN/DSCP, and the
//! completion clock.

use std::collections::BTreeSet;

use super::{Check, Host, Level, names, read};
use crate::config::{AgentConfig, TransportKind};
use crate::verbs::clock::{self, Clock};

pub(super) fn checks(host: &Host, cfg: Option<&AgentConfig>) -> Vec<Check> {
    let class = host.sys.join("class/infiniband");
    let devices = names(&class);
    let mut out = Vec::new();
    let verbs_shards: Vec<&str> = cfg
        .map(|c| c.shards.iter().filter(|s| s.transport == TransportKind::Verbs).map(|s| s.device.as_str()).collect())
        .unwrap_or_default();
    if devices.is_empty() {
        let level = if verbs_shards.is_empty() { Level::Warn } else { Level::Fail };
        out.push(
            Check::new(
                "rdma",
                "-",
                level,
                "no RDMA device (sysfs class/infiniband is empty): only kernel UDP can probe",
            )
            .fix("load the RNIC's driver (mlx5_ib), or for a test `rdma link add rxe0 type rxe netdev eth0`"),
        );
    }
    for d in verbs_shards.iter().filter(|d| !devices.iter().any(|x| x == *d)) {
        out.push(
            Check::new(
                "rdma",
                *d,
                Level::Fail,
                format!("a verbs shard's device is not here (devices: [{}])", devices.join(", ")),
            )
            .fix("set the shard's `device` to one of them"),
        );
    }
    let mut netdevs = BTreeSet::new();
    for dev in &devices {
        let used = verbs_shards.contains(&dev.as_str());
        for port in names(&class.join(dev).join("ports")) {
            out.extend(port_checks(host, dev, &port, used, &mut netdevs));
        }
        out.push(clock_check(host, dev));
    }
    for nd in &netdevs {
        out.push(mtu_check(host, nd));
        out.push(pfc_check(host, nd));
        out.push(ecn_check(host, nd));
        out.push(dscp_check(host, nd));
    }
    out
}

/// A port's state and link layer, and its RoCE v2 GIDs (whose netdevs are added to `netdevs`).
/// A port without one fails when a verbs shard of the config (`used`) is on its device, and
/// is only worth a warning otherwise (an unused port, a device the agent will not open).
fn port_checks(host: &Host, dev: &str, port: &str, used: bool, netdevs: &mut BTreeSet<String>) -> Vec<Check> {
    let dir = host.sys.join("class/infiniband").join(dev).join("ports").join(port);
    let subject = format!("{dev}/{port}");
    let state = read(&dir.join("state")).unwrap_or_else(|| "unreadable".into());
    let layer = read(&dir.join("link_layer")).unwrap_or_else(|| "unreadable".into());
    let mut out = Vec::new();
    let detail = format!("state {state}, link layer {layer}");
    out.push(if !state.contains("ACTIVE") {
        Check::new("port", &subject, Level::Warn, detail)
            .fix("bring the link up: the netdev under a RoCE port must be up and cabled")
    } else if layer != "Ethernet" {
        Check::new("port", &subject, Level::Warn, detail).fix("rocemesh probes RoCE (Ethernet) ports; this one is not")
    } else {
        Check::new("port", &subject, Level::Ok, detail)
    });
    let mut roce_v2 = Vec::new();
    for (index, gid) in crate::describe::roce_v2_gids(&dir) {
        let nd = read(&dir.join(format!("gid_attrs/ndevs/{index}"))).unwrap_or_default();
        let addr = gid.to_ipv4_mapped().map_or_else(|| gid.to_string(), |v4| v4.to_string());
        roce_v2.push(format!("{index}: {addr}{}", if nd.is_empty() { String::new() } else { format!(" ({nd})") }));
        if !nd.is_empty() {
            netdevs.insert(nd);
        }
    }
    out.push(if roce_v2.is_empty() {
        let level = match (used, layer == "Ethernet") {
            (true, _) => Level::Fail,
            (false, true) => Level::Warn,
            (false, false) => Level::Info,
        };
        Check::new("gid", &subject, level, "no RoCE v2 GID: no address a probe can be sent from")
            .fix("configure the shard's IP address on the port's netdev (`show_gids` lists the GIDs)")
    } else {
        Check::new("gid", &subject, Level::Ok, format!("RoCE v2 GIDs {}", roce_v2.join(", ")))
    });
    out
}

/// The clock a verbs shard on `dev` would stamp completions with.
fn clock_check(host: &Host, dev: &str) -> Check {
    match (host.clock_caps)(dev).map(clock::candidates) {
        Ok(Ok(c)) => {
            let how: Vec<String> = c
                .iter()
                .map(|c| match c {
                    Clock::Wallclock => "the NIC's wall clock".to_owned(),
                    Clock::Ticks { khz, .. } => format!("the NIC's ticks at {} MHz", khz / 1000),
                })
                .collect();
            Check::new("clock", dev, Level::Ok, format!("completion timestamps from {}", how.join(", else ")))
        }
        Ok(Err(why)) => Check::new(
            "clock",
            dev,
            Level::Warn,
            format!(
                "{why}: probes are stamped with the host clock at poll time (host_poll): delays include the host's poll latency"
            ),
        )
        .fix("a NIC with completion timestamps (mlx5) for delays of the network alone"),
        Err(e) => Check::new("clock", dev, Level::Warn, format!("could not ask the device: {e}"))
            .fix("install ibverbs-providers; run as a user who may open the device"),
    }
}

/// The RoCE MTU traffic gets from the netdev's MTU, as the kernel derives it (`iboe_get_mtu`:
/// the netdev MTU less the GRH, UDP, BTH, XRC, atomic-ETH and ICRC headers, then the largest IB
/// MTU that fits).
pub(super) fn roce_mtu(netdev_mtu: u32) -> Option<u32> {
    let room = netdev_mtu.checked_sub(40 + 8 + 12 + 4 + 28 + 4)?;
    [4096, 2048, 1024, 512, 256].into_iter().find(|m| *m <= room)
}

fn mtu_check(host: &Host, nd: &str) -> Check {
    let Some(mtu) = read(&host.sys.join("class/net").join(nd).join("mtu")).and_then(|m| m.parse::<u32>().ok()) else {
        return Check::new("mtu", nd, Level::Info, "netdev MTU unreadable");
    };
    match roce_mtu(mtu) {
        Some(4096) => Check::new("mtu", nd, Level::Ok, format!("netdev MTU {mtu}: RoCE MTU 4096")),
        Some(m) => Check::new(
            "mtu",
            nd,
            Level::Warn,
            format!("netdev MTU {mtu}: RoCE MTU {m}; training traffic usually runs at 4096"),
        )
        .fix(format!(
            "set the netdev MTU to at least 4192 (`ip link set {nd} mtu 9000`) and the switch ports to match"
        )),
        None => Check::new("mtu", nd, Level::Fail, format!("netdev MTU {mtu} leaves no room for a RoCE packet"))
            .fix(format!("`ip link set {nd} mtu 1500` or more")),
    }
}

/// PFC per priority, from DCB (`dcb pfc show`), where the NIC's driver supports it.
fn pfc_check(host: &Host, nd: &str) -> Check {
    let Some(json) = (host.run)("dcb", &["-j", "pfc", "show", "dev", nd]) else {
        return Check::new(
            "pfc",
            nd,
            Level::Info,
            "not readable: `dcb pfc show` failed (no DCB support, or iproute2's dcb missing)",
        )
        .fix(format!("check with the NIC's tool (mlx5: `mlnx_qos -i {nd}`)"));
    };
    let enabled = pfc_priorities(&json);
    match enabled {
        None => {
            Check::new("pfc", nd, Level::Info, format!("`dcb pfc show` said something unexpected: {}", one_line(&json)))
        }
        Some(p) if p.is_empty() => {
            Check::new("pfc", nd, Level::Warn, "PFC off on every priority: RoCE traffic is lossy on this port").fix(
                format!(
                    "enable PFC on the RoCE priority, as the switches have it (`dcb pfc set dev {nd} prio-pfc 3:on`)"
                ),
            )
        }
        Some(p) => Check::new("pfc", nd, Level::Ok, format!("PFC on priorities {}", join(&p))),
    }
}

/// The priorities `dcb -j pfc show` says PFC is enabled on; None if it does not parse.
pub(super) fn pfc_priorities(json: &str) -> Option<Vec<u8>> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let list = v.get("prio_pfc").or_else(|| v.get("prio-pfc"))?.as_array()?;
    let mut on = Vec::new();
    for e in list {
        let prio = u8::try_from(e.get("prio")?.as_u64()?).ok()?;
        if e.get("enabled")?.as_bool()? {
            on.push(prio);
        }
    }
    Some(on)
}

/// ECN for RoCE per priority, where the driver exposes it in sysfs (mlx5: `ecn/roce_np` for the
/// notification point, `ecn/roce_rp` for the reaction point).
fn ecn_check(host: &Host, nd: &str) -> Check {
    let dir = host.sys.join("class/net").join(nd).join("ecn");
    if !dir.exists() {
        return Check::new(
            "ecn",
            nd,
            Level::Info,
            "the driver exposes no ECN settings in sysfs (mlx5 does: ecn/roce_np, roce_rp)",
        );
    }
    let on = |point: &str| -> Vec<u8> {
        names(&dir.join(point).join("enable"))
            .iter()
            .filter(|p| read(&dir.join(point).join("enable").join(p)).as_deref() == Some("1"))
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    let (np, rp) = (on("roce_np"), on("roce_rp"));
    let detail =
        format!("ECN for RoCE: notification point on priorities [{}], reaction point on [{}]", join(&np), join(&rp));
    if np.is_empty() || rp.is_empty() {
        Check::new("ecn", nd, Level::Warn, detail).fix(format!(
            "enable both on the RoCE priority (`echo 1 > /sys/class/net/{nd}/ecn/roce_np/enable/3`, roce_rp too)"
        ))
    } else {
        Check::new("ecn", nd, Level::Ok, detail)
    }
}

/// The DSCP to priority map (`dcb app show ... dscp-prio`): how RoCE packets find their priority.
fn dscp_check(host: &Host, nd: &str) -> Check {
    let Some(json) = (host.run)("dcb", &["-j", "app", "show", "dev", nd, "dscp-prio"]) else {
        return Check::new("dscp", nd, Level::Info, "not readable: `dcb app show` failed");
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&json) else {
        return Check::new(
            "dscp",
            nd,
            Level::Info,
            format!("`dcb app show` said something unexpected: {}", one_line(&json)),
        );
    };
    let map: Vec<String> = v
        .get("dscp_prio")
        .or_else(|| v.get("dscp-prio"))
        .and_then(|m| m.as_array())
        .map(|a| a.iter().filter_map(|e| Some(format!("{}:{}", e.get(0)?, e.get(1)?))).collect())
        .unwrap_or_default();
    if map.is_empty() {
        Check::new("dscp", nd, Level::Info, "no DSCP map: priorities come from the VLAN PCP (trust pcp)")
    } else {
        Check::new("dscp", nd, Level::Ok, format!("DSCP to priority {}", map.join(" ")))
    }
}

fn join(p: &[u8]) -> String {
    p.iter().map(u8::to_string).collect::<Vec<_>>().join(",")
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(120).collect()
}
