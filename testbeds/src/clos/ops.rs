//! The operator's flow before the agents start, as the README's quick start runs it on a
//! cluster: `agent describe` on every host, `ctl inventory import` on the bastion, then (after
//! `ctl inventory lldp` and `ctl gen-pinglists`) `ctl push-pinglist` over ssh to every host.
//!
//! The bastion is the management namespace ([`MGMT`]): ssh reaches each host's own sshd at its
//! management address, over the network the fabric's faults never touch, as a cluster's
//! out-of-band network does. Every host runs Debian's sshd with a host key and an authorised
//! key made for the run; ctl runs the system ssh client with an ssh config naming each host's
//! address and the known host keys, as an operator's `~/.ssh/config` does. Nothing is copied
//! past ssh: the agents read what the push installed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rocemesh_formats::inventory::Inventory;

use super::net::{DEVICE, HOST_IF, MGMT, Plan};
use crate::harness::Check;

const SSHD: &str = "/usr/sbin/sshd";

/// How long a host's sshd may take to listen.
const SSHD_LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// `agent describe --config <config_of(host)>` in every host's namespace, each written to
/// `dir/<host>.toml`.
pub fn describe(agent: &Path, plan: &Plan, config_of: impl Fn(&str) -> PathBuf, dir: &Path) -> anyhow::Result<()> {
    for (t, h) in plan.hosts() {
        let host = Plan::host(t, h);
        let out = Command::new("ip")
            .args(["netns", "exec", &plan.ns(&host)])
            .arg(agent)
            .args(["describe", "--config"])
            .arg(config_of(&host))
            .stdin(Stdio::null())
            .output()
            .context("running agent describe")?;
        if !out.status.success() {
            bail!("agent describe on {host} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        let file = dir.join(format!("{host}.toml"));
        std::fs::write(&file, &out.stdout).with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(())
}

/// `ctl inventory import` of the descriptions in `dir`, the ToR of each host from its name
/// (`tor1-h2` is under `tor1`), every ToR linked to every spine; written to `inventory`. The
/// check: the inventory holds the fabric as planned (every host's RNIC with its address and
/// ToR, every ToR, spine and link), and nothing else.
pub fn import(ctl: &Path, plan: &Plan, dir: &Path, inventory: &Path) -> anyhow::Result<Check> {
    let out = Command::new(ctl)
        .args(["inventory", "import"])
        .arg(dir)
        .arg("--output")
        .arg(inventory)
        .args(["--force", "--host-regex", r"^(?P<tor>tor[0-9]+)-h[0-9]+$", "--tor-name", "{tor}"])
        .args(["--spines", &plan.spines.to_string(), "--link-all"])
        .stdin(Stdio::null())
        .output()
        .context("running ctl inventory import")?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("ctl inventory import failed ({}): {}", out.status, said.trim());
    }
    let got = Inventory::load(inventory)?;
    let wrong = differences(plan, &got);
    Ok(Check {
        name: "describe + import: the inventory is the fabric".into(),
        ok: wrong.is_empty(),
        detail: format!(
            "{} hosts described, {} ToRs, {} spines, {} links imported; {}",
            got.hosts.len(),
            got.tors.len(),
            got.spines.len(),
            got.links.len(),
            if wrong.is_empty() { "as planned".to_owned() } else { format!("differs: {}", wrong.join("; ")) }
        ),
    })
}

/// What `got` has that the plan does not, or lacks.
fn differences(plan: &Plan, got: &Inventory) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut planned: Vec<String> = plan
        .hosts()
        .map(|(t, h)| {
            format!("host {} {DEVICE} {} under {} on {HOST_IF}", Plan::host(t, h), Plan::host_ip(t, h), Plan::tor(t))
        })
        .collect();
    planned.extend((0..plan.tors).map(|t| format!("tor {}", Plan::tor(t))));
    planned.extend((0..plan.spines).map(|s| format!("spine {}", Plan::spine(s))));
    planned.extend(
        (0..plan.tors)
            .flat_map(|t| (0..plan.spines).map(move |s| (t, s)))
            .map(|(t, s)| format!("link {}|{}", Plan::tor(t), Plan::spine(s))),
    );
    let mut have: Vec<String> = got
        .hosts
        .iter()
        .flat_map(|h| {
            h.rnics.iter().map(move |r| {
                let netdev = r.netdev.as_deref().unwrap_or("no netdev");
                format!("host {} {} {} under {} on {netdev}", h.name, r.device, r.ip, r.tor)
            })
        })
        .collect();
    have.extend(got.tors.iter().map(|t| format!("tor {}", t.name)));
    have.extend(got.spines.iter().map(|s| format!("spine {}", s.name)));
    have.extend(got.links.iter().map(|l| format!("link {}|{}", l.a, l.b)));
    planned.sort();
    have.sort();
    wrong.extend(planned.iter().filter(|p| !have.contains(p)).map(|p| format!("missing {p}")));
    wrong.extend(have.iter().filter(|h| !planned.contains(h)).map(|h| format!("unplanned {h}")));
    wrong
}

/// One sshd per host, listening on its management address; stopped when dropped.
#[derive(Debug)]
pub struct Sshds {
    children: Vec<(String, Child)>,
    config: PathBuf,
}

impl Drop for Sshds {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Sshds {
    /// Keys, sshd's configuration and the bastion's ssh config under `dir`; an sshd started in
    /// every host's namespace, each listening before this returns.
    pub fn start(plan: &Plan, dir: &Path) -> anyhow::Result<Sshds> {
        if !Path::new(SSHD).exists() {
            bail!("{SSHD} is missing: apt-get install openssh-server (scripts/setup does)");
        }
        // ctl splits each --ssh-option at spaces, and sshd_config's paths end at one.
        if dir.to_string_lossy().contains(char::is_whitespace) {
            bail!(
                "{}: the run's directory has a space in its path, which the ssh options and sshd_config \
                 cannot carry (fix: give the Clos run an output directory without spaces)",
                dir.display()
            );
        }
        let p = |name: &str| dir.join(name);
        for key in ["host_key", "id"] {
            keygen(&p(key))?;
        }
        std::fs::copy(p("id.pub"), p("authorized_keys"))?;
        // sshd running as root needs its privilege-separation directory, which a container may
        // not have made at boot.
        std::fs::create_dir_all("/run/sshd").context("creating /run/sshd")?;
        std::fs::write(
            p("sshd_config"),
            format!(
                "HostKey {host_key}\nPidFile none\nUsePAM no\nStrictModes no\nAuthorizedKeysFile {keys}\n\
                 PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\nMaxStartups 64\nLogLevel ERROR\n",
                host_key = p("host_key").display(),
                keys = p("authorized_keys").display(),
            ),
        )?;
        let host_key = std::fs::read_to_string(p("host_key.pub"))?;
        let mut config = String::new();
        let mut known = String::new();
        for (t, h) in plan.hosts() {
            let ip = plan.mgmt_ip(t, h);
            config.push_str(&format!("Host {}\n  HostName {ip}\n", Plan::host(t, h)));
            known.push_str(&format!("{ip} {}", host_key.trim_end()));
            known.push('\n');
        }
        config.push_str(&format!(
            "Host *\n  User root\n  IdentityFile {id}\n  IdentitiesOnly yes\n  IdentityAgent none\n  \
             BatchMode yes\n  UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n  \
             StrictHostKeyChecking yes\n  LogLevel ERROR\n  ControlMaster no\n",
            id = p("id").display(),
            known = p("known_hosts").display(),
        ));
        std::fs::write(p("known_hosts"), known)?;
        std::fs::write(p("ssh_config"), config)?;
        let mut sshds = Sshds { children: Vec::new(), config: p("ssh_config") };
        for (t, h) in plan.hosts() {
            let host = Plan::host(t, h);
            let log = std::fs::File::create(p(&format!("sshd-{host}.log")))?;
            let child = Command::new("ip")
                .args(["netns", "exec", &plan.ns(&host), SSHD, "-D", "-e", "-f"])
                .arg(p("sshd_config"))
                .arg("-o")
                .arg(format!("ListenAddress={}:22", plan.mgmt_ip(t, h)))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting sshd on {host}"))?;
            sshds.children.push((host, child));
        }
        sshds.wait_listening(plan, dir)?;
        Ok(sshds)
    }

    fn wait_listening(&mut self, plan: &Plan, dir: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + SSHD_LISTEN_TIMEOUT;
        for (host, child) in &mut self.children {
            loop {
                let ss = Command::new("ip")
                    .args(["netns", "exec", &plan.ns(host), "ss", "-Hltn", "sport = :22"])
                    .output()
                    .context("running ss")?;
                if !String::from_utf8_lossy(&ss.stdout).trim().is_empty() {
                    break;
                }
                if let Some(status) = child.try_wait()? {
                    let mut log = String::new();
                    let _ = std::fs::File::open(dir.join(format!("sshd-{host}.log")))
                        .and_then(|mut f| f.read_to_string(&mut log));
                    bail!("sshd on {host} exited ({status}) before listening: {}", log.trim());
                }
                if Instant::now() > deadline {
                    bail!("sshd on {host} did not listen on port 22 within {SSHD_LISTEN_TIMEOUT:?}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// `ctl push-pinglist --from generated` run on the bastion, installing each host's pinglist
    /// at `remote_path` (`{host}` replaced). The check: ctl said every host took it, and each
    /// host's file is byte for byte the generated one.
    pub fn push(&self, ctl: &Path, plan: &Plan, generated: &Path, remote_path: &str) -> anyhow::Result<Check> {
        let results = self.config.with_file_name("push-results.tsv");
        let out = Command::new("ip")
            .args(["netns", "exec", &plan.ns(MGMT)])
            .arg(ctl)
            .args(["push-pinglist", "--from"])
            .arg(generated)
            .args(["--remote-path", remote_path, "--ssh-option"])
            .arg(format!("-F {}", self.config.display()))
            .arg("--results")
            .arg(&results)
            .stdin(Stdio::null())
            .output()
            .context("running ctl push-pinglist")?;
        let said = String::from_utf8_lossy(&out.stderr);
        let mut wrong = Vec::new();
        for (t, h) in plan.hosts() {
            let host = Plan::host(t, h);
            let sent = std::fs::read(generated.join(format!("{host}.toml")))?;
            let installed = std::fs::read(remote_path.replace("{host}", &host)).unwrap_or_default();
            if sent != installed {
                wrong.push(host);
            }
        }
        let hosts = plan.tors * plan.hosts_per_tor;
        Ok(Check {
            name: "push: every host took its pinglist over ssh".into(),
            ok: out.status.success() && wrong.is_empty(),
            detail: format!(
                "ctl push-pinglist exit {:?}; {} of {hosts} hosts hold the generated file{}{}",
                out.status.code(),
                hosts as usize - wrong.len(),
                if wrong.is_empty() { String::new() } else { format!(" (not: {})", wrong.join(", ")) },
                if out.status.success() { String::new() } else { format!("; ctl said: {}", said.trim()) },
            ),
        })
    }
}

fn keygen(path: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path.with_extension("pub"));
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "rocemesh-clos", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .context("running ssh-keygen (apt-get install openssh-client)")?;
    if !out.status.success() {
        bail!("ssh-keygen -f {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planned_inventory_differs_in_nothing_and_a_moved_host_is_named() {
        let plan = Plan::new("rmc1", 2, 2, 2).unwrap();
        let mut inv = Inventory::parse(&plan.inventory_toml(false), Path::new("planned.toml")).unwrap();
        assert!(differences(&plan, &inv).is_empty(), "{:?}", differences(&plan, &inv));
        inv.hosts[0].rnics[0].tor = Plan::tor(1);
        inv.links.pop();
        let wrong = differences(&plan, &inv);
        assert_eq!(
            wrong,
            [
                "missing host tor0-h0 rnic0 10.0.0.1 under tor0 on eth0",
                "missing link tor1|spine1",
                "unplanned host tor0-h0 rnic0 10.0.0.1 under tor1 on eth0",
            ]
        );
    }
}
