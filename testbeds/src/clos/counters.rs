//! The switches' own port counters during a Clos run, as an operator's Prometheus would hold
//! them: every switch namespace's interfaces sampled each second from the kernel (`ip -s -j
//! link`: rx/tx errors and drops) and from the fault rules (each port's nft drop counter, which
//! is what a switch's discard counter would count), written as snmp_exporter's `if_mib` series
//! (`ifInErrors`, `ifInDiscards`, `ifOutErrors`, `ifOutDiscards` by `instance` and `ifName`).
//! After the run they become TSDB blocks (`promtool tsdb create-blocks-from openmetrics`) that a
//! real Prometheus serves to `analyze localize --prometheus`.
//!
//! During the run the latest reading is also served as snmp_exporter would serve it
//! ([`Exporter`], on the management network at snmp_exporter's port), and a real Prometheus
//! there scrapes it every second ([`Prometheus::scrape`]) for `analyze live --prometheus`.
//!
//! A port set down (the run's rnic_down) loses its connected route: the ToR refuses what it
//! would send there at routing, and no port counter moves. That is the silent fault.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::net::{MGMT, NFT_TABLE, Plan, port_drops};
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
    thread: Option<JoinHandle<anyhow::Result<Samples>>>,
    /// The latest reading as a scrape's answer ([`exposition`]).
    pub latest: Arc<Mutex<String>>,
}

impl Sampler {
    /// Starts sampling every switch namespace of `plan`.
    pub fn start(plan: &Plan) -> Sampler {
        let switches: Vec<(String, String)> =
            (0..plan.tors).map(Plan::tor).chain((0..plan.spines).map(Plan::spine)).map(|n| (plan.ns(&n), n)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let latest = Arc::new(Mutex::new(String::new()));
        let serving = latest.clone();
        let thread = std::thread::spawn(move || {
            let result = sample_until(&stopping, &switches, &serving);
            if result.is_err() {
                // A switch exporter whose device stopped answering fails its scrapes: the last
                // reading must not go on being served as if it were current.
                if let Ok(mut l) = serving.lock() {
                    l.clear();
                }
            }
            result
        });
        Sampler { stop, thread: Some(thread), latest }
    }

    /// Stops it and returns what it read.
    pub fn stop(mut self) -> anyhow::Result<Samples> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().context("the counter sampler was already stopped")?;
        thread.join().map_err(|_| anyhow::anyhow!("the counter sampler panicked"))?
    }
}

/// A run that fails before the sampler is stopped (an agent, the exporter or Prometheus did
/// not start) must not leave it sampling namespaces that are being torn down.
impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Only on a run's error path (`stop` takes the thread): its samples are not wanted, but
        // a panic is still said.
        if let Some(Err(_)) = self.thread.take().map(JoinHandle::join) {
            eprintln!("clos: the counter sampler panicked");
        }
    }
}

