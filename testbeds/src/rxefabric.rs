//! The testbed network inside the rxe VM (run as root in the guest's root namespace): N ToRs of M
//! hosts each, one soft-RoCE RNIC per host, faults on demand, and the verbs tools run across it.
//!
//! Layout. Every host is a network namespace named after it (`tor1-h2`) with one veth, `eth0`,
//! addressed `10.0.<tor>.<host+1>/16`; every ToR is a namespace (`tor1`) holding a bridge `br0`
//! with the hosts' peers (`h0`, `h1`, ...) and an uplink veth `uplink`; the spine is a namespace
//! (`spine0`) whose bridge joins the ToRs' uplinks (the spine-side ends are named after the ToRs).
//! One /16 is one L2 domain, so every host reaches every other, and traffic between ToRs crosses
//! both ToRs' uplinks, where [`uplink_loss`] applies netem. Each host's RNIC is the rxe device
//! `rxe_<host>` on its eth0. rdma's default "shared" netns mode shows every device in every
//! namespace (the "exclusive" mode would break rdma_cm), hence device names that say whose they are.
//!
//! GID index 1 is the RoCEv2 GID of the IPv4 address (`::ffff:10.0.t.h`); [`up`] checks that and
//! records the index it found in the inventory it writes (formats' inventory, validated by
//! loading it), which [`STATE`] keeps for the fault helpers and `down`.

pub mod perftest;
pub mod proc;
pub mod storm;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use rocemesh_formats::inventory::{self, Host, Inventory, Link, Rnic, Spine, Tor};

use perftest::{Bandwidth, Latency, Pingpong};
use proc::{Captured, Running, run, run_quietly};

/// The inventory of the fabric that is up; /run is a fresh tmpfs in every VM.
pub const STATE: &str = "/run/rocemesh-rxe-fabric/inventory.toml";
/// The spine's namespace and inventory name.
pub const SPINE: &str = "spine0";
/// The uplink's name in its ToR's namespace.
pub const UPLINK: &str = "uplink";
/// RoCEv2's UDP destination port.
pub const ROCE_PORT: u16 = 4791;
/// The TCP port the verbs tools exchange their QP numbers over.
pub const TOOL_PORT: u16 = 18515;
/// How long a new rxe device may take to list the IPv4 GID.
const GID_WAIT: Duration = Duration::from_secs(10);

/// How many ToRs and hosts per ToR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub tors: u32,
    pub hosts_per_tor: u32,
}

impl Default for Layout {
    fn default() -> Self {
        Layout { tors: 2, hosts_per_tor: 3 }
    }
}

impl Layout {
    /// The layout, if its addresses fit `10.0.<tor>.<host+1>`.
    pub fn new(tors: u32, hosts_per_tor: u32) -> anyhow::Result<Layout> {
        if !(1..=200).contains(&tors) || !(1..=250).contains(&hosts_per_tor) {
            bail!("a fabric has 1 to 200 ToRs of 1 to 250 hosts (asked for {tors} x {hosts_per_tor})");
        }
        Ok(Layout { tors, hosts_per_tor })
    }

    pub fn tor_name(t: u32) -> String {
        format!("tor{t}")
    }

    pub fn host_name(t: u32, h: u32) -> String {
        format!("tor{t}-h{h}")
    }

    pub fn host_ip(t: u32, h: u32) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, t as u8, h as u8 + 1)
    }

    /// The inventory of this layout, every RNIC with `gid_index`.
    pub fn inventory(&self, gid_index: u16) -> Inventory {
        let tors = (0..self.tors).map(|t| Tor { name: Self::tor_name(t), rail: None, addrs: Vec::new() }).collect();
        let links = (0..self.tors).map(|t| Link::new(Self::tor_name(t), SPINE)).collect();
        let hosts = (0..self.tors)
            .flat_map(|t| (0..self.hosts_per_tor).map(move |h| (t, h)))
            .map(|(t, h)| {
                let name = Self::host_name(t, h);
                Host {
                    rnics: vec![Rnic {
                        device: device_name(&name),
                        tor: Self::tor_name(t),
                        ip: IpAddr::V4(Self::host_ip(t, h)),
                        gid: None,
                        port: 1,
                        gid_index: Some(gid_index),
                        tor_port: None,
                        netdev: None,
                    }],
                    name,
                }
            })
            .collect();
        Inventory {
            version: inventory::VERSION,
            tors,
            spines: vec![Spine { name: SPINE.to_string(), addrs: Vec::new() }],
            links,
            hosts,
        }
    }
}

