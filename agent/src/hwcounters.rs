//! The RNIC's own counters, read at scrape time: `ports/<p>/counters` and `hw_counters` under
//! `/sys/class/infiniband/<dev>` (ECN marks, CNPs sent and handled, out-of-sequence, retransmits,
//! whatever the driver has) and the PFC pause counters of the port's netdev from its ethtool
//! statistics (`SIOCETHTOOL`, the `ethtool -S` table).
//!
//! Names follow node_exporter's infiniband collector (`<prefix>_port_data_received_bytes_total`,
//! labels device and port) so that existing dashboards keep working. A counter the device lacks
//! is absent, never zero. A file that cannot be read (the device was removed) is counted in
//! `rocemesh_hw_counter_read_errors_total` and left out of that scrape. A counter that goes
//! backwards (device reset, driver reload) is counted in `rocemesh_hw_counter_resets_total` and
//! exported as the sum of what it grew by, so it stays monotonic and `rate()` shows no bogus
//! spike or negative step.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// `counters/` files and node_exporter's names for them (without `_total`), with a multiplier:
/// `port_{rcv,xmit}_data` count 4-octet words.
const PORT_COUNTERS: [(&str, &str, u64); 22] = [
    ("excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors", 1),
    ("link_downed", "link_downed", 1),
    ("link_error_recovery", "link_error_recovery", 1),
    ("local_link_integrity_errors", "local_link_integrity_errors", 1),
    ("multicast_rcv_packets", "multicast_packets_received", 1),
    ("multicast_xmit_packets", "multicast_packets_transmitted", 1),
    ("port_rcv_constraint_errors", "port_constraint_errors_received", 1),
    ("port_xmit_constraint_errors", "port_constraint_errors_transmitted", 1),
    ("port_rcv_data", "port_data_received_bytes", 4),
    ("port_xmit_data", "port_data_transmitted_bytes", 4),
    ("port_rcv_discards", "port_discards_received", 1),
    ("port_xmit_discards", "port_discards_transmitted", 1),
    ("port_rcv_errors", "port_errors_received", 1),
    ("port_rcv_packets", "port_packets_received", 1),
    ("port_xmit_packets", "port_packets_transmitted", 1),
    ("port_xmit_wait", "port_transmit_wait", 1),
    ("unicast_rcv_packets", "unicast_packets_received", 1),
    ("unicast_xmit_packets", "unicast_packets_transmitted", 1),
    ("port_rcv_remote_physical_errors", "port_receive_remote_physical_errors", 1),
    ("port_rcv_switch_relay_errors", "port_receive_switch_relay_errors", 1),
    ("symbol_error", "symbol_error", 1),
    ("VL15_dropped", "vl15_dropped", 1),
];

/// `hw_counters/` files that are settings, not counts.
const NOT_COUNTERS: [&str; 1] = ["lifespan"];

/// One exported counter value.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterSample {
    /// Metric name without the prefix and without `_total`.
    pub name: String,
    /// Labels besides device and port: (key, value).
    pub labels: Vec<(&'static str, String)>,
    /// Monotonic value.
    pub value: f64,
}

/// What one port has, as read by one scrape.
#[derive(Clone, Debug, Default)]
pub struct PortSample {
    /// RDMA device.
    pub device: String,
    /// Port number.
    pub port: String,
    /// `state_id`, `physical_state_id`, `rate_bytes_per_second` (those readable).
    pub gauges: Vec<(&'static str, f64)>,
    /// Counters (prefixed names; PFC ones carry their own full names, see [`PFC_PREFIX`]).
    pub counters: Vec<CounterSample>,
    /// PFC counters from the netdev's ethtool statistics.
    pub pfc: Vec<CounterSample>,
    /// Resets seen on this port so far.
    pub resets: u64,
    /// Read errors on this port so far.
    pub read_errors: u64,
}

/// The prefix of the PFC metrics (not node_exporter's: it has none).
pub const PFC_PREFIX: &str = "rocemesh_pfc";

/// Keeps a counter monotonic across resets.
#[derive(Clone, Copy, Debug, Default)]
struct Mono {
    last_raw: u64,
    base: u64,
}

impl Mono {
    /// The exported value for a new raw reading; `true` when the raw value went backwards.
    fn next(&mut self, raw: u64) -> (u64, bool) {
        let reset = raw < self.last_raw;
        if reset {
            self.base = self.base.saturating_add(self.last_raw);
        }
        self.last_raw = raw;
        (self.base.saturating_add(raw), reset)
    }
}

/// Reads the counters of a set of RDMA devices, scrape after scrape.
#[derive(Debug)]
pub struct HwCounters {
    sysfs: PathBuf,
    devices: Vec<String>,
    mono: HashMap<(String, String, String), Mono>,
    resets: HashMap<(String, String), u64>,
    read_errors: HashMap<(String, String), u64>,
    /// Errors already logged, by (device, what): once each.
    logged: std::collections::HashSet<(String, String)>,
}

impl HwCounters {
    /// Counters of `devices` under `sysfs` (normally `/sys`). A device that is not there (a UDP
    /// shard's name, an RNIC removed) simply has no counters.
    pub fn new(sysfs: &Path, devices: Vec<String>) -> Self {
        Self {
            sysfs: sysfs.to_owned(),
            devices,
            mono: HashMap::new(),
            resets: HashMap::new(),
            read_errors: HashMap::new(),
            logged: std::collections::HashSet::new(),
        }
    }

