//! The doctor on fake sysfs and procfs trees: a healthy mlx5-like node, the faults an operator
//! meets (a port down, no RoCE v2 GID, a small MTU, PFC and ECN off, a busy core, a clock far
//! off), and a host without RDMA, which must warn, not fail or crash.

use std::path::Path;
use std::time::Duration;

use super::host::{busy_share, cpu_list};
use super::rdma::{pfc_priorities, roce_mtu};
use super::*;

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

/// A node with `mlx5_0` port 1 on `eth0` (10.0.0.5, RoCE v2 at index 3) and 4 cores.
fn node(root: &Path) {
    let port = "sys/class/infiniband/mlx5_0/ports/1";
    write(root, &format!("{port}/state"), "4: ACTIVE\n");
    write(root, &format!("{port}/link_layer"), "Ethernet\n");
    write(root, &format!("{port}/gids/0"), "fe80:0000:0000:0000:0000:0000:0000:0001\n");
    write(root, &format!("{port}/gid_attrs/types/0"), "IB/RoCE v1\n");
    write(root, &format!("{port}/gids/3"), "0000:0000:0000:0000:0000:ffff:0a00:0005\n");
    write(root, &format!("{port}/gid_attrs/types/3"), "RoCE v2\n");
    write(root, &format!("{port}/gid_attrs/ndevs/3"), "eth0\n");
    write(root, &format!("{port}/gids/4"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
    write(root, "sys/class/net/eth0/mtu", "9000\n");
    for p in 0..8 {
        let on = if p == 3 { "1" } else { "0" };
        write(root, &format!("sys/class/net/eth0/ecn/roce_np/enable/{p}"), on);
        write(root, &format!("sys/class/net/eth0/ecn/roce_rp/enable/{p}"), on);
    }
    write(root, "sys/kernel/btf/vmlinux", "");
    write(root, "sys/kernel/btf/ib_core", "");
    write(root, "sys/devices/system/cpu/online", "0-3\n");
    write(root, "sys/devices/system/cpu/isolated", "1-3\n");
    write(root, "proc/stat", "cpu  1 1 1 1\ncpu0 100 0 100 800 0 0 0 0\ncpu1 0 0 0 1000 0 0 0 0\n");
}

/// The tools' answers on a healthy node: PFC on priority 3, DSCP 26 to priority 3, chrony 20 µs off.
fn healthy_tools(program: &str, args: &[&str]) -> Option<String> {
    match (program, args.get(1).copied()) {
        ("dcb", Some("pfc")) => Some(
            r#"{"pfc_cap":8,"prio_pfc":[{"prio":0,"enabled":false},{"prio":3,"enabled":true},{"prio":4,"enabled":false}]}"#
                .into(),
        ),
        ("dcb", Some("app")) => Some(r#"{"dscp_prio":[[26,3],[48,6]]}"#.into()),
        ("chronyc", _) => {
            Some("A29FC87B,ntp1,3,1764201600.000000000,-0.000020000,0.000001,0.00002,1.2,0,0.01,0.001,0.001,64.0,Normal\n".into())
        }
        _ => None,
    }
}

fn nic_clock(_: &str) -> Result<ClockCaps, String> {
    Ok(ClockCaps { completion_timestamp_mask: u64::MAX >> 1, hca_core_clock_khz: 1_000_000 })
}

fn host<'a>(
    root: &Path,
    clock: &'a dyn Fn(&str) -> Result<ClockCaps, String>,
    tools: &'a dyn Fn(&str, &[&str]) -> Option<String>,
) -> Host<'a> {
    Host { sys: root.join("sys"), proc: root.join("proc"), clock_caps: clock, run: tools, sample: Duration::ZERO }
}

fn find<'a>(r: &'a Report, area: &str) -> &'a Check {
    r.checks.iter().find(|c| c.area == area).unwrap_or_else(|| panic!("no {area} check: {}", r.render_table()))
}

/// A config of one shard on core 1 (the machines that run the tests have at least 2), with its
/// pinglist, in `root`.
fn config(root: &Path, extra: &str) -> std::path::PathBuf {
    write(
        root,
        "pl.toml",
        "version = 1\nhost = \"h0\"\ngeneration = 4\ngenerated_unix_ns = 0\n[[target]]\nfrom = \"mlx5_0\"\nto = \"h1/mlx5_0\"\ntor = \"t0\"\nkind = \"tor_mesh\"\naddr = \"10.0.0.6\"\nrate_pps = 10.0\nflow_labels = [1]\n",
    );
    write(
        root,
        "agent.toml",
        &format!(
            "host = \"h0\"\npinglist = \"pl.toml\"\nsegment_dir = \"seg\"\n{extra}\n[[shard]]\ndevice = \"mlx5_0\"\nbind = \"10.0.0.5:18515\"\ncore = 1\n"
        ),
    );
    root.join("agent.toml")
}