/// The rxe device of `host`.
pub fn device_name(host: &str) -> String {
    format!("rxe_{host}")
}

/// A host of the fabric that is up, as its inventory entry says.
#[derive(Debug, Clone)]
pub struct FabricHost {
    pub name: String,
    pub tor: String,
    pub device: String,
    pub ip: IpAddr,
    pub gid_index: u16,
}

/// The fabric that is up, from [`STATE`].
pub fn current() -> anyhow::Result<Inventory> {
    if !Path::new(STATE).exists() {
        bail!("no rxe fabric is up in this VM ({STATE} is missing); run `testbeds rxe-fabric up` first");
    }
    Inventory::load(STATE).map_err(|e| anyhow!("{e}"))
}

/// `name` in the fabric that is up.
pub fn host(inv: &Inventory, name: &str) -> anyhow::Result<FabricHost> {
    let h = inv.hosts.iter().find(|h| h.name == name).ok_or_else(|| {
        let names: Vec<&str> = inv.hosts.iter().map(|h| h.name.as_str()).collect();
        anyhow!("no host {name:?} in the fabric (hosts: {})", names.join(", "))
    })?;
    let r = h.rnics.first().ok_or_else(|| anyhow!("host {name} has no RNIC in {STATE}"))?;
    Ok(FabricHost {
        name: h.name.clone(),
        tor: r.tor.clone(),
        device: r.device.clone(),
        ip: r.ip,
        gid_index: r.gid_index.unwrap_or(1),
    })
}

fn check_tor(inv: &Inventory, tor: &str) -> anyhow::Result<()> {
    if inv.tors.iter().any(|t| t.name == tor) {
        return Ok(());
    }
    let names: Vec<&str> = inv.tors.iter().map(|t| t.name.as_str()).collect();
    bail!("no ToR {tor:?} in the fabric (ToRs: {})", names.join(", "))
}

fn ip(args: &[&str]) -> anyhow::Result<String> {
    run("ip", args)
}

/// Builds the fabric, waits for every RNIC's IPv4 GID, and returns (and keeps in [`STATE`]) its
/// inventory. A fabric that is already up is torn down first; one that fails half-way is removed.
pub fn up(layout: Layout) -> anyhow::Result<Inventory> {
    if !Path::new("/sys/module/rdma_rxe").exists() {
        bail!(
            "rdma_rxe is not loaded here: rxe-fabric runs inside the soft-RoCE VM \
             (`testbeds rxe-vm -- testbeds rxe-fabric ...`)"
        );
    }
    if Path::new(STATE).exists() {
        down()?;
    }
    build(layout).inspect_err(|_| {
        let _ = down();
    })
}

