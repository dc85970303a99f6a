//! A real Prometheus scraping real agents: the series it stores are what the agents' segments
//! hold, probe for probe.
//!
//! Three UDP agents on loopback (two under tor0, one under tor1 that ignores a fifth of the
//! probes it gets, so that there is loss to count), each serving `/metrics`; Debian's
//! `prometheus` started on loopback scrapes them every second. After probing, every agent is
//! given an empty pinglist (probing stops, the counters settle), Prometheus scrapes the settled
//! counters, and the test compares what its HTTP API returns with the records in the segments:
//! outcomes per (agent, target ToR), the RTT histogram's count and its 500 µs bucket, the
//! pinglist generation and the reload error one agent was given.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{PORT, addr, finish};
use rocemesh_formats::pinglist::{Pinglist, ProbeKind, Target};
use rocemesh_formats::record::Class;

const NET: u8 = 77;
const AGENTS: usize = 3;

fn tor_of(i: usize) -> &'static str {
    if i < 2 { "tor0" } else { "tor1" }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

fn pinglist(dir: &Path, i: usize, generation: u64, probe: bool) {
    let targets = (0..AGENTS)
        .filter(|&j| probe && j != i)
        .map(|j| Target {
            from: "lo".into(),
            to: common::name(j),
            tor: tor_of(j).into(),
            kind: if tor_of(i) == tor_of(j) { ProbeKind::TorMesh } else { ProbeKind::InterTor },
            addr: addr(NET, j),
            port: Some(PORT),
            qpn: None,
            rate_pps: 200.0,
            flow_labels: vec![1, 2, 3],
        })
        .collect();
    let pl = Pinglist {
        version: 1,
        host: format!("h{i}"),
        generation,
        generated_unix_ns: 1_700_000_000_000_000_000 + generation,
        timeout_ms: 300,
        targets,
    };
    let tmp = dir.join("pinglist.toml.tmp");
    std::fs::write(&tmp, pl.to_toml_string().expect("toml")).expect("write");
    std::fs::rename(&tmp, dir.join("pinglist.toml")).expect("rename");
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"_-.".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }
        })
        .collect()
}