#[test]
fn a_healthy_node_is_ok_throughout() {
    let dir = tempfile::tempdir().expect("tempdir");
    node(dir.path());
    let cfg = config(dir.path(), "");
    let r = run(Some(&cfg), &host(dir.path(), &nic_clock, &healthy_tools));
    let table = r.render_table();
    for area in ["config", "pinglist", "port", "gid", "clock", "mtu", "pfc", "ecn", "dscp", "time", "core"] {
        assert_eq!(find(&r, area).level, Level::Ok, "{area}:\n{table}");
    }
    assert!(find(&r, "gid").detail.contains("3: 10.0.0.5 (eth0)"), "{table}");
    assert!(find(&r, "pfc").detail.contains("priorities 3"), "{table}");
    assert!(find(&r, "dscp").detail.contains("26:3 48:6"), "{table}");
    assert!(find(&r, "clock").detail.contains("wall clock, else the NIC's ticks at 1000 MHz"), "{table}");
    // A fake /proc/stat does not move: the load is unknown (busy_share is tested below).
    assert!(find(&r, "core").detail.starts_with("isolated, load unknown"), "{table}");
    assert!(find(&r, "pinglist").detail.contains("generation 4, 1 targets"), "{table}");
    // Capabilities and the memlock limit are those of whoever runs the test.
    let worse: Vec<&Check> =
        r.checks.iter().filter(|c| c.level > Level::Info && c.area != "caps" && c.area != "memlock").collect();
    assert!(worse.is_empty(), "{table}");
}

#[test]
fn what_an_operator_meets_is_named_with_its_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    node(root);
    write(root, "sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n");
    write(root, "sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/3", "IB/RoCE v1\n");
    write(root, "sys/class/net/eth0/ecn/roce_rp/enable/3", "0");
    // The netdev is no RoCE v2 GID's now; a second port keeps one to look at its MTU and PFC.
    let p2 = "sys/class/infiniband/mlx5_0/ports/2";
    write(root, &format!("{p2}/state"), "4: ACTIVE\n");
    write(root, &format!("{p2}/link_layer"), "Ethernet\n");
    write(root, &format!("{p2}/gids/1"), "0000:0000:0000:0000:0000:ffff:0a00:0105\n");
    write(root, &format!("{p2}/gid_attrs/types/1"), "RoCE v2\n");
    write(root, &format!("{p2}/gid_attrs/ndevs/1"), "eth0\n");
    write(root, "sys/class/net/eth0/mtu", "1500\n");
    write(root, "proc/stat", "cpu0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0\n");
    let off_tools = |program: &str, args: &[&str]| -> Option<String> {
        match (program, args.get(1).copied()) {
            ("dcb", Some("pfc")) => Some(r#"{"prio_pfc":[{"prio":3,"enabled":false}]}"#.into()),
            ("chronyc", _) => Some("A,n,3,0,2.500000,0,0,0,0,0,0,0,64,Normal".into()),
            _ => None,
        }
    };
    let cfg = config(root, "[auth]\nkeys = \"keys.toml\"");
    // A verbs shard on mlx5_0, so that its port without a RoCE v2 GID fails; mlx5_1, which no
    // shard uses, has none either and only warns.
    let text = std::fs::read_to_string(&cfg)
        .expect("config")
        .replace("device = \"mlx5_0\"", "device = \"mlx5_0\"\ntransport = \"verbs\"");
    write(root, "agent.toml", &text);
    write(root, "sys/class/infiniband/mlx5_1/ports/1/state", "4: ACTIVE\n");
    write(root, "sys/class/infiniband/mlx5_1/ports/1/link_layer", "Ethernet\n");
    let no_stamps = |_: &str| Ok(ClockCaps::default());
    let r = run(Some(&cfg), &host(root, &no_stamps, &off_tools));
    let table = r.render_table();
    let port1 = r.checks.iter().find(|c| c.area == "port" && c.subject == "mlx5_0/1").expect("port 1");
    assert_eq!(port1.level, Level::Warn, "{table}");
    assert!(port1.detail.contains("1: DOWN") && port1.fix.contains("bring the link up"), "{table}");
    let gid1 = r.checks.iter().find(|c| c.area == "gid" && c.subject == "mlx5_0/1").expect("gid 1");
    assert_eq!(gid1.level, Level::Fail, "{table}");
    assert!(gid1.fix.contains("configure the shard's IP address"), "{table}");
    let unused = r.checks.iter().find(|c| c.area == "gid" && c.subject == "mlx5_1/1").expect("mlx5_1's gid");
    assert_eq!(unused.level, Level::Warn, "no shard uses it: {table}");
    assert_eq!(find(&r, "mtu").level, Level::Warn, "{table}");
    assert!(find(&r, "mtu").detail.contains("RoCE MTU 1024"), "{table}");
    assert_eq!(find(&r, "pfc").level, Level::Warn, "{table}");
    assert!(find(&r, "pfc").fix.contains("dcb pfc set dev eth0"), "{table}");
    assert_eq!(find(&r, "ecn").level, Level::Warn, "{table}");
    assert_eq!(find(&r, "dscp").level, Level::Info, "unreadable is info, not a fault: {table}");
    assert_eq!(find(&r, "clock").level, Level::Warn, "{table}");
    assert!(find(&r, "clock").detail.contains("host_poll"), "{table}");
    // 2.5 s off, beyond half the 2 s [auth] window: a peer as far off the other way refuses it.
    assert_eq!(find(&r, "time").level, Level::Fail, "{table}");
    assert_eq!(r.worst, Level::Fail);
    assert_eq!(r.exit_code(), 2);
}

