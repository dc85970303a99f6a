//! The two-tier Clos fabric of `testbeds clos`, in network namespaces of the host kernel.
//!
//! Every host, ToR and spine is a namespace named `<prefix>-<node>` (`rmc4242-tor1-h2`,
//! `rmc4242-tor1`, `rmc4242-spine0`); the prefix carries the pid of the `testbeds` that made it,
//! so that a later run can tell a stale fabric (its maker is gone) from a live one. Interfaces
//! are created straight inside those namespaces (`ip link add ... netns A type veth peer ...
//! netns B`) and never exist in the root namespace, so their names need no prefix: `eth0` in a
//! host, `h{i}` (to host i) and `s{j}` (to spine j) in a ToR, `t{i}` (to ToR i) in a spine.
//!
//! Addresses ([`Plan`]): host i under ToR t is `10.0.t.(2i+1)/31`, its ToR's port `10.0.t.(2i)`;
//! the ToR-spine link (t, s) is `172.16.s.(2t)/31` on the ToR, `172.16.s.(2t+1)` on the spine.
//! Routed, not bridged: ToRs and spines forward (ip_forward=1), each ToR reaches the others'
//! /24s over an ECMP route through every spine, hashed on the UDP 5-tuple
//! (fib_multipath_hash_policy=1), and each spine reaches ToR t's /24 over its link to t.
//! Routers answer TTL expiry without rate limits (icmp_ratelimit=0, icmp_ratemask=0: path
//! traces send bursts of TTL-limited probes), from the interface the packet came in on
//! (icmp_errors_use_inbound_ifaddr=1, as switches do: the answering address then names the link
//! it arrived over), with rp_filter off.
//!
//! A management network beside the fabric, as clusters have one out of band: the namespace
//! [`MGMT`] holds a bridge at [`Plan::collector_ip`], and every host a second interface
//! [`MGMT_IF`] on it (`192.168.0.0/16`, [`Plan::mgmt_ip`]). The live analyzer listens there, so
//! the agents' pushes do not cross the faults they report.
//!
//! Faults are nftables rules in a table of their own ([`NFT_TABLE`]) on the postrouting hook,
//! so that packets the router itself sends (ICMP) are dropped too; [`loss_rules`] writes them.

use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{Context, bail};

use crate::rxefabric::proc::{run, run_quietly};

/// The prefix of every namespace this module makes: `rmc<pid>-`.
pub const PREFIX: &str = "rmc";
/// The host's interface.
pub const HOST_IF: &str = "eth0";
/// The management network's node (its namespace is `<prefix>-mgmt`).
pub const MGMT: &str = "mgmt";
/// The host's management interface.
pub const MGMT_IF: &str = "mgmt0";

/// The nftables table faults live in (one per namespace, at most one fault at a time in it).
pub const NFT_TABLE: &str = "rocemesh_fault";

/// The address plan: who is where, which interface, which address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Namespace prefix of this run, `rmc<pid>`.
    pub prefix: String,
    pub spines: u32,
    pub tors: u32,
    pub hosts_per_tor: u32,
}

impl Plan {
    /// A plan whose addresses fit: ToRs and hosts per ToR 1..=127 (the /31s of 10.0.t.0/24 and
    /// 172.16.s.0/24), spines 1..=255.
    pub fn new(prefix: &str, spines: u32, tors: u32, hosts_per_tor: u32) -> anyhow::Result<Plan> {
        if !(1..=255).contains(&spines) || !(2..=127).contains(&tors) || !(1..=127).contains(&hosts_per_tor) {
            bail!(
                "a Clos fabric has 1 to 255 spines, 2 to 127 ToRs and 1 to 127 hosts per ToR \
                 (asked for {spines} spines, {tors} ToRs of {hosts_per_tor} hosts)"
            );
        }
        Ok(Plan { prefix: prefix.to_string(), spines, tors, hosts_per_tor })
    }

    /// The plan of this process: prefix `rmc<pid>`.
    pub fn for_this_process(spines: u32, tors: u32, hosts_per_tor: u32) -> anyhow::Result<Plan> {
        Plan::new(&format!("{PREFIX}{}", std::process::id()), spines, tors, hosts_per_tor)
    }

