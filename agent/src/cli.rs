//! The `agent` command line: its subcommands and their arguments, in the library so that a test
//! can parse the docs' command lines with the binary's own parser.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// rocemesh agent: probes its pinglist's targets, answers other agents, writes segments.
///
/// Exit codes: 0 ran and stopped cleanly; 1 ran, but a shard failed; 2 could not start
/// (invalid configuration or pinglist, a limit too low, an address in use).
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand, Debug)]
pub enum What {
    /// Run until SIGTERM (segments are sealed on the way out).
    Run {
        /// The configuration file (every key: the packaged agent.example.toml).
        #[arg(long)]
        config: PathBuf,
        /// Stop by itself after this many seconds (tests, benchmarks).
        #[arg(long)]
        duration_s: Option<u64>,
    },
    /// Validate the configuration and the pinglist it names, print what would run, and exit.
    CheckConfig {
        /// The configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print this host's endpoints as `ctl inventory import` reads them (TOML on stdout).
    Describe {
        /// The configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Check this node before enabling the service: RDMA devices, GIDs, MTU, PFC/ECN, clocks,
    /// limits, cores.
    ///
    /// Each check prints ok, warn or fail with its fix (info where this host cannot tell): the
    /// RDMA devices and their ports (state, link layer), RoCE v2 GIDs and their netdevs, the
    /// RoCE MTU, PFC and ECN/DSCP where the NIC or DCB reports them, the completion clock a
    /// verbs shard would choose, memlock, the capabilities and kernel BTF path tracing and the
    /// service tracer need, clock synchronisation (chrony's offset), the cores the config pins
    /// shards to (online, isolated, busy), and that the config and its pinglist load. Exit 0
    /// when nothing is worse than ok, 1 with a warning, 2 with a failure.
    Doctor {
        /// The configuration file (without it, the config, pinglist and cores are not checked).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = DoctorFormat::Table)]
        format: DoctorFormat,
    },
    /// The embedded default: loopback shards on 127.0.0.x probing each other; no RNIC needed.
    Demo {
        /// Where the generated config, pinglist and segments go.
        #[arg(long, default_value = "out/agent")]
        dir: PathBuf,
        /// Number of shards (each on its own 127.0.0.x address).
        #[arg(long, default_value_t = 3)]
        shards: usize,
        /// UDP port every shard binds.
        #[arg(long, default_value_t = 18515)]
        port: u16,
        /// Seconds to run.
        #[arg(long, default_value_t = 15)]
        duration_s: u64,
        /// Busy-poll shards instead of event-driven ones.
        #[arg(long)]
        busy_poll: bool,
        /// The injected fault: the last shard silently ignores this share of the probes it
        /// receives, so `analyze localize` has an RNIC to name; 0 runs a clean fleet.
        #[arg(long, default_value_t = 0.25)]
        inject_loss: f64,
    },
    /// Print the man page (`man`) or shell completions (`bash`, `zsh`, `fish`, `elvish`,
    /// `powershell`) generated from these definitions; packages install them.
    #[command(hide = true)]
    Generate {
        /// `man`, or a shell.
        what: String,
        /// The command's name as installed (packages install `rocemesh-agent`).
        #[arg(long, default_value = "agent")]
        name: String,
    },
}

/// How `agent doctor` prints its checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DoctorFormat {
    /// One line per check, its fix under it, and a summary line.
    Table,
    /// `{"worst": ..., "checks": [{"area", "subject", "level", "detail", "fix"}]}`, for fleets.
    Json,
}
