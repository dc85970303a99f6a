//! The Grafana dashboard and the alert rules in `deploy/` query only metrics the agent exports.
//!
//! The exported names come from a real scrape of the agent's exporter over a sysfs tree laid
//! out as an mlx5 port's (every `counters/` file, and the `hw_counters/` files of the kernel's
//! mlx5 driver), since this machine has no RNIC; PFC counters come from ethtool, which a file
//! tree cannot stand in for, so their two names are taken from the exporter's own constants.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use rocemesh_agent::exporter::{Sources, spawn};
use rocemesh_agent::live::{AgentCounters, Class, LiveShard};

/// hw_counters of mlx5 ports (drivers/infiniband/hw/mlx5/counters.c).
const MLX5_HW_COUNTERS: [&str; 30] = [
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rx_icrc_encapsulated",
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "lifespan",
];

/// counters/ of an IB/RoCE port (the PMA counters).
const PORT_COUNTERS: [&str; 22] = [
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_xmit_constraint_errors",
    "port_rcv_data",
    "port_xmit_data",
    "port_rcv_discards",
    "port_xmit_discards",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_xmit_packets",
    "port_xmit_wait",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "symbol_error",
    "VL15_dropped",
];

fn mlx5_sysfs(root: &Path) {
    let port = root.join("class/infiniband/mlx5_0/ports/1");
    for (sub, files) in [("counters", &PORT_COUNTERS[..]), ("hw_counters", &MLX5_HW_COUNTERS[..])] {
        std::fs::create_dir_all(port.join(sub)).expect("mkdir");
        for f in files {
            std::fs::write(port.join(sub).join(f), "1\n").expect("write");
        }
    }
    std::fs::write(port.join("state"), "4: ACTIVE\n").expect("state");
    std::fs::write(port.join("phys_state"), "5: LinkUp\n").expect("phys_state");
    std::fs::write(port.join("rate"), "200 Gb/sec (4X HDR)\n").expect("rate");
}

/// Sample names of one scrape.
fn exported() -> BTreeSet<String> {
    let root = tempfile::tempdir().expect("tempdir");
    mlx5_sysfs(&root.path().join("sys"));
    let live = Arc::new(LiveShard::new("mlx5_0", "tor0"));
    let slot = live.tor_slot("tor1");
    for class in [Class::Ok, Class::Lost, Class::Partial, Class::Invalid, Class::Refused, Class::LocalDrop] {
        live.probe(slot, class, (class == Class::Ok).then_some((5_000, 1_000, 1_000)));
    }
    let src = Sources {
        host: "h0".into(),
        mode: "event".into(),
        shards: vec![(live, root.path().join("segments"))],
        agent: Arc::new(AgentCounters::default()),
        sysfs: root.path().join("sys"),
        infiniband_prefix: "node_infiniband".into(),
    };
    let ep = spawn("127.0.0.1:0".parse().expect("addr"), src).expect("exporter");
    let text = common::http_get(ep.addr, "/metrics").expect("scrape");
    let mut names: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_owned())
        .collect();
    names.insert(format!("{}_pause_frames_total", rocemesh_agent::hwcounters::PFC_PREFIX));
    names.insert(format!("{}_pause_duration_seconds_total", rocemesh_agent::hwcounters::PFC_PREFIX));
    names.insert("up".into());
    assert!(names.contains("node_infiniband_np_ecn_marked_roce_packets_total"), "{names:?}");
    names
}

/// Metric names in a PromQL expression: identifiers that start a selector of ours or `up`.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'"' {
            // A label value: skip it (it may hold anything).
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += 1 + usize::from(bytes[i] == b'\\');
            }
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':') {
                i += 1;
            }
            let word = &expr[start..i];
            // The live analyzer's series are checked against its own rendering
            // (analyze/src/live/metrics.rs).
            if (word.starts_with("rocemesh_") && !word.starts_with("rocemesh_live_"))
                || word.starts_with("node_infiniband_")
                || word == "up"
            {
                out.push(word.to_owned());
            }
            continue;
        }
        i += 1;
    }
    out
}

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn check(what: &str, exprs: &[String], names: &BTreeSet<String>) {
    assert!(!exprs.is_empty(), "{what}: no expressions found");
    let mut used = 0;
    for e in exprs {
        for n in metric_names(e) {
            used += 1;
            assert!(names.contains(&n), "{what}: `{n}` in `{e}` is not exported by the agent");
        }
    }
    assert!(used > exprs.len() / 2, "{what}: found only {used} metric names in {} expressions", exprs.len());
}

#[test]
fn every_dashboard_panel_queries_only_exported_metrics() {
    let names = exported();
    let path = repo().join("deploy/grafana/rocemesh.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut exprs = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    if k == "expr"
                        && let Some(s) = v.as_str()
                    {
                        out.push(s.to_owned());
                    }
                    walk(v, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dash["panels"], &mut exprs);
    let panels = dash["panels"].as_array().map_or(0, Vec::len);
    assert!(panels >= 8, "{} has {panels} panels", path.display());
    check("dashboard", &exprs, &names);
}

#[test]
fn every_alert_rule_queries_only_exported_metrics() {
    let names = exported();
    let path = repo().join("deploy/prometheus/rocemesh-alerts.yml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Each rule's `expr:` is a block scalar (`expr: |` and indented lines) or one line.
    let mut exprs = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if let Some(rest) = l.trim_start().strip_prefix("expr:") {
            let indent = l.len() - l.trim_start().len();
            let rest = rest.trim();
            if rest == "|" || rest == ">" || rest == "|-" || rest == ">-" {
                let mut e = String::new();
                i += 1;
                while i < lines.len()
                    && (lines[i].trim().is_empty() || lines[i].len() - lines[i].trim_start().len() > indent)
                {
                    e.push_str(lines[i].trim());
                    e.push('\n');
                    i += 1;
                }
                exprs.push(e);
                continue;
            }
            exprs.push(rest.trim_matches(['\'', '"']).to_owned());
        }
        i += 1;
    }
    check("alert rules", &exprs, &names);
}