    pub fn tor(t: u32) -> String {
        format!("tor{t}")
    }

    pub fn spine(s: u32) -> String {
        format!("spine{s}")
    }

    pub fn host(t: u32, h: u32) -> String {
        format!("tor{t}-h{h}")
    }

    /// The namespace of a node (`tor1`, `spine0`, `tor1-h2`).
    pub fn ns(&self, node: &str) -> String {
        format!("{}-{node}", self.prefix)
    }

    /// Every host as (ToR, index).
    pub fn hosts(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        (0..self.tors).flat_map(move |t| (0..self.hosts_per_tor).map(move |h| (t, h)))
    }

    /// Every namespace, spines first, hosts, then the management network.
    pub fn namespaces(&self) -> Vec<String> {
        let spines = (0..self.spines).map(|s| self.ns(&Self::spine(s)));
        let tors = (0..self.tors).map(|t| self.ns(&Self::tor(t)));
        let hosts = self.hosts().map(|(t, h)| self.ns(&Self::host(t, h)));
        spines.chain(tors).chain(hosts).chain([self.ns(MGMT)]).collect()
    }

    /// Host h of ToR t on the management network.
    pub fn mgmt_ip(&self, t: u32, h: u32) -> Ipv4Addr {
        let k = t * self.hosts_per_tor + h;
        Ipv4Addr::new(192, 168, (k / 250) as u8, (k % 250 + 1) as u8)
    }

    /// The management network's own address, where the live analyzer listens.
    pub fn collector_ip() -> Ipv4Addr {
        Ipv4Addr::new(192, 168, 255, 254)
    }