/// Samples every `STEP` until `stop`, keeping the latest reading's exposition in `serving`.
fn sample_until(stop: &AtomicBool, switches: &[(String, String)], serving: &Mutex<String>) -> anyhow::Result<Samples> {
    let mut state = State::default();
    let mut samples = Samples::new();
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let sample = state.sample(switches)?;
        if let Ok(mut l) = serving.lock() {
            *l = exposition(&sample);
        }
        samples.push(sample);
        next += STEP;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    samples.push(state.sample(switches)?);
    Ok(samples)
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

/// snmp_exporter's if_mib names of [`Counts`], in its order.
const NAMES: [&str; 4] = ["ifInErrors", "ifInDiscards", "ifOutErrors", "ifOutDiscards"];

/// A switch's interface address: (switch, address, ifindex).
pub type SwitchAddr = (String, std::net::IpAddr, u64);

/// Every global address of every switch namespace of `plan` (`ip -j addr`), as an IP-MIB walk
/// of the switch would list them.
pub fn switch_addresses(plan: &Plan) -> anyhow::Result<Vec<SwitchAddr>> {
    let mut out = Vec::new();
    for switch in (0..plan.tors).map(Plan::tor).chain((0..plan.spines).map(Plan::spine)) {
        let ns = plan.ns(&switch);
        let json = run("ip", &["-n", &ns, "-j", "addr", "show"])?;
        let v: serde_json::Value = serde_json::from_str(&json).with_context(|| format!("ip -j addr in {ns}"))?;
        for l in v.as_array().context("not a list of links")? {
            let ifindex = l.get("ifindex").and_then(|i| i.as_u64()).unwrap_or(0);
            for a in l.get("addr_info").and_then(|a| a.as_array()).into_iter().flatten() {
                let global = a.get("scope").and_then(|s| s.as_str()) == Some("global");
                if let Some(ip) =
                    a.get("local").and_then(|l| l.as_str()).and_then(|l| l.parse().ok()).filter(|_| global)
                {
                    out.push((switch.clone(), ip, ifindex));
                }
            }
        }
    }
    Ok(out)
}

/// The samples as OpenMetrics text in snmp_exporter's if_mib naming, with the switches'
/// addresses as its IP-MIB walks name them (`ipAdEntIfIndex` by `ipAdEntAddr` for IPv4,
/// `ipAddressIfIndex` by `ipAddressAddr` for IPv6), at the first sample's time.
pub fn openmetrics(samples: &Samples, addresses: &[SwitchAddr]) -> String {
    let mut text = String::new();
    if let Some((at, _)) = samples.first() {
        for (switch, ip, ifindex) in addresses {
            let (metric, label) =
                if ip.is_ipv4() { ("ipAdEntIfIndex", "ipAdEntAddr") } else { ("ipAddressIfIndex", "ipAddressAddr") };
            let _ = writeln!(text, "{metric}{{instance=\"{switch}\",job=\"snmp\",{label}=\"{ip}\"}} {ifindex} {at:.3}");
        }
    }
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

/// One reading in the Prometheus text format, as snmp_exporter answers a scrape (no
/// timestamps: the scrape's time is the sample's).
pub fn exposition((_, m): &Sample) -> String {
    let mut text = String::new();
    for (i, name) in NAMES.iter().enumerate() {
        let _ = writeln!(text, "# TYPE {name} counter");
        for ((switch, port), c) in m {
            let _ = writeln!(text, "{name}{{instance=\"{switch}\",ifName=\"{port}\"}} {}", c[i]);
        }
    }
    text
}

/// The run's switch counters as an operator's Prometheus holds them while it runs: sampled
/// ([`Sampler`]), answered as an exporter on the management network ([`Exporter`]) and scraped
/// every second by a Prometheus there ([`Prometheus::scrape`]), at [`Scraped::url`].
#[derive(Debug)]
pub struct Scraped {
    sampler: Option<Sampler>,
    _exporter: Exporter,
    prometheus: Prometheus,
}

impl Scraped {
    /// Starts sampling, serving and scraping; the Prometheus keeps its data under `dir`.
    pub fn start(plan: &Plan, dir: &Path) -> anyhow::Result<Scraped> {
        let sampler = Sampler::start(plan);
        let (ns, ip) = (plan.ns(MGMT), Plan::collector_ip());
        let exporter = Exporter::serve(&ns, (ip, EXPORTER_PORT).into(), sampler.latest.clone())?;
        let prometheus = Prometheus::scrape(&ns, (ip, PROMETHEUS_PORT).into(), (ip, EXPORTER_PORT).into(), dir)?;
        Ok(Scraped { sampler: Some(sampler), _exporter: exporter, prometheus })
    }

    pub fn url(&self) -> &str {
        &self.prometheus.url
    }

    /// Stops the sampling (the Prometheus goes on serving what it scraped) and returns every
    /// reading.
    pub fn stop_sampling(&mut self) -> anyhow::Result<Samples> {
        self.sampler.take().context("sampling already stopped")?.stop()
    }
}

/// snmp_exporter's port, where [`Exporter`] answers scrapes.
pub const EXPORTER_PORT: u16 = 9116;
/// Where the run's live Prometheus listens (on the management network).
pub const PROMETHEUS_PORT: u16 = 9090;

/// Runs `f` on a thread of its own inside network namespace `ns` (a thread's network namespace
/// is its own: `setns` moves only the caller), and returns what it returned.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> anyhow::Result<T> + Send + 'static) -> anyhow::Result<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        enter_netns(&path)?;
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("a thread in {ns} panicked"))?
}