    /// Read everything now.
    pub fn read(&mut self) -> Vec<PortSample> {
        let mut out = Vec::new();
        for device in self.devices.clone() {
            let ports = self.sysfs.join("class/infiniband").join(&device).join("ports");
            let Ok(entries) = std::fs::read_dir(&ports) else { continue };
            let mut names: Vec<String> =
                entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            for port in names {
                out.push(self.read_port(&device, &port, &ports.join(&port)));
            }
        }
        out
    }

    fn read_port(&mut self, device: &str, port: &str, dir: &Path) -> PortSample {
        let mut s = PortSample { device: device.to_owned(), port: port.to_owned(), ..PortSample::default() };
        let resets_before = self.resets.get(&(device.to_owned(), port.to_owned())).copied().unwrap_or(0);
        if let Some(v) = self.text(device, port, &dir.join("state")).and_then(|t| leading_int(&t)) {
            s.gauges.push(("state_id", v));
        }
        if let Some(v) = self.text(device, port, &dir.join("phys_state")).and_then(|t| leading_int(&t)) {
            s.gauges.push(("physical_state_id", v));
        }
        if let Some(v) = self.text(device, port, &dir.join("rate")).and_then(|t| rate_bytes_per_second(&t)) {
            s.gauges.push(("rate_bytes_per_second", v));
        }
        for (sub, known) in [("counters", true), ("hw_counters", false)] {
            let Ok(entries) = std::fs::read_dir(dir.join(sub)) else { continue };
            let mut files: Vec<String> =
                entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            files.sort();
            for file in files {
                if !known && NOT_COUNTERS.contains(&file.as_str()) {
                    continue;
                }
                let (mut name, mult) = match PORT_COUNTERS.iter().find(|(f, _, _)| known && *f == file) {
                    Some((_, name, mult)) => ((*name).to_owned(), *mult),
                    None => (metric_name(&file), 1),
                };
                // rxe has `link_downed` in both directories, counting different things: the
                // driver's own one is `hw_link_downed`, so that no two samples share a series.
                if !known && s.counters.iter().any(|c| c.name == name) {
                    name = format!("hw_{name}");
                }
                let Some(raw) = self.number(device, port, &dir.join(sub).join(&file)) else { continue };
                let value = self.monotonic(device, port, &format!("{sub}/{file}"), raw);
                s.counters.push(CounterSample { name, labels: Vec::new(), value: value.saturating_mul(mult) as f64 });
            }
        }
        if let Some(netdev) = self.text(device, port, &dir.join("gid_attrs/ndevs/0")) {
            let netdev = netdev.trim().to_owned();
            match ethtool_stats(&netdev) {
                Ok(stats) => {
                    for (name, raw) in stats {
                        let Some(p) = classify_pause(&name) else { continue };
                        let value = self.monotonic(device, port, &format!("ethtool/{netdev}/{name}"), raw) as f64;
                        let labels = vec![
                            ("netdev", netdev.clone()),
                            ("direction", p.direction.to_owned()),
                            ("priority", p.priority.clone()),
                        ];
                        let (metric, value) = if p.duration_us {
                            ("pause_duration_seconds", value / 1e6)
                        } else {
                            ("pause_frames", value)
                        };
                        s.pfc.push(CounterSample { name: metric.to_owned(), labels, value });
                    }
                }
                // A netdev without driver statistics (veth, virtio, lo) has no pause counters:
                // nothing to say. Any other failure is said once.
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
                Err(e) => self.once(device, &format!("ethtool {netdev}"), &e.to_string()),
            }
        }
        s.resets = self.resets.get(&(device.to_owned(), port.to_owned())).copied().unwrap_or(0);
        if s.resets > resets_before {
            // One line per port and scrape, not per counter: a re-added device resets dozens.
            tracing::info!(
                device,
                port,
                counters = s.resets - resets_before,
                "RNIC counters went backwards (device reset or re-added); exported as continuing"
            );
        }
        s.read_errors = self.read_errors.get(&(device.to_owned(), port.to_owned())).copied().unwrap_or(0);
        s
    }