    /// Host h of ToR t: its RNIC's address.
    pub fn host_ip(t: u32, h: u32) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, t as u8, (2 * h + 1) as u8)
    }

    /// The ToR's end of host h's /31: the host's gateway.
    pub fn host_gw(t: u32, h: u32) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, t as u8, (2 * h) as u8)
    }

    /// The hosts of ToR t, as a route destination.
    pub fn tor_subnet(t: u32) -> String {
        format!("10.0.{t}.0/24")
    }

    /// The ToR's end of link (t, s).
    pub fn uplink_ip(t: u32, s: u32) -> Ipv4Addr {
        Ipv4Addr::new(172, 16, s as u8, (2 * t) as u8)
    }

    /// The spine's end of link (t, s).
    pub fn downlink_ip(t: u32, s: u32) -> Ipv4Addr {
        Ipv4Addr::new(172, 16, s as u8, (2 * t + 1) as u8)
    }

    /// In ToR t: the port of host h.
    pub fn host_port(h: u32) -> String {
        format!("h{h}")
    }

    /// In a ToR: the uplink to spine s.
    pub fn uplink(s: u32) -> String {
        format!("s{s}")
    }

    /// In a spine: the link to ToR t.
    pub fn downlink(t: u32) -> String {
        format!("t{t}")
    }

    /// Every address of ToR t (host ports, then uplinks).
    pub fn tor_addrs(&self, t: u32) -> Vec<Ipv4Addr> {
        let ports = (0..self.hosts_per_tor).map(|h| Self::host_gw(t, h));
        ports.chain((0..self.spines).map(|s| Self::uplink_ip(t, s))).collect()
    }

    /// Every address of spine s.
    pub fn spine_addrs(&self, s: u32) -> Vec<Ipv4Addr> {
        (0..self.tors).map(|t| Self::downlink_ip(t, s)).collect()
    }

    /// The switch (`tor1`, `spine0`) an address belongs to.
    pub fn switch_of(&self, addr: Ipv4Addr) -> Option<String> {
        let [a, b, c, d] = addr.octets();
        let (c, d) = (u32::from(c), u32::from(d));
        match (a, b) {
            (10, 0) if c < self.tors && d % 2 == 0 && d / 2 < self.hosts_per_tor => Some(Self::tor(c)),
            (172, 16) if c < self.spines && d / 2 < self.tors => {
                Some(if d % 2 == 0 { Self::tor(d / 2) } else { Self::spine(c) })
            }
            _ => None,
        }
    }

    /// The host an address is the RNIC of.
    pub fn host_of(&self, addr: Ipv4Addr) -> Option<(u32, u32)> {
        let [a, b, c, d] = addr.octets();
        let (c, d) = (u32::from(c), u32::from(d));
        (a == 10 && b == 0 && c < self.tors && d % 2 == 1 && d / 2 < self.hosts_per_tor).then_some((c, d / 2))
    }

    /// The `ip` invocations that build the fabric, in order: namespaces, router sysctls (before
    /// any interface exists, so that new interfaces inherit `default`), links, addresses, routes.
    pub fn build_steps(&self) -> Vec<Vec<String>> {
        let mut steps: Vec<Vec<String>> = Vec::new();
        let mut ip = |args: &[&str]| steps.push(args.iter().map(|a| a.to_string()).collect());
        for ns in self.namespaces() {
            ip(&["netns", "add", &ns]);
        }
        let routers: Vec<String> = (0..self.spines)
            .map(|s| self.ns(&Self::spine(s)))
            .chain((0..self.tors).map(|t| self.ns(&Self::tor(t))))
            .collect();
        for ns in &routers {
            let mut args = vec!["netns", "exec", ns, "sysctl", "-q", "-w"];
            args.extend(ROUTER_SYSCTLS);
            ip(&args);
        }
        for ns in self.namespaces() {
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        for t in 0..self.tors {
            let tor = self.ns(&Self::tor(t));
            for s in 0..self.spines {
                let spine = self.ns(&Self::spine(s));
                let (up, down) = (Self::uplink(s), Self::downlink(t));
                ip(&[
                    "link", "add", "name", &up, "netns", &tor, "type", "veth", "peer", "name", &down, "netns", &spine,
                ]);
                ip(&["-n", &tor, "addr", "add", &format!("{}/31", Self::uplink_ip(t, s)), "dev", &up]);
                ip(&["-n", &spine, "addr", "add", &format!("{}/31", Self::downlink_ip(t, s)), "dev", &down]);
                ip(&["-n", &tor, "link", "set", &up, "up"]);
                ip(&["-n", &spine, "link", "set", &down, "up"]);
                ip(&["-n", &spine, "route", "add", &Self::tor_subnet(t), "via", &Self::uplink_ip(t, s).to_string()]);
            }
            for h in 0..self.hosts_per_tor {
                let host = self.ns(&Self::host(t, h));
                let port = Self::host_port(h);
                ip(&[
                    "link", "add", "name", &port, "netns", &tor, "type", "veth", "peer", "name", HOST_IF, "netns",
                    &host,
                ]);
                ip(&["-n", &tor, "addr", "add", &format!("{}/31", Self::host_gw(t, h)), "dev", &port]);
                ip(&["-n", &host, "addr", "add", &format!("{}/31", Self::host_ip(t, h)), "dev", HOST_IF]);
                ip(&["-n", &tor, "link", "set", &port, "up"]);
                ip(&["-n", &host, "link", "set", HOST_IF, "up"]);
                ip(&["-n", &host, "route", "add", "default", "via", &Self::host_gw(t, h).to_string()]);
            }
        }
        let mgmt = self.ns(MGMT);
        ip(&["-n", &mgmt, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &mgmt, "addr", "add", &format!("{}/16", Self::collector_ip()), "dev", "br0"]);
        ip(&["-n", &mgmt, "link", "set", "br0", "up"]);
        for (k, (t, h)) in self.hosts().enumerate() {
            let host = self.ns(&Self::host(t, h));
            let port = format!("m{k}");
            ip(&[
                "link", "add", "name", &port, "netns", &mgmt, "type", "veth", "peer", "name", MGMT_IF, "netns", &host,
            ]);
            ip(&["-n", &mgmt, "link", "set", &port, "master", "br0"]);
            ip(&["-n", &mgmt, "link", "set", &port, "up"]);
            ip(&["-n", &host, "addr", "add", &format!("{}/16", self.mgmt_ip(t, h)), "dev", MGMT_IF]);
            ip(&["-n", &host, "link", "set", MGMT_IF, "up"]);
        }
        for t in 0..self.tors {
            let tor = self.ns(&Self::tor(t));
            for u in (0..self.tors).filter(|&u| u != t) {
                let subnet = Self::tor_subnet(u);
                let mut args = vec!["-n".to_string(), tor.clone(), "route".into(), "add".into(), subnet];
                for s in 0..self.spines {
                    args.extend(["nexthop", "via"].map(String::from));
                    args.push(Self::downlink_ip(t, s).to_string());
                    args.extend(["dev".to_string(), Self::uplink(s)]);
                }
                steps.push(args);
            }
        }
        steps
    }

    /// The inventory of the fabric as TOML: ToRs, spines, every ToR-spine link, one RNIC
    /// (`rnic0`) per host and, with `addrs`, every address of each switch.
    pub fn inventory_toml(&self, addrs: bool) -> String {
        let list = |a: Vec<Ipv4Addr>| a.iter().map(|x| format!("\"{x}\"")).collect::<Vec<_>>().join(", ");
        let mut s = String::from("version = 1\n");
        for t in 0..self.tors {
            s.push_str(&format!("\n[[tor]]\nname = \"{}\"\n", Self::tor(t)));
            if addrs {
                s.push_str(&format!("addrs = [{}]\n", list(self.tor_addrs(t))));
            }
        }
        for sp in 0..self.spines {
            s.push_str(&format!("\n[[spine]]\nname = \"{}\"\n", Self::spine(sp)));
            if addrs {
                s.push_str(&format!("addrs = [{}]\n", list(self.spine_addrs(sp))));
            }
        }
        for t in 0..self.tors {
            for sp in 0..self.spines {
                s.push_str(&format!("\n[[link]]\na = \"{}\"\nb = \"{}\"\n", Self::tor(t), Self::spine(sp)));
            }
        }
        for (t, h) in self.hosts() {
            s.push_str(&format!(
                "\n[[host]]\nname = \"{}\"\n\n[[host.rnic]]\ndevice = \"{DEVICE}\"\ntor = \"{}\"\nip = \"{}\"\nnetdev = \"{HOST_IF}\"\n",
                Self::host(t, h),
                Self::tor(t),
                Self::host_ip(t, h)
            ));
        }
        s
    }
}

