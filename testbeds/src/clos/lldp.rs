//! LLDP in the Clos fabric, as operators run it: Debian's lldpd in every switch and host
//! namespace, each node's `lldpcli -f json show neighbors` collected into a file named after it,
//! and `ctl inventory lldp` reading them into the inventory. The inventory the run starts from
//! has no ports and no switch addresses (what `ctl inventory import` makes), so the links and
//! spines the run localises are named from what LLDP taught, with no hand-written address map.
//!
//! Each daemon advertises its node's name, its interface names as port IDs and every interface
//! address as a management address (`configure system ip management pattern '*'`: switches
//! answer path traces from their interface addresses), and sends every second so that the
//! tables fill in seconds. The daemons are stopped once the tables are taken.
//!
//! The configuration is a file each daemon's own lldpcli reads at start (`lldpd -O`), before
//! it resumes and sends anything, as a packaged lldpd reads /etc/lldpd.d. Configuring a running
//! daemon over its socket raced its start: about one run in five, a daemon's first frames went
//! out under the machine's hostname and it then stopped sending on some or all ports for good
//! (`lldpcli update` did not wake it), so its neighbours never learned its name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use rocemesh_formats::inventory::Inventory;

use super::net::{Fabric, Plan};
use crate::rxefabric::proc::run;

/// How long the tables may take to fill: a daemon sends at start and every second after, so a
/// complete fabric is seen within a few seconds.
const FILL_TIMEOUT: Duration = Duration::from_secs(30);

/// Running lldpd daemons, one per node; dropping them stops them.
#[derive(Debug)]
pub struct Daemons {
    /// (node, namespace, control socket, daemon).
    nodes: Vec<(String, String, PathBuf, Child)>,
    /// Each daemon's PID and configuration files, removed with it.
    files: Vec<PathBuf>,
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for (_, _, sock, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(sock);
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Whether lldpd and lldpcli are installed, with the fix when not.
pub fn preflight() -> anyhow::Result<()> {
    for tool in ["lldpd", "lldpcli"] {
        if Command::new(tool).arg("-v").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            bail!("`{tool}` is not installed: apt-get install lldpd (scripts/setup installs it)");
        }
    }
    Ok(())
}

/// Every switch and host of `plan` and how many neighbours its table must show when complete.
pub fn nodes(plan: &Plan) -> Vec<(String, usize)> {
    let spines = (0..plan.spines).map(|s| (Plan::spine(s), plan.tors as usize));
    let tors = (0..plan.tors).map(|t| (Plan::tor(t), (plan.spines + plan.hosts_per_tor) as usize));
    let hosts = plan.hosts().map(|(t, h)| (Plan::host(t, h), 1));
    spines.chain(tors).chain(hosts).collect()
}

/// Starts lldpd, configured, in every namespace of `nodes`; their logs go to `dir`.
pub fn start(plan: &Plan, nodes: &[(String, usize)], dir: &Path) -> anyhow::Result<Daemons> {
    // lldpd's privilege-separated half chroots there; a host without the package's tmpfiles
    // (a container) lacks it.
    std::fs::create_dir_all("/run/lldpd").context("creating /run/lldpd (lldpd's chroot)")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut daemons = Daemons { nodes: Vec::new(), files: Vec::new() };
    for (node, _) in nodes {
        let ns = plan.ns(node);
        let sock = PathBuf::from(format!("/run/rocemesh-lldpd-{ns}.sock"));
        // Its own, not /run/lldpd.pid, which a packaged daemon of the host may hold.
        let pid_file = PathBuf::from(format!("/run/rocemesh-lldpd-{ns}.pid"));
        // lldpd runs lldpcli as its unprivileged user (_lldpd), which must be able to read it:
        // not under root's home, where the test's directories are.
        let conf = PathBuf::from(format!("/run/rocemesh-lldpd-{ns}.conf"));
        std::fs::write(&conf, configuration(node)).with_context(|| format!("writing {}", conf.display()))?;
        let log = std::fs::File::create(dir.join(format!("{node}.log")))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, "lldpd", "-d", "-u"])
            .arg(&sock)
            .arg("-p")
            .arg(&pid_file)
            .arg("-O")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting lldpd")?;
        daemons.nodes.push((node.clone(), ns, sock, child));
        daemons.files.extend([pid_file, conf]);
    }
    Ok(daemons)
}

/// The daemon's configuration: the node's name, interface names as port IDs, every address as
/// a management address, a frame every second.
fn configuration(node: &str) -> String {
    format!(
        "configure system hostname {node}\n\
         configure lldp portidsubtype ifname\n\
         configure system ip management pattern *\n\
         configure lldp tx-interval 1\n"
    )
}

