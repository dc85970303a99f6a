//! `agent describe`: this host's probing endpoints as `ctl inventory import` reads them, so that
//! nobody types GIDs by hand.
//!
//! Each shard becomes one `[[rnic]]`: its device name and bound address, the netdev that owns the
//! address, and, when the device is a verbs device (sysfs `class/infiniband/<device>`), the port
//! and RoCEv2 GID index whose GID is that address.

use std::net::IpAddr;
use std::path::Path;

use rocemesh_formats::describe::{HostDescription, RnicDescription};

use crate::config::AgentConfig;

/// The description of the host `cfg` configures; `sysfs` is normally `/sys`.
pub fn describe(cfg: &AgentConfig, sysfs: &Path) -> HostDescription {
    let rnics = cfg
        .shards
        .iter()
        .map(|s| {
            let ip = s.bind.ip();
            let roce = roce_v2_gid(sysfs, &s.device, ip);
            RnicDescription {
                device: s.device.clone(),
                ip,
                gid: roce.map(|(_, _, gid)| gid),
                port: roce.map(|(port, _, _)| port).unwrap_or(1),
                gid_index: roce.map(|(_, index, _)| index),
                netdev: netdev_of(ip),
            }
        })
        .collect();
    HostDescription { version: rocemesh_formats::describe::VERSION, host: cfg.host.clone(), rnics }
}

/// (port, GID index, GID) of the RoCEv2 GID of `device` that is `ip` (IPv4-mapped for IPv4).
pub(crate) fn roce_v2_gid(sysfs: &Path, device: &str, ip: IpAddr) -> Option<(u8, u16, std::net::Ipv6Addr)> {
    let want = rocemesh_formats::gid::gid_of(ip);
    let ports = sysfs.join("class/infiniband").join(device).join("ports");
    let mut port_dirs: Vec<_> = std::fs::read_dir(&ports).ok()?.flatten().collect();
    port_dirs.sort_by_key(|e| e.file_name());
    for p in port_dirs {
        let Ok(port) = p.file_name().to_string_lossy().parse::<u8>() else { continue };
        if let Some((i, _)) = roce_v2_gids(&p.path()).into_iter().find(|(_, gid)| *gid == want) {
            return Some((port, i, want));
        }
    }
    None
}

/// The RoCE v2 GIDs of one port's sysfs directory (`class/infiniband/<device>/ports/<n>`), by
/// index ascending; empty (all-zero) entries are left out.
pub(crate) fn roce_v2_gids(port_dir: &Path) -> Vec<(u16, std::net::Ipv6Addr)> {
    let Ok(gids) = std::fs::read_dir(port_dir.join("gids")) else { return Vec::new() };
    let mut indexes: Vec<u16> = gids.flatten().filter_map(|g| g.file_name().to_string_lossy().parse().ok()).collect();
    indexes.sort_unstable();
    indexes
        .into_iter()
        .filter_map(|i| {
            let kind = std::fs::read_to_string(port_dir.join(format!("gid_attrs/types/{i}"))).unwrap_or_default();
            // sysfs writes GIDs as eight colon-separated groups, which Ipv6Addr parses.
            let gid = std::fs::read_to_string(port_dir.join(format!("gids/{i}"))).ok()?.trim().parse().ok()?;
            (kind.trim().eq_ignore_ascii_case("RoCE v2") && gid != std::net::Ipv6Addr::UNSPECIFIED).then_some((i, gid))
        })
        .collect()
}

/// The interface that carries `ip`, if any.
fn netdev_of(ip: IpAddr) -> Option<String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    // SAFETY: walking the list getifaddrs returned; each node and its strings stay valid until
    // freeifaddrs; address families are checked before the casts.
    unsafe {
        while !cur.is_null() {
            let a = (*cur).ifa_addr;
            if !a.is_null() {
                let this = match i32::from((*a).sa_family) {
                    libc::AF_INET => {
                        let sin = a.cast::<libc::sockaddr_in>().read_unaligned();
                        Some(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()))
                    }
                    libc::AF_INET6 => {
                        let s6 = a.cast::<libc::sockaddr_in6>().read_unaligned();
                        Some(IpAddr::from(s6.sin6_addr.s6_addr))
                    }
                    _ => None,
                };
                if this == Some(ip) {
                    found = Some(std::ffi::CStr::from_ptr((*cur).ifa_name).to_string_lossy().into_owned());
                    break;
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_roce_v2_gid_of_the_bound_address_in_sysfs() {
        let root = tempfile::tempdir().expect("tempdir");
        let port = root.path().join("class/infiniband/mlx5_0/ports/1");
        std::fs::create_dir_all(port.join("gids")).expect("mkdir");
        std::fs::create_dir_all(port.join("gid_attrs/types")).expect("mkdir");
        let entries = [
            ("0", "fe80:0000:0000:0000:0e42:a1ff:fe00:0001", "IB/RoCE v1"),
            ("1", "fe80:0000:0000:0000:0e42:a1ff:fe00:0001", "RoCE v2"),
            ("2", "0000:0000:0000:0000:0000:ffff:0a00:0011", "IB/RoCE v1"),
            ("3", "0000:0000:0000:0000:0000:ffff:0a00:0011", "RoCE v2"),
        ];
        for (i, gid, kind) in entries {
            std::fs::write(port.join("gids").join(i), format!("{gid}\n")).expect("gid");
            std::fs::write(port.join("gid_attrs/types").join(i), format!("{kind}\n")).expect("type");
        }
        let ip: IpAddr = "10.0.0.17".parse().expect("ip");
        let (p, index, gid) = roce_v2_gid(root.path(), "mlx5_0", ip).expect("found");
        assert_eq!((p, index), (1, 3));
        assert_eq!(gid, "::ffff:10.0.0.17".parse::<std::net::Ipv6Addr>().expect("v6"));
        assert_eq!(roce_v2_gid(root.path(), "mlx5_0", "10.0.0.18".parse().expect("ip")), None);
        assert_eq!(roce_v2_gid(root.path(), "mlx5_9", ip), None);
    }

    #[test]
    fn describes_a_udp_config_and_ctl_can_read_it() {
        let cfg = AgentConfig::parse(
            "host = \"node7\"\npinglist = \"p.toml\"\nsegment_dir = \"s\"\n[[shard]]\ndevice = \"lo-a\"\nbind = \"127.0.0.1:18515\"\ncore = 0\n",
            Path::new("/etc/rocemesh/agent.toml"),
        )
        .expect("config");
        let d = describe(&cfg, Path::new("/nonexistent-sysfs"));
        assert_eq!(d.host, "node7");
        assert_eq!(d.rnics[0].netdev.as_deref(), Some("lo"), "127.0.0.1 lives on lo");
        assert_eq!((d.rnics[0].gid_index, d.rnics[0].port), (None, 1));
        let text = d.to_toml_string().expect("toml");
        let back = HostDescription::parse(&text, Path::new("node7.toml")).expect("ctl's parser takes it");
        assert_eq!(back, d);
    }
}