/// An instant query: (labels, value) per series.
fn query(prom: SocketAddr, q: &str) -> Vec<(HashMap<String, String>, f64)> {
    let body =
        common::http_get(prom, &format!("/api/v1/query?query={}", encode(q))).unwrap_or_else(|e| panic!("{q}: {e}"));
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["status"], "success", "{q}: {body}");
    v["data"]["result"]
        .as_array()
        .expect("vector")
        .iter()
        .map(|s| {
            let labels = s["metric"]
                .as_object()
                .expect("labels")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            let value = s["value"][1].as_str().expect("value").parse().expect("number");
            (labels, value)
        })
        .collect()
}

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "needs Debian's prometheus package (scripts/setup installs it); scripts/test runs it"]
fn prometheus_scrapes_agents_and_its_series_match_their_segments() {
    let root = tempfile::tempdir().expect("tempdir");
    let metrics_port = free_port();
    let mut agents = Vec::new();
    let mut targets = Vec::new();
    for i in 0..AGENTS {
        let dir = root.path().join(format!("h{i}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        pinglist(&dir, i, 1, true);
        let listen = SocketAddr::new(addr(NET, i), metrics_port);
        targets.push(listen);
        let lossy = if i == 2 { "ignore_probe_fraction = 0.2\n" } else { "" };
        let cfg = format!(
            "host = \"h{i}\"\npinglist = \"pinglist.toml\"\nsegment_dir = \"segments\"\nflush_interval_ms = 100\n\
             stats_interval_s = 0\n\n[metrics]\nlisten = \"{listen}\"\n\n[[shard]]\ndevice = \"lo\"\ntor = \"{}\"\n\
             bind = \"{}:{PORT}\"\ncore = 0\n{lossy}",
            tor_of(i),
            addr(NET, i)
        );
        std::fs::write(dir.join("agent.toml"), cfg).expect("config");
        agents.push(common::spawn(&dir.join("agent.toml"), 40));
    }

    let prom_port = free_port();
    let prom_addr: SocketAddr = format!("127.0.0.1:{prom_port}").parse().expect("addr");
    let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let prom_cfg = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: rocemesh\n    \
         static_configs:\n      - targets: [{}]\n",
        list.join(", ")
    );
    std::fs::write(root.path().join("prometheus.yml"), prom_cfg).expect("prometheus.yml");
    let prom = Command::new("prometheus")
        .arg(format!("--config.file={}", root.path().join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", root.path().join("tsdb").display()))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("starting `prometheus` failed: {e}; install Debian's prometheus package (scripts/setup does)")
        });
    let _prom = Prometheus(prom);

    // Probe; meanwhile one agent is given a broken pinglist (refused, counted) and generation 2.
    std::thread::sleep(Duration::from_secs(6));
    std::fs::write(root.path().join("h0/pinglist.toml"), "version = 1\nthis is not toml\n").expect("garbage");
    std::thread::sleep(Duration::from_millis(500));
    pinglist(&root.path().join("h0"), 0, 2, true);
    std::thread::sleep(Duration::from_secs(8));
    // Stop probing everywhere; what is in flight ends within the 300 ms timeout.
    for i in 0..AGENTS {
        pinglist(&root.path().join(format!("h{i}")), i, 3, false);
    }
    // Settled when every agent shows generation 3 in Prometheus; then two more scrapes.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let g = query(prom_addr, "rocemesh_pinglist_generation == 3");
        if g.len() == AGENTS {
            break;
        }
        assert!(Instant::now() < deadline, "the agents' generation 3 never reached Prometheus: {g:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(3));

    let up = query(prom_addr, "up{job=\"rocemesh\"}");
    assert_eq!(up.len(), AGENTS, "{up:?}");
    assert!(up.iter().all(|(_, v)| *v == 1.0), "{up:?}");
    let instance_of: HashMap<String, usize> = targets.iter().enumerate().map(|(i, t)| (t.to_string(), i)).collect();
    let agent = |labels: &HashMap<String, String>| instance_of[&labels["instance"]];

    let mut from_prom: BTreeMap<(usize, String, String), f64> = BTreeMap::new();
    for (labels, v) in query(prom_addr, "rocemesh_probes_total") {
        assert_eq!(labels["tor"], tor_of(agent(&labels)), "{labels:?}");
        from_prom.insert((agent(&labels), labels["target_tor"].clone(), labels["outcome"].clone()), v);
    }
    let mut rtt_count: BTreeMap<(usize, String), f64> = BTreeMap::new();
    for (labels, v) in query(prom_addr, "rocemesh_probe_rtt_seconds_count") {
        rtt_count.insert((agent(&labels), labels["target_tor"].clone()), v);
    }
    let mut rtt_sla: BTreeMap<(usize, String), f64> = BTreeMap::new();
    for (labels, v) in query(prom_addr, "rocemesh_probe_rtt_seconds_bucket{le=\"0.0005\"}") {
        rtt_sla.insert((agent(&labels), labels["target_tor"].clone()), v);
    }
    let reload_errors = query(prom_addr, "rocemesh_pinglist_reload_errors_total");

    let mut exits = Vec::new();
    for a in &agents {
        // SAFETY: signalling our own child, which is still running (its duration is 40 s).
        unsafe { libc::kill(a.id() as libc::pid_t, libc::SIGTERM) };
    }
    for a in agents {
        exits.push(finish(a));
    }
    for (i, (code, err)) in exits.iter().enumerate() {
        assert_eq!(*code, 0, "agent {i}:\n{err}");
    }

    // The segments, classified as analyze does.
    let mut from_segments: BTreeMap<(usize, String, String), f64> = BTreeMap::new();
    let mut ok_by_tor: BTreeMap<(usize, String), (f64, f64)> = BTreeMap::new();
    for i in 0..AGENTS {
        let recs = common::records(root.path(), i);
        assert!(recs.len() > 1000, "agent {i} wrote only {} records", recs.len());
        for (to, r) in recs {
            let j = (0..AGENTS).find(|&j| common::name(j) == to).expect("a known target");
            let outcome = Class::of(r.outcome, r.arrived).name();
            *from_segments.entry((i, tor_of(j).into(), outcome.into())).or_default() += 1.0;
            if outcome == "ok" {
                let e = ok_by_tor.entry((i, tor_of(j).into())).or_default();
                e.0 += 1.0;
                if r.network_rtt_ns <= 500_000 {
                    e.1 += 1.0;
                }
            }
        }
    }
    // Prometheus has a series for every outcome, zeros included; the segments only what
    // happened.
    let nonzero: BTreeMap<_, _> = from_prom.iter().filter(|(_, v)| **v > 0.0).map(|(k, v)| (k.clone(), *v)).collect();
    assert_eq!(nonzero, from_segments, "Prometheus (left) against the segments (right)");
    let lost_to_tor1: f64 =
        from_segments.iter().filter(|((_, t, o), _)| t == "tor1" && o == "lost").map(|(_, v)| v).sum();
    assert!(lost_to_tor1 > 100.0, "the lossy agent under tor1 lost only {lost_to_tor1} probes");
    for (k, (ok, under_sla)) in &ok_by_tor {
        assert_eq!(rtt_count.get(k), Some(ok), "RTT histogram count of {k:?}");
        assert_eq!(rtt_sla.get(k), Some(under_sla), "RTT samples <= 500 us of {k:?}");
    }
    let errors: Vec<(usize, f64)> = reload_errors.iter().map(|(l, v)| (agent(l), *v)).collect();
    assert!(errors.contains(&(0, 1.0)) && errors.iter().filter(|(_, v)| *v > 0.0).count() == 1, "{errors:?}");
    println!(
        "prometheus: {} series of rocemesh_probes_total, {} nonzero, equal to {} segment tallies; {lost_to_tor1} lost to tor1\n{from_segments:?}",
        from_prom.len(),
        nonzero.len(),
        from_segments.len()
    );
}