    fn monotonic(&mut self, device: &str, port: &str, key: &str, raw: u64) -> u64 {
        let m = self.mono.entry((device.to_owned(), port.to_owned(), key.to_owned())).or_default();
        let (v, reset) = m.next(raw);
        if reset {
            *self.resets.entry((device.to_owned(), port.to_owned())).or_default() += 1;
        }
        v
    }

    fn text(&mut self, device: &str, port: &str, path: &Path) -> Option<String> {
        match std::fs::read_to_string(path) {
            Ok(t) => Some(t),
            // Absent: the device does not have it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                self.read_failed(device, port, path, &e.to_string());
                None
            }
        }
    }

    fn number(&mut self, device: &str, port: &str, path: &Path) -> Option<u64> {
        let t = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                // A file listed a moment ago and gone now: the device is being removed.
                self.read_failed(device, port, path, &e.to_string());
                return None;
            }
        };
        match t.trim().parse::<u64>() {
            Ok(v) => Some(v),
            Err(_) => {
                self.read_failed(device, port, path, &format!("not a counter: {:?}", t.trim()));
                None
            }
        }
    }

    fn read_failed(&mut self, device: &str, port: &str, path: &Path, why: &str) {
        *self.read_errors.entry((device.to_owned(), port.to_owned())).or_default() += 1;
        self.once(device, &path.display().to_string(), why);
    }

    fn once(&mut self, device: &str, what: &str, why: &str) {
        if self.logged.insert((device.to_owned(), what.to_owned())) {
            tracing::warn!(device, "reading {what} failed: {why} (left out of the metrics; said once)");
        }
    }
}

/// A file name as a metric name: lower case, anything but `[a-z0-9_]` as `_`.
fn metric_name(file: &str) -> String {
    file.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect()
}

/// "4: ACTIVE" -> 4.
fn leading_int(t: &str) -> Option<f64> {
    t.split(':').next()?.trim().parse::<u64>().ok().map(|v| v as f64)
}

/// "100 Gb/sec (4X EDR)" -> 12.5e9 bytes per second.
fn rate_bytes_per_second(t: &str) -> Option<f64> {
    let mut it = t.split_whitespace();
    let n: f64 = it.next()?.parse().ok()?;
    let unit = it.next()?;
    let bits = match unit {
        "Gb/sec" => 1e9,
        "Mb/sec" => 1e6,
        _ => return None,
    };
    Some(n * bits / 8.0)
}

/// A pause counter of the ethtool table.
#[derive(Debug, PartialEq, Eq)]
struct Pause {
    direction: &'static str,
    /// "0".."7", or "global" for link-level (802.3x) pause.
    priority: String,
    /// A duration in µs (mlx5's `*_pause_duration`), not a frame count.
    duration_us: bool,
}

/// Pause counters by driver naming: mlx5 `rx_prio3_pause`, `rx_prio3_pause_duration`,
/// `rx_pause_ctrl_phy`; bnxt_en `rx_pfc_ena_frames_pri3`; generic `rx_pause_frames`,
/// `rx_pause`. Other names are not pause counters (or a driver this table does not know yet).
fn classify_pause(name: &str) -> Option<Pause> {
    let (direction, rest) = if let Some(r) = name.strip_prefix("rx_") {
        ("rx", r)
    } else if let Some(r) = name.strip_prefix("tx_") {
        ("tx", r)
    } else {
        return None;
    };
    let prio = |s: &str| (s.len() == 1 && s.as_bytes()[0].is_ascii_digit() && s < "8").then(|| s.to_owned());
    let pause = |priority: String, duration_us: bool| Some(Pause { direction, priority, duration_us });
    if let Some(r) = rest.strip_prefix("prio") {
        if let Some(p) = r.strip_suffix("_pause_duration") {
            return pause(prio(p)?, true);
        }
        if let Some(p) = r.strip_suffix("_pause") {
            return pause(prio(p)?, false);
        }
        return None;
    }
    if let Some(p) = rest.strip_prefix("pfc_ena_frames_pri") {
        return pause(prio(p)?, false);
    }
    if matches!(rest, "pause_ctrl_phy" | "pause_frames" | "pause") {
        return pause("global".to_owned(), false);
    }
    None
}

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETH_SS_STATS: u32 = 1;
const ETH_GSTRING_LEN: usize = 32;
/// More statistics than any driver has (mlx5: about 2,000 with many queues).
const MAX_STATS: usize = 65_536;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