fn build(layout: Layout) -> anyhow::Result<Inventory> {
    ip(&["netns", "add", SPINE])?;
    bridge(SPINE)?;
    for t in 0..layout.tors {
        let tor = Layout::tor_name(t);
        ip(&["netns", "add", &tor])?;
        bridge(&tor)?;
        ip(&["link", "add", UPLINK, "netns", &tor, "type", "veth", "peer", "name", &tor, "netns", SPINE])?;
        ip(&["-n", &tor, "link", "set", UPLINK, "master", "br0", "up"])?;
        ip(&["-n", SPINE, "link", "set", &tor, "master", "br0", "up"])?;
        for h in 0..layout.hosts_per_tor {
            let host = Layout::host_name(t, h);
            let port = format!("h{h}");
            let addr = format!("{}/16", Layout::host_ip(t, h));
            ip(&["netns", "add", &host])?;
            ip(&["link", "add", "eth0", "netns", &host, "type", "veth", "peer", "name", &port, "netns", &tor])?;
            ip(&["-n", &tor, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", &host, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &host, "link", "set", "lo", "up"])?;
            ip(&["-n", &host, "link", "set", "eth0", "up"])?;
            add_rxe(&host)?;
        }
    }
    let mut inv = layout.inventory(1);
    for h in &mut inv.hosts {
        let r = &mut h.rnics[0];
        let IpAddr::V4(v4) = r.ip else { bail!("the fabric's hosts have IPv4 addresses") };
        r.gid_index = Some(wait_for_gid(&r.device, v4)?);
    }
    save(&inv)?;
    Ok(inv)
}

fn bridge(ns: &str) -> anyhow::Result<()> {
    ip(&["-n", ns, "link", "add", "br0", "type", "bridge"])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    ip(&["-n", ns, "link", "set", "br0", "up"])?;
    Ok(())
}

fn add_rxe(host: &str) -> anyhow::Result<()> {
    let dev = device_name(host);
    run("ip", &["netns", "exec", host, "rdma", "link", "add", &dev, "type", "rxe", "netdev", "eth0"])
        .with_context(|| format!("creating the rxe device of {host} (is rdma_rxe loaded? this needs the rxe VM)"))?;
    Ok(())
}

/// The index of `ip`'s RoCEv2 GID on `device`, once the kernel has listed it.
pub fn wait_for_gid(device: &str, ip: Ipv4Addr) -> anyhow::Result<u16> {
    let want = rocemesh_formats::gid::gid_of(ip.into());
    let port = format!("/sys/class/infiniband/{device}/ports/1");
    let started = Instant::now();
    loop {
        for i in 0..16u16 {
            let gid = std::fs::read_to_string(format!("{port}/gids/{i}")).ok();
            let kind = std::fs::read_to_string(format!("{port}/gid_attrs/types/{i}")).ok();
            if let (Some(gid), Some(kind)) = (gid, kind)
                && gid.trim().parse::<Ipv6Addr>().ok() == Some(want)
                && kind.trim() == "RoCE v2"
            {
                return Ok(i);
            }
        }
        if started.elapsed() > GID_WAIT {
            bail!("{device} shows no RoCE v2 GID for {ip} after {} s (see {port}/gids)", GID_WAIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn save(inv: &Inventory) -> anyhow::Result<()> {
    let text = inv.to_toml_string().context("serialising the fabric's inventory")?;
    // What the fault helpers read is what a controller would: refuse anything it would refuse.
    Inventory::parse(&text, Path::new(STATE)).map_err(|e| anyhow!("the generated inventory is invalid: {e}"))?;
    let dir = Path::new(STATE).parent().unwrap_or(Path::new("/run"));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(STATE, text).with_context(|| format!("writing {STATE}"))
}

/// Writes the fabric's inventory to `path` and loads it back with the inventory reader.
pub fn write_inventory(inv: &Inventory, path: &Path) -> anyhow::Result<()> {
    let text = inv.to_toml_string().context("serialising the fabric's inventory")?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    let back = Inventory::load(path).map_err(|e| anyhow!("{e}"))?;
    if &back != inv {
        bail!("{} does not read back as the inventory that was written", path.display());
    }
    Ok(())
}

/// Removes the fabric: its rxe devices, then its namespaces (which takes their veths along).
pub fn down() -> anyhow::Result<()> {
    let inv = current().ok();
    let mut namespaces: Vec<String> = Vec::new();
    if let Some(inv) = &inv {
        for h in &inv.hosts {
            for r in &h.rnics {
                run_quietly("rdma", &["link", "delete", &r.device]);
            }
            namespaces.push(h.name.clone());
        }
        namespaces.extend(inv.tors.iter().map(|t| t.name.clone()));
        namespaces.extend(inv.spines.iter().map(|s| s.name.clone()));
    } else {
        // No state (a half-built fabric): everything named like ours goes.
        for dev in rxe_devices(&run("rdma", &["link", "show"]).unwrap_or_default()) {
            run_quietly("rdma", &["link", "delete", &dev]);
        }
        namespaces =
            netns_names(&ip(&["netns", "list"]).unwrap_or_default()).into_iter().filter(|n| is_ours(n)).collect();
    }
    let existing = netns_names(&ip(&["netns", "list"]).unwrap_or_default());
    for ns in namespaces.iter().filter(|n| existing.contains(n)) {
        ip(&["netns", "delete", ns])?;
    }
    let _ = std::fs::remove_file(STATE);
    Ok(())
}

/// Names in `ip netns list` output (`tor0-h1 (id: 3)`).
pub fn netns_names(list: &str) -> Vec<String> {
    list.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect()
}

/// rxe devices of the fabric in `rdma link show` output (`link rxe_tor0-h0/1 state ACTIVE ...`).
pub fn rxe_devices(links: &str) -> Vec<String> {
    links
        .lines()
        .filter_map(|l| l.strip_prefix("link ")?.split('/').next())
        .filter(|d| d.starts_with("rxe_"))
        .map(str::to_string)
        .collect()
}

/// Names this module gives namespaces: `spineN`, `torN`, `torN-hM`.
pub fn is_ours(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(n) = name.strip_prefix("spine") {
        return digits(n);
    }
    let Some(rest) = name.strip_prefix("tor") else { return false };
    match rest.split_once("-h") {
        Some((t, h)) => digits(t) && digits(h),
        None => digits(rest),
    }
}

/// "RNIC dead, host alive": drops RoCEv2 (UDP 4791) arriving at `host`'s eth0, so nothing reaches
/// its RNIC while the host's TCP/IP keeps working.
pub fn rnic_kill(host_name: &str) -> anyhow::Result<()> {
    rnic_kill_with(host_name, false)
}

/// [`rnic_kill`], and with `egress` what the RNIC sends is dropped too; rxe then completes those
/// sends in error ("Work Request Flushed Error") instead of letting them vanish on the wire.
pub fn rnic_kill_with(host_name: &str, egress: bool) -> anyhow::Result<()> {
    let h = host(&current()?, host_name)?;
    rnic_heal(&h.name)?;
    let n = h.name.as_str();
    // clsact carries both an ingress and an egress hook.
    ip_tc(n, &["qdisc", "add", "dev", "eth0", "clsact"])?;
    let port = ROCE_PORT.to_string();
    let dirs: &[&str] = if egress { &["ingress", "egress"] } else { &["ingress"] };
    for dir in dirs {
        let filter = ["filter", "add", "dev", "eth0", dir, "protocol", "ip", "flower", "ip_proto", "udp"];
        let mut args = filter.to_vec();
        args.extend(["dst_port", &port, "action", "drop"]);
        ip_tc(n, &args)?;
    }
    Ok(())
}

/// Undoes [`rnic_kill`].
pub fn rnic_heal(host_name: &str) -> anyhow::Result<()> {
    let h = host(&current()?, host_name)?;
    run_quietly("tc", &["-n", &h.name, "qdisc", "del", "dev", "eth0", "clsact"]);
    Ok(())
}

fn ip_tc(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run("tc", &all)
}

/// Random loss of `percent` on `tor`'s uplink, both directions (netem on each end's egress).
pub fn uplink_loss(tor: &str, percent: f64) -> anyhow::Result<()> {
    check_tor(&current()?, tor)?;
    if !(0.0..=100.0).contains(&percent) {
        bail!("loss must be 0 to 100 percent, not {percent}");
    }
    let loss = format!("{percent}%");
    for (ns, dev) in [(tor, UPLINK), (SPINE, tor)] {
        ip_tc(ns, &["qdisc", "replace", "dev", dev, "root", "netem", "loss", &loss])?;
    }
    Ok(())
}

/// Undoes [`uplink_loss`].
pub fn uplink_heal(tor: &str) -> anyhow::Result<()> {
    check_tor(&current()?, tor)?;
    for (ns, dev) in [(tor, UPLINK), (SPINE, tor)] {
        run_quietly("tc", &["-n", ns, "qdisc", "del", "dev", dev, "root"]);
    }
    Ok(())
}

/// Deletes `host`'s rxe device (under running processes: they see the device vanish).
pub fn rdma_delete(host_name: &str) -> anyhow::Result<()> {
    let h = host(&current()?, host_name)?;
    run("rdma", &["link", "delete", &h.device])?;
    Ok(())
}

/// Recreates `host`'s rxe device and waits for its GID; the index must be the inventory's.
pub fn rdma_add(host_name: &str) -> anyhow::Result<()> {
    let h = host(&current()?, host_name)?;
    add_rxe(&h.name)?;
    let IpAddr::V4(v4) = h.ip else { bail!("{host_name} has no IPv4 address in {STATE}") };
    let index = wait_for_gid(&h.device, v4)?;
    if index != h.gid_index {
        bail!("{} came back with its GID at index {index}, not {} as the inventory says", h.device, h.gid_index);
    }
    Ok(())
}

/// Runs `command` in `host`'s namespace with this process's stdio; returns its exit code.
pub fn exec(host_name: &str, command: &[String]) -> anyhow::Result<i32> {
    let h = host(&current()?, host_name)?;
    if command.is_empty() {
        bail!("no command to run in {host_name}; give it after `--`");
    }
    let status = std::process::Command::new("ip")
        .args(["netns", "exec", &h.name])
        .args(command)
        .status()
        .context("running ip netns exec")?;
    // As a shell reports a command killed by a signal.
    Ok(status.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)))
}

/// A server in one host and a client in another, each killed at `timeout`.
fn client_server(
    server: &FabricHost,
    client: &FabricHost,
    program: &str,
    args: &[String],
    timeout: Duration,
) -> anyhow::Result<(Captured, Captured)> {
    let in_ns = |h: &FabricHost, extra: &[String]| -> Vec<String> {
        let mut a: Vec<String> =
            ["netns", "exec", &h.name, program, "-d", &h.device].iter().map(|s| s.to_string()).collect();
        a.extend(args.iter().cloned());
        a.extend(extra.iter().cloned());
        a
    };
    let deadline = Instant::now() + timeout;
    let mut srv = Running::spawn("ip", &in_ns(server, &[]))?;
    wait_listening(&server.name, TOOL_PORT, &mut srv, deadline)
        .with_context(|| format!("{program} server in {}", server.name))?;
    let cli = Running::spawn("ip", &in_ns(client, &[server.ip.to_string()]))?;
    let c = cli.finish(deadline.saturating_duration_since(Instant::now()));
    // The server ends once the client is done; a little slack for its last completions.
    let s = srv.finish(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(2)));
    Ok((s, c))
}

fn wait_listening(ns: &str, port: u16, server: &mut Running, deadline: Instant) -> anyhow::Result<()> {
    loop {
        let tables = run("ip", &["netns", "exec", ns, "cat", "/proc/net/tcp", "/proc/net/tcp6"]).unwrap_or_default();
        if proc::listening_ports(&tables).contains(&port) {
            return Ok(());
        }
        if server.exited() {
            bail!("exited before listening on TCP port {port}");
        }
        if Instant::now() >= deadline {
            bail!("not listening on TCP port {port} in time");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running RC connection between two fabric hosts: perftest's `ib_write_bw` (RC, its default)
/// for `duration_s`, 64-byte writes rate-limited in software (measured: ~60 writes/s), QPs
/// exchanged over TCP `port`. Both ends run as SCHED_IDLE (`chrt --idle`): perftest spins, and
/// under TCG a spinning pair would starve the agents. rxe's work runs in the kernel and is not
/// deprioritised, hence the rate limit: `ib_send_lat` ping-ponging at full speed kept rxe busy
/// enough that every probe in the VM was slow, and analyze rightly blamed hosts and ToRs.
/// (`ib_send_lat -e`, which sleeps on CQ events, wedged rxe: "rxe_cq_post: queue full".)
#[derive(Debug)]
pub struct RcPair {
    pub server: Running,
    pub client: Running,
}

pub fn start_rc(server: &str, client: &str, port: u16, duration_s: u64) -> anyhow::Result<RcPair> {
    let inv = current()?;
    let (s, c) = (host(&inv, server)?, host(&inv, client)?);
    let args = |h: &FabricHost, extra: Option<IpAddr>| -> Vec<String> {
        let mut a: Vec<String> = ["netns", "exec", &h.name, "chrt", "--idle", "0", "ib_write_bw", "-d", &h.device]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["-x".into(), h.gid_index.to_string(), "-D".into(), duration_s.to_string()]);
        a.extend(["-s", "64", "--rate_limit=200", "--rate_units=p", "--rate_limit_type=SW"].map(String::from));
        a.extend(["-p".into(), port.to_string()]);
        a.extend(extra.map(|ip| ip.to_string()));
        a
    };
    let mut srv = Running::spawn("ip", &args(&s, None))?;
    wait_listening(&s.name, port, &mut srv, Instant::now() + Duration::from_secs(30))
        .with_context(|| format!("ib_write_bw server in {}", s.name))?;
    let cli = Running::spawn("ip", &args(&c, Some(s.ip)))?;
    Ok(RcPair { server: srv, client: cli })
}

/// UD ping-pong from `client` to `server` with `ibv_ud_pingpong`.
pub fn pingpong(server: &str, client: &str, iters: u32, timeout: Duration) -> anyhow::Result<Pingpong> {
    let inv = current()?;
    let (s, c) = (host(&inv, server)?, host(&inv, client)?);
    let args: Vec<String> =
        vec!["-g".into(), s.gid_index.to_string(), "-s".into(), "512".into(), "-n".into(), iters.to_string()];
    if c.gid_index != s.gid_index {
        bail!("{server} and {client} have different GID indexes; ibv_ud_pingpong takes one -g");
    }
    let (srv, cli) = client_server(&s, &c, "ibv_ud_pingpong", &args, timeout)?;
    if !cli.success() {
        bail!("ibv_ud_pingpong {client} -> {server} failed: client {}; server {}", cli.describe(), srv.describe());
    }
    perftest::parse_pingpong(&cli.stdout)
        .ok_or_else(|| anyhow!("ibv_ud_pingpong printed no summary line:\n{}", cli.stdout))
}

/// What [`perftest`] measures with.
#[derive(Debug, Clone, Copy)]
pub struct PerftestOptions {
    pub iters: u32,
    pub size: u32,
    pub timeout: Duration,
}

impl Default for PerftestOptions {
    fn default() -> Self {
        PerftestOptions { iters: 1000, size: 64, timeout: Duration::from_secs(120) }
    }
}

/// `ib_send_lat -c UD` and `ib_send_bw -c UD` from `client` to `server`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PerftestResult {
    pub server: String,
    pub client: String,
    pub latency: Latency,
    pub bandwidth: Bandwidth,
}

impl fmt::Display for PerftestResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {}: UD send latency typical {:.2} us (min {:.2}, p99 {:.2}, {} x {} B); \
             UD send rate {:.4} Mpps ({:.0} msg/s, {:.3} MB/s avg, {} x {} B)",
            self.client,
            self.server,
            self.latency.typical_us,
            self.latency.min_us,
            self.latency.p99_us,
            self.latency.iterations,
            self.latency.bytes,
            self.bandwidth.msg_rate_mpps,
            self.bandwidth.msgs_per_s(),
            self.bandwidth.avg_mb_s,
            self.bandwidth.iterations,
            self.bandwidth.bytes,
        )
    }
}

/// Runs the perftest pair between two hosts of the fabric.
pub fn perftest(server: &str, client: &str, opts: PerftestOptions) -> anyhow::Result<PerftestResult> {
    let inv = current()?;
    let (s, c) = (host(&inv, server)?, host(&inv, client)?);
    let args: Vec<String> =
        ["-c", "UD", "-x", &s.gid_index.to_string(), "-n", &opts.iters.to_string(), "-s", &opts.size.to_string(), "-F"]
            .iter()
            .map(|a| a.to_string())
            .collect();
    let mut out = Vec::new();
    for tool in ["ib_send_lat", "ib_send_bw"] {
        let (srv, cli) = client_server(&s, &c, tool, &args, opts.timeout)?;
        if !cli.success() {
            bail!(
                "{tool} {client} -> {server} failed: client {}; server {}\n{}",
                cli.describe(),
                srv.describe(),
                cli.stdout
            );
        }
        out.push(cli.stdout);
    }
    let latency = perftest::parse_send_lat(&out[0])
        .ok_or_else(|| anyhow!("no result table in ib_send_lat's output:\n{}", out[0]))?;
    let bandwidth = perftest::parse_send_bw(&out[1])
        .ok_or_else(|| anyhow!("no result table in ib_send_bw's output:\n{}", out[1]))?;
    Ok(PerftestResult { server: server.to_string(), client: client.to_string(), latency, bandwidth })
}

/// The whole chain in one go: brings `layout` up, proves UD verbs between and within ToRs, and
/// (with `faults`) that each fault helper breaks exactly what it should and heals. Prints one
/// line per check; returns whether all passed. The fabric is left up.
pub fn smoke(layout: Layout, faults: bool) -> anyhow::Result<bool> {
    if layout.tors < 2 {
        bail!("the smoke test crosses ToRs: it needs at least 2");
    }
    let started = Instant::now();
    let inv = up(layout)?;
    println!(
        "smoke: fabric up: {} ToRs x {} hosts, {} rxe devices, GID index {} ({:.1} s)",
        layout.tors,
        layout.hosts_per_tor,
        inv.hosts.len(),
        inv.hosts[0].rnics[0].gid_index.unwrap_or(1),
        started.elapsed().as_secs_f64()
    );
    let (a, b) = (Layout::host_name(0, 0), Layout::host_name(1, 0));
    let same_tor = (layout.hosts_per_tor >= 2).then(|| (Layout::host_name(1, 0), Layout::host_name(1, 1)));
    let mut checks = Checks::default();
    const ITERS: u32 = 200;
    const WORKS: Duration = Duration::from_secs(60);
    // UD to a dead RNIC waits forever: the pingpong is killed after this and that is the pass.
    const BROKEN: Duration = Duration::from_secs(5);
    checks.works(&format!("UD pingpong {b} -> {a} across ToRs"), || pingpong(&a, &b, ITERS, WORKS));
    if let Some((x, y)) = &same_tor {
        checks.works(&format!("UD pingpong {y} -> {x} within tor1"), || pingpong(x, y, ITERS, WORKS));
    }
    if faults {
        checks.step(&format!("rnic-kill {b}"), || rnic_kill(&b));
        checks.fails(&format!("UD pingpong {b} -> {a} with {b}'s RNIC dead"), || pingpong(&a, &b, ITERS, BROKEN));
        checks.step(&format!("rnic-heal {b}"), || rnic_heal(&b));
        checks.works(&format!("UD pingpong {b} -> {a} healed"), || pingpong(&a, &b, ITERS, WORKS));

        checks.step("uplink-loss tor1 100%", || uplink_loss("tor1", 100.0));
        checks.fails(&format!("UD pingpong {b} -> {a} over the lossy uplink"), || pingpong(&a, &b, ITERS, BROKEN));
        if let Some((x, y)) = &same_tor {
            checks.works(&format!("UD pingpong {y} -> {x} under tor1, uplink not crossed"), || {
                pingpong(x, y, ITERS, WORKS)
            });
        }
        checks.step("uplink-heal tor1", || uplink_heal("tor1"));
        checks.works(&format!("UD pingpong {b} -> {a} healed"), || pingpong(&a, &b, ITERS, WORKS));

        checks.step(&format!("rdma-delete {b}"), || rdma_delete(&b));
        checks.step(&format!("{} is gone", device_name(&b)), || {
            let dev = Path::new("/sys/class/infiniband").join(device_name(&b));
            if dev.exists() { Err(anyhow!("{} still exists", dev.display())) } else { Ok(()) }
        });
        checks.step(&format!("rdma-add {b}"), || rdma_add(&b));
        checks.works(&format!("UD pingpong {b} -> {a} on the new device"), || pingpong(&a, &b, ITERS, WORKS));
    }
    println!(
        "smoke: {} of {} checks passed in {:.1} s",
        checks.passed,
        checks.passed + checks.failed,
        started.elapsed().as_secs_f64()
    );
    Ok(checks.failed == 0)
}

#[derive(Debug, Default)]
struct Checks {
    passed: u32,
    failed: u32,
}

impl Checks {
    fn record(&mut self, ok: bool, what: &str, detail: String, took: Duration) {
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        println!("smoke: {} {what}: {detail} ({:.1} s)", if ok { "PASS" } else { "FAIL" }, took.as_secs_f64());
    }

    fn works(&mut self, what: &str, f: impl FnOnce() -> anyhow::Result<Pingpong>) {
        let t = Instant::now();
        match f() {
            Ok(p) => self.record(
                true,
                what,
                format!("{} iters, {:.0} usec/iter", p.iterations, p.usec_per_iter),
                t.elapsed(),
            ),
            Err(e) => self.record(false, what, format!("{e:#}"), t.elapsed()),
        }
    }

    fn fails(&mut self, what: &str, f: impl FnOnce() -> anyhow::Result<Pingpong>) {
        let t = Instant::now();
        match f() {
            Ok(p) => self.record(false, what, format!("expected no traffic, got {} iters", p.iterations), t.elapsed()),
            Err(e) => self.record(
                true,
                what,
                format!("no traffic, as expected ({})", first_line(&format!("{e:#}"))),
                t.elapsed(),
            ),
        }
    }

    fn step(&mut self, what: &str, f: impl FnOnce() -> anyhow::Result<()>) {
        let t = Instant::now();
        match f() {
            Ok(()) => self.record(true, what, "done".to_string(), t.elapsed()),
            Err(e) => self.record(false, what, format!("{e:#}"), t.elapsed()),
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_layout_is_a_valid_inventory() {
        let inv = Layout::default().inventory(1);
        let text = inv.to_toml_string().unwrap();
        let back = Inventory::parse(&text, Path::new("inventory.toml")).unwrap();
        assert_eq!(back, inv);
        assert_eq!(inv.tors.len(), 2);
        assert_eq!(inv.links.len(), 2);
        assert_eq!(inv.hosts.len(), 6);
        let h = &inv.hosts[4];
        assert_eq!(h.name, "tor1-h1");
        assert_eq!(h.rnics[0].device, "rxe_tor1-h1");
        assert_eq!(h.rnics[0].tor, "tor1");
        assert_eq!(h.rnics[0].ip, "10.0.1.2".parse::<IpAddr>().unwrap());
        assert_eq!(h.rnics[0].gid_index, Some(1));
        assert_eq!(h.rnics[0].gid_or_mapped(), "::ffff:10.0.1.2".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn layouts_must_fit_the_addressing() {
        assert!(Layout::new(0, 3).is_err());
        assert!(Layout::new(2, 251).is_err());
        let big = Layout::new(200, 250).unwrap();
        assert_eq!(Layout::host_ip(199, 249), Ipv4Addr::new(10, 0, 199, 250));
        // Interface names in the spine are ToR names: they must fit IFNAMSIZ (15).
        assert!(Layout::tor_name(big.tors - 1).len() <= 15);
    }

    #[test]
    fn names_of_our_namespaces_and_devices() {
        for ours in ["spine0", "tor0", "tor12", "tor1-h2"] {
            assert!(is_ours(ours), "{ours}");
        }
        for theirs in ["spine", "tor", "torx", "tor1-h", "tor1-hx", "h1", "default"] {
            assert!(!is_ours(theirs), "{theirs}");
        }
        assert_eq!(netns_names("tor0-h1 (id: 3)\nspine0\n"), ["tor0-h1", "spine0"]);
        let links = "link rxe_tor0-h0/1 state ACTIVE physical_state LINK_UP netdev eth0 \nlink mlx5_0/1 state DOWN\n";
        assert_eq!(rxe_devices(links), ["rxe_tor0-h0"]);
    }
}