/// The RNIC (and shard) device of every host.
pub const DEVICE: &str = "rnic0";

/// Set in every ToR and spine (see the module docs).
const ROUTER_SYSCTLS: [&str; 8] = [
    "net.ipv4.ip_forward=1",
    "net.ipv4.fib_multipath_hash_policy=1",
    "net.ipv4.icmp_ratelimit=0",
    "net.ipv4.icmp_ratemask=0",
    "net.ipv4.icmp_errors_use_inbound_ifaddr=1",
    "net.ipv4.conf.all.rp_filter=0",
    "net.ipv4.conf.default.rp_filter=0",
    "net.ipv4.conf.lo.rp_filter=0",
];

/// The fabric that is up; dropping it deletes its namespaces (and so every interface in them).
/// Processes still inside (agents) must be ended first.
#[derive(Debug)]
pub struct Fabric {
    pub plan: Plan,
    created: Vec<String>,
}

impl Fabric {
    /// Builds `plan`; what was made before a failing step is removed again.
    pub fn up(plan: Plan) -> anyhow::Result<Fabric> {
        let mut fabric = Fabric { plan, created: Vec::new() };
        for step in fabric.plan.build_steps() {
            let args: Vec<&str> = step.iter().map(String::as_str).collect();
            run("ip", &args)?;
            if let ["netns", "add", ns] = &args[..] {
                fabric.created.push(ns.to_string());
            }
        }
        Ok(fabric)
    }