#[test]
fn a_host_without_rdma_warns_and_does_not_fail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "sys/devices/system/cpu/online", "0-1\n");
    write(root, "proc/stat", "cpu0 0 0 0 10 0 0 0 0\n");
    let nothing = |_: &str, _: &[&str]| None;
    let no_device = |d: &str| Err(format!("{d}: no device"));
    let r = run(None, &host(root, &no_device, &nothing));
    let table = r.render_table();
    let rdma = find(&r, "rdma");
    assert_eq!(rdma.level, Level::Warn, "{table}");
    assert!(rdma.fix.contains("rdma link add rxe0"), "{table}");
    assert_eq!(find(&r, "time").level, Level::Info, "{table}");
    assert_eq!(find(&r, "config").level, Level::Info, "{table}");
    assert!(r.checks.iter().all(|c| c.level != Level::Fail || c.area == "memlock"), "{table}");
    // A verbs shard on such a host is a failure: it cannot start.
    write(root, "pl.toml", "version = 1\nhost = \"h0\"\ngeneration = 1\ngenerated_unix_ns = 0\n");
    write(
        root,
        "agent.toml",
        "host = \"h0\"\npinglist = \"pl.toml\"\nsegment_dir = \"seg\"\n[[shard]]\ndevice = \"mlx5_0\"\ntransport = \"verbs\"\nbind = \"10.0.0.5:18515\"\ncore = 0\n",
    );
    let r = run(Some(&root.join("agent.toml")), &host(root, &no_device, &nothing));
    assert_eq!(find(&r, "rdma").level, Level::Fail, "{}", r.render_table());
}

#[test]
fn a_config_that_does_not_load_fails_naming_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    node(dir.path());
    let cfg = config(dir.path(), "");
    let text = std::fs::read_to_string(&cfg).expect("config").replace("host = \"h0\"", "host = \"\"");
    write(dir.path(), "agent.toml", &text);
    let r = run(Some(&dir.path().join("agent.toml")), &host(dir.path(), &nic_clock, &healthy_tools));
    let c = find(&r, "config");
    assert_eq!(c.level, Level::Fail);
    assert!(c.detail.contains("`host` is empty"), "{}", r.render_table());
}

#[test]
fn the_roce_mtu_is_what_the_kernel_derives() {
    // iboe_get_mtu: 9000 and 4200 leave room for 4096; 1500 for 1024; 1100 for 512.
    assert_eq!(
        [9000, 4200, 4191, 1500, 1100, 300, 90].map(roce_mtu),
        [Some(4096), Some(4096), Some(2048), Some(1024), Some(512), None, None]
    );
}

#[test]
fn parsers_of_the_tools_and_kernel_lists() {
    assert_eq!(
        pfc_priorities(r#"{"prio_pfc":[{"prio":3,"enabled":true},{"prio":5,"enabled":true}]}"#),
        Some(vec![3, 5])
    );
    assert_eq!(pfc_priorities(r#"{"prio-pfc":[{"prio":0,"enabled":false}]}"#), Some(vec![]));
    assert_eq!(pfc_priorities("not json"), None);
    assert_eq!(cpu_list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
    assert_eq!(cpu_list(""), Vec::<usize>::new());
}

#[test]
fn a_core_is_as_busy_as_its_non_idle_jiffies_between_two_reads() {
    // (busy, total) jiffies: 600 of 1000 more were busy.
    assert_eq!(busy_share((100, 1000), (700, 2000)), Some(0.6));
    assert_eq!(busy_share((100, 1000), (100, 1000)), None, "no time passed: unknown, not idle");
}