impl Daemons {
    /// Waits until every node's table shows its neighbours by their names, then writes each as
    /// `<dir>/<node>.json`. A table still short after [`FILL_TIMEOUT`], or a daemon that exited,
    /// is an error naming it.
    pub fn collect(&mut self, nodes: &[(String, usize)], dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let want: BTreeMap<&str, usize> = nodes.iter().map(|(n, k)| (n.as_str(), *k)).collect();
        let started = Instant::now();
        let mut short: Vec<String>;
        loop {
            short = Vec::new();
            for (node, ns, sock, child) in &mut self.nodes {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "lldpd on {node} exited ({status}): {} has its log",
                        dir.join(format!("{node}.log")).display()
                    );
                }
                let sock = sock.to_string_lossy();
                // The control socket appears a moment after the daemon starts.
                let Ok(json) =
                    run("ip", &["netns", "exec", ns, "lldpcli", "-u", &sock, "-f", "json", "show", "neighbors"])
                else {
                    short.push(format!("{node} not answering on {sock}"));
                    continue;
                };
                let named = named_neighbours(&json, &want);
                if named < want[node.as_str()] {
                    short.push(format!("{node} {named}/{}", want[node.as_str()]));
                }
                std::fs::write(dir.join(format!("{node}.json")), &json)?;
            }
            if short.is_empty() {
                return Ok(());
            }
            if started.elapsed() > FILL_TIMEOUT {
                bail!(
                    "LLDP tables still incomplete after {FILL_TIMEOUT:?}: {}{}",
                    short.join(", "),
                    unconfigured(&self.nodes, dir)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// The daemons whose log does not show their configuration applied (a neighbour then hears the
/// machine's hostname, not the node's name), as a sentence to add to an error.
fn unconfigured(nodes: &[(String, String, PathBuf, Child)], dir: &Path) -> String {
    let applied = |node: &str| {
        let log = std::fs::read_to_string(dir.join(format!("{node}.log"))).unwrap_or_default();
        log.contains(&format!("system name set to new value {node}"))
    };
    let not: Vec<&str> = nodes.iter().map(|(n, ..)| n.as_str()).filter(|n| !applied(n)).collect();
    match not.is_empty() {
        true => String::new(),
        false => format!(
            "; the configuration of {} was not applied (their logs in {} say why; lldpd's own lldpcli, run \
             as _lldpd, reads it)",
            not.join(", "),
            dir.display()
        ),
    }
}

/// How many of a table's neighbours carry the name of a node of the fabric.
fn named_neighbours(json: &str, nodes: &BTreeMap<&str, usize>) -> usize {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else { return 0 };
    let entries: Vec<&serde_json::Value> = match v.pointer("/lldp/interface") {
        Some(serde_json::Value::Object(m)) => m.values().collect(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|e| e.as_object()).flat_map(|m| m.values()).collect(),
        _ => Vec::new(),
    };
    let named = |e: &&&serde_json::Value| {
        e.get("chassis").and_then(|c| c.as_object()).is_some_and(|c| c.keys().any(|k| nodes.contains_key(k.as_str())))
    };
    entries.iter().filter(named).count()
}

/// `ctl inventory lldp` over the tables in `tables`, rewriting `inventory`: its exit status and
/// what it printed.
pub fn learn(ctl: &Path, inventory: &Path, tables: &Path) -> anyhow::Result<(Option<i32>, String)> {
    let out = Command::new(ctl)
        .args(["inventory", "lldp", "--force", "--inventory"])
        .arg(inventory)
        .arg(tables)
        .output()
        .context("running ctl inventory lldp")?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code(), said))
}

/// The cabling plan of `plan` as an inventory with every port: ToR t's uplink to spine s is its
/// `s{s}` and the spine's `t{t}`, host i's RNIC is on its ToR's `h{i}` (see [`super::net`]).
pub fn planned_cabling(plan: &Plan) -> anyhow::Result<Inventory> {
    let mut inv = Inventory::parse(&plan.inventory_toml(false), Path::new("the plan's inventory"))?;
    let links = (0..plan.tors).flat_map(|t| (0..plan.spines).map(move |s| (t, s)));
    for (l, (t, s)) in inv.links.iter_mut().zip(links) {
        (l.a_port, l.b_port) = (Some(Plan::uplink(s)), Some(Plan::downlink(t)));
    }
    for (host, (_, h)) in inv.hosts.iter_mut().zip(plan.hosts()) {
        host.rnics[0].tor_port = Some(Plan::host_port(h));
    }
    Ok(inv)
}

/// Rewires a fabric wrong on purpose: ToR 0's two uplinks swapped (its `s0` to spine 1, `s1`
/// to spine 0), and host 0 of ToR 1 moved to a new port `h9` of ToR 0. Needs 2 spines and 2
/// ToRs at least. `nodes` (from [`nodes`]) is changed to the neighbours each node then has.
pub fn miswire(fabric: &Fabric, nodes: &mut [(String, usize)]) -> anyhow::Result<()> {
    let plan = &fabric.plan;
    let tor0 = plan.ns(&Plan::tor(0));
    let moved = plan.ns(&Plan::host(1, 0));
    run("ip", &["-n", &tor0, "link", "del", &Plan::uplink(0)])?;
    run("ip", &["-n", &tor0, "link", "del", &Plan::uplink(1)])?;
    run("ip", &["-n", &moved, "link", "del", super::net::HOST_IF])?;
    let t0 = Plan::downlink(0);
    let veths = [
        (&tor0, Plan::uplink(0), plan.ns(&Plan::spine(1)), t0.clone()),
        (&tor0, Plan::uplink(1), plan.ns(&Plan::spine(0)), t0),
        (&tor0, "h9".to_string(), moved.clone(), super::net::HOST_IF.to_string()),
    ];
    for (a_ns, a, b_ns, b) in veths {
        run("ip", &["link", "add", &a, "netns", a_ns, "type", "veth", "peer", "name", &b, "netns", &b_ns])?;
        run("ip", &["-n", a_ns, "link", "set", &a, "up"])?;
        run("ip", &["-n", &b_ns, "link", "set", &b, "up"])?;
    }
    for (node, n) in nodes {
        match node.as_str() {
            "tor0" => *n += 1,
            "tor1" => *n -= 1,
            _ => {}
        }
    }
    Ok(())
}