/// The netdev's ethtool statistics (`ethtool -S`), by name.
pub fn ethtool_stats(netdev: &str) -> std::io::Result<Vec<(String, u64)>> {
    if netdev.is_empty() || netdev.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("bad interface name {netdev:?}")));
    }
    // SAFETY: a plain socket call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let r = ethtool_stats_fd(fd, netdev);
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };
    r
}

fn ioctl(fd: libc::c_int, netdev: &str, data: *mut libc::c_void) -> std::io::Result<()> {
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], data, _pad: [0; 16] };
    req.name[..netdev.len()].copy_from_slice(netdev.as_bytes());
    // SAFETY: `req` is a valid ifreq whose data points at a buffer the caller sized for the
    // command; the kernel writes within it.
    if unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &raw mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn ethtool_stats_fd(fd: libc::c_int, netdev: &str) -> std::io::Result<Vec<(String, u64)>> {
    // ethtool_sset_info: cmd, reserved, sset_mask, then one u32 per set in the mask.
    let mut info = [0u32; 6];
    info[0] = ETHTOOL_GSSET_INFO;
    // sset_mask is the u64 at byte 8 (u32 index 2); little and big endian alike, bit 1 of the
    // 64-bit mask is set by writing the u64.
    let mask = 1u64 << ETH_SS_STATS;
    info[2..4].copy_from_slice(&[mask as u32, (mask >> 32) as u32]);
    if cfg!(target_endian = "big") {
        info.swap(2, 3);
    }
    ioctl(fd, netdev, info.as_mut_ptr().cast())?;
    let n = info[4] as usize;
    if n == 0 {
        return Ok(Vec::new());
    }
    if n > MAX_STATS {
        return Err(std::io::Error::other(format!("{n} statistics is more than any driver has")));
    }
    // ethtool_gstrings: cmd, string_set, len, then len * 32 bytes.
    let mut strings = vec![0u32; 3 + n * ETH_GSTRING_LEN / 4];
    strings[0] = ETHTOOL_GSTRINGS;
    strings[1] = ETH_SS_STATS;
    strings[2] = n as u32;
    ioctl(fd, netdev, strings.as_mut_ptr().cast())?;
    // ethtool_stats: cmd, n_stats, then n u64 (8-aligned: the header is 8 bytes).
    let mut stats = vec![0u64; 1 + n];
    stats[0] = u64::from(ETHTOOL_GSTATS) | (n as u64) << 32;
    if cfg!(target_endian = "big") {
        stats[0] = (u64::from(ETHTOOL_GSTATS) << 32) | n as u64;
    }
    ioctl(fd, netdev, stats.as_mut_ptr().cast())?;
    let got = (strings[2] as usize).min(n);
    let bytes: Vec<u8> = strings[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok((0..got)
        .map(|i| {
            let raw = &bytes[i * ETH_GSTRING_LEN..(i + 1) * ETH_GSTRING_LEN];
            let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
            (String::from_utf8_lossy(&raw[..end]).into_owned(), stats[1 + i])
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    fn fake_port(root: &Path) -> PathBuf {
        let port = root.join("class/infiniband/mlx5_0/ports/1");
        write(&port.join("state"), "4: ACTIVE\n");
        write(&port.join("phys_state"), "5: LinkUp\n");
        write(&port.join("rate"), "100 Gb/sec (4X EDR)\n");
        write(&port.join("counters/port_rcv_data"), "1000\n");
        write(&port.join("counters/symbol_error"), "0\n");
        write(&port.join("hw_counters/np_ecn_marked_roce_packets"), "7\n");
        write(&port.join("hw_counters/lifespan"), "10\n");
        write(&port.join("counters/link_downed"), "1\n");
        write(&port.join("hw_counters/link_downed"), "3\n");
        port
    }

    fn value(s: &PortSample, name: &str) -> Option<f64> {
        s.counters.iter().find(|c| c.name == name).map(|c| c.value)
    }

    #[test]
    fn counters_are_named_as_node_exporter_names_them_and_missing_ones_are_absent() {
        let root = tempfile::tempdir().expect("tempdir");
        fake_port(root.path());
        let mut h = HwCounters::new(root.path(), vec!["mlx5_0".into(), "lo0".into()]);
        let s = h.read();
        assert_eq!(s.len(), 1, "lo0 is no RDMA device: no port");
        let p = &s[0];
        assert_eq!(value(p, "port_data_received_bytes"), Some(4000.0), "4-octet words");
        assert_eq!(value(p, "symbol_error"), Some(0.0), "a zero the device reports is a zero");
        assert_eq!(value(p, "np_ecn_marked_roce_packets"), Some(7.0));
        assert_eq!(value(p, "lifespan"), None, "a setting, not a counter");
        assert_eq!(value(p, "port_xmit_data"), None, "absent, not zero");
        assert_eq!(value(p, "port_data_transmitted_bytes"), None);
        assert_eq!(value(p, "link_downed"), Some(1.0), "counters/ keeps node_exporter's name");
        assert_eq!(value(p, "hw_link_downed"), Some(3.0), "the driver's own count of the same name (rxe)");
        assert!(p.gauges.contains(&("state_id", 4.0)));
        assert!(p.gauges.contains(&("rate_bytes_per_second", 12.5e9)));
    }

    #[test]
    fn a_counter_going_backwards_stays_monotonic_and_a_vanished_device_is_absent() {
        let root = tempfile::tempdir().expect("tempdir");
        let port = fake_port(root.path());
        let mut h = HwCounters::new(root.path(), vec!["mlx5_0".into()]);
        assert_eq!(value(&h.read()[0], "np_ecn_marked_roce_packets"), Some(7.0));
        write(&port.join("hw_counters/np_ecn_marked_roce_packets"), "9\n");
        assert_eq!(value(&h.read()[0], "np_ecn_marked_roce_packets"), Some(9.0));
        // Device reset: the raw counter starts again from 2.
        write(&port.join("hw_counters/np_ecn_marked_roce_packets"), "2\n");
        let p = &h.read()[0];
        assert_eq!(value(p, "np_ecn_marked_roce_packets"), Some(11.0), "9 before the reset + 2 after");
        assert_eq!(p.resets, 1);
        // Garbage in a file: left out and counted, the rest still read.
        write(&port.join("hw_counters/np_ecn_marked_roce_packets"), "n/a\n");
        let p = &h.read()[0];
        assert_eq!(value(p, "np_ecn_marked_roce_packets"), None);
        assert_eq!(p.read_errors, 1);
        assert_eq!(value(p, "port_data_received_bytes"), Some(4000.0));
        // The device goes away: nothing, no panic; it comes back with small counters.
        std::fs::remove_dir_all(root.path().join("class/infiniband/mlx5_0")).expect("rm");
        assert!(h.read().is_empty());
        fake_port(root.path());
        let p = &h.read()[0];
        assert_eq!(value(p, "port_data_received_bytes"), Some(4000.0), "same raw value: no reset");
        // 9 counted before the reset, and the raw 7 now (2 was the last good reading: no reset).
        assert_eq!(value(p, "np_ecn_marked_roce_packets"), Some(16.0));
    }

    #[test]
    fn pause_counters_of_known_drivers_are_recognised() {
        let p =
            |d: &'static str, pr: &str, dur: bool| Some(Pause { direction: d, priority: pr.into(), duration_us: dur });
        assert_eq!(classify_pause("rx_prio3_pause"), p("rx", "3", false));
        assert_eq!(classify_pause("tx_prio0_pause_duration"), p("tx", "0", true));
        assert_eq!(classify_pause("rx_pause_ctrl_phy"), p("rx", "global", false));
        assert_eq!(classify_pause("tx_pfc_ena_frames_pri7"), p("tx", "7", false));
        assert_eq!(classify_pause("rx_prio3_pause_transition"), None);
        assert_eq!(classify_pause("rx_prio8_pause"), None);
        assert_eq!(classify_pause("rx_prio3_bytes"), None);
        assert_eq!(classify_pause("rx_queue_0_packets"), None);
    }

    #[test]
    fn a_netdev_without_statistics_is_a_clean_error() {
        assert!(ethtool_stats("").is_err());
        assert!(ethtool_stats("a-name-longer-than-ifnamsiz").is_err());
        // Loopback has no driver statistics; a missing interface is ENODEV. Neither panics.
        assert!(ethtool_stats("lo").map(|s| s.is_empty()).unwrap_or(true));
        let e = ethtool_stats("rmnosuchif0").expect_err("no such interface");
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
    }
}
