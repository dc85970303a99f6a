//! Least privilege: an agent started with every capability (root) uses them to set up and then
//! holds none, in every thread, while path tracing (opened with CAP_NET_RAW) and probing go on.

mod common;

use std::time::Duration;

fn caps_of_threads(pid: u32) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks").flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default().trim().to_owned();
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or_else(|| panic!("no {name} for thread {comm}"))
        };
        out.push((comm.clone(), field("CapEff:"), field("CapPrm:")));
    }
    out
}

#[test]
#[ignore = "needs root (an agent with capabilities to drop); scripts/test runs it as root"]
fn after_setup_no_thread_of_the_agent_holds_a_capability() {
    let (eff, _) = rocemesh_agent::caps::current().expect("capget");
    assert_ne!(eff & (1 << rocemesh_agent::caps::CAP_NET_RAW), 0, "run as root: this test needs CAP_NET_RAW to give");
    let root = tempfile::tempdir().expect("tempdir");
    let net = 91;
    // Service tracing on: its thread loads (or fails to load, on a kernel without RDMA) while
    // the main thread drops; it must judge by its own capabilities, not the main thread's.
    let tracing = "\n[service_tracing]\nenabled = true\n";
    let configs: Vec<_> = (0..2).map(|i| common::setup(root.path(), net, i, 2, 50.0, "event", tracing)).collect();
    let agents: Vec<_> = configs.iter().map(|c| common::spawn(c, 6)).collect();
    std::thread::sleep(Duration::from_secs(3));
    let mut seen = Vec::new();
    for a in &agents {
        let threads = caps_of_threads(a.id());
        assert!(threads.len() >= 5, "main, sealer, watcher, shard and its helper: {threads:?}");
        for (comm, eff, prm) in &threads {
            assert_eq!((*eff, *prm), (0, 0), "thread {comm} of agent {} still holds {eff:x}/{prm:x}", a.id());
        }
        seen.extend(threads.into_iter().map(|t| t.0));
    }
    let mut logs = Vec::new();
    for a in agents {
        let (code, err) = common::finish(a);
        assert_eq!(code, 0, "{err}");
        logs.push(err);
    }
    for (i, err) in logs.iter().enumerate() {
        assert!(err.contains("capabilities dropped after setup"), "agent {i}:\n{err}");
        assert!(err.contains("path tracing on"), "agent {i}: the raw sockets were opened before the drop:\n{err}");
        assert!(
            !err.contains("missing CAP_BPF"),
            "agent {i}: the tracer lost its capabilities to the main thread's drop:\n{err}"
        );
        assert!(common::final_stat(err, "ok") > 100, "agent {i} kept probing:\n{err}");
    }
    seen.sort();
    seen.dedup();
    println!("threads checked: {seen:?}");
}