fn enter_netns(path: &str) -> anyhow::Result<()> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {path}"))?;
    // SAFETY: setns on a namespace file we hold open; it moves only this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {path}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Answers every HTTP request with the latest reading, as a switch exporter does; stops when
/// dropped.
#[derive(Debug)]
pub struct Exporter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Exporter {
    /// Listens on `addr` inside namespace `ns`, answering with what `latest` holds.
    pub fn serve(ns: &str, addr: SocketAddr, latest: Arc<Mutex<String>>) -> anyhow::Result<Exporter> {
        let path = format!("/run/netns/{ns}");
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let bound = enter_netns(&path).and_then(|()| {
                let l = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
                l.set_nonblocking(true)?;
                Ok(l)
            });
            let listener = match bound {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => answer(s, &latest),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        rx.recv().context("the exporter thread ended")??;
        Ok(Exporter { stop, thread: Some(thread) })
    }
}

fn answer(mut s: std::net::TcpStream, latest: &Mutex<String>) {
    use std::io::{Read, Write};
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    // The request head; what it asks for does not matter.
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let body = latest.lock().map(|l| l.clone()).unwrap_or_default();
    if body.is_empty() {
        // Nothing read yet, or the sampler failed: a failed scrape, not an empty one (which
        // Prometheus would take as every series gone).
        let _ = s.write_all(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
        return;
    }
    let _ = write!(
        s,
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
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
        Prometheus::start(dir, &tsdb, &format!("127.0.0.1:{port}"), None)
    }

    /// A Prometheus in namespace `ns` at `listen`, scraping `target` every second as the job
    /// `snmp`, keeping the series' own `instance` (the switch; `honor_labels`, as an
    /// snmp_exporter job's relabelling does); its data under `dir`.
    pub fn scrape(ns: &str, listen: SocketAddr, target: SocketAddr, dir: &Path) -> anyhow::Result<Prometheus> {
        let tsdb = dir.join("tsdb");
        let _ = std::fs::remove_dir_all(&tsdb);
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: snmp\n    \
                 honor_labels: true\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )?;
        Prometheus::start(dir, &tsdb, &listen.to_string(), Some(ns))
    }

    /// Starts it (in `ns` when given) and waits until it says it is ready.
    fn start(dir: &Path, tsdb: &Path, addr: &str, ns: Option<&str>) -> anyhow::Result<Prometheus> {
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "prometheus"]);
                c
            }
            None => Command::new("prometheus"),
        };
        let child = cmd
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", tsdb.display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log"))?)
            .spawn()
            .context("starting prometheus (apt-get install prometheus; scripts/setup installs it)")?;
        let mut p = Prometheus { child, url: format!("http://{addr}") };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let at = addr.to_string();
            let up = match ns {
                Some(ns) => in_netns(ns, move || Ok(ready(&at)))?,
                None => ready(&at),
            };
            if up {
                return Ok(p);
            }
            if let Some(status) = p.child.try_wait()? {
                bail!(
                    "prometheus on {addr} exited ({status}) before it was ready (its port taken?); {} has its log",
                    dir.join("prometheus.log").display()
                );
            }
            if Instant::now() > deadline {
                bail!("prometheus on {addr} not ready in 60 s; {} has its log", dir.join("prometheus.log").display());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
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
        let om = openmetrics(&samples, &[("tor1".to_string(), "10.1.0.1".parse().unwrap(), 3)]);
        assert!(om.contains("ifOutDiscards{instance=\"tor1\",job=\"snmp\",ifName=\"s0\"} 5 10.000\nifOutDiscards{instance=\"tor1\",job=\"snmp\",ifName=\"s0\"} 9 11.000\n"), "{om}");
        assert!(
            om.starts_with("ipAdEntIfIndex{instance=\"tor1\",job=\"snmp\",ipAdEntAddr=\"10.1.0.1\"} 3 10.000\n"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"));
    }
}
