//! The soft-RoCE lab's `/metrics` checks: the agents' endpoints serve the rxe devices' real
//! `hw_counters`, keep serving while a device is deleted (its counters absent, not zero, and
//! `rocemesh_device_up` 0), and after the device is back its counters continue from where they
//! were although the new device starts from zero.
//!
//! Each agent serves on 127.0.0.1:[`METRICS_PORT`] of its host's network namespace; the lab
//! scrapes it with `ip netns exec <host> testbeds http-get`.
//!
//! The agents read sysfs at [`HOST_SYSFS`], a bind mount of the initial namespace's `/sys`:
//! `ip netns exec` mounts a fresh sysfs for the namespace, where rdma's shared-mode devices
//! appear without `counters/` and `hw_counters/` (seen on the guest's 7.3 kernel). A real agent
//! runs in the host's own namespace and reads `/sys`; the `[metrics] sysfs` key exists for
//! agents in containers and namespaces like these.

/// Where the lab bind-mounts the initial namespace's `/sys` for its agents.
pub const HOST_SYSFS: &str = "/run/rocemesh-host-sys";

/// Bind-mount `/sys` at [`HOST_SYSFS`] (from the initial namespace, where the lab runs).
pub fn mount_host_sysfs() -> anyhow::Result<()> {
    std::fs::create_dir_all(HOST_SYSFS).with_context(|| format!("creating {HOST_SYSFS}"))?;
    if Path::new(HOST_SYSFS).join("class").exists() {
        return Ok(());
    }
    let st = Command::new("mount").args(["--bind", "/sys", HOST_SYSFS]).status().context("running mount")?;
    if !st.success() {
        bail!("mount --bind /sys {HOST_SYSFS} failed ({st})");
    }
    Ok(())
}

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

use crate::harness::Check;

/// Port of every lab agent's `/metrics`, on the loopback of its namespace.
pub const METRICS_PORT: u16 = 9745;

/// One sample: name, labels, value.
pub type Sample = (String, BTreeMap<String, String>, f64);

/// `GET http://addr/path`; the body (HTTP/1.0, so never chunked).
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path} from {addr}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_owned())
}

/// Scrape the agent of `host` from inside its namespace.
pub fn scrape(testbeds: &Path, host: &str) -> anyhow::Result<Vec<Sample>> {
    let out = Command::new("ip")
        .args(["netns", "exec", host])
        .arg(testbeds)
        .args(["http-get", &format!("127.0.0.1:{METRICS_PORT}"), "/metrics"])
        .output()
        .context("running testbeds http-get")?;
    if !out.status.success() {
        bail!("scraping the agent of {host} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8(out.stdout).context("the exposition is not UTF-8")?;
    if !text.trim_end().ends_with("# EOF") {
        bail!("the exposition of {host} does not end with # EOF");
    }
    Ok(parse(&text))
}

/// The samples of an OpenMetrics text exposition (label values without escapes, as ours are).
pub fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split("\",")
            .filter_map(|kv| kv.split_once("=\""))
            .map(|(k, v)| (k.to_owned(), v.trim_end_matches('"').to_owned()))
            .collect();
        out.push((name.to_owned(), labels, value));
    }
    out
}

/// The value of `name` with `device`, if exported.
pub fn value(samples: &[Sample], name: &str, device: &str) -> Option<f64> {
    samples.iter().find(|(n, l, _)| n == name && l.get("device").map(String::as_str) == Some(device)).map(|s| s.2)
}

/// The RNIC counters (`node_infiniband_*_total`) of `device`.
pub fn hw_names(samples: &[Sample], device: &str) -> Vec<String> {
    let mut v: Vec<String> = samples
        .iter()
        .filter(|(n, l, _)| {
            n.starts_with("node_infiniband_")
                && n.ends_with("_total")
                && l.get("device").map(String::as_str) == Some(device)
        })
        .map(|(n, _, _)| n.clone())
        .collect();
    v.dedup();
    v
}

/// Scrapes of one host at points of the timeline.
#[derive(Debug, Default)]
pub struct Scrapes {
    /// Host and device of the clean-phase scrapes.
    pub clean: (String, String),
    /// Start and end of the clean phase.
    pub clean_from: Vec<Sample>,
    pub clean_to: Vec<Sample>,
    /// Host and device whose RDMA device is deleted and re-added.
    pub removed: (String, String),
    pub before_removal: Vec<Sample>,
    pub during_removal: Vec<Sample>,
    pub after_readd: Vec<Sample>,
}

const SENT: &str = "node_infiniband_sent_pkts_total";

/// The checks over `s`.
pub fn checks(s: &Scrapes) -> Vec<Check> {
    let (host, dev) = (&s.clean.0, s.clean.1.as_str());
    let names = hw_names(&s.clean_to, dev);
    let sent = (value(&s.clean_from, SENT, dev), value(&s.clean_to, SENT, dev));
    let ok_probes: f64 = s
        .clean_to
        .iter()
        .filter(|(n, l, _)| n == "rocemesh_probes_total" && l.get("outcome").map(String::as_str) == Some("ok"))
        .map(|x| x.2)
        .sum();
    let hw_ok = names.iter().any(|n| n == SENT)
        && names.iter().any(|n| n == "node_infiniband_rcvd_pkts_total")
        && matches!(sent, (Some(a), Some(b)) if b > a);
    let mut out = vec![Check {
        name: "metrics: rxe hw_counters in /metrics".into(),
        ok: hw_ok && ok_probes > 0.0 && value(&s.clean_to, "rocemesh_device_up", dev) == Some(1.0),
        detail: format!(
            "{host}/{dev}: {} counters ({}); sent_pkts {:?} -> {:?} over the clean phase; {ok_probes} ok probes",
            names.len(),
            names
                .iter()
                .map(|n| n.trim_start_matches("node_infiniband_").trim_end_matches("_total"))
                .collect::<Vec<_>>()
                .join(", "),
            sent.0,
            sent.1
        ),
    }];
    let (host, dev) = (&s.removed.0, s.removed.1.as_str());
    let before = value(&s.before_removal, SENT, dev);
    let during_hw = hw_names(&s.during_removal, dev);
    let during_up = value(&s.during_removal, "rocemesh_device_up", dev);
    let after = value(&s.after_readd, SENT, dev);
    let resets = value(&s.after_readd, "rocemesh_hw_counter_resets_total", dev);
    let ok = during_hw.is_empty()
        && during_up == Some(0.0)
        && value(&s.after_readd, "rocemesh_device_up", dev) == Some(1.0)
        && matches!((before, after), (Some(b), Some(a)) if a >= b);
    out.push(Check {
        name: "metrics: device removed and back".into(),
        ok,
        detail: format!(
            "{host}/{dev}: sent_pkts {before:?} before removal; while removed: device_up {during_up:?}, {} RNIC counters; \
             after re-add: device_up {:?}, sent_pkts {after:?}, resets counted {resets:?}",
            during_hw.len(),
            value(&s.after_readd, "rocemesh_device_up", dev)
        ),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_and_labels() {
        let s = parse(
            "# TYPE x counter\nx_total{device=\"rxe0\",port=\"1\"} 12\nup 1\nh_bucket{le=\"+Inf\",device=\"d\"} 3\n# EOF\n",
        );
        assert_eq!(s.len(), 3);
        assert_eq!(value(&s, "x_total", "rxe0"), Some(12.0));
        assert_eq!(s[1].0, "up");
        assert_eq!(s[2].1.get("le").map(String::as_str), Some("+Inf"));
    }
}