    /// Runs `args` in node's namespace: `ip netns exec <ns> args...`.
    pub fn exec(&self, node: &str, args: &[&str]) -> anyhow::Result<String> {
        let ns = self.plan.ns(node);
        let mut all = vec!["netns", "exec", ns.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `ip -n <node's ns> args...`.
    pub fn ip(&self, node: &str, args: &[&str]) -> anyhow::Result<String> {
        let ns = self.plan.ns(node);
        let mut all = vec!["-n", ns.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Loads `rules` (nft syntax) into node's namespace.
    pub fn nft_load(&self, node: &str, rules: &str, dir: &Path) -> anyhow::Result<()> {
        let file = dir.join(format!("{node}.nft"));
        std::fs::write(&file, rules).with_context(|| format!("writing {}", file.display()))?;
        self.exec(node, &["nft", "-f", &file.to_string_lossy()])?;
        Ok(())
    }

    /// Removes [`NFT_TABLE`] from node's namespace; returns the packets its rules dropped.
    pub fn nft_clear(&self, node: &str) -> anyhow::Result<u64> {
        let listing = self.exec(node, &["nft", "list", "table", "inet", NFT_TABLE])?;
        self.exec(node, &["nft", "delete", "table", "inet", NFT_TABLE])?;
        Ok(dropped_packets(&listing))
    }

    /// Where the ToR of `from` (host h of ToR t) sends a UDP packet to `dst`:
    /// `ip route get <dst> from <src> iif h<h> ipproto udp sport S dport D`.
    pub fn route_get(&self, t: u32, h: u32, dst: Ipv4Addr, sport: u16, dport: u16) -> anyhow::Result<Route> {
        let (src, iif) = (Plan::host_ip(t, h).to_string(), Plan::host_port(h));
        let (dst, sport, dport) = (dst.to_string(), sport.to_string(), dport.to_string());
        let out = self.ip(
            &Plan::tor(t),
            &["route", "get", &dst, "from", &src, "iif", &iif, "ipproto", "udp", "sport", &sport, "dport", &dport],
        )?;
        parse_route_get(&out).with_context(|| format!("no route in `ip route get` output: {out:?}"))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for ns in self.created.iter().rev() {
            if !run_quietly("ip", &["netns", "delete", ns]) {
                eprintln!("testbeds clos: could not delete namespace {ns}; remove it with `ip netns delete {ns}`");
            }
        }
    }
}

/// A route as `ip route get` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The gateway; `None` for a directly connected destination.
    pub via: Option<Ipv4Addr>,
    pub dev: String,
}

/// `10.0.2.3 from 10.0.1.3 via 172.16.1.1 dev s1 table main \n cache iif h2`.
pub fn parse_route_get(out: &str) -> Option<Route> {
    let words: Vec<&str> = out.split_whitespace().collect();
    let after = |key: &str| words.windows(2).find(|w| w[0] == key).map(|w| w[1]);
    let dev = after("dev")?.to_string();
    let via = match after("via") {
        Some(v) => Some(v.parse().ok()?),
        None => None,
    };
    Some(Route { via, dev })
}

/// nftables rules dropping `percent` % of the packets leaving by each of `oifnames`,
/// router-generated ones included (postrouting): one rule, with its own counter, per port, so
/// that what each port dropped is known ([`port_drops`]), as a switch counts its discards.
pub fn loss_rules(percent: u32, oifnames: &[String]) -> String {
    let rules: String = oifnames
        .iter()
        .map(|i| format!("\t\toifname \"{i}\" numgen random mod 100 < {percent} counter drop\n"))
        .collect();
    format!(
        "table inet {NFT_TABLE} {{\n\tchain egress {{\n\t\ttype filter hook postrouting priority 0; policy accept;\n\
         {rules}\t}}\n}}\n"
    )
}

/// The packets each port's rule dropped, from an `nft list` output of [`loss_rules`].
pub fn port_drops(listing: &str) -> Vec<(String, u64)> {
    listing
        .lines()
        .filter_map(|l| {
            let port = l.split("oifname \"").nth(1)?.split('"').next()?;
            let n = l.split("counter packets ").nth(1)?.split_whitespace().next()?.parse().ok()?;
            Some((port.to_string(), n))
        })
        .collect()
}

/// The packets dropped, summed over the `counter packets N` of an `nft list` output.
pub fn dropped_packets(listing: &str) -> u64 {
    let words: Vec<&str> = listing.split_whitespace().collect();
    words.windows(3).filter(|w| w[0] == "counter" && w[1] == "packets").filter_map(|w| w[2].parse::<u64>().ok()).sum()
}

/// The address a `ping` answer came from when it is "Time to live exceeded".
pub fn parse_ttl_exceeded(ping_out: &str) -> Option<Ipv4Addr> {
    ping_out
        .lines()
        .filter(|l| l.contains("Time to live exceeded"))
        .find_map(|l| l.strip_prefix("From ")?.split([' ', ':']).next()?.parse().ok())
}

/// Namespaces of `ip netns list` output made by a `testbeds` that is gone: `rmc<pid>-...` where
/// `alive(pid)` is false.
pub fn stale_namespaces(list: &str, alive: impl Fn(u32) -> bool) -> Vec<String> {
    crate::rxefabric::netns_names(list)
        .into_iter()
        .filter(|n| {
            let Some((pid, _)) = n.strip_prefix(PREFIX).and_then(|r| r.split_once('-')) else { return false };
            pid.parse::<u32>().is_ok_and(|p| !alive(p))
        })
        .collect()
}

/// Whether `pid` is a running `testbeds` (a recycled pid running something else is not).
pub fn testbeds_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "testbeds")
}

/// Deletes the namespaces of gone `testbeds` runs; returns their names.
pub fn remove_stale() -> anyhow::Result<Vec<String>> {
    let list = run("ip", &["netns", "list"])?;
    let stale = stale_namespaces(&list, testbeds_alive);
    for ns in &stale {
        // Processes left inside (agents of a killed run) keep the namespace alive: end them.
        if let Ok(pids) = run("ip", &["netns", "pids", ns]) {
            for pid in pids.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                // SAFETY: kill has no memory preconditions; these pids are in a stale namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        run("ip", &["netns", "delete", ns])?;
    }
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan::new("rmc7", 2, 4, 3).unwrap()
    }

    #[test]
    fn addresses_name_their_switch_or_host() {
        let p = plan();
        assert_eq!(Plan::host_ip(1, 2), Ipv4Addr::new(10, 0, 1, 5));
        assert_eq!(Plan::host_gw(1, 2), Ipv4Addr::new(10, 0, 1, 4));
        assert_eq!(Plan::uplink_ip(3, 1), Ipv4Addr::new(172, 16, 1, 6));
        assert_eq!(Plan::downlink_ip(3, 1), Ipv4Addr::new(172, 16, 1, 7));
        assert_eq!(p.tor_addrs(1).len(), 5);
        assert_eq!(p.spine_addrs(0).len(), 4);
        for t in 0..4 {
            for a in p.tor_addrs(t) {
                assert_eq!(p.switch_of(a), Some(Plan::tor(t)), "{a}");
            }
        }
        for s in 0..2 {
            for a in p.spine_addrs(s) {
                assert_eq!(p.switch_of(a), Some(Plan::spine(s)), "{a}");
            }
        }
        assert_eq!(p.switch_of(Plan::host_ip(1, 2)), None);
        assert_eq!(p.host_of(Plan::host_ip(1, 2)), Some((1, 2)));
        assert_eq!(p.host_of(Plan::host_gw(1, 2)), None);
        assert_eq!(p.switch_of(Ipv4Addr::new(172, 16, 2, 1)), None, "no spine2");
        assert_eq!(p.switch_of(Ipv4Addr::new(10, 0, 0, 6)), None, "no host 3");
        // Every address is unique.
        let mut all: Vec<Ipv4Addr> = (0..4).flat_map(|t| p.tor_addrs(t)).collect();
        all.extend((0..2).flat_map(|s| p.spine_addrs(s)));
        all.extend(p.hosts().map(|(t, h)| Plan::host_ip(t, h)));
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
        assert!(Plan::new("x", 2, 128, 3).is_err() && Plan::new("x", 2, 4, 0).is_err());
    }

    #[test]
    fn build_steps_route_every_tor_over_every_spine() {
        let p = plan();
        let steps: Vec<String> = p.build_steps().iter().map(|s| s.join(" ")).collect();
        assert_eq!(steps.iter().filter(|s| s.starts_with("netns add")).count(), 2 + 4 + 12 + 1);
        assert!(steps.contains(&"-n rmc7-tor1-h2 addr add 192.168.0.6/16 dev mgmt0".into()));
        assert!(steps.contains(
            &"-n rmc7-tor1 route add 10.0.3.0/24 nexthop via 172.16.0.3 dev s0 nexthop via 172.16.1.3 dev s1".into()
        ));
        assert!(steps.contains(&"-n rmc7-spine1 route add 10.0.2.0/24 via 172.16.1.4".into()));
        assert!(steps.contains(&"-n rmc7-tor1-h2 route add default via 10.0.1.4".into()));
        // Sysctls come before the first interface, so new interfaces inherit rp_filter=0.
        let sysctl = steps.iter().rposition(|s| s.contains("sysctl")).unwrap();
        let first_link = steps.iter().position(|s| s.starts_with("link add")).unwrap();
        assert!(sysctl < first_link);
        // Interface names fit IFNAMSIZ.
        for s in p.build_steps().iter().filter(|s| s[0] == "link" && s[1] == "add") {
            assert!(s[3].len() <= 15 && s[10].len() <= 15, "{s:?}");
        }
    }

    #[test]
    fn the_inventory_loads_with_and_without_switch_addresses() {
        use rocemesh_formats::inventory::Inventory;
        let p = plan();
        let inv = Inventory::parse(&p.inventory_toml(false), Path::new("i.toml")).unwrap();
        assert_eq!((inv.tors.len(), inv.spines.len(), inv.links.len(), inv.hosts.len()), (4, 2, 8, 12));
        assert_eq!(inv.hosts[5].name, "tor1-h2");
        assert_eq!(inv.hosts[5].rnics[0].ip, std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 1, 5)));
        assert!(p.inventory_toml(true).contains("addrs = [\"172.16.0.1\", \"172.16.0.3\""));
    }

    #[test]
    fn loss_rules_are_nft_text() {
        assert_eq!(
            loss_rules(25, &["s0".into()]),
            "table inet rocemesh_fault {\n\tchain egress {\n\t\ttype filter hook postrouting priority 0; policy accept;\n\
             \t\toifname \"s0\" numgen random mod 100 < 25 counter drop\n\t}\n}\n"
        );
        assert_eq!(
            loss_rules(3, &["t0".into(), "t1".into()]).matches("numgen random mod 100 < 3 counter drop\n").count(),
            2
        );
        let listing = "table inet rocemesh_fault {\n\tchain egress {\n\t\ttype filter hook postrouting priority filter; policy accept;\n\t\toifname \"s0\" numgen random mod 100 < 25 counter packets 55 bytes 4620 drop\n\t}\n}\n";
        assert_eq!(dropped_packets(listing), 55);
        assert_eq!(port_drops(listing), vec![("s0".to_string(), 55)]);
    }

    #[test]
    fn route_get_and_ping_outputs_parse() {
        let out = "10.0.2.3 from 10.0.1.3 via 172.16.1.3 dev s1 table main \n    cache iif h1 \n";
        assert_eq!(parse_route_get(out), Some(Route { via: Some(Ipv4Addr::new(172, 16, 1, 3)), dev: "s1".into() }));
        let local = "10.0.1.3 from 10.0.1.5 dev h1 table main \n    cache iif h2 \n";
        assert_eq!(parse_route_get(local), Some(Route { via: None, dev: "h1".into() }));
        assert_eq!(parse_route_get("RTNETLINK answers: Network is unreachable"), None);
        let ping = "PING 10.0.2.1 (10.0.2.1) 56(84) bytes of data.\nFrom 172.16.1.3 icmp_seq=1 Time to live exceeded\n\n--- 10.0.2.1 ping statistics ---\n";
        assert_eq!(parse_ttl_exceeded(ping), Some(Ipv4Addr::new(172, 16, 1, 3)));
        assert_eq!(parse_ttl_exceeded("64 bytes from 10.0.2.1: icmp_seq=1 ttl=61 time=0.1 ms"), None);
    }

    #[test]
    fn stale_namespaces_are_those_of_gone_runs() {
        let list = "rmc12-tor0 (id: 3)\nrmc12-spine0\nrmc99-tor0-h1\nrmcx-tor0\ntor0-h1\nrmc12\n";
        assert_eq!(stale_namespaces(list, |p| p == 99), ["rmc12-tor0", "rmc12-spine0"]);
        assert!(stale_namespaces(list, |_| true).is_empty());
    }
}
