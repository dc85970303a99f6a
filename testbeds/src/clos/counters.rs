//! The switches' own port counters during a Clos run, as an operator's Prometheus would hold
//! them: every switch namespace's interfaces sampled each second from the kernel (`ip -s -j
//! link`: rx/tx errors and drops) and from the fault rules (each port's nft drop counter, which
//! is what a switch's discard counter would count), written as snmp_exporter's `if_mib` series
//! (`ifInErrors`, `ifInDiscards`, `ifOutErrors`, `ifOutDiscards` by `instance` and `ifName`).
//! After the run they become TSDB blocks (`promtool tsdb create-blocks-from openmetrics`) that a
//! real Prometheus serves to `analyze localize --prometheus`.
//!
//! A port set down (the run's rnic_down) loses its connected route: the ToR refuses what it
//! would send there at routing, and no port counter moves. That is the silent fault.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::net::{NFT_TABLE, Plan, port_drops};
use crate::rxefabric::proc::run;

/// How often the counters are read: well under the run's 5 s windows.
pub const STEP: Duration = Duration::from_secs(1);

/// (in_errors, in_discards, out_errors, out_discards) of one port.
type Counts = [u64; 4];

/// One reading: (Unix seconds, (switch, port) -> counts).
pub type Sample = (f64, BTreeMap<(String, String), Counts>);

/// The readings, in time order.
pub type Samples = Vec<Sample>;

/// Reads the counters in the background until stopped.
#[derive(Debug)]
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<anyhow::Result<Samples>>,
}

impl Sampler {
    /// Starts sampling every switch namespace of `plan`.
    pub fn start(plan: &Plan) -> Sampler {
        let switches: Vec<(String, String)> =
            (0..plan.tors).map(Plan::tor).chain((0..plan.spines).map(Plan::spine)).map(|n| (plan.ns(&n), n)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut state = State::default();
            let mut samples = Samples::new();
            let mut next = Instant::now();
            while !stopping.load(Ordering::Relaxed) {
                samples.push(state.sample(&switches)?);
                next += STEP;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            samples.push(state.sample(&switches)?);
            Ok(samples)
        });
        Sampler { stop, thread }
    }

    /// Stops it and returns what it read.
    pub fn stop(self) -> anyhow::Result<Samples> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| anyhow::anyhow!("the counter sampler panicked"))?
    }
}

/// Drops counted by fault rules that are gone: a rule's counter goes with its table at the end
/// of its phase, and the port's discards must not fall with it.
#[derive(Default)]
struct State {
    /// (switch, port) -> (drops of rules removed, drops of the rule now loaded).
    nft: BTreeMap<(String, String), (u64, u64)>,
}

impl State {
    fn sample(&mut self, switches: &[(String, String)]) -> anyhow::Result<Sample> {
        let mut out = BTreeMap::new();
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs_f64();
        for (ns, switch) in switches {
            let json = run("ip", &["-n", ns, "-s", "-j", "link", "show"])?;
            for (port, counts) in link_counts(&json).with_context(|| format!("ip -s -j link in {ns}"))? {
                out.insert((switch.clone(), port), counts);
            }
            let listing = fault_rules(ns)?;
            let live: BTreeMap<String, u64> = port_drops(&listing).into_iter().collect();
            for ((_, port), (gone, now)) in self.nft.iter_mut().filter(|((s, _), _)| s == switch) {
                if !live.contains_key(port) {
                    *gone += *now;
                    *now = 0;
                }
            }
            for (port, n) in live {
                self.nft.entry((switch.clone(), port)).or_default().1 = n;
            }
        }
        for ((switch, port), (gone, now)) in &self.nft {
            if let Some(c) = out.get_mut(&(switch.clone(), port.clone())) {
                c[3] += gone + now;
            }
        }
        Ok((at, out))
    }
}

/// `nft list table` of the fault table in `ns`; empty when there is none (no fault on this
/// switch now). Any other failure is an error: read as "no table", it would drop the port's
/// discards from the series.
fn fault_rules(ns: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "nft", "list", "table", "inet", NFT_TABLE])
        .stdin(std::process::Stdio::null())
        .output()
        .context("running nft")?;
    let err = String::from_utf8_lossy(&out.stderr);
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false if err.contains("No such file or directory") => Ok(String::new()),
        false => anyhow::bail!("nft list table inet {NFT_TABLE} in {ns} failed ({}): {}", out.status, err.trim()),
    }
}

