//! ctl's command line: every subcommand's arguments, as clap derives them. The binary runs
//! them (ctl/src/main.rs); the library holds them so that a test can parse the docs' command
//! lines with the same parser (`Cli::try_parse_from`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::generation;
use crate::push::{self, Destination};
use crate::remote::{RemotePath, Ssh};

/// The rocemesh controller: the inventory, pinglists, fleet keys, pushes, collection, live views.
///
/// From a bastion: build the fabric inventory (`inventory import`, `inventory switch-addrs`,
/// `inventory check`), generate one pinglist per host (`gen-pinglists`), rotate the fleet key
/// (`keys`), push pinglists and key to the hosts and check what they hold (`push-pinglist`,
/// `diff`, `status`), check the nodes (`doctor`), collect the agents' sealed segments (`collect`)
/// and read their live views with RDMA READ (`scrape`).
///
/// Exit codes: 0 done and nothing wrong; 1 ran, but found problems (a host failed, a host is
/// stale, the inventory has problems); 2 could not run (bad arguments, invalid input).
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand, Debug)]
pub enum What {
    /// Check or build the fabric inventory.
    #[command(subcommand)]
    Inventory(InventoryCmd),
    /// Write one pinglist per host into a directory.
    GenPinglists(GenArgs),
    /// Copy each host's pinglist to the host (ssh) or into a shared directory, atomically.
    ///
    /// The fleet key file (`ctl keys rotate`) goes with it.
    PushPinglist(PushArgs),
    /// The fleet key that authenticates every probe and ACK (agent config: `[auth] keys`).
    #[command(subcommand)]
    Keys(KeysCmd),
    /// Show what a push would change on each host.
    Diff(DiffArgs),
    /// Show which hosts hold the current generation, and which are stale or missing.
    Status(StatusArgs),
    /// Pull the agents' sealed segments into a collection directory, verified on arrival.
    ///
    /// The layout is OUT/DATE/HOST/SHARD/FILE. Resumable: a re-run fetches only what is missing.
    Collect(CollectArgs),
    /// Read the agents' live views with RDMA READ (agent `[view]`).
    ///
    /// The agents do nothing while read. Prints JSON lines (one per consistent snapshot) and a
    /// summary; `--prom` keeps a Prometheus text file. Exit 1 if a target could not be read at
    /// the end.
    Scrape(ScrapeArgs),
    /// Run `agent doctor` on every host over ssh and summarise what the fleet answered.
    ///
    /// Each host's worst result and the checks that were not ok, then per check how many hosts
    /// and which, so that one misconfigured rack stands out from a fleet-wide setting. Exit 1 if a
    /// host warned, failed or could not be asked.
    Doctor(DoctorArgs),
    /// Print the man page (`man`) or shell completions (`bash`, `zsh`, `fish`, `elvish`,
    /// `powershell`) generated from these definitions; packages install them.
    #[command(hide = true)]
    Generate {
        /// `man`, or a shell.
        what: String,
        /// The command's name as installed (packages install `rocemesh-ctl`).
        #[arg(long, default_value = "ctl")]
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum KeysCmd {
    /// Add a new key to the pinglist directory's fleet-keys.toml (creating it).
    ///
    /// Every agent accepts the new key as soon as it arrives and sends with it after --grace-s;
    /// the key in force stays accepted --grace-s after that. Push within the grace (`ctl
    /// push-pinglist --from DIR`) and no probe is refused.
    Rotate {
        /// The pinglist directory (what `ctl push-pinglist --from` reads).
        #[arg(long, alias = "dir")]
        from: PathBuf,
        /// Seconds until agents send with the new key, and that the old one is accepted after.
        ///
        /// The first key of a fleet too: agents accept unauthenticated packets until they send
        /// authenticated ones themselves, so push it everywhere within the grace. A host the push
        /// missed refuses and is refused; both ends record such probes as `refused`, not lost.
        #[arg(long, default_value_t = 900)]
        grace_s: u64,
    },
    /// Show the keys of the pinglist directory's fleet-keys.toml and their times (never the
    /// secrets).
    Show {
        /// The pinglist directory.
        #[arg(long, alias = "dir")]
        from: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum InventoryCmd {
    /// Validate an inventory and summarise the fabric.
    ///
    /// The summary counts hosts, RNICs, ToRs, rails, spines, links and switch addresses.
    Check {
        /// The inventory file.
        #[arg(long, required_unless_present = "inventory_positional")]
        inventory: Option<PathBuf>,
        /// The inventory file, as earlier releases took it (`ctl inventory check FILE`).
        #[arg(hide = true, conflicts_with = "inventory")]
        inventory_positional: Option<PathBuf>,
    },
    /// Build an inventory from `agent describe` output plus where each port is cabled.
    ///
    /// Writes the inventory and checks it as `inventory check` does: exit 1 when the check finds
    /// problems (they are printed; the file is written all the same).
    Import(ImportArgs),
    /// Set switches' own addresses (`addrs`) from a `switch,addr` list.
    ///
    /// A path trace knows a hop only by the address that answered; `analyze` names the hop after
    /// the switch whose `addrs` list it, and leaves out traces through addresses none lists.
    ///
    /// Writes the inventory and checks it as `inventory check` does: exit 1 when the check finds
    /// problems (they are printed; the file is written all the same).
    SwitchAddrs(SwitchAddrsArgs),
    /// Ports and switch addresses from LLDP neighbour tables, and cabling that disagrees.
    ///
    /// Each table is one node's `lldpcli -f json show neighbors`, in a file named after the node
    /// (`tor1.json`). Links get the interface at each end, RNICs the ToR interface they are
    /// cabled to, switches the management addresses they advertise (added to `addrs`, so that
    /// path-trace hops are named). Cabling the tables contradict (a ToR on another spine, swapped
    /// cables, a host under another ToR, a declared link no table shows) is printed with the
    /// table's file and line and the fix, and left as the inventory says.
    ///
    /// Writes the inventory with what agrees: exit 1 when a table contradicts the inventory or
    /// the check finds problems.
    Lldp(LldpArgs),
}

#[derive(Args, Debug)]
pub struct LldpArgs {
    /// LLDP tables: files, or directories of *.json files, each named after its node.
    #[arg(required = true)]
    pub tables: Vec<PathBuf>,
    /// The inventory to start from.
    #[arg(long)]
    pub inventory: PathBuf,
    /// Where to write the result; default: rewrite --inventory in place (needs --force).
    ///
    /// The file is written from what it declares: comments and layout are not kept.
    #[arg(long, alias = "out")]
    pub output: Option<PathBuf>,
    /// Replace the output file: --inventory itself when there is no --output, else an existing
    /// --output.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct SwitchAddrsArgs {
    /// The inventory to start from.
    #[arg(long)]
    pub inventory: PathBuf,
    /// The address list: CSV lines `switch,addr` (`spine1,172.16.255.1`), one address per line,
    /// a switch on as many lines as it has addresses (interfaces, loopback); `#` comments and
    /// blank lines are ignored, a first line `switch,addr` is a header. Every switch it names gets
    /// exactly the listed addresses (its previous `addrs` are replaced); the others keep theirs.
    #[arg(long)]
    pub map: PathBuf,
    /// Where to write the result; default: rewrite --inventory in place (needs --force).
    ///
    /// The file is written from what it declares: comments and layout are not kept.
    #[arg(long, alias = "out")]
    pub output: Option<PathBuf>,
    /// Replace the output file: --inventory itself when there is no --output, else an existing
    /// --output.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Host descriptions (`agent describe` output): files, or directories of *.toml files.
    #[arg(required = true)]
    pub descriptions: Vec<PathBuf>,
    /// Where to write the inventory.
    #[arg(long, alias = "out")]
    pub output: PathBuf,
    /// Replace --output if it exists.
    #[arg(long)]
    pub force: bool,
    /// ToR map: CSV lines `host,device,tor[,rail]` (`device` may be `*`: every RNIC of the host).
    #[arg(long, conflicts_with_all = ["tor_name", "host_regex"])]
    pub tor_map: Option<PathBuf>,
    /// ToR name template: `{host}`, `{device}`, `{rail}` and the groups of --host-regex
    /// (`tor-{rack}`); with --rail-optimised and no template, `rail{rail}`.
    #[arg(long)]
    pub tor_name: Option<String>,
    /// Regex every host name must match; its named or numbered groups fill --tor-name.
    #[arg(long)]
    pub host_regex: Option<String>,
    /// Rail-optimised fabric: RNIC k of every host is under the ToR of rail k (k in natural
    /// device-name order over all hosts, or as given by --rail-devices); every ToR gets a rail.
    #[arg(long)]
    pub rail_optimised: bool,
    /// Device names in rail order, e.g. `mlx5_0,mlx5_3,mlx5_4` (with --rail-optimised).
    #[arg(long, value_delimiter = ',', requires = "rail_optimised")]
    pub rail_devices: Option<Vec<String>>,
    /// Add N spines named spine0.. (equal-cost paths for flow-label sizing).
    #[arg(long, default_value_t = 0)]
    pub spines: usize,
    /// Link every ToR to every spine (two-tier Clos).
    #[arg(long)]
    pub link_all: bool,
    /// Start from this inventory: its switches and links are kept, and so are its hosts that
    /// are not described again.
    #[arg(long)]
    pub base: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct GenArgs {
    /// The inventory file.
    #[arg(long)]
    pub inventory: PathBuf,
    /// Output directory: one `<host>.toml` per host, plus `generation.ctl`.
    #[arg(long)]
    pub out: PathBuf,
    /// Seed for the ToR rings, the RNIC rotation and the flow labels; keep it across
    /// generations so that coverage rotates as computed.
    #[arg(long)]
    pub seed: u64,
    /// Generation number; default: one more than the last generation written to --out.
    #[arg(long)]
    pub generation: Option<u64>,
    /// Generation time written into every pinglist, ns since the Unix epoch; default: now.
    /// Pass it for byte-identical output.
    #[arg(long)]
    pub now_unix_ns: Option<u64>,
    /// Other ToRs each RNIC probes per generation (K).
    #[arg(long, default_value_t = generation::DEFAULT_INTER_TOR_PEERS)]
    pub inter_tor_peers: usize,
    /// Equal-cost paths between two ToRs (m); default: the inventory's spines, else 4.
    #[arg(long)]
    pub ecmp_paths: Option<u32>,
    /// Probability that one inter-ToR target's flow labels cover all m paths (p).
    #[arg(long, default_value_t = generation::DEFAULT_COVERAGE_PROBABILITY)]
    pub coverage_probability: f64,
    /// Probes per second to each ToR-mesh target.
    #[arg(long, default_value_t = generation::DEFAULT_TOR_MESH_RATE_PPS)]
    pub tor_mesh_rate_pps: f64,
    /// Probes per second to each inter-ToR target.
    #[arg(long, default_value_t = generation::DEFAULT_INTER_TOR_RATE_PPS)]
    pub inter_tor_rate_pps: f64,
    /// Flow labels per ToR-mesh target (one path under a ToR: 1).
    #[arg(long, default_value_t = 1)]
    pub tor_mesh_flow_labels: usize,
    /// Responder port written into every target: the agents' UDP port and RDMA CM service
    /// port (the agent then resolves the UD QPN at run time; `qpn = 0` is written).
    #[arg(long)]
    pub probe_port: Option<u16>,
    /// Probe timeout written into every pinglist.
    #[arg(long, default_value_t = rocemesh_formats::pinglist::DEFAULT_TIMEOUT_MS)]
    pub timeout_ms: u32,
    /// On a rail-optimised fabric, probe between rails too (by default only within a rail:
    /// there is no cross-rail RDMA traffic to protect).
    #[arg(long)]
    pub cross_rail: bool,
}

/// Where pinglists are on the hosts, and how to reach them.
#[derive(Args, Debug)]
pub struct ReachArgs {
    /// Path of the pinglist on each host; `{host}` is replaced by the host's name.
    #[arg(long, default_value = "/etc/rocemesh/pinglist.toml", conflicts_with = "to_dir")]
    pub remote_path: String,
    /// Instead of ssh: a directory on a shared filesystem, DIR/<host>/pinglist.toml.
    #[arg(long)]
    pub to_dir: Option<PathBuf>,
    #[command(flatten)]
    pub ssh: SshArgs,
}

/// How hosts are reached over ssh.
#[derive(Args, Debug)]
#[command(next_help_heading = "Reaching hosts (ssh)")]
pub struct SshArgs {
    /// Options for ssh, before ctl's own (which they override), split at spaces; repeatable:
    /// `--ssh-option "-F ./ssh_config" --ssh-option "-o User=ops"`.
    #[arg(long, allow_hyphen_values = true)]
    pub ssh_option: Vec<String>,
    /// The ssh client to run.
    #[arg(long, default_value = "ssh")]
    pub ssh_program: PathBuf,
    /// ssh ConnectTimeout, seconds.
    #[arg(long, alias = "connect-timeout-secs", default_value_t = 10)]
    pub connect_timeout_s: u32,
    /// Give up on a host after this many seconds, connection included.
    #[arg(long, alias = "timeout-secs", default_value_t = push::DEFAULT_HOST_TIMEOUT.as_secs())]
    pub timeout_s: u64,
    /// Hosts handled at once.
    #[arg(long, default_value_t = 32)]
    pub parallel: usize,
}

impl SshArgs {
    /// The ssh client these flags describe.
    pub fn ssh(&self) -> Ssh {
        Ssh {
            program: self.ssh_program.clone(),
            options: self.ssh_option.iter().flat_map(|o| o.split_whitespace().map(str::to_owned)).collect(),
            connect_timeout_secs: self.connect_timeout_s,
            timeout: Duration::from_secs(self.timeout_s.max(1)),
        }
    }
}

impl ReachArgs {
    /// Where a push, a diff or a status reads and writes the hosts' pinglists.
    pub fn destination(&self) -> Result<Destination, crate::Error> {
        if let Some(dir) = &self.to_dir {
            return Ok(Destination::Dir(dir.clone()));
        }
        Ok(Destination::Ssh { ssh: self.ssh.ssh(), remote_path: RemotePath::new(&self.remote_path)? })
    }
}

/// `ctl collect`.
#[derive(Args, Debug)]
pub struct CollectArgs {
    #[command(flatten)]
    pub hosts: HostsArgs,
    /// The agent's segment directory on each host (its `segment_dir`); `{host}` is replaced by
    /// the host's name.
    #[arg(long, default_value = "/var/lib/rocemesh/segments")]
    pub remote_dir: String,
    /// The collection directory: OUT/<YYYY-MM-DD>/<host>/<shard>/<file>.rseg.zst, damaged
    /// files under OUT/damaged/<host>/.
    #[arg(long)]
    pub out: PathBuf,
    /// Delete each file on its host once its local copy is verified (damaged ones stay).
    #[arg(long)]
    pub remove: bool,
    /// Bandwidth of each host's transfer, MiB/s (0: unlimited); the total is at most
    /// --parallel times this.
    #[arg(long, default_value_t = 0.0)]
    pub bwlimit_mib_s: f64,
    /// A host whose newest sealed segment is older than this many seconds is reported stale.
    #[arg(long, default_value_t = 3600)]
    pub stale_after_s: u64,
    #[command(flatten)]
    pub ssh: SshArgs,
}

/// Which hosts a command that reaches every host of a fleet works on.
#[derive(Args, Debug)]
pub struct HostsArgs {
    /// Every host of this inventory.
    #[arg(long, required_unless_present = "hosts")]
    pub inventory: Option<PathBuf>,
    /// Only these hosts (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub hosts: Option<Vec<String>>,
}

/// `ctl doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub hosts: HostsArgs,
    /// The agent's configuration on each host; `{host}` is replaced by the host's name.
    #[arg(long, default_value = "/etc/rocemesh/agent.toml")]
    pub config_path: String,
    /// The remote command that runs the agent binary.
    ///
    /// `sudo -n rocemesh-agent` checks as root, with the capabilities the service gets.
    #[arg(long, default_value = "rocemesh-agent")]
    pub agent_command: String,
    #[command(flatten)]
    pub ssh: SshArgs,
}

/// `ctl scrape`.
#[derive(Args, Debug)]
pub struct ScrapeArgs {
    /// Agent shards to read: each shard's bind address and the agents' `[view] port`, e.g.
    /// 10.0.1.5:18601 (comma-separated).
    #[arg(long, value_delimiter = ',', required_unless_present = "inventory")]
    pub targets: Vec<std::net::SocketAddr>,
    /// Read every RNIC of this inventory (its `ip`) on --port.
    #[arg(long)]
    pub inventory: Option<PathBuf>,
    /// The agents' `[view] port`, with --inventory.
    #[arg(long, default_value_t = 18_601)]
    pub port: u16,
    /// Reads per second of each target.
    #[arg(long, default_value_t = 1.0)]
    pub rate_hz: f64,
    /// Stop after this many seconds (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    pub duration_s: u64,
    /// Do not print a JSON line per snapshot (only the summary).
    #[arg(long)]
    pub quiet: bool,
    /// Rewrite this Prometheus text file after every tick (for node_exporter's textfile
    /// collector).
    #[arg(long)]
    pub prom: Option<PathBuf>,
    /// Read wrongly on purpose, to check that agents refuse it: `rkey` (a wrong key) or `oob`
    /// (past the region's end).
    #[arg(long, hide = true)]
    pub forge: Option<String>,
}

#[derive(Args, Debug)]
pub struct PushArgs {
    /// Directory of generated pinglists.
    #[arg(long)]
    pub from: PathBuf,
    /// Only these hosts (comma-separated); default: every host in --from.
    #[arg(long, value_delimiter = ',', conflicts_with = "retry_failed")]
    pub hosts: Option<Vec<String>>,
    /// Push only the hosts that failed in this results file (see --results).
    #[arg(long)]
    pub retry_failed: Option<PathBuf>,
    /// Where to write the per-host results (TSV); default: FROM/push-results.tsv.
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// The group the key file is installed with on each host (mode 0640): the group the agent
    /// runs as, which the package creates. Never the directory's group, which may be anyone's.
    #[arg(long, default_value = "rocemesh")]
    pub key_group: String,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// Directory of generated pinglists (what a push would install).
    #[arg(long)]
    pub from: PathBuf,
    /// What to compare with: a directory (another generation, or a --to-dir tree), or hosts
    /// to ask over ssh: comma-separated names, or `*` for every host in --from.
    #[arg(long)]
    pub against: String,
    /// List every added, removed and changed target.
    #[arg(long, short)]
    pub verbose: bool,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Directory of generated pinglists (the generation the hosts should hold).
    #[arg(long)]
    pub from: PathBuf,
    /// Only these hosts (comma-separated); default: every host in --from.
    #[arg(long, value_delimiter = ',')]
    pub hosts: Option<Vec<String>>,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &str) -> Cli {
        Cli::try_parse_from(std::iter::once("ctl").chain(args.split_whitespace()))
            .unwrap_or_else(|e| panic!("ctl {args}: {}", e.render()))
    }

    /// The spellings of earlier releases still parse, to the same values, for one release.
    #[test]
    fn earlier_spellings_are_hidden_aliases() {
        let Cli { what: What::Status(new) } = parse("status --from p --connect-timeout-s 3 --timeout-s 7") else {
            panic!("status")
        };
        let Cli { what: What::Status(old) } = parse("status --from p --connect-timeout-secs 3 --timeout-secs 7") else {
            panic!("status")
        };
        assert_eq!((new.reach.ssh.connect_timeout_s, new.reach.ssh.timeout_s), (3, 7));
        assert_eq!((old.reach.ssh.connect_timeout_s, old.reach.ssh.timeout_s), (3, 7));
        let Cli { what: What::Keys(KeysCmd::Rotate { from, .. }) } = parse("keys rotate --dir p") else {
            panic!("keys rotate")
        };
        assert_eq!(from, PathBuf::from("p"));
        let Cli { what: What::Inventory(InventoryCmd::Check { inventory, inventory_positional }) } =
            parse("inventory check inv.toml")
        else {
            panic!("inventory check")
        };
        assert_eq!((inventory, inventory_positional), (None, Some(PathBuf::from("inv.toml"))));
        assert!(Cli::try_parse_from(["ctl", "inventory", "check"]).is_err(), "an inventory is required");
        // Hidden: `--help` shows only the current spellings.
        let help = <Cli as clap::CommandFactory>::command()
            .find_subcommand_mut("status")
            .map(|c| c.render_long_help().to_string())
            .unwrap_or_default();
        assert!(help.contains("--timeout-s") && !help.contains("timeout-secs"), "{help}");
    }
}
