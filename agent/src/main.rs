//! `agent`: the rocemesh probing daemon.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use rocemesh_agent::config::AgentConfig;
use rocemesh_formats::pinglist::Pinglist;

/// rocemesh agent: probes its pinglist's targets, answers other agents, writes segments.
///
/// Exit codes: 0 ran and stopped cleanly; 1 ran, but a shard failed; 2 could not start
/// (invalid configuration or pinglist, a limit too low, an address in use).
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Run until SIGTERM (segments are sealed on the way out).
    Run {
        /// The configuration file (every key is documented in agent/src/config.rs).
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

/// `agent generate WHAT`: the man page or a shell's completions, on standard output.
fn generate(what: &str, name: &str) -> std::io::Result<()> {
    rocemesh_formats::docs::generate(<Cli as clap::CommandFactory>::command(), what, name)
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    let code = match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agent: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    let (config, duration) = match cli.what {
        What::CheckConfig { config } => {
            let cfg = AgentConfig::load(&config)?;
            let pl = Pinglist::load(&cfg.pinglist)?;
            rocemesh_agent::runtime::check_limits()?;
            println!("{}: ok: host {}, {} shards, mode {:?}", config.display(), cfg.host, cfg.shards.len(), cfg.mode);
            for s in &cfg.shards {
                let n = pl.targets.iter().filter(|t| t.from == s.device).count();
                println!(
                    "  shard {} on core {} bound to {}: {n} targets, {:.1} probes/s",
                    s.device,
                    s.core,
                    s.bind,
                    pl.total_rate_pps(&s.device)
                );
            }
            println!("{}: ok: generation {}, {} targets", cfg.pinglist.display(), pl.generation, pl.targets.len());
            match cfg.metrics.listen {
                Some(l) => println!("metrics: served at http://{l}/metrics"),
                None => println!("metrics: off (no [metrics] listen)"),
            }
            return Ok(0);
        }
        What::Describe { config } => {
            let cfg = AgentConfig::load(&config)?;
            print!("{}", rocemesh_agent::describe::describe(&cfg, std::path::Path::new("/sys")).to_toml_string()?);
            return Ok(0);
        }
        What::Run { config, duration_s } => (config, duration_s.map(Duration::from_secs)),
        What::Generate { what, name } => {
            generate(&what, &name)?;
            return Ok(0);
        }
        What::Demo { dir, shards, port, duration_s, busy_poll } => {
            let path = rocemesh_agent::demo::write(&dir, shards, port, busy_poll)?;
            eprintln!("agent demo: {shards} loopback shards for {duration_s} s; config {}", path.display());
            (path, Some(Duration::from_secs(duration_s)))
        }
    };
    let cfg = AgentConfig::load(&config)?;
    let reports = rocemesh_agent::runtime::run(&cfg, duration)?;
    Ok(if reports.len() == cfg.shards.len() { 0 } else { 1 })
}