/// Each interface's (rx errors, rx dropped, tx errors, tx dropped) from `ip -s -j link show`,
/// loopback left out.
fn link_counts(json: &str) -> anyhow::Result<Vec<(String, Counts)>> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    let mut out = Vec::new();
    for l in v.as_array().context("not a list of links")? {
        let name = l.get("ifname").and_then(|n| n.as_str()).context("a link without ifname")?;
        if name == "lo" {
            continue;
        }
        let stat =
            |dir: &str, what: &str| l.pointer(&format!("/stats64/{dir}/{what}")).and_then(|x| x.as_u64()).unwrap_or(0);
        out.push((
            name.to_string(),
            [stat("rx", "errors"), stat("rx", "dropped"), stat("tx", "errors"), stat("tx", "dropped")],
        ));
    }
    Ok(out)
}

/// The samples as OpenMetrics text in snmp_exporter's if_mib naming.
pub fn openmetrics(samples: &Samples) -> String {
    const NAMES: [&str; 4] = ["ifInErrors", "ifInDiscards", "ifOutErrors", "ifOutDiscards"];
    let mut text = String::new();
    // Series by series, each in time order, as promtool wants them.
    let ports: Vec<&(String, String)> =
        samples.iter().flat_map(|(_, m)| m.keys()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    for (switch, port) in ports {
        for (i, name) in NAMES.iter().enumerate() {
            for (at, m) in samples {
                if let Some(c) = m.get(&(switch.clone(), port.clone())) {
                    let _ = writeln!(
                        text,
                        "{name}{{instance=\"{switch}\",job=\"snmp\",ifName=\"{port}\"}} {} {at:.3}",
                        c[i]
                    );
                }
            }
        }
    }
    text.push_str("# EOF\n");
    text
}

/// A Prometheus serving the blocks made from `openmetrics` in `dir`; stopped when dropped.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    pub url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Writes the series, makes the blocks and starts Prometheus on them; waits until ready.
    pub fn serve(openmetrics: &str, dir: &Path) -> anyhow::Result<Prometheus> {
        std::fs::create_dir_all(dir)?;
        let om = dir.join("switches.om");
        std::fs::write(&om, openmetrics)?;
        let tsdb = dir.join("tsdb");
        let _ = std::fs::remove_dir_all(&tsdb);
        let made = Command::new("promtool")
            .args(["tsdb", "create-blocks-from", "openmetrics"])
            .arg(&om)
            .arg(&tsdb)
            .output()
            .context("running promtool (apt-get install prometheus; scripts/setup installs it)")?;
        if !made.status.success() {
            bail!(
                "promtool tsdb create-blocks-from openmetrics {}: {}",
                om.display(),
                String::from_utf8_lossy(&made.stderr)
            );
        }
        std::fs::write(dir.join("prometheus.yml"), "global:\n  scrape_interval: 15s\nscrape_configs: []\n")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", tsdb.display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log"))?)
            .spawn()
            .context("starting prometheus (apt-get install prometheus; scripts/setup installs it)")?;
        let p = Prometheus { child, url: format!("http://{addr}") };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready(&addr) {
            if Instant::now() > deadline {
                bail!("prometheus on {addr} not ready in 60 s; {} has its log", dir.join("prometheus.log").display());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(p)
    }
}

fn ready(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut answer = String::new();
    s.write_all(b"GET /-/ready HTTP/1.0\r\n\r\n").is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.contains(" 200 ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_stats_parse_and_series_come_out_in_time_order() {
        let json = r#"[{"ifindex":1,"ifname":"lo","stats64":{"rx":{"errors":0,"dropped":0},"tx":{"errors":0,"dropped":0}}},
            {"ifindex":2,"ifname":"s0","stats64":{"rx":{"bytes":9,"errors":1,"dropped":2},"tx":{"errors":3,"dropped":4}}}]"#;
        assert_eq!(link_counts(json).unwrap(), vec![("s0".to_string(), [1, 2, 3, 4])]);
        let key = ("tor1".to_string(), "s0".to_string());
        let samples: Samples = vec![(10.0, [(key.clone(), [0, 0, 0, 5])].into()), (11.0, [(key, [0, 0, 0, 9])].into())];
        let om = openmetrics(&samples);
        assert!(om.contains("ifOutDiscards{instance=\"tor1\",job=\"snmp\",ifName=\"s0\"} 5 10.000\nifOutDiscards{instance=\"tor1\",job=\"snmp\",ifName=\"s0\"} 9 11.000\n"), "{om}");
        assert!(om.ends_with("# EOF\n"));
    }
}
